#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_memory.sh - issue 12: the daemon's memory stays bounded by its threads
# and the chunk size (besides its decode cache), however large the files: two
# steps with a 96 MiB tensor (synth --big-tensor-mb) copied into a mount are
# archived (and the older re-coded against the newer, recode.c) with peak
# anonymous memory (RssAnon of ulpackfs, sampled) below the tensor's size;
# the whole-tensor path peaked at 348 MB on such a run (2.36 GB with a 512
# MiB tensor). The files read back.
. "$(dirname "$0")/lib.sh"
need_fuse
A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
"$ULPACK" synth "$T/run" --steps 2 --dim 64 --big-tensor-mb 96 || fail "synth"
mount_fg "$A" "$M" -o threads=2,cache_size=16M || { fail mount; finish; }
touch "$T/busy"
( cp -r "$T/run/checkpoint-100" "$T/run/checkpoint-200" "$M/" && "$ULPACK" sync "$M" > "$T/sync"; echo $? > "$T/rc"; rm -f "$T/busy" ) &
W=$!
max=0
while [ -e "$T/busy" ]; do
	v=$(sed -n 's/^RssAnon:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$FS_PID/status" 2>/dev/null)
	[ -n "$v" ] && [ "$v" -gt "$max" ] && max=$v
	sleep 0.01
done
wait $W # (not a bare wait: ulpackfs is a child of this shell too)
[ "$(cat "$T/rc")" = 0 ] && ok "copied and archived: $(cat "$T/sync")" || fail "copy or sync"
echo "ulpackfs archiving two steps with a 96 MiB tensor: peak RssAnon $max KiB"
[ "$max" -gt 0 ] && [ "$max" -lt $((96 * 1024)) ] && ok "daemon peak RssAnon $max KiB < 96 MiB" \
	|| fail "daemon peak RssAnon $max KiB"
for s in 100 200; do
	cmp -s "$M/checkpoint-$s/model.safetensors" "$T/run/checkpoint-$s/model.safetensors" \
		&& ok "checkpoint-$s reads back" || fail "checkpoint-$s differs"
done
umount_fs "$M"
finish
