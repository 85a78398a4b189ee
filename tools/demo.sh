#!/bin/sh
# SPDX-License-Identifier: MIT
# demo.sh - the README's first command: install, build, and run the main job on
# built-in sample data (a synthetic training trajectory made by `ulpack synth`).
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
sh "$top/tools/install-deps.sh"
cd "$top"
[ -x configure ] || autoreconf -fi >/dev/null
mkdir -p build && cd build
[ -f Makefile ] || ../configure -q
make -j"$(nproc)" -s ulpack
T=$(mktemp -d "${TMPDIR:-/tmp}/ulpack-demo.XXXXXX")
trap 'rm -rf "$T"' EXIT
echo "== writing a synthetic bf16 training run (8 checkpoints, 8.4M parameters each)"
./ulpack synth "$T/run" --steps 8
echo "== coding checkpoint-800 against checkpoint-700"
./ulpack bench "$T/run/checkpoint-700/model.safetensors" "$T/run/checkpoint-800/model.safetensors" --reps 3
