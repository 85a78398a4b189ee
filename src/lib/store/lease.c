/* SPDX-License-Identifier: MIT */
/*
 * lease.c - one writer for a shared archive, fenced by an epoch: flock on
 * mount.lock is no fence on a network file system (a partition longer than
 * the client's ping timeout drops it: ../shared/notes/scaleout-measured.md).
 *
 * A writer takes epoch E+1 by creating lease/<E+1> (O_CREAT|O_EXCL: one
 * host wins) once the holder of E gave it back or let it expire, renews it
 * while it runs, and writes its epoch into every CURRENT it publishes. The
 * writer's upkeep (publication, retirement, the grace sweep) is the
 * archive's (archive/upkeep.c): the renewer starts it through a hook. Where
 * the home keeps the lease apart (a bucket: home.h's swaps), the object
 * "lease" there, replaced by compare-and-swap, is the one that counts; the
 * home is reached only through its table, a->home. Also here: a file of the
 * directory written whole (ulp_shared_replace_file, gen.c's too).
 *
 * Invariants:
 *  1. A writer writes (index transactions: ulp_db_begin/commit; publication:
 *     gen.c invariant 2) only while ulp_lease_ok: no higher epoch seen, and
 *     less than 3/4 of the lease since the start of its last renewal that
 *     succeeded, by its own monotonic clock. Another host takes over only
 *     after a whole lease past the renewal time written in the file, so a
 *     quarter of a lease covers the hosts' clock skew and a write in flight.
 *  2. Once lost, the lease stays lost for that handle (fenced): the writer
 *     stops archiving and publishing and says why; its staged files stay
 *     for the next writer's recovery.
 *  3. A new writer takes its epoch before it recovers staging (archive.c
 *     opens the archive, and so takes the lease, before staging.c recovers).
 *  4. Renewals have a thread of their own (the renewer), apart from the
 *     upkeep's work: a publication or a sweep that takes seconds on a
 *     network file system never holds a renewal back (one did, and the
 *     writer fenced itself under load).
 */
#include "shared.h"
#include "home.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>


typedef struct holder {
	uint64_t epoch;
	int64_t renewed_ms, lease_ms, mtime_ms;
	long pid;
	char host[256];
	int parsed;
} holder;

static void lease_path(const ulp_archive *a, uint64_t epoch, char *p, size_t cap)
{
	snprintf(p, cap, "%s/lease/%020" PRIu64, a->dir, epoch);
}

/* A lease line into h: 1 where it is one. */
static int parse_holder(const char *buf, holder *h)
{
	unsigned v;
	return sscanf(buf, "ulpack-lease %u %" SCNu64 " %" SCNd64 " %" SCNd64 " %ld %255s", &v, &h->epoch,
	              &h->renewed_ms, &h->lease_ms, &h->pid, h->host) == 6 && v == 1;
}

/* What the lease file of epoch ep says, into h (h->parsed: it held a lease
 * line of that epoch; h->mtime_ms: the file's mtime): 0, or -1 with errno
 * (ENOENT: no such file). */
static int read_holder(ulp_archive *a, uint64_t ep, holder *h)
{
	char p[4200], buf[512];
	memset(h, 0, sizeof(*h));
	lease_path(a, ep, p, sizeof(p));
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	struct stat sb;
	if (fstat(fd, &sb) == 0)
		h->mtime_ms = (int64_t)sb.st_mtim.tv_sec * 1000 + sb.st_mtim.tv_nsec / 1000000;
	close(fd);
	if (n > 0) {
		buf[n] = 0;
		h->parsed = parse_holder(buf, h) && h->epoch == ep;
	}
	h->epoch = ep;
	return 0;
}

/* The highest epoch in lease/ (0: none) and what its file says. */
static int highest(ulp_archive *a, holder *h, ulp_err *err)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/lease", a->dir);
	memset(h, 0, sizeof(*h));
	DIR *d = opendir(p);
	if (!d)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", p, strerror(errno));
	for (struct dirent *e; (e = readdir(d));) {
		char *end;
		uint64_t ep = strtoull(e->d_name, &end, 10);
		if (*end == 0 && strlen(e->d_name) == 20 && ep > h->epoch)
			h->epoch = ep;
	}
	closedir(d);
	if (!h->epoch)
		return 0;
	uint64_t top = h->epoch;
	if (read_holder(a, top, h) < 0) {
		memset(h, 0, sizeof(*h));
		h->epoch = top; /* (created, gone or unreadable: its number counts) */
	}
	return 0;
}

static int lease_line(ulp_archive *a, int64_t renewed_ms, char *line, size_t cap)
{
	ulp_shared *sh = a->sh;
	return snprintf(line, cap, "ulpack-lease 1 %" PRIu64 " %" PRId64 " %u %ld %s\n", sh->epoch, renewed_ms,
	                sh->lease_ms, (long)getpid(), sh->host);
}

/* shared.h: data into path whole (util/io.c), its error the archive's */
int ulp_shared_replace_file(ulp_archive *a, const char *path, const char *data, size_t n, int durable)
{
	int e = ulp_replace_file(path, data, n, durable);
	return e ? ulp_arch_err(a, e == ENOSPC || e == EDQUOT ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", path, strerror(e))
	         : 0;
}


static int write_lease(ulp_archive *a, int64_t renewed_ms, int durable)
{
	char p[4200], line[512];
	lease_path(a, a->sh->epoch, p, sizeof(p));
	int l = lease_line(a, renewed_ms, line, sizeof(line));
	return ulp_shared_replace_file(a, p, line, (size_t)l, durable);
}

/* ---- the lease in the home (home.h; remote.h invariant 2): the object
 * "lease", where the home keeps one apart from the directory ---- */

/* Its holder (epoch 0: none, or not a lease line) and tag ("": none). */
static int remote_holder(ulp_archive *a, holder *h, char etag[ULP_HOME_TAG_MAX], ulp_err *err)
{
	char buf[512];
	size_t n = 0;
	memset(h, 0, sizeof(*h));
	etag[0] = 0;
	int rc = a->home->ops->get(a->home, "lease", buf, sizeof(buf) - 1, &n, etag);
	if (rc == -ULP_E_NOENT)
		return 0;
	if (rc < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	buf[n] = 0;
	h->parsed = parse_holder(buf, h);
	if (!h->parsed)
		h->epoch = 0;
	return 0;
}

/* The object rewritten for this writer by compare-and-swap: EXIST where
 * another writer wrote it since (0 where the directory is the home). */
static int remote_renew(ulp_archive *a, int64_t renewed_ms)
{
	char line[512];
	int l = lease_line(a, renewed_ms, line, sizeof(line));
	return a->home->ops->put_if_match(a->home, "lease", line, (size_t)l, a->home->lease_tag);
}

void ulp_lease_fence(ulp_archive *a, const char *fmt, ...)
{
	ulp_shared *sh = a->sh;
	pthread_mutex_lock(&sh->mu);
	if (!sh->fenced) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(sh->why, sizeof(sh->why), fmt, ap);
		va_end(ap);
		__atomic_store_n(&sh->fenced, 1, __ATOMIC_RELEASE);
		fprintf(stderr, "ulpack: %s\n", sh->why);
	}
	pthread_mutex_unlock(&sh->mu);
}

static void *renewer(void *arg);

/* The renewer runs in the process that writes: started by the first check
 * of the lease in this process (a daemon forks after it opened the archive,
 * and threads do not cross a fork), and with it the archive's upkeep (the
 * on_renewer hook). */
static void ensure_renewer(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	long me = (long)getpid();
	if (__atomic_load_n(&sh->renewer_pid, __ATOMIC_ACQUIRE) == me)
		return;
	pthread_mutex_lock(&sh->mu);
	int started = 0;
	if (sh->renewer_pid != me && !sh->stop && pthread_create(&sh->renewer, NULL, renewer, a) == 0) {
		__atomic_store_n(&sh->renewer_pid, me, __ATOMIC_RELEASE);
		started = 1;
	}
	pthread_mutex_unlock(&sh->mu);
	if (started && sh->on_renewer)
		sh->on_renewer(a);
}

int ulp_lease_ok(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer)
		return 0;
	ensure_renewer(a);
	if (!__atomic_load_n(&sh->fenced, __ATOMIC_ACQUIRE)) {
		int64_t ok = __atomic_load_n(&sh->ok_mono_ms, __ATOMIC_RELAXED), now = ulp_mono_ms();
		int64_t busy = __atomic_load_n(&sh->renewing_since, __ATOMIC_RELAXED);
		char why[400];
		pthread_mutex_lock(&sh->mu);
		int failed = sh->renew_err[0] != 0;
		if (busy)
			snprintf(why, sizeof(why), " (a renewal has waited on the file system for %.1f s)",
			         (double)(now - busy) / 1000);
		else if (failed)
			snprintf(why, sizeof(why), " (its renewals failed: %.300s)", sh->renew_err);
		else
			snprintf(why, sizeof(why), " (no renewal is under way: the renewer did not run)");
		pthread_mutex_unlock(&sh->mu);
		if (now - ok > (int64_t)sh->lease_ms * 3 / 4)
			ulp_lease_fence(a, "%s: this writer (epoch %" PRIu64 ") could not renew its lease for %.1f s (of %.1f s)%s: "
			      "it stopped archiving and publishing; another host may take the archive over",
			      a->dir, sh->epoch, (double)(now - ok) / 1000, (double)sh->lease_ms / 1000, why);
	}
	if (!__atomic_load_n(&sh->fenced, __ATOMIC_ACQUIRE))
		return 0;
	pthread_mutex_lock(&sh->mu);
	int rc = ulp_arch_err(a, -ULP_E_FENCED, "%s", sh->why);
	pthread_mutex_unlock(&sh->mu);
	return rc;
}

int ulp_lease_test_stall; /* tests: renewals fail, as behind a network partition */

/* One tick of the renewer: a higher epoch fences (invariant 2); else the
 * lease is renewed. */
static void renew_locked(ulp_archive *a)
{
	ulp_shared *sh = a->sh;
	char p[4200], msg[256];
	ulp_err e = {msg, sizeof(msg)};
	int64_t start = ulp_mono_ms();
	holder h;
	if (a->home->ops->swaps) { /* the home's lease is the one that counts */
		if (ulp_lease_ok(a) < 0 || __atomic_load_n(&ulp_lease_test_stall, __ATOMIC_RELAXED))
			return;
		int rc = remote_renew(a, ulp_wall_ms());
		pthread_mutex_lock(&sh->mu); /* why, for the message of a lapse */
		snprintf(sh->renew_err, sizeof(sh->renew_err), "%s", rc < 0 && rc != -ULP_E_EXIST ? ulp_msgs_get(a->msgs) : "");
		pthread_mutex_unlock(&sh->mu);
		if (rc == -ULP_E_EXIST)
			ulp_lease_fence(a, "%s: another writer took the archive over (its lease object changed): this writer "
			                "(epoch %" PRIu64 ") stopped archiving and publishing", a->home->where, sh->epoch);
		else if (rc == 0 && write_lease(a, ulp_wall_ms(), 0) == 0)
			__atomic_store_n(&sh->ok_mono_ms, start, __ATOMIC_RELAXED);
		return;
	}
	if (highest(a, &h, &e) == 0 && h.epoch > sh->epoch) {
		ulp_lease_fence(a, "%s: another writer took the archive over (epoch %" PRIu64 ", host %s, pid %ld): this writer "
		      "(epoch %" PRIu64 ") stopped archiving and publishing", a->dir, h.epoch, h.parsed ? h.host : "?",
		      h.parsed ? h.pid : 0L, sh->epoch);
		return;
	}
	lease_path(a, sh->epoch, p, sizeof(p));
	if (access(p, F_OK) < 0 && errno == ENOENT) {
		ulp_lease_fence(a, "%s: this writer's lease file %s is gone: it stopped archiving and publishing", a->dir, p);
		return;
	}
	if (ulp_lease_ok(a) == 0 && !__atomic_load_n(&ulp_lease_test_stall, __ATOMIC_RELAXED)) {
		int rc = write_lease(a, ulp_wall_ms(), 0);
		if (rc == 0)
			__atomic_store_n(&sh->ok_mono_ms, start, __ATOMIC_RELAXED);
		pthread_mutex_lock(&sh->mu); /* why, for the message of a lapse */
		snprintf(sh->renew_err, sizeof(sh->renew_err), "%s", rc < 0 ? ulp_msgs_get(a->msgs) : "");
		pthread_mutex_unlock(&sh->mu);
	}
}

/* One renewal at a time: the renewer's, or an open's (ulp_lease_refresh). */
static void renew(ulp_archive *a)
{
	pthread_mutex_lock(&a->sh->renew_mu);
	renew_locked(a);
	pthread_mutex_unlock(&a->sh->renew_mu);
}

int ulp_lease_refresh(ulp_archive *a)
{
	if (!a->sh || !a->sh->writer || !a->sh->epoch)
		return 0;
	renew(a);
	return ulp_lease_ok(a);
}

/* Waits for the next tick (a second, at most a quarter lease): 0 to go on,
 * 1 once the threads end (stop, or fenced). mu held on entry and exit. */
static int tick(ulp_shared *sh)
{
	struct timespec ts;
	ulp_deadline_ms(&ts, ulp_lease_tick_ms(sh));
	pthread_cond_timedwait(&sh->cv, &sh->mu, &ts);
	return sh->stop || sh->fenced;
}

/* Renews the lease every quarter lease, and nothing else: a renewal never
 * waits behind a publication or a sweep (invariant 4). */
static void *renewer(void *arg)
{
	/* (no signal of the daemon's lands here: the loop ends by stop) */
	ulp_archive *a = arg;
	ulp_shared *sh = a->sh;
	int64_t last_renew = ulp_mono_ms();
	pthread_mutex_lock(&sh->mu);
	while (!tick(sh)) {
		pthread_mutex_unlock(&sh->mu);
		int64_t now = ulp_mono_ms();
		if (now - last_renew >= (int64_t)sh->lease_ms / 4) {
			__atomic_store_n(&sh->renewing_since, now, __ATOMIC_RELAXED);
			renew(a);
			__atomic_store_n(&sh->renewing_since, 0, __ATOMIC_RELAXED);
			last_renew = now;
		}
		pthread_mutex_lock(&sh->mu);
	}
	pthread_mutex_unlock(&sh->mu);
	return NULL;
}

static int take(ulp_archive *a, ulp_err *err);

int ulp_lease_take(ulp_archive *a, ulp_err *err)
{
	int rc = take(a, err);
	if (rc < 0)
		a->sh->epoch = 0; /* not taken: its close neither publishes nor gives back */
	return rc;
}

static int take(ulp_archive *a, ulp_err *err)
{
	ulp_shared *sh = a->sh;
	char p[4200];
	snprintf(p, sizeof(p), "%s/lease", a->dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", p, strerror(errno));
	holder h;
	ULP_TRY(highest(a, &h, err));
	int64_t now = ulp_wall_ms();
	if (h.epoch) {
		/* a file not written yet (its taker is between create and write): by
		 * its mtime; one given back: renewed 0 */
		int64_t renewed = h.parsed ? h.renewed_ms : h.mtime_ms;
		int64_t lease = h.parsed ? h.lease_ms : (int64_t)ULP_LEASE_MS_DEFAULT;
		if (renewed > 0 && now < renewed + lease)
			return ULP_ERR(err, -ULP_E_BUSY,
			               "%s: another writer holds the archive's lease (host %s, pid %ld, epoch %" PRIu64
			               ", renewed %.1f s ago; free in %.1f s unless renewed): one writer at a time on a "
			               "shared archive; mount read-only (-o ro) to follow what it publishes, or -o contribute to write "
			               "files for it to archive",
			               a->dir, h.parsed ? h.host : "?", h.parsed ? h.pid : 0L, h.epoch,
			               (double)(now - renewed) / 1000, (double)(renewed + lease - now) / 1000);
	}
	/* the home's lease, where it keeps one apart (remote.h invariant 2; the
	 * directory: none, epoch 0) */
	ulp_home *hm = a->home;
	holder r;
	char et[ULP_HOME_TAG_MAX];
	ULP_TRY(remote_holder(a, &r, et, err));
	if (r.epoch && r.renewed_ms > 0 && now < r.renewed_ms + r.lease_ms)
		return ULP_ERR(err, -ULP_E_BUSY,
		               "%s: another writer holds the archive's lease (host %s, pid %ld, epoch %" PRIu64
		               ", renewed %.1f s ago; free in %.1f s unless renewed): one writer at a time; mount "
		               "read-only (-o ro) to follow what it publishes",
		               hm->where, r.host, r.pid, r.epoch, (double)(now - r.renewed_ms) / 1000,
		               (double)(r.renewed_ms + r.lease_ms - now) / 1000);
	pthread_mutex_lock(&hm->mu);
	snprintf(hm->lease_tag, sizeof(hm->lease_tag), "%s", et);
	pthread_mutex_unlock(&hm->mu);
	uint64_t floor = ULP_MAX(r.epoch, hm->floor_epoch);
	sh->epoch = ULP_MAX(h.epoch, floor) + 1; /* in a bucket: above its epochs */
	lease_path(a, sh->epoch, p, sizeof(p));
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return ULP_ERR(err, errno == EEXIST ? -ULP_E_BUSY : -ULP_E_IO, "%s: %s", p,
		               errno == EEXIST ? "another writer took this epoch first" : strerror(errno));
	close(fd);
	__atomic_store_n(&sh->ok_mono_ms, ulp_mono_ms(), __ATOMIC_RELAXED);
	int rc = remote_renew(a, ulp_wall_ms());
	if (rc < 0)
		unlink(p); /* not taken: this home's next writer need not wait for it */
	if (rc == -ULP_E_EXIST)
		return ULP_ERR(err, -ULP_E_BUSY, "%s: another writer took the archive's lease first: one writer at a time",
		               hm->where);
	if (rc < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	rc = write_lease(a, ulp_wall_ms(), 1);
	if (rc < 0)
		return ULP_ERR(err, rc, "%s", ulp_msgs_get(a->msgs));
	/* older epochs' files: all but the one before, and but those of writers
	 * that may still run, fenced (not given back, renewed within the grace):
	 * their live index stays while their lease file does (gen.c invariant 7) */
	int64_t keep_ms = ULP_MAX((int64_t)sh->grace_s * 1000, 10 * (int64_t)sh->lease_ms);
	for (uint64_t ep = h.epoch > 1 ? h.epoch - 1 : 0; ep > 0; ep--) {
		holder o;
		if (read_holder(a, ep, &o) < 0 && errno == ENOENT)
			break;
		if (o.parsed && o.renewed_ms > 0 && now - o.renewed_ms < keep_ms)
			continue; /* a writer fenced lately, maybe still running */
		lease_path(a, ep, p, sizeof(p));
		unlink(p);
	}
	return 0; /* the renewer starts with the first write (ensure_renewer) */
}

void ulp_lease_give_back(ulp_archive *a, int (*publish)(ulp_archive *a, int force))
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer)
		return;
	pthread_mutex_lock(&sh->mu);
	sh->stop = 1;
	pthread_cond_broadcast(&sh->cv);
	int mine = sh->renewer_pid == (long)getpid();
	pthread_mutex_unlock(&sh->mu);
	if (mine)
		pthread_join(sh->renewer, NULL);
	if (sh->epoch && ulp_lease_ok(a) == 0) {
		publish(a, 0); /* what was archived last (archive/upkeep.c published before) */
		remote_renew(a, 0); /* (the directory: nothing apart) */
		write_lease(a, 0, 1); /* given back: the next writer need not wait */
	} else if (sh->epoch && a->home->ops->swaps) {
		/* fenced in a bucket: the bucket's lease is another home's now, and
		 * this home's lease file only kept its other processes out while this
		 * handle wrote; given back, or this host's next writer would wait a
		 * whole lease for a file no one holds (the bucket's object decides) */
		write_lease(a, 0, 1);
	}
}

int ulp_lease_holder(ulp_archive *a, char *host, size_t cap, uint64_t *epoch)
{
	ulp_shared *sh = a->sh;
	host[0] = 0;
	*epoch = 0;
	if (!sh)
		return 0;
	if (sh->writer) {
		snprintf(host, cap, "%s", sh->host);
		*epoch = sh->epoch;
		return 0;
	}
	holder h;
	char why[512] = "";
	ulp_err err = {why, sizeof(why)};
	char etag[ULP_HOME_TAG_MAX];
	/* the home's lease where it keeps one apart (a bucket's), else lease/'s */
	int rc = remote_holder(a, &h, etag, &err);
	if (rc == 0 && !h.epoch)
		rc = highest(a, &h, &err);
	if (rc < 0)
		return ulp_arch_err(a, rc, "%s", why);
	if (h.parsed)
		snprintf(host, cap, "%s", h.host);
	*epoch = h.epoch;
	return 0;
}
