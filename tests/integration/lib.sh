# SPDX-License-Identifier: MIT
# lib.sh - shared helpers of the integration tests: a private temporary
# directory removed on exit, failure reporting, and the skip convention
# (exit 77; under CI=true a skip is a failure).
set -u
: "${ULPACK:=$(pwd)/ulpack}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ulp-test.XXXXXX")
ULP_CLEANUP=""
cleanup() {
	eval "$ULP_CLEANUP"
	rm -rf "$T"
}
trap cleanup EXIT
FAILS=0
fail() { echo "FAIL: $*" >&2; FAILS=$((FAILS + 1)); }
ok() { echo "ok: $*"; }
skip() {
	if [ "${CI:-}" = true ]; then
		echo "FAIL (skip not allowed under CI=true): $*" >&2
		exit 1
	fi
	echo "SKIP: $*"
	exit 77
}
finish() {
	if [ "$FAILS" -ne 0 ]; then
		echo "$FAILS failures"
		exit 1
	fi
	exit 0
}
# python3 with the standard library (json); prefer the system one.
PY=$(command -v /usr/bin/python3 || command -v python3)
