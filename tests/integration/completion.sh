#!/bin/sh
# SPDX-License-Identifier: MIT
# completion.sh - issue 40 item 2: the bash completion of ulpack (dist/
# ulpack.bash) completes commands, a command's options, runs (ulpack steps
# --json) and paths inside an archive (ulpack ls), called as bash calls it:
# COMP_WORDS/COMP_CWORD set, _ulpack run, COMPREPLY read. The zsh one
# parses (zsh -n) where zsh is installed.
. "$(dirname "$0")/lib.sh"
command -v bash > /dev/null || skip "no bash"
A="$T/arch"
$ULPACK init "$A" > /dev/null
$ULPACK synth "$T/run" --steps 2 --dim 16 > /dev/null
$ULPACK import "$A" "$T/run" --prefix gpt > /dev/null
$ULPACK import "$A" "$T/run" --prefix bert > /dev/null
# comp WORD...: complete the last word; prints COMPREPLY sorted, one a line
cat > "$T/comp.bash" << EOF2
. "$top_srcdir/dist/ulpack.bash"
ULPACK="$ULPACK"
COMP_WORDS=("\$@")
COMP_CWORD=\$((\${#COMP_WORDS[@]} - 1))
COMP_LINE="\$*"
_ulpack
printf '%s\n' "\${COMPREPLY[@]}" | sort
EOF2
comp() { bash "$T/comp.bash" ulpack "$@" 2> "$T/comp.err"; }
expect() { # NAME EXPECTED WORDS...
	name=$1 want=$2; shift 2
	got=$(comp "$@" | tr '\n' ' ' | sed 's/ $//')
	[ "$got" = "$want" ] && [ ! -s "$T/comp.err" ] && ok "$name: $got" || fail "$name: got '$got', want '$want' $(head -3 "$T/comp.err")"
}
expect "commands" "share stat status steps sync synth" s
expect "rm options" "--all --help" rm "$A" --
expect "gc options" "--grace" gc --gr
expect "runs" "bert gpt" steps "$A" ""
expect "runs with a prefix" "gpt" dynamics "$A" g
expect "top-level paths" "bert/ gpt/" ls "$A" ""
expect "steps of a run" "gpt/checkpoint-100/ gpt/checkpoint-200/" cat "$A" gpt/
expect "files of a step" "gpt/checkpoint-200/model.safetensors" export "$A" gpt/checkpoint-200/m
expect "options skip their values" "bert/ gpt/" verify --threads 2 "$A" ""
mkdir -p "$T/dirs/arch1" "$T/dirs/arch2"
expect "archive directories" "$T/dirs/arch1 $T/dirs/arch2" stat "$T/dirs/arc"
expect "nothing for a missing archive" "" ls "$T/nowhere" ""
if command -v zsh > /dev/null; then
	zsh -n "$top_srcdir/dist/_ulpack" && ok "zsh completion parses" || fail "zsh -n _ulpack"
fi
bash -n "$top_srcdir/dist/ulpack.bash" && ok "bash completion parses" || fail "bash -n"
finish
