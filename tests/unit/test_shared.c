/* SPDX-License-Identifier: MIT */
/*
 * test_shared.c - an archive many hosts share (store/gen.c, store/lease.c,
 * maint.c invariant 7), with two handles of one process standing for two
 * hosts: published generations and the readers that follow them (never
 * going back, an open file keeping its generation), the one writer's lease
 * (refused, given back, lost to a higher epoch, lost by not renewing), gc's
 * grace, pack ids never given twice, and the live index refused on a
 * network file system. The same on real GlusterFS and CephFS hosts:
 * tests/cluster.
 */
#include "tap.h"
#include "arch_int.h"
#include "store/shared.h"
#include "store/db.h"
#include "archive/writer.h"
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char root[256];

static void write_file(const char *path, size_t n, unsigned seed)
{
	FILE *f = fopen(path, "wb");
	REQUIRE(f, "create %s", path);
	for (size_t i = 0; i < n; i++)
		fputc((int)((i * 2654435761u + seed * 40503u) >> 11) & 0xff, f);
	REQUIRE(fclose(f) == 0, "write %s", path);
}

static int put(ulp_archive *a, const char *apath, unsigned seed)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/src-%u", root, seed);
	write_file(p, 70000 + seed * 1000, seed);
	int fd = open(p, O_RDONLY);
	REQUIRE(fd >= 0, "open %s", p);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	int rc = ulp_archive_put(a, apath, fd, &m, NULL);
	close(fd);
	return rc;
}

static int exists(ulp_archive *a, const char *p)
{
	ulp_stat st;
	return ulp_archive_stat(a, p, &st) == 0;
}

static void mkarchive(const char *name, char *dir, size_t cap)
{
	char err[512];
	snprintf(dir, cap, "%s/%s", root, name);
	REQUIRE(ulp_archive_init(dir, err, sizeof(err)) == 0, "init: %s", err);
}

static ulp_archive *open_as(const char *dir, int ro, unsigned lease_ms, unsigned grace_s, char *err, int *rc)
{
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 2, .read_only = ro, .poll_ms = 50,
	                      .lease_ms = lease_ms, .grace_s = grace_s};
	ulp_archive *a = NULL;
	*rc = ulp_archive_open(dir, &o, &a, err, 512);
	return a;
}

static uint64_t gen_of(ulp_archive *a)
{
	ulp_generation g;
	ulp_archive_generation(a, &g);
	return g.gen;
}

/* A reader on another host follows what the writer publishes: new files
 * show, removed ones go, an open file keeps its bytes, and a CURRENT that
 * would go back is not followed. */
static void test_follow(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("follow", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share: %s", w ? ulp_archive_errmsg(w) : err);
	ulp_generation g;
	ulp_archive_generation(w, &g);
	CHECK(g.shared && g.writer && g.gen == 1 && g.epoch == 1, "shared: generation %llu epoch %llu",
	      (unsigned long long)g.gen, (unsigned long long)g.epoch);
	REQUIRE(put(w, "run/checkpoint-1/model.bin", 1) == 0, "put: %s", ulp_archive_errmsg(w));
	CHECK(ulp_archive_publish(w) == 0 && gen_of(w) == 2, "published generation %llu", (unsigned long long)gen_of(w));
	uint64_t before = gen_of(w);
	CHECK(ulp_archive_publish(w) == 0 && gen_of(w) == before, "nothing new: no generation");

	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	REQUIRE(r, "read-only open of a shared archive: %s", err);
	CHECK(exists(r, "run/checkpoint-1/model.bin") && gen_of(r) == 2, "the reader opens the newest generation");
	ulp_file *f;
	REQUIRE(ulp_file_open(r, "run/checkpoint-1/model.bin", &f) == 0, "open: %s", ulp_archive_errmsg(r));

	REQUIRE(put(w, "run/checkpoint-2/model.bin", 2) == 0, "put 2");
	CHECK(ulp_archive_remove(w, "run/checkpoint-1/model.bin") == 0, "remove 1");
	CHECK(ulp_archive_publish(w) == 0, "publish");
	usleep(80000); /* the reader's poll interval: 50 ms */
	CHECK(exists(r, "run/checkpoint-2/model.bin"), "a new file shows on the reader after its poll");
	CHECK(!exists(r, "run/checkpoint-1/model.bin"), "a removed file goes");
	CHECK(gen_of(r) == gen_of(w), "the reader follows generation %llu (writer %llu)",
	      (unsigned long long)gen_of(r), (unsigned long long)gen_of(w));
	static uint8_t buf[80000];
	char src[600];
	snprintf(src, sizeof(src), "%s/src-1", root);
	FILE *sf = fopen(src, "rb");
	static uint8_t want[80000];
	size_t wn = sf ? fread(want, 1, sizeof(want), sf) : 0;
	if (sf)
		fclose(sf);
	CHECK(ulp_file_pread(f, buf, sizeof(buf), 0) == (int64_t)wn && !memcmp(buf, want, wn),
	      "an open file keeps the bytes of its generation: %s", ulp_archive_errmsg(r));
	ulp_file_close(f);

	/* a pointer that goes back (a fenced writer's, or a restore) is not followed */
	uint64_t now = gen_of(r);
	char cur[600];
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", dir);
	FILE *c = fopen(cur, "w");
	REQUIRE(c, "CURRENT");
	fprintf(c, "ulpack-current 1 1 1 1\n");
	fclose(c);
	usleep(80000);
	CHECK(exists(r, "run/checkpoint-2/model.bin") && gen_of(r) == now, "no reader goes back (still %llu)",
	      (unsigned long long)gen_of(r));
	REQUIRE(put(w, "run/checkpoint-3/model.bin", 3) == 0, "put 3");
	CHECK(ulp_archive_publish(w) == 0 && gen_of(w) > now, "the writer publishes past the pointer's number: %llu",
	      (unsigned long long)gen_of(w));
	ulp_archive_close(r);

	/* a generation file is private, as the archive (archive.c) */
	char gp[700];
	struct stat sb = {0};
	snprintf(gp, sizeof(gp), "%s/index/gen-%020llu.db", dir, (unsigned long long)gen_of(w));
	int there = stat(gp, &sb) == 0;
	snprintf(gp, sizeof(gp), "%s/index/gen-%020llu.patch", dir, (unsigned long long)gen_of(w));
	there = there || stat(gp, &sb) == 0;
	CHECK(there && (sb.st_mode & 0777) == 0600, "generation file mode %o", sb.st_mode & 0777);
	ulp_archive_close(w);
}

/* One writer: a second is refused while the lease holds; one given back
 * at close is taken at once, with the next epoch. */
static void test_lease(void)
{
	char dir[512], err[512], err2[512];
	int rc, rc2;
	mkarchive("lease", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	ulp_archive *w2 = open_as(dir, 0, 0, 0, err2, &rc2);
	CHECK(!w2 && rc2 == -ULP_E_BUSY && strstr(err2, "another writer holds the archive's lease") &&
	      strstr(err2, "epoch 1"), "a second writer is refused: %s", err2);
	ulp_archive_close(w2);
	ulp_archive_close(w);
	w2 = open_as(dir, 0, 0, 0, err2, &rc2);
	ulp_generation g = {0};
	if (w2)
		ulp_archive_generation(w2, &g);
	CHECK(w2 && g.epoch == 2, "a lease given back is taken at once, epoch %llu: %s", (unsigned long long)g.epoch,
	      w2 ? "" : err2);
	ulp_archive_close(w2);
}

/* A writer that finds a higher epoch stops archiving and publishing. */
static void test_fenced_by_epoch(void)
{
	char dir[512], err[512], lp[700];
	int rc;
	mkarchive("epoch", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 2000, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "a", 1) == 0, "put");
	REQUIRE(ulp_archive_publish(w) == 0, "publish");
	uint64_t published = gen_of(w);
	/* another host took the archive over (its lease file, epoch 2) */
	snprintf(lp, sizeof(lp), "%s/lease/%020d", dir, 2);
	FILE *f = fopen(lp, "w");
	REQUIRE(f, "lease 2");
	fprintf(f, "ulpack-lease 1 2 %lld 15000 1 otherhost\n", (long long)ulp_wall_ms());
	fclose(f);
	usleep(1200000); /* the renewer looks every lease/4 (500 ms) */
	rc = put(w, "b", 2);
	CHECK(rc == -ULP_E_FENCED && strstr(ulp_archive_errmsg(w), "another writer took the archive over (epoch 2, host "
	                                                                 "otherhost"),
	      "the old writer stops archiving: %d %s", rc, ulp_archive_errmsg(w));
	CHECK(ulp_archive_publish(w) == -ULP_E_FENCED, "and publishing");
	ulp_generation g;
	ulp_archive_generation(w, &g);
	CHECK(g.fenced, "it says it is fenced");
	char cur[600], line[128] = "";
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", dir);
	f = fopen(cur, "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	unsigned v = 0;
	unsigned long long cg = 0, ce = 0;
	CHECK(sscanf(line, "ulpack-current %u %llu %llu", &v, &cg, &ce) == 3 && cg == published && ce == 1,
	      "CURRENT stays the last one it published: %s", line);
	ulp_archive_close(w);
	/* closed fenced: it gave nothing back (the lease is epoch 2's) */
	f = fopen(lp, "r");
	CHECK(f && fgets(line, sizeof(line), f) && strstr(line, "otherhost"), "epoch 2's lease untouched");
	if (f)
		fclose(f);
}

/* A publication that takes longer than the lease (a slow network file
 * system) does not hold the renewals back: the writer keeps its lease
 * (lease.c invariant 4; the renewer published too, and fenced itself). */
static void test_slow_publication(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("slowpub", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 800, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	__atomic_store_n(&ulp_gen_test_publish_delay_ms, 1500, __ATOMIC_RELAXED);
	REQUIRE(put(w, "a", 1) == 0, "put");
	usleep(2500000); /* the periodic publication of "a" takes 1.5 s: almost twice the lease */
	__atomic_store_n(&ulp_gen_test_publish_delay_ms, 0, __ATOMIC_RELAXED);
	rc = put(w, "b", 2);
	CHECK(rc == 0, "the writer still holds its lease after a publication of twice its lease: %s",
	      rc ? ulp_archive_errmsg(w) : "");
	ulp_archive_close(w);
}

/* A writer that cannot renew (a partition) stops before its lease can
 * expire for the others; another host takes over once it has. */
static void test_fenced_by_expiry(void)
{
	char dir[512], err[512], err2[512];
	int rc, rc2;
	mkarchive("expiry", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 1500, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "a", 1) == 0, "put");
	__atomic_store_n(&ulp_lease_test_stall, 1, __ATOMIC_RELAXED);
	ulp_archive *w2 = open_as(dir, 0, 1500, 0, err2, &rc2);
	CHECK(!w2 && rc2 == -ULP_E_BUSY, "refused while the lease holds: %s", err2);
	ulp_archive_close(w2);
	usleep(1700000); /* more than the lease: it was not renewed */
	rc = put(w, "b", 2);
	CHECK(rc == -ULP_E_FENCED && strstr(ulp_archive_errmsg(w), "could not renew its lease"),
	      "the partitioned writer stopped: %s", ulp_archive_errmsg(w));
	__atomic_store_n(&ulp_lease_test_stall, 0, __ATOMIC_RELAXED); /* (the hook is the process's: w2's too) */
	w2 = open_as(dir, 0, 2000, 0, err2, &rc2);
	ulp_generation g = {0};
	if (w2)
		ulp_archive_generation(w2, &g);
	CHECK(w2 && g.epoch == 2 && exists(w2, "a") && !exists(w2, "b"), "another writer took over with epoch %llu: %s",
	      (unsigned long long)g.epoch, w2 ? "" : err2);
	CHECK(w2 && put(w2, "c", 3) == 0 && ulp_archive_publish(w2) == 0, "the new writer archives and publishes");
	ulp_archive_close(w);
	ulp_archive_close(w2);
}

/* Reads file p whole into a new buffer (NULL: none); its size in *n. */
static char *slurp(const char *p, size_t *n)
{
	FILE *f = fopen(p, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long l = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = malloc((size_t)(l > 0 ? l : 1));
	*n = b && l > 0 ? fread(b, 1, (size_t)l, f) : 0;
	fclose(f);
	return b;
}

static void spill(const char *p, const char *b, size_t n)
{
	FILE *f = fopen(p, "wb");
	if (f) {
		fwrite(b, 1, n, f);
		fclose(f);
	}
}

/* A file staged through the writer's session API, as a mount stages it:
 * synced (durable at close), archived or not. */
static void stage(ulp_archive *a, const char *apath, unsigned seed, int archive)
{
	ulp_stage *s;
	char p[600], buf[4096];
	REQUIRE(ulp_stage_new(a, NULL, &s) == 0, "stage %s: %s", apath, ulp_archive_errmsg(a));
	snprintf(p, sizeof(p), "%s/src-%u", root, seed);
	write_file(p, 70000 + seed * 1000, seed);
	FILE *f = fopen(p, "rb");
	uint64_t off = 0;
	for (size_t n; f && (n = fread(buf, 1, sizeof(buf), f)) > 0; off += n)
		REQUIRE(ulp_stage_write(s, buf, n, off) == (int64_t)n, "write");
	if (f)
		fclose(f);
	ulp_meta m = {0644, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_stage_sync(s, apath, &m) == 0, "sync %s", apath);
	if (archive)
		REQUIRE(ulp_stage_commit(s, apath, &m, NULL) == 0, "commit %s: %s", apath, ulp_archive_errmsg(a));
	else
		ulp_stage_close(s);
}

/* Whether archive path apath holds the bytes of seed's source. */
static int holds(ulp_archive *a, const char *apath, unsigned seed)
{
	char p[600];
	size_t n = 0;
	snprintf(p, sizeof(p), "%s/src-%u", root, seed);
	char *want = slurp(p, &n);
	ulp_file *f = NULL;
	int ok = want && ulp_file_open(a, apath, &f) == 0 && ulp_file_get_stat(f)->size == n;
	char *got = ok ? malloc(n) : NULL;
	ok = ok && got && ulp_file_pread(f, got, n, 0) == (int64_t)n && !memcmp(got, want, n);
	if (f)
		ulp_file_close(f);
	free(got);
	free(want);
	return ok;
}

/* Issue 34 item 1: a writer cut off by a partition while it archives; a
 * second takes over, archives and publishes; then the partition heals and
 * the first one's writes that were in flight land (here: its live index
 * files written back as they were, its last pointer renamed over CURRENT,
 * its staged files removed by their names). The next writer loses nothing:
 * neither what the first one had staged and archived (not published yet),
 * nor what the second one archived and published (gen.c invariant 7,
 * staging.c invariants 5 and 6). */
static void test_late_writes_of_fenced_writer(void)
{
	char dir[512], err[512], err2[512], p[900];
	int rc, rc2;
	mkarchive("late", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 1200, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	stage(w, "run/step-1/a.bin", 11, 1); /* archived, maybe not published */
	stage(w, "run/step-1/b.bin", 12, 0); /* closed, waiting to be archived */
	/* what the first writer's files hold now: its late writes put this back */
	static const char *const names[] = {"ulpack.db", "ulpack.db-wal", "index/CURRENT"};
	char *old[8] = {0}, *oldp[8] = {0};
	size_t oldn[8] = {0}, no = 0;
	for (size_t i = 0; i < 3; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		if ((old[no] = slurp(p, &oldn[no])))
			oldp[no++] = strdup(p);
	}
	DIR *d = opendir(dir);
	snprintf(p, sizeof(p), "%s/index", dir);
	DIR *di = opendir(p);
	for (struct dirent *e; di && (e = readdir(di));)
		if (!strncmp(e->d_name, "live-", 5) && !strstr(e->d_name, "-shm") && no < 8) {
			snprintf(p, sizeof(p), "%s/index/%s", dir, e->d_name);
			if ((old[no] = slurp(p, &oldn[no])))
				oldp[no++] = strdup(p);
		}
	if (di)
		closedir(di);
	if (d)
		closedir(d);
	char *staged[16] = {0};
	size_t ns = 0;
	snprintf(p, sizeof(p), "%s/staging", dir);
	di = opendir(p);
	for (struct dirent *e; di && (e = readdir(di));)
		if (e->d_name[0] != '.' && ns < 16) {
			snprintf(p, sizeof(p), "%s/staging/%s", dir, e->d_name);
			staged[ns++] = strdup(p);
		}
	if (di)
		closedir(di);
	/* the partition: its renewals stall, its lease runs out */
	__atomic_store_n(&ulp_lease_test_stall, 1, __ATOMIC_RELAXED);
	usleep(1500000);
	CHECK(put(w, "fenced", 13) == -ULP_E_FENCED, "the cut-off writer stopped");
	__atomic_store_n(&ulp_lease_test_stall, 0, __ATOMIC_RELAXED);
	ulp_proc_tag_test_host("host2"); /* what follows runs on another host */
	ulp_archive *w2 = open_as(dir, 0, 5000, 0, err2, &rc2);
	REQUIRE(w2, "another host takes over: %s", err2);
	unsigned rec = 0, rem = 0;
	CHECK(ulp_stage_recover(w2, &rec, &rem) == 0, "it recovers the staged files: %s", ulp_archive_errmsg(w2));
	stage(w2, "run/step-2/a.bin", 21, 1);
	CHECK(put(w2, "run/step-2/c.bin", 22) == 0 && ulp_archive_publish(w2) == 0, "it archives and publishes");
	/* the heal: the first writer's writes in flight land */
	for (size_t i = 0; i < no; i++)
		spill(oldp[i], old[i], oldn[i]);
	for (size_t i = 0; i < ns; i++)
		unlink(staged[i]);
	ulp_archive_close(w2);
	ulp_archive_close(w);
	/* the next writer, and a reader of what it publishes */
	ulp_proc_tag_test_host("host3");
	ulp_archive *w3 = open_as(dir, 0, 5000, 0, err, &rc);
	REQUIRE(w3, "the next writer: %s", err);
	CHECK(ulp_stage_recover(w3, &rec, &rem) == 0, "its recovery: %s", ulp_archive_errmsg(w3));
	CHECK(holds(w3, "run/step-1/a.bin", 11), "the file the cut-off writer archived is there");
	CHECK(holds(w3, "run/step-1/b.bin", 12), "the file it had staged is there");
	CHECK(holds(w3, "run/step-2/a.bin", 21) && holds(w3, "run/step-2/c.bin", 22),
	      "the files the second writer archived and published are there");
	CHECK(ulp_archive_publish(w3) == 0, "it publishes");
	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r && holds(r, "run/step-1/a.bin", 11) && holds(r, "run/step-1/b.bin", 12) &&
	      holds(r, "run/step-2/a.bin", 21) && holds(r, "run/step-2/c.bin", 22), "a reader sees every file: %s",
	      r ? "" : err);
	ulp_archive_close(r);
	ulp_archive_close(w3);
	ulp_proc_tag_test_host(NULL);
	for (size_t i = 0; i < no; i++) {
		free(old[i]);
		free(oldp[i]);
	}
	for (size_t i = 0; i < ns; i++)
		free(staged[i]);
}

/* Issue 34 item 2: a writer whose open fails after it took the lease (its
 * index unreadable: here a schema this build does not read) publishes
 * nothing: index/ and CURRENT stay as they were, and readers keep reading. */
static void test_failed_open_publishes_nothing(void)
{
	char dir[512], err[512], p[700];
	int rc;
	mkarchive("badopen", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 2000, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "a", 1) == 0 && ulp_gen_publish(w, 2) == 0, "put, publish whole");
	ulp_archive_close(w);
	/* every index a writer may open: damaged */
	snprintf(p, sizeof(p), "%s/index", dir);
	DIR *d = opendir(p);
	for (struct dirent *e; d && (e = readdir(d));) {
		size_t l = strlen(e->d_name);
		if (l > 3 && !strcmp(e->d_name + l - 3, ".db")) {
			char f[1200];
			snprintf(f, sizeof(f), "%s/index/%s", dir, e->d_name);
			sqlite3 *db;
			if (sqlite3_open(f, &db) == SQLITE_OK)
				sqlite3_exec(db, "UPDATE meta SET value = 999 WHERE key = 'schema_version'", NULL, NULL, NULL);
			sqlite3_close(db);
		}
	}
	if (d)
		closedir(d);
	snprintf(p, sizeof(p), "%s/ulpack.db", dir);
	sqlite3 *db;
	if (sqlite3_open(p, &db) == SQLITE_OK)
		sqlite3_exec(db, "UPDATE meta SET value = 999 WHERE key = 'schema_version'", NULL, NULL, NULL);
	sqlite3_close(db);
	size_t n0 = 0, n1 = 0;
	snprintf(p, sizeof(p), "%s/index/CURRENT", dir);
	char *before = slurp(p, &n0);
	w = open_as(dir, 0, 2000, 0, err, &rc);
	CHECK(!w && rc < 0, "the writer's open fails: %s", err);
	ulp_archive_close(w);
	char *after = slurp(p, &n1);
	CHECK(before && after && n0 == n1 && !memcmp(before, after, n0), "CURRENT stays as it was: %.*s -> %.*s",
	      (int)n0, before ? before : "", (int)n1, after ? after : "");
	free(before);
	free(after);
}

/* Issue 34 item 15: what a garbage pointer file holds reaches an error
 * message escaped (no control byte of it on a terminal) and cut short. */
static int printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
			return 0;
	return 1;
}

static void test_garbage_current(void)
{
	char q[16], big[64];
	CHECK(!strcmp(ulp_quote(q, 14, "a\\b\n\x1b\0", 6), "a\\\\b\\n\\x1b..."), "quote: %s", q);
	CHECK(!strcmp(ulp_quote(q, 15, "a\\b\n\x1b\0", 6), "a\\\\b\\n\\x1b\\x00"), "quote, all: %s", q);
	CHECK(!strcmp(ulp_quote(q, sizeof(q), "ab\tc\r", 5), "ab\\tc\\r"), "quote, whole: %s", q);
	CHECK(!strcmp(ulp_quote(q, 4, "abcd", 4), "..."), "quote in 4: %s", q);
	CHECK(!strcmp(ulp_quote(q, 5, "abcd", 4), "abcd"), "quote exactly: %s", q);
	CHECK(!strcmp(ulp_quote(q, 5, "abcde", 5), "a..."), "quote cut: %s", q);
	char many[1000];
	memset(many, 0x9b, sizeof(many));
	ulp_quote(big, sizeof(big), many, sizeof(many));
	CHECK(strlen(big) < sizeof(big) && printable(big) && strstr(big, "\\x9b...") &&
	      strlen(big) + 1 + 4 > sizeof(big), "quote cut at a whole escape: %s", big);

	char dir[512], err[512], p[700];
	int rc;
	mkarchive("garbage", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 2000, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "a", 1) == 0 && ulp_archive_publish(w) == 0, "put, publish");
	ulp_archive_close(w);
	/* only CURRENT, garbage: a terminal's escapes, newlines, a NUL, and long */
	snprintf(p, sizeof(p), "%s/index", dir);
	DIR *d = opendir(p);
	for (struct dirent *e; d && (e = readdir(d));)
		if (!strncmp(e->d_name, "CURRENT-", 8)) {
			char f[1200];
			snprintf(f, sizeof(f), "%s/index/%s", dir, e->d_name);
			unlink(f);
		}
	if (d)
		closedir(d);
	static const char junk[] = "\x1b]0;owned\a\x1b[2J\x1b[31mred\r\nulpack-current\n\0tail";
	snprintf(p, sizeof(p), "%s/index/CURRENT", dir);
	FILE *f = fopen(p, "wb");
	REQUIRE(f, "CURRENT");
	fwrite(junk, 1, sizeof(junk) - 1, f);
	for (int i = 0; i < 200; i++)
		fputc('A' + i % 26, f);
	fclose(f);
	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(!r && rc == -ULP_E_CORRUPT, "a garbage CURRENT is refused: %d", rc);
	ulp_archive_close(r);
	CHECK(printable(err), "the message holds no control byte");
	CHECK(strstr(err, "index/CURRENT") && strstr(err, "\\x1b]0;owned\\x07\\x1b[2J") && strstr(err, "\\r\\n"),
	      "it shows the start of the file, escaped: %s", err);
	const char *at = strstr(err, "(\"");
	CHECK(at && strstr(at, "...\")") && strlen(at) < 80, "cut short: %s", at ? at : err);
}

static int count_packs(const char *dir)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/packs", dir);
	DIR *d = opendir(p);
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d));)
		n += strstr(e->d_name, ".pack") != NULL;
	if (d)
		closedir(d);
	return n;
}

/* gc keeps what a retained generation names for the grace; a reader of an
 * older generation gets a clear error after it, never wrong bytes. */
static void test_grace(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("grace", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 1, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "one", 1) == 0 && put(w, "two", 2) == 0, "put");
	REQUIRE(ulp_archive_publish(w) == 0, "publish");
	/* a reader that does not look for new generations (poll: an hour) */
	ulp_archive_opts ro = {.cache_size = 16 << 20, .threads = 2, .read_only = 1, .poll_ms = 3600000};
	ulp_archive *r = NULL;
	REQUIRE(ulp_archive_open(dir, &ro, &r, err, sizeof(err)) == 0, "reader: %s", err);
	int packs = count_packs(dir);
	CHECK(ulp_archive_remove(w, "one") == 0, "remove");
	ulp_gc_result res;
	CHECK(ulp_archive_gc(w, &res) == 0 && res.packs_removed == 1, "gc drops one pack: %s",
	      ulp_archive_errmsg(w));
	CHECK(count_packs(dir) == packs, "its file stays for the grace (%d packs)", count_packs(dir));
	CHECK(ulp_archive_grace_sweep(w, 1) == 0, "nothing is due before the grace");
	usleep(1200000);
	ulp_gen_retire(w);
	CHECK(ulp_archive_grace_sweep(w, 1) == 1 && count_packs(dir) == packs - 1,
	      "past the grace, with no older generation left, the pack goes (%d)", count_packs(dir));
	ulp_file *f = NULL;
	static uint8_t buf[80000];
	rc = ulp_file_open(r, "one", &f);
	int64_t n = rc == 0 ? ulp_file_pread(f, buf, sizeof(buf), 0) : rc;
	CHECK(n < 0 && strstr(ulp_archive_errmsg(r), "superseded more than the writer's grace ago"),
	      "a reader older than the grace gets a clear error: %s", ulp_archive_errmsg(r));
	ulp_file_close(f);
	ulp_archive_close(r);
	r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r && !exists(r, "one") && exists(r, "two"), "a reader now sees the newest generation");
	ulp_archive_close(r);
	ulp_archive_close(w);
}

/* A pack id names one pack in every generation (index.c invariant 8). */
static void test_pack_ids(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("ids", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w, "open");
	REQUIRE(put(w, "one", 1) == 0 && put(w, "two", 2) == 0, "put");
	sqlite3_stmt *st;
	sqlite3_int64 max1 = 0, max2 = 0;
	REQUIRE(sqlite3_prepare_v2(ulp_db(w), "SELECT max(id) FROM packs", -1, &st, NULL) == SQLITE_OK, "prepare");
	if (sqlite3_step(st) == SQLITE_ROW)
		max1 = sqlite3_column_int64(st, 0);
	sqlite3_reset(st);
	ulp_gc_result res;
	CHECK(ulp_archive_remove(w, "two") == 0 && ulp_archive_gc(w, &res) == 0 && res.packs_removed >= 1, "gc");
	REQUIRE(put(w, "three", 3) == 0, "put 3");
	if (sqlite3_step(st) == SQLITE_ROW)
		max2 = sqlite3_column_int64(st, 0);
	sqlite3_finalize(st);
	CHECK(max2 > max1, "the newest pack's id %lld is past the removed one's %lld", (long long)max2, (long long)max1);
	ulp_archive_close(w);
}

/* The live index of an archive on a network file system is the writer's:
 * a read-only open of one that is not shared is refused, naming the mode;
 * a writer there makes it shared. */
static void test_netfs(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("netfs", dir, sizeof(dir));
	setenv("ULP_TEST_NETFS", "fuse.glusterfs", 1);
	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(!r && rc == -ULP_E_UNSUPPORTED && strstr(err, "network file system (fuse.glusterfs)") &&
	      strstr(err, "ulpack share"), "read-only on the live index is refused: %s", err);
	ulp_archive_close(r);
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	ulp_generation g = {0};
	if (w)
		ulp_archive_generation(w, &g);
	CHECK(w && g.shared && g.writer && g.gen == 1, "a writer on a network file system shares the archive: %s",
	      w ? "" : err);
	ulp_archive_close(w);
	r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r != NULL, "read-only then follows its generations: %s", r ? "" : err);
	ulp_archive_close(r);
	unsetenv("ULP_TEST_NETFS");
}

/* Generations after the first whole one are patches of it (gen.c
 * invariant 6): a reader reads them through genvfs.c; a damaged patch is
 * refused whole (genvfs.c invariant 1), never read. */
static void test_patches(void)
{
	char dir[512], err[512], name[64];
	int rc;
	mkarchive("patch", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	for (int i = 0; i < 60; i++) { /* an index of some pages */
		snprintf(name, sizeof(name), "run/checkpoint-%d/model.bin", (i + 1) * 10);
		REQUIRE(put(w, name, (unsigned)(i % 7 + 1)) == 0, "put %d: %s", i, ulp_archive_errmsg(w));
	}
	REQUIRE(ulp_archive_publish(w) == 0, "publish");
	REQUIRE(put(w, "run/checkpoint-999/model.bin", 5) == 0, "put");
	REQUIRE(ulp_archive_publish(w) == 0, "publish a patch");
	char cur[600], line[160] = "";
	snprintf(cur, sizeof(cur), "%s/index/CURRENT", dir);
	FILE *f = fopen(cur, "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	CHECK(!strncmp(line, "ulpack-current 2 ", 17), "the newest generation is a patch: %s", line);
	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r && exists(r, "run/checkpoint-999/model.bin") && exists(r, "run/checkpoint-10/model.bin") &&
	      exists(r, "run/checkpoint-600/model.bin"), "a reader reads through the patch: %s", r ? "" : err);
	CHECK(r && ulp_archive_latest(r, "run", name, sizeof(name)) == 0 && !strcmp(name, "checkpoint-999"),
	      "latest through the patch: %s", r ? name : "");
	ulp_archive_close(r);
	/* one byte of the patch's pages flipped: the open fails, naming it */
	unsigned long long g = 0, e = 0, b = 0, base = 0;
	CHECK(sscanf(line, "ulpack-current 2 %llu %llu %llu %llu", &g, &e, &b, &base) == 4, "parse CURRENT");
	char pp[700];
	snprintf(pp, sizeof(pp), "%s/index/gen-%020llu.patch", dir, g);
	int fd = open(pp, O_RDWR);
	uint8_t c = 0;
	REQUIRE(fd >= 0 && pread(fd, &c, 1, (off_t)b - 100) == 1, "patch");
	c ^= 0x40;
	REQUIRE(pwrite(fd, &c, 1, (off_t)b - 100) == 1, "damage");
	close(fd);
	r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(!r && rc < 0 && strstr(err, ".patch"), "a damaged patch is refused: %d %s", rc, err);
	ulp_archive_close(r);
	ulp_archive_close(w);
}

/* A patched generation's connection makes the temporary files of a sort
 * that outgrows memory (SQLite opens them through the connection's VFS,
 * ulpgen): genvfs.c hands them to the default VFS, as a whole generation's
 * connection has them. */
static void test_patch_temp(void)
{
	char base[512], patch[512], *uri;
	snprintf(base, sizeof(base), "%s/temp-base.db", root);
	snprintf(patch, sizeof(patch), "%s/temp.patch", root);
	sqlite3 *db;
	REQUIRE(sqlite3_open(base, &db) == SQLITE_OK &&
	                sqlite3_exec(db, "PRAGMA page_size=512; CREATE TABLE t(a INTEGER PRIMARY KEY, b BLOB);"
	                                 "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
	                                 "INSERT INTO t SELECT i, randomblob(1000) FROM n;",
	                             NULL, NULL, NULL) == SQLITE_OK,
	        "base: %s", sqlite3_errmsg(db));
	sqlite3_close(db);
	/* the patch: page 1 as it is (genvfs.c's format) */
	uint8_t m[ULP_GENPATCH_HEADER + 4 + 512] = "ULPGENP1";
	struct stat sb;
	int fd = open(base, O_RDONLY);
	REQUIRE(fd >= 0 && fstat(fd, &sb) == 0 && pread(fd, m + ULP_GENPATCH_HEADER + 4, 512, 0) == 512, "read %s", base);
	close(fd);
	uint32_t hd[4] = {512, (uint32_t)(sb.st_size / 512), 1, 0};
	m[8] = 1;
	for (int i = 0; i < 4; i++)
		for (int k = 0; k < 4; k++)
			m[16 + 4 * i + k] = (uint8_t)(hd[i] >> (8 * k));
	m[ULP_GENPATCH_HEADER] = 1; /* page 1 */
	uint64_t h = ulp_xxh64(m + ULP_GENPATCH_HEADER, sizeof(m) - ULP_GENPATCH_HEADER);
	for (int k = 0; k < 8; k++)
		m[32 + k] = (uint8_t)(h >> (8 * k));
	FILE *f = fopen(patch, "wb");
	REQUIRE(f && fwrite(m, 1, sizeof(m), f) == sizeof(m) && fclose(f) == 0, "write %s", patch);
	REQUIRE(ulp_genvfs_register() == 0, "register ulpgen");
	uri = sqlite3_mprintf("file:%s?immutable=1&vfs=ulpgen&patch=%s", base, patch);
	int rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
	char *msg = NULL;
	int n = 0;
	if (rc == SQLITE_OK) /* a small cache: the sort of 400 kB spills to temporary files */
		rc = sqlite3_exec(db, "PRAGMA cache_size=1", NULL, NULL, &msg);
	sqlite3_stmt *st = NULL;
	if (rc == SQLITE_OK)
		rc = sqlite3_prepare_v2(db, "SELECT a FROM t ORDER BY b", -1, &st, NULL);
	while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
		n++;
		rc = SQLITE_OK;
	}
	CHECK(rc == SQLITE_DONE && n == 400, "a sort past memory through a patch: %d rows, %d %s", n, rc,
	      sqlite3_errmsg(db));
	sqlite3_finalize(st);
	sqlite3_free(msg);
	sqlite3_close(db);
	sqlite3_free(uri);
}

/* A publication never waits for a reader of an older snapshot, nor is it
 * skipped: the checkpoint cannot complete, a backup copy is published
 * (gen.c invariant 5; gluster_hosts.sh's host 3 missed a step at sync). */
static void test_publish_beside_reader(void)
{
	char dir[512], err[512], db[600];
	int rc;
	mkarchive("busy", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	REQUIRE(put(w, "one", 1) == 0 && ulp_archive_publish(w) == 0, "put, publish");
	snprintf(db, sizeof(db), "%s/ulpack.db", dir);
	sqlite3 *old = NULL;
	sqlite3_stmt *st = NULL;
	REQUIRE(sqlite3_open_v2(db, &old, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
	        sqlite3_prepare_v2(old, "SELECT path FROM entries", -1, &st, NULL) == SQLITE_OK &&
	        sqlite3_step(st) == SQLITE_ROW, "a reader holds a snapshot");
	REQUIRE(put(w, "two", 2) == 0, "put two");
	int64_t t0 = ulp_mono_ms();
	CHECK(ulp_archive_publish(w) == 0, "publish beside the reader: %s", ulp_archive_errmsg(w));
	CHECK(ulp_mono_ms() - t0 < 5000, "without waiting for it (%lld ms)", (long long)(ulp_mono_ms() - t0));
	ulp_archive *r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r && exists(r, "two") && exists(r, "one"), "the new generation holds the new file: %s", r ? "" : err);
	ulp_archive_close(r);
	sqlite3_finalize(st);
	sqlite3_close(old);
	REQUIRE(put(w, "three", 3) == 0 && ulp_archive_publish(w) == 0, "then the next publication");
	r = open_as(dir, 1, 0, 0, err, &rc);
	CHECK(r && exists(r, "three") && exists(r, "two"), "and the next: %s", r ? "" : err);
	ulp_archive_close(r);
	ulp_archive_close(w);
}


/* ---- many hosts write (archive/contrib.c) -------------------------------- */

static const ulp_meta M644 = {0644, 0, 0, {0, 0}};

static int swrite(ulp_session *s, const char *path, size_t n, unsigned seed)
{
	ulp_sfile *h;
	int rc = ulp_session_open_file(s, path, O_WRONLY | O_TRUNC, &M644, &h);
	if (rc < 0)
		return rc;
	static uint8_t b[200000];
	for (size_t i = 0; i < n && i < sizeof(b); i++)
		b[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 11);
	if (ulp_session_write(h, b, n, 0) != (int64_t)n)
		rc = -ULP_E_IO;
	int r2 = ulp_session_flush(h);
	ulp_session_release(h);
	return rc < 0 ? rc : r2;
}

/* 1 if path reads in a as swrite(n, seed) wrote it. */
static int same(ulp_archive *a, const char *path, size_t n, unsigned seed)
{
	ulp_file *f;
	if (ulp_file_open(a, path, &f) < 0)
		return 0;
	static uint8_t b[200001];
	int64_t got = ulp_file_pread(f, b, sizeof(b), 0);
	ulp_file_close(f);
	if (got != (int64_t)n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (b[i] != (uint8_t)((i * 2654435761u + seed * 40503u) >> 11))
			return 0;
	return 1;
}

static void fail_cb(void *arg, const char *path, const char *why)
{
	(void)path, (void)why;
	(*(int *)arg)++;
}

static unsigned files_in(const char *dir, const char *suffix)
{
	DIR *d = opendir(dir);
	unsigned n = 0;
	for (struct dirent *de; d && (de = readdir(d));) {
		size_t l = strlen(de->d_name), sl = strlen(suffix);
		n += l > sl && !strcmp(de->d_name + l - sl, suffix);
	}
	if (d)
		closedir(d);
	return n;
}

/* Every host writes, the lease holder archives: a contributor's files are
 * staged in its own staging/h-HOST, served there, taken and archived by the
 * archiver with its own files of the step, and published; its sync waits for
 * that. Conflicts: the same path from two hosts (the version taken last
 * wins), archived files changed only by the archiver; a closed file of a
 * contributor killed is archived, an incomplete one removed; the next
 * archiver takes what the last one left. */
static void test_many_hosts(void)
{
	char dir[512], err[512], cdir[700];
	int rc;
	mkarchive("many", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share: %s", w ? ulp_archive_errmsg(w) : err);
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 2, .poll_ms = 50, .contribute = 1};
	ulp_archive *c = NULL;
	rc = ulp_archive_open(dir, &o, &c, err, sizeof(err));
	REQUIRE(rc == 0 && c, "a second read-write open with contribute: %s", err);
	ulp_generation g;
	ulp_archive_generation(c, &g);
	CHECK(g.shared && !g.writer && g.contributor, "it contributes (writer %d contributor %d)", g.writer,
	      g.contributor);
	snprintf(cdir, sizeof(cdir), "%s", ulp_archive_lock_dir(c));
	CHECK(strstr(cdir, "/staging/h-") != NULL, "its staging: %s", cdir);
	ulp_session *sw, *sc;
	REQUIRE(ulp_session_open(w, NULL, &sw) == 0, "archiver's session: %s", ulp_archive_errmsg(w));
	REQUIRE(ulp_session_open(c, NULL, &sc) == 0, "contributor's session: %s", ulp_archive_errmsg(c));

	/* one step, files from both hosts; the directory made on the contributor */
	ulp_meta dm = {0755, 0, 0, {1700000000, 0}};
	CHECK(ulp_session_mkdir(sc, "run", &dm) == 0 && ulp_session_mkdir(sc, "run/step_1", &dm) == 0,
	      "mkdir on the contributor: %s", ulp_archive_errmsg(c));
	ulp_stat st;
	CHECK(ulp_session_stat(sc, "run/step_1", &st) == 0 && st.is_dir, "its directory shows there");
	CHECK(swrite(sc, "run/step_1/__1_0.distcp", 150000, 11) == 0, "contributor writes: %s", ulp_archive_errmsg(c));
	CHECK(swrite(sc, "run/step_1/__2_0.distcp", 120000, 12) == 0, "contributor writes 2");
	CHECK(ulp_session_stat(sc, "run/step_1/__1_0.distcp", &st) == 0 && st.size == 150000,
	      "the contributor serves its staged file");
	CHECK(ulp_archive_mkdir(w, "run", &dm) == 0 || 1, "(the archiver's own directory)");
	ulp_archive_mkdir(w, "run/step_1", &dm);
	CHECK(swrite(sw, "run/step_1/__0_0.distcp", 100000, 10) == 0, "archiver writes");
	int bad = 0;
	CHECK(ulp_session_sync(sc, fail_cb, &bad) == 0 && bad == 0, "the contributor's sync: %d failed", bad);
	CHECK(same(c, "run/step_1/__1_0.distcp", 150000, 11) && same(c, "run/step_1/__2_0.distcp", 120000, 12),
	      "after its sync the contributor reads its files from the published generation");
	CHECK(same(w, "run/step_1/__1_0.distcp", 150000, 11), "the archiver archived them");
	CHECK(ulp_session_sync(sw, fail_cb, &bad) == 0 && same(w, "run/step_1/__0_0.distcp", 100000, 10), "its own");
	usleep(100000);
	CHECK(same(c, "run/step_1/__0_0.distcp", 100000, 10), "the contributor reads the archiver's file");
	CHECK(files_in(cdir, ".data") == 0 && files_in(cdir, ".meta") == 0, "the contributor's staging is empty");

	/* the same path from two hosts: the version taken last wins */
	CHECK(swrite(sc, "run/x.bin", 90000, 21) == 0 && ulp_session_sync(sc, fail_cb, &bad) == 0, "x from c");
	CHECK(swrite(sw, "run/x.bin", 91000, 22) == 0 && ulp_session_sync(sw, fail_cb, &bad) == 0, "x from w");
	CHECK(same(w, "run/x.bin", 91000, 22), "the archiver's later close wins");
	usleep(100000);
	CHECK(swrite(sc, "run/x.bin", 92000, 23) == 0 && ulp_session_sync(sc, fail_cb, &bad) == 0 && bad == 0,
	      "x from c again");
	CHECK(same(w, "run/x.bin", 92000, 23) && same(c, "run/x.bin", 92000, 23), "the contributor's later close wins");

	/* archived files change only on the archiver */
	CHECK(ulp_session_unlink(sc, "run/x.bin") == -ULP_E_UNSUPPORTED, "unlink of an archived file refused there");
	CHECK(ulp_session_rename(sc, "run/x.bin", "run/y.bin", 0) == -ULP_E_UNSUPPORTED, "rename refused there");
	CHECK(ulp_session_rmdir(sc, "run/step_1") == -ULP_E_UNSUPPORTED, "rmdir refused there");
	/* a staged file it unlinks before the archiver takes it is never archived */
	ulp_sfile *h;
	REQUIRE(ulp_session_open_file(sc, "run/gone.bin", O_WRONLY, &M644, &h) == 0, "create gone");
	ulp_session_write(h, "abc", 3, 0);
	CHECK(ulp_session_unlink(sc, "run/gone.bin") == 0, "unlink of its own file while open");
	ulp_session_release(h);

	/* a contributor killed: its closed file archived, its incomplete one removed */
	pid_t pid = fork(); /* a process of that host, killed mid-save */
	REQUIRE(pid >= 0, "fork");
	if (pid == 0) {
		ulp_stage *done, *half;
		ulp_meta m = {0644, 0, 0, {1700000100, 0}};
		if (ulp_stage_new(c, NULL, &done) < 0 || ulp_stage_new(c, NULL, &half) < 0 ||
		    ulp_stage_write(done, "closed", 6, 0) != 6 || ulp_stage_record(done, "run/killed.bin", &m) < 0 ||
		    ulp_stage_write(half, "half", 4, 0) != 4 || ulp_stage_sync(half, "run/half.bin", &m) < 0)
			_exit(1);
		_exit(0); /* its files left as kill -9 leaves them */
	}
	int ws = 0;
	waitpid(pid, &ws, 0);
	CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "a closed file and an open one staged by a process that died");
	CHECK(ulp_session_sync(sc, fail_cb, &bad) == 0 && bad == 0, "sync");
	ulp_session_close(sc);
	ulp_archive_close(c);

	/* the archiver goes before it took them: the next one does */
	ulp_session_close(sw);
	ulp_archive_close(w);
	w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w, "the next archiver: %s", err);
	REQUIRE(ulp_session_open(w, NULL, &sw) == 0, "its session");
	for (int i = 0; i < 50 && !exists(w, "run/killed.bin"); i++)
		usleep(100000);
	CHECK(ulp_session_sync(sw, fail_cb, &bad) == 0 && exists(w, "run/killed.bin"),
	      "a killed contributor's closed file is archived by the next archiver");
	CHECK(!exists(w, "run/half.bin") && !exists(w, "run/gone.bin"), "never its open or unlinked ones");
	ulp_session_close(sw);
	rc = ulp_archive_open(dir, &o, &c, err, sizeof(err));
	REQUIRE(rc == 0, "the contributor again: %s", err);
	ulp_archive_close(c);
	CHECK(files_in(cdir, ".data") == 0, "its next open removed its dead process's incomplete file (%u left)",
	      files_in(cdir, ".data"));
	ulp_archive_close(w);
}

typedef struct bp_arg {
	ulp_session *s;
	int done, rc;
} bp_arg;

static void *bp_writer(void *arg)
{
	bp_arg *b = arg;
	b->rc = swrite(b->s, "run/bp/2.bin", 150000, 32);
	if (b->rc == 0)
		b->rc = swrite(b->s, "run/bp/3.bin", 150000, 33);
	__atomic_store_n(&b->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/* A contributor's staging is bounded (staging_max): while the archiver
 * takes nothing, its writers wait; once it drains, they go on. */
static void test_contrib_backpressure(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("bp", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 2, .poll_ms = 50, .contribute = 1};
	ulp_archive *c = NULL;
	REQUIRE(ulp_archive_open(dir, &o, &c, err, sizeof(err)) == 0, "contributor: %s", err);
	ulp_session_opts so = {100000, NULL, NULL, NULL};
	ulp_session *sc, *sw;
	REQUIRE(ulp_session_open(c, &so, &sc) == 0, "its session");
	ulp_meta dm = {0755, 0, 0, {1700000000, 0}};
	ulp_session_mkdir(sc, "run", &dm);
	ulp_session_mkdir(sc, "run/bp", &dm);
	CHECK(swrite(sc, "run/bp/1.bin", 150000, 31) == 0, "a file staged, over staging_max");
	bp_arg b = {sc, 0, 0};
	pthread_t t;
	REQUIRE(pthread_create(&t, NULL, bp_writer, &b) == 0, "thread");
	usleep(400000);
	CHECK(!__atomic_load_n(&b.done, __ATOMIC_ACQUIRE), "the next writes wait while nothing is archived");
	REQUIRE(ulp_session_open(w, NULL, &sw) == 0, "the archiver's session");
	for (int i = 0; i < 100 && !__atomic_load_n(&b.done, __ATOMIC_ACQUIRE); i++)
		usleep(100000);
	CHECK(__atomic_load_n(&b.done, __ATOMIC_ACQUIRE) && b.rc == 0, "it goes on once the archiver drains");
	pthread_join(t, NULL);
	int bad = 0;
	CHECK(ulp_session_sync(sc, fail_cb, &bad) == 0 && bad == 0 && same(c, "run/bp/3.bin", 150000, 33) &&
	      same(w, "run/bp/1.bin", 150000, 31), "all archived");
	ulp_session_close(sc);
	ulp_session_close(sw);
	ulp_archive_close(c);
	ulp_archive_close(w);
}

/* A file of a contributor's that the archiver cannot archive (its path is a
 * directory there): the archiver's note names why, and the contributor's
 * hand-over returns it (its sync names the file). */
static void test_contrib_failure_note(void)
{
	char dir[512], err[512];
	int rc;
	mkarchive("note", dir, sizeof(dir));
	ulp_archive *w = open_as(dir, 0, 0, 0, err, &rc);
	REQUIRE(w && ulp_archive_share(w) == 0, "share");
	ulp_meta dm = {0755, 0, 0, {1700000000, 0}};
	REQUIRE(ulp_archive_mkdir(w, "dd", &dm) == 0 && ulp_archive_publish(w) == 0, "a directory dd");
	ulp_archive_opts o = {.cache_size = 16 << 20, .threads = 2, .poll_ms = 50, .contribute = 1};
	ulp_archive *c = NULL;
	REQUIRE(ulp_archive_open(dir, &o, &c, err, sizeof(err)) == 0, "contributor: %s", err);
	ulp_stage *st;
	ulp_meta m = {0644, 0, 0, {1700000200, 0}};
	REQUIRE(ulp_stage_new(c, NULL, &st) == 0, "stage");
	CHECK(ulp_stage_write(st, "file", 4, 0) == 4 && ulp_stage_record(st, "dd", &m) == 0, "a file named dd, closed");
	ulp_session *sw;
	REQUIRE(ulp_session_open(w, NULL, &sw) == 0, "the archiver's session");
	rc = ulp_contrib_put(c, st, "dd", &m, NULL, NULL);
	CHECK(rc < 0 && strstr(ulp_archive_errmsg(c), "the archiver could not archive it"),
	      "the hand-over names the archiver's failure: %s", ulp_archive_errmsg(c));
	ulp_stage_close(st);
	ulp_session_close(sw);
	ulp_archive_close(c);
	ulp_archive_close(w);
}

int main(void)
{
	snprintf(root, sizeof(root), "%s/ulp-shared-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	REQUIRE(mkdtemp(root), "mkdtemp");
	test_follow();
	test_patches();
	test_publish_beside_reader();
	test_patch_temp();
	test_lease();
	test_fenced_by_epoch();
	test_fenced_by_expiry();
	test_late_writes_of_fenced_writer();
	test_failed_open_publishes_nothing();
	test_garbage_current();
	test_slow_publication();
	test_grace();
	test_pack_ids();
	test_netfs();
	test_many_hosts();
	test_contrib_backpressure();
	test_contrib_failure_note();
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "# could not remove %s\n", root);
	return tap_done();
}
