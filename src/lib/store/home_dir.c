/* SPDX-License-Identifier: MIT */
/*
 * home_dir.c - the home of a shared archive on a plain directory (a shared
 * file system): the directory is the home itself (home.h). Everything other
 * hosts read is a file there that gen.c and lease.c write in place, so this
 * row keeps nothing apart: there is no object to get, nothing to upload,
 * swap, delete or drop, and no listing. A writer is fenced by its lease file
 * and each epoch's own pointer (lease.c, gen.c invariant 7). Also here: the
 * handle's common open and close, for every row.
 */
#include "home.h"
#include <stdlib.h>

static uint64_t dir_first_gen(uint64_t epoch)
{
	(void)epoch;
	return 0;
}

static int dir_get(ulp_home *h, const char *rel, char *buf, size_t cap, size_t *len, char tag[ULP_HOME_TAG_MAX])
{
	(void)h, (void)rel, (void)buf, (void)cap;
	*len = 0;
	if (tag)
		tag[0] = 0;
	return -ULP_E_NOENT; /* (no message: nothing apart from the directory) */
}

static int dir_get_range(ulp_home *h, const char *rel, const char *path, uint64_t size, uint64_t want)
{
	(void)h, (void)rel, (void)path, (void)size, (void)want;
	return 0; /* the file path names is the object itself */
}

static int dir_put(ulp_home *h, const char *rel, const char *path)
{
	(void)h, (void)rel, (void)path;
	return 0;
}

static int dir_put_if_match(ulp_home *h, const char *rel, const char *p, size_t len, char tag[ULP_HOME_TAG_MAX])
{
	(void)h, (void)rel, (void)p, (void)len, (void)tag;
	return 0;
}

static int dir_del(ulp_home *h, const char *rel)
{
	(void)h, (void)rel;
	return 0; /* the caller removed the file, which was the object */
}

static int dir_list(ulp_home *h, const char *prefix, int (*cb)(void *arg, const char *rel, uint64_t size), void *arg)
{
	(void)h, (void)prefix, (void)cb, (void)arg;
	return 0;
}

static void dir_drop(ulp_home *h, const char *path)
{
	(void)h, (void)path; /* the object itself: other hosts read it */
}

static int dir_usage(ulp_home *h)
{
	(void)h;
	return 0;
}

static void dir_close(ulp_home *h)
{
	free(h);
}

static const ulp_home_ops dir_ops = {
	.name = "dir",
	.swaps = 0,
	.background = 0,
	.relink = 64,
	.no_pointer = "a shared archive with no published generation yet (no index/CURRENT): the writer publishes "
	              "one when it opens the archive",
	.first_gen = dir_first_gen,
	.get = dir_get,
	.get_range = dir_get_range,
	.put = dir_put,
	.put_if_match = dir_put_if_match,
	.del = dir_del,
	.list = dir_list,
	.drop = dir_drop,
	.usage = dir_usage,
	.close = dir_close,
};

int ulp_home_dir_open(ulp_archive *a, ulp_home **out)
{
	ulp_home *h = calloc(1, sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	h->ops = &dir_ops;
	h->a = a;
	h->where = a->dir;
	pthread_mutex_init(&h->mu, NULL);
	*out = h;
	return 0;
}

void ulp_home_close(ulp_home *h)
{
	if (!h)
		return;
	pthread_mutex_destroy(&h->mu);
	h->ops->close(h);
}
