/* SPDX-License-Identifier: MIT */
/*
 * path.h - the rules of paths inside an archive (path.c): parents, names,
 * normal form, the causes of a bad path, the step a path names.
 */
#ifndef ULP_PATH_H
#define ULP_PATH_H

#include "arch_int.h"

/* Directory part of path (malloc'd) and its last component. */
char *ulp_path_parent(const char *path);
const char *ulp_path_name(const char *path);

/* Normalizes a user path to the archive form; -INVAL for '..' or NUL. */
int ulp_path_clean(const char *in, char *out, size_t cap);

/* ulp_path_clean for a path a caller gave: INVAL or NAMETOOLONG with a
 * message naming the path in a's errmsg. */
int ulp_arch_path(ulp_archive *a, const char *path, char *out, size_t cap);

/* The cause of a path that cannot be created (what), as a's error: NAMETOOLONG
 * for a too long name (ENAMETOOLONG at the FUSE edge), else 0. */
int ulp_path_bad(ulp_archive *a, const char *path, const char *what);

/* The step parser (path.c): the digits after the first of keys (in their
 * order) found in [start, end) followed by a digit, where it starts a word
 * (no letter before it, unless the key starts with "global"), or NULL. With
 * after_global 0 a key right after "global_" (DeepSpeed's global_stepN) does
 * not count. ulp_parse_step and ulp_name_step are rules over it. */
const char *ulp_step_key(const char *start, const char *end, const char *const *keys, size_t n_keys,
                         int after_global);

#endif
