#!/bin/sh
# SPDX-License-Identifier: MIT
# systemd_units.sh - issue 40 item 2: `make install` (DESTDIR) puts
# ulpackfs@.service, the example mount unit, the bash and zsh completions and
# mount.fuse.ulpackfs where systemd, the shells and mount(8) look; the units
# pass `systemd-analyze verify` (an instance for an escaped archive path,
# and the mount unit), which needs no systemd running as PID 1.
. "$(dirname "$0")/lib.sh"
D="$T/dest" P=/opt/ulpack-units
make -C "$top_builddir" -s install DESTDIR="$D" prefix="$P" > "$T/install.log" 2>&1 \
	|| { fail "make install: $(tail -5 "$T/install.log")"; finish; }
for f in "$P/lib/systemd/system/ulpackfs@.service" "$P/share/doc/ulpackfs/mnt-ckpt.mount" \
	"$P/share/bash-completion/completions/ulpack" "$P/share/zsh/site-functions/_ulpack" /sbin/mount.fuse.ulpackfs; do
	[ -f "$D$f" ] && ok "installed $f" || fail "not installed: $f"
done
grep -q "ExecStart=$P/bin/ulpackfs " "$D$P/lib/systemd/system/ulpackfs@.service" && ok "the unit runs $P/bin/ulpackfs" \
	|| fail "ExecStart: $(grep ExecStart "$D$P/lib/systemd/system/ulpackfs@.service")"
grep -q "$P/bin/ulpackfs#" "$D/sbin/mount.fuse.ulpackfs" && [ -x "$D/sbin/mount.fuse.ulpackfs" ] \
	&& ok "mount.fuse.ulpackfs names $P/bin/ulpackfs" || fail "mount helper"
if command -v systemd-analyze > /dev/null; then
	# verify wants the binaries the units run where they say: a unit for the
	# build tree's ulpackfs, as an instance for /data/ckpt
	U="$T/units" && mkdir -p "$U"
	inst=$(systemd-escape --path /data/ckpt)
	[ "$inst" = data-ckpt ] && ok "instance name data-ckpt" || fail "systemd-escape: $inst"
	sed "s|$P/bin/ulpackfs|$ULPACKFS|" "$D$P/lib/systemd/system/ulpackfs@.service" > "$U/ulpackfs@.service"
	ln -s ulpackfs@.service "$U/ulpackfs@$inst.service"
	SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$U/ulpackfs@$inst.service" > "$T/verify.out" 2>&1 \
		&& [ ! -s "$T/verify.out" ] && ok "systemd-analyze verify ulpackfs@$inst.service: clean" \
		|| fail "verify ulpackfs@.service: $(head -5 "$T/verify.out")"
	cp "$D$P/share/doc/ulpackfs/mnt-ckpt.mount" "$U/"
	SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "$U/mnt-ckpt.mount" > "$T/verify2.out" 2>&1 \
		&& [ ! -s "$T/verify2.out" ] && ok "systemd-analyze verify mnt-ckpt.mount: clean" \
		|| fail "verify mnt-ckpt.mount: $(head -5 "$T/verify2.out")"
else
	skip "no systemd-analyze (tools/install-deps.sh --test installs systemd)"
fi
make -C "$top_builddir" -s uninstall DESTDIR="$D" prefix="$P" > /dev/null 2>&1 || fail "make uninstall"
left=$(find "$D" -type f | head -5)
[ -z "$left" ] && ok "make uninstall removes them all" || fail "left after uninstall: $left"
finish
