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
	unsigned n_rows;      /* rows in slots (each 2^prob_bits entries) */
	const uint32_t **row; /* n_ctx entries, pointing into slots */
	uint32_t *slots;      /* owned */
	int32_t *row_off;     /* n_ctx entries: row * 2^prob_bits, or -1 (owned) */
	uint8_t rowb[256];    /* row of each context as a byte, 0xff unused; valid
	                         when rowb_ok (n_ctx <= 256 and n_rows < 255) */
	int rowb_ok;
	unsigned rowb_hi;     /* bit h set: some context 16h..16h+15 has a row
	                         (when rowb_ok): the SIMD row lookups skip the
	                         other 16-entry pieces of rowb */
	uint8_t nraw[256];    /* DELTA: raw-tail bits of each symbol */
	uint64_t base[256];   /* DELTA: z with its raw tail zeroed */
	uint64_t rmask[256];  /* DELTA: 2^nraw - 1 */
} ulp_dtab;

int ulp_dtab_build(const ulp_table *t, ulp_dtab *out);
void ulp_dtab_free(ulp_dtab *d);
/*
 * A table kept without slots (slots and row NULL, the rest as
 * ulp_dtab_build), bound at decode time to a buffer of ulp_dtab_bind_size(t)
 * bytes the caller owns (a per-thread scratch): ulp_dtab_bind copies u into
 * mem and builds the slots and row there; the result is valid while mem is.
 * ulp_dtab_free frees u as any other.
 */
int ulp_dtab_build_unbound(const ulp_table *t, ulp_dtab *out);
size_t ulp_dtab_bind_size(const ulp_table *t);
ulp_dtab *ulp_dtab_bind(const ulp_dtab *u, const ulp_table *t, void *mem);

/*
 * Pass 1 of a chunk (DELTA, or ANCHOR when anchor != 0 and ref is NULL):
 * symbols of n elements into syms, counts[ctx * alphabet + sym]++ (ANCHOR:
 * context 0, alphabet 2^a_bits), and the raw tail into raw (at least
 * ulp_chunk_raw_bound bytes), *raw_bits its exact length.
 */
void ulp_pass1(const ulp_fmt *f, int anchor, const void *src, const void *ref, size_t n,
               uint8_t *syms, uint64_t *counts, uint8_t *raw, size_t raw_cap, uint64_t *raw_bits);
/* Raw-tail bits of the elements counted in counts (DELTA). */
uint64_t ulp_delta_raw_bits(const ulp_fmt *f, const uint64_t *counts);

/* Bytes a chunk's rANS part and raw part may need at most. */
size_t ulp_chunk_rans_bound(size_t n, unsigned lanes);
size_t ulp_chunk_raw_bound(const ulp_fmt *f, size_t n);

/* Pass 2: the chunk's rANS part ([lanes x u32 states][u16 words]) into
 * rans_dst, from the symbols of pass 1. ref is NULL for ANCHOR. es64 (from
 * ulp_esyms_pack, or NULL) lets the AVX-512 encoder run. */
int ulp_chunk_encode(const ulp_fmt *f, const ulp_table *t, const ulp_rans_esym *es,
                     const uint64_t *es64, unsigned lanes, const uint8_t *syms, const void *ref,
                     size_t n, uint8_t *rans_dst, size_t rans_cap, size_t *rans_len);

/* The table's encoder entries packed for the SIMD encoder, one u64 each:
 * rcp | (freq | bias << 13 | rshift << 26) << 32 (malloc'd; NULL when no
 * SIMD encoder (AVX2, AVX-512 or NEON) would use it or on no memory: the scalar encoder runs). */
uint64_t *ulp_esyms_pack(const ulp_table *t, const ulp_rans_esym *es);

/*
 * A 16-bit DELTA reconstruction job (pass B of the previous block) that the
 * 8-lane AVX2 symbol pass runs eight elements at a time beside its serial
 * chain, as ulp_rebuild16_avx2 would, while the raw window fits: done and
 * pos advance; the caller finishes the rest (ulp_rebuild16_avx2, then the
 * scalar loop). Other lane counts leave it untouched.
 */
typedef struct ulp_rb16_job {
	const uint8_t *syms;  /* the block's symbols (not the buffer being decoded) */
	const uint16_t *ref;
	uint16_t *out;
	size_t n, done;       /* elements of the block, elements done */
	const uint8_t *raw;
	size_t raw_len;
	uint64_t pos;         /* raw-tail bit position of element done */
} ulp_rb16_job;

/*
 * AVX2 symbol pass (rans_avx2.c): decodes n symbols (n a multiple of 32; 8,
 * 16 or 32 lanes) of a 16- or 32-bit dtype (ref NULL: ANCHOR) into syms; the
 * word stream must hold 2n bytes from *wpp. Returns n, or SIZE_MAX (x and
 * *wpp untouched) at an unused context.
 */
size_t ulp_rans_syms_avx2(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                          const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms,
                          ulp_rb16_job *bg);
/* AVX2 reconstruction of 16-bit DELTA elements from their symbols and the raw
 * tail at bit *pos; returns how many it did (the caller does the rest). */
size_t ulp_rebuild16_avx2(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint16_t *out);
/* AVX2 reconstruction of 32-bit DELTA elements, as ulp_rebuild16_avx2. */
size_t ulp_rebuild32_avx2(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint32_t *out);
/* AVX2 reconstruction of ANCHOR elements of w = 16 or 32 bits (a_shift ash,
 * a_bits ab) from their symbols and the raw tail at bit *pos; returns how
 * many it did (a multiple of 8; the caller does the rest). */
size_t ulp_anchor_rebuild_avx2(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms,
                               size_t n, const uint8_t *raw, size_t raw_len, uint64_t *pos,
                               void *out);
/* AVX2 pass 1 of 16-bit ANCHOR with one raw byte an element: the
 * anchor_pass1_8 entry of ulp_kernels (a multiple of 32 elements). */
size_t ulp_anchor_pass1_8_avx2(const uint16_t *x, size_t n, unsigned ash, uint8_t *syms,
                               uint8_t *raw);
/* AVX2 pass 1 of 16-bit DELTA, the contract of ulp_pass1_16_avx512 below. */
void ulp_pass1_16_avx2(const uint16_t *x, const uint16_t *r, size_t n, unsigned mshift,
                       unsigned emask, unsigned alphabet, uint8_t *syms, uint16_t *cidx,
                       uint64_t *vals, uint8_t *lens);
/* AVX2 encoder of elements [0, n) (n a multiple of 8) with 8, 16 or 32 lanes,
 * from states x and front *pp (rans_avx2.c); es64 from ulp_esyms_pack. */
void ulp_rans_enc_avx2(const ulp_fmt *f, unsigned pb, const uint16_t *ctx_row, unsigned n_ctx,
                       unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                       const void *ref, unsigned lanes, size_t n, uint32_t *x, uint16_t **pp);

/*
 * AVX-512 kernels (rans_avx512.c), same contracts as their AVX2 twins: the
 * symbol pass for 16 or 32 lanes (n a multiple of 64, needs d->rowb_ok when
 * ref is given) and the 16-bit reconstruction.
 */
size_t ulp_rans_syms_avx512(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                            const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms);
size_t ulp_rebuild16_avx512(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                            size_t raw_len, uint64_t *pos, uint16_t *out);
size_t ulp_rebuild32_avx512(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                            size_t raw_len, uint64_t *pos, uint32_t *out);
/* AVX-512 pass 1 of 16-bit DELTA (n a multiple of 16): symbols, count
 * indices, raw tails merged four elements at a time (rans_avx512.c). */
void ulp_pass1_16_avx512(const uint16_t *x, const uint16_t *r, size_t n, unsigned mshift,
                         unsigned emask, unsigned alphabet, uint8_t *syms, uint16_t *cidx,
                         uint64_t *vals, uint8_t *lens);
/* AVX-512 encoder of elements [0, n) (n a multiple of 32) with 32 lanes. */
void ulp_rans_enc_avx512(const ulp_fmt *f, unsigned pb, const uint8_t *rowb, unsigned row0,
                         unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                         const void *ref, size_t n, uint32_t *x, uint16_t **pp);

/*
 * NEON kernels (rans_neon.c, aarch64), same contracts as their AVX2 twins:
 * the symbol pass for 4 to 32 lanes (n a multiple of 32), the 16- and
 * 32-bit DELTA reconstruction, the 16- and 32-bit ANCHOR reconstruction, and
 * the encoder.
 */
size_t ulp_rans_syms_neon(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
                          const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms);
size_t ulp_rebuild16_neon(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint16_t *out);
size_t ulp_rebuild32_neon(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
                          size_t raw_len, uint64_t *pos, uint32_t *out);
/* NEON encoder, the contract of ulp_rans_enc_avx2 with 4 to 32 lanes. */
void ulp_rans_enc_neon(const ulp_fmt *f, unsigned pb, const uint16_t *ctx_row, unsigned n_ctx,
                       unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
                       const void *ref, unsigned lanes, size_t n, uint32_t *x, uint16_t **pp);
size_t ulp_anchor_rebuild_neon(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms,
                               size_t n, const uint8_t *raw, size_t raw_len, uint64_t *pos,
                               void *out);

/*
 * The codec's kernels as one table, a row a CPU path: the scalar row (every
 * entry NULL: the scalar reference of codec_width.h does all), and the AVX2,
 * AVX-512 and NEON rows, each defined in its kernel file (rans_avx2.c,
 * rans_avx512.c, rans_neon.c) and compiled only where it is built.
 * ulp_kernels_get picks the row from the CPU's features (probed once) and
 * ulp_set_cpu_mask; codec.c asks once a call (a chunk, a pass 1) and hands
 * the row down, so no CPU check sits in the scalar code. A NULL entry: the
 * scalar loop does that part; every kernel gives the scalar reference's
 * bytes and symbols.
 */
typedef struct ulp_kernels {
	const char *name;
	int scalar;        /* the scalar row: codec.c's fused 16-bit loop runs */
	/* decoder pass A, 16/32-bit: syms_wide for lanes >= 16 and n a
	 * multiple of 64 (d->rowb_ok when ref is given), else syms for lanes >=
	 * syms_lanes and n a multiple of 32 */
	size_t (*syms_wide)(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
	                    const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms);
	size_t (*syms)(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, uint32_t *x,
	               const uint8_t **wpp, const void *ref, size_t n, uint8_t *syms,
	               ulp_rb16_job *bg);
	unsigned syms_lanes;
	int rb16_beside;   /* syms runs an ulp_rb16_job beside its 8-lane chain */
	/* decoder pass B of DELTA: the two run in order, each from where the
	 * previous stopped (AVX-512 then AVX2 for the rest) */
	size_t (*rebuild16[2])(const uint8_t *syms, const uint16_t *ref, size_t n, const uint8_t *raw,
	                       size_t raw_len, uint64_t *pos, uint16_t *out);
	size_t (*rebuild32[2])(const uint8_t *syms, const uint32_t *ref, size_t n, const uint8_t *raw,
	                       size_t raw_len, uint64_t *pos, uint32_t *out);
	/* decoder pass B of ANCHOR, 16/32-bit */
	size_t (*anchor_rebuild)(unsigned w, unsigned ash, unsigned ab, const uint8_t *syms, size_t n,
	                         const uint8_t *raw, size_t raw_len, uint64_t *pos, void *out);
	/* encoder pass 1 of 16-bit DELTA (n a multiple of 16) */
	void (*pass1_16)(const uint16_t *x, const uint16_t *r, size_t n, unsigned mshift,
	                 unsigned emask, unsigned alphabet, uint8_t *syms, uint16_t *cidx,
	                 uint64_t *vals, uint8_t *lens);
	/* encoder pass 1 of 16-bit ANCHOR whose raw part is one byte (a_bits
	 * 8: BF16), symbols and raw bytes of x[0, n); returns how many it did */
	size_t (*anchor_pass1_8)(const uint16_t *x, size_t n, unsigned ash, uint8_t *syms,
	                         uint8_t *raw);
	/* encoder rANS pass: enc32 for exactly 32 lanes (n a multiple of 32),
	 * else enc for lanes >= enc_lanes (n a multiple of lanes) */
	void (*enc32)(const ulp_fmt *f, unsigned pb, const uint8_t *rowb, unsigned row0,
	              unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
	              const void *ref, size_t n, uint32_t *x, uint16_t **pp);
	void (*enc)(const ulp_fmt *f, unsigned pb, const uint16_t *ctx_row, unsigned n_ctx,
	            unsigned alphabet, const uint64_t *es64, const uint8_t *syms,
	            const void *ref, unsigned lanes, size_t n, uint32_t *x, uint16_t **pp);
	unsigned enc_lanes;
} ulp_kernels;

extern const ulp_kernels ulp_kernels_avx2, ulp_kernels_avx512, ulp_kernels_neon;

/* The row of the best path this CPU has and ulp_set_cpu_mask allows
 * (AVX-512 needs AVX2 allowed too: its tails are AVX2 code). */
const ulp_kernels *ulp_kernels_get(void);

/* Decodes one chunk into dst (n elements); every stream is bounds-checked. */
int ulp_chunk_decode(const ulp_fmt *f, const ulp_dtab *d, unsigned lanes, const uint8_t *rans,
                     size_t rans_len, const uint8_t *raw, size_t raw_len, uint64_t raw_bits,
                     const void *ref, size_t n, void *dst, ulp_err *err);

#endif
