/* SPDX-License-Identifier: MIT */
/*
 * rans_avx512.c - AVX-512 kernels of the decoder's two passes (codec.c),
 * compiled alone with -mavx512{f,bw,vl,vbmi} and chosen at run time. They
 * decode exactly what the scalar reference decodes.
 *
 * Symbol pass: 16 or 32 lanes as one or two vectors of sixteen states. For
 * sixteen consecutive elements (sixteen consecutive lanes) the contexts are
 * mapped to their table rows by byte permutes from d->rowb (256 entries in
 * four registers: no gather), the slot entries are gathered, the states
 * updated, and the lanes that fell below 2^15 take the next words in lane
 * order (the scalar order) by an expand under the lane mask.
 *
 * Reconstruction pass (16-bit DELTA): sixteen elements at a time, the raw
 * bit positions are an in-register prefix sum of the symbols' raw lengths;
 * the at most 28 bytes the group reads are one 64-byte load, and each
 * element's four bytes are picked from it by one byte permute.
 *
 * Invariants (callers guarantee):
 *  1. Symbol pass: lanes is 16 or 32, n a multiple of 64; the word stream
 *     holds at least 2 n bytes from *wpp (every 32-byte load of words stays
 *     inside it); with a reference, d->rowb_ok. An element whose context
 *     has no row stops the kernel: it returns SIZE_MAX and leaves x and
 *     *wpp untouched, and the scalar code reports the element.
 *  2. Reconstruction: reads stay inside [raw, raw + raw_len); it does the
 *     groups whose 64-byte window fits and returns how many elements it did.
 */
#include "codec.h"
#include <immintrin.h>

/* The table rows of the contexts (reference exponents) of sixteen elements
 * from element i on, by byte permutes of the 256-entry row table held in
 * t0..t3; 0xff where a context has no row. */
static inline __m512i ctx_rows(const uint16_t *r16, const uint32_t *r32, size_t i, __m128i shv,
                               __m512i em, __m512i t0, __m512i t1, __m512i t2, __m512i t3)
{
	__m512i r = r16 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r16 + i)))
	                : _mm512_loadu_si512(r32 + i);
	__m512i c = _mm512_and_si512(_mm512_srl_epi32(r, shv), em);
	__m512i lo = _mm512_permutex2var_epi8(t0, c, t1);
	__m512i hi = _mm512_permutex2var_epi8(t2, c, t3);
	return _mm512_and_si512(_mm512_mask_blend_epi8(_mm512_movepi8_mask(c), lo, hi),
	                        _mm512_set1_epi32(0xff));
}

size_t ulp_rans_syms_avx512(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                            const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms)
{
	const unsigned pb = d->prob_bits;
	const __m128i pbv = _mm_cvtsi32_si128((int)pb), shv = _mm_cvtsi32_si128((int)f->mshift);
	const __m512i mask = _mm512_set1_epi32((int)((1u << pb) - 1));
	const __m512i m12 = _mm512_set1_epi32(0xfff), one = _mm512_set1_epi32(1);
	const __m512i lbound = _mm512_set1_epi32((int)ULP_RANS_L);
	const __m512i em = _mm512_set1_epi32((int)((1u << f->ebits) - 1));
	const __m512i ff = _mm512_set1_epi32(0xff);
	const __m512i t0 = _mm512_loadu_si512(d->rowb), t1 = _mm512_loadu_si512(d->rowb + 64),
	              t2 = _mm512_loadu_si512(d->rowb + 128), t3 = _mm512_loadu_si512(d->rowb + 192);
	const int *slots = (const int *)d->slots;
	const __m512i off0 = _mm512_set1_epi32(d->row_off[0] < 0 ? 0 : d->row_off[0]);
	const uint8_t *wp = *wpp;
	__m512i xa = _mm512_loadu_si512(x), xb = lanes == 32 ? _mm512_loadu_si512(x + 16) : xa;
	const uint16_t *r16 = f->w == 16 ? ref : NULL;
	const uint32_t *r32 = f->w == 32 ? ref : NULL;

/* One step of sixteen elements from element i on, states in X. Breaks out of
 * the loop at an unused context. */
#define STEP(X, i)                                                                              \
	{                                                                                       \
		__m512i off = off0;                                                             \
		if (ref) {                                                                      \
			__m512i row = ctx_rows(r16, r32, i, shv, em, t0, t1, t2, t3);           \
			if (_mm512_cmpeq_epi32_mask(row, ff))                                   \
				break;                                                          \
			off = _mm512_sll_epi32(row, pbv);                                       \
		}                                                                               \
		__m512i e = _mm512_i32gather_epi32(_mm512_add_epi32(off, _mm512_and_si512(X, mask)), \
		                                   slots, 4);                                   \
		__m512i fr = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(e, 12), m12), one); \
		X = _mm512_add_epi32(_mm512_mullo_epi32(fr, _mm512_srl_epi32(X, pbv)),          \
		                     _mm512_and_si512(e, m12));                                 \
		_mm_storeu_si128((__m128i *)(syms + (i)), _mm512_cvtepi32_epi8(_mm512_srli_epi32(e, 24))); \
		__mmask16 k = _mm512_cmplt_epu32_mask(X, lbound);                               \
		__m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)wp));     \
		X = _mm512_mask_or_epi32(X, k, _mm512_slli_epi32(X, 16), _mm512_maskz_expand_epi32(k, w)); \
		wp += 2 * (unsigned)__builtin_popcount((unsigned)k);                            \
	}

	size_t i = 0;
	if (lanes == 32) {
		for (; i < n; i += 32) {
			STEP(xa, i)
			STEP(xb, i + 16)
		}
	} else {
		for (; i < n; i += 32) {
			STEP(xa, i)
			STEP(xa, i + 16)
		}
	}
#undef STEP
	if (i < n)
		return SIZE_MAX;
	_mm512_storeu_si512(x, xa);
	if (lanes == 32)
		_mm512_storeu_si512(x + 16, xb);
	*wpp = wp;
	return n;
}

size_t ulp_rebuild16_avx512(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                            size_t raw_len, uint64_t *pos, uint16_t *out)
{
	const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1),
	              three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4),
	              seven = _mm512_set1_epi32(7), h = _mm512_set1_epi32(0x8000),
	              ffff = _mm512_set1_epi32(0xffff), spread = _mm512_set1_epi32(0x01010101),
	              bytes4 = _mm512_set1_epi32(0x03020100);
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 16 <= n && p / 8 + 64 <= raw_len; i += 16) {
		__m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(syms + i)));
		__m512i nr = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(s, 2), one), zero);
		/* inclusive prefix sum of nr across the sixteen lanes */
		__m512i inc = _mm512_add_epi32(nr, _mm512_alignr_epi32(nr, zero, 15));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 14));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 12));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 8));
		uint32_t total = (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(inc, 3), 3);
		__m512i bitpos = _mm512_add_epi32(_mm512_set1_epi32((int)(p & 7)), _mm512_sub_epi32(inc, nr));
		/* the four bytes from each element's first byte (at most byte 25 + 3) */
		__m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(bitpos, 3), spread), bytes4);
		__m512i win = _mm512_loadu_si512(raw + p / 8);
		__m512i bits = _mm512_srlv_epi32(_mm512_permutexvar_epi8(idx, win), _mm512_and_si512(bitpos, seven));
		__m512i rmask = _mm512_sub_epi32(_mm512_sllv_epi32(one, nr), one);
		__m512i lead = _mm512_or_si512(four, _mm512_and_si512(s, three));
		__m512i base = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(s, four),
		                                       _mm512_sllv_epi32(lead, nr), s);
		__m512i z = _mm512_or_si512(base, _mm512_and_si512(bits, rmask));
		/* d = unzigzag(z); key = phi(r) + d; x = phi_inv(key), 16 bits */
		__m512i dd = _mm512_xor_si512(_mm512_srli_epi32(z, 1), _mm512_sub_epi32(zero, _mm512_and_si512(z, one)));
		__m512i r = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(ref + i)));
		__m512i phir = _mm512_xor_si512(r, _mm512_or_si512(_mm512_sub_epi32(zero, _mm512_srli_epi32(r, 15)), h));
		__m512i key = _mm512_and_si512(_mm512_add_epi32(phir, dd), ffff);
		__m512i xv = _mm512_xor_si512(key, _mm512_or_si512(_mm512_sub_epi32(_mm512_srli_epi32(key, 15), one), h));
		_mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtepi32_epi16(xv));
		p += total;
	}
	*pos = p;
	return i;
}

/*
 * AVX-512 rANS encoder for 32 lanes (16- and 32-bit dtypes, DELTA with its
 * reference or ANCHOR without): elements [0, n) of a chunk, n a multiple of
 * 32, coded from the last group of sixteen to the first, exactly as the
 * scalar loop codes them one by one from the last element:
 *  - the sixteen lanes of a group are independent, so they renormalize and
 *    fold together; the words of the lanes that renormalize go below *pp in
 *    lane order, which is where the scalar order puts them (it writes the
 *    highest element's word first, each one below the previous);
 *  - the fold is the scalar one (x + bias + q cmpl, q from the 32-bit
 *    reciprocal), its fields unpacked from es64 (ulp_esym_pack), x_max
 *    and cmpl recomputed from the frequency.
 * rowb maps contexts to rows (as in ulp_dtab; with a reference only);
 * row0 is the row of ANCHOR.
 */
void ulp_rans_enc_avx512(const ulp_fmt *f, unsigned pb, const uint8_t *rowb, unsigned row0,
                         unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                         const void *ref, size_t n, uint32_t *x, uint16_t **pp)
{
	const __m128i shv = _mm_cvtsi32_si128((int)f->mshift);
	const __m512i em = _mm512_set1_epi32((int)((1u << f->ebits) - 1));
	const __m512i m13 = _mm512_set1_epi32(0x1fff);
	const __m512i av = _mm512_set1_epi32((int)alphabet), one_n = _mm512_set1_epi32(1 << pb);
	const __m128i xmsh = _mm_cvtsi32_si128((int)(31 - pb));
	const __m512i t0 = _mm512_loadu_si512(rowb), t1 = _mm512_loadu_si512(rowb + 64),
	              t2 = _mm512_loadu_si512(rowb + 128), t3 = _mm512_loadu_si512(rowb + 192);
	const __m512i lo_idx = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
	const __m512i hi_idx = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
	const __m512i rowv0 = _mm512_set1_epi32((int)row0);
	const uint16_t *r16 = f->w == 16 ? ref : NULL;
	const uint32_t *r32 = f->w == 32 ? ref : NULL;
	uint16_t *p = *pp;
	__m512i xa = _mm512_loadu_si512(x), xb = _mm512_loadu_si512(x + 16);

#define ESTEP(X, i)                                                                             \
	{                                                                                       \
		__m512i row = rowv0;                                                            \
		if (ref)                                                                        \
			row = ctx_rows(r16, r32, i, shv, em, t0, t1, t2, t3);                   \
		__m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(syms + (i)))); \
		__m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(row, av), s);                 \
		__m512i g0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(idx), es64, 8);      \
		__m512i g1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(idx, 1), es64, 8); \
		__m512i rcp = _mm512_permutex2var_epi32(g0, lo_idx, g1);                        \
		__m512i pk = _mm512_permutex2var_epi32(g0, hi_idx, g1);                         \
		__m512i freq = _mm512_and_si512(pk, m13);                                       \
		__m512i bias = _mm512_and_si512(_mm512_srli_epi32(pk, 13), m13);                \
		__m512i rsh = _mm512_srli_epi32(pk, 26);                                        \
		__mmask16 k = _mm512_cmpge_epu32_mask(X, _mm512_sll_epi32(freq, xmsh));         \
		unsigned cnt = (unsigned)__builtin_popcount((unsigned)k);                       \
		p -= cnt;                                                                       \
		_mm256_mask_storeu_epi16(p, (__mmask16)((1u << cnt) - 1),                       \
		                         _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(k, X))); \
		X = _mm512_mask_srli_epi32(X, k, X, 16);                                        \
		__m512i pe = _mm512_mul_epu32(X, rcp);                                          \
		__m512i po = _mm512_mul_epu32(_mm512_srli_epi64(X, 32), _mm512_srli_epi64(rcp, 32)); \
		__m512i q = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(pe, 32), po);     \
		q = _mm512_srlv_epi32(q, rsh);                                                  \
		X = _mm512_add_epi32(_mm512_add_epi32(X, bias),                                 \
		                     _mm512_mullo_epi32(q, _mm512_sub_epi32(one_n, freq)));     \
	}

	for (size_t g = n; g > 0; g -= 32) {
		ESTEP(xb, g - 16)
		ESTEP(xa, g - 32)
	}
#undef ESTEP
	_mm512_storeu_si512(x, xa);
	_mm512_storeu_si512(x + 16, xb);
	*pp = p;
}

/*
 * AVX-512 pass 1 of 16-bit DELTA (the encoder), n a multiple of 16: the
 * symbols, each element's count index ctx * alphabet + symbol (ctx = the
 * reference's exponent field), and the raw tails merged four elements at a
 * time in element order (vals[i / 4], at most 52 bits, lens[i / 4] bits) for
 * the caller's bit writer. Exactly the scalar z_symbol(): z = zigzag(phi(x) -
 * phi(r)), k = bitlen(z | 4) - 3 (from the exponent of z | 4 as a float,
 * exact below 2^24), symbol 4k + (z >> k), raw = the low k bits.
 */
void ulp_pass1_16_avx512(const uint16_t *x, const uint16_t *r, size_t n, unsigned mshift,
                         unsigned emask, unsigned alphabet, uint8_t *syms, uint16_t *cidx,
                         uint64_t *vals, uint8_t *lens)
{
	const __m512i h = _mm512_set1_epi32(0x8000), ffff = _mm512_set1_epi32(0xffff),
	              zero = _mm512_setzero_si512(), four = _mm512_set1_epi32(4),
	              one = _mm512_set1_epi32(1), e129 = _mm512_set1_epi32(129),
	              em = _mm512_set1_epi32((int)emask), av = _mm512_set1_epi32((int)alphabet),
	              lo32 = _mm512_set1_epi64(0xffffffffll);
	const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 0, 0, 0, 0),
	              odd = _mm512_setr_epi64(1, 3, 5, 7, 0, 0, 0, 0);
	const __m128i shv = _mm_cvtsi32_si128((int)mshift);
	for (size_t i = 0; i < n; i += 16) {
		__m512i X = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
		__m512i R = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r + i)));
		__m512i px = _mm512_xor_si512(X, _mm512_or_si512(_mm512_and_si512(_mm512_sub_epi32(zero, _mm512_srli_epi32(X, 15)), ffff), h));
		__m512i pr = _mm512_xor_si512(R, _mm512_or_si512(_mm512_and_si512(_mm512_sub_epi32(zero, _mm512_srli_epi32(R, 15)), ffff), h));
		__m512i d = _mm512_and_si512(_mm512_sub_epi32(px, pr), ffff);
		__m512i z = _mm512_and_si512(_mm512_xor_si512(_mm512_slli_epi32(d, 1),
		                                              _mm512_sub_epi32(zero, _mm512_srli_epi32(d, 15))), ffff);
		__m512i k = _mm512_sub_epi32(_mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_or_si512(z, four))), 23), e129);
		__m512i sym = _mm512_add_epi32(_mm512_slli_epi32(k, 2), _mm512_srlv_epi32(z, k));
		__m512i raw = _mm512_and_si512(z, _mm512_sub_epi32(_mm512_sllv_epi32(one, k), one));
		__m512i ctx = _mm512_and_si512(_mm512_srl_epi32(R, shv), em);
		_mm_storeu_si128((__m128i *)(syms + i), _mm512_cvtepi32_epi8(sym));
		_mm256_storeu_si256((__m256i *)(cidx + i), _mm512_cvtepi32_epi16(_mm512_add_epi32(_mm512_mullo_epi32(ctx, av), sym)));
		/* pairs: qword j holds elements 2j (low) and 2j + 1 (high) */
		__m512i k0 = _mm512_and_si512(k, lo32), k1 = _mm512_srli_epi64(k, 32);
		__m512i m1 = _mm512_or_si512(_mm512_and_si512(raw, lo32), _mm512_sllv_epi64(_mm512_srli_epi64(raw, 32), k0));
		__m512i l1 = _mm512_add_epi64(k0, k1);
		/* fours: pairs 2m and 2m + 1 */
		__m512i a = _mm512_permutexvar_epi64(even, m1), b = _mm512_permutexvar_epi64(odd, m1);
		__m512i la = _mm512_permutexvar_epi64(even, l1), lb = _mm512_permutexvar_epi64(odd, l1);
		__m512i m2 = _mm512_or_si512(a, _mm512_sllv_epi64(b, la));
		_mm256_storeu_si256((__m256i *)(vals + i / 4), _mm512_castsi512_si256(m2));
		uint32_t l4 = (uint32_t)_mm_cvtsi128_si32(_mm512_cvtepi64_epi8(_mm512_add_epi64(la, lb)));
		memcpy(lens + i / 4, &l4, 4);
	}
}

/*
 * AVX-512 reconstruction pass for 32-bit DELTA (F32): as the 16-bit one, but
 * an element's raw tail has up to 29 bits, 36 with its bit shift, so each
 * element's five bytes are picked into a 64-bit lane (eight elements a
 * permute, two permutes a group). Sixteen elements read at most 59 bytes
 * from byte p / 8: one 64-byte window.
 */
size_t ulp_rebuild32_avx512(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                            size_t raw_len, uint64_t *pos, uint32_t *out)
{
	const __m512i zero = _mm512_setzero_si512(), one = _mm512_set1_epi32(1),
	              three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4),
	              h = _mm512_set1_epi32((int)0x80000000u), seven64 = _mm512_set1_epi64(7),
	              bytes8 = _mm512_set1_epi64(0x0706050403020100ll);
	/* in each 128-bit lane: byte 0 to the first qword's bytes, byte 8 to the second's */
	const __m512i bcast = _mm512_set4_epi32(0x08080808, 0x08080808, 0, 0);
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 16 <= n && p / 8 + 64 <= raw_len; i += 16) {
		__m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(syms + i)));
		__m512i nr = _mm512_max_epi32(_mm512_sub_epi32(_mm512_srli_epi32(s, 2), one), zero);
		__m512i inc = _mm512_add_epi32(nr, _mm512_alignr_epi32(nr, zero, 15));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 14));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 12));
		inc = _mm512_add_epi32(inc, _mm512_alignr_epi32(inc, zero, 8));
		uint32_t total = (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(inc, 3), 3);
		__m512i bitpos = _mm512_add_epi32(_mm512_set1_epi32((int)(p & 7)), _mm512_sub_epi32(inc, nr));
		__m512i win = _mm512_loadu_si512(raw + p / 8);
		__m256i half[2];
		for (int k = 0; k < 2; k++) {
			__m512i bp = _mm512_cvtepu32_epi64(k ? _mm512_extracti64x4_epi64(bitpos, 1)
			                                     : _mm512_castsi512_si256(bitpos));
			__m512i idx = _mm512_add_epi64(_mm512_shuffle_epi8(_mm512_srli_epi64(bp, 3), bcast), bytes8);
			__m512i v = _mm512_srlv_epi64(_mm512_permutexvar_epi8(idx, win), _mm512_and_si512(bp, seven64));
			half[k] = _mm512_cvtepi64_epi32(v);
		}
		__m512i bits = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
		__m512i rmask = _mm512_sub_epi32(_mm512_sllv_epi32(one, nr), one);
		__m512i lead = _mm512_or_si512(four, _mm512_and_si512(s, three));
		__m512i base = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(s, four),
		                                       _mm512_sllv_epi32(lead, nr), s);
		__m512i z = _mm512_or_si512(base, _mm512_and_si512(bits, rmask));
		__m512i dd = _mm512_xor_si512(_mm512_srli_epi32(z, 1), _mm512_sub_epi32(zero, _mm512_and_si512(z, one)));
		__m512i r = _mm512_loadu_si512(ref + i);
		__m512i phir = _mm512_xor_si512(r, _mm512_or_si512(_mm512_sub_epi32(zero, _mm512_srli_epi32(r, 31)), h));
		__m512i key = _mm512_add_epi32(phir, dd);
		__m512i xv = _mm512_xor_si512(key, _mm512_or_si512(_mm512_sub_epi32(_mm512_srli_epi32(key, 31), one), h));
		_mm512_storeu_si512(out + i, xv);
		p += total;
	}
	*pos = p;
	return i;
}

/* This file's row of the kernel table (codec.h): the AVX-512 kernels, and
 * AVX2's where AVX-512 has none or for what they leave (fewer than 16
 * lanes, 8-lane encoding, ANCHOR reconstruction, the tails of pass B). */
const ulp_kernels ulp_kernels_avx512 = {
	.name = "avx512",
	.syms_wide = ulp_rans_syms_avx512,
	.syms = ulp_rans_syms_avx2,
	.syms_lanes = 8,
	.rebuild16 = {ulp_rebuild16_avx512, ulp_rebuild16_avx2},
	.rebuild32 = {ulp_rebuild32_avx512, ulp_rebuild32_avx2},
	.anchor_rebuild = ulp_anchor_rebuild_avx2,
	.pass1_16 = ulp_pass1_16_avx512,
	.anchor_pass1_8 = ulp_anchor_pass1_8_avx2,
	.enc32 = ulp_rans_enc_avx512,
	.enc = ulp_rans_enc_avx2,
	.enc_lanes = 8,
};
