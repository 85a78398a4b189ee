/* SPDX-License-Identifier: MIT */
/*
 * ftab.h - the file table (store/ftab.c): the index's files, extents and
 * chains in memory, so that a mount's lookups and opens run no SQL.
 */
#ifndef ULP_FTAB_H
#define ULP_FTAB_H

#include "arch_int.h"
#include "store/index.h"

/* ---- the file table (store/ftab.c) ----------------------------------------
 * The index's files, their extents and the chains of blobs and packs behind
 * them, in memory: a mount's lookups and opens run no SQL and read no page
 * of the index. Loaded at open (ulp_archive_opts.file_table), loaded again
 * by its own thread after a commit or a new generation made it stale. */
typedef struct ulp_ftab ulp_ftab;
/* where a blob's pack is, as the index has it */
typedef struct ulp_packref {
	int64_t id;
	const char *name;      /* file name under packs/ */
	uint64_t size;
} ulp_packref;
int ulp_ftab_open(ulp_archive *a);   /* at archive open: loads it (a hint: NULL on failure) */
void ulp_ftab_close(ulp_archive *a); /* joins its thread, frees it */
/* The table, held (ulp_ftab_put), if it is fresh (ftab.c invariant 1);
 * NULL if there is none or it is stale (its thread is asked to load it
 * again), or if the calling thread is inside a transaction (which sees its
 * own writes): the caller asks the index. */
ulp_ftab *ulp_ftab_get(ulp_archive *a);
void ulp_ftab_put(ulp_archive *a, ulp_ftab *t);
/* Drops the table (a read that found a chain gone: read.c invariant 6). */
void ulp_ftab_drop(ulp_archive *a);
/* Waits until the table is fresh or ms passed; 1 if fresh (tests). */
int ulp_ftab_wait(ulp_archive *a, unsigned ms);
/* Bytes it holds, and its entries and blobs (tests, measurements). */
void ulp_ftab_size(ulp_archive *a, uint64_t *bytes, size_t *entries, size_t *blobs);
int ulp_ftab_stat(ulp_archive *a, const ulp_ftab *t, const char *path, ulp_stat *st);
/* The blob of content sha: its row's pack, offset and stored size. NOENT. */
int ulp_ftab_blob(const ulp_ftab *t, const uint8_t sha[ULP_SHA256_LEN], ulp_packref *pk, uint64_t *offset,
                  uint64_t *stored);

/* The same from the file table t (ftab.c), and each blob of its chains once
 * through cb (as ulp_index_file_blobs), with its pack's name and size. */
int ulp_ftab_file(ulp_archive *a, const ulp_ftab *t, const char *path, ulp_stat *st, uint8_t **header,
                  size_t *header_len, ulp_extent **ext, size_t *n_ext,
                  int (*cb)(void *arg, const uint8_t *content, const ulp_packref *pk, uint64_t offset,
                            uint64_t stored),
                  void *arg);

#endif
