/* SPDX-License-Identifier: MIT */
/*
 * namespace.c - the namespace operations of an archive: stat, readdir,
 * readlink, symlink, mkdir, remove, rename and setattr on its entries, each
 * change one transaction (in_tx). They keep index.c's invariant 4 (every
 * entry but the root is reached from the root through directory entries;
 * paths compared as bytes, ULP_BELOW) and invariant 6 (mtime_ns agrees with
 * mtime_sec and mtime_nsec), and create nothing at a path path.c rejects.
 * A removal works on a full disk: it takes the index's reserve (db.c).
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

int ulp_archive_stat(ulp_archive *a, const char *path, ulp_stat *out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	static const char sql[] = "SELECT " ULP_ENTRY_COLS " FROM entries WHERE path = ?";
	static const char sql_v2[] = "SELECT " ULP_ENTRY_COLS_V2 " FROM entries WHERE path = ?";
	char p[4096];
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
	ulp_ftab *t = ulp_ftab_get(a); /* a fresh file table answers alone (ftab.c) */
	if (t) {
		int rc = ulp_ftab_stat(a, t, p, out);
		ulp_ftab_put(a, t);
		return rc;
	}
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, a->schema >= 4 ? sql : sql_v2, &st));
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc == SQLITE_ROW) {
		ulp_stat_from_row(st, out);
		sqlite3_reset(st);
		return 0;
	}
	sqlite3_reset(st);
	if (rc == SQLITE_DONE)
		return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such file in archive %s", p, a->dir);
	return ulp_db_err(a, "stat");
}

int ulp_ns_readdir(ulp_archive *a, const char *path, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                   void *arg, char *dir, size_t dir_cap, int *run_dir)
{
	*run_dir = 0;
	ulp_gen_follow(a); /* gen.c invariant 3 */
	static const char sql[] = "SELECT " ULP_ENTRY_COLS ", name FROM entries WHERE parent = ? AND path <> '' ORDER BY name";
	static const char sql_v2[] = "SELECT " ULP_ENTRY_COLS_V2 ", name FROM entries WHERE parent = ? AND path <> ''"
	                             " ORDER BY name";
	char p[4096];
	ulp_stat s;
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
	ULP_TRY(ulp_archive_stat(a, p, &s));
	if (!s.is_dir)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: not a directory", p);
	/* a private statement: callbacks may query the index themselves */
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *st;
	if (!db || sqlite3_prepare_v2(db, a->schema >= 4 ? sql : sql_v2, -1, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "readdir");
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	int rc = 0, r, steps = 0;
	while ((r = sqlite3_step(st)) == SQLITE_ROW) {
		ulp_stat_from_row(st, &s);
		const char *name = (const char *)sqlite3_column_text(st, ULP_ENTRY_NCOLS);
		if (s.is_dir && steps < 2 && name) {
			char *series = NULL;
			steps += ulp_parse_step(name, &series) >= 0 && series;
			free(series);
		}
		rc = cb(arg, name, &s);
		if (rc)
			break;
	}
	if (r != SQLITE_ROW && r != SQLITE_DONE)
		rc = ulp_db_err(a, "readdir");
	sqlite3_finalize(st);
	if (rc == 0 && steps >= 2) {
		*run_dir = 1; /* a run's directory: a sweep may follow (read.c) */
		snprintf(dir, dir_cap, "%s", p);
	}
	return rc;
}

int ulp_archive_readlink(ulp_archive *a, const char *path, char *buf, size_t cap)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	static const char sql[] = "SELECT target FROM entries WHERE path = ? AND type = 2";
	char p[4096];
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	int rc = sqlite3_step(st);
	if (rc != SQLITE_ROW) {
		sqlite3_reset(st);
		return ulp_arch_err(a, -ULP_E_NOENT, "%s: not a symbolic link", p);
	}
	snprintf(buf, cap, "%s", (const char *)sqlite3_column_text(st, 0));
	sqlite3_reset(st);
	return 0;
}

static int insert_entry(ulp_archive *a, const char *p, int type, const ulp_meta *m, const char *target)
{
	ulp_newfile f = {.path = p, .type = type, .target = target, .anchor = 1};
	if (m)
		f.meta = *m;
	if (type == ULP_ENT_LINK)
		f.size = strlen(target);
	return ulp_index_put_file(a, &f, NULL, 0, NULL, 0, NULL, 0);
}

static int in_tx(ulp_archive *a, int rc)
{
	if (rc == 0)
		rc = ulp_db_commit(a);
	if (rc < 0)
		ulp_db_rollback(a);
	return rc;
}

int ulp_archive_symlink(ulp_archive *a, const char *path, const char *target, const ulp_meta *m)
{
	char p[4096];
	ULP_TRY(ulp_path_bad(a, path, "cannot create a link"));
	if (a->read_only || ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot create a link there", path);
	ulp_stat s;
	if (ulp_archive_stat(a, p, &s) == 0)
		return ulp_arch_err(a, -ULP_E_EXIST, "%s: exists", p);
	ULP_TRY(ulp_db_begin(a));
	return in_tx(a, insert_entry(a, p, ULP_ENT_LINK, m, target));
}

int ulp_archive_mkdir(ulp_archive *a, const char *path, const ulp_meta *m)
{
	static const char sql[] = "INSERT INTO entries(path, parent, name, type, mode, uid, gid, mtime_ns,"
	                          " mtime_sec, mtime_nsec) VALUES(?, ?, ?, 1, ?, ?, ?, ?, ?, ?)";
	char p[4096];
	ULP_TRY(ulp_path_bad(a, path, "cannot create a directory"));
	if (a->read_only || ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot create a directory there", path);
	ulp_stat s;
	if (ulp_archive_stat(a, p, &s) == 0)
		return ulp_arch_err(a, -ULP_E_EXIST, "%s: exists", p);
	ULP_TRY(ulp_db_begin(a));
	ulp_time now = ulp_time_make(time(NULL), 0);
	int rc = ulp_index_mkdirs(a, p, now);
	char *parent = ulp_path_parent(p);
	sqlite3_stmt *st = NULL;
	if (rc == 0 && !parent)
		rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", p);
	if (rc == 0)
		rc = ulp_db_stmt(a, sql, &st);
	if (rc == 0) {
		sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 2, parent, -1, SQLITE_STATIC);
		sqlite3_bind_text(st, 3, ulp_path_name(p), -1, SQLITE_STATIC);
		sqlite3_bind_int(st, 4, m ? (int)(m->mode & 07777) : 0755);
		sqlite3_bind_int64(st, 5, m ? m->uid : 0);
		sqlite3_bind_int64(st, 6, m ? m->gid : 0);
		ulp_index_bind_time(st, 7, 8, m ? m->mtime : now);
		rc = ulp_db_step_rc(a, st, "mkdir");
	}
	free(parent);
	return in_tx(a, rc);
}

/* Removes entry p (a directory only when empty) inside the caller's
 * transaction: it never begins one itself, so rename can use it (a nested
 * BEGIN fails with SQLITE_ERROR). */
static int remove_in_tx(ulp_archive *a, const char *p)
{
	static const char sql_kids[] = "SELECT 1 FROM entries WHERE parent = ? AND path <> '' LIMIT 1";
	static const char sql_del[] = "DELETE FROM entries WHERE path = ?";
	ulp_stat s;
	ULP_TRY(ulp_archive_stat(a, p, &s));
	if (s.is_dir) {
		sqlite3_stmt *st;
		ULP_TRY(ulp_db_stmt(a, sql_kids, &st));
		sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
		int r = sqlite3_step(st);
		sqlite3_reset(st);
		if (r == SQLITE_ROW)
			return ulp_arch_err(a, -ULP_E_NOTEMPTY, "%s: directory not empty", p);
		if (r != SQLITE_DONE)
			return ulp_db_err(a, "remove");
	}
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql_del, &st));
	sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
	return ulp_db_step_rc(a, st, "remove");
}

int ulp_archive_remove(ulp_archive *a, const char *path)
{
	char p[4096];
	if (a->read_only || ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot remove that", path);
	int rc = ulp_db_begin(a);
	if (rc == 0)
		rc = in_tx(a, remove_in_tx(a, p));
	/* removing is how a full disk gets space back: the log's space from the
	 * index's reserve (db.c), once */
	if (rc == -ULP_E_NOSPC && ulp_db_nospc_retry(a) && (rc = ulp_db_begin(a)) == 0)
		rc = in_tx(a, remove_in_tx(a, p));
	return rc;
}

int ulp_archive_rename(ulp_archive *a, const char *from, const char *to)
{
	static const char sql_sel[] = "SELECT id, path FROM entries WHERE path = ?1 OR " ULP_BELOW("path", "?1");
	static const char sql_upd[] = "UPDATE entries SET path = ?, parent = ?, name = ?, run = ?, series = ?,"
	                              " step = ? WHERE id = ?";
	static const char sql_del[] = "DELETE FROM entries WHERE path = ?";
	char f[4096], t[4096];
	ulp_stat sf, stt;
	ULP_TRY(ulp_path_bad(a, to, "cannot rename to that name"));
	if (a->read_only || ulp_path_clean(from, f, sizeof(f)) < 0 || ulp_path_clean(to, t, sizeof(t)) < 0 ||
	    !f[0] || !t[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s -> %s: invalid rename", from, to);
	size_t fl = strlen(f);
	if (strncmp(t, f, fl) == 0 && t[fl] == '/')
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot move a directory into itself", f);
	if (strcmp(f, t) == 0)
		return ulp_archive_stat(a, f, &sf);
	ULP_TRY(ulp_db_begin(a));
	int rc = ulp_archive_stat(a, f, &sf);
	if (rc == 0 && ulp_archive_stat(a, t, &stt) == 0) {
		if (stt.is_dir && !sf.is_dir)
			rc = ulp_arch_err(a, -ULP_E_ISDIR, "%s: is a directory", t);
		else if (!stt.is_dir && sf.is_dir)
			rc = ulp_arch_err(a, -ULP_E_NOTDIR, "%s: not a directory", t);
		else if (stt.is_dir) /* only an empty one may be replaced (POSIX) */
			rc = remove_in_tx(a, t);
		else {
			sqlite3_stmt *st;
			if ((rc = ulp_db_stmt(a, sql_del, &st)) == 0) {
				sqlite3_bind_text(st, 1, t, -1, SQLITE_STATIC);
				rc = ulp_db_step_rc(a, st, "rename over");
			}
		}
	}
	if (rc == 0)
		rc = ulp_index_mkdirs(a, t, ulp_time_make(time(NULL), 0));
	/* the entry and everything below it; t is not below f (checked above),
	 * so no updated row comes back into the range being read */
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *sel = NULL;
	if (rc == 0 && sqlite3_prepare_v2(db, sql_sel, -1, &sel, NULL) != SQLITE_OK)
		rc = ulp_db_err(a, "rename");
	if (rc == 0) {
		sqlite3_bind_text(sel, 1, f, -1, SQLITE_STATIC);
		int r = SQLITE_DONE;
		while (rc == 0 && (r = sqlite3_step(sel)) == SQLITE_ROW) {
			int64_t id = sqlite3_column_int64(sel, 0);
			const char *old = (const char *)sqlite3_column_text(sel, 1);
			char np[8400];
			snprintf(np, sizeof(np), "%s%s", t, old + fl);
			char *parent = ulp_path_parent(np), *series = NULL;
			int64_t step = ulp_parse_step(np, &series);
			const char *slash = strchr(np, '/');
			sqlite3_stmt *up;
			if (!parent || (step >= 0 && !series))
				rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", np);
			else if ((rc = ulp_db_stmt(a, sql_upd, &up)) == 0) {
				sqlite3_bind_text(up, 1, np, -1, SQLITE_STATIC);
				sqlite3_bind_text(up, 2, parent, -1, SQLITE_STATIC);
				sqlite3_bind_text(up, 3, ulp_path_name(np), -1, SQLITE_STATIC);
				sqlite3_bind_text(up, 4, np, slash ? (int)(slash - np) : -1, SQLITE_STATIC);
				if (series)
					sqlite3_bind_text(up, 5, series, -1, SQLITE_STATIC);
				if (step >= 0)
					sqlite3_bind_int64(up, 6, step);
				sqlite3_bind_int64(up, 7, id);
				rc = ulp_db_step_rc(a, up, "rename");
			}
			free(parent);
			free(series);
		}
		/* an error is not the end of the rows: committing would move only some */
		if (rc == 0 && r != SQLITE_DONE)
			rc = ulp_db_err(a, "rename");
	}
	sqlite3_finalize(sel);
	return in_tx(a, rc);
}

int ulp_archive_setattr(ulp_archive *a, const char *path, unsigned which, const ulp_meta *m)
{
	static const char sql[] = "UPDATE entries SET mode = CASE WHEN ?1 THEN ?2 ELSE mode END,"
	                          " uid = CASE WHEN ?3 THEN ?4 ELSE uid END, gid = CASE WHEN ?3 THEN ?5 ELSE gid END,"
	                          " mtime_ns = CASE WHEN ?6 THEN ?7 ELSE mtime_ns END,"
	                          " mtime_sec = CASE WHEN ?6 THEN ?9 ELSE mtime_sec END,"
	                          " mtime_nsec = CASE WHEN ?6 THEN ?10 ELSE mtime_nsec END WHERE path = ?8";
	char p[4096];
	ulp_stat s;
	if (a->read_only || ulp_path_clean(path, p, sizeof(p)) < 0)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot change attributes", path);
	ULP_TRY(ulp_archive_stat(a, p, &s));
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int(st, 1, (which & ULP_SET_MODE) != 0);
	sqlite3_bind_int(st, 2, (int)(m->mode & 07777));
	sqlite3_bind_int(st, 3, (which & ULP_SET_OWNER) != 0);
	sqlite3_bind_int64(st, 4, m->uid);
	sqlite3_bind_int64(st, 5, m->gid);
	sqlite3_bind_int(st, 6, (which & ULP_SET_MTIME) != 0);
	ulp_index_bind_time(st, 7, 9, m->mtime);
	sqlite3_bind_text(st, 8, p, -1, SQLITE_STATIC);
	return ulp_db_step_rc(a, st, "setattr");
}
