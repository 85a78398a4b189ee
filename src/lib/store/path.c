/* SPDX-License-Identifier: MIT */
/*
 * path.c - the rules of paths inside an archive: the archive form of a path
 * (components joined by one '/', no leading or trailing '/', no '.'; never
 * a '..', so nothing escapes the archive; names of at most ULP_NAME_MAX
 * bytes, paths of at most ULP_PATH_MAX), its parent and name, and the step
 * and series a path names (ulp_parse_step).
 *
 * The library's one step parser is here: ulp_step_key finds a step key and
 * its digits in a name. ulp_parse_step (the step and series of a path, for
 * the index) and archive/steps.c's rule for the step of a step directory's
 * name (and of a file beside it)) are rules over it: their own keys, and
 * what else counts (a path's last number; a name of digits only).
 */
#include "arch_int.h"
#include "path.h"
#include <stdio.h>
#include <stdlib.h>

/* ---- paths ------------------------------------------------------------- */

int ulp_path_clean(const char *in, char *out, size_t cap)
{
	size_t o = 0;
	const char *p = in;
	while (*p) {
		while (*p == '/')
			p++;
		const char *s = p;
		while (*p && *p != '/')
			p++;
		size_t len = (size_t)(p - s);
		if (len == 0 || (len == 1 && s[0] == '.'))
			continue;
		if (len == 2 && s[0] == '.' && s[1] == '.')
			return -ULP_E_INVAL; /* never escapes the archive */
		if (len > ULP_NAME_MAX || o + len + 2 > cap || o + len + 1 > ULP_PATH_MAX)
			return -ULP_E_NAMETOOLONG; /* could not be written back out */
		if (o)
			out[o++] = '/';
		memcpy(out + o, s, len);
		o += len;
	}
	out[o] = 0;
	return 0;
}

int ulp_arch_path(ulp_archive *a, const char *path, char *out, size_t cap)
{
	int rc = ulp_path_clean(path, out, cap);
	if (rc == -ULP_E_NAMETOOLONG)
		return ulp_arch_err(a, rc, "%.200s...: a name over %d bytes or a path over %d bytes", path, ULP_NAME_MAX,
		                    ULP_PATH_MAX);
	if (rc < 0)
		return ulp_arch_err(a, rc, "%s: not a valid path inside an archive (a '..' component)", path);
	return 0;
}

int ulp_path_check(const char *path)
{
	char p[ULP_PATH_MAX + 1];
	return ulp_path_clean(path, p, sizeof(p));
}

/* The cause of a path that cannot be created, as the caller's error: a too
 * long name has its own code (ENAMETOOLONG at the FUSE edge). */
int ulp_path_bad(ulp_archive *a, const char *path, const char *what)
{
	if (ulp_path_check(path) == -ULP_E_NAMETOOLONG)
		return ulp_arch_err(a, -ULP_E_NAMETOOLONG, "%.200s...: %s: a name over %d bytes or a path over %d bytes",
		                    path, what, ULP_NAME_MAX, ULP_PATH_MAX);
	return 0;
}

char *ulp_path_parent(const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t len = slash ? (size_t)(slash - path) : 0;
	char *p = malloc(len + 1);
	if (p) {
		memcpy(p, path, len);
		p[len] = 0;
	}
	return p;
}

const char *ulp_path_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash ? slash + 1 : path;
}

/* ---- steps -------------------------------------------------------------- */

static int is_digit(char c)
{
	return c >= '0' && c <= '9';
}

const char *ulp_step_key(const char *start, const char *end, const char *const *keys, size_t n_keys,
                         int after_global)
{
	for (size_t k = 0; k < n_keys; k++) {
		size_t kl = strlen(keys[k]);
		for (const char *s = start; s + kl < end; s++) {
			if (strncmp(s, keys[k], kl) != 0 || !is_digit(s[kl]))
				continue;
			/* "step" must not be the tail of a longer word (e.g. "mystep") */
			if (s > start && ((s[-1] >= 'a' && s[-1] <= 'z') || (s[-1] >= 'A' && s[-1] <= 'Z')) &&
			    strncmp(keys[k], "global", 6) != 0)
				continue;
			if (!after_global && s - start >= 7 && !strncmp(s - 7, "global_", 7))
				continue;
			return s + kl;
		}
	}
	return NULL;
}

/* Lightning and NeMo name a checkpoint after its metrics ("epoch=2-step=300",
 * "megatron_gpt--val_loss=2.31-step=100-consumed_samples=800.0"): values
 * that change with the step, or (an epoch) every so many steps. In the
 * component s[cs, ce) of a series, each "word=<number>" becomes "word=*",
 * in place (it only shortens), so that such files are one series. A
 * component without "=" is left as it is. */
static void metrics_out(char *s, size_t cs, size_t ce)
{
	size_t o = cs, i = cs, n = strlen(s);
	while (i < ce) {
		s[o++] = s[i];
		if (s[i++] != '=' || i - 1 == cs || !(is_digit(s[i]) || (s[i] == '-' && is_digit(s[i + 1]))))
			continue;
		size_t j = i + (s[i] == '-');
		while (j < ce && is_digit(s[j]))
			j++;
		if (j + 1 < ce && s[j] == '.' && is_digit(s[j + 1]))
			for (j++; j < ce && is_digit(s[j]);)
				j++;
		if (j + 1 < ce && (s[j] == 'e' || s[j] == 'E')) {
			size_t k = j + 1 + (s[j + 1] == '-' || s[j + 1] == '+');
			if (k < ce && is_digit(s[k]))
				for (j = k; j < ce && is_digit(s[j]);)
					j++;
		}
		s[o++] = '*';
		i = j;
	}
	memmove(s + o, s + ce, n - ce + 1);
}

int64_t ulp_parse_step(const char *path, char **series)
{
	static const char *const keys[] = {"global_step", "checkpoint-", "checkpoint_", "checkpoint",
	                                   "step_", "step-", "step=", "step", "iter_", "iter-", "iteration_",
	                                   "iteration-", "iter", "ckpt-", "ckpt_", "ckpt"};
	size_t len = strlen(path);
	const char *digits = NULL;
	/* components from the last to the first; within one, the first key */
	const char *end = path + len;
	while (end > path && !digits) {
		const char *start = end;
		while (start > path && start[-1] != '/')
			start--;
		digits = ulp_step_key(start, end, keys, ULP_ARRAY_LEN(keys), 1);
		end = start > path ? start - 1 : path;
	}
	if (!digits) { /* the last number of the file name */
		const char *name = strrchr(path, '/');
		name = name ? name + 1 : path;
		for (const char *s = path + len; s > name; s--)
			if (is_digit(s[-1])) {
				const char *e = s;
				while (s > name && is_digit(s[-1]))
					s--;
				digits = s;
				(void)e;
				break;
			}
	}
	if (!digits) {
		if (series)
			*series = NULL;
		return -1;
	}
	const char *de = digits;
	int64_t v = 0;
	while (is_digit(*de) && v < ((int64_t)1 << 58)) {
		v = v * 10 + (*de - '0');
		de++;
	}
	while (is_digit(*de))
		de++;
	if (series) {
		size_t pre = (size_t)(digits - path), post = strlen(de);
		*series = malloc(pre + 3 + post + 1);
		if (*series) {
			memcpy(*series, path, pre);
			memcpy(*series + pre, "{S}", 3);
			memcpy(*series + pre + 3, de, post + 1);
			/* the component holding the step, in the series */
			size_t cs = pre, ce = pre + 3;
			while (cs > 0 && (*series)[cs - 1] != '/')
				cs--;
			while ((*series)[ce] && (*series)[ce] != '/')
				ce++;
			metrics_out(*series, cs, ce);
		}
	}
	return v;
}
