#!/bin/sh
# SPDX-License-Identifier: MIT
# torch2.sh - what real torch 2.13 and transformers write, saved straight into
# a mount (issue 36 item 7; tests/integration/torch2_run.py):
#  - torch.save of a model's state_dict, of AdamW's state_dict, of the state
#    as bf16 and as float8_e4m3fn and float8_e5m2, three steps: byte-identical
#    to a plain copy; each file coded per tensor in its dtype (ulpack stat of
#    the file: F32, BF16, F8_E4M3, F8_E5M2 blobs) with deltas between steps
#    (the fp8 tensors were opaque bytes, every step an anchor, before);
#    torch.load(weights_only=True) from the mount, after a remount read-only,
#    equal to the plain copy's;
#  - transformers' Trainer (a 2-layer GPT-2 from a config, no download) with
#    output_dir on the mount, saving checkpoint-2/4/6; its model.safetensors,
#    optimizer.pt and rng_state.pth coded per tensor (the first two with
#    deltas), scheduler.pt and training_args.bin torch files without
#    tensors, trainer_state.json opaque; resumed from the mount's checkpoint-2
#    (train(resume_from_checkpoint=...)) it reaches step 6 with weights equal
#    bit for bit to the first run's;
#  - Lightning's ModelCheckpoint writing epoch=E-step=N.ckpt every 2 steps
#    over 3 epochs into the mount: one series (deltas across epochs),
#    torch.load(weights_only=True) from the read-only mount.
# Needs the venv of tools/install-pydeps.sh ($ULP_TORCH_PYTHON, default
# /opt/ulpack-venv/bin/python): without it the test is skipped (a failure
# under CI=true).
. "$(dirname "$0")/lib.sh"
need_fuse
TPY=${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python}
"$TPY" -c 'import torch, transformers, safetensors, lightning' 2> /dev/null \
	|| skip "no python with torch, transformers, lightning and safetensors at $TPY (sh tools/install-pydeps.sh)"
RUN="$TPY $IT_DIR/torch2_run.py"
A="$T/arch" M="$T/mnt" P="$T/plain"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }

export HF_HOME="$T/hf-home"
$RUN save "$M" "$P" "$M/hf" "$M/lt" > "$T/save.log" 2>&1 || fail "torch.save, Trainer, Lightning into the mount: $(tail -20 "$T/save.log")"
"$ULPACK" sync "$M" > /dev/null || fail "ulpack sync"
bad=0 n=0
for f in $(cd "$P" && find . -type f | sort); do
	n=$((n + 1))
	cmp -s "$P/$f" "$M/$f" || { bad=$((bad + 1)); echo "differs: $f"; }
done
[ "$n" = 12 ] && [ "$bad" = 0 ] && ok "$n torch.save files byte-identical to the plain copy" || fail "$bad of $n files differ (12 expected)"
$RUN resume "$M/hf2" "$M/hf/checkpoint-2" "$M/hf/checkpoint-6/model.safetensors" > "$T/resume.log" 2>&1 \
	&& ok "Trainer resumed from the mount's checkpoint-2: step 6 equal to the first run's" \
	|| fail "resume from the mount: $(tail -20 "$T/resume.log")"
"$ULPACK" sync "$M" > /dev/null || fail "ulpack sync"

"$ULPACK" stat "$A" --json > "$T/all.json" || fail stat
for f in run/checkpoint-2/fp8.pt run/checkpoint-2/bf16.pt run/checkpoint-2/optimizer.pt run/checkpoint-2/model.pt \
	hf/checkpoint-2/optimizer.pt hf/checkpoint-2/model.safetensors hf/checkpoint-2/rng_state.pth hf/checkpoint-2/scheduler.pt; do
	"$ULPACK" stat "$A" "$f" --json > "$T/$(echo "$f" | tr / _).json" || fail "stat $f"
done
"$PY" - "$T" <<'PYEOF' && ok "torch 2.13's files coded per tensor in their dtypes, with deltas" || fail "not coded per tensor"
import json, os, sys
t = sys.argv[1]
one = lambda f: json.load(open(os.path.join(t, f.replace("/", "_") + ".json")))
def dts(f):
    s = one(f)
    assert len(s["files"]) == 1 and not s["files"][0]["anchor"], (f, s["files"])
    return {k: (v["tensors"], v["delta_blobs"]) for k, v in s["by_dtype"].items()}
fp8 = dts("run/checkpoint-2/fp8.pt")
assert fp8["F8_E4M3"][1] > 0 and fp8["F8_E5M2"][1] > 0 and fp8["F8_E4M3"][0] == 4, fp8
assert dts("run/checkpoint-2/bf16.pt")["BF16"][1] > 0
assert dts("run/checkpoint-2/model.pt")["F32"][1] > 0
assert dts("run/checkpoint-2/optimizer.pt")["F32"][1] > 0
assert dts("hf/checkpoint-2/optimizer.pt")["F32"][1] > 0
assert dts("hf/checkpoint-2/model.safetensors")["F32"][1] > 0
# rng_state.pth: torch's CPU generator state, one U8 tensor (random bytes:
# coded standalone); scheduler.pt: a pickle without tensors (verbatim)
assert one("hf/checkpoint-2/rng_state.pth")["by_dtype"]["U8"]["tensors"] == 1
assert one("hf/checkpoint-2/scheduler.pt")["files"][0]["kind"] == "torch"
files = {f["path"]: f for f in json.load(open(os.path.join(t, "all.json")))["files"]}
assert files["hf/checkpoint-2/trainer_state.json"]["kind"] == "opaque"
# Lightning's epoch=E-step=N.ckpt: one series whatever the epoch, the
# newest an anchor, the others deltas
lt = sorted((f["step"], f) for p, f in files.items() if p.startswith("lt/"))
assert [s for s, _ in lt] == [2, 4, 6, 8], lt
assert all(f["kind"] == "torch" for _, f in lt) and [f["anchor"] for _, f in lt] == [False] * 3 + [True], lt
for p, f in sorted(files.items()):
    if p.startswith(("run/checkpoint-2/", "hf/checkpoint-2/")):
        print("# %-40s %-12s ratio %.3f anchor %s" % (p, f["kind"], f["ratio"], f["anchor"]))
    if p.endswith((".pt", ".pth", ".bin")) and not p.endswith("training_args.bin"):
        assert f["kind"] == "torch", f
    if p.endswith(".safetensors"):
        assert f["kind"] == "safetensors" or f["safetensors"], f
PYEOF

umount_fs "$M"
MOUNTS=""
mount_fs "$A" "$M" -o ro || { fail "mount -o ro"; finish; }
$RUN load "$M" "$P" > "$T/load.log" 2>&1 && $RUN ckpts "$M/lt" >> "$T/load.log" 2>&1 && ok "torch.load(weights_only=True) from a read-only mount: equal" \
	|| fail "torch.load from the mount: $(tail -20 "$T/load.log")"
"$ULPACK" verify "$A" > "$T/verify.log" 2>&1 && ok verify || fail "verify: $(tail -5 "$T/verify.log")"
finish
