#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_memory.sh - issue 12: the daemon's memory stays bounded by its threads
# and the chunk size (besides its decode cache), however large the files: two
# steps with a 96 MiB tensor (synth --big-tensor-mb) copied into a mount are
# archived (and the older re-coded against the newer, recode.c) with peak
# anonymous memory (RssAnon of ulpackfs, sampled) below the tensor's size;
# the whole-tensor path peaked at 348 MB on such a run (2.36 GB with a 512
# MiB tensor). The files read back.
# Issue 36 item 5: what the archiver seeds into the decode cache (the chunks
# it just coded, for the next step) is bounded apart from the cache (a
# quarter of it, at most 256 MiB: cache.c invariant 7): a 225 MB checkpoint
# of tensors under the streaming size archived by a mount with a 256 MiB
# cache peaks (VmHWM) at most 64 MiB (+ 16 MiB of slack) above the same
# archived with a 16 MiB cache; before, the archiver filled the cache with
# the whole file (205 MB above; a 4.3 GB DCP rank file: 3.2 GB of daemon
# memory with the default cache).
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

# VMHWM CACHE: the daemon's peak (KiB) archiving $T/seed with -o cache_size=CACHE
"$ULPACK" synth "$T/seed" --steps 1 --dim 1024 --layers 4 --dtype f32 || fail "synth of 225 MB"
vmhwm() {
	rm -rf "$T/as" && "$ULPACK" init "$T/as" > /dev/null || return 1
	mount_fg "$T/as" "$M" -o threads=2,cache_size="$1" || return 1
	cp -r "$T/seed/checkpoint-100" "$M/" && "$ULPACK" sync "$M" > /dev/null || return 1
	sed -n 's/^VmHWM:[^0-9]*\([0-9]*\).*/\1/p' "/proc/$FS_PID/status" # before reading fills the cache
	cmp -s "$M/checkpoint-100/model.safetensors" "$T/seed/checkpoint-100/model.safetensors" || return 1
	umount_fs "$M"
	wait "$FS_PID" 2> /dev/null
}
small=$(vmhwm 16M) && big=$(vmhwm 256M) || fail "archiving the 225 MB checkpoint"
echo "ulpackfs archiving 225 MB of tensors: VmHWM $small KiB with cache_size=16M, $big KiB with 256M"
[ -n "$small" ] && [ -n "$big" ] && [ $((big - small)) -lt $((80 * 1024)) ] \
	&& ok "seeds bounded: VmHWM $((big - small)) KiB above the 16M cache's (< 80 MiB)" \
	|| fail "seeds fill the cache: VmHWM ${big:-?} KiB with 256M, ${small:-?} KiB with 16M"
finish
