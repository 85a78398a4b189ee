/* SPDX-License-Identifier: MIT */
/*
 * recode.c - re-coding stored blobs against another reference: the one
 * primitive under retention (a removed step's blobs that kept steps still
 * need are re-based so gc can drop them), renames (a file whose series
 * changed is coded against its new neighbours), out-of-order arrival (a
 * step that lands between two archived ones shifts the layout of its
 * series) and the newest step as an anchor (a new newest step is archived
 * standalone; the previous newest is then re-coded as a delta, to the place
 * the layout of its series names: layout.c, ulp_archive_rebase_pending). A content never changes, only how it is stored: the blob row
 * keyed by the content's sha256 moves to a new coding, so extents and the
 * dependents that name it by content are untouched.
 *
 * A run: plan (which content, against which reference), code (decode the
 * content and the reference through the cache, encode, decode again and
 * compare; items in parallel on the pool, or one item on the whole pool),
 * append to one new pack, then under the write lock: pack durable, one index
 * transaction (ulp_index_rebase_apply), commit.
 *
 * Invariants:
 *  1. Only what was planned changes: a row that changed meanwhile (another
 *     writer re-coded or dropped it) is left as it is, checked inside the
 *     transaction that commits.
 *  2. Every re-coded blob decodes to its content (bytes and identity) before
 *     the pack is committed; the new blob is written in the format of the
 *     blob it replaces, so its content digest (v1: SHA-256, v2: the tree
 *     digest of ulpack-format(5) 2.4) is the content's key, as ingest and
 *     gc compute it, and verify's decode check holds; the pack is durable before the transaction that
 *     names it commits. A crash at any point leaves the old rows (and maybe
 *     a pack the index does not name, which gc removes) or the new ones.
 *  3. A new reference never needs the blob it is for (no cycle: its chain,
 *     as planned, does not reach it), and no chain exceeds max_chain: the
 *     new depth plus the longest chain below stays within it when planned,
 *     and the depths recomputed in the transaction are checked again.
 *  4. Readers that hold the old coding keep reading it (their packs stay
 *     pinned, pack.c); this process's cache forgets its parsed old blobs
 *     after the commit (decoded chunks are keyed by content and stay valid).
 */
#include "arch_int.h"
#include "senc.h"
#include "store/db.h"
#include "store/path.h"
#include "archive/cache.h"
#include "store/index.h"
#include "store/pack.h"
#include "archive/read.h"
#include "archive/writer.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define BATCH_BYTES ((uint64_t)128 << 20) /* raw bytes coded between appends: bounds memory */
#define N_CANDIDATES 8                     /* references tried for a blob that must move */
#define PENDING_BATCH 64                   /* queued files handled per run */

enum { RB_IMPROVE = 0, RB_MUST = 1, RB_LAYOUT = 2 };

typedef struct item {
	ulp_rebased rb;
	int dtype;
	uint64_t len;
	int must;          /* 1: commit even if larger (its old reference goes) */
	unsigned depth;    /* planned depth */
	/* coding results */
	uint8_t *blob;
	size_t blob_len;
	uint8_t blob_sha[ULP_SHA256_LEN]; /* the pack's per-blob digest, taken while coding */
	int rc, keep;
	int prewritten;    /* streamed (code_stream): in the pack already, at rb.offset */
	char err[300];
} item;

typedef struct plan {
	ulp_archive *a;
	item *it;
	size_t n, cap;
} plan;

static double now_s(void)
{
	return (double)ulp_mono_ns() * 1e-9;
}

static item *planned(plan *P, const uint8_t *content)
{
	for (size_t i = 0; i < P->n; i++)
		if (memcmp(P->it[i].rb.content, content, ULP_SHA256_LEN) == 0)
			return &P->it[i];
	return NULL;
}

/* Follows the chain of from as it will be once the plan commits: 1 if it
 * reaches to (a cycle) or passes a blob whose reference is going away and
 * that is not planned yet (its new reference is unknown), else 0 with the
 * planned depth of from in *depth. */
static int walk(plan *P, const uint8_t *from, const uint8_t *to, unsigned *depth)
{
	uint8_t cur[ULP_SHA256_LEN];
	memcpy(cur, from, ULP_SHA256_LEN);
	for (unsigned n = 0; n <= P->a->max_chain + 1; n++) {
		if (memcmp(cur, to, ULP_SHA256_LEN) == 0)
			return 1;
		item *p = planned(P, cur);
		if (p) { /* its chain as planned: it may lead back to `to` */
			if (!p->rb.has_ref) {
				*depth = n;
				return 0;
			}
			memcpy(cur, p->rb.ref, ULP_SHA256_LEN);
			continue;
		}
		ulp_rbblob b;
		ULP_TRY(ulp_index_blob_ref(P->a, cur, &b));
		if (!b.has_ref) {
			*depth = n;
			return 0;
		}
		int used = ulp_index_blob_used(P->a, b.ref);
		ULP_TRY(used);
		if (!used)
			return 1;
		memcpy(cur, b.ref, ULP_SHA256_LEN);
	}
	return 1; /* longer than any chain may be: not a reference to take */
}

static int add_item(plan *P, const ulp_rbtensor *t, const ulp_rbblob *old, const uint8_t *ref, unsigned depth,
                    int must)
{
	ULP_TRY(ulp_grow(&P->it, &P->cap, P->n, sizeof(*P->it)));
	item *x = &P->it[P->n++];
	memset(x, 0, sizeof(*x));
	memcpy(x->rb.content, t->content, ULP_SHA256_LEN);
	x->rb.has_ref = ref != NULL;
	if (ref)
		memcpy(x->rb.ref, ref, ULP_SHA256_LEN);
	x->rb.old = *old;
	x->dtype = t->dtype;
	x->len = t->length;
	x->must = must;
	x->depth = depth;
	return 0;
}

/* 1 when t's content is a blob still to plan (not planned yet, indexed,
 * its length and dtype sane), its row in *old; 0 when there is nothing to
 * plan; < 0 an error */
static int plannable(plan *P, const ulp_rbtensor *t, ulp_rbblob *old)
{
	if (planned(P, t->content))
		return 0;
	int rc = ulp_index_blob_ref(P->a, t->content, old);
	if (rc == -ULP_E_NOENT)
		return 0;
	ULP_TRY(rc);
	return old->raw == t->length && t->dtype >= 0 && t->dtype < ULP_DT__COUNT;
}

/* Plans tensor t: RB_MUST moves it off its reference (to the nearest other
 * step of its series that invariant 3 allows, else standalone); RB_IMPROVE
 * tries the nearest step only, when that is not its reference already. */
static int plan_tensor(plan *P, const ulp_rbtensor *t, int mode)
{
	ulp_archive *a = P->a;
	ulp_rbblob old;
	int rc = plannable(P, t, &old);
	if (rc <= 0)
		return rc;
	uint8_t cand[N_CANDIDATES][ULP_SHA256_LEN];
	size_t nc = 0;
	unsigned h = 0;
	ULP_TRY(ulp_index_height(a, t->content, mode == RB_MUST, &h));
	/* a tensor that must move (its reference is forgotten): first onto the
	 * step the layout of its series names among those kept (layout.c), so
	 * that the kept steps end as an import of them alone would code them */
	if (mode == RB_MUST && t->series) {
		int64_t rf = -1;
		ulp_blobrow row;
		ULP_TRY(ulp_layout_target(a, t->series, t->step, t->path, &rf, NULL, 0));
		if (rf >= 0 && ulp_index_tensor(a, rf, t->name, t->dtype, t->length, cand[0], &row) == 0 &&
		    memcmp(cand[0], t->content, ULP_SHA256_LEN) != 0) {
			unsigned d = 0;
			rc = walk(P, cand[0], t->content, &d);
			ULP_TRY(rc);
			if (rc == 0 && d + 1 + h <= a->max_chain)
				return add_item(P, t, &old, cand[0], d + 1, mode);
		}
	}
	ULP_TRY(ulp_index_candidates(a, t, cand, mode == RB_MUST ? N_CANDIDATES : 1, &nc));
	for (size_t i = 0; i < nc; i++) {
		if (mode == RB_IMPROVE && old.has_ref && memcmp(old.ref, cand[i], ULP_SHA256_LEN) == 0)
			return 0; /* on its nearest step already */
		unsigned d = 0;
		rc = walk(P, cand[i], t->content, &d);
		ULP_TRY(rc);
		if (rc == 0 && d + 1 + h <= a->max_chain)
			return add_item(P, t, &old, cand[i], d + 1, mode);
		if (mode == RB_IMPROVE)
			return 0;
	}
	return mode == RB_MUST ? add_item(P, t, &old, NULL, 0, mode) : 0;
}

/* The whole content of sha into dst (len bytes): through the pool (one item
 * at a time) or chunk by chunk on this thread (items in parallel). Then its
 * chunks (chunk bytes each) and those of the links they decoded through go
 * from the cache: a pass reads each content once, and kept they filled the
 * readers' cache (re-basing a 4.3 GB DCP rank file against the next step at
 * close: 3.8 GB of daemon memory with the default cache, 0.55 GB without). */
static int read_whole(ulp_archive *a, const uint8_t *sha, uint8_t *dst, size_t len, size_t chunk, int use_pool)
{
	int rc = 0;
	if (use_pool) {
		rc = ulp_read_content(a, sha, dst, len);
	} else {
		size_t o = 0;
		for (uint32_t k = 0; o < len && rc == 0; k++) {
			ulp_centry *e;
			const uint8_t *d;
			size_t l;
			rc = ulp_read_chunk(a, sha, k, &e, &d, &l, NULL);
			if (rc < 0)
				break;
			if (l == 0 || o + l > len)
				rc = ulp_arch_err(a, -ULP_E_CORRUPT, "%s: chunks overrun their content", a->dir);
			else
				memcpy(dst + o, d, l);
			o += l;
			ulp_cache_put(a->cache, e);
		}
	}
	uint8_t (*chain)[ULP_SHA256_LEN] = chunk ? malloc(ULP_CHAIN_MAX * ULP_SHA256_LEN) : NULL;
	if (chain) { /* (no memory: they stay cached, as before) */
		size_t n = ulp_chain_of(a, sha, chain);
		for (uint64_t k = 0; k * chunk < len; k++)
			ulp_chain_retire(a, (const uint8_t (*)[ULP_SHA256_LEN])chain, n, (uint32_t)k);
		free(chain);
	}
	return rc;
}

static int chunk_elems_of(ulp_archive *a, const uint8_t *sha, uint32_t *ce, unsigned *version)
{
	ulp_centry *e;
	const ulp_blob *b;
	ULP_TRY(ulp_read_blob(a, sha, &e, &b));
	*ce = ulp_blob_get_info(b)->chunk_elems;
	if (version)
		*version = ulp_blob_get_info(b)->version;
	ulp_cache_put(a->cache, e);
	return 0;
}

/* Codes one item (invariant 2: decoded and compared before it counts). */
static int code_item(ulp_archive *a, item *x, int use_pool)
{
	size_t len = (size_t)x->len;
	ulp_dtype dt = (ulp_dtype)x->dtype;
	ulp_pool *pool = use_pool ? a->pool : NULL;
	uint8_t *src = ulp_alloc_big(len), *ref = x->rb.has_ref ? ulp_alloc_big(len) : NULL;
	uint8_t *check = ulp_alloc_big(len), sha[ULP_SHA256_LEN];
	uint32_t ce = 0, rce = 0;
	unsigned version = 0;
	int rc = !src || !check || (x->rb.has_ref && !ref) ? -ULP_E_NOMEM : 0;
	char hex[65];
	ulp_sha256_hex(x->rb.content, hex);
	if (rc == 0)
		rc = chunk_elems_of(a, x->rb.content, &ce, &version);
	if (rc == 0)
		rc = read_whole(a, x->rb.content, src, len, (size_t)ce * ulp_dtype_size(dt), use_pool);
	if (rc == 0) { /* the key is the digest of the stored blob's format (invariant 2) */
		if (version == 1)
			ulp_sha256(src, len, sha);
		else
			rc = ulp_content_digest(pool, src, len, sha);
		if (rc == 0 && memcmp(sha, x->rb.content, ULP_SHA256_LEN) != 0)
			rc = ulp_arch_err(a, -ULP_E_CHECKSUM, "%s: blob %.16s does not decode to its content", a->dir, hex);
	}
	if (rc == 0 && x->rb.has_ref) {
		rc = chunk_elems_of(a, x->rb.ref, &rce, NULL);
		if (rc == 0 && rce != ce) { /* chunks decode against the same chunk of the reference */
			free(ref);
			ref = NULL;
			x->rb.has_ref = 0;
			x->depth = 0;
		} else if (rc == 0) {
			rc = read_whole(a, x->rb.ref, ref, len, (size_t)rce * ulp_dtype_size(dt), use_pool);
		}
	}
	unsigned cl = 0;
	while (ce > 1u && (1u << cl) < ce)
		cl++;
	/* same format as before: a v1 content keeps its SHA-256 key (invariant 2) */
	ulp_enc_opts o = {.chunk_log2 = cl, .ref_sha256 = ref ? x->rb.ref : NULL, .src_sha256 = x->rb.content,
	                  .format_version = version};
	size_t cap = ulp_encode_bound(dt, len, &o);
	if (rc == 0 && !(x->blob = ulp_alloc_big(cap)))
		rc = -ULP_E_NOMEM;
	ulp_enc_stats st;
	int64_t n = 0;
	if (rc == 0 && (n = ulp_encode(&o, pool, dt, x->blob, cap, src, len, ref, ref ? len : 0, &st)) < 0)
		rc = ulp_arch_err(a, (int)n, "%s: re-coding blob %.16s failed: %s", a->dir, hex, ulp_strerror((int)n));
	if (rc == 0) {
		ulp_blob *b;
		char why[256] = "decoded blob differs from its content";
		rc = ulp_blob_open(x->blob, (size_t)n, &b, why, sizeof(why));
		if (rc == 0) {
			const ulp_blob_info *in = ulp_blob_get_info(b);
			int has_ref = in->has_ref;
			int64_t d = ulp_blob_decode(b, pool, check, len, has_ref ? ref : NULL, has_ref ? len : 0);
			/* a decode that could not run (no memory) is that error */
			rc = d < 0 && d != -ULP_E_CHECKSUM && d != -ULP_E_CORRUPT ? (int)d
			     : d == (int64_t)len && memcmp(check, src, len) == 0 && in->chunk_elems == ce &&
			       in->version == version && memcmp(in->content_sha256, x->rb.content, ULP_SHA256_LEN) == 0 ? 0 : -ULP_E_CHECKSUM;
			if (!has_ref) { /* the encoder found a standalone coding smaller */
				x->rb.has_ref = 0;
				x->depth = 0;
			}
			ulp_blob_close(b);
		}
		if (rc < 0)
			rc = ulp_arch_err(a, rc, "%s: re-coded blob %.16s failed its check before commit: %s", a->dir, hex, why);
	}
	if (rc == 0) {
		x->blob_len = (size_t)n;
		x->rb.codec = st.codec;
		x->keep = x->must || (uint64_t)n < x->rb.old.stored;
		/* the pack's per-blob digest here, in parallel: not at append */
		if (x->keep && ulp_content_digest(pool, x->blob, x->blob_len, x->blob_sha) < 0)
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory hashing re-coded blob %.16s", a->dir, hex);
	}
	if (rc < 0)
		snprintf(x->err, sizeof(x->err), "%s", ulp_archive_errmsg(a));
	if (rc < 0 || !x->keep) {
		free(x->blob);
		x->blob = NULL;
	}
	free(src);
	free(ref);
	free(check);
	x->rc = rc;
	return 0;
}

/*
 * A tensor over ULP_STREAM_MIN (ingest.c) is re-coded a window of chunks at
 * a time (senc.h): its content and reference are read chunk by chunk
 * through the cache (each chunk let go after use), the content's digest
 * leaves hashed on the first pass, the payloads spilled, and a kept blob
 * written straight to the pack; memory is a few chunks a thread, not the
 * tensor. Format v2 contents with chunks of whole leaves only (else the
 * whole-tensor path).
 */
typedef struct rsio {
	ulp_archive *a;
	const item *x;
	size_t cb;                /* bytes a chunk, of the content and of the reference */
	uint8_t *leaves;          /* the content's digest leaves */
	uint8_t *hashed;          /* a chunk's leaves are in (atomic) */
	int spill;
	uint8_t (*chain[2])[ULP_SHA256_LEN]; /* the content's and the reference's chains */
	size_t n_chain[2];
} rsio;

static int rs_chunks(rsio *r, int which, const uint8_t *sha, uint64_t off, size_t len, uint8_t *dst)
{
	while (len) {
		uint32_t k = (uint32_t)(off / r->cb);
		size_t in = (size_t)(off % r->cb), l = 0;
		ulp_centry *e;
		const uint8_t *d;
		ULP_TRY(ulp_read_chunk(r->a, sha, k, &e, &d, &l, NULL));
		if (in >= l) {
			ulp_cache_put(r->a->cache, e);
			return ulp_arch_err(r->a, -ULP_E_CORRUPT, "%s: chunks overrun their content", r->a->dir);
		}
		size_t n = ULP_MIN(len, l - in);
		memcpy(dst, d + in, n);
		ulp_cache_put(r->a->cache, e);
		ulp_chain_retire(r->a, (const uint8_t (*)[ULP_SHA256_LEN])r->chain[which], r->n_chain[which], k); /* not kept */
		dst += n;
		off += n;
		len -= n;
	}
	return 0;
}

static int rs_get(void *arg, uint64_t off, size_t len, uint8_t *src, uint8_t *ref)
{
	rsio *r = arg;
	ULP_TRY(rs_chunks(r, 0, r->x->rb.content, off, len, src));
	size_t k = (size_t)(off / r->cb);
	if (off % r->cb == 0 && !__atomic_exchange_n(&r->hashed[k], 1, __ATOMIC_ACQ_REL))
		ulp_digest_leaves(src, len, r->leaves + off / ULP_DIGEST_LEAF * ULP_SHA256_LEN);
	return ref ? rs_chunks(r, 1, r->x->rb.ref, off, len, ref) : 0;
}

static int rs_put(void *arg, uint64_t off, const void *p, size_t len)
{
	return ulp_spill_io(((rsio *)arg)->spill, off, (void *)p, len, 1);
}

static int rs_read(void *arg, uint64_t off, void *p, size_t len)
{
	return ulp_spill_io(((rsio *)arg)->spill, off, p, len, 0);
}

/* 1 if x is streamed: large, format v2, chunks of whole leaves */
static int streamable(ulp_archive *a, const item *x, uint32_t *ce)
{
	unsigned version = 0;
	if (x->len <= ulp_stream_min() || chunk_elems_of(a, x->rb.content, ce, &version) < 0)
		return 0;
	size_t cb = (size_t)*ce * ulp_dtype_size((ulp_dtype)x->dtype);
	uint32_t rce = 0;
	if (x->rb.has_ref && (chunk_elems_of(a, x->rb.ref, &rce, NULL) < 0 || rce != *ce))
		return 0; /* the whole path handles (and reports) it */
	return version >= 2 && cb > 0 && cb % ULP_DIGEST_LEAF == 0;
}

/* code_item for a streamed tensor; a kept blob goes into the pack (*w) */
static int code_stream(ulp_archive *a, item *x, uint32_t ce, ulp_pack_writer **w)
{
	size_t len = (size_t)x->len, cb = (size_t)ce * ulp_dtype_size((ulp_dtype)x->dtype);
	size_t nk = (len + cb - 1) / cb;
	rsio r = {a, x, cb, malloc(ULP_MAX(ulp_digest_n_leaves(len), 1) * ULP_SHA256_LEN), calloc(nk, 1),
	          ulp_spill_open(a), {malloc(2 * ULP_CHAIN_MAX * ULP_SHA256_LEN), NULL}, {0, 0}};
	if (r.chain[0]) {
		r.chain[1] = r.chain[0] + ULP_CHAIN_MAX;
		r.n_chain[0] = ulp_chain_of(a, x->rb.content, r.chain[0]);
		r.n_chain[1] = x->rb.has_ref ? ulp_chain_of(a, x->rb.ref, r.chain[1]) : 0;
	}
	char hex[65];
	ulp_sha256_hex(x->rb.content, hex);
	int rc = !r.leaves || !r.hashed || !r.chain[0] ? -ULP_E_NOMEM : 0;
	if (rc == 0 && r.spill < 0)
		rc = ulp_arch_err(a, -ULP_E_IO, "%s/packs: a spill file: %s", a->dir, strerror(errno));
	unsigned cl = 0;
	while (ce > 1u && (1u << cl) < ce)
		cl++;
	ulp_enc_opts o = {.chunk_log2 = cl, .ref_sha256 = x->rb.has_ref ? x->rb.ref : NULL,
	                  .src_sha256 = x->rb.content, .format_version = 2};
	ulp_senc_io io = {&r, rs_get, rs_put, rs_read};
	ulp_senc s = {0};
	uint8_t sha[ULP_SHA256_LEN];
	if (rc == 0 && (rc = ulp_encode_stream(&o, a->pool, (ulp_dtype)x->dtype, len, x->rb.has_ref, 0, &io, &s)) < 0)
		rc = rc == -ULP_E_CHECKSUM
		         ? ulp_arch_err(a, rc, "%s: re-coded blob %.16s failed its check before commit", a->dir, hex)
		         : ulp_arch_err(a, rc, "%s: re-coding blob %.16s failed: %s", a->dir, hex,
		                        rc == -ULP_E_IO ? ulp_archive_errmsg(a) : ulp_strerror(rc));
	if (rc == 0) { /* invariant 2: the content read is the content named */
		for (size_t k = 0; k < nk; k++)
			if (!r.hashed[k])
				rc = -ULP_E_CHECKSUM;
		ulp_digest_root(r.leaves, len, sha);
		if (rc < 0 || memcmp(sha, x->rb.content, ULP_SHA256_LEN) != 0)
			rc = ulp_arch_err(a, -ULP_E_CHECKSUM, "%s: blob %.16s does not decode to its content", a->dir, hex);
	}
	if (rc == 0) {
		x->rb.codec = s.codec;
		if (s.codec != ULP_CODEC_DELTA && s.codec != ULP_CODEC_ZSTD_XOR && s.codec != ULP_CODEC_IDENT) {
			x->rb.has_ref = 0; /* the encoder found a standalone coding smaller */
			x->depth = 0;
		}
		x->blob_len = (size_t)s.blob_len;
		x->keep = x->must || s.blob_len < x->rb.old.stored;
	}
	if (rc == 0 && x->keep) {
		if (!*w)
			rc = ulp_pack_writer_new(a, w);
		if (rc == 0)
			rc = ulp_pack_reserve(*w, x->blob_len, &x->rb.offset);
		if (rc == 0 && (rc = ulp_senc_to_pack(a->pool, *w, x->rb.offset, &s, &io, x->blob_sha)) < 0)
			rc = ulp_arch_err(a, rc, "%s: writing re-coded blob %.16s: %s", a->dir, hex, ulp_strerror(rc));
		x->prewritten = rc == 0;
	}
	if (rc < 0)
		snprintf(x->err, sizeof(x->err), "%s", ulp_archive_errmsg(a));
	ulp_senc_free(&s);
	free(r.leaves);
	free(r.hashed);
	free(r.chain[0]);
	if (r.spill >= 0)
		close(r.spill);
	x->rc = rc;
	return rc;
}

typedef struct batch {
	ulp_archive *a;
	item *it;
} batch;

static int code_job(void *arg, size_t i)
{
	batch *b = arg;
	return code_item(b->a, &b->it[i], 0);
}

static int cmp_sha(const void *x, const void *y)
{
	return memcmp(x, y, ULP_SHA256_LEN);
}

typedef struct purge_set {
	uint8_t (*sha)[ULP_SHA256_LEN];
	size_t n;
} purge_set;

static int drop_blob(void *arg, const ulp_ckey *key, void *data)
{
	(void)data;
	purge_set *s = arg;
	return key->kind == ULP_CK_BLOB && bsearch(key->sha, s->sha, s->n, ULP_SHA256_LEN, cmp_sha) != NULL;
}

/* Test hook: exits the process at a point of the commit (tests/unit/test_recode.c). */
int ulp_recode_crash_at;

static void crash_point(int at)
{
	if (ulp_recode_crash_at == at)
		_exit(99);
}

/* Codes the planned items, then commits those that are kept. */
static int run_items(ulp_archive *a, item *it, size_t n, ulp_progress_fn progress, void *parg,
                     ulp_rebase_result *res)
{
	ulp_pack_writer *w = NULL;
	int rc = 0, threads = ulp_pool_threads(a->pool);
	uint64_t total = 0, done = 0;
	for (size_t i = 0; i < n; i++)
		total += it[i].len;
	res->planned += n;
	if (progress)
		progress(parg, 0, total);
	for (size_t i0 = 0; rc == 0 && i0 < n;) {
		size_t i1 = i0;
		uint64_t bytes = 0, big = 0;
		/* a streamed tensor is a batch of its own */
		while (i1 < n && (i1 == i0 || (bytes + it[i1].len <= BATCH_BYTES && it[i1].len <= ulp_stream_min() &&
		                               it[i0].len <= ulp_stream_min()))) {
			bytes += it[i1].len;
			big = ULP_MAX(big, it[i1].len);
			i1++;
		}
		size_t nb = i1 - i0;
		uint32_t ce = 0;
		/* many items: one a thread; few (large) ones: each on the whole pool */
		if (nb == 1 && streamable(a, &it[i0], &ce)) {
			if (code_stream(a, &it[i0], ce, &w) < 0 && w && !it[i0].prewritten && it[i0].keep) {
				/* a reserved region left unwritten: the pack is not usable */
				rc = ulp_arch_err(a, it[i0].rc, "%s", it[i0].err);
			}
		} else if (nb >= (size_t)threads && threads > 1 && big <= bytes / 2) {
			batch b = {a, it + i0};
			ulp_pool_run(a->pool, nb, code_job, &b);
		} else {
			for (size_t i = i0; i < i1; i++)
				code_item(a, &it[i], 1);
		}
		for (size_t i = i0; rc == 0 && i < i1; i++) {
			item *x = &it[i];
			if (x->rc < 0) {
				if (x->must || x->rc == -ULP_E_NOMEM)
					rc = ulp_arch_err(a, x->rc, "%s", x->err);
				continue; /* a damaged blob is verify's to report, not a reason to stop */
			}
			if (!x->keep) {
				res->not_better++;
				continue;
			}
			if (x->prewritten) /* in the pack already, at its place in order */
				ulp_pack_reserved_digest(w, x->blob_len, x->blob_sha);
			else if (!w)
				rc = ulp_pack_writer_new(a, &w);
			if (rc == 0 && !x->prewritten)
				rc = ulp_pack_append_digest(w, x->blob, x->blob_len, x->blob_sha, &x->rb.offset);
			x->rb.stored = x->blob_len;
		}
		for (size_t i = i0; i < i1; i++) {
			free(it[i].blob);
			it[i].blob = NULL;
			done += it[i].len;
		}
		if (progress)
			progress(parg, done, total);
		i0 = i1;
	}
	if (rc < 0 || !w) {
		ulp_pack_discard(w);
		return rc;
	}
	/* the kept items, in order */
	ulp_rebased *rb = malloc(n * sizeof(*rb));
	size_t m = 0;
	if (!rb) {
		ulp_pack_discard(w);
		return -ULP_E_NOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (it[i].rc == 0 && it[i].keep)
			rb[m++] = it[i].rb;
	char name[80];
	size_t applied = 0;
	pthread_mutex_lock(&a->w->write_mu);
	int same = 0;
	rc = ulp_db_begin(a);
	if (rc == 0)
		rc = ulp_pack_commit(w, name); /* invariant 2: durable first */
	/* a pack of the same bytes that the index names already (a step
	 * re-coded back to a coding it had, whose pack is not reclaimed yet):
	 * its file is that pack's now, which a discard would remove, and the
	 * rows move into it (ulp_index_pack_add: same name, same offsets) */
	if (rc == 0 && (same = ulp_index_has_pack(a, name)) < 0)
		rc = same;
	crash_point(1);
	if (rc == 0)
		rc = ulp_index_rebase_apply(a, name, ulp_pack_size(w), rb, m);
	for (size_t i = 0; rc == 0 && i < m; i++)
		applied += rb[i].applied;
	crash_point(2);
	if (rc == 0 && applied)
		rc = ulp_db_commit(a);
	if (rc < 0 || !applied) {
		ulp_db_rollback(a);
		/* a pack the index names (same > 0) stays; so does one whose name
		 * the index could not be asked about (same < 0) if a file of that
		 * name was there before: it may be a live pack. A file the commit
		 * created is this run's alone (invariant 2). */
		if (same > 0 || (same < 0 && ulp_pack_replaced(w)))
			ulp_pack_free(w);
		else
			ulp_pack_discard(w);
	} else {
		ulp_pack_free(w);
	}
	pthread_mutex_unlock(&a->w->write_mu);
	crash_point(3);
	if (rc == 0 && applied) {
		purge_set s = {malloc(applied * ULP_SHA256_LEN), 0};
		for (size_t i = 0; i < m; i++) {
			if (!rb[i].applied)
				continue;
			res->recoded++;
			res->anchors += !rb[i].has_ref;
			res->raw_bytes += rb[i].old.raw;
			res->stored_before += rb[i].old.stored;
			res->stored_after += rb[i].stored;
			if (s.sha)
				memcpy(s.sha[s.n++], rb[i].content, ULP_SHA256_LEN);
		}
		if (s.sha) { /* invariant 4 */
			qsort(s.sha, s.n, ULP_SHA256_LEN, cmp_sha);
			ulp_cache_purge(a->cache, drop_blob, &s);
		}
		free(s.sha);
	}
	free(rb);
	return rc;
}

static int finish(ulp_archive *a, plan *P, ulp_progress_fn progress, void *parg, ulp_rebase_result *res)
{
	int rc = run_items(a, P->it, P->n, progress, parg, res);
	for (size_t i = 0; i < P->n; i++)
		free(P->it[i].blob);
	free(P->it);
	P->it = NULL;
	P->n = P->cap = 0;
	return rc;
}

static int check_rw(ulp_archive *a)
{
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	/* this thread's connection first (ulp_db_err: why it could not be opened) */
	if (!ulp_db(a))
		return ulp_db_err(a, "open");
	return 0;
}

/* ---- the primitive ------------------------------------------------------ */

typedef struct one {
	const char *tensor;
	ulp_rbtensor t;
	char *path, *series, *name;
	int found;
} one;

static int find_tensor(void *arg, const ulp_rbtensor *t)
{
	one *o = arg;
	if (o->found || strcmp(t->name, o->tensor) != 0)
		return 0;
	o->t = *t;
	o->path = strdup(t->path);
	o->series = strdup(t->series);
	o->name = strdup(t->name);
	o->found = o->path && o->series && o->name ? 1 : -1;
	return 0;
}

static int file_id(ulp_archive *a, const char *path, int64_t *id)
{
	ulp_stat st;
	ULP_TRY(ulp_archive_stat(a, path, &st));
	if (st.is_dir || st.is_symlink || st.kind == 0) /* safetensors or torch.save */
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: not a file of tensors", path);
	/* ids are what the queue and the tensor queries speak */
	return ulp_index_file_id(a, path, id);
}

int ulp_archive_rebase(ulp_archive *a, const char *path, const char *tensor, const char *ref_path,
                       ulp_rebase_result *res)
{
	ulp_rebase_result r = {0};
	double t0 = now_s();
	int64_t fid, rid = -1;
	char p[4096], rp[4096];
	ULP_TRY(check_rw(a));
	ULP_TRY(ulp_arch_path(a, path, p, sizeof(p)));
	if (ref_path)
		ULP_TRY(ulp_arch_path(a, ref_path, rp, sizeof(rp)));
	ULP_TRY(file_id(a, p, &fid));
	if (ref_path)
		ULP_TRY(file_id(a, rp, &rid));
	one o = {.tensor = tensor};
	int rc = ulp_index_file_tensors(a, fid, find_tensor, &o);
	if (rc == 0 && o.found < 0)
		rc = -ULP_E_NOMEM;
	if (rc == 0 && !o.found)
		rc = ulp_arch_err(a, -ULP_E_NOENT, "%s: no tensor %s in a series", p, tensor);
	plan P = {a, NULL, 0, 0};
	ulp_rbblob old;
	uint8_t ref[ULP_SHA256_LEN];
	if (rc == 0)
		rc = ulp_index_blob_ref(a, o.t.content, &old);
	if (rc == 0 && rid >= 0) {
		ulp_blobrow row;
		if (ulp_index_tensor(a, rid, tensor, o.t.dtype, o.t.length, ref, &row) < 0)
			rc = ulp_arch_err(a, -ULP_E_NOENT, "%s: no tensor %s of the same dtype and size", rp, tensor);
	}
	unsigned d = 0, h = 0;
	if (rc == 0)
		rc = ulp_index_height(a, o.t.content, 0, &h);
	if (rc == 0 && rid >= 0) {
		rc = walk(&P, ref, o.t.content, &d);
		if (rc == 1)
			rc = ulp_arch_err(a, -ULP_E_INVAL, "%s: %s needs %s's tensor %s: it cannot be its reference", rp,
			                  rp, p, tensor);
		else if (rc == 0 && d + 1 + h > a->max_chain)
			rc = ulp_arch_err(a, -ULP_E_INVAL, "%s: coding %s against it would make a chain of %u deltas"
			                  " (max_chain %u)", rp, tensor, d + 1 + h, a->max_chain);
	}
	if (rc == 0) {
		o.t.path = o.path;
		o.t.series = o.series;
		o.t.name = o.name;
		rc = add_item(&P, &o.t, &old, rid >= 0 ? ref : NULL, rid >= 0 ? d + 1 : 0, RB_MUST);
	}
	if (rc == 0)
		rc = finish(a, &P, NULL, NULL, &r);
	free(P.it);
	free(o.path);
	free(o.series);
	free(o.name);
	r.seconds = now_s() - t0;
	if (rc == 0 && res)
		*res = r;
	return rc;
}

/* ---- planners ------------------------------------------------------------- */

typedef struct tctx {
	plan *P;
	int mode;
	int64_t file, ref_file; /* RB_LAYOUT: the file planned, its target reference */
	uint64_t moves;         /* RB_LAYOUT: tensors planned or blocked off their target */
} tctx;

/* RB_LAYOUT: moves tensor t onto the reference the layout of its series
 * names (layout.c), or makes it an anchor; a move that would break
 * invariant 3 is left for later. */
static int plan_layout(plan *P, tctx *c, const ulp_rbtensor *t)
{
	ulp_archive *a = P->a;
	if (c->file != t->file) {
		c->file = t->file;
		ULP_TRY(ulp_layout_target(a, t->series, t->step, t->path, &c->ref_file, NULL, 0));
	}
	ulp_rbblob old;
	int rc = plannable(P, t, &old);
	if (rc <= 0)
		return rc;
	uint8_t ref[ULP_SHA256_LEN];
	ulp_blobrow row;
	int has = c->ref_file >= 0 &&
	          ulp_index_tensor(a, c->ref_file, t->name, t->dtype, t->length, ref, &row) == 0 &&
	          memcmp(ref, t->content, ULP_SHA256_LEN) != 0;
	if (!has && !old.has_ref)
		return 0; /* an anchor already */
	if (has && old.has_ref && memcmp(old.ref, ref, ULP_SHA256_LEN) == 0)
		return 0; /* on its target already */
	if (!has) {
		if (c->ref_file >= 0)
			return 0; /* no such tensor there: leave it */
		c->moves++;
		return add_item(P, t, &old, NULL, 0, RB_MUST);
	}
	unsigned h = 0, d = 0;
	ULP_TRY(ulp_index_height(a, t->content, 0, &h));
	rc = walk(P, ref, t->content, &d);
	ULP_TRY(rc);
	c->moves++; /* planned, or blocked until its reference moves */
	if (rc == 0 && d + 1 + h <= a->max_chain)
		return add_item(P, t, &old, ref, d + 1, RB_MUST);
	return 0;
}

static int plan_cb(void *arg, const ulp_rbtensor *t);

typedef struct idv {
	int64_t *id;
	size_t n, cap;
	char *series;
} idv;

static int collect_id(void *arg, int64_t id, int64_t step, const char *path)
{
	(void)step;
	(void)path;
	idv *v = arg;
	ULP_TRY(ulp_grow(&v->id, &v->cap, v->n, sizeof(*v->id)));
	v->id[v->n++] = id;
	return 0;
}

static int series_of(void *arg, const ulp_rbtensor *t)
{
	idv *v = arg;
	if (!v->series && t->series && !(v->series = strdup(t->series)))
		return -ULP_E_NOMEM;
	return 0;
}

/* RB_LAYOUT around one queued file: it, then outward on each side while the
 * files there move (a step that arrived out of order shifts the place of
 * those after it, layout.c), then the same files again, for moves that were
 * blocked until the reference they need had moved (walk: no cycle). */
static int plan_around(ulp_archive *a, tctx *c, int64_t file)
{
	idv v = {0};
	int rc = ulp_index_file_tensors(a, file, series_of, &v);
	if (rc == 0 && v.series)
		rc = ulp_index_series_steps(a, v.series, collect_id, &v);
	size_t q = 0;
	while (q < v.n && v.id[q] != file)
		q++;
	if (rc < 0 || q == v.n) { /* not in a series (any more): itself only */
		free(v.id);
		free(v.series);
		return rc < 0 ? rc : ulp_index_file_tensors(a, file, plan_cb, c);
	}
	size_t lo = q, hi = q;
	rc = ulp_index_file_tensors(a, file, plan_cb, c);
	while (rc == 0 && lo > 0) {
		uint64_t m = c->moves;
		rc = ulp_index_file_tensors(a, v.id[--lo], plan_cb, c);
		if (c->moves == m)
			break;
	}
	while (rc == 0 && hi + 1 < v.n) {
		uint64_t m = c->moves;
		rc = ulp_index_file_tensors(a, v.id[++hi], plan_cb, c);
		if (c->moves == m)
			break;
	}
	for (size_t i = lo; rc == 0 && i <= hi; i++)
		rc = ulp_index_file_tensors(a, v.id[i], plan_cb, c);
	/* segment 0's key is coded against its anchor, far from it (layout.c
	 * invariant 3): a new newest step moves it too, and a step that lands
	 * or leaves below it shifts which step is the key */
	ptrdiff_t key = ulp_layout_key(v.n, a->max_chain);
	for (ptrdiff_t i = key - 1; rc == 0 && key >= 0 && i <= key + 1; i++)
		if (i >= 0 && (size_t)i < v.n && ((size_t)i < lo || (size_t)i > hi))
			rc = ulp_index_file_tensors(a, v.id[i], plan_cb, c);
	free(v.id);
	free(v.series);
	return rc;
}

static int plan_cb(void *arg, const ulp_rbtensor *t)
{
	tctx *c = arg;
	if (c->mode == RB_LAYOUT)
		return plan_layout(c->P, c, t);
	return plan_tensor(c->P, t, c->mode);
}

int ulp_archive_rebase_orphans(ulp_archive *a, ulp_progress_fn progress, void *arg, ulp_rebase_result *res)
{
	ulp_rebase_result r = {0};
	double t0 = now_s();
	ULP_TRY(check_rw(a));
	plan P = {a, NULL, 0, 0};
	tctx c = {&P, RB_MUST, -1, -1, 0};
	/* in step order, so that each kept step is coded against the nearest
	 * kept one before it, as an import of the kept steps alone would */
	int rc = ulp_index_orphan_deps(a, plan_cb, &c);
	if (rc == 0)
		rc = finish(a, &P, progress, arg, &r);
	free(P.it);
	r.seconds = now_s() - t0;
	if (rc == 0 && res)
		*res = r;
	return rc;
}

int ulp_recode_fail_nospc;

int ulp_archive_rebase_pending(ulp_archive *a, ulp_progress_fn progress, void *arg, ulp_rebase_result *res)
{
	ulp_rebase_result r = {0};
	double t0 = now_s();
	int64_t ids[PENDING_BATCH], gens[PENDING_BATCH];
	size_t n;
	int rc;
	ULP_TRY(check_rw(a));
	if (__atomic_load_n(&ulp_recode_fail_nospc, __ATOMIC_RELAXED) > 0 &&
	    __atomic_sub_fetch(&ulp_recode_fail_nospc, 1, __ATOMIC_RELAXED) >= 0)
		return ulp_arch_err(a, -ULP_E_NOSPC, "%s/packs: re-basing: no space left on device (test hook)", a->dir);
	while ((rc = ulp_index_pending(a, ids, gens, PENDING_BATCH, &n)) == 0 && n > 0) {
		plan P = {a, NULL, 0, 0};
		tctx c = {&P, RB_LAYOUT, -1, -1, 0};
		/* each queued file, then its neighbours, whose place in the layout
		 * of their series it may have changed (layout.c invariant 3: a new
		 * newest step moves the previous newest off its anchor) */
		for (size_t i = 0; rc == 0 && i < n; i++)
			rc = plan_around(a, &c, ids[i]);
		if (rc == 0)
			rc = finish(a, &P, progress, arg, &r);
		free(P.it);
		if (rc == 0) {
			pthread_mutex_lock(&a->w->write_mu);
			rc = ulp_db_begin(a);
			if (rc == 0)
				rc = ulp_index_pending_done(a, ids, gens, n);
			if (rc == 0)
				rc = ulp_db_commit(a);
			if (rc < 0)
				ulp_db_rollback(a);
			pthread_mutex_unlock(&a->w->write_mu);
		}
		if (rc < 0)
			break;
	}
	r.seconds = now_s() - t0;
	if (rc == 0 && res)
		*res = r;
	return rc;
}

/* ---- retention ------------------------------------------------------------- */

typedef struct stepv {
	int64_t *step;
	uint64_t *files;
	size_t n, cap, cap2;
} stepv;

static int collect_step(void *arg, int64_t step, uint64_t files)
{
	stepv *v = arg;
	ULP_TRY(ulp_grow(&v->step, &v->cap, v->n, sizeof(*v->step)));
	ULP_TRY(ulp_grow(&v->files, &v->cap2, v->n, sizeof(*v->files)));
	v->step[v->n] = step;
	v->files[v->n++] = files;
	return 0;
}

int64_t ulp_archive_forget(ulp_archive *a, const char *run, const ulp_forget_opts *o,
                           int (*cb)(void *arg, int64_t step, uint64_t files, int kept), void *arg)
{
	char p[4096];
	ulp_stat st;
	if (!o || (o->keep_last <= 0 && o->keep_every <= 0 && o->n_keep == 0))
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: no rule says which steps to keep (refusing to forget them all)",
		                    run);
	if (o->keep_last < 0 || o->keep_every < 0)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: --keep-last and --keep-every take a positive number", run);
	if (ulp_path_clean(run, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: not a run of the archive (a directory under its root)", run);
	if (!o->dry_run)
		ULP_TRY(check_rw(a));
	ULP_TRY(ulp_archive_stat(a, p, &st));
	if (!st.is_dir)
		return ulp_arch_err(a, -ULP_E_NOTDIR, "%s: not a directory", p);
	stepv v = {0};
	int64_t *gone = NULL;
	size_t ng = 0;
	int rc = ulp_index_run_steps(a, p, collect_step, &v);
	if (rc == 0 && v.n && !(gone = malloc(v.n * sizeof(*gone))))
		rc = -ULP_E_NOMEM;
	for (size_t i = 0; rc == 0 && i < v.n; i++) {
		int64_t s = v.step[i];
		int kept = (o->keep_last > 0 && (int64_t)(v.n - i) <= o->keep_last) ||
		           (o->keep_every > 0 && s % o->keep_every == 0);
		for (size_t k = 0; !kept && k < o->n_keep; k++)
			kept = o->keep[k] == s;
		if (!kept)
			gone[ng++] = s;
		if (cb)
			rc = cb(arg, s, v.files[i], kept);
	}
	if (rc == 0 && ng && !o->dry_run) {
		pthread_mutex_lock(&a->w->write_mu);
		rc = ulp_db_begin(a);
		if (rc == 0)
			rc = ulp_index_forget_steps(a, p, gone, ng);
		if (rc == 0)
			rc = ulp_db_commit(a);
		if (rc < 0)
			ulp_db_rollback(a);
		pthread_mutex_unlock(&a->w->write_mu);
	}
	free(v.step);
	free(v.files);
	free(gone);
	return rc < 0 ? rc : (int64_t)ng;
}
