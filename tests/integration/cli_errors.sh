#!/bin/sh
# SPDX-License-Identifier: MIT
# cli_errors.sh - bad input gets a clear error that names the file and the
# cause, and a non-zero exit status; --help works for every command.
. "$(dirname "$0")/lib.sh"

expect_error() { # expect_error PATTERN CMD...
	pat=$1
	shift
	if "$@" > "$T/out" 2> "$T/err"; then
		fail "'$*' succeeded"
	elif ! grep -q -- "$pat" "$T/err"; then
		fail "'$*': message '$(cat "$T/err")' lacks '$pat'"
	else
		ok "'$*' -> $(head -1 "$T/err")"
	fi
}
expect_usage() { # expect_usage PATTERN CMD...: a usage error, exit status 2
	pat=$1
	shift
	"$@" > "$T/out" 2> "$T/err"
	rc=$?
	if [ "$rc" -ne 2 ]; then
		fail "'$*' exited $rc, not 2 (usage error): $(head -1 "$T/err")"
	elif ! grep -q -- "$pat" "$T/err"; then
		fail "'$*': message '$(cat "$T/err")' lacks '$pat'"
	else
		ok "'$*' -> $(head -1 "$T/err")"
	fi
}

"$ULPACK" synth "$T/s" --steps 1 --dim 16 || fail synth
good="$T/s/checkpoint-100/model.safetensors"
expect_error "$T/missing.safetensors: No such file" "$ULPACK" bench "$T/missing.safetensors" "$good"
printf 'not a safetensors file at all' > "$T/junk.safetensors"
expect_error "junk.safetensors: not a valid safetensors file: header length" "$ULPACK" bench "$good" "$T/junk.safetensors"
head -c 100 "$good" > "$T/trunc.safetensors"
expect_error "trunc.safetensors: not a valid safetensors file" "$ULPACK" bench "$good" "$T/trunc.safetensors"
expect_error "unknown command" "$ULPACK" frobnicate
expect_error "unknown dtype" "$ULPACK" synth "$T/x" --dtype f128
expect_error "usage" "$ULPACK" bench "$good"
# ---- issue 11 item 19: every failure names the file and the cause, with a
# non-zero exit status, in the form "ulpack CMD: PATH: cause"
A="$T/arch"
"$ULPACK" init "$A" > /dev/null || fail init
"$ULPACK" import "$A" "$T/s" --prefix run > /dev/null || fail import
f=run/checkpoint-100/model.safetensors
expect_error "ulpack cat: \.\./x: not a valid path" "$ULPACK" cat "$A" ../x
grep -q "no error" "$T/err" && fail "cat ../x says 'no error'"
expect_error "ulpack cat: run/\.\./\.\./x: not a valid path" "$ULPACK" cat "$A" run/../../x
expect_error "ulpack stat: no/such/path: no such file" "$ULPACK" stat "$A" no/such/path
expect_error "ulpack stat: \.\./x: not a valid path" "$ULPACK" stat "$A" ../x
expect_error "ulpack verify: no/such: no such file" "$ULPACK" verify "$A" no/such
expect_error "ulpack verify: \.\./x: not a valid path" "$ULPACK" verify "$A" ../x
expect_error "ulpack ls: no/such: no such file" "$ULPACK" ls "$A" no/such
expect_error "ulpack ls: \.\./x: not a valid path" "$ULPACK" ls "$A" ../x
expect_error "ulpack export: no/such: no such file" "$ULPACK" export "$A" no/such "$T/exp"
expect_error "ulpack export: \.\./x: not a valid path" "$ULPACK" export "$A" ../x "$T/exp"
expect_error "ulpack rm: no/such: no such file" "$ULPACK" rm "$A" no/such
expect_error "ulpack rm: \.\./x: not a valid path" "$ULPACK" rm "$A" ../x
expect_error "ulpack cat: run: is a directory" "$ULPACK" cat "$A" run
expect_error "ulpack cat: $T/nowhere: no such archive" "$ULPACK" cat "$T/nowhere" "$f"
expect_error "ulpack gc: $T/nowhere: no such archive" "$ULPACK" gc "$T/nowhere"
expect_error "ulpack import: $T/nosrc: No such file" "$ULPACK" import "$A" "$T/nosrc"
expect_error "ulpack import: $T/junk.safetensors: not a directory" "$ULPACK" import "$A" "$T/junk.safetensors"
expect_usage "ulpack import: --prefix \.\./up: not a valid path" "$ULPACK" import "$A" "$T/s" --prefix ../up
expect_error "ulpack init: $A: .*already" "$ULPACK" init "$A"
mkdir "$T/garbage" && printf 'not sqlite' > "$T/garbage/ulpack.db"
expect_error "ulpack ls: $T/garbage" "$ULPACK" ls "$T/garbage"
expect_usage "ulpack gc: unexpected argument 'extra'" "$ULPACK" gc "$A" extra
expect_usage "ulpack ls: unknown option '--max-chain'" "$ULPACK" ls "$A" --max-chain 3
expect_usage "ulpack export: DEST '': an empty path" "$ULPACK" export "$A" "$f" ""
"$ULPACK" stat "$A" run > /dev/null && ok "stat of a directory that exists" || fail "stat run"
"$ULPACK" verify "$A" "$f" > /dev/null && ok "verify of a file that exists" || fail "verify $f"

# ---- item 20: numeric options are parsed strictly, with a usage error
# (exit status 2) that names the option and the value
expect_usage "--max-chain '-5': out of range" "$ULPACK" import "$A" "$T/s" --max-chain -5
expect_usage "--max-chain '0'" "$ULPACK" import "$A" "$T/s" --max-chain 0
expect_usage "--max-chain '5x': not an integer" "$ULPACK" import "$A" "$T/s" --max-chain 5x
expect_usage "--max-chain '1025': out of range" "$ULPACK" import "$A" "$T/s" --max-chain 1025
expect_usage "--max-chain '99999999999999999999': out of range" "$ULPACK" import "$A" "$T/s" --max-chain 99999999999999999999
expect_usage "--threads 'abc': not an integer" "$ULPACK" import "$A" "$T/s" --threads abc
expect_usage "--threads '-1': out of range" "$ULPACK" import "$A" "$T/s" --threads -1
expect_usage "--threads '1025': out of range" "$ULPACK" import "$A" "$T/s" --threads 1025
expect_usage "--threads '': not an integer" "$ULPACK" cat "$A" "$f" --threads ""
expect_usage "option --threads needs a value" "$ULPACK" cat "$A" "$f" --threads
expect_usage "--cache-size 'lots': not a size" "$ULPACK" cat "$A" "$f" --cache-size lots
expect_usage "--cache-size '-1G': not a size" "$ULPACK" export "$A" "$f" "$T/x1" --cache-size -1G
expect_usage "--threads 'x': not an integer" "$ULPACK" verify "$A" --threads x
expect_usage "--threads '2.5': not an integer" "$ULPACK" bench "$good" "$good" --threads 2.5
expect_usage "--reps '0': out of range" "$ULPACK" bench "$good" "$good" --reps 0
expect_usage "--min-time '-1': out of range" "$ULPACK" bench "$good" "$good" --min-time -1
expect_usage "--min-time 'fast': not a number" "$ULPACK" bench "$good" "$good" --min-time fast
expect_usage "--steps 'abc': not an integer" "$ULPACK" synth "$T/x2" --steps abc
expect_usage "--steps '0': out of range" "$ULPACK" synth "$T/x2" --steps 0
expect_usage "--dim '12': not a multiple of 8" "$ULPACK" synth "$T/x2" --dim 12
expect_usage "--interval '1e3': not an integer" "$ULPACK" synth "$T/x2" --interval 1e3
expect_usage "--seed '-1': out of range" "$ULPACK" synth "$T/x2" --seed -1
[ -e "$T/x2" ] && fail "synth wrote $T/x2 despite a bad option"
"$ULPACK" import "$A" "$T/s" --prefix ok --max-chain 3 --threads 1 --cache-size 64M > /dev/null \
	&& ok "valid --max-chain 3 --threads 1 --cache-size 64M" || fail "valid options refused"
# the limits are the library's (ULP_MAX_CHAIN, ULP_MAX_THREADS), as for ulpackfs -o (fuse_perms.sh)
"$ULPACK" import "$A" "$T/s" --prefix lim --max-chain 1024 > /dev/null \
	&& ok "--max-chain 1024 (the limit) accepted" || fail "--max-chain 1024 refused"

# ---- issue 28 item 14: no source locations ("[index.c:444]") in messages,
# but with ULP_DEBUG=1
expect_error "ulpack ls: $T/garbage" "$ULPACK" ls "$T/garbage"
grep -q '\[[a-z_0-9]*\.c:[0-9]*\]' "$T/err" && fail "a source location in '$(cat "$T/err")'"
ULP_DEBUG=1 "$ULPACK" ls "$T/garbage" 2>&1 | grep -q '\[[a-z_0-9]*\.c:[0-9]*\]' \
	&& ok "ULP_DEBUG=1 adds the source location" || fail "ULP_DEBUG=1: no source location"

# ---- item 11: ls shows setuid, setgid and sticky bits as ls -l does
mkdir -p "$T/modes/tmp" "$T/modes/sgd"
for m in 4755:su 2755:sg 4644:S 1640:T; do
	echo x > "$T/modes/${m#*:}" && chmod "${m%%:*}" "$T/modes/${m#*:}"
done
chmod 1777 "$T/modes/tmp" && chmod 2755 "$T/modes/sgd"
B="$T/b"
"$ULPACK" init "$B" > /dev/null && "$ULPACK" import "$B" "$T/modes" --prefix modes > /dev/null \
	&& "$ULPACK" import "$B" "$T/s" --prefix run > /dev/null || fail "import into $B"
"$ULPACK" ls "$B" modes | awk '{print $1, $NF}' > "$T/modes.ls"
printf '%s\n' "-rwSr--r-- S" "-rw-r----T T" "-rwxr-sr-x sg" "drwxr-sr-x sgd/" "-rwsr-xr-x su" "drwxrwxrwt tmp/" \
	| diff - "$T/modes.ls" > /dev/null && ok "ls: setuid, setgid, sticky bits" \
	|| fail "ls modes: $(cat "$T/modes.ls")"

# ---- item 6: an archive on read-only media reads (it was "not a ulpack
# archive index (unable to open database file)": no -shm possible): without
# a -wal (clean close, or a copy without it), and with a -wal holding a
# commit (here: modes/S made sticky) but no -shm
ro_media() { # ro_media ARCHIVE CMD...: CMD with ARCHIVE bind-mounted read-only (a mount namespace of its own)
	_d=$1
	shift
	unshare -m sh -c 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"' sh "$_d" "$@"
}
if [ "$(id -u)" != 0 ] || ! command -v unshare > /dev/null || ! ro_media "$B" true 2> /dev/null; then
	echo "# no read-only bind mount here (needs root and unshare): item 6 not tested"
else
	ro_media "$B" touch "$B/x" 2> /dev/null && fail "the read-only bind mount is writable"
	for c in "ls $B run" "cat $B $f" "verify $B" "stat $B"; do
		# shellcheck disable=SC2086
		ro_media "$B" "$ULPACK" $c > "$T/out" 2> "$T/err" && ok "read-only media: ulpack $c" \
			|| fail "read-only media: ulpack $c: $(cat "$T/err")"
	done
	cp -a "$B" "$T/bcopy" && rm -f "$T/bcopy"/ulpack.db-*
	ro_media "$T/bcopy" "$ULPACK" verify "$T/bcopy" > /dev/null 2> "$T/err" \
		&& ok "read-only copy without -shm/-wal" || fail "read-only copy without -shm/-wal: $(cat "$T/err")"
	# a writer that stopped without a checkpoint, its -shm not copied
	"$PY" - "$B/ulpack.db" <<'PYEOF' || fail "python writer"
import os, sqlite3, sys
c = sqlite3.connect(sys.argv[1])
c.execute("PRAGMA wal_autocheckpoint=0")
c.execute("UPDATE entries SET mode = mode | 512 WHERE path = 'modes/S'")
c.commit()
os._exit(0)
PYEOF
	rm -f "$B/ulpack.db-shm"
	[ -s "$B/ulpack.db-wal" ] || fail "no -wal left"
	ro_media "$B" "$ULPACK" ls "$B" modes > "$T/out" 2> "$T/err" || fail "read-only media, -wal without -shm: $(cat "$T/err")"
	grep -q -- "^-rwSr--r-T .* S$" "$T/out" && ok "read-only media: the -wal's commit read" \
		|| fail "read-only media, -wal: $(cat "$T/out" "$T/err")"
	ro_media "$B" "$ULPACK" rm "$B" run -r 2> "$T/err" && fail "rm on read-only media succeeded"
	grep -q "Read-only file system" "$T/err" && ok "rm on read-only media: $(cat "$T/err")" \
		|| fail "rm on read-only media: $(cat "$T/err")"
fi

# ---- item 12: another user's private archive is "Permission denied", never
# "not a ulpack archive ... create one with 'ulpack init'"
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
	chmod 711 "$T" # nobody passes through $T, not into $B (0700)
	other() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
else
	chmod 0 "$B"
	other() { "$@"; }
fi
for c in ls verify; do
	other "$ULPACK" "$c" "$B" > /dev/null 2> "$T/err" && fail "ulpack $c of an archive not ours succeeded"
	grep -q "$B/ulpack.db: Permission denied" "$T/err" && ! grep -q "init" "$T/err" \
		&& ok "not ours: $(cat "$T/err")" || fail "ulpack $c of an archive not ours: $(cat "$T/err")"
done
mkdir -p "$T/m12"
other "$ULPACKFS" -o ro "$B" "$T/m12" 2> "$T/err" && { fusermount3 -u "$T/m12"; fail "mounted an archive not ours"; }
grep -q "$B/ulpack.db: Permission denied" "$T/err" && ! grep -q "init" "$T/err" \
	&& ok "ulpackfs -o ro, not ours: $(cat "$T/err")" || fail "ulpackfs -o ro of an archive not ours: $(cat "$T/err")"
chmod 700 "$T" "$B"
expect_error "ulpack ls: $good: not a directory" "$ULPACK" ls "$good"
grep -q init "$T/err" && fail "ls of a file suggests init"

# ---- item 10: an empty PATH (an unset shell variable) or the root never
# removes the archive; --all does
n_before=$("$ULPACK" ls "$A" run | wc -l)
unset NOT_SET
for p in "${NOT_SET:-}" / . ./ //; do
	expect_usage "ulpack rm: .*refusing to remove the archive's root" "$ULPACK" rm "$A" "$p" -r
done
[ "$("$ULPACK" ls "$A" run | wc -l)" = "$n_before" ] && [ "$n_before" -gt 0 ] \
	&& ok "archive intact after rm of the root" || fail "rm of the root removed files"
expect_usage "--all takes no PATH" "$ULPACK" rm "$A" run --all
expect_usage "missing PATH" "$ULPACK" rm "$A"
"$ULPACK" rm "$A" --all > "$T/out" 2>&1 || fail "rm --all: $(cat "$T/out")"
[ -z "$("$ULPACK" ls "$A")" ] && ok "rm --all removes everything" || fail "rm --all left: $("$ULPACK" ls "$A")"
"$ULPACK" verify "$A" > /dev/null || fail "verify after rm --all"

for c in bench synth init import ls cat export stat verify rm gc; do
	"$ULPACK" "$c" --help | grep -q "usage: ulpack $c" && ok "$c --help" || fail "$c --help"
done
"$ULPACK" --version | grep -q "^ulpack " && ok "--version" || fail "--version"
finish
