/* SPDX-License-Identifier: MIT */
/*
 * remote.h - an archive whose home is an S3 bucket prefix (issue 26;
 * DESIGN.md 7): s3://BUCKET/PREFIX holds what a shared archive's directory
 * holds for other hosts, as objects:
 *   PREFIX/packs/<sha256>.pack     the packs (immutable, content-named)
 *   PREFIX/index/gen-<20 digits>.db|.patch  the published generations
 *   PREFIX/lease                   the writer's lease (shared.h's lease
 *                                  line), replaced only by a conditional PUT
 *                                  on the ETag its holder last wrote
 *   PREFIX/index/CURRENT           the pointer (shared.h's format), replaced
 *                                  only by a conditional PUT (If-Match: the
 *                                  ETag its writer last wrote; If-None-Match: *
 *                                  by init): a compare-and-swap, so of two
 *                                  writers exactly one wins
 * Every host works in a local directory of its own (the "local home": the
 * cache_dir option, else $ULPACK_CACHE_DIR, $XDG_CACHE_HOME/ulpack or
 * ~/.cache/ulpack, then /s3/BUCKET-HASH/writer or /reader, HASH keyed by
 * the endpoint, the bucket and the prefix), laid out as a
 * shared archive (shared.h): the writer's live ulpack.db, staging/, lease/,
 * index/ (the generations it published or fetched), and packs/, the pack
 * cache (backend_s3.c). The rest of the library sees that directory as
 * a->dir; remote.c moves objects between it and the bucket, and is the
 * bucket's row of the home's table (home.h: what gen.c and lease.c use).
 *
 * Invariants:
 *  1. A pack is in the bucket before any index row names it (backend_s3.c
 *     uploads in put_file, before pack.c's commit returns); a generation
 *     file is in the bucket before the CURRENT that names it (gen.c).
 *  2. The writer replaces CURRENT only by compare-and-swap on the ETag it
 *     last wrote (the home's tag, home.h); a failed swap (412) fences it for good (lease.c
 *     invariant 2): another writer took the archive.
 *     The lease object is taken and renewed the same way (lease.c): a
 *     writer that finds it renewed less than a lease ago stops (BUSY), and
 *     of two that find it expired, one swaps it.
 *  3. A reader fetches a generation's files whole into its index/ (a
 *     temporary and a rename) before it follows it; a file fetched is never
 *     fetched again (generations are never rewritten).
 *  4. A writer numbers its generations from EPOCH * 2^32 up, so two writers
 *     never make objects of the same name: a generation a fenced writer
 *     uploaded before its swap failed is never taken for the next writer's.
 *  5. The local home is reached only through directories root or this
 *     user owns, each writable by no one else but with the sticky bit, and
 *     symbolic links only where no one else can replace them (open_trusted
 *     walks the path one name at a time); s3/, s3/BUCKET-HASH/, the home
 *     and its packs/, index/, staging/ and (a writer's) lease/ are this
 *     user's, made 0700 (mkdirat, openat with O_NOFOLLOW under the checked
 *     directory) and
 *     checked when found (not a link, this user's, not writable by others):
 *     otherwise the open is refused, naming the directory and the cause. No
 *     symbolic link is among the home's own entries. So no other user can
 *     put a link or swap a directory anywhere on the way, and the paths the
 *     rest of the library opens under a->dir lead where they were checked.
 *  6. The home belongs to one archive: its directory's name hashes the
 *     endpoint, the bucket and the prefix (two archives of one bucket and
 *     prefix at two endpoints never share a home), and its file "remote"
 *     names the URL and the endpoint; a home of another is refused.
 *  7. A subdirectory of the home that went missing (packs/ removed by hand)
 *     is made again, with the checks of invariant 5, by the next fetch into
 *     it (ulp_remote_fetch), never left to fail every read until a remount.
 */
#ifndef ULP_REMOTE_H
#define ULP_REMOTE_H

#include "arch_int.h"
#include "s3.h"

#define ULP_PACK_CACHE_DEFAULT ((uint64_t)8 << 30) /* a reader's pack cache, bytes */

/* What the bucket holds under the prefix (issue 34 item 11): the archive's
 * size, where the local home is only a cache. */
typedef struct ulp_remote_usage {
	uint64_t bytes;      /* every object */
	uint64_t pack_bytes; /* of which the packs (PREFIX/packs/NAME) */
	uint64_t packs;
} ulp_remote_usage;

struct ulp_remote {
	ulp_s3 *s3;            /* set at open, read-only after (its own lock) */
	char *url;             /* set at open, read-only after: s3://BUCKET/PREFIX */
	char *bucket;          /* set at open, read-only after */
	char *prefix;          /* set at open, read-only after: "" or "PREFIX/" */
	char *home;            /* set at open, read-only after: the local home's path */
	int home_fd;           /* set at open, read-only after: the local home, open
	                          (invariant 5: its subdirectories made again there) */
	uint64_t cache_limit;  /* set at open, read-only after: packs/ bytes kept */
	int writer;            /* set at open, read-only after */
	int creating;          /* set at open, read-only after: init (no CURRENT yet) */
	pthread_mutex_t mu;
	uint64_t cached;       /* guarded by mu: bytes in packs/ (counted at open,
	                          plus what was fetched or written since) */
	ulp_remote_usage usage; /* guarded by mu: the bucket's figures as last listed */
	int64_t usage_ms;      /* guarded by mu: monotonic time of that listing (0: none) */
};

/* 1 where s names an archive in an object store ("s3://..."). */
int ulp_remote_is_url(const char *s);
/* Parses url, loads the credentials (s3.h), and makes the local home (its
 * path in *dir, malloc'ed). */
int ulp_remote_open(const char *url, const ulp_archive_opts *o, int writer, ulp_remote **out, char **dir,
                    ulp_err *err);
void ulp_remote_close(ulp_remote *rm);
/* Before init: the bucket made where missing; EXIST where an archive is there. */
int ulp_remote_init_check(ulp_remote *rm, ulp_err *err);
/* The local home a handle of url would use (as given, its links not
 * resolved): CACHE/s3/BUCKET-HASH/writer or reader (invariant 6). */
int ulp_remote_local_dir(const char *url, const char *cache_dir, int writer, char *out, size_t cap, ulp_err *err);

/* Objects, named relative to the prefix ("packs/x.pack"); errors through
 * the archive's message. */
int ulp_remote_get_small(ulp_archive *a, const char *rel, char *buf, size_t cap, size_t *len,
                         char etag[ULP_S3_ETAG_MAX]);
/* The object rel into the local file path, whole (size 0: asked first),
 * through a temporary and a rename; ranges fetched in parallel. want: the
 * size it must have (0: any); an object of another size is refused
 * (CORRUPT), nothing fetched. */
int ulp_remote_fetch(ulp_archive *a, const char *rel, const char *path, uint64_t size, uint64_t want);
/* The len bytes of fd as object rel; cond: only where rel does not exist
 * (EXIST otherwise). */
int ulp_remote_put_fd(ulp_archive *a, const char *rel, int fd, uint64_t len, int cond);
int ulp_remote_delete(ulp_archive *a, const char *rel);
int ulp_remote_list(ulp_archive *a, const char *rel_prefix, int (*cb)(void *arg, const char *rel, uint64_t size),
                    void *arg);

/* Lists every object under the prefix into *u (and rm->usage), calling cb
 * (may be NULL) with each pack's name (packs/ off) and size; a non-zero
 * return of cb stops the walk and is returned. */
int ulp_remote_usage_list(ulp_archive *a, ulp_remote_usage *u, int (*cb)(void *arg, const char *name, uint64_t size),
                          void *arg);
/* The figures of the last listing if it is at most max_age_ms old: 1 and
 * *u, else 0 (*u: the last ones, or zeros). */
int ulp_remote_usage_cached(ulp_remote *rm, int64_t max_age_ms, ulp_remote_usage *u);

/* backend_s3.c: the pack store's backend over the bucket, with the local
 * pack cache packs/ (bounded by rm->cache_limit, LRU by mtime). */
struct ulp_backend;
int ulp_backend_s3_open(ulp_archive *a, const char *root, struct ulp_backend **out);

#endif
