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
