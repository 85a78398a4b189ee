/* SPDX-License-Identifier: MIT */
/*
 * codec.c - ULPack element transforms and the scalar reference kernels of the
 * DELTA and ANCHOR codecs. Integer arithmetic only.
 *
 * DELTA (ulpack-format(5) section 6), per element x with reference r, w bits:
 *   phi(u)  = u ^ 2^(w-1) if the sign bit of u is clear, ~u if it is set
 *   d       = phi(x) - phi(r) mod 2^w, read as signed
 *   z       = zigzag(d) = (d << 1) ^ (d >> (w-1))  (arithmetic shift)
 *   symbol  = z                           if z < 4
 *           = 4 (b - 3) + (z >> (b - 3))  otherwise, b = bitlen(z)
 *   raw     = the b - 3 bits of z under its top three bits (z >= 4)
 *   context = the exponent field of r
 * The symbol carries b and the two bits under the leading one (q1, q2): one
 * joint rANS symbol per element is the product model P(b) P(q1|b) P(q2|b,q1).
 *
 * ANCHOR (section 7), no reference: symbol = a_bits bits of u starting at bit
 * a_shift (the exponent field, or its top 8 bits for F64), context 0; raw =
 * the remaining w - a_bits bits, low part first.
 *
 * The SIMD kernels are reached only through the kernel table (ulp_kernels,
 * codec.h): each entry point asks ulp_kernels_get once and hands the row to
 * the width code of codec_width.h, which runs a kernel where the row has one
 * and its own scalar loop otherwise.
 *
 * Invariants:
 *  1. symbol(z) < alphabet = 4w - 4 for every w-bit z, and z is recovered
 *     exactly from (symbol, raw) by sym_base/sym_nraw below.
 *  2. Kernels never read or write outside [ptr, ptr + len) of any argument.
 */
#include "config.h"
#include "codec.h"
#include <pthread.h>
#include <stdlib.h>

#define ULP_DEC_BLOCK 2048 /* elements a decode block; a multiple of 32 lanes */

int ulp_fmt_get(ulp_dtype dt, ulp_fmt *f)
{
	switch (dt) {
	case ULP_DT_BF16: *f = (ulp_fmt){16, 7, 8, 0, 0, 7, 8}; break;
	case ULP_DT_F16: *f = (ulp_fmt){16, 10, 5, 0, 0, 10, 5}; break;
	case ULP_DT_F32: *f = (ulp_fmt){32, 23, 8, 0, 0, 23, 8}; break;
	case ULP_DT_F64: *f = (ulp_fmt){64, 52, 11, 0, 0, 55, 8}; break;
	case ULP_DT_F8_E4M3: *f = (ulp_fmt){8, 3, 4, 0, 0, 3, 4}; break;
	case ULP_DT_F8_E5M2: *f = (ulp_fmt){8, 2, 5, 0, 0, 2, 5}; break;
	default: return -ULP_E_INVAL;
	}
	f->n_ctx = 1u << f->ebits;
	f->alphabet = 4 * f->w - 4;
	return 0;
}

/* ---- symbol mapping ---------------------------------------------------- */

static inline unsigned z_symbol(uint64_t z, unsigned *nraw)
{
	/* with b = bitlen(z | 4), z < 8 gives b = 3 and symbol z: no branch */
	unsigned k = 61 - (unsigned)__builtin_clzll(z | 4); /* b - 3 */
	*nraw = k;
	return 4 * k + (unsigned)(z >> k);
}

static inline unsigned sym_nraw(unsigned s)
{
	return s < 4 ? 0 : (s >> 2) - 1;
}

static inline uint64_t sym_base(unsigned s)
{
	return s < 4 ? s : (uint64_t)(4 | (s & 3)) << ((s >> 2) - 1);
}

/* One rANS decode step of a lane: symbol out, state renormalized from the
 * 16-bit words at *wp without a branch. The caller guarantees a word is there. */
static ULP_FORCE_INLINE uint8_t rans_step(uint32_t *xp, const uint32_t *row,
                                          uint32_t mask, unsigned pb,
                                          const uint8_t **wp)
{
	uint32_t xs = *xp;
	uint32_t e = row[xs & mask];
	xs = ((e >> 12 & 0xfff) + 1) * (xs >> pb) + (e & 0xfff);
	/* m: all ones when the state needs a word: xs < 2^31, so bit 31 of
	 * xs - L (modulo 2^32) is set exactly when xs < L */
	uint32_t m = 0u - ((xs - ULP_RANS_L) >> 31);
	*xp = (xs << (m & 16)) | (ulp_ld16(*wp) & m);
	*wp += m & 2;
	return (uint8_t)(e >> 24);
}

/* n (0..64) bits of the raw tail starting at bit pos, LSB-first; bits past
 * the end read as zero. Reads never leave [raw, raw + len). */
static inline uint64_t raw_bits_at(const uint8_t *raw, size_t len, uint64_t pos, unsigned n)
{
	size_t byte = (size_t)(pos >> 3);
	unsigned sh = (unsigned)(pos & 7);
	if (__builtin_expect(n <= 56 && byte + 8 <= len, 1))
		return (ulp_ld64(raw + byte) >> sh) & ((1ull << n) - 1);
	uint64_t v = 0;
	for (unsigned got = 0; got < n;) { /* tail or wide: byte by byte */
		unsigned take = ULP_MIN(8 - sh, n - got);
		if (byte >= len)
			break; /* past the tail: zeros; the caller's bit count catches it */
		v |= (uint64_t)((raw[byte] >> sh) & ((1u << take) - 1)) << got;
		got += take;
		byte++;
		sh = 0;
	}
	return v;
}

/* Four 16-bit DELTA elements at once, one a 16-bit field of a 64-bit word
 * (element k in bits 16k..16k+15: a little-endian host): from references r4
 * and zigzag values z4, phi_inv(phi(r) + unzigzag(z)) per field, as
 * phi_inv16/phi16/unzz16 below do one at a time. Sums are taken without
 * the top bit of each field, which is then set by XOR, so no carry crosses
 * a field. */
static inline uint64_t swar16(uint64_t r4, uint64_t z4)
{
	const uint64_t h = 0x8000800080008000ull, l1 = 0x0001000100010001ull;
	uint64_t phir = r4 ^ (((r4 >> 15) & l1) * 0xffff | h);
	uint64_t dz = ((z4 >> 1) & ~h) ^ ((z4 & l1) * 0xffff);
	uint64_t key = ((phir & ~h) + (dz & ~h)) ^ ((phir ^ dz) & h);
	return key ^ ((((key >> 15) & l1) ^ l1) * 0xffff | h);
}

/* Scalar DELTA decode of 16-bit elements with references, both passes fused:
 * in rounds of L lanes (elements i..i + L - 1 are lanes 0..L - 1; i starts at
 * a multiple of L), each round's symbols are decoded as pass A does and its
 * elements rebuilt at once as pass B does (four at a time with swar16), so
 * symbols and references stay in registers and the rANS steps and the raw
 * reads of a round overlap. L, pb, sh and em are constants where inlined.
 * Stops before a round that holds an unused context or that could read
 * within 8 bytes of the raw tail's end (the caller's two-pass loops do the
 * rest); returns where it stopped, the word pointer and bit position
 * advanced to there. */
static ULP_FORCE_INLINE size_t fused16(
        const ulp_dtab *d, unsigned L, unsigned pb, unsigned sh, unsigned em,
        uint32_t *x, const uint16_t *rb, uint16_t *ob, size_t i, size_t bn,
        const uint8_t **wpp, const uint8_t *raw, size_t raw_len, uint64_t *posp)
{
	uint32_t xs[ULP_LANES_MAX];
	const uint8_t *w = *wpp;
	uint64_t q = *posp;
	const uint32_t *slots = d->slots;
	const int32_t *row_off = d->row_off;
	/* a round reads raw bytes below q / 8 + (13 L + 7) / 8 + 8 */
	const uint64_t qmax = raw_len >= (13 * L + 7) / 8 + 8 ? (raw_len - (13 * L + 7) / 8 - 8) * 8 : 0;
	for (unsigned l = 0; l < L; l++)
		xs[l] = x[l];
	for (; i + L <= bn && q < qmax; i += L) {
		int32_t o[ULP_LANES_MAX], bad = 0;
		_Pragma("GCC unroll 32")
		for (unsigned l = 0; l < L; l++)
			bad |= o[l] = row_off[(rb[i + l] >> sh) & em];
		if (bad < 0)
			break;
		_Pragma("GCC unroll 8")
		for (unsigned g = 0; g < L; g += 4) {
			/* one load for four elements: at most 7 + 4 * 13 bits */
			uint64_t z4 = 0, r4, w64 = ulp_ld64(raw + (q >> 3)) >> (q & 7);
			_Pragma("GCC unroll 4")
			for (unsigned k = 0; k < 4; k++) {
				unsigned s = rans_step(&xs[g + k], slots + o[g + k], (1u << pb) - 1, pb, &w);
				unsigned nr = d->nraw[s];
				z4 |= (d->base[s] | (w64 & d->rmask[s])) << (16 * k);
				w64 >>= nr;
				q += nr;
			}
			memcpy(&r4, rb + i + g, 8);
			r4 = swar16(r4, z4);
			memcpy(ob + i + g, &r4, 8);
		}
	}
	for (unsigned l = 0; l < L; l++)
		x[l] = xs[l];
	*wpp = w;
	*posp = q;
	return i;
}

/* ---- per-width transforms and passes: codec_width.h, once per width ---- */
#define WN(name) WN_PASTE(name, W)
#define WN_PASTE(name, w) WN_PASTE2(name, w)
#define WN_PASTE2(name, w) name##w
#define W 8
#define T uint8_t
#include "codec_width.h"
#undef W
#undef T
#define W 16
#define T uint16_t
#include "codec_width.h"
#undef W
#undef T
#define W 32
#define T uint32_t
#include "codec_width.h"
#undef W
#undef T
#define W 64
#define T uint64_t
#include "codec_width.h"
#undef W
#undef T

#define DISPATCH(f, call8, call16, call32, call64) \
	do {                                        \
		switch ((f)->w) {                   \
		case 8: call8; break;               \
		case 16: call16; break;             \
		case 32: call32; break;             \
		default: call64; break;             \
		}                                   \
	} while (0);

void ulp_pass1(const ulp_fmt *f, int anchor, const void *src, const void *ref, size_t n,
               uint8_t *syms, uint64_t *counts, uint8_t *raw, size_t raw_cap, uint64_t *raw_bits)
{
	ulp_bitw bw;
	const ulp_kernels *K = ulp_kernels_get();
	ulp_bitw_init(&bw, raw, raw + raw_cap);
	if (anchor)
		DISPATCH(f, anchor_pass18(K, f, src, n, syms, counts, &bw),
		         anchor_pass116(K, f, src, n, syms, counts, &bw),
		         anchor_pass132(K, f, src, n, syms, counts, &bw),
		         anchor_pass164(K, f, src, n, syms, counts, &bw))
	else
		DISPATCH(f, delta_pass18(K, f, src, ref, n, syms, counts, &bw),
		         delta_pass116(K, f, src, ref, n, syms, counts, &bw),
		         delta_pass132(K, f, src, ref, n, syms, counts, &bw),
		         delta_pass164(K, f, src, ref, n, syms, counts, &bw))
	*raw_bits = (uint64_t)(bw.p - raw) * 8 + bw.fill;
	ulp_bitw_finish(&bw, raw);
}

uint64_t ulp_delta_raw_bits(const ulp_fmt *f, const uint64_t *counts)
{
	uint64_t bits = 0;
	for (unsigned c = 0; c < f->n_ctx; c++)
		for (unsigned s = 0; s < f->alphabet; s++)
			bits += counts[(size_t)c * f->alphabet + s] * sym_nraw(s);
	return bits;
}

size_t ulp_chunk_rans_bound(size_t n, unsigned lanes)
{
	return 4 * (size_t)lanes + 2 * n; /* at most one word per element */
}

size_t ulp_chunk_raw_bound(const ulp_fmt *f, size_t n)
{
	return (n * (f->w - 3) + 7) / 8 + 8;
}

uint64_t *ulp_esyms_pack(const ulp_table *t, const ulp_rans_esym *es)
{
	const ulp_kernels *K = ulp_kernels_get();
	if (!(K->enc32 || K->enc) || t->n_ctx > 256 || t->n_rows > 255)
		return NULL;
	size_t m = (size_t)t->n_rows * t->alphabet;
	uint64_t *p = malloc(m * sizeof(*p));
	for (size_t i = 0; p && i < m; i++)
		p[i] = (uint64_t)es[i].rcp |
		       (uint64_t)(es[i].freq | es[i].bias << 13 | es[i].rshift << 26) << 32;
	return p;
}

int ulp_chunk_encode(const ulp_fmt *f, const ulp_table *t, const ulp_rans_esym *es,
                     const uint64_t *es64, unsigned lanes, const uint8_t *syms, const void *ref,
                     size_t n, uint8_t *rans_dst, size_t rans_cap, size_t *rans_len)
{
	if (rans_cap < ulp_chunk_rans_bound(n, lanes) || ((uintptr_t)rans_dst & 1))
		return -ULP_E_OVERFLOW;
	/* words grow down from the end of rans_dst */
	uint16_t *end = (uint16_t *)(rans_dst + (rans_cap & ~(size_t)1));
	uint16_t *p = end;
	uint32_t x[ULP_LANES_MAX];
	const ulp_kernels *K = ulp_kernels_get();
	for (unsigned l = 0; l < lanes; l++)
		x[l] = ULP_RANS_L;
	/* AVX-512: the scalar loop codes the last n mod 32 elements (they come
	 * first), the kernel the rest (same states, same words) */
	size_t n0 = 0;
	if (es64 && lanes == 32 && (f->w == 16 || f->w == 32) && n >= 32 && K->enc32) {
		uint8_t rowb[256];
		memset(rowb, 0xff, sizeof(rowb));
		for (unsigned c = 0; c < t->n_ctx && c < 256; c++)
			if (t->ctx_row[c] != ULP_CTX_UNUSED)
				rowb[c] = (uint8_t)t->ctx_row[c];
		n0 = n & ~(size_t)31;
		const uint8_t *ts = syms + n0;
		const uint8_t *tr = ref ? (const uint8_t *)ref + n0 * (f->w / 8) : NULL;
		DISPATCH(f, (void)0,
		         put_rans16(f, t, es, lanes, ts, (const uint16_t *)(const void *)tr, n - n0, x, &p),
		         put_rans32(f, t, es, lanes, ts, (const uint32_t *)(const void *)tr, n - n0, x, &p),
		         (void)0);
		K->enc32(f, t->prob_bits, rowb, t->ctx_row[0], t->alphabet, es64, syms, ref, n0, x, &p);
	} else if (es64 && K->enc && lanes >= K->enc_lanes && (f->w == 16 || f->w == 32) && n >= lanes) {
		/* AVX2, NEON: as above, the scalar loop codes the last n mod
		 * lanes elements (from a multiple of lanes: its lane of element
		 * i is i mod lanes counted from there) */
		n0 = n & ~(size_t)(lanes - 1);
		const uint8_t *ts = syms + n0;
		const uint8_t *tr = ref ? (const uint8_t *)ref + n0 * (f->w / 8) : NULL;
		DISPATCH(f, (void)0,
		         put_rans16(f, t, es, lanes, ts, (const uint16_t *)(const void *)tr, n - n0, x, &p),
		         put_rans32(f, t, es, lanes, ts, (const uint32_t *)(const void *)tr, n - n0, x, &p),
		         (void)0);
		K->enc(f, t->prob_bits, t->ctx_row, t->n_ctx, t->alphabet, es64, syms, ref, lanes, n0, x, &p);
	} else {
		DISPATCH(f, put_rans8(f, t, es, lanes, syms, ref, n, x, &p),
		         put_rans16(f, t, es, lanes, syms, ref, n, x, &p),
		         put_rans32(f, t, es, lanes, syms, ref, n, x, &p),
		         put_rans64(f, t, es, lanes, syms, ref, n, x, &p));
	}
	size_t words = (size_t)(end - p) * 2;
	memmove(rans_dst + 4 * lanes, p, words);
	for (unsigned l = 0; l < lanes; l++)
		ulp_st32(rans_dst + 4 * l, x[l]);
	*rans_len = 4 * lanes + words;
	return 0;
}

int ulp_chunk_decode(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, const uint8_t *rans,
                     size_t rans_len, const uint8_t *raw, size_t raw_len, uint64_t raw_bits,
                     const void *ref, size_t n, void *dst, ulp_err *err)
{
	uint32_t x[ULP_LANES_MAX];
	if (rans_len < 4 * (size_t)lanes || ((rans_len - 4 * lanes) & 1))
		return ULP_CORRUPT(err, "rANS part of %zu bytes cannot hold %u lane states", rans_len,
		                   lanes);
	if ((raw_bits + 7) / 8 != raw_len)
		return ULP_CORRUPT(err, "raw tail of %zu bytes does not hold exactly %llu bits",
		                   raw_len, (unsigned long long)raw_bits);
	for (unsigned l = 0; l < lanes; l++) {
		x[l] = ulp_ld32(rans + 4 * l);
		if (x[l] < ULP_RANS_L || x[l] >= (ULP_RANS_L << 16))
			return ULP_CORRUPT(err, "rANS lane %u starts in invalid state %#x", l, x[l]);
	}
	const uint8_t *wp = rans + 4 * lanes, *wend = rans + rans_len;
	const ulp_kernels *K = ulp_kernels_get();
	int rc;
	DISPATCH(f, rc = decode8(K, f, d, lanes, x, &wp, wend, raw, raw_len, raw_bits, ref, n, dst, err),
	         rc = decode16(K, f, d, lanes, x, &wp, wend, raw, raw_len, raw_bits, ref, n, dst, err),
	         rc = decode32(K, f, d, lanes, x, &wp, wend, raw, raw_len, raw_bits, ref, n, dst, err),
	         rc = decode64(K, f, d, lanes, x, &wp, wend, raw, raw_len, raw_bits, ref, n, dst, err));
	if (rc < 0)
		return rc;
	for (unsigned l = 0; l < lanes; l++)
		if (x[l] != ULP_RANS_L)
			return ULP_CORRUPT(err, "rANS lane %u ends in state %#x, not %#x", l, x[l],
			                   ULP_RANS_L);
	if (wp != wend)
		return ULP_CORRUPT(err, "%zu rANS bytes left after the last element",
		                   (size_t)(wend - wp));
	return 0;
}

static const ulp_kernels kernels_scalar = {.name = "scalar", .scalar = 1};

const ulp_kernels *ulp_kernels_get(void)
{
	const unsigned m = ulp_cpu_paths();
	(void)m;
#ifdef ULP_HAVE_AVX512
	if ((m & ULP_CPU_AVX512) && (m & ULP_CPU_AVX2))
		return &ulp_kernels_avx512;
#endif
#ifdef ULP_HAVE_AVX2
	if (m & ULP_CPU_AVX2)
		return &ulp_kernels_avx2;
#endif
#ifdef ULP_HAVE_NEON
	if (m & ULP_CPU_NEON)
		return &ulp_kernels_neon;
#endif
	return &kernels_scalar;
}

/* every table's nraw and base (built once) */
static uint8_t sym_nraw_tab[256];
static uint64_t sym_base_tab[256];
static uint64_t sym_rmask_tab[256];
static pthread_once_t sym_once = PTHREAD_ONCE_INIT;

static void sym_init(void)
{
	for (unsigned s = 0; s < 256; s++) {
		sym_nraw_tab[s] = (uint8_t)sym_nraw(s);
		sym_base_tab[s] = sym_base(s);
		sym_rmask_tab[s] = (1ull << sym_nraw(s)) - 1;
	}
}

/* Everything but the slots: row_off, rowb and the symbol arrays; slots and
 * row stay NULL unless with_slots. */
static int dtab_build(const ulp_table *t, ulp_dtab *out, int with_slots)
{
	/* built in place (the struct holds 5 KiB of arrays), without branches
	 * on used contexts (they mispredict) */
	ulp_dtab *d = out;
	const unsigned pb = t->prob_bits;
	d->prob_bits = pb;
	d->n_ctx = t->n_ctx;
	d->n_rows = t->n_rows;
	d->slots = NULL;
	d->row = NULL;
	d->row_off = NULL;
	if (with_slots) {
		ULP_TRY(ulp_table_dslots(t, &d->slots));
		if (!(d->row = malloc(t->n_ctx * sizeof(*d->row)))) {
			ulp_dtab_free(d);
			return -ULP_E_NOMEM;
		}
	}
	d->row_off = malloc(t->n_ctx * sizeof(*d->row_off));
	if (!d->row_off) {
		ulp_dtab_free(d);
		return -ULP_E_NOMEM;
	}
	d->rowb_ok = t->n_ctx <= 256 && t->n_rows < 255;
	d->rowb_hi = 0;
	memset(d->rowb, 0xff, sizeof(d->rowb));
	for (unsigned c = 0; c < t->n_ctx; c++) {
		const unsigned r = t->ctx_row[c];
		const int used = r != ULP_CTX_UNUSED;
		if (with_slots)
			d->row[c] = used ? d->slots + ((size_t)r << pb) : NULL;
		d->row_off[c] = used ? (int32_t)((uint32_t)r << pb) : -1;
		if (d->rowb_ok) {
			d->rowb[c] = (uint8_t)(used ? r : 0xff);
			d->rowb_hi |= (unsigned)used << (c >> 4);
		}
	}
	pthread_once(&sym_once, sym_init);
	memcpy(d->nraw, sym_nraw_tab, sizeof(d->nraw));
	memcpy(d->base, sym_base_tab, sizeof(d->base));
	memcpy(d->rmask, sym_rmask_tab, sizeof(d->rmask));
	return 0;
}

int ulp_dtab_build(const ulp_table *t, ulp_dtab *out)
{
	return dtab_build(t, out, 1);
}

int ulp_dtab_build_unbound(const ulp_table *t, ulp_dtab *out)
{
	return dtab_build(t, out, 0);
}

#define DTAB_HEAD ((sizeof(ulp_dtab) + 63) & ~(size_t)63)

size_t ulp_dtab_bind_size(const ulp_table *t)
{
	return DTAB_HEAD + ((ulp_table_dslots_size(t) + 7) & ~(size_t)7) +
	       (size_t)t->n_ctx * sizeof(uint32_t *);
}

ulp_dtab *ulp_dtab_bind(const ulp_dtab *u, const ulp_table *t, void *mem)
{
	ulp_dtab *d = mem;
	memcpy(d, u, sizeof(*d));
	d->slots = (uint32_t *)((uint8_t *)mem + DTAB_HEAD);
	const uint32_t **row =
	        (const uint32_t **)((uint8_t *)d->slots + ((ulp_table_dslots_size(t) + 7) & ~(size_t)7));
	ulp_table_dslots_into(t, d->slots);
	for (unsigned c = 0; c < d->n_ctx; c++)
		row[c] = d->row_off[c] >= 0 ? d->slots + d->row_off[c] : NULL;
	d->row = row;
	return d;
}

void ulp_dtab_free(ulp_dtab *d)
{
	if (!d)
		return;
	free(d->slots);
	free(d->row);
	free(d->row_off);
	d->slots = NULL;
	d->row = NULL;
	d->row_off = NULL;
}
