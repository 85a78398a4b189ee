/* SPDX-License-Identifier: MIT */
/*
 * fuzz_blob.c - the blob decoder on hostile input. Any input: open it, decode
 * it whole and chunk by chunk against a reference derived from the input,
 * on every CPU path. Consistency on success: chunk-wise and whole decodes
 * agree, every path produces the same bytes, and the content digest check
 * (v1: SHA-256, v2: the tree of ulpack-format(5) 2.4) decodes the same.
 * (Fuzzing builds skip the header and chunk checks so the fuzzer can reach
 * the parsers and decoders behind them; see ULP_FUZZING in blob.c.)
 */
#include "fuzz.h"
#include "ulpack.h"
#include <stdlib.h>
#include <string.h>

#define MAX_RAW (8u << 20)

FUZZ_TARGET(blob)
{
	ulp_blob *b;
	if (ulp_blob_open(data, size, &b, NULL, 0) < 0)
		return 0;
	const ulp_blob_info *in = ulp_blob_get_info(b);
	if (in->raw_bytes > MAX_RAW) {
		ulp_blob_close(b);
		return 0;
	}
	size_t n = (size_t)in->raw_bytes;
	uint8_t *ref = malloc(n + 1), *out = malloc(n + 1), *out2 = malloc(n + 1);
	for (size_t i = 0; i < n; i++)
		ref[i] = size ? data[i % size] : 0;
	unsigned paths[3] = {0, ulp_cpu_features() & ULP_CPU_AVX2, ulp_cpu_features()};
	int first_rc = 0;
	for (int p = 0; p < 3; p++) {
		unsigned old = ulp_set_cpu_mask(paths[p]);
		int64_t rc = ulp_blob_decode(b, NULL, p ? out2 : out, n, in->has_ref ? ref : NULL,
		                             in->has_ref ? n : 0);
		ulp_set_cpu_mask(old);
		if (p == 0)
			first_rc = rc < 0 ? (int)rc : 0;
		else
			FUZZ_ASSERT((rc < 0) == (first_rc < 0)); /* every path agrees */
		if (p > 0 && rc >= 0)
			FUZZ_ASSERT(memcmp(out, out2, n) == 0);
	}
	if (first_rc == 0 && in->codec != ULP_CODEC_IDENT) {
		for (uint32_t k = 0; k < in->n_chunks; k++) {
			uint64_t off, len;
			ulp_blob_chunk_range(b, k, &off, &len);
			int64_t rc = ulp_blob_decode_chunk(b, k, out2 + off, (size_t)len,
			                                   in->has_ref ? ref + off : NULL, in->has_ref ? (size_t)len : 0);
			FUZZ_ASSERT(rc == (int64_t)len && memcmp(out + off, out2 + off, (size_t)len) == 0);
		}
	}
	if (first_rc == 0) { /* the digest check (v1 or v2) decodes the same bytes or reports CHECKSUM */
		int64_t rc = ulp_blob_decode_verify(b, NULL, out2, n, in->has_ref ? ref : NULL, in->has_ref ? n : 0);
		FUZZ_ASSERT(rc == (int64_t)n || rc == -ULP_E_CHECKSUM);
		FUZZ_ASSERT(memcmp(out, out2, n) == 0);
	}
	free(ref);
	free(out);
	free(out2);
	ulp_blob_close(b);
	return 0;
}
