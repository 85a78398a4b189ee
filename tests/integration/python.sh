#!/bin/sh
# SPDX-License-Identifier: MIT
# python.sh - the Python package (python/ulpack, issue 27) against this
# build's libulpack.so: python3 -m pytest -q python/tests (reads against
# `ulpack cat`, single tensors and the decode counters, threads, damaged and
# missing files, 10,000 opens without a leak, the writer and its lock;
# test_trust.py, issue 34: files outliving their archive, in child
# interpreters so that a crash fails a test, NUL bytes in paths, pread's
# offsets, FormatError; test_fsspec.py, issue 36 item 6: the fsspec file
# system, and DCP's FsspecWriter/FsspecReader saving into and loading from
# an archive, where fsspec and torch import: the venv has both).
# The torch tests run where `import torch` works; numpy and pytest are
# required (tools/install-deps.sh --test).
. "$(dirname "$0")/lib.sh"
py=""
# the venv of tools/install-pydeps.sh first: with real torch there, the
# tests that load checkpoints with torch.load run instead of being skipped
for c in ${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python} ${PYTHON3:-} /usr/bin/python3 python3; do
	command -v "$c" > /dev/null 2>&1 && "$c" -c 'import pytest, numpy' 2> /dev/null && { py=$c; break; }
done
[ -n "$py" ] || skip "no python3 with pytest and numpy (tools/install-deps.sh --test: python3-pytest python3-numpy)"
[ -e "$top_builddir/libulpack.so.0" ] || { fail "no $top_builddir/libulpack.so.0"; finish; }
# a sanitizer build's library needs its runtime first in the process: not from python
if nm -D "$top_builddir/libulpack.so.0" 2> /dev/null | grep -q ' U __asan_\| U __tsan_'; then
	skip "libulpack.so is built with a sanitizer"
fi
export ULPACK_LIB="$top_builddir/libulpack.so.0" PYTHONPATH="$top_srcdir/python${PYTHONPATH:+:$PYTHONPATH}"
export ULPACK ULPACKFS PYTHONDONTWRITEBYTECODE=1
"$py" -c 'import torch' 2> /dev/null && echo "# torch: $("$py" -c 'import torch; print(torch.__version__)')" \
	|| echo "# no torch: its tests are skipped (bytes compared instead)"
cd "$T" || exit 1
if "$py" -m pytest -q -p no:cacheprovider -rs "$top_srcdir/python/tests" > "$T/pytest.log" 2>&1; then
	tail -n 15 "$T/pytest.log"
	ok "pytest python/tests: $(tail -n 1 "$T/pytest.log")"
else
	cat "$T/pytest.log"
	fail "pytest python/tests"
fi
finish
