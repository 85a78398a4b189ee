/* SPDX-License-Identifier: MIT */
/*
 * dynamics.c - a run's training dynamics from its index alone (`ulpack
 * dynamics`, ulpack(1) DYNAMICS): per step and per tensor, the stored bits
 * per weight of the tensor's blob, its role and chain, and the size of the
 * update from the step before; summed per layer and per step; the step whose
 * update stands out most from its neighbours'. Reads one query of the index
 * (ulp_index_run_tensors); decodes nothing; owns no state beyond the
 * ulp_dynamics it returns.
 *
 * Definitions:
 *  - A tensor is a (series, name) pair: the same tensor of the same file at
 *    every step. Its elements are its bytes over its dtype's size (at its
 *    first step).
 *  - The update of a tensor at step i is what the index holds of the change
 *    from step i-1: the stored bytes of the delta that links the two steps,
 *    whichever direction the layout coded it (layout.c: forward deltas are
 *    against the step before, backward ones against the step after), 0 when
 *    both steps hold the same blob. Where neither is a delta against the
 *    other but the file's other tensors link the two steps in one direction,
 *    the tensor's blob at the step that direction makes the delta is an
 *    anchor because the delta was no smaller (ingest keeps the smallest
 *    coding): its bits are the update's lower bound (update_bound). Else
 *    unknown (NaN).
 *  - A layer is ulp_dynamics_layer of the tensor's name; a layer's or a
 *    step's figure is the sum of its tensors' bits over the sum of their
 *    elements. Its update is defined only where every tensor it has at both
 *    steps has an update figure (a partial sum would mislead).
 *  - Excess bits: a figure less the median of the same figure at the
 *    JUMP_WINDOW steps each side (itself left out; at least two of them
 *    known). The jump is the step of the largest excess of the step update;
 *    its layers are the layer of the largest excess at that step and the
 *    layers next to it in layer order with at least half its excess.
 *
 * Invariants:
 *  1. A blob is counted once per step that uses it, but a step that uses the
 *     same blob as the step before counts 0 bytes for it (role SAME): the
 *     archive stored it once.
 *  2. Every matrix is n_steps x (n_tensors or n_layers), row-major by step;
 *     every cell is written (ABSENT, zeros, NaN update where no tensor).
 *  3. One query of the index, one pass over its rows, then passes over the
 *     matrices: time and memory linear in steps x tensors.
 */
#include "arch_int.h"
#include "store/path.h"
#include "store/index.h"
#include "store/shared.h"
#include "archive/diff.h"
#include <fnmatch.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define JUMP_WINDOW ULP_DYN_WINDOW

/* ---- layers ------------------------------------------------------------------ */

size_t ulp_dynamics_layer(const char *name, char *dst, size_t cap)
{
	size_t n = strlen(name), end = n, last_dot = n;
	int found = 0;
	for (size_t s = 0; s < n && !found;) {
		size_t e = s;
		while (e < n && name[e] != '.')
			e++;
		int digits = e > s;
		for (size_t k = s; k < e && digits; k++)
			digits = name[k] >= '0' && name[k] <= '9';
		if (digits && s > 0) { /* a leading number is no layer index */
			end = e;
			found = 1;
		}
		if (e < n)
			last_dot = e;
		s = e + 1;
	}
	if (!found)
		end = last_dot < n ? last_dot : n;
	if (cap) {
		size_t c = end < cap ? end : cap - 1;
		memcpy(dst, name, c);
		dst[c] = 0;
	}
	return end;
}

/* ---- the pass over the index's rows -------------------------------------------- */

typedef struct trow {
	int64_t step;          /* the step itself, then (build) its index */
	uint32_t tensor;       /* index */
	uint32_t path;         /* into dctx paths */
	int has_ref;
	int64_t blob;
	uint64_t content64, ref64;
	uint64_t stored;
	unsigned depth;
	int codec;
} trow;

typedef struct tkey {
	char *series, *name;
	uint64_t hash;
	int dtype;
	uint64_t elements;
} tkey;

typedef struct dctx {
	ulp_archive *a;
	const char *glob;
	size_t run_len;        /* bytes of run and its '/' to strip from series */
	trow *rows;
	size_t n_rows, cap_rows;
	int64_t *steps;
	size_t n_steps, cap_steps;
	tkey *keys;
	size_t n_keys, cap_keys;
	char **paths;          /* the files' paths, each file's once (its rows come together) */
	size_t n_paths, cap_paths;
	size_t *slots;         /* hash table of keys: index + 1, 0 empty */
	size_t n_slots;        /* a power of two, > 2 n_keys */
	int rc;
} dctx;

static uint64_t hash_str(uint64_t h, const char *s)
{
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
	return h;
}

static int rehash(dctx *c)
{
	size_t n = c->n_slots ? c->n_slots * 2 : 256;
	size_t *sl = calloc(n, sizeof(*sl));
	if (!sl)
		return -ULP_E_NOMEM;
	for (size_t i = 0; i < c->n_keys; i++) {
		size_t j = (size_t)c->keys[i].hash & (n - 1);
		while (sl[j])
			j = (j + 1) & (n - 1);
		sl[j] = i + 1;
	}
	free(c->slots);
	c->slots = sl;
	c->n_slots = n;
	return 0;
}

/* The index of tensor (series, name), added if new; negative on error. */
static int64_t key_of(dctx *c, const ulp_tensorrow *r)
{
	const char *ser = strlen(r->series) >= c->run_len ? r->series + c->run_len : r->series;
	uint64_t h = hash_str(hash_str(0xcbf29ce484222325ull, ser) * 31, r->name);
	if (c->n_slots) {
		for (size_t j = (size_t)h & (c->n_slots - 1); c->slots[j]; j = (j + 1) & (c->n_slots - 1)) {
			tkey *k = &c->keys[c->slots[j] - 1];
			if (k->hash == h && !strcmp(k->name, r->name) && !strcmp(k->series, ser))
				return (int64_t)(c->slots[j] - 1);
		}
	}
	if (2 * (c->n_keys + 1) >= c->n_slots && rehash(c) < 0)
		return -ULP_E_NOMEM;
	if (ulp_grow(&c->keys, &c->cap_keys, c->n_keys, sizeof(*c->keys)) < 0)
		return -ULP_E_NOMEM;
	tkey *k = &c->keys[c->n_keys];
	k->series = strdup(ser);
	k->name = strdup(r->name);
	if (!k->series || !k->name) {
		free(k->series);
		free(k->name);
		return -ULP_E_NOMEM;
	}
	k->hash = h;
	k->dtype = r->dtype;
	k->elements = r->length / ulp_dtype_size((ulp_dtype)r->dtype);
	size_t j = (size_t)h & (c->n_slots - 1);
	while (c->slots[j])
		j = (j + 1) & (c->n_slots - 1);
	c->slots[j] = ++c->n_keys;
	return (int64_t)(c->n_keys - 1);
}

static int row_cb(void *arg, const ulp_tensorrow *r)
{
	dctx *c = arg;
	if (c->glob && fnmatch(c->glob, r->name, 0) != 0)
		return 0;
	/* a file's rows come together: a step is new only at a new file */
	if (!c->n_steps || c->steps[c->n_steps - 1] != r->step) {
		if (ulp_grow(&c->steps, &c->cap_steps, c->n_steps, sizeof(*c->steps)) < 0)
			return c->rc = -ULP_E_NOMEM;
		c->steps[c->n_steps++] = r->step;
	}
	if (!c->n_paths || strcmp(c->paths[c->n_paths - 1], r->path)) {
		if (ulp_grow(&c->paths, &c->cap_paths, c->n_paths, sizeof(*c->paths)) < 0 ||
		    !(c->paths[c->n_paths] = strdup(r->path)))
			return c->rc = -ULP_E_NOMEM;
		c->n_paths++;
	}
	int64_t t = key_of(c, r);
	if (t < 0)
		return c->rc = (int)t;
	if (ulp_grow(&c->rows, &c->cap_rows, c->n_rows, sizeof(*c->rows)) < 0)
		return c->rc = -ULP_E_NOMEM;
	c->rows[c->n_rows++] = (trow){r->step, (uint32_t)t, (uint32_t)(c->n_paths - 1), r->has_ref, r->blob,
	                              r->content64, r->ref64, r->stored, r->depth, r->codec};
	return 0;
}

/* ---- figures -------------------------------------------------------------------- */

static int name_cmp_p(const void *x, const void *y)
{
	return ulp_name_cmp(*(char *const *)x, *(char *const *)y);
}

static int i64_cmp(const void *x, const void *y)
{
	int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
	return a < b ? -1 : a > b;
}

static int dbl_cmp(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return a < b ? -1 : a > b;
}

/* The median of the finite v[k * stride] for k within JUMP_WINDOW of i,
 * i excluded, over n; NaN when fewer than two. */
static double window_median(const double *v, size_t n, size_t stride, size_t i)
{
	double w[2 * JUMP_WINDOW];
	size_t m = 0, lo = i > JUMP_WINDOW ? i - JUMP_WINDOW : 0, hi = ULP_MIN(n, i + JUMP_WINDOW + 1);
	for (size_t k = lo; k < hi; k++)
		if (k != i && isfinite(v[k * stride]))
			w[m++] = v[k * stride];
	if (m < 2)
		return NAN;
	qsort(w, m, sizeof(*w), dbl_cmp);
	return m % 2 ? w[m / 2] : (w[m / 2 - 1] + w[m / 2]) / 2;
}

/* v[i * stride] less its neighbours' median; NaN where there is none. */
static double excess_at(const double *v, size_t n, size_t stride, size_t i)
{
	double med = window_median(v, n, stride, i), x = v[i * stride];
	return isfinite(x) && isfinite(med) ? x - med : NAN;
}

/* Sets d->jump and has_jump where there is one; NOMEM. */
static int find_jump(ulp_dynamics *d)
{
	size_t best = SIZE_MAX;
	for (size_t i = 0; i < d->n_steps; i++)
		if (isfinite(d->step_excess[i]) && (best == SIZE_MAX || d->step_excess[i] > d->step_excess[best]))
			best = i;
	if (best == SIZE_MAX)
		return 0;
	ulp_dyn_jump *j = &d->jump;
	memset(j, 0, sizeof(*j));
	j->step_index = best;
	j->step = d->steps[best];
	j->excess_bits = d->step_excess[best];
	j->ratio = exp2(j->excess_bits);
	j->update_bits = d->step_update[best];
	j->median_bits = window_median(d->step_update, d->n_steps, 1, best);
	size_t L = d->n_layers, top = SIZE_MAX;
	const double *lx = d->layer_excess + best * L;
	for (size_t l = 0; l < L; l++)
		if (isfinite(lx[l]) && (top == SIZE_MAX || lx[l] > lx[top]))
			top = l;
	if (top == SIZE_MAX)
		return 0;
	j->layer_first = j->layer_last = top;
	j->layer_excess = lx[top];
	while (j->layer_first > 0 && isfinite(lx[j->layer_first - 1]) && lx[j->layer_first - 1] >= lx[top] / 2)
		j->layer_first--;
	while (j->layer_last + 1 < L && isfinite(lx[j->layer_last + 1]) && lx[j->layer_last + 1] >= lx[top] / 2)
		j->layer_last++;
	/* the top tensor: its update against its own neighbours' */
	size_t T = d->n_tensors, tt = SIZE_MAX;
	double *col = malloc(d->n_steps * sizeof(*col));
	if (!col)
		return -ULP_E_NOMEM;
	j->tensor_excess = NAN;
	for (size_t t = 0; t < T; t++) {
		for (size_t s = 0; s < d->n_steps; s++)
			col[s] = d->cells[s * T + t].update_bits;
		double x = excess_at(col, d->n_steps, 1, best);
		if (isfinite(x) && (tt == SIZE_MAX || x > j->tensor_excess)) {
			tt = t;
			j->tensor_excess = x;
		}
	}
	free(col);
	j->top_tensor = tt == SIZE_MAX ? 0 : tt;
	d->has_jump = 1;
	return 0;
}

void ulp_dynamics_free(ulp_dynamics *d)
{
	if (!d)
		return;
	for (size_t t = 0; d->tensors && t < d->n_tensors; t++)
		free(d->tensors[t]);
	for (size_t t = 0; d->tensor_files && t < d->n_tensors; t++)
		free(d->tensor_files[t]);
	for (size_t l = 0; d->layers && l < d->n_layers; l++)
		free(d->layers[l]);
	free(d->run);
	free(d->steps);
	free(d->tensors);
	free(d->tensor_files);
	free(d->tensor_dtypes);
	free(d->tensor_elements);
	free(d->tensor_layer);
	free(d->layers);
	free(d->cells);
	free(d->layer_bits);
	free(d->layer_update);
	free(d->layer_excess);
	free(d->step_excess);
	free(d->step_bits);
	free(d->step_update);
	free(d->step_stored);
	for (size_t i = 0; d->file_paths && i < d->n_steps * d->n_files; i++)
		free(d->file_paths[i]);
	free(d->file_paths);
	free(d->tensor_file_index);
	if (d->norms)
		for (size_t i = 0; i < d->n_steps * d->n_tensors; i++)
			free(d->norms[i].name);
	free(d->norms);
	free(d->layer_rel_change);
	free(d->step_rel_change);
	free(d->layer_frac_changed);
	free(d->step_frac_changed);
	free(d);
}

/* Builds d from the rows in c (whose keys and steps it takes over). */
static int build(dctx *c, ulp_dynamics *d)
{
	/* the steps, distinct and in order; each row's step by its index */
	qsort(c->steps, c->n_steps, sizeof(*c->steps), i64_cmp);
	size_t ns = 0;
	for (size_t i = 0; i < c->n_steps; i++)
		if (!ns || c->steps[ns - 1] != c->steps[i])
			c->steps[ns++] = c->steps[i];
	c->n_steps = ns;
	for (size_t k = 0; k < c->n_rows; k++) {
		const int64_t *p = bsearch(&c->rows[k].step, c->steps, ns, sizeof(*c->steps), i64_cmp);
		c->rows[k].step = p ? p - c->steps : 0;
	}
	size_t S = c->n_steps, T = c->n_keys;
	d->n_steps = S;
	d->n_tensors = T;
	d->steps = c->steps;
	c->steps = NULL;
	d->tensors = calloc(T, sizeof(char *));
	d->tensor_files = calloc(T, sizeof(char *));
	d->tensor_dtypes = calloc(T, sizeof(int));
	d->tensor_elements = calloc(T, sizeof(uint64_t));
	d->tensor_layer = calloc(T, sizeof(size_t));
	d->cells = calloc(S * T, sizeof(ulp_dyn_cell));
	d->step_bits = calloc(S, sizeof(double));
	d->step_update = calloc(S, sizeof(double));
	d->step_stored = calloc(S, sizeof(uint64_t));
	int64_t *blobs = calloc(S * T, sizeof(int64_t));
	uint64_t *cont = calloc(S * T, sizeof(uint64_t)), *refs = calloc(S * T, sizeof(uint64_t));
	uint8_t *hasref = calloc(S * T, 1);
	char **lnames = calloc(T, sizeof(char *));
	int rc = 0;
	if (!d->tensors || !d->tensor_files || !d->tensor_dtypes || !d->tensor_elements || !d->tensor_layer ||
	    !d->cells || !d->step_bits || !d->step_update || !d->step_stored || !blobs || !cont ||
	    !refs || !hasref || !lnames)
		rc = -ULP_E_NOMEM;
	/* tensors, and their layers (distinct, sorted) */
	size_t L = 0;
	for (size_t t = 0; rc == 0 && t < T; t++) {
		d->tensors[t] = c->keys[t].name;
		d->tensor_files[t] = c->keys[t].series;
		c->keys[t].name = c->keys[t].series = NULL;
		d->tensor_dtypes[t] = c->keys[t].dtype;
		d->tensor_elements[t] = c->keys[t].elements;
		size_t n = ulp_dynamics_layer(d->tensors[t], NULL, 0);
		if (!(lnames[L] = malloc(n + 1))) {
			rc = -ULP_E_NOMEM;
			break;
		}
		ulp_dynamics_layer(d->tensors[t], lnames[L], n + 1);
		L++;
	}
	if (rc == 0 && L) {
		qsort(lnames, L, sizeof(*lnames), name_cmp_p);
		size_t u = 0;
		for (size_t i = 0; i < L; i++) {
			if (u && !strcmp(lnames[u - 1], lnames[i]))
				free(lnames[i]);
			else
				lnames[u++] = lnames[i];
		}
		L = u;
	}
	d->layers = lnames;
	d->n_layers = L;
	lnames = NULL;
	for (size_t t = 0; rc == 0 && t < T; t++) {
		char buf[ULP_PATH_MAX + 1];
		ulp_dynamics_layer(d->tensors[t], buf, sizeof(buf));
		char *key = buf, **hit = bsearch(&key, d->layers, L, sizeof(char *), name_cmp_p);
		d->tensor_layer[t] = hit ? (size_t)(hit - d->layers) : 0;
	}
	/* the files: distinct series, in the order met; each one's path at each step */
	d->tensor_file_index = calloc(T ? T : 1, sizeof(size_t));
	size_t F = 0;
	for (size_t t = 0; rc == 0 && d->tensor_file_index && t < T; t++) {
		size_t q = 0;
		while (q < t && strcmp(d->tensor_files[q], d->tensor_files[t]))
			q++;
		d->tensor_file_index[t] = q < t ? d->tensor_file_index[q] : F++;
	}
	d->n_files = F;
	d->file_paths = calloc(S * F + 1, sizeof(char *));
	if (rc == 0 && (!d->tensor_file_index || !d->file_paths))
		rc = -ULP_E_NOMEM;
	for (size_t k = 0; rc == 0 && k < c->n_rows; k++) {
		char **slot = &d->file_paths[(size_t)c->rows[k].step * F + d->tensor_file_index[c->rows[k].tensor]];
		if (!*slot && !(*slot = strdup(c->paths[c->rows[k].path])))
			rc = -ULP_E_NOMEM;
	}
	d->layer_bits = calloc(S * (L ? L : 1), sizeof(double));
	d->layer_update = calloc(S * (L ? L : 1), sizeof(double));
	d->layer_excess = calloc(S * (L ? L : 1), sizeof(double));
	d->step_excess = calloc(S, sizeof(double));
	if (rc == 0 && (!d->layer_bits || !d->layer_update || !d->layer_excess || !d->step_excess))
		rc = -ULP_E_NOMEM;
	if (rc < 0)
		goto out;

	/* the cells: what each row says */
	for (size_t i = 0; i < S * T; i++) {
		d->cells[i].role = ULP_DYN_ABSENT;
		d->cells[i].codec = -1;
		d->cells[i].ref_step = -1;
		d->cells[i].update_bits = NAN;
	}
	for (size_t k = 0; k < c->n_rows; k++) {
		const trow *r = &c->rows[k];
		size_t i = (size_t)r->step * T + r->tensor;
		ulp_dyn_cell *x = &d->cells[i];
		if (x->role != ULP_DYN_ABSENT)
			continue; /* the same (series, name) twice in one step: two paths of one series */
		x->role = r->has_ref ? ULP_DYN_DELTA : ULP_DYN_ANCHOR;
		x->codec = r->codec;
		x->stored_bytes = r->stored;
		x->chain_depth = r->depth;
		blobs[i] = r->blob;
		cont[i] = r->content64;
		refs[i] = r->ref64;
		hasref[i] = (uint8_t)r->has_ref;
	}
	/* ref steps: the neighbour holding the reference, else any step of the
	 * same tensor (a delta over several steps: segment 0's key) */
	for (size_t t = 0; t < T; t++) {
		for (size_t s = 0; s < S; s++) {
			size_t i = s * T + t;
			ulp_dyn_cell *x = &d->cells[i];
			if (x->role == ULP_DYN_DELTA) {
				if (s > 0 && d->cells[i - T].role != ULP_DYN_ABSENT && cont[i - T] == refs[i])
					x->ref_step = d->steps[s - 1];
				else if (s + 1 < S && d->cells[i + T].role != ULP_DYN_ABSENT && cont[i + T] == refs[i])
					x->ref_step = d->steps[s + 1];
				else
					for (size_t q = 0; q < S && x->ref_step < 0; q++)
						if (d->cells[q * T + t].role != ULP_DYN_ABSENT && cont[q * T + t] == refs[i])
							x->ref_step = d->steps[q];
			}
		}
	}
	/* SAME (invariant 1) and the updates */
	/* orig: the stored bytes before SAME; fwd, bwd: links per file at a step */
	uint64_t *orig = malloc(S * T * sizeof(*orig));
	const size_t *sid = d->tensor_file_index;
	size_t *fwd = calloc(F + 1, sizeof(*fwd)), *bwd = calloc(F + 1, sizeof(*bwd));
	if (!orig || !fwd || !bwd) {
		free(orig), free(fwd), free(bwd);
		rc = -ULP_E_NOMEM;
		goto out;
	}
	for (size_t i = 0; i < S * T; i++)
		orig[i] = d->cells[i].stored_bytes;
	for (size_t s = 0; s < S; s++) {
		for (size_t t = 0; t < T; t++) {
			size_t i = s * T + t;
			ulp_dyn_cell *x = &d->cells[i];
			if (x->role == ULP_DYN_ABSENT || s == 0 || d->cells[i - T].role == ULP_DYN_ABSENT)
				continue;
			uint64_t bytes;
			if (blobs[i] == blobs[i - T]) {
				x->role = ULP_DYN_SAME;
				x->stored_bytes = 0;
				x->ref_step = -1;
				bytes = 0;
			} else if (hasref[i] && refs[i] == cont[i - T]) {
				bytes = orig[i];
				fwd[sid[t]]++;
			} else if (hasref[i - T] && refs[i - T] == cont[i]) {
				bytes = orig[i - T];
				bwd[sid[t]]++;
			} else {
				continue;
			}
			x->update_bits = d->tensor_elements[t] ? 8.0 * (double)bytes / (double)d->tensor_elements[t] : 0;
		}
		/* the bounds: an anchor where the file's direction wants a delta */
		for (size_t t = 0; t < T; t++) {
			size_t i = s * T + t;
			ulp_dyn_cell *x = &d->cells[i];
			if (x->role == ULP_DYN_ABSENT || s == 0 || d->cells[i - T].role == ULP_DYN_ABSENT ||
			    isfinite(x->update_bits))
				continue;
			size_t k = sid[t], at;
			if (fwd[k] > bwd[k] && !hasref[i])
				at = i;
			else if (bwd[k] > fwd[k] && !hasref[i - T])
				at = i - T;
			else
				continue;
			x->update_bits = d->tensor_elements[t] ? 8.0 * (double)orig[at] / (double)d->tensor_elements[t] : 0;
			x->update_bound = 1;
		}
		memset(fwd, 0, F * sizeof(*fwd));
		memset(bwd, 0, F * sizeof(*bwd));
	}
	free(orig);
	free(fwd);
	free(bwd);
	/* per-weight figures, and their sums per layer and per step */
	double *lw = calloc(L ? L : 1, sizeof(double)), *lb = calloc(L ? L : 1, sizeof(double)),
	       *uw = calloc(L ? L : 1, sizeof(double)), *ub = calloc(L ? L : 1, sizeof(double));
	if (!lw || !lb || !uw || !ub) {
		free(lw), free(lb), free(uw), free(ub);
		rc = -ULP_E_NOMEM;
		goto out;
	}
	for (size_t s = 0; s < S; s++) {
		memset(lw, 0, L * sizeof(double));
		memset(lb, 0, L * sizeof(double));
		memset(uw, 0, L * sizeof(double));
		memset(ub, 0, L * sizeof(double));
		double sw = 0, sb = 0, suw = 0, sub = 0;
		int smiss = 0;
		for (size_t t = 0; t < T; t++) {
			ulp_dyn_cell *x = &d->cells[s * T + t];
			if (x->role == ULP_DYN_ABSENT)
				continue;
			double e = (double)d->tensor_elements[t], bits = 8.0 * (double)x->stored_bytes;
			size_t l = d->tensor_layer[t];
			x->bits_per_weight = e > 0 ? bits / e : 0;
			d->step_stored[s] += x->stored_bytes;
			lw[l] += e;
			lb[l] += bits;
			sw += e;
			sb += bits;
			if (isfinite(x->update_bits)) {
				uw[l] += e;
				ub[l] += x->update_bits * e;
				suw += e;
				sub += x->update_bits * e;
			} else if (s > 0 && d->cells[(s - 1) * T + t].role != ULP_DYN_ABSENT) {
				uw[l] = -INFINITY; /* a tensor of both steps without a figure */
				smiss = 1;
			}
		}
		for (size_t l = 0; l < L; l++) {
			d->layer_bits[s * L + l] = lw[l] > 0 ? lb[l] / lw[l] : 0;
			d->layer_update[s * L + l] = uw[l] > 0 ? ub[l] / uw[l] : NAN;
		}
		d->step_bits[s] = sw > 0 ? sb / sw : 0;
		d->step_update[s] = suw > 0 && !smiss ? sub / suw : NAN;
	}
	free(lw), free(lb), free(uw), free(ub);
	for (size_t s = 0; s < S; s++) {
		for (size_t l = 0; l < L; l++)
			d->layer_excess[s * L + l] = excess_at(d->layer_update + l, S, L, s);
		d->step_excess[s] = excess_at(d->step_update, S, 1, s);
	}
	rc = find_jump(d);
out:
	if (lnames) {
		for (size_t i = 0; i < L; i++)
			free(lnames[i]);
		free(lnames);
	}
	free(blobs);
	free(cont);
	free(refs);
	free(hasref);
	return rc;
}

int ulp_archive_dynamics(ulp_archive *a, const char *run, const char *glob, ulp_dynamics **out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	char p[ULP_PATH_MAX + 1];
	ULP_TRY(ulp_arch_path(a, run ? run : "", p, sizeof(p)));
	ulp_stat st;
	ULP_TRY(ulp_archive_stat(a, p, &st));
	if (!st.is_dir)
		return ulp_arch_err(a, -ULP_E_NOTDIR, "%s: not a directory (a run is one)", p);
	for (const char *c = p; *c;) { /* steps.c's rule: no step directory, nor in one */
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);
		char comp[ULP_NAME_MAX + 1];
		snprintf(comp, sizeof(comp), "%.*s", (int)ULP_MIN(l, ULP_NAME_MAX), c);
		if (ulp_name_step(comp) >= 0)
			return ulp_arch_err(a, -ULP_E_NOENT, "%s: %s step directory, not a run directory", p, e ? "in a" : "a");
		c = e ? e + 1 : c + l;
	}
	dctx c = {.a = a, .glob = glob, .run_len = p[0] ? strlen(p) + 1 : 0};
	int rc = ulp_index_run_tensors(a, p, row_cb, &c);
	if (rc >= 0 && c.rc < 0)
		rc = ulp_arch_err(a, c.rc, "%s: out of memory", p);
	if (rc >= 0 && !c.n_rows)
		rc = ulp_arch_err(a, -ULP_E_NOENT, "%s: no tensor of a file with a step%s%s", p[0] ? p : "''",
		                  glob ? " matches " : "", glob ? glob : "");
	ulp_dynamics *d = NULL;
	if (rc >= 0 && (!(d = calloc(1, sizeof(*d))) || !(d->run = strdup(p))))
		rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", p);
	if (rc >= 0 && (rc = build(&c, d)) < 0)
		rc = ulp_arch_err(a, rc, "%s: out of memory", p);
	for (size_t i = 0; i < c.n_keys; i++) {
		free(c.keys[i].name);
		free(c.keys[i].series);
	}
	free(c.keys);
	for (size_t i = 0; i < c.n_paths; i++)
		free(c.paths[i]);
	free(c.paths);
	free(c.slots);
	free(c.rows);
	free(c.steps);
	if (rc < 0) {
		ulp_dynamics_free(d);
		return rc;
	}
	*out = d;
	return 0;
}

/* ---- decoded figures ---------------------------------------------------------- */

/* One file's tensors at one step: the view's tensor indices (ascending),
 * with their dtype, length and content identity (from the index). */
typedef struct fstep {
	size_t n, cap;
	struct ften {
		size_t t;
		int dtype;
		uint64_t length;
		uint8_t content[ULP_SHA256_LEN];
	} *v;
} fstep;

/* A tensor of the view by its name, within its file. */
typedef struct tname {
	const char *name;
	size_t t;
} tname;

typedef struct fnames {
	const tname *by_name;  /* the file's tensors, by name */
	size_t n;
	fstep *out;
	int rc;
} fnames;

static int tname_cmp(const void *x, const void *y)
{
	return strcmp(((const tname *)x)->name, ((const tname *)y)->name);
}

static int fstep_add(void *arg, const char *name, int dtype, uint64_t offset, uint64_t length,
                     const uint8_t content[ULP_SHA256_LEN])
{
	(void)offset;
	fnames *c = arg;
	tname key = {name, 0};
	const tname *hit = c->n ? bsearch(&key, c->by_name, c->n, sizeof(*c->by_name), tname_cmp) : NULL;
	if (!hit) /* left out by the glob */
		return 0;
	fstep *f = c->out;
	if (ulp_grow(&f->v, &f->cap, f->n, sizeof(*f->v)) < 0)
		return c->rc = -ULP_E_NOMEM;
	f->v[f->n].t = hit->t;
	f->v[f->n].dtype = dtype;
	f->v[f->n].length = length;
	memcpy(f->v[f->n].content, content, ULP_SHA256_LEN);
	f->n++;
	return 0;
}

static int ften_cmp(const void *x, const void *y)
{
	size_t a = ((const struct ften *)x)->t, b = ((const struct ften *)y)->t;
	return a < b ? -1 : a > b;
}

/* Per step, in step order, each file's tensors against the same file at
 * the step before: the pairs of one step (every file) go to ulp_diff_pairs
 * at once, which reads each content through the decode cache a chunk pair
 * at a time (diff.c). Walking in step order decodes each delta once: the
 * step before is still in the cache, the chain of a backward part is
 * decoded at its first read (layout.c invariant 4). Memory: two steps'
 * lists of content identities and the chunk pairs in flight. */
int ulp_dynamics_norms(ulp_archive *a, ulp_dynamics *d, ulp_progress_fn progress, void *arg)
{
	size_t S = d->n_steps, T = d->n_tensors, L = d->n_layers, F = d->n_files;
	if (!d->norms) {
		d->norms = calloc(S * T + 1, sizeof(*d->norms));
		d->layer_rel_change = calloc(S * L + 1, sizeof(double));
		d->step_rel_change = calloc(S, sizeof(double));
		d->layer_frac_changed = calloc(S * L + 1, sizeof(double));
		d->step_frac_changed = calloc(S, sizeof(double));
		if (!d->norms || !d->layer_rel_change || !d->step_rel_change || !d->layer_frac_changed ||
		    !d->step_frac_changed)
			return ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", d->run);
	}
	ulp_gen_follow(a); /* gen.c invariant 3 */
	double *la = calloc(2 * L + 1, sizeof(double)), *ld = la ? la + L : NULL;
	uint64_t *le = calloc(2 * L + 1, sizeof(uint64_t)), *lc = le ? le + L : NULL;
	tname *by_name = malloc((T + 1) * sizeof(*by_name));
	size_t *first = calloc(F + 1, sizeof(*first));
	fstep *fs = calloc(2 * F + 1, sizeof(*fs)); /* [step parity][file] */
	ulp_pair *pv = calloc(T + 1, sizeof(*pv));
	int rc = 0;
	if (!la || !le || !by_name || !first || !fs || !pv)
		rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", d->run);
	/* each file's tensors by name: by_name[first[f] ..] */
	size_t *count = NULL;
	if (rc == 0 && !(count = calloc(F + 1, sizeof(*count))))
		rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", d->run);
	for (size_t t = 0; rc == 0 && t < T; t++)
		count[d->tensor_file_index[t]]++;
	for (size_t f = 0, o = 0; rc == 0 && f < F; o += count[f], f++)
		first[f] = o;
	for (size_t f = 0; rc == 0 && f < F; f++)
		count[f] = 0;
	for (size_t t = 0; rc == 0 && t < T; t++) {
		size_t f = d->tensor_file_index[t];
		by_name[first[f] + count[f]++] = (tname){d->tensors[t], t};
	}
	for (size_t f = 0; rc == 0 && f < F; f++)
		qsort(by_name + first[f], count[f], sizeof(*by_name), tname_cmp);
	for (size_t s = 0; s < S && rc == 0; s++) {
		fstep *cur = fs + (s % 2) * F, *prev = fs + ((s + 1) % 2) * F;
		size_t np = 0;
		for (size_t f = 0; f < F && rc == 0; f++) {
			cur[f].n = 0;
			const char *pb = d->file_paths[s * F + f];
			if (!pb)
				continue;
			fnames c = {by_name + first[f], count[f], &cur[f], 0};
			rc = ulp_index_file_named(a, pb, fstep_add, &c);
			if (rc >= 0 && c.rc < 0)
				rc = ulp_arch_err(a, c.rc, "%s: out of memory", pb);
			if (rc < 0)
				break;
			qsort(cur[f].v, cur[f].n, sizeof(*cur[f].v), ften_cmp);
			if (!s || !d->file_paths[(s - 1) * F + f])
				continue;
			/* the tensors of both steps, alike in dtype and size */
			for (size_t i = 0, j = 0; i < prev[f].n && j < cur[f].n;) {
				const struct ften *x = &prev[f].v[i], *y = &cur[f].v[j];
				if (x->t != y->t) {
					x->t < y->t ? i++ : j++;
					continue;
				}
				if (x->dtype == y->dtype && x->length == y->length)
					pv[np++] = (ulp_pair){x->content, y->content, x->dtype, x->length, d->tensors[x->t],
					                      &d->norms[s * T + x->t], 0, ""};
				i++, j++;
			}
		}
		for (size_t i = 0; rc == 0 && i < np; i++) {
			ulp_tensor_diff *x = pv[i].out;
			free(x->name);
			memset(x, 0, sizeof(*x));
		}
		if (rc == 0 && np)
			rc = ulp_diff_pairs(a, pv, np);
		for (size_t i = 0; rc == 0 && i < np; i++) {
			ulp_tensor_diff *x = pv[i].out;
			if (!(x->name = strdup(pv[i].name))) {
				memset(x, 0, sizeof(*x)); /* elements 0: no figure */
				rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", d->run);
			}
		}
		if (rc < 0)
			for (size_t i = 0; i < np; i++)
				if (!pv[i].out->name)
					memset(pv[i].out, 0, sizeof(*pv[i].out));
		if (rc < 0)
			break;
		/* per layer and step: norms summed in squares, counts summed */
		memset(la, 0, 2 * L * sizeof(double));
		memset(le, 0, 2 * L * sizeof(uint64_t));
		double sa = 0, sd = 0;
		uint64_t se = 0, sc = 0;
		int any = 0;
		for (size_t t = 0; t < T; t++) {
			const ulp_tensor_diff *x = &d->norms[s * T + t];
			if (!x->elements)
				continue;
			size_t l = d->tensor_layer[t];
			le[l] += x->elements;
			lc[l] += x->changed;
			se += x->elements;
			sc += x->changed;
			if (isfinite(x->norm_a) && isfinite(x->norm_diff)) {
				la[l] += x->norm_a * x->norm_a;
				ld[l] += x->norm_diff * x->norm_diff;
				sa += x->norm_a * x->norm_a;
				sd += x->norm_diff * x->norm_diff;
				any = 1;
			}
		}
		for (size_t l = 0; l < L; l++) {
			d->layer_rel_change[s * L + l] = la[l] > 0 ? sqrt(ld[l] / la[l]) : NAN;
			d->layer_frac_changed[s * L + l] = le[l] ? (double)lc[l] / (double)le[l] : NAN;
		}
		d->step_rel_change[s] = any && sa > 0 ? sqrt(sd / sa) : NAN;
		d->step_frac_changed[s] = se ? (double)sc / (double)se : NAN;
		if (progress)
			progress(arg, s + 1, S);
	}
	for (size_t i = 0; fs && i < 2 * F; i++)
		free(fs[i].v);
	free(fs);
	free(pv);
	free(count);
	free(first);
	free(by_name);
	free(la);
	free(le);
	return rc;
}

/* ---- text and JSON ------------------------------------------------------------ */

/* "model.layers.17-19" for layers named alike but for their last number. */
static void layer_range(const ulp_dynamics *d, size_t a, size_t b, char *dst, size_t cap)
{
	const char *x = d->layers[a], *y = d->layers[b];
	if (a == b) {
		snprintf(dst, cap, "layer %s", x);
		return;
	}
	size_t lx = strlen(x), ly = strlen(y), px = lx, py = ly;
	while (px > 0 && x[px - 1] >= '0' && x[px - 1] <= '9')
		px--;
	while (py > 0 && y[py - 1] >= '0' && y[py - 1] <= '9')
		py--;
	if (px < lx && py < ly && px == py && !memcmp(x, y, px))
		snprintf(dst, cap, "layers %s-%s", x, y + py);
	else
		snprintf(dst, cap, "layers %s .. %s (%zu)", x, y, b - a + 1);
}

int ulp_dynamics_summary(const ulp_dynamics *d, char *dst, size_t cap)
{
	if (!d->has_jump)
		return snprintf(dst, cap, "%s: no jump to name: fewer than 3 steps have an update figure (%zu steps)",
		                 d->run[0] ? d->run : "''", d->n_steps);
	const ulp_dyn_jump *j = &d->jump;
	char lr[2 * ULP_PATH_MAX + 64];
	if (d->n_layers)
		layer_range(d, j->layer_first, j->layer_last, lr, sizeof(lr));
	else
		snprintf(lr, sizeof(lr), "no layer");
	int n = snprintf(dst, cap, "step %lld: %+.2f bits/weight over its neighbours' update (%.3g against %.3g:"
	                 " about %.1fx the change), %s %+.2f",
	                 (long long)j->step, j->excess_bits, j->update_bits, j->median_bits, j->ratio, lr,
	                 j->layer_excess);
	if (n >= 0 && (size_t)n < cap && isfinite(j->tensor_excess))
		n += snprintf(dst + n, cap - (size_t)n, ", most %s %+.2f", d->tensors[j->top_tensor], j->tensor_excess);
	return n;
}

static void jstr(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static void jnum(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.9g", v);
	else
		fputs("null", f);
}

/* A matrix of doubles (rows x cols, the field at offset off of stride bytes
 * from base), as an array of arrays. */
static void jmat(FILE *f, const char *key, const void *base, size_t stride, size_t rows, size_t cols)
{
	fprintf(f, ",\n \"%s\": [", key);
	for (size_t r = 0; r < rows; r++) {
		fputs(r ? ",\n  [" : "\n  [", f);
		for (size_t k = 0; k < cols; k++) {
			double v;
			memcpy(&v, (const char *)base + (r * cols + k) * stride, sizeof(v));
			if (k)
				fputc(',', f);
			jnum(f, v);
		}
		fputc(']', f);
	}
	fputs(rows ? "\n ]" : "]", f);
}

int ulp_dynamics_json(const ulp_dynamics *d, int compact, char **out, size_t *len)
{
	char *buf = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&buf, &n);
	if (!f)
		return -ULP_E_NOMEM;
	size_t S = d->n_steps, T = d->n_tensors, L = d->n_layers;
	char line[4 * ULP_PATH_MAX];
	ulp_dynamics_summary(d, line, sizeof(line));
	fputs("{\"run\": ", f);
	jstr(f, d->run);
	fputs(",\n \"summary\": ", f);
	jstr(f, line);
	fputs(",\n \"steps\": [", f);
	for (size_t s = 0; s < S; s++)
		fprintf(f, "%s%lld", s ? ", " : "", (long long)d->steps[s]);
	fputs("],\n \"layers\": [", f);
	for (size_t l = 0; l < L; l++) {
		fputs(l ? ", " : "", f);
		jstr(f, d->layers[l]);
	}
	fputs("]", f);
	if (d->has_jump) {
		const ulp_dyn_jump *j = &d->jump;
		fprintf(f, ",\n \"jump\": {\"step\": %lld, \"excess_bits\": ", (long long)j->step);
		jnum(f, j->excess_bits);
		fputs(", \"ratio\": ", f);
		jnum(f, j->ratio);
		fputs(", \"update_bits_per_weight\": ", f);
		jnum(f, j->update_bits);
		fputs(", \"median_bits_per_weight\": ", f);
		jnum(f, j->median_bits);
		fputs(", \"layers\": [", f);
		for (size_t l = j->layer_first; L && l <= j->layer_last; l++) {
			fputs(l > j->layer_first ? ", " : "", f);
			jstr(f, d->layers[l]);
		}
		fputs("], \"layer_excess_bits\": ", f);
		jnum(f, j->layer_excess);
		fputs(", \"tensor\": ", f);
		jstr(f, T ? d->tensors[j->top_tensor] : "");
		fputs(", \"tensor_excess_bits\": ", f);
		jnum(f, j->tensor_excess);
		fputs("}", f);
	} else {
		fputs(",\n \"jump\": null", f);
	}
	fputs(",\n \"step_stored_bytes\": [", f);
	for (size_t s = 0; s < S; s++)
		fprintf(f, "%s%llu", s ? ", " : "", (unsigned long long)d->step_stored[s]);
	fputs("]", f);
	jmat(f, "step_bits_per_weight", d->step_bits, sizeof(double), 1, S);
	jmat(f, "step_update_bits_per_weight", d->step_update, sizeof(double), 1, S);
	jmat(f, "layer_bits_per_weight", d->layer_bits, sizeof(double), S, L);
	jmat(f, "layer_update_bits_per_weight", d->layer_update, sizeof(double), S, L);
	jmat(f, "step_excess_bits", d->step_excess, sizeof(double), 1, S);
	jmat(f, "layer_excess_bits", d->layer_excess, sizeof(double), S, L);
	if (!compact) {
		fputs(",\n \"tensors\": [", f);
		for (size_t t = 0; t < T; t++) {
			fputs(t ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
			jstr(f, d->tensors[t]);
			fputs(", \"file\": ", f);
			jstr(f, d->tensor_files[t]);
			fprintf(f, ", \"layer\": %zu, \"dtype\": \"%s\", \"elements\": %llu}", d->tensor_layer[t],
			        ulp_dtype_name((ulp_dtype)d->tensor_dtypes[t]), (unsigned long long)d->tensor_elements[t]);
		}
		fputs(T ? "\n ]" : "]", f);
		static const char roles[] = "-ads";
		fputs(",\n \"role\": [", f);
		for (size_t s = 0; s < S; s++) {
			fputs(s ? ",\n  \"" : "\n  \"", f);
			for (size_t t = 0; t < T; t++)
				fputc(roles[d->cells[s * T + t].role & 3], f);
			fputc('"', f);
		}
		fputs(S ? "\n ]" : "]", f);
		static const char *const ikeys[] = {"stored_bytes", "ref_step", "chain_depth", "codec", "update_bound"};
		for (int k = 0; k < 5; k++) {
			fprintf(f, ",\n \"%s\": [", ikeys[k]);
			for (size_t s = 0; s < S; s++) {
				fputs(s ? ",\n  [" : "\n  [", f);
				for (size_t t = 0; t < T; t++) {
					const ulp_dyn_cell *x = &d->cells[s * T + t];
					long long v = k == 0 ? (long long)x->stored_bytes : k == 1 ? (long long)x->ref_step
					              : k == 2 ? (long long)x->chain_depth : k == 3 ? (long long)x->codec
					              : (long long)x->update_bound;
					fprintf(f, t ? ",%lld" : "%lld", v);
				}
				fputc(']', f);
			}
			fputs(S ? "\n ]" : "]", f);
		}
		jmat(f, "bits_per_weight", &d->cells[0].bits_per_weight, sizeof(ulp_dyn_cell), S, T);
		jmat(f, "update_bits_per_weight", &d->cells[0].update_bits, sizeof(ulp_dyn_cell), S, T);
	}
	if (d->norms) { /* ulp_dynamics_norms: NaN / null where no figure */
		jmat(f, "step_rel_change", d->step_rel_change, sizeof(double), 1, S);
		jmat(f, "step_frac_changed", d->step_frac_changed, sizeof(double), 1, S);
		jmat(f, "layer_rel_change", d->layer_rel_change, sizeof(double), S, L);
		jmat(f, "layer_frac_changed", d->layer_frac_changed, sizeof(double), S, L);
		if (!compact) {
			static const char *const nk[] = {"rel_change", "frac_changed", "changed", "median_ulps", "p99_ulps",
			                                 "max_ulps", "exponent_moves"};
			for (int k = 0; k < 7; k++) {
				fprintf(f, ",\n \"%s\": [", nk[k]);
				for (size_t s = 0; s < S; s++) {
					fputs(s ? ",\n  [" : "\n  [", f);
					for (size_t t = 0; t < T; t++) {
						const ulp_tensor_diff *x = &d->norms[s * T + t];
						if (t)
							fputc(',', f);
						if (!x->elements)
							fputs("null", f);
						else if (k == 0)
							jnum(f, x->rel_change);
						else if (k == 1)
							jnum(f, x->frac_changed);
						else
							fprintf(f, "%llu", (unsigned long long)(k == 2 ? x->changed : k == 3 ? x->median_ulps
							                                        : k == 4 ? x->p99_ulps : k == 5 ? x->max_ulps
							                                        : x->exponent_moves));
					}
					fputc(']', f);
				}
				fputs(S ? "\n ]" : "]", f);
			}
		}
	}
	fputs("\n}\n", f);
	int bad = ferror(f);
	if (fclose(f) != 0 || bad || !buf) {
		free(buf);
		return -ULP_E_NOMEM;
	}
	*out = buf;
	*len = n;
	return 0;
}
