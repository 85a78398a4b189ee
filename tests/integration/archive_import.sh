#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_import.sh - `ulpack import` of the real trajectory (the whole run of
# ../shared/data when present, else the subset committed under tests/data) and
# of a synthetic one: every file cats back with its sha256, export rebuilds the
# tree with modes and mtimes, verify passes, the stored bytes reported match the
# packs on disk, steps imported in shuffled order stay within max_chain, a cold
# read walks at most max_chain + 1 links, and the bf16 archive is within 2 % of
# the codec benchmark's sizes of its pairs plus its anchor.
. "$(dirname "$0")/lib.sh"

A="$T/arch"
"$ULPACK" init "$A" >/dev/null || fail "init"
"$ULPACK" init "$A" 2>"$T/err" && fail "init twice succeeded" || grep -q "already an archive" "$T/err" || fail "init twice message"
"$ULPACK" synth "$T/syn" --steps 4 --dim 64 || fail "synth"
mkdir -p "$T/syn/empty-dir"
printf '{"model_type": "tiny"}\n' > "$T/syn/config.json"
"$ULPACK" import "$A" "$T/syn" --prefix syn > "$T/out" || fail "import synth: $(cat "$T/out")"
grep -q "imported 5 files" "$T/out" && ok "$(cat "$T/out")" || fail "import summary: $(cat "$T/out")"
"$ULPACK" import "$A" "$T/syn" --prefix syn > "$T/out" || fail "re-import"
grep -q "imported 0 files (5 unchanged" "$T/out" && ok "re-import skips unchanged files" || fail "re-import: $(cat "$T/out")"

check_tree() { # check_tree SRC PREFIX
	( cd "$1" && find . -type f | sed 's|^\./||' ) | while read -r f; do
		want=$(sha256sum < "$1/$f" | cut -c1-64)
		got=$("$ULPACK" cat "$A" "$2/$f" | sha256sum | cut -c1-64)
		[ "$want" = "$got" ] || echo "MISMATCH $2/$f"
	done > "$T/mismatch"
	[ -s "$T/mismatch" ] && fail "cat: $(cat "$T/mismatch")" || ok "cat of every file under $2 matches its sha256"
}
check_tree "$T/syn" syn

TINY="$ULP_DATA_DIR/tiny-lm"
[ -d "$TINY" ] || TINY="$ULP_TEST_DATA_DIR/tiny-lm"
if [ -d "$TINY" ]; then
	"$ULPACK" import "$A" "$TINY" --prefix tiny > "$T/out" || fail "import $TINY: $(cat "$T/out")"
	ok "$(cat "$T/out")"
	check_tree "$TINY" tiny
	# bf16: archive size vs bench sizes of its first 6 pairs plus the first and
	# the newest step (anchors: ulpack-format(5), the layout of a series)
	"$ULPACK" stat "$A" tiny/bf16 --json > "$T/stat.json" || fail "stat"
	prev=""
	: > "$T/bench-sizes"
	steps=$(ls "$TINY/bf16" | sed -n 's/^checkpoint-//p' | sort -n)
	first=$(echo "$steps" | head -1)
	for s in $steps; do
		if [ -n "$prev" ]; then
			"$ULPACK" bench "$TINY/bf16/checkpoint-$prev/model.safetensors" \
				"$TINY/bf16/checkpoint-$s/model.safetensors" --json --reps 1 --min-time 0.001 \
				| "$PY" -c 'import json,sys; print(json.load(sys.stdin)["total"]["ulpack_bytes"])' >> "$T/bench-sizes"
		fi
		prev=$s
	done
	last=$(echo "$steps" | tail -1)
	"$PY" - "$T/stat.json" "$T/bench-sizes" "$first" "$last" <<'PYEOF' && ok "bf16 archive within 2 % of bench pairs + the newest step" || fail "bf16 archive size"
import json, sys
st = json.load(open(sys.argv[1]))
pairs = sum(int(x) for x in open(sys.argv[2]))
def stored_of(s):
    return [f for f in st["files"] if f["path"].endswith("checkpoint-%s/model.safetensors" % s)][0]
newest = stored_of(sys.argv[4])
assert newest["anchor"] and newest["chain_depth"] == 0, newest
# one segment (ulpack-format(5)): the newest step the only anchor, the
# others backward deltas against the step after them
assert not stored_of(sys.argv[3])["anchor"]
anchor = newest["stored_bytes"]
stored = st["total"]["stored_bytes"]
print("archive", stored, "bench pairs + anchor", pairs + anchor, "ratio", stored / (pairs + anchor))
assert abs(stored / (pairs + anchor) - 1) < 0.02
PYEOF
fi

# stored bytes match the packs on disk (8 bytes of header a pack)
"$ULPACK" stat "$A" --json > "$T/all.json" || fail "stat --json"
disk=$(cat "$A"/packs/*.pack | wc -c)
npacks=$(ls "$A"/packs/*.pack | wc -l)
"$PY" - "$T/all.json" "$disk" "$npacks" <<'PYEOF' && ok "stored bytes = pack bytes on disk ($disk)" || fail "stored bytes vs packs"
import json, sys
d = json.load(open(sys.argv[1]))
t = d["total"]
disk, n = int(sys.argv[2]), int(sys.argv[3])
assert "syn" in d["runs"] and d["runs"]["syn"]["files"] == 5, d["runs"]          # per run
assert sum(r["stored_bytes"] for r in d["runs"].values()) == t["stored_bytes"]
assert "BF16" in d["by_dtype"] and d["by_dtype"]["BF16"]["bits_per_weight"] > 0
assert t["pack_bytes"] == disk, (t, disk)
assert t["stored_bytes"] == disk - 8 * n, (t, disk, n)
PYEOF
"$ULPACK" verify "$A" > "$T/out" && ok "$(cat "$T/out")" || fail "verify: $(cat "$T/out")"

# export: the same tree, modes and mtimes
"$ULPACK" export "$A" syn "$T/exp" || fail "export"
diff -r "$T/syn" "$T/exp" > /dev/null && ok "export tree identical" || fail "export differs"
[ -d "$T/exp/empty-dir" ] && ok "empty directory kept" || fail "empty directory lost"
[ "$(stat -c %Y "$T/syn/checkpoint-100/model.safetensors")" = "$(stat -c %Y "$T/exp/checkpoint-100/model.safetensors")" ] \
	&& ok "mtime kept" || fail "mtime differs"

# shuffled steps, max_chain 3: depth bounded; cold read walks <= max_chain + 1
B="$T/shuf"
"$ULPACK" init "$B" >/dev/null
"$ULPACK" synth "$T/run" --steps 9 --dim 32 --interval 10 || fail "synth 9"
for s in 90 20 50 10 70 30 80 40 60; do
	mkdir -p "$T/one-$s" && cp -p -r "$T/run/checkpoint-$s" "$T/one-$s/"
	"$ULPACK" import "$B" "$T/one-$s" --prefix run --max-chain 3 > /dev/null || fail "import step $s"
done
"$ULPACK" stat "$B" --json > "$T/shuf.json"
"$PY" - "$T/shuf.json" <<'PYEOF' && ok "shuffled import: chains <= 3" || fail "chain depth"
import json, sys
f = json.load(open(sys.argv[1]))["files"]
assert len(f) == 9, len(f)
assert max(x["chain_depth"] for x in f) <= 3, f
assert sum(1 for x in f if x["chain_depth"] > 0) >= 5, f
PYEOF
for s in 90 10 50; do
	ULP_REPORT_COUNTERS=1 "$ULPACK" cat "$B" "run/checkpoint-$s/model.safetensors" 2> "$T/cnt" | cmp -s - "$T/run/checkpoint-$s/model.safetensors" \
		|| fail "cat step $s"
	walk=$(sed -n 's/.*max_walk \([0-9]*\).*/\1/p' "$T/cnt")
	[ -n "$walk" ] && [ "$walk" -le 4 ] && ok "cold read of step $s walks $walk links" || fail "walk $walk at step $s"
done

# issue 13: segments code as pool jobs with their chunks nested, appended in
# order by whichever thread finishes the next one: the packs (named by their
# bytes) do not depend on the thread count, nor does gc's rewrite of them
"$ULPACK" synth "$T/thr" --steps 2 --dim 768 || fail "synth thr"
head -c 12M /dev/urandom > "$T/thr/checkpoint-200/extra.bin"
# its first 4 MiB segment again: after rm, extra.bin's pack is a third live
# (the newest step is archived first: the other steps take it as reference)
{ head -c 4M "$T/thr/checkpoint-200/extra.bin"; head -c 1M /dev/urandom; } > "$T/thr/checkpoint-100/extra.bin"
for t in 1 3; do
	"$ULPACK" init "$T/thr-$t" > /dev/null
	"$ULPACK" import "$T/thr-$t" "$T/thr" --threads "$t" > /dev/null || fail "import --threads $t"
	"$ULPACK" rm "$T/thr-$t" checkpoint-200/extra.bin > /dev/null || fail "rm --threads $t"
	"$ULPACK" gc "$T/thr-$t" --threads "$t" > "$T/gc-$t" || fail "gc --threads $t"
	ls "$T/thr-$t/packs" > "$T/packs-$t"
done
# (rm re-codes and reclaims by itself: the rewrite of that pack was its; gc
# finds nothing left)
grep -q " 0 rewritten" "$T/gc-1" && grep -q "bytes reclaimed" "$T/gc-1" && ok "rm left no garbage for gc" \
	|| fail "gc after rm still found work: $(cat "$T/gc-1")"
cmp -s "$T/packs-1" "$T/packs-3" && ok "same packs on 1 and 3 threads, after gc too" || fail "packs differ by thread count"
"$ULPACK" verify "$T/thr-3" > /dev/null && ok "verify after gc" || fail "verify after gc"
finish
