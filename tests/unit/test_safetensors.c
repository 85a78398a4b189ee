/* SPDX-License-Identifier: MIT */
/*
 * test_safetensors.c - the header reader accepts what the format allows and
 * rejects each kind of malformed header with a message naming the cause;
 * the writer's files parse back to the same tensors.
 */
#include "tap.h"
#include "ulpack.h"
#include <string.h>
#include <unistd.h>

/* Builds a file image: u64 length, JSON, then data_len bytes. */
static uint8_t *image(const char *json, size_t data_len, size_t *len)
{
	size_t j = strlen(json);
	uint8_t *b = calloc(1, 8 + j + data_len + 1);
	uint64_t n = j;
	memcpy(b, &n, 8);
	memcpy(b + 8, json, j);
	*len = 8 + j + data_len;
	return b;
}

static int parse(const char *json, size_t data_len, char *err, size_t cap, ulp_st **out)
{
	size_t len;
	uint8_t *b = image(json, data_len, &len);
	ulp_st *st = NULL;
	err[0] = 0;
	int rc = ulp_st_parse(b, len, len, &st, NULL, err, cap);
	free(b);
	if (out)
		*out = st;
	else
		ulp_st_free(st);
	return rc;
}

static void expect_bad(const char *json, size_t data_len, const char *why)
{
	char err[256];
	int rc = parse(json, data_len, err, sizeof(err), NULL);
	CHECK(rc == -ULP_E_CORRUPT && strstr(err, why), "'%s' -> rc %d, message '%s', expected '%s'",
	      json, rc, err, why);
}

int main(void)
{
	char err[256];
	ulp_st *st;
	REQUIRE(parse("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
	              "\"__metadata__\":{\"format\":\"pt\"},"
	              "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[16,18]}}   ",
	              18, err, sizeof(err), &st) == 0, "valid header: %s", err);
	CHECK(ulp_st_count(st) == 2, "two tensors");
	const ulp_st_tensor *a = ulp_st_find(st, "a");
	CHECK(a && a->dtype == ULP_DT_F32 && a->ndim == 2 && a->shape[1] == 2 && a->end == 16, "tensor a");
	CHECK(ulp_st_find(st, "b") && ulp_st_find(st, "b")->ndim == 0, "scalar b");
	ulp_st_free(st);

	REQUIRE(parse("{\"x\\u00e9\\n\":{\"dtype\":\"F8_E4M3\",\"shape\":[3],\"data_offsets\":[0,3],\"extra\":[1,{\"k\":null}]},"
	              "\"q\":{\"dtype\":\"MYSTERY\",\"shape\":[5],\"data_offsets\":[3,10]}}", 10, err,
	              sizeof(err), &st) == 0, "escapes, unknown fields and dtypes: %s", err);
	CHECK(ulp_st_find(st, "x\xc3\xa9\n") != NULL, "escaped name decoded");
	CHECK(ulp_st_find(st, "q") && ulp_st_find(st, "q")->dtype == ULP_DT_UNKNOWN, "unknown dtype kept opaque");
	ulp_st_free(st);
	CHECK(parse("{}", 0, err, sizeof(err), NULL) == 0, "empty header");

	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, "do not match shape");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "outside");
	expect_bad("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, "outside");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
	           "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 8, "overlap");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
	           "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "twice");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 2, "missing data_offsets");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 2, "fraction");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 2, "non-negative integer");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 2, "too large");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 2, "expected '}'");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}} x", 2, "trailing");
	expect_bad("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "UTF-8");
	expect_bad("{\"\xed\xa0\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "UTF-8");
	expect_bad("{\"a\\ud800\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "escape");
	expect_bad("{\"a\\u0000\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2, "NUL");
	expect_bad("{\"__metadata__\":{\"k\":1}}", 0, "must be strings");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"z\":[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}}", 2, "nested");
	expect_bad("[]", 0, "expected '{'");

	/* length prefix */
	uint8_t small[12] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' '};
	CHECK(ulp_st_parse(small, 7, 7, &st, NULL, err, sizeof(err)) == -ULP_E_CORRUPT && strstr(err, "too short"), "7 bytes");
	CHECK(ulp_st_parse(small, 12, 12, &st, NULL, err, sizeof(err)) == 0, "header filling the file: %s", err);
	ulp_st_free(st);
	CHECK(ulp_st_parse(small, 12, 11, &st, NULL, err, sizeof(err)) == -ULP_E_CORRUPT && strstr(err, "past the end"),
	      "header one byte past the end");
	uint64_t huge = (uint64_t)1 << 40;
	memcpy(small, &huge, 8);
	CHECK(ulp_st_parse(small, 12, 12, &st, NULL, err, sizeof(err)) == -ULP_E_CORRUPT && strstr(err, "limit"), "huge length: %s", err);
	huge = 100;
	memcpy(small, &huge, 8);
	CHECK(ulp_st_parse(small, 12, 12, &st, NULL, err, sizeof(err)) == -ULP_E_CORRUPT && strstr(err, "past the end"), "length past end");
	uint64_t need = 0;
	CHECK(ulp_st_parse(small, 12, 200, &st, &need, err, sizeof(err)) == -ULP_E_OVERFLOW && need == 108, "needs more header bytes");

	/* writer round trip */
	char path[] = "/tmp/ulp-st-XXXXXX";
	int fd = mkstemp(path);
	REQUIRE(fd >= 0, "mkstemp");
	close(fd);
	float w[6] = {1, -2, 3.5f, 0, -0.0f, 1e-30f};
	uint16_t h[3] = {0x3f80, 0xbf80, 0x7fc0};
	uint64_t s1[2] = {2, 3}, s2[1] = {3};
	ulp_st_wtensor t[2] = {{"weight \"q\"", ULP_DT_F32, 2, s1, w}, {"bias", ULP_DT_BF16, 1, s2, h}};
	REQUIRE(ulp_st_write(path, t, 2, "{\"format\":\"pt\"}") == 0, "write");
	FILE *f = fopen(path, "rb");
	uint8_t buf[4096];
	size_t len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	unlink(path);
	REQUIRE(ulp_st_parse(buf, len, len, &st, NULL, err, sizeof(err)) == 0, "parse written file: %s", err);
	CHECK(ulp_st_data_offset(st) % 8 == 0, "header padded to 8");
	const ulp_st_tensor *q = ulp_st_find(st, "weight \"q\"");
	CHECK(q && !memcmp(buf + ulp_st_data_offset(st) + q->begin, w, sizeof(w)), "data of weight");
	CHECK(!memcmp(ulp_st_header_bytes(st), buf, ulp_st_data_offset(st)), "header kept verbatim");
	ulp_st_free(st);
	return tap_done();
}
