#!/bin/sh
# SPDX-License-Identifier: MIT
# docs_truth.sh - issue 40 item 5: the docs say what the code does.
# ulpackfs(1)'s EXTENDED ATTRIBUTES names every user.ulpack.* attribute that
# src/fs/ulpackfs.c answers, and no other; `ulpack --help` and `ulpack rm
# --help` say that space comes back by itself (rm reclaims before it exits);
# nothing shipped points to a DESIGN.md the tree does not ship; the demo's
# banner describes the run it writes.
. "$(dirname "$0")/lib.sh"
man1="$top_srcdir/man/ulpackfs.1"
sed -n '/^\.SH EXTENDED ATTRIBUTES/,/^\.SH EXAMPLES/p' "$man1" | grep -o 'user\\*\.ulpack\\*\.[a-z_0-9]*' \
	| tr -d '\\' | sort -u > "$T/man"
grep -o '"user\.ulpack\.[a-z_0-9][a-z_0-9]*"' "$top_srcdir/src/fs/ulpackfs.c" | tr -d '"' | sort -u > "$T/code"
[ -s "$T/code" ] && [ -s "$T/man" ] || fail "no attributes found (man: $(wc -l < "$T/man"), code: $(wc -l < "$T/code"))"
missing=$(comm -13 "$T/man" "$T/code" | tr '\n' ' ')
extra=$(comm -23 "$T/man" "$T/code" | tr '\n' ' ')
[ -z "$missing" ] && ok "ulpackfs(1) lists every attribute ulpackfs answers ($(wc -l < "$T/code"))" \
	|| fail "ulpackfs(1) EXTENDED ATTRIBUTES lacks: $missing"
[ -z "$extra" ] && ok "ulpackfs(1) lists no attribute ulpackfs does not answer" || fail "listed, not answered: $extra"
# space: rm reclaims by itself
$ULPACK --help > "$T/help" 2>&1
$ULPACK rm --help > "$T/rmhelp" 2>&1
grep -q '^  rm .*space comes back by itself' "$T/help" && ok "ulpack --help: rm's space comes back by itself" \
	|| fail "ulpack --help rm: $(grep '^  rm' "$T/help")"
grep -qi 'space comes back by' "$T/rmhelp" && ! grep -qi "with 'ulpack gc'\|returns with gc" "$T/help" "$T/rmhelp" \
	&& ok "ulpack rm --help: no gc to run" || fail "rm --help: $(cat "$T/rmhelp")"
A="$T/a"
$ULPACK init "$A" > /dev/null
$ULPACK synth "$T/run" --steps 3 --dim 64 > /dev/null
$ULPACK import "$A" "$T/run" > /dev/null
$ULPACK rm "$A" checkpoint-200 -r > /dev/null
r=$($ULPACK stat "$A" --json | sed -n 's/.*"reclaimable_bytes": *\([0-9]*\).*/\1/p' | head -1)
[ "$r" = 0 ] && ok "after ulpack rm: 0 bytes reclaimable (as the help says)" || fail "reclaimable after rm: '$r'"
# no reference to a DESIGN.md the tree does not ship
if [ ! -e "$top_srcdir/DESIGN.md" ]; then
	refs=$(grep -l 'DESIGN\.md' "$top_srcdir/README.md" "$top_srcdir"/man/* "$top_srcdir"/tools/*.c "$top_srcdir"/tools/*.sh \
		"$top_srcdir"/src/fs/*.c "$top_srcdir"/python/README.md "$top_srcdir"/python/ulpack/*.py 2> /dev/null)
	grep -q 'DESIGN\.md' "$T/help" "$T/rmhelp" && refs="$refs ulpack --help"
	[ -z "$refs" ] && ok "no DESIGN.md named in README, man pages, --help, python" || fail "DESIGN.md named in: $refs"
fi
# the demo's banner: the run `ulpack synth --steps 8` writes, and the files
# the demo adds to each step
banner=$(grep -m1 '^echo "== a synthetic' "$top_srcdir/tools/demo.sh")
# the steps the demo asks for; the parameters of one (the same every step)
n=$(sed -n 's/.*ulpack" synth "$T\/run" --steps \([0-9]*\).*/\1/p' "$top_srcdir/tools/demo.sh")
$ULPACK synth "$T/demo" --steps 1 > /dev/null
params=$(python3 -c 'import json,struct,sys,math
f=open(sys.argv[1],"rb"); h=json.loads(f.read(struct.unpack("<Q",f.read(8))[0]))
print("%.1fM" % (sum(math.prod(v["shape"]) for k,v in h.items() if k!="__metadata__") / 1e6))' "$T/demo/checkpoint-100/model.safetensors")
added=$(grep -o '> "$d/[a-z_.]*"' "$top_srcdir/tools/demo.sh" | sed 's|.*\$d/||; s|"||' | tr '\n' ' ')
good=1
echo "$banner" | grep -q "$n checkpoints" || good=0
echo "$banner" | grep -q "$params parameters" || good=0
for f in $added; do echo "$banner" | grep -q "$f" || good=0; done
echo "$banner" | grep -q optimizer && ! echo "$added" | grep -q optim && good=0
[ "$good" = 1 ] && ok "demo banner: $n checkpoints of $params parameters, with $added" \
	|| fail "demo banner '$banner' vs $n checkpoints, $params parameters, files $added"
finish
