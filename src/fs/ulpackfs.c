/* SPDX-License-Identifier: MIT */
/*
 * ulpackfs.c - the FUSE3 front end: mounts an archive so that every archived
 * file reads as a plain file, and files written into the mount (rsync, cp,
 * dd, tar, shell redirection) are staged and archived when closed under
 * their final name. Thin: each operation maps to libulpack calls; errors are
 * mapped to errno, never invented.
 *
 * It uses libfuse's path-based API: the archive's index is keyed by path,
 * so renames of whole directories need no inode bookkeeping here.
 *
 * Open-file invariants:
 *  1. A path has at most one staged node; while it exists, the node (not
 *     the archive) answers getattr/read/write for that path.
 *  2. A node is archived when its last handle is closed (flush of the last
 *     handle, so close(2) reports errors such as ENOSPC), unless its name is
 *     an rsync temporary (".name.XXXXXX"): those wait for the rename that
 *     gives them their final name, and are archived under it (or under the
 *     name they have when the file system is unmounted first). The close of
 *     such a file records its name in staging (ulp_stage_record), so that a
 *     crash (kill -9) before that rename recovers it under that name.
 *  5. What staging records for a node (ulp_stage_sync, _record) always names
 *     its current path: a rename relabels it (also of the files below a
 *     renamed directory), and an unlink or a rename over it forgets it
 *     before returning, so that no recovery brings back a superseded file.
 *  3. Archived files are immutable: opened read-only they keep the kernel
 *     page cache (keep_cache) and no direct_io, so mmap works.
 *  4. A closed file renamed to its final name (rsync's way) is archived in
 *     the background by one committer thread, in rename order, so that the
 *     writer goes on with the next file meanwhile; until then the staged node
 *     answers for it. Before rename returns, the staged file is made durable
 *     (ulp_stage_sync): a crash before the commit is recovered at the next
 *     mount. The queue holds at most QUEUE_MAX files (rename waits for
 *     room). A background commit that fails leaves the file staged, is logged, and
 *     makes the next create or open for writing fail with its errno; the
 *     file is tried again at unmount.
 *  5. A file unlinked (or replaced by a rename) while open lives on under a
 *     hidden name that libfuse gives it (".fuse_hiddenXXXXXXXXXXXXXXXX",
 *     hard_remove off) until its last close, then libfuse unlinks that name.
 *     Hidden files are never archived and never listed: a staged one stays a
 *     node, an archived one leaves the archive at once and lives on as a
 *     ghost (its stat, in memory; open handles read its blobs). So every
 *     operation on an open fd has a path, and nothing of an unlinked file is
 *     in the archive after its last close, nor after a crash.
 *  6. Paths may be NULL in operations that take a file handle (libfuse gives
 *     NULL when a node has no name); those use the handle.
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
#define QUEUE_MAX 2              /* files being or waiting to be archived (invariant 4) */

typedef struct node {
	char *path;            /* NULL once unlinked while open */
	ulp_stage *stage;
	int handles;           /* open handles */
	int dirty;             /* written since staged */
	ulp_meta meta;
	int mtime_set;         /* utimens set meta.mtime explicitly */
	uint64_t writes;       /* bumped by every write: a commit knows if it missed one */
	uint64_t attrs;        /* bumped by every chmod/chown/utimens, likewise */
	int synced;            /* durable in staging under path (ulp_stage_sync) */
	struct node *qnext;
	struct node *next;
} node;

typedef struct handle {
	ulp_file *file;        /* archived, read-only */
	node *n;               /* staged */
	char *path;            /* for writes after an early archive (dup'd fds) */
	int wr;                /* opened for writing: its close archives the file */
} handle;

/* an archived file unlinked while open (invariant 5) */
typedef struct ghost {
	char *path;            /* its hidden name */
	ulp_stat st;           /* what getattr shows; setattr changes it */
	struct ghost *next;
} ghost;

static struct {
	ulp_archive *a;
	char *archive;
	int read_only, foreground;
	int no_latest;         /* -o nolatest: no `latest` symlinks */
	int lock_fd;           /* the mount lock (read-write mounts), or -1 */
	unsigned kept;         /* files left staged at unmount (exit status 1) */
	uint64_t cache_size;
	unsigned max_chain;
	int threads;
	char *mountpoint;
	uint64_t readahead;    /* bytes; 0: the kernel's window */
	pthread_mutex_t mu;    /* guards nodes and the commit queue */
	node *nodes;
	ghost *ghosts;         /* guarded by mu (invariant 5) */
	/* the committer (invariant 4) */
	pthread_cond_t qcv;    /* the queue changed */
	node *qhead, *qtail;
	unsigned qlen;         /* queued plus the one being archived */
	int qstop, committer_on;
	int rebase_wanted;     /* the index may have queued re-basing work (recode.c) */
	int qerr;              /* errno of a failed background commit, not reported yet */
	pthread_t committer;
} fs = {.mu = PTHREAD_MUTEX_INITIALIZER, .qcv = PTHREAD_COND_INITIALIZER};

static int err_of(int rc)
{
	return -ulp_to_errno(rc);
}

static void log_err(const char *what, const char *path)
{
	syslog(LOG_ERR, "ulpackfs: %s %s: %s", what, path, ulp_archive_errmsg(fs.a));
	if (fs.foreground)
		fprintf(stderr, "ulpackfs: %s %s: %s\n", what, path, ulp_archive_errmsg(fs.a));
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

/* libfuse's name for a file unlinked while open (invariant 5):
 * ".fuse_hidden" and 16 hex digits; a name reserved in the mount */
static int is_hidden_name(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	if (strncmp(b, ".fuse_hidden", 12) != 0 || strlen(b) != 28)
		return 0;
	for (const char *c = b + 12; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return 0;
	return 1;
}

/* rsync's temporary names: ".<name>.XXXXXX" */
static int is_temp_name(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	const char *dot = strrchr(b, '.');
	if (b[0] != '.' || !dot || dot == b || strlen(dot + 1) != 6)
		return 0;
	for (const char *c = dot + 1; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
			return 0;
	return 1;
}

/* a name a closed file is archived under (invariants 2 and 5) */
static int final_name(const char *path)
{
	return !is_temp_name(path) && !is_hidden_name(path);
}

/* caller holds fs.mu */
static ghost *find_ghost(const char *p)
{
	for (ghost *g = fs.ghosts; g; g = g->next)
		if (!strcmp(g->path, p))
			return g;
	return NULL;
}

/* caller holds fs.mu */
static node *find_node(const char *p)
{
	for (node *n = fs.nodes; n; n = n->next)
		if (n->path && !strcmp(n->path, p))
			return n;
	return NULL;
}

static void unlink_node(node *n)
{
	for (node **pp = &fs.nodes; *pp; pp = &(*pp)->next)
		if (*pp == n) {
			*pp = n->next;
			break;
		}
	free(n->path);
	free(n);
}

static node *new_node(const char *p, ulp_stage *s, const ulp_meta *m)
{
	node *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->path = strdup(p);
	n->stage = s;
	n->meta = *m;
	n->next = fs.nodes;
	fs.nodes = n;
	return n;
}

/*
 * Archives a staged node under path. Called with mu held; mu is released
 * while the archive does its work, so that other files keep being served
 * (the node is pinned meanwhile and its staging file stays until mu is held
 * again). On success the caller gives up `drop` handle counts; the node goes
 * when no handle is left, else it stays staged and clean (unless a write
 * came in during the commit).
 */
static int commit_node(node *n, const char *path, int drop)
{
	ulp_meta m = n->meta;
	struct stat sb;
	if (!n->mtime_set && fstat(ulp_stage_fd(n->stage), &sb) == 0)
		m.mtime = ulp_time_make(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
	char *dst = strdup(path);
	if (!dst)
		return -ENOMEM;
	uint64_t writes = n->writes, attrs = n->attrs;
	n->handles++; /* pinned while mu is released */
	pthread_mutex_unlock(&fs.mu);
	int rc = ulp_archive_put(fs.a, dst, ulp_stage_fd(n->stage), &m, NULL);
	pthread_mutex_lock(&fs.mu);
	n->handles--;
	if (rc < 0) {
		log_err("archiving", dst);
		free(dst);
		return err_of(rc);
	}
	fs.rebase_wanted = 1; /* the committer re-bases when idle */
	pthread_cond_broadcast(&fs.qcv);
	if (!n->path) { /* unlinked while it was being archived */
		ulp_archive_remove(fs.a, dst);
	} else {
		if (strcmp(n->path, dst) != 0 && ulp_archive_rename(fs.a, dst, n->path) == 0) {
			free(dst); /* renamed meanwhile: follow */
			dst = strdup(n->path);
		}
		if (n->attrs != attrs && dst) /* chmod/chown/utimens meanwhile */
			ulp_archive_setattr(fs.a, dst, ULP_SET_MODE | ULP_SET_OWNER | (n->mtime_set ? ULP_SET_MTIME : 0),
			                    &n->meta);
	}
	free(dst);
	n->handles -= drop;
	if (n->writes != writes)
		return 0; /* written to meanwhile: stays staged and dirty */
	n->dirty = 0;
	if (n->handles > 0)
		return 0; /* opened again meanwhile: stays staged, identical to the archive */
	ulp_stage_discard(n->stage);
	n->stage = NULL;
	unlink_node(n);
	return 0;
}

/* n's metadata as it would be archived now (mu held) */
static ulp_meta node_meta(node *n)
{
	ulp_meta m = n->meta;
	struct stat sb;
	if (!n->mtime_set && fstat(ulp_stage_fd(n->stage), &sb) == 0)
		m.mtime = ulp_time_make(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
	return m;
}

/* A staged node that leaves its path (unlinked, or replaced by a rename)
 * while open: no recovery may bring it back (invariant 5). mu held. */
static int forget_node(node *n)
{
	int rc = ulp_stage_forget(n->stage);
	if (rc < 0)
		log_err("forgetting the staged file of", n->path);
	return rc < 0 ? err_of(rc) : 0;
}

/* Drops one handle count of n (mu held); a node nobody holds that has
 * nothing to archive goes. */
static void unpin(node *n)
{
	if (--n->handles > 0)
		return;
	if (!n->path || !n->dirty) {
		ulp_stage_discard(n->stage);
		n->stage = NULL;
		unlink_node(n);
	}
}

/* Queues a closed, renamed node for the committer (mu held). */
static void enqueue(node *n)
{
	n->handles++; /* the queue's count */
	n->qnext = NULL;
	if (fs.qtail)
		fs.qtail->qnext = n;
	else
		fs.qhead = n;
	fs.qtail = n;
	fs.qlen++;
	pthread_cond_broadcast(&fs.qcv);
}

/* After a rename (fs.mu not held): wakes the committer to re-base. */
static void want_rebase(void)
{
	pthread_mutex_lock(&fs.mu);
	fs.rebase_wanted = 1;
	pthread_cond_broadcast(&fs.qcv);
	pthread_mutex_unlock(&fs.mu);
}

/* Re-bases in the background (fs.mu held; released meanwhile): a failure
 * leaves the work queued in the index for the next time. */
static void rebase_pending(void)
{
	fs.rebase_wanted = 0;
	pthread_mutex_unlock(&fs.mu);
	if (ulp_archive_rebase_pending(fs.a, NULL, NULL, NULL) < 0)
		fprintf(stderr, "ulpackfs: re-basing: %s\n", ulp_archive_errmsg(fs.a));
	pthread_mutex_lock(&fs.mu);
}

/* The committer thread: archives queued nodes in order (invariant 4). */
static void *committer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&fs.mu);
	for (;;) {
		while (!fs.qhead && !fs.qstop && !fs.rebase_wanted)
			pthread_cond_wait(&fs.qcv, &fs.mu);
		if (!fs.qhead && !fs.qstop) { /* idle, and renames or commits queued work */
			rebase_pending();
			continue;
		}
		node *n = fs.qhead;
		if (!n)
			break; /* stopping, and nothing left */
		fs.qhead = n->qnext;
		if (!fs.qhead)
			fs.qtail = NULL;
		/* still under a final name, and nobody opened it again meanwhile
		 * (else the last close archives it) */
		int rc = -1;
		if (n->path && n->dirty && n->handles == 1 && final_name(n->path)) {
			rc = commit_node(n, n->path, 1); /* drops our count on success */
			if (rc < 0) {
				if (!fs.qerr)
					fs.qerr = rc;
				if (n->path && !n->synced && ulp_stage_sync(n->stage, n->path, &n->meta) < 0)
					log_err("keeping the staged file of", n->path);
			}
		}
		if (rc < 0)
			unpin(n);
		fs.qlen--;
		pthread_cond_broadcast(&fs.qcv);
	}
	rebase_pending(); /* at unmount: the last renames */
	pthread_mutex_unlock(&fs.mu);
	return NULL;
}

/* Waits until the queue has room (mu held). */
static void wait_queue_room(void)
{
	while (fs.committer_on && fs.qlen >= QUEUE_MAX)
		pthread_cond_wait(&fs.qcv, &fs.mu);
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

static int node_stat(node *n, struct stat *st)
{
	struct stat sb;
	if (fstat(ulp_stage_fd(n->stage), &sb) < 0)
		return -errno;
	memset(st, 0, sizeof(*st));
	st->st_mode = S_IFREG | (n->meta.mode & 07777);
	st->st_nlink = 1;
	st->st_uid = n->meta.uid;
	st->st_gid = n->meta.gid;
	st->st_size = sb.st_size;
	st->st_blocks = sb.st_blocks;
	st->st_blksize = 1 << 20;
	if (n->mtime_set) {
		set_time(&st->st_mtim, n->meta.mtime);
	} else {
		st->st_mtim = sb.st_mtim;
	}
	st->st_atim = st->st_ctim = st->st_mtim;
	return 0;
}

/* ---- operations ------------------------------------------------------------ */

static void readahead_once(void);

static void *ulpfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	if (conn->capable & FUSE_CAP_ASYNC_READ)
		conn->want |= FUSE_CAP_ASYNC_READ;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	conn->max_read = ULPFS_MAX_READ; /* must match -o max_read (main) */
	conn->max_write = 1 << 20;       /* the kernel caps it to what it supports */
	cfg->hard_remove = 0;   /* unlinked open files keep a (hidden) name: invariant 5 */
	cfg->use_ino = 0;
	cfg->kernel_cache = 0;  /* per open: keep_cache for archived files only */
	cfg->entry_timeout = cfg->attr_timeout = fs.read_only ? 3600.0 : 1.0;
	cfg->negative_timeout = fs.read_only ? 10.0 : 0.0;
	/* started here, in the process that serves (after daemonizing) */
	if (!fs.read_only && pthread_create(&fs.committer, NULL, committer, NULL) == 0)
		fs.committer_on = 1;
	return NULL;
}

static void ulpfs_destroy(void *p)
{
	(void)p;
	pthread_mutex_lock(&fs.mu);
	if (fs.committer_on) { /* the queue drains first, in order */
		fs.qstop = 1;
		pthread_cond_broadcast(&fs.qcv);
		pthread_mutex_unlock(&fs.mu);
		pthread_join(fs.committer, NULL);
		pthread_mutex_lock(&fs.mu);
		fs.committer_on = 0;
	}
	while (fs.nodes) {
		node *n = fs.nodes;
		/* closed files still waiting for a rename (names that look like
		 * rsync's temporaries) were closed by someone: archive them under
		 * the name they have rather than lose them */
		if (n->path && is_hidden_name(n->path)) {
			free(n->path); /* unlinked: never archived (invariant 5) */
			n->path = NULL;
		}
		if (n->path && n->dirty && n->handles == 0 && commit_node(n, n->path, 0) == 0)
			continue; /* commit_node removed it */
		if (n->path && n->dirty) {
			/* could not be archived (a full disk): keep it for the next
			 * mount's recovery rather than lose it */
			fs.kept++;
			if (ulp_stage_sync(n->stage, n->path, &n->meta) == 0) {
				syslog(LOG_ERR, "ulpackfs: %s: kept in %s/staging, archived at the next mount",
				       n->path, fs.archive);
				ulp_stage_close(n->stage);
			} else {
				log_err("keeping the staged file of", n->path);
				ulp_stage_discard(n->stage);
			}
		} else {
			ulp_stage_discard(n->stage);
		}
		n->stage = NULL;
		unlink_node(n);
	}
	while (fs.ghosts) {
		ghost *g = fs.ghosts;
		fs.ghosts = g->next;
		free(g->path);
		free(g);
	}
	pthread_mutex_unlock(&fs.mu);
}

/*
 * `latest`: in each run directory (ulp_archive_latest), a read-only symlink
 * to its highest step directory, unless a real entry has that name (in the
 * archive, or staged). 1 and its target if p is one, else 0.
 */
static int virtual_latest(const char *p, char *target, size_t cap)
{
	const char *slash = strrchr(p, '/');
	const char *name = slash ? slash + 1 : p;
	char dir[ULP_PATH_MAX + 1];
	if (fs.no_latest || strcmp(name, "latest") || (size_t)(name - p) > sizeof(dir))
		return 0;
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - p) : 0, p);
	pthread_mutex_lock(&fs.mu);
	int real = find_node(p) != NULL;
	pthread_mutex_unlock(&fs.mu);
	return !real && ulp_archive_latest(fs.a, dir, target, cap) == 0;
}

/* The stat of p's `latest` (target: its step directory's name): owner and
 * mtime of that directory, mode 0444 (read-only). */
static void latest_stat(const char *p, const char *target, struct stat *st)
{
	char tp[ULP_PATH_MAX + 1];
	ulp_stat ts;
	const char *slash = strrchr(p, '/');
	snprintf(tp, sizeof(tp), "%.*s%s%s", slash ? (int)(slash - p) : 0, p, slash ? "/" : "", target);
	if (ulp_archive_stat(fs.a, tp, &ts) == 0)
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
	handle *h = fi ? (handle *)(uintptr_t)fi->fh : NULL;
	if (h && h->n) {
		pthread_mutex_lock(&fs.mu);
		int rc = node_stat(h->n, st);
		pthread_mutex_unlock(&fs.mu);
		return rc;
	}
	if (!path) { /* invariant 6 */
		if (!h || !h->file)
			return -ESTALE;
		fill_stat(ulp_file_get_stat(h->file), st);
		return 0;
	}
	const char *p = rel(path);
	pthread_mutex_lock(&fs.mu);
	node *n = find_node(p);
	ghost *g = n ? NULL : find_ghost(p);
	int rc = n ? node_stat(n, st) : 1;
	if (g) {
		fill_stat(&g->st, st);
		rc = 0;
	}
	pthread_mutex_unlock(&fs.mu);
	if (rc <= 0)
		return rc;
	ulp_stat s;
	rc = ulp_archive_stat(fs.a, p, &s);
	char target[ULP_NAME_MAX + 1];
	if (rc == -ULP_E_NOENT && virtual_latest(p, target, sizeof(target))) {
		latest_stat(p, target, st);
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
	const char *dir;
} rd;

static int readdir_cb(void *arg, const char *name, const ulp_stat *s)
{
	rd *r = arg;
	char p[8192];
	if (is_hidden_name(name))
		return 0; /* invariant 5 (an archive from before it) */
	snprintf(p, sizeof(p), "%s%s%s", r->dir, r->dir[0] ? "/" : "", name);
	pthread_mutex_lock(&fs.mu);
	int staged = find_node(p) != NULL;
	pthread_mutex_unlock(&fs.mu);
	if (staged)
		return 0; /* listed from the node below */
	struct stat st;
	fill_stat(s, &st);
	return r->filler(r->buf, name, &st, 0, FUSE_FILL_DIR_PLUS) ? 1 : 0;
}

static int ulpfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                         struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)off, (void)fi, (void)flags;
	readahead_once();
	if (!path)
		return -ESTALE; /* invariant 6: a directory removed while open */
	const char *p = rel(path);
	filler(buf, ".", NULL, 0, 0);
	filler(buf, "..", NULL, 0, 0);
	rd r = {buf, filler, p};
	int rc = ulp_archive_readdir(fs.a, p, readdir_cb, &r);
	if (rc < 0)
		return err_of(rc);
	size_t pl = strlen(p);
	pthread_mutex_lock(&fs.mu);
	for (node *n = fs.nodes; n; n = n->next) {
		if (!n->path || is_hidden_name(n->path))
			continue;
		const char *slash = strrchr(n->path, '/');
		size_t dl = slash ? (size_t)(slash - n->path) : 0;
		if (dl == pl && !strncmp(n->path, p, pl)) {
			struct stat st;
			if (node_stat(n, &st) == 0)
				filler(buf, slash ? slash + 1 : n->path, &st, 0, FUSE_FILL_DIR_PLUS);
		}
	}
	pthread_mutex_unlock(&fs.mu);
	char lp[ULP_PATH_MAX + 8], target[ULP_NAME_MAX + 1];
	snprintf(lp, sizeof(lp), "%s%slatest", p, p[0] ? "/" : "");
	if (virtual_latest(lp, target, sizeof(target))) {
		struct stat st;
		latest_stat(lp, target, &st);
		filler(buf, "latest", &st, 0, FUSE_FILL_DIR_PLUS);
	}
	return 0;
}

static int open_handle(const char *p, struct fuse_file_info *fi, int create, mode_t mode)
{
	handle *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	int acc = fi->flags & O_ACCMODE;
	int rc = 0;
	pthread_mutex_lock(&fs.mu);
	if (fs.qerr && (create || acc != O_RDONLY)) { /* invariant 4 */
		rc = fs.qerr;
		fs.qerr = 0;
		goto out;
	}
	node *n = find_node(p);
	if (!n && (create || acc != O_RDONLY || (fi->flags & O_TRUNC))) {
		if (fs.read_only) {
			rc = -EROFS;
			goto out;
		}
		ulp_stat s;
		int exists = ulp_archive_stat(fs.a, p, &s) == 0;
		if (exists && s.is_dir) {
			rc = -EISDIR;
			goto out;
		}
		if (!exists && !create) {
			rc = -ENOENT;
			goto out;
		}
		ulp_stage *st;
		/* copy-up unless the file is new or truncated */
		int r = ulp_stage_new(fs.a, exists && !(fi->flags & O_TRUNC) && !create ? p : NULL, &st);
		if (r < 0) {
			rc = err_of(r);
			goto out;
		}
		struct fuse_context *cx = fuse_get_context();
		ulp_meta m = {exists ? s.mode & 07777 : (mode & 07777), cx ? cx->uid : 0, cx ? cx->gid : 0, ulp_time_now()};
		if (exists) {
			m.uid = s.uid;
			m.gid = s.gid;
		}
		n = new_node(p, st, &m);
		if (!n) {
			ulp_stage_discard(st);
			rc = -ENOMEM;
			goto out;
		}
		n->dirty = create || (fi->flags & O_TRUNC) || !exists;
	} else if (n && (fi->flags & O_TRUNC)) {
		if (ftruncate(ulp_stage_fd(n->stage), 0) < 0) {
			rc = -errno;
			goto out;
		}
		n->dirty = 1;
	}
	if (n) {
		n->handles++;
		h->n = n;
		fi->keep_cache = 0;
	} else {
		int r = ulp_file_open(fs.a, p, &h->file);
		if (r < 0) {
			rc = err_of(r);
			goto out;
		}
		fi->keep_cache = 1; /* archived files never change (invariant 3) */
	}
	h->path = strdup(p);
	h->wr = create || acc != O_RDONLY;
	fi->fh = (uint64_t)(uintptr_t)h;
out:
	pthread_mutex_unlock(&fs.mu);
	if (rc < 0)
		free(h);
	return rc;
}

static int ulpfs_open(const char *path, struct fuse_file_info *fi)
{
	readahead_once();
	return open_handle(rel(path), fi, 0, 0);
}

static int ulpfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	const char *p = rel(path);
	int rc = ulp_path_check(p); /* NAME_MAX, PATH_MAX: it could not be archived */
	if (rc < 0)
		return err_of(rc);
	if (is_hidden_name(p))
		return -EINVAL; /* reserved (invariant 5) */
	return open_handle(p, fi, 1, mode);
}

/*
 * A handle whose file was archived by the flush of a close(2) while a dup'd
 * descriptor stays open (dd does this) goes on: reads come from the archive,
 * a write stages the file again (copy-up) and the last flush archives it.
 */
static int reattach(handle *h)
{
	int rc = 0;
	pthread_mutex_lock(&fs.mu);
	node *n = find_node(h->path);
	if (!n) {
		ulp_stage *st;
		ulp_stat s;
		int exists = ulp_archive_stat(fs.a, h->path, &s) == 0;
		int r = ulp_stage_new(fs.a, exists ? h->path : NULL, &st);
		if (r < 0) {
			rc = err_of(r);
		} else {
			ulp_meta m = {exists ? s.mode & 07777 : 0644, exists ? s.uid : 0, exists ? s.gid : 0, ulp_time_now()};
			n = new_node(h->path, st, &m);
			if (!n) {
				ulp_stage_discard(st);
				rc = -ENOMEM;
			}
		}
	}
	if (n) {
		n->handles++;
		h->n = n;
	}
	pthread_mutex_unlock(&fs.mu);
	return rc;
}

static int ulpfs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	handle *h = (handle *)(uintptr_t)fi->fh;
	if (!h->n && !h->file) {
		int r = ulp_file_open(fs.a, h->path, &h->file);
		if (r < 0)
			return err_of(r);
	}
	if (h->n) {
		ssize_t r = pread(ulp_stage_fd(h->n->stage), buf, size, off);
		return r < 0 ? -errno : (int)r;
	}
	int64_t n = ulp_file_pread(h->file, buf, size, (uint64_t)off);
	if (n < 0) {
		log_err("read", path ? path : h->path);
		return err_of((int)n); /* a damaged blob: EIO, never wrong bytes */
	}
	return (int)n;
}

static int ulpfs_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	handle *h = (handle *)(uintptr_t)fi->fh;
	if (!h->n) {
		if (h->file) { /* archived before: read from it no more */
			ulp_file_close(h->file);
			h->file = NULL;
		}
		int r = reattach(h);
		if (r < 0)
			return r;
	}
	int64_t w = ulp_stage_write(h->n->stage, buf, size, (uint64_t)off);
	if (w < 0)
		return err_of((int)w);
	pthread_mutex_lock(&fs.mu);
	h->n->dirty = 1;
	h->n->writes++;
	pthread_mutex_unlock(&fs.mu);
	return (int)w;
}

/* flush of the last handle archives the file, so close(2) reports errors */
static int ulpfs_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	handle *h = (handle *)(uintptr_t)fi->fh;
	if (!h->n)
		return 0;
	int rc = 0;
	pthread_mutex_lock(&fs.mu);
	node *n = h->n;
	if (h->wr && n->path && n->handles == 1 && n->dirty && final_name(n->path)) {
		rc = commit_node(n, n->path, 1);
		if (rc == 0) {
			h->n = NULL; /* committed: the handle has nothing left to do */
			h->file = NULL;
		}
	} else if (h->wr && n->path && n->handles == 1 && n->dirty) { /* waits for a rename (invariant 2) */
		ulp_meta m = node_meta(n);
		int r = ulp_stage_record(n->stage, n->path, &m);
		if (r < 0) {
			log_err("recording the staged file of", n->path);
			rc = err_of(r);
		}
	}
	pthread_mutex_unlock(&fs.mu);
	return rc;
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
	handle *h = (handle *)(uintptr_t)fi->fh;
	if (h->file) {
		ulp_file_close(h->file);
		trim_packs(0);
	}
	if (h->n) {
		pthread_mutex_lock(&fs.mu);
		node *n = h->n;
		if (n->handles == 1 && n->path && n->dirty && h->wr && final_name(n->path)) {
			n->handles--; /* the last handle: its flush failed, try once more */
			commit_node(n, n->path, 0);
		} else { /* unlinked while open, or nothing written: the node goes */
			unpin(n);
		}
		pthread_mutex_unlock(&fs.mu);
	}
	free(h->path);
	free(h);
	return 0;
}

static int ulpfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)datasync;
	handle *h = (handle *)(uintptr_t)fi->fh;
	if (!h || !h->n)
		return 0;
	pthread_mutex_lock(&fs.mu);
	/* an unlinked file is not to come back after a crash (invariant 5) */
	int rc = h->n->path && !is_hidden_name(h->n->path) ? ulp_stage_sync(h->n->stage, h->n->path, &h->n->meta) : 0;
	pthread_mutex_unlock(&fs.mu);
	if (rc < 0)
		log_err("fsync", path ? path : h->path);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	if (fi && fi->fh && ((handle *)(uintptr_t)fi->fh)->n) {
		handle *h = (handle *)(uintptr_t)fi->fh;
		if (ftruncate(ulp_stage_fd(h->n->stage), size) < 0)
			return -errno;
		pthread_mutex_lock(&fs.mu);
		h->n->dirty = 1;
		h->n->writes++;
		pthread_mutex_unlock(&fs.mu);
		return 0;
	}
	if (!path)
		return -ESTALE; /* invariant 6 */
	const char *p = rel(path);
	pthread_mutex_lock(&fs.mu);
	node *n = find_node(p);
	int rc = 0;
	if (n) {
		rc = ftruncate(ulp_stage_fd(n->stage), size) < 0 ? -errno : 0;
		n->dirty = 1;
	}
	pthread_mutex_unlock(&fs.mu);
	if (n)
		return rc;
	/* an archived file: stage a copy, truncate, archive again */
	struct fuse_file_info tfi = {.flags = O_RDWR | (size == 0 ? O_TRUNC : 0)};
	if ((rc = open_handle(p, &tfi, 0, 0)) < 0)
		return rc;
	handle *h = (handle *)(uintptr_t)tfi.fh;
	rc = ftruncate(ulp_stage_fd(h->n->stage), size) < 0 ? -errno : 0;
	h->n->dirty = 1;
	int r2 = ulpfs_flush(path, &tfi);
	ulpfs_release(path, &tfi);
	return rc ? rc : r2;
}

/*
 * libfuse hides a file unlinked while open, or replaced by a rename, under
 * the name t (invariant 5): a staged file stays a node under that name, an
 * archived one leaves the archive now and lives on as a ghost.
 */
static int hide(const char *f, const char *t)
{
	int rc = 0;
	char *tp = strdup(t);
	ghost *g = calloc(1, sizeof(*g));
	pthread_mutex_lock(&fs.mu);
	node *n = find_node(f);
	ulp_stat s;
	int archived = ulp_archive_stat(fs.a, f, &s) == 0;
	if (!tp || !g) {
		rc = -ENOMEM;
	} else if (!n && !archived) {
		rc = -ENOENT;
	} else if (archived && (rc = ulp_archive_remove(fs.a, f)) < 0) {
		log_err("removing", f);
		rc = err_of(rc);
	} else if (n && (rc = forget_node(n)) < 0) {
		/* its staging record stays: it could come back after a crash */
	} else if (n) { /* unlinked: a crash must not bring it back (invariant 5) */
		free(n->path);
		n->path = tp;
		tp = NULL;
	} else {
		g->path = tp;
		g->st = s;
		g->next = fs.ghosts;
		fs.ghosts = g;
		tp = NULL;
		g = NULL;
	}
	pthread_mutex_unlock(&fs.mu);
	free(tp);
	free(g);
	return rc;
}

static int has_child(void *arg, const char *name, const ulp_stat *s)
{
	(void)arg, (void)name, (void)s;
	return 1; /* stops the listing: one is enough */
}

/* rename(2) of a directory over an existing directory t (fs.mu held):
 * -ENOTEMPTY if t has entries, counting files staged below it that the
 * index does not hold yet (the library only sees the index); checked before
 * any staged file moves. 0 otherwise: the library answers the rest. */
static int rename_over_dir_check(const char *f, const char *t)
{
	ulp_stat sf, st;
	if (ulp_archive_stat(fs.a, f, &sf) < 0 || !sf.is_dir || ulp_archive_stat(fs.a, t, &st) < 0 || !st.is_dir)
		return 0;
	size_t tl = strlen(t);
	for (node *x = fs.nodes; x; x = x->next)
		if (x->path && !strncmp(x->path, t, tl) && x->path[tl] == '/')
			return -ENOTEMPTY;
	return ulp_archive_readdir(fs.a, t, has_child, NULL) == 1 ? -ENOTEMPTY : 0;
}

static int ulpfs_rename(const char *from, const char *to, unsigned int flags)
{
	const char *f = rel(from), *t = rel(to);
	if (flags & RENAME_EXCHANGE)
		return -EINVAL;
	if (fs.read_only)
		return -EROFS;
	if (is_hidden_name(t))
		return hide(f, t);
	int pc = ulp_path_check(t);
	if (pc < 0)
		return err_of(pc);
	if (!strcmp(f, t))
		return 0;
	ulp_stat s;
	if ((flags & RENAME_NOREPLACE) && ulp_archive_stat(fs.a, t, &s) == 0)
		return -EEXIST;
	pthread_mutex_lock(&fs.mu);
	wait_queue_room();
	node *n = find_node(f), *old = find_node(t);
	int rc = n ? 0 : rename_over_dir_check(f, t);
	if (rc < 0) {
		pthread_mutex_unlock(&fs.mu);
		return rc;
	}
	if (old && old != n) { /* replacing a staged file */
		if (old->handles && (rc = forget_node(old)) < 0) {
			pthread_mutex_unlock(&fs.mu);
			return rc;
		}
		if (old->handles) {
			free(old->path);
			old->path = NULL;
		} else {
			ulp_stage_discard(old->stage);
			old->stage = NULL;
			unlink_node(old);
		}
	}
	if (n) {
		ulp_stat fst;
		int archived = ulp_archive_stat(fs.a, f, &fst) == 0 && !fst.is_dir;
		if (n->handles || !n->dirty) { /* still open: rename the staged file */
			/* and its archived version: the name t has it until the node
			 * is archived over it; nothing stays under f */
			if (archived && (rc = ulp_archive_rename(fs.a, f, t)) < 0) {
				log_err("renaming", f);
				pthread_mutex_unlock(&fs.mu);
				return err_of(rc);
			}
			free(n->path);
			n->path = strdup(t);
			if (n->path) /* recovered under its new name after a crash (invariant 5) */
				ulp_stage_relabel(n->stage, n->path, &n->meta);
		} else { /* closed: archive it under its final name */
			char *old_path = n->path, *new_path = strdup(t);
			if (!new_path) {
				pthread_mutex_unlock(&fs.mu);
				return -ENOMEM;
			}
			n->path = new_path; /* the node answers for its new name meanwhile */
			if (fs.committer_on && !is_temp_name(new_path) &&
			    (rc = ulp_stage_sync(n->stage, new_path, &n->meta)) == 0) { /* invariant 4 */
				free(old_path);
				n->synced = 1;
				enqueue(n);
			} else if (rc < 0) { /* cannot make it durable: back under its old name */
				rc = err_of(rc);
				n->path = old_path;
				free(new_path);
			} else {
				rc = commit_node(n, t, 0);
				if (rc < 0 && n->path == new_path) { /* failed: back under its old name */
					n->path = old_path;
					free(new_path);
				} else {
					free(old_path);
				}
			}
			/* archived (or queued) under t: an older version under f goes */
			if (rc == 0 && archived && ulp_archive_remove(fs.a, f) < 0)
				log_err("removing", f);
		}
		pthread_mutex_unlock(&fs.mu);
		return rc;
	}
	/* staged files below a renamed directory move with it */
	size_t fl = strlen(f);
	for (node *x = fs.nodes; x; x = x->next)
		if (x->path && !strncmp(x->path, f, fl) && x->path[fl] == '/') {
			char *np = malloc(strlen(t) + strlen(x->path + fl) + 1);
			if (np) {
				sprintf(np, "%s%s", t, x->path + fl);
				free(x->path);
				x->path = np;
				ulp_meta m = node_meta(x);
				if (ulp_stage_relabel(x->stage, np, &m) < 0) /* invariant 5 */
					log_err("relabelling the staged file of", np);
			}
		}
	for (ghost *g = fs.ghosts; g; g = g->next) /* and so do ghosts (invariant 5) */
		if (!strncmp(g->path, f, fl) && g->path[fl] == '/') {
			char *np = malloc(strlen(t) + strlen(g->path + fl) + 1);
			if (np) {
				sprintf(np, "%s%s", t, g->path + fl);
				free(g->path);
				g->path = np;
			}
		}
	pthread_mutex_unlock(&fs.mu);
	rc = ulp_archive_rename(fs.a, f, t);
	if (rc == 0)
		want_rebase();
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_unlink(const char *path)
{
	const char *p = rel(path);
	if (fs.read_only)
		return -EROFS;
	pthread_mutex_lock(&fs.mu);
	for (ghost **gp = &fs.ghosts; *gp; gp = &(*gp)->next)
		if (!strcmp((*gp)->path, p)) { /* its last close (invariant 5) */
			ghost *g = *gp;
			*gp = g->next;
			free(g->path);
			free(g);
			pthread_mutex_unlock(&fs.mu);
			return 0;
		}
	node *n = find_node(p);
	if (n) {
		int rc = n->handles ? forget_node(n) : 0;
		if (rc < 0) {
			pthread_mutex_unlock(&fs.mu);
			return rc;
		}
		if (n->handles) {
			free(n->path);
			n->path = NULL; /* discarded at its last release */
		} else {
			ulp_stage_discard(n->stage);
			n->stage = NULL;
			unlink_node(n);
		}
	}
	pthread_mutex_unlock(&fs.mu);
	int rc = ulp_archive_remove(fs.a, p);
	if (rc == -ULP_E_NOENT && n)
		return 0;
	char target[ULP_NAME_MAX + 1];
	if (rc == -ULP_E_NOENT && virtual_latest(p, target, sizeof(target)))
		return 0; /* computed, nothing to remove: rsync --delete carries on */
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_mkdir(const char *path, mode_t mode)
{
	if (fs.read_only)
		return -EROFS;
	struct fuse_context *cx = fuse_get_context();
	ulp_meta m = {mode & 07777, cx->uid, cx->gid, ulp_time_now()};
	int rc = ulp_archive_mkdir(fs.a, rel(path), &m);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_rmdir(const char *path)
{
	const char *p = rel(path);
	if (fs.read_only)
		return -EROFS;
	ulp_stat s;
	int rc = ulp_archive_stat(fs.a, p, &s);
	if (rc < 0)
		return err_of(rc);
	if (!s.is_dir)
		return -ENOTDIR;
	size_t pl = strlen(p);
	pthread_mutex_lock(&fs.mu);
	for (node *n = fs.nodes; n; n = n->next)
		if (n->path && !strncmp(n->path, p, pl) && n->path[pl] == '/' && !is_hidden_name(n->path)) {
			pthread_mutex_unlock(&fs.mu);
			return -ENOTEMPTY;
		}
	pthread_mutex_unlock(&fs.mu);
	rc = ulp_archive_remove(fs.a, p);
	return rc < 0 ? err_of(rc) : 0; /* NOTEMPTY -> ENOTEMPTY */
}

static int ulpfs_symlink(const char *target, const char *path)
{
	if (fs.read_only)
		return -EROFS;
	struct fuse_context *cx = fuse_get_context();
	ulp_meta m = {0777, cx->uid, cx->gid, ulp_time_now()};
	int rc = ulp_archive_symlink(fs.a, rel(path), target, &m);
	return rc < 0 ? err_of(rc) : 0;
}

static int ulpfs_readlink(const char *path, char *buf, size_t size)
{
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
	if (fs.read_only)
		return -EROFS;
	handle *h = fi ? (handle *)(uintptr_t)fi->fh : NULL;
	if (!path && !(h && h->n))
		return -ESTALE; /* invariant 6 */
	const char *p = path ? rel(path) : NULL;
	pthread_mutex_lock(&fs.mu);
	node *n = h && h->n ? h->n : find_node(p);
	if (n) {
		if (which & ULP_SET_MODE)
			n->meta.mode = m->mode & 07777;
		if (which & ULP_SET_OWNER) {
			if (m->uid != (uint32_t)-1)
				n->meta.uid = m->uid;
			if (m->gid != (uint32_t)-1)
				n->meta.gid = m->gid;
		}
		if (which & ULP_SET_MTIME) {
			n->meta.mtime = m->mtime;
			n->mtime_set = 1;
		}
		n->attrs++;
		/* a node identical to its archived version (opened for writing,
		 * nothing written: touch, futimens, fchmod) is not archived again
		 * at its close: the archive takes the change now */
		int rc = 0;
		if (!n->dirty && n->path && final_name(n->path)) {
			int r = ulp_archive_setattr(fs.a, n->path, which, &n->meta);
			if (r < 0 && r != -ULP_E_NOENT) {
				log_err("changing attributes of", n->path);
				rc = err_of(r);
			}
		}
		pthread_mutex_unlock(&fs.mu);
		return rc;
	}
	ghost *g = find_ghost(p);
	if (g) { /* unlinked while open: only its stat changes (invariant 5) */
		if (which & ULP_SET_MODE)
			g->st.mode = (g->st.mode & ~07777u) | (m->mode & 07777);
		if ((which & ULP_SET_OWNER) && m->uid != (uint32_t)-1)
			g->st.uid = m->uid;
		if ((which & ULP_SET_OWNER) && m->gid != (uint32_t)-1)
			g->st.gid = m->gid;
		if (which & ULP_SET_MTIME)
			g->st.mtime = m->mtime;
		pthread_mutex_unlock(&fs.mu);
		return 0;
	}
	pthread_mutex_unlock(&fs.mu);
	ulp_meta mm = *m;
	if (which & ULP_SET_OWNER) {
		ulp_stat s;
		if (ulp_archive_stat(fs.a, p, &s) == 0) {
			if (mm.uid == (uint32_t)-1)
				mm.uid = s.uid;
			if (mm.gid == (uint32_t)-1)
				mm.gid = s.gid;
		}
	}
	int rc = ulp_archive_setattr(fs.a, p, which, &mm);
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

static int ulpfs_statfs(const char *path, struct statvfs *st)
{
	(void)path;
	readahead_once();
	trim_packs(1);
	return statvfs(fs.archive, st) < 0 ? -errno : 0;
}

/* 1 if path is a staged file (written, not archived yet) */
static int staged(const char *p)
{
	pthread_mutex_lock(&fs.mu);
	int r = find_node(p) != NULL;
	pthread_mutex_unlock(&fs.mu);
	return r;
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

/* user.ulpack.* : step, sha256, stored_bytes, ratio, chain_depth, anchor */
static const char *const xattrs[] = {"user.ulpack.step", "user.ulpack.sha256", "user.ulpack.stored_bytes",
                                     "user.ulpack.ratio", "user.ulpack.chain_depth", "user.ulpack.anchor"};

static int ulpfs_getxattr(const char *path, const char *name, char *value, size_t size)
{
	ulp_stat s;
	char v[256];
	if (!rel(path)[0] && !strcmp(name, "user.ulpack.counters")) { /* decode counters, for tests */
		ulp_counters c;
		ulp_archive_counters(fs.a, &c);
		snprintf(v, sizeof(v), "chunks_decoded %llu deltas_decoded %llu cache_hits %llu cache_misses %llu"
		         " cache_bytes %llu max_walk %llu cache_recycled %llu", (unsigned long long)c.chunks_decoded,
		         (unsigned long long)c.deltas_decoded, (unsigned long long)c.cache_hits,
		         (unsigned long long)c.cache_misses, (unsigned long long)c.cache_bytes,
		         (unsigned long long)c.max_walk, (unsigned long long)c.cache_recycled);
		return xattr_reply(value, size, v);
	}
	int rc = ulp_archive_stat(fs.a, rel(path), &s);
	char target[ULP_NAME_MAX + 1];
	if (rc < 0) /* not archived yet, or `latest`: no attributes */
		return staged(rel(path)) || virtual_latest(rel(path), target, sizeof(target)) ? -ENODATA : err_of(rc);
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
	ulp_stat s;
	if (!rel(path)[0]) { /* the root: the decode counters (getxattr) */
		static const char root_attr[] = "user.ulpack.counters";
		if (size == 0)
			return (int)sizeof(root_attr);
		if (size < sizeof(root_attr))
			return -ERANGE;
		memcpy(list, root_attr, sizeof(root_attr));
		return (int)sizeof(root_attr);
	}
	int rc = ulp_archive_stat(fs.a, rel(path), &s);
	char target[ULP_NAME_MAX + 1];
	if (rc < 0) /* not archived yet, or `latest`: no attributes */
		return staged(rel(path)) || virtual_latest(rel(path), target, sizeof(target)) ? 0 : err_of(rc);
	if (s.is_dir || s.is_symlink)
		return 0;
	size_t need = 0;
	for (size_t i = 0; i < sizeof(xattrs) / sizeof(xattrs[0]); i++)
		need += strlen(xattrs[i]) + 1;
	if (size == 0)
		return (int)need;
	if (size < need)
		return -ERANGE;
	for (size_t i = 0, o = 0; i < sizeof(xattrs) / sizeof(xattrs[0]); i++) {
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
	char *cache_size, *max_chain, *threads, *readahead;
	int allow_other, default_permissions, no_permission_checks, nolatest;
	int fsname;            /* the user gave -o fsname= */
} o;

static const struct fuse_opt ulpfs_opts[] = {
	{"cache_size=%s", offsetof(struct opts, cache_size), 0},
	{"max_chain=%s", offsetof(struct opts, max_chain), 0},
	{"threads=%s", offsetof(struct opts, threads), 0},
	{"readahead=%s", offsetof(struct opts, readahead), 0},
	FUSE_OPT_KEY("ro", KEY_RO),
	FUSE_OPT_KEY("allow_other", KEY_ALLOW_OTHER),
	FUSE_OPT_KEY("default_permissions", KEY_DEFAULT_PERMISSIONS),
	{"no_permission_checks", offsetof(struct opts, no_permission_checks), 1},
	{"nolatest", offsetof(struct opts, nolatest), 1},
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
	        "  -o ro                read-only\n"
	        "  -o nolatest          no `latest` symlink in run directories (see ulpackfs(1))\n"
	        "  -o fsname=NAME       source shown by findmnt and df (default: the archive's path)\n"
	        "  -o allow_other       let other users in; implies default_permissions (the kernel\n"
	        "                       checks modes and owners) unless -o no_permission_checks\n"
	        "  -f                   stay in the foreground; -d for debug output\n"
	        "  and the usual FUSE options (allow_other, default_permissions, ...)\n\n"
	        "fstab: /data/ckpt-archive /mnt/ckpt fuse.ulpackfs defaults,cache_size=4G 0 0\n"
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
			fs.archive = realpath(arg, NULL);
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
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (end == v || *end || errno || n < min || n > max) {
		fprintf(stderr, "ulpackfs: bad %s '%s': a whole number from %ld to %ld\n", name, v, min, max);
		return -1;
	}
	*out = n;
	return 0;
}

/*
 * One read-write mount of an archive at a time (ulp_mount_lock). A second
 * mount while the first is mounted fails at once, naming its mount point and
 * pid. After `fusermount3 -u` the old daemon still archives what is queued
 * and holds the lock until it exits: a new mount then waits (up to a
 * minute), saying so, rather than recovering its staged files under it.
 * Returns the lock's descriptor, or -1 (printed).
 */
static int lock_archive(const char *dir)
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

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
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
	if (o.cache_size && ulp_parse_size(o.cache_size, &fs.cache_size) < 0) {
		fprintf(stderr, "ulpackfs: bad cache_size '%s' (examples: 512M, 4G)\n", o.cache_size);
		return 2;
	}
	long v;
	if (o.max_chain) {
		if (parse_count("max_chain", o.max_chain, 1, 1000000, &v) < 0)
			return 2;
		fs.max_chain = (unsigned)v;
	}
	if (o.threads) {
		if (parse_count("threads", o.threads, 0, 1024, &v) < 0) /* 0: one per CPU */
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
	char err[1024];
	ulp_archive_opts ao = {fs.cache_size, fs.max_chain, fs.threads, fs.read_only};
	if (ulp_archive_open(fs.archive, &ao, &fs.a, err, sizeof(err)) < 0) {
		fprintf(stderr, "ulpackfs: %s\n", err);
		return 1;
	}
	fs.lock_fd = -1;
	if (!fs.read_only) { /* an archive, now: take its lock, then recover */
		fs.lock_fd = lock_archive(fs.archive);
		if (fs.lock_fd < 0) {
			ulp_archive_close(fs.a);
			return 1;
		}
	}
	if (!fs.read_only) {
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
	if (fuse_daemonize(fs.foreground) != 0)
		goto out_unmount;
	if (ulp_archive_open(fs.archive, &ao, &fs.a, err, sizeof(err)) < 0) {
		syslog(LOG_ERR, "ulpackfs: %s", err);
		goto out_unmount;
	}
	if (fs.lock_fd >= 0 && ulp_mount_lock_note(fs.lock_fd, (long)getpid(), fs.mountpoint) < 0)
		syslog(LOG_WARNING, "ulpackfs: %s/mount.lock: cannot record pid and mount point", fs.archive);
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
	free(co.mountpoint);
	free(fs.mountpoint);
	fuse_opt_free_args(&args);
	free(fs.archive);
	return rc || fs.kept ? 1 : 0; /* kept: files left staged for the next mount (logged) */
}
