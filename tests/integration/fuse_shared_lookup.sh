#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_shared_lookup.sh - issue 34 item 10: on a read-only mount that follows
# a shared archive, a step that readdir lists opens at once. A writer mount
# archives a new step and `ulpack sync`s it, again and again, while a reader
# of the read-only mount (-o ro,poll=0.2) waits for the next step by name (as
# a trainer's evaluator does), lists the run and opens every file of every
# listed step: no ENOENT allowed. Before, the kernel kept the negative entry
# of the awaited step for up to a second (negative_timeout) after readdir
# listed it.
. "$(dirname "$0")/lib.sh"
need_fuse

A="$T/arch" W="$T/w" R="$T/r"
"$ULPACK" synth "$T/run" --steps 24 --dim 16 > /dev/null || fail synth
"$ULPACK" init --shared "$A" > "$T/out" 2>&1 || { fail "init --shared: $(cat "$T/out")"; finish; }
mount_fs "$A" "$W" || { fail "writer mount"; finish; }
mkdir "$W/run" && cp -r "$T/run/checkpoint-100" "$W/run/" && "$ULPACK" sync "$W" > /dev/null || fail "first step"
mount_fs "$A" "$R" -o ro,poll=0.2 || { fail "reader mount"; finish; }

steps=$(cd "$T/run" && ls | sed 's/checkpoint-//' | sort -n | tail -n +2)
(
	for s in $steps; do
		cp -r "$T/run/checkpoint-$s" "$W/run/" && "$ULPACK" sync "$W" > /dev/null || echo "writer: step $s" >&2
		sleep 0.3
	done
	touch "$T/writer-done"
) &
WPID=$!

"$PY" - "$R/run" "$T/writer-done" "$T/run" > "$T/reader" 2>&1 <<'PYEOF'
import errno, os, sys, time
run, done, src = sys.argv[1:4]
steps = sorted(int(n.split("-")[1]) for n in os.listdir(src))
opened = failed = 0
end = time.monotonic() + 40
final = None
have = set()
while time.monotonic() < end:
    if final is None and os.path.exists(done):
        final = time.monotonic() + 10  # (a bound: until the last generation is followed)
    if final is not None and (time.monotonic() > final or len(have) == len(steps)):
        break
    names = os.listdir(run)
    have = {int(n.split("-")[1]) for n in names if n.startswith("checkpoint-")}
    nxt = [s for s in steps if s not in have]
    if nxt:  # waiting for the next step by name: a negative entry, if cached
        os.path.exists(os.path.join(run, "checkpoint-%d" % nxt[0], "model.safetensors"))
        os.path.exists(os.path.join(run, "checkpoint-%d" % nxt[0]))
    for n in sorted(names):
        if not n.startswith("checkpoint-"):
            continue
        p = os.path.join(run, n, "model.safetensors")
        try:
            with open(p, "rb") as f:
                f.read(16)
            opened += 1
        except OSError as e:
            failed += 1
            if failed <= 5:
                print("listed but not opened: %s: %s" % (p, os.strerror(e.errno)))
    time.sleep(0.02)
print("%d opens, %d failed, %d of %d steps seen" % (opened, failed, len(have), len(steps)))
sys.exit(1 if failed or len(have) != len(steps) else 0)
PYEOF
rc=$?
wait "$WPID"
[ "$rc" = 0 ] && ok "reader: $(tail -1 "$T/reader")" || fail "reader: $(cat "$T/reader")"
umount_fs "$R"
umount_fs "$W"
finish
