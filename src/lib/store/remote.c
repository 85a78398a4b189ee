/* SPDX-License-Identifier: MIT */
/*
 * remote.c - an archive's home in an S3 bucket prefix (remote.h): the URL,
 * the local home directory, and the moves of whole objects between the two
 * (generations, the pointer, packs) for gen.c and backend_s3.c.
 */
#include "shared.h"
#include "remote.h"
#include "home.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
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

/* ---- the local home (invariants 5 to 7 of remote.h) ---------------------- */

#define WALK_DEPTH 64 /* directories deep */
#define WALK_LINKS 40 /* symbolic links followed, as the kernel's bound */

/* Whether directory st, a step of the way to a local home, is one only
 * root and this user control: owned by one of them, and writable by no
 * one else but with the sticky bit (then the others cannot rename or remove
 * what is not theirs in it). Else why says the cause. */
static int dir_trusted(const struct stat *st, char *why, size_t cap)
{
	uid_t me = geteuid();
	if (st->st_uid != 0 && st->st_uid != me)
		snprintf(why, cap, "owned by uid %ld, not by uid %ld%s", (long)st->st_uid, (long)me, me ? " or root" : "");
	else if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX))
		snprintf(why, cap, "writable by its group or by others (mode %04o) without the sticky bit",
		         (unsigned)(st->st_mode & 07777));
	else
		return 1;
	return 0;
}

/* The directory at path, walked from "/" one name at a time (never by
 * the kernel's own resolution), each directory trusted (dir_trusted), a
 * symbolic link followed only where its directory is writable by no one
 * else or where root or this user owns it, and the missing directories
 * made 0700: an O_PATH descriptor of it, its path without links in
 * canon, or a negative code with the message naming the directory and the
 * cause. */
static int open_trusted(const char *path, char *canon, size_t ccap, ulp_err *err)
{
	char todo[8192], at[4096] = "", why[160], cwd[4096];
	int fds[WALK_DEPTH], n = 0, links = 0, rc = 0;
	struct stat st[WALK_DEPTH];
	if (path[0] != '/' && !getcwd(cwd, sizeof(cwd)))
		return ULP_ERR(err, -ULP_E_IO, "%s: the working directory: %s", path, strerror(errno));
	int l = path[0] == '/' ? snprintf(todo, sizeof(todo), "%s", path) : snprintf(todo, sizeof(todo), "%s/%s", cwd, path);
	if (l < 0 || (size_t)l >= sizeof(todo))
		return ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: too long a path", path);
	fds[0] = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fds[0] < 0 || fstat(fds[0], &st[0]) < 0)
		rc = ULP_ERR(err, -ULP_E_IO, "/: %s", strerror(errno));
	else if (!dir_trusted(&st[0], why, sizeof(why)))
		rc = ULP_ERR(err, -ULP_E_INVAL, "/: %s: refused as the way to a local home", why);
	n = fds[0] >= 0;
	char *s = todo;
	while (rc == 0 && *s) {
		while (*s == '/')
			s++;
		char *e = s;
		while (*e && *e != '/')
			e++;
		size_t cl = (size_t)(e - s);
		char comp[256];
		if (cl >= sizeof(comp)) {
			rc = ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: a name of over 255 bytes", path);
			break;
		}
		memcpy(comp, s, cl);
		comp[cl] = 0;
		s = e;
		if (!cl || !strcmp(comp, "."))
			continue;
		if (!strcmp(comp, "..")) {
			if (n > 1) {
				close(fds[--n]);
				char *slash = strrchr(at, '/');
				*slash = 0;
			}
			continue;
		}
		size_t al = strlen(at);
		if (n == WALK_DEPTH || al + cl + 2 > sizeof(at)) {
			rc = ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: too deep a path", path);
			break;
		}
		snprintf(at + al, sizeof(at) - al, "/%s", comp);
		int fd = openat(fds[n - 1], comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 && errno == ENOENT && (mkdirat(fds[n - 1], comp, 0700) == 0 || errno == EEXIST))
			fd = openat(fds[n - 1], comp, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		struct stat sb;
		if (fd < 0 || fstat(fd, &sb) < 0) {
			rc = ULP_ERR(err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: cannot create or open it: %s", at,
			             strerror(errno));
			if (fd >= 0)
				close(fd);
			break;
		}
		if (S_ISLNK(sb.st_mode)) {
			/* its directory is trusted: writable by others only with the
			 * sticky bit, and then the link's owner may replace it */
			if ((st[n - 1].st_mode & (S_IWGRP | S_IWOTH)) && sb.st_uid != 0 && sb.st_uid != geteuid()) {
				rc = ULP_ERR(err, -ULP_E_INVAL, "%s: a symbolic link of uid %ld in a directory others may "
				             "write to: refused as the way to a local home", at, (long)sb.st_uid);
				close(fd);
				break;
			}
			char target[4096], rest[8192];
			ssize_t tl = readlinkat(fd, "", target, sizeof(target) - 1);
			close(fd);
			if (tl <= 0 || ++links > WALK_LINKS) {
				rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", at, tl <= 0 ? strerror(errno) : "too many symbolic links");
				break;
			}
			target[tl] = 0;
			at[al] = 0;
			if (target[0] == '/') { /* from the top again */
				while (n > 1)
					close(fds[--n]);
				at[0] = 0;
			}
			l = snprintf(rest, sizeof(rest), "%s/%s", target, s);
			if (l < 0 || (size_t)l >= sizeof(todo)) {
				rc = ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: too long a path", path);
				break;
			}
			memcpy(todo, rest, (size_t)l + 1);
			s = todo;
			continue;
		}
		if (!S_ISDIR(sb.st_mode))
			rc = ULP_ERR(err, -ULP_E_NOTDIR, "%s: not a directory", at);
		else if (!dir_trusted(&sb, why, sizeof(why)))
			rc = ULP_ERR(err, -ULP_E_INVAL, "%s: %s: refused as the way to a local home (as ssh refuses a "
			             "loose key file)", at, why);
		if (rc < 0) {
			close(fd);
			break;
		}
		st[n] = sb;
		fds[n++] = fd;
	}
	int out = rc;
	if (rc == 0) {
		out = fds[--n];
		snprintf(canon, ccap, "%s", at[0] ? at : "/");
	}
	while (n > 0)
		close(fds[--n]);
	return out;
}

/* Directory name of the trusted directory at (where: its path, for the
 * messages) made 0700 where missing, and checked where found: not a
 * symbolic link, this user's, writable by no one else. An O_RDONLY
 * descriptor of it, or a negative code with the message. */
static int own_dir(int at, const char *name, const char *where, ulp_err *err)
{
	if (mkdirat(at, name, 0700) < 0 && errno != EEXIST)
		return ULP_ERR(err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: cannot create it: %s", where,
		               strerror(errno));
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (e == ELOOP || e == ENOTDIR)
			return ULP_ERR(err, -ULP_E_INVAL, "%s: %s: refused in a local home (remove it)", where,
			               e == ELOOP ? "a symbolic link" : "not a directory");
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", where, strerror(e));
	}
	const char *why = sb.st_uid != geteuid() ? "owned by another user"
	                  : sb.st_mode & (S_IWGRP | S_IWOTH) ? "writable by its group or by others"
	                                                     : NULL;
	if (why) {
		close(fd);
		return ULP_ERR(err, -ULP_E_INVAL, "%s: %s (uid %ld, mode %04o; this is uid %ld): refused as a local "
		               "home's directory (as ssh refuses a loose key file)", where, why, (long)sb.st_uid,
		               (unsigned)(sb.st_mode & 07777), (long)geteuid());
	}
	return fd;
}

/* The directory the local homes are under: cache_dir, else
 * $ULPACK_CACHE_DIR, $XDG_CACHE_HOME/ulpack, ~/.cache/ulpack,
 * /var/tmp/ulpack-UID. */
static void base_of(const char *cache_dir, char *base, size_t cap)
{
	const char *e;
	if (cache_dir && *cache_dir)
		snprintf(base, cap, "%s", cache_dir);
	else if ((e = getenv("ULPACK_CACHE_DIR")) && *e)
		snprintf(base, cap, "%s", e);
	else if ((e = getenv("XDG_CACHE_HOME")) && *e)
		snprintf(base, cap, "%s/ulpack", e);
	else if ((e = getenv("HOME")) && *e)
		snprintf(base, cap, "%s/.cache/ulpack", e);
	else
		snprintf(base, cap, "/var/tmp/ulpack-%ld", (long)getuid());
}

/* The archive's directory under BASE/s3 (invariant 6): BUCKET-HASH, HASH
 * the first 16 hex digits of the SHA-256 of "ENDPOINT\nBUCKET\nPREFIX"
 * (the endpoint without a trailing '/', the prefix without its last '/'). */
static void key_name(const char *endpoint, const char *bucket, const char *prefix, char *out, size_t cap)
{
	char id[4096], hex[65];
	uint8_t sha[ULP_SHA256_LEN];
	size_t el = strlen(endpoint), pl = strlen(prefix);
	while (el && endpoint[el - 1] == '/')
		el--;
	if (pl)
		pl--;
	int n = snprintf(id, sizeof(id), "%.*s\n%s\n%.*s", (int)el, endpoint, bucket, (int)pl, prefix);
	ulp_sha256(id, n > 0 && (size_t)n < sizeof(id) ? (size_t)n : sizeof(id) - 1, sha);
	ulp_sha256_hex(sha, hex);
	snprintf(out, cap, "%s-%.16s", bucket, hex);
}

int ulp_remote_local_dir(const char *url, const char *cache_dir, int writer, char *out, size_t cap, ulp_err *err)
{
	char *bucket, *prefix, base[4096], name[128];
	ULP_TRY(parse_url(url, &bucket, &prefix, err));
	ulp_s3_conf c = {0};
	int rc = ulp_s3_conf_load(&c, NULL, err);
	if (rc == 0) {
		key_name(c.endpoint, bucket, prefix, name, sizeof(name));
		base_of(cache_dir, base, sizeof(base));
		int n = snprintf(out, cap, "%s/s3/%s/%s", base, name, writer ? "writer" : "reader");
		if (n < 0 || (size_t)n >= cap)
			rc = ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: its local home's path is too long", url);
	}
	ulp_s3_conf_free(&c);
	free(bucket);
	free(prefix);
	return rc;
}

/* The endpoint as the identity names it: without a trailing '/'. */
static void endpoint_of(const char *e, char *out, size_t cap)
{
	size_t l = strlen(e);
	while (l && e[l - 1] == '/')
		l--;
	snprintf(out, cap, "%.*s", (int)l, e);
}

/* Invariant 6: the local home belongs to one archive, its file "remote"
 * says which: the URL, then "endpoint ENDPOINT" (a home of an older
 * version names the URL alone: the endpoint is added). */
static int claim_home(int hfd, const char *dir, const char *url, const char *endpoint, ulp_err *err)
{
	char buf[8400], ep[4096];
	endpoint_of(endpoint, ep, sizeof(ep));
	int fd = openat(hfd, "remote", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && errno != ENOENT)
		return ULP_ERR(err, errno == ELOOP ? -ULP_E_INVAL : -ULP_E_IO, "%s/remote: %s", dir,
		               errno == ELOOP ? "a symbolic link: refused in a local home (remove it)" : strerror(errno));
	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = 0;
		char *nl = strchr(buf, '\n'), *had = NULL;
		if (nl) {
			*nl = 0;
			if (!strncmp(nl + 1, "endpoint ", 9)) {
				had = nl + 10;
				had[strcspn(had, "\n")] = 0;
			}
		}
		if (strcmp(buf, url) != 0 || (had && strcmp(had, ep) != 0))
			return ULP_ERR(err, -ULP_E_EXIST, "%s: the local home of %s at %s, not of %s at %s: choose another "
			               "cache_dir", dir, buf, had ? had : "(an endpoint not recorded)", url, ep);
		if (had)
			return 0;
	}
	int n = snprintf(buf, sizeof(buf), "%s\nendpoint %s\n", url, ep);
	fd = openat(hfd, "remote.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	int e = fd < 0 ? errno : ulp_pwrite_full(fd, buf, (size_t)n, 0);
	if (fd >= 0)
		close(fd);
	if (!e && renameat(hfd, "remote.tmp", hfd, "remote") < 0)
		e = errno;
	return e ? ULP_ERR(err, e == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s/remote: %s", dir, strerror(e)) : 0;
}

/* Invariant 5: no symbolic link among the home's own entries. */
static int no_links(int hfd, const char *dir, ulp_err *err)
{
	int fd = dup(hfd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", dir, strerror(errno));
	}
	int rc = 0;
	for (struct dirent *e; rc == 0 && (e = readdir(d));) {
		struct stat sb;
		if (fstatat(hfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(sb.st_mode))
			rc = ULP_ERR(err, -ULP_E_INVAL, "%s/%s: a symbolic link: refused in a local home (remove it)", dir,
			             e->d_name);
	}
	closedir(d);
	return rc;
}

/* packs/ bytes now (the cache's starting count; links are no packs) */
static uint64_t dir_bytes(int hfd)
{
	int fd = openat(hfd, "packs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d && fd >= 0)
		close(fd);
	uint64_t n = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		struct stat sb;
		if (e->d_name[0] != '.' && fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(sb.st_mode))
			n += (uint64_t)sb.st_blocks * 512;
	}
	if (d)
		closedir(d);
	return n;
}

/* The home's directories (invariant 5; lease/ a writer's only) */
static const char *const subdirs[] = {"packs", "index", "staging", "lease"};

/* The local home, walked to and checked (invariants 5 and 6): its
 * descriptor in rm->home_fd, its path in home. */
static int make_home(ulp_remote *rm, const char *cache_dir, const char *endpoint, char *home, size_t cap,
                     ulp_err *err)
{
	char base[4096], canon[4096], name[128];
	base_of(cache_dir, base, sizeof(base));
	key_name(endpoint, rm->bucket, rm->prefix, name, sizeof(name));
	int fd = open_trusted(base, canon, sizeof(canon), err);
	if (fd < 0)
		return fd;
	const char *steps[3] = {"s3", name, rm->writer ? "writer" : "reader"};
	size_t hl = (size_t)snprintf(home, cap, "%s", strcmp(canon, "/") ? canon : "");
	for (int i = 0; i < 3; i++) {
		hl += (size_t)snprintf(home + hl, hl < cap ? cap - hl : 0, "/%s", steps[i]);
		if (hl >= cap) {
			close(fd);
			return ULP_ERR(err, -ULP_E_NAMETOOLONG, "%s: its local home's path is too long", rm->url);
		}
		int next = own_dir(fd, steps[i], home, err);
		close(fd);
		if (next < 0)
			return next;
		fd = next;
	}
	rm->home_fd = fd;
	if (fchmod(fd, 0700) < 0)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", home, strerror(errno));
	ULP_TRY(no_links(fd, home, err));
	ULP_TRY(claim_home(fd, home, rm->url, endpoint, err));
	for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]) - !rm->writer; i++) {
		char where[4400];
		snprintf(where, sizeof(where), "%s/%s", home, subdirs[i]);
		int sfd = own_dir(fd, subdirs[i], where, err);
		if (sfd < 0)
			return sfd;
		close(sfd);
	}
	return 0;
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
	rm->home_fd = -1;
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
	if (rc == 0)
		rc = make_home(rm, o ? o->cache_dir : NULL, c.endpoint, home, sizeof(home), err);
	ulp_s3_conf_free(&c);
	if (rc == 0 && !(rm->home = strdup(home)))
		rc = -ULP_E_NOMEM;
	if (rc == 0 && !(*dir = strdup(home)))
		rc = -ULP_E_NOMEM;
	if (rc < 0) {
		ulp_remote_close(rm);
		return rc;
	}
	rm->cached = dir_bytes(rm->home_fd);
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
	if (rm->home_fd >= 0)
		close(rm->home_fd);
	free(rm->home);
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
	pthread_cond_t cv; /* with mu: a helper ended */
	uint64_t next;  /* guarded by mu: the next part's offset */
	int rc;         /* guarded by mu: the first error */
	char msg[1024]; /* guarded by mu: its message */
	int running;    /* guarded by mu: helpers not ended yet */
	int cancel;     /* atomic: the caller was interrupted (its check said so) */
} fetch;

/* A helper's interrupt check: the caller's was (it waits and asks its
 * own), or a part failed, so that the others stop too. */
static int fetch_stopped(void *arg)
{
	fetch *f = arg;
	if (__atomic_load_n(&f->cancel, __ATOMIC_RELAXED))
		return 1;
	pthread_mutex_lock(&f->mu);
	int stop = f->rc < 0;
	pthread_mutex_unlock(&f->mu);
	return stop;
}

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

static void *fetch_helper(void *arg)
{
	fetch *f = arg;
	ulp_set_interrupt(fetch_stopped, f);
	fetch_main(f);
	pthread_mutex_lock(&f->mu);
	f->running--;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

int ulp_remote_fetch(ulp_archive *a, const char *rel, const char *path, uint64_t size, uint64_t want)
{
	static unsigned counter;
	ulp_remote *rm = a->rm;
	char key[1200], tmp[4400], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	key_of(rm, rel, key, sizeof(key));
	int rc = 0;
	if (!size && (rc = ulp_s3_head(rm->s3, key, &size, NULL, &e)) < 0)
		return fail(a, rc, msg);
	if (want && size != want) /* nothing fetched, nothing kept */
		return ulp_arch_err(a, -ULP_E_CORRUPT, "s3://%s/%s: %" PRIu64 " bytes in the bucket where the index says "
		                    "%" PRIu64 " (a damaged or truncated object): refused, nothing cached", rm->bucket, key,
		                    size, want);
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld-%u", path, (long)getpid(),
	         __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	fetch f = {.a = a, .key = key, .tmp = tmp, .size = size};
	f.fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	const char *slash = strchr(rel, '/');
	if (f.fd < 0 && errno == ENOENT && slash) { /* invariant 7: its directory, removed, made again */
		char sub[64], where[4400];
		snprintf(sub, sizeof(sub), "%.*s", (int)(slash - rel), rel);
		snprintf(where, sizeof(where), "%s/%s", rm->home, sub);
		int dfd = own_dir(rm->home_fd, sub, where, &e);
		if (dfd < 0)
			return fail(a, dfd, msg);
		close(dfd);
		f.fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	}
	if (f.fd < 0)
		return ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	pthread_mutex_init(&f.mu, NULL);
	pthread_cond_init(&f.cv, NULL);
	unsigned nt = (unsigned)ULP_MIN((size + FETCH_PART - 1) / FETCH_PART, FETCH_THREADS), started = 0;
	pthread_t th[FETCH_THREADS];
	for (unsigned i = 1; i < nt; i++) {
		pthread_mutex_lock(&f.mu);
		f.running++;
		pthread_mutex_unlock(&f.mu);
		if (pthread_create(&th[started], NULL, fetch_helper, &f) == 0) {
			started++;
		} else {
			pthread_mutex_lock(&f.mu);
			f.running--;
			pthread_mutex_unlock(&f.mu);
		}
	}
	fetch_main(&f); /* this thread too (its requests ask its own interrupt check) */
	/* the helpers' requests ask fetch_stopped: while they run, this thread
	 * asks its check for them */
	pthread_mutex_lock(&f.mu);
	while (f.running > 0) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&f.cv, &f.mu, &ts);
		if (f.running > 0 && !__atomic_load_n(&f.cancel, __ATOMIC_RELAXED)) {
			pthread_mutex_unlock(&f.mu);
			if (ulp_interrupted())
				__atomic_store_n(&f.cancel, 1, __ATOMIC_RELAXED);
			pthread_mutex_lock(&f.mu);
		}
	}
	pthread_mutex_unlock(&f.mu);
	for (unsigned i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_cond_destroy(&f.cv);
	pthread_mutex_destroy(&f.mu);
	/* (f.rc 0: every part came, interrupted or not) */
	rc = f.rc;
	if (rc < 0)
		ulp_arch_err(a, rc, "%s", f.msg);
	struct stat sb;
	if (rc == 0 && (fstat(f.fd, &sb) < 0 || (uint64_t)sb.st_size != size))
		rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: %lld bytes fetched of %" PRIu64, tmp, (long long)sb.st_size, size);
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

/* ---- what the bucket holds (issue 34 item 11) ------------------------------ */

typedef struct usage_walk {
	ulp_remote_usage u;
	int (*cb)(void *arg, const char *name, uint64_t size);
	void *arg;
} usage_walk;

static int usage_one(void *arg, const char *rel, uint64_t size)
{
	usage_walk *w = arg;
	w->u.bytes += size;
	if (strncmp(rel, "packs/", 6) || strchr(rel + 6, '/') || !rel[6])
		return 0;
	w->u.pack_bytes += size;
	w->u.packs++;
	return w->cb ? w->cb(w->arg, rel + 6, size) : 0;
}

int ulp_remote_usage_list(ulp_archive *a, ulp_remote_usage *u, int (*cb)(void *arg, const char *name, uint64_t size),
                          void *arg)
{
	usage_walk w = {{0, 0, 0}, cb, arg};
	int rc = ulp_remote_list(a, "", usage_one, &w);
	if (rc != 0)
		return rc;
	ulp_remote *rm = a->rm;
	int64_t now = ulp_mono_ms();
	pthread_mutex_lock(&rm->mu);
	rm->usage = w.u;
	rm->usage_ms = now ? now : 1;
	pthread_mutex_unlock(&rm->mu);
	*u = w.u;
	return 0;
}

int ulp_remote_usage_cached(ulp_remote *rm, int64_t max_age_ms, ulp_remote_usage *u)
{
	int64_t now = ulp_mono_ms();
	pthread_mutex_lock(&rm->mu);
	*u = rm->usage;
	int fresh = rm->usage_ms && now - rm->usage_ms <= max_age_ms;
	pthread_mutex_unlock(&rm->mu);
	return fresh;
}

/* ---- the home's row for a bucket (home.h) ---------------------------------- */

static uint64_t s3_first_gen(uint64_t epoch)
{
	return epoch << 32; /* invariant 4: this epoch's own numbers */
}

static int s3_get(ulp_home *h, const char *rel, char *buf, size_t cap, size_t *len, char tag[ULP_HOME_TAG_MAX])
{
	return ulp_remote_get_small(h->a, rel, buf, cap, len, tag);
}

static int s3_get_range(ulp_home *h, const char *rel, const char *path, uint64_t size, uint64_t want)
{
	return ulp_remote_fetch(h->a, rel, path, size, want);
}

/* Created, never replaced (a generation of that number there is another
 * writer's): one conditional request. */
static int s3_put(ulp_home *h, const char *rel, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0) {
		int rc = ulp_arch_io_err(h->a, path, "open");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	int rc = ulp_remote_put_fd(h->a, rel, fd, (uint64_t)sb.st_size, 1);
	close(fd);
	return rc;
}

static int s3_put_if_match(ulp_home *h, const char *rel, const char *p, size_t len, char tag[ULP_HOME_TAG_MAX])
{
	ulp_remote *rm = h->a->rm;
	char key[1200], msg[1024], prev[ULP_S3_ETAG_MAX], now[ULP_S3_ETAG_MAX];
	ulp_err e = {msg, sizeof(msg)};
	key_of(rm, rel, key, sizeof(key));
	pthread_mutex_lock(&h->mu);
	snprintf(prev, sizeof(prev), "%s", tag);
	pthread_mutex_unlock(&h->mu);
	int rc = ulp_s3_put_cond(rm->s3, key, p, len, prev[0] ? prev : NULL, now, &e);
	if (rc < 0)
		return fail(h->a, rc, msg);
	pthread_mutex_lock(&h->mu);
	snprintf(tag, ULP_HOME_TAG_MAX, "%s", now);
	pthread_mutex_unlock(&h->mu);
	return 0;
}

static int s3_del(ulp_home *h, const char *rel)
{
	return ulp_remote_delete(h->a, rel);
}

static int s3_list(ulp_home *h, const char *prefix, int (*cb)(void *arg, const char *rel, uint64_t size), void *arg)
{
	return ulp_remote_list(h->a, prefix, cb, arg);
}

static void s3_drop(ulp_home *h, const char *path)
{
	(void)h;
	unlink(path); /* a copy: the object stays in the bucket */
}

static int s3_usage(ulp_home *h)
{
	ulp_remote_usage u;
	return ulp_remote_usage_list(h->a, &u, NULL, NULL);
}

static void s3_close(ulp_home *h)
{
	free(h);
}

static const ulp_home_ops s3_ops = {
	.name = "s3",
	.swaps = 1,
	.background = 1,
	.relink = 0,
	.no_pointer = "no archive there (no index/CURRENT in the bucket)",
	.first_gen = s3_first_gen,
	.get = s3_get,
	.get_range = s3_get_range,
	.put = s3_put,
	.put_if_match = s3_put_if_match,
	.del = s3_del,
	.list = s3_list,
	.drop = s3_drop,
	.usage = s3_usage,
	.close = s3_close,
};

_Static_assert(ULP_HOME_TAG_MAX == ULP_S3_ETAG_MAX, "a home's tag holds an ETag");

int ulp_home_s3_open(ulp_archive *a, ulp_home **out)
{
	ulp_home *h = calloc(1, sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	h->ops = &s3_ops;
	h->a = a;
	h->where = a->rm->url;
	h->creating = a->rm->creating;
	pthread_mutex_init(&h->mu, NULL);
	*out = h;
	return 0;
}
