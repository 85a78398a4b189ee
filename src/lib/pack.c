/* SPDX-License-Identifier: MIT */
/*
 * pack.c - the pack store: the only module that writes or maps files under
 * ARCHIVE/packs. A pack is "ULPpack1" followed by blobs back to back; the
 * index knows where each blob starts. Packs are immutable and named by the
 * SHA-256 of their bytes, so they map one to one onto objects of an object
 * store.
 *
 * Invariants:
 *  1. A pack is written under packs/tmp-<pid>-<n>, fsynced, renamed to
 *     packs/<sha256>.pack and its directory fsynced, in that order, before
 *     any index row names it (ingest.c commits the rows afterwards).
 *  2. A mapped pack is never written again; a pack removed by gc stays
 *     readable through existing mappings.
 *  3. Every blob access checks offset + length against the mapped size.
 */
#include "arch_int.h"
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PACK_MAGIC "ULPpack1"

struct ulp_pack_writer {
	ulp_archive *a;
	int fd;
	char tmp[4200];
	char final[4200];
	uint64_t size;
	int renamed;        /* the file is final, no longer tmp */
	EVP_MD_CTX *sha;
};

struct pack_map {
	int64_t id;
	const uint8_t *base;
	uint64_t size;
};

static int io_err(ulp_archive *a, const char *path, const char *what)
{
	int e = errno;
	return ulp_arch_err(a, e == ENOSPC || e == EDQUOT ? -ULP_E_NOSPC : -ULP_E_IO, "%s: %s: %s", path,
	                    what, strerror(e));
}

static int write_all(ulp_pack_writer *w, const void *p, size_t len)
{
	const uint8_t *b = p;
	while (len) {
		ssize_t n = write(w->fd, b, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = EIO;
			return io_err(w->a, w->tmp, "write");
		}
		EVP_DigestUpdate(w->sha, b, (size_t)n);
		b += n;
		len -= (size_t)n;
		w->size += (uint64_t)n;
	}
	return 0;
}

int ulp_pack_writer_new(ulp_archive *a, ulp_pack_writer **out)
{
	static unsigned counter;
	ulp_pack_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ULP_E_NOMEM;
	w->a = a;
	w->sha = EVP_MD_CTX_new();
	if (!w->sha || !EVP_DigestInit_ex(w->sha, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(w->sha);
		free(w);
		return -ULP_E_NOMEM;
	}
	snprintf(w->tmp, sizeof(w->tmp), "%s/packs/tmp-%ld-%u", a->dir, (long)getpid(),
	         __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		int rc = io_err(a, w->tmp, "create");
		EVP_MD_CTX_free(w->sha);
		free(w);
		return rc;
	}
	int rc = write_all(w, PACK_MAGIC, 8);
	if (rc < 0) {
		ulp_pack_discard(w);
		return rc;
	}
	*out = w;
	return 0;
}

int ulp_pack_append(ulp_pack_writer *w, const void *blob, size_t len, uint64_t *offset)
{
	*offset = w->size;
	return write_all(w, blob, len);
}

uint64_t ulp_pack_size(const ulp_pack_writer *w)
{
	return w->size;
}

static int fsync_dir(ulp_archive *a, const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return io_err(a, dir, "open");
	int rc = fsync(fd) < 0 ? io_err(a, dir, "fsync") : 0;
	close(fd);
	return rc;
}

int ulp_pack_commit(ulp_pack_writer *w, char name[80])
{
	uint8_t sha[32];
	unsigned int n = 0;
	char hex[65];
	EVP_DigestFinal_ex(w->sha, sha, &n);
	ulp_sha256_hex(sha, hex);
	snprintf(name, 80, "%s.pack", hex);
	snprintf(w->final, sizeof(w->final), "%s/packs/%s", w->a->dir, name);
	if (fsync(w->fd) < 0)
		return io_err(w->a, w->tmp, "fsync");
	if (close(w->fd) < 0) {
		w->fd = -1;
		return io_err(w->a, w->tmp, "close");
	}
	w->fd = -1;
	if (rename(w->tmp, w->final) < 0)
		return io_err(w->a, w->final, "rename");
	w->renamed = 1;
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/packs", w->a->dir);
	return fsync_dir(w->a, dir);
}

void ulp_pack_discard(ulp_pack_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		close(w->fd);
	w->fd = -1;
	/* by what the writer did, not what the caller thinks: a commit that
	 * failed after its rename (the directory's fsync) leaves the final name */
	unlink(w->renamed ? w->final : w->tmp);
	ulp_pack_free(w);
}

void ulp_pack_free(ulp_pack_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		unlink(w->tmp);
	}
	EVP_MD_CTX_free(w->sha);
	free(w);
}

/* ---- reading ------------------------------------------------------------- */

static int map_pack(ulp_archive *a, int64_t id, struct pack_map *out)
{
	char name[128], path[4200];
	ULP_TRY(ulp_index_pack_name(a, id, name, sizeof(name)));
	snprintf(path, sizeof(path), "%s/packs/%s", a->dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return ulp_arch_err(a, -ULP_E_IO, "%s: %s", path, strerror(errno));
	struct stat sb;
	if (fstat(fd, &sb) < 0) {
		int rc = ulp_arch_err(a, -ULP_E_IO, "%s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	void *m = sb.st_size ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (sb.st_size && m == MAP_FAILED)
		return ulp_arch_err(a, -ULP_E_IO, "%s: mmap: %s", path, strerror(errno));
	if ((uint64_t)sb.st_size < 8 || memcmp(m, PACK_MAGIC, 8) != 0) {
		if (sb.st_size)
			munmap(m, (size_t)sb.st_size);
		return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: not a pack file", path);
	}
	out->id = id;
	out->base = m;
	out->size = (uint64_t)sb.st_size;
	return 0;
}

int ulp_pack_blob(ulp_archive *a, int64_t pack, uint64_t offset, uint64_t len, const uint8_t **p)
{
	struct pack_map pm = {0};
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->n_packs; i++)
		if (a->packs[i].id == pack) {
			pm = a->packs[i];
			break;
		}
	pthread_mutex_unlock(&a->mu);
	if (!pm.base) {
		ULP_TRY(map_pack(a, pack, &pm));
		pthread_mutex_lock(&a->mu);
		int dup = 0;
		for (size_t i = 0; i < a->n_packs; i++)
			if (a->packs[i].id == pack) { /* another thread won the race */
				munmap((void *)pm.base, (size_t)pm.size);
				pm = a->packs[i];
				dup = 1;
				break;
			}
		if (!dup) {
			if (a->n_packs == a->cap_packs) {
				size_t nc = a->cap_packs ? a->cap_packs * 2 : 64;
				struct pack_map *np = realloc(a->packs, nc * sizeof(*np));
				if (!np) {
					pthread_mutex_unlock(&a->mu);
					munmap((void *)pm.base, (size_t)pm.size);
					return -ULP_E_NOMEM;
				}
				a->packs = np;
				a->cap_packs = nc;
			}
			a->packs[a->n_packs++] = pm;
		}
		pthread_mutex_unlock(&a->mu);
	}
	if (offset > pm.size || len > pm.size - offset)
		return ulp_arch_err(a, -ULP_E_CORRUPT,
		                    "%s/packs: pack %lld is %llu bytes, a blob needs [%llu, %llu): truncated pack",
		                    a->dir, (long long)pack, (unsigned long long)pm.size,
		                    (unsigned long long)offset, (unsigned long long)(offset + len));
	*p = pm.base + offset;
	return 0;
}

/* Used pack pages are given back in batches: a madvise per chunk costs a
 * TLB shootdown on every CPU of the process, which was a third of the time of
 * reading checkpoints of small tensors. Invariant: every pending range lies
 * inside a mapping that stays until ulp_pack_unmap_all, which drops them. */
#define RELEASE_BATCH ((uint64_t)4 << 20)

static void release_flush(ulp_archive *a) /* a->mu held */
{
	for (size_t i = 0; i < a->n_released; i++)
		madvise((void *)a->released[i].lo, a->released[i].hi - a->released[i].lo, MADV_DONTNEED);
	a->n_released = 0;
	a->released_bytes = 0;
}

void ulp_pack_release(ulp_archive *a, const void *p, size_t len)
{
	/* the pages stay in the page cache; this process just stops holding them,
	 * so its memory stays near the decode cache's size */
	const size_t n_max = sizeof(a->released) / sizeof(a->released[0]);
	uintptr_t page = 4096, lo = (uintptr_t)p & ~(page - 1);
	uintptr_t hi = ((uintptr_t)p + len + page - 1) & ~(page - 1);
	if (!len || hi <= lo)
		return;
	pthread_mutex_lock(&a->mu);
	size_t i = 0;
	while (i < a->n_released && (lo > a->released[i].hi || hi < a->released[i].lo))
		i++; /* a range that overlaps or touches this one, if any, grows */
	if (i == a->n_released) {
		if (i == n_max) {
			release_flush(a);
			i = 0;
		}
		a->released[i].lo = lo;
		a->released[i].hi = hi;
		a->n_released++;
	} else {
		a->released[i].lo = lo < a->released[i].lo ? lo : a->released[i].lo;
		a->released[i].hi = hi > a->released[i].hi ? hi : a->released[i].hi;
	}
	a->released_bytes += hi - lo;
	if (a->released_bytes >= RELEASE_BATCH)
		release_flush(a);
	pthread_mutex_unlock(&a->mu);
}

void ulp_pack_forget(ulp_archive *a, int64_t pack)
{
	/* the mapping stays valid (invariant 2); only the lookup entry goes, so
	 * that a rewritten pack id is mapped afresh */
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->n_packs; i++)
		if (a->packs[i].id == pack) {
			a->packs[i].id = -1;
			break;
		}
	pthread_mutex_unlock(&a->mu);
}

void ulp_pack_unmap_all(ulp_archive *a)
{
	for (size_t i = 0; i < a->n_packs; i++)
		if (a->packs[i].base)
			munmap((void *)a->packs[i].base, (size_t)a->packs[i].size);
	free(a->packs);
	a->packs = NULL;
	a->n_packs = a->cap_packs = 0;
	a->n_released = 0; /* unmapped with their packs */
	a->released_bytes = 0;
}
