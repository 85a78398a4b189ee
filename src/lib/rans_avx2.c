/* SPDX-License-Identifier: MIT */
/*
 * rans_avx2.c - AVX2 kernel of the rANS symbol pass (pass A of the decoder in
 * codec.c), compiled alone with -mavx2 -mbmi2 and chosen at run time.
 *
 * It decodes exactly what the scalar reference decodes: 8 to 32 lanes as one
 * to four vectors of eight states; for eight consecutive elements (eight consecutive
 * lanes) it gathers the table row of each element's context, gathers the slot
 * entries, updates the states, and renormalizes the lanes that fell below
 * 2^15 from the next words, which go to those lanes in lane order (the
 * scalar order), spread by a permutation looked up from the lane mask.
 *
 * Invariants (callers guarantee):
 *  1. lanes is 8, 16 or 32 and n is a multiple of lanes.
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

size_t ulp_rans_syms_avx2(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                          const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms)
{
	const unsigned nv = lanes / 8, vm = nv - 1; /* 8, 16 or 32 lanes: 1, 2 or 4 vectors */
	const unsigned pb = d->prob_bits;
	const __m128i pbv = _mm_cvtsi32_si128((int)pb);
	const __m256i mask = _mm256_set1_epi32((int)((1u << pb) - 1));
	const __m256i m12 = _mm256_set1_epi32(0xfff), one = _mm256_set1_epi32(1);
	const __m256i lbound = _mm256_set1_epi32((int)ULP_RANS_L);
	const __m256i em = _mm256_set1_epi32((int)((1u << f->ebits) - 1));
	const __m128i shv = _mm_cvtsi32_si128((int)f->mshift);
	const int *row_off = d->row_off;
	const int *slots = (const int *)d->slots;
	const __m256i pack_lo = _mm256_setr_epi8(3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
	                                         3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
	const uint8_t *wp = *wpp;
	__m256i xv[4];
	for (unsigned j = 0; j < nv; j++)
		xv[j] = _mm256_loadu_si256((const __m256i *)(x + 8 * j));
	const __m256i off0 = _mm256_set1_epi32(row_off[0]);
	size_t i = 0;
	for (; i < n; i += 8) {
		__m256i off;
		if (ref) {
			__m256i r = f->w == 16
			                ? _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)ref + i)))
			                : _mm256_loadu_si256((const __m256i *)((const uint32_t *)ref + i));
			__m256i ctx = _mm256_and_si256(_mm256_srl_epi32(r, shv), em);
			off = _mm256_i32gather_epi32(row_off, ctx, 4);
			if (_mm256_movemask_ps(_mm256_castsi256_ps(off)))
				break; /* an unused context: the scalar path reports it */
		} else {
			off = off0;
		}
		__m256i X = xv[(i >> 3) & vm];
		__m256i e = _mm256_i32gather_epi32(slots, _mm256_add_epi32(off, _mm256_and_si256(X, mask)), 4);
		__m256i fr = _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(e, 12), m12), one);
		X = _mm256_add_epi32(_mm256_mullo_epi32(fr, _mm256_srl_epi32(X, pbv)), _mm256_and_si256(e, m12));
		/* symbols: the top byte of each entry */
		__m256i sb = _mm256_shuffle_epi8(e, pack_lo);
		uint32_t lo = (uint32_t)_mm256_extract_epi32(sb, 0), hi = (uint32_t)_mm256_extract_epi32(sb, 4);
		memcpy(syms + i, &lo, 4);
		memcpy(syms + i + 4, &hi, 4);
		/* renormalize */
		__m256i need = _mm256_cmpgt_epi32(lbound, X);
		unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(need));
		__m256i words = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)wp));
		words = _mm256_permutevar8x32_epi32(words, _mm256_loadu_si256((const __m256i *)perm[m]));
		X = _mm256_blendv_epi8(X, _mm256_or_si256(_mm256_slli_epi32(X, 16), words), need);
		wp += 2 * (unsigned)__builtin_popcount(m);
		xv[(i >> 3) & vm] = X;
	}
	/* stopped by an unused context: nothing is handed back, the caller
	 * decodes the whole range again in scalar and reports the element */
	if (i < n)
		return SIZE_MAX;
	for (unsigned j = 0; j < nv; j++)
		_mm256_storeu_si256((__m256i *)(x + 8 * j), xv[j]);
	*wpp = wp;
	return i;
}

/*
 * AVX2 reconstruction pass (pass B of the decoder) for 16-bit DELTA:
 * eight elements at a time, each element's raw bits gathered from its bit
 * position (a prefix sum of the raw lengths of its symbols), then
 * z -> d -> x = phi_inv(phi(r) + d). Works while every gather stays inside
 * the raw tail; returns the number of elements done (a multiple of 8) and
 * advances *pos by their raw bits. The scalar loop finishes the rest.
 */
size_t ulp_rebuild16_avx2(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint16_t *out)
{
	const __m256i one = _mm256_set1_epi32(1), three = _mm256_set1_epi32(3),
	              four = _mm256_set1_epi32(4), seven = _mm256_set1_epi32(7),
	              zero = _mm256_setzero_si256(), h = _mm256_set1_epi32(0x8000),
	              ffff = _mm256_set1_epi32(0xffff), bcast7 = _mm256_set1_epi32(7);
	const __m256i hi_half = _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1);
	uint64_t p = *pos;
	size_t i = 0;
	/* a group reads at most 8 * 13 bits from byte p / 8, plus 8 bytes of gather */
	for (; i + 8 <= n && p / 8 + 13 + 8 <= raw_len; i += 8) {
		__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(syms + i)));
		__m256i nr = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(s, 2), one), zero);
		/* exclusive prefix sum of nr across the eight lanes */
		__m256i inc = _mm256_add_epi32(nr, _mm256_slli_si256(nr, 4));
		inc = _mm256_add_epi32(inc, _mm256_slli_si256(inc, 8));
		inc = _mm256_add_epi32(inc, _mm256_and_si256(hi_half, _mm256_permutevar8x32_epi32(inc, _mm256_set1_epi32(3))));
		__m256i exc = _mm256_sub_epi32(inc, nr);
		uint32_t total = (uint32_t)_mm256_extract_epi32(inc, 7);
		__m256i bitpos = _mm256_add_epi32(_mm256_set1_epi32((int)(p & 7)), exc);
		__m256i byte = _mm256_srli_epi32(bitpos, 3);
		__m256i shift = _mm256_and_si256(bitpos, seven);
		const long long *base_ptr = (const long long *)(raw + p / 8);
		__m256i g0 = _mm256_i32gather_epi64(base_ptr, _mm256_castsi256_si128(byte), 1);
		__m256i g1 = _mm256_i32gather_epi64(base_ptr, _mm256_extracti128_si256(byte, 1), 1);
		g0 = _mm256_srlv_epi64(g0, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(shift)));
		g1 = _mm256_srlv_epi64(g1, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(shift, 1)));
		/* low 32 bits of each 64-bit lane, back in element order */
		__m256i bits = _mm256_permutevar8x32_epi32(
			_mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(g0), _mm256_castsi256_ps(g1), 0x88)),
			_mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
		__m256i rmask = _mm256_sub_epi32(_mm256_sllv_epi32(one, nr), one);
		__m256i lead = _mm256_or_si256(four, _mm256_and_si256(s, three));
		__m256i base = _mm256_blendv_epi8(_mm256_sllv_epi32(lead, nr), s, _mm256_cmpgt_epi32(four, s));
		__m256i z = _mm256_or_si256(base, _mm256_and_si256(bits, rmask));
		/* d = unzigzag(z); key = phi(r) + d; x = phi_inv(key), 16 bits */
		__m256i d = _mm256_xor_si256(_mm256_srli_epi32(z, 1), _mm256_sub_epi32(zero, _mm256_and_si256(z, one)));
		__m256i r = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(ref + i)));
		__m256i rs = _mm256_srli_epi32(r, 15);
		__m256i phir = _mm256_xor_si256(r, _mm256_or_si256(_mm256_sub_epi32(zero, rs), h));
		__m256i key = _mm256_and_si256(_mm256_add_epi32(phir, d), ffff);
		__m256i ks = _mm256_srli_epi32(key, 15);
		__m256i x = _mm256_and_si256(_mm256_xor_si256(key, _mm256_or_si256(_mm256_sub_epi32(ks, one), h)), ffff);
		__m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
		_mm_storeu_si128((__m128i *)(out + i), packed);
		p += total;
		(void)bcast7;
	}
	*pos = p;
	return i;
}

/* Raw fields of eight elements at bit offsets bitpos (from byte base),
 * each the low 32 bits of an unaligned 64-bit load shifted right by its
 * bit offset mod 8. */
static inline __m256i gather_bits(const uint8_t *base, __m256i bitpos)
{
	const __m256i seven = _mm256_set1_epi32(7);
	__m256i byte = _mm256_srli_epi32(bitpos, 3);
	__m256i shift = _mm256_and_si256(bitpos, seven);
	const long long *bp = (const long long *)base;
	__m256i g0 = _mm256_i32gather_epi64(bp, _mm256_castsi256_si128(byte), 1);
	__m256i g1 = _mm256_i32gather_epi64(bp, _mm256_extracti128_si256(byte, 1), 1);
	g0 = _mm256_srlv_epi64(g0, _mm256_cvtepu32_epi64(_mm256_castsi256_si128(shift)));
	g1 = _mm256_srlv_epi64(g1, _mm256_cvtepu32_epi64(_mm256_extracti128_si256(shift, 1)));
	return _mm256_permutevar8x32_epi32(
		_mm256_castps_si256(_mm256_shuffle_ps(_mm256_castsi256_ps(g0), _mm256_castsi256_ps(g1), 0x88)),
		_mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

/*
 * AVX2 reconstruction pass for 32-bit DELTA (F32): as the 16-bit one; an
 * element's raw field has up to 29 bits, 36 with its bit shift, inside its
 * 64-bit load. Eight elements read at most 7 + 7 * 29 bits past byte p / 8,
 * then 8 bytes.
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
	for (; i + 8 <= n && p / 8 + 27 + 8 <= raw_len; i += 8) {
		__m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(syms + i)));
		__m256i nr = _mm256_max_epi32(_mm256_sub_epi32(_mm256_srli_epi32(s, 2), one), zero);
		__m256i inc = _mm256_add_epi32(nr, _mm256_slli_si256(nr, 4));
		inc = _mm256_add_epi32(inc, _mm256_slli_si256(inc, 8));
		inc = _mm256_add_epi32(inc, _mm256_and_si256(hi_half, _mm256_permutevar8x32_epi32(inc, _mm256_set1_epi32(3))));
		__m256i exc = _mm256_sub_epi32(inc, nr);
		uint32_t total = (uint32_t)_mm256_extract_epi32(inc, 7);
		__m256i bits = gather_bits(raw + p / 8, _mm256_add_epi32(_mm256_set1_epi32((int)(p & 7)), exc));
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
		p += total;
	}
	*pos = p;
	return i;
}

/*
 * AVX2 reconstruction of ANCHOR elements of w = 16 or 32 bits: element i's
 * nb = w - a_bits raw bits sit at bit pos + i nb (a fixed stride), and
 * u = (v & lo) | sym << ash | (v >> ash) << (ash + a_bits). Eight elements
 * read at most 7 + 7 nb bits past byte p / 8, then 8 bytes.
 */
size_t ulp_anchor_rebuild_avx2(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms,
                               size_t n, const uint8_t *raw, size_t raw_len, uint64_t *pos,
                               void *out)
{
	const unsigned nb = w - ab;
	const __m256i stride = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
	                                          _mm256_set1_epi32((int)nb));
	const __m256i lo = _mm256_set1_epi32((int)((1u << ash) - 1));
	const __m256i vmask = _mm256_set1_epi32((int)(nb >= 32 ? ~0u : (1u << nb) - 1));
	const __m128i ashv = _mm_cvtsi32_si128((int)ash), hiv = _mm_cvtsi32_si128((int)(ash + ab));
	const size_t span = (7 + 7 * (size_t)nb) / 8 + 8;
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 8 <= n && p / 8 + span <= raw_len; i += 8) {
		__m256i v = _mm256_and_si256(gather_bits(raw + p / 8, _mm256_add_epi32(_mm256_set1_epi32((int)(p & 7)), stride)), vmask);
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
