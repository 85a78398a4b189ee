/* SPDX-License-Identifier: MIT */
/*
 * test_torchzip.c - torch.save zip files: the reader on real files written by
 * torch 1.13 (tests/data/torch, see its README), the same files made hostile
 * (each must be refused by the reader, stored opaque and read back
 * byte-identical), a ZIP64 rewrite, archiving a run (storages coded as
 * tensors, deltas between steps, byte-identical reads of any range, verify)
 * and a read of one storage decoding only that storage; hostile pickles
 * (lists, memo, marks, nesting, long names) parse or are refused within the
 * parser's memory bound, and give the memory back.
 */
#include "tap.h"
#include "torchzip.h"
#include "ulpack.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char root[512], datadir[1024];

typedef struct buf {
	uint8_t *p;
	size_t n;
} buf;

static buf load(const char *rel)
{
	char path[2048];
	snprintf(path, sizeof(path), "%s/%s", datadir, rel);
	FILE *f = fopen(path, "rb");
	REQUIRE(f, "open %s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf b = {malloc((size_t)n + 1), (size_t)n};
	REQUIRE(b.p && fread(b.p, 1, b.n, f) == b.n, "read %s", path);
	fclose(f);
	return b;
}

static buf copy(buf b)
{
	buf c = {malloc(b.n + 1), b.n};
	memcpy(c.p, b.p, b.n);
	return c;
}

static const ulp_tz_storage *find(const ulp_tz *z, const char *name)
{
	for (size_t i = 0; i < ulp_tz_count(z); i++)
		if (!strcmp(ulp_tz_at(z, i)->name, name))
			return ulp_tz_at(z, i);
	return NULL;
}

/* ---- ZIP surgery ------------------------------------------------------- */

static size_t eocd_pos(buf b)
{
	for (size_t i = b.n - 22;; i--) {
		if (ulp_ld32(b.p + i) == 0x06054b50)
			return i;
		REQUIRE(i > 0, "no end record");
	}
}

/* The central directory header and local header of the entry whose name
 * ends with suffix. */
static void entry(buf b, const char *suffix, size_t *cd, size_t *lh)
{
	size_t e = eocd_pos(b), at = ulp_ld32(b.p + e + 16), sl = strlen(suffix);
	for (unsigned i = 0; i < ulp_ld16(b.p + e + 10); i++) {
		size_t nl = ulp_ld16(b.p + at + 28);
		if (nl >= sl && !memcmp(b.p + at + 46 + nl - sl, suffix, sl)) {
			*cd = at;
			*lh = ulp_ld32(b.p + at + 42);
			return;
		}
		at += 46 + nl + ulp_ld16(b.p + at + 30) + ulp_ld16(b.p + at + 32);
	}
	REQUIRE(0, "no entry %s", suffix);
}

static void add_size(buf b, const char *suffix, int delta, int local_too)
{
	size_t cd, lh;
	entry(b, suffix, &cd, &lh);
	ulp_st32(b.p + cd + 20, ulp_ld32(b.p + cd + 20) + (uint32_t)delta);
	ulp_st32(b.p + cd + 24, ulp_ld32(b.p + cd + 24) + (uint32_t)delta);
	if (local_too) {
		ulp_st32(b.p + lh + 18, ulp_ld32(b.p + lh + 18) + (uint32_t)delta);
		ulp_st32(b.p + lh + 22, ulp_ld32(b.p + lh + 22) + (uint32_t)delta);
	}
}

/* The same archive with its end records rewritten: a ZIP64 end record
 * (replacing any there is; torch writes one) and saturated 32-bit fields. */
static buf to_zip64(buf b, int lie)
{
	size_t e = eocd_pos(b), s = e;
	if (e >= 20 && ulp_ld32(b.p + e - 20) == 0x07064b50)
		s = (size_t)ulp_ld64(b.p + e - 12);
	buf z = {calloc(1, s + 98), s + 98};
	memcpy(z.p, b.p, s);
	uint8_t *r = z.p + s, *l = r + 56, *o = l + 20;
	ulp_st32(r, 0x06064b50);
	ulp_st64(r + 4, 44);
	ulp_st16(r + 12, 45);
	ulp_st16(r + 14, 45);
	ulp_st64(r + 24, ulp_ld16(b.p + e + 10));
	ulp_st64(r + 32, ulp_ld16(b.p + e + 10) + (lie == 1));
	ulp_st64(r + 40, ulp_ld32(b.p + e + 12));
	ulp_st64(r + 48, ulp_ld32(b.p + e + 16) + (lie == 2 ? 4 : 0));
	ulp_st32(l, 0x07064b50);
	ulp_st64(l + 8, s);
	ulp_st32(l + 16, 1);
	memcpy(o, b.p + e, 22);
	ulp_st16(o + 8, 0xFFFF);
	ulp_st16(o + 10, 0xFFFF);
	ulp_st32(o + 12, 0xFFFFFFFF);
	ulp_st32(o + 16, 0xFFFFFFFF);
	return z;
}

/* ---- archiving helpers ------------------------------------------------ */

static int put_buf(ulp_archive *a, const char *path, buf b)
{
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s/in", root);
	int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
	REQUIRE(fd >= 0 && write(fd, b.p, b.n) == (ssize_t)b.n, "write %s", tmp);
	int rc = ulp_archive_put(a, path, fd, NULL, NULL);
	close(fd);
	return rc;
}

/* Reads path back in pieces of random sizes; 1 if identical to b. */
static int same(ulp_archive *a, const char *path, buf b)
{
	ulp_file *f;
	if (ulp_file_open(a, path, &f) < 0)
		return 0;
	uint8_t *got = malloc(b.n + 1);
	size_t at = 0;
	int ok = ulp_file_get_stat(f)->size == b.n;
	while (ok && at < b.n) {
		size_t n = 1 + (size_t)(tap_rand() % 3000);
		int64_t r = ulp_file_pread(f, got + at, n, at);
		ok = r > 0;
		at += r > 0 ? (size_t)r : 0;
	}
	ok = ok && at == b.n && memcmp(got, b.p, b.n) == 0;
	if (!ok) {
		size_t i = 0;
		while (i < b.n && got[i] == b.p[i])
			i++;
		fprintf(stderr, "%s: forward read differs at %zu of %zu (read to %zu)\n", path, i, b.n, at);
	}
	/* and backwards, a piece at a time from the end */
	for (size_t end = b.n; ok && end > 0;) {
		size_t n = 1 + (size_t)(tap_rand() % 700);
		n = ULP_MIN(end, n);
		int64_t r = ulp_file_pread(f, got, n, end - n);
		ok = r == (int64_t)n && memcmp(got, b.p + end - n, n) == 0;
		if (!ok)
			fprintf(stderr, "%s: read of %zu at %zu: %lld\n", path, n, end - n, (long long)r);
		end -= n;
	}
	free(got);
	ulp_file_close(f);
	return ok;
}

static ulp_archive *open_archive(const char *name, int init)
{
	char dir[700], err[512];
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	if (init)
		REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive *a;
	ulp_archive_opts o = {.cache_size = 64 << 20, .threads = 2};
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	return a;
}

/* ---- tests ------------------------------------------------------------- */

static void test_parse_real(void)
{
	buf b = load("small.pt");
	ulp_tz *z;
	char why[256] = "";
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "small.pt: %s", why);
	/* 15 tensors: the empty one has no bytes, the view shares "base" */
	CHECK(ulp_tz_count(z) == 14, "%zu storages", ulp_tz_count(z));
	static const struct { const char *name; ulp_dtype dt; uint64_t len; } want[] = {
		{"model.layers.0.weight", ULP_DT_F32, 48 * 32 * 4}, {"model.layers.0.bias", ULP_DT_F32, 48 * 4},
		{"model.emb", ULP_DT_BF16, 1600 * 2}, {"model.half", ULP_DT_F16, 37 * 2},
		{"model.double", ULP_DT_F64, 40}, {"model.ids", ULP_DT_I64, 160}, {"model.i32", ULP_DT_I32, 28},
		{"model.i16", ULP_DT_I16, 18}, {"model.i8", ULP_DT_I8, 11}, {"model.u8", ULP_DT_U8, 13},
		{"model.mask", ULP_DT_BOOL, 50}, {"model.param", ULP_DT_F32, 256}, {"base", ULP_DT_F32, 8192},
		{"list.0", ULP_DT_F32, 12},
	};
	for (size_t i = 0; i < ULP_ARRAY_LEN(want); i++) {
		const ulp_tz_storage *s = find(z, want[i].name);
		CHECK(s && s->dtype == want[i].dt && s->length == want[i].len, "%s", want[i].name);
	}
	uint64_t prev = 0;
	for (size_t i = 0; i < ulp_tz_count(z); i++) {
		const ulp_tz_storage *s = ulp_tz_at(z, i);
		CHECK(s->offset >= prev && s->offset + s->length <= b.n, "storage %zu in order", i);
		CHECK(s->offset % 64 == 0, "torch aligns records' data to 64 bytes");
		prev = s->offset + s->length;
	}
	ulp_tz_free(z);
	free(b.p);

	b = load("run/checkpoint-30/optimizer.pt");
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "optimizer.pt: %s", why);
	CHECK(ulp_tz_count(z) == 12, "4 params x (step, exp_avg, exp_avg_sq)");
	CHECK(find(z, "state.0.exp_avg") && find(z, "state.3.exp_avg_sq") && find(z, "state.2.step"), "AdamW names");
	ulp_tz_free(z);
	free(b.p);
	b = load("run/checkpoint-30/pytorch_model.bin");
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "pytorch_model.bin: %s", why);
	CHECK(find(z, "0.weight") && find(z, "2.bias") && ulp_tz_count(z) == 4, "state_dict names");
	ulp_tz_free(z);
	free(b.p);
}

/* torch 2.13's torch.save (tests/data/torch/torch2.pt): its records, and the
 * dtypes it writes as an UntypedStorage of bytes with _rebuild_tensor_v3
 * naming the dtype (float8_*, uint16/32), which were bytes of no dtype
 * (module torch.storage) before issue 36 item 7. */
static void test_parse_torch2(void)
{
	buf b = load("torch2.pt");
	ulp_tz *z;
	char why[256] = "";
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "torch2.pt: %s", why);
	CHECK(ulp_tz_count(z) == 6, "%zu storages (the view shares e4m3's)", ulp_tz_count(z));
	static const struct { const char *name; ulp_dtype dt; uint64_t len; } want[] = {
		{"w", ULP_DT_F32, 24 * 16 * 4}, {"bf16", ULP_DT_BF16, 24 * 16 * 2},
		{"e4m3", ULP_DT_F8_E4M3, 24 * 16}, {"e5m2", ULP_DT_F8_E5M2, 40},
		{"u16", ULP_DT_U16, 18}, {"u32", ULP_DT_U32, 20},
	};
	for (size_t i = 0; i < ULP_ARRAY_LEN(want); i++) {
		const ulp_tz_storage *s = find(z, want[i].name);
		CHECK(s && s->dtype == want[i].dt && s->length == want[i].len, "torch2.pt: %s is %s, %llu bytes",
		      want[i].name, ulp_dtype_name(want[i].dt), (unsigned long long)want[i].len);
	}
	ulp_tz_free(z);
	/* a v3 dtype whose elements do not tile the storage's bytes: left bytes */
	uint8_t *u = memmem(b.p, b.n, "torch\nuint16\n", 13);
	REQUIRE(u, "torch2.pt names torch.uint16");
	memcpy(u, "torch\nuint32\n", 13);
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "torch2.pt, uint16 as uint32: %s", why);
	const ulp_tz_storage *s = find(z, "u16");
	CHECK(s && s->dtype == ULP_DT_U8 && s->length == 18, "18 bytes as uint32: bytes (U8)");
	ulp_tz_free(z);
	free(b.p);
}

/* Refused by the reader; archived opaque (kind 0) and read back identical. */
static void hostile(ulp_archive *a, const char *what, buf b)
{
	static int n;
	char path[64], why[256] = "";
	ulp_tz *z = NULL;
	int rc = ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why));
	CHECK(rc == -ULP_E_CORRUPT && why[0], "%s: refused (%d)", what, rc);
	ulp_tz_free(z);
	snprintf(path, sizeof(path), "hostile/%d.pt", n++);
	REQUIRE(put_buf(a, path, b) == 0, "%s: put: %s", what, ulp_archive_errmsg(a));
	ulp_stat st;
	CHECK(ulp_archive_stat(a, path, &st) == 0 && st.kind == 0, "%s: stored opaque", what);
	CHECK(same(a, path, b), "%s: byte-identical", what);
	free(b.p);
}

static void test_hostile(void)
{
	ulp_archive *a = open_archive("hostile", 1);
	buf b = load("small.pt"), c;
	const size_t cuts[] = {b.n - 1, b.n - 22, b.n - 23, b.n / 2, 100, 30, 21, 4};
	for (size_t i = 0; i < ULP_ARRAY_LEN(cuts); i++) {
		c = copy(b);
		c.n = cuts[i];
		hostile(a, "truncated", c);
	}
	c = copy(b), add_size(c, "/data/0", 4, 0), hostile(a, "directory size lies", c);
	c = copy(b), add_size(c, "/data/0", 64, 1), hostile(a, "records overlap", c);
	c = copy(b), add_size(c, "/data/0", -4, 1), hostile(a, "storage shorter than numel x itemsize", c);
	c = copy(b), add_size(c, "/data/0", 4, 1), hostile(a, "storage longer than numel x itemsize", c);
	size_t cd0, lh0, cd1, lh1, e;
	c = copy(b), entry(c, "/data/1", &cd1, &lh1), entry(c, "/data/0", &cd0, &lh0);
	ulp_st32(c.p + cd1 + 42, (uint32_t)lh0), hostile(a, "two entries share a local header", c);
	c = copy(b), entry(c, "/data/1", &cd1, &lh1), e = eocd_pos(c);
	ulp_st32(c.p + cd1 + 42, ulp_ld32(c.p + e + 16) - 8), hostile(a, "local header offset past the records", c);
	c = copy(b), entry(c, "/data/1", &cd1, &lh1);
	c.p[cd1 + 46 + ulp_ld16(c.p + cd1 + 28) - 1] = '0', c.p[lh1 + 30 + ulp_ld16(c.p + lh1 + 26) - 1] = '0';
	hostile(a, "duplicate names", c);
	c = copy(b), entry(c, "/data/1", &cd1, &lh1), ulp_st16(c.p + cd1 + 10, 8), ulp_st16(c.p + lh1 + 8, 8);
	hostile(a, "compressed entry", c);
	c = copy(b), entry(c, "/data/0", &cd0, &lh0), ulp_st32(c.p + cd0 + 20, 0xFFFFFFFF), ulp_st32(c.p + cd0 + 24, 0xFFFFFFFF);
	hostile(a, "ZIP64 sizes without their extra field", c);
	c = to_zip64(b, 1), hostile(a, "ZIP64 end record disagrees (count)", c);
	c = to_zip64(b, 2), hostile(a, "ZIP64 end record disagrees (offset)", c);
	/* the pickle: an unknown opcode, no STOP, a storage of the wrong size */
	c = copy(b), entry(c, "/data.pkl", &cd0, &lh0);
	size_t pk = lh0 + 30 + ulp_ld16(c.p + lh0 + 26) + ulp_ld16(c.p + lh0 + 28), pkn = ulp_ld32(c.p + cd0 + 24);
	c.p[pk + 2] = 0xfe, hostile(a, "bad pickle opcode", c);
	c = copy(b), c.p[pk + pkn - 1] = 'N', hostile(a, "pickle without STOP", c);
	c = copy(b), c.p[pk + pkn - 1] = 0x80, hostile(a, "pickle cut short", c);
	c = copy(b);
	{ /* numel of the first persistent id ("storage", FloatStorage, "0", "cpu", numel) + 1 */
		uint8_t *q = memmem(c.p + pk, pkn, "X\x03\x00\x00\x00" "cpu", 8);
		REQUIRE(q, "location 'cpu' in the pickle");
		q += 8;
		if (*q == 'q') /* memoized */
			q += 2;
		REQUIRE(*q == 'M' || *q == 'K' || *q == 'J', "numel after 'cpu'");
		q[1]++;
	}
	hostile(a, "persistent id numel lies", c);

	/* a valid ZIP64 rewrite is still read, and archived per storage */
	c = to_zip64(b, 0);
	ulp_tz *z;
	char why[256] = "";
	CHECK(ulp_tz_parse_mem(c.p, c.n, &z, why, sizeof(why)) == 0 && ulp_tz_count(z) == 14, "ZIP64: %s", why);
	ulp_tz_free(z);
	REQUIRE(put_buf(a, "zip64.pt", c) == 0, "put zip64");
	ulp_stat st;
	CHECK(ulp_archive_stat(a, "zip64.pt", &st) == 0 && st.kind == 2, "ZIP64 file coded per storage");
	CHECK(same(a, "zip64.pt", c), "ZIP64 file byte-identical");
	free(c.p);
	/* random byte flips: whatever the reader decides, the bytes come back */
	for (int i = 0; i < 40; i++) {
		char path[64];
		c = copy(b);
		for (int k = 0; k < 3; k++)
			c.p[tap_rand() % c.n] ^= (uint8_t)(1 + tap_rand() % 255);
		snprintf(path, sizeof(path), "flip/%d.pt", i);
		REQUIRE(put_buf(a, path, c) == 0, "put flipped");
		CHECK(same(a, path, c), "flipped file %d byte-identical", i);
		free(c.p);
	}
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify");
	free(b.p);
	ulp_archive_close(a);
}

static void test_archive_run(void)
{
	ulp_archive *a = open_archive("run", 1);
	const char *files[] = {"run/checkpoint-20/optimizer.pt", "run/checkpoint-20/pytorch_model.bin",
	                       "run/checkpoint-30/optimizer.pt", "run/checkpoint-30/pytorch_model.bin", "small.pt"};
	for (size_t i = 0; i < ULP_ARRAY_LEN(files); i++) {
		buf b = load(files[i]);
		ulp_put_result r;
		char tmp[600];
		snprintf(tmp, sizeof(tmp), "%s/in", root);
		int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
		REQUIRE(fd >= 0 && write(fd, b.p, b.n) == (ssize_t)b.n, "write");
		REQUIRE(ulp_archive_put(a, files[i], fd, NULL, &r) == 0, "put %s: %s", files[i], ulp_archive_errmsg(a));
		close(fd);
		ulp_stat st;
		CHECK(ulp_archive_stat(a, files[i], &st) == 0 && st.kind == 2, "%s: torch zip", files[i]);
		CHECK(r.tensors >= 4, "%s: %llu tensors", files[i], (unsigned long long)r.tensors);
		/* step 30 is the newest: an anchor (layout.c); deltas between
		 * torch files of three steps: fuse_torch.sh */
		if (strstr(files[i], "-30/"))
			CHECK(r.anchors > 0 && st.anchor && st.chain_depth == 0, "%s: the newest step, an anchor (%u)",
			      files[i], r.anchors);
		CHECK(st.stored_bytes < b.n, "%s: %llu of %zu bytes", files[i], (unsigned long long)st.stored_bytes, b.n);
		CHECK(same(a, files[i], b), "%s: byte-identical", files[i]);
		free(b.p);
	}
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify");
	ulp_archive_close(a);

	/* cold: one storage in the middle decodes only its own chunks (a delta
	 * and its reference's) */
	a = open_archive("run", 0);
	buf b = load("run/checkpoint-30/optimizer.pt");
	ulp_tz *z;
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, NULL, 0) == 0, "parse");
	const ulp_tz_storage *s = find(z, "state.2.exp_avg");
	REQUIRE(s && s->offset > b.n / 3 && s->offset < 2 * b.n / 3, "a storage in the middle");
	ulp_file *f;
	REQUIRE(ulp_file_open(a, "run/checkpoint-30/optimizer.pt", &f) == 0, "open");
	ulp_counters c0, c1;
	ulp_archive_counters(a, &c0);
	uint8_t *got = malloc(s->length);
	CHECK(ulp_file_pread(f, got, s->length, s->offset) == (int64_t)s->length &&
	      memcmp(got, b.p + s->offset, s->length) == 0, "storage read");
	ulp_archive_counters(a, &c1);
	/* 32 KiB of F32: one chunk of its own, one of its reference if a delta */
	CHECK(c1.chunks_decoded - c0.chunks_decoded >= 1 && c1.chunks_decoded - c0.chunks_decoded <= 2 &&
	      c1.chunks_decoded - c0.chunks_decoded == 1 + (c1.deltas_decoded - c0.deltas_decoded),
	      "decoded %llu chunks (%llu deltas)", (unsigned long long)(c1.chunks_decoded - c0.chunks_decoded),
	      (unsigned long long)(c1.deltas_decoded - c0.deltas_decoded));
	/* the verbatim bytes around it (ZIP headers, padding) decode nothing */
	ulp_archive_counters(a, &c0);
	CHECK(ulp_file_pread(f, got, 64, s->offset - 64) == 64 && memcmp(got, b.p + s->offset - 64, 64) == 0,
	      "local header bytes");
	CHECK(ulp_file_pread(f, got, 200, b.n - 200) == 200 && memcmp(got, b.p + b.n - 200, 200) == 0,
	      "central directory bytes");
	ulp_archive_counters(a, &c1);
	CHECK(c1.chunks_decoded == c0.chunks_decoded, "header bytes decode nothing");
	free(got);
	ulp_file_close(f);
	ulp_tz_free(z);
	free(b.p);
	ulp_archive_close(a);
}

/* ---- hostile pickles: memory (issue 28 item 4) ------------------------- */

/* PK_BYTES_PER_BYTE and PK_BYTES_FIXED of pickle.c */
#define PK_BOUND(len) ((size_t)24 * (len) + ((size_t)1 << 20))

typedef struct pk_out {
	uint8_t *p;
	size_t n, cap;
} pk_out;

static void put(pk_out *o, const void *b, size_t n)
{
	if (o->n + n > o->cap) {
		o->cap = (o->n + n) * 2;
		o->p = realloc(o->p, o->cap);
		REQUIRE(o->p, "realloc");
	}
	memcpy(o->p + o->n, b, n);
	o->n += n;
}
#define PUT(o, lit) put((o), (lit), sizeof(lit) - 1)

/* kB of VmHWM or VmRSS of this process, or -1 */
static long vm_kb(const char *field)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long v = -1;
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, field, strlen(field)))
			v = atol(line + strlen(field) + 1);
	if (f)
		fclose(f);
	return v;
}

/* a pickle of about `size` bytes of one hostile shape */
static pk_out hostile_pickle(int shape, size_t size)
{
	pk_out o = {0};
	PUT(&o, "\x80\x02");
	char key[400];
	memset(key, 'k', sizeof(key));
	switch (shape) {
	case 0: /* a million empty lists on the stack */
		while (o.n < size)
			PUT(&o, "]");
		break;
	case 1: /* lists appended to a list, each memoized */
		PUT(&o, "]");
		while (o.n < size)
			PUT(&o, "]\x94" "a");
		break;
	case 2: /* marks, never closed */
		while (o.n < size)
			PUT(&o, "(");
		break;
	case 3: /* a 1 MiB string, then a list of it again and again from the memo */
		PUT(&o, "B\x00\x00\x10\x00");
		for (size_t i = 0; i < 1 << 20; i++)
			PUT(&o, "s");
		PUT(&o, "q\x00" "0(");
		while (o.n < size)
			PUT(&o, "h\x00");
		PUT(&o, "l");
		break;
	case 4: /* reductions of reductions */
		PUT(&o, "N");
		while (o.n < size)
			PUT(&o, ")R");
		break;
	case 5: /* deep nesting: a list in a list in a list... */
		while (o.n < size)
			PUT(&o, "(]");
		break;
	case 6: { /* storages with 400-byte names under a memoized key */
		PUT(&o, "}X\x90\x01\x00\x00");
		put(&o, key, sizeof(key));
		PUT(&o, "q\x01" "0X\x07\x00\x00\x00storageq\x02" "0ctorch\nFloatStorage\nq\x03" "0X\x03\x00\x00\x00"
		        "cpuq\x04" "0");
		for (unsigned i = 0; o.n < size; i++) {
			char k[16];
			int kl = snprintf(k, sizeof(k), "%x", i);
			PUT(&o, "h\x01(h\x02h\x03U");
			uint8_t l = (uint8_t)kl;
			put(&o, &l, 1);
			put(&o, k, (size_t)kl);
			PUT(&o, "h\x04K\x01tQs");
		}
		break;
	}
	}
	PUT(&o, ".");
	return o;
}

static void test_pickle_memory(void)
{
	static const char *const what[] = {"empty lists", "append+memoize", "marks", "memo'd 1 MiB string",
	                                   "reductions", "nesting", "storages with long names"};
	size_t size = (size_t)4 << 20;
	for (int shape = 0; shape < (int)ULP_ARRAY_LEN(what); shape++) {
		pk_out o = hostile_pickle(shape, size);
		ulp_pk *k = NULL;
		char why[256] = "";
		size_t peak = 0;
		FILE *cr = fopen("/proc/self/clear_refs", "w"); /* "5": VmHWM starts again from VmRSS */
		if (cr) {
			fputs("5", cr);
			fclose(cr);
		}
		long rss0 = vm_kb("VmRSS:");
		int rc = ulp_pk_parse_peak(o.p, o.n, &k, &peak, why, sizeof(why));
		long hwm = vm_kb("VmHWM:"), rss1 = vm_kb("VmRSS:");
		printf("# %s: %zu bytes, rc %d, %zu bytes held (bound %zu), resident +%ld kB at most, +%ld kB after\n",
		       what[shape], o.n, rc, peak, PK_BOUND(o.n), hwm - rss0, rss1 - rss0);
		CHECK(rc == 0 || rc == -ULP_E_CORRUPT, "%s: rc %d", what[shape], rc);
		CHECK(peak > 0 && peak <= PK_BOUND(o.n), "%s: %zu bytes held for %zu (bound %zu)", what[shape], peak,
		      o.n, PK_BOUND(o.n));
		if (shape == 0 || shape == 6)
			CHECK(rc == -ULP_E_CORRUPT && strstr(why, "too complex"), "%s refused: %s", what[shape], why);
		/* what the system saw: the peak, and given back */
		if (cr && rss0 > 0 && hwm > 0)
			CHECK((size_t)(hwm - rss0) * 1024 <= PK_BOUND(o.n) + PK_BOUND(o.n) / 4 + ((size_t)16 << 20),
			      "%s: resident rose by %ld kB (bound %zu kB)", what[shape], hwm - rss0, PK_BOUND(o.n) / 1024);
#ifdef ULP_SANITIZED
		size_t kept = PK_BOUND(o.n) / 8 + ((size_t)8 << 20); /* AddressSanitizer's shadow of the arena */
#else
		size_t kept = (size_t)8 << 20;
#endif
		if (rss0 > 0 && rss1 > 0)
			CHECK(rss1 < rss0 || (size_t)(rss1 - rss0) * 1024 < kept, "%s: %ld kB still resident after",
			      what[shape], rss1 - rss0);
		ulp_pk_free(k);
		free(o.p);
	}
	/* real files: the same names as ever, far under the bound */
	buf b = load("small.pt");
	ulp_tz *z;
	char why[256];
	REQUIRE(ulp_tz_parse_mem(b.p, b.n, &z, why, sizeof(why)) == 0, "small.pt: %s", why);
	ulp_tz_free(z);
	free(b.p);
}

int main(void)
{
	const char *src = getenv("top_srcdir");
	snprintf(datadir, sizeof(datadir), "%s/tests/data/torch", src ? src : ".");
	snprintf(root, sizeof(root), "%s/ulp-torch-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_parse_real();
	test_parse_torch2();
	test_hostile();
	test_pickle_memory();
	test_archive_run();
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return tap_done();
}
