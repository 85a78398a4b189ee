/* SPDX-License-Identifier: MIT */
/* cmd_recode.c - ulpack forget: retention of a run's steps, with the space
 * of forgotten steps given back (libulpack re-bases what kept steps still
 * need, then gc drops the rest). All logic is in recode.c. */
#include "cli.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
	"usage: ulpack forget ARCHIVE RUN [--keep-last N] [--keep-every K] [--keep STEP]... [--dry-run] [--json]\n"
	"                     [--threads N] [--cache-size S]\n"
	"Removes the steps of RUN (a directory of the archive) that no rule keeps, then gives their space back:\n"
	"blobs of removed steps that kept steps still need are re-coded against the nearest kept step (decoded,\n"
	"re-encoded, verified, committed), and gc drops the rest. A step is kept if any rule keeps it:\n"
	"  --keep-last N   the N highest steps\n"
	"  --keep-every K  steps whose number is a multiple of K (by number, so a new step never changes\n"
	"                  which older steps are kept)\n"
	"  --keep STEP     that step (repeatable)\n"
	"Files without a step number are always kept. --dry-run lists what would go and changes nothing.\n";

typedef struct fctx {
	int json, first;
	uint64_t kept, gone;
} fctx;

static int show_step(void *arg, int64_t step, uint64_t files, int kept)
{
	fctx *c = arg;
	if (kept)
		c->kept++;
	else
		c->gone++;
	if (c->json)
		printf("%s{\"step\": %lld, \"files\": %llu, \"kept\": %s}", c->first++ ? ", " : "", (long long)step,
		       (unsigned long long)files, kept ? "true" : "false");
	else
		printf("%-6s step %lld (%llu file%s)\n", kept ? "keep" : "forget", (long long)step,
		       (unsigned long long)files, files == 1 ? "" : "s");
	return 0;
}

static void bar(void *arg, uint64_t done, uint64_t total)
{
	(void)arg;
	int w = 40, f = total ? (int)((double)done / (double)total * w) : w;
	fprintf(stderr, "\rre-basing [%.*s%*s] %5.1f%% of %.1f MB", f, "########################################", w - f,
	        "", total ? 100.0 * (double)done / (double)total : 100.0, (double)total / 1e6);
	if (done >= total)
		fputc('\n', stderr);
}

int cmd_forget(int argc, char **argv)
{
	const char *pos[2];
	int npos = 0, json = 0, threads = 0;
	uint64_t cache = 0;
	int64_t *keep = NULL;
	ulp_forget_opts o = {0};
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		int64_t v;
		if (cli_is_help(s)) {
			fputs(usage, stdout);
			free(keep);
			return 0;
		}
		int takes = !strcmp(s, "--keep-last") || !strcmp(s, "--keep-every") || !strcmp(s, "--keep") ||
		            !strcmp(s, "--threads") || !strcmp(s, "--cache-size");
		if (takes && i + 1 == argc) {
			free(keep);
			return cli_opt_missing(s);
		}
		int rc = 0;
		if (!strcmp(s, "--keep-last")) {
			rc = cli_opt_int(s, argv[++i], 1, INT64_MAX, &o.keep_last);
		} else if (!strcmp(s, "--keep-every")) {
			rc = cli_opt_int(s, argv[++i], 1, INT64_MAX, &o.keep_every);
		} else if (!strcmp(s, "--keep")) {
			if ((rc = cli_opt_int(s, argv[++i], 0, INT64_MAX, &v)) == 0) {
				int64_t *k = realloc(keep, (o.n_keep + 1) * sizeof(*k));
				if (!k) {
					free(keep);
					return cli_fail("out of memory");
				}
				keep = k;
				keep[o.n_keep++] = v;
			}
		} else if (!strcmp(s, "--threads")) {
			if ((rc = cli_opt_int(s, argv[++i], 0, ULP_MAX_THREADS, &v)) == 0)
				threads = (int)v;
		} else if (!strcmp(s, "--cache-size")) {
			rc = cli_opt_size(s, argv[++i], &cache);
		} else if (!strcmp(s, "--dry-run")) {
			o.dry_run = 1;
		} else if (!strcmp(s, "--json")) {
			json = 1;
		} else if (s[0] == '-' && s[1]) {
			free(keep);
			fprintf(stderr, "ulpack forget: unknown option %s\n%s", s, usage);
			return 2;
		} else if (npos < 2) {
			pos[npos++] = s;
		} else {
			free(keep);
			fprintf(stderr, "ulpack forget: too many arguments\n%s", usage);
			return 2;
		}
		if (rc) {
			free(keep);
			return rc;
		}
	}
	if (npos != 2 || (!o.keep_last && !o.keep_every && !o.n_keep)) {
		free(keep);
		fprintf(stderr, "ulpack forget: %s\n%s", npos != 2 ? "needs ARCHIVE and RUN" : "needs at least one --keep rule",
		        usage);
		return 2;
	}
	o.keep = keep;
	ulp_archive_opts ao = {.cache_size = cache, .threads = threads, .read_only = o.dry_run};
	ulp_archive *a;
	char err[1024];
	if (ulp_archive_open(pos[0], &ao, &a, err, sizeof(err)) < 0) {
		free(keep);
		return cli_fail("%s", err);
	}
	cli_staged(a, o.dry_run);
	fctx c = {json, 0, 0, 0};
	if (json)
		printf("{\"run\": \"%s\", \"dry_run\": %s, \"steps\": [", pos[1], o.dry_run ? "true" : "false");
	int status = 0;
	ulp_report before, after;
	int64_t n = ulp_archive_report(a, "", NULL, NULL, &before);
	if (n == 0)
		n = ulp_archive_forget(a, pos[1], &o, show_step, &c);
	ulp_rebase_result rb = {0};
	ulp_gc_result g = {0};
	if (n >= 0 && !o.dry_run) {
		int tty = !json && isatty(STDERR_FILENO);
		int rc = ulp_archive_rebase_orphans(a, tty ? bar : NULL, NULL, &rb);
		if (rc == 0)
			rc = ulp_archive_gc(a, &g);
		if (rc == 0)
			rc = ulp_archive_report(a, "", NULL, NULL, &after);
		if (rc < 0)
			n = rc;
	}
	if (n < 0) {
		if (json)
			printf("]}\n");
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else if (json) {
		printf("], \"kept\": %llu, \"forgotten\": %llu", (unsigned long long)c.kept, (unsigned long long)c.gone);
		if (!o.dry_run)
			printf(", \"pack_bytes_before\": %llu, \"pack_bytes_after\": %llu, \"blobs_rebased\": %llu,"
			       " \"rebase_raw_bytes\": %llu, \"rebase_seconds\": %.3f",
			       (unsigned long long)before.pack_bytes, (unsigned long long)after.pack_bytes,
			       (unsigned long long)(rb.recoded + g.blobs_rebased), (unsigned long long)rb.raw_bytes,
			       rb.seconds);
		printf("}\n");
	} else if (o.dry_run) {
		printf("dry run: %llu steps would be forgotten, %llu kept\n", (unsigned long long)c.gone,
		       (unsigned long long)c.kept);
	} else {
		printf("forget: %llu steps forgotten, %llu kept; %llu blobs re-based (%.1f MB in %.2f s);"
		       " packs %.1f MB -> %.1f MB\n",
		       (unsigned long long)c.gone, (unsigned long long)c.kept,
		       (unsigned long long)(rb.recoded + g.blobs_rebased), (double)rb.raw_bytes / 1e6, rb.seconds,
		       (double)before.pack_bytes / 1e6, (double)after.pack_bytes / 1e6);
	}
	ulp_archive_close(a);
	free(keep);
	return status;
}
