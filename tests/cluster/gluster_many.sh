#!/bin/sh
# SPDX-License-Identifier: MIT
# gluster_many.sh - issue 25 on GlusterFS (tests/cluster/many.sh): a writer
# host and two reader hosts on a shared archive; a new step on every reader
# within a poll interval of ulpack sync; 1,000 reads during 30 writes with 0
# errors; gc while a reader stays on an old generation (the grace); kill -9
# of the writer and take-over after its lease; a 30 s partition of the
# writer's host: another takes over, the old one stays fenced, no
# generation goes back.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/many.sh"
cl_need_gluster
cl_netns_up 3
cl_gluster_up
mh_setup
mh_writer 1 || fail "host 1: read-write mount: $(cat "$T/w1.log")"
mh_reader 2 || fail "host 2: read-only mount: $(cat "$T/r2.log")"
mh_reader 3 || fail "host 3: read-only mount: $(cat "$T/r3.log")"
mh_new_step 100
mh_reads_during_writes 1000 30
mh_gc_old_reader 1
mh_kill_takeover 2
mh_partition 30 3
finish
