/* SPDX-License-Identifier: MIT */
/*
 * io.c - the one loop that writes, and the one that reads, a whole range of
 * a file descriptor: short transfers continued, EINTR retried; a
 * directory's fsync; a small file replaced whole (a temporary of this
 * process's, fsynced, renamed, its directory fsynced).
 */
#include "ulp_int.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int ulp_pwrite_full(int fd, const void *buf, size_t n, uint64_t off)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t w = pwrite(fd, p, n, (off_t)off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : EIO;
		p += w;
		n -= (size_t)w;
		off += (uint64_t)w;
	}
	return 0;
}

int ulp_pread_full(int fd, void *buf, size_t n, uint64_t off)
{
	uint8_t *p = buf;
	while (n) {
		ssize_t r = pread(fd, p, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? errno : ENODATA; /* the file ends before the range */
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

int ulp_write_full(int fd, const void *buf, size_t n)
{
	const uint8_t *p = buf;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? errno : EIO;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

int ulp_copy_fd(int in, int out, int *failed_out)
{
	char buf[1 << 16];
	uint64_t off = 0;
	*failed_out = 0;
	for (;;) {
		ssize_t n = pread(in, buf, sizeof(buf), (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno;
		if (n == 0)
			return 0;
		int e = ulp_pwrite_full(out, buf, (size_t)n, off);
		if (e) {
			*failed_out = 1;
			return e;
		}
		off += (uint64_t)n;
	}
}

int ulp_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return errno;
	int e = fsync(fd) < 0 ? errno : 0;
	close(fd);
	return e;
}

int ulp_fsync_parent(const char *path)
{
	char d[4200];
	const char *s = strrchr(path, '/');
	if (!s)
		return ulp_fsync_dir(".");
	if ((size_t)(s - path) >= sizeof(d))
		return ENAMETOOLONG;
	memcpy(d, path, (size_t)(s - path));
	d[s - path] = 0;
	return ulp_fsync_dir(s == path ? "/" : d);
}

int ulp_replace_file(const char *path, const void *data, size_t n, int durable)
{
	char tmp[4400], me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	snprintf(tmp, sizeof(tmp), "%s.tmp-%s", path, me);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return errno;
	int e = ulp_pwrite_full(fd, data, n, 0);
	if (!e && durable && fsync(fd) < 0)
		e = errno;
	close(fd);
	if (!e && rename(tmp, path) < 0)
		e = errno;
	if (e) {
		unlink(tmp);
		return e;
	}
	if (durable)
		ulp_fsync_parent(path); /* (the rename is done: a failure here only weakens it) */
	return 0;
}
