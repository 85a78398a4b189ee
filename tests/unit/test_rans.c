/* SPDX-License-Identifier: MIT */
/*
 * test_rans.c - the coder's pieces: the reciprocal division is exact for
 * every frequency, tables normalize, serialize and parse back identically,
 * hostile tables are rejected, and chunk streams round-trip for skewed,
 * uniform and single-symbol distributions at every lane count. DELTA streams
 * of BF16, F16 and F32 decode identically on every CPU path at every lane
 * count, and a reference element whose context has no table row is reported
 * by each path.
 */
#include "tap.h"
#include "codec.h"
#include <string.h>

/* The encoder's fold equals ((x / f) << n) + (x % f) + cum for every f and
 * the x it can meet (below x_max <= 2^31). */
static void test_reciprocal(void)
{
	int bad = 0;
	for (unsigned n = ULP_PROB_BITS_MIN; n <= ULP_PROB_BITS_MAX; n++)
		for (uint32_t f = 1; f <= (1u << n) && bad < 10; f++) {
			ulp_rans_esym s;
			uint32_t cum = (1u << n) - f;
			ulp_rans_esym_init(&s, cum, f, n);
			uint32_t probes[] = {ULP_RANS_L >> 4, ULP_RANS_L, ULP_RANS_L + 1, s.x_max - 1,
			                     (s.x_max / f) * f, (s.x_max / f) * f - 1, 1};
			for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]) + 64; i++) {
				uint32_t x = i < sizeof(probes) / sizeof(probes[0]) ? probes[i]
				                                                   : 1 + (uint32_t)(tap_rand() % (s.x_max - 1));
				uint32_t q = (uint32_t)(((uint64_t)x * s.rcp) >> 32) >> s.rshift;
				uint32_t got = x + s.bias + q * s.cmpl;
				uint32_t want = ((x / f) << n) + (x % f) + cum;
				if (got != want)
					bad++;
			}
		}
	CHECK(bad == 0, "%d folds wrong", bad);
}

static void fill_counts(uint64_t *c, unsigned n_ctx, unsigned a, int kind)
{
	memset(c, 0, sizeof(uint64_t) * n_ctx * a);
	for (unsigned x = 0; x < n_ctx; x++) {
		if (kind == 0 && (tap_rand() & 1))
			continue; /* sparse contexts */
		for (unsigned s = 0; s < a; s++) {
			switch (kind) {
			case 0: c[x * a + s] = (tap_rand() % 4 == 0) ? tap_rand() % 100000 : 0; break;
			case 1: c[x * a + s] = 1000; break;
			case 2: c[x * a + s] = s == (x % a) ? 5000000 : (s == 0 ? 1 : 0); break;
			default: c[x * a + s] = (uint64_t)1 << (s % 30); break;
			}
		}
	}
}

static void test_tables(void)
{
	const unsigned n_ctx = 64, a = 60;
	uint64_t *c = malloc(sizeof(uint64_t) * n_ctx * a);
	for (int kind = 0; kind < 4; kind++) {
		ulp_table t, u;
		uint64_t cost;
		fill_counts(c, n_ctx, a, kind);
		REQUIRE(ulp_table_choose(c, n_ctx, a, &t, &cost) == 0, "choose kind %d", kind);
		/* every used context has a row; every row sums to 2^n and covers its counts */
		int ok = 1;
		for (unsigned x = 0; x < n_ctx; x++) {
			uint64_t tot = 0;
			for (unsigned s = 0; s < a; s++)
				tot += c[x * a + s];
			if (!tot)
				continue;
			if (t.ctx_row[x] == ULP_CTX_UNUSED) {
				ok = 0;
				continue;
			}
			const uint16_t *f = t.freq + (size_t)t.ctx_row[x] * 256;
			for (unsigned s = 0; s < a; s++)
				if (c[x * a + s] && !f[s])
					ok = 0;
		}
		for (unsigned r = 0; r < t.n_rows; r++) {
			uint32_t sum = 0;
			for (unsigned s = 0; s < 256; s++)
				sum += t.freq[r * 256 + s];
			if (sum != 1u << t.prob_bits)
				ok = 0;
		}
		CHECK(ok, "table kind %d covers its counts", kind);
		size_t len = ulp_table_size(&t);
		uint8_t *buf = malloc(len);
		CHECK(ulp_table_write(&t, buf, len) == (int64_t)len, "write");
		ulp_err err = {0};
		REQUIRE(ulp_table_read(buf, len, t.prob_bits, a, n_ctx, &u, &err) == 0, "read back kind %d", kind);
		CHECK(u.n_rows == t.n_rows && !memcmp(u.freq, t.freq, t.n_rows * 256 * 2) &&
		      !memcmp(u.ctx_row, t.ctx_row, n_ctx * 2), "table kind %d identical after parse", kind);
		/* every truncation and every single-bit flip: rejected or a valid table */
		int crashes_none = 1;
		for (size_t l = 0; l < len; l++) {
			ulp_table v;
			if (ulp_table_read(buf, l, t.prob_bits, a, n_ctx, &v, &err) == 0) {
				crashes_none = 0; /* a strict prefix must never parse */
				ulp_table_free(&v);
			}
		}
		CHECK(crashes_none, "truncated tables rejected (kind %d)", kind);
		for (size_t bit = 0; bit < len * 8; bit++) {
			ulp_table v;
			buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
			if (ulp_table_read(buf, len, t.prob_bits, a, n_ctx, &v, &err) == 0) {
				for (unsigned r = 0; r < v.n_rows; r++) {
					uint32_t sum = 0;
					for (unsigned s = 0; s < 256; s++)
						sum += v.freq[r * 256 + s];
					if (sum != 1u << v.prob_bits)
						crashes_none = 0;
				}
				ulp_table_free(&v);
			}
			buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		}
		CHECK(crashes_none, "bit-flipped tables either rejected or valid (kind %d)", kind);
		free(buf);
		ulp_table_free(&t);
		ulp_table_free(&u);
	}
	free(c);
}

/* Proportional rounding is exact: f[s] = round(c m / total) for every symbol
 * but the most frequent (which takes the correction) whenever that suffices,
 * for counts up to 2^39, where normalize's reciprocal estimate (a double) is
 * furthest from the 64-bit division it replaces. */
static void test_normalize_exact(void)
{
	int bad = 0, tried = 0;
	for (int round = 0; round < 400; round++) {
		const unsigned a = 60;
		uint64_t c[60];
		unsigned shift = (unsigned)(tap_rand() % 40);
		for (unsigned s = 0; s < a; s++)
			c[s] = (tap_rand() % 3) ? (tap_rand() >> 24) >> (63 - 40 + shift % 24) << (shift / 24) : 0;
		c[tap_rand() % a] |= (uint64_t)1 << shift; /* at least one symbol */
		ulp_table t;
		uint64_t cost;
		if (ulp_table_choose(c, 1, a, &t, &cost) != 0) {
			bad++;
			continue;
		}
		const unsigned n = t.prob_bits;
		const uint64_t m = 1u << n;
		uint64_t total = 0, v[60];
		int64_t sum = 0;
		for (unsigned s = 0; s < a; s++)
			total += c[s];
		unsigned top = 0;
		for (unsigned s = 0; s < a; s++) {
			v[s] = 0;
			if (c[s]) {
				v[s] = (uint64_t)(((unsigned __int128)c[s] * m * 2 + total) / ((unsigned __int128)total * 2));
				v[s] = v[s] < 1 ? 1 : v[s] > m ? m : v[s];
			}
			sum += (int64_t)v[s];
			if (v[s] > v[top])
				top = s;
		}
		int64_t ft = (int64_t)v[top] - (sum - (int64_t)m);
		if (t.n_rows == 1 && ft >= 1 && ft <= (int64_t)m) {
			tried++;
			v[top] = (uint64_t)ft;
			for (unsigned s = 0; s < a; s++)
				bad += t.freq[s] != v[s];
		}
		ulp_table_free(&t);
	}
	CHECK(tried > 100 && bad == 0, "normalize: %d of %d rows rounded differently", bad, tried);
}

/* the scalar reference and each SIMD path (skipped where the CPU lacks it) */
static const unsigned masks[] = {0, ULP_CPU_AVX2, ULP_CPU_AVX2 | ULP_CPU_AVX512, ULP_CPU_NEON};

/* ANCHOR chunks of F32 with a chosen distribution of exponent symbols */
static void test_streams(void)
{
	ulp_fmt f;
	ulp_fmt_get(ULP_DT_F32, &f);
	const size_t n = 5000;
	uint32_t *x = malloc(n * 4), *y = malloc(n * 4);
	uint8_t *syms = malloc(n);
	for (int dist = 0; dist < 4; dist++)
		for (unsigned ll = 0; ll <= 5; ll++) {
			unsigned lanes = 1u << ll;
			uint64_t counts[256] = {0};
			for (size_t i = 0; i < n; i++) {
				uint32_t e;
				switch (dist) {
				case 0: e = 127; break;                            /* one symbol */
				case 1: e = (uint32_t)(tap_rand() & 255); break;   /* uniform */
				case 2: e = (tap_rand() % 1000) ? 120 : (uint32_t)(tap_rand() & 255); break;
				default: e = 100 + (uint32_t)(tap_rand() % 3); break;
				}
				x[i] = (uint32_t)(tap_rand() & 0x807fffffu) | e << 23;
			}
			size_t rc = ulp_chunk_rans_bound(n, lanes), wc = ulp_chunk_raw_bound(&f, n);
			uint8_t *rb = malloc(rc), *wb = malloc(wc);
			uint64_t bits;
			ulp_pass1(&f, 1, x, NULL, n, syms, counts, wb, wc, &bits);
			ulp_table t;
			ulp_rans_esym *es;
			ulp_dtab d;
			uint64_t cost;
			REQUIRE(ulp_table_choose(counts, 1, 256, &t, &cost) == 0, "choose");
			REQUIRE(ulp_table_esyms(&t, &es) == 0 && ulp_dtab_build(&t, &d) == 0, "views");
			size_t rl;
			REQUIRE(ulp_chunk_encode(&f, &t, es, NULL, lanes, syms, NULL, n, rb, rc, &rl) == 0, "encode");
			/* every SIMD encoder writes the scalar encoder's bytes */
			for (int m = 1; m < 4; m++) {
				if ((ulp_cpu_features() & masks[m]) != masks[m])
					continue;
				unsigned old = ulp_set_cpu_mask(masks[m]);
				uint64_t *es64 = ulp_esyms_pack(&t, es);
				uint8_t *rb2 = malloc(rc);
				size_t rl2 = 0;
				REQUIRE(ulp_chunk_encode(&f, &t, es, es64, lanes, syms, NULL, n, rb2, rc, &rl2) == 0, "encode");
				CHECK(rl2 == rl && memcmp(rb, rb2, rl) == 0, "anchor dist %d, %u lanes: encoder bytes on cpu mask %u identical",
				      dist, lanes, masks[m]);
				ulp_set_cpu_mask(old);
				free(rb2);
				free(es64);
			}
			ulp_err err = {0};
			int r = ulp_chunk_decode(&f, &d, lanes, rb, rl, wb, (size_t)((bits + 7) / 8), bits, NULL, n, y, &err);
			CHECK(r == 0 && memcmp(x, y, n * 4) == 0, "stream dist %d lanes %u", dist, lanes);
			/* damage: a changed final state or a missing word is detected */
			if (rl > 4 * lanes + 2) {
				CHECK(ulp_chunk_decode(&f, &d, lanes, rb, rl - 2, wb, (size_t)((bits + 7) / 8), bits, NULL, n, y, &err) < 0,
				      "short rANS stream detected (dist %d lanes %u)", dist, lanes);
			}
			CHECK(ulp_chunk_decode(&f, &d, lanes, rb, rl, wb, (size_t)((bits + 7) / 8) + 1, bits + 8, NULL, n, y, &err) < 0,
			      "extra raw bits detected");
			free(rb);
			free(wb);
			free(es);
			ulp_dtab_free(&d);
			ulp_table_free(&t);
		}
	free(x);
	free(y);
	free(syms);
}

/* Fills a reference of n elements whose exponent fields take a few values,
 * and x close to it in ULPs (some far), for a w-bit dtype. */
static void make_delta_pair(const ulp_fmt *f, size_t n, void *xv, void *rv)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t e = (uint64_t)((1u << (f->ebits - 1)) - 4 + tap_rand() % 5);
		uint64_t mant = tap_rand() & (((uint64_t)1 << f->mshift) - 1);
		uint64_t r = e << f->mshift | mant | (tap_rand() & 1 ? (uint64_t)1 << (f->w - 1) : 0);
		uint64_t d = tap_rand() % 100 ? tap_rand() % 64 : tap_rand();
		uint64_t x = r + d;
		if (f->w == 16) {
			((uint16_t *)rv)[i] = (uint16_t)r;
			((uint16_t *)xv)[i] = (uint16_t)x;
		} else {
			((uint32_t *)rv)[i] = (uint32_t)r;
			((uint32_t *)xv)[i] = (uint32_t)x;
		}
	}
}

static void test_delta_streams(void)
{
	const ulp_dtype dts[] = {ULP_DT_BF16, ULP_DT_F16, ULP_DT_F32};
	const size_t n = 70001; /* not a multiple of 64: every kernel leaves a tail; above
	                           65536: pass 1 counts into its four tables */
	for (int k = 0; k < 3; k++) {
		ulp_fmt f;
		ulp_fmt_get(dts[k], &f);
		size_t es_ = f.w / 8;
		uint8_t *x = malloc(n * es_), *r = malloc(n * es_), *y = malloc(n * es_);
		uint8_t *syms = malloc(n);
		uint64_t *counts = calloc((size_t)f.n_ctx * f.alphabet, sizeof(uint64_t));
		make_delta_pair(&f, n, x, r);
		size_t wc = ulp_chunk_raw_bound(&f, n);
		uint8_t *wb = malloc(wc);
		uint64_t bits, cost;
		ulp_pass1(&f, 0, x, r, n, syms, counts, wb, wc, &bits);
		/* pass 1 on every CPU path: the same symbols, counts and raw tail */
		for (int m = 0; m < 4; m++) {
			const unsigned pm = masks[m];
			if (pm && (ulp_cpu_features() & pm) != pm)
				continue;
			uint8_t *s2 = malloc(n), *w2 = malloc(wc);
			uint64_t *c2 = calloc((size_t)f.n_ctx * f.alphabet, sizeof(uint64_t)), bits2;
			unsigned old = ulp_set_cpu_mask(pm);
			ulp_pass1(&f, 0, x, r, n, s2, c2, w2, wc, &bits2);
			ulp_set_cpu_mask(old);
			CHECK(bits2 == bits && !memcmp(s2, syms, n) && !memcmp(w2, wb, (size_t)((bits + 7) / 8)) &&
			      !memcmp(c2, counts, (size_t)f.n_ctx * f.alphabet * sizeof(uint64_t)),
			      "w%u pass 1 with cpu mask %u equals the default path's", f.w, pm);
			free(s2), free(w2), free(c2);
		}
		ulp_table t;
		ulp_rans_esym *es;
		ulp_dtab d;
		REQUIRE(ulp_table_choose(counts, f.n_ctx, f.alphabet, &t, &cost) == 0, "choose");
		REQUIRE(ulp_table_esyms(&t, &es) == 0 && ulp_dtab_build(&t, &d) == 0, "views");
		for (unsigned ll = 0; ll <= 5; ll++) {
			unsigned lanes = 1u << ll;
			size_t rc = ulp_chunk_rans_bound(n, lanes), rl;
			uint8_t *rb = malloc(rc);
			REQUIRE(ulp_chunk_encode(&f, &t, es, NULL, lanes, syms, r, n, rb, rc, &rl) == 0, "encode");
			/* every SIMD encoder (AVX2: 8 to 32 lanes, AVX-512: 32) writes
			 * the scalar encoder's bytes */
			for (int m = 1; m < 4; m++) {
				if ((ulp_cpu_features() & masks[m]) != masks[m])
					continue;
				unsigned old = ulp_set_cpu_mask(masks[m]);
				uint64_t *es64 = ulp_esyms_pack(&t, es);
				uint8_t *rb2 = malloc(rc);
				size_t rl2 = 0;
				REQUIRE(ulp_chunk_encode(&f, &t, es, es64, lanes, syms, r, n, rb2, rc, &rl2) == 0, "encode");
				CHECK(rl2 == rl && memcmp(rb, rb2, rl) == 0, "w%u delta, %u lanes: encoder bytes on cpu mask %u identical",
				      f.w, lanes, masks[m]);
				ulp_set_cpu_mask(old);
				free(rb2);
				free(es64);
			}
			for (int m = 0; m < 4; m++) {
				if (masks[m] && (ulp_cpu_features() & masks[m]) != masks[m])
					continue;
				unsigned old = ulp_set_cpu_mask(masks[m]);
				char msg[160] = "";
				ulp_err err = {msg, sizeof(msg)};
				memset(y, 0, n * es_);
				int rcd = ulp_chunk_decode(&f, &d, lanes, rb, rl, wb, (size_t)((bits + 7) / 8),
				                           bits, r, n, y, &err);
				CHECK(rcd == 0 && memcmp(x, y, n * es_) == 0, "w%u delta, %u lanes, cpu mask %u",
				      f.w, lanes, masks[m]);
				/* a stream one word short: its last block decodes from the
				 * zero-padded copy and the shortage is reported */
				rcd = ulp_chunk_decode(&f, &d, lanes, rb, rl - 2, wb, (size_t)((bits + 7) / 8),
				                       bits, r, n, y, &err);
				CHECK(rcd < 0, "w%u delta, %u lanes, cpu mask %u: short rANS stream detected (%s)",
				      f.w, lanes, masks[m], msg);
				/* an element whose reference context has no row, late in the chunk */
				uint8_t save[4];
				memcpy(save, r + 3001 * es_, es_);
				uint64_t bad = (uint64_t)((1u << f.ebits) - 1) << f.mshift;
				memcpy(r + 3001 * es_, &bad, es_);
				rcd = ulp_chunk_decode(&f, &d, lanes, rb, rl, wb, (size_t)((bits + 7) / 8), bits,
				                       r, n, y, &err);
				CHECK(rcd < 0 && strstr(msg, "element 3001: reference exponent"),
				      "w%u, %u lanes, mask %u: unused context reported (%s)", f.w, lanes, masks[m], msg);
				/* the same with an unused context next to used ones (one
				 * 16-context piece of the SIMD row lookups) */
				unsigned cu = ULP_CTX_MAX;
				for (unsigned c = 0; c < f.n_ctx && c < 256 && cu == ULP_CTX_MAX; c++)
					if (t.ctx_row[c] == ULP_CTX_UNUSED)
						for (unsigned c2 = c & ~15u; c2 < (c | 15u) && c2 < f.n_ctx; c2++)
							if (t.ctx_row[c2] != ULP_CTX_UNUSED)
								cu = c;
				if (cu != ULP_CTX_MAX) {
					bad = (uint64_t)cu << f.mshift;
					memcpy(r + 3001 * es_, &bad, es_);
					rcd = ulp_chunk_decode(&f, &d, lanes, rb, rl, wb, (size_t)((bits + 7) / 8),
					                       bits, r, n, y, &err);
					CHECK(rcd < 0 && strstr(msg, "element 3001: reference exponent"),
					      "w%u, %u lanes, mask %u: unused context %u beside used ones reported (%s)",
					      f.w, lanes, masks[m], cu, msg);
				}
				memcpy(r + 3001 * es_, save, es_);
				ulp_set_cpu_mask(old);
			}
			free(rb);
		}
		free(es);
		ulp_dtab_free(&d);
		ulp_table_free(&t);
		free(x), free(r), free(y), free(syms), free(counts), free(wb);
	}
}

/* 8-lane 16-bit DELTA decodes a block's reconstruction during the next
 * block's symbol pass (AVX2): chunk lengths around the 2048-element blocks
 * (a last block under 32 elements leaves the whole pending reconstruction
 * to the caller), every path equal to the encoded elements, and an unused
 * context in the last block reported while a reconstruction is pending. */
static void test_block_overlap(void)
{
	const size_t ns[] = {4096 + 5, 6144 - 1, 6144 + 40, 4096 + 31};
	ulp_fmt f;
	ulp_fmt_get(ULP_DT_BF16, &f);
	for (int k = 0; k < 4; k++) {
		const size_t n = ns[k];
		uint16_t *x = malloc(n * 2), *r = malloc(n * 2), *y = malloc(n * 2);
		uint8_t *syms = malloc(n);
		uint64_t *counts = calloc((size_t)f.n_ctx * f.alphabet, sizeof(uint64_t));
		make_delta_pair(&f, n, x, r);
		size_t wc = ulp_chunk_raw_bound(&f, n), rc = ulp_chunk_rans_bound(n, 8), rl;
		uint8_t *wb = malloc(wc), *rb = malloc(rc);
		uint64_t bits, cost;
		ulp_pass1(&f, 0, x, r, n, syms, counts, wb, wc, &bits);
		ulp_table t;
		ulp_rans_esym *es;
		ulp_dtab d;
		REQUIRE(ulp_table_choose(counts, f.n_ctx, f.alphabet, &t, &cost) == 0, "choose");
		REQUIRE(ulp_table_esyms(&t, &es) == 0 && ulp_dtab_build(&t, &d) == 0, "views");
		REQUIRE(ulp_chunk_encode(&f, &t, es, NULL, 8, syms, r, n, rb, rc, &rl) == 0, "encode");
		for (int m = 0; m < 4; m++) {
			if (masks[m] && (ulp_cpu_features() & masks[m]) != masks[m])
				continue;
			unsigned old = ulp_set_cpu_mask(masks[m]);
			char msg[160] = "";
			ulp_err err = {msg, sizeof(msg)};
			memset(y, 0, n * 2);
			int rcd = ulp_chunk_decode(&f, &d, 8, rb, rl, wb, (size_t)((bits + 7) / 8), bits, r, n, y, &err);
			CHECK(rcd == 0 && memcmp(x, y, n * 2) == 0, "%zu elements, 8 lanes, cpu mask %u: decoded", n,
			      masks[m]);
			const size_t e = n - 3;
			uint16_t save = r[e];
			r[e] = (uint16_t)(((1u << f.ebits) - 1) << f.mshift);
			char want[64];
			snprintf(want, sizeof(want), "element %zu: reference exponent", e);
			rcd = ulp_chunk_decode(&f, &d, 8, rb, rl, wb, (size_t)((bits + 7) / 8), bits, r, n, y, &err);
			CHECK(rcd < 0 && strstr(msg, want), "%zu elements, mask %u: unused context in the last block (%s)",
			      n, masks[m], msg);
			r[e] = save;
			ulp_set_cpu_mask(old);
		}
		free(es);
		ulp_dtab_free(&d);
		ulp_table_free(&t);
		free(x), free(r), free(y), free(syms), free(counts), free(wb), free(rb);
	}
}

int main(void)
{
	test_reciprocal();
	test_normalize_exact();
	test_tables();
	test_streams();
	test_delta_streams();
	test_block_overlap();
	return tap_done();
}
