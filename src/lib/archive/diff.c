/* SPDX-License-Identifier: MIT */
/*
 * diff.c - what changed between two checkpoints, tensor by tensor (`ulpack
 * diff`, `ulpack dynamics --norms`): each tensor of the same name, dtype and
 * size in both files is read through the public file reads (ulp_file_pread
 * of its byte range, read-ahead off: only its chunks are decoded) and
 * compared element by element. The delta stream itself is not read: a
 * delta's chunks code the change against a reference that need not be the
 * other file (a backward delta, an anchor, a delta over several steps), so
 * decoding both is the one way that holds for every pair.
 *
 * Definitions (ulpack(1) DIFF):
 *  - the ordered integer of a float's bits: u with the sign set for a
 *    positive value, ~u for a negative one, so that integers keep the order
 *    of values; the ULP distance of two values is the difference of theirs
 *    (exact for every bit pattern; +0 and -0 are 1 apart);
 *  - median and 99th percentile: the distances of all elements (0 where
 *    unchanged) sorted, the value at rank floor(q (n - 1)) (numpy's
 *    percentile with method="lower"), found by a radix select over 16-bit
 *    digits (no copy of the distances);
 *  - rel_change = sqrt(sum (b - a)^2) / sqrt(sum a^2), the values converted
 *    to double and summed in double by blocks of 2^20 elements, the blocks
 *    in order;
 *  - exponent moves: elements whose exponent field differs.
 *
 * Invariants:
 *  1. At most two tensors (one of each file) are held at a time.
 *  2. The result is sorted by rel_change, largest first, NaN last, ties by
 *     name: the same files give the same order.
 *  3. A pair is compared in blocks of SCAN_BLOCK elements on the archive's
 *     pool; the blocks' sums are added in block order, so the figures do not
 *     depend on the threads.
 */
#include "arch_int.h"
#include "store/path.h"
#include "store/index.h"
#include "store/shared.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct fmt {
	unsigned size, mbits, ebits; /* bytes; mantissa and exponent bits */
	int no_inf;                  /* F8_E4M3: no infinities, one NaN pattern */
} fmt;

static int fmt_of(int dt, fmt *f)
{
	switch (dt) {
	case ULP_DT_F16: *f = (fmt){2, 10, 5, 0}; return 1;
	case ULP_DT_BF16: *f = (fmt){2, 7, 8, 0}; return 1;
	case ULP_DT_F32: *f = (fmt){4, 23, 8, 0}; return 1;
	case ULP_DT_F64: *f = (fmt){8, 52, 11, 0}; return 1;
	case ULP_DT_F8_E4M3: *f = (fmt){1, 3, 4, 1}; return 1;
	case ULP_DT_F8_E5M2: *f = (fmt){1, 2, 5, 0}; return 1;
	default: return 0;
	}
}

/* The ordered integer of a W-bit float's bits u (sign bit sg, all bits mk). */
#define ORD(u, sg, mk) ((u) & (sg) ? ~(u) & (mk) : (u) | (sg))

static double value(uint64_t u, const fmt *f)
{
	unsigned top = f->ebits + f->mbits;
	int neg = (int)((u >> top) & 1);
	uint64_t e = (u >> f->mbits) & ((1u << f->ebits) - 1), m = u & ((1u << f->mbits) - 1);
	int bias = (1 << (f->ebits - 1)) - 1;
	double v;
	if (e == (1u << f->ebits) - 1 && !f->no_inf)
		v = m ? NAN : INFINITY;
	else if (f->no_inf && e == (1u << f->ebits) - 1 && m == (1u << f->mbits) - 1)
		v = NAN;
	else if (e == 0)
		v = ldexp((double)m, 1 - bias - (int)f->mbits);
	else
		v = ldexp((double)(m | (1u << f->mbits)), (int)e - bias - (int)f->mbits);
	return neg ? -v : v;
}

/* What a pass over a block of elements gathers (its sums are added in
 * block order: the same figures whatever the threads). */
typedef struct blk {
	uint64_t changed, maxd, emoves;
	double sa, sd;
} blk;

/* The histogram of every element's distance by its top 16 bits (all its
 * bits for 8 and 16-bit formats), and where to find the rest. */
typedef struct acc {
	uint64_t *hist;
	unsigned hshift;
} acc;

static inline double v_bf16(uint16_t x)
{
	uint32_t w = (uint32_t)x << 16;
	float v;
	memcpy(&v, &w, 4);
	return v;
}

static inline double v_f32(uint32_t x)
{
	float v;
	memcpy(&v, &x, 4);
	return v;
}

static inline double v_f64(uint64_t x)
{
	double v;
	memcpy(&v, &x, 8);
	return v;
}

typedef struct scan {
	const uint8_t *a, *b;
	size_t n, nb, jobs;
	fmt f;
	int dtype;
	const double *tab;     /* f16, f8: every value */
	unsigned hshift;
	blk *blks;             /* nb */
	uint64_t *hists;       /* jobs x 65536 */
} scan;

#define SCAN_BLOCK ((size_t)1 << 20) /* elements */

/* A function that scans elements [lo, hi) of type T (W bits) into o and h;
 * VAL gives a value of bits x. */
#define SCAN_FN(NAME, T, W, VAL)                                                                             \
	static void NAME(const scan *c, size_t lo, size_t hi, blk *o, uint64_t *h)                            \
	{                                                                                                     \
		const T sg = (T)((T)1 << ((W) - 1)), mk = (T)~(T)0;                                          \
		const uint64_t em = ((uint64_t)1 << c->f.ebits) - 1;                                          \
		const unsigned mb = c->f.mbits, hs = c->hshift;                                               \
		const double *tab = c->tab;                                                                   \
		(void)tab;                                                                                    \
		for (size_t i = lo; i < hi; i++) {                                                            \
			T x, y;                                                                               \
			memcpy(&x, c->a + i * sizeof(T), sizeof(T));                                          \
			memcpy(&y, c->b + i * sizeof(T), sizeof(T));                                          \
			double va = VAL(x);                                                                   \
			o->sa += va * va;                                                                     \
			if (x == y)                                                                           \
				continue;                                                                     \
			T ox = (T)ORD(x, sg, mk), oy = (T)ORD(y, sg, mk);                                     \
			uint64_t d = ox > oy ? (uint64_t)(ox - oy) : (uint64_t)(oy - ox);                     \
			o->changed++;                                                                         \
			o->maxd = d > o->maxd ? d : o->maxd;                                                  \
			h[d >> hs]++;                                                                         \
			o->emoves += (((uint64_t)x >> mb) & em) != (((uint64_t)y >> mb) & em);                \
			double dv = VAL(y) - va;                                                              \
			o->sd += dv * dv;                                                                     \
		}                                                                                             \
	}

#define V_TAB(x) tab[x]
SCAN_FN(scan_f32, uint32_t, 32, v_f32)
SCAN_FN(scan_f64, uint64_t, 64, v_f64)
SCAN_FN(scan_bf16, uint16_t, 16, v_bf16)
SCAN_FN(scan_tab16, uint16_t, 16, V_TAB)
SCAN_FN(scan_tab8, uint8_t, 8, V_TAB)

/* Job j: blocks j, j + jobs, ... into their blk and job j's histogram. */
static int scan_job(void *arg, size_t j)
{
	const scan *c = arg;
	uint64_t *h = c->hists + j * 65536;
	for (size_t k = j; k < c->nb; k += c->jobs) {
		size_t lo = k * SCAN_BLOCK, hi = ULP_MIN(c->n, lo + SCAN_BLOCK);
		blk *o = &c->blks[k];
		switch (c->f.size) {
		case 4: scan_f32(c, lo, hi, o, h); break;
		case 8: scan_f64(c, lo, hi, o, h); break;
		case 2:
			if (c->dtype == ULP_DT_BF16)
				scan_bf16(c, lo, hi, o, h);
			else
				scan_tab16(c, lo, hi, o, h);
			break;
		default: scan_tab8(c, lo, hi, o, h); break;
		}
	}
	return 0;
}

/* The distance at rank k (0-based): its top digit from the histogram, the
 * lower 16-bit digits (W > 16) by a pass each over the elements that share
 * the digits found so far. */
#define REFINE(T, W)                                                                                         \
	do {                                                                                                  \
		const T sg = (T)((T)1 << ((W) - 1)), mk = (T)~(T)0;                                          \
		for (int shift = (int)z->hshift - 16; shift >= 0; shift -= 16) {                              \
			memset(h, 0, 65536 * sizeof(*h));                                                     \
			unsigned above = (unsigned)shift + 16;                                                \
			for (size_t i = 0; i < n; i++) {                                                      \
				T x, y;                                                                       \
				memcpy(&x, a + i * sizeof(T), sizeof(T));                                     \
				memcpy(&y, b + i * sizeof(T), sizeof(T));                                     \
				T ox = (T)ORD(x, sg, mk), oy = (T)ORD(y, sg, mk);                             \
				uint64_t d = ox > oy ? (uint64_t)(ox - oy) : (uint64_t)(oy - ox);             \
				if ((d >> above) == hi)                                                       \
					h[(d >> shift) & 0xffff]++;                                           \
			}                                                                                     \
			uint64_t digit = 0;                                                                   \
			while (digit < 65535 && k >= h[digit])                                                \
				k -= h[digit++];                                                              \
			hi = hi << 16 | digit;                                                                \
		}                                                                                             \
	} while (0)

/* h: room for a histogram of 65536 counts. */
static void select_rank(const uint8_t *a, const uint8_t *b, unsigned size, size_t n, const acc *z, uint64_t k,
                        uint64_t *h, uint64_t *out)
{
	uint64_t hi = 0;
	while (hi < 65535 && k >= z->hist[hi])
		k -= z->hist[hi++];
	if (z->hshift) {
		if (size == 4)
			REFINE(uint32_t, 32);
		else
			REFINE(uint64_t, 64);
	}
	*out = hi;
}

/* Buffers that one ulp_archive_diff reuses from tensor to tensor (fresh
 * ones cost a page fault a page each time). */
typedef struct scratch {
	uint64_t *hists;       /* (MAX_JOBS + 1) x 65536 counts */
	blk *blks;
	size_t cap_blks;
} scratch;

#define MAX_JOBS 16

static int compare(ulp_pool *pool, scratch *sc, const uint8_t *a, const uint8_t *b, size_t bytes,
                   ulp_tensor_diff *r)
{
	fmt f;
	int is_float = fmt_of(r->dtype, &f);
	unsigned size = is_float ? f.size : ulp_dtype_size((ulp_dtype)r->dtype);
	size_t n = bytes / size;
	r->elements = n;
	r->changed = 0;
	r->median_ulps = r->p99_ulps = r->max_ulps = 0;
	r->exponent_moves = 0;
	r->rel_change = r->norm_a = r->norm_diff = NAN;
	if (!is_float) {
		for (size_t i = 0; i < n; i++)
			r->changed += memcmp(a + i * size, b + i * size, size) != 0;
		r->frac_changed = n ? (double)r->changed / (double)n : 0;
		return 0;
	}
	scan c = {.a = a, .b = b, .n = n, .f = f, .dtype = r->dtype, .hshift = size == 1 ? 0 : size * 8 - 16};
	c.nb = (n + SCAN_BLOCK - 1) / SCAN_BLOCK;
	c.jobs = ULP_MIN(c.nb, (size_t)ulp_pool_threads(pool));
	c.jobs = c.jobs ? ULP_MIN(c.jobs, MAX_JOBS) : 1;
	if (!sc->hists && !(sc->hists = malloc((MAX_JOBS + 1) * 65536 * sizeof(*sc->hists))))
		return -ULP_E_NOMEM;
	if (c.nb > sc->cap_blks) {
		blk *nbk = realloc(sc->blks, c.nb * sizeof(*nbk));
		if (!nbk)
			return -ULP_E_NOMEM;
		sc->blks = nbk;
		sc->cap_blks = c.nb;
	}
	c.blks = sc->blks;
	c.hists = sc->hists;
	memset(c.blks, 0, c.nb * sizeof(*c.blks));
	memset(c.hists, 0, c.jobs * 65536 * sizeof(*c.hists));
	double *tab = NULL;
	if (size <= 2 && r->dtype != ULP_DT_BF16) { /* f16, f8: a table of every value */
		size_t nv = (size_t)1 << (8 * size);
		if ((tab = malloc(nv * sizeof(*tab))) != NULL)
			for (size_t u = 0; u < nv; u++)
				tab[u] = value(u, &f);
		c.tab = tab;
	}
	if (size <= 2 && r->dtype != ULP_DT_BF16 && !tab)
		return -ULP_E_NOMEM;
	ulp_pool_run(c.jobs > 1 ? pool : NULL, c.jobs, scan_job, &c);
	free(tab);
	/* the blocks' figures in block order; the histograms added into the first */
	acc z = {c.hists, c.hshift};
	for (size_t j = 1; j < c.jobs; j++)
		for (size_t k = 0; k < 65536; k++)
			z.hist[k] += c.hists[j * 65536 + k];
	double sa = 0, sd = 0;
	for (size_t k = 0; k < c.nb; k++) {
		r->changed += c.blks[k].changed;
		r->max_ulps = ULP_MAX(r->max_ulps, c.blks[k].maxd);
		r->exponent_moves += c.blks[k].emoves;
		sa += c.blks[k].sa;
		sd += c.blks[k].sd;
	}
	z.hist[0] += n - r->changed; /* the unchanged: distance 0 */
	r->frac_changed = n ? (double)r->changed / (double)n : 0;
	r->norm_a = sqrt(sa);
	r->norm_diff = sqrt(sd);
	r->rel_change = sa > 0 ? r->norm_diff / r->norm_a : sd > 0 ? NAN : 0;
	if (n && r->changed) {
		uint64_t *h = sc->hists + MAX_JOBS * 65536;
		select_rank(a, b, size, n, &z, (uint64_t)(n - 1) / 2, h, &r->median_ulps);
		select_rank(a, b, size, n, &z, (uint64_t)floor(0.99 * (double)(n - 1)), h, &r->p99_ulps);
	}
	return 0;
}

/* ---- files ---------------------------------------------------------------------- */

typedef struct named {
	char *name;
	int dtype;
	uint64_t offset, length;
} named;

typedef struct nlist {
	named *v;
	size_t n, cap;
} nlist;

static int add_named(void *arg, const char *name, int dtype, uint64_t offset, uint64_t length)
{
	nlist *l = arg;
	if (ulp_grow(&l->v, &l->cap, l->n, sizeof(*l->v)) < 0 || !(l->v[l->n].name = strdup(name)))
		return -ULP_E_NOMEM;
	l->v[l->n].dtype = dtype;
	l->v[l->n].offset = offset;
	l->v[l->n].length = length;
	l->n++;
	return 0;
}

static int named_cmp(const void *x, const void *y)
{
	return strcmp(((const named *)x)->name, ((const named *)y)->name);
}

static int read_range(ulp_archive *a, ulp_file *f, const char *path, uint64_t off, uint64_t len, uint8_t *dst)
{
	for (uint64_t done = 0; done < len;) {
		int64_t r = ulp_file_pread(f, dst + done, (size_t)(len - done), off + done);
		if (r < 0)
			return (int)r;
		if (r == 0)
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: ends before byte %llu", path,
			                    (unsigned long long)(off + len));
		done += (uint64_t)r;
	}
	return 0;
}

static int diff_cmp(const void *x, const void *y)
{
	const ulp_tensor_diff *a = x, *b = y;
	int na = isnan(a->rel_change), nb = isnan(b->rel_change);
	if (na != nb)
		return na - nb;
	if (!na && a->rel_change != b->rel_change)
		return a->rel_change > b->rel_change ? -1 : 1;
	return strcmp(a->name, b->name);
}

void ulp_tensor_diffs_free(ulp_tensor_diff *v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i].name);
	free(v);
}

int ulp_archive_diff(ulp_archive *a, const char *path_a, const char *path_b, ulp_tensor_diff **out, size_t *n_out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	char pa[ULP_PATH_MAX + 1], pb[ULP_PATH_MAX + 1];
	ULP_TRY(ulp_arch_path(a, path_a, pa, sizeof(pa)));
	ULP_TRY(ulp_arch_path(a, path_b, pb, sizeof(pb)));
	nlist la = {0}, lb = {0};
	ulp_file *fa = NULL, *fb = NULL;
	ulp_tensor_diff *res = NULL;
	size_t nr = 0;
	uint8_t *ba = NULL, *bb = NULL;
	scratch sc = {0};
	int rc = ulp_file_open(a, pa, &fa);
	if (rc >= 0)
		rc = ulp_file_open(a, pb, &fb);
	if (rc >= 0 && (rc = ulp_index_file_named(a, pa, add_named, &la)) >= 0)
		rc = ulp_index_file_named(a, pb, add_named, &lb);
	if (rc == -ULP_E_NOMEM)
		rc = ulp_arch_err(a, rc, "%s: out of memory", pa);
	if (rc >= 0) {
		if (lb.n)
			qsort(lb.v, lb.n, sizeof(*lb.v), named_cmp);
		if (la.n && !(res = calloc(la.n, sizeof(*res))))
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", pa);
	}
	for (size_t i = 0; rc >= 0 && i < la.n; i++) {
		const named *x = &la.v[i], *y = lb.n ? bsearch(x, lb.v, lb.n, sizeof(*lb.v), named_cmp) : NULL;
		if (!y || y->dtype != x->dtype || y->length != x->length)
			continue;
		uint8_t *na = realloc(ba, (size_t)x->length), *nb = na ? realloc(bb, (size_t)x->length) : NULL;
		if (na)
			ba = na;
		if (nb)
			bb = nb;
		if (!na || !nb) {
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory for tensor %s", pa, x->name);
			break;
		}
		if ((rc = read_range(a, fa, pa, x->offset, x->length, ba)) < 0 ||
		    (rc = read_range(a, fb, pb, y->offset, y->length, bb)) < 0)
			break;
		ulp_tensor_diff *r = &res[nr];
		if (!(r->name = strdup(x->name))) {
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", pa);
			break;
		}
		r->dtype = x->dtype;
		nr++;
		if ((rc = compare(a->pool, &sc, ba, bb, (size_t)x->length, r)) < 0) {
			rc = ulp_arch_err(a, rc, "%s: out of memory for tensor %s", pa, x->name);
			break;
		}
	}
	if (rc >= 0 && !nr)
		rc = ulp_arch_err(a, -ULP_E_INVAL, "%s and %s: no tensor of the same name, dtype and size in both", pa, pb);
	free(ba);
	free(bb);
	free(sc.hists);
	free(sc.blks);
	ulp_file_close(fa);
	ulp_file_close(fb);
	for (size_t i = 0; i < la.n; i++)
		free(la.v[i].name);
	for (size_t i = 0; i < lb.n; i++)
		free(lb.v[i].name);
	free(la.v);
	free(lb.v);
	if (rc < 0) {
		ulp_tensor_diffs_free(res, nr);
		return rc;
	}
	qsort(res, nr, sizeof(*res), diff_cmp);
	*out = res;
	*n_out = nr;
	return 0;
}
