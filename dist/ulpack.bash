# SPDX-License-Identifier: MIT
# bash completion for ulpack(1): commands, each command's options, archive
# directories, paths inside an archive (from `ulpack ls ARCHIVE DIR`) and
# runs (from `ulpack steps ARCHIVE --json`). Installed as
# PREFIX/share/bash-completion/completions/ulpack; ULPACK names the program
# it asks (default: ulpack from PATH).

_ulpack_commands="init share import ls steps dynamics diff cat export stat verify rm gc sync status forget bench synth"

_ulpack_options() {
	case "$1" in
	init) echo "--shared" ;;
	import) echo "--prefix --json --progress --threads --cache-size --max-chain" ;;
	ls | steps | stat | diff) echo "--json" ;;
	dynamics) echo "--json --svg --tensors --norms" ;;
	cat | export) echo "--threads --cache-size" ;;
	verify) echo "--json --threads --cache-size" ;;
	rm) echo "-r --all" ;;
	status) echo "--json --watch --interval" ;;
	gc) echo "--dry-run --grace --json --threads --cache-size" ;;
	forget) echo "--keep-last --keep-every --keep --dry-run --json --threads --cache-size" ;;
	bench) echo "--json --threads --quick --reps --min-time --cpu" ;;
	synth) echo "--steps --dtype --dim --layers --vocab --interval --seed --spike --big-tensor-mb" ;;
	esac
	echo "--help"
}

# the runs of archive $1, one a line
_ulpack_runs() {
	"${ULPACK:-ulpack}" steps "$1" --json 2> /dev/null |
		sed -n 's/.*"run": *"\([^"]*\)".*/\1/p' | uniq
}

# the entries of directory $2 of archive $1 ("dir/" for directories), with
# the directory prefixed: what a PATH argument completes to
_ulpack_paths() {
	local dir="$2"
	[ -n "$dir" ] && dir="${dir%/}/"
	"${ULPACK:-ulpack}" ls "$1" "$dir" 2> /dev/null |
		sed -e 's/^[^ ]*  *[^ ]*  *[^ ]*  *[^ ]*  *[^ ]*  *[^ ]*  *//' -e "s|^|$dir|"
}

_ulpack() {
	local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
	local cmd="" archive="" i npos=0
	COMPREPLY=()
	# the command, the archive (first positional after it) and how many
	# positionals precede the word being completed
	for ((i = 1; i < COMP_CWORD; i++)); do
		local w="${COMP_WORDS[i]}"
		if [ -z "$cmd" ]; then
			cmd="$w"
			continue
		fi
		case "$w" in
		--prefix | --threads | --cache-size | --max-chain | --svg | --tensors | --grace | \
			--keep-last | --keep-every | --keep | --reps | --min-time | --steps | --dtype | \
			--dim | --layers | --vocab | --interval | --seed | --spike | --big-tensor-mb)
			((i++)) ;;
		-*) ;;
		*)
			[ "$npos" = 0 ] && archive="$w"
			((npos++)) ;;
		esac
	done
	if [ -z "$cmd" ]; then
		COMPREPLY=($(compgen -W "$_ulpack_commands --help --version" -- "$cur"))
		return 0
	fi
	case "$prev" in
	--svg) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
	--dtype) COMPREPLY=($(compgen -W "bf16 f16 f32 mixed" -- "$cur")); return 0 ;;
	--prefix | --threads | --cache-size | --max-chain | --tensors | --grace | --keep-last | \
		--keep-every | --keep | --reps | --min-time | --steps | --dim | --layers | --vocab | --interval | \
		--seed | --spike | --big-tensor-mb)
		return 0 ;;
	esac
	if [[ "$cur" == -* ]]; then
		COMPREPLY=($(compgen -W "$(_ulpack_options "$cmd")" -- "$cur"))
		return 0
	fi
	local IFS=$'\n'
	case "$cmd:$npos" in
	# the archive (a directory), the mount point of sync, a source tree,
	# an output directory, a file to benchmark
	*:0)
		case "$cmd" in
		bench) COMPREPLY=($(compgen -f -- "$cur")) ;;
		*) COMPREPLY=($(compgen -d -- "$cur")) ;;
		esac
		compopt -o filenames 2> /dev/null ;;
	import:1 | bench:1) COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2> /dev/null ;;
	export:2) COMPREPLY=($(compgen -d -- "$cur")); compopt -o filenames 2> /dev/null ;;
	steps:1 | dynamics:1 | forget:1)
		COMPREPLY=($(compgen -W "$(_ulpack_runs "$archive")" -- "$cur")) ;;
	ls:1 | cat:1 | export:1 | stat:1 | verify:1 | rm:1 | diff:1 | diff:2)
		local dir=""
		[[ "$cur" == */* ]] && dir="${cur%/*}"
		COMPREPLY=($(compgen -W "$(_ulpack_paths "$archive" "$dir")" -- "$cur"))
		# a directory: no space after it, so the next Tab goes inside
		[ "${#COMPREPLY[@]}" = 1 ] && [[ "${COMPREPLY[0]}" == */ ]] && compopt -o nospace 2> /dev/null ;;
	esac
	return 0
}
complete -F _ulpack ulpack
