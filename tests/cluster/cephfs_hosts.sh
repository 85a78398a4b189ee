#!/bin/sh
# SPDX-License-Identifier: MIT
# cephfs_hosts.sh - issue 25: an archive on a CephFS volume shared by
# three hosts (network namespaces, each with its own ceph-fuse client). Host 1
# creates it and imports a run; hosts 2 and 3 list it and read a file
# byte-identically through their own clients; a read-write ulpackfs over host
# 1's client serves and takes files, and host 2's read-write mount is refused
# (the lease holder is named); then, on a shared archive, a new step on two
# read-only hosts, 1,000 reads during 15 writes, gc beside an old generation.
. "$(dirname "$0")/lib.sh"
cl_need_ceph
cl_netns_up 3
cl_cephfs_up
cl_check_shared_archive
# issue 25's reader and gc items on CephFS (many.sh): a writer and two
# readers, a new step on both, reads during writes, gc with a reader on an
# old generation
. "$(dirname "$0")/many.sh"
MH_ARCH=arch2
mh_setup
mh_writer 1 || fail "host 1: read-write mount: $(cat "$T/w1.log")"
mh_reader 2 || fail "host 2: read-only mount: $(cat "$T/r2.log")"
mh_reader 3 || fail "host 3: read-only mount: $(cat "$T/r3.log")"
mh_new_step 100
mh_reads_during_writes 1000 15
mh_gc_old_reader 1
finish
