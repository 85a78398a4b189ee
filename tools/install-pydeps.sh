#!/bin/sh
# SPDX-License-Identifier: MIT
# install-pydeps.sh - the Python virtual environment the tests that run real
# PyTorch use (tests/integration/dcp.sh): torch 2.13.0 (the CPU build),
# numpy, safetensors and fsspec (python/ulpack/fsspec.py and DCP's
# FsspecWriter/FsspecReader: tests/integration/python.sh; torch requires
# fsspec anyway), transformers and accelerate (its Trainer's checkpoint-N
# saved into a mount and resumed) and lightning (ModelCheckpoint's
# epoch=E-step=N.ckpt: tests/integration/torch2.sh), prometheus_client (its
# text-format parser reads what ulpackfs -o metrics writes:
# tests/integration/fuse_metrics.sh), in
# $ULP_VENV (default /opt/ulpack-venv), made with --system-site-packages so
# that what the system Python has stays visible. Idempotent: when the venv
# already has torch 2.13, safetensors, fsspec, transformers, accelerate,
# lightning and prometheus_client it returns at once. Works on Debian 12 and 13: it takes a Python
# 3.11 where one is on PATH (the CPU wheel of torch 2.13.0 that lies on the
# CI machines is for 3.11), else python3.
# Usage: install-pydeps.sh [--print]   (--print: print the venv's python)
set -eu
venv=${ULP_VENV:-/opt/ulpack-venv}
py="$venv/bin/python"
ok() {
	# the installed versions, without importing torch (seconds): fast when done
	"$py" -c 'import importlib.metadata as m, sys
m.version("safetensors"), m.version("numpy"), m.version("fsspec")
m.version("transformers"), m.version("accelerate"), m.version("lightning"), m.version("prometheus_client")
sys.exit(0 if m.version("torch").startswith("2.13.") else 1)' >/dev/null 2>&1
}
if [ ! -x "$py" ] || ! ok; then
	base=""
	for c in python3.11 python3; do
		if command -v "$c" >/dev/null 2>&1 &&
		   "$c" -c 'import venv, ensurepip' >/dev/null 2>&1; then
			base=$(command -v "$c"); break
		fi
	done
	if [ -z "$base" ]; then
		echo "install-pydeps: no python3 with venv and ensurepip (Debian: apt-get install python3-venv)" >&2
		exit 1
	fi
	[ -x "$py" ] || "$base" -m venv --system-site-packages "$venv"
	"$py" -m pip install -q --disable-pip-version-check torch==2.13.0 numpy safetensors fsspec \
		'transformers>=5.25,<6' 'accelerate>=1.16' 'lightning>=2.6,<3' prometheus_client
	"$py" -c 'import torch, safetensors, numpy, fsspec, transformers, accelerate, lightning, prometheus_client' || { echo "install-pydeps: $py cannot import torch after installing it" >&2; exit 1; }
fi
[ "${1:-}" = --print ] && echo "$py"
exit 0
