/* SPDX-License-Identifier: MIT */
/*
 * remote_none.c - remote.h in a build configured with --disable-s3 (no
 * libcurl): an s3:// archive is refused with a message saying why; no
 * handle is ever made, so the object calls below are never reached.
 */
#include "remote.h"
#include "home.h"
#include "backend.h"

int ulp_remote_is_url(const char *s)
{
	return s && strncmp(s, "s3://", 5) == 0;
}

static int none(ulp_err *err, const char *url)
{
	return ULP_ERR(err, -ULP_E_UNSUPPORTED, "%s: this build has no support for archives in S3 buckets "
	               "(configured with --disable-s3)", url ? url : "s3://");
}

int ulp_remote_open(const char *url, const ulp_archive_opts *o, int writer, ulp_remote **out, char **dir,
                    ulp_err *err)
{
	(void)o, (void)writer, (void)out, (void)dir;
	return none(err, url);
}

int ulp_remote_local_dir(const char *url, const char *cache_dir, int writer, char *out, size_t cap, ulp_err *err)
{
	(void)cache_dir, (void)writer, (void)out, (void)cap;
	return none(err, url);
}

void ulp_remote_close(ulp_remote *rm)
{
	(void)rm;
}

int ulp_remote_init_check(ulp_remote *rm, ulp_err *err)
{
	(void)rm;
	return none(err, NULL);
}

int ulp_remote_get_small(ulp_archive *a, const char *rel, char *buf, size_t cap, size_t *len,
                         char etag[ULP_S3_ETAG_MAX])
{
	(void)a, (void)rel, (void)buf, (void)cap, (void)len, (void)etag;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_fetch(ulp_archive *a, const char *rel, const char *path, uint64_t size, uint64_t want)
{
	(void)a, (void)rel, (void)path, (void)size, (void)want;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_put_fd(ulp_archive *a, const char *rel, int fd, uint64_t len, int cond)
{
	(void)a, (void)rel, (void)fd, (void)len, (void)cond;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_delete(ulp_archive *a, const char *rel)
{
	(void)a, (void)rel;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_list(ulp_archive *a, const char *rel_prefix, int (*cb)(void *arg, const char *rel, uint64_t size),
                    void *arg)
{
	(void)a, (void)rel_prefix, (void)cb, (void)arg;
	return -ULP_E_UNSUPPORTED;
}

int ulp_backend_s3_open(ulp_archive *a, const char *root, struct ulp_backend **out)
{
	(void)a, (void)root, (void)out;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_usage_list(ulp_archive *a, ulp_remote_usage *u, int (*cb)(void *arg, const char *name, uint64_t size),
                          void *arg)
{
	(void)a, (void)u, (void)cb, (void)arg;
	return -ULP_E_UNSUPPORTED;
}

int ulp_remote_usage_cached(ulp_remote *rm, int64_t max_age_ms, ulp_remote_usage *u)
{
	(void)rm, (void)max_age_ms;
	memset(u, 0, sizeof(*u));
	return 0;
}

int ulp_home_s3_open(ulp_archive *a, ulp_home **out)
{
	(void)a, (void)out;
	return -ULP_E_UNSUPPORTED;
}
