/* SPDX-License-Identifier: MIT */
/*
 * tables.c - probability tables: normalization, choice of precision and row
 * grouping by exact cost, and the bit-packed serialization of
 * ulpack-format(5) section 4.
 *
 * All choices use integer arithmetic (costs in 1/65536 bit), so the same
 * counts give the same table, and the same blob bytes, on every machine.
 */
#include "tables.h"
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ---- fixed-point log2 (Q16), exact and integer-only ------------------- */

static uint64_t log2_q16(uint64_t x) /* x >= 1 */
{
	unsigned ip = 63 - (unsigned)__builtin_clzll(x);
	/* y = x / 2^ip in Q30, in [1, 2) */
	uint64_t y = ip >= 30 ? x >> (ip - 30) : x << (30 - ip);
	uint64_t r = (uint64_t)ip << 16;
	for (unsigned b = 15; b < 16; b--) {
		y = (y * y) >> 30;
		if (y >= (2ull << 30)) {
			y >>= 1;
			r |= 1ull << b;
		}
	}
	return r;
}

/* log2 in Q16 of 1..2^12, built once (threads encode concurrently) */
static uint64_t log2_table[(1u << ULP_PROB_BITS_MAX) + 1];
static pthread_once_t log2_once = PTHREAD_ONCE_INIT;

/* floor(log2(v)) of 1..2^13 (row_best_k: a load is faster than BSR on AMD) */
static uint8_t lg_table[(2u << ULP_PROB_BITS_MAX) + 1];

static void log2_init(void)
{
	for (unsigned i = 1; i <= (1u << ULP_PROB_BITS_MAX); i++)
		log2_table[i] = log2_q16(i);
	for (unsigned i = 1; i <= (2u << ULP_PROB_BITS_MAX); i++)
		lg_table[i] = (uint8_t)(31 - __builtin_clz(i));
}

/* cost in Q16 bits of coding c symbols of frequency f at precision n */
static uint64_t sym_cost_q16(uint64_t c, unsigned f, unsigned n)
{
	return c * (((uint64_t)n << 16) - log2_table[f]);
}

/* ---- bit writer that can also just count --------------------------------- */

typedef struct tbw {
	uint8_t *p;     /* NULL: count only */
	size_t cap;
	uint64_t bits;
} tbw;

static void tbw_put(tbw *w, uint32_t v, unsigned n)
{
	if (!w->p) {
		w->bits += n;
		return;
	}
	while (n) { /* a byte at a time */
		size_t byte = (size_t)(w->bits >> 3);
		unsigned off = (unsigned)(w->bits & 7), take = ULP_MIN(8 - off, n);
		if (byte < w->cap) { /* the caller checks the size */
			if (off == 0)
				w->p[byte] = 0;
			w->p[byte] |= (uint8_t)((v & ((1u << take) - 1)) << off);
		}
		v >>= take;
		n -= take;
		w->bits += take;
	}
}

/* Exp-Golomb of order k: m zeros, a one, the low m bits of q = (v >> k) + 1,
 * then the low k bits of v. */
static void tbw_eg(tbw *w, uint32_t v, unsigned k)
{
	uint32_t q = (v >> k) + 1;
	unsigned m = 31 - (unsigned)__builtin_clz(q);
	tbw_put(w, 0, m);
	tbw_put(w, 1, 1);
	tbw_put(w, q & ((1u << m) - 1), m);
	tbw_put(w, v & ((1u << k) - 1), k);
}

static unsigned eg_len(uint32_t v, unsigned k)
{
	uint32_t q = (v >> k) + 1;
	unsigned m = 31 - (unsigned)__builtin_clz(q);
	return 2 * m + 1 + k;
}

typedef struct tbr {
	const uint8_t *p;
	uint64_t bits, len_bits;
	int over;
} tbr;

/* n <= 32 bits, LSB-first; reading past the end sets over and gives 0 */
static uint32_t tbr_get(tbr *r, unsigned n)
{
	if (n == 0)
		return 0;
	if (r->bits + n > r->len_bits) {
		r->over = 1;
		r->bits = r->len_bits;
		return 0;
	}
	size_t byte = (size_t)(r->bits >> 3), len = (size_t)(r->len_bits >> 3);
	unsigned sh = (unsigned)(r->bits & 7);
	uint64_t w;
	if (byte + 8 <= len) {
		w = ulp_ld64(r->p + byte) >> sh;
	} else { /* the last bytes: one at a time (sh + n <= 39 bits needed) */
		w = 0;
		for (size_t b = byte; b < len && b < byte + 8; b++)
			w |= (uint64_t)r->p[b] << (8 * (b - byte));
		w >>= sh;
	}
	r->bits += n;
	return (uint32_t)(w & ((1ull << n) - 1));
}

/* Exp-Golomb of order k (tbw_eg): at most 16 leading zeros */
static uint32_t tbr_eg(tbr *r, unsigned k)
{
	if (r->over)
		return 0;
	size_t byte = (size_t)(r->bits >> 3);
	if (byte + 8 <= (size_t)(r->len_bits >> 3) && k <= ULP_PROB_BITS_MAX) {
		/* one 64-bit window holds the whole code: at most 7 bits of
		 * offset, 16 zeros, the one, 16 bits of q and k <= 12 bits */
		uint64_t w = ulp_ld64(r->p + byte) >> (r->bits & 7);
		uint32_t lead = (uint32_t)w & 0x1ffff;
		if (!lead) { /* 17 zeros */
			r->over = 1;
			r->bits = r->len_bits;
			return 0;
		}
		unsigned m = (unsigned)__builtin_ctz(lead);
		w >>= m + 1;
		uint32_t q = (1u << m) | ((uint32_t)w & ((1u << m) - 1));
		w >>= m;
		r->bits += 2 * m + 1 + k;
		return ((q - 1) << k) | ((uint32_t)w & ((1u << k) - 1));
	}
	uint64_t avail = r->len_bits - r->bits;
	unsigned t = avail < 17 ? (unsigned)avail : 17;
	uint32_t peek = t ? tbr_get(r, t) : 0;
	r->bits -= t; /* a peek: nothing consumed yet */
	if (!peek) { /* 17 zeros, or the end before a one */
		r->over = 1;
		r->bits = r->len_bits;
		return 0;
	}
	unsigned m = (unsigned)__builtin_ctz(peek);
	r->bits += m + 1;
	uint32_t q = (1u << m) | tbr_get(r, m);
	return ((q - 1) << k) | tbr_get(r, k);
}

static unsigned bits_for(unsigned n) /* bits to write a value in [0, n) */
{
	unsigned b = 0;
	while ((1u << b) < n)
		b++;
	return b;
}

/* ---- normalization ------------------------------------------------------ */

/* floor(num / den) for num < 2^62, den >= 1, from inv ~ 1 / den: a double
 * estimate (off by at most one here), corrected exactly; a 64-bit division
 * costs up to 40 cycles on the AMD CPUs, and normalize runs one a symbol
 * for every candidate row. */
static inline uint64_t div_exact(uint64_t num, uint64_t den, double inv)
{
	uint64_t q = (uint64_t)((double)num * inv);
	while (q * den > num)
		q--;
	while ((q + 1) * den <= num)
		q++;
	return q;
}

/*
 * Frequencies summing to 2^n with f >= 1 wherever c > 0, close to the
 * cost-optimal ones: proportional rounding, then greedy repair of the sum by
 * the steps that cost least. Writes f[0..a); f[a..256) must be zero already
 * (the rows of table_alloc are; ulp_table_choose clears its scratch row once).
 */
static void normalize(const uint64_t *c, unsigned a, unsigned n, uint16_t *f)
{
	uint64_t total = 0;
	const uint32_t m = 1u << n;
	for (unsigned s = 0; s < a; s++)
		total += c[s];
	for (unsigned s = 0; s < a; s++)
		f[s] = 0;
	if (total == 0) {
		f[0] = (uint16_t)m;
		return;
	}
	int64_t sum = 0;
	const double inv = 1.0 / (double)(total * 2);
	for (unsigned s = 0; s < a; s++) {
		if (!c[s])
			continue;
		uint64_t v;
		if (c[s] < ((uint64_t)1 << 40) && total < ((uint64_t)1 << 40)) /* no overflow: 64-bit */
			v = div_exact(c[s] * m * 2 + total, total * 2, inv);
		else
			v = (uint64_t)(((unsigned __int128)c[s] * m * 2 + total) / ((unsigned __int128)total * 2));
		if (v < 1)
			v = 1;
		if (v > m)
			v = m;
		f[s] = (uint16_t)v;
		sum += (int64_t)v;
	}
	/* Usually the whole correction fits on the most frequent symbol, where
	 * it costs least relative to its size. */
	unsigned top = 0;
	for (unsigned s = 1; s < a; s++)
		if (f[s] > f[top])
			top = s;
	if ((int64_t)f[top] - (sum - (int64_t)m) >= 1 && (int64_t)f[top] - (sum - (int64_t)m) <= (int64_t)m) {
		f[top] = (uint16_t)((int64_t)f[top] - (sum - (int64_t)m));
		return;
	}
	while (sum > (int64_t)m) { /* take from the symbol where it costs least */
		int best = -1;
		uint64_t best_cost = UINT64_MAX;
		for (unsigned s = 0; s < a; s++) {
			if (f[s] <= 1)
				continue;
			uint64_t cost = sym_cost_q16(c[s], f[s] - 1u, n) - sym_cost_q16(c[s], f[s], n);
			if (cost < best_cost) {
				best_cost = cost;
				best = (int)s;
			}
		}
		if (best < 0)
			break; /* unreachable: callers ensure 2^n >= symbols present */
		f[best]--;
		sum--;
	}
	while (sum < (int64_t)m) { /* give to the symbol where it saves most */
		int best = -1;
		uint64_t best_gain = 0;
		for (unsigned s = 0; s < a; s++) {
			if (!c[s])
				continue;
			uint64_t gain = sym_cost_q16(c[s], f[s], n) - sym_cost_q16(c[s], f[s] + 1u, n);
			if (best < 0 || gain > best_gain) {
				best_gain = gain;
				best = (int)s;
			}
		}
		if (best < 0)
			break;
		f[best]++;
		sum++;
	}
}

static uint64_t row_cost_q16(const uint64_t *c, const uint16_t *f, unsigned a, unsigned n)
{
	uint64_t cost = 0;
	for (unsigned s = 0; s < a; s++)
		if (c[s])
			cost += sym_cost_q16(c[s], f[s], n);
	return cost;
}

/* ---- serialization ------------------------------------------------------ */

/* Row: lo (8 bits), hi (8 bits), k (4 bits), EG_k(f[s]) for lo <= s < hi;
 * f[hi] is implied by the sum. */
static void row_range(const uint16_t *f, unsigned a, unsigned *lo, unsigned *hi)
{
	unsigned l = 0, h = a ? a - 1 : 0; /* f[s] == 0 for s >= a (invariant 2) */
	while (l < h && !f[l])
		l++;
	while (h > l && !f[h])
		h--;
	*lo = l;
	*hi = h;
}

/* The Exp-Golomb order that codes f[lo..hi) in the fewest bits; *len gets
 * that number of bits. */
static unsigned row_best_k(const uint16_t *f, unsigned lo, unsigned hi, unsigned *len)
{
	unsigned best_k = 0, best = UINT32_MAX;
	uint32_t sum = 0;
	for (unsigned s = lo; s < hi; s++)
		sum += f[s];
	/* the best order sits near log2 of the mean frequency */
	unsigned mean = hi > lo ? sum / (hi - lo) : 0, lg = 0;
	while (lg < ULP_PROB_BITS_MAX && (1u << (lg + 1)) <= mean)
		lg++;
	unsigned k0 = lg > 2 ? lg - 2 : 0, k1 = ULP_MIN(lg + 1, ULP_PROB_BITS_MAX);
	/* eg_len(v, k) = 2 floor(log2((v >> k) + 1)) + 1 + k
	 *              = 2 floor(log2(v + 2^k)) + 1 - k, from a table */
	for (unsigned k = k0; k <= k1; k++) {
		unsigned l = 0;
		for (unsigned s = lo; s < hi; s++)
			l += lg_table[f[s] + (1u << k)];
		l = 2 * l + (hi - lo) - (hi - lo) * k; /* each term is at least k + 1 */
		if (l < best) {
			best = l;
			best_k = k;
		}
	}
	*len = best;
	return best_k;
}

static void write_table(const ulp_table *t, tbw *w)
{
	tbw_eg(w, t->n_rows - 1, 0);
	for (unsigned r = 0; r < t->n_rows; r++) {
		const uint16_t *f = t->freq + (size_t)r * 256;
		unsigned lo, hi, len;
		row_range(f, t->alphabet, &lo, &hi);
		unsigned k = row_best_k(f, lo, hi, &len);
		tbw_put(w, lo, 8);
		tbw_put(w, hi, 8);
		tbw_put(w, k, 4);
		for (unsigned s = lo; s < hi; s++)
			tbw_eg(w, f[s], k);
	}
	unsigned used = 0;
	for (unsigned c = 0; c < t->n_ctx; c++)
		used += t->ctx_row[c] != ULP_CTX_UNUSED;
	tbw_eg(w, used - 1, 0);
	unsigned rb = bits_for(t->n_rows);
	int prev = -1;
	for (unsigned c = 0; c < t->n_ctx; c++) {
		if (t->ctx_row[c] == ULP_CTX_UNUSED)
			continue;
		tbw_eg(w, (uint32_t)((int)c - prev - 1), 0);
		tbw_put(w, t->ctx_row[c], rb);
		prev = (int)c;
	}
}

size_t ulp_table_size(const ulp_table *t)
{
	tbw w = {0};
	write_table(t, &w);
	return (size_t)((w.bits + 7) >> 3);
}

int64_t ulp_table_write(const ulp_table *t, uint8_t *dst, size_t cap)
{
	pthread_once(&log2_once, log2_init); /* row_best_k's table */
	tbw w = {dst, cap, 0};
	write_table(t, &w); /* writes nothing past cap */
	size_t need = (size_t)((w.bits + 7) >> 3);
	return need > cap ? -ULP_E_OVERFLOW : (int64_t)need;
}

size_t ulp_table_bound(const ulp_table *t)
{
	/* per row 20 bits + at most 2*13+1+12 bits a frequency; the map: at
	 * most 2*11+1 + 11 bits a context; the counts: 2 x 23 bits */
	return ((size_t)t->n_rows * (20 + 39 * (size_t)t->alphabet) + (size_t)t->n_ctx * 34 + 46) / 8 + 8;
}

void ulp_table_free(ulp_table *t)
{
	if (!t)
		return;
	free(t->freq);
	free(t->ctx_row);
	t->freq = NULL;
	t->ctx_row = NULL;
}

static int table_alloc(ulp_table *t, unsigned n_rows, unsigned n_ctx)
{
	t->freq = calloc((size_t)n_rows * 256, sizeof(uint16_t));
	t->ctx_row = malloc((size_t)n_ctx * sizeof(uint16_t));
	if (!t->freq || !t->ctx_row) {
		ulp_table_free(t);
		return -ULP_E_NOMEM;
	}
	for (unsigned c = 0; c < n_ctx; c++)
		t->ctx_row[c] = ULP_CTX_UNUSED;
	t->n_rows = n_rows;
	t->n_ctx = n_ctx;
	return 0;
}

int ulp_table_read(const uint8_t *src, size_t len, unsigned n, unsigned alphabet,
                   unsigned n_ctx, ulp_table *out, ulp_err *err)
{
	ulp_table t = {0};
	tbr r = {src, 0, (uint64_t)len * 8, 0};
	if (n < ULP_PROB_BITS_MIN || n > ULP_PROB_BITS_MAX)
		return ULP_CORRUPT(err, "probability precision %u outside [%d, %d]", n,
		                   ULP_PROB_BITS_MIN, ULP_PROB_BITS_MAX);
	const uint32_t m = 1u << n;
	uint32_t n_rows = tbr_eg(&r, 0) + 1;
	if (r.over || n_rows > n_ctx)
		return ULP_CORRUPT(err, "table declares %u rows for %u contexts", n_rows, n_ctx);
	ULP_TRY(table_alloc(&t, n_rows, n_ctx));
	t.prob_bits = n;
	t.alphabet = alphabet;
	for (unsigned row = 0; row < n_rows; row++) {
		uint16_t *f = t.freq + (size_t)row * 256;
		unsigned lo = tbr_get(&r, 8), hi = tbr_get(&r, 8), k = tbr_get(&r, 4);
		if (r.over || lo > hi || hi >= alphabet || k > ULP_PROB_BITS_MAX) {
			ulp_table_free(&t);
			return ULP_CORRUPT(err, "table row %u: bad symbol range [%u, %u] or order %u", row,
			                   lo, hi, k);
		}
		uint32_t sum = 0;
		for (unsigned s = lo; s < hi; s++) {
			uint32_t v = tbr_eg(&r, k);
			if (r.over || v > m - sum) {
				ulp_table_free(&t);
				return ULP_CORRUPT(err, "table row %u: frequencies exceed 2^%u", row, n);
			}
			f[s] = (uint16_t)v;
			sum += v;
		}
		if (sum >= m) {
			ulp_table_free(&t);
			return ULP_CORRUPT(err, "table row %u: no room for the last symbol", row);
		}
		f[hi] = (uint16_t)(m - sum);
	}
	uint32_t used = tbr_eg(&r, 0) + 1;
	if (r.over || used > n_ctx) {
		ulp_table_free(&t);
		return ULP_CORRUPT(err, "table maps %u contexts, at most %u exist", used, n_ctx);
	}
	unsigned rb = bits_for(n_rows);
	uint32_t c = 0;
	for (uint32_t i = 0; i < used; i++) {
		uint32_t gap = tbr_eg(&r, 0);
		uint32_t row = tbr_get(&r, rb);
		c = (i == 0 ? 0 : c + 1) + gap;
		if (r.over || c >= n_ctx || row >= n_rows) {
			ulp_table_free(&t);
			return ULP_CORRUPT(err, "table context map entry %u out of range", i);
		}
		t.ctx_row[c] = (uint16_t)row;
	}
	if ((r.bits + 7) >> 3 != len) {
		ulp_table_free(&t);
		return ULP_CORRUPT(err, "table is %zu bytes but its content ends at byte %llu", len,
		                   (unsigned long long)((r.bits + 7) >> 3));
	}
	*out = t;
	return 0;
}

/* ---- choice ------------------------------------------------------------- */

/* Exact serialized bits of one row (see write_table). */
static uint64_t row_bits(const uint16_t *f, unsigned a)
{
	unsigned lo, hi, len;
	row_range(f, a, &lo, &hi);
	row_best_k(f, lo, hi, &len);
	return 20 + (uint64_t)len;
}

typedef struct ctxinfo {
	unsigned c;        /* context id */
	uint64_t total;    /* elements in it */
	uint64_t cost;     /* Q16 bits of its symbols under its own row */
	uint64_t bits;     /* serialized bits of its own row */
} ctxinfo;

static int cmp_ctx(const void *a, const void *b)
{
	const ctxinfo *x = a, *y = b;
	if (x->total != y->total)
		return x->total > y->total ? -1 : 1;
	return x->c < y->c ? -1 : x->c > y->c;
}

/* Row counts tried: every K up to 8, then about 1.4x apart, and kmax. */
static unsigned next_k(unsigned k, unsigned kmax)
{
	unsigned nk = k < 8 ? k + 1 : k + k / 3;
	return k < kmax && nk > kmax ? kmax : nk;
}

/*
 * Candidate tables: at each precision n, the K most frequent contexts own a
 * row and the others share one, for every K the decoder budget allows
 * (K + 1 rows of 2^n slots, at most max(2^12, elements / 2) slots, so building
 * the decoder's tables never costs more than decoding). The cheapest in
 * table bits + coded bits wins; ties keep the earlier candidate.
 */
int ulp_table_choose(const uint64_t *counts, unsigned n_ctx, unsigned a, ulp_table *out,
                     uint64_t *cost_bits)
{
	pthread_once(&log2_once, log2_init);
	uint64_t total = 0;
	unsigned used = 0;
	ctxinfo *ci = calloc(n_ctx, sizeof(*ci));
	uint64_t *rest = malloc(256 * sizeof(uint64_t));
	uint64_t *all = calloc(256, sizeof(uint64_t));
	uint16_t f[256] = {0}; /* normalize writes f[lo..lo + aw) only */
	int rc = -ULP_E_NOMEM;
	if (!ci || !rest || !all)
		goto out;
	for (unsigned c = 0; c < n_ctx; c++) {
		/* most contexts are empty (a tensor uses a few exponents): a row
		 * is tested with loads only before it is added up */
		const uint64_t *row = counts + (size_t)c * a;
		uint64_t any = 0;
		unsigned s0 = 0;
		for (; s0 + 4 <= a; s0 += 4)
			any |= row[s0] | row[s0 + 1] | row[s0 + 2] | row[s0 + 3];
		for (; s0 < a; s0++)
			any |= row[s0];
		if (!any)
			continue;
		uint64_t t = 0;
		for (unsigned s = 0; s < a; s++) {
			t += row[s];
			all[s] += row[s];
		}
		if (t) {
			ci[used].c = c;
			ci[used++].total = t;
		}
		total += t;
	}
	qsort(ci, used, sizeof(*ci), cmp_ctx);
	unsigned present = 0; /* a precision must give every present symbol a slot */
	for (unsigned s = 0; s < a; s++)
		present += all[s] != 0;
	/* symbols [lo, lo + aw) hold every count: the rows are built and costed
	 * on that window alone (same results: a symbol without counts gets no
	 * slot, costs nothing and is never picked), which pays on small tensors */
	unsigned lo = 0, aw = a;
	if (used) {
		while (!all[lo])
			lo++;
		aw = a - lo;
		while (!all[lo + aw - 1])
			aw--;
	}
	/* at most 2^16 slots (256 KiB of decoder tables): beyond that the tables
	 * fall out of L2 and memory grows with the tensor, for no measurable gain */
	uint64_t budget = ULP_MIN(ULP_MAX((uint64_t)1 << ULP_PROB_BITS_MAX, total / 2), (uint64_t)1 << 16);
	uint64_t best_cost = UINT64_MAX;
	unsigned best_n = ULP_PROB_BITS_MAX, best_k = 0;
	for (unsigned n = ULP_PROB_BITS_MAX; n >= ULP_PROB_BITS_MIN; n -= 2) {
		if (n < ULP_PROB_BITS_MAX && (total > ((uint64_t)64 << n) || present > (1u << n)))
			continue; /* low precisions only pay off on small tensors */
		unsigned kmax = (unsigned)ULP_MIN((uint64_t)used, (budget >> n) - 1);
		/* only the kmax most frequent contexts can own a row */
		for (unsigned i = 0; i < kmax; i++) {
			normalize(counts + (size_t)ci[i].c * a + lo, aw, n, f + lo);
			ci[i].cost = row_cost_q16(counts + (size_t)ci[i].c * a + lo, f + lo, aw, n);
			ci[i].bits = row_bits(f, a);
		}
		uint64_t own_cost = 0, own_bits = 0;
		memcpy(rest, all, 256 * sizeof(uint64_t));
		for (unsigned k = 0, moved = 0; k <= kmax; k = next_k(k, kmax)) {
			for (; moved < k; moved++) { /* contexts before k leave the shared row */
				own_cost += ci[moved].cost;
				own_bits += ci[moved].bits;
				for (unsigned s = lo; s < lo + aw; s++)
					rest[s] -= counts[(size_t)ci[moved].c * a + s];
			}
			int shared = k < used || used == 0;
			unsigned rows = k + (unsigned)shared;
			uint64_t cost = own_cost + (own_bits << 16);
			if (shared) {
				normalize(rest + lo, aw, n, f + lo);
				cost += row_cost_q16(rest + lo, f + lo, aw, n) + (row_bits(f, a) << 16);
			}
			/* row count, context map */
			uint64_t map = eg_len(rows - 1, 0) + eg_len(ULP_MAX(used, 1u) - 1, 0) +
			               (uint64_t)ULP_MAX(used, 1u) * bits_for(rows);
			cost += map << 16;
			if (cost < best_cost) {
				best_cost = cost;
				best_n = n;
				best_k = k;
			}
		}
	}
	/* build the winner */
	rc = table_alloc(out, best_k + (best_k < used || used == 0), n_ctx);
	if (rc < 0)
		goto out;
	out->prob_bits = best_n;
	out->alphabet = a;
	memcpy(rest, all, 256 * sizeof(uint64_t));
	for (unsigned k = 0; k < best_k; k++) {
		normalize(counts + (size_t)ci[k].c * a + lo, aw, best_n, out->freq + (size_t)k * 256 + lo);
		out->ctx_row[ci[k].c] = (uint16_t)k;
		for (unsigned s = lo; s < lo + aw; s++)
			rest[s] -= counts[(size_t)ci[k].c * a + s];
	}
	if (out->n_rows > best_k) {
		normalize(rest + lo, aw, best_n, out->freq + (size_t)best_k * 256 + lo);
		for (unsigned i = best_k; i < used; i++)
			out->ctx_row[ci[i].c] = (uint16_t)best_k;
		if (used == 0)
			out->ctx_row[0] = 0;
	}
	*cost_bits = (best_cost + 65535) >> 16;
out:
	free(ci);
	free(rest);
	free(all);
	return rc;
}

/* ---- encoder and decoder views ------------------------------------------- */

int ulp_table_esyms(const ulp_table *t, ulp_rans_esym **out)
{
	ulp_rans_esym *e = calloc((size_t)t->n_rows * t->alphabet, sizeof(*e)); /* dense: stays in L1 */
	if (!e)
		return -ULP_E_NOMEM;
	for (unsigned r = 0; r < t->n_rows; r++) {
		const uint16_t *f = t->freq + (size_t)r * 256;
		uint32_t cum = 0;
		for (unsigned s = 0; s < t->alphabet; s++) {
			if (f[s])
				ulp_rans_esym_init(&e[(size_t)r * t->alphabet + s], cum, f[s], t->prob_bits);
			cum += f[s];
		}
	}
	*out = e;
	return 0;
}

/* Four slots a store (portable vector extension: SSE2 or NEON): a symbol's
 * run may spill up to three entries past its end, which the next symbol
 * overwrites, or the padding after the last row absorbs. */
typedef uint32_t slot4 __attribute__((vector_size(16)));

int ulp_table_dslots(const ulp_table *t, uint32_t **out)
{
	uint32_t *d = malloc(ulp_table_dslots_size(t));
	if (!d)
		return -ULP_E_NOMEM;
	ulp_table_dslots_into(t, d);
	*out = d;
	return 0;
}

size_t ulp_table_dslots_size(const ulp_table *t)
{
	return ((size_t)t->n_rows * ((size_t)1 << t->prob_bits) + 4) * sizeof(uint32_t);
}

void ulp_table_dslots_into(const ulp_table *t, uint32_t *d)
{
	const uint32_t m = 1u << t->prob_bits;
	const slot4 iota = {0, 1, 2, 3}, four = {4, 4, 4, 4};
	for (unsigned r = 0; r < t->n_rows; r++) {
		const uint16_t *f = t->freq + (size_t)r * 256;
		uint32_t *row = d + (size_t)r * m;
		uint32_t cum = 0;
		for (unsigned s = 0; s < t->alphabet && s < 256; s++) { /* f[s] = 0 beyond */
			const uint32_t fs = f[s];
			if (!fs)
				continue;
			const uint32_t v = (uint32_t)s << 24 | (fs - 1) << 12;
			slot4 e = iota + v;
			for (uint32_t j = 0; j < fs; j += 4) {
				memcpy(row + cum + j, &e, sizeof(e));
				e += four;
			}
			cum += fs;
		}
	}
}

double ulp_counts_entropy_bits(const uint64_t *counts, unsigned n_ctx, unsigned a)
{
	double bits = 0;
	for (unsigned c = 0; c < n_ctx; c++) {
		uint64_t tot = 0;
		for (unsigned s = 0; s < a; s++)
			tot += counts[(size_t)c * a + s];
		for (unsigned s = 0; s < a; s++) {
			uint64_t v = counts[(size_t)c * a + s];
			if (v)
				bits += (double)v * log2((double)tot / (double)v);
		}
	}
	return bits;
}
