/* SPDX-License-Identifier: MIT */
/*
 * codec.h - the ULPack element transforms and the per-chunk kernels of the
 * DELTA and ANCHOR codecs (ulpack-format(5) sections 4-6).
 */
#ifndef ULP_CODEC_H
#define ULP_CODEC_H

#include "tables.h"

/* How a float dtype is cut into symbol and raw bits. */
typedef struct ulp_fmt {
	unsigned w;        /* element width in bits: 8, 16, 32, 64 */
	unsigned mshift;   /* mantissa bits: the exponent field starts here */
	unsigned ebits;    /* exponent bits: the DELTA context is that field */
	unsigned n_ctx;    /* 2^ebits */
	unsigned alphabet; /* DELTA symbols: 4w - 4 */
	unsigned a_shift;  /* ANCHOR symbol = (u >> a_shift) & (2^a_bits - 1) */
	unsigned a_bits;
} ulp_fmt;

/* Fills f for a float dtype; -INVAL for any other. */
int ulp_fmt_get(ulp_dtype dt, ulp_fmt *f);

/* Decoder view of a table: per context the row's slot array (NULL: unused). */
typedef struct ulp_dtab {
	unsigned prob_bits;
	unsigned n_ctx;
	const uint32_t **row; /* n_ctx entries, pointing into slots */
	uint32_t *slots;      /* owned */
	uint8_t nraw[256];    /* DELTA: raw-tail bits of each symbol */
	uint64_t base[256];   /* DELTA: z with its raw tail zeroed */
} ulp_dtab;

int ulp_dtab_build(const ulp_table *t, ulp_dtab *out);
void ulp_dtab_free(ulp_dtab *d);

/* Pass 1: symbols of n elements into syms, counts[ctx * alphabet + sym]++.
 * ANCHOR uses context 0 and alphabet 2^a_bits. */
void ulp_delta_symbols(const ulp_fmt *f, const void *src, const void *ref, size_t n,
                       uint8_t *syms, uint64_t *counts);
void ulp_anchor_symbols(const ulp_fmt *f, const void *src, size_t n, uint8_t *syms,
                        uint64_t *counts);
/* Raw-tail bits of the elements counted in counts (DELTA). */
uint64_t ulp_delta_raw_bits(const ulp_fmt *f, const uint64_t *counts);

/* Bytes a chunk's rANS part and raw part may need at most. */
size_t ulp_chunk_rans_bound(size_t n, unsigned lanes);
size_t ulp_chunk_raw_bound(const ulp_fmt *f, size_t n);

/*
 * Pass 2: codes one chunk. rANS part ([lanes x u32 states][u16 words]) into
 * rans_dst, raw tail into raw_dst. ref is NULL for ANCHOR.
 */
int ulp_chunk_encode(const ulp_fmt *f, const ulp_table *t, const ulp_rans_esym *es,
                     unsigned lanes, const uint8_t *syms, const void *src, const void *ref,
                     size_t n, uint8_t *rans_dst, size_t rans_cap, size_t *rans_len,
                     uint8_t *raw_dst, size_t raw_cap, uint64_t *raw_bits);

/* Decodes one chunk into dst (n elements); every stream is bounds-checked. */
int ulp_chunk_decode(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, const uint8_t *rans,
                     size_t rans_len, const uint8_t *raw, size_t raw_len, uint64_t raw_bits,
                     const void *ref, size_t n, void *dst, ulp_err *err);

#endif
