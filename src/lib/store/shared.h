/* SPDX-License-Identifier: MIT */
/*
 * shared.h - an archive that many hosts share (DESIGN.md section 7): its
 * published index generations (gen.c) and its writer's lease (lease.c).
 * An archive is shared once ARCHIVE/index/ exists (ulp_archive_share).
 * Both reach the archive's home (the shared directory, or a bucket) only
 * through its table, a->home (home.h).
 *
 * On disk, beside ulpack.db, packs/ and staging/:
 *   index/gen-<20 digits>.db   a generation: a consistent copy of ulpack.db
 *                              (SQLite's online backup), journal mode DELETE,
 *                              never written again; readers open it with
 *                              immutable=1 (no locks, no -wal, no -shm)
 *   index/gen-<20 digits>.patch  a generation as the pages that differ from
 *                              a whole one, its base (genvfs.c has the format)
 *   index/gen-<20 digits>.hash   a whole generation's page hashes, for the
 *                              next writer's patches (gen.c write_hashes)
 *   index/CURRENT              "ulpack-current 1 GEN EPOCH BYTES\n" (whole) or
 *                              "ulpack-current 2 GEN EPOCH BYTES BASE\n" (a
 *                              patch of generation BASE): the newest
 *                              generation, the epoch of the writer that
 *                              published it and the file's size
 *   lease/<20 digits>          the writer lease of that epoch:
 *                              "ulpack-lease 1 EPOCH RENEWED_MS LEASE_MS PID HOST\n"
 *                              (RENEWED_MS: wall clock, ms since 1970; 0:
 *                              given back at close)
 * The live ulpack.db stays the writer's alone: SQLite's WAL needs memory
 * shared by its readers, which hosts do not share (measured stale and
 * "malformed" pages over GlusterFS: ../shared/notes/scaleout-measured.md).
 */
#ifndef ULP_SHARED_H
#define ULP_SHARED_H

#include "arch_int.h"

#define ULP_GEN_KEEP 4              /* generations kept beside the current one's
                                       predecessors younger than the grace */
#define ULP_POLL_MS_DEFAULT 2000    /* a reader looks for a new generation */
#define ULP_LEASE_MS_DEFAULT 15000  /* a writer's lease lasts, unless renewed */
#define ULP_GRACE_S_DEFAULT 600     /* a superseded generation and a pack the index
                                       dropped stay this long */

/* A staged file archived by the writer, kept until a publication that
 * started after it was archived holds it (gen.c invariant 8). */
typedef struct ulp_retained {
	char *data, *meta;           /* its staging files */
	uint64_t seq;                /* pub_started when it was retained */
	struct ulp_retained *next;
} ulp_retained;

/*
 * The shared state of an archive handle (a->sh), NULL for an archive that
 * is not shared. Lock order: sh->mu is taken under write_mu and never the
 * other way; no index call is made under it.
 */
struct ulp_shared {
	int writer;                  /* set at open, read-only after: holds a lease */
	unsigned poll_ms, lease_ms, grace_s; /* set at open, read-only after */
	char host[256];              /* set at open, read-only after: gethostname */
	pthread_mutex_t mu;
	/* generations (gen.c) */
	uint64_t gen, gen_epoch;     /* guarded by mu: the generation followed (reader) or
	                                last published (writer) and its epoch */
	uint64_t oldest_kept;        /* guarded by mu: the writer's oldest generation kept
	                                as one (not only as a patch's base: gen.c
	                                invariant 4); 0: none known */
	int64_t next_poll_ms;        /* atomic: monotonic time of a reader's next look at
	                                CURRENT */
	pthread_mutex_t pub_mu;      /* one publication at a time (taken before mu) */
	uint64_t published_changes;  /* guarded by pub_mu: a->w->commits at the last
	                                publication */
	int64_t published_ms;        /* guarded by pub_mu: monotonic time of it */
	uint64_t base_gen;           /* guarded by pub_mu: the last generation published
	                                whole (0: none yet), which patches build on */
	uint32_t base_page_size, base_pages; /* guarded by pub_mu: its geometry */
	uint64_t *base_hash;         /* guarded by pub_mu: XXH3 of each of its pages */
	int old_pointers_gone;       /* guarded by pub_mu: earlier epochs' pointers and
	                                live files removed (gen.c invariant 7) */
	uint64_t pub_started;        /* guarded by mu: publications started */
	ulp_retained *retained;      /* guarded by mu: staged files waiting for a
	                                publication (gen.c invariant 8) */
	int opened;                  /* atomic: the archive opened whole; until then
	                                nothing is published (a failed open publishes
	                                nothing) */
	/* the lease (lease.c) */
	uint64_t epoch;              /* set at open, read-only after (writer) */
	int64_t ok_mono_ms;          /* atomic: monotonic start of the last renewal that
	                                succeeded; the lease holds until ok + 3/4 lease */
	int fenced;                  /* atomic: 1 once the lease is lost, for good */
	int64_t renewing_since;      /* atomic: monotonic start of the renewal under way
	                                (0: none), for the message of a lapse */
	char why[512];               /* guarded by mu: why it was lost */
	char renew_err[320];         /* guarded by mu: why the last renewal failed ("": it
	                                did not), for the message of a lapse */
	pthread_t renewer;           /* guarded by mu: renews the lease (lease.c invariant 4) */
	pthread_mutex_t renew_mu;    /* one renewal at a time (the renewer's, an open's);
	                                taken before mu */
	void (*on_renewer)(ulp_archive *a); /* set at open, read-only after: started
	                                beside the renewer in the process that writes
	                                (archive/upkeep.c), or NULL */
	long renewer_pid;            /* atomic, written under mu: the process the
	                                renewer runs in (0: none yet) */
	int stop;                    /* guarded by mu: the renewer ends */
	pthread_cond_t cv;           /* with mu: wakes it to end */
	/* an archive in a bucket: its background thread (gen.c invariant 9) */
	pthread_t poller;            /* guarded by mu */
	long poller_pid;             /* atomic, written under mu: the process it runs in
	                                (0: none yet) */
	int poll_wanted;             /* guarded by mu: a reader's look at CURRENT is due */
	int usage_wanted;            /* guarded by mu: a listing of the bucket is asked for */
	uint64_t usage_rounds;       /* guarded by mu: listings it made (or tried) */
	int poller_stop;             /* guarded by mu: it ends (the handle closes) */
	pthread_cond_t poll_cv;      /* with mu: wakes it, and waiters of a listing */
};


/* gen.c */
/* gen.c, at the library's read entry points: a reader of a shared archive
 * looks for a newer generation when due, and the calling thread moves its
 * connection to the one followed (ulp_db_refollow). */
void ulp_gen_follow(ulp_archive *a);
void ulp_gen_refresh(ulp_archive *a); /* ulp_gen_poll now: the refresh hook */
void ulp_gen_poll(ulp_archive *a, int force);
int ulp_gen_is_shared(const char *dir);
int ulp_gen_reader_open(ulp_archive *a, ulp_err *err);
int ulp_gen_publish(ulp_archive *a, int force);
void ulp_gen_retire(ulp_archive *a);
int ulp_gen_oldest(ulp_archive *a, uint64_t *oldest);
/* Wall ms of the last publication (ulp_status_get): the writer's own, a
 * reader's generation file's mtime (a directory archive); 0: none known. */
int64_t ulp_gen_published_ms(ulp_archive *a);
/* An archive in a bucket: asks the background thread for a listing of the
 * bucket (rm->usage) and waits at most wait_ms for one to end. */
void ulp_gen_usage_refresh(ulp_archive *a, unsigned wait_ms);
/* An archive in a bucket (remote.h): the writer's local home made current
 * with the bucket's generation before the lease (its live index rebuilt
 * from it where another writer moved on), the pointer claimed for the new
 * epoch after it (BUSY: another writer won). */
int ulp_gen_remote_writer(ulp_archive *a, ulp_err *err);
int ulp_gen_remote_claim(ulp_archive *a, ulp_err *err);
/* A writer on a directory, its lease taken and staging claimed: its live
 * index rebuilt from the newest generation (invariant 7). */
int ulp_gen_writer_open(ulp_archive *a, ulp_err *err);
/* Keeps a staged file's two files until a publication holds it (gen.c
 * invariant 8); NOMEM: not kept (the caller removes them). */
int ulp_shared_retain(ulp_archive *a, const char *data, const char *meta);
/* The list of retained files let go, their files left for the next writer. */
void ulp_shared_forget_retained(ulp_archive *a);
int ulp_netfs(const char *dir, char *name, size_t cap);
/* lease.c: writes data into path whole (a temporary and a rename); durable: fsynced
 * with its directory. */
int ulp_shared_replace_file(ulp_archive *a, const char *path, const char *data, size_t n, int durable);
int ulp_shared_new(ulp_archive *a, const ulp_archive_opts *o, int writer);
void ulp_shared_free(ulp_archive *a);

/* genvfs.c: a generation published as a patch of a base generation */
#define ULP_GENPATCH_HEADER 40
typedef struct ulp_genpatch {
	uint64_t base;           /* the base generation */
	uint32_t page_size, n_pages, n_patch;
	const uint8_t *pgno;     /* n_patch u32 (little endian), ascending */
	const uint8_t *pages;    /* n_patch pages */
} ulp_genpatch;
/* Checks a patch file's bytes whole (genvfs.c invariant 1): 0 or CORRUPT. */
int ulp_genpatch_parse(const uint8_t *m, size_t len, ulp_genpatch *out);
/* The "ulpgen" SQLite VFS, registered once: 0 or UNSUPPORTED. */
int ulp_genvfs_register(void);

/* The pace of the writer's threads (the renewer, the publisher): a second,
 * at most a quarter lease. */
static inline int64_t ulp_lease_tick_ms(const ulp_shared *sh)
{
	return sh->lease_ms < 4000 ? (int64_t)sh->lease_ms / 4 : 1000;
}

/* lease.c */
int ulp_lease_take(ulp_archive *a, ulp_err *err);
/* Stops the renewer and gives the lease back (renewed 0), calling publish
 * (gen.c's ulp_gen_publish: what was archived last) first while it holds. */
void ulp_lease_give_back(ulp_archive *a, int (*publish)(ulp_archive *a, int force));
/* The lease's holder (ulp_status_get): this handle's where it holds it, else
 * the newest lease file's (the bucket's lease object): host ("" none known)
 * and epoch (0: none). Errors as the archive's. */
int ulp_lease_holder(ulp_archive *a, char *host, size_t cap, uint64_t *epoch);
int ulp_lease_ok(ulp_archive *a);
/* Renews the lease now, as the renewer does (while it holds): for the
 * steps of a writer's open that take long on a network file system (the
 * claim of staging, the live index rebuilt), before the renewer's first
 * tick. 0, or FENCED. */
int ulp_lease_refresh(ulp_archive *a);
/* Fences the writer for good (invariant 2 of lease.c), saying why (once). */
void ulp_lease_fence(ulp_archive *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
extern int ulp_lease_test_stall;
extern unsigned ulp_gen_test_publish_delay_ms; /* tests: each publication takes this much longer */ /* tests: renewals fail (a partition) */

#endif
