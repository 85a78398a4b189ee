#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_mount_t.sh - after `make install` into a temporary prefix: mount(8)
# mounts an archive with -t fuse (full path of the binary, as mount.fuse3
# runs it with a fixed PATH), with -t fuse.ulpackfs (the binary linked where
# that PATH finds it), and through an fstab line (mount -T FSTAB). Issue 40:
# with the installed mount.fuse.ulpackfs in /sbin (linked there for the
# test), -t fuse.ulpackfs works from a prefix outside that PATH.
. "$(dirname "$0")/lib.sh"
need_fuse
[ "$(id -u)" = 0 ] || skip "mount(8) needs root"
command -v mount.fuse3 > /dev/null || skip "no mount.fuse3"
P="$T/prefix"
make -C "$top_builddir" -s install prefix="$P" mounthelperdir="$P/sbin" > /dev/null 2>&1 || { fail "make install"; finish; }
[ -x "$P/bin/ulpackfs" ] && [ -x "$P/bin/ulpack" ] && [ -f "$P/share/man/man1/ulpackfs.1" ] \
	&& ok "installed into $P" || fail "install layout"
A="$T/arch" M="$T/mnt"
"$P/bin/ulpack" init "$A" > /dev/null
"$P/bin/ulpack" synth "$T/run" --steps 2 --dim 32 > /dev/null
"$P/bin/ulpack" import "$A" "$T/run" > /dev/null
f=checkpoint-200/model.safetensors
mkdir -p "$M"
check() {
	wait_mounted "$M"
	cmp -s "$T/run/$f" "$M/$f" && ok "$1" || fail "$1: read"
	umount "$M" || fusermount3 -u "$M"
}
mount -t fuse "$P/bin/ulpackfs#$A" "$M" -o cache_size=16M && check "mount -t fuse /path/ulpackfs#ARCHIVE" || fail "mount -t fuse"
link=""
if [ ! -e /usr/local/bin/ulpackfs ]; then
	ln -s "$P/bin/ulpackfs" /usr/local/bin/ulpackfs && link=/usr/local/bin/ulpackfs
fi
if [ -n "$link" ] || [ -x /usr/local/bin/ulpackfs ]; then
	mount -t fuse.ulpackfs "$A" "$M" -o ro,noatime,cache_size=16M && check "mount -t fuse.ulpackfs -o ro,noatime,cache_size=16M" \
		|| fail "mount -t fuse.ulpackfs"
	printf '%s %s fuse.ulpackfs defaults,cache_size=64M 0 0\n' "$A" "$M" > "$T/fstab"
	mount -T "$T/fstab" "$M" && check "fstab line" || fail "fstab mount"
fi
[ -n "$link" ] && rm -f "$link"
# mount(8) runs /sbin/mount.fuse.ulpackfs, which names $P/bin/ulpackfs
if [ -x "$P/sbin/mount.fuse.ulpackfs" ] && [ ! -e /sbin/mount.fuse.ulpackfs ] && [ ! -e /usr/local/bin/ulpackfs ] \
	&& ! command -v ulpackfs > /dev/null; then
	ln -s "$P/sbin/mount.fuse.ulpackfs" /sbin/mount.fuse.ulpackfs
	mount -t fuse.ulpackfs "$A" "$M" -o cache_size=16M && check "mount -t fuse.ulpackfs, ulpackfs only in $P/bin (mount.fuse.ulpackfs)" \
		|| fail "mount -t fuse.ulpackfs through mount.fuse.ulpackfs"
	mount -T "$T/fstab" "$M" && check "fstab line through mount.fuse.ulpackfs" || fail "fstab through the helper"
	rm -f /sbin/mount.fuse.ulpackfs
else
	[ -x "$P/sbin/mount.fuse.ulpackfs" ] || fail "mount.fuse.ulpackfs not installed"
fi
finish
