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
for c in bench synth; do
	"$ULPACK" "$c" --help | grep -q "usage: ulpack $c" && ok "$c --help" || fail "$c --help"
done
"$ULPACK" --version | grep -q "^ulpack " && ok "--version" || fail "--version"
finish
