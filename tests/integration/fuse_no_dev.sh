#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_no_dev.sh - issue 40 item 2: where /dev/fuse is missing (a container
# without it), ulpackfs fails at once, touches nothing, and its message
# names the FUSE-free paths (ulpack export, the Python package). /dev is a
# fresh tmpfs inside a mount namespace of the test's own (unshare -m).
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "a mount namespace needs root"
command -v unshare > /dev/null || skip "no unshare"
A="$T/arch" M="$T/mnt"
$ULPACK init "$A" > /dev/null
mkdir -p "$M"
unshare -m --propagation private sh -c 'mount -t tmpfs none /dev && [ ! -e /dev/fuse ] && exec "$1" "$2" "$3" -f' \
	sh "$ULPACKFS" "$A" "$M" > "$T/out" 2>&1
rc=$?
[ "$rc" = 1 ] && ok "ulpackfs without /dev/fuse exits 1" || fail "exit status $rc: $(cat "$T/out")"
grep -q '/dev/fuse' "$T/out" && grep -q "ulpack export $A" "$T/out" && grep -q 'Python' "$T/out" \
	&& ok "the message names ulpack export and the Python package: $(head -1 "$T/out")" || fail "message: $(cat "$T/out")"
! grep -q " $M " /proc/mounts && ok "nothing mounted" || fail "mounted"
# the FUSE-free path the message names works
$ULPACK synth "$T/run" --steps 1 --dim 16 > /dev/null
$ULPACK import "$A" "$T/run" > /dev/null
$ULPACK export "$A" checkpoint-100 "$T/out.d" > /dev/null 2>&1 && cmp -s "$T/run/checkpoint-100/model.safetensors" "$T/out.d/model.safetensors" \
	&& ok "ulpack export reads without FUSE" || fail "export: $(ls -R "$T/out.d" 2>&1 | head -5)"
finish
