# SPDX-License-Identifier: MIT
# many.sh - the checks of issue 25 on a shared volume (sourced after lib.sh,
# its cluster up): one writer host and reader hosts on a shared archive
# (ulpackfs(1), MANY HOSTS). Each check prints its figures; what the tests
# assert is correctness (bytes, errors, epochs, generations), with generous
# time bounds, never a speed.
#   mh_setup            a shared archive made on host 1, a run of 40 steps to copy
#   mh_writer I         host I mounts it read-write ($T/wI), lease 4 s, grace 8 s
#   mh_reader I [POLL]  host I mounts it read-only ($T/rI), poll 1 s
#   mh_new_step S       step S copied into the writer's mount and synced: how
#                       soon every reader shows it, byte-identical
#   mh_reads_during_writes N W   readers read (every file they list, compared)
#                       while the writer archives W steps, until N reads
#   mh_gc_old_reader    a reader that does not follow (poll an hour) keeps
#                       reading its generation while the writer removes steps and
#                       reclaims; the packs go after the grace
#   mh_kill_takeover    kill -9 of the writer with a file staged; host 2 takes over
#                       after the lease, recovers it, with the next epoch
#   mh_partition SECS   the writer's host (2) loses its link for SECS s; host 3
#                       takes over; after the heal the old writer stays fenced and no
#                       generation went back

MH_ARCH=${MH_ARCH:-arch} # under each host's path
MH_LEASE=4
MH_GRACE=8
MH_W=1        # the host of the writer now
MH_READERS="" # hosts with a read-only mount

mh_setup() {
	"$ULPACK" synth "$T/run" --steps 40 --dim 32 > /dev/null || fail "ulpack synth"
	"$ULPACK" init --shared "$(cl_path 1)/$MH_ARCH" > "$T/out" 2>&1 && ok "host 1: $(cat "$T/out")" ||
		fail "host 1: init --shared: $(cat "$T/out")"
	MH_SRC=$T/run
}

mh_writer() { # I [options]: host I mounts the archive read-write on $T/wI
	_w_i=$1
	shift
	cl_mount_fs "$_w_i" "$MH_ARCH" "$T/w$_w_i" -o "lease=$MH_LEASE,grace=$MH_GRACE" "$@" || return 1
	MH_W=$_w_i
	MH_WPID=$FS_PID
	mkdir -p "$T/w$_w_i/r"
}

mh_reader() { # I [POLL]: host I mounts the archive read-only on $T/rI
	cl_mount_fs "$1" "$MH_ARCH" "$T/r$1" -o "ro,poll=${2:-1}" || return 1
	MH_READERS="$MH_READERS $1"
}

mh_gen() { getfattr --only-values -n user.ulpack.generation "$1" 2> /dev/null; }

mh_shows() { # MNT STEP: the reader at MNT shows step STEP byte-identically
	cmp -s "$1/r/checkpoint-$2/model.safetensors" "$MH_SRC/checkpoint-$2/model.safetensors"
}

mh_copy_sync() { # STEP: into the writer's mount, then ulpack sync (publishes)
	mkdir -p "$T/w$MH_W/r/checkpoint-$1" &&
		cp "$MH_SRC/checkpoint-$1/model.safetensors" "$T/w$MH_W/r/checkpoint-$1/" &&
		timeout 60 "$ULPACK" sync "$T/w$MH_W" > "$T/sync.out" 2>&1
}

mh_new_step() { # STEP
	mh_copy_sync "$1" || { fail "writer host $MH_W: step $1: $(cat "$T/sync.out")"; return; }
	_n_t0=$(cl_ms)
	for _n_i in $MH_READERS; do
		if cl_wait 20 mh_shows "$T/r$_n_i" "$1"; then
			ok "host $_n_i shows step $1 byte-identical $(cl_secs "$_n_t0") s after ulpack sync returned" \
				"(poll 1 s; target: poll + 2 s); generation $(mh_gen "$T/r$_n_i")"
		else
			fail "host $_n_i: step $1 not shown 20 s after sync (generation $(mh_gen "$T/r$_n_i"), writer's $(mh_gen "$T/w$MH_W"))"
		fi
		_n_l=$(readlink "$T/r$_n_i/r/latest")
		[ "$_n_l" = "checkpoint-$1" ] || fail "host $_n_i: latest is '$_n_l', not checkpoint-$1"
	done
}

# a reader's loop: every file its mount lists, read and compared, until
# $T/stop; counts in $T/reads-I: reads errors wrong
mh_read_loop() { # I
	_l_r=0 _l_e=0 _l_w=0
	while [ ! -e "$T/stop" ]; do
		for _l_d in $(ls "$T/r$1/r" 2> /dev/null); do
			case $_l_d in checkpoint-*) ;; *) continue ;; esac
			# a step's directory is made (and published) before its file is
			# archived, as on any file system: a file not there yet is no read
			[ -e "$T/r$1/r/$_l_d/model.safetensors" ] || continue
			cmp "$T/r$1/r/$_l_d/model.safetensors" "$MH_SRC/$_l_d/model.safetensors" > /dev/null 2> "$T/cmp-$1"
			case $? in
			0) ;;
			1) _l_w=$((_l_w + 1)); echo "wrong bytes: host $1 $_l_d" >> "$T/read-errors" ;;
			*) _l_e=$((_l_e + 1)); echo "read error: host $1 $_l_d: $(cat "$T/cmp-$1")" >> "$T/read-errors" ;;
			esac
			_l_r=$((_l_r + 1))
		done
		echo "$_l_r $_l_e $_l_w" > "$T/reads-$1.tmp" && mv "$T/reads-$1.tmp" "$T/reads-$1"
	done
}

mh_total_reads() {
	_t_n=0
	for _t_i in $MH_READERS; do
		[ -e "$T/reads-$_t_i" ] && _t_n=$((_t_n + $(cut -d' ' -f1 "$T/reads-$_t_i")))
	done
	echo "$_t_n"
}
mh_enough_reads() { [ "$(mh_total_reads)" -ge "$1" ]; }

MH_NEXT=200 # the next step of $T/run that mh_reads_during_writes archives
mh_reads_during_writes() { # N W
	rm -f "$T/stop" "$T/read-errors"
	_r_pids=""
	for _r_i in $MH_READERS; do
		mh_read_loop "$_r_i" &
		_r_pids="$_r_pids $!"
		CL_BGS="$CL_BGS $!"
	done
	_r_t0=$(cl_ms) _r_ok=0
	for _r_k in $(seq "$2"); do
		mh_copy_sync "$MH_NEXT" && _r_ok=$((_r_ok + 1)) || echo "# step $MH_NEXT: $(cat "$T/sync.out")"
		MH_NEXT=$((MH_NEXT + 100))
	done
	_r_tw=$(cl_secs "$_r_t0")
	cl_wait 120 mh_enough_reads "$1"
	touch "$T/stop"
	for _r_p in $_r_pids; do wait "$_r_p" 2> /dev/null; done
	_r_n=0 _r_e=0 _r_w=0
	for _r_i in $MH_READERS; do
		read -r _a _b _c < "$T/reads-$_r_i"
		_r_n=$((_r_n + _a)) _r_e=$((_r_e + _b)) _r_w=$((_r_w + _c))
	done
	[ "$_r_ok" = "$2" ] || fail "the writer archived $_r_ok of $2 steps"
	if [ "$_r_n" -ge "$1" ] && [ "$_r_e" = 0 ] && [ "$_r_w" = 0 ]; then
		ok "$_r_n reads from hosts$MH_READERS while the writer archived $2 steps in $_r_tw s: 0 errors, 0 wrong bytes"
	else
		fail "$_r_n reads (wanted $1), $_r_e errors, $_r_w wrong: $(head -3 "$T/read-errors" 2> /dev/null)"
		for _r_i in $MH_READERS; do echo "# host $_r_i's log:"; tail -5 "$T/r$_r_i.log"; done
		echo "# the writer's log:"; tail -5 "$T/w$MH_W.log"
	fi
}

mh_packs() { ls "$(cl_path "$MH_W")/$MH_ARCH/packs" | grep -c '\.pack$'; }

mh_gc_old_reader() { # I: host I's reader does not follow; the writer removes 5 steps
	_g_i=$1
	mh_reader "$_g_i" 3600 || { fail "host $_g_i: read-only mount"; return; }
	_g_steps=$(ls "$T/r$_g_i/r" | grep checkpoint- | sort -t- -k2 -n | head -5)
	_g_packs=$(mh_packs)
	for _g_d in $_g_steps; do rm -rf "$T/w$MH_W/r/$_g_d"; done
	timeout 60 "$ULPACK" sync "$T/w$MH_W" > /dev/null
	_g_t0=$(cl_ms) _g_bad=0 _g_n=0
	# the writer reclaims by itself when idle; the old reader reads all it
	# knows, the removed steps too, until the grace
	while [ "$(cl_ms)" -lt $((_g_t0 + MH_GRACE * 1000 / 2)) ]; do
		for _g_d in $_g_steps; do
			cmp -s "$T/r$_g_i/r/$_g_d/model.safetensors" "$MH_SRC/$_g_d/model.safetensors" || _g_bad=$((_g_bad + 1))
			_g_n=$((_g_n + 1))
		done
		sleep 0.2
	done
	[ "$_g_bad" = 0 ] && ok "host $_g_i (an old generation, $(mh_gen "$T/r$_g_i")) read the 5 removed steps $_g_n times" \
		"during the grace (${MH_GRACE} s) while the writer reclaimed: 0 errors" ||
		fail "host $_g_i: $_g_bad of $_g_n reads of removed steps failed within the grace"
	for _g_r in $MH_READERS; do
		[ "$_g_r" = "$_g_i" ] && continue
		cl_wait 10 mh_absent "$T/r$_g_r/r/$(echo "$_g_steps" | head -1)" ||
			fail "host $_g_r still shows a removed step"
	done
	# after the grace the packs go: the disk comes back
	if cl_wait 60 mh_fewer_packs "$_g_packs"; then
		ok "the writer removes packs past their grace: $_g_packs -> $(mh_packs) pack files"
	else
		fail "no pack removed 60 s after the grace ($_g_packs -> $(mh_packs))"
	fi
	_g_rest=$((_g_t0 + (MH_GRACE + 4) * 1000 - $(cl_ms)))
	[ "$_g_rest" -gt 0 ] && cl_sleep "$((_g_rest / 1000)).$((_g_rest % 1000 / 100))"
	# the old reader now: its removed steps give an error or the right bytes, never wrong ones
	_g_w=0
	for _g_d in $_g_steps; do
		cat "$T/r$_g_i/r/$_g_d/model.safetensors" > "$T/old.out" 2> "$T/old.err" &&
			! cmp -s "$T/old.out" "$MH_SRC/$_g_d/model.safetensors" && _g_w=$((_g_w + 1))
	done
	[ "$_g_w" = 0 ] && ok "past the grace the old reader gets an error or the right bytes, never wrong ones" \
		"($(head -c 120 "$T/old.err"))" || fail "past the grace: $_g_w files read wrong"
	cl_umount_fs "$T/r$_g_i"
	MH_READERS=$(echo "$MH_READERS" | sed "s/ $_g_i\$//; s/ $_g_i / /")
}
mh_absent() { [ ! -e "$1" ]; }
mh_fewer_packs() { [ "$(mh_packs)" -lt "$1" ]; }

mh_epoch() { mh_gen "$1" | cut -d' ' -f2; }

# host I tries a read-write mount on $T/wI: whether it is mounted (a refused
# one ends at once: no 10 s wait)
mh_try_rw() { # I
	mkdir -p "$T/w$1"
	"$ULPACKFS" "$(cl_path "$1")/$MH_ARCH" "$T/w$1" -f -o "lease=$MH_LEASE,grace=$MH_GRACE" > "$T/w$1.log" 2>&1 &
	FS_PID=$!
	case " $CL_FS " in *" $T/w$1 "*) ;; *) CL_FS="$CL_FS $T/w$1" ;; esac
	cl_wait 10 mh_mounted_or_gone "$T/w$1" "$FS_PID"
	mountpoint -q "$T/w$1"
}
mh_mounted_or_gone() { mountpoint -q "$1" || cl_gone "$2"; }

mh_kill_takeover() { # NEW: host NEW takes over from the writer, killed -9
	_k_new=$1 _k_old=$MH_W _k_e=$(mh_epoch "$T/w$MH_W")
	mkdir -p "$T/w$_k_old/r/staged" && cp "$MH_SRC/checkpoint-400/model.safetensors" "$T/w$_k_old/r/staged/" ||
		fail "staging a file"
	kill -9 "$MH_WPID"
	cl_wait 10 cl_gone "$MH_WPID"
	fusermount3 -u -z "$T/w$_k_old" 2> /dev/null
	_k_t0=$(cl_ms) _k_refused=0
	until mh_try_rw "$_k_new"; do
		grep -q "lease" "$T/w$_k_new.log" && _k_refused=$((_k_refused + 1))
		[ "$(cl_ms)" -gt $((_k_t0 + 60000)) ] && break
		sleep 0.5
	done
	if mountpoint -q "$T/w$_k_new"; then
		MH_W=$_k_new MH_WPID=$FS_PID
		_k_e2=$(mh_epoch "$T/w$_k_new")
		ok "host $_k_new took over $(cl_secs "$_k_t0") s after kill -9 of host $_k_old's writer" \
			"($_k_refused refusals while its lease of ${MH_LEASE} s held); epoch $_k_e -> $_k_e2"
		[ "$_k_e2" -gt "$_k_e" ] || fail "the epoch did not go up ($_k_e -> $_k_e2)"
		cmp -s "$T/w$_k_new/r/staged/model.safetensors" "$MH_SRC/checkpoint-400/model.safetensors" &&
			ok "the file host $_k_old had staged was recovered byte-identical" ||
			fail "the staged file was not recovered ($(cat "$T/w$_k_new.log"))"
	else
		fail "host $_k_new could not take over in 60 s: $(tail -3 "$T/w$_k_new.log")"
	fi
}

mh_partition() { # SECS: the writer's host loses its link; host NEW takes over
	_p_secs=$1 _p_new=$2 _p_old=$MH_W _p_oldpid=$MH_WPID _p_e=$(mh_epoch "$T/w$MH_W")
	_p_g0=$(cut -d' ' -f3 "$(cl_path 1)/$MH_ARCH/index/CURRENT")
	cl_host_down "$_p_old"
	_p_t0=$(cl_ms)
	until mh_try_rw "$_p_new"; do
		[ "$(cl_ms)" -gt $((_p_t0 + (_p_secs - 3) * 1000)) ] && break
		sleep 0.5
	done
	if mountpoint -q "$T/w$_p_new"; then
		MH_W=$_p_new MH_WPID=$FS_PID
		ok "host $_p_new took over $(cl_secs "$_p_t0") s into host $_p_old's partition;" \
			"epoch $_p_e -> $(mh_epoch "$T/w$_p_new")"
		mh_copy_sync 3800 && ok "the new writer archives (step 3800)" || fail "new writer: $(cat "$T/sync.out")"
	else
		fail "host $_p_new could not take over during the partition: $(tail -3 "$T/w$_p_new.log")"
	fi
	_p_rest=$((_p_secs * 1000 - ($(cl_ms) - _p_t0)))
	[ "$_p_rest" -gt 0 ] && cl_sleep "$((_p_rest / 1000)).$((_p_rest % 1000 / 100))"
	cl_host_up "$_p_old"
	echo "# host $_p_old's link back after $(cl_secs "$_p_t0") s"
	cl_wait 30 mh_fenced "$T/w$_p_old" &&
		ok "after the heal the old writer says it is fenced ($(mh_gen "$T/w$_p_old"))" ||
		fail "the old writer is not fenced: $(mh_gen "$T/w$_p_old")"
	# a file written to the old writer's mount is refused, or at least not archived
	if mkdir -p "$T/w$_p_old/r/checkpoint-3900" 2> "$T/cp.err" &&
		cp "$MH_SRC/checkpoint-100/model.safetensors" "$T/w$_p_old/r/checkpoint-3900/" 2> "$T/cp.err"; then
		echo "# (the old writer took a write: it stays staged)"
	else
		ok "the old writer refuses writes: $(head -c 100 "$T/cp.err")"
	fi
	timeout 30 "$ULPACK" sync "$T/w$MH_W" > /dev/null
	_p_cur=$(cat "$(cl_path 1)/$MH_ARCH/index/CURRENT")
	_p_g1=$(echo "$_p_cur" | cut -d' ' -f3) _p_ce=$(echo "$_p_cur" | cut -d' ' -f4)
	[ "$_p_ce" = "$(mh_epoch "$T/w$MH_W")" ] && [ "$_p_g1" -ge "$_p_g0" ] &&
		ok "never two writers: CURRENT is the new writer's (epoch $_p_ce, generation $_p_g0 -> $_p_g1)" ||
		fail "CURRENT after the partition: $_p_cur (new writer's epoch $(mh_epoch "$T/w$MH_W"))"
	for _p_i in $MH_READERS; do
		cl_wait 20 mh_shows "$T/r$_p_i" 3800 && ok "host $_p_i shows the new writer's step" ||
			fail "host $_p_i: the new writer's step not shown"
		[ -e "$T/r$_p_i/r/checkpoint-3900/model.safetensors" ] && fail "host $_p_i shows the fenced writer's file"
	done
	cl_umount_fs "$T/w$_p_old" 5
}
mh_fenced() { mh_gen "$1" | grep -q fenced; }
