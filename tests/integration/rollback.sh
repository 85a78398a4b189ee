#!/bin/sh
# SPDX-License-Identifier: MIT
# rollback.sh - rolling back (issue 40 item 4): the newest steps deleted
# (`ulpack rm -r`, rm -r through a mount, the Python writer's
# remove(recursive=True)), the new newest step is an
# anchor (chain depth 0) and, once space has come back by itself (no gc),
# the archive's du is within 1.02x of a fresh import of the steps left.
. "$(dirname "$0")/lib.sh"
need_fuse
S="$T/src" K="$T/keep"
"$ULPACK" synth "$S" --steps 6 --dim 256 > /dev/null || { fail synth; finish; }
mkdir -p "$K" && for s in 100 200 300 400; do cp -a "$S/checkpoint-$s" "$K/"; done
"$ULPACK" init "$T/fresh" > /dev/null && "$ULPACK" import "$T/fresh" "$K" > /dev/null || { fail "fresh import"; finish; }
fresh=$(du -sk "$T/fresh" | cut -f1)
newest() { # chain depth of checkpoint-400, and the steps listed
	"$ULPACK" steps "$1" --json | "$PY" -c 'import json, sys
s = json.load(sys.stdin)
print(" ".join(str(x["step"]) for x in s), [x["chain_depth"] for x in s if x["step"] == 400][0])'
}
bound() { # bound NAME ARCHIVE
	got=$(du -sk "$2" | cut -f1)
	r=$("$PY" -c "print('%.4f' % ($got / $fresh))")
	"$PY" -c "import sys; sys.exit(0 if $got <= 1.02 * $fresh else 1)" \
		&& ok "$1: du $got KiB, a fresh import of the steps left $fresh KiB: ${r}x (bound 1.02x)" \
		|| fail "$1: du $got KiB against a fresh import's $fresh KiB: ${r}x (over 1.02x)"
	[ "$(newest "$2")" = "100 200 300 400 0" ] && ok "$1: steps 100-400 left, 400 an anchor" \
		|| fail "$1: steps and depth of the new newest: $(newest "$2")"
}
# ulpack rm -r of the newest two steps, newest first
"$ULPACK" init "$T/a" > /dev/null && "$ULPACK" import "$T/a" "$S" > /dev/null || { fail import; finish; }
"$ULPACK" rm "$T/a" checkpoint-600 -r > /dev/null && "$ULPACK" rm "$T/a" checkpoint-500 -r > /dev/null || fail "ulpack rm"
bound "ulpack rm -r of steps 600 and 500" "$T/a"
# rm -r through a mount, both at once; space comes back while mounted
"$ULPACK" init "$T/b" > /dev/null || { fail init; finish; }
mount_fs "$T/b" "$T/m" || { fail mount; finish; }
cp -r "$S"/checkpoint-* "$T/m/" && "$ULPACK" sync "$T/m" > /dev/null || fail "copy and sync"
rm -r "$T/m/checkpoint-600" "$T/m/checkpoint-500" || fail "rm -r through the mount"
"$ULPACK" sync "$T/m" > /dev/null
for _ in $(seq 100); do # the mount's tidy pass, while it stays mounted
	"$ULPACK" status "$T/m" --json | "$PY" -c 'import json, sys
d = json.load(sys.stdin); sys.exit(0 if d["pending_recodes"] == 0 and d["reclaimable_bytes"] == 0 else 1)' && break
	sleep 0.2
done
bound "rm -r through a mount, still mounted" "$T/b"
umount_fs "$T/m"
bound "rm -r through a mount, unmounted" "$T/b"
# the Python writer's remove(recursive=True), the writer still open
if [ -e "$top_builddir/libulpack.so.0" ] && ! nm -D "$top_builddir/libulpack.so.0" 2> /dev/null | grep -q ' U __asan_\| U __tsan_'; then
	"$ULPACK" init "$T/c" > /dev/null && "$ULPACK" import "$T/c" "$S" > /dev/null || fail "import (python)"
	ULPACK_LIB="$top_builddir/libulpack.so.0" PYTHONPATH="$top_srcdir/python" "$PY" - "$T/c" "$T/c.du" <<'PYEOF' || fail "python remove"
import subprocess, sys, ulpack
w = ulpack.writer(sys.argv[1])
w.remove("checkpoint-600", recursive=True)
w.remove("checkpoint-500", recursive=True)
open(sys.argv[2], "w").write(subprocess.check_output(["du", "-sk", sys.argv[1]]).decode().split()[0])
w.close()
PYEOF
	open_du=$(cat "$T/c.du")
	"$PY" -c "import sys; sys.exit(0 if $open_du <= 1.02 * $fresh else 1)" \
		&& ok "python remove(recursive=True), writer open: du $open_du KiB (bound 1.02x of $fresh)" \
		|| fail "python remove, writer open: du $open_du KiB against $fresh KiB"
	bound "python remove(recursive=True), closed" "$T/c"
fi
finish
