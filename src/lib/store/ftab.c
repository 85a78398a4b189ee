/* SPDX-License-Identifier: MIT */
/*
 * ftab.c - the file table (issue 38): the index's entries, their extents,
 * and the blobs and packs of every chain, in memory, so that a mount's
 * lookups and opens run no SQL and read no page of the index (a cold open
 * read the index's pages from disk, one query after the other). Loaded at
 * archive open when ulp_archive_opts.file_table asks (ulpackfs), in one read
 * transaction (ulp_index_scan); loaded again by its own thread, once the
 * index has been quiet for QUIET_MS, after anything made it stale. Meanwhile
 * lookups and opens ask the index, as without a table.
 *
 * Invariants:
 *  1. A table never serves a state of the index older than the one a
 *     lookup would see. A table records a->index_seq as it was before its
 *     scan began, and the identity of the index's files (ulpack.db and its
 *     -wal: device, inode, size, mtime); it is served only while both are
 *     unchanged. index_seq moves after every commit of this process (db.c's
 *     WAL hook runs once the commit is in the log, so a scan that began
 *     after the move sees it) and for every new generation a reader follows
 *     (ulp_db_set_follow); another process's commit changes the -wal file's
 *     size or mtime. (Two commits of another process within one tick of the
 *     file system's clock that leave the -wal the same size are the one case
 *     the files' identity misses: read.c invariant 6 covers it, a chain
 *     whose blob is gone drops the table and asks the index.)
 *  2. A table is immutable once built; holders (ulp_ftab_get) keep it alive
 *     (refs, guarded by h->mu) after a newer one replaced it.
 *  3. Lookups never wait for a load: a stale or missing table sends them to
 *     the index, and only the table's thread (or the open) loads one. So
 *     does a lookup inside a transaction of its thread (rename, remove:
 *     what they check must be what they change).
 *  5. A table is only read, and never in a transaction: what a writer
 *     checks inside its transaction (rename, remove) is the index's.
 *  4. Every extent names a blob of the table, every ref a blob or none
 *     (NOREF: an anchor, or a ref the index lacks, which the read reports),
 *     every blob a pack of the table or NOPACK (a pack row missing: the
 *     open asks the index for it); a chain is followed at most ULP_MAX_WALK
 *     links (a ref cycle in a damaged index ends there).
 *
 * Measured (issue 38, 2 loaded cores): an index of 1,000 steps x 300
 * tensors (300,000 blobs, 113 MB) loads in 0.9 s (about 0.25 s of CPU; 1.7
 * to 2 s with the page cache dropped) and holds 33.5 MB, headers shared
 * (65 MB with a copy each); 16 stat + open of its deepest files then take
 * 17-45 ms, against 0.6-1 s through the index. A 16-step run of 6.6 MB
 * files: 71 KB, loaded in 6-13 ms at the mount.
 */
#include "arch_int.h"
#include "store/ftab.h"
#include "store/shared.h"
#include "store/pack.h"
#include "store/db.h"
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define NOREF UINT32_MAX
#define NOPACK UINT32_MAX
#define ULP_MAX_WALK 4096
#define QUIET_MS 1000 /* the index quiet this long before the thread loads again */

typedef struct fblob {
	uint8_t content[ULP_SHA256_LEN];
	uint32_t ref;        /* blob index, or NOREF */
	uint32_t pack;       /* pack index, or NOPACK */
	uint64_t offset, stored;
	int64_t id;          /* the row's id (extents name it) */
} fblob;

typedef struct fpack {
	int64_t id;
	uint64_t size;
	char *name;
} fpack;

typedef struct fext {
	uint64_t offset, length;
	uint32_t blob;
} fext;

typedef struct fent {
	char *path;
	int64_t id;
	ulp_stat st;
	uint8_t *header;     /* as the index holds it (kind 2: compressed), or NULL;
	                        shared by the entries of the same header (the steps
	                        of a run), freed by its owner */
	int header_owner;
	size_t header_len;
	uint8_t header_sha[ULP_SHA256_LEN];
	int has_sha;
	size_t ext0, n_ext;  /* its extents: ext[ext0 .. ext0 + n_ext) */
} fent;

/* index files' identity (invariant 1) */
typedef struct fid {
	dev_t dev[2];
	ino_t ino[2];
	off_t size[2];
	struct timespec mtime[2];
} fid;

struct ulp_ftab {
	uint64_t seq;        /* a->index_seq before the scan (invariant 1) */
	fid files;
	int check_files;     /* a local index another process may write */
	fpack *packs;
	size_t n_packs, cap_packs;
	fblob *blobs;
	size_t n_blobs, cap_blobs;
	fent *ents;
	size_t n_ents, cap_ents;
	fext *ext;
	size_t n_ext, cap_ext;
	uint32_t *by_path;   /* open addressing: entry index + 1, 0 empty */
	uint32_t *by_content; /* the same for blobs */
	size_t mask_path, mask_content;
	uint64_t bytes;      /* what it holds, roughly */
	unsigned refs;       /* guarded by h->mu (invariant 2) */
	int err;             /* a scan callback's error */
};

typedef struct ulp_ftabh {
	pthread_mutex_t mu;  /* guards cur, refs of every table, stop, kick */
	pthread_cond_t cv;   /* the thread waits here; so does ulp_ftab_wait */
	ulp_ftab *cur;       /* the newest table, or NULL */
	pthread_mutex_t load_mu; /* one load at a time */
	pthread_t th;
	int th_on, stop, kick;
} ulp_ftabh;

/* ---- building ------------------------------------------------------------ */

static void ftab_free(ulp_ftab *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->n_packs; i++)
		free(t->packs[i].name);
	for (size_t i = 0; i < t->n_ents; i++) {
		free(t->ents[i].path);
		if (t->ents[i].header_owner)
			free(t->ents[i].header);
	}
	free(t->packs);
	free(t->blobs);
	free(t->ents);
	free(t->ext);
	free(t->by_path);
	free(t->by_content);
	free(t);
}

/* a load's state: the refs' contents are resolved to blob indices once
 * every blob is in (kept here for the load only: 33 bytes a blob) */
typedef struct loadctx {
	ulp_ftab *t;
	uint8_t (*refs)[ULP_SHA256_LEN]; /* per blob: its ref's content */
	uint8_t *has_ref;
	size_t cap_refs, cap_has;
	uint32_t *hdrs;      /* open addressing: entry index + 1 of each distinct header */
	size_t hdr_mask, n_hdrs;
} loadctx;

static uint64_t content_hash(const uint8_t *sha);

/* An entry of the same header loaded before, or NULL (the steps of a run
 * share one: 1,000 steps of 300 tensors held 31 MB of copies of it). */
static fent *same_header(loadctx *c, const uint8_t *h, size_t hl, const uint8_t *sha)
{
	if (!c->hdrs)
		return NULL;
	for (size_t s = (size_t)content_hash(sha) & c->hdr_mask; c->hdrs[s]; s = (s + 1) & c->hdr_mask) {
		fent *e = &c->t->ents[c->hdrs[s] - 1];
		if (e->header_len == hl && !memcmp(e->header_sha, sha, ULP_SHA256_LEN) && !memcmp(e->header, h, hl))
			return e;
	}
	return NULL;
}

/* Notes entry i's header (a hint: without room, no sharing). */
static void note_header(loadctx *c, size_t i)
{
	if (c->n_hdrs * 2 >= c->hdr_mask) { /* grows at half full */
		size_t cap = c->hdrs ? (c->hdr_mask + 1) * 2 : 64;
		uint32_t *n = calloc(cap, sizeof(*n));
		if (!n)
			return;
		for (size_t j = 0; c->hdrs && j <= c->hdr_mask; j++)
			if (c->hdrs[j]) {
				size_t s = (size_t)content_hash(c->t->ents[c->hdrs[j] - 1].header_sha) & (cap - 1);
				while (n[s])
					s = (s + 1) & (cap - 1);
				n[s] = c->hdrs[j];
			}
		free(c->hdrs);
		c->hdrs = n;
		c->hdr_mask = cap - 1;
	}
	size_t s = (size_t)content_hash(c->t->ents[i].header_sha) & c->hdr_mask;
	while (c->hdrs[s])
		s = (s + 1) & c->hdr_mask;
	c->hdrs[s] = (uint32_t)i + 1;
	c->n_hdrs++;
}

/* The arrays at their final sizes at once (no copies as they grow). */
static int presize(void *arg, uint64_t packs, uint64_t blobs, uint64_t entries, uint64_t extents)
{
	loadctx *c = arg;
	ulp_ftab *t = c->t;
	if (blobs >= NOREF || entries >= UINT32_MAX)
		return -ULP_E_NOMEM;
	t->packs = calloc(packs + 1, sizeof(*t->packs));
	t->blobs = malloc((blobs + 1) * sizeof(*t->blobs));
	t->ents = malloc((entries + 1) * sizeof(*t->ents));
	t->ext = malloc((extents + 1) * sizeof(*t->ext));
	c->refs = malloc((blobs + 1) * sizeof(*c->refs));
	c->has_ref = malloc(blobs + 1);
	if (!t->packs || !t->blobs || !t->ents || !t->ext || !c->refs || !c->has_ref)
		return -ULP_E_NOMEM; /* (freed with t and c) */
	t->cap_packs = packs + 1;
	t->cap_blobs = c->cap_refs = c->cap_has = blobs + 1;
	t->cap_ents = entries + 1;
	t->cap_ext = extents + 1;
	return 0;
}

static int add_pack(void *arg, int64_t id, const char *name, uint64_t size)
{
	ulp_ftab *t = ((loadctx *)arg)->t;
	if (ulp_grow(&t->packs, &t->cap_packs, t->n_packs, sizeof(*t->packs)) < 0 || !(name = strdup(name)))
		return -ULP_E_NOMEM;
	t->packs[t->n_packs++] = (fpack){id, size, (char *)name};
	t->bytes += sizeof(fpack) + strlen(name) + 1;
	return 0;
}

/* index of row id in a table sorted by id (packs, blobs, entries), or -1 */
#define FIND_ID(arr, n, want, out)                                                                              \
	do {                                                                                                        \
		size_t lo_ = 0, hi_ = (n);                                                                              \
		(out) = -1;                                                                                             \
		while (lo_ < hi_) {                                                                                     \
			size_t mid_ = lo_ + (hi_ - lo_) / 2;                                                                \
			if ((arr)[mid_].id == (want)) {                                                                     \
				(out) = (int64_t)mid_;                                                                          \
				break;                                                                                          \
			}                                                                                                   \
			if ((arr)[mid_].id < (want))                                                                        \
				lo_ = mid_ + 1;                                                                                 \
			else                                                                                                \
				hi_ = mid_;                                                                                     \
		}                                                                                                       \
	} while (0)


static int add_blob(void *arg, int64_t id, const uint8_t *content, const uint8_t *ref, int64_t pack,
                    uint64_t offset, uint64_t stored)
{
	loadctx *c = arg;
	ulp_ftab *t = c->t;
	if (ulp_grow(&t->blobs, &t->cap_blobs, t->n_blobs, sizeof(*t->blobs)) < 0 ||
	    ulp_grow(&c->refs, &c->cap_refs, t->n_blobs, sizeof(*c->refs)) < 0 ||
	    ulp_grow(&c->has_ref, &c->cap_has, t->n_blobs, 1) < 0)
		return -ULP_E_NOMEM;
	int64_t pi;
	FIND_ID(t->packs, t->n_packs, pack, pi);
	fblob *b = &t->blobs[t->n_blobs];
	memcpy(b->content, content, ULP_SHA256_LEN);
	b->ref = NOREF;
	b->pack = pi < 0 ? NOPACK : (uint32_t)pi;
	b->offset = offset;
	b->stored = stored;
	b->id = id;
	c->has_ref[t->n_blobs] = ref != NULL;
	if (ref)
		memcpy(c->refs[t->n_blobs], ref, ULP_SHA256_LEN);
	t->n_blobs++;
	t->bytes += sizeof(fblob) + sizeof(uint32_t) * 2;
	return t->n_blobs >= NOREF ? -ULP_E_NOMEM : 0;
}

static int add_entry(void *arg, int64_t id, const char *path, const ulp_stat *st, const uint8_t *header, size_t hl,
                     const uint8_t *header_sha)
{
	loadctx *c = arg;
	ulp_ftab *t = c->t;
	if (ulp_grow(&t->ents, &t->cap_ents, t->n_ents, sizeof(*t->ents)) < 0)
		return -ULP_E_NOMEM;
	fent *e = &t->ents[t->n_ents];
	memset(e, 0, sizeof(*e));
	e->id = id;
	e->st = *st;
	e->path = strdup(path);
	if (!e->path)
		return -ULP_E_NOMEM;
	const fent *same = hl && header_sha ? same_header(c, header, hl, header_sha) : NULL;
	if (same) {
		e->header = same->header;
	} else if (hl) {
		if (!(e->header = malloc(hl))) {
			free(e->path);
			return -ULP_E_NOMEM;
		}
		memcpy(e->header, header, hl);
		e->header_owner = 1;
		t->bytes += hl;
	}
	e->header_len = hl;
	if ((e->has_sha = header_sha != NULL))
		memcpy(e->header_sha, header_sha, ULP_SHA256_LEN);
	t->n_ents++;
	if (e->header_owner && e->has_sha)
		note_header(c, t->n_ents - 1);
	t->bytes += sizeof(fent) + strlen(path) + 1 + sizeof(uint32_t) * 2;
	return t->n_ents >= UINT32_MAX ? -ULP_E_NOMEM : 0;
}

static int add_extent(void *arg, int64_t file, uint64_t offset, uint64_t length, int64_t blob)
{
	ulp_ftab *t = ((loadctx *)arg)->t;
	int64_t ei, bi;
	FIND_ID(t->ents, t->n_ents, file, ei);
	FIND_ID(t->blobs, t->n_blobs, blob, bi);
	if (ei < 0)
		return 0; /* an extent of no entry: the index's checker says so */
	if (bi < 0) { /* a blob row missing: the file cannot be served from here */
		t->ents[ei].n_ext = SIZE_MAX;
		return 0;
	}
	fent *e = &t->ents[ei];
	if (e->n_ext == SIZE_MAX)
		return 0;
	if (e->n_ext == 0)
		e->ext0 = t->n_ext;
	else if (e->ext0 + e->n_ext != t->n_ext) { /* extents come in (file, offset) order */
		e->n_ext = SIZE_MAX;
		return 0;
	}
	if (ulp_grow(&t->ext, &t->cap_ext, t->n_ext, sizeof(*t->ext)) < 0)
		return -ULP_E_NOMEM;
	t->ext[t->n_ext++] = (fext){offset, length, (uint32_t)bi};
	e->n_ext++;
	t->bytes += sizeof(fext);
	return 0;
}

static uint64_t path_hash(const char *p)
{
	return ulp_xxh64(p, strlen(p));
}

static uint64_t content_hash(const uint8_t *sha)
{
	uint64_t h;
	memcpy(&h, sha, sizeof(h)); /* a SHA-256 is spread already */
	return h;
}

static int build_hashes(ulp_ftab *t, loadctx *c)
{
	size_t np = 16, nc = 16;
	while (np < t->n_ents * 2)
		np *= 2;
	while (nc < t->n_blobs * 2)
		nc *= 2;
	t->by_path = calloc(np, sizeof(uint32_t));
	t->by_content = calloc(nc, sizeof(uint32_t));
	if (!t->by_path || !t->by_content)
		return -ULP_E_NOMEM;
	t->mask_path = np - 1;
	t->mask_content = nc - 1;
	for (size_t i = 0; i < t->n_ents; i++) {
		size_t s = (size_t)path_hash(t->ents[i].path) & t->mask_path;
		while (t->by_path[s])
			s = (s + 1) & t->mask_path;
		t->by_path[s] = (uint32_t)i + 1;
	}
	for (size_t i = 0; i < t->n_blobs; i++) {
		size_t s = (size_t)content_hash(t->blobs[i].content) & t->mask_content;
		while (t->by_content[s])
			s = (s + 1) & t->mask_content;
		t->by_content[s] = (uint32_t)i + 1;
	}
	for (size_t i = 0; i < t->n_blobs; i++) { /* invariant 4 */
		if (!c->has_ref[i])
			continue;
		for (size_t s = (size_t)content_hash(c->refs[i]) & t->mask_content; t->by_content[s];
		     s = (s + 1) & t->mask_content)
			if (!memcmp(t->blobs[t->by_content[s] - 1].content, c->refs[i], ULP_SHA256_LEN)) {
				t->blobs[i].ref = t->by_content[s] - 1;
				break;
			}
	}
	t->bytes += (np + nc) * sizeof(uint32_t);
	return 0;
}

static const fent *find_ent(const ulp_ftab *t, const char *path)
{
	for (size_t s = (size_t)path_hash(path) & t->mask_path; t->by_path[s]; s = (s + 1) & t->mask_path)
		if (!strcmp(t->ents[t->by_path[s] - 1].path, path))
			return &t->ents[t->by_path[s] - 1];
	return NULL;
}

static const fblob *find_blob(const ulp_ftab *t, const uint8_t *sha)
{
	for (size_t s = (size_t)content_hash(sha) & t->mask_content; t->by_content[s]; s = (s + 1) & t->mask_content)
		if (!memcmp(t->blobs[t->by_content[s] - 1].content, sha, ULP_SHA256_LEN))
			return &t->blobs[t->by_content[s] - 1];
	return NULL;
}

/* The identity of the index's files (invariant 1). */
static void index_files(ulp_archive *a, fid *out)
{
	char p[4200];
	memset(out, 0, sizeof(*out));
	ulp_db_live_path(a, p, sizeof(p) - 8);
	for (int i = 0; i < 2; i++) {
		struct stat sb;
		if (i == 1)
			strcat(p, "-wal");
		if (stat(p, &sb) == 0) {
			out->dev[i] = sb.st_dev;
			out->ino[i] = sb.st_ino;
			out->size[i] = sb.st_size;
			out->mtime[i] = sb.st_mtim;
		}
	}
}

static int same_files(const fid *x, const fid *y)
{
	for (int i = 0; i < 2; i++)
		if (x->dev[i] != y->dev[i] || x->ino[i] != y->ino[i] || x->size[i] != y->size[i] ||
		    x->mtime[i].tv_sec != y->mtime[i].tv_sec || x->mtime[i].tv_nsec != y->mtime[i].tv_nsec)
			return 0;
	return 1;
}

/* A table of the index as it is now, or NULL (a hint: the index answers). */
static ulp_ftab *load(ulp_archive *a)
{
	ulp_ftab *t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->seq = __atomic_load_n(&a->index_seq, __ATOMIC_ACQUIRE); /* before the scan: invariant 1 */
	t->check_files = !a->follow && !a->db_uri;
	if (t->check_files)
		index_files(a, &t->files);
	ulp_gen_follow(a); /* a following reader: this thread's connection on the newest */
	loadctx c = {.t = t};
	static const ulp_index_scan_cbs cbs = {presize, add_pack, add_blob, add_entry, add_extent};
	int rc = ulp_index_scan(a, &cbs, &c);
	if (rc == 0)
		rc = build_hashes(t, &c);
	free(c.refs);
	free(c.has_ref);
	free(c.hdrs);
	if (rc < 0) {
		ftab_free(t);
		return NULL;
	}
	return t;
}

/* ---- the holder and its thread ------------------------------------------- */

static int fresh(ulp_archive *a, const ulp_ftab *t)
{
	if (!t || t->seq != __atomic_load_n(&a->index_seq, __ATOMIC_ACQUIRE))
		return 0;
	if (!t->check_files)
		return 1;
	fid now;
	index_files(a, &now);
	return same_files(&now, &t->files);
}

/* Loads a table and makes it the current one; 0 or NOMEM (a failed scan). */
static int reload(ulp_archive *a)
{
	ulp_ftabh *h = a->fth;
	pthread_mutex_lock(&h->load_mu);
	ulp_ftab *t = load(a), *old = NULL;
	pthread_mutex_lock(&h->mu);
	if (t) {
		old = h->cur;
		h->cur = t;
		t->refs = 1; /* the holder's */
		if (old && --old->refs)
			old = NULL; /* still held: its last ulp_ftab_put frees it */
	}
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	pthread_mutex_unlock(&h->load_mu);
	ftab_free(old);
	return t ? 0 : -ULP_E_NOMEM;
}

static void *ftab_main(void *arg)
{
	ulp_archive *a = arg;
	ulp_ftabh *h = a->fth;
	ulp_thread_set_nice(10); /* behind the reads it serves */
	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->kick && !h->stop)
			pthread_cond_wait(&h->cv, &h->mu);
		if (h->stop)
			break;
		pthread_mutex_unlock(&h->mu);
		/* the index quiet for QUIET_MS first: a writer's commits one after
		 * the other would have it load for each */
		int64_t last, now;
		while ((now = ulp_mono_ms()) - (last = __atomic_load_n(&a->index_commit_ms, __ATOMIC_RELAXED)) < QUIET_MS &&
		       !__atomic_load_n(&h->stop, __ATOMIC_RELAXED)) {
			struct timespec ts = {0, (long)(QUIET_MS - (now - last)) * 1000000L};
			nanosleep(&ts, NULL);
		}
		pthread_mutex_lock(&h->mu);
		h->kick = 0;
		int stale = !h->stop && !fresh(a, h->cur);
		pthread_mutex_unlock(&h->mu);
		if (stale)
			reload(a);
		pthread_mutex_lock(&h->mu);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/* The packs mapped now, at the mount (their directory entries and inodes
 * read, their first pages asked for in the background: pack.c invariant 5):
 * a cold open's first pack mapping otherwise waited for the disk (3.5 ms
 * here for the directory block and the inode table's), and each mapping
 * cost the open four system calls. Local packs only, the first WARM_PACKS
 * of them; a pack that does not map is left for the read to report. */
#define WARM_PACKS 4096

static void warm_packs(ulp_archive *a)
{
	ulp_ftabh *h = a->fth;
	if (a->rm)
		return;
	pthread_mutex_lock(&h->mu);
	ulp_ftab *t = h->cur;
	if (t)
		t->refs++;
	pthread_mutex_unlock(&h->mu);
	for (size_t i = 0; t && i < t->n_packs && i < WARM_PACKS; i++) {
		ulp_packref pk = {t->packs[i].id, t->packs[i].name, t->packs[i].size};
		size_t slot;
		if (ulp_pack_pin_known(a, &pk, &slot) == 0) /* a hint */
			ulp_pack_unpin(a, slot);
	}
	ulp_ftab_put(a, t);
}

int ulp_ftab_open(ulp_archive *a)
{
	if (!a->opts.file_table || a->fth)
		return 0;
	ulp_ftabh *h = calloc(1, sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	pthread_mutex_init(&h->mu, NULL);
	pthread_mutex_init(&h->load_mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	a->fth = h;
	reload(a); /* a hint: without it the index answers */
	warm_packs(a);
	h->th_on = pthread_create(&h->th, NULL, ftab_main, a) == 0;
	return 0;
}

void ulp_ftab_close(ulp_archive *a)
{
	ulp_ftabh *h = a->fth;
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	__atomic_store_n(&h->stop, 1, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	if (h->th_on)
		pthread_join(h->th, NULL);
	assert(!h->cur || h->cur->refs == 1); /* no holder outlives the archive */
	ftab_free(h->cur);
	pthread_mutex_destroy(&h->mu);
	pthread_mutex_destroy(&h->load_mu);
	pthread_cond_destroy(&h->cv);
	free(h);
	a->fth = NULL;
}

ulp_ftab *ulp_ftab_get(ulp_archive *a)
{
	ulp_ftabh *h = a->fth;
	if (!h || ulp_db_in_tx(a)) /* a transaction sees its own writes: the index answers */
		return NULL;
	pthread_mutex_lock(&h->mu);
	ulp_ftab *t = h->cur;
	if (t && fresh(a, t))
		t->refs++;
	else {
		t = NULL;
		h->kick = 1; /* invariant 3: its thread loads, this lookup asks the index */
		pthread_cond_broadcast(&h->cv);
	}
	pthread_mutex_unlock(&h->mu);
	return t;
}

void ulp_ftab_put(ulp_archive *a, ulp_ftab *t)
{
	if (!t)
		return;
	ulp_ftabh *h = a->fth;
	pthread_mutex_lock(&h->mu);
	int last = --t->refs == 0;
	pthread_mutex_unlock(&h->mu);
	if (last)
		ftab_free(t);
}

void ulp_ftab_drop(ulp_archive *a)
{
	ulp_ftabh *h = a->fth;
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	ulp_ftab *old = h->cur;
	h->cur = NULL;
	if (old && --old->refs)
		old = NULL;
	h->kick = 1;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	ftab_free(old);
}

int ulp_ftab_wait(ulp_archive *a, unsigned ms)
{
	ulp_ftabh *h = a->fth;
	if (!h)
		return 0;
	int64_t end = ulp_mono_ms() + ms;
	for (;;) {
		ulp_ftab *t = ulp_ftab_get(a);
		ulp_ftab_put(a, t);
		if (t)
			return 1;
		if (ulp_mono_ms() >= end)
			return 0;
		struct timespec ts = {0, 5 * 1000000L};
		nanosleep(&ts, NULL);
	}
}

void ulp_ftab_size(ulp_archive *a, uint64_t *bytes, size_t *entries, size_t *blobs)
{
	*bytes = 0;
	*entries = *blobs = 0;
	ulp_ftabh *h = a->fth;
	if (!h)
		return;
	pthread_mutex_lock(&h->mu);
	if (h->cur) {
		*bytes = h->cur->bytes + sizeof(*h->cur);
		*entries = h->cur->n_ents;
		*blobs = h->cur->n_blobs;
	}
	pthread_mutex_unlock(&h->mu);
}

/* ---- lookups ---------------------------------------------------------------- */

int ulp_ftab_stat(ulp_archive *a, const ulp_ftab *t, const char *path, ulp_stat *st)
{
	const fent *e = find_ent(t, path);
	if (!e)
		return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such file in archive %s", path, a->dir);
	*st = e->st;
	return 0;
}

int ulp_ftab_blob(const ulp_ftab *t, const uint8_t sha[ULP_SHA256_LEN], ulp_packref *pk, uint64_t *offset,
                  uint64_t *stored)
{
	const fblob *b = find_blob(t, sha);
	if (!b || b->pack == NOPACK)
		return -ULP_E_NOENT;
	const fpack *p = &t->packs[b->pack];
	*pk = (ulp_packref){p->id, p->name, p->size};
	*offset = b->offset;
	*stored = b->stored;
	return 0;
}

static int cmp_u32(const void *x, const void *y)
{
	uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
	return a < b ? -1 : a > b;
}

int ulp_ftab_file(ulp_archive *a, const ulp_ftab *t, const char *path, ulp_stat *st, uint8_t **header,
                  size_t *header_len, ulp_extent **ext, size_t *n_ext,
                  int (*cb)(void *arg, const uint8_t *content, const ulp_packref *pk, uint64_t offset,
                            uint64_t stored),
                  void *arg)
{
	const fent *e = find_ent(t, path);
	if (!e)
		return ulp_arch_err(a, -ULP_E_NOENT, "%s: no such file in archive %s", path, a->dir);
	if (e->n_ext == SIZE_MAX)
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: bad extents in the index", path);
	uint8_t *h = NULL;
	if (e->header_len) { /* index.c invariant 5, as ulp_index_file */
		uint8_t sha[ULP_SHA256_LEN];
		ulp_sha256(e->header, e->header_len, sha);
		if (a->schema >= 2 && (!e->has_sha || memcmp(e->header_sha, sha, ULP_SHA256_LEN) != 0))
			return ulp_arch_err(a, -ULP_E_CHECKSUM,
			                    "%s: its safetensors header in %s/ulpack.db does not match its sha256", path, a->dir);
		if (!(h = malloc(e->header_len)))
			return -ULP_E_NOMEM;
		memcpy(h, e->header, e->header_len);
	}
	ulp_extent *x = e->n_ext ? malloc(e->n_ext * sizeof(*x)) : NULL;
	uint32_t *chain = NULL;
	size_t nc = 0, cap = 0;
	int rc = e->n_ext && !x ? -ULP_E_NOMEM : 0;
	for (size_t i = 0; rc == 0 && i < e->n_ext; i++) {
		const fext *fx = &t->ext[e->ext0 + i];
		x[i].offset = fx->offset;
		x[i].length = fx->length;
		memcpy(x[i].content, t->blobs[fx->blob].content, ULP_SHA256_LEN);
		uint32_t b = fx->blob;
		for (unsigned d = 0; rc == 0 && b != NOREF && d < ULP_MAX_WALK; d++) { /* invariant 4 */
			if ((rc = ulp_grow(&chain, &cap, nc, sizeof(*chain))) == 0)
				chain[nc++] = b;
			b = t->blobs[b].ref;
		}
	}
	if (rc == 0 && nc > 1) { /* each blob once, as the index's UNION gives them */
		qsort(chain, nc, sizeof(*chain), cmp_u32);
		size_t u = 1;
		for (size_t i = 1; i < nc; i++)
			if (chain[i] != chain[u - 1])
				chain[u++] = chain[i];
		nc = u;
	}
	for (size_t i = 0; rc == 0 && i < nc; i++) {
		const fblob *b = &t->blobs[chain[i]];
		if (b->pack == NOPACK)
			continue; /* the read asks the index, and says why */
		const fpack *p = &t->packs[b->pack];
		ulp_packref pk = {p->id, p->name, p->size};
		rc = cb(arg, b->content, &pk, b->offset, b->stored);
	}
	free(chain);
	if (rc < 0) {
		free(h);
		free(x);
		return rc;
	}
	*st = e->st;
	*header = h;
	*header_len = e->header_len;
	*ext = x;
	*n_ext = e->n_ext;
	return 0;
}
