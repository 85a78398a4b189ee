#!/bin/sh
# SPDX-License-Identifier: MIT
# bench.sh - `make bench`: every figure the project reports, in one run on this
# machine, as ratios against zstd, memcpy or a plain directory measured in the
# same run:
#   1. the codec (ulpack bench) on a synthetic pair and on the real tiny-lm pairs;
#   2. the mount (needs /dev/fuse and root or fuse permissions): rsync into the
#      mount vs into a plain directory, peak memory of ulpackfs, sequential
#      cold read of a delta-coded checkpoint whose reference is cached, the
#      same read warm (page cache), a plain file, and `ulpack cat`.
# Usage: bench.sh BUILD_DIR
set -eu
B=${1:-.}
ULPACK=$B/ulpack ULPACKFS=$B/ulpackfs
DATA=${ULP_DATA_DIR:-$(cd "$(dirname "$0")/.." && pwd)/../shared/data}
T=$(mktemp -d "${TMPDIR:-/tmp}/ulp-bench.XXXXXX")
M="$T/mnt"
trap 'fusermount3 -u -z "$M" 2>/dev/null || true; rm -rf "$T"' EXIT
now() { date +%s%N; }
mbps() { echo "$1 $2" | awk '{ printf "%.1f", $1 / ($2 / 1e9) / 1e6 }'; }

echo "== 1. codec: synthetic bf16 pair (ulpack synth, 8.4M parameters a step)"
"$ULPACK" synth "$T/syn" --steps 3
"$ULPACK" bench "$T/syn/checkpoint-200/model.safetensors" "$T/syn/checkpoint-300/model.safetensors"
if [ -d "$DATA/tiny-lm" ]; then
	for dt in bf16 fp16 fp32; do
		echo "== 1. codec: tiny-lm $dt, checkpoint-350 -> checkpoint-400"
		"$ULPACK" bench "$DATA/tiny-lm/$dt/checkpoint-350/model.safetensors" \
			"$DATA/tiny-lm/$dt/checkpoint-400/model.safetensors"
	done
fi

if [ ! -c /dev/fuse ] || ! command -v rsync > /dev/null; then
	echo "== 2. mount: skipped (no /dev/fuse or no rsync)"
	exit 0
fi
echo "== 2. mount: rsync of a synthetic run (8 checkpoints) into ulpackfs vs a plain directory"
"$ULPACK" synth "$T/run" --steps 8
raw=$(du -sb "$T/run" | cut -f1)
t0=$(now); rsync -a "$T/run/" "$T/plain/"; t_plain=$(( $(now) - t0 ))
"$ULPACK" init "$T/arch" > /dev/null
mkdir -p "$M"
"$ULPACKFS" "$T/arch" "$M"
pid=$(pgrep -n -f "ulpackfs $T/arch")
t0=$(now); rsync -a "$T/run/" "$M/run/"; t_mount=$(( $(now) - t0 ))
rss=$(sed -n 's/VmHWM: *//p' "/proc/$pid/status")
stored=$("$ULPACK" stat "$T/arch" --json | sed -n 's/.*"stored_bytes": \([0-9]*\), "ratio".*"max_chain_depth".*/\1/p' | tail -1)
echo "rsync -a into a plain directory: $(mbps "$raw" "$t_plain") MB/s"
echo "rsync -a into ulpackfs:          $(mbps "$raw" "$t_mount") MB/s  (raw $raw bytes, stored ${stored:-?})"
echo "peak memory of ulpackfs during the rsync: $rss"
fusermount3 -u "$M"
"$ULPACKFS" "$T/arch" "$M"
f=checkpoint-800/model.safetensors
size=$(stat -c %s "$T/run/$f")
cat "$M/run/checkpoint-700/model.safetensors" > /dev/null   # the reference, now in the decode cache
t0=$(now); cat "$M/run/$f" > /dev/null; t_cold=$(( $(now) - t0 ))
t0=$(now); cat "$M/run/$f" > /dev/null; t_warm=$(( $(now) - t0 ))
cat "$T/run/$f" > /dev/null
t0=$(now); cat "$T/run/$f" > /dev/null; t_file=$(( $(now) - t0 ))
fusermount3 -u "$M"
t0=$(now); "$ULPACK" cat "$T/arch" "run/$f" > /dev/null; t_cat=$(( $(now) - t0 ))
echo "read of $f ($size bytes, a delta against checkpoint-700):"
echo "  through the mount, cold (reference cached): $(mbps "$size" "$t_cold") MB/s"
echo "  through the mount, warm (page cache):       $(mbps "$size" "$t_warm") MB/s"
echo "  plain file (page cache):                    $(mbps "$size" "$t_file") MB/s"
echo "  ulpack cat (cold process, chain decoded):   $(mbps "$size" "$t_cat") MB/s"
exit 0
