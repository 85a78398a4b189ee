#!/bin/sh
# SPDX-License-Identifier: MIT
# dcp.sh - torch.distributed.checkpoint with real torch (issue 36): 4 ranks
# (one process each, gloo on CPU) train a small model with AdamW and save
# 4 steps with dcp.save into a mount (and into a plain directory, the
# reference); then 2 ranks save a 5th step (another world size: the rank
# files' items move, so the coding of that step against step 4 falls back
# to anchors where tensors no longer match). Checks: every rank file in the
# mount byte-identical to the plain copy; dcp.load from the mount (4 ranks;
# step 5 resharded) and from a read-only mount into another world size (2
# ranks) gives equal tensors; ulpack verify; the rank files are coded per
# tensor with deltas between steps: the DCP run imported is stored within
# 3 % of the same tensors saved as safetensors and imported (the figures
# are printed). Needs the venv of tools/install-pydeps.sh ($ULP_TORCH_PYTHON,
# default /opt/ulpack-venv/bin/python): without it the test is skipped (a
# failure under CI=true).
. "$(dirname "$0")/lib.sh"
need_fuse
TPY=${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python}
"$TPY" -c 'import torch, torch.distributed.checkpoint, safetensors' 2> /dev/null \
	|| skip "no python with torch and safetensors at $TPY (sh tools/install-pydeps.sh)"
RUN="$TPY $IT_DIR/dcp_run.py"
port=$((20000 + $$ % 20000))
A="$T/arch" M="$T/mnt" P="$T/plain" P2="$T/plain2" S="$T/safe"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }
mkdir -p "$M/run"

t0=$(date +%s)
$RUN save 4 "$port" 0 4 "$M/run" "$P/run" "$S/run" > "$T/save.log" 2>&1 || fail "dcp.save of 4 ranks: $(tail -20 "$T/save.log")"
$RUN save 2 "$((port + 1))" 4 1 "$M/run" "$P2/run" > "$T/save2.log" 2>&1 || fail "dcp.save of 2 ranks: $(tail -20 "$T/save2.log")"
echo "# saves: $(( $(date +%s) - t0 )) s"
"$ULPACK" sync "$M" || fail "ulpack sync"

bad=0 n=0
for d in "$P/run" "$P2/run"; do
	for f in $(cd "$d" && find . -name '*.distcp' | sort); do
		n=$((n + 1))
		cmp -s "$d/$f" "$M/run/$f" || { bad=$((bad + 1)); echo "differs: $f"; }
	done
done
[ "$n" = 18 ] && [ "$bad" = 0 ] && ok "$n rank files byte-identical to the plain copy" || fail "$bad of $n rank files differ (18 expected)"
for s in 1 2 3 4 5; do
	[ -s "$M/run/step-$s/.metadata" ] || fail "step-$s/.metadata missing"
done

t0=$(date +%s)
$RUN load 4 "$((port + 2))" "$M/run/step-4" "$P/run/step-4" "$M/run/step-5" "$P2/run/step-5" > "$T/load.log" 2>&1 \
	&& ok "dcp.load from the mount into 4 ranks (step 5, saved by 2: resharded)" \
	|| fail "dcp.load from the mount: $(tail -20 "$T/load.log")"
umount_fs "$M"
MOUNTS=""
mount_fs "$A" "$M" -o ro || { fail "mount -o ro"; finish; }
$RUN load 2 "$((port + 3))" "$M/run/step-4" "$P/run/step-4" "$M/run/step-5" "$P2/run/step-5" > "$T/load2.log" 2>&1 \
	&& ok "dcp.load from a read-only mount into 2 ranks (step 4: resharded)" \
	|| fail "dcp.load from the read-only mount: $(tail -20 "$T/load2.log")"
echo "# loads: $(( $(date +%s) - t0 )) s"
"$ULPACK" verify "$A" > "$T/verify.log" 2>&1 && ok "verify" || fail "verify: $(tail -5 "$T/verify.log")"

# stored bytes: the DCP run (steps 1-4) against the same tensors as safetensors
"$ULPACK" init "$T/ad" > /dev/null && "$ULPACK" import "$T/ad" "$P" > /dev/null || fail "import of the DCP run"
"$ULPACK" init "$T/as" > /dev/null && "$ULPACK" import "$T/as" "$S" > /dev/null || fail "import of the safetensors"
"$ULPACK" stat "$T/ad" --json > "$T/ad.json" && "$ULPACK" stat "$T/as" --json > "$T/as.json" \
	&& "$ULPACK" stat "$A" --json > "$T/a.json" || fail stat
"$PY" - "$T/ad.json" "$T/as.json" "$T/a.json" <<'PYEOF' && ok "DCP run coded per tensor with deltas, within 3 % of safetensors" || fail "DCP run not coded as its tensors"
import json, sys
ad, as_, am = (json.load(open(p)) for p in sys.argv[1:4])
def total(s, pred):
    fs = [f for f in s["files"] if pred(f["path"])]
    return sum(f["raw_bytes"] for f in fs), sum(f["stored_bytes"] for f in fs), fs
first4 = lambda p: any(("step-%d/" % s) in p for s in (1, 2, 3, 4))
rd, sd, fd = total(ad, first4)
rs, ss, _ = total(as_, first4)
rm, sm, fm = total(am, lambda p: first4(p))
print("# DCP imported: %d raw, %d stored (%.4f); safetensors imported: %d raw, %d stored (%.4f); "
      "DCP/safetensors stored %.4f" % (rd, sd, sd / rd, rs, ss, ss / rs, sd / ss))
print("# DCP through the mount: %d raw, %d stored (%.4f), %.4f of the safetensors' stored bytes"
      % (rm, sm, sm / rm, sm / ss))
for f in fd:
    if f["path"].endswith(".distcp"):
        assert f["kind"] == "torch", f
deltas = [f for f in fd if f["path"].endswith(".distcp") and not f["anchor"]]
assert len(deltas) >= 8, [(f["path"], f["anchor"]) for f in fd]
assert ad["by_dtype"]["F32"]["delta_blobs"] > 0, ad["by_dtype"]
assert sd <= 1.03 * ss, (sd, ss)
for f in am["files"]:
    if f["path"].endswith(".distcp"):
        assert f["kind"] == "torch", f
PYEOF
finish
