#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_enospc.sh - issue 34 item 4: on a full file system (a small tmpfs,
# filled to the last block by a file beside the archive) `rm` of archived
# files through the mount works, each one, and the space comes back (df)
# without an unmount; so does `ulpack rm` without a mount, and rm through a
# mount made on a full disk. Before, the index's
# write-ahead log had no room to grow and every removal failed with ENOSPC.
. "$(dirname "$0")/lib.sh"
need_fuse

[ "$(id -u)" = 0 ] || skip "needs root to mount a small tmpfs"
mkdir -p "$T/small"
mount -t tmpfs -o size=24m tmpfs "$T/small" 2>/dev/null || skip "cannot mount tmpfs here"
ULP_CLEANUP="fusermount3 -u -z '$T/mnt' 2>/dev/null; umount '$T/small' 2>/dev/null"
A="$T/small/arch" M="$T/mnt"
avail() { df -k --output=avail "$T/small" | tail -1 | tr -d ' '; }
fill() { dd if=/dev/zero of="$T/small/filler$1" bs=64k > /dev/null 2>&1; [ "$(avail)" -lt 64 ]; }

"$ULPACK" init "$A" > /dev/null || fail init
mkdir -p "$T/src/data"
for i in 1 2 3 4 5 6; do head -c 1500000 /dev/urandom > "$T/src/data/f$i.bin"; done
"$ULPACK" synth "$T/src/run" --steps 4 --dim 128 > /dev/null || fail synth
"$ULPACK" import "$A" "$T/src" > /dev/null || fail import
mount_fs "$A" "$M" || { fail mount; finish; }
fill 1 && ok "disk full: $(avail) KiB free" || fail "the disk did not fill: $(avail) KiB free"

for f in data/f1.bin data/f2.bin run/checkpoint-100/model.safetensors data/f3.bin run/checkpoint-200/model.safetensors; do
	if rm "$M/$f" 2> "$T/err"; then
		ok "rm $f on a full disk ($(avail) KiB free after)"
	else
		fail "rm $f on a full disk: $(cat "$T/err")"
	fi
	[ -e "$M/$f" ] && fail "$f still there"
done
free=0
for _ in $(seq 100); do # (a bound, not a timing: the idle pass reclaims)
	free=$(avail)
	[ "$free" -gt 3000 ] && break
	sleep 0.2
done
[ "$free" -gt 3000 ] && ok "space came back while mounted: $free KiB free" || fail "space did not come back: $free KiB free"
cmp -s "$T/src/data/f4.bin" "$M/data/f4.bin" && ok "a kept file reads back" || fail "data/f4.bin differs"
umount_fs "$M"

fill 2 && ok "disk full again: $(avail) KiB free" || fail "the disk did not fill again: $(avail) KiB free"
"$ULPACK" rm "$A" data/f4.bin > "$T/out" 2>&1 && ok "ulpack rm on a full disk" || fail "ulpack rm on a full disk: $(cat "$T/out")"
fill 3 && ok "disk full again: $(avail) KiB free" || fail "the disk did not fill again: $(avail) KiB free"
if mount_fs "$A" "$M"; then
	rm "$M/data/f5.bin" 2> "$T/err" && ok "mounted on a full disk, rm data/f5.bin" ||
		fail "rm data/f5.bin through a mount made on a full disk: $(cat "$T/err")"
	umount_fs "$M"
else
	fail "mount on a full disk"
fi
rm -f "$T/small"/filler*
"$ULPACK" verify "$A" > "$T/v" 2>&1 && ok "verify: $(cat "$T/v")" || fail "verify: $(cat "$T/v")"
"$ULPACK" ls "$A" data > "$T/ls" 2>&1
[ "$(grep -c 'f[0-9].bin' "$T/ls")" = 1 ] && ok "data/f6.bin kept" || fail "ls: $(cat "$T/ls")"
finish
