/* SPDX-License-Identifier: MIT */
/*
 * test_golden.c - frozen blobs of formats v1 and v2 (tests/golden/v1, v2)
 * must still decode to their inputs and pass their content digests, the
 * encoder must still produce them byte for byte (v1 when asked for it) on
 * every CPU path, and
 * the damaged blobs of tests/golden/bad must fail with their exact error.
 *
 *   test_golden            check against $ULP_GOLDEN_DIR
 *   test_golden --regen D  write D/v2 and D/bad (only when the format changes
 *                          on purpose: bump the version and keep the old ones;
 *                          D/v1 is frozen and no longer written)
 */
#include "tap.h"
#include "ulpack.h"
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#define ULP_GOLDEN_ZSTD_VERSION 10504 /* libzstd that wrote the frozen zstd blobs */

typedef struct gcase {
	const char *name;
	ulp_dtype dt;
	size_t n;        /* elements */
	int codec;       /* forced codec, or -1 to let the encoder choose */
	int with_ref;
	int kind;        /* input pattern */
	unsigned chunk_log2; /* 0: 10 */
	unsigned since;  /* first format version with this case (0: 1) */
} gcase;

/* the scalar reference and each SIMD path (skipped where the CPU lacks it) */
static const unsigned cpu_masks[] = {0, ULP_CPU_AVX2, ULP_CPU_AVX2 | ULP_CPU_AVX512, ULP_CPU_NEON};

static const gcase cases[] = {
	{"bf16-delta", ULP_DT_BF16, 5000, -1, 1, 0, 0, 0},
	{"bf16-anchor", ULP_DT_BF16, 3000, -1, 0, 0, 0, 0},
	{"f16-delta", ULP_DT_F16, 4000, ULP_CODEC_DELTA, 1, 0, 0, 0},
	{"f32-delta-chunks", ULP_DT_F32, 3000, ULP_CODEC_DELTA, 1, 0, 0, 0},
	{"f32-anchor", ULP_DT_F32, 2000, ULP_CODEC_ANCHOR, 0, 0, 0, 0},
	{"f64-delta", ULP_DT_F64, 1500, ULP_CODEC_DELTA, 1, 0, 0, 0},
	{"e4m3-delta", ULP_DT_F8_E4M3, 3000, ULP_CODEC_DELTA, 1, 0, 0, 0},
	{"e5m2-anchor", ULP_DT_F8_E5M2, 3000, ULP_CODEC_ANCHOR, 0, 0, 0, 0},
	{"bf16-zstd-xor", ULP_DT_BF16, 2000, ULP_CODEC_ZSTD_XOR, 1, 0, 0, 0},
	{"i64-zstd", ULP_DT_I64, 1000, -1, 0, 1, 0, 0},
	{"bytes-raw", ULP_DT_UNKNOWN, 1500, -1, 0, 2, 0, 0},
	{"bf16-ident", ULP_DT_BF16, 1000, -1, 1, 3, 0, 0},
	{"f32-empty", ULP_DT_F32, 0, -1, 0, 0, 0, 0},
	/* 32 lanes from 16384 elements a chunk (issue 38; 8 before): the
	 * SIMD symbol passes' widest case, pinned */
	{"bf16-delta-32lanes", ULP_DT_BF16, 20000, ULP_CODEC_DELTA, 1, 0, 14, 2},
};

/* Deterministic inputs, independent of tap_rand's other users. */
static void make_input(const gcase *c, uint8_t *x, uint8_t *r)
{
	uint64_t s = 0x1234567ull + (uint64_t)c->n * 31 + (uint64_t)c->dt;
	unsigned es = ulp_dtype_size(c->dt);
	for (size_t i = 0; i < c->n; i++) {
		s = s * 6364136223846793005ull + 1442695040888963407ull;
		uint64_t v = s >> 11;
		uint64_t rv, xv;
		switch (c->kind) {
		case 1: rv = xv = i * 3 + (v & 3); break;           /* integers */
		case 2: rv = xv = v; break;                          /* noise */
		default: {
			/* a float-like value: exponent near the top of its field, small step */
			unsigned w = es * 8;
			uint64_t base = w == 8 ? 0x30 : w == 16 ? 0x3c00 : w == 32 ? 0x3c000000u : 0x3f80000000000000ull;
			rv = base + (v % (w == 8 ? 40 : 5000)) + ((v >> 40 & 1) ? (w == 64 ? 1ull << 63 : 1ull << (w - 1)) : 0);
			xv = c->kind == 3 ? rv : rv + ((v >> 20) % 21) - 10;
		}
		}
		memcpy(x + i * es, &xv, es);
		memcpy(r + i * es, &rv, es);
	}
}

static int encode_case(const gcase *c, unsigned version, uint8_t **blob, size_t *len, uint8_t **x,
                       uint8_t **r)
{
	size_t bytes = c->n * ulp_dtype_size(c->dt);
	*x = malloc(bytes + 1);
	*r = malloc(bytes + 1);
	make_input(c, *x, *r);
	ulp_enc_opts o = {.chunk_log2 = c->chunk_log2 ? c->chunk_log2 : 10, .force_codec = c->codec + 1, .format_version = version};
	size_t cap = ulp_encode_bound(c->dt, bytes, &o);
	*blob = malloc(cap);
	int64_t n = ulp_encode(&o, NULL, c->dt, *blob, cap, *x, bytes, c->with_ref ? *r : NULL,
	                       c->with_ref ? bytes : 0, NULL);
	if (n < 0)
		return (int)n;
	*len = (size_t)n;
	return 0;
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	uint8_t *b = malloc(1 << 20);
	*len = fread(b, 1, 1 << 20, f);
	fclose(f);
	return b;
}

static int spit(const char *path, const void *p, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(p, 1, len, f);
	return fclose(f) == 0 && w == len ? 0 : -1;
}

/* Damaged blobs: derived from bf16-delta; each with its exact error. */
typedef struct bad {
	const char *name;
	int code;
	const char *msg;
} bad;

static const bad bads[] = {
	{"magic", -ULP_E_CORRUPT, "bad magic"},
	/* v1 blobs relabelled v2 fail the header check, which covers the version */
	{"version", -ULP_E_CORRUPT, "header check does not match"},
	{"version3", -ULP_E_VERSION, "version 3"},
	{"short", -ULP_E_CORRUPT, "shorter than any header"},
	{"codec", -ULP_E_CORRUPT, "bad codec"},
	{"header", -ULP_E_CORRUPT, "header check does not match"},
	{"trailing", -ULP_E_CORRUPT, "follow the header"},
	{"payload", -ULP_E_CHECKSUM, "checksum mismatch"},
	{"truncated", -ULP_E_CORRUPT, "follow the header"},
};

static size_t make_bad(const char *name, const uint8_t *good, size_t len, uint8_t *out)
{
	memcpy(out, good, len);
	if (!strcmp(name, "magic"))
		out[0] = 'X';
	else if (!strcmp(name, "version"))
		out[4] = 2;
	else if (!strcmp(name, "version3"))
		out[4] = 3;
	else if (!strcmp(name, "short"))
		return 20;
	else if (!strcmp(name, "codec"))
		out[5] = 9;
	else if (!strcmp(name, "header"))
		out[20] ^= 0x10; /* inside the content sha256 */
	else if (!strcmp(name, "trailing"))
		out[len++] = 0;
	else if (!strcmp(name, "payload"))
		out[len - 1] ^= 0x01;
	else if (!strcmp(name, "truncated"))
		return len - 3;
	return len;
}

static int regen(const char *dir)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/v2", dir);
	mkdir(dir, 0755);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/bad", dir);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/v2/SHA256SUMS", dir);
	FILE *sums = fopen(path, "w");
	if (!sums)
		return 1;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t *b, *x, *r;
		size_t len;
		if (encode_case(&cases[i], 2, &b, &len, &x, &r) < 0)
			return 1;
		snprintf(path, sizeof(path), "%s/v2/%s.blob", dir, cases[i].name);
		if (spit(path, b, len) < 0)
			return 1;
		uint8_t sha[32];
		char hex[65];
		ulp_sha256(b, len, sha);
		ulp_sha256_hex(sha, hex);
		fprintf(sums, "%s  %s.blob\n", hex, cases[i].name);
		free(b);
		free(x);
		free(r);
	}
	fclose(sums);
	/* the damaged blobs stay derived from v1's bf16-delta, as they were */
	uint8_t *first, *x, *r;
	size_t first_len;
	if (encode_case(&cases[0], 1, &first, &first_len, &x, &r) < 0)
		return 1;
	free(x);
	free(r);
	uint8_t *out = malloc(first_len + 16);
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		size_t len = make_bad(bads[i].name, first, first_len, out);
		snprintf(path, sizeof(path), "%s/bad/%s.blob", dir, bads[i].name);
		if (spit(path, out, len) < 0)
			return 1;
	}
	free(out);
	free(first);
	printf("wrote %s\n", dir);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--regen"))
		return regen(argv[2]);
	const char *dir = getenv("ULP_GOLDEN_DIR");
	if (!dir)
		dir = "tests/golden";
	char path[4096];
	uint8_t *bf16_delta = NULL, *bf16_ref = NULL;
	size_t bf16_len = 0;
	for (unsigned v = 1; v <= 2; v++) {
	snprintf(path, sizeof(path), "%s/v%u/SHA256SUMS", dir, v);
	size_t sums_len;
	char *sums = (char *)slurp(path, &sums_len);
	REQUIRE(sums != NULL, "cannot read %s: %s", path, strerror(errno));
	sums[sums_len] = 0;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const gcase *c = &cases[i];
		uint8_t *b, *x, *r;
		size_t len, glen;
		if (v < (c->since ? c->since : 1))
			continue;
		REQUIRE(encode_case(c, v, &b, &len, &x, &r) == 0, "encode %s", c->name);
		snprintf(path, sizeof(path), "%s/v%u/%s.blob", dir, v, c->name);
		uint8_t *g = slurp(path, &glen);
		REQUIRE(g != NULL, "missing golden blob %s", path);
		uint8_t sha[32];
		char hex[65], line[256];
		ulp_sha256(g, glen, sha);
		ulp_sha256_hex(sha, hex);
		snprintf(line, sizeof(line), "%s  %s.blob", hex, c->name);
		CHECK(strstr(sums, line) != NULL, "%s: sha256 of the frozen blob changed", c->name);
		/* zstd's output may change between its versions; ours must not */
		int zstd_codec = glen > 5 && (g[5] == ULP_CODEC_ZSTD || g[5] == ULP_CODEC_ZSTD_XOR);
		if (!zstd_codec || ZSTD_versionNumber() == ULP_GOLDEN_ZSTD_VERSION)
			CHECK(len == glen && memcmp(b, g, len) == 0, "%s: encoder output differs from the frozen blob", c->name);
		/* the same bytes on every CPU path this machine has */
		for (int m = 0; m < 4 && (!zstd_codec || ZSTD_versionNumber() == ULP_GOLDEN_ZSTD_VERSION); m++) {
			if (cpu_masks[m] && (ulp_cpu_features() & cpu_masks[m]) != cpu_masks[m])
				continue;
			unsigned old = ulp_set_cpu_mask(cpu_masks[m]);
			uint8_t *b2, *x2, *r2;
			size_t len2 = 0;
			int erc = encode_case(c, v, &b2, &len2, &x2, &r2);
			ulp_set_cpu_mask(old);
			CHECK(erc == 0 && len2 == glen && memcmp(b2, g, glen) == 0,
			      "v%u/%s: encoder output on cpu mask %u equals the frozen blob", v, c->name, cpu_masks[m]);
			free(b2), free(x2), free(r2);
		}
		size_t bytes = c->n * ulp_dtype_size(c->dt);
		char err[256] = "";
		CHECK(ulp_blob_validate(g, glen, c->with_ref ? r : NULL, c->with_ref ? bytes : 0, 1, err, sizeof(err)) == 0,
		      "%s: frozen blob does not validate: %s", c->name, err);
		ulp_blob *h;
		REQUIRE(ulp_blob_open(g, glen, &h, err, sizeof(err)) == 0, "%s: open: %s", c->name, err);
		uint8_t *out = malloc(bytes + 1);
		int64_t n = ulp_blob_decode(h, NULL, out, bytes, ulp_blob_get_info(h)->has_ref ? r : NULL,
		                            ulp_blob_get_info(h)->has_ref ? bytes : 0);
		CHECK(n == (int64_t)bytes && memcmp(out, x, bytes) == 0, "%s: frozen blob decodes to its input", c->name);
		/* and on every CPU path this machine has */
		for (int m = 0; m < 4; m++) {
			if (cpu_masks[m] && (ulp_cpu_features() & cpu_masks[m]) != cpu_masks[m])
				continue;
			unsigned old = ulp_set_cpu_mask(cpu_masks[m]);
			memset(out, 0, bytes);
			n = ulp_blob_decode(h, NULL, out, bytes, ulp_blob_get_info(h)->has_ref ? r : NULL,
			                    ulp_blob_get_info(h)->has_ref ? bytes : 0);
			ulp_set_cpu_mask(old);
			CHECK(n == (int64_t)bytes && memcmp(out, x, bytes) == 0,
			      "v%u/%s: decodes to its input on cpu mask %u", v, c->name, cpu_masks[m]);
		}
		/* the identity each version names: v1 plain SHA-256, v2 the content digest */
		uint8_t want[32];
		if (v == 1)
			ulp_sha256(x, bytes, want);
		else
			ulp_content_digest(NULL, x, bytes, want);
		CHECK(ulp_blob_get_info(h)->version == v && !memcmp(ulp_blob_get_info(h)->content_sha256, want, 32),
		      "v%u/%s: names its content by the digest of v%u", v, c->name, v);
		CHECK(ulp_blob_decode_verify(h, NULL, out, bytes, ulp_blob_get_info(h)->has_ref ? r : NULL,
		                             ulp_blob_get_info(h)->has_ref ? bytes : 0) == (int64_t)bytes,
		      "v%u/%s: decode_verify passes", v, c->name);
		ulp_blob_close(h);
		free(out);
		if (i == 0 && v == 1) {
			bf16_delta = g;
			bf16_len = glen;
			bf16_ref = r;
			r = NULL;
		} else {
			free(g);
		}
		free(b);
		free(x);
		free(r);
	}
	free(sums);
	}
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		size_t len;
		snprintf(path, sizeof(path), "%s/bad/%s.blob", dir, bads[i].name);
		uint8_t *g = slurp(path, &len);
		REQUIRE(g != NULL, "missing bad blob %s", path);
		char err[256] = "";
		int rc = ulp_blob_validate(g, len, bf16_ref, cases[0].n * 2, 1, err, sizeof(err));
		CHECK(rc == bads[i].code && strstr(err, bads[i].msg), "bad/%s: got %d '%s', want %d '%s'",
		      bads[i].name, rc, err, bads[i].code, bads[i].msg);
		free(g);
	}
	(void)bf16_len;
	free(bf16_delta);
	free(bf16_ref);
	return tap_done();
}
