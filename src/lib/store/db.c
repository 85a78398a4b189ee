/* SPDX-License-Identifier: MIT */
/*
 * db.c - the connection and schema layer of an archive's SQLite index; with
 * index.c and namespace.c the only modules that include sqlite3.h. Every
 * thread gets its own connection (WAL, foreign keys, busy timeout) and its
 * own cache of prepared statements; the ulp_db_* helpers (transactions,
 * statements, the one mapping of SQLite's codes to ULP_E_*) work on the
 * calling thread's connection. The rows these tables hold, and their
 * invariants, are index.c's.
 *
 * Schema (version 4; version 1 lacks entries.header_sha, version 2 the
 * re-basing queue and blobs_ref, version 3 entries.mtime_sec and mtime_nsec;
 * all are upgraded when opened read-write, see upgrade):
 *   meta(key, value)                 schema_version, max_chain, created_by
 *   packs(id, name, size)            immutable pack files under packs/
 *   blobs(id, content, codec, ref, depth, raw_size, stored_size, pack, offset)
 *                                    one blob per content (sha256 of the
 *                                    decoded bytes); ref is the content it
 *                                    needs, depth its chain length (0: none)
 *   entries(id, path, parent, name, type, size, mode, uid, gid, mtime_ns,
 *           sha256, kind, header, run, series, step, target, stored, depth,
 *           anchor, header_sha, mtime_sec, mtime_nsec)
 *                                    files, directories and symlinks;
 *                                    header_sha: sha256 of header; the
 *                                    mtime is mtime_sec + mtime_nsec ns,
 *                                    mtime_ns the same clamped to int64 ns
 *   extents(file, offset, length, blob, name, dtype)
 *                                    how a file's bytes after its header are
 *                                    made, in order; name/dtype for tensors
 *   rebase_queue(file, why)         files whose neighbourhood in their series
 *                                    changed (filled by triggers on entries:
 *                                    a new file, or a rename that changed its
 *                                    series), for recode.c; why counts the
 *                                    changes, so a row queued again while it
 *                                    is being handled stays (it is deleted
 *                                    only with the count that was read); a
 *                                    row goes with its entry (ON DELETE
 *                                    CASCADE)
 * Views runs(run, files, raw_bytes, stored_bytes) and steps(run, step, files).
 *
 * The index's reserve: removing is how space comes back, and removing is a
 * transaction whose write-ahead log needs space. So a read-write open
 * allocates ARCHIVE/ulpack.reserve (ULP_DB_RESERVE bytes) on a file system
 * of 16 times that or more with room for a quarter more than it, and a
 * removal (or the reclaiming that
 * follows it) that fails for a full disk gives the log its space back
 * (ulp_db_nospc_retry: a truncating checkpoint, then the reserve released)
 * and is tried once more if either freed space; so does a read-write open that cannot make its
 * wal-index on a full disk (without an open nothing can be removed);
 * the archive's reclaiming (archive/maint.c) allocates the reserve again once there is room.
 * Nothing else ever releases it (an archiving that fills the disk fails as
 * before). Its only state is the file: making and
 * releasing it race harmlessly (two releases free it once, a make after a
 * release allocates it again only where there is room).
 */
#include "shared.h"
#include "db.h"
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define N_STMTS 64

/* A thread's state: its own (reached through dbh->tls), but for next. */
struct ulp_tstate {
	ulp_archive *a;  /* set at creation, read-only after */
	sqlite3 *db;
	int open_err;    /* the ULP_E_* of the last failed open of db, or 0 (its
	                    message the archive's: ulp_arch_err) */
	struct {
		const char *sql; /* static strings: compared by address */
		sqlite3_stmt *st;
	} stmts[N_STMTS];
	int n_stmts;
	uint64_t seq;        /* the dbh's follow_seq that db was opened at */
	int64_t hook_changes; /* sqlite3_total_changes64 at the last commit_hook */
	int hooked;          /* commit_hook installed on db */
	ulp_tstate *next;    /* guarded by dbh->mu */
};

/*
 * The database handle (a->dbh): the key of each thread's state and the list
 * of them all, so that close frees the connections of threads still alive.
 * A thread's own state is its alone (reached through the key); the list is
 * guarded by mu, a leaf lock: nothing else is taken while it is held.
 */
struct ulp_dbh {
	pthread_key_t tls;           /* set at open, read-only after: each thread's ulp_tstate */
	pthread_mutex_t mu;
	ulp_tstate *tstates;         /* guarded by mu: every thread's state, freed at close */
	char *follow_uri;            /* guarded by mu: a following reader's generation
	                                (gen.c), which its new connections open */
	uint64_t follow_seq;         /* guarded by mu: bumped with each follow_uri */
	sqlite3 *spare[2];           /* guarded by mu: connections opened ahead
	                                (ulp_db_open_ahead), each taken by a thread's
	                                first ulp_db; never of a following reader */
	int n_spare;                 /* guarded by mu */
	/* the hooks of a shared archive (ulp_db_set_hooks), set at open before
	 * any thread queries, read-only after; NULL: none */
	int (*fence)(ulp_archive *a);    /* a writer may write: 0, or why not */
	void (*refresh)(ulp_archive *a); /* a reader's generation gone: the newest */
};

void ulp_db_set_hooks(ulp_archive *a, int (*fence)(ulp_archive *a), void (*refresh)(ulp_archive *a))
{
	a->dbh->fence = fence;
	a->dbh->refresh = refresh;
}

/* The writer's fence (lease.c invariant 1 through its hook): 0 where there
 * is none. */
static int fence_ok(ulp_archive *a)
{
	return a->dbh->fence ? a->dbh->fence(a) : 0;
}

int ulp_dbh_open(ulp_archive *a)
{
	ulp_dbh *h = calloc(1, sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	if (pthread_key_create(&h->tls, ulp_tstate_exit) != 0) {
		free(h);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_init(&h->mu, NULL);
	a->dbh = h;
	return 0;
}

void ulp_dbh_close(ulp_archive *a)
{
	ulp_dbh *h = a->dbh;
	if (!h)
		return;
	pthread_key_delete(h->tls); /* no destructor runs after this */
	ulp_tstate_free_all(a);
	while (h->n_spare > 0)
		sqlite3_close(h->spare[--h->n_spare]);
	pthread_mutex_destroy(&h->mu);
	free(h->follow_uri);
	free(h);
	a->dbh = NULL;
}

/* Version 3: what recode.c needs (the queue of pending re-basing work, kept
 * in the same transactions as the puts and renames that make it, so a crash
 * never loses it; an index on blobs.ref to find a blob's dependents). */
#define REBASE_SCHEMA \
	"CREATE INDEX IF NOT EXISTS blobs_ref ON blobs(ref);" \
	"CREATE TABLE IF NOT EXISTS rebase_queue(file INTEGER PRIMARY KEY REFERENCES entries(id) ON DELETE CASCADE," \
	" why INTEGER NOT NULL);" \
	"CREATE TRIGGER IF NOT EXISTS rebase_new AFTER INSERT ON entries WHEN NEW.type = 0 AND NEW.kind <> 0" \
	" AND NEW.series IS NOT NULL BEGIN INSERT INTO rebase_queue VALUES(NEW.id, 1)" \
	" ON CONFLICT(file) DO UPDATE SET why = why + 1; END;" \
	"CREATE TRIGGER IF NOT EXISTS rebase_moved AFTER UPDATE OF series ON entries WHEN NEW.type = 0 AND NEW.kind <> 0" \
	" AND NEW.series IS NOT NULL AND NEW.series IS NOT OLD.series" \
	" BEGIN INSERT INTO rebase_queue VALUES(NEW.id, 1) ON CONFLICT(file) DO UPDATE SET why = why + 1; END;"

static const char *const schema =
	"PRAGMA journal_mode=WAL;"
	"BEGIN;"
	"CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
	"CREATE TABLE packs(id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, size INTEGER NOT NULL);"
	"CREATE TABLE blobs(id INTEGER PRIMARY KEY, content BLOB UNIQUE NOT NULL, codec INTEGER NOT NULL,"
	" ref BLOB, depth INTEGER NOT NULL, raw_size INTEGER NOT NULL, stored_size INTEGER NOT NULL,"
	" pack INTEGER NOT NULL REFERENCES packs(id), offset INTEGER NOT NULL);"
	"CREATE INDEX blobs_pack ON blobs(pack);"
	"CREATE TABLE entries(id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, parent TEXT NOT NULL,"
	" name TEXT NOT NULL, type INTEGER NOT NULL, size INTEGER NOT NULL DEFAULT 0,"
	" mode INTEGER NOT NULL, uid INTEGER NOT NULL DEFAULT 0, gid INTEGER NOT NULL DEFAULT 0,"
	" mtime_ns INTEGER NOT NULL, sha256 BLOB, kind INTEGER NOT NULL DEFAULT 0, header BLOB,"
	" run TEXT, series TEXT, step INTEGER, target TEXT, stored INTEGER NOT NULL DEFAULT 0,"
	" depth INTEGER NOT NULL DEFAULT 0, anchor INTEGER NOT NULL DEFAULT 1, header_sha BLOB,"
	" mtime_sec INTEGER, mtime_nsec INTEGER);"
	"CREATE INDEX entries_parent ON entries(parent);"
	"CREATE INDEX entries_series ON entries(series, step);"
	"CREATE TABLE extents(file INTEGER NOT NULL REFERENCES entries(id) ON DELETE CASCADE,"
	" offset INTEGER NOT NULL, length INTEGER NOT NULL, blob INTEGER NOT NULL REFERENCES blobs(id),"
	" name TEXT, dtype INTEGER, PRIMARY KEY(file, offset));"
	"CREATE INDEX extents_blob ON extents(blob);"
	REBASE_SCHEMA
	"CREATE VIEW runs AS SELECT run, count(*) AS files, sum(size) AS raw_bytes,"
	" sum(stored) AS stored_bytes FROM entries WHERE type = 0 GROUP BY run;"
	"CREATE VIEW steps AS SELECT run, step, count(*) AS files FROM entries"
	" WHERE type = 0 AND step >= 0 GROUP BY run, step;"
	"INSERT INTO meta VALUES('schema_version', '4');"
	"INSERT INTO meta VALUES('created_by', 'ulpack " ULP_VERSION_STRING "');"
	"INSERT INTO entries(path, parent, name, type, mode, mtime_ns, mtime_sec, mtime_nsec)"
	" VALUES('', '', '', 1, 16877, 0, 0, 0);"
	"COMMIT;";

static ulp_tstate *tstate(const ulp_archive *ca)
{
	ulp_archive *a = (ulp_archive *)ca;
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return NULL;
		t->a = a;
		pthread_setspecific(a->dbh->tls, t);
		pthread_mutex_lock(&a->dbh->mu);
		t->next = a->dbh->tstates;
		a->dbh->tstates = t;
		pthread_mutex_unlock(&a->dbh->mu);
	}
	return t;
}

/* Why path cannot be opened, as strerror names it ("Permission denied",
 * "Read-only file system"...), or NULL where it opens (the cause is SQLite's). */
static const char *open_cause(const char *path, int flags)
{
	int fd = open(path, flags | O_CLOEXEC);
	if (fd < 0)
		return strerror(errno);
	close(fd);
	return NULL;
}

static int open_conn(ulp_archive *a, sqlite3 **out, uint64_t *seq, ulp_err *err);

void ulp_db_open_ahead(ulp_archive *a)
{
	if (a->follow)
		return; /* a following reader's connections open its generation as they come */
	/* (No posix_fadvise of ulpack.db here: closing a descriptor of it would
	 * drop every POSIX lock this process holds on it, its connections' WAL
	 * locks included, and another process could then recover the WAL
	 * under them: I/O errors in a mount beside a read-only one.) */
	/* connections for the first threads that ask (a mount's first FUSE
	 * workers: a lookup and an open each opened one, about half a
	 * millisecond each, inside a cold open) */
	ulp_dbh *h = a->dbh;
	for (int i = 0; i < (int)(sizeof(h->spare) / sizeof(h->spare[0])); i++) {
		char buf[256];
		ulp_err e = {buf, sizeof(buf)};
		sqlite3 *db = NULL;
		uint64_t seq = 0;
		if (open_conn(a, &db, &seq, &e) < 0)
			break; /* a hint: the thread that needs one says why */
		pthread_mutex_lock(&h->mu);
		h->spare[h->n_spare++] = db;
		pthread_mutex_unlock(&h->mu);
	}
}

/* A connection to the index: ulpack.db, or the URI db_uri names (a
 * read-only fallback), or the generation a following reader follows (its
 * seq in *seq). */
void ulp_db_live_path(const ulp_archive *a, char *p, size_t cap)
{
	if (a->w->live)
		snprintf(p, cap, "%s", a->w->live);
	else
		snprintf(p, cap, "%s/ulpack.db", a->dir);
}

/* Every statement any connection of a runs, counted (a->index_stmts: the
 * tests check that an open served by the file table runs none, ftab.c). */
static int count_stmt(unsigned type, void *ctx, void *p, void *x)
{
	(void)type;
	(void)p;
	(void)x;
	__atomic_fetch_add(&((ulp_archive *)ctx)->index_stmts, 1, __ATOMIC_RELAXED);
	return 0;
}

/* After each commit of a connection in WAL mode (SQLite calls it once the
 * commit is durable in the log, so a reader that sees the new a->index_seq
 * starts its transaction after the commit): a file table loaded before is
 * stale (ftab.c invariant 1). It also runs SQLite's automatic checkpoint,
 * which this hook replaces (1000 pages, as sqlite3_wal_autocheckpoint), but
 * on a shared archive's writer, whose publication checkpoints (gen.c
 * invariant 5). */
static int wal_committed(void *ctx, sqlite3 *db, const char *name, int pages)
{
	ulp_archive *a = ctx;
	__atomic_fetch_add(&a->index_seq, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&a->index_commit_ms, ulp_mono_ms(), __ATOMIC_RELAXED);
	if (pages >= 1000 && !(a->sh && !a->read_only))
		sqlite3_wal_checkpoint(db, name);
	return SQLITE_OK;
}

static int open_conn(ulp_archive *a, sqlite3 **out, uint64_t *seq, ulp_err *err)
{
	char path[4096];
	ulp_db_live_path(a, path, sizeof(path));
	sqlite3 *db = NULL;
	int flags = (a->read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX;
	char *uri = NULL;
	if (a->follow) {
		pthread_mutex_lock(&a->dbh->mu);
		if (a->dbh->follow_uri)
			uri = strdup(a->dbh->follow_uri);
		*seq = a->dbh->follow_seq;
		pthread_mutex_unlock(&a->dbh->mu);
		if (!uri)
			return ULP_ERR(err, -ULP_E_NOMEM, "%s: out of memory", path);
	}
	const char *u = uri ? uri : a->db_uri;
	int rc = u ? sqlite3_open_v2(u, &db, flags | SQLITE_OPEN_URI, NULL) : sqlite3_open_v2(path, &db, flags, NULL);
	if (rc == SQLITE_OK && uri) /* immutable: the first read tells a generation gone */
		rc = sqlite3_exec(db, "SELECT 1 FROM meta LIMIT 1", NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		int code = access(path, F_OK) != 0 && errno == ENOENT ? -ULP_E_NOENT
		         : rc == SQLITE_NOMEM ? -ULP_E_NOMEM : -ULP_E_IO;
		const char *cause = u ? NULL : open_cause(path, a->read_only ? O_RDONLY : O_RDWR);
		ULP_ERR(err, code, "%s: %s", uri ? uri : path, cause ? cause : db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
		sqlite3_close(db);
		free(uri);
		return code;
	}
	free(uri);
	sqlite3_busy_timeout(db, 30000);
	/* FULL: a commit is on disk when it returns (WAL fsynced), so a power
	 * loss right after never loses a file whose staging copy is already gone;
	 * one small fsync per archived file */
	sqlite3_exec(db, "PRAGMA foreign_keys=ON; PRAGMA synchronous=FULL;", NULL, NULL, NULL);
	sqlite3_wal_hook(db, wal_committed, a);
	sqlite3_trace_v2(db, SQLITE_TRACE_STMT, count_stmt, a);
	*out = db;
	return 0;
}

/* Every commit of a shared archive's writer, a statement's own included:
 * none while the lease does not hold (lease.c invariant 1: the commit turns
 * into a rollback), and one that wrote rows counts (gen.c publishes when
 * a->w->commits moved). */
static int commit_hook(void *arg)
{
	ulp_tstate *t = arg;
	if (fence_ok(t->a) < 0)
		return 1;
	int64_t c = sqlite3_total_changes64(t->db);
	if (c != t->hook_changes) {
		t->hook_changes = c;
		__atomic_fetch_add(&t->a->w->commits, 1, __ATOMIC_RELAXED);
	}
	return 0;
}

sqlite3 *ulp_db(ulp_archive *a)
{
	ulp_tstate *t = tstate(a);
	if (!t)
		return NULL;
	if (!t->db && !a->follow) { /* one opened ahead, if any is left */
		pthread_mutex_lock(&a->dbh->mu);
		if (a->dbh->n_spare > 0)
			t->db = a->dbh->spare[--a->dbh->n_spare];
		pthread_mutex_unlock(&a->dbh->mu);
	}
	if (!t->db) {
		char why[1024];
		ulp_err e = {why, sizeof(why)};
		t->open_err = open_conn(a, &t->db, &t->seq, &e);
		if (t->open_err < 0 && a->follow && a->dbh->refresh) { /* its generation retired meanwhile */
			a->dbh->refresh(a);
			t->open_err = open_conn(a, &t->db, &t->seq, &e);
		}
		if (t->open_err < 0) {
			ulp_arch_err(a, t->open_err, "%s", why); /* what ulp_db_err says */
			return NULL;
		}
	}
	if (!t->hooked && a->sh && !a->read_only) { /* a shared archive's writer (archive.c shares it) */
		sqlite3_commit_hook(t->db, commit_hook, t); /* (no automatic checkpoint: wal_committed) */
		t->hooked = 1;
	}
	return t->db;
}

int ulp_db_in_tx(ulp_archive *a)
{
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	return t && t->db && !sqlite3_get_autocommit(t->db);
}

void ulp_db_set_follow(ulp_archive *a, char *u)
{
	pthread_mutex_lock(&a->dbh->mu);
	free(a->dbh->follow_uri);
	a->dbh->follow_uri = u;
	a->dbh->follow_seq++;
	pthread_mutex_unlock(&a->dbh->mu);
	__atomic_fetch_add(&a->index_seq, 1, __ATOMIC_RELEASE); /* a new generation: ftab.c invariant 1 */
}

static void drop_conn(ulp_archive *a);

/* Gen.c invariant 3: a connection that runs no statement (none stepped and
 * not reset, no transaction) moves to the generation followed. */
void ulp_db_refollow(ulp_archive *a)
{
	if (!a->follow)
		return;
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	if (!t || !t->db)
		return;
	pthread_mutex_lock(&a->dbh->mu);
	uint64_t seq = a->dbh->follow_seq;
	pthread_mutex_unlock(&a->dbh->mu);
	if (t->seq == seq || !sqlite3_get_autocommit(t->db))
		return;
	for (sqlite3_stmt *st = sqlite3_next_stmt(t->db, NULL); st; st = sqlite3_next_stmt(t->db, st))
		if (sqlite3_stmt_busy(st))
			return;
	drop_conn(a); /* the next ulp_db opens the generation followed */
}

static void tstate_close(ulp_tstate *t)
{
	for (int i = 0; i < t->n_stmts; i++)
		sqlite3_finalize(t->stmts[i].st);
	sqlite3_close(t->db);
	free(t);
}

/* Key destructor: a thread that ends takes its connection with it (FUSE
 * worker threads come and go). */
void ulp_tstate_exit(void *p)
{
	ulp_tstate *t = p;
	ulp_archive *a = t->a;
	pthread_mutex_lock(&a->dbh->mu);
	for (ulp_tstate **pp = &a->dbh->tstates; *pp; pp = &(*pp)->next)
		if (*pp == t) {
			*pp = t->next;
			break;
		}
	pthread_mutex_unlock(&a->dbh->mu);
	tstate_close(t);
}

size_t ulp_tstate_count(ulp_archive *a)
{
	size_t n = 0;
	pthread_mutex_lock(&a->dbh->mu);
	for (ulp_tstate *t = a->dbh->tstates; t; t = t->next)
		n++;
	pthread_mutex_unlock(&a->dbh->mu);
	return n;
}

void ulp_tstate_free_all(ulp_archive *a)
{
	ulp_tstate *t = a->dbh->tstates;
	while (t) {
		ulp_tstate *next = t->next;
		tstate_close(t);
		t = next;
	}
	a->dbh->tstates = NULL;
}

/*
 * The one place SQLite's result codes become ULP_E_*: the error of the last
 * call on the calling thread's connection, with what failed and SQLite's
 * message in the archive's errmsg (out of memory: NOMEM; disk full: NOSPC;
 * busy: BUSY; a damaged index: CORRUPT; read-only: INVAL; else IO). Without
 * a connection, why it could not be opened: NOMEM where even the thread's
 * state could not be allocated (no message: no room for one), else the code
 * open_conn gave, its message kept.
 */
int ulp_db_err(ulp_archive *a, const char *what)
{
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	if (!t)
		return -ULP_E_NOMEM;
	if (!t->db)
		return t->open_err < 0 ? t->open_err
		                       : ulp_arch_err(a, -ULP_E_IO, "%s/ulpack.db: %s: no connection", a->dir, what);
	int rc = sqlite3_errcode(t->db);
	int code = rc == SQLITE_FULL ? -ULP_E_NOSPC
	         : rc == SQLITE_BUSY || rc == SQLITE_LOCKED ? -ULP_E_BUSY
	         : rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB ? -ULP_E_CORRUPT
	         : rc == SQLITE_READONLY ? -ULP_E_INVAL
	         : rc == SQLITE_NOMEM ? -ULP_E_NOMEM : -ULP_E_IO;
	return ulp_arch_err(a, code, "%s/ulpack.db: %s: %s", a->dir, what, sqlite3_errmsg(t->db));
}

int ulp_db_exec(ulp_archive *a, const char *sql)
{
	sqlite3 *db = ulp_db(a);
	if (!db)
		return ulp_db_err(a, sql);
	if (sqlite3_exec(db, sql, NULL, NULL, NULL) != SQLITE_OK)
		return ulp_db_err(a, sql);
	return 0;
}

/* A shared archive's writer writes only while its lease holds (lease.c
 * invariant 1): checked as a transaction starts and again right before it
 * commits. */
int ulp_db_begin(ulp_archive *a)
{
	ULP_TRY(fence_ok(a));
	return ulp_db_exec(a, "BEGIN IMMEDIATE");
}

int ulp_db_commit(ulp_archive *a)
{
	int rc = fence_ok(a);
	if (rc < 0) {
		ulp_db_rollback(a);
		return rc;
	}
	return ulp_db_exec(a, "COMMIT");
}

void ulp_db_rollback(ulp_archive *a)
{
	sqlite3 *db = ulp_db(a);
	if (db && !sqlite3_get_autocommit(db))
		sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

int ulp_db_stmt(ulp_archive *a, const char *sql, sqlite3_stmt **out)
{
	*out = NULL;
	sqlite3 *db = ulp_db(a);
	if (!db)
		return ulp_db_err(a, "open");
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	for (int i = 0; i < t->n_stmts; i++)
		if (t->stmts[i].sql == sql) {
			sqlite3_reset(t->stmts[i].st);
			sqlite3_clear_bindings(t->stmts[i].st);
			*out = t->stmts[i].st;
			return 0;
		}
	sqlite3_stmt *st;
	if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK)
		return ulp_db_err(a, "prepare");
	if (t->n_stmts < N_STMTS) {
		t->stmts[t->n_stmts].sql = sql;
		t->stmts[t->n_stmts++].st = st;
	}
	*out = st;
	return 0;
}

int ulp_db_create(const char *path, ulp_err *err)
{
	sqlite3 *db;
	/* created 0600 here, not by SQLite (0644 less the umask): the index, and
	 * its -wal and -shm, which SQLite gives the database's mode (archive.c) */
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return ULP_ERR(err, errno == EEXIST ? -ULP_E_EXIST : errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO,
		               "%s: cannot create the index: %s", path, strerror(errno));
	close(fd);
	int rc = sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL);
	if (rc != SQLITE_OK) {
		ULP_ERR(err, -ULP_E_IO, "%s: %s", path, db ? sqlite3_errmsg(db) : "cannot create");
		sqlite3_close(db);
		return -ULP_E_IO;
	}
	char *msg = NULL;
	rc = sqlite3_exec(db, schema, NULL, NULL, &msg);
	int code = 0;
	if (rc != SQLITE_OK) {
		code = rc == SQLITE_FULL ? -ULP_E_NOSPC : -ULP_E_IO;
		ULP_ERR(err, code, "%s: creating the index: %s", path, msg ? msg : "?");
	}
	sqlite3_free(msg);
	sqlite3_close(db);
	return code;
}

/* Version 1 -> 2: adds entries.header_sha and fills it from the stored
 * headers. A header that was already damaged before the upgrade is not
 * caught by its checksum; verify still catches it (the file's sha256). */
static int upgrade_v1(ulp_archive *a)
{
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *sel = NULL, *up = NULL;
	int code = 0;
	if (sqlite3_exec(db, "ALTER TABLE entries ADD COLUMN header_sha BLOB", NULL, NULL, NULL) != SQLITE_OK ||
	    sqlite3_prepare_v2(db, "SELECT id, header FROM entries WHERE header IS NOT NULL", -1, &sel, NULL) !=
	        SQLITE_OK ||
	    sqlite3_prepare_v2(db, "UPDATE entries SET header_sha = ? WHERE id = ?", -1, &up, NULL) != SQLITE_OK)
		code = ulp_db_err(a, "upgrading the index to schema version 2");
	int r = SQLITE_DONE;
	while (code == 0 && (r = sqlite3_step(sel)) == SQLITE_ROW) {
		uint8_t sha[ULP_SHA256_LEN];
		ulp_sha256(sqlite3_column_blob(sel, 1), (size_t)sqlite3_column_bytes(sel, 1), sha);
		sqlite3_bind_blob(up, 1, sha, ULP_SHA256_LEN, SQLITE_TRANSIENT);
		sqlite3_bind_int64(up, 2, sqlite3_column_int64(sel, 0));
		if (sqlite3_step(up) != SQLITE_DONE)
			code = ulp_db_err(a, "upgrading the index to schema version 2");
		sqlite3_reset(up);
	}
	if (code == 0 && r != SQLITE_DONE)
		code = ulp_db_err(a, "upgrading the index to schema version 2");
	sqlite3_finalize(sel);
	sqlite3_finalize(up);
	return code;
}

/* Version 2 -> 3: adds the re-basing queue, its triggers and blobs_ref.
 * Files archived before are not queued: they were coded as before. */
static int upgrade_v2(ulp_archive *a)
{
	if (sqlite3_exec(ulp_db(a), REBASE_SCHEMA, NULL, NULL, NULL) != SQLITE_OK)
		return ulp_db_err(a, "upgrading the index to schema version 3");
	return 0;
}

/* Version 3 -> 4: adds entries.mtime_sec and mtime_nsec (the time, exact
 * over the int64 seconds) and fills them from mtime_ns, floored so that
 * mtime_nsec is in [0, 1e9) before 1970 too; mtime_ns stays (index.c invariant 6). */
static int upgrade_v3(ulp_archive *a)
{
	if (ulp_db_exec(a, "ALTER TABLE entries ADD COLUMN mtime_sec INTEGER") < 0 ||
	    ulp_db_exec(a, "ALTER TABLE entries ADD COLUMN mtime_nsec INTEGER") < 0 ||
	    ulp_db_exec(a, "UPDATE entries SET mtime_sec = mtime_ns / 1000000000 - (mtime_ns % 1000000000 < 0),"
	                   " mtime_nsec = (mtime_ns % 1000000000 + 1000000000) % 1000000000") < 0)
		return ulp_db_err(a, "upgrading the index to schema version 4");
	return 0;
}

/* Upgrades the index to ULP_SCHEMA_VERSION, one version after the other, in
 * one transaction (another process may have upgraded the index meanwhile:
 * the version is read again under the write lock). */
static int upgrade(ulp_archive *a, ulp_err *err)
{
	sqlite3 *db = ulp_db(a);
	sqlite3_stmt *sel = NULL;
	int code = ulp_db_begin(a), v = 0;
	if (code == 0 && sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'schema_version'", -1, &sel,
	                                    NULL) == SQLITE_OK && sqlite3_step(sel) == SQLITE_ROW)
		v = sqlite3_column_int(sel, 0);
	sqlite3_finalize(sel);
	if (code == 0 && v < 1)
		code = ulp_arch_err(a, -ULP_E_CORRUPT, "%s/ulpack.db: no schema version", a->dir);
	if (code == 0 && v == 1)
		code = upgrade_v1(a);
	if (code == 0 && v <= 2)
		code = upgrade_v2(a);
	if (code == 0 && v <= 3)
		code = upgrade_v3(a);
	if (code == 0 && v < ULP_SCHEMA_VERSION)
		code = ulp_db_exec(a, "UPDATE meta SET value = '4' WHERE key = 'schema_version'");
	if (code == 0)
		code = ulp_db_commit(a);
	if (code < 0) {
		ulp_db_rollback(a);
		return ULP_ERR(err, code, "%s", ulp_msgs_get(a->msgs));
	}
	a->schema = ULP_SCHEMA_VERSION;
	return 0;
}

/* Closes the calling thread's connection and its statements. */
static void drop_conn(ulp_archive *a)
{
	ulp_tstate *t = pthread_getspecific(a->dbh->tls);
	if (!t)
		return;
	for (int i = 0; i < t->n_stmts; i++)
		sqlite3_finalize(t->stmts[i].st);
	t->n_stmts = 0;
	sqlite3_close(t->db);
	t->db = NULL;
	t->hooked = 0;
}

/* A file: URI of path (percent-encoded) with query q; NULL: no memory. */
char *ulp_db_file_uri(const char *path, const char *q)
{
	size_t n = strlen(path);
	char *u = malloc(n * 3 + strlen(q) + 8), *p = u;
	if (!u)
		return NULL;
	p += sprintf(p, "file:");
	for (const unsigned char *c = (const unsigned char *)path; *c; c++)
		if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("/-._~", *c))
			*p++ = (char)*c;
		else
			p += sprintf(p, "%%%02X", *c);
	sprintf(p, "?%s", q);
	return u;
}

/* Copies src into the new file dst (0600). */
static int copy_file(const char *src, const char *dst, ulp_err *err)
{
	int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, rc = 0;
	if (in < 0)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", src, strerror(errno));
	out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0)
		rc = ULP_ERR(err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", dst, strerror(errno));
	int wrote, e = rc == 0 ? ulp_copy_fd(in, out, &wrote) : 0;
	if (e)
		rc = ULP_ERR(err, wrote ? ulp_errno_code(e) : -ULP_E_IO, "%s: %s", wrote ? dst : src, strerror(e));
	close(in);
	if (out >= 0)
		close(out);
	return rc;
}

void ulp_db_free_copy(ulp_archive *a)
{
	if (a->db_copy) {
		char p[4300];
		for (int i = 0; i < 3; i++) {
			snprintf(p, sizeof(p), "%s/ulpack.db%s", a->db_copy, i == 0 ? "" : i == 1 ? "-wal" : "-shm");
			unlink(p);
		}
		rmdir(a->db_copy);
	}
	free(a->db_copy);
	free(a->db_uri);
	free(a->w->live);
	a->db_copy = a->db_uri = a->w->live = NULL;
}

/*
 * A read-only open that SQLite cannot serve in place. An index in WAL mode is
 * read through its wal-index, ulpack.db-shm, which SQLite must create or
 * open next to ulpack.db: on read-only media, in an archive directory the
 * user may not write, or in a copy without the -shm, it cannot, and every
 * read fails (SQLITE_CANTOPEN or _READONLY). Then, where no ulpack.db-wal holds
 * frames, ulpack.db alone is the data: it is opened immutable (no locks, no
 * -shm). Where one does, ulpack.db and its WAL are copied into a private
 * directory under $TMPDIR and read there: a snapshot taken at open, removed
 * at close.
 */
static int ro_fallback(ulp_archive *a, ulp_err *err)
{
	char db[4200], wal[4220], dir[4200], p[4300];
	snprintf(db, sizeof(db), "%s/ulpack.db", a->dir);
	snprintf(wal, sizeof(wal), "%s-wal", db);
	struct stat sb;
	if (stat(wal, &sb) < 0 || sb.st_size <= 32) { /* 32: a WAL header, no frame */
		a->db_uri = ulp_db_file_uri(db, "immutable=1");
		return a->db_uri ? 0 : -ULP_E_NOMEM;
	}
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/ulpack-ro-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return ULP_ERR(err, -ULP_E_IO, "%s: not writable here, so its WAL is read in a copy, but %s: %s", db, dir,
		               strerror(errno));
	if (!(a->db_copy = strdup(dir))) {
		rmdir(dir);
		return -ULP_E_NOMEM;
	}
	snprintf(p, sizeof(p), "%s/ulpack.db", dir);
	ULP_TRY(copy_file(db, p, err));
	a->db_uri = ulp_db_file_uri(p, "mode=ro");
	snprintf(p, sizeof(p), "%s/ulpack.db-wal", dir);
	ULP_TRY(copy_file(wal, p, err));
	return a->db_uri ? 0 : -ULP_E_NOMEM;
}

static int disk_full(ulp_archive *a)
{
	struct statvfs v;
	return statvfs(a->dir, &v) == 0 && (uint64_t)v.f_bavail * v.f_frsize < ULP_DB_RESERVE;
}

/* Checks that the index is an archive of a schema this build reads. */
int ulp_db_check(ulp_archive *a, ulp_err *err)
{
	sqlite3 *db = ulp_db(a);
	if (!db)
		return ULP_ERR(err, ulp_db_err(a, "open"), "%s", ulp_msgs_get(a->msgs));
	sqlite3_stmt *st;
	static const char ver[] = "SELECT value FROM meta WHERE key = 'schema_version'";
	int rc = sqlite3_prepare_v2(db, ver, -1, &st, NULL);
	/* a read-only connection that fails to read: no wal-index (CANTOPEN where
	 * there is no ulpack.db-shm, READONLY where one cannot be made) */
	int ec = rc != SQLITE_OK ? sqlite3_errcode(db) : SQLITE_OK;
	if ((ec == SQLITE_CANTOPEN || ec == SQLITE_READONLY) && a->read_only && !a->db_uri) {
		drop_conn(a); /* no -shm possible: read ulpack.db another way */
		ULP_TRY(ro_fallback(a, err));
		if (!(db = ulp_db(a)))
			return ULP_ERR(err, ulp_db_err(a, "open"), "%s", ulp_msgs_get(a->msgs));
		rc = sqlite3_prepare_v2(db, ver, -1, &st, NULL);
	}
	/* a read-write open on a full disk: the wal-index (ulpack.db-shm) and
	 * the log need room, and without an open nothing can be removed: the
	 * reserve is theirs (see the opening comment) */
	if (rc != SQLITE_OK && !a->read_only && (ec == SQLITE_IOERR || ec == SQLITE_FULL) && disk_full(a) &&
	    ulp_db_reserve_release(a)) {
		drop_conn(a);
		if (!(db = ulp_db(a)))
			return ULP_ERR(err, ulp_db_err(a, "open"), "%s", ulp_msgs_get(a->msgs));
		rc = sqlite3_prepare_v2(db, ver, -1, &st, NULL);
	}
	if (rc != SQLITE_OK && sqlite3_errcode(db) == SQLITE_CANTOPEN && !a->read_only && access(a->dir, W_OK) != 0)
		return ULP_ERR(err, -ULP_E_IO, "%s: cannot write in the archive directory: %s", a->dir,
		               strerror(errno));
	if (rc != SQLITE_OK)
		return ULP_ERR(err, -ULP_E_CORRUPT, "%s/ulpack.db: not a ulpack archive index (%s)", a->dir,
		               sqlite3_errmsg(db));
	int code = 0;
	if (sqlite3_step(st) != SQLITE_ROW) {
		code = ULP_ERR(err, -ULP_E_CORRUPT, "%s/ulpack.db: no schema version", a->dir);
	} else {
		int v = sqlite3_column_int(st, 0);
		if (v > ULP_SCHEMA_VERSION)
			code = ULP_ERR(err, -ULP_E_VERSION,
			               "%s/ulpack.db: schema version %d is newer than this build reads (%d); upgrade ulpack",
			               a->dir, v, ULP_SCHEMA_VERSION);
		else if (v < 1)
			code = ULP_ERR(err, -ULP_E_CORRUPT, "%s/ulpack.db: bad schema version %d", a->dir, v);
		a->schema = v;
	}
	sqlite3_finalize(st);
	if (code == 0 && a->schema < ULP_SCHEMA_VERSION && !a->read_only)
		code = upgrade(a, err);
	if (code == 0)
		ulp_db_reserve_make(a); /* (read-write: see the opening comment) */
	if (code == 0 && a->max_chain == 0) {
		a->max_chain = ULP_DEFAULT_MAX_CHAIN;
		if (sqlite3_prepare_v2(db, "SELECT value FROM meta WHERE key = 'max_chain'", -1, &st, NULL) == SQLITE_OK) {
			if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 0) > 0 &&
			    sqlite3_column_int(st, 0) <= ULP_MAX_CHAIN) /* a damaged value lifts no limit */
				a->max_chain = (unsigned)sqlite3_column_int(st, 0);
			sqlite3_finalize(st);
		}
	}
	return code;
}

int ulp_db_step_rc(ulp_archive *a, sqlite3_stmt *st, const char *what)
{
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : ulp_db_err(a, what);
}

void ulp_index_checkpoint(ulp_archive *a)
{
	if (a->sh) /* a shared archive's publication checkpoints (gen.c invariant 5) */
		return;
	sqlite3 *db = ulp_db(a);
	if (db) /* busy (a reader holds an older snapshot) is fine: next time */
		sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
}

/* ---- the reserve (see the opening comment) --------------------------------- */

static void reserve_path(ulp_archive *a, char *p, size_t cap)
{
	snprintf(p, cap, "%s/ulpack.reserve", a->dir);
}

void ulp_db_reserve_make(ulp_archive *a)
{
	char p[4400];
	struct stat sb;
	struct statvfs v;
	if (a->read_only)
		return;
	reserve_path(a, p, sizeof(p));
	if (stat(p, &sb) == 0 && (uint64_t)sb.st_blocks * 512 >= ULP_DB_RESERVE)
		return;
	/* only on a file system of 16 of it or more (one of a few MiB keeps its
	 * room for the files), and where a quarter of it stays free beside it:
	 * a removal on a full disk gives back what it removed, and the reserve
	 * again */
	if (statvfs(a->dir, &v) < 0 || (uint64_t)v.f_blocks * v.f_frsize < 16 * ULP_DB_RESERVE ||
	    (uint64_t)v.f_bavail * v.f_frsize < ULP_DB_RESERVE + ULP_DB_RESERVE / 4)
		return;
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	if (posix_fallocate(fd, 0, (off_t)ULP_DB_RESERVE) != 0) {
		close(fd);
		unlink(p);
		return;
	}
	close(fd);
}

int ulp_db_reserve_release(ulp_archive *a)
{
	char p[4400];
	struct stat sb;
	if (a->read_only)
		return 0;
	reserve_path(a, p, sizeof(p));
	return stat(p, &sb) == 0 && sb.st_blocks > 0 && unlink(p) == 0;
}

int ulp_db_nospc_retry(ulp_archive *a)
{
	char p[4400];
	struct stat sb;
	if (a->read_only)
		return 0;
	/* the log's frames into ulpack.db (deletions do not grow it), the log
	 * truncated: its space back, if it held some */
	snprintf(p, sizeof(p), "%s/ulpack.db-wal", a->dir);
	uint64_t before = stat(p, &sb) == 0 ? (uint64_t)sb.st_blocks : 0;
	ulp_index_checkpoint(a);
	uint64_t after = stat(p, &sb) == 0 ? (uint64_t)sb.st_blocks : 0;
	return ulp_db_reserve_release(a) || after < before;
}
