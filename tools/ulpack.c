/* SPDX-License-Identifier: MIT */
/* ulpack.c - the ulpack command: dispatch to subcommands and shared helpers. */
#include "cli.h"
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *summary;
} commands[] = {
	{"init", cmd_init, "ARCHIVE [--shared]: create an empty archive"},
	{"share", cmd_share, "ARCHIVE: let many hosts read it: publish index generations, one writer by lease"},
	{"import", cmd_import, "ARCHIVE SRC_DIR [--prefix P] [--json]: archive a directory tree, in step order"},
	{"ls", cmd_ls, "ARCHIVE [PATH] [--json]: list a directory of the archive, numbered names in numeric order"},
	{"steps", cmd_steps, "ARCHIVE [RUN] [--json]: each run's steps: raw and stored bytes, ratio, chain depth"},
	{"dynamics", cmd_dynamics, "ARCHIVE RUN [--json] [--svg FILE] [--tensors GLOB]: per step and layer, the update's"
	             " bits/weight from the index; the step that jumps"},
	{"diff", cmd_diff, "ARCHIVE PATH_A PATH_B [--json]: what changed between two checkpoints, tensor by tensor"},
	{"cat", cmd_cat, "ARCHIVE PATH: write a file's original bytes to stdout"},
	{"export", cmd_export, "ARCHIVE PATH DEST: write a file, a step or a tree out as plain files (no FUSE needed)"},
	{"stat", cmd_stat, "ARCHIVE [PATH] [--json]: sizes, ratios, bits/weight, chain depths"},
	{"verify", cmd_verify, "ARCHIVE [PATH] [--json]: decode everything and check every sha256"},
	{"rm", cmd_rm, "ARCHIVE PATH [-r] | ARCHIVE --all: remove a file, a tree or everything (space comes back by itself)"},
	{"gc", cmd_gc, "ARCHIVE: a forced full pass (writes reclaim by themselves): re-code, drop, rewrite packs"},
	{"sync", cmd_sync, "MOUNTPOINT: wait until everything closed in a mount is archived; name failures"},
	{"status", cmd_status, "MOUNTPOINT|ARCHIVE [--json] [--watch]: what the daemon is doing: queue, rate, lease, errors"},
	{"forget", cmd_forget, "ARCHIVE RUN --keep-last N --keep-every K [--keep STEP]: thin a run, free space"},
	{"bench", cmd_bench, "REF TARGET [--json] [--threads N]: codec benchmark (safetensors or torch.save pairs)"},
	{"synth", cmd_synth, "OUTDIR [--steps N] [--dtype D]: write a synthetic training trajectory"},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: ulpack COMMAND [ARGS]   (ulpack COMMAND --help for details)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %-7s %s\n", commands[i].name, commands[i].summary);
	fprintf(f, "\nulpack %s; see ulpack(1) and ulpack-format(5).\n", ULP_VERSION_STRING);
}

const char *cli_cmd;

int cli_fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "ulpack%s%s: ", cli_cmd ? " " : "", cli_cmd ? cli_cmd : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 1;
}

static int progress_open; /* a progress line is drawn and not ended */

void cli_progress(const char *what, uint64_t done, uint64_t total)
{
	static int tty = -1;
	if (tty < 0)
		tty = isatty(STDERR_FILENO);
	if (!tty || total == 0)
		return;
	progress_open = done < total;
	if (done > total)
		done = total;
	int w = 40, f = total ? (int)((double)done / (double)total * w) : w;
	fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% of %.1f MB", what, f, "########################################",
	        w - f, "", total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1e6);
	if (done >= total)
		fputc('\n', stderr);
	fflush(stderr);
}

void cli_progress_end(void)
{
	if (progress_open)
		fputs("\r\033[K", stderr);
	progress_open = 0;
}

void cli_progress_fn(void *what, uint64_t done, uint64_t total)
{
	cli_progress(what, done, total);
}

void cli_staged(ulp_archive *a, int read_only)
{
	unsigned n = 0;
	if (ulp_stage_orphans(a, &n) < 0 || n == 0)
		return;
	if (!read_only) {
		unsigned rec = 0;
		int rc = ulp_stage_recover_unmounted(a, &rec);
		if (rc == 0 && rec)
			fprintf(stderr, "ulpack %s: archived %u file%s that an interrupted mount left in %s/staging\n",
			        cli_cmd ? cli_cmd : "", rec, rec == 1 ? "" : "s", ulp_archive_dir(a));
		if (rc == 0 || rc == -ULP_E_BUSY)
			return;
		fprintf(stderr, "ulpack %s: could not archive the files an interrupted mount left staged: %s\n",
		        cli_cmd ? cli_cmd : "", ulp_archive_errmsg(a));
	}
	fprintf(stderr, "ulpack %s: note: %s/staging holds %u file%s of an interrupted mount, not archived yet and"
	        " not shown (the next mount or writing command archives them)\n", cli_cmd ? cli_cmd : "",
	        ulp_archive_dir(a), n, n == 1 ? "" : "s");
}

int cli_print_space(ulp_archive *a, FILE *f)
{
	ulp_space sp;
	if (ulp_archive_space(a, &sp) < 0)
		return 0;
	/* an archive in a bucket: the bucket is the archive, the local home a cache */
	if (sp.in_bucket)
		fprintf(f, "bucket: %llu bytes (packs %llu in %llu objects, %llu of them in packs no generation names)\n",
		        (unsigned long long)sp.bucket_bytes, (unsigned long long)sp.bucket_pack_bytes,
		        (unsigned long long)sp.bucket_packs, (unsigned long long)sp.bucket_unnamed_bytes);
	fprintf(f, "%s: %llu bytes (packs %llu, index %llu, staging %llu); live %llu; reclaimable %llu"
	        " (%llu of %llu packs with nothing live, %llu under %u%% live); pending re-codes %llu\n",
	        sp.in_bucket ? "local cache" : "disk", (unsigned long long)sp.disk_bytes,
	        (unsigned long long)sp.pack_disk_bytes,
	        (unsigned long long)sp.index_bytes, (unsigned long long)sp.staging_bytes,
	        (unsigned long long)sp.live_bytes, (unsigned long long)sp.reclaimable_bytes,
	        (unsigned long long)sp.dead_packs, (unsigned long long)sp.packs,
	        (unsigned long long)sp.sparse_packs, ULP_RECLAIM_LIVE_PERCENT, (unsigned long long)sp.pending_recodes);
	return 1;
}

int cli_print_generation(ulp_archive *a, FILE *f)
{
	ulp_generation g;
	if (ulp_archive_generation(a, &g) < 0 || !g.shared)
		return 0;
	fprintf(f, "shared: generation %llu, writer epoch %llu%s%s; readers look every %.1f s, grace %u s\n",
	        (unsigned long long)g.gen, (unsigned long long)g.epoch, g.writer ? " (this writer)" : "",
	        g.fenced ? ", FENCED (lease lost)" : "", g.poll_ms / 1000.0, g.grace_s);
	return 1;
}

int cli_opt_int(const char *opt, const char *val, int64_t min, int64_t max, int64_t *out)
{
	int rc = ulp_parse_int(val, min, max, out);
	if (rc == -ULP_E_INVAL)
		cli_fail("%s '%s': not an integer (expects one from %lld to %lld)", opt, val, (long long)min,
		         (long long)max);
	else if (rc < 0)
		cli_fail("%s '%s': out of range (expects %lld to %lld)", opt, val, (long long)min, (long long)max);
	return rc < 0 ? 2 : 0;
}

int cli_opt_double(const char *opt, const char *val, double min, double max, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(val, &end);
	/* v == v: not a NaN; blanks before the number are refused too */
	if (end == val || *end || errno == ERANGE || !(v == v) || val[0] == ' ' || val[0] == '\t') {
		cli_fail("%s '%s': not a number (expects one from %g to %g)", opt, val, min, max);
		return 2;
	}
	if (v < min || v > max) {
		cli_fail("%s '%s': out of range (expects %g to %g)", opt, val, min, max);
		return 2;
	}
	*out = v;
	return 0;
}

int cli_opt_size(const char *opt, const char *val, uint64_t *out)
{
	if (ulp_parse_size(val, out) < 0) {
		cli_fail("%s '%s': not a size (examples: 512M, 4G)", opt, val);
		return 2;
	}
	return 0;
}

int cli_opt_missing(const char *opt)
{
	cli_fail("option %s needs a value", opt);
	return 2;
}

int cli_is_help(const char *a)
{
	return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

double cli_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_read_file(const char *path, uint8_t **buf, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		cli_fail("%s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		cli_fail("%s: not a regular file", path);
		return -1;
	}
	uint8_t *b = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!b) {
		close(fd);
		cli_fail("%s: out of memory for %lld bytes", path, (long long)st.st_size);
		return -1;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			cli_fail("%s: %s", path, r < 0 ? strerror(errno) : "file shrank while reading");
			free(b);
			close(fd);
			return -1;
		}
		got += (size_t)r;
	}
	close(fd);
	*buf = b;
	*len = got;
	return 0;
}

int main(int argc, char **argv)
{
	/* tables and buffers of a few hundred KiB come and go per tensor: from
	 * the heap, not from fresh mappings (first touch costs more than the
	 * coding of the bytes in them) */
	mallopt(M_MMAP_THRESHOLD, 4 << 20);
	mallopt(M_TRIM_THRESHOLD, 128 << 20);
	if (argc < 2 || cli_is_help(argv[1])) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (strcmp(argv[1], "--version") == 0) {
		printf("ulpack %s\n", ULP_VERSION_STRING);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(argv[1], commands[i].name) == 0) {
			cli_cmd = commands[i].name;
			return commands[i].fn(argc - 1, argv + 1);
		}
	cli_fail("unknown command '%s' (try ulpack --help)", argv[1]);
	return 2;
}
