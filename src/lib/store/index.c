/* SPDX-License-Identifier: MIT */
/*
 * index.c - the rows of an archive's index: blobs, packs, file entries with
 * their extents and tensors, and the queries over them (a file's layout, a
 * series' steps, listing, reports, gc and re-basing support, space). The
 * connection and schema are db.c's; directory operations on entries are
 * namespace.c's.
 *
 * Invariants:
 *  1. A file's extents are in offset order, disjoint, inside [0, size); the
 *     bytes between and around them are its header's, in order (kind 1: the
 *     first length(header) bytes; kind 2: the header is zstd-compressed).
 *  2. Every blob's ref names the content of another blob (or is NULL), and
 *     depth = depth(ref) + 1; following refs terminates (depth decreases).
 *  3. Every pack row's file exists and is durable before the transaction
 *     that inserts the row commits.
 *  4. Every entry but the root has parent = the path up to its last '/' and
 *     name = the rest, and its parent is a directory entry: every row is
 *     reached from the root (verify reports the rows that are not). Paths
 *     are compared as bytes, never by character counts (BELOW below).
 *  5. Every header byte is checked against header_sha before it is served
 *     (ulp_index_file); a header without a matching sha256 is never read
 *     (ULP_E_CHECKSUM), except in a version 1 index opened read-only.
 *  6. Every writer sets mtime_ns = ulp_time_ns(mtime_sec, mtime_nsec) along
 *     with them; a row where they disagree (or mtime_sec is NULL) was written
 *     by an older (version 2 or 3) build after the upgrade, and its time is mtime_ns
 *     (ulp_stat_from_row).
 *  7. A pack row dropped by
 *     a shared archive's writer goes into pack_grace in the same
 *     transaction, and out of it when a pack of that name is added again.
 *  8. A pack id is never given twice (meta pack_seq holds the last one):
 *     readers of different generations (gen.c) agree on what an id names.
 */
#include "arch_int.h"
#include "store/ftab.h"
#include "store/pack.h"
#include "store/db.h"
#include "db.h"
#include "path.h"
#include "index.h"
#include "shared.h"
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int ulp_index_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], ulp_blobrow *out)
{
	static const char sql[] = "SELECT id, pack, offset, stored_size, raw_size, depth, codec FROM blobs WHERE content = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_blob(st, 1, sha, ULP_SHA256_LEN, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		out->id = sqlite3_column_int64(st, 0);
		out->pack = sqlite3_column_int64(st, 1);
		out->offset = (uint64_t)sqlite3_column_int64(st, 2);
		out->stored = (uint64_t)sqlite3_column_int64(st, 3);
		out->raw = (uint64_t)sqlite3_column_int64(st, 4);
		out->depth = (unsigned)sqlite3_column_int(st, 5);
		out->codec = sqlite3_column_int(st, 6);
		sqlite3_reset(st);
		return 0;
	}
	sqlite3_reset(st);
	if (rc == SQLITE_DONE) {
		char hex[65];
		ulp_sha256_hex(sha, hex);
		return ulp_arch_err(a, -ULP_E_NOENT, "%s/ulpack.db: no blob holds content %.16s", a->dir, hex);
	}
	return ulp_db_err(a, "blob lookup");
}

int ulp_index_pack_name(ulp_archive *a, int64_t id, char *name, size_t cap)
{
	return ulp_index_pack_row(a, id, name, cap, NULL);
}

int ulp_index_pack_row(ulp_archive *a, int64_t id, char *name, size_t cap, uint64_t *size)
{
	static const char sql[] = "SELECT name, size FROM packs WHERE id = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, id);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_reset(st);
		if (rc != SQLITE_DONE)
			return ulp_db_err(a, "pack lookup");
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s/ulpack.db: pack %lld is not in the index", a->dir,
		                    (long long)id);
	}
	snprintf(name, cap, "%s", (const char *)sqlite3_column_text(st, 0));
	if (size)
		*size = (uint64_t)sqlite3_column_int64(st, 1);
	sqlite3_reset(st);
	return 0;
}

/* Fills a ulp_stat from a row of ULP_ENTRY_COLS (ULP_ENTRY_COLS_V2 in an
 * index of schema version 1 to 3, opened read-only: no mtime_sec, mtime_nsec). */

int ulp_stat_from_row(sqlite3_stmt *st, ulp_stat *s)
{
	memset(s, 0, sizeof(*s));
	int type = sqlite3_column_int(st, 0);
	s->is_dir = type == ULP_ENT_DIR;
	s->is_symlink = type == ULP_ENT_LINK;
	s->size = (uint64_t)sqlite3_column_int64(st, 1);
	s->mode = (uint32_t)sqlite3_column_int(st, 2) & 07777;
	s->mode |= s->is_dir ? 0040000 : s->is_symlink ? 0120000 : 0100000;
	s->uid = (uint32_t)sqlite3_column_int(st, 3);
	s->gid = (uint32_t)sqlite3_column_int(st, 4);
	int64_t ns = sqlite3_column_int64(st, 5);
	s->mtime = ulp_time_from_ns(ns);
	if (sqlite3_column_type(st, 13) != SQLITE_NULL) { /* invariant 6 */
		ulp_time t = ulp_time_make(sqlite3_column_int64(st, 13), sqlite3_column_int64(st, 14));
		if (ulp_time_ns(t.sec, t.nsec) == ns)
			s->mtime = t;
	}
	if (sqlite3_column_bytes(st, 6) == ULP_SHA256_LEN)
		memcpy(s->sha256, sqlite3_column_blob(st, 6), ULP_SHA256_LEN);
	s->stored_bytes = (uint64_t)sqlite3_column_int64(st, 7);
	s->step = sqlite3_column_type(st, 8) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 8);
	s->chain_depth = (unsigned)sqlite3_column_int(st, 9);
	s->anchor = sqlite3_column_int(st, 10);
	s->kind = sqlite3_column_int(st, 11);
	if (s->is_symlink)
		s->size = (uint64_t)sqlite3_column_int64(st, 12);
	return 0;
}

int ulp_index_file(ulp_archive *a, const char *path, ulp_stat *out, uint8_t **header,
                   size_t *header_len, ulp_extent **ext, size_t *n_ext)
{
	static const char sql[] = "SELECT " ULP_ENTRY_COLS ", id, header, header_sha FROM entries WHERE path = ?";
	static const char sql_v2[] = "SELECT " ULP_ENTRY_COLS_V2 ", id, header, header_sha FROM entries WHERE path = ?";
	static const char sql_v1[] = "SELECT " ULP_ENTRY_COLS_V2 ", id, header, NULL FROM entries WHERE path = ?";
	static const char sql_ext[] = "SELECT e.offset, e.length, b.content FROM extents e"
	                              " JOIN blobs b ON b.id = e.blob WHERE e.file = ? ORDER BY e.offset";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, a->schema >= 4 ? sql : a->schema >= 2 ? sql_v2 : sql_v1, &st));
	sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_reset(st);
		if (rc == SQLITE_DONE)
			return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such file in archive %s", path, a->dir);
		return ulp_db_err(a, "file lookup");
	}
	ulp_stat_from_row(st, out);
	int64_t id = sqlite3_column_int64(st, ULP_ENTRY_NCOLS);
	size_t hl = (size_t)sqlite3_column_bytes(st, ULP_ENTRY_NCOLS + 1);
	uint8_t *h = NULL;
	if (hl) {
		h = malloc(hl);
		if (!h) {
			sqlite3_reset(st);
			return -ULP_E_NOMEM;
		}
		memcpy(h, sqlite3_column_blob(st, ULP_ENTRY_NCOLS + 1), hl);
		/* invariant 5: the header is checked before anything serves it */
		uint8_t sha[ULP_SHA256_LEN];
		ulp_sha256(h, hl, sha);
		if (a->schema >= 2 && (sqlite3_column_bytes(st, ULP_ENTRY_NCOLS + 2) != ULP_SHA256_LEN ||
		                       memcmp(sqlite3_column_blob(st, ULP_ENTRY_NCOLS + 2), sha, ULP_SHA256_LEN) != 0)) {
			sqlite3_reset(st);
			free(h);
			return ulp_arch_err(a, -ULP_E_CHECKSUM,
			                    "%s: its safetensors header in %s/ulpack.db does not match its sha256", path,
			                    a->dir);
		}
	}
	sqlite3_reset(st);
	if ((rc = ulp_db_stmt(a, sql_ext, &st)) < 0) {
		free(h);
		return rc;
	}
	sqlite3_bind_int64(st, 1, id);
	ulp_extent *x = NULL;
	size_t n = 0, cap = 0;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (ulp_grow(&x, &cap, n, sizeof(*x)) < 0) {
			rc = SQLITE_NOMEM;
			break;
		}
		x[n].offset = (uint64_t)sqlite3_column_int64(st, 0);
		x[n].length = (uint64_t)sqlite3_column_int64(st, 1);
		if (sqlite3_column_bytes(st, 2) != ULP_SHA256_LEN) {
			rc = SQLITE_CORRUPT;
			break;
		}
		memcpy(x[n++].content, sqlite3_column_blob(st, 2), ULP_SHA256_LEN);
	}
	sqlite3_reset(st);
	if (rc != SQLITE_DONE) {
		free(h);
		free(x);
		if (rc == SQLITE_NOMEM)
			return ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory reading its extents", path);
		if (rc != SQLITE_CORRUPT)
			return ulp_db_err(a, "extents lookup");
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: bad extents in the index", path);
	}
	*header = h;
	*header_len = hl;
	*ext = x;
	*n_ext = n;
	return 0;
}

/* One statement of ulp_index_scan: each row to row(); stops at its error. */
static int scan_rows(ulp_archive *a, const char *sql, int (*row)(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs,
                                                                  void *arg),
                     const ulp_index_scan_cbs *cbs, void *arg)
{
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	int rc, r = 0;
	while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW)
		r = row(st, cbs, arg);
	sqlite3_reset(st);
	if (r < 0)
		return r;
	return rc == SQLITE_DONE ? 0 : ulp_db_err(a, "file table scan");
}

static int scan_counts(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs, void *arg)
{
	return cbs->counts(arg, (uint64_t)sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1),
	                   (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3));
}

static int scan_pack(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs, void *arg)
{
	const char *name = (const char *)sqlite3_column_text(st, 1);
	return cbs->pack(arg, sqlite3_column_int64(st, 0), name ? name : "", (uint64_t)sqlite3_column_int64(st, 2));
}

static int scan_blob(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs, void *arg)
{
	if (sqlite3_column_bytes(st, 1) != ULP_SHA256_LEN)
		return 0; /* a damaged row: left out, so the index's lookup reports it */
	const uint8_t *ref = sqlite3_column_bytes(st, 2) == ULP_SHA256_LEN ? sqlite3_column_blob(st, 2) : NULL;
	return cbs->blob(arg, sqlite3_column_int64(st, 0), sqlite3_column_blob(st, 1), ref, sqlite3_column_int64(st, 3),
	                 (uint64_t)sqlite3_column_int64(st, 4), (uint64_t)sqlite3_column_int64(st, 5));
}

static int scan_entry(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs, void *arg)
{
	ulp_stat s;
	ulp_stat_from_row(st, &s);
	const char *path = (const char *)sqlite3_column_text(st, ULP_ENTRY_NCOLS + 1);
	size_t hl = (size_t)sqlite3_column_bytes(st, ULP_ENTRY_NCOLS + 2);
	const uint8_t *sha = sqlite3_column_bytes(st, ULP_ENTRY_NCOLS + 3) == ULP_SHA256_LEN
	                     ? sqlite3_column_blob(st, ULP_ENTRY_NCOLS + 3) : NULL;
	return cbs->entry(arg, sqlite3_column_int64(st, ULP_ENTRY_NCOLS), path ? path : "", &s,
	                  hl ? sqlite3_column_blob(st, ULP_ENTRY_NCOLS + 2) : NULL, hl, sha);
}

static int scan_extent(sqlite3_stmt *st, const ulp_index_scan_cbs *cbs, void *arg)
{
	return cbs->extent(arg, sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1),
	                   (uint64_t)sqlite3_column_int64(st, 2), sqlite3_column_int64(st, 3));
}

int ulp_index_scan(ulp_archive *a, const ulp_index_scan_cbs *cbs, void *arg)
{
	static const char sql_counts[] = "SELECT (SELECT count(*) FROM packs), (SELECT count(*) FROM blobs),"
	                                 " (SELECT count(*) FROM entries), (SELECT count(*) FROM extents)";
	static const char sql_packs[] = "SELECT id, name, size FROM packs ORDER BY id";
	static const char sql_blobs[] = "SELECT id, content, ref, pack, offset, stored_size FROM blobs ORDER BY id";
	static const char sql_ent[] = "SELECT " ULP_ENTRY_COLS ", id, path, header, header_sha FROM entries ORDER BY id";
	static const char sql_ent_v2[] = "SELECT " ULP_ENTRY_COLS_V2 ", id, path, header, header_sha FROM entries"
	                                 " ORDER BY id";
	static const char sql_ent_v1[] = "SELECT " ULP_ENTRY_COLS_V2 ", id, path, header, NULL FROM entries ORDER BY id";
	static const char sql_ext[] = "SELECT file, offset, length, blob FROM extents ORDER BY file, offset";
	sqlite3 *db = ulp_db(a);
	if (!db)
		return ulp_db_err(a, "open");
	int own = sqlite3_get_autocommit(db); /* one snapshot for all four, unless in one already */
	if (own)
		ULP_TRY(ulp_db_exec(a, "BEGIN"));
	int rc = scan_rows(a, sql_counts, scan_counts, cbs, arg);
	if (rc == 0)
		rc = scan_rows(a, sql_packs, scan_pack, cbs, arg);
	if (rc == 0)
		rc = scan_rows(a, sql_blobs, scan_blob, cbs, arg);
	if (rc == 0)
		rc = scan_rows(a, a->schema >= 4 ? sql_ent : a->schema >= 2 ? sql_ent_v2 : sql_ent_v1, scan_entry, cbs, arg);
	if (rc == 0)
		rc = scan_rows(a, sql_ext, scan_extent, cbs, arg);
	if (own)
		sqlite3_exec(db, "COMMIT", NULL, NULL, NULL); /* a read: nothing to lose */
	return rc;
}

/* ---- writing ------------------------------------------------------------ */

/* Binds time t to parameters ns (as mtime_ns) and sec, sec + 1 (mtime_sec,
 * mtime_nsec): invariant 6. */
void ulp_index_bind_time(sqlite3_stmt *st, int ns, int sec, ulp_time t)
{
	sqlite3_bind_int64(st, ns, ulp_time_ns(t.sec, t.nsec));
	sqlite3_bind_int64(st, sec, t.sec);
	sqlite3_bind_int64(st, sec + 1, t.nsec);
}

int ulp_index_mkdirs(ulp_archive *a, const char *path, ulp_time mtime)
{
	static const char sql[] = "INSERT OR IGNORE INTO entries(path, parent, name, type, mode, mtime_ns,"
	                          " mtime_sec, mtime_nsec) VALUES(?, ?, ?, 1, 493, ?, ?, ?)";
	static const char sql_type[] = "SELECT type FROM entries WHERE path = ?";
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *s = buf; (s = strchr(s, '/')); s++) {
		*s = 0;
		sqlite3_stmt *st;
		ULP_TRY(ulp_db_stmt(a, sql_type, &st));
		sqlite3_bind_text(st, 1, buf, -1, SQLITE_STATIC);
		int rc = sqlite3_step(st);
		int type = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
		sqlite3_reset(st);
		if (rc != SQLITE_ROW && rc != SQLITE_DONE)
			return ulp_db_err(a, "directory lookup");
		if (type >= 0 && type != ULP_ENT_DIR)
			return ulp_arch_err(a, -ULP_E_NOTDIR, "%s: a component of the path is not a directory", buf);
		if (type < 0) {
			char *parent = ulp_path_parent(buf);
			if (!parent)
				return ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", buf);
			if ((rc = ulp_db_stmt(a, sql, &st)) < 0) {
				free(parent);
				return rc;
			}
			sqlite3_bind_text(st, 1, buf, -1, SQLITE_STATIC);
			sqlite3_bind_text(st, 2, parent, -1, SQLITE_STATIC);
			sqlite3_bind_text(st, 3, ulp_path_name(buf), -1, SQLITE_STATIC);
			ulp_index_bind_time(st, 4, 5, mtime);
			rc = sqlite3_step(st);
			sqlite3_reset(st);
			free(parent);
			if (rc != SQLITE_DONE)
				return ulp_db_err(a, "mkdir");
		}
		*s = '/';
	}
	return 0;
}

int ulp_index_series_steps(ulp_archive *a, const char *series,
                           int (*cb)(void *arg, int64_t id, int64_t step, const char *path), void *arg)
{
	static const char sql[] = "SELECT id, step, path FROM entries WHERE series = ? AND type = 0 AND kind <> 0"
	                          " ORDER BY step, path";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "series steps");
	sqlite3_bind_text(st, 1, series, -1, SQLITE_STATIC);
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW)
		rc = cb(arg, sqlite3_column_int64(st, 0), sqlite3_column_int64(st, 1),
		        (const char *)sqlite3_column_text(st, 2));
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "series steps");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_nearest(ulp_archive *a, const char *series, int64_t step, const char *path,
                      int64_t *id, char *ref_path, size_t cap)
{
	static const char sql[] = "SELECT id, path FROM entries WHERE series = ? AND type = 0 AND kind <> 0"
	                          " AND path <> ? ORDER BY abs(step - ?), step LIMIT 1";
	*id = -1;
	ref_path[0] = 0;
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, series, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, path, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 3, step);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		*id = sqlite3_column_int64(st, 0);
		snprintf(ref_path, cap, "%s", (const char *)sqlite3_column_text(st, 1));
	}
	sqlite3_reset(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : ulp_db_err(a, "reference lookup");
}

int ulp_index_tensor(ulp_archive *a, int64_t file, const char *name, int dtype, uint64_t length,
                     uint8_t content[ULP_SHA256_LEN], ulp_blobrow *row)
{
	static const char sql[] = "SELECT b.content FROM extents e JOIN blobs b ON b.id = e.blob"
	                          " WHERE e.file = ? AND e.name = ? AND e.dtype = ? AND e.length = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, file);
	sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 3, dtype);
	sqlite3_bind_int64(st, 4, (sqlite3_int64)length);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW || sqlite3_column_bytes(st, 0) != ULP_SHA256_LEN) {
		sqlite3_reset(st);
		return -ULP_E_NOENT;
	}
	memcpy(content, sqlite3_column_blob(st, 0), ULP_SHA256_LEN);
	sqlite3_reset(st);
	return ulp_index_blob(a, content, row);
}

int ulp_index_put_file(ulp_archive *a, const ulp_newfile *f, const char *pack_name,
                       uint64_t pack_size, const ulp_newblob *b, size_t nb, const ulp_newext *x,
                       size_t nx)
{
	static const char sql_blob[] = "INSERT OR IGNORE INTO blobs(content, codec, ref, depth, raw_size,"
	                               " stored_size, pack, offset) VALUES(?, ?, ?, ?, ?, ?, ?, ?)";
	static const char sql_old[] = "SELECT type FROM entries WHERE path = ?";
	static const char sql_del[] = "DELETE FROM entries WHERE path = ?";
	static const char sql_ent[] = "INSERT INTO entries(path, parent, name, type, size, mode, uid, gid,"
	                              " mtime_ns, sha256, kind, header, run, series, step, target, stored,"
	                              " depth, anchor, header_sha, mtime_sec, mtime_nsec)"
	                              " VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
	static const char sql_ext[] = "INSERT INTO extents(file, offset, length, blob, name, dtype)"
	                              " VALUES(?, ?, ?, (SELECT id FROM blobs WHERE content = ?), ?, ?)";
	sqlite3_stmt *st;
	int rc;
	ULP_TRY(ulp_index_mkdirs(a, f->path, f->meta.mtime));
	ULP_TRY(ulp_db_stmt(a, sql_old, &st));
	sqlite3_bind_text(st, 1, f->path, -1, SQLITE_STATIC);
	rc = sqlite3_step(st);
	int old = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : -1;
	sqlite3_reset(st);
	if (rc != SQLITE_ROW && rc != SQLITE_DONE)
		return ulp_db_err(a, "file lookup");
	if (old == ULP_ENT_DIR)
		return ulp_arch_err(a, -ULP_E_EXIST, "%s: is a directory", f->path);
	int64_t pack = 0;
	if (pack_name)
		ULP_TRY(ulp_index_pack_add(a, pack_name, pack_size, &pack)); /* invariants 7, 8 */
	for (size_t i = 0; i < nb; i++) {
		ULP_TRY(ulp_db_stmt(a, sql_blob, &st));
		sqlite3_bind_blob(st, 1, b[i].content, ULP_SHA256_LEN, SQLITE_STATIC);
		sqlite3_bind_int(st, 2, b[i].codec);
		if (b[i].has_ref)
			sqlite3_bind_blob(st, 3, b[i].ref, ULP_SHA256_LEN, SQLITE_STATIC);
		sqlite3_bind_int(st, 4, (int)b[i].depth);
		sqlite3_bind_int64(st, 5, (sqlite3_int64)b[i].raw);
		sqlite3_bind_int64(st, 6, (sqlite3_int64)b[i].stored);
		sqlite3_bind_int64(st, 7, pack);
		sqlite3_bind_int64(st, 8, (sqlite3_int64)b[i].offset);
		ULP_TRY(ulp_db_step_rc(a, st, "insert blob"));
	}
	if (old >= 0) {
		ULP_TRY(ulp_db_stmt(a, sql_del, &st));
		sqlite3_bind_text(st, 1, f->path, -1, SQLITE_STATIC);
		ULP_TRY(ulp_db_step_rc(a, st, "replace file"));
	}
	char *parent = ulp_path_parent(f->path), *series = NULL;
	int64_t step = ulp_parse_step(f->path, &series);
	const char *slash = strchr(f->path, '/');
	rc = !parent || (step >= 0 && !series) ? ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", f->path)
	                                       : ulp_db_stmt(a, sql_ent, &st);
	if (rc < 0) {
		free(parent);
		free(series);
		return rc;
	}
	sqlite3_bind_text(st, 1, f->path, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 2, parent, -1, SQLITE_STATIC);
	sqlite3_bind_text(st, 3, ulp_path_name(f->path), -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 4, f->type);
	sqlite3_bind_int64(st, 5, (sqlite3_int64)f->size);
	sqlite3_bind_int(st, 6, (int)(f->meta.mode & 07777));
	sqlite3_bind_int64(st, 7, f->meta.uid);
	sqlite3_bind_int64(st, 8, f->meta.gid);
	ulp_index_bind_time(st, 9, 21, f->meta.mtime);
	if (f->type == ULP_ENT_FILE)
		sqlite3_bind_blob(st, 10, f->sha, ULP_SHA256_LEN, SQLITE_STATIC);
	sqlite3_bind_int(st, 11, f->kind);
	uint8_t hsha[ULP_SHA256_LEN];
	if (f->header_len) {
		sqlite3_bind_blob(st, 12, f->header, (int)f->header_len, SQLITE_STATIC);
		ulp_sha256(f->header, f->header_len, hsha);
		sqlite3_bind_blob(st, 20, hsha, ULP_SHA256_LEN, SQLITE_STATIC);
	}
	sqlite3_bind_text(st, 13, f->path, slash ? (int)(slash - f->path) : -1, SQLITE_STATIC);
	if (series)
		sqlite3_bind_text(st, 14, series, -1, SQLITE_STATIC);
	if (step >= 0)
		sqlite3_bind_int64(st, 15, step);
	if (f->target)
		sqlite3_bind_text(st, 16, f->target, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 17, (sqlite3_int64)f->stored);
	sqlite3_bind_int(st, 18, (int)f->depth);
	sqlite3_bind_int(st, 19, f->anchor);
	rc = ulp_db_step_rc(a, st, "insert file");
	free(parent);
	free(series);
	if (rc < 0)
		return rc;
	int64_t id = sqlite3_last_insert_rowid(ulp_db(a));
	for (size_t i = 0; i < nx; i++) {
		ULP_TRY(ulp_db_stmt(a, sql_ext, &st));
		sqlite3_bind_int64(st, 1, id);
		sqlite3_bind_int64(st, 2, (sqlite3_int64)x[i].offset);
		sqlite3_bind_int64(st, 3, (sqlite3_int64)x[i].length);
		sqlite3_bind_blob(st, 4, x[i].content, ULP_SHA256_LEN, SQLITE_STATIC);
		if (x[i].name)
			sqlite3_bind_text(st, 5, x[i].name, -1, SQLITE_STATIC);
		if (x[i].dtype >= 0)
			sqlite3_bind_int(st, 6, x[i].dtype);
		ULP_TRY(ulp_db_step_rc(a, st, "insert extent"));
	}
	return 0;
}

/* ---- listing, reports and gc support ---------------------------------------- */

int ulp_index_files(ulp_archive *a, const char *prefix,
                    int (*cb)(void *arg, const char *path, const ulp_stat *st), void *arg)
{
#define FILES_SQL(cols) "SELECT " cols ", path FROM entries WHERE type = 0 AND" \
	                        " (?1 = '' OR path = ?1 OR " ULP_BELOW("path", "?1") ")" \
	                        " ORDER BY step IS NOT NULL, step, path"
	static const char sql[] = FILES_SQL(ULP_ENTRY_COLS), sql_v2[] = FILES_SQL(ULP_ENTRY_COLS_V2);
	char p[4096];
	ULP_TRY(ulp_arch_path(a, prefix, p, sizeof(p)));
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, a->schema >= 4 ? sql : sql_v2, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "list files");
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	int rc = 0, r;
	while ((r = sqlite3_step(st)) == SQLITE_ROW) {
		ulp_stat s;
		ulp_stat_from_row(st, &s);
		if ((rc = cb(arg, (const char *)sqlite3_column_text(st, ULP_ENTRY_NCOLS), &s)) != 0)
			break;
	}
	if (r != SQLITE_ROW && r != SQLITE_DONE)
		rc = ulp_db_err(a, "list files");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_orphans(ulp_archive *a, const char *prefix,
                      void (*cb)(void *arg, const char *path, const char *why), void *arg)
{
	/* invariant 4, one row at a time: a row whose path is its parent's path
	 * and its name, whose parent is a directory row, is reached from the root
	 * by induction on the path's length */
	static const char sql[] =
		"SELECT e.path, e.type, e.parent FROM entries e WHERE e.path <> '' AND"
		" (?1 = '' OR e.path = ?1 OR " ULP_BELOW("e.path", "?1") ") AND"
		" (e.name = '' OR instr(e.name, '/') > 0 OR"
		" CAST(e.path AS BLOB) <> CAST(CASE WHEN e.parent = '' THEN e.name ELSE e.parent || '/' || e.name END AS BLOB)"
		" OR NOT EXISTS (SELECT 1 FROM entries d WHERE d.path = e.parent AND d.type = 1))"
		" ORDER BY e.path";
	char p[4096];
	ULP_TRY(ulp_arch_path(a, prefix, p, sizeof(p)));
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "orphan scan");
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	int64_t n = 0;
	int r;
	while ((r = sqlite3_step(st)) == SQLITE_ROW) {
		int type = sqlite3_column_int(st, 1);
		char why[4400];
		snprintf(why, sizeof(why),
		         "%s/ulpack.db: orphaned %s: no directory reaches it (its parent \"%s\" is not a directory"
		         " of the index, or its path does not match its parent and name)",
		         a->dir, type == ULP_ENT_DIR ? "directory" : type == ULP_ENT_LINK ? "symbolic link" : "file",
		         (const char *)sqlite3_column_text(st, 2));
		n++;
		if (cb)
			cb(arg, (const char *)sqlite3_column_text(st, 0), why);
	}
	int rc = r == SQLITE_DONE ? (int)ULP_MIN(n, INT32_MAX) : ulp_db_err(a, "orphan scan");
	sqlite3_finalize(st);
	return rc;
}

struct tally_ctx {
	int (*cb)(void *, const char *, const ulp_stat *);
	void *arg;
	ulp_report *r;
};

static int tally(void *x, const char *path, const ulp_stat *s)
{
	struct tally_ctx *c = x;
	c->r->files++;
	c->r->raw_bytes += s->size;
	c->r->stored_bytes += s->stored_bytes;
	return c->cb ? c->cb(c->arg, path, s) : 0;
}

int ulp_archive_report(ulp_archive *a, const char *prefix,
                       int (*per_file)(void *arg, const char *path, const ulp_stat *st), void *arg,
                       ulp_report *out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	static const char sql_dt[] =
		"WITH f AS (SELECT id FROM entries WHERE type = 0 AND (?1 = '' OR path = ?1 OR "
		ULP_BELOW("path", "?1") ")),"
		" x AS (SELECT e.blob, e.dtype, e.length FROM extents e JOIN f ON f.id = e.file)"
		" SELECT x.dtype, sum(x.length), (SELECT sum(b.stored_size) FROM blobs b WHERE b.id IN"
		" (SELECT blob FROM x x2 WHERE x2.dtype IS x.dtype)), count(*),"
		" (SELECT count(*) FROM blobs b WHERE b.depth > 0 AND b.id IN (SELECT blob FROM x x2 WHERE x2.dtype IS x.dtype)),"
		" (SELECT count(*) FROM blobs b WHERE b.depth = 0 AND b.id IN (SELECT blob FROM x x2 WHERE x2.dtype IS x.dtype))"
		" FROM x GROUP BY x.dtype";
	static const char sql_tot[] =
		"SELECT (SELECT count(*) FROM entries WHERE type = 1), (SELECT count(*) FROM blobs),"
		" (SELECT coalesce(sum(size), 0) FROM packs), (SELECT coalesce(max(depth), 0) FROM blobs)";
	memset(out, 0, sizeof(*out));
	char p[4096];
	ULP_TRY(ulp_arch_path(a, prefix, p, sizeof(p)));
	struct tally_ctx c = {per_file, arg, out};
	ULP_TRY(ulp_index_files(a, p, tally, &c));
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql_dt, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "report");
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	while (sqlite3_step(st) == SQLITE_ROW) {
		uint64_t raw = (uint64_t)sqlite3_column_int64(st, 1), stored = (uint64_t)sqlite3_column_int64(st, 2);
		if (sqlite3_column_type(st, 0) == SQLITE_NULL) {
			out->opaque_raw += raw;
			out->opaque_stored += stored;
			continue;
		}
		int dt = sqlite3_column_int(st, 0);
		if (dt < 0 || dt >= ULP_DT__COUNT)
			continue;
		ulp_dtype_total *d = &out->by_dtype[dt];
		d->raw_bytes = raw;
		d->stored_bytes = stored;
		d->elements = raw / ulp_dtype_size((ulp_dtype)dt);
		d->tensors = (uint64_t)sqlite3_column_int64(st, 3);
		d->deltas = (uint64_t)sqlite3_column_int64(st, 4);
		d->anchors = (uint64_t)sqlite3_column_int64(st, 5);
	}
	sqlite3_finalize(st);
	if (sqlite3_prepare_v2(db, sql_tot, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "report");
	if (sqlite3_step(st) == SQLITE_ROW) {
		out->dirs = (uint64_t)sqlite3_column_int64(st, 0);
		out->blobs = (uint64_t)sqlite3_column_int64(st, 1);
		out->pack_bytes = (uint64_t)sqlite3_column_int64(st, 2);
		out->max_chain_depth = (unsigned)sqlite3_column_int(st, 3);
	}
	sqlite3_finalize(st);
	return 0;
}

/* The blobs a file or a chain needs: gc invariant 1 (maint.c). */
#define LIVE_CTE \
	"WITH RECURSIVE live(content) AS (SELECT b.content FROM extents e JOIN blobs b ON b.id = e.blob" \
	" UNION SELECT b.ref FROM blobs b JOIN live l ON b.content = l.content WHERE b.ref IS NOT NULL)"

int ulp_index_gc_sweep(ulp_archive *a, uint64_t *removed)
{
	static const char sql[] = LIVE_CTE " DELETE FROM blobs WHERE content NOT IN (SELECT content FROM live)";
	ULP_TRY(ulp_db_exec(a, sql));
	*removed = (uint64_t)sqlite3_changes(ulp_db(a));
	return 0;
}

int ulp_index_packs(ulp_archive *a, int (*cb)(void *arg, int64_t id, const char *name, uint64_t size,
                                              uint64_t live_bytes, uint64_t live_blobs), void *arg)
{
	static const char sql[] = "SELECT p.id, p.name, p.size, coalesce(sum(b.stored_size), 0), count(b.id)"
	                          " FROM packs p LEFT JOIN blobs b ON b.pack = p.id GROUP BY p.id ORDER BY p.id";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "packs");
	int rc = 0;
	while (rc == 0 && sqlite3_step(st) == SQLITE_ROW)
		rc = cb(arg, sqlite3_column_int64(st, 0), (const char *)sqlite3_column_text(st, 1),
		        (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3),
		        (uint64_t)sqlite3_column_int64(st, 4));
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_pack(ulp_archive *a, int64_t id, uint64_t *size, uint64_t *live_bytes, uint64_t *live_blobs)
{
	static const char sql[] = "SELECT p.size, coalesce(sum(b.stored_size), 0), count(b.id)"
	                          " FROM packs p LEFT JOIN blobs b ON b.pack = p.id WHERE p.id = ? GROUP BY p.id";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, id);
	int r = sqlite3_step(st);
	if (r == SQLITE_ROW) {
		*size = (uint64_t)sqlite3_column_int64(st, 0);
		*live_bytes = (uint64_t)sqlite3_column_int64(st, 1);
		*live_blobs = (uint64_t)sqlite3_column_int64(st, 2);
	}
	sqlite3_reset(st);
	return r == SQLITE_ROW ? 1 : r == SQLITE_DONE ? 0 : ulp_db_err(a, "pack");
}

int ulp_index_pack_blobs(ulp_archive *a, int64_t pack,
                         int (*cb)(void *arg, const uint8_t *content, uint64_t offset, uint64_t stored),
                         void *arg)
{
	static const char sql[] = "SELECT content, offset, stored_size FROM blobs WHERE pack = ? ORDER BY offset";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "pack blobs");
	sqlite3_bind_int64(st, 1, pack);
	int rc = 0;
	while (rc == 0 && sqlite3_step(st) == SQLITE_ROW)
		rc = cb(arg, sqlite3_column_blob(st, 0), (uint64_t)sqlite3_column_int64(st, 1),
		        (uint64_t)sqlite3_column_int64(st, 2));
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_pack_add(ulp_archive *a, const char *name, uint64_t size, int64_t *id)
{
	/* a pack's name is a digest of its blobs' digests and lengths in order:
	 * a row of that name is a pack of the same bytes (same blobs at the
	 * same offsets), which the caller's rows may name as well */
	/* invariant 8: an id is never given twice (meta pack_seq: the last one) */
	static const char sql[] = "INSERT INTO packs(id, name, size) VALUES(1 + max("
	                          "ifnull((SELECT max(id) FROM packs), 0),"
	                          " ifnull((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'pack_seq'), 0)), ?, ?)"
	                          " ON CONFLICT(name) DO NOTHING";
	static const char sql_seq[] = "INSERT INTO meta VALUES('pack_seq', ?) ON CONFLICT(key) DO UPDATE"
	                              " SET value = excluded.value";
	static const char sql_id[] = "SELECT id FROM packs WHERE name = ?";
	static const char sql_kept[] = "DELETE FROM pack_grace WHERE name = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)size);
	ULP_TRY(ulp_db_step_rc(a, st, "insert pack"));
	if (sqlite3_changes(ulp_db(a)) > 0) {
		sqlite3_int64 nid = sqlite3_last_insert_rowid(ulp_db(a));
		ULP_TRY(ulp_db_stmt(a, sql_seq, &st));
		sqlite3_bind_int64(st, 1, nid);
		ULP_TRY(ulp_db_step_rc(a, st, "pack_seq"));
	}
	if (a->sh) { /* a pack of these bytes kept for the grace is named again: it stays */
		ULP_TRY(ulp_db_stmt(a, sql_kept, &st));
		sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
		ULP_TRY(ulp_db_step_rc(a, st, "pack_grace"));
	}
	ULP_TRY(ulp_db_stmt(a, sql_id, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	int r = sqlite3_step(st);
	*id = r == SQLITE_ROW ? sqlite3_column_int64(st, 0) : -1;
	sqlite3_reset(st);
	return r == SQLITE_ROW ? 0 : ulp_db_err(a, "pack lookup");
}

int ulp_index_blob_move(ulp_archive *a, const uint8_t *content, int64_t pack, uint64_t offset)
{
	static const char sql[] = "UPDATE blobs SET pack = ?, offset = ? WHERE content = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, pack);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)offset);
	sqlite3_bind_blob(st, 3, content, ULP_SHA256_LEN, SQLITE_STATIC);
	return ulp_db_step_rc(a, st, "move blob");
}

int ulp_index_pack_drop(ulp_archive *a, int64_t pack)
{
	static const char sql[] = "DELETE FROM packs WHERE id = ? AND NOT EXISTS (SELECT 1 FROM blobs WHERE pack = ?)";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, pack);
	sqlite3_bind_int64(st, 2, pack);
	return ulp_db_step_rc(a, st, "drop pack");
}

int ulp_index_has_pack(ulp_archive *a, const char *name)
{
	static const char sql[] = "SELECT 1 FROM packs WHERE name = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	int r = sqlite3_step(st);
	sqlite3_reset(st);
	/* an error is not "no such pack": gc would delete a live pack */
	return r == SQLITE_ROW ? 1 : r == SQLITE_DONE ? 0 : ulp_db_err(a, "pack lookup");
}

int ulp_index_file_blobs(ulp_archive *a, const char *path,
                         int (*cb)(void *arg, const uint8_t *content, int64_t pack, uint64_t offset,
                                   uint64_t stored),
                         void *arg)
{
	static const char sql[] =
		"WITH RECURSIVE c(id) AS (SELECT x.blob FROM extents x JOIN entries e ON e.id = x.file"
		" WHERE e.path = ? UNION SELECT r.id FROM blobs b JOIN c ON b.id = c.id JOIN blobs r ON r.content = b.ref)"
		" SELECT b.content, b.pack, b.offset, b.stored_size FROM blobs b JOIN c ON b.id = c.id";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
	int rc, r = 0;
	while (r == 0 && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(st, 0) != ULP_SHA256_LEN)
			continue; /* a damaged row: the read reports it */
		r = cb(arg, sqlite3_column_blob(st, 0), sqlite3_column_int64(st, 1),
		       (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3));
	}
	sqlite3_reset(st);
	if (r < 0)
		return r;
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : ulp_db_err(a, "file blobs lookup");
}

/* ---- re-basing support (recode.c) ----------------------------------------- */

int ulp_index_blob_ref(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN], ulp_rbblob *out)
{
	static const char sql[] = "SELECT ref, depth, codec, pack, offset, stored_size, raw_size FROM blobs"
	                          " WHERE content = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_blob(st, 1, content, ULP_SHA256_LEN, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_reset(st);
		return rc == SQLITE_DONE ? -ULP_E_NOENT : ulp_db_err(a, "blob lookup");
	}
	ulp_rbblob b;
	memset(&b, 0, sizeof(b));
	memcpy(b.content, content, ULP_SHA256_LEN);
	b.has_ref = sqlite3_column_bytes(st, 0) == ULP_SHA256_LEN;
	if (b.has_ref)
		memcpy(b.ref, sqlite3_column_blob(st, 0), ULP_SHA256_LEN);
	b.depth = (unsigned)sqlite3_column_int(st, 1);
	b.codec = sqlite3_column_int(st, 2);
	b.pack = sqlite3_column_int64(st, 3);
	b.offset = (uint64_t)sqlite3_column_int64(st, 4);
	b.stored = (uint64_t)sqlite3_column_int64(st, 5);
	b.raw = (uint64_t)sqlite3_column_int64(st, 6);
	sqlite3_reset(st);
	*out = b;
	return 0;
}

int ulp_index_height(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN], int live_only, unsigned *h)
{
	/* UNION, not UNION ALL: a damaged index with a cycle still ends */
	static const char sql[] =
		"WITH RECURSIVE d(c, h) AS (SELECT ?1, 0 UNION SELECT b.content, d.h + 1 FROM blobs b JOIN d ON b.ref = d.c"
		" WHERE d.h < 4096 AND (?2 = 0 OR EXISTS (SELECT 1 FROM extents x WHERE x.blob = b.id)))"
		" SELECT max(h) FROM d";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_blob(st, 1, content, ULP_SHA256_LEN, SQLITE_STATIC);
	sqlite3_bind_int(st, 2, live_only);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*h = (unsigned)sqlite3_column_int(st, 0);
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? 0 : ulp_db_err(a, "dependents lookup");
}

int ulp_index_blob_used(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN])
{
	static const char sql[] = "SELECT EXISTS (SELECT 1 FROM extents x JOIN blobs b ON b.id = x.blob"
	                          " WHERE b.content = ?)";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_blob(st, 1, content, ULP_SHA256_LEN, SQLITE_STATIC);
	int rc = sqlite3_step(st), used = rc == SQLITE_ROW ? sqlite3_column_int(st, 0) : 0;
	sqlite3_reset(st);
	return rc == SQLITE_ROW ? used : ulp_db_err(a, "blob use lookup");
}

int ulp_index_file_tensors(ulp_archive *a, int64_t file,
                           int (*cb)(void *arg, const ulp_rbtensor *t), void *arg)
{
	static const char sql[] = "SELECT e.path, e.series, e.step, x.name, x.dtype, x.length, b.content"
	                          " FROM entries e JOIN extents x ON x.file = e.id JOIN blobs b ON b.id = x.blob"
	                          " WHERE e.id = ? AND x.name IS NOT NULL AND x.length > 0 ORDER BY x.offset";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "file tensors");
	sqlite3_bind_int64(st, 1, file);
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
		if (sqlite3_column_type(st, 1) == SQLITE_NULL || sqlite3_column_bytes(st, 6) != ULP_SHA256_LEN)
			continue;
		ulp_rbtensor t = {.file = file, .path = (const char *)sqlite3_column_text(st, 0),
		                  .series = (const char *)sqlite3_column_text(st, 1),
		                  .step = sqlite3_column_int64(st, 2), .name = (const char *)sqlite3_column_text(st, 3),
		                  .dtype = sqlite3_column_int(st, 4), .length = (uint64_t)sqlite3_column_int64(st, 5)};
		memcpy(t.content, sqlite3_column_blob(st, 6), ULP_SHA256_LEN);
		rc = cb(arg, &t);
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "file tensors");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_orphan_deps(ulp_archive *a, int (*cb)(void *arg, const ulp_rbtensor *t), void *arg)
{
	/* live blobs (an extent uses them) whose reference no extent uses: once
	 * they are re-based, gc drops the reference and everything only it needed;
	 * each with the first file (in step order) that uses it as a tensor */
	static const char sql[] =
		"SELECT e.id, e.path, e.series, e.step, x.name, x.dtype, x.length, d.content FROM blobs d"
		" JOIN blobs r ON r.content = d.ref"
		" JOIN extents x ON x.blob = d.id JOIN entries e ON e.id = x.file"
		" WHERE NOT EXISTS (SELECT 1 FROM extents y WHERE y.blob = r.id) AND x.name IS NOT NULL"
		" ORDER BY e.step IS NULL, e.step, e.path, x.offset";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "orphaned references");
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
		if (sqlite3_column_bytes(st, 7) != ULP_SHA256_LEN)
			continue;
		ulp_rbtensor t = {.file = sqlite3_column_int64(st, 0), .path = (const char *)sqlite3_column_text(st, 1),
		                  .series = (const char *)sqlite3_column_text(st, 2),
		                  .step = sqlite3_column_type(st, 3) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, 3),
		                  .name = (const char *)sqlite3_column_text(st, 4), .dtype = sqlite3_column_int(st, 5),
		                  .length = (uint64_t)sqlite3_column_int64(st, 6)};
		memcpy(t.content, sqlite3_column_blob(st, 7), ULP_SHA256_LEN);
		rc = cb(arg, &t);
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "orphaned references");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_candidates(ulp_archive *a, const ulp_rbtensor *t, uint8_t (*out)[ULP_SHA256_LEN], size_t max,
                         size_t *n)
{
	static const char sql[] =
		"SELECT b.content FROM entries e JOIN extents x ON x.file = e.id JOIN blobs b ON b.id = x.blob"
		" WHERE e.series = ?1 AND e.type = 0 AND e.kind <> 0 AND e.id <> ?2 AND x.name = ?3 AND x.dtype = ?4"
		" AND x.length = ?5 AND b.content <> ?6 ORDER BY abs(e.step - ?7), e.step, e.path LIMIT ?8";
	*n = 0;
	if (!t->series)
		return 0;
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, t->series, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, t->file);
	sqlite3_bind_text(st, 3, t->name, -1, SQLITE_STATIC);
	sqlite3_bind_int(st, 4, t->dtype);
	sqlite3_bind_int64(st, 5, (sqlite3_int64)t->length);
	sqlite3_bind_blob(st, 6, t->content, ULP_SHA256_LEN, SQLITE_STATIC);
	sqlite3_bind_int64(st, 7, t->step);
	sqlite3_bind_int64(st, 8, (sqlite3_int64)max);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW)
		if (sqlite3_column_bytes(st, 0) == ULP_SHA256_LEN)
			memcpy(out[(*n)++], sqlite3_column_blob(st, 0), ULP_SHA256_LEN);
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : ulp_db_err(a, "reference candidates");
}

int ulp_index_neighbours(ulp_archive *a, int64_t file, int64_t out[2])
{
	static const char sql[] =
		"SELECT (SELECT n.id FROM entries n WHERE n.series = e.series AND n.type = 0 AND n.kind <> 0"
		"  AND n.id <> e.id AND n.step <= e.step ORDER BY n.step DESC, n.path LIMIT 1),"
		" (SELECT n.id FROM entries n WHERE n.series = e.series AND n.type = 0 AND n.kind <> 0"
		"  AND n.id <> e.id AND n.step >= e.step ORDER BY n.step, n.path LIMIT 1)"
		" FROM entries e WHERE e.id = ? AND e.series IS NOT NULL";
	out[0] = out[1] = -1;
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, file);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		for (int i = 0; i < 2; i++)
			if (sqlite3_column_type(st, i) != SQLITE_NULL)
				out[i] = sqlite3_column_int64(st, i);
	sqlite3_reset(st);
	return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : ulp_db_err(a, "neighbour lookup");
}

int ulp_index_pending(ulp_archive *a, int64_t *ids, int64_t *gens, size_t max, size_t *n)
{
	static const char sql[] = "SELECT file, why FROM rebase_queue ORDER BY file LIMIT ?";
	*n = 0;
	if (a->schema < 3)
		return 0;
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, (sqlite3_int64)max);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		ids[*n] = sqlite3_column_int64(st, 0);
		gens[(*n)++] = sqlite3_column_int64(st, 1);
	}
	sqlite3_reset(st);
	return rc == SQLITE_DONE ? 0 : ulp_db_err(a, "re-basing queue");
}

int ulp_index_pending_done(ulp_archive *a, const int64_t *ids, const int64_t *gens, size_t n)
{
	/* only the change that was handled: one queued meanwhile stays */
	static const char sql[] = "DELETE FROM rebase_queue WHERE file = ? AND why = ?";
	for (size_t i = 0; i < n; i++) {
		sqlite3_stmt *st;
		ULP_TRY(ulp_db_stmt(a, sql, &st));
		sqlite3_bind_int64(st, 1, ids[i]);
		sqlite3_bind_int64(st, 2, gens[i]);
		ULP_TRY(ulp_db_step_rc(a, st, "re-basing queue"));
	}
	return 0;
}

/* 1 if the chain of content from (walking refs as the index says now, in the
 * caller's transaction) reaches content to, 0 if not; *depth receives the
 * chain length of from. */
static int chain_reaches(ulp_archive *a, const uint8_t *from, const uint8_t *to, unsigned *depth)
{
	uint8_t cur[ULP_SHA256_LEN];
	memcpy(cur, from, ULP_SHA256_LEN);
	for (unsigned n = 0; n <= 4096; n++) {
		if (memcmp(cur, to, ULP_SHA256_LEN) == 0)
			return 1;
		ulp_rbblob b;
		ULP_TRY(ulp_index_blob_ref(a, cur, &b));
		if (!b.has_ref) {
			*depth = n;
			return 0;
		}
		memcpy(cur, b.ref, ULP_SHA256_LEN);
	}
	return ulp_arch_err(a, -ULP_E_CORRUPT, "%s/ulpack.db: a delta chain is longer than 4096 links", a->dir);
}

int ulp_index_rebase_apply(ulp_archive *a, const char *pack_name, uint64_t pack_size, ulp_rebased *r,
                           size_t n)
{
	static const char sql_upd[] = "UPDATE blobs SET codec = ?, ref = ?, depth = ?, stored_size = ?, pack = ?,"
	                              " offset = ? WHERE content = ?";
	static const char sql_mark[] = "INSERT OR IGNORE INTO temp.rb_upd VALUES(?)";
	static const char sql_stored[] =
		"UPDATE entries SET stored = max(0, stored + ?1) WHERE id = (SELECT min(x.file) FROM extents x"
		" JOIN blobs b ON b.id = x.blob WHERE b.content = ?2)";
	int64_t pack;
	size_t applied = 0;
	ULP_TRY(ulp_db_exec(a, "CREATE TEMP TABLE IF NOT EXISTS rb_upd(content BLOB PRIMARY KEY);"
	                       "CREATE TEMP TABLE IF NOT EXISTS rb_aff(content BLOB PRIMARY KEY);"
	                       "DELETE FROM temp.rb_upd; DELETE FROM temp.rb_aff;"));
	ULP_TRY(ulp_index_pack_add(a, pack_name, pack_size, &pack));
	for (size_t i = 0; i < n; i++) {
		ulp_rebased *x = &r[i];
		ulp_rbblob now;
		unsigned rdepth = 0;
		x->applied = 0;
		/* invariant 1 of recode.c: only the row that was planned changes */
		int rc = ulp_index_blob_ref(a, x->content, &now);
		if (rc == -ULP_E_NOENT)
			continue;
		ULP_TRY(rc);
		if (now.has_ref != x->old.has_ref || (now.has_ref && memcmp(now.ref, x->old.ref, ULP_SHA256_LEN)) ||
		    now.pack != x->old.pack || now.offset != x->old.offset)
			continue;
		if (x->has_ref) { /* the reference is still there and does not need this blob */
			rc = chain_reaches(a, x->ref, x->content, &rdepth);
			if (rc == -ULP_E_NOENT || rc == 1)
				continue;
			ULP_TRY(rc);
		}
		sqlite3_stmt *st;
		ULP_TRY(ulp_db_stmt(a, sql_upd, &st));
		sqlite3_bind_int(st, 1, x->codec);
		if (x->has_ref)
			sqlite3_bind_blob(st, 2, x->ref, ULP_SHA256_LEN, SQLITE_STATIC);
		sqlite3_bind_int(st, 3, x->has_ref ? (int)rdepth + 1 : 0);
		sqlite3_bind_int64(st, 4, (sqlite3_int64)x->stored);
		sqlite3_bind_int64(st, 5, pack);
		sqlite3_bind_int64(st, 6, (sqlite3_int64)x->offset);
		sqlite3_bind_blob(st, 7, x->content, ULP_SHA256_LEN, SQLITE_STATIC);
		ULP_TRY(ulp_db_step_rc(a, st, "re-base blob"));
		ULP_TRY(ulp_db_stmt(a, sql_mark, &st));
		sqlite3_bind_blob(st, 1, x->content, ULP_SHA256_LEN, SQLITE_STATIC);
		ULP_TRY(ulp_db_step_rc(a, st, "re-base blob"));
		ULP_TRY(ulp_db_stmt(a, sql_stored, &st));
		sqlite3_bind_int64(st, 1, (sqlite3_int64)x->stored - (sqlite3_int64)x->old.stored);
		sqlite3_bind_blob(st, 2, x->content, ULP_SHA256_LEN, SQLITE_STATIC);
		ULP_TRY(ulp_db_step_rc(a, st, "re-base blob"));
		x->applied = 1;
		applied++;
	}
	if (!applied) /* nothing changed: the caller removes the pack again */
		return 0;
	/* invariant 2 of the header: depths follow the new references, down
	 * every chain that passes through a re-coded blob */
	ULP_TRY(ulp_db_exec(a, "WITH RECURSIVE d(c) AS (SELECT content FROM temp.rb_upd UNION"
	                       " SELECT b.content FROM blobs b JOIN d ON b.ref = d.c)"
	                       " INSERT OR IGNORE INTO temp.rb_aff SELECT c FROM d"));
	for (int pass = 0;; pass++) {
		ULP_TRY(ulp_db_exec(a, "UPDATE blobs SET depth = coalesce((SELECT r.depth + 1 FROM blobs r"
		                       " WHERE r.content = blobs.ref), 0) WHERE content IN temp.rb_aff AND depth IS NOT"
		                       " coalesce((SELECT r.depth + 1 FROM blobs r WHERE r.content = blobs.ref), 0)"));
		if (sqlite3_changes(ulp_db(a)) == 0)
			break;
		if (pass > 4096)
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s/ulpack.db: re-basing made a cycle of references", a->dir);
	}
	sqlite3_stmt *st;
	int rc = sqlite3_prepare_v2(ulp_db(a), "SELECT coalesce(max(depth), 0) FROM blobs b WHERE content IN temp.rb_aff"
	                            " AND EXISTS (SELECT 1 FROM extents x WHERE x.blob = b.id)",
	                            -1, &st, NULL);
	if (rc != SQLITE_OK)
		return ulp_db_err(a, "re-base depths");
	unsigned maxd = sqlite3_step(st) == SQLITE_ROW ? (unsigned)sqlite3_column_int(st, 0) : 0;
	sqlite3_finalize(st);
	/* the planner keeps the chains of files short: never commit a longer
	 * one (blobs no file uses any more, which gc drops next, may be deeper) */
	if (maxd > a->max_chain)
		return ulp_arch_err(a, -ULP_E_BUSY, "%s: re-basing would make a chain of %u deltas (max_chain %u);"
		                    " the archive changed meanwhile, try again", a->dir, maxd, a->max_chain);
	return ulp_db_exec(a, "UPDATE entries SET"
	                      " depth = (SELECT coalesce(max(b.depth), 0) FROM extents x JOIN blobs b ON b.id = x.blob"
	                      "  WHERE x.file = entries.id),"
	                      " anchor = (SELECT coalesce(max(b.depth), 0) = 0 FROM extents x JOIN blobs b ON b.id = x.blob"
	                      "  WHERE x.file = entries.id)"
	                      " WHERE id IN (SELECT x.file FROM extents x JOIN blobs b ON b.id = x.blob"
	                      "  WHERE b.content IN temp.rb_aff)");
}

int ulp_index_file_id(ulp_archive *a, const char *path, int64_t *id)
{
	static const char sql[] = "SELECT id FROM entries WHERE path = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*id = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	if (rc == SQLITE_DONE)
		return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such file in archive %s", path, a->dir);
	return rc == SQLITE_ROW ? 0 : ulp_db_err(a, "file lookup");
}

int ulp_index_run_steps(ulp_archive *a, const char *run, int (*cb)(void *arg, int64_t step, uint64_t files),
                        void *arg)
{
	static const char sql[] = "SELECT step, count(*) FROM entries WHERE type = 0 AND step IS NOT NULL AND"
	                          " (path = ?1 OR " ULP_BELOW("path", "?1") ") GROUP BY step ORDER BY step";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "steps of a run");
	sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW)
		rc = cb(arg, sqlite3_column_int64(st, 0), (uint64_t)sqlite3_column_int64(st, 1));
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "steps of a run");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_run_tensors(ulp_archive *a, const char *run, int (*cb)(void *arg, const ulp_tensorrow *r),
                          void *arg)
{
	/* one pass in index order, no sort, no lookup by content: the entries
	 * under run by their path index, each file's extents by their key, each
	 * blob by its id (1000 steps x 300 tensors: 0.4 s of CPU here, 1.0 s
	 * with a join of the references and an ORDER BY) */
	static const char sql[] =
		"SELECT e.series, x.name, e.step, x.dtype, x.length, b.id, b.content, b.ref, b.codec, b.depth,"
		" b.stored_size, e.path FROM entries e JOIN extents x ON x.file = e.id JOIN blobs b ON b.id = x.blob"
		" WHERE e.type = 0 AND e.step IS NOT NULL AND e.series IS NOT NULL AND"
		" (?1 = '' OR " ULP_BELOW("e.path", "?1") ") AND x.name IS NOT NULL AND x.length > 0";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "tensors of a run");
	sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
		ulp_tensorrow t = {.series = (const char *)sqlite3_column_text(st, 0),
		                   .name = (const char *)sqlite3_column_text(st, 1),
		                   .step = sqlite3_column_int64(st, 2),
		                   .dtype = sqlite3_column_type(st, 3) == SQLITE_NULL ? 0 : sqlite3_column_int(st, 3),
		                   .length = (uint64_t)sqlite3_column_int64(st, 4),
		                   .blob = sqlite3_column_int64(st, 5),
		                   .codec = sqlite3_column_int(st, 8),
		                   .depth = (unsigned)sqlite3_column_int(st, 9),
		                   .stored = (uint64_t)sqlite3_column_int64(st, 10),
		                   .path = (const char *)sqlite3_column_text(st, 11)};
		if (!t.series || !t.name || !t.path || sqlite3_column_bytes(st, 6) != ULP_SHA256_LEN)
			continue; /* out of memory in SQLite, a damaged row: passed over, not misread */
		memcpy(&t.content64, sqlite3_column_blob(st, 6), 8);
		t.has_ref = sqlite3_column_bytes(st, 7) == ULP_SHA256_LEN;
		if (t.has_ref)
			memcpy(&t.ref64, sqlite3_column_blob(st, 7), 8);
		rc = cb(arg, &t);
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "tensors of a run");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_file_named(ulp_archive *a, const char *path,
                         int (*cb)(void *arg, const char *name, int dtype, uint64_t offset, uint64_t length,
                                   const uint8_t content[ULP_SHA256_LEN]),
                         void *arg)
{
	static const char sql[] = "SELECT x.name, x.dtype, x.offset, x.length, b.content FROM extents x"
	                          " JOIN entries e ON e.id = x.file JOIN blobs b ON b.id = x.blob"
	                          " WHERE e.path = ? AND e.type = 0 AND x.name IS NOT NULL AND x.length > 0 ORDER BY x.offset";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "tensors of a file");
	sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
	int rc = 0, r;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
		const char *name = (const char *)sqlite3_column_text(st, 0);
		const uint8_t *content = sqlite3_column_blob(st, 4);
		if (!name || !content || sqlite3_column_bytes(st, 4) != ULP_SHA256_LEN) {
			rc = ulp_arch_err(a, name ? -ULP_E_CORRUPT : -ULP_E_NOMEM, "%s: a tensor's row in %s/ulpack.db: %s",
			                  path, a->dir, name ? "no content identity" : "out of memory");
			break;
		}
		rc = cb(arg, name, sqlite3_column_type(st, 1) == SQLITE_NULL ? 0 : sqlite3_column_int(st, 1),
		        (uint64_t)sqlite3_column_int64(st, 2), (uint64_t)sqlite3_column_int64(st, 3), content);
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "tensors of a file");
	sqlite3_finalize(st);
	return rc;
}

int ulp_index_forget_steps(ulp_archive *a, const char *run, const int64_t *steps, size_t n)
{
	/* the files of those steps, then the directories they leave empty
	 * under the run (a checkpoint-N/ directory goes with its files) */
	static const char sql_sel[] = "SELECT path FROM entries WHERE type <> 1 AND step = ?2 AND"
	                              " (path = ?1 OR " ULP_BELOW("path", "?1") ")";
	static const char sql_del[] = "DELETE FROM entries WHERE path = ?";
	static const char sql_rmdir[] = "DELETE FROM entries WHERE path = ?1 AND type = 1 AND NOT EXISTS"
	                                " (SELECT 1 FROM entries k WHERE k.parent = ?1 AND k.path <> '')";
	size_t rl = strlen(run);
	for (size_t i = 0; i < n; i++) {
		char **paths = NULL;
		size_t np = 0, cap = 0;
		int rc = 0, r;
		sqlite3_stmt *st;
		ULP_TRY(ulp_db_stmt(a, sql_sel, &st));
		sqlite3_bind_text(st, 1, run, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, steps[i]);
		while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
			if ((rc = ulp_grow(&paths, &cap, np, sizeof(*paths))) == 0 &&
			    !(paths[np++] = strdup((const char *)sqlite3_column_text(st, 0))))
				rc = -ULP_E_NOMEM;
		}
		if (rc == 0 && r != SQLITE_DONE)
			rc = ulp_db_err(a, "forget");
		sqlite3_reset(st);
		for (size_t k = 0; rc == 0 && k < np; k++) {
			if ((rc = ulp_db_stmt(a, sql_del, &st)) < 0)
				break;
			sqlite3_bind_text(st, 1, paths[k], -1, SQLITE_STATIC);
			rc = ulp_db_step_rc(a, st, "forget");
			/* its parents, up to the run, while they are empty */
			char *d = paths[k];
			for (char *slash; rc == 0 && (slash = strrchr(d, '/')) && (size_t)(slash - d) > rl;) {
				*slash = 0;
				if ((rc = ulp_db_stmt(a, sql_rmdir, &st)) < 0)
					break;
				sqlite3_bind_text(st, 1, d, -1, SQLITE_STATIC);
				rc = ulp_db_step_rc(a, st, "forget");
				if (rc == 0 && sqlite3_changes(ulp_db(a)) == 0)
					break;
			}
		}
		for (size_t k = 0; k < np; k++)
			free(paths[k]);
		free(paths);
		ULP_TRY(rc);
	}
	return 0;
}

/* ---- space (the archive's, maint.c) ---------------------------------------- */


int ulp_index_space(ulp_archive *a, unsigned pct, ulp_space *sp)
{
	static const char sql_packs[] =
		LIVE_CTE " SELECT p.size, coalesce(sum(b.stored_size), 0) FROM packs p LEFT JOIN"
		" (SELECT pack, stored_size FROM blobs WHERE content IN live) b ON b.pack = p.id GROUP BY p.id";
	static const char sql_pending[] =
		"SELECT (SELECT count(*) FROM rebase_queue) + (SELECT count(*) FROM blobs d JOIN blobs r"
		" ON r.content = d.ref WHERE EXISTS (SELECT 1 FROM extents x WHERE x.blob = d.id)"
		" AND NOT EXISTS (SELECT 1 FROM extents y WHERE y.blob = r.id))";
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, sql_packs, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "pack space");
	int r;
	while ((r = sqlite3_step(st)) == SQLITE_ROW) {
		uint64_t size = (uint64_t)sqlite3_column_int64(st, 0), live = (uint64_t)sqlite3_column_int64(st, 1);
		sp->packs++;
		sp->pack_bytes += size;
		sp->live_bytes += live;
		sp->dead_packs += live == 0;
		sp->sparse_packs += live > 0 && (live + ULP_PACK_HEADER) * 100 < size * pct;
	}
	sqlite3_finalize(st);
	if (r != SQLITE_DONE)
		return ulp_db_err(a, "pack space");
	if (sqlite3_prepare_v2(db, sql_pending, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "pending re-codes");
	r = sqlite3_step(st);
	if (r == SQLITE_ROW)
		sp->pending_recodes = (uint64_t)sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	return r == SQLITE_ROW ? 0 : ulp_db_err(a, "pending re-codes");
}

/* ---- packs kept for the grace (maint.c invariant 7) ------------------------ */

int ulp_index_grace_add(ulp_archive *a, const char *name, uint64_t gen)
{
	static const char sql[] = "INSERT OR REPLACE INTO pack_grace VALUES(?, ?, ?)";
	sqlite3_stmt *st;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
	sqlite3_bind_int64(st, 3, (sqlite3_int64)gen);
	return ulp_db_step_rc(a, st, "pack_grace");
}

int ulp_index_grace_has(ulp_archive *a, const char *name)
{
	static const char sql[] = "SELECT 1 FROM pack_grace WHERE name = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	int r = sqlite3_step(st);
	sqlite3_reset(st);
	return r == SQLITE_ROW ? 1 : r == SQLITE_DONE ? 0 : ulp_db_err(a, "pack_grace");
}

int ulp_index_grace_due(ulp_archive *a, int64_t before_ms, uint64_t below_gen,
                        int (*cb)(void *arg, const char *name), void *arg)
{
	static const char sql[] = "SELECT name FROM pack_grace WHERE since_ms <= ? AND gen < ?";
	static const char del[] = "DELETE FROM pack_grace WHERE name = ?";
	sqlite3_stmt *st, *d;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	ULP_TRY(ulp_db_stmt(a, del, &d));
	sqlite3_bind_int64(st, 1, before_ms);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)below_gen);
	int r, rc = 0;
	while (rc == 0 && (r = sqlite3_step(st)) == SQLITE_ROW) {
		const char *n = (const char *)sqlite3_column_text(st, 0);
		sqlite3_bind_text(d, 1, n, -1, SQLITE_TRANSIENT);
		rc = ulp_db_step_rc(a, d, "pack_grace");
		if (rc == 0)
			rc = cb(arg, n);
	}
	if (rc == 0 && r != SQLITE_DONE)
		rc = ulp_db_err(a, "pack_grace");
	sqlite3_reset(st);
	return rc;
}
