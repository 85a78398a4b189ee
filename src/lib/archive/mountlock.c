/* SPDX-License-Identifier: MIT */
/*
 * mountlock.c - one read-write mount of an archive at a time, and who holds
 * it. The holder has an exclusive flock on ARCHIVE/mount.lock (inherited
 * across a daemon's fork, gone with the process) and writes its pid and
 * mount point into the file, so that a second mount can say at once where
 * the archive is mounted, or that the previous daemon is only finishing its
 * queue after an unmount (and wait for it).
 *
 * Invariants:
 *  1. The lock file's content is "PID MOUNTPOINT\n", written by the holder
 *     after it has the lock; a reader that finds it empty or half written
 *     reports pid 0 and no mount point (the holder is starting).
 *  2. ulp_mount_lock never waits: the policy (fail or wait) is the caller's.
 */
#include "arch_int.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

/* Unescapes the \ooo of /proc/self/mountinfo in place. */
static void unoctal(char *s)
{
	char *w = s;
	for (const char *r = s; *r; w++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
			*w = (char)((r[1] - '0') << 6 | (r[2] - '0') << 3 | (r[3] - '0'));
			r += 4;
		} else {
			*w = *r++;
		}
	}
	*w = 0;
}

int ulp_mount_active(const char *mountpoint)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return 0;
	char line[8192 + 512];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		/* id parent major:minor root mountpoint options ... - fstype source ... */
		char at[8192], type[256], *sep = strstr(line, " - ");
		if (!sep || sscanf(line, "%*s %*s %*s %*s %8191s", at) != 1 || sscanf(sep + 3, "%255s", type) != 1)
			continue;
		unoctal(at);
		found = !strcmp(at, mountpoint) && !strncmp(type, "fuse.ulpackfs", 13);
	}
	fclose(f);
	return found;
}

static void read_holder(int fd, ulp_mount_owner *h)
{
	char buf[ULP_PATH_MAX + 64];
	memset(h, 0, sizeof(*h));
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return;
	buf[n] = 0;
	char *nl = strchr(buf, '\n'), *sp = strchr(buf, ' ');
	if (!nl || !sp || sp > nl) /* invariant 1: not written in full yet */
		return;
	*nl = 0;
	*sp = 0;
	int64_t pid;
	if (ulp_parse_int(buf, 1, INT32_MAX, &pid) < 0)
		return;
	h->pid = (long)pid;
	snprintf(h->mountpoint, sizeof(h->mountpoint), "%s", sp + 1);
	h->alive = kill((pid_t)pid, 0) == 0 || errno == EPERM;
	h->mounted = h->alive && h->mountpoint[0] && ulp_mount_active(h->mountpoint);
}

int ulp_mount_lock(const char *dir, int *fd_out, ulp_mount_owner *holder, char *errbuf, size_t errcap)
{
	ulp_err err = {errbuf, errcap};
	char p[ULP_PATH_MAX + 32];
	snprintf(p, sizeof(p), "%s/mount.lock", dir);
	int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600); /* private, as every archive file */
	if (fd < 0)
		return ULP_ERR(&err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", p, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int e = errno;
		if (e == EWOULDBLOCK && holder)
			read_holder(fd, holder);
		close(fd);
		if (e == EWOULDBLOCK)
			return ULP_ERR(&err, -ULP_E_BUSY, "%s: mounted read-write by another ulpackfs", dir);
		return ULP_ERR(&err, -ULP_E_IO, "%s: %s", p, strerror(e));
	}
	if (ftruncate(fd, 0) < 0) { /* a former holder's note is no longer true */
		close(fd);
		return ULP_ERR(&err, -ULP_E_IO, "%s: %s", p, strerror(errno));
	}
	*fd_out = fd;
	return 0;
}

int ulp_mount_lock_note(int fd, long pid, const char *mountpoint)
{
	char buf[ULP_PATH_MAX + 64];
	int n = snprintf(buf, sizeof(buf), "%ld %s\n", pid, mountpoint);
	if (n < 0 || (size_t)n >= sizeof(buf) || strchr(mountpoint, '\n'))
		return -ULP_E_INVAL;
	if (ftruncate(fd, 0) < 0 || pwrite(fd, buf, (size_t)n, 0) != n)
		return errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO;
	return 0;
}

int ulp_mount_owner_get(const char *dir, ulp_mount_owner *holder)
{
	char p[ULP_PATH_MAX + 32];
	snprintf(p, sizeof(p), "%s/mount.lock", dir);
	int fd = open(p, O_RDONLY | O_CLOEXEC); /* (no lock taken: a mount may start meanwhile) */
	if (fd < 0)
		return errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO;
	read_holder(fd, holder);
	close(fd);
	return 0;
}
