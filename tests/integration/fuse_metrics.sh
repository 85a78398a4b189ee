#!/bin/sh
# SPDX-License-Identifier: MIT
# fuse_metrics.sh - ulpackfs -o metrics=PATH (issue 40 item 1): Prometheus's
# text exposition format, written atomically every metrics_interval seconds
# for node_exporter's textfile collector, parsed here by a real parser
# (prometheus_client's, in the venv of tools/install-pydeps.sh): every
# family is ulpack_*, has HELP and TYPE, labels archive and host; the
# figures follow what the daemon archives; no temporary file is left.
. "$(dirname "$0")/lib.sh"
need_fuse
py=""
for c in ${ULP_TORCH_PYTHON:-/opt/ulpack-venv/bin/python} ${PYTHON3:-} /usr/bin/python3 python3; do
	command -v "$c" > /dev/null 2>&1 && "$c" -c 'import prometheus_client.parser' 2> /dev/null && { py=$c; break; }
done
[ -n "$py" ] || skip "no python with prometheus_client (sh tools/install-pydeps.sh)"
A="$T/a" M="$T/m" S="$T/src" P="$T/textfile"
mkdir -p "$P" "$M"
"$ULPACK" init "$A" > /dev/null && "$ULPACK" synth "$S" --steps 2 --dim 128 > /dev/null || { fail setup; finish; }
"$ULPACKFS" "$A" "$M" -o metrics=/nonexistent/dir/u.prom 2> "$T/e" && { fail "a metrics path in no directory mounted"; fusermount3 -u "$M"; }
grep -q "metrics=/nonexistent/dir/u.prom" "$T/e" && ok "a bad metrics path: $(cat "$T/e")" || fail "bad metrics path: $(cat "$T/e")"
"$ULPACKFS" "$A" "$M" -o metrics="$P/u.prom",metrics_interval=0 2> "$T/e" && { fail "metrics_interval=0 mounted"; fusermount3 -u "$M"; }
grep -q "bad metrics_interval" "$T/e" && ok "a bad interval: $(cat "$T/e")" || fail "bad interval: $(cat "$T/e")"
mount_fs "$A" "$M" -o metrics="$P/ulpack.prom",metrics_interval=1 || { fail mount; finish; }
cp -r "$S/checkpoint-100" "$S/checkpoint-200" "$M/" && "$ULPACK" sync "$M" > /dev/null || fail "copy and sync"
check() { # check WANT_ARCHIVED: parses the file; 0 once it shows that many archived files
	"$py" - "$P/ulpack.prom" "$A" "$(hostname)" "$1" <<'PYEOF'
import sys
from prometheus_client.parser import text_string_to_metric_families
path, archive, host, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(path).read()
fams = list(text_string_to_metric_families(text))
assert len(fams) >= 20, [f.name for f in fams]
samples = {}
for f in fams:
    assert f.name.startswith("ulpack_"), f.name
    assert f.documentation, "no HELP for " + f.name
    assert f.type in ("gauge", "counter"), (f.name, f.type)
    assert "# TYPE %s" % (f.name + "_total" if f.type == "counter" and f.name + "_total" in text else f.name) in text
    for s in f.samples:
        assert s.labels.get("archive") == archive and s.labels.get("host") == host, s
        samples[s.name] = s.value
got = samples.get("ulpack_archived_files_total")
if got != want:
    sys.exit(3)   # not yet written
assert samples["ulpack_queue_files"] == 0 and samples["ulpack_archive_failures_total"] == 0, samples
assert samples["ulpack_disk_bytes"] > 0 and samples["ulpack_archived_bytes_total"] > 0, samples
assert samples["ulpack_errors_total"] == 0 and samples["ulpack_shared"] == 0, samples
print("%d families, archived_files_total %d, disk_bytes %d" % (len(fams), got, samples["ulpack_disk_bytes"]))
PYEOF
}
r=3
for _ in $(seq 50); do
	[ -e "$P/ulpack.prom" ] && { out=$(check 2 2>&1); r=$?; [ $r = 3 ] || break; }
	sleep 0.2
done
[ $r = 0 ] && ok "parsed by prometheus_client: $out" || fail "metrics ($r): $out: $(cat "$P/ulpack.prom" 2>&1 | head -n 20)"
[ "$(ls -A "$P")" = ulpack.prom ] && ok "written atomically: no temporary left" || fail "textfile dir: $(ls -A "$P")"
[ "$(stat -c %a "$P/ulpack.prom")" = 644 ] && ok "mode 644 (the collector reads it)" || fail "mode $(stat -c %a "$P/ulpack.prom")"
# it is rewritten: a file copied after the first write shows up
cp -r "$S/checkpoint-100" "$M/again" && "$ULPACK" sync "$M" > /dev/null
r=3
for _ in $(seq 50); do
	out=$(check 3 2>&1); r=$?; [ $r = 3 ] || break
	sleep 0.2
done
[ $r = 0 ] && ok "rewritten every second: $out" || fail "not rewritten ($r): $out"
umount_fs "$M"
[ "$(ls -A "$P")" = ulpack.prom ] && ok "after unmount: the file, no temporary" || fail "after unmount: $(ls -A "$P")"
finish
