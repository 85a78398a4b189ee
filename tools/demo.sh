#!/bin/sh
# SPDX-License-Identifier: MIT
# demo.sh - the README's first command: install what is missing, build, then the
# main job on built-in sample data: write a synthetic training run, mount an
# empty archive with ulpackfs, archive the run with rsync -a, unmount, remount,
# read every file back and check its sha256, print the ratio (the archive
# directory's disk use, du, against the raw bytes) and the speeds.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
sh "$top/tools/install-deps.sh"
cd "$top"
[ -x configure ] || autoreconf -fi > /dev/null
# a source tree configured in place (the README's ./configure && make install)
# builds there: automake refuses a separate build directory beside it
if [ -f config.status ]; then
	make -j"$(nproc)" -s ulpack ulpackfs
else
	mkdir -p build && cd build
	[ -f Makefile ] || ../configure -q
	make -j"$(nproc)" -s ulpack ulpackfs
fi
B=$(pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/ulpack-demo.XXXXXX")
M="$T/mnt"
trap 'fusermount3 -u -z "$M" 2>/dev/null || true; rm -rf "$T"' EXIT
now() { date +%s%N; }
mbps() { echo "$1 $2" | awk '{ printf "%.1f", $1 / ($2 / 1e9) / 1e6 }'; }

echo "== a synthetic bf16 training run: 8 checkpoints of 8.5M parameters (model.safetensors), each with config.json and trainer_state.json"
"$B/ulpack" synth "$T/run" --steps 8
for d in "$T"/run/checkpoint-*; do
	printf '{"architectures": ["DemoLM"], "hidden_size": 512}\n' > "$d/config.json"
	printf '{"global_step": %s}\n' "${d##*-}" > "$d/trainer_state.json"
done
raw=$(du -sb "$T/run" | cut -f1)
echo "== an empty archive, mounted with ulpackfs"
"$B/ulpack" init "$T/archive"
mkdir -p "$M"
"$B/ulpackfs" "$T/archive" "$M"
# the daemon serving $M, and waiting for it to exit after an unmount (it
# archives what is still queued once the kernel has let go of the mount)
fs_pid() { pgrep -n -f "ulpackfs $T/archive $M" || true; }
unmount_wait() {
	p=$(fs_pid)
	fusermount3 -u "$M"
	while [ -n "$p" ] && kill -0 "$p" 2>/dev/null; do sleep 0.05; done
}
echo "== rsync -a run/ MNT/run/, then ulpack sync (everything archived)"
t0=$(now)
rsync -a "$T/run/" "$M/run/"
"$B/ulpack" sync "$M" > /dev/null
t_in=$(( $(now) - t0 ))
unmount_wait
echo "== remount, read everything back, compare sha256"
"$B/ulpackfs" "$T/archive" "$M"
t0=$(now)
( cd "$M/run" && find . -type f -exec sha256sum {} + | sort -k2 ) > "$T/mount.sha"
t_out=$(( $(now) - t0 ))
( cd "$T/run" && find . -type f -exec sha256sum {} + | sort -k2 ) > "$T/orig.sha"
if cmp -s "$T/mount.sha" "$T/orig.sha"; then
	echo "all $(wc -l < "$T/orig.sha") files byte-identical"
else
	echo "MISMATCH"; diff "$T/orig.sha" "$T/mount.sha" | head; exit 1
fi
ls -l "$M/run/checkpoint-800/"
python3 -c 'import os,sys; p=sys.argv[1]; print({a: os.getxattr(p, a).decode() for a in os.listxattr(p)})' \
	"$M/run/checkpoint-800/model.safetensors" 2>/dev/null || true
unmount_wait
# what the user sees: the archive directory's disk use (du), index and all
disk=$(du -s --block-size=1 "$T/archive" | cut -f1)
echo
echo "raw $raw bytes -> archive on disk $disk bytes (du of the archive directory): ratio" \
	"$(echo "$disk $raw" | awk '{ printf "%.4f", $1 / $2 }')"
echo "rsync into the mount until archived (ulpack sync): $(mbps "$raw" "$t_in") MB/s;" \
	"read back through the mount: $(mbps "$raw" "$t_out") MB/s"
"$B/ulpack" stat "$T/archive" | sed -n '/^by dtype/,$p'
