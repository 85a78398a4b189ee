# SPDX-License-Identifier: MIT
# lib.sh - many-host tests (issue 25): a real GlusterFS or CephFS cluster
# whose server and client "hosts" are network namespaces on one bridge, each
# host with its own FUSE client of the shared volume (its own client cache,
# as a separate machine has). Sourced by tests/cluster/*.sh, on top of
# tests/integration/lib.sh (ok/fail/finish/skip, $T, mount helpers).
#
# Layout of a test run (pid $$):
#   namespace ulpt$$-srv  10.77.0.1 on bridge br0: the servers (glusterd and
#                         its brick; or ceph-mon, -mgr, -osd, -mds)
#   namespace ulpt$$-hI   10.77.0.(I+1), link eth0: host I's FUSE client of
#                         the shared volume, mounted at $T/hI (cl_path I)
# The addresses are private to the run's bridge (no link to the root
# namespace), so two runs do not collide. ulpack and ulpackfs run in the root
# namespace and reach the volume "from host I" through $T/hI.
#
# Everything the cluster starts stops on exit, whatever happened (the EXIT
# trap, also after SIGINT/SIGTERM/SIGHUP): ulpackfs mounts, client mounts,
# daemons by PID (TERM, KILL after 8 s), whatever still runs in the
# namespaces (KILL), then the namespaces. Set-up steps run under timeout; a
# set-up that fails prints the daemons' log tails and skips (a failure under
# CI=true).
#
# Helpers for tests:
#   cl_need_gluster | cl_need_ceph   skip unless root with the engine installed
#   cl_netns_up N                    server + N hosts
#   cl_gluster_up | cl_cephfs_up     the cluster and one client per host
#   cl_rgw_up                        Ceph's S3 gateway, a user (CL_S3_ENDPOINT, _KEY, _SECRET)
#   cl_path I                        host I's client mount ($T/hI)
#   cl_on I|srv CMD...               CMD in host I's (or the server's) network namespace
#   cl_host_down I / cl_host_up I    partition host I (eth0 down) / heal it
#   cl_mount_fs I REL MNT [opts...]  ulpackfs over $T/hI/REL on MNT (foreground
#                                    daemon, pid in FS_PID, log MNT.log)
#   cl_umount_fs MNT                 unmount it, wait for the daemon (kill -9 after 20 s)
#   cl_bg CMD...                     CMD in the background, killed at teardown; pid in CL_PID
#   cl_wait SECONDS CMD...           retry CMD every 0.1 s until it succeeds
#   cl_sleep SECONDS                 sleep (cut short by a signal: a foreground
#                                    command holds the EXIT trap off until it ends)
#   cl_ms, cl_secs MS [MS]           milliseconds since the epoch; seconds between two
#   cl_daemon NAME I|srv OUT CMD...  a daemon more (stopped at teardown)
#   cl_gl ARGS, cl_ceph ARGS         the gluster / ceph CLI against this run's cluster
#   cl_check_shared_archive          the checks of gluster_hosts.sh and cephfs_hosts.sh
. "$(dirname "$0")/../integration/lib.sh"

CL_NET=${CL_NET:-10.77.0}  # the /24 of the run's bridge
CL_SRV_IP=$CL_NET.1
CL_NS=ulpt$$               # namespace prefix, unique per run
CL_HOSTS=0
CL_NETNS=""   # namespaces created, in order
CL_DAEMONS="" # name:pid of each daemon, in start order
CL_CLIENTS="" # client mount points of the shared volume
CL_FS=""      # ulpackfs mount points of cl_mount_fs
CL_BGS=""     # pids of cl_bg
CL_LOGS=""    # daemon logs, for cl_setup_fail
CL_RMFILES="" # files outside $T to remove at teardown (the brick's log)
ULP_CLEANUP="cl_teardown; $ULP_CLEANUP"
# dash runs the EXIT trap on exit only: turn the signals into an exit
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

cl_ms() { echo $(($(date +%s%N) / 1000000)); }
cl_secs() { # MS_START [MS_END]: seconds from one to the other (to now), one decimal
	_s_d=$((${2:-$(cl_ms)} - $1))
	echo "$((_s_d / 1000)).$((_s_d % 1000 / 100))"
}
CL_T0=$(cl_ms)

cl_need() { # CMD...: skip unless root and each CMD is installed
	[ "$(id -u)" = 0 ] || skip "cluster tests need root (network namespaces, FUSE mounts of the servers' clients)"
	for _n_c in ip nsenter setsid timeout mountpoint "$@"; do
		command -v "$_n_c" > /dev/null || skip "no $_n_c (sh tools/install-deps.sh --test)"
	done
	need_fuse
}
cl_need_gluster() { cl_need glusterd gluster glusterfs; }
cl_need_ceph() { cl_need ceph ceph-authtool monmaptool ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse; }

cl_ns() { # I|srv: the namespace's name
	case $1 in
	srv) echo "$CL_NS-srv" ;;
	*) echo "$CL_NS-h$1" ;;
	esac
}
cl_on() { # I|srv CMD...
	_o_ns=$(cl_ns "$1")
	shift
	nsenter --net="/run/netns/$_o_ns" "$@"
}
cl_path() { echo "$T/h$1"; }

cl_wait() { # SECONDS CMD...: whether CMD succeeds within SECONDS (tried every 0.1 s)
	_w_end=$(($(cl_ms) + $1 * 1000))
	shift
	while :; do
		"$@" && return 0
		[ "$(cl_ms)" -ge "$_w_end" ] && return 1
		sleep 0.1
	done
}

# cl_wait_for NAME SECONDS CMD...: cl_wait, but gives up as soon as daemon
# NAME (of cl_daemon) has exited
cl_wait_for() {
	_wf_n=$1
	shift
	cl_wait "$1" cl_ready_or_dead "$_wf_n" "$@" && cl_up "$_wf_n"
}
cl_up() { # NAME: whether daemon NAME runs
	for _u_d in $CL_DAEMONS; do
		[ "${_u_d%:*}" = "$1" ] && running "${_u_d#*:}" && return 0
	done
	return 1
}
cl_ready_or_dead() { # NAME SECONDS CMD...
	_r_n=$1
	shift 2
	"$@" || ! cl_up "$_r_n"
}

cl_setup_fail() { # MSG: the daemons' log tails, then a skip (a failure under CI=true)
	echo "# cluster set-up failed after $(cl_secs "$CL_T0") s: $1" >&2
	for _f_l in $CL_LOGS; do
		[ -s "$_f_l" ] || continue
		echo "# --- tail of $_f_l" >&2
		tail -n 15 "$_f_l" | sed 's/^/# /' >&2
	done
	skip "cluster set-up: $1"
}

# cl_daemon NAME I|srv OUT CMD...: starts CMD (a daemon in its foreground
# mode) in that namespace, in a session of its own, stdout and stderr to OUT
cl_daemon() {
	_d_n=$1 _d_ns=$(cl_ns "$2") _d_out=$3
	shift 3
	setsid nsenter --net="/run/netns/$_d_ns" "$@" > "$_d_out" 2>&1 < /dev/null &
	CL_DAEMONS="$CL_DAEMONS $_d_n:$!"
	CL_LOGS="$CL_LOGS $_d_out"
}

cl_sleep() { # SECONDS: a sleep that a signal to the test cuts short (a
	# foreground command holds off the shell's traps until it ends)
	sleep "$1" &
	wait $!
}

cl_bg() { # CMD...: in the background, killed (-9) at teardown; its pid in CL_PID
	"$@" &
	CL_PID=$!
	CL_BGS="$CL_BGS $CL_PID"
}

# ---- network ----------------------------------------------------------------
cl_netns_up() { # N: the server's namespace with bridge br0 and N hosts on it
	_n_srv=$(cl_ns srv)
	ip netns add "$_n_srv" || cl_setup_fail "ip netns add $_n_srv"
	CL_NETNS="$_n_srv"
	{ ip -n "$_n_srv" link add br0 type bridge &&
		ip -n "$_n_srv" addr add "$CL_SRV_IP/24" dev br0 &&
		ip -n "$_n_srv" link set br0 up && ip -n "$_n_srv" link set lo up; } ||
		cl_setup_fail "bridge in $_n_srv"
	for _n_i in $(seq "$1"); do
		_n_h=$(cl_ns "$_n_i")
		ip netns add "$_n_h" || cl_setup_fail "ip netns add $_n_h"
		CL_NETNS="$CL_NETNS $_n_h"
		{ ip link add "h$_n_i" netns "$_n_srv" type veth peer name eth0 netns "$_n_h" &&
			ip -n "$_n_srv" link set "h$_n_i" master br0 up &&
			ip -n "$_n_h" addr add "$CL_NET.$((_n_i + 1))/24" dev eth0 &&
			ip -n "$_n_h" link set eth0 up && ip -n "$_n_h" link set lo up; } ||
			cl_setup_fail "link of host $_n_i"
	done
	CL_HOSTS=$1
}
cl_host_down() { ip -n "$(cl_ns "$1")" link set eth0 down; }
cl_host_up() { ip -n "$(cl_ns "$1")" link set eth0 up; }

# cl_client_wait I: whether host I's client mount answers within 30 s
cl_client_wait() {
	cl_wait 30 mountpoint -q "$(cl_path "$1")" && timeout 10 ls "$(cl_path "$1")" > /dev/null 2>&1
}

# ---- GlusterFS ----------------------------------------------------------------
# glusterd with a private working and run directory and CLI socket under
# $T/gluster (nothing in /var/lib/glusterd or /var/run/gluster: a killed run
# leaves no volume behind that breaks the next one); one brick, volume
# "ckpt" with network.ping-timeout 5; one glusterfs FUSE client per host.
cl_gl() { # gluster CLI ARGS... against this run's glusterd
	timeout 30 nsenter --net="/run/netns/$(cl_ns srv)" \
		gluster --mode=script --glusterd-sock="$CL_G/glusterd.socket" --log-file="$CL_G/log/cli.log" "$@"
}
cl_gluster_up() {
	_g_t0=$(cl_ms)
	CL_G=$T/gluster
	mkdir -p "$CL_G/wd" "$CL_G/run" "$CL_G/brick" "$CL_G/log"
	cat > "$CL_G/glusterd.vol" << EOF
volume management
    type mgmt/glusterd
    option working-directory $CL_G/wd
    option run-directory $CL_G/run
    option glusterd-sockfile $CL_G/glusterd.socket
    option transport-type socket
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
end-volume
EOF
	CL_LOGS="$CL_LOGS $CL_G/log/glusterd.log"
	cl_daemon glusterd srv "$CL_G/log/glusterd.out" glusterd -N -f "$CL_G/glusterd.vol" \
		--log-file="$CL_G/log/glusterd.log"
	cl_wait_for glusterd 30 cl_gl volume list > /dev/null 2>&1 || cl_setup_fail "glusterd exited or does not answer in 30 s"
	_g_t1=$(cl_ms)
	# glusterd names the brick's log after its path, in the global log folder
	CL_RMFILES="$CL_RMFILES /var/log/glusterfs/bricks/$(echo "$CL_G/brick" | sed 's|^/||; s|/|-|g').log"
	CL_LOGS="$CL_LOGS $CL_RMFILES"
	cl_gl volume create ckpt "$CL_SRV_IP:$CL_G/brick" force > "$CL_G/log/cli.out" 2>&1 &&
		cl_gl volume set ckpt network.ping-timeout 5 >> "$CL_G/log/cli.out" 2>&1 &&
		cl_gl volume start ckpt >> "$CL_G/log/cli.out" 2>&1 ||
		{ CL_LOGS="$CL_LOGS $CL_G/log/cli.out" && cl_setup_fail "volume create/start"; }
	# the brick's process is glusterd's child, in the background: its pid
	# file; its socket is in the global run folder, named by a hash
	for _g_p in $(find "$CL_G/run" -name '*.pid' 2> /dev/null); do
		_g_p=$(cat "$_g_p")
		CL_DAEMONS="$CL_DAEMONS brick:$_g_p"
		CL_RMFILES="$CL_RMFILES $(cat "/proc/$_g_p/cmdline" 2> /dev/null | tr '\0' '\n' | sed -n '/^-S$/{n;p}')"
	done
	_g_t2=$(cl_ms)
	for _g_i in $(seq "$CL_HOSTS"); do
		mkdir -p "$(cl_path "$_g_i")"
		CL_CLIENTS="$CL_CLIENTS $(cl_path "$_g_i")"
		CL_LOGS="$CL_LOGS $CL_G/log/client-h$_g_i.log"
		cl_daemon "glusterfs-h$_g_i" "$_g_i" "$CL_G/log/client-h$_g_i.out" glusterfs -N \
			--volfile-server="$CL_SRV_IP" --volfile-id=ckpt \
			--log-file="$CL_G/log/client-h$_g_i.log" "$(cl_path "$_g_i")"
	done
	for _g_i in $(seq "$CL_HOSTS"); do
		cl_client_wait "$_g_i" || cl_setup_fail "glusterfs client of host $_g_i not mounted in 30 s"
	done
	echo "# gluster up in $(cl_secs "$_g_t0") s (glusterd $(cl_secs "$_g_t0" "$_g_t1") s, volume $(cl_secs "$_g_t1" "$_g_t2") s, $CL_HOSTS clients $(cl_secs "$_g_t2") s)"
}

# ---- Ceph ---------------------------------------------------------------------
# A cluster under $T/ceph (cephx: radosgw never came up without it): mon a,
# mgr x, one memstore OSD (in RAM, no disk) in the server's namespace. Every
# key is in $T/ceph/keyring before `ceph-mon --mkfs`, which imports them with
# their caps, so that no `ceph auth` call is needed. For the S3 tests,
# cl_rgw_up adds radosgw (its key client.rgw.a is there already and
# ceph.conf has its section) and an S3 user.
cl_ceph() { # ceph CLI ARGS... against this run's cluster
	timeout 30 nsenter --net="/run/netns/$(cl_ns srv)" ceph -c "$CL_C/ceph.conf" --connect-timeout 25 "$@"
}
cl_ceph_up() {
	_c_t0=$(cl_ms)
	CL_C=$T/ceph
	mkdir -p "$CL_C/run" "$CL_C/log" "$CL_C/mon/ceph-a" "$CL_C/osd/ceph-0" "$CL_C/mgr/ceph-x" "$CL_C/mds/ceph-a"
	_c_fsid=$(cat /proc/sys/kernel/random/uuid)
	cat > "$CL_C/ceph.conf" << EOF
[global]
fsid = $_c_fsid
mon_host = v2:$CL_SRV_IP:3300
public_network = $CL_NET.0/24
run_dir = $CL_C/run
admin_socket = $CL_C/run/\$name.asok
log_file = $CL_C/log/\$name.log
pid_file = $CL_C/run/\$name.pid
mon_data = $CL_C/mon/\$cluster-\$id
osd_data = $CL_C/osd/\$cluster-\$id
mgr_data = $CL_C/mgr/\$cluster-\$id
mds_data = $CL_C/mds/\$cluster-\$id
keyring = $CL_C/keyring
osd_objectstore = memstore
memstore_device_bytes = 1073741824
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
mon_max_pg_per_osd = 1000
mgr_initial_modules =
[client.rgw.a]
rgw_frontends = beast endpoint=$CL_SRV_IP:7480
rgw_data = $CL_C/rgw
EOF
	_c_k=$CL_C/keyring
	{ ceph-authtool --create-keyring "$_c_k" --gen-key -n mon. --cap mon 'allow *' &&
		ceph-authtool "$_c_k" --gen-key -n client.admin --cap mon 'allow *' --cap osd 'allow *' \
			--cap mds 'allow *' --cap mgr 'allow *' &&
		ceph-authtool "$_c_k" --gen-key -n mgr.x --cap mon 'allow profile mgr' --cap osd 'allow *' \
			--cap mds 'allow *' &&
		ceph-authtool "$_c_k" --gen-key -n osd.0 --cap mon 'allow profile osd' --cap mgr 'allow profile osd' \
			--cap osd 'allow *' &&
		ceph-authtool "$_c_k" --gen-key -n mds.a --cap mon 'allow profile mds' --cap osd 'allow *' \
			--cap mds 'allow' --cap mgr 'allow profile mds' &&
		ceph-authtool "$_c_k" --gen-key -n client.rgw.a --cap mon 'allow rw' --cap osd 'allow rwx' \
			--cap mgr 'allow rw' &&
		monmaptool --create --fsid "$_c_fsid" --addv a "[v2:$CL_SRV_IP:3300]" "$CL_C/monmap"; } \
		> "$CL_C/log/mkfs.out" 2>&1 || { CL_LOGS="$CL_C/log/mkfs.out" && cl_setup_fail "keyring/monmap"; }
	CL_LOGS="$CL_LOGS $CL_C/log/mkfs.out $CL_C/log/mon.a.log"
	# (the mkfs steps run in the server's namespace too: they look for an
	# address in public_network)
	timeout 30 nsenter --net="/run/netns/$(cl_ns srv)" ceph-mon -c "$CL_C/ceph.conf" --mkfs -i a \
		--monmap "$CL_C/monmap" --keyring "$_c_k" >> "$CL_C/log/mkfs.out" 2>&1 || cl_setup_fail "ceph-mon --mkfs"
	cl_daemon mon srv "$CL_C/log/mon.out" ceph-mon -c "$CL_C/ceph.conf" -f -i a
	cl_ceph -s > /dev/null 2>&1 || cl_ceph -s > /dev/null 2>&1 || cl_setup_fail "ceph-mon does not answer"
	_c_t1=$(cl_ms)
	CL_LOGS="$CL_LOGS $CL_C/log/mgr.x.log $CL_C/log/osd.0.log"
	cl_daemon mgr srv "$CL_C/log/mgr.out" ceph-mgr -c "$CL_C/ceph.conf" -f -i x
	_c_uuid=$(cat /proc/sys/kernel/random/uuid)
	_c_id=$(cl_ceph osd new "$_c_uuid" 2>> "$CL_C/log/mkfs.out")
	[ "$_c_id" = 0 ] || cl_setup_fail "ceph osd new gave '$_c_id', not 0"
	timeout 60 nsenter --net="/run/netns/$(cl_ns srv)" ceph-osd -c "$CL_C/ceph.conf" -i 0 --mkfs \
		--osd-uuid "$_c_uuid" >> "$CL_C/log/mkfs.out" 2>&1 || cl_setup_fail "ceph-osd --mkfs"
	cl_daemon osd srv "$CL_C/log/osd.out" ceph-osd -c "$CL_C/ceph.conf" -f -i 0
	cl_wait_for osd 60 cl_ceph_osd_up || cl_setup_fail "ceph-osd exited or is not up in 60 s"
	echo "# ceph up in $(cl_secs "$_c_t0") s (mon $(cl_secs "$_c_t0" "$_c_t1") s, mgr + osd $(cl_secs "$_c_t1") s)"
}
cl_ceph_osd_up() { cl_ceph osd stat 2> /dev/null | grep -q ' 1 up'; }

# CephFS "ckfs" on the cluster of cl_ceph_up (started here if it is not up):
# MDS a, and one ceph-fuse client (client.admin) per host on $T/hI
cl_cephfs_up() {
	[ -n "${CL_C:-}" ] || cl_ceph_up
	_f_t0=$(cl_ms)
	CL_LOGS="$CL_LOGS $CL_C/log/mds.a.log"
	cl_daemon mds srv "$CL_C/log/mds.out" ceph-mds -c "$CL_C/ceph.conf" -f -i a
	{ cl_ceph osd pool create ckfs_meta 8 && cl_ceph osd pool create ckfs_data 8 &&
		cl_ceph fs new ckfs ckfs_meta ckfs_data; } > "$CL_C/log/fs.out" 2>&1 ||
		{ CL_LOGS="$CL_LOGS $CL_C/log/fs.out" && cl_setup_fail "pools / ceph fs new"; }
	cl_wait_for mds 60 cl_ceph_mds_active || cl_setup_fail "ceph-mds exited or is not active in 60 s"
	_f_t1=$(cl_ms)
	for _f_i in $(seq "$CL_HOSTS"); do
		mkdir -p "$(cl_path "$_f_i")"
		CL_CLIENTS="$CL_CLIENTS $(cl_path "$_f_i")"
		CL_LOGS="$CL_LOGS $CL_C/log/fuse-h$_f_i.log"
		cl_daemon "ceph-fuse-h$_f_i" "$_f_i" "$CL_C/log/fuse-h$_f_i.out" ceph-fuse -c "$CL_C/ceph.conf" -f \
			-n client.admin --admin-socket "$CL_C/run/fuse-h$_f_i.asok" \
			--log-file "$CL_C/log/fuse-h$_f_i.log" "$(cl_path "$_f_i")"
	done
	for _f_i in $(seq "$CL_HOSTS"); do
		cl_client_wait "$_f_i" || cl_setup_fail "ceph-fuse of host $_f_i not mounted in 30 s"
	done
	echo "# cephfs up in $(cl_secs "$_f_t0") s (mds active $(cl_secs "$_f_t0" "$_f_t1") s, $CL_HOSTS clients $(cl_secs "$_f_t1") s)"
}
cl_ceph_mds_active() { cl_ceph mds stat 2> /dev/null | grep -q 'up:active'; }

# radosgw (S3, key client.rgw.a, section [client.rgw.a] of ceph.conf) on the
# cluster of cl_ceph_up (started here if it is not up), listening on
# $CL_S3_ENDPOINT, with an S3 user ci whose keys are $CL_S3_KEY and
# $CL_S3_SECRET. cl_rgw_start alone starts the daemon again (after a kill).
CL_S3_KEY=CIACCESSKEY
CL_S3_SECRET=CISECRETKEY
cl_rgw_start() {
	mkdir -p "$CL_C/rgw"
	cl_daemon rgw srv "$CL_C/log/rgw.out" radosgw -c "$CL_C/ceph.conf" -f -n client.rgw.a
}
cl_rgw_listening() { cl_on srv bash -c "echo > /dev/tcp/$CL_SRV_IP/7480" 2> /dev/null; }
cl_rgw_up() {
	[ -n "${CL_C:-}" ] || cl_ceph_up
	_r_t0=$(cl_ms)
	CL_LOGS="$CL_LOGS $CL_C/log/client.rgw.a.log"
	cl_rgw_start
	cl_wait_for rgw 60 cl_rgw_listening || cl_setup_fail "radosgw exited or does not listen in 60 s"
	timeout 60 nsenter --net="/run/netns/$(cl_ns srv)" radosgw-admin -c "$CL_C/ceph.conf" user create --uid=ci \
		--display-name=ci --access-key="$CL_S3_KEY" --secret-key="$CL_S3_SECRET" > "$CL_C/log/rgw-user.out" 2>&1 ||
		{ CL_LOGS="$CL_LOGS $CL_C/log/rgw-user.out" && cl_setup_fail "radosgw-admin user create"; }
	CL_S3_ENDPOINT=http://$CL_SRV_IP:7480
	echo "# radosgw up in $(cl_secs "$_r_t0") s"
}

# ---- ulpackfs on a host's path ------------------------------------------------------
# cl_mount_fs I REL MNT [options...]: ulpackfs (foreground daemon, a child
# of the test: FS_PID) of archive $T/hI/REL on MNT, log in MNT.log; whether
# it is mounted within 10 s
cl_mount_fs() {
	_m_a=$(cl_path "$1")/$2 _m_m=$3
	shift 3
	mkdir -p "$_m_m"
	"$ULPACKFS" "$_m_a" "$_m_m" -f "$@" > "$_m_m.log" 2>&1 &
	FS_PID=$!
	CL_FS="$CL_FS $_m_m"
	cl_wait 10 mountpoint -q "$_m_m"
}
# cl_umount_fs MNT [SECONDS]: unmounts, waits for the daemon to exit (it
# archives what is queued first), kill -9 after SECONDS (20)
cl_umount_fs() {
	_u_pid=$(fs_pid "$1")
	if [ -n "$(cl_mounted "$1")" ]; then
		timeout 10 fusermount3 -u "$1" 2> /dev/null || fusermount3 -u -z "$1" 2> /dev/null
	fi
	[ -n "$_u_pid" ] || return 0
	cl_wait "${2:-20}" cl_gone "$_u_pid" && return 0
	echo "# ulpackfs $_u_pid still runs ${2:-20} s after unmounting $1: kill -9" >&2
	kill -9 "$_u_pid" 2> /dev/null
	cl_wait 5 cl_gone "$_u_pid"
	[ -z "$(cl_mounted "$1")" ] || fusermount3 -u -z "$1" 2> /dev/null
	return 0
}
cl_gone() { ! running "$1"; }
cl_cat_same() { "$ULPACK" cat "$1" "$2" 2> "$T/err" | cmp -s - "$3"; } # ARCHIVE PATH FILE
cl_all_gone() { # PID...: whether none of them runs
	for _a_p in "$@"; do running "$_a_p" && return 1; done
	return 0
}

# ---- teardown -----------------------------------------------------------------
cl_teardown() {
	_t_t0=$(cl_ms)
	trap '' INT TERM HUP # a second Ctrl-C does not cut the teardown short
	for _t_p in $CL_BGS; do kill -9 "$_t_p" 2> /dev/null; done
	# heal partitions: blocked requests finish or fail, unmounts go through
	for _t_i in $(seq "$CL_HOSTS"); do cl_host_up "$_t_i" 2> /dev/null; done
	# ulpackfs mounts over the clients (and the ulpackfs processes of
	# lib.sh's MOUNTS, already unmounted -z, that read or write under $T)
	for _t_m in $CL_FS; do cl_umount_fs "$_t_m" 5; done
	if [ "$FAILS" -gt 0 ]; then # what the file systems said, for the failures above
		for _t_m in $CL_FS; do
			[ -s "$_t_m.log" ] && { echo "# $_t_m.log (last lines):"; tail -5 "$_t_m.log" | sed 's/^/#   /'; }
		done
	fi
	for _t_p in $(pgrep -x ulpackfs); do
		cat "/proc/$_t_p/cmdline" 2> /dev/null | tr '\0' '\n' | grep -q "^$T/" && kill -9 "$_t_p" 2> /dev/null
	done
	# the client mounts (lazily where a partition or a dead server holds them)
	for _t_m in $CL_CLIENTS; do
		mountpoint -q "$_t_m" 2> /dev/null || [ -n "$(cl_mounted "$_t_m")" ] || continue
		timeout 10 umount "$_t_m" 2> /dev/null || umount -l "$_t_m" 2> /dev/null
	done
	# the daemons by pid: the hosts' clients first (unmounted, they end by
	# themselves and close their sessions; TERM after 3 s), then the servers
	# one by one, newest first (each shuts down cleanly while those it
	# reports to still run); TERM, KILL after 8 s (ceph-mds takes 5)
	_t_pids="" _t_rev="" _t_cl=""
	for _t_d in $CL_DAEMONS; do
		_t_pids="$_t_pids ${_t_d#*:}"
		case ${_t_d%:*} in
		*-h[0-9]*) _t_cl="$_t_cl ${_t_d#*:}" ;;
		*) _t_rev="$_t_d $_t_rev" ;;
		esac
	done
	cl_wait 3 cl_all_gone $_t_cl
	for _t_d in $CL_DAEMONS; do
		case ${_t_d%:*} in *-h[0-9]*) kill "${_t_d#*:}" 2> /dev/null && cl_stop "$_t_d" ;; esac
	done
	for _t_d in $_t_rev; do
		kill "${_t_d#*:}" 2> /dev/null && cl_stop "$_t_d"
	done
	# whatever still runs in the namespaces (a daemon's own children)
	for _t_n in $CL_NETNS; do
		for _t_p in $(ip netns pids "$_t_n" 2> /dev/null); do
			echo "# pid $_t_p ($(cat "/proc/$_t_p/comm" 2> /dev/null)) left in $_t_n: SIGKILL" >&2
			kill -9 "$_t_p" 2> /dev/null
		done
	done
	cl_wait 5 cl_all_gone $_t_pids
	for _t_m in $CL_CLIENTS; do
		[ -n "$(cl_mounted "$_t_m")" ] && umount -l "$_t_m" 2> /dev/null
	done
	for _t_n in $CL_NETNS; do ip netns del "$_t_n" 2> /dev/null; done
	for _t_f in $CL_RMFILES; do rm -f "$_t_f"; done
	[ -n "$CL_DAEMONS$CL_NETNS" ] && echo "# teardown in $(cl_secs "$_t_t0") s; test in all $(cl_secs "$CL_T0") s"
	return 0
}
cl_stop() { # NAME:PID (sent TERM): waits 8 s for it to exit, then kill -9
	cl_wait 8 cl_gone "${1#*:}" && return 0
	echo "# daemon ${1%:*} (pid ${1#*:}) needed SIGKILL" >&2
	kill -9 "${1#*:}" 2> /dev/null
	wait "${1#*:}" 2> /dev/null # (bash: no "Killed" notice)
	return 0
}
# the mount table's line for mount point $1 (a dead FUSE mount fails mountpoint -q)
cl_mounted() { awk -v m="$1" '$2 == m' /proc/self/mounts; }

# ---- what works on a shared volume today (gluster_hosts.sh, cephfs_hosts.sh) ----
# Host 1 creates an archive on the volume and imports a 3-step run; hosts 2
# and 3 list it and read a file byte-identically through their own clients;
# a read-write ulpackfs over host 1's path serves the files and archives a new
# one; host 2's read-write mount is refused meanwhile (mount.lock's flock
# reaches across clients).
cl_check_shared_archive() {
	_b_t0=$(cl_ms)
	_b_run=$T/run
	"$ULPACK" synth "$_b_run" --steps 3 --dim 64 > /dev/null || fail "ulpack synth"
	_b_f=checkpoint-200/model.safetensors
	"$ULPACK" init "$(cl_path 1)/arch" > "$T/out" 2>&1 && ok "host 1: ulpack init on the shared volume" ||
		fail "host 1: init: $(cat "$T/out")"
	"$ULPACK" import "$(cl_path 1)/arch" "$_b_run" --prefix r1 > "$T/out" 2>&1 &&
		ok "host 1: $(cat "$T/out")" || fail "host 1: import: $(cat "$T/out")"
	for _b_i in 2 3; do
		_b_a=$(cl_path "$_b_i")/arch
		_b_n=$("$ULPACK" steps "$_b_a" r1 2> "$T/err" | grep -c ' checkpoint-[123]00$')
		[ "$_b_n" = 3 ] && ok "host $_b_i: ulpack steps lists the 3 steps" ||
			fail "host $_b_i: ulpack steps: $_b_n steps ($(cat "$T/err"))"
		_b_n=$("$ULPACK" ls "$_b_a" r1 2> "$T/err" | grep -c ' checkpoint-[123]00/$')
		[ "$_b_n" = 3 ] && ok "host $_b_i: ulpack ls lists the 3 steps" ||
			fail "host $_b_i: ulpack ls: $_b_n steps ($(cat "$T/err"))"
		"$ULPACK" cat "$_b_a" "r1/$_b_f" 2> "$T/err" | cmp -s - "$_b_run/$_b_f" &&
			ok "host $_b_i: ulpack cat is byte-identical" || fail "host $_b_i: ulpack cat differs ($(cat "$T/err"))"
	done
	if cl_mount_fs 1 arch "$T/m1"; then
		_b_n=0
		for _b_s in 100 200 300; do
			cmp -s "$T/m1/r1/checkpoint-$_b_s/model.safetensors" "$_b_run/checkpoint-$_b_s/model.safetensors" &&
				_b_n=$((_b_n + 1))
		done
		[ "$_b_n" = 3 ] && ok "host 1: the read-write ulpackfs serves the 3 files" ||
			fail "host 1: ulpackfs served $_b_n of 3 files right"
		mkdir -p "$T/m1/r1/checkpoint-400" &&
			cp "$_b_run/checkpoint-300/model.safetensors" "$T/m1/r1/checkpoint-400/" &&
			timeout 60 "$ULPACK" sync "$T/m1" > "$T/out" 2>&1 &&
			cmp -s "$T/m1/r1/checkpoint-400/model.safetensors" "$_b_run/checkpoint-300/model.safetensors" &&
			ok "host 1: a file written through ulpackfs is archived and read back" ||
			fail "host 1: write through ulpackfs: $(cat "$T/out")"
		mkdir -p "$T/m2"
		CL_FS="$CL_FS $T/m2"
		if timeout 30 "$ULPACKFS" "$(cl_path 2)/arch" "$T/m2" > "$T/m2.log" 2>&1; then
			fail "host 2: a second read-write mount was allowed"
			cl_umount_fs "$T/m2"
		else
			ok "host 2: read-write mount refused: $(head -c 200 "$T/m2.log")"
		fi
		# host 3 reads it from the generation sync published (before them,
		# over the live WAL index, GlusterFS gave "disk I/O error" at times)
		# (host 3's client may serve the old index/CURRENT for its cache's
		# timeout, a second on GlusterFS: as a reader's poll, it looks again)
		_b_c0=$(cl_ms)
		cl_wait 10 cl_cat_same "$(cl_path 3)/arch" r1/checkpoint-400/model.safetensors \
			"$_b_run/checkpoint-300/model.safetensors" &&
			ok "host 3 reads the new file from the published generation ($(cl_secs "$_b_c0") s after sync)" ||
			fail "host 3: the new file: $(cat "$T/err")"
		cl_umount_fs "$T/m1"
	else
		fail "host 1: ulpackfs over the shared volume: $(cat "$T/m1.log")"
	fi
	echo "# checks in $(cl_secs "$_b_t0") s"
}
