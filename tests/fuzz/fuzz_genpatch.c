/* SPDX-License-Identifier: MIT */
/*
 * fuzz_genpatch.c - a published generation's patch (store/genvfs.c) on
 * hostile input. The input is parsed as a patch file (ulp_genpatch_parse);
 * where it does not parse only because its checksum is stale, a copy with
 * the checksum made right is parsed instead, so the fuzzer reaches the
 * checks and the reads behind the checksum. Where one parses: the
 * invariants the VFS relies on (page numbers from 1, ascending, within the
 * database; the page numbers and the pages exactly fill the input), then the
 * patch is opened for real over a small base database (made once per
 * process, by the same SQL as tests/fuzz/gen_genpatch_corpus.py, so the
 * corpus's patches apply to it): PRAGMA quick_check and every row of every
 * table. Any SQLite error is fine; a crash or a sanitizer report is not.
 * Files: $TMPDIR (or /tmp)/ulp-fuzz-genpatch.XXXXXX, removed at exit.
 */
#include "fuzz.h"
#include "store/shared.h"
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* the base's SQL: tests/fuzz/gen_genpatch_corpus.py has the same */
static const char base_sql[] =
	"PRAGMA page_size=512;"
	"CREATE TABLE t(a INTEGER PRIMARY KEY, b TEXT, c BLOB);"
	"CREATE INDEX tb ON t(b);"
	"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40) "
	"INSERT INTO t SELECT i, printf('row-%03d', i), zeroblob(i * 7) FROM n;"
	"CREATE TABLE meta(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
	"INSERT INTO meta VALUES('format', 1), ('note', printf('%.600c', 'x'));";

static char dir[4096], base_path[4200], patch_path[4200], *uri;

static void cleanup(void)
{
	unlink(patch_path);
	unlink(base_path);
	rmdir(dir);
	sqlite3_free(uri);
}

static int setup(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/ulp-fuzz-genpatch.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return -1;
	snprintf(base_path, sizeof(base_path), "%s/base.db", dir);
	snprintf(patch_path, sizeof(patch_path), "%s/gen.patch", dir);
	atexit(cleanup);
	sqlite3 *db;
	if (sqlite3_open(base_path, &db) != SQLITE_OK || sqlite3_exec(db, base_sql, NULL, NULL, NULL) != SQLITE_OK) {
		fprintf(stderr, "fuzz_genpatch: %s: %s\n", base_path, sqlite3_errmsg(db));
		sqlite3_close(db);
		return -1;
	}
	sqlite3_close(db);
	if (ulp_genvfs_register() < 0)
		return -1;
	uri = sqlite3_mprintf("file:%s?immutable=1&vfs=ulpgen&patch=%s", base_path, patch_path);
	return uri ? 0 : -1;
}

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static int progress(void *arg)
{
	return ++*(int *)arg > 20000; /* a (corrupt) database that takes long: stop */
}

/* Every row of every table the (patched) schema names. */
static void read_all(sqlite3 *db)
{
	sqlite3_stmt *tabs, *st;
	if (sqlite3_prepare_v2(db, "SELECT name FROM sqlite_master WHERE type = 'table'", -1, &tabs, NULL) != SQLITE_OK)
		return;
	for (int t = 0; t < 16 && sqlite3_step(tabs) == SQLITE_ROW; t++) {
		char *q = sqlite3_mprintf("SELECT * FROM \"%w\"", (const char *)sqlite3_column_text(tabs, 0));
		if (q && sqlite3_prepare_v2(db, q, -1, &st, NULL) == SQLITE_OK) {
			for (int r = 0; r < 1000 && sqlite3_step(st) == SQLITE_ROW; r++)
				for (int c = 0; c < sqlite3_column_count(st); c++) {
					const uint8_t *v = sqlite3_column_blob(st, c);
					int n = sqlite3_column_bytes(st, c);
					volatile uint8_t sink = n > 0 && v ? v[n - 1] : 0; /* every byte readable */
					(void)sink;
				}
			sqlite3_finalize(st);
		}
		sqlite3_free(q);
	}
	sqlite3_finalize(tabs);
}

/* A patch that parsed: the invariants, then read through the VFS. */
static void check(const uint8_t *m, size_t len, const ulp_genpatch *gp)
{
	FUZZ_ASSERT(gp->page_size >= 512 && gp->page_size <= 65536 && !(gp->page_size & (gp->page_size - 1)));
	FUZZ_ASSERT(gp->n_patch <= gp->n_pages);
	FUZZ_ASSERT(gp->pgno == m + ULP_GENPATCH_HEADER);
	FUZZ_ASSERT(gp->pages == gp->pgno + 4 * (size_t)gp->n_patch);
	FUZZ_ASSERT((size_t)(gp->pages - m) + (size_t)gp->n_patch * gp->page_size == len);
	for (uint32_t i = 0; i < gp->n_patch; i++) {
		uint32_t p = rd32(gp->pgno + 4 * (size_t)i);
		FUZZ_ASSERT(p >= 1 && p <= gp->n_pages);
		FUZZ_ASSERT(i == 0 || p > rd32(gp->pgno + 4 * (size_t)(i - 1)));
	}
	FILE *f = fopen(patch_path, "wb");
	if (!f)
		return;
	int ok = fwrite(m, 1, len, f) == len;
	if (fclose(f) != 0 || !ok)
		return;
	sqlite3 *db = NULL;
	if (sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI, NULL) == SQLITE_OK) {
		int steps = 0;
		sqlite3_progress_handler(db, 100, progress, &steps);
		sqlite3_exec(db, "PRAGMA quick_check", NULL, NULL, NULL);
		read_all(db);
	}
	sqlite3_close(db);
}

FUZZ_TARGET(genpatch)
{
	static int ready;
	if (!ready)
		ready = setup() == 0 ? 1 : -1;
	FUZZ_ASSERT(ready == 1);
	ulp_genpatch gp;
	if (ulp_genpatch_parse(data, size, &gp) == 0) {
		check(data, size, &gp);
		return 0;
	}
	/* a stale checksum only: the same input with it made right */
	if (size < ULP_GENPATCH_HEADER || size > (64u << 20))
		return 0;
	uint8_t *m = malloc(size);
	if (!m)
		return 0;
	memcpy(m, data, size);
	uint64_t h = ulp_xxh64(m + ULP_GENPATCH_HEADER, size - ULP_GENPATCH_HEADER);
	for (int i = 0; i < 8; i++)
		m[32 + i] = (uint8_t)(h >> (8 * i));
	if (memcmp(m + 32, data + 32, 8) != 0 && ulp_genpatch_parse(m, size, &gp) == 0)
		check(m, size, &gp);
	free(m);
	return 0;
}
