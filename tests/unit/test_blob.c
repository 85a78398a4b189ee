/* SPDX-License-Identifier: MIT */
/*
 * test_blob.c - the container: codec choice per input kind, byte identity
 * across thread counts, chunked decoding, and hostile blobs: every byte of
 * small blobs flipped and every truncation length give an error, never a
 * crash and never wrong bytes; a wrong reference gives a checksum error.
 * Format v2's content digest: its definition, the same from any thread
 * count and from chunks holding several leaves or parts of one, and a
 * reference named by a v1 identity. The streaming encoder (senc.h) makes
 * the very bytes ulp_encode makes, for every codec it may choose.
 */
#include "tap.h"
#include "ulpack.h"
#include "senc.h"
#include <string.h>

typedef struct blob {
	uint8_t *p;
	size_t n;
} blob;

static blob enc(const ulp_enc_opts *o, ulp_pool *pool, ulp_dtype dt, const void *x, size_t bytes,
                const void *r)
{
	size_t cap = ulp_encode_bound(dt, bytes, o);
	blob b = {malloc(cap), 0};
	int64_t n = ulp_encode(o, pool, dt, b.p, cap, x, bytes, r, r ? bytes : 0, NULL);
	REQUIRE(n > 0, "encode %s: %s", ulp_dtype_name(dt), n < 0 ? ulp_strerror((int)n) : "empty");
	b.n = (size_t)n;
	return b;
}

/* decode fully; 0 and identical bytes, or an error code */
static int dec(const blob *b, const void *r, size_t bytes, const void *expect)
{
	ulp_blob *h;
	int rc = ulp_blob_open(b->p, b->n, &h, NULL, 0);
	if (rc < 0)
		return rc;
	uint8_t *out = malloc(bytes + 1);
	int64_t n = ulp_blob_decode(h, NULL, out, bytes, r, r ? bytes : 0);
	ulp_blob_close(h);
	if (n >= 0 && (n != (int64_t)bytes || memcmp(out, expect, bytes) != 0))
		rc = 1; /* wrong bytes: the one outcome that must never happen */
	else
		rc = n < 0 ? (int)n : 0;
	free(out);
	return rc;
}

static void make_pair(uint16_t *x, uint16_t *r, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		r[i] = (uint16_t)(0x3c00 + (tap_rand() % 0x900)) ^ (uint16_t)((tap_rand() & 1) << 15);
		x[i] = (uint16_t)(r[i] + (int)(tap_rand() % 61) - 30);
	}
}

static void test_choice(void)
{
	const size_t n = 4096;
	uint16_t *x = malloc(n * 2), *r = malloc(n * 2);
	make_pair(x, r, n);
	blob b = enc(NULL, NULL, ULP_DT_BF16, x, n * 2, r);
	ulp_blob *h;
	REQUIRE(ulp_blob_open(b.p, b.n, &h, NULL, 0) == 0, "open");
	CHECK(ulp_blob_get_info(h)->codec == ULP_CODEC_DELTA, "delta chosen, got %s",
	      ulp_codec_name(ulp_blob_get_info(h)->codec));
	CHECK(ulp_blob_get_info(h)->n_elems == n && ulp_blob_get_info(h)->has_ref, "info");
	ulp_blob_close(h);
	CHECK(dec(&b, r, n * 2, x) == 0, "delta round trip");
	free(b.p);

	b = enc(NULL, NULL, ULP_DT_BF16, x, n * 2, x); /* identical */
	CHECK(b.n < 120, "identical tensor costs %zu bytes", b.n);
	CHECK(dec(&b, x, n * 2, x) == 0, "ident round trip");
	free(b.p);

	b = enc(NULL, NULL, ULP_DT_BF16, x, n * 2, NULL); /* anchor */
	REQUIRE(ulp_blob_open(b.p, b.n, &h, NULL, 0) == 0, "open");
	CHECK(ulp_blob_get_info(h)->codec == ULP_CODEC_ANCHOR, "anchor chosen");
	CHECK(!ulp_blob_get_info(h)->has_ref, "anchor needs no reference");
	ulp_blob_close(h);
	CHECK(dec(&b, NULL, n * 2, x) == 0, "anchor round trip");
	free(b.p);

	/* integers and unknown dtypes: zstd or raw, byte exact */
	uint8_t *bytes = malloc(n * 2);
	for (size_t i = 0; i < n * 2; i++)
		bytes[i] = (uint8_t)(i % 7);
	const ulp_dtype dts[] = {ULP_DT_I64, ULP_DT_U8, ULP_DT_BOOL, ULP_DT_UNKNOWN, ULP_DT_I32};
	for (size_t k = 0; k < sizeof(dts) / sizeof(dts[0]); k++) {
		b = enc(NULL, NULL, dts[k], bytes, n * 2, NULL);
		CHECK(b.n < n, "%s compresses (%zu bytes)", ulp_dtype_name(dts[k]), b.n);
		CHECK(dec(&b, NULL, n * 2, bytes) == 0, "%s round trip", ulp_dtype_name(dts[k]));
		free(b.p);
	}
	for (size_t i = 0; i < n * 2; i++)
		bytes[i] = (uint8_t)tap_rand();
	b = enc(NULL, NULL, ULP_DT_UNKNOWN, bytes, n * 2, NULL);
	CHECK(b.n <= n * 2 + 64, "incompressible bytes stay raw (%zu)", b.n);
	CHECK(dec(&b, NULL, n * 2, bytes) == 0, "raw round trip");
	free(b.p);

	/* empty tensor; odd byte count refused for sized dtypes */
	b = enc(NULL, NULL, ULP_DT_F32, x, 0, NULL);
	CHECK(dec(&b, NULL, 0, x) == 0, "empty tensor");
	free(b.p);
	uint8_t tmp[64];
	CHECK(ulp_encode(NULL, NULL, ULP_DT_F32, tmp, sizeof(tmp), x, 6, NULL, 0, NULL) == -ULP_E_INVAL,
	      "6 bytes of F32 refused");
	CHECK(ulp_encode(NULL, NULL, ULP_DT_BF16, tmp, 8, x, 4096, NULL, 0, NULL) == -ULP_E_OVERFLOW,
	      "small dst gives OVERFLOW");
	free(bytes);
	free(x);
	free(r);
}

static void test_threads(void)
{
	const size_t n = 300000; /* several chunks at 2^14 */
	uint16_t *x = malloc(n * 2), *r = malloc(n * 2);
	make_pair(x, r, n);
	ulp_enc_opts o = {.chunk_log2 = 14};
	blob one = enc(&o, NULL, ULP_DT_BF16, x, n * 2, r);
	/* every CPU path codes the same bytes */
	unsigned old = ulp_set_cpu_mask(0);
	blob scalar = enc(&o, NULL, ULP_DT_BF16, x, n * 2, r);
	ulp_set_cpu_mask(old);
	CHECK(scalar.n == one.n && memcmp(scalar.p, one.p, one.n) == 0, "scalar and SIMD encoders agree");
	free(scalar.p);
	for (int t = 2; t <= 4; t++) {
		ulp_pool *pool;
		REQUIRE(ulp_pool_new(t, &pool) == 0, "pool");
		blob many = enc(&o, pool, ULP_DT_BF16, x, n * 2, r);
		CHECK(many.n == one.n && memcmp(many.p, one.p, one.n) == 0, "identical blob with %d threads", t);
		ulp_blob *h;
		REQUIRE(ulp_blob_open(many.p, many.n, &h, NULL, 0) == 0, "open");
		uint16_t *out = malloc(n * 2);
		CHECK(ulp_blob_decode(h, pool, out, n * 2, r, n * 2) == (int64_t)(n * 2) &&
		      memcmp(out, x, n * 2) == 0, "parallel decode with %d threads", t);
		/* chunks decode alone */
		const ulp_blob_info *in = ulp_blob_get_info(h);
		CHECK(in->n_chunks == (n + 16383) / 16384, "chunk count %u", in->n_chunks);
		memset(out, 0, n * 2);
		uint32_t k = in->n_chunks / 2;
		uint64_t off, len;
		ulp_blob_chunk_range(h, k, &off, &len);
		CHECK(ulp_blob_decode_chunk(h, k, (uint8_t *)out + off, len, (uint8_t *)r + off, len) == (int64_t)len &&
		      memcmp((uint8_t *)out + off, (uint8_t *)x + off, len) == 0, "chunk %u alone", k);
		free(out);
		ulp_blob_close(h);
		free(many.p);
		ulp_pool_free(pool);
	}
	free(one.p);
	free(x);
	free(r);
}

static void test_hostile(void)
{
	const size_t n = 700;
	uint16_t *x = malloc(n * 2), *r = malloc(n * 2), *r2 = malloc(n * 2);
	make_pair(x, r, n);
	memcpy(r2, r, n * 2);
	r2[17] ^= 1;
	for (int codec = ULP_CODEC_RAW; codec < ULP_CODEC__COUNT; codec++) {
		if (codec == ULP_CODEC_IDENT)
			continue;
		ulp_enc_opts o = {.chunk_log2 = 10, .force_codec = codec + 1};
		const uint16_t *ref = ulp_codec_uses_ref(codec) ? r : NULL;
		blob b = enc(&o, NULL, ULP_DT_BF16, x, n * 2, ref);
		CHECK(dec(&b, ref, n * 2, x) == 0, "%s round trip", ulp_codec_name(codec));
		ulp_blob *h = NULL;
		CHECK(ulp_blob_open(b.p, b.n, &h, NULL, 0) == 0 &&
		              ulp_blob_get_info(h)->has_ref == ulp_codec_uses_ref(codec),
		      "%s: the blob's has_ref is ulp_codec_uses_ref", ulp_codec_name(codec));
		ulp_blob_close(h);
		if (ref)
			CHECK(dec(&b, r2, n * 2, x) == -ULP_E_CHECKSUM || dec(&b, r2, n * 2, x) == -ULP_E_CORRUPT,
			      "%s with a wrong reference fails", ulp_codec_name(codec));
		int wrong = 0, accepted = 0;
		for (size_t i = 0; i < b.n; i++)
			for (int bit = 0; bit < 8; bit += 3) {
				b.p[i] ^= (uint8_t)(1u << bit);
				int rc = dec(&b, ref, n * 2, x);
				wrong += rc == 1;
				accepted += rc == 0;
				b.p[i] ^= (uint8_t)(1u << bit);
			}
		CHECK(wrong == 0, "%s: %d flips decoded to wrong bytes", ulp_codec_name(codec), wrong);
		CHECK(accepted == 0, "%s: %d flips went unnoticed", ulp_codec_name(codec), accepted);
		int bad_trunc = 0;
		for (size_t l = 0; l < b.n; l++) {
			blob t = {b.p, l};
			bad_trunc += dec(&t, ref, n * 2, x) >= 0;
		}
		CHECK(bad_trunc == 0, "%s: %d truncations accepted", ulp_codec_name(codec), bad_trunc);
		char err[200];
		CHECK(ulp_blob_validate(b.p, b.n, ref, ref ? n * 2 : 0, 1, err, sizeof(err)) == 0, "validate");
		b.p[b.n - 1] ^= 0x40;
		CHECK(ulp_blob_validate(b.p, b.n, ref, ref ? n * 2 : 0, 1, err, sizeof(err)) < 0 && err[0],
		      "validate reports damage");
		free(b.p);
	}
	free(x);
	free(r);
	free(r2);
}

/* ulpack-format(5) 2.4 by hand */
static void digest_by_hand(const uint8_t *x, size_t len, uint8_t out[32])
{
	size_t m = (len + ULP_DIGEST_LEAF - 1) / ULP_DIGEST_LEAF;
	uint8_t *cat = malloc(m * 32 + 8);
	for (size_t i = 0; i < m; i++)
		ulp_sha256(x + i * ULP_DIGEST_LEAF, i + 1 < m ? ULP_DIGEST_LEAF : len - i * ULP_DIGEST_LEAF, cat + 32 * i);
	for (int k = 0; k < 8; k++)
		cat[m * 32 + k] = (uint8_t)((uint64_t)len >> (8 * k));
	ulp_sha256(cat, m * 32 + 8, out);
	free(cat);
}

static void test_digest(void)
{
	/* 1.5M bf16 elements: 3 MiB, two 2-MiB chunks of two leaves each, the
	 * last leaf full, then 2.5 MiB with a partial leaf */
	size_t n = 3u << 19, bytes = n * 2;
	uint16_t *x = malloc(bytes), *r = malloc(bytes);
	make_pair(x, r, n);
	ulp_pool *pool;
	REQUIRE(ulp_pool_new(3, &pool) == 0, "pool");
	uint8_t want[32], got[32], got1[32], empty[32];
	for (size_t len = bytes; len >= bytes - (1u << 19); len -= 1u << 19) {
		digest_by_hand((const uint8_t *)x, len, want);
		ulp_content_digest(NULL, x, len, got1);
		ulp_content_digest(pool, x, len, got);
		CHECK(!memcmp(want, got1, 32) && !memcmp(want, got, 32), "content digest of %zu bytes as defined", len);
	}
	digest_by_hand(NULL, 0, want);
	ulp_content_digest(NULL, NULL, 0, empty);
	CHECK(!memcmp(want, empty, 32), "content digest of nothing: SHA-256 of 8 zero bytes");
	digest_by_hand((const uint8_t *)x, bytes, want);
	/* chunks of 2 leaves (default), of exactly one (2^19 bf16), of 1/4 leaf */
	unsigned logs[3] = {0, 19, 17};
	for (int i = 0; i < 3; i++) {
		ulp_enc_opts o = {.chunk_log2 = logs[i]};
		blob b1 = enc(&o, NULL, ULP_DT_BF16, x, bytes, r), bp = enc(&o, pool, ULP_DT_BF16, x, bytes, r);
		CHECK(b1.n == bp.n && !memcmp(b1.p, bp.p, b1.n), "chunk 2^%u: same blob on 1 and 3 threads", logs[i]);
		ulp_blob *h;
		REQUIRE(ulp_blob_open(bp.p, bp.n, &h, NULL, 0) == 0, "open");
		CHECK(ulp_blob_get_info(h)->version == 2 && !memcmp(ulp_blob_get_info(h)->content_sha256, want, 32),
		      "chunk 2^%u: v2 names the content digest", logs[i]);
		uint8_t *out = malloc(bytes);
		CHECK(ulp_blob_decode_verify(h, pool, out, bytes, r, bytes) == (int64_t)bytes && !memcmp(out, x, bytes),
		      "chunk 2^%u: decode_verify on 3 threads", logs[i]);
		CHECK(ulp_blob_decode_verify(h, NULL, out, bytes, r, bytes) == (int64_t)bytes, "chunk 2^%u: decode_verify on one",
		      logs[i]);
		ulp_blob_close(h);
		free(out);
		free(b1.p);
		free(bp.p);
	}
	/* a digest that does not match the content: decode passes the chunk
	 * checks, decode_verify and validate catch it */
	uint8_t wrong[32];
	memcpy(wrong, want, 32);
	wrong[7] ^= 1;
	ulp_enc_opts o = {.src_sha256 = wrong};
	blob b = enc(&o, pool, ULP_DT_BF16, x, bytes, r);
	ulp_blob *h;
	REQUIRE(ulp_blob_open(b.p, b.n, &h, NULL, 0) == 0, "open");
	uint8_t *out = malloc(bytes);
	CHECK(ulp_blob_decode(h, pool, out, bytes, r, bytes) == (int64_t)bytes, "wrong digest: plain decode passes");
	CHECK(ulp_blob_decode_verify(h, pool, out, bytes, r, bytes) == -ULP_E_CHECKSUM, "wrong digest: decode_verify fails");
	char err[256] = "";
	CHECK(ulp_blob_validate(b.p, b.n, r, bytes, 1, err, sizeof(err)) == -ULP_E_CHECKSUM && strstr(err, "content digest"),
	      "wrong digest: validate says %s", err);
	ulp_blob_close(h);
	free(b.p);
	/* a reference named by its v1 identity (plain SHA-256), as an archive
	 * of v1 blobs names it: delta and identical blobs of v2 open and decode */
	uint8_t flat[32];
	ulp_sha256(r, bytes, flat);
	ulp_enc_opts of = {.ref_sha256 = flat};
	b = enc(&of, pool, ULP_DT_BF16, x, bytes, r);
	REQUIRE(ulp_blob_open(b.p, b.n, &h, NULL, 0) == 0, "open");
	CHECK(!memcmp(ulp_blob_get_info(h)->ref_sha256, flat, 32) &&
	      ulp_blob_decode_verify(h, pool, out, bytes, r, bytes) == (int64_t)bytes,
	      "v2 delta against a reference named by its v1 sha256");
	ulp_blob_close(h);
	free(b.p);
	b = enc(&of, pool, ULP_DT_BF16, r, bytes, r);
	REQUIRE(ulp_blob_open(b.p, b.n, &h, err, sizeof(err)) == 0, "open ident: %s", err);
	CHECK(ulp_blob_get_info(h)->codec == ULP_CODEC_IDENT &&
	      ulp_blob_decode_verify(h, pool, out, bytes, r, bytes) == (int64_t)bytes && !memcmp(out, r, bytes),
	      "v2 identical blob whose reference has a v1 identity");
	ulp_blob_close(h);
	free(b.p);
	free(out);
	ulp_pool_free(pool);
	free(x);
	free(r);
}

/* ---- streaming encoder ---- */

typedef struct memio {
	const uint8_t *x, *r;
	uint8_t *spill;
	size_t spill_cap;
	unsigned gets;
} memio;

static int m_get(void *arg, uint64_t off, size_t len, uint8_t *src, uint8_t *ref)
{
	memio *m = arg;
	__atomic_add_fetch(&m->gets, 1, __ATOMIC_RELAXED);
	memcpy(src, m->x + off, len);
	if (ref)
		memcpy(ref, m->r + off, len);
	return 0;
}

static int m_put(void *arg, uint64_t off, const void *p, size_t len)
{
	memio *m = arg;
	if (off + len > m->spill_cap)
		return -ULP_E_OVERFLOW;
	memcpy(m->spill + off, p, len);
	return 0;
}

static int m_read(void *arg, uint64_t off, void *p, size_t len)
{
	memio *m = arg;
	if (off + len > m->spill_cap)
		return -ULP_E_OVERFLOW;
	memcpy(p, m->spill + off, len);
	return 0;
}

/* the streamed blob of (x, r) equals ulp_encode's; its codec into *codec */
static int same_streamed(const char *what, ulp_enc_opts o, ulp_pool *pool, ulp_dtype dt, const void *x,
                         size_t bytes, const void *r, size_t window, int *codec)
{
	uint8_t sha[32], rsha[32];
	if (o.format_version == 1) {
		ulp_sha256(x, bytes, sha);
		if (r)
			ulp_sha256(r, bytes, rsha);
	} else {
		ulp_content_digest(NULL, x, bytes, sha);
		if (r)
			ulp_content_digest(NULL, r, bytes, rsha);
	}
	o.src_sha256 = sha;
	o.ref_sha256 = r ? rsha : NULL;
	blob w = enc(&o, pool, dt, x, bytes, r);
	memio m = {x, r, NULL, 0, 0};
	m.spill_cap = 8 * bytes + (1u << 22);
	m.spill = calloc(1, m.spill_cap);
	ulp_senc_io io = {&m, m_get, m_put, m_read};
	ulp_senc s;
	int rc = ulp_encode_stream(&o, pool, dt, bytes, r != NULL, window, &io, &s);
	int same = 0;
	if (rc == 0 && s.blob_len == w.n) {
		uint8_t *b = malloc(w.n);
		/* read back in odd pieces, as pack leaves would cut it */
		same = 1;
		for (size_t off = 0; same && off < w.n; off += 777) {
			size_t l = w.n - off < 777 ? w.n - off : 777;
			same = ulp_senc_read(&s, &io, off, l, b + off) == 0;
		}
		same = same && memcmp(b, w.p, w.n) == 0;
		free(b);
	}
	*codec = rc == 0 ? s.codec : -1;
	CHECK(same, "stream %s: %s, %zu bytes as ulp_encode's (%zu) %s", what, rc < 0 ? ulp_strerror(rc) : "coded",
	   (size_t)s.blob_len, w.n, ulp_codec_name(*codec));
	if (rc == 0)
		ulp_senc_free(&s);
	free(m.spill);
	free(w.p);
	return same;
}

static void test_stream(void)
{
	const size_t n = 5000; /* 5 chunks of 2^10, the last short */
	uint16_t *x = malloc(n * 2), *r = malloc(n * 2), *z = malloc(n * 2);
	uint32_t *xf = malloc(n * 4), *rf = malloc(n * 4);
	ulp_pool *pool;
	int codec;
	REQUIRE(ulp_pool_new(3, &pool) == 0, "pool");
	make_pair(x, r, n);
	for (size_t i = 0; i < n; i++) {
		z[i] = (uint16_t)tap_rand();
		rf[i] = 0x3f800000u + (uint32_t)(tap_rand() % 0x1000000);
		xf[i] = rf[i] + (uint32_t)(tap_rand() % 4001) - 2000;
	}
	ulp_enc_opts o = {.chunk_log2 = 10};
	same_streamed("delta bf16", o, pool, ULP_DT_BF16, x, n * 2, r, 2, &codec);
	CHECK(codec == ULP_CODEC_DELTA, "stream: a close pair is a delta");
	same_streamed("anchor bf16", o, pool, ULP_DT_BF16, x, n * 2, NULL, 3, &codec);
	CHECK(codec == ULP_CODEC_ANCHOR, "stream: no reference: anchor");
	same_streamed("ident", o, pool, ULP_DT_BF16, x, n * 2, x, 2, &codec);
	CHECK(codec == ULP_CODEC_IDENT, "stream: equal to its reference: ident");
	same_streamed("noise against a reference", o, pool, ULP_DT_BF16, z, n * 2, r, 4, &codec);
	same_streamed("noise", o, NULL, ULP_DT_BF16, z, n * 2, NULL, 1, &codec);
	same_streamed("f32 delta", o, pool, ULP_DT_F32, xf, n * 4, rf, 2, &codec);
	same_streamed("i32 (zstd)", o, pool, ULP_DT_I32, xf, n * 4, rf, 2, &codec);
	CHECK(codec == ULP_CODEC_ZSTD_XOR || codec == ULP_CODEC_ZSTD || codec == ULP_CODEC_RAW, "stream: integers: zstd or raw");
	ulp_enc_opts e = {.chunk_log2 = 10, .effort = 1};
	same_streamed("every codec tried", e, pool, ULP_DT_BF16, x, n * 2, r, 3, &codec);
	ulp_enc_opts v1 = {.chunk_log2 = 11, .format_version = 1};
	same_streamed("format v1", v1, pool, ULP_DT_BF16, x, n * 2, r, 0, &codec);
	ulp_enc_opts def = {0};
	same_streamed("default chunks, one chunk", def, pool, ULP_DT_BF16, x, n * 2, r, 0, &codec);
	ulp_pool_free(pool);
	free(x);
	free(r);
	free(z);
	free(xf);
	free(rf);
}

int main(void)
{
	test_stream();
	test_digest();
	test_choice();
	test_threads();
	test_hostile();
	CHECK(ulp_codec_uses_ref(ULP_CODEC_IDENT) && ulp_codec_uses_ref(ULP_CODEC_ZSTD_XOR) &&
	              ulp_codec_uses_ref(ULP_CODEC_DELTA) && !ulp_codec_uses_ref(ULP_CODEC_RAW) &&
	              !ulp_codec_uses_ref(ULP_CODEC_ZSTD) && !ulp_codec_uses_ref(ULP_CODEC_ANCHOR) &&
	              !ulp_codec_uses_ref(-1) && !ulp_codec_uses_ref(ULP_CODEC__COUNT),
	      "ulp_codec_uses_ref: IDENT, ZSTD_XOR and DELTA only");
	return tap_done();
}
