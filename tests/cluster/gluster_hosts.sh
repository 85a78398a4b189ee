#!/bin/sh
# SPDX-License-Identifier: MIT
# gluster_hosts.sh - issue 25: an archive on a GlusterFS volume shared by
# three hosts (network namespaces, each with its own glusterfs client). Host 1
# creates it and imports a run; hosts 2 and 3 list it and read a file
# byte-identically through their own clients; a read-write ulpackfs over host
# 1's client serves and takes files, and host 2's read-write mount is refused
# (the mount lock reaches across clients).
. "$(dirname "$0")/lib.sh"
cl_need_gluster
cl_netns_up 3
cl_gluster_up
cl_check_shared_archive
finish
