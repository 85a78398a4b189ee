/* SPDX-License-Identifier: MIT */
/*
 * backend_dir.c - the pack store's local directory backend (backend.h): an
 * object is the file root/<name>. A whole object is made durable as pack.c
 * invariant 1 asks: written under a temporary name, fsynced, renamed, and the
 * directory fsynced, in that order; readers map or pread the file.
 */
#include "backend.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void path_of(const ulp_backend *b, const char *name, char path[4400])
{
	snprintf(path, 4400, "%s/%s", b->root, name);
}

/* Nanoseconds spent in the fsyncs of puts, process-wide (ulp_pack_sync_ns). */
static uint64_t sync_ns;

uint64_t ulp_pack_sync_ns(void)
{
	return __atomic_load_n(&sync_ns, __ATOMIC_RELAXED);
}

static int timed_fsync(int fd)
{
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int rc = fsync(fd);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	__atomic_fetch_add(&sync_ns, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)),
	                   __ATOMIC_RELAXED);
	return rc;
}

static int fsync_dir(ulp_backend *b)
{
	int fd = open(b->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return ulp_arch_io_err(b->a, b->root, "open");
	int rc = timed_fsync(fd) < 0 ? ulp_arch_io_err(b->a, b->root, "fsync") : 0;
	close(fd);
	return rc;
}

static int dir_put_file(ulp_backend *b, int *fd, const char *tmp, const char *name, unsigned *done)
{
	char tpath[4400], fpath[4400];
	path_of(b, tmp, tpath);
	path_of(b, name, fpath);
	if (timed_fsync(*fd) < 0)
		return ulp_arch_io_err(b->a, tpath, "fsync");
	if (close(*fd) < 0) {
		*fd = -1;
		return ulp_arch_io_err(b->a, tpath, "close");
	}
	*fd = -1;
	if (access(fpath, F_OK) == 0)
		*done |= ULP_PUT_REPLACED;
	else
		*done &= ~(unsigned)ULP_PUT_REPLACED;
	if (rename(tpath, fpath) < 0)
		return ulp_arch_io_err(b->a, fpath, "rename");
	*done |= ULP_PUT_RENAMED;
	return fsync_dir(b);
}

static int dir_put(ulp_backend *b, const char *name, const void *p, size_t len)
{
	static unsigned counter;
	char tmp[160], tpath[4400], me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	snprintf(tmp, sizeof(tmp), "tmp-%s-put%u", me, __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	path_of(b, tmp, tpath);
	int fd = open(tpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* private: archive.c */
	if (fd < 0)
		return ulp_arch_io_err(b->a, tpath, "create");
	if ((errno = ulp_write_full(fd, p, len)) != 0) {
		int rc = ulp_arch_io_err(b->a, tpath, "write");
		close(fd);
		unlink(tpath);
		return rc;
	}
	unsigned done = 0;
	int rc = dir_put_file(b, &fd, tmp, name, &done);
	if (fd >= 0)
		close(fd);
	if (rc < 0 && !(done & ULP_PUT_RENAMED))
		unlink(tpath);
	return rc;
}

static int dir_publish(ulp_backend *b, const char *name, const void *p, size_t len)
{
	return dir_put(b, name, p, len); /* rename replaces it atomically */
}

static int dir_read_range(ulp_backend *b, const char *name, uint64_t off, void *p, size_t len)
{
	char path[4400];
	path_of(b, name, path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", path, strerror(errno));
	int e = ulp_pread_full(fd, p, len, off), rc = 0;
	if (e == ENODATA)
		rc = ulp_arch_err(b->a, -ULP_E_CORRUPT, "%s: [%llu, %llu) is past its end", path, (unsigned long long)off,
		                  (unsigned long long)(off + len));
	else if (e)
		rc = ulp_arch_err(b->a, -ULP_E_IO, "%s: read: %s", path, strerror(e));
	close(fd);
	return rc;
}

static int dir_map(ulp_backend *b, const char *name, uint64_t size, ulp_backend_map *m)
{
	(void)size; /* a pack of another size: its blobs' bounds and checksums tell */
	char path[4400];
	path_of(b, name, path);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) < 0) {
		int rc = ulp_arch_err(b->a, -ULP_E_IO, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	void *p = sb.st_size ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (sb.st_size && p == MAP_FAILED)
		return ulp_arch_err(b->a, -ULP_E_IO, "%s: mmap: %s", path, strerror(errno));
	m->base = p;
	m->size = (uint64_t)sb.st_size;
	m->dev = sb.st_dev;
	m->ino = sb.st_ino;
	return 0;
}

static int dir_list(ulp_backend *b, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
                    void *arg)
{
	DIR *d = opendir(b->root);
	if (!d)
		return ulp_arch_io_err(b->a, b->root, "open");
	size_t pl = strlen(prefix);
	struct dirent *de;
	int rc = 0;
	while (rc == 0 && (de = readdir(d))) {
		const char *n = de->d_name;
		if (!strcmp(n, ".") || !strcmp(n, "..") || strncmp(n, prefix, pl) != 0)
			continue;
		struct stat sb;
		uint64_t size = fstatat(dirfd(d), n, &sb, 0) == 0 ? (uint64_t)sb.st_size : 0;
		rc = cb(arg, n, size);
	}
	closedir(d);
	return rc;
}

static int dir_remove(ulp_backend *b, const char *name)
{
	char path[4400];
	path_of(b, name, path);
	if (unlink(path) == 0)
		return 0;
	return errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO;
}

static void dir_close(ulp_backend *b)
{
	free(b->root);
	free(b);
}

static const ulp_backend_ops dir_ops = {
	.name = "dir",
	.put = dir_put,
	.put_file = dir_put_file,
	.read_range = dir_read_range,
	.map = dir_map,
	.list = dir_list,
	.remove = dir_remove,
	.publish = dir_publish,
	.close = dir_close,
};

int ulp_backend_dir_open(ulp_archive *a, const char *root, ulp_backend **out)
{
	ulp_backend *b = calloc(1, sizeof(*b));
	if (!b || !(b->root = strdup(root))) {
		free(b);
		return -ULP_E_NOMEM;
	}
	b->ops = &dir_ops;
	b->a = a;
	*out = b;
	return 0;
}
