/* SPDX-License-Identifier: MIT */
/*
 * cmd_archive.c - the archive subcommands of ulpack: init, import, ls, cat,
 * export, stat, verify, rm, gc. Each parses its arguments, calls libulpack
 * and prints; the logic lives in the library.
 */
#include "cli.h"
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- shared options ------------------------------------------------------ */

typedef struct aopts {
	ulp_archive_opts o;
	int json, recursive;
	const char *prefix;
	const char *pos[4];
	int npos;
} aopts;

/* Returns -1 on --help (printed), -2 on a usage error, else 0. */
static int parse_common(int argc, char **argv, aopts *ao, const char *usage, int min_pos, int max_pos)
{
	memset(ao, 0, sizeof(*ao));
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (cli_is_help(a)) {
			fputs(usage, stdout);
			return -1;
		} else if (!strcmp(a, "--json")) {
			ao->json = 1;
		} else if (!strcmp(a, "-r") || !strcmp(a, "--recursive")) {
			ao->recursive = 1;
		} else if (!strcmp(a, "--max-chain") && i + 1 < argc) {
			ao->o.max_chain = (unsigned)atoi(argv[++i]);
		} else if (!strcmp(a, "--cache-size") && i + 1 < argc) {
			if (ulp_parse_size(argv[++i], &ao->o.cache_size) < 0) {
				cli_fail("bad size '%s' (examples: 512M, 4G)", argv[i]);
				return -2;
			}
		} else if (!strcmp(a, "--threads") && i + 1 < argc) {
			ao->o.threads = atoi(argv[++i]);
		} else if (!strcmp(a, "--prefix") && i + 1 < argc) {
			ao->prefix = argv[++i];
		} else if (a[0] == '-' && a[1]) {
			cli_fail("unknown option '%s'", a);
			fputs(usage, stderr);
			return -2;
		} else if (ao->npos < 4) {
			ao->pos[ao->npos++] = a;
		}
	}
	if (ao->npos < min_pos || ao->npos > max_pos) {
		fputs(usage, stderr);
		return -2;
	}
	return 0;
}

static ulp_archive *open_archive(const aopts *ao, int read_only)
{
	char err[1024];
	ulp_archive *a;
	ulp_archive_opts o = ao->o;
	o.read_only = read_only;
	int rc = ulp_archive_open(ao->pos[0], &o, &a, err, sizeof(err));
	if (rc < 0) {
		cli_fail("%s", err);
		return NULL;
	}
	return a;
}

static void report_rss(void)
{
	if (!getenv("ULP_REPORT_RSS"))
		return;
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "VmHWM:", 6))
			fprintf(stderr, "peak_rss_kb %ld\n", strtol(line + 6, NULL, 10));
	if (f)
		fclose(f);
}

static void human(uint64_t b, char *out, size_t cap)
{
	const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)b;
	int i = 0;
	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

/* ---- init ---------------------------------------------------------------- */

int cmd_init(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao, "usage: ulpack init ARCHIVE\nCreates an empty archive directory.\n", 1, 1);
	if (rc)
		return rc == -1 ? 0 : 2;
	char err[1024];
	if (ulp_archive_init(ao.pos[0], err, sizeof(err)) < 0)
		return cli_fail("%s", err);
	printf("initialized empty archive %s\n", ao.pos[0]);
	return 0;
}

/* ---- import -------------------------------------------------------------- */

typedef struct item {
	char *src;     /* path on disk */
	char *dst;     /* path in the archive */
	int64_t step;
	int type;      /* 0 file, 1 dir, 2 symlink */
	struct stat sb;
} item;

static item *g_items;
static size_t g_n, g_cap;
static size_t g_root_len;
static const char *g_prefix;

static int walk_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)ftw;
	if (strlen(path) <= g_root_len)
		return 0; /* the root itself */
	if (g_n == g_cap) {
		g_cap = g_cap ? g_cap * 2 : 256;
		item *n = realloc(g_items, g_cap * sizeof(*n));
		if (!n)
			return -1;
		g_items = n;
	}
	item *it = &g_items[g_n];
	const char *rel = path + g_root_len;
	while (*rel == '/')
		rel++;
	size_t l = strlen(rel) + (g_prefix ? strlen(g_prefix) + 1 : 0) + 1;
	it->dst = malloc(l);
	it->src = strdup(path);
	if (!it->dst || !it->src)
		return -1;
	snprintf(it->dst, l, "%s%s%s", g_prefix ? g_prefix : "", g_prefix ? "/" : "", rel);
	it->sb = *sb;
	it->type = flag == FTW_D ? 1 : flag == FTW_SL ? 2 : S_ISREG(sb->st_mode) ? 0 : -1;
	if (it->type < 0) {
		free(it->dst);
		free(it->src);
		return 0; /* devices, sockets: skipped */
	}
	it->step = ulp_parse_step(it->dst, NULL);
	g_n++;
	return 0;
}

static int cmp_item(const void *a, const void *b)
{
	const item *x = a, *y = b;
	if (x->type == 1 || y->type == 1) /* directories first, parents before children */
		return x->type == 1 && y->type == 1 ? strcmp(x->dst, y->dst) : x->type == 1 ? -1 : 1;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return strcmp(x->dst, y->dst);
}

static int64_t ns_of(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

int cmd_import(int argc, char **argv)
{
	static const char usage[] =
		"usage: ulpack import ARCHIVE SRC_DIR [--prefix P] [--max-chain N] [--threads N]\n"
		"Archives every file under SRC_DIR (at P/... inside the archive), in step order.\n"
		"Files already archived with the same size and mtime are skipped.\n";
	aopts ao;
	int rc = parse_common(argc, argv, &ao, usage, 2, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	char clean[4096];
	if (ao.prefix) {
		snprintf(clean, sizeof(clean), "%s", ao.prefix);
		while (strlen(clean) && clean[strlen(clean) - 1] == '/')
			clean[strlen(clean) - 1] = 0;
		g_prefix = clean[0] ? clean : NULL;
	}
	struct stat sb;
	if (stat(ao.pos[1], &sb) < 0 || !S_ISDIR(sb.st_mode))
		return cli_fail("%s: %s", ao.pos[1], errno ? strerror(errno) : "not a directory");
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	g_root_len = strlen(ao.pos[1]);
	if (nftw(ao.pos[1], walk_cb, 64, FTW_PHYS) < 0) {
		ulp_archive_close(a);
		return cli_fail("%s: %s", ao.pos[1], strerror(errno));
	}
	qsort(g_items, g_n, sizeof(item), cmp_item);
	int tty = isatty(2), status = 0;
	uint64_t raw = 0, stored = 0, total = 0, done = 0;
	unsigned files = 0, skipped = 0;
	for (size_t i = 0; i < g_n; i++)
		if (g_items[i].type == 0)
			total += (uint64_t)g_items[i].sb.st_size;
	double t0 = cli_now();
	for (size_t i = 0; i < g_n && status == 0; i++) {
		item *it = &g_items[i];
		ulp_meta m = {it->sb.st_mode & 07777, it->sb.st_uid, it->sb.st_gid, ns_of(&it->sb.st_mtim)};
		ulp_stat old;
		int have = ulp_archive_stat(a, it->dst, &old) == 0;
		if (it->type == 1) {
			if (!have && ulp_archive_mkdir(a, it->dst, &m) < 0)
				status = cli_fail("%s", ulp_archive_errmsg(a));
			continue;
		}
		if (it->type == 2) {
			char target[4096];
			ssize_t l = readlink(it->src, target, sizeof(target) - 1);
			if (l < 0) {
				status = cli_fail("%s: %s", it->src, strerror(errno));
				break;
			}
			target[l] = 0;
			if (have)
				ulp_archive_remove(a, it->dst);
			if (ulp_archive_symlink(a, it->dst, target, &m) < 0)
				status = cli_fail("%s", ulp_archive_errmsg(a));
			continue;
		}
		if (have && !old.is_dir && old.size == (uint64_t)it->sb.st_size && old.mtime_ns == m.mtime_ns) {
			skipped++;
			done += old.size;
			continue;
		}
		int fd = open(it->src, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			status = cli_fail("%s: %s", it->src, strerror(errno));
			break;
		}
		ulp_put_result res;
		rc = ulp_archive_put(a, it->dst, fd, &m, &res);
		close(fd);
		if (rc < 0) {
			status = cli_fail("%s", ulp_archive_errmsg(a));
			break;
		}
		files++;
		raw += res.raw_bytes;
		stored += res.stored_bytes;
		done += res.raw_bytes;
		if (tty) {
			double el = cli_now() - t0;
			fprintf(stderr, "\r\033[K[%3.0f%%] %zu/%zu %.1f MB/s %s", total ? 100.0 * (double)done / (double)total : 100.0,
			        i + 1, g_n, el > 0 ? (double)raw / el / 1e6 : 0.0, it->dst);
		}
	}
	double el = cli_now() - t0;
	if (tty)
		fputs("\r\033[K", stderr);
	char hr[32], hs[32];
	human(raw, hr, sizeof(hr));
	human(stored, hs, sizeof(hs));
	printf("imported %u files (%u unchanged, skipped): %s -> %s stored (ratio %.4f), %.1f MB/s\n", files,
	       skipped, hr, hs, raw ? (double)stored / (double)raw : 0.0, el > 0 ? (double)raw / el / 1e6 : 0.0);
	for (size_t i = 0; i < g_n; i++) {
		free(g_items[i].src);
		free(g_items[i].dst);
	}
	free(g_items);
	ulp_archive_close(a);
	report_rss();
	return status;
}

/* ---- ls -------------------------------------------------------------------- */

static void mode_str(uint32_t mode, char out[11])
{
	const char *rwx = "rwxrwxrwx";
	out[0] = (mode & 0170000) == 0040000 ? 'd' : (mode & 0170000) == 0120000 ? 'l' : '-';
	for (int i = 0; i < 9; i++)
		out[1 + i] = (mode >> (8 - i)) & 1 ? rwx[i] : '-';
	out[10] = 0;
}

static int ls_line(void *arg, const char *name, const ulp_stat *st)
{
	(void)arg;
	char m[11], t[32];
	mode_str(st->mode, m);
	time_t secs = (time_t)(st->mtime_ns / 1000000000);
	strftime(t, sizeof(t), "%Y-%m-%d %H:%M", localtime(&secs));
	if (st->is_dir)
		printf("%s %14s %14s %s %s/\n", m, "-", "-", t, name);
	else
		printf("%s %14llu %14llu %s %s\n", m, (unsigned long long)st->size,
		       (unsigned long long)st->stored_bytes, t, name);
	return 0;
}

int cmd_ls(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack ls ARCHIVE [PATH]\nLists a directory of the archive (mode, size,"
	                      " stored bytes, mtime, name) or one file.\n", 1, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	const char *path = ao.npos > 1 ? ao.pos[1] : "";
	ulp_stat st;
	int status = 0;
	if (ulp_archive_stat(a, path, &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (st.is_dir)
		status = ulp_archive_readdir(a, path, ls_line, NULL) < 0 ? cli_fail("%s", ulp_archive_errmsg(a)) : 0;
	else
		ls_line(NULL, path, &st);
	ulp_archive_close(a);
	return status;
}

/* ---- cat and export --------------------------------------------------------- */

#define IO_BLOCK ((size_t)8 << 20) /* a few chunks: memory stays near the cache size */

static int write_all(int fd, const uint8_t *p, size_t n, const char *what)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return cli_fail("%s: %s", what, strerror(errno));
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* Copies an archived file to fd; 0 or 1 (message printed). */
static int copy_out(ulp_archive *a, const char *path, int fd, const char *what, uint8_t *buf)
{
	ulp_file *f;
	if (ulp_file_open(a, path, &f) < 0)
		return cli_fail("%s", ulp_archive_errmsg(a));
	uint64_t off = 0, size = ulp_file_get_stat(f)->size;
	int status = 0;
	while (off < size && status == 0) {
		int64_t n = ulp_file_pread(f, buf, IO_BLOCK, off);
		if (n <= 0) {
			status = cli_fail("%s", n < 0 ? ulp_archive_errmsg(a) : "unexpected end of file");
			break;
		}
		status = write_all(fd, buf, (size_t)n, what);
		off += (uint64_t)n;
	}
	ulp_file_close(f);
	return status;
}

int cmd_cat(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack cat ARCHIVE PATH [--cache-size S] [--threads N]\n"
	                      "Writes the file's original bytes to standard output.\n", 2, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	uint8_t *buf = malloc(IO_BLOCK);
	int status = buf ? copy_out(a, ao.pos[1], 1, "standard output", buf) : cli_fail("out of memory");
	free(buf);
	if (getenv("ULP_REPORT_COUNTERS")) {
		ulp_counters c;
		ulp_archive_counters(a, &c);
		fprintf(stderr, "chunks_decoded %llu deltas_decoded %llu cache_hits %llu cache_misses %llu max_walk %llu\n",
		        (unsigned long long)c.chunks_decoded, (unsigned long long)c.deltas_decoded,
		        (unsigned long long)c.cache_hits, (unsigned long long)c.cache_misses,
		        (unsigned long long)c.max_walk);
	}
	ulp_archive_close(a);
	report_rss();
	return status;
}

typedef struct ectx {
	ulp_archive *a;
	const char *src_root;  /* archive path */
	const char *dst_root;
	uint8_t *buf;
	int status;
} ectx;

typedef struct dirlist {
	char **names;
	size_t n, cap;
} dirlist;

static int collect_name(void *arg, const char *name, const ulp_stat *st)
{
	(void)st;
	dirlist *d = arg;
	if (d->n == d->cap) {
		d->cap = d->cap ? d->cap * 2 : 32;
		char **nn = realloc(d->names, d->cap * sizeof(char *));
		if (!nn)
			return -1;
		d->names = nn;
	}
	d->names[d->n++] = strdup(name);
	return 0;
}

static void set_times(const char *path, int64_t mtime_ns, int nofollow)
{
	struct timespec ts[2] = {{0, UTIME_OMIT}, {mtime_ns / 1000000000, mtime_ns % 1000000000}};
	utimensat(AT_FDCWD, path, ts, nofollow ? AT_SYMLINK_NOFOLLOW : 0);
}

static int export_one(ectx *e, const char *apath, const char *dpath, const ulp_stat *st)
{
	if (st->is_dir) {
		if (mkdir(dpath, 0700) < 0 && errno != EEXIST)
			return cli_fail("%s: %s", dpath, strerror(errno));
		dirlist d = {0};
		if (ulp_archive_readdir(e->a, apath, collect_name, &d) < 0)
			return cli_fail("%s", ulp_archive_errmsg(e->a));
		int status = 0;
		for (size_t i = 0; i < d.n; i++) {
			char ap[8192], dp[8192];
			ulp_stat cs;
			snprintf(ap, sizeof(ap), "%s%s%s", apath, apath[0] ? "/" : "", d.names[i]);
			snprintf(dp, sizeof(dp), "%s/%s", dpath, d.names[i]);
			if (status == 0 && ulp_archive_stat(e->a, ap, &cs) == 0)
				status = export_one(e, ap, dp, &cs);
			free(d.names[i]);
		}
		free(d.names);
		chmod(dpath, st->mode & 07777);
		set_times(dpath, st->mtime_ns, 0);
		return status;
	}
	if (st->is_symlink) {
		char target[4096];
		if (ulp_archive_readlink(e->a, apath, target, sizeof(target)) < 0)
			return cli_fail("%s", ulp_archive_errmsg(e->a));
		unlink(dpath);
		if (symlink(target, dpath) < 0)
			return cli_fail("%s: %s", dpath, strerror(errno));
		set_times(dpath, st->mtime_ns, 1);
		return 0;
	}
	char tmp[8300];
	snprintf(tmp, sizeof(tmp), "%s.ulpack-tmp", dpath);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return cli_fail("%s: %s", tmp, strerror(errno));
	int status = copy_out(e->a, apath, fd, tmp, e->buf);
	if (close(fd) < 0 && status == 0)
		status = cli_fail("%s: %s", tmp, strerror(errno));
	if (status == 0 && (fchmodat(AT_FDCWD, tmp, st->mode & 07777, 0) < 0 || rename(tmp, dpath) < 0))
		status = cli_fail("%s: %s", dpath, strerror(errno));
	if (status)
		unlink(tmp);
	else
		set_times(dpath, st->mtime_ns, 0);
	return status;
}

int cmd_export(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack export ARCHIVE PATH DEST\nWrites a file, or a whole tree (\"\" or"
	                      " / for everything), to DEST with its mode and mtime.\n", 3, 3);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	ectx e = {a, ao.pos[1], ao.pos[2], malloc(IO_BLOCK), 0};
	ulp_stat st;
	if (!e.buf)
		e.status = cli_fail("out of memory");
	else if (ulp_archive_stat(a, ao.pos[1], &st) < 0)
		e.status = cli_fail("%s", ulp_archive_errmsg(a));
	else
		e.status = export_one(&e, ao.pos[1], ao.pos[2], &st);
	free(e.buf);
	ulp_archive_close(a);
	return e.status;
}

/* ---- stat ------------------------------------------------------------------ */

typedef struct runsum {
	char name[256];
	uint64_t files, raw, stored;
	unsigned max_depth;
} runsum;

typedef struct sctx {
	int json;
	int first;
	runsum *runs; /* per run: the first component of the path */
	size_t n_runs, cap_runs;
} sctx;

static void add_run(sctx *s, const char *path, const ulp_stat *st)
{
	const char *slash = strchr(path, '/');
	size_t l = slash ? (size_t)(slash - path) : strlen(path);
	if (l >= sizeof(s->runs->name))
		l = sizeof(s->runs->name) - 1;
	runsum *r = NULL;
	for (size_t i = 0; i < s->n_runs && !r; i++)
		if (strlen(s->runs[i].name) == l && !strncmp(s->runs[i].name, path, l))
			r = &s->runs[i];
	if (!r) {
		if (s->n_runs == s->cap_runs) {
			s->cap_runs = s->cap_runs ? s->cap_runs * 2 : 16;
			runsum *nr = realloc(s->runs, s->cap_runs * sizeof(*nr));
			if (!nr)
				return;
			s->runs = nr;
		}
		r = &s->runs[s->n_runs++];
		memset(r, 0, sizeof(*r));
		memcpy(r->name, path, l);
	}
	r->files++;
	r->raw += st->size;
	r->stored += st->stored_bytes;
	if (st->chain_depth > r->max_depth)
		r->max_depth = st->chain_depth;
}

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", *s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

static int stat_file(void *arg, const char *path, const ulp_stat *st)
{
	sctx *s = arg;
	add_run(s, path, st);
	double ratio = st->size ? (double)st->stored_bytes / (double)st->size : 0;
	char sha[65];
	ulp_sha256_hex(st->sha256, sha);
	if (s->json) {
		printf("%s\n    {\"path\": ", s->first ? "" : ",");
		json_str(stdout, path);
		printf(", \"raw_bytes\": %llu, \"stored_bytes\": %llu, \"ratio\": %.6f, \"step\": %lld,"
		       " \"chain_depth\": %u, \"anchor\": %s, \"safetensors\": %s, \"kind\": \"%s\","
		       " \"sha256\": \"%s\"}",
		       (unsigned long long)st->size, (unsigned long long)st->stored_bytes, ratio,
		       (long long)st->step, st->chain_depth, st->anchor ? "true" : "false",
		       st->kind == 1 ? "true" : "false",
		       st->kind == 1 ? "safetensors" : st->kind == 2 ? "torch" : "opaque", sha);
	} else {
		printf("%14llu %14llu %7.4f %8lld %5u %s %s\n", (unsigned long long)st->size,
		       (unsigned long long)st->stored_bytes, ratio, (long long)st->step, st->chain_depth,
		       st->anchor ? "anchor" : "delta ", path);
	}
	s->first = 0;
	return 0;
}

int cmd_stat(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack stat ARCHIVE [PATH] [--json]\nSizes per file, per dtype and in"
	                      " total: raw and stored bytes, ratio, bits/weight, chain depths, anchors;\n"
	                      "per run (the first component of the path) too.\n",
	                      1, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	sctx s = {.json = ao.json, .first = 1};
	ulp_report r;
	if (s.json)
		printf("{\n  \"archive\": \"%s\",\n  \"files\": [", ao.pos[0]);
	else
		printf("%14s %14s %7s %8s %5s %s\n", "raw", "stored", "ratio", "step", "depth", "path");
	rc = ulp_archive_report(a, ao.npos > 1 ? ao.pos[1] : "", stat_file, &s, &r);
	if (rc < 0) {
		ulp_archive_close(a);
		return cli_fail("%s", ulp_archive_errmsg(a));
	}
	if (s.json) {
		printf("\n  ],\n  \"runs\": {");
		for (size_t i = 0; i < s.n_runs; i++) {
			printf("%s\n    ", i ? "," : "");
			json_str(stdout, s.runs[i].name);
			printf(": {\"files\": %llu, \"raw_bytes\": %llu, \"stored_bytes\": %llu, \"ratio\": %.6f,"
			       " \"max_chain_depth\": %u}",
			       (unsigned long long)s.runs[i].files, (unsigned long long)s.runs[i].raw,
			       (unsigned long long)s.runs[i].stored,
			       s.runs[i].raw ? (double)s.runs[i].stored / (double)s.runs[i].raw : 0.0, s.runs[i].max_depth);
		}
		printf("\n  },\n  \"by_dtype\": {");
		int first = 1;
		for (int d = 0; d < ULP_DT__COUNT; d++) {
			const ulp_dtype_total *t = &r.by_dtype[d];
			if (!t->tensors)
				continue;
			printf("%s\n    \"%s\": {\"raw_bytes\": %llu, \"stored_bytes\": %llu, \"ratio\": %.6f,"
			       " \"bits_per_weight\": %.4f, \"tensors\": %llu, \"delta_blobs\": %llu, \"anchor_blobs\": %llu}",
			       first ? "" : ",", ulp_dtype_name((ulp_dtype)d), (unsigned long long)t->raw_bytes,
			       (unsigned long long)t->stored_bytes,
			       t->raw_bytes ? (double)t->stored_bytes / (double)t->raw_bytes : 0.0,
			       t->elements ? 8.0 * (double)t->stored_bytes / (double)t->elements : 0.0,
			       (unsigned long long)t->tensors, (unsigned long long)t->deltas,
			       (unsigned long long)t->anchors);
			first = 0;
		}
		printf("\n  },\n  \"total\": {\"files\": %llu, \"raw_bytes\": %llu, \"stored_bytes\": %llu,"
		       " \"ratio\": %.6f, \"blobs\": %llu, \"pack_bytes\": %llu, \"max_chain_depth\": %u,"
		       " \"other_raw_bytes\": %llu, \"other_stored_bytes\": %llu}\n}\n",
		       (unsigned long long)r.files, (unsigned long long)r.raw_bytes,
		       (unsigned long long)r.stored_bytes, r.raw_bytes ? (double)r.stored_bytes / (double)r.raw_bytes : 0.0,
		       (unsigned long long)r.blobs, (unsigned long long)r.pack_bytes, r.max_chain_depth,
		       (unsigned long long)r.opaque_raw, (unsigned long long)r.opaque_stored);
	} else {
		printf("\nby run:\n%-24s %8s %14s %14s %7s %6s\n", "run", "files", "raw", "stored", "ratio", "depth");
		for (size_t i = 0; i < s.n_runs; i++)
			printf("%-24s %8llu %14llu %14llu %7.4f %6u\n", s.runs[i].name,
			       (unsigned long long)s.runs[i].files, (unsigned long long)s.runs[i].raw,
			       (unsigned long long)s.runs[i].stored,
			       s.runs[i].raw ? (double)s.runs[i].stored / (double)s.runs[i].raw : 0.0, s.runs[i].max_depth);
		printf("\nby dtype:\n%-8s %14s %14s %7s %9s %8s %8s %8s\n", "dtype", "raw", "stored", "ratio",
		       "bits/w", "tensors", "deltas", "anchors");
		for (int d = 0; d < ULP_DT__COUNT; d++) {
			const ulp_dtype_total *t = &r.by_dtype[d];
			if (!t->tensors)
				continue;
			printf("%-8s %14llu %14llu %7.4f %9.3f %8llu %8llu %8llu\n", ulp_dtype_name((ulp_dtype)d),
			       (unsigned long long)t->raw_bytes, (unsigned long long)t->stored_bytes,
			       t->raw_bytes ? (double)t->stored_bytes / (double)t->raw_bytes : 0.0,
			       t->elements ? 8.0 * (double)t->stored_bytes / (double)t->elements : 0.0,
			       (unsigned long long)t->tensors, (unsigned long long)t->deltas, (unsigned long long)t->anchors);
		}
		if (r.opaque_raw)
			printf("%-8s %14llu %14llu %7.4f\n", "other", (unsigned long long)r.opaque_raw,
			       (unsigned long long)r.opaque_stored, (double)r.opaque_stored / (double)r.opaque_raw);
		printf("\ntotal: %llu files, %llu raw bytes, %llu stored (ratio %.4f); %llu blobs in %llu pack bytes;"
		       " deepest chain %u\n",
		       (unsigned long long)r.files, (unsigned long long)r.raw_bytes, (unsigned long long)r.stored_bytes,
		       r.raw_bytes ? (double)r.stored_bytes / (double)r.raw_bytes : 0.0, (unsigned long long)r.blobs,
		       (unsigned long long)r.pack_bytes, r.max_chain_depth);
	}
	free(s.runs);
	ulp_archive_close(a);
	return 0;
}

/* ---- verify, rm, gc ------------------------------------------------------------ */

static void print_bad(void *arg, const char *path, const char *why)
{
	(void)arg;
	printf("DAMAGED %s: %s\n", path, why);
}

int cmd_verify(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack verify ARCHIVE [PATH]\nDecodes every file (under PATH) and checks"
	                      " its sha256; exit status 1 and a list of damaged files if any fails.\n", 1, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	ulp_report r;
	ulp_archive_report(a, ao.npos > 1 ? ao.pos[1] : "", NULL, NULL, &r);
	int64_t bad = ulp_archive_verify(a, ao.npos > 1 ? ao.pos[1] : "", print_bad, NULL);
	int status = 0;
	if (bad < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (bad > 0) {
		printf("%lld of %llu files damaged\n", (long long)bad, (unsigned long long)r.files);
		status = 1;
	} else {
		printf("verified %llu files, %llu bytes: all sha256 match\n", (unsigned long long)r.files,
		       (unsigned long long)r.raw_bytes);
	}
	ulp_archive_close(a);
	return status;
}

static int rm_tree(ulp_archive *a, const char *path)
{
	ulp_stat st;
	if (ulp_archive_stat(a, path, &st) < 0)
		return cli_fail("%s", ulp_archive_errmsg(a));
	if (st.is_dir) {
		dirlist d = {0};
		if (ulp_archive_readdir(a, path, collect_name, &d) < 0)
			return cli_fail("%s", ulp_archive_errmsg(a));
		int status = 0;
		for (size_t i = 0; i < d.n; i++) {
			char p[8192];
			snprintf(p, sizeof(p), "%s%s%s", path, path[0] ? "/" : "", d.names[i]);
			if (status == 0)
				status = rm_tree(a, p);
			free(d.names[i]);
		}
		free(d.names);
		if (status || !path[0])
			return status;
	}
	return ulp_archive_remove(a, path) < 0 ? cli_fail("%s", ulp_archive_errmsg(a)) : 0;
}

int cmd_rm(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack rm ARCHIVE PATH [-r]\nRemoves a file (a directory tree with -r)."
	                      " Space comes back with 'ulpack gc'.\n", 2, 2);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	ulp_stat st;
	int status;
	if (ulp_archive_stat(a, ao.pos[1], &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (st.is_dir && !ao.recursive)
		status = cli_fail("%s: is a directory (use -r)", ao.pos[1]);
	else
		status = rm_tree(a, ao.pos[1]);
	ulp_archive_close(a);
	return status;
}

int cmd_gc(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack gc ARCHIVE\nDrops blobs that no file and no chain needs, and"
	                      " rewrites or removes the packs that held them.\n", 1, 1);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	ulp_gc_result r;
	int status = 0;
	if (ulp_archive_gc(a, &r) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else
		printf("gc: %llu blobs dropped, %llu packs removed, %llu rewritten, %llu bytes reclaimed\n",
		       (unsigned long long)r.blobs_removed, (unsigned long long)r.packs_removed,
		       (unsigned long long)r.packs_rewritten, (unsigned long long)r.bytes_reclaimed);
	ulp_archive_close(a);
	return status;
}
