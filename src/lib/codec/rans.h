/* SPDX-License-Identifier: MIT */
/*
 * rans.h - static interleaved rANS with 32-bit states and 16-bit renormalization,
 * and the LSB-first bit writer of the raw tail (the decoder reads the tail by
 * bit position: codec.c, raw_bits_at).
 *
 * READ ME FIRST (ulpack-format(5) section 5):
 *  - A state x lives in [ULP_RANS_L, ULP_RANS_L << 16) between symbols; the
 *    probability precision n is at most ULP_PROB_BITS_MAX (12), so one 16-bit
 *    word always suffices to renormalize.
 *  - Element i of a chunk belongs to lane i mod NL (NL = 1..32 lanes).
 *  - The encoder runs from the last element to the first. For each element it
 *    first renormalizes (pushing 16-bit words to the FRONT of the stream),
 *    then folds the symbol into the lane's state. At the end it writes the NL
 *    states, lane 0 first, as u32 LE in front of the words.
 *  - The decoder reads the NL states, then for element 0, 1, 2, ... decodes
 *    the symbol from its lane's state and, if the state fell below
 *    ULP_RANS_L, pulls the next u16 LE word. Words are thus consumed in the
 *    exact reverse of the order they were produced.
 *  - After the last element every state must be exactly ULP_RANS_L (the
 *    encoder's starting state) and every word must have been consumed: both
 *    are checked, so a damaged stream is detected even before the checksum.
 */
#ifndef ULP_RANS_H
#define ULP_RANS_H

#include "ulp_int.h"

#define ULP_RANS_L (1u << 15)
#define ULP_PROB_BITS_MIN 6
#define ULP_PROB_BITS_MAX 12
#define ULP_LANES_MAX 32

/*
 * Encoder view of one symbol (32 bytes, so that SIMD code gathers its fields
 * with a stride of 8 words). The fold x -> ((x / f) << n) + (x % f) + cum is
 * computed as x + bias + q * cmpl with q = floor(x / f) from a 32-bit
 * reciprocal: for 2^(lg-1) < f <= 2^lg (f >= 2), rcp = ceil(2^(31+lg) / f)
 * < 2^32 and q = (x * rcp) >> (31 + lg), exact for every x < 2^31; then
 * x + cum + q (2^n - f) = (q << n) + (x - q f) + cum. For f = 1, rcp = 2^32 - 1
 * gives q = x - 1 (x >= 1) and bias = cum + 2^n - 1 makes up for it.
 */
typedef struct ulp_rans_esym {
	uint32_t x_max;   /* renormalize while x >= x_max */
	uint32_t rcp;     /* reciprocal of f, above */
	uint32_t rshift;  /* lg - 1, or 0 for f = 1 */
	uint32_t bias;    /* cum, or cum + 2^n - 1 for f = 1 */
	uint32_t cmpl;    /* 2^n - f */
	uint32_t freq;    /* f, 1..2^n */
	uint32_t cum;     /* start of the symbol's slot range */
	uint32_t pad;
} ulp_rans_esym;

static inline void ulp_rans_esym_init(ulp_rans_esym *s, uint32_t cum, uint32_t freq, unsigned n)
{
	unsigned lg = 0;
	while ((1u << lg) < freq)
		lg++;
	s->x_max = ((ULP_RANS_L >> n) << 16) * freq;
	s->freq = freq;
	s->cum = cum;
	s->cmpl = (1u << n) - freq;
	s->pad = 0;
	if (freq < 2) {
		s->rcp = ~0u;
		s->rshift = 0;
		s->bias = cum + (1u << n) - 1;
	} else {
		s->rcp = (uint32_t)((((uint64_t)1 << (31 + lg)) + freq - 1) / freq);
		s->rshift = lg - 1;
		s->bias = cum;
	}
}

/* Folds a symbol into state *x (precision n is implied by the tables),
 * first writing a renormalization word below *pp (the stream grows towards
 * lower addresses). */
static inline void ulp_rans_enc_put(uint32_t *x, uint16_t **pp, const ulp_rans_esym *s, unsigned n)
{
	(void)n;
	uint32_t v = *x;
	uint32_t nw = v >= s->x_max; /* branch-free: the store below p is harmless */
	(*pp)[-1] = (uint16_t)v;
	*pp -= nw;
	v >>= nw << 4;
	uint32_t q = (uint32_t)(((uint64_t)v * s->rcp) >> 32) >> s->rshift;
	*x = v + s->bias + q * s->cmpl;
}

/* ---- raw-tail bit writer (LSB-first) ---- */
typedef struct ulp_bitw {
	uint8_t *p, *end;
	uint64_t acc;
	unsigned fill; /* bits in acc, < 64 */
	int overflow;
} ulp_bitw;

static inline void ulp_bitw_init(ulp_bitw *w, uint8_t *p, uint8_t *end)
{
	w->p = p; w->end = end; w->acc = 0; w->fill = 0; w->overflow = 0;
}

/* v < 2^n, n <= 56. Branch-free: always stores 8 bytes at p, so the buffer
 * must extend 8 bytes past the last whole byte written (ulp_chunk_raw_bound). */
static ULP_FORCE_INLINE void ulp_bitw_put(ulp_bitw *w, uint64_t v, unsigned n)
{
	w->acc |= v << w->fill; /* fill < 8 */
	w->fill += n;
	ulp_st64(w->p, w->acc);
	w->p += w->fill >> 3;
	w->acc >>= w->fill & ~7u;
	w->fill &= 7;
}

static ULP_FORCE_INLINE void ulp_bitw_put64(ulp_bitw *w, uint64_t v, unsigned n)
{
	if (n > 32) {
		ulp_bitw_put(w, v & 0xffffffffu, 32);
		ulp_bitw_put(w, v >> 32, n - 32);
	} else {
		ulp_bitw_put(w, v, n);
	}
}

/* Flushes the partial bytes; returns bytes written or -1 on overflow. */
static inline int64_t ulp_bitw_finish(ulp_bitw *w, uint8_t *start)
{
	while (w->fill > 0) {
		if (w->p >= w->end) {
			w->overflow = 1;
			break;
		}
		*w->p++ = (uint8_t)w->acc;
		w->acc >>= 8;
		w->fill = w->fill >= 8 ? w->fill - 8 : 0;
	}
	return w->overflow ? -1 : (int64_t)(w->p - start);
}

#endif
