/* SPDX-License-Identifier: MIT */
/*
 * test_recode.c - re-basing (recode.c): forgetting steps frees their space
 * (stored bytes against an archive of the kept steps alone), a rename that
 * changes a file's series and steps put in name order end within 1 % of a
 * put in step order, chains stay within max_chain, every file reads back
 * byte for byte and verify passes after each; a process killed at each
 * point of a re-basing commit leaves an archive that verifies and finishes
 * the work later; the primitive refuses a reference that needs the tensor.
 */
#include "tap.h"
#include "arch_int.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define N_STEPS 12
#define N_ELEMS (64 * 1024)

static char root[256];
static char src[N_STEPS + 1][512]; /* step s's file */

/* bf16 weights that drift a little each step, a bias, a frozen tensor */
static void write_step(const char *path, int s)
{
	size_t n = N_ELEMS;
	uint16_t *w = malloc(n * 2), b[256], z[64];
	uint64_t r = 12345;
	for (size_t i = 0; i < n; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		w[i] = (uint16_t)(0x3c00 + ((r >> 33) % 3000) + (uint16_t)(s * ((r >> 20) % 7)));
	}
	for (int i = 0; i < 256; i++)
		b[i] = (uint16_t)(0x3f80 + (i % 3) + s);
	memset(z, 0, sizeof(z));
	uint64_t sw[2] = {n / 256, 256}, sb[1] = {256}, sz[1] = {64};
	ulp_st_wtensor t[3] = {{"w", ULP_DT_BF16, 2, sw, w}, {"b", ULP_DT_BF16, 1, sb, b},
	                       {"frozen", ULP_DT_BF16, 1, sz, z}};
	REQUIRE(ulp_st_write(path, t, 3, NULL) == 0, "write %s", path);
	free(w);
}

static int put(ulp_archive *a, const char *apath, int s)
{
	int fd = open(src[s], O_RDONLY);
	REQUIRE(fd >= 0, "open %s", src[s]);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	int rc = ulp_archive_put(a, apath, fd, &m, NULL);
	close(fd);
	return rc;
}

static int same_bytes(ulp_archive *a, const char *apath, int s)
{
	FILE *f = fopen(src[s], "rb");
	fseek(f, 0, SEEK_END);
	size_t len = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	uint8_t *want = malloc(len), *got = malloc(len + 1);
	int ok = fread(want, 1, len, f) == len;
	fclose(f);
	ulp_file *h;
	if (ok && ulp_file_open(a, apath, &h) == 0) {
		ok = ulp_file_pread(h, got, len + 1, 0) == (int64_t)len && !memcmp(got, want, len);
		ulp_file_close(h);
	} else {
		ok = 0;
	}
	free(want);
	free(got);
	return ok;
}

static ulp_archive *fresh(const char *name, unsigned max_chain)
{
	char dir[600], err[512];
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init %s: %s", dir, err);
	ulp_archive_opts o = {.max_chain = max_chain, .threads = 2, .cache_size = 64 << 20};
	ulp_archive *a;
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open %s: %s", dir, err);
	return a;
}

static ulp_archive *reopen(const char *name, unsigned max_chain)
{
	char dir[600], err[512];
	snprintf(dir, sizeof(dir), "%s/%s", root, name);
	ulp_archive_opts o = {.max_chain = max_chain, .threads = 2, .cache_size = 64 << 20};
	ulp_archive *a;
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open %s: %s", dir, err);
	return a;
}

static void path_of(char *buf, size_t cap, const char *dirfmt, int s)
{
	char d[64];
	snprintf(d, sizeof(d), dirfmt, s);
	snprintf(buf, cap, "run/%s/model.safetensors", d);
}

static uint64_t pack_bytes(ulp_archive *a, unsigned *maxd)
{
	ulp_report r;
	REQUIRE(ulp_archive_report(a, "", NULL, NULL, &r) == 0, "report: %s", ulp_archive_errmsg(a));
	if (maxd)
		*maxd = r.max_chain_depth;
	return r.pack_bytes;
}

static void bad(void *arg, const char *path, const char *why)
{
	(void)arg;
	fprintf(stderr, "# damaged: %s: %s\n", path, why);
}

/* every step in steps[] reads back, verify passes, chains <= max_chain */
static void check_all(ulp_archive *a, const char *what, const int *steps, size_t n, unsigned max_chain)
{
	int ok = 1;
	for (size_t i = 0; i < n; i++) {
		char p[128];
		path_of(p, sizeof(p), "checkpoint-%d", steps[i]);
		ok &= same_bytes(a, p, steps[i]);
	}
	CHECK(ok, "%s: every file reads back byte for byte", what);
	CHECK(ulp_archive_verify(a, "", bad, NULL) == 0, "%s: verify passes", what);
	unsigned d;
	pack_bytes(a, &d);
	CHECK(d <= max_chain, "%s: deepest chain %u <= max_chain %u", what, d, max_chain);
}

/* the reference: steps 1..12 (or those in keep) put in step order */
static uint64_t baseline(const char *name, const int *steps, size_t n, unsigned max_chain)
{
	ulp_archive *a = fresh(name, max_chain);
	for (size_t i = 0; i < n; i++) {
		char p[128];
		path_of(p, sizeof(p), "checkpoint-%d", steps[i]);
		REQUIRE(put(a, p, steps[i]) == 0, "put: %s", ulp_archive_errmsg(a));
	}
	ulp_gc_result g;
	REQUIRE(ulp_archive_gc(a, &g) == 0, "gc");
	uint64_t b = pack_bytes(a, NULL);
	ulp_archive_close(a);
	return b;
}

/* a figure the issue sets a target for, printed whether or not it passes */
#define FIGURE(cond, ...) do { fprintf(stderr, "# "); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
	CHECK(cond, __VA_ARGS__); } while (0)

static const int all[N_STEPS] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

static void test_forget(unsigned max_chain)
{
	static const int kept[] = {3, 6, 9, 12};
	char name[64];
	snprintf(name, sizeof(name), "forget-%u", max_chain);
	ulp_archive *a = fresh(name, max_chain);
	for (int s = 1; s <= N_STEPS; s++) {
		char p[128];
		path_of(p, sizeof(p), "checkpoint-%d", s);
		REQUIRE(put(a, p, s) == 0, "put: %s", ulp_archive_errmsg(a));
	}
	uint64_t before = pack_bytes(a, NULL);
	ulp_forget_opts o = {.keep_every = 3, .dry_run = 1};
	CHECK(ulp_archive_forget(a, "run", &o, NULL, NULL) == 8, "dry run: 8 steps would go");
	CHECK(pack_bytes(a, NULL) == before, "dry run changes nothing");
	o.dry_run = 0;
	ulp_forget_opts none = {0};
	CHECK(ulp_archive_forget(a, "run", &none, NULL, NULL) == -ULP_E_INVAL, "no rule: refused");
	CHECK(ulp_archive_forget(a, "nope", &o, NULL, NULL) == -ULP_E_NOENT, "no such run");
	CHECK(ulp_archive_forget(a, "run", &o, NULL, NULL) == 8, "8 steps forgotten");
	ulp_stat st;
	CHECK(ulp_archive_stat(a, "run/checkpoint-4", &st) == -ULP_E_NOENT, "a forgotten step's directory goes");
	ulp_gc_result g;
	REQUIRE(ulp_archive_gc(a, &g) == 0, "gc: %s", ulp_archive_errmsg(a));
	uint64_t after = pack_bytes(a, NULL);
	check_all(a, name, kept, 4, max_chain ? max_chain : ULP_DEFAULT_MAX_CHAIN);
	ulp_archive_close(a);
	snprintf(name, sizeof(name), "kept-%u", max_chain);
	uint64_t scratch = baseline(name, kept, 4, max_chain);
	FIGURE(after * 10 <= scratch * 11, "max_chain %u: %llu -> %llu pack bytes after forget + gc, %llu for the kept"
	      " steps alone (%.3fx, target <= 1.1x); %llu blobs re-based", max_chain, (unsigned long long)before,
	      (unsigned long long)after, (unsigned long long)scratch, (double)after / (double)scratch,
	      (unsigned long long)g.blobs_rebased);
}

static void test_rename(void)
{
	ulp_archive *a = fresh("rename", 0);
	for (int s = 1; s <= N_STEPS; s++) {
		char tmp[64], fin[64], p[128];
		snprintf(tmp, sizeof(tmp), "run/tmp-checkpoint-%d", s);
		snprintf(fin, sizeof(fin), "run/checkpoint-%d", s);
		path_of(p, sizeof(p), "tmp-checkpoint-%d", s);
		REQUIRE(put(a, p, s) == 0, "put: %s", ulp_archive_errmsg(a));
		REQUIRE(ulp_archive_rename(a, tmp, fin) == 0, "rename: %s", ulp_archive_errmsg(a));
		if (s % 4 == 0) { /* as a mount does when idle, now and then */
			ulp_rebase_result r;
			REQUIRE(ulp_archive_rebase_pending(a, NULL, NULL, &r) == 0, "pending: %s", ulp_archive_errmsg(a));
		}
	}
	ulp_gc_result g;
	REQUIRE(ulp_archive_gc(a, &g) == 0, "gc: %s", ulp_archive_errmsg(a));
	uint64_t b = pack_bytes(a, NULL);
	check_all(a, "rename", all, N_STEPS, ULP_DEFAULT_MAX_CHAIN);
	ulp_archive_close(a);
	uint64_t ref = baseline("rename-ref", all, N_STEPS, 0);
	FIGURE(b * 100 <= ref * 101, "tmp-dir renames: %llu pack bytes, step order %llu (%.4fx, target <= 1.01x)",
	      (unsigned long long)b, (unsigned long long)ref, (double)b / (double)ref);
}

static void test_name_order(void)
{
	/* rsync's order: checkpoint-1, -10, -11, -12, -2, ... */
	static const int order[N_STEPS] = {1, 10, 11, 12, 2, 3, 4, 5, 6, 7, 8, 9};
	ulp_archive *a = fresh("names", 0);
	for (int i = 0; i < N_STEPS; i++) {
		char p[128];
		path_of(p, sizeof(p), "checkpoint-%d", order[i]);
		REQUIRE(put(a, p, order[i]) == 0, "put: %s", ulp_archive_errmsg(a));
		ulp_rebase_result r;
		REQUIRE(ulp_archive_rebase_pending(a, NULL, NULL, &r) == 0, "pending: %s", ulp_archive_errmsg(a));
	}
	ulp_gc_result g;
	REQUIRE(ulp_archive_gc(a, &g) == 0, "gc: %s", ulp_archive_errmsg(a));
	uint64_t b = pack_bytes(a, NULL);
	check_all(a, "name order", all, N_STEPS, ULP_DEFAULT_MAX_CHAIN);
	ulp_archive_close(a);
	uint64_t ref = baseline("names-ref", all, N_STEPS, 0);
	FIGURE(b * 100 <= ref * 101, "name order: %llu pack bytes, step order %llu (%.4fx, target <= 1.01x)",
	      (unsigned long long)b, (unsigned long long)ref, (double)b / (double)ref);
}

static void test_primitive(void)
{
	ulp_archive *a = fresh("prim", 0);
	for (int s = 1; s <= 3; s++) {
		char p[128];
		path_of(p, sizeof(p), "checkpoint-%d", s);
		REQUIRE(put(a, p, s) == 0, "put");
	}
	ulp_rebase_result r;
	CHECK(ulp_archive_rebase(a, "run/checkpoint-1/model.safetensors", "w", "run/checkpoint-3/model.safetensors",
	                         &r) == -ULP_E_INVAL, "a reference that needs the tensor is refused: %s",
	      ulp_archive_errmsg(a));
	CHECK(ulp_archive_rebase(a, "run/checkpoint-3/model.safetensors", "w", NULL, &r) == 0 && r.recoded == 1 &&
	      r.anchors == 1, "re-coded as an anchor");
	CHECK(ulp_archive_rebase(a, "run/checkpoint-3/model.safetensors", "w", "run/checkpoint-1/model.safetensors",
	                         &r) == 0 && r.recoded == 1 && r.anchors == 0, "re-coded against step 1");
	CHECK(ulp_archive_rebase(a, "run/checkpoint-3/model.safetensors", "nope", NULL, &r) == -ULP_E_NOENT,
	      "no such tensor");
	static const int s3[] = {1, 2, 3};
	check_all(a, "primitive", s3, 3, ULP_DEFAULT_MAX_CHAIN);
	ulp_archive_close(a);
}

/* a process killed at each point of a re-basing commit */
static void test_crash(void)
{
	static const int kept[] = {3, 6, 9, 12};
	for (int at = 1; at <= 3; at++) {
		char name[64];
		snprintf(name, sizeof(name), "crash-%d", at);
		ulp_archive *a = fresh(name, 0);
		for (int s = 1; s <= N_STEPS; s++) {
			char p[128];
			path_of(p, sizeof(p), "checkpoint-%d", s);
			REQUIRE(put(a, p, s) == 0, "put");
		}
		ulp_forget_opts o = {.keep_every = 3};
		REQUIRE(ulp_archive_forget(a, "run", &o, NULL, NULL) == 8, "forget");
		ulp_archive_close(a);
		pid_t pid = fork();
		REQUIRE(pid >= 0, "fork");
		if (pid == 0) {
			ulp_archive *c = reopen(name, 0);
			ulp_recode_crash_at = at;
			ulp_gc_result g;
			ulp_archive_gc(c, &g);
			_exit(0);
		}
		int st;
		waitpid(pid, &st, 0);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 99, "killed at point %d", at);
		a = reopen(name, 0);
		check_all(a, name, kept, 4, ULP_DEFAULT_MAX_CHAIN);
		ulp_gc_result g;
		CHECK(ulp_archive_gc(a, &g) == 0, "gc after the crash: %s", ulp_archive_errmsg(a));
		unsigned d;
		uint64_t b = pack_bytes(a, &d);
		check_all(a, name, kept, 4, ULP_DEFAULT_MAX_CHAIN);
		char dir[700];
		snprintf(dir, sizeof(dir), "%s/%s/packs", root, name);
		CHECK(b > 0 && d <= 3, "point %d: the work finished later (%llu pack bytes, deepest chain %u)", at,
		      (unsigned long long)b, d);
		ulp_archive_close(a);
	}
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-recode-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	for (int s = 1; s <= N_STEPS; s++) {
		snprintf(src[s], sizeof(src[s]), "%s/step%d.safetensors", root, s);
		write_step(src[s], s);
	}
	test_primitive();
	test_forget(0);
	test_forget(3);
	test_name_order();
	test_rename();
	test_crash();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
