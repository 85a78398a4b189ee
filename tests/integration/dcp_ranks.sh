#!/bin/sh
# SPDX-License-Identifier: MIT
# dcp_ranks.sh - many ranks at once into one mount (issue 36 item 4): 8
# processes (gloo on CPU, one per rank) of real torch.distributed.checkpoint
# save (odd steps) and async_save (step 2) through
# FileSystemWriter(sync_files=True, thread_count=2), 3 steps into the same
# step directory of a mount, each step then into a plain directory
# (tests/integration/dcp_ranks_run.py). Checks: the 48 rank files
# byte-identical to the plain copy; each step's .metadata (rank 0's, written
# once every rank's files are closed) no older than its rank files; coded
# per tensor with deltas between steps; dcp.load from the mount into the same
# sharding (8 ranks) and, from a read-only mount, into another world size (4
# ranks) gives the saved values; verify. Memory: the daemon's peak (VmHWM)
# with 8 ranks stays within that of the same state saved by 2 ranks (4x
# larger rank files) plus 64 MiB. Needs the venv of tools/install-pydeps.sh
# ($ULP_TORCH_PYTHON, default /opt/ulpack-venv/bin/python): without it the
# test is skipped (a failure under CI=true).
. "$(dirname "$0")/lib.sh"
need_fuse
TPY=${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python}
"$TPY" -c 'import torch, torch.distributed.checkpoint' 2> /dev/null \
	|| skip "no python with torch at $TPY (sh tools/install-pydeps.sh)"
RUN="$TPY $IT_DIR/dcp_ranks_run.py"
port=$((20000 + $$ % 20000))
A="$T/arch" M="$T/mnt" P="$T/plain"
hwm() { sed -n 's/^VmHWM:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$1/status"; }

# the same state saved by 2 ranks: the daemon's peak for comparison
"$ULPACK" init "$T/a2" > /dev/null
mount_fg "$T/a2" "$M" || { fail mount; finish; }
$RUN save 2 "$port" "$M/run" "$T/plain2" 2 > "$T/save2.log" 2>&1 || fail "2 ranks: $(tail -20 "$T/save2.log")"
"$ULPACK" sync "$M" > /dev/null || fail "ulpack sync (2 ranks)"
h2=$(hwm "$FS_PID")
umount_fs "$M"
wait "$FS_PID" 2> /dev/null
MOUNTS=""

"$ULPACK" init "$A" > /dev/null
mount_fg "$A" "$M" || { fail mount; finish; }
t0=$(date +%s)
$RUN save 8 "$((port + 1))" "$M/run" "$P/run" 3 > "$T/save.log" 2>&1 || fail "8 ranks: $(tail -20 "$T/save.log")"
echo "# 8 ranks, 3 steps (save, async_save, save) into the mount and a plain directory: $(( $(date +%s) - t0 )) s"
"$ULPACK" sync "$M" > /dev/null || fail "ulpack sync"
h8=$(hwm "$FS_PID")
echo "# daemon VmHWM: $h2 KiB (2 ranks, 2 steps), $h8 KiB (8 ranks, 3 steps)"
[ -n "$h2" ] && [ -n "$h8" ] && [ "$h8" -lt $((h2 + 64 * 1024)) ] \
	&& ok "daemon peak with 8 ranks ($h8 KiB) within 2 ranks' ($h2 KiB) + 64 MiB" \
	|| fail "daemon peak with 8 ranks: ${h8:-?} KiB, 2 ranks: ${h2:-?} KiB"

bad=0 n=0
for f in $(cd "$P/run" && find . -name '*.distcp' | sort); do
	n=$((n + 1))
	cmp -s "$P/run/$f" "$M/run/$f" || { bad=$((bad + 1)); echo "differs: $f"; }
done
[ "$n" = 48 ] && [ "$bad" = 0 ] && ok "$n rank files byte-identical to the plain copy" || fail "$bad of $n rank files differ (48 expected)"
late=0
for s in 1 2 3; do
	md=$(stat -c %Y "$M/run/step-$s/.metadata" 2> /dev/null) || { fail "step-$s/.metadata missing"; continue; }
	for f in "$M/run/step-$s"/*.distcp; do
		[ "$(stat -c %Y "$f")" -le "$md" ] || late=$((late + 1))
	done
done
[ "$late" = 0 ] && ok ".metadata of each step no older than its rank files" || fail "$late rank files newer than their .metadata"

"$ULPACK" stat "$A" --json > "$T/a.json" || fail stat
"$PY" - "$T/a.json" <<'PYEOF' && ok "rank files coded per tensor, with deltas between steps" || fail "rank files not coded per tensor"
import json, sys
s = json.load(open(sys.argv[1]))
fs = [f for f in s["files"] if f["path"].endswith(".distcp")]
assert len(fs) == 48 and all(f["kind"] == "torch" for f in fs), [(f["path"], f["kind"]) for f in fs]
deltas = [f for f in fs if not f["anchor"]]
assert len(deltas) >= 16, [(f["path"], f["anchor"]) for f in fs]
assert s["by_dtype"]["F32"]["delta_blobs"] > 0, s["by_dtype"]
raw = sum(f["raw_bytes"] for f in fs)
print("# 48 rank files: %d raw, %d stored (%.3f), %d deltas" % (raw, sum(f["stored_bytes"] for f in fs),
      sum(f["stored_bytes"] for f in fs) / raw, len(deltas)))
PYEOF

$RUN load 8 "$((port + 2))" "$M/run/step-2" 2 > "$T/load8.log" 2>&1 \
	&& ok "dcp.load from the mount into 8 ranks (step 2, async_save)" \
	|| fail "dcp.load from the mount: $(tail -20 "$T/load8.log")"
umount_fs "$M"
wait "$FS_PID" 2> /dev/null
MOUNTS=""
mount_fs "$A" "$M" -o ro || { fail "mount -o ro"; finish; }
$RUN load 4 "$((port + 3))" "$M/run/step-3" 3 > "$T/load4.log" 2>&1 \
	&& ok "dcp.load from a read-only mount into 4 ranks (step 3, saved by 8: resharded)" \
	|| fail "dcp.load from the read-only mount: $(tail -20 "$T/load4.log")"
"$ULPACK" verify "$A" > "$T/verify.log" 2>&1 && ok verify || fail "verify: $(tail -5 "$T/verify.log")"
finish
