/* SPDX-License-Identifier: MIT */
/*
 * backend.h - where the pack store keeps its objects (the pack files): a
 * small table of operations behind pack.c, so that another place (an object
 * store) can come without ingest, read or recode knowing. pack.c is its only
 * user; the local directory ARCHIVE/packs (backend_dir.c) is the first
 * implementation, chosen at archive open (ulp_packstore_open).
 *
 * Objects are named by the caller (a pack's "<sha256>.pack", a writer's
 * "tmp-<pid>-<n>"), flat, without '/'. Every operation is safe from any
 * thread at once; a backend holds no lock of the archive's. Errors are
 * negative ULP_E_*, with the message recorded through ulp_arch_err naming the
 * object's path and the cause, except for remove, whose callers ignore it.
 *
 * Not behind the interface yet (the next issue extends it): the streaming
 * writer (ulp_pack_writer_new and the appends write a temporary file under
 * the directory incrementally, from several threads; put_file then makes it
 * the object), the unnamed spill file ingest.c and recode.c make beside the
 * packs, and ulp_pack_mark_gone's stat of a mapped pack's file (it compares
 * the file's identity with the mapping's).
 */
#ifndef ULP_BACKEND_H
#define ULP_BACKEND_H

#include "arch_int.h"
#include <sys/types.h>

typedef struct ulp_backend ulp_backend;

/* A mapped object (map): base is NULL for an empty one. dev and ino name
 * the mapped file (ulp_pack_mark_gone). */
typedef struct ulp_backend_map {
	const uint8_t *base;
	uint64_t size;
	dev_t dev;
	ino_t ino;
} ulp_backend_map;

/* What put_file did, for its caller's cleanup after a failure. */
enum {
	ULP_PUT_REPLACED = 1, /* an object of that name was there before */
	ULP_PUT_RENAMED = 2   /* the object is under its final name (even if put_file then failed) */
};

typedef struct ulp_backend_ops {
	const char *name; /* "dir" */
	/* Object name holds the len bytes at p, durable before return (local
	 * directory: temporary file, fsync, rename, fsync of the directory). */
	int (*put)(ulp_backend *b, const char *name, const void *p, size_t len);
	/* The object the streaming writer wrote into temporary object tmp
	 * through *fd becomes name, durable before return: fsync, close (*fd
	 * -1 once closed), rename, fsync of the directory, in that order (pack.c
	 * invariant 1); the ULP_PUT_* flags of *done (the caller's record of
	 * what was done, 0 at first) are updated as each step is done. */
	int (*put_file)(ulp_backend *b, int *fd, const char *tmp, const char *name, unsigned *done);
	/* len bytes of object name from offset off into p (a short object: CORRUPT). */
	int (*read_range)(ulp_backend *b, const char *name, uint64_t off, void *p, size_t len);
	/* Optional (NULL where the objects are not files): maps object name
	 * read-only, shared; the caller munmaps m->base, m->size. size: the
	 * object's size as the index says (0: not known); a backend that fetches
	 * objects refuses one of another size (CORRUPT) and keeps no copy. */
	int (*map)(ulp_backend *b, const char *name, uint64_t size, ulp_backend_map *m);
	/* Optional (NULL where an object has no copy to fetch again: the local
	 * directory): the local copy of object name, mapped at m (its bytes
	 * failed a checksum), dropped; then, where m is not NULL, fetched again
	 * and mapped over the same addresses (MAP_FIXED, m->size bytes: pointers
	 * into the old mapping stay valid and see the new bytes), m->dev and
	 * m->ino updated. A copy of another size is refused (CORRUPT). */
	int (*refetch)(ulp_backend *b, const char *name, ulp_backend_map *m);
	/* Calls cb for each object whose name starts with prefix, with its size;
	 * cb may remove the object it is called for. A non-zero return of cb
	 * stops the walk and is returned. */
	int (*list)(ulp_backend *b, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
	            void *arg);
	/* Removes object name: 0, or a negative ULP_E_* (NOENT if it was not
	 * there), no message. */
	int (*remove)(ulp_backend *b, const char *name);
	/* Atomically replaces the small pointer object name by the len bytes at
	 * p: readers see the old bytes or the new ones, never a mix. */
	int (*publish)(ulp_backend *b, const char *name, const void *p, size_t len);
	void (*close)(ulp_backend *b);
} ulp_backend_ops;

struct ulp_backend {
	const ulp_backend_ops *ops; /* set at open, read-only after */
	ulp_archive *a;             /* set at open, read-only after: for messages */
	char *root;                 /* set at open, read-only after: where the objects
	                               are (the directory of the local backend) */
};

/* The local directory backend over root (ARCHIVE/packs). */
int ulp_backend_dir_open(ulp_archive *a, const char *root, ulp_backend **out);

#endif
