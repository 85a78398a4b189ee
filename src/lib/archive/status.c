/* SPDX-License-Identifier: MIT */
/*
 * status.c - what a daemon (or an archive at rest) is doing: the figures of
 * `ulpack status`, of a mount root's user.ulpack.status and of ulpackfs -o
 * metrics (ulp_status), in JSON, for people and in Prometheus's text
 * exposition format; and the daemon's log (ulp_log), which logs each error
 * once and counts them all. The FUSE layer and the CLI only carry these.
 *
 * Invariants:
 *  1. One table (fields[]) names every figure: JSON, its parser and the
 *     metrics follow it, so the three never disagree on a name or a unit.
 *  2. An error key seen before is counted, never logged again while the
 *     table remembers it (LOG_SLOTS keys; when it is 3/4 full it starts
 *     afresh, so a flood of distinct errors costs bounded memory and is
 *     still logged, once per key per round). mu guards the table and the
 *     counts; the sink is called under mu, so lines never interleave.
 *  3. ulp_status_write_file replaces the file whole (a temporary name in
 *     the same directory, then rename): a scraper reads the old or the new
 *     metrics, never a part.
 */
#include "arch_int.h"
#include "store/shared.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the log -------------------------------------------------------------- */

#define LOG_SLOTS 4096

struct ulp_log {
	void (*sink)(void *arg, int is_error, const char *line); /* set at new, read-only after */
	void *arg;             /* set at new, read-only after */
	char host[256];        /* set at new, read-only after: the prefix, "" none */
	int64_t t0_ms;         /* set at new, read-only after: CLOCK_MONOTONIC ms */
	pthread_mutex_t mu;    /* invariant 2 */
	uint64_t slot[LOG_SLOTS]; /* guarded by mu: hashes of keys seen (0: empty) */
	unsigned used;         /* guarded by mu */
	uint64_t all, distinct; /* guarded by mu */
};

int ulp_log_new(void (*sink)(void *arg, int is_error, const char *line), void *arg, const char *host,
                ulp_log **out)
{
	if (!sink)
		return -ULP_E_INVAL;
	ulp_log *l = calloc(1, sizeof(*l));
	if (!l)
		return -ULP_E_NOMEM;
	l->sink = sink;
	l->arg = arg;
	snprintf(l->host, sizeof(l->host), "%s", host ? host : "");
	l->t0_ms = ulp_mono_ms();
	pthread_mutex_init(&l->mu, NULL);
	*out = l;
	return 0;
}

void ulp_log_free(ulp_log *l)
{
	if (!l)
		return;
	pthread_mutex_destroy(&l->mu);
	free(l);
}

/* with mu */
static void emit(ulp_log *l, int is_error, const char *msg)
{
	if (!l->host[0]) {
		l->sink(l->arg, is_error, msg);
		return;
	}
	char line[4800];
	snprintf(line, sizeof(line), "[%s] %s", l->host, msg);
	l->sink(l->arg, is_error, line);
}

int ulp_log_error(ulp_log *l, const char *key, const char *msg)
{
	const char *k = key ? key : msg;
	uint64_t h = ulp_xxh64(k, strlen(k));
	h = h ? h : 1;
	pthread_mutex_lock(&l->mu);
	l->all++;
	size_t i = (size_t)(h % LOG_SLOTS);
	while (l->slot[i] && l->slot[i] != h)
		i = (i + 1) % LOG_SLOTS;
	int fresh = l->slot[i] == 0;
	if (fresh) {
		if (l->used >= LOG_SLOTS / 4 * 3) { /* invariant 2: afresh */
			memset(l->slot, 0, sizeof(l->slot));
			l->used = 0;
			i = (size_t)(h % LOG_SLOTS);
		}
		l->slot[i] = h;
		l->used++;
		l->distinct++;
		emit(l, 1, msg);
	}
	pthread_mutex_unlock(&l->mu);
	return fresh;
}

void ulp_log_note(ulp_log *l, const char *msg)
{
	pthread_mutex_lock(&l->mu);
	emit(l, 0, msg);
	pthread_mutex_unlock(&l->mu);
}

void ulp_log_errors(ulp_log *l, uint64_t *all, uint64_t *distinct)
{
	pthread_mutex_lock(&l->mu);
	*all = l->all;
	*distinct = l->distinct;
	pthread_mutex_unlock(&l->mu);
}

/* ---- the figures ---------------------------------------------------------- */

enum { F_U64, F_I64, F_INT, F_STR };

typedef struct field {
	const char *name;      /* the JSON key */
	int type;              /* F_* */
	size_t off, len;       /* in ulp_status; len: F_STR's capacity */
	const char *metric;    /* ulpack_<metric>, NULL: JSON only */
	int counter;           /* 1: a counter, 0: a gauge */
	double scale;          /* 1, or 1e-3: the figure is in ms, the metric in seconds */
	const char *help;
} field;

#define U(n, m, c, sc, h) {#n, F_U64, offsetof(ulp_status, n), 0, m, c, sc, h}
#define I(n, m, c, sc, h) {#n, F_INT, offsetof(ulp_status, n), 0, m, c, sc, h}
static const field fields[] = { /* invariant 1 */
	I(live, NULL, 0, 1, NULL),
	I(read_only, "read_only", 0, 1, "1 if the mount (or open) is read-only"),
	U(uptime_ms, "uptime_seconds", 0, 1e-3, "Seconds since the mount"),
	{"now_ms", F_I64, offsetof(ulp_status, now_ms), 0, NULL, 0, 1, NULL},
	U(queued, "queue_files", 0, 1, "Files closed and waiting to be archived (or being archived)"),
	U(queued_bytes, "queue_bytes", 0, 1, "Bytes of the files in the queue"),
	U(staged, "staged_files", 0, 1, "Files that differ from the archive (open, queued or failed)"),
	U(staged_bytes, "staged_bytes", 0, 1, "Bytes of the staged files"),
	U(archived, "archived_files_total", 1, 1, "Files archived since the mount"),
	U(archived_bytes, "archived_bytes_total", 1, 1, "Bytes archived since the mount"),
	U(failed, "archive_failures_total", 1, 1, "Archivings that failed since the mount"),
	U(steps, "steps_archived_total", 1, 1, "Steps archived since the mount"),
	U(bytes_per_s, "archiving_rate_bytes_per_second", 0, 1, "Bytes archived per second of archiving"),
	{"current", F_STR, offsetof(ulp_status, current), sizeof(((ulp_status *)0)->current), NULL, 0, 1, NULL},
	U(current_ms, "current_file_seconds", 0, 1e-3, "Seconds the file being archived has taken so far"),
	U(errors, "errors_total", 1, 1, "Errors since the mount, repeats included"),
	U(errors_distinct, "errors_logged_total", 1, 1, "Errors logged since the mount (each once)"),
	U(disk_bytes, "disk_bytes", 0, 1, "Disk bytes of the archive directory, as du counts them"),
	U(live_bytes, "live_bytes", 0, 1, "Bytes of blobs that a file or a chain needs"),
	U(reclaimable_bytes, "reclaimable_bytes", 0, 1, "Pack bytes nothing needs (what gc gives back)"),
	U(pending_recodes, "pending_recodes", 0, 1, "Files queued for re-basing and tensors coded against removed steps"),
	U(packs, "packs", 0, 1, "Pack files the index names"),
	U(cache_bytes, "cache_bytes", 0, 1, "Bytes the decode cache holds"),
	U(cache_hits, "cache_hits_total", 1, 1, "Decode cache hits"),
	U(cache_misses, "cache_misses_total", 1, 1, "Decode cache misses"),
	I(shared, "shared", 0, 1, "1 if many hosts share the archive"),
	I(writer, "lease_writer", 0, 1, "1 if this daemon holds the writer's lease"),
	I(fenced, "lease_fenced", 0, 1, "1 if this daemon lost its lease"),
	U(gen, "generation", 0, 1, "Generation followed (reader) or last published (writer)"),
	U(epoch, "lease_epoch", 0, 1, "Epoch of the writer's lease"),
	{"holder", F_STR, offsetof(ulp_status, holder), sizeof(((ulp_status *)0)->holder), NULL, 0, 1, NULL},
	{"published_ms", F_I64, offsetof(ulp_status, published_ms), 0, "last_publication_timestamp_seconds", 0, 1e-3,
	 "When the last generation was published (Unix time)"},
};
#undef U
#undef I
#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

int ulp_status_get(ulp_archive *a, ulp_session *s, ulp_log *l, ulp_status *st)
{
	memset(st, 0, sizeof(*st));
	st->now_ms = ulp_wall_ms();
	st->read_only = a->read_only;
	if (s) {
		ulp_session_stats c;
		ulp_session_counters(s, &c);
		st->live = 1;
		st->queued = c.queued;
		st->queued_bytes = c.queued_bytes;
		st->staged = c.staged;
		st->staged_bytes = c.staged_bytes;
		st->archived = c.archived;
		st->archived_bytes = c.archived_bytes;
		st->failed = c.failed;
		st->steps = c.steps;
		st->bytes_per_s = c.bytes_per_s;
		snprintf(st->current, sizeof(st->current), "%s", c.current);
		st->current_ms = c.current_ms;
		st->errors = st->errors_distinct = c.errors;
	}
	if (l) { /* the daemon's log counts every error, the session's too */
		st->live = 1;
		ulp_log_errors(l, &st->errors, &st->errors_distinct);
		st->uptime_ms = (uint64_t)(ulp_mono_ms() - l->t0_ms);
	}
	ulp_space sp;
	int rc = ulp_archive_space(a, &sp);
	if (rc < 0)
		return rc;
	st->disk_bytes = sp.in_bucket ? sp.bucket_bytes : sp.disk_bytes;
	st->live_bytes = sp.live_bytes;
	st->reclaimable_bytes = sp.reclaimable_bytes;
	st->pending_recodes = sp.pending_recodes;
	st->packs = sp.packs;
	ulp_counters cc;
	ulp_archive_counters(a, &cc);
	st->cache_bytes = cc.cache_bytes;
	st->cache_hits = cc.cache_hits;
	st->cache_misses = cc.cache_misses;
	ulp_generation g;
	ulp_archive_generation(a, &g);
	st->shared = g.shared;
	st->writer = g.writer;
	st->fenced = g.fenced;
	st->gen = g.gen;
	st->epoch = g.epoch;
	if (g.shared) {
		uint64_t ep = 0;
		if (ulp_lease_holder(a, st->holder, sizeof(st->holder), &ep) == 0 && !st->epoch)
			st->epoch = ep;
		st->published_ms = ulp_gen_published_ms(a);
	}
	return 0;
}

/* ---- JSON ----------------------------------------------------------------- */

typedef struct out {
	char *p;
	size_t cap, len;
} out;

static void put(out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(out *o, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(o->len < o->cap ? o->p + o->len : NULL, o->len < o->cap ? o->cap - o->len : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		o->len += (size_t)n;
}

static void put_json_str(out *o, const char *s)
{
	put(o, "\"");
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '"' || *c == '\\')
			put(o, "\\%c", *c);
		else if (*c < 0x20)
			put(o, "\\u%04x", *c);
		else
			put(o, "%c", *c);
	}
	put(o, "\"");
}

static int done(out *o)
{
	if (o->len >= o->cap)
		return -ULP_E_INVAL;
	return (int)o->len;
}

int ulp_status_json(const ulp_status *st, char *dst, size_t dst_cap)
{
	out o = {dst, dst_cap, 0};
	const char *base = (const char *)st;
	put(&o, "{");
	for (size_t i = 0; i < NFIELDS; i++) {
		const field *f = &fields[i];
		put(&o, "%s\"%s\": ", i ? ", " : "", f->name);
		if (f->type == F_U64)
			put(&o, "%llu", (unsigned long long)*(const uint64_t *)(base + f->off));
		else if (f->type == F_I64)
			put(&o, "%lld", (long long)*(const int64_t *)(base + f->off));
		else if (f->type == F_INT)
			put(&o, "%d", *(const int *)(base + f->off));
		else
			put_json_str(&o, base + f->off);
	}
	put(&o, "}");
	return done(&o);
}

static const char *skip_ws(const char *p)
{
	while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
		p++;
	return p;
}

/* A JSON string at p (after its quote) into dst (cut to dst_cap; NULL: only
 * skipped); returns the byte after the closing quote, or NULL. */
static const char *json_str(const char *p, char *dst, size_t dst_cap)
{
	size_t n = 0;
	for (; *p && *p != '"'; p++) {
		char c = *p;
		if (c == '\\') {
			p++;
			if (*p == 'u') {
				unsigned v = 0;
				if (sscanf(p + 1, "%4x", &v) != 1)
					return NULL;
				c = v < 0x80 ? (char)v : '?';
				p += 4;
			} else if (*p == 'n') {
				c = '\n';
			} else if (*p == 't') {
				c = '\t';
			} else if (*p) {
				c = *p;
			} else {
				return NULL;
			}
		}
		if (dst && n + 1 < dst_cap)
			dst[n++] = c;
	}
	if (*p != '"')
		return NULL;
	if (dst && dst_cap)
		dst[n] = 0;
	return p + 1;
}

int ulp_status_parse(const char *json, ulp_status *st)
{
	ulp_status r;
	memset(&r, 0, sizeof(r));
	char *base = (char *)&r;
	const char *p = skip_ws(json);
	if (*p++ != '{')
		return -ULP_E_INVAL;
	for (p = skip_ws(p); *p != '}';) {
		char key[64];
		if (*p != '"' || !(p = json_str(p + 1, key, sizeof(key))))
			return -ULP_E_INVAL;
		p = skip_ws(p);
		if (*p++ != ':')
			return -ULP_E_INVAL;
		p = skip_ws(p);
		const field *f = NULL;
		for (size_t i = 0; i < NFIELDS && !f; i++)
			if (!strcmp(fields[i].name, key))
				f = &fields[i];
		if (*p == '"') {
			p = json_str(p + 1, f && f->type == F_STR ? base + f->off : NULL, f ? f->len : 0);
			if (!p)
				return -ULP_E_INVAL;
		} else {
			char *end;
			if (f && f->type == F_U64)
				*(uint64_t *)(base + f->off) = strtoull(p, &end, 10);
			else if (f && f->type == F_I64)
				*(int64_t *)(base + f->off) = strtoll(p, &end, 10);
			else if (f && f->type == F_INT)
				*(int *)(base + f->off) = (int)strtol(p, &end, 10);
			else
				(void)strtod(p, &end);
			if (end == p)
				return -ULP_E_INVAL;
			p = end;
		}
		p = skip_ws(p);
		if (*p == ',')
			p = skip_ws(p + 1);
		else if (*p != '}')
			return -ULP_E_INVAL;
	}
	*st = r;
	return 0;
}

/* ---- for people ----------------------------------------------------------- */

void ulp_format_bytes(uint64_t b, char *dst, size_t dst_cap)
{
	static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)b;
	int i = 0;
	while (v >= 1024 && i < 5) {
		v /= 1024;
		i++;
	}
	snprintf(dst, dst_cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void span(uint64_t ms, char *dst, size_t cap)
{
	uint64_t s = ms / 1000;
	if (s < 60)
		snprintf(dst, cap, "%.1f s", (double)ms / 1000);
	else if (s < 3600)
		snprintf(dst, cap, "%llum%02llus", (unsigned long long)(s / 60), (unsigned long long)(s % 60));
	else
		snprintf(dst, cap, "%lluh%02llum", (unsigned long long)(s / 3600), (unsigned long long)(s / 60 % 60));
}

int ulp_status_text(const ulp_status *st, char *dst, size_t dst_cap)
{
	out o = {dst, dst_cap, 0};
	char b1[32], b2[32], b3[32], b4[32];
	if (st->live) {
		span(st->uptime_ms, b1, sizeof(b1));
		put(&o, "daemon:      mounted %s, up %s\n", st->read_only ? "read-only" : "read-write", b1);
		ulp_format_bytes(st->queued_bytes, b1, sizeof(b1));
		ulp_format_bytes(st->staged_bytes, b2, sizeof(b2));
		ulp_format_bytes(st->bytes_per_s, b3, sizeof(b3));
		put(&o, "queue:       %llu files, %s (staged %llu files, %s); archiving at %s/s\n",
		    (unsigned long long)st->queued, b1, (unsigned long long)st->staged, b2, b3);
		if (st->current[0]) {
			span(st->current_ms, b1, sizeof(b1));
			put(&o, "now:         archiving %s (%s so far)\n", st->current, b1);
		}
		ulp_format_bytes(st->archived_bytes, b1, sizeof(b1));
		put(&o, "archived:    %llu files in %llu steps, %s since the mount; %llu failed\n",
		    (unsigned long long)st->archived, (unsigned long long)st->steps, b1, (unsigned long long)st->failed);
	} else {
		put(&o, "daemon:      none (not mounted: the index's figures)\n");
	}
	ulp_format_bytes(st->disk_bytes, b1, sizeof(b1));
	ulp_format_bytes(st->live_bytes, b2, sizeof(b2));
	ulp_format_bytes(st->reclaimable_bytes, b3, sizeof(b3));
	put(&o, "space:       disk %s, live %s, reclaimable %s; pending re-codes %llu\n", b1, b2, b3,
	    (unsigned long long)st->pending_recodes);
	ulp_format_bytes(st->cache_bytes, b4, sizeof(b4));
	put(&o, "cache:       %s held (hits %llu, misses %llu)\n", b4, (unsigned long long)st->cache_hits,
	    (unsigned long long)st->cache_misses);
	if (st->shared) {
		put(&o, "lease:       holder %s, epoch %llu%s%s; generation %llu", st->holder[0] ? st->holder : "(none)",
		    (unsigned long long)st->epoch, st->writer ? " (this daemon)" : "", st->fenced ? ", fenced" : "",
		    (unsigned long long)st->gen);
		if (st->published_ms > 0) {
			span((uint64_t)(st->now_ms > st->published_ms ? st->now_ms - st->published_ms : 0), b1, sizeof(b1));
			put(&o, ", last published %s ago", b1);
		}
		put(&o, "\n");
	} else {
		put(&o, "lease:       none (an archive of one host)\n");
	}
	if (st->live)
		put(&o, "errors:      %llu since the mount (%llu logged)\n", (unsigned long long)st->errors,
		    (unsigned long long)st->errors_distinct);
	return done(&o);
}

/* ---- Prometheus's text exposition format ---------------------------------- */

static void put_label(out *o, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			put(o, "\\%c", *s);
		else if (*s == '\n')
			put(o, "\\n");
		else
			put(o, "%c", *s);
	}
}

int ulp_status_metrics(const ulp_status *st, const char *archive, const char *host, char *dst, size_t dst_cap)
{
	out o = {dst, dst_cap, 0};
	const char *base = (const char *)st;
	char labels[1200];
	out lo = {labels, sizeof(labels), 0};
	put(&lo, "archive=\"");
	put_label(&lo, archive ? archive : "");
	put(&lo, "\",host=\"");
	put_label(&lo, host ? host : "");
	put(&lo, "\"");
	if (done(&lo) < 0)
		return -ULP_E_INVAL;
	for (size_t i = 0; i < NFIELDS; i++) {
		const field *f = &fields[i];
		if (!f->metric)
			continue;
		int64_t v = f->type == F_U64   ? (int64_t)*(const uint64_t *)(base + f->off)
		            : f->type == F_I64 ? *(const int64_t *)(base + f->off)
		                               : (int64_t)*(const int *)(base + f->off);
		if (!strcmp(f->name, "published_ms") && v <= 0)
			continue; /* none known */
		put(&o, "# HELP ulpack_%s %s\n# TYPE ulpack_%s %s\nulpack_%s{%s} ", f->metric, f->help, f->metric,
		    f->counter ? "counter" : "gauge", f->metric, labels);
		if (f->type == F_U64 && f->scale == 1) /* exact: counts and bytes */
			put(&o, "%llu\n", (unsigned long long)*(const uint64_t *)(base + f->off));
		else if (f->scale == 1)
			put(&o, "%lld\n", (long long)v);
		else /* ms as seconds */
			put(&o, "%lld.%03lld\n", (long long)(v / 1000), (long long)(v % 1000));
	}
	if (st->published_ms > 0)
		put(&o, "# HELP ulpack_publication_age_seconds Seconds since the last publication\n"
		        "# TYPE ulpack_publication_age_seconds gauge\nulpack_publication_age_seconds{%s} %.3f\n",
		    labels, (double)(st->now_ms - st->published_ms) / 1000);
	if (st->shared) {
		put(&o, "# HELP ulpack_lease_holder_info The host that holds the writer's lease\n"
		        "# TYPE ulpack_lease_holder_info gauge\nulpack_lease_holder_info{%s,holder=\"", labels);
		put_label(&o, st->holder);
		put(&o, "\"} 1\n");
	}
	return done(&o);
}

int ulp_status_write_file(const char *path, const char *data, size_t len)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid()) >= (int)sizeof(tmp))
		return -ULP_E_INVAL;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -ULP_E_IO; /* (errno says why) */
	int e = ulp_pwrite_full(fd, data, len, 0);
	if (close(fd) < 0 && !e)
		e = errno;
	if (!e && rename(tmp, path) < 0) /* invariant 3 */
		e = errno;
	if (e) {
		unlink(tmp);
		errno = e; /* (the caller names the cause) */
		return -ULP_E_IO;
	}
	return 0;
}
