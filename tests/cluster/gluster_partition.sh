#!/bin/sh
# SPDX-License-Identifier: MIT
# gluster_partition.sh - issue 34 item 1 on GlusterFS: a partition of the
# writer's host while it archives, a take-over, the heal, and the next
# writer; no file that was promised is lost, and no file reads wrong bytes.
#
# One cluster (3 hosts), then ULP_PARTITION_ROUNDS (10) independent rounds,
# each on a fresh shared archive p<ROUND> on the volume:
#   1. host 1 (A) mounts it read-write (lease 2 s, grace 10 s), copies 3
#      files in and syncs them; then a loop copies more, one after the other
#   2. host 1's link goes down (cl_host_down) while A archives: right after
#      its archiver committed 1 to 3 files of the loop, more queued
#   3. host 2 (B) takes the lease (read-write mounts retried until one is
#      accepted; where one waits 15 s on the cut-off host, the partition heals
#      and it goes on), copies 3 files in, and `ulpack sync`s them
#   4. the heal (cl_host_up); A says it is fenced; A is unmounted, killed -9,
#      or unmounted only after B (rounds 1, 2, 0 mod 3)
#   5. B unmounts; the next writer mounts read-write (host 3 in odd rounds,
#      host 1 again in even ones) and syncs, and host 2 mounts read-only and
#      follows its generation
#   6. through both: every file B synced is there byte-identical; every file
#      whose cp on A returned 0 before the link went down is there
#      byte-identical (lost: absent, or no next writer); any other file A
#      tried may be absent, but a present one has the right bytes
# A round prints what it saw at each step (the live index as a new opener
# sees it: a copy read with O_DIRECT through host 3, the numbers K of the
# files a/fK and b/fK in it; CURRENT; what staging holds), then what it lost.
# A lost or wrong file, or a writer that finds the index malformed, is a
# failure; ULP_PARTITION_KEEP=DIR keeps each round's logs and index copies.
# The summary line gives the lost files over all rounds.
. "$(dirname "$0")/lib.sh"

P_ROUNDS=${ULP_PARTITION_ROUNDS:-10}
P_LEASE=2
P_GRACE=10
P_NSRC=12 # steps of $T/run, the files' sources
P_OPTS="lease=$P_LEASE,grace=$P_GRACE"

cl_need_gluster
command -v getfattr > /dev/null || skip "no getfattr (attr)"
command -v sqlite3 > /dev/null || skip "no sqlite3 (the CLI: sh tools/install-deps.sh --test)"
cl_netns_up 3
cl_gluster_up
"$ULPACK" synth "$T/run" --steps "$P_NSRC" --dim 256 > /dev/null || fail "ulpack synth"

p_src() { echo "$T/run/checkpoint-$(((($1 - 1) % P_NSRC + 1) * 100))/model.safetensors"; } # K
p_xattr() { timeout 5 getfattr --only-values -n "$2" "$1" 2> /dev/null; }        # MNT NAME
p_gen() { p_xattr "$1" user.ulpack.generation; }
p_fenced() { p_gen "$1" | grep -q fenced; }
p_current() { cat "$(cl_path 3)/$P_A/index/CURRENT" 2> /dev/null || echo "(no CURRENT)"; }
p_queued() { p_xattr "$1" user.ulpack.counters | sed -n 's/.* queued \([0-9]*\) .*/\1/p'; }
# p_staging: what staging holds, through host 3: a/{K...} for the files with
# a .data and a .meta, then the names of the other staging files
p_staging() {
	_s_d=$(cl_path 3)/$P_A/staging
	_s_l=$(ls "$_s_d" 2> /dev/null)
	_s_n="" _s_o=""
	for _s_f in $_s_l; do
		case $_s_f in
		*.data) [ -e "$_s_d/${_s_f%.data}.meta" ] &&
			_s_n="$_s_n $(grep -ao '[ab]/f[0-9]*' "$_s_d/${_s_f%.data}.meta" 2> /dev/null | head -1)" ||
			_s_o="$_s_o $_s_f" ;;
		*.meta) [ -e "$_s_d/${_s_f%.meta}.data" ] || _s_o="$_s_o $_s_f" ;;
		*) _s_o="$_s_o $_s_f" ;;
		esac
	done
	echo "a/{$(echo "$_s_n" | tr ' ' '\n' | sed -n 's|^a/f||p' | sort -n | p_ranges)}${_s_o:+ others:$_s_o}"
}
p_first() { # N WORDS...: the first N words, and how many more
	_f_n=$1
	shift
	[ "$#" -le "$_f_n" ] && { echo " $*"; return; }
	_f_m=$(($# - _f_n))
	echo " $(echo "$@" | cut -d' ' -f1-"$_f_n") (and $_f_m more)"
}
p_note() { echo "+$(cl_secs "$P_T0") s: $*" >> "$P_R/notes"; } # what a round saw, printed after it

# p_db LABEL: the live index as a new opener would see it, read through host 3
# with O_DIRECT (so that no host's page cache is filled by the test): a copy
# of ulpack.db and its -wal in $P_R/db-LABEL, SQLite's quick_check on it, the
# numbers K of the files a/fK and b/fK in it; and whether host 1 reads the
# same ulpack.db bytes (not while it is cut off)
p_direct() { dd if="$1" of="$2" bs=1M iflag=direct status=none 2> /dev/null || cp "$1" "$2"; } # FROM TO
p_nums() { # DB DIR: the numbers K of DIR/fK in the index, as ranges
	sqlite3 "$1" "SELECT CAST(substr(name, 2) AS INTEGER) n FROM entries WHERE path LIKE '$2/f%' ORDER BY n" \
		> "$P_R/nums" 2>&1 || { echo "? $(head -c 80 "$P_R/nums")"; return; }
	p_ranges < "$P_R/nums"
}
p_ranges() { # numbers, one a line, ascending: as "1-3,5"
	awk 'BEGIN { ORS = "" }
		{ if (NR > 1 && $1 == last + 1) { last = $1; run = 1; next }
		  if (NR > 1) print (run ? "-" last : "") ","; print $1; last = $1; run = 0 }
		END { if (NR && run) print "-" last }'
}
p_db() {
	_d_a=$(cl_path 3)/$P_A _d_c=$P_R/db-$1
	mkdir -p "$_d_c"
	p_direct "$_d_a/ulpack.db" "$_d_c/ulpack.db"
	_d_w=no
	[ -e "$_d_a/ulpack.db-wal" ] && p_direct "$_d_a/ulpack.db-wal" "$_d_c/ulpack.db-wal" &&
		_d_w="$(stat -c %s "$_d_c/ulpack.db-wal") bytes"
	# the wal-index header of -shm (mxFrame: the frames its readers use) against
	# the frames SQLite's recovery finds valid in the -wal (its checkpoint's log)
	_d_x=""
	[ -e "$_d_a/ulpack.db-shm" ] && p_direct "$_d_a/ulpack.db-shm" "$P_R/shm" 2> /dev/null &&
		_d_x="; -shm mxFrame $(od -An -tu4 -j16 -N4 "$P_R/shm" | tr -d ' ')"
	# (first: the first close of the copy checkpoints it and removes its -wal)
	[ "$_d_w" = no ] ||
		_d_w="$_d_w, $(sqlite3 "$_d_c/ulpack.db" "PRAGMA wal_checkpoint" 2>&1 | cut -d'|' -f2) frames valid$_d_x"
	_d_q=$(sqlite3 "$_d_c/ulpack.db" "PRAGMA quick_check" 2>&1 | head -1)
	_d_s="live index ($1): $_d_q, a/ {$(p_nums "$_d_c/ulpack.db" a)} b/ {$(p_nums "$_d_c/ulpack.db" b)}; -wal: $_d_w"
	if [ "$P_DOWN" = 0 ]; then # (else host 1's client would wait for its ping timeout)
		p_direct "$(cl_path 1)/$P_A/ulpack.db" "$_d_c/ulpack.db-host1"
		cmp -s "$_d_c/ulpack.db-host1" "$_d_c/ulpack.db" && _d_s="$_d_s; host 1 reads the same ulpack.db" ||
			_d_s="$_d_s; host 1 reads another ulpack.db"
	fi
	echo "$_d_s"
}

# p_pub: the files under a/ and b/ of the generation CURRENT names (ulpack ls
# from host 3, read-only)
p_pub() {
	echo "published: a/ $("$ULPACK" ls "$(cl_path 3)/$P_A" a 2>&1 | grep -c 'f[0-9]*\.safetensors')," \
		"b/ $("$ULPACK" ls "$(cl_path 3)/$P_A" b 2>&1 | grep -c 'f[0-9]*\.safetensors') files"
}

# p_try_mount I MNT OPTS [SECONDS]: host I mounts the archive on MNT (FS_PID):
# 0 mounted (by the mount table: one whose root gives EIO is mounted, and
# checked), 1 refused (the daemon ended), 2 neither within SECONDS (30; the
# daemon still runs)
p_try_mount() {
	mkdir -p "$2"
	"$ULPACKFS" "$(cl_path "$1")/$P_A" "$2" -f -o "$3" >> "$2.log" 2>&1 &
	FS_PID=$!
	case " $CL_FS " in *" $2 "*) ;; *) CL_FS="$CL_FS $2" ;; esac
	cl_wait "${4:-30}" p_mounted_or_gone "$2" "$FS_PID"
	[ -n "$(cl_mounted "$2")" ] && return 0
	running "$FS_PID" && return 2
	return 1
}
p_mounted_or_gone() { [ -n "$(cl_mounted "$1")" ] || cl_gone "$2"; }
p_reader_at() { [ "$(p_gen "$1" | cut -d' ' -f1)" -ge "$2" ] 2> /dev/null; } # MNT GEN
p_take() { # I MNT SECONDS: read-write mounts tried until one is accepted; FS_PID
	_t_end=$(($(cl_ms) + $3 * 1000))
	while :; do
		p_try_mount "$1" "$2" "$P_OPTS"
		case $? in
		0) return 0 ;;
		2)
			p_note "host $1: no mount 30 s after ulpackfs started ($(p_wchan "$FS_PID")): $(tail -1 "$2.log")"
			kill -9 "$FS_PID"
			;;
		esac
		[ "$(cl_ms)" -gt "$_t_end" ] && return 1
		sleep 0.3
	done
}
p_wchan() { # PID: where its threads wait (kernel function, system call number)
	for _c_t in /proc/"$1"/task/*; do
		echo "$(cat "$_c_t/wchan" 2> /dev/null)/$(cut -d' ' -f1 "$_c_t/syscall" 2> /dev/null)"
	done | sort | uniq -c | tr -s ' \n' ' '
}
p_archived() { p_xattr "$1" user.ulpack.counters | sed -n 's/.* archived \([0-9]*\) .*/\1/p'; }
p_archived_ge() { [ "$(p_archived "$1")" -ge "$2" ] 2> /dev/null; } # MNT N

# A's copy loop: file K (from 4 on) into $T/wa/a/fK.safetensors until
# $P_R/stop; each copy logged "K RC START_MS END_MS" in $P_R/a.log
p_a_loop() {
	_l_k=4
	while [ ! -e "$P_R/stop" ] && [ "$_l_k" -le 40 ]; do
		_l_t0=$(cl_ms)
		timeout -k 2 15 cp "$(p_src "$_l_k")" "$P_MA/a/f$_l_k.safetensors" 2> /dev/null
		echo "$_l_k $? $_l_t0 $(cl_ms)" >> "$P_R/a.log"
		_l_k=$((_l_k + 1))
	done
}

# p_check MNT WHO NAME SRC: compares; echo ok, absent or wrong
p_check() {
	if [ ! -e "$1/$3" ]; then
		echo absent
	elif cmp -s "$1/$3" "$2"; then
		echo ok
	else
		echo wrong
	fi
}

# the evidence of a round that lost a file: the live index now; the writers'
# logs (the lines that name a lost file, and the last ones)
p_evidence() { # LOST_NAMES...
	echo "# --- round $P_ROUND evidence (ULP_PARTITION_KEEP=DIR keeps each round's logs and index copies)"
	echo "#   now: $(p_db 9-end); CURRENT $(p_current); staging: $(p_staging)"
	for _e_m in wa wb wn rn; do
		[ -s "$P_R/$_e_m.log" ] || continue
		echo "#   $_e_m.log:"
		{
			for _e_f in $(echo "$@" | tr ' ' '\n' | head -6); do grep -F "$_e_f" "$P_R/$_e_m.log" | head -2; done
			grep -v "holds the archive's lease" "$P_R/$_e_m.log" | tail -4
		} | sort -u | cut -c1-300 | sed 's/^/#     /'
	done
}

P_LOST=0 P_WRONG=0 P_ROUND=0 P_TSUM=0 P_DOWN=0
while [ "$P_ROUND" -lt "$P_ROUNDS" ]; do
	P_ROUND=$((P_ROUND + 1))
	_r_t0=$(cl_ms) P_T0=$(cl_ms)
	P_A=p$P_ROUND
	P_R=$T/round$P_ROUND
	mkdir -p "$P_R"
	: > "$P_R/notes"
	P_MA=$P_R/wa P_MB=$P_R/wb P_MN=$P_R/wn P_RN=$P_R/rn
	# how A goes after the heal, and who writes next: every pairing in 6 rounds
	case $((P_ROUND % 3)) in 1) _r_how=unmounted ;; 2) _r_how="killed -9" ;; 0) _r_how="unmounted after B" ;; esac
	case $((P_ROUND % 2)) in 1) _r_next=3 ;; 0) _r_next=1 ;; esac
	"$ULPACK" init --shared "$(cl_path 1)/$P_A" > "$P_R/init.out" 2>&1 ||
		{ fail "round $P_ROUND: init --shared: $(cat "$P_R/init.out")"; continue; }
	# 1. A writes: 3 files archived (synced), then a loop of copies
	if ! cl_mount_fs 1 "$P_A" "$P_MA" -o "$P_OPTS"; then
		fail "round $P_ROUND: host 1: read-write mount: $(cat "$P_MA.log")"
		continue
	fi
	_r_apid=$FS_PID
	mkdir -p "$P_MA/a"
	for _r_k in 1 2 3; do
		_r_s=$(cl_ms)
		cp "$(p_src "$_r_k")" "$P_MA/a/f$_r_k.safetensors"
		echo "$_r_k $? $_r_s $(cl_ms)" >> "$P_R/a.log"
	done
	timeout 30 "$ULPACK" sync "$P_MA" > "$P_R/sync-a.out" 2>&1 || fail "round $P_ROUND: A: sync: $(cat "$P_R/sync-a.out")"
	_r_a0=$(p_archived "$P_MA")
	cl_bg p_a_loop
	_r_loop=$CL_PID
	# 2. the link goes down while A archives: right after its archiver
	# committed 1 to 3 files of the loop (while more are queued)
	cl_wait 10 p_archived_ge "$P_MA" $((_r_a0 + 1 + P_ROUND % 3)) ||
		p_note "A's archiver did not commit $((1 + P_ROUND % 3)) files of the loop in 10 s"
	p_note "A ($(p_gen "$P_MA")) archived $(p_archived "$P_MA") files, $(p_queued "$P_MA") queued at the partition; CURRENT $(p_current)"
	ls "$(cl_path 1)/$P_A/staging" > "$P_R/staging-a" 2>&1 # (host 1's view, then host 3's)
	_r_down=$(cl_ms) P_DOWN=1
	cl_host_down 1
	p_note "as the partition began: staging: $(p_staging); $(p_db 1-partition)"
	# 3. B takes the lease, writes, syncs (where its mount waits on A's
	# host, for 15 s, the partition heals and B's mount goes on)
	_r_b_ok="" _r_bpid="" _r_up=""
	while :; do
		p_try_mount 2 "$P_MB" "$P_OPTS" 15
		case $? in
		0) break ;;
		2)
			p_note "B's mount waits $(cl_secs "$_r_down") s into the partition ($(p_wchan "$FS_PID")): heal;" \
				"$(tail -1 "$P_MB.log")"
			cl_host_up 1
			_r_up=$(cl_ms) P_DOWN=0
			cl_wait 40 p_mounted_or_gone "$P_MB" "$FS_PID"
			[ -n "$(cl_mounted "$P_MB")" ] && break
			running "$FS_PID" && kill -9 "$FS_PID"
			;;
		esac
		[ "$(cl_ms)" -gt $((_r_down + 60000)) ] && break
		sleep 0.3
	done
	if [ -n "$(cl_mounted "$P_MB")" ]; then
		_r_bpid=$FS_PID
		p_note "B mounted $(cl_secs "$_r_down") s after the link went down${_r_up:+ (after the heal)}: $(p_gen "$P_MB");" \
			"$(grep 'staging:' "$P_MB.log" | tail -1); $(p_db 2-b-mounted)"
		mkdir -p "$P_MB/b"
		_r_b_cp=""
		for _r_k in 1 2 3; do
			if cp "$(p_src $((_r_k + 20)))" "$P_MB/b/f$_r_k.safetensors" 2> "$P_R/cp.err"; then
				_r_b_cp="$_r_b_cp $_r_k"
			else
				fail "round $P_ROUND: B: cp b/f$_r_k: $(cat "$P_R/cp.err")"
			fi
		done
		if timeout 60 "$ULPACK" sync "$P_MB" > "$P_R/sync.out" 2>&1; then
			_r_b_ok=$_r_b_cp # (what B promised: copied, then synced)
		else
			fail "round $P_ROUND: B: ulpack sync: $(cat "$P_R/sync.out")"
		fi
		p_note "B synced: $(p_gen "$P_MB"); CURRENT $(p_current); staging: $(p_staging); $(p_db 3-b-synced); $(p_pub)"
	else
		fail "round $P_ROUND: host 2 could not take over in 60 s: $(tail -1 "$P_MB.log")"
	fi
	# 4. the heal; A is fenced; A goes (unmounted, or killed)
	if [ -z "$_r_up" ]; then
		cl_host_up 1
		_r_up=$(cl_ms) P_DOWN=0
	fi
	# (what counts is the data: a fenced writer that answers late is a
	# liveness fault, noted; one that writes after its fence is caught by
	# the checks below)
	if cl_wait 45 p_fenced "$P_MA"; then
		p_note "A fenced $(cl_secs "$_r_up") s after the heal: $(p_gen "$P_MA")"
	else
		echo "# round $P_ROUND: A does not say it is fenced 45 s after the heal: '$(p_gen "$P_MA")'" \
			"(its threads wait in: $(p_wchan "$_r_apid"))"
		if [ -n "${ULP_PARTITION_GDB:-}" ] && command -v gdb > /dev/null; then
			gdb -batch -ex "thread apply all bt 12" -p "$_r_apid" 2> /dev/null | grep -E '^(Thread|#)' | sed 's/^/#     /' | head -150
		fi
	fi
	touch "$P_R/stop"
	cl_wait 20 cl_gone "$_r_loop" || kill -9 "$_r_loop" 2> /dev/null
	p_note "after the heal: CURRENT $(p_current); staging: $(p_staging); $(p_db 4-healed)"
	case $_r_how in
	unmounted) cl_umount_fs "$P_MA" 10 ;;
	killed*)
		kill -9 "$_r_apid" 2> /dev/null
		cl_wait 10 cl_gone "$_r_apid"
		fusermount3 -u -z "$P_MA" 2> /dev/null
		;;
	esac
	[ "$_r_how" = "unmounted after B" ] || p_note "A $_r_how; CURRENT $(p_current); staging: $(p_staging); $(p_db 5-a-gone)"
	# 5. B goes; the next writer and a reader
	[ -n "$_r_bpid" ] && cl_umount_fs "$P_MB"
	p_note "B unmounted; CURRENT $(p_current); staging: $(p_staging); $(p_db 6-b-gone)"
	if [ "$_r_how" = "unmounted after B" ]; then
		cl_umount_fs "$P_MA" 10
		p_note "A $_r_how; CURRENT $(p_current); staging: $(p_staging); $(p_db 7-a-gone)"
	fi
	_r_checked=""
	if p_take "$_r_next" "$P_MN" 30; then
		timeout 60 "$ULPACK" sync "$P_MN" > "$P_R/sync2.out" 2>&1 ||
			fail "round $P_ROUND: next writer: ulpack sync: $(cat "$P_R/sync2.out")"
		_r_ng=$(p_gen "$P_MN")
		p_note "next writer (host $_r_next): $_r_ng; CURRENT $(p_current); staging: $(p_staging)"
		_r_checked=$P_MN
		_r_ro=0
		until p_try_mount 2 "$P_RN" ro,poll=1; do
			_r_ro=$((_r_ro + 1))
			p_note "host 2: read-only mount failed: $(tail -1 "$P_RN.log")"
			running "$FS_PID" && kill -9 "$FS_PID"
			[ "$_r_ro" -ge 5 ] && break
			sleep 0.5
		done
		if [ -n "$(cl_mounted "$P_RN")" ]; then
			if cl_wait 10 p_reader_at "$P_RN" "${_r_ng%% *}"; then
				_r_checked="$P_MN $P_RN"
			else
				fail "round $P_ROUND: the reader is at $(p_gen "$P_RN"), not the next writer's $_r_ng"
			fi
		else
			fail "round $P_ROUND: host 2: read-only mount: $(tail -1 "$P_RN.log")"
		fi
	else
		fail "round $P_ROUND: host $_r_next: no read-write mount in 30 s: $(tail -1 "$P_MN.log")"
	fi
	[ -n "$_r_checked" ] || _r_checked=$P_R/none # (nothing to read: all lost)
	# 6. the files
	_r_must=0 _r_lost="" _r_wrong="" _r_other=0 _r_other_there=0 _r_during=0
	for _r_m in $_r_checked; do
		for _r_k in $_r_b_ok; do
			case $(p_check "$_r_m" "$(p_src $((_r_k + 20)))" "b/f$_r_k.safetensors") in
			ok) ;;
			absent) _r_lost="$_r_lost b/f$_r_k.safetensors@${_r_m##*/}" ;;
			wrong) _r_wrong="$_r_wrong b/f$_r_k.safetensors@${_r_m##*/}" ;;
			esac
		done
		while read -r _r_k _r_rc _r_s _r_e; do
			_r_st=$(p_check "$_r_m" "$(p_src "$_r_k")" "a/f$_r_k.safetensors")
			if [ "$_r_rc" = 0 ] && [ "$_r_e" -lt "$_r_down" ]; then
				[ "$_r_m" = "$P_MN" ] && _r_must=$((_r_must + 1))
				case $_r_st in
				absent) _r_lost="$_r_lost a/f$_r_k.safetensors@${_r_m##*/}" ;;
				wrong) _r_wrong="$_r_wrong a/f$_r_k.safetensors@${_r_m##*/}" ;;
				esac
			else
				[ "$_r_m" = "$P_MN" ] && _r_other=$((_r_other + 1))
				[ "$_r_m" = "$P_MN" ] && [ "$_r_rc" = 0 ] && _r_during=$((_r_during + 1))
				case $_r_st in
				ok) [ "$_r_m" = "$P_MN" ] && _r_other_there=$((_r_other_there + 1)) ;;
				wrong) _r_wrong="$_r_wrong a/f$_r_k.safetensors@${_r_m##*/}" ;;
				esac
			fi
		done < "$P_R/a.log"
	done
	for _r_m in $P_RN $P_MN; do [ -n "$(cl_mounted "$_r_m")" ] && cl_umount_fs "$_r_m"; done
	p_note "the next writer and the reader unmounted; CURRENT $(p_current); staging: $(p_staging)"
	_r_nl=$(echo $_r_lost | wc -w) _r_nw=$(echo $_r_wrong | wc -w)
	P_LOST=$((P_LOST + _r_nl)) P_WRONG=$((P_WRONG + _r_nw))
	_r_bad=$(cat "$P_R/wb.log" "$P_R/wn.log" "$P_R/rn.log" 2> /dev/null | grep -c 'malformed')
	[ "$_r_bad" = 0 ] || fail "round $P_ROUND: $_r_bad lines of B's, the next writer's or the reader's log say" \
		"the index is malformed: $(grep -h malformed "$P_R/wb.log" "$P_R/wn.log" "$P_R/rn.log" 2> /dev/null | head -1)"
	_r_io=$(cat "$P_R"/w?.log "$P_R/rn.log" 2> /dev/null | grep -c 'disk I/O error')
	[ "$_r_io" = 0 ] || p_note "$_r_io lines of the logs say disk I/O error"
	echo "# round $P_ROUND:"
	sed 's/^/#   /' "$P_R/notes"
	[ "$_r_nl" = 0 ] && [ "$_r_nw" = 0 ] && [ "$_r_bad" = 0 ] ||
		p_evidence $(echo "$_r_lost $_r_wrong" | tr ' ' '\n' | sed 's/@.*//' | sort -u)
	_r_msg="round $P_ROUND (A $_r_how, next writer host $_r_next): B's $(echo $_r_b_ok | wc -w) synced,"
	_r_msg="$_r_msg A's $_r_must closed before the partition; A's $_r_other later or failed copies"
	_r_msg="$_r_msg ($_r_during returned 0) of which $_r_other_there are there"
	if [ "$_r_nl" = 0 ] && [ "$_r_nw" = 0 ]; then
		ok "$_r_msg: 0 lost, 0 wrong ($(cl_secs "$_r_t0") s)"
	else
		fail "$_r_msg: $_r_nl LOST:$(p_first 12 $_r_lost); $_r_nw WRONG:$(p_first 12 $_r_wrong) ($(cl_secs "$_r_t0") s)"
	fi
	[ -z "${ULP_PARTITION_KEEP:-}" ] || cp -r "$P_R" "$ULP_PARTITION_KEEP/" # (logs, notes, copies of the index)
	P_TSUM=$((P_TSUM + $(cl_ms) - _r_t0))
done
echo "# summary: $P_ROUNDS rounds of partition during archiving, take-over, heal, next writer:" \
	"$P_LOST files lost, $P_WRONG wrong; $((P_TSUM / P_ROUNDS / 1000)) s a round"
finish
