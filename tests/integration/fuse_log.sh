#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_log.sh - what `ulpackfs -f` logs (issue 40 item 1): one line per
# archived step, not per file; every error once (a damaged file read again
# and again, by several readers, logs one line; `ulpack status` counts every
# one); a shared archive's lines name the host.
. "$(dirname "$0")/lib.sh"
need_fuse
A="$T/a" M="$T/m" S="$T/src"
"$ULPACK" init "$A" > /dev/null && "$ULPACK" synth "$S" --steps 3 --dim 128 > /dev/null || { fail setup; finish; }
for d in "$S"/checkpoint-*; do
	echo '{"step": 1}' > "$d/trainer_state.json" && echo '{}' > "$d/config.json"
done
mount_fg "$A" "$M" 2> "$T/log" || { fail mount; finish; }
cp -r "$S"/checkpoint-* "$M/" && "$ULPACK" sync "$M" > /dev/null || fail "copy and sync"
umount_fs "$M"
wait "$FS_PID" 2> /dev/null
n=$(grep -c '^ulpackfs: archived checkpoint-[123]00: 3 files, ' "$T/log")
[ "$n" = 3 ] && ok "one line per step: $(grep -m1 '^ulpackfs: archived' "$T/log")" \
	|| fail "step lines ($n): $(cat "$T/log")"
[ "$(grep -c 'model.safetensors\|trainer_state\|config.json' "$T/log")" = 0 ] && ok "no line per file" \
	|| fail "lines per file: $(cat "$T/log")"

# a damaged pack: five reads (two at once) of the damaged file, one line
pack=$(ls -S "$A"/packs/*.pack | head -n 1)
"$PY" -c 'import sys; p=sys.argv[1]; d=bytearray(open(p,"rb").read()); d[len(d)//2]^=0x10; open(p,"wb").write(d)' "$pack"
"$ULPACK" verify "$A" | sed -n 's/^DAMAGED \([^:]*\):.*/\1/p' > "$T/damaged"
d1=$(head -n 1 "$T/damaged")
[ -n "$d1" ] || { fail "verify found no damage"; finish; }
mount_fg "$A" "$M" -o ro 2> "$T/log2" || { fail "mount -o ro"; finish; }
for _ in 1 2 3 4; do cat "$M/$d1" > /dev/null 2>&1 && fail "read of damaged $d1 succeeded"; done
cat "$M/$d1" > /dev/null 2>&1 & cat "$M/$d1" > /dev/null 2>&1
wait $!
"$ULPACK" status "$M" --json > "$T/st"
umount_fs "$M"
wait "$FS_PID" 2> /dev/null
n=$(grep -c "read /$d1: " "$T/log2")
[ "$n" = 1 ] && ok "six damaged reads, one line: $(grep -m1 "read /$d1" "$T/log2" | cut -c1-140)" \
	|| fail "damaged reads logged $n lines: $(cat "$T/log2")"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["errors"] >= 6 and d["errors_distinct"] == 1 else 1)' "$T/st" \
	&& ok "status counts every error: $(grep -o '"errors": [0-9]*, "errors_distinct": [0-9]*' "$T/st")" \
	|| fail "status errors: $(cat "$T/st")"

# a shared archive: the lines name the host
B="$T/b"
"$ULPACK" init "$B" > /dev/null && "$ULPACK" share "$B" > /dev/null || { fail "share"; finish; }
mount_fg "$B" "$M" 2> "$T/log3" || { fail "mount shared"; finish; }
cp -r "$S/checkpoint-100" "$M/" && "$ULPACK" sync "$M" > /dev/null || fail "copy and sync (shared)"
"$ULPACK" status "$M" --json > "$T/st3"
umount_fs "$M"
wait "$FS_PID" 2> /dev/null
h=$(hostname)
grep -q "^ulpackfs: \[$h\] archived checkpoint-100: 3 files" "$T/log3" && ok "a shared archive's lines name the host: $(grep -m1 archived "$T/log3")" \
	|| fail "shared log: $(cat "$T/log3")"
"$PY" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["shared"] == 1 and d["writer"] == 1 and d["holder"] == sys.argv[2] and d["epoch"] >= 1 and d["published_ms"] > 0 else 1)' "$T/st3" "$h" \
	&& ok "status of a shared mount: lease holder, epoch, last publication" || fail "shared status: $(cat "$T/st3")"
finish
