#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_write.sh - archiving through the mount: rsync -a of an HF-Trainer-like
# tree, remount, rsync -ac finds nothing, a second rsync -a sends nothing,
# steps parsed and nearest-step references used; the same with rsync --inplace,
# cp -a, tar -x and Python; malformed safetensors kept as is; empty
# directories survive remount; a battery of POSIX calls; reads of other files
# go on while a large file is being archived.
. "$(dirname "$0")/lib.sh"
need_fuse
command -v rsync > /dev/null || skip "no rsync (apt-get install rsync)"

A="$T/arch" M="$T/mnt" R="$T/run"
"$ULPACK" init "$A" > /dev/null
"$ULPACK" synth "$R" --steps 3 --dim 128 --interval 500 || fail synth
for s in 500 1000 1500; do
	d="$R/checkpoint-$s"
	printf '{"architectures": ["TinyLM"], "hidden_size": 128}\n' > "$d/config.json"
	head -c 300000 /dev/urandom > "$d/optimizer.pt"
	head -c 1000 /dev/urandom > "$d/scheduler.pt"
	head -c 14000 /dev/urandom > "$d/rng_state.pth"
	printf '{"global_step": %d, "log_history": []}\n' "$s" > "$d/trainer_state.json"
done
mkdir -p "$R/empty/nested"
printf 'not json at all' > "$R/notes with spaces ü.txt"
mount_fs "$A" "$M" || { fail mount; finish; }
rsync -a "$R/" "$M/run/" && ok "rsync -a into the mount" || fail "rsync -a"
umount_fs "$M"
mount_fs "$A" "$M" || fail remount
n=$(rsync -ac --itemize-changes "$R/" "$M/run/" | wc -l)
[ "$n" = 0 ] && ok "after remount rsync -ac finds no difference" || fail "rsync -ac: $n changes"
n=$(rsync -a --itemize-changes "$R/" "$M/run/" | wc -l)
[ "$n" = 0 ] && ok "a second rsync -a sends nothing" || fail "second rsync -a: $n changes"
diff -r -x latest "$R" "$M/run" > /dev/null && ok "tree identical" || fail "tree differs"
[ -d "$M/run/empty/nested" ] && ok "empty directories survive remount" || fail "empty dir lost"
"$PY" - "$M/run" <<'PYEOF' && ok "steps parsed, the newest step an anchor" || fail "steps/references"
import os, sys
r = sys.argv[1]
depth = {}
for s in (500, 1000, 1500):
    p = os.path.join(r, "checkpoint-%d/model.safetensors" % s)
    assert os.getxattr(p, "user.ulpack.step") == str(s).encode()
    depth[s] = int(os.getxattr(p, "user.ulpack.chain_depth"))
    assert os.getxattr(os.path.join(r, "checkpoint-%d/optimizer.pt" % s), "user.ulpack.step") == str(s).encode()
# rsync sends checkpoint-1000 first (name order), then 1500 and 500; the layout
# of the series (ulpack-format(5)) makes the newest step the anchor, 1000 a
# delta against 1500 and 500 against 1000 once the mount's background
# re-coding ran
assert depth[1500] == 0 and depth[1000] in (0, 1) and depth[500] in (0, 1, 2), depth
PYEOF

rsync -a --inplace "$R/" "$M/inplace/" && diff -r -x latest "$R" "$M/inplace" > /dev/null && ok "rsync --inplace" || fail "--inplace"
cp -a "$R" "$M/cp" && diff -r -x latest "$R" "$M/cp" > /dev/null && ok "cp -a" || fail "cp -a"
( cd "$T" && tar cf - run ) | ( mkdir -p "$M/tar" && cd "$M/tar" && tar xf - ) && diff -r -x latest "$R" "$M/tar/run" > /dev/null \
	&& ok "tar -x" || fail "tar -x"
dd if="$R/checkpoint-500/model.safetensors" of="$M/dd.safetensors" bs=65536 status=none \
	&& cmp -s "$R/checkpoint-500/model.safetensors" "$M/dd.safetensors" && ok "dd" || fail "dd"
"$PY" - "$M" "$R" <<'PYEOF' && ok "Python file objects" || fail "python writes"
import os, sys
m, r = sys.argv[1], sys.argv[2]
data = open(os.path.join(r, "checkpoint-1500/model.safetensors"), "rb").read()
os.makedirs(os.path.join(m, "py/checkpoint-2000"), exist_ok=True)
with open(os.path.join(m, "py/checkpoint-2000/model.safetensors"), "wb") as f:
    for i in range(0, len(data), 777):
        f.write(data[i:i + 777])
assert open(os.path.join(m, "py/checkpoint-2000/model.safetensors"), "rb").read() == data
PYEOF

# malformed safetensors: stored opaque, byte-identical
"$PY" -c '
import struct, sys
h = b"{\"a\":{\"dtype\":\"F32\",\"shape\":[1000],\"data_offsets\":[0,4000]}}"
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(100))' "$T/bad.safetensors"
printf 'short' > "$T/trunc.safetensors"
cp "$T/bad.safetensors" "$T/trunc.safetensors" "$M/" && cmp -s "$T/bad.safetensors" "$M/bad.safetensors" \
	&& cmp -s "$T/trunc.safetensors" "$M/trunc.safetensors" && ok "malformed safetensors accepted as opaque files" || fail "malformed"

"$PY" - "$M" <<'PYEOF' && ok "POSIX battery" || fail "POSIX battery"
import errno, os, stat, sys, time
m = sys.argv[1]
d = os.path.join(m, "posix")
os.mkdir(d, 0o750)
assert stat.S_IMODE(os.stat(d).st_mode) == 0o750
p = os.path.join(d, "f")
fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o640)
os.pwrite(fd, b"hello world", 0)
os.pwrite(fd, b"XY", 100)                    # sparse
os.fsync(fd)
os.ftruncate(fd, 50)
os.close(fd)
assert open(p, "rb").read() == b"hello world" + bytes(39)
assert stat.S_IMODE(os.stat(p).st_mode) == 0o640
with open(p, "r+b") as f:                    # rewrite in place
    f.seek(6); f.write(b"WORLD")
assert open(p, "rb").read()[:11] == b"hello WORLD"
os.truncate(p, 5)
assert open(p, "rb").read() == b"hello"
os.chmod(p, 0o600)
assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
os.chown(p, 1234, 5678)
assert (os.stat(p).st_uid, os.stat(p).st_gid) == (1234, 5678)
os.utime(p, ns=(1_000_000_000, 1_500_000_000_123))
assert os.stat(p).st_mtime_ns == 1_500_000_000_123
q = os.path.join(d, "g")
open(q, "wb").write(b"other")
os.rename(q, p)                              # over an existing file
assert open(p, "rb").read() == b"other" and not os.path.exists(q)
os.symlink("f", os.path.join(d, "l"))
assert os.readlink(os.path.join(d, "l")) == "f" and open(os.path.join(d, "l"), "rb").read() == b"other"
try:
    os.link(p, os.path.join(d, "h")); raise SystemExit("link succeeded")
except OSError as e:
    assert e.errno == errno.EPERM
os.mkdir(os.path.join(d, "sub"))
open(os.path.join(d, "sub", "x"), "wb").write(b"x")
try:
    os.rmdir(os.path.join(d, "sub")); raise SystemExit("rmdir of non-empty dir")
except OSError as e:
    assert e.errno in (errno.ENOTEMPTY, errno.EEXIST)
os.rename(os.path.join(d, "sub"), os.path.join(d, "sub2"))   # directory rename
assert open(os.path.join(d, "sub2", "x"), "rb").read() == b"x"
os.unlink(os.path.join(d, "sub2", "x"))
os.rmdir(os.path.join(d, "sub2"))
os.unlink(os.path.join(d, "l"))
os.unlink(p)
assert sorted(os.listdir(d)) == []
# names are bytes: odd but legal names round-trip ('..' never reaches the
# file system: the kernel resolves it; the library refuses it, test_archive)
for name in ("a b", "ü\u00e9", "x" * 200, ".hidden", "-dash"):
    open(os.path.join(d, name), "wb").write(name.encode())
    assert open(os.path.join(d, name), "rb").read() == name.encode()
assert len(os.listdir(d)) == 5
PYEOF

# reads of other files go on while a large file is being archived: no stat,
# open or read of another file waits for the archiving of the large one
"$ULPACK" synth "$T/big" --steps 1 --dim 1024 || fail synth
"$PY" - "$T/big/checkpoint-100/model.safetensors" "$M/big.safetensors" "$M/run/checkpoint-500/config.json" \
	"$R/checkpoint-500/config.json" "$ULPACK" "$M" <<'PYEOF' && ok "other files served while a large file is archived" || fail "reads during ingest"
import os, shutil, subprocess, sys, threading, time
src, dst, other, want, ulpack, mnt = sys.argv[1:7]
want = open(want, "rb").read()
done, lat = [False], []
def copy():
    t0 = time.time()
    shutil.copyfile(src, dst)          # its close queues it for archiving
    subprocess.run([ulpack, "sync", mnt], check=True, stdout=subprocess.DEVNULL)  # until archived
    done[0] = time.time() - t0
th = threading.Thread(target=copy); th.start()
while not done[0]:
    t0 = time.time()
    os.stat(other)
    assert open(other, "rb").read() == want
    lat.append(time.time() - t0)
    time.sleep(0.005)
th.join()
assert open(dst, "rb").read() == open(src, "rb").read()
print("copy+archive %.2f s, %d reads meanwhile, slowest %.3f s" % (done[0], len(lat), max(lat)))
assert len(lat) >= 10 and max(lat) < done[0] / 3, (len(lat), max(lat))
PYEOF
# rename archives in the background (ulpackfs(1)): right after the rename the
# file reads back, and a chmod, utimens and a second rename that arrive while
# it is being archived are all kept
"$PY" - "$T/big/checkpoint-100/model.safetensors" "$M" <<'PYEOF' && ok "renamed file served and changed while archived in the background" || fail "background archiving"
import os, shutil, sys
src, m = sys.argv[1:3]
want = open(src, "rb").read()
tmp, fin, fin2 = (os.path.join(m, n) for n in (".bg.safetensors.Xy12Z9", "bg.safetensors", "bg2.safetensors"))
shutil.copyfile(src, tmp)
os.rename(tmp, fin)
assert os.stat(fin).st_size == len(want) and open(fin, "rb").read() == want
os.chmod(fin, 0o640)
os.utime(fin, ns=(1_600_000_000_000_000_123, 1_600_000_000_000_000_123))
os.rename(fin, fin2)
assert not os.path.exists(fin) and open(fin2, "rb").read() == want
PYEOF
umount_fs "$M"
mount_fs "$A" "$M" || fail remount
"$PY" - "$T/big/checkpoint-100/model.safetensors" "$M" <<'PYEOF' && ok "after remount: final name, bytes, mode and mtime as set" || fail "background archiving after remount"
import os, sys
src, m = sys.argv[1:3]
p = os.path.join(m, "bg2.safetensors")
st = os.stat(p)
assert not os.path.exists(os.path.join(m, "bg.safetensors"))
assert open(p, "rb").read() == open(src, "rb").read()
assert st.st_mode & 0o7777 == 0o640, oct(st.st_mode)
assert st.st_mtime_ns == 1_600_000_000_000_000_123, st.st_mtime_ns
assert os.getxattr(p, "user.ulpack.sha256")
PYEOF
# a remount right after fusermount3 -u (which returns before the daemon has
# archived what is queued) waits for the previous daemon: nothing is missed
cp "$T/big/checkpoint-100/model.safetensors" "$M/.late.safetensors.Q1w2E3" \
	&& mv "$M/.late.safetensors.Q1w2E3" "$M/late.safetensors" || fail "late file"
fusermount3 -u "$M"
mount_fs "$A" "$M" 2> "$T/wait" || fail "remount right after unmount"
cmp -s "$T/big/checkpoint-100/model.safetensors" "$M/late.safetensors" && [ -z "$(ls "$A/staging")" ] \
	&& ok "a remount right after unmount waits for the previous daemon's archiving" \
	|| fail "late file after a quick remount: $(cat "$T/wait")"
# a closed file whose name looks like an rsync temporary is kept at unmount
printf 'precious\n' > "$M/.notes.abc123"
ls -la "$M" > /dev/null 2> "$T/lserr" && [ ! -s "$T/lserr" ] || fail "ls -la of a staged file: $(cat "$T/lserr")"
umount_fs "$M"
mount_fs "$A" "$M" || fail remount
[ "$(cat "$M/.notes.abc123" 2>/dev/null)" = precious ] && ok "a closed temporary-looking file survives unmount" \
	|| fail "temporary-looking file lost"
umount_fs "$M"
"$ULPACK" verify "$A" > "$T/v" && ok "$(cat "$T/v")" || fail "verify: $(cat "$T/v")"
[ -z "$(ls "$A/staging")" ] && ok "staging empty" || fail "staging leftovers: $(ls "$A/staging")"
finish
