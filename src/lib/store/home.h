/* SPDX-License-Identifier: MIT */
/*
 * home.h - a shared archive's home: where its published objects live for
 * the other hosts (DESIGN.md 7), as a small table of operations that gen.c
 * and lease.c reach it through, never knowing which one it is. Objects are
 * named relative to the home ("index/CURRENT", "index/gen-G.db", "lease",
 * "packs/NAME"); the local directory a->dir is always laid out as shared.h
 * says, and these operations concern what the home keeps apart from it.
 *
 * The rows (chosen at open, archive.c; one file each):
 *  - home_dir.c, the plain directory (a shared file system): the directory
 *    is the home itself, so it keeps nothing apart: get finds nothing
 *    (NOENT), get_range, put, put_if_match, del, drop and usage have nothing
 *    to do (0), list lists nothing; a writer is fenced there by the files of
 *    lease/ and each epoch's own pointer (lease.c, gen.c invariant 7);
 *  - remote.c, an S3 bucket prefix (remote.h): the objects are in the
 *    bucket, the local directory holds copies; the pointer and the lease
 *    are replaced by compare-and-swap (remote.h invariant 2).
 * Another object store is one more file with one more row (its open called
 * by archive.c for its URLs).
 *
 * Errors are negative ULP_E_*, with the message recorded through
 * ulp_arch_err (naming the object where the home is and the cause), except
 * where an operation says otherwise. Every operation is safe from any
 * thread at once; a row holds no lock of the archive's.
 */
#ifndef ULP_HOME_H
#define ULP_HOME_H

#include "arch_int.h"

#define ULP_HOME_TAG_MAX 128 /* an object's version tag (an S3 ETag, quotes and NUL) */

typedef struct ulp_home ulp_home;

typedef struct ulp_home_ops {
	const char *name;  /* "dir", "s3" */
	/* 1: the home holds the pointer and the lease apart from the directory
	 * and is their authority, replacing them by compare-and-swap
	 * (put_if_match): a writer publishes there, not by per-epoch files;
	 * 0: the directory is the home, without compare-and-swap. */
	int swaps;
	/* 1: a request may wait on a network: a reader's looks at the pointer
	 * and the listings of usage run on the handle's poller (gen.c
	 * invariant 9), never in a read. */
	int background;
	/* How often a publication takes the next number where its generation's
	 * name is taken in the directory (0: never, the name is this epoch's
	 * own: first_gen). */
	int relink;
	/* What a reader is told where the home has no pointer (after "WHERE: "). */
	const char *no_pointer;
	/* The first generation number a writer of epoch may use (0: any). */
	uint64_t (*first_gen)(uint64_t epoch);
	/* A small object whole into buf (cap bytes at most; *len its size) and
	 * its tag (may be NULL). NOENT where the home keeps no such object. */
	int (*get)(ulp_home *h, const char *rel, char *buf, size_t cap, size_t *len, char tag[ULP_HOME_TAG_MAX]);
	/* Object rel into the local file path whole, in ranges (size: its size
	 * where known, else 0; want: the size it must have, else 0: another is
	 * CORRUPT, nothing fetched). */
	int (*get_range)(ulp_home *h, const char *rel, const char *path, uint64_t size, uint64_t want);
	/* The local file path as object rel, created only: EXIST where the
	 * home has one of that name (another writer's). */
	int (*put)(ulp_home *h, const char *rel, const char *path);
	/* The small object rel replaced by the len bytes at p only where it is
	 * as tag says ("": only where there is none), tag then its new one:
	 * EXIST when it moved. tag is a field of the handle (ulp_home's tag,
	 * lease_tag), read and written under h->mu. */
	int (*put_if_match)(ulp_home *h, const char *rel, const char *p, size_t len, char tag[ULP_HOME_TAG_MAX]);
	int (*del)(ulp_home *h, const char *rel);
	/* Calls cb for each object whose name starts with prefix, with its
	 * size; a non-zero return of cb stops the walk and is returned. */
	int (*list)(ulp_home *h, const char *prefix, int (*cb)(void *arg, const char *rel, uint64_t size), void *arg);
	/* The local copy path of an object the handle no longer needs let go
	 * (where the directory is the home, the file is the object: kept). */
	void (*drop)(ulp_home *h, const char *path);
	/* What the home holds listed anew (the figures of df); 0 or an error. */
	int (*usage)(ulp_home *h);
	void (*close)(ulp_home *h);
} ulp_home_ops;

struct ulp_home {
	const ulp_home_ops *ops; /* set at open, read-only after */
	ulp_archive *a;          /* set at open, read-only after: for messages */
	const char *where;       /* set at open, read-only after: the home in
	                            messages (s3://BUCKET/PREFIX, or the directory) */
	int creating;            /* set at open, read-only after: init (no pointer yet) */
	uint64_t floor_epoch;    /* set by the writer's open (gen.c), read-only after:
	                            the epoch of the pointer it found (its own is higher) */
	pthread_mutex_t mu;
	char tag[ULP_HOME_TAG_MAX]; /* guarded by mu: the tag of index/CURRENT as this
	                            writer last read or wrote it ("": none yet) */
	char lease_tag[ULP_HOME_TAG_MAX]; /* guarded by mu: the tag of the lease
	                            object as this writer last wrote it */
};

/* The rows' opens: the directory a->dir, and (remote.c) the bucket of
 * a->rm. */
int ulp_home_dir_open(ulp_archive *a, ulp_home **out);
int ulp_home_s3_open(ulp_archive *a, ulp_home **out);
void ulp_home_close(ulp_home *h);

#endif
