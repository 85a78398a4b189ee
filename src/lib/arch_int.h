/* SPDX-License-Identifier: MIT */
/*
 * arch_int.h - the archive handle (struct ulp_archive) and its two handles
 * of state, the writer's (a->w) and the reader's (a->r), shared by the store
 * and the archive floors; the error macros. The internal headers of the
 * rooms (each .c includes those it uses):
 *   store/db.h       db.c: the index's connections, schema, transactions
 *   store/index.h    index.c, namespace.c: the index's rows and entries
 *   store/path.h     path.c: path rules, the step a path names
 *   store/pack.h     pack.c: the pack store (over store/backend.h)
 *   store/shared.h   gen.c, genvfs.c, lease.c: a shared archive's
 *                    generations and lease (over store/home.h, the home)
 *   archive/cache.h  cache.c: the decode cache
 *   archive/read.h   read.c: chunks, blobs, contents, the read-ahead
 *   archive/writer.h ingest.c, staging.c, layout.c, maint.c, recode.c,
 *                    upkeep.c: the writing side of the archive floor
 *
 * The archive handle's parts, each with its own lock (the structs below
 * say which lock guards each field, and the order of the locks):
 *  - the pack store, a->ps (struct ulp_packstore, private to pack.c): the
 *    table of mapped packs and the pages given back in batches, guarded by
 *    ps->mu; its backend (store/backend.h, private to pack.c and its
 *    backends: put, read a range, map, list, remove, publish), chosen at
 *    open: the local directory ARCHIVE/packs (backend_dir.c);
 *  - the db handle, a->dbh (struct ulp_dbh, private to db.c): the key of
 *    each thread's index connection and error text, and the list of them
 *    that close frees, guarded by dbh->mu;
 *  - the writer handle, a->w: one writer at a time (w->write_mu, which
 *    guards the pipelined put's inflight), the live index, the commits, the
 *    ingest's spare jobs and the expected files (w->mu), the publisher;
 *  - the reader handle, a->r: the read-ahead and the files read lately
 *    (r->mu), the read counters;
 *  - a shared archive's generations and lease, a->sh (store/shared.h,
 *    sh->mu), and its home, a->home (store/home.h).
 */
#ifndef ULP_ARCH_INT_H
#define ULP_ARCH_INT_H

#include "ulp_int.h"
#include <pthread.h>


/* ---- the archive handle ------------------------------------------------- */

typedef struct ulp_cache ulp_cache;   /* archive/cache.h: the decode cache */
typedef struct ulp_tstate ulp_tstate; /* per-thread: index connection, error text */
typedef struct ulp_packstore ulp_packstore; /* pack.c: mapped packs, their lock */
typedef struct ulp_shared ulp_shared; /* store/shared.h: generations, lease */
typedef struct ulp_remote ulp_remote; /* store/remote.h: a home in an S3 bucket */
typedef struct ulp_home ulp_home; /* store/home.h: where a shared archive is published */
typedef struct ulp_dbh ulp_dbh;  /* db.c: the thread states' key and list, their lock */
typedef struct ulp_upkeep ulp_upkeep; /* archive/upkeep.c: a shared archive writer's publisher */
typedef struct ulp_writer ulp_writer; /* below: the writer's state */
typedef struct ulp_reader ulp_reader; /* below: the reader's state */
typedef struct ulp_contrib ulp_contrib; /* archive/contrib.c: a contributor host's staging */

/* A file an import is about to put (ulp_archive_expect, layout.c). */
typedef struct ulp_expected {
	char *series, *path;
	int64_t step;
} ulp_expected;

/*
 * Locks of an archive: w->write_mu (one writer) is taken first and held
 * across a whole put, gc or re-coding commit. w->mu, r->mu, the pack
 * store's ps->mu and the database handle's dbh->mu are leaf locks: each is
 * held for a few field updates only, and no other lock is taken while it is
 * held (no index or cache call, no ulp_arch_err, which may take dbh->mu,
 * under them). The pack store's refetch_mu (pack.c invariant 6) is held
 * across a fetch of a pack from an object store, after write_mu where both
 * are, with no leaf lock held when it is taken.
 */

/* The writer's state (a->w): made at open, for a read-only handle too
 * (its write_mu still orders gc and the re-coder against each other). */
struct ulp_writer {
	pthread_mutex_t write_mu;    /* one writer at a time in this process; guards inflight */
	pthread_mutex_t mu;          /* guards spare_jobs, expect, n_expect */
	char *live;                  /* set at open, read-only after: the live index of a
	                                shared archive's writer on a directory
	                                (index/live-E.db, gen.c invariant 7), else NULL:
	                                ulpack.db (ulp_db_live_path) */
	ulp_upkeep *upkeep;          /* set at open, read-only after: a shared archive
	                                writer's publisher (archive/upkeep.c), or NULL */
	struct job *spare_jobs;      /* guarded by mu: the ingest's job set with its
	                                buffers, kept between files (ingest.c) */
	ulp_expected *expect;        /* guarded by mu: files an import will put (layout.c) */
	size_t n_expect;             /* guarded by mu */
	uint64_t put_done;           /* atomic: bytes of the file being put that are coded
	                                (ulp_archive_put_progress) */
	uint64_t commits;            /* atomic: index transactions committed (gen.c
	                                publishes when it moved) */
	struct coded *inflight;      /* guarded by write_mu: a pipelined put's file whose
	                                commit is not over (ulp_putq, ingest.c): set by
	                                the writer between files, read by the jobs of the
	                                next file (started and joined under write_mu) */
};

/* The reader's state (a->r): made at open. */
struct ulp_reader {
	pthread_mutex_t mu;          /* guards ra, recent */
	struct readahead *ra;        /* guarded by mu: sequential read-ahead (read.c),
	                                started on first use, or NULL; stopped at close
	                                once no other thread uses the archive */
	struct ulp_recent {          /* guarded by mu: the files of a series read lately,
	                                and the run directories listed lately, which
	                                tell a sweep from a lone read (read.c) */
		uint64_t series, file;   /* hashes of the series and of the path; of a
		                            listed directory and 0 */
		int64_t ms;              /* when its first read came (CLOCK_MONOTONIC) */
	} recent[16];
	/* counters, atomic */
	uint64_t chunks_decoded, deltas_decoded, hits, misses, max_walk;
};

struct ulp_archive {
	char *dir;                   /* set at open, read-only after */
	ulp_msgs *msgs;              /* set at open, read-only after: each thread's last
	                                error message (ulp_arch_err, ulp_archive_errmsg) */
	int read_only;               /* set at open, read-only after */
	char *db_uri;                /* set at open, read-only after: read-only, SQLite
	                                unable to read the index in place: the URI every
	                                connection opens (db.c, ulp_db_check), else NULL */
	char *db_copy;               /* set at open, read-only after: the private copy
	                                that URI names, removed at close, or NULL */
	int schema;                  /* set at open, read-only after: schema version of
	                                the index (ulp_db_check, after any upgrade) */
	unsigned max_chain;          /* set at open, read-only after */
	unsigned blob_version;       /* set at open, read-only after: format of the blobs
	                                it writes: ULP_BLOB_VERSION, or 1 where
	                                ULP_TEST_BLOB_VERSION=1 makes an archive of an
	                                older release (tests) */
	ulp_dbh *dbh;                /* set at open, read-only after: the index's
	                                per-thread connections (db.c), guarded by
	                                dbh->mu */
	ulp_cache *cache;            /* set at open, read-only after (its own lock) */
	ulp_pool *pool;              /* set at open, read-only after (its own lock) */
	ulp_writer *w;               /* set at open, read-only after: the writer's state */
	ulp_reader *r;               /* set at open, read-only after: the reader's state */
	ulp_packstore *ps;           /* set at open, read-only after: the pack store
	                                (pack.c), guarded by ps->mu */
	ulp_shared *sh;              /* set at open, read-only after: a shared archive's
	                                generations and lease (store/shared.h), or NULL;
	                                its fields guarded by sh->mu */
	ulp_archive_opts opts;       /* set at open, read-only after: as given */
	ulp_remote *rm;              /* set at open, read-only after: the home in a
	                                bucket (store/remote.h), or NULL; dir is then
	                                the local home */
	ulp_home *home;              /* set at open, read-only after: the home's table
	                                (store/home.h: the directory, or the bucket
	                                of rm), which gen.c and lease.c reach it by */
	ulp_contrib *contrib;        /* set at open, read-only after: a contributor's
	                                staging area and directories (archive/contrib.c),
	                                or NULL; the handle is then read-only (a reader
	                                of the generations) but stages files */
	const char *contrib_dir;     /* set at open, read-only after: that contributor's
	                                staging/h-HOST (owned by a->contrib), or NULL */
	int follow;                  /* set at open, read-only after: read-only on a
	                                shared archive: connections open the published
	                                generation that dbh names (gen.c) */
	uint64_t index_seq;          /* atomic: bumped after every commit of this process's
	                                connections (db.c's WAL hook) and for each new
	                                generation followed: a file table loaded at
	                                another value is stale (store/ftab.c) */
	int64_t index_commit_ms;     /* atomic: CLOCK_MONOTONIC ms of the last commit */
	uint64_t index_stmts;        /* atomic: statements run on the index, any thread */
	struct ulp_ftabh *fth;       /* set at open, read-only after: the file table
	                                (store/ftab.c; its own locks), or NULL */
};

/* Records the calling thread's error message for archive a (util/err.c;
 * under ULP_DEBUG with the source location); returns code. */
#define ulp_arch_err(a, code, ...) ulp_msgs_set((a)->msgs, (code), __FILE__, __LINE__, __VA_ARGS__)
/* The same for a failed system call on path: "path: what: strerror(errno)",
 * NOSPC or IO. */
#define ulp_arch_io_err(a, path, what) ulp_msgs_errno((a)->msgs, errno, __FILE__, __LINE__, (path), (what))


#endif
