/* SPDX-License-Identifier: MIT */
/*
 * steps.c - steps, not names: numbered names in numeric order, the step of a
 * step directory's name, each run's steps with their sizes (`ulpack steps`),
 * and the latest step of a run directory (the mount's `latest` symlink).
 * Reads the index through the public listing calls only; owns no state.
 * The key scan of a step name is the library's one step parser, path.c's
 * ulp_step_key (ulp_parse_step, the step and series of an indexed path, is
 * the other rule over it).
 *
 * Definitions (ulpack(1) STEPS, ulpackfs(1) LATEST):
 *  - A step directory is a directory whose name carries a step in one of the
 *    forms training frameworks write (checkpoint-N, checkpoint_N, step_N,
 *    step-N, stepN, iter_N, iteration_N, ckpt-N, epochE-stepN, ...) or is
 *    digits only (orbax: 1000/). Names starting with '.' or "tmp" (rsync's
 *    and Trainer's temporaries) are not step directories.
 *  - A step file is a file outside any step directory whose name, less its
 *    extension, is a step name and not digits only (model_step_1000.pt,
 *    Lightning's epoch=0-step=100.ckpt): a step of the directory holding it.
 *  - A run directory is a directory that is neither a step directory nor
 *    inside one and has at least one step directory or step file among its
 *    children.
 *  - A file belongs to the step directory that is its shallowest ancestor
 *    step directory (run/checkpoint-100/global_step100/x is step 100 of run).
 *
 * Invariants:
 *  1. ulp_name_cmp is a total order, and 0 only for equal strings: digit
 *     runs compare by value, and names equal that way ("007" vs "7") fall
 *     back to strcmp.
 *  2. ulp_archive_latest never answers for a directory that has a real
 *     entry called "latest": a real entry always wins.
 *  3. `latest` names a step that is whole as far as the session knows: no
 *     file at or under it open for writing or waiting under a temporary
 *     name (ulp_session_busy_under), and not an empty directory; a resume
 *     that follows it never reads a checkpoint being written. Closed files
 *     still queued for archiving count (they read back from staging).
 */
#include "arch_int.h"
#include "store/path.h"
#include "store/shared.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int digit(char c)
{
	return c >= '0' && c <= '9';
}

int ulp_name_cmp(const char *a, const char *b)
{
	const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
	while (*x && *y) {
		if (digit((char)*x) && digit((char)*y)) {
			const unsigned char *xs = x, *ys = y;
			while (*xs == '0' && digit((char)xs[1]))
				xs++;
			while (*ys == '0' && digit((char)ys[1]))
				ys++;
			const unsigned char *xe = xs, *ye = ys;
			while (digit((char)*xe))
				xe++;
			while (digit((char)*ye))
				ye++;
			size_t xl = (size_t)(xe - xs), yl = (size_t)(ye - ys);
			if (xl != yl)
				return xl < yl ? -1 : 1; /* more significant digits: larger */
			int c = memcmp(xs, ys, xl);
			if (c)
				return c < 0 ? -1 : 1;
			x = xe;
			y = ye;
			continue;
		}
		if (*x != *y)
			return *x < *y ? -1 : 1;
		x++;
		y++;
	}
	if (*x || *y)
		return *x ? 1 : -1;
	int c = strcmp(a, b); /* invariant 1: "007" vs "7" */
	return c < 0 ? -1 : c > 0;
}

int64_t ulp_name_step(const char *name)
{
	static const char *const keys[] = {"checkpoint-", "checkpoint_", "checkpoint", "step_", "step-", "step=", "step",
	                                   "iteration_", "iteration-", "iter_", "iter-", "iter", "ckpt-", "ckpt_",
	                                   "ckpt"};
	const char *digits = NULL;
	if (!name[0] || name[0] == '.' || !strncmp(name, "tmp", 3) || strchr(name, '/'))
		return -1;
	const char *p = name;
	while (digit(*p))
		p++;
	if (!*p) {
		digits = name; /* digits only */
	} else {
		/* the key must start a word: "mystep3" and DeepSpeed's
		 * global_stepN (its run directory holds its own `latest`
		 * file, which must stay writable) are not step names */
		digits = ulp_step_key(name, name + strlen(name), keys, ULP_ARRAY_LEN(keys), 0);
	}
	if (!digits)
		return -1;
	int64_t v = 0;
	for (; digit(*digits); digits++) {
		if (v > (INT64_MAX - (*digits - '0')) / 10) /* INT64_MAX itself is a step */
			return -1;
		v = v * 10 + (*digits - '0');
	}
	return v;
}

int64_t ulp_name_step_file(const char *name)
{
	const char *dot = strrchr(name, '.');
	char stem[ULP_NAME_MAX + 1];
	size_t sl = dot ? (size_t)(dot - name) : 0;
	if (!sl || !dot[1] || sl > ULP_NAME_MAX)
		return -1; /* no extension: "checkpoint-9999" is no step file */
	memcpy(stem, name, sl);
	stem[sl] = 0;
	const char *p = stem;
	while (digit(*p))
		p++;
	return *p ? ulp_name_step(stem) : -1; /* digits only ("0.0"): chunks, not steps */
}

/* ---- latest ------------------------------------------------------------------- */

typedef struct lcand {
	char *name;
	int64_t step;
	int is_dir;
} lcand;

typedef struct lctx {
	lcand *v;
	size_t n, cap;
	int real; /* a real entry named "latest" */
	int rc;
} lctx;

static int latest_cb(void *arg, const char *name, const ulp_stat *st)
{
	lctx *l = arg;
	if (!strcmp(name, "latest")) {
		l->real = 1;
		return 1; /* invariant 2: nothing more to learn */
	}
	int64_t s = st->is_dir ? ulp_name_step(name) : st->is_symlink ? -1 : ulp_name_step_file(name);
	if (s < 0 || strlen(name) > ULP_NAME_MAX)
		return 0;
	if (ulp_grow(&l->v, &l->cap, l->n, sizeof(*l->v)) < 0 || !(l->v[l->n].name = strdup(name))) {
		l->rc = -ULP_E_NOMEM;
		return 1;
	}
	l->v[l->n].step = s;
	l->v[l->n++].is_dir = st->is_dir;
	return 0;
}

/* Newest first: the highest step, ties to the greatest name. */
static int cand_cmp(const void *x, const void *y)
{
	const lcand *a = x, *b = y;
	if (a->step != b->step)
		return a->step > b->step ? -1 : 1;
	return -ulp_name_cmp(a->name, b->name);
}

static int any_cb(void *arg, const char *name, const ulp_stat *st)
{
	(void)name, (void)st;
	*(int *)arg = 1;
	return 1;
}

static int list_dir(ulp_archive *a, ulp_session *s, const char *p, int (*cb)(void *, const char *, const ulp_stat *),
                    void *arg)
{
	return s ? ulp_session_readdir(s, p, cb, arg) : ulp_archive_readdir(a, p, cb, arg);
}

int ulp_archive_latest_live(ulp_archive *a, ulp_session *s, const char *dir, char *name, size_t cap)
{
	char p[ULP_PATH_MAX + 1];
	ULP_TRY(ulp_arch_path(a, dir, p, sizeof(p)));
	/* in a step directory (or one itself): its files are that step's, no run */
	for (const char *c = p; *c;) {
		const char *e = strchr(c, '/');
		size_t l = e ? (size_t)(e - c) : strlen(c);
		char comp[ULP_NAME_MAX + 1];
		snprintf(comp, sizeof(comp), "%.*s", (int)ULP_MIN(l, ULP_NAME_MAX), c);
		if (ulp_name_step(comp) >= 0)
			return ulp_arch_err(a, -ULP_E_NOENT, "%s: %s step directory, not a run directory", p,
			                    e ? "in a" : "a");
		c = e ? e + 1 : c + l;
	}
	lctx l = {0};
	int rc = list_dir(a, s, p, latest_cb, &l);
	if (rc >= 0 && l.rc < 0)
		rc = ulp_arch_err(a, l.rc, "%s: out of memory", p);
	else if (rc >= 0 && l.real)
		rc = ulp_arch_err(a, -ULP_E_EXIST, "%s/latest: a real entry", p);
	else if (rc >= 0 && !l.n)
		rc = ulp_arch_err(a, -ULP_E_NOENT, "%s: not a run directory (no step directory or file in it)",
		                  p[0] ? p : "''");
	if (rc >= 0 && l.n) {
		qsort(l.v, l.n, sizeof(*l.v), cand_cmp);
		size_t i = 0;
		for (; i < l.n; i++) {
			/* invariant 3: a step whose files are all closed, and not empty */
			char cp[ULP_PATH_MAX + 1];
			if ((size_t)snprintf(cp, sizeof(cp), "%s%s%s", p, p[0] ? "/" : "", l.v[i].name) >= sizeof(cp))
				continue;
			if (s && ulp_session_busy_under(s, cp))
				continue;
			int any = 0;
			if (l.v[i].is_dir && (list_dir(a, s, cp, any_cb, &any) < 0 || !any))
				continue;
			break;
		}
		if (i == l.n)
			rc = ulp_arch_err(a, -ULP_E_NOENT, "%s: no step whose files are all closed", p[0] ? p : "''");
		else if (strlen(l.v[i].name) >= cap)
			rc = -ULP_E_OVERFLOW;
		else
			memcpy(name, l.v[i].name, strlen(l.v[i].name) + 1);
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.v[i].name);
	free(l.v);
	return rc < 0 ? rc : 0;
}

int ulp_archive_latest(ulp_archive *a, const char *dir, char *name, size_t cap)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	return ulp_archive_latest_live(a, NULL, dir, name, cap);
}

/* ---- steps of runs -------------------------------------------------------------- */

typedef struct srow {
	char *dir;   /* the step directory's path (malloc'd) */
	size_t run_len; /* bytes of dir that name its run (no trailing '/') */
	int64_t step;
	uint64_t files, raw, stored;
	unsigned depth;
	int is_file; /* a step file: dir is the file's path */
} srow;

typedef struct sctx {
	srow *rows;
	size_t n, cap;
	int rc;
} sctx;

/* Offset and length of the shallowest ancestor directory of path that is a
 * step directory under a run directory; 0 if none. */
static int step_dir_of(const char *path, size_t *dir_len, size_t *run_len, int64_t *step)
{
	const char *start = path;
	for (const char *slash; (slash = strchr(start, '/')) != NULL; start = slash + 1) {
		char name[ULP_NAME_MAX + 1];
		size_t l = (size_t)(slash - start);
		if (l > ULP_NAME_MAX)
			continue;
		memcpy(name, start, l);
		name[l] = 0;
		int64_t s = ulp_name_step(name);
		if (s < 0)
			continue;
		*dir_len = (size_t)(slash - path);
		*run_len = start > path ? (size_t)(start - path) - 1 : 0;
		*step = s;
		return 1;
	}
	return 0;
}

static int steps_file(void *arg, const char *path, const ulp_stat *st)
{
	sctx *s = arg;
	size_t dl, rl;
	int64_t step;
	int is_file = 0;
	if (!step_dir_of(path, &dl, &rl, &step)) {
		const char *name = ulp_path_name(path);
		if (st->is_symlink || st->is_dir || (step = ulp_name_step_file(name)) < 0)
			return 0;
		dl = strlen(path); /* a step file: a step of the directory holding it */
		rl = name > path ? (size_t)(name - path) - 1 : 0;
		is_file = 1;
	}
	srow *r = NULL;
	/* files come in step order: the row is usually one of the last ones */
	for (size_t i = s->n; i-- > 0 && !r;)
		if (strlen(s->rows[i].dir) == dl && !strncmp(s->rows[i].dir, path, dl))
			r = &s->rows[i];
	if (!r) {
		if (ulp_grow(&s->rows, &s->cap, s->n, sizeof(*s->rows)) < 0 || !(s->rows[s->n].dir = strndup(path, dl)))
			return s->rc = -ULP_E_NOMEM;
		r = &s->rows[s->n++];
		r->run_len = rl;
		r->step = step;
		r->files = r->raw = r->stored = 0;
		r->depth = 0;
		r->is_file = is_file;
	}
	r->files++;
	r->raw += st->size;
	r->stored += st->stored_bytes;
	if (st->chain_depth > r->depth)
		r->depth = st->chain_depth;
	return 0;
}

static int row_cmp(const void *x, const void *y)
{
	const srow *a = x, *b = y;
	size_t l = ULP_MIN(a->run_len, b->run_len);
	int c = strncmp(a->dir, b->dir, l);
	if (c == 0 && a->run_len != b->run_len)
		c = a->run_len < b->run_len ? -1 : 1;
	if (c)
		return c;
	if (a->step != b->step)
		return a->step < b->step ? -1 : 1;
	return ulp_name_cmp(a->dir + a->run_len, b->dir + b->run_len);
}

int ulp_archive_steps(ulp_archive *a, const char *prefix, int (*cb)(void *arg, const ulp_step_info *s),
                      void *arg)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	sctx s = {0};
	ulp_report rep;
	int rc = ulp_archive_report(a, prefix ? prefix : "", steps_file, &s, &rep);
	if (rc >= 0 && s.rc < 0)
		rc = ulp_arch_err(a, s.rc, "steps: out of memory");
	if (rc >= 0) {
		if (s.n) /* qsort(NULL, 0) is undefined: a prefix with no step directory */
			qsort(s.rows, s.n, sizeof(*s.rows), row_cmp);
		for (size_t i = 0; i < s.n && rc == 0; i++) {
			srow *r = &s.rows[i];
			char run[ULP_PATH_MAX + 1];
			snprintf(run, sizeof(run), "%.*s", (int)r->run_len, r->dir);
			ulp_step_info si = {run, r->dir, r->step, r->files, r->raw, r->stored, r->depth, r->is_file};
			rc = cb(arg, &si);
		}
	}
	for (size_t i = 0; i < s.n; i++)
		free(s.rows[i].dir);
	free(s.rows);
	return rc;
}
