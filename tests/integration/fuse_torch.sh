#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_torch.sh - torch.save files (tests/data/torch, written by torch 1.13):
# archived per storage, byte-identical through `ulpack cat`, the mount,
# `ulpack export` and a remount; a torch file copied into the mount is
# archived per storage too; verify; xattrs. Where python3 can import torch,
# torch.load of each mounted file also gives tensors equal to the original's
# (an extra check, not a skip: the test passes without torch). A hostile
# pickle keeps the daemon's memory bounded (issue 28 item 4).
. "$(dirname "$0")/lib.sh"
need_fuse

A="$T/arch" M="$T/mnt" SRC="$top_srcdir/tests/data/torch"
"$ULPACK" init "$A" > /dev/null
"$ULPACK" import "$A" "$SRC" > /dev/null || fail import
( cd "$SRC" && find . -type f \( -name '*.pt' -o -name '*.bin' \) | sed 's|^\./||' | sort ) > "$T/files"
[ "$(wc -l < "$T/files")" -ge 5 ] || fail "test files missing"

bad=0
while read -r f; do
	"$ULPACK" cat "$A" "$f" | cmp -s - "$SRC/$f" || { bad=$((bad + 1)); echo "cat differs: $f"; }
done < "$T/files"
[ "$bad" = 0 ] && ok "ulpack cat: torch files identical" || fail "$bad files differ through cat"

# two steps are both anchors (the oldest and the newest: ulpack-format(5));
# with step 30's files copied as step 10 too, step 20 sits between them and is
# coded per storage against step 10
mkdir -p "$T/tsrc" && cp -r "$SRC/run" "$T/tsrc/" && cp -r "$SRC/run/checkpoint-30" "$T/tsrc/run/checkpoint-10" \
	&& "$ULPACK" init "$T/a3" > /dev/null && "$ULPACK" import "$T/a3" "$T/tsrc" > /dev/null || fail "import of three steps"
"$ULPACK" stat "$T/a3" --json > "$T/stat.json" || fail stat
"$PY" - "$T/stat.json" <<'PYEOF' && ok "stored per storage, deltas between steps" || fail "torch files not coded per storage"
import json, sys
s = json.load(open(sys.argv[1]))
files = {f["path"]: f for f in s["files"]}
for p in ("run/checkpoint-20/optimizer.pt", "run/checkpoint-20/pytorch_model.bin"):
    assert not files[p]["anchor"] and files[p]["ratio"] < 0.85, files[p]
for p in ("run/checkpoint-30/optimizer.pt", "run/checkpoint-30/pytorch_model.bin"):
    assert files[p]["anchor"] and files[p]["chain_depth"] == 0, files[p]  # the newest step
assert "F32" in s["by_dtype"] and s["by_dtype"]["F32"]["delta_blobs"] > 0, s["by_dtype"]
PYEOF

mount_fs "$A" "$M" || { fail mount; finish; }
check_tree() { # DIR WHAT
	_bad=0
	while read -r f; do
		cmp -s "$SRC/$f" "$1/$f" || { _bad=$((_bad + 1)); echo "differs: $1/$f"; }
	done < "$T/files"
	[ "$_bad" = 0 ] && ok "$2: torch files identical" || fail "$2: $_bad files differ"
}
check_tree "$M" "mount"
"$PY" - "$M/run/checkpoint-30/optimizer.pt" <<'PYEOF' && ok "xattrs of a torch file" || fail "xattrs"
import os, sys
assert int(os.getxattr(sys.argv[1], "user.ulpack.step")) == 30
assert int(os.getxattr(sys.argv[1], "user.ulpack.stored_bytes")) < os.path.getsize(sys.argv[1])
PYEOF
mkdir -p "$M/copied/checkpoint-40" && cp "$SRC/run/checkpoint-30/optimizer.pt" "$M/copied/checkpoint-40/optimizer.pt" \
	&& cmp -s "$SRC/run/checkpoint-30/optimizer.pt" "$M/copied/checkpoint-40/optimizer.pt" \
	&& ok "torch file written through the mount" || fail "write through the mount"

if "$PY" -c 'import torch' 2> /dev/null; then
	"$PY" - "$SRC" "$M" "$T/files" <<'PYEOF' && ok "torch.load of mounted files: equal tensors" || fail "torch.load"
import os, sys, torch
src, mnt, files = sys.argv[1], sys.argv[2], open(sys.argv[3]).read().split()
def same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
for f in files:
    assert same(torch.load(os.path.join(src, f)), torch.load(os.path.join(mnt, f))), f
PYEOF
else
	echo "note: python3 cannot import torch: torch.load check not run"
fi
umount_fs "$M"

"$ULPACK" export "$A" "" "$T/out" > /dev/null || fail export
check_tree "$T/out" "export"
mount_fs "$A" "$M" || fail remount
check_tree "$M" "remount"
cmp -s "$SRC/run/checkpoint-30/optimizer.pt" "$M/copied/checkpoint-40/optimizer.pt" && ok "copied file after remount" \
	|| fail "copied file after remount"

# issue 28 item 4: a torch zip whose 16 MiB pickle is 16 million empty lists
# (2.4 GB of parser memory before, 2.1 GB of it kept): the daemon's peak
# stays under the parser's bound (24 x 16 MiB + 1 MiB) plus 224 MiB for the
# rest, its resident memory goes back under 256 MiB, and the file is stored
# opaque and reads back identical
"$PY" - "$T/hostile.pt" <<'PYEOF' || fail "writing the hostile torch file"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w", zipfile.ZIP_STORED) as z:
    z.writestr("archive/data.pkl", b"\x80\x02" + b"]" * (16 << 20) + b".")
    z.writestr("archive/version", b"3\n")
PYEOF
pid=$(fs_pid "$M")
mkdir -p "$M/hostile/checkpoint-1" && cp "$T/hostile.pt" "$M/hostile/checkpoint-1/model.pt" && "$ULPACK" sync "$M" > /dev/null \
	|| fail "hostile torch file through the mount"
hwm=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status") rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
[ "$hwm" -le $(( (24 * 16 + 1 + 224) * 1024 )) ] && ok "daemon peak ${hwm} kB with a hostile pickle" \
	|| fail "daemon peak ${hwm} kB over $(( (24 * 16 + 1 + 224) * 1024 )) kB with a hostile pickle"
[ "$rss" -le $((256 * 1024)) ] && ok "daemon resident ${rss} kB after it" || fail "daemon keeps ${rss} kB after it"
cmp -s "$T/hostile.pt" "$M/hostile/checkpoint-1/model.pt" && ok "hostile torch file reads back identical" \
	|| fail "hostile torch file differs"
umount_fs "$M"
"$ULPACK" stat "$A" copied --json | grep -q '"kind": "torch"' && ok "copied torch file coded per storage" \
	|| fail "copied torch file stored opaque"
"$ULPACK" stat "$A" hostile --json | grep -q '"kind": "torch"' && fail "hostile torch file coded per storage" \
	|| ok "hostile torch file stored opaque"
"$ULPACK" verify "$A" > /dev/null && ok verify || fail verify
finish
