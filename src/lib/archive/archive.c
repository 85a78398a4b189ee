/* SPDX-License-Identifier: MIT */
/*
 * archive.c - creating, opening and closing an archive directory, and its
 * counters. An archive is ARCHIVE/ulpack.db, ARCHIVE/packs/, ARCHIVE/staging/.
 *
 * Invariant: an archive is private to its owner, whatever the umask: init
 * makes ARCHIVE 0700, packs/ and staging/ are created 0700, and every file
 * the library creates (ulpack.db, and so its -wal and -shm, which SQLite
 * creates with the database's mode; packs and their temporaries; staging
 * files) is created 0600. A 0600 file in a mount is not readable with
 * strings(1) on a pack by another local user.
 */
#include "store/shared.h"
#include "store/remote.h"
#include "store/home.h"
#include "store/db.h"
#include "archive/cache.h"
#include "store/pack.h"
#include "archive/read.h"
#include "archive/writer.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* Creates the missing parents of dir (mode 0755, as mkdir -p), not dir. */
static int make_parents(const char *dir, ulp_err *err)
{
	char p[4200];
	if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
		return ULP_ERR(err, -ULP_E_NAMETOOLONG, "%.200s...: path too long", dir);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/' || s[1] == 0 || s[1] == '/')
			continue;
		*s = 0;
		struct stat sb;
		if (stat(p, &sb) < 0 && mkdir(p, 0755) < 0 && errno != EEXIST)
			return ULP_ERR(err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: cannot create it: %s", p,
			               strerror(errno));
		*s = '/';
	}
	return 0;
}

/* An archive goes into an empty directory only (or one left by an init that
 * stopped half way, or a file system's lost+found): a directory of other
 * files is most likely a typo, and gc would later remove what it does not
 * know in packs/ and staging/. */
static int check_empty(const char *dir, ulp_err *err)
{
	DIR *d = opendir(dir);
	if (!d)
		return ULP_ERR(err, -ULP_E_IO, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	int rc = 0;
	while (rc == 0 && (e = readdir(d)) != NULL) {
		const char *n = e->d_name;
		if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, "packs") || !strcmp(n, "staging") ||
		    !strcmp(n, "mount.lock") || !strcmp(n, "lost+found"))
			continue;
		rc = ULP_ERR(err, -ULP_E_NOTEMPTY,
		             "%s: not empty and not an archive (it holds '%s'): refusing to create an archive in it",
		             dir, n);
	}
	closedir(d);
	return rc;
}

static int init_remote(const char *url, ulp_err *err);

int ulp_archive_init(const char *dir, char *errbuf, size_t errcap)
{
	ulp_err err = {errbuf, errcap};
	char path[4200];
	if (ulp_remote_is_url(dir))
		return init_remote(dir, &err);
	ULP_TRY(make_parents(dir, &err));
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return ULP_ERR(&err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", dir, strerror(errno));
	snprintf(path, sizeof(path), "%s/ulpack.db", dir);
	if (access(path, F_OK) == 0)
		return ULP_ERR(&err, -ULP_E_EXIST, "%s: already an archive", dir);
	ULP_TRY(check_empty(dir, &err));
	if (chmod(dir, 0700) < 0) /* a directory that existed: private too */
		return ULP_ERR(&err, -ULP_E_IO, "%s: cannot make the archive directory private (mode 0700): %s", dir,
		               strerror(errno));
	for (const char *sub = "packs"; sub; sub = strcmp(sub, "packs") == 0 ? "staging" : NULL) {
		snprintf(path, sizeof(path), "%s/%s", dir, sub);
		if (mkdir(path, 0700) < 0 && errno != EEXIST)
			return ULP_ERR(&err, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s", path,
			               strerror(errno));
	}
	snprintf(path, sizeof(path), "%s/ulpack.db", dir);
	return ulp_db_create(path, &err);
}

uint64_t ulp_default_cache_size(void)
{
	const uint64_t lo = (uint64_t)1 << 30, hi = (uint64_t)64 << 30;
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t eighth = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / 8 : lo;
	return eighth < lo ? lo : eighth > hi ? hi : eighth;
}

/* A shared archive (store/shared.h): a read-only open follows its published
 * generations, never the live index; a writer takes the lease first (lease.c
 * invariant 3). The live index of an archive on a network file system is
 * the writer's alone. */
static int shared_open(ulp_archive *a, const ulp_archive_opts *o, ulp_err *err)
{
	char fs[64];
	if (!ulp_gen_is_shared(a->dir)) {
		if (a->read_only && ulp_netfs(a->dir, fs, sizeof(fs)))
			return ULP_ERR(err, -ULP_E_UNSUPPORTED,
			               "%s: on a network file system (%s), whose hosts cannot share the live index "
			               "(SQLite's WAL needs their shared memory), and not shared: open it read-write once "
			               "on the writer's host (ulpackfs ARCHIVE MNT, or ulpack share ARCHIVE), which publishes "
			               "index generations; read-only mounts (ulpackfs -o ro) then follow them",
			               a->dir, fs);
		return 0;
	}
	if (a->rm && !a->read_only)
		ULP_TRY(ulp_gen_remote_writer(a, err)); /* the live index as new as the bucket's */
	ULP_TRY(ulp_shared_new(a, &a->opts, !a->read_only));
	ulp_db_set_hooks(a, a->read_only ? NULL : ulp_lease_ok, a->read_only ? ulp_gen_refresh : NULL);
	if (!a->read_only) {
		int took = ulp_lease_take(a, err);
		if (took == -ULP_E_BUSY && o->contribute && !a->rm) {
			/* another host archives: this one contributes (contrib.c),
			 * reading the generations as a reader does */
			ulp_shared_free(a);
			a->read_only = 1;
			ULP_TRY(ulp_shared_new(a, &a->opts, 0));
			ulp_db_set_hooks(a, NULL, ulp_gen_refresh);
			ULP_TRY(ulp_contrib_open(a, err));
			a->follow = 1;
			return ulp_gen_reader_open(a, err);
		}
		ULP_TRY(took);
		ULP_TRY(ulp_upkeep_new(a));
		if (a->rm)
			return ulp_gen_remote_claim(a, err);
		/* staging claimed before the newest generation is read (staging.c
		 * invariant 5, gen.c invariant 7) */
		int rc = ulp_stage_claim(a);
		if (rc == 0)
			rc = ulp_lease_refresh(a);
		if (rc < 0)
			return ULP_ERR(err, rc, "%s", ulp_archive_errmsg(a));
		ULP_TRY(ulp_gen_writer_open(a, err));
		return (rc = ulp_lease_refresh(a)) < 0 ? ULP_ERR(err, rc, "%s", ulp_archive_errmsg(a)) : 0;
	}
	a->follow = 1;
	return ulp_gen_reader_open(a, err);
}

/* The writer's list of packs the index dropped, kept for the grace
 * (maint.c invariant 7). */
static int grace_table(ulp_archive *a, ulp_err *err)
{
	int rc = ulp_db_exec(a, "CREATE TABLE IF NOT EXISTS pack_grace(name TEXT PRIMARY KEY,"
	                        " since_ms INTEGER NOT NULL, gen INTEGER NOT NULL)");
	return rc < 0 ? ULP_ERR(err, rc, "%s", ulp_archive_errmsg(a)) : 0;
}

int ulp_archive_share(ulp_archive *a)
{
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	if (a->sh)
		return ulp_gen_publish(a, 0);
	char p[4200], msg[1024];
	ulp_err e = {msg, sizeof(msg)};
	snprintf(p, sizeof(p), "%s/index", a->dir);
	if (mkdir(p, 0700) < 0 && errno != EEXIST)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	int rc = ulp_shared_new(a, &a->opts, 1);
	if (rc == 0)
		ulp_db_set_hooks(a, ulp_lease_ok, NULL);
	if (rc == 0 && (rc = ulp_lease_take(a, &e)) < 0)
		ulp_arch_err(a, rc, "%s", msg);
	if (rc == 0)
		rc = ulp_upkeep_new(a);
	if (rc == 0 && (rc = grace_table(a, &e)) < 0)
		ulp_arch_err(a, rc, "%s", msg);
	if (rc == 0) {
		__atomic_store_n(&a->sh->opened, 1, __ATOMIC_RELEASE); /* (open already) */
		rc = ulp_gen_publish(a, 1);
	}
	if (rc < 0) {
		ulp_upkeep_stop(a);
		ulp_shared_free(a);
		rmdir(p); /* only where nothing was published in it */
	}
	return rc;
}

static int open_dir(const char *dir, const ulp_archive_opts *o, ulp_remote *rm, ulp_archive **out, ulp_err *e);

/* An archive in a bucket (store/remote.h): its local home, opened as a
 * shared archive whose generations and packs come from the bucket. */
static int open_remote(const char *url, const ulp_archive_opts *o, int creating, ulp_archive **out, ulp_err *err)
{
	ulp_remote *rm;
	char *home;
	ULP_TRY(ulp_remote_open(url, o, !o->read_only, &rm, &home, err));
	rm->creating = creating;
	int rc = open_dir(home, o, rm, out, err); /* rm is the archive's, or closed */
	free(home);
	return rc;
}

/* ulp_archive_init of s3://BUCKET/PREFIX: the bucket (made if missing), a
 * local home with an empty index, and generation 1 published with the
 * pointer created only where there is none (If-None-Match). */
static int init_remote(const char *url, ulp_err *err)
{
	static const ulp_archive_opts o = {0};
	ulp_remote *rm;
	char *home, p[4300];
	ULP_TRY(ulp_remote_open(url, &o, 1, &rm, &home, err));
	snprintf(p, sizeof(p), "%s/ulpack.db", home);
	int rc = ulp_remote_init_check(rm, err);
	if (rc == 0 && access(p, F_OK) == 0)
		rc = ULP_ERR(err, -ULP_E_EXIST, "%s: holds the index of an archive that is no longer in the bucket: remove "
		             "that directory (or choose another cache_dir) to create %s", home, url);
	if (rc == 0)
		rc = ulp_db_create(p, err);
	ulp_remote_close(rm);
	ulp_archive *a = NULL;
	if (rc == 0)
		rc = open_remote(url, &o, 1, &a, err);
	if (rc == 0 && (rc = ulp_gen_publish(a, 1)) < 0)
		ULP_ERR(err, rc, "%s", ulp_archive_errmsg(a));
	ulp_archive_close(a);
	if (rc < 0 && rc != -ULP_E_EXIST)
		unlink(p); /* nothing published: the next init starts afresh */
	free(home);
	return rc;
}

int ulp_archive_open(const char *dir, const ulp_archive_opts *opts, ulp_archive **out,
                     char *errbuf, size_t errcap)
{
	ulp_err err = {errbuf, errcap};
	static const ulp_archive_opts defaults = {0};
	const ulp_archive_opts *o = opts ? opts : &defaults;
	if (ulp_remote_is_url(dir))
		return open_remote(dir, o, 0, out, &err);
	return open_dir(dir, o, NULL, out, &err);
}

/* Opens the archive in directory dir (rm: its home in a bucket, whose
 * handle it takes). */
static int open_dir(const char *dir, const ulp_archive_opts *o, ulp_remote *rm, ulp_archive **out, ulp_err *e)
{
	ulp_err err = *e;
	struct stat sb;
	char path[4200];
	if (rm && (o->max_chain > ULP_MAX_CHAIN || o->threads > ULP_MAX_THREADS || stat(dir, &sb) < 0 ||
	           !S_ISDIR(sb.st_mode))) {
		ulp_remote_close(rm); /* (the checks below say why) */
		rm = NULL;
	}
	if (o->max_chain > ULP_MAX_CHAIN)
		return ULP_ERR(&err, -ULP_E_INVAL, "%s: max_chain %u: at most %d", dir, o->max_chain, ULP_MAX_CHAIN);
	if (o->threads > ULP_MAX_THREADS)
		return ULP_ERR(&err, -ULP_E_INVAL, "%s: %d threads: at most %d", dir, o->threads, ULP_MAX_THREADS);
	/* each cause named; the hint to init only where there is no index */
	if (stat(dir, &sb) < 0)
		return errno == ENOENT ? ULP_ERR(&err, -ULP_E_NOENT, "%s: no such archive directory", dir)
		                       : ULP_ERR(&err, -ULP_E_IO, "%s: %s", dir, strerror(errno));
	if (!S_ISDIR(sb.st_mode))
		return ULP_ERR(&err, -ULP_E_NOTDIR, "%s: not a directory (an archive is a directory)", dir);
	snprintf(path, sizeof(path), "%s/ulpack.db", dir);
	int fd = rm ? -1 : open(path, O_RDONLY | O_CLOEXEC); /* a bucket's: made from its generation */
	if (!rm && fd < 0 && errno == ENOENT)
		return ULP_ERR(&err, -ULP_E_NOENT, "%s: not a ulpack archive (no ulpack.db; create one with 'ulpack init')", dir);
	if (!rm && fd < 0)
		return ULP_ERR(&err, errno == EISDIR ? -ULP_E_ISDIR : -ULP_E_IO, "%s: %s", path, strerror(errno));
	if (fd >= 0)
		close(fd);
	/* the handle and its writer's and reader's state, in one block (the
	 * handle first: freeing it frees them) */
	struct handles {
		ulp_archive a;
		ulp_writer w;
		ulp_reader r;
	} *hs = calloc(1, sizeof(*hs));
	if (!hs) {
		ulp_remote_close(rm);
		return -ULP_E_NOMEM;
	}
	ulp_archive *a = &hs->a;
	a->w = &hs->w;
	a->r = &hs->r;
	a->rm = rm;
	a->dir = strdup(dir);
	a->read_only = o->read_only;
	a->opts = *o;
	a->max_chain = o->max_chain;
	const char *bv = getenv("ULP_TEST_BLOB_VERSION");
	a->blob_version = bv && !strcmp(bv, "1") ? 1 : ULP_BLOB_VERSION;
	pthread_mutex_init(&a->w->mu, NULL);
	pthread_mutex_init(&a->w->write_mu, NULL);
	pthread_mutex_init(&a->r->mu, NULL);
	int rc = -ULP_E_NOMEM;
	if (!a->dir || ulp_msgs_new(&a->msgs) != 0 || ulp_dbh_open(a) != 0) {
		ulp_msgs_free(a->msgs);
		ulp_remote_close(rm);
		free(a->dir);
		free(a);
		return rc;
	}
	rc = a->rm ? ulp_home_s3_open(a, &a->home) : ulp_home_dir_open(a, &a->home);
	if (rc == 0)
		rc = ulp_packstore_open(a);
	if (rc == 0)
		rc = ulp_cache_new(o->cache_size ? o->cache_size : ulp_default_cache_size(), &a->cache);
	if (rc == 0)
		rc = ulp_pool_new(o->threads, &a->pool);
	if (rc == 0)
		rc = shared_open(a, o, &err);
	if (rc == 0)
		rc = ulp_db_check(a, &err);
	if (rc == 0 && a->sh && a->sh->writer)
		rc = grace_table(a, &err);
	char fs[64];
	if (rc == 0 && !a->read_only && !a->sh && ulp_netfs(dir, fs, sizeof(fs))) { /* DESIGN.md 7 */
		rc = ulp_archive_share(a);
		if (rc < 0)
			ULP_ERR(&err, rc, "%s", ulp_archive_errmsg(a));
	}
	if (rc < 0) {
		ulp_archive_close(a); /* a shared archive's writer publishes nothing of it */
		return rc;
	}
	if (a->sh)
		__atomic_store_n(&a->sh->opened, 1, __ATOMIC_RELEASE);
	if (!a->read_only) { /* staging/ may be missing in archives copied by hand */
		snprintf(path, sizeof(path), "%s/staging", dir);
		mkdir(path, 0700);
	}
	/* SHA-256 set up now (OpenSSL reads its configuration on first use, a few
	 * ms), not on the first cold open of a file, which checks its header */
	uint8_t sha[ULP_SHA256_LEN];
	ulp_sha256("", 0, sha);
	ulp_db_open_ahead(a);
	ulp_ftab_open(a); /* opts.file_table: a hint (without it the index answers) */
	*out = a;
	return 0;
}

void ulp_archive_close(ulp_archive *a)
{
	if (!a)
		return;
	ulp_readahead_stop(a); /* first: its thread uses the cache and the index */
	ulp_ftab_close(a); /* its thread uses the index */
	ulp_upkeep_stop(a); /* the publisher, and what was archived last published */
	ulp_shared_free(a); /* the renewer, and the lease given back */
	ulp_contrib_free(a);
	ulp_cache_free(a->cache);
	ulp_pool_free(a->pool);
	ulp_ingest_free_spare(a);
	ulp_layout_forget_expected(a);
	ulp_packstore_close(a);
	ulp_home_close(a->home); /* after the lease and the generations, its users */
	ulp_remote_close(a->rm); /* after the pack store and the home, its users */
	ulp_dbh_close(a); /* every thread's connection */
	ulp_db_free_copy(a); /* after the connections that read it */
	pthread_mutex_destroy(&a->w->mu);
	pthread_mutex_destroy(&a->w->write_mu);
	pthread_mutex_destroy(&a->r->mu);
	ulp_msgs_free(a->msgs); /* last: everything above may have said why it failed */
	free(a->dir);
	free(a);
}

const char *ulp_archive_errmsg(const ulp_archive *a)
{
	return ulp_msgs_get(a->msgs);
}

int ulp_archive_is_url(const char *name)
{
	return ulp_remote_is_url(name);
}

const char *ulp_archive_dir(const ulp_archive *a)
{
	return a->dir;
}

void ulp_archive_counters(ulp_archive *a, ulp_counters *c)
{
	c->chunks_decoded = __atomic_load_n(&a->r->chunks_decoded, __ATOMIC_RELAXED);
	c->deltas_decoded = __atomic_load_n(&a->r->deltas_decoded, __ATOMIC_RELAXED);
	c->cache_hits = __atomic_load_n(&a->r->hits, __ATOMIC_RELAXED);
	c->cache_misses = __atomic_load_n(&a->r->misses, __ATOMIC_RELAXED);
	c->cache_bytes = ulp_cache_bytes(a->cache);
	c->cache_recycled = ulp_cache_recycled(a->cache);
	c->max_walk = __atomic_load_n(&a->r->max_walk, __ATOMIC_RELAXED);
}
