#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_sync.sh - issue 12: close returns before archiving; `ulpack sync MNT`
# is the barrier (everything closed before it is in the index); a file's
# user.ulpack.state and the root's archiving counters; kill -9 right after
# close recovers the file from staging.
. "$(dirname "$0")/lib.sh"
need_fuse
A="$T/arch" M="$T/mnt"
"$ULPACK" init "$A" > /dev/null
mount_fs "$A" "$M" || { fail mount; finish; }
head -c 3000000 /dev/urandom > "$T/f.bin"
for i in 1 2 3; do cp "$T/f.bin" "$M/f$i.bin"; done
"$ULPACK" sync "$M" > "$T/out" && ok "ulpack sync: $(cat "$T/out")" || fail "sync: $(cat "$T/out")"
"$PY" - "$M" <<'PYEOF' && ok "state archived, counters" || fail "state/counters"
import os, sys
m = sys.argv[1]
for i in (1, 2, 3):
    assert os.getxattr(os.path.join(m, "f%d.bin" % i), "user.ulpack.state") == b"archived"
v = os.getxattr(m, "user.ulpack.counters").decode().split()
c = dict(zip(v[0::2], map(int, v[1::2])))
assert c["archived"] == 3 and c["queued"] == 0 and c["archived_bytes"] == 9000000, c
PYEOF
umount_fs "$M"
"$ULPACK" ls "$A" | grep -c 'f[123].bin' | grep -q 3 && ok "all three in the index" || fail "index"
# kill -9 right after close(): recovered at the next mount
mount_fg "$A" "$M" 2> "$T/fs.err" || fail "mount in the foreground"
cp "$T/f.bin" "$M/k.bin" && crash_fs "$FS_PID" "$M"
mount_fs "$A" "$M" || fail remount
cmp -s "$T/f.bin" "$M/k.bin" && ok "closed file survives kill -9 of ulpackfs" || fail "k.bin lost"
"$ULPACK" sync "$M" > /dev/null || fail "sync after recovery"
umount_fs "$M"
"$ULPACK" verify "$A" > "$T/v" && ok "$(cat "$T/v")" || fail "verify: $(cat "$T/v")"
"$ULPACK" sync "$T" 2> "$T/e" && fail "sync of a plain directory" || ok "not a mount: $(cat "$T/e")"
finish
