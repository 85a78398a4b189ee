/* SPDX-License-Identifier: MIT */
/*
 * dcp.c - the rank files of torch.distributed.checkpoint (dcp.h says what
 * they hold and why they are scanned rather than read through .metadata).
 *
 * Invariants:
 *  1. Records tile [0, *parsed) in order, back to back; each was accepted
 *     whole by ulp_tz_parse over exactly its window, so every tensor lies
 *     inside its record's data, and tensors are disjoint and sorted.
 *  2. Every offset is checked against the file size before use, overflow
 *     free (torchzip.c's invariant 1 inside a window; here: pos + n <= size
 *     written n <= size - pos).
 *  3. Work and memory are bounded whatever the input: one chunk buffer
 *     (DCP_CHUNK), per record what ulp_tz_parse bounds, at most
 *     ULP_DCP_MAX_ITEMS records, and at most ULP_DCP_MAX_TRIES end-record
 *     candidates that fail to parse per record (ULP_DCP_MAX_FAILS per file),
 *     past which the rest of the file is left unparsed.
 */
#include "dcp.h"
#include <stdio.h>
#include <stdlib.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_EOCD  0x06054b50u
#define DCP_CHUNK ((size_t)1 << 20)

struct ulp_dcp {
	ulp_dcp_tensor *t;
	size_t n, cap;
	size_t records;
	char **names;         /* owned, one per tensor */
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
	for (size_t i = 0; i < d->n; i++)
		free(d->names[i]);
	free(d->names);
	free(d->t);
	free(d);
}

static char *name_of(size_t record, const char *storage)
{
	size_t n = 24 + (storage ? strlen(storage) : 0);
	char *s = malloc(n);
	if (s) {
		if (storage)
			snprintf(s, n, "dcp.%zu.%s", record, storage);
		else
			snprintf(s, n, "dcp.%zu", record);
	}
	return s;
}

/* The storages of the record at base, as tensors of d. */
static int add_record(ulp_dcp *d, const ulp_tz *tz, uint64_t base)
{
	size_t ns = ulp_tz_count(tz);
	for (size_t i = 0; i < ns; i++) {
		const ulp_tz_storage *s = ulp_tz_at(tz, i);
		char *name = name_of(d->records, ns == 1 ? NULL : s->name);
		if (!name)
			return -ULP_E_NOMEM;
		if (d->n == d->cap) {
			size_t nc = d->cap ? 2 * d->cap : 16;
			ulp_dcp_tensor *t = realloc(d->t, nc * sizeof(*t));
			if (t)
				d->t = t;
			char **nm = t ? realloc(d->names, nc * sizeof(*nm)) : NULL;
			if (!t || !nm) {
				free(name);
				return -ULP_E_NOMEM;
			}
			d->names = nm;
			d->cap = nc;
		}
		d->names[d->n] = name;
		d->t[d->n++] = (ulp_dcp_tensor){name, s->dtype, base + s->offset, s->length};
	}
	return 0;
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

int ulp_dcp_scan(ulp_tz_read_fn rd, void *arg, uint64_t size, ulp_dcp **out, uint64_t *parsed, char *why,
                 size_t cap)
{
	ulp_err e = {why, cap};
	*out = NULL;
	*parsed = 0;
	ulp_dcp *d = calloc(1, sizeof(*d));
	uint8_t *buf = malloc(DCP_CHUNK);
	int rc = 0;
	if (!d || !buf) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	unsigned fails = 0;
	uint64_t r = 0;
	while (r < size && d->records < ULP_DCP_MAX_ITEMS) {
		uint64_t end;
		ulp_tz *tz = NULL;
		/* only the first record's failure is the file's: later ones end the scan */
		rc = one_record(rd, arg, size, r, buf, &fails, &end, &tz, d->records ? NULL : &e);
		if (rc == -ULP_E_CORRUPT && d->records) {
			rc = 0;
			break;
		}
		if (rc < 0)
			goto out;
		rc = add_record(d, tz, r);
		ulp_tz_free(tz);
		if (rc < 0)
			goto out;
		d->records++;
		r = end;
	}
	if (!d->records) { /* an empty file */
		rc = ULP_CORRUPT(&e, "dcp: no torch.save record");
		goto out;
	}
	*parsed = r;
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

int ulp_dcp_scan_mem(const uint8_t *data, size_t size, ulp_dcp **out, uint64_t *parsed, char *why, size_t cap)
{
	memsrc m = {data, size};
	return ulp_dcp_scan(mem_read, &m, size, out, parsed, why, cap);
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
