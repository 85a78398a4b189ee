#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_dynamics.sh - `ulpack dynamics` (issue 39) on a synthetic run with a
# jump planted at a known step (ulpack synth --spike):
#  - the first line names that step and the layers given the jump;
#  - --json: every figure, checked with python3 against the index's own
#    numbers (`ulpack stat --json`: the run's stored bytes) and for
#    consistency (bits per weight, update figures, roles, matrices' shapes);
#  - --svg: rendered by a real renderer (rsvg-convert) to a PNG, decoded here
#    by hand (zlib): the picture has the SVG's size, each sampled cell shows
#    its fill, the hottest cell's colour is not the coldest's, and the framed
#    hottest cells are the planted step's;
#  - --tensors GLOB; the errors (no such run, missing arguments);
#  - a mount's user.ulpack.dynamics on a run directory (the compact JSON);
#  - --norms and `ulpack diff` (decoded through the decode cache) against
#    numpy on the safetensors files themselves, bf16 and f32: counts and
#    ULP percentiles exact, relative norms to 1e-6; again on a layout with
#    anchors inside the run and a delta over two steps (--max-chain 2), so
#    that pairs linked by no delta of one against the other are covered;
#  - speed: an index of 1,000 steps x 300 tensors (written here with
#    sqlite3: the view reads the index alone) in under 1 s of CPU and 100 MB.
. "$(dirname "$0")/lib.sh"
command -v rsvg-convert > /dev/null || skip "no rsvg-convert (tools/install-deps.sh --test: librsvg2-bin)"
A="$T/arch"
"$ULPACK" synth "$T/src/run" --steps 24 --dim 64 --layers 4 --spike 1300 || fail "synth"
"$ULPACK" init "$A" > /dev/null && "$ULPACK" import "$A" "$T/src" > /dev/null || fail "import"

"$ULPACK" dynamics "$A" run --svg "$T/d.svg" > "$T/out" || fail "dynamics: $(cat "$T/out")"
head -1 "$T/out" | grep -q "^step 1300: +[0-9.]* bits/weight over its neighbours' update.* layers model.layers.2-3 " \
	&& ok "the first line names the planted step and its layers: $(head -1 "$T/out")" \
	|| fail "first line: $(head -1 "$T/out")"
grep -q "^ *1300 .*<- jump" "$T/out" && [ "$(grep -Ec '^ +[0-9]+ ' "$T/out")" = 24 ] \
	&& ok "the table: 24 steps, the jump marked" || fail "table: $(cat "$T/out")"

"$ULPACK" dynamics "$A" run --json > "$T/d.json" || fail "dynamics --json"
"$ULPACK" stat "$A" run --json > "$T/stat.json" || fail "stat --json"
"$PY" - "$T/d.json" "$T/stat.json" <<'PYEOF' && ok "--json: every figure consistent, stored bytes as ulpack stat's" || fail "--json"
import json, math, re, sys
d = json.load(open(sys.argv[1]))
st = json.load(open(sys.argv[2]))
S, T, L = len(d["steps"]), len(d["tensors"]), len(d["layers"])
assert d["steps"] == [100 * (i + 1) for i in range(24)], d["steps"]
assert T == 32 and L == 8, (T, L)
assert d["jump"]["step"] == 1300 and d["jump"]["layers"] == ["model.layers.2", "model.layers.3"], d["jump"]
assert d["summary"].startswith("step 1300: +")
for k in ("stored_bytes", "ref_step", "chain_depth", "codec", "update_bound", "bits_per_weight", "update_bits_per_weight"):
    assert len(d[k]) == S and all(len(r) == T for r in d[k]), k
for k in ("layer_bits_per_weight", "layer_update_bits_per_weight", "layer_excess_bits"):
    assert len(d[k]) == S and all(len(r) == L for r in d[k]), k
assert len(d["role"]) == S and all(re.fullmatch("[-ads]{%d}" % T, r) for r in d["role"])
# stored bytes: each blob once, as the files' (which count a blob in the
# file that put it first: import puts the newest first)
assert sum(d["step_stored_bytes"]) == st["total"]["stored_bytes"] == sum(f["stored_bytes"] for f in st["files"])
for i, s in enumerate(d["steps"]):
    assert d["step_stored_bytes"][i] == sum(d["stored_bytes"][i]), s
    tot_e = tot_b = 0
    for t, ten in enumerate(d["tensors"]):
        e, b, r = ten["elements"], d["stored_bytes"][i][t], d["role"][i][t]
        assert abs(d["bits_per_weight"][i][t] - 8 * b / e) < 1e-5 * max(1, 8 * b / e)
        assert (r == "s") == (b == 0)
        if r == "d":
            assert d["ref_step"][i][t] in d["steps"] and d["chain_depth"][i][t] > 0
        if r == "a":
            assert d["ref_step"][i][t] == -1 and d["chain_depth"][i][t] == 0
        u = d["update_bits_per_weight"][i][t]
        if i == 0:
            assert u is None
        if r == "s":
            assert u == 0
        tot_e += e
        tot_b += 8 * b
    assert abs(d["step_bits_per_weight"][0][i] - tot_b / tot_e) < 1e-5 * tot_b / tot_e
# a layer's update: over its tensors, weighted by elements
lay = {n: i for i, n in enumerate(d["layers"])}
i = d["steps"].index(1300)
num = [0.0] * L
den = [0] * L
for t, ten in enumerate(d["tensors"]):
    u = d["update_bits_per_weight"][i][t]
    assert u is not None
    num[ten["layer"]] += u * ten["elements"]
    den[ten["layer"]] += ten["elements"]
for l in range(L):
    assert abs(d["layer_update_bits_per_weight"][i][l] - num[l] / den[l]) <= 1e-5 * num[l] / den[l] + 1e-12
ex = d["layer_excess_bits"][i]
assert ex[lay["model.layers.2"]] > 2 and ex[lay["model.layers.3"]] > 2 and ex[lay["model.layers.0"]] < 1, ex
PYEOF

# the picture: rendered by librsvg, decoded here
rsvg-convert -o "$T/d.png" "$T/d.svg" || fail "rsvg-convert"
"$PY" - "$T/d.svg" "$T/d.png" <<'PYEOF' && ok "the SVG renders: size, cell colours, hottest unlike coldest, framed cells at step 1300" || fail "the picture"
import re, struct, sys, zlib
svg = open(sys.argv[1]).read()
png = open(sys.argv[2], "rb").read()
assert png[:8] == b"\x89PNG\r\n\x1a\n"
pos, idat, hdr = 8, b"", None
while pos < len(png):
    n, typ = struct.unpack(">I4s", png[pos:pos + 8])
    body = png[pos + 8:pos + 8 + n]
    if typ == b"IHDR":
        hdr = struct.unpack(">IIBBBBB", body)
    elif typ == b"IDAT":
        idat += body
    pos += 12 + n
W, H, depth, ctype = hdr[0], hdr[1], hdr[2], hdr[3]
assert depth == 8 and ctype in (2, 6), hdr
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
rows, prev, stride, p = [], bytearray(W * bpp), W * bpp, 0
for y in range(H):
    f, line = raw[p], bytearray(raw[p + 1:p + 1 + stride])
    p += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(line)
    prev = line
def px(x, y):
    return tuple(rows[y][x * bpp:x * bpp + 3])
m = re.search(r'<svg[^>]* width="(\d+)" height="(\d+)"', svg)
assert (W, H) == (int(m.group(1)), int(m.group(2))), (W, H, m.groups())
cells = []
for c in re.finditer(r'<rect class="cell" x="(\d+)" y="(\d+)" width="(\d+)" height="(\d+)" fill="#(\w{6})" data-step="(\d+)" data-layer="(\d+)" data-value="([^"]+)"', svg):
    x, y, w, h = map(int, c.groups()[:4])
    cells.append((x, y, w, h, bytes.fromhex(c.group(5)), int(c.group(6)), int(c.group(7)), c.group(8)))
assert len(cells) == 24 * 8, len(cells)
vals = [c for c in cells if c[7] != "none"]
hot = max(vals, key=lambda c: float(c[7]))
cold = min(vals, key=lambda c: float(c[7]))
def centre(c):  # a quarter in from the left: clear of an annotation's text
    return px(c[0] + max(1, c[2] // 4), c[1] + c[3] // 4)
for c in (hot, cold) + tuple(vals[::17]):
    got = centre(c)
    assert all(abs(g - w) <= 3 for g, w in zip(got, c[4])), ("cell shows its fill", c, got)
assert sum(abs(a - b) for a, b in zip(centre(hot), centre(cold))) > 150, (centre(hot), centre(cold))
none = [c for c in cells if c[7] == "none"]
assert none and all(centre(c) == (0xd9, 0xd9, 0xd9) for c in none), "cells with no figure are grey"
framed = re.findall(r'<rect class="hot"[^>]* data-step="(\d+)" data-layer="(\d+)"', svg)
assert len(framed) >= 2 and all(s == "1300" for s, _ in framed[:2]), framed
# the step axis: labelled by step numbers
labels = re.findall(r'<text class="step"[^>]*>(\d+)</text>', svg)
assert "100" in labels and len(labels) >= 4, labels
PYEOF

"$ULPACK" dynamics "$A" run --tensors 'model.layers.*' --json > "$T/g.json" || fail "--tensors"
"$PY" -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['layers'] == ['model.layers.%d' % i for i in range(4)] and len(d['tensors']) == 28, d['layers']
assert d['jump']['step'] == 1300" "$T/g.json" && ok "--tensors keeps the matching tensors" || fail "--tensors"
"$ULPACK" dynamics "$A" nope > /dev/null 2> "$T/err"; rc=$?
[ $rc = 1 ] && grep -q "nope" "$T/err" && ok "no such run: exit 1, named" || fail "no such run: rc $rc $(cat "$T/err")"
"$ULPACK" dynamics "$A" > /dev/null 2>&1; rc=$?
[ $rc = 2 ] && ok "a missing argument: exit 2" || fail "missing argument: rc $rc"

# a mount: a run directory's user.ulpack.dynamics, the compact JSON of the view
M="$T/mnt"
if [ ! -c /dev/fuse ] || ! command -v fusermount3 > /dev/null; then
	[ "${CI:-}" = true ] && fail "no /dev/fuse or fusermount3 under CI=true"
	echo "# no /dev/fuse or fusermount3: the mount's xattr is not checked"
else
mount_fs "$A" "$M" -o ro || fail "mount"
getfattr --only-values -n user.ulpack.dynamics "$M/run" > "$T/x.json" 2> "$T/err" || fail "getfattr: $(cat "$T/err")"
getfattr --only-values -n user.ulpack.dynamics "$M/run/checkpoint-100" > /dev/null 2>&1 \
	&& fail "a step directory has a dynamics xattr"
"$PY" - "$T/x.json" "$T/d.json" <<'PYEOF' && ok "user.ulpack.dynamics on the mount: the view's compact JSON" || fail "xattr: $(head -c 300 "$T/x.json")"
import json, sys
x, d = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert "role" not in x and "tensors" not in x
for k in ("run", "summary", "steps", "layers", "jump", "step_stored_bytes", "layer_update_bits_per_weight", "layer_excess_bits"):
    assert x[k] == d[k], k
PYEOF
umount_fs "$M"
fi

# --norms and ulpack diff against numpy, on the files themselves: bf16 and
# f32 tensors (synth --dtype mixed; the embedding and head of 1.28M elements:
# compared in two blocks), counts and ULPs exact, norms to 1e-6
"$ULPACK" synth "$T/src2/mix" --steps 4 --dim 64 --vocab 20000 --dtype mixed --interval 10 > /dev/null || fail "synth mixed"
"$ULPACK" import "$A" "$T/src2" > /dev/null || fail "import mixed"
"$ULPACK" dynamics "$A" mix --norms --json > "$T/n.json" || fail "dynamics --norms"
"$ULPACK" diff "$A" mix/checkpoint-10/model.safetensors mix/checkpoint-40/model.safetensors --json > "$T/diff.json" \
	|| fail "diff"
"$ULPACK" diff "$A" mix/checkpoint-10/model.safetensors mix/checkpoint-40/model.safetensors > "$T/diff.txt" || fail "diff text"
# the check, kept in a file: run again below on a layout with anchors inside
cat > "$T/nfig.py" <<'PYEOF'
import json, math, struct, sys
import numpy as np
src, nj, dj, dt = (sys.argv[1:5] + [None, None])[:4]
def load(step):
    raw = open("%s/checkpoint-%d/model.safetensors" % (src, step), "rb").read()
    hl = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + hl])
    out = {}
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = raw[8 + hl + b:8 + hl + e]
        if t["dtype"] == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint64)
            v = (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            out[name] = ("BF16", u, v, 16, 7, 8)
        else:
            u = np.frombuffer(buf, dtype="<u4").astype(np.uint64)
            v = np.frombuffer(buf, dtype="<f4").astype(np.float64)
            out[name] = ("F32", u, v, 32, 23, 8)
    return out
def figures(a, b):
    dt, ua, va, w, mb, eb = a
    _, ub, vb, _, _, _ = b
    sign = np.uint64(1 << (w - 1))
    mask = np.uint64((1 << w) - 1)
    def key(u):
        return np.where(u & sign, ~u & mask, u | sign).astype(np.int64)
    d = np.sort(np.abs(key(ua) - key(ub)))
    n = len(d)
    emask = np.uint64((1 << eb) - 1)
    na, nd = np.linalg.norm(va), np.linalg.norm(vb - va)
    return {"dtype": dt, "elements": n, "changed": int(np.count_nonzero(ua != ub)),
            "median_ulps": int(d[(n - 1) // 2]), "p99_ulps": int(d[int(math.floor(0.99 * (n - 1)))]),
            "max_ulps": int(d[-1]), "rel_change": nd / na if na > 0 else (0.0 if nd == 0 else None),
            "exponent_moves": int(np.count_nonzero(((ua >> np.uint64(mb)) & emask) != ((ub >> np.uint64(mb)) & emask)))}
def close(x, y):
    if y is None or x is None:
        return x is None and y is None
    return abs(x - y) <= 1e-6 * max(abs(y), 1e-300)
d = json.load(open(nj))
steps = {s: load(s) for s in d["steps"]}
# ulpack diff 10 -> 40
diff = json.load(open(dj)) if dj else {"tensors": []}
assert not dj or {t["dtype"] for t in diff["tensors"]} == {"BF16", "F32"}
assert not dj or len(diff["tensors"]) == len(steps[10])
rels = [t["rel_change"] for t in diff["tensors"]]
assert rels == sorted(rels, key=lambda r: -r if r is not None else math.inf), "sorted by relative change"
for t in diff["tensors"]:
    want = figures(steps[10][t["name"]], steps[40][t["name"]])
    for k in ("dtype", "elements", "changed", "median_ulps", "p99_ulps", "max_ulps", "exponent_moves"):
        assert t[k] == want[k], (t["name"], k, t[k], want[k])
    assert close(t["rel_change"], want["rel_change"]), (t["name"], t["rel_change"], want["rel_change"])
if dt:
    txt = open(dt).read().splitlines()
    assert txt[0].split()[0] == "tensor" and txt[1].split()[0] == diff["tensors"][0]["name"]
# dynamics --norms: each step against the one before
assert d["steps"] == [10 * (i + 1) for i in range(len(d["steps"]))]
for i in range(len(d["steps"])):
    for t, ten in enumerate(d["tensors"]):
        if i == 0:
            assert d["rel_change"][0][t] is None
            continue
        want = figures(steps[d["steps"][i - 1]][ten["name"]], steps[d["steps"][i]][ten["name"]])
        for k in ("changed", "median_ulps", "p99_ulps", "max_ulps", "exponent_moves"):
            assert d[k][i][t] == want[k], (i, ten["name"], k, d[k][i][t], want[k])
        assert close(d["rel_change"][i][t], want["rel_change"]), (i, ten["name"])
    if i:
        num = sum(np.linalg.norm(steps[d["steps"][i]][n][2] - steps[d["steps"][i - 1]][n][2]) ** 2 for n in steps[10])
        den = sum(np.linalg.norm(steps[d["steps"][i - 1]][n][2]) ** 2 for n in steps[10])
        assert close(d["step_rel_change"][0][i], math.sqrt(num / den)), (d["step_rel_change"][0][i], math.sqrt(num / den))
PYEOF
"$PY" "$T/nfig.py" "$T/src2/mix" "$T/n.json" "$T/diff.json" "$T/diff.txt" \
	&& ok "--norms and ulpack diff match numpy (exact counts and ULPs, norms to 1e-6)" || fail "--norms / diff against numpy"
# the same with --max-chain 2 (layout.c): step 10 a delta against 30 (not a
# neighbour), 40 forward against 30, 60 an anchor and 50 against it, so the
# pair 40-50 is linked by no delta (a chain crosses an anchor): each pair
# still exact against numpy
"$ULPACK" synth "$T/src3/mix" --steps 6 --dim 64 --vocab 20000 --dtype mixed --interval 10 > /dev/null || fail "synth 6"
"$ULPACK" init "$T/arch3" > /dev/null && "$ULPACK" import "$T/arch3" "$T/src3" --max-chain 2 > /dev/null \
	|| fail "import --max-chain 2"
"$ULPACK" dynamics "$T/arch3" mix --norms --json > "$T/n3.json" || fail "dynamics --norms, --max-chain 2"
"$PY" - "$T/n3.json" <<'PYEOF' || fail "--max-chain 2: not the layout the test needs"
import json, sys
d = json.load(open(sys.argv[1]))
T = len(d["tensors"])
big = max(range(T), key=lambda t: d["tensors"][t]["elements"])
refs = [d["ref_step"][i][big] for i in range(6)]
assert refs[0] == 30 and refs[3] == 30 and refs[4] == 60 and refs[5] == -1, refs
PYEOF
"$PY" "$T/nfig.py" "$T/src3/mix" "$T/n3.json" \
	&& ok "--norms across anchors and non-neighbour deltas (--max-chain 2) matches numpy" \
	|| fail "--norms, --max-chain 2, against numpy"

# speed: 1,000 steps x 300 tensors, the index alone
B="$T/big"
"$ULPACK" init "$B" > /dev/null || fail "init big"
"$PY" - "$B/ulpack.db" <<'PYEOF' || fail "fake index"
import hashlib, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("PRAGMA synchronous=OFF")
db.execute("INSERT INTO packs(id, name, size) VALUES(1, 'none.pack', 0)")
db.execute("INSERT INTO entries(path, parent, name, type, mode, mtime_ns) VALUES('big', '', 'big', 1, 493, 0)")
bid = 0
prev = {}
for s in range(1, 1001):
    step = s * 10
    d = "big/checkpoint-%d" % step
    db.execute("INSERT INTO entries(path, parent, name, type, mode, mtime_ns) VALUES(?, 'big', ?, 1, 493, 0)", (d, d[4:]))
    cur = db.execute("INSERT INTO entries(path, parent, name, type, size, mode, mtime_ns, kind, run, series, step)"
                     " VALUES(?, ?, 'model.safetensors', 0, 0, 420, 0, 1, 'big', 'big/checkpoint-{S}/model.safetensors', ?)",
                     (d + "/model.safetensors", d, step))
    fid = cur.lastrowid
    rows, blobs = [], []
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
"$PY" - "$ULPACK" "$B" <<'PYEOF' && ok "1,000 steps x 300 tensors: under 1 s of CPU and 100 MB" || fail "speed"
import resource, subprocess, sys, time
t0 = time.monotonic()
out = subprocess.run([sys.argv[1], "dynamics", sys.argv[2], "big"], stdout=subprocess.PIPE, check=True).stdout
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu, rss_mb = ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024
print("# 1000 x 300, the table: %.3f s CPU, %.3f s wall, %.1f MB peak" % (cpu, wall, rss_mb))
assert len(out.splitlines()) == 1000 + 3
assert cpu < 1.0 and rss_mb < 100, (cpu, rss_mb)
t0 = time.monotonic()
out = subprocess.run([sys.argv[1], "dynamics", sys.argv[2], "big", "--json"], stdout=subprocess.PIPE, check=True).stdout
ru2 = resource.getrusage(resource.RUSAGE_CHILDREN)
print("# 1000 x 300, --json: %.3f s CPU, %.3f s wall, %d bytes" % (ru2.ru_utime + ru2.ru_stime - cpu,
      time.monotonic() - t0, len(out)))
import json
d = json.loads(out)
assert len(d["steps"]) == 1000 and len(d["tensors"]) == 300 and len(d["layers"]) == 30
assert ru2.ru_maxrss / 1024 < 100, ru2.ru_maxrss
PYEOF
finish
