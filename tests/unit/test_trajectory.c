/* SPDX-License-Identifier: MIT */
/*
 * test_trajectory.c - a real training trajectory (tiny-lm: bf16, fp16, fp32
 * weights and fp32 AdamW moments) round-trips byte for byte, every
 * consecutive pair coded as ULPack deltas, the first step as anchors; and the
 * codec meets its size targets there:
 *  - per dtype, all pairs: ULPack bytes <= 1.03 x the model bound;
 *  - every pair: smaller than zstd -19 on the byte-grouped XOR;
 *  - anchors: no larger than an exponent-entropy coding with raw sign and
 *    mantissa (ZipNN's scheme), plus 1 %.
 * Always on the subset committed under tests/data ($ULP_TEST_DATA_DIR: block
 * 1 of a few steps, see tests/data/README.md), so a fresh clone or a release
 * tarball runs it; then on the whole run of ../shared/data ($ULP_DATA_DIR)
 * when that is present (a note, not a skip, when it is not).
 * ULP_TEST_QUICK=1 (CI's aarch64 run under emulation) keeps the round trips
 * of the first three steps of each dtype and leaves out the size targets (the
 * bytes are those of the full run, which checks them).
 */
#include "tap.h"
#include "ulpack.h"
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <zstd.h>

typedef struct file {
	uint8_t *buf;
	size_t len;
	ulp_st *st;
} file;

static int load(const char *path, file *f)
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return -1;
	fseek(fp, 0, SEEK_END);
	f->len = (size_t)ftell(fp);
	fseek(fp, 0, SEEK_SET);
	f->buf = malloc(f->len);
	size_t got = fread(f->buf, 1, f->len, fp);
	fclose(fp);
	char err[256];
	if (got != f->len || ulp_st_parse(f->buf, f->len, f->len, &f->st, NULL, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: %s\n", path, err);
		return -1;
	}
	return 0;
}

static void unload(file *f)
{
	ulp_st_free(f->st);
	free(f->buf);
}

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* bits of an exponent-entropy coding: n*H(exponent field) + n*(w - E) */
static double zipnn_bits(ulp_dtype dt, const uint8_t *x, size_t n)
{
	unsigned es = ulp_dtype_size(dt), w = es * 8, mant = dt == ULP_DT_BF16 ? 7 : dt == ULP_DT_F16 ? 10 : 23;
	unsigned eb = w - 1 - mant;
	uint64_t *h = calloc((size_t)1 << eb, sizeof(uint64_t));
	for (size_t i = 0; i < n; i++) {
		uint32_t u = 0;
		memcpy(&u, x + i * es, es);
		h[(u >> mant) & ((1u << eb) - 1)]++;
	}
	double bits = (double)n * (w - eb);
	for (size_t e = 0; e < ((size_t)1 << eb); e++)
		if (h[e])
			bits += (double)h[e] * log2((double)n / (double)h[e]);
	free(h);
	return bits;
}

/* Codes every tensor of cur against prev (or standalone when prev is NULL);
 * adds ULPack bytes, bound bits and zstd-19 bytes; checks the round trip. */
static void code_file(const char *label, file *prev, file *cur, uint64_t *ulp, double *bound,
                      uint64_t *z19, double *zipnn)
{
	for (size_t i = 0; i < ulp_st_count(cur->st); i++) {
		const ulp_st_tensor *t = ulp_st_tensor_at(cur->st, i);
		size_t bytes = (size_t)(t->end - t->begin);
		const uint8_t *x = cur->buf + ulp_st_data_offset(cur->st) + t->begin, *r = NULL;
		if (prev) {
			const ulp_st_tensor *p = ulp_st_find(prev->st, t->name);
			REQUIRE(p && p->end - p->begin == bytes, "%s: %s has no reference", label, t->name);
			r = prev->buf + ulp_st_data_offset(prev->st) + p->begin;
		}
		size_t cap = ulp_encode_bound(t->dtype, bytes, NULL);
		uint8_t *blob = malloc(cap), *out = malloc(bytes), *grp = malloc(bytes), *tmp = malloc(bytes);
		ulp_enc_stats st;
		int64_t n = ulp_encode(NULL, NULL, t->dtype, blob, cap, x, bytes, r, r ? bytes : 0, &st);
		REQUIRE(n > 0, "%s: encode %s", label, t->name);
		char err[256] = "";
		CHECK(ulp_blob_validate(blob, (size_t)n, r, r ? bytes : 0, 1, err, sizeof(err)) == 0,
		      "%s: %s does not round-trip: %s", label, t->name, err);
		*ulp += (uint64_t)n;
		*bound += st.bound_bits;
		if (prev && z19) {
			unsigned es = ulp_dtype_size(t->dtype);
			for (size_t b = 0; b < bytes; b++)
				tmp[b] = x[b] ^ r[b];
			for (unsigned j = 0; j < es; j++)
				for (size_t e = 0; e < bytes / es; e++)
					grp[j * (bytes / es) + e] = tmp[e * es + j];
			size_t zc = ZSTD_compressBound(bytes);
			uint8_t *z = malloc(zc);
			size_t zl = ZSTD_compress(z, zc, grp, bytes, 19);
			*z19 += ZSTD_isError(zl) ? bytes : zl;
			free(z);
		}
		if (!prev && zipnn)
			*zipnn += zipnn_bits(t->dtype, x, bytes / ulp_dtype_size(t->dtype));
		free(blob);
		free(out);
		free(grp);
		free(tmp);
	}
}

static void run_dtype(const char *root, const char *sub, const char *fname, int targets)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/tiny-lm/%s", root, sub);
	DIR *d = opendir(path);
	REQUIRE(d != NULL, "cannot open %s", path);
	int steps[64], ns = 0;
	struct dirent *de;
	while ((de = readdir(d)) && ns < 64)
		if (!strncmp(de->d_name, "checkpoint-", 11))
			steps[ns++] = atoi(de->d_name + 11);
	closedir(d);
	qsort(steps, (size_t)ns, sizeof(int), cmp_int);
	REQUIRE(ns >= 1 && (ns >= 2 || !targets), "%s: %d steps", sub, ns);
	const char *quick = getenv("ULP_TEST_QUICK");
	if (quick && *quick && strcmp(quick, "0")) {
		ns = ns < 3 ? ns : 3;
		targets = 0;
	}
	file prev = {0}, cur;
	uint64_t tot_ulp = 0, anchor = 0;
	double tot_bound = 0, zipnn = 0, dummy = 0;
	for (int s = 0; s < ns; s++) {
		snprintf(path, sizeof(path), "%s/tiny-lm/%s/checkpoint-%d/%s", root, sub, steps[s], fname);
		REQUIRE(load(path, &cur) == 0, "load %s", path);
		char label[128];
		snprintf(label, sizeof(label), "%s step %d", sub, steps[s]);
		if (s == 0) {
			code_file(label, NULL, &cur, &anchor, &dummy, NULL, &zipnn);
		} else {
			uint64_t u = 0, z = 0;
			double b = 0;
			code_file(label, &prev, &cur, &u, &b, targets ? &z : NULL, NULL);
			tot_ulp += u;
			tot_bound += b;
			if (targets)
				CHECK(u < z, "%s: ULPack %llu bytes not below zstd-19 byte-grouped XOR %llu", label,
				      (unsigned long long)u, (unsigned long long)z);
			printf("%-16s ulpack %8llu  bound %8.0f  zstd19-bgxor %8llu\n", label,
			       (unsigned long long)u, b / 8, (unsigned long long)z);
			unload(&prev);
		}
		prev = cur;
	}
	unload(&prev);
	if (ns > 1)
		printf("%-16s all pairs: ulpack/bound = %.4f; ", sub, 8.0 * (double)tot_ulp / tot_bound);
	else
		printf("%-16s one step: ", sub);
	printf("anchor %llu bytes vs exponent coding %.0f\n", (unsigned long long)anchor, zipnn / 8);
	if (targets) {
		CHECK(8.0 * (double)tot_ulp <= 1.03 * tot_bound, "%s: ULPack %.4f x the bound", sub,
		      8.0 * (double)tot_ulp / tot_bound);
		CHECK((double)anchor <= 1.01 * zipnn / 8, "%s: anchor %llu bytes above exponent coding %.0f",
		      sub, (unsigned long long)anchor, zipnn / 8);
	}
}

static int have_dir(const char *root)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/tiny-lm", root);
	DIR *d = opendir(path);
	if (d)
		closedir(d);
	return d != NULL;
}

static void run_all(const char *root)
{
	printf("== %s/tiny-lm\n", root);
	run_dtype(root, "bf16", "model.safetensors", 1);
	run_dtype(root, "fp16", "model.safetensors", 1);
	run_dtype(root, "fp32", "model.safetensors", 1);
	run_dtype(root, "optim", "optimizer.safetensors", 0); /* moments: round trip only */
}

int main(void)
{
	const char *small = getenv("ULP_TEST_DATA_DIR"), *full = getenv("ULP_DATA_DIR");
	if (!small)
		small = have_dir("tests/data") ? "tests/data" : "../tests/data";
	if (!full)
		full = "../shared/data";
	/* the committed subset is part of the repository: its absence is a failure */
	REQUIRE(have_dir(small), "no %s/tiny-lm (set ULP_TEST_DATA_DIR)", small);
	run_all(small);
	if (have_dir(full))
		run_all(full);
	else
		printf("note: no %s/tiny-lm: the whole trajectory's checks did not run\n", full);
	return tap_done();
}
