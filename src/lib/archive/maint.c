/* SPDX-License-Identifier: MIT */
/*
 * maint.c - keeping an archive honest: verify (decode everything, check
 * every sha256, report index rows that no directory reaches) and gc (drop what nothing reaches, rewrite or remove packs).
 *
 * gc invariants:
 *  1. A blob is kept while a file's extent or another kept blob's reference
 *     names its content (a deleted file never breaks another's chain).
 *  2. A rewritten blob is decoded and checked against its content digest
 *     before the new pack is committed; the index moves to the new pack in
 *     one transaction; the old pack file is removed only after it commits.
 *  3. Pack files the index does not name (left by a crash between the pack
 *     rename and the index commit) and temporary files of dead processes are
 *     removed while gc holds the index's write lock, when no import can be
 *     between those two steps.
 *  4. Reclaiming (ulp_archive_reclaim: gc without re-basing, which a mount
 *     runs by itself when idle) is gc in bounded steps: one transaction
 *     drops the rows nothing reaches and the packs left with no blob, then
 *     each pack whose live share is under the threshold is rewritten in a
 *     transaction of its own, which leaves the old pack with no blob for
 *     the next such drop. A pack file is removed after the commit that
 *     drops its row, with write_mu still held, so that no re-coding or
 *     rewrite of this process can commit a pack of that name (the same
 *     bytes, which ulp_index_pack_add would name again) in between; a
 *     crash or an error in between leaves a file the index does not name,
 *     which the next full pass removes (invariant 3).
 *  5. A removed pack stays readable to whoever mapped it (pack.c invariant
 *     2: open files pin the packs of their chains), and its disk space
 *     comes back once nobody does (ulp_archive_trim).
 *  7. In a shared archive (store/shared.h) the readers of other hosts read
 *     the packs their generation names, which this process cannot see: a
 *     dropped pack's file is not removed with its row but recorded in
 *     pack_grace (index.c invariant 7) with the generation last published,
 *     the last one that names it; it is removed (ulp_archive_grace_sweep)
 *     once the grace has passed and every generation left is newer (gen.c
 *     invariant 4 retires them), and the sweep of unnamed files (invariant
 *     3) leaves it alone meanwhile.
 *
 *  8. Nothing a crash leaves waits for new writes: the pass at close
 *     sweeps it, and a session asks at its start what is due
 *     (ulp_archive_tidy_due: queued re-codes, orphans, dead or sparse packs,
 *     files invariant 3 removes) and does it at its first idle pass
 *     (session.c invariant 13).
 *
 * verify invariant:
 *  6. Every file under the prefix is decoded and its sha256 compared, in
 *     whatever order the threads take them; damage is reported in the
 *     index's order (step order), after all are checked.
 */
#include "store/shared.h"
#include "store/remote.h"
#include "store/db.h"
#include "archive/cache.h"
#include "store/index.h"
#include "store/pack.h"
#include "archive/read.h"
#include "archive/writer.h"
#include <dirent.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define VERIFY_BLOCK ((size_t)8 << 20)

/* verify: the files under a prefix, listed first, then checked (invariant 6) */
typedef struct vfile {
	char *path;
	uint64_t size;
	uint8_t sha[ULP_SHA256_LEN];
	int rc;    /* 0, or why it failed (why: the message) */
	char *why; /* malloc'd, or NULL */
} vfile;

typedef struct vctx {
	ulp_archive *a;
	vfile *f;
	size_t n, cap;
	uint64_t total, largest;
	ulp_progress_fn progress; /* called under mu, in order of done */
	void *parg;
	pthread_mutex_t mu;
	uint64_t done;            /* under mu */
} vctx;

/* n more bytes decoded and hashed (any thread) */
static void verify_advance(vctx *v, uint64_t n)
{
	if (!v || !v->progress)
		return;
	pthread_mutex_lock(&v->mu);
	v->done += n;
	v->progress(v->parg, v->done, v->total);
	pthread_mutex_unlock(&v->mu);
}

static int list_file(void *arg, const char *path, const ulp_stat *st)
{
	vctx *v = arg;
	ULP_TRY(ulp_grow(&v->f, &v->cap, v->n, sizeof(*v->f)));
	vfile *f = &v->f[v->n];
	memset(f, 0, sizeof(*f));
	if (!(f->path = strdup(path)))
		return -ULP_E_NOMEM;
	f->size = st->size;
	memcpy(f->sha, st->sha256, ULP_SHA256_LEN);
	v->n++;
	v->total += st->size;
	v->largest = ULP_MAX(v->largest, st->size);
	return 0;
}

typedef struct hashjob {
	EVP_MD_CTX *c;
	const uint8_t *p;
	size_t n;
} hashjob;

static void *hash_thread(void *arg)
{
	hashjob *h = arg;
	EVP_DigestUpdate(h->c, h->p, h->n);
	return NULL;
}

/* Decodes one file and compares its sha256. pipelined: the file's SHA-256 of
 * block k runs on its own thread while block k+1 decodes (on the pool), so
 * the hash is never a pass of its own. */
static int verify_file(ulp_archive *a, vfile *vf, int pipelined, vctx *v)
{
	ulp_file *f;
	uint8_t *buf[2] = {malloc(VERIFY_BLOCK), pipelined ? malloc(VERIFY_BLOCK) : NULL};
	EVP_MD_CTX *sha = EVP_MD_CTX_new();
	int rc = !buf[0] || (pipelined && !buf[1]) || !sha ? -ULP_E_NOMEM : 0;
	if (rc == 0)
		rc = ulp_file_open(a, vf->path, &f);
	if (rc == 0) {
		EVP_DigestInit_ex(sha, EVP_sha256(), NULL);
		uint64_t off = 0;
		pthread_t th;
		hashjob h = {sha, NULL, 0};
		int running = 0;
		for (unsigned k = 0; off < vf->size; k ^= pipelined) {
			int64_t n = ulp_file_pread(f, buf[k], VERIFY_BLOCK, off);
			if (running) /* block k-1, in the other buffer */
				pthread_join(th, NULL);
			running = 0;
			if (n <= 0) {
				rc = n < 0 ? (int)n : -ULP_E_IO;
				break;
			}
			h.p = buf[k];
			h.n = (size_t)n;
			if (pipelined && pthread_create(&th, NULL, hash_thread, &h) == 0)
				running = 1;
			else
				hash_thread(&h);
			off += (uint64_t)n;
			verify_advance(v, (uint64_t)n);
		}
		if (running)
			pthread_join(th, NULL);
		uint8_t d[32];
		unsigned int dl;
		EVP_DigestFinal_ex(sha, d, &dl);
		ulp_file_close(f);
		if (rc == 0 && memcmp(d, vf->sha, 32) != 0) {
			rc = -ULP_E_CHECKSUM;
			ulp_arch_err(a, rc, "%s: decoded bytes do not match the stored sha256", vf->path);
		}
	}
	EVP_MD_CTX_free(sha);
	free(buf[0]);
	free(buf[1]);
	vf->rc = rc;
	if (rc < 0 && !(vf->why = strdup(ulp_archive_errmsg(a))))
		vf->rc = -ULP_E_NOMEM;
	return 0;
}

static int verify_job(void *arg, size_t i)
{
	vctx *v = arg;
	return verify_file(v->a, &v->f[i], 0, v);
}

/*
 * Invariant 6. Many files, none dominant: one file a thread (each decodes on its thread);
 * otherwise one file at a time, its chunks decoded on the pool and its
 * SHA-256 on a thread beside them.
 */
int64_t ulp_archive_verify(ulp_archive *a, const char *prefix,
                           void (*bad)(void *arg, const char *path, const char *why), void *arg)
{
	return ulp_archive_verify_progress(a, prefix, bad, arg, NULL, NULL);
}

int64_t ulp_archive_verify_progress(ulp_archive *a, const char *prefix,
                                    void (*bad)(void *arg, const char *path, const char *why), void *arg,
                                    ulp_progress_fn progress, void *parg)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	vctx v = {.a = a, .progress = progress, .parg = parg};
	pthread_mutex_init(&v.mu, NULL);
	int rc = ulp_index_files(a, prefix, list_file, &v);
	int threads = ulp_pool_threads(a->pool);
	if (rc == 0) {
		if (progress)
			progress(parg, 0, v.total);
		if (threads > 1 && v.n >= (size_t)threads && v.largest <= v.total / 2)
			ulp_pool_run(a->pool, v.n, verify_job, &v);
		else
			for (size_t i = 0; i < v.n; i++)
				verify_file(a, &v.f[i], threads > 1, &v);
	}
	pthread_mutex_destroy(&v.mu);
	int64_t damaged = 0;
	for (size_t i = 0; rc == 0 && i < v.n; i++) {
		vfile *f = &v.f[i];
		if (f->rc == -ULP_E_NOMEM) /* not damage: verify itself fails */
			rc = ulp_arch_err(a, f->rc, "%s: out of memory while verifying it", f->path);
		else if (f->rc < 0) {
			damaged++;
			if (bad)
				bad(arg, f->path, f->why);
		}
	}
	for (size_t i = 0; i < v.n; i++) {
		free(v.f[i].path);
		free(v.f[i].why);
	}
	free(v.f);
	if (rc < 0)
		return rc;
	/* rows no directory reaches: nothing lists, exports or mounts them */
	rc = ulp_index_orphans(a, prefix, bad, arg);
	return rc < 0 ? rc : damaged + rc;
}

/* ---- gc ------------------------------------------------------------------ */

typedef struct packinfo {
	int64_t id;
	char name[80];
	char new_name[80];  /* the pack it was rewritten into, or "" */
	uint64_t size, live, blobs;
} packinfo;

typedef struct gctx {
	ulp_archive *a;
	packinfo *p;
	size_t n, cap;
} gctx;

static int collect_pack(void *arg, int64_t id, const char *name, uint64_t size, uint64_t live,
                        uint64_t blobs)
{
	gctx *g = arg;
	ULP_TRY(ulp_grow(&g->p, &g->cap, g->n, sizeof(*g->p)));
	packinfo *pi = &g->p[g->n++];
	pi->id = id;
	snprintf(pi->name, sizeof(pi->name), "%s", name);
	pi->new_name[0] = '\0';
	pi->size = size;
	pi->live = live;
	pi->blobs = blobs;
	return 0;
}

/* A blob of a pack being rewritten: checked in parallel (one pool job a
 * blob, its chunks nested jobs), appended to the new pack in the old
 * order by whichever thread finishes the next one, so the new pack's bytes
 * do not depend on the thread count. */
typedef struct moved {
	uint8_t content[32];
	uint64_t offset;     /* in the old pack, then in the new one */
	uint64_t stored;
	uint8_t blob_sha[32]; /* the blob's digest, for the pack's name */
	int rc, done;        /* done: under rctx.mu */
	char err[300];
} moved;

typedef struct rctx {
	ulp_archive *a;
	int64_t pack;
	ulp_pack_writer *w;
	moved *m;
	size_t n, cap;
	pthread_mutex_t mu;
	size_t appended;     /* under mu */
	int arc;             /* first error appending (under mu) */
	char aerr[300];
} rctx;

static int collect_blob(void *arg, const uint8_t *content, uint64_t offset, uint64_t stored)
{
	rctx *r = arg;
	ULP_TRY(ulp_grow(&r->m, &r->cap, r->n, sizeof(*r->m)));
	moved *m = &r->m[r->n++];
	memset(m, 0, sizeof(*m));
	memcpy(m->content, content, 32);
	m->offset = offset;
	m->stored = stored;
	return 0;
}

/* v2 content whose chunks hold whole leaves: its digest from the decoded
 * chunks (through the cache), chunk by chunk, without a copy of it whole */
typedef struct leafctx {
	ulp_archive *a;
	const uint8_t *content;
	size_t chunk;        /* bytes a chunk */
	uint8_t *leaves;
	int failed;          /* atomic: the first failing chunk reports */
	int rc;
	char err[300];
} leafctx;

static int job_chunk_leaves(void *arg, size_t k)
{
	leafctx *c = arg;
	ulp_centry *e;
	const uint8_t *d;
	size_t l;
	int rc = ulp_read_chunk(c->a, c->content, (uint32_t)k, &e, &d, &l, NULL);
	if (rc < 0) {
		if (!__atomic_exchange_n(&c->failed, 1, __ATOMIC_ACQ_REL)) {
			c->rc = rc;
			snprintf(c->err, sizeof(c->err), "%s", ulp_archive_errmsg(c->a));
		}
		return 0;
	}
	ulp_digest_leaves(d, l, c->leaves + k * (c->chunk / ULP_DIGEST_LEAF) * ULP_SHA256_LEN);
	ulp_cache_put(c->a->cache, e);
	return 0;
}

/* invariant 2: the content must decode to its digest before it moves */
static int check_blob(rctx *r, moved *m)
{
	const uint8_t *p;
	ULP_TRY(ulp_pack_blob(r->a, r->pack, m->offset, m->stored, &p));
	ulp_blob *b;
	char why[256];
	int rc = ulp_blob_open(p, (size_t)m->stored, &b, why, sizeof(why));
	if (rc < 0)
		return ulp_arch_err(r->a, rc, "gc: blob in pack %lld is damaged: %s", (long long)r->pack, why);
	const ulp_blob_info *in = ulp_blob_get_info(b);
	size_t raw = (size_t)in->raw_bytes, chunk = (size_t)in->chunk_elems * ulp_dtype_size(in->dtype);
	unsigned version = in->version;
	uint32_t nk = in->n_chunks;
	ulp_blob_close(b);
	uint8_t sha[32];
	if (version >= 2 && raw > 0 && chunk > 0 && chunk % ULP_DIGEST_LEAF == 0 && (uint64_t)nk * chunk >= raw) {
		leafctx c = {r->a, m->content, chunk, malloc(ulp_digest_n_leaves(raw) * ULP_SHA256_LEN), 0, 0, ""};
		if (!c.leaves)
			return -ULP_E_NOMEM;
		ulp_pool_run(r->a->pool, nk, job_chunk_leaves, &c);
		ulp_digest_root(c.leaves, raw, sha);
		free(c.leaves);
		if (c.failed) /* as ulp_read_content reports it: damage, or no memory, or I/O */
			return ulp_arch_err(r->a, c.rc, "%s", c.err);
	} else {
		uint8_t *buf = malloc(raw ? raw : 1);
		if (!buf)
			return -ULP_E_NOMEM;
		rc = ulp_read_content(r->a, m->content, buf, raw);
		/* the content's identity is the digest of its blob's format */
		if (rc == 0 && version == 1)
			ulp_sha256(buf, raw, sha);
		else if (rc == 0)
			rc = ulp_content_digest(r->a->pool, buf, raw, sha);
		free(buf);
		if (rc < 0)
			return rc;
	}
	if (memcmp(sha, m->content, 32) != 0)
		return ulp_arch_err(r->a, -ULP_E_CHECKSUM, "gc: a blob of pack %lld does not decode to its content",
		                    (long long)r->pack);
	return ulp_content_digest(r->a->pool, p, (size_t)m->stored, m->blob_sha);
}

static int rewrite_job(void *arg, size_t i)
{
	rctx *r = arg;
	moved *m = &r->m[i];
	m->rc = check_blob(r, m);
	if (m->rc < 0)
		snprintf(m->err, sizeof(m->err), "%s", ulp_archive_errmsg(r->a));
	pthread_mutex_lock(&r->mu);
	m->done = 1;
	while (r->appended < r->n && r->m[r->appended].done && r->arc == 0) {
		moved *x = &r->m[r->appended++];
		const uint8_t *p;
		if ((r->arc = x->rc) < 0) {
			snprintf(r->aerr, sizeof(r->aerr), "%s", x->err);
		} else if ((r->arc = ulp_pack_blob(r->a, r->pack, x->offset, x->stored, &p)) < 0 ||
		           (r->arc = ulp_pack_append_digest(r->w, p, (size_t)x->stored, x->blob_sha, &x->offset)) < 0) {
			snprintf(r->aerr, sizeof(r->aerr), "%s", ulp_archive_errmsg(r->a));
		}
	}
	pthread_mutex_unlock(&r->mu);
	return 0;
}

static int rewrite_pack(rctx *r)
{
	int rc = ulp_index_pack_blobs(r->a, r->pack, collect_blob, r);
	if (rc < 0)
		return rc;
	pthread_mutex_init(&r->mu, NULL);
	ulp_pool_run(r->a->pool, r->n, rewrite_job, r);
	pthread_mutex_destroy(&r->mu);
	if (r->arc < 0)
		return ulp_arch_err(r->a, r->arc, "%s", r->aerr);
	return r->appended == r->n ? 0 : ulp_arch_err(r->a, -ULP_E_INVAL, "gc: internal: blobs left behind");
}

struct sweep {
	ulp_archive *a;
	uint64_t freed;
	int count_only;  /* ulp_archive_tidy_due: count what would go, remove nothing */
	uint64_t files;  /* with count_only: how many */
};

static int sweep_one(void *arg, const char *n, uint64_t size)
{
	struct sweep *sw = arg;
	int drop = 0;
	if (!strncmp(n, "tmp-", 4)) {
		long pid = strtol(n + 4, NULL, 10);
		drop = pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
	} else if (strlen(n) > 5 && !strcmp(n + strlen(n) - 5, ".pack")) {
		drop = ulp_index_has_pack(sw->a, n) == 0 && (!sw->a->sh || ulp_index_grace_has(sw->a, n) == 0);
	}
	if (drop && sw->count_only) {
		sw->files++;
	} else if (drop) {
		sw->freed += size;
		ulp_pack_remove(sw->a, n);
	}
	return 0;
}

/* Removes pack files the index does not know and dead processes' temporaries. */
static uint64_t sweep_files(ulp_archive *a)
{
	struct sweep sw = {a, 0, 0, 0};
	ulp_pack_list(a, "", sweep_one, &sw);
	return sw.freed;
}

/*
 * Invariant 8: what a crash (kill -9) left for the idle pass of the next
 * session: files queued for re-basing or tensors coded against removed
 * steps, packs with nothing live or under the threshold, pack files the
 * index does not name and dead processes' temporaries.
 */
int ulp_archive_tidy_due(ulp_archive *a, unsigned *due)
{
	ulp_space sp = {0};
	*due = 0;
	ULP_TRY(ulp_index_space(a, ULP_RECLAIM_LIVE_PERCENT, &sp));
	if (sp.pending_recodes)
		*due |= ULP_DUE_RECODE;
	if (sp.dead_packs || sp.sparse_packs)
		*due |= ULP_DUE_RECLAIM;
	struct sweep sw = {a, 0, 1, 0};
	ULP_TRY(ulp_pack_list(a, "", sweep_one, &sw));
	if (sw.files)
		*due |= ULP_DUE_SWEEP;
	return 0;
}

int ulp_reclaim_crash_at;

/* test hook: the process ends here, as a kill -9 would end it */
static void crash_point(int at)
{
	if (ulp_reclaim_crash_at == at)
		_exit(98);
}

/* Removes the file of a pack whose row was dropped (invariant 4): 1 if it
 * was there. */
static int unlink_pack(ulp_archive *a, const packinfo *pi)
{
	ulp_pack_forget(a, pi->id);
	return ulp_pack_remove(a, pi->name) == 0;
}

static int want_rewrite(const packinfo *pi, unsigned pct)
{
	return pi->blobs > 0 && (pi->live + ULP_PACK_HEADER) * 100 < pi->size * pct;
}

/* Rewrites one sparse pack (invariant 2) in a transaction of its own; its
 * old pack is left with no blob, for drop_dead. write_mu held. */
static int rewrite_one(ulp_archive *a, packinfo *pi, ulp_gc_result *r)
{
	rctx rx = {.a = a, .pack = pi->id};
	char name[80];
	int64_t nid;
	int same = 0;
	int rc = ulp_db_begin(a);
	if (rc < 0)
		return rc;
	rc = ulp_pack_writer_new(a, &rx.w);
	if (rc == 0)
		rc = rewrite_pack(&rx);
	if (rc == 0 && rx.n == 0) { /* nothing live any more: drop_dead's */
		ulp_db_rollback(a);
		ulp_pack_discard(rx.w);
		free(rx.m);
		return 0;
	}
	if (rc == 0)
		rc = ulp_pack_commit(rx.w, name);
	if (rc == 0 && (same = ulp_index_has_pack(a, name)) < 0)
		rc = same;
	if (rc == 0)
		rc = ulp_index_pack_add(a, name, ulp_pack_size(rx.w), &nid);
	for (size_t k = 0; rc == 0 && k < rx.n; k++)
		rc = ulp_index_blob_move(a, rx.m[k].content, nid, rx.m[k].offset);
	crash_point(4);
	if (rc == 0)
		rc = ulp_db_commit(a);
	if (rc == 0) {
		r->packs_rewritten++;
		ulp_pack_free(rx.w);
	} else {
		ulp_db_rollback(a);
		/* a file of the same bytes that the index names stays */
		if (rx.w && (same > 0 || (same < 0 && ulp_pack_replaced(rx.w))))
			ulp_pack_free(rx.w);
		else if (rx.w)
			ulp_pack_discard(rx.w);
	}
	free(rx.m);
	return rc;
}

/* One transaction drops the rows nothing reaches (sweep) and the rows of
 * the packs left with no blob, whose files go after it (invariant 4).
 * Lists the packs into g. write_mu held. */
static int drop_dead(ulp_archive *a, int sweep, gctx *g, ulp_gc_result *r)
{
	uint64_t removed = 0, packs = 0, bytes = 0;
	g->n = 0;
	int rc = ulp_db_begin(a);
	if (rc < 0)
		return rc;
	if (sweep)
		rc = ulp_index_gc_sweep(a, &removed);
	if (rc == 0)
		rc = ulp_index_packs(a, collect_pack, g);
	uint64_t gen = 0;
	if (a->sh) {
		pthread_mutex_lock(&a->sh->mu);
		gen = a->sh->gen;
		pthread_mutex_unlock(&a->sh->mu);
	}
	for (size_t i = 0; rc == 0 && i < g->n; i++)
		if (g->p[i].blobs == 0 && (rc = ulp_index_pack_drop(a, g->p[i].id)) == 0) {
			g->p[i].new_name[0] = 'x'; /* its row dropped */
			if (a->sh) /* invariant 7 */
				rc = ulp_index_grace_add(a, g->p[i].name, gen);
		}
	crash_point(sweep ? 1 : 5);
	if (rc == 0)
		rc = ulp_db_commit(a);
	if (rc < 0) {
		ulp_db_rollback(a);
		return rc;
	}
	crash_point(sweep ? 2 : 6);
	for (size_t i = 0; i < g->n; i++)
		if (g->p[i].new_name[0] && a->sh) { /* invariant 7: kept for the grace */
			ulp_pack_forget(a, g->p[i].id);
			packs++;
		} else if (g->p[i].new_name[0] && unlink_pack(a, &g->p[i])) {
			packs++;
			bytes += g->p[i].size;
			crash_point(sweep ? 3 : 7);
		}
	r->blobs_removed += removed;
	r->packs_removed += packs;
	r->bytes_reclaimed += bytes;
	return 0;
}

static int ask_stop(const ulp_reclaim_opts *o)
{
	return o && o->stop && o->stop(o->stop_arg);
}

/*
 * Invariants 4 and 5: one short transaction drops what nothing reaches and
 * the packs left with nothing live; then each sparse pack is rewritten in a
 * transaction of its own, the stop callback asked before each, write_mu
 * released between them; then the packs they emptied go as the first ones.
 */
int ulp_archive_reclaim(ulp_archive *a, const ulp_reclaim_opts *o, ulp_gc_result *res)
{
	ulp_gc_result r = {0};
	gctx g = {a, NULL, 0, 0};
	unsigned pct = o && o->live_percent ? ULP_MIN(o->live_percent, 100u) : ULP_RECLAIM_LIVE_PERCENT;
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	pthread_mutex_lock(&a->w->write_mu);
	int rc = drop_dead(a, 1, &g, &r);
	if (rc == -ULP_E_NOSPC && ulp_db_nospc_retry(a)) /* a full disk: the index's reserve (db.c) */
		rc = drop_dead(a, 1, &g, &r);
	pthread_mutex_unlock(&a->w->write_mu);
	uint64_t rewritten = r.packs_rewritten, total = 0, done = 0;
	for (size_t i = 0; rc == 0 && i < g.n; i++)
		total += !g.p[i].new_name[0] && want_rewrite(&g.p[i], pct) ? g.p[i].size : 0;
	if (o && o->progress && total)
		o->progress(o->progress_arg, 0, total);
	for (size_t i = 0; rc == 0 && i < g.n; i++) {
		if (g.p[i].new_name[0] || !want_rewrite(&g.p[i], pct))
			continue;
		if (ask_stop(o))
			break;
		if (o && o->progress && done)
			o->progress(o->progress_arg, done, total);
		done += g.p[i].size;
		pthread_mutex_lock(&a->w->write_mu);
		/* its live share again, inside the lock: a put or a re-coding may
		 * have moved rows meanwhile */
		packinfo *pi = &g.p[i];
		int there = ulp_index_pack(a, pi->id, &pi->size, &pi->live, &pi->blobs);
		rc = there < 0 ? there : 0;
		if (there == 1 && want_rewrite(pi, pct)) {
			rc = rewrite_one(a, pi, &r);
			if (rc == 0)
				r.bytes_reclaimed += pi->size - pi->live;
		}
		pthread_mutex_unlock(&a->w->write_mu);
	}
	if (o && o->progress && total)
		o->progress(o->progress_arg, total, total);
	if (rc == 0 && r.packs_rewritten > rewritten) { /* the packs they left empty */
		pthread_mutex_lock(&a->w->write_mu);
		ulp_gc_result r2 = {0};
		rc = drop_dead(a, 0, &g, &r2);
		r.packs_removed += r2.packs_removed; /* (their bytes counted as rewritten) */
		pthread_mutex_unlock(&a->w->write_mu);
	}
	if (rc == 0 && o && o->full && !ask_stop(o)) {
		pthread_mutex_lock(&a->w->write_mu);
		if (ulp_db_begin(a) == 0) { /* invariant 3 */
			r.bytes_reclaimed += sweep_files(a);
			ulp_db_commit(a);
		}
		pthread_mutex_unlock(&a->w->write_mu);
	}
	if (rc == 0)
		ulp_index_checkpoint(a); /* the -wal file back to nothing when no reader holds it */
	free(g.p);
	if (res) {
		res->blobs_removed += r.blobs_removed;
		res->packs_removed += r.packs_removed;
		res->packs_rewritten += r.packs_rewritten;
		res->bytes_reclaimed += r.bytes_reclaimed;
	}
	if (r.packs_removed || r.packs_rewritten)
		ulp_archive_trim(a); /* the mappings of removed packs nobody pins */
	ulp_db_reserve_make(a); /* where it was released and there is room again */
	return rc;
}

/* the names of the packs whose rows ulp_archive_grace_sweep deletes */
typedef struct gone {
	struct gone *next;
	char name[];
} gone;

static int note_gone(void *arg, const char *name)
{
	gone **list = arg;
	size_t l = strlen(name);
	gone *g = malloc(sizeof(*g) + l + 1);
	if (!g)
		return -ULP_E_NOMEM;
	memcpy(g->name, name, l + 1);
	g->next = *list;
	*list = g;
	return 0;
}

/* Invariant 7: the packs whose grace has passed and that no generation
 * left names; their rows go in one transaction, their files after it. */
int ulp_archive_grace_sweep(ulp_archive *a, int wait)
{
	ulp_shared *sh = a->sh;
	if (!sh || !sh->writer || a->read_only)
		return 0;
	uint64_t oldest;
	ULP_TRY(ulp_gen_oldest(a, &oldest));
	if (wait)
		pthread_mutex_lock(&a->w->write_mu);
	else if (pthread_mutex_trylock(&a->w->write_mu) != 0)
		return 0;
	gone *list = NULL;
	int rc = ulp_db_begin(a);
	if (rc == 0)
		rc = ulp_index_grace_due(a, ulp_wall_ms() - (int64_t)sh->grace_s * 1000, oldest, note_gone, &list);
	if (rc == 0)
		rc = ulp_db_commit(a);
	else
		ulp_db_rollback(a);
	int removed = 0;
	while (list) {
		gone *next = list->next;
		if (rc == 0 && ulp_pack_remove(a, list->name) == 0)
			removed++;
		free(list);
		list = next;
	}
	pthread_mutex_unlock(&a->w->write_mu);
	if (removed)
		ulp_archive_trim(a);
	return rc < 0 ? rc : removed;
}

int ulp_archive_gc(ulp_archive *a, ulp_gc_result *res)
{
	ulp_gc_result r = {0};
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	/* re-base first: what removed steps still hold for kept ones can go */
	ulp_rebase_result rb1, rb2;
	int rc = ulp_archive_rebase_pending(a, NULL, NULL, &rb1);
	if (rc == 0)
		rc = ulp_archive_rebase_orphans(a, NULL, NULL, &rb2);
	if (rc < 0)
		return rc;
	r.blobs_rebased = rb1.recoded + rb2.recoded;
	ulp_reclaim_opts o = {.full = 1, .live_percent = 100}; /* no garbage left */
	rc = ulp_archive_reclaim(a, &o, &r);
	if (rc == 0 && a->sh) { /* the readers move on; what is past its grace goes */
		rc = ulp_gen_publish(a, 0);
		if (rc == 0)
			ulp_gen_retire(a);
		int n = rc == 0 ? ulp_archive_grace_sweep(a, 1) : rc;
		rc = n < 0 ? n : rc;
	}
	if (rc == 0 && res)
		*res = r;
	return rc;
}

/* ---- space ------------------------------------------------------------------ */

/* Allocated bytes under path, as du(1) counts them (directories too; a file
 * linked twice counts twice, as du -l would: archives hold no hard links). */
static uint64_t du_bytes(const char *path, int depth)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return 0;
	uint64_t n = (uint64_t)st.st_blocks * 512;
	if (!S_ISDIR(st.st_mode) || depth > 8)
		return n;
	DIR *d = opendir(path);
	if (!d)
		return n;
	struct dirent *de;
	char sub[4400];
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", path, de->d_name);
		n += du_bytes(sub, depth + 1);
	}
	closedir(d);
	return n;
}

uint64_t ulp_archive_disk_bytes(ulp_archive *a)
{
	if (!a->rm)
		return du_bytes(a->dir, 0);
	/* the bucket's bytes, never waited for long (ulpackfs's statfs) */
	ulp_remote_usage u;
	if (ulp_remote_usage_cached(a->rm, 30000, &u))
		return u.bytes;
	int any = ulp_remote_usage_cached(a->rm, INT64_MAX / 2, &u);
	ulp_gen_usage_refresh(a, any ? 0 : 2000);
	if (any || ulp_remote_usage_cached(a->rm, INT64_MAX / 2, &u))
		return u.bytes;
	return du_bytes(a->dir, 0);
}

typedef struct unnamed {
	ulp_archive *a;
	uint64_t bytes;
} unnamed;

/* a pack object of the bucket: counted where the index does not name it */
static int unnamed_pack(void *arg, const char *name, uint64_t size)
{
	unnamed *u = arg;
	size_t l = strlen(name);
	if (l < 6 || strcmp(name + l - 5, ".pack"))
		return 0;
	int has = ulp_index_has_pack(u->a, name);
	if (has < 0)
		return has;
	if (!has)
		u->bytes += size;
	return 0;
}

int ulp_archive_space(ulp_archive *a, ulp_space *out)
{
	ulp_gen_follow(a); /* gen.c invariant 3 */
	ulp_space sp = {0};
	char path[4400];
	sp.disk_bytes = du_bytes(a->dir, 0); /* (a bucket's: its local home, a cache) */
	static const char *const idx[] = {"ulpack.db", "ulpack.db-wal", "ulpack.db-shm", "ulpack.reserve"};
	for (size_t i = 0; i < sizeof(idx) / sizeof(idx[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", a->dir, idx[i]);
		sp.index_bytes += du_bytes(path, 8);
	}
	snprintf(path, sizeof(path), "%s/packs", a->dir);
	sp.pack_disk_bytes = du_bytes(path, 0);
	snprintf(path, sizeof(path), "%s/staging", a->dir);
	sp.staging_bytes = du_bytes(path, 0);
	ULP_TRY(ulp_index_space(a, ULP_RECLAIM_LIVE_PERCENT, &sp));
	/* what the pack files hold beyond the live blobs: dead blobs, dead
	 * packs, and files the index does not name (what packs/ takes on disk
	 * beyond the named packs and a block of rounding each) */
	uint64_t named = sp.pack_bytes + (sp.packs + 1) * 4096, held = sp.live_bytes + sp.packs * ULP_PACK_HEADER;
	sp.reclaimable_bytes = (sp.pack_bytes > held ? sp.pack_bytes - held : 0) +
	                       (sp.pack_disk_bytes > named ? sp.pack_disk_bytes - named : 0);
	if (a->rm) {
		/* the archive is the bucket: its packs no generation of the index
		 * names are what gc gives back (the local packs/ is a cache of named
		 * ones, the term above 0) */
		ulp_remote_usage ru;
		unnamed un = {a, 0};
		ULP_TRY(ulp_remote_usage_list(a, &ru, unnamed_pack, &un));
		sp.in_bucket = 1;
		sp.bucket_bytes = ru.bytes;
		sp.bucket_pack_bytes = ru.pack_bytes;
		sp.bucket_packs = ru.packs;
		sp.bucket_unnamed_bytes = un.bytes;
		sp.reclaimable_bytes = (sp.pack_bytes > held ? sp.pack_bytes - held : 0) + un.bytes;
	}
	*out = sp;
	return 0;
}

int ulp_space_json(const ulp_space *sp, char *dst, size_t cap)
{
	char bucket[256] = "";
	if (sp->in_bucket)
		snprintf(bucket, sizeof(bucket),
		         ", \"bucket_bytes\": %llu, \"bucket_pack_bytes\": %llu, \"bucket_packs\": %llu,"
		         " \"bucket_unnamed_bytes\": %llu",
		         (unsigned long long)sp->bucket_bytes, (unsigned long long)sp->bucket_pack_bytes,
		         (unsigned long long)sp->bucket_packs, (unsigned long long)sp->bucket_unnamed_bytes);
	return snprintf(dst, cap,
	                "{\"disk_bytes\": %llu, \"index_bytes\": %llu, \"pack_disk_bytes\": %llu,"
	                " \"staging_bytes\": %llu, \"pack_bytes\": %llu, \"live_bytes\": %llu,"
	                " \"reclaimable_bytes\": %llu, \"packs\": %llu, \"dead_packs\": %llu,"
	                " \"sparse_packs\": %llu, \"pending_recodes\": %llu%s}",
	                (unsigned long long)sp->disk_bytes, (unsigned long long)sp->index_bytes,
	                (unsigned long long)sp->pack_disk_bytes, (unsigned long long)sp->staging_bytes,
	                (unsigned long long)sp->pack_bytes, (unsigned long long)sp->live_bytes,
	                (unsigned long long)sp->reclaimable_bytes, (unsigned long long)sp->packs,
	                (unsigned long long)sp->dead_packs, (unsigned long long)sp->sparse_packs,
	                (unsigned long long)sp->pending_recodes, bucket);
}
