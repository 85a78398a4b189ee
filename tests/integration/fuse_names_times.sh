#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_names_times.sh - names and times the mount must refuse or keep
# (issue 11, items 16 and 17): a name over 255 bytes gives ENAMETOOLONG for
# create, mkdir, symlink, link and a rename target, a path over 4095 bytes
# ENAMETOOLONG (not EINVAL), ulpack import reports such a name. Times come
# back exact over the whole range the kernel holds (int64 seconds and
# nanoseconds; at the two ends it drops the nanoseconds itself): 1900 with a
# fraction, the last nanosecond before 1970, 2300-01-01 00:00:00.5 (past
# int64 nanoseconds), 2446-05-10 (ext4's last second), the first and last
# int64 second; set by path, on an open file and on a directory; live, after
# a remount, in ulpack ls and stat --json, through ulpack export, and from
# staging after a kill -9 of the daemon.
. "$(dirname "$0")/lib.sh"
need_fuse

A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }
"$PY" - "$M" <<'PYEOF' && ok "names over 255 bytes and paths over 4095: ENAMETOOLONG" || fail "long names"
import errno, os, sys
m = sys.argv[1]
long = "n" * 256
ok255 = os.path.join(m, "o" * 255)
open(ok255, "wb").write(b"255")
def refused(what, f):
    try:
        f()
    except OSError as e:
        assert e.errno == errno.ENAMETOOLONG, (what, e)
        return
    raise AssertionError(what + " accepted a 256-byte name")
refused("create", lambda: open(os.path.join(m, long), "wb").close())
refused("mkdir", lambda: os.mkdir(os.path.join(m, long)))
refused("symlink", lambda: os.symlink("t", os.path.join(m, long)))
refused("link", lambda: os.link(ok255, os.path.join(m, long)))
refused("rename", lambda: os.rename(ok255, os.path.join(m, long)))
refused("stat", lambda: os.stat(os.path.join(m, long)))
assert open(ok255, "rb").read() == b"255"
assert sorted(os.listdir(m)) == ["o" * 255], os.listdir(m)
# deeper than PATH_MAX, walked down relative to the working directory
os.chdir(m)
depth = 0
try:
    for depth in range(40):
        os.mkdir("d" * 200)
        os.chdir("d" * 200)
except OSError as e:
    assert e.errno == errno.ENAMETOOLONG, (depth, e)
    assert depth * 201 > 3800, depth
else:
    raise AssertionError("a path of 8000 bytes was accepted")
try:
    open("f", "wb").close()
except OSError as e:
    assert e.errno == errno.ENAMETOOLONG, e
PYEOF

# times (TZ=UTC: the dates below are UTC)
export TZ=UTC
# name: seconds, nanoseconds set, nanoseconds the kernel passes on
cat > "$T/times.py" <<'PYEOF'
TIMES = {"1900": (-2208988800, 250000000), "1969": (-1, 999999999), "2300": (10413792000, 500000000),
         "2446": (15032385535, 999999999), "min": (-2**63, 0), "max": (2**63 - 1, 999999999)}
def ns(name):
    s, n = TIMES[name]
    return s * 10**9 + (0 if name in ("min", "max") else n)  # the kernel's clamp drops them there
def check(got):  # got: name -> st_mtime_ns; raises with what differs
    bad = {k: (v, ns(k.lstrip("pfdrs"))) for k, v in got.items() if v != ns(k.lstrip("pfdrs"))}
    assert not bad, "got, wanted: %r" % bad
PYEOF
"$PY" - "$M" "$T" <<'PYEOF' || fail "setting times"
import os, sys
m, t = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
from times import TIMES
for name, (s, n) in TIMES.items():
    p = os.path.join(m, "p" + name)  # utimensat by path on an archived file
    open(p, "wb").write(b"p")
    os.utime(p, ns=(0, s * 10**9 + n))
    fd = os.open(os.path.join(m, "f" + name), os.O_CREAT | os.O_WRONLY, 0o644)  # futimens while written
    os.write(fd, b"f")
    os.utime(fd, ns=(0, s * 10**9 + n))
    os.close(fd)
    d = os.path.join(m, "d" + name)
    os.mkdir(d)
    os.utime(d, ns=(0, s * 10**9 + n))
PYEOF
printf a > "$M/1960" && touch -d '1960-01-01 00:00:00.5' "$M/1960" || fail "touch -d 1960"
printf b > "$M/2300" && touch -d '2300-01-01 00:00:00.5' "$M/2300" || fail "touch -d 2300"
printf c > "$M/1900" && touch -d '1900-01-01 00:00:00.25' "$M/1900" || fail "touch -d 1900"
mkdir "$M/dir1969" && touch -d '1969-12-31 23:59:59.999999999' "$M/dir1969" || fail "touch -d 1969 (directory)"
cat > "$T/check.py" <<'PYEOF'
import os, sys
m, t = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
from times import TIMES, check
check({k + n: os.stat(os.path.join(m, k + n)).st_mtime_ns for n in TIMES for k in "pfd"})
touched = {"1960": -315619199500000000, "2300": 10413792000500000000, "1900": -2208988799750000000,
           "dir1969": -1}
got = {n: os.stat(os.path.join(m, n)).st_mtime_ns for n in touched}
assert got == touched, "touch -d: got %r, wanted %r" % (got, touched)
PYEOF
"$PY" "$T/check.py" "$M" "$T" && ok "times exact through the mount" || fail "times through the mount"
umount_fs "$M"
mount_fs "$A" "$M" || { fail remount; finish; }
"$PY" "$T/check.py" "$M" "$T" && ok "times exact after a remount (1900.25, 1969.999999999, 2300.5, 2446, int64 ends)" \
	|| fail "times after a remount"
umount_fs "$M"
"$ULPACK" ls "$A" > "$T/ls.out" 2>&1 || fail "ulpack ls"
grep -q ' 2300-01-01 00:00 2300$' "$T/ls.out" && grep -q ' 1900-01-01 00:00 1900$' "$T/ls.out" &&
	grep -q ' @9223372036854775807 pmax$' "$T/ls.out" && grep -q ' 2446-05-10 22:38 p2446$' "$T/ls.out" &&
	ok "ulpack ls shows 1900, 2300, 2446 and the last int64 second" || fail "ulpack ls: $(cat "$T/ls.out")"
"$ULPACK" stat "$A" --json > "$T/stat.json" || fail "ulpack stat --json"
"$PY" - "$T/stat.json" "$T" <<'PYEOF' && ok "ulpack stat --json gives exact seconds and nanoseconds" || fail "stat --json times"
import json, sys
sys.path.insert(0, sys.argv[2])
from times import TIMES, check
files = {f["path"]: f for f in json.load(open(sys.argv[1]))["files"]}
check({k + n: files[k + n]["mtime_sec"] * 10**9 + files[k + n]["mtime_nsec"] for n in TIMES for k in "pf"})
assert (files["2300"]["mtime_sec"], files["2300"]["mtime_nsec"]) == (10413792000, 500000000), files["2300"]
PYEOF
# export: each time as exact as a utimensat on the destination's file system
# stores it (ext4 holds 1901-12-13 to 2446-05-10, tmpfs the int64 seconds)
mkdir "$T/out" && "$ULPACK" export "$A" "" "$T/out/all" > /dev/null 2>&1 || fail "export"
"$PY" - "$T/out" "$T" <<'PYEOF' && ok "ulpack export restores each time as the destination holds it" || fail "export times"
import os, sys
o, t = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
from times import TIMES, ns
bad, exact = {}, 0
for n in TIMES:
    probe = os.path.join(o, "probe")
    open(probe, "wb").close()
    os.utime(probe, ns=(0, ns(n)))
    want = os.stat(probe).st_mtime_ns
    exact += want == ns(n)
    for k in "pfd":
        got = os.stat(os.path.join(o, "all", k + n)).st_mtime_ns
        if got != want:
            bad[k + n] = (got, want)
assert not bad, "got, wanted: %r" % bad
assert os.stat(os.path.join(o, "all", "1960")).st_mtime_ns == -315619199500000000
# 1969.999999999 and 2300.5 fit ext4, xfs (bigtime), btrfs and tmpfs
assert os.stat(os.path.join(o, "all", "p2300")).st_mtime_ns == 10413792000500000000
assert os.stat(os.path.join(o, "all", "f1969")).st_mtime_ns == -1
print("# %d of %d times exact on the destination" % (exact, len(TIMES)))
PYEOF

# crash recovery from staging: a file fsynced and held open, and one closed
# under an rsync temporary name, each with a time set while open; kill -9
mount_fs "$A" "$M" || { fail "mount for kill -9"; finish; }
pid=$(fs_pid "$M")
PYTHONPATH="$IT_DIR" "$PY" - "$M" "$T" <<'PYEOF' &
import os, sys
from crash_writer import hold_until_go
m, t = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
from times import TIMES
held = []
for name, (s, n) in TIMES.items():
    fd = os.open(os.path.join(m, "s" + name), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"synced")
    os.utime(fd, ns=(0, s * 10**9 + n))
    os.fsync(fd)
    held.append(fd)
    fd = os.open(os.path.join(m, ".r%s.Ab12cD" % name), os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"temp")
    os.utime(fd, ns=(0, s * 10**9 + n))
    os.close(fd)
hold_until_go(t, held)
PYEOF
wpid=$!
wait_ready "$wpid" || fail "the writer did not get ready"
crash_remount "$pid" "$A" "$M" "$wpid"
"$PY" - "$M" "$T" <<'PYEOF' && ok "times exact after a kill -9, from staging" || fail "times after kill -9"
import os, sys
m, t = sys.argv[1], sys.argv[2]
sys.path.insert(0, t)
from times import TIMES, check
got = {"s" + n: os.stat(os.path.join(m, "s" + n)).st_mtime_ns for n in TIMES}
got.update({"r" + n: os.stat(os.path.join(m, ".r%s.Ab12cD" % n)).st_mtime_ns for n in TIMES})
check(got)
assert open(os.path.join(m, "s2300"), "rb").read() == b"synced"
PYEOF
finish
