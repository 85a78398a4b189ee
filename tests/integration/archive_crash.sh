#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_crash.sh - kill -9 of `ulpack import` at 24 moments spread over an
# import: after each, verify passes on what was committed, no temporary pack
# survives gc, and re-running the import completes with every file identical.
. "$(dirname "$0")/lib.sh"

"$ULPACK" synth "$T/run" --steps 6 --dim 192 || fail synth
# the kill moments are spread over the fastest of three probe imports (a first
# import on cold caches is slower than the ones that follow)
dur_ms=
for p in 1 2 3; do
	"$ULPACK" init "$T/probe$p" > /dev/null
	t0=$(date +%s%N)
	"$ULPACK" import "$T/probe$p" "$T/run" --threads 1 > /dev/null || fail "probe import"
	d=$(( ($(date +%s%N) - t0) / 1000000 ))
	[ -z "$dur_ms" ] || [ "$d" -lt "$dur_ms" ] && dur_ms=$d
	rm -rf "$T/probe$p"
done
echo "a full import takes $dur_ms ms"
# an import that finished before its kill (the machine got faster) does not
# count, and the schedule shrinks by a third for the next ones
kills=0 tries=0
for i in $(seq 1 24); do
	A="$T/a$i"
	while :; do
		rm -rf "$A"
		"$ULPACK" init "$A" > /dev/null
		"$ULPACK" import "$A" "$T/run" --threads 1 > /dev/null 2>&1 &
		pid=$!
		ms=$(( dur_ms * ((i * 37) % 24 + 1) / 30 ))  # from 3 % to 80 % of it
		sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
		tries=$((tries + 1))
		if kill -9 "$pid" 2>/dev/null; then
			kills=$((kills + 1))
			wait "$pid" 2>/dev/null
			break
		fi
		wait "$pid" 2>/dev/null
		dur_ms=$(( dur_ms * 2 / 3 ))
		[ "$tries" -lt 48 ] || break
	done
	"$ULPACK" verify "$A" > "$T/v" 2>&1 || { fail "verify after kill $i at $ms ms: $(cat "$T/v")"; continue; }
	"$ULPACK" import "$A" "$T/run" --threads 1 > "$T/out" 2>&1 || { fail "re-run $i: $(cat "$T/out")"; continue; }
	"$ULPACK" gc "$A" > /dev/null || fail "gc $i"
	ls "$A/packs" | grep -q '^tmp-' && fail "temporary pack left after gc ($i)"
	"$ULPACK" verify "$A" > "$T/v" || fail "final verify $i"
	for s in 100 600; do
		"$ULPACK" cat "$A" "checkpoint-$s/model.safetensors" | cmp -s - "$T/run/checkpoint-$s/model.safetensors" \
			|| fail "step $s differs after kill $i"
	done
	rm -rf "$A"
done
[ "$kills" -ge 20 ] && ok "$kills imports killed mid-way ($tries started); each archive verified, completed and read back" \
	|| fail "only $kills imports were killed mid-way ($tries started)"
finish
