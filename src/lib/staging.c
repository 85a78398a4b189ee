/* SPDX-License-Identifier: MIT */
/*
 * staging.c - files being written through a mount live in ARCHIVE/staging
 * until they are archived: <n>.data holds the bytes, <n>.meta (once the file
 * was fsynced) its archive path and metadata.
 *
 * Invariants:
 *  1. A staged file is archived with ulp_archive_put(), which verifies and
 *     commits atomically; only then are its staging files removed.
 *  2. After ulp_stage_sync() returns, the data and the sidecar are durable:
 *     a crash before the commit leaves a file ulp_stage_recover() archives
 *     at the next mount. Staged files without a sidecar were never promised
 *     to anyone and are removed at recovery.
 */
#include "arch_int.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

struct ulp_stage {
	ulp_archive *a;
	int fd;
	char data[4200];
	char meta[4200];
};

static int io_err(ulp_archive *a, const char *path, const char *what)
{
	int e = errno;
	return ulp_arch_err(a, e == ENOSPC || e == EDQUOT ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s: %s",
	                    path, what, strerror(e));
}

int ulp_stage_new(ulp_archive *a, const char *copy_from, ulp_stage **out)
{
	static unsigned counter;
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is mounted read-only", a->dir);
	ulp_stage *s = calloc(1, sizeof(*s));
	if (!s)
		return -ULP_E_NOMEM;
	s->a = a;
	for (int tries = 0;; tries++) {
		unsigned n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
		snprintf(s->data, sizeof(s->data), "%s/staging/%ld-%u.data", a->dir, (long)getpid(), n);
		snprintf(s->meta, sizeof(s->meta), "%s/staging/%ld-%u.meta", a->dir, (long)getpid(), n);
		s->fd = open(s->data, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (s->fd >= 0 || errno != EEXIST || tries > 1000)
			break;
	}
	if (s->fd < 0) {
		int rc = io_err(a, s->data, "create");
		free(s);
		return rc;
	}
	if (copy_from) { /* copy-up of an archived file being modified */
		ulp_file *f = NULL;
		int rc = ulp_file_open(a, copy_from, &f);
		uint8_t *buf = rc == 0 ? malloc((size_t)8 << 20) : NULL;
		if (rc == 0 && !buf)
			rc = -ULP_E_NOMEM;
		for (uint64_t off = 0; rc == 0 && off < ulp_file_get_stat(f)->size;) {
			int64_t n = ulp_file_pread(f, buf, (size_t)8 << 20, off);
			if (n <= 0) {
				rc = n < 0 ? (int)n : -ULP_E_IO;
				break;
			}
			if (pwrite(s->fd, buf, (size_t)n, (off_t)off) != n)
				rc = io_err(a, s->data, "write");
			off += (uint64_t)n;
		}
		free(buf);
		if (f)
			ulp_file_close(f);
		if (rc < 0) {
			ulp_stage_discard(s);
			return rc;
		}
	}
	*out = s;
	return 0;
}

int ulp_stage_fd(const ulp_stage *s)
{
	return s->fd;
}

int64_t ulp_stage_write(ulp_stage *s, const void *buf, size_t len, uint64_t off)
{
	/* (starting writeback early with sync_file_range was measured: it made
	 * rsync into the mount about 10 % slower, so the fsync of
	 * ulp_stage_sync does all of it) */
	ssize_t w = pwrite(s->fd, buf, len, (off_t)off);
	return w < 0 ? io_err(s->a, s->data, "write") : w;
}

int ulp_stage_sync(ulp_stage *s, const char *path, const ulp_meta *m)
{
	ulp_archive *a = s->a;
	if (fsync(s->fd) < 0)
		return io_err(a, s->data, "fsync");
	char tmp[4300];
	snprintf(tmp, sizeof(tmp), "%s.tmp", s->meta);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return io_err(a, tmp, "create");
	fprintf(f, "%o %u %u %lld\n%s", m->mode & 07777, m->uid, m->gid, (long long)m->mtime_ns, path);
	int bad = fflush(f) != 0 || fsync(fileno(f)) != 0;
	if (fclose(f) != 0 || bad) {
		int rc = io_err(a, tmp, "write");
		unlink(tmp); /* else left in staging/ for good: recovery knows only .data and .meta */
		return rc;
	}
	if (rename(tmp, s->meta) < 0) {
		int rc = io_err(a, s->meta, "rename");
		unlink(tmp);
		return rc;
	}
	char dir[4300];
	snprintf(dir, sizeof(dir), "%s/staging", a->dir);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return 0;
}

int ulp_stage_commit(ulp_stage *s, const char *path, const ulp_meta *m, ulp_put_result *res)
{
	int rc = ulp_archive_put(s->a, path, s->fd, m, res);
	if (rc == 0)
		ulp_stage_discard(s);
	return rc;
}

void ulp_stage_discard(ulp_stage *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	unlink(s->data);
	unlink(s->meta);
	free(s);
}

void ulp_stage_close(ulp_stage *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	free(s);
}

int ulp_stage_recover(ulp_archive *a, unsigned *recovered, unsigned *removed)
{
	char dir[4300];
	snprintf(dir, sizeof(dir), "%s/staging", a->dir);
	*recovered = *removed = 0;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	struct dirent *de;
	int rc = 0;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		if (l < 6 || strcmp(de->d_name + l - 5, ".data") != 0)
			continue;
		char data[4600], meta[4600], path[4096];
		snprintf(data, sizeof(data), "%s/%s", dir, de->d_name);
		snprintf(meta, sizeof(meta), "%s/%.*s.meta", dir, (int)(l - 5), de->d_name);
		long pid = strtol(de->d_name, NULL, 10);
		if (pid == (long)getpid())
			continue;
		FILE *f = fopen(meta, "r");
		ulp_meta m = {0};
		unsigned mode;
		long long mt;
		int ok = f && fscanf(f, "%o %u %u %lld\n", &mode, &m.uid, &m.gid, &mt) == 4 &&
		         fgets(path, sizeof(path), f) != NULL;
		if (f)
			fclose(f);
		if (ok) {
			m.mode = mode;
			m.mtime_ns = mt;
			int fd = open(data, O_RDONLY | O_CLOEXEC);
			int r = fd >= 0 ? ulp_archive_put(a, path, fd, &m, NULL) : -ULP_E_IO;
			if (fd >= 0)
				close(fd);
			if (r < 0) {
				rc = r; /* keep the staged file: it may be archived later */
				continue;
			}
			(*recovered)++;
		} else {
			(*removed)++;
		}
		unlink(data);
		unlink(meta);
	}
	closedir(d);
	return rc;
}
