/* SPDX-License-Identifier: MIT */
/*
 * io.c - the one loop that writes, and the one that reads, a whole range of
 * a file descriptor: short transfers continued, EINTR retried.
 */
#include "ulp_int.h"
#include <errno.h>
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
			return r < 0 ? errno : EIO; /* (0: the file ends before the range) */
		p += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}
