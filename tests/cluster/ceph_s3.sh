#!/bin/sh
# SPDX-License-Identifier: MIT
# ceph_s3.sh - issue 26 item 1: the S3 client (src/lib/store/s3.c, driven
# by tests/unit/s3_probe from host 1's network namespace) against a real
# Ceph radosgw (cephx, memstore OSD): bucket create, PUT from memory and
# from a file, multipart, GET whole and a range, HEAD, a key that needs
# encoding, LIST by prefix over 3 pages, DELETE, If-None-Match 200 then 412,
# If-Match with the quoted and the bare ETag 200 and a stale one 412, a wrong
# secret (403, named, the secret never printed), radosgw killed mid-GET
# (the right bytes after a retry, or an error; never wrong bytes) and down.
. "$(dirname "$0")/lib.sh"
PROBE=${S3_PROBE:-${top_builddir:-.}/tests/unit/s3_probe}
[ -x "$PROBE" ] || skip "no $PROBE (make tests/unit/s3_probe)"
cl_need_ceph
cl_need radosgw radosgw-admin
cl_netns_up 1
cl_rgw_up

# the client's settings: the environment only (no ~/.aws of this machine)
export AWS_ENDPOINT_URL="$CL_S3_ENDPOINT" AWS_ACCESS_KEY_ID="$CL_S3_KEY" AWS_SECRET_ACCESS_KEY="$CL_S3_SECRET"
export AWS_REGION=us-east-1 AWS_SHARED_CREDENTIALS_FILE="$T/none" AWS_CONFIG_FILE="$T/none"
unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE 2> /dev/null
s3() { cl_on 1 "$PROBE" ckpt "$@"; }
# s3_ok WHAT ARGS...: the probe succeeds, its output in $T/out
s3_ok() {
	_s_w=$1
	shift
	if s3 "$@" > "$T/out" 2> "$T/err"; then ok "$_s_w"; else fail "$_s_w: $(cat "$T/err")"; return 1; fi
}
# s3_rc RC WHAT ARGS...: the probe exits RC (2 NOENT, 3 EXIST, 4 4xx, 5 CORRUPT), stderr in $T/err
s3_rc() {
	_s_x=$1 _s_w=$2
	shift 2
	s3 "$@" > "$T/out" 2> "$T/err"
	_s_r=$?
	if [ "$_s_r" = "$_s_x" ]; then ok "$_s_w: $(head -c 200 "$T/err")"; else fail "$_s_w: exit $_s_r, not $_s_x: $(cat "$T/err")"; return 1; fi
}
t0=$(cl_ms)

s3_ok "create bucket" mkbucket
s3_ok "create it again (ours)" mkbucket
head -c 3100 /dev/urandom > "$T/p1"
s3_ok "PUT from memory" put packs/p1.pack "$T/p1"
s3_ok "GET" get packs/p1.pack 0 3100 && cmp -s "$T/out" "$T/p1" && ok "GET: the same bytes" || fail "GET differs"
tail -c +101 "$T/p1" | head -c 100 > "$T/r1"
s3_ok "range GET" get packs/p1.pack 100 100 && cmp -s "$T/out" "$T/r1" && ok "range GET: the same 100 bytes" ||
	fail "range GET differs"
md5=$(md5sum < "$T/p1" | cut -d' ' -f1)
s3_ok "HEAD" head packs/p1.pack && [ "$(cat "$T/out")" = "3100 \"$md5\"" ] &&
	ok "HEAD: size and ETag (the MD5, quoted)" || fail "HEAD: '$(cat "$T/out")', not 3100 \"$md5\""
s3_rc 5 "a range past the end" get packs/p1.pack 3000 200 && [ ! -s "$T/out" ] && ok "... and no bytes out" ||
	fail "bytes out of a range past the end"
s3_rc 2 "GET of a missing key" get packs/none 0 1 && grep -q 's3://ckpt/packs/none.*HTTP 404' "$T/err" &&
	ok "the message names the key and HTTP 404" || fail "404 message: $(cat "$T/err")"

# a key that needs encoding, a PUT from a file, multipart
k='packs/a b+c=d&e~f'
s3_ok "PUT of '$k'" put "$k" "$T/r1" && s3_ok "GET of '$k'" get "$k" 0 100 && cmp -s "$T/out" "$T/r1" &&
	ok "'$k': the same bytes" || fail "'$k' differs"
head -c 3000000 /dev/urandom > "$T/f1"
s3_ok "PUT from a file" putfile packs/f1 "$T/f1" && s3_ok "GET it" get packs/f1 0 3000000 &&
	cmp -s "$T/out" "$T/f1" && ok "file PUT: the same bytes" || fail "file PUT differs"
head -c 12000000 /dev/urandom > "$T/big"
export S3_PROBE_THRESHOLD=6000000 S3_PROBE_PART=5242880
s3_ok "multipart PUT from a file (3 parts)" putfile packs/big "$T/big" &&
	s3_ok "multipart PUT from memory" put packs/big2 "$T/big"
unset S3_PROBE_THRESHOLD S3_PROBE_PART
s3_ok "HEAD of the multipart object" head packs/big && grep -q '^12000000 "[0-9a-f]*-3"$' "$T/out" &&
	ok "a 3-part ETag: $(cat "$T/out")" || fail "multipart HEAD: $(cat "$T/out")"
for o in big big2; do
	s3_ok "GET of packs/$o" get "packs/$o" 0 12000000 && cmp -s "$T/out" "$T/big" && ok "packs/$o: the same bytes" ||
		fail "packs/$o differs"
done
tail -c +5000001 "$T/big" | head -c 1000000 > "$T/r2"
s3_ok "a range across parts" get packs/big 5000000 1000000 && cmp -s "$T/out" "$T/r2" && ok "... the same bytes" ||
	fail "range across parts differs"

# LIST: 5 keys under a prefix, 2 a page (3 pages), others not
for i in 1 2 3 4 5; do s3 put "list/k$i" "$T/r1" 2> "$T/err" || fail "put list/k$i: $(cat "$T/err")"; done
s3 put listx "$T/r1" 2> "$T/err" || fail "put listx: $(cat "$T/err")"
s3_ok "LIST list/, max-keys 2" list list/ 2 &&
	[ "$(cat "$T/out" | tr '\n' ' ')" = "list/k1 100 list/k2 100 list/k3 100 list/k4 100 list/k5 100 " ] &&
	ok "LIST: the 5 keys of the prefix in order, through 3 pages" || fail "LIST: $(cat "$T/out" | tr '\n' ' ')"
s3_ok "LIST packs/" list packs/ && [ "$(wc -l < "$T/out")" = 5 ] && grep -q "^$k 100\$" "$T/out" &&
	ok "LIST packs/: 5 keys, '$k' among them" || fail "LIST packs/: $(cat "$T/out" | tr '\n' ' ')"

s3_ok "DELETE" del packs/p1.pack
s3_rc 2 "HEAD after DELETE" head packs/p1.pack

# conditional PUTs
echo one > "$T/c1"
echo two > "$T/c2"
echo three > "$T/c3"
s3_ok "If-None-Match: * on a new key" putif index/CURRENT "$T/c1"
s3_rc 3 "If-None-Match: * on an existing key (412)" putif index/CURRENT "$T/c2" &&
	grep -q 'HTTP 412' "$T/err" && ok "... the message says HTTP 412" || fail "412 message: $(cat "$T/err")"
s3_ok "HEAD" head index/CURRENT
q=$(cut -d' ' -f2 < "$T/out")
s3_ok "If-Match with the quoted ETag (as HEAD gives it)" putif index/CURRENT "$T/c2" "$q"
bare=$(tr -d '"' < "$T/out")
s3_ok "If-Match with the bare ETag" putif index/CURRENT "$T/c3" "$bare"
s3_rc 3 "If-Match with a stale ETag (412)" putif index/CURRENT "$T/c1" "$q"
s3_ok "GET index/CURRENT" get index/CURRENT 0 6 && cmp -s "$T/out" "$T/c3" && ok "the last successful write won" ||
	fail "index/CURRENT: '$(cat "$T/out")'"

# a wrong secret: 403, the key named, no secret in the message
AWS_SECRET_ACCESS_KEY=WRONGSECRET
s3_rc 4 "a wrong secret" get packs/f1 0 10 &&
	grep -q 's3://ckpt/packs/f1.*HTTP 403.*credentials' "$T/err" && ! grep -q -e WRONGSECRET -e "$CL_S3_SECRET" "$T/err" &&
	ok "403: the key, the status, no secret in the message" || fail "403 message: $(cat "$T/err")"
AWS_SECRET_ACCESS_KEY=$CL_S3_SECRET

# radosgw killed during a GET (throttled to 2 MB/s: 4 s for 8 MiB), then
# started again: the GET retries and gives the right bytes, or fails; it
# never gives other bytes
head -c 8388608 /dev/urandom > "$T/slow"
s3 put packs/slow "$T/slow" 2> "$T/err" || fail "put packs/slow: $(cat "$T/err")"
rgw_deaf() { ! cl_rgw_listening; } # (a killed process's threads end a moment after it)
rgw_pid() { for _p_d in $CL_DAEMONS; do case $_p_d in rgw:*) _p_p=${_p_d#rgw:} ;; esac; done; echo "$_p_p"; }
cl_on 1 env S3_PROBE_RECV_SPEED=2000000 S3_PROBE_TRIES=12 S3_PROBE_BACKOFF_MS=500 "$PROBE" ckpt get packs/slow 0 8388608 \
	> "$T/slow.out" 2> "$T/slow.err" &
gp=$!
cl_sleep 1
rp=$(rgw_pid)
kill -9 "$rp"
tk=$(cl_ms)
if ! cl_wait 5 cl_gone "$rp"; then
	fail "radosgw $rp ($(cat "/proc/$rp/comm" 2> /dev/null)) still runs after kill -9"
elif ! cl_wait 5 rgw_deaf; then
	fail "radosgw $rp killed, but $CL_SRV_IP:7480 still listens after 5 s"
elif ! running "$gp"; then
	fail "the GET ended before radosgw was killed"
else
	ok "radosgw killed during the GET"
fi
cl_rgw_start
cl_wait_for rgw 60 cl_rgw_listening || fail "radosgw did not listen again in 60 s"
echo "# radosgw listening again $(cl_secs "$tk") s after the kill"
wait "$gp"
grc=$?
if [ "$grc" = 0 ]; then
	cmp -s "$T/slow.out" "$T/slow" && ok "GET across a radosgw kill -9 and restart: retried, the same 8 MiB" ||
		fail "GET across a radosgw kill gave other bytes"
else
	[ ! -s "$T/slow.out" ] && ok "GET across a radosgw kill: an error, no bytes: $(cat "$T/slow.err")" ||
		fail "GET across a radosgw kill failed but wrote bytes"
fi
# radosgw down: an error that names the endpoint, after the tries
kill -9 "$(rgw_pid)"
export S3_PROBE_TRIES=2
s3_rc 1 "GET with radosgw down" get packs/f1 0 10 && grep -q "after 2 tries" "$T/err" &&
	grep -q "$CL_SRV_IP:7480" "$T/err" && ok "... the endpoint and the tries named" || fail "radosgw down: $(cat "$T/err")"
echo "# S3 checks in $(cl_secs "$t0") s"
finish
