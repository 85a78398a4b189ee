#!/bin/sh
# SPDX-License-Identifier: MIT
# archive_damage.sh - a byte flipped in a pack: verify names exactly the files
# that depend on it and exits 1; those files fail to cat (never wrong bytes);
# the other files still read.
. "$(dirname "$0")/lib.sh"

A="$T/arch"
"$ULPACK" init "$A" >/dev/null
"$ULPACK" synth "$T/run" --steps 4 --dim 64 || fail synth
printf 'hello\n' > "$T/run/notes.txt"
# one import a step: one pack a step
for s in 100 200 300 400; do
	mkdir -p "$T/s$s" && cp -p -r "$T/run/checkpoint-$s" "$T/s$s/"
	"$ULPACK" import "$A" "$T/s$s" --prefix run > /dev/null || fail "import $s"
done
mkdir -p "$T/n" && cp -p "$T/run/notes.txt" "$T/n/"
"$ULPACK" import "$A" "$T/n" --prefix run > /dev/null
# the pack of step 100: the oldest step, a delta against step 200 (each
# import re-codes the step before it, ulpack-format(5), layout of a series):
# nothing depends on it but step 100 itself
pack=$A/packs/$("$PY" - "$A/ulpack.db" <<'PYEOF'
import sqlite3, sys
db = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True)
print(db.execute("SELECT p.name FROM packs p JOIN blobs b ON b.pack = p.id JOIN extents x ON x.blob = b.id"
                 " JOIN entries e ON e.id = x.file WHERE e.path = 'run/checkpoint-100/model.safetensors'"
                 " GROUP BY p.id ORDER BY sum(b.stored_size) DESC LIMIT 1").fetchone()[0])
PYEOF
)
size=$(stat -c %s "$pack")
"$PY" - "$pack" "$size" <<'PYEOF'
import sys
p, n = sys.argv[1], int(sys.argv[2])
with open(p, "r+b") as f:
    f.seek(n // 2); b = f.read(1); f.seek(n // 2); f.write(bytes([b[0] ^ 0x40]))
PYEOF
"$ULPACK" verify "$A" > "$T/v"
rc=$?
[ "$rc" = 1 ] && ok "verify exits 1" || fail "verify exit status $rc"
grep '^DAMAGED' "$T/v" | sed 's/:.*//' > "$T/damaged"
[ "$(cat "$T/damaged")" = "DAMAGED run/checkpoint-100/model.safetensors" ] \
	&& ok "exactly the dependent file is named: $(head -1 "$T/v" | cut -c1-150)" || fail "damaged list: $(cat "$T/v")"
"$ULPACK" cat "$A" run/checkpoint-100/model.safetensors > "$T/out" 2> "$T/err" && fail "cat of a damaged file succeeded" \
	|| ok "cat fails: $(cut -c1-160 "$T/err")"
cmp -s "$T/out" "$T/run/checkpoint-100/model.safetensors" && fail "damaged file printed entirely"
for s in 200 300 400; do
	"$ULPACK" cat "$A" "run/checkpoint-$s/model.safetensors" | cmp -s - "$T/run/checkpoint-$s/model.safetensors" \
		&& ok "step $s still reads" || fail "step $s broken"
done
"$ULPACK" cat "$A" run/notes.txt | cmp -s - "$T/run/notes.txt" && ok "other files read" || fail "notes broken"
finish
