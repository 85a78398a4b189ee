/* SPDX-License-Identifier: MIT */
/*
 * test_blob.c - the container: codec choice per input kind, byte identity
 * across thread counts, chunked decoding, and hostile blobs: every byte of
 * small blobs flipped and every truncation length give an error, never a
 * crash and never wrong bytes; a wrong reference gives a checksum error.
 */
#include "tap.h"
#include "ulpack.h"
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
		const uint16_t *ref = codec == ULP_CODEC_DELTA || codec == ULP_CODEC_ZSTD_XOR ? r : NULL;
		blob b = enc(&o, NULL, ULP_DT_BF16, x, n * 2, ref);
		CHECK(dec(&b, ref, n * 2, x) == 0, "%s round trip", ulp_codec_name(codec));
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

int main(void)
{
	test_choice();
	test_threads();
	test_hostile();
	return tap_done();
}
