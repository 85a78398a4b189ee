/* SPDX-License-Identifier: MIT */
/*
 * blob.c - the blob container of ulpack-format(5) sections 2-3: choosing the
 * codec of a tensor, writing the blob, and parsing and decoding one as
 * hostile input.
 *
 * Invariants:
 *  1. A blob's bytes depend only on (options, dtype, content, reference):
 *     chunks are coded independently and assembled in order, whatever the
 *     pool runs in parallel.
 *  2. ulp_blob_open() accepts a blob only if the header check matches, every
 *     field is in range, the directory accounts for every byte to the end of
 *     the blob, and the tables parse; decoding then never touches memory
 *     outside the blob, the reference or dst.
 *  3. Every decoded chunk is compared with its XXH3-64 checksum before it is
 *     reported as decoded.
 *  4. Format v2's content digest (ulpack-format(5) 2.4) is hashed leaf by
 *     leaf by the threads that check or decode the chunks holding the
 *     leaves; only the root (32 bytes a MiB) is hashed serially.
 */
#include "codec.h"
#include "senc.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <zstd.h>

/* Fuzzing builds (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, set by the fuzz
 * targets' flags only) accept blobs whose checks fail, so that mutated inputs
 * reach the parsers and decoders behind them (as zstd does with its
 * checksums): the header check, the chunk checksums and the identical-blob
 * sha256 pair. Every bounds and range check stays; the normal build and the
 * corpus replay of make check keep every check. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define ULP_FUZZING 1
#else
#define ULP_FUZZING 0
#endif

#define BLOB_MAGIC "ULPb"
#define BLOB_VERSION ULP_BLOB_VERSION /* written by default; 1 and 2 are read */
#define CHUNK_LOG2_MIN 10
#define CHUNK_LOG2_MAX 24

const char *ulp_codec_name(int codec)
{
	static const char *const names[ULP_CODEC__COUNT] = {"raw", "ident", "zstd", "zstd-xor",
	                                                    "delta", "anchor"};
	return codec >= 0 && codec < ULP_CODEC__COUNT ? names[codec] : "unknown";
}

int ulp_codec_uses_ref(int codec)
{
	return codec == ULP_CODEC_IDENT || codec == ULP_CODEC_ZSTD_XOR || codec == ULP_CODEC_DELTA;
}

static int codec_is_rans(int codec)
{
	return codec == ULP_CODEC_DELTA || codec == ULP_CODEC_ANCHOR;
}

/* ---- varints (LEB128, at most 10 bytes, canonical) ----------------------- */

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	do {
		uint8_t b = v & 0x7f;
		v >>= 7;
		if (p)
			p[n] = b | (v ? 0x80 : 0);
		n++;
	} while (v);
	return n;
}

static int get_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out)
{
	uint64_t v = 0;
	const uint8_t *p = *pp;
	for (unsigned i = 0; i < 10; i++) {
		if (p >= end)
			return -1;
		uint8_t b = *p++;
		if (i == 9 && b > 1)
			return -1;
		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			if (b == 0 && i > 0)
				return -1; /* not canonical */
			*pp = p;
			*out = v;
			return 0;
		}
	}
	return -1;
}

/* ---- shared geometry ----------------------------------------------------- */

static uint64_t n_chunks_for(uint64_t n, unsigned chunk_log2)
{
	return n == 0 ? 0 : ((n - 1) >> chunk_log2) + 1;
}

static unsigned lanes_log2_for(uint64_t chunk_n)
{
	return chunk_n >= 16384 ? 5 : chunk_n >= 4096 ? 3 : chunk_n >= 512 ? 2 : 0;
}

/* ---- encoder --------------------------------------------------------------- */

typedef struct enc_chunk {
	uint8_t *buf;       /* payload (owned by the candidate's arena) */
	size_t rans_len;    /* rANS codecs: bytes of the rANS part */
	uint64_t raw_bits;  /* rANS codecs: bits of the raw tail */
	size_t len;         /* payload bytes */
} enc_chunk;

typedef struct cand {
	int codec;
	unsigned lanes_log2, prob_bits;
	uint8_t *table;     /* serialized table (rANS codecs) */
	size_t table_len;
	enc_chunk *ch;      /* n_chunks */
	uint8_t *arena;     /* rANS codecs: a scratch slot of the encoding thread,
	                       or malloc'd when arena_owned */
	int arena_owned;
	size_t size;        /* whole blob size */
} cand;

typedef struct enc {
	const ulp_enc_opts *o;
	ulp_dtype dt;
	ulp_fmt f;
	unsigned esize, chunk_log2, zlevel;
	const uint8_t *src, *ref;
	size_t n;           /* elements */
	size_t n_chunks;
	uint64_t *sum;      /* per chunk XXH3 of the source bytes */
	uint8_t sha[32], ref_sha[32];
	unsigned version;   /* format written: 1 or 2 */
	uint8_t *leaves;    /* v2 without src_sha256: the content digest's leaves */
	int leaf_in_chunk;  /* chunks hold whole leaves: job_checksum hashes them */
	/* pass-1 state */
	uint8_t *syms;      /* scratch, or malloc'd when syms_owned */
	int syms_owned;
	uint64_t *counts;   /* n_chunks x (n_ctx x alphabet) for the current model */
	unsigned n_ctx, alphabet;
	int anchor;
	/* pass-2 state */
	const ulp_table *t;
	const ulp_rans_esym *es;
	const uint64_t *es64;   /* packed for the SIMD encoder, or NULL */
	cand *c;
} enc;

static void chunk_span(const enc *e, size_t k, size_t *first, size_t *count)
{
	size_t c = (size_t)1 << e->chunk_log2;
	*first = k * c;
	*count = ULP_MIN(c, e->n - k * c);
}

static void cand_free(cand *c)
{
	if (!c)
		return;
	free(c->table);
	free(c->ch);
	if (c->arena_owned)
		free(c->arena);
	memset(c, 0, sizeof(*c));
}

/* ulpack-format(5) 3.3: a chunk's check is XXH3-64 of its decoded bytes
 * XOR XXH3-64 of its payload bytes seeded with ULP_PAYLOAD_SEED, so damage
 * anywhere in the payload is detected even where it would not change the
 * decoded bytes. */
#define ULP_PAYLOAD_SEED 0x554c50616b636b21ull
static uint64_t payload_hash(const uint8_t *p, size_t len)
{
	return ulp_xxh64_seed(p, len, ULP_PAYLOAD_SEED);
}

/* Header bytes before the payloads, for candidate c (dst NULL: count only);
 * phash: the payloads' hashes (payload_hash), one a chunk. */
static size_t write_header(const enc *e, const cand *c, const uint64_t *phash, uint8_t *dst)
{
	uint8_t tmp[16];
	size_t o = 0;
#define PUT(ptr, len) do { if (dst) memcpy(dst + o, (ptr), (len)); o += (len); } while (0)
	PUT(BLOB_MAGIC, 4);
	tmp[0] = (uint8_t)e->version;
	tmp[1] = (uint8_t)c->codec;
	tmp[2] = (uint8_t)e->dt;
	tmp[3] = (uint8_t)e->chunk_log2;
	PUT(tmp, 4);
	o += put_varint(dst ? dst + o : NULL, e->n);
	PUT(e->sha, 32);
	if (ulp_codec_uses_ref(c->codec))
		PUT(e->ref_sha, 32);
	if (codec_is_rans(c->codec)) {
		tmp[0] = (uint8_t)c->lanes_log2;
		tmp[1] = (uint8_t)c->prob_bits;
		PUT(tmp, 2);
		o += put_varint(dst ? dst + o : NULL, c->table_len);
		PUT(c->table, c->table_len);
	}
	if (c->codec != ULP_CODEC_IDENT) {
		for (size_t k = 0; k < e->n_chunks; k++) {
			if (codec_is_rans(c->codec)) {
				o += put_varint(dst ? dst + o : NULL, c->ch[k].rans_len);
				o += put_varint(dst ? dst + o : NULL, c->ch[k].raw_bits);
			} else if (c->codec != ULP_CODEC_RAW) {
				o += put_varint(dst ? dst + o : NULL, c->ch[k].len);
			}
			if (dst)
				ulp_st64(tmp, e->sum[k] ^ phash[k]);
			PUT(tmp, 8);
		}
	}
	if (dst)
		ulp_st32(dst + o, (uint32_t)ulp_xxh64(dst, o));
	o += 4;
#undef PUT
	return o;
}

static void cand_size(const enc *e, cand *c)
{
	size_t s = write_header(e, c, NULL, NULL);
	if (c->codec != ULP_CODEC_IDENT)
		for (size_t k = 0; k < e->n_chunks; k++)
			s += c->ch[k].len;
	c->size = s;
}

static int job_checksum(void *arg, size_t k)
{
	enc *e = arg;
	size_t first, count;
	chunk_span(e, k, &first, &count);
	e->sum[k] = ulp_xxh64(e->src + first * e->esize, count * e->esize);
	if (e->leaves && e->leaf_in_chunk) /* invariant 4 */
		ulp_digest_leaves(e->src + first * e->esize, count * e->esize,
		                  e->leaves + first * e->esize / ULP_DIGEST_LEAF * ULP_SHA256_LEN);
	return 0;
}

/* chunks smaller than a leaf: the leaves are jobs of their own */
static int job_leaf(void *arg, size_t k)
{
	enc *e = arg;
	size_t bytes = e->n * e->esize, first = k * ULP_DIGEST_LEAF;
	ulp_digest_leaves(e->src + first, ULP_MIN(ULP_DIGEST_LEAF, bytes - first),
	                  e->leaves + k * ULP_SHA256_LEN);
	return 0;
}

/* Each chunk of a rANS candidate owns a region of its arena: the rANS part
 * from the start, the raw tail (written by pass 1) after the rANS bound. */
static size_t region_size(const enc *e)
{
	size_t c = ULP_MIN(e->n, (size_t)1 << e->chunk_log2);
	return (ulp_chunk_rans_bound(c, ULP_LANES_MAX) + ulp_chunk_raw_bound(&e->f, c) + 1) & ~(size_t)1;
}

static int job_symbols(void *arg, size_t k)
{
	enc *e = arg;
	cand *c = e->c;
	size_t first, count;
	chunk_span(e, k, &first, &count);
	uint64_t *cnt = e->counts + k * (size_t)e->n_ctx * e->alphabet;
	uint8_t *region = c->arena + k * region_size(e);
	size_t rb = ulp_chunk_rans_bound(count, 1u << c->lanes_log2);
	ulp_pass1(&e->f, e->anchor, e->src + first * e->esize,
	          e->anchor ? NULL : e->ref + first * e->esize, count, e->syms + first, cnt,
	          region + rb, ulp_chunk_raw_bound(&e->f, count), &c->ch[k].raw_bits);
	return 0;
}

static int job_rans(void *arg, size_t k)
{
	enc *e = arg;
	cand *c = e->c;
	size_t first, count;
	chunk_span(e, k, &first, &count);
	unsigned lanes = 1u << c->lanes_log2;
	size_t rb = ulp_chunk_rans_bound(count, lanes), rans_len;
	uint8_t *buf = c->arena + k * region_size(e);
	int rc = ulp_chunk_encode(&e->f, e->t, e->es, e->es64, lanes, e->syms + first,
	                          e->anchor ? NULL : e->ref + first * e->esize, count, buf, rb,
	                          &rans_len);
	if (rc == 0) {
		size_t raw_len = (size_t)((c->ch[k].raw_bits + 7) / 8);
		memmove(buf + rans_len, buf + rb, raw_len);
		c->ch[k].buf = buf;
		c->ch[k].rans_len = rans_len;
		c->ch[k].len = rans_len + raw_len;
	}
	return rc;
}

/* One zstd context per thread, reused: creating one per call costs more
 * than compressing a small tensor. Freed when the thread exits. */
static pthread_key_t zkey_c, zkey_d;
static pthread_once_t zonce = PTHREAD_ONCE_INIT;

static void zfree_c(void *p)
{
	ZSTD_freeCCtx(p);
}

static void zfree_d(void *p)
{
	ZSTD_freeDCtx(p);
}

static void zinit(void)
{
	pthread_key_create(&zkey_c, zfree_c);
	pthread_key_create(&zkey_d, zfree_d);
}

static ZSTD_CCtx *tls_cctx(void)
{
	pthread_once(&zonce, zinit);
	ZSTD_CCtx *c = pthread_getspecific(zkey_c);
	if (!c && (c = ZSTD_createCCtx()))
		pthread_setspecific(zkey_c, c);
	return c;
}

static ZSTD_DCtx *tls_dctx(void)
{
	pthread_once(&zonce, zinit);
	ZSTD_DCtx *d = pthread_getspecific(zkey_d);
	if (!d && (d = ZSTD_createDCtx()))
		pthread_setspecific(zkey_d, d);
	return d;
}

static int job_zstd(void *arg, size_t k)
{
	enc *e = arg;
	cand *c = e->c;
	size_t first, count;
	chunk_span(e, k, &first, &count);
	size_t bytes = count * e->esize;
	size_t cap = ZSTD_compressBound(bytes);
	uint8_t *tmp = malloc(bytes);
	uint8_t *grp = malloc(bytes);
	uint8_t *out = malloc(cap);
	int rc = -ULP_E_NOMEM;
	if (!tmp || !grp || !out)
		goto done;
	const uint8_t *s = e->src + first * e->esize;
	if (c->codec == ULP_CODEC_ZSTD_XOR) {
		const uint8_t *r = e->ref + first * e->esize;
		for (size_t i = 0; i < bytes; i++)
			tmp[i] = s[i] ^ r[i];
		s = tmp;
	}
	ulp_byte_group(grp, s, count, e->esize);
	ZSTD_CCtx *cc = tls_cctx();
	size_t z = cc ? ZSTD_compressCCtx(cc, out, cap, grp, bytes, (int)e->zlevel)
	              : ZSTD_compress(out, cap, grp, bytes, (int)e->zlevel);
	if (ZSTD_isError(z)) {
		rc = -ULP_E_NOMEM;
		goto done;
	}
	c->ch[k] = (enc_chunk){out, 0, 0, z};
	out = NULL;
	rc = 0;
done:
	free(tmp);
	free(grp);
	free(out);
	return rc;
}

static int cand_alloc_chunks(const enc *e, cand *c)
{
	c->ch = calloc(e->n_chunks ? e->n_chunks : 1, sizeof(enc_chunk));
	return c->ch ? 0 : -ULP_E_NOMEM;
}

/* zstd candidates own one malloc per chunk, freed here */
static void cand_free_zstd(const enc *e, cand *c)
{
	if (c->ch && (c->codec == ULP_CODEC_ZSTD || c->codec == ULP_CODEC_ZSTD_XOR))
		for (size_t k = 0; k < e->n_chunks; k++)
			free(c->ch[k].buf);
	cand_free(c);
}

/* Builds the rANS candidate (DELTA when anchor == 0) into c; *bound_bits gets
 * the model bound (entropy of the symbols given the context plus raw bits). */
static int make_rans(enc *e, ulp_pool *pool, int anchor, cand *c, double *bound_bits)
{
	int rc;
	ulp_table t = {0};
	ulp_rans_esym *es = NULL;
	uint64_t *merged = NULL, cost_bits = 0;
	memset(c, 0, sizeof(*c));
	c->codec = anchor ? ULP_CODEC_ANCHOR : ULP_CODEC_DELTA;
	e->anchor = anchor;
	e->n_ctx = anchor ? 1 : e->f.n_ctx;
	e->alphabet = anchor ? 1u << e->f.a_bits : e->f.alphabet;
	size_t cells = (size_t)e->n_ctx * e->alphabet;
	/* one count table a chunk, merged in chunk order; a single chunk counts
	 * straight into the merged table */
	merged = calloc(cells, sizeof(uint64_t));
	e->counts = e->n_chunks > 1 ? calloc(cells * e->n_chunks, sizeof(uint64_t)) : merged;
	c->lanes_log2 = lanes_log2_for(ULP_MIN(e->n, (size_t)1 << e->chunk_log2));
	/* DELTA and ANCHOR candidates may both be alive: one slot each */
	c->arena = ulp_scratch_or_malloc(anchor ? ULP_SCRATCH_ARENA1 : ULP_SCRATCH_ARENA0,
	                                 e->n_chunks * region_size(e) + 16, &c->arena_owned);
	rc = -ULP_E_NOMEM;
	if (!e->counts || !merged || !c->arena || cand_alloc_chunks(e, c) < 0)
		goto out;
	e->c = c;
	rc = ulp_pool_run(pool, e->n_chunks, job_symbols, e);
	if (rc < 0)
		goto out;
	for (size_t k = 0; e->counts != merged && k < e->n_chunks; k++)
		for (size_t i = 0; i < cells; i++)
			merged[i] += e->counts[k * cells + i];
	if (bound_bits)
		*bound_bits = ulp_counts_entropy_bits(merged, e->n_ctx, e->alphabet) +
		              (double)(anchor ? (uint64_t)e->n * (e->f.w - e->f.a_bits)
		                              : ulp_delta_raw_bits(&e->f, merged));
	rc = ulp_table_choose(merged, e->n_ctx, e->alphabet, &t, &cost_bits);
	if (rc < 0)
		goto out;
	rc = ulp_table_esyms(&t, &es);
	if (rc < 0)
		goto out;
	c->prob_bits = t.prob_bits;
	c->table = malloc(ulp_table_bound(&t));
	rc = -ULP_E_NOMEM;
	if (!c->table)
		goto out;
	int64_t tl = ulp_table_write(&t, c->table, ulp_table_bound(&t));
	if (tl < 0) {
		rc = (int)tl;
		goto out;
	}
	c->table_len = (size_t)tl;
	e->t = &t;
	e->es = es;
	uint64_t *es64 = ulp_esyms_pack(&t, es);
	e->es64 = es64;
	rc = ulp_pool_run(pool, e->n_chunks, job_rans, e);
	free(es64);
	e->es64 = NULL;
	if (rc < 0)
		goto out;
	cand_size(e, c);
out:
	if (rc < 0)
		cand_free(c);
	ulp_table_free(&t);
	free(es);
	if (e->counts != merged)
		free(e->counts);
	free(merged);
	e->counts = NULL;
	return rc;
}

static int make_zstd(enc *e, ulp_pool *pool, int codec, cand *c)
{
	memset(c, 0, sizeof(*c));
	c->codec = codec;
	ULP_TRY(cand_alloc_chunks(e, c));
	e->c = c;
	int rc = ulp_pool_run(pool, e->n_chunks, job_zstd, e);
	if (rc < 0) {
		cand_free_zstd(e, c);
		return rc;
	}
	cand_size(e, c);
	return 0;
}

static int make_raw(enc *e, cand *c)
{
	memset(c, 0, sizeof(*c));
	c->codec = ULP_CODEC_RAW;
	ULP_TRY(cand_alloc_chunks(e, c));
	for (size_t k = 0; k < e->n_chunks; k++) {
		size_t first, count;
		chunk_span(e, k, &first, &count);
		c->ch[k] = (enc_chunk){(uint8_t *)e->src + first * e->esize, 0, 0, count * e->esize};
	}
	cand_size(e, c);
	return 0;
}

/* Keeps the smaller of *best and *other in *best and frees the other. */
static void keep_smaller(const enc *e, cand *best, cand *other)
{
	if (other->size < best->size) {
		cand_free_zstd(e, best);
		*best = *other;
	} else {
		cand_free_zstd(e, other);
	}
	memset(other, 0, sizeof(*other));
}

/* Builds exactly the requested codec (ulp_enc_opts.force_codec). */
static int force(enc *e, ulp_pool *pool, int codec, int is_float, cand *c, double *bound)
{
	const int has_ref = e->ref != NULL;
	switch (codec) {
	case ULP_CODEC_RAW:
		return make_raw(e, c);
	case ULP_CODEC_IDENT:
		if (!has_ref || memcmp(e->src, e->ref, e->n * e->esize) != 0)
			return -ULP_E_INVAL;
		memset(c, 0, sizeof(*c));
		c->codec = ULP_CODEC_IDENT;
		cand_size(e, c);
		return 0;
	case ULP_CODEC_ZSTD:
	case ULP_CODEC_ZSTD_XOR:
		if (codec == ULP_CODEC_ZSTD_XOR && !has_ref)
			return -ULP_E_INVAL;
		return make_zstd(e, pool, codec, c);
	case ULP_CODEC_DELTA:
	case ULP_CODEC_ANCHOR:
		if (!is_float || (codec == ULP_CODEC_DELTA && !has_ref))
			return -ULP_E_INVAL;
		e->syms = ulp_scratch_or_malloc(ULP_SCRATCH_SYMS, e->n ? e->n : 1, &e->syms_owned);
		if (!e->syms)
			return -ULP_E_NOMEM;
		return make_rans(e, pool, codec == ULP_CODEC_ANCHOR, c, bound);
	default:
		return -ULP_E_INVAL;
	}
}

size_t ulp_encode_bound(ulp_dtype dt, size_t src_len, const ulp_enc_opts *o)
{
	unsigned cl = o && o->chunk_log2 ? o->chunk_log2 : ULP_DEFAULT_CHUNK_LOG2;
	if (cl < CHUNK_LOG2_MIN)
		cl = CHUNK_LOG2_MIN;
	size_t n = src_len / ulp_dtype_size(dt) + 1;
	size_t chunks = (size_t)n_chunks_for(n, cl);
	/* RAW is always a candidate: header + directory (at most 28 bytes a chunk) + bytes */
	size_t bound = src_len + 4 + 4 + 10 + 64 + 4 + 28 * chunks + 16;
	ulp_fmt f;
	if (o && o->force_codec && ulp_fmt_get(dt, &f) == 0) {
		/* a forced rANS codec: states, one word an element, raw tail, tables */
		size_t rows = ULP_MIN((size_t)f.n_ctx, n);
		size_t table = rows * (3 + (size_t)f.alphabet * 37 / 8) + (size_t)f.n_ctx * 4 + 64;
		bound += src_len * 2 + n * 2 + chunks * (4 * ULP_LANES_MAX + 16) + table;
	} else if (o && o->force_codec) {
		bound += src_len / 8 + 64 * chunks + 64; /* zstd's worst case */
	}
	return bound;
}

/* The blob assembled in dst: payloads copied and hashed chunk by chunk on
 * the pool, then the header that holds their hashes (no serial pass over
 * the payloads). */
typedef struct asm_job {
	const enc *e;
	const cand *c;
	uint8_t *dst;
	size_t *off;        /* payload offsets in dst */
	uint64_t *phash;
} asm_job;

static int job_assemble(void *arg, size_t k)
{
	asm_job *j = arg;
	const enc_chunk *ch = &j->c->ch[k];
	memcpy(j->dst + j->off[k], ch->buf, ch->len);
	j->phash[k] = payload_hash(ch->buf, ch->len);
	return 0;
}

static int64_t assemble(const enc *e, const cand *c, ulp_pool *pool, uint8_t *dst, size_t cap)
{
	if (c->size > cap)
		return -ULP_E_OVERFLOW;
	if (c->codec == ULP_CODEC_IDENT)
		return (int64_t)write_header(e, c, NULL, dst);
	size_t n = e->n_chunks ? e->n_chunks : 1;
	size_t *off = malloc(n * sizeof(size_t));
	uint64_t *phash = malloc(n * sizeof(uint64_t));
	if (!off || !phash) {
		free(off);
		free(phash);
		return -ULP_E_NOMEM;
	}
	size_t o = write_header(e, c, NULL, NULL);
	for (size_t k = 0; k < e->n_chunks; k++) {
		off[k] = o;
		o += c->ch[k].len;
	}
	asm_job j = {e, c, dst, off, phash};
	ulp_pool_run(pool, e->n_chunks, job_assemble, &j);
	write_header(e, c, phash, dst);
	free(off);
	free(phash);
	return (int64_t)o;
}

int64_t ulp_encode(const ulp_enc_opts *opts, ulp_pool *pool, ulp_dtype dt, void *dst,
                   size_t dst_cap, const void *src, size_t src_len, const void *ref,
                   size_t ref_len, ulp_enc_stats *stats)
{
	static const ulp_enc_opts defaults = {0};
	const ulp_enc_opts *o = opts ? opts : &defaults;
	enc e = {0};
	cand best = {0}, other = {0};
	double bound = 0;
	int64_t rc;
	if ((unsigned)dt >= ULP_DT__COUNT || (!src && src_len))
		return -ULP_E_INVAL;
	e.o = o;
	e.dt = dt;
	e.esize = ulp_dtype_size(dt);
	e.chunk_log2 = o->chunk_log2 ? o->chunk_log2 : ULP_DEFAULT_CHUNK_LOG2;
	e.zlevel = o->zstd_level ? (unsigned)o->zstd_level : 3;
	if (e.chunk_log2 < CHUNK_LOG2_MIN || e.chunk_log2 > CHUNK_LOG2_MAX)
		return -ULP_E_INVAL;
	if (src_len % e.esize || (ref && ref_len != src_len))
		return -ULP_E_INVAL;
	e.src = src;
	e.ref = ref;
	e.n = src_len / e.esize;
	e.n_chunks = n_chunks_for(e.n, e.chunk_log2);
	int is_float = ulp_fmt_get(dt, &e.f) == 0;
	e.version = o->format_version ? o->format_version : BLOB_VERSION;
	if (e.version < 1 || e.version > BLOB_VERSION)
		return -ULP_E_INVAL;
	if (o->src_sha256)
		memcpy(e.sha, o->src_sha256, 32);
	else if (e.version == 1)
		ulp_sha256(src, src_len, e.sha);
	if (ref && o->ref_sha256)
		memcpy(e.ref_sha, o->ref_sha256, 32);
	else if (ref && e.version == 1)
		ulp_sha256(ref, ref_len, e.ref_sha);
	else if (ref && ulp_content_digest(pool, ref, ref_len, e.ref_sha) < 0)
		return -ULP_E_NOMEM;
	e.sum = calloc(e.n_chunks ? e.n_chunks : 1, sizeof(uint64_t));
	if (!e.sum)
		return -ULP_E_NOMEM;
	if (e.version >= 2 && !o->src_sha256) {
		e.leaves = malloc(ULP_MAX(ulp_digest_n_leaves(src_len), 1) * ULP_SHA256_LEN);
		if (!e.leaves) {
			free(e.sum);
			return -ULP_E_NOMEM;
		}
		e.leaf_in_chunk = ((size_t)e.esize << e.chunk_log2) % ULP_DIGEST_LEAF == 0;
	}
	ulp_pool_run(pool, e.n_chunks, job_checksum, &e);
	if (e.leaves) {
		if (!e.leaf_in_chunk)
			ulp_pool_run(pool, ulp_digest_n_leaves(src_len), job_leaf, &e);
		ulp_digest_root(e.leaves, src_len, e.sha);
		free(e.leaves);
		e.leaves = NULL;
	}

	if (o->force_codec) {
		rc = force(&e, pool, o->force_codec - 1, is_float, &best, stats ? &bound : NULL);
		if (rc < 0)
			goto out;
		goto write;
	}
	/* v1 checks that an identical-to-reference blob names its reference's
	 * identity (ulp_blob_open): a v1 content identical to a v2 reference
	 * (re-coded against a newer step, recode.c) is coded as a delta */
	if (ref && memcmp(src, ref, src_len) == 0 &&
	    (e.version != 1 || !o->ref_sha256 || !o->src_sha256 || memcmp(o->ref_sha256, o->src_sha256, 32) == 0)) {
		best.codec = ULP_CODEC_IDENT;
		cand_size(&e, &best);
		goto write;
	}
	rc = make_raw(&e, &best);
	if (rc < 0)
		goto out;
	if (is_float) {
		e.syms = ulp_scratch_or_malloc(ULP_SCRATCH_SYMS, e.n ? e.n : 1, &e.syms_owned);
		rc = -ULP_E_NOMEM;
		if (!e.syms)
			goto out;
		if (ref) {
			rc = make_rans(&e, pool, 0, &other, stats ? &bound : NULL);
			if (rc < 0)
				goto out;
			keep_smaller(&e, &best, &other);
		}
		/* ANCHOR when there is no reference, or the delta gains little */
		if (!ref || o->effort || best.size * 4 > (size_t)src_len * 3) {
			rc = make_rans(&e, pool, 1, &other, NULL);
			if (rc < 0)
				goto out;
			keep_smaller(&e, &best, &other);
		}
	}
	/* zstd where ULPack does not apply, on tiny tensors (where tables weigh
	 * most), or where ULPack gains little */
	if (!is_float || o->effort || src_len <= 4096 || best.size * 20 > (size_t)src_len * 17) {
		for (int codec = ULP_CODEC_ZSTD; codec <= ULP_CODEC_ZSTD_XOR; codec++) {
			if (codec == ULP_CODEC_ZSTD_XOR && !ref)
				continue;
			/* against a reference, plain zstd rarely beats zstd of the XOR */
			if (codec == ULP_CODEC_ZSTD && ref && is_float && !o->effort)
				continue;
			rc = make_zstd(&e, pool, codec, &other);
			if (rc < 0)
				goto out;
			keep_smaller(&e, &best, &other);
		}
	}
write:
	rc = assemble(&e, &best, pool, dst, dst_cap);
	if (rc >= 0 && stats) {
		stats->codec = best.codec;
		stats->raw_bytes = src_len;
		stats->blob_bytes = (uint64_t)rc;
		stats->table_bytes = best.table_len;
		stats->bound_bits = bound;
	}
out:
	cand_free_zstd(&e, &best);
	if (e.syms_owned)
		free(e.syms);
	free(e.sum);
	return rc;
}

/* ---- decoder --------------------------------------------------------------- */

typedef struct blob_chunk {
	size_t off;         /* payload offset in the blob */
	size_t len;         /* payload bytes */
	size_t rans_len;    /* rANS codecs */
	uint64_t raw_bits;  /* rANS codecs */
	uint64_t sum;       /* XXH3-64 of the decoded bytes */
} blob_chunk;

struct ulp_blob {
	ulp_blob_info info;
	const uint8_t *data;
	size_t len;
	unsigned esize;
	unsigned lanes;
	ulp_fmt f;
	/* rANS codecs: the table, and its decoder view without slots; each
	 * decoding thread binds it to its own scratch (blob_dtab) */
	ulp_table t;
	ulp_dtab dtab;
	uint64_t id; /* unique for the process's life (never a pointer: reused) */
	blob_chunk *ch;
};

static atomic_uint_fast64_t blob_ids;

/* The slot table of the thread's current scratch level was last built for
 * blob bound_id[level] (0: none). Invariant: the ULP_SCRATCH_DTAB slot is
 * asked only here, so while the id matches, its buffer is unmoved and holds
 * that blob's bound table; a blob's size never changes, so asking the same
 * size again returns the same buffer. */
static __thread uint64_t bound_id[ULP_SCRATCH_LEVELS];

/* The decoder table of b for this thread; NULL: no memory. The slots live in
 * one scratch buffer a thread and level, not in b: a cold read opens every
 * blob of a chain, and tables of their own were fresh pages (about 100 KiB a
 * blob, a fifth of a cold read's page faults), which cost this machine's
 * kernel more than building the slots does.
 * A chain walk decodes chunk k of each link in turn, so the table is rebuilt
 * once a chunk of a link rather than once a blob: measured at under 1% of a
 * cold read's CPU (ulp_table_dslots_into). A per-thread cache of 18 bound
 * tables, to build each once a walk, measured slower: read-ahead spreads a
 * blob's chunks over its threads, so about 10% of builds were saved while
 * each thread touched 18 buffers of fresh pages. */
static const ulp_dtab *blob_dtab(const ulp_blob *b)
{
	if (b->dtab.slots) /* the encoder's check: built with its slots */
		return &b->dtab;
	const unsigned lv = ulp_scratch_level();
	void *mem = ulp_scratch(ULP_SCRATCH_DTAB, ulp_dtab_bind_size(&b->t));
	if (!mem) {
		bound_id[lv] = 0;
		return NULL;
	}
	if (bound_id[lv] != b->id) {
		ulp_dtab_bind(&b->dtab, &b->t, mem);
		bound_id[lv] = b->id;
	}
	return mem;
}

void ulp_blob_close(ulp_blob *b)
{
	if (!b)
		return;
	ulp_dtab_free(&b->dtab);
	ulp_table_free(&b->t);
	free(b->ch);
	free(b);
}

size_t ulp_blob_footprint(const ulp_blob *b)
{
	size_t tab = b->t.freq ? (size_t)b->t.n_rows * 256 * sizeof(*b->t.freq) +
	                                 (size_t)b->t.n_ctx * sizeof(*b->t.ctx_row)
	                       : 0;
	return sizeof(*b) + (size_t)b->info.n_chunks * sizeof(blob_chunk) + tab +
	       (size_t)b->dtab.n_ctx * sizeof(*b->dtab.row_off);
}

const ulp_blob_info *ulp_blob_get_info(const ulp_blob *b)
{
	return &b->info;
}

static int blob_open(const void *data, size_t avail, size_t len, ulp_blob **out, char *errbuf,
                     size_t errcap);

int ulp_blob_open(const void *data, size_t len, ulp_blob **out, char *errbuf, size_t errcap)
{
	return blob_open(data, len, len, out, errbuf, errcap);
}

/* A blob of len bytes of which the first avail (at least its header) are at
 * data: avail < len parses the header alone (payloads are not to be read). */
static int blob_open(const void *data, size_t avail, size_t len, ulp_blob **out, char *errbuf,
                     size_t errcap)
{
#define FAIL(...) do { rc = ULP_CORRUPT(&err, __VA_ARGS__); goto fail; } while (0)
	ulp_err err = {errbuf, errcap};
	const uint8_t *p = data, *end = p + avail;
	ulp_blob *b;
	uint64_t v;
	int rc;
	if (len < 8 + 1 + 32 + 4)
		return ULP_CORRUPT(&err, "blob of %zu bytes is shorter than any header", len);
	if (memcmp(p, BLOB_MAGIC, 4) != 0)
		return ULP_CORRUPT(&err, "not a ulpack blob (bad magic)");
	if (p[4] < 1 || p[4] > BLOB_VERSION)
		return ULP_ERR(&err, -ULP_E_VERSION, "blob format version %u, this build reads 1 to %u",
		               p[4], BLOB_VERSION);
	b = calloc(1, sizeof(*b));
	if (!b)
		return -ULP_E_NOMEM;
	b->data = data;
	b->len = len;
	b->id = atomic_fetch_add(&blob_ids, 1) + 1;
	b->info.version = p[4];
	b->info.codec = p[5];
	b->info.dtype = (ulp_dtype)p[6];
	unsigned cl = p[7];
	p += 8;
	if (b->info.codec >= ULP_CODEC__COUNT || b->info.dtype >= ULP_DT__COUNT ||
	    cl < CHUNK_LOG2_MIN || cl > CHUNK_LOG2_MAX)
		FAIL("blob header: bad codec %u, dtype %u or chunk size 2^%u", b->info.codec,
		     b->info.dtype, cl);
	b->esize = ulp_dtype_size(b->info.dtype);
	if (get_varint(&p, end, &v) < 0 || v > ((uint64_t)1 << 56) / b->esize)
		FAIL("blob header: bad element count");
	b->info.n_elems = v;
	b->info.raw_bytes = v * b->esize;
	b->info.chunk_elems = 1u << cl;
	int codec = b->info.codec;
	uint64_t nch = codec == ULP_CODEC_IDENT ? 0 : n_chunks_for(v, cl);
	b->info.n_chunks = (uint32_t)nch;
	b->info.has_ref = ulp_codec_uses_ref(codec);
	if (end - p < 32 + (b->info.has_ref ? 32 : 0))
		FAIL("blob header truncated");
	memcpy(b->info.content_sha256, p, 32);
	p += 32;
	if (b->info.has_ref) {
		memcpy(b->info.ref_sha256, p, 32);
		p += 32;
	}
	/* v2 names the reference by its identity in the archive, which may be
	 * a v1 SHA-256 while the content's digest is v2's: only v1 can check */
	if (b->info.version == 1 && codec == ULP_CODEC_IDENT &&
	    memcmp(b->info.content_sha256, b->info.ref_sha256, 32) && !ULP_FUZZING) {
		rc = ULP_CORRUPT(&err, "identical-to-reference blob names two different contents");
		goto fail;
	}
	if (codec_is_rans(codec)) {
		if (ulp_fmt_get(b->info.dtype, &b->f) < 0) {
			rc = ULP_CORRUPT(&err, "codec %s on non-float dtype %s", ulp_codec_name(codec),
			                 ulp_dtype_name(b->info.dtype));
			goto fail;
		}
		if (end - p < 3)
			FAIL("blob header truncated in the table section");
		unsigned ll = p[0], pb = p[1];
		p += 2;
		if (ll > 5) {
			rc = ULP_CORRUPT(&err, "blob declares 2^%u rANS lanes, at most 32", ll);
			goto fail;
		}
		b->lanes = 1u << ll;
		uint64_t tlen;
		if (get_varint(&p, end, &tlen) < 0 || tlen > (uint64_t)(end - p))
			FAIL("blob table length runs past the blob");
		int anchor = codec == ULP_CODEC_ANCHOR;
		rc = ulp_table_read(p, (size_t)tlen, pb, anchor ? 1u << b->f.a_bits : b->f.alphabet,
		                    anchor ? 1 : b->f.n_ctx, &b->t, &err);
		if (rc < 0)
			goto fail;
		rc = ulp_dtab_build_unbound(&b->t, &b->dtab);
		if (rc < 0)
			goto fail;
		p += tlen;
	}
	if (nch > (uint64_t)(end - p) / 8) {
		rc = ULP_CORRUPT(&err, "blob directory of %llu chunks overruns the blob",
		                 (unsigned long long)nch);
		goto fail;
	}
	b->ch = calloc(nch ? nch : 1, sizeof(blob_chunk));
	if (!b->ch) {
		rc = -ULP_E_NOMEM;
		goto fail;
	}
	uint64_t payload = 0;
	for (uint64_t k = 0; k < nch; k++) {
		blob_chunk *c = &b->ch[k];
		uint64_t first = k << cl, count = ULP_MIN((uint64_t)1 << cl, v - first);
		uint64_t bytes = count * b->esize;
		if (codec_is_rans(codec)) {
			uint64_t rl, rb;
			if (get_varint(&p, end, &rl) < 0 || get_varint(&p, end, &rb) < 0 ||
			    rl > b->len || rb > bytes * 8)
				FAIL("blob directory entry %llu is malformed", (unsigned long long)k);
			c->rans_len = (size_t)rl;
			c->raw_bits = rb;
			c->len = (size_t)(rl + (rb + 7) / 8);
		} else if (codec == ULP_CODEC_RAW) {
			c->len = (size_t)bytes;
		} else {
			uint64_t zl;
			if (get_varint(&p, end, &zl) < 0 || zl > b->len)
				FAIL("blob directory entry %llu is malformed", (unsigned long long)k);
			c->len = (size_t)zl;
		}
		if (end - p < 8)
			FAIL("blob directory entry %llu is truncated", (unsigned long long)k);
		c->sum = ulp_ld64(p);
		p += 8;
		c->off = (size_t)payload; /* relative until the header end is known */
		payload += c->len;
		if (payload > b->len)
			FAIL("blob chunk %llu runs past the blob", (unsigned long long)k);
	}
	if (end - p < 4)
		FAIL("blob header check missing");
	if (ulp_ld32(p) != (uint32_t)ulp_xxh64(data, (size_t)(p - (const uint8_t *)data)) &&
	    !ULP_FUZZING) {
		rc = ULP_CORRUPT(&err, "blob header check does not match: header damaged");
		goto fail;
	}
	p += 4;
	if (payload != (uint64_t)(len - (size_t)(p - (const uint8_t *)data))) {
		rc = ULP_CORRUPT(&err, "blob payloads need %llu bytes, %zu follow the header",
		                 (unsigned long long)payload, len - (size_t)(p - (const uint8_t *)data));
		goto fail;
	}
	for (uint64_t k = 0; k < nch; k++)
		b->ch[k].off += (size_t)(p - (const uint8_t *)data);
	*out = b;
	return 0;
fail:
	ulp_blob_close(b);
	return rc;
#undef FAIL
}

void ulp_blob_chunk_range(const ulp_blob *b, uint32_t k, uint64_t *off, uint64_t *len)
{
	uint64_t first = (uint64_t)k * b->info.chunk_elems;
	uint64_t count = first < b->info.n_elems ? ULP_MIN((uint64_t)b->info.chunk_elems,
	                                                    b->info.n_elems - first)
	                                          : 0;
	*off = first * b->esize;
	*len = count * b->esize;
}

void ulp_blob_chunk_payload(const ulp_blob *b, uint32_t k, const uint8_t **p, size_t *len)
{
	if (k >= b->info.n_chunks) {
		*p = b->data;
		*len = 0;
		return;
	}
	*p = b->data + b->ch[k].off;
	*len = b->ch[k].len;
}

static int64_t decode_payload(const ulp_blob *b, uint32_t k, const blob_chunk *c, const uint8_t *p,
                              uint8_t *dst, size_t cap, const uint8_t *ref, size_t ref_len, ulp_err *err);

static int64_t decode_chunk(const ulp_blob *b, uint32_t k, uint8_t *dst, size_t cap,
                            const uint8_t *ref, size_t ref_len, ulp_err *err)
{
	if (b->info.codec == ULP_CODEC_IDENT)
		return -ULP_E_INVAL; /* callers copy the reference */
	if (k >= b->info.n_chunks)
		return -ULP_E_INVAL;
	return decode_payload(b, k, &b->ch[k], b->data + b->ch[k].off, dst, cap, ref, ref_len, err);
}

/* Chunk k of b from its payload p, described by c (b->ch and b->data are
 * not used: the streaming encoder checks payloads that are not in a blob). */
static int64_t decode_payload(const ulp_blob *b, uint32_t k, const blob_chunk *c, const uint8_t *p,
                              uint8_t *dst, size_t cap, const uint8_t *ref, size_t ref_len, ulp_err *err)
{
	uint64_t off, len;
	ulp_blob_chunk_range(b, k, &off, &len);
	if (cap < len)
		return -ULP_E_OVERFLOW;
	if (b->info.has_ref && (!ref || ref_len != len))
		return ULP_ERR(err, -ULP_E_INVAL, "chunk %u needs %llu reference bytes", k,
		               (unsigned long long)len);
	size_t n = (size_t)(len / b->esize);
	switch (b->info.codec) {
	case ULP_CODEC_RAW:
		memcpy(dst, p, (size_t)len);
		break;
	case ULP_CODEC_ZSTD:
	case ULP_CODEC_ZSTD_XOR: {
		unsigned long long fcs = ZSTD_getFrameContentSize(p, c->len);
		if (fcs != len)
			return ULP_CORRUPT(err, "chunk %u: zstd frame declares %lld bytes, expected %llu",
			                   k, (long long)fcs, (unsigned long long)len);
		uint8_t *tmp = malloc(len ? (size_t)len : 1);
		if (!tmp)
			return -ULP_E_NOMEM;
		ZSTD_DCtx *dc = tls_dctx();
		size_t z = dc ? ZSTD_decompressDCtx(dc, tmp, (size_t)len, p, c->len)
		              : ZSTD_decompress(tmp, (size_t)len, p, c->len);
		if (ZSTD_isError(z) || z != len) {
			free(tmp);
			return ULP_CORRUPT(err, "chunk %u: zstd: %s", k,
			                   ZSTD_isError(z) ? ZSTD_getErrorName(z) : "short frame");
		}
		ulp_byte_ungroup(dst, tmp, n, b->esize);
		free(tmp);
		if (b->info.codec == ULP_CODEC_ZSTD_XOR)
			for (size_t i = 0; i < len; i++)
				dst[i] ^= ref[i];
		break;
	}
	default: { /* DELTA, ANCHOR */
		const ulp_dtab *d = blob_dtab(b);
		if (!d)
			return -ULP_E_NOMEM;
		int rc = ulp_chunk_decode(&b->f, d, b->lanes, p, c->rans_len, p + c->rans_len,
		                          c->len - c->rans_len, c->raw_bits,
		                          b->info.codec == ULP_CODEC_DELTA ? ref : NULL, n, dst, err);
		if (rc < 0)
			return rc;
	}
	}
	if ((ulp_xxh64(dst, (size_t)len) ^ payload_hash(p, c->len)) != c->sum && !ULP_FUZZING)
		return ULP_ERR(err, -ULP_E_CHECKSUM, "chunk %u: checksum mismatch (damaged payload or wrong reference)", k);
	return (int64_t)len;
}

int64_t ulp_blob_decode_chunk(const ulp_blob *b, uint32_t k, void *dst, size_t dst_cap,
                              const void *ref, size_t ref_len)
{
	return decode_chunk(b, k, dst, dst_cap, ref, ref_len, NULL);
}

typedef struct dec_job {
	const ulp_blob *b;
	uint8_t *dst;
	const uint8_t *ref;
	ulp_err *err;
	uint8_t *leaves;    /* v2 digest check with whole leaves in each chunk, or NULL */
} dec_job;

static int job_decode(void *arg, size_t k)
{
	dec_job *j = arg;
	uint64_t off, len;
	ulp_blob_chunk_range(j->b, (uint32_t)k, &off, &len);
	int64_t rc = decode_chunk(j->b, (uint32_t)k, j->dst + off, (size_t)len,
	                          j->ref ? j->ref + off : NULL, (size_t)len, j->err);
	if (rc >= 0 && j->leaves) /* invariant 4: hashed while the chunk is in cache */
		ulp_digest_leaves(j->dst + off, (size_t)len,
		                  j->leaves + off / ULP_DIGEST_LEAF * ULP_SHA256_LEN);
	return rc < 0 ? (int)rc : 0;
}

static int64_t decode_all(const ulp_blob *b, ulp_pool *pool, void *dst, size_t cap,
                          const void *ref, size_t ref_len, ulp_err *err, int verify);

int64_t ulp_blob_decode_verify(const ulp_blob *b, ulp_pool *pool, void *dst, size_t dst_cap,
                               const void *ref, size_t ref_len)
{
	return decode_all(b, pool, dst, dst_cap, ref, ref_len, NULL, 1);
}

/* verify: check the content digest too (v2: leaves hashed beside the decoding) */
static int64_t decode_all(const ulp_blob *b, ulp_pool *pool, void *dst, size_t cap,
                          const void *ref, size_t ref_len, ulp_err *err, int verify)
{
	if (cap < b->info.raw_bytes)
		return -ULP_E_OVERFLOW;
	if (b->info.has_ref && (!ref || ref_len != b->info.raw_bytes))
		return ULP_ERR(err, -ULP_E_INVAL, "blob needs a reference of %llu bytes",
		               (unsigned long long)b->info.raw_bytes);
	size_t raw = (size_t)b->info.raw_bytes;
	uint8_t got[ULP_SHA256_LEN];
	if (b->info.codec == ULP_CODEC_IDENT) {
		memcpy(dst, ref, raw);
		if (!verify)
			return (int64_t)raw;
		if (b->info.version == 1)
			ulp_sha256(dst, raw, got);
		else
			ULP_TRY(ulp_content_digest(pool, dst, raw, got));
		goto check;
	}
	dec_job j = {b, dst, ref, err, NULL};
	/* a shared error sink would race: only the sequential path fills it */
	if (pool && ulp_pool_threads(pool) > 1)
		j.err = NULL;
	int in_chunk = ((size_t)b->esize * b->info.chunk_elems) % ULP_DIGEST_LEAF == 0;
	if (verify && b->info.version >= 2 && in_chunk &&
	    !(j.leaves = malloc(ULP_MAX(ulp_digest_n_leaves(raw), 1) * ULP_SHA256_LEN)))
		return -ULP_E_NOMEM;
	int rc = ulp_pool_run(pool, b->info.n_chunks, job_decode, &j);
	if (rc < 0 || !verify) {
		free(j.leaves);
		return rc < 0 ? rc : (int64_t)raw;
	}
	if (j.leaves)
		ulp_digest_root(j.leaves, raw, got);
	else if (b->info.version >= 2)
		rc = ulp_content_digest(pool, dst, raw, got); /* chunks smaller than a leaf */
	else
		ulp_sha256(dst, raw, got);
	free(j.leaves);
	ULP_TRY(rc);
check:
	if (memcmp(got, b->info.content_sha256, ULP_SHA256_LEN))
		return ULP_ERR(err, -ULP_E_CHECKSUM, "decoded content fails its %s",
		               b->info.version == 1 ? "sha256" : "content digest");
	return (int64_t)raw;
}

int64_t ulp_blob_decode(const ulp_blob *b, ulp_pool *pool, void *dst, size_t dst_cap,
                        const void *ref, size_t ref_len)
{
	return decode_all(b, pool, dst, dst_cap, ref, ref_len, NULL, 0);
}

int ulp_blob_validate(const void *data, size_t len, const void *ref, size_t ref_len, int deep,
                      char *errbuf, size_t errcap)
{
	ulp_err err = {errbuf, errcap};
	ulp_blob *b;
	ULP_TRY(ulp_blob_open(data, len, &b, errbuf, errcap));
	int rc = 0;
	if (deep) {
		uint8_t *buf = malloc(b->info.raw_bytes ? (size_t)b->info.raw_bytes : 1);
		if (!buf) {
			ulp_blob_close(b);
			return -ULP_E_NOMEM;
		}
		int64_t n = decode_all(b, NULL, buf, (size_t)b->info.raw_bytes, ref, ref_len, &err, 1);
		if (n < 0)
			rc = (int)n;
		free(buf);
	}
	ulp_blob_close(b);
	return rc;
}

/* ---- streaming encoder (senc.h) ------------------------------------------- */

typedef struct sslot {     /* the buffers of one chunk of the window */
	uint8_t *src, *ref, *syms, *region, *check;
	uint64_t *counts;
} sslot;

typedef struct scand {
	cand c;
	int slot;               /* spill slot of its payloads, -1: none (raw, ident) */
	uint64_t *phash;        /* payload hashes, one a chunk */
} scand;

typedef struct senc {
	enc e;                  /* geometry, digests, checksums; e.src and e.ref unused */
	const ulp_senc_io *io;
	int has_ref;
	size_t window, k0;      /* chunks a window, first chunk of this one */
	sslot *slot;
	uint8_t *mem;           /* the slots' buffers */
	size_t cells;           /* count cells of the model being counted */
	uint64_t *merged;       /* its counts, all chunks */
	uint64_t stride;        /* spill bytes a chunk */
	int want_sums;          /* counting pass: checksums, raw payload hashes, ident check */
	int want_counts;
	int differs;            /* atomic: a chunk differs from its reference */
	uint64_t *raw_phash;
	uint64_t *ph[2];        /* payload hashes of spill slots 0 and 1 */
	scand *c;               /* the candidate being coded */
	ulp_blob dec;           /* its decoder, for invariant 2 */
} senc;

static int sget(senc *S, size_t k, sslot *sl, int with_ref, size_t *count)
{
	size_t first;
	chunk_span(&S->e, k, &first, count);
	return S->io->get(S->io->arg, (uint64_t)first * S->e.esize, *count * S->e.esize, sl->src,
	                  with_ref ? sl->ref : NULL);
}

/* counting pass: chunk S->k0 + i read, its checksums and its symbol counts */
static int job_s_count(void *arg, size_t i)
{
	senc *S = arg;
	enc *e = &S->e;
	size_t k = S->k0 + i, count;
	sslot *sl = &S->slot[i];
	int with_ref = S->has_ref && (S->want_sums || !e->anchor);
	ULP_TRY(sget(S, k, sl, with_ref, &count));
	size_t bytes = count * e->esize;
	if (S->want_sums) {
		e->sum[k] = ulp_xxh64(sl->src, bytes);
		S->raw_phash[k] = payload_hash(sl->src, bytes);
		if (S->has_ref && memcmp(sl->src, sl->ref, bytes) != 0)
			__atomic_store_n(&S->differs, 1, __ATOMIC_RELAXED);
	}
	if (S->want_counts) {
		uint64_t raw_bits;
		memset(sl->counts, 0, S->cells * sizeof(uint64_t));
		ulp_pass1(&e->f, e->anchor, sl->src, e->anchor ? NULL : sl->ref, count, sl->syms, sl->counts,
		          sl->region, ulp_chunk_raw_bound(&e->f, count), &raw_bits);
	}
	return 0;
}

/* Invariant 2 for one payload, then to the spill. */
static int s_finish(senc *S, size_t k, sslot *sl, const uint8_t *payload, size_t count)
{
	enc *e = &S->e;
	scand *c = S->c;
	size_t bytes = count * e->esize, plen = c->c.ch[k].len;
	uint64_t ph = payload_hash(payload, plen);
	c->phash[k] = ph;
	blob_chunk bc = {0, plen, c->c.ch[k].rans_len, c->c.ch[k].raw_bits, e->sum[k] ^ ph};
	int64_t d = decode_payload(&S->dec, (uint32_t)k, &bc, payload, sl->check, bytes,
	                           S->dec.info.has_ref ? sl->ref : NULL, bytes, NULL);
	if (d == -ULP_E_NOMEM)
		return (int)d;
	if (d != (int64_t)bytes || memcmp(sl->check, sl->src, bytes) != 0)
		return -ULP_E_CHECKSUM;
	return S->io->spill_put(S->io->arg, ((uint64_t)c->slot * e->n_chunks + k) * S->stride, payload, plen);
}

static int job_s_rans(void *arg, size_t i)
{
	senc *S = arg;
	enc *e = &S->e;
	cand *c = &S->c->c;
	size_t k = S->k0 + i, count, rans_len;
	sslot *sl = &S->slot[i];
	ULP_TRY(sget(S, k, sl, !e->anchor, &count));
	unsigned lanes = 1u << c->lanes_log2;
	size_t rb = ulp_chunk_rans_bound(count, lanes);
	uint64_t raw_bits;
	ulp_pass1(&e->f, e->anchor, sl->src, e->anchor ? NULL : sl->ref, count, sl->syms, sl->counts,
	          sl->region + rb, ulp_chunk_raw_bound(&e->f, count), &raw_bits);
	ULP_TRY(ulp_chunk_encode(&e->f, e->t, e->es, e->es64, lanes, sl->syms, e->anchor ? NULL : sl->ref,
	                         count, sl->region, rb, &rans_len));
	size_t raw_len = (size_t)((raw_bits + 7) / 8);
	memmove(sl->region + rans_len, sl->region + rb, raw_len);
	c->ch[k] = (enc_chunk){NULL, rans_len, raw_bits, rans_len + raw_len};
	return s_finish(S, k, sl, sl->region, count);
}

static int job_s_zstd(void *arg, size_t i)
{
	senc *S = arg;
	enc *e = &S->e;
	cand *c = &S->c->c;
	size_t k = S->k0 + i, count;
	sslot *sl = &S->slot[i];
	ULP_TRY(sget(S, k, sl, c->codec == ULP_CODEC_ZSTD_XOR, &count));
	size_t bytes = count * e->esize, cap = ZSTD_compressBound(bytes);
	uint8_t *tmp = malloc(bytes ? bytes : 1), *grp = malloc(bytes ? bytes : 1);
	int rc = -ULP_E_NOMEM;
	if (!tmp || !grp)
		goto done;
	const uint8_t *s = sl->src;
	if (c->codec == ULP_CODEC_ZSTD_XOR) {
		for (size_t b = 0; b < bytes; b++)
			tmp[b] = s[b] ^ sl->ref[b];
		s = tmp;
	}
	ulp_byte_group(grp, s, count, e->esize);
	ZSTD_CCtx *cc = tls_cctx();
	size_t z = cc ? ZSTD_compressCCtx(cc, sl->region, cap, grp, bytes, (int)e->zlevel)
	              : ZSTD_compress(sl->region, cap, grp, bytes, (int)e->zlevel);
	if (ZSTD_isError(z))
		goto done;
	c->ch[k] = (enc_chunk){NULL, 0, 0, z};
	rc = s_finish(S, k, sl, sl->region, count);
done:
	free(tmp);
	free(grp);
	return rc;
}

/* One pass over the chunks, a window at a time; counting passes merge the
 * window's counts in chunk order (sums of integers: any order gives the
 * table ulp_encode chooses). */
static int s_pass(senc *S, ulp_pool *pool, int (*fn)(void *, size_t))
{
	for (size_t k0 = 0; k0 < S->e.n_chunks; k0 += S->window) {
		size_t m = ULP_MIN(S->window, S->e.n_chunks - k0);
		S->k0 = k0;
		ULP_TRY(ulp_pool_run(pool, m, fn, S));
		if (fn == job_s_count && S->want_counts)
			for (size_t i = 0; i < m; i++)
				for (size_t x = 0; x < S->cells; x++)
					S->merged[x] += S->slot[i].counts[x];
	}
	return 0;
}

static void s_model(senc *S, int anchor)
{
	enc *e = &S->e;
	e->anchor = anchor;
	e->n_ctx = anchor ? 1 : e->f.n_ctx;
	e->alphabet = anchor ? 1u << e->f.a_bits : e->f.alphabet;
	S->cells = (size_t)e->n_ctx * e->alphabet;
	memset(S->merged, 0, S->cells * sizeof(uint64_t));
}

static void s_dec_init(senc *S, int codec, unsigned lanes_log2)
{
	ulp_blob *b = &S->dec;
	memset(b, 0, sizeof(*b));
	b->info.codec = codec;
	b->info.dtype = S->e.dt;
	b->info.n_elems = S->e.n;
	b->info.chunk_elems = 1u << S->e.chunk_log2;
	b->info.n_chunks = (uint32_t)S->e.n_chunks;
	b->info.has_ref = ulp_codec_uses_ref(codec);
	b->esize = S->e.esize;
	b->lanes = 1u << lanes_log2;
	b->f = S->e.f;
}

/* make_rans, streamed: counted (the model's counts are in S->merged) or not */
static int s_rans(senc *S, ulp_pool *pool, int anchor, int counted, scand *sc)
{
	enc *e = &S->e;
	cand *c = &sc->c;
	ulp_table t = {0};
	ulp_rans_esym *es = NULL;
	uint64_t cost_bits = 0, *es64 = NULL;
	int rc;
	c->codec = anchor ? ULP_CODEC_ANCHOR : ULP_CODEC_DELTA;
	if (!counted) {
		s_model(S, anchor);
		S->want_sums = 0;
		S->want_counts = 1;
		ULP_TRY(s_pass(S, pool, job_s_count));
	}
	c->lanes_log2 = lanes_log2_for(ULP_MIN(e->n, (size_t)1 << e->chunk_log2));
	if ((rc = cand_alloc_chunks(e, c)) < 0 ||
	    (rc = ulp_table_choose(S->merged, e->n_ctx, e->alphabet, &t, &cost_bits)) < 0 ||
	    (rc = ulp_table_esyms(&t, &es)) < 0)
		goto out;
	c->prob_bits = t.prob_bits;
	rc = -ULP_E_NOMEM;
	if (!(c->table = malloc(ulp_table_bound(&t))))
		goto out;
	int64_t tl = ulp_table_write(&t, c->table, ulp_table_bound(&t));
	if (tl < 0) {
		rc = (int)tl;
		goto out;
	}
	c->table_len = (size_t)tl;
	s_dec_init(S, c->codec, c->lanes_log2);
	if ((rc = ulp_dtab_build(&t, &S->dec.dtab)) < 0)
		goto out;
	e->t = &t;
	e->es = es;
	e->es64 = es64 = ulp_esyms_pack(&t, es);
	S->c = sc;
	rc = s_pass(S, pool, job_s_rans);
	e->t = NULL;
	e->es = NULL;
	e->es64 = NULL;
	if (rc == 0)
		cand_size(e, c);
out:
	ulp_dtab_free(&S->dec.dtab);
	free(es64);
	ulp_table_free(&t);
	free(es);
	if (rc < 0)
		cand_free(c);
	return rc;
}

static int s_zstd(senc *S, ulp_pool *pool, int codec, scand *sc)
{
	cand *c = &sc->c;
	c->codec = codec;
	ULP_TRY(cand_alloc_chunks(&S->e, c));
	s_dec_init(S, codec, 0);
	S->c = sc;
	int rc = s_pass(S, pool, job_s_zstd);
	if (rc < 0)
		cand_free(c);
	else
		cand_size(&S->e, c);
	return rc;
}

/* keep_smaller for streamed candidates: other takes the spill slot best
 * does not hold */
static void s_keep_smaller(senc *S, scand *best, scand *other)
{
	if (other->c.size < best->c.size) {
		cand_free(&best->c);
		*best = *other;
	} else {
		cand_free(&other->c);
	}
	memset(other, 0, sizeof(*other));
	other->slot = best->slot == 0 ? 1 : 0;
	other->phash = S->ph[other->slot];
}

/* the header parsed back must describe the payloads checked (invariant 2) */
static int s_check_header(const senc *S, const scand *b, const uint8_t *h, size_t hl)
{
	ulp_blob *p;
	int rc = blob_open(h, hl, b->c.size, &p, NULL, 0);
	if (rc < 0)
		return rc == -ULP_E_NOMEM ? rc : -ULP_E_CHECKSUM;
	if (p->info.codec != b->c.codec || p->info.n_elems != S->e.n ||
	    memcmp(p->info.content_sha256, S->e.sha, 32) != 0)
		rc = -ULP_E_CHECKSUM;
	for (size_t k = 0; rc == 0 && b->c.codec != ULP_CODEC_IDENT && k < S->e.n_chunks; k++)
		if (p->ch[k].len != b->c.ch[k].len || p->ch[k].sum != (S->e.sum[k] ^ b->phash[k]) ||
		    (codec_is_rans(b->c.codec) &&
		     (p->ch[k].rans_len != b->c.ch[k].rans_len || p->ch[k].raw_bits != b->c.ch[k].raw_bits)))
			rc = -ULP_E_CHECKSUM;
	ulp_blob_close(p);
	return rc;
}

int ulp_encode_stream(const ulp_enc_opts *opts, ulp_pool *pool, ulp_dtype dt, uint64_t src_len,
                      int has_ref, size_t window, const ulp_senc_io *io, ulp_senc *out)
{
	static const ulp_enc_opts defaults = {0};
	const ulp_enc_opts *o = opts ? opts : &defaults;
	senc S;
	enc *e = &S.e;
	scand best, other;
	int rc;
	memset(&S, 0, sizeof(S));
	memset(&best, 0, sizeof(best));
	memset(&other, 0, sizeof(other));
	memset(out, 0, sizeof(*out));
	if ((unsigned)dt >= ULP_DT__COUNT || !o->src_sha256 || (has_ref && !o->ref_sha256) || o->force_codec)
		return -ULP_E_INVAL;
	e->o = o;
	e->dt = dt;
	e->esize = ulp_dtype_size(dt);
	e->chunk_log2 = o->chunk_log2 ? o->chunk_log2 : ULP_DEFAULT_CHUNK_LOG2;
	e->zlevel = o->zstd_level ? (unsigned)o->zstd_level : 3;
	e->version = o->format_version ? o->format_version : BLOB_VERSION;
	if (e->chunk_log2 < CHUNK_LOG2_MIN || e->chunk_log2 > CHUNK_LOG2_MAX || src_len % e->esize ||
	    e->version < 1 || e->version > BLOB_VERSION || src_len / e->esize > SIZE_MAX / 2)
		return -ULP_E_INVAL;
	S.io = io;
	S.has_ref = has_ref;
	e->n = (size_t)(src_len / e->esize);
	e->n_chunks = (size_t)n_chunks_for(e->n, e->chunk_log2);
	int is_float = ulp_fmt_get(dt, &e->f) == 0;
	memcpy(e->sha, o->src_sha256, 32);
	if (has_ref)
		memcpy(e->ref_sha, o->ref_sha256, 32);
	S.window = window ? window : 2 * (size_t)ULP_MAX(1, ulp_pool_threads(pool));
	S.window = ULP_MAX(1, ULP_MIN(S.window, e->n_chunks));
	/* a window's buffers: each chunk its source, reference, symbols, coding
	 * region (the larger of a rANS and a zstd payload), decoding check and counts */
	size_t ce = ULP_MIN(e->n, (size_t)1 << e->chunk_log2), cb = ce * e->esize;
	size_t cells = is_float ? ULP_MAX((size_t)e->f.n_ctx * e->f.alphabet, (size_t)1 << e->f.a_bits) : 1;
	size_t region = ULP_MAX(is_float ? region_size(e) : 0, ZSTD_compressBound(cb)) + 64;
	S.stride = (ULP_MAX((uint64_t)region, (uint64_t)cb) + 4095) & ~(uint64_t)4095;
	size_t a64 = 63, per = ((cb + a64) & ~a64) * (has_ref ? 3 : 2) + ((ce + a64) & ~a64) +
	                      ((region + a64) & ~a64) + cells * sizeof(uint64_t);
	size_t nk = e->n_chunks ? e->n_chunks : 1;
	e->sum = calloc(nk, sizeof(uint64_t));
	S.raw_phash = calloc(nk, sizeof(uint64_t));
	S.ph[0] = calloc(nk, sizeof(uint64_t));
	S.ph[1] = calloc(nk, sizeof(uint64_t));
	S.merged = calloc(cells, sizeof(uint64_t));
	S.slot = calloc(S.window, sizeof(sslot));
	S.mem = ulp_alloc_big(per * S.window);
	rc = -ULP_E_NOMEM;
	if (!e->sum || !S.raw_phash || !S.ph[0] || !S.ph[1] || !S.merged || !S.slot || !S.mem)
		goto out;
	for (size_t i = 0; i < S.window; i++) {
		uint8_t *m = S.mem + i * per;
		sslot *sl = &S.slot[i];
#define TAKE(ptr, sz) do { ptr = (void *)m; m += ((sz) + a64) & ~a64; } while (0)
		TAKE(sl->src, cb);
		if (has_ref)
			TAKE(sl->ref, cb);
		TAKE(sl->check, cb);
		TAKE(sl->syms, ce);
		TAKE(sl->region, region);
		TAKE(sl->counts, cells * sizeof(uint64_t));
#undef TAKE
	}

	/* the first pass: checksums, identity with the reference, and the
	 * counts of the first rANS candidate (ulp_encode's order) */
	int primary = is_float ? (has_ref ? 0 : 1) : -1;
	S.want_sums = 1;
	S.want_counts = primary >= 0;
	if (primary >= 0)
		s_model(&S, primary);
	if ((rc = s_pass(&S, pool, job_s_count)) < 0)
		goto out;
	if (has_ref && !S.differs &&
	    (e->version != 1 || memcmp(o->ref_sha256, o->src_sha256, 32) == 0)) {
		best.c.codec = ULP_CODEC_IDENT;
		best.slot = -1;
		cand_size(e, &best.c);
		goto write;
	}
	/* raw: its payloads are the content's chunks */
	best.c.codec = ULP_CODEC_RAW;
	best.slot = -1;
	best.phash = S.raw_phash;
	if ((rc = cand_alloc_chunks(e, &best.c)) < 0)
		goto out;
	for (size_t k = 0; k < e->n_chunks; k++) {
		size_t first, count;
		chunk_span(e, k, &first, &count);
		best.c.ch[k].len = count * e->esize;
	}
	cand_size(e, &best.c);
	other.slot = 0;
	other.phash = S.ph[0];
	if (is_float) {
		if (has_ref) {
			if ((rc = s_rans(&S, pool, 0, 1, &other)) < 0)
				goto out;
			s_keep_smaller(&S, &best, &other);
		}
		if (!has_ref || o->effort || best.c.size * 4 > (size_t)src_len * 3) {
			if ((rc = s_rans(&S, pool, 1, primary == 1, &other)) < 0)
				goto out;
			s_keep_smaller(&S, &best, &other);
		}
	}
	if (!is_float || o->effort || src_len <= 4096 || best.c.size * 20 > (size_t)src_len * 17) {
		for (int codec = ULP_CODEC_ZSTD; codec <= ULP_CODEC_ZSTD_XOR; codec++) {
			if (codec == ULP_CODEC_ZSTD_XOR && !has_ref)
				continue;
			if (codec == ULP_CODEC_ZSTD && has_ref && is_float && !o->effort)
				continue;
			if ((rc = s_zstd(&S, pool, codec, &other)) < 0)
				goto out;
			s_keep_smaller(&S, &best, &other);
		}
	}
write:
	out->header_len = write_header(e, &best.c, NULL, NULL);
	out->header = malloc(out->header_len);
	out->pos = calloc(e->n_chunks + 1, sizeof(uint64_t));
	rc = -ULP_E_NOMEM;
	if (!out->header || !out->pos)
		goto out;
	write_header(e, &best.c, best.phash, out->header);
	if ((rc = s_check_header(&S, &best, out->header, out->header_len)) < 0)
		goto out;
	out->codec = best.c.codec;
	out->blob_len = best.c.size;
	out->n_chunks = best.c.codec == ULP_CODEC_IDENT ? 0 : e->n_chunks;
	out->pos[0] = out->header_len;
	for (size_t k = 0; k < out->n_chunks; k++)
		out->pos[k + 1] = out->pos[k] + best.c.ch[k].len;
	out->stride = S.stride;
	out->spill_base = best.slot > 0 ? (uint64_t)best.slot * e->n_chunks * S.stride : 0;
	out->chunk_bytes = cb;
	rc = out->pos[out->n_chunks] == out->blob_len ? 0 : -ULP_E_CHECKSUM;
out:
	cand_free(&best.c);
	cand_free(&other.c);
	free(e->sum);
	free(S.raw_phash);
	free(S.ph[0]);
	free(S.ph[1]);
	free(S.merged);
	free(S.slot);
	free(S.mem);
	if (rc < 0)
		ulp_senc_free(out);
	return rc;
}

int ulp_senc_read(const ulp_senc *s, const ulp_senc_io *io, uint64_t off, size_t len, uint8_t *dst)
{
	if (off + len > s->blob_len)
		return -ULP_E_INVAL;
	while (len) {
		size_t n;
		if (off < s->header_len) {
			n = (size_t)ULP_MIN((uint64_t)len, s->header_len - off);
			memcpy(dst, s->header + off, n);
		} else {
			size_t lo = 0, hi = s->n_chunks; /* pos[lo] <= off < pos[hi] */
			while (hi - lo > 1) {
				size_t mid = lo + (hi - lo) / 2;
				if (s->pos[mid] <= off)
					lo = mid;
				else
					hi = mid;
			}
			uint64_t in = off - s->pos[lo];
			n = (size_t)ULP_MIN((uint64_t)len, s->pos[lo + 1] - off);
			int rc = s->codec == ULP_CODEC_RAW
			             ? io->get(io->arg, lo * s->chunk_bytes + in, n, dst, NULL)
			             : io->spill_get(io->arg, s->spill_base + lo * s->stride + in, dst, n);
			if (rc < 0)
				return rc;
		}
		off += n;
		dst += n;
		len -= n;
	}
	return 0;
}

void ulp_senc_free(ulp_senc *s)
{
	free(s->header);
	free(s->pos);
	memset(s, 0, sizeof(*s));
}
