/* SPDX-License-Identifier: MIT */
/*
 * cmd_dynamics.c - `ulpack dynamics ARCHIVE RUN`: a run's training dynamics
 * from its index (ulp_archive_dynamics): the verdict line, a table of steps
 * with their largest movers, --json (ulp_dynamics_json), and --svg, a heat
 * map of steps x layers drawn here as plain SVG text; `ulpack diff ARCHIVE A
 * B`: what changed between two checkpoints, tensor by tensor
 * (ulp_archive_diff). The figures are the library's; this file only lays
 * them out.
 */
#include "cli.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: ulpack dynamics ARCHIVE RUN [--json] [--svg FILE] [--tensors GLOB] [--norms]\n"
	        "A run's training dynamics from the archive's index alone (nothing is decoded):\n"
	        "per step and per layer, the stored bits per weight of the tensors' blobs and of\n"
	        "the update from the step before (the delta linking the two steps). The first\n"
	        "line names the step whose update stands out most from its neighbours'.\n"
	        "--json prints every figure; --svg FILE writes a heat map (steps x layers, colour:\n"
	        "update bits per weight); --tensors GLOB keeps the tensors whose name matches;\n"
	        "--norms decodes the run and adds each step's change from the step before:\n"
	        "||x_t - x_s|| / ||x_s||, elements changed, ULP percentiles (as ulpack diff).\n"
	        "See ulpack(1) DYNAMICS.\n");
}

/* ---- the table --------------------------------------------------------------- */

static void print_table(const ulp_dynamics *d)
{
	size_t S = d->n_steps, T = d->n_tensors, L = d->n_layers;
	if (d->norms)
		printf("%10s %11s %8s %8s %7s %10s %8s  %s\n", "step", "stored", "bits/w", "update", "a/d/=", "rel chg",
		       "changed", "largest movers (update bits over their neighbours')");
	else
		printf("%10s %11s %8s %8s %7s  %s\n", "step", "stored", "bits/w", "update", "a/d/=",
		       "largest movers (update bits over their neighbours')");
	for (size_t s = 0; s < S; s++) {
		unsigned na = 0, nd = 0, ns = 0;
		for (size_t t = 0; t < T; t++) {
			int r = d->cells[s * T + t].role;
			na += r == ULP_DYN_ANCHOR;
			nd += r == ULP_DYN_DELTA;
			ns += r == ULP_DYN_SAME;
		}
		char st[32], up[32], roles[32];
		ulp_format_bytes(d->step_stored[s], st, sizeof(st));
		if (isfinite(d->step_update[s]))
			snprintf(up, sizeof(up), "%.3f", d->step_update[s]);
		else
			snprintf(up, sizeof(up), "-");
		snprintf(roles, sizeof(roles), "%u/%u/%u", na, nd, ns);
		printf("%10lld %11s %8.3f %8s %7s ", (long long)d->steps[s], st, d->step_bits[s], up, roles);
		if (d->norms) {
			if (isfinite(d->step_rel_change[s]))
				printf("%10.3e %7.2f%% ", d->step_rel_change[s], 100 * d->step_frac_changed[s]);
			else
				printf("%10s %8s ", "-", "-");
		}
		/* the two layers that moved most against their neighbours */
		size_t top[2] = {SIZE_MAX, SIZE_MAX};
		for (size_t l = 0; l < L; l++) {
			double r = d->layer_excess[s * L + l];
			if (!isfinite(r))
				continue;
			if (top[0] == SIZE_MAX || r > d->layer_excess[s * L + top[0]]) {
				top[1] = top[0];
				top[0] = l;
			} else if (top[1] == SIZE_MAX || r > d->layer_excess[s * L + top[1]]) {
				top[1] = l;
			}
		}
		for (int k = 0; k < 2 && top[k] != SIZE_MAX; k++)
			printf("%s %s %+.2f", k ? "," : "", d->layers[top[k]], d->layer_excess[s * L + top[k]]);
		if (top[0] == SIZE_MAX)
			printf(" %s", s == 0 ? "(first step)" : "(no delta links it to the step before)");
		if (d->has_jump && s == d->jump.step_index)
			printf("  <- jump");
		putchar('\n');
	}
	printf("%zu steps, %zu tensors, %zu layers", S, T, L);
	printf("; a/d/=: tensors stored as anchors, deltas, the same blob as the step before\n");
}

/* ---- the heat map ------------------------------------------------------------- */

/* RdYlBu, reversed: low blue, middle pale yellow, high red. */
static void colour(double x, char out[8])
{
	static const double stops[5][3] = {
		{49, 54, 149}, {116, 173, 209}, {255, 255, 191}, {244, 109, 67}, {165, 0, 38}};
	if (!(x >= 0))
		x = 0;
	if (x > 1)
		x = 1;
	double p = x * 4;
	int k = (int)p;
	if (k > 3)
		k = 3;
	double f = p - k;
	int c[3];
	for (int i = 0; i < 3; i++)
		c[i] = (int)lround(stops[k][i] + f * (stops[k + 1][i] - stops[k][i]));
	snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}

static void xml(FILE *f, const char *s)
{
	for (; *s; s++) {
		switch (*s) {
		case '<': fputs("&lt;", f); break;
		case '>': fputs("&gt;", f); break;
		case '&': fputs("&amp;", f); break;
		case '"': fputs("&quot;", f); break;
		default: fputc(*s, f);
		}
	}
}

#define HOT_CELLS 3

static int dbl_cmp(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;
	return a < b ? -1 : a > b;
}

static int write_svg(const ulp_dynamics *d, const char *path)
{
	size_t S = d->n_steps, L = d->n_layers;
	const double *v = d->layer_update;
	double lo = INFINITY, hi = -INFINITY;
	int clipped = 0;
	for (size_t i = 0; i < S * L; i++) {
		if (isfinite(v[i])) {
			lo = v[i] < lo ? v[i] : lo;
			hi = v[i] > hi ? v[i] : hi;
		}
	}
	if (!isfinite(lo))
		lo = hi = 0;
	/* the scale's top: the 95th percentile, so that a few small tensors
	 * (a blob's tables weigh on them) do not wash the rest out */
	double *sorted = malloc((S * L + 1) * sizeof(double));
	size_t nf = 0;
	for (size_t i = 0; sorted && i < S * L; i++)
		if (isfinite(v[i]))
			sorted[nf++] = v[i];
	if (nf) {
		qsort(sorted, nf, sizeof(double), dbl_cmp);
		double p95 = sorted[(size_t)((double)(nf - 1) * 0.95)];
		clipped = p95 < hi;
		hi = p95 > lo ? p95 : hi;
	}
	free(sorted);
	/* the hottest cells: the largest rises over their neighbours */
	const double *ex = d->layer_excess;
	size_t hot[HOT_CELLS];
	int nh = 0;
	for (int k = 0; k < HOT_CELLS; k++) {
		size_t best = SIZE_MAX;
		for (size_t i = 0; i < S * L; i++) {
			int taken = 0;
			for (int q = 0; q < nh; q++)
				taken |= hot[q] == i;
			if (!taken && isfinite(ex[i]) && ex[i] > 0 && (best == SIZE_MAX || ex[i] > ex[best]))
				best = i;
		}
		if (best == SIZE_MAX)
			break;
		hot[nh++] = best;
	}
	size_t name_w = 0;
	for (size_t l = 0; l < L; l++)
		name_w = strlen(d->layers[l]) > name_w ? strlen(d->layers[l]) : name_w;
	int cw = (int)(900 / (S ? S : 1)), ch = 22;
	cw = cw < 1 ? 1 : cw > 48 ? 48 : cw;
	int left = 16 + 7 * (int)name_w, top = 56, gw = cw * (int)S, gh = ch * (int)L;
	char line[16384];
	ulp_dynamics_summary(d, line, sizeof(line));
	int width = left + gw + 150, height = top + gh + (gh > 120 ? 64 : 110), tw = 16 + (int)(6.2 * (double)strlen(line));
	width = width < tw ? tw : width;
	FILE *f = fopen(path, "w");
	if (!f)
		return cli_fail("%s: %s", path, strerror(errno));
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	           "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\""
	           " font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
	        width, height, width, height);
	fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height);
	fputs("<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">", f);
	xml(f, d->run[0] ? d->run : "(archive root)");
	fputs(": update bits per weight, per step and layer</text>\n<text x=\"8\" y=\"36\" font-size=\"10\">", f);
	xml(f, line);
	fputs("</text>\n", f);
	/* the cells: one rect each, with what it shows in data- attributes */
	for (size_t l = 0; l < L; l++) {
		int y = top + (int)l * ch;
		fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" font-size=\"11\">", left - 6, y + ch / 2 + 4);
		xml(f, d->layers[l]);
		fputs("</text>\n", f);
		for (size_t s = 0; s < S; s++) {
			double x = v[s * L + l];
			char fill[8];
			if (isfinite(x))
				colour(hi > lo ? (x - lo) / (hi - lo) : 0.5, fill);
			else
				snprintf(fill, sizeof(fill), "#d9d9d9");
			fprintf(f, "<rect class=\"cell\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\""
			           " data-step=\"%lld\" data-layer=\"%zu\" data-value=\"",
			        left + (int)s * cw, y, cw, ch, fill, (long long)d->steps[s], l);
			if (isfinite(x))
				fprintf(f, "%.6g", x);
			else
				fputs("none", f);
			fputs("\"/>\n", f);
		}
	}
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#404040\"/>\n", left, top,
	        gw, gh);
	/* the step axis: a label every 60 pixels or so */
	size_t every = (size_t)(60 / cw) + 1;
	for (size_t s = 0; s < S; s += every) {
		int x = left + (int)s * cw + cw / 2;
		fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#404040\"/>\n", x, top + gh, x, top + gh + 4);
		fprintf(f, "<text class=\"step\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\">%lld</text>\n", x,
		        top + gh + 16, (long long)d->steps[s]);
	}
	fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", left + gw / 2, top + gh + 34);
	/* the hottest cells: a frame, and the rise over the neighbours in bits */
	for (int k = 0; k < nh; k++) {
		size_t s = hot[k] / L, l = hot[k] % L;
		int x = left + (int)s * cw, y = top + (int)l * ch;
		fprintf(f, "<rect class=\"hot\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\""
		           " stroke=\"#000000\" stroke-width=\"2\" data-step=\"%lld\" data-layer=\"%zu\"/>\n",
		        x, y, cw, ch, (long long)d->steps[s], l);
		fprintf(f, "<text class=\"hot\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"10\""
		           " font-weight=\"bold\" stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\">%+.1f</text>\n",
		        x + cw / 2, y + ch / 2 + 4, ex[hot[k]]);
	}
	/* the legend: the scale, and the grey of no figure */
	int lx = left + gw + 40, ly = top, lh = gh > 120 ? gh - 40 : 80;
	fputs("<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">\n", f);
	for (int k = 0; k <= 8; k++) {
		char c[8];
		colour(k / 8.0, c);
		fprintf(f, "<stop offset=\"%.3f\" stop-color=\"%s\"/>\n", k / 8.0, c);
	}
	fputs("</linearGradient></defs>\n", f);
	fprintf(f, "<rect class=\"legend\" x=\"%d\" y=\"%d\" width=\"16\" height=\"%d\" fill=\"url(#scale)\""
	           " stroke=\"#404040\"/>\n", lx, ly, lh);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%s%.3g</text>\n", lx + 20, ly + 8, clipped ? "&#8805; " : "", hi);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">%.3g</text>\n", lx + 20, ly + lh, lo);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">bits/w</text>\n", lx - 10, ly - 6);
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"12\" fill=\"#d9d9d9\" stroke=\"#404040\"/>\n", lx,
	        ly + lh + 10);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">no delta</text>\n", lx + 20, ly + lh + 20);
	fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"12\" fill=\"none\" stroke=\"#000000\""
	           " stroke-width=\"2\"/>\n", lx, ly + lh + 28);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">+bits over</text>\n", lx + 20, ly + lh + 38);
	fprintf(f, "<text x=\"%d\" y=\"%d\" font-size=\"10\">neighbours</text>\n", lx + 20, ly + lh + 50);
	fputs("</svg>\n", f);
	int bad = ferror(f);
	if (fclose(f) != 0 || bad)
		return cli_fail("%s: %s", path, strerror(errno));
	return 0;
}

int cmd_dynamics(int argc, char **argv)
{
	const char *pos[2] = {NULL, NULL}, *svg = NULL, *glob = NULL;
	int npos = 0, json = 0, norms = 0;
	for (int i = 1; i < argc; i++) {
		if (cli_is_help(argv[i])) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--norms")) {
			norms = 1;
		} else if ((!strcmp(argv[i], "--svg") || !strcmp(argv[i], "--tensors")) && i + 1 == argc) {
			return cli_opt_missing(argv[i]);
		} else if (!strcmp(argv[i], "--svg")) {
			svg = argv[++i];
		} else if (!strcmp(argv[i], "--tensors")) {
			glob = argv[++i];
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			cli_fail("unknown option '%s'", argv[i]);
			usage(stderr);
			return 2;
		} else if (npos == 2) {
			cli_fail("unexpected argument '%s'", argv[i]);
			usage(stderr);
			return 2;
		} else {
			pos[npos++] = argv[i];
		}
	}
	if (npos < 2) {
		cli_fail("missing argument%s", npos ? "" : "s");
		usage(stderr);
		return 2;
	}
	char err[1024];
	ulp_archive *a;
	ulp_archive_opts o = {.read_only = 1, .threads = norms ? 0 : 1};
	if (ulp_archive_open(pos[0], &o, &a, err, sizeof(err)) < 0)
		return cli_fail("%s", err);
	ulp_dynamics *d = NULL;
	int status = 0;
	if (ulp_archive_dynamics(a, pos[1], glob, &d) < 0 ||
	    (norms && ulp_dynamics_norms(a, d, cli_progress_fn, (void *)"norms") < 0)) {
		cli_progress_end();
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else {
		if (json) {
			char *js;
			size_t n;
			if (ulp_dynamics_json(d, 0, &js, &n) < 0) {
				status = cli_fail("out of memory");
			} else {
				fwrite(js, 1, n, stdout);
				free(js);
			}
		} else {
			char line[16384];
			ulp_dynamics_summary(d, line, sizeof(line));
			printf("%s\n", line);
			print_table(d);
		}
		if (status == 0 && svg)
			status = write_svg(d, svg);
	}
	ulp_dynamics_free(d);
	ulp_archive_close(a);
	return status;
}

/* ---- diff -------------------------------------------------------------------- */

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

static void json_num(FILE *f, double v)
{
	if (isfinite(v))
		fprintf(f, "%.9g", v);
	else
		fputs("null", f);
}

int cmd_diff(int argc, char **argv)
{
	const char *pos[3] = {NULL, NULL, NULL};
	int npos = 0, json = 0;
	static const char use[] = "usage: ulpack diff ARCHIVE PATH_A PATH_B [--json]\n"
	                          "What changed from checkpoint file PATH_A to PATH_B (any two steps of a run),\n"
	                          "tensor by tensor, largest relative change first: elements changed, the median,\n"
	                          "99th percentile and largest change in units in the last place, ||B - A|| / ||A||\n"
	                          "and exponent moves. Decodes both files' tensors. See ulpack(1) DIFF.\n";
	for (int i = 1; i < argc; i++) {
		if (cli_is_help(argv[i])) {
			fputs(use, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if ((argv[i][0] == '-' && argv[i][1]) || npos == 3) {
			cli_fail("%s '%s'", npos == 3 ? "unexpected argument" : "unknown option", argv[i]);
			fputs(use, stderr);
			return 2;
		} else {
			pos[npos++] = argv[i];
		}
	}
	if (npos < 3) {
		cli_fail("missing argument%s", npos < 2 ? "s" : "");
		fputs(use, stderr);
		return 2;
	}
	char err[1024];
	ulp_archive *a;
	ulp_archive_opts o = {.read_only = 1};
	if (ulp_archive_open(pos[0], &o, &a, err, sizeof(err)) < 0)
		return cli_fail("%s", err);
	ulp_tensor_diff *v = NULL;
	size_t n = 0;
	int status = 0;
	if (ulp_archive_diff(a, pos[1], pos[2], &v, &n) < 0) {
		status = cli_fail("%s", ulp_archive_errmsg(a));
	} else if (json) {
		printf("{\"a\": ");
		json_str(stdout, pos[1]);
		printf(", \"b\": ");
		json_str(stdout, pos[2]);
		printf(", \"tensors\": [");
		for (size_t i = 0; i < n; i++) {
			const ulp_tensor_diff *r = &v[i];
			printf("%s\n  {\"name\": ", i ? "," : "");
			json_str(stdout, r->name);
			printf(", \"dtype\": \"%s\", \"elements\": %llu, \"changed\": %llu, \"frac_changed\": ",
			       ulp_dtype_name((ulp_dtype)r->dtype), (unsigned long long)r->elements,
			       (unsigned long long)r->changed);
			json_num(stdout, r->frac_changed);
			printf(", \"median_ulps\": %llu, \"p99_ulps\": %llu, \"max_ulps\": %llu, \"rel_change\": ",
			       (unsigned long long)r->median_ulps, (unsigned long long)r->p99_ulps,
			       (unsigned long long)r->max_ulps);
			json_num(stdout, r->rel_change);
			printf(", \"norm_a\": ");
			json_num(stdout, r->norm_a);
			printf(", \"norm_diff\": ");
			json_num(stdout, r->norm_diff);
			printf(", \"exponent_moves\": %llu}", (unsigned long long)r->exponent_moves);
		}
		printf("%s]}\n", n ? "\n" : "");
	} else {
		printf("%-48s %6s %11s %8s %7s %7s %9s %10s %9s\n", "tensor", "dtype", "elements", "changed", "median", "p99",
		       "max ulps", "rel change", "exp moves");
		for (size_t i = 0; i < n; i++) {
			const ulp_tensor_diff *r = &v[i];
			char rel[32];
			if (isfinite(r->rel_change))
				snprintf(rel, sizeof(rel), "%.3e", r->rel_change);
			else
				snprintf(rel, sizeof(rel), "-");
			printf("%-48s %6s %11llu %7.2f%% %7llu %7llu %9llu %10s %9llu\n", r->name,
			       ulp_dtype_name((ulp_dtype)r->dtype), (unsigned long long)r->elements, 100 * r->frac_changed,
			       (unsigned long long)r->median_ulps, (unsigned long long)r->p99_ulps,
			       (unsigned long long)r->max_ulps, rel, (unsigned long long)r->exponent_moves);
		}
	}
	ulp_tensor_diffs_free(v, n);
	ulp_archive_close(a);
	return status;
}
