#!/bin/sh
# SPDX-License-Identifier: MIT
# bench.sh - `make bench`: every figure the project reports, in one run on this
# machine, as ratios against zstd, memcpy or a plain directory measured in the
# same run:
#   1. the codec (ulpack bench) on a synthetic pair and on the real tiny-lm pairs;
#   2. the mount (needs /dev/fuse and root or fuse permissions): rsync into the
#      mount vs into a plain directory, peak memory of ulpackfs, sequential
#      cold read of a delta-coded checkpoint whose reference is cached, the
#      same read warm (page cache), a plain file, and `ulpack cat`;
#   C. cold reads (issues 17, 29): the oldest, middle and newest checkpoint of
#      a 16-step and of 8-step runs, each read once (dd, 1 MiB blocks) through a
#      freshly started mount with the page cache dropped (when this user may),
#      next to squashfuse on a zstd -19 squashfs image and borg mount (zstd,3)
#      of the same run when those are installed, and a plain directory; the
#      stored bytes of each; rsync of the 16-step run out of a fresh mount.
#      ULP_BENCH_ONLY=C runs it alone;
#   O. cold opens (the first after a mount, 16 in all) and cold reads of
#      the oldest and newest step of a 16-step run of 6.6 MB files against
#      squashfuse (issue 38). ULP_BENCH_ONLY=O runs it alone;
#   E. `ulpack export` of one step at chain depth 7 against cp -r of it;
#   3. a trainer-like save (model.safetensors in a few large writes, an
#      optimizer.pt-like zip in 64-byte-aligned records) into the mount vs a
#      plain directory, until close() returned; and the write path alone;
#   R. re-basing (issue 15): `ulpack forget --keep-every` on a 12-step synthetic
#      run and on tiny-lm, pack bytes before and after against an import of the
#      kept steps alone, and re-basing MB/s against the import's MB/s;
#   P. the Python package (issue 27; when python3 imports it with numpy):
#      archive.open in 1 MiB reads vs `ulpack cat`, one tensor of about 1 %
#      of a checkpoint (decode counters, time), archive.load vs a numpy
#      reader of a warm read-only mount. ULP_BENCH_ONLY=P runs it alone;
#   S. an archive in an S3 bucket (issue 26): archiving through a mount and the
#      newest step cold (empty and warm pack cache) against a local archive,
#      on a radosgw the section starts. ULP_BENCH_ONLY=S runs it alone;
#   D. torch.distributed.checkpoint: 8 ranks of a real training loop saving 4
#      steps into the mount vs a plain directory, stored bytes against the same
#      tensors as safetensors. ULP_BENCH_ONLY=D runs it alone;
#   G. a shared archive's index generation published after a 150 MB step of
#      300 tensors into an index of 1,000 such steps, against that step's
#      import (issue 25). ULP_BENCH_ONLY=G runs it alone;
#   Y. `ulpack dynamics` (issue 39): the index-only view of an index of 1,000
#      steps x 300 tensors (written with python3's sqlite3: the view reads the
#      index alone), time and peak memory (targets 1 s, 100 MB); --norms of a
#      12-step --dim 256 run against `ulpack verify` and `ulpack export` of it
#      (the decoding of the run; medians of 3). ULP_BENCH_ONLY=Y runs it alone.
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

# one JSON report per pair, then one table; the "total" group of each report
# is that pair (one dtype a pair)
get() { # FILE KEY: the first value of "KEY" in the report's total
	sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1" | head -1
}
# ---- P. the Python package (python/ulpack over libulpack.so)
bench_python() {
	PYP=$(command -v /usr/bin/python3 || command -v python3 || true)
	SRC=$(cd "$(dirname "$0")/.." && pwd)
	export ULPACK_LIB="$B/libulpack.so.0" PYTHONPATH="$SRC/python"
	[ -n "$PYP" ] && "$PYP" -c 'import ulpack, numpy' 2> /dev/null || { echo "== P. skipped: python3 does not import ulpack and numpy"; return 0; }
	echo "== P. Python (ulpack package, ctypes): a delta-coded 3-step synthetic run, --dim 1024"
	"$ULPACK" synth "$T/pyrun" --steps 3 --dim 1024 > /dev/null && "$ULPACK" init "$T/pyarch" > /dev/null
	"$ULPACK" import "$T/pyarch" "$T/pyrun" --prefix run > /dev/null
	mnt=""
	mkdir -p "$M"
	if [ -c /dev/fuse ] && "$ULPACKFS" "$T/pyarch" "$M" -o ro 2> /dev/null; then mnt=$M; fi
	"$PYP" - "$ULPACK" "$T/pyarch" "run/checkpoint-200/model.safetensors" "$mnt" <<'PYEOF' || echo "section P failed"
import json, struct, subprocess, sys, time
import numpy as np
import ulpack
cli, arch, path, mnt = sys.argv[1:5]
med = lambda v: sorted(v)[len(v) // 2]
def timed(fn, n=3):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return med(ts)
def read_1m():
    with ulpack.open_archive(arch) as a, a.open(path, buffering=0) as f:
        buf = bytearray(1 << 20)
        while f.readinto(buf):
            pass
def cat():
    subprocess.run([cli, "cat", arch, path], stdout=subprocess.DEVNULL, check=True)
size = ulpack.open_archive(arch).stat(path).size
tp, tc = timed(read_1m), timed(cat)
print("archive.open, 1 MiB reads (cold decode cache): %.1f MB/s; ulpack cat > /dev/null: %.1f MB/s = %.2f x (target >= 0.9)"
      % (size / tp / 1e6, size / tc / 1e6, tc / tp))
with ulpack.open_archive(arch) as a:
    a.read_bytes(path)
    whole = a.counters()["chunks_decoded"]
    names = a.tensor_names(path)
with ulpack.open_archive(arch) as a, a.open(path, buffering=0) as f:
    n = struct.unpack("<Q", f.pread(8, 0))[0]
    hdr = json.loads(f.pread(n, 8)); hdr.pop("__metadata__", None)
nb = lambda k: hdr[k]["data_offsets"][1] - hdr[k]["data_offsets"][0]
name = min((k for k in names if nb(k) >= size / 100), key=nb)  # the smallest of at least 1 %
def one():
    with ulpack.open_archive(arch) as a:
        a.tensor(path, name)
        return a.counters()["chunks_decoded"]
dec = one()
# its own chunks: its share of the whole file's decodes, whole chunks
share = max(1, -(-whole * nb(name) // size))
tt = timed(one)
print("one tensor (%s, %.2f %% of the file): %d chunks decoded, its share of the whole file's %d is %d = %.2f x (target <= 2);"
      " %.4f s vs the whole file %.3f s = %.0f x faster (target >= 20)" % (name, 100 * nb(name) / size, dec, whole, share,
      dec / share if share else 0, tt, tp, tp / tt))
a = ulpack.open_archive(arch)
tcold = timed(lambda: ulpack.open_archive(arch).load(path), 1)
a.load(path)
twarm = timed(lambda: a.load(path))
line = "archive.load: %.3f s cold, %.3f s warm (its decode cache)" % (tcold, twarm)
if mnt:
    def numpy_reader():
        with open(mnt + "/" + path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            h = json.loads(f.read(n)); h.pop("__metadata__", None)
            data = f.read()
        return {k: np.frombuffer(data, dtype=np.uint16, count=(v["data_offsets"][1] - v["data_offsets"][0]) // 2,
                                 offset=v["data_offsets"][0]) for k, v in h.items()}
    numpy_reader()
    tm = timed(numpy_reader)
    line += "; numpy reader of a warm mount %.3f s = %.2f x warm, %.2f x cold (target >= 0.8)" % (tm, tm / twarm, tm / tcold)
print(line)
PYEOF
	[ -n "$mnt" ] && fusermount3 -u "$M"
	return 0
}
[ "${ULP_BENCH_ONLY:-}" = P ] && { bench_python; exit 0; }

# ---- Y. training dynamics from the index (issue 39)
bench_dynamics() {
	PYD=$(command -v /usr/bin/python3 || command -v python3 || true)
	[ -n "$PYD" ] || { echo "== Y. skipped: no python3"; return 0; }
	echo "== Y. ulpack dynamics: the index-only view of 1,000 steps x 300 tensors; --norms against verify and export"
	"$ULPACK" init "$T/dyn" > /dev/null
	"$PYD" - "$T/dyn/ulpack.db" <<'PYEOF'
import hashlib, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA synchronous=OFF")
db.execute("INSERT INTO packs(id, name, size) VALUES(1, 'none.pack', 0)")
db.execute("INSERT INTO entries(path, parent, name, type, mode, mtime_ns) VALUES('big', '', 'big', 1, 493, 0)")
bid, prev = 0, {}
for s in range(1, 1001):
    d = "big/checkpoint-%d" % (s * 10)
    db.execute("INSERT INTO entries(path, parent, name, type, mode, mtime_ns) VALUES(?, 'big', ?, 1, 493, 0)", (d, d[4:]))
    fid = db.execute("INSERT INTO entries(path, parent, name, type, size, mode, mtime_ns, kind, run, series, step)"
                     " VALUES(?, ?, 'model.safetensors', 0, 0, 420, 0, 1, 'big', 'big/checkpoint-{S}/model.safetensors', ?)",
                     (d + "/model.safetensors", d, s * 10)).lastrowid
    blobs, rows = [], []
    for t in range(300):
        bid += 1
        c = hashlib.sha256(b"%d" % bid).digest()
        ref = prev.get(t) if s % 17 else None
        blobs.append((bid, c, 4 if ref else 5, ref, 1 if ref else 0, 20000 + t))
        prev[t] = c
        rows.append((fid, t * 65536, 65536, bid, "model.layers.%d.w%d.weight" % (t // 10, t % 10), 11))
    db.executemany("INSERT INTO blobs(id, content, codec, ref, depth, raw_size, stored_size, pack, offset)"
                   " VALUES(?, ?, ?, ?, ?, 65536, ?, 1, 0)", blobs)
    db.executemany("INSERT INTO extents(file, offset, length, blob, name, dtype) VALUES(?, ?, ?, ?, ?, ?)", rows)
db.execute("DELETE FROM rebase_queue")
db.commit()
PYEOF
	"$ULPACK" synth "$T/dynsrc/r" --steps 12 --dim 256 > /dev/null
	"$ULPACK" init "$T/dynar" > /dev/null && "$ULPACK" import "$T/dynar" "$T/dynsrc" > /dev/null
	"$PYD" - "$ULPACK" "$T/dyn" "$T/dynar" <<'PYEOF'
import resource, subprocess, sys, time
u, big, ar = sys.argv[1:4]
def run(*args):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([u, *args], stdout=subprocess.DEVNULL, check=True)
    t = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, r1.ru_maxrss / 1024
def med(args, k=3):
    v = sorted(run(*args) for _ in range(k))
    return v[k // 2]
t, cpu, rss = med(["dynamics", big, "big"])
print("index-only view, 1000 steps x 300 tensors: %.3f s (%.3f s CPU), peak %.0f MB (targets 1 s, 100 MB)" % (t, cpu, rss))
t, cpu, _ = med(["dynamics", big, "big", "--json"])
print("  with --json (every figure): %.3f s" % t)
import shutil
def export():
    shutil.rmtree(ar + ".out", ignore_errors=True)
    r = run("export", ar, "r", ar + ".out")
    return r
tn, cn, _ = med(["dynamics", ar, "r", "--norms"])
tv, cv, _ = med(["verify", ar, "r"])
te, ce = sorted(export() for _ in range(3))[1][:2]
print("--norms of a 12-step --dim 256 run: %.3f s (%.3f s CPU); verify (decodes it, sha256): %.3f s (%.3f s CPU)"
      " = %.2f x its speed; export (decodes it, writes it): %.3f s (%.3f s CPU) = %.2f x its speed (target >= 0.8)"
      % (tn, cn, tv, cv, tv / tn, te, ce, te / tn))
print("  in CPU time: %.2f x verify's, %.2f x export's (a loaded machine's wall times favour the one that waits least)"
      % (cv / cn, ce / cn))
PYEOF
}
[ "${ULP_BENCH_ONLY:-}" = Y ] && { bench_dynamics; exit 0; }
# ---- D. torch.distributed.checkpoint (issue 36): 8 ranks (one process each,
# gloo on CPU) train a small transformer for real (fp32, AdamW) and save 4
# steps with dcp.save into the mount and into a plain directory (and the same
# tensors as safetensors); the time dcp.save took into each, until `ulpack
# sync`; byte-identical rank files; dcp.load into 4 ranks from a read-only
# mount; stored bytes against the same tensors as safetensors (both
# imported, and the mount's own). Needs the venv of tools/install-pydeps.sh
# ($ULP_TORCH_PYTHON). ULP_BENCH_ONLY=D runs it alone.
bench_dcp() {
	TPY=${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python}
	"$TPY" -c 'import torch, safetensors' 2> /dev/null || { echo "== D. skipped: no torch at $TPY (sh tools/install-pydeps.sh)"; return 0; }
	[ -c /dev/fuse ] || { echo "== D. skipped: no /dev/fuse"; return 0; }
	RUNPY="$(cd "$(dirname "$0")/.." && pwd)/tests/integration/dcp_run.py"
	port=$((20000 + $$ % 20000))
	echo "== D. torch.distributed.checkpoint: 8 ranks (gloo, CPU), a small transformer trained for real (fp32, AdamW), 4 steps"
	"$ULPACK" init "$T/dcparch" > /dev/null && mkdir -p "$M" && "$ULPACKFS" "$T/dcparch" "$M" || { echo "section D failed: mount"; return 0; }
	mkdir -p "$M/run"
	ULP_DCP_MODEL=transformer "$TPY" "$RUNPY" save 8 "$port" 0 4 "$M/run" "$T/dcpplain/run" "$T/dcpsafe/run" > "$T/dcp.log" 2>&1 \
		|| { echo "section D failed: $(tail -5 "$T/dcp.log")"; fusermount3 -u "$M"; return 0; }
	t0=$(now)
	"$ULPACK" sync "$M" > /dev/null
	ts=$(( ($(now) - t0) / 1000000 ))
	sed -n 's/^dcp.save: \([0-9.]*\) s into OUT, \([0-9.]*\) s into PLAIN/\1 \2/p' "$T/dcp.log" | awk -v ts="$ts" '{
		printf "dcp.save of 4 steps: %.2f s into ulpackfs, %.2f s into a plain directory = %.2f x (target <= 1.3); archived %.2f s after (ulpack sync)\n", $1, $2, $1 / $2, ts / 1000 }'
	bad=0 n=0
	for f in $(cd "$T/dcpplain/run" && find . -name '*.distcp'); do
		n=$((n + 1))
		cmp -s "$T/dcpplain/run/$f" "$M/run/$f" || bad=$((bad + 1))
	done
	echo "rank files byte-identical: $((n - bad)) of $n"
	fusermount3 -u "$M"
	pid=$(pgrep -n -f "ulpackfs $T/dcparch" || true)
	while [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null; do sleep 0.05; done
	"$ULPACKFS" "$T/dcparch" "$M" -o ro || { echo "section D failed: mount -o ro"; return 0; }
	ULP_DCP_MODEL=transformer "$TPY" "$RUNPY" load 4 "$((port + 1))" "$M/run/step-4" "$T/dcpplain/run/step-4" > "$T/dcpl.log" 2>&1 \
		&& echo "dcp.load of step 4 into 4 ranks (resharded) from a read-only mount: equal tensors" \
		|| echo "dcp.load from the read-only mount FAILED: $(tail -3 "$T/dcpl.log")"
	fusermount3 -u "$M"
	"$ULPACK" init "$T/dcpi" > /dev/null && "$ULPACK" import "$T/dcpi" "$T/dcpplain" > /dev/null
	"$ULPACK" init "$T/dcps" > /dev/null && "$ULPACK" import "$T/dcps" "$T/dcpsafe" > /dev/null
	for a in dcparch dcpi dcps; do "$ULPACK" stat "$T/$a" --json > "$T/$a.json"; done
	python3 - "$T/dcparch.json" "$T/dcpi.json" "$T/dcps.json" <<'PYEOF'
import json, sys
m, i, s = (json.load(open(p)) for p in sys.argv[1:4])
def tot(j):
    fs = [f for f in j["files"] if f["path"].endswith((".distcp", ".safetensors", ".metadata"))]
    return sum(f["raw_bytes"] for f in fs), sum(f["stored_bytes"] for f in fs)
(rm, sm), (ri, si), (rs, ss) = tot(m), tot(i), tot(s)
print("stored/raw: DCP through the mount %.4f, DCP imported %.4f, the same tensors as safetensors imported %.4f"
      % (sm / rm, si / ri, ss / rs))
print("  DCP stored = %.4f x safetensors (mount), %.4f x (imported) (target <= 1.02)" % (sm / ss, si / ss))
PYEOF
	return 0
}
[ "${ULP_BENCH_ONLY:-}" = D ] && { bench_dcp; exit 0; }

# ---- G. publishing a shared archive's index generation (issue 25) on a big
# index: ULP_BENCH_PUB_STEPS (1000) steps of a model of 300 small tensors
# (the index's rows are what a publication copies, not the bytes), then two
# steps of the same 300 tensors at 512 KiB each (150 MB): the publications
# their import made (ULP_DEBUG_PUBLISH), against the import's time
bench_publish() {
	PYP=$(command -v python3 || true)
	[ -n "$PYP" ] || { echo "(G skipped: no python3)"; return 0; }
	n=${ULP_BENCH_PUB_STEPS:-1000}
	echo "== G. publishing a generation of a shared archive's index ($n steps x 300 tensors, then 150 MB steps)"
	"$PYP" - "$T/pub" "$n" <<'PYEOF'
import json, os, struct, sys, random
out, steps = sys.argv[1], int(sys.argv[2])
def write(d, tensors):
    os.makedirs(d, exist_ok=True)
    hdr, off = {}, 0
    for name, b in tensors:
        hdr[name] = {"dtype": "BF16", "shape": [len(b) // 2], "data_offsets": [off, off + len(b)]}
        off += len(b)
    h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h))); f.write(h)
        for _, b in tensors: f.write(b)
rnd = random.Random(7)
names = ["model.layers.%d.w%d" % (i // 10, i % 10) for i in range(300)]
small = [bytes(rnd.getrandbits(8) for _ in range(512)) for _ in names]
for s in range(1, steps + 1):
    t = []
    for i, n in enumerate(names):
        b = bytearray(small[i])
        for k in range(0, 512, 97): b[k] = (b[k] + s) & 0xff
        t.append((n, bytes(b)))
    write(os.path.join(out, "small", "checkpoint-%d" % (s * 10)), t)
big = [os.urandom(1 << 19) for _ in names]
for k, s in enumerate((steps * 10 + 10, steps * 10 + 20)):
    t = []
    for i, n in enumerate(names):
        b = bytearray(big[i])
        for j in range(k, len(b), 64): b[j] ^= 1
        t.append((n, bytes(b)))
    write(os.path.join(out, "big%d" % k, "checkpoint-%d" % s), t)
PYEOF
	A=$T/pub/A
	"$ULPACK" init --shared "$A" > /dev/null
	"$ULPACK" import "$A" "$T/pub/small" --prefix run > /dev/null
	idx=$(stat -c %s "$A/ulpack.db")
	for k in 0 1; do
		t0=$(now)
		ULP_DEBUG_PUBLISH=1 "$ULPACK" import "$A" "$T/pub/big$k" --prefix run > /dev/null 2> "$T/pub/pub$k.log"
		t1=$(now)
		imp=$(( (t1 - t0) / 1000000 ))
		pubs=$(sed -n 's/.*generation [0-9]*: \([a-z]*\), \([0-9]*\) bytes.*, \([0-9]*\) ms.*/\1 \2 B \3 ms/p' \
			"$T/pub/pub$k.log" | paste -sd';' -)
		ms=$(sed -n 's/.*, \([0-9]*\) ms (.*/\1/p' "$T/pub/pub$k.log" | awk '{ s += $1 } END { print s + 0 }')
		echo "step $((k + 1)) (150 MB, 300 tensors) into an index of $((idx >> 20)) MiB: imported in $imp ms;" \
			"its publications: $pubs; $(echo "$ms $imp" | awk '{ printf "%.1f", 100 * $1 / $2 }') % of the import" \
			"(target <= 10 %)"
	done
}
[ "${ULP_BENCH_ONLY:-}" = G ] && { bench_publish; exit 0; }
# ---- C. cold reads (run after section 2; ULP_BENCH_ONLY=C alone)
bench_cold() {
echo "== C. cold reads: one file through a freshly started mount, page cache dropped, dd 1 MiB blocks"
mkdir -p "$M"
drop() { sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true; }
can_drop=no; [ -w /proc/sys/vm/drop_caches ] && can_drop=yes
# ULP_BENCH_RT=1 (root): each file system and dd run SCHED_FIFO, so that on a
# machine other jobs keep busy the figures are those of the cores, not of
# the share the scheduler gives (a measuring knob; figures say when it was on)
RT=
[ -n "${ULP_BENCH_RT:-}" ] && [ "$(id -u)" = 0 ] && command -v chrt > /dev/null && RT="chrt -f 10"
rt_dd_ns() { LC_ALL=C $RT dd if="$1" of=/dev/null bs=1M 2>&1 | sed -n 's/.* copied, \([0-9.e-]*\) s,.*/\1/p' |
	awk '{ printf "%.0f", $1 * 1e9 }'; }
cold_dd() { # MOUNT_CMD UMOUNT_CMD FILE: MB/s of a cold read, median of 3
	for i in 1 2 3; do
		drop
		eval "$RT $1" > /dev/null 2>&1 || { echo "-"; return; }
		t=$(rt_dd_ns "$3")
		eval "$2" > /dev/null 2>&1
		echo "$t"
	done | sort -n | sed -n 2p | { read -r t; [ -n "$t" ] && mbps "$(stat -c %s "$4")" "$t" || echo "-"; }
}
have_sq=no; command -v mksquashfs > /dev/null && command -v squashfuse > /dev/null && have_sq=yes
have_borg=no; command -v borg > /dev/null && have_borg=yes
[ -d "$T/run" ] || "$ULPACK" synth "$T/run" --steps 8 > /dev/null
"$ULPACK" synth "$T/c16" --steps 16 > /dev/null
# each run: its oldest, middle and newest step (issue 29: every step of a
# 16-step run, and the 8-step ones; the newest an anchor, the others at
# most ceil(max_chain / 2) deltas deep: the 16-step run's middle is step 900,
# 7 deep, not step 800, its key, 1 deep)
set -- "synthetic-16 $T/c16 100 900 1600" "synthetic-8 $T/run 100 400 800"
[ -d "$DATA/tiny-lm/bf16" ] && set -- "$@" "tiny-lm-bf16 $DATA/tiny-lm/bf16 50 200 400"
printf '%-24s %9s | %9s %9s %9s %9s | %6s %6s\n' case bytes ulpackfs squashfuse borg plain "x sq" "x borg"
sizes=""
for c in "$@"; do
	set -- $c
	name=$1 src=$2
	shift 2
	A="$T/c-$name"; rm -rf "$A" "$T/sq-$name.img" "$T/borg-$name"
	"$ULPACK" init "$A" > /dev/null && "$ULPACK" import "$A" "$src" > /dev/null
	[ "$have_sq" = yes ] && mksquashfs "$src" "$T/sq-$name.img" -comp zstd -Xcompression-level 19 -noappend -quiet > /dev/null 2>&1
	if [ "$have_borg" = yes ]; then
		export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
		borg init --encryption=none "$T/borg-$name" > /dev/null 2>&1 &&
			(cd "$src" && borg create --compression zstd,3 "$T/borg-$name::a" . > /dev/null 2>&1)
	fi
	dmax=$("$ULPACK" stat "$A" --json | sed -n 's/.*"max_chain_depth": \([0-9]*\).*/\1/p' | tail -1)
	sizes="$sizes
  $name: raw $(du -sb "$src" | cut -f1), ulpack $(du -sb "$A" | cut -f1) (deepest step ${dmax:-?} deltas)$([ -f "$T/sq-$name.img" ] && echo ", squashfs $(stat -c %s "$T/sq-$name.img")")$([ -d "$T/borg-$name" ] && echo ", borg $(du -sb "$T/borg-$name" | cut -f1)")"
	i=0
	for s in "$@"; do
		i=$((i + 1))
		pos=$(echo "oldest middle newest" | cut -d' ' -f$i)
		f=checkpoint-$s/model.safetensors
		u=$(cold_dd "'$ULPACKFS' '$A' '$M'" "fusermount3 -u '$M'" "$M/$f" "$src/$f")
		sq=- bo=-
		[ -f "$T/sq-$name.img" ] &&
			sq=$(cold_dd "squashfuse '$T/sq-$name.img' '$M'" "fusermount3 -u '$M' || fusermount -u '$M'" "$M/$f" "$src/$f")
		[ -d "$T/borg-$name" ] &&
			bo=$(cold_dd "borg mount '$T/borg-$name::a' '$M' && sleep 0.3" "borg umount '$M'" "$M/$f" "$src/$f")
		drop
		pl=$(rt_dd_ns "$src/$f"); pl=$(mbps "$(stat -c %s "$src/$f")" "$pl")
		printf '%-24s %9s | %9s %9s %9s %9s | %6s %6s\n' "$name-$pos" "$(stat -c %s "$src/$f")" "$u" "$sq" "$bo" "$pl" \
			"$(echo "$u $sq" | awk '$2 != "-" && $1 != "-" { printf "%.2f", $1 / $2 }')" \
			"$(echo "$u $bo" | awk '$2 != "-" && $1 != "-" { printf "%.2f", $1 / $2 }')"
	done
done
echo "(MB/s, medians of 3; page cache dropped: $can_drop; SCHED_FIFO: $([ -n "$RT" ] && echo yes || echo no); squashfuse: zstd -19, borg: zstd,3;" \
	"targets: every step >= 0.5 x squashfuse, the newest >= 0.9 x)"
echo "stored bytes (du -sb):$sizes"
# the cold open of a small checkpoint file (tiny-lm's, 0.96 MB): os.open of
# it, path lookups included, in a fresh mount, page cache dropped
cold_open() { # MOUNT_CMD UMOUNT_CMD FILE: ms, median of 3
	for i in 1 2 3; do
		drop
		eval "$RT $1" > /dev/null 2>&1 || { echo "-"; return; }
		$RT python3 -c 'import os, sys, time
t = time.perf_counter(); fd = os.open(sys.argv[1], os.O_RDONLY); t = time.perf_counter() - t; os.close(fd)
print("%.0f" % (t * 1e6))' "$3"
		eval "$2" > /dev/null 2>&1
	done | sort -n | sed -n 2p | awk '{ printf "%.2f", $1 / 1000 }'
}
if [ -d "$T/c-tiny-lm-bf16" ] && command -v python3 > /dev/null; then
	f=checkpoint-50/model.safetensors
	u=$(cold_open "'$ULPACKFS' '$T/c-tiny-lm-bf16' '$M'" "fusermount3 -u '$M'" "$M/$f") sq=-
	[ -f "$T/sq-tiny-lm-bf16.img" ] &&
		sq=$(cold_open "squashfuse '$T/sq-tiny-lm-bf16.img' '$M'" "fusermount3 -u '$M' || fusermount -u '$M'" "$M/$f")
	echo "cold open of tiny-lm's oldest model.safetensors (os.open, fresh mount, page cache dropped): ulpackfs $u ms," \
		"squashfuse $sq ms ($(echo "$u $sq" | awk '$2 != "-" && $2 > 0 { printf "%.1f", $1 / $2 }') x; target <= 2 x)"
fi
# every step in order: rsync -a of the 16-step run out of a fresh mount, cold
A="$T/c-synthetic-16" raw16=$(du -sb "$T/c16" | cut -f1)
cold_rsync() { # MOUNT_CMD UMOUNT_CMD: MB/s, median of 3
	for i in 1 2 3; do
		rm -rf "$T/c-out"; drop
		eval "$1" > /dev/null 2>&1 || { echo "-"; return; }
		t0=$(now); rsync -a "$M/" "$T/c-out/"; t=$(( $(now) - t0 ))
		eval "$2" > /dev/null 2>&1
		echo "$t"
	done | sort -n | sed -n 2p | { read -r t; [ -n "$t" ] && mbps "$raw16" "$t" || echo "-"; }
}
u=$(cold_rsync "'$ULPACKFS' '$A' '$M'" "fusermount3 -u '$M'") sq=-
[ -f "$T/sq-synthetic-16.img" ] &&
	sq=$(cold_rsync "squashfuse '$T/sq-synthetic-16.img' '$M'" "fusermount3 -u '$M' || fusermount -u '$M'")
echo "rsync -a of the 16-step run out of a fresh mount, page cache dropped: ulpackfs $u MB/s, squashfuse $sq MB/s" \
	"($(echo "$u $sq" | awk '$2 != "-" && $1 != "-" { printf "%.2f", $1 / $2 }') x)"
}
if [ "${ULP_BENCH_ONLY:-}" = C ]; then
	if [ ! -c /dev/fuse ] || ! command -v rsync > /dev/null; then
		echo "== C. skipped (no /dev/fuse or no rsync)"
	else
		bench_cold
	fi
	exit 0
fi

# ---- O. cold opens and cold reads of a 16-step run of 6.6 MB files (issue 38;
# ULP_BENCH_ONLY=O alone): synth --dim 320, the bundled trajectory's size. Each
# round mounts afresh with the page cache dropped; the mount is waited for
# (its root answers) before the clock starts. Opens: os.open of the oldest
# step's model.safetensors (its lookups included), then of all 16 in step
# order, each file once; reads: the oldest and the newest step, open to the
# last byte in 1 MiB reads (the open counted: dd's clock starts after it).
# Medians of ULP_BENCH_ROUNDS (5) rounds, ulpackfs and squashfuse alternating.
bench_open() {
echo "== O. cold opens and reads of a 16-step run of 6.6 MB checkpoint files, fresh mount, page cache dropped"
command -v python3 > /dev/null || { echo "(skipped: no python3)"; return 0; }
mkdir -p "$M"
RT=
[ -n "${ULP_BENCH_RT:-}" ] && [ "$(id -u)" = 0 ] && command -v chrt > /dev/null && RT="chrt -f 10"
"$ULPACK" synth "$T/o16" --steps 16 --dim 320 > /dev/null
rm -rf "$T/o-ar" && "$ULPACK" init "$T/o-ar" > /dev/null && "$ULPACK" import "$T/o-ar" "$T/o16" > /dev/null
have=no
command -v mksquashfs > /dev/null && command -v squashfuse > /dev/null &&
	mksquashfs "$T/o16" "$T/o16.img" -comp zstd -Xcompression-level 19 -noappend -quiet > /dev/null 2>&1 && have=yes
o_round() { # MOUNT_CMD: "first_ms all16_ms oldest_MBps newest_MBps"
	out=""
	for what in open read-1 read-16; do
		sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true
		eval "$RT $1" > /dev/null 2>&1 || { echo "- - - -"; return; }
		for i in $(seq 200); do mountpoint -q "$M" && stat "$M" > /dev/null 2>&1 && break; sleep 0.01; done
		case $what in
		open) out="$out $($RT python3 -c 'import os, sys, time
d = sys.argv[1]; ts = []
for s in range(100, 1700, 100):
    p = "%s/checkpoint-%d/model.safetensors" % (d, s)
    t = time.perf_counter(); fd = os.open(p, os.O_RDONLY); ts.append(time.perf_counter() - t); os.close(fd)
print("%.3f %.3f" % (ts[0] * 1e3, sum(ts) * 1e3))' "$M")" ;;
		read-*) s=100; [ "$what" = read-16 ] && s=1600
			# the open counted too (dd's clock starts after it: a read
			# whose open waits for the disk looked faster than it is)
			out="$out $($RT python3 -c 'import os, sys, time
t = time.perf_counter(); fd = os.open(sys.argv[1], os.O_RDONLY); n = 0
while True:
    b = os.read(fd, 1 << 20)
    if not b: break
    n += len(b)
os.close(fd); t = time.perf_counter() - t
print("%.1f" % (n / t / 1e6))' "$M/checkpoint-$s/model.safetensors")" ;;
		esac
		fusermount3 -u "$M" 2> /dev/null || fusermount -u "$M"
	done
	echo "$out"
}
n=${ULP_BENCH_ROUNDS:-5}
: > "$T/o-u"; : > "$T/o-s"
for r in $(seq "$n"); do
	o_round "'$ULPACKFS' '$T/o-ar' '$M' -o ro" >> "$T/o-u"
	[ "$have" = yes ] && o_round "squashfuse '$T/o16.img' '$M'" >> "$T/o-s"
done
med() { # FILE COLUMN
	awk -v c="$2" '{ print $c }' "$1" | sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "-" }'
}
printf '%-44s %10s %10s %7s %s\n' measure ulpackfs squashfuse ratio target
for c in "1 first cold open after a mount (ms) <=3" "2 16 files opened cold, total (ms) <=2" \
         "3 oldest step cold read (MB/s) >=0.4" "4 newest step cold read (MB/s) >=1.0"; do
	set -- $c
	col=$1; shift
	eval "tgt=\${$#}"
	name=$(echo "$*" | sed 's/ [^ ]*$//')
	u=$(med "$T/o-u" "$col") q=-
	[ "$have" = yes ] && q=$(med "$T/o-s" "$col")
	printf '%-44s %10s %10s %7s %s\n' "$name" "$u" "$q" "$(echo "$u $q" | awk '$2 != "-" && $2 > 0 { printf "%.2f", $1 / $2 }')" "$tgt x"
done
echo "(medians of $n rounds; SCHED_FIFO: $([ -n "$RT" ] && echo yes || echo no); squashfuse: zstd -19;" \
	"ratio: ulpackfs / squashfuse; stored: ulpack $(du -sb "$T/o-ar" | cut -f1), squashfs $([ -f "$T/o16.img" ] && stat -c %s "$T/o16.img" || echo -))"
}
if [ "${ULP_BENCH_ONLY:-}" = O ]; then
	if [ ! -c /dev/fuse ]; then echo "== O. skipped (no /dev/fuse)"; else bench_open; fi
	exit 0
fi

# ---- S. an archive in an S3 bucket (issue 26): a Ceph radosgw started in
# network namespaces by tests/cluster/s3_archive.sh (root, ceph and radosgw
# installed), 3 rounds: archiving a 258 MB run through a mount of the bucket
# against a local archive until `ulpack sync`, the newest step read cold
# through a read-only mount with an empty and a warm pack cache against a
# local archive (medians of the ratios). ULP_BENCH_ONLY=S runs it alone.
bench_s3() {
	echo "== S. an archive in an S3 bucket (Ceph radosgw, memstore, in network namespaces)"
	if [ "$(id -u)" != 0 ] || ! command -v radosgw > /dev/null; then
		echo "(skipped: needs root and radosgw: sh tools/install-deps.sh --test)"
		return 0
	fi
	ULPACK=$ULPACK ULPACKFS=$ULPACKFS top_builddir=$B S3_FIGURES_ONLY=1 S3_BENCH_ROUNDS=${ULP_BENCH_S3_ROUNDS:-3} \
		sh "$(dirname "$0")/../tests/cluster/s3_archive.sh" 2>&1 | grep -e '^# round' -e '^# figure' -e '^FAIL' || true
}
[ "${ULP_BENCH_ONLY:-}" = S ] && { bench_s3; exit 0; }

echo "== 1. codec (ulpack bench: medians of repeated runs, $(nproc) threads for the -mt columns)"
"$ULPACK" synth "$T/syn" --steps 3 > /dev/null
"$ULPACK" bench "$T/syn/checkpoint-200/model.safetensors" "$T/syn/checkpoint-300/model.safetensors" \
	--json > "$T/b.synth-bf16.json"
pairs="synth-bf16"
if [ -d "$DATA/tiny-lm" ]; then
	for dt in bf16 fp16 fp32; do
		"$ULPACK" bench "$DATA/tiny-lm/$dt/checkpoint-350/model.safetensors" \
			"$DATA/tiny-lm/$dt/checkpoint-400/model.safetensors" --json > "$T/b.tiny-$dt.json"
		pairs="$pairs tiny-$dt"
	done
fi
printf '%-11s %6s | %-31s | %-31s | %-31s | %7s | %s\n' "" "" "ULPack MB/s" "zstd -3 on byte-grouped XOR" \
	"zstd -19 on byte-grouped XOR" "" "kernels: $(sed -n 's/.*"cpu": "\([a-z0-9]*\)".*/\1/p' "$T/b.synth-bf16.json")"
printf '%-11s %6s | %7s %7s %7s %7s | %7s %7s %7s %7s | %7s %7s %7s %7s | %7s\n' pair ratio \
	enc dec enc-mt dec-mt enc dec enc-mt dec-mt enc dec enc-mt dec-mt memcpy
for p in $pairs; do
	f="$T/b.$p.json"
	printf '%-11s %6.4f | %7.1f %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f %7.1f | %7.1f %7.1f %7.1f %7.1f | %7.0f\n' "$p" \
		"$(get "$f" ratio)" "$(get "$f" encode_mbps)" "$(get "$f" decode_mbps)" \
		"$(get "$f" encode_mbps_mt)" "$(get "$f" decode_mbps_mt)" \
		"$(get "$f" zstd3_encode_mbps)" "$(get "$f" zstd3_decode_mbps)" \
		"$(get "$f" zstd3_encode_mbps_mt)" "$(get "$f" zstd3_decode_mbps_mt)" \
		"$(get "$f" zstd19_encode_mbps)" "$(get "$f" zstd19_decode_mbps)" \
		"$(get "$f" zstd19_encode_mbps_mt)" "$(get "$f" zstd19_decode_mbps_mt)" \
		"$(get "$f" memcpy_mbps)"
done
echo "(ratio: ULPack bytes / raw bytes; zstd sizes and per-dtype detail: ulpack bench A B)"

# ---- scaling: threads 1, 2, 4, ... nproc on a 64 MB synthetic pair (--dim 1024)
echo "== 1b. scaling over threads (64 MB bf16 pair; import/verify: a 4-checkpoint run)"
"$ULPACK" synth "$T/big" --dim 1024 --steps 4 > /dev/null
P1="$T/big/checkpoint-300/model.safetensors" P2="$T/big/checkpoint-400/model.safetensors"
raw_run=$(du -sb "$T/big" | cut -f1)
nproc=$(nproc)
list=1 t=2
while [ "$t" -lt "$nproc" ]; do list="$list $t"; t=$((t * 2)); done
[ "$nproc" -gt 1 ] && list="$list $nproc"
printf '%7s | %9s %9s %9s %9s | %9s %9s | %s\n' threads enc dec zstd3-enc zstd3-dec import verify \
	"MB/s (scaling vs 1 thread)"
for t in $list; do
	"$ULPACK" bench "$P1" "$P2" --threads "$t" --quick --reps 3 --json > "$T/s.$t.json"
	rm -rf "$T/sa"; "$ULPACK" init "$T/sa" > /dev/null
	t0=$(now); "$ULPACK" import "$T/sa" "$T/big" --threads "$t" > /dev/null; ti=$(( $(now) - t0 ))
	t0=$(now); "$ULPACK" verify "$T/sa" --threads "$t" > /dev/null; tv=$(( $(now) - t0 ))
	f="$T/s.$t.json"
	if [ "$t" = 1 ]; then
		e1=$(get "$f" encode_mbps) d1=$(get "$f" decode_mbps)
		z1=$(get "$f" zstd3_encode_mbps) zd1=$(get "$f" zstd3_decode_mbps)
		i1=$(mbps "$raw_run" "$ti") v1=$(mbps "$raw_run" "$tv")
		sf=$(sed -n 's/.*"serial_fraction": \({[^}]*}\).*/\1/p' "$f")
	fi
	if [ "$t" = 1 ]; then
		e=$e1 d=$d1 z=$z1 zd=$zd1 i=$i1 v=$v1
	else
		e=$(get "$f" encode_mbps_mt) d=$(get "$f" decode_mbps_mt)
		z=$(get "$f" zstd3_encode_mbps_mt) zd=$(get "$f" zstd3_decode_mbps_mt)
		i=$(mbps "$raw_run" "$ti") v=$(mbps "$raw_run" "$tv")
	fi
	x() { echo "$1 $2" | awk '{ printf "%.2fx", $1 / $2 }'; }
	printf '%7s | %9s %9s %9s %9s | %9s %9s\n' "$t" "$e" "$d" "$z" "$zd" "$i" "$v"
	printf '%7s | %9s %9s %9s %9s | %9s %9s\n' "" "$(x "$e" "$e1")" "$(x "$d" "$d1")" "$(x "$z" "$z1")" \
		"$(x "$zd" "$zd1")" "$(x "$i" "$i1")" "$(x "$v" "$v1")"
done
echo "serial fraction (one thread, share outside parallel regions): $sf"
echo "(zstd -3 runs across tensors on the same pool; import and verify count raw bytes of the run)"
echo "== R. re-basing: ulpack forget (keep every 3rd step), then pack bytes against the kept steps alone"
pb() { "$ULPACK" stat "$1" | sed -n 's/.* in \([0-9]*\) pack bytes.*/\1/p'; }
jget() { sed -n "s/.*\"$2\": \([0-9.]*\).*/\1/p" "$1"; }
# rebase_case NAME SRC_DIR KEEP_EVERY KEPT_STEPS...
rebase_case() {
	name=$1 src=$2 every=$3
	shift 3
	"$ULPACK" init "$T/rb-$name" > /dev/null
	t0=$(now); "$ULPACK" import "$T/rb-$name" "$src" --prefix run > /dev/null; t_imp=$(( $(now) - t0 ))
	raw=$(du -sb "$src" | cut -f1)
	"$ULPACK" forget "$T/rb-$name" run --keep-every "$every" --json > "$T/rb-$name.json"
	mkdir -p "$T/rb-$name-kept"
	for s in "$@"; do cp -r "$src/checkpoint-$s" "$T/rb-$name-kept/"; done
	"$ULPACK" init "$T/rb-$name-k" > /dev/null
	"$ULPACK" import "$T/rb-$name-k" "$T/rb-$name-kept" --prefix run > /dev/null
	before=$(jget "$T/rb-$name.json" pack_bytes_before) after=$(jget "$T/rb-$name.json" pack_bytes_after)
	kept=$(pb "$T/rb-$name-k") rbraw=$(jget "$T/rb-$name.json" rebase_raw_bytes)
	rbs=$(jget "$T/rb-$name.json" rebase_seconds) n=$(jget "$T/rb-$name.json" blobs_rebased)
	echo "$name: pack bytes $before -> $after after forget + gc; kept steps alone $kept" \
		"= $(echo "$after $kept" | awk '{ printf "%.4f", $1 / $2 }') x (target <= 1.1)"
	echo "  re-based $n blobs, $rbraw bytes in $rbs s: $(echo "$rbraw $rbs" | awk '{ printf "%.1f", ($2 > 0 ? $1 / $2 / 1e6 : 0) }') MB/s" \
		"= $(echo "$rbraw $rbs $raw $t_imp" | awk '{ printf "%.3f", ($2 > 0 ? $1 / $2 : 0) / ($3 / ($4 / 1e9)) }') x ulpack import of the run ($(mbps "$raw" "$t_imp") MB/s)"
}
"$ULPACK" synth "$T/rbsyn" --steps 12 --interval 100 --dim 256 > /dev/null
rebase_case synth-12 "$T/rbsyn" 300 300 600 900 1200
TL=${TINY_LM:-$(dirname "$0")/../../shared/data/tiny-lm/bf16}
[ -d "$TL" ] || TL=/work/shared/data/tiny-lm/bf16
if [ -d "$TL" ]; then
	rebase_case tiny-lm-bf16 "$TL" 150 150 300
else
	echo "tiny-lm: skipped (no data; set TINY_LM=DIR)"
fi

echo "== E. ulpack export of one step (a delta at chain depth 7, cold: the oldest of 8) vs cp -r of it from a plain directory"
"$ULPACK" synth "$T/exp" --steps 8 > /dev/null
"$ULPACK" init "$T/exp-a" > /dev/null
"$ULPACK" import "$T/exp-a" "$T/exp" --prefix run > /dev/null
: > "$T/exp-t"
for i in 1 2 3 4 5; do # back to back, medians: the machine may be busy
	rm -rf "$T/exp-x" "$T/exp-c"
	t0=$(now); "$ULPACK" export "$T/exp-a" run/checkpoint-100 "$T/exp-x"; t1=$(now)
	cp -r "$T/exp/checkpoint-100" "$T/exp-c"; t2=$(now)
	echo "$((t1 - t0)) $((t2 - t1))" >> "$T/exp-t"
done
cmp -s "$T/exp-x/model.safetensors" "$T/exp/checkpoint-100/model.safetensors" || { echo "bench: export differs" >&2; exit 1; }
t_exp=$(cut -d' ' -f1 "$T/exp-t" | sort -n | sed -n 3p) t_cp=$(cut -d' ' -f2 "$T/exp-t" | sort -n | sed -n 3p)
size=$(du -sb "$T/exp/checkpoint-100" | cut -f1)
echo "ulpack export: $(mbps "$size" "$t_exp") MB/s, cp -r: $(mbps "$size" "$t_cp") MB/s" \
	"= $(echo "$t_cp $t_exp" | awk '{ printf "%.3f", $1 / $2 }') x cp -r (8 decodes a chunk: its chain)"

if [ ! -c /dev/fuse ] || ! command -v rsync > /dev/null; then
	echo "== 2. mount: skipped (no /dev/fuse or no rsync)"
	exit 0
fi
echo "== 2. mount: rsync of a synthetic run (8 checkpoints) into ulpackfs vs a plain directory"
"$ULPACK" synth "$T/run" --steps 8
raw=$(du -sb "$T/run" | cut -f1)
# three rounds, each: rsync -a into a plain directory, into a fresh mount
# (until rsync returned, until `ulpack sync` returned: closed files are
# archived in the background and sync is the barrier; until unmounted), and
# `ulpack import` of the same run; the ratios are taken within each round
# (the machine's load changes between rounds) and their medians reported
med3() { echo "$@" | tr ' ' '\n' | grep . | sort -g | sed -n 2p; }
r_mount="" r_sync="" r_all="" tps="" tms="" tss="" tas="" tis="" rsss=""
mkdir -p "$M"
for round in 1 2 3; do
	rm -rf "$T/plain" "$T/arch" "$T/arch-imp"
	t0=$(now); rsync -a "$T/run/" "$T/plain/"; t_plain=$(( $(now) - t0 ))
	"$ULPACK" init "$T/arch" > /dev/null
	"$ULPACKFS" "$T/arch" "$M"
	pid=$(pgrep -n -f "ulpackfs $T/arch")
	t0=$(now); rsync -a "$T/run/" "$M/run/"; t_mount=$(( $(now) - t0 ))
	"$ULPACK" sync "$M" > /dev/null; t_sync=$(( $(now) - t0 ))
	rss=$(sed -n 's/VmHWM: *//p' "/proc/$pid/status")
	fusermount3 -u "$M"
	# (exited: gone, or a zombie until init reaps it)
	while [ "$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$pid/stat" 2> /dev/null)" != "" ] &&
		[ "$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$pid/stat" 2> /dev/null)" != Z ]; do
		sleep 0.01
	done
	t_all=$(( $(now) - t0 ))
	"$ULPACK" init "$T/arch-imp" > /dev/null
	t0=$(now); "$ULPACK" import "$T/arch-imp" "$T/run" --prefix run > /dev/null; t_import=$(( $(now) - t0 ))
	# disk as the user sees it (du), the mount's archive after its daemon exited
	d_mount=$(du -s --block-size=1 "$T/arch" | cut -f1) d_imp=$(du -s --block-size=1 "$T/arch-imp" | cut -f1)
	r_mount="$r_mount $(echo "$t_plain $t_mount" | awk '{ printf "%.3f", $1 / $2 }')"
	r_sync="$r_sync $(echo "$t_import $t_sync" | awk '{ printf "%.3f", $1 / $2 }')"
	r_all="$r_all $(echo "$t_plain $t_all" | awk '{ printf "%.3f", $1 / $2 }')"
	tps="$tps $t_plain" tms="$tms $t_mount" tss="$tss $t_sync" tas="$tas $t_all" tis="$tis $t_import"
	rsss="$rsss $(echo "$rss" | tr -dc 0-9)"
done
rm -rf "$T/arch-imp"
stored=$("$ULPACK" stat "$T/arch" --json | sed -n 's/.*"stored_bytes": \([0-9]*\), "ratio".*"max_chain_depth".*/\1/p' | tail -1)
echo "(medians of 3 rounds, each ratio taken within its round: the load changes between rounds)"
echo "rsync -a into a plain directory: $(mbps "$raw" "$(med3 $tps)") MB/s"
echo "rsync -a into ulpackfs:          $(mbps "$raw" "$(med3 $tas)") MB/s until all is archived and unmounted" \
	"($(mbps "$raw" "$(med3 $tms)") MB/s until rsync returned)"
echo "  = $(med3 $r_all) x the plain directory (rounds:$r_all);" \
	"stored ${stored:-?} of $raw raw bytes ($(echo "${stored:-0} $raw" | awk '{ printf "%.4f", $1 / $2 }'))"
enc1=$(get "$T/b.synth-bf16.json" encode_mbps)
echo "  = $(echo "$raw $(med3 $tas) $enc1" | awk '{ printf "%.3f", $1 / ($2 / 1e9) / 1e6 / $3 }') x the one-thread" \
	"encode speed of ulpack bench on the synthetic pair above ($enc1 MB/s)"
echo "  until rsync returned: $(med3 $r_mount) x the plain directory (rounds:$r_mount; target >= 0.6)"
echo "  until archived (ulpack sync): $(mbps "$raw" "$(med3 $tss)") MB/s = $(med3 $r_sync) x ulpack import of the same" \
	"run ($(mbps "$raw" "$(med3 $tis)") MB/s; rounds:$r_sync; target >= 0.9)"
echo "archive on disk (du) after the rsync, ulpack sync and unmount: $d_mount bytes =" \
	"$(echo "$d_mount $d_imp" | awk '{ printf "%.4f", $1 / $2 }') x ulpack import's ($d_imp; last round; target <= 1.05)"
echo "peak memory of ulpackfs during the rsync: $(echo $rsss | tr ' ' '\n' | sort -g | tail -1) kB (the most of 3 rounds:$rsss)"
"$ULPACKFS" "$T/arch" "$M"
f=checkpoint-700/model.safetensors
size=$(stat -c %s "$T/run/$f")
# reads timed by dd itself (1 MiB reads), not counting process start-up
dd_ns() { LC_ALL=C dd if="$1" of=/dev/null bs=1M 2>&1 | sed -n 's/.* copied, \([0-9.e-]*\) s,.*/\1/p' |
	awk '{ printf "%.0f", $1 * 1e9 }'; }
cat "$M/run/checkpoint-800/model.safetensors" > /dev/null   # the reference (the newest, an anchor), now in the decode cache
t_cold=$(dd_ns "$M/run/$f")
t_warm=$(dd_ns "$M/run/$f")
cat "$T/run/$f" > /dev/null
t_file=$(dd_ns "$T/run/$f")
fusermount3 -u "$M"
t0=$(now); "$ULPACK" cat "$T/arch" "run/$f" > /dev/null; t_cat=$(( $(now) - t0 ))
# a whole run restored through a fresh mount, steps in order (each chunk one
# delta decode, its reference cached from the step before)
"$ULPACKFS" "$T/arch" "$M"
t0=$(now); rsync -a "$M/run/" "$T/restore/"; t_restore=$(( $(now) - t0 ))
fusermount3 -u "$M"
cmp -s "$T/run/$f" "$T/restore/$f" || { echo "bench: restored $f differs" >&2; exit 1; }
echo "read of $f ($size bytes, a delta against checkpoint-800; dd with 1 MiB reads):"
echo "  through the mount, cold (reference cached): $(mbps "$size" "$t_cold") MB/s"
echo "  through the mount, warm (page cache):       $(mbps "$size" "$t_warm") MB/s"
echo "  plain file (page cache):                    $(mbps "$size" "$t_file") MB/s"
echo "  ulpack cat (a fresh process, chain decoded): $(mbps "$size" "$t_cat") MB/s"
echo "rsync -a of the whole run out of a fresh mount: $(mbps "$raw" "$t_restore") MB/s" \
	"($(echo "$t_plain $t_restore" | awk '{ printf "%.3f", $1 / $2 }') x rsync between plain directories)"

bench_cold
[ -c /dev/fuse ] && bench_open

# ---- 3. a trainer-like save: model.safetensors in a few large writes and an
# optimizer.pt-like zip in many 64-byte-aligned records (ULP_BENCH_SAVE_MB,
# default 500), into a plain directory and into the mount, alternately, 3
# times each; the time until close() returned for both files (medians)
PYB=$(command -v python3 || true)
if [ -n "$PYB" ]; then
	mb=${ULP_BENCH_SAVE_MB:-500}
	echo "== 3. trainer-like save of $mb MB (model.safetensors + optimizer.pt records) vs a plain directory"
	save() { # DIR INDEX: prints the seconds until both closes returned
		"$PYB" - "$1" "$2" "$mb" <<'PYEOF'
import json, os, struct, sys, time
d, idx, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
model = mb * (1 << 20) // 3
n = 8
per = model // n // 4 * 4
hdr = {"t%d" % i: {"dtype": "F32", "shape": [per // 4], "data_offsets": [i * per, (i + 1) * per]} for i in range(n)}
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
rng = bytearray(os.urandom(1 << 20))
blob = bytes(rng) * (per // len(rng) + 1)
rec = memoryview(bytes(rng) * 2)
t0 = time.time()
os.makedirs(os.path.join(d, "checkpoint-%d" % idx), exist_ok=True)
with open(os.path.join(d, "checkpoint-%d/model.safetensors" % idx), "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for i in range(n):                       # a few large writes
        f.write(memoryview(blob)[:per])
with open(os.path.join(d, "checkpoint-%d/optimizer.pt" % idx), "wb") as f:
    left = mb * (1 << 20) - model
    while left > 0:                          # zip records, 64-byte aligned
        k = min(left, 64 * (1000 + (left // 64) % 7000))
        f.write(rec[:64])
        f.write(rec[64:k])
        left -= k
print("%.3f" % (time.time() - t0))
PYEOF
	}
	# each save into the mount is followed by `ulpack sync` (not counted: a
	# trainer trains between saves); ULP_SESSION_HOLD=1 (a measuring knob of
	# the session) holds archiving back until the sync: the write path alone
	med() { echo "$@" | tr ' ' '\n' | grep . | sort -g | sed -n 2p; }
	for hold in 0 1; do
		ULP_SESSION_HOLD=$hold "$ULPACKFS" "$T/arch" "$M"
		mkdir -p "$T/saveplain" "$M/save$hold"
		tp="" tm="" ts=""
		for i in 1 2 3; do
			tp="$tp $(save "$T/saveplain" "$i")"
			rm -rf "$T/saveplain"/*
			tm="$tm $(save "$M/save$hold" "$i")"
			t0=$(now); "$ULPACK" sync "$M" > /dev/null
			ts="$ts $(echo "$(( $(now) - t0 ))" | awk '{ printf "%.2f", $1 / 1e9 }')"
		done
		if [ "$hold" = 0 ]; then
			echo "save into a plain directory: $(med $tp) s (runs:$tp)"
			echo "save into ulpackfs:          $(med $tm) s (runs:$tm); archived (ulpack sync) after:$ts s"
			echo "  = $(echo "$(med $tm) $(med $tp)" | awk '{ printf "%.3f", $1 / $2 }') x the plain save (target <= 1.5)"
		else
			echo "  write path alone (archiving held until the sync): $(med $tm) s (runs:$tm; plain:$tp)" \
				"= $(echo "$(med $tm) $(med $tp)" | awk '{ printf "%.3f", $1 / $2 }') x the plain save"
		fi
		fusermount3 -u "$M"
		pid=$(pgrep -n -f "ulpackfs $T/arch" || true)
		while [ -n "$pid" ] && kill -0 "$pid" 2> /dev/null; do sleep 0.05; done
	done
fi
bench_python
bench_dcp
bench_publish
bench_s3
bench_dynamics
exit 0
