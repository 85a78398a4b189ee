/* SPDX-License-Identifier: MIT */
/* cmd_status.c - `ulpack status MNT|ARCHIVE [--json] [--watch]`: what a
 * mounted daemon is doing (the mount root's user.ulpack.status, status.c's
 * JSON), or an archive at rest (read from its index). The figures and their
 * formats are the library's (ulp_status_*); this file only carries them. */
#include "cli.h"
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

int cli_mount_status(const char *mnt, ulp_status *st)
{
	char buf[8192];
	ssize_t n = getxattr(mnt, "user.ulpack.status", buf, sizeof(buf) - 1);
	if (n < 0)
		return -1;
	buf[n] = 0;
	if (ulp_status_parse(buf, st) < 0) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

static volatile sig_atomic_t stop;
static void on_int(int sig)
{
	(void)sig;
	stop = 1;
}

/* One take: from the mount (a live daemon: path, or where the archive path
 * is mounted read-write, *mnt) or the index; 0, or 1 with a message. */
static int take(const char *path, ulp_archive **a, int *mounted, const char *mnt, ulp_status *st)
{
	if (mnt[0])
		path = mnt;
	if (*mounted || (!*a && cli_mount_status(path, st) == 0)) {
		*mounted = 1;
		if (cli_mount_status(path, st) < 0)
			return cli_fail("%s: %s", path, errno == ENOTCONN ? "the daemon is gone" : strerror(errno));
		return 0;
	}
	if (!*a) {
		char err[1024];
		ulp_archive_opts o = {.read_only = 1};
		if (ulp_archive_open(path, &o, a, err, sizeof(err)) < 0)
			return cli_fail("%s", err);
	}
	if (ulp_status_get(*a, NULL, NULL, st) < 0)
		return cli_fail("%s: %s", path, ulp_archive_errmsg(*a));
	return 0;
}

int cmd_status(int argc, char **argv)
{
	const char *path = NULL;
	int json = 0, watch = 0;
	int64_t every = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = 1;
		else if (!strcmp(argv[i], "--watch"))
			watch = 1;
		else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
			int r = cli_opt_int("--interval", argv[++i], 1, 3600, &every);
			if (r)
				return r;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			printf("usage: ulpack status MOUNTPOINT|ARCHIVE [--json] [--watch [--interval S]]\n"
			       "What a mounted daemon is doing: its queue (files, bytes), archiving rate, the file\n"
			       "being archived, pending re-codes and reclaimable bytes, the lease holder and epoch,\n"
			       "the last publication and its age, the cache, errors since the mount. An archive\n"
			       "mounted read-write shows its daemon's; one not mounted is read from its index.\n"
			       "--watch refreshes every S seconds (default 1): in place on a terminal, one line\n"
			       "each time otherwise; Ctrl-C ends it.\n");
			return 0;
		} else if (argv[i][0] == '-' || path) {
			fprintf(stderr, "usage: ulpack status MOUNTPOINT|ARCHIVE [--json] [--watch [--interval S]]\n");
			return 2;
		} else {
			path = argv[i];
		}
	}
	if (!path) {
		fprintf(stderr, "usage: ulpack status MOUNTPOINT|ARCHIVE [--json] [--watch [--interval S]]\n");
		return 2;
	}
	int tty = isatty(STDOUT_FILENO);
	signal(SIGINT, on_int);
	signal(SIGTERM, on_int);
	ulp_archive *a = NULL;
	int mounted = 0, rc = 0;
	/* an archive directory mounted read-write: the daemon's figures */
	ulp_mount_owner ow;
	char mnt[ULP_PATH_MAX + 1] = "";
	if (!ulp_archive_is_url(path) && cli_mount_status(path, &(ulp_status){0}) < 0 &&
	    ulp_mount_owner_get(path, &ow) == 0 && ow.mounted)
		snprintf(mnt, sizeof(mnt), "%s", ow.mountpoint);
	char *buf = malloc(65536);
	if (!buf)
		return cli_fail("out of memory");
	for (unsigned round = 0; !stop; round++) {
		ulp_status st;
		if ((rc = take(path, &a, &mounted, mnt, &st)) != 0)
			break;
		if (watch && !tty && !json) { /* plain: one line a take */
			char t[32];
			time_t now = time(NULL);
			strftime(t, sizeof(t), "%H:%M:%S", localtime(&now));
			printf("%s queue %llu files %llu bytes; archived %llu files %llu steps; rate %llu B/s;"
			       " pending re-codes %llu; reclaimable %llu; errors %llu%s%s\n",
			       t, (unsigned long long)st.queued, (unsigned long long)st.queued_bytes,
			       (unsigned long long)st.archived, (unsigned long long)st.steps,
			       (unsigned long long)st.bytes_per_s, (unsigned long long)st.pending_recodes,
			       (unsigned long long)st.reclaimable_bytes, (unsigned long long)st.errors,
			       st.current[0] ? "; archiving " : "", st.current);
		} else {
			int n = json ? ulp_status_json(&st, buf, 65536) : ulp_status_text(&st, buf, 65536);
			if (n < 0) {
				rc = cli_fail("%s: status too large", path);
				break;
			}
			if (watch && tty)
				fputs("\033[H\033[J", stdout); /* in place */
			if (!json && mnt[0])
				printf("archive: %s, mounted at %s\n", path, mnt);
			else if (!json)
				printf("%s: %s\n", mounted ? "mount" : "archive", path);
			printf("%s%s", buf, json ? "\n" : "");
		}
		fflush(stdout);
		if (!watch)
			break;
		for (int64_t k = 0; k < every * 10 && !stop; k++)
			usleep(100000);
	}
	free(buf);
	ulp_archive_close(a);
	return rc;
}
