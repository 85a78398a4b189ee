#!/bin/sh
# SPDX-License-Identifier: MIT
# install-deps.sh - the Debian 12 packages that build and test ulpackfs.
# Usage: install-deps.sh [--test]   (--test adds what the test suite needs)
set -eu
pkgs="build-essential autoconf automake pkg-config libzstd-dev libsqlite3-dev libssl-dev
      libxxhash-dev libfuse3-dev fuse3 rsync"
[ "${1:-}" = --test ] && pkgs="$pkgs clang libclang-rt-14-dev python3 python3-numpy zstd"
missing=""
for p in $pkgs; do
	dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
	echo "install-deps: missing packages:$missing (run as root, or install them)" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q $missing >/dev/null 2>&1 || {
	apt-get update -q >/dev/null 2>&1 || true
	apt-get install -y -q $missing
}
