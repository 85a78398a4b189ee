/* SPDX-License-Identifier: MIT */
/*
 * test_dynamics.c - a run's dynamics from its index (dynamics.c):
 *  - ulp_dynamics_layer: the layer rule on the name forms of common models;
 *  - ulp_archive_dynamics on a run made here (4 tensors, 8 steps, a frozen
 *    tensor, one layer given a jump at step 5): steps, tensors, layers,
 *    roles, reference steps, chain depths, stored bytes against the files'
 *    (ulp_stat), update bits, the jump and its layer and tensor; the same
 *    after re-basing to the final layout (backward deltas: the update read
 *    from the step before's blob);
 *  - --tensors' glob, the JSON, and the errors (no such run, a file);
 *  - ulp_dynamics_norms and ulp_archive_diff: the decoded change of each
 *    tensor (the frozen one none), the jump's layer, the order by change;
 *  - ulp_archive_diff of a pair of every float format (and an integer one),
 *    of sizes no multiple of the scan's lanes, against the figures computed
 *    here element by element: moves of a few ULPs and far ones (f32, f64:
 *    the median in a histogram bucket of many distances, narrowed by passes),
 *    crossed signs, zeros, infinities, NaNs (rel_change NaN where a value is
 *    NaN, as numpy's: it was 0);
 *  - out of memory: every allocation of ulp_archive_dynamics and
 *    ulp_dynamics_json failed in turn (malloc, calloc, realloc, strdup are
 *    wrapped: GNU ld --wrap, as test_faults): NOMEM, nothing returned, and
 *    the same view once none fails (valgrind: nothing leaks).
 */
#include "tap.h"
#include "ulpack.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char root[256];

/* ---- allocation faults: the armed thread's nth allocation fails ---------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);
char *__wrap_strdup(const char *s);
static long fault_at; /* 0: off; else the allocation (1-based) that fails */
static long fault_calls;
static pthread_t fault_thread;

static int fault_now(void)
{
	if (!fault_at || !pthread_equal(pthread_self(), fault_thread))
		return 0;
	return ++fault_calls == fault_at;
}

void *__wrap_malloc(size_t n)
{
	if (fault_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
	if (fault_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
	if (fault_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

char *__wrap_strdup(const char *s)
{
	if (fault_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_strdup(s);
}

/* ulp_archive_dynamics and ulp_dynamics_json with allocation n failing. */
static int dyn_with_fault(ulp_archive *a, long n, char **js)
{
	ulp_dynamics *d = NULL;
	size_t jl = 0;
	*js = NULL;
	fault_thread = pthread_self();
	fault_calls = 0;
	fault_at = n;
	int rc = ulp_archive_dynamics(a, "run", NULL, &d);
	if (rc == 0)
		rc = ulp_dynamics_json(d, 0, js, &jl);
	else
		CHECK(d == NULL, "allocation %ld: nothing returned on failure", n);
	fault_at = 0;
	ulp_dynamics_free(d);
	return rc;
}

static void test_faults(ulp_archive *a)
{
	char *want = NULL;
	REQUIRE(dyn_with_fault(a, 0, &want) == 0 && want, "the view without faults");
	long n = 1, fails = 0;
	for (; n < 100000; n++) {
		char *js = NULL;
		int rc = dyn_with_fault(a, n, &js);
		if (fault_calls < n) { /* it made fewer allocations: every one was failed once */
			CHECK(rc == 0 && js && !strcmp(js, want), "allocation %ld: not reached, the same view", n);
			free(js);
			break;
		}
		fails += rc == -ULP_E_NOMEM;
		CHECK(rc == -ULP_E_NOMEM && !js, "allocation %ld failed: rc %d, want NOMEM", n, rc);
		free(js);
	}
	CHECK(n > 20 && fails == n - 1, "%ld allocations failed in turn (%ld NOMEM)", n - 1, fails);
	free(want);
}

#define N 8192
#define STEPS 8
#define JUMP 5

static void test_layer(void)
{
	static const char *const cases[][2] = {
		{"model.layers.17.self_attn.q_proj.weight", "model.layers.17"},
		{"transformer.h.5.attn.c_attn.weight", "transformer.h.5"},
		{"model.norm.weight", "model.norm"},
		{"lm_head.weight", "lm_head"},
		{"w", "w"},
		{"state.0.exp_avg", "state.0"},
		{"0.weight", "0"},
		{"blocks.3", "blocks.3"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		char out[128];
		size_t n = ulp_dynamics_layer(cases[i][0], out, sizeof(out));
		CHECK(!strcmp(out, cases[i][1]) && n == strlen(cases[i][1]), "layer of %s: %s, want %s", cases[i][0], out,
		      cases[i][1]);
	}
	char small[6];
	CHECK(ulp_dynamics_layer("model.layers.3.x", small, sizeof(small)) == 14 && !strcmp(small, "model"),
	      "truncated: %s", small);
}

/* Step s of the run: 4 bf16 tensors; layers.1's moves 60 times as far
 * into step JUMP; model.layers.0.frozen never changes. */
static void put_step(ulp_archive *a, int s)
{
	static const char *const names[4] = {"model.layers.0.frozen", "model.layers.0.mlp.weight",
	                                      "model.layers.1.mlp.weight", "model.norm.weight"};
	uint16_t *w[4];
	ulp_st_wtensor t[4];
	uint64_t shape[1] = {N};
	for (int k = 0; k < 4; k++) {
		w[k] = malloc(N * 2);
		uint64_t r = 11 + (uint64_t)k;
		for (size_t i = 0; i < N; i++) {
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			int base = 0x3c00 + (int)((r >> 33) % 2000), v = base;
			if (k > 0) /* a drift of a few ULPs a step; the jump: 60 times that once */
				for (int q = 1; q <= s; q++)
					v += (int)((r >> (20 + q % 8)) % 5) * (k == 2 && q == JUMP ? 60 : 1);
			w[k][i] = (uint16_t)v;
		}
		t[k] = (ulp_st_wtensor){names[k], ULP_DT_BF16, 1, shape, w[k]};
	}
	char tmp[300], path[64];
	snprintf(tmp, sizeof(tmp), "%s/src.safetensors", root);
	REQUIRE(ulp_st_write(tmp, t, 4, NULL) == 0, "write %s", tmp);
	for (int k = 0; k < 4; k++)
		free(w[k]);
	snprintf(path, sizeof(path), "run/checkpoint-%d/model.safetensors", s);
	int fd = open(tmp, O_RDONLY);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_put(a, path, fd, &m, NULL) == 0, "put %s: %s", path, ulp_archive_errmsg(a));
	close(fd);
}

/* Checks the run in its final layout: the newest step an anchor, every
 * other a delta against the step after it (backward). */
static void check_run(ulp_archive *a)
{
	ulp_dynamics *d = NULL;
	REQUIRE(ulp_archive_dynamics(a, "run", NULL, &d) == 0, "dynamics: %s", ulp_archive_errmsg(a));
	REQUIRE(d->n_steps == STEPS && d->n_tensors == 4 && d->n_layers == 3, "%zu steps, %zu tensors, %zu layers",
	        d->n_steps, d->n_tensors, d->n_layers);
	for (size_t s = 0; s < STEPS; s++)
		CHECK(d->steps[s] == (int64_t)s + 1, "step %zu is %lld", s, (long long)d->steps[s]);
	CHECK(!strcmp(d->layers[0], "model.layers.0") && !strcmp(d->layers[1], "model.layers.1") &&
	          !strcmp(d->layers[2], "model.norm"),
	      "layers %s %s %s", d->layers[0], d->layers[1], d->layers[2]);
	size_t fz = 4, l1 = 4;
	for (size_t t = 0; t < 4; t++) {
		CHECK(d->tensor_elements[t] == N && d->tensor_dtypes[t] == ULP_DT_BF16, "tensor %zu: %llu elements",
		      t, (unsigned long long)d->tensor_elements[t]);
		CHECK(!strcmp(d->tensor_files[t], "checkpoint-{S}/model.safetensors"), "file %s", d->tensor_files[t]);
		if (!strcmp(d->tensors[t], "model.layers.0.frozen"))
			fz = t;
		if (!strcmp(d->tensors[t], "model.layers.1.mlp.weight"))
			l1 = t;
	}
	REQUIRE(fz < 4 && l1 < 4, "tensors found");
	CHECK(d->tensor_layer[l1] == 1 && d->tensor_layer[fz] == 0, "layers of the tensors");
	size_t T = d->n_tensors;
	for (size_t s = 0; s < STEPS; s++) {
		/* the stored bytes of a step are its file's (blobs it introduced) */
		char path[64];
		snprintf(path, sizeof(path), "run/checkpoint-%zu/model.safetensors", s + 1);
		ulp_stat st;
		REQUIRE(ulp_archive_stat(a, path, &st) == 0, "stat %s", path);
		CHECK(d->step_stored[s] == st.stored_bytes, "step %zu: %llu stored bytes, the file %llu", s + 1,
		      (unsigned long long)d->step_stored[s], (unsigned long long)st.stored_bytes);
		for (size_t t = 0; t < T; t++) {
			const ulp_dyn_cell *c = &d->cells[s * T + t];
			CHECK(fabs(c->bits_per_weight - 8.0 * (double)c->stored_bytes / N) < 1e-9, "bits per weight");
			if (t == fz) { /* one blob for every step: the newest's anchor */
				if (s > 0)
					CHECK(c->role == ULP_DYN_SAME && c->stored_bytes == 0 && c->update_bits == 0,
					      "frozen at step %zu: role %d, %llu bytes", s + 1, c->role,
					      (unsigned long long)c->stored_bytes);
				else
					CHECK(c->role == ULP_DYN_ANCHOR && c->stored_bytes > 0, "frozen: an anchor first");
				continue;
			}
			if (s + 1 == STEPS)
				CHECK(c->role == ULP_DYN_ANCHOR && c->chain_depth == 0 && c->ref_step == -1,
				      "the newest an anchor: role %d depth %u", c->role, c->chain_depth);
			else
				CHECK(c->role == ULP_DYN_DELTA && c->ref_step == (int64_t)s + 2 &&
				          c->chain_depth == STEPS - 1 - s,
				      "step %zu tensor %zu: delta against %lld, depth %u", s + 1, t, (long long)c->ref_step,
				      c->chain_depth);
			if (s == 0) {
				CHECK(isnan(c->update_bits), "no update at the first step");
				continue;
			}
			CHECK(isfinite(c->update_bits) && c->update_bits > 0 && !c->update_bound,
			      "step %zu tensor %zu: an update figure (%g)", s + 1, t, c->update_bits);
			/* backward: the step before is coded against this one */
			const ulp_dyn_cell *p = &d->cells[(s - 1) * T + t];
			CHECK(c->update_bits == p->bits_per_weight, "a backward delta's update is the bits of the step before");
		}
		if (s > 0)
			CHECK(isfinite(d->step_update[s]) && isfinite(d->layer_update[s * 3 + 1]), "step %zu: figures", s + 1);
	}
	CHECK(d->has_jump && d->jump.step == JUMP, "the jump at step %lld, want %d", (long long)d->jump.step, JUMP);
	CHECK(d->jump.layer_first == 1 && d->jump.layer_last == 1, "its layers %zu-%zu, want model.layers.1",
	      d->jump.layer_first, d->jump.layer_last);
	CHECK(d->jump.top_tensor == l1 && d->jump.tensor_excess > 3, "its tensor %zu (%+.2f bits)", d->jump.top_tensor,
	      d->jump.tensor_excess);
	CHECK(d->jump.excess_bits > 0.5 && fabs(d->jump.ratio - exp2(d->jump.excess_bits)) < 1e-9, "excess %g",
	      d->jump.excess_bits);
	char line[1024];
	ulp_dynamics_summary(d, line, sizeof(line));
	CHECK(!strncmp(line, "step 5: +", 9) && strstr(line, "layer model.layers.1") &&
	          strstr(line, "model.layers.1.mlp.weight"),
	      "summary: %s", line);
	char *js = NULL;
	size_t jl = 0;
	REQUIRE(ulp_dynamics_json(d, 0, &js, &jl) == 0 && js && jl == strlen(js), "json");
	CHECK(strstr(js, "\"jump\": {\"step\": 5,") && strstr(js, "\"role\": [") && strstr(js, "\"tensors\": ["),
	      "json holds the jump and the matrices");
	free(js);
	REQUIRE(ulp_dynamics_json(d, 1, &js, &jl) == 0, "compact json");
	CHECK(!strstr(js, "\"role\"") && strstr(js, "\"layer_update_bits_per_weight\""), "compact: no per-tensor matrix");
	free(js);
	ulp_dynamics_free(d);
}


/* ---- the figures of a pair against a plain computation here ------------------ */

#define NPT 7
static const struct {
	const char *name;
	ulp_dtype dt;
	size_t n;
	unsigned w, mb, eb; /* bits, mantissa bits, exponent bits */
} pt[NPT] = {
	{"bf16", ULP_DT_BF16, 1005, 16, 7, 8},      {"f32.near", ULP_DT_F32, 1003, 32, 23, 8},
	{"f32.far", ULP_DT_F32, 4099, 32, 23, 8},   {"f64", ULP_DT_F64, 999, 64, 52, 11},
	{"f16", ULP_DT_F16, 1001, 16, 10, 5},       {"f8", ULP_DT_F8_E4M3, 257, 8, 3, 4},
	{"i32", ULP_DT_I32, 101, 32, 0, 0},
};

static uint64_t get_bits(const uint8_t *p, size_t i, unsigned w)
{
	uint64_t u = 0;
	memcpy(&u, p + i * (w / 8), w / 8);
	return u;
}

/* A float of w bits (mb mantissa, eb exponent bits) as a double. */
static double to_value(uint64_t u, unsigned w, unsigned mb, unsigned eb, int e4m3)
{
	if (w == 32) {
		float f;
		uint32_t x = (uint32_t)u;
		memcpy(&f, &x, 4);
		return f;
	}
	if (w == 64) {
		double f;
		memcpy(&f, &u, 8);
		return f;
	}
	int neg = (int)(u >> (w - 1)) & 1, bias = (1 << (eb - 1)) - 1;
	uint64_t e = (u >> mb) & ((1u << eb) - 1), m = u & ((1u << mb) - 1);
	double v;
	if (e == (1u << eb) - 1 && (!e4m3 || m == (1u << mb) - 1))
		v = e4m3 || m ? NAN : INFINITY;
	else
		v = e ? ldexp((double)(m | (1u << mb)), (int)e - bias - (int)mb) : ldexp((double)m, 1 - bias - (int)mb);
	return neg ? -v : v;
}

static int u64_cmp(const void *x, const void *y)
{
	uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
	return a < b ? -1 : a > b;
}

static uint64_t rnd(uint64_t *r)
{
	*r = *r * 6364136223846793005ull + 1442695040888963407ull;
	return *r >> 11;
}

/* Two contents of each tensor: b moves a's elements by distances of every
 * size (none, a few ULPs, far: a median in a histogram bucket of many
 * distances), with signs crossed, zeros, infinities and NaNs. */
static void make_pair(int k, uint8_t *a, uint8_t *b)
{
	unsigned w = pt[k].w;
	uint64_t r = 77 + (uint64_t)k, mask = w == 64 ? ~0ull : (1ull << w) - 1;
	for (size_t i = 0; i < pt[k].n; i++) {
		uint64_t u = rnd(&r) & mask, v = u;
		if (w == 32 && pt[k].dt == ULP_DT_F32)
			u = (u & 0x80000000u) | (0x3c000000u + (u % 0x4000000u)); /* ordinary values */
		if (w == 64)
			u = (u & (1ull << 63)) | (0x3f00000000000000ull + (u % (1ull << 56)));
		uint64_t sel = rnd(&r) % 100, step = k == 2 ? (1ull << 20) + rnd(&r) % (1ull << 22)
		                                   : k == 3 ? (1ull << 40) + rnd(&r) % (1ull << 42)
		                                   : rnd(&r) % 7;
		if (sel < 25)
			v = u; /* unchanged */
		else if (sel < 90)
			v = (u + step) & mask;
		else if (sel < 93)
			v = u ^ (1ull << (w - 1)); /* the sign crossed */
		else if (sel < 95)
			v = 0; /* +0 */
		else if (sel < 97)
			v = mask ^ (mask >> 1); /* -0 */
		else
			v = (mask >> 1) & ~((1ull << pt[k].mb) - 1) & mask; /* infinity (NaN in e4m3) */
		if (i == 3)
			u = v; /* one NaN or infinity unchanged */
		memcpy(a + i * (w / 8), &u, w / 8);
		memcpy(b + i * (w / 8), &v, w / 8);
	}
}

static void put_pair_file(ulp_archive *a, const char *path, int which)
{
	ulp_st_wtensor t[NPT];
	uint64_t shape[NPT];
	uint8_t *buf[NPT];
	for (int k = 0; k < NPT; k++) {
		size_t bytes = pt[k].n * pt[k].w / 8;
		uint8_t *other = malloc(bytes);
		buf[k] = malloc(bytes);
		REQUIRE(buf[k] && other, "memory");
		if (which)
			make_pair(k, other, buf[k]);
		else
			make_pair(k, buf[k], other);
		free(other);
		shape[k] = pt[k].n;
		t[k] = (ulp_st_wtensor){pt[k].name, pt[k].dt, 1, &shape[k], buf[k]};
	}
	char tmp[300];
	snprintf(tmp, sizeof(tmp), "%s/pair.safetensors", root);
	REQUIRE(ulp_st_write(tmp, t, NPT, NULL) == 0, "write %s", tmp);
	for (int k = 0; k < NPT; k++)
		free(buf[k]);
	int fd = open(tmp, O_RDONLY);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_put(a, path, fd, &m, NULL) == 0, "put %s: %s", path, ulp_archive_errmsg(a));
	close(fd);
}

/* ulp_archive_diff of the two files against the figures computed here
 * element by element: counts and ULPs exact, norms to 1e-9. */
static void test_pairs(ulp_archive *a)
{
	put_pair_file(a, "pairs/step-1/m.safetensors", 0);
	put_pair_file(a, "pairs/step-2/m.safetensors", 1);
	/* every kernel this CPU has (the 256-bit scan where AVX2 is), then the
	 * 128-bit and scalar ones alone */
	unsigned all = ulp_cpu_features();
	for (int pass = 0; pass < 2; pass++) {
		unsigned old_mask = ulp_set_cpu_mask(pass ? 0 : all);
		ulp_tensor_diff *v = NULL;
		size_t nv = 0;
		REQUIRE(ulp_archive_diff(a, "pairs/step-1/m.safetensors", "pairs/step-2/m.safetensors", &v, &nv) == 0,
		        "diff: %s", ulp_archive_errmsg(a));
		ulp_set_cpu_mask(old_mask);
		CHECK(nv == NPT, "%zu tensors (kernels %s)", nv, pass ? "scalar" : "all");
		for (int k = 0; k < NPT; k++) {
			const ulp_tensor_diff *x = NULL;
			for (size_t i = 0; i < nv; i++)
				if (!strcmp(v[i].name, pt[k].name))
					x = &v[i];
			REQUIRE(x, "tensor %s", pt[k].name);
			size_t n = pt[k].n, bytes = n * pt[k].w / 8;
			unsigned w = pt[k].w;
			uint8_t *pa = malloc(bytes), *pb = malloc(bytes);
			uint64_t *dist = malloc(n * sizeof(*dist));
			REQUIRE(pa && pb && dist, "memory");
			make_pair(k, pa, pb);
			uint64_t changed = 0, moves = 0, sg = 1ull << (w - 1), mask = w == 64 ? ~0ull : (1ull << w) - 1;
			double sa = 0, sd = 0;
			for (size_t i = 0; i < n; i++) {
				uint64_t u = get_bits(pa, i, w), y = get_bits(pb, i, w);
				uint64_t ou = u & sg ? ~u & mask : u | sg, oy = y & sg ? ~y & mask : y | sg;
				dist[i] = ou > oy ? ou - oy : oy - ou;
				changed += u != y;
				moves += ((u >> pt[k].mb) & ((1ull << pt[k].eb) - 1)) != ((y >> pt[k].mb) & ((1ull << pt[k].eb) - 1));
				double va = to_value(u, w, pt[k].mb, pt[k].eb, pt[k].dt == ULP_DT_F8_E4M3);
				double vb = to_value(y, w, pt[k].mb, pt[k].eb, pt[k].dt == ULP_DT_F8_E4M3);
				sa += va * va;
				if (u != y)
					sd += (vb - va) * (vb - va);
			}
			qsort(dist, n, sizeof(*dist), u64_cmp);
			CHECK(x->elements == n && x->changed == changed, "%s: %llu changed, want %llu", pt[k].name,
			      (unsigned long long)x->changed, (unsigned long long)changed);
			if (pt[k].dt == ULP_DT_I32) {
				CHECK(x->median_ulps == 0 && isnan(x->rel_change), "%s: counts only", pt[k].name);
			} else {
				uint64_t med = dist[(n - 1) / 2], p99 = dist[(size_t)floor(0.99 * (double)(n - 1))];
				CHECK(x->median_ulps == med && x->p99_ulps == p99 && x->max_ulps == dist[n - 1] &&
				          x->exponent_moves == moves,
				      "%s: median %llu p99 %llu max %llu moves %llu, want %llu %llu %llu %llu", pt[k].name,
				      (unsigned long long)x->median_ulps, (unsigned long long)x->p99_ulps,
				      (unsigned long long)x->max_ulps, (unsigned long long)x->exponent_moves,
				      (unsigned long long)med, (unsigned long long)p99, (unsigned long long)dist[n - 1],
				      (unsigned long long)moves);
				double want = sqrt(sd) / sqrt(sa);
				int same = isnan(want) ? isnan(x->rel_change)
				           : isinf(want) ? x->rel_change == want
				                         : fabs(x->rel_change - want) <= 1e-9 * fabs(want);
				CHECK(same, "%s: rel_change %.17g, want %.17g", pt[k].name, x->rel_change, want);
			}
			free(pa);
			free(pb);
			free(dist);
		}
		ulp_tensor_diffs_free(v, nv);
	}
}

static void test_run(void)
{
	char dir[300], err[512];
	snprintf(dir, sizeof(dir), "%s/a", root);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive_opts o = {.threads = 2, .cache_size = 16 << 20};
	ulp_archive *a;
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	for (int s = 1; s <= STEPS; s++)
		put_step(a, s);
	/* before re-basing each step was the newest when put: anchors */
	ulp_dynamics *d = NULL;
	REQUIRE(ulp_archive_dynamics(a, "run", NULL, &d) == 0, "dynamics: %s", ulp_archive_errmsg(a));
	size_t anchors = 0;
	for (size_t i = 0; i < d->n_steps * d->n_tensors; i++)
		anchors += d->cells[i].role == ULP_DYN_ANCHOR;
	char line[512];
	ulp_dynamics_summary(d, line, sizeof(line));
	CHECK(anchors == 3 * STEPS + 1 && !d->has_jump && isnan(d->step_update[3]) && strstr(line, "no jump"),
	      "anchors only: %zu anchors; %s", anchors, line);
	ulp_dynamics_free(d);
	d = NULL;
	/* the glob: layer 0's tensors only */
	REQUIRE(ulp_archive_dynamics(a, "run", "model.layers.0.*", &d) == 0, "glob: %s", ulp_archive_errmsg(a));
	CHECK(d->n_tensors == 2 && d->n_layers == 1 && d->n_steps == STEPS, "glob: %zu tensors", d->n_tensors);
	ulp_dynamics_free(d);
	d = NULL;
	CHECK(ulp_archive_dynamics(a, "run", "nothing*", &d) == -ULP_E_NOENT && !d, "a glob matching nothing: NOENT");
	CHECK(ulp_archive_dynamics(a, "nope", NULL, &d) == -ULP_E_NOENT && !d, "no such run: NOENT");
	CHECK(ulp_archive_dynamics(a, "run/checkpoint-1/model.safetensors", NULL, &d) == -ULP_E_NOTDIR && !d,
	      "a file: NOTDIR");
	CHECK(ulp_archive_dynamics(a, "run/checkpoint-1", NULL, &d) == -ULP_E_NOENT && !d &&
	          strstr(ulp_archive_errmsg(a), "a step directory, not a run"),
	      "a step directory: NOENT: %s", ulp_archive_errmsg(a));
	REQUIRE(ulp_archive_dynamics(a, "", NULL, &d) == 0, "the root: %s", ulp_archive_errmsg(a));
	CHECK(d->n_steps == STEPS && !strcmp(d->tensor_files[0], "run/checkpoint-{S}/model.safetensors"),
	      "the root: files %s", d->tensor_files[0]);
	ulp_dynamics_free(d);
	/* the final layout: the newest an anchor, the others backward deltas */
	ulp_rebase_result rr;
	REQUIRE(ulp_archive_rebase_pending(a, NULL, NULL, &rr) == 0, "rebase: %s", ulp_archive_errmsg(a));
	CHECK(rr.recoded > 0, "re-based %llu blobs", (unsigned long long)rr.recoded);
	REQUIRE(ulp_archive_dynamics(a, "run", NULL, &d) == 0, "dynamics: %s", ulp_archive_errmsg(a));
	size_t T = d->n_tensors, back = 0;
	for (size_t s = 0; s + 1 < STEPS; s++)
		for (size_t t = 0; t < T; t++)
			back += d->cells[s * T + t].role == ULP_DYN_DELTA && d->cells[s * T + t].ref_step == (int64_t)s + 2;
	CHECK(back >= 3 * (STEPS - 1) - 1, "backward deltas after re-basing: %zu", back);
	ulp_dynamics_free(d);
	check_run(a);
	/* decoded: the frozen tensor unchanged, the others changed; the jump's
	 * tensor the largest relative change into step 5 */
	REQUIRE(ulp_archive_dynamics(a, "run", NULL, &d) == 0, "dynamics: %s", ulp_archive_errmsg(a));
	REQUIRE(ulp_dynamics_norms(a, d, NULL, NULL) == 0, "norms: %s", ulp_archive_errmsg(a));
	T = d->n_tensors;
	for (size_t s = 1; s < STEPS; s++) {
		for (size_t t = 0; t < T; t++) {
			const ulp_tensor_diff *x = &d->norms[s * T + t];
			CHECK(x->elements == N && !strcmp(x->name, d->tensors[t]), "step %zu tensor %zu: figures", s + 1, t);
			if (!strcmp(d->tensors[t], "model.layers.0.frozen"))
				CHECK(x->changed == 0 && x->rel_change == 0 && x->max_ulps == 0, "frozen: no change");
			else
				CHECK(x->changed > 0 && x->rel_change > 0 && x->max_ulps >= x->p99_ulps &&
				          x->p99_ulps >= x->median_ulps,
				      "step %zu tensor %zu: a change", s + 1, t);
		}
		CHECK(isfinite(d->step_rel_change[s]) && d->step_frac_changed[s] > 0.5, "step %zu: %g", s + 1,
		      d->step_rel_change[s]);
	}
	CHECK(d->layer_rel_change[(JUMP - 1) * 3 + 1] > 5 * d->layer_rel_change[(JUMP - 2) * 3 + 1],
	      "the jump's layer: %g against %g", d->layer_rel_change[(JUMP - 1) * 3 + 1],
	      d->layer_rel_change[(JUMP - 2) * 3 + 1]);
	ulp_dynamics_free(d);
	ulp_tensor_diff *v = NULL;
	size_t nv = 0;
	CHECK(ulp_archive_diff(a, "run/checkpoint-1/model.safetensors", "run/nope", &v, &nv) == -ULP_E_NOENT && !v,
	      "diff: no such file");
	REQUIRE(ulp_archive_diff(a, "run/checkpoint-4/model.safetensors", "run/checkpoint-5/model.safetensors", &v,
	                         &nv) == 0,
	        "diff: %s", ulp_archive_errmsg(a));
	CHECK(nv == 4 && !strcmp(v[0].name, "model.layers.1.mlp.weight") && !strcmp(v[3].name, "model.layers.0.frozen"),
	      "diff: sorted by relative change: %s .. %s", v[0].name, v[nv - 1].name);
	ulp_tensor_diffs_free(v, nv);
	test_pairs(a);
	test_faults(a);
	ulp_archive_close(a);
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-dyn-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	ulp_dynamics_free(NULL);
	test_layer();
	test_run();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
