/* SPDX-License-Identifier: MIT */
/*
 * db.h - the index's connections (db.c): each thread's SQLite connection
 * and error text (the db handle a->dbh, its own lock), the schema and its
 * upgrades, transactions, cached statements, the one mapping of SQLite's
 * errors, the reserve for a full disk, and a shared archive's hooks (the
 * writer's fence, a reader's generation followed). db.c calls nothing
 * above itself.
 */
#ifndef ULP_DB_H
#define ULP_DB_H

#include "arch_int.h"

#define ULP_SCHEMA_VERSION 4

/* The generation that a following reader's new connections open (gen.c):
 * uri, which the dbh takes; its threads move to it at their next
 * ulp_gen_follow. */
void ulp_db_set_follow(ulp_archive *a, char *uri);

/* A file: URI of path (percent-encoded) with query q; NULL: no memory. */
char *ulp_db_file_uri(const char *path, const char *q);

/* The calling thread's connection moves to the generation followed when it
 * runs no statement (gen.c invariant 3; a reader of a shared archive). */
void ulp_db_refollow(ulp_archive *a);

/* A shared archive's hooks into the connection layer, installed at open
 * (archive.c): fence, checked before a transaction begins and as it
 * commits (lease.c invariant 1: ulp_lease_ok); refresh, when a following
 * reader's generation cannot be opened (gen.c: the newest). db.c calls
 * nothing above itself. */
void ulp_db_set_hooks(ulp_archive *a, int (*fence)(ulp_archive *a), void (*refresh)(ulp_archive *a));

/* Opens two connections ahead for the first threads that ask (a hint, at
 * archive open): a mount's first lookup and open then open none (issue 29:
 * a good part of a small file's cold open). */
void ulp_db_open_ahead(ulp_archive *a);
typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;

/* The calling thread's connection (opened on first use); NULL on error
 * (message recorded). */
sqlite3 *ulp_db(ulp_archive *a);
/* 1 if the calling thread's connection is inside a transaction (opens none). */
int ulp_db_in_tx(ulp_archive *a);
int ulp_db_create(const char *path, ulp_err *err);
int ulp_db_check(ulp_archive *a, ulp_err *err);
void ulp_db_free_copy(ulp_archive *a); /* at close: db_uri, db_copy, live */

/* The file of the live index a writer's connections open: a->w->live or
 * ARCHIVE/ulpack.db. */
void ulp_db_live_path(const ulp_archive *a, char *p, size_t cap);
int ulp_db_exec(ulp_archive *a, const char *sql);
int ulp_db_begin(ulp_archive *a);   /* BEGIN IMMEDIATE, retried while busy */
int ulp_db_commit(ulp_archive *a);
void ulp_db_rollback(ulp_archive *a);

/* The calling thread's prepared statement for sql (cached per connection;
 * sql a static string) in *out; 0, or ulp_db_err's code (out of memory:
 * NOMEM, else IO and the like, with SQLite's message in the errmsg). */
int ulp_db_stmt(ulp_archive *a, const char *sql, sqlite3_stmt **out);

/* The ULP_E_* of the last failed SQLite call on the calling thread's
 * connection (or of opening it), its message recorded naming the index and
 * what failed; the one mapping of SQLite's codes. */
int ulp_db_err(ulp_archive *a, const char *what);

/* Steps st once and resets it: 0 (done or a row), or ulp_db_err(a, what). */
int ulp_db_step_rc(ulp_archive *a, sqlite3_stmt *st, const char *what);
void ulp_tstate_free_all(ulp_archive *a);

/* The database handle, a->dbh: made first at open (ulp_arch_err needs it),
 * freed at close with every thread's connection. */
int ulp_dbh_open(ulp_archive *a);
void ulp_dbh_close(ulp_archive *a);
void ulp_tstate_exit(void *tstate); /* the thread-state key's destructor */
size_t ulp_tstate_count(ulp_archive *a); /* live thread states (tests) */

/* Truncates the write-ahead log if no reader holds it (else nothing). */
void ulp_index_checkpoint(ulp_archive *a);

/* The index's reserve for removing on a full disk (db.c): allocated where
 * there is room for 1.25 ULP_DB_RESERVE (read-write opens, reclaiming);
 * ulp_db_nospc_retry, for a removal or a reclaim that failed with NOSPC,
 * checkpoints and releases it: 1 if that freed space (try once more);
 * ulp_db_reserve_release releases it alone. */
#define ULP_DB_RESERVE ((uint64_t)1 << 20)
void ulp_db_reserve_make(ulp_archive *a);
int ulp_db_reserve_release(ulp_archive *a);
int ulp_db_nospc_retry(ulp_archive *a);

#endif
