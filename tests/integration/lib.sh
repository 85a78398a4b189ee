# SPDX-License-Identifier: MIT
# lib.sh - shared helpers of the integration tests: a private temporary
# directory removed on exit, failure reporting, and the skip convention
# (exit 77; under CI=true a skip is a failure).
set -u
: "${ULPACK:=$(pwd)/ulpack}"
T=$(mktemp -d "${TMPDIR:-/tmp}/ulp-test.XXXXXX")
ULP_CLEANUP=""
MOUNTS=""
cleanup() {
	for m in $MOUNTS; do
		fusermount3 -u -z "$m" 2>/dev/null
	done
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

# ---- mounts ---------------------------------------------------------------
: "${ULPACKFS:=$(dirname "$ULPACK")/ulpackfs}"
need_fuse() {
	[ -c /dev/fuse ] || skip "no /dev/fuse"
	command -v fusermount3 > /dev/null || skip "no fusermount3 (apt-get install fuse3)"
}
# mount_fs ARCHIVE MNT [options...]: mounts and waits until it answers
mount_fs() {
	a=$1 m=$2
	shift 2
	mkdir -p "$m"
	"$ULPACKFS" "$a" "$m" "$@" || return 1
	MOUNTS="$MOUNTS $m"
	wait_mounted "$m"
}
# wait_mounted MNT: whether MNT becomes a mount point within 2 s
wait_mounted() {
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		mountpoint -q "$1" && return 0
		sleep 0.2
	done
	return 1
}
# whether process $1 runs (a daemon's exited process may stay a zombie a
# while: its parent is init)
running() {
	_st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null)
	[ -n "$_st" ] && [ "$_st" != Z ]
}
# pid of the ulpackfs that serves mount point $1 (as it was given to it)
fs_pid() {
	for p in $(pgrep -x ulpackfs); do
		tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | grep -qxF -- "$1" && { echo "$p"; return 0; }
	done
	return 0
}
# unmounts and waits for the daemon to exit: it archives the files still
# queued (renamed last) after the kernel has let go of the mount point
umount_fs() {
	_pid=$(fs_pid "$1")
	fusermount3 -u "$1" || { sleep 0.5; fusermount3 -u "$1"; }
	[ -n "$_pid" ] || return 0
	for _ in $(seq 600); do
		running "$_pid" || return 0
		sleep 0.05
	done
	echo "# ulpackfs $_pid still running 60 s after unmounting $1" >&2
}
# mount_fg ARCHIVE MNT [options...]: mounts with ulpackfs in the foreground,
# a child of this shell whose pid is FS_PID (to kill -9 and wait for), and
# waits until it answers
mount_fg() {
	_a=$1 _m=$2
	shift 2
	mkdir -p "$_m"
	"$ULPACKFS" "$_a" "$_m" -f "$@" &
	FS_PID=$!
	MOUNTS="$MOUNTS $_m"
	wait_mounted "$_m"
}

# ---- crashes ----------------------------------------------------------------
# A writer run in the background (PID $W) that must hold files open across a
# crash touches $T/ready once it holds them and waits for $T/go to close them
# (a python one: PYTHONPATH="$IT_DIR", crash_writer.hold_until_go).
IT_DIR=$(cd "$(dirname "$0")" && pwd)
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ left in the source tree
# wait_ready W: whether the writer got ready (30 s at most; not if it exited)
wait_ready() {
	for _ in $(seq 600); do
		[ -e "$T/ready" ] && return 0
		running "$1" || break
		sleep 0.05
	done
	[ -e "$T/ready" ]
}
# crash_fs PID MNT [W]: kill -9 of the ulpackfs PID serving MNT; waits until
# it has gone, then lets writer W close its files ($T/go) and waits for it,
# then detaches the dead mount point. The next mount recovers staging.
crash_fs() {
	[ -n "$1" ] && kill -9 "$1"
	for _ in $(seq 600); do
		running "$1" || break
		sleep 0.05
	done
	wait "$1" 2>/dev/null # reaps it where it is a child (mount_fg)
	if [ -n "${3:-}" ]; then
		touch "$T/go"
		wait "$3" 2>/dev/null
	fi
	fusermount3 -u -z "$2" 2>/dev/null
	return 0
}
# crash_remount PID ARCHIVE MNT [W]: crash_fs PID MNT W, then mounts ARCHIVE
# on MNT again (recovering staging); a failure to mount fails the test
crash_remount() {
	crash_fs "$1" "$3" "${4:-}"
	mount_fs "$2" "$3" 2> "$T/mount.err" && return 0
	fail "remount after kill -9: $(cat "$T/mount.err")"
	return 1
}
