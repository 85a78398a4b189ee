/* SPDX-License-Identifier: MIT */
/*
 * tables.h - per-tensor probability tables of the ULPack codecs: choice,
 * normalization, compact serialization (ulpack-format(5) section 4) and the
 * encoder/decoder views.
 *
 * Invariants of a valid ulp_table:
 *  1. 6 <= prob_bits <= 12; 1 <= n_rows <= n_ctx; alphabet <= 256.
 *  2. Every row's frequencies sum to exactly 2^prob_bits, and freq[s] == 0
 *     for s >= alphabet.
 *  3. ctx_row[c] is a row index or ULP_CTX_UNUSED; an element whose context
 *     is unused is corrupt input.
 */
#ifndef ULP_TABLES_H
#define ULP_TABLES_H

#include "rans.h"

#define ULP_CTX_UNUSED 0xffffu
#define ULP_CTX_MAX 2048 /* 11 exponent bits (F64) */

typedef struct ulp_table {
	unsigned prob_bits;  /* n: frequencies sum to 2^n */
	unsigned alphabet;   /* symbols 0..alphabet-1 */
	unsigned n_ctx;      /* contexts 0..n_ctx-1 */
	unsigned n_rows;
	uint16_t *freq;      /* n_rows x 256 */
	uint16_t *ctx_row;   /* n_ctx entries */
} ulp_table;

void ulp_table_free(ulp_table *t);

/*
 * Chooses precision and row grouping for the counts (n_ctx x alphabet, row
 * major) that minimize table bits + coded bits, and builds the table.
 * *cost_bits receives the estimate (table + coded symbols, raw tail excluded).
 */
int ulp_table_choose(const uint64_t *counts, unsigned n_ctx, unsigned alphabet,
                     ulp_table *out, uint64_t *cost_bits);

/* Serialized size in bytes, and serialization (returns bytes or -OVERFLOW). */
size_t ulp_table_size(const ulp_table *t);
/* Bytes ulp_table_write() may need at most. */
size_t ulp_table_bound(const ulp_table *t);
int64_t ulp_table_write(const ulp_table *t, uint8_t *dst, size_t cap);
/* Parses a table of exactly len bytes for the given alphabet and contexts. */
int ulp_table_read(const uint8_t *src, size_t len, unsigned prob_bits, unsigned alphabet,
                   unsigned n_ctx, ulp_table *out, ulp_err *err);

/* Encoder view: esym[row * alphabet + s]. Caller frees. */
int ulp_table_esyms(const ulp_table *t, ulp_rans_esym **out);
/*
 * Decoder view: for each row 2^n u32 slots, entry = sym << 24 | (f-1) << 12 |
 * (slot - cum). Caller frees.
 */
int ulp_table_dslots(const ulp_table *t, uint32_t **out);
/* Bytes of t's slot array (with its padding), and filling one the caller owns. */
size_t ulp_table_dslots_size(const ulp_table *t);
void ulp_table_dslots_into(const ulp_table *t, uint32_t *d);

/* Shannon bits of the counts (sum c * log2(total/c)) per context, summed. */
double ulp_counts_entropy_bits(const uint64_t *counts, unsigned n_ctx, unsigned alphabet);

#endif
