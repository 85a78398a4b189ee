#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_export.sh - issue 11 items 3 and 8, and "export must fail loudly":
# ulpack export writes names of up to 255 bytes; restores owner and group as
# root, and otherwise drops the setuid and setgid bits that the owner it
# cannot restore would have carried; carries on past what it cannot write,
# names each such entry and its cause, and exits non-zero with a count; never
# follows a symlink it finds in DEST.
. "$(dirname "$0")/lib.sh"

[ "$(id -u)" = 0 ] || skip "needs root (restores owners; a second user for the unprivileged half)"
command -v setpriv > /dev/null || skip "no setpriv (util-linux)"
NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"

long() { # long CHAR N: CHAR repeated N times
	printf "%${2}s" "" | tr ' ' "$1"
}
n255=$(long a 255) n250=$(long b 250) n245=$(long c 245)
S="$T/src"
mkdir -p "$S/d/sub" "$S/p/owned" "$S/e/sub"
echo inner > "$S/e/sub/file"
echo 255 > "$S/d/$n255"
echo 250 > "$S/d/$n250"
echo 245 > "$S/d/$n245"
echo blocked > "$S/d/block"
echo last > "$S/d/zz"
ln -s zz "$S/d/lnk"
ln -s ../d/zz "$S/p/lnk"
echo suid > "$S/p/suid-nobody" && chown 65534:65534 "$S/p/suid-nobody" && chmod 4755 "$S/p/suid-nobody"
echo suid > "$S/p/suid-root" && chmod 4755 "$S/p/suid-root"
echo sgid > "$S/p/sgid-other" && chown 0:12345 "$S/p/sgid-other" && chmod 2755 "$S/p/sgid-other"
chown -h 65534:65534 "$S/p/lnk"
chown 65534:65534 "$S/p/owned" && chmod 750 "$S/p/owned"
A="$T/arch"
"$ULPACK" init "$A" > /dev/null || fail init
"$ULPACK" import "$A" "$S" > "$T/out" 2>&1 || fail "import: $(cat "$T/out")"

# ---- as root: every name, owners restored, setuid kept with its owner
E="$T/out-root"
"$ULPACK" export "$A" "" "$E" > "$T/out" 2> "$T/err" || fail "export as root: $(cat "$T/err")"
for n in "$n255" "$n250" "$n245" zz; do
	[ -f "$E/d/$n" ] && [ "$(cat "$E/d/$n")" = "$(cat "$S/d/$n")" ] \
		&& ok "name of ${#n} bytes exported" || fail "d/<${#n} bytes> missing or wrong"
done
ls -A "$E/d" | grep -q '^\.ulp' && fail "temporary files left: $(ls -A "$E/d")"
# p/ alone (no long names in it), so that this part stands on its own
E="$T/out-perm"
"$ULPACK" export "$A" p "$E" > "$T/out" 2> "$T/err" || fail "export p as root: $(cat "$T/err")"
owner_mode() { stat -c '%u:%g %a' "$1"; }
[ "$(owner_mode "$E/suid-nobody")" = "65534:65534 4755" ] \
	&& ok "setuid file keeps its owner 65534 as root exports it" \
	|| fail "suid-nobody exported as $(owner_mode "$E/suid-nobody") (want 65534:65534 4755: no setuid-root)"
[ "$(owner_mode "$E/sgid-other")" = "0:12345 2755" ] && ok "setgid file keeps group 12345" \
	|| fail "sgid-other exported as $(owner_mode "$E/sgid-other")"
[ "$(owner_mode "$E/suid-root")" = "0:0 4755" ] && ok "setuid-root file of root stays" \
	|| fail "suid-root exported as $(owner_mode "$E/suid-root")"
[ "$(owner_mode "$E/owned")" = "65534:65534 750" ] && ok "directory owner and mode" \
	|| fail "owned/ exported as $(owner_mode "$E/owned")"
[ "$(stat -c %u "$E/lnk")" = 65534 ] && [ "$(readlink "$E/lnk")" = ../d/zz ] && ok "symlink owner" \
	|| fail "p/lnk exported as $(stat -c %u "$E/lnk") -> $(readlink "$E/lnk")"

# ---- as another user: no owner to restore, so no setuid/setgid bit of an
# owner the file does not have
chmod 711 "$T"
N="$T/nobody"
mkdir "$N" && cp -a "$A" "$N/arch" && chown -R 65534:65534 "$N"
if ! $NOBODY "$ULPACK" --version > /dev/null 2>&1; then
	skip "user 65534 cannot run $ULPACK"
fi
$NOBODY "$ULPACK" export "$N/arch" p "$N/out" > "$T/out" 2> "$T/err" || fail "export as 65534: $(cat "$T/err")"
[ "$(owner_mode "$N/out/suid-root")" = "65534:65534 755" ] && ok "setuid bit of root's file dropped" \
	|| fail "suid-root exported by 65534 as $(owner_mode "$N/out/suid-root") (want 65534:65534 755)"
[ "$(owner_mode "$N/out/sgid-other")" = "65534:65534 755" ] && ok "setgid bit of group 12345 dropped" \
	|| fail "sgid-other exported by 65534 as $(owner_mode "$N/out/sgid-other")"
[ "$(owner_mode "$N/out/suid-nobody")" = "65534:65534 4755" ] && ok "own setuid file keeps its bit" \
	|| fail "suid-nobody exported by 65534 as $(owner_mode "$N/out/suid-nobody")"

# ---- what cannot be written is named with its cause, the rest is written,
# and the exit status says so, with a count
F="$T/out-fail"
mkdir -p "$F/d/block/inside" # a non-empty directory where a file goes
"$ULPACK" export "$A" "" "$F" > "$T/out" 2> "$T/err" && fail "export over a blocked name succeeded"
grep -q "^ulpack export: $F/d/block: " "$T/err" && ok "blocked entry named: $(head -1 "$T/err")" \
	|| fail "no message naming $F/d/block: $(cat "$T/err")"
grep -q "1 entry not written" "$T/err" && ok "failure count" || fail "no count: $(cat "$T/err")"
[ "$(cat "$F/d/zz" 2>/dev/null)" = last ] && [ -f "$F/p/suid-root" ] && ok "export carried on past the failure" \
	|| fail "entries after the failure were not exported"

# ---- a symlink already in DEST where a directory goes is not followed
# (DEST itself may be one)
O="$T/out-link"
mkdir -p "$O/real" "$T/elsewhere"
ln -s real "$O/top"
ln -s "$T/elsewhere" "$O/real/sub"
"$ULPACK" export "$A" e "$O/top" > "$T/out" 2> "$T/err" && fail "export through a symlink succeeded"
[ -z "$(ls -A "$T/elsewhere")" ] && ok "nothing written through the symlink" \
	|| fail "export wrote through $O/top/sub into $T/elsewhere: $(ls -A "$T/elsewhere" | head -3)"
grep -q "$O/top/sub: exists and is not a directory" "$T/err" && ok "symlink in DEST named" \
	|| fail "message: $(cat "$T/err")"

# ---- one file to a path
"$ULPACK" export "$A" "d/$n255" "$T/single" > /dev/null 2>&1 && [ "$(cat "$T/single")" = 255 ] \
	&& ok "one file exported to a path" || fail "single-file export"
finish
