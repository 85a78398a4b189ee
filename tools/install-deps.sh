#!/bin/sh
# SPDX-License-Identifier: MIT
# install-deps.sh - the Debian 12 or 13 packages that build and test ulpackfs.
# Usage: install-deps.sh [--test] [--bench] [--cross-arm64] [--package]
#   --test         adds what the test suite needs (make check-cluster's
#                  GlusterFS and Ceph packages too)
#   --bench        adds the peers `make bench` compares cold reads with
#                  (squashfs-tools, squashfuse, borgbackup)
#   --package      adds what builds the Debian packages (dpkg-buildpackage,
#                  debhelper: tests/integration/package.sh) and what checks
#                  the units and completion (systemd's systemd-analyze,
#                  bash-completion, zsh)
#   --cross-arm64  adds the aarch64 cross toolchain, qemu-user and the arm64
#                  libraries (multiarch: dpkg --add-architecture arm64)
set -eu
test=0 cross=0 bench=0 package=0
for a in "$@"; do
	case "$a" in
	--test) test=1 ;;
	--bench) bench=1 ;;
	--cross-arm64) cross=1 ;;
	--package) package=1 ;;
	*) echo "install-deps: unknown option '$a'" >&2; exit 2 ;;
	esac
done
# rsync, python3, attr (getfattr): what the README's walkthrough and the demo run
pkgs="build-essential autoconf automake pkg-config libzstd-dev libsqlite3-dev libssl-dev
      libxxhash-dev libfuse3-dev libcurl4-openssl-dev fuse3 rsync python3 attr"
# librsvg2-bin: rsvg-convert renders `ulpack dynamics --svg` in tests/integration/cli_dynamics.sh
# clang's sanitizer and libFuzzer runtimes: the package of the clang this
# Debian has (14 on Debian 12, 19 on Debian 13: /etc/debian_version)
clang_rt=libclang-rt-14-dev
case $(cut -d. -f1 /etc/debian_version 2>/dev/null) in
13 | trixie*) clang_rt=libclang-rt-19-dev ;;
esac
[ "$test" = 1 ] && pkgs="$pkgs clang $clang_rt python3-numpy python3-pytest python3-venv zstd librsvg2-bin"
# the many-host tests (make check-cluster, tests/cluster): GlusterFS and Ceph
# servers and FUSE clients, without their recommends (installed apart below);
# sqlite3 (the CLI): gluster_partition.sh reads copies of the live index
cluster=""
[ "$test" = 1 ] && cluster="iproute2 glusterfs-server glusterfs-client ceph-mon ceph-mgr ceph-osd ceph-mds ceph-fuse ceph-common radosgw sqlite3"
# systemd (systemd-analyze verify of the units) and bash (the completion
# test) come with --test too: tests/integration/systemd_units.sh, completion.sh
[ "$test" = 1 ] && pkgs="$pkgs systemd bash"
[ "$package" = 1 ] && pkgs="$pkgs dpkg-dev debhelper fakeroot systemd bash-completion zsh fuse3 python3-numpy attr rsync"
[ "$bench" = 1 ] && pkgs="$pkgs squashfs-tools squashfuse borgbackup"
[ "$cross" = 1 ] && pkgs="$pkgs gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user
      libzstd-dev:arm64 libsqlite3-dev:arm64 libssl-dev:arm64 libxxhash-dev:arm64 libfuse3-dev:arm64
      libcurl4-openssl-dev:arm64"
missing="" cmissing=""
for p in $pkgs; do
	dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
for p in $cluster; do
	dpkg -s "$p" >/dev/null 2>&1 || cmissing="$cmissing $p"
done
[ -z "$missing$cmissing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: missing packages:$missing$cmissing (run as root, or install them)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ "$cross" = 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
	dpkg --add-architecture arm64
	apt-get update -q >/dev/null 2>&1 || true
fi
if [ -n "$missing" ]; then
	apt-get install -y -q $missing >/dev/null 2>&1 || {
		apt-get update -q >/dev/null 2>&1 || true
		apt-get install -y -q $missing
	}
fi
if [ -n "$cmissing" ]; then
	apt-get install -y -q --no-install-recommends $cmissing >/dev/null 2>&1 || {
		apt-get update -q >/dev/null 2>&1 || true
		apt-get install -y -q --no-install-recommends $cmissing
	}
fi
