#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_names_times.sh - names and times the mount must refuse or keep
# (issue 11, items 16 and 17): a name over 255 bytes gives ENAMETOOLONG for
# create, mkdir, symlink, link and a rename target, a path over 4095 bytes
# ENAMETOOLONG (not EINVAL), ulpack import reports such a name; a time before
# 1970 with a fraction comes back exact after a remount and through ulpack
# export, one after 2262 is clamped to 2262 rather than wrapping around.
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
printf a > "$M/1960" && touch -d '1960-01-01 00:00:00.5' "$M/1960" || fail "touch -d 1960"
printf b > "$M/2300" && touch -d '2300-01-01' "$M/2300" || fail "touch -d 2300"
printf c > "$M/u1960" && printf d > "$M/u2300" && "$PY" -c "
import os
os.utime('$M/u1960', ns=(0, -315619199500000000))
os.utime('$M/u2300', ns=(0, 10413792000 * 10**9))" || fail "utimensat by path"
mkdir "$M/dir1969" && touch -d '1969-12-31 23:59:59.25' "$M/dir1969" || fail "touch -d 1969 (directory)"
umount_fs "$M"
mount_fs "$A" "$M" || { fail remount; finish; }
"$PY" - "$M" <<'PYEOF' && ok "times before 1970 with a fraction, after 2262 (clamped), after a remount" || fail "times"
import os, sys
m = sys.argv[1]
want = {"u1960": -315619199500000000, "1960": -315619199500000000, "dir1969": -750000000,
        "u2300": 2**63 - 1, "2300": 2**63 - 1}  # 2300 clamped to 2262-04-11
got = {n: os.stat(os.path.join(m, n)).st_mtime_ns for n in want}
bad = {n: (got[n], want[n]) for n in want if got[n] != want[n]}
assert not bad, "got, wanted: %r" % bad
PYEOF
umount_fs "$M"
"$ULPACK" export "$A" u1960 "$T/out1960" > /dev/null 2>&1 || fail "export"
"$PY" - "$T/out1960" <<'PYEOF' && ok "ulpack export restores a time before 1970 with a fraction" || fail "export time"
import os, sys
t = os.stat(sys.argv[1]).st_mtime_ns
assert t == -315619199500000000, t
PYEOF
finish
