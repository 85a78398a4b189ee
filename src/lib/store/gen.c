/* SPDX-License-Identifier: MIT */
/*
 * gen.c - published index generations (shared.h has the files): the writer
 * copies its live index into a new generation (whole, or the pages that
 * changed since the last whole one) after each archived batch and at sync; readers on any host open the newest one immutable and follow the
 * next ones; a generation superseded more than the grace ago goes, and with
 * it the packs the index dropped before it (pack_grace, maint.c). The
 * archive's home (home.h: the shared directory, or a bucket) is reached
 * only through its table, a->home: gen.c names no kind of home.
 *
 * Invariants:
 *  1. A generation file is whole, fsynced and renamed to its final name,
 *     and its directory fsynced, before CURRENT names it; CURRENT is
 *     replaced by rename, so a reader sees the old pointer or the new one.
 *  2. Generation numbers only grow: a publication takes one more than the
 *     largest in index/ and in CURRENT. A writer publishes only while its
 *     lease holds (ulp_lease_ok, right before CURRENT is replaced), and a
 *     reader never follows a CURRENT whose (epoch, generation) is below the
 *     one it has: no reader goes back.
 *  3. A reader's threads move to a newer generation only between calls
 *     (ulp_gen_follow, at the library's read entry points, when the thread's
 *     connection runs no statement); an open file needs no index after its
 *     open (read.c invariant 3), so it keeps the bytes of its generation.
 *  4. Retirement (ulp_gen_retire) keeps the current generation and, of the
 *     others, the newest ULP_GEN_KEEP that were superseded less than the
 *     grace ago, and the base of every patch it keeps; a generation file is
 *     the only thing a reader opens by name, and a pack a generation kept
 *     as one names is never removed (maint.c invariant 7). A base kept only
 *     for its patches names nothing by itself: its readers read the
 *     patches.
 *  5. No checkpoint runs in the writer's process but publication's (its
 *     connections' auto-checkpoint is off, ulp_index_checkpoint defers to
 *     it, and the lease keeps other processes out), so after publication's
 *     full checkpoint ulpack.db holds exactly the committed pages it reads,
 *     however the other threads commit meanwhile (into the WAL). Where the
 *     checkpoint cannot complete (a reader of an older snapshot), it reads
 *     a copy made by SQLite's online backup instead: a publication never
 *     waits for readers, nor is it skipped.
 *  6. A generation is published whole (gen-G.db) or as a patch (gen-G.patch:
 *     the pages that differ from the last whole one, its base; genvfs.c);
 *     whole when there is no base or the patch would exceed a quarter of
 *     the index (or 256 KiB), so that a reader's memory for a patch stays
 *     below that.
 *  9. A reader of a bucket never waits on the bucket in a read, a lookup or
 *     a listing (issue 34 item 6): ulp_gen_poll only wakes the handle's
 *     background thread (the poller, started in the process that asks, as
 *     the renewer), which reads CURRENT, fetches a newer generation whole
 *     and follows it; reads meanwhile are served by the generation
 *     followed. The same thread lists the bucket when asked (the figures of
 *     df, ulp_gen_usage_refresh). It runs no index statement, and its
 *     requests end within about a second of the close (its interrupt check
 *     is poller_stop).
 */
#include "shared.h"
#include "home.h"
#include "db.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

int ulp_gen_is_shared(const char *dir)
{
	char p[4200];
	struct stat sb;
	snprintf(p, sizeof(p), "%s/index", dir);
	return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The file systems whose hosts do not share memory with each other. */
int ulp_netfs(const char *dir, char *name, size_t cap)
{
	static const struct { long magic; const char *name; } fs[] = {
		{0x6969, "nfs"}, {0x00c36400, "ceph"}, {0xFE534D42, "smb2"}, {(long)0xFF534D42, "cifs"},
		{0x0BD00BD0, "lustre"}, {0x47504653, "gpfs"}, {0x5346414F, "afs"}, {0x01021997, "9p"},
		{0x65735546, "fuse"},
	};
	const char *t = getenv("ULP_TEST_NETFS"); /* tests: dir is on one */
	if (t && *t) {
		snprintf(name, cap, "%s", t);
		return 1;
	}
	struct statfs s;
	if (statfs(dir, &s) < 0)
		return 0;
	for (size_t i = 0; i < sizeof(fs) / sizeof(fs[0]); i++) {
		if ((long)(uint32_t)s.f_type != (long)(uint32_t)fs[i].magic)
			continue;
		snprintf(name, cap, "%s", fs[i].name);
		if (fs[i].magic != 0x65735546)
			return 1;
		/* a FUSE file system: its type (fuse.glusterfs, fuse.ceph-fuse) from the
		 * longest mount point above dir */
		char real[4096], line[8192];
		FILE *f = realpath(dir, real) ? fopen("/proc/self/mountinfo", "r") : NULL;
		size_t best = 0;
		while (f && fgets(line, sizeof(line), f)) {
			char mp[4096], type[256];
			/* id parent maj:min root mountpoint options... - type source super */
			const char *dash = strstr(line, " - ");
			if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 || sscanf(dash + 3, "%255s", type) != 1)
				continue;
			size_t l = strlen(mp);
			if ((l == 1 || (!strncmp(real, mp, l) && (real[l] == '/' || real[l] == 0))) && l >= best) {
				best = l;
				snprintf(name, cap, "%s", type);
			}
		}
		if (f)
			fclose(f);
		/* ulpackfs itself is no network file system, nor are the local FUSE ones
		 * this list does not know: only the ones that reach other hosts */
		return !strcmp(name, "fuse") || strstr(name, "gluster") || strstr(name, "ceph") ||
		       strstr(name, "sshfs") || strstr(name, "juicefs") || strstr(name, "s3fs") ||
		       strstr(name, "gcsfuse") || strstr(name, "rclone") || strstr(name, "lizardfs") ||
		       strstr(name, "moosefs") || strstr(name, "beegfs");
	}
	return 0;
}

/* What index/CURRENT says: generation gen of the writer of epoch epoch, a
 * file of bytes bytes: whole (base == gen: gen-G.db) or a patch of
 * generation base (gen-G.patch, genvfs.c). */
typedef struct current {
	uint64_t gen, epoch, bytes, base;
} current;

/* A pointer's text (buf, its n bytes NUL-terminated; p names it in the
 * message, which shows the start of what the file holds, escaped): 0 or
 * CORRUPT. */
static int parse_current(const char *p, const char *buf, size_t n, current *c, ulp_err *err)
{
	unsigned v = 0;
	int k = sscanf(buf, "ulpack-current %u %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &v, &c->gen, &c->epoch,
	               &c->bytes, &c->base);
	if (k == 4 && v == 1)
		c->base = c->gen;
	if (!((k == 4 && v == 1) || (k == 5 && v == 2)) || c->gen == 0 || c->base == 0 || c->base > c->gen) {
		char q[64];
		return ULP_ERR(err, -ULP_E_CORRUPT, "%s: not a generation pointer (\"%s\")", p,
		               ulp_quote(q, sizeof(q), buf, n));
	}
	return 0;
}

/* CURRENT of dir: 0, NOENT (none), CORRUPT (not one). */
/* A small file whole into buf (NUL-terminated): bytes read, or -1 with
 * errno. A file replaced by rename on a network file system can answer
 * ESTALE for a moment (GlusterFS: its old handle): read again. */
static ssize_t read_small(const char *p, char *buf, size_t cap)
{
	for (int tries = 0;; tries++) {
		int fd = open(p, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : -1;
		int e = errno;
		if (fd >= 0)
			close(fd);
		if (n >= 0) {
			buf[n] = 0;
			return n;
		}
		if (e != ESTALE || tries >= 5) {
			errno = e;
			return -1;
		}
		usleep(20000);
	}
}

static int read_current(const char *dir, current *c, ulp_err *err)
{
	char p[4200], buf[256];
	snprintf(p, sizeof(p), "%s/index/CURRENT", dir);
	ssize_t n = read_small(p, buf, sizeof(buf));
	if (n < 0)
		return ULP_ERR(err, errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO, "%s: %s", p, strerror(errno));
	buf[n] = 0;
	return parse_current(p, buf, (size_t)n, c, err);
}

/* The newest pointer of a shared archive on a directory (invariant 7): the
 * highest (epoch, generation) of index/CURRENT and the per-epoch pointers
 * index/CURRENT-<epoch>: 0, NOENT (none), CORRUPT (none of them is one). A
 * fenced writer's late rename of CURRENT never hides a newer writer's
 * generation, since that writer's own pointer file is read too. */
static int best_current(const char *dir, current *c, ulp_err *err)
{
	int rc = read_current(dir, c, err);
	char p[4200];
	snprintf(p, sizeof(p), "%s/index", dir);
	DIR *d = opendir(p);
	if (!d)
		return rc;
	for (struct dirent *e; (e = readdir(d));) {
		if (strncmp(e->d_name, "CURRENT-", 8) || strlen(e->d_name) != 28)
			continue;
		char f[4300], buf[256];
		snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
		ssize_t n = read_small(f, buf, sizeof(buf));
		current x;
		char m[64];
		ulp_err xe = {m, sizeof(m)};
		if (n <= 0)
			continue;
		buf[n] = 0;
		if (parse_current(f, buf, (size_t)n, &x, &xe) < 0)
			continue;
		if (rc < 0 || x.epoch > c->epoch || (x.epoch == c->epoch && x.gen > c->gen)) {
			*c = x;
			rc = 0;
		}
	}
	closedir(d);
	return rc;
}

static void epoch_pointer_path(const ulp_archive *a, uint64_t epoch, char *p, size_t cap)
{
	snprintf(p, cap, "%s/index/CURRENT-%020" PRIu64, a->dir, epoch);
}

/* The pointer's text for c. */
static int format_current(const current *c, char *line, size_t cap)
{
	return c->base == c->gen
	       ? snprintf(line, cap, "ulpack-current 1 %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", c->gen, c->epoch, c->bytes)
	       : snprintf(line, cap, "ulpack-current 2 %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", c->gen, c->epoch,
	                  c->bytes, c->base);
}

static void gen_path(const ulp_archive *a, uint64_t gen, int patch, char *p, size_t cap)
{
	snprintf(p, cap, "%s/index/gen-%020" PRIu64 ".%s", a->dir, gen, patch ? "patch" : "db");
}

typedef struct genfile {
	uint64_t gen;
	int patch;
	int64_t at;    /* published: the file's mtime, ms */
} genfile;

static int genfile_cmp(const void *x, const void *y)
{
	const genfile *a = x, *b = y;
	return a->gen < b->gen ? -1 : a->gen > b->gen;
}

/* The generation files in index/, ascending. */
static int list_gens(ulp_archive *a, genfile **out, size_t *n)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/index", a->dir);
	DIR *d = opendir(p);
	*out = NULL;
	*n = 0;
	if (!d)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	size_t cap = 0;
	int rc = 0;
	for (struct dirent *e; rc == 0 && (e = readdir(d));) {
		uint64_t g;
		char tail[8];
		if (sscanf(e->d_name, "gen-%" SCNu64 ".%7s", &g, tail) != 2 || g == 0 ||
		    (strcmp(tail, "db") && strcmp(tail, "patch")))
			continue;
		if ((rc = ulp_grow(out, &cap, *n, sizeof(**out))) == 0) {
			char f[4600];
			struct stat sb;
			snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
			(*out)[*n] = (genfile){g, tail[0] == 'p', 0};
			if (stat(f, &sb) == 0)
				(*out)[*n].at = (int64_t)sb.st_mtim.tv_sec * 1000 + sb.st_mtim.tv_nsec / 1000000;
			(*n)++;
		}
	}
	closedir(d);
	if (*n > 1)
		qsort(*out, *n, sizeof(**out), genfile_cmp);
	return rc;
}

int ulp_gen_oldest(ulp_archive *a, uint64_t *oldest)
{
	ulp_gen_retire(a);
	pthread_mutex_lock(&a->sh->mu);
	*oldest = a->sh->oldest_kept;
	pthread_mutex_unlock(&a->sh->mu);
	return 0;
}

static void poller_stop(ulp_archive *a);

int ulp_shared_new(ulp_archive *a, const ulp_archive_opts *o, int writer)
{
	ulp_shared *sh = calloc(1, sizeof(*sh));
	if (!sh)
		return -ULP_E_NOMEM;
	sh->writer = writer;
	sh->poll_ms = o && o->poll_ms ? o->poll_ms : ULP_POLL_MS_DEFAULT;
	sh->lease_ms = o && o->lease_ms ? o->lease_ms : ULP_LEASE_MS_DEFAULT;
	sh->grace_s = o && o->grace_s ? o->grace_s : ULP_GRACE_S_DEFAULT;
	if (o && o->grace_s == UINT32_MAX)
		sh->grace_s = 0; /* tests: no grace at all */
	if (gethostname(sh->host, sizeof(sh->host) - 1) < 0)
		snprintf(sh->host, sizeof(sh->host), "?");
	for (char *c = sh->host; *c; c++)
		if (*c == ' ' || *c == '\n')
			*c = '_';
	pthread_mutex_init(&sh->mu, NULL);
	pthread_mutex_init(&sh->pub_mu, NULL);
	pthread_mutex_init(&sh->renew_mu, NULL);
	pthread_cond_init(&sh->cv, NULL);
	pthread_cond_init(&sh->poll_cv, NULL);
	sh->published_changes = UINT64_MAX; /* the first publication always happens */
	a->sh = sh;
	return 0;
}

void ulp_shared_free(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh)
		return;
	poller_stop(a);
	ulp_lease_give_back(a, ulp_gen_publish); /* joins the renewer, publishes last */
	ulp_shared_forget_retained(a); /* (what was not published stays for the next writer) */
	if (a->w->live && !__atomic_load_n(&sh->opened, __ATOMIC_ACQUIRE)) {
		/* an open that failed: its live index is no one's (and would hide
		 * the one of the epoch before from drop_old_epochs) */
		static const char *const tail[] = {"", "-wal", "-shm"};
		for (int i = 0; i < 3; i++) {
			char p[4300];
			snprintf(p, sizeof(p), "%s%s", a->w->live, tail[i]);
			unlink(p);
		}
	}
	free(sh->base_hash);
	pthread_mutex_destroy(&sh->mu);
	pthread_mutex_destroy(&sh->pub_mu);
	pthread_mutex_destroy(&sh->renew_mu);
	pthread_cond_destroy(&sh->cv);
	pthread_cond_destroy(&sh->poll_cv);
	free(sh);
	a->sh = NULL;
}

/* ---- the home (home.h): what it keeps apart from the directory ------------ */


static void gen_rel(uint64_t gen, int patch, char *rel, size_t cap)
{
	snprintf(rel, cap, "index/gen-%020" PRIu64 ".%s", gen, patch ? "patch" : "db");
}

/* The home's CURRENT (etag may be NULL): 0, NOENT (none kept apart from the
 * directory), CORRUPT, IO. */
static int remote_current(ulp_archive *a, current *c, char etag[ULP_HOME_TAG_MAX], ulp_err *err)
{
	ulp_home *h = a->home;
	char buf[256], where[1300];
	size_t n = 0;
	int rc = h->ops->get(h, "index/CURRENT", buf, sizeof(buf) - 1, &n, etag);
	if (rc < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	buf[n] = 0;
	snprintf(where, sizeof(where), "%s/index/CURRENT", h->where);
	return parse_current(where, buf, n, c, err);
}

/* remote.h invariant 3: generation c's files (and its base's) in index/
 * (where the directory is the home, they are there). */
static int fetch_gen(ulp_archive *a, const current *c, ulp_err *err)
{
	int patch = c->base != c->gen;
	for (int k = 0; k <= patch; k++) {
		uint64_t g = k == 0 ? c->gen : c->base;
		int pt = k == 0 && patch;
		char p[4200], rel[64];
		struct stat sb;
		gen_path(a, g, pt, p, sizeof(p));
		if (stat(p, &sb) == 0 && sb.st_size > 0)
			continue;
		gen_rel(g, pt, rel, sizeof(rel));
		int rc = a->home->ops->get_range(a->home, rel, p, k == 0 ? c->bytes : 0, 0);
		if (rc < 0)
			return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	}
	return 0;
}

/* A reader's home keeps the generation it follows, and its base, only: the
 * older ones' copies go (a connection still on one keeps its open file; a
 * new one opens the newest, db.c); where the directory is the home, the
 * files are its generations and stay. */
static void drop_fetched(ulp_archive *a, const current *c)
{
	genfile *g;
	size_t n;
	if (list_gens(a, &g, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++)
		if (g[i].gen < c->gen && g[i].gen != c->base) {
			char p[4200];
			gen_path(a, g[i].gen, g[i].patch, p, sizeof(p));
			a->home->ops->drop(a->home, p);
		}
	free(g);
}

/* The writer's live index (the file live) rebuilt from generation c: its
 * base, with a patch's pages over it, in WAL mode again (header bytes 18
 * and 19). */
static int materialize(ulp_archive *a, const current *c, const char *live, ulp_err *err)
{
	char base[4200], pf[4200], tmp[4300];
	gen_path(a, c->base, 0, base, sizeof(base));
	gen_path(a, c->gen, 1, pf, sizeof(pf));
	char me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	snprintf(tmp, sizeof(tmp), "%s.tmp-%s", live, me);
	int in = open(base, O_RDONLY | O_CLOEXEC);
	int out = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	uint8_t *pm = NULL;
	int rc = 0, e = 0;
	if (in < 0 || out < 0)
		rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", in < 0 ? base : tmp, strerror(errno));
	int wrote;
	if (rc == 0 && (e = ulp_copy_fd(in, out, &wrote)) != 0)
		rc = ULP_ERR(err, wrote ? ulp_errno_code(e) : -ULP_E_IO, "%s: %s", wrote ? tmp : base, strerror(e));
	if (rc == 0 && c->base != c->gen) {
		ulp_genpatch gp;
		int pfd = open(pf, O_RDONLY | O_CLOEXEC);
		pm = pfd >= 0 && c->bytes < ((uint64_t)1 << 32) ? malloc((size_t)c->bytes + 1) : NULL;
		if (!pm || ulp_pread_full(pfd, pm, (size_t)c->bytes, 0) != 0)
			rc = ULP_ERR(err, -ULP_E_IO, "%s: cannot read it", pf);
		if (pfd >= 0)
			close(pfd);
		if (rc == 0 && (ulp_genpatch_parse(pm, (size_t)c->bytes, &gp) < 0 || gp.base != c->base))
			rc = ULP_ERR(err, -ULP_E_CORRUPT, "%s: not a patch of generation %" PRIu64, pf, c->base);
		for (uint32_t i = 0; rc == 0 && i < gp.n_patch; i++) {
			uint32_t no = ulp_ld32(gp.pgno + 4 * (size_t)i);
			if (no == 0 || (e = ulp_pwrite_full(out, gp.pages + (size_t)i * gp.page_size, gp.page_size,
			                                    (uint64_t)(no - 1) * gp.page_size)) != 0)
				rc = ULP_ERR(err, -ULP_E_IO, "%s: page %u: %s", tmp, no, no ? strerror(e) : "page 0");
		}
		if (rc == 0 && ftruncate(out, (off_t)((uint64_t)gp.n_pages * gp.page_size)) < 0)
			rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	}
	uint8_t two[2] = {2, 2}; /* WAL (the generation was a rollback database: unwal) */
	if (rc == 0 && (e = ulp_pwrite_full(out, two, 2, 18)) != 0)
		rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", tmp, strerror(e));
	if (rc == 0 && fsync(out) < 0)
		rc = ULP_ERR(err, -ULP_E_IO, "%s: fsync: %s", tmp, strerror(errno));
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	free(pm);
	if (rc == 0) {
		char w[4400];
		snprintf(w, sizeof(w), "%s-wal", live);
		unlink(w);
		snprintf(w, sizeof(w), "%s-shm", live);
		unlink(w);
		if (rename(tmp, live) < 0)
			rc = ULP_ERR(err, -ULP_E_IO, "%s: %s", live, strerror(errno));
	}
	if (rc < 0)
		unlink(tmp);
	return rc;
}

/* The bucket's generations this home does not have: empty files in index/,
 * which retirement removes (with their objects) as it removes the writer's
 * own; a reader never opens them (it fetches what it follows). */
static int placeholder(void *arg, const char *rel, uint64_t size)
{
	ulp_archive *a = arg;
	char p[4300];
	uint64_t g;
	char tail[8];
	(void)size;
	if (sscanf(rel, "index/gen-%" SCNu64 ".%7s", &g, tail) != 2 || (strcmp(tail, "db") && strcmp(tail, "patch")))
		return 0;
	snprintf(p, sizeof(p), "%s/%s", a->dir, rel);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	return 0;
}

int ulp_gen_remote_writer(ulp_archive *a, ulp_err *err)
{
	ulp_home *h = a->home;
	current c, l;
	char etag[ULP_HOME_TAG_MAX], msg[256], live[4300];
	ulp_err e = {msg, sizeof(msg)};
	int rc = remote_current(a, &c, etag, err);
	if (rc == -ULP_E_NOENT && h->creating)
		return 0;
	if (rc == -ULP_E_NOENT)
		return ULP_ERR(err, rc, "%s: %s: create one with 'ulpack init %s'", h->where, h->ops->no_pointer, h->where);
	ULP_TRY(rc);
	if (h->creating)
		return ULP_ERR(err, -ULP_E_EXIST, "%s: already an archive", h->where);
	snprintf(live, sizeof(live), "%s/ulpack.db", a->dir);
	struct stat sb;
	/* this home published that generation itself: its live index is as new,
	 * or newer (commits not published yet) */
	int keep = read_current(a->dir, &l, &e) == 0 && l.gen == c.gen && l.epoch == c.epoch && stat(live, &sb) == 0 &&
	           sb.st_size > 0;
	if (!keep) {
		char line[160];
		int n = format_current(&c, line, sizeof(line)), k;
		ULP_TRY(fetch_gen(a, &c, err));
		ULP_TRY(materialize(a, &c, live, err));
		char cur[4300];
		snprintf(cur, sizeof(cur), "%s/index/CURRENT", a->dir);
		if ((k = ulp_shared_replace_file(a, cur, line, (size_t)n, 1)) < 0)
			return ULP_ERR(err, k, "%s", ulp_msgs_get(a->msgs));
	}
	if ((rc = h->ops->list(h, "index/gen-", placeholder, a)) < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	h->floor_epoch = c.epoch;
	pthread_mutex_lock(&h->mu);
	snprintf(h->tag, sizeof(h->tag), "%s", etag);
	pthread_mutex_unlock(&h->mu);
	return 0;
}

int ulp_gen_remote_claim(ulp_archive *a, ulp_err *err)
{
	ulp_home *h = a->home;
	current c;
	char line[160], cur[4300];
	if (h->creating)
		return 0; /* the first publication creates the pointer */
	ULP_TRY(read_current(a->dir, &c, err));
	c.epoch = a->sh->epoch;
	int n = format_current(&c, line, sizeof(line));
	int rc = h->ops->put_if_match(h, "index/CURRENT", line, (size_t)n, h->tag);
	if (rc == -ULP_E_EXIST)
		return ULP_ERR(err, -ULP_E_BUSY, "%s: another writer took the archive while this one opened it (its "
		               "index/CURRENT changed): one writer at a time; mount read-only (-o ro) to follow it", h->where);
	if (rc < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	pthread_mutex_lock(&a->sh->mu);
	a->sh->gen = c.gen;
	a->sh->gen_epoch = c.epoch;
	pthread_mutex_unlock(&a->sh->mu);
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", a->dir);
	rc = ulp_shared_replace_file(a, cur, line, (size_t)n, 1);
	return rc < 0 ? ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs)) : 0;
}

/* Invariant 1 for a home apart from the directory: the generation file fin
 * there, created (never replaced: a generation of that number there is
 * another writer's). */
static int remote_put_gen(ulp_archive *a, uint64_t gen, int patch, const char *fin)
{
	char rel[64];
	gen_rel(gen, patch, rel, sizeof(rel));
	int rc = a->home->ops->put(a->home, rel, fin);
	if (rc == -ULP_E_EXIST) {
		ulp_lease_fence(a, "%s: generation %" PRIu64 " is in the bucket already: another writer published it; this "
		                "writer (epoch %" PRIu64 ") stopped archiving and publishing", a->home->where, gen, a->sh->epoch);
		return ulp_lease_ok(a);
	}
	return rc;
}

/* Invariant 2 for a home that swaps (remote.h invariant 2): the pointer swapped. */
static int remote_swap(ulp_archive *a, const char *line, size_t n)
{
	ulp_home *h = a->home;
	int rc = h->ops->put_if_match(h, "index/CURRENT", line, n, h->tag);
	if (rc == -ULP_E_EXIST) {
		ulp_lease_fence(a, "%s: another writer took the archive over (index/CURRENT is not as this writer left it): "
		                "this writer (epoch %" PRIu64 ") stopped archiving and publishing", h->where, a->sh->epoch);
		return ulp_lease_ok(a);
	}
	return rc;
}

/* ---- readers ------------------------------------------------------------ */

/* The newest pointer: the home's where it keeps one apart (a bucket), else
 * the directory's (invariant 7): 0, NOENT, CORRUPT, IO. */
static int home_pointer(ulp_archive *a, current *c, ulp_err *err)
{
	int rc = remote_current(a, c, NULL, err);
	return rc == -ULP_E_NOENT ? best_current(a->dir, c, err) : rc;
}

/* Follows generation c (a reader): new connections open it, whole or as a
 * patch over its base (genvfs.c). */
static int follow(ulp_archive *a, const current *c, ulp_err *err)
{
	char p[4200], b[4200];
	int patch = c->base != c->gen;
	gen_path(a, c->gen, patch, p, sizeof(p));
	struct stat sb;
	if (stat(p, &sb) < 0)
		return ULP_ERR(err, errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO,
		               "%s: generation %" PRIu64 " that index/CURRENT names: %s", p, c->gen, strerror(errno));
	if ((uint64_t)sb.st_size != c->bytes)
		return ULP_ERR(err, -ULP_E_CORRUPT, "%s: %lld bytes where index/CURRENT says %" PRIu64 " (not whole yet?)",
		               p, (long long)sb.st_size, c->bytes);
	char *uri;
	if (!patch) {
		uri = ulp_db_file_uri(p, "immutable=1");
	} else {
		if (ulp_genvfs_register() < 0)
			return ULP_ERR(err, -ULP_E_UNSUPPORTED, "%s: this SQLite cannot read a patched generation", p);
		char *pq = ulp_db_file_uri(p, ""), q[8800];
		if (!pq)
			return -ULP_E_NOMEM;
		/* the patch's path, as a URI parameter (its file: prefix and ? off) */
		size_t l = strlen(pq);
		snprintf(q, sizeof(q), "immutable=1&vfs=ulpgen&patch=%.*s", (int)(l - 6), pq + 5);
		free(pq);
		gen_path(a, c->base, 0, b, sizeof(b));
		uri = ulp_db_file_uri(b, q);
	}
	if (!uri)
		return -ULP_E_NOMEM;
	ulp_db_set_follow(a, uri);
	pthread_mutex_lock(&a->sh->mu);
	a->sh->gen = c->gen;
	a->sh->gen_epoch = c->epoch;
	pthread_mutex_unlock(&a->sh->mu);
	return 0;
}

int ulp_gen_reader_open(ulp_archive *a, ulp_err *err)
{
	current c;
	int rc = home_pointer(a, &c, err);
	if (rc == 0)
		rc = fetch_gen(a, &c, err);
	if (rc == -ULP_E_NOENT)
		return ULP_ERR(err, rc, "%s: %s", a->home->where, a->home->ops->no_pointer);
	ULP_TRY(rc);
	ULP_TRY(follow(a, &c, err));
	__atomic_store_n(&a->sh->next_poll_ms, ulp_mono_ms() + a->sh->poll_ms, __ATOMIC_RELAXED);
	return 0;
}

/* A look at CURRENT, and a newer generation followed (invariant 2). */
static void poll_now(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	current c;
	char msg[512];
	ulp_err e = {msg, sizeof(msg)};
	if (home_pointer(a, &c, &e) < 0)
		return; /* the generation followed stays */
	pthread_mutex_lock(&sh->mu);
	int newer = c.epoch >= sh->gen_epoch && c.gen > sh->gen;
	pthread_mutex_unlock(&sh->mu);
	if (newer && fetch_gen(a, &c, &e) == 0 && follow(a, &c, &e) == 0)
		drop_fetched(a, &c); /* (a generation not whole yet: the next poll) */
}

/* ---- the background thread of an archive in a bucket (invariant 9) -------- */

static int poller_stopped(void *arg)
{
	ulp_shared *sh = arg;
	pthread_mutex_lock(&sh->mu);
	int stop = sh->poller_stop;
	pthread_mutex_unlock(&sh->mu);
	return stop;
}

static void *poller(void *arg)
{
	ulp_archive *a = arg;
	ulp_shared *sh = a->sh;
	ulp_set_interrupt(poller_stopped, sh); /* the close ends its requests */
	pthread_mutex_lock(&sh->mu);
	for (;;) {
		while (!sh->poller_stop && !sh->poll_wanted && !sh->usage_wanted)
			pthread_cond_wait(&sh->poll_cv, &sh->mu);
		if (sh->poller_stop)
			break;
		int poll = sh->poll_wanted, usage = sh->usage_wanted;
		sh->poll_wanted = sh->usage_wanted = 0;
		pthread_mutex_unlock(&sh->mu);
		if (poll)
			poll_now(a);
		if (usage)
			a->home->ops->usage(a->home); /* (a failure: the last figures stay) */
		pthread_mutex_lock(&sh->mu);
		if (usage) {
			sh->usage_rounds++;
			pthread_cond_broadcast(&sh->poll_cv);
		}
	}
	pthread_mutex_unlock(&sh->mu);
	return NULL;
}

/* Wakes the poller (started first where this process has none) for a poll
 * or a listing. */
static void poller_kick(ulp_archive *a, int poll, int usage)
{
	ulp_shared *sh = a->sh;
	long me = (long)getpid();
	pthread_mutex_lock(&sh->mu);
	if (sh->poller_pid != me && !sh->poller_stop && pthread_create(&sh->poller, NULL, poller, a) == 0)
		__atomic_store_n(&sh->poller_pid, me, __ATOMIC_RELEASE);
	sh->poll_wanted |= poll;
	sh->usage_wanted |= usage;
	pthread_cond_broadcast(&sh->poll_cv);
	pthread_mutex_unlock(&sh->mu);
}

static void poller_stop(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	pthread_mutex_lock(&sh->mu);
	sh->poller_stop = 1;
	pthread_cond_broadcast(&sh->poll_cv);
	int mine = sh->poller_pid == (long)getpid();
	pthread_mutex_unlock(&sh->mu);
	if (mine)
		pthread_join(sh->poller, NULL);
}

void ulp_gen_usage_refresh(ulp_archive *a, unsigned wait_ms)
{
	ulp_shared *sh = a->sh;
	if (!sh || !a->home->ops->background)
		return;
	pthread_mutex_lock(&sh->mu);
	uint64_t before = sh->usage_rounds;
	pthread_mutex_unlock(&sh->mu);
	poller_kick(a, 0, 1);
	if (!wait_ms)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += wait_ms / 1000;
	ts.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&sh->mu);
	while (sh->usage_rounds == before && !sh->poller_stop)
		if (pthread_cond_timedwait(&sh->poll_cv, &sh->mu, &ts) != 0)
			break;
	pthread_mutex_unlock(&sh->mu);
}

/* A reader looks at CURRENT when its poll interval has passed (force: now),
 * one thread at a time; in a bucket, its poller looks (invariant 9). */
void ulp_gen_poll(ulp_archive *a, int force)
{
	ulp_shared *sh = a->sh;
	if (!sh || sh->writer)
		return;
	int64_t now = ulp_mono_ms(), due = __atomic_load_n(&sh->next_poll_ms, __ATOMIC_RELAXED);
	if (!force && now < due)
		return;
	if (!__atomic_compare_exchange_n(&sh->next_poll_ms, &due, now + sh->poll_ms, 0, __ATOMIC_RELAXED,
	                                 __ATOMIC_RELAXED))
		return; /* another thread looks */
	if (a->home->ops->background)
		poller_kick(a, 1, 0);
	else
		poll_now(a);
}

void ulp_gen_follow(ulp_archive *a)
{
	if (!a->follow)
		return;
	ulp_gen_poll(a, 0);
	ulp_db_refollow(a);
}

void ulp_gen_refresh(ulp_archive *a)
{
	ulp_gen_poll(a, 1);
}

/* ---- the writer ----------------------------------------------------------- */

static void live_path(const ulp_archive *a, uint64_t epoch, char *p, size_t cap)
{
	snprintf(p, cap, "%s/index/live-%020" PRIu64 ".db", a->dir, epoch);
}

/* Whether index/ holds a per-epoch pointer (an archive whose writers keep
 * their live index per epoch: invariant 7). */
static int has_epoch_pointers(const ulp_archive *a)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/index", a->dir);
	DIR *d = opendir(p);
	int found = 0;
	for (struct dirent *e; d && !found && (e = readdir(d));)
		found = !strncmp(e->d_name, "CURRENT-", 8) && strlen(e->d_name) == 28;
	if (d)
		closedir(d);
	return found;
}

int ulp_gen_writer_open(ulp_archive *a, ulp_err *err)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer)
		return 0;
	current c;
	if (!has_epoch_pointers(a)) /* (none in a home that swaps its pointer) */
		return 0; /* an archive of an older writer: its ulpack.db this once */
	int rc = best_current(a->dir, &c, err);
	if (rc == -ULP_E_NOENT)
		return 0;
	ULP_TRY(rc);
	char p[4200];
	live_path(a, sh->epoch, p, sizeof(p));
	ULP_TRY(materialize(a, &c, p, err));
	if (!(a->w->live = strdup(p)))
		return -ULP_E_NOMEM;
	pthread_mutex_lock(&sh->mu);
	sh->gen = c.gen;
	sh->gen_epoch = c.epoch;
	pthread_mutex_unlock(&sh->mu);
	return 0;
}

/* The epoch of an index/ name of an earlier epoch's file: its pointer
 * (CURRENT-E) or live index (live-E.db and its -wal, -shm, temporaries);
 * 0: neither. *live: a live index file. */
static uint64_t old_epoch_of(const char *name, int *live)
{
	uint64_t ep = 0;
	int at = 0;
	*live = 0;
	if (sscanf(name, "CURRENT-%20" SCNu64 "%n", &ep, &at) == 1 && at == 28)
		return ep;
	if (sscanf(name, "live-%20" SCNu64 "%n", &ep, &at) == 1 && at == 25) {
		*live = 1;
		return ep;
	}
	return 0;
}

/* What earlier epochs left in index/: their pointers (this writer's own
 * names every generation) and their live index files, which only their
 * fenced writers would still write (invariant 7); but the live files of an
 * epoch whose lease file is still there (lease.c keeps it while its writer
 * may still run, fenced: such a mount reads its files through them until it
 * is unmounted). */
static int drop_old_epochs(ulp_archive *a)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/index", a->dir);
	DIR *d = opendir(p);
	if (!d)
		return -1;
	int live;
	for (struct dirent *e; (e = readdir(d));) {
		uint64_t ep = old_epoch_of(e->d_name, &live);
		char f[4600];
		if (!ep || ep >= a->sh->epoch)
			continue;
		snprintf(f, sizeof(f), "%s/lease/%020" PRIu64, a->dir, ep);
		if (live && access(f, F_OK) == 0)
			continue;
		snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
		unlink(f);
	}
	closedir(d);
	return 0;
}

/* Invariant 8: a staged file archived by this writer stays in staging/
 * until a generation that holds it is published. */
int ulp_shared_retain(ulp_archive *a, const char *data, const char *meta)
{
	ulp_shared *sh = a->sh;
	ulp_retained *r = malloc(sizeof(*r));
	if (r && !(r->data = strdup(data))) {
		free(r);
		r = NULL;
	}
	if (r && !(r->meta = strdup(meta))) {
		free(r->data);
		free(r);
		r = NULL;
	}
	if (!r)
		return -ULP_E_NOMEM;
	pthread_mutex_lock(&sh->mu);
	r->seq = sh->pub_started; /* its commit is complete: a publication started later holds it */
	r->next = sh->retained;
	sh->retained = r;
	pthread_mutex_unlock(&sh->mu);
	return 0;
}

/* Whether a staged file waits for a publication that starts after seq. */
static int retained_before(ulp_shared *sh, uint64_t seq)
{
	pthread_mutex_lock(&sh->mu);
	int any = 0;
	for (ulp_retained *r = sh->retained; r && !any; r = r->next)
		any = r->seq < seq;
	pthread_mutex_unlock(&sh->mu);
	return any;
}

/* The staged files that the publication numbered seq made safe (retained
 * before it started): their files go. */
static void release_retained(ulp_archive *a, uint64_t seq)
{
	ulp_shared *sh = a->sh;
	ulp_retained *go = NULL;
	pthread_mutex_lock(&sh->mu);
	for (ulp_retained **pp = &sh->retained; *pp;) {
		ulp_retained *r = *pp;
		if (r->seq < seq) {
			*pp = r->next;
			r->next = go;
			go = r;
		} else {
			pp = &r->next;
		}
	}
	pthread_mutex_unlock(&sh->mu);
	while (go) {
		ulp_retained *n = go->next;
		unlink(go->data);
		unlink(go->meta);
		free(go->data);
		free(go->meta);
		free(go);
		go = n;
	}
}

void ulp_shared_forget_retained(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	while (sh && sh->retained) {
		ulp_retained *n = sh->retained->next;
		free(sh->retained->data);
		free(sh->retained->meta);
		free(sh->retained);
		sh->retained = n;
	}
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

/* A published copy is a rollback-journal database to its readers (header
 * bytes 18 and 19: no WAL), which open it immutable. */
static void unwal(uint8_t *page1)
{
	page1[18] = page1[19] = 1;
}

/* One page at a time over the live ulpack.db after a full checkpoint, which
 * holds every committed page while no other checkpoint runs (invariant 5):
 * the pages that differ from the base go into *chg (up to limit bytes; -1
 * past it), every page's hash into hash. */
#define SCAN_BLOCK ((size_t)1 << 20)
#define PATCH_MIN ((uint64_t)256 << 10) /* a small index's patch may exceed a quarter of it */

typedef struct scan {
	uint32_t ps, pages;
	uint64_t *hash;       /* pages entries */
	uint8_t *chg;         /* changed pages, n_chg of them */
	uint32_t *chg_no;
	uint32_t n_chg;
	int over;             /* more than the limit changed: publish whole */
} scan;

static int scan_live(ulp_archive *a, int fd, const char *path, uint64_t size, uint64_t limit, scan *sc)
{
	ulp_shared *sh = a->sh;
	uint8_t *blk = malloc(SCAN_BLOCK);
	sc->hash = malloc((sc->pages ? sc->pages : 1) * sizeof(*sc->hash));
	if (!blk || !sc->hash) {
		free(blk);
		return -ULP_E_NOMEM;
	}
	size_t cap = 0;
	int rc = 0;
	uint32_t per = (uint32_t)(SCAN_BLOCK / sc->ps);
	for (uint32_t pg = 0; rc == 0 && pg < sc->pages; pg += per) {
		uint32_t k = ULP_MIN(per, sc->pages - pg);
		if ((errno = ulp_pread_full(fd, blk, (size_t)k * sc->ps, (uint64_t)pg * sc->ps)) != 0) {
			rc = ulp_arch_io_err(a, path, "read");
			break;
		}
		for (uint32_t i = 0; i < k; i++) {
			const uint8_t *page = blk + (size_t)i * sc->ps;
			uint32_t no = pg + i + 1;
			sc->hash[no - 1] = ulp_xxh64(page, sc->ps);
			int same = no != 1 && sh->base_hash && no <= sh->base_pages && sh->base_hash[no - 1] == sc->hash[no - 1];
			if (same || sc->over)
				continue;
			if ((uint64_t)(sc->n_chg + 1) * sc->ps > limit) {
				sc->over = 1;
				continue;
			}
			if (sc->n_chg == cap) {
				size_t nc = cap ? cap * 2 : 64;
				uint8_t *np = realloc(sc->chg, nc * sc->ps);
				uint32_t *nn = np ? realloc(sc->chg_no, nc * sizeof(*nn)) : NULL;
				if (np)
					sc->chg = np;
				if (!nn) {
					rc = -ULP_E_NOMEM;
					break;
				}
				sc->chg_no = nn;
				cap = nc;
			}
			memcpy(sc->chg + (size_t)sc->n_chg * sc->ps, page, sc->ps);
			sc->chg_no[sc->n_chg++] = no;
		}
	}
	free(blk);
	(void)size;
	return rc;
}

/* Writes the whole live file (scanned: its hashes in sc) into tmp. */
static int write_whole(ulp_archive *a, int in, const char *path, const char *tmp, int out, const scan *sc)
{
	uint8_t *blk = malloc(SCAN_BLOCK);
	if (!blk)
		return -ULP_E_NOMEM;
	uint64_t size = (uint64_t)sc->pages * sc->ps;
	int rc = 0;
	for (uint64_t off = 0; rc == 0 && off < size; off += SCAN_BLOCK) {
		size_t n = (size_t)ULP_MIN((uint64_t)SCAN_BLOCK, size - off);
		if ((errno = ulp_pread_full(in, blk, n, off)) != 0)
			rc = ulp_arch_io_err(a, path, "read");
		else {
			if (off == 0)
				unwal(blk);
			if ((errno = ulp_pwrite_full(out, blk, n, off)) != 0)
				rc = ulp_arch_io_err(a, tmp, "write");
		}
	}
	free(blk);
	return rc;
}

/* Writes the changed pages as a patch of the base (genvfs.c's format). */
static int write_patch(ulp_archive *a, const char *tmp, int out, const scan *sc)
{
	size_t n = sc->n_chg, body = n * 4 + n * (size_t)sc->ps;
	uint8_t *m = malloc(ULP_GENPATCH_HEADER + body);
	if (!m)
		return -ULP_E_NOMEM;
	memcpy(m, "ULPGENP1", 8);
	put64(m + 8, a->sh->base_gen);
	put32(m + 16, sc->ps);
	put32(m + 20, sc->pages);
	put32(m + 24, (uint32_t)n);
	put32(m + 28, 0);
	uint8_t *q = m + ULP_GENPATCH_HEADER;
	for (size_t i = 0; i < n; i++)
		put32(q + 4 * i, sc->chg_no[i]);
	memcpy(q + 4 * n, sc->chg, n * (size_t)sc->ps);
	if (n && sc->chg_no[0] == 1)
		unwal(q + 4 * n);
	put64(m + 32, ulp_xxh64(q, body));
	int rc = (errno = ulp_pwrite_full(out, m, ULP_GENPATCH_HEADER + body, 0)) != 0 ? ulp_arch_io_err(a, tmp, "write") : 0;
	free(m);
	return rc;
}

/* A consistent copy of the live index into the new file path (0600): SQLite's
 * online backup in one step (one read transaction), page for page, so that
 * its pages compare with a base's as the checkpointed file's do. */
static int backup_copy(ulp_archive *a, sqlite3 *src, const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600); /* private: archive.c */
	if (fd < 0)
		return ulp_arch_io_err(a, path, "create");
	close(fd);
	sqlite3 *dst = NULL;
	int rc = sqlite3_open_v2(path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
	sqlite3_backup *b = rc == SQLITE_OK ? sqlite3_backup_init(dst, "main", src, "main") : NULL;
	int code = 0;
	if (!b) {
		code = ulp_arch_err(a, -ULP_E_IO, "%s: %s", path, dst ? sqlite3_errmsg(dst) : sqlite3_errstr(rc));
	} else {
		int st = sqlite3_backup_step(b, -1);
		sqlite3_backup_finish(b);
		if (st != SQLITE_DONE)
			code = ulp_arch_err(a, st == SQLITE_FULL ? -ULP_E_NOSPC : -ULP_E_IO, "%s: copying the index: %s", path,
			                    sqlite3_errstr(st));
	}
	sqlite3_close(dst);
	if (code < 0)
		unlink(path);
	return code;
}

/* The whole generation gen, published by an earlier writer of this index,
 * as this writer's base: its pages' hashes (page 1 is always patched). */
/* index/gen-G.hash: the page hashes of whole generation G, so that the next
 * writer need not read G again ("ULPGENH1", u64 G, u32 page size, u32
 * pages, u64 XXH3-64 of the hashes, then the hashes; little endian, as
 * every host of this project). A sidecar that does not check is ignored. */
#define HASH_HEADER 32

static void hash_path(const ulp_archive *a, uint64_t gen, char *p, size_t cap)
{
	snprintf(p, cap, "%s/index/gen-%020" PRIu64 ".hash", a->dir, gen);
}

static void write_hashes(ulp_archive *a, uint64_t gen, uint32_t ps, uint32_t pages, const uint64_t *h)
{
	size_t n = HASH_HEADER + (size_t)pages * 8;
	uint8_t *m = malloc(n);
	if (!m)
		return; /* a hint: the next writer reads the generation instead */
	memcpy(m, "ULPGENH1", 8);
	put64(m + 8, gen);
	put32(m + 16, ps);
	put32(m + 20, pages);
	memcpy(m + HASH_HEADER, h, (size_t)pages * 8);
	put64(m + 24, ulp_xxh64(m + HASH_HEADER, (size_t)pages * 8));
	char p[4200];
	hash_path(a, gen, p, sizeof(p));
	ulp_shared_replace_file(a, p, (const char *)m, n, 0);
	free(m);
}

static uint64_t *read_hashes(ulp_archive *a, uint64_t gen, uint32_t ps, uint32_t pages)
{
	char p[4200];
	hash_path(a, gen, p, sizeof(p));
	size_t n = HASH_HEADER + (size_t)pages * 8;
	uint8_t *m = malloc(n);
	int fd = m ? open(p, O_RDONLY | O_CLOEXEC) : -1;
	struct stat sb;
	int ok = fd >= 0 && fstat(fd, &sb) == 0 && (size_t)sb.st_size == n && ulp_pread_full(fd, m, n, 0) == 0 &&
	         !memcmp(m, "ULPGENH1", 8);
	if (fd >= 0)
		close(fd);
	uint64_t g = 0, sum = 0;
	uint32_t gps = 0, gpages = 0;
	if (ok) {
		memcpy(&g, m + 8, 8);
		memcpy(&gps, m + 16, 4);
		memcpy(&gpages, m + 20, 4);
		memcpy(&sum, m + 24, 8);
		ok = g == gen && gps == ps && gpages == pages && sum == ulp_xxh64(m + HASH_HEADER, (size_t)pages * 8);
	}
	uint64_t *h = ok ? malloc((pages ? pages : 1) * sizeof(*h)) : NULL;
	if (h)
		memcpy(h, m + HASH_HEADER, (size_t)pages * 8);
	free(m);
	return h;
}

static void adopt_base(ulp_archive *a, uint64_t gen, uint32_t ps)
{
	ulp_shared *sh = a->sh;
	char p[4200];
	gen_path(a, gen, 0, p, sizeof(p));
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0)
		return;
	scan sc = {.ps = ps};
	uint64_t *known = NULL;
	if (fstat(fd, &sb) == 0 && sb.st_size % ps == 0 && sb.st_size > 0 &&
	    (known = read_hashes(a, gen, ps, (uint32_t)(sb.st_size / ps))) != NULL) {
		free(sh->base_hash);
		sh->base_hash = known;
		sh->base_gen = gen;
		sh->base_page_size = ps;
		sh->base_pages = (uint32_t)(sb.st_size / ps);
	} else if (fstat(fd, &sb) == 0 && sb.st_size % ps == 0 && sb.st_size > 0) {
		sc.pages = (uint32_t)(sb.st_size / ps);
		uint64_t *keep = sh->base_hash;
		sh->base_hash = NULL; /* (scan_live compares with nothing: hashes only) */
		if (scan_live(a, fd, p, (uint64_t)sb.st_size, 0, &sc) == 0) {
			free(keep);
			sh->base_hash = sc.hash;
			sh->base_gen = gen;
			sh->base_page_size = ps;
			sh->base_pages = sc.pages;
			sc.hash = NULL;
		} else {
			sh->base_hash = keep;
		}
	}
	free(sc.hash);
	free(sc.chg);
	free(sc.chg_no);
	close(fd);
}

/*
 * Publishes the live index as a new generation (invariants 1, 2, 5); without
 * force, only where it changed since the last one. A checkpoint first puts
 * every committed page into ulpack.db; the pages that differ from the base
 * generation are then written as a patch of it (genvfs.c), or, where they
 * are more than a quarter of the index (or there is no base), the whole
 * file as a new base. Publication then costs what changed since the base,
 * not the index's size (a thousand steps of 300 tensors: 66 MB).
 */
unsigned ulp_gen_test_publish_delay_ms;

int ulp_gen_publish(ulp_archive *a, int force)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer)
		return 0;
	pthread_mutex_lock(&sh->pub_mu);
	/* every commit of this process counts (db.c's commit hook): the lease
	 * keeps other processes from writing */
	pthread_mutex_lock(&sh->mu);
	uint64_t seq = ++sh->pub_started; /* invariant 8 */
	pthread_mutex_unlock(&sh->mu);
	uint64_t changes = __atomic_load_n(&a->w->commits, __ATOMIC_RELAXED);
	int rc = ulp_lease_ok(a);
	if (rc == 0 && !__atomic_load_n(&sh->opened, __ATOMIC_ACQUIRE))
		rc = ulp_arch_err(a, -ULP_E_INVAL, "%s: the archive did not open: nothing of it is published", a->dir);
	if (rc < 0 || (!force && changes == sh->published_changes && !retained_before(sh, seq))) {
		pthread_mutex_unlock(&sh->pub_mu);
		return rc;
	}
	int64_t t0 = ulp_mono_ms();
	unsigned delay = __atomic_load_n(&ulp_gen_test_publish_delay_ms, __ATOMIC_RELAXED);
	if (delay)
		usleep(delay * 1000); /* tests: a slow file system */
	sqlite3 *db = ulp_db(a);
	if (!db)
		rc = ulp_db_err(a, "open");
	/* a full checkpoint, waiting a little for readers of older snapshots;
	 * where one stays (a statement of another thread not reset yet), a
	 * consistent copy through SQLite's online backup is read instead */
	int log = -1, done = -1, full = 0;
	if (rc == 0) {
		sqlite3_busy_timeout(db, 300);
		full = sqlite3_wal_checkpoint_v2(db, NULL, SQLITE_CHECKPOINT_TRUNCATE, &log, &done) == SQLITE_OK &&
		       log == done;
		sqlite3_busy_timeout(db, 30000);
	}
	char live[4300], snap[4300];
	ulp_db_live_path(a, live, sizeof(live));
	char me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	snprintf(snap, sizeof(snap), "%s/index/snap-%s", a->dir, me);
	if (rc == 0 && !full) {
		unlink(snap);
		rc = backup_copy(a, db, snap);
		snprintf(live, sizeof(live), "%s", snap);
	}
	int64_t t_ckpt = ulp_mono_ms();
	genfile *gens = NULL;
	size_t ng = 0;
	current c = {0};
	char msg[256], tmp[4300], fin[4200], cur[4200];
	ulp_err e = {msg, sizeof(msg)};
	if (rc == 0)
		rc = list_gens(a, &gens, &ng);
	uint64_t next = ng ? gens[ng - 1].gen + 1 : 1;
	free(gens);
	if (rc == 0 && best_current(a->dir, &c, &e) == 0 && c.gen >= next)
		next = c.gen + 1;
	uint64_t first = a->home->ops->first_gen(sh->epoch); /* remote.h invariant 4: this epoch's own numbers */
	if (next < first)
		next = first;
	snprintf(tmp, sizeof(tmp), "%s/index/tmp-%s-%" PRIu64, a->dir, me, next);
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", a->dir);
	int in = rc == 0 ? open(live, O_RDONLY | O_CLOEXEC) : -1;
	if (rc == 0 && in < 0)
		rc = ulp_arch_io_err(a, live, "open");
	uint8_t hdr[100];
	struct stat sb;
	scan sc = {0};
	if (rc == 0 && (fstat(in, &sb) < 0 || (errno = ulp_pread_full(in, hdr, sizeof(hdr), 0)) != 0))
		rc = ulp_arch_io_err(a, live, "read");
	if (rc == 0) {
		sc.ps = (uint32_t)hdr[16] << 8 | hdr[17];
		if (sc.ps == 1)
			sc.ps = 65536;
		if (sc.ps < 512 || (sc.ps & (sc.ps - 1)) || sb.st_size % sc.ps)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: page size %u, %lld bytes", live, sc.ps, (long long)sb.st_size);
		sc.pages = sc.ps ? (uint32_t)(sb.st_size / sc.ps) : 0;
	}
	if (rc == 0 && !sh->base_gen && c.gen)
		adopt_base(a, c.base, sc.ps); /* a new writer builds on its predecessor's base */
	int whole = !sh->base_gen || sh->base_page_size != sc.ps || force > 1;
	if (rc == 0)
		rc = scan_live(a, in, live, (uint64_t)sb.st_size,
		               whole ? 0 : ULP_MAX((uint64_t)sb.st_size / 4, PATCH_MIN), &sc);
	whole = whole || sc.over;
	int64_t t_scan = ulp_mono_ms();
	gen_path(a, next, !whole, fin, sizeof(fin));
	unlink(tmp);
	int out = rc == 0 ? open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1; /* private: archive.c */
	if (rc == 0 && out < 0)
		rc = ulp_arch_io_err(a, tmp, "create");
	if (rc == 0)
		rc = whole ? write_whole(a, in, live, tmp, out, &sc) : write_patch(a, tmp, out, &sc);
	if (rc == 0 && fsync(out) < 0)
		rc = ulp_arch_io_err(a, tmp, "fsync");
	struct stat ob;
	if (rc == 0 && fstat(out, &ob) < 0)
		rc = ulp_arch_io_err(a, tmp, "stat");
	if (out >= 0)
		close(out);
	if (in >= 0)
		close(in);
	/* invariant 7: a generation file is created, never replaced (a link
	 * fails where the name exists): a fenced writer's late one cannot take
	 * the place of this writer's, nor this writer's the place of its */
	for (int tries = 0; rc == 0; tries++) {
		if (link(tmp, fin) == 0) {
			unlink(tmp);
			break;
		}
		if (errno != EEXIST || tries >= a->home->ops->relink) {
			rc = ulp_arch_io_err(a, fin, "link");
			break;
		}
		gen_path(a, ++next, !whole, fin, sizeof(fin));
	}
	if (rc == 0) {
		char idx[4200];
		snprintf(idx, sizeof(idx), "%s/index", a->dir);
		if ((errno = ulp_fsync_dir(idx)) != 0)
			rc = ulp_arch_io_err(a, idx, "fsync");
	}
	if (rc == 0)
		rc = remote_put_gen(a, next, !whole, fin);
	if (rc == 0)
		rc = ulp_lease_ok(a); /* invariant 2: the last look before the pointer moves */
	if (rc == 0) {
		char line[160];
		current nc = {next, sh->epoch, (uint64_t)ob.st_size, whole ? next : sh->base_gen};
		int l = format_current(&nc, line, sizeof(line));
		if (a->home->ops->swaps) {
			rc = remote_swap(a, line, (size_t)l);
		} else { /* invariant 7: this epoch's own pointer first */
			char ep[4200];
			epoch_pointer_path(a, sh->epoch, ep, sizeof(ep));
			rc = ulp_shared_replace_file(a, ep, line, (size_t)l, 1);
		}
		if (rc == 0)
			rc = ulp_shared_replace_file(a, cur, line, (size_t)l, 1);
	}
	if (rc < 0) {
		unlink(tmp);
		free(sc.hash);
	} else {
		if (whole) { /* the new base */
			write_hashes(a, next, sc.ps, sc.pages, sc.hash);
			free(sh->base_hash);
			sh->base_hash = sc.hash;
			sh->base_gen = next;
			sh->base_page_size = sc.ps;
			sh->base_pages = sc.pages;
		} else {
			free(sc.hash);
		}
		sh->published_changes = changes;
		sh->published_ms = ulp_mono_ms();
		if (getenv("ULP_DEBUG_PUBLISH")) /* (measuring: bench, the figures) */
			fprintf(stderr, "ulpack: published generation %" PRIu64 ": %s, %lld bytes of an index of %lld, %lld ms"
			        " (checkpoint %lld, scan %lld, write %lld)\n", next, whole ? "whole" : "patch",
			        (long long)ob.st_size, (long long)sb.st_size, (long long)(sh->published_ms - t0),
			        (long long)(t_ckpt - t0), (long long)(t_scan - t_ckpt), (long long)(sh->published_ms - t_scan));
		pthread_mutex_lock(&sh->mu);
		sh->gen = next;
		sh->gen_epoch = sh->epoch;
		pthread_mutex_unlock(&sh->mu);
		release_retained(a, seq);
		if (!sh->old_pointers_gone) /* (none where the home swaps its pointer) */
			sh->old_pointers_gone = drop_old_epochs(a) == 0;
	}
	free(sc.chg);
	free(sc.chg_no);
	if (!full)
		unlink(snap);
	pthread_mutex_unlock(&sh->pub_mu);
	if (rc == 0)
		ulp_gen_retire(a);
	return rc;
}

/* The base generation a patch file names (0: unreadable). */
static uint64_t patch_base(ulp_archive *a, uint64_t gen)
{
	char p[4200];
	uint8_t h[16];
	gen_path(a, gen, 1, p, sizeof(p));
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	int ok = fd >= 0 && ulp_pread_full(fd, h, sizeof(h), 0) == 0 && !memcmp(h, "ULPGENP1", 8);
	if (fd >= 0)
		close(fd);
	if (!ok)
		return 0;
	uint64_t b = 0;
	for (int i = 7; i >= 0; i--)
		b = b << 8 | h[8 + i];
	return b;
}

/* Invariant 4: removes the generations no reader needs any more (a base
 * stays while a kept patch builds on it), and the temporaries of dead
 * publications. */
void ulp_gen_retire(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer || __atomic_load_n(&sh->fenced, __ATOMIC_RELAXED))
		return;
	genfile *g;
	size_t n;
	if (list_gens(a, &g, &n) < 0)
		return;
	pthread_mutex_lock(&sh->mu);
	uint64_t cur = sh->gen;
	pthread_mutex_unlock(&sh->mu);
	pthread_mutex_lock(&sh->pub_mu);
	uint64_t base = sh->base_gen;
	pthread_mutex_unlock(&sh->pub_mu);
	int64_t now = ulp_wall_ms(), grace = (int64_t)sh->grace_s * 1000;
	char *keep = calloc(n ? n : 1, 1);
	size_t kept = 0;
	for (size_t i = n; keep && i-- > 0;) {
		if (g[i].gen >= cur || i + 1 == n) {
			keep[i] = 1; /* the current one (the newest file) */
			continue;
		}
		/* superseded when its successor was published */
		if (kept < ULP_GEN_KEEP && now - g[i + 1].at < grace) {
			keep[i] = 1;
			kept++;
		}
	}
	uint64_t oldest = 0; /* kept as a generation, not only as a base */
	for (size_t i = 0; keep && i < n && !oldest; i++)
		oldest = keep[i] ? g[i].gen : 0;
	pthread_mutex_lock(&sh->mu);
	sh->oldest_kept = keep ? oldest : 0;
	pthread_mutex_unlock(&sh->mu);
	for (size_t i = 0; keep && i < n; i++) { /* the bases of the patches kept, and the writer's own */
		uint64_t b = g[i].gen == base ? base : keep[i] && g[i].patch ? patch_base(a, g[i].gen) : 0;
		for (size_t j = 0; b && j < n; j++)
			if (g[j].gen == b && !g[j].patch)
				keep[j] = 1;
	}
	for (size_t i = 0; keep && i < n; i++)
		if (!keep[i]) {
			char p[4200];
			gen_path(a, g[i].gen, g[i].patch, p, sizeof(p));
			unlink(p);
			char rel[64]; /* the home's too (a bucket's readers fetched theirs whole) */
			gen_rel(g[i].gen, g[i].patch, rel, sizeof(rel));
			a->home->ops->del(a->home, rel);
			hash_path(a, g[i].gen, p, sizeof(p));
			unlink(p); /* (a whole one's) */
		}
	free(keep);
	free(g);
}

/* ---- the public face ------------------------------------------------------- */

int ulp_archive_publish(ulp_archive *a)
{
	return a->sh && a->sh->writer ? ulp_gen_publish(a, 0) : 0;
}

int ulp_archive_generation(ulp_archive *a, ulp_generation *g)
{
	memset(g, 0, sizeof(*g));
	ulp_shared *sh = a->sh;
	if (!sh)
		return 0;
	ulp_gen_poll(a, 0);
	g->shared = 1;
	g->writer = sh->writer;
	g->contributor = a->contrib != NULL;
	g->fenced = __atomic_load_n(&sh->fenced, __ATOMIC_RELAXED);
	pthread_mutex_lock(&sh->mu);
	g->gen = sh->gen;
	g->epoch = sh->writer ? sh->epoch : sh->gen_epoch;
	pthread_mutex_unlock(&sh->mu);
	g->poll_ms = sh->poll_ms;
	g->lease_ms = sh->lease_ms;
	g->grace_s = sh->grace_s;
	return 0;
}

int64_t ulp_gen_published_ms(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh)
		return 0;
	if (sh->writer) { /* the publisher's clock is monotonic: as wall time */
		pthread_mutex_lock(&sh->pub_mu);
		int64_t pub = sh->published_ms;
		pthread_mutex_unlock(&sh->pub_mu);
		return pub > 0 ? ulp_wall_ms() - (ulp_mono_ms() - pub) : 0;
	}
	pthread_mutex_lock(&sh->mu);
	uint64_t gen = sh->gen;
	pthread_mutex_unlock(&sh->mu);
	if (!gen || a->home->ops->swaps)
		return 0; /* (a home that swaps its pointer, a bucket: its generations are fetched copies, their mtimes not the publication) */
	char p[4200];
	struct stat sb;
	for (int patch = 0; patch < 2; patch++) {
		gen_path(a, gen, patch, p, sizeof(p));
		if (stat(p, &sb) == 0)
			return (int64_t)sb.st_mtim.tv_sec * 1000 + sb.st_mtim.tv_nsec / 1000000;
	}
	return 0;
}
