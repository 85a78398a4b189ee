/* SPDX-License-Identifier: MIT */
/*
 * rans_neon.c - aarch64 Advanced SIMD (NEON) kernels: the decoder's rANS
 * symbol pass (pass A of codec.c), its 16- and 32-bit DELTA and ANCHOR
 * reconstruction (pass B), and the rANS encoder. Compiled alone, chosen at
 * run time (ULP_CPU_NEON); each decodes exactly what the scalar reference
 * decodes and encodes exactly the scalar reference's bytes.
 *
 * Symbol pass: four consecutive elements are four consecutive lanes, one
 * vector of states; their slot entries are loaded one by one (NEON has no
 * gather), the state update and renormalization are vector code: the lanes
 * that fell below 2^15 take the next words in lane order (the scalar order),
 * spread by a byte table lookup indexed by the 4-bit lane mask.
 *
 * Invariants (callers guarantee, as for the AVX2 twins):
 *  1. lanes is 4, 8, 16 or 32 and n is a multiple of lanes.
 *  2. The word stream holds at least 2 n bytes from *wpp, so every 8-byte
 *     load of words stays inside it.
 *  3. An element whose context has no row stops the symbol pass, which then
 *     returns SIZE_MAX and leaves x and *wpp untouched.
 */
#include "config.h"
#include "codec.h"
#include <arm_neon.h>

/* spread[m]: byte shuffle giving lane j (set in m) the 16-bit word number
 * popcount(m & ((1 << j) - 1)) zero-extended; lanes not in m get zero. */
static uint8_t spread[16][16];

__attribute__((constructor)) static void init_spread(void)
{
	for (unsigned m = 0; m < 16; m++) {
		unsigned k = 0;
		for (unsigned j = 0; j < 4; j++) {
			uint8_t *b = spread[m] + 4 * j;
			if (m >> j & 1) {
				b[0] = (uint8_t)(2 * k);
				b[1] = (uint8_t)(2 * k + 1);
				k++;
			} else {
				b[0] = b[1] = 0xff;
			}
			b[2] = b[3] = 0xff; /* out of range: zero */
		}
	}
}

size_t ulp_rans_syms_neon(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                          const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms)
{
	const unsigned nv = lanes / 4, vm = nv - 1; /* 1, 2, 4 or 8 vectors */
	const unsigned pb = d->prob_bits, sh = f->mshift;
	const uint32_t mask = (1u << pb) - 1, em = (1u << f->ebits) - 1;
	const int32x4_t npb = vdupq_n_s32(-(int)pb);
	const uint32x4_t m12 = vdupq_n_u32(0xfff), one = vdupq_n_u32(1);
	const uint32x4_t lbound = vdupq_n_u32(ULP_RANS_L), bitv = {1, 2, 4, 8};
	const int32_t *row_off = d->row_off;
	const uint32_t *slots = d->slots;
	const uint8_t *wp = *wpp;
	uint32x4_t xv[8];
	for (unsigned j = 0; j < nv; j++)
		xv[j] = vld1q_u32(x + 4 * j);
	size_t i = 0;
	for (; i < n; i += 4) {
		uint32x4_t X = xv[(i >> 2) & vm];
		uint32_t xs[4], e[4];
		vst1q_u32(xs, X);
		if (ref) {
			int32_t o[4];
			for (unsigned k = 0; k < 4; k++) {
				uint32_t r = f->w == 16 ? ((const uint16_t *)ref)[i + k] : ((const uint32_t *)ref)[i + k];
				o[k] = row_off[(r >> sh) & em];
			}
			if ((o[0] | o[1] | o[2] | o[3]) < 0)
				break; /* an unused context: the scalar path reports it */
			for (unsigned k = 0; k < 4; k++)
				e[k] = slots[(uint32_t)o[k] + (xs[k] & mask)];
		} else {
			const uint32_t *row = slots + row_off[0];
			for (unsigned k = 0; k < 4; k++)
				e[k] = row[xs[k] & mask];
		}
		uint32x4_t E = vld1q_u32(e);
		uint32x4_t fr = vaddq_u32(vandq_u32(vshrq_n_u32(E, 12), m12), one);
		X = vmlaq_u32(vandq_u32(E, m12), fr, vshlq_u32(X, npb));
		/* symbols: the top byte of each entry */
		uint8x8_t sb = vmovn_u16(vcombine_u16(vmovn_u32(vshrq_n_u32(E, 24)), vdup_n_u16(0)));
		uint32_t s4 = vget_lane_u32(vreinterpret_u32_u8(sb), 0);
		memcpy(syms + i, &s4, 4);
		/* renormalize */
		uint32x4_t need = vcltq_u32(X, lbound);
		unsigned m = vaddvq_u32(vandq_u32(need, bitv));
		uint8x16_t w = vcombine_u8(vld1_u8(wp), vdup_n_u8(0));
		uint32x4_t words = vreinterpretq_u32_u8(vqtbl1q_u8(w, vld1q_u8(spread[m])));
		X = vbslq_u32(need, vorrq_u32(vshlq_n_u32(X, 16), words), X);
		wp += 2 * (unsigned)__builtin_popcount(m);
		xv[(i >> 2) & vm] = X;
	}
	if (i < n)
		return SIZE_MAX;
	for (unsigned j = 0; j < nv; j++)
		vst1q_u32(x + 4 * j, xv[j]);
	*wpp = wp;
	return i;
}

/*
 * Reconstruction of W-bit DELTA elements (W = 16 or 32), four at a time:
 * raw lengths and their exclusive prefix sum in vector code, the four raw
 * fields loaded from their bit positions, then z -> d -> x = phi_inv(phi(r)
 * + d) in vector code. Works while every 8-byte load stays inside the raw
 * tail; returns the elements done (a multiple of 4), *pos advanced past
 * their raw bits. The scalar loop finishes the rest.
 */
static inline uint32x4_t rebuild4(const uint8_t *syms, const uint8_t *raw, uint64_t *pp)
{
	const uint32x4_t one = vdupq_n_u32(1), three = vdupq_n_u32(3), four = vdupq_n_u32(4);
	const uint32x4_t zero = vdupq_n_u32(0);
	uint32_t s4;
	memcpy(&s4, syms, 4);
	uint32x4_t s = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(s4)))));
	uint32x4_t nr = vqsubq_u32(vshrq_n_u32(s, 2), one);
	/* exclusive prefix sum of nr */
	uint32x4_t inc = vaddq_u32(nr, vextq_u32(zero, nr, 3));
	inc = vaddq_u32(inc, vextq_u32(zero, inc, 2));
	uint32x4_t exc = vsubq_u32(inc, nr);
	uint64_t p = *pp;
	uint32_t bp[4], bits[4];
	vst1q_u32(bp, vaddq_u32(exc, vdupq_n_u32((uint32_t)(p & 7))));
	const uint8_t *base_ptr = raw + p / 8;
	for (unsigned k = 0; k < 4; k++)
		bits[k] = (uint32_t)(ulp_ld64(base_ptr + (bp[k] >> 3)) >> (bp[k] & 7));
	*pp = p + vgetq_lane_u32(inc, 3);
	uint32x4_t rmask = vsubq_u32(vshlq_u32(one, vreinterpretq_s32_u32(nr)), one);
	uint32x4_t lead = vorrq_u32(four, vandq_u32(s, three));
	uint32x4_t base = vbslq_u32(vcltq_u32(s, four), s, vshlq_u32(lead, vreinterpretq_s32_u32(nr)));
	uint32x4_t z = vorrq_u32(base, vandq_u32(vld1q_u32(bits), rmask));
	/* d = unzigzag(z) */
	return veorq_u32(vshrq_n_u32(z, 1), vsubq_u32(zero, vandq_u32(z, one)));
}

size_t ulp_rebuild16_neon(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint16_t *out)
{
	const uint16x4_t h = vdup_n_u16(0x8000);
	uint64_t p = *pos;
	size_t i = 0;
	/* four elements read at most 7 + 3 * 13 bits past byte p / 8, then 8 bytes */
	for (; i + 4 <= n && p / 8 + 6 + 8 <= raw_len; i += 4) {
		uint16x4_t d = vmovn_u32(rebuild4(syms + i, raw, &p));
		uint16x4_t r = vld1_u16(ref + i);
		uint16x4_t rs = vreinterpret_u16_s16(vshr_n_s16(vreinterpret_s16_u16(r), 15));
		uint16x4_t key = vadd_u16(veor_u16(r, vorr_u16(rs, h)), d);
		uint16x4_t ks = vshr_n_u16(key, 15);
		vst1_u16(out + i, veor_u16(key, vorr_u16(vsub_u16(ks, vdup_n_u16(1)), h)));
	}
	*pos = p;
	return i;
}

size_t ulp_rebuild32_neon(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint32_t *out)
{
	const uint32x4_t h = vdupq_n_u32(0x80000000u);
	uint64_t p = *pos;
	size_t i = 0;
	/* four elements read at most 7 + 3 * 29 bits past byte p / 8, then 8 bytes */
	for (; i + 4 <= n && p / 8 + 12 + 8 <= raw_len; i += 4) {
		uint32x4_t d = rebuild4(syms + i, raw, &p);
		uint32x4_t r = vld1q_u32(ref + i);
		uint32x4_t rs = vreinterpretq_u32_s32(vshrq_n_s32(vreinterpretq_s32_u32(r), 31));
		uint32x4_t key = vaddq_u32(veorq_u32(r, vorrq_u32(rs, h)), d);
		uint32x4_t ks = vshrq_n_u32(key, 31);
		vst1q_u32(out + i, veorq_u32(key, vorrq_u32(vsubq_u32(ks, vdupq_n_u32(1)), h)));
	}
	*pos = p;
	return i;
}

/*
 * Reconstruction of ANCHOR elements of w = 16 or 32 bits, four at a time:
 * element i's nb = w - a_bits raw bits sit at bit pos + i nb (a fixed
 * stride), loaded one by one, and u = (v & lo) | sym << ash | (v >> ash) <<
 * (ash + a_bits) in vector code. Four elements read at most 7 + 3 nb bits
 * past byte p / 8, then 8 bytes; returns the elements done (a multiple of 4).
 */
size_t ulp_anchor_rebuild_neon(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms,
                               size_t n, const uint8_t *raw, size_t raw_len, uint64_t *pos,
                               void *out)
{
	const unsigned nb = w - ab;
	const uint32_t vm = nb >= 32 ? ~0u : (1u << nb) - 1;
	const uint32x4_t lo = vdupq_n_u32((1u << ash) - 1), vmask = vdupq_n_u32(vm);
	const int32x4_t up = vdupq_n_s32((int)ash), down = vdupq_n_s32(-(int)ash),
	                hi = vdupq_n_s32((int)(ash + ab));
	const size_t span = (7 + 3 * (size_t)nb) / 8 + 8;
	uint64_t p = *pos;
	size_t i = 0;
	for (; i + 4 <= n && p / 8 + span <= raw_len; i += 4) {
		uint32_t v[4];
		for (unsigned k = 0; k < 4; k++) {
			uint64_t b = p + (uint64_t)k * nb;
			v[k] = (uint32_t)(ulp_ld64(raw + b / 8) >> (b & 7));
		}
		uint32_t s4;
		memcpy(&s4, syms + i, 4);
		uint32x4_t s = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(s4)))));
		uint32x4_t V = vandq_u32(vld1q_u32(v), vmask);
		uint32x4_t u = vorrq_u32(vandq_u32(V, lo), vshlq_u32(s, up));
		u = vorrq_u32(u, vshlq_u32(vshlq_u32(V, down), hi));
		if (w == 16)
			vst1_u16((uint16_t *)out + i, vmovn_u32(u));
		else
			vst1q_u32((uint32_t *)out + i, u);
		p += 4 * (uint64_t)nb;
	}
	*pos = p;
	return i;
}

/*
 * NEON rANS encoder of elements [0, n) (n a multiple of lanes) with 4 to 32
 * lanes, the contract of its AVX2 twin (rans_avx2.c): run after the scalar
 * loop has coded elements n and up, it continues from the states x and the
 * front *pp and produces exactly the scalar ulp_rans_enc_put() sequence.
 * Four consecutive elements are four consecutive lanes (one vector); per
 * block of 1024 elements a scalar pass looks up each element's packed entry
 * (es64[row(ctx) * alphabet + symbol]: rcp, and freq | bias << 13 | rshift <<
 * 26); per group the renormalization words go below the front in lane order,
 * packed into the top of an 8-byte store at *pp - 4 (callers leave 16 free
 * bytes below any front: the lane states' room), then the fold x + bias +
 * q (2^n - freq) with q = (x rcp) >> 32 >> rshift.
 */
static uint8_t enc_pack4[16][8];

__attribute__((constructor)) static void init_enc_pack4(void)
{
	for (unsigned m = 0; m < 16; m++) {
		unsigned k = 4 - (unsigned)__builtin_popcount(m);
		memset(enc_pack4[m], 0xff, 8);
		for (unsigned j = 0; j < 4; j++)
			if (m >> j & 1) {
				enc_pack4[m][2 * k] = (uint8_t)(4 * j);
				enc_pack4[m][2 * k + 1] = (uint8_t)(4 * j + 1);
				k++;
			}
	}
}

void ulp_rans_enc_neon(const ulp_fmt *f, unsigned pb, const uint16_t *ctx_row, unsigned n_ctx,
                       unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                       const void *ref, unsigned lanes, size_t n, uint32_t *x, uint16_t **pp)
{
	enum { EB = 1024 }; /* elements a block of looked-up entries */
	uint32_t rowa[256], erc[EB], epk[EB];
	const unsigned nc = n_ctx < 256 ? n_ctx : 256;
	for (unsigned c = 0; c < 256; c++)
		rowa[c] = c < nc && ctx_row[c] != ULP_CTX_UNUSED ? ctx_row[c] * alphabet : 0;
	const unsigned nv = lanes / 4, vm = nv - 1;
	const unsigned sh = f->mshift, em = ((1u << f->ebits) - 1) & 255;
	const uint32x4_t m13 = vdupq_n_u32(0x1fff), one_n = vdupq_n_u32(1u << pb);
	const uint32x4_t bitv = {1, 2, 4, 8};
	const int32x4_t xmsh = vdupq_n_s32((int)(31 - pb));
	const uint16_t *r16 = f->w == 16 ? ref : NULL;
	const uint32_t *r32 = f->w == 32 ? ref : NULL;
	uint16_t *p = *pp;
	uint32x4_t xv[8];
	for (unsigned j = 0; j < nv; j++)
		xv[j] = vld1q_u32(x + 4 * j);
	for (size_t bend = n; bend > 0;) {
		const size_t b0 = bend > EB ? bend - EB : 0, bn = bend - b0;
		const uint64_t *row0 = es64 + rowa[0];
		for (size_t j = 0; j < bn; j++) {
			uint64_t e = r16 ? es64[rowa[(r16[b0 + j] >> sh) & em] + syms[b0 + j]]
			           : r32 ? es64[rowa[(r32[b0 + j] >> sh) & em] + syms[b0 + j]]
			                 : row0[syms[b0 + j]];
			erc[j] = (uint32_t)e;
			epk[j] = (uint32_t)(e >> 32);
		}
		for (size_t g = bn; g > 0; g -= 4) {
			const size_t i = b0 + g - 4;
			uint32x4_t rcp = vld1q_u32(erc + g - 4), pk = vld1q_u32(epk + g - 4);
			uint32x4_t freq = vandq_u32(pk, m13);
			uint32x4_t bias = vandq_u32(vshrq_n_u32(pk, 13), m13);
			int32x4_t nrsh = vnegq_s32(vreinterpretq_s32_u32(vshrq_n_u32(pk, 26)));
			uint32x4_t X = xv[(i >> 2) & vm];
			uint32x4_t need = vcgeq_u32(X, vshlq_u32(freq, xmsh));
			unsigned m = vaddvq_u32(vandq_u32(need, bitv));
			uint8x8_t w = vqtbl1_u8(vreinterpretq_u8_u32(X), vld1_u8(enc_pack4[m]));
			vst1_u8((uint8_t *)(void *)(p - 4), w);
			p -= __builtin_popcount(m);
			X = vbslq_u32(need, vshrq_n_u32(X, 16), X);
			uint32x4_t q = vcombine_u32(vshrn_n_u64(vmull_u32(vget_low_u32(X), vget_low_u32(rcp)), 32),
			                            vshrn_n_u64(vmull_high_u32(X, rcp), 32));
			q = vshlq_u32(q, nrsh);
			X = vmlaq_u32(vaddq_u32(X, bias), q, vsubq_u32(one_n, freq));
			xv[(i >> 2) & vm] = X;
		}
		bend = b0;
	}
	for (unsigned j = 0; j < nv; j++)
		vst1q_u32(x + 4 * j, xv[j]);
	*pp = p;
}

/* The symbol pass in the table's signature (NEON runs no reconstruction
 * beside it: bg is never given). */
static size_t syms_row(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                       const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms,
                       ulp_rb16_job *bg)
{
	(void)bg;
	return ulp_rans_syms_neon(f, d, lanes, x, wpp, ref, n, syms);
}

/* This file's row of the kernel table (codec.h). */
const ulp_kernels ulp_kernels_neon = {
	.name = "neon",
	.syms = syms_row,
	.syms_lanes = 4,
	.rebuild16 = {ulp_rebuild16_neon, NULL},
	.rebuild32 = {ulp_rebuild32_neon, NULL},
	.anchor_rebuild = ulp_anchor_rebuild_neon,
	.enc = ulp_rans_enc_neon,
	.enc_lanes = 4,
};
