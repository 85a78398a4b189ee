/* SPDX-License-Identifier: MIT */
/*
 * rans_avx2.c - AVX2 kernels, compiled alone with -mavx2 -mbmi2 and chosen at
 * run time (ULP_CPU_AVX2): the decoder's rANS symbol pass (pass A of codec.c)
 * and its 16/32-bit DELTA and ANCHOR reconstruction (pass B), the encoder's
 * 16-bit pass 1 and its rANS pass. Each has the scalar reference of codec.c
 * beside it and gives exactly its result (bytes and symbols).
 *
 * Symbol pass: 8 to 32 lanes as one to four vectors of eight states, each
 * in its own register; for eight
 * consecutive elements (eight consecutive lanes) it takes each element's
 * row offset (looked up for the whole call beforehand, 32 contexts at a
 * time by byte shuffles of d->rowb), loads the slot
 * entries, updates the states, and renormalizes the lanes that fell below
 * 2^15 from the next words, which go to those lanes in lane order (the
 * scalar order), spread by a permutation looked up from the lane mask.
 * With 8 lanes the one vector is one serial chain of about 40 cycles a
 * step: 16-bit DELTA then runs the previous block's reconstruction (a
 * ulp_rb16_job) beside the chain, work that would otherwise be another
 * pass over the block.
 * Table lookups are scalar loads, not AVX2 gathers: gathers are slower on
 * Zen 2/3, the AVX2-only CPUs this path is for (measured on an EPYC: an
 * 8-wide gather of independent indices costs 2.3x eight scalar loads).
 *
 * Invariants (callers guarantee):
 *  1. lanes is 8, 16 or 32 and n is a multiple of lanes, at most 2048.
 *  2. The word stream holds at least 2 n bytes from *wp, so every 16-byte
 *     load of words stays inside it.
 *  3. d->row_off[c] is row * 2^prob_bits for used contexts, -1 otherwise;
 *     an element with an unused context stops the kernel, which then
 *     returns SIZE_MAX and leaves x and *wpp untouched.
 */
#include "codec.h"
#include <immintrin.h>

/* perm[m]: for each lane j set in m, the index of its word (popcount of the
 * lanes below j in m); lanes not in m take index 0 (blended away). */
static uint32_t perm[256][8];

__attribute__((constructor)) static void init_perm(void)
{
	for (unsigned m = 0; m < 256; m++) {
		unsigned k = 0;
		for (unsigned j = 0; j < 8; j++)
			perm[m][j] = (m >> j & 1) ? k++ : 0;
	}
}

/* Eight table entries t[ix[k]], loaded one by one: on Zen 2/3 an AVX2 gather
 * is slower than eight scalar loads with the moves around them, both in
 * throughput and in latency (measured on an AVX2-only EPYC). */
static inline __m256i lookup8(const int *t, __m256i ix)
{
	__m128i lo = _mm256_castsi256_si128(ix), hi = _mm256_extracti128_si256(ix, 1);
	uint64_t a = (uint64_t)_mm_cvtsi128_si64(lo), b = (uint64_t)_mm_extract_epi64(lo, 1);
	uint64_t c = (uint64_t)_mm_cvtsi128_si64(hi), d = (uint64_t)_mm_extract_epi64(hi, 1);
	__m128i r0 = _mm_cvtsi32_si128(t[(uint32_t)a]);
	r0 = _mm_insert_epi32(r0, t[a >> 32], 1);
	r0 = _mm_insert_epi32(r0, t[(uint32_t)b], 2);
	r0 = _mm_insert_epi32(r0, t[b >> 32], 3);
	__m128i r1 = _mm_cvtsi32_si128(t[(uint32_t)c]);
	r1 = _mm_insert_epi32(r1, t[c >> 32], 1);
	r1 = _mm_insert_epi32(r1, t[(uint32_t)d], 2);
	r1 = _mm_insert_epi32(r1, t[d >> 32], 3);
	return _mm256_inserti128_si256(_mm256_castsi128_si256(r0), r1, 1);
}

/* The zigzag values z (32-bit lanes) of eight 16-bit DELTA elements from
 * their symbols and bit p of raw (p / 8 + 16 <= raw_len); *np gets p after
 * their raw bits. */
static ULP_FORCE_INLINE __m256i rb16_z8(const uint8_t *syms, const uint8_t *raw,
                                        uint64_t p, uint64_t *np)
{
	const __m256i one = _mm256_set1_epi32(1), three = _mm256_set1_epi32(3),
	              four = _mm256_set1_epi32(4), seven = _mm256_set1_epi32(7),
	              zero = _mm256_setzero_si256(), b0123 = _mm256_set1_epi32(0x03020100),
	              bcast = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
	                                       0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
	const __m256i hi_half = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
	__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(syms)));
	__m256i nr = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(s, 2), one), zero);
	/* exclusive prefix sum of nr across the eight lanes */
	__m256i inc = _mm256_add_epi32(nr, _mm256_slli_si256(nr, 4));
	inc = _mm256_add_epi32(inc, _mm256_slli_si256(inc, 8));
	inc = _mm256_add_epi32(inc, _mm256_and_si256(hi_half, _mm256_permutevar8x32_epi32(inc, _mm256_set1_epi32(3))));
	__m256i exc = _mm256_sub_epi32(inc, nr);
	uint32_t total = (uint32_t)_mm256_extract_epi32(inc, 7);
	__m256i bitpos = _mm256_add_epi32(_mm256_set1_epi32((int)(p & 7)), exc);
	__m256i win = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(raw + p / 8)));
	__m256i ctrl = _mm256_add_epi8(_mm256_shuffle_epi8(_mm256_srli_epi32(bitpos, 3), bcast), b0123);
	__m256i bits = _mm256_srlv_epi32(_mm256_shuffle_epi8(win, ctrl), _mm256_and_si256(bitpos, seven));
	__m256i rmask = _mm256_sub_epi32(_mm256_sllv_epi32(one, nr), one);
	__m256i lead = _mm256_or_si256(four, _mm256_and_si256(s, three));
	__m256i base = _mm256_blendv_epi8(_mm256_sllv_epi32(lead, nr), s, _mm256_cmpgt_epi32(four, s));
	*np = p + total;
	return _mm256_or_si256(base, _mm256_and_si256(bits, rmask));
}

/* x = phi_inv(phi(r) + unzigzag(z)) of 16 elements in 16-bit lanes (z and
 * r in element order): phi(r) = r ^ (0xffff or 0x8000 by r's sign), the sum
 * wraps mod 2^16, phi_inv(k) = k ^ (0x8000 or 0xffff by k's top bit). */
static ULP_FORCE_INLINE __m256i rb16_x16(__m256i z, __m256i r)
{
	const __m256i one = _mm256_set1_epi16(1), h = _mm256_set1_epi16((short)0x8000),
	              zero = _mm256_setzero_si256(), ffff = _mm256_set1_epi16(-1);
	__m256i d = _mm256_xor_si256(_mm256_srli_epi16(z, 1), _mm256_sub_epi16(zero, _mm256_and_si256(z, one)));
	__m256i phir = _mm256_xor_si256(r, _mm256_or_si256(_mm256_srai_epi16(r, 15), h));
	__m256i key = _mm256_add_epi16(phir, d);
	return _mm256_xor_si256(key, _mm256_or_si256(_mm256_xor_si256(_mm256_srai_epi16(key, 15), ffff), h));
}

/* Eight 16-bit DELTA elements of ulp_rebuild16_avx2 from bit p of raw
 * (p / 8 + 16 <= raw_len); returns p after their raw bits. */
static ULP_FORCE_INLINE uint64_t rb16_8(const uint8_t *syms, const uint16_t *ref,
                                        const uint8_t *raw, uint64_t p, uint16_t *out)
{
	uint64_t np;
	__m256i z = rb16_z8(syms, raw, p, &np);
	__m128i z16 = _mm_packus_epi32(_mm256_castsi256_si128(z), _mm256_extracti128_si256(z, 1));
	__m128i r = _mm_loadu_si128((const __m128i *)ref);
	_mm_storeu_si128((__m128i *)out, _mm256_castsi256_si128(rb16_x16(_mm256_castsi128_si256(z16),
	                                                                 _mm256_castsi128_si256(r))));
	return np;
}

/* Sixteen of them: the arithmetic after z once for both groups of eight. */
static ULP_FORCE_INLINE uint64_t rb16_16(const uint8_t *syms, const uint16_t *ref,
                                         const uint8_t *raw, uint64_t p, uint16_t *out)
{
	uint64_t p1, p2;
	__m256i za = rb16_z8(syms, raw, p, &p1);
	__m256i zb = rb16_z8(syms + 8, raw, p1, &p2);
	/* packus per 128-bit half: a0-3 b0-3 | a4-7 b4-7, then in order */
	__m256i z16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(za, zb), 0xD8);
	__m256i r = _mm256_loadu_si256((const __m256i *)ref);
	_mm256_storeu_si256((__m256i *)out, rb16_x16(z16, r));
	return p2;
}

/* 16-entry pieces of a 256-entry byte table of rows by context: the
 * pieces some context of mask hi (bit h: contexts 16h..16h+15) uses. */
typedef struct rowlut {
	__m128i lut[16];
	__m256i hsel[16];
	unsigned nh;
} rowlut;

static void rowlut_init(rowlut *L, const uint8_t *rowb, unsigned hi)
{
	L->nh = 0;
	for (unsigned h = 0; h < 16; h++)
		if (hi >> h & 1) {
			L->lut[L->nh] = _mm_loadu_si128((const __m128i *)(rowb + 16 * h));
			L->hsel[L->nh++] = _mm256_set1_epi8((char)h);
		}
}

/* The rows (bytes, in element order) of elements i..i + 31 from their
 * references' contexts (16 or 32 bits): the contexts as bytes, looked up by
 * byte shuffles of the used pieces; a context outside them gets none. */
static inline __m256i ctx_rows32(const ulp_fmt *f, const void *ref, size_t i, const rowlut *L,
                                 __m256i none)
{
	const __m128i shv = _mm_cvtsi32_si128((int)f->mshift);
	const __m256i lo4 = _mm256_set1_epi8(0x0f);
	__m256i cb;
	if (f->w == 16) {
		const uint16_t *r = (const uint16_t *)ref + i;
		const __m256i em = _mm256_set1_epi16((short)((1u << f->ebits) - 1));
		__m256i a = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)r), shv), em);
		__m256i b = _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(r + 16)), shv), em);
		cb = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
	} else {
		const uint32_t *r = (const uint32_t *)ref + i;
		const __m256i em = _mm256_set1_epi32((int)((1u << f->ebits) - 1));
		__m256i c0 = _mm256_and_si256(_mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)r), shv), em);
		__m256i c1 = _mm256_and_si256(_mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)(r + 8)), shv), em);
		__m256i c2 = _mm256_and_si256(_mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)(r + 16)), shv), em);
		__m256i c3 = _mm256_and_si256(_mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)(r + 24)), shv), em);
		__m256i p01 = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
		__m256i p23 = _mm256_permute4x64_epi64(_mm256_packus_epi32(c2, c3), 0xD8);
		cb = _mm256_permute4x64_epi64(_mm256_packus_epi16(p01, p23), 0xD8);
	}
	__m256i lo = _mm256_and_si256(cb, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(cb, 4), lo4);
	__m256i rows = none;
	for (unsigned k = 0; k < L->nh; k++)
		rows = _mm256_blendv_epi8(rows, _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(L->lut[k]), lo),
		                          _mm256_cmpeq_epi8(hi, L->hsel[k]));
	return rows;
}

/* Row offsets (row << pb) of n elements (a multiple of 32) from their
 * references' contexts, 32 at a time by ctx_rows32 from d->rowb (only the
 * pieces d->rowb_hi names: a tensor's exponents span few of them), widened
 * and shifted. Needs d->rowb_ok. Returns nonzero if some context has no row
 * (the scalar twin: the row_off loop of ulp_rans_syms_avx2). */
static int row_offsets(const ulp_fmt *f, const ulp_dtab *d, const void *ref, size_t n, int32_t *offs)
{
	const __m128i pbv = _mm_cvtsi32_si128((int)d->prob_bits);
	const __m256i ones = _mm256_set1_epi8(-1);
	rowlut L;
	rowlut_init(&L, d->rowb, d->rowb_hi);
	__m256i bad = _mm256_setzero_si256();
	for (size_t i = 0; i < n; i += 32) {
		__m256i rows = ctx_rows32(f, ref, i, &L, ones);
		bad = _mm256_or_si256(bad, _mm256_cmpeq_epi8(rows, ones));
		__m128i r0 = _mm256_castsi256_si128(rows), r1 = _mm256_extracti128_si256(rows, 1);
		_mm256_storeu_si256((__m256i *)(offs + i), _mm256_sll_epi32(_mm256_cvtepu8_epi32(r0), pbv));
		_mm256_storeu_si256((__m256i *)(offs + i + 8),
		                    _mm256_sll_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(r0, 8)), pbv));
		_mm256_storeu_si256((__m256i *)(offs + i + 16), _mm256_sll_epi32(_mm256_cvtepu8_epi32(r1), pbv));
		_mm256_storeu_si256((__m256i *)(offs + i + 24),
		                    _mm256_sll_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(r1, 8)), pbv));
	}
	return !_mm256_testz_si256(bad, bad);
}

size_t ulp_rans_syms_avx2(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                          const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms,
                          ulp_rb16_job *bg)
{
	enum { DB = 2048 }; /* elements a call at most (a decode block) */
	int32_t offs[DB];
	if (n > DB)
		return SIZE_MAX; /* not this kernel's contract: the scalar path runs */
	const unsigned nv = lanes / 8; /* 8, 16 or 32 lanes: 1, 2 or 4 vectors */
	const unsigned pb = d->prob_bits;
	const __m128i pbv = _mm_cvtsi32_si128((int)pb);
	const __m256i mask = _mm256_set1_epi32((int)((1u << pb) - 1));
	const __m256i m12 = _mm256_set1_epi32(0xfff), one = _mm256_set1_epi32(1);
	const __m256i lbound = _mm256_set1_epi32((int)ULP_RANS_L);
	const int *slots = (const int *)d->slots;
	const __m256i pack_lo = _mm256_setr_epi8(3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
	                                         3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
	/* each element's row offset before any state changes: an unused
	 * context stops here and the scalar path reports it */
	if (ref && d->rowb_ok) {
		if (row_offsets(f, d, ref, n, offs))
			return SIZE_MAX;
	} else if (ref) {
		const unsigned sh = f->mshift, em = (1u << f->ebits) - 1;
		const int32_t *row_off = d->row_off;
		int32_t bad = 0;
		if (f->w == 16)
			for (size_t i = 0; i < n; i++)
				bad |= offs[i] = row_off[(((const uint16_t *)ref)[i] >> sh) & em];
		else
			for (size_t i = 0; i < n; i++)
				bad |= offs[i] = row_off[(((const uint32_t *)ref)[i] >> sh) & em];
		if (bad < 0)
			return SIZE_MAX;
	}
	/* 8 lanes, 16 bits: the previous block's reconstruction runs beside
	 * the serial chain (see below) */
	const int inl = nv == 1 && ref && f->w == 16;
	const __m256i off0 = _mm256_set1_epi32(d->row_off[0]);
	const uint8_t *wp = *wpp;
	__m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = x0, x2 = x0, x3 = x0;
	if (nv >= 2)
		x1 = _mm256_loadu_si256((const __m256i *)(x + 8));
	if (nv == 4) {
		x2 = _mm256_loadu_si256((const __m256i *)(x + 16));
		x3 = _mm256_loadu_si256((const __m256i *)(x + 24));
	}
#define DSTEP(X, i) DSTEPO(X, i, ref ? _mm256_loadu_si256((const __m256i *)(offs + (i))) : off0)
#define DSTEPO(X, i, OFF)                                                                       \
	{                                                                                       \
		__m256i off = OFF;                                                              \
		__m256i e = lookup8(slots, _mm256_add_epi32(off, _mm256_and_si256(X, mask)));   \
		__m256i fr = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 12), m12), one); \
		X = _mm256_add_epi32(_mm256_mullo_epi32(fr, _mm256_srl_epi32(X, pbv)), _mm256_and_si256(e, m12)); \
		/* symbols: the top byte of each entry */                                       \
		__m256i sb = _mm256_shuffle_epi8(e, pack_lo);                                   \
		uint32_t lo_ = (uint32_t)_mm256_extract_epi32(sb, 0), hi_ = (uint32_t)_mm256_extract_epi32(sb, 4); \
		memcpy(syms + (i), &lo_, 4);                                                    \
		memcpy(syms + (i) + 4, &hi_, 4);                                                \
		/* renormalize */                                                               \
		__m256i need = _mm256_cmpgt_epi32(lbound, X);                                   \
		unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));           \
		__m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)wp));    \
		words = _mm256_permutevar8x32_epi32(words, _mm256_loadu_si256((const __m256i *)perm[m])); \
		X = _mm256_blendv_epi8(X, _mm256_or_si256(_mm256_slli_epi32(X, 16), words), need); \
		wp += 2 * (unsigned)__builtin_popcount(m);                                      \
	}
	/* one register a state vector (an array would live in memory and add a
	 * store-forwarding delay to every state update) */
	if (inl) {
		/* bg (the previous block's pass B) eight elements a step, off the
		 * chain, while its raw window fits */
		ulp_rb16_job nobg = {0};
		ulp_rb16_job *j = bg ? bg : &nobg;
		const uint8_t *bs = j->syms, *braw = j->raw;
		const uint16_t *br = j->ref;
		uint16_t *bo = j->out;
		const size_t bn = j->n, blen = j->raw_len;
		size_t bj = j->done;
		uint64_t bp = j->pos;
		for (size_t i = 0; i < n; i += 8) {
			DSTEP(x0, i)
			if (bj + 8 <= bn && bp / 8 + 16 <= blen) {
				bp = rb16_8(bs + bj, br + bj, braw, bp, bo + bj);
				bj += 8;
			}
		}
		j->done = bj;
		j->pos = bp;
	} else if (nv == 1)
		for (size_t i = 0; i < n; i += 8)
			DSTEP(x0, i)
	else if (nv == 2)
		for (size_t i = 0; i < n; i += 16) {
			DSTEP(x0, i)
			DSTEP(x1, i + 8)
		}
	else
		for (size_t i = 0; i < n; i += 32) {
			DSTEP(x0, i)
			DSTEP(x1, i + 8)
			DSTEP(x2, i + 16)
			DSTEP(x3, i + 24)
		}
#undef DSTEP
#undef DSTEPO
	_mm256_storeu_si256((__m256i *)x, x0);
	if (nv >= 2)
		_mm256_storeu_si256((__m256i *)(x + 8), x1);
	if (nv == 4) {
		_mm256_storeu_si256((__m256i *)(x + 16), x2);
		_mm256_storeu_si256((__m256i *)(x + 24), x3);
	}
	*wpp = wp;
	return n;
}

/*
 * AVX2 reconstruction pass (pass B of the decoder) for 16-bit DELTA:
 * eight elements at a time, each element's raw bits taken from its bit
 * position (a prefix sum of the raw lengths of its symbols), then
 * z -> d -> x = phi_inv(phi(r) + d). Eight elements span at most
 * 7 + 8 * 13 = 111 bits from byte p / 8, so one 16-byte window holds them
 * all: each element's four bytes from byte bitpos / 8 (at most 12) are
 * picked by a byte shuffle (no gathers: slow on Zen), then shifted right by
 * bitpos mod 8. Works while the window stays inside the raw tail; returns
 * the number of elements done (a multiple of 8) and advances *pos by their
 * raw bits. The scalar loop finishes the rest.
 */
size_t ulp_rebuild16_avx2(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint16_t *out)
{
	uint64_t p = *pos;
	size_t i = 0;
	/* sixteen at a time while the second window (at most 111 bits past p)
	 * also fits */
	for (; i + 16 <= n && p / 8 + 14 + 16 <= raw_len; i += 16)
		p = rb16_16(syms + i, ref + i, raw, p, out + i);
	for (; i + 8 <= n && p / 8 + 16 <= raw_len; i += 8)
		p = rb16_8(syms + i, ref + i, raw, p, out + i);
	*pos = p;
	return i;
}

/* Raw fields of eight elements, up to 32 bits each, without gathers:
 * elements 0-3 from a 16-byte window at raw + b0, elements 4-7 from one at
 * raw + b1; rel holds each element's bit offset from its window's start
 * (at most 95, so that its five bytes lie inside the window). Two byte
 * shuffles pick each element's bytes from rel / 8 and from rel / 8 + 1; the
 * field is (first >> rel % 8) | (second << (8 - rel % 8)), 32 bits wide. */
static inline __m256i window_bits(const uint8_t *raw, uint64_t b0, uint64_t b1, __m256i rel)
{
	const __m256i seven = _mm256_set1_epi32(7), eight = _mm256_set1_epi32(8),
	              b0123 = _mm256_set1_epi32(0x03020100), b1234 = _mm256_set1_epi32(0x04030201),
	              bcast = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
	                                       0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
	__m256i win = _mm256_loadu2_m128i((const __m128i *)(raw + b1), (const __m128i *)(raw + b0));
	__m256i byte = _mm256_shuffle_epi8(_mm256_srli_epi32(rel, 3), bcast);
	__m256i sh = _mm256_and_si256(rel, seven);
	__m256i lo = _mm256_srlv_epi32(_mm256_shuffle_epi8(win, _mm256_add_epi8(byte, b0123)), sh);
	__m256i hi = _mm256_sllv_epi32(_mm256_shuffle_epi8(win, _mm256_add_epi8(byte, b1234)),
	                               _mm256_sub_epi32(eight, sh));
	return _mm256_or_si256(lo, hi);
}

/*
 * AVX2 reconstruction pass for 32-bit DELTA (F32): as the 16-bit one; an
 * element's raw field has up to 29 bits. Elements 0-3 read from a window at
 * byte p / 8, elements 4-7 from one at the byte of their first bit (at
 * most 7 + 3 * 29 = 94 bits into either window); both windows end before
 * byte p / 8 + 32.
 */
size_t ulp_rebuild32_avx2(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint32_t *out)
{
	const __m256i one = _mm256_set1_epi32(1), three = _mm256_set1_epi32(3),
	              four = _mm256_set1_epi32(4), zero = _mm256_setzero_si256(),
	              h = _mm256_set1_epi32((int)0x80000000u);
	const __m256i hi_half = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 8 <= n && p / 8 + 32 <= raw_len; i += 8) {
		__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(syms + i)));
		__m256i nr = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(s, 2), one), zero);
		/* prefix sums within each half (elements 0-3 and 4-7) */
		__m256i inc = _mm256_add_epi32(nr, _mm256_slli_si256(nr, 4));
		inc = _mm256_add_epi32(inc, _mm256_slli_si256(inc, 8));
		__m256i exc = _mm256_sub_epi32(inc, nr);
		uint32_t t0 = (uint32_t)_mm256_extract_epi32(inc, 3), t1 = (uint32_t)_mm256_extract_epi32(inc, 7);
		uint64_t p1 = p + t0;
		__m256i rel = _mm256_add_epi32(exc, _mm256_blendv_epi8(_mm256_set1_epi32((int)(p & 7)),
		                                                       _mm256_set1_epi32((int)(p1 & 7)), hi_half));
		__m256i bits = window_bits(raw, p / 8, p1 / 8, rel);
		__m256i rmask = _mm256_sub_epi32(_mm256_sllv_epi32(one, nr), one);
		__m256i lead = _mm256_or_si256(four, _mm256_and_si256(s, three));
		__m256i base = _mm256_blendv_epi8(_mm256_sllv_epi32(lead, nr), s, _mm256_cmpgt_epi32(four, s));
		__m256i z = _mm256_or_si256(base, _mm256_and_si256(bits, rmask));
		__m256i d = _mm256_xor_si256(_mm256_srli_epi32(z, 1), _mm256_sub_epi32(zero, _mm256_and_si256(z, one)));
		__m256i r = _mm256_loadu_si256((const __m256i *)(ref + i));
		__m256i phir = _mm256_xor_si256(r, _mm256_or_si256(_mm256_srai_epi32(r, 31), h));
		__m256i key = _mm256_add_epi32(phir, d);
		__m256i x = _mm256_xor_si256(key, _mm256_or_si256(_mm256_sub_epi32(_mm256_srli_epi32(key, 31), one), h));
		_mm256_storeu_si256((__m256i *)(out + i), x);
		p = p1 + t1;
	}
	*pos = p;
	return i;
}

/*
 * AVX2 reconstruction of ANCHOR elements of w = 16 or 32 bits: element i's
 * nb = w - a_bits raw bits (at most 24) sit at bit pos + i nb (a fixed
 * stride), and u = (v & lo) | sym << ash | (v >> ash) << (ash + a_bits).
 * Elements 0-3 read from a window at byte p / 8, elements 4-7 from one at
 * the byte of bit p + 4 nb (at most 7 + 3 nb bits into either).
 */
size_t ulp_anchor_rebuild_avx2(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms,
                               size_t n, const uint8_t *raw, size_t raw_len, uint64_t *pos,
                               void *out)
{
	const unsigned nb = w - ab;
	if (nb > 29)
		return 0; /* not a float format of this codec: the scalar loop */
	const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 0, 1, 2, 3),
	                                          _mm256_set1_epi32((int)nb));
	const __m256i hi_half = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
	const __m256i lo = _mm256_set1_epi32((int)((1u << ash) - 1));
	const __m256i vmask = _mm256_set1_epi32((int)((1u << nb) - 1));
	const __m128i ashv = _mm_cvtsi32_si128((int)ash), hiv = _mm_cvtsi32_si128((int)(ash + ab));
	const size_t span = (4 * (size_t)nb + 7) / 8 + 16;
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 8 <= n && p / 8 + span <= raw_len; i += 8) {
		uint64_t p1 = p + 4 * (uint64_t)nb;
		__m256i rel = _mm256_add_epi32(stride, _mm256_blendv_epi8(_mm256_set1_epi32((int)(p & 7)),
		                                                          _mm256_set1_epi32((int)(p1 & 7)), hi_half));
		__m256i v = _mm256_and_si256(window_bits(raw, p / 8, p1 / 8, rel), vmask);
		__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(syms + i)));
		__m256i u = _mm256_or_si256(_mm256_and_si256(v, lo), _mm256_sll_epi32(s, ashv));
		u = _mm256_or_si256(u, _mm256_sll_epi32(_mm256_srl_epi32(v, ashv), hiv));
		if (w == 16) {
			__m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
			_mm_storeu_si128((__m128i *)((uint16_t *)out + i), packed);
		} else {
			_mm256_storeu_si256((__m256i *)((uint32_t *)out + i), u);
		}
		p += 8 * (uint64_t)nb;
	}
	*pos = p;
	return i;
}

/*
 * AVX2 pass 1 of 16-bit DELTA (the encoder), the contract of its AVX-512
 * twin: for n elements (a multiple of 16) the symbols, the count indices
 * ctx * alphabet + symbol, and the raw tails merged four elements at a time
 * (vals[j]: elements 4j..4j+3, LSB-first, lens[j] bits), exactly as the
 * scalar z_symbol(): z = zigzag(phi(x) - phi(r)), k = bitlen(z | 4) - 3,
 * symbol 4k + (z >> k), raw = the low k bits. bitlen comes from the exponent
 * of z converted to float, exact below 2^24.
 */
void ulp_pass1_16_avx2(const uint16_t *x, const uint16_t *r, size_t n, unsigned mshift,
                       unsigned emask, unsigned alphabet, uint8_t *syms, uint16_t *cidx,
                       uint64_t *vals, uint8_t *lens)
{
	const __m256i h = _mm256_set1_epi32(0x8000), ffff = _mm256_set1_epi32(0xffff),
	              zero = _mm256_setzero_si256(), four = _mm256_set1_epi32(4),
	              one = _mm256_set1_epi32(1), e129 = _mm256_set1_epi32(129),
	              em = _mm256_set1_epi32((int)emask), av = _mm256_set1_epi32((int)alphabet),
	              lo32 = _mm256_set1_epi64x(0xffffffffll);
	const __m256i byte0 = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
	                                       0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
	const __m128i shv = _mm_cvtsi32_si128((int)mshift);
	for (size_t i = 0; i < n; i += 8) {
		__m256i X = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
		__m256i R = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r + i)));
		__m256i px = _mm256_xor_si256(X, _mm256_or_si256(_mm256_and_si256(_mm256_sub_epi32(zero, _mm256_srli_epi32(X, 15)), ffff), h));
		__m256i pr = _mm256_xor_si256(R, _mm256_or_si256(_mm256_and_si256(_mm256_sub_epi32(zero, _mm256_srli_epi32(R, 15)), ffff), h));
		__m256i d = _mm256_and_si256(_mm256_sub_epi32(px, pr), ffff);
		__m256i z = _mm256_and_si256(_mm256_xor_si256(_mm256_slli_epi32(d, 1),
		                                              _mm256_sub_epi32(zero, _mm256_srli_epi32(d, 15))), ffff);
		__m256i k = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(_mm256_cvtepi32_ps(_mm256_or_si256(z, four))), 23), e129);
		__m256i sym = _mm256_add_epi32(_mm256_slli_epi32(k, 2), _mm256_srlv_epi32(z, k));
		__m256i raw = _mm256_and_si256(z, _mm256_sub_epi32(_mm256_sllv_epi32(one, k), one));
		__m256i ctx = _mm256_and_si256(_mm256_srl_epi32(R, shv), em);
		__m256i sb = _mm256_shuffle_epi8(sym, byte0);
		uint32_t lo = (uint32_t)_mm256_extract_epi32(sb, 0), hi = (uint32_t)_mm256_extract_epi32(sb, 4);
		memcpy(syms + i, &lo, 4);
		memcpy(syms + i + 4, &hi, 4);
		__m256i ci = _mm256_add_epi32(_mm256_mullo_epi32(ctx, av), sym);
		ci = _mm256_permute4x64_epi64(_mm256_packus_epi32(ci, ci), 0xD8);
		_mm_storeu_si128((__m128i *)(cidx + i), _mm256_castsi256_si128(ci));
		/* pairs: qword j holds elements 2j (low) and 2j + 1 (high) */
		__m256i k0 = _mm256_and_si256(k, lo32), k1 = _mm256_srli_epi64(k, 32);
		__m256i m1 = _mm256_or_si256(_mm256_and_si256(raw, lo32), _mm256_sllv_epi64(_mm256_srli_epi64(raw, 32), k0));
		__m256i l1 = _mm256_add_epi64(k0, k1);
		/* fours: pairs 0 | 1 and 2 | 3 */
		__m256i a = _mm256_permute4x64_epi64(m1, 0x08), b = _mm256_permute4x64_epi64(m1, 0x0D);
		__m256i la = _mm256_permute4x64_epi64(l1, 0x08), lb = _mm256_permute4x64_epi64(l1, 0x0D);
		__m256i m2 = _mm256_or_si256(a, _mm256_sllv_epi64(b, la));
		_mm_storeu_si128((__m128i *)(vals + i / 4), _mm256_castsi256_si128(m2));
		__m256i l2 = _mm256_add_epi64(la, lb);
		lens[i / 4] = (uint8_t)_mm256_extract_epi64(l2, 0);
		lens[i / 4 + 1] = (uint8_t)_mm256_extract_epi64(l2, 1);
	}
}

/*
 * AVX2 rANS encoder of elements [0, n) (n a multiple of 8) with 8, 16 or 32
 * lanes, run after the scalar loop has coded elements n and up: it continues
 * from the states x and the word pointer *pp and produces exactly the scalar
 * ulp_rans_enc_put() sequence. Eight consecutive elements are eight
 * consecutive lanes (one vector of states), coded from the last group to the
 * first. Per block of 1024 elements, a scalar pass looks up each element's
 * packed entry (es64[row(ctx) * alphabet + symbol]: rcp, and freq | bias << 13
 * | rshift << 26; scalar loads, as AVX2 gathers are slow on Zen 2/3), then
 * per group: renormalization and the fold x + bias + q (2^n - freq).
 *
 * The renormalization words of a group go below *pp in lane order (the
 * scalar loop pushes the highest element first, so lower lanes land lower):
 * they are packed into the top cnt u16 of a 16-byte vector stored at
 * *pp - 8, so the store's other bytes fall below the stream's new front.
 * Callers guarantee 16 free bytes below any front the kernel can reach
 * (ulp_chunk_rans_bound leaves 4 * lanes >= 32 bytes for the states).
 * x_max = freq << (31 - n) <= 2^31 and states stay below 2^31, so the
 * signed compare x > x_max - 1 is exact.
 */
static uint8_t enc_pack[256][16];

__attribute__((constructor)) static void init_enc_pack(void)
{
	for (unsigned m = 0; m < 256; m++) {
		unsigned cnt = (unsigned)__builtin_popcount(m), k = 8 - cnt;
		memset(enc_pack[m], 0x80, 16);
		for (unsigned j = 0; j < 8; j++)
			if (m >> j & 1) {
				enc_pack[m][2 * k] = (uint8_t)(2 * j);
				enc_pack[m][2 * k + 1] = (uint8_t)(2 * j + 1);
				k++;
			}
	}
}

void ulp_rans_enc_avx2(const ulp_fmt *f, unsigned pb, const uint16_t *ctx_row, unsigned n_ctx,
                       unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                       const void *ref, unsigned lanes, size_t n, uint32_t *x, uint16_t **pp)
{
	enum { EB = 1024 }; /* elements a block of looked-up entries */
	uint32_t rowa[256], erc[EB], epk[EB];
	const unsigned nc = n_ctx < 256 ? n_ctx : 256;
	for (unsigned c = 0; c < 256; c++)
		rowa[c] = c < nc && ctx_row[c] != ULP_CTX_UNUSED ? ctx_row[c] * alphabet : 0;
	/* the same rows as bytes for ctx_rows32 (rows < 255, alphabet <= 252:
	 * indices fit 16 bits; ulp_esyms_pack gives es64 only then) */
	uint8_t rowb[256];
	unsigned hi = 0;
	for (unsigned c = 0; c < 256; c++) {
		rowb[c] = (uint8_t)(rowa[c] / (alphabet ? alphabet : 1));
		if (rowb[c])
			hi |= 1u << (c >> 4);
	}
	rowlut L;
	rowlut_init(&L, rowb, hi);
	const int lut_ok = n_ctx <= 256 && alphabet <= 256;
	uint16_t eix[EB];
	const unsigned nv = lanes / 8;
	const unsigned sh = f->mshift, em = ((1u << f->ebits) - 1) & 255;
	const __m256i m13 = _mm256_set1_epi32(0x1fff), one_n = _mm256_set1_epi32(1 << pb);
	const __m256i one = _mm256_set1_epi32(1);
	const __m128i xmsh = _mm_cvtsi32_si128((int)(31 - pb));
	/* low u16 of each u32, per 128-bit half, then both halves together */
	const __m256i lo16 = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
	                                      0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
	const uint16_t *r16 = f->w == 16 ? ref : NULL;
	const uint32_t *r32 = f->w == 32 ? ref : NULL;
	uint16_t *p = *pp;
	__m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = x0, x2 = x0, x3 = x0;
	if (nv >= 2)
		x1 = _mm256_loadu_si256((const __m256i *)(x + 8));
	if (nv == 4) {
		x2 = _mm256_loadu_si256((const __m256i *)(x + 16));
		x3 = _mm256_loadu_si256((const __m256i *)(x + 24));
	}
	/* blocks of EB elements (a multiple of 32) from the top: each starts at
	 * a multiple of lanes, so vector j of a group holds lanes 8j..8j+7 */
	for (size_t bend = n; bend > 0;) {
		const size_t b0 = bend > EB ? bend - EB : 0, bn = bend - b0;
		/* the block's table entries, looked up in scalar code: AVX2
		 * gathers are slower than scalar loads on Zen 2/3 */
		const uint64_t *row0 = es64 + rowa[0];
		size_t jv = 0; /* entries looked up by vector indices */
		if (ref && lut_ok) {
			/* entry indices row * alphabet + symbol, 32 at a time (rows
			 * by ctx_rows32: a context without a row takes row 0, as
			 * rowa gives), then the entries by scalar loads */
			const __m256i av = _mm256_set1_epi16((short)alphabet), zero = _mm256_setzero_si256();
			jv = bn & ~(size_t)31;
			for (size_t j = 0; j < jv; j += 32) {
				__m256i rows = ctx_rows32(f, ref, b0 + j, &L, zero);
				__m256i sy = _mm256_loadu_si256((const __m256i *)(syms + b0 + j));
				__m256i i0 = _mm256_add_epi16(_mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(rows)), av),
				                              _mm256_cvtepu8_epi16(_mm256_castsi256_si128(sy)));
				__m256i i1 = _mm256_add_epi16(_mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(rows, 1)), av),
				                              _mm256_cvtepu8_epi16(_mm256_extracti128_si256(sy, 1)));
				_mm256_storeu_si256((__m256i *)(eix + j), i0);
				_mm256_storeu_si256((__m256i *)(eix + j + 16), i1);
			}
			for (size_t j = 0; j < jv; j++) {
				uint64_t e = es64[eix[j]];
				erc[j] = (uint32_t)e;
				epk[j] = (uint32_t)(e >> 32);
			}
		}
		if (r16)
			for (size_t j = jv; j < bn; j++) {
				uint64_t e = es64[rowa[(r16[b0 + j] >> sh) & em] + syms[b0 + j]];
				erc[j] = (uint32_t)e;
				epk[j] = (uint32_t)(e >> 32);
			}
		else if (r32)
			for (size_t j = jv; j < bn; j++) {
				uint64_t e = es64[rowa[(r32[b0 + j] >> sh) & em] + syms[b0 + j]];
				erc[j] = (uint32_t)e;
				epk[j] = (uint32_t)(e >> 32);
			}
		else
			for (size_t j = 0; j < bn; j++) {
				uint64_t e = row0[syms[b0 + j]];
				erc[j] = (uint32_t)e;
				epk[j] = (uint32_t)(e >> 32);
			}
#define ESTEP(X, j)                                                                             \
	{                                                                                       \
		__m256i rcp = _mm256_loadu_si256((const __m256i *)(erc + (j)));                 \
		__m256i pk = _mm256_loadu_si256((const __m256i *)(epk + (j)));                  \
		__m256i freq = _mm256_and_si256(pk, m13);                                       \
		__m256i bias = _mm256_and_si256(_mm256_srli_epi32(pk, 13), m13);                \
		__m256i rsh = _mm256_srli_epi32(pk, 26);                                        \
		__m256i need = _mm256_cmpgt_epi32(X, _mm256_sub_epi32(_mm256_sll_epi32(freq, xmsh), one)); \
		unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));           \
		/* branch-free: most groups renormalize some lane */                            \
		__m256i w = _mm256_shuffle_epi8(X, lo16);                                       \
		__m128i w8 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(w, 0x08));         \
		w8 = _mm_shuffle_epi8(w8, _mm_loadu_si128((const __m128i *)enc_pack[m]));       \
		_mm_storeu_si128((__m128i *)(void *)(p - 8), w8);                               \
		p -= __builtin_popcount(m);                                                     \
		X = _mm256_blendv_epi8(X, _mm256_srli_epi32(X, 16), need);                      \
		__m256i pe = _mm256_srli_epi64(_mm256_mul_epu32(X, rcp), 32);                   \
		__m256i po = _mm256_mul_epu32(_mm256_srli_epi64(X, 32), _mm256_srli_epi64(rcp, 32)); \
		__m256i q = _mm256_srlv_epi32(_mm256_blend_epi32(pe, po, 0xAA), rsh);           \
		X = _mm256_add_epi32(_mm256_add_epi32(X, bias),                                 \
		                     _mm256_mullo_epi32(q, _mm256_sub_epi32(one_n, freq)));     \
	}
		/* one register a state vector (an array would live in memory and
		 * add a store-forwarding delay to every state update) */
		if (nv == 1)
			for (size_t g = bn; g > 0; g -= 8)
				ESTEP(x0, g - 8)
		else if (nv == 2)
			for (size_t g = bn; g > 0; g -= 16) {
				ESTEP(x1, g - 8)
				ESTEP(x0, g - 16)
			}
		else
			for (size_t g = bn; g > 0; g -= 32) {
				ESTEP(x3, g - 8)
				ESTEP(x2, g - 16)
				ESTEP(x1, g - 24)
				ESTEP(x0, g - 32)
			}
#undef ESTEP
		bend = b0;
	}
	_mm256_storeu_si256((__m256i *)x, x0);
	if (nv >= 2)
		_mm256_storeu_si256((__m256i *)(x + 8), x1);
	if (nv == 4) {
		_mm256_storeu_si256((__m256i *)(x + 16), x2);
		_mm256_storeu_si256((__m256i *)(x + 24), x3);
	}
	*pp = p;
}

/* ANCHOR pass 1 of 16-bit elements with a_bits 8 and one raw byte each
 * (w - 8 = 8): symbol (u >> ash) & 0xff, raw byte (u & (2^ash - 1)) |
 * (u >> (ash + 8)) << ash, as codec_width.h's anchor_pass1 computes them;
 * 32 elements a step, the counting left to the caller. */
size_t ulp_anchor_pass1_8_avx2(const uint16_t *x, size_t n, unsigned ash, uint8_t *syms,
                               uint8_t *raw)
{
	const __m128i sh = _mm_cvtsi32_si128((int)ash), sh8 = _mm_cvtsi32_si128((int)ash + 8);
	const __m256i ff = _mm256_set1_epi16(0xff), lo = _mm256_set1_epi16((short)((1u << ash) - 1));
	size_t i = 0;
	for (; i + 32 <= n; i += 32) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(x + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(x + i + 16));
		__m256i sa = _mm256_and_si256(_mm256_srl_epi16(a, sh), ff);
		__m256i sb = _mm256_and_si256(_mm256_srl_epi16(b, sh), ff);
		__m256i ra = _mm256_or_si256(_mm256_and_si256(a, lo), _mm256_sll_epi16(_mm256_srl_epi16(a, sh8), sh));
		__m256i rb = _mm256_or_si256(_mm256_and_si256(b, lo), _mm256_sll_epi16(_mm256_srl_epi16(b, sh8), sh));
		/* packus works per 128-bit half: a0-7 b0-7 | a8-15 b8-15, then in order */
		_mm256_storeu_si256((__m256i *)(syms + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(sa, sb), 0xD8));
		_mm256_storeu_si256((__m256i *)(raw + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(ra, rb), 0xD8));
	}
	return i;
}

/* This file's row of the kernel table (codec.h). */
const ulp_kernels ulp_kernels_avx2 = {
	.name = "avx2",
	.syms = ulp_rans_syms_avx2,
	.syms_lanes = 8,
	.rb16_beside = 1,
	.rebuild16 = {ulp_rebuild16_avx2, NULL},
	.rebuild32 = {ulp_rebuild32_avx2, NULL},
	.anchor_rebuild = ulp_anchor_rebuild_avx2,
	.pass1_16 = ulp_pass1_16_avx2,
	.anchor_pass1_8 = ulp_anchor_pass1_8_avx2,
	.enc = ulp_rans_enc_avx2,
	.enc_lanes = 8,
};
