/* SPDX-License-Identifier: MIT */
/*
 * index.c - the SQLite index of an archive; the only module that includes
 * sqlite3.h. Every thread gets its own connection (WAL, foreign keys, busy
 * timeout) and its own cache of prepared statements.
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
 */
#include "arch_int.h"
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N_STMTS 64

struct ulp_tstate {
	ulp_archive *a;
	sqlite3 *db;
	int open_err;    /* the ULP_E_* of the last failed open of db, or 0 */
	char err[1024];
	struct {
		const char *sql; /* static strings: compared by address */
		sqlite3_stmt *st;
	} stmts[N_STMTS];
	int n_stmts;
	ulp_tstate *next;
};

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
	ulp_tstate *t = pthread_getspecific(a->tls);
	if (!t) {
		t = calloc(1, sizeof(*t));
		if (!t)
			return NULL;
		t->a = a;
		pthread_setspecific(a->tls, t);
		pthread_mutex_lock(&a->mu);
		t->next = a->tstates;
		a->tstates = t;
		pthread_mutex_unlock(&a->mu);
	}
	return t;
}

int ulp_arch_err(const ulp_archive *a, int code, const char *fmt, ...)
{
	ulp_tstate *t = tstate(a);
	if (t) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(t->err, sizeof(t->err), fmt, ap);
		va_end(ap);
	}
	return code;
}

const char *ulp_archive_errmsg(const ulp_archive *a)
{
	ulp_tstate *t = pthread_getspecific(a->tls);
	return t && t->err[0] ? t->err : "no error";
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

static int open_conn(const ulp_archive *a, sqlite3 **out, ulp_err *err)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/ulpack.db", a->dir);
	sqlite3 *db = NULL;
	int flags = (a->read_only ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE) | SQLITE_OPEN_NOMUTEX;
	int rc = a->db_uri ? sqlite3_open_v2(a->db_uri, &db, flags | SQLITE_OPEN_URI, NULL)
	                   : sqlite3_open_v2(path, &db, flags, NULL);
	if (rc != SQLITE_OK) {
		int code = access(path, F_OK) != 0 && errno == ENOENT ? -ULP_E_NOENT
		         : rc == SQLITE_NOMEM ? -ULP_E_NOMEM : -ULP_E_IO;
		const char *cause = a->db_uri ? NULL : open_cause(path, a->read_only ? O_RDONLY : O_RDWR);
		ULP_ERR(err, code, "%s: %s", path, cause ? cause : db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
		sqlite3_close(db);
		return code;
	}
	sqlite3_busy_timeout(db, 30000);
	/* FULL: a commit is on disk when it returns (WAL fsynced), so a power
	 * loss right after never loses a file whose staging copy is already gone;
	 * one small fsync per archived file */
	sqlite3_exec(db, "PRAGMA foreign_keys=ON; PRAGMA synchronous=FULL;", NULL, NULL, NULL);
	*out = db;
	return 0;
}

sqlite3 *ulp_db(ulp_archive *a)
{
	ulp_tstate *t = tstate(a);
	if (!t)
		return NULL;
	if (!t->db) {
		ulp_err e = {t->err, sizeof(t->err)};
		t->open_err = open_conn(a, &t->db, &e);
		if (t->open_err < 0)
			return NULL;
	}
	return t->db;
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
	pthread_mutex_lock(&a->mu);
	for (ulp_tstate **pp = &a->tstates; *pp; pp = &(*pp)->next)
		if (*pp == t) {
			*pp = t->next;
			break;
		}
	pthread_mutex_unlock(&a->mu);
	tstate_close(t);
}

size_t ulp_tstate_count(ulp_archive *a)
{
	size_t n = 0;
	pthread_mutex_lock(&a->mu);
	for (ulp_tstate *t = a->tstates; t; t = t->next)
		n++;
	pthread_mutex_unlock(&a->mu);
	return n;
}

void ulp_tstate_free_all(ulp_archive *a)
{
	ulp_tstate *t = a->tstates;
	while (t) {
		ulp_tstate *next = t->next;
		tstate_close(t);
		t = next;
	}
	a->tstates = NULL;
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
	ulp_tstate *t = pthread_getspecific(a->tls);
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

int ulp_db_begin(ulp_archive *a)
{
	return ulp_db_exec(a, "BEGIN IMMEDIATE");
}

int ulp_db_commit(ulp_archive *a)
{
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
	ulp_tstate *t = pthread_getspecific(a->tls);
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
 * mtime_nsec is in [0, 1e9) before 1970 too; mtime_ns stays (invariant 6). */
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
		return ULP_ERR(err, code, "%s", ulp_archive_errmsg(a));
	}
	a->schema = ULP_SCHEMA_VERSION;
	return 0;
}

/* Closes the calling thread's connection and its statements. */
static void drop_conn(ulp_archive *a)
{
	ulp_tstate *t = pthread_getspecific(a->tls);
	if (!t)
		return;
	for (int i = 0; i < t->n_stmts; i++)
		sqlite3_finalize(t->stmts[i].st);
	t->n_stmts = 0;
	sqlite3_close(t->db);
	t->db = NULL;
}

/* A file: URI of path (percent-encoded) with query q; NULL: no memory. */
static char *file_uri(const char *path, const char *q)
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
	char buf[1 << 16];
	for (ssize_t n; rc == 0 && (n = read(in, buf, sizeof(buf))) != 0;) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", src, strerror(errno));
		else if (write(out, buf, (size_t)n) != n) /* a regular file: short only when full */
			rc = ULP_ERR(err, -ULP_E_NOSPC, "%s: %s", dst, strerror(errno ? errno : ENOSPC));
	}
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
	a->db_copy = a->db_uri = NULL;
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
		a->db_uri = file_uri(db, "immutable=1");
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
	a->db_uri = file_uri(p, "mode=ro");
	snprintf(p, sizeof(p), "%s/ulpack.db-wal", dir);
	ULP_TRY(copy_file(wal, p, err));
	return a->db_uri ? 0 : -ULP_E_NOMEM;
}

/* Checks that the index is an archive of a schema this build reads. */
int ulp_db_check(ulp_archive *a, ulp_err *err)
{
	sqlite3 *db = ulp_db(a);
	if (!db)
		return ULP_ERR(err, ulp_db_err(a, "open"), "%s", ulp_archive_errmsg(a));
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
			return ULP_ERR(err, ulp_db_err(a, "open"), "%s", ulp_archive_errmsg(a));
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
	static const char sql[] = "SELECT name FROM packs WHERE id = ?";
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
	sqlite3_reset(st);
	return 0;
}

/* Fills a ulp_stat from a row of ENTRY_COLS (ENTRY_COLS_V2 in an index of
 * schema version 1 to 3, opened read-only: no mtime_sec, mtime_nsec). */
#define ENTRY_COLS_ "type, size, mode, uid, gid, mtime_ns, sha256, stored, step, depth, anchor, kind, length(CAST(target AS BLOB))"
#define ENTRY_COLS ENTRY_COLS_ ", mtime_sec, mtime_nsec"
#define ENTRY_COLS_V2 ENTRY_COLS_ ", NULL, NULL"
#define ENTRY_NCOLS 15 /* the first column after ENTRY_COLS */

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

int ulp_archive_stat(ulp_archive *a, const char *path, ulp_stat *out)
{
	static const char sql[] = "SELECT " ENTRY_COLS " FROM entries WHERE path = ?";
	static const char sql_v2[] = "SELECT " ENTRY_COLS_V2 " FROM entries WHERE path = ?";
	char p[4096];
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
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

int ulp_index_file(ulp_archive *a, const char *path, ulp_stat *out, uint8_t **header,
                   size_t *header_len, ulp_extent **ext, size_t *n_ext)
{
	static const char sql[] = "SELECT " ENTRY_COLS ", id, header, header_sha FROM entries WHERE path = ?";
	static const char sql_v2[] = "SELECT " ENTRY_COLS_V2 ", id, header, header_sha FROM entries WHERE path = ?";
	static const char sql_v1[] = "SELECT " ENTRY_COLS_V2 ", id, header, NULL FROM entries WHERE path = ?";
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
	int64_t id = sqlite3_column_int64(st, ENTRY_NCOLS);
	size_t hl = (size_t)sqlite3_column_bytes(st, ENTRY_NCOLS + 1);
	uint8_t *h = NULL;
	if (hl) {
		h = malloc(hl);
		if (!h) {
			sqlite3_reset(st);
			return -ULP_E_NOMEM;
		}
		memcpy(h, sqlite3_column_blob(st, ENTRY_NCOLS + 1), hl);
		/* invariant 5: the header is checked before anything serves it */
		uint8_t sha[ULP_SHA256_LEN];
		ulp_sha256(h, hl, sha);
		if (a->schema >= 2 && (sqlite3_column_bytes(st, ENTRY_NCOLS + 2) != ULP_SHA256_LEN ||
		                       memcmp(sqlite3_column_blob(st, ENTRY_NCOLS + 2), sha, ULP_SHA256_LEN) != 0)) {
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

int ulp_archive_readdir(ulp_archive *a, const char *path,
                        int (*cb)(void *arg, const char *name, const ulp_stat *st), void *arg)
{
	static const char sql[] = "SELECT " ENTRY_COLS ", name FROM entries WHERE parent = ? AND path <> '' ORDER BY name";
	static const char sql_v2[] = "SELECT " ENTRY_COLS_V2 ", name FROM entries WHERE parent = ? AND path <> ''"
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
	int rc = 0, r;
	while ((r = sqlite3_step(st)) == SQLITE_ROW) {
		ulp_stat_from_row(st, &s);
		rc = cb(arg, (const char *)sqlite3_column_text(st, ENTRY_NCOLS), &s);
		if (rc)
			break;
	}
	if (r != SQLITE_ROW && r != SQLITE_DONE)
		rc = ulp_db_err(a, "readdir");
	sqlite3_finalize(st);
	return rc;
}

int ulp_archive_readlink(ulp_archive *a, const char *path, char *buf, size_t cap)
{
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

/* ---- paths ------------------------------------------------------------- */

int ulp_path_clean(const char *in, char *out, size_t cap)
{
	size_t o = 0;
	const char *p = in;
	while (*p) {
		while (*p == '/')
			p++;
		const char *s = p;
		while (*p && *p != '/')
			p++;
		size_t len = (size_t)(p - s);
		if (len == 0 || (len == 1 && s[0] == '.'))
			continue;
		if (len == 2 && s[0] == '.' && s[1] == '.')
			return -ULP_E_INVAL; /* never escapes the archive */
		if (len > ULP_NAME_MAX || o + len + 2 > cap || o + len + 1 > ULP_PATH_MAX)
			return -ULP_E_NAMETOOLONG; /* could not be written back out */
		if (o)
			out[o++] = '/';
		memcpy(out + o, s, len);
		o += len;
	}
	out[o] = 0;
	return 0;
}

int ulp_arch_path(ulp_archive *a, const char *path, char *out, size_t cap)
{
	int rc = ulp_path_clean(path, out, cap);
	if (rc == -ULP_E_NAMETOOLONG)
		return ulp_arch_err(a, rc, "%.200s...: a name over %d bytes or a path over %d bytes", path, ULP_NAME_MAX,
		                    ULP_PATH_MAX);
	if (rc < 0)
		return ulp_arch_err(a, rc, "%s: not a valid path inside an archive (a '..' component)", path);
	return 0;
}

int ulp_path_check(const char *path)
{
	char p[ULP_PATH_MAX + 1];
	return ulp_path_clean(path, p, sizeof(p));
}

/* The cause of a path that cannot be created, as the caller's error: a too
 * long name has its own code (ENAMETOOLONG at the FUSE edge). */
static int bad_path(ulp_archive *a, const char *path, const char *what)
{
	if (ulp_path_check(path) == -ULP_E_NAMETOOLONG)
		return ulp_arch_err(a, -ULP_E_NAMETOOLONG, "%.200s...: %s: a name over %d bytes or a path over %d bytes",
		                    path, what, ULP_NAME_MAX, ULP_PATH_MAX);
	return 0;
}

char *ulp_path_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t len = slash ? (size_t)(slash - path) : 0;
	char *p = malloc(len + 1);
	if (p) {
		memcpy(p, path, len);
		p[len] = 0;
	}
	return p;
}

const char *ulp_path_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash ? slash + 1 : path;
}

/* ---- steps -------------------------------------------------------------- */

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

int64_t ulp_parse_step(const char *path, char **series)
{
	static const char *const keys[] = {"global_step", "checkpoint-", "checkpoint_", "checkpoint",
	                                   "step_", "step-", "step", "iter_", "iter-", "iteration_",
	                                   "iteration-", "iter", "ckpt-", "ckpt_", "ckpt"};
	size_t len = strlen(path);
	const char *best = NULL, *digits = NULL;
	/* components from the last to the first; within one, the first key */
	const char *end = path + len;
	while (end > path && !digits) {
		const char *start = end;
		while (start > path && start[-1] != '/')
			start--;
		for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]) && !digits; k++) {
			size_t kl = strlen(keys[k]);
			for (const char *s = start; s + kl < end; s++) {
				if (strncmp(s, keys[k], kl) != 0 || !is_digit(s[kl]))
					continue;
				/* "step" must not be the tail of a longer word (e.g. "mystep") */
				if (s > start && ((s[-1] >= 'a' && s[-1] <= 'z') || (s[-1] >= 'A' && s[-1] <= 'Z')) &&
				    strncmp(keys[k], "global", 6) != 0)
					continue;
				best = s;
				digits = s + kl;
				break;
			}
		}
		end = start > path ? start - 1 : path;
	}
	if (!digits) { /* the last number of the file name */
		const char *name = strrchr(path, '/');
		name = name ? name + 1 : path;
		for (const char *s = path + len; s > name; s--)
			if (is_digit(s[-1])) {
				const char *e = s;
				while (s > name && is_digit(s[-1]))
					s--;
				digits = s;
				best = s;
				(void)e;
				break;
			}
	}
	(void)best;
	if (!digits) {
		if (series)
			*series = NULL;
		return -1;
	}
	const char *de = digits;
	int64_t v = 0;
	while (is_digit(*de) && v < ((int64_t)1 << 58)) {
		v = v * 10 + (*de - '0');
		de++;
	}
	while (is_digit(*de))
		de++;
	if (series) {
		size_t pre = (size_t)(digits - path), post = strlen(de);
		*series = malloc(pre + 3 + post + 1);
		if (*series) {
			memcpy(*series, path, pre);
			memcpy(*series + pre, "{S}", 3);
			memcpy(*series + pre + 3, de, post + 1);
		}
	}
	return v;
}

/* ---- writing ------------------------------------------------------------ */

/* Binds time t to parameters ns (as mtime_ns) and sec, sec + 1 (mtime_sec,
 * mtime_nsec): invariant 6. */
static void bind_time(sqlite3_stmt *st, int ns, int sec, ulp_time t)
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
			bind_time(st, 4, 5, mtime);
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

static int step_rc(ulp_archive *a, sqlite3_stmt *st, const char *what)
{
	int rc = sqlite3_step(st);
	sqlite3_reset(st);
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? 0 : ulp_db_err(a, what);
}

int ulp_index_put_file(ulp_archive *a, const ulp_newfile *f, const char *pack_name,
                       uint64_t pack_size, const ulp_newblob *b, size_t nb, const ulp_newext *x,
                       size_t nx)
{
	static const char sql_pack[] = "INSERT INTO packs(name, size) VALUES(?, ?)";
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
	if (pack_name) {
		ULP_TRY(ulp_db_stmt(a, sql_pack, &st));
		sqlite3_bind_text(st, 1, pack_name, -1, SQLITE_STATIC);
		sqlite3_bind_int64(st, 2, (sqlite3_int64)pack_size);
		ULP_TRY(step_rc(a, st, "insert pack"));
		pack = sqlite3_last_insert_rowid(ulp_db(a));
	}
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
		ULP_TRY(step_rc(a, st, "insert blob"));
	}
	if (old >= 0) {
		ULP_TRY(ulp_db_stmt(a, sql_del, &st));
		sqlite3_bind_text(st, 1, f->path, -1, SQLITE_STATIC);
		ULP_TRY(step_rc(a, st, "replace file"));
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
	bind_time(st, 9, 21, f->meta.mtime);
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
	rc = step_rc(a, st, "insert file");
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
		ULP_TRY(step_rc(a, st, "insert extent"));
	}
	return 0;
}

/* ---- namespace operations ------------------------------------------------ */

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
	ULP_TRY(bad_path(a, path, "cannot create a link"));
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
	ULP_TRY(bad_path(a, path, "cannot create a directory"));
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
		bind_time(st, 7, 8, m ? m->mtime : now);
		rc = step_rc(a, st, "mkdir");
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
	return step_rc(a, st, "remove");
}

int ulp_archive_remove(ulp_archive *a, const char *path)
{
	char p[4096];
	if (a->read_only || ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot remove that", path);
	ULP_TRY(ulp_db_begin(a));
	return in_tx(a, remove_in_tx(a, p));
}

/* Byte-safe prefix matching (invariant 4 of the header): the entries below
 * directory ?1 are the paths in [?1 || '/', ?1 || '0'), '0' being the byte
 * after '/'. The BINARY collation compares bytes (memcmp), whereas length()
 * and substr() count characters of TEXT: "données" is 8 bytes but 7
 * characters, so a substr() of a byte count never matched (issue 11, 2). */
#define BELOW(col, arg) "(" col " >= " arg " || '/' AND " col " < " arg " || '0')"

int ulp_archive_rename(ulp_archive *a, const char *from, const char *to)
{
	static const char sql_sel[] = "SELECT id, path FROM entries WHERE path = ?1 OR " BELOW("path", "?1");
	static const char sql_upd[] = "UPDATE entries SET path = ?, parent = ?, name = ?, run = ?, series = ?,"
	                              " step = ? WHERE id = ?";
	static const char sql_del[] = "DELETE FROM entries WHERE path = ?";
	char f[4096], t[4096];
	ulp_stat sf, stt;
	ULP_TRY(bad_path(a, to, "cannot rename to that name"));
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
				rc = step_rc(a, st, "rename over");
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
				rc = step_rc(a, up, "rename");
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
	bind_time(st, 7, 9, m->mtime);
	sqlite3_bind_text(st, 8, p, -1, SQLITE_STATIC);
	return step_rc(a, st, "setattr");
}

/* ---- listing, reports and gc support ---------------------------------------- */

int ulp_index_files(ulp_archive *a, const char *prefix,
                    int (*cb)(void *arg, const char *path, const ulp_stat *st), void *arg)
{
#define FILES_SQL(cols) "SELECT " cols ", path FROM entries WHERE type = 0 AND" \
	                        " (?1 = '' OR path = ?1 OR " BELOW("path", "?1") ")" \
	                        " ORDER BY step IS NOT NULL, step, path"
	static const char sql[] = FILES_SQL(ENTRY_COLS), sql_v2[] = FILES_SQL(ENTRY_COLS_V2);
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
		if ((rc = cb(arg, (const char *)sqlite3_column_text(st, ENTRY_NCOLS), &s)) != 0)
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
		" (?1 = '' OR e.path = ?1 OR " BELOW("e.path", "?1") ") AND"
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
	static const char sql_dt[] =
		"WITH f AS (SELECT id FROM entries WHERE type = 0 AND (?1 = '' OR path = ?1 OR "
		BELOW("path", "?1") ")),"
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

int ulp_index_gc_sweep(ulp_archive *a, uint64_t *removed)
{
	static const char sql[] =
		"WITH RECURSIVE live(content) AS (SELECT b.content FROM extents e JOIN blobs b ON b.id = e.blob"
		" UNION SELECT b.ref FROM blobs b JOIN live l ON b.content = l.content WHERE b.ref IS NOT NULL)"
		" DELETE FROM blobs WHERE content NOT IN (SELECT content FROM live)";
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
	static const char sql[] = "INSERT INTO packs(name, size) VALUES(?, ?) ON CONFLICT(name) DO NOTHING";
	static const char sql_id[] = "SELECT id FROM packs WHERE name = ?";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_text(st, 1, name, -1, SQLITE_STATIC);
	sqlite3_bind_int64(st, 2, (sqlite3_int64)size);
	ULP_TRY(step_rc(a, st, "insert pack"));
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
	return step_rc(a, st, "move blob");
}

int ulp_index_pack_drop(ulp_archive *a, int64_t pack)
{
	static const char sql[] = "DELETE FROM packs WHERE id = ? AND NOT EXISTS (SELECT 1 FROM blobs WHERE pack = ?)";
	sqlite3_stmt *st;
	ULP_TRY(ulp_db_stmt(a, sql, &st));
	sqlite3_bind_int64(st, 1, pack);
	sqlite3_bind_int64(st, 2, pack);
	return step_rc(a, st, "drop pack");
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
		ULP_TRY(step_rc(a, st, "re-basing queue"));
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
		ULP_TRY(step_rc(a, st, "re-base blob"));
		ULP_TRY(ulp_db_stmt(a, sql_mark, &st));
		sqlite3_bind_blob(st, 1, x->content, ULP_SHA256_LEN, SQLITE_STATIC);
		ULP_TRY(step_rc(a, st, "re-base blob"));
		ULP_TRY(ulp_db_stmt(a, sql_stored, &st));
		sqlite3_bind_int64(st, 1, (sqlite3_int64)x->stored - (sqlite3_int64)x->old.stored);
		sqlite3_bind_blob(st, 2, x->content, ULP_SHA256_LEN, SQLITE_STATIC);
		ULP_TRY(step_rc(a, st, "re-base blob"));
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
	                          " (path = ?1 OR " BELOW("path", "?1") ") GROUP BY step ORDER BY step";
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

int ulp_index_forget_steps(ulp_archive *a, const char *run, const int64_t *steps, size_t n)
{
	/* the files of those steps, then the directories they leave empty
	 * under the run (a checkpoint-N/ directory goes with its files) */
	static const char sql_sel[] = "SELECT path FROM entries WHERE type <> 1 AND step = ?2 AND"
	                              " (path = ?1 OR " BELOW("path", "?1") ")";
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
			rc = step_rc(a, st, "forget");
			/* its parents, up to the run, while they are empty */
			char *d = paths[k];
			for (char *slash; rc == 0 && (slash = strrchr(d, '/')) && (size_t)(slash - d) > rl;) {
				*slash = 0;
				if ((rc = ulp_db_stmt(a, sql_rmdir, &st)) < 0)
					break;
				sqlite3_bind_text(st, 1, d, -1, SQLITE_STATIC);
				rc = step_rc(a, st, "forget");
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

/* ---- space (ulp_archive_space, maint.c) ------------------------------------ */

/* The blobs a file or a chain needs: gc invariant 1 (maint.c). */
#define LIVE_CTE \
	"WITH RECURSIVE live(content) AS (SELECT b.content FROM extents e JOIN blobs b ON b.id = e.blob" \
	" UNION SELECT b.ref FROM blobs b JOIN live l ON b.content = l.content WHERE b.ref IS NOT NULL)"

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

void ulp_index_checkpoint(ulp_archive *a)
{
	sqlite3 *db = ulp_db(a);
	if (db) /* busy (a reader holds an older snapshot) is fine: next time */
		sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, NULL, NULL);
}
