/* SPDX-License-Identifier: MIT */
/*
 * test_steps.c - steps, not names (steps.c), and the mount lock
 * (mountlock.c), which the integration scripts covered alone so far:
 *  - ulp_name_step: the step of each name form frameworks write, and the
 *    names that are not step directories (temporaries, global_stepN, a
 *    key inside a word, overflow);
 *  - ulp_name_cmp: numbered names in numeric order, a total order that is 0
 *    only for equal strings, antisymmetric and transitive;
 *  - ulp_archive_latest: the highest step of a run directory, ties, a real
 *    "latest" entry that wins, step and non-run directories refused, empty
 *    step directories passed over, step files (issue 28 items 15, 16);
 *  - ulp_archive_latest_live: a step with a file open for writing passed
 *    over, a closed one (queued, staged only) taken;
 *  - ulp_name_step_file: the step of step files' names;
 *  - ulp_archive_steps: the rows of `ulpack steps` (order, files, sizes,
 *    chain depth, prefix, step files);
 *  - ulp_mount_lock: taken, a second one refused naming pid and mount
 *    point, a lock left by a dead process taken over, a read-only open
 *    beside a held lock.
 */
#include "tap.h"
#include "ulpack.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char root[256];

static void test_name_step(void)
{
	static const struct {
		const char *name;
		int64_t step;
	} cases[] = {
		{"checkpoint-100", 100}, {"checkpoint_5", 5}, {"checkpoint7", 7}, {"step_7", 7}, {"step-8", 8},
		{"step9", 9}, {"iter_0001500", 1500}, {"iteration_3", 3}, {"iter-4", 4}, {"ckpt-9", 9},
		{"ckpt_10", 10}, {"epoch3-step1500", 1500}, {"1000", 1000}, {"0", 0}, {"run-a_step_12", 12},
		{"checkpoint-0100", 100}, {"epoch=0-step=100", 100}, {"epoch=3-step=12-v1", 12},
		/* issue 36: torchtitan, Megatron, NeMo's DCP directory named after its metrics */
		{"step-2000", 2000}, {"iter_0000100", 100}, {"megatron_gpt--val_loss=2.31-step=100-consumed_samples=800.0", 100},
		/* not step directories */
		{"", -1}, {".checkpoint-1", -1}, {"tmp-checkpoint-5", -1}, {"tmpstep_5", -1},
		{"global_step100", -1}, {"mystep3", -1}, {"model", -1}, {"checkpoint-", -1}, {"step", -1},
		{"a/step_1", -1}, {"99999999999999999999", -1}, {"checkpoint-99999999999999999999", -1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		int64_t s = ulp_name_step(cases[i].name);
		CHECK(s == cases[i].step, "ulp_name_step(\"%s\") = %lld, want %lld", cases[i].name, (long long)s,
		      (long long)cases[i].step);
	}
	CHECK(ulp_name_step("9223372036854775807") == INT64_MAX, "the largest step");
	/* step files (issue 28 item 16): a step name with an extension */
	static const struct {
		const char *name;
		int64_t step;
	} files[] = {
		{"model_step_1000.pt", 1000}, {"epoch=0-step=100.ckpt", 100}, {"epoch=2-step=300-v1.ckpt", 300},
		{"checkpoint-5.pth", 5}, {"ckpt_7.safetensors", 7}, {"model.step_9.bin", 9},
		{"megatron_gpt--val_loss=2.31-step=100-consumed_samples=800.0.ckpt", 100},
		/* not step files */
		{"checkpoint-9999", -1}, {"model-00001-of-00002.safetensors", -1}, {"last.ckpt", -1},
		{"1000.pt", -1}, {"0.0", -1}, {".model_step_5.pt.Ab12Cd", -1}, {"tmp_step_5.pt", -1},
		{"global_step5.pt", -1}, {"step_5.", -1}, {".step_5", -1}, {"optimizer.pt", -1},
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(*files); i++) {
		int64_t s = ulp_name_step_file(files[i].name);
		CHECK(s == files[i].step, "ulp_name_step_file(\"%s\") = %lld, want %lld", files[i].name, (long long)s,
		      (long long)files[i].step);
	}
}

static int sgn(int x)
{
	return (x > 0) - (x < 0);
}

static int cmp_names(const void *x, const void *y)
{
	return ulp_name_cmp(*(const char *const *)x, *(const char *const *)y);
}

static void test_name_cmp(void)
{
	CHECK(ulp_name_cmp("checkpoint-200", "checkpoint-1000") < 0, "200 before 1000");
	CHECK(ulp_name_cmp("checkpoint-1000", "checkpoint-200") > 0, "1000 after 200");
	CHECK(ulp_name_cmp("a", "a") == 0 && ulp_name_cmp("", "") == 0, "equal strings");
	CHECK(ulp_name_cmp("007", "7") != 0 && sgn(ulp_name_cmp("007", "7")) == -sgn(ulp_name_cmp("7", "007")),
	      "007 and 7: equal values, not equal names (invariant 1)");
	CHECK(ulp_name_cmp("a2b", "a10b") < 0 && ulp_name_cmp("a10", "a10b") < 0, "digit runs inside names");
	CHECK(ulp_name_cmp("x", "x1") < 0 && ulp_name_cmp("", "a") < 0, "a prefix first");
	CHECK(ulp_name_cmp("step9/b", "step10/a") < 0, "paths: the step decides");
	CHECK(ulp_name_cmp("99999999999999999999999", "100000000000000000000000") < 0,
	      "digit runs longer than any integer");
	const char *names[] = {"checkpoint-1000", "checkpoint-200", "checkpoint-30", "checkpoint-0200", "checkpoint-",
	                       "checkpoint-4", "b", "a10", "a9", "a09", "a009", "", "Z", "z1z", "z01z", "z1y"};
	/* equal values ("a9", "a09") fall back to strcmp (invariant 1) */
	const char *want[] = {"", "Z", "a009", "a09", "a9", "a10", "b", "checkpoint-", "checkpoint-4", "checkpoint-30",
	                      "checkpoint-0200", "checkpoint-200", "checkpoint-1000", "z1y", "z01z", "z1z"};
	size_t n = sizeof(names) / sizeof(*names);
	qsort(names, n, sizeof(*names), cmp_names);
	int same = 1;
	for (size_t i = 0; i < n; i++)
		same &= !strcmp(names[i], want[i]);
	CHECK(same, "sorted in numeric order (got %s %s %s %s ...)", names[0], names[1], names[2], names[3]);
	/* a total order: antisymmetric, 0 only for equal strings, transitive */
	int ok = 1;
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++) {
			int c = ulp_name_cmp(names[i], names[j]);
			ok &= sgn(c) == -sgn(ulp_name_cmp(names[j], names[i]));
			ok &= (c == 0) == !strcmp(names[i], names[j]);
			for (size_t k = 0; k < n; k++)
				if (c < 0 && ulp_name_cmp(names[j], names[k]) < 0)
					ok &= ulp_name_cmp(names[i], names[k]) < 0;
		}
	CHECK(ok, "ulp_name_cmp is a total order over the sample");
}

static ulp_archive *new_archive(const char *name, char *dir, size_t cap)
{
	char err[512];
	snprintf(dir, cap, "%s/%s", root, name);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init %s: %s", dir, err);
	ulp_archive_opts o = {.threads = 2, .cache_size = 16 << 20};
	ulp_archive *a;
	REQUIRE(ulp_archive_open(dir, &o, &a, err, sizeof(err)) == 0, "open %s: %s", dir, err);
	return a;
}

/* Archives len bytes of pattern c at path (parents created as needed). */
static void put_bytes(ulp_archive *a, const char *path, int c, size_t len)
{
	char tmp[300];
	snprintf(tmp, sizeof(tmp), "%s/src.bin", root);
	FILE *f = fopen(tmp, "wb");
	REQUIRE(f, "create %s", tmp);
	for (size_t i = 0; i < len; i++)
		fputc((c + (int)(i % 7)) & 0xff, f);
	fclose(f);
	int fd = open(tmp, O_RDONLY);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_put(a, path, fd, &m, NULL) == 0, "put %s: %s", path, ulp_archive_errmsg(a));
	close(fd);
}

/* A safetensors step of one bf16 tensor that drifts with s. */
static void put_tensor_step(ulp_archive *a, const char *path, int s)
{
	char tmp[300];
	snprintf(tmp, sizeof(tmp), "%s/src.safetensors", root);
	size_t n = 8192;
	uint16_t *w = malloc(n * 2);
	uint64_t r = 7;
	for (size_t i = 0; i < n; i++) {
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		w[i] = (uint16_t)(0x3c00 + ((r >> 33) % 2000) + (uint16_t)(s * ((r >> 20) % 5)));
	}
	uint64_t shape[1] = {n};
	ulp_st_wtensor t = {"w", ULP_DT_BF16, 1, shape, w};
	REQUIRE(ulp_st_write(tmp, &t, 1, NULL) == 0, "write %s", tmp);
	free(w);
	int fd = open(tmp, O_RDONLY);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_put(a, path, fd, &m, NULL) == 0, "put %s: %s", path, ulp_archive_errmsg(a));
	close(fd);
}

static void test_latest(void)
{
	char dir[400], name[300];
	ulp_archive *a = new_archive("latest", dir, sizeof(dir));
	put_bytes(a, "run/checkpoint-100/x", 1, 10);
	put_bytes(a, "run/checkpoint-1000/x", 2, 10);
	put_bytes(a, "run/checkpoint-200/x", 3, 10);
	put_bytes(a, "run/tmp-checkpoint-5000/x", 4, 10); /* a temporary: not a step */
	put_bytes(a, "run/.checkpoint-6000/x", 4, 10);
	put_bytes(a, "run/checkpoint-9999", 5, 10);         /* a file, not a directory */
	put_bytes(a, "run/notes.txt", 6, 10);
	int rc = ulp_archive_latest(a, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-1000"), "latest of run: %d %s", rc, rc ? "" : name);
	rc = ulp_archive_latest(a, "run/", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-1000"), "a trailing slash: %d", rc);
	CHECK(ulp_archive_latest(a, "run", name, 5) == -ULP_E_OVERFLOW, "a name that does not fit: OVERFLOW");
	CHECK(ulp_archive_latest(a, "run/checkpoint-100", name, sizeof(name)) == -ULP_E_NOENT,
	      "a step directory is not a run directory");
	CHECK(ulp_archive_latest(a, "run/tmp-checkpoint-5000", name, sizeof(name)) == -ULP_E_NOENT,
	      "no step directory in it: NOENT");
	CHECK(ulp_archive_latest(a, "nosuch", name, sizeof(name)) == -ULP_E_NOENT, "no such directory: NOENT");
	CHECK(ulp_archive_latest(a, "", name, sizeof(name)) == -ULP_E_NOENT, "the root holds no step directory");
	/* ties: the same step, the greatest name by ulp_name_cmp */
	put_bytes(a, "tie/checkpoint-7/x", 1, 10);
	put_bytes(a, "tie/step_7/x", 2, 10);
	put_bytes(a, "tie/checkpoint-07/x", 3, 10);
	rc = ulp_archive_latest(a, "tie", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "step_7"), "a tie goes to the greatest name: %s", rc ? "?" : name);
	/* digits-only step names (orbax) */
	put_bytes(a, "orbax/900/x", 1, 10);
	put_bytes(a, "orbax/1200/x", 2, 10);
	rc = ulp_archive_latest(a, "orbax", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "1200"), "digits only: %s", rc ? "?" : name);
	/* invariant 2: a real entry called latest wins, file or symlink */
	put_bytes(a, "real/checkpoint-1/x", 1, 10);
	put_bytes(a, "real/latest", 2, 4);
	CHECK(ulp_archive_latest(a, "real", name, sizeof(name)) == -ULP_E_EXIST, "a real latest file wins");
	put_bytes(a, "sym/checkpoint-1/x", 1, 10);
	ulp_meta m = {0777, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_symlink(a, "sym/latest", "checkpoint-1", &m) == 0, "symlink");
	CHECK(ulp_archive_latest(a, "sym", name, sizeof(name)) == -ULP_E_EXIST, "a real latest symlink wins");
	/* issue 28 item 15: an empty step directory (just made) is passed over */
	REQUIRE(ulp_archive_mkdir(a, "run/checkpoint-2000", &m) == 0, "mkdir");
	rc = ulp_archive_latest(a, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-1000"), "an empty step directory is not latest: %s", rc ? "?" : name);
	REQUIRE(ulp_archive_mkdir(a, "empty", &m) == 0 && ulp_archive_mkdir(a, "empty/step_1", &m) == 0, "mkdir");
	CHECK(ulp_archive_latest(a, "empty", name, sizeof(name)) == -ULP_E_NOENT, "only empty steps: NOENT");
	/* item 16: step files in one folder, the newest one; other files no step */
	put_bytes(a, "lit/epoch=0-step=100.ckpt", 1, 10);
	put_bytes(a, "lit/epoch=2-step=300.ckpt", 2, 10);
	put_bytes(a, "lit/epoch=1-step=200.ckpt", 3, 10);
	put_bytes(a, "lit/last.ckpt", 4, 10);
	put_bytes(a, "lit/hparams.yaml", 5, 10);
	rc = ulp_archive_latest(a, "lit", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "epoch=2-step=300.ckpt"), "latest of step files: %s", rc ? "?" : name);
	put_bytes(a, "flat/model_step_900.pt", 1, 10);
	put_bytes(a, "flat/model_step_1000.pt", 2, 10);
	rc = ulp_archive_latest(a, "flat", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "model_step_1000.pt"), "model_step_N.pt: %s", rc ? "?" : name);
	/* inside a step directory: its files are that step's, no run there */
	put_bytes(a, "run/checkpoint-100/sub/model_step_1.pt", 1, 10);
	CHECK(ulp_archive_latest(a, "run/checkpoint-100/sub", name, sizeof(name)) == -ULP_E_NOENT,
	      "no run inside a step directory");
	ulp_archive_close(a);
}

/* Item 15: through a session, a step with a file open for writing is passed
 * over for the one before it; once closed (even if queued) it is latest. */
static void test_latest_live(void)
{
	char dir[400], name[300];
	ulp_archive *a = new_archive("live", dir, sizeof(dir));
	put_bytes(a, "run/checkpoint-1/model.bin", 1, 100);
	put_bytes(a, "run/checkpoint-2/model.bin", 2, 100);
	put_bytes(a, "run/checkpoint-3/config.json", 3, 100);
	put_bytes(a, "lit/epoch=0-step=10.ckpt", 1, 100);
	ulp_session *s;
	REQUIRE(ulp_session_open(a, NULL, &s) == 0, "session");
	ulp_sfile *h, *h2;
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_session_open_file(s, "run/checkpoint-3/model.bin", O_WRONLY, &m, &h) == 0, "create");
	CHECK(ulp_session_write(h, "partial", 7, 0) == 7, "write");
	int rc = ulp_archive_latest_live(a, s, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-2"), "a step being written is passed over: %s", rc ? "?" : name);
	rc = ulp_archive_latest_live(a, NULL, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-3"), "without the session: the archive alone");
	CHECK(ulp_session_flush(h) == 0, "close");
	ulp_session_release(h);
	rc = ulp_archive_latest_live(a, s, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-3"), "closed (queued or archived): latest %s", rc ? "?" : name);
	/* a new step directory whose only file is staged, open, then closed */
	REQUIRE(ulp_archive_mkdir(a, "run/checkpoint-4", &m) == 0, "mkdir");
	REQUIRE(ulp_session_open_file(s, "run/checkpoint-4/model.bin", O_WRONLY, &m, &h) == 0, "create 4");
	rc = ulp_archive_latest_live(a, s, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-3"), "step 4 open: %s", rc ? "?" : name);
	CHECK(ulp_session_flush(h) == 0, "close 4");
	ulp_session_release(h);
	rc = ulp_archive_latest_live(a, s, "run", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "checkpoint-4"), "step 4 closed, staged only: %s", rc ? "?" : name);
	/* a step file being written (staged only), then closed */
	REQUIRE(ulp_session_open_file(s, "lit/epoch=1-step=20.ckpt", O_WRONLY, &m, &h2) == 0, "create step file");
	rc = ulp_archive_latest_live(a, s, "lit", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "epoch=0-step=10.ckpt"), "a step file being written: %s", rc ? "?" : name);
	CHECK(ulp_session_write(h2, "x", 1, 0) == 1 && ulp_session_flush(h2) == 0, "close step file");
	ulp_session_release(h2);
	rc = ulp_archive_latest_live(a, s, "lit", name, sizeof(name));
	CHECK(rc == 0 && !strcmp(name, "epoch=1-step=20.ckpt"), "closed step file: %s", rc ? "?" : name);
	CHECK(ulp_session_close(s) == 0, "session close");
	ulp_archive_close(a);
}

typedef struct rows {
	char dir[16][128], run[16][64];
	int64_t step[16];
	uint64_t files[16], raw[16], stored[16];
	unsigned depth[16];
	int file[16];
	int n;
} rows;

static int collect(void *arg, const ulp_step_info *s)
{
	rows *r = arg;
	if (r->n == 16)
		return 1;
	snprintf(r->dir[r->n], sizeof(r->dir[0]), "%s", s->dir);
	snprintf(r->run[r->n], sizeof(r->run[0]), "%s", s->run);
	r->step[r->n] = s->step;
	r->files[r->n] = s->files;
	r->raw[r->n] = s->raw_bytes;
	r->stored[r->n] = s->stored_bytes;
	r->depth[r->n] = s->chain_depth;
	r->file[r->n] = s->is_file;
	r->n++;
	return 0;
}

static int stop_at_second(void *arg, const ulp_step_info *s)
{
	(void)s;
	return ++*(int *)arg == 2 ? 42 : 0;
}

static void test_steps_rows(void)
{
	char dir[400];
	ulp_archive *a = new_archive("steps", dir, sizeof(dir));
	/* written out of order: rows come by run, then by step */
	put_tensor_step(a, "run/checkpoint-100/model.safetensors", 1);
	put_tensor_step(a, "run/checkpoint-1000/model.safetensors", 3);
	put_tensor_step(a, "run/checkpoint-200/model.safetensors", 2);
	put_bytes(a, "run/checkpoint-100/global_step100/optim.bin", 9, 1000); /* deeper: still step 100 */
	put_bytes(a, "run/checkpoint-100/trainer_state.json", 8, 300);
	put_bytes(a, "run2/step_5/x", 1, 50);
	put_bytes(a, "run/notes.txt", 2, 20); /* no step: no row */
	put_bytes(a, "a/b/run/iter_3/x", 3, 70);
	rows r = {0};
	REQUIRE(ulp_archive_steps(a, "", collect, &r) == 0, "steps: %s", ulp_archive_errmsg(a));
	static const char *const want[] = {"a/b/run/iter_3", "run/checkpoint-100", "run/checkpoint-200",
	                                   "run/checkpoint-1000", "run2/step_5"};
	CHECK(r.n == 5, "5 rows (got %d)", r.n);
	for (int i = 0; i < r.n && i < 5; i++)
		CHECK(!strcmp(r.dir[i], want[i]), "row %d: %s, want %s", i, r.dir[i], want[i]);
	if (r.n == 5) {
		CHECK(!strcmp(r.run[0], "a/b/run") && !strcmp(r.run[1], "run") && !strcmp(r.run[4], "run2"), "runs");
		CHECK(r.step[0] == 3 && r.step[1] == 100 && r.step[2] == 200 && r.step[3] == 1000 && r.step[4] == 5,
		      "steps");
		ulp_stat st;
		REQUIRE(ulp_archive_stat(a, "run/checkpoint-100/model.safetensors", &st) == 0, "stat");
		CHECK(r.files[1] == 3 && r.raw[1] == st.size + 1000 + 300, "step 100: 3 files at any depth, %llu bytes",
		      (unsigned long long)r.raw[1]);
		CHECK(r.files[2] == 1 && r.raw[2] == st.size && r.files[4] == 1 && r.raw[4] == 50, "one-file steps");
		CHECK(r.stored[1] > 0 && r.stored[2] > 0 && r.stored[2] < r.raw[2], "stored bytes (%llu of %llu)",
		      (unsigned long long)r.stored[2], (unsigned long long)r.raw[2]);
		/* the first and the newest step anchors (layout.c), 200 a delta */
		CHECK(r.depth[1] == 0 && r.depth[2] >= 1 && r.depth[3] == 0, "chain depths %u %u %u", r.depth[1],
		      r.depth[2], r.depth[3]);
	}
	rows p = {0};
	REQUIRE(ulp_archive_steps(a, "run2", collect, &p) == 0, "steps run2");
	CHECK(p.n == 1 && !strcmp(p.dir[0], "run2/step_5") && !strcmp(p.run[0], "run2"), "prefix run2: one row");
	rows q = {0};
	REQUIRE(ulp_archive_steps(a, "run/checkpoint-200", collect, &q) == 0, "steps of one step");
	CHECK(q.n == 1 && q.step[0] == 200, "prefix of a step directory: its row");
	int seen = 0;
	CHECK(ulp_archive_steps(a, "", stop_at_second, &seen) == 42 && seen == 2, "a callback's non-zero stops it");
	rows none = {0};
	int rc = ulp_archive_steps(a, "nosuch", collect, &none);
	CHECK((rc == 0 || rc == -ULP_E_NOENT) && none.n == 0, "no such prefix: no rows (%d)", rc);
	ulp_archive_close(a);

	/* item 16: step files are steps of the folder holding them */
	a = new_archive("stepfiles", dir, sizeof(dir));
	put_tensor_step(a, "lit/ckpts/epoch=1-step=200.ckpt", 2);
	put_tensor_step(a, "lit/ckpts/epoch=0-step=100.ckpt", 1);
	put_bytes(a, "lit/ckpts/last.ckpt", 1, 40);          /* no step */
	put_bytes(a, "lit/hparams.yaml", 2, 30);             /* no step */
	put_bytes(a, "m/checkpoint-5/model_step_5.pt", 3, 60); /* in a step directory: step 5 of m */
	put_bytes(a, "m/checkpoint-5/x", 3, 10);
	rows f = {0};
	REQUIRE(ulp_archive_steps(a, "", collect, &f) == 0, "steps: %s", ulp_archive_errmsg(a));
	CHECK(f.n == 3, "3 rows (got %d)", f.n);
	if (f.n == 3) {
		CHECK(!strcmp(f.dir[0], "lit/ckpts/epoch=0-step=100.ckpt") && !strcmp(f.run[0], "lit/ckpts") &&
		          f.step[0] == 100 && f.files[0] == 1 && f.file[0],
		      "step file 100: %s in %s", f.dir[0], f.run[0]);
		CHECK(!strcmp(f.dir[1], "lit/ckpts/epoch=1-step=200.ckpt") && f.step[1] == 200 && f.file[1],
		      "step file 200: %s", f.dir[1]);
		CHECK(!strcmp(f.dir[2], "m/checkpoint-5") && f.files[2] == 2 && !f.file[2],
		      "a step directory with a step-named file in it: one row, 2 files (%s, %llu)", f.dir[2],
		      (unsigned long long)f.files[2]);
		ulp_stat st;
		REQUIRE(ulp_archive_stat(a, "lit/ckpts/epoch=1-step=200.ckpt", &st) == 0, "stat");
		CHECK(f.raw[1] == st.size && f.stored[1] == st.stored_bytes && f.depth[1] == st.chain_depth,
		      "sizes and depth of a step file are its own");
		/* issue 36: Lightning's files of two epochs are one series: the
		 * older a delta against the newer */
		REQUIRE(ulp_archive_stat(a, "lit/ckpts/epoch=0-step=100.ckpt", &st) == 0, "stat");
		CHECK(!st.anchor && st.chain_depth == 1, "epoch=0-step=100.ckpt: a delta across epochs (depth %u)",
		      st.chain_depth);
	}
	ulp_archive_close(a);
}

static void test_mount_lock(void)
{
	char dir[400], err[512] = "", lock[480];
	ulp_archive *a = new_archive("locked", dir, sizeof(dir));
	ulp_archive_close(a);
	snprintf(lock, sizeof(lock), "%s/mount.lock", dir);
	int fd = -1, fd2 = -1;
	ulp_mount_owner h;
	REQUIRE(ulp_mount_lock(dir, &fd, &h, err, sizeof(err)) == 0, "lock taken: %s", err);
	struct stat sb;
	CHECK(stat(lock, &sb) == 0 && (sb.st_mode & 0777) == 0600, "mount.lock is private");
	/* the holder starting: not noted yet */
	memset(&h, 0x55, sizeof(h));
	CHECK(ulp_mount_lock(dir, &fd2, &h, err, sizeof(err)) == -ULP_E_BUSY, "a second lock is refused");
	CHECK(h.pid == 0 && h.mountpoint[0] == 0 && !h.alive && !h.mounted, "no note yet: pid 0, no mount point");
	CHECK(ulp_mount_lock_note(fd, (long)getpid(), "/mnt/with space") == 0, "note");
	err[0] = 0;
	CHECK(ulp_mount_lock(dir, &fd2, &h, err, sizeof(err)) == -ULP_E_BUSY, "a second lock is refused");
	CHECK(h.pid == (long)getpid() && !strcmp(h.mountpoint, "/mnt/with space") && h.alive && !h.mounted,
	      "it names pid %ld and mount point '%s' (alive %d, mounted %d)", h.pid, h.mountpoint, h.alive, h.mounted);
	CHECK(strstr(err, dir) != NULL, "the message names the archive: %s", err);
	CHECK(ulp_mount_lock(dir, &fd2, NULL, err, sizeof(err)) == -ULP_E_BUSY, "refused without a holder to fill");
	CHECK(ulp_mount_lock_note(fd, 1, "/mnt/a\nb") == -ULP_E_INVAL, "a mount point with a newline is refused");
	/* a read-only open (a read-only mount) does not need the lock */
	ulp_archive_opts ro = {.read_only = 1, .threads = 1};
	ulp_archive *r = NULL;
	CHECK(ulp_archive_open(dir, &ro, &r, err, sizeof(err)) == 0, "read-only open beside the lock: %s", err);
	ulp_archive_close(r);
	close(fd);
	/* let go: taken again, and the former holder's note is gone */
	REQUIRE(ulp_mount_lock(dir, &fd, &h, err, sizeof(err)) == 0, "taken after the holder let go: %s", err);
	CHECK(stat(lock, &sb) == 0 && sb.st_size == 0, "the old note is cleared (%lld bytes)", (long long)sb.st_size);
	close(fd);

	/* a holder in another process: named while it lives, taken over once dead */
	int go[2], ready[2];
	REQUIRE(pipe(go) == 0 && pipe(ready) == 0, "pipe");
	pid_t child = fork();
	REQUIRE(child >= 0, "fork");
	if (child == 0) {
		int cfd;
		char c = 0;
		if (ulp_mount_lock(dir, &cfd, NULL, NULL, 0) != 0 || ulp_mount_lock_note(cfd, (long)getpid(), "/mnt/child") != 0)
			_exit(1);
		if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) < 0)
			_exit(1);
		_exit(0); /* the lock goes with the process; the note stays */
	}
	char c;
	REQUIRE(read(ready[0], &c, 1) == 1, "child holds the lock");
	CHECK(ulp_mount_lock(dir, &fd, &h, err, sizeof(err)) == -ULP_E_BUSY, "held by the child: refused");
	CHECK(h.pid == (long)child && !strcmp(h.mountpoint, "/mnt/child") && h.alive && !h.mounted,
	      "names the child's pid %ld and mount point %s", h.pid, h.mountpoint);
	CHECK(write(go[1], "g", 1) == 1, "release the child");
	int status;
	waitpid(child, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child ran");
	CHECK(stat(lock, &sb) == 0 && sb.st_size > 0, "the dead holder's note is still in the file");
	CHECK(ulp_mount_lock(dir, &fd, &h, err, sizeof(err)) == 0, "a dead holder's lock is taken over: %s", err);
	CHECK(stat(lock, &sb) == 0 && sb.st_size == 0, "its stale note is cleared");
	close(fd);
	close(go[0]);
	close(go[1]);
	close(ready[0]);
	close(ready[1]);
	CHECK(ulp_mount_lock("/nonexistent-dir/x", &fd, &h, err, sizeof(err)) == -ULP_E_IO, "no such archive: IO");
	CHECK(strstr(err, "mount.lock") != NULL, "the message names the lock file: %s", err);
	CHECK(!ulp_mount_active("/") && !ulp_mount_active(dir), "not ulpackfs mounts");
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-steps-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_name_step();
	test_name_cmp();
	test_latest();
	test_latest_live();
	test_steps_rows();
	test_mount_lock();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
