#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_open_files.sh - open files whose name changes under them (issue 11,
# items 1, 6, 7): every operation on a file unlinked while open works until
# its last close, after which nothing of it remains (no crash of the daemon
# on libfuse's NULL path); a file renamed while open for writing is archived
# under its new name only; futimens, fchmod and touch on an archived file
# opened for writing, with nothing written, are kept after a remount.
. "$(dirname "$0")/lib.sh"
need_fuse

A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }
printf 'archived v1' > "$M/old.txt"
printf 'renamed v1' > "$M/ren.txt"
printf 'touched' > "$M/touch.txt"
printf 'touched -d' > "$M/touchd.txt"
printf 'attrs' > "$M/attrs.txt"
printf 'ro' > "$M/ro.txt"
printf 'rw' > "$M/rw.txt"
printf 'replaced v1' > "$M/repl.txt"
umount_fs "$M"
mount_fs "$A" "$M" || { fail remount; finish; }

# item 1: the issue's repro
"$PY" -c "import tempfile; f=tempfile.TemporaryFile(dir='$M'); f.write(b'x'); f.seek(0); assert f.read() == b'x'" \
	&& ok "TemporaryFile in the mount" || fail "TemporaryFile"
mountpoint -q "$M" && ls "$M" > /dev/null && ok "daemon alive after it" || { fail "daemon died"; finish; }

"$PY" - "$M" <<'PYEOF' && ok "every operation on unlinked open files" || fail "unlinked open files"
import mmap, os, sys
m = sys.argv[1]
# a new file, staged: unlinked while open
p = os.path.join(m, "new.bin")
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.write(fd, b"hello world")
os.unlink(p)
assert not os.path.exists(p)
assert os.fstat(fd).st_size == 11
assert os.pread(fd, 100, 0) == b"hello world"
assert os.pwrite(fd, b"XY", 20) == 2 and os.fstat(fd).st_size == 22
os.ftruncate(fd, 5)
assert os.fstat(fd).st_size == 5
os.fchmod(fd, 0o600)
assert os.fstat(fd).st_mode & 0o7777 == 0o600
os.utime(fd, ns=(1, 1234567890123456789))
assert os.fstat(fd).st_mtime_ns == 1234567890123456789
os.fsync(fd)
mp = mmap.mmap(fd, 5)
assert mp[:] == b"hello"
mp.close()
os.close(fd)
# an archived file read through a read-only handle, unlinked while open
p = os.path.join(m, "ro.txt")
fd = os.open(p, os.O_RDONLY)
os.unlink(p)
assert os.fstat(fd).st_size == 2 and os.pread(fd, 10, 0) == b"ro"
os.fchmod(fd, 0o640)
assert os.fstat(fd).st_mode & 0o7777 == 0o640
os.utime(fd, ns=(1, 1000000000))
assert os.fstat(fd).st_mtime_ns == 1000000000
assert os.pread(fd, 10, 0) == b"ro"
os.close(fd)
# an archived file opened for writing, unlinked, then written
p = os.path.join(m, "rw.txt")
fd = os.open(p, os.O_RDWR)
os.unlink(p)
os.pwrite(fd, b"RW!", 0)
assert os.pread(fd, 10, 0) == b"RW!" and os.fstat(fd).st_size == 3
os.ftruncate(fd, 1)
os.close(fd)
# an archived file replaced by a rename while a reader has it open
p = os.path.join(m, "repl.txt")
fd = os.open(p, os.O_RDONLY)
with open(os.path.join(m, "repl.new"), "wb") as f:
    f.write(b"replaced v2")
os.rename(os.path.join(m, "repl.new"), p)
assert os.pread(fd, 100, 0) == b"replaced v1", "the reader keeps its version"
assert os.fstat(fd).st_size == 11
os.close(fd)
assert open(p, "rb").read() == b"replaced v2"
# a ghost in a directory renamed while it is open
os.mkdir(os.path.join(m, "gdir"))
with open(os.path.join(m, "gdir/g.txt"), "wb") as f:
    f.write(b"ghost")
fd = os.open(os.path.join(m, "gdir/g.txt"), os.O_RDONLY)
os.unlink(os.path.join(m, "gdir/g.txt"))
os.rename(os.path.join(m, "gdir"), os.path.join(m, "gdir2"))
assert os.fstat(fd).st_size == 5 and os.pread(fd, 10, 0) == b"ghost"
os.close(fd)
os.rmdir(os.path.join(m, "gdir2"))
names = sorted(os.listdir(m))
assert not [n for n in names if n.startswith(".fuse_hidden")], names
assert "new.bin" not in names and "ro.txt" not in names and "rw.txt" not in names, names
PYEOF

# item 6: renamed while open for writing (an archived file: copy-up)
"$PY" - "$M" <<'PYEOF' && ok "rename while open for writing" || fail "rename while open for writing"
import os, sys
m = sys.argv[1]
fd = os.open(os.path.join(m, "ren.txt"), os.O_RDWR)
os.pwrite(fd, b"RENAMED", 0)
os.rename(os.path.join(m, "ren.txt"), os.path.join(m, "ren2.txt"))
os.pwrite(fd, b" v2", 10)
os.close(fd)
assert not os.path.exists(os.path.join(m, "ren.txt"))
assert open(os.path.join(m, "ren2.txt"), "rb").read() == b"RENAMED v1 v2"
PYEOF

# item 7: attributes set through an fd opened for writing, nothing written
"$PY" - "$M" <<'PYEOF' && ok "futimens and fchmod on a write fd" || fail "futimens/fchmod on a write fd"
import os, sys
fd = os.open(os.path.join(sys.argv[1], "attrs.txt"), os.O_WRONLY)
os.utime(fd, ns=(1, 1500000000123456789))
os.fchmod(fd, 0o604)
os.close(fd)
PYEOF
touch -d '2001-02-03 04:05:06' "$M/touchd.txt" || fail "touch -d"
touch -d '2001-02-03 04:05:06' "$M/touch.txt" && umount_fs "$M" && mount_fs "$A" "$M" || fail "remount"
touch "$M/touch.txt" || fail touch
umount_fs "$M"
mount_fs "$A" "$M" || { fail "remount"; finish; }

"$PY" - "$M" <<'PYEOF' && ok "after remount: nothing of the unlinked files" || fail "unlinked files after remount"
import os, sys
names = os.listdir(sys.argv[1])
assert not set(names) & {"new.bin", "ro.txt", "rw.txt"} and not [n for n in names if "fuse_hidden" in n], names
assert open(os.path.join(sys.argv[1], "repl.txt"), "rb").read() == b"replaced v2"
PYEOF
"$PY" - "$M" <<'PYEOF' && ok "after remount: the file renamed while open only under its new name" || fail "renamed file after remount"
import os, sys
m = sys.argv[1]
assert not os.path.exists(os.path.join(m, "ren.txt")), "old name still there"
assert open(os.path.join(m, "ren2.txt"), "rb").read() == b"RENAMED v1 v2"
PYEOF
"$PY" - "$M" <<'PYEOF' && ok "after remount: futimens, fchmod, touch and touch -d kept" || fail "attributes after remount"
import os, sys, time
m = sys.argv[1]
st = os.stat(os.path.join(m, "attrs.txt"))
assert st.st_mtime_ns == 1500000000123456789 and st.st_mode & 0o7777 == 0o604, (st.st_mtime_ns, oct(st.st_mode))
assert int(os.stat(os.path.join(m, "touchd.txt")).st_mtime) == int(time.mktime((2001, 2, 3, 4, 5, 6, 0, 0, -1))), "touch -d"
assert os.stat(os.path.join(m, "touch.txt")).st_mtime > time.time() - 3600, "touch"
PYEOF
n=$("$ULPACK" ls "$A" "" | grep -c -e new.bin -e ro.txt -e rw.txt -e fuse_hidden)
[ "$n" = 0 ] && ok "the archive holds none of them" || fail "$n unlinked files in the archive"
umount_fs "$M"
finish
