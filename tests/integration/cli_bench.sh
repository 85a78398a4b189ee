#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_bench.sh - `ulpack synth` writes a deterministic trajectory and
# `ulpack bench --json` on a pair of it reports every promised field, a
# successful round trip, and ULPack below zstd -19 on the byte-grouped XOR;
# bench on a pair of torch.save files.
. "$(dirname "$0")/lib.sh"

"$ULPACK" synth "$T/a" --steps 2 --dim 64 || fail "synth"
"$ULPACK" synth "$T/b" --steps 2 --dim 64 || fail "synth again"
cmp -s "$T/a/checkpoint-200/model.safetensors" "$T/b/checkpoint-200/model.safetensors" \
	&& ok "synth is deterministic" || fail "synth differs between runs"
for dt in f16 f32 mixed; do
	"$ULPACK" synth "$T/$dt" --steps 2 --dim 32 --dtype "$dt" || fail "synth --dtype $dt"
done

"$ULPACK" bench "$T/a/checkpoint-100/model.safetensors" "$T/a/checkpoint-200/model.safetensors" \
	--json --threads 2 --reps 1 --min-time 0.01 > "$T/bench.json" || fail "bench exit status"
"$PY" - "$T/bench.json" <<'PYEOF' || fail "bench json"
import json, sys
d = json.load(open(sys.argv[1]))
keys = ["raw_bytes", "ulpack_bytes", "bound_bytes", "zstd19_bgxor_bytes", "zstd3_bgxor_bytes",
        "encode_mbps", "decode_mbps", "encode_mbps_mt", "decode_mbps_mt", "zstd3_encode_mbps",
        "zstd3_decode_mbps", "memcpy_mbps", "roundtrip_ok"]
for g in [d["total"]] + list(d["by_dtype"].values()):
    missing = [k for k in keys if k not in g]
    assert not missing, missing
    assert g["roundtrip_ok"] is True
    assert g["ulpack_bytes"] < g["zstd19_bgxor_bytes"], g
    assert g["ulpack_bytes"] <= 1.05 * g["bound_bytes"] + 4096, g
    assert g["decode_mbps"] > 0 and g["encode_mbps"] > 0
assert "BF16" in d["by_dtype"]
print("bench json ok:", d["total"]["ulpack_bytes"], "of", d["total"]["raw_bytes"])
PYEOF
"$ULPACK" bench "$T/mixed/checkpoint-100/model.safetensors" "$T/mixed/checkpoint-200/model.safetensors" \
	--reps 1 --min-time 0.01 > "$T/bench.txt" || fail "bench on mixed dtypes"
grep -q '^F32 ' "$T/bench.txt" && grep -q '^BF16 ' "$T/bench.txt" && grep -q '^total ' "$T/bench.txt" \
	&& ok "text report per dtype" || fail "text report: $(cat "$T/bench.txt")"
# torch.save pairs: the storages of two steps of AdamW state (tests/data/torch)
TD="$top_srcdir/tests/data/torch/run"
"$ULPACK" bench "$TD/checkpoint-20/optimizer.pt" "$TD/checkpoint-30/optimizer.pt" --json --reps 1 --min-time 0.01 \
	> "$T/bench_pt.json" || fail "bench on torch.save files"
"$PY" - "$T/bench_pt.json" <<'PYEOF' && ok "bench on torch.save files" || fail "bench on torch.save json"
import json, sys
d = json.load(open(sys.argv[1]))
t = d["total"]
assert t["roundtrip_ok"] is True and t["raw_bytes"] == 132624, t
assert t["ulpack_bytes"] < t["raw_bytes"] and t["ulpack_bytes"] < 1.02 * t["zstd19_bgxor_bytes"], t
PYEOF
"$ULPACK" bench "$TD/checkpoint-20/optimizer.pt" "$top_srcdir/tests/data/torch/make.py" > /dev/null 2>&1 \
	&& fail "bench accepted a file that is neither format" || ok "bench refuses other files"
# make bench's awk programs: an unparenthesized > after printf's arguments is a
# redirection (section R once wrote its MB/s to a file named 0 and printed none)
grep -nE 'printf "[^"]*", *[$][0-9]+ *> *[0-9]' "$top_srcdir/tools/bench.sh" \
	&& fail "bench.sh: printf ... > N redirects to a file" || ok "bench.sh's printf comparisons are parenthesized"
finish
