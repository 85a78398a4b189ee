#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_v1.sh - issue 13 item 1: an archive written by a release that wrote
# blob format v1 (simulated with ULP_TEST_BLOB_VERSION=1) keeps working when
# this release adds v2 blobs to it: new steps are coded as v2 deltas against
# the v1 references, every file reads back and verifies, gc rewrites packs of
# both versions, and contents named by both identities stay apart.
. "$(dirname "$0")/lib.sh"

S="$T/run" A="$T/arch"
"$ULPACK" synth "$S" --dim 64 --steps 4 > /dev/null || fail synth
"$ULPACK" init "$A" > /dev/null || fail init
mkdir -p "$T/old" "$T/new"
mv "$S/checkpoint-100" "$S/checkpoint-200" "$T/old/"
mv "$S/checkpoint-300" "$S/checkpoint-400" "$T/new/"
ULP_TEST_BLOB_VERSION=1 "$ULPACK" import "$A" "$T/old" --prefix run > "$T/out" 2>&1 || fail "v1 import: $(cat "$T/out")"
# a v1 pack's blobs start with "ULPb\001", v2's with "ULPb\002"
grep -c "ULPb$(printf '\001')" "$A"/packs/*.pack > /dev/null || fail "the v1 import wrote no v1 blob"
cp -r "$A" "$T/C" # the v1 archive, for the layout of max_chain 16, below
# max_chain 1: segments of two steps (ulpack-format(5)): 200 the anchor of the
# first, 300 a forward delta against it, 400 the anchor of the second
"$ULPACK" import "$A" "$T/new" --prefix run --max-chain 1 > "$T/out" 2>&1 || fail "v2 import: $(cat "$T/out")"
# step 300's chain goes through the v1 blobs of step 200: depth 1
"$ULPACK" stat "$A" run/checkpoint-300/model.safetensors --json | grep -q '"chain_depth": 1' &&
	ok "v2 deltas against v1 references" || fail "step 300 is not coded against step 200's v1 blobs"
for p in old/checkpoint-100 old/checkpoint-200 new/checkpoint-300 new/checkpoint-400; do
	f=${p#*/}/model.safetensors
	"$ULPACK" cat "$A" "run/$f" | cmp -s - "$T/$p/model.safetensors" || fail "run/$f reads back wrong"
done
"$ULPACK" verify "$A" > "$T/out" 2>&1 || fail "verify: $(cat "$T/out")"
# the layout of max_chain 16 (the import re-codes what it changes): 400 the
# anchor, 300 and then 200's v1 contents re-coded as backward deltas, against
# v2 references; a v1 content identical to its v2 reference is a delta, not
# an identical-to-reference blob (regression: v1 refuses one naming another
# identity)
"$ULPACK" import "$T/C" "$T/new" --prefix run > "$T/out" 2>&1 || fail "v2 import, max_chain 16: $(cat "$T/out")"
cp -r "$T/C" "$T/B" # for re-basing, below
"$ULPACK" stat "$T/C" run/checkpoint-200/model.safetensors --json | grep -q '"chain_depth": 2' ||
	fail "step 200 is not re-coded against step 300"
"$ULPACK" verify "$T/C" > "$T/out" 2>&1 || fail "verify (v1 re-coded against v2): $(cat "$T/out")"
ok "v1 deltas against v2 references"
# the same content archived again by this release: stored under its v2 identity
cp -r "$T/old/checkpoint-100" "$T/again"
"$ULPACK" import "$A" "$T/again" --prefix copy > "$T/out" 2>&1 || fail "reimport: $(cat "$T/out")"
"$ULPACK" rm "$A" run/checkpoint-100 -r > /dev/null 2>&1 || fail "rm"
"$ULPACK" rm "$A" run/checkpoint-300 -r > /dev/null 2>&1 || fail "rm"
"$ULPACK" gc "$A" > "$T/out" 2>&1 || fail "gc: $(cat "$T/out")"
"$ULPACK" verify "$A" > "$T/out" 2>&1 || fail "verify after gc: $(cat "$T/out")"
"$ULPACK" cat "$A" run/checkpoint-400/model.safetensors | cmp -s - "$T/new/checkpoint-400/model.safetensors" ||
	fail "v2 delta over v1 references reads back wrong after gc"
"$ULPACK" cat "$A" copy/model.safetensors | cmp -s - "$T/old/checkpoint-100/model.safetensors" ||
	fail "copy reads back wrong after gc"
# re-basing (recode.c) over both formats: forgetting 100 and 300 re-codes step
# 200's v1 contents (coded against 300's v2); each new blob keeps its
# content's format, so its digest stays the content's key (regression: recode
# compared a v2 key with a plain SHA-256 and wrote v2 blobs under v1 keys)
B="$T/B"
"$ULPACK" forget "$B" run --keep-every 200 --json > "$T/out" 2>&1 || fail "forget: $(cat "$T/out")"
grep -q '"blobs_rebased": [1-9]' "$T/out" || fail "forget re-based nothing: $(cat "$T/out")"
"$ULPACK" verify "$B" > "$T/out" 2>&1 || fail "verify after forget: $(cat "$T/out")"
for s in 200 400; do
	"$ULPACK" cat "$B" run/checkpoint-$s/model.safetensors | cmp -s - "$T/"*"/checkpoint-$s/model.safetensors" ||
		fail "step $s reads back wrong after forget"
done
# the re-coded blobs' pack loses step 400's half: gc rewrites it, checking
# each blob's content digest by its format
"$ULPACK" rm "$B" run/checkpoint-400 -r > /dev/null 2>&1 || fail "rm 400"
"$ULPACK" gc "$B" > "$T/out" 2>&1 || fail "gc after forget: $(cat "$T/out")"
"$ULPACK" verify "$B" > "$T/out" 2>&1 || fail "verify after forget and gc: $(cat "$T/out")"
"$ULPACK" cat "$B" run/checkpoint-200/model.safetensors | cmp -s - "$T/old/checkpoint-200/model.safetensors" ||
	fail "step 200 reads back wrong after forget and gc"
ok "forget re-bases v1 and v2 contents; verify and gc agree"
finish
