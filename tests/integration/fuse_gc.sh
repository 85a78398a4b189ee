#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_gc.sh - `ulpack gc` on a mounted archive:
#  - a file unlinked while a process holds it open keeps reading its exact
#    bytes after gc dropped its blobs and packs (a delta chain included);
#  - the daemon lets go of the packs gc removed (statfs, as df does), so that
#    their disk space really goes back before unmount.
. "$(dirname "$0")/lib.sh"
need_fuse

R="$T/run" A="$T/arch" M="$T/mnt"
"$ULPACK" synth "$R" --steps 4 --dim 128 > /dev/null || fail synth
"$ULPACK" init "$A" > /dev/null || fail init
"$ULPACK" import "$A" "$R" --prefix run > /dev/null || fail import
mount_fs "$A" "$M" || fail mount
pid=$(fs_pid "$M")
last=$(cd "$R" && ls -d checkpoint-* | sort -t- -k2 -n | tail -1)

# every file read (its packs mapped), the newest only opened
for f in $(cd "$R" && find . -type f ! -path "./$last/*" | sed 's|^\./||'); do
	cmp -s "$M/run/$f" "$R/$f" || fail "run/$f reads wrong before gc"
done
grep -q "$A/packs/.*\.pack" "/proc/$pid/maps" || fail "no pack mapped after reading (test premise)"
exec 3< "$M/run/$last/model.safetensors" || fail "open"
# removed from the archive while open (here by the CLI; an unlink through
# the mount removes it from the index the same way), then gc
"$ULPACK" rm "$A" run -r > /dev/null || fail "ulpack rm"
"$ULPACK" gc "$A" > "$T/gc" 2>&1 || fail "gc: $(cat "$T/gc")"
[ -z "$(find "$A/packs" -name '*.pack')" ] || fail "gc left packs (test premise): $(ls "$A/packs")"
stat -f "$M" > /dev/null || fail statfs
if cmp - "$R/$last/model.safetensors" <&3 2> "$T/cmp"; then
	ok "an open file reads its bytes after gc dropped its blobs ($last: a delta chain)"
else
	fail "an open file after gc: $(cat "$T/cmp")"
fi
exec 3<&-
# the kernel sends the release of a closed file after close(2) returns:
# ask (statfs) until it has been served, within a bound
for _ in $(seq 200); do
	stat -f "$M" > /dev/null || fail statfs
	grep -q "$A/packs/.*(deleted)" "/proc/$pid/maps" || break
	sleep 0.05
done
if grep "$A/packs/.*(deleted)" "/proc/$pid/maps" > "$T/maps"; then
	fail "packs removed by gc stay mapped: $(wc -l < "$T/maps") mappings ($(cat "$T/gc"))"
else
	ok "packs removed by gc are let go once unused ($(cat "$T/gc"))"
fi
umount_fs "$M"
"$ULPACK" verify "$A" > "$T/v" 2>&1 && ok "$(cat "$T/v")" || fail "verify: $(cat "$T/v")"
finish
