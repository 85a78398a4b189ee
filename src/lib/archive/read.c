/* SPDX-License-Identifier: MIT */
/*
 * read.c - files as byte ranges: a read maps its range onto the file's stored
 * header and the chunks of the blobs it overlaps, and decodes only those,
 * through the decode cache; a delta chunk first gets the same chunk of its
 * reference the same way, so a cold read walks the chain back to the anchor
 * and reading steps in order decodes one delta per step.
 *
 * Invariants:
 *  1. A decoded chunk enters the cache only after its checksum matched
 *     (ulp_blob_decode_chunk checks it), so the cache never holds wrong bytes.
 *  2. A chain walk is bounded: it stops with CORRUPT past ULP_WALK_MAX links,
 *     whatever the index says.
 *  3. An open file knows where every blob of its chains lies and pins those
 *     packs (resolved at ulp_file_open): gc, in this process or another,
 *     may drop the rows and pack files of a file unlinked meanwhile, and the
 *     file still reads its bytes until it is closed. Where the archive
 *     keeps a file table (store/ftab.c, a mount's), the open takes all of
 *     it from there, no query, and asks for its chains' pages in the
 *     background (warm_at_open); a read whose chain is gone (invariant 6)
 *     drops the table, so that the retry asks the index.
 *  4. A parsed blob in the cache points into its pack's mapping and pins it
 *     while cached (struct cblob).
 *  5. A file is its extents (sorted, disjoint) and, around them, its header's
 *     bytes in order: hoff[i] header bytes come before extent i, hoff[n_ext]
 *     = header_len; checked when the file is opened, so a read never indexes
 *     the header or the extents out of range.
 *  6. A cached parsed blob may be stale: another process re-based its
 *     content (recode.c) and gc dropped the reference it names. A chunk
 *     read that ends in NOENT lets the unpinned parsed blobs go and tries
 *     once more, so the chain is looked up again in the index (decoded
 *     chunks are keyed by content and stay valid).
 *  7. ulp_file_write_to decodes each chunk as a sweep's read does: the links
 *     of its chain below enter the cache (a backward part of the layout
 *     exported in step order decodes each link once, on its deepest step).
 *     Its writes cover [0, size) exactly: the header's bytes around the
 *     extents (invariant 5) and each chunk at its extent's offset.
 *  8. A lone read keeps only what it read (issue 29): the first file of a
 *     series read when no other file of that series was read in the last
 *     RECENT_MS decodes the links of its cold walks into two buffers in
 *     turn (walk_lone; from the cache's free buffers, given back after) and
 *     caches only its own chunks (with a decode cache of at least
 *     LONE_CACHE_MIN). Each
 *     link cached cost fresh pages (zeroing, faults: as much as the decode
 *     on a VM), for a step nobody asked for: an evaluation or a comparison
 *     reads one old step. Any other reader (a sweep: rsync, an export, a
 *     second step of the series, a read under a run directory listed in
 *     the last RECENT_MS, as rsync and cp -r list it first) caches every
 *     link it walks, so that the steps after it decode one link each
 *     (invariant 4 of layout.c).
 *  9. A chunk whose checksum fails, or a blob that does not parse, in a pack
 *     of an archive in a bucket (a copy fetched into the local cache, maybe
 *     damaged there or on the way) has its pack fetched anew over the same
 *     mapping (ulp_pack_refetch, pack.c invariant 6), once: the read that
 *     saw it gets REFETCHED, an internal code, and the entry points
 *     (file_chunk_as, ulp_read_blob) let the parsed blobs go and read once
 *     more. A second failure of the fresh copy is EIO naming the pack and
 *     the archive, and the parsed blobs go again, so that the next read
 *     maps the pack afresh. REFETCHED never leaves this file.
 */
#include "arch_int.h"
#include "store/ftab.h"
#include "store/pack.h"
#include "store/db.h"
#include "store/path.h"
#include "archive/cache.h"
#include "store/index.h"
#include "archive/read.h"
#include "store/shared.h"
#include <zstd.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>

#define ULP_WALK_MAX 4096
/* invariant 9: a pack was fetched anew, read again (never out of this file) */
#define REFETCHED (-(ULP_E__COUNT + 1))
#define RECENT_MS 30000 /* invariant 8: reads of a series this close make a sweep */
enum { MODE_LONE = 1, MODE_SWEEP = 2 };
/* invariant 8: a lone walk's two buffers lie outside the cache's bound;
 * with a cache under this, reads keep their links as before */
#define LONE_CACHE_MIN ((uint64_t)64 << 20)
_Static_assert(ULP_MAX_CHAIN < ULP_WALK_MAX, "a chain the writers may make is one a read can walk");

/* where one blob of an open file's chains lies (invariant 3) */
typedef struct loc {
	uint8_t content[ULP_SHA256_LEN];
	size_t slot;          /* pinned pack mapping */
	uint64_t offset, stored;
} loc;

struct ulp_file {
	ulp_archive *a;
	loc *locs;            /* sorted by content */
	size_t n_locs;
	ulp_stat st;
	uint8_t *header;      /* the verbatim bytes around the extents (decompressed), or NULL */
	size_t header_len;
	ulp_extent *ext;      /* in offset order, disjoint (invariant 3) */
	size_t n_ext;
	uint64_t *hoff;       /* n_ext + 1: header bytes before extent i (invariant 3) */
	uint64_t next_off;    /* where the last read ended (atomic: a hint) */
	uint64_t ra_mark;     /* furthest chunk posted for read-ahead: ext << 32 | k, plus 1 */
	uint64_t ra_from;     /* the first chunk of the last read-ahead window, the same way */
	uint64_t chain_stored; /* stored bytes of every blob of its chains (locs) */
	int warmed;           /* the first read asked for the chains' pages (atomic) */
	int mode;             /* invariant 8: 0 undecided, MODE_LONE or MODE_SWEEP (atomic) */
	uint64_t series, file; /* hashes of its series (0: in none) and of its path */
	uint64_t dirs[3];     /* hashes of its nearest directories (listing_hash) */
	int no_ra;            /* ulp_file_set_readahead(f, 0): never read ahead (atomic) */
	char path[];
};

/* A parsed blob as cached: it pins the pack it points into (invariant 4). */
typedef struct cblob {
	ulp_blob *b;
	ulp_archive *a;
	size_t slot;
} cblob;

static void blob_destroy(void *p)
{
	cblob *cb = p;
	ulp_blob_close(cb->b);
	ulp_pack_unpin(cb->a, cb->slot);
	free(cb);
}

static const loc *find_loc(const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN])
{
	size_t lo = 0, hi = f ? f->n_locs : 0;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = memcmp(f->locs[mid].content, sha, ULP_SHA256_LEN);
		if (c == 0)
			return &f->locs[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* The error of a cache entry whose load, by another thread, failed: that
 * thread has the message; this one names the blob (and chunk) and the code. */
static int waited_err(ulp_archive *a, int rc, const uint8_t sha[ULP_SHA256_LEN], const uint32_t *k)
{
	char hex[65], ck[32] = "";
	ulp_sha256_hex(sha, hex);
	if (k)
		snprintf(ck, sizeof(ck), "chunk %u of ", *k);
	return ulp_arch_err(a, rc, "%s: %sblob %.16s: %s", a->dir, ck, hex,
	                    rc == -ULP_E_CHECKSUM ? "checksum mismatch (damaged pack)" : ulp_strerror(rc));
}

/* ulp_cache_get for a reader of f: a load that another thread (the
 * read-ahead, which knows no file) failed with NOENT, because gc dropped the
 * rows of a file removed while f was open, is tried again here, where f's
 * locations find the blobs (invariant 3; the failed entry has left the
 * cache, so the next get loads afresh or joins another thread's load).
 * As often as it takes: each round either makes this thread the loader,
 * which finds the blob, or follows one more failed load by a reader of no
 * file, and those are few (two a try: file_chunk; a bound of 3 lost to the
 * read-ahead's threads and a racer under load, test_gc_open). */
static int get_for(ulp_archive *a, const ulp_file *f, const ulp_ckey *key, ulp_centry **e, void **data,
                   int *must_load)
{
	int grc = ulp_cache_get(a->cache, key, e, data, must_load);
	while (grc == -ULP_E_NOENT && f && f->n_locs)
		grc = ulp_cache_get(a->cache, key, e, data, must_load);
	return grc;
}

/* ulp_read_blob for a reader of f (NULL: none), which knows where its
 * chains' blobs lie even after gc dropped them from the index. */
static int read_blob_at(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN],
                        ulp_centry **e, const ulp_blob **out, size_t *slot_out)
{
	ulp_ckey key = {.kind = ULP_CK_BLOB};
	memcpy(key.sha, sha, ULP_SHA256_LEN);
	void *data;
	int must_load;
	ulp_centry *ce; /* *e only on success: a failed entry is let go here */
	int grc = get_for(a, f, &key, &ce, &data, &must_load);
	if (grc < 0) /* another reader's load failed (its message is its thread's) */
		return waited_err(a, grc, sha, NULL);
	if (!must_load) {
		*e = ce;
		*out = ((cblob *)data)->b;
		if (slot_out)
			*slot_out = ((cblob *)data)->slot;
		return 0;
	}
	ulp_blobrow row = {0};
	const uint8_t *p;
	ulp_blob *b = NULL;
	cblob *cb = calloc(1, sizeof(*cb));
	char why[256] = "", name[128] = "?";
	const loc *l = find_loc(f, sha);
	size_t slot = 0;
	int rc = cb ? 0 : -ULP_E_NOMEM;
	if (rc == 0 && l) {
		row.offset = l->offset;
		row.stored = l->stored;
		slot = l->slot;
		rc = ulp_pack_pin_slot(a, slot);
	} else if (rc == 0) {
		ulp_ftab *t = ulp_ftab_get(a); /* a fresh file table knows it too (no query) */
		ulp_packref pk;
		if (t && ulp_ftab_blob(t, sha, &pk, &row.offset, &row.stored) == 0) {
			row.pack = pk.id;
			rc = ulp_pack_pin_known(a, &pk, &slot);
		} else {
			rc = ulp_index_blob(a, sha, &row);
			if (rc == 0)
				rc = ulp_pack_pin(a, row.pack, &slot);
		}
		ulp_ftab_put(a, t);
	}
	int pinned = rc == 0;
	unsigned seen = pinned && a->rm ? ulp_pack_slot_epoch(a, slot) : 0; /* invariant 9 */
	if (rc == 0)
		rc = ulp_pack_slot_blob(a, slot, row.offset, row.stored, &p);
	if (rc == 0) {
		rc = ulp_blob_open(p, (size_t)row.stored, &b, why, sizeof(why));
		if (rc == 0 && memcmp(ulp_blob_get_info(b)->content_sha256, sha, ULP_SHA256_LEN) != 0) {
			ulp_blob_close(b);
			rc = -ULP_E_CORRUPT;
			snprintf(why, sizeof(why), "blob holds other content than the index says");
		}
		if (rc < 0) {
			char hex[65];
			if (rc == -ULP_E_NOMEM) /* ulp_blob_open says why only for bad blobs */
				snprintf(why, sizeof(why), "%s", ulp_strerror(rc));
			ulp_sha256_hex(sha, hex);
			if (!l)
				ulp_index_pack_name(a, row.pack, name, sizeof(name));
			rc = ulp_arch_err(a, rc, "blob %.16s at %s/packs/%s+%llu: %s", hex, a->dir, name,
			                  (unsigned long long)row.offset, why);
			char what[400];
			snprintf(what, sizeof(what), "blob %.16s at +%llu: %s", hex, (unsigned long long)row.offset, why);
			int r = rc != -ULP_E_NOMEM && a->rm ? ulp_pack_refetch(a, slot, seen, what) : 0;
			rc = r > 0 ? REFETCHED : r < 0 ? r : rc;
		}
	}
	if (rc < 0) {
		if (pinned)
			ulp_pack_unpin(a, slot);
		free(cb);
		ulp_cache_fail(a->cache, ce, rc);
		return rc;
	}
	*cb = (cblob){b, a, slot};
	ulp_cache_fill(a->cache, ce, cb, ulp_blob_footprint(b) + sizeof(*cb), blob_destroy);
	*e = ce;
	*out = b;
	if (slot_out)
		*slot_out = slot;
	return 0;
}

static int any_blob(void *arg, const ulp_ckey *key, void *data);

/* Invariant 9: after a pack was fetched anew, the parsed blobs (maybe of
 * its damaged bytes) go, and what failed is tried once more; a second
 * REFETCHED (another thread's fetch in between) is an error. After any
 * failure in an archive in a bucket the parsed blobs go too: they may pin
 * a copy that failed twice, dropped, whose object may be mended by the
 * next read. */
static int refetched_err(ulp_archive *a, int rc)
{
	if (rc < 0 && a->rm) /* parsed blobs of a copy dropped: the next read maps it afresh */
		ulp_cache_purge(a->cache, any_blob, NULL);
	return rc == REFETCHED ? ulp_arch_err(a, -ULP_E_IO, "%s: a pack failed its checks again after it was "
	                                      "fetched anew", a->dir)
	                       : rc;
}

static int read_blob(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN],
                     ulp_centry **e, const ulp_blob **out)
{
	return read_blob_at(a, f, sha, e, out, NULL);
}

/* read_blob from an entry point: once more after a fetch anew (invariant 9) */
static int read_blob_again(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN],
                           ulp_centry **e, const ulp_blob **out)
{
	int rc = read_blob(a, f, sha, e, out);
	if (rc == REFETCHED) {
		ulp_cache_purge(a->cache, any_blob, NULL);
		rc = read_blob(a, f, sha, e, out);
	}
	return refetched_err(a, rc);
}

int ulp_read_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], ulp_centry **e,
                  const ulp_blob **out)
{
	return read_blob_again(a, NULL, sha, e, out);
}

/* Before a cold walk of chunk k of sha: asks the kernel for that chunk's
 * payload in every link of the chain down to the first one already decoded,
 * all at once, so that the pages of the deeper links come in from disk while
 * the first ones decode (a walk alone faults them in one link after the
 * other). Only a hint: any failure is left for the walk to report. */
static void willneed_chain(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k)
{
	uint8_t cur[ULP_SHA256_LEN];
	memcpy(cur, sha, ULP_SHA256_LEN);
	for (unsigned d = 0; d < ULP_WALK_MAX; d++) {
		const ulp_blob *b;
		ulp_centry *be;
		if (read_blob(a, f, cur, &be, &b) < 0)
			return;
		const uint8_t *payload;
		size_t plen;
		ulp_blob_chunk_payload(b, k, &payload, &plen);
		uintptr_t page = 4096, lo = (uintptr_t)payload & ~(page - 1);
		if (plen)
			madvise((void *)lo, (uintptr_t)payload + plen - lo, MADV_WILLNEED);
		int more = ulp_blob_get_info(b)->has_ref;
		if (more)
			memcpy(cur, ulp_blob_get_info(b)->ref_sha256, ULP_SHA256_LEN);
		ulp_cache_put(a->cache, be);
		if (!more)
			return;
		ulp_ckey key = {.chunk = k, .kind = ULP_CK_CHUNK};
		memcpy(key.sha, cur, ULP_SHA256_LEN);
		ulp_centry *ce;
		void *data;
		size_t size;
		if (ulp_cache_peek(a->cache, &key, &ce, &data, &size)) { /* decoded: the walk stops there */
			ulp_cache_put(a->cache, ce);
			return;
		}
	}
}

/* Decodes chunk k (l bytes) of blob b (content sha) into dst against ref
 * (l bytes, NULL for an anchor), lets go of its payload's pages and counts
 * the decode: one link of a walk, cached (read_chunk) or not (walk_lone). */
static int decode_link(ulp_archive *a, const ulp_blob *b, size_t slot, const uint8_t sha[ULP_SHA256_LEN],
                       uint32_t k, uint8_t *dst, size_t l, const uint8_t *ref, unsigned *walk)
{
	const ulp_blob_info *in = ulp_blob_get_info(b);
	if (in->codec == ULP_CODEC_IDENT) {
		memcpy(dst, ref, l);
	} else if (l > 0) {
		unsigned seen = a->rm ? ulp_pack_slot_epoch(a, slot) : 0; /* invariant 9 */
		int64_t n = ulp_blob_decode_chunk(b, k, dst, l, ref, ref ? l : 0);
		if (n < 0) {
			char hex[65], what[200];
			ulp_sha256_hex(sha, hex);
			int rc = ulp_arch_err(a, (int)n, "%s: chunk %u of blob %.16s: %s", a->dir, k, hex,
			                      n == -ULP_E_CHECKSUM ? "checksum mismatch (damaged pack)" : ulp_strerror((int)n));
			snprintf(what, sizeof(what), "chunk %u of blob %.16s: checksum mismatch", k, hex);
			int r = n == -ULP_E_CHECKSUM && a->rm ? ulp_pack_refetch(a, slot, seen, what) : 0;
			return r > 0 ? REFETCHED : r < 0 ? r : rc;
		}
	}
	const uint8_t *payload;
	size_t plen;
	ulp_blob_chunk_payload(b, k, &payload, &plen);
	ulp_pack_release(a, payload, plen);
	__atomic_fetch_add(&a->r->chunks_decoded, 1, __ATOMIC_RELAXED);
	if (in->has_ref)
		__atomic_fetch_add(&a->r->deltas_decoded, 1, __ATOMIC_RELAXED);
	(*walk)++;
	return 0;
}

/* Chunk k (l bytes) of sha decoded into dst without entering the cache,
 * its reference decoded the same way into other (l bytes: the walk's other
 * buffer, whose turn is next), or taken from the cache where it is decoded
 * already (invariant 8): the walk of a lone read. Counts its decodes as
 * read_chunk does. */
static int walk_lone(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                     uint8_t *dst, uint8_t *other, size_t l, unsigned *walk, unsigned depth)
{
	if (depth > ULP_WALK_MAX)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a delta chain is longer than %d links", a->dir,
		                    ULP_WALK_MAX);
	ulp_ckey key = {.chunk = k, .kind = ULP_CK_CHUNK};
	memcpy(key.sha, sha, ULP_SHA256_LEN);
	ulp_centry *ce;
	void *cd;
	size_t cs;
	if (ulp_cache_peek(a->cache, &key, &ce, &cd, &cs)) {
		int ok = cs == l;
		if (ok)
			memcpy(dst, cd, l);
		ulp_cache_put(a->cache, ce);
		return ok ? 0 : ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a delta and its reference differ in chunk %u size",
		                             a->dir, k);
	}
	const ulp_blob *b;
	ulp_centry *be;
	size_t slot;
	ULP_TRY(read_blob_at(a, f, sha, &be, &b, &slot));
	const ulp_blob_info *in = ulp_blob_get_info(b);
	uint64_t off, bl;
	ulp_blob_chunk_range(b, k, &off, &bl);
	int rc = 0;
	const uint8_t *ref = NULL;
	if (bl != l)
		rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a delta and its reference differ in chunk %u size", a->dir, k);
	if (rc == 0 && in->has_ref) {
		/* two buffers in turn: this link's reference is decoded into the
		 * one its own output is not in */
		rc = walk_lone(a, f, in->ref_sha256, k, other, dst, l, walk, depth + 1);
		ref = other;
	}
	if (rc == 0)
		rc = decode_link(a, b, slot, sha, k, dst, l, ref, walk);
	ulp_cache_put(a->cache, be);
	return rc;
}

/* Pins chunk k of sha; *eout is written only on success (a caller that put
 * an entry a failed call had already let go, and freed, read freed memory). */
static int read_chunk(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                      ulp_centry **eout, const uint8_t **data, size_t *len, unsigned *walk,
                      unsigned depth, int lone)
{
	ulp_centry *ce = NULL, **e = &ce;
	ulp_ckey key = {.chunk = k, .kind = ULP_CK_CHUNK};
	memcpy(key.sha, sha, ULP_SHA256_LEN);
	void *d;
	int must_load;
	if (depth > ULP_WALK_MAX)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a delta chain is longer than %d links", a->dir,
		                    ULP_WALK_MAX);
	int grc = get_for(a, f, &key, e, &d, &must_load);
	if (grc < 0)
		return waited_err(a, grc, sha, &k);
	if (!must_load) {
		__atomic_fetch_add(&a->r->hits, 1, __ATOMIC_RELAXED);
		const ulp_blob *b;
		ulp_centry *be;
		/* the length is the chunk's: ask the (cached) blob */
		int rc = read_blob(a, f, sha, &be, &b);
		if (rc < 0) {
			ulp_cache_put(a->cache, *e);
			return rc;
		}
		uint64_t off, l;
		ulp_blob_chunk_range(b, k, &off, &l);
		ulp_cache_put(a->cache, be);
		*eout = ce;
		*data = d;
		*len = (size_t)l;
		return 0;
	}
	__atomic_fetch_add(&a->r->misses, 1, __ATOMIC_RELAXED);
	if (depth == 0 && !(f && __atomic_load_n(&f->warmed, __ATOMIC_RELAXED))) /* else asked for whole */
		willneed_chain(a, f, sha, k);
	const ulp_blob *b;
	ulp_centry *be = NULL, *re = NULL;
	uint8_t *buf = NULL, *wb[2] = {NULL, NULL}; /* a lone walk's two buffers */
	size_t slot;
	int rc = read_blob_at(a, f, sha, &be, &b, &slot);
	if (rc < 0)
		goto fail;
	const ulp_blob_info *in = ulp_blob_get_info(b);
	uint64_t off, l;
	ulp_blob_chunk_range(b, k, &off, &l);
	if (off >= in->raw_bytes && !(off == 0 && in->raw_bytes == 0)) {
		rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: chunk %u past the end of a blob", a->dir, k);
		goto fail;
	}
	const uint8_t *ref = NULL;
	size_t ref_len = 0;
	if (in->has_ref && lone && depth == 0) { /* invariant 8 */
		/* from the cache's free buffers, given back after: the walks in
		 * flight share a few, where buffers of each thread were fresh
		 * memory for every thread that ever walked */
		wb[0] = ulp_cache_alloc(a->cache, (size_t)l);
		wb[1] = wb[0] ? ulp_cache_alloc(a->cache, (size_t)l) : NULL;
		rc = wb[1] ? walk_lone(a, f, in->ref_sha256, k, wb[0], wb[1], (size_t)l, walk, 1) : -ULP_E_NOMEM;
		if (rc < 0)
			goto fail;
		ref = wb[0];
		ref_len = (size_t)l;
	} else if (in->has_ref) {
		rc = read_chunk(a, f, in->ref_sha256, k, &re, &ref, &ref_len, walk, depth + 1, 0);
		if (rc < 0)
			goto fail;
		if (ref_len != l) {
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a delta and its reference differ in chunk %u size",
			                  a->dir, k);
			goto fail;
		}
	}
	buf = ulp_cache_alloc(a->cache, (size_t)l);
	if (!buf) {
		rc = -ULP_E_NOMEM;
		goto fail;
	}
	if ((rc = decode_link(a, b, slot, sha, k, buf, (size_t)l, ref, walk)) < 0)
		goto fail;
	/* the reference's chunk goes first when space is needed: steps read in
	 * order need this chunk next, not that one, so a cache the size of one
	 * checkpoint (not two) keeps each read to one delta a chunk. A reference
	 * its reader has not had yet (a backward delta, layout.c) is the step
	 * read next: it stays warm. */
	ulp_cache_put_ref(a->cache, re);
	ulp_cache_put(a->cache, be);
	ulp_cache_give_buf(a->cache, wb[0]);
	ulp_cache_give_buf(a->cache, wb[1]);
	ulp_cache_fill(a->cache, *e, buf, (size_t)l, ulp_cache_free_buf);
	*eout = ce;
	*data = buf;
	*len = (size_t)l;
	return 0;
fail:
	ulp_cache_free_buf(buf);
	ulp_cache_give_buf(a->cache, wb[0]);
	ulp_cache_give_buf(a->cache, wb[1]);
	ulp_cache_put(a->cache, re);
	ulp_cache_put(a->cache, be);
	ulp_cache_fail(a->cache, *e, rc);
	return rc;
}

static int any_blob(void *arg, const ulp_ckey *key, void *data)
{
	(void)arg;
	(void)data;
	return key->kind == ULP_CK_BLOB;
}

/* The key of a listed directory in a->r->recent: never a series' (odd). */
static uint64_t listing_hash(const char *dir, size_t len)
{
	return ulp_xxh64(dir, len) & ~(uint64_t)1;
}

/* Records e (series, file) in a->r->recent, over its own entry or the oldest
 * (a->r->mu held); returns 1 if a live entry of the same series and another
 * file, or a live listing of one of dirs, was there. */
static int note_recent(ulp_archive *a, uint64_t series, uint64_t file, const uint64_t *dirs, size_t nd,
                       int64_t now)
{
	const size_t nr = sizeof(a->r->recent) / sizeof(a->r->recent[0]);
	size_t own = nr, oldest = 0;
	int seen = 0;
	for (size_t i = 0; i < nr; i++) {
		const struct ulp_recent *r = &a->r->recent[i];
		int live = r->ms && now - r->ms < RECENT_MS;
		if (live && r->file && r->series == series && r->file != file)
			seen = 1;
		for (size_t d = 0; live && !r->file && d < nd; d++)
			seen |= dirs[d] && r->series == dirs[d];
		if (r->series == series && r->file == file)
			own = i;
		if (r->ms < a->r->recent[oldest].ms)
			oldest = i;
	}
	a->r->recent[own < nr ? own : oldest] = (struct ulp_recent){series, file, now};
	return seen;
}

/* A listing of a directory holding two step directories or more makes the
 * reads under it in the next RECENT_MS a sweep's (invariant 8). */
static void note_listing(ulp_archive *a, const char *dir)
{
	int64_t now = ulp_mono_ms();
	pthread_mutex_lock(&a->r->mu);
	note_recent(a, listing_hash(dir, strlen(dir)), 0, NULL, 0, now);
	pthread_mutex_unlock(&a->r->mu);
}

int ulp_archive_readdir(ulp_archive *a, const char *path,
                        int (*cb)(void *arg, const char *name, const ulp_stat *st), void *arg)
{
	char dir[4096];
	int run_dir;
	int rc = ulp_ns_readdir(a, path, cb, arg, dir, sizeof(dir), &run_dir);
	if (rc == 0 && run_dir)
		note_listing(a, dir);
	return rc;
}

/* Decides, at f's first read, whether its reads keep the links they walk
 * (invariant 8): against the files of its series read and the directories
 * listed in the last RECENT_MS. */
static void lone_read(ulp_file *f)
{
	if (__atomic_load_n(&f->mode, __ATOMIC_RELAXED))
		return;
	ulp_archive *a = f->a;
	int m = MODE_SWEEP; /* in no series: as before (nothing to tell a sweep by) */
	if (f->series) {
		int64_t now = ulp_mono_ms();
		pthread_mutex_lock(&a->r->mu);
		m = note_recent(a, f->series, f->file, f->dirs, 3, now) ? MODE_SWEEP : MODE_LONE;
		pthread_mutex_unlock(&a->r->mu);
	}
	if (a->opts.cache_size && a->opts.cache_size < LONE_CACHE_MIN)
		m = MODE_SWEEP; /* a cache smaller than a few walks' buffers */
	int none = 0; /* the first decision stands */
	__atomic_compare_exchange_n(&f->mode, &none, m, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

static int file_chunk_as(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                         ulp_centry **e, const uint8_t **data, size_t *len, unsigned *walk, int lone)
{
	unsigned w = 0;
	int rc = read_chunk(a, f, sha, k, e, data, len, &w, 0, lone);
	/* invariant 6: a chain re-based by another process; invariant 9: a
	 * pack fetched anew */
	if (rc == -ULP_E_NOENT || rc == REFETCHED) {
		if (rc == -ULP_E_NOENT) /* ftab.c invariant 1: the index answers the retry */
			ulp_ftab_drop(a);
		ulp_cache_purge(a->cache, any_blob, NULL);
		rc = read_chunk(a, f, sha, k, e, data, len, &w, 0, lone);
	}
	rc = refetched_err(a, rc);
	if (rc == 0)
		ulp_cache_mark_served(*e);
	uint64_t m = __atomic_load_n(&a->r->max_walk, __ATOMIC_RELAXED);
	while (w > m && !__atomic_compare_exchange_n(&a->r->max_walk, &m, w, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
	if (walk)
		*walk = w;
	return rc;
}

/* Whether f's reads were found lone (lone_read decides at the first). */
static int is_lone(const ulp_file *f)
{
	return f && __atomic_load_n(&f->mode, __ATOMIC_RELAXED) == MODE_LONE;
}

/* A chunk for a reader of f (NULL: none), as f's reads go (invariant 8). */
static int file_chunk(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                      ulp_centry **e, const uint8_t **data, size_t *len, unsigned *walk)
{
	return file_chunk_as(a, f, sha, k, e, data, len, walk, is_lone(f));
}

int ulp_read_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k, ulp_centry **e,
                   const uint8_t **data, size_t *len, unsigned *walk)
{
	return file_chunk(a, NULL, sha, k, e, data, len, walk);
}

/* Puts the chunks of a content the caller holds decoded (an ingest that just
 * verified it) into the cache, so the next step coded against it finds its
 * reference without decoding: as seeds, while they have room (cache.c
 * invariant 7; a chunk past it is decoded again when wanted). */
int ulp_read_seed_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                        const uint8_t *chunk, size_t l)
{
	ulp_ckey key = {.chunk = k, .kind = ULP_CK_CHUNK};
	memcpy(key.sha, sha, ULP_SHA256_LEN);
	ulp_centry *e;
	void *d;
	int must;
	if (!ulp_cache_seed_room(a->cache, l))
		return 0;
	ULP_TRY(ulp_cache_get(a->cache, &key, &e, &d, &must));
	if (must) {
		uint8_t *buf = ulp_cache_alloc(a->cache, l);
		if (!buf) {
			ulp_cache_fail(a->cache, e, -ULP_E_NOMEM);
			return -ULP_E_NOMEM;
		}
		memcpy(buf, chunk, l);
		ulp_cache_fill_seed(a->cache, e, buf, l, ulp_cache_free_buf);
	}
	ulp_cache_put(a->cache, e);
	return 0;
}

void ulp_read_seed(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], const uint8_t *content,
                   size_t len, size_t chunk_bytes)
{
	if (!chunk_bytes)
		return;
	for (size_t off = 0, k = 0; off < len; off += chunk_bytes, k++)
		if (ulp_read_seed_chunk(a, sha, (uint32_t)k, content + off, ULP_MIN(chunk_bytes, len - off)) < 0)
			return;
}

void ulp_read_retire(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], size_t len,
                     size_t chunk_bytes)
{
	for (size_t off = 0, k = 0; chunk_bytes && off < len; off += chunk_bytes, k++) {
		ulp_ckey key = {.chunk = (uint32_t)k, .kind = ULP_CK_CHUNK};
		memcpy(key.sha, sha, ULP_SHA256_LEN);
		ulp_cache_retire(a->cache, &key);
	}
}

/* ---- parallel prefetch of the chunks a range needs ---------------------- */

typedef struct want {
	const uint8_t *sha;
	uint32_t k;
} want;

typedef struct prefetch {
	ulp_archive *a;
	const ulp_file *f;    /* whose chains these are, or NULL */
	want *w;
} prefetch;

static int job_prefetch(void *arg, size_t i)
{
	prefetch *p = arg;
	ulp_centry *e;
	const uint8_t *d;
	size_t l;
	int rc = file_chunk(p->a, p->f, p->w[i].sha, p->w[i].k, &e, &d, &l, NULL);
	if (rc == 0)
		ulp_cache_put(p->a->cache, e);
	return 0; /* errors surface in the copy that follows */
}

int ulp_read_content(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst, size_t len)
{
	const ulp_blob *b;
	ulp_centry *be;
	ULP_TRY(ulp_read_blob(a, sha, &be, &b));
	const ulp_blob_info *in = ulp_blob_get_info(b);
	uint64_t raw = in->raw_bytes, ce = (uint64_t)in->chunk_elems;
	uint32_t nk = in->n_elems ? (uint32_t)((in->n_elems + ce - 1) / ce) : 0;
	ulp_cache_put(a->cache, be);
	if (raw != len)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: content of %llu bytes where %zu were expected",
		                    a->dir, (unsigned long long)raw, len);
	if (nk > 1) {
		want *w = malloc(nk * sizeof(*w));
		if (w) {
			for (uint32_t k = 0; k < nk; k++)
				w[k] = (want){sha, k};
			prefetch p = {a, NULL, w};
			ulp_pool_run(a->pool, nk, job_prefetch, &p);
			free(w);
		}
	}
	size_t o = 0;
	for (uint32_t k = 0; k < nk; k++) {
		ulp_centry *e;
		const uint8_t *d;
		size_t l;
		ULP_TRY(ulp_read_chunk(a, sha, k, &e, &d, &l, NULL));
		if (o + l > len) {
			ulp_cache_put(a->cache, e);
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: chunks overrun their content", a->dir);
		}
		memcpy(dst + o, d, l);
		o += l;
		ulp_cache_put(a->cache, e);
	}
	return 0;
}

/* ---- sequential read-ahead ------------------------------------------------ */

/*
 * A file read in order has the chunks after the one being read decoded in the
 * background, so that decoding overlaps the copy of the current chunk to the
 * reader (the kernel asks for 128-256 KiB at a time, a chunk is up to a few
 * MiB), and so that a cold read keeps every core decoding: the links of one
 * chunk's chain are decoded in turn (each needs the one before), the chunks
 * are independent. One read-ahead thread a thread of the archive's pool, and
 * a window of as many chunks ahead of the reader.
 *
 * Invariants:
 *  1. The queue holds at most RA_QUEUE chunks; a post to a full queue is
 *     dropped (read-ahead is a hint, never a wait).
 *  2. The threads only load chunks into the cache and let go of them; a
 *     failure is left for the reader that needs the chunk to report.
 *  3. ulp_readahead_stop joins the threads before the archive frees the cache
 *     and the index connections they use.
 *  4. A chunk is never decoded twice (the cache's single-flight loading),
 *     and a read-ahead thread does not wait for one: a hint whose chunk is
 *     already loaded or loading (by the reader or another thread) is
 *     skipped, so the thread goes on to the next chunk instead of idling
 *     while a long chain walk finishes elsewhere. (A chunk that starts
 *     loading between the check and the get is waited for.)
 *  5. The window ahead of a reader is ra_window chunks of at least
 *     RA_BIG bytes, and the smaller chunks among them (at most RA_QUEUE
 *     chunks in all): a checkpoint's small tensors (norms, biases) decode
 *     in no time, and a window that counted them would leave the threads
 *     idle while the reader waits for its next large chunk (a cold read of
 *     a deep chain then ran on one core).
 */
#define RA_QUEUE 16
#define RA_THREADS 8
#define RA_BIG ((uint64_t)256 << 10)

typedef struct ra_item {
	uint8_t sha[ULP_SHA256_LEN];
	uint32_t k;
	int lone;             /* its file's reads are lone (invariant 8) */
} ra_item;

struct readahead {
	ulp_archive *a;
	pthread_t th[RA_THREADS];
	int n_th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ra_item q[RA_QUEUE];
	unsigned head, n;
	int stop;
};

static void *ra_main(void *arg)
{
	struct readahead *r = arg;
	/* its index connection now, beside the reader's first decode, not when
	 * its first chunk needs a blob located (a hint: a failure shows there) */
	ulp_db(r->a);
	pthread_mutex_lock(&r->mu);
	for (;;) {
		while (!r->n && !r->stop)
			pthread_cond_wait(&r->cv, &r->mu);
		if (r->stop)
			break;
		ra_item it = r->q[r->head];
		r->head = (r->head + 1) % RA_QUEUE;
		r->n--;
		pthread_mutex_unlock(&r->mu);
		ulp_centry *e;
		const uint8_t *d;
		size_t l;
		ulp_ckey key = {.chunk = it.k, .kind = ULP_CK_CHUNK};
		memcpy(key.sha, it.sha, ULP_SHA256_LEN);
		if (!ulp_cache_has(r->a->cache, &key) && /* invariant 4 */
		    file_chunk_as(r->a, NULL, it.sha, it.k, &e, &d, &l, NULL, it.lone) == 0) /* invariant 2 */
			ulp_cache_put(r->a->cache, e);
		pthread_mutex_lock(&r->mu);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* How many chunks ahead of the reader: one a read-ahead thread. */
static unsigned ra_window(ulp_archive *a)
{
	int t = ulp_pool_threads(a->pool);
	return t < 1 ? 1 : t > RA_THREADS ? RA_THREADS : (unsigned)t;
}

static void ra_post(ulp_archive *a, const uint8_t *sha, uint32_t k, int lone)
{
	pthread_mutex_lock(&a->r->mu);
	struct readahead *r = a->r->ra;
	if (!r && (r = calloc(1, sizeof(*r))) != NULL) { /* started on first use */
		r->a = a;
		pthread_mutex_init(&r->mu, NULL);
		pthread_cond_init(&r->cv, NULL);
		unsigned nt = ra_window(a);
		while (r->n_th < (int)nt && pthread_create(&r->th[r->n_th], NULL, ra_main, r) == 0)
			r->n_th++;
		if (r->n_th == 0) {
			pthread_mutex_destroy(&r->mu);
			pthread_cond_destroy(&r->cv);
			free(r);
			r = NULL;
		}
		a->r->ra = r;
	}
	pthread_mutex_unlock(&a->r->mu);
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	if (r->n < RA_QUEUE) { /* invariant 1 */
		ra_item *it = &r->q[(r->head + r->n) % RA_QUEUE];
		memcpy(it->sha, sha, ULP_SHA256_LEN);
		it->k = k;
		it->lone = lone;
		r->n++;
		pthread_cond_signal(&r->cv);
	}
	pthread_mutex_unlock(&r->mu);
}

void ulp_readahead_stop(ulp_archive *a)
{
	struct readahead *r = a->r->ra;
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	for (int i = 0; i < r->n_th; i++)
		pthread_join(r->th[i], NULL);
	pthread_mutex_destroy(&r->mu);
	pthread_cond_destroy(&r->cv);
	free(r);
	a->r->ra = NULL;
}

/* ---- files ----------------------------------------------------------------- */

static int add_loc_at(ulp_file *f, const uint8_t *content, size_t slot, uint64_t offset, uint64_t stored);
static void warm_at_open(ulp_file *f);

static int add_loc(void *arg, const uint8_t *content, int64_t pack, uint64_t offset, uint64_t stored)
{
	ulp_file *f = arg;
	size_t slot;
	if (ulp_pack_pin(f->a, pack, &slot) < 0)
		return 0; /* a pack that cannot be mapped: the read says why */
	return add_loc_at(f, content, slot, offset, stored);
}

/* add_loc from the file table, which knows the pack's name (no query) */
static int add_loc_known(void *arg, const uint8_t *content, const ulp_packref *pk, uint64_t offset, uint64_t stored)
{
	ulp_file *f = arg;
	size_t slot;
	if (ulp_pack_pin_known(f->a, pk, &slot) < 0)
		return 0; /* a pack that cannot be mapped: the read says why */
	return add_loc_at(f, content, slot, offset, stored);
}

static int add_loc_at(ulp_file *f, const uint8_t *content, size_t slot, uint64_t offset, uint64_t stored)
{
	if ((f->n_locs & (f->n_locs + 1)) == 0 || !f->locs) { /* capacities 1, 3, 7, ... */
		loc *nl = realloc(f->locs, (f->n_locs * 2 + 1) * sizeof(*nl));
		if (!nl) {
			ulp_pack_unpin(f->a, slot);
			return -ULP_E_NOMEM;
		}
		f->locs = nl;
	}
	loc *l = &f->locs[f->n_locs++];
	f->chain_stored += stored;
	memcpy(l->content, content, ULP_SHA256_LEN);
	l->slot = slot;
	l->offset = offset;
	l->stored = stored;
	return 0;
}

static int loc_cmp(const void *x, const void *y)
{
	return memcmp(((const loc *)x)->content, ((const loc *)y)->content, ULP_SHA256_LEN);
}

int ulp_file_open(ulp_archive *a, const char *path, ulp_file **out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	char p[4096];
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
	size_t pl = strlen(p);
	ulp_file *f = calloc(1, sizeof(*f) + pl + 1);
	if (!f)
		return -ULP_E_NOMEM;
	memcpy(f->path, p, pl + 1);
	f->a = a;
	/* a fresh file table: no query, no page of the index read (issue 38);
	 * its chains' blobs located at once (invariant 3) */
	ulp_ftab *t = ulp_ftab_get(a);
	int rc = t ? ulp_ftab_file(a, t, p, &f->st, &f->header, &f->header_len, &f->ext, &f->n_ext, add_loc_known, f)
	           : ulp_index_file(a, p, &f->st, &f->header, &f->header_len, &f->ext, &f->n_ext);
	ulp_ftab_put(a, t);
	if (rc == 0 && (f->st.is_dir || f->st.is_symlink))
		rc = ulp_arch_err(a, -ULP_E_INVAL, "%s: not a regular file", p);
	/* kind 2 stores its header compressed */
	if (rc == 0 && f->st.kind == 2 && f->header_len) {
		unsigned long long n = ZSTD_getFrameContentSize(f->header, f->header_len);
		uint8_t *h = NULL;
		if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n > f->st.size)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: stored header is not a zstd frame of its size", p);
		else if (!(h = malloc(n ? (size_t)n : 1)))
			rc = -ULP_E_NOMEM;
		else if (ZSTD_decompress(h, (size_t)n, f->header, f->header_len) != n)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: stored header does not decompress", p);
		free(f->header);
		f->header = h;
		f->header_len = (size_t)n;
	}
	/* invariant 1 of index.c, invariant 5 here */
	if (rc == 0 && !(f->hoff = malloc((f->n_ext + 1) * sizeof(*f->hoff))))
		rc = -ULP_E_NOMEM;
	uint64_t at = 0, h = 0;
	for (size_t i = 0; rc == 0 && i < f->n_ext; i++) {
		const ulp_extent *x = &f->ext[i];
		if (x->offset < at || x->offset > f->st.size || x->length > f->st.size - x->offset)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: extent at byte %llu overlaps or runs past the end", p,
			                  (unsigned long long)x->offset);
		else {
			h += x->offset - at;
			f->hoff[i] = h;
			at = x->offset + x->length;
		}
	}
	if (rc == 0) {
		h += f->st.size - at;
		f->hoff[f->n_ext] = h;
		if (h != f->header_len)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: extents leave %llu bytes but the header has %zu", p,
			                  (unsigned long long)h, f->header_len);
	}
	if (rc == 0 && f->n_ext && !t)
		rc = ulp_index_file_blobs(a, p, add_loc, f); /* invariant 3 */
	if (rc == 0) { /* invariant 8: what tells its series */
		char *series = NULL;
		ulp_parse_step(p, &series);
		if (series) {
			f->series = ulp_xxh64(series, strlen(series)) | 1;
			free(series);
		}
		f->file = ulp_xxh64(p, pl);
		size_t e = pl;
		for (int d = 0; d < 3; d++) { /* its parent, grandparent, great-grandparent */
			while (e > 0 && p[e - 1] != '/')
				e--;
			if (e == 0) {
				f->dirs[d] = listing_hash("", 0); /* the root */
				break;
			}
			e--; /* the slash */
			f->dirs[d] = listing_hash(p, e);
		}
	}
	if (rc == 0 && f->n_locs > 1)
		qsort(f->locs, f->n_locs, sizeof(*f->locs), loc_cmp);
	if (rc < 0) {
		ulp_file_close(f);
		return rc;
	}
	warm_at_open(f);
	*out = f;
	return 0;
}

void ulp_file_set_readahead(ulp_file *f, int on)
{
	__atomic_store_n(&f->no_ra, !on, __ATOMIC_RELAXED);
}

void ulp_file_close(ulp_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n_locs; i++)
		ulp_pack_unpin(f->a, f->locs[i].slot);
	free(f->locs);
	free(f->header);
	free(f->ext);
	free(f->hoff);
	free(f);
}

const ulp_stat *ulp_file_get_stat(const ulp_file *f)
{
	return &f->st;
}

/* The first extent that ends after byte off (n_ext if none): the one holding
 * off, or the next one when off lies in the header's bytes. */
static size_t find_extent(const ulp_file *f, uint64_t off)
{
	size_t lo = 0, hi = f->n_ext;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (f->ext[mid].offset + f->ext[mid].length <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Chunk geometry of an extent's content: bytes per chunk. */
static int chunk_bytes(ulp_archive *a, const ulp_file *f, const ulp_extent *x, uint64_t *cb)
{
	const ulp_blob *b;
	ulp_centry *be;
	ULP_TRY(read_blob_again(a, f, x->content, &be, &b));
	const ulp_blob_info *in = ulp_blob_get_info(b);
	*cb = (uint64_t)in->chunk_elems * (in->n_elems ? in->raw_bytes / in->n_elems : 1);
	if (in->raw_bytes != x->length) {
		ulp_cache_put(a->cache, be);
		return ulp_arch_err(a, -ULP_E_CORRUPT, "blob of %llu bytes behind an extent of %llu",
		                    (unsigned long long)in->raw_bytes, (unsigned long long)x->length);
	}
	ulp_cache_put(a->cache, be);
	return 0;
}

/* The chunk after chunk k of extent *i (bytes cb a chunk): *i, *k, *cb
 * moved on, past extents of no bytes; 0 when there is none. */
static int next_chunk(ulp_file *f, size_t *i, uint64_t *k, uint64_t *cb)
{
	if ((*k + 1) * *cb < f->ext[*i].length) {
		(*k)++;
		return 1;
	}
	do
		(*i)++;
	while (*i < f->n_ext && f->ext[*i].length == 0);
	if (*i >= f->n_ext || chunk_bytes(f->a, f, &f->ext[*i], cb) < 0)
		return 0;
	*k = 0;
	return 1;
}

/* Posts, for read-ahead, the window of chunks after the one holding byte
 * last (past the header), those not posted for f yet: ra_mark is the
 * furthest one posted (ext << 32 | k, plus 1), ra_from where the window
 * began; a reader that went back starts afresh. */
static void read_ahead(ulp_file *f, uint64_t last)
{
	size_t i = find_extent(f, last);
	uint64_t cb = 1, k;
	if (i >= f->n_ext || f->ext[i].length == 0)
		return;
	if (last < f->ext[i].offset) { /* in the header's bytes: the next extent's first chunk */
		k = 0;
		if (chunk_bytes(f->a, f, &f->ext[i], &cb) < 0)
			return;
	} else {
		if (chunk_bytes(f->a, f, &f->ext[i], &cb) < 0)
			return;
		k = (last - f->ext[i].offset) / cb;
		if (!next_chunk(f, &i, &k, &cb))
			return;
	}
	uint64_t first = ((uint64_t)i << 32 | k) + 1;
	if (__atomic_exchange_n(&f->ra_from, first, __ATOMIC_RELAXED) > first)
		__atomic_store_n(&f->ra_mark, 0, __ATOMIC_RELAXED); /* went back */
	unsigned w = ra_window(f->a), big = 0;
	for (unsigned j = 0; j < RA_QUEUE; j++) {
		uint64_t mark = ((uint64_t)i << 32 | k) + 1;
		uint64_t m = __atomic_load_n(&f->ra_mark, __ATOMIC_RELAXED);
		if (mark > m && __atomic_compare_exchange_n(&f->ra_mark, &m, mark, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
			ra_post(f->a, f->ext[i].content, (uint32_t)k, is_lone(f));
		big += ULP_MIN(cb, f->ext[i].length - k * cb) >= RA_BIG; /* invariant 5 of the read-ahead */
		if (big >= w || !next_chunk(f, &i, &k, &cb))
			break;
	}
}

/* A small file's first read of its contents asks the kernel for the pages
 * of every blob of its chains at once (a cold read of many small tensors
 * otherwise faults each link's pages in, one after the other); a larger
 * file's chains are asked for chunk by chunk (willneed_chain). Blobs that
 * lie side by side in a pack (a step's tensors are written in file order)
 * are asked for in one call: a few large reads of the disk, and a few
 * system calls, not one per blob. Only a hint. */
#define WARM_MAX ((uint64_t)16 << 20)
#define WARM_GAP ((uint64_t)64 << 10) /* a hole this small is read too */

typedef struct span {
	size_t slot;
	uint64_t lo, hi;
} span;

static int span_cmp(const void *x, const void *y)
{
	const span *a = x, *b = y;
	if (a->slot != b->slot)
		return a->slot < b->slot ? -1 : 1;
	return a->lo < b->lo ? -1 : a->lo > b->lo;
}

static void warm_span(ulp_file *f, const span *s)
{
	const uint8_t *p;
	if (ulp_pack_slot_blob(f->a, s->slot, s->lo, s->hi - s->lo, &p) < 0)
		return;
	uintptr_t lo = (uintptr_t)p & ~(uintptr_t)4095;
	madvise((void *)lo, (uintptr_t)p + (s->hi - s->lo) - lo, MADV_WILLNEED);
}

static void warm_chains(ulp_file *f)
{
	/* (A larger file's blob headers asked for too, issue 29, measured
	 * slower: 217 against 188 ms for a deep step, the packs' own read-ahead
	 * from their first page, pack.c invariant 5, brings them.) */
	if (f->chain_stored > WARM_MAX || __atomic_exchange_n(&f->warmed, 1, __ATOMIC_RELAXED))
		return;
	span *sp = malloc((f->n_locs ? f->n_locs : 1) * sizeof(*sp));
	size_t n = 0;
	for (size_t i = 0; sp && i < f->n_locs; i++)
		if (f->locs[i].stored)
			sp[n++] = (span){f->locs[i].slot, f->locs[i].offset, f->locs[i].offset + f->locs[i].stored};
	if (!sp)
		return; /* a hint */
	qsort(sp, n, sizeof(*sp), span_cmp);
	for (size_t i = 0; i < n;) {
		span run = sp[i++];
		while (i < n && sp[i].slot == run.slot && sp[i].lo <= run.hi + WARM_GAP) {
			run.hi = ULP_MAX(run.hi, sp[i].hi);
			i++;
		}
		warm_span(f, &run);
	}
	free(sp);
}

/* At the open (issue 38): the pages of every blob of its chains asked for
 * in the background (pack.c invariant 7), the open waiting for no disk,
 * up to OPEN_WARM_MAX bytes of chains; a file with more is asked for chunk
 * by chunk as it is read (willneed_chain). Adjacent blobs in one request,
 * as warm_chains does. */
#define OPEN_WARM_MAX ((uint64_t)256 << 20)
#define WARM_PIECE ((uint64_t)1 << 20)

static void warm_at_open(ulp_file *f)
{
	if (!f->n_locs || f->chain_stored > OPEN_WARM_MAX)
		return;
	span *sp = malloc(f->n_locs * sizeof(*sp));
	if (!sp)
		return; /* a hint */
	size_t n = 0;
	for (size_t i = 0; i < f->n_locs; i++)
		if (f->locs[i].stored)
			sp[n++] = (span){f->locs[i].slot, f->locs[i].offset, f->locs[i].offset + f->locs[i].stored};
	qsort(sp, n, sizeof(*sp), span_cmp);
	size_t nr = 0; /* the runs, merged in place */
	for (size_t i = 0; i < n;) {
		span run = sp[i++];
		while (i < n && sp[i].slot == run.slot && sp[i].lo <= run.hi + WARM_GAP) {
			run.hi = ULP_MAX(run.hi, sp[i].hi);
			i++;
		}
		sp[nr++] = run;
	}
	/* in pieces, one of each run in turn: a chunk's walk needs the same
	 * part of every link, each in another pack, so the disk brings the
	 * chains' first chunks first, not one whole pack after the other
	 * (measured: a deep step read cold at 0.6x the speed with whole runs) */
	uint64_t piece = ULP_MAX(WARM_PIECE, f->chain_stored / 200);
	for (int more = 1; more;) {
		more = 0;
		for (size_t r = 0; r < nr; r++) {
			if (sp[r].lo >= sp[r].hi)
				continue;
			uint64_t l = ULP_MIN(piece, sp[r].hi - sp[r].lo);
			ulp_pack_willneed(f->a, sp[r].slot, sp[r].lo, l);
			sp[r].lo += l;
			more = 1;
		}
	}
	free(sp);
	__atomic_store_n(&f->warmed, 1, __ATOMIC_RELAXED); /* asked for whole */
}

int64_t ulp_file_pread(ulp_file *f, void *dst, size_t len, uint64_t off)
{
	ulp_archive *a = f->a;
	uint8_t *out = dst;
	if (off >= f->st.size)
		return 0;
	if (len > f->st.size - off)
		len = (size_t)(f->st.size - off);
	lone_read(f); /* invariant 8, decided at the first read */
	/* reading in order: the chunk after this read's end is decoded meanwhile */
	uint64_t prev = __atomic_exchange_n(&f->next_off, off + len, __ATOMIC_RELAXED);
	if (f->n_ext)
		warm_chains(f);
	if (prev == off && off + len < f->st.size && f->n_ext && !__atomic_load_n(&f->no_ra, __ATOMIC_RELAXED))
		read_ahead(f, off + len - 1);
	size_t done = 0;
	/* which chunks: prefetch them in parallel when there are several */
	size_t first = find_extent(f, off), nwant = 0, cap = 0;
	want *w = NULL;
	int rc = 0;
	for (size_t i = first; i < f->n_ext && f->ext[i].offset < off + len && rc == 0; i++) {
		const ulp_extent *x = &f->ext[i];
		uint64_t cb;
		if (x->length == 0)
			continue;
		if ((rc = chunk_bytes(a, f, x, &cb)) < 0)
			break;
		uint64_t lo = ULP_MAX(off + done, x->offset) - x->offset;
		uint64_t hi = ULP_MIN(off + len, x->offset + x->length) - x->offset;
		for (uint64_t k = lo / cb; k * cb < hi; k++) {
			if ((rc = ulp_grow(&w, &cap, nwant, sizeof(*w))) < 0)
				break;
			w[nwant++] = (want){x->content, (uint32_t)k};
		}
	}
	if (rc == 0 && nwant > 1) {
		prefetch p = {a, f, w};
		ulp_pool_run(a->pool, nwant, job_prefetch, &p);
	}
	free(w);
	for (size_t i = first; rc == 0 && done < len && i <= f->n_ext; i++) {
		/* the header's bytes before extent i (or after the last one) */
		uint64_t gap_end = i < f->n_ext ? f->ext[i].offset : f->st.size;
		if (off + done < gap_end) {
			size_t n = (size_t)ULP_MIN((uint64_t)(len - done), gap_end - (off + done));
			memcpy(out + done, f->header + (f->hoff[i] - (gap_end - (off + done))), n);
			done += n;
		}
		if (i == f->n_ext || done == len)
			break;
		const ulp_extent *x = &f->ext[i];
		uint64_t cb;
		if (x->length == 0)
			continue;
		if ((rc = chunk_bytes(a, f, x, &cb)) < 0)
			break;
		while (done < len && off + done < x->offset + x->length) {
			uint64_t rel = off + done - x->offset;
			uint32_t k = (uint32_t)(rel / cb);
			ulp_centry *e;
			const uint8_t *d;
			size_t l;
			if ((rc = file_chunk(a, f, x->content, k, &e, &d, &l, NULL)) < 0)
				break;
			uint64_t in_chunk = rel - (uint64_t)k * cb;
			size_t n = (size_t)ULP_MIN((uint64_t)(len - done), l - in_chunk);
			memcpy(out + done, d + in_chunk, n);
			done += n;
			ulp_cache_put(a->cache, e);
		}
	}
	if (rc < 0) {
		char why[1024];
		snprintf(why, sizeof(why), "%s", ulp_archive_errmsg(a));
		return ulp_arch_err(a, rc, "%s: %s", f->path, why);
	}
	return (int64_t)done;
}

/* ---- the whole file to a descriptor (ulpack export) ------------------------ */

/* Chunk k of sha pinned in the cache, its chain walked once (invariant 7):
 * as a read does, the links below it entering the cache, so that the steps
 * of a backward part of the layout (layout.c), exported in step order after
 * the deepest one, find their chunks decoded. */
static int walk_chunk(ulp_archive *a, const ulp_file *f, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                      ulp_centry **eout, const uint8_t **data, size_t *len)
{
	return file_chunk(a, f, sha, k, eout, data, len, NULL);
}

typedef struct xjob {
	size_t ext;
	uint32_t k;
} xjob;

typedef struct xctx {
	ulp_file *f;
	int fd;
	xjob *jobs;
	uint64_t *cb;  /* bytes per chunk, per extent */
	size_t failed; /* first failed job + 1, 0 if none (atomic) */
	int werr;      /* errno of the first failed write (atomic) */
} xctx;

static void x_failed(xctx *x, size_t i, int werr)
{
	size_t zero = 0;
	if (__atomic_compare_exchange_n(&x->failed, &zero, i + 1, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		__atomic_store_n(&x->werr, werr, __ATOMIC_RELAXED);
}

static int job_export(void *arg, size_t i)
{
	xctx *x = arg;
	const ulp_extent *e = &x->f->ext[x->jobs[i].ext];
	uint32_t k = x->jobs[i].k;
	ulp_centry *ce;
	const uint8_t *d;
	size_t l;
	int rc = walk_chunk(x->f->a, x->f, e->content, k, &ce, &d, &l);
	if (rc == -ULP_E_NOENT) { /* invariant 6 */
		ulp_cache_purge(x->f->a->cache, any_blob, NULL);
		rc = walk_chunk(x->f->a, x->f, e->content, k, &ce, &d, &l);
	}
	if (rc < 0) {
		x_failed(x, i, 0);
		return rc;
	}
	uint64_t at = (uint64_t)k * x->cb[x->jobs[i].ext];
	int werr = at + l <= e->length ? ulp_pwrite_full(x->fd, d, l, e->offset + at) : EINVAL;
	ulp_cache_put(x->f->a->cache, ce);
	if (werr) {
		x_failed(x, i, werr);
		return werr == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO;
	}
	return 0;
}

int ulp_file_write_to(ulp_file *f, int fd)
{
	ulp_archive *a = f->a;
	int rc = 0, werr = 0;
	__atomic_store_n(&f->mode, MODE_SWEEP, __ATOMIC_RELAXED); /* invariants 7, 8 */
	/* the header's bytes around the extents (invariant 5) */
	uint64_t at = 0;
	for (size_t i = 0; i <= f->n_ext && !werr; i++) {
		uint64_t end = i < f->n_ext ? f->ext[i].offset : f->st.size;
		if (end > at)
			werr = ulp_pwrite_full(fd, f->header + (f->hoff[i] - (end - at)), (size_t)(end - at), at);
		if (i < f->n_ext)
			at = f->ext[i].offset + f->ext[i].length;
	}
	if (werr)
		return ulp_arch_err(a, werr == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: write: %s", f->path, strerror(werr));
	/* every chunk of every extent, in file order, on the pool */
	xctx x = {f, fd, NULL, NULL, 0, 0};
	size_t nj = 0, cap = 0;
	if (f->n_ext && !(x.cb = malloc(f->n_ext * sizeof(*x.cb))))
		rc = -ULP_E_NOMEM;
	for (size_t i = 0; rc == 0 && i < f->n_ext; i++) {
		const ulp_extent *e = &f->ext[i];
		x.cb[i] = 1;
		if (e->length == 0)
			continue;
		if ((rc = chunk_bytes(a, f, e, &x.cb[i])) < 0 && rc == -ULP_E_NOENT) {
			ulp_cache_purge(a->cache, any_blob, NULL);
			rc = chunk_bytes(a, f, e, &x.cb[i]);
		}
		if (rc == 0 && x.cb[i] == 0)
			rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a blob of empty chunks", f->path);
		for (uint64_t k = 0; rc == 0 && k * x.cb[i] < e->length; k++) {
			if ((rc = ulp_grow(&x.jobs, &cap, nj, sizeof(*x.jobs))) < 0)
				break;
			x.jobs[nj++] = (xjob){i, (uint32_t)k};
		}
	}
	if (rc == 0 && nj)
		rc = ulp_pool_run(a->pool, nj, job_export, &x);
	if (rc < 0 && x.failed) { /* say why on this thread (messages are per thread) */
		const xjob *j = &x.jobs[x.failed - 1];
		werr = __atomic_load_n(&x.werr, __ATOMIC_RELAXED);
		if (werr) {
			rc = ulp_arch_err(a, rc, "%s: write: %s", f->path, strerror(werr));
		} else {
			ulp_centry *e;
			const uint8_t *d;
			size_t l;
			int r = file_chunk(a, f, f->ext[j->ext].content, j->k, &e, &d, &l, NULL);
			char why[1024];
			if (r == 0)
				ulp_cache_put(a->cache, e);
			snprintf(why, sizeof(why), "%s", r < 0 ? ulp_archive_errmsg(a) : ulp_strerror(rc));
			rc = ulp_arch_err(a, r < 0 ? r : rc, "%s: %s", f->path, why);
		}
	} else if (rc < 0) {
		char why[1024];
		snprintf(why, sizeof(why), "%s", rc == -ULP_E_NOMEM ? ulp_strerror(rc) : ulp_archive_errmsg(a));
		rc = ulp_arch_err(a, rc, "%s: %s", f->path, why);
	}
	free(x.jobs);
	free(x.cb);
	return rc;
}

/* cached parsed blobs whose pack file is gone go, so that the pack can */
static int blob_in_gone_pack(void *arg, const ulp_ckey *key, void *data)
{
	return key->kind == ULP_CK_BLOB && ulp_pack_slot_gone(arg, ((cblob *)data)->slot);
}

int ulp_archive_trim(ulp_archive *a)
{
	if (ulp_pack_mark_gone(a) == 0)
		return 0;
	ulp_cache_purge(a->cache, blob_in_gone_pack, a);
	return (int)ulp_pack_unmap_gone(a);
}
