/* SPDX-License-Identifier: MIT */
/*
 * test_remote.c - an archive whose home is an S3 bucket prefix
 * (store/remote.c, backend_s3.c, gen.c and lease.c over a bucket), through
 * the public API against the in-process emulator (s3mock.c): init creates
 * the pointer and the lease object once; a writer's packs and generations
 * reach the bucket; a reader on an empty cache reads every file back and
 * follows what a writer publishes later; one writer at a time (BUSY while
 * the lease holds, taken at once when given back, the live index rebuilt
 * from the bucket); a writer whose lease another took over is fenced by
 * the pointer's compare-and-swap and by its own clock; a damaged pack gives
 * an error, never wrong bytes; 503s are retried, a wrong key id is refused
 * naming the status; the reader's pack cache stays near its bound. Against
 * a real radosgw: tests/cluster/s3_archive.sh.
 */
#include "tap.h"
#include "ulpack.h"
#include "arch_int.h"
#include "store/shared.h"
#include "store/remote.h"
#include "s3mock.h"
#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define URL "s3://ckpt/a"

static char root[256];

#define diag(...) (fprintf(stderr, "# " __VA_ARGS__), fputc('\n', stderr))
static s3mock *mock;

/* What the archive should hold: path and bytes. */
typedef struct want {
	char path[128];
	uint8_t *data;
	size_t len;
} want;
static want files[16];
static int n_files;

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(((i * 2654435761u + seed * 40503u) >> 11) & 0xff);
}

/* Archives data at apath (through a file under root, as ulpack import does). */
static int put_bytes(ulp_archive *a, const char *apath, const uint8_t *data, size_t len)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/src.tmp", root);
	FILE *f = fopen(p, "wb");
	REQUIRE(f && fwrite(data, 1, len, f) == len && fclose(f) == 0, "write %s", p);
	int fd = open(p, O_RDONLY);
	REQUIRE(fd >= 0, "open %s", p);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	int rc = ulp_archive_put(a, apath, fd, &m, NULL);
	close(fd);
	unlink(p);
	return rc;
}

static void remember(const char *apath, const uint8_t *data, size_t len)
{
	REQUIRE(n_files < (int)(sizeof(files) / sizeof(files[0])), "too many files");
	want *w = &files[n_files++];
	snprintf(w->path, sizeof(w->path), "%s", apath);
	w->data = malloc(len);
	REQUIRE(w->data, "malloc");
	memcpy(w->data, data, len);
	w->len = len;
}

/* An opaque file of n bytes, archived (and remembered where keep). */
static int put_opaque_as(ulp_archive *a, const char *apath, size_t n, unsigned seed, int keep)
{
	uint8_t *d = malloc(n);
	REQUIRE(d, "malloc");
	fill(d, n, seed);
	int rc = put_bytes(a, apath, d, n);
	if (rc == 0 && keep)
		remember(apath, d, n);
	free(d);
	return rc;
}

static int put_opaque(ulp_archive *a, const char *apath, size_t n, unsigned seed)
{
	return put_opaque_as(a, apath, n, seed, 1);
}

/* A safetensors checkpoint of step `step` (two F32 tensors that drift a
 * little each step, so that step 2 is coded as a delta of step 1). */
static int put_checkpoint(ulp_archive *a, int step)
{
	enum { N = 12288 };
	static float w1[N], w2[N / 2];
	for (int i = 0; i < N; i++)
		w1[i] = (float)((i % 97) - 48) * 0.01f + (float)step * 1e-5f * (float)(i % 7);
	for (int i = 0; i < N / 2; i++)
		w2[i] = 1.0f + (float)(i % 31) * 0.001f - (float)step * 1e-6f * (float)(i % 5);
	uint64_t s1[1] = {N}, s2[2] = {N / 64, 32};
	ulp_st_wtensor t[2] = {{"layer.0.weight", ULP_DT_F32, 1, s1, w1}, {"layer.1.weight", ULP_DT_F32, 2, s2, w2}};
	char p[600], apath[128];
	snprintf(p, sizeof(p), "%s/ckpt.safetensors", root);
	REQUIRE(ulp_st_write(p, t, 2, NULL) == 0, "ulp_st_write %s", p);
	FILE *f = fopen(p, "rb");
	REQUIRE(f, "open %s", p);
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *d = malloc((size_t)len);
	REQUIRE(d && fread(d, 1, (size_t)len, f) == (size_t)len, "read %s", p);
	fclose(f);
	unlink(p);
	snprintf(apath, sizeof(apath), "run/checkpoint-%d/model.safetensors", step);
	int rc = put_bytes(a, apath, d, (size_t)len);
	if (rc == 0)
		remember(apath, d, (size_t)len);
	free(d);
	return rc;
}

/* The whole file at path into a malloc'ed buffer: its size, or a negative
 * code (the archive's message says why). */
static int64_t read_all(ulp_archive *a, const char *path, uint8_t **out)
{
	ulp_file *f = NULL;
	*out = NULL;
	int rc = ulp_file_open(a, path, &f);
	if (rc < 0)
		return rc;
	uint64_t size = ulp_file_get_stat(f)->size;
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf) {
		ulp_file_close(f);
		return -ULP_E_NOMEM;
	}
	uint64_t off = 0;
	while (off < size) {
		int64_t n = ulp_file_pread(f, buf + off, (size_t)(size - off), off);
		if (n <= 0) {
			ulp_file_close(f);
			free(buf);
			return n < 0 ? n : -ULP_E_IO;
		}
		off += (uint64_t)n;
	}
	ulp_file_close(f);
	*out = buf;
	return (int64_t)size;
}

/* Every remembered file reads back byte-identical: the number that do. */
static int read_back(ulp_archive *a, const char *who)
{
	int ok = 0;
	for (int i = 0; i < n_files; i++) {
		uint8_t *got;
		int64_t n = read_all(a, files[i].path, &got);
		if (n == (int64_t)files[i].len && !memcmp(got, files[i].data, files[i].len))
			ok++;
		else
			diag("%s: %s: %lld bytes (want %zu): %s", who, files[i].path, (long long)n, files[i].len,
			     n < 0 ? ulp_archive_errmsg(a) : "bytes differ");
		free(got);
	}
	return ok;
}

static int exists(ulp_archive *a, const char *p)
{
	ulp_stat st;
	return ulp_archive_stat(a, p, &st) == 0;
}

static ulp_archive *open_as(const char *cache, int ro, unsigned lease_ms, uint64_t pack_cache, char *err, int *rc)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/%s", root, cache);
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 2, .read_only = ro, .poll_ms = 50,
	                      .lease_ms = lease_ms, .cache_dir = dir, .pack_cache = pack_cache};
	ulp_archive *a = NULL;
	*rc = ulp_archive_open(URL, &o, &a, err, 512);
	return *rc == 0 ? a : NULL;
}

static ulp_generation gen_of(ulp_archive *a)
{
	ulp_generation g = {0};
	ulp_archive_generation(a, &g);
	return g;
}

/* The local home of a handle: CACHE/s3/ckpt-HASH/ROLE, and a subdirectory. */
static void home(const char *cache, const char *role, const char *sub, char *out, size_t cap)
{
	char c[512], h[600], msg[256];
	ulp_err e = {msg, sizeof(msg)};
	snprintf(c, sizeof(c), "%s/%s", root, cache);
	REQUIRE(ulp_remote_local_dir(URL, c, !strcmp(role, "writer"), h, sizeof(h), &e) == 0, "local dir: %s", msg);
	int n = snprintf(out, cap, "%s%s%s", h, sub ? "/" : "", sub ? sub : "");
	REQUIRE(n > 0 && (size_t)n < cap, "home path too long");
}

/* Calls cb for each file of dir whose name ends with suffix (and is not a
 * temporary); returns their number. */
static int each_file(const char *dir, const char *suffix,
                     void (*cb)(void *arg, const char *name, const struct stat *sb), void *arg)
{
	DIR *d = opendir(dir);
	int n = 0;
	size_t sl = strlen(suffix);
	for (struct dirent *e; d && (e = readdir(d));) {
		size_t l = strlen(e->d_name);
		struct stat sb;
		if (l > sl && !strcmp(e->d_name + l - sl, suffix) && strncmp(e->d_name, "tmp-", 4) &&
		    fstatat(dirfd(d), e->d_name, &sb, 0) == 0) {
			n++;
			if (cb)
				cb(arg, e->d_name, &sb);
		}
	}
	if (d)
		closedir(d);
	return n;
}

/* ---- what the bucket holds ------------------------------------------------ */

static int in_bucket(const char *key)
{
	char p[700];
	size_t n;
	snprintf(p, sizeof(p), "ckpt/a/%s", key);
	void *o = s3mock_get_object(mock, p, &n);
	free(o);
	return o != NULL;
}

typedef struct tally {
	const char *sub; /* "packs" or "index" */
	int missing, seen;
	uint64_t bytes, largest;
} tally;

static void in_bucket_cb(void *arg, const char *name, const struct stat *sb)
{
	tally *t = arg;
	char key[400];
	if (!strcmp(t->sub, "index") && sb->st_size == 0)
		return; /* a placeholder for a generation this home did not fetch */
	snprintf(key, sizeof(key), "%s/%s", t->sub, name);
	t->seen++;
	if (!in_bucket(key)) {
		t->missing++;
		diag("not in the bucket: %s", key);
	}
}

static void size_cb(void *arg, const char *name, const struct stat *sb)
{
	tally *t = arg;
	(void)name;
	uint64_t b = (uint64_t)sb->st_blocks * 512;
	t->bytes += b;
	t->seen++;
	if (b > t->largest)
		t->largest = b;
}

/* The bucket's CURRENT: its epoch (0: none or unreadable). */
static uint64_t current_epoch(uint64_t *gen)
{
	size_t n;
	char *c = s3mock_get_object(mock, "ckpt/a/index/CURRENT", &n);
	unsigned v = 0;
	unsigned long long g = 0, e = 0;
	if (!c || sscanf(c, "ulpack-current %u %llu %llu", &v, &g, &e) != 3)
		e = 0;
	free(c);
	if (gen)
		*gen = g;
	return e;
}

/* ---- the tests ------------------------------------------------------------ */

/* 1: init makes the pointer and the lease object, once. */
static void test_init(void)
{
	char err[512] = "";
	int rc = ulp_archive_init(URL, err, sizeof(err));
	REQUIRE(rc == 0, "init %s: %d %s", URL, rc, err);
	size_t n = 0;
	char *cur = s3mock_get_object(mock, "ckpt/a/index/CURRENT", &n);
	CHECK(cur && !strncmp(cur, "ulpack-current ", 15), "init made index/CURRENT: %s", cur ? cur : "(none)");
	free(cur);
	char *lease = s3mock_get_object(mock, "ckpt/a/lease", &n);
	CHECK(lease && !strncmp(lease, "ulpack-lease 1 ", 15), "and the lease object: %s", lease ? lease : "(none)");
	free(lease);
	rc = ulp_archive_init(URL, err, sizeof(err));
	CHECK(rc == -ULP_E_EXIST && strstr(err, URL), "a second init is refused: %d %s", rc, err);
	ulp_archive *r = NULL;
	ulp_archive_opts o = {.read_only = 1, .cache_dir = root};
	rc = ulp_archive_open("s3://ckpt/none", &o, &r, err, sizeof(err));
	CHECK(rc == -ULP_E_NOENT && strstr(err, "s3://ckpt/none") && !r, "no archive at another prefix: %d %s", rc,
	      err);
}

/* Issue 34 item 15: the URL's prefix has no empty part, no '.' or '..',
 * no control characters, each refused for its reason, the URL escaped in
 * the message; one slash may end it. */
static void test_url(void)
{
	static const struct {
		const char *url, *why;
	} bad[] = {
		{"s3://ckpt//dbl", "empty"},      {"s3://ckpt//", "empty"},        {"s3://ckpt/a//b", "empty"},
		{"s3://ckpt/a//", "empty"},       {"s3://ckpt/./a", "'.'"},        {"s3://ckpt/a/..", "'..'"},
		{"s3://ckpt/a\nb", "control"},    {"s3://ckpt/a\x1b[2Jb", "control"}, {"s3://ckpt/a\tb/", "control"},
		{"s3://ckpt/a\x7f", "control"},   {"s3://ck\npt/a", "control"},    {"s3://ab/a", "3-63"},
	};
	char cache[300];
	snprintf(cache, sizeof(cache), "%s/url", root); /* a home of its own: "URL/" names URL's archive */
	ulp_archive_opts o = {.read_only = 1, .cache_dir = cache};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char err[512] = "";
		ulp_archive *r = NULL;
		int rc = ulp_archive_open(bad[i].url, &o, &r, err, sizeof(err));
		int clean = 1;
		for (const char *c = err; *c; c++)
			clean &= (unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f;
		CHECK(rc == -ULP_E_INVAL && !r && strstr(err, bad[i].why) && clean, "URL %zu refused: %d %s", i, rc, err);
		ulp_archive_close(r);
	}
	char err[512] = "";
	ulp_archive *r = NULL;
	int rc = ulp_archive_open("s3://ckpt/a\nb", &o, &r, err, sizeof(err));
	CHECK(rc == -ULP_E_INVAL && strstr(err, "s3://ckpt/a\\nb") && !strstr(err, "empty"),
	      "a newline: its own reason, escaped: %s", err);
	rc = ulp_archive_open(URL "/", &o, &r, err, sizeof(err));
	CHECK(rc == 0 && r, "one slash may end it: %d %s", rc, err);
	ulp_archive_close(r);
}

/* 2: a writer's packs and generations reach the bucket. */
static void test_write(void)
{
	char err[512], dir[700];
	int rc;
	ulp_archive *w = open_as("w", 0, 0, 0, err, &rc);
	REQUIRE(w, "writer: %d %s", rc, err);
	ulp_generation g = gen_of(w);
	CHECK(g.shared && g.writer && !g.fenced && g.epoch >= 2, "a writer of the bucket: epoch %" PRIu64, g.epoch);
	REQUIRE(put_checkpoint(w, 1) == 0, "put step 1: %s", ulp_archive_errmsg(w));
	REQUIRE(put_checkpoint(w, 2) == 0, "put step 2: %s", ulp_archive_errmsg(w));
	REQUIRE(put_opaque(w, "notes/a.bin", 90000, 1) == 0, "put a: %s", ulp_archive_errmsg(w));
	REQUIRE(put_opaque(w, "notes/b.bin", 70000, 2) == 0, "put b: %s", ulp_archive_errmsg(w));
	REQUIRE(put_opaque(w, "notes/empty", 0, 3) == 0, "put empty: %s", ulp_archive_errmsg(w));
	rc = ulp_archive_publish(w);
	CHECK(rc == 0, "publish: %d %s", rc, ulp_archive_errmsg(w));
	uint64_t published = gen_of(w).gen, cg = 0;
	CHECK(current_epoch(&cg) == g.epoch && cg == published, "the bucket's CURRENT names generation %" PRIu64
	      " of epoch %" PRIu64 " (%" PRIu64 ")", published, g.epoch, cg);
	ulp_archive_close(w);

	tally t = {"packs", 0, 0, 0, 0};
	home("w", "writer", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", in_bucket_cb, &t);
	CHECK(t.seen >= 2 && t.missing == 0, "every pack of the writer is in the bucket (%d, %d missing)", t.seen,
	      t.missing);
	tally x = {"index", 0, 0, 0, 0};
	home("w", "writer", "index", dir, sizeof(dir));
	each_file(dir, ".db", in_bucket_cb, &x);
	each_file(dir, ".patch", in_bucket_cb, &x);
	CHECK(x.seen >= 1 && x.missing == 0, "and every generation it published (%d, %d missing)", x.seen, x.missing);
	char key[64];
	snprintf(key, sizeof(key), "index/gen-%020" PRIu64 ".db", published);
	int whole = in_bucket(key);
	snprintf(key, sizeof(key), "index/gen-%020" PRIu64 ".patch", published);
	CHECK(whole || in_bucket(key), "the generation CURRENT names is there");
}

/* 3: a reader on an empty cache reads every file back. */
static void test_read(void)
{
	char err[512], dir[700];
	int rc;
	ulp_archive *r = open_as("r", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	ulp_generation g = gen_of(r);
	CHECK(g.shared && !g.writer, "a reader of the bucket, generation %" PRIu64, g.gen);
	CHECK(read_back(r, "reader") == n_files, "every file reads back byte-identical (%d)", n_files);
	tally t = {"packs", 0, 0, 0, 0};
	home("r", "reader", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", in_bucket_cb, &t);
	CHECK(t.seen >= 2 && t.missing == 0, "its pack cache holds the packs it read (%d)", t.seen);
	ulp_archive_close(r);
	/* again from the cache alone: no GET of a pack */
	unsigned long gets = s3mock_count(mock, "GET");
	r = open_as("r", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader again: %d %s", rc, err);
	CHECK(read_back(r, "cached reader") == n_files, "every file again from the cache");
	CHECK(s3mock_count(mock, "GET") - gets <= 1, "with no pack fetched again (%lu GETs: CURRENT only)",
	      s3mock_count(mock, "GET") - gets);
	ulp_archive_close(r);
}

/* Polls until path shows on r (a few seconds at most). */
static int wait_for(ulp_archive *r, const char *path)
{
	for (int i = 0; i < 250; i++) {
		if (exists(r, path))
			return 1;
		usleep(20000);
	}
	return 0;
}

/* 4: an open reader follows a later writer's generation. */
static void test_follow(void)
{
	char err[512];
	int rc;
	ulp_archive *r = open_as("r", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	uint64_t before = gen_of(r).gen;
	ulp_archive *w = open_as("w", 0, 0, 0, err, &rc);
	REQUIRE(w, "writer: %d %s", rc, err);
	REQUIRE(put_opaque(w, "notes/c.bin", 50000, 4) == 0, "put c: %s", ulp_archive_errmsg(w));
	ulp_archive_close(w); /* publishes what it archived */
	CHECK(wait_for(r, "notes/c.bin"), "the reader sees the new file after its poll");
	CHECK(gen_of(r).gen > before, "and follows generation %" PRIu64 " (was %" PRIu64 ")", gen_of(r).gen, before);
	CHECK(read_back(r, "following reader") == n_files, "every file reads back, the new one too");
	/* its home keeps the generation it follows and that one's base only */
	char idx[600];
	home("r", "reader", "index", idx, sizeof(idx));
	DIR *d = opendir(idx);
	int gens = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		gens += !strncmp(e->d_name, "gen-", 4);
	if (d)
		closedir(d);
	CHECK(gens >= 1 && gens <= 2, "the reader's home holds %d generation files (the followed one and its base)", gens);
	ulp_archive_close(r);
}

/* 5: one writer at a time; the next one rebuilds its index from the bucket. */
static void test_two_writers(void)
{
	char err[512], err2[512];
	int rc, rc2;
	ulp_archive *a = open_as("w", 0, 2000, 0, err, &rc);
	REQUIRE(a, "writer A: %d %s", rc, err);
	ulp_archive *b = open_as("w2", 0, 2000, 0, err2, &rc2);
	CHECK(!b && rc2 == -ULP_E_BUSY && strstr(err2, "another writer holds") && strstr(err2, URL),
	      "writer B is refused while A holds the lease: %d %s", rc2, err2);
	ulp_archive_close(b);
	uint64_t ea = gen_of(a).epoch;
	ulp_archive_close(a);
	b = open_as("w2", 0, 2000, 0, err2, &rc2);
	REQUIRE(b, "writer B once A gave the lease back: %d %s", rc2, err2);
	CHECK(gen_of(b).epoch > ea, "with a higher epoch (%" PRIu64 " > %" PRIu64 ")", gen_of(b).epoch, ea);
	int seen = 0;
	for (int i = 0; i < n_files; i++)
		seen += exists(b, files[i].path);
	CHECK(seen == n_files, "B's index, rebuilt from the bucket, holds A's files (%d of %d)", seen, n_files);
	CHECK(read_back(b, "writer B") == n_files, "and B reads them");
	REQUIRE(put_opaque(b, "notes/d.bin", 40000, 5) == 0, "B archives: %s", ulp_archive_errmsg(b));
	CHECK(ulp_archive_publish(b) == 0, "and publishes: %s", ulp_archive_errmsg(b));
	ulp_archive_close(b);
}

/* 6a: a writer whose lease another took over (its lease object rewritten
 * as expired behind its back) is fenced by the pointer's compare-and-swap:
 * the bucket's CURRENT stays the new writer's. */
static void test_fenced_by_swap(void)
{
	char err[512], err2[512];
	int rc, rc2;
	ulp_archive *a = open_as("w", 0, 60000, 0, err, &rc); /* renews every 15 s: not during this test */
	REQUIRE(a, "writer A: %d %s", rc, err);
	uint64_t ea = gen_of(a).epoch;
	char line[200];
	int l = snprintf(line, sizeof(line), "ulpack-lease 1 %" PRIu64 " 1 2000 1 deadhost\n", ea);
	REQUIRE(s3mock_put_object(mock, "ckpt/a/lease", line, (size_t)l) == 0, "expire A's lease object");
	ulp_archive *b = open_as("w2", 0, 60000, 0, err2, &rc2);
	REQUIRE(b, "writer B takes the expired lease over: %d %s", rc2, err2);
	uint64_t eb = gen_of(b).epoch;
	CHECK(eb > ea && current_epoch(NULL) == eb, "B holds epoch %" PRIu64 " (A %" PRIu64 "), CURRENT says %" PRIu64,
	      eb, ea, current_epoch(NULL));
	rc = put_opaque_as(a, "fenced/a.bin", 30000, 6, 0); /* at most in A's own index */
	CHECK(rc == 0 || rc == -ULP_E_FENCED, "A's put: %d %s", rc, rc ? ulp_archive_errmsg(a) : "");
	rc = ulp_archive_publish(a);
	CHECK(rc == -ULP_E_FENCED && strstr(ulp_archive_errmsg(a), "another writer took the archive over"),
	      "A's publication is fenced: %d %s", rc, ulp_archive_errmsg(a));
	CHECK(gen_of(a).fenced, "A says it is fenced");
	rc = put_opaque_as(a, "fenced/b.bin", 30000, 7, 0);
	CHECK(rc == -ULP_E_FENCED, "and stops archiving: %d", rc);
	CHECK(current_epoch(NULL) == eb, "the bucket's CURRENT stays B's (epoch %" PRIu64 ")", current_epoch(NULL));
	ulp_archive_close(a);
	CHECK(current_epoch(NULL) == eb, "also after A's close");
	REQUIRE(put_opaque(b, "notes/e.bin", 30000, 8) == 0, "B archives: %s", ulp_archive_errmsg(b));
	CHECK(ulp_archive_publish(b) == 0, "B publishes: %s", ulp_archive_errmsg(b));
	ulp_archive_close(b);
	ulp_archive *r = open_as("r", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	CHECK(!exists(r, "fenced/a.bin") && exists(r, "notes/e.bin"), "a reader sees B's files, not fenced A's");
	ulp_archive_close(r);
}

/* 6b: a writer that cannot renew (a partition) stops by its own clock;
 * another takes over once its lease expired. */
static void test_fenced_by_expiry(void)
{
	char err[512], err2[512];
	int rc, rc2;
	ulp_archive *a = open_as("w", 0, 1500, 0, err, &rc);
	REQUIRE(a, "writer A: %d %s", rc, err);
	uint64_t ea = gen_of(a).epoch;
	__atomic_store_n(&ulp_lease_test_stall, 1, __ATOMIC_RELAXED);
	ulp_archive *b = open_as("w2", 0, 1500, 0, err2, &rc2);
	CHECK(!b && rc2 == -ULP_E_BUSY, "B is refused while A's lease holds: %d %s", rc2, err2);
	ulp_archive_close(b);
	usleep(1700000); /* more than the lease, not renewed */
	rc = put_opaque_as(a, "stalled.bin", 20000, 9, 0);
	CHECK(rc == -ULP_E_FENCED && strstr(ulp_archive_errmsg(a), "could not renew its lease"),
	      "the partitioned writer stopped: %d %s", rc, ulp_archive_errmsg(a));
	__atomic_store_n(&ulp_lease_test_stall, 0, __ATOMIC_RELAXED);
	b = open_as("w2", 0, 1500, 0, err2, &rc2);
	REQUIRE(b, "B takes over: %d %s", rc2, err2);
	uint64_t eb = gen_of(b).epoch;
	CHECK(eb > ea && current_epoch(NULL) == eb, "with epoch %" PRIu64 " (A %" PRIu64 ")", eb, ea);
	CHECK(ulp_archive_publish(a) == -ULP_E_FENCED, "A's publication is refused");
	ulp_archive_close(a);
	CHECK(current_epoch(NULL) == eb, "the bucket's CURRENT stays B's");
	ulp_archive_close(b);
}

typedef struct packlist {
	char names[32][128];
	uint64_t sizes[32];
	int n;
} packlist;

static void pack_cb(void *arg, const char *name, const struct stat *sb)
{
	packlist *p = arg;
	for (int i = 0; i < p->n; i++)
		if (!strcmp(p->names[i], name))
			return;
	if (p->n < 32) {
		snprintf(p->names[p->n], sizeof(p->names[0]), "%s", name);
		p->sizes[p->n++] = (uint64_t)sb->st_size;
	}
}

/* Flips the middle byte of every pack the writer's home names (twice:
 * back as it was). */
static int corrupt_packs(const packlist *p)
{
	int done = 0;
	for (int i = 0; i < p->n; i++) {
		char key[300];
		snprintf(key, sizeof(key), "ckpt/a/packs/%s", p->names[i]);
		done += p->sizes[i] && s3mock_corrupt(mock, key, p->sizes[i] / 2) == 0;
	}
	return done;
}

/* 7: a damaged pack object: an error, never wrong bytes. */
static void test_corrupt(void)
{
	char err[512], dir[700];
	int rc;
	packlist p = {.n = 0};
	home("w", "writer", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", pack_cb, &p);
	home("w2", "writer", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", pack_cb, &p);
	REQUIRE(p.n >= 2, "packs to damage: %d", p.n);
	CHECK(corrupt_packs(&p) == p.n, "every pack object damaged (%d)", p.n);
	ulp_archive *r = open_as("r7", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	int wrong = 0, errors = 0, right = 0;
	for (int i = 0; i < n_files; i++) {
		uint8_t *got;
		int64_t n = read_all(r, files[i].path, &got);
		if (n < 0) {
			errors++;
			if (n != -ULP_E_CHECKSUM && n != -ULP_E_CORRUPT && n != -ULP_E_IO)
				wrong++;
			diag("%s: %s (%s)", files[i].path, ulp_strerror((int)n), ulp_archive_errmsg(r));
		} else if (n == (int64_t)files[i].len && !memcmp(got, files[i].data, files[i].len)) {
			right++;
		} else {
			wrong++;
			diag("%s: WRONG BYTES", files[i].path);
		}
		free(got);
	}
	CHECK(wrong == 0 && errors >= 1, "damaged packs give errors (%d), never wrong bytes (%d right, %d wrong)",
	      errors, right, wrong);
	ulp_archive_close(r);
	CHECK(corrupt_packs(&p) == p.n, "the pack objects mended");
}

/* 8: 503s are retried; a wrong key id is refused naming the status. */
static void test_faults(void)
{
	char err[512];
	int rc;
	unsigned long all = s3mock_count(mock, "ALL");
	s3mock_fail_next(mock, 2, 503);
	ulp_archive *r = open_as("r8", 1, 0, 0, err, &rc);
	CHECK(r != NULL, "a reader opens through two 503s: %d %s", rc, r ? "" : err);
	CHECK(s3mock_count(mock, "ALL") - all >= 3, "which it retried");
	if (r) {
		s3mock_fail_next(mock, 2, 503);
		CHECK(read_back(r, "through 503s") == n_files, "and reads every file through two more");
		s3mock_drop_next(mock, 1);
		ulp_archive_close(r);
		r = open_as("r8", 1, 0, 0, err, &rc);
		CHECK(r != NULL, "and opens again through a dropped connection: %d %s", rc, r ? "" : err);
		ulp_archive_close(r);
	}
	s3mock_set_key(mock, "otherkey");
	r = open_as("r8", 1, 0, 0, err, &rc);
	CHECK(!r && rc < 0 && strstr(err, "403"), "a wrong key id is refused: %d %s", rc, err);
	ulp_archive_close(r);
	ulp_archive *w = open_as("w2", 0, 0, 0, err, &rc);
	CHECK(!w && rc < 0 && strstr(err, "403"), "a writer too: %d %s", rc, err);
	ulp_archive_close(w);
	s3mock_set_key(mock, "testkey");
}

/* 9: the reader's pack cache stays near its bound. */
static void test_lru(void)
{
	char err[512], dir[700];
	int rc;
	packlist p = {.n = 0};
	home("w", "writer", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", pack_cb, &p);
	home("w2", "writer", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", pack_cb, &p);
	uint64_t all = 0, largest = 0;
	for (int i = 0; i < p.n; i++) {
		all += p.sizes[i];
		largest = p.sizes[i] > largest ? p.sizes[i] : largest;
	}
	uint64_t bound = all / 3 > largest ? all / 3 : largest + 4096;
	ulp_archive *r = open_as("r9", 1, 0, bound, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	CHECK(read_back(r, "small cache") == n_files, "a small pack cache (%" PRIu64 " of %" PRIu64
	      " bytes) reads every file", bound, all);
	tally t = {"packs", 0, 0, 0, 0};
	home("r9", "reader", "packs", dir, sizeof(dir));
	each_file(dir, ".pack", size_cb, &t);
	diag("pack cache: %" PRIu64 " bytes in %d packs, bound %" PRIu64 ", %d packs of %" PRIu64 " bytes in all",
	     t.bytes, t.seen, bound, p.n, all);
	CHECK(t.bytes <= bound + t.largest + 8192, "it holds %" PRIu64 " bytes in %d packs (bound %" PRIu64 ")",
	      t.bytes, t.seen, bound);
	CHECK(read_back(r, "small cache, again") == n_files, "and reads them again");
	ulp_archive_close(r);
}

/* ---- issue 34 ------------------------------------------------------------- */

/* The .pack files of dir (not temporaries). */
static void packs_in(const char *dir, packlist *p)
{
	p->n = 0;
	each_file(dir, ".pack", pack_cb, p);
}

/* The size of object packs/NAME in the bucket (0: none). */
static size_t object_size(const char *name)
{
	char key[300];
	size_t n = 0;
	snprintf(key, sizeof(key), "ckpt/a/packs/%s", name);
	void *o = s3mock_get_object(mock, key, &n);
	free(o);
	return o ? n : 0;
}

/* 10: a cached pack damaged or truncated on the local disk is fetched
 * anew, after a remount too (item 5). */
static void test_cache_damage(void)
{
	char err[512], dir[700];
	int rc;
	ulp_archive *r = open_as("r10", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	CHECK(read_back(r, "r10") == n_files, "a reader fills its pack cache");
	ulp_archive_close(r);
	home("r10", "reader", "packs", dir, sizeof(dir));
	packlist p;
	packs_in(dir, &p);
	REQUIRE(p.n >= 2, "cached packs: %d", p.n);
	int flipped = 0, cut = 0;
	for (int i = 0; i < p.n; i++) {
		char f[1000];
		snprintf(f, sizeof(f), "%s/%s", dir, p.names[i]);
		if (i % 2 == 0) { /* a byte flipped in the middle: bit rot */
			int fd = open(f, O_RDWR);
			uint8_t c;
			off_t at = (off_t)p.sizes[i] / 2;
			if (fd >= 0 && pread(fd, &c, 1, at) == 1) {
				c ^= 0xff;
				flipped += pwrite(fd, &c, 1, at) == 1;
			}
			if (fd >= 0)
				close(fd);
		} else {
			cut += truncate(f, (off_t)p.sizes[i] / 2) == 0;
		}
	}
	CHECK(flipped >= 1 && cut >= 1, "cached copies damaged: %d flipped, %d truncated", flipped, cut);
	unsigned long gets = s3mock_count(mock, "GET");
	r = open_as("r10", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader again: %d %s", rc, err);
	CHECK(read_back(r, "r10 after damage") == n_files, "after a remount every file reads back right");
	CHECK(s3mock_count(mock, "GET") - gets >= (unsigned long)(flipped + cut),
	      "the damaged copies fetched anew (%lu GETs)", s3mock_count(mock, "GET") - gets);
	packlist q;
	packs_in(dir, &q);
	int right = 0;
	for (int i = 0; i < q.n; i++)
		right += q.sizes[i] == object_size(q.names[i]);
	CHECK(q.n >= p.n && right == q.n, "every cached pack has its object's size (%d of %d)", right, q.n);
	ulp_archive_close(r);
}

/* Reads every file: how many right, how many failed with EIO naming the
 * pack and the archive (msg: a pack's name). */
static void read_tally(ulp_archive *a, const char *name, int *right, int *eio, int *wrong)
{
	*right = *eio = *wrong = 0;
	for (int i = 0; i < n_files; i++) {
		uint8_t *got;
		int64_t n = read_all(a, files[i].path, &got);
		if (n == (int64_t)files[i].len && !memcmp(got, files[i].data, files[i].len)) {
			(*right)++;
		} else if (n < 0) {
			const char *m = ulp_archive_errmsg(a);
			if ((n == -ULP_E_IO || n == -ULP_E_CORRUPT) && strstr(m, URL) && strstr(m, name))
				(*eio)++;
			else
				diag("%s: %s (%s)", files[i].path, ulp_strerror((int)n), m);
		} else {
			(*wrong)++;
		}
		free(got);
	}
}

/* 11: a pack object damaged or truncated in the bucket: a clear error,
 * nothing kept, and read again once mended, without a remount (item 5). */
static void test_bucket_damage(void)
{
	char err[512], dir[700], key[300];
	int rc, right, eio, wrong;
	packlist p;
	home("w", "writer", "packs", dir, sizeof(dir));
	packs_in(dir, &p);
	REQUIRE(p.n >= 1, "packs: %d", p.n);
	int big = 0;
	for (int i = 1; i < p.n; i++)
		big = p.sizes[i] > p.sizes[big] ? i : big;
	const char *name = p.names[big];
	snprintf(key, sizeof(key), "ckpt/a/packs/%s", name);
	/* bit rot in the bucket */
	REQUIRE(s3mock_corrupt(mock, key, p.sizes[big] / 2) == 0, "damage %s", key);
	ulp_archive *r = open_as("r11", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	read_tally(r, name, &right, &eio, &wrong);
	CHECK(eio >= 1 && wrong == 0, "a damaged object: EIO naming %s and the pack (%d), never wrong bytes (%d "
	      "right, %d wrong)", URL, eio, right, wrong);
	home("r11", "reader", "packs", dir, sizeof(dir));
	char f[1000];
	snprintf(f, sizeof(f), "%s/%s", dir, name);
	CHECK(access(f, F_OK) != 0, "its damaged copy is not kept in the pack cache");
	REQUIRE(s3mock_corrupt(mock, key, p.sizes[big] / 2) == 0, "mend %s", key);
	read_tally(r, name, &right, &eio, &wrong);
	CHECK(right == n_files, "mended in the bucket, every file reads back without a remount (%d of %d)", right,
	      n_files);
	ulp_archive_close(r);

	/* truncated in the bucket */
	size_t len = 0;
	uint8_t *whole = s3mock_get_object(mock, key, &len);
	REQUIRE(whole && len > 16, "the object %s", key);
	REQUIRE(s3mock_put_object(mock, key, whole, len / 2) == 0, "truncate %s", key);
	r = open_as("r12", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	read_tally(r, name, &right, &eio, &wrong);
	CHECK(eio >= 1 && wrong == 0 && strstr(ulp_archive_errmsg(r), "the index says"),
	      "a truncated object is refused, naming the sizes (%d): %s", eio, ulp_archive_errmsg(r));
	home("r12", "reader", "packs", dir, sizeof(dir));
	snprintf(f, sizeof(f), "%s/%s", dir, name);
	CHECK(access(f, F_OK) != 0, "and not kept in the pack cache");
	REQUIRE(s3mock_put_object(mock, key, whole, len) == 0, "restore %s", key);
	read_tally(r, name, &right, &eio, &wrong);
	CHECK(right == n_files, "restored, every file reads back without a remount (%d of %d)", right, n_files);
	ulp_archive_close(r);
	free(whole);
}

/* 12: packs/ of a read-only handle's home removed: made again at the next
 * fetch (item 13). */
static void test_packs_removed(void)
{
	char err[512], dir[700], cmd[800];
	int rc;
	ulp_archive *r = open_as("r13", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	home("r13", "reader", "packs", dir, sizeof(dir));
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	REQUIRE(system(cmd) == 0, "%s", cmd);
	CHECK(read_back(r, "packs/ removed") == n_files, "with packs/ removed under it, every file reads back");
	struct stat sb;
	CHECK(lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) && (sb.st_mode & 0777) == 0700 && sb.st_uid == geteuid(),
	      "packs/ made again, 0700, this user's");
	ulp_archive_close(r);
}

/* Whether dir holds nothing. */
static int empty_dir(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	if (d)
		closedir(d);
	return d && n == 0;
}

/* An open of URL with cache_dir dir (absolute): refused with a message
 * holding both words? */
static int refused(const char *dir, int ro, const char *w1, const char *w2, char *err)
{
	ulp_archive_opts o = {.threads = 2, .read_only = ro, .poll_ms = 50, .cache_dir = dir};
	ulp_archive *a = NULL;
	int rc = ulp_archive_open(URL, &o, &a, err, 512);
	ulp_archive_close(a);
	return rc < 0 && strstr(err, w1) && (!w2 || strstr(err, w2));
}

/* 13: the local home's checks (item 7). */
static void test_home_checks(void)
{
	char err[512] = "", d[600], out[600], h[700], sub[1000];
	int is_root = geteuid() == 0;
	snprintf(out, sizeof(out), "%s/outside", root);
	REQUIRE(mkdir(out, 0755) == 0, "mkdir %s", out);
	/* a cache_dir others may write to, without the sticky bit */
	snprintf(d, sizeof(d), "%s/loose", root);
	REQUIRE(mkdir(d, 0700) == 0 && chmod(d, 0777) == 0, "mkdir %s", d);
	CHECK(refused(d, 1, d, "writable", err), "a cache_dir writable by others is refused: %s", err);
	snprintf(sub, sizeof(sub), "%s/s3", d);
	CHECK(access(sub, F_OK) != 0, "and nothing made in it");
	/* with the sticky bit: fine */
	snprintf(d, sizeof(d), "%s/sticky", root);
	REQUIRE(mkdir(d, 0700) == 0 && chmod(d, 01777) == 0, "mkdir %s", d);
	ulp_archive_opts o = {.threads = 2, .read_only = 1, .poll_ms = 50, .cache_dir = d};
	ulp_archive *a = NULL;
	int rc = ulp_archive_open(URL, &o, &a, err, sizeof(err));
	CHECK(rc == 0, "a sticky cache_dir writable by all is taken: %d %s", rc, rc ? err : "");
	ulp_archive_close(a);
	/* a home subdirectory made 0700 */
	snprintf(h, sizeof(h), "%s/sticky", root);
	char ro[900];
	{
		char m[256];
		ulp_err e = {m, sizeof(m)};
		REQUIRE(ulp_remote_local_dir(URL, h, 0, ro, sizeof(ro), &e) == 0, "local dir: %s", m);
	}
	struct stat sb;
	snprintf(sub, sizeof(sub), "%s/packs", ro);
	CHECK(stat(ro, &sb) == 0 && (sb.st_mode & 0777) == 0700 && stat(sub, &sb) == 0 &&
	      (sb.st_mode & 0777) == 0700, "the home and its packs/ are 0700");
	/* a symbolic link in the home pointing outside: refused, nothing written through it */
	char keep[1100];
	snprintf(keep, sizeof(keep), "%s.keep", sub);
	REQUIRE(rename(sub, keep) == 0 && symlink(out, sub) == 0, "packs/ -> %s", out);
	CHECK(refused(h, 1, "packs", "symbolic link", err), "a home whose packs/ is a link is refused: %s", err);
	CHECK(empty_dir(out), "and nothing is written where it points");
	REQUIRE(unlink(sub) == 0 && rename(keep, sub) == 0, "packs/ back");
	char rf[1000], o2[700];
	snprintf(rf, sizeof(rf), "%s/remote", ro);
	snprintf(o2, sizeof(o2), "%s/file", out);
	REQUIRE(rename(rf, keep) == 0 && symlink(o2, rf) == 0, "remote -> %s", o2);
	CHECK(refused(h, 1, "remote", "symbolic link", err), "a home whose file remote is a link is refused: %s", err);
	CHECK(empty_dir(out), "and nothing is written where it points");
	REQUIRE(unlink(rf) == 0 && rename(keep, rf) == 0, "remote back");
	snprintf(rf, sizeof(rf), "%s/ulpack.db", ro);
	REQUIRE(symlink(o2, rf) == 0, "ulpack.db -> %s", o2);
	CHECK(refused(h, 1, "ulpack.db", "symbolic link", err), "a link among the home's entries is refused: %s", err);
	CHECK(empty_dir(out), "and nothing is written where it points");
	unlink(rf);
	if (!is_root) {
		diag("not root: the checks of other users' directories left out");
		return;
	}
	/* a cache_dir of another user */
	snprintf(d, sizeof(d), "%s/theirs", root);
	REQUIRE(mkdir(d, 0700) == 0 && chown(d, 65534, 65534) == 0, "mkdir %s", d);
	CHECK(refused(d, 1, d, "owned by uid 65534", err), "a cache_dir owned by another user is refused: %s", err);
	snprintf(sub, sizeof(sub), "%s/s3", d);
	CHECK(access(sub, F_OK) != 0, "and nothing made in it");
	/* a home (and a subdirectory of it) of another user */
	REQUIRE(chown(ro, 65534, 65534) == 0, "chown %s", ro);
	CHECK(refused(h, 1, ro, "owned by another user", err), "a home owned by another user is refused: %s", err);
	REQUIRE(chown(ro, 0, 0) == 0, "chown back %s", ro);
	snprintf(sub, sizeof(sub), "%s/index", ro);
	REQUIRE(chown(sub, 65534, 65534) == 0, "chown %s", sub);
	CHECK(refused(h, 1, sub, "owned by another user", err), "an index/ owned by another user is refused: %s", err);
	REQUIRE(chown(sub, 0, 0) == 0, "chown back %s", sub);
	/* a user's link, in a sticky directory, as the cache_dir */
	char link[700];
	snprintf(link, sizeof(link), "%s/sticky/mine", root);
	REQUIRE(symlink(out, link) == 0 && lchown(link, 65534, 65534) == 0, "%s -> %s", link, out);
	CHECK(refused(link, 1, "symbolic link of uid 65534", NULL, err), "a user's link as the cache_dir is refused: %s",
	      err);
	CHECK(empty_dir(out), "and nothing is written where it points");
	/* the directory it names, the user's own: refused too */
	snprintf(d, sizeof(d), "%s/sticky/theirs", root);
	REQUIRE(mkdir(d, 0700) == 0 && chown(d, 65534, 65534) == 0, "mkdir %s", d);
	CHECK(refused(d, 0, "owned by uid 65534", NULL, err), "a user's directory in a sticky one is refused: %s", err);
	a = NULL;
	o.cache_dir = h;
	rc = ulp_archive_open(URL, &o, &a, err, sizeof(err));
	CHECK(rc == 0, "the home checked still opens: %d %s", rc, rc ? err : "");
	ulp_archive_close(a);
}

/* 14: one bucket and prefix at two endpoints: two homes (item 12). */
static void test_two_endpoints(void)
{
	char err[512] = "", ha[700], hb[700];
	s3mock *other;
	REQUIRE(s3mock_start(&other) == 0, "a second mock");
	const char *first = s3mock_endpoint(mock);
	home("r", "reader", NULL, ha, sizeof(ha));
	setenv("AWS_ENDPOINT_URL", s3mock_endpoint(other), 1);
	home("r", "reader", NULL, hb, sizeof(hb));
	CHECK(strcmp(ha, hb) != 0, "the home's name hashes the endpoint: %s, %s", ha, hb);
	int rc = ulp_archive_init(URL, err, sizeof(err));
	CHECK(rc == 0, "init of the same URL at another endpoint, the same ULPACK_CACHE_DIR: %d %s", rc, err);
	ulp_archive *w = open_as("w", 0, 0, 0, err, &rc);
	CHECK(w != NULL, "a writer there, the same cache_dir: %d %s", rc, w ? "" : err);
	uint8_t data[3000];
	fill(data, sizeof(data), 77);
	if (w) {
		CHECK(!exists(w, files[0].path), "it sees none of the first archive's files");
		CHECK(put_bytes(w, "other/x.bin", data, sizeof(data)) == 0, "put: %s", ulp_archive_errmsg(w));
		ulp_archive_close(w);
	}
	ulp_archive *r = open_as("r", 1, 0, 0, err, &rc);
	CHECK(r != NULL, "a reader there, the same cache_dir: %d %s", rc, r ? "" : err);
	if (r) {
		uint8_t *got = NULL;
		int64_t n = read_all(r, "other/x.bin", &got);
		CHECK(n == (int64_t)sizeof(data) && !memcmp(got, data, sizeof(data)), "it reads its own file: %lld %s",
		      (long long)n, n < 0 ? ulp_archive_errmsg(r) : "");
		free(got);
		CHECK(!exists(r, files[0].path), "and none of the first archive's");
		ulp_archive_close(r);
	}
	/* a home whose identity names another endpoint */
	char rf[800], line[800];
	snprintf(rf, sizeof(rf), "%s/remote", hb);
	FILE *f = fopen(rf, "w");
	REQUIRE(f, "open %s", rf);
	fprintf(f, "%s\nendpoint http://elsewhere.example\n", URL);
	fclose(f);
	r = open_as("r", 1, 0, 0, err, &rc);
	CHECK(!r && rc == -ULP_E_EXIST && strstr(err, "http://elsewhere.example") && strstr(err, s3mock_endpoint(other)) &&
	      strstr(err, "cache_dir"), "a home of another endpoint is refused: %d %s", rc, err);
	ulp_archive_close(r);
	f = fopen(rf, "w");
	REQUIRE(f, "open %s", rf);
	fprintf(f, "%s\nendpoint %s\n", URL, s3mock_endpoint(other));
	fclose(f);
	setenv("AWS_ENDPOINT_URL", first, 1);
	r = open_as("r", 1, 0, 0, err, &rc);
	REQUIRE(r, "the first archive's reader: %d %s", rc, err);
	CHECK(read_back(r, "first endpoint") == n_files && !exists(r, "other/x.bin"),
	      "back at the first endpoint, the same cache_dir serves the first archive");
	ulp_archive_close(r);
	FILE *g = fopen(rf, "r");
	CHECK(g && fgets(line, sizeof(line), g) && !strncmp(line, URL, strlen(URL)), "the home names its URL");
	if (g)
		fclose(g);
	s3mock_stop(other);
}

/* ---- issue 34 items 6 and 11 ------------------------------------------------- */

static double mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int count_entry(void *arg, const char *name, const ulp_stat *st)
{
	(void)name, (void)st;
	(*(int *)arg)++;
	return 0;
}

/* A JSON number field of ulp_space_json's object: 1 and *v, or 0. */
static int json_u64(const char *js, const char *name, uint64_t *v)
{
	char key[80];
	snprintf(key, sizeof(key), "\"%s\": ", name);
	const char *p = strstr(js, key);
	unsigned long long x;
	if (!p || sscanf(p + strlen(key), "%llu", &x) != 1)
		return 0;
	*v = x;
	return 1;
}

/* 10 (item 11): the space figures are the bucket's, beside the local
 * cache's: a pack object no generation names counts as reclaimable, and
 * df's figure (ulp_archive_disk_bytes) is the bucket's bytes. */
static void test_space(void)
{
	char err[512], js[2048];
	int rc;
	enum { DROPPED = 1 << 20 };
	uint8_t *junk = calloc(1, DROPPED);
	REQUIRE(junk, "calloc");
	static const char dropped[] = "ckpt/a/packs/"
	                              "00000000000000000000000000000000000000000000000000000000deadbeef.pack";
	REQUIRE(s3mock_put_object(mock, dropped, junk, DROPPED) == 0, "a dropped pack in the bucket");
	free(junk);
	ulp_archive *r = open_as("r10", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	ulp_space sp;
	memset(&sp, 0, sizeof(sp));
	rc = ulp_archive_space(r, &sp);
	CHECK(rc == 0, "space: %d %s", rc, rc ? ulp_archive_errmsg(r) : "");
	ulp_space_json(&sp, js, sizeof(js));
	diag("space: %s", js);
	uint64_t bb = 0, bpb = 0, bp = 0, bun = 0, recl = 0, pack = 0, disk = 0;
	int has = json_u64(js, "bucket_bytes", &bb) && json_u64(js, "bucket_pack_bytes", &bpb) &&
	          json_u64(js, "bucket_packs", &bp) && json_u64(js, "bucket_unnamed_bytes", &bun);
	json_u64(js, "reclaimable_bytes", &recl);
	json_u64(js, "pack_bytes", &pack);
	json_u64(js, "disk_bytes", &disk);
	CHECK(has, "the JSON has the bucket's figures beside the local ones");
	CHECK(bpb >= pack + DROPPED && bb > bpb && bp >= 3, "the bucket's bytes: %" PRIu64 " in all, %" PRIu64
	      " in %" PRIu64 " packs (the index names %" PRIu64 ")", bb, bpb, bp, pack);
	/* (and what the fenced writers of tests 6 and 7 uploaded) */
	CHECK(bun >= DROPPED && recl >= bun, "the pack no generation names is reclaimable: %" PRIu64 " unnamed (%" PRIu64
	      " dropped here), %" PRIu64 " reclaimable", bun, (uint64_t)DROPPED, recl);
	CHECK(disk < bb, "the local home (%" PRIu64 " bytes, nothing read yet) is not the archive's size", disk);
	uint64_t df = ulp_archive_disk_bytes(r);
	CHECK(df == bb, "df's figure is the bucket's: %" PRIu64 " (bucket %" PRIu64 ")", df, bb);
	ulp_archive_close(r);
	s3mock_delete_object(mock, dropped);
}

/* 11 (item 6): a hung store (silent, not refusing) never holds up a reader
 * whose packs are all cached: reads, lookups and listings go on with the
 * generation it follows while its poll of CURRENT waits in the background;
 * the close ends that wait at once. */
static void test_hang(void)
{
	char err[512];
	int rc;
	ulp_archive *r = open_as("r11", 1, 0, 0, err, &rc);
	REQUIRE(r, "reader: %d %s", rc, err);
	CHECK(read_back(r, "before the hang") == n_files, "every file read (and cached)");
	uint64_t gen = gen_of(r).gen;
	s3mock_hang(mock, 1);
	usleep(120000); /* a poll is due (poll_ms 50) */
	double t0 = mono_ms();
	int ok = 1;
	for (int round = 0; round < 3; round++) {
		int n = 0;
		ok &= read_back(r, "hung store") == n_files;
		ok &= ulp_archive_readdir(r, "notes", count_entry, &n) == 0 && n >= 3;
		ok &= exists(r, "run/checkpoint-1/model.safetensors");
		ok &= !exists(r, "notes/none");
		usleep(100000); /* the next poll due */
	}
	double took = mono_ms() - t0;
	CHECK(ok, "with the store hung, every cached file reads, lists and stats");
	CHECK(took < 2500, "within a second or two: %.0f ms (3 rounds, 300 ms of them sleeps)", took);
	CHECK(gen_of(r).gen == gen, "on the generation it followed (%" PRIu64 ")", gen);
	t0 = mono_ms();
	ulp_archive_close(r);
	took = mono_ms() - t0;
	CHECK(took < 2500, "the close ends the background poll's wait: %.0f ms", took);
	s3mock_hang(mock, 0);
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-remote-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	REQUIRE(s3mock_start(&mock) == 0, "s3mock_start");
	char none[300], init[300];
	snprintf(none, sizeof(none), "%s/no-such-file", root);
	snprintf(init, sizeof(init), "%s/init", root);
	static const char *const unset[] = {"AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
	                                    "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE", "AWS_DEFAULT_REGION"};
	for (size_t i = 0; i < sizeof(unset) / sizeof(unset[0]); i++)
		unsetenv(unset[i]);
	setenv("AWS_ENDPOINT_URL", s3mock_endpoint(mock), 1);
	setenv("AWS_ACCESS_KEY_ID", "testkey", 1);
	setenv("AWS_SECRET_ACCESS_KEY", "SECRETSECRET", 1);
	setenv("AWS_REGION", "us-east-1", 1);
	setenv("AWS_SHARED_CREDENTIALS_FILE", none, 1);
	setenv("AWS_CONFIG_FILE", none, 1);
	setenv("ULPACK_CACHE_DIR", init, 1); /* init's local home */
	test_init();
	test_url();
	test_write();
	test_read();
	test_follow();
	test_two_writers();
	test_fenced_by_swap();
	test_fenced_by_expiry();
	test_corrupt();
	test_faults();
	test_lru();
	test_cache_damage();
	test_bucket_damage();
	test_packs_removed();
	test_home_checks();
	test_two_endpoints();
	test_space();
	test_hang();
	s3mock_stop(mock);
	for (int i = 0; i < n_files; i++)
		free(files[i].data);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
