#!/bin/sh
# SPDX-License-Identifier: MIT
# cephfs_hosts.sh - issue 25: an archive on a CephFS volume shared by
# three hosts (network namespaces, each with its own ceph-fuse client). Host 1
# creates it and imports a run; hosts 2 and 3 list it and read a file
# byte-identically through their own clients; a read-write ulpackfs over host
# 1's client serves and takes files, and host 2's read-write mount is refused
# (the mount lock reaches across clients).
. "$(dirname "$0")/lib.sh"
cl_need_ceph
cl_netns_up 3
cl_cephfs_up
cl_check_shared_archive
finish
