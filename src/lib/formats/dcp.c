/* SPDX-License-Identifier: MIT */
/*
 * dcp.c - the rank files of torch.distributed.checkpoint (dcp.h says what
 * they hold, why they are scanned rather than read through .metadata and
 * how their tensors are named).
 *
 * Invariants:
 *  1. Records tile [0, r) in order, back to back; each was accepted whole by
 *     ulp_tz_parse over exactly its window, so every tensor lies inside its
 *     record's data, and tensors are disjoint and sorted. A safetensors part
 *     after them (the SAFETENSORS serialization) was accepted whole by
 *     ulp_st_parse over [r, size); *parsed is then the end of its last
 *     tensor's data (of its header when it has none), else r.
 *  2. Every offset is checked against the file size before use, overflow
 *     free (torchzip.c's invariant 1 inside a window; here: pos + n <= size
 *     written n <= size - pos).
 *  3. Work and memory are bounded whatever the input: one chunk buffer
 *     (DCP_CHUNK), per record what ulp_tz_parse bounds, at most
 *     ULP_DCP_MAX_ITEMS records, and at most ULP_DCP_MAX_TRIES end-record
 *     candidates that fail to parse per record (ULP_DCP_MAX_FAILS per file),
 *     past which the rest of the file is left unparsed; the safetensors
 *     header at most ULP_DCP_MAX_STHEAD bytes.
 *  4. Names are unique in a file: a signature name "dcp.<dtype>.<bytes>.<k>"
 *     counts the tensors of that dtype and length before it (sig table);
 *     a .metadata name "<fqn>@<chunk offsets>" is unique because .metadata
 *     names each item once and the record is matched by its exact window;
 *     a safetensors part's names (the tensors' fully qualified names) are
 *     unique by ulp_st_parse, and a safetensors part is taken only when no
 *     record held a tensor; the names of several storages of one record
 *     get ".<storage>" appended. A .metadata name contains '@', and what
 *     follows its last '@' no '@', so it is its (fqn, chunk) alone; a
 *     hostile .metadata naming two windows alike: both fall back to their
 *     signature names (unique_names).
 */
#include "dcp.h"
#include <stdio.h>
#include <stdlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_EOCD  0x06054b50u
#define DCP_CHUNK ((size_t)1 << 20)

typedef struct sigent {
	uint64_t length;   /* 0: an empty slot */
	ulp_dtype dtype;
	size_t count;
} sigent;

struct ulp_dcp {
	ulp_dcp_tensor *t;
	size_t n, cap;
	size_t records;
	char **names;              /* owned, two per tensor (name, alt or NULL) */
	const ulp_dcp_item **mine; /* the .metadata's items of this file, by offset; not owned */
	size_t n_mine;
	sigent *sigs;                 /* open addressing, a power of two slots, at most half full */
	size_t n_sigs, cap_sigs;
	ulp_st *st;                /* the safetensors part, or NULL */
};

typedef struct win {
	ulp_tz_read_fn rd;
	void *arg;
	uint64_t base;
} win;

static int win_read(void *arg, void *buf, size_t len, uint64_t off)
{
	const win *w = arg;
	return w->rd(w->arg, buf, len, w->base + off);
}

void ulp_dcp_free(ulp_dcp *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < 2 * d->n; i++)
		free(d->names[i]);
	free(d->names);
	free(d->t);
	free(d->mine);
	free(d->sigs);
	ulp_st_free(d->st);
	free(d);
}

static size_t sig_hash(ulp_dtype dt, uint64_t len)
{
	uint64_t h = (len ^ ((uint64_t)dt << 56)) * 0x9e3779b97f4a7c15ull;
	return (size_t)(h >> 17);
}

/* The tensors of (dt, len) seen so far, then one more (invariant 4). */
static int sig_next(ulp_dcp *d, ulp_dtype dt, uint64_t len, size_t *k)
{
	if (2 * (d->n_sigs + 1) > d->cap_sigs) {
		size_t nc = d->cap_sigs ? 2 * d->cap_sigs : 64;
		sigent *ns = calloc(nc, sizeof(*ns));
		if (!ns)
			return -ULP_E_NOMEM;
		for (size_t i = 0; i < d->cap_sigs; i++) {
			if (!d->sigs[i].length)
				continue;
			size_t h = sig_hash(d->sigs[i].dtype, d->sigs[i].length) & (nc - 1);
			while (ns[h].length)
				h = (h + 1) & (nc - 1);
			ns[h] = d->sigs[i];
		}
		free(d->sigs);
		d->sigs = ns;
		d->cap_sigs = nc;
	}
	size_t h = sig_hash(dt, len) & (d->cap_sigs - 1);
	while (d->sigs[h].length && (d->sigs[h].length != len || d->sigs[h].dtype != dt))
		h = (h + 1) & (d->cap_sigs - 1);
	if (!d->sigs[h].length) {
		d->sigs[h] = (sigent){len, dt, 0};
		d->n_sigs++;
	}
	*k = d->sigs[h].count++;
	return 0;
}

/* The .metadata item of this file that is exactly [off, off + len), or NULL. */
static const ulp_dcp_item *item_at(const ulp_dcp *d, uint64_t off, uint64_t len)
{
	size_t lo = 0, hi = d->n_mine;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (d->mine[mid]->offset < off)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < d->n_mine && d->mine[lo]->offset == off; lo++)
		if (d->mine[lo]->length == len)
			return d->mine[lo];
	return NULL;
}

static int cmp_item(const void *x, const void *y)
{
	const ulp_dcp_item *a = *(const ulp_dcp_item *const *)x, *b = *(const ulp_dcp_item *const *)y;
	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* The items of meta in the rank file called file, sorted by offset. */
static int take_meta(ulp_dcp *d, const ulp_dcp_meta *meta, const char *file)
{
	if (!meta || !file)
		return 0;
	size_t n = ulp_dcp_meta_count(meta);
	if (n && !(d->mine = malloc(n * sizeof(*d->mine))))
		return -ULP_E_NOMEM;
	for (size_t i = 0; i < n; i++) {
		const ulp_dcp_item *it = ulp_dcp_meta_at(meta, i);
		if (strcmp(it->file, file) == 0)
			d->mine[d->n_mine++] = it;
	}
	qsort(d->mine, d->n_mine, sizeof(*d->mine), cmp_item);
	return 0;
}

/* "<fqn>@<o1>,<o2>,..." (+ ".<storage>"), or NULL when that would be too
 * long (the signature name serves alone then). */
static char *fqn_name(const ulp_dcp_item *it, const char *storage)
{
	size_t n = strlen(it->fqn) + 2 + (size_t)it->ndim * 21 + (storage ? strlen(storage) + 1 : 0);
	if (n > ULP_DCP_NAME_MAX)
		return NULL;
	char *s = malloc(n + 1);
	if (!s)
		return NULL;
	size_t k = (size_t)snprintf(s, n + 1, "%s@", it->fqn);
	for (uint32_t j = 0; j < it->ndim; j++)
		k += (size_t)snprintf(s + k, n + 1 - k, j ? ",%lld" : "%lld", (long long)it->chunk[j]);
	if (storage)
		snprintf(s + k, n + 1 - k, ".%s", storage);
	return s;
}

static int grow(ulp_dcp *d)
{
	if (d->n < d->cap)
		return 0;
	size_t nc = d->cap ? 2 * d->cap : 16;
	ulp_dcp_tensor *t = realloc(d->t, nc * sizeof(*t));
	if (!t)
		return -ULP_E_NOMEM;
	d->t = t;
	char **nm = realloc(d->names, 2 * nc * sizeof(*nm));
	if (!nm)
		return -ULP_E_NOMEM;
	d->names = nm;
	d->cap = nc;
	return 0;
}

/* One tensor: name and alt handed over (freed on failure). */
static int add_tensor(ulp_dcp *d, char *name, char *alt, ulp_dtype dt, uint64_t off, uint64_t len)
{
	if (!name || grow(d) < 0) {
		free(name);
		free(alt);
		return -ULP_E_NOMEM;
	}
	d->names[2 * d->n] = name;
	d->names[2 * d->n + 1] = alt;
	d->t[d->n++] = (ulp_dcp_tensor){name, alt, dt, off, len};
	return 0;
}

/* The storages of the record [base, end) as tensors of d: named by the
 * .metadata item of that window when there is one (the signature name its
 * alt), by their signature otherwise (dcp.h). */
static int add_record(ulp_dcp *d, const ulp_tz *tz, uint64_t base, uint64_t end)
{
	size_t ns = ulp_tz_count(tz);
	const ulp_dcp_item *it = item_at(d, base, end - base);
	for (size_t i = 0; i < ns; i++) {
		const ulp_tz_storage *s = ulp_tz_at(tz, i);
		const char *sub = ns == 1 ? NULL : s->name;
		size_t k;
		ULP_TRY(sig_next(d, s->dtype, s->length, &k));
		size_t n = 64 + (sub ? strlen(sub) : 0);
		char *sn = malloc(n);
		if (sn) {
			if (sub)
				snprintf(sn, n, "dcp.%s.%llu.%zu.%s", ulp_dtype_name(s->dtype), (unsigned long long)s->length, k, sub);
			else
				snprintf(sn, n, "dcp.%s.%llu.%zu", ulp_dtype_name(s->dtype), (unsigned long long)s->length, k);
		}
		char *fn = it && sn ? fqn_name(it, sub) : NULL;
		ULP_TRY(fn ? add_tensor(d, fn, sn, s->dtype, base + s->offset, s->length)
		           : add_tensor(d, sn, NULL, s->dtype, base + s->offset, s->length));
	}
	return 0;
}

/* The SAFETENSORS serialization: after the BYTE_IO records, one
 * safetensors file of the rank's tensors, named by their fully qualified
 * names. *end: where its last tensor's data ends (0: no such part). */
static int st_part(ulp_dcp *d, ulp_tz_read_fn rd, void *arg, uint64_t size, uint64_t r, uint64_t *end)
{
	uint8_t len8[8];
	*end = 0;
	if (size - r < 8 + 2)
		return 0;
	ULP_TRY(rd(arg, len8, 8, r));
	uint64_t hn = ulp_ld64(len8);
	if (hn < 2 || hn > ULP_DCP_MAX_STHEAD || hn > size - r - 8)
		return 0;
	uint8_t *head = malloc((size_t)hn + 8);
	if (!head)
		return -ULP_E_NOMEM;
	int rc = rd(arg, head, (size_t)hn + 8, r);
	if (rc == 0 && head[8] == '{' && ulp_st_parse(head, (size_t)hn + 8, size - r, &d->st, NULL, NULL, 0) == 0) {
		uint64_t data = r + 8 + hn;
		for (size_t i = 0; rc == 0 && i < ulp_st_count(d->st); i++) {
			const ulp_st_tensor *t = ulp_st_tensor_at(d->st, i);
			if (t->dtype == ULP_DT_UNKNOWN || t->end == t->begin)
				continue; /* left to the gaps around it */
			size_t n = strlen(t->name) + 1;
			char *nm = malloc(n);
			if (nm)
				memcpy(nm, t->name, n);
			rc = add_tensor(d, nm, NULL, t->dtype, data + t->begin, t->end - t->begin);
			*end = data + t->end;
		}
		if (rc == 0 && !*end)
			*end = data; /* no tensor: the header is understood all the same */
	} else if (rc == -ULP_E_CORRUPT) {
		rc = 0;
	}
	free(head);
	return rc;
}
/* The record starting at r: *end where it ends (0: none found), its
 * parse in *tz. *fails counts candidates that did not parse (invariant 3). */
static int one_record(ulp_tz_read_fn rd, void *arg, uint64_t size, uint64_t r, uint8_t *buf, unsigned *fails,
                      uint64_t *end, ulp_tz **tz, ulp_err *e)
{
	uint8_t sig[4];
	unsigned tries = 0;
	*end = 0;
	if (size - r < 30 + 22)
		return ULP_CORRUPT(e, "dcp: %llu bytes at %llu: too short for a record",
		                   (unsigned long long)(size - r), (unsigned long long)r);
	ULP_TRY(rd(arg, sig, 4, r));
	if (ulp_ld32(sig) != SIG_LOCAL)
		return ULP_CORRUPT(e, "dcp: no torch.save record at %llu", (unsigned long long)r);
	win w = {rd, arg, r};
	uint64_t pos = r + 30;
	while (size - pos >= 22) {
		size_t n = (size_t)ULP_MIN((uint64_t)DCP_CHUNK, size - pos);
		ULP_TRY(rd(arg, buf, n, pos));
		for (size_t i = 0; i + 4 <= n; i++) {
			const uint8_t *hit = memchr(buf + i, 'P', n - 3 - i);
			if (!hit)
				break;
			i = (size_t)(hit - buf);
			if (ulp_ld32(hit) != SIG_EOCD)
				continue;
			uint64_t eo = pos + i;
			if (size - eo < 22)
				break;
			uint8_t cl[2];
			if (i + 22 <= n)
				memcpy(cl, hit + 20, 2);
			else
				ULP_TRY(rd(arg, cl, 2, eo + 20));
			uint64_t stop = eo + 22 + ulp_ld16(cl);
			if (stop > size)
				continue;
			int rc = ulp_tz_parse(win_read, &w, stop - r, tz, NULL, 0);
			if (rc == 0) {
				*end = stop;
				return 0;
			}
			if (rc != -ULP_E_CORRUPT)
				return rc;
			if (++tries >= ULP_DCP_MAX_TRIES || ++*fails >= ULP_DCP_MAX_FAILS)
				return ULP_CORRUPT(e, "dcp: record at %llu: no end record that parses (%u tried)",
				                   (unsigned long long)r, tries);
		}
		if (n < DCP_CHUNK)
			break;
		pos += n - 3; /* a signature across the chunk boundary is seen next time */
	}
	return ULP_CORRUPT(e, "dcp: record at %llu has no end record", (unsigned long long)r);
}

static int cmp_name(const void *x, const void *y)
{
	const ulp_dcp_tensor *a = *(const ulp_dcp_tensor *const *)x, *b = *(const ulp_dcp_tensor *const *)y;
	return strcmp(a->name, b->name);
}

/* Invariant 4 for .metadata names: tensors named alike by a hostile
 * .metadata take their signature names. */
static int unique_names(ulp_dcp *d)
{
	if (d->n < 2 || !d->n_mine)
		return 0;
	ulp_dcp_tensor **by = malloc(d->n * sizeof(*by));
	if (!by)
		return -ULP_E_NOMEM;
	for (size_t i = 0; i < d->n; i++)
		by[i] = &d->t[i];
	qsort(by, d->n, sizeof(*by), cmp_name);
	for (size_t i = 0; i + 1 < d->n; i++) {
		size_t j = i + 1;
		while (j < d->n && strcmp(by[i]->name, by[j]->name) == 0)
			j++;
		for (size_t k = i; j > i + 1 && k < j; k++) {
			if (!by[k]->alt) /* a signature name: unique among them */
				continue;
			by[k]->name = by[k]->alt;
			by[k]->alt = NULL;
		}
		i = j - 1;
	}
	free(by);
	return 0;
}

int ulp_dcp_scan(ulp_tz_read_fn rd, void *arg, uint64_t size, const ulp_dcp_meta *meta, const char *file,
                 ulp_dcp **out, uint64_t *parsed, char *why, size_t cap)
{
	ulp_err e = {why, cap};
	*out = NULL;
	*parsed = 0;
	ulp_dcp *d = calloc(1, sizeof(*d));
	uint8_t *buf = malloc(DCP_CHUNK);
	int rc = 0;
	if (!d || !buf || take_meta(d, meta, file) < 0) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	unsigned fails = 0;
	uint64_t r = 0;
	int first = 0; /* the first record's failure, in e */
	while (r < size && d->records < ULP_DCP_MAX_ITEMS) {
		uint64_t end;
		ulp_tz *tz = NULL;
		/* a record's failure ends the scan; only the first one's is the file's */
		rc = one_record(rd, arg, size, r, buf, &fails, &end, &tz, d->records ? NULL : &e);
		if (rc == -ULP_E_CORRUPT) {
			first = !d->records;
			rc = 0;
			break;
		}
		if (rc < 0)
			goto out;
		rc = add_record(d, tz, r, end);
		ulp_tz_free(tz);
		if (rc < 0)
			goto out;
		d->records++;
		r = end;
	}
	*parsed = r;
	rc = unique_names(d);
	free(d->mine); /* meta is the caller's: nothing of it is kept */
	d->mine = NULL;
	d->n_mine = 0;
	if (rc < 0)
		goto out;
	/* records of tensors and a safetensors part are not mixed (invariant 4) */
	uint64_t st_end = 0;
	if (d->n == 0 && r < size && (rc = st_part(d, rd, arg, size, r, &st_end)) < 0)
		goto out;
	if (st_end) {
		*parsed = st_end;
	} else if (!d->records) {
		rc = first ? -ULP_E_CORRUPT : ULP_CORRUPT(&e, "dcp: no torch.save record");
		goto out;
	}
out:
	free(buf);
	if (rc < 0) {
		ulp_dcp_free(d);
		*parsed = 0;
		return rc;
	}
	*out = d;
	return 0;
}

typedef struct memsrc {
	const uint8_t *p;
	size_t n;
} memsrc;

static int mem_read(void *arg, void *buf, size_t len, uint64_t off)
{
	const memsrc *m = arg;
	if (off > m->n || len > m->n - off)
		return -ULP_E_CORRUPT;
	memcpy(buf, m->p + off, len);
	return 0;
}

int ulp_dcp_scan_mem(const uint8_t *data, size_t size, const ulp_dcp_meta *meta, const char *file, ulp_dcp **out,
                     uint64_t *parsed, char *why, size_t cap)
{
	memsrc m = {data, size};
	return ulp_dcp_scan(mem_read, &m, size, meta, file, out, parsed, why, cap);
}

size_t ulp_dcp_count(const ulp_dcp *d)
{
	return d->n;
}

size_t ulp_dcp_records(const ulp_dcp *d)
{
	return d->records;
}

const ulp_dcp_tensor *ulp_dcp_at(const ulp_dcp *d, size_t i)
{
	return i < d->n ? &d->t[i] : NULL;
}

int ulp_dcp_name(const char *path)
{
	size_t n = strlen(path);
	return n > 7 && strcmp(path + n - 7, ".distcp") == 0;
}

int ulp_dcp_meta_name(const char *path)
{
	const char *b = strrchr(path, '/');
	return strcmp(b ? b + 1 : path, ".metadata") == 0;
}
