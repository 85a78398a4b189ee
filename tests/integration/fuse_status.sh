#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_status.sh - what the daemon is doing (issue 40 item 1): `ulpack
# status --json` of a mount (the daemon's live figures: queue, archived
# files and steps, rate, errors) and of an archive at rest (its index);
# `--watch`: in place on a terminal (script -q gives it one), one plain line
# a refresh otherwise; `ulpack sync` on a terminal shows the files and bytes
# it waits for and the slowest file, and nothing but its result otherwise.
. "$(dirname "$0")/lib.sh"
need_fuse
command -v script > /dev/null || skip "no script(1) (bsdutils)"
A="$T/a" M="$T/m" S="$T/src"
"$ULPACK" init "$A" > /dev/null || { fail init; finish; }
"$ULPACK" synth "$S" --steps 4 --dim 256 > /dev/null || { fail synth; finish; }
# archiving waits for a barrier (measuring hook): the queue is visible; each
# file's archiving takes 0.6 s longer (a test hook), so that sync has something to show
ULP_SESSION_HOLD=1 ULP_TEST_PUT_DELAY_MS=600 mount_fs "$A" "$M" || { fail mount; finish; }
cp -r "$S/checkpoint-100" "$S/checkpoint-200" "$M/"
json() { "$PY" -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, d))' "$1"; }
"$ULPACK" status "$M" --json > "$T/s1" || fail "status --json of a mount: $(cat "$T/s1")"
[ "$(json 'live, queued, archived' < "$T/s1")" = "(1, 2, 0)" ] && ok "status --json: 2 files queued, live" \
	|| fail "status of a mount with a queue: $(cat "$T/s1")"
[ "$(json 'queued_bytes == staged_bytes and queued_bytes > 0' < "$T/s1")" = True ] \
	&& ok "the queue's bytes" || fail "queued bytes: $(cat "$T/s1")"
script -q -c "'$ULPACK' sync '$M'" /dev/null > "$T/sync.tty" 2>&1 || fail "sync on a tty: $(cat "$T/sync.tty")"
grep -q 'sync: waiting for [12] files\?, [0-9.]* MB left' "$T/sync.tty" &&
	ok "sync on a tty shows what it waits for: $(tr '\r' '\n' < "$T/sync.tty" | grep -a waiting | head -n 1 | cut -c4-)" \
	|| fail "sync on a tty: $(cat -v "$T/sync.tty")"
grep -qa 'slowest: checkpoint-[12]00/model.safetensors' "$T/sync.tty" && ok "... and the slowest file" \
	|| fail "sync on a tty names no slowest file: $(cat -v "$T/sync.tty")"
cp -r "$S/checkpoint-300" "$M/"
"$ULPACK" sync "$M" > "$T/sync.plain" 2>&1 || fail "sync: $(cat "$T/sync.plain")"
[ "$(cat "$T/sync.plain")" = "sync: $M: everything closed before is archived" ] && ok "sync not on a tty: its result only" \
	|| fail "sync not on a tty printed: $(cat -v "$T/sync.plain")"
"$ULPACK" status "$M" --json > "$T/s2"
[ "$(json 'queued, archived, failed, errors, read_only' < "$T/s2")" = "(0, 3, 0, 0, 0)" ] \
	&& ok "after sync: 3 archived, none queued" || fail "status after sync: $(cat "$T/s2")"
[ "$(json 'bytes_per_s > 0 and disk_bytes > live_bytes > 0 and uptime_ms > 0 and shared == 0' < "$T/s2")" = True ] \
	&& ok "rate, space, uptime" || fail "figures after sync: $(cat "$T/s2")"
"$ULPACK" status "$M" > "$T/t" && grep -q '^queue: *0 files' "$T/t" && grep -q '^archived: *3 files' "$T/t" &&
	grep -q '^errors: *0 since the mount' "$T/t" && ok "status for people: $(grep '^archived' "$T/t")" \
	|| fail "status text: $(cat "$T/t")"
# --watch: plain lines when not a tty, in place on one
timeout 2.5 "$ULPACK" status "$M" --watch > "$T/w" 2>&1
n=$(grep -c '^[0-9:]* queue 0 files 0 bytes; archived 3 files' "$T/w")
[ "$n" -ge 2 ] && ok "--watch not on a tty: $n plain lines" || fail "--watch plain: $(cat "$T/w")"
script -q -c "timeout 2.5 '$ULPACK' status '$M' --watch" /dev/null > "$T/w.tty" 2>&1
[ "$(grep -ac "$(printf '\033')\[H" "$T/w.tty")" -ge 1 ] && grep -qa 'queue:' "$T/w.tty" \
	&& ok "--watch on a tty refreshes in place" || fail "--watch on a tty: $(cat -v "$T/w.tty" | head -n 5)"
"$ULPACK" status "$A" --json > "$T/s4"
[ "$(json 'live, archived' < "$T/s4")" = "(1, 3)" ] && ok "status of the archive directory while mounted: the daemon's" \
	|| fail "status ARCHIVE while mounted: $(cat "$T/s4")"
"$ULPACK" status "$A" | grep -q "^archive: $A, mounted at $M" && ok "... saying where it is mounted" \
	|| fail "status ARCHIVE text while mounted: $("$ULPACK" status "$A" | head -n 2)"
umount_fs "$M"
# at rest: the index
"$ULPACK" status "$A" --json > "$T/s3" || fail "status of an archive: $(cat "$T/s3")"
[ "$(json 'live, queued, read_only, packs > 0, disk_bytes > 0' < "$T/s3")" = "(0, 0, 1, True, True)" ] \
	&& ok "status --json of an archive at rest" || fail "status at rest: $(cat "$T/s3")"
"$ULPACK" status "$A" | grep -q 'not mounted' && ok "status of an archive says it is not mounted" \
	|| fail "status text at rest: $("$ULPACK" status "$A")"
"$ULPACK" status "$T/none" > /dev/null 2> "$T/e" && fail "status of a missing archive succeeded"
grep -q "$T/none" "$T/e" && ok "a missing archive: $(cat "$T/e")" || fail "missing archive: $(cat "$T/e")"
finish
