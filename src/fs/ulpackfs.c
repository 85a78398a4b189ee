/* SPDX-License-Identifier: MIT */
/*
 * ulpackfs.c - the FUSE3 front end: mounts an archive so that every archived
 * file reads as a plain file, and files written into the mount (rsync, cp,
 * dd, tar, shell redirection, a trainer's save) are staged and archived in
 * the background once closed under their final name.
 *
 * Plumbing only: each operation is one libulpack call (the write-back
 * session, src/lib/archive/session.c, holds every open-file rule and
 * invariant) and one errno mapping; errors are mapped, never invented.
 *
 * It uses libfuse's path-based API: the archive's index is keyed by path.
 *  1. hard_remove is off: libfuse renames a file unlinked (or replaced)
 *     while open to ".fuse_hiddenXXXXXXXXXXXXXXXX" and unlinks that name at
 *     its last close; the session knows those names (session.c invariant 6).
 *  2. Archived files are immutable: opened read-only they keep the kernel
 *     page cache (keep_cache) and no direct_io, so mmap works.
 *  3. Paths may be NULL in operations that take a file handle (libfuse gives
 *     NULL when a node has no name); those use the handle.
 *  4. The mount root's xattrs: user.ulpack.counters (decode and archiving
 *     counters), user.ulpack.status (ulpack status: status.c's JSON of
 *     ulp_status_get), user.ulpack.sync (reading it is the barrier of `ulpack
 *     sync`: it returns when everything closed before is archived, with
 *     "ok" or one line per failed file; a file still open for writing is
 *     not waited for, session.c invariant 12), user.ulpack.space (the
 *     archive's disk use: ulp_space_json; df of the mount counts the same
 *     disk bytes as used). Every file's user.ulpack.state says
 *     staged, archived or failed with the errno and cause. A directory's
 *     user.ulpack.dynamics (asked for by name, not listed: it is computed
 *     at each read) is the compact JSON of ulp_archive_dynamics of it as a
 *     run, the index-only view of what is archived (ENODATA: no tensor
 *     with a step under it; E2BIG past the 64 KiB of an xattr).
 *  5. Writers: see direct_writer().
 *  6. Listing and lookup agree: a name readdir lists is found by lookup.
 *     A read-write mount keeps no negative entries; a read-only mount that
 *     follows a shared archive's generations keeps none either, as a new
 *     generation adds names that the kernel may have cached as missing;
 *     the entries and attributes it keeps are positive, and a generation
 *     only adds what the writer archived, so they never hide a listed
 *     name. Only a read-only mount of an unshared archive caches misses
 *     (10 s).
 *  7. Interrupts: every worker thread's library calls ask libfuse whether
 *     the request it serves was interrupted (intr_on: ulp_set_interrupt
 *     with fuse_interrupted), so a wait on an object store ends within
 *     about a second of a FUSE_INTERRUPT (the program waiting got a
 *     signal) and the request answers EINTR. Cached reads, lookups and
 *     listings of an s3:// archive never wait on the bucket (the library's
 *     poller looks for new generations in the background).
 *  8. Logging: every line goes through fs.log (status.c's ulp_log) once the
 *     archive is open: an error once per operation and file (log_err's key),
 *     the session's notes (a line per archived step), a shared archive's
 *     lines prefixed with the host; -o metrics=PATH has its own thread
 *     (metrics_writer), stopped before the session closes.
 */
#define FUSE_USE_VERSION 312
#include "config.h"
#include "ulpack.h"
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <fuse_lowlevel.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#define ULPFS_MAX_READ (4 << 20) /* large reads: whole chunks per request */

static struct {
	ulp_archive *a;
	ulp_session *s;        /* NULL when read-only */
	char *archive;     /* as given: a directory (made absolute) or an s3:// URL */
	char *home;        /* the archive's directory: the local home of an s3:// one */
	int read_only, foreground;
	int no_latest;         /* -o nolatest: no `latest` symlinks */
	int no_dio;            /* (measuring only) no direct I/O for writers */
	int lock_fd;           /* the mount lock (read-write mounts), or -1; -2: a shared archive
	                          whose lock another host still holds, fenced by the lease */
	unsigned kept;         /* files left staged at unmount (exit status 1) */
	uint64_t cache_size, staging_max;
	unsigned max_chain;
	int threads;
	char *mountpoint;
	uint64_t readahead;    /* bytes; 0: the kernel's window */
	FILE *logf;            /* ARCHIVE/ulpackfs.log when there is no syslog */
	pthread_mutex_t logmu;
	ulp_log *log;          /* set once the archive is open: errors once, host named (status.c) */
	char *metrics;         /* -o metrics=PATH, or NULL */
	unsigned metrics_s;    /* -o metrics_interval=SECONDS */
	char host[256];
	pthread_t metrics_th;
	int metrics_on, metrics_stop; /* guarded by metrics_mu */
	pthread_mutex_t metrics_mu;
	pthread_cond_t metrics_cv;
} fs = {.logmu = PTHREAD_MUTEX_INITIALIZER, .metrics_mu = PTHREAD_MUTEX_INITIALIZER,
        .metrics_cv = PTHREAD_COND_INITIALIZER, .metrics_s = 5};

static int err_of(int rc)
{
	return -ulp_to_errno(rc);
}

/* errors and notes (a line per archived step): syslog, stderr with -f,
 * ARCHIVE/ulpackfs.log without syslog; through fs.log once the archive is
 * open (each error once, a shared archive's lines naming the host) */
static void log_sink(void *arg, int is_error, const char *msg)
{
	(void)arg;
	syslog(is_error ? LOG_ERR : LOG_INFO, "ulpackfs: %s", msg);
	pthread_mutex_lock(&fs.logmu);
	if (fs.foreground)
		fprintf(stderr, "ulpackfs: %s\n", msg);
	if (fs.logf) {
		time_t t = time(NULL);
		char ts[32];
		strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", localtime(&t));
		fprintf(fs.logf, "%s ulpackfs[%ld]: %s\n", ts, (long)getpid(), msg);
		fflush(fs.logf);
	}
	pthread_mutex_unlock(&fs.logmu);
}

static void log_msg(void *arg, const char *msg)
{
	if (fs.log)
		ulp_log_error(fs.log, NULL, msg);
	else
		log_sink(arg, 1, msg);
}

static void log_note(void *arg, const char *msg)
{
	if (fs.log)
		ulp_log_note(fs.log, msg);
	else
		log_sink(arg, 0, msg);
}

/* rc's code names the cause where the library left no message */
static void log_err(const char *what, const char *path, int rc)
{
	char m[4400];
	const char *why = ulp_archive_errmsg(fs.a);
	snprintf(m, sizeof(m), "%s %s: %s", what, path, strcmp(why, "no error") ? why : ulp_strerror(rc));
	char key[4200]; /* one line per operation and file: the kernel retries a failed read */
	snprintf(key, sizeof(key), "%s %s", what, path);
	if (fs.log)
		ulp_log_error(fs.log, key, m);
	else
		log_sink(NULL, 1, m);
}

static const char *rel(const char *path)
{
	while (*path == '/')
		path++;
	return path;
}

static void set_time(struct timespec *t, ulp_time u)
{
	t->tv_sec = (time_t)u.sec; /* a 64-bit time_t holds every second of a ulp_time */
	t->tv_nsec = (long)u.nsec;
}

static void fill_stat(const ulp_stat *s, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_mode = s->mode;
	st->st_nlink = s->is_dir ? 2 : 1;
	st->st_uid = s->uid;
	st->st_gid = s->gid;
	st->st_size = (off_t)s->size;
	st->st_blksize = 1 << 20;
	/* du shows what the archive really holds for this file */
	st->st_blocks = (blkcnt_t)((s->is_dir || s->is_symlink ? 0 : s->stored_bytes + 511) / 512);
	set_time(&st->st_mtim, s->mtime);
	st->st_atim = st->st_ctim = st->st_mtim;
}

/* a read-only mount has no session: its handles are plain ulp_files */
typedef struct handle {
	ulp_sfile *sf;
	ulp_file *file;
} handle;

#define H(fi) ((handle *)(uintptr_t)(fi)->fh)

/* ---- operations ------------------------------------------------------------ */

static void readahead_once(void);

/* invariant 7: the thread's library calls end their waits when libfuse
 * says the request it serves was interrupted (once per worker thread) */
static int fuse_intr_check(void *arg)
{
	(void)arg;
	return fuse_interrupted();
}

static void intr_on(void)
{
	static __thread int on;
	if (!on) {
		ulp_set_interrupt(fuse_intr_check, NULL);
		on = 1;
	}
}

/* -o metrics=PATH: the status in Prometheus's text format, written whole
 * (status.c invariant 3) at start, every metrics_s seconds and at unmount */
static void write_metrics(void)
{
	ulp_status st;
	if (ulp_status_get(fs.a, fs.s, fs.log, &st) < 0) {
		ulp_log_error(fs.log, "metrics status", ulp_archive_errmsg(fs.a));
		return;
	}
	size_t cap = 16384;
	char *buf = malloc(cap);
	int n = buf ? ulp_status_metrics(&st, fs.archive, fs.host, buf, cap) : -ULP_E_NOMEM;
	char m[4400];
	if (n >= 0 && ulp_status_write_file(fs.metrics, buf, (size_t)n) < 0) {
		snprintf(m, sizeof(m), "metrics %s: %s", fs.metrics, strerror(errno));
		ulp_log_error(fs.log, "metrics write", m);
	}
	free(buf);
}

static void *metrics_writer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fs.metrics_mu);
	while (!fs.metrics_stop) {
		pthread_mutex_unlock(&fs.metrics_mu);
		write_metrics();
		pthread_mutex_lock(&fs.metrics_mu);
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += fs.metrics_s;
		while (!fs.metrics_stop && pthread_cond_timedwait(&fs.metrics_cv, &fs.metrics_mu, &ts) == 0)
			;
	}
	pthread_mutex_unlock(&fs.metrics_mu);
	write_metrics();
	return NULL;
}

static void *ulpfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->max_read = ULPFS_MAX_READ; /* must match -o max_read (main) */
	conn->max_write = 1 << 20;       /* the kernel caps it to what it supports */
	/* a file written with direct I/O (open_handle): the kernel sends a large
	 * write(2) as several requests at once, to several worker threads */
	if (conn->capable & FUSE_CAP_ASYNC_DIO)
		conn->want |= FUSE_CAP_ASYNC_DIO;
	{ /* (measuring only: ULPFS_EXP=wb asks for the kernel's write-back
	   * cache, nodio writes through the page cache as before) */
		const char *x = getenv("ULPFS_EXP");
		if (x && strstr(x, "wb") && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
			conn->want |= FUSE_CAP_WRITEBACK_CACHE;
		if (x && strstr(x, "noasync"))
			conn->want &= ~(unsigned)FUSE_CAP_ASYNC_DIO;
		fs.no_dio = x && strstr(x, "nodio");
	}
	cfg->hard_remove = 0;   /* unlinked open files keep a (hidden) name: invariant 1 */
	cfg->use_ino = 0;
	cfg->kernel_cache = 0;  /* per open: keep_cache for archived files only */
	cfg->entry_timeout = cfg->attr_timeout = fs.read_only ? 3600.0 : 1.0;
	cfg->negative_timeout = fs.read_only ? 10.0 : 0.0;
	ulp_generation g;
	if (fs.a && ulp_archive_generation(fs.a, &g) == 0 && g.shared && fs.read_only) {
		/* following a writer's generations: what the kernel knows goes stale
		 * at most a poll interval (at most 1 s) after a new generation. No
		 * negative entries (invariant 6): a name looked up before its step
		 * was published (a reader waiting for it) would answer ENOENT after
		 * readdir lists it */
		double t = g.poll_ms < 1000 ? g.poll_ms / 1000.0 : 1.0;
		cfg->entry_timeout = cfg->attr_timeout = t;
		cfg->negative_timeout = 0.0;
	}
	/* started here, in the process that serves (after daemonizing) */
	if (!fs.read_only) {
		ulp_session_opts so = {fs.staging_max, log_msg, NULL, log_note};
		int rc = ulp_session_open(fs.a, &so, &fs.s);
		if (rc < 0)
			log_err("starting the write-back session of", fs.archive, rc);
	}
	if (fs.metrics) {
		pthread_mutex_lock(&fs.metrics_mu);
		fs.metrics_on = pthread_create(&fs.metrics_th, NULL, metrics_writer, NULL) == 0;
		pthread_mutex_unlock(&fs.metrics_mu);
		if (!fs.metrics_on)
			log_msg(NULL, "cannot start the metrics writer");
	}
	return NULL;
}

static void ulpfs_destroy(void *p)
{
	(void)p;
	pthread_mutex_lock(&fs.metrics_mu);
	int on = fs.metrics_on;
	fs.metrics_stop = 1;
	pthread_cond_broadcast(&fs.metrics_cv);
	pthread_mutex_unlock(&fs.metrics_mu);
	if (on) /* (its last write: before the session goes) */
		pthread_join(fs.metrics_th, NULL);
	fs.kept = ulp_session_close(fs.s); /* drains the queue, re-bases, keeps what fails in staging */
	fs.s = NULL;
}

#define RW_OR_EROFS() do { if (!fs.s) return -EROFS; } while (0)

/*
 * `latest`: in each run directory (ulp_archive_latest_live), a read-only
 * symlink to its highest step directory or step file whose files are all
 * closed, unless a real entry has that name (in the archive, or staged).
 * Found by lookup only, never listed by readdir, so that copies (cp -r,
 * shutil.copytree, rsync --delete) see each checkpoint once. 1 and its
 * target if p is one, else 0.
 */
static int virtual_latest(const char *p, char *target, size_t cap)
{
	const char *slash = strrchr(p, '/');
	const char *name = slash ? slash + 1 : p;
	char dir[ULP_PATH_MAX + 1];
	ulp_stat s;
	if (fs.no_latest || strcmp(name, "latest") || (size_t)(name - p) > sizeof(dir))
		return 0;
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - p) : 0, p);
	int real = (fs.s ? ulp_session_stat(fs.s, p, &s) : ulp_archive_stat(fs.a, p, &s)) != -ULP_E_NOENT;
	return !real && ulp_archive_latest_live(fs.a, fs.s, dir, target, cap) == 0;
}

/* The stat of p's `latest` (target: its step's name): owner and mtime of
 * that step directory or file, mode 0444 (read-only). */
static void latest_stat(const char *p, const char *target, struct stat *st)
{
	char tp[ULP_PATH_MAX + 1];
	ulp_stat ts;
	const char *slash = strrchr(p, '/');
	snprintf(tp, sizeof(tp), "%.*s%s%s", slash ? (int)(slash - p) : 0, p, slash ? "/" : "", target);
	if ((fs.s ? ulp_session_stat(fs.s, tp, &ts) : ulp_archive_stat(fs.a, tp, &ts)) == 0)
		fill_stat(&ts, st);
	else
		memset(st, 0, sizeof(*st));
	st->st_mode = S_IFLNK | 0444;
	st->st_nlink = 1;
	st->st_size = (off_t)strlen(target);
	st->st_blocks = 0;
}

static int ulpfs_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	readahead_once();
	intr_on();
	ulp_stat s;
	int rc;
	if (fi && fi->fh && H(fi)->sf)
		rc = ulp_session_fstat(H(fi)->sf, &s);
	else if (fi && fi->fh && H(fi)->file)
		s = *ulp_file_get_stat(H(fi)->file), rc = 0;
	else if (!path)
		return -ESTALE; /* invariant 3 */
	else
		rc = fs.s ? ulp_session_stat(fs.s, rel(path), &s) : ulp_archive_stat(fs.a, rel(path), &s);
	char target[ULP_NAME_MAX + 1];
	if (rc == -ULP_E_NOENT && path && virtual_latest(rel(path), target, sizeof(target))) {
		latest_stat(rel(path), target, st);
		return 0;
	}
	if (rc < 0)
		return err_of(rc);
	fill_stat(&s, st);
	return 0;
}

typedef struct rd {
	void *buf;
	fuse_fill_dir_t filler;
} rd;

static int readdir_cb(void *arg, const char *name, const ulp_stat *s)
{
	rd *r = arg;
	if (ulp_session_hidden_name(name))
		return 0;
	struct stat st;
	fill_stat(s, &st);
	return r->filler(r->buf, name, &st, 0, FUSE_FILL_DIR_PLUS) ? 1 : 0;
}

static int ulpfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                         struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off, (void)fi, (void)flags;
	readahead_once();
	intr_on();
	if (!path)
		return -ESTALE; /* invariant 3: a directory removed while open */
	filler(buf, ".", NULL, 0, 0);
	filler(buf, "..", NULL, 0, 0);
	rd r = {buf, filler};
	const char *p = rel(path);
	int rc = fs.s ? ulp_session_readdir(fs.s, p, readdir_cb, &r) : ulp_archive_readdir(fs.a, p, readdir_cb, &r);
	return rc < 0 ? err_of(rc) : 0; /* `latest` is not listed (virtual_latest) */
}

/*
 * Invariant 5: a file opened write-only, or created read-write under a
 * temporary name (rsync's .name.XXXXXX), is written with direct I/O: each
 * write(2) goes to the daemon from the writer's own pages (no copy into the
 * mount's page cache, and no security.capability lookup before each
 * write), in requests of up to 1 MiB, several at once. mmap needs a
 * read-write handle, so write-only ones lose nothing; files opened
 * read-write otherwise keep the page cache (mmap, shared with readers).
 */
static int direct_writer(const char *p, int flags, const ulp_meta *create)
{
	int acc = flags & O_ACCMODE;
	return acc == O_WRONLY || (acc == O_RDWR && create && ulp_session_temp_name(p));
}

/*
 * A write(2) or truncation by a process without CAP_FSETID clears S_ISUID,
 * and S_ISGID with group execute. The kernel does that (by a chmod) for
 * writes through the page cache only: direct I/O writes and O_TRUNC opens
 * come here as they are. Taken as having CAP_FSETID: uid 0.
 */
static int fsetid(void)
{
	struct fuse_context *cx = fuse_get_context();
	return !cx || cx->uid == 0;
}

static int open_handle(const char *p, struct fuse_file_info *fi, const ulp_meta *create)
{
	handle *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	int rc;
	if (fs.s) {
		rc = ulp_session_open_file(fs.s, p, fi->flags, create, &h->sf);
		if (rc == 0 && !create && (fi->flags & O_TRUNC) && !fsetid() && (rc = ulp_session_kill_suid(h->sf)) < 0)
			ulp_session_release(h->sf);
		fi->keep_cache = rc == 0 && ulp_session_file_archived(h->sf); /* invariant 2 */
		fi->direct_io = rc == 0 && !fi->keep_cache && !fs.no_dio && direct_writer(p, fi->flags, create);
	} else if (create || (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC)) {
		free(h);
		return -EROFS;
	} else {
		rc = ulp_file_open(fs.a, p, &h->file);
		fi->keep_cache = 1;
	}
	if (rc < 0) {
		free(h);
		return err_of(rc);
	}
	fi->fh = (uint64_t)(uintptr_t)h;
	return 0;
}

static int ulpfs_open(const char *path, struct fuse_file_info *fi)
{
	readahead_once();
	intr_on();
	return open_handle(rel(path), fi, NULL);
}

static int ulpfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	intr_on();
	struct fuse_context *cx = fuse_get_context();
	ulp_meta m = {mode & 07777, cx ? cx->uid : 0, cx ? cx->gid : 0, {0, 0}};
	return open_handle(rel(path), fi, &m);
}

static int ulpfs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	intr_on();
	handle *h = H(fi);
	int64_t n = h->sf ? ulp_session_read(h->sf, buf, size, (uint64_t)off)
	                  : ulp_file_pread(h->file, buf, size, (uint64_t)off);
	if (n < 0) {
		if (n != -ULP_E_INTR) /* (the reader gave up: nothing wrong) */
			log_err("read", path ? path : "(unlinked file)", (int)n);
		return err_of((int)n); /* a damaged blob: EIO, never wrong bytes */
	}
	return (int)n;
}

static int ulpfs_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	if (!H(fi)->sf)
		return -EBADF;
	if (!fsetid()) /* direct I/O writes get no chmod from the kernel */
		ulp_session_kill_suid(H(fi)->sf);
	int64_t w = ulp_session_write(H(fi)->sf, buf, size, (uint64_t)off);
	return w < 0 ? err_of((int)w) : (int)w;
}

/* close(2): the session records the file in staging and queues it */
static int ulpfs_flush(const char *path, struct fuse_file_info *fi)
{
	int rc = H(fi)->sf ? ulp_session_flush(H(fi)->sf) : 0;
	if (rc < 0)
		log_err("recording the staged file of", path ? path : "(unlinked file)", rc);
	return rc < 0 ? err_of(rc) : 0;
}

/*
 * Packs removed by gc (`ulpack gc` on the mounted archive) stay mapped while
 * an open file or a cached blob uses them; the daemon lets go of the others
 * at statfs (df: how one sees the space come back) and, at most once a
 * second, at the close of an archived file, so that their space goes back
 * before unmount.
 */
static void trim_packs(int always)
{
	static int64_t last; /* CLOCK_MONOTONIC seconds of the last trim */
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	int64_t prev = __atomic_load_n(&last, __ATOMIC_RELAXED);
	if (!always && (t.tv_sec == prev || !__atomic_compare_exchange_n(&last, &prev, (int64_t)t.tv_sec, 0,
	                                                                 __ATOMIC_RELAXED, __ATOMIC_RELAXED)))
		return;
	int n = ulp_archive_trim(fs.a);
	if (n > 0)
		syslog(LOG_INFO, "ulpackfs: %s: let go of %d packs removed by gc", fs.archive, n);
}

static int ulpfs_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	handle *h = H(fi);
	int archived = h->file || (h->sf && ulp_session_file_archived(h->sf));
	ulp_session_release(h->sf);
	if (h->file)
		ulp_file_close(h->file);
	free(h);
	if (archived)
		trim_packs(0);
	return 0;
}

static int ulpfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	int rc = H(fi)->sf ? ulp_session_fsync(H(fi)->sf) : 0;
	if (rc < 0)
		log_err("fsync", path ? path : "(unlinked file)", rc);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	RW_OR_EROFS();
	int rc;
	if (fi && fi->fh && H(fi)->sf)
		rc = ulp_session_ftruncate(H(fi)->sf, (uint64_t)size);
	else if (!path)
		return -ESTALE; /* invariant 3 */
	else
		rc = ulp_session_truncate(fs.s, rel(path), (uint64_t)size);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_rename(const char *from, const char *to, unsigned int flags)
{
	if (flags & RENAME_EXCHANGE)
		return -EINVAL;
	RW_OR_EROFS();
	int rc = ulp_session_rename(fs.s, rel(from), rel(to), flags & RENAME_NOREPLACE ? ULP_RENAME_NOREPLACE : 0);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_unlink(const char *path)
{
	RW_OR_EROFS();
	int rc = ulp_session_unlink(fs.s, rel(path));
	/* computed, nothing to remove: rsync --delete carries on; and a
	 * `latest` gone with the last step the kernel still knew of (rm -r in
	 * another order) is removed too */
	if (rc == -ULP_E_NOENT && !fs.no_latest && !strcmp(strrchr(path, '/') + 1, "latest"))
		return 0;
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_mkdir(const char *path, mode_t mode)
{
	RW_OR_EROFS();
	struct fuse_context *cx = fuse_get_context();
	ulp_meta m = {mode & 07777, cx->uid, cx->gid, ulp_time_now()};
	int rc = ulp_session_mkdir(fs.s, rel(path), &m);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_rmdir(const char *path)
{
	RW_OR_EROFS();
	int rc = ulp_session_rmdir(fs.s, rel(path));
	return rc < 0 ? err_of(rc) : 0; /* NOTEMPTY -> ENOTEMPTY */
}

static int ulpfs_symlink(const char *target, const char *path)
{
	RW_OR_EROFS();
	struct fuse_context *cx = fuse_get_context();
	ulp_meta m = {0777, cx->uid, cx->gid, ulp_time_now()};
	int rc = ulp_archive_symlink(fs.a, rel(path), target, &m);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_readlink(const char *path, char *buf, size_t size)
{
	intr_on();
	int rc = ulp_archive_readlink(fs.a, rel(path), buf, size);
	char target[ULP_NAME_MAX + 1];
	if (rc == -ULP_E_NOENT && size > 0 && virtual_latest(rel(path), target, sizeof(target))) {
		snprintf(buf, size, "%s", target); /* truncated as readlink(2) does */
		return 0;
	}
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_link(const char *from, const char *to)
{
	(void)from;
	int rc = ulp_path_check(rel(to));
	if (rc < 0)
		return err_of(rc);
	return -EPERM; /* no hard links: an archive path names exactly one file */
}

static int setattr(const char *path, unsigned which, const ulp_meta *m, struct fuse_file_info *fi)
{
	RW_OR_EROFS();
	ulp_sfile *sf = fi && fi->fh ? H(fi)->sf : NULL;
	if (!path && !sf)
		return -ESTALE; /* invariant 3 */
	int rc = ulp_session_setattr(fs.s, path ? rel(path) : NULL, sf, which, m);
	if (rc < 0 && rc != -ULP_E_NOENT)
		log_err("changing attributes of", path ? path : "(unlinked file)", rc);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	ulp_meta m = {.mode = mode};
	return setattr(path, ULP_SET_MODE, &m, fi);
}

static int ulpfs_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	ulp_meta m = {.uid = uid, .gid = gid};
	return setattr(path, ULP_SET_OWNER, &m, fi);
}

static int ulpfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	if (tv[1].tv_nsec == UTIME_OMIT)
		return 0;
	ulp_meta m = {.mtime = tv[1].tv_nsec == UTIME_NOW ? ulp_time_now() : ulp_time_make(tv[1].tv_sec, tv[1].tv_nsec)};
	return setattr(path, ULP_SET_MTIME, &m, fi);
}

/*
 * df of the mount: the size is what the archive takes on disk (ulp_archive_disk_bytes,
 * as du counts it) plus the space still available beside it, so that "Used"
 * is the archive's own disk use and "Avail" the file system's. Measured at
 * most once a second. An s3:// archive's "Used" is its bucket's bytes (the
 * library lists the bucket in the background, at most 30 s old; the local
 * home is a cache), and "Avail" the local home's file system's.
 */
static int ulpfs_statfs(const char *path, struct statvfs *st)
{
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	static int64_t last = -1;   /* CLOCK_MONOTONIC seconds of the last measure (mu) */
	static uint64_t used;       /* its disk bytes (mu) */
	(void)path;
	readahead_once();
	intr_on();
	trim_packs(1);
	if (statvfs(fs.home, st) < 0)
		return -errno;
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	pthread_mutex_lock(&mu);
	if (last != (int64_t)t.tv_sec) {
		used = ulp_archive_disk_bytes(fs.a);
		last = (int64_t)t.tv_sec;
	}
	uint64_t u = used;
	pthread_mutex_unlock(&mu);
	uint64_t fr = st->f_frsize ? st->f_frsize : 4096;
	st->f_blocks = (fsblkcnt_t)((u + fr - 1) / fr + st->f_bavail);
	st->f_bfree = st->f_bavail;
	return 0;
}

/* getxattr's reply: the length when size is 0, else the value */
static int xattr_reply(char *value, size_t size, const char *v)
{
	size_t l = strlen(v);
	if (size == 0)
		return (int)l;
	if (size < l)
		return -ERANGE;
	memcpy(value, v, l);
	return (int)l;
}

/* user.ulpack.* : step, sha256, stored_bytes, ratio, chain_depth, anchor, state */
static const char *const xattrs[] = {"user.ulpack.step", "user.ulpack.sha256", "user.ulpack.stored_bytes",
                                     "user.ulpack.ratio", "user.ulpack.chain_depth", "user.ulpack.anchor",
                                     "user.ulpack.state"};

typedef struct failed_list {
	char *buf;
	size_t len, cap;
} failed_list;

static void sync_failed(void *arg, const char *path, const char *why)
{
	failed_list *l = arg;
	size_t need = strlen(path) + strlen(why) + 4;
	if (l->len + need + 1 > l->cap) {
		size_t cap = (l->cap + need) * 2;
		char *nb = realloc(l->buf, cap);
		if (!nb)
			return;
		l->buf = nb;
		l->cap = cap;
	}
	l->len += (size_t)sprintf(l->buf + l->len, "%s: %s\n", path, why);
}

/* The failed files' names are for root, the user who mounted and the
 * archive's owner: other users (allow_other), who may not be allowed to
 * list the directories those files are in, get the barrier and a count. */
static int sync_names_allowed(void)
{
	struct fuse_context *cx = fuse_get_context();
	struct stat st;
	return !cx || cx->uid == 0 || cx->uid == getuid() || (stat(fs.home, &st) == 0 && st.st_uid == cx->uid);
}

/* the barrier of `ulpack sync` (invariant 4): each call waits (a second one,
 * after a size query, finds nothing new to wait for) */
static int root_sync(char *value, size_t size)
{
	failed_list l = {0};
	int bad = fs.s ? ulp_session_sync(fs.s, sync_failed, &l) : 0;
	if (bad && !sync_names_allowed()) {
		char v[128];
		snprintf(v, sizeof(v), "%d files could not be archived (names: for root and the mount's owner)\n", bad);
		free(l.buf);
		l.buf = strdup(v);
	} else if (!bad || !l.buf) {
		free(l.buf);
		l.buf = strdup(bad ? "failed (out of memory listing them)\n" : "ok\n");
	}
	if (!l.buf)
		return -ENOMEM;
	int r = xattr_reply(value, size, l.buf);
	free(l.buf);
	return r;
}

/* A directory's user.ulpack.dynamics (invariant 4). */
static int dynamics_xattr(const char *p, char *value, size_t size)
{
	ulp_stat s;
	int rc = ulp_archive_stat(fs.a, p, &s);
	if (rc < 0)
		return rc == -ULP_E_NOENT ? -ENODATA : err_of(rc);
	if (!s.is_dir)
		return -ENODATA;
	ulp_dynamics *d = NULL;
	rc = ulp_archive_dynamics(fs.a, p, NULL, &d);
	if (rc < 0)
		return rc == -ULP_E_NOENT ? -ENODATA : err_of(rc);
	char *js = NULL;
	size_t n = 0;
	rc = ulp_dynamics_json(d, 1, &js, &n);
	ulp_dynamics_free(d);
	if (rc < 0)
		return -ENOMEM;
	int r = n > 65536 ? -E2BIG : xattr_reply(value, size, js);
	free(js);
	return r;
}

static int ulpfs_getxattr(const char *path, const char *name, char *value, size_t size)
{
	intr_on();
	ulp_stat s;
	char v[4400];
	const char *p = rel(path);
	/* only user.ulpack.* exist: the kernel asks for security.capability
	 * before every write(2) to a file, and must not wait for anything */
	if (strncmp(name, "user.ulpack.", 12) != 0)
		return -ENODATA;
	if (!p[0] && !strcmp(name, "user.ulpack.counters")) { /* decode and archiving counters */
		ulp_counters c;
		ulp_session_stats sc = {0};
		ulp_archive_counters(fs.a, &c);
		if (fs.s)
			ulp_session_counters(fs.s, &sc);
		snprintf(v, sizeof(v), "chunks_decoded %llu deltas_decoded %llu cache_hits %llu cache_misses %llu"
		         " cache_bytes %llu max_walk %llu cache_recycled %llu queued %llu queued_bytes %llu"
		         " staged %llu staged_bytes %llu archived %llu archived_bytes %llu failed %llu"
		         " archive_bytes_per_s %llu staging_max %llu", (unsigned long long)c.chunks_decoded,
		         (unsigned long long)c.deltas_decoded, (unsigned long long)c.cache_hits,
		         (unsigned long long)c.cache_misses, (unsigned long long)c.cache_bytes,
		         (unsigned long long)c.max_walk, (unsigned long long)c.cache_recycled,
		         (unsigned long long)sc.queued, (unsigned long long)sc.queued_bytes,
		         (unsigned long long)sc.staged, (unsigned long long)sc.staged_bytes,
		         (unsigned long long)sc.archived, (unsigned long long)sc.archived_bytes,
		         (unsigned long long)sc.failed, (unsigned long long)sc.bytes_per_s,
		         (unsigned long long)sc.staging_max);
		return xattr_reply(value, size, v);
	}
	if (!p[0] && !strcmp(name, "user.ulpack.sync"))
		return root_sync(value, size);
	if (!p[0] && !strcmp(name, "user.ulpack.status")) { /* `ulpack status`: status.c's JSON */
		ulp_status st;
		int rc = ulp_status_get(fs.a, fs.s, fs.log, &st);
		if (rc < 0)
			return err_of(rc);
		ulp_status_json(&st, v, sizeof(v));
		return xattr_reply(value, size, v);
	}
	if (!p[0] && !strcmp(name, "user.ulpack.generation")) { /* a shared archive: "GEN EPOCH" */
		ulp_generation g;
		ulp_archive_generation(fs.a, &g);
		if (!g.shared)
			return -ENODATA;
		snprintf(v, sizeof(v), "%llu %llu%s", (unsigned long long)g.gen, (unsigned long long)g.epoch,
		         g.fenced ? " fenced" : "");
		return xattr_reply(value, size, v);
	}
	if (!p[0] && !strcmp(name, "user.ulpack.space")) { /* disk, live, reclaimable bytes */
		ulp_space sp;
		int rc = ulp_archive_space(fs.a, &sp);
		if (rc < 0)
			return err_of(rc);
		ulp_space_json(&sp, v, sizeof(v));
		return xattr_reply(value, size, v);
	}
	if (!strcmp(name, "user.ulpack.dynamics")) /* invariant 4 */
		return dynamics_xattr(p, value, size);
	if (!strcmp(name, "user.ulpack.state")) {
		int rc = fs.s ? ulp_session_state(fs.s, p, v, sizeof(v)) : ulp_archive_stat(fs.a, p, &s);
		char target[ULP_NAME_MAX + 1];
		if (rc == -ULP_E_NOENT && virtual_latest(p, target, sizeof(target)))
			return -ENODATA; /* `latest`: no attributes */
		if (rc < 0)
			return err_of(rc);
		if (!fs.s)
			snprintf(v, sizeof(v), "%s", s.is_dir || s.is_symlink ? "" : "archived");
		return v[0] ? xattr_reply(value, size, v) : -ENODATA;
	}
	/* the archive's facts of a file being archived: once it is */
	int rc = fs.s ? ulp_session_stat_archived(fs.s, p, &s) : ulp_archive_stat(fs.a, p, &s);
	char target[ULP_NAME_MAX + 1];
	if (rc == 1 || (rc == -ULP_E_NOENT && virtual_latest(p, target, sizeof(target))))
		return -ENODATA; /* staged only (open, or its archiving failed), or `latest` */
	if (rc < 0)
		return err_of(rc);
	if (s.is_dir || s.is_symlink)
		return -ENODATA;
	if (!strcmp(name, xattrs[0]))
		snprintf(v, sizeof(v), "%lld", (long long)s.step);
	else if (!strcmp(name, xattrs[1]))
		ulp_sha256_hex(s.sha256, v);
	else if (!strcmp(name, xattrs[2]))
		snprintf(v, sizeof(v), "%llu", (unsigned long long)s.stored_bytes);
	else if (!strcmp(name, xattrs[3]))
		snprintf(v, sizeof(v), "%.6f", s.size ? (double)s.stored_bytes / (double)s.size : 0.0);
	else if (!strcmp(name, xattrs[4]))
		snprintf(v, sizeof(v), "%u", s.chain_depth);
	else if (!strcmp(name, xattrs[5]))
		snprintf(v, sizeof(v), "%d", s.anchor);
	else
		return -ENODATA;
	return xattr_reply(value, size, v);
}

static int ulpfs_listxattr(const char *path, char *list, size_t size)
{
	intr_on();
	ulp_stat s;
	if (!rel(path)[0]) { /* the root: the counters (getxattr; user.ulpack.sync is an
	                      * action, not listed: getfattr -d must not wait) */
		static const char root_attr[] = "user.ulpack.counters\0user.ulpack.space\0user.ulpack.status";
		if (size == 0)
			return (int)sizeof(root_attr);
		if (size < sizeof(root_attr))
			return -ERANGE;
		memcpy(list, root_attr, sizeof(root_attr));
		return (int)sizeof(root_attr);
	}
	int rc = fs.s ? ulp_session_stat_archived(fs.s, rel(path), &s) : ulp_archive_stat(fs.a, rel(path), &s);
	size_t n = sizeof(xattrs) / sizeof(xattrs[0]), first = n - 1; /* staged only: the state */
	char target[ULP_NAME_MAX + 1];
	if (rc == -ULP_E_NOENT && virtual_latest(rel(path), target, sizeof(target)))
		return 0; /* `latest`: no attributes */
	if (rc < 0)
		return err_of(rc);
	if (rc == 0 && (s.is_dir || s.is_symlink))
		return 0;
	if (rc == 0)
		first = 0;
	size_t need = 0;
	for (size_t i = first; i < n; i++)
		need += strlen(xattrs[i]) + 1;
	if (size == 0)
		return (int)need;
	if (size < need)
		return -ERANGE;
	for (size_t i = first, o = 0; i < n; i++) {
		memcpy(list + o, xattrs[i], strlen(xattrs[i]) + 1);
		o += strlen(xattrs[i]) + 1;
	}
	return (int)need;
}

static int ulpfs_setxattr(const char *path, const char *name, const char *value, size_t size, int flags)
{
	(void)path, (void)name, (void)value, (void)size, (void)flags;
	return -ENOTSUP;
}

static const struct fuse_operations ulpfs_ops = {
	.init = ulpfs_init,
	.destroy = ulpfs_destroy,
	.getattr = ulpfs_getattr,
	.readdir = ulpfs_readdir,
	.open = ulpfs_open,
	.create = ulpfs_create,
	.read = ulpfs_read,
	.write = ulpfs_write,
	.flush = ulpfs_flush,
	.release = ulpfs_release,
	.fsync = ulpfs_fsync,
	.truncate = ulpfs_truncate,
	.rename = ulpfs_rename,
	.unlink = ulpfs_unlink,
	.mkdir = ulpfs_mkdir,
	.rmdir = ulpfs_rmdir,
	.symlink = ulpfs_symlink,
	.readlink = ulpfs_readlink,
	.link = ulpfs_link,
	.chmod = ulpfs_chmod,
	.chown = ulpfs_chown,
	.utimens = ulpfs_utimens,
	.statfs = ulpfs_statfs,
	.getxattr = ulpfs_getxattr,
	.listxattr = ulpfs_listxattr,
	.setxattr = ulpfs_setxattr,
};

/* ---- options and main -------------------------------------------------------- */

enum { KEY_HELP, KEY_VERSION, KEY_RO, KEY_ALLOW_OTHER, KEY_DEFAULT_PERMISSIONS, KEY_FSNAME };

static struct opts {
	char *cache_size, *max_chain, *threads, *readahead, *staging_max, *poll, *lease, *grace;
	char *cache_dir, *pack_cache; /* an archive in a bucket */
	char *metrics, *metrics_interval; /* Prometheus's textfile */
	int allow_other, default_permissions, no_permission_checks, nolatest, contribute;
	int fsname;            /* the user gave -o fsname= */
} o;

static const struct fuse_opt ulpfs_opts[] = {
	{"cache_size=%s", offsetof(struct opts, cache_size), 0},
	{"max_chain=%s", offsetof(struct opts, max_chain), 0},
	{"threads=%s", offsetof(struct opts, threads), 0},
	{"readahead=%s", offsetof(struct opts, readahead), 0},
	{"staging_max=%s", offsetof(struct opts, staging_max), 0},
	{"poll=%s", offsetof(struct opts, poll), 0},
	{"lease=%s", offsetof(struct opts, lease), 0},
	{"grace=%s", offsetof(struct opts, grace), 0},
	{"cache_dir=%s", offsetof(struct opts, cache_dir), 0},
	{"pack_cache=%s", offsetof(struct opts, pack_cache), 0},
	{"metrics=%s", offsetof(struct opts, metrics), 0},
	{"metrics_interval=%s", offsetof(struct opts, metrics_interval), 0},
	FUSE_OPT_KEY("ro", KEY_RO),
	FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
	FUSE_OPT_KEY("default_permissions", KEY_DEFAULT_PERMISSIONS),
	{"no_permission_checks", offsetof(struct opts, no_permission_checks), 1},
	{"nolatest", offsetof(struct opts, nolatest), 1},
	{"contribute", offsetof(struct opts, contribute), 1},
	FUSE_OPT_KEY("fsname=", KEY_FSNAME),
	FUSE_OPT_KEY("-h", KEY_HELP),
	FUSE_OPT_KEY("--help", KEY_HELP),
	FUSE_OPT_KEY("-V", KEY_VERSION),
	FUSE_OPT_KEY("--version", KEY_VERSION),
	FUSE_OPT_END,
};

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: ulpackfs ARCHIVE MOUNTPOINT [-o options] [-f]\n"
	        "Mounts a ulpack archive: every archived checkpoint reads as a plain file; files written\n"
	        "into the mount (rsync -a, cp, dd, tar) are archived when closed.\n\n"
	        "options:\n"
	        "  -o cache_size=SIZE   decode cache (default: 1/8 of memory, 1G to 64G; K, M, G)\n"
	        "  -o max_chain=N       deltas a chain may hold before an anchor (default: the archive's, 16)\n"
	        "  -o threads=N         decode threads and FUSE worker threads (default: one per CPU)\n"
	        "  -o readahead=SIZE    kernel read-ahead of this mount (default 4M; 0: the kernel's)\n"
	        "  -o staging_max=SIZE  closed files waiting to be archived before writes wait\n"
	        "                       (default: half the archive disk's free space, at least 64M)\n"
	        "  -o ro                read-only; of a shared archive: follows what its writer publishes\n"
	        "  -o poll=SECONDS      shared, read-only: look for a new generation this often (default 2)\n"
	        "  -o lease=SECONDS     shared, writer: its lease, renewed while it runs (default 15)\n"
	        "  -o grace=SECONDS     shared, writer: superseded generations and dropped packs stay this\n"
	        "                       long for other hosts' readers (default 600)\n"
	        "  -o contribute        shared: where another host holds the lease, write files for it to\n"
	        "                       archive (staged in ARCHIVE/staging/h-HOST) instead of refusing\n"
	        "  -o cache_dir=DIR     s3://BUCKET/PREFIX archives: the local home (the writer's live index\n"
	        "                       and staging, the pack cache), DIR/s3/BUCKET/PREFIX/{writer,reader}\n"
	        "                       (default: $ULPACK_CACHE_DIR, $XDG_CACHE_HOME/ulpack, ~/.cache/ulpack)\n"
	        "  -o pack_cache=SIZE   s3:// archives: packs kept in the local home, LRU (default 8G)\n"
	        "  -o nolatest          no `latest` symlink in run directories (see ulpackfs(1))\n"
	        "  -o metrics=PATH      write Prometheus metrics (text format) to PATH every few seconds,\n"
	        "                       atomically (node_exporter's textfile collector)\n"
	        "  -o metrics_interval=SECONDS  how often (default 5)\n"
	        "  -o fsname=NAME       source shown by findmnt and df (default: the archive's path)\n"
	        "  -o allow_other       let other users in; implies default_permissions (the kernel\n"
	        "                       checks modes and owners) unless -o no_permission_checks\n"
	        "  -f                   stay in the foreground; -d for debug output\n"
	        "  and the usual FUSE options (allow_other, default_permissions, ...)\n\n"
	        "fstab: /data/ckpt-archive /mnt/ckpt fuse.ulpackfs defaults,cache_size=4G 0 0\n"
	        "       s3://ckpt/run1 /mnt/run1 fuse.ulpackfs ro,cache_dir=/var/cache/ulpack,_netdev 0 0\n"
	        "See ulpackfs(1).\n");
}

static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	(void)data, (void)outargs;
	switch (key) {
	case KEY_HELP:
		usage(stdout);
		exit(0);
	case KEY_VERSION:
		printf("ulpackfs %s (libfuse %d)\n", ULP_VERSION_STRING, fuse_version());
		exit(0);
	case KEY_RO:
		fs.read_only = 1;
		return 1; /* also for the kernel */
	case KEY_ALLOW_OTHER:
		o.allow_other = 1;
		return 1;
	case KEY_DEFAULT_PERMISSIONS:
		o.default_permissions = 1;
		return 1;
	case KEY_FSNAME:
		o.fsname = 1;
		return 1; /* for the kernel: findmnt and df show it */
	case FUSE_OPT_KEY_NONOPT:
		if (!fs.archive) {
			fs.archive = ulp_archive_is_url(arg) ? strdup(arg) : realpath(arg, NULL);
			if (!fs.archive) {
				fprintf(stderr, "ulpackfs: %s: %s\n", arg, strerror(errno));
				exit(1);
			}
			return 0;
		}
		return 1; /* the mount point */
	default:
		if (!strcmp(arg, "-f"))
			fs.foreground = 1;
		return 1;
	}
}

/*
 * The kernel reads ahead of a FUSE file in requests no larger than its
 * read-ahead window, 128 KiB by default: a sequential read of a checkpoint
 * then costs a round trip per 128 KiB and leaves the decode threads idle.
 * Each FUSE mount has its own backing device (0:N in /proc/self/mountinfo);
 * root may widen its window in sysfs, so that the kernel asks for 1 MiB
 * requests (max_pages) several at a time. Without the right, the kernel's
 * default stays. Returns 0 or -errno.
 */
static int set_readahead(const char *mountpoint, uint64_t bytes)
{
	FILE *f = mountpoint ? fopen("/proc/self/mountinfo", "r") : NULL;
	if (!f)
		return mountpoint ? -errno : -ENOENT;
	char line[8192], dev[64] = "";
	while (fgets(line, sizeof(line), f)) {
		/* id parent major:minor root mountpoint options ... - fstype source ... */
		char d[64], at[4096], type[256], *sep = strstr(line, " - ");
		if (!sep || sscanf(line, "%*s %*s %63s %*s %4095s", d, at) != 2 ||
		    sscanf(sep + 3, "%255s", type) != 1)
			continue;
		/* mountinfo writes a space, tab, newline or backslash as \ooo */
		char *w = at;
		for (const char *r = at; *r; w++) {
			if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] && r[3]) {
				*w = (char)((r[1] - '0') << 6 | (r[2] - '0') << 3 | (r[3] - '0'));
				r += 4;
			} else {
				*w = *r++;
			}
		}
		*w = 0;
		if (!strcmp(at, mountpoint) && !strcmp(type, "fuse.ulpackfs"))
			snprintf(dev, sizeof(dev), "%s", d); /* the last one: the newest */
	}
	fclose(f);
	if (!dev[0])
		return -ENOENT;
	char p[128];
	snprintf(p, sizeof(p), "/sys/class/bdi/%s/read_ahead_kb", dev);
	f = fopen(p, "w");
	if (!f)
		return -errno;
	int bad = fprintf(f, "%llu\n", (unsigned long long)(bytes >> 10)) < 0;
	bad |= fclose(f) != 0;
	return bad ? -EIO : 0;
}

/* The window must be set after the kernel has taken the reply to INIT (it
 * clamps the window to the max_readahead negotiated there): the first
 * request other than INIT comes after that. */
static pthread_once_t readahead_done = PTHREAD_ONCE_INIT;

static void set_readahead_now(void)
{
	int r = fs.readahead ? set_readahead(fs.mountpoint, fs.readahead) : 0;
	if (r < 0)
		syslog(LOG_INFO, "ulpackfs: read-ahead of %s kept: %s", fs.mountpoint, strerror(-r));
}

static void readahead_once(void)
{
	pthread_once(&readahead_done, set_readahead_now);
}

/*
 * A whole number in [min, max] for option name, else a usage error (a
 * negative, garbage or overflowing value must not mount with a meaning
 * nobody asked for, such as max_chain=-5 lifting the limit).
 */
static int parse_count(const char *name, const char *v, long min, long max, long *out)
{
	int64_t n;
	if (ulp_parse_int(v, min, max, &n) < 0) { /* the CLI's strict parser */
		fprintf(stderr, "ulpackfs: bad %s '%s': a whole number from %ld to %ld\n", name, v, min, max);
		return -1;
	}
	*out = (long)n;
	return 0;
}

/*
 * One read-write mount of an archive at a time (ulp_mount_lock). A second
 * mount while the first is mounted fails at once, naming its mount point and
 * pid. After `fusermount3 -u` the old daemon still archives what is queued
 * and holds the lock until it exits: a new mount then waits (up to a
 * minute), saying so, rather than recovering its staged files under it.
 * Returns the lock's descriptor, or -1 (printed); -2 where another host holds it
 * and this mount took a shared archive's lease (its holder is fenced).
 */
static int lock_archive(const char *dir, const ulp_generation *g)
{
	char err[1024];
	ulp_mount_owner h;
	int fd, said = 0;
	for (int i = 0;; i++) {
		int rc = ulp_mount_lock(dir, &fd, &h, err, sizeof(err));
		if (rc == 0)
			return fd;
		if (rc != -ULP_E_BUSY) {
			fprintf(stderr, "ulpackfs: %s\n", err);
			return -1;
		}
		if (g->writer) { /* a shared archive whose lease this mount took: the lease fences (ulpackfs(1)) */
			fprintf(stderr, "ulpackfs: %s: mount.lock is still held (pid %ld, %s), by a writer whose lease"
			        " expired (a partitioned or dead host): this mount holds the lease now (epoch %llu),"
			        " which fences it\n", dir, h.pid, h.mountpoint[0] ? h.mountpoint : "?",
			        (unsigned long long)g->epoch);
			return -2;
		}
		if (h.mounted) {
			fprintf(stderr, "ulpackfs: %s: already mounted read-write on %s by ulpackfs pid %ld"
			        " (unmount it first: fusermount3 -u %s; or mount with -o ro)\n", dir, h.mountpoint, h.pid,
			        h.mountpoint);
			return -1;
		}
		if (i >= 600) {
			fprintf(stderr, "ulpackfs: %s: the ulpackfs that had it mounted (pid %ld) is still archiving its"
			        " queue after a minute; mount again once it has exited\n", dir, h.pid);
			return -1;
		}
		if (!said && i == 5) {
			if (h.pid)
				fprintf(stderr, "ulpackfs: %s: waiting for ulpackfs pid %ld, unmounted from %s, to finish"
				        " archiving its queue\n", dir, h.pid, h.mountpoint);
			else
				fprintf(stderr, "ulpackfs: %s: waiting for the ulpackfs that holds it to start or finish\n", dir);
			said = 1;
		}
		usleep(100000);
	}
}

static int is_mount_point(const char *mnt)
{
	struct stat a, b;
	char parent[4200];
	snprintf(parent, sizeof(parent), "%s/..", mnt);
	return stat(mnt, &a) == 0 && stat(parent, &b) == 0 && (a.st_dev != b.st_dev || a.st_ino == b.st_ino);
}

/* A fatal signal says so in the log before the daemon dies (a mapped pack
 * that became unreadable, on a network file system cut off, is SIGBUS: the
 * mount then answers ENOTCONN and its log must say why). Async-signal-safe:
 * write(2) of fixed text, then the default action. */
static void fatal_signal(int sig)
{
	static const char bus[] = "ulpackfs: fatal SIGBUS (a mapped file of the archive became unreadable: "
	                          "its file system was cut off or the file shrank); the mount ends\n";
	static const char other[] = "ulpackfs: fatal signal; the mount ends\n";
	if (sig == SIGBUS)
		(void)!write(2, bus, sizeof(bus) - 1);
	else
		(void)!write(2, other, sizeof(other) - 1);
	signal(sig, SIG_DFL);
	raise(sig);
}

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	signal(SIGBUS, fatal_signal);
	signal(SIGSEGV, fatal_signal);
	/* a long-lived process that allocates and frees tables and buffers of a
	 * few hundred KiB per tensor: keep them in the heap rather than mapping
	 * fresh pages (about 2.5 us each to touch) every time */
	mallopt(M_MMAP_THRESHOLD, 4 << 20);
	mallopt(M_TRIM_THRESHOLD, 128 << 20);
	if (fuse_opt_parse(&args, &o, ulpfs_opts, opt_proc) < 0)
		return 1;
	if (!fs.archive) {
		usage(stderr);
		return 2;
	}
	struct fuse_cmdline_opts co;
	if (fuse_parse_cmdline(&args, &co) < 0)
		return 1;
	if (!co.mountpoint) {
		usage(stderr);
		return 2;
	}
	fs.foreground = fs.foreground || co.foreground;
	fs.no_latest = o.nolatest;
	fs.readahead = (uint64_t)4 << 20;
	fs.mountpoint = realpath(co.mountpoint, NULL); /* the daemon leaves the cwd */
	/* option values: a usage error (exit 2) before anything is mounted */
	if (o.readahead && !strcmp(o.readahead, "0"))
		fs.readahead = 0;
	else if (o.readahead && (ulp_parse_size(o.readahead, &fs.readahead) < 0 || fs.readahead > ((uint64_t)1 << 30))) {
		fprintf(stderr, "ulpackfs: bad readahead '%s' (examples: 1M, 4M, at most 1G; 0: the kernel's)\n",
		        o.readahead);
		return 2;
	}
	if (o.staging_max && (ulp_parse_size(o.staging_max, &fs.staging_max) < 0 || fs.staging_max == 0)) {
		fprintf(stderr, "ulpackfs: bad staging_max '%s' (examples: 512M, 8G)\n", o.staging_max);
		return 2;
	}
	if (o.cache_size && ulp_parse_size(o.cache_size, &fs.cache_size) < 0) {
		fprintf(stderr, "ulpackfs: bad cache_size '%s' (examples: 512M, 4G)\n", o.cache_size);
		return 2;
	}
	long v;
	if (o.max_chain) {
		if (parse_count("max_chain", o.max_chain, 1, ULP_MAX_CHAIN, &v) < 0)
			return 2;
		fs.max_chain = (unsigned)v;
	}
	if (o.threads) {
		if (parse_count("threads", o.threads, 0, ULP_MAX_THREADS, &v) < 0) /* 0: one per CPU */
			return 2;
		fs.threads = (int)v;
	}
	/* other users on the mount: the kernel checks modes and owners, as on
	 * any file system (without default_permissions FUSE checks nothing) */
	if (o.allow_other && !o.default_permissions && !o.no_permission_checks)
		fuse_opt_add_arg(&args, "-odefault_permissions");
	if (is_mount_point(co.mountpoint)) {
		fprintf(stderr, "ulpackfs: %s: already a mount point (busy)\n", co.mountpoint);
		return 1;
	}
	/* no FUSE here (a container without /dev/fuse, a kernel without the
	 * module): say so before touching the archive, and name what works
	 * without it (EACCES is left to fusermount3, which mounts for users) */
	int dfd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (dfd >= 0)
		close(dfd);
	else if (errno == ENOENT || errno == ENODEV || errno == ENXIO) {
		fprintf(stderr,
		        "ulpackfs: /dev/fuse: %s: FUSE is not available here (in a container: --device /dev/fuse;\n"
		        "  or modprobe fuse). Without FUSE: `ulpack export %s PATH DEST` writes files, steps or trees\n"
		        "  out, `ulpack import` archives a directory, `ulpack cat` reads one file, and the Python\n"
		        "  package reads and writes (ulpack.open_archive(\"%s\")); see ulpack(1)\n",
		        strerror(errno), fs.archive, fs.archive);
		return 1;
	}
	char err[1024];
	ulp_archive_opts ao = {.cache_size = fs.cache_size, .max_chain = fs.max_chain, .threads = fs.threads,
	                       .read_only = fs.read_only, .cache_dir = o.cache_dir,
	                       .contribute = o.contribute && !fs.read_only}; /* ulpackfs(1) MANY HOSTS */
	if (o.pack_cache && (ulp_parse_size(o.pack_cache, &ao.pack_cache) < 0 || ao.pack_cache == 0)) {
		fprintf(stderr, "ulpackfs: bad pack_cache '%s' (examples: 2G, 500M)\n", o.pack_cache);
		return 2;
	}
	if (o.metrics_interval) {
		int64_t iv;
		if (ulp_parse_int(o.metrics_interval, 1, 86400, &iv) < 0) {
			fprintf(stderr, "ulpackfs: bad metrics_interval '%s' (whole seconds, 1 to 86400)\n",
			        o.metrics_interval);
			return 2;
		}
		fs.metrics_s = (unsigned)iv;
	}
	if (o.metrics) { /* absolute: the daemon leaves the working directory */
		const char *slash = strrchr(o.metrics, '/'), *base = slash ? slash + 1 : o.metrics;
		char *dir = slash ? strndup(o.metrics, (size_t)(slash - o.metrics)) : strdup(".");
		char *real = dir ? realpath(dir[0] ? dir : "/", NULL) : NULL;
		if (!real || !base[0]) {
			fprintf(stderr, "ulpackfs: metrics=%s: %s\n", o.metrics, real ? "names a directory" : strerror(errno));
			free(dir);
			free(real);
			return 2;
		}
		size_t l = strlen(real) + strlen(base) + 2;
		fs.metrics = malloc(l);
		if (fs.metrics)
			snprintf(fs.metrics, l, "%s/%s", real, base);
		free(dir);
		free(real);
	}
	if (gethostname(fs.host, sizeof(fs.host) - 1) < 0)
		snprintf(fs.host, sizeof(fs.host), "localhost");
	const struct { const char *s, *name; unsigned *to, scale; } secs[] = {
		{o.poll, "poll", &ao.poll_ms, 1000}, {o.lease, "lease", &ao.lease_ms, 1000}, {o.grace, "grace", &ao.grace_s, 1}};
	for (size_t i = 0; i < sizeof(secs) / sizeof(secs[0]); i++) {
		char *end;
		double x = secs[i].s ? strtod(secs[i].s, &end) : 0;
		if (secs[i].s && (end == secs[i].s || *end || !(x > 0) || x * secs[i].scale > 4e9)) {
			fprintf(stderr, "ulpackfs: bad %s '%s' (seconds, more than 0)\n", secs[i].name, secs[i].s);
			return 1;
		}
		if (secs[i].s)
			*secs[i].to = (unsigned)(x * secs[i].scale + 0.5) ? (unsigned)(x * secs[i].scale + 0.5) : 1;
	}
	if (ulp_archive_open(fs.archive, &ao, &fs.a, err, sizeof(err)) < 0) {
		fprintf(stderr, "ulpackfs: %s\n", err);
		return 1;
	}
	fs.home = strdup(ulp_archive_dir(fs.a));
	fs.lock_fd = -1;
	if (!fs.read_only) { /* an archive, now: take its lock, then recover */
		ulp_generation g;
		ulp_archive_generation(fs.a, &g);
		/* a contributor host locks its own staging (ulpackfs(1) MANY HOSTS) */
		fs.lock_fd = lock_archive(ulp_archive_lock_dir(fs.a), &g);
		if (g.contributor)
			fprintf(stderr, "ulpackfs: %s: another host holds the lease and archives: this mount contributes"
			        " (its files staged in %s until that host archives them)\n", fs.home,
			        ulp_archive_lock_dir(fs.a));
		if (fs.lock_fd == -1) {
			ulp_archive_close(fs.a);
			return 1;
		}
	}
	ulp_generation gr;
	ulp_archive_generation(fs.a, &gr);
	if (!fs.read_only && !gr.contributor) {
		unsigned rec, rem;
		if (ulp_stage_recover(fs.a, &rec, &rem) < 0)
			fprintf(stderr, "ulpackfs: recovering staged files: %s\n", ulp_archive_errmsg(fs.a));
		else if (rec || rem)
			fprintf(stderr, "ulpackfs: staging: %u files recovered, %u incomplete removed\n", rec, rem);
	}
	/* threads do not survive fuse_daemonize's fork: reopen after it */
	ulp_archive_close(fs.a);
	fs.a = NULL;
	/* large reads: let the kernel ask for big ranges */
	char mr[64];
	snprintf(mr, sizeof(mr), "-omax_read=%d", ULPFS_MAX_READ);
	fuse_opt_add_arg(&args, mr);
	if (!o.fsname) { /* findmnt and df show the archive as the source */
		size_t l = strlen(fs.archive);
		char *fo = malloc(2 * l + 16), *w = fo;
		if (fo) {
			w += sprintf(w, "-ofsname=");
			for (const char *c = fs.archive; *c; c++) { /* fuse_opt's escapes */
				if (*c == ',' || *c == '\\')
					*w++ = '\\';
				*w++ = *c;
			}
			*w = 0;
			fuse_opt_add_arg(&args, fo);
			free(fo);
		}
	}
	fuse_opt_add_arg(&args, "-osubtype=ulpackfs");
	struct fuse *f = fuse_new(&args, &ulpfs_ops, sizeof(ulpfs_ops), NULL);
	int rc = 1;
	if (!f)
		goto out;
	if (fuse_mount(f, co.mountpoint) != 0) {
		fprintf(stderr, "ulpackfs: cannot mount on %s\n", co.mountpoint);
		goto out_destroy;
	}
	/* no syslog: errors go to ARCHIVE/ulpackfs.log, a read-only mount's too
	 * (the log is no part of the archive); where it cannot be written
	 * (read-only media, another user's archive), to the stderr ulpackfs was
	 * started with, which daemonizing would otherwise close */
	if (access("/dev/log", F_OK) != 0) {
		char lp[4200];
		snprintf(lp, sizeof(lp), "%s/ulpackfs.log", fs.home);
		int lfd = open(lp, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600); /* private, as the archive */
		if (lfd < 0) {
			fprintf(stderr, "ulpackfs: no syslog, and %s cannot be written (%s): errors go to this stderr\n", lp,
			        strerror(errno));
			if (!fs.foreground) /* -f writes them there anyway */
				lfd = fcntl(2, F_DUPFD_CLOEXEC, 3);
		}
		fs.logf = lfd >= 0 ? fdopen(lfd, "a") : NULL;
		if (lfd >= 0 && !fs.logf)
			close(lfd);
	}
	if (fuse_daemonize(fs.foreground) != 0)
		goto out_unmount;
	ao.file_table = 1; /* the daemon's lookups and opens run no SQL (not the check above) */
	if (ulp_archive_open(fs.archive, &ao, &fs.a, err, sizeof(err)) < 0) {
		log_msg(NULL, err);
		goto out_unmount;
	}
	{ /* the log: each error once; a shared archive's lines name this host */
		ulp_generation g;
		ulp_archive_generation(fs.a, &g);
		if (ulp_log_new(log_sink, NULL, g.shared ? fs.host : NULL, &fs.log) < 0)
			goto out_unmount;
	}
	if (fs.lock_fd >= 0 && ulp_mount_lock_note(fs.lock_fd, (long)getpid(), fs.mountpoint) < 0)
		syslog(LOG_WARNING, "ulpackfs: %s/mount.lock: cannot record pid and mount point", fs.home);
	if (fuse_set_signal_handlers(fuse_get_session(f)) != 0)
		goto out_unmount;
	if (co.singlethread) {
		rc = fuse_loop(f);
	} else {
		struct fuse_loop_config *lc = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(lc, co.clone_fd);
		fuse_loop_cfg_set_max_threads(lc, fs.threads > 0 ? (unsigned)fs.threads * 2 + 2 : 16);
		/* idle workers stay: each keeps its index connection and buffers */
		fuse_loop_cfg_set_idle_threads(lc, fs.threads > 0 ? (unsigned)fs.threads * 2 + 2 : 16);
		rc = fuse_loop_mt(f, lc);
		fuse_loop_cfg_destroy(lc);
	}
	fuse_remove_signal_handlers(fuse_get_session(f));
	/* SIGTERM, SIGINT and SIGHUP end the loop with the signal's number: a
	 * clean stop (systemd's), and what is queued is archived below */
	if (rc == SIGTERM || rc == SIGINT || rc == SIGHUP)
		rc = 0;
out_unmount:
	fuse_unmount(f);
out_destroy:
	fuse_destroy(f);
out:
	ulp_archive_close(fs.a);
	ulp_log_free(fs.log);
	fs.log = NULL;
	free(fs.metrics);
	if (fs.logf)
		fclose(fs.logf);
	free(co.mountpoint);
	free(fs.mountpoint);
	fuse_opt_free_args(&args);
	free(fs.archive);
	free(fs.home);
	return rc || fs.kept ? 1 : 0; /* kept: files left staged for the next mount (logged) */
}
