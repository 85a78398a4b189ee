#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_sync.sh - issue 12: close returns before archiving; `ulpack sync MNT`
# is the barrier (everything closed before it is in the index); a file's
# user.ulpack.state and the root's archiving counters; kill -9 right after
# close recovers the file from staging.
. "$(dirname "$0")/lib.sh"
need_fuse
A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }
head -c 3000000 /dev/urandom > "$T/f.bin"
for i in 1 2 3; do cp "$T/f.bin" "$M/f$i.bin"; done
"$ULPACK" sync "$M" > "$T/out" && ok "ulpack sync: $(cat "$T/out")" || fail "sync: $(cat "$T/out")"
"$PY" - "$M" <<'PYEOF' && ok "state archived, counters" || fail "state/counters"
import os, sys
m = sys.argv[1]
for i in (1, 2, 3):
    assert os.getxattr(os.path.join(m, "f%d.bin" % i), "user.ulpack.state") == b"archived"
v = os.getxattr(m, "user.ulpack.counters").decode().split()
c = dict(zip(v[0::2], map(int, v[1::2])))
assert c["archived"] == 3 and c["queued"] == 0 and c["archived_bytes"] == 9000000, c
PYEOF
umount_fs "$M"
"$ULPACK" ls "$A" | grep -c 'f[123].bin' | grep -q 3 && ok "all three in the index" || fail "index"
# kill -9 right after close(): recovered at the next mount
mount_fg "$A" "$M" 2> "$T/fs.err" || fail "mount in the foreground"
cp "$T/f.bin" "$M/k.bin" && crash_fs "$FS_PID" "$M"
mount_fs "$A" "$M" || fail remount
cmp -s "$T/f.bin" "$M/k.bin" && ok "closed file survives kill -9 of ulpackfs" || fail "k.bin lost"
"$ULPACK" sync "$M" > /dev/null || fail "sync after recovery"
umount_fs "$M"
"$ULPACK" verify "$A" > "$T/v" && ok "$(cat "$T/v")" || fail "verify: $(cat "$T/v")"
"$ULPACK" sync "$T" 2> "$T/e" && fail "sync of a plain directory" || ok "not a mount: $(cat "$T/e")"
# Writes never wait for an archiving. The kernel asks for security.capability
# before each write(2) through the page cache; that getxattr waited until the
# file's queued archiving was done (a file queued by the close of a dup'd
# descriptor, as in shell redirection, while writes go on through the other).
# ULP_SESSION_HOLD=1 (a measuring knob) holds archiving back until a sync:
# before the fix the writes below hung.
"$ULPACK" init "$T/arch2" > /dev/null
ULP_SESSION_HOLD=1 mount_fs "$T/arch2" "$M" || fail "mount with archiving held"
# (a request the daemon never answers cannot be interrupted: a watchdog kills
# the daemon instead, which ends the mount and the test's writes with ENOTCONN)
fpid=$(fs_pid "$M")
(sleep 20; kill -9 "$fpid") > /dev/null 2>&1 &
wd=$!
"$PY" - "$M" <<'PYEOF' && ok "writes after a dup'd close, getxattr of other names: no wait" || fail "writes waited"
import errno, os, sys
m = sys.argv[1]
p = os.path.join(m, "dup.bin")
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)  # read-write: through the page cache
fd2 = os.dup(fd)
os.close(fd)                                     # close(): recorded and queued
for i in range(8):
    assert os.write(fd2, bytes([i]) * 65536) == 65536
try:
    os.getxattr(p, "security.capability")
    raise SystemExit("security.capability exists")
except OSError as e:
    assert e.errno == errno.ENODATA, e
os.close(fd2)
PYEOF
kill "$wd" 2> /dev/null
"$ULPACK" sync "$M" > /dev/null && ok "sync archives what was held" || fail "sync with archiving held"
"$PY" -c 'import os, sys; d = open(sys.argv[1], "rb").read(); assert d == b"".join(bytes([i]) * 65536 for i in range(8))' \
	"$M/dup.bin" && ok "dup.bin whole" || fail "dup.bin differs"
umount_fs "$M"
# A file closed through a dup'd descriptor while the other one writes on
# (shell redirection, dd) is archived once, with its final bytes, at the last
# close: not while it is open for writing, even after the archiver's 1 s wait
# for writers; `ulpack sync` does not wait for it meanwhile.
"$ULPACK" init "$T/arch3" > /dev/null
mount_fs "$T/arch3" "$M" || fail "mount for the dup'd close"
"$PY" - "$M" "$ULPACK" <<'PYEOF' && ok "dup'd close: archived once, at the last close, final bytes" || fail "dup'd close"
import os, subprocess, sys, time
m, ulpack = sys.argv[1], sys.argv[2]
def counters():
    v = os.getxattr(m, "user.ulpack.counters").decode().split()
    return dict(zip(v[0::2], map(int, v[1::2])))
p = os.path.join(m, "dd.bin")
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
fd2 = os.dup(fd)
os.close(fd)                                   # queued, but still open for writing
for i in range(6):
    assert os.write(fd2, bytes([i + 1]) * 65536) == 65536
    time.sleep(0.25)
subprocess.run([ulpack, "sync", m], check=True, timeout=20, stdout=subprocess.DEVNULL)
c = counters()
assert c["archived"] == 0, c
assert os.getxattr(p, "user.ulpack.state").decode().startswith("staged"), os.getxattr(p, "user.ulpack.state")
os.fsync(fd2)
assert os.write(fd2, b"end") == 3
os.close(fd2)
subprocess.run([ulpack, "sync", m], check=True, timeout=20, stdout=subprocess.DEVNULL)
c = counters()
want = b"".join(bytes([i + 1]) * 65536 for i in range(6)) + b"end"
assert c["archived"] == 1 and c["archived_bytes"] == len(want), c
assert os.getxattr(p, "user.ulpack.state") == b"archived"
assert open(p, "rb").read() == want
PYEOF
# shell redirection: bash opens the file, dup2()s it onto stdout and closes
# the first descriptor (a FUSE flush), then writes (dash opens it as fd 1)
archived() { "$PY" -c 'import os, sys; v = os.getxattr(sys.argv[1], "user.ulpack.counters").decode().split(); print(v[v.index("archived") + 1])' "$M"; }
before=$(archived)
bash -c 'exec > "$1"; "$2" sync "$3" > /dev/null; echo final' sh "$M/redir.txt" "$ULPACK" "$M"
"$ULPACK" sync "$M" > /dev/null || fail "sync after a redirection"
"$PY" - "$M" "$before" <<'PYEOF' && ok "shell redirection: archived once, whole" || fail "redirection"
import os, sys
m = sys.argv[1]
v = os.getxattr(m, "user.ulpack.counters").decode().split()
c = dict(zip(v[0::2], map(int, v[1::2])))
assert c["archived"] == int(sys.argv[2]) + 1, (sys.argv[2], c)
assert open(os.path.join(m, "redir.txt"), "rb").read() == b"final\n"
assert os.getxattr(os.path.join(m, "redir.txt"), "user.ulpack.state") == b"archived"
PYEOF

# ---- issue 28 items 15, 16: `latest` names a whole step; copies see each step once
"$ULPACK" synth "$T/run" --steps 3 --dim 64 > /dev/null
cp -r "$T/run" "$M/run" && mkdir "$M/lit" || fail "copy the run in"
cp "$T/run/checkpoint-100/model.safetensors" "$M/lit/epoch=0-step=100.ckpt"
cp "$T/run/checkpoint-200/model.safetensors" "$M/lit/epoch=1-step=200.ckpt"
echo lr: 1 > "$M/lit/hparams.yaml"
# latest -> $2 within 2 s (a writer's release reaches the daemon after close returns)
latest_is() {
	for _ in $(seq 20); do [ "$(readlink "$1/latest")" = "$2" ] && return 0; sleep 0.1; done
	return 1
}
latest_is "$M/run" checkpoint-300 && ok "run/latest -> checkpoint-300" || fail "latest -> $(readlink "$M/run/latest")"
latest_is "$M/lit" "epoch=1-step=200.ckpt" && ok "step files: lit/latest -> the newest one" \
	|| fail "lit/latest -> $(readlink "$M/lit/latest")"
exec 3> "$M/run/checkpoint-300/model.safetensors"
cat "$T/run/checkpoint-300/model.safetensors" >&3
[ "$(readlink "$M/run/latest")" = checkpoint-200 ] && ok "a step with a file open for writing is passed over" \
	|| fail "latest -> $(readlink "$M/run/latest") while checkpoint-300 is written"
exec 4> "$M/lit/epoch=2-step=300.ckpt"
[ "$(readlink "$M/lit/latest")" = "epoch=1-step=200.ckpt" ] && ok "a step file open for writing is passed over" \
	|| fail "lit/latest -> $(readlink "$M/lit/latest") while a step file is written"
exec 3>&- 4>&-
latest_is "$M/run" checkpoint-300 && latest_is "$M/lit" "epoch=2-step=300.ckpt" && ok "latest once they are closed" \
	|| fail "latest after the close: $(readlink "$M/run/latest") $(readlink "$M/lit/latest")"
cmp -s "$M/run/latest/model.safetensors" "$T/run/checkpoint-300/model.safetensors" && [ -d "$M/run/latest/" ] \
	&& ls "$M/run/latest/" | grep -qx model.safetensors && ok "reads, cd and ls through latest" || fail "through latest"
ls -a "$M/run" "$M/lit" | grep -qx latest && fail "latest listed by ls" || ok "latest not listed (found by name only)"
"$PY" - "$M/run" "$T/copy" <<'PYEOF' && ok "shutil.copytree of a run copies each checkpoint once" || fail "copytree"
import os, shutil, sys
shutil.copytree(sys.argv[1], sys.argv[2])
n = sum(f == "model.safetensors" for _, _, fs in os.walk(sys.argv[2]) for f in fs)
assert n == 3 and not os.path.lexists(os.path.join(sys.argv[2], "latest")), (n, sorted(os.listdir(sys.argv[2])))
PYEOF
rsync -ai --delete "$M/run/" "$T/rs/" > "$T/rs1" && rsync -ai --delete "$M/run/" "$T/rs/" > "$T/rs2" \
	|| fail "rsync out of the mount"
grep -q latest "$T/rs1" "$T/rs2" && fail "rsync -ai --delete: $(grep latest "$T/rs1" "$T/rs2")" \
	|| ok "rsync -ai --delete out of the mount, twice: nothing about latest"
umount_fs "$M"
finish
