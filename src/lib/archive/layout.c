/* SPDX-License-Identifier: MIT */
/*
 * layout.c - where each step of a series is coded: the target layout that
 * ingest writes, ulp_archive_rebase_pending restores after a newer step
 * arrives, and import writes directly (ulp_archive_expect).
 *
 * The steps of a series, in step order, are positions 0..n-1, cut into
 * segments of P = M + 1 positions (max_chain M): segment s holds positions
 * sP .. sP + M. With F = ceil(M / 2) and the key K = F - 1:
 *
 *   position i of segment s, e = min(sP + M, n - 1)   role
 *   i == e (the segment's last step, or the newest)   anchor
 *   s == 0, i == K < e                                 delta against e (the key: one long delta)
 *   s == 0, other i < e                                delta against i + 1 (backward: depth e - i
 *                                                      above the key, K - i + 1 below it)
 *   s >= 1, i < sP + F, i < e                          delta against i - 1 (forward from the
 *                                                      previous segment's anchor, depth i - sP + 1)
 *   s >= 1, sP + F <= i < e                            delta against i + 1 (backward, depth e - i)
 *
 *   . . . . . . . K . . . . . . . . A . . . . . . . . . . . . . . . . A . . N
 *   <- <- <- <- <- <- <-  <========= <- <- <- <- <- <- <-  -> -> -> ->  <- ...
 *   (M = 16: P = 17, F = 8, K = 7; segment 0 backward, its key straight onto
 *   its anchor, then 8 forward, 8 backward)
 *
 * Invariants:
 *  1. A chain holds at most F = ceil(M / 2) deltas, so a cold read of any
 *     step decodes at most that many deltas plus one anchor. (Segment 0 has
 *     no anchor before it: without the key its oldest step was e deep, up to
 *     M; the key splits it into two backward runs of at most F.)
 *  2. There are ceil(n / P) anchors, exactly as many as when every step is a
 *     forward delta and every (M + 1)-th step starts a new chain. Every delta
 *     is against an adjacent step but the key, against a step up to M - K
 *     away: the stored size is that of forward coding plus the key's longer
 *     delta (ulpack-format(5), "Layout": about 1.6 % of a 16-step run).
 *  3. A new newest step (position n) changes the roles of two other steps
 *     at most: the previous newest (n - 1), which while its segment is
 *     incomplete was the anchor and becomes a delta (against n - 2 in a
 *     forward part, n in a backward part; when n starts a new segment it
 *     stays the anchor), and in segment 0 the key, whose anchor is now n
 *     (ulp_layout_key names it). Every other reference stays. So an append
 *     costs at most two re-codings, done in the background (the rebase
 *     queue), the second only for the first M + 1 steps of a series.
 *  4. Reading the steps in order decodes each delta once: forward deltas
 *     need the step before, backward ones the step after (the key: the
 *     anchor), whose chain the first read of the backward part decodes and
 *     leaves in the cache (a reference nobody has read yet is kept warm,
 *     read.c).
 *  5. ulp_layout_order lists every reference before the steps coded
 *     against it, so an import in that order writes the final layout with
 *     no re-coding.
 */
#include "arch_int.h"
#include "store/path.h"
#include "store/index.h"
#include "archive/writer.h"
#include <stdio.h>
#include <stdlib.h>

typedef struct seg {
	size_t s0, e, f; /* first position, anchor, end of the forward part (exclusive) */
} seg;

static seg seg_of(size_t i, size_t n, unsigned max_chain)
{
	size_t P = (size_t)max_chain + 1, F = ((size_t)max_chain + 1) / 2;
	seg g;
	g.s0 = i - i % P;
	g.e = ULP_MIN(g.s0 + P - 1, n - 1);
	g.f = g.s0 == 0 ? 0 : ULP_MIN(g.s0 + F, g.e);
	return g;
}

/* Segment 0's key position (invariant 1), or SIZE_MAX where its segment
 * ends at or before it (then the plain backward run is short enough). */
static size_t key_of(size_t n, unsigned max_chain)
{
	size_t K = ((size_t)max_chain + 1) / 2 - (max_chain > 0);
	seg g = seg_of(0, n, max_chain);
	return max_chain > 0 && K < g.e ? K : SIZE_MAX;
}

ptrdiff_t ulp_layout_key(size_t n, unsigned max_chain)
{
	size_t K = n ? key_of(n, max_chain) : SIZE_MAX;
	return K == SIZE_MAX ? -1 : (ptrdiff_t)K;
}

ptrdiff_t ulp_layout_ref(size_t i, size_t n, unsigned max_chain)
{
	if (i + 1 >= n)
		return -1;
	seg g = seg_of(i, n, max_chain);
	if (i == g.e)
		return -1;
	if (g.s0 == 0 && i == key_of(n, max_chain))
		return (ptrdiff_t)g.e;
	return i < g.f ? (ptrdiff_t)i - 1 : (ptrdiff_t)i + 1;
}

unsigned ulp_layout_depth(size_t i, size_t n, unsigned max_chain)
{
	if (i + 1 >= n)
		return 0;
	seg g = seg_of(i, n, max_chain);
	if (i == g.e)
		return 0;
	if (g.s0 == 0) {
		size_t K = key_of(n, max_chain);
		return (unsigned)(K == SIZE_MAX || i > K ? g.e - i : K - i + 1);
	}
	return (unsigned)(i < g.f ? i - g.s0 + 1 : g.e - i);
}

size_t ulp_layout_order(size_t n, unsigned max_chain, size_t *order)
{
	size_t P = (size_t)max_chain + 1, k = 0;
	for (size_t s0 = 0; s0 < n; s0 += P) {
		seg g = seg_of(s0, n, max_chain);
		for (size_t i = s0; i < g.f; i++)
			order[k++] = i;
		order[k++] = g.e;
		for (size_t i = g.e; i-- > g.f;)
			order[k++] = i;
	}
	return k;
}

/* ---- the series of a file ------------------------------------------------- */

typedef struct sstep {
	int64_t step;
	int64_t id; /* -1: expected, not archived yet */
	char *path;
} sstep;

static int cmp_sstep(const void *x, const void *y)
{
	const sstep *p = x, *q = y;
	if (p->step != q->step)
		return p->step < q->step ? -1 : 1;
	return strcmp(p->path, q->path);
}

typedef struct svec {
	sstep *s;
	size_t n, cap;
	const char *skip; /* the file being placed: listed once */
} svec;

static int add_step(void *arg, int64_t id, int64_t step, const char *path)
{
	svec *v = arg;
	if (v->skip && strcmp(path, v->skip) == 0)
		return 0;
	for (size_t i = 0; i < v->n; i++)
		if (strcmp(v->s[i].path, path) == 0) { /* expected and archived: archived */
			v->s[i].id = id >= 0 ? id : v->s[i].id;
			return 0;
		}
	ULP_TRY(ulp_grow(&v->s, &v->cap, v->n, sizeof(*v->s)));
	if (!(v->s[v->n].path = strdup(path)))
		return -ULP_E_NOMEM;
	v->s[v->n].step = step;
	v->s[v->n++].id = id;
	return 0;
}

static void svec_free(svec *v)
{
	for (size_t i = 0; i < v->n; i++)
		free(v->s[i].path);
	free(v->s);
}

int ulp_layout_target(ulp_archive *a, const char *series, int64_t step, const char *path, int64_t *ref_id,
                      char *ref_path, size_t cap)
{
	svec v = {.skip = path};
	*ref_id = -1;
	if (cap)
		ref_path[0] = 0;
	int rc = ulp_index_series_steps(a, series, add_step, &v);
	pthread_mutex_lock(&a->w->mu);
	for (size_t i = 0; rc == 0 && i < a->w->n_expect; i++)
		if (strcmp(a->w->expect[i].series, series) == 0)
			rc = add_step(&v, -1, a->w->expect[i].step, a->w->expect[i].path);
	pthread_mutex_unlock(&a->w->mu);
	v.skip = NULL;
	if (rc == 0)
		rc = add_step(&v, -2, step, path); /* -2: the file itself */
	if (rc < 0) {
		svec_free(&v);
		return rc;
	}
	qsort(v.s, v.n, sizeof(*v.s), cmp_sstep);
	size_t me = 0;
	while (me < v.n && v.s[me].id != -2)
		me++;
	ptrdiff_t r = ulp_layout_ref(me, v.n, a->max_chain);
	/* a reference not archived yet (an expected step put out of its order):
	 * an anchor now, the queue re-codes it once its reference is there */
	if (r >= 0 && v.s[r].id >= 0) {
		*ref_id = v.s[r].id;
		if (cap)
			snprintf(ref_path, cap, "%s", v.s[r].path);
	}
	svec_free(&v);
	return 0;
}

/* ---- expected files (import) --------------------------------------------- */

void ulp_layout_forget_expected(ulp_archive *a)
{
	pthread_mutex_lock(&a->w->mu);
	for (size_t i = 0; i < a->w->n_expect; i++) {
		free(a->w->expect[i].series);
		free(a->w->expect[i].path);
	}
	free(a->w->expect);
	a->w->expect = NULL;
	a->w->n_expect = 0;
	pthread_mutex_unlock(&a->w->mu);
}

typedef struct xref {
	size_t k;    /* index into the caller's paths */
	int64_t step;
	const char *path;
	char *series;
} xref;

static int cmp_xref(const void *x, const void *y)
{
	const xref *p = x, *q = y;
	int c = strcmp(p->series, q->series);
	if (c)
		return c;
	if (p->step != q->step)
		return p->step < q->step ? -1 : 1;
	return strcmp(p->path, q->path);
}

int ulp_archive_expect(ulp_archive *a, const char *const *paths, size_t n, uint32_t *rank)
{
	ulp_layout_forget_expected(a);
	xref *x = n ? calloc(n, sizeof(*x)) : NULL;
	size_t m = 0;
	int rc = n && !x ? -ULP_E_NOMEM : 0;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		char p[4096], *series = NULL;
		rank[i] = 0;
		if (ulp_path_clean(paths[i], p, sizeof(p)) < 0)
			continue;
		int64_t s = ulp_parse_step(p, &series);
		if (!series)
			continue;
		x[m] = (xref){i, s, paths[i], series};
		m++;
	}
	if (rc == 0)
		qsort(x, m, sizeof(*x), cmp_xref);
	/* each series: the archived steps and the expected ones, in the order
	 * that puts every reference before the steps coded against it */
	ulp_expected *e = rc == 0 && m ? calloc(m, sizeof(*e)) : NULL;
	if (rc == 0 && m && !e)
		rc = -ULP_E_NOMEM;
	for (size_t i = 0; rc == 0 && i < m; i++) {
		e[i].step = x[i].step;
		e[i].series = strdup(x[i].series);
		char p[4096];
		ulp_path_clean(x[i].path, p, sizeof(p));
		e[i].path = strdup(p);
		if (!e[i].series || !e[i].path)
			rc = -ULP_E_NOMEM;
	}
	for (size_t i0 = 0; rc == 0 && i0 < m;) {
		size_t i1 = i0;
		while (i1 < m && strcmp(x[i1].series, x[i0].series) == 0)
			i1++;
		svec v = {0};
		rc = ulp_index_series_steps(a, x[i0].series, add_step, &v);
		for (size_t i = i0; rc == 0 && i < i1; i++)
			rc = add_step(&v, -1 - (int64_t)(i - i0), e[i].step, e[i].path);
		size_t *order = rc == 0 ? malloc((v.n ? v.n : 1) * sizeof(*order)) : NULL;
		if (rc == 0 && !order)
			rc = -ULP_E_NOMEM;
		if (rc == 0) {
			qsort(v.s, v.n, sizeof(*v.s), cmp_sstep);
			size_t k = ulp_layout_order(v.n, a->max_chain, order);
			for (size_t r = 0; r < k; r++) {
				sstep *s = &v.s[order[r]];
				if (s->id <= -1) /* expected: -1 - its index in the series' run */
					rank[x[i0 + (size_t)(-1 - s->id)].k] = (uint32_t)r;
			}
		}
		free(order);
		svec_free(&v);
		i0 = i1;
	}
	if (rc == 0) {
		pthread_mutex_lock(&a->w->mu);
		a->w->expect = e;
		a->w->n_expect = m;
		pthread_mutex_unlock(&a->w->mu);
		e = NULL;
	}
	for (size_t i = 0; e && i < m; i++) {
		free(e[i].series);
		free(e[i].path);
	}
	free(e);
	for (size_t i = 0; i < m; i++)
		free(x[i].series);
	free(x);
	return rc;
}
