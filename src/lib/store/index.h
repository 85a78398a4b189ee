/* SPDX-License-Identifier: MIT */
/*
 * index.h - the index's rows (index.c: blobs, packs, files, extents,
 * tensors, the grace's packs, and the queries over them, the re-basing
 * queries of recode.c, the tensor rows of dynamics.c) and the operations
 * on its entries (namespace.c): with db.c (db.h) the only users of
 * sqlite3.h.
 */
#ifndef ULP_INDEX_H
#define ULP_INDEX_H

#include "arch_int.h"

typedef struct sqlite3_stmt sqlite3_stmt;

/* Bytes of a pack's header ("ULPpack1", pack.c): a pack holds nothing dead
 * when its size is this plus its live blobs (the index's accounting). */
#define ULP_PACK_HEADER 8

/* namespace.c: the listing under ulp_archive_readdir (archive/read.c, which
 * notes a run's directory for its reads: read.c invariant 8); *run_dir: the
 * directory holds two step directories or more (its archive path in dir). */
int ulp_ns_readdir(ulp_archive *a, const char *path, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                   void *arg, char *dir, size_t dir_cap, int *run_dir);

/* Packs kept for the grace (index.c invariant 7): recorded with the
 * generation last published; the rows due (recorded before before_ms, under
 * generation below_gen) are deleted and cb called with each name. */
int ulp_index_grace_add(ulp_archive *a, const char *name, uint64_t gen);
int ulp_index_grace_has(ulp_archive *a, const char *name);
int ulp_index_grace_due(ulp_archive *a, int64_t before_ms, uint64_t below_gen,
                        int (*cb)(void *arg, const char *name), void *arg);

/* An entry's row (ULP_ENTRY_COLS) as a stat (index.c). */
int ulp_stat_from_row(sqlite3_stmt *st, ulp_stat *out);

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

/* Every blob of the chains of file path (its extents' blobs and their
 * references, transitively): content, pack, offset, stored size. */
int ulp_index_file_blobs(ulp_archive *a, const char *path,
                         int (*cb)(void *arg, const uint8_t *content, int64_t pack, uint64_t offset,
                                   uint64_t stored),
                         void *arg);

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

/* In the caller's transaction: removes the files of those steps under run
 * and the directories that leaves empty below run. */
int ulp_index_forget_steps(ulp_archive *a, const char *run, const int64_t *steps, size_t n);

/* The whole index in one read transaction, for the file table: the rows'
 * counts (a hint for the arrays' sizes), then each pack,
 * blob, entry (its stat, path, header and header_sha, NULL where none) and
 * extent (in file, offset order), by row id. A callback's error stops it. */
typedef struct ulp_index_scan_cbs {
	int (*counts)(void *arg, uint64_t packs, uint64_t blobs, uint64_t entries, uint64_t extents); /* first */
	int (*pack)(void *arg, int64_t id, const char *name, uint64_t size);
	int (*blob)(void *arg, int64_t id, const uint8_t *content, const uint8_t *ref, int64_t pack, uint64_t offset,
	            uint64_t stored);
	int (*entry)(void *arg, int64_t id, const char *path, const ulp_stat *st, const uint8_t *header, size_t hl,
	             const uint8_t *header_sha);
	int (*extent)(void *arg, int64_t file, uint64_t offset, uint64_t length, int64_t blob);
} ulp_index_scan_cbs;
int ulp_index_scan(ulp_archive *a, const ulp_index_scan_cbs *cbs, void *arg);

#endif
