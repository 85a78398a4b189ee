#!/bin/sh
# SPDX-License-Identifier: MIT
# gluster_contrib.sh - issue 37 on GlusterFS: many hosts write, one
# archives (ulpackfs(1) MANY HOSTS). Host 1 holds the lease (the archiver),
# hosts 2 and 3 mount read-write with -o contribute, host 4 read-only. Each
# host's ranks of one real torch.distributed.checkpoint.save (gloo, PER
# ranks a host: ULP_CONTRIB_RANKS, default 2) save into its own mount, for
# several steps, and the same save straight onto the shared volume (the
# reference); host 4 reads every file byte-identical and dcp.loads the
# steps. Then: kill -9 of the archiver with the contributors' files staged
# (a new archiver takes the lease and drains every host's staging), a
# contributor killed -9 mid-save (its closed files archived, its open one
# dropped), a contributor partitioned (its writes fail, nothing lands
# nowhere), and the conflicts: the same path from two hosts (the version
# the archiver takes last wins), archived files changed only by the
# archiver, `latest` across hosts. Prints the figures of the issue: save
# into a contributor's mount vs straight onto the volume, seconds from the
# last close to published, the archive's du vs one ulpack import.
. "$(dirname "$0")/lib.sh"
TPY=${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python}
"$TPY" -c "import torch, torch.distributed.checkpoint" 2> /dev/null ||
	skip "no python with torch at $TPY (sh tools/install-pydeps.sh)"
PER=${ULP_CONTRIB_RANKS:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
cl_need_gluster
cl_netns_up 4
cl_gluster_up
A=arch
LEASE=4
# mount_host I MNT [options]: ulpackfs of host I's archive on MNT under host
# I's own name (a UTS namespace: hosts of a real cluster differ in name, and
# the name is a contributor's staging directory); pid in FS_PID
mount_host() {
	_h=$1 _m=$2
	shift 2
	mkdir -p "$_m"
	unshare -u sh -c 'hostname "$0" && exec "$@"' "node$_h" "$ULPACKFS" "$(cl_path "$_h")/$A" "$_m" -f "$@" \
		> "$_m.log" 2>&1 &
	FS_PID=$!
	CL_FS="$CL_FS $_m"
	cl_wait 10 mountpoint -q "$_m"
}
"$ULPACK" init --shared "$(cl_path 1)/$A" > "$T/out" 2>&1 || fail "init --shared: $(cat "$T/out")"
mount_host 1 "$T/m1" -o "lease=$LEASE,grace=1" || fail "host 1: read-write mount: $(cat "$T/m1.log")"
W_PID=$FS_PID
for h in 2 3; do
	mount_host "$h" "$T/m$h" -o contribute,poll=1 || fail "host $h: contributor mount: $(cat "$T/m$h.log")"
	eval "C${h}_PID=\$FS_PID"
	grep -q "this mount contributes" "$T/m$h.log" && ok "host $h contributes: $(grep contributes "$T/m$h.log")" ||
		fail "host $h: not a contributor: $(cat "$T/m$h.log")"
done
mount_host 4 "$T/m4" -o ro,poll=1 || fail "host 4: read-only mount: $(cat "$T/m4.log")"
PLAIN=$(cl_path 2)/plain # the reference, straight onto the shared volume
mkdir -p "$PLAIN" "$T/m1/run" "$T/m2/run" "$T/m3/run"

# all_same STEP...: every rank file of the plain copy reads byte-identical on
# host 4, and each step has its .metadata (which names the directory it was
# saved to, so it differs from the plain copy's: dcp.load checks it)
all_same() { [ "$(count_lost "$@")" = 0 ]; }
count_lost() { # STEP...: files of the plain copy missing or different on host 4 (named in $T/lost)
	_n=0
	: > "$T/lost"
	for _s in "$@"; do
		for _f in "$PLAIN/step-$_s"/*; do
			cmp -s "$_f" "$T/m4/run/step-$_s/$(basename "$_f")" || { _n=$((_n + 1)); echo "$_f" >> "$T/lost"; }
		done
		[ -s "$T/m4/run/step-$_s/.metadata" ] || { _n=$((_n + 1)); echo "step-$_s/.metadata" >> "$T/lost"; }
	done
	echo $_n
}
dcp_save() { # STEP0 STEPS [HOST HOST HOST]: the mounts host 1's, 2's and 3's ranks save into
	_d1=${3:-1} _d2=${4:-2} _d3=${5:-3}
	timeout 300 "$TPY" "$HERE/dcp_hosts.py" save "$PER" $((29500 + $$ % 500)) "$1" "$2" "$PLAIN" \
		"$T/m$_d1/run" "$T/m$_d2/run" "$T/m$_d3/run" > "$T/save.out" 2>&1
}

# ---- three hosts save one run, 3 steps ----------------------------------------
if dcp_save 0 3; then
	T_CLOSE=$(cl_ms)
	ok "$((3 * PER)) ranks on 3 hosts saved 3 steps: $(cat "$T/save.out")"
else
	fail "dcp save: $(tail -5 "$T/save.out")"
fi
for h in 2 3; do
	timeout 60 "$ULPACK" sync "$T/m$h" > "$T/sync.out" 2>&1 || fail "host $h: ulpack sync: $(cat "$T/sync.out")"
done
T_SYNCED=$(cl_ms)
timeout 60 "$ULPACK" sync "$T/m1" > "$T/sync.out" 2>&1 || fail "host 1: ulpack sync: $(cat "$T/sync.out")"
if cl_wait 30 all_same 1 2 3; then
	ok "host 4 reads every file of steps 1-3 byte-identical ($(ls "$PLAIN/step-3" | wc -l) files a step)," \
		"$(cl_secs "$T_CLOSE") s after the last close (the contributors' sync returned after $(cl_secs "$T_CLOSE" "$T_SYNCED") s; target 10 s)"
else
	fail "host 4: $(count_lost 1 2 3) files of steps 1-3 missing or different: $(cat "$T/lost")"
fi
for h in 2 3; do
	[ -z "$(find "$(cl_path 1)/$A/staging/h-"* -name '*.data' 2> /dev/null)" ] ||
		fail "host $h's staging not empty after its sync: $(ls "$(cl_path 1)/$A/staging/"h-*)"
done
if timeout 120 "$TPY" "$HERE/../integration/dcp_run.py" load 2 $((30000 + $$ % 500)) \
	"$T/m4/run/step-3" "$PLAIN/step-3" > "$T/load.out" 2>&1; then
	ok "dcp.load of step 3 from host 4's read-only mount into 2 ranks equals the plain copy's"
else
	fail "dcp.load from host 4: $(tail -5 "$T/load.out")"
fi
l=$(readlink "$T/m4/run/latest")
[ "$l" = step-3 ] && ok "latest on host 4 is step-3 (its files from 3 hosts)" || fail "latest on host 4: '$l'"

# ---- the archive's size against one import of the same files --------------------
mkdir -p "$T/imp/run" && cp -r "$PLAIN"/step-* "$T/imp/run/"
"$ULPACK" init "$T/ia" > /dev/null && "$ULPACK" import "$T/ia" "$T/imp" > /dev/null 2>&1 ||
	fail "ulpack import of the plain copy"
sleep 2 # the grace of the packs re-coding dropped
timeout 60 "$ULPACK" sync "$T/m1" > /dev/null 2>&1
du_a=$(du -sk --exclude=staging --exclude=index --exclude=lease "$(cl_path 1)/$A/packs" | cut -f1)
du_i=$(du -sk "$T/ia/packs" | cut -f1)
ok "packs: $du_a KiB through 3 hosts, $du_i KiB by one ulpack import ($(awk "BEGIN{printf \"%.3f\", $du_a / $du_i}")x; target within 2 %)"

# ---- conflicts --------------------------------------------------------------------
head -c 70000 /dev/urandom > "$T/x2" && head -c 71000 /dev/urandom > "$T/x3"
cp "$T/x2" "$T/m2/run/x.bin" && timeout 60 "$ULPACK" sync "$T/m2" > /dev/null 2>&1
sleep 1.2
cp "$T/x3" "$T/m3/run/x.bin" && timeout 60 "$ULPACK" sync "$T/m3" > /dev/null 2>&1
cl_wait 10 cmp -s "$T/x3" "$T/m4/run/x.bin" && ok "the same path from hosts 2 then 3: host 3's later close wins" ||
	fail "x.bin on host 4 is not host 3's version"
cl_wait 10 cmp -s "$T/x3" "$T/m2/run/x.bin" && ok "host 2 reads host 3's version too" || fail "host 2: x.bin stale"
rm "$T/m2/run/x.bin" 2> "$T/err" && fail "host 2 removed an archived file" ||
	ok "a contributor does not remove an archived file: $(cat "$T/err")"
mv "$T/m3/run/step-1" "$T/m3/run/step-x" 2> "$T/err" && fail "host 3 renamed an archived directory" ||
	ok "nor rename one: $(cat "$T/err")"
mv "$T/m1/run/x.bin" "$T/m1/run/y.bin" && timeout 60 "$ULPACK" sync "$T/m1" > /dev/null 2>&1 &&
	cl_wait 10 cmp -s "$T/x3" "$T/m2/run/y.bin" && ok "the archiver renames a file host 3 wrote; host 2 follows" ||
	fail "rename on the archiver: $(ls "$T/m2/run")"
# a directory removed on the archiver under a contributor's writes: what is
# written after the removal brings it back, what was there before goes
mkdir "$T/m2/run/d2" && cp "$T/x2" "$T/m2/run/d2/f" && timeout 60 "$ULPACK" sync "$T/m2" > /dev/null 2>&1
cl_wait 10 test -f "$T/m1/run/d2/f" && rm -r "$T/m1/run/d2" && timeout 60 "$ULPACK" sync "$T/m1" > /dev/null 2>&1 ||
	fail "rm -r run/d2 on the archiver"
cp "$T/x3" "$T/m2/run/d2/g" 2> "$T/err" && timeout 60 "$ULPACK" sync "$T/m2" > /dev/null 2>&1
if cl_wait 10 cmp -s "$T/x3" "$T/m4/run/d2/g" && [ ! -e "$T/m4/run/d2/f" ]; then
	ok "a directory removed on the archiver while host 2 writes under it: the later file brings it back, the removed one stays gone"
elif [ -s "$T/err" ]; then
	ok "a directory removed on the archiver: host 2's write under it fails: $(cat "$T/err")"
else
	fail "run/d2 after its removal: $(ls -la "$T/m4/run/d2" 2>&1)"
fi

# ---- kill -9 of the archiver with the contributors' files staged ------------------
kill -9 "$W_PID"
cl_wait 10 cl_gone "$W_PID"
fusermount3 -u -z "$T/m1" 2> /dev/null
dcp_save 3 1 2 2 3 || fail "dcp save of step 4 with no archiver: $(tail -5 "$T/save.out")"
staged=$(find "$(cl_path 1)/$A/staging" -name '*.data' | wc -l)
t0=$(cl_ms)
until mount_host 1 "$T/n1" -o "lease=$LEASE,grace=1"; do
	[ "$(cl_ms)" -gt $((t0 + 40000)) ] && break
	sleep 0.5
done
mountpoint -q "$T/n1" && ok "host 1 took the lease over $(cl_secs "$t0") s after kill -9 of its archiver" \
	"($staged files staged by the contributors meanwhile)" ||
	fail "host 1 could not take the lease back in 40 s: $(tail -3 "$T/n1.log")"
for h in 2 3; do
	timeout 90 "$ULPACK" sync "$T/m$h" > "$T/sync.out" 2>&1 || fail "host $h: sync after the take-over: $(cat "$T/sync.out")"
done
timeout 60 "$ULPACK" sync "$T/n1" > /dev/null 2>&1
cl_wait 30 all_same 1 2 3 4
ok "files lost to the kill of the archiver: $(count_lost 1 2 3 4) (target 0) $(cat "$T/lost")"
[ "$(count_lost 1 2 3 4)" = 0 ] || fail "files lost after the archiver's kill"

# ---- a contributor killed mid-save ---------------------------------------------------
head -c 50000 /dev/urandom > "$T/k"
mkdir -p "$T/m3/run/k" && cp "$T/k" "$T/m3/run/k/closed.bin"
"$TPY" -c "
import os, time, sys
f = open(sys.argv[1], 'wb'); f.write(os.urandom(4000)); f.flush(); os.fsync(f.fileno())
open(sys.argv[2], 'w').close(); time.sleep(60)" "$T/m3/run/k/open.bin" "$T/k.ready" &
KP=$!
cl_wait 10 test -f "$T/k.ready"
kill -9 "$C3_PID"
kill -9 "$KP" 2> /dev/null
cl_wait 10 cl_gone "$C3_PID"
fusermount3 -u -z "$T/m3" 2> /dev/null
cl_wait 20 cmp -s "$T/k" "$T/m4/run/k/closed.bin" && ok "a contributor killed -9: its closed file is archived" ||
	fail "host 3's closed file lost"
mount_host 3 "$T/m3" -o contribute,poll=1 || fail "host 3 again: $(cat "$T/m3.log")"
sleep 2
[ ! -e "$T/m4/run/k/open.bin" ] && [ -z "$(find "$(cl_path 3)/$A/staging/h-"* -name '*.data' 2> /dev/null)" ] &&
	ok "its file open at the kill is dropped (never archived; its next mount removed it)" ||
	fail "host 3's open file: $(ls -la "$T/m4/run/k" "$(cl_path 3)/$A/staging/"h-* 2>&1)"

# ---- a contributor partitioned: its writes fail, none lands nowhere -------------------
cl_host_down 2
head -c 300000 /dev/urandom > "$T/p"
if timeout 60 dd if="$T/p" of="$T/m2/run/part.bin" bs=64k conv=fsync 2> "$T/err"; then
	fail "a write on a partitioned contributor succeeded"
else
	ok "a write on a partitioned contributor fails: $(tail -1 "$T/err")"
fi
cl_host_up 2
sleep 3
if [ -e "$T/m4/run/part.bin" ]; then
	cmp -s "$T/p" "$T/m4/run/part.bin" && ok "(its file arrived whole after the heal)" ||
		fail "a torn part.bin was archived"
fi
ok "files lost in the kill and partition tests: $(count_lost 1 2 3 4) (target 0)"
[ "$(count_lost 1 2 3 4)" = 0 ] || fail "files lost"
for m in m2 m3 m4 n1; do cl_umount_fs "$T/$m"; done
finish
