/* SPDX-License-Identifier: MIT */
/*
 * test_faults.c - fault injection in the manner of SQLite's malloc and I/O
 * error tests. The binary is linked with -Wl,--wrap for malloc, calloc,
 * realloc, strdup, posix_memalign, write, pwrite(64), writev, fflush, fsync, fdatasync,
 * rename, renameat, sqlite3_step, sqlite3_exec and sqlite3_prepare_v2/v3, so
 * every call libulpack makes to them goes through a counter here. For each
 * operation (an import; a mount's archiving of a staged file followed by its
 * renames and removes; gc after removes; verify; gc that must first re-base
 * a step whose reference was removed; ulp_archive_forget then gc) and each
 * kind of call, the
 * test runs the operation with the N-th call of that kind failing (ENOMEM,
 * ENOSPC/EIO, SQLITE_IOERR/SQLITE_FULL; and a statement's preparation
 * failing with SQLITE_NOMEM, as when SQLite's own malloc fails, which the
 * wrap cannot reach), for N = 1, 2, ... until a run hits
 * no fault; then again with every call from the N-th on failing. At every N:
 *  - each call returns 0 or a negative ULP_E_* of the fault's kind (NOMEM for
 *    memory and SQLITE_NOMEM, IO/NOSPC for the others), an error other than
 *    malloc's with a fresh message
 *    that names a file;
 *  - nothing is half-committed: after the archive is closed and reopened
 *    (faults off), ulp_archive_verify passes, every pack row names a pack
 *    file of its recorded size, no temporary or unindexed pack and no staged
 *    file is left, and the archive's files and bytes are exactly the state
 *    before the failed call (calls before it applied, it and later ones not);
 *  - verify reports no damaged file, except one whose index rows could not
 *    be read (a SQLite error, named in the reason);
 *  - no crash and no leak (CI runs this binary under ASan too).
 * Only calls from the thread running the operation count (one pool thread),
 * so the numbering is deterministic; each run gets a fresh thread, so
 * per-thread state (index connection, scratch buffers) is allocated inside it
 * and its allocation failures are covered too.
 */
#include "tap.h"
#include "arch_int.h"
#include "store/index.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- the fault switch ------------------------------------------------------ */

enum { F_MALLOC, F_WRITE, F_FSYNC, F_RENAME, F_SQL, F_SQL_NOMEM, F__COUNT };
static const char *const kind_name[F__COUNT] = {"malloc", "write", "fsync", "rename", "sqlite",
                                                "sqlite prepare out-of-memory"};

static struct {
	int armed;          /* atomic: the operation's thread is running */
	pthread_t thread;   /* only its calls count */
	int kind;
	long target;        /* the call of kind that fails, from 1 */
	int persist;        /* 1: and every later call of kind too */
	long count;         /* calls of kind seen while armed */
	int hit;            /* target was reached */
	sqlite3 *err_db;    /* the connection of the last injected SQLite error */
	int err_code;
} F;

/* A thread the operation's thread started while armed (the pipelined put's
 * syncer, ingest.c): its fsync and rename calls count too (it makes no other
 * wrapped call unless one of those failed, so the numbering stays
 * deterministic: one syncer at a time, its calls in order). */
static __thread int op_child;

static int fault_now(int kind)
{
	if (!__atomic_load_n(&F.armed, __ATOMIC_ACQUIRE) || kind != F.kind ||
	    !(pthread_equal(pthread_self(), F.thread) || (op_child && (kind == F_FSYNC || kind == F_RENAME))))
		return 0;
	if (++F.count != F.target && !(F.persist && F.count > F.target))
		return 0;
	F.hit = 1;
	return 1;
}

#define WRAP_PROTO(ret, name, ...) ret __real_##name(__VA_ARGS__); ret __wrap_##name(__VA_ARGS__)
WRAP_PROTO(void *, malloc, size_t);
WRAP_PROTO(void *, calloc, size_t, size_t);
WRAP_PROTO(void *, realloc, void *, size_t);
WRAP_PROTO(char *, strdup, const char *);
WRAP_PROTO(int, posix_memalign, void **, size_t, size_t);
WRAP_PROTO(ssize_t, write, int, const void *, size_t);
WRAP_PROTO(ssize_t, pwrite, int, const void *, size_t, off_t);
WRAP_PROTO(ssize_t, pwrite64, int, const void *, size_t, off_t);
WRAP_PROTO(ssize_t, writev, int, const struct iovec *, int);
WRAP_PROTO(int, fflush, FILE *);
WRAP_PROTO(int, fsync, int);
WRAP_PROTO(int, fdatasync, int);
WRAP_PROTO(int, rename, const char *, const char *);
WRAP_PROTO(int, renameat, int, const char *, int, const char *);
WRAP_PROTO(int, sqlite3_step, sqlite3_stmt *);
WRAP_PROTO(int, sqlite3_exec, sqlite3 *, const char *, int (*)(void *, int, char **, char **), void *,
           char **);
WRAP_PROTO(int, sqlite3_prepare_v2, sqlite3 *, const char *, int, sqlite3_stmt **, const char **);
WRAP_PROTO(int, sqlite3_prepare_v3, sqlite3 *, const char *, int, unsigned, sqlite3_stmt **,
           const char **);
WRAP_PROTO(int, sqlite3_errcode, sqlite3 *);
WRAP_PROTO(const char *, sqlite3_errmsg, sqlite3 *);
WRAP_PROTO(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

typedef struct child {
	void *(*fn)(void *);
	void *arg;
} child;

static void *child_main(void *arg)
{
	child c = *(child *)arg;
	free(arg);
	op_child = 1;
	return c.fn(c.arg);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	if (!__atomic_load_n(&F.armed, __ATOMIC_ACQUIRE) || !pthread_equal(pthread_self(), F.thread))
		return __real_pthread_create(t, attr, fn, arg);
	child *c = __real_malloc(sizeof(*c));
	if (!c)
		return EAGAIN;
	*c = (child){fn, arg};
	int rc = __real_pthread_create(t, attr, child_main, c);
	if (rc != 0)
		free(c);
	return rc;
}

void *__wrap_malloc(size_t n)
{
	if (fault_now(F_MALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	if (fault_now(F_MALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	if (fault_now(F_MALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
	if (fault_now(F_MALLOC)) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_strdup(s);
}

int __wrap_posix_memalign(void **p, size_t align, size_t n)
{
	return fault_now(F_MALLOC) ? ENOMEM : __real_posix_memalign(p, align, n);
}

/* A failing write says ENOSPC and EIO in turn. */
static int write_errno(void)
{
	return F.count % 2 ? ENOSPC : EIO;
}

ssize_t __wrap_write(int fd, const void *b, size_t n)
{
	if (fault_now(F_WRITE)) {
		errno = write_errno();
		return -1;
	}
	return __real_write(fd, b, n);
}

ssize_t __wrap_pwrite(int fd, const void *b, size_t n, off_t off)
{
	if (fault_now(F_WRITE)) {
		errno = write_errno();
		return -1;
	}
	return __real_pwrite(fd, b, n, off);
}

/* pwrite under _FILE_OFFSET_BITS=64 */
ssize_t __wrap_pwrite64(int fd, const void *b, size_t n, off_t off)
{
	if (fault_now(F_WRITE)) {
		errno = write_errno();
		return -1;
	}
	return __real_pwrite64(fd, b, n, off);
}

/* where stdio writes (the staging sidecar) */
int __wrap_fflush(FILE *f)
{
	if (fault_now(F_WRITE)) {
		errno = write_errno();
		return EOF;
	}
	return __real_fflush(f);
}

ssize_t __wrap_writev(int fd, const struct iovec *v, int n)
{
	if (fault_now(F_WRITE)) {
		errno = write_errno();
		return -1;
	}
	return __real_writev(fd, v, n);
}

int __wrap_fsync(int fd)
{
	if (fault_now(F_FSYNC)) {
		errno = EIO;
		return -1;
	}
	return __real_fsync(fd);
}

int __wrap_fdatasync(int fd)
{
	if (fault_now(F_FSYNC)) {
		errno = EIO;
		return -1;
	}
	return __real_fdatasync(fd);
}

int __wrap_rename(const char *from, const char *to)
{
	if (fault_now(F_RENAME)) {
		errno = EIO;
		return -1;
	}
	return __real_rename(from, to);
}

int __wrap_renameat(int fd1, const char *from, int fd2, const char *to)
{
	if (fault_now(F_RENAME)) {
		errno = EIO;
		return -1;
	}
	return __real_renameat(fd1, from, fd2, to);
}

/* SQLITE_IOERR and SQLITE_FULL in turn (prepare: SQLITE_NOMEM under its own
 * kind); sqlite3_errcode/errmsg report the injected error on that connection
 * until its next call. */
static int sql_fault(sqlite3 *db, int prepare)
{
	int nomem = prepare && fault_now(F_SQL_NOMEM);
	if (!nomem && !fault_now(F_SQL)) {
		if (db && F.err_db == db)
			F.err_db = NULL;
		return 0;
	}
	F.err_db = db;
	F.err_code = nomem ? SQLITE_NOMEM : F.count % 2 ? SQLITE_IOERR : SQLITE_FULL;
	return F.err_code;
}

int __wrap_sqlite3_step(sqlite3_stmt *st)
{
	int c = sql_fault(sqlite3_db_handle(st), 0);
	return c ? c : __real_sqlite3_step(st);
}

int __wrap_sqlite3_exec(sqlite3 *db, const char *sql, int (*cb)(void *, int, char **, char **), void *arg,
                        char **msg)
{
	/* a ROLLBACK is what cleans up after a failure: it is not failed here */
	int c = strncmp(sql, "ROLLBACK", 8) ? sql_fault(db, 0) : 0;
	if (c) {
		if (msg)
			*msg = sqlite3_mprintf("%s", sqlite3_errstr(c));
		return c;
	}
	return __real_sqlite3_exec(db, sql, cb, arg, msg);
}

int __wrap_sqlite3_prepare_v2(sqlite3 *db, const char *sql, int n, sqlite3_stmt **st, const char **tail)
{
	int c = sql_fault(db, 1);
	if (c) {
		*st = NULL;
		return c;
	}
	return __real_sqlite3_prepare_v2(db, sql, n, st, tail);
}

int __wrap_sqlite3_prepare_v3(sqlite3 *db, const char *sql, int n, unsigned flags, sqlite3_stmt **st,
                              const char **tail)
{
	int c = sql_fault(db, 1);
	if (c) {
		*st = NULL;
		return c;
	}
	return __real_sqlite3_prepare_v3(db, sql, n, flags, st, tail);
}

int __wrap_sqlite3_errcode(sqlite3 *db)
{
	return db && db == F.err_db ? F.err_code : __real_sqlite3_errcode(db);
}

const char *__wrap_sqlite3_errmsg(sqlite3 *db)
{
	return db && db == F.err_db ? sqlite3_errstr(F.err_code) : __real_sqlite3_errmsg(db);
}

/* ---- inputs and the expected state ------------------------------------------- */

static char root[256];

typedef struct input {
	const char *name;
	uint8_t *data;
	size_t len;
} input;
static input inputs[16];
static size_t n_inputs;

static const input *in_get(const char *name)
{
	for (size_t i = 0; i < n_inputs; i++)
		if (!strcmp(inputs[i].name, name))
			return &inputs[i];
	REQUIRE(0, "no input %s", name);
	return NULL;
}

static void in_file(const char *name)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, name);
	FILE *f = fopen(path, "rb");
	REQUIRE(f, "%s", path);
	fseek(f, 0, SEEK_END);
	input *in = &inputs[n_inputs++];
	in->name = name;
	in->len = (size_t)ftell(f);
	in->data = malloc(in->len + 1);
	fseek(f, 0, SEEK_SET);
	REQUIRE(fread(in->data, 1, in->len, f) == in->len, "read %s", path);
	fclose(f);
}

static void in_bytes(const char *name, const void *p, size_t len)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, name);
	FILE *f = fopen(path, "wb");
	REQUIRE(f && fwrite(p, 1, len, f) == len && fclose(f) == 0, "write %s", path);
	in_file(name);
}

/* A tiny bf16 trajectory, step s (deltas against the step before). */
static void in_step(const char *name, int s)
{
	enum { N = 512 };
	uint16_t w[N], b[64], z[32];
	uint64_t r = 12345;
	for (size_t i = 0; i < N; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		w[i] = (uint16_t)(0x3c00 + ((r >> 33) % 3000) + (uint16_t)(s * ((r >> 20) % 7)));
	}
	for (int i = 0; i < 64; i++)
		b[i] = (uint16_t)(0x3f80 + (i % 3) + s);
	memset(z, 0, sizeof(z)); /* frozen: stored once */
	uint64_t sw[2] = {N / 64, 64}, sb[1] = {64}, sz[1] = {32};
	ulp_st_wtensor t[3] = {{"w", ULP_DT_BF16, 2, sw, w}, {"b", ULP_DT_BF16, 1, sb, b},
	                       {"frozen", ULP_DT_BF16, 1, sz, z}};
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, name);
	REQUIRE(ulp_st_write(path, t, 3, NULL) == 0, "write %s", path);
	in_file(name);
}

/* A file of an incompressible tensor "big" and a small one "small"
 * (with_big 0: "small" alone, the same bytes). */
static void in_bigsmall(const char *name, int with_big)
{
	static uint8_t big[8192], small[512];
	uint64_t r = 99;
	for (size_t i = 0; i < sizeof(big); i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		big[i] = (uint8_t)(r >> 56);
	}
	for (size_t i = 0; i < sizeof(small); i++)
		small[i] = (uint8_t)(i * 7);
	uint64_t sbig[1] = {sizeof(big)}, ssmall[1] = {sizeof(small)};
	ulp_st_wtensor t[2] = {{"big", ULP_DT_U8, 1, sbig, big}, {"small", ULP_DT_U8, 1, ssmall, small}};
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, name);
	REQUIRE(ulp_st_write(path, with_big ? t : t + 1, with_big ? 2 : 1, NULL) == 0, "write %s", path);
	in_file(name);
}

typedef struct want {
	char path[128];
	uint8_t *data;
	size_t len;
} want;
typedef struct model {
	want f[16];
	size_t n;
} model;

static want *m_find(model *m, const char *path)
{
	for (size_t i = 0; i < m->n; i++)
		if (!strcmp(m->f[i].path, path))
			return &m->f[i];
	return NULL;
}

static void m_set(model *m, const char *path, const uint8_t *a, size_t al, const uint8_t *b, size_t bl)
{
	want *w = m_find(m, path);
	if (!w) {
		REQUIRE(m->n < 16, "model full");
		w = &m->f[m->n++];
		snprintf(w->path, sizeof(w->path), "%s", path);
	} else {
		free(w->data);
	}
	w->len = al + bl;
	w->data = malloc(w->len + 1);
	if (al)
		memcpy(w->data, a, al);
	if (bl)
		memcpy(w->data + al, b, bl);
}

static void m_del(model *m, const char *path)
{
	want *w = m_find(m, path);
	if (w) {
		free(w->data);
		*w = m->f[--m->n];
	}
}

/* Renames a file, or every file under a directory. */
static void m_rename(model *m, const char *from, const char *to)
{
	size_t fl = strlen(from);
	m_del(m, to);
	for (size_t i = 0; i < m->n; i++) {
		char *p = m->f[i].path, np[128];
		if (!strcmp(p, from) || (!strncmp(p, from, fl) && p[fl] == '/')) {
			snprintf(np, sizeof(np), "%s%s", to, p + fl);
			snprintf(p, sizeof(m->f[i].path), "%s", np);
		}
	}
}

static void m_copy(model *dst, const model *src)
{
	dst->n = 0;
	for (size_t i = 0; i < src->n; i++)
		m_set(dst, src->f[i].path, src->f[i].data, src->f[i].len, NULL, 0);
}

static void m_free(model *m)
{
	for (size_t i = 0; i < m->n; i++)
		free(m->f[i].data);
	m->n = 0;
}

/* ---- operations ---------------------------------------------------------------- */

enum { S_PUT, S_MOUNT_PUT, S_RENAME, S_REMOVE, S_RMDIR_BUSY, S_GC, S_VERIFY, S_FORGET, S_QPUT, S_QFLUSH };

/* S_FORGET p1: ulp_archive_forget(p1, keep the last step and step 100),
 * which in these runs forgets checkpoint-200 alone */
static const int64_t forget_keep[] = {100};
static const ulp_forget_opts forget_opts = {.keep_last = 1, .keep = forget_keep, .n_keep = 1};
#define FORGOTTEN "run/checkpoint-200/model.safetensors"

typedef struct step {
	int op;
	const char *p1, *p2; /* archive paths */
	const char *in;      /* input file (S_PUT) or the bytes a mount appends (S_MOUNT_PUT) */
} step;

typedef struct opdef {
	const char *name;
	int tmpl;            /* the template archive it starts from */
	step s[8];
	size_t n;
} opdef;

static const ulp_meta meta = {0644, 0, 0, {1700000000, 0}};

static int put_file(ulp_archive *a, const char *apath, const char *in)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, in);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -999;
	int rc = ulp_archive_put(a, apath, fd, &meta, NULL);
	close(fd);
	return rc;
}

/* The same through a pipelined put (import's): the file's commit completes
 * at the next call on q. */
static int qput_file(ulp_putq *q, const char *apath, const char *in)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/in/%s", root, in);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -999;
	int rc = ulp_putq_put(q, apath, fd, &meta, NULL);
	close(fd);
	return rc;
}

static char last_bad[1400]; /* what verify said last (no allocation: it runs armed) */

static void bad_count(void *arg, const char *path, const char *why)
{
	snprintf(last_bad, sizeof(last_bad), "%s: %s", path, why);
	(*(int64_t *)arg)++;
}

/* What the mount does with a file modified through it: copy-up of the
 * archived file, a write, fsync (the sidecar), then ulp_archive_put of the
 * staged file (ulpackfs's commit_node) and discarding the staging files. */
static int mount_put(ulp_archive *a, const char *apath, const input *add, uint64_t old_size)
{
	ulp_stage *s = NULL;
	int rc = ulp_stage_new(a, apath, &s);
	if (rc < 0)
		return rc;
	int64_t w = ulp_stage_write(s, add->data, add->len, old_size);
	rc = w < 0 ? (int)w : w != (int64_t)add->len ? -998 : 0;
	if (rc == 0)
		rc = ulp_stage_sync(s, apath, &meta);
	if (rc == 0)
		rc = ulp_archive_put(a, apath, ulp_stage_fd(s), &meta, NULL);
	ulp_stage_discard(s); /* (the mount would keep it staged and retry) */
	return rc;
}

typedef struct run {
	const opdef *op;
	ulp_archive *a;
	uint64_t old_sizes[8];
	int rc;               /* of the step that failed, or 0 */
	size_t done;          /* steps that returned 0 */
	int64_t damaged;      /* S_VERIFY's count */
	ulp_gc_result gc;
	char msg[1024];       /* the failed step's message */
	ulp_putq *q;          /* S_QPUT's queue */
} run;

static void *run_op(void *arg)
{
	run *r = arg;
	const char *stale = "(stale message)";
	F.thread = pthread_self();
	__atomic_store_n(&F.armed, 1, __ATOMIC_RELEASE);
	for (r->done = 0; r->done < r->op->n; r->done++) {
		const step *s = &r->op->s[r->done];
		int rc = 0;
		ulp_arch_err(r->a, 0, "%s", stale);
		switch (s->op) {
		case S_PUT:
			rc = put_file(r->a, s->p1, s->in);
			break;
		case S_MOUNT_PUT:
			rc = mount_put(r->a, s->p1, in_get(s->in), r->old_sizes[r->done]);
			break;
		case S_QPUT: /* a queue's steps come first in an op: done counts its commits */
			if (!r->q && (rc = ulp_putq_new(r->a, &r->q)) < 0)
				break;
			rc = qput_file(r->q, s->p1, s->in);
			break;
		case S_QFLUSH: /* the last commit, then the WAL's fsync */
			if ((rc = ulp_putq_flush(r->q)) == 0) {
				rc = ulp_putq_free(r->q);
				r->q = NULL;
			}
			break;
		case S_RENAME:
			rc = ulp_archive_rename(r->a, s->p1, s->p2);
			break;
		case S_REMOVE:
			rc = ulp_archive_remove(r->a, s->p1);
			break;
		case S_RMDIR_BUSY: /* a directory that is not empty: refused, nothing changes */
			rc = ulp_archive_remove(r->a, s->p1);
			rc = rc == -ULP_E_NOTEMPTY ? 0 : rc < 0 ? rc : -1000;
			break;
		case S_GC:
			rc = ulp_archive_gc(r->a, &r->gc);
			break;
		case S_FORGET: {
			int64_t n = ulp_archive_forget(r->a, s->p1, &forget_opts, NULL, NULL);
			rc = n < 0 ? (int)n : n == 1 ? 0 : -1001;
			break;
		}
		case S_VERIFY: {
			int64_t n = ulp_archive_verify(r->a, "", bad_count, &r->damaged);
			rc = n < 0 ? (int)n : 0;
			if (n > 0)
				r->damaged = n;
			break;
		}
		}
		if (rc < 0) {
			r->rc = rc;
			snprintf(r->msg, sizeof(r->msg), "%s", ulp_archive_errmsg(r->a));
			break;
		}
	}
	if (r->q) { /* after a failure the file in flight, if any, commits or not */
		int frc = ulp_putq_flush(r->q);
		size_t done = ulp_putq_committed(r->q);
		if (r->rc < 0 && (done + 1 < r->done || done > r->done))
			r->rc = -1002; /* a file before the one in flight was lost, or a failed one kept */
		else if (r->rc < 0)
			r->done = done;
		else if (frc < 0)
			r->rc = -1003; /* the last file was still in flight */
		ulp_putq_free(r->q);
		r->q = NULL;
	}
	__atomic_store_n(&F.armed, 0, __ATOMIC_RELEASE);
	return NULL;
}

/* ---- archive copies and checks ---------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
	int in = open(from, O_RDONLY | O_CLOEXEC), out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	REQUIRE(in >= 0 && out >= 0, "copy %s -> %s", from, to);
	char buf[65536];
	ssize_t n;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		REQUIRE(write(out, buf, (size_t)n) == n, "write %s", to);
	close(in);
	close(out);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

static void rm_rf(const char *dir)
{
	REQUIRE(nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0, "remove %s: %s", dir, strerror(errno));
}

/* Copies an archive directory: ulpack.db, the packs, staging/. */
static void copy_archive(const char *from, const char *to)
{
	char a[700], b[700];
	REQUIRE(mkdir(to, 0755) == 0, "mkdir %s", to);
	const char *subs[] = {"", "/packs", "/staging"};
	for (int k = 0; k < 3; k++) {
		snprintf(a, sizeof(a), "%s%s", from, subs[k]);
		snprintf(b, sizeof(b), "%s%s", to, subs[k]);
		if (k)
			REQUIRE(mkdir(b, 0755) == 0, "mkdir %s", b);
		DIR *d = opendir(a);
		REQUIRE(d, "opendir %s", a);
		struct dirent *de;
		while ((de = readdir(d))) {
			char fa[1000], fb[1000];
			struct stat sb;
			snprintf(fa, sizeof(fa), "%s/%s", a, de->d_name);
			snprintf(fb, sizeof(fb), "%s/%s", b, de->d_name);
			if (stat(fa, &sb) == 0 && S_ISREG(sb.st_mode))
				copy_file(fa, fb);
		}
		closedir(d);
	}
}

typedef struct lister {
	char paths[32][128];
	size_t n;
} lister;

static int list_cb(void *arg, const char *path, const ulp_stat *st)
{
	lister *l = arg;
	(void)st;
	if (l->n < 32)
		snprintf(l->paths[l->n], sizeof(l->paths[0]), "%s", path);
	l->n++;
	return 0;
}

typedef struct packcheck {
	ulp_archive *a;
	int bad;
	char why[600];
} packcheck;

static int pack_cb(void *arg, int64_t id, const char *name, uint64_t size, uint64_t live, uint64_t blobs)
{
	packcheck *pc = arg;
	char path[900];
	struct stat sb;
	(void)id, (void)live, (void)blobs;
	snprintf(path, sizeof(path), "%s/packs/%s", ulp_archive_dir(pc->a), name);
	if (stat(path, &sb) < 0 || (uint64_t)sb.st_size != size) {
		pc->bad = 1;
		snprintf(pc->why, sizeof(pc->why), "pack %s: %s", name, errno == ENOENT ? "missing" : "wrong size");
	}
	return 0;
}

static int file_is(ulp_archive *a, const want *w)
{
	ulp_file *f;
	if (ulp_file_open(a, w->path, &f) < 0)
		return 0;
	uint8_t *got = malloc(w->len + 64);
	int ok = ulp_file_pread(f, got, w->len + 64, 0) == (int64_t)w->len && !memcmp(got, w->data, w->len);
	free(got);
	ulp_file_close(f);
	return ok;
}

/* The archive in dir holds exactly m, verifies and has no stray files.
 * Returns 1 if so; else says why on stderr (where names the run). */
static int archive_is(const char *dir, const model *m, int gc_done, const char *where)
{
	ulp_archive *a;
	char err[512];
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 1};
	int ok = 1;
	if (ulp_archive_open(dir, &o, &a, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: reopen: %s\n", where, err);
		return 0;
	}
	int64_t damaged = 0;
	int64_t v = ulp_archive_verify(a, "", bad_count, &damaged);
	if (v != 0) {
		fprintf(stderr, "%s: verify after the fault: %lld (%s)\n", where, (long long)v, ulp_archive_errmsg(a));
		ok = 0;
	}
	lister l = {.n = 0};
	if (ulp_index_files(a, "", list_cb, &l) < 0 || l.n != m->n) {
		fprintf(stderr, "%s: %zu files in the archive, %zu expected\n", where, l.n, m->n);
		ok = 0;
	}
	for (size_t i = 0; i < l.n && i < 32; i++)
		if (!m_find((model *)m, l.paths[i])) {
			fprintf(stderr, "%s: unexpected file %s\n", where, l.paths[i]);
			ok = 0;
		}
	for (size_t i = 0; i < m->n; i++) {
		if (!file_is(a, &m->f[i])) {
			fprintf(stderr, "%s: %s is not its expected content\n", where, m->f[i].path);
			ok = 0;
		}
		char up[128]; /* reachable: every directory above it is there */
		snprintf(up, sizeof(up), "%s", m->f[i].path);
		for (char *sl = strrchr(up, '/'); sl; sl = strrchr(up, '/')) {
			*sl = '\0';
			ulp_stat st;
			if (ulp_archive_stat(a, up, &st) < 0 || !st.is_dir) {
				fprintf(stderr, "%s: %s: directory %s is gone\n", where, m->f[i].path, up);
				ok = 0;
			}
		}
	}
	packcheck pc = {a, 0, ""};
	if (ulp_index_packs(a, pack_cb, &pc) < 0 || pc.bad) {
		fprintf(stderr, "%s: %s\n", where, pc.bad ? pc.why : ulp_archive_errmsg(a));
		ok = 0;
	}
	char sub[700];
	snprintf(sub, sizeof(sub), "%s/packs", dir);
	DIR *d = opendir(sub);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		/* a pack gc dropped from the index whose file it could not then
		 * remove is reclaimed by the next gc (maint.c invariant 3) */
		if (strncmp(de->d_name, "tmp-", 4) == 0 ||
		    (ulp_index_has_pack(a, de->d_name) != 1 && !gc_done)) {
			fprintf(stderr, "%s: stray file packs/%s\n", where, de->d_name);
			ok = 0;
		}
	}
	if (d)
		closedir(d);
	snprintf(sub, sizeof(sub), "%s/staging", dir);
	d = opendir(sub);
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.') {
			fprintf(stderr, "%s: stray file staging/%s\n", where, de->d_name);
			ok = 0;
		}
	if (d)
		closedir(d);
	ulp_archive_close(a);
	return ok;
}

/* ---- the loop ---------------------------------------------------------------- */

static char tmpl_dir[4][512];
static model tmpl_model[4];

/* The state after the first `done` steps of op, from its template. */
static void expected(const opdef *op, size_t done, const uint64_t *old_sizes, model *m)
{
	m_copy(m, &tmpl_model[op->tmpl]);
	(void)old_sizes;
	for (size_t i = 0; i < done; i++) {
		const step *s = &op->s[i];
		if (s->op == S_PUT || s->op == S_QPUT) {
			const input *in = in_get(s->in);
			m_set(m, s->p1, in->data, in->len, NULL, 0);
		} else if (s->op == S_MOUNT_PUT) {
			const input *in = in_get(s->in);
			want *w = m_find(m, s->p1);
			REQUIRE(w, "%s in the model", s->p1);
			uint8_t *old = w->data;
			w->data = NULL;
			m_set(m, s->p1, old, w->len, in->data, in->len);
			free(old);
		} else if (s->op == S_RENAME) {
			m_rename(m, s->p1, s->p2);
		} else if (s->op == S_REMOVE) {
			m_del(m, s->p1);
		} else if (s->op == S_FORGET) {
			m_del(m, FORGOTTEN);
		}
	}
}

static int rc_fits(int kind, int rc)
{
	if (kind == F_MALLOC || kind == F_SQL_NOMEM)
		return rc == -ULP_E_NOMEM;
	return rc == -ULP_E_IO || rc == -ULP_E_NOSPC;
}

typedef struct tally {
	long points[F__COUNT]; /* N that hit a fault */
	long failures;         /* runs that broke a rule */
} tally;

/* One run of op with the target-th call of kind failing (kind < 0: none),
 * and with persist every later one too. Returns 1 if a fault was hit. */
static int one_run(const opdef *op, int kind, long target, int persist, tally *t)
{
	char dir[600], where[200];
	snprintf(dir, sizeof(dir), "%s/run", root);
	snprintf(where, sizeof(where), "%s, %s%s fault at call %ld", op->name, persist ? "persistent " : "",
	         kind >= 0 ? kind_name[kind] : "no", target);
	copy_archive(tmpl_dir[op->tmpl], dir);
	ulp_archive *a;
	char err[512];
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 1};
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	run r = {.op = op, .a = a};
	for (size_t i = 0; i < op->n; i++) { /* sizes before each step, for the mount's appends */
		if (op->s[i].op == S_MOUNT_PUT) {
			ulp_stat st;
			REQUIRE(ulp_archive_stat(a, op->s[i].p1, &st) == 0, "stat %s", op->s[i].p1);
			r.old_sizes[i] = st.size;
		}
	}
	F.kind = kind;
	F.target = target;
	F.persist = persist;
	F.count = 0;
	F.hit = 0;
	F.err_db = NULL;
	last_bad[0] = '\0';
	pthread_t th;
	REQUIRE(pthread_create(&th, NULL, run_op, &r) == 0, "thread");
	pthread_join(th, NULL);
	int hit = F.hit, bad = 0;
	F.kind = -1;
	if (r.rc < 0) {
		const step *s = &op->s[r.done];
		int stale = !strcmp(r.msg, "(stale message)") || !strcmp(r.msg, "no error");
		if (!hit) {
			fprintf(stderr, "%s: step %zu failed with no fault: %s\n", where, r.done, r.msg);
			bad = 1;
		} else if (!rc_fits(kind, r.rc)) {
			fprintf(stderr, "%s: step %zu returned %d (%s): %s\n", where, r.done, r.rc, ulp_strerror(r.rc),
			        stale ? "(no message)" : r.msg);
			bad = 1;
		} else if (kind != F_MALLOC && (stale || !strchr(r.msg, '/'))) {
			fprintf(stderr, "%s: step %zu: %s: message names no file: %s\n", where, r.done,
			        ulp_strerror(r.rc), stale ? "(no message)" : r.msg);
			bad = 1;
		}
		(void)s;
	} else if (r.damaged && !((kind == F_SQL || kind == F_SQL_NOMEM) && strstr(last_bad, "ulpack.db"))) {
		/* damage it is only where the index itself cannot be read */
		fprintf(stderr, "%s: verify reported %lld damaged files (%s)\n", where, (long long)r.damaged, last_bad);
		bad = 1;
	}
	if (!hit && r.rc == 0 && op->s[op->n - 1].op == S_GC && r.gc.bytes_reclaimed == 0) {
		fprintf(stderr, "%s: gc reclaimed nothing\n", where);
		bad = 1;
	}
	ulp_archive_close(a);
	model m = {.n = 0};
	expected(op, r.done, r.old_sizes, &m);
	if (!archive_is(dir, &m, r.rc == 0 && op->s[op->n - 1].op == S_GC, where))
		bad = 1;
	m_free(&m);
	rm_rf(dir);
	if (hit && kind >= 0 && !persist)
		t->points[kind]++;
	if (bad)
		t->failures++;
	return hit;
}

static void fault_loop(const opdef *op)
{
	tally t = {{0}, 0};
	int clean = one_run(op, -1, 0, 0, &t) == 0 && t.failures == 0;
	CHECK(clean, "%s runs without faults", op->name);
	if (!clean)
		return;
	for (int persist = 0; persist < 2; persist++)
		for (int k = 0; k < F__COUNT; k++) {
			long n = 1;
			while (one_run(op, k, n, persist, &t) && n < 100000)
				n++;
			CHECK(n < 100000, "%s: %s faults end", op->name, kind_name[k]);
		}
	printf("%s: %ld malloc, %ld write, %ld fsync, %ld rename, %ld sqlite, %ld sqlite prepare NOMEM fault points,"
	       " each failing once and from there on\n", op->name, t.points[F_MALLOC], t.points[F_WRITE],
	       t.points[F_FSYNC], t.points[F_RENAME], t.points[F_SQL], t.points[F_SQL_NOMEM]);
	CHECK(t.failures == 0, "%s: %ld fault runs broke a rule (above)", op->name, t.failures);
}

/* Builds template archive k: a copy of template `from` (or an empty archive
 * if from < 0) with steps applied (puts and removes, no faults). */
static void make_template(int k, int from, const step *s, size_t n)
{
	snprintf(tmpl_dir[k], sizeof(tmpl_dir[k]), "%s/tmpl%d", root, k);
	char err[512];
	if (from >= 0)
		copy_archive(tmpl_dir[from], tmpl_dir[k]);
	else
		REQUIRE(ulp_archive_init(tmpl_dir[k], err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive *a;
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 1};
	REQUIRE(ulp_archive_open(tmpl_dir[k], &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	opdef op = {"template", from >= 0 ? from : k, {{0}}, n};
	for (size_t i = 0; i < n; i++) {
		int rc = s[i].op == S_PUT ? put_file(a, s[i].p1, s[i].in) : ulp_archive_remove(a, s[i].p1);
		REQUIRE(rc == 0, "template %d step %zu: %s", k, i, ulp_archive_errmsg(a));
		op.s[i] = s[i];
	}
	ulp_archive_close(a);
	model m = {.n = 0};
	expected(&op, n, NULL, &m); /* from the (empty) model k or the model of from */
	tmpl_model[k] = m;
}

int main(void)
{
	/* thousands of archives, each fsynced: on tmpfs when TMPDIR does not say
	 * otherwise (the test is about errors, not about durability) */
	const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
	snprintf(root, sizeof(root), "%s/ulp-faults-XXXXXX", tmp);
	REQUIRE(mkdtemp(root), "mkdtemp");
	char in[600];
	snprintf(in, sizeof(in), "%s/in", root);
	REQUIRE(mkdir(in, 0755) == 0, "mkdir %s", in);
	F.kind = -1;
	in_step("s100", 1);
	in_step("s200", 2);
	in_step("s300", 3);
	in_bigsmall("x", 1);
	in_bigsmall("y", 0);
	static const char cfg1[] = "{\"lr\": 0.001, \"warmup\": 100}\n", cfg2[] = "{\"lr\": 0.0005}\n",
	                  notes[] = "notes of a run\n", more[] = "{\"resumed\": true}\n";
	in_bytes("cfg1", cfg1, sizeof(cfg1) - 1);
	in_bytes("cfg2", cfg2, sizeof(cfg2) - 1);
	in_bytes("notes", notes, sizeof(notes) - 1);
	in_bytes("more", more, sizeof(more) - 1);

	/* template 0: two steps (a delta), a config, notes, x (big + small), y (small: shared) */
	static const step base[] = {
		{S_PUT, "run/checkpoint-100/model.safetensors", NULL, "s100"},
		{S_PUT, "run/checkpoint-200/model.safetensors", NULL, "s200"},
		{S_PUT, "run/config.json", NULL, "cfg1"},
		{S_PUT, "notes/a.txt", NULL, "notes"},
		{S_PUT, "big/x.safetensors", NULL, "x"},
		{S_PUT, "y.safetensors", NULL, "y"},
	};
	make_template(0, -1, base, sizeof(base) / sizeof(base[0]));
	/* template 1: step 200 and x removed: gc drops one pack, rewrites another */
	static const step removed[] = {
		{S_REMOVE, "run/checkpoint-200/model.safetensors", NULL, NULL},
		{S_REMOVE, "big/x.safetensors", NULL, NULL},
	};
	make_template(1, 0, removed, 2);
	/* template 2: step 300 (a delta of 200, a delta of 100) */
	static const step third[] = {
		{S_PUT, "run/checkpoint-300/model.safetensors", NULL, "s300"},
	};
	make_template(2, 0, third, 1);
	/* template 3: that, and step 200 removed: 300 needs re-basing before
	 * gc can drop 200's blobs */
	static const step rm200[] = {
		{S_REMOVE, "run/checkpoint-200/model.safetensors", NULL, NULL},
	};
	make_template(3, 2, rm200, 1);

	static const opdef ops[] = {
		{"import", 0, {
			{S_PUT, "run/checkpoint-300/model.safetensors", NULL, "s300"}, /* a delta */
			{S_PUT, "run/config.json", NULL, "cfg2"},                     /* replaces */
			{S_PUT, "notes/b.txt", NULL, "notes"},                        /* deduplicated */
		}, 3},
		{"mount", 0, {
			{S_MOUNT_PUT, "run/config.json", NULL, "more"},
			{S_RENAME, "run/config.json", "run/config.old.json", NULL},
			{S_REMOVE, "notes/a.txt", NULL, NULL},
			{S_RENAME, "run", "run2", NULL},
			{S_RMDIR_BUSY, "run2", NULL, NULL},
		}, 5},
		{"gc", 1, {{S_GC, NULL, NULL, NULL}}, 1},
		{"verify", 0, {{S_VERIFY, NULL, NULL, NULL}}, 1},
		/* re-basing (recode.c) under faults: gc re-codes step 300 against
		 * step 100, then drops step 200's blobs */
		{"rebase-gc", 3, {{S_GC, NULL, NULL, NULL}}, 1},
		{"forget", 2, {{S_FORGET, "run", NULL, NULL}, {S_GC, NULL, NULL, NULL}}, 2},
		/* import's pipelined put: each file's pack made durable on a thread
		 * of its own while the next one codes (a fault there fails the next
		 * call, and the archive holds exactly the files committed before) */
		{"pipelined import", 0, {
			{S_QPUT, "run/checkpoint-300/model.safetensors", NULL, "s300"}, /* a delta */
			{S_QPUT, "run/checkpoint-400/model.safetensors", NULL, "s300"}, /* dedup of the one in flight */
			{S_QPUT, "run/config.json", NULL, "cfg2"},
			{S_QPUT, "notes/b.txt", NULL, "notes"},
			{S_QFLUSH, NULL, NULL, NULL},
		}, 5},
	};
	const char *only = getenv("ULP_FAULT_OP");
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		if (!only || !strcmp(only, ops[i].name))
			fault_loop(&ops[i]);

	for (int k = 0; k < 4; k++)
		m_free(&tmpl_model[k]);
	for (size_t i = 0; i < n_inputs; i++)
		free(inputs[i].data);
	rm_rf(root);
	return tap_done();
}
