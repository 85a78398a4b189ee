#!/bin/sh
# SPDX-License-Identifier: MIT
# s3_archive.sh - issue 26 items 2-5: an archive whose home is a bucket of a
# real Ceph radosgw (cephx, memstore OSD, in network namespaces), each "host"
# a network namespace with a local home of its own (-o cache_dir):
#   - ulpack init s3://; rsync into a read-write mount on host 1; ulpack sync;
#     a read-only mount on host 2 (empty pack cache) compares every byte
#   - the read-only mount follows new steps
#   - two writers racing: exactly one wins, the other stops with BUSY or
#     FENCED; the winner's step is there, byte-identical
#   - a second writer while one holds the lease: BUSY, naming the holder
#   - takeover from another host after the holder is gone (its live index
#     rebuilt from the bucket's generation)
#   - gc on the store: a forgotten step's packs leave the bucket after the grace
#   - radosgw killed and restarted mid-read (EIO or the right bytes) and
#     mid-upload (nothing published half: every step listed reads whole)
#   - a corrupted object: EIO, never wrong bytes
#   - a wrong secret: a clear error naming the object and HTTP 403
. "$(dirname "$0")/lib.sh"
cl_need_ceph
cl_need radosgw radosgw-admin rsync
cl_netns_up 3
cl_rgw_up

export AWS_ENDPOINT_URL="$CL_S3_ENDPOINT" AWS_ACCESS_KEY_ID="$CL_S3_KEY" AWS_SECRET_ACCESS_KEY="$CL_S3_SECRET"
export AWS_REGION=us-east-1 AWS_SHARED_CREDENTIALS_FILE="$T/none" AWS_CONFIG_FILE="$T/none"
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE ULPACK_CACHE_DIR 2> /dev/null
URL=s3://ckpt/runs/a
rgw_pid() { for _p_d in $CL_DAEMONS; do case $_p_d in rgw:*) _p_p=${_p_d#rgw:} ;; esac; done; echo "$_p_p"; }
t0=$(cl_ms)

"$ULPACK" synth "$T/run" --steps 9 --dim 64 > /dev/null || fail "ulpack synth"
# on host I, with host I's local home
u() { _u_i=$1; shift; cl_on "$_u_i" env ULPACK_CACHE_DIR="$T/c$_u_i" "$ULPACK" "$@"; }
# s3_mount I MNT [opts]: ulpackfs of $URL on host I (foreground child, FS_PID)
s3_mount() {
	_s_i=$1 _s_m=$2
	shift 2
	mkdir -p "$_s_m"
	cl_on "$_s_i" "$ULPACKFS" "$URL" "$_s_m" -f -o "cache_dir=$T/c$_s_i,lease=4,grace=6" "$@" > "$_s_m.log" 2>&1 &
	FS_PID=$!
	CL_FS="$CL_FS $_s_m"
	cl_wait 20 mountpoint -q "$_s_m"
}
steps_same() { # MNT STEP...: each step of the run byte-identical under MNT/r
	_q_m=$1
	shift
	for _q_s in "$@"; do
		diff -r "$T/run/checkpoint-$_q_s" "$_q_m/r/checkpoint-$_q_s" > /dev/null 2>&1 || return 1
	done
}

# ---- figures (issue 26's targets; printed, not asserted): the same run archived
# through a mount of a local archive and of the bucket until `ulpack sync`, and
# its newest step read cold (page cache dropped) through fresh read-only mounts:
# local, the bucket with an empty pack cache, the bucket with the pack cache warm.
# S3_BENCH_ROUNDS rounds (1), medians; S3_FIGURES_ONLY=1 runs these alone
# (make bench, section S).
# CACHE URL ROLE: the local home of URL under CACHE (its directory's name
# hashes the endpoint too: found by the URL its file "remote" names)
home_of() { for _h_d in "$1"/s3/*/"$3"; do [ "$(head -n 1 "$_h_d/remote" 2> /dev/null)" = "$2" ] && echo "$_h_d"; done; :; }
med() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
figures() {
	# (make bench: 4 steps of 65 MB; the test itself, 4 of 16 MB, to stay short)
	_f_dim=${S3_BENCH_DIM:-$([ "${S3_FIGURES_ONLY:-}" = 1 ] && echo 1024 || echo 512)}
	"$ULPACK" synth "$T/brun" --steps ${S3_BENCH_STEPS:-4} --dim "$_f_dim" > /dev/null || fail "synth bench"
	last=$(ls "$T/brun" | sort -t- -k2 -n | tail -1)
	mb=$(du -sm "$T/brun" | cut -f1)
	sz=$(stat -c %s "$T/brun/$last/model.safetensors")
	: > "$T/f.arch"; : > "$T/f.cold"; : > "$T/f.warm"; : > "$T/f.rss"
	for round in $(seq ${S3_BENCH_ROUNDS:-1}); do
		for _f_c in "$T/c1" "$T/c2"; do
			for _f_r in writer reader; do
				_f_h=$(home_of "$_f_c" s3://ckpt/bench "$_f_r")
				[ -z "$_f_h" ] || rm -rf "$_f_h"
			done
		done
		rm -rf "$T/local"
		"$ULPACK" init "$T/local" > /dev/null
		mkdir -p "$T/lw"
		"$ULPACKFS" "$T/local" "$T/lw" -f > "$T/lw.log" 2>&1 &
		CL_FS="$CL_FS $T/lw"
		cl_wait 10 mountpoint -q "$T/lw"
		ms=$(cl_ms); rsync -a "$T/brun/" "$T/lw/b/" && timeout 300 "$ULPACK" sync "$T/lw" > /dev/null; tl=$(($(cl_ms) - ms))
		cl_umount_fs "$T/lw" 60
		BURL=s3://ckpt/bench$round
		u 1 init "$BURL" > /dev/null 2>&1 || fail "init $BURL"
		URL=$BURL s3_mount 1 "$T/bw" || fail "bench mount"
		ms=$(cl_ms); rsync -a "$T/brun/" "$T/bw/b/" && timeout 300 "$ULPACK" sync "$T/bw" > /dev/null; ts=$(($(cl_ms) - ms))
		cl_umount_fs "$T/bw" 60
		ratio "$tl" "$ts" >> "$T/f.arch"
		echo >> "$T/f.arch"
		mkdir -p "$T/lr"
		"$ULPACKFS" "$T/local" "$T/lr" -f -o ro > "$T/lr.log" 2>&1 &
		CL_FS="$CL_FS $T/lr"
		cl_wait 10 mountpoint -q "$T/lr"
		tloc=$(rd "$T/lr/b/$last/model.safetensors")
		cl_umount_fs "$T/lr"
		URL=$BURL s3_mount 2 "$T/br" -o ro || fail "bench ro mount"
		cold=$(rd "$T/br/b/$last/model.safetensors")
		cmp -s "$T/br/b/$last/model.safetensors" "$T/brun/$last/model.safetensors" || fail "bench: the newest step differs"
		awk '/VmHWM/ {print $2}' "/proc/$(fs_pid "$T/br")/status" >> "$T/f.rss" 2> /dev/null
		cl_umount_fs "$T/br"
		URL=$BURL s3_mount 2 "$T/br" -o ro || fail "bench ro mount (warm)"
		warm=$(rd "$T/br/b/$last/model.safetensors")
		cl_umount_fs "$T/br"
		echo "# round $round: archiving $mb MB: local $tl ms, bucket $ts ms; newest step ($sz bytes) cold: local $tloc ms, bucket empty pack cache $cold ms, warm $warm ms"
		ratio "$tloc" "$cold" >> "$T/f.cold"
		echo >> "$T/f.cold"
		ratio "$tloc" "$warm" >> "$T/f.warm"
		echo >> "$T/f.warm"
	done
	echo "# figure: archiving $mb MB through a mount until ulpack sync: $(med < "$T/f.arch")x the speed of a local archive (target >= 0.7x)"
	echo "# figure: cold read of the newest step: bucket, empty pack cache $(med < "$T/f.cold")x local (target >= 0.5x); pack cache warm $(med < "$T/f.warm")x (target >= 0.9x); reader peak RSS $(med < "$T/f.rss") kB (decode cache: 1/8 of memory)"
}
dropc() { sync; echo 3 > /proc/sys/vm/drop_caches 2> /dev/null || true; }
rd() { dropc; _r_t=$(cl_ms); cat "$1" > /dev/null; echo $(($(cl_ms) - _r_t)); }
if [ "${S3_FIGURES_ONLY:-}" = 1 ]; then
	figures
	finish
fi

# ---- init, write through a mount, read from another host -----------------------
u 1 init "$URL" > "$T/out" 2>&1 && ok "ulpack init $URL: $(cat "$T/out")" || fail "init: $(cat "$T/out")"
u 2 init "$URL" > "$T/out" 2>&1 && fail "a second init succeeded" ||
	{ grep -q "already an archive" "$T/out" && ok "a second init from host 2: $(cat "$T/out")" || fail "second init: $(cat "$T/out")"; }
s3_mount 1 "$T/w1" && ok "host 1: read-write mount of $URL" || fail "host 1 mount: $(cat "$T/w1.log")"
W1=$FS_PID
mkdir -p "$T/w1/r"
ms=$(cl_ms)
for s in 100 200 300 400; do rsync -a "$T/run/checkpoint-$s" "$T/w1/r/" || fail "rsync step $s"; done
timeout 120 "$ULPACK" sync "$T/w1" > "$T/out" 2>&1 && ok "rsync of 4 steps and ulpack sync in $(cl_secs "$ms") s" ||
	fail "sync: $(cat "$T/out")"
g=$(getfattr --only-values -n user.ulpack.generation "$T/w1" 2> /dev/null)
echo "# writer generation: $g"
s3_mount 2 "$T/r2" -o ro,poll=1 && ok "host 2: read-only mount, empty pack cache" || fail "host 2 mount: $(cat "$T/r2.log")"
steps_same "$T/r2" 100 200 300 400 && ok "host 2 reads all 4 steps byte-identical" || fail "host 2: steps differ"
n=$(ls "$(home_of "$T/c2" "$URL" reader)/packs" | grep -c '\.pack$')
[ "$n" -gt 0 ] && ok "host 2's pack cache holds $n packs" || fail "host 2: no pack cached"

# ---- the read-only mount follows a new step ----------------------------------
rsync -a "$T/run/checkpoint-500" "$T/w1/r/" && timeout 60 "$ULPACK" sync "$T/w1" > "$T/out" 2>&1 || fail "step 500: $(cat "$T/out")"
ms=$(cl_ms)
if cl_wait 20 steps_same "$T/r2" 500; then
	ok "host 2 shows step 500 byte-identical $(cl_secs "$ms") s after the sync"
else
	fail "host 2 does not show step 500 in 20 s"
fi
u 3 ls "$URL" r > "$T/out" 2> "$T/err" && grep -q checkpoint-500 "$T/out" && ok "ulpack ls from host 3 lists step 500" ||
	fail "ulpack ls from host 3: $(cat "$T/err")"
u 3 cat "$URL" r/checkpoint-300/model.safetensors 2> "$T/err" | cmp -s - "$T/run/checkpoint-300/model.safetensors" &&
	ok "ulpack cat from host 3: the same bytes" || fail "ulpack cat from host 3: $(cat "$T/err")"

# ---- Python, no FUSE: ulpack.open_archive of the URL on host 3 --------------------
if [ -e "${top_builddir:-.}/libulpack.so.0" ] && command -v python3 > /dev/null; then
	cl_on 3 env ULPACK_LIB="${top_builddir:-.}/libulpack.so.0" PYTHONPATH="${top_srcdir:-$(dirname "$0")/../..}/python" \
		python3 - "$URL" "$T/cpy" "$T/run" > "$T/out" 2>&1 << 'PYEOF'
import sys, ulpack
url, cache, src = sys.argv[1:4]
with ulpack.open_archive(url, cache_dir=cache) as a:
    with a.open("r/checkpoint-500/model.safetensors") as f:
        got = f.read()
    want = open(src + "/checkpoint-500/model.safetensors", "rb").read()
    print("python: %d bytes %s" % (len(got), "same" if got == want else "DIFFER"))
PYEOF
	grep -q "same" "$T/out" && ok "Python (no FUSE) reads step 500 from $URL: $(cat "$T/out")" ||
		fail "Python read of $URL: $(cat "$T/out")"
fi

# ---- a second writer while the first holds the lease --------------------------
u 2 import "$URL" "$T/run/checkpoint-600" --prefix r/x > "$T/out" 2>&1 && fail "a second writer archived while the first holds the lease" ||
	{ grep -q "another writer holds" "$T/out" && ok "host 2 as a second writer: $(head -c 300 "$T/out")" ||
		fail "second writer: $(cat "$T/out")"; }

# ---- the holder goes; host 3 takes over (its live index from the bucket) -----
cl_umount_fs "$T/w1"
ms=$(cl_ms)
s3_mount 3 "$T/w3" && ok "host 3 takes the archive over after host 1 unmounted ($(cl_secs "$ms") s)" ||
	fail "host 3 mount: $(cat "$T/w3.log")"
steps_same "$T/w3" 100 500 && ok "host 3's writer mount shows host 1's steps" || fail "host 3: steps differ"
rsync -a "$T/run/checkpoint-600" "$T/w3/r/" && timeout 60 "$ULPACK" sync "$T/w3" > "$T/out" 2>&1 || fail "step 600: $(cat "$T/out")"
cl_wait 20 steps_same "$T/r2" 600 && ok "host 2 follows host 3's step 600" || fail "host 2 does not show step 600"
cl_umount_fs "$T/w3"

# ---- two writers racing: exactly one wins ----------------------------------------
mkdir -p "$T/race1" "$T/race2"
cp -r "$T/run/checkpoint-700" "$T/race1/"
cp -r "$T/run/checkpoint-800" "$T/race2/"
u 1 import "$URL" "$T/race1" --prefix r > "$T/race1.out" 2>&1 &
p1=$!
u 2 import "$URL" "$T/race2" --prefix r > "$T/race2.out" 2>&1 &
p2=$!
wait $p1
r1=$?
wait $p2
r2=$?
echo "# race: host 1 exit $r1, host 2 exit $r2"
if [ "$r1" = 0 ] && [ "$r2" = 0 ]; then
	# both may succeed only one after the other (the first gave the lease back)
	steps_same "$T/r2" 700 800 2> /dev/null && ok "race: both imports ran one after the other, both steps whole" ||
		fail "race: both succeeded but the steps are not both there"
elif [ "$r1" = 0 ] || [ "$r2" = 0 ]; then
	win=1 lose=2 ws=700
	[ "$r2" = 0 ] && win=2 lose=1 ws=800
	grep -q -e "another writer" "$T/race$lose.out" && ok "race: host $win won, host $lose stopped: $(head -c 200 "$T/race$lose.out")" ||
		fail "race: host $lose failed without naming the other writer: $(cat "$T/race$lose.out")"
	cl_wait 20 steps_same "$T/r2" "$ws" && ok "race: the winner's step $ws is there, byte-identical" ||
		fail "race: the winner's step $ws is not there"
else
	fail "race: both writers failed: $(cat "$T/race1.out" "$T/race2.out")"
fi

# ---- a writer fenced by a takeover: its next publication fails -------------------
s3_mount 1 "$T/w1" && ok "host 1 writes again" || fail "host 1 remount: $(cat "$T/w1.log")"
W1=$FS_PID
# host 1 stalls (a partition: its lease runs out); host 3 takes over
ip -n "$(cl_ns 1)" link set eth0 down
sleep 6
cl_on 3 env ULPACK_CACHE_DIR="$T/c3" "$ULPACK" import "$URL" "$T/run/checkpoint-900" --prefix r/checkpoint-900 > "$T/out" 2>&1 &&
	ok "host 3 takes over while host 1 is cut off" || fail "host 3 takeover: $(cat "$T/out")"
ip -n "$(cl_ns 1)" link set eth0 up
rsync -a "$T/run/checkpoint-100" "$T/w1/r/late/" 2> /dev/null
timeout 60 "$ULPACK" sync "$T/w1" > "$T/out" 2>&1
if grep -qi -e fenced -e "another writer" -e "stopped" "$T/out" "$T/w1.log"; then
	ok "host 1, back, is fenced: $(grep -hi -e fenced -e 'another writer' -e stopped "$T/out" "$T/w1.log" | head -1 | head -c 200)"
else
	fail "host 1 was not fenced after host 3 took over: $(cat "$T/out")"
fi
cl_wait 20 steps_same "$T/r2" 900 && ok "host 2 shows host 3's step 900" || fail "host 2 lacks step 900"
[ ! -e "$T/r2/r/late" ] && ok "the fenced writer's late step was never published" || fail "a fenced writer published"
cl_umount_fs "$T/w1"

# ---- radosgw killed mid-upload: nothing published half -----------------------------
s3_mount 3 "$T/w3" && ok "host 3 writes again" || fail "host 3 mount: $(cat "$T/w3.log")"
"$ULPACK" synth "$T/big" --steps 2 --dim 512 > /dev/null || fail "synth big"
( rsync -a "$T/big/" "$T/w3/big/" 2> /dev/null; timeout 120 "$ULPACK" sync "$T/w3" > "$T/bsync.out" 2>&1 ) &
bp=$!
sleep 1
kill -9 "$(rgw_pid)"
sleep 2
cl_rgw_start
cl_wait_for rgw 60 cl_rgw_listening || fail "radosgw did not listen again in 60 s"
wait $bp
echo "# sync across the kill: $(head -c 300 "$T/bsync.out")"
# each sync tries the failed files again, as a user would; a bucket gone
# for 3/4 of the lease fenced the writer (its lease object not renewed):
# then the next writer's mount archives what it staged (ulpackfs(1), MANY
# HOSTS), once the old lease has run out
_b_try=0
until timeout 120 "$ULPACK" sync "$T/w3" > "$T/bsync2.out" 2>&1; do
	_b_try=$((_b_try + 1))
	echo "# sync $_b_try after the restart: $(tr '\n' ' ' < "$T/bsync2.out" | head -c 300)"
	[ "$_b_try" -ge 6 ] && { fail "the cut upload is still not archived after $_b_try syncs"; break; }
	if grep -q "stopped archiving" "$T/bsync2.out"; then
		cl_umount_fs "$T/w3" 60
		_b_t0=$(cl_ms)
		until s3_mount 3 "$T/w3"; do
			[ "$(cl_ms)" -gt $((_b_t0 + 30000)) ] && { fail "host 3 mount again: $(cat "$T/w3.log")"; break; }
			sleep 1
		done
		echo "# the fenced writer mounted again ($(cl_secs "$_b_t0") s)"
	else
		sleep 3
	fi
done
missing=0
for f in $(cd "$T/big" && find . -type f | sed 's|^\./||'); do cmp -s "$T/w3/big/$f" "$T/big/$f" || missing=$((missing + 1)); done
[ "$missing" = 0 ] && ok "every file of the upload the kill cut is archived after the restart" ||
	fail "$missing files of the cut upload are not archived after the restart"
cl_umount_fs "$T/w3" 60
rm -rf "$T/c1"
s3_mount 1 "$T/r1" -o ro,poll=1 || fail "host 1 ro: $(cat "$T/r1.log")"
half=0
for f in $(cd "$T/r1" && find big -type f 2> /dev/null); do
	cmp -s "$T/r1/$f" "$T/$f" || half=1
done
[ $half = 0 ] && ok "after a radosgw kill mid-upload every published file reads whole ($(cd "$T/r1" && find big -type f 2> /dev/null | wc -l) files)" ||
	fail "a file published half"
cl_umount_fs "$T/r1"

# ---- radosgw killed and restarted mid-read: a cold read-only mount whose packs
# come at 4 MB/s, so that the kill lands during the fetch --------------------------
rm -rf "$T/c1"
export ULP_TEST_S3_RECV_SPEED=4000000
s3_mount 1 "$T/r1" -o ro,poll=1 && ok "host 1: a cold read-only mount, fetches at 4 MB/s" || fail "host 1 ro: $(cat "$T/r1.log")"
unset ULP_TEST_S3_RECV_SPEED
rm -f "$T/read-failed"
files=$(cd "$T/big" && find . -name '*.safetensors' | sed 's|^\./||')
( for f in $files; do n=$(echo "$f" | tr / _); cat "$T/r1/big/$f" > "$T/read-$n" 2> "$T/read-$n.err" || echo "$f" >> "$T/read-failed"; done ) &
rp=$!
sleep 1
running "$rp" && ok "radosgw killed during the reads" || fail "the reads ended before radosgw was killed"
kill -9 "$(rgw_pid)"
sleep 2
cl_rgw_start
cl_wait_for rgw 60 cl_rgw_listening || fail "radosgw did not listen again in 60 s"
wait $rp
bad=0
for f in $files; do
	n=$(echo "$f" | tr / _)
	if [ -s "$T/read-$n.err" ]; then
		grep -q "Input/output error" "$T/read-$n.err" || bad=1
	else
		cmp -s "$T/read-$n" "$T/big/$f" || bad=1
	fi
done
[ $bad = 0 ] && ok "reads across a radosgw kill -9 and restart: the right bytes or EIO ($(cat "$T/read-failed" 2> /dev/null | wc -l) of $(echo $files | wc -w) failed)" ||
	fail "a read across a radosgw kill gave wrong bytes"
ok_all=1
for f in $files; do cmp -s "$T/r1/big/$f" "$T/big/$f" || ok_all=0; done
[ $ok_all = 1 ] && ok "after the restart the same mount reads every file right" || fail "reads after the restart differ"
cl_umount_fs "$T/r1"

# ---- a corrupted object: EIO, never wrong bytes ----------------------------------
rm -rf "$T/c1"
PROBE=${S3_PROBE:-${top_builddir:-.}/tests/unit/s3_probe}
pk=$(cl_on 1 "$PROBE" ckpt list runs/a/packs/ 2> /dev/null | sort -k2 -n | tail -1 | cut -d' ' -f1)
if [ -n "$pk" ]; then
	sz=$(cl_on 1 "$PROBE" ckpt head "$pk" | cut -d' ' -f1)
	cl_on 1 "$PROBE" ckpt get "$pk" 0 "$sz" > "$T/obj" 2> /dev/null
	python3 -c "
import sys; b=bytearray(open(sys.argv[1],'rb').read()); n=len(b)
for i in range(64, n, max(1, n // 64)): b[i] ^= 0x5a
open(sys.argv[1],'wb').write(b)" "$T/obj"
	cl_on 1 "$PROBE" ckpt putfile "$pk" "$T/obj" 2> "$T/err" || fail "put corrupted: $(cat "$T/err")"
	s3_mount 1 "$T/r1" -o ro || fail "host 1 ro: $(cat "$T/r1.log")"
	wrong=0 eio=0 n=0
	for f in $(cd "$T/r1" && find r big -name '*.safetensors' 2> /dev/null); do
		case $f in r/late*) continue ;; r/checkpoint-9*) src=$T/run/checkpoint-900/${f##*/} ;; r/*) src=$T/run/${f#r/} ;; *) src=$T/$f ;; esac
		n=$((n + 1))
		if cat "$T/r1/$f" > "$T/got" 2> "$T/err"; then
			cmp -s "$T/got" "$src" || wrong=$((wrong + 1))
		else
			grep -q "Input/output error" "$T/err" && eio=$((eio + 1))
		fi
	done
	[ $wrong = 0 ] && [ $eio -gt 0 ] && ok "a corrupted pack object ($pk): of $n files $eio EIO, 0 with wrong bytes" ||
		fail "corrupted object: of $n files $wrong with wrong bytes, $eio EIO"
	cl_umount_fs "$T/r1"
else
	fail "no pack object listed"
fi

# ---- mount(8) and fstab with the URL as the source ----------------------------------
mkdir -p "$T/m2"
if cl_on 2 mount -t fuse "$ULPACKFS#$URL" "$T/m2" -o "ro,cache_dir=$T/c2m" && cl_wait 10 mountpoint -q "$T/m2"; then
	steps_same "$T/m2" 100 900 && ok "mount -t fuse ulpackfs#$URL: the steps read right" || fail "mount -t fuse: steps differ"
	umount "$T/m2"
else
	fail "mount -t fuse ulpackfs#$URL"
fi
printf '%s#%s %s fuse ro,cache_dir=%s 0 0\n' "$ULPACKFS" "$URL" "$T/m2" "$T/c2m" > "$T/fstab"
if cl_on 2 mount -T "$T/fstab" "$T/m2" && cl_wait 10 mountpoint -q "$T/m2"; then
	steps_same "$T/m2" 100 && ok "an fstab line with the URL as the source" || fail "fstab mount: steps differ"
	umount "$T/m2"
else
	fail "fstab mount of $URL"
fi

# ---- gc on the store: a removed step's packs leave the bucket after the grace ------
PROBE=${S3_PROBE:-${top_builddir:-.}/tests/unit/s3_probe}
npacks() { cl_on 1 "$PROBE" ckpt list runs/a/packs/ 2> /dev/null | grep -c '\.pack '; }
s3_mount 3 "$T/w3" && ok "host 3 writes again (gc)" || fail "host 3 mount: $(cat "$T/w3.log")"
before=$(npacks)
rm -r "$T/w3/big" && timeout 60 "$ULPACK" sync "$T/w3" > "$T/out" 2>&1 || fail "rm big: $(cat "$T/out")"
now=$(npacks)
[ "$now" = "$before" ] && ok "right after the removal the bucket keeps its $now packs (the grace)" ||
	fail "packs went before the grace: $before -> $now"
gone() { [ "$(npacks)" -le "$((before - 2))" ]; } # the 2 files' packs at least
ms=$(cl_ms)
cl_wait 40 gone && ok "the removed step's packs left the bucket $(cl_secs "$ms") s after (grace 6 s): $before -> $(npacks)" ||
	fail "the removed step's packs did not leave the bucket in 40 s ($before -> $(npacks))"
steps_same "$T/w3" 100 900 && ok "the other steps still read" || fail "steps lost by gc"
cl_umount_fs "$T/w3"
u 3 gc "$URL" > "$T/out" 2>&1 && ok "ulpack gc $URL: $(tail -1 "$T/out" | head -c 200)" || fail "ulpack gc: $(cat "$T/out")"
u 3 verify "$URL" > "$T/out" 2>&1 && ok "ulpack verify $URL after gc: $(tail -1 "$T/out" | head -c 200)" || fail "ulpack verify: $(cat "$T/out")"

figures

# ---- wrong credentials ---------------------------------------------------------
AWS_SECRET_ACCESS_KEY=WRONGSECRET cl_on 2 env ULPACK_CACHE_DIR="$T/cx" "$ULPACK" ls "$URL" > "$T/out" 2>&1 &&
	fail "a wrong secret listed the archive" ||
	{ grep -q "HTTP 403" "$T/out" && grep -q "s3://ckpt/" "$T/out" && ! grep -q WRONGSECRET "$T/out" &&
		ok "a wrong secret: $(head -c 240 "$T/out")" || fail "wrong secret: $(cat "$T/out")"; }
cl_umount_fs "$T/r2"
echo "# S3 archive checks in $(cl_secs "$t0") s"
finish
