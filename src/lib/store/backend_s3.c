/* SPDX-License-Identifier: MIT */
/*
 * backend_s3.c - the pack store's backend for an archive in a bucket
 * (remote.h): the objects are PREFIX/packs/<name>; the local directory
 * packs/ (a backend_dir.c inside) is the pack cache: a pack is mapped from
 * there, fetched whole first where it is missing (in parallel ranges).
 *
 * Invariants:
 *  1. put_file uploads the pack from the writer's file before it renames it
 *     to its final name (remote.h invariant 1): a pack named in packs/ is
 *     in the bucket, and an upload never reads a file the cache may evict.
 *  2. The cache holds at most rm->cache_limit bytes after each fetch, less
 *     the packs mapped at the moment (eviction unlinks; a mapping stays
 *     valid, and pack.c's trim sees the file gone and maps it afresh next
 *     time, fetching it again). The least recently used go first: a map
 *     sets its file's mtime (atime is often off).
 *  3. A pack's name is the digest of its blobs, so a copy is never stale;
 *     but a copy may be damaged (on the way, or on the local disk), and
 *     its blobs' chunks carry checksums (EIO through them, never wrong
 *     bytes). A copy is kept only of the size the index says: one of
 *     another size is fetched anew where it is found, and an object of
 *     another size is refused unfetched (ulp_remote_fetch's want). A copy
 *     whose bytes fail a checksum is dropped and fetched again, once
 *     (refetch; pack.c's ulp_pack_refetch); failing again, it is dropped,
 *     and the read gives EIO naming the pack and the archive.
 */
#include "backend.h"
#include "remote.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct s3b {
	ulp_backend b;       /* first: the backend's face */
	ulp_backend *local;  /* set at open, read-only after: the cache directory */
} s3b;

static ulp_backend *local_of(ulp_backend *b)
{
	return ((s3b *)b)->local;
}

static int is_tmp(const char *name)
{
	return strncmp(name, "tmp-", 4) == 0;
}

static void rel_of(const char *name, char *rel, size_t cap)
{
	snprintf(rel, cap, "packs/%s", name);
}

typedef struct cfile {
	char name[128];
	uint64_t bytes;
	int64_t mtime;
} cfile;

static int cfile_cmp(const void *x, const void *y)
{
	const cfile *a = x, *b = y;
	return a->mtime < b->mtime ? -1 : a->mtime > b->mtime;
}

/* invariant 2: the least recently used packs go until the cache is under
 * 90 % of its bound */
static void evict(ulp_backend *b)
{
	ulp_remote *rm = b->a->rm;
	pthread_mutex_lock(&rm->mu);
	int over = rm->cached > rm->cache_limit;
	pthread_mutex_unlock(&rm->mu);
	if (!over)
		return;
	DIR *d = opendir(b->root);
	if (!d)
		return;
	cfile *f = NULL;
	size_t n = 0, cap = 0;
	uint64_t total = 0;
	for (struct dirent *e; (e = readdir(d));) {
		struct stat sb;
		size_t l = strlen(e->d_name);
		if (l < 6 || l >= sizeof(f->name) || strcmp(e->d_name + l - 5, ".pack") ||
		    fstatat(dirfd(d), e->d_name, &sb, 0) < 0 || ulp_grow(&f, &cap, n, sizeof(*f)) < 0)
			continue;
		snprintf(f[n].name, sizeof(f[n].name), "%s", e->d_name);
		f[n].bytes = (uint64_t)sb.st_blocks * 512;
		f[n].mtime = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
		total += f[n++].bytes;
	}
	closedir(d);
	if (n > 1)
		qsort(f, n, sizeof(*f), cfile_cmp);
	uint64_t goal = rm->cache_limit / 10 * 9;
	for (size_t i = 0; i < n && total > goal; i++) {
		char p[4400];
		snprintf(p, sizeof(p), "%s/%s", b->root, f[i].name);
		if (unlink(p) == 0)
			total -= f[i].bytes;
	}
	free(f);
	pthread_mutex_lock(&rm->mu);
	rm->cached = total;
	pthread_mutex_unlock(&rm->mu);
}

/* The cached copy of name, whose bytes are blocks: gone, and the count. */
static void drop(ulp_backend *b, const char *p, uint64_t blocks)
{
	if (unlink(p) < 0)
		return;
	ulp_remote *rm = b->a->rm;
	pthread_mutex_lock(&rm->mu);
	rm->cached -= ULP_MIN(rm->cached, blocks);
	pthread_mutex_unlock(&rm->mu);
}

/* The pack in the cache: fetched where missing, or where the copy there
 * is not of size (the index's; 0: not known) (invariant 3) (1: it was
 * fetched). */
static int ensure(ulp_backend *b, const char *name, uint64_t size)
{
	char p[4400], rel[200];
	snprintf(p, sizeof(p), "%s/%s", b->root, name);
	struct stat sb;
	int found = stat(p, &sb) == 0, had = errno;
	if (found && (!size || (uint64_t)sb.st_size == size || is_tmp(name))) {
		struct timespec now;
		clock_gettime(CLOCK_REALTIME, &now);
		if (now.tv_sec - sb.st_mtim.tv_sec > 10) /* invariant 2: recently used */
			utimensat(AT_FDCWD, p, NULL, 0);
		return 0;
	}
	if (is_tmp(name))
		return ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", p, strerror(had));
	if (found) /* truncated or grown in the cache: fetched anew */
		drop(b, p, (uint64_t)sb.st_blocks * 512);
	rel_of(name, rel, sizeof(rel));
	ULP_TRY(ulp_remote_fetch(b->a, rel, p, 0, size));
	if (stat(p, &sb) == 0) {
		ulp_remote *rm = b->a->rm;
		pthread_mutex_lock(&rm->mu);
		rm->cached += (uint64_t)sb.st_blocks * 512;
		pthread_mutex_unlock(&rm->mu);
	}
	return 1;
}

static int s3_map(ulp_backend *b, const char *name, uint64_t size, ulp_backend_map *m)
{
	int rc = 0;
	for (int tries = 0; tries < 3; tries++) {
		int fetched = ensure(b, name, size);
		if (fetched < 0)
			return fetched;
		/* mapped before the eviction, which may take this very pack when the
		 * cache is small: the mapping stays (invariant 2) */
		rc = local_of(b)->ops->map(local_of(b), name, size, m);
		if (fetched)
			evict(b);
		if (rc == 0 || !fetched)
			break;
	}
	return rc;
}

/* invariant 3: a copy whose bytes failed a checksum, dropped and fetched
 * again over its mapping */
static int s3_refetch(ulp_backend *b, const char *name, ulp_backend_map *m)
{
	char p[4400];
	snprintf(p, sizeof(p), "%s/%s", b->root, name);
	struct stat sb;
	if (lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && (!m || (sb.st_dev == m->dev && sb.st_ino == m->ino)))
		drop(b, p, (uint64_t)sb.st_blocks * 512); /* (not a copy another thread fetched since) */
	if (!m)
		return 0;
	ULP_TRY(ensure(b, name, m->size));
	int fd = open(p, O_RDONLY | O_NOFOLLOW | O_CLOEXEC), rc = 0;
	if (fd < 0 || fstat(fd, &sb) < 0)
		rc = ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	else if ((uint64_t)sb.st_size != m->size)
		rc = ulp_arch_err(b->a, -ULP_E_CORRUPT, "%s: %lld bytes where %llu were mapped", p, (long long)sb.st_size,
		                  (unsigned long long)m->size);
	else if (m->size && mmap((void *)m->base, (size_t)m->size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
		rc = ulp_arch_err(b->a, -ULP_E_IO, "%s: mmap: %s", p, strerror(errno));
	if (rc == 0) {
		m->dev = sb.st_dev;
		m->ino = sb.st_ino;
	}
	if (fd >= 0)
		close(fd);
	evict(b);
	return rc;
}

static int s3_read_range(ulp_backend *b, const char *name, uint64_t off, void *p, size_t len)
{
	int rc = ensure(b, name, 0);
	return rc < 0 ? rc : local_of(b)->ops->read_range(local_of(b), name, off, p, len);
}

static int s3_put_file(ulp_backend *b, int *fd, const char *tmp, const char *name, unsigned *done)
{
	struct stat sb;
	char rel[200], path[4400];
	snprintf(path, sizeof(path), "%s/%s", b->root, tmp);
	int rfd = open(path, O_RDONLY | O_CLOEXEC); /* the writer's is write-only */
	if (rfd < 0 || fstat(rfd, &sb) < 0) {
		int rc = ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", path, strerror(errno));
		if (rfd >= 0)
			close(rfd);
		return rc;
	}
	rel_of(name, rel, sizeof(rel));
	int rc = ulp_remote_put_fd(b->a, rel, rfd, (uint64_t)sb.st_size, 0); /* invariant 1 */
	close(rfd);
	ULP_TRY(rc);
	ULP_TRY(local_of(b)->ops->put_file(local_of(b), fd, tmp, name, done));
	ulp_remote *rm = b->a->rm;
	pthread_mutex_lock(&rm->mu);
	rm->cached += (uint64_t)sb.st_blocks * 512;
	pthread_mutex_unlock(&rm->mu);
	evict(b);
	return 0;
}

static int s3_put(ulp_backend *b, const char *name, const void *p, size_t len)
{
	/* the local put makes the file; it is uploaded from there */
	ULP_TRY(local_of(b)->ops->put(local_of(b), name, p, len));
	char path[4400], rel[200];
	snprintf(path, sizeof(path), "%s/%s", b->root, name);
	rel_of(name, rel, sizeof(rel));
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", path, strerror(errno));
	int rc = ulp_remote_put_fd(b->a, rel, fd, len, 0);
	close(fd);
	return rc;
}

typedef struct s3list {
	int (*cb)(void *arg, const char *name, uint64_t size);
	void *arg;
	const char *prefix;
} s3list;

static int list_one(void *arg, const char *rel, uint64_t size)
{
	s3list *l = arg;
	const char *name = rel + 6; /* "packs/" */
	return strchr(name, '/') ? 0 : l->cb(l->arg, name, size);
}

/* the packs in the bucket, and this host's temporaries */
static int s3_list(ulp_backend *b, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
                   void *arg)
{
	char rel[300];
	s3list l = {cb, arg, prefix};
	snprintf(rel, sizeof(rel), "packs/%s", prefix);
	int rc = is_tmp(prefix) ? 0 : ulp_remote_list(b->a, rel, list_one, &l);
	if (rc == 0 && (!*prefix || is_tmp(prefix)))
		rc = local_of(b)->ops->list(local_of(b), *prefix ? prefix : "tmp-", cb, arg);
	return rc;
}

static int s3_remove(ulp_backend *b, const char *name)
{
	int lrc = local_of(b)->ops->remove(local_of(b), name);
	if (is_tmp(name))
		return lrc;
	char rel[200], msg[1024];
	rel_of(name, rel, sizeof(rel));
	/* no message: remove's callers ignore it (backend.h) */
	char key[1300];
	ulp_err e = {msg, sizeof(msg)};
	snprintf(key, sizeof(key), "%s%s", b->a->rm->prefix, rel);
	return ulp_s3_delete(b->a->rm->s3, key, &e) < 0 ? -ULP_E_IO : 0;
}

static int s3_publish(ulp_backend *b, const char *name, const void *p, size_t len)
{
	return local_of(b)->ops->publish(local_of(b), name, p, len);
}

static void s3_close(ulp_backend *b)
{
	ulp_backend *l = local_of(b);
	l->ops->close(l);
	free(b->root);
	free(b);
}

static const ulp_backend_ops s3_ops = {
	.name = "s3",
	.put = s3_put,
	.put_file = s3_put_file,
	.read_range = s3_read_range,
	.map = s3_map,
	.refetch = s3_refetch,
	.list = s3_list,
	.remove = s3_remove,
	.publish = s3_publish,
	.close = s3_close,
};

int ulp_backend_s3_open(ulp_archive *a, const char *root, ulp_backend **out)
{
	s3b *s = calloc(1, sizeof(*s));
	if (!s)
		return -ULP_E_NOMEM;
	int rc = ulp_backend_dir_open(a, root, &s->local);
	if (rc == 0 && !(s->b.root = strdup(root)))
		rc = -ULP_E_NOMEM;
	if (rc < 0) {
		if (s->local)
			s->local->ops->close(s->local);
		free(s);
		return rc;
	}
	s->b.ops = &s3_ops;
	s->b.a = a;
	*out = &s->b;
	return 0;
}
