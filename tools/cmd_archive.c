/* SPDX-License-Identifier: MIT */
/*
 * cmd_archive.c - the archive subcommands of ulpack: init, import, ls, cat,
 * export, stat, verify, rm, gc. Each parses its arguments, calls libulpack
 * and prints; the logic lives in the library.
 */
#include "cli.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <ftw.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- shared options ------------------------------------------------------ */

/* Options a subcommand accepts (parse_common's `allowed`). */
enum {
	OPT_JSON = 1 << 0,      /* --json */
	OPT_RECURSIVE = 1 << 1, /* -r, --recursive */
	OPT_MAX_CHAIN = 1 << 2, /* --max-chain N */
	OPT_CACHE = 1 << 3,     /* --cache-size S */
	OPT_THREADS = 1 << 4,   /* --threads N */
	OPT_PREFIX = 1 << 5,    /* --prefix P */
	OPT_ALL = 1 << 6,       /* --all */
	OPT_PROGRESS = 1 << 7,  /* --progress */
	OPT_DRY_RUN = 1 << 8,   /* --dry-run */
	OPT_SHARED = 1 << 9,    /* --shared */
	OPT_GRACE = 1 << 10,    /* --grace SECONDS */
	OPT_DECODE = OPT_CACHE | OPT_THREADS, /* every command that decodes */
};

typedef struct aopts {
	ulp_archive_opts o;
	int json, recursive, all, progress, dry_run, shared;
	const char *prefix;
	const char *pos[4];
	int npos;
} aopts;

/* Returns -1 on --help (printed), -2 on a usage error (printed), else 0.
 * Every numeric value goes through the strict parsers of cli.h. */
static int parse_common(int argc, char **argv, aopts *ao, const char *usage, int min_pos, int max_pos,
                        unsigned allowed)
{
	static const struct {
		const char *name;
		unsigned bit;
		int takes_value;
	} opts[] = {
		{"--json", OPT_JSON, 0},           {"-r", OPT_RECURSIVE, 0},     {"--recursive", OPT_RECURSIVE, 0},
		{"--all", OPT_ALL, 0},             {"--max-chain", OPT_MAX_CHAIN, 1}, {"--cache-size", OPT_CACHE, 1},
		{"--threads", OPT_THREADS, 1},     {"--prefix", OPT_PREFIX, 1},
		{"--progress", OPT_PROGRESS, 0},   {"--dry-run", OPT_DRY_RUN, 0},
		{"--shared", OPT_SHARED, 0},       {"--grace", OPT_GRACE, 1},
	};
	memset(ao, 0, sizeof(*ao));
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (cli_is_help(a)) {
			fputs(usage, stdout);
			return -1;
		}
		if (a[0] != '-' || !a[1] || !strcmp(a, "--")) { /* "-" and "--x" aside, a path */
			if (!strcmp(a, "--") && i + 1 < argc)
				a = argv[++i]; /* "--": the next argument is a path even if it starts with '-' */
			else if (!strcmp(a, "--"))
				continue;
			if (ao->npos == 4 || ao->npos == max_pos) {
				cli_fail("unexpected argument '%s'", a);
				fputs(usage, stderr);
				return -2;
			}
			ao->pos[ao->npos++] = a;
			continue;
		}
		size_t k = 0;
		while (k < sizeof(opts) / sizeof(opts[0]) && (strcmp(a, opts[k].name) || !(allowed & opts[k].bit)))
			k++;
		if (k == sizeof(opts) / sizeof(opts[0])) {
			cli_fail("unknown option '%s'", a);
			fputs(usage, stderr);
			return -2;
		}
		if (opts[k].takes_value && i + 1 == argc) {
			cli_opt_missing(a);
			return -2;
		}
		const char *v = opts[k].takes_value ? argv[++i] : NULL;
		int64_t n;
		switch (opts[k].bit) {
		case OPT_JSON: ao->json = 1; break;
		case OPT_RECURSIVE: ao->recursive = 1; break;
		case OPT_ALL: ao->all = 1; break;
		case OPT_PROGRESS: ao->progress = 1; break;
		case OPT_DRY_RUN: ao->dry_run = 1; break;
		case OPT_SHARED: ao->shared = 1; break;
		case OPT_GRACE: /* seconds; 0 would mean the default to the library */
			if (cli_opt_int(a, v, 0, 100000000, &n))
				return -2;
			ao->o.grace_s = n ? (unsigned)n : UINT32_MAX;
			break;
		case OPT_PREFIX: ao->prefix = v; break;
		case OPT_MAX_CHAIN: /* 0 would mean "the archive's value" to the library: not an input */
			if (cli_opt_int(a, v, 1, ULP_MAX_CHAIN, &n))
				return -2;
			ao->o.max_chain = (unsigned)n;
			break;
		case OPT_THREADS: /* 0: one per CPU */
			if (cli_opt_int(a, v, 0, ULP_MAX_THREADS, &n))
				return -2;
			ao->o.threads = (int)n;
			break;
		case OPT_CACHE:
			if (cli_opt_size(a, v, &ao->o.cache_size))
				return -2;
			break;
		}
	}
	if (ao->npos < min_pos) {
		cli_fail("missing argument%s", min_pos - ao->npos > 1 ? "s" : "");
		fputs(usage, stderr);
		return -2;
	}
	return 0;
}

/* The path as the user wrote it, for messages: '' for the empty one. */
static const char *shown(const char *path)
{
	return path[0] ? path : "''";
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
	cli_staged(a, read_only);
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

/* ---- init ---------------------------------------------------------------- */

int cmd_init(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack init ARCHIVE [--shared]\nCreates an empty archive directory; --shared: one"
	                      " that many hosts read (ulpack share).\n", 1, 1, OPT_SHARED);
	if (rc)
		return rc == -1 ? 0 : 2;
	char err[1024];
	if (ulp_archive_init(ao.pos[0], err, sizeof(err)) < 0)
		return cli_fail("%s", err);
	if (ao.shared) {
		ulp_archive *a = open_archive(&ao, 0);
		if (!a)
			return 1;
		rc = ulp_archive_share(a);
		if (rc < 0)
			cli_fail("%s", ulp_archive_errmsg(a));
		ulp_archive_close(a);
		if (rc < 0)
			return 1;
	}
	printf("initialized empty %sarchive %s\n", ao.shared ? "shared " : "", ao.pos[0]);
	return 0;
}

/* ---- share --------------------------------------------------------------- */

int cmd_share(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack share ARCHIVE\nMakes an archive shared by many hosts: from now on its one"
	                      " writer (a\nread-write mount or command) holds a lease and publishes generations of its"
	                      " index,\nwhich read-only mounts and read commands on any host follow. See ulpackfs(1),"
	                      " MANY HOSTS.\n", 1, 1, 0);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	rc = ulp_archive_share(a);
	ulp_generation g;
	ulp_archive_generation(a, &g);
	if (rc < 0)
		cli_fail("%s", ulp_archive_errmsg(a));
	else
		printf("%s: shared; generation %llu published (writer epoch %llu)\n", ao.pos[0],
		       (unsigned long long)g.gen, (unsigned long long)g.epoch);
	ulp_archive_close(a);
	return rc < 0;
}

/* ---- import -------------------------------------------------------------- */

typedef struct item {
	char *src;     /* path on disk */
	char *dst;     /* path in the archive */
	int64_t step;
	int type;      /* 0 file, 1 dir, 2 symlink */
	uint32_t rank; /* put order that writes the final layout (ulp_archive_expect) */
	struct stat sb;
} item;

static item *g_items;
static size_t g_n, g_cap;
static size_t g_root_len;
static const char *g_prefix;
static struct stat g_archive_sb; /* the archive directory: never imported */
static char *g_skip;             /* its path as the walk found it, or NULL */

static int walk_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)ftw;
	/* the archive inside the tree (or the tree itself): its live ulpack.db
	 * and packs would be archived as torn copies; the walk is pre-order, so
	 * the directory comes before what is under it */
	if (g_skip) {
		size_t l = strlen(g_skip);
		while (l > 1 && g_skip[l - 1] == '/')
			l--;
		if (!strncmp(path, g_skip, l) && path[l] == '/')
			return 0;
	}
	if (flag == FTW_D && sb->st_dev == g_archive_sb.st_dev && sb->st_ino == g_archive_sb.st_ino) {
		fprintf(stderr, "ulpack: %s: the archive itself, not imported\n", path);
		free(g_skip);
		return (g_skip = strdup(path)) ? 0 : -1;
	}
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
	it->rank = 0;
	g_n++;
	return 0;
}

static int cmp_item(const void *a, const void *b)
{
	const item *x = a, *y = b;
	if (x->type == 1 || y->type == 1) /* directories first, parents before children */
		return x->type == 1 && y->type == 1 ? strcmp(x->dst, y->dst) : x->type == 1 ? -1 : 1;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	if (x->step != y->step)
		return x->step < y->step ? -1 : 1;
	return strcmp(x->dst, y->dst);
}

static ulp_time time_of(const struct timespec *t)
{
	return ulp_time_make(t->tv_sec, t->tv_nsec);
}

/*
 * Import progress: a thread redraws one line on stderr every 0.2 s (a tty,
 * or --progress: then one line each time), so that a large file being coded
 * still shows movement (bytes coded so far come from
 * ulp_archive_put_progress). Files are counted, not directories.
 */
typedef struct iprog {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop, tty;
	ulp_archive *a;
	double t0;
	uint64_t total, done;  /* bytes of all files; of the files finished (mu) */
	unsigned files_total, files_done; /* (mu) */
	const char *cur;       /* file being archived, or NULL (mu) */
	int in_put;            /* cur is being coded: add its progress (mu) */
	long interval_ms;      /* between lines: 200; ULPACK_PROGRESS_MS (tests), 10..1000 */
} iprog;

static void fmt_eta(double s, char *out, size_t cap)
{
	if (!(s >= 0) || s > 360000) {
		snprintf(out, cap, "--:--");
		return;
	}
	unsigned long t = (unsigned long)(s + 0.5);
	if (t >= 3600)
		snprintf(out, cap, "%lu:%02lu:%02lu", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(out, cap, "%lu:%02lu", t / 60, t % 60);
}

static void prog_draw(iprog *p)
{
	uint64_t done = p->done + (p->in_put ? ulp_archive_put_progress(p->a) : 0);
	if (done > p->total)
		done = p->total;
	double el = cli_now() - p->t0, rate = el > 0 ? (double)done / el : 0;
	char eta[32], hd[32], ht[32];
	fmt_eta(rate > 0 ? (double)(p->total - done) / rate : -1, eta, sizeof(eta));
	ulp_format_bytes(done, hd, sizeof(hd));
	ulp_format_bytes(p->total, ht, sizeof(ht));
	fprintf(stderr, "%s[%3.0f%%] %u/%u files, %s of %s, %.1f MB/s, ETA %s%s%s%s", p->tty ? "\r\033[K" : "",
	        p->total ? 100.0 * (double)done / (double)p->total : 100.0, p->files_done, p->files_total, hd, ht,
	        rate / 1e6, eta, p->cur ? ": " : "", p->cur ? p->cur : "", p->tty ? "" : "\n");
}

static void *prog_main(void *arg)
{
	iprog *p = arg;
	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += p->interval_ms * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) != 0 && !p->stop)
			prog_draw(p);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int cmd_import(int argc, char **argv)
{
	static const char usage[] =
		"usage: ulpack import ARCHIVE SRC_DIR [--prefix P] [--json] [--progress] [--max-chain N] [--threads N]\n"
		"                     [--cache-size S]\n"
		"Archives every file under SRC_DIR (at P/... inside the archive), in step order.\n"
		"Files already archived with the same size and mtime are skipped. On a terminal (or with\n"
		"--progress, one line at a time) it shows files done, bytes, MB/s and an ETA.\n";
	aopts ao;
	int rc = parse_common(argc, argv, &ao, usage, 2, 2, OPT_PREFIX | OPT_MAX_CHAIN | OPT_DECODE | OPT_JSON | OPT_PROGRESS);
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
	if (stat(ao.pos[1], &sb) < 0)
		return cli_fail("%s: %s", ao.pos[1], strerror(errno));
	if (!S_ISDIR(sb.st_mode))
		return cli_fail("%s: not a directory", ao.pos[1]);
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	ulp_stat pst;
	if (g_prefix && ulp_archive_stat(a, g_prefix, &pst) == -ULP_E_INVAL) { /* "..": names nothing */
		cli_fail("--prefix %s", ulp_archive_errmsg(a));
		ulp_archive_close(a);
		return 2;
	}
	g_root_len = strlen(ao.pos[1]);
	if (stat(ulp_archive_dir(a), &g_archive_sb) < 0) { /* (an s3:// archive's local home) */
		int e = errno;
		cli_fail("%s: %s", ulp_archive_dir(a), strerror(e));
		ulp_archive_close(a);
		return 1;
	}
	int walked = nftw(ao.pos[1], walk_cb, 64, FTW_PHYS);
	free(g_skip);
	g_skip = NULL;
	if (walked < 0) {
		ulp_archive_close(a);
		return cli_fail("%s: %s", ao.pos[1], strerror(errno));
	}
	qsort(g_items, g_n, sizeof(item), cmp_item);
	/* the files in the order that codes each where the final layout of its
	 * series puts it (the newest step an anchor): no re-coding afterwards */
	const char **paths = malloc((g_n ? g_n : 1) * sizeof(*paths));
	uint32_t *rank = malloc((g_n ? g_n : 1) * sizeof(*rank));
	size_t nf = 0;
	for (size_t i = 0; paths && rank && i < g_n; i++)
		if (g_items[i].type == 0)
			paths[nf++] = g_items[i].dst;
	if (!paths || !rank || ulp_archive_expect(a, paths, nf, rank) < 0) {
		cli_fail("%s: planning the import: %s", ao.pos[0], paths && rank ? ulp_archive_errmsg(a) : "out of memory");
		free(paths);
		free(rank);
		ulp_archive_close(a);
		return 1;
	}
	for (size_t i = 0, k = 0; i < g_n; i++)
		if (g_items[i].type == 0)
			g_items[i].rank = rank[k++];
	free(paths);
	free(rank);
	qsort(g_items, g_n, sizeof(item), cmp_item);
	int status = 0;
	uint64_t raw = 0, stored = 0;
	unsigned files = 0, skipped = 0, dirs = 0, links = 0;
	iprog pg = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .tty = isatty(2), .a = a};
	for (size_t i = 0; i < g_n; i++)
		if (g_items[i].type == 0) {
			pg.total += (uint64_t)g_items[i].sb.st_size;
			pg.files_total++;
		}
	pg.t0 = cli_now();
	const char *ims = getenv("ULPACK_PROGRESS_MS");
	int64_t iv = 200;
	if (ims && ulp_parse_int(ims, 10, 1000, &iv) < 0)
		iv = 200;
	pg.interval_ms = (long)iv;
	/* pipelined: a file's commit (its pack's fsync) overlaps the next file's
	 * coding; pend is the file in flight, counted once committed */
	ulp_putq *q = NULL;
	ulp_put_result pend = {0};
	int have_pend = 0;
	unsigned committed = 0;
	if ((rc = ulp_putq_new(a, &q)) < 0) {
		cli_fail("%s", ulp_archive_errmsg(a));
		ulp_archive_close(a);
		return 1;
	}
	pthread_t pth;
	int show = (pg.tty || ao.progress) && pg.files_total > 0;
	if (show && pthread_create(&pth, NULL, prog_main, &pg) != 0)
		show = 0;
	for (size_t i = 0; i < g_n && status == 0; i++) {
		item *it = &g_items[i];
		ulp_meta m = {it->sb.st_mode & 07777, it->sb.st_uid, it->sb.st_gid, time_of(&it->sb.st_mtim)};
		if (it->type != 0 && (rc = ulp_putq_flush(q)) < 0) { /* nothing else writes while a file is in flight */
			status = cli_fail("%s", ulp_archive_errmsg(a));
			break;
		}
		ulp_stat old;
		int have = ulp_archive_stat(a, it->dst, &old) == 0;
		if (it->type == 1) {
			if (!have && ulp_archive_mkdir(a, it->dst, &m) < 0)
				status = cli_fail("%s", ulp_archive_errmsg(a));
			dirs += !have;
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
			links++;
			continue;
		}
		if (have && !old.is_dir && old.size == (uint64_t)it->sb.st_size && old.mtime.sec == m.mtime.sec &&
		    old.mtime.nsec == m.mtime.nsec) {
			skipped++;
			pthread_mutex_lock(&pg.mu);
			pg.done += (uint64_t)it->sb.st_size;
			pg.files_done++;
			pthread_mutex_unlock(&pg.mu);
			continue;
		}
		int fd = open(it->src, O_RDONLY | O_CLOEXEC);
		if (fd < 0) {
			status = cli_fail("%s: %s", it->src, strerror(errno));
			break;
		}
		pthread_mutex_lock(&pg.mu);
		pg.cur = it->dst;
		pg.in_put = 1;
		pthread_mutex_unlock(&pg.mu);
		ulp_put_result res;
		rc = ulp_putq_put(q, it->dst, fd, &m, &res);
		close(fd);
		if (ulp_putq_committed(q) > committed && have_pend) {
			files++;
			raw += pend.raw_bytes;
			stored += pend.stored_bytes;
			have_pend = 0;
		}
		committed = ulp_putq_committed(q);
		pthread_mutex_lock(&pg.mu);
		pg.in_put = 0;
		pg.cur = NULL;
		if (rc == 0) {
			pg.done += (uint64_t)it->sb.st_size;
			pg.files_done++;
		}
		pthread_mutex_unlock(&pg.mu);
		if (rc < 0) {
			if (pg.tty && show)
				fputs("\r\033[K", stderr);
			status = cli_fail("%s", ulp_archive_errmsg(a));
			break;
		}
		pend = res;
		have_pend = 1;
	}
	if ((rc = ulp_putq_free(q)) < 0 && status == 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (rc == 0 && have_pend) {
		files++;
		raw += pend.raw_bytes;
		stored += pend.stored_bytes;
	}
	/* steps put beside archived ones, or over them: re-coded and reclaimed
	 * now, so that the import leaves no garbage */
	if (status == 0 && ulp_archive_gc(a, NULL) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	if (show) {
		pthread_mutex_lock(&pg.mu);
		pg.stop = 1;
		pthread_cond_signal(&pg.cv);
		pthread_mutex_unlock(&pg.mu);
		pthread_join(pth, NULL);
		if (pg.tty)
			fputs("\r\033[K", stderr);
		else if (status == 0)
			prog_draw(&pg); /* the final count */
	}
	double el = cli_now() - pg.t0;
	char hr[32], hs[32];
	ulp_format_bytes(raw, hr, sizeof(hr));
	ulp_format_bytes(stored, hs, sizeof(hs));
	if (ao.json)
		printf("{\"files\": %u, \"skipped\": %u, \"directories\": %u, \"symlinks\": %u, \"raw_bytes\": %llu,"
		       " \"stored_bytes\": %llu, \"ratio\": %.6f, \"seconds\": %.3f, \"mb_per_s\": %.1f, \"ok\": %s}\n",
		       files, skipped, dirs, links, (unsigned long long)raw, (unsigned long long)stored,
		       raw ? (double)stored / (double)raw : 0.0, el, el > 0 ? (double)raw / el / 1e6 : 0.0,
		       status == 0 ? "true" : "false");
	else
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
	/* setuid, setgid, sticky as ls -l: s/t over x, S/T where x is off */
	static const struct { uint32_t bit; int at; char c; } sp[] = {{04000, 3, 's'}, {02000, 6, 's'}, {01000, 9, 't'}};
	for (int i = 0; i < 3; i++)
		if (mode & sp[i].bit)
			out[sp[i].at] = out[sp[i].at] == 'x' ? sp[i].c : (char)(sp[i].c - 'a' + 'A');
	out[10] = 0;
}

static void json_str(FILE *f, const char *s);

/* One entry of a listing, sorted by ulp_name_cmp (numbered names in numeric
 * order: checkpoint-200 before checkpoint-1000). */
typedef struct lsent {
	char *name;
	ulp_stat st;
} lsent;

typedef struct lsctx {
	lsent *v;
	size_t n, cap;
	int json, first;
} lsctx;

static int ls_collect(void *arg, const char *name, const ulp_stat *st)
{
	lsctx *l = arg;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		lsent *nv = realloc(l->v, cap * sizeof(*nv));
		if (!nv)
			return -ULP_E_NOMEM;
		l->v = nv;
		l->cap = cap;
	}
	if (!(l->v[l->n].name = strdup(name)))
		return -ULP_E_NOMEM;
	l->v[l->n++].st = *st;
	return 0;
}

static int lsent_cmp(const void *x, const void *y)
{
	return ulp_name_cmp(((const lsent *)x)->name, ((const lsent *)y)->name);
}

static void ls_line(lsctx *l, const char *name, const ulp_stat *st)
{
	char m[11], t[32], step[24];
	mode_str(st->mode, m);
	time_t secs = (time_t)st->mtime.sec;
	struct tm tm;
	if (!localtime_r(&secs, &tm) || !strftime(t, sizeof(t), "%Y-%m-%d %H:%M", &tm))
		snprintf(t, sizeof(t), "@%lld", (long long)st->mtime.sec); /* a year beyond struct tm's */
	if (l->json) {
		printf("%s\n  {\"name\": ", l->first ? "" : ",");
		json_str(stdout, name);
		printf(", \"type\": \"%s\", \"mode\": \"%04o\", \"size\": %llu, \"stored_bytes\": %llu, \"step\": %lld,"
		       " \"mtime_sec\": %lld, \"mtime_nsec\": %u}",
		       st->is_dir ? "dir" : st->is_symlink ? "symlink" : "file", (unsigned)(st->mode & 07777),
		       (unsigned long long)(st->is_dir ? 0 : st->size), (unsigned long long)st->stored_bytes,
		       (long long)(st->is_dir ? ulp_name_step(name) : st->step), (long long)st->mtime.sec,
		       (unsigned)st->mtime.nsec);
		l->first = 0;
		return;
	}
	int64_t sn = st->is_dir ? ulp_name_step(name) : st->step; /* a step directory's own step */
	if (sn >= 0)
		snprintf(step, sizeof(step), "%lld", (long long)sn);
	else
		snprintf(step, sizeof(step), "-");
	if (st->is_dir)
		printf("%s %14s %14s %8s %s %s/\n", m, "-", "-", step, t, name);
	else
		printf("%s %14llu %14llu %8s %s %s\n", m, (unsigned long long)st->size,
		       (unsigned long long)st->stored_bytes, step, t, name);
}

int cmd_ls(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack ls ARCHIVE [PATH] [--json]\nLists a directory of the archive (mode, size,"
	                      " stored bytes, step or -, mtime, name) or one file;\nnumbered names in numeric order"
	                      " (checkpoint-200 before checkpoint-1000).\n", 1, 2, OPT_JSON);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	const char *path = ao.npos > 1 ? ao.pos[1] : "";
	ulp_stat st;
	lsctx l = {.json = ao.json, .first = 1};
	int status = 0;
	if (ulp_archive_stat(a, path, &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (st.is_dir && (rc = ulp_archive_readdir(a, path, ls_collect, &l)) < 0)
		status = cli_fail("%s", rc == -ULP_E_NOMEM ? "out of memory" : ulp_archive_errmsg(a));
	else if (!st.is_dir && ls_collect(&l, path, &st) < 0)
		status = cli_fail("out of memory");
	if (status == 0) {
		if (l.n) /* an empty directory: l.v is NULL, which qsort may not take */
			qsort(l.v, l.n, sizeof(*l.v), lsent_cmp);
		if (l.json) /* text: no heading, so that an empty directory prints nothing */
			printf("[");
		for (size_t i = 0; i < l.n; i++)
			ls_line(&l, l.v[i].name, &l.v[i].st);
		if (l.json)
			printf("%s]\n", l.n ? "\n" : "");
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].name);
	free(l.v);
	ulp_archive_close(a);
	return status;
}

/* ---- steps ------------------------------------------------------------------ */

typedef struct stctx {
	int json, first;
	char run[4096]; /* the run printed last (text: a heading per run) */
	uint64_t steps;
} stctx;

static int step_line(void *arg, const ulp_step_info *si)
{
	stctx *c = arg;
	double ratio = si->raw_bytes ? (double)si->stored_bytes / (double)si->raw_bytes : 0.0;
	const char *name = si->dir + strlen(si->run) + (si->run[0] ? 1 : 0);
	if (c->json) {
		printf("%s\n  {\"run\": ", c->first ? "" : ",");
		json_str(stdout, si->run);
		printf(", \"step\": %lld, \"dir\": ", (long long)si->step);
		json_str(stdout, si->dir);
		printf(", \"type\": \"%s\", \"files\": %llu, \"raw_bytes\": %llu, \"stored_bytes\": %llu, \"ratio\": %.6f,"
		       " \"chain_depth\": %u}",
		       si->is_file ? "file" : "dir", (unsigned long long)si->files, (unsigned long long)si->raw_bytes,
		       (unsigned long long)si->stored_bytes, ratio, si->chain_depth);
	} else {
		if (c->first || strcmp(c->run, si->run)) {
			printf("%srun %s\n%10s %6s %14s %14s %7s %5s  %s\n", c->first ? "" : "\n", si->run[0] ? si->run : "/",
			       "step", "files", "raw", "stored", "ratio", "depth", "name");
			snprintf(c->run, sizeof(c->run), "%s", si->run);
		}
		printf("%10lld %6llu %14llu %14llu %7.4f %5u  %s\n", (long long)si->step, (unsigned long long)si->files,
		       (unsigned long long)si->raw_bytes, (unsigned long long)si->stored_bytes, ratio, si->chain_depth,
		       name);
	}
	c->first = 0;
	c->steps++;
	return 0;
}

int cmd_steps(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack steps ARCHIVE [RUN] [--json]\n"
	                      "Lists each run's steps in step order: files, raw and stored bytes, ratio and the\n"
	                      "deepest delta chain. A step directory is named checkpoint-N, step_N, iter_N, ... or\n"
	                      "digits only; a step file is named so with an extension (model_step_1000.pt,\n"
	                      "epoch=0-step=100.ckpt); a run directory holds either (see ulpack(1)).\n",
	                      1, 2, OPT_JSON);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	const char *prefix = ao.npos > 1 ? ao.pos[1] : "";
	stctx c = {.json = ao.json, .first = 1};
	ulp_stat st;
	int status = 0;
	if (ulp_archive_stat(a, prefix, &st) < 0) {
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else {
		if (c.json)
			printf("[");
		rc = ulp_archive_steps(a, prefix, step_line, &c);
		if (c.json)
			printf("%s]\n", c.steps ? "\n" : "");
		if (rc < 0)
			status = cli_fail("%s", ulp_archive_errmsg(a));
		else if (!c.json && !c.steps)
			printf("no step directories or step files under %s\n", prefix[0] ? prefix : "the archive's root");
		if (rc >= 0 && !c.json)
			cli_print_space(a, stdout); /* the whole archive's */
	}
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

/* 1 if fd is a regular file at offset 0, not in append mode (pwrite would
 * append): ulp_file_write_to can write it. */
static int regular_at_start(int fd)
{
	struct stat sb;
	int fl = fcntl(fd, F_GETFL);
	return fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && fl >= 0 && !(fl & O_APPEND) && lseek(fd, 0, SEEK_CUR) == 0;
}

/* Writes an archived file into the file open on fd, whose offset must be 0
 * (ulp_file_write_to: the whole pool decodes; fd's offset then moves to the
 * end, as a copy's would); 0 or 1 (message printed). */
static int write_out(ulp_archive *a, const char *path, int fd, const char *what)
{
	ulp_file *f;
	if (ulp_file_open(a, path, &f) < 0)
		return cli_fail("%s", ulp_archive_errmsg(a));
	int status = 0;
	if (ulp_file_write_to(f, fd) < 0)
		status = cli_fail("%s: %s", what, ulp_archive_errmsg(a));
	else if (lseek(fd, (off_t)ulp_file_get_stat(f)->size, SEEK_SET) < 0)
		status = cli_fail("%s: %s", what, strerror(errno));
	ulp_file_close(f);
	return status;
}

int cmd_cat(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack cat ARCHIVE PATH [--cache-size S] [--threads N]\n"
	                      "Writes the file's original bytes to standard output.\n", 2, 2, OPT_DECODE);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	uint8_t *buf = malloc(IO_BLOCK);
	ulp_stat st;
	int status;
	if (ulp_archive_stat(a, ao.pos[1], &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (st.is_dir || st.is_symlink)
		status = cli_fail("%s: is a %s, not a file", shown(ao.pos[1]), st.is_dir ? "directory" : "symbolic link");
	else if (regular_at_start(1)) /* a file: decoded on all threads, written as decoded */
		status = write_out(a, ao.pos[1], 1, "standard output");
	else
		status = buf ? copy_out(a, ao.pos[1], 1, "standard output", buf) : cli_fail("out of memory");
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

/*
 * export writes an archived tree with the *at() calls, under directory file
 * descriptors: no path length limits its depth, and what already sits at a
 * name under DEST is replaced, never followed (a symlink where a directory
 * goes is an error, not a way out of DEST; DEST itself may be a symlink).
 * Invariants:
 *  1. A file or symlink appears under its final name only complete: it is
 *     written under a temporary name ".ulp-XXXXXX" in the same directory
 *     (11 bytes: it fits whatever the length of the final name) and renamed.
 *  2. A setuid (setgid) bit is restored only on an object that has the
 *     archived owner (group). As root the owner and group are restored
 *     first; otherwise, or where that fails, the bit is dropped, as tar does.
 *  3. Every entry that could not be written in full is reported on stderr
 *     with its path and cause, and counted; the export carries on with the
 *     rest and exits 1 when the count is not 0.
 */
typedef struct ectx {
	ulp_archive *a;
	uint8_t *buf;         /* IO_BLOCK bytes */
	int root;             /* 1: effective uid 0: owners are restored */
	unsigned depth;       /* directories entered: DEST itself (0) may be a symlink */
	unsigned long failed; /* entries reported as not written in full (invariant 3) */
	uint64_t done, total; /* file bytes written, and to write (the progress line) */
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
		size_t cap = d->cap ? d->cap * 2 : 32;
		char **nn = realloc(d->names, cap * sizeof(char *));
		if (!nn)
			return -ULP_E_NOMEM;
		d->names = nn;
		d->cap = cap;
	}
	if (!(d->names[d->n] = strdup(name)))
		return -ULP_E_NOMEM;
	d->n++;
	return 0;
}

static int name_order(const void *x, const void *y)
{
	return ulp_name_cmp(*(char *const *)x, *(char *const *)y);
}

static void dirlist_free(dirlist *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->names[i]);
	free(d->names);
}

/* dir/name (name alone when dir is ""), malloc'd; NULL when out of memory. */
static char *join(const char *dir, const char *name)
{
	size_t l = strlen(dir) + strlen(name) + 2;
	char *p = malloc(l);
	if (p)
		snprintf(p, l, "%s%s%s", dir, dir[0] ? "/" : "", name);
	return p;
}

/* Prints "ulpack export: DPATH: <why>"; returns -1. */
static int report(const char *dpath, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int report(const char *dpath, const char *fmt, ...)
{
	char why[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	cli_fail("%s: %s", dpath, why);
	return -1;
}

static void mtime_times(ulp_time mtime, struct timespec ts[2])
{
	ts[0] = (struct timespec){0, UTIME_OMIT};
	ts[1] = (struct timespec){(time_t)mtime.sec, (long)mtime.nsec};
}

/* Creates a fresh temporary entry in dirfd (invariant 1) and writes its
 * name to name: a file when target is NULL (returns its descriptor, open for
 * writing), else a symlink to target (returns 0). -1 and errno on failure. */
static int make_temp(int dirfd, const char *target, char name[16])
{
	static uint64_t seq;
	if (!seq) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		seq = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ 1;
	}
	for (int tries = 0; tries < 100; tries++) {
		seq = seq * 6364136223846793005ull + 1442695040888963407ull;
		snprintf(name, 16, ".ulp-%06x", (unsigned)(seq >> 40) & 0xffffffu);
		int r = target ? symlinkat(target, dirfd, name)
		               : openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (r >= 0 || errno != EEXIST)
			return r;
	}
	return -1; /* errno is EEXIST */
}

/* Owner (as root), mode and mtime of the object open on fd, in that order:
 * chown clears setuid bits, and the mode decides them (invariant 2). */
static int finish_meta(ectx *e, int fd, const char *dpath, const ulp_stat *st)
{
	int rc = 0;
	mode_t mode = st->mode & 07777;
	struct stat sb;
	struct timespec ts[2];
	if (e->root && fchown(fd, st->uid, st->gid) < 0)
		rc = report(dpath, "cannot restore owner %u:%u: %s (setuid and setgid bits dropped)", st->uid, st->gid,
		            strerror(errno));
	int known = fstat(fd, &sb) == 0;
	if (!known || sb.st_uid != st->uid)
		mode &= ~(mode_t)S_ISUID;
	if (!known || sb.st_gid != st->gid)
		mode &= ~(mode_t)S_ISGID;
	if (fchmod(fd, mode) < 0)
		rc = report(dpath, "cannot set mode %04o: %s", (unsigned)mode, strerror(errno));
	mtime_times(st->mtime, ts);
	if (futimens(fd, ts) < 0)
		rc = report(dpath, "cannot set mtime: %s", strerror(errno));
	return rc;
}

static int export_entry(ectx *e, int dirfd, const char *name, const char *apath, const char *dpath,
                        const ulp_stat *st);

static int export_dir(ectx *e, int dirfd, const char *name, const char *apath, const char *dpath,
                      const ulp_stat *st)
{
	if (mkdirat(dirfd, name, 0700) < 0 && errno != EEXIST)
		return report(dpath, "cannot create directory: %s", strerror(errno));
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (e->depth ? O_NOFOLLOW : 0));
	if (fd < 0)
		return report(dpath, "%s", errno == ENOTDIR || errno == ELOOP ? "exists and is not a directory"
		                                                               : strerror(errno));
	dirlist d = {0};
	int rc = 0;
	e->depth++;
	int r = ulp_archive_readdir(e->a, apath, collect_name, &d);
	if (r < 0) /* its entries listed so far are still written */
		rc = report(dpath, "cannot list all of it: %s",
		            r == -ULP_E_NOMEM ? "out of memory" : ulp_archive_errmsg(e->a));
	/* steps in step order: each one's chains then start from the step
	 * before, still in the decode cache */
	if (d.n > 1)
		qsort(d.names, d.n, sizeof(*d.names), name_order);
	for (size_t i = 0; i < d.n; i++) {
		char *ap = join(apath, d.names[i]), *dp = join(dpath, d.names[i]);
		ulp_stat cs;
		if (!ap || !dp)
			r = report(dpath, "%s: out of memory", d.names[i]);
		else if (ulp_archive_stat(e->a, ap, &cs) < 0)
			r = report(dp, "%s", ulp_archive_errmsg(e->a));
		else
			r = export_entry(e, fd, d.names[i], ap, dp, &cs);
		if (r < 0)
			e->failed++;
		free(ap);
		free(dp);
	}
	dirlist_free(&d);
	e->depth--;
	if (finish_meta(e, fd, dpath, st) < 0) /* last: the mode may forbid writing in it */
		rc = -1;
	close(fd);
	return rc;
}

static int export_symlink(ectx *e, int dirfd, const char *name, const char *apath, const char *dpath,
                          const ulp_stat *st)
{
	char target[4096], tmp[16];
	struct timespec ts[2];
	int rc = 0;
	if (ulp_archive_readlink(e->a, apath, target, sizeof(target)) < 0)
		return report(dpath, "%s", ulp_archive_errmsg(e->a));
	if (make_temp(dirfd, target, tmp) < 0)
		return report(dpath, "cannot create a symbolic link in its directory: %s", strerror(errno));
	if (e->root && fchownat(dirfd, tmp, st->uid, st->gid, AT_SYMLINK_NOFOLLOW) < 0)
		rc = report(dpath, "cannot restore owner %u:%u: %s", st->uid, st->gid, strerror(errno));
	mtime_times(st->mtime, ts);
	if (utimensat(dirfd, tmp, ts, AT_SYMLINK_NOFOLLOW) < 0)
		rc = report(dpath, "cannot set mtime: %s", strerror(errno));
	if (renameat(dirfd, tmp, dirfd, name) < 0) {
		rc = report(dpath, "%s", strerror(errno));
		unlinkat(dirfd, tmp, 0);
	}
	return rc;
}

static int export_file(ectx *e, int dirfd, const char *name, const char *apath, const char *dpath,
                       const ulp_stat *st)
{
	char tmp[16];
	int fd = make_temp(dirfd, NULL, tmp);
	if (fd < 0)
		return report(dpath, "cannot create a file in its directory: %s", strerror(errno));
	int written = write_out(e->a, apath, fd, dpath) == 0; /* write_out reports */
	int rc = written ? finish_meta(e, fd, dpath, st) : -1;
	if (close(fd) < 0 && written) {
		written = 0;
		rc = report(dpath, "%s", strerror(errno));
	}
	if (written && renameat(dirfd, tmp, dirfd, name) < 0) {
		written = 0;
		rc = report(dpath, "%s", strerror(errno));
	}
	if (!written)
		unlinkat(dirfd, tmp, 0);
	e->done += st->size;
	cli_progress("export", e->done, e->total);
	return rc;
}

/* Exports archive path apath (st) as name in dirfd; dpath names it in
 * messages. Returns -1 when this entry itself was not written in full
 * (reported); the entries under a directory count their own failures. */
static int export_entry(ectx *e, int dirfd, const char *name, const char *apath, const char *dpath,
                        const ulp_stat *st)
{
	if (st->is_dir)
		return export_dir(e, dirfd, name, apath, dpath, st);
	if (st->is_symlink)
		return export_symlink(e, dirfd, name, apath, dpath, st);
	return export_file(e, dirfd, name, apath, dpath, st);
}

int cmd_export(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack export ARCHIVE PATH DEST [--cache-size S] [--threads N]\n"
	                      "Writes a file, or a whole tree (\"\" or / for everything), to DEST with its mode"
	                      " and mtime\n(as root, its owner too; otherwise setuid and setgid bits are"
	                      " dropped). Carries on past\nwhat it cannot write, lists it, and exits 1.\n",
	                      3, 3, OPT_DECODE);
	if (rc)
		return rc == -1 ? 0 : 2;
	const char *dest = ao.pos[2];
	if (!dest[0]) {
		cli_fail("DEST '': an empty path");
		return 2;
	}
	/* DEST = DIR/BASE: BASE is created or replaced inside DIR */
	size_t dl = strlen(dest);
	while (dl > 1 && dest[dl - 1] == '/')
		dl--;
	char *dir = strndup(dest, dl);
	if (!dir)
		return cli_fail("out of memory");
	char *slash = strrchr(dir, '/');
	const char *base = slash ? slash + 1 : dir;
	const char *parent = slash == dir ? "/" : slash ? dir : ".";
	if (!base[0])
		base = "."; /* DEST is "/" */
	if (slash && slash != dir)
		*slash = 0;
	int dfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		rc = cli_fail("%s: cannot open its directory %s: %s", dest, parent, strerror(errno));
		free(dir);
		return rc;
	}
	ulp_archive *a = open_archive(&ao, 1);
	ectx e = {a, malloc(IO_BLOCK), geteuid() == 0, 0, 0, 0, 0};
	ulp_stat st;
	int status = 0;
	if (!a)
		status = 1;
	else if (!e.buf)
		status = cli_fail("out of memory");
	else if (ulp_archive_stat(a, ao.pos[1], &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else {
		ulp_report r;
		e.total = ulp_archive_report(a, ao.pos[1], NULL, NULL, &r) == 0 ? r.raw_bytes : st.size;
		if (export_entry(&e, dfd, base, ao.pos[1], dest, &st) < 0)
			e.failed++;
		cli_progress_end();
	}
	if (e.failed)
		status = cli_fail("%s: %lu entr%s not written in full (listed above)", dest, e.failed,
		                  e.failed == 1 ? "y" : "ies");
	close(dfd);
	free(dir);
	free(e.buf);
	ulp_archive_close(a);
	return status;
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
		       " \"sha256\": \"%s\", \"mtime_sec\": %lld, \"mtime_nsec\": %u}",
		       (unsigned long long)st->size, (unsigned long long)st->stored_bytes, ratio,
		       (long long)st->step, st->chain_depth, st->anchor ? "true" : "false",
		       st->kind == 1 ? "true" : "false",
		       st->kind == 1 ? "safetensors" : st->kind == 2 ? "torch" : "opaque", sha,
		       (long long)st->mtime.sec, (unsigned)st->mtime.nsec);
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
	                      1, 2, OPT_JSON);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	sctx s = {.json = ao.json, .first = 1};
	ulp_report r;
	ulp_stat st;
	if (ao.npos > 1 && ulp_archive_stat(a, ao.pos[1], &st) < 0) { /* a prefix that names nothing */
		rc = cli_fail("%s", ulp_archive_errmsg(a));
		ulp_archive_close(a);
		return rc;
	}
	if (s.json)
		printf("{\n  \"archive\": \"%s\",\n  \"files\": [", ao.pos[0]);
	else
		printf("%14s %14s %7s %8s %5s %s\n", "raw", "stored", "ratio", "step", "depth", "path");
	rc = ulp_archive_report(a, ao.npos > 1 ? ao.pos[1] : "", stat_file, &s, &r);
	if (rc < 0) {
		if (s.json)
			printf("\n");
		rc = cli_fail("%s", ulp_archive_errmsg(a));
		free(s.runs);
		ulp_archive_close(a);
		return rc;
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
		ulp_space sp;
		char js[2048] = "null";
		if (ulp_archive_space(a, &sp) == 0)
			ulp_space_json(&sp, js, sizeof(js));
		printf("\n  },\n  \"space\": %s", js);
		ulp_generation g;
		ulp_archive_generation(a, &g);
		if (g.shared)
			printf(",\n  \"generation\": {\"number\": %llu, \"epoch\": %llu, \"writer\": %s, \"fenced\": %s}",
			       (unsigned long long)g.gen, (unsigned long long)g.epoch, g.writer ? "true" : "false",
			       g.fenced ? "true" : "false");
		printf(",\n  \"total\": {\"files\": %llu, \"raw_bytes\": %llu, \"stored_bytes\": %llu,"
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
		cli_print_space(a, stdout);
		cli_print_generation(a, stdout);
	}
	free(s.runs);
	ulp_archive_close(a);
	return 0;
}

/* ---- verify, rm, gc ------------------------------------------------------------ */

typedef struct vjson {
	int json;
	unsigned long n; /* damaged entries printed */
} vjson;

static void print_bad(void *arg, const char *path, const char *why)
{
	vjson *v = arg;
	if (v->json) {
		printf("%s\n    {\"path\": ", v->n ? "," : "");
		json_str(stdout, path);
		printf(", \"why\": ");
		json_str(stdout, why);
		printf("}");
	} else {
		printf("DAMAGED %s: %s\n", path, why);
	}
	v->n++;
}

int cmd_verify(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack verify ARCHIVE [PATH] [--json] [--cache-size S] [--threads N]\nDecodes every file (under PATH) and checks"
	                      " its sha256; exit status 1 and a list of damaged files if any fails.\n", 1, 2,
	                      OPT_DECODE | OPT_JSON);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, 1);
	if (!a)
		return 1;
	ulp_report r;
	ulp_stat st;
	const char *path = ao.npos > 1 ? ao.pos[1] : "";
	int64_t bad = 0;
	int status = 0;
	vjson v = {ao.json, 0};
	/* a PATH that names nothing verifies nothing: an error, not "all match" */
	if (ulp_archive_stat(a, path, &st) < 0 || ulp_archive_report(a, path, NULL, NULL, &r) < 0) {
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else {
		if (v.json)
			printf("{\n  \"damaged\": [");
		bad = ulp_archive_verify_progress(a, path, print_bad, &v, v.json ? NULL : cli_progress_fn, "verify");
		cli_progress_end();
		if (v.json)
			printf("%s],\n  \"files\": %llu,\n  \"raw_bytes\": %llu,\n  \"damaged_count\": %lld,\n"
			       "  \"ok\": %s\n}\n", v.n ? "\n  " : "", (unsigned long long)r.files,
			       (unsigned long long)r.raw_bytes, (long long)(bad < 0 ? (int64_t)v.n : bad),
			       bad == 0 ? "true" : "false");
		if (bad < 0)
			status = cli_fail("%s", ulp_archive_errmsg(a));
		else if (bad > 0) {
			if (!v.json)
				printf("%lld of %llu files damaged\n", (long long)bad, (unsigned long long)r.files);
			status = 1;
		} else if (!v.json) {
			printf("verified %llu files, %llu bytes: all sha256 match\n", (unsigned long long)r.files,
			       (unsigned long long)r.raw_bytes);
		}
	}
	ulp_archive_close(a);
	return status;
}

/* 1 if path names the archive's root: only empty, "." or "/" components
 * (the library's cleaning gives ""). */
static int is_root_path(const char *path)
{
	for (const char *p = path; *p; p++)
		if (*p != '/' && !(*p == '.' && (p == path || p[-1] == '/') && (p[1] == '/' || !p[1])))
			return 0;
	return 1;
}

static int rm_tree(ulp_archive *a, const char *path)
{
	ulp_stat st;
	if (ulp_archive_stat(a, path, &st) < 0)
		return cli_fail("%s", ulp_archive_errmsg(a));
	if (st.is_dir) {
		dirlist d = {0};
		int rc = ulp_archive_readdir(a, path, collect_name, &d), status = 0;
		if (rc < 0)
			status = cli_fail("%s: %s", shown(path), rc == -ULP_E_NOMEM ? "out of memory" : ulp_archive_errmsg(a));
		for (size_t i = 0; i < d.n && status == 0; i++) {
			char *p = join(path, d.names[i]);
			status = p ? rm_tree(a, p) : cli_fail("%s: out of memory", shown(path));
			free(p);
		}
		dirlist_free(&d);
		if (status || is_root_path(path))
			return status;
	}
	return ulp_archive_remove(a, path) < 0 ? cli_fail("%s", ulp_archive_errmsg(a)) : 0;
}

int cmd_rm(int argc, char **argv)
{
	aopts ao;
	static const char usage[] =
		"usage: ulpack rm ARCHIVE PATH [-r]\n"
		"       ulpack rm ARCHIVE --all\n"
		"Removes a file (a directory tree with -r), or everything in the archive with --all.\n"
		"An empty PATH, \"/\" or \".\" (the root) is refused. The space comes back by\n"
		"itself: what was coded against the removed files is re-coded and the packs they\n"
		"leave dead are reclaimed before rm exits (no 'ulpack gc' needed).\n";
	int rc = parse_common(argc, argv, &ao, usage, 1, 2, OPT_RECURSIVE | OPT_ALL);
	if (rc)
		return rc == -1 ? 0 : 2;
	if (ao.all && ao.npos > 1) {
		cli_fail("--all takes no PATH (it removes everything)");
		return 2;
	}
	if (!ao.all && ao.npos < 2) {
		cli_fail("missing PATH (use --all to remove everything)");
		fputs(usage, stderr);
		return 2;
	}
	/* an unset shell variable must not wipe the archive: the root only with --all */
	if (!ao.all && is_root_path(ao.pos[1])) {
		cli_fail("%s: refusing to remove the archive's root (to remove everything: ulpack rm ARCHIVE --all)",
		         shown(ao.pos[1]));
		return 2;
	}
	const char *path = ao.all ? "" : ao.pos[1];
	ulp_archive *a = open_archive(&ao, 0);
	if (!a)
		return 1;
	ulp_stat st;
	int status;
	if (ulp_archive_stat(a, path, &st) < 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	else if (st.is_dir && !ao.recursive && !ao.all)
		status = cli_fail("%s: is a directory (use -r)", path);
	else
		status = rm_tree(a, path);
	/* what was coded against the removed files is re-coded, their space
	 * reclaimed (even after a partial failure: what did go) */
	if (ulp_archive_gc(a, NULL) < 0 && status == 0)
		status = cli_fail("%s", ulp_archive_errmsg(a));
	ulp_archive_close(a);
	return status;
}

int cmd_gc(int argc, char **argv)
{
	aopts ao;
	int rc = parse_common(argc, argv, &ao,
	                      "usage: ulpack gc ARCHIVE [--dry-run] [--json] [--grace SECONDS] [--cache-size S] [--threads N]\n"
	                      "Re-codes what removed steps left behind, drops blobs that no file and no chain\n"
	                      "needs, removes the packs left with nothing live and rewrites those with dead bytes.\n"
	                      "Mounts, import, rm and forget do this by themselves: gc is for archives of\n"
	                      "older builds and a forced full pass. --dry-run only measures: disk use, live and\n"
	                      "reclaimable bytes, pending re-codes. A shared archive keeps dropped packs and\n"
	                      "superseded generations for --grace seconds (default 600) for other hosts' readers.\n",
	                      1, 1, OPT_DECODE | OPT_JSON | OPT_DRY_RUN | OPT_GRACE);
	if (rc)
		return rc == -1 ? 0 : 2;
	ulp_archive *a = open_archive(&ao, ao.dry_run);
	if (!a)
		return 1;
	ulp_gc_result r = {0};
	ulp_rebase_result rb1 = {0}, rb2 = {0};
	ulp_space before, after;
	int status = 0;
	char js[2048], js2[2048];
	if (ulp_archive_space(a, &before) < 0) {
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else if (ao.dry_run) {
		ulp_space_json(&before, js, sizeof(js));
		if (ao.json)
			printf("{\"dry_run\": true, \"space\": %s}\n", js);
		else if (before.in_bucket)
			printf("dry run: %llu of %llu bytes in the bucket reclaimable (%llu live; %llu in packs no generation"
			       " names); %llu re-codes pending; local cache %llu bytes\n",
			       (unsigned long long)before.reclaimable_bytes, (unsigned long long)before.bucket_bytes,
			       (unsigned long long)before.live_bytes, (unsigned long long)before.bucket_unnamed_bytes,
			       (unsigned long long)before.pending_recodes, (unsigned long long)before.disk_bytes);
		else
			printf("dry run: %llu of %llu bytes on disk reclaimable (%llu live); %llu re-codes pending\n",
			       (unsigned long long)before.reclaimable_bytes, (unsigned long long)before.disk_bytes,
			       (unsigned long long)before.live_bytes, (unsigned long long)before.pending_recodes);
	} else {
		/* what ulp_archive_gc does, with a progress line for each part */
		ulp_progress_fn bar = ao.json ? NULL : cli_progress_fn;
		ulp_reclaim_opts o = {.full = 1, .live_percent = 100, .progress = bar, .progress_arg = "gc: rewriting packs"};
		rc = ulp_archive_rebase_pending(a, bar, "gc: re-basing", &rb1);
		if (rc == 0)
			rc = ulp_archive_rebase_orphans(a, bar, "gc: re-basing", &rb2);
		if (rc == 0)
			rc = ulp_archive_reclaim(a, &o, &r);
		if (rc == 0)
			rc = ulp_archive_space(a, &after);
		r.blobs_rebased = rb1.recoded + rb2.recoded;
		if (rc < 0) {
			status = cli_fail("%s", ulp_archive_errmsg(a));
		} else if (ao.json) {
			ulp_space_json(&before, js, sizeof(js));
			ulp_space_json(&after, js2, sizeof(js2));
			printf("{\"dry_run\": false, \"blobs_removed\": %llu, \"packs_removed\": %llu, \"packs_rewritten\": %llu,"
			       " \"bytes_reclaimed\": %llu, \"blobs_rebased\": %llu, \"before\": %s, \"after\": %s}\n",
			       (unsigned long long)r.blobs_removed, (unsigned long long)r.packs_removed,
			       (unsigned long long)r.packs_rewritten, (unsigned long long)r.bytes_reclaimed,
			       (unsigned long long)r.blobs_rebased, js, js2);
		} else {
			printf("gc: %llu blobs dropped, %llu packs removed, %llu rewritten, %llu bytes reclaimed,"
			       " %llu blobs re-based; %s %llu -> %llu bytes\n",
			       (unsigned long long)r.blobs_removed, (unsigned long long)r.packs_removed,
			       (unsigned long long)r.packs_rewritten, (unsigned long long)r.bytes_reclaimed,
			       (unsigned long long)r.blobs_rebased, before.in_bucket ? "bucket" : "disk",
			       (unsigned long long)(before.in_bucket ? before.bucket_bytes : before.disk_bytes),
			       (unsigned long long)(after.in_bucket ? after.bucket_bytes : after.disk_bytes));
		}
	}
	ulp_archive_close(a);
	return status;
}
