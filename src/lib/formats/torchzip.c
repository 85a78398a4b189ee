/* SPDX-License-Identifier: MIT */
/*
 * torchzip.c - the ZIP container of torch.save files: end of central
 * directory (ZIP64 included), central directory, local headers, then the
 * pickle (pickle.c) to learn each storage's dtype and name.
 *
 * Only what torch writes is accepted: one disk, stored (method 0) entries
 * with equal compressed and uncompressed sizes, no encryption, unique names,
 * local headers agreeing with the central directory, records (local header
 * plus data) in the file before the central directory and not overlapping,
 * the directory ending where the (ZIP64) end record begins, that record
 * ending the file. Anything else is CORRUPT: the caller stores the file
 * opaque.
 *
 * Invariants:
 *  1. Every offset and size read from the file is checked against the file
 *     size before use, with overflow-free arithmetic (a + b <= c is written
 *     b <= c && a <= c - b).
 *  2. The storages returned lie inside records' data, so they are disjoint
 *     and sorted by offset once sorted; each has length = numel x itemsize.
 *  3. Allocation is bounded by ULP_TZ_MAX_CD, ULP_TZ_MAX_ENTRIES and
 *     ULP_TZ_MAX_PICKLE, never by a size field alone.
 */
#include "torchzip.h"
#include <stdio.h>
#include <stdlib.h>

#define SIG_LOCAL  0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD   0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64  0x07064b50u

typedef struct zent {
	const uint8_t *name;  /* into the central directory buffer */
	size_t name_len;
	uint64_t size;        /* stored = uncompressed */
	uint64_t lho;         /* local header offset */
	uint64_t data;        /* data offset (after the local header) */
} zent;

struct ulp_tz {
	ulp_tz_storage *st;
	size_t n;
	ulp_pk *pk;           /* owns the names */
};

typedef struct zp {
	ulp_tz_read_fn rd;
	void *arg;
	uint64_t size;
	ulp_err *e;
} zp;

/* a + b <= lim without overflow (invariant 1) */
static int fits(uint64_t a, uint64_t b, uint64_t lim)
{
	return b <= lim && a <= lim - b;
}

static int rd(zp *z, void *buf, size_t len, uint64_t off)
{
	if (!fits(off, len, z->size))
		return ULP_CORRUPT(z->e, "zip: read of %zu bytes at %llu past the end", len, (unsigned long long)off);
	return z->rd(z->arg, buf, len, off);
}

/* The ZIP64 extended information in an extra field: replaces each of
 * *usize, *csize, *lho whose 32-bit value was 0xFFFFFFFF, in that order. */
static int zip64_extra(zp *z, const uint8_t *x, size_t n, uint64_t *usize, uint64_t *csize, uint64_t *lho)
{
	int seen = 0;
	while (n >= 4) {
		unsigned id = ulp_ld16(x), len = ulp_ld16(x + 2);
		if (len > n - 4)
			return ULP_CORRUPT(z->e, "zip: extra field past its end");
		if (id == 0x0001) {
			if (seen++)
				return ULP_CORRUPT(z->e, "zip: two ZIP64 extra fields");
			const uint8_t *v = x + 4;
			size_t left = len;
			uint64_t *f[3] = {usize, csize, lho};
			for (int i = 0; i < 3; i++) {
				if (!f[i] || *f[i] != 0xFFFFFFFFu)
					continue;
				if (left < 8)
					return ULP_CORRUPT(z->e, "zip: short ZIP64 extra field");
				*f[i] = ulp_ld64(v);
				v += 8;
				left -= 8;
			}
		}
		x += 4 + len;
		n -= 4 + len;
	}
	if (n)
		return ULP_CORRUPT(z->e, "zip: extra field past its end");
	if ((usize && *usize == 0xFFFFFFFFu && !seen) || (csize && *csize == 0xFFFFFFFFu && !seen) ||
	    (lho && *lho == 0xFFFFFFFFu && !seen))
		return ULP_CORRUPT(z->e, "zip: ZIP64 value without its extra field");
	return 0;
}

/* Where the central directory is: *cd_off, *cd_size, *count. */
static int find_cd(zp *z, uint64_t *cd_off, uint64_t *cd_size, uint64_t *count)
{
	uint8_t tail[22 + 65535];
	size_t t = (size_t)ULP_MIN(z->size, (uint64_t)sizeof(tail));
	if (t < 22)
		return ULP_CORRUPT(z->e, "zip: too short");
	ULP_TRY(rd(z, tail, t, z->size - t));
	/* the end record, with its comment, ends the file */
	size_t i = t - 22;
	for (;; i--) {
		if (ulp_ld32(tail + i) == SIG_EOCD && i + 22 + ulp_ld16(tail + i + 20) == t)
			break;
		if (i == 0)
			return ULP_CORRUPT(z->e, "zip: no end of central directory");
	}
	const uint8_t *r = tail + i;
	uint64_t eocd = z->size - t + i, end = eocd;
	if (ulp_ld16(r + 4) != 0 || ulp_ld16(r + 6) != 0 || ulp_ld16(r + 8) != ulp_ld16(r + 10))
		return ULP_CORRUPT(z->e, "zip: more than one disk");
	*count = ulp_ld16(r + 10);
	*cd_size = ulp_ld32(r + 12);
	*cd_off = ulp_ld32(r + 16);
	if (eocd >= 20) {
		uint8_t loc[20], r64[56];
		ULP_TRY(rd(z, loc, 20, eocd - 20));
		if (ulp_ld32(loc) == SIG_LOC64) {
			uint64_t o = ulp_ld64(loc + 8);
			if (ulp_ld32(loc + 4) != 0 || ulp_ld32(loc + 16) != 1 || !fits(o, 56, eocd - 20))
				return ULP_CORRUPT(z->e, "zip: bad ZIP64 locator");
			ULP_TRY(rd(z, r64, 56, o));
			/* the record (12 bytes + its size) ends at the locator */
			if (ulp_ld32(r64) != SIG_EOCD64 || ulp_ld64(r64 + 4) > eocd - 20 ||
			    o + 12 + ulp_ld64(r64 + 4) != eocd - 20 || ulp_ld64(r64 + 4) < 44)
				return ULP_CORRUPT(z->e, "zip: bad ZIP64 end record");
			if (ulp_ld32(r64 + 16) != 0 || ulp_ld32(r64 + 20) != 0 || ulp_ld64(r64 + 24) != ulp_ld64(r64 + 32))
				return ULP_CORRUPT(z->e, "zip: more than one disk");
			/* a 32-bit field not saturated must agree with the 64-bit one */
			uint64_t c64 = ulp_ld64(r64 + 32), s64 = ulp_ld64(r64 + 40), o64 = ulp_ld64(r64 + 48);
			if ((*count != 0xFFFF && *count != c64) || (*cd_size != 0xFFFFFFFFu && *cd_size != s64) ||
			    (*cd_off != 0xFFFFFFFFu && *cd_off != o64))
				return ULP_CORRUPT(z->e, "zip: ZIP64 end record disagrees with the end record");
			*count = c64;
			*cd_size = s64;
			*cd_off = o64;
			end = o;
		}
	}
	if (*cd_off > end || *cd_size != end - *cd_off)
		return ULP_CORRUPT(z->e, "zip: central directory does not end at its end record");
	if (*cd_size > ULP_TZ_MAX_CD || *count > ULP_TZ_MAX_ENTRIES || *count == 0 || *count > *cd_size / 46)
		return ULP_CORRUPT(z->e, "zip: %llu entries in %llu directory bytes", (unsigned long long)*count,
		                   (unsigned long long)*cd_size);
	return 0;
}

static int parse_cd(zp *z, const uint8_t *cd, uint64_t cd_size, uint64_t cd_off, zent *ent, size_t count)
{
	size_t at = 0;
	for (size_t i = 0; i < count; i++) {
		if (cd_size - at < 46 || ulp_ld32(cd + at) != SIG_CENTRAL)
			return ULP_CORRUPT(z->e, "zip: bad central directory entry %zu", i);
		const uint8_t *h = cd + at;
		unsigned flags = ulp_ld16(h + 8), method = ulp_ld16(h + 10);
		size_t nl = ulp_ld16(h + 28), xl = ulp_ld16(h + 30), cl = ulp_ld16(h + 32);
		uint64_t csize = ulp_ld32(h + 20), usize = ulp_ld32(h + 24), lho = ulp_ld32(h + 42);
		if (cd_size - at - 46 < nl + xl + cl)
			return ULP_CORRUPT(z->e, "zip: central directory entry %zu past its end", i);
		if ((flags & 1) || method != 0)
			return ULP_CORRUPT(z->e, "zip: entry %zu is encrypted or compressed", i);
		if (ulp_ld16(h + 34) != 0 && ulp_ld16(h + 34) != 0xFFFF)
			return ULP_CORRUPT(z->e, "zip: entry %zu on another disk", i);
		ULP_TRY(zip64_extra(z, h + 46 + nl, xl, &usize, &csize, &lho));
		if (csize != usize)
			return ULP_CORRUPT(z->e, "zip: entry %zu sizes differ", i);
		if (nl == 0 || memchr(h + 46, 0, nl))
			return ULP_CORRUPT(z->e, "zip: entry %zu has a bad name", i);
		if (!fits(lho, 30 + nl, cd_off))
			return ULP_CORRUPT(z->e, "zip: entry %zu local header out of range", i);
		ent[i] = (zent){h + 46, nl, usize, lho, 0};
		at += 46 + nl + xl + cl;
	}
	if (at != cd_size)
		return ULP_CORRUPT(z->e, "zip: %llu bytes after the central directory entries",
		                   (unsigned long long)(cd_size - at));
	return 0;
}

/* The local header of e agrees with its directory entry; sets e->data. */
static int check_local(zp *z, zent *e, uint64_t cd_off)
{
	uint8_t h[30 + 65535 + 65535];
	ULP_TRY(rd(z, h, 30, e->lho));
	size_t nl = ulp_ld16(h + 26), xl = ulp_ld16(h + 28);
	if (ulp_ld32(h) != SIG_LOCAL || nl != e->name_len || !fits(e->lho, 30 + nl + xl, cd_off))
		return ULP_CORRUPT(z->e, "zip: bad local header at %llu", (unsigned long long)e->lho);
	unsigned flags = ulp_ld16(h + 6);
	uint64_t csize = ulp_ld32(h + 18), usize = ulp_ld32(h + 22);
	ULP_TRY(rd(z, h + 30, nl + xl, e->lho + 30));
	if ((flags & 1) || ulp_ld16(h + 8) != 0 || memcmp(h + 30, e->name, nl) != 0)
		return ULP_CORRUPT(z->e, "zip: local header at %llu disagrees with the directory",
		                   (unsigned long long)e->lho);
	ULP_TRY(zip64_extra(z, h + 30 + nl, xl, &usize, &csize, NULL));
	/* with a data descriptor (flag 3) the sizes may be left zero */
	if (!((flags & 8) && csize == 0 && usize == 0) && (csize != e->size || usize != e->size))
		return ULP_CORRUPT(z->e, "zip: local sizes at %llu disagree with the directory",
		                   (unsigned long long)e->lho);
	e->data = e->lho + 30 + nl + xl;
	if (!fits(e->data, e->size, cd_off))
		return ULP_CORRUPT(z->e, "zip: record at %llu runs into the central directory",
		                   (unsigned long long)e->lho);
	return 0;
}

static int cmp_name(const void *a, const void *b)
{
	const zent *x = *(const zent *const *)a, *y = *(const zent *const *)b;
	int c = memcmp(x->name, y->name, ULP_MIN(x->name_len, y->name_len));
	return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int cmp_lho(const void *a, const void *b)
{
	const zent *x = a, *y = b;
	return (x->lho > y->lho) - (x->lho < y->lho);
}

static int cmp_off(const void *a, const void *b)
{
	const ulp_tz_storage *x = a, *y = b;
	return (x->offset > y->offset) - (x->offset < y->offset);
}

static const zent *find_name(zent *const *by_name, size_t n, const char *name, size_t len)
{
	zent key = {(const uint8_t *)name, len, 0, 0, 0};
	const zent *kp = &key;
	zent *const *r = bsearch(&kp, by_name, n, sizeof(*by_name), cmp_name);
	return r ? *r : NULL;
}

int ulp_tz_parse(ulp_tz_read_fn rdf, void *arg, uint64_t size, ulp_tz **out, char *why, size_t cap)
{
	ulp_err e = {why, cap};
	zp z = {rdf, arg, size, &e};
	uint64_t cd_off, cd_size, count;
	uint8_t *cd = NULL, *pkl = NULL;
	zent *ent = NULL, **by_name = NULL;
	ulp_tz *tz = NULL;
	char *sname = NULL;
	*out = NULL;
	int rc = find_cd(&z, &cd_off, &cd_size, &count);
	if (rc < 0)
		return rc;
	size_t n = (size_t)count;
	cd = malloc((size_t)cd_size);
	ent = calloc(n, sizeof(*ent));
	by_name = calloc(n, sizeof(*by_name));
	tz = calloc(1, sizeof(*tz));
	if (!cd || !ent || !by_name || !tz) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	if ((rc = rd(&z, cd, (size_t)cd_size, cd_off)) < 0 || (rc = parse_cd(&z, cd, cd_size, cd_off, ent, n)) < 0)
		goto out;
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = check_local(&z, &ent[i], cd_off);
	if (rc < 0)
		goto out;
	/* records do not overlap (nor share a local header) */
	qsort(ent, n, sizeof(*ent), cmp_lho);
	for (size_t i = 0; i + 1 < n; i++)
		if (ent[i].data + ent[i].size > ent[i + 1].lho) {
			rc = ULP_CORRUPT(&e, "zip: records at %llu and %llu overlap", (unsigned long long)ent[i].lho,
			                 (unsigned long long)ent[i + 1].lho);
			goto out;
		}
	for (size_t i = 0; i < n; i++)
		by_name[i] = &ent[i];
	qsort(by_name, n, sizeof(*by_name), cmp_name);
	for (size_t i = 0; i + 1 < n; i++)
		if (cmp_name(&by_name[i], &by_name[i + 1]) == 0) {
			rc = ULP_CORRUPT(&e, "zip: duplicate name '%.*s'", (int)ULP_MIN(by_name[i]->name_len, 200),
			                 by_name[i]->name);
			goto out;
		}
	/* the pickle: the one "<stem>/data.pkl" */
	const zent *pk = NULL;
	size_t stem = 0;
	for (size_t i = 0; i < n; i++) {
		const zent *x = &ent[i];
		const uint8_t *sl = memchr(x->name, '/', x->name_len);
		if (sl && (size_t)(sl - x->name) + 9 == x->name_len && memcmp(sl, "/data.pkl", 9) == 0) {
			if (pk) {
				rc = ULP_CORRUPT(&e, "zip: two pickles");
				goto out;
			}
			pk = x;
			stem = (size_t)(sl - x->name);
		}
	}
	if (!pk || pk->size > ULP_TZ_MAX_PICKLE) {
		rc = ULP_CORRUPT(&e, "zip: no data.pkl (or too large)");
		goto out;
	}
	if (!(pkl = malloc(pk->size ? (size_t)pk->size : 1))) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	if ((rc = rd(&z, pkl, (size_t)pk->size, pk->data)) < 0 ||
	    (rc = ulp_pk_parse(pkl, (size_t)pk->size, &tz->pk, why, cap)) < 0)
		goto out;
	size_t ns = ulp_pk_count(tz->pk);
	if (!(tz->st = calloc(ns ? ns : 1, sizeof(*tz->st))) || !(sname = malloc(stem + 6 + 257))) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	memcpy(sname, pk->name, stem);
	memcpy(sname + stem, "/data/", 6);
	for (size_t i = 0; i < ns; i++) {
		const ulp_pk_storage *s = ulp_pk_at(tz->pk, i);
		if (s->dtype == ULP_DT_UNKNOWN) /* not coded: its bytes stay as they are */
			continue;
		size_t kl = strlen(s->key); /* <= 256 (pickle.c) */
		memcpy(sname + stem + 6, s->key, kl);
		const zent *x = find_name(by_name, n, sname, stem + 6 + kl);
		unsigned es = ulp_dtype_size(s->dtype);
		if (!x || s->numel > UINT64_MAX / es || s->numel * es != x->size) {
			rc = ULP_CORRUPT(&e, "zip: storage '%s' %s", s->key,
			                 x ? "size differs from numel x itemsize" : "has no record");
			goto out;
		}
		if (x->size)
			tz->st[tz->n++] = (ulp_tz_storage){s->name, s->dtype, x->data, x->size};
	}
	qsort(tz->st, tz->n, sizeof(*tz->st), cmp_off);
	for (size_t i = 0; i + 1 < tz->n; i++) /* invariant 2, checked */
		if (tz->st[i].offset + tz->st[i].length > tz->st[i + 1].offset) {
			rc = ULP_CORRUPT(&e, "zip: storages overlap");
			goto out;
		}
out:
	free(cd);
	free(ent);
	free(by_name);
	free(pkl);
	free(sname);
	if (rc < 0) {
		ulp_tz_free(tz);
		return rc;
	}
	*out = tz;
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

int ulp_tz_parse_mem(const uint8_t *data, size_t size, ulp_tz **out, char *why, size_t cap)
{
	memsrc m = {data, size};
	return ulp_tz_parse(mem_read, &m, size, out, why, cap);
}

size_t ulp_tz_count(const ulp_tz *z)
{
	return z->n;
}

const ulp_tz_storage *ulp_tz_at(const ulp_tz *z, size_t i)
{
	return i < z->n ? &z->st[i] : NULL;
}

void ulp_tz_free(ulp_tz *z)
{
	if (!z)
		return;
	ulp_pk_free(z->pk);
	free(z->st);
	free(z);
}
