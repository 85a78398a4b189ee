/* SPDX-License-Identifier: MIT */
/*
 * arch_int.h - internals shared by the store and the archive modules.
 * store/: db.c (connections and schema of the SQLite index), index.c (its
 * rows), namespace.c (operations on its entries) - the only users of
 * sqlite3.h -, path.c (path rules), pack.c (sole writer and mapper of pack
 * files). archive/: cache.c (the decode cache),
 * read.c (files as byte ranges over chunks), ingest.c (archiving a file),
 * maint.c (verify, remove, gc, report), and the others of that folder.
 *
 * The archive handle's parts, each with its own lock (struct ulp_archive
 * below says which lock guards each field, and the order of the locks):
 *  - the pack store, a->ps (struct ulp_packstore, private to pack.c): the
 *    table of mapped packs and the pages given back in batches, guarded by
 *    ps->mu; its backend (store/backend.h, private to pack.c and its
 *    backends: put, read a range, map, list, remove, publish), chosen at
 *    open: the local directory ARCHIVE/packs (backend_dir.c);
 *  - the db handle, a->dbh (struct ulp_dbh, private to db.c): the key of
 *    each thread's index connection and error text, and the list of them
 *    that close frees, guarded by dbh->mu;
 *  - a->mu: the ingest's spare jobs, the read-ahead, the expected files;
 *    a->write_mu: one writer at a time, and the pipelined put's inflight.
 */
#ifndef ULP_ARCH_INT_H
#define ULP_ARCH_INT_H

#include "ulp_int.h"
#include <pthread.h>

/* ---- decode cache (cache.c) -------------------------------------------- */

enum { ULP_CK_CHUNK = 0, ULP_CK_BLOB = 1 };

typedef struct ulp_ckey {
	uint8_t sha[ULP_SHA256_LEN]; /* content */
	uint32_t chunk;              /* chunk index (ULP_CK_CHUNK) */
	uint32_t kind;               /* ULP_CK_* */
} ulp_ckey;

typedef struct ulp_cache ulp_cache;
typedef struct ulp_centry ulp_centry;

int ulp_cache_new(uint64_t cap, ulp_cache **out);
void ulp_cache_free(ulp_cache *c);
/*
 * Looks key up and pins the entry. If it is loaded, *data is its value and
 * *must_load 0. If not, exactly one caller gets *must_load 1 and must call
 * ulp_cache_fill() or ulp_cache_fail(); the others wait for it (one decode
 * when several threads want the same chunk). Returns a negative error if the
 * loader failed.
 */
int ulp_cache_get(ulp_cache *c, const ulp_ckey *key, ulp_centry **e, void **data, int *must_load);
void ulp_cache_fill(ulp_cache *c, ulp_centry *e, void *data, size_t size, void (*destroy)(void *));
void ulp_cache_fail(ulp_cache *c, ulp_centry *e, int rc);
/* Unpins; the entry may then be evicted (LRU by bytes). */
void ulp_cache_put(ulp_cache *c, ulp_centry *e);
/* ulp_cache_put, but an entry it leaves unpinned goes first when space is
 * needed (a value whose user is done with it, likely not wanted soon). */
void ulp_cache_put_cold(ulp_cache *c, ulp_centry *e);
/* A reference's chunk after its delta was decoded: cold if its own file's
 * reader has had it (a forward delta read in step order), else kept warm (a
 * backward delta: the step after, read next, layout.c invariant 4). */
void ulp_cache_put_ref(ulp_cache *c, ulp_centry *e);
/* Notes that a pinned chunk was returned to a reader of its own file (not
 * only used as a reference): once released cold it may be recycled. */
void ulp_cache_mark_served(ulp_centry *e);
/* A buffer of size bytes for a chunk, reusing evicted ones where possible;
 * its destroy function is ulp_cache_free_buf. */
void *ulp_cache_alloc(ulp_cache *c, size_t size);
/* Drops key's entry if it is loaded and unpinned; its buffer is kept for
 * ulp_cache_alloc (a value that is no longer wanted, not a failure). */
void ulp_cache_retire(ulp_cache *c, const ulp_ckey *key);
/* 1 and the entry pinned (*e, *data, *size) if key is loaded; else 0, and
 * nothing is created or waited for (a walk that only wants what is there). */
int ulp_cache_peek(ulp_cache *c, const ulp_ckey *key, ulp_centry **e, void **data, size_t *size);
/* 1 if key has an entry, loaded or being loaded; pins, creates and waits
 * for nothing (a hint: the answer may be stale as soon as it returns). */
int ulp_cache_has(ulp_cache *c, const ulp_ckey *key);
/* Drops the loaded, unpinned entries for which drop() returns 1 (under the
 * cache's lock: drop must not call the cache). */
void ulp_cache_purge(ulp_cache *c, int (*drop)(void *arg, const ulp_ckey *key, void *data), void *arg);
void ulp_cache_free_buf(void *p);
/* A buffer of ulp_cache_alloc that entered no entry (a lone walk's, read.c)
 * given back: kept for the next ulp_cache_alloc of its size, else freed. */
void ulp_cache_give_buf(ulp_cache *c, void *p);
uint64_t ulp_cache_bytes(ulp_cache *c);
uint64_t ulp_cache_recycled(ulp_cache *c); /* buffers ulp_cache_alloc took from cold entries */
/* Debug check of the invariants (cache.c header). */
int ulp_cache_state_ok(ulp_cache *c);

/* ---- the archive handle ------------------------------------------------- */

typedef struct ulp_tstate ulp_tstate; /* per-thread: index connection, error text */
typedef struct ulp_packstore ulp_packstore; /* pack.c: mapped packs, their lock */
typedef struct ulp_shared ulp_shared; /* store/shared.h: generations, lease */
typedef struct ulp_remote ulp_remote; /* store/remote.h: a home in an S3 bucket */
typedef struct ulp_dbh ulp_dbh;  /* db.c: the thread states' key and list, their lock */
typedef struct ulp_upkeep ulp_upkeep; /* archive/upkeep.c: a shared archive writer's publisher */
/* upkeep.c: made for a shared archive's writer at open (after its lease);
 * stopped at close before the lease is given back, publishing last */
int ulp_upkeep_new(ulp_archive *a);
void ulp_upkeep_stop(ulp_archive *a);

/* A file an import is about to put (ulp_archive_expect, layout.c). */
typedef struct ulp_expected {
	char *series, *path;
	int64_t step;
} ulp_expected;

/*
 * Locks of an archive: write_mu (one writer) is taken first and held across
 * a whole put, gc or re-coding commit. mu, the pack store's ps->mu and the
 * database handle's dbh->mu are leaf locks: each is held for a few field
 * updates only, and no other lock is taken while it is held (no index or
 * cache call, no ulp_arch_err, which may take dbh->mu, under them). The
 * pack store's refetch_mu (pack.c invariant 6) is held across a fetch of
 * a pack from an object store, after write_mu where both are, with no
 * leaf lock held when it is taken.
 */
struct ulp_archive {
	char *dir;                   /* set at open, read-only after */
	ulp_msgs *msgs;              /* set at open, read-only after: each thread's last
	                                error message (ulp_arch_err, ulp_archive_errmsg) */
	int read_only;               /* set at open, read-only after */
	char *db_uri;                /* set at open, read-only after: read-only, SQLite
	                                unable to read the index in place: the URI every
	                                connection opens (db.c, ulp_db_check), else NULL */
	char *live;                  /* set at open, read-only after: the live index of a
	                                shared archive's writer on a directory
	                                (index/live-E.db, gen.c invariant 7), else NULL:
	                                ulpack.db (ulp_db_live_path) */
	ulp_upkeep *upkeep;          /* set at open, read-only after: a shared archive
	                                writer's publisher (archive/upkeep.c), or NULL */
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
	pthread_mutex_t mu;          /* guards spare_jobs, ra, expect, n_expect, recent */
	ulp_cache *cache;            /* set at open, read-only after (its own lock) */
	ulp_pool *pool;              /* set at open, read-only after (its own lock) */
	pthread_mutex_t write_mu;    /* one writer at a time in this process; guards inflight */
	ulp_packstore *ps;           /* set at open, read-only after: the pack store
	                                (pack.c), guarded by ps->mu */
	struct job *spare_jobs;      /* guarded by mu: the ingest's job set with its
	                                buffers, kept between files (ingest.c) */
	struct readahead *ra;        /* guarded by mu: sequential read-ahead (read.c),
	                                started on first use, or NULL; stopped at close
	                                once no other thread uses the archive */
	ulp_expected *expect;        /* guarded by mu: files an import will put (layout.c) */
	size_t n_expect;             /* guarded by mu */
	struct ulp_recent {          /* guarded by mu: the files of a series read lately,
	                                and the run directories listed lately, which
	                                tell a sweep from a lone read (read.c) */
		uint64_t series, file;   /* hashes of the series and of the path; of a
		                            listed directory and 0 */
		int64_t ms;              /* when its first read came (CLOCK_MONOTONIC) */
	} recent[16];
	/* counters, atomic */
	uint64_t chunks_decoded, deltas_decoded, hits, misses, max_walk;
	uint64_t put_done;           /* atomic: bytes of the file being put that are coded
	                                (ulp_archive_put_progress) */
	ulp_shared *sh;              /* set at open, read-only after: a shared archive's
	                                generations and lease (store/shared.h), or NULL;
	                                its fields guarded by sh->mu */
	ulp_archive_opts opts;       /* set at open, read-only after: as given */
	ulp_remote *rm;              /* set at open, read-only after: the home in a
	                                bucket (store/remote.h), or NULL; dir is then
	                                the local home */
	int follow;                  /* set at open, read-only after: read-only on a
	                                shared archive: connections open the published
	                                generation that dbh names (gen.c) */
	uint64_t commits;            /* atomic: index transactions committed (gen.c
	                                publishes when it moved) */
	struct coded *inflight;      /* guarded by write_mu: a pipelined put's file whose
	                                commit is not over (ulp_putq, ingest.c): set by
	                                the writer between files, read by the jobs of the
	                                next file (started and joined under write_mu) */
};

/* Records the calling thread's error message for archive a (util/err.c;
 * under ULP_DEBUG with the source location); returns code. */
#define ulp_arch_err(a, code, ...) ulp_msgs_set((a)->msgs, (code), __FILE__, __LINE__, __VA_ARGS__)
/* The same for a failed system call on path: "path: what: strerror(errno)",
 * NOSPC or IO. */
#define ulp_arch_io_err(a, path, what) ulp_msgs_errno((a)->msgs, errno, __FILE__, __LINE__, (path), (what))

/* ---- index (store/: db.c, index.c, namespace.c) ---------------------- */

#define ULP_SCHEMA_VERSION 4

/* The generation that a following reader's new connections open (gen.c):
 * uri, which the dbh takes; its threads move to it at their next
 * ulp_gen_follow. */
void ulp_db_set_follow(ulp_archive *a, char *uri);
/* namespace.c: the listing under ulp_archive_readdir (archive/read.c, which
 * notes a run's directory for its reads: read.c invariant 8); *run_dir: the
 * directory holds two step directories or more (its archive path in dir). */
int ulp_ns_readdir(ulp_archive *a, const char *path, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                   void *arg, char *dir, size_t dir_cap, int *run_dir);
/* A file: URI of path (percent-encoded) with query q; NULL: no memory. */
char *ulp_db_file_uri(const char *path, const char *q);
/* The calling thread's connection moves to the generation followed when it
 * runs no statement (gen.c invariant 3; a reader of a shared archive). */
void ulp_db_refollow(ulp_archive *a);
/* A shared archive's hooks into the connection layer, installed at open
 * (archive.c): fence, checked before a transaction begins and as it
 * commits (lease.c invariant 1: ulp_lease_ok); refresh, when a following
 * reader's generation cannot be opened (gen.c: the newest). db.c calls
 * nothing above itself. */
void ulp_db_set_hooks(ulp_archive *a, int (*fence)(ulp_archive *a), void (*refresh)(ulp_archive *a));
/* gen.c, at the library's read entry points: a reader of a shared archive
 * looks for a newer generation when due, and the calling thread moves its
 * connection to the one followed (ulp_db_refollow). */
void ulp_gen_follow(ulp_archive *a);
void ulp_gen_refresh(ulp_archive *a); /* ulp_gen_poll now: the refresh hook */
/* Opens two connections ahead for the first threads that ask (a hint, at
 * archive open): a mount's first lookup and open then open none (issue 29:
 * a good part of a small file's cold open). */
void ulp_db_open_ahead(ulp_archive *a);
void ulp_gen_poll(ulp_archive *a, int force);
/* A shared archive's writer may write (lease.c invariant 1): 0, or FENCED
 * with why; 0 for any other archive. */
int ulp_lease_ok(ulp_archive *a);
/* Removes the packs whose grace passed (maint.c invariant 7); wait: for
 * write_mu, else only when it is free. */
int ulp_archive_grace_sweep(ulp_archive *a, int wait);

/* Packs kept for the grace (index.c invariant 7): recorded with the
 * generation last published; the rows due (recorded before before_ms, under
 * generation below_gen) are deleted and cb called with each name. */
int ulp_index_grace_add(ulp_archive *a, const char *name, uint64_t gen);
int ulp_index_grace_has(ulp_archive *a, const char *name);
int ulp_index_grace_due(ulp_archive *a, int64_t before_ms, uint64_t below_gen,
                        int (*cb)(void *arg, const char *name), void *arg);

typedef struct sqlite3 sqlite3;
typedef struct sqlite3_stmt sqlite3_stmt;

/* The calling thread's connection (opened on first use); NULL on error
 * (message recorded). */
sqlite3 *ulp_db(ulp_archive *a);
int ulp_db_create(const char *path, ulp_err *err);
int ulp_db_check(ulp_archive *a, ulp_err *err);
void ulp_db_free_copy(ulp_archive *a); /* at close: db_uri, db_copy, live */
/* staging.c: frees s after its file was archived: its files go, or, on a
 * shared archive's writer, stay until a publication holds it (invariant 6) */
void ulp_stage_archived(ulp_stage *s);
/* staging.c invariant 5: a new writer of a shared archive on a directory
 * claims the staged files it did not make */
int ulp_stage_claim(ulp_archive *a);
/* The file of the live index a writer's connections open: a->live or
 * ARCHIVE/ulpack.db. */
void ulp_db_live_path(const ulp_archive *a, char *p, size_t cap);
int ulp_db_exec(ulp_archive *a, const char *sql);
int ulp_db_begin(ulp_archive *a);   /* BEGIN IMMEDIATE, retried while busy */
int ulp_db_commit(ulp_archive *a);
void ulp_db_rollback(ulp_archive *a);
/* The calling thread's prepared statement for sql (cached per connection;
 * sql a static string) in *out; 0, or ulp_db_err's code (out of memory:
 * NOMEM, else IO and the like, with SQLite's message in the errmsg). */
int ulp_db_stmt(ulp_archive *a, const char *sql, sqlite3_stmt **out);
/* The ULP_E_* of the last failed SQLite call on the calling thread's
 * connection (or of opening it), its message recorded naming the index and
 * what failed; the one mapping of SQLite's codes. */
int ulp_db_err(ulp_archive *a, const char *what);
/* Steps st once and resets it: 0 (done or a row), or ulp_db_err(a, what). */
int ulp_db_step_rc(ulp_archive *a, sqlite3_stmt *st, const char *what);
/* Binds time t to parameters ns (mtime_ns) and sec, sec + 1 (mtime_sec,
 * mtime_nsec) of st: index.c invariant 6. */
void ulp_index_bind_time(sqlite3_stmt *st, int ns, int sec, ulp_time t);
/* The columns ulp_stat_from_row reads (ULP_ENTRY_COLS_V2 in an index of
 * schema version 1 to 3, opened read-only: no mtime_sec, mtime_nsec). */
#define ULP_ENTRY_COLS_ "type, size, mode, uid, gid, mtime_ns, sha256, stored, step, depth, anchor, kind, length(CAST(target AS BLOB))"
#define ULP_ENTRY_COLS ULP_ENTRY_COLS_ ", mtime_sec, mtime_nsec"
#define ULP_ENTRY_COLS_V2 ULP_ENTRY_COLS_ ", NULL, NULL"
#define ULP_ENTRY_NCOLS 15 /* the first column after ULP_ENTRY_COLS */
/* Byte-safe prefix matching (index.c invariant 4): the entries below
 * directory ?1 are the paths in [?1 || '/', ?1 || '0'), '0' being the byte
 * after '/'. The BINARY collation compares bytes (memcmp), whereas length()
 * and substr() count characters of TEXT: "données" is 8 bytes but 7
 * characters, so a substr() of a byte count never matched (issue 11, 2). */
#define ULP_BELOW(col, arg) "(" col " >= " arg " || '/' AND " col " < " arg " || '0')"
void ulp_tstate_free_all(ulp_archive *a);
/* The database handle, a->dbh: made first at open (ulp_arch_err needs it),
 * freed at close with every thread's connection. */
int ulp_dbh_open(ulp_archive *a);
void ulp_dbh_close(ulp_archive *a);
void ulp_ingest_free_spare(ulp_archive *a); /* ingest.c */
/* Streamed tensors (ingest.c, also used by recode.c): the size above which a
 * tensor is coded a window at a time (ULP_STREAM_MIN, default 64 MiB); an
 * unnamed spill file beside the packs (fd, or -1 and errno) and its I/O. */
uint64_t ulp_stream_min(void);
int ulp_spill_open(ulp_archive *a);
int ulp_spill_io(int fd, uint64_t off, void *p, size_t len, int wr);
/* The chain a content decodes through (itself first; at most ULP_CHAIN_MAX),
 * and chunk k of each let go from the cache (ingest.c). */
#define ULP_CHAIN_MAX (ULP_MAX_CHAIN + 2)
size_t ulp_chain_of(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint8_t (*out)[ULP_SHA256_LEN]);
void ulp_chain_retire(ulp_archive *a, const uint8_t (*chain)[ULP_SHA256_LEN], size_t n, uint32_t k);
void ulp_readahead_stop(ulp_archive *a);    /* read.c: joins its thread */
void ulp_tstate_exit(void *tstate); /* the thread-state key's destructor */
size_t ulp_tstate_count(ulp_archive *a); /* live thread states (tests) */

/* Entry types of the index */
enum { ULP_ENT_FILE = 0, ULP_ENT_DIR = 1, ULP_ENT_LINK = 2 };

/* A blob row. */
typedef struct ulp_blobrow {
	int64_t id;
	int64_t pack;
	uint64_t offset, stored, raw;
	unsigned depth;
	int codec;
} ulp_blobrow;
int ulp_index_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], ulp_blobrow *out);
int ulp_index_pack_name(ulp_archive *a, int64_t id, char *name, size_t cap);
/* The same, and its size as the index has it (*size). */
int ulp_index_pack_row(ulp_archive *a, int64_t id, char *name, size_t cap, uint64_t *size);

/* One extent of a file: bytes [offset, offset + length) are the content. */
typedef struct ulp_extent {
	uint64_t offset, length;
	uint8_t content[ULP_SHA256_LEN];
} ulp_extent;
/* A file's metadata, stored header (malloc'd, may be NULL) and extents
 * (malloc'd) in offset order. Errors: NOENT. */
int ulp_index_file(ulp_archive *a, const char *path, ulp_stat *st, uint8_t **header,
                   size_t *header_len, ulp_extent **ext, size_t *n_ext);

/* Calls cb for each entry (under prefix) that no directory reaches
 * (invariant 4 of index.c); returns how many, or a negative ULP_E_*. */
int ulp_index_orphans(ulp_archive *a, const char *prefix,
                      void (*cb)(void *arg, const char *path, const char *why), void *arg);

/* What one put adds to the index (ingest.c builds it, index.c stores it). */
typedef struct ulp_newblob {
	uint8_t content[ULP_SHA256_LEN];
	uint8_t ref[ULP_SHA256_LEN];
	int has_ref;
	int codec;
	unsigned depth;
	uint64_t raw, stored, offset; /* offset in the new pack */
	size_t chunk;                 /* bytes of a chunk of its content (ingest.c: the
	                                 cache's geometry for a pipelined put) */
} ulp_newblob;
typedef struct ulp_newext {
	uint64_t offset, length;
	uint8_t content[ULP_SHA256_LEN];
	const char *name;             /* tensor name or NULL */
	int dtype;                    /* ulp_dtype, -1 for opaque bytes */
} ulp_newext;
typedef struct ulp_newfile {
	const char *path;
	ulp_meta meta;
	int type;                     /* ULP_ENT_FILE or ULP_ENT_LINK */
	const char *target;           /* symlinks */
	int kind;
	const uint8_t *header;
	size_t header_len;
	uint64_t size;
	uint8_t sha[ULP_SHA256_LEN];
	uint64_t stored;
	unsigned depth;
	int anchor;
} ulp_newfile;
/* Stores a file (inside the caller's transaction): its parents, the pack
 * (pack_name NULL if none), the new blobs, the entry (replacing any file or
 * symlink at its path) and its extents. */
int ulp_index_put_file(ulp_archive *a, const ulp_newfile *f, const char *pack_name,
                       uint64_t pack_size, const ulp_newblob *b, size_t nb, const ulp_newext *x,
                       size_t nx);
/* The archived file of series nearest to step (either side), other than
 * path; *id = -1 if none. */
/* Calls cb for each archived file of a series (id, step, path). */
int ulp_index_series_steps(ulp_archive *a, const char *series,
                           int (*cb)(void *arg, int64_t id, int64_t step, const char *path), void *arg);
/* The target layout (layout.c): reference position of position i of n
 * (-1: an anchor), its depth, the position of segment 0's key (-1: it
 * has none), the order of puts that archives every reference before its
 * dependents (fills order[n], returns n). */
ptrdiff_t ulp_layout_ref(size_t i, size_t n, unsigned max_chain);
unsigned ulp_layout_depth(size_t i, size_t n, unsigned max_chain);
ptrdiff_t ulp_layout_key(size_t n, unsigned max_chain);
size_t ulp_layout_order(size_t n, unsigned max_chain, size_t *order);
/* The file a file of series at step is to be coded against in the target
 * layout of its series (archived files and expected ones, and it): *ref_id
 * -1 for an anchor, or when that file is not archived yet. */
int ulp_layout_target(ulp_archive *a, const char *series, int64_t step, const char *path, int64_t *ref_id,
                      char *ref_path, size_t cap);
void ulp_layout_forget_expected(ulp_archive *a);
int ulp_index_nearest(ulp_archive *a, const char *series, int64_t step, const char *path,
                      int64_t *id, char *ref_path, size_t cap);
/* The content of tensor name (dtype, length bytes) in file id, and its blob. */
int ulp_index_tensor(ulp_archive *a, int64_t file, const char *name, int dtype, uint64_t length,
                     uint8_t content[ULP_SHA256_LEN], ulp_blobrow *row);
/* Creates the directories above path that do not exist (mode 0755). */
int ulp_index_mkdirs(ulp_archive *a, const char *path, ulp_time mtime);

/* Files (type 0) under prefix, in step order. */
int ulp_index_files(ulp_archive *a, const char *prefix,
                    int (*cb)(void *arg, const char *path, const ulp_stat *st), void *arg);
/* gc support: drop unreachable blobs; list packs with their live bytes;
 * list a pack's blobs; add a pack (or find the row of a pack of that name:
 * the same bytes); move a blob; drop an empty pack. */
int ulp_index_gc_sweep(ulp_archive *a, uint64_t *removed);
int ulp_index_packs(ulp_archive *a, int (*cb)(void *arg, int64_t id, const char *name, uint64_t size,
                                              uint64_t live_bytes, uint64_t live_blobs), void *arg);
/* One pack's size and the bytes and count of the blob rows in it: 1, or 0
 * if the index has no such pack, or a negative error. */
int ulp_index_pack(ulp_archive *a, int64_t id, uint64_t *size, uint64_t *live_bytes, uint64_t *live_blobs);
int ulp_index_pack_blobs(ulp_archive *a, int64_t pack,
                         int (*cb)(void *arg, const uint8_t *content, uint64_t offset, uint64_t stored),
                         void *arg);
int ulp_index_pack_add(ulp_archive *a, const char *name, uint64_t size, int64_t *id);
int ulp_index_blob_move(ulp_archive *a, const uint8_t *content, int64_t pack, uint64_t offset);
int ulp_index_pack_drop(ulp_archive *a, int64_t pack);
/* 1 if the index names pack file name, 0 if not, or a negative error. */
int ulp_index_has_pack(ulp_archive *a, const char *name);
/* The index's share of ulp_archive_space: packs, live bytes (gc invariant
 * 1), packs with nothing live or under pct live, pending re-codes. */
int ulp_index_space(ulp_archive *a, unsigned pct, ulp_space *sp);
/* Truncates the write-ahead log if no reader holds it (else nothing). */
void ulp_index_checkpoint(ulp_archive *a);
/* The index's reserve for removing on a full disk (db.c): allocated where
 * there is room for 1.25 ULP_DB_RESERVE (read-write opens, reclaiming);
 * ulp_db_nospc_retry, for a removal or a reclaim that failed with NOSPC,
 * checkpoints and releases it: 1 if that freed space (try once more);
 * ulp_db_reserve_release releases it alone. */
#define ULP_DB_RESERVE ((uint64_t)1 << 20)
void ulp_db_reserve_make(ulp_archive *a);
int ulp_db_reserve_release(ulp_archive *a);
int ulp_db_nospc_retry(ulp_archive *a);

/* Every blob of the chains of file path (its extents' blobs and their
 * references, transitively): content, pack, offset, stored size. */
int ulp_index_file_blobs(ulp_archive *a, const char *path,
                         int (*cb)(void *arg, const uint8_t *content, int64_t pack, uint64_t offset,
                                   uint64_t stored),
                         void *arg);

/* Directory part of path (malloc'd) and its last component. */
char *ulp_path_parent(const char *path);
const char *ulp_path_name(const char *path);
/* Normalizes a user path to the archive form; -INVAL for '..' or NUL. */
int ulp_path_clean(const char *in, char *out, size_t cap);
/* ulp_path_clean for a path a caller gave: INVAL or NAMETOOLONG with a
 * message naming the path in a's errmsg. */
int ulp_arch_path(ulp_archive *a, const char *path, char *out, size_t cap);
/* The cause of a path that cannot be created (what), as a's error: NAMETOOLONG
 * for a too long name (ENAMETOOLONG at the FUSE edge), else 0. */
int ulp_path_bad(ulp_archive *a, const char *path, const char *what);
/* The step parser (path.c): the digits after the first of keys (in their
 * order) found in [start, end) followed by a digit, where it starts a word
 * (no letter before it, unless the key starts with "global"), or NULL. With
 * after_global 0 a key right after "global_" (DeepSpeed's global_stepN) does
 * not count. ulp_parse_step and ulp_name_step are rules over it. */
const char *ulp_step_key(const char *start, const char *end, const char *const *keys, size_t n_keys,
                         int after_global);

/* ---- re-basing support (index.c, for recode.c) ---------------------------- */

/* A blob row with its reference. */
typedef struct ulp_rbblob {
	uint8_t content[ULP_SHA256_LEN];
	uint8_t ref[ULP_SHA256_LEN];
	int has_ref;
	unsigned depth;
	int codec;
	int64_t pack;
	uint64_t offset, stored, raw;
} ulp_rbblob;
/* One tensor of an archived file (strings valid during the callback). */
typedef struct ulp_rbtensor {
	int64_t file;
	const char *path, *series, *name;
	int64_t step;
	int dtype;
	uint64_t length;
	uint8_t content[ULP_SHA256_LEN];
} ulp_rbtensor;
/* A re-coded blob to commit: content's row moves to (pack, offset) of the
 * new pack with a new codec and reference, if it is still old. */
typedef struct ulp_rebased {
	uint8_t content[ULP_SHA256_LEN];
	uint8_t ref[ULP_SHA256_LEN]; /* new reference, if has_ref */
	int has_ref, codec;
	uint64_t offset, stored;     /* in the new pack */
	ulp_rbblob old;              /* the row as planned */
	int applied;                 /* out: 1 if the row was changed */
} ulp_rebased;
int ulp_index_blob_ref(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN], ulp_rbblob *out);
/* Longest chain below content (0: no dependent); live_only: through blobs an
 * extent uses only. */
int ulp_index_height(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN], int live_only, unsigned *h);
/* 1 if an extent uses content, 0 if not. */
int ulp_index_blob_used(ulp_archive *a, const uint8_t content[ULP_SHA256_LEN]);
/* The tensors (named extents) of file id that belong to a series. */
int ulp_index_file_tensors(ulp_archive *a, int64_t file, int (*cb)(void *arg, const ulp_rbtensor *t), void *arg);
/* Live tensor blobs whose reference no extent uses, in step order. */
int ulp_index_orphan_deps(ulp_archive *a, int (*cb)(void *arg, const ulp_rbtensor *t), void *arg);
/* Contents of the same tensor in the other files of t's series, nearest
 * step first (lower first on a tie), at most max. */
int ulp_index_candidates(ulp_archive *a, const ulp_rbtensor *t, uint8_t (*out)[ULP_SHA256_LEN], size_t max,
                         size_t *n);
/* The files of file's series with the nearest step below and above it (-1: none). */
int ulp_index_neighbours(ulp_archive *a, int64_t file, int64_t out[2]);
/* The re-basing queue (schema 3): oldest first; removing handled rows. */
int ulp_index_pending(ulp_archive *a, int64_t *ids, int64_t *gens, size_t max, size_t *n);
int ulp_index_pending_done(ulp_archive *a, const int64_t *ids, const int64_t *gens, size_t n);
/* In the caller's transaction: adds the pack and moves each still-planned
 * row to its new coding (r[i].applied), then the depths below them and the
 * files' depth and anchor flags; fails if a chain would exceed max_chain. */
int ulp_index_rebase_apply(ulp_archive *a, const char *pack_name, uint64_t pack_size, ulp_rebased *r,
                           size_t n);

int ulp_index_file_id(ulp_archive *a, const char *path, int64_t *id);
/* Steps of the files under run, ascending, with their file counts. */
int ulp_index_run_steps(ulp_archive *a, const char *run, int (*cb)(void *arg, int64_t step, uint64_t files),
                        void *arg);
/* A tensor of a run's step as the index holds it (dynamics.c): one row of
 * ulp_index_run_tensors. content64 and ref64 are the first 8 bytes of the
 * blob's content digest and of its reference's (a chance match between
 * the blobs of one run: 2^-64 a pair). */
typedef struct ulp_tensorrow {
	const char *path;     /* the file's */
	const char *series;   /* the file's series (path, step digits as {S}) */
	const char *name;     /* the tensor's name */
	int64_t step;
	int dtype;            /* ulp_dtype */
	uint64_t length;      /* bytes */
	int64_t blob;         /* its id */
	uint64_t content64, ref64;
	int has_ref;          /* the blob is a delta (ref64 is set) */
	int codec;
	unsigned depth;
	uint64_t stored;      /* the blob's stored bytes */
} ulp_tensorrow;
/* Every named tensor of the files with a step under run ("" for all), in
 * one query, in no particular order. Stops at a non-zero return of cb,
 * which it returns. */
int ulp_index_run_tensors(ulp_archive *a, const char *run, int (*cb)(void *arg, const ulp_tensorrow *r),
                          void *arg);
/* The named tensors of file path in offset order: name, dtype, offset and
 * length in the file, the content identity of its blob. Stops at a non-zero
 * return of cb, which it returns. */
int ulp_index_file_named(ulp_archive *a, const char *path,
                         int (*cb)(void *arg, const char *name, int dtype, uint64_t offset, uint64_t length,
                                   const uint8_t content[ULP_SHA256_LEN]),
                         void *arg);
/* diff.c: one pair of contents of a tensor (the same dtype and length) to
 * compare, decoded through the cache a chunk pair at a time. */
typedef struct ulp_pair {
	const uint8_t *sha_a, *sha_b; /* content identities (ULP_SHA256_LEN bytes) */
	int dtype;                    /* ulp_dtype */
	uint64_t length;              /* bytes of each */
	const char *name;             /* the tensor's, for messages */
	ulp_tensor_diff *out;         /* its figures (out->name left alone) */
	int rc;                       /* ulp_diff_pairs: its error, 0 */
	char msg[256];                /* and the error's message */
} ulp_pair;
/* What a scan of elements gives (diff.c; its sums added in piece order). */
typedef struct ulp_scan_out {
	uint64_t changed, emoves;
	uint64_t mind, maxd;   /* smallest and largest nonzero distance (mind > maxd: none) */
	double sa, sd;         /* sum of a^2, of (b - a)^2 */
} ulp_scan_out;
/* diff_avx2.c (where built and ulp_use_avx2()): the scan of diff.c's
 * 128-bit kernel for bf16 (f32 0) or f32, 8 elements at a time, of the
 * first n rounded down to 8 elements, into o (mind left alone) and h (keys
 * of every distance; h[0] is used and left 0); @return the elements done. */
size_t ulp_diff_scan_avx2(int f32, const uint8_t *pa, const uint8_t *pb, size_t n, unsigned mb, uint32_t em,
                          ulp_scan_out *o, uint32_t *h);
/* The figures of the n pairs of v, in parallel on a's pool (each the same
 * whatever the threads). Errors: the first failing pair's (by index),
 * with its message: NOMEM, IO, CORRUPT, CHECKSUM, NOENT. */
int ulp_diff_pairs(ulp_archive *a, ulp_pair *v, size_t n);
/* In the caller's transaction: removes the files of those steps under run
 * and the directories that leaves empty below run. */
int ulp_index_forget_steps(ulp_archive *a, const char *run, const int64_t *steps, size_t n);
/* What a session's idle pass has to do at its start (maint.c invariant 8):
 * ULP_DUE_* bits. */
enum { ULP_DUE_RECODE = 1, ULP_DUE_RECLAIM = 2, ULP_DUE_SWEEP = 4 };
int ulp_archive_tidy_due(ulp_archive *a, unsigned *due);
/* recode.c test hook: 1..3 exit the process at a point of a commit */
extern int ulp_recode_crash_at;
/* maint.c test hook: 1..7 exit the process (status 98) at a point of a
 * reclaim: 1-3 around the first drop's commit and unlinks, 4 before a
 * rewrite's commit, 5-7 around the drop of the packs rewrites emptied */
extern int ulp_reclaim_crash_at;
/* recode.c test hook: the next N ulp_archive_rebase_pending calls fail with
 * NOSPC, as on a full disk (a session takes N from ULP_TEST_RECODE_NOSPC) */
extern int ulp_recode_fail_nospc;

/* ---- packs (pack.c) ---------------------------------------------------- */

/* Bytes of a pack's header ("ULPpack1"): a pack holds nothing dead when its
 * size is this plus its live blobs. */
#define ULP_PACK_HEADER 8
typedef struct ulp_pack_writer ulp_pack_writer;
int ulp_pack_writer_new(ulp_archive *a, ulp_pack_writer **out);
/* Appends a blob; *offset receives its offset in the pack. */
int ulp_pack_append(ulp_pack_writer *w, const void *blob, size_t len, uint64_t *offset);
/* the same, with the blob's digest already taken (by the thread that coded it) */
int ulp_pack_append_digest(ulp_pack_writer *w, const void *blob, size_t len,
                           const uint8_t sha[ULP_SHA256_LEN], uint64_t *offset);
/* A blob written in pieces, by several threads: ulp_pack_reserve takes len
 * bytes at the end (*offset) in the blobs' order, ulp_pack_write_at fills
 * any part of them (from any thread), ulp_pack_reserved_digest then records
 * the blob's digest in the pack's name, in the same order as the appends
 * and reserves around it. */
int ulp_pack_reserve(ulp_pack_writer *w, size_t len, uint64_t *offset);
int ulp_pack_write_at(ulp_pack_writer *w, uint64_t offset, const void *p, size_t len);
void ulp_pack_reserved_digest(ulp_pack_writer *w, size_t len, const uint8_t sha[ULP_SHA256_LEN]);
uint64_t ulp_pack_size(const ulp_pack_writer *w);
/* Makes the pack durable under its content name: write, fsync, rename,
 * fsync of the directory. name receives its file name. */
int ulp_pack_commit(ulp_pack_writer *w, char name[80]);
/* The pack's file name, final once called: no blob may be added after it.
 * The index rows that name it may then be written in a transaction that
 * commits only after ulp_pack_commit returns (a pipelined put, ingest.c). */
void ulp_pack_seal(ulp_pack_writer *w, char name[80]);
/* 1 if the commit's rename replaced a file of the same name (a pack of the
 * same bytes, which the index may name): not this writer's alone to remove. */
int ulp_pack_replaced(const ulp_pack_writer *w);
/* Removes the pack's file (temporary, or final once ulp_pack_commit renamed
 * it, even if the commit then failed) and frees w. */
void ulp_pack_discard(ulp_pack_writer *w);
void ulp_pack_free(ulp_pack_writer *w);
/* Bytes of a blob: pointer into the mapped pack, not pinned: valid until
 * ulp_archive_trim may run (gc's own reads, in a process that does not trim). */
int ulp_pack_blob(ulp_archive *a, int64_t pack, uint64_t offset, uint64_t len, const uint8_t **p);
void ulp_pack_unmap_all(ulp_archive *a);
/* The pack store's handle, a->ps: made at open, unmapped and freed at close. */
int ulp_packstore_open(ulp_archive *a);
void ulp_packstore_close(ulp_archive *a);
/* Pack files by name through the pack store's backend (store/backend.h):
 * removes one (0, or a negative ULP_E_*, no message); calls cb for each
 * whose name starts with prefix, with its size (cb may remove that one). */
int ulp_pack_remove(ulp_archive *a, const char *name);
int ulp_pack_list(ulp_archive *a, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
                  void *arg);
/* Drops this process's hold on the pages of a mapped range it has used
 * (batched: the pages go back once some megabytes are pending). */
void ulp_pack_release(ulp_archive *a, const void *p, size_t len);
void ulp_pack_forget(ulp_archive *a, int64_t pack);
/* Pins pack (mapping it if needed, invariant 2 of pack.c): *slot names its
 * mapping until ulp_pack_unpin. */
int ulp_pack_pin(ulp_archive *a, int64_t pack, size_t *slot);
int ulp_pack_pin_slot(ulp_archive *a, size_t slot); /* one more pin */
void ulp_pack_unpin(ulp_archive *a, size_t slot);
/* Bytes of a blob in a pinned slot. */
int ulp_pack_slot_blob(ulp_archive *a, size_t slot, uint64_t offset, uint64_t len, const uint8_t **p);
/* How often a pinned slot's pack was fetched anew (ulp_pack_refetch). */
unsigned ulp_pack_slot_epoch(ulp_archive *a, size_t slot);
/* A pinned slot's pack whose bytes failed a check (what: the failure, for
 * the message), read when the slot's epoch was seen: where the pack has a
 * copy fetched from an object store that was not fetched anew yet, it is
 * dropped and fetched again over the same mapping (backend.h's refetch):
 * 1, read it again. Where it was fetched anew since seen (by another
 * thread): 1 too. Else 0 where the backend fetches nothing (a local
 * directory: the caller's error stands), or, where the fresh copy failed
 * again, that copy dropped and the slot forgotten (the next lookup maps
 * it afresh), -ULP_E_IO with the message naming the pack and the archive;
 * or the fetch's error. */
int ulp_pack_refetch(ulp_archive *a, size_t slot, unsigned seen, const char *what);
/* Whether a slot's pack file was found removed (ulp_pack_mark_gone). */
int ulp_pack_slot_gone(ulp_archive *a, size_t slot);
/* Marks mapped packs whose file is gone; returns how many mapped ones are. */
unsigned ulp_pack_mark_gone(ulp_archive *a);
/* Unmaps marked packs nobody pins; returns how many. */
unsigned ulp_pack_unmap_gone(ulp_archive *a);
size_t ulp_pack_mapped(ulp_archive *a); /* packs mapped now */

/* ---- reading (read.c) ----------------------------------------------- */

/* Pins the decoded chunk k of content sha (walking its chain through the
 * cache). *walk receives the number of decodes this call performed. */
int ulp_read_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                   ulp_centry **e, const uint8_t **data, size_t *len, unsigned *walk);
/* Pins the parsed blob of content sha. */
int ulp_read_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], ulp_centry **e,
                  const ulp_blob **b);
/* Decodes a whole content into dst (raw_bytes of its blob). */
int ulp_read_content(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst, size_t len);
int ulp_stat_from_row(sqlite3_stmt *st, ulp_stat *out);
/* Caches the chunks of a content the caller holds decoded. */
void ulp_read_seed(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], const uint8_t *content,
                   size_t len, size_t chunk_bytes);
/* The same for chunk k alone (l bytes at chunk): chunks in parallel. */
int ulp_read_seed_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                        const uint8_t *chunk, size_t l);
/* Lets the cached chunks of a content go (unless in use), their memory kept
 * for the next ones: an ingest retires a reference its new step supersedes. */
void ulp_read_retire(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], size_t len,
                     size_t chunk_bytes);

#endif
