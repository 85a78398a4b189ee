/* SPDX-License-Identifier: MIT */
/*
 * codec_width.h - the element-width parts of the codec, written once and
 * compiled for each width: codec.c includes this file four times, with W (8,
 * 16, 32 or 64) and T (the unsigned type of that width) defined, and WN(name)
 * naming each function for its width (WN(decode) is decode16 when W is 16).
 * W is a constant in every function, so the compiler drops the branches of
 * the other widths. Not a header of its own: only codec.c includes it.
 */
#if !defined(W) || !defined(T) || !defined(WN)
#error "codec_width.h is included by codec.c with W, T and WN defined"
#endif

/* branch-free: signs are random, a branch would mispredict half the time */
static inline T WN(phi)(T u)
{
	return (T)(u ^ ((T)(0 - (T)(u >> (W - 1))) | (T)((T)1 << (W - 1))));
}
static inline T WN(phi_inv)(T k)
{
	return (T)(k ^ ((T)((T)(k >> (W - 1)) - 1) | (T)((T)1 << (W - 1))));
}
static inline T WN(zz)(T d)
{
	return (T)((T)(d << 1) ^ (T)(0 - (T)(d >> (W - 1))));
}
static inline T WN(unzz)(T z)
{
	return (T)((T)(z >> 1) ^ (T)(0 - (T)(z & 1)));
}
/* pass 1 of DELTA: symbols, counts, and the raw tail (forward) */
static void WN(delta_pass1)(const ulp_kernels *K, const ulp_fmt *f, const T *x, const T *r, size_t n,
                            uint8_t *syms, uint64_t *counts, ulp_bitw *bw)
{
	const unsigned a = f->alphabet, sh = f->mshift;
	const T em = (T)((1u << f->ebits) - 1);
	/* G elements (at most 56 raw bits together) per bit-writer call */
	const unsigned G = W <= 8 ? 8 : W <= 16 ? 4 : 1;
	size_t i = 0;
	if (W == 16 && n >= 16 && K->pass1_16) {
		/* symbols, count indices and merged raw tails in AVX-512 or
		 * AVX2; counting and bit writing here */
		uint16_t cix[1024];
		uint64_t vals[256];
		uint8_t lens[256];
		/* long chunks count into four tables, one per position mod 4:
		 * runs of one symbol would otherwise chain every increment
		 * through one memory word (measured: half of this loop) */
		const size_t cells = (size_t)f->n_ctx * a;
		uint32_t *sub = n >= 32768 ? ulp_scratch(ULP_SCRATCH_COUNTS, 4 * cells * sizeof(uint32_t)) : NULL;
		if (sub)
			memset(sub, 0, 4 * cells * sizeof(uint32_t));
		while (n - i >= 16) {
			size_t m = ULP_MIN((size_t)1024, (n - i) & ~(size_t)15);
			K->pass1_16((const uint16_t *)(const void *)(x + i),
			            (const uint16_t *)(const void *)(r + i), m, sh, (unsigned)em, a,
			            syms + i, cix, vals, lens);
			if (sub) {
				for (size_t j = 0; j < m; j += 4) {
					sub[cix[j]]++;
					sub[cells + cix[j + 1]]++;
					sub[2 * cells + cix[j + 2]]++;
					sub[3 * cells + cix[j + 3]]++;
				}
			} else {
				for (size_t j = 0; j < m; j++)
					counts[cix[j]]++;
			}
			ulp_bitw lw = *bw; /* a local: in registers, not
			                      reloaded after every store */
			for (size_t g = 0; g < m / 4; g++)
				ulp_bitw_put(&lw, vals[g], lens[g]);
			*bw = lw;
			i += m;
		}
		for (size_t c = 0; sub && c < cells; c++)
			counts[c] += (uint64_t)sub[c] + sub[cells + c] + sub[2 * cells + c] + sub[3 * cells + c];
	}
	for (; W <= 32 && i + G <= n; i += G) {
		uint64_t acc = 0;
		unsigned tot = 0;
		for (unsigned g = 0; g < G; g++) {
			T ri = r[i + g];
			T z = WN(zz)((T)(WN(phi)(x[i + g]) - WN(phi)(ri)));
			unsigned nraw, s = z_symbol(z, &nraw);
			syms[i + g] = (uint8_t)s;
			counts[(size_t)((ri >> sh) & em) * a + s]++;
			acc |= ((uint64_t)z & ((1ull << nraw) - 1)) << tot;
			tot += nraw;
		}
		ulp_bitw_put(bw, acc, tot);
	}
	for (; i < n; i++) {
		T z = WN(zz)((T)(WN(phi)(x[i]) - WN(phi)(r[i])));
		unsigned nraw, s = z_symbol(z, &nraw);
		syms[i] = (uint8_t)s;
		counts[(size_t)((r[i] >> sh) & em) * a + s]++;
		ulp_bitw_put64(bw, (uint64_t)z & ((1ull << nraw) - 1), nraw);
	}
}
/* pass 1 of ANCHOR */
static void WN(anchor_pass1)(const ulp_kernels *K, const ulp_fmt *f, const T *x, size_t n,
                             uint8_t *syms, uint64_t *counts, ulp_bitw *bw)
{
	const unsigned sh = f->a_shift, ab = f->a_bits, nb = W - ab;
	const T am = (T)((1u << ab) - 1);
	const uint64_t lo = ((uint64_t)1 << sh) - 1;
	/* G elements' raw bits (at most 56) a bit-writer call, and the
	 * counts in four tables (a run of one exponent would chain every
	 * increment through one word): the bytes of one put an element
	 * (nb > 0: every format keeps mantissa bits) */
	const unsigned G = ULP_MIN(8u, 56u / nb);
	const int whole = nb % 8 == 0 && nb <= 32 && bw->fill == 0;
	uint32_t sub[4][256];
	size_t i = 0;
	if (ab <= 8 && (whole || G >= 2))
		memset(sub, 0, sizeof(sub));
	if (ab <= 8 && whole) {
		/* whole bytes an element (bf16: 1, f32: 3) from a byte
		 * boundary: the raw tail is stored, not shifted in (the same
		 * bytes: LSB-first, the bit writer's order; a 4-byte store
		 * within the 8 bytes of slack it always has) */
		const unsigned nby = nb / 8;
		uint8_t *o = bw->p;
		if (W == 16 && nby == 1 && ab == 8 && K->anchor_pass1_8) {
			/* symbols and raw bytes by the kernel, counted here */
			i = K->anchor_pass1_8((const uint16_t *)(const void *)x, n, sh, syms, o);
			for (size_t j = 0; j + 4 <= i; j += 4) {
				sub[0][syms[j]]++;
				sub[1][syms[j + 1]]++;
				sub[2][syms[j + 2]]++;
				sub[3][syms[j + 3]]++;
			}
			o += i;
		}
		for (; i < n; i++) {
			uint64_t u = x[i];
			unsigned s = (unsigned)((u >> sh) & am);
			syms[i] = (uint8_t)s;
			sub[i & 3][s]++;
			ulp_st32(o, (uint32_t)((u & lo) | ((u >> (sh + ab)) << sh)));
			o += nby;
		}
		bw->p = o;
	} else if (ab <= 8 && G >= 2) {
		ulp_bitw lw = *bw;
		for (; i + G <= n; i += G) {
			uint64_t acc = 0;
			for (unsigned g = 0; g < G; g++) {
				uint64_t u = x[i + g];
				unsigned s = (unsigned)((u >> sh) & am);
				syms[i + g] = (uint8_t)s;
				sub[g & 3][s]++;
				acc |= ((u & lo) | ((u >> (sh + ab)) << sh)) << (g * nb);
			}
			ulp_bitw_put(&lw, acc, G * nb);
		}
		*bw = lw;
	}
	if (ab <= 8 && (whole || G >= 2))
		for (unsigned c = 0; c <= am; c++)
			counts[c] += (uint64_t)sub[0][c] + sub[1][c] + sub[2][c] + sub[3][c];
	for (; i < n; i++) {
		uint64_t u = x[i];
		unsigned s = (unsigned)((x[i] >> sh) & am);
		syms[i] = (uint8_t)s;
		counts[s]++;
		ulp_bitw_put64(bw, (u & lo) | ((u >> (sh + ab)) << sh), nb);
	}
}
/* rANS, backward; row of each element from its reference */
static void WN(put_rans)(const ulp_fmt *f, const ulp_table *t,
                         const ulp_rans_esym *es, unsigned lanes,
                         const uint8_t *syms, const T *r, size_t n, uint32_t *x,
                         uint16_t **pp)
{
	const unsigned sh = f->mshift, pb = t->prob_bits, A = t->alphabet;
	const T em = (T)((1u << f->ebits) - 1);
	const unsigned lm = lanes - 1;
	const uint16_t *cr = t->ctx_row; /* locals: the stores below are
	                                    uint16_t and could alias t */
	uint16_t *p = *pp;
	if (r && pb == ULP_PROB_BITS_MAX) { /* the common precision, constant */
		for (size_t i = n; i-- > 0;)
			ulp_rans_enc_put(&x[i & lm], &p,
			                 &es[(size_t)cr[(r[i] >> sh) & em] * A + syms[i]],
			                 ULP_PROB_BITS_MAX);
	} else if (r) {
		for (size_t i = n; i-- > 0;)
			ulp_rans_enc_put(&x[i & lm], &p,
			                 &es[(size_t)cr[(r[i] >> sh) & em] * A + syms[i]], pb);
	} else {
		const ulp_rans_esym *row = es + (size_t)cr[0] * A;
		for (size_t i = n; i-- > 0;)
			ulp_rans_enc_put(&x[i & lm], &p, &row[syms[i]], pb);
	}
	*pp = p;
}
/* pass A of decode<W> with references, scalar, in rounds of L lanes
 * (elements i..i + L - 1 of a round are lanes 0..L - 1: i starts at a
 * multiple of L), L and pb constants where inlined: the states stay in
 * locals, no lane index a step. Stops at the round holding an unused
 * context (the caller's loop reports it); returns where it stopped. */
static ULP_FORCE_INLINE size_t WN(passa)(
        const ulp_dtab *d, unsigned L, unsigned pb, unsigned sh, T em,
        uint32_t *x, const T *rb, uint8_t *syms, size_t i, size_t bn,
        const uint8_t **wpp)
{
	uint32_t xs[ULP_LANES_MAX];
	const uint8_t *w = *wpp;
	const uint32_t *slots = d->slots;
	const int32_t *row_off = d->row_off;
	for (unsigned l = 0; l < L; l++)
		xs[l] = x[l];
	for (; i + L <= bn; i += L) {
		int32_t o[ULP_LANES_MAX], bad = 0;
		_Pragma("GCC unroll 32")
		for (unsigned l = 0; l < L; l++)
			bad |= o[l] = row_off[(rb[i + l] >> sh) & em];
		if (bad < 0)
			break;
		_Pragma("GCC unroll 32")
		for (unsigned l = 0; l < L; l++)
			syms[i + l] = rans_step(&xs[l], slots + o[l], (1u << pb) - 1, pb, &w);
	}
	for (unsigned l = 0; l < L; l++)
		x[l] = xs[l];
	*wpp = w;
	return i;
}
/* pass B of decode<W>, DELTA: elements start..bn - 1 of a block from
 * their symbols and the raw tail at bit *posp, which advances */
static void WN(passb)(const ulp_kernels *K, const ulp_dtab *d, const uint8_t *syms, const T *rb, T *ob,
                      size_t bn, size_t start, const uint8_t *raw, size_t raw_len,
                      uint64_t *posp)
{
	uint64_t pos = *posp;
	size_t j0 = start;
	for (unsigned k = 0; k < 2; k++) {
		if (W == 16 && K->rebuild16[k])
			j0 += K->rebuild16[k](syms + j0, (const uint16_t *)(const void *)rb + j0, bn - j0,
			                      raw, raw_len, &pos, (uint16_t *)(void *)ob + j0);
		if (W == 32 && K->rebuild32[k])
			j0 += K->rebuild32[k](syms + j0, (const uint32_t *)(const void *)rb + j0, bn - j0,
			                      raw, raw_len, &pos, (uint32_t *)(void *)ob + j0);
	}
	size_t i = j0;
	uint64_t q = pos; /* a register copy */
	/* 64 elements at a time while they cannot reach the tail's last 8
	 * bytes (W - 3 raw bits at most an element): one unchecked 64-bit
	 * load an element; the checked loop below does the rest (the last
	 * few dozen elements of the tail) */
	for (size_t e; W <= 32 && i < bn; ) {
		e = i + ULP_MIN(bn - i, (size_t)64);
		if (q / 8 + ((uint64_t)(e - i) * (W - 3) + 7) / 8 + 8 > raw_len)
			break;
		/* 16 bits: four elements a 64-bit word (swar16) */
		for (; W == 16 && i + 4 <= e; i += 4) {
			uint64_t z4 = 0;
			_Pragma("GCC unroll 4")
			for (unsigned g = 0; g < 4; g++) {
				unsigned s = syms[i + g], nr = d->nraw[s];
				uint64_t w64 = ulp_ld64(raw + (q >> 3)) >> (q & 7);
				uint64_t z = d->base[s] | (w64 & d->rmask[s]);
				q += nr;
				z4 |= (uint64_t)(uint16_t)z << (16 * g);
			}
			uint64_t r4;
			memcpy(&r4, rb + i, 8);
			r4 = swar16(r4, z4);
			memcpy(ob + i, &r4, 8);
		}
		for (; i < e; i++) {
			unsigned s = syms[i], nr = d->nraw[s];
			uint64_t w64 = ulp_ld64(raw + (q >> 3)) >> (q & 7);
			uint64_t z = d->base[s] | (w64 & d->rmask[s]);
			q += nr;
			ob[i] = WN(phi_inv)((T)(WN(phi)(rb[i]) + WN(unzz)((T)z)));
		}
	}
	for (; i < bn; i++) {
		unsigned s = syms[i], nr = d->nraw[s];
		uint64_t z = d->base[s] | raw_bits_at(raw, raw_len, q, nr);
		q += nr;
		ob[i] = WN(phi_inv)((T)(WN(phi)(rb[i]) + WN(unzz)((T)z)));
	}
	*posp = q;
}
/* Decoding runs in blocks of ULP_DEC_BLOCK elements, in two passes:
 * A decodes the block's symbols (one rANS step per element, lanes
 * independent), B pulls each element's raw bits at a position known
 * from a running sum, and rebuilds the element. Splitting keeps both
 * loops short and free of serial bit-reader dependencies. The scalar
 * 16-bit path with references runs both a round of lanes at a time
 * (fused16) as far as it can, then the two passes do the rest. */
static int WN(decode)(const ulp_kernels *K, const ulp_fmt *f, const ulp_dtab *d, unsigned lanes,
                      uint32_t *x, const uint8_t **wpp, const uint8_t *wend,
                      const uint8_t *raw, size_t raw_len, uint64_t raw_bits,
                      const T *r, size_t n, T *out, ulp_err *err)
{
	const unsigned pb = d->prob_bits, lm = lanes - 1;
	const uint32_t mask = (1u << pb) - 1;
	const unsigned sh = r ? f->mshift : 0, ash = f->a_shift, ab = f->a_bits;
	const T em = (T)((1u << f->ebits) - 1);
	const uint32_t *row0 = d->row[0];
	const uint8_t *wp = *wpp;
	/* two symbol buffers: with fuse, block k's pass B runs during
	 * block k + 1's pass A (8-lane AVX2, whose serial chain leaves
	 * the core idle), pend while it is not finished */
	uint8_t symbuf[2][ULP_DEC_BLOCK];
	const int fuse = W == 16 && r && lanes == 8 && K->rb16_beside;
	const int scalar16 = W == 16 && K->scalar;
	ulp_rb16_job bg = {0};
	int pend = 0;
	uint8_t wtail[2 * ULP_DEC_BLOCK + 32]; /* see pass A */
	uint64_t pos = 0;
	if (!r && !row0)
		return ULP_CORRUPT(err, "anchor table has no row for context 0");
	for (size_t b0 = 0; b0 < n; b0 += ULP_DEC_BLOCK) {
		const size_t bn = ULP_MIN((size_t)ULP_DEC_BLOCK, n - b0);
		const T *rb = r ? r + b0 : NULL;
		T *ob = out + b0;
		uint8_t *syms = symbuf[(b0 / ULP_DEC_BLOCK) & 1];
		/* pass A: symbols, with word reads unchecked: while the stream
		 * holds a block's worst case (one word an element) in place,
		 * else from a zero-padded copy of its last words, consumed at
		 * most as far as they go (checked after the block) */
		const uint8_t *wreal = NULL;
		const size_t wavail = (size_t)(wend - wp);
		if (wavail < 2 * bn) {
			memcpy(wtail, wp, wavail);
			memset(wtail + wavail, 0, sizeof(wtail) - wavail);
			wreal = wp;
			wp = wtail;
		}
		size_t i0 = 0, m = SIZE_MAX, bstart = 0; /* pass B from bstart */
		if (W == 16 || W == 32) {
			if (lanes >= 16 && bn >= 64 && (!rb || d->rowb_ok) && K->syms_wide)
				m = K->syms_wide(f, d, lanes, x, &wp, rb, bn & ~(size_t)63, syms);
			else if (K->syms && lanes >= K->syms_lanes && bn >= 32)
				m = K->syms(f, d, lanes, x, &wp, rb, bn & ~(size_t)31, syms,
				            pend ? &bg : NULL);
			i0 = m == SIZE_MAX ? 0 : m;
		}
		{
			/* the common precision as a constant: shifts by an
			 * immediate, one register less */
			/* w: a register copy (wp's address goes to the SIMD
			 * kernels, so wp itself lives in memory) */
			const uint8_t *w = wp;
			/* scalar 16-bit: passes A and B fused as far as they go
			 * (bf16's context field and precision 12 constant) */
			if (W == 16 && rb && scalar16 && (lanes == 8 || lanes == 32) && i0 == 0) {
				const uint16_t *rb16 = (const uint16_t *)(const void *)rb;
				uint16_t *ob16 = (uint16_t *)(void *)ob;
				if (sh == 7 && em == 0xff && pb == 12)
					i0 = lanes == 8 ? fused16(d, 8, 12, 7, 0xff, x, rb16, ob16, 0, bn, &w, raw, raw_len, &pos)
					                : fused16(d, 32, 12, 7, 0xff, x, rb16, ob16, 0, bn, &w, raw, raw_len, &pos);
				else
					i0 = lanes == 8 ? fused16(d, 8, pb, sh, em, x, rb16, ob16, 0, bn, &w, raw, raw_len, &pos)
					                : fused16(d, 32, pb, sh, em, x, rb16, ob16, 0, bn, &w, raw, raw_len, &pos);
				bstart = i0;
			}
			/* precisions 12 and 10 (the common ones) as constants */
			if (rb && (W == 16 || W == 32) && (lanes == 8 || lanes == 32) &&
			    i0 % lanes == 0) {
				if (lanes == 8 && pb == 12)
					i0 = WN(passa)(d, 8, 12, sh, em, x, rb, syms, i0, bn, &w);
				else if (lanes == 8 && pb == 10)
					i0 = WN(passa)(d, 8, 10, sh, em, x, rb, syms, i0, bn, &w);
				else if (lanes == 8)
					i0 = WN(passa)(d, 8, pb, sh, em, x, rb, syms, i0, bn, &w);
				else if (pb == 12)
					i0 = WN(passa)(d, 32, 12, sh, em, x, rb, syms, i0, bn, &w);
				else if (pb == 10)
					i0 = WN(passa)(d, 32, 10, sh, em, x, rb, syms, i0, bn, &w);
				else
					i0 = WN(passa)(d, 32, pb, sh, em, x, rb, syms, i0, bn, &w);
			}
			if (rb && pb == ULP_PROB_BITS_MAX) {
				for (size_t i = i0; i < bn; i++) {
					const uint32_t *row = d->row[(rb[i] >> sh) & em];
					if (__builtin_expect(!row, 0))
						return ULP_CORRUPT(err, "element %zu: reference exponent %u has no table row",
						                   b0 + i, (unsigned)((rb[i] >> sh) & em));
					syms[i] = rans_step(&x[i & lm], row, (1u << ULP_PROB_BITS_MAX) - 1,
					                    ULP_PROB_BITS_MAX, &w);
				}
			} else if (rb) {
				for (size_t i = i0; i < bn; i++) {
					const uint32_t *row = d->row[(rb[i] >> sh) & em];
					if (__builtin_expect(!row, 0))
						return ULP_CORRUPT(err, "element %zu: reference exponent %u has no table row",
						                   b0 + i, (unsigned)((rb[i] >> sh) & em));
					syms[i] = rans_step(&x[i & lm], row, mask, pb, &w);
				}
			} else {
				for (size_t i = i0; i < bn; i++)
					syms[i] = rans_step(&x[i & lm], row0, mask, pb, &w);
			}
			wp = w;
		}
		if (wreal) {
			const size_t used = (size_t)(wp - wtail);
			if (used > wavail)
				return ULP_CORRUPT(err, "rANS stream ends early in elements %zu..%zu",
				                   b0, b0 + bn - 1);
			wp = wreal + used;
		}
		if (pend) { /* the rest of the previous block's pass B */
			pos = bg.pos;
			WN(passb)(K, d, bg.syms, (const T *)(const void *)bg.ref, (T *)(void *)bg.out,
			         bg.n, bg.done, raw, raw_len, &pos);
			pend = 0;
		}
		/* pass B: raw bits and reconstruction; reads past the tail give
		 * zeros and the final bit count reports them */
		if (pos > raw_bits)
			return ULP_CORRUPT(err, "raw tail of %llu bits is too short for element block %zu",
			                   (unsigned long long)raw_bits, b0);
		if (fuse && b0 + bn < n) {
			/* runs beside the next block's pass A */
			bg = (ulp_rb16_job){syms, (const uint16_t *)(const void *)rb,
			                    (uint16_t *)(void *)ob, bn, 0, raw, raw_len, pos};
			pend = 1;
		} else if (rb) {
			WN(passb)(K, d, syms, rb, ob, bn, bstart, raw, raw_len, &pos);
		} else {
			const unsigned nb = W - ab;
			const uint64_t lo = ((uint64_t)1 << ash) - 1;
			size_t i = 0;
			if ((W == 16 || W == 32) && K->anchor_rebuild)
				i = K->anchor_rebuild(W, ash, ab, syms, bn, raw, raw_len, &pos, ob);
			for (; i < bn; i++) {
				uint64_t v = raw_bits_at(raw, raw_len, pos, nb);
				pos += nb;
				ob[i] = (T)((v & lo) | ((uint64_t)syms[i] << ash) |
				            ((v >> ash) << (ash + ab)));
			}
		}
	}
	if (pos != raw_bits)
		return ULP_CORRUPT(err, "raw tail holds %llu bits, the symbols use %llu",
		                   (unsigned long long)raw_bits, (unsigned long long)pos);
	*wpp = wp;
	return 0;
}
