#!/bin/sh
# SPDX-License-Identifier: MIT
# python_install.sh - the README's Python install line (issue 40 item 3), as
# written: it is taken from README.md (the line that makes the venv and runs
# its pip), run with Debian's own python3 first on PATH (externally managed:
# PEP 668), from a copy of the source tree (pip writes python/build), with
# HOME in the test's directory; then the venv's python imports the package
# and reads an archive. Debian's pip outside a venv refuses, which is why the
# line makes one (checked too, where that Python is marked so).
. "$(dirname "$0")/lib.sh"
line=$(grep -E '^python3 -m venv .*/bin/pip install ' "$top_srcdir/README.md" | head -n 1)
[ -n "$line" ] || { fail "README.md: no 'python3 -m venv ... pip install' line"; finish; }
echo "# README: $line"
[ -x /usr/bin/python3 ] || skip "no /usr/bin/python3"
/usr/bin/python3 -c 'import venv, ensurepip' 2> /dev/null || skip "no python3-venv (tools/install-deps.sh --test)"
[ -e "$top_builddir/libulpack.so.0" ] || { fail "no $top_builddir/libulpack.so.0"; finish; }
if nm -D "$top_builddir/libulpack.so.0" 2> /dev/null | grep -q ' U __asan_\| U __tsan_'; then
	skip "libulpack.so is built with a sanitizer"
fi
mkdir -p "$T/home" "$T/src"
cp -R "$top_srcdir/python" "$T/src/python"
rm -rf "$T/src/python/build" "$T/src/python/ulpack.egg-info"
chmod -R u+w "$T/src"
ml=$(ls /usr/lib/python3*/EXTERNALLY-MANAGED 2> /dev/null | head -n 1)
if [ -n "$ml" ]; then
	(cd "$T/src" && env PATH=/usr/bin:/bin HOME="$T/home" PIP_CONFIG_FILE=/dev/null \
		python3 -m pip install --no-build-isolation --no-index ./python) > "$T/plain.log" 2>&1 &&
		fail "Debian's pip installed outside a venv (expected: externally-managed-environment)"
	grep -q externally-managed "$T/plain.log" && ok "plain pip refuses ($ml): why the README makes a venv"
fi
if (cd "$T/src" && env PATH=/usr/bin:/bin HOME="$T/home" PIP_CONFIG_FILE=/dev/null sh -c "$line") > "$T/install.log" 2>&1; then
	ok "the README's line ran"
else
	cat "$T/install.log"
	fail "the README's install line failed"
	finish
fi
vpy=$(ls "$T"/home/.venvs/*/bin/python 2> /dev/null | head -n 1)
[ -n "$vpy" ] || { fail "no venv python under \$HOME/.venvs after the README's line"; finish; }
"$ULPACK" init "$T/ar" > /dev/null && mkdir -p "$T/in/run/checkpoint-100" &&
	echo hello > "$T/in/run/checkpoint-100/notes.txt" && "$ULPACK" import "$T/ar" "$T/in" > /dev/null ||
	{ fail "making a test archive"; finish; }
out=$(cd "$T" && env -u PYTHONPATH ULPACK_LIB="$top_builddir/libulpack.so.0" "$vpy" -c '
import sys, ulpack
assert ulpack.__file__.startswith(sys.prefix), ulpack.__file__
ar = ulpack.open_archive(sys.argv[1])
with ar.open("run/checkpoint-100/notes.txt") as f:
    print(f.read().decode().strip())
' "$T/ar" 2>&1)
[ "$out" = hello ] && ok "the venv's python imports the installed package and reads an archive" ||
	fail "the installed package: $out"
finish
