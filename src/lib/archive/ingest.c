/* SPDX-License-Identifier: MIT */
/*
 * ingest.c - archiving one file. A file is laid out as an ordered list of
 * segments (layout()): verbatim bytes, kept in the index (the file's stored
 * header: the concatenation of its verbatim segments), tensors (each a blob,
 * coded against the tensor of the same name in the archived file of its
 * series that the series' layout names, layout.c: a new newest step is an
 * anchor) and opaque bytes (segments of ULP_SEGMENT
 * bytes, each a zstd or raw blob). A safetensors file is its header
 * (verbatim), its tensors and any bytes between or after them (opaque); a
 * torch.save zip (torchzip.c) is its storages as tensors, the small records
 * and ZIP structures around them verbatim (larger gaps opaque); a DCP rank
 * file ("*.distcp", dcp.c) is laid out the same way record after record
 * (kind 2 too; its tensors named by the step's .metadata when an import
 * puts it after that, by their dtype and length otherwise: dcp.h), what follows its
 * last record that parses opaque; any other file is opaque. Identical contents are stored once.
 *
 * Invariants:
 *  1. Every new blob is decoded and compared byte for byte with its input
 *     before the index transaction starts; the file's sha256 is taken over
 *     the same bytes.
 *  2. The pack is durable (pack.c) before the transaction that names it
 *     commits; if the commit fails the pack file is removed again, so the
 *     archive is exactly as before.
 *  3. A delta's reference chain never exceeds max_chain deltas: a tensor
 *     whose reference already has max_chain is coded standalone (an anchor).
 *  4. Segments tile [0, size) in order; the stored header is exactly the
 *     bytes of the verbatim segments, in order, as read for the file's
 *     sha256 (kind 2: zstd-compressed, see ulpack-format(5)).
 */
#include "arch_int.h"
#include "senc.h"
#include "torchzip.h"
#include "dcp.h"
#include "store/db.h"
#include "store/path.h"
#include "archive/cache.h"
#include "store/index.h"
#include "store/pack.h"
#include "archive/read.h"
#include "archive/writer.h"
#include <zstd.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ULP_SEGMENT ((size_t)4 << 20) /* bytes a segment of an opaque file: bounds memory */
#define ULP_BATCH_MIN ((size_t)32 << 20) /* bytes a batch of segments at least (do_segments) */

/* Verbatim gaps of a torch zip longer than this are stored opaque, and so
 * are all once the verbatim bytes of a file pass ULP_VERBATIM_TOTAL (the
 * header lives in the index and is read whole when the file is opened). */
#define ULP_VERBATIM_GAP   ((uint64_t)1 << 20)
#define ULP_VERBATIM_TOTAL ((uint64_t)16 << 20)

enum { SEG_OPAQUE, SEG_TENSOR, SEG_VERBATIM };

typedef struct seg {
	uint64_t offset, length;
	int kind;               /* SEG_* */
	const char *name;       /* SEG_TENSOR: its name (owned by the parsed layout) */
	ulp_dtype dtype;        /* SEG_TENSOR */
	const char *alt;        /* SEG_TENSOR: the name its reference may have instead, or NULL */
} seg;

typedef struct put {
	ulp_archive *a;
	const char *path;
	int fd;
	ulp_pack_writer *pw;
	ulp_newblob *nb;
	size_t n_nb, cap_nb;
	ulp_newext *nx;
	size_t n_nx, cap_nx;
	uint64_t stored;
	unsigned depth;
	int anchor;
	int meta_names;         /* a DCP rank file named by its step's archived .metadata (ulp_putq_put) */
	ulp_put_result *res;
	uint8_t *vb;            /* the verbatim segments' bytes, in order (invariant 4) */
	size_t n_vb, cap_vb;
	pthread_mutex_t mu;     /* nb, nx, vb, pw, stored, depth, anchor, res: phase C
	                           appends from inside the parallel phase B */
	pthread_mutex_t hmu;    /* job.ready, batch.hashed/hashing (hash_in_order) */
} put;

static int read_at(put *p, uint8_t *buf, size_t len, uint64_t off)
{
	int e = ulp_pread_full(p->fd, buf, len, off);
	if (e)
		return ulp_arch_err(p->a, -ULP_E_IO, "%s: read of bytes [%llu, %llu): %s", p->path, (unsigned long long)off,
		                    (unsigned long long)(off + len), e == ENODATA ? "file shrank while archiving" : strerror(e));
	return 0;
}

static const ulp_newblob *inflight_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN]);

/* A blob already in the archive or made earlier in this put (or by the file
 * in flight before it, ulp_putq)? */
static int have_content(put *p, const uint8_t sha[ULP_SHA256_LEN], unsigned *depth, int locked)
{
	int found = 0;
	const ulp_newblob *ib = inflight_blob(p->a, sha);
	if (ib) {
		*depth = ib->depth;
		return 1;
	}
	if (!locked)
		pthread_mutex_lock(&p->mu);
	for (size_t i = 0; i < p->n_nb && !found; i++)
		if (memcmp(p->nb[i].content, sha, ULP_SHA256_LEN) == 0) {
			*depth = p->nb[i].depth;
			found = 1;
		}
	if (!locked)
		pthread_mutex_unlock(&p->mu);
	if (found)
		return 1;
	ulp_blobrow row;
	int rc = ulp_index_blob(p->a, sha, &row);
	if (rc == 0) {
		*depth = row.depth;
		return 1;
	}
	return rc == -ULP_E_NOENT ? 0 : rc;
}

static int add_extent(put *p, uint64_t off, uint64_t len, const uint8_t sha[ULP_SHA256_LEN],
                      const char *name, int dtype, unsigned depth)
{
	ULP_TRY(ulp_grow(&p->nx, &p->cap_nx, p->n_nx, sizeof(*p->nx)));
	ulp_newext *x = &p->nx[p->n_nx++];
	x->offset = off;
	x->length = len;
	memcpy(x->content, sha, ULP_SHA256_LEN);
	x->name = name;
	x->dtype = dtype;
	if (depth > p->depth)
		p->depth = depth;
	if (depth > 0)
		p->anchor = 0;
	return 0;
}

/*
 * Segments are processed in batches (4 MiB a thread, or one larger segment):
 * their references looked up in order (phase A), read, hashed, coded and
 * verified in parallel (phase B: one pool job a segment, whose chunks are
 * nested jobs of the same pool, so a large segment is split among the
 * threads that have nothing else left; the file's sha256 is taken in order
 * by the threads that read, hash_in_order), appended to the pack in order
 * (phase C), so the pack and the index do not depend on the thread count.
 * Phase C runs inside phase B: the thread that finishes job k appends, under
 * put.mu, every finished job from the first not yet appended on, so the
 * pack is written while later jobs code.
 */
typedef struct job {
	const seg *s;
	uint8_t *buf;                      /* the segment's bytes */
	size_t len;
	uint8_t sha[ULP_SHA256_LEN];
	int reuse;                         /* content already stored */
	unsigned depth;                    /* of the reused blob, or of the reference */
	int try_ref;                       /* a reference tensor exists */
	uint8_t ref_sha[ULP_SHA256_LEN];
	int ready;                         /* 1: buf holds the bytes, 2: reading failed
	                                      (under put.hmu) */
	uint8_t *blob;                     /* phase B result */
	uint8_t blob_sha[ULP_SHA256_LEN];  /* the blob's digest, for the pack's name */
	size_t blob_len, blob_cap, buf_cap; /* buffers are kept from one batch to the next */
	int codec, used_ref;
	int rc;
	int done;                          /* phase B over (under put.mu) */
	int prewritten;                    /* the blob is in the pack at pack_off (write_lone,
	                                      code_stream) */
	int stream;                        /* coded a window at a time (code_stream): no buf,
	                                      no blob in memory */
	uint64_t stream_chunk;             /* stream: raw bytes a chunk of its blob */
	uint64_t pack_off;
	char err[600];
} job;

typedef struct batch {
	put *p;
	job *j;
	size_t n;
	int lone;                          /* one job: it writes its blob itself (write_lone) */
	size_t hashed;                     /* jobs in the file's sha256 (under put.hmu) */
	int hashing;                       /* a thread is taking them in (under put.hmu) */
	EVP_MD_CTX *file_sha;              /* the file's sha256 (hash_in_order) */
	/* phase C, under p->mu */
	size_t appended;                   /* jobs [0, appended) are in the pack */
	int arc;                           /* first error appending, 0 if none */
	char aerr[600];                    /* its message */
} batch;

/* After a content's coding: its blob decoded chunk by chunk and compared
 * with its input (job_check_chunk), then the cache seeded chunk by chunk
 * (job_seed). */
typedef struct finish {
	ulp_archive *a;
	const job *j;
	const uint8_t *ref;  /* the reference the blob was coded against, or NULL */
	size_t piece;        /* bytes a job: the blob's chunk */
	int differs, nomem;  /* atomic */
	const ulp_blob *b;
} finish;

static int job_check_chunk(void *arg, size_t k)
{
	finish *f = arg;
	uint64_t off = k * f->piece, len = ULP_MIN(f->piece, f->j->len - off);
	if (ulp_blob_get_info(f->b)->codec == ULP_CODEC_IDENT) { /* its bytes are the reference's */
		if (!f->ref || memcmp(f->ref + off, f->j->buf + off, (size_t)len) != 0)
			__atomic_store_n(&f->differs, 1, __ATOMIC_RELAXED);
		return 0;
	}
	ulp_blob_chunk_range(f->b, (uint32_t)k, &off, &len);
	if (off + len > f->j->len || off != k * f->piece) {
		__atomic_store_n(&f->differs, 1, __ATOMIC_RELAXED);
		return 0;
	}
	uint8_t *t = ulp_scratch(ULP_SCRATCH_CHECK, len ? (size_t)len : 1);
	if (!t) {
		__atomic_store_n(&f->nomem, 1, __ATOMIC_RELAXED);
		return 0;
	}
	int64_t d = ulp_blob_decode_chunk(f->b, (uint32_t)k, t, (size_t)len, f->ref ? f->ref + off : NULL,
	                                  f->ref ? (size_t)len : 0);
	if (d == -ULP_E_NOMEM) /* a decode that could not run is that error, not a mismatch */
		__atomic_store_n(&f->nomem, 1, __ATOMIC_RELAXED);
	else if (d != (int64_t)len || memcmp(t, f->j->buf + off, (size_t)len) != 0)
		__atomic_store_n(&f->differs, 1, __ATOMIC_RELAXED);
	return 0;
}

static int job_seed(void *arg, size_t k)
{
	finish *f = arg;
	size_t off = k * f->piece;
	ulp_read_seed_chunk(f->a, f->j->sha, (uint32_t)k, f->j->buf + off, ULP_MIN(f->piece, f->j->len - off));
	return 0; /* a chunk not cached is decoded when read */
}

/* n jobs on pool, or here in order without one (a job of a batch: the pool
 * is busy, and a region of its own would be counted twice) */
static void run_jobs(ulp_pool *pool, size_t n, int (*fn)(void *, size_t), void *arg)
{
	if (pool)
		ulp_pool_run(pool, n, fn, arg);
	else
		for (size_t k = 0; k < n; k++)
			fn(arg, k);
}

/* A content's bytes read and, for format v2, its digest's leaves hashed
 * (ulpack-format(5) 2.4) leaf by leaf, as nested jobs of the pool, so that
 * neither the read nor the hashing is a serial pass. */
typedef struct reader {
	put *p;
	job *j;
	uint8_t *leaves;     /* NULL: bytes only (v1, verbatim) */
	int failed;          /* atomic: the first failing piece reports */
} reader;

static int job_read_leaf(void *arg, size_t k)
{
	reader *r = arg;
	job *j = r->j;
	size_t off = k * ULP_DIGEST_LEAF, len = ULP_MIN(ULP_DIGEST_LEAF, j->len - off);
	int rc = read_at(r->p, j->buf + off, len, j->s->offset + off);
	if (rc < 0) {
		if (!__atomic_exchange_n(&r->failed, 1, __ATOMIC_ACQ_REL)) {
			j->rc = rc;
			snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(r->p->a));
		}
		return 0;
	}
	if (r->leaves)
		ulp_digest_leaves(j->buf + off, len, r->leaves + k * ULP_SHA256_LEN);
	return 0;
}

static int read_job(put *p, job *j, ulp_pool *pool, int digest)
{
	size_t m = ulp_digest_n_leaves(j->len);
	uint8_t one[ULP_SHA256_LEN];
	reader r = {p, j, NULL, 0};
	if (digest && !(r.leaves = m <= 1 ? one : malloc(m * ULP_SHA256_LEN))) {
		j->rc = -ULP_E_NOMEM;
		snprintf(j->err, sizeof(j->err), "%s: out of memory hashing %zu bytes", p->path, j->len);
		return j->rc;
	}
	run_jobs(m > 1 ? pool : NULL, m, job_read_leaf, &r);
	if (!r.failed && r.leaves)
		ulp_digest_root(r.leaves, j->len, j->sha);
	if (r.leaves != one)
		free(r.leaves);
	return r.failed ? j->rc : 0;
}

/* The reference's bytes into dst, its chunks looked up (decoded if not
 * cached) and copied on the pool: ulp_read_content copies serially. */
typedef struct refcopy {
	ulp_archive *a;
	const uint8_t *sha;
	uint8_t *dst;
	size_t len, chunk;   /* bytes of the content and of a chunk */
	int failed;          /* atomic */
} refcopy;

static int job_ref_chunk(void *arg, size_t k)
{
	refcopy *r = arg;
	ulp_centry *e;
	const uint8_t *d;
	size_t l, off = k * r->chunk;
	if (ulp_read_chunk(r->a, r->sha, (uint32_t)k, &e, &d, &l, NULL) < 0) {
		__atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
		return 0;
	}
	if (l == ULP_MIN(r->chunk, r->len - off))
		memcpy(r->dst + off, d, l);
	else
		__atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
	ulp_cache_put(r->a->cache, e);
	return 0;
}

static int inflight_ref(ulp_archive *a, ulp_pool *pool, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst,
                        size_t len);

static int read_ref(ulp_archive *a, ulp_pool *pool, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst,
                    size_t len)
{
	const ulp_blob *b;
	ulp_centry *be;
	int irc = inflight_ref(a, pool, sha, dst, len); /* a new blob of the file in flight */
	if (irc <= 0)
		return irc;
	if (!pool)
		return ulp_read_content(a, sha, dst, len);
	ULP_TRY(ulp_read_blob(a, sha, &be, &b));
	const ulp_blob_info *in = ulp_blob_get_info(b);
	size_t chunk = (size_t)in->chunk_elems * ulp_dtype_size(in->dtype);
	uint32_t nk = in->n_chunks;
	int ok = in->raw_bytes == len && chunk > 0 && (uint64_t)nk * chunk >= len;
	ulp_cache_put(a->cache, be);
	if (!ok) /* unusual geometry: the plain path, with its own checks and errors */
		return ulp_read_content(a, sha, dst, len);
	refcopy r = {a, sha, dst, len, chunk, 0};
	ulp_pool_run(pool, nk, job_ref_chunk, &r);
	return r.failed ? -ULP_E_CORRUPT : 0;
}

static int append_job(put *p, job *j);

/* A lone job's blob written to the pack leaf by leaf while its digest's
 * leaves are hashed, on the pool: no serial write of the blob in phase C. */
typedef struct lone {
	put *p;
	job *j;
	uint8_t *leaves;
	int failed;          /* atomic */
} lone;

static int job_lone_leaf(void *arg, size_t k)
{
	lone *l = arg;
	job *j = l->j;
	size_t off = k * ULP_DIGEST_LEAF, len = ULP_MIN(ULP_DIGEST_LEAF, j->blob_len - off);
	ulp_digest_leaves(j->blob + off, len, l->leaves + k * ULP_SHA256_LEN);
	int rc = ulp_pack_write_at(l->p->pw, j->pack_off + off, j->blob + off, len);
	if (rc < 0 && !__atomic_exchange_n(&l->failed, 1, __ATOMIC_ACQ_REL)) {
		j->rc = rc;
		snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(l->p->a));
	}
	return 0;
}

static void write_lone(put *p, job *j, ulp_pool *pool)
{
	size_t m = ulp_digest_n_leaves(j->blob_len);
	lone l = {p, j, malloc(ULP_MAX(m, 1) * ULP_SHA256_LEN), 0};
	int rc = l.leaves ? 0 : -ULP_E_NOMEM;
	pthread_mutex_lock(&p->mu);
	if (rc == 0 && !p->pw)
		rc = ulp_pack_writer_new(p->a, &p->pw);
	if (rc == 0)
		rc = ulp_pack_reserve(p->pw, j->blob_len, &j->pack_off);
	pthread_mutex_unlock(&p->mu);
	if (rc < 0) {
		j->rc = rc;
		snprintf(j->err, sizeof(j->err), "%s: %s", p->path,
		         rc == -ULP_E_NOMEM ? "out of memory hashing a blob" : ulp_archive_errmsg(p->a));
		free(l.leaves);
		return;
	}
	j->prewritten = 1;
	run_jobs(pool, m, job_lone_leaf, &l);
	ulp_digest_root(l.leaves, j->blob_len, j->blob_sha);
	free(l.leaves);
}

static void code_one(batch *bt, size_t i);

/* Phase B, job i: code_one, then phase C for the jobs finished in order. */
static int code_job(void *arg, size_t i)
{
	batch *bt = arg;
	put *p = bt->p;
	code_one(bt, i);
	pthread_mutex_lock(&p->mu);
	bt->j[i].done = 1;
	while (bt->appended < bt->n && bt->j[bt->appended].done && bt->arc == 0) {
		bt->arc = append_job(p, &bt->j[bt->appended++]);
		if (bt->arc < 0) /* the message is this thread's: keep it for the caller */
			snprintf(bt->aerr, sizeof(bt->aerr), "%s", ulp_archive_errmsg(p->a));
	}
	pthread_mutex_unlock(&p->mu);
	return 0;
}

/* The file's sha256, taken in order inside phase B: the thread that has
 * read job i hashes it, and the jobs after it that are read, unless a thread
 * is at it already (which then takes job i too: it checks again under
 * put.hmu after each job). Nothing waits, so no pool thread can wait on a
 * job it is itself inside of. */
static void hash_in_order(batch *bt, size_t i, int rr)
{
	put *p = bt->p;
	pthread_mutex_lock(&p->hmu);
	bt->j[i].ready = rr < 0 ? 2 : bt->j[i].stream ? 3 : 1; /* 3: code_stream hashed it */
	if (!bt->hashing) {
		bt->hashing = 1;
		while (bt->hashed < bt->n && bt->j[bt->hashed].ready) {
			job *k = &bt->j[bt->hashed];
			pthread_mutex_unlock(&p->hmu);
			if (k->ready == 1)
				EVP_DigestUpdate(bt->file_sha, k->buf, k->len);
			pthread_mutex_lock(&p->hmu);
			bt->hashed++;
		}
		bt->hashing = 0;
	}
	pthread_mutex_unlock(&p->hmu);
}

static void code_rest(batch *bt, size_t i);
static void code_stream(batch *bt, size_t i);

/* A lone job: its part of the file's sha256 and its coding, side by side,
 * as two jobs of one loop. The thread that opened the loop codes (its
 * scratch buffers are the ones sized for this job: a pool thread coding
 * would hold a second set), the other hashes: each call takes the part it
 * prefers if still free, else the other. */
typedef struct split {
	batch *bt;
	size_t i;
	int rr;
	pthread_t owner;
	int taken;           /* atomic: bit 0 coding, bit 1 hashing */
} split;

static int job_split(void *arg, size_t k)
{
	split *sp = arg;
	(void)k;
	int want = pthread_equal(pthread_self(), sp->owner) ? 1 : 2;
	int got = __atomic_fetch_or(&sp->taken, want, __ATOMIC_ACQ_REL) & want ? 3 - want : want;
	__atomic_fetch_or(&sp->taken, got, __ATOMIC_ACQ_REL);
	if (got == 2)
		hash_in_order(sp->bt, sp->i, sp->rr);
	else
		code_rest(sp->bt, sp->i);
	return 0;
}

/* Phase B: code one content against its reference (or standalone), decode
 * what was written and compare (invariant 1). */
static void code_one(batch *bt, size_t i)
{
	job *j = &bt->j[i];
	ulp_archive *a = bt->p->a;
	ulp_pool *pool = a->pool; /* nested (pool.c): idle threads take chunks of any job */
	if (j->stream) {
		code_stream(bt, i);
		return;
	}
	/* phase B reads its own bytes: reads run in parallel too, and with
	 * them the content's identity, its digest (ulpack-format(5) 2.4) */
	int v2 = a->blob_version != 1 && j->s->kind != SEG_VERBATIM;
	int rr = read_job(bt->p, j, pool, v2);
	if (rr == 0 && bt->lone && j->s->kind != SEG_VERBATIM) {
		/* the file's sha256 of its bytes beside its coding */
		split sp = {bt, i, rr, pthread_self(), 0};
		ulp_pool_run(pool, 2, job_split, &sp);
		return;
	}
	hash_in_order(bt, i, rr);
	if (rr == 0 && j->s->kind != SEG_VERBATIM) /* verbatim: kept as read, phase C adds it */
		code_rest(bt, i);
}

/* The rest of phase B: j's bytes are read and its digest taken. */
static void code_rest(batch *bt, size_t i)
{
	job *j = &bt->j[i];
	ulp_archive *a = bt->p->a;
	ulp_pool *pool = a->pool;
	int v2 = a->blob_version != 1;
	ulp_dtype dt = j->s->kind == SEG_TENSOR ? j->s->dtype : ULP_DT_UNKNOWN;
	uint8_t *ref = NULL;
	if (!v2)
		ulp_sha256(j->buf, j->len, j->sha);
	/* stored once: an earlier file, or earlier in this one (under put.mu:
	 * phase C appends meanwhile) */
	int have = have_content(bt->p, j->sha, &j->depth, 0);
	if (have < 0) {
		j->rc = have;
		snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(a));
		return;
	}
	if (have) {
		j->reuse = 1;
		return;
	}
	if (j->try_ref) {
		ref = ulp_scratch(ULP_SCRATCH_REF, j->len);
		if (ref && read_ref(a, pool, j->ref_sha, ref, j->len) < 0)
			ref = NULL; /* an unreadable reference is no reason to fail: standalone */
	}
	/* both identities are known: the content's from above, the reference's from the index */
	ulp_enc_opts o = {.ref_sha256 = ref ? j->ref_sha : NULL, .src_sha256 = j->sha,
	                  .format_version = a->blob_version};
	size_t cap = ulp_encode_bound(dt, j->len, &o);
	if (j->blob_cap < cap) {
		free(j->blob);
		j->blob = ulp_alloc_big(cap);
		j->blob_cap = j->blob ? cap : 0;
	}
	if (!j->blob) {
		j->rc = -ULP_E_NOMEM;
		snprintf(j->err, sizeof(j->err), "%s: out of memory coding %zu bytes", bt->p->path, j->len);
		goto out;
	}
	ulp_enc_stats st;
	int64_t n = ulp_encode(&o, pool, dt, j->blob, cap, j->buf, j->len, ref, ref ? j->len : 0, &st);
	if (n < 0) {
		j->rc = (int)n;
		snprintf(j->err, sizeof(j->err), "%s: encoding failed: %s", bt->p->path, ulp_strerror((int)n));
		goto out;
	}
	ulp_blob *b;
	char why[256] = "decoded blob differs from its input";
	int rc = ulp_blob_open(j->blob, (size_t)n, &b, why, sizeof(why));
	if (rc == 0) {
		const ulp_blob_info *in = ulp_blob_get_info(b);
		int has_ref = in->has_ref;
		size_t cb = (size_t)in->chunk_elems * ulp_dtype_size(dt);
		finish f = {a, j, has_ref ? ref : NULL, cb, 0, 0, b};
		/* invariant 1, chunk by chunk into chunk-sized buffers (not a
		 * second copy of the content): every byte decoded and compared
		 * (IDENT: the reference's, with no chunks of its own) */
		uint64_t nk = in->codec == ULP_CODEC_IDENT && cb ? (j->len + cb - 1) / cb : in->n_chunks;
		if (in->raw_bytes == j->len && (j->len == 0 || (cb > 0 && nk * cb >= j->len)))
			run_jobs(pool, (size_t)nk, job_check_chunk, &f);
		else
			f.differs = 1;
		rc = f.nomem ? -ULP_E_NOMEM
		     : !f.differs && memcmp(in->content_sha256, j->sha, ULP_SHA256_LEN) == 0 ? 0 : -ULP_E_CHECKSUM;
		if (rc == -ULP_E_NOMEM)
			snprintf(why, sizeof(why), "out of memory decoding a chunk");
		size_t pieces = cb ? (j->len + cb - 1) / cb : 0;
		j->used_ref = has_ref;
		/* the next step is coded against this one: keep it decoded, in
		 * the memory of the reference it supersedes (no fresh pages) */
		if (rc == 0 && j->s->kind == SEG_TENSOR && cb) {
			if (ref)
				ulp_read_retire(a, j->ref_sha, j->len, cb);
			run_jobs(pool, pieces, job_seed, &f);
		}
		ulp_blob_close(b);
	}
	if (rc < 0) {
		j->rc = rc;
		snprintf(j->err, sizeof(j->err), "%s: verification before commit failed: %s", bt->p->path, why);
		goto out;
	}
	j->blob_len = (size_t)n;
	j->codec = st.codec;
	/* the pack's per-blob digest, here, in parallel: not in phase C; a
	 * lone job (next in order: its batch is itself) is written to the pack
	 * by the same jobs */
	if (bt->lone)
		write_lone(bt->p, j, pool);
	else if (ulp_content_digest(pool, j->blob, j->blob_len, j->blob_sha) < 0) {
		j->rc = -ULP_E_NOMEM;
		snprintf(j->err, sizeof(j->err), "%s: out of memory hashing a blob", bt->p->path);
	}
out:
	;
}


/* Phase C: append in order; a content coded twice in one batch is kept once. */
static int append_job(put *p, job *j)
{
	const char *name = j->s->kind == SEG_TENSOR ? j->s->name : NULL;
	int dtype = j->s->kind == SEG_TENSOR ? (int)j->s->dtype : -1;
	unsigned depth;
	if (j->rc < 0)
		return ulp_arch_err(p->a, j->rc, "%s", j->err);
	__atomic_add_fetch(&p->a->w->put_done, (uint64_t)j->s->length, __ATOMIC_RELAXED);
	if (j->s->kind == SEG_VERBATIM) {
		while (p->cap_vb - p->n_vb < j->len)
			ULP_TRY(ulp_grow(&p->vb, &p->cap_vb, p->cap_vb, 1));
		memcpy(p->vb + p->n_vb, j->buf, j->len);
		p->n_vb += j->len;
		return 0;
	}
	if (j->reuse) {
		if (p->res)
			p->res->reused++;
		return add_extent(p, j->s->offset, j->s->length, j->sha, name, dtype, j->depth);
	}
	if (j->rc < 0)
		return ulp_arch_err(p->a, j->rc, "%s", j->err);
	/* written already (write_lone): new, as code_one found it */
	int have = j->prewritten ? 0 : have_content(p, j->sha, &depth, 1);
	if (have < 0)
		return have;
	if (have) {
		if (p->res)
			p->res->reused++;
		return add_extent(p, j->s->offset, j->s->length, j->sha, name, dtype, depth);
	}
	int rc;
	if (!p->pw && (rc = ulp_pack_writer_new(p->a, &p->pw)) < 0)
		return rc;
	ULP_TRY(ulp_grow(&p->nb, &p->cap_nb, p->n_nb, sizeof(*p->nb)));
	ulp_newblob *nb = &p->nb[p->n_nb];
	memset(nb, 0, sizeof(*nb));
	if (j->prewritten) {
		nb->offset = j->pack_off;
		ulp_pack_reserved_digest(p->pw, j->blob_len, j->blob_sha);
	} else if ((rc = ulp_pack_append_digest(p->pw, j->blob, j->blob_len, j->blob_sha, &nb->offset)) < 0) {
		return rc;
	}
	p->n_nb++;
	memcpy(nb->content, j->sha, ULP_SHA256_LEN);
	/* header byte 7: log2 of the elements of a chunk (ulpack-format(5)) */
	if (j->stream)
		nb->chunk = (size_t)j->stream_chunk;
	else if (j->s->kind == SEG_TENSOR && j->blob_len > 8 && j->blob[7] < 40)
		nb->chunk = ((size_t)1 << j->blob[7]) * ulp_dtype_size(j->s->dtype);
	nb->codec = j->codec;
	nb->raw = j->len;
	nb->stored = j->blob_len;
	if (j->used_ref) {
		nb->has_ref = 1;
		memcpy(nb->ref, j->ref_sha, ULP_SHA256_LEN);
		nb->depth = j->depth + 1;
	}
	p->stored += j->blob_len;
	if (p->res) {
		if (j->used_ref)
			p->res->deltas++;
		else if (j->s->kind == SEG_TENSOR)
			p->res->anchors++;
	}
	return add_extent(p, j->s->offset, j->s->length, j->sha, name, dtype, nb->depth);
}

/*
 * Tensors larger than ULP_STREAM_MIN bytes (64 MiB; the environment
 * variable ULP_STREAM_MIN sets another, for tests) are coded a window of
 * chunks at a time (senc.h), so that memory is bounded by the threads and
 * the chunk size, not by the tensor: a pass reads the tensor in windows and
 * takes its digest and the file's sha256 (in order), then the streaming
 * encoder reads it again, with the reference's chunks through the cache,
 * spills the coded payloads to an unnamed file beside the packs, and the
 * blob is written to the pack leaf by leaf, its digest taken on the way.
 * The blob is the one the whole-tensor path makes (senc.h invariant 1), and
 * every payload was decoded and compared before it was spilled (invariant 1
 * above, chunk by chunk).
 */
#define ULP_STREAM_MIN_DEFAULT ((uint64_t)64 << 20)
#define ULP_STREAM_PIECE ((size_t)2 << 20) /* bytes a job of the hashing pass: whole leaves */

uint64_t ulp_stream_min(void)
{
	const char *e = getenv("ULP_STREAM_MIN"); /* read each time: tests change it */
	uint64_t m = e && *e ? strtoull(e, NULL, 0) : 0;
	return m ? m : ULP_STREAM_MIN_DEFAULT;
}

static int streamed(const seg *s)
{
	return s->kind == SEG_TENSOR && s->length > ulp_stream_min();
}

/* the hashing pass: a window of pieces read and their leaves hashed in
 * parallel while the previous window goes into the file's sha256 (and, for
 * format v1, the content's) in order */
typedef struct shash {
	put *p;
	job *j;
	EVP_MD_CTX *fsha, *csha;  /* the file's; the content's (v1), or NULL */
	uint8_t *buf[2];          /* windows, alternately */
	uint8_t *leaves;          /* v2 */
	size_t window, m;         /* pieces a window, pieces in this one */
	unsigned w;               /* this window's number */
	uint64_t base;            /* its first byte in the tensor */
	size_t prev_len;          /* bytes of the previous window */
	int failed;               /* atomic */
} shash;

static int job_shash(void *arg, size_t i)
{
	shash *h = arg;
	job *j = h->j;
	if (i == h->m) { /* the previous window, in order */
		const uint8_t *b = h->buf[(h->w - 1) & 1];
		EVP_DigestUpdate(h->fsha, b, h->prev_len);
		if (h->csha)
			EVP_DigestUpdate(h->csha, b, h->prev_len);
		return 0;
	}
	uint64_t off = h->base + (uint64_t)i * ULP_STREAM_PIECE;
	size_t len = (size_t)ULP_MIN((uint64_t)ULP_STREAM_PIECE, j->len - off);
	uint8_t *d = h->buf[h->w & 1] + i * ULP_STREAM_PIECE;
	int rc = read_at(h->p, d, len, j->s->offset + off);
	if (rc < 0) {
		if (!__atomic_exchange_n(&h->failed, 1, __ATOMIC_ACQ_REL)) {
			j->rc = rc;
			snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(h->p->a));
		}
		return 0;
	}
	if (h->leaves)
		ulp_digest_leaves(d, len, h->leaves + off / ULP_DIGEST_LEAF * ULP_SHA256_LEN);
	return 0;
}

static int stream_hash(put *p, batch *bt, job *j, ulp_pool *pool)
{
	int v2 = p->a->blob_version != 1;
	shash h = {.p = p, .j = j, .fsha = bt->file_sha};
	h.window = (size_t)ULP_MAX(1, ulp_pool_threads(pool));
	size_t wbytes = h.window * ULP_STREAM_PIECE;
	h.buf[0] = ulp_alloc_big(wbytes);
	h.buf[1] = ulp_alloc_big(wbytes);
	if (v2)
		h.leaves = malloc(ULP_MAX(ulp_digest_n_leaves(j->len), 1) * ULP_SHA256_LEN);
	else if ((h.csha = EVP_MD_CTX_new()))
		EVP_DigestInit_ex(h.csha, EVP_sha256(), NULL);
	int rc = 0;
	if (!h.buf[0] || !h.buf[1] || (v2 ? !h.leaves : !h.csha)) {
		rc = j->rc = -ULP_E_NOMEM;
		snprintf(j->err, sizeof(j->err), "%s: out of memory reading %zu bytes", p->path, j->len);
		goto out;
	}
	for (h.base = 0; h.base < j->len && !h.failed; h.base += wbytes, h.w++) {
		size_t left = j->len - (size_t)h.base;
		h.m = (ULP_MIN(left, wbytes) + ULP_STREAM_PIECE - 1) / ULP_STREAM_PIECE;
		ulp_pool_run(pool, h.m + (h.w > 0), job_shash, &h);
		h.prev_len = ULP_MIN(left, wbytes);
	}
	if (h.failed) {
		rc = j->rc;
		goto out;
	}
	if (h.w > 0) { /* the last window */
		h.m = 0;
		job_shash(&h, 0);
	}
	if (v2)
		ulp_digest_root(h.leaves, j->len, j->sha);
	else
		EVP_DigestFinal_ex(h.csha, j->sha, NULL);
out:
	free(h.buf[0]);
	free(h.buf[1]);
	free(h.leaves);
	EVP_MD_CTX_free(h.csha);
	return rc;
}

/* The contents a chunk of sha decodes through: sha, its reference, ... (at
 * most ULP_CHAIN_MAX); fewer when a blob cannot be read (its reader reports). */
size_t ulp_chain_of(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint8_t (*out)[ULP_SHA256_LEN])
{
	size_t n = 0;
	memcpy(out[n++], sha, ULP_SHA256_LEN);
	while (n < ULP_CHAIN_MAX) {
		const ulp_blob *b;
		ulp_centry *be;
		if (ulp_read_blob(a, out[n - 1], &be, &b) < 0)
			break;
		const ulp_blob_info *in = ulp_blob_get_info(b);
		int more = in->has_ref;
		if (more)
			memcpy(out[n++], in->ref_sha256, ULP_SHA256_LEN);
		ulp_cache_put(a->cache, be);
		if (!more)
			break;
	}
	return n;
}

/* Lets chunk k of every content of a chain go from the cache: a streamed
 * tensor's reference (and the links it was decoded through) would otherwise
 * stay cached whole. Each pass decodes its chunks again. */
void ulp_chain_retire(ulp_archive *a, const uint8_t (*chain)[ULP_SHA256_LEN], size_t n, uint32_t k)
{
	for (size_t i = 0; i < n; i++) {
		ulp_ckey key = {.chunk = k, .kind = ULP_CK_CHUNK};
		memcpy(key.sha, chain[i], ULP_SHA256_LEN);
		ulp_cache_retire(a->cache, &key);
	}
}

/* The encoder's view of the tensor, its reference (chunk by chunk through
 * the cache) and the spill. */
typedef struct sio {
	put *p;
	const job *j;
	size_t ref_cb;            /* bytes a chunk of the reference's blob */
	uint8_t (*chain)[ULP_SHA256_LEN]; /* the reference's chain (ulp_chain_of) */
	size_t n_chain;
	int spill;                /* fd */
	int ref_failed;           /* atomic */
} sio;

static int sio_get(void *arg, uint64_t off, size_t len, uint8_t *src, uint8_t *ref)
{
	sio *x = arg;
	ulp_archive *a = x->p->a;
	ULP_TRY(read_at(x->p, src, len, x->j->s->offset + off));
	while (ref && len) {
		uint32_t k = (uint32_t)(off / x->ref_cb);
		size_t in = (size_t)(off % x->ref_cb), l = 0;
		ulp_centry *e;
		const uint8_t *d;
		int rc = ulp_read_chunk(a, x->j->ref_sha, k, &e, &d, &l, NULL);
		if (rc < 0 || in >= l) {
			if (rc == 0)
				ulp_cache_put(a->cache, e);
			__atomic_store_n(&x->ref_failed, 1, __ATOMIC_RELAXED);
			return -ULP_E_CORRUPT;
		}
		size_t n = ULP_MIN(len, l - in);
		memcpy(ref, d + in, n);
		ulp_cache_put(a->cache, e);
		ulp_chain_retire(a, x->chain, x->n_chain, k); /* not kept */
		ref += n;
		off += n;
		len -= n;
	}
	return 0;
}

int ulp_spill_io(int fd, uint64_t off, void *p, size_t len, int wr)
{
	int e = wr ? ulp_pwrite_full(fd, p, len, off) : ulp_pread_full(fd, p, len, off);
	if (e)
		return ulp_errno_code(e) == -ULP_E_NOSPC ? -ULP_E_NOSPC : -ULP_E_IO;
	return 0;
}

static int sio_put(void *arg, uint64_t off, const void *p, size_t len)
{
	return ulp_spill_io(((sio *)arg)->spill, off, (void *)p, len, 1);
}

static int sio_read(void *arg, uint64_t off, void *p, size_t len)
{
	return ulp_spill_io(((sio *)arg)->spill, off, p, len, 0);
}

/* an unnamed file beside the packs (same file system, gone at close) */
int ulp_spill_open(ulp_archive *a)
{
	char d[4200];
	snprintf(d, sizeof(d), "%s/packs", a->dir);
#ifdef O_TMPFILE
	int fd = open(d, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd >= 0)
		return fd;
#endif
	char t[4300];
	snprintf(t, sizeof(t), "%s/spill-XXXXXX", d);
	int fd2 = mkstemp(t);
	if (fd2 >= 0)
		unlink(t);
	return fd2;
}

/* the blob to the pack leaf by leaf, its digest's leaves on the way */
typedef struct swrite {
	ulp_pack_writer *pw;
	uint64_t at;              /* the blob's offset in the pack */
	const ulp_senc *s;
	const ulp_senc_io *io;
	uint8_t *leaves;
	int rc;                   /* first error (atomic) */
} swrite;

static int job_stream_leaf(void *arg, size_t k)
{
	swrite *w = arg;
	size_t off = k * ULP_DIGEST_LEAF, len = (size_t)ULP_MIN((uint64_t)ULP_DIGEST_LEAF, w->s->blob_len - off);
	uint8_t *b = ulp_scratch(ULP_SCRATCH_CHECK, ULP_DIGEST_LEAF);
	int rc = b ? ulp_senc_read(w->s, w->io, off, len, b) : -ULP_E_NOMEM;
	if (rc == 0) {
		ulp_digest_leaves(b, len, w->leaves + k * ULP_SHA256_LEN);
		rc = ulp_pack_write_at(w->pw, w->at + off, b, len);
	}
	if (rc < 0) {
		int zero = 0;
		__atomic_compare_exchange_n(&w->rc, &zero, rc, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
	}
	return 0;
}

int ulp_senc_to_pack(ulp_pool *pool, ulp_pack_writer *pw, uint64_t at, const ulp_senc *s,
                     const ulp_senc_io *io, uint8_t blob_sha[ULP_SHA256_LEN])
{
	size_t m = ulp_digest_n_leaves(s->blob_len);
	swrite w = {pw, at, s, io, malloc(ULP_MAX(m, 1) * ULP_SHA256_LEN), 0};
	if (!w.leaves)
		return -ULP_E_NOMEM;
	ulp_pool_run(pool, m, job_stream_leaf, &w);
	ulp_digest_root(w.leaves, s->blob_len, blob_sha);
	free(w.leaves);
	return w.rc;
}

static int write_stream(put *p, job *j, const ulp_senc *s, const ulp_senc_io *io, ulp_pool *pool)
{
	int rc = 0;
	pthread_mutex_lock(&p->mu);
	if (!p->pw)
		rc = ulp_pack_writer_new(p->a, &p->pw);
	if (rc == 0)
		rc = ulp_pack_reserve(p->pw, (size_t)s->blob_len, &j->pack_off);
	pthread_mutex_unlock(&p->mu);
	if (rc == 0) {
		j->prewritten = 1;
		rc = ulp_senc_to_pack(pool, p->pw, j->pack_off, s, io, j->blob_sha);
	}
	if (rc < 0) {
		j->rc = rc;
		snprintf(j->err, sizeof(j->err), "%s: writing a streamed blob: %s", p->path,
		         rc == -ULP_E_IO || rc == -ULP_E_NOSPC ? ulp_archive_errmsg(p->a) : ulp_strerror(rc));
	}
	return rc;
}

/* Phase B of a streamed tensor (a lone job). */
static void code_stream(batch *bt, size_t i)
{
	job *j = &bt->j[i];
	put *p = bt->p;
	ulp_archive *a = p->a;
	ulp_pool *pool = a->pool;
	int rc = stream_hash(p, bt, j, pool);
	hash_in_order(bt, i, rc);
	if (rc < 0)
		return;
	int have = have_content(p, j->sha, &j->depth, 0);
	if (have < 0) {
		j->rc = have;
		snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(a));
		return;
	}
	if (have) {
		j->reuse = 1;
		return;
	}
	uint8_t chain[ULP_CHAIN_MAX][ULP_SHA256_LEN];
	sio x = {p, j, 0, chain, 0, ulp_spill_open(a), 0};
	if (x.spill < 0) {
		j->rc = -ULP_E_IO;
		snprintf(j->err, sizeof(j->err), "%s: a spill file in %s/packs: %s", p->path, a->dir, strerror(errno));
		return;
	}
	int has_ref = 0;
	if (j->try_ref) { /* the reference's chunk size, for sio_get */
		const ulp_blob *b;
		ulp_centry *be;
		if (ulp_read_blob(a, j->ref_sha, &be, &b) == 0) {
			const ulp_blob_info *in = ulp_blob_get_info(b);
			x.ref_cb = (size_t)in->chunk_elems * ulp_dtype_size(in->dtype);
			/* a delta's chunk k decodes against chunk k of its reference */
			has_ref = in->raw_bytes == j->len &&
			          x.ref_cb == ulp_dtype_size(j->s->dtype) << ULP_DEFAULT_CHUNK_LOG2;
			ulp_cache_put(a->cache, be);
			x.n_chain = ulp_chain_of(a, j->ref_sha, chain);
		}
	}
	ulp_senc_io io = {&x, sio_get, sio_put, sio_read};
	ulp_senc s;
	for (;;) {
		ulp_enc_opts o = {.ref_sha256 = has_ref ? j->ref_sha : NULL, .src_sha256 = j->sha,
		                  .format_version = a->blob_version};
		rc = ulp_encode_stream(&o, pool, j->s->dtype, j->len, has_ref, 0, &io, &s);
		if (rc < 0 && has_ref && x.ref_failed) { /* an unreadable reference: standalone */
			has_ref = 0;
			x.ref_failed = 0;
			continue;
		}
		break;
	}
	if (rc < 0) {
		j->rc = rc;
		if (rc == -ULP_E_CHECKSUM)
			snprintf(j->err, sizeof(j->err), "%s: verification before commit failed: a decoded chunk differs from its input", p->path);
		else if (rc == -ULP_E_IO)
			snprintf(j->err, sizeof(j->err), "%s", ulp_archive_errmsg(a));
		else
			snprintf(j->err, sizeof(j->err), "%s: coding %zu bytes: %s", p->path, j->len, ulp_strerror(rc));
	} else {
		j->blob_len = (size_t)s.blob_len;
		j->stream_chunk = s.chunk_bytes;
		j->codec = s.codec;
		j->used_ref = ulp_codec_uses_ref(s.codec);
		write_stream(p, j, &s, &io, pool);
		ulp_senc_free(&s);
	}
	close(x.spill);
}

/* Phase A for one segment: its buffer and its reference (reading, hashing
 * and deduplication happen in phase B). */
static int prepare_job(put *p, const seg *s, int64_t ref_file, job *j)
{
	ulp_archive *a = p->a;
	uint8_t *buf = j->buf, *blob = j->blob; /* reused buffers survive the reset */
	size_t buf_cap = j->buf_cap, blob_cap = j->blob_cap;
	memset(j, 0, sizeof(*j));
	j->blob = blob;
	j->blob_cap = blob_cap;
	j->s = s;
	j->len = (size_t)s->length;
	j->stream = streamed(s);
	if (j->stream) { /* its buffers are a window's (code_stream) */
		j->buf = buf;
		j->buf_cap = buf_cap;
	} else if (buf_cap < j->len || !buf) {
		free(buf);
		buf_cap = j->len ? j->len : 1;
		buf = ulp_alloc_big(buf_cap);
	}
	if (!j->stream) {
		j->buf = buf;
		j->buf_cap = buf ? buf_cap : 0;
	}
	if (!j->buf && !j->stream)
		return ulp_arch_err(a, -ULP_E_NOMEM, "%s: no memory for %zu bytes", p->path, j->len);
	/* the bytes are read by the job itself, in phase B */
	if (s->kind == SEG_TENSOR && p->res)
		p->res->tensors++;
	ulp_blobrow row;
	if (s->kind == SEG_TENSOR && ref_file >= 0 && j->len > 0 &&
	    (ulp_index_tensor(a, ref_file, s->name, (int)s->dtype, s->length, j->ref_sha, &row) == 0 ||
	     (s->alt && ulp_index_tensor(a, ref_file, s->alt, (int)s->dtype, s->length, j->ref_sha, &row) == 0)) &&
	    row.depth < a->max_chain) { /* invariant 3 */
		j->try_ref = 1;
		j->depth = row.depth;
	}
	return 0;
}

static void free_jobs(job *j, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(j[i].buf);
		free(j[i].blob);
		j[i].buf = j[i].blob = NULL;
		j[i].buf_cap = j[i].blob_cap = 0;
	}
}

#define MAX_JOBS 256

/*
 * The job set and its buffers outlive a file: fresh pages cost more than the
 * coding of the bytes in them (about 2.5 us a page), and a mount archives
 * file after file. One set is kept by the archive; a second writer at the
 * same time allocates its own. Buffers larger than ULP_SCRATCH_KEEP_MAX (a
 * huge tensor) are not kept.
 */
static job *take_jobs(ulp_archive *a)
{
	pthread_mutex_lock(&a->w->mu);
	job *j = a->w->spare_jobs;
	a->w->spare_jobs = NULL;
	pthread_mutex_unlock(&a->w->mu);
	return j ? j : calloc(MAX_JOBS, sizeof(job));
}

static void give_back_jobs(ulp_archive *a, job *j)
{
	for (size_t i = 0; i < MAX_JOBS; i++) {
		if (j[i].buf_cap > ULP_SCRATCH_KEEP_MAX) {
			free(j[i].buf);
			j[i].buf = NULL;
			j[i].buf_cap = 0;
		}
		if (j[i].blob_cap > ULP_SCRATCH_KEEP_MAX) {
			free(j[i].blob);
			j[i].blob = NULL;
			j[i].blob_cap = 0;
		}
	}
	pthread_mutex_lock(&a->w->mu);
	if (!a->w->spare_jobs) {
		a->w->spare_jobs = j;
		j = NULL;
	}
	pthread_mutex_unlock(&a->w->mu);
	if (j) {
		free_jobs(j, MAX_JOBS);
		free(j);
	}
}

void ulp_ingest_free_spare(ulp_archive *a)
{
	if (a->w->spare_jobs) {
		free_jobs(a->w->spare_jobs, MAX_JOBS);
		free(a->w->spare_jobs);
		a->w->spare_jobs = NULL;
	}
}

static int do_segments(put *p, const seg *segs, size_t n_segs, EVP_MD_CTX *fsha, int64_t ref_file)
{
	/* batches of 4 MiB a thread (or one larger segment): enough jobs for the
	 * pool to balance big and small tensors, memory bounded by the batch.
	 * A batch that starts with a tensor holds at least ULP_BATCH_MIN: a
	 * batch ends in a barrier (its last job codes while the other threads
	 * wait, then the next batch's phase A runs alone), and a tensor coded
	 * alone passes several more (counts, tables, coding, verification), so
	 * few threads want several tensors a batch: on 2 threads, batches of
	 * 8 MiB held one 8 MiB tensor each and import of bench 1b's run took
	 * 0.87-0.93 s (1.43-1.57x one thread); with 32 MiB, 0.78-0.82 s (1.84x).
	 * Opaque segments (zstd, one job each) keep 4 MiB a thread, and so
	 * does one thread (no one waits at its barriers; the larger batch cost
	 * it 5 %: more buffers live). */
	const int threads = ulp_pool_threads(p->a->pool);
	const size_t max_jobs = MAX_JOBS, seg_bytes = (size_t)ULP_MAX(2, threads) * ((size_t)4 << 20),
	             tensor_bytes = threads > 1 ? ULP_MAX(ULP_BATCH_MIN, seg_bytes) : seg_bytes;
	job *jobs = take_jobs(p->a);
	int rc = 0;
	if (!jobs)
		return -ULP_E_NOMEM;
	for (size_t i = 0; i < n_segs && rc == 0;) {
		size_t n = 0, bytes = 0;
		const size_t max_bytes = segs[i].kind == SEG_TENSOR ? tensor_bytes : seg_bytes;
		/* a streamed tensor is a batch of its own (a lone job) */
		while (i < n_segs && n < max_jobs && rc == 0 &&
		       (n == 0 || (bytes + segs[i].length <= max_bytes && !streamed(&segs[i]) && !jobs[0].stream))) {
			rc = prepare_job(p, &segs[i], ref_file, &jobs[n]);
			bytes += (size_t)segs[i].length;
			n++;
			i++;
		}
		if (rc < 0)
			break;
		batch bt = {.p = p, .j = jobs, .n = n, .lone = n == 1, .file_sha = fsha};
		ulp_pool_run(p->a->pool, n, code_job, &bt);
		/* phase C and the file's sha256 went on inside phase B: all done,
		 * or an error */
		if (bt.arc < 0)
			rc = ulp_arch_err(p->a, bt.arc, "%s", bt.aerr);
		else if (bt.appended != n || bt.hashed != n)
			rc = ulp_arch_err(p->a, -ULP_E_INVAL, "%s: internal: %zu and %zu of %zu segments appended and hashed",
			                  p->path, bt.appended, bt.hashed, n);
	}
	give_back_jobs(p->a, jobs);
	return rc;
}

/* Opaque bytes [off, off + len) as segments. */
static int add_opaque(seg **v, size_t *n, size_t *cap, uint64_t off, uint64_t len)
{
	while (len > 0) {
		uint64_t l = ULP_MIN(len, (uint64_t)ULP_SEGMENT);
		ULP_TRY(ulp_grow(v, cap, *n, sizeof(seg)));
		(*v)[(*n)++] = (seg){off, l, SEG_OPAQUE, NULL, ULP_DT_UNKNOWN, NULL};
		off += l;
		len -= l;
	}
	return 0;
}

/* How a file is cut into segments (invariant 4). */
typedef struct layout {
	int kind;               /* 0 opaque, 1 safetensors, 2 torch zip (ulp_stat.kind) */
	ulp_st *st;             /* kind 1: owns the tensor names */
	ulp_tz *tz;             /* kind 2: owns the storage names */
	ulp_dcp *dcp;           /* kind 2, a DCP rank file: owns the tensor names */
	seg *segs;
	size_t n, cap;
	uint64_t verbatim;      /* bytes in verbatim segments */
} layout;

static int add_seg(layout *L, uint64_t off, uint64_t len, int kind, const char *name, ulp_dtype dt)
{
	if (len == 0)
		return 0;
	if (kind == SEG_OPAQUE)
		return add_opaque(&L->segs, &L->n, &L->cap, off, len);
	ULP_TRY(ulp_grow(&L->segs, &L->cap, L->n, sizeof(seg)));
	L->segs[L->n++] = (seg){off, len, kind, name, dt, NULL};
	if (kind == SEG_VERBATIM)
		L->verbatim += len;
	return 0;
}

/* Bytes around a torch zip's storages: verbatim while small. */
static int add_gap(layout *L, uint64_t off, uint64_t len)
{
	int v = len <= ULP_VERBATIM_GAP && L->verbatim + len <= ULP_VERBATIM_TOTAL;
	return add_seg(L, off, len, v ? SEG_VERBATIM : SEG_OPAQUE, NULL, ULP_DT_UNKNOWN);
}

static int tz_read(void *arg, void *buf, size_t len, uint64_t off)
{
	return read_at(arg, buf, len, off);
}

/* The archived .metadata of the step directory of path (dcp.h names the
 * rank file's tensors by it), or NULL: none, too large, unreadable or not
 * parsed (then the tensors take their signature names). */
static ulp_dcp_meta *step_meta(ulp_archive *a, const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t dl = slash ? (size_t)(slash - path) + 1 : 0;
	char mp[ULP_PATH_MAX + 16];
	ulp_file *f = NULL;
	ulp_dcp_meta *m = NULL;
	if (dl + sizeof(".metadata") > sizeof(mp))
		return NULL;
	memcpy(mp, path, dl);
	memcpy(mp + dl, ".metadata", sizeof(".metadata"));
	if (ulp_file_open(a, mp, &f) < 0)
		return NULL;
	uint64_t n = ulp_file_get_stat(f)->size;
	uint8_t *b = n && n <= ULP_TZ_MAX_PICKLE ? malloc((size_t)n) : NULL;
	if (b && ulp_file_pread(f, b, (size_t)n, 0) == (int64_t)n && ulp_dcp_meta_parse(b, (size_t)n, &m, NULL, 0) < 0)
		m = NULL;
	free(b);
	ulp_file_close(f);
	return m;
}

static void layout_free(layout *L)
{
	ulp_st_free(L->st);
	ulp_tz_free(L->tz);
	ulp_dcp_free(L->dcp);
	free(L->segs);
}

/* Anything a parser does not accept is laid out opaque: only I/O fails. */
static int layout_file(put *P, uint64_t size, layout *L)
{
	uint8_t *head = NULL;
	int rc = 0;
	if (size >= 8) { /* safetensors? */
		uint8_t len8[8];
		ULP_TRY(read_at(P, len8, 8, 0));
		uint64_t hn = ulp_ld64(len8);
		if (hn <= (100u << 20) && hn + 8 <= size) {
			if (!(head = malloc((size_t)hn + 8)))
				return -ULP_E_NOMEM;
			if ((rc = read_at(P, head, (size_t)hn + 8, 0)) == 0 &&
			    ulp_st_parse(head, (size_t)hn + 8, size, &L->st, NULL, NULL, 0) == 0) {
				uint64_t at = hn + 8;
				L->kind = 1;
				rc = add_seg(L, 0, at, SEG_VERBATIM, NULL, ULP_DT_UNKNOWN);
				for (size_t i = 0; rc == 0 && i < ulp_st_count(L->st); i++) {
					const ulp_st_tensor *t = ulp_st_tensor_at(L->st, i);
					rc = add_seg(L, at, hn + 8 + t->begin - at, SEG_OPAQUE, NULL, ULP_DT_UNKNOWN);
					if (rc == 0)
						rc = add_seg(L, hn + 8 + t->begin, t->end - t->begin, SEG_TENSOR, t->name, t->dtype);
					at = hn + 8 + t->end;
				}
				if (rc == 0)
					rc = add_seg(L, at, size - at, SEG_OPAQUE, NULL, ULP_DT_UNKNOWN);
			}
			free(head);
			if (rc < 0 || L->kind)
				return rc;
		}
	}
	uint8_t sig[4];
	if (size >= 22 && (rc = read_at(P, sig, 4, 0)) == 0 && memcmp(sig, "PK\3\4", 4) == 0) {
		rc = ulp_tz_parse(tz_read, P, size, &L->tz, NULL, 0);
		if (rc == -ULP_E_IO)
			return rc;
		if (rc == 0) { /* storages as tensors, the rest verbatim (invariant 4) */
			uint64_t at = 0;
			L->kind = 2;
			for (size_t i = 0; rc == 0 && i < ulp_tz_count(L->tz); i++) {
				const ulp_tz_storage *t = ulp_tz_at(L->tz, i);
				rc = add_gap(L, at, t->offset - at);
				if (rc == 0)
					rc = add_seg(L, t->offset, t->length, SEG_TENSOR, t->name, t->dtype);
				at = t->offset + t->length;
			}
			return rc < 0 ? rc : add_gap(L, at, size - at);
		}
		/* a DCP rank file: torch.save records back to back (dcp.h) */
		uint64_t parsed;
		if (rc == -ULP_E_CORRUPT && ulp_dcp_name(P->path)) {
			ulp_dcp_meta *m = P->meta_names ? step_meta(P->a, P->path) : NULL;
			const char *base = strrchr(P->path, '/');
			rc = ulp_dcp_scan(tz_read, P, size, m, base ? base + 1 : P->path, &L->dcp, &parsed, NULL, 0);
			ulp_dcp_meta_free(m);
			if (rc == -ULP_E_IO || rc == -ULP_E_NOMEM)
				return rc;
		}
		if (rc == 0 && L->dcp) {
			uint64_t at = 0;
			L->kind = 2;
			for (size_t i = 0; rc == 0 && i < ulp_dcp_count(L->dcp); i++) {
				const ulp_dcp_tensor *t = ulp_dcp_at(L->dcp, i);
				rc = add_gap(L, at, t->offset - at);
				if (rc == 0 && (rc = add_seg(L, t->offset, t->length, SEG_TENSOR, t->name, t->dtype)) == 0)
					L->segs[L->n - 1].alt = t->alt;
				at = t->offset + t->length;
			}
			if (rc == 0)
				rc = add_gap(L, at, parsed - at);
			return rc < 0 ? rc : add_seg(L, parsed, size - parsed, SEG_OPAQUE, NULL, ULP_DT_UNKNOWN);
		}
	}
	if (rc == -ULP_E_IO)
		return rc;
	L->kind = 0;
	return add_opaque(&L->segs, &L->n, &L->cap, 0, size);
}

/* The header as stored: kind 2 compresses it (zstd, one frame). *out is
 * malloc'd, or P->vb itself (*owned 0). */
static int stored_header(put *P, int kind, uint8_t **out, size_t *len, int *owned)
{
	*owned = 0;
	*out = P->vb;
	*len = P->n_vb;
	if (kind != 2 || P->n_vb == 0)
		return 0;
	size_t cap = ZSTD_compressBound(P->n_vb);
	uint8_t *z = malloc(cap);
	if (!z)
		return -ULP_E_NOMEM;
	size_t n = ZSTD_compress(z, cap, P->vb, P->n_vb, 19);
	if (ZSTD_isError(n)) {
		free(z);
		return ulp_arch_err(P->a, -ULP_E_NOMEM, "%s: compressing the header: %s", P->path, ZSTD_getErrorName(n));
	}
	*out = z;
	*len = n;
	*owned = 1;
	return 0;
}

/*
 * A file coded: its blobs in a pack not yet durable, the rows that will name
 * them, and what they point into (the layout owns the tensor names of the
 * extents). ulp_archive_put commits it at once; a pipelined put (ulp_putq)
 * inserts its rows into a transaction left open and makes the pack durable
 * on a thread of its own while the next file codes (the inflight file).
 */
typedef struct coded {
	char path[4096];
	put P;
	layout L;
	uint8_t *head;
	size_t head_len;
	int head_owned;
	ulp_newfile nf;
	/* pipelined: */
	int src;                /* a dup of the file's fd: references of the next file
	                           not in the cache are read back from it (inflight_ref) */
	char pack_name[80];
	pthread_t syncer;
	int syncing;            /* syncer runs ulp_pack_commit */
	int sync_rc;            /* its result, once joined */
	char sync_err[600];
} coded;

/* ---- the file in flight (ulp_putq, invariant 2 there) ------------------- */

static const ulp_newblob *inflight_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN])
{
	const struct coded *c = a->w->inflight;
	if (!c)
		return NULL;
	for (size_t i = 0; i < c->P.n_nb; i++)
		if (memcmp(c->P.nb[i].content, sha, ULP_SHA256_LEN) == 0)
			return &c->P.nb[i];
	return NULL;
}

typedef struct iref {
	ulp_archive *a;
	const struct coded *c;
	const uint8_t *sha;
	uint8_t *dst;
	size_t len, chunk;
	uint64_t src_off;    /* where the content lies in the in-flight file's source */
	int missed;          /* atomic: a chunk was read from the source */
	int failed;          /* atomic */
} iref;

static int job_iref_chunk(void *arg, size_t k)
{
	iref *r = arg;
	size_t off = k * r->chunk, l = ULP_MIN(r->chunk, r->len - off);
	ulp_ckey key = {.chunk = (uint32_t)k, .kind = ULP_CK_CHUNK};
	memcpy(key.sha, r->sha, ULP_SHA256_LEN);
	ulp_centry *e;
	void *d;
	size_t size;
	if (ulp_cache_peek(r->a->cache, &key, &e, &d, &size)) {
		if (size == l)
			memcpy(r->dst + off, d, l);
		ulp_cache_put(r->a->cache, e);
		if (size == l)
			return 0;
	}
	__atomic_store_n(&r->missed, 1, __ATOMIC_RELAXED);
	if (ulp_pread_full(r->c->src, r->dst + off, l, r->src_off + off) != 0) {
		__atomic_store_n(&r->failed, 1, __ATOMIC_RELAXED);
		return 0;
	}
	return 0;
}

/* A reference that is a new blob of the file in flight: its chunks from the
 * cache (its coding seeded them), the rest read again from its source and
 * the whole checked against its digest (the source may have changed since).
 * 1: not in flight; 0: dst holds it; < 0: not available (coded standalone). */
static int inflight_ref(ulp_archive *a, ulp_pool *pool, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst,
                        size_t len)
{
	const ulp_newblob *nb = inflight_blob(a, sha);
	if (!nb)
		return 1;
	const struct coded *c = a->w->inflight;
	iref r = {a, c, sha, dst, len, nb->chunk, 0, 0, 0};
	size_t i = 0;
	while (i < c->P.n_nx && memcmp(c->P.nx[i].content, sha, ULP_SHA256_LEN) != 0)
		i++;
	if (nb->raw != len || !r.chunk || i == c->P.n_nx || c->P.nx[i].length != len || c->src < 0)
		return -ULP_E_NOENT;
	r.src_off = c->P.nx[i].offset;
	run_jobs(pool, (len + r.chunk - 1) / r.chunk, job_iref_chunk, &r);
	if (r.failed)
		return -ULP_E_IO;
	if (r.missed) {
		uint8_t d[ULP_SHA256_LEN];
		if (a->blob_version == 1)
			ulp_sha256(dst, len, d);
		else if (ulp_content_digest(pool, dst, len, d) < 0)
			return -ULP_E_NOMEM;
		if (memcmp(d, sha, ULP_SHA256_LEN) != 0)
			return -ULP_E_CHECKSUM;
	}
	return 0;
}


static void coded_free(coded *c, int discard)
{
	if (discard && c->P.pw)
		ulp_pack_discard(c->P.pw); /* invariant 2 */
	else
		ulp_pack_free(c->P.pw);
	c->P.pw = NULL;
	layout_free(&c->L);
	if (c->head_owned)
		free(c->head);
	free(c->P.vb);
	free(c->P.nb);
	free(c->P.nx);
	if (c->src >= 0)
		close(c->src);
	memset(c, 0, sizeof(*c));
	c->src = -1;
}

/* Everything before the commit: layout, reference, coding (do_segments),
 * the stored header and the file's row. On failure c holds nothing. The
 * caller holds a->w->write_mu. */
static int put_code(ulp_archive *a, const char *path, int fd, const ulp_meta *meta, ulp_put_result *res,
                    coded *c, int meta_names)
{
	struct stat sb;
	memset(c, 0, sizeof(*c));
	c->src = -1;
	char *p = c->path;
	int prc = ulp_path_clean(path, p, sizeof(c->path));
	if (prc == -ULP_E_NAMETOOLONG)
		return ulp_arch_err(a, prc, "%.200s...: a name over %d bytes or a path over %d bytes", path, ULP_NAME_MAX,
		                    ULP_PATH_MAX);
	if (prc < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: not a valid path inside an archive", path);
	if (fstat(fd, &sb) < 0)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	if (res)
		memset(res, 0, sizeof(*res));
	uint64_t size = (uint64_t)sb.st_size;
	c->P = (put){.a = a, .path = p, .fd = fd, .anchor = 1, .res = res, .meta_names = meta_names};
	put *P = &c->P;
	EVP_MD_CTX *fsha = EVP_MD_CTX_new();
	int rc = 0;
	if (!fsha || !EVP_DigestInit_ex(fsha, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(fsha);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_init(&P->mu, NULL);
	pthread_mutex_init(&P->hmu, NULL);
	__atomic_store_n(&a->w->put_done, 0, __ATOMIC_RELAXED); /* this file's progress */

	/* safetensors, torch zip or opaque: anything that does not parse is opaque */
	if ((rc = layout_file(P, size, &c->L)) < 0)
		goto out;

	/* the reference: the neighbour the layout of its series names (a new
	 * newest step is an anchor; layout.c) */
	int64_t ref_file = -1;
	char *series = NULL;
	int64_t step = ulp_parse_step(p, &series);
	if (c->L.kind && series)
		rc = ulp_layout_target(a, series, step, p, &ref_file, res ? res->ref_path : (char[512]){0}, 512);
	free(series);
	if (rc < 0)
		goto out;
	if ((rc = do_segments(P, c->L.segs, c->L.n, fsha, ref_file)) < 0)
		goto out;
	if ((rc = stored_header(P, c->L.kind, &c->head, &c->head_len, &c->head_owned)) < 0)
		goto out;
	if (c->L.kind == 2) /* its header is its own: counted (kind 1 keeps the old accounting) */
		P->stored += c->head_len;

	c->nf = (ulp_newfile){.path = p, .type = ULP_ENT_FILE, .kind = c->L.kind, .header = c->head,
	                      .header_len = c->head_len, .size = size, .stored = P->stored, .depth = P->depth,
	                      .anchor = P->anchor};
	if (meta) {
		c->nf.meta = *meta;
	} else {
		c->nf.meta.mode = sb.st_mode & 07777;
		c->nf.meta.uid = sb.st_uid;
		c->nf.meta.gid = sb.st_gid;
		c->nf.meta.mtime = ulp_time_make(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
	}
	unsigned int shalen;
	EVP_DigestFinal_ex(fsha, c->nf.sha, &shalen);
	if (res) {
		res->raw_bytes = size;
		res->stored_bytes = P->stored;
	}
out:
	__atomic_store_n(&a->w->put_done, 0, __ATOMIC_RELAXED);
	EVP_MD_CTX_free(fsha);
	pthread_mutex_destroy(&P->mu);
	pthread_mutex_destroy(&P->hmu);
	if (rc < 0) {
		coded_free(c, 1);
		if (res) /* nothing was archived */
			res->raw_bytes = res->stored_bytes = 0;
	}
	return rc;
}

/* The rows of c into the open transaction (its pack named, not yet durable). */
static int put_rows(ulp_archive *a, coded *c)
{
	if (c->P.pw)
		ulp_pack_seal(c->P.pw, c->pack_name);
	return ulp_index_put_file(a, &c->nf, c->P.pw ? c->pack_name : NULL, c->P.pw ? ulp_pack_size(c->P.pw) : 0,
	                          c->P.nb, c->P.n_nb, c->P.nx, c->P.n_nx);
}

int ulp_archive_put(ulp_archive *a, const char *path, int fd, const ulp_meta *meta,
                    ulp_put_result *res)
{
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	coded *c = malloc(sizeof(*c));
	if (!c)
		return -ULP_E_NOMEM;
	pthread_mutex_lock(&a->w->write_mu);
	int rc = put_code(a, path, fd, meta, res, c, 0), in_tx = 0;
	if (rc < 0)
		goto out0;
	/* commit: pack durable first, then the index */
	if ((rc = ulp_db_begin(a)) < 0)
		goto out;
	in_tx = 1;
	if (c->P.pw && (rc = ulp_pack_commit(c->P.pw, c->pack_name)) < 0)
		goto out;
	rc = put_rows(a, c);
	if (rc == 0)
		rc = ulp_db_commit(a);
	if (rc == 0)
		in_tx = 0;
out:
	if (in_tx)
		ulp_db_rollback(a);
	if (rc < 0 && res)
		res->raw_bytes = res->stored_bytes = 0;
	coded_free(c, rc < 0);
out0:
	pthread_mutex_unlock(&a->w->write_mu);
	free(c);
	return rc;
}

/* ---- pipelined put ------------------------------------------------------- */

/*
 * ulp_putq: file n codes while file n - 1's pack is made durable.
 *
 * Invariants:
 *  1. Invariant 2 holds per file: file n - 1's rows are in a transaction of
 *     the writing thread's connection, which commits only after its pack's
 *     ulp_pack_commit (fsync, rename, fsync of the directory) returned; if
 *     that fails the transaction rolls back and the pack is removed.
 *  2. File n sees file n - 1 as if it were committed: the writing thread's
 *     own lookups (its reference, ulp_layout_target; its reference tensors,
 *     prepare_job) read the open transaction; lookups on pool threads (other
 *     connections) go to the inflight file first: have_content (deduplication
 *     against its new blobs) and read_ref (a reference among its new blobs:
 *     the chunks its coding left in the cache, or else its bytes read again
 *     from its source and checked against their digest, inflight_ref). So
 *     the stored bytes are those of ulp_archive_put one file after another.
 *  3. At most one file is in flight; it is settled (committed or rolled back)
 *     after file n's coding and before file n's rows are written, so files
 *     commit in put order. If it fails, file n is not archived either (it
 *     may refer to it): the archive is as before file n - 1.
 *  4. Every call on a queue is made from the same thread (the transaction is
 *     that thread's connection's), and nothing else writes to the archive
 *     while a file is in flight (ulp_putq_flush first).
 *  5. While a queue lives, its thread's index commits do not fsync the WAL
 *     (synchronous=NORMAL: one disk flush a file less on the writing thread,
 *     the costliest wait left there; a crash still leaves the old state or
 *     the new, packs durable before any commit that names them, and a kill
 *     keeps every commit); ulp_putq_free fsyncs the WAL, after which a power
 *     loss loses none of the queue's files.
 */
struct ulp_putq {
	ulp_archive *a;
	coded *cur;             /* in flight (a->w->inflight), or NULL */
	unsigned committed;     /* files committed so far */
};

static void *syncer_main(void *arg)
{
	coded *c = arg;
	char name[80];
	c->sync_rc = ulp_pack_commit(c->P.pw, name);
	if (c->sync_rc < 0)
		snprintf(c->sync_err, sizeof(c->sync_err), "%s", ulp_archive_errmsg(c->P.a));
	return NULL;
}

/* The file in flight, committed or rolled back (invariant 3). */
static int settle(ulp_putq *q)
{
	ulp_archive *a = q->a;
	coded *c = q->cur;
	if (!c)
		return 0;
	int rc = 0;
	if (c->syncing) {
		pthread_join(c->syncer, NULL);
		c->syncing = 0;
		if ((rc = c->sync_rc) < 0)
			ulp_arch_err(a, rc, "%s: %s", c->path, c->sync_err);
	}
	if (rc == 0 && (rc = ulp_db_commit(a)) < 0) {
		char m[600];
		snprintf(m, sizeof(m), "%s", ulp_archive_errmsg(a));
		ulp_arch_err(a, rc, "%s: %s", c->path, m);
	}
	if (rc < 0)
		ulp_db_rollback(a);
	else
		q->committed++;
	a->w->inflight = NULL;
	coded_free(c, rc < 0);
	free(c);
	q->cur = NULL;
	return rc;
}

int ulp_putq_new(ulp_archive *a, ulp_putq **out)
{
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	ulp_putq *q = calloc(1, sizeof(*q));
	if (!q)
		return -ULP_E_NOMEM;
	q->a = a;
	/* invariant 5 */
	int rc = ulp_db_exec(a, "PRAGMA synchronous=NORMAL");
	if (rc < 0) {
		free(q);
		return rc;
	}
	*out = q;
	return 0;
}

int ulp_putq_put(ulp_putq *q, const char *path, int fd, const ulp_meta *meta, ulp_put_result *res)
{
	ulp_archive *a = q->a;
	coded *c = malloc(sizeof(*c));
	if (!c)
		return -ULP_E_NOMEM;
	pthread_mutex_lock(&a->w->write_mu);
	/* A file that may hold a streamed tensor (larger than ULP_STREAM_MIN)
	 * codes with nothing in flight: the streaming encoder opens its
	 * reference through the pool threads' index connections, which do not
	 * see the in-flight file's rows, and would code it standalone. Such a
	 * file codes for far longer than the fsync this gives up. */
	struct stat sb;
	/* A DCP rank file put just after its step's .metadata (an import)
	 * also: it is named by that .metadata, read from the index (dcp.h). */
	if (q->cur && ((fstat(fd, &sb) == 0 && (uint64_t)sb.st_size > ulp_stream_min()) ||
	               (ulp_dcp_name(path) && ulp_dcp_meta_name(q->cur->path)))) {
		int prc = settle(q);
		if (prc < 0) {
			char m[600];
			snprintf(m, sizeof(m), "%s", ulp_archive_errmsg(a));
			ulp_arch_err(a, prc, "%s (%s, put after it, not archived either)", m, path);
			free(c);
			pthread_mutex_unlock(&a->w->write_mu);
			return prc;
		}
	}
	a->w->inflight = q->cur;
	int rc = put_code(a, path, fd, meta, res, c, 1);
	/* the previous file settles now that nothing reads it any more */
	char why[600] = "";
	if (rc < 0)
		snprintf(why, sizeof(why), "%s", ulp_archive_errmsg(a));
	int prc = settle(q);
	if (prc < 0) { /* invariant 3: this file may refer to it */
		char m[600];
		snprintf(m, sizeof(m), "%s", ulp_archive_errmsg(a));
		ulp_arch_err(a, prc, "%s (%s, put after it, not archived either)", m, c->path[0] ? c->path : path);
		if (rc == 0) {
			coded_free(c, 1);
			if (res)
				res->raw_bytes = res->stored_bytes = 0;
		}
		free(c);
		pthread_mutex_unlock(&a->w->write_mu);
		return prc;
	}
	if (rc < 0) {
		ulp_arch_err(a, rc, "%s", why);
		free(c);
		pthread_mutex_unlock(&a->w->write_mu);
		return rc;
	}
	int in_tx = 0;
	if ((rc = ulp_db_begin(a)) == 0) {
		in_tx = 1;
		rc = put_rows(a, c);
	}
	if (rc == 0 && c->P.pw && (c->src = dup(fd)) < 0)
		rc = ulp_arch_err(a, -ULP_E_IO, "%s: dup: %s", c->path, strerror(errno));
	if (rc == 0 && c->P.pw) {
		if (pthread_create(&c->syncer, NULL, syncer_main, c) == 0)
			c->syncing = 1;
		else /* no thread: durable here */
			rc = ulp_pack_commit(c->P.pw, c->pack_name);
	}
	if (rc < 0) {
		if (in_tx)
			ulp_db_rollback(a);
		if (res)
			res->raw_bytes = res->stored_bytes = 0;
		coded_free(c, 1);
		free(c);
	} else {
		q->cur = c;
	}
	pthread_mutex_unlock(&a->w->write_mu);
	return rc;
}

int ulp_putq_flush(ulp_putq *q)
{
	pthread_mutex_lock(&q->a->w->write_mu);
	int rc = settle(q);
	pthread_mutex_unlock(&q->a->w->write_mu);
	return rc;
}

unsigned ulp_putq_committed(const ulp_putq *q)
{
	return q ? q->committed : 0;
}

/* The index's commits since ulp_putq_new, made durable: its WAL (and the
 * directory that holds it) fsynced (invariant 5). */
static int sync_wal(ulp_archive *a)
{
	char path[4300], live[4200];
	int rc = ulp_db_exec(a, "PRAGMA synchronous=FULL");
	ulp_db_live_path(a, live, sizeof(live));
	char *slash = strrchr(live, '/');
	for (int k = 0; k < 2 && rc == 0; k++) {
		if (k)
			snprintf(path, sizeof(path), "%.*s", slash ? (int)(slash - live) : 1, slash ? live : ".");
		else
			snprintf(path, sizeof(path), "%s-wal", live);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 && errno == ENOENT && !k)
			continue; /* no WAL: the commits are in the database file, synced by its checkpoint */
		if (fd < 0 || fsync(fd) < 0)
			rc = ulp_arch_err(a, errno == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: fsync: %s", path,
			                  strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	return rc;
}

int ulp_putq_free(ulp_putq *q)
{
	if (!q)
		return 0;
	int rc = ulp_putq_flush(q);
	pthread_mutex_lock(&q->a->w->write_mu);
	int src = sync_wal(q->a);
	pthread_mutex_unlock(&q->a->w->write_mu);
	free(q);
	return rc < 0 ? rc : src;
}

uint64_t ulp_archive_put_progress(const ulp_archive *a)
{
	return __atomic_load_n(&a->w->put_done, __ATOMIC_RELAXED);
}
