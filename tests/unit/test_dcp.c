/* SPDX-License-Identifier: MIT */
/*
 * test_dcp.c - DCP rank files (dcp.c): the scanner on real rank files written
 * by torch 2.13 (tests/data/dcp, see make.py there): every record found, its
 * tensors named by dtype, length and occurrence, or by .metadata's fully
 * qualified names and chunks when it is given; the same file with bytes after it, cut inside a
 * record and missing its last byte (parsed as far as whole records go);
 * hostile input (no record, an end-record signature repeated a million
 * times: refused after a bounded number of tries). .metadata: its items are
 * exactly the records the scan finds. Archiving: a run of three
 * steps coded per tensor with deltas between steps and read back
 * byte-identical; a rank file of another plan (its items moved, as after a
 * re-sharding) put into the same series falls back to anchors where tensors
 * no longer match and reads back byte-identical; verify. Items that move
 * between steps (shift/: a new entry first): with the step's .metadata
 * archived first every tensor is a delta against the one of its name and
 * chunk; without, the tensors of other dtypes and lengths still are (by
 * position they were anchors). A rank file of the SAFETENSORS
 * serialization (st/): its tensors by name, deltas between steps. The
 * close of a rank file after its fsync writes no staging sidecar again.
 */
#include "tap.h"
#include "dcp.h"
#include "ulpack.h"
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
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
	buf b = {malloc((size_t)n + 64), (size_t)n};
	REQUIRE(b.p && fread(b.p, 1, b.n, f) == b.n, "read %s", path);
	fclose(f);
	return b;
}

/* 16 tensors: 2 weights and 2 biases, and per parameter exp_avg, exp_avg_sq
 * and step (a 0-dim F32) */
#define N_TENSORS 16
#define TENSOR_BYTES (3 * (2 * 64 * 64 * 4 + 2 * 64 * 4) + 4 * 4)
/* shift/ and st/: the same for a 32-32-32 MLP (shift/step-2: 2 more) */
#define N_SHIFT 16
#define SHIFT_DELTAS 2 /* the two weights at least (the moments change too fast early in training) */

static void test_scan_real(void)
{
	buf b = load("run/step-1/__0_0.distcp");
	ulp_dcp *d;
	uint64_t parsed;
	char why[256] = "";
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, NULL, NULL, &d, &parsed, why, sizeof(why)) == 0, "scan: %s", why);
	CHECK(parsed == b.n, "parsed %llu of %zu", (unsigned long long)parsed, b.n);
	CHECK(ulp_dcp_count(d) == N_TENSORS, "%zu tensors", ulp_dcp_count(d));
	CHECK(ulp_dcp_records(d) > N_TENSORS, "%zu records (tensors and BYTE_IO items)", ulp_dcp_records(d));
	uint64_t sum = 0, prev = 0;
	int names = 1;
	for (size_t i = 0; i < ulp_dcp_count(d); i++) {
		const ulp_dcp_tensor *t = ulp_dcp_at(d, i);
		sum += t->length;
		names &= strncmp(t->name, "dcp.", 4) == 0 && t->dtype == ULP_DT_F32 && t->offset >= prev;
		prev = t->offset + t->length;
	}
	CHECK(names, "tensors named dcp.<dtype>.<bytes>.<k>, F32, in order");
	CHECK(strcmp(ulp_dcp_at(d, 0)->name, "dcp.F32.16384.0") == 0 && !ulp_dcp_at(d, 0)->alt, "first: %s",
	      ulp_dcp_at(d, 0)->name);
	CHECK(sum == TENSOR_BYTES, "%llu tensor bytes", (unsigned long long)sum);
	ulp_dcp_free(d);

	/* bytes after the last record: parsed up to it */
	memset(b.p + b.n, 0, 7);
	CHECK(ulp_dcp_scan_mem(b.p, b.n + 7, NULL, NULL, &d, &parsed, NULL, 0) == 0 && parsed == b.n, "a tail of 7 bytes");
	ulp_dcp_free(d);
	/* cut inside a record; the last byte missing */
	CHECK(ulp_dcp_scan_mem(b.p, b.n / 2, NULL, NULL, &d, &parsed, NULL, 0) == 0 && parsed > 0 && parsed < b.n / 2 &&
	          ulp_dcp_count(d) < N_TENSORS,
	      "cut in half: whole records only");
	ulp_dcp_free(d);
	CHECK(ulp_dcp_scan_mem(b.p, b.n - 1, NULL, NULL, &d, &parsed, NULL, 0) == 0 && parsed < b.n - 1, "the last byte missing");
	ulp_dcp_free(d);
	/* no record at all */
	CHECK(ulp_dcp_scan_mem(b.p + 1, b.n - 1, NULL, NULL, &d, &parsed, why, sizeof(why)) == -ULP_E_CORRUPT && d == NULL,
	      "not a record at 0: %s", why);
	CHECK(ulp_dcp_scan_mem(b.p, 10, NULL, NULL, &d, &parsed, NULL, 0) == -ULP_E_CORRUPT, "10 bytes");
	/* an empty file is no rank file (found by fuzz_dcp) */
	CHECK(ulp_dcp_scan_mem(b.p, 0, NULL, NULL, &d, &parsed, NULL, 0) == -ULP_E_CORRUPT && d == NULL, "0 bytes");
	CHECK(ulp_dcp_name("a/__0_0.distcp") && !ulp_dcp_name("a/x.pt") && !ulp_dcp_name(".distcp"), "names");
	free(b.p);
}

/* .metadata (pickle.c): its storage_data items are exactly the records the
 * scan finds in the rank file, back to back, each tensor inside its item */
static void test_metadata(void)
{
	buf mb = load("run/step-1/.metadata"), b = load("run/step-1/__0_0.distcp");
	ulp_dcp_meta *m;
	ulp_dcp *d;
	uint64_t parsed;
	char why[256] = "";
	REQUIRE(ulp_dcp_meta_parse(mb.p, mb.n, &m, why, sizeof(why)) == 0, ".metadata: %s", why);
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, NULL, NULL, &d, &parsed, NULL, 0) == 0, "scan");
	size_t n = ulp_dcp_meta_count(m);
	CHECK(n == ulp_dcp_records(d), "%zu items, %zu records", n, ulp_dcp_records(d));
	uint64_t total = 0;
	int files = 1, found_w = 0;
	for (size_t i = 0; i < n; i++) {
		const ulp_dcp_item *it = ulp_dcp_meta_at(m, i);
		files &= strcmp(it->file, "__0_0.distcp") == 0;
		total += it->length;
		if (!strcmp(it->fqn, "model.0.weight"))
			found_w = it->ndim == 2 && it->chunk[0] == 0 && it->chunk[1] == 0 && it->length > 64 * 64 * 4;
	}
	CHECK(files && total == b.n, "items in __0_0.distcp, %llu of %zu bytes", (unsigned long long)total, b.n);
	CHECK(found_w, "model.0.weight: a 2-dim chunk at (0, 0)");
	int inside = 1;
	for (size_t t = 0; t < ulp_dcp_count(d); t++) {
		const ulp_dcp_tensor *x = ulp_dcp_at(d, t);
		int k = 0;
		for (size_t i = 0; i < n; i++) {
			const ulp_dcp_item *it = ulp_dcp_meta_at(m, i);
			k += x->offset >= it->offset && x->offset + x->length <= it->offset + it->length;
		}
		inside &= k == 1;
	}
	CHECK(inside, "each scanned tensor inside exactly one item");
	ulp_dcp_free(d);
	ulp_dcp_meta_free(m);
	/* cut, or a pickle of something else: refused */
	CHECK(ulp_dcp_meta_parse(mb.p, mb.n - 1, &m, NULL, 0) == -ULP_E_CORRUPT && !m, "cut .metadata");
	static const uint8_t other[] = {0x80, 0x02, '}', 'q', 0, '.'}; /* {} */
	CHECK(ulp_dcp_meta_parse(other, sizeof(other), &m, why, sizeof(why)) == -ULP_E_CORRUPT, "{}: %s", why);
	free(mb.p);
	free(b.p);
}


/* shift/step-3 with its .metadata: every tensor named <fqn>@<chunk>, its
 * signature name the alt; a .metadata of another file names nothing */
static void test_names(void)
{
	buf mb = load("shift/step-3/.metadata"), b = load("shift/step-3/__0_0.distcp");
	ulp_dcp_meta *m;
	ulp_dcp *d;
	uint64_t parsed;
	char why[256] = "";
	REQUIRE(ulp_dcp_meta_parse(mb.p, mb.n, &m, why, sizeof(why)) == 0, ".metadata: %s", why);
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, m, "__0_0.distcp", &d, &parsed, why, sizeof(why)) == 0, "scan: %s", why);
	int named = ulp_dcp_count(d) == N_SHIFT + 2;
	for (size_t i = 0; i < ulp_dcp_count(d); i++)
		named &= strchr(ulp_dcp_at(d, i)->name, '@') && ulp_dcp_at(d, i)->alt &&
		         !strncmp(ulp_dcp_at(d, i)->alt, "dcp.F32.", 8);
	CHECK(named, "%zu tensors, named by .metadata", ulp_dcp_count(d));
	CHECK(!strcmp(ulp_dcp_at(d, 0)->name, "adapter.w@0,0") && !strcmp(ulp_dcp_at(d, 2)->name, "model.0.weight@0,0") &&
	          !strcmp(ulp_dcp_at(d, 2)->alt, "dcp.F32.4096.1"),
	      "%s, %s (%s)", ulp_dcp_at(d, 0)->name, ulp_dcp_at(d, 2)->name, ulp_dcp_at(d, 2)->alt);
	ulp_dcp_free(d);
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, m, "__1_0.distcp", &d, &parsed, NULL, 0) == 0, "scan");
	CHECK(!strcmp(ulp_dcp_at(d, 0)->name, "dcp.F32.4096.0") && !ulp_dcp_at(d, 0)->alt, "another file's .metadata");
	ulp_dcp_free(d);
	ulp_dcp_meta_free(m);
	/* a hostile .metadata naming two items alike (model.2.weight renamed
	 * model.0.weight, same chunk): both take their signature names */
	uint8_t *hit = memmem(mb.p, mb.n, "model.2.weight", 14);
	REQUIRE(hit, "model.2.weight in .metadata");
	hit[6] = '0';
	REQUIRE(ulp_dcp_meta_parse(mb.p, mb.n, &m, why, sizeof(why)) == 0, "renamed .metadata: %s", why);
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, m, "__0_0.distcp", &d, &parsed, NULL, 0) == 0, "scan");
	CHECK(!strcmp(ulp_dcp_at(d, 2)->name, "dcp.F32.4096.1") && !strcmp(ulp_dcp_at(d, 4)->name, "dcp.F32.4096.2") &&
	          !strcmp(ulp_dcp_at(d, 3)->name, "model.0.bias@0"),
	      "two items named alike: %s, %s", ulp_dcp_at(d, 2)->name, ulp_dcp_at(d, 4)->name);
	ulp_dcp_free(d);
	ulp_dcp_meta_free(m);
	free(mb.p);
	free(b.p);
}

/* The SAFETENSORS serialization: BYTE_IO records, then a safetensors part */
static void test_st_scan(void)
{
	buf b = load("st/step-1/__0_0.distcp");
	ulp_dcp *d;
	uint64_t parsed;
	char why[256] = "";
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, NULL, NULL, &d, &parsed, why, sizeof(why)) == 0, "scan: %s", why);
	CHECK(parsed == b.n && ulp_dcp_count(d) == N_SHIFT, "%zu tensors, parsed %llu of %zu", ulp_dcp_count(d),
	      (unsigned long long)parsed, b.n);
	int found = 0;
	for (size_t i = 0; i < ulp_dcp_count(d); i++)
		found += !strcmp(ulp_dcp_at(d, i)->name, "model.0.weight") && ulp_dcp_at(d, i)->length == 32 * 32 * 4;
	CHECK(found == 1, "model.0.weight by its name");
	ulp_dcp_free(d);
	/* the safetensors part cut: the records only, the rest left opaque */
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n - 3, NULL, NULL, &d, &parsed, NULL, 0) == 0, "scan cut");
	CHECK(ulp_dcp_count(d) == 0 && ulp_dcp_records(d) > 0 && parsed < b.n - 3, "cut: %zu tensors",
	      ulp_dcp_count(d));
	ulp_dcp_free(d);
	free(b.p);
}

static void test_hostile(void)
{
	/* a local header, then 4 MiB of end-record signatures whose comment
	 * lengths are 0: every one a candidate; the scan gives up after
	 * ULP_DCP_MAX_TRIES */
	size_t n = (size_t)4 << 20;
	uint8_t *p = calloc(1, n + 64);
	memcpy(p, "PK\3\4", 4);
	for (size_t i = 64; i + 22 <= n; i += 22)
		memcpy(p + i, "PK\5\6", 4);
	ulp_dcp *d;
	uint64_t parsed;
	char why[256] = "";
	CHECK(ulp_dcp_scan_mem(p, n, NULL, NULL, &d, &parsed, why, sizeof(why)) == -ULP_E_CORRUPT && strstr(why, "tried"),
	      "a million end records: refused (%s)", why);
	/* a real record, then the same hostile bytes: the record, and no more */
	buf b = load("run/step-1/__0_0.distcp");
	ulp_dcp *d1;
	REQUIRE(ulp_dcp_scan_mem(b.p, b.n, NULL, NULL, &d1, &parsed, NULL, 0) == 0, "scan");
	const ulp_dcp_tensor *t0 = ulp_dcp_at(d1, 0);
	uint8_t *q = malloc(b.n + n);
	memcpy(q, b.p, b.n);
	memcpy(q + b.n, p, n);
	CHECK(ulp_dcp_scan_mem(q, b.n + n, NULL, NULL, &d, &parsed, NULL, 0) == 0 && parsed == b.n &&
	          ulp_dcp_count(d) == N_TENSORS && strcmp(ulp_dcp_at(d, 0)->name, t0->name) == 0,
	      "good records, then hostile bytes: the records");
	ulp_dcp_free(d);
	ulp_dcp_free(d1);
	free(q);
	free(p);
	free(b.p);
}

static ulp_archive *open_archive(const char *name)
{
	char dir[700], err[512];
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
	ulp_archive *a;
	ulp_archive_opts o = {.cache_size = 64 << 20, .threads = 2};
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open: %s", err);
	return a;
}

static void put(ulp_archive *a, const char *path, const char *rel, ulp_put_result *r)
{
	buf b = load(rel);
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s/in", root);
	int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
	REQUIRE(fd >= 0 && write(fd, b.p, b.n) == (ssize_t)b.n, "write %s", tmp);
	REQUIRE(ulp_archive_put(a, path, fd, NULL, r) == 0, "put %s: %s", path, ulp_archive_errmsg(a));
	close(fd);
	free(b.p);
}

static int same(ulp_archive *a, const char *path, const char *rel)
{
	buf b = load(rel);
	ulp_file *f;
	int ok = ulp_file_open(a, path, &f) == 0;
	uint8_t *got = malloc(b.n + 1);
	ok = ok && ulp_file_pread(f, got, b.n + 1, 0) == (int64_t)b.n && memcmp(got, b.p, b.n) == 0;
	/* a range across a tensor's end */
	ok = ok && ulp_file_pread(f, got, 5000, b.n / 3) == 5000 && memcmp(got, b.p + b.n / 3, 5000) == 0;
	if (f)
		ulp_file_close(f);
	free(got);
	free(b.p);
	return ok;
}

static void test_archive(void)
{
	ulp_archive *a = open_archive("arch");
	ulp_put_result r;
	char path[64], rel[64];
	for (int s = 1; s <= 3; s++) {
		snprintf(path, sizeof(path), "run/step-%d/__0_0.distcp", s);
		snprintf(rel, sizeof(rel), "run/step-%d/__0_0.distcp", s);
		put(a, path, rel, &r);
		CHECK(r.tensors == N_TENSORS, "step %d: %u tensors coded", s, r.tensors);
		snprintf(path, sizeof(path), "run/step-%d/.metadata", s);
		snprintf(rel, sizeof(rel), "run/step-%d/.metadata", s);
		put(a, path, rel, &r);
	}
	ulp_rebase_result rb;
	REQUIRE(ulp_archive_rebase_pending(a, NULL, NULL, &rb) == 0, "rebase: %s", ulp_archive_errmsg(a));
	uint64_t stored[4] = {0};
	for (int s = 1; s <= 3; s++) {
		ulp_stat st;
		snprintf(path, sizeof(path), "run/step-%d/__0_0.distcp", s);
		REQUIRE(ulp_archive_stat(a, path, &st) == 0, "stat %s", path);
		CHECK(st.kind == 2, "%s: coded per tensor (kind %d)", path, st.kind);
		if (s < 3) /* older steps are deltas, the newest an anchor (layout.c) */
			CHECK(!st.anchor && st.chain_depth > 0, "%s: deltas (depth %u)", path, st.chain_depth);
		else
			CHECK(st.anchor, "%s: the newest step, an anchor", path);
		stored[s] = st.stored_bytes;
		CHECK(same(a, path, path), "%s: byte-identical", path);
	}
	CHECK(stored[1] < stored[3] && stored[2] < stored[3], "deltas smaller than the anchor: %llu %llu %llu",
	      (unsigned long long)stored[1], (unsigned long long)stored[2], (unsigned long long)stored[3]);
	/* another plan in the same series, between steps (coded against a
	 * neighbour whose items sit elsewhere): anchors where they differ */
	put(a, "run/step-0/__0_0.distcp", "resharded/step-4/__0_0.distcp", &r);
	CHECK(r.tensors == N_TENSORS + 1 && r.anchors > 0, "resharded: %u tensors, %u anchors, %u deltas", r.tensors,
	      r.anchors, r.deltas);
	CHECK(same(a, "run/step-0/__0_0.distcp", "resharded/step-4/__0_0.distcp"), "resharded: byte-identical");
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify: %s", ulp_archive_errmsg(a));
	ulp_archive_close(a);
}


/* Two steps whose items move (shift/), the older put after the newer so
 * that it is coded against it at once. how: 0 the rank files alone (as a
 * mount archives them: .metadata comes last), 1 through an import's queue
 * with each step's .metadata before its rank file, 2 the newer step's
 * .metadata before its rank file through ulp_archive_put, the older's not
 * (a mount whose archiver took one step's .metadata first). */
static uint64_t put_shift(const char *name, int older, int how, ulp_put_result *r)
{
	ulp_archive *a = open_archive(name);
	ulp_putq *q = NULL;
	if (how == 1)
		REQUIRE(ulp_putq_new(a, &q) == 0, "putq");
	ulp_put_result r2;
	char p[64];
	for (int s = older + 1; s >= older; s--) {
		for (int k = how == 1 || (how == 2 && s > older) ? 0 : 1; k < 2; k++) {
			snprintf(p, sizeof(p), k ? "shift/step-%d/__0_0.distcp" : "shift/step-%d/.metadata", s);
			buf b = load(p);
			char tmp[600];
			snprintf(tmp, sizeof(tmp), "%s/in-%d-%d", root, s, k);
			int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
			REQUIRE(fd >= 0 && write(fd, b.p, b.n) == (ssize_t)b.n, "write %s", tmp);
			ulp_put_result *rr = k && s == older ? r : &r2;
			REQUIRE((q ? ulp_putq_put(q, p, fd, NULL, rr) : ulp_archive_put(a, p, fd, NULL, rr)) == 0, "put %s: %s",
			        p, ulp_archive_errmsg(a));
			close(fd);
			free(b.p);
		}
	}
	if (q)
		REQUIRE(ulp_putq_free(q) == 0, "putq: %s", ulp_archive_errmsg(a));
	ulp_stat st;
	REQUIRE(ulp_archive_stat(a, p, &st) == 0, "stat");
	CHECK(same(a, p, p), "%s: byte-identical", name);
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify: %s", ulp_archive_errmsg(a));
	ulp_archive_close(a);
	return st.stored_bytes;
}

/* Step 2's new entry has a shape of its own: by dtype, length and
 * occurrence the weights are still deltas (by position, before: none).
 * Step 3's has the weights' shape: by .metadata's names (an import) every
 * weight is a delta, by dtype and length they are coded against their
 * neighbours. Outside an import the names never depend on whether a
 * .metadata was archived first (else steps named both ways would meet). */
static void test_shift(void)
{
	ulp_put_result r;
	uint64_t sig12 = put_shift("shift-12", 1, 0, &r);
	CHECK(r.tensors == N_SHIFT && r.deltas >= SHIFT_DELTAS, "new shape, no .metadata: %u tensors, %u deltas",
	      r.tensors, r.deltas);
	unsigned d12 = r.deltas;
	CHECK(put_shift("shift-12m", 1, 2, &r) == sig12 && r.deltas == d12, "one step's .metadata first, outside an "
	      "import: the same (%u deltas)", r.deltas);
	uint64_t named = put_shift("shift-23m", 2, 1, &r);
	CHECK(r.tensors == N_SHIFT + 1 && r.deltas >= SHIFT_DELTAS + 1, "same shape, by name: %u tensors, %u deltas",
	      r.tensors, r.deltas);
	unsigned d_named = r.deltas;
	uint64_t sig = put_shift("shift-23", 2, 0, &r);
	printf("# shift 1-2 by signature: %u deltas, stored %llu; 2-3 by name: %u deltas, %llu; by signature: %u, %llu\n",
	       d12, (unsigned long long)sig12, d_named, (unsigned long long)named, r.deltas, (unsigned long long)sig);
	CHECK(r.tensors == N_SHIFT + 1 && r.deltas < d_named && named < sig,
	      "same shape, by signature: %u deltas (%u by name), stored %llu (%llu by name; 1-2: %llu)", r.deltas,
	      d_named, (unsigned long long)sig, (unsigned long long)named, (unsigned long long)sig12);
}

static void test_st_archive(void)
{
	ulp_archive *a = open_archive("st");
	ulp_put_result r;
	put(a, "st/step-2/__0_0.distcp", "st/step-2/__0_0.distcp", &r);
	put(a, "st/step-1/__0_0.distcp", "st/step-1/__0_0.distcp", &r);
	CHECK(r.tensors == N_SHIFT && r.deltas >= SHIFT_DELTAS, "safetensors part: %u tensors, %u deltas", r.tensors,
	      r.deltas);
	ulp_stat st;
	REQUIRE(ulp_archive_stat(a, "st/step-1/__0_0.distcp", &st) == 0, "stat");
	CHECK(st.kind == 2, "kind %d", st.kind);
	CHECK(same(a, "st/step-1/__0_0.distcp", "st/step-1/__0_0.distcp"), "st: byte-identical");
	CHECK(ulp_archive_verify(a, "", NULL, NULL) == 0, "verify: %s", ulp_archive_errmsg(a));
	ulp_archive_close(a);
}

/* The inode of the one sidecar in dir/staging (0: none or several). */
static ino_t sidecar(const char *dir)
{
	char p[1200];
	snprintf(p, sizeof(p), "%s/staging", dir);
	DIR *d = opendir(p);
	ino_t ino = 0;
	int n = 0;
	for (struct dirent *de; d && (de = readdir(d));) {
		size_t l = strlen(de->d_name);
		if (l > 5 && !strcmp(de->d_name + l - 5, ".meta")) {
			struct stat sb;
			snprintf(p, sizeof(p), "%s/staging/%s", dir, de->d_name);
			n++;
			ino = stat(p, &sb) == 0 ? sb.st_ino : 0;
		}
	}
	if (d)
		closedir(d);
	return n == 1 ? ino : 0;
}

/* A rank file's save (DCP's sync_files): fsync, then close. The close
 * records what the fsync made durable: the sidecar is not written again
 * (staging.c invariant 7: two fsyncs a file); a record that differs is. */
static void test_close_after_fsync(void)
{
	ulp_archive *a = open_archive("stage");
	char dir[700];
	snprintf(dir, sizeof(dir), "%s/stage", root);
	ulp_stage *s;
	REQUIRE(ulp_stage_new(a, NULL, &s) == 0, "stage");
	ulp_meta m = {0644, 0, 0, {1700000000, 5}};
	REQUIRE(ulp_stage_write(s, "bytes", 5, 0) == 5, "write");
	REQUIRE(ulp_stage_sync(s, "run/step-1/__0_0.distcp", &m) == 0, "sync");
	ino_t i0 = sidecar(dir);
	REQUIRE(ulp_stage_record(s, "run/step-1/__0_0.distcp", &m) == 0, "record");
	ino_t i1 = sidecar(dir);
	CHECK(i0 && i1 == i0, "the close after the fsync: the sidecar as it was (%llu, %llu)", (unsigned long long)i0,
	      (unsigned long long)i1);
	m.mtime.nsec = 6;
	REQUIRE(ulp_stage_record(s, "run/step-1/__0_0.distcp", &m) == 0, "record");
	ino_t i2 = sidecar(dir);
	CHECK(i2 && i2 != i1, "another mtime: written again");
	REQUIRE(ulp_stage_record(s, "run/step-1/__1_0.distcp", &m) == 0, "record");
	CHECK(sidecar(dir) != i2, "another path: written again");
	ulp_stage_discard(s);
	CHECK(sidecar(dir) == 0, "discarded");
	ulp_archive_close(a);
}

int main(void)
{
	const char *src = getenv("top_srcdir");
	snprintf(datadir, sizeof(datadir), "%s/tests/data/dcp", src ? src : ".");
	snprintf(root, sizeof(root), "%s/ulp-dcp-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_scan_real();
	test_metadata();
	test_names();
	test_st_scan();
	test_hostile();
	test_archive();
	test_shift();
	test_st_archive();
	test_close_after_fsync();
	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return tap_done();
}
