/* SPDX-License-Identifier: MIT */
/*
 * genvfs.c - how a reader opens a generation that is published as a patch
 * (gen.c): an SQLite VFS, "ulpgen", that serves the pages of its base
 * generation file, except those the patch holds, which it serves from
 * memory. Opened as file:BASE?immutable=1&vfs=ulpgen&patch=PATCH; read only.
 *
 * A patch file (little endian):
 *   "ULPGENP1", u64 base generation, u32 page size, u32 pages of the
 *   database, u32 pages in the patch (n), u32 0, u64 XXH3-64 of everything
 *   after these 40 bytes; then n u32 page numbers (ascending, from 1), then
 *   the n pages.
 *
 * Invariants:
 *  1. A patch is checked whole (magic, sizes, page numbers ascending and
 *     within the database, checksum) when it is opened: a damaged one
 *     fails the open (SQLITE_CORRUPT), never serves a page.
 *  2. A read never goes past the database's pages: the part past them
 *     reads as zeros with SQLITE_IOERR_SHORT_READ, as a short file does.
 *  3. The temporary files SQLite makes for a connection (a sort or a
 *     DISTINCT that outgrows memory, temp tables, statement journals) are
 *     the default VFS's own, opened in place (szOsFile fits both), as a
 *     whole generation's connection has them.
 */
#include "shared.h"
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct pfile {
	sqlite3_file base;    /* first: what SQLite sees */
	sqlite3_file *real;   /* the base generation, through the default VFS */
	uint32_t page_size, n_pages, n_patch;
	uint32_t *pgno;       /* ascending */
	uint8_t *mem;         /* the whole patch file: pgno and pages point into it */
	const uint8_t *pages; /* n_patch pages */
} pfile;

static sqlite3_vfs *deflt;

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
	return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

int ulp_genpatch_parse(const uint8_t *m, size_t len, ulp_genpatch *out)
{
	if (len < ULP_GENPATCH_HEADER || memcmp(m, "ULPGENP1", 8) != 0)
		return -ULP_E_CORRUPT;
	out->base = rd64(m + 8);
	out->page_size = rd32(m + 16);
	out->n_pages = rd32(m + 20);
	out->n_patch = rd32(m + 24);
	uint32_t ps = out->page_size;
	if (ps < 512 || ps > 65536 || (ps & (ps - 1)) || out->n_patch > out->n_pages ||
	    len != ULP_GENPATCH_HEADER + (uint64_t)out->n_patch * (4 + (uint64_t)ps) ||
	    ulp_xxh64(m + ULP_GENPATCH_HEADER, len - ULP_GENPATCH_HEADER) != rd64(m + 32))
		return -ULP_E_CORRUPT;
	const uint8_t *pg = m + ULP_GENPATCH_HEADER;
	for (uint32_t i = 0; i < out->n_patch; i++) { /* invariant 1 */
		uint32_t p = rd32(pg + 4 * i);
		if (p == 0 || p > out->n_pages || (i && p <= rd32(pg + 4 * (i - 1))))
			return -ULP_E_CORRUPT;
	}
	out->pgno = pg;
	out->pages = pg + 4 * (size_t)out->n_patch;
	return 0;
}

static int p_close(sqlite3_file *f)
{
	pfile *p = (pfile *)f;
	int rc = p->real->pMethods ? p->real->pMethods->xClose(p->real) : SQLITE_OK;
	sqlite3_free(p->real);
	free(p->mem);
	free(p->pgno);
	return rc;
}

static const uint8_t *patched(const pfile *p, uint32_t pg)
{
	size_t lo = 0, hi = p->n_patch;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (p->pgno[mid] == pg)
			return p->pages + mid * (size_t)p->page_size;
		if (p->pgno[mid] < pg)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int p_read(sqlite3_file *f, void *buf, int amt, sqlite3_int64 off)
{
	pfile *p = (pfile *)f;
	uint8_t *out = buf;
	uint64_t end = (uint64_t)p->n_pages * p->page_size;
	while (amt > 0) {
		if ((uint64_t)off >= end) { /* invariant 2 */
			memset(out, 0, (size_t)amt);
			return SQLITE_IOERR_SHORT_READ;
		}
		uint32_t pg = (uint32_t)((uint64_t)off / p->page_size) + 1, in = (uint32_t)((uint64_t)off % p->page_size);
		int n = (int)ULP_MIN((uint64_t)amt, (uint64_t)(p->page_size - in));
		const uint8_t *src = patched(p, pg);
		if (src) {
			memcpy(out, src + in, (size_t)n);
		} else {
			int rc = p->real->pMethods->xRead(p->real, out, n, off);
			if (rc != SQLITE_OK)
				return rc == SQLITE_IOERR_SHORT_READ ? SQLITE_CORRUPT : rc; /* the base is whole */
		}
		out += n;
		off += n;
		amt -= n;
	}
	return SQLITE_OK;
}

static int p_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
	(void)f, (void)b, (void)n, (void)o;
	return SQLITE_READONLY;
}

static int p_truncate(sqlite3_file *f, sqlite3_int64 size)
{
	(void)f, (void)size;
	return SQLITE_READONLY;
}

static int p_sync(sqlite3_file *f, int flags)
{
	(void)f, (void)flags;
	return SQLITE_OK;
}

static int p_size(sqlite3_file *f, sqlite3_int64 *size)
{
	pfile *p = (pfile *)f;
	*size = (sqlite3_int64)p->n_pages * p->page_size;
	return SQLITE_OK;
}

static int p_lock(sqlite3_file *f, int l)
{
	(void)f, (void)l;
	return SQLITE_OK;
}

static int p_reserved(sqlite3_file *f, int *res)
{
	(void)f;
	*res = 0;
	return SQLITE_OK;
}

static int p_control(sqlite3_file *f, int op, void *arg)
{
	(void)f, (void)op, (void)arg;
	return SQLITE_NOTFOUND;
}

static int p_sector(sqlite3_file *f)
{
	(void)f;
	return 4096;
}

static int p_caps(sqlite3_file *f)
{
	(void)f;
	return SQLITE_IOCAP_IMMUTABLE;
}

static const sqlite3_io_methods p_methods = {
	1, p_close, p_read, p_write, p_truncate, p_sync, p_size, p_lock, p_lock, p_reserved,
	p_control, p_sector, p_caps, NULL, NULL, NULL, NULL, NULL, NULL,
};

/* Reads the whole patch at path into *mem (caller frees). */
static int load(const char *path, uint8_t **mem, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0) {
		if (fd >= 0)
			close(fd);
		return SQLITE_CANTOPEN;
	}
	*len = (size_t)sb.st_size;
	*mem = malloc(*len ? *len : 1);
	int e = *mem ? ulp_pread_full(fd, *mem, *len, 0) : 0;
	close(fd);
	if (!*mem)
		return SQLITE_NOMEM;
	if (e) {
		free(*mem);
		*mem = NULL;
		return SQLITE_IOERR;
	}
	return SQLITE_OK;
}

static int p_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
	(void)vfs;
	if (flags & (SQLITE_OPEN_TEMP_DB | SQLITE_OPEN_TEMP_JOURNAL | SQLITE_OPEN_TRANSIENT_DB | SQLITE_OPEN_SUBJOURNAL))
		return deflt->xOpen(deflt, name, f, flags, out_flags); /* invariant 3 */
	pfile *p = (pfile *)f;
	memset(p, 0, sizeof(*p));
	const char *patch = name && (flags & SQLITE_OPEN_MAIN_DB) ? sqlite3_uri_parameter(name, "patch") : NULL;
	if (!patch || (flags & SQLITE_OPEN_READWRITE))
		return SQLITE_CANTOPEN; /* the main database, read-only, with a patch: nothing else */
	size_t len = 0;
	int rc = load(patch, &p->mem, &len);
	ulp_genpatch gp;
	if (rc == SQLITE_OK && ulp_genpatch_parse(p->mem, len, &gp) < 0)
		rc = SQLITE_CORRUPT;
	if (rc == SQLITE_OK) {
		p->page_size = gp.page_size;
		p->n_pages = gp.n_pages;
		p->n_patch = gp.n_patch;
		p->pages = gp.pages;
		p->pgno = malloc((gp.n_patch ? gp.n_patch : 1) * sizeof(*p->pgno));
		if (!p->pgno)
			rc = SQLITE_NOMEM;
		for (uint32_t i = 0; p->pgno && i < gp.n_patch; i++)
			p->pgno[i] = rd32(gp.pgno + 4 * i);
	}
	if (rc == SQLITE_OK && !(p->real = sqlite3_malloc(deflt->szOsFile)))
		rc = SQLITE_NOMEM;
	if (rc == SQLITE_OK) {
		memset(p->real, 0, (size_t)deflt->szOsFile);
		rc = deflt->xOpen(deflt, name, p->real, flags, out_flags);
	}
	if (rc != SQLITE_OK) {
		if (p->real && p->real->pMethods)
			p->real->pMethods->xClose(p->real);
		sqlite3_free(p->real);
		free(p->mem);
		free(p->pgno);
		memset(p, 0, sizeof(*p));
		return rc;
	}
	p->base.pMethods = &p_methods;
	return SQLITE_OK;
}

static int v_delete(sqlite3_vfs *v, const char *n, int s)
{
	(void)v;
	return deflt->xDelete(deflt, n, s);
}

static int v_access(sqlite3_vfs *v, const char *n, int fl, int *out)
{
	(void)v;
	return deflt->xAccess(deflt, n, fl, out);
}

static int v_full(sqlite3_vfs *v, const char *n, int cap, char *out)
{
	(void)v;
	return deflt->xFullPathname(deflt, n, cap, out);
}

static int v_random(sqlite3_vfs *v, int n, char *out)
{
	(void)v;
	return deflt->xRandomness(deflt, n, out);
}

static int v_sleep(sqlite3_vfs *v, int us)
{
	(void)v;
	return deflt->xSleep(deflt, us);
}

static int v_time(sqlite3_vfs *v, double *t)
{
	(void)v;
	return deflt->xCurrentTime(deflt, t);
}

static int v_lasterr(sqlite3_vfs *v, int n, char *out)
{
	(void)v;
	return deflt->xGetLastError ? deflt->xGetLastError(deflt, n, out) : 0;
}

static int v_time64(sqlite3_vfs *v, sqlite3_int64 *t)
{
	(void)v;
	return deflt->xCurrentTimeInt64(deflt, t);
}

static sqlite3_vfs vfs = {
	2, (int)sizeof(pfile), 4096, NULL, "ulpgen", NULL, p_open, v_delete, v_access, v_full,
	NULL, NULL, NULL, NULL, v_random, v_sleep, v_time, v_lasterr, v_time64, NULL, NULL, NULL,
};

static int registered;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void reg(void)
{
	deflt = sqlite3_vfs_find(NULL);
	if (!deflt || deflt->iVersion < 2)
		return;
	if (deflt->szOsFile > vfs.szOsFile) /* invariant 3 */
		vfs.szOsFile = deflt->szOsFile;
	registered = sqlite3_vfs_register(&vfs, 0) == SQLITE_OK;
}

int ulp_genvfs_register(void)
{
	pthread_once(&once, reg);
	return registered ? 0 : -ULP_E_UNSUPPORTED;
}
