/* SPDX-License-Identifier: MIT */
/*
 * writer.h - the writing side of the archive floor, between its rooms:
 * ingest.c (streamed tensors, the spill file, chains let go), staging.c
 * (staged files archived and claimed), layout.c (the target layout),
 * maint.c and recode.c (the idle pass's work, the grace sweep, test hooks),
 * upkeep.c (a shared archive writer's publisher). The writer handle itself
 * (a->w) is in arch_int.h, since the store reads its live index and commits.
 */
#ifndef ULP_WRITER_H
#define ULP_WRITER_H

#include "arch_int.h"

/* upkeep.c: made for a shared archive's writer at open (after its lease);
 * stopped at close before the lease is given back, publishing last */
int ulp_upkeep_new(ulp_archive *a);
void ulp_upkeep_stop(ulp_archive *a);

/* Removes the packs whose grace passed (maint.c invariant 7); wait: for
 * write_mu, else only when it is free. */
int ulp_archive_grace_sweep(ulp_archive *a, int wait);

/* staging.c: frees s after its file was archived: its files go, or, on a
 * shared archive's writer, stay until a publication holds it (invariant 6) */
void ulp_stage_archived(ulp_stage *s);
/* staging.c invariant 5: a new writer of a shared archive on a directory
 * claims the staged files it did not make */
int ulp_stage_claim(ulp_archive *a);

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

#endif
