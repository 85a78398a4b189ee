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
 *    to double and summed in double, in element order;
 *  - exponent moves: elements whose exponent field differs.
 *
 * Invariants:
 *  1. At most two tensors (one of each file) are held at a time.
 *  2. The result is sorted by rel_change, largest first, NaN last, ties by
 *     name: the same files give the same order.
 */
#include "arch_int.h"
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

static uint64_t bits_at(const uint8_t *p, unsigned size, size_t i)
{
	uint64_t u = 0;
	memcpy(&u, p + i * size, size); /* little-endian, as safetensors and the codec */
	return u;
}

static uint64_t ordered(uint64_t u, unsigned size)
{
	uint64_t sign = (uint64_t)1 << (8 * size - 1), mask = size == 8 ? ~(uint64_t)0 : (sign << 1) - 1;
	return u & sign ? ~u & mask : u | sign;
}

static uint64_t dist(const uint8_t *a, const uint8_t *b, unsigned size, size_t i)
{
	uint64_t x = ordered(bits_at(a, size, i), size), y = ordered(bits_at(b, size, i), size);
	return x > y ? x - y : y - x;
}

static double value(uint64_t u, const fmt *f)
{
	if (f->size == 4) {
		float v;
		uint32_t w = (uint32_t)u;
		memcpy(&v, &w, 4);
		return v;
	}
	if (f->size == 8) {
		double v;
		memcpy(&v, &u, 8);
		return v;
	}
	if (f->mbits == 7) { /* bf16: the high half of an f32 */
		float v;
		uint32_t w = (uint32_t)u << 16;
		memcpy(&v, &w, 4);
		return v;
	}
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

/* The k-th smallest ULP distance (0-based) over n elements: radix select on
 * 16-bit digits, from the top, each pass over the elements that share the
 * digits found so far. */
static int select_rank(const uint8_t *a, const uint8_t *b, unsigned size, size_t n, uint64_t k, uint64_t *out)
{
	uint64_t *h = malloc(65536 * sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	unsigned w = size * 8 < 16 ? 16 : size * 8;
	uint64_t hi = 0;
	for (int shift = (int)w - 16; shift >= 0; shift -= 16) {
		memset(h, 0, 65536 * sizeof(*h));
		unsigned above = (unsigned)shift + 16;
		for (size_t i = 0; i < n; i++) {
			uint64_t d = dist(a, b, size, i);
			if (above < 64 && (d >> above) != hi)
				continue;
			h[(d >> shift) & 0xffff]++;
		}
		uint64_t digit = 0;
		while (digit < 65535 && k >= h[digit])
			k -= h[digit++];
		hi = hi << 16 | digit;
	}
	free(h);
	*out = hi;
	return 0;
}

static int compare(const uint8_t *a, const uint8_t *b, size_t bytes, ulp_tensor_diff *r)
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
	double sa = 0, sd = 0;
	uint64_t emask = ((uint64_t)1 << f.ebits) - 1;
	for (size_t i = 0; i < n; i++) {
		uint64_t x = bits_at(a, size, i), y = bits_at(b, size, i);
		double va = value(x, &f), vb = value(y, &f);
		sa += va * va;
		if (x != y) {
			r->changed++;
			double dv = vb - va;
			sd += dv * dv;
			uint64_t d = dist(a, b, size, i);
			if (d > r->max_ulps)
				r->max_ulps = d;
			r->exponent_moves += ((x >> f.mbits) & emask) != ((y >> f.mbits) & emask);
		}
	}
	r->frac_changed = n ? (double)r->changed / (double)n : 0;
	r->norm_a = sqrt(sa);
	r->norm_diff = sqrt(sd);
	r->rel_change = sa > 0 ? r->norm_diff / r->norm_a : sd > 0 ? NAN : 0;
	if (n && r->changed) {
		ULP_TRY(select_rank(a, b, size, n, (uint64_t)(n - 1) / 2, &r->median_ulps));
		ULP_TRY(select_rank(a, b, size, n, (uint64_t)floor(0.99 * (double)(n - 1)), &r->p99_ulps));
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
	ulp_db_follow(a); /* gen.c invariant 3 */
	char pa[ULP_PATH_MAX + 1], pb[ULP_PATH_MAX + 1];
	ULP_TRY(ulp_arch_path(a, path_a, pa, sizeof(pa)));
	ULP_TRY(ulp_arch_path(a, path_b, pb, sizeof(pb)));
	nlist la = {0}, lb = {0};
	ulp_file *fa = NULL, *fb = NULL;
	ulp_tensor_diff *res = NULL;
	size_t nr = 0;
	uint8_t *ba = NULL, *bb = NULL;
	int rc = ulp_file_open(a, pa, &fa);
	if (rc >= 0)
		rc = ulp_file_open(a, pb, &fb);
	if (rc >= 0 && (rc = ulp_index_file_named(a, pa, add_named, &la)) >= 0)
		rc = ulp_index_file_named(a, pb, add_named, &lb);
	if (rc == -ULP_E_NOMEM)
		rc = ulp_arch_err(a, rc, "%s: out of memory", pa);
	if (rc >= 0) {
		ulp_file_set_readahead(fa, 0);
		ulp_file_set_readahead(fb, 0);
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
		if ((rc = compare(ba, bb, (size_t)x->length, r)) < 0) {
			rc = ulp_arch_err(a, rc, "%s: out of memory for tensor %s", pa, x->name);
			break;
		}
	}
	if (rc >= 0 && !nr)
		rc = ulp_arch_err(a, -ULP_E_INVAL, "%s and %s: no tensor of the same name, dtype and size in both", pa, pb);
	free(ba);
	free(bb);
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
