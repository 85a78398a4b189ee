/* SPDX-License-Identifier: MIT */
/* cmd_sync.c - `ulpack sync MNT`: the archiving barrier of a ulpackfs mount. */
#include "cli.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <unistd.h>

/*
 * Reading the mount root's user.ulpack.sync blocks in the daemon until every
 * file closed (or renamed to its final name) before the call is archived;
 * the value is "ok\n", or one "PATH: cause\n" line per file whose archiving
 * failed (ulpackfs(1)). A file still open for writing is not waited for.
 * On a terminal a thread waits in that read while the main one shows the
 * daemon's status (user.ulpack.status) in place; otherwise nothing but the
 * result is printed.
 */
typedef struct waiter {
	const char *mnt;
	char *buf;             /* the value, once read */
	ssize_t n;             /* its length, or -1 (err: errno) */
	int err;
	volatile int done;     /* (atomic) */
} waiter;

static void *wait_sync(void *arg)
{
	waiter *w = arg;
	size_t cap = 1 << 16;
	for (;;) {
		w->buf = malloc(cap + 1);
		if (!w->buf) {
			w->n = -1, w->err = ENOMEM;
			break;
		}
		w->n = getxattr(w->mnt, "user.ulpack.sync", w->buf, cap);
		w->err = errno;
		if (w->n < 0 && w->err == ERANGE && cap < ((size_t)64 << 20)) {
			free(w->buf);
			w->buf = NULL;
			cap *= 4;
			continue;
		}
		if (w->n >= 0)
			w->buf[w->n] = 0;
		break;
	}
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* On a terminal (stderr): what the barrier waits for, in place, twice a
 * second from 0.2 s on: files and bytes left, and the file archived for longest now. */
static void show_progress(waiter *w)
{
	int shown = 0;
	for (int k = 0; !__atomic_load_n(&w->done, __ATOMIC_ACQUIRE); k++) {
		usleep(50000);
		ulp_status st;
		if (k % 10 != 3 || cli_mount_status(w->mnt, &st) < 0) /* 0.2 s, then 2 a second */
			continue;
		char line[700];
		int n = snprintf(line, sizeof(line), "sync: waiting for %llu file%s, %.1f MB left",
		                 (unsigned long long)st.queued, st.queued == 1 ? "" : "s", (double)st.queued_bytes / 1e6);
		if (st.current[0] && n > 0 && (size_t)n < sizeof(line))
			snprintf(line + n, sizeof(line) - (size_t)n, "; slowest: %s (%.1f s)", st.current,
			         (double)st.current_ms / 1000);
		fprintf(stderr, "\r\033[K%s", line);
		fflush(stderr);
		shown = 1;
	}
	if (shown)
		fprintf(stderr, "\r\033[K");
}

int cmd_sync(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] == '-') {
		int help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
		fprintf(help ? stdout : stderr,
		        "usage: ulpack sync MOUNTPOINT\nWaits until every file closed in a ulpackfs mount before"
		        " the call is archived;\nnames each file whose archiving failed, with the cause (exit 1).\n"
		        "On a terminal it shows what it waits for: files and bytes left, the slowest file.\n");
		return help ? 0 : 2;
	}
	waiter w = {.mnt = argv[1]};
	pthread_t th;
	if (isatty(STDERR_FILENO) && pthread_create(&th, NULL, wait_sync, &w) == 0) {
		show_progress(&w);
		pthread_join(th, NULL);
	} else {
		wait_sync(&w);
	}
	const char *mnt = w.mnt;
	char *buf = w.buf;
	if (w.n < 0) {
		int e = w.err;
		free(buf);
		return cli_fail("%s: %s", mnt,
		                e == ENODATA || e == ENOTSUP ? "not the root of a ulpackfs mount" : strerror(e));
	}
	int ok = !strcmp(buf, "ok\n");
	if (ok)
		printf("sync: %s: everything closed before is archived\n", mnt);
	else
		fprintf(stderr, "ulpack: %s: archiving failed:\n%s", mnt, buf);
	free(buf);
	return ok ? 0 : 1;
}
