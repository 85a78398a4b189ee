/* SPDX-License-Identifier: MIT */
/* cmd_sync.c - `ulpack sync MNT`: the archiving barrier of a ulpackfs mount. */
#include "cli.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

/*
 * Reading the mount root's user.ulpack.sync blocks in the daemon until every
 * file closed (or renamed to its final name) before the call is archived;
 * the value is "ok\n", or one "PATH: cause\n" line per file whose archiving
 * failed (ulpackfs(1)). A file still open for writing is not waited for.
 */
int cmd_sync(int argc, char **argv)
{
	if (argc != 2 || argv[1][0] == '-') {
		int help = argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"));
		fprintf(help ? stdout : stderr,
		        "usage: ulpack sync MOUNTPOINT\nWaits until every file closed in a ulpackfs mount before"
		        " the call is archived;\nnames each file whose archiving failed, with the cause (exit 1).\n");
		return help ? 0 : 2;
	}
	const char *mnt = argv[1];
	size_t cap = 1 << 16;
	for (;;) {
		char *buf = malloc(cap + 1);
		if (!buf)
			return cli_fail("%s: out of memory", mnt);
		ssize_t n = getxattr(mnt, "user.ulpack.sync", buf, cap);
		if (n < 0 && errno == ERANGE && cap < ((size_t)64 << 20)) {
			free(buf);
			cap *= 4;
			continue;
		}
		if (n < 0) {
			int e = errno;
			free(buf);
			return cli_fail("%s: %s", mnt,
			                e == ENODATA || e == ENOTSUP ? "not the root of a ulpackfs mount" : strerror(e));
		}
		buf[n] = 0;
		int ok = !strcmp(buf, "ok\n");
		if (ok)
			printf("sync: %s: everything closed before is archived\n", mnt);
		else
			fprintf(stderr, "ulpack: %s: archiving failed:\n%s", mnt, buf);
		free(buf);
		return ok ? 0 : 1;
	}
}
