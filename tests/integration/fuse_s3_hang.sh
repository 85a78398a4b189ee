#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_s3_hang.sh - issue 34 item 6 through a real read-only mount of an
# s3:// archive whose store (the emulator, tests/unit/s3mock_serve, on
# 127.0.0.1) hangs: it accepts connections and never answers.
#   - files whose packs are cached open, read and list at once (lookups and
#     opens reach the daemon: entry and attribute timeouts are the poll's)
#   - a read that needs the store (its pack evicted from the cache) and a
#     getxattr of user.ulpack.space (a listing of the bucket) end soon after
#     the waiting program is interrupted (SIGINT), well before the request's
#     deadline (ULPACK_S3_TIMEOUT=30 here)
#   - unmounted while the store still hangs, the daemon exits at once (no
#     worker left waiting on the store)
#   - df of the mount counts the bucket's bytes; once the store answers again
#     the evicted file reads back whole
. "$(dirname "$0")/lib.sh"
need_fuse
: "${top_builddir:=$(dirname "$ULPACK")}"
MOCK="$top_builddir/tests/unit/s3mock_serve"
[ -x "$MOCK" ] || { fail "no $MOCK (make check builds it)"; finish; }
command -v getfattr > /dev/null || skip "no getfattr (apt-get install attr)"

now_ms() { date +%s%3N; }

mkfifo "$T/ctl"
"$MOCK" < "$T/ctl" > "$T/mock.out" 2> "$T/mock.err" &
MPID=$!
exec 3> "$T/ctl"
ULP_CLEANUP='exec 3>&-; kill $MPID 2>/dev/null; wait $MPID 2>/dev/null'
for _ in $(seq 50); do [ -s "$T/mock.out" ] && break; sleep 0.1; done
EP=$(head -n 1 "$T/mock.out")
case $EP in http://127.0.0.1:*) ;; *) fail "the emulator did not start: $(cat "$T/mock.err")"; finish ;; esac

unset AWS_PROFILE AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE AWS_DEFAULT_REGION 2> /dev/null
export AWS_ENDPOINT_URL="$EP" AWS_ACCESS_KEY_ID=testkey AWS_SECRET_ACCESS_KEY=SECRETSECRET AWS_REGION=us-east-1
export AWS_SHARED_CREDENTIALS_FILE="$T/none" AWS_CONFIG_FILE="$T/none" ULPACK_CACHE_DIR="$T/cache"
export ULPACK_S3_TIMEOUT=30 # a request's deadline: long, so that an interrupt's end is told apart
URL=s3://ckpt/run M="$T/mnt"

"$ULPACK" init "$URL" > /dev/null || { fail "init $URL"; finish; }
"$ULPACK" synth "$T/src" --steps 3 --dim 256 > /dev/null || fail synth
"$ULPACK" import "$URL" "$T/src" > /dev/null || { fail "import into $URL"; finish; }
( cd "$T/src" && find . -type f | sed 's|^\./||' | sort ) > "$T/files"
# a file of its own pack (a second import), read first once the store hangs:
# never mapped nor in the page cache before
victim=extra/victim.bin
mkdir -p "$T/src2/extra"
head -c 3000000 /dev/urandom > "$T/src2/$victim"
"$ULPACK" import "$URL" "$T/src2" > /dev/null || fail "the second import"
mount_fs "$URL" "$M" -o ro,poll=0.2,cache_dir="$T/rcache" || { fail "mount $URL"; finish; }

bad=0
while read -r f; do cmp -s "$T/src/$f" "$M/$f" || bad=$((bad + 1)); done < "$T/files"
[ "$bad" = 0 ] && ok "$(wc -l < "$T/files") files read through the mount (their packs now cached)" ||
	fail "$bad files differ"
bucket=$(getfattr --only-values -n user.ulpack.space "$M" 2> /dev/null | sed -n 's/.*"bucket_bytes": \([0-9]*\).*/\1/p')
used=$(df -B1 --output=used "$M" | tail -n 1 | tr -d ' ')
home=$(du -sB1 "$T/rcache" | cut -f1)
[ -n "$bucket" ] && [ "$used" -ge "$bucket" ] && [ "$used" -lt $((bucket + 65536)) ] &&
	ok "df counts the bucket's bytes ($used used, $bucket in the bucket, $home in the local cache)" ||
	fail "df: $used used, bucket ${bucket:-(not in user.ulpack.space)}, local cache $home"

echo hang >&3
sleep 1.5 # past the entry and attribute timeouts (the poll's, 0.2 s) and a poll
t0=$(now_ms)
timeout 20 sh -c '
	ls -lR "$1" > /dev/null || exit 1
	while read -r f; do cmp -s "$2/$f" "$1/$f" || exit 1; done < "$3"
	stat "$1/$(head -n 1 "$3")" > /dev/null' sh "$M" "$T/src" "$T/files"
rc=$? took=$(($(now_ms) - t0))
[ "$rc" = 0 ] && [ "$took" -lt 5000 ] && ok "with the store hung, ls -lR and every cached file's open and read: $took ms" ||
	fail "with the store hung: ls and cached reads took $took ms (status $rc)"

# an interrupted wait on the store: a listing of the bucket (getxattr)
t0=$(now_ms)
timeout -s INT 1 getfattr -n user.ulpack.space "$M" > /dev/null 2>&1
took=$(($(now_ms) - t0))
[ "$took" -lt 5000 ] && ok "getfattr user.ulpack.space on a hung store ends $took ms after it started (SIGINT at 1 s)" ||
	fail "getfattr user.ulpack.space took $took ms after SIGINT at 1 s (the deadline is 30 s)"

# an interrupted read that needs the store: its pack evicted from the cache
n=$(ls "$T"/rcache/s3/ckpt-*/reader/packs/*.pack 2> /dev/null | wc -l)
rm -f "$T"/rcache/s3/ckpt-*/reader/packs/*.pack
[ "$n" -gt 0 ] || fail "no pack in the reader's cache"
t0=$(now_ms)
timeout -s INT 1 cat "$M/$victim" > /dev/null 2> "$T/cat.err"
rc=$? took=$(($(now_ms) - t0))
[ "$rc" != 0 ] && [ "$took" -ge 900 ] || fail "the read did not wait for the store (status $rc, $took ms: $(cat "$T/cat.err"))"
[ "$took" -lt 5000 ] && ok "a read that needs the hung store ends $took ms after it started (SIGINT at 1 s)" ||
	fail "a read on the hung store took $took ms after SIGINT at 1 s"
# the daemon's worker is free again: the next lookups answer at once
t0=$(now_ms)
timeout 20 ls -l "$M" > /dev/null
took=$(($(now_ms) - t0))
[ "$took" -lt 3000 ] && ok "the mount answers right after ($took ms)" || fail "the mount answered after $took ms"

# unmounted while the store still hangs: the daemon exits at once, so no
# worker still waits on the store (the interrupted requests ended there, not
# only in the kernel) and the background poll's wait ends with the close
t0=$(now_ms)
fusermount3 -u "$M" && MOUNTS=""
for _ in $(seq 200); do pgrep -f "ulpackfs $URL $M" > /dev/null || break; sleep 0.1; done
took=$(($(now_ms) - t0))
[ "$took" -lt 5000 ] && ok "unmounted with the store hung: the daemon gone in $took ms" ||
	fail "the daemon took $took ms to exit (a request still waited on the store)"

echo answer >&3
mount_fs "$URL" "$M" -o ro,poll=0.2,cache_dir="$T/rcache" || { fail "mount again"; finish; }
cmp -s "$T/src2/$victim" "$M/$victim" && ok "once the store answers the file reads back whole" ||
	fail "$victim after the store answers again"
finish
