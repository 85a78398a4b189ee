/* SPDX-License-Identifier: MIT */
/*
 * remote.c - an archive's home in an S3 bucket prefix (remote.h): the URL,
 * the local home directory, and the moves of whole objects between the two
 * (generations, the pointer, packs) for gen.c and backend_s3.c.
 */
#include "shared.h"
#include "remote.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void key_of(const ulp_remote *rm, const char *rel, char *key, size_t cap)
{
	snprintf(key, cap, "%s%s", rm->prefix, rel);
}

int ulp_remote_is_url(const char *s)
{
	return s && strncmp(s, "s3://", 5) == 0;
}

/* s3://BUCKET[/PREFIX[/]]: bucket and prefix ("" or ending in '/'), malloc'ed.
 * The prefix is parts joined by single slashes, at most one slash after the
 * last: no empty part (a slash first, two in a row, "s3://B//"), none '.' or
 * '..', and no control characters. The URL is escaped in the messages. */
static int parse_url(const char *url, char **bucket, char **prefix, ulp_err *err)
{
	const char *b = url + 5, *slash = strchr(b, '/');
	size_t bl = slash ? (size_t)(slash - b) : strlen(b);
	const char *p = slash ? slash + 1 : "";
	size_t pl = strlen(p), ul = strlen(url);
	char q[300];
	if (pl && p[pl - 1] == '/')
		pl--; /* s3://BUCKET/PREFIX/ */
	if (bl < 3 || bl > 63)
		return ULP_ERR(err, -ULP_E_INVAL, "%s: not an archive URL (s3://BUCKET/PREFIX, a bucket of 3-63 characters)",
		               ulp_quote(q, sizeof(q), url, ul));
	for (size_t i = 0; i < ul; i++)
		if ((unsigned char)url[i] < 0x20 || url[i] == 0x7f)
			return ULP_ERR(err, -ULP_E_INVAL, "%s: an archive URL may not hold control characters (byte 0x%02x)",
			               ulp_quote(q, sizeof(q), url, ul), (unsigned char)url[i]);
	if (slash && pl == 0 && p[0] == '/')
		return ULP_ERR(err, -ULP_E_INVAL, "%s: the prefix may not hold empty, '.' or '..' parts", url);
	for (size_t i = 0; i < pl; i++)
		if ((p[i] == '/' && (i == 0 || p[i - 1] == '/' || i + 1 == pl)) ||
		    (p[i] == '.' && (i == 0 || p[i - 1] == '/') &&
		     (i + 1 == pl || p[i + 1] == '/' || (p[i + 1] == '.' && (i + 2 == pl || p[i + 2] == '/')))))
			return ULP_ERR(err, -ULP_E_INVAL, "%s: the prefix may not hold empty, '.' or '..' parts", url);
	*bucket = strndup(b, bl);
	*prefix = malloc(pl + 2);
	if (!*bucket || !*prefix) {
		free(*bucket);
		free(*prefix);
		return -ULP_E_NOMEM;
	}
	memcpy(*prefix, p, pl);
	if (pl)
		(*prefix)[pl++] = '/';
	(*prefix)[pl] = 0;
	return 0;
}

int ulp_remote_local_dir(const char *url, const char *cache_dir, int writer, char *out, size_t cap, ulp_err *err)
{
	char *bucket, *prefix;
	ULP_TRY(parse_url(url, &bucket, &prefix, err));
	char base[4096];
	const char *e;
	if (cache_dir && *cache_dir)
		snprintf(base, sizeof(base), "%s", cache_dir);
	else if ((e = getenv("ULPACK_CACHE_DIR")) && *e)
		snprintf(base, sizeof(base), "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e)
		snprintf(base, sizeof(base), "%s/ulpack", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(base, sizeof(base), "%s/.cache/ulpack", e);
	else
		snprintf(base, sizeof(base), "/var/tmp/ulpack-%ld", (long)getuid());
	size_t pl = strlen(prefix);
	if (pl)
		prefix[--pl] = 0; /* its slash off */
	int n = snprintf(out, cap, "%s/s3/%s/%s%s%s", base, bucket, pl ? prefix : "", pl ? "/" : "",
	                 writer ? "writer" : "reader");
	free(bucket);
	free(prefix);
	if (n < 0 || (size_t)n >= cap)
		return ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: its local home's path is too long", url);
	return 0;
}

/* mkdir -p of p (0700 for what it creates) */
static int mkdirs(const char *p, ulp_err *err)
{
	char q[4200];
	snprintf(q, sizeof(q), "%s", p);
	for (char *s = q + 1;; s++) {
		if (*s && *s != '/')
			continue;
		char c = *s;
		*s = 0;
		if (mkdir(q, 0700) < 0 && errno != EEXIST)
			return ULP_ERR(err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: cannot create it: %s", q,
			               strerror(errno));
		*s = c;
		if (!c)
			return 0;
	}
}

/* The local home belongs to one URL: its file "remote" says which. */
static int claim_home(const char *dir, const char *url, ulp_err *err)
{
	char p[4300], buf[4200];
	snprintf(p, sizeof(p), "%s/remote", dir);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = 0;
		char *nl = strchr(buf, '\n');
		if (nl)
			*nl = 0;
		if (strcmp(buf, url) != 0)
			return ULP_ERR(err, -ULP_E_EXIST, "%s: the local home of %s, not of %s: choose another cache_dir", dir,
			               buf, url);
		return 0;
	}
	snprintf(buf, sizeof(buf), "%s\n", url);
	fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int e = fd < 0 ? errno : ulp_pwrite_full(fd, buf, strlen(buf), 0);
	if (fd >= 0)
		close(fd);
	return e ? ULP_ERR(err, e == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", p, strerror(e)) : 0;
}

/* packs/ bytes now (the cache's starting count) */
static uint64_t dir_bytes(const char *dir)
{
	char p[4300];
	snprintf(p, sizeof(p), "%s/packs", dir);
	DIR *d = opendir(p);
	uint64_t n = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		struct stat sb;
		if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &sb, 0) == 0 && S_ISREG(sb.st_mode))
			n += (uint64_t)sb.st_blocks * 512;
	}
	if (d)
		closedir(d);
	return n;
}

int ulp_remote_open(const char *url, const ulp_archive_opts *o, int writer, ulp_remote **out, char **dir,
                    ulp_err *err)
{
	ulp_remote *rm = calloc(1, sizeof(*rm));
	char home[4096];
	if (!rm)
		return -ULP_E_NOMEM;
	pthread_mutex_init(&rm->mu, NULL);
	rm->writer = writer;
	rm->cache_limit = o && o->pack_cache ? o->pack_cache : ULP_PACK_CACHE_DEFAULT;
	int rc = parse_url(url, &rm->bucket, &rm->prefix, err);
	if (rc == 0 && !(rm->url = strdup(url)))
		rc = -ULP_E_NOMEM;
	ulp_s3_conf c = {0};
	if (rc == 0)
		rc = ulp_s3_conf_load(&c, NULL, err);
	const char *t = getenv("ULP_TEST_S3_RECV_SPEED"); /* tests: a slow link (bytes/s) */
	if (rc == 0 && t && *t)
		c.max_recv_speed = strtoull(t, NULL, 10);
	if (rc == 0)
		rc = ulp_s3_open(&c, rm->bucket, &rm->s3, err);
	ulp_s3_conf_free(&c);
	if (rc == 0)
		rc = ulp_remote_local_dir(url, o ? o->cache_dir : NULL, writer, home, sizeof(home), err);
	if (rc == 0)
		rc = mkdirs(home, err);
	if (rc == 0 && chmod(home, 0700) < 0)
		rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", home, strerror(errno));
	if (rc == 0)
		rc = claim_home(home, url, err);
	for (const char *sub = "packs"; rc == 0 && sub;
	     sub = !strcmp(sub, "packs") ? "index" : !strcmp(sub, "index") ? "staging" : NULL) {
		char p[4300];
		snprintf(p, sizeof(p), "%s/%s", home, sub);
		if (mkdir(p, 0700) < 0 && errno != EEXIST)
			rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", p, strerror(errno));
	}
	if (rc == 0 && !(*dir = strdup(home)))
		rc = -ULP_E_NOMEM;
	if (rc < 0) {
		ulp_remote_close(rm);
		return rc;
	}
	rm->cached = dir_bytes(home);
	*out = rm;
	return 0;
}

int ulp_remote_init_check(ulp_remote *rm, ulp_err *err)
{
	char key[1200];
	key_of(rm, "index/CURRENT", key, sizeof(key));
	ULP_TRY(ulp_s3_bucket_create(rm->s3, err));
	int rc = ulp_s3_head(rm->s3, key, NULL, NULL, err);
	return rc == 0 ? ULP_ERR(err, -ULP_E_EXIST, "%s: already an archive", rm->url) : rc == -ULP_E_NOENT ? 0 : rc;
}

void ulp_remote_close(ulp_remote *rm)
{
	if (!rm)
		return;
	ulp_s3_close(rm->s3);
	pthread_mutex_destroy(&rm->mu);
	free(rm->url);
	free(rm->bucket);
	free(rm->prefix);
	free(rm);
}

/* an S3 error as the archive's message */
static int fail(ulp_archive *a, int rc, const char *msg)
{
	return ulp_arch_err(a, rc, "%s", msg);
}

int ulp_remote_get_small(ulp_archive *a, const char *rel, char *buf, size_t cap, size_t *len,
                         char etag[ULP_S3_ETAG_MAX])
{
	char key[1200], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	key_of(a->rm, rel, key, sizeof(key));
	int rc = ulp_s3_get(a->rm->s3, key, buf, cap, len, etag, &e);
	return rc < 0 ? fail(a, rc, msg) : 0;
}

/* ---- fetching an object into a file, in parallel ranges ------------------ */

#define FETCH_PART ((uint64_t)8 << 20)
#define FETCH_THREADS 4

typedef struct fetch {
	ulp_archive *a;
	const char *key, *tmp;
	int fd;
	uint64_t size;
	pthread_mutex_t mu;
	uint64_t next;  /* guarded by mu: the next part's offset */
	int rc;         /* guarded by mu: the first error */
	char msg[1024]; /* guarded by mu: its message */
} fetch;

static void *fetch_main(void *arg)
{
	fetch *f = arg;
	uint8_t *buf = malloc(FETCH_PART);
	char msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	for (;;) {
		pthread_mutex_lock(&f->mu);
		uint64_t off = f->next;
		int stop = f->rc < 0 || off >= f->size;
		if (!stop && !buf) {
			f->rc = -ULP_E_NOMEM;
			snprintf(f->msg, sizeof(f->msg), "s3://%s/%s: fetch: out of memory", f->a->rm->bucket, f->key);
			stop = 1;
		}
		f->next += FETCH_PART;
		pthread_mutex_unlock(&f->mu);
		if (stop)
			break;
		size_t n = (size_t)ULP_MIN(FETCH_PART, f->size - off);
		int rc = ulp_s3_get_range(f->a->rm->s3, f->key, off, buf, n, &e);
		int we = rc == 0 ? ulp_pwrite_full(f->fd, buf, n, off) : 0;
		if (rc == 0 && we) {
			rc = we == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO;
			snprintf(msg, sizeof(msg), "%s: %s", f->tmp, strerror(we));
		}
		if (rc < 0) {
			pthread_mutex_lock(&f->mu);
			if (f->rc == 0) {
				f->rc = rc;
				snprintf(f->msg, sizeof(f->msg), "%s", msg);
			}
			pthread_mutex_unlock(&f->mu);
			break;
		}
	}
	free(buf);
	return NULL;
}

int ulp_remote_fetch(ulp_archive *a, const char *rel, const char *path, uint64_t size)
{
	static unsigned counter;
	ulp_remote *rm = a->rm;
	char key[1200], tmp[4400], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	key_of(rm, rel, key, sizeof(key));
	int rc = 0;
	if (!size && (rc = ulp_s3_head(rm->s3, key, &size, NULL, &e)) < 0)
		return fail(a, rc, msg);
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld-%u", path, (long)getpid(),
	         __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	fetch f = {.a = a, .key = key, .tmp = tmp, .size = size};
	f.fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (f.fd < 0)
		return ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	pthread_mutex_init(&f.mu, NULL);
	unsigned nt = (unsigned)ULP_MIN((size + FETCH_PART - 1) / FETCH_PART, FETCH_THREADS), started = 0;
	pthread_t th[FETCH_THREADS];
	for (unsigned i = 1; i < nt; i++)
		if (pthread_create(&th[started], NULL, fetch_main, &f) == 0)
			started++;
	fetch_main(&f); /* this thread too */
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&f.mu);
	rc = f.rc;
	if (rc < 0)
		ulp_arch_err(a, rc, "%s", f.msg);
	close(f.fd);
	if (rc == 0 && rename(tmp, path) < 0)
		rc = ulp_arch_err(a, -ULP_E_IO, "%s: %s", path, strerror(errno));
	if (rc < 0)
		unlink(tmp);
	return rc;
}

int ulp_remote_put_fd(ulp_archive *a, const char *rel, int fd, uint64_t len, int cond)
{
	char key[1200], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	key_of(a->rm, rel, key, sizeof(key));
	int rc;
	if (!cond) {
		rc = ulp_s3_put_file(a->rm->s3, key, fd, len, &e);
	} else {
		/* one request (a conditional PUT has no parts): from memory */
		uint8_t *p = len ? malloc((size_t)len) : NULL;
		if (len && !p)
			return ulp_arch_err(a, -ULP_E_NOMEM, "s3://%s/%s: out of memory", a->rm->bucket, key);
		int re = ulp_pread_full(fd, p, (size_t)len, 0);
		rc = re ? ULP_ERR(&e, -ULP_E_IO, "s3://%s/%s: reading what to upload: %s", a->rm->bucket, key, strerror(re))
		        : ulp_s3_put_cond(a->rm->s3, key, p, (size_t)len, NULL, NULL, &e);
		free(p);
	}
	return rc < 0 ? fail(a, rc, msg) : 0;
}

int ulp_remote_swap(ulp_archive *a, const char *rel, const char *p, size_t len, char etag[ULP_S3_ETAG_MAX])
{
	ulp_remote *rm = a->rm;
	char key[1200], msg[1024], prev[ULP_S3_ETAG_MAX], now[ULP_S3_ETAG_MAX];
	ulp_err e = {msg, sizeof(msg)};
	key_of(rm, rel, key, sizeof(key));
	pthread_mutex_lock(&rm->mu);
	snprintf(prev, sizeof(prev), "%s", etag);
	pthread_mutex_unlock(&rm->mu);
	int rc = ulp_s3_put_cond(rm->s3, key, p, len, prev[0] ? prev : NULL, now, &e);
	if (rc < 0)
		return fail(a, rc, msg);
	pthread_mutex_lock(&rm->mu);
	snprintf(etag, ULP_S3_ETAG_MAX, "%s", now);
	pthread_mutex_unlock(&rm->mu);
	return 0;
}

int ulp_remote_swap_current(ulp_archive *a, const char *line, size_t len)
{
	return ulp_remote_swap(a, "index/CURRENT", line, len, a->rm->etag);
}

int ulp_remote_delete(ulp_archive *a, const char *rel)
{
	char key[1200], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	key_of(a->rm, rel, key, sizeof(key));
	int rc = ulp_s3_delete(a->rm->s3, key, &e);
	return rc < 0 ? fail(a, rc, msg) : 0;
}

typedef struct listing {
	size_t skip; /* the prefix's length */
	int (*cb)(void *arg, const char *rel, uint64_t size);
	void *arg;
} listing;

static int list_one(void *arg, const char *key, uint64_t size)
{
	listing *l = arg;
	return l->cb(l->arg, key + l->skip, size);
}

int ulp_remote_list(ulp_archive *a, const char *rel_prefix, int (*cb)(void *arg, const char *rel, uint64_t size),
                    void *arg)
{
	char key[1200], msg[1024] = "";
	ulp_err e = {msg, sizeof(msg)};
	key_of(a->rm, rel_prefix, key, sizeof(key));
	listing l = {strlen(a->rm->prefix), cb, arg};
	int rc = ulp_s3_list(a->rm->s3, key, 0, list_one, &l, &e);
	if (rc == -ULP_E_NOENT)
		return 0; /* no bucket: nothing in it */
	return rc < 0 && msg[0] ? fail(a, rc, msg) : rc; /* (else cb's own, with its message) */
}
