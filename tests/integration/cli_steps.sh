#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_steps.sh - steps, not names, and the CLI's other usability checks
# (issue 15 items 3, 5, 6):
#  - ulpack ls lists checkpoint-50 ... checkpoint-400 in numeric order with a
#    step column; --json parses;
#  - ulpack steps: per run, each step's raw and stored bytes, ratio and chain
#    depth, matching `ulpack stat`; --json; a RUN prefix; step files
#    (epoch=E-step=N.ckpt in one folder, issue 28 item 16);
#  - ulpack verify --json; ulpack import --json counts files, not
#    directories; --progress shows a line while one large file is coded,
#    with an ETA;
#  - ulpack init creates missing parents and refuses a non-empty directory
#    that is not an archive (and keeps its files);
#  - ulpack export of one step gives a plain directory identical to the
#    source (sha256 of every file, modes).
. "$(dirname "$0")/lib.sh"
DATA="${ULP_TEST_DATA_DIR:-}/tiny-lm"
[ -d "$DATA/bf16" ] || skip "no tests/data/tiny-lm"
A="$T/deep/er/arch"
"$ULPACK" init "$A" > /dev/null && [ -f "$A/ulpack.db" ] && ok "init creates missing parents" || fail "init parents"
mkdir "$T/busy" && echo keep > "$T/busy/notes.txt"
"$ULPACK" init "$T/busy" 2> "$T/err" && fail "init of a non-empty directory succeeded"
grep -q "busy: not empty and not an archive" "$T/err" && [ "$(cat "$T/busy/notes.txt")" = keep ] && [ ! -e "$T/busy/ulpack.db" ] \
	&& ok "init refuses a non-empty directory, names it, keeps its files" || fail "init message: $(cat "$T/err")"
"$ULPACK" init "$A" 2> /dev/null && fail "init of an archive succeeded"

mkdir -p "$T/src"
cp -r "$DATA/bf16" "$T/src/lm"
"$ULPACK" import "$A" "$T/src" --json > "$T/imp.json" || fail "import --json"
"$PY" - "$T/imp.json" "$T/src" <<'PYEOF' && ok "import --json counts files, not directories" || fail "import --json: $(cat "$T/imp.json")"
import json, os, sys
d = json.load(open(sys.argv[1]))
files = sum(len(f) for _, _, f in os.walk(sys.argv[2]))
dirs = sum(len(dd) for _, dd, _ in os.walk(sys.argv[2]))
assert d["ok"] and d["files"] == files and d["directories"] == dirs, (d, files, dirs)
assert 0 < d["ratio"] < 1 and d["raw_bytes"] > d["stored_bytes"] > 0
PYEOF

"$ULPACK" ls "$A" lm > "$T/ls"
want=$(ls "$DATA/bf16" | sed -n 's/^checkpoint-//p' | sort -n | tr '\n' ' ')
steps=$(awk '{ print $4 }' "$T/ls" | tr '\n' ' ')
[ "$steps" = "$want" ] && [ "$(ls "$DATA/bf16" | grep -c checkpoint-)" -ge 3 ] && ok "ls: numeric order with a step column" || fail "ls steps: $steps"
"$ULPACK" ls "$A" lm --json | "$PY" -c '
import json, sys
v = json.load(sys.stdin)
assert [e["step"] for e in v] == sorted(e["step"] for e in v) and len(v) >= 3, v
assert all(e["type"] == "dir" for e in v)' && ok "ls --json" || fail "ls --json"

"$ULPACK" steps "$A" > "$T/steps" || fail "steps"
n=$(ls "$DATA/bf16" | grep -c checkpoint-)
grep -q "^run lm" "$T/steps" && [ "$(grep -c "checkpoint-" "$T/steps")" = "$n" ] && ok "steps: one line per step" \
	|| fail "steps: $(cat "$T/steps")"
"$ULPACK" stat "$A" --json > "$T/stat.json"
"$ULPACK" steps "$A" lm --json > "$T/steps.json"
"$PY" - "$T/steps.json" "$T/stat.json" <<'PYEOF' && ok "steps --json agrees with stat (bytes, ratio, depth), steps in order" || fail "steps --json"
import json, sys
s = json.load(open(sys.argv[1]))
st = json.load(open(sys.argv[2]))
assert [r["step"] for r in s] == sorted(r["step"] for r in s) and len(s) >= 3, s
byfile = {f["path"]: f for f in st["files"]}
for r in s:
    f = byfile[r["dir"] + "/model.safetensors"]
    assert r["run"] == "lm" and r["files"] == 1
    assert r["raw_bytes"] == f["raw_bytes"] and r["stored_bytes"] == f["stored_bytes"]
    assert r["chain_depth"] == f["chain_depth"] and abs(r["ratio"] - f["ratio"]) < 1e-6
# the newest step is the anchor, those before it backward deltas (one segment)
assert s[-1]["chain_depth"] == 0 and all(r["chain_depth"] > 0 for r in s[:-1])
PYEOF
"$ULPACK" steps "$A" nosuch 2> /dev/null && fail "steps of a missing run succeeded"

# step files (issue 28 item 16): Lightning's epoch=E-step=N.ckpt in one folder
mkdir -p "$T/lsrc/lit/checkpoints"
i=0
for c in $(ls "$DATA/bf16" | grep checkpoint- | sort -t- -k2 -n); do
	cp "$DATA/bf16/$c/model.safetensors" "$T/lsrc/lit/checkpoints/epoch=$i-step=${c#checkpoint-}.ckpt"
	i=$((i + 1))
done
echo "lr: 0.1" > "$T/lsrc/lit/hparams.yaml"
cp "$T/lsrc/lit/checkpoints/epoch=0-"* "$T/lsrc/lit/checkpoints/last.ckpt"
"$ULPACK" init "$T/larch" > /dev/null && "$ULPACK" import "$T/larch" "$T/lsrc" > /dev/null || fail "import step files"
"$ULPACK" steps "$T/larch" > "$T/lsteps" || fail "steps of step files"
grep -q "^run lit/checkpoints" "$T/lsteps" && [ "$(grep -c "epoch=.*-step=.*\.ckpt" "$T/lsteps")" = "$n" ] \
	&& ! grep -q "last.ckpt\|no step" "$T/lsteps" && ok "steps lists step files as steps of their folder" \
	|| fail "steps of step files: $(cat "$T/lsteps")"
"$ULPACK" steps "$T/larch" --json | "$PY" -c '
import json, sys
s = json.load(sys.stdin)
assert len(s) == int(sys.argv[1]) and all(r["run"] == "lit/checkpoints" and r["type"] == "file" and r["files"] == 1 for r in s), s
assert [r["step"] for r in s] == sorted(r["step"] for r in s) and s[-1]["chain_depth"] == 0, s
assert all(r["dir"].startswith("lit/checkpoints/epoch=") and r["dir"].endswith(".ckpt") for r in s), s' "$n" \
	&& ok "steps --json: step files, type file, in step order" || fail "steps --json of step files"
"$ULPACK" steps "$A" lm --json | "$PY" -c 'import json,sys; assert all(r["type"] == "dir" for r in json.load(sys.stdin))' \
	&& ok "steps --json: step directories have type dir" || fail "type of step directories"

"$ULPACK" verify "$A" --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
assert d["ok"] and d["files"] == int(sys.argv[1]) and d["damaged"] == [], d' "$n" && ok "verify --json" || fail "verify --json"

# progress inside one large file: lines every 20 ms while it is coded
"$ULPACK" synth "$T/big" --steps 1 --dim 512 > /dev/null
"$ULPACK" init "$T/b2" > /dev/null
ULPACK_PROGRESS_MS=20 "$ULPACK" import "$T/b2" "$T/big" --progress --threads 1 > /dev/null 2> "$T/prog"
grep -Eq '^\[ *([1-9]|[1-9][0-9])%\] 0/1 files, .*ETA [0-9]+:[0-9][0-9]: checkpoint-100/model.safetensors' "$T/prog" \
	&& ok "import --progress: moves inside one file, files counted, ETA" || fail "progress: $(head -3 "$T/prog")"
tail -1 "$T/prog" | grep -q '^\[100%\] 1/1 files' && ok "progress ends at 1/1 files" || fail "last line: $(tail -1 "$T/prog")"

# export of one step: a plain directory like the source
mkdir "$T/out"
last=$(ls "$DATA/bf16" | sed -n 's/^checkpoint-//p' | sort -n | tail -1)
"$ULPACK" export "$A" "lm/checkpoint-$last" "$T/out/ck" || fail "export of a step"
(cd "$DATA/bf16/checkpoint-$last" && find . -type f -exec sha256sum {} + | sort) > "$T/s1"
(cd "$T/out/ck" && find . -type f -exec sha256sum {} + | sort) > "$T/s2"
cmp -s "$T/s1" "$T/s2" && ok "export of one step: every file's sha256 matches" || fail "export differs"
finish
