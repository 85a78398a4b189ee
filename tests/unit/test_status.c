/* SPDX-License-Identifier: MIT */
/*
 * test_status.c - what a daemon is doing (archive/status.c, issue 40 item 1):
 * the log logs each error once and counts every one, names the host; the
 * session notes one line per archived step (not per file) and counts steps,
 * errors and the file being archived; ulp_status_get of a session, of an
 * archive at rest and of a shared archive's writer (lease holder, epoch,
 * publication); the JSON round trip, the text, the Prometheus text format
 * and the atomic file write.
 */
#include "tap.h"
#include "ulpack.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

typedef struct lines {
	char text[16384];
	int n, errors;
} lines;

static void sink(void *arg, int is_error, const char *line)
{
	lines *l = arg;
	size_t at = strlen(l->text);
	snprintf(l->text + at, sizeof(l->text) - at, "%s%s\n", is_error ? "E " : "N ", line);
	l->n++;
	l->errors += is_error;
}

static void test_log(void)
{
	lines got = {"", 0, 0};
	ulp_log *l = NULL;
	REQUIRE(ulp_log_new(sink, &got, NULL, &l) == 0, "log");
	int logged = 0;
	for (int i = 0; i < 5; i++) /* the kernel retries a damaged read: one line */
		logged += ulp_log_error(l, "read run/x", "read run/x: blob 0123456789abcdef: checksum mismatch");
	CHECK(logged == 1 && got.n == 1, "five errors of one key: %d logged, %d lines", logged, got.n);
	CHECK(ulp_log_error(l, NULL, "another") == 1 && ulp_log_error(l, NULL, "another") == 0, "key NULL: the message");
	ulp_log_note(l, "archived run/checkpoint-1: 1 file");
	ulp_log_note(l, "archived run/checkpoint-1: 1 file");
	CHECK(got.n == 4 && got.errors == 2, "notes are never deduplicated: %d lines, %d errors", got.n, got.errors);
	uint64_t all = 0, distinct = 0;
	ulp_log_errors(l, &all, &distinct);
	CHECK(all == 7 && distinct == 2, "counted %llu errors, %llu distinct", (unsigned long long)all,
	      (unsigned long long)distinct);
	CHECK(strstr(got.text, "E read run/x: blob") && !strstr(got.text, "["), "no host prefix: %s", got.text);
	/* a flood of distinct errors: each logged once, memory bounded */
	got.n = 0;
	char k[64];
	for (int i = 0; i < 10000; i++) {
		snprintf(k, sizeof(k), "e%d", i);
		ulp_log_error(l, k, "x");
	}
	CHECK(got.n == 10000, "10000 distinct errors: %d lines", got.n);
	ulp_log_free(l);

	lines h = {"", 0, 0};
	REQUIRE(ulp_log_new(sink, &h, "node7", &l) == 0, "log with a host");
	ulp_log_error(l, NULL, "lease lost");
	ulp_log_note(l, "archived a/checkpoint-2: 3 files");
	CHECK(!strcmp(h.text, "E [node7] lease lost\nN [node7] archived a/checkpoint-2: 3 files\n"), "host named: %s",
	      h.text);
	ulp_log_free(l);
	ulp_log_free(NULL);
	CHECK(ulp_log_new(NULL, NULL, NULL, &l) == -ULP_E_INVAL, "no sink: INVAL");
}

static ulp_archive *fresh(const char *name, char *dir, size_t cap)
{
	snprintf(dir, cap, "%s/%s", root, name);
	char err[512];
	ulp_archive *a = NULL;
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive_opts o = {.cache_size = 64 << 20, .threads = 2};
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	return a;
}

static const ulp_meta M644 = {0644, 0, 0, {0, 0}};

static int put_file(ulp_session *s, const char *path, size_t n, unsigned seed)
{
	uint8_t *b = malloc(n);
	REQUIRE(b, "malloc");
	for (size_t i = 0; i < n; i++)
		b[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 13);
	ulp_sfile *h;
	int rc = ulp_session_open_file(s, path, O_WRONLY | O_TRUNC, &M644, &h);
	if (rc == 0) {
		rc = ulp_session_write(h, b, n, 0) == (int64_t)n ? 0 : -ULP_E_IO;
		int r2 = ulp_session_flush(h);
		ulp_session_release(h);
		rc = rc < 0 ? rc : r2;
	}
	free(b);
	return rc;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static void note(void *arg, const char *msg)
{
	sink(arg, 0, msg);
}

static void err_line(void *arg, const char *msg)
{
	sink(arg, 1, msg);
}

/* the session: one note per step, the counters, ulp_status_get of it */
static void test_session_steps(void)
{
	char dir[512];
	ulp_archive *a = fresh("steps", dir, sizeof(dir));
	lines got = {"", 0, 0};
	ulp_session_opts so = {0, err_line, &got, note};
	ulp_session *s = NULL;
	REQUIRE(ulp_session_open(a, &so, &s) == 0, "session");
	REQUIRE(put_file(s, "run/checkpoint-100/a.bin", 50000, 1) == 0 && put_file(s, "run/checkpoint-100/b.bin", 30000, 2) == 0 &&
	            put_file(s, "run/checkpoint-100/sub/c.bin", 1000, 3) == 0 &&
	            put_file(s, "run/checkpoint-200/a.bin", 50000, 4) == 0,
	        "writes");
	CHECK(ulp_session_sync(s, NULL, NULL) == 0, "sync");
	ulp_status st;
	REQUIRE(ulp_status_get(a, s, NULL, &st) == 0, "status: %s", ulp_archive_errmsg(a));
	CHECK(st.live && st.archived == 4 && st.archived_bytes == 131000 && st.queued == 0 && st.failed == 0 &&
	          st.errors == 0 && !st.current[0],
	      "status of a session: live %d archived %llu (%llu bytes) queued %llu", st.live,
	      (unsigned long long)st.archived, (unsigned long long)st.archived_bytes, (unsigned long long)st.queued);
	CHECK(st.disk_bytes > 0 && st.live_bytes > 0 && !st.shared, "space: disk %llu live %llu",
	      (unsigned long long)st.disk_bytes, (unsigned long long)st.live_bytes);
	/* step files: the step of run2/model_step_300.pt is its directory's */
	REQUIRE(put_file(s, "run2/model_step_300.pt", 2000, 5) == 0 && put_file(s, "run2/model_step_400.pt", 2000, 6) == 0,
	        "step files");
	ulp_session_close(s);
	CHECK(count(got.text, "N archived ") == 3 && got.errors == 0, "one note per step: %s", got.text);
	CHECK(strstr(got.text, "N archived run/checkpoint-100: 3 files, 0.1 MB") != NULL, "the step of 3 files: %s",
	      got.text);
	CHECK(strstr(got.text, "N archived run/checkpoint-200: 1 file, ") != NULL, "the next step: %s", got.text);
	CHECK(strstr(got.text, "N archived run2: 2 files") != NULL, "step files: their directory: %s", got.text);
	ulp_archive_close(a);

	/* at rest: the index's figures */
	char err[512];
	ulp_archive_opts ro = {.read_only = 1};
	REQUIRE(ulp_archive_open(dir, &ro, &a, err, sizeof(err)) == 0, "open ro: %s", err);
	REQUIRE(ulp_status_get(a, NULL, NULL, &st) == 0, "status at rest");
	CHECK(!st.live && st.read_only && st.archived == 0 && st.disk_bytes > 0 && st.packs > 0 && st.now_ms > 0,
	      "at rest: live %d read_only %d packs %llu", st.live, st.read_only, (unsigned long long)st.packs);
	ulp_archive_close(a);
}

/* a shared archive's writer: the lease holder is this host, its epoch, the
 * last publication */
static void test_shared_status(void)
{
	char dir[512];
	ulp_archive *a = fresh("shared", dir, sizeof(dir));
	REQUIRE(ulp_archive_share(a) == 0, "share: %s", ulp_archive_errmsg(a));
	CHECK(ulp_archive_publish(a) == 0, "publish");
	ulp_status st;
	REQUIRE(ulp_status_get(a, NULL, NULL, &st) == 0, "status: %s", ulp_archive_errmsg(a));
	char host[256] = "";
	gethostname(host, sizeof(host) - 1);
	CHECK(st.published_ms > 0 && st.published_ms <= st.now_ms + 1, "writer: published %lld ms ago",
	      (long long)(st.now_ms - st.published_ms));
	CHECK(st.shared && st.writer && !st.fenced && st.epoch >= 1 && st.gen >= 1 && !strcmp(st.holder, host),
	      "writer: shared %d writer %d epoch %llu gen %llu holder '%s'", st.shared, st.writer,
	      (unsigned long long)st.epoch, (unsigned long long)st.gen, st.holder);
	char m[16384];
	int n = ulp_status_metrics(&st, dir, host, m, sizeof(m));
	CHECK(n > 0 && strstr(m, "ulpack_lease_holder_info{") && strstr(m, "ulpack_lease_epoch{"), "metrics of a writer");
	ulp_archive_close(a);
	/* a reader on another open: the holder from the lease file */
	char err[512];
	ulp_archive_opts ro = {.read_only = 1};
	REQUIRE(ulp_archive_open(dir, &ro, &a, err, sizeof(err)) == 0, "open ro: %s", err);
	REQUIRE(ulp_status_get(a, NULL, NULL, &st) == 0, "status of a reader: %s", ulp_archive_errmsg(a));
	CHECK(st.shared && !st.writer && st.epoch >= 1 && !strcmp(st.holder, host), "reader: epoch %llu holder '%s'",
	      (unsigned long long)st.epoch, st.holder);
	CHECK(st.published_ms > 0 && st.published_ms <= st.now_ms && st.now_ms - st.published_ms < 600000,
	      "reader: the generation's publication time (%lld ms ago)", (long long)(st.now_ms - st.published_ms));
	ulp_archive_close(a);
}

static void test_formats(void)
{
	ulp_status st, back;
	memset(&st, 0, sizeof(st));
	st.live = 1;
	st.queued = 3;
	st.queued_bytes = 18446744073709551615ull; /* exact, not through a double */
	st.archived = 12;
	st.steps = 4;
	st.bytes_per_s = 123456789;
	st.uptime_ms = 61234;
	st.current_ms = 1500;
	st.now_ms = 1796518636435;
	st.published_ms = 1796518630000;
	st.shared = st.writer = 1;
	st.epoch = 7;
	st.errors = 5;
	st.errors_distinct = 1;
	snprintf(st.current, sizeof(st.current), "run/\"odd\\name\n/model.safetensors");
	snprintf(st.holder, sizeof(st.holder), "node-1");
	char js[8192];
	int n = ulp_status_json(&st, js, sizeof(js));
	REQUIRE(n > 0 && (size_t)n == strlen(js), "json");
	CHECK(ulp_status_parse(js, &back) == 0 && !memcmp(&st, &back, sizeof(st)), "JSON round trip: %s", js);
	CHECK(ulp_status_json(&st, js, 40) == -ULP_E_INVAL, "too small: INVAL");
	CHECK(ulp_status_parse("{\"queued\": 2, \"future\": [1], \"x\": 1}", &back) == -ULP_E_INVAL, "not flat: INVAL");
	CHECK(ulp_status_parse("{\"queued\": 2, \"future\": \"y\", \"other\": 1.5}", &back) == 0 && back.queued == 2,
	      "unknown keys skipped");
	CHECK(ulp_status_parse("nope", &back) == -ULP_E_INVAL, "garbage: INVAL");

	char m[16384];
	n = ulp_status_metrics(&st, "/data/a\"b", "h1", m, sizeof(m));
	REQUIRE(n > 0, "metrics");
	CHECK(strstr(m, "# HELP ulpack_queue_files ") && strstr(m, "# TYPE ulpack_queue_files gauge\n") &&
	          strstr(m, "ulpack_queue_files{archive=\"/data/a\\\"b\",host=\"h1\"} 3\n"),
	      "a gauge, its labels escaped: %.400s", m);
	CHECK(strstr(m, "ulpack_queue_bytes{archive=\"/data/a\\\"b\",host=\"h1\"} 18446744073709551615\n") != NULL,
	      "bytes exact");
	CHECK(strstr(m, "# TYPE ulpack_errors_total counter\n") && strstr(m, "ulpack_uptime_seconds{") &&
	          strstr(m, "} 61.234\n") && strstr(m, "ulpack_publication_age_seconds{") && strstr(m, "} 6.435\n"),
	      "counters, seconds, the publication's age");
	for (const char *p = m; *p;) { /* every sample line is prefixed ulpack_ */
		const char *e = strchr(p, '\n');
		REQUIRE(e, "lines end with a newline");
		CHECK(p[0] == '#' || !strncmp(p, "ulpack_", 7), "line '%.*s'", (int)(e - p), p);
		p = e + 1;
	}
	CHECK(ulp_status_metrics(&st, "a", "h", m, 100) == -ULP_E_INVAL, "metrics too small: INVAL");
	char t[4096];
	CHECK(ulp_status_text(&st, t, sizeof(t)) > 0 && strstr(t, "queue:       3 files") &&
	          strstr(t, "holder node-1, epoch 7 (this daemon)") && strstr(t, "errors:      5 since the mount"),
	      "text: %s", t);

	char path[600];
	snprintf(path, sizeof(path), "%s/m.prom", root);
	CHECK(ulp_status_write_file(path, m, strlen(m)) == 0, "write");
	struct stat sb;
	CHECK(stat(path, &sb) == 0 && (size_t)sb.st_size == strlen(m) && (sb.st_mode & 0777) == 0644, "whole, 0644");
	char tmp[700];
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid());
	CHECK(access(tmp, F_OK) != 0, "no temporary left");
	snprintf(path, sizeof(path), "%s/no/such/dir/m.prom", root);
	CHECK(ulp_status_write_file(path, "x", 1) == -ULP_E_IO, "missing directory: IO");
}

int main(void)
{
	snprintf(root, sizeof(root), "/tmp/ulp-status-XXXXXX");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_log();
	test_formats();
	test_session_steps();
	test_shared_status();
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
