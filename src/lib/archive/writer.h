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

/* ---- many hosts write (archive/contrib.c; staging.c) --------------------- */

/* A read-write open whose lease another host holds, with opts.contribute:
 * the handle becomes a contributor (a->contrib) with staging/h-HOST. */
int ulp_contrib_open(ulp_archive *a, ulp_err *err);
void ulp_contrib_free(ulp_archive *a);
/* A contributor's hand-over of a closed, recorded file: waits until the
 * archiver took it (its staged files left staging/h-HOST) and the followed
 * generation holds path with its size and mtime; 0, the archiver's failure
 * (its note), or BUSY where stop(arg) says to give up (left staged). */
int ulp_contrib_put(ulp_archive *a, ulp_stage *st, const char *path, const ulp_meta *m,
                    int (*stop)(void *arg), void *arg);
/* The archiver: takes every other host's closed files (staging/h-*) into
 * its own staging, oldest first, and gives each to adopt (which owns the
 * stage: it archives it, or closes it and leaves its files for the next
 * writer); is_free(arg, path): 0 where the path is not to be taken now
 * (a temporary or hidden name, or busy there: left for the next drain). Returns the number taken, or an error. */
int ulp_contrib_drain(ulp_archive *a, int (*is_free)(void *arg, const char *path),
                      int (*adopt)(void *arg, ulp_stage *st, const char *path, const ulp_meta *m), void *arg);
/* The archiver could not archive a file a contributor staged: a note beside
 * the contributor's staging names why (its ulp_contrib_put returns it). */
void ulp_contrib_failed(ulp_archive *a, const ulp_stage *st, int rc, const char *why);
/* Directories made on a contributor, until a generation holds them. */
int ulp_contrib_mkdir(ulp_archive *a, const char *path, const ulp_meta *m);
int ulp_contrib_stat_dir(ulp_archive *a, const char *path, ulp_stat *st);
int ulp_contrib_list_dirs(ulp_archive *a, const char *dir, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                          void *arg);
/* A contributor's staging directory, ARCHIVE/staging/h-HOST. */
const char *ulp_contrib_dir(const ulp_archive *a);
/* staging.c for them: a sidecar
 * read (0, or -1 where it is not whole); a staged file moved from dir/base
 * into a's staging under a claimed name and opened (NOENT: gone meanwhile);
 * its origin (dir/base, "" where it was a's own); whether its data file left
 * the name it was made under (taken by the archiver); a closed
 * contributor's file marked for the archiver (its data file 0640). */
int ulp_stage_read_meta(const char *file, char *path, size_t cap, ulp_meta *m);
int ulp_stage_take(ulp_archive *a, const char *dir, const char *base, ulp_stage **out);
const char *ulp_stage_origin(const ulp_stage *s);
int ulp_stage_taken(const ulp_stage *s);
void ulp_stage_mark_closed(ulp_stage *s);
/* A contributor's open: its dead processes' files that were never closed
 * (and sidecars whose data is gone) leave its staging/h-HOST. */
int ulp_stage_sweep_own(ulp_archive *a);
const char *ulp_stage_data_name(const ulp_stage *s);

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
