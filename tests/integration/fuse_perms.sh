#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_perms.sh - several users on one mount and mount options (issue 11,
# items 9 and 20): -o allow_other implies default_permissions, so another
# user cannot read a 0600 file, delete or chown it (unless the mount says
# -o no_permission_checks); bad numeric -o values are a usage error (exit 2)
# and mount nothing.
. "$(dirname "$0")/lib.sh"
need_fuse
[ "$(id -u)" = 0 ] || skip "needs root (to act as a second user)"
command -v setpriv > /dev/null || skip "no setpriv (util-linux)"
chmod 755 "$T" # the second user reaches the mount point
A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }

# item 20: bad values, refused before mounting
# (max_chain and threads: the library's limits, ULP_MAX_CHAIN and ULP_MAX_THREADS, as in cli_errors.sh)
for opt in max_chain=-5 max_chain=abc max_chain=0 max_chain=1025 max_chain=1000000 max_chain=99999999999999999999 \
	threads=abc threads=-1 \
	threads=1025 threads=2x cache_size=abc cache_size=-1G readahead=xyz readahead=-4M; do
	mkdir -p "$M"
	"$ULPACKFS" "$A" "$M" -o "$opt" > "$T/out" 2>&1
	rc=$?
	if mountpoint -q "$M"; then
		umount_fs "$M"
		fail "-o $opt mounted"
	elif [ "$rc" = 2 ] && grep -q "bad" "$T/out"; then
		ok "-o $opt refused: $(head -1 "$T/out")"
	else
		fail "-o $opt: exit $rc, $(cat "$T/out")"
	fi
done

# item 9
mount_fs "$A" "$M" -o allow_other,max_chain=4,threads=2 || { fail "mount with allow_other and good values"; finish; }
printf 'secret' > "$M/secret" && chmod 600 "$M/secret"
printf 'public' > "$M/public"
mkdir "$M/shared" && chmod 1777 "$M/shared"
[ "$(as_nobody cat "$M/public")" = public ] && ok "another user reads a 0644 file" || fail "0644 file unreadable"
out=$(as_nobody cat "$M/secret" 2>&1) && fail "another user read a 0600 file: $out" || {
	case $out in *"ermission denied"*) ok "another user cannot read a 0600 file (EACCES)" ;;
	*) fail "reading a 0600 file: $out" ;; esac
}
as_nobody rm -f "$M/secret" 2> /dev/null && fail "another user deleted a root file" || ok "another user cannot delete it"
as_nobody chown 65534 "$M/public" 2> /dev/null && fail "another user chowned a root file" || ok "nor chown it"
as_nobody chmod 666 "$M/public" 2> /dev/null && fail "another user chmodded a root file" || ok "nor chmod it"
as_nobody sh -c "printf mine > '$M/shared/mine' && chmod 600 '$M/shared/mine' && cat '$M/shared/mine'" > /dev/null \
	&& ok "another user writes and reads its own 0600 file" || fail "own file"
[ "$(cat "$M/secret" 2> /dev/null)" = secret ] && [ -e "$M/public" ] && ok "root's files intact" || fail "files changed"
# issue 28 item 3: another user's write clears setuid (and setgid with g+x)
# whether it opens O_RDWR (page cache: the kernel's chmod), O_WRONLY (direct
# I/O: the daemon's) or O_WRONLY|O_TRUNC; setgid without g+x stays; the
# archive keeps the cleared mode
for f in rw wo tr sg; do printf x > "$M/shared/$f" && chmod 6777 "$M/shared/$f"; done
chmod 2766 "$M/shared/sg"
as_nobody "$PY" -c "
import os, sys
d = sys.argv[1]
for f, fl in (('rw', os.O_RDWR), ('wo', os.O_WRONLY), ('tr', os.O_WRONLY | os.O_TRUNC), ('sg', os.O_WRONLY)):
    fd = os.open(d + '/' + f, fl)
    os.write(fd, b'written')
    os.close(fd)
" "$M/shared" || fail "another user's writes"
umount_fs "$M"
mount_fs "$A" "$M" || { fail "remount"; finish; }
modes=$(cd "$M/shared" && stat -c '%n=%a' rw wo tr sg | tr '\n' ' ')
[ "$modes" = "rw=777 wo=777 tr=777 sg=2766 " ] && ok "another user's write cleared setuid/setgid: $modes" \
	|| fail "modes after another user's write: $modes (want rw=777 wo=777 tr=777 sg=2766)"
umount_fs "$M"

# issue 28 item 9: user.ulpack.sync (ulpack sync) names the files whose
# archiving failed to root and the mount's owner only; another user gets the
# barrier and a count. Archiving held until the sync (ULP_SESSION_HOLD), on
# a disk with room for the staged file but not for its pack as well.
mkdir -p "$T/small"
head -c 1048576 /dev/urandom > "$T/rand.bin"
mount -t tmpfs -o size=1600k tmpfs "$T/small" || skip "cannot mount tmpfs"
ULP_CLEANUP="umount '$T/small' 2>/dev/null"
"$ULPACK" init "$T/small/arch" > /dev/null
ULP_SESSION_HOLD=1 mount_fs "$T/small/arch" "$M" -o allow_other || { fail "mount on the small disk"; finish; }
mkdir -m 700 "$M/private" && cp "$T/rand.bin" "$M/private/secret-name.bin" || fail "write on the small disk"
out=$(as_nobody "$ULPACK" sync "$M" 2>&1) && fail "another user's sync succeeded: $out"
case $out in
*secret-name*) fail "another user's sync names the failed file: $out" ;;
*"1 files could not be archived"*) ok "another user's sync: a count, no names" ;;
*) fail "another user's sync: $out" ;;
esac
out=$("$ULPACK" sync "$M" 2>&1) && fail "root's sync succeeded: $out"
case $out in *private/secret-name.bin*) ok "root's sync names it" ;; *) fail "root's sync: $out" ;; esac
umount_fs "$M"
umount "$T/small"

mount_fs "$A" "$M" -o allow_other,no_permission_checks,max_chain=1024 \
	|| { fail "mount with no_permission_checks and the largest max_chain"; finish; }
[ "$(as_nobody cat "$M/secret" 2>&1)" = secret ] && ok "-o no_permission_checks turns the checks off" \
	|| fail "no_permission_checks"
umount_fs "$M"
finish
