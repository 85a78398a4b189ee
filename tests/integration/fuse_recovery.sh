#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_recovery.sh - what a kill -9 of ulpackfs leaves is recovered as the
# writers last saw it, never older:
#  - a file fsynced and still open, then replaced by a rename or unlinked,
#    does not come back (old content, or the deleted file);
#  - files named like rsync temporaries (.notes.backup, .x.ab12Cd) but
#    closed under that name survive;
#  - staged files of a directory renamed meanwhile come back under the new
#    path, not the old one;
#  - a name with a newline comes back whole;
#  - a half-written staging sidecar (PID-N.meta.tmp) is removed;
#  - a chmod, chown and utimens after close come back with the file;
#  - the CLI sees what stays staged: ls notes it, import and rm archive it
#    first (a newer import wins, a removed file stays removed).
. "$(dirname "$0")/lib.sh"
need_fuse

A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null || fail init
mkdir -p "$A/staging"
echo "1 2 3" > "$A/staging/999999-7.meta.tmp" # a sidecar its process died writing
mount_fs "$A" "$M" || fail mount
[ -e "$A/staging/999999-7.meta.tmp" ] && fail "a dead process's PID-N.meta.tmp survives the mount's recovery" \
	|| ok "a dead process's meta.tmp is removed at mount"
mkdir -p "$M/d12/run" || fail mkdir
pid=$(fs_pid "$M")
[ -n "$pid" ] || fail "no ulpackfs pid"

# the writer holds its files open until the daemon is gone
PYTHONPATH="$IT_DIR" "$PY" - "$M" "$T" <<'PYEOF' &
import os, sys
from crash_writer import hold_until_go
m, t = sys.argv[1], sys.argv[2]
def put(name, data, keep=False, sync=False):
    fd = os.open(os.path.join(m, name), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, data)
    if sync:
        os.fsync(fd)
    if keep:
        return fd
    os.close(fd)
held = []
# item 4: fsynced, open, replaced by a completed rename
held.append(put("a4.bin", b"old content\n" * 100, keep=True, sync=True))
put("a4.new", b"new content\n" * 100)
os.rename(os.path.join(m, "a4.new"), os.path.join(m, "a4.bin"))
# item 4: fsynced, open, unlinked
held.append(put("u4.bin", b"deleted\n" * 100, keep=True, sync=True))
os.unlink(os.path.join(m, "u4.bin"))
# item 5: names like rsync temporaries, closed under that name
put(".notes.backup", b"notes\n" * 50)
put(".x.ab12Cd", b"x file\n" * 50)
# item 12: staged files of a directory renamed meanwhile
held.append(put("d12/run/f.bin", b"in a renamed dir\n" * 40, keep=True, sync=True))
put("d12/run/.y.Ab12cD", b"temp-named in a renamed dir\n" * 40)
os.rename(os.path.join(m, "d12"), os.path.join(m, "d12b"))
# item 13: a newline in a name
held.append(put("nl\nname.bin", b"newline\n" * 30, keep=True, sync=True))
hold_until_go(t, held)
PYEOF
wpid=$!
wait_ready "$wpid" || fail "the writer did not get ready"
crash_remount "$pid" "$A" "$M" "$wpid"

expect() { # expect NAME REPEAT LINE: NAME holds REPEAT lines LINE
	"$PY" - "$M/$1" "$2" "$3" <<'PYEOF'
import sys
want = (sys.argv[3] + "\n").encode() * int(sys.argv[2])
try:
    got = open(sys.argv[1], "rb").read()
except OSError as e:
    sys.exit("%r: %s" % (sys.argv[1], e))
sys.exit(0 if got == want else "%r: %d bytes, not the %d expected (%r...)" % (sys.argv[1], len(got), len(want), got[:24]))
PYEOF
}
expect a4.bin 100 "new content" && ok "a file replaced by a rename keeps its new content" \
	|| fail "item 4: the replaced file came back with its old content"
[ -e "$M/u4.bin" ] && fail "item 4: the unlinked file reappeared" || ok "an unlinked fsynced file stays deleted"
expect .notes.backup 50 notes && expect .x.ab12Cd 50 "x file" && ok "temporary-looking names closed survive kill -9" \
	|| fail "item 5: a closed file with an rsync-like name was lost"
expect d12b/run/f.bin 40 "in a renamed dir" && expect d12b/run/.y.Ab12cD 40 "temp-named in a renamed dir" \
	&& ok "staged files of a renamed directory come back under its new name" \
	|| fail "item 12: staged files of a renamed directory lost from its new name"
[ -e "$M/d12" ] && fail "item 12: the old directory came back: $(find "$M/d12" | tr '\n' ' ')" \
	|| ok "the renamed directory's old name stays gone"
expect "nl
name.bin" 30 newline && ok "a name with a newline is recovered whole" \
	|| fail "item 13: the name with a newline was not recovered: $(ls "$M" | tr '\n' '|')"
[ -z "$(ls -A "$A/staging")" ] || fail "staging not empty after recovery: $(ls -A "$A/staging")"
umount_fs "$M"
"$ULPACK" verify "$A" > "$T/v" 2>&1 && ok "$(cat "$T/v")" || fail "verify: $(cat "$T/v")"

# issue 28 item 2: cp secret x; chmod 600 x; chown; touch -d: then kill -9
# while x waits in the queue (ULP_SESSION_HOLD: nothing is archived until a
# sync): the recovered file has the mode, owner and mtime that returned
ULP_SESSION_HOLD=1 mount_fs "$A" "$M" || fail "mount with archiving held"
pid=$(fs_pid "$M")
head -c 50000 /dev/urandom > "$T/secret"
# (utime by path: touch opens the file for writing, which waits for its archiving)
cp "$T/secret" "$M/x" && chmod 600 "$M/x" && chown 1234:5678 "$M/x" &&
	"$PY" -c 'import os, sys; os.utime(sys.argv[1], (1600000000, 1600000000))' "$M/x" || fail "cp, chmod, chown, utime"
crash_remount "$pid" "$A" "$M"
got=$(stat -c '%a %u:%g %Y' "$M/x" 2>&1)
[ "$got" = "600 1234:5678 1600000000" ] && ok "chmod, chown, touch after close survive kill -9 ($got)" \
	|| fail "item 2: after kill -9 the file came back as '$got', not '600 1234:5678 1600000000'"
cmp -s "$T/secret" "$M/x" && ok "and its bytes" || fail "item 2: bytes differ"
umount_fs "$M"

# issue 28 item 5: what a killed mount left staged is not lost to the CLI: ls
# says it is there, an import of a newer copy wins over it (it won at the
# next mount before), and rm removes a staged file
ULP_SESSION_HOLD=1 mount_fs "$A" "$M" || fail "mount with archiving held"
pid=$(fs_pid "$M")
echo old > "$M/y" && echo staged > "$M/z" || fail "write y, z"
crash_fs "$pid" "$M"
"$ULPACK" ls "$A" > /dev/null 2> "$T/ls.err"
grep -q "staging holds 2 files" "$T/ls.err" && ok "ls names the staged files: $(cat "$T/ls.err")" \
	|| fail "item 5: ls says nothing of the staged files: $(cat "$T/ls.err")"
mkdir -p "$T/newer" && echo new > "$T/newer/y"
"$ULPACK" import "$A" "$T/newer" > /dev/null 2> "$T/imp.err" || fail "import: $(cat "$T/imp.err")"
"$ULPACK" rm "$A" z 2> "$T/rm.err" || fail "item 5: rm of a staged file: $(cat "$T/rm.err")"
mount_fs "$A" "$M" || fail "remount"
[ "$(cat "$M/y" 2>&1)" = new ] && ok "an import after the crash wins over the older staged copy" \
	|| fail "item 5: y is '$(cat "$M/y" 2>&1)' after the remount, not the imported 'new'"
[ -e "$M/z" ] && fail "item 5: the removed staged file came back" || ok "rm removed a staged file for good"
umount_fs "$M"
finish
