/* SPDX-License-Identifier: MIT */
/*
 * gen.c - published index generations (shared.h has the files): the writer
 * copies its live index into a new generation after each archived batch and
 * at sync; readers on any host open the newest one immutable and follow the
 * next ones; a generation superseded more than the grace ago goes, and with
 * it the packs the index dropped before it (pack_grace, maint.c).
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
 *     (ulp_db_follow, at the library's read entry points, when the thread's
 *     connection runs no statement); an open file needs no index after its
 *     open (read.c invariant 3), so it keeps the bytes of its generation.
 *  4. Retirement (ulp_gen_retire) keeps the current generation and, of the
 *     others, the newest ULP_GEN_KEEP that were superseded less than the
 *     grace ago; a generation file is the only thing a reader opens by name,
 *     and a pack a retained generation names is never removed (maint.c
 *     invariant 7).
 */
#include "shared.h"
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

int64_t ulp_mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ulp_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* Writes data into path whole, through path.tmp-PID and a rename; durable:
 * fsynced with its directory. */
static int replace_file(ulp_archive *a, const char *path, const char *data, size_t n, int durable)
{
	char tmp[4300];
	snprintf(tmp, sizeof(tmp), "%s.tmp-%ld", path, (long)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	size_t done = 0;
	while (done < n) {
		ssize_t w = write(fd, data + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		done += (size_t)w;
	}
	int e = done == n ? 0 : errno ? errno : ENOSPC;
	if (!e && durable && fsync(fd) < 0)
		e = errno;
	close(fd);
	if (!e && rename(tmp, path) < 0)
		e = errno;
	if (e) {
		unlink(tmp);
		return ulp_arch_err(a, e == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", path, strerror(e));
	}
	if (durable) {
		char d[4300];
		snprintf(d, sizeof(d), "%s", path);
		char *s = strrchr(d, '/');
		if (s)
			*s = 0;
		int dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return 0;
}

int ulp_shared_replace_file(ulp_archive *a, const char *path, const char *data, size_t n, int durable)
{
	return replace_file(a, path, data, n, durable);
}

typedef struct current {
	uint64_t gen, epoch, bytes;
} current;

/* CURRENT of dir: 0, NOENT (none), CORRUPT (not one). */
static int read_current(const char *dir, current *c, ulp_err *err)
{
	char p[4200], buf[256];
	snprintf(p, sizeof(p), "%s/index/CURRENT", dir);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ULP_ERR(err, errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO, "%s: %s", p, strerror(errno));
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", p, strerror(errno));
	buf[n] = 0;
	unsigned v;
	if (sscanf(buf, "ulpack-current %u %" SCNu64 " %" SCNu64 " %" SCNu64, &v, &c->gen, &c->epoch, &c->bytes) != 4 ||
	    v != 1 || c->gen == 0)
		return ULP_ERR(err, -ULP_E_CORRUPT, "%s: not a generation pointer (\"%.40s\")", p, buf);
	return 0;
}

static void gen_path(const ulp_archive *a, uint64_t gen, char *p, size_t cap)
{
	snprintf(p, cap, "%s/index/gen-%020" PRIu64 ".db", a->dir, gen);
}

/* The generation numbers in index/, ascending, in *out (caller frees). */
static int list_gens(ulp_archive *a, uint64_t **out, size_t *n)
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
		if (sscanf(e->d_name, "gen-%" SCNu64 "%7s", &g, tail) != 2 || strcmp(tail, ".db") || g == 0)
			continue;
		if ((rc = ulp_grow(out, &cap, *n, sizeof(**out))) == 0)
			(*out)[(*n)++] = g;
	}
	closedir(d);
	for (size_t i = 1; i < *n; i++) /* insertion sort: a handful */
		for (size_t j = i; j > 0 && (*out)[j - 1] > (*out)[j]; j--) {
			uint64_t t = (*out)[j];
			(*out)[j] = (*out)[j - 1];
			(*out)[j - 1] = t;
		}
	return rc;
}

int ulp_gen_oldest(ulp_archive *a, uint64_t *oldest)
{
	uint64_t *g;
	size_t n;
	ULP_TRY(list_gens(a, &g, &n));
	*oldest = n ? g[0] : 0;
	free(g);
	return 0;
}

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
	pthread_cond_init(&sh->cv, NULL);
	sh->published_changes = UINT64_MAX; /* the first publication always happens */
	a->sh = sh;
	return 0;
}

void ulp_shared_free(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh)
		return;
	ulp_lease_give_back(a); /* joins the renewer */
	pthread_mutex_destroy(&sh->mu);
	pthread_mutex_destroy(&sh->pub_mu);
	pthread_cond_destroy(&sh->cv);
	free(sh);
	a->sh = NULL;
}

/* ---- readers ------------------------------------------------------------ */

/* Follows generation c (a reader): new connections open it. */
static int follow(ulp_archive *a, const current *c, ulp_err *err)
{
	char p[4200];
	gen_path(a, c->gen, p, sizeof(p));
	struct stat sb;
	if (stat(p, &sb) < 0)
		return ULP_ERR(err, errno == ENOENT ? -ULP_E_NOENT : -ULP_E_IO,
		               "%s: generation %" PRIu64 " that index/CURRENT names: %s", p, c->gen, strerror(errno));
	if ((uint64_t)sb.st_size != c->bytes)
		return ULP_ERR(err, -ULP_E_CORRUPT, "%s: %lld bytes where index/CURRENT says %" PRIu64 " (not whole yet?)",
		               p, (long long)sb.st_size, c->bytes);
	ULP_TRY(ulp_db_set_follow(a, p));
	pthread_mutex_lock(&a->sh->mu);
	a->sh->gen = c->gen;
	a->sh->gen_epoch = c->epoch;
	pthread_mutex_unlock(&a->sh->mu);
	return 0;
}

int ulp_gen_reader_open(ulp_archive *a, ulp_err *err)
{
	current c;
	int rc = read_current(a->dir, &c, err);
	if (rc == -ULP_E_NOENT)
		return ULP_ERR(err, rc, "%s: a shared archive with no published generation yet (no index/CURRENT): "
		               "the writer publishes one when it opens the archive", a->dir);
	ULP_TRY(rc);
	ULP_TRY(follow(a, &c, err));
	__atomic_store_n(&a->sh->next_poll_ms, ulp_mono_ms() + a->sh->poll_ms, __ATOMIC_RELAXED);
	return 0;
}

/* A reader looks at CURRENT when its poll interval has passed (force: now),
 * one thread at a time, and follows a newer generation (invariant 2). */
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
	current c;
	char msg[512];
	ulp_err e = {msg, sizeof(msg)};
	if (read_current(a->dir, &c, &e) < 0)
		return; /* the generation followed stays */
	pthread_mutex_lock(&sh->mu);
	int newer = c.epoch > sh->gen_epoch || (c.epoch == sh->gen_epoch && c.gen > sh->gen);
	newer = newer && c.gen > sh->gen;
	pthread_mutex_unlock(&sh->mu);
	if (newer)
		follow(a, &c, &e); /* a generation not whole yet: the next poll */
}

/* ---- the writer ----------------------------------------------------------- */

/* Copies the live index into tmp: SQLite's online backup, from the calling
 * thread's connection, in one step (one read transaction: a consistent
 * snapshot however the other connections write meanwhile), then journal
 * mode DELETE, so that readers need no -wal or -shm. */
static int backup_to(ulp_archive *a, const char *tmp)
{
	sqlite3 *src = ulp_db(a), *dst = NULL;
	if (!src)
		return ulp_db_err(a, "open");
	int rc = sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
	sqlite3_backup *b = rc == SQLITE_OK ? sqlite3_backup_init(dst, "main", src, "main") : NULL;
	int code = 0;
	if (!b) {
		code = ulp_arch_err(a, -ULP_E_IO, "%s: %s", tmp, dst ? sqlite3_errmsg(dst) : sqlite3_errstr(rc));
	} else {
		int s = sqlite3_backup_step(b, -1);
		sqlite3_backup_finish(b);
		if (s != SQLITE_DONE)
			code = ulp_arch_err(a, s == SQLITE_FULL ? -ULP_E_NOSPC : -ULP_E_IO, "%s: copying the index: %s", tmp,
			                    sqlite3_errstr(s));
		else if (sqlite3_exec(dst, "PRAGMA journal_mode=DELETE", NULL, NULL, NULL) != SQLITE_OK)
			code = ulp_arch_err(a, -ULP_E_IO, "%s: %s", tmp, sqlite3_errmsg(dst));
	}
	sqlite3_close(dst);
	return code;
}

static int fsync_path(ulp_archive *a, const char *p, int dir)
{
	int fd = open(p, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
	if (fd < 0)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	int rc = fsync(fd) < 0 ? ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: fsync: %s", p,
	                                      strerror(errno))
	                       : 0;
	close(fd);
	return rc;
}

/* Publishes the live index as a new generation (invariants 1, 2); without
 * force, only where it changed since the last one. */
int ulp_gen_publish(ulp_archive *a, int force)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer)
		return 0;
	pthread_mutex_lock(&sh->pub_mu);
	/* every commit of this process counts (ulp_db_commit): the lease keeps
	 * other processes from writing */
	uint64_t changes = __atomic_load_n(&a->commits, __ATOMIC_RELAXED);
	int rc = ulp_lease_ok(a);
	if (rc < 0 || (!force && changes == sh->published_changes)) {
		pthread_mutex_unlock(&sh->pub_mu);
		return rc;
	}
	uint64_t *gens = NULL;
	size_t n = 0;
	current c = {0};
	char msg[256], tmp[4300], fin[4200], cur[4200];
	ulp_err e = {msg, sizeof(msg)};
	rc = list_gens(a, &gens, &n);
	uint64_t next = n ? gens[n - 1] + 1 : 1;
	free(gens);
	if (rc == 0 && read_current(a->dir, &c, &e) == 0 && c.gen >= next)
		next = c.gen + 1;
	snprintf(tmp, sizeof(tmp), "%s/index/tmp-%ld-%" PRIu64 ".db", a->dir, (long)getpid(), next);
	gen_path(a, next, fin, sizeof(fin));
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", a->dir);
	unlink(tmp);
	int tfd = rc == 0 ? open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600) : -1; /* private: archive.c */
	if (rc == 0 && tfd < 0)
		rc = ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	if (tfd >= 0)
		close(tfd);
	if (rc == 0)
		rc = backup_to(a, tmp);
	struct stat sb;
	if (rc == 0 && stat(tmp, &sb) < 0)
		rc = ulp_arch_err(a, -ULP_E_IO, "%s: %s", tmp, strerror(errno));
	if (rc == 0)
		rc = fsync_path(a, tmp, 0);
	if (rc == 0 && rename(tmp, fin) < 0)
		rc = ulp_arch_err(a, -ULP_E_IO, "%s: %s", fin, strerror(errno));
	if (rc == 0) {
		char idx[4200];
		snprintf(idx, sizeof(idx), "%s/index", a->dir);
		rc = fsync_path(a, idx, 1);
	}
	if (rc == 0)
		rc = ulp_lease_ok(a); /* invariant 2: the last look before the pointer moves */
	if (rc == 0) {
		char line[128];
		int l = snprintf(line, sizeof(line), "ulpack-current 1 %" PRIu64 " %" PRIu64 " %lld\n", next, sh->epoch,
		                 (long long)sb.st_size);
		rc = replace_file(a, cur, line, (size_t)l, 1);
	}
	if (rc < 0) {
		unlink(tmp);
	} else {
		sh->published_changes = changes;
		sh->published_ms = ulp_mono_ms();
		pthread_mutex_lock(&sh->mu);
		sh->gen = next;
		sh->gen_epoch = sh->epoch;
		pthread_mutex_unlock(&sh->mu);
	}
	pthread_mutex_unlock(&sh->pub_mu);
	if (rc == 0)
		ulp_gen_retire(a);
	return rc;
}

/* Invariant 4: removes the generations no reader needs any more, and the
 * temporaries of dead publications. */
void ulp_gen_retire(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer || __atomic_load_n(&sh->fenced, __ATOMIC_RELAXED))
		return;
	uint64_t *g;
	size_t n;
	if (list_gens(a, &g, &n) < 0)
		return;
	pthread_mutex_lock(&sh->mu);
	uint64_t cur = sh->gen;
	pthread_mutex_unlock(&sh->mu);
	int64_t now = ulp_wall_ms(), grace = (int64_t)sh->grace_s * 1000;
	/* when each was published (its file's mtime), all taken before any goes */
	int64_t *at = malloc((n ? n : 1) * sizeof(*at));
	for (size_t i = 0; at && i < n; i++) {
		char p[4200];
		struct stat sb;
		gen_path(a, g[i], p, sizeof(p));
		at[i] = stat(p, &sb) == 0 ? (int64_t)sb.st_mtim.tv_sec * 1000 + sb.st_mtim.tv_nsec / 1000000 : now;
	}
	size_t kept = 0;
	for (size_t i = n; at && i-- > 0;) {
		if (g[i] >= cur || i + 1 == n)
			continue; /* the current one (the newest file) */
		/* superseded when its successor was published */
		if (kept < ULP_GEN_KEEP && now - at[i + 1] < grace) {
			kept++;
		} else {
			char p[4200];
			gen_path(a, g[i], p, sizeof(p));
			unlink(p);
		}
	}
	free(at);
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
