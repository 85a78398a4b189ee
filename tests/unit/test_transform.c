/* SPDX-License-Identifier: MIT */
/*
 * test_transform.c - the ULP transform is exact for every bit pattern:
 * every 16-bit pattern (BF16, F16) against 64+ references including signed
 * zeros, infinities, NaNs with payloads, subnormals and extremes; every 8-bit
 * pair (F8_E4M3, F8_E5M2); randomized 32- and 64-bit with the same edge sets.
 * Each case runs through DELTA and ANCHOR blobs (forced) with 4, 8 and 32 rANS
 * lanes: encoded on every CPU path (scalar reference, AVX2, AVX-512, NEON where
 * the CPU has them), which must all write the scalar path's bytes, then decoded
 * on every path.
 */
#include "tap.h"
#include "ulpack.h"
#include <string.h>

/* the scalar reference and each SIMD path (skipped where the CPU lacks it) */
static const unsigned masks[] = {0, ULP_CPU_AVX2, ULP_CPU_AVX2 | ULP_CPU_AVX512, ULP_CPU_NEON};

static int have_path(unsigned m)
{
	return !m || (ulp_cpu_features() & m) == m;
}

static int roundtrip(ulp_dtype dt, const void *x, const void *r, size_t bytes, int codec,
                     unsigned chunk_log2)
{
	ulp_enc_opts o = {.chunk_log2 = chunk_log2, .force_codec = codec + 1};
	size_t cap = ulp_encode_bound(dt, bytes, &o);
	uint8_t *blob = malloc(cap), *blob2 = malloc(cap), *out = malloc(bytes ? bytes : 1);
	int ok = 0;
	/* the scalar reference encodes; every other path must write the same bytes */
	unsigned old0 = ulp_set_cpu_mask(0);
	int64_t n = ulp_encode(&o, NULL, dt, blob, cap, x, bytes, codec == ULP_CODEC_DELTA ? r : NULL,
	                       codec == ULP_CODEC_DELTA ? bytes : 0, NULL);
	ulp_set_cpu_mask(old0);
	int same = 1;
	for (int m = 1; m < 4 && n > 0; m++) {
		if (!have_path(masks[m]))
			continue;
		unsigned old = ulp_set_cpu_mask(masks[m]);
		int64_t n2 = ulp_encode(&o, NULL, dt, blob2, cap, x, bytes, codec == ULP_CODEC_DELTA ? r : NULL,
		                        codec == ULP_CODEC_DELTA ? bytes : 0, NULL);
		ulp_set_cpu_mask(old);
		if (n2 != n || memcmp(blob, blob2, (size_t)n) != 0) {
			fprintf(stderr, "encoder bytes differ on cpu mask %u\n", masks[m]);
			same = 0;
		}
	}
	if (n > 0) {
		char err[200] = "";
		ulp_blob *b;
		if (ulp_blob_open(blob, (size_t)n, &b, err, sizeof(err)) == 0) {
			ok = same && ulp_blob_get_info(b)->codec == codec;
			/* every CPU path decodes it */
			for (int m = 0; m < 4; m++) {
				if (!have_path(masks[m]))
					continue;
				unsigned old = ulp_set_cpu_mask(masks[m]);
				memset(out, 0, bytes);
				int64_t d = ulp_blob_decode(b, NULL, out, bytes, codec == ULP_CODEC_DELTA ? r : NULL,
				                            codec == ULP_CODEC_DELTA ? bytes : 0);
				ulp_set_cpu_mask(old);
				ok = ok && d == (int64_t)bytes && memcmp(out, x, bytes) == 0;
			}
			ulp_blob_close(b);
		} else {
			fprintf(stderr, "open: %s\n", err);
		}
	}
	free(blob);
	free(blob2);
	free(out);
	return ok;
}

static void edges16(ulp_dtype dt, uint16_t *e, size_t *n)
{
	int bf = dt == ULP_DT_BF16;
	uint16_t list[] = {
		0x0000, 0x8000,                               /* +0, -0 */
		bf ? 0x7f80 : 0x7c00, bf ? 0xff80 : 0xfc00,   /* +-inf */
		bf ? 0x7fc0 : 0x7e00, bf ? 0xffc0 : 0xfe00,   /* quiet NaNs */
		bf ? 0x7f81 : 0x7c01, bf ? 0x7fbf : 0x7dff,   /* signalling NaNs with payloads */
		bf ? 0xffd5 : 0xfe55, 0x7fff, 0xffff,          /* payload NaNs */
		0x0001, 0x8001,                               /* smallest subnormals */
		bf ? 0x007f : 0x03ff, bf ? 0x807f : 0x83ff,   /* largest subnormals */
		bf ? 0x0080 : 0x0400, bf ? 0x8080 : 0x8400,   /* smallest normals */
		bf ? 0x7f7f : 0x7bff, bf ? 0xff7f : 0xfbff,   /* largest finite */
		bf ? 0x3f80 : 0x3c00, bf ? 0xbf80 : 0xbc00,   /* +-1 */
		bf ? 0x3c23 : 0x211f, bf ? 0xbc23 : 0xa11f,   /* typical weights (~0.01) */
	};
	memcpy(e, list, sizeof(list));
	*n = sizeof(list) / sizeof(list[0]);
}

static void test16(ulp_dtype dt)
{
	const size_t n = 65536;
	uint16_t *x = malloc(n * 2), *r = malloc(n * 2);
	uint16_t refs[80];
	size_t nr;
	edges16(dt, refs, &nr);
	while (nr < 68)
		refs[nr++] = (uint16_t)tap_rand();
	for (size_t i = 0; i < n; i++)
		x[i] = (uint16_t)i;
	for (size_t k = 0; k < nr; k++) {
		for (size_t i = 0; i < n; i++)
			r[i] = refs[k];
		CHECK(roundtrip(dt, x, r, n * 2, ULP_CODEC_DELTA, (k & 1) ? 20 : 12),
		      "%s delta, all patterns vs %#06x", ulp_dtype_name(dt), refs[k]);
	}
	/* varied references: per element, mixing edges and random, and x near r */
	for (int v = 0; v < 4; v++) {
		for (size_t i = 0; i < n; i++) {
			r[i] = (tap_rand() & 3) ? (uint16_t)tap_rand() : refs[tap_rand() % nr];
			if (v & 1)
				x[i] = (uint16_t)(r[i] + (int)(tap_rand() % 9) - 4);
			else
				x[i] = (uint16_t)i;
		}
		CHECK(roundtrip(dt, x, r, n * 2, ULP_CODEC_DELTA, v < 2 ? 10 : 20),
		      "%s delta, varied references %d", ulp_dtype_name(dt), v);
	}
	for (size_t i = 0; i < n; i++)
		x[i] = (uint16_t)i;
	CHECK(roundtrip(dt, x, NULL, n * 2, ULP_CODEC_ANCHOR, 12), "%s anchor, all patterns",
	      ulp_dtype_name(dt));
	CHECK(roundtrip(dt, x, NULL, n * 2, ULP_CODEC_ANCHOR, 20), "%s anchor, 32 lanes",
	      ulp_dtype_name(dt));
	free(x);
	free(r);
}

static void test8(ulp_dtype dt)
{
	const size_t n = 65536;
	uint8_t *x = malloc(n), *r = malloc(n);
	for (size_t i = 0; i < n; i++) {
		x[i] = (uint8_t)i;
		r[i] = (uint8_t)(i >> 8);
	}
	CHECK(roundtrip(dt, x, r, n, ULP_CODEC_DELTA, 10), "%s every pair", ulp_dtype_name(dt));
	for (size_t i = 0; i < n; i++) { /* the same pairs, shuffled across contexts */
		size_t j = tap_rand() % (i + 1);
		uint8_t tx = x[i], tr = r[i];
		x[i] = x[j], r[i] = r[j];
		x[j] = tx, r[j] = tr;
	}
	CHECK(roundtrip(dt, x, r, n, ULP_CODEC_DELTA, 20), "%s every pair, shuffled", ulp_dtype_name(dt));
	CHECK(roundtrip(dt, x, NULL, n, ULP_CODEC_ANCHOR, 20), "%s anchor", ulp_dtype_name(dt));
	free(x);
	free(r);
}

static void test32(void)
{
	const uint32_t edges[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
	                          0xffc00001u, 0x7f800001u, 0x7fffffffu, 0xffffffffu, 1, 0x80000001u,
	                          0x007fffffu, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu,
	                          0x3f800000u, 0xbf800000u, 0x3c23d70au};
	const size_t ne = sizeof(edges) / sizeof(edges[0]), n = 1 << 16;
	uint32_t *x = malloc(n * 4), *r = malloc(n * 4);
	for (int round = 0; round < 12; round++) {
		for (size_t i = 0; i < n; i++) {
			uint64_t t = tap_rand();
			r[i] = (t & 3) == 0 ? edges[t % ne] : (uint32_t)tap_rand();
			switch (round % 4) {
			case 0: x[i] = (uint32_t)tap_rand(); break;
			case 1: x[i] = r[i] + (uint32_t)((int)(tap_rand() % 2001) - 1000); break;
			case 2: x[i] = edges[tap_rand() % ne]; break;
			default: x[i] = r[i] ^ (uint32_t)(tap_rand() & 0xff); break;
			}
		}
		CHECK(roundtrip(ULP_DT_F32, x, r, n * 4, ULP_CODEC_DELTA, round < 6 ? 12 : 20),
		      "f32 delta round %d", round);
		CHECK(roundtrip(ULP_DT_F32, x, NULL, n * 4, ULP_CODEC_ANCHOR, 14), "f32 anchor round %d",
		      round);
	}
	free(x);
	free(r);
}

static void test64(void)
{
	const uint64_t edges[] = {0, 1ull << 63, 0x7ff0000000000000ull, 0xfff0000000000000ull,
	                          0x7ff8000000000000ull, 0x7ff0000000000001ull, ~0ull, 1,
	                          0x000fffffffffffffull, 0x0010000000000000ull, 0x7fefffffffffffffull,
	                          0x3ff0000000000000ull, 0xbff0000000000000ull};
	const size_t ne = sizeof(edges) / sizeof(edges[0]), n = 1 << 14;
	uint64_t *x = malloc(n * 8), *r = malloc(n * 8);
	for (int round = 0; round < 8; round++) {
		for (size_t i = 0; i < n; i++) {
			uint64_t t = tap_rand();
			r[i] = (t & 3) == 0 ? edges[t % ne] : tap_rand();
			switch (round % 4) {
			case 0: x[i] = tap_rand(); break;
			case 1: x[i] = r[i] + (uint64_t)((int64_t)(tap_rand() % 200001) - 100000); break;
			case 2: x[i] = edges[tap_rand() % ne]; break;
			default: x[i] = r[i] ^ (tap_rand() >> (tap_rand() & 63)); break;
			}
		}
		CHECK(roundtrip(ULP_DT_F64, x, r, n * 8, ULP_CODEC_DELTA, round < 4 ? 10 : 20),
		      "f64 delta round %d", round);
		CHECK(roundtrip(ULP_DT_F64, x, NULL, n * 8, ULP_CODEC_ANCHOR, 12), "f64 anchor round %d",
		      round);
	}
	free(x);
	free(r);
}

int main(void)
{
	test16(ULP_DT_BF16);
	test16(ULP_DT_F16);
	test8(ULP_DT_F8_E4M3);
	test8(ULP_DT_F8_E5M2);
	test32();
	test64();
	return tap_done();
}
