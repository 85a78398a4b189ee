#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_memory.sh - memory stays bounded by the decode cache and a few chunks:
#  - a checkpoint four times the cache reads back (cat) with peak RSS near the
#    cache size plus the I/O block and a few chunks, far below the file size;
#  - its import holds a few copies of its largest tensor at most;
#  - a 128 MiB opaque file (optimizer.pt-like) imports in segments, with peak
#    RSS a small fraction of its size.
. "$(dirname "$0")/lib.sh"

A="$T/arch"
"$ULPACK" init "$A" >/dev/null
"$ULPACK" synth "$T/run" --steps 2 --dim 1024 || fail synth
f="$T/run/checkpoint-200/model.safetensors"
size_kb=$(( $(stat -c %s "$f") / 1024 ))
largest_kb=$(( 4096 * 1024 * 2 / 1024 )) # lm_head: 4D x D bf16
ULP_REPORT_RSS=1 "$ULPACK" import "$A" "$T/run" --cache-size 4M --threads 2 2> "$T/imp" > /dev/null || fail "import"
ULP_REPORT_RSS=1 "$ULPACK" cat "$A" checkpoint-200/model.safetensors --cache-size 4M --threads 2 2> "$T/cat" | cmp -s - "$f" \
	|| fail "cat differs"
imp=$(sed -n 's/peak_rss_kb //p' "$T/imp"); cat_kb=$(sed -n 's/peak_rss_kb //p' "$T/cat")
limit=$((4 * 1024 + 40 * 1024)) # cache + 8 MiB I/O block + a few 2 MiB chunks + program
echo "file $size_kb KiB, largest tensor $largest_kb KiB; peak RSS: import $imp KiB, cat $cat_kb KiB"
[ "$cat_kb" -lt "$limit" ] && [ "$cat_kb" -lt "$size_kb" ] && ok "cat peak $cat_kb KiB < $limit KiB" || fail "cat peak $cat_kb KiB"
[ "$imp" -lt $((12 * largest_kb + 32 * 1024)) ] && ok "import peak within 12 largest tensors + 32 MiB (a few a thread)" || fail "import peak $imp KiB"

head -c 32M /dev/urandom > "$T/r32"
mkdir -p "$T/opt"
cat "$T/r32" "$T/r32" "$T/r32" "$T/r32" > "$T/opt/optimizer.pt"
ULP_REPORT_RSS=1 "$ULPACK" import "$A" "$T/opt" --prefix opt --cache-size 4M --threads 2 2> "$T/imp2" > /dev/null || fail "import opaque"
imp2=$(sed -n 's/peak_rss_kb //p' "$T/imp2")
echo "128 MiB opaque file: import peak RSS $imp2 KiB"
[ "$imp2" -lt $((48 * 1024)) ] && ok "opaque import streams in segments" || fail "opaque import peak $imp2 KiB"
"$ULPACK" cat "$A" opt/optimizer.pt | cmp -s - "$T/opt/optimizer.pt" && ok "opaque file reads back" || fail "opaque differs"
"$ULPACK" stat "$A" opt --json > "$T/st.json"
"$PY" -c 'import json,sys; t=json.load(open(sys.argv[1]))["total"]; assert t["stored_bytes"] < 34 << 20, t' "$T/st.json" \
	&& ok "repeated 4 MiB segments stored once" || fail "dedup of repeated segments"
finish
