#!/bin/sh
# SPDX-License-Identifier: MIT
# package.sh - issue 40 item 2: the Debian packages built from the tree
# (`dpkg-buildpackage -us -uc -b` on a copy of it), their contents, then
# installed on this machine with dpkg -i and the README's walkthrough run
# from /usr/bin (mount -t fuse.ulpackfs through /usr/sbin/mount.fuse.ulpackfs,
# rsync in, read back, ulpack steps, latest, getfattr, unmount), the Python
# package imported from dist-packages, the unit verified where it lies, then
# purged. Slow (a full optimized build, ~3 min on 2 cores): not part of make
# check; CI runs it alone, as root: sh tests/integration/package.sh
# (tools/install-deps.sh --test --package installs what it needs).
here=$(cd "$(dirname "$0")" && pwd)
: "${top_srcdir:=$(cd "$here/../.." && pwd)}"
. "$here/lib.sh"
[ "$(id -u)" = 0 ] || skip "dpkg -i needs root"
command -v dpkg-buildpackage > /dev/null && command -v dh > /dev/null || skip "no dpkg-buildpackage/debhelper (tools/install-deps.sh --package)"
for p in ulpackfs libulpack0 libulpack-dev python3-ulpack; do
	dpkg -s "$p" > /dev/null 2>&1 && skip "package $p already installed here"
done
V=$(sed -n '1s/^ulpackfs (\([^)]*\)).*/\1/p' "$top_srcdir/debian/changelog")
S="$T/src/ulpackfs-$V"
mkdir -p "$S"
# a copy of the tree without its builds: what git tracks (and new files not
# ignored), or everything but build folders where there is no git
if git -C "$top_srcdir" rev-parse --git-dir > /dev/null 2>&1; then
	(cd "$top_srcdir" && git ls-files -co --exclude-standard -z | xargs -0 tar cf - 2> /dev/null) | tar xf - -C "$S"
else
	(cd "$top_srcdir" && tar cf - --exclude=./build --exclude='./debian/build' --exclude=autom4te.cache .) | tar xf - -C "$S"
fi
[ -x "$S/debian/rules" ] || { fail "copy of the tree: no debian/rules"; finish; }
start=$(date +%s)
(cd "$S" && DEB_BUILD_OPTIONS="parallel=2 nocheck" dpkg-buildpackage -us -uc -b) > "$T/build.log" 2>&1 \
	|| { fail "dpkg-buildpackage: $(grep -i 'error' "$T/build.log" | head -5; tail -15 "$T/build.log")"; finish; }
ok "dpkg-buildpackage -us -uc -b: $(($(date +%s) - start)) s"
arch=$(dpkg --print-architecture)
for p in ulpackfs libulpack0 libulpack-dev python3-ulpack; do
	[ -f "$T/src/${p}_${V}_$arch.deb" ] || fail "no ${p}_${V}_$arch.deb"
done
has() { # PACKAGE PATH: the .deb ships PATH
	dpkg -c "$T/src/${1}_${V}_$arch.deb" > "$T/contents" 2>&1
	grep -q " \.$2\( \|$\)" "$T/contents" && ok "$1 ships $2" || fail "$1 lacks $2"
}
has ulpackfs /usr/bin/ulpackfs
has ulpackfs /usr/bin/ulpack
has ulpackfs /usr/sbin/mount.fuse.ulpackfs
has ulpackfs /usr/lib/systemd/system/ulpackfs@.service
has ulpackfs /usr/share/bash-completion/completions/ulpack
has ulpackfs /usr/share/zsh/site-functions/_ulpack
has ulpackfs /usr/share/man/man1/ulpackfs.1.gz
has ulpackfs /usr/share/man/man5/ulpack-format.5.gz
has libulpack0 /usr/lib/libulpack.so.0
has libulpack-dev /usr/include/ulpack.h
has libulpack-dev /usr/lib/pkgconfig/libulpack.pc
has python3-ulpack /usr/lib/python3/dist-packages/ulpack/__init__.py
purge() { dpkg -P ulpackfs python3-ulpack libulpack-dev libulpack0 > "$T/purge.log" 2>&1; }
# the four packages (not the -dbgsym ones beside them)
dpkg -i "$T/src/ulpackfs_${V}_$arch.deb" "$T/src/libulpack0_${V}_$arch.deb" "$T/src/libulpack-dev_${V}_$arch.deb" \
	"$T/src/python3-ulpack_${V}_$arch.deb" > "$T/install.log" 2>&1 \
	&& ok "dpkg -i: the four packages install" || { fail "dpkg -i: $(tail -8 "$T/install.log")"; purge; finish; }
# the README's walkthrough, from what the packages installed
A="$T/ckpt-archive" M="$T/mnt"
mkdir -p "$M"
PATH=/usr/sbin:/usr/bin:/sbin:/bin
[ "$(command -v ulpack)" = /usr/bin/ulpack ] && [ "$(command -v ulpackfs)" = /usr/bin/ulpackfs ] \
	&& ok "ulpack and ulpackfs in /usr/bin" || fail "PATH finds $(command -v ulpack) $(command -v ulpackfs)"
/usr/bin/ulpack synth "$T/runs/llama-1b" --steps 3 --dim 64 > /dev/null || fail "ulpack synth"
/usr/bin/ulpack init "$A" > /dev/null && ok "ulpack init" || fail "ulpack init"
if mount -t fuse.ulpackfs "$A" "$M" -o cache_size=64M; then
	wait_mounted "$M" && ok "mount -t fuse.ulpackfs (mount.fuse.ulpackfs)" || fail "not mounted"
	rsync -a "$T/runs/llama-1b/" "$M/llama-1b/" && ok "rsync into the mount" || fail "rsync"
	n=$(python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); print(len(json.loads(f.read(struct.unpack('<Q',f.read(8))[0]))))" \
		"$M/llama-1b/checkpoint-300/model.safetensors")
	[ -n "$n" ] && [ "$n" -gt 1 ] && ok "a loader reads the header: $n entries" || fail "header read"
	/usr/bin/ulpack sync "$M" > /dev/null 2>&1 || fail "ulpack sync"
	/usr/bin/ulpack steps "$A" llama-1b > "$T/steps" 2>&1 && grep -q 300 "$T/steps" && ok "ulpack steps lists the run" \
		|| fail "ulpack steps: $(cat "$T/steps")"
	[ "$(readlink "$M/llama-1b/latest")" = checkpoint-300 ] && ok "latest -> checkpoint-300" || fail "latest: $(readlink "$M/llama-1b/latest")"
	if command -v getfattr > /dev/null; then
		getfattr -d "$M/llama-1b/checkpoint-300/model.safetensors" 2> /dev/null | grep -q user.ulpack.sha256 \
			&& ok "getfattr -d shows user.ulpack.*" || fail "getfattr"
	fi
	cmp -s "$T/runs/llama-1b/checkpoint-200/model.safetensors" "$M/llama-1b/checkpoint-200/model.safetensors" \
		&& ok "reads back byte for byte" || fail "read back"
	fusermount3 -u "$M" && ok "fusermount3 -u" || { fail "unmount"; umount -l "$M"; }
	for i in $(seq 100); do pgrep -f "ulpackfs $A" > /dev/null || break; sleep 0.1; done
else
	fail "mount -t fuse.ulpackfs"
fi
# the Python package from dist-packages, finding /usr/lib/libulpack.so.0
(cd / && env -u PYTHONPATH -u ULPACK_LIB python3 -c "
import sys, ulpack
assert ulpack.__file__.startswith('/usr/lib/python3/dist-packages/'), ulpack.__file__
ar = ulpack.open_archive(sys.argv[1])
assert ar.runs() == ['llama-1b'], ar.runs()
print(len(ar.steps('llama-1b')))" "$A") > "$T/py.out" 2>&1 && [ "$(cat "$T/py.out")" = 3 ] \
	&& ok "python3 -c 'import ulpack' from dist-packages reads the archive" || fail "python: $(tail -3 "$T/py.out")"
if command -v systemd-analyze > /dev/null; then
	U="$T/units" && mkdir -p "$U" && cp /usr/lib/systemd/system/ulpackfs@.service "$U/"
	ln -s ulpackfs@.service "$U/ulpackfs@data-ckpt.service"
	SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$U/ulpackfs@data-ckpt.service" > "$T/verify" 2>&1 && [ ! -s "$T/verify" ] \
		&& ok "the installed unit verifies" || fail "systemd-analyze verify: $(head -3 "$T/verify")"
fi
[ -f /usr/share/bash-completion/completions/ulpack ] && bash -c '. /usr/share/bash-completion/completions/ulpack; complete -p ulpack' > /dev/null 2>&1 \
	&& ok "bash completion installed" || fail "bash completion"
purge && ok "dpkg -P removes them" || fail "dpkg -P: $(tail -3 "$T/purge.log")"
[ ! -e /usr/bin/ulpackfs ] && [ ! -e /usr/sbin/mount.fuse.ulpackfs ] && [ ! -e /usr/lib/libulpack.so.0 ] \
	&& ok "nothing left in /usr" || fail "left after purge"
finish
