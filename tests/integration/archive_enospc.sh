#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_enospc.sh - a full disk (a small tmpfs) during import: a clear error
# naming the cause, nothing half-committed, the archive still verifies; after
# space is freed the same import completes.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || skip "needs root to mount a small tmpfs"
mkdir -p "$T/small"
mount -t tmpfs -o size=2m tmpfs "$T/small" 2>/dev/null || skip "cannot mount tmpfs here"
ULP_CLEANUP="umount '$T/small' 2>/dev/null"
A="$T/small/arch"
"$ULPACK" init "$A" >/dev/null || fail init
"$ULPACK" synth "$T/run" --steps 4 --dim 128 || fail synth
"$ULPACK" import "$A" "$T/run" --prefix run > "$T/out" 2> "$T/err" && fail "import into a full disk succeeded"
grep -qi "no space" "$T/err" && ok "error: $(head -1 "$T/err" | cut -c1-160)" || fail "message: $(cat "$T/err")"
"$ULPACK" verify "$A" > "$T/v" && ok "archive still verifies: $(cat "$T/v")" || fail "verify after ENOSPC: $(cat "$T/v")"
ls "$A/packs" | grep -q '^tmp-' && fail "temporary pack left behind" || ok "no temporary pack left"
mount -o remount,size=64m "$T/small" || fail remount
"$ULPACK" import "$A" "$T/run" --prefix run > "$T/out" || fail "import after freeing space: $(cat "$T/out")"
ok "$(cat "$T/out")"
"$ULPACK" verify "$A" > /dev/null && ok "verify" || fail "verify"
finish
