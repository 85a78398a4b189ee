/* SPDX-License-Identifier: MIT */
/*
 * diff.h - the comparison of two contents of a tensor (archive/diff.c, its
 * AVX2 scan diff_avx2.c), for ulpack diff and dynamics --norms (dynamics.c).
 */
#ifndef ULP_DIFF_H
#define ULP_DIFF_H

#include "arch_int.h"

/* diff.c: one pair of contents of a tensor (the same dtype and length) to
 * compare, decoded through the cache a chunk pair at a time. */
typedef struct ulp_pair {
	const uint8_t *sha_a, *sha_b; /* content identities (ULP_SHA256_LEN bytes) */
	int dtype;                    /* ulp_dtype */
	uint64_t length;              /* bytes of each */
	const char *name;             /* the tensor's, for messages */
	ulp_tensor_diff *out;         /* its figures (out->name left alone) */
	int rc;                       /* ulp_diff_pairs: its error, 0 */
	char msg[256];                /* and the error's message */
} ulp_pair;
/* What a scan of elements gives (diff.c; its sums added in piece order). */
typedef struct ulp_scan_out {
	uint64_t changed, emoves;
	uint64_t mind, maxd;   /* smallest and largest nonzero distance (mind > maxd: none) */
	double sa, sd;         /* sum of a^2, of (b - a)^2 */
} ulp_scan_out;
/* diff_avx2.c (where built and ulp_use_avx2()): the scan of diff.c's
 * 128-bit kernel for bf16 (f32 0) or f32, 8 elements at a time, of the
 * first n rounded down to 8 elements, into o (mind left alone) and h (keys
 * of every distance; h[0] is used and left 0); @return the elements done. */
size_t ulp_diff_scan_avx2(int f32, const uint8_t *pa, const uint8_t *pb, size_t n, unsigned mb, uint32_t em,
                          ulp_scan_out *o, uint32_t *h);
/* The figures of the n pairs of v, in parallel on a's pool (each the same
 * whatever the threads). Errors: the first failing pair's (by index),
 * with its message: NOMEM, IO, CORRUPT, CHECKSUM, NOENT. */
int ulp_diff_pairs(ulp_archive *a, ulp_pair *v, size_t n);

#endif
