/* SPDX-License-Identifier: MIT */
/*
 * cache.h - the decode cache (cache.c): decoded chunks and parsed blobs by
 * content, pinned while used, LRU by bytes, one loader per key; its own
 * lock. Users: read.c (its reads), ingest.c and recode.c (seeding and
 * retiring), archive.c (made at open, freed at close).
 */
#ifndef ULP_CACHE_H
#define ULP_CACHE_H

#include "ulp_int.h"
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
/* Seeds: chunks the archiver just coded and verified, put in the cache so
 * that the next step coded against them finds them decoded. They hold at
 * most ulp_cache_seed_cap(cap) bytes (cache.c invariant 7): a quarter of the
 * cache, and never more than ULP_CACHE_SEED_MAX, so that archiving a file
 * larger than that leaves the daemon's memory (and the readers' cache) as
 * it was (a 4.3 GB rank file archived and re-based against the next step
 * peaked at 0.91 GB with 384 MiB of seeds, re-basing's batch holding up to
 * 512 MiB: recode.c BATCH_BYTES). ulp_cache_seed_room: whether a seed of
 * size bytes fits now (a hint); ulp_cache_fill_seed: ulp_cache_fill of a
 * seed. */
#define ULP_CACHE_SEED_MAX ((uint64_t)256 << 20)
uint64_t ulp_cache_seed_cap(uint64_t cap);
int ulp_cache_seed_room(ulp_cache *c, size_t size);
void ulp_cache_fill_seed(ulp_cache *c, ulp_centry *e, void *data, size_t size, void (*destroy)(void *));
uint64_t ulp_cache_seed_bytes(ulp_cache *c);
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

#endif
