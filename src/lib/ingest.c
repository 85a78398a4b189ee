/* SPDX-License-Identifier: MIT */
/*
 * ingest.c - archiving one file. A safetensors file is cut into its header
 * (kept verbatim in the index), its tensors (each a blob, coded against the
 * same tensor of the archived file of its series with the nearest step) and
 * any bytes between or after them; any other file into segments of
 * ULP_SEGMENT bytes, each a zstd (or raw) blob. Identical contents are
 * stored once.
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
 */
#include "arch_int.h"
#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ULP_SEGMENT ((size_t)4 << 20) /* bytes a segment of an opaque file: bounds memory */

typedef struct seg {
	uint64_t offset, length;
	const ulp_st_tensor *t; /* NULL: opaque bytes */
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
	ulp_put_result *res;
} put;

static int read_at(put *p, uint8_t *buf, size_t len, uint64_t off)
{
	size_t got = 0;
	while (got < len) {
		ssize_t r = pread(p->fd, buf + got, len - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return ulp_arch_err(p->a, -ULP_E_IO, "%s: read at byte %llu: %s", p->path,
			                    (unsigned long long)(off + got), r < 0 ? strerror(errno) : "file shrank while archiving");
		got += (size_t)r;
	}
	return 0;
}

/* A blob already in the archive or made earlier in this put? */
static int have_content(put *p, const uint8_t sha[ULP_SHA256_LEN], unsigned *depth)
{
	for (size_t i = 0; i < p->n_nb; i++)
		if (memcmp(p->nb[i].content, sha, ULP_SHA256_LEN) == 0) {
			*depth = p->nb[i].depth;
			return 1;
		}
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
	if (p->n_nx == p->cap_nx) {
		size_t nc = p->cap_nx ? p->cap_nx * 2 : 64;
		ulp_newext *n = realloc(p->nx, nc * sizeof(*n));
		if (!n)
			return -ULP_E_NOMEM;
		p->nx = n;
		p->cap_nx = nc;
	}
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

/* Codes one content (tensor or segment), checks it, appends it to the pack. */
static int store_blob(put *p, ulp_dtype dt, const uint8_t *src, size_t len,
                      const uint8_t sha[ULP_SHA256_LEN], const uint8_t *ref,
                      const uint8_t ref_sha[ULP_SHA256_LEN], unsigned ref_depth)
{
	ulp_archive *a = p->a;
	ulp_enc_opts o = {.ref_sha256 = ref ? ref_sha : NULL};
	size_t cap = ulp_encode_bound(dt, len, &o);
	uint8_t *blob = malloc(cap), *check = malloc(len ? len : 1);
	int rc = -ULP_E_NOMEM;
	if (!blob || !check)
		goto out;
	ulp_enc_stats st;
	int64_t n = ulp_encode(&o, a->pool, dt, blob, cap, src, len, ref, ref ? len : 0, &st);
	if (n < 0) {
		rc = ulp_arch_err(a, (int)n, "%s: encoding failed: %s", p->path, ulp_strerror((int)n));
		goto out;
	}
	/* invariant 1: decode what was written and compare */
	ulp_blob *b;
	char why[256];
	rc = ulp_blob_open(blob, (size_t)n, &b, why, sizeof(why));
	if (rc == 0) {
		int has_ref = ulp_blob_get_info(b)->has_ref;
		int64_t d = ulp_blob_decode(b, a->pool, check, len, has_ref ? ref : NULL, has_ref ? len : 0);
		rc = d == (int64_t)len && memcmp(check, src, len) == 0 &&
		     memcmp(ulp_blob_get_info(b)->content_sha256, sha, ULP_SHA256_LEN) == 0
		         ? 0 : -ULP_E_CHECKSUM;
		if (rc == 0 && !has_ref)
			ref = NULL; /* coded standalone after all (smaller) */
		ulp_blob_close(b);
		snprintf(why, sizeof(why), "decoded blob differs from its input");
	}
	if (rc < 0) {
		rc = ulp_arch_err(a, rc, "%s: verification before commit failed: %s", p->path, why);
		goto out;
	}
	if (!p->pw && (rc = ulp_pack_writer_new(a, &p->pw)) < 0)
		goto out;
	if (p->n_nb == p->cap_nb) {
		size_t nc = p->cap_nb ? p->cap_nb * 2 : 64;
		ulp_newblob *nbv = realloc(p->nb, nc * sizeof(*nbv));
		if (!nbv) {
			rc = -ULP_E_NOMEM;
			goto out;
		}
		p->nb = nbv;
		p->cap_nb = nc;
	}
	ulp_newblob *nb = &p->nb[p->n_nb];
	memset(nb, 0, sizeof(*nb));
	if ((rc = ulp_pack_append(p->pw, blob, (size_t)n, &nb->offset)) < 0)
		goto out;
	p->n_nb++;
	memcpy(nb->content, sha, ULP_SHA256_LEN);
	nb->codec = st.codec;
	nb->raw = len;
	nb->stored = (uint64_t)n;
	if (ref) {
		nb->has_ref = 1;
		memcpy(nb->ref, ref_sha, ULP_SHA256_LEN);
		nb->depth = ref_depth + 1;
	}
	p->stored += (uint64_t)n;
	if (p->res) {
		if (ref)
			p->res->deltas++;
		else if (dt != ULP_DT_UNKNOWN)
			p->res->anchors++;
	}
	rc = 0;
out:
	free(blob);
	free(check);
	return rc;
}

/* One segment: read, hash, dedup or code against the reference. */
static int do_segment(put *p, const seg *s, EVP_MD_CTX *file_sha, int64_t ref_file)
{
	ulp_archive *a = p->a;
	size_t len = (size_t)s->length;
	uint8_t *buf = malloc(len ? len : 1), *refbuf = NULL;
	uint8_t sha[ULP_SHA256_LEN], ref_sha[ULP_SHA256_LEN];
	unsigned depth = 0;
	int rc;
	if (!buf)
		return ulp_arch_err(a, -ULP_E_NOMEM, "%s: no memory for %zu bytes", p->path, len);
	if ((rc = read_at(p, buf, len, s->offset)) < 0)
		goto out;
	EVP_DigestUpdate(file_sha, buf, len);
	ulp_sha256(buf, len, sha);
	ulp_dtype dt = s->t ? s->t->dtype : ULP_DT_UNKNOWN;
	if (s->t && p->res)
		p->res->tensors++;
	rc = have_content(p, sha, &depth);
	if (rc < 0)
		goto out;
	if (rc == 1) { /* stored once */
		if (p->res)
			p->res->reused++;
		rc = add_extent(p, s->offset, s->length, sha, s->t ? s->t->name : NULL,
		                s->t ? (int)dt : -1, depth);
		goto out;
	}
	const uint8_t *ref = NULL;
	ulp_blobrow row;
	if (s->t && ref_file >= 0 && len > 0 &&
	    ulp_index_tensor(a, ref_file, s->t->name, (int)dt, s->length, ref_sha, &row) == 0 &&
	    row.depth < a->max_chain) {
		refbuf = malloc(len);
		if (refbuf && ulp_read_content(a, ref_sha, refbuf, len) == 0) {
			ref = refbuf;
			depth = row.depth;
		}
		/* an unreadable reference is no reason to fail: code standalone */
	}
	rc = store_blob(p, dt, buf, len, sha, ref, ref_sha, depth);
	if (rc == 0)
		rc = add_extent(p, s->offset, s->length, sha, s->t ? s->t->name : NULL, s->t ? (int)dt : -1,
		                p->nb[p->n_nb - 1].depth);
out:
	free(buf);
	free(refbuf);
	return rc;
}

/* Opaque bytes [off, off + len) as segments. */
static int add_opaque(seg **v, size_t *n, size_t *cap, uint64_t off, uint64_t len)
{
	while (len > 0) {
		uint64_t l = ULP_MIN(len, (uint64_t)ULP_SEGMENT);
		if (*n == *cap) {
			*cap = *cap ? *cap * 2 : 64;
			seg *nv = realloc(*v, *cap * sizeof(seg));
			if (!nv)
				return -ULP_E_NOMEM;
			*v = nv;
		}
		(*v)[(*n)++] = (seg){off, l, NULL};
		off += l;
		len -= l;
	}
	return 0;
}

int ulp_archive_put(ulp_archive *a, const char *path, int fd, const ulp_meta *meta,
                    ulp_put_result *res)
{
	char p[4096];
	struct stat sb;
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	if (ulp_path_clean(path, p, sizeof(p)) < 0 || !p[0])
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: not a valid path inside an archive", path);
	if (fstat(fd, &sb) < 0)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", p, strerror(errno));
	if (res)
		memset(res, 0, sizeof(*res));
	uint64_t size = (uint64_t)sb.st_size;
	put P = {.a = a, .path = p, .fd = fd, .anchor = 1, .res = res};
	ulp_st *st = NULL;
	seg *segs = NULL;
	size_t n_segs = 0, cap_segs = 0;
	EVP_MD_CTX *fsha = EVP_MD_CTX_new();
	uint8_t *head = NULL;
	size_t head_len = 0;
	int rc = 0, in_tx = 0, committed_pack = 0;
	if (!fsha || !EVP_DigestInit_ex(fsha, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(fsha);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_lock(&a->write_mu);

	/* safetensors? anything that does not parse is stored as opaque bytes */
	if (size >= 8) {
		uint8_t len8[8];
		if ((rc = read_at(&P, len8, 8, 0)) < 0)
			goto out;
		uint64_t hn = ulp_ld64(len8);
		if (hn <= (100u << 20) && hn + 8 <= size) {
			head = malloc((size_t)hn + 8);
			if (!head) {
				rc = -ULP_E_NOMEM;
				goto out;
			}
			if ((rc = read_at(&P, head, (size_t)hn + 8, 0)) < 0)
				goto out;
			if (ulp_st_parse(head, (size_t)hn + 8, size, &st, NULL, NULL, 0) == 0)
				head_len = (size_t)hn + 8;
		}
	}
	if (st) {
		uint64_t at = head_len;
		for (size_t i = 0; i < ulp_st_count(st); i++) {
			const ulp_st_tensor *t = ulp_st_tensor_at(st, i);
			if ((rc = add_opaque(&segs, &n_segs, &cap_segs, at, head_len + t->begin - at)) < 0)
				goto out;
			if (n_segs == cap_segs) {
				cap_segs = cap_segs ? cap_segs * 2 : 64;
				seg *nv = realloc(segs, cap_segs * sizeof(seg));
				if (!nv) {
					rc = -ULP_E_NOMEM;
					goto out;
				}
				segs = nv;
			}
			segs[n_segs++] = (seg){head_len + t->begin, t->end - t->begin, t};
			at = head_len + t->end;
		}
		if ((rc = add_opaque(&segs, &n_segs, &cap_segs, at, size - at)) < 0)
			goto out;
		EVP_DigestUpdate(fsha, head, head_len);
	} else {
		if ((rc = add_opaque(&segs, &n_segs, &cap_segs, 0, size)) < 0)
			goto out;
	}

	/* the reference: the nearest step of the same series */
	int64_t ref_file = -1;
	char *series = NULL;
	int64_t step = ulp_parse_step(p, &series);
	if (st && series)
		rc = ulp_index_nearest(a, series, step, p, &ref_file, res ? res->ref_path : (char[512]){0}, 512);
	free(series);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < n_segs; i++)
		if ((rc = do_segment(&P, &segs[i], fsha, ref_file)) < 0)
			goto out;

	ulp_newfile nf = {.path = p, .type = ULP_ENT_FILE, .kind = st != NULL, .header = head,
	                  .header_len = head_len, .size = size, .stored = P.stored, .depth = P.depth,
	                  .anchor = P.anchor};
	if (meta) {
		nf.meta = *meta;
	} else {
		nf.meta.mode = sb.st_mode & 07777;
		nf.meta.uid = sb.st_uid;
		nf.meta.gid = sb.st_gid;
		nf.meta.mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
	}
	unsigned int shalen;
	EVP_DigestFinal_ex(fsha, nf.sha, &shalen);

	/* commit: pack durable first, then the index */
	if ((rc = ulp_db_begin(a)) < 0)
		goto out;
	in_tx = 1;
	char pack_name[80];
	if (P.pw) {
		if ((rc = ulp_pack_commit(P.pw, pack_name)) < 0)
			goto out;
		committed_pack = 1;
	}
	rc = ulp_index_put_file(a, &nf, P.pw ? pack_name : NULL, P.pw ? ulp_pack_size(P.pw) : 0, P.nb,
	                        P.n_nb, P.nx, P.n_nx);
	if (rc == 0)
		rc = ulp_db_commit(a);
	if (rc == 0) {
		in_tx = 0;
		if (res) {
			res->raw_bytes = size;
			res->stored_bytes = P.stored;
		}
	}
out:
	if (in_tx)
		ulp_db_rollback(a);
	if (rc < 0 && P.pw)
		ulp_pack_discard(P.pw, committed_pack); /* invariant 2 */
	else
		ulp_pack_free(P.pw);
	pthread_mutex_unlock(&a->write_mu);
	EVP_MD_CTX_free(fsha);
	ulp_st_free(st);
	free(segs);
	free(head);
	free(P.nb);
	free(P.nx);
	return rc;
}
