/* SPDX-License-Identifier: MIT */
/*
 * diff.c - what changed between two contents of one tensor (`ulpack diff`,
 * `ulpack dynamics --norms`): the two contents (blobs, by their content
 * identity) are read through the decode cache (ulp_read_chunk, the read path
 * of every file read, local, shared or in a bucket) one chunk pair at a
 * time and compared element by element. A delta is decoded against its
 * reference from the cache, so a walk of a run in step order decodes one
 * delta per step and chunk (read.c invariant 4 of layout.c) and finds the
 * step before still cached; a pair that is no delta of one against the
 * other (an anchor, a delta over several steps, a backward one) is read the
 * same way and gets the same exact figures.
 *
 * Definitions (ulpack(1) DIFF):
 *  - the ordered integer of a float's bits: u with the sign set for a
 *    positive value, ~u for a negative one, so that integers keep the order
 *    of values (the codec's phi, DESIGN.md 3); the ULP distance of two values
 *    is the absolute difference of theirs, exact for every bit pattern (+0
 *    and -0 are 1 apart). Where one content is a delta of the other, it is
 *    |d| of the delta's d = phi(x) - phi(r) (read as signed; the distance,
 *    unsigned, stays exact where d wraps: opposite signs far apart);
 *  - median and 99th percentile: the distances of all elements (0 where
 *    unchanged) sorted, the value at rank floor(q (n - 1)) (numpy's
 *    percentile with method="lower"), from a histogram of every distance
 *    (16 and 8-bit formats: the distance itself; wider ones: exact below
 *    2^11, above it the bit length and the next 10 bits) and, where the rank
 *    falls in a bucket of several distances, passes over the pair that count
 *    that bucket's distances 16 bits at a time (no copy of the distances);
 *  - rel_change = sqrt(sum (b - a)^2) / sqrt(sum a^2), the values converted
 *    to double and summed in double, in 8 lanes per piece, the pieces in
 *    order;
 *  - exponent moves: elements whose exponent field differs.
 * The bf16 and f32 scan runs in 256-bit vectors where the CPU has AVX2
 * (diff_avx2.c, chosen at run time), else in 128-bit ones, the rest element
 * by element: the same counts, the sums in other lanes (equal to 1e-15).
 *
 * Invariants:
 *  1. A pair's memory is one chunk pair pinned in the cache per piece in
 *     flight, and a histogram: the contents are never copied whole.
 *  2. A piece is the elements of one chunk of each content (chunk sizes are
 *     powers of two: a piece is the smaller chunk); the pieces' sums are
 *     added in piece order and the histograms are integer counts, so the
 *     figures do not depend on the threads.
 *  3. A thread's piece histogram (clean_hist) is all zeros between pieces:
 *     a piece clears what it counted (the keys of its smallest to its
 *     largest distance) as it hands the counts on.
 *  4. The result of ulp_archive_diff is sorted by rel_change, largest first,
 *     NaN last, ties by name: the same files give the same order.
 */
#include "config.h" /* ULP_HAVE_AVX2 */
#include "arch_int.h"
#include "store/path.h"
#include "store/index.h"
#include "store/shared.h"
#include "archive/diff.h"
#include "archive/cache.h"
#include "archive/read.h"
#include <math.h>
#include <pthread.h>
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

/* Every value of the f16 and f8 formats (each exact in a float), made once. */
static float tab_f16[65536], tab_e4m3[256], tab_e5m2[256];
static pthread_once_t tabs_once = PTHREAD_ONCE_INIT;

static void make_tabs(void)
{
	fmt f;
	fmt_of(ULP_DT_F16, &f);
	for (unsigned u = 0; u < 65536; u++)
		tab_f16[u] = (float)value(u, &f);
	fmt_of(ULP_DT_F8_E4M3, &f);
	for (unsigned u = 0; u < 256; u++)
		tab_e4m3[u] = (float)value(u, &f);
	fmt_of(ULP_DT_F8_E5M2, &f);
	for (unsigned u = 0; u < 256; u++)
		tab_e5m2[u] = (float)value(u, &f);
}

/* ---- the scan of a piece pair ------------------------------------------------ */

/* What a piece pair gives (its sums are added in piece order: invariant 2). */
typedef ulp_scan_out blk;

#define HIST 65536u
#define EXACT 2048u /* wide formats: distances below it have a key each */

/* The histogram key of a nonzero distance d: d itself for 8 and 16-bit
 * formats; for wider ones d below EXACT, else its bit length b and the 10
 * bits under its leading one (keys grow with d, all below HIST). */
static inline unsigned key_of(uint64_t d, int wide)
{
	if (!wide || d < EXACT)
		return (unsigned)d;
	unsigned b = 64u - (unsigned)__builtin_clzll(d);
	return EXACT + (b - 12) * 1024 + (unsigned)((d >> (b - 11)) & 1023);
}

/* The distances [*lo, *lo + *width) of key k. */
static void key_range(unsigned k, int wide, uint64_t *lo, uint64_t *width)
{
	if (!wide || k < EXACT) {
		*lo = k;
		*width = 1;
		return;
	}
	unsigned b = (k - EXACT) / 1024 + 12, m = (k - EXACT) % 1024;
	*lo = (uint64_t)(1024 + m) << (b - 11);
	*width = (uint64_t)1 << (b - 11);
}

static inline double v_bf16(uint16_t x, const float *tab)
{
	(void)tab;
	uint32_t w = (uint32_t)x << 16;
	float v;
	memcpy(&v, &w, 4);
	return v;
}

static inline double v_f32(uint32_t x, const float *tab)
{
	(void)tab;
	float v;
	memcpy(&v, &x, 4);
	return v;
}

static inline double v_f64(uint64_t x, const float *tab)
{
	(void)tab;
	double v;
	memcpy(&v, &x, 8);
	return v;
}

static inline double v_tab(uint64_t x, const float *tab)
{
	return tab[x];
}

#define LANES 8

/* A function that scans n elements of type T (W bits) of a and b into o
 * and h (keys of the nonzero distances); VAL gives a value of bits x. The
 * sums run in LANES lanes (element i in lane i % LANES), the lanes added in
 * order: independent chains, the same result whatever the compiler makes of
 * the lanes. */
#define SCAN_FN(NAME, T, W, VAL, WIDE)                                                                       \
	static void NAME(const uint8_t *pa, const uint8_t *pb, size_t n, unsigned mb, uint64_t em,           \
	                 const float *tab, blk *o, uint32_t *h)                                                \
	{                                                                                                     \
		const T sg = (T)((T)1 << ((W) - 1)), mk = (T)~(T)0;                                          \
		double sa[LANES] = {0}, sd[LANES] = {0};                                                      \
		uint64_t changed = 0, emoves = 0, mind = UINT64_MAX, maxd = 0;                                \
		for (size_t i = 0; i < n; i += LANES) {                                                       \
			size_t m = n - i < LANES ? n - i : LANES;                                             \
			T dd[LANES];                                                                          \
			T x[LANES], y[LANES];                                                                 \
			memcpy(x, pa + i * sizeof(T), m * sizeof(T));                                         \
			memcpy(y, pb + i * sizeof(T), m * sizeof(T));                                         \
			for (size_t j = m; j < LANES; j++)                                                    \
				x[j] = y[j] = 0;                                                              \
			for (size_t j = 0; j < LANES; j++) {                                                  \
				double va = VAL(x[j], tab), vb = VAL(y[j], tab);                              \
				double dv = x[j] == y[j] ? 0.0 : vb - va;                                     \
				sa[j] += va * va;                                                             \
				sd[j] += dv * dv;                                                             \
				T ox = (T)(x[j] & sg ? ~x[j] & mk : x[j] | sg);                               \
				T oy = (T)(y[j] & sg ? ~y[j] & mk : y[j] | sg);                               \
				dd[j] = (T)(ox > oy ? ox - oy : oy - ox);                                     \
				changed += x[j] != y[j];                                                      \
				emoves += (((uint64_t)(x[j] ^ y[j]) >> mb) & em) != 0;                        \
			}                                                                                     \
			for (size_t j = 0; j < LANES; j++) {                                                  \
				if (!dd[j])                                                                   \
					continue;                                                             \
				uint64_t d = dd[j];                                                           \
				mind = d < mind ? d : mind;                                                   \
				maxd = d > maxd ? d : maxd;                                                   \
				h[key_of(d, WIDE)]++;                                                         \
			}                                                                                     \
		}                                                                                             \
		for (size_t j = 0; j < LANES; j++) {                                                          \
			o->sa += sa[j];                                                                       \
			o->sd += sd[j];                                                                       \
		}                                                                                             \
		o->changed += changed;                                                                        \
		o->emoves += emoves;                                                                          \
		o->mind = mind < o->mind ? mind : o->mind;                                                    \
		o->maxd = maxd > o->maxd ? maxd : o->maxd;                                                    \
	}

SCAN_FN(scan_f32, uint32_t, 32, v_f32, 1)
SCAN_FN(scan_f64, uint64_t, 64, v_f64, 1)
SCAN_FN(scan_bf16, uint16_t, 16, v_bf16, 0)
SCAN_FN(scan_tab16, uint16_t, 16, v_tab, 0)
SCAN_FN(scan_tab8, uint8_t, 8, v_tab, 0)

/* bf16 and f32, the common formats, 4 elements at a time in 128-bit
 * vectors of the compiler's (GCC and clang vector extensions: SSE2 or NEON
 * at the least), the sums in 4 lanes (element i in lane i % 4), the lanes
 * added in order; the histogram after, element by element, zeros too (in
 * h[0]: the unchanged are the elements less h[0], which the caller clears:
 * invariant 3). Accumulators are locals, so that they stay in registers. */
typedef uint16_t v4h __attribute__((vector_size(8)));
typedef uint32_t v4u __attribute__((vector_size(16)));
typedef float v4f __attribute__((vector_size(16)));
typedef double v2d __attribute__((vector_size(16)));
typedef int64_t v2l __attribute__((vector_size(16)));

/* LOAD(i) sets v4u x, y (the bits of elements i .. i + 3) and fx, fy
 * (their float bits); ORDS(f) the signed ordered integer of float bits f
 * (the ordered integer less the sign bit: signed compares keep the order),
 * DIST(sx, sy) the distance of two of them, unsigned; WIDE the keys', ES
 * the element's bytes, SCALAR the SCAN_FN of the tail. */
typedef int32_t v4i __attribute__((vector_size(16)));
#define SCAN_V(NAME, LOAD, ORDS, DIST, WIDE, ES, SCALAR)                                                             \
	static void NAME(const uint8_t *pa, const uint8_t *pb, size_t n, unsigned mb, uint64_t em,           \
	                 const float *tab, blk *o, uint32_t *h)                                                \
	{                                                                                                     \
		(void)tab;                                                                                    \
		const v4u z = {0}, vem = z + (uint32_t)em;                                                    \
		v2d sa0 = {0}, sa1 = {0}, sd0 = {0}, sd1 = {0};                                               \
		const v4u vbias = z + 0x80000000u;                                                            \
		v4u emv = z;                                                                                  \
		v4i vmax = (v4i)vbias;                                                                        \
		size_t i = 0;                                                                                 \
		for (; i + 4 <= n; i += 4) {                                                                  \
			LOAD(i);                                                                              \
			v4i eq = (v4i)(x == y); /* all ones where the bits are the same */                    \
			v4f ax = (v4f)fx, ay = (v4f)fy;                                                       \
			v2d a0 = {ax[0], ax[1]}, a1 = {ax[2], ax[3]};                                         \
			v2d d0 = (v2d){ay[0], ay[1]} - a0, d1 = (v2d){ay[2], ay[3]} - a1;                     \
			v2l e0 = {eq[0], eq[1]}, e1 = {eq[2], eq[3]}; /* unchanged: 0 (NaN too) */            \
			d0 = (v2d)((v2l)(d0 * d0) & ~e0);                                                     \
			d1 = (v2d)((v2l)(d1 * d1) & ~e1);                                                     \
			sa0 += a0 * a0;                                                                       \
			sa1 += a1 * a1;                                                                       \
			sd0 += d0;                                                                            \
			sd1 += d1;                                                                            \
			emv -= (v4u)((((x ^ y) >> mb) & vem) != 0);                                           \
			v4i sx = ORDS(fx), sy = ORDS(fy); /* signed ordered integers */                       \
			v4u dd = DIST(sx, sy);                                                                \
			v4i bd = (v4i)(dd ^ vbias), up = bd > vmax; /* unsigned max, biased */                \
			vmax = (bd & up) | (vmax & ~up);                                                      \
			h[key_of(dd[0], WIDE)]++;                                                             \
			h[key_of(dd[1], WIDE)]++;                                                             \
			h[key_of(dd[2], WIDE)]++;                                                             \
			h[key_of(dd[3], WIDE)]++;                                                             \
		}                                                                                             \
		o->sa += sa0[0] + sa0[1] + sa1[0] + sa1[1];                                                   \
		o->sd += sd0[0] + sd0[1] + sd1[0] + sd1[1];                                                   \
		o->changed += i - h[0];                                                                       \
		h[0] = 0;                                                                                     \
		for (int j = 0; j < 4; j++) {                                                                 \
			o->emoves += emv[j];                                                                  \
			uint64_t mx = (uint32_t)vmax[j] ^ 0x80000000u;                                        \
			o->maxd = mx > o->maxd ? mx : o->maxd;                                                \
		}                                                                                             \
		if (o->maxd && o->mind > 1) /* the keys cleared from 1 on */                                  \
			o->mind = 1;                                                                          \
		if (i < n) /* fewer than 4 left */                                                            \
			SCALAR(pa + i * (ES), pb + i * (ES), n - i, mb, em, NULL, o, h);                      \
	}

#define LOAD_BF16(i)                                                                                         \
	v4h xh, yh;                                                                                           \
	memcpy(&xh, pa + 2 * (i), sizeof(xh));                                                                \
	memcpy(&yh, pb + 2 * (i), sizeof(yh));                                                                \
	v4u x = __builtin_convertvector(xh, v4u), y = __builtin_convertvector(yh, v4u);                       \
	v4u fx = x << 16, fy = y << 16
#define LOAD_F32(i)                                                                                          \
	v4u x, y;                                                                                             \
	memcpy(&x, pa + 4 * (i), sizeof(x));                                                                  \
	memcpy(&y, pb + 4 * (i), sizeof(y));                                                                  \
	v4u fx = x, fy = y

/* bf16: the top half of a float's bits, as int32 (16 bits: no overflow) */
static inline v4i ords_bf16(v4u f)
{
	v4i v = (v4i)f >> 16;
	return v ^ ((v >> 31) & 0x7fff);
}

static inline v4u dist_bf16(v4i a, v4i b)
{
	v4i d = a - b, s = d >> 31;
	return (v4u)((d ^ s) - s);
}

/* f32: 32 bits; the difference wraps (unsigned), the distance is its
 * magnitude */
static inline v4i ords_f32(v4u f)
{
	v4i v = (v4i)f;
	return v ^ ((v >> 31) & 0x7fffffff);
}

static inline v4u dist_f32(v4i a, v4i b)
{
	v4u g = (v4u)(a > b), ua = (v4u)a, ub = (v4u)b;
	return ((ua - ub) & g) | ((ub - ua) & ~g);
}

SCAN_V(scan_bf16_v, LOAD_BF16, ords_bf16, dist_bf16, 0, 2, scan_bf16)
SCAN_V(scan_f32_v, LOAD_F32, ords_f32, dist_f32, 1, 4, scan_f32)

/* ---- one pair ---------------------------------------------------------------- */

typedef struct pairjob {
	ulp_archive *a;
	const ulp_pair *in;
	fmt f;
	int is_float, wide;
	unsigned size;         /* element bytes */
	const float *tab;
	uint64_t n;            /* elements */
	uint64_t cba, cbb;     /* bytes per chunk of each content */
	uint64_t pb;           /* bytes per piece: the smaller */
	size_t np;             /* pieces */
	blk *blks;             /* np */
	uint64_t *hist;        /* HIST counts, np > 1: the pieces' merged (under mu) */
	pthread_mutex_t mu;
	int rc;                /* the first failure (under mu) */
	char msg[256];         /* its message, from the thread that failed */
} pairjob;

/* Records a failure (the message is the calling thread's: ulp_arch_err). */
static int pair_fail(pairjob *p, int rc)
{
	pthread_mutex_lock(&p->mu);
	if (!p->rc) {
		p->rc = rc;
		snprintf(p->msg, sizeof(p->msg), "%s", ulp_archive_errmsg(p->a));
	}
	pthread_mutex_unlock(&p->mu);
	return rc;
}

/* A thread's piece histogram, all zeros (invariant 3): its scratch at its
 * scratch level (a thread that helps another loop has a fresh set, pool.c
 * invariant 3), cleared once when new. */
static uint32_t *clean_hist(void)
{
	static _Thread_local uint32_t *known[ULP_SCRATCH_LEVELS];
	uint32_t *h = ulp_scratch(ULP_SCRATCH_HIST, HIST * sizeof(*h));
	unsigned l = ulp_scratch_level();
	if (h && h != known[l]) {
		memset(h, 0, HIST * sizeof(*h));
		known[l] = h;
	}
	return h;
}

/* One chunk's bytes [off, off + len) of content sha, pinned in *e. */
static int chunk_at(ulp_archive *a, const uint8_t *sha, uint64_t cb, uint64_t off, uint64_t len, ulp_centry **e,
                    const uint8_t **p)
{
	const uint8_t *d;
	size_t l;
	uint64_t k = off / cb, in = off % cb;
	if (k > UINT32_MAX)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: a content of more than 2^32 chunks", a->dir);
	ULP_TRY(ulp_read_chunk(a, sha, (uint32_t)k, e, &d, &l, NULL));
	if (in + len > l) {
		ulp_cache_put(a->cache, *e);
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: chunk %llu holds %zu bytes, %llu wanted", a->dir,
		                    (unsigned long long)k, l, (unsigned long long)(in + len));
	}
	*p = d + in;
	return 0;
}

/* Pins piece j of both contents: *pa, *pb (*len bytes each). */
static int piece_get(pairjob *p, size_t j, ulp_centry *e[2], const uint8_t **pa, const uint8_t **pb, size_t *len)
{
	uint64_t off = (uint64_t)j * p->pb, l = ULP_MIN(p->pb, p->in->length - off);
	ULP_TRY(chunk_at(p->a, p->in->sha_a, p->cba, off, l, &e[0], pa));
	e[1] = NULL;
	if (!memcmp(p->in->sha_a, p->in->sha_b, ULP_SHA256_LEN)) {
		*pb = *pa; /* the same content: nothing changed */
	} else {
		int rc = chunk_at(p->a, p->in->sha_b, p->cbb, off, l, &e[1], pb);
		if (rc < 0) {
			ulp_cache_put(p->a->cache, e[0]);
			return rc;
		}
	}
	*len = (size_t)l;
	return 0;
}

static void piece_put(pairjob *p, ulp_centry *e[2])
{
	ulp_cache_put(p->a->cache, e[0]);
	if (e[1])
		ulp_cache_put(p->a->cache, e[1]);
}

static void scan(const pairjob *p, const uint8_t *a, const uint8_t *b, size_t len, blk *o, uint32_t *h)
{
	size_t n = len / p->size;
	if (!p->is_float) {
		for (size_t i = 0; i < n; i++)
			o->changed += memcmp(a + i * p->size, b + i * p->size, p->size) != 0;
		return;
	}
	uint64_t em = ((uint64_t)1 << p->f.ebits) - 1;
	int bf16 = p->size == 2 && p->in->dtype == ULP_DT_BF16;
#ifdef ULP_HAVE_AVX2
	if ((p->size == 4 || bf16) && (ulp_cpu_paths() & ULP_CPU_AVX2)) { /* most of it in 256-bit vectors */
		size_t k = ulp_diff_scan_avx2(p->size == 4, a, b, n, p->f.mbits, (uint32_t)em, o, h);
		a += k * p->size, b += k * p->size, n -= k;
	}
#endif
	switch (p->size) {
	case 4: scan_f32_v(a, b, n, p->f.mbits, em, NULL, o, h); break;
	case 8: scan_f64(a, b, n, p->f.mbits, em, NULL, o, h); break;
	case 2:
		if (bf16)
			scan_bf16_v(a, b, n, p->f.mbits, em, NULL, o, h);
		else
			scan_tab16(a, b, n, p->f.mbits, em, p->tab, o, h);
		break;
	default: scan_tab8(a, b, n, p->f.mbits, em, p->tab, o, h); break;
	}
}

/* Piece j into its blk; its counts into p->hist when there are several
 * pieces, else left in the calling thread's histogram. */
static int piece_job(void *arg, size_t j)
{
	pairjob *p = arg;
	blk *o = &p->blks[j];
	memset(o, 0, sizeof(*o));
	o->mind = UINT64_MAX;
	uint32_t *h = p->is_float ? clean_hist() : NULL;
	if (p->is_float && !h)
		return pair_fail(p, ulp_arch_err(p->a, -ULP_E_NOMEM, "%s: out of memory for tensor %s", p->a->dir,
		                                 p->in->name));
	ulp_centry *e[2];
	const uint8_t *a, *b;
	size_t len;
	int rc = piece_get(p, j, e, &a, &b, &len);
	if (rc < 0)
		return pair_fail(p, rc);
	scan(p, a, b, len, o, h);
	piece_put(p, e);
	if (h)
		h[0] = 0; /* the unchanged are n - changed (invariant 3) */
	if (p->np > 1 && h && o->mind <= o->maxd) {
		unsigned lo = key_of(o->mind, p->wide), hi = key_of(o->maxd, p->wide);
		pthread_mutex_lock(&p->mu);
		for (unsigned k = lo; k <= hi; k++)
			p->hist[k] += h[k];
		pthread_mutex_unlock(&p->mu);
		memset(h + lo, 0, (size_t)(hi - lo + 1) * sizeof(*h));
	}
	return 0;
}

/* The key holding the distance of rank k (0-based) and the rank within
 * it, from the counts of keys lo..hi (c32 or c64) and the zeros. */
static unsigned rank_key(const uint32_t *c32, const uint64_t *c64, unsigned lo, unsigned hi, uint64_t zeros,
                         uint64_t *k)
{
	if (*k < zeros)
		return 0;
	*k -= zeros;
	unsigned key = lo;
	for (; key < hi; key++) {
		uint64_t c = c32 ? c32[key] : c64[key];
		if (*k < c)
			break;
		*k -= c;
	}
	return key;
}

/* Narrows the distances [lo[i], lo[i] + width[i]) holding rank k[i] (within
 * them) to the one distance, for the wanted i, by passes over the pieces
 * that count 16 bits of the distance at a time (wide formats only). */
static int refine(pairjob *p, uint64_t lo[2], uint64_t width[2], uint64_t k[2])
{
	uint64_t *h = NULL;
	int rc = 0;
	const uint32_t sg32 = 0x80000000u;
	const uint64_t sg64 = (uint64_t)1 << 63;
	while (rc == 0 && (width[0] > 1 || width[1] > 1)) {
		unsigned sh[2];
		for (int i = 0; i < 2; i++) {
			unsigned b = 64u - (unsigned)__builtin_clzll(width[i]) - 1; /* width is a power of two */
			sh[i] = b > 16 ? b - 16 : 0;
		}
		if (!h && !(h = malloc(2 * HIST * sizeof(*h)))) {
			rc = ulp_arch_err(p->a, -ULP_E_NOMEM, "%s: out of memory for tensor %s", p->a->dir, p->in->name);
			break;
		}
		memset(h, 0, 2 * HIST * sizeof(*h));
		for (size_t j = 0; rc == 0 && j < p->np; j++) {
			ulp_centry *e[2];
			const uint8_t *a, *b;
			size_t len;
			if ((rc = piece_get(p, j, e, &a, &b, &len)) < 0)
				break;
			for (size_t x = 0; x < len / p->size; x++) {
				uint64_t d;
				if (p->size == 4) {
					uint32_t u, v;
					memcpy(&u, a + 4 * x, 4);
					memcpy(&v, b + 4 * x, 4);
					uint32_t ou = u & sg32 ? ~u : u | sg32, ov = v & sg32 ? ~v : v | sg32;
					d = ou > ov ? ou - ov : ov - ou;
				} else {
					uint64_t u, v;
					memcpy(&u, a + 8 * x, 8);
					memcpy(&v, b + 8 * x, 8);
					uint64_t ou = u & sg64 ? ~u : u | sg64, ov = v & sg64 ? ~v : v | sg64;
					d = ou > ov ? ou - ov : ov - ou;
				}
				for (int i = 0; i < 2; i++)
					if (width[i] > 1 && d - lo[i] < width[i])
						h[i * HIST + ((d - lo[i]) >> sh[i])]++;
			}
			piece_put(p, e);
		}
		for (int i = 0; rc == 0 && i < 2; i++) {
			if (width[i] <= 1)
				continue;
			unsigned top = (unsigned)((width[i] - 1) >> sh[i]), dg = rank_key(NULL, h + i * HIST, 0, top, 0, &k[i]);
			lo[i] += (uint64_t)dg << sh[i];
			width[i] = (uint64_t)1 << sh[i];
		}
	}
	free(h);
	return rc;
}

/* The figures of one pair into p->in->out (its name left alone). */
static int pair_figures(pairjob *p)
{
	ulp_archive *a = p->a;
	const ulp_pair *in = p->in;
	ulp_tensor_diff *r = in->out;
	p->is_float = fmt_of(in->dtype, &p->f);
	p->size = p->is_float ? p->f.size : ulp_dtype_size((ulp_dtype)in->dtype);
	p->wide = p->size > 2;
	p->n = in->length / p->size;
	r->dtype = in->dtype;
	r->elements = p->n;
	r->changed = r->exponent_moves = 0;
	r->median_ulps = r->p99_ulps = r->max_ulps = 0;
	r->rel_change = r->norm_a = r->norm_diff = NAN;
	r->frac_changed = 0;
	if (p->size == 2 && in->dtype == ULP_DT_F16)
		p->tab = tab_f16;
	else if (p->size == 1 && p->is_float)
		p->tab = in->dtype == ULP_DT_F8_E4M3 ? tab_e4m3 : tab_e5m2;
	if (p->tab)
		pthread_once(&tabs_once, make_tabs);
	if (!in->length)
		return 0;
	/* the chunk geometry of each content: its blob's */
	for (int i = 0; i < 2; i++) {
		const uint8_t *sha = i ? in->sha_b : in->sha_a;
		ulp_centry *be;
		const ulp_blob *b;
		ULP_TRY(ulp_read_blob(a, sha, &be, &b));
		const ulp_blob_info *bi = ulp_blob_get_info(b);
		uint64_t raw = bi->raw_bytes, cb = (uint64_t)bi->chunk_elems * (bi->n_elems ? raw / bi->n_elems : 1);
		ulp_cache_put(a->cache, be);
		if (raw != in->length)
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: tensor %s: a content of %llu bytes for %llu", a->dir,
			                    in->name, (unsigned long long)raw, (unsigned long long)in->length);
		*(i ? &p->cbb : &p->cba) = cb;
	}
	p->pb = ULP_MIN(p->cba, p->cbb); /* both powers of two: invariant 2 */
	if (!p->pb || p->pb % p->size || ULP_MAX(p->cba, p->cbb) % p->pb)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: tensor %s: chunks of %llu and %llu bytes", a->dir, in->name,
		                    (unsigned long long)p->cba, (unsigned long long)p->cbb);
	p->np = (size_t)((in->length + p->pb - 1) / p->pb);
	if (!(p->blks = malloc(p->np * sizeof(*p->blks))) ||
	    (p->np > 1 && p->is_float && !(p->hist = calloc(HIST, sizeof(*p->hist)))))
		return ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory for tensor %s", a->dir, in->name);
	if (p->np == 1) {
		if (piece_job(p, 0) < 0)
			return p->rc;
	} else if (ulp_pool_run(a->pool, p->np, piece_job, p) < 0 || p->rc) {
		return p->rc ? p->rc : -ULP_E_NOMEM;
	}
	blk t = {.mind = UINT64_MAX};
	for (size_t j = 0; j < p->np; j++) { /* invariant 2 */
		const blk *o = &p->blks[j];
		t.changed += o->changed;
		t.emoves += o->emoves;
		t.sa += o->sa;
		t.sd += o->sd;
		t.mind = ULP_MIN(t.mind, o->mind);
		t.maxd = ULP_MAX(t.maxd, o->maxd);
	}
	uint64_t n = p->n;
	r->changed = t.changed;
	r->frac_changed = n ? (double)t.changed / (double)n : 0;
	if (!p->is_float)
		return 0;
	r->exponent_moves = t.emoves;
	r->max_ulps = t.maxd;
	r->norm_a = sqrt(t.sa);
	r->norm_diff = sqrt(t.sd);
	/* NaN where either sum is (a NaN element), as numpy's norms give */
	r->rel_change = isnan(t.sa) || isnan(t.sd) ? NAN : t.sa > 0 ? r->norm_diff / r->norm_a : t.sd > 0 ? NAN : 0;
	if (!t.changed)
		return 0;
	/* the ranks: from the histogram (this thread's for one piece) */
	uint32_t *h32 = p->np == 1 ? clean_hist() : NULL;
	unsigned klo = key_of(t.mind, p->wide), khi = key_of(t.maxd, p->wide);
	uint64_t k[2] = {(n - 1) / 2, (uint64_t)floor(0.99 * (double)(n - 1))}, lo[2], width[2];
	for (int i = 0; i < 2; i++) {
		unsigned key = rank_key(h32, p->hist, klo, khi, n - t.changed, &k[i]);
		if (key == 0) {
			lo[i] = 0, width[i] = 1, k[i] = 0;
		} else {
			key_range(key, p->wide, &lo[i], &width[i]);
		}
	}
	if (h32)
		memset(h32 + klo, 0, (size_t)(khi - klo + 1) * sizeof(*h32)); /* invariant 3 */
	int rc = width[0] > 1 || width[1] > 1 ? refine(p, lo, width, k) : 0;
	if (rc < 0)
		return rc;
	r->median_ulps = lo[0];
	r->p99_ulps = lo[1];
	return 0;
}

typedef struct pairs_ctx {
	ulp_archive *a;
	ulp_pair *v;
} pairs_ctx;

static int pair_job(void *arg, size_t i)
{
	pairs_ctx *c = arg;
	pairjob p = {.a = c->a, .in = &c->v[i]};
	pthread_mutex_init(&p.mu, NULL);
	int rc = pair_figures(&p);
	if (rc < 0 && !p.rc)
		pair_fail(&p, rc);
	c->v[i].rc = p.rc;
	if (p.rc)
		snprintf(c->v[i].msg, sizeof(c->v[i].msg), "%s", p.msg);
	free(p.blks);
	free(p.hist);
	pthread_mutex_destroy(&p.mu);
	return p.rc;
}

int ulp_diff_pairs(ulp_archive *a, ulp_pair *v, size_t n)
{
	pairs_ctx c = {a, v};
	for (size_t i = 0; i < n; i++)
		v[i].rc = 0;
	if (n == 1)
		pair_job(&c, 0);
	else
		ulp_pool_run(a->pool, n, pair_job, &c);
	for (size_t i = 0; i < n; i++)
		if (v[i].rc < 0) /* the first by index: the same message whatever the threads */
			return ulp_arch_err(a, v[i].rc, "%s", v[i].msg);
	return 0;
}

/* ---- files ---------------------------------------------------------------------- */

typedef struct named {
	char *name;
	int dtype;
	uint64_t length;
	uint8_t content[ULP_SHA256_LEN];
} named;

typedef struct nlist {
	named *v;
	size_t n, cap;
} nlist;

static int add_named(void *arg, const char *name, int dtype, uint64_t offset, uint64_t length,
                     const uint8_t content[ULP_SHA256_LEN])
{
	(void)offset;
	nlist *l = arg;
	if (ulp_grow(&l->v, &l->cap, l->n, sizeof(*l->v)) < 0 || !(l->v[l->n].name = strdup(name)))
		return -ULP_E_NOMEM;
	l->v[l->n].dtype = dtype;
	l->v[l->n].length = length;
	memcpy(l->v[l->n].content, content, ULP_SHA256_LEN);
	l->n++;
	return 0;
}

static int named_cmp(const void *x, const void *y)
{
	return strcmp(((const named *)x)->name, ((const named *)y)->name);
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

/* The named tensors of file p, in l. */
static int file_named(ulp_archive *a, const char *p, nlist *l)
{
	ulp_stat st;
	ULP_TRY(ulp_archive_stat(a, p, &st));
	if (st.is_dir)
		return ulp_arch_err(a, -ULP_E_ISDIR, "%s: a directory, not a file", p);
	int rc = ulp_index_file_named(a, p, add_named, l);
	return rc == -ULP_E_NOMEM ? ulp_arch_err(a, rc, "%s: out of memory", p) : rc;
}

int ulp_archive_diff(ulp_archive *a, const char *path_a, const char *path_b, ulp_tensor_diff **out, size_t *n_out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	char pa[ULP_PATH_MAX + 1], pb[ULP_PATH_MAX + 1];
	ULP_TRY(ulp_arch_path(a, path_a, pa, sizeof(pa)));
	ULP_TRY(ulp_arch_path(a, path_b, pb, sizeof(pb)));
	nlist la = {0}, lb = {0};
	ulp_tensor_diff *res = NULL;
	ulp_pair *pv = NULL;
	size_t nr = 0;
	int rc = file_named(a, pa, &la);
	if (rc >= 0)
		rc = file_named(a, pb, &lb);
	if (rc >= 0) {
		if (lb.n)
			qsort(lb.v, lb.n, sizeof(*lb.v), named_cmp);
		if (la.n && (!(res = calloc(la.n, sizeof(*res))) || !(pv = calloc(la.n, sizeof(*pv)))))
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", pa);
	}
	for (size_t i = 0; rc >= 0 && i < la.n; i++) {
		const named *x = &la.v[i], *y = lb.n ? bsearch(x, lb.v, lb.n, sizeof(*lb.v), named_cmp) : NULL;
		if (!y || y->dtype != x->dtype || y->length != x->length)
			continue;
		if (!(res[nr].name = strdup(x->name))) {
			rc = ulp_arch_err(a, -ULP_E_NOMEM, "%s: out of memory", pa);
			break;
		}
		pv[nr] = (ulp_pair){x->content, y->content, x->dtype, x->length, res[nr].name, &res[nr], 0, ""};
		nr++;
	}
	if (rc >= 0 && !nr)
		rc = ulp_arch_err(a, -ULP_E_INVAL, "%s and %s: no tensor of the same name, dtype and size in both", pa, pb);
	if (rc >= 0)
		rc = ulp_diff_pairs(a, pv, nr);
	free(pv);
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
