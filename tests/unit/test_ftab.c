/* SPDX-License-Identifier: MIT */
/*
 * test_ftab.c - the file table (store/ftab.c, issue 38): with a fresh table
 * stat, ulp_file_open and reads of a step run no SQL statement; the table
 * never serves a stale state: after a put, a rename, an unlink, re-coding
 * and gc in this handle, after a commit of another handle of the same
 * index (as another process's), and on a reader of a shared archive after a
 * new generation, every answer is the index's, and once loaded again the
 * table answers alone with the same.
 */
#include "tap.h"
#include "arch_int.h"
#include "store/ftab.h"
#include "store/pack.h"
#include "store/db.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void write_step(const char *path, int s, size_t n)
{
	uint16_t *w = malloc(n * 2), *b = malloc(256 * 2);
	uint64_t r = 777;
	for (size_t i = 0; i < n; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		w[i] = (uint16_t)(0x3c00 + ((r >> 33) % 3000) + (uint16_t)(s * ((r >> 20) % 7)));
	}
	for (int i = 0; i < 256; i++)
		b[i] = (uint16_t)(0x3f80 + (i % 3) + s);
	uint64_t sw[2] = {n / 256, 256}, sb[1] = {256};
	ulp_st_wtensor t[2] = {{"w", ULP_DT_BF16, 2, sw, w}, {"b", ULP_DT_BF16, 1, sb, b}};
	REQUIRE(ulp_st_write(path, t, 2, NULL) == 0, "write %s", path);
	free(w);
	free(b);
}

static char *src_of(int s)
{
	static char p[8][512];
	snprintf(p[s % 8], sizeof(p[0]), "%s/src-%d.safetensors", root, s);
	return p[s % 8];
}

static int put_step(ulp_archive *a, const char *apath, int s)
{
	write_step(src_of(s), s, 40000);
	int fd = open(src_of(s), O_RDONLY);
	REQUIRE(fd >= 0, "open %s", src_of(s));
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	int rc = ulp_archive_put(a, apath, fd, &m, NULL);
	close(fd);
	return rc;
}

/* apath reads back as src_of(s), whole and in pieces */
static int reads_as(ulp_archive *a, const char *apath, int s)
{
	FILE *f = fopen(src_of(s), "rb");
	if (!f)
		return 0;
	fseek(f, 0, SEEK_END);
	size_t len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *want = malloc(len), *got = malloc(len + 64);
	int ok = fread(want, 1, len, f) == len;
	fclose(f);
	ulp_file *h;
	ok = ok && ulp_file_open(a, apath, &h) == 0;
	if (ok) {
		ok = ulp_file_pread(h, got, len + 64, 0) == (int64_t)len && !memcmp(got, want, len);
		for (uint64_t off = 0; ok && off < len; off += 7000) {
			size_t n = (size_t)ULP_MIN((uint64_t)7000, len - off);
			ok = ulp_file_pread(h, got, n, off) == (int64_t)n && !memcmp(got, want + off, n);
		}
		ulp_file_close(h);
	}
	free(want);
	free(got);
	return ok;
}

static int exists(ulp_archive *a, const char *p)
{
	ulp_stat st;
	return ulp_archive_stat(a, p, &st) == 0;
}

static uint64_t stmts(ulp_archive *a)
{
	return __atomic_load_n(&a->index_stmts, __ATOMIC_RELAXED);
}

/* stat, open and a whole read of apath from the table alone: no statement */
static int no_sql(ulp_archive *a, const char *apath, int s)
{
	uint64_t before = stmts(a);
	int ok = exists(a, apath) && reads_as(a, apath, s);
	return ok && stmts(a) == before;
}

static void test_local(void)
{
	char dir[512], err[512];
	snprintf(dir, sizeof(dir), "%s/local", root);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive_opts w = {.cache_size = 16 << 20, .threads = 2, .max_chain = 4};
	ulp_archive *a;
	REQUIRE(ulp_archive_open(dir, &w, &a, err, sizeof(err)) == 0, "open: %s", err);
	for (int s = 1; s <= 4; s++) {
		char p[64];
		snprintf(p, sizeof(p), "run/checkpoint-%d/model.safetensors", s * 100);
		REQUIRE(put_step(a, p, s) == 0, "put %d: %s", s, ulp_archive_errmsg(a));
	}
	ulp_archive_close(a);

	ulp_archive_opts o = w;
	o.file_table = 1;
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open with the table: %s", err);
	uint64_t bytes;
	size_t ents, blobs;
	ulp_ftab_size(a, &bytes, &ents, &blobs);
	CHECK(ents >= 10 && blobs >= 8 && bytes > 0, "loaded at open: %zu entries, %zu blobs, %llu bytes", ents, blobs,
	      (unsigned long long)bytes);
	CHECK(ulp_ftab_wait(a, 0), "fresh at once");
	CHECK(no_sql(a, "run/checkpoint-100/model.safetensors", 1), "the oldest step: stat, open, read, no SQL");
	CHECK(no_sql(a, "run/checkpoint-400/model.safetensors", 4), "the newest step: no SQL");
	uint64_t before = stmts(a);
	CHECK(!exists(a, "run/checkpoint-500/model.safetensors") && !exists(a, "nothing") && stmts(a) == before,
	      "a missing path: NOENT, no SQL");
	ulp_stat st;
	CHECK(ulp_archive_stat(a, "run/checkpoint-100", &st) == 0 && st.is_dir && stmts(a) == before,
	      "a directory: no SQL");

	/* a put: stale at once (ftab.c invariant 1), the index answers */
	REQUIRE(put_step(a, "run/checkpoint-500/model.safetensors", 5) == 0, "put 5: %s", ulp_archive_errmsg(a));
	ulp_ftab *t = ulp_ftab_get(a);
	CHECK(!t, "stale after a commit");
	ulp_ftab_put(a, t);
	CHECK(exists(a, "run/checkpoint-500/model.safetensors") && reads_as(a, "run/checkpoint-500/model.safetensors", 5),
	      "the new file, at once");
	CHECK(ulp_ftab_wait(a, 5000), "loaded again");
	CHECK(no_sql(a, "run/checkpoint-500/model.safetensors", 5), "the new file from the table");

	/* a rename */
	REQUIRE(ulp_archive_rename(a, "run/checkpoint-200", "run/checkpoint-250") == 0, "rename: %s",
	        ulp_archive_errmsg(a));
	CHECK(!exists(a, "run/checkpoint-200/model.safetensors") &&
	      reads_as(a, "run/checkpoint-250/model.safetensors", 2), "renamed, at once");
	CHECK(ulp_ftab_wait(a, 5000) && !exists(a, "run/checkpoint-200/model.safetensors") &&
	      no_sql(a, "run/checkpoint-250/model.safetensors", 2), "renamed, from the table");

	/* an unlink */
	REQUIRE(ulp_archive_remove(a, "run/checkpoint-300/model.safetensors") == 0, "rm");
	CHECK(!exists(a, "run/checkpoint-300/model.safetensors"), "removed, at once");
	CHECK(ulp_ftab_wait(a, 5000), "loaded again");
	before = stmts(a);
	CHECK(!exists(a, "run/checkpoint-300/model.safetensors") && stmts(a) == before, "removed, from the table");

	/* re-coding and gc: blobs re-coded into new packs, old packs gone; a
	 * stale chain would name a removed pack */
	ulp_rebase_result rr;
	CHECK(ulp_archive_rebase(a, "run/checkpoint-100/model.safetensors", "w", NULL, &rr) == 0, "rebase: %s",
	      ulp_archive_errmsg(a));
	CHECK(ulp_archive_rebase_pending(a, NULL, NULL, &rr) == 0, "rebase pending: %s", ulp_archive_errmsg(a));
	ulp_gc_result g;
	CHECK(ulp_archive_gc(a, &g) == 0, "gc: %s", ulp_archive_errmsg(a));
	static const int steps[] = {1, 4, 5};
	for (int i = 0; i < 3; i++) {
		char p[64];
		snprintf(p, sizeof(p), "run/checkpoint-%d/model.safetensors", steps[i] * 100);
		CHECK(reads_as(a, p, steps[i]), "after re-coding and gc, %s reads (index)", p);
	}
	CHECK(ulp_ftab_wait(a, 5000), "loaded again");
	for (int i = 0; i < 3; i++) {
		char p[64];
		snprintf(p, sizeof(p), "run/checkpoint-%d/model.safetensors", steps[i] * 100);
		CHECK(no_sql(a, p, steps[i]), "after re-coding and gc, %s from the table", p);
	}

	/* another handle's commit (its own connections: as another process's):
	 * the index's files changed (invariant 1) */
	ulp_archive *b;
	REQUIRE(ulp_archive_open(dir, &w, &b, err, sizeof(err)) == 0, "a second handle: %s", err);
	REQUIRE(put_step(b, "run/checkpoint-600/model.safetensors", 6) == 0, "put 6 by the other: %s",
	        ulp_archive_errmsg(b));
	REQUIRE(ulp_archive_remove(b, "run/checkpoint-500/model.safetensors") == 0, "rm 5 by the other");
	CHECK(exists(a, "run/checkpoint-600/model.safetensors") && !exists(a, "run/checkpoint-500/model.safetensors"),
	      "the other handle's changes, at once");
	CHECK(ulp_ftab_wait(a, 5000) && no_sql(a, "run/checkpoint-600/model.safetensors", 6) &&
	      !exists(a, "run/checkpoint-500/model.safetensors"), "and from the table");
	ulp_archive_close(b);
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify");
	ulp_archive_close(a);
}

static uint64_t gen_of(ulp_archive *a)
{
	ulp_generation g;
	ulp_archive_generation(a, &g);
	return g.gen;
}

/* A reader of a shared archive: a new generation makes its table stale. */
static void test_shared(void)
{
	char dir[512], err[512];
	snprintf(dir, sizeof(dir), "%s/shared", root);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive_opts wo = {.cache_size = 16 << 20, .threads = 2};
	ulp_archive *w, *r;
	REQUIRE(ulp_archive_open(dir, &wo, &w, err, sizeof(err)) == 0 && ulp_archive_share(w) == 0, "share");
	REQUIRE(put_step(w, "run/checkpoint-1/model.safetensors", 1) == 0, "put");
	REQUIRE(ulp_archive_publish(w) == 0, "publish");
	ulp_archive_opts ro = {.cache_size = 16 << 20, .threads = 2, .read_only = 1, .poll_ms = 50, .file_table = 1};
	REQUIRE(ulp_archive_open(dir, &ro, &r, err, sizeof(err)) == 0, "reader: %s", err);
	CHECK(ulp_ftab_wait(r, 5000), "the reader's table");
	usleep(80000); /* past its poll: the stat below looks for a newer generation, finds none */
	CHECK(no_sql(r, "run/checkpoint-1/model.safetensors", 1), "the reader: no SQL");
	REQUIRE(put_step(w, "run/checkpoint-2/model.safetensors", 2) == 0, "put 2");
	REQUIRE(ulp_archive_remove(w, "run/checkpoint-1/model.safetensors") == 0, "rm 1");
	REQUIRE(ulp_archive_publish(w) == 0, "publish");
	usleep(80000);
	CHECK(exists(r, "run/checkpoint-2/model.safetensors") && !exists(r, "run/checkpoint-1/model.safetensors") &&
	      gen_of(r) == gen_of(w), "the new generation, at once (generation %llu)", (unsigned long long)gen_of(r));
	CHECK(reads_as(r, "run/checkpoint-2/model.safetensors", 2), "its new file reads");
	CHECK(ulp_ftab_wait(r, 5000), "loaded again");
	CHECK(!exists(r, "run/checkpoint-1/model.safetensors") && no_sql(r, "run/checkpoint-2/model.safetensors", 2),
	      "the new generation from the table");
	ulp_archive_close(r);
	ulp_archive_close(w);
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-ftab-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_local();
	test_shared();
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return tap_done();
}
