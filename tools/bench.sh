#!/bin/sh
# SPDX-License-Identifier: MIT
# bench.sh - `make bench`: the codec benchmark on a synthetic trajectory and, when
# present, on the real trajectory of ../shared/data (bf16, fp16, fp32), all in one
# run on this machine. Usage: bench.sh PATH/TO/ulpack
set -eu
ULPACK=${1:-./ulpack}
DATA=${ULP_DATA_DIR:-$(dirname "$0")/../../shared/data}
T=$(mktemp -d "${TMPDIR:-/tmp}/ulp-bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
echo "== synthetic bf16 trajectory (ulpack synth, 8.4M parameters a step)"
"$ULPACK" synth "$T/syn" --steps 3
"$ULPACK" bench "$T/syn/checkpoint-200/model.safetensors" "$T/syn/checkpoint-300/model.safetensors"
if [ -d "$DATA/tiny-lm" ]; then
	for dt in bf16 fp16 fp32; do
		echo "== tiny-lm $dt, checkpoint-350 -> checkpoint-400"
		"$ULPACK" bench "$DATA/tiny-lm/$dt/checkpoint-350/model.safetensors" \
			"$DATA/tiny-lm/$dt/checkpoint-400/model.safetensors"
	done
fi
