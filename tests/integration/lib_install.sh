#!/bin/sh
# SPDX-License-Identifier: MIT
# lib_install.sh - the installed libulpack (issue 15 item 5): `make install`
# with DESTDIR into a temporary directory puts ulpack.h (and no internal
# header), libulpack.a and libulpack.pc there; a tiny program compiled with
# `pkg-config --cflags --libs libulpack` against that .pc reads a file of an
# archive byte for byte without a mount; `make uninstall` removes every file
# it installed.
. "$(dirname "$0")/lib.sh"
command -v pkg-config > /dev/null || skip "no pkg-config"
command -v "${CC:-cc}" > /dev/null || skip "no C compiler"
D="$T/dest" P=/opt/ulpack-test
make -C "$top_builddir" -s install DESTDIR="$D" prefix="$P" > "$T/install.log" 2>&1 \
	|| { fail "make install: $(tail -5 "$T/install.log")"; finish; }
for f in include/ulpack.h lib/libulpack.a lib/pkgconfig/libulpack.pc bin/ulpack bin/ulpackfs; do
	[ -f "$D$P/$f" ] || fail "not installed: $P/$f"
done
[ -z "$(find "$D$P/include" -name '*_int.h')" ] && ok "installed: ulpack.h, libulpack.a, libulpack.pc; no internal header" \
	|| fail "internal headers installed"
# the .pc is relocatable (prefix=${pcfiledir}/../..): it works where it lies
export PKG_CONFIG_PATH="$D$P/lib/pkgconfig"
flags=$(pkg-config --cflags --libs libulpack) || { fail "pkg-config libulpack"; finish; }
echo "$flags" | grep -q -- "-I$D$P/lib/pkgconfig/../../include" && ok "pkg-config flags point into the install: $flags" \
	|| fail "flags: $flags"
[ "$(pkg-config --modversion libulpack)" = "$("$ULPACK" --version | cut -d' ' -f2)" ] \
	&& ok "pkg-config --modversion libulpack matches ulpack --version" || fail "modversion"
cat > "$T/cat.c" <<'CEOF'
/* reads one archived file to stdout through the installed libulpack */
#include <ulpack.h>
#include <stdio.h>
int main(int argc, char **argv)
{
	char err[512];
	ulp_archive *a;
	ulp_file *f;
	static char buf[1 << 20];
	if (argc != 3 || ulp_archive_open(argv[1], NULL, &a, err, sizeof(err)) < 0) {
		fprintf(stderr, "open: %s\n", argc == 3 ? err : "usage");
		return 1;
	}
	if (ulp_file_open(a, argv[2], &f) < 0) {
		fprintf(stderr, "%s\n", ulp_archive_errmsg(a));
		return 1;
	}
	int64_t n;
	for (uint64_t off = 0; (n = ulp_file_pread(f, buf, sizeof(buf), off)) > 0; off += (uint64_t)n)
		fwrite(buf, 1, (size_t)n, stdout);
	ulp_file_close(f);
	ulp_archive_close(a);
	return n < 0;
}
CEOF
# shellcheck disable=SC2086
"${CC:-cc}" -o "$T/cat" "$T/cat.c" $flags 2> "$T/cc.log" && ok "a program builds against the installed .pc" \
	|| { fail "compile: $(head -5 "$T/cc.log")"; finish; }
"$ULPACK" init "$T/a" > /dev/null
"$ULPACK" synth "$T/run" --steps 2 --dim 32 > /dev/null
"$ULPACK" import "$T/a" "$T/run" > /dev/null
"$T/cat" "$T/a" checkpoint-200/model.safetensors > "$T/out" && cmp -s "$T/out" "$T/run/checkpoint-200/model.safetensors" \
	&& ok "it reads a delta-coded checkpoint back byte for byte" || fail "read through the installed library"
make -C "$top_builddir" -s uninstall DESTDIR="$D" prefix="$P" > /dev/null 2>&1 || fail "make uninstall"
left=$(find "$D" -type f | head -5)
[ -z "$left" ] && ok "make uninstall removes every installed file" || fail "left after uninstall: $left"
finish
