#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_daemon.sh - a daemon that fits the system (issue 15 item 4) and the
# `latest` symlink (item 3), on real mounts:
#  - kill -TERM (and -INT) of the daemon while rsync's files are queued:
#    it unmounts, archives the queue and exits 0; every file reads back;
#  - findmnt and df show the archive's path as the source; -o fsname=X wins;
#  - listxattr of the root lists user.ulpack.counters;
#  - a second read-write mount of a mounted archive fails at once, naming the
#    mount point and the pid; a mount right after fusermount3 -u, while the
#    old daemon may still archive its queue, waits for it and works;
#  - a run directory has `latest` (found by name, not listed) -> its
#    highest step (numeric, not lexical); a step directory has none; a real `latest` wins; -o nolatest;
#    unlinking the computed one succeeds and changes nothing (rsync --delete),
#    and rm -r of a run directory removes it (issue 28 item 8).
. "$(dirname "$0")/lib.sh"
need_fuse
A="$T/arch" M="$T/mnt" M2="$T/mnt2"
"$ULPACK" init "$A" > /dev/null
"$ULPACK" synth "$T/run" --steps 3 --dim 128 > /dev/null
mkdir -p "$M" "$M2"

# ---- SIGTERM / SIGINT: exit 0 after archiving the queue
for sig in TERM INT; do
	rm -rf "$M/run-$sig" 2> /dev/null
	# a non-interactive shell starts background jobs with SIGINT ignored
	# (and libfuse keeps an ignored signal ignored): restore the default
	env --default-signal="$sig" "$ULPACKFS" "$A" "$M" -f 2> "$T/log-$sig" &
	pid=$!
	MOUNTS="$MOUNTS $M"
	for _ in $(seq 50); do mountpoint -q "$M" && break; sleep 0.1; done
	rsync -a "$T/run/" "$M/run-$sig/" || fail "rsync into the mount ($sig)"
	kill -"$sig" "$pid"
	wait "$pid"
	st=$?
	[ "$st" = 0 ] && ok "SIG$sig: exit status 0" || fail "SIG$sig: exit status $st: $(cat "$T/log-$sig")"
	mountpoint -q "$M" && fail "SIG$sig: still mounted"
	n=$("$ULPACK" verify "$A" "run-$sig" --json | "$PY" -c 'import json,sys; d=json.load(sys.stdin); print(d["files"] if d["ok"] else -1)')
	[ "$n" = 3 ] && ok "SIG$sig: the 3 files rsync wrote are archived and verify" || fail "SIG$sig: archived files: $n"
done
[ -z "$(ls "$A/staging")" ] && ok "staging empty after the signals" || fail "staging left: $(ls "$A/staging")"

# ---- source shown by findmnt and df; listxattr of the root
mount_fs "$A" "$M" || { fail mount; finish; }
src=$(findmnt -n -o SOURCE "$M")
[ "$src" = "$(realpath "$A")" ] && ok "findmnt SOURCE is the archive path" || fail "findmnt SOURCE '$src'"
df "$M" | tail -1 | grep -q "^$(realpath "$A") " && ok "df shows the archive path" || fail "df: $(df "$M" | tail -1)"
"$PY" -c 'import os,sys; l=os.listxattr(sys.argv[1]); v=os.getxattr(sys.argv[1],"user.ulpack.counters"); sys.exit(0 if "user.ulpack.counters" in l and v.startswith(b"chunks_decoded") else 1)' "$M" \
	&& ok "listxattr of the root lists user.ulpack.counters" || fail "listxattr of the root"

# ---- a second read-write mount fails at once, naming mount point and pid
pid=$(fs_pid "$M")
t0=$(date +%s)
"$ULPACKFS" "$A" "$M2" 2> "$T/second" && { fail "second read-write mount succeeded"; MOUNTS="$MOUNTS $M2"; }
t1=$(date +%s)
[ $((t1 - t0)) -le 3 ] && ok "second mount failed in $((t1 - t0)) s" || fail "second mount took $((t1 - t0)) s"
grep -qF "$M" "$T/second" && grep -q "pid $pid" "$T/second" && ok "its message names $M and pid $pid" \
	|| fail "message: $(cat "$T/second")"
mount_fs "$A" "$M2" -o ro && ok "a read-only mount beside it works" || fail "ro mount beside"
umount_fs "$M2"

# ---- latest
ls -a "$M/run-TERM" | grep -qx latest && fail "latest listed by ls" || ok "latest not listed (issue 28 item 15)"
[ "$(readlink "$M/run-TERM/latest")" = checkpoint-300 ] && ok "latest -> checkpoint-300" \
	|| fail "latest -> $(readlink "$M/run-TERM/latest")"
mkdir "$M/run-TERM/checkpoint-1000" && cp "$T/run/checkpoint-300/model.safetensors" "$M/run-TERM/checkpoint-1000/"
sleep 1.1 # attribute timeout of the mount
[ "$(readlink "$M/run-TERM/latest")" = checkpoint-1000 ] && ok "latest follows a new step (1000 > 300, numeric)" \
	|| fail "latest -> $(readlink "$M/run-TERM/latest") after checkpoint-1000"
cmp -s "$M/run-TERM/latest/model.safetensors" "$T/run/checkpoint-300/model.safetensors" \
	&& ok "reads through latest" || fail "read through latest"
[ -e "$M/run-TERM/checkpoint-300/latest" ] && fail "latest in a step directory" || ok "no latest in a step directory"
[ -e "$M/latest" ] && fail "latest at the root (not a run directory)" || ok "no latest at the root"
rm "$M/run-TERM/latest" && [ "$(readlink "$M/run-TERM/latest")" = checkpoint-1000 ] \
	&& ok "rm of the computed latest succeeds, changes nothing" || fail "rm latest"
ln -s checkpoint-100 "$M/run-TERM/.latest.tmp" && mv -T "$M/run-TERM/.latest.tmp" "$M/run-TERM/latest" \
	&& sleep 1.1 && [ "$(readlink "$M/run-TERM/latest")" = checkpoint-100 ] \
	&& ok "a real latest (renamed into place) wins" || fail "real latest: -> $(readlink "$M/run-TERM/latest")"
[ "$(ls "$M/run-TERM" | grep -cx latest)" = 1 ] && ok "listed once" || fail "latest listed twice"
rsync -a --delete "$T/run/" "$M/run-INT/" && ok "rsync -a --delete into a run directory" || fail "rsync --delete"
# issue 28 item 8: rm -r of a run directory (rm reached `latest` after the
# steps and exited 1, leaving the directory); and a `latest` the kernel
# still knows of after its last step went unlinks too
cp -a "$T/run" "$M/run-rm" && [ -L "$M/run-rm/latest" ] || fail "run-rm has no latest"
out=$(rm -r "$M/run-rm" 2>&1) && [ ! -e "$M/run-rm" ] && ok "rm -r of a run directory" \
	|| fail "rm -r run: $out; left: $(ls -A "$M/run-rm" 2>&1)"
cp -a "$T/run" "$M/run-rm2" && [ -L "$M/run-rm2/latest" ] || fail "run-rm2 has no latest"
out=$(rm -r "$M/run-rm2"/checkpoint-* 2>&1 && rm "$M/run-rm2/latest" 2>&1 && rmdir "$M/run-rm2" 2>&1) \
	&& ok "the steps, then latest, then the directory" || fail "steps, latest, rmdir: $out"
umount_fs "$M"
[ "$("$ULPACK" ls "$A" run-INT --json | "$PY" -c 'import json,sys; print(sum(e["name"]=="latest" for e in json.load(sys.stdin)))')" = 0 ] \
	&& ok "the computed latest is not archived" || fail "latest archived"
mount_fs "$A" "$M" -o nolatest,ro || fail "mount -o nolatest"
[ -e "$M/run-INT/latest" ] && fail "latest with -o nolatest" || ok "-o nolatest: no latest"
umount_fs "$M"
mount_fs "$A" "$M" -o fsname=ckpt-store,ro || fail "mount -o fsname"
[ "$(findmnt -n -o SOURCE "$M")" = ckpt-store ] && ok "-o fsname=ckpt-store shown by findmnt" \
	|| fail "fsname: $(findmnt -n -o SOURCE "$M")"
umount_fs "$M"

# ---- remount right after fusermount3 -u: waits for the old daemon's queue
"$ULPACK" synth "$T/big" --steps 4 --dim 512 > /dev/null
mount_fs "$A" "$M" || fail mount
rsync -a "$T/big/" "$M/big/" || fail "rsync big"
pid=$(fs_pid "$M")
fusermount3 -u "$M"
mount_fs "$A" "$M" 2> "$T/re" && ok "remount right after fusermount3 -u works" || fail "remount: $(cat "$T/re")"
running "$pid" && fail "old daemon $pid still runs after the remount"
grep -q "waiting" "$T/re" && echo "# it waited: $(cat "$T/re")"
for s in 100 200 300 400; do
	cmp -s "$T/big/checkpoint-$s/model.safetensors" "$M/big/checkpoint-$s/model.safetensors" || fail "big step $s"
done
ok "every file of the unmounted daemon's queue reads back after the remount"
umount_fs "$M"
finish
