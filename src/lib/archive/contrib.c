/* SPDX-License-Identifier: MIT */
/*
 * contrib.c - many hosts write, one archives (DESIGN.md 7, ulpackfs(1) MANY
 * HOSTS): a read-write open of a shared archive on a directory whose lease
 * another host holds becomes a contributor (opts.contribute). It reads the
 * published generations as a reader does, and stages what it writes in its
 * own ARCHIVE/staging/h-<host>/ (staging.c invariant 8). The lease holder,
 * the one archiver, takes those files into its own staging at its own pace
 * (ulp_contrib_drain, called by its session's archiver when idle, at most
 * once per DRAIN_MS) and archives them with its own, in the layout's order.
 *
 * Invariants:
 *  1. A contributor writes no file outside staging/h-<host>/ (no index, no
 *     pack, no pointer): the archiver and the generations are unchanged by
 *     the number of hosts.
 *  2. The archiver takes a file only when its data file is 0640 (closed on
 *     its host), its sidecar is whole and names a final path (no rsync
 *     temporary, no hidden name), and no node of its own session holds that
 *     path (is_free); it renames the sidecar first, so a contributor's
 *     unlink (which removes the sidecar) either wins whole (nothing taken)
 *     or loses whole (the file is archived under the name it had).
 *  3. Same path from several hosts: the version taken last wins; the drain
 *     takes files oldest close first (their data's mtime), across hosts.
 *  4. A contributor's file is served from its host's staging until the
 *     generation it follows holds it (ulp_contrib_put: its data left
 *     staging/h-<host>/ and the generation has the path with its size and
 *     mtime), or the archiver's failure note (<base>.failed) names why.
 *  5. The drain reads staging/ and each h-<host>/ once per pass, and a pass
 *     runs at most once per DRAIN_MS: the shared file system's metadata load
 *     does not grow with the rate of writes.
 * dirs is guarded by mu.
 */
#include "arch_int.h"
#include "store/shared.h"
#include "archive/writer.h"
#include "store/index.h"
#include "store/path.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct cdir {
	char *path;
	ulp_meta m;
	struct cdir *next;
} cdir;

struct ulp_contrib {
	char dir[4300];        /* set at open, read-only after: staging/h-<host> */
	pthread_mutex_t mu;
	cdir *dirs;            /* guarded by mu: made here, not yet seen published */
};

const char *ulp_contrib_dir(const ulp_archive *a)
{
	return a->contrib ? a->contrib->dir : NULL;
}

const char *ulp_archive_lock_dir(const ulp_archive *a)
{
	return a->contrib ? a->contrib->dir : a->dir;
}

int ulp_contrib_open(ulp_archive *a, ulp_err *err)
{
	ulp_contrib *c = calloc(1, sizeof(*c));
	if (!c)
		return -ULP_E_NOMEM;
	char host[256];
	snprintf(host, sizeof(host), "%s", a->sh ? a->sh->host : "?");
	for (char *h = host; *h; h++) /* one path component */
		if (!((*h >= 'a' && *h <= 'z') || (*h >= 'A' && *h <= 'Z') || (*h >= '0' && *h <= '9') || *h == '.' ||
		      *h == '-' || *h == '_'))
			*h = '_';
	snprintf(c->dir, sizeof(c->dir), "%s/staging/h-%s", a->dir, host);
	char top[4300];
	snprintf(top, sizeof(top), "%s/staging", a->dir);
	mkdir(top, 0700);
	if (mkdir(c->dir, 0700) < 0 && errno != EEXIST) {
		int rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", c->dir, strerror(errno));
		free(c);
		return rc;
	}
	pthread_mutex_init(&c->mu, NULL);
	a->contrib = c;
	a->contrib_dir = c->dir;
	if (ulp_stage_sweep_own(a) < 0)
		return ULP_ERR(err, -ULP_E_IO, "%s", ulp_msgs_get(a->msgs));
	return 0;
}

void ulp_contrib_free(ulp_archive *a)
{
	ulp_contrib *c = a->contrib;
	if (!c)
		return;
	while (c->dirs) {
		cdir *d = c->dirs;
		c->dirs = d->next;
		free(d->path);
		free(d);
	}
	pthread_mutex_destroy(&c->mu);
	free(c);
	a->contrib = NULL;
	a->contrib_dir = NULL;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
	}
}

/* The archiver's note for a file it could not archive (invariant 4): its
 * message, the note removed; 0 if there is none. */
static int failure_note(ulp_archive *a, const ulp_stage *st)
{
	char p[4400], msg[1024];
	const char *d = ulp_stage_data_name(st);
	size_t l = strlen(d);
	snprintf(p, sizeof(p), "%.*s.failed", (int)(l > 5 ? l - 5 : l), d);
	FILE *f = fopen(p, "r");
	if (!f)
		return 0;
	size_t n = fread(msg, 1, sizeof(msg) - 1, f);
	fclose(f);
	msg[n] = 0;
	int code = atoi(msg);
	const char *why = strchr(msg, ' ');
	unlink(p);
	return ulp_arch_err(a, code < 0 ? code : -ULP_E_IO, "the archiver could not archive it: %s",
	                    why ? why + 1 : "(no reason given)");
}

int ulp_contrib_put(ulp_archive *a, ulp_stage *st, const char *path, const ulp_meta *m,
                    int (*stop)(void *arg), void *arg)
{
	struct stat sb;
	if (fstat(ulp_stage_fd(st), &sb) < 0)
		return ulp_arch_io_err(a, ulp_stage_data_name(st), "fstat");
	uint64_t size = (uint64_t)sb.st_size;
	for (;;) {
		if (stop && stop(arg))
			return -ULP_E_BUSY; /* left staged: the archiver takes it later */
		int rc = failure_note(a, st);
		if (rc < 0)
			return rc;
		if (ulp_stage_taken(st)) {
			ulp_stat s;
			if (ulp_archive_stat(a, path, &s) == 0 && !s.is_dir && s.size == size && s.mtime.sec == m->mtime.sec &&
			    s.mtime.nsec == m->mtime.nsec)
				return 0;
		} else if (access(ulp_contrib_dir(a), F_OK) != 0 && errno != ENOENT) {
			/* the shared file system is out of reach: it stays staged */
			return ulp_arch_io_err(a, ulp_contrib_dir(a), "access");
		}
		sleep_ms(100);
	}
}

void ulp_contrib_failed(ulp_archive *a, const ulp_stage *st, int rc, const char *why)
{
	const char *o = ulp_stage_origin(st);
	if (!o[0])
		return;
	char p[4400], line[1200];
	snprintf(p, sizeof(p), "%s.failed", o);
	int n = snprintf(line, sizeof(line), "%d %s\n", rc, why);
	ulp_shared_replace_file(a, p, line, (size_t)(n < (int)sizeof(line) ? n : (int)sizeof(line) - 1), 0);
}

/* ---- the archiver's drain ----------------------------------------------- */

typedef struct cand {
	char *dir, *base;
	int64_t mtime_ns;
} cand;

static int cand_cmp(const void *x, const void *y)
{
	const cand *p = x, *q = y;
	if (p->mtime_ns != q->mtime_ns)
		return p->mtime_ns < q->mtime_ns ? -1 : 1;
	int c = strcmp(p->dir, q->dir);
	return c ? c : strcmp(p->base, q->base);
}

/* The closed, final-named files of host directory dir (invariant 2) added
 * to *v. */
static int scan_host(const char *dir, cand **v, size_t *n, size_t *cap)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0; /* gone meanwhile */
	int rc = 0;
	for (struct dirent *de; rc == 0 && (de = readdir(d));) {
		size_t l = strlen(de->d_name);
		if (l < 6 || strcmp(de->d_name + l - 5, ".data") != 0)
			continue;
		char data[4600], meta[4600], path[4096];
		struct stat sb;
		ulp_meta m;
		snprintf(data, sizeof(data), "%.4300s/%.255s", dir, de->d_name);
		snprintf(meta, sizeof(meta), "%.4300s/%.*s.meta", dir, (int)(l - 5 > 250 ? 250 : l - 5), de->d_name);
		if (stat(data, &sb) < 0 || (sb.st_mode & 0777) != 0640)
			continue; /* still open on its host */
		if (ulp_stage_read_meta(meta, path, sizeof(path), &m) != 0)
			continue;
		if ((rc = ulp_grow(v, cap, *n, sizeof(**v))) < 0)
			break;
		cand *c = &(*v)[*n];
		c->dir = strdup(dir);
		c->base = strndup(de->d_name, l - 5);
		c->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
		if (!c->dir || !c->base) {
			free(c->dir);
			free(c->base);
			rc = -ULP_E_NOMEM;
			break;
		}
		(*n)++;
	}
	closedir(d);
	return rc;
}

int ulp_contrib_drain(ulp_archive *a, int (*is_free)(void *arg, const char *path),
                      int (*adopt)(void *arg, ulp_stage *st, const char *path, const ulp_meta *m), void *arg)
{
	if (!a->sh || !a->sh->writer || a->rm)
		return 0;
	ULP_TRY(ulp_lease_ok(a));
	char top[4300];
	snprintf(top, sizeof(top), "%s/staging", a->dir);
	DIR *d = opendir(top);
	if (!d)
		return errno == ENOENT ? 0 : ulp_arch_io_err(a, top, "opendir");
	cand *v = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	for (struct dirent *de; rc == 0 && (de = readdir(d));) {
		if (strncmp(de->d_name, "h-", 2) != 0)
			continue;
		char hd[4600];
		snprintf(hd, sizeof(hd), "%s/%s", top, de->d_name);
		rc = scan_host(hd, &v, &n, &cap);
	}
	closedir(d);
	if (n > 1)
		qsort(v, n, sizeof(*v), cand_cmp);
	int taken = 0;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		char meta[4600], path[4096];
		ulp_meta m;
		snprintf(meta, sizeof(meta), "%s/%s.meta", v[i].dir, v[i].base);
		if (ulp_stage_read_meta(meta, path, sizeof(path), &m) != 0)
			continue; /* unlinked or renamed to a temporary meanwhile */
		if (!is_free(arg, path))
			continue; /* a temporary name, or busy there: the next pass */
		if ((rc = ulp_lease_ok(a)) < 0)
			break;
		ulp_stage *st;
		int r = ulp_stage_take(a, v[i].dir, v[i].base, &st);
		if (r == -ULP_E_NOENT)
			continue;
		if (r < 0) {
			rc = r;
			break;
		}
		/* the sidecar again, now ours: what the contributor wrote last */
		char own[4600];
		snprintf(own, sizeof(own), "%.4590s", ulp_stage_data_name(st));
		size_t l = strlen(own);
		snprintf(own + l - 5, sizeof(own) - (l - 5), ".meta");
		if (ulp_stage_read_meta(own, path, sizeof(path), &m) != 0) {
			ulp_stage_close(st); /* a claimed file without a whole sidecar: recovery removes it */
			continue;
		}
		adopt(arg, st, path, &m);
		taken++;
	}
	for (size_t i = 0; i < n; i++) {
		free(v[i].dir);
		free(v[i].base);
	}
	free(v);
	return rc < 0 ? rc : taken;
}

/* ---- a contributor's directories ----------------------------------------- */

/* mu held */
static cdir *find_dir(ulp_contrib *c, const char *p)
{
	for (cdir *d = c->dirs; d; d = d->next)
		if (!strcmp(d->path, p))
			return d;
	return NULL;
}

int ulp_contrib_stat_dir(ulp_archive *a, const char *path, ulp_stat *st)
{
	ulp_contrib *c = a->contrib;
	if (!c)
		return -ULP_E_NOENT;
	pthread_mutex_lock(&c->mu);
	cdir *d = find_dir(c, path);
	if (d) {
		memset(st, 0, sizeof(*st));
		st->is_dir = 1;
		st->mode = S_IFDIR | (d->m.mode & 07777);
		st->uid = d->m.uid;
		st->gid = d->m.gid;
		st->mtime = d->m.mtime;
		st->step = -1;
	}
	pthread_mutex_unlock(&c->mu);
	return d ? 0 : -ULP_E_NOENT;
}

int ulp_contrib_mkdir(ulp_archive *a, const char *path, const ulp_meta *m)
{
	ulp_contrib *c = a->contrib;
	char p[4096];
	if (!c || ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: cannot make this directory here", path);
	ulp_stat st;
	if (ulp_archive_stat(a, p, &st) == 0 || ulp_contrib_stat_dir(a, p, &st) == 0)
		return ulp_arch_err(a, -ULP_E_EXIST, "%s: exists", p);
	char *slash = strrchr(p, '/');
	if (slash) {
		*slash = 0;
		int ok = (ulp_archive_stat(a, p, &st) == 0 && st.is_dir) || ulp_contrib_stat_dir(a, p, &st) == 0;
		*slash = '/';
		if (!ok)
			return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such parent directory", p);
	}
	cdir *d = calloc(1, sizeof(*d));
	if (!d || !(d->path = strdup(p))) {
		free(d);
		return -ULP_E_NOMEM;
	}
	d->m = *m;
	pthread_mutex_lock(&c->mu);
	d->next = c->dirs;
	c->dirs = d;
	pthread_mutex_unlock(&c->mu);
	return 0;
}

int ulp_contrib_list_dirs(ulp_archive *a, const char *dir, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                          void *arg)
{
	ulp_contrib *c = a->contrib;
	if (!c)
		return 0;
	size_t dl = strlen(dir), cnt = 0;
	char **names = NULL;
	pthread_mutex_lock(&c->mu);
	for (cdir *d = c->dirs; d; d = d->next)
		cnt++;
	names = calloc(cnt ? cnt : 1, sizeof(*names));
	size_t k = 0;
	for (cdir *d = c->dirs; names && d; d = d->next) {
		const char *s = strrchr(d->path, '/');
		size_t pl = s ? (size_t)(s - d->path) : 0;
		if (pl == dl && !strncmp(d->path, dir, dl))
			names[k++] = strdup(d->path);
	}
	pthread_mutex_unlock(&c->mu);
	if (!names)
		return -ULP_E_NOMEM;
	int rc = 0;
	for (size_t i = 0; i < k; i++) {
		ulp_stat st, ast;
		if (rc == 0 && names[i] && ulp_archive_stat(a, names[i], &ast) != 0 &&
		    ulp_contrib_stat_dir(a, names[i], &st) == 0) {
			const char *s = strrchr(names[i], '/');
			rc = cb(arg, s ? s + 1 : names[i], &st);
		}
		free(names[i]);
	}
	free(names);
	return rc;
}
