#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_rebase.sh - issue 15 items 1 and 2 through a real mount and the CLI:
# a 12-step run saved through tmp-checkpoint-N/ renames, and one rsynced in
# name order (checkpoint-1000 before checkpoint-200), are stored within 1 %
# of `ulpack import` of the same run in step order once the mount has
# re-based in the background and gc has dropped what that freed; `ulpack
# forget --keep-every` then leaves at most 1.1x what an import of the kept
# steps alone takes. Every archive verifies. Ratios only, never times.
. "$(dirname "$0")/lib.sh"
need_fuse
command -v rsync > /dev/null || skip "no rsync"
U=$ULPACK
pack_bytes() { "$U" stat "$1" | sed -n 's/.* in \([0-9]*\) pack bytes.*/\1/p'; }
within() { # within A B PERMILLE: A <= B * (1000 + PERMILLE) / 1000
	[ "$1" -le $(( $2 * (1000 + $3) / 1000 )) ]
}
"$U" synth "$T/src" --steps 12 --interval 100 --dim 128 > /dev/null || fail "synth"
"$U" init "$T/ref" > /dev/null && "$U" import "$T/ref" "$T/src" --prefix run > /dev/null || fail "import"
REF=$(pack_bytes "$T/ref")

# rsync in name order
"$U" init "$T/names" > /dev/null
mount_fs "$T/names" "$T/m1" || fail "mount"
rsync -a "$T/src/" "$T/m1/run/" || fail "rsync"
umount_fs "$T/m1" # waits for the daemon: it archives and re-bases its queue after the unmount
"$U" gc "$T/names" > /dev/null || fail "gc (names)"
B=$(pack_bytes "$T/names")
"$U" verify "$T/names" > /dev/null || fail "verify (names)"
within "$B" "$REF" 10 && ok "name order: $B pack bytes, import $REF" || fail "name order: $B pack bytes, import $REF (over 1 %)"

# tmp-checkpoint-N/ written, then renamed to checkpoint-N/
"$U" init "$T/tmp" > /dev/null
mount_fs "$T/tmp" "$T/m2" || fail "mount"
mkdir "$T/m2/run"
for d in $(cd "$T/src" && ls -d checkpoint-* | sort -t- -k2 -n); do
	mkdir "$T/m2/run/tmp-$d" && cp "$T/src/$d/"* "$T/m2/run/tmp-$d/" && mv "$T/m2/run/tmp-$d" "$T/m2/run/$d" || fail "save $d"
done
# issue 17: the newest step, saved last through the mount, is an anchor as
# soon as it is there (the xattrs of the mount)
"$PY" -c '
import os, sys
p = sys.argv[1] + "/run/checkpoint-1200/model.safetensors"
assert int(os.getxattr(p, "user.ulpack.chain_depth")) == 0, os.getxattr(p, "user.ulpack.chain_depth")' "$T/m2" \
	&& ok "newest step saved through the mount: an anchor" || fail "newest step not an anchor"
umount_fs "$T/m2"
"$U" gc "$T/tmp" > /dev/null || fail "gc (tmp)"
# once re-coded: the layout of ulpack-format(5): twelve steps, one segment
# (max_chain 16), the newest its anchor, the key (step 800, the 8th) a delta
# against it, each other step a backward delta against the step after it
# (issue 29: at most 8 deep)
"$U" stat "$T/tmp" --json | "$PY" -c '
import json, sys
d = json.load(sys.stdin)
f = {x["step"]: x for x in d["files"] if x["path"].endswith("model.safetensors")}
assert f[1200]["anchor"], f[1200]
want = lambda i: 11 - i if i > 7 else 8 - i
assert all(f[s]["chain_depth"] == want(s // 100 - 1) for s in range(100, 1200, 100)), [(s, f[s]["chain_depth"]) for s in f]' \
	&& ok "after re-coding: the newest the anchor, the key onto it, every other step a backward delta" \
	|| fail "layout after re-coding"
B=$(pack_bytes "$T/tmp")
"$U" verify "$T/tmp" > /dev/null || fail "verify (tmp)"
within "$B" "$REF" 10 && ok "tmp-dir renames: $B pack bytes, import $REF" || fail "tmp-dir renames: $B pack bytes, import $REF (over 1 %)"

# retention: keep every 3rd step
"$U" forget "$T/tmp" run --keep-every 300 --dry-run > "$T/dry" || fail "forget --dry-run"
grep -q "8 steps would be forgotten" "$T/dry" || fail "dry run: $(cat "$T/dry")"
[ "$(pack_bytes "$T/tmp")" = "$B" ] || fail "a dry run changed the archive"
"$U" forget "$T/tmp" run --keep-every 300 --json > "$T/f.json" || fail "forget"
"$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["forgotten"] == 8 and d["kept"] == 4, d' "$T/f.json" || fail "forget --json"
"$U" verify "$T/tmp" > /dev/null || fail "verify after forget"
mkdir "$T/kept" && for s in 300 600 900 1200; do cp -r "$T/src/checkpoint-$s" "$T/kept/"; done
"$U" init "$T/k" > /dev/null && "$U" import "$T/k" "$T/kept" --prefix run > /dev/null || fail "import kept"
A=$(pack_bytes "$T/tmp") K=$(pack_bytes "$T/k")
within "$A" "$K" 100 && ok "forget: $A pack bytes, kept steps alone $K" || fail "forget: $A pack bytes, kept steps alone $K (over 1.1x)"
"$U" forget "$T/tmp" run > /dev/null 2>&1 && fail "forget without a rule succeeded"
finish
