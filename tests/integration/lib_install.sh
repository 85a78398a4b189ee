#!/bin/sh
# SPDX-License-Identifier: MIT
# lib_install.sh - the installed libulpack (issue 15 item 5): `make install`
# with DESTDIR into a temporary directory puts ulpack.h (and no internal
# header), libulpack.a and libulpack.pc there; a tiny program compiled with
# `pkg-config --cflags --libs libulpack` against that .pc reads a file of an
# archive byte for byte without a mount; `make uninstall` removes every file
# it installed. Issue 27: libulpack.so too (soname libulpack.so.0, the
# symlinks, only ulpack.h's functions exported) with libulpack.pc for it and
# libulpack-static.pc for the archive; the Python package imports from the
# installed site directory and finds the installed library by itself.
. "$(dirname "$0")/lib.sh"
command -v pkg-config > /dev/null || skip "no pkg-config"
command -v "${CC:-cc}" > /dev/null || skip "no C compiler"
D="$T/dest" P=/opt/ulpack-test
make -C "$top_builddir" -s install DESTDIR="$D" prefix="$P" > "$T/install.log" 2>&1 \
	|| { fail "make install: $(tail -5 "$T/install.log")"; finish; }
for f in include/ulpack.h lib/libulpack.a lib/pkgconfig/libulpack.pc lib/pkgconfig/libulpack-static.pc \
	lib/libulpack.so.0.1.0 bin/ulpack bin/ulpackfs; do
	[ -f "$D$P/$f" ] || fail "not installed: $P/$f"
done
[ "$(readlink "$D$P/lib/libulpack.so.0")" = libulpack.so.0.1.0 ] && [ "$(readlink "$D$P/lib/libulpack.so")" = libulpack.so.0 ] \
	&& ok "symlinks libulpack.so -> libulpack.so.0 -> libulpack.so.0.1.0" || fail "libulpack.so symlinks"
if command -v readelf > /dev/null && command -v nm > /dev/null; then
	readelf -d "$D$P/lib/libulpack.so.0.1.0" | grep -q 'SONAME.*\[libulpack\.so\.0\]' && ok "soname libulpack.so.0" \
		|| fail "soname: $(readelf -d "$D$P/lib/libulpack.so.0.1.0" | grep SONAME)"
	exported=$(nm -D --defined-only "$D$P/lib/libulpack.so.0.1.0" | awk '{print $3}')
	other=$(echo "$exported" | grep -v '^ulp_' | head -5)
	declared=$(grep -o 'ulp_[a-z0-9_]*(' "$top_srcdir/src/lib/ulpack.h" | tr -d '(' | sort -u)
	extra=$(echo "$exported" | grep '^ulp_' | sort -u | comm -23 - "$(printf '%s\n' "$declared" > "$T/decl"; echo "$T/decl")" | head -5)
	[ -z "$other" ] && [ -z "$extra" ] && echo "$exported" | grep -qx ulp_file_pread \
		&& ok "libulpack.so exports ulpack.h's functions only ($(echo "$exported" | wc -l) symbols)" \
		|| fail "exported beyond ulpack.h: $other $extra"
fi
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
LD_LIBRARY_PATH="$D$P/lib" "$T/cat" "$T/a" checkpoint-200/model.safetensors > "$T/out" && cmp -s "$T/out" "$T/run/checkpoint-200/model.safetensors" \
	&& ok "it reads a delta-coded checkpoint back byte for byte" || fail "read through the installed library"
ldd "$T/cat" 2> /dev/null | grep -q 'libulpack\.so\.0' && ok "linked against libulpack.so.0" || fail "not linked to the .so: $(ldd "$T/cat" 2>&1 | head -3)"
# shellcheck disable=SC2046
"${CC:-cc}" -o "$T/cat-static" "$T/cat.c" $(pkg-config --cflags --libs libulpack-static) 2> "$T/cc.log" \
	&& ! ldd "$T/cat-static" 2> /dev/null | grep -q libulpack \
	&& "$T/cat-static" "$T/a" checkpoint-200/model.safetensors | cmp -s - "$T/run/checkpoint-200/model.safetensors" \
	&& ok "libulpack-static.pc links libulpack.a into the program" || fail "static: $(head -3 "$T/cc.log")"
# the Python package from the installed site directory (configure's
# --with-python-sitedir, under the prefix), with the library from DESTDIR
site=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -C "$top_builddir" -s --no-print-directory print-python-sitedir \
	prefix="$P" 2> /dev/null | grep -v "^make")
py=${PYTHON3:-python3}
if [ -n "$site" ] && command -v "$py" > /dev/null; then
	[ -f "$D$site/ulpack/__init__.py" ] && grep -q "LIBPATH = '$P/lib/libulpack.so.0'" "$D$site/ulpack/_libpath.py" \
		&& ok "python package installed in $site, recording $P/lib/libulpack.so.0" || fail "python package: $(ls "$D$site/ulpack" 2>&1)"
	out=$(cd "$T" && ULPACK_LIB="$D$P/lib/libulpack.so.0" PYTHONPATH="$D$site" "$py" -c '
import sys, ulpack
ar = ulpack.open_archive(sys.argv[1])
sys.stdout.buffer.write(ar.read_bytes("checkpoint-200/model.safetensors"))
print(ulpack.__file__, file=sys.stderr)' "$T/a" 2> "$T/py.err" | cmp - "$T/run/checkpoint-200/model.safetensors" 2>&1)
	[ -z "$out" ] && grep -q "^$D$site/ulpack/__init__.py" "$T/py.err" \
		&& ok "import ulpack from the installed site directory reads the file" || fail "python: $out $(tail -3 "$T/py.err")"
else
	echo "# no python3: the package is not installed (configure --with-python-sitedir)"
fi
make -C "$top_builddir" -s uninstall DESTDIR="$D" prefix="$P" > /dev/null 2>&1 || fail "make uninstall"
left=$(find "$D" -type f | head -5)
[ -z "$left" ] && ok "make uninstall removes every installed file" || fail "left after uninstall: $left"
finish
