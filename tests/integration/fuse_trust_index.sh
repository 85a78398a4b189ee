#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_trust_index.sh - issue 11, the index's share of it, seen as a user
# sees it: mv of a directory whose path is not ASCII keeps its files;
# rename(2) of directories over empty / non-empty ones and onto files gives
# POSIX's answers; verify names index rows that no directory reaches; a
# flipped bit of a stored safetensors header gives EIO (mount) and an error
# (cat, verify), never other bytes; an archive inside the imported tree is
# not imported; the archive is private (0700, files 0600) after init, import
# and a write through the mount.
. "$(dirname "$0")/lib.sh"
need_fuse
[ -n "$PY" ] && "$PY" -c 'import sqlite3' 2> /dev/null || skip "no python3 with sqlite3"

A="$T/arch" M="$T/mnt" R="$T/run"
umask 022
"$ULPACK" init "$A" > /dev/null || fail init
mode() { stat -c %a "$1"; }
[ "$(mode "$A")" = 700 ] && ok "init: archive directory 0700" || fail "init: archive directory $(mode "$A")"
[ "$(mode "$A/ulpack.db")" = 600 ] && ok "init: ulpack.db 0600" || fail "init: ulpack.db $(mode "$A/ulpack.db")"

# ---- import: private files; the archive inside the tree is skipped -------
"$ULPACK" synth "$R" --steps 1 --dim 64 --interval 500 > /dev/null || fail synth
printf 'secret\n' > "$R/secret.txt"
chmod 600 "$R/secret.txt"
"$ULPACK" init "$R/inner-archive" > /dev/null || fail "init inside the tree"
"$ULPACK" import "$R/inner-archive" "$R" > /dev/null 2> "$T/import.err" || fail "import into an archive inside the tree"
grep -q "the archive itself" "$T/import.err" && ok "import says it skips the archive" || fail "import: no word of the archive"
"$ULPACK" ls "$R/inner-archive" > "$T/inner.ls" 2>&1
if grep -q "inner-archive\|ulpack.db" "$T/inner.ls"; then
	fail "import archived the archive's own files: $(grep -m1 'inner-archive\|ulpack.db' "$T/inner.ls")"
else
	grep -q "secret.txt" "$T/inner.ls" && ok "the archive's own directory is not imported" || fail "import: $(cat "$T/inner.ls")"
fi
"$ULPACK" import "$A" "$R" > /dev/null 2>&1 || fail import
bad=$(find "$A" -mindepth 1 \( -type d ! -perm 700 -o -type f ! -perm 600 \) -printf '%p %m\n')
[ -z "$bad" ] && ok "after import every archive file is 0600, every directory 0700" || fail "after import: $bad"

# ---- through the mount ---------------------------------------------------
mount_fs "$A" "$M" || { fail mount; finish; }
mkdir -p "$M/données/run1" && echo x > "$M/données/run1/f" && mv "$M/données/run1" "$M/données/run2" ||
	fail "mv of a non-ASCII directory"
[ "$(ls -A "$M/données/run2" 2> /dev/null)" = f ] && [ "$(cat "$M/données/run2/f" 2> /dev/null)" = x ] &&
	ok "mv of a non-ASCII directory keeps its files" || fail "données/run2 holds: $(ls -A "$M/données/run2" 2>&1)"
"$PY" - "$M" <<'PYEOF' && ok "rename(2) of directories: empty replaced, ENOTEMPTY, ENOTDIR, EISDIR" || fail "rename(2) of directories"
import errno, os, sys
m = sys.argv[1]
os.makedirs(m + "/rd/src"); os.makedirs(m + "/rd/empty"); os.makedirs(m + "/rd/full")
for p in ("rd/src/f", "rd/full/g", "rd/file"):
    with open(m + "/" + p, "w") as f:
        f.write("1\n")
bad = 0
def expect(a, b, code):
    global bad
    try:
        os.rename(m + "/" + a, m + "/" + b)
        got = 0
    except OSError as e:
        got = e.errno
    if got != code:
        print("rename %s %s: %s, want %s" % (a, b, errno.errorcode.get(got, got), errno.errorcode.get(code, code)))
        bad += 1
expect("rd/src", "rd/empty", 0)
if not os.path.exists(m + "/rd/empty/f") or os.path.exists(m + "/rd/src"):
    print("not moved over the empty directory"); bad += 1
expect("rd/empty", "rd/full", errno.ENOTEMPTY)
expect("rd/empty", "rd/file", errno.ENOTDIR)
expect("rd/file", "rd/full", errno.EISDIR)
# a directory whose only file is still open (staged, not in the index yet)
# is not empty either
os.makedirs(m + "/rd/staged"); os.makedirs(m + "/rd/empty2")
held = open(m + "/rd/staged/open", "w")
held.write("held\n"); held.flush()
expect("rd/empty2", "rd/staged", errno.ENOTEMPTY)
held.close()
if not os.path.isdir(m + "/rd/empty2"):
    print("rd/empty2 went away"); bad += 1
try:
    os.rmdir(m + "/rd/full")
    print("rmdir of a non-empty directory succeeded"); bad += 1
except OSError as e:
    if e.errno != errno.ENOTEMPTY:
        print("rmdir: %s" % errno.errorcode.get(e.errno)); bad += 1
sys.exit(1 if bad else 0)
PYEOF
head -c 100000 /dev/urandom > "$M/written.bin" && chmod 600 "$M/written.bin"
umount_fs "$M"
bad=$(find "$A" -mindepth 1 \( -type d ! -perm 700 -o -type f ! -perm 600 \) -printf '%p %m\n')
[ -z "$bad" ] && ok "after a write through the mount every archive file is 0600" || fail "after the mount: $bad"
"$ULPACK" verify "$A" > "$T/verify.out" 2>&1 && ok "verify after the renames" || fail "verify: $(cat "$T/verify.out")"

# ---- a flipped bit of a stored header ------------------------------------
st=$("$ULPACK" ls "$A" 2> /dev/null | grep -o '[^ ]*model[^ ]*\.safetensors' | head -n 1)
[ -n "$st" ] || st=$(cd "$R" && find . -name '*.safetensors' | head -n 1 | sed 's|^\./||')
"$PY" - "$A/ulpack.db" "$st" <<'PYEOF' || fail "flip a header byte"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
(h,) = db.execute("SELECT header FROM entries WHERE path = ?", (sys.argv[2],)).fetchone()
h = bytearray(h)
h[20] ^= 0x01
db.execute("UPDATE entries SET header = ? WHERE path = ?", (bytes(h), sys.argv[2]))
db.commit()
PYEOF
mount_fs "$A" "$M" -o ro || { fail "mount ro"; finish; }
if cat "$M/$st" > /dev/null 2> "$T/cat.err"; then
	fail "a damaged header was served through the mount"
else
	grep -q "Input/output error" "$T/cat.err" && ok "damaged header: EIO through the mount" || fail "cat: $(cat "$T/cat.err")"
fi
umount_fs "$M"
if "$ULPACK" cat "$A" "$st" > /dev/null 2> "$T/ucat.err"; then
	fail "ulpack cat served a damaged header"
else
	ok "ulpack cat fails on a damaged header: $(head -c 200 "$T/ucat.err")"
fi
"$ULPACK" verify "$A" > "$T/verify.out" 2>&1 && fail "verify passed a damaged header" ||
	{ grep -q "$st" "$T/verify.out" && ok "verify names the file of the damaged header" || fail "verify: $(cat "$T/verify.out")"; }

# ---- rows no directory reaches -------------------------------------------
B="$T/orph"
"$ULPACK" init "$B" > /dev/null
mkdir -p "$T/small/d" && echo y > "$T/small/d/f"
"$ULPACK" import "$B" "$T/small" > /dev/null 2>&1 || fail "import small"
"$PY" - "$B/ulpack.db" <<'PYEOF' || fail "make an orphan"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("UPDATE entries SET path = 'gone/f', parent = 'gone' WHERE path = 'd/f'")
db.commit()
PYEOF
"$ULPACK" verify "$B" > "$T/verify.out" 2>&1 && fail "verify passed an orphaned file" ||
	{ grep -q "gone/f" "$T/verify.out" && ok "verify names a row that no directory reaches" || fail "verify: $(cat "$T/verify.out")"; }
finish
