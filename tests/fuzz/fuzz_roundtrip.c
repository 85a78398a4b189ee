/* SPDX-License-Identifier: MIT */
/*
 * fuzz_roundtrip.c - the encoder and decoder together: from the input, a
 * dtype (any of ulp_dtype, opaque bytes included), an element count, a
 * reference (or none: an anchor or a standalone coding) and a target tensor
 * that is either arbitrary or the reference nudged by a few units in the last
 * place; encode it as ingest does, then require:
 *  - encoding succeeds (a forced codec may refuse with -INVAL, nothing else);
 *  - the blob opens and its header names the dtype, the count and the content
 *    digest of its format (v2: ulp_content_digest; v1: SHA-256);
 *  - the whole decode on every CPU path and the chunk-wise decode give back
 *    the target byte for byte;
 *  - ulp_blob_validate(deep) accepts it (chunk checksums and sha256: these
 *    checks are off in fuzzing builds, on in the replay of make check);
 *  - with a pool the blob is byte-identical to the one coded without
 *    (invariant 1 of blob.c).
 * Input: [dtype][flags][count lo][count hi] payload...
 *   flags bit 0: a reference; bits 1-3: 0 choose the codec, x force codec
 *   x - 1; bit 4: effort 1; bit 5: target = reference nudged; bit 6: pass the
 *   digests in (as ingest does); bit 7: also code on a 2-thread pool.
 *   count: elements (0: as many as the payload holds), at most 4095; bit 15
 *   of count: write blob format v1 (plain SHA-256) instead of v2;
 *   chunks are 2^10 elements so that small inputs span several.
 */
#include "fuzz.h"
#include "ulpack.h"
#include <stdlib.h>
#include <string.h>

#define MAX_ELEMS 4095u

/* adds a small signed step to element i's bytes, read as a little-endian integer */
static void nudge(uint8_t *x, unsigned es, int step)
{
	uint64_t v = 0;
	memcpy(&v, x, es); /* little-endian hosts only, like the codec */
	v += (uint64_t)(int64_t)step;
	memcpy(x, &v, es);
}

FUZZ_TARGET(roundtrip)
{
	if (size < 4)
		return 0;
	ulp_dtype dt = (ulp_dtype)(data[0] % ULP_DT__COUNT);
	unsigned flags = data[1], es = ulp_dtype_size(dt);
	size_t n = ((size_t)data[2] | (size_t)data[3] << 8) & MAX_ELEMS;
	unsigned version = data[3] & 0x80 ? 1 : 2;
	const uint8_t *pl = data + 4;
	size_t plen = size - 4;
	if (n == 0)
		n = plen / es;
	size_t bytes = n * es;
	uint8_t *ref = malloc(bytes + 1), *src = malloc(bytes + 1), *out = malloc(bytes + 1);
	for (size_t i = 0; i < bytes; i++) {
		ref[i] = plen ? pl[i % plen] : 0;
		src[i] = plen ? pl[(plen / 2 + i * 7) % plen] : 0;
	}
	int has_ref = flags & 1;
	if (flags & 32)
		for (size_t i = 0; i < n; i++) { /* the reference plus a few ulps */
			memcpy(src + i * es, ref + i * es, es);
			nudge(src + i * es, es, plen ? (int8_t)pl[(i * 3 + 1) % plen] >> (i & 3) : 0);
		}
	uint8_t src_sha[ULP_SHA256_LEN], ref_sha[ULP_SHA256_LEN];
	if (version == 1) {
		ulp_sha256(src, bytes, src_sha);
		ulp_sha256(ref, bytes, ref_sha);
	} else {
		ulp_content_digest(NULL, src, bytes, src_sha);
		ulp_content_digest(NULL, ref, bytes, ref_sha);
	}
	ulp_enc_opts o = {.chunk_log2 = 10, .effort = (flags >> 4) & 1, .format_version = version};
	unsigned forced = (flags >> 1) & 7;
	if (forced)
		o.force_codec = (int)forced; /* codec forced - 1 */
	if (flags & 64) {
		o.src_sha256 = src_sha;
		o.ref_sha256 = has_ref ? ref_sha : NULL;
	}
	size_t cap = ulp_encode_bound(dt, bytes, &o);
	uint8_t *blob = malloc(cap), *blob2 = malloc(cap);
	const uint8_t *r = has_ref ? ref : NULL;
	size_t rlen = has_ref ? bytes : 0;
	ulp_enc_stats st;
	int64_t len = ulp_encode(&o, NULL, dt, blob, cap, src, bytes, r, rlen, &st);
	if (len == -ULP_E_INVAL && forced)
		goto out; /* that codec cannot code this input */
	FUZZ_ASSERT(len > 0 && (size_t)len <= cap && st.codec >= 0 && st.codec < ULP_CODEC__COUNT);
	ulp_pool *pool; /* one per input: a pool kept across inputs would read as a leak */
	if ((flags & 128) && ulp_pool_new(2, &pool) == 0) {
		int64_t len2 = ulp_encode(&o, pool, dt, blob2, cap, src, bytes, r, rlen, NULL);
		ulp_pool_free(pool);
		FUZZ_ASSERT(len2 == len && memcmp(blob, blob2, (size_t)len) == 0);
	}

	ulp_blob *b;
	FUZZ_ASSERT(ulp_blob_open(blob, (size_t)len, &b, NULL, 0) == 0);
	const ulp_blob_info *in = ulp_blob_get_info(b);
	FUZZ_ASSERT(in->dtype == dt && in->n_elems == n && in->raw_bytes == bytes && in->codec == st.codec &&
	            in->version == version);
	FUZZ_ASSERT(memcmp(in->content_sha256, src_sha, ULP_SHA256_LEN) == 0);
	FUZZ_ASSERT(!in->has_ref || has_ref); /* a standalone tensor never needs a reference */
	const uint8_t *dr = in->has_ref ? ref : NULL;
	size_t drlen = in->has_ref ? bytes : 0;
	unsigned paths[3] = {0, ulp_cpu_features() & ULP_CPU_AVX2, ulp_cpu_features()};
	for (int p = 0; p < 3; p++) {
		unsigned old = ulp_set_cpu_mask(paths[p]);
		memset(out, 0xa5, bytes);
		int64_t rc = ulp_blob_decode(b, NULL, out, bytes, dr, drlen);
		ulp_set_cpu_mask(old);
		FUZZ_ASSERT(rc == (int64_t)bytes && memcmp(out, src, bytes) == 0);
	}
	if (in->codec != ULP_CODEC_IDENT) {
		memset(out, 0x5a, bytes);
		for (uint32_t k = 0; k < in->n_chunks; k++) {
			uint64_t off, clen;
			ulp_blob_chunk_range(b, k, &off, &clen);
			FUZZ_ASSERT(off + clen <= bytes);
			int64_t rc = ulp_blob_decode_chunk(b, k, out + off, (size_t)clen, dr ? dr + off : NULL,
			                                   dr ? (size_t)clen : 0);
			FUZZ_ASSERT(rc == (int64_t)clen);
		}
		FUZZ_ASSERT(memcmp(out, src, bytes) == 0);
	}
	FUZZ_ASSERT(ulp_blob_decode_verify(b, NULL, out, bytes, dr, drlen) == (int64_t)bytes);
	ulp_blob_close(b);
	FUZZ_ASSERT(ulp_blob_validate(blob, (size_t)len, dr, drlen, 1, NULL, 0) == 0);
out:
	free(blob);
	free(blob2);
	free(ref);
	free(src);
	free(out);
	return 0;
}
