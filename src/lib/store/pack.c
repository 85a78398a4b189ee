/* SPDX-License-Identifier: MIT */
/*
 * pack.c - the pack store: the only module that writes or maps files under
 * ARCHIVE/packs, through its backend (backend.h: the local directory,
 * backend_dir.c; a->ps holds the backend and the mapped packs). A pack is "ULPpack1" followed by blobs back to back; the
 * index knows where each blob starts. Packs are immutable and named by a
 * SHA-256 over their bytes, so they map one to one onto objects of an object
 * store: SHA-256 of the magic, then for each blob its digest (the content
 * digest of ulpack-format(5) 2.4 over the blob's bytes: leaves in parallel)
 * and its length (u64), so the blobs' digests are taken by the threads that
 * made them (ulp_pack_append_digest) and no serial pass reads the pack's bytes
 * again.
 *
 * Invariants:
 *  1. A pack is written under packs/tmp-<pid>-<n>, fsynced, renamed to
 *     packs/<sha256>.pack and its directory fsynced, in that order, before
 *     any index row names it (ingest.c commits the rows afterwards).
 *  2. A mapped pack is never written again; a pack removed by gc stays
 *     readable through its mapping while a user pins it (ulp_pack_pin: an
 *     open file for the blobs of its chains, a cached parsed blob for the
 *     bytes it points into).
 *  3. Every blob access checks offset + length against the mapped size.
 *     Writeback of each blob starts as soon as it is written
 *     (sync_file_range), so the fsync of the commit waits for little more
 *     than the last blob instead of for the whole pack after the coding.
 *  4. Slots of the mapping table are never reused or moved (a slot number
 *     stays valid while pinned); the archive's trim (archive/) unmaps a slot only once
 *     its pack file is gone (removed by gc, maybe in another process) and
 *     no user pins it, so that the disk space goes back.
 *  5. A pack's magic is checked before any blob byte of it is handed out:
 *     at its first blob access (slot_blob), so that mapping it reads
 *     nothing and a cold open waits for no disk (issue 38); where copies
 *     come from an object store (a backend with refetch), when it is
 *     mapped, so that a damaged copy is fetched anew there. The pages a
 *     reader will need are asked for instead, in the background
 *     (ulp_pack_willneed: the blobs of an open file's chains and each
 *     pack's first page; issue 29 found that, without the first page's
 *     read at the mapping, the kernel no longer read ahead from the pack's
 *     start, and a cold read of a deep step took 279 ms, not 177).
 *  7. The read-ahead thread only asks the kernel for pages (madvise
 *     WILLNEED) of slots that stay pinned while queued: it never blocks a
 *     reader, and a full queue drops the request (a hint).
 *  6. A pack whose copy came from an object store and failed a checksum
 *     is fetched anew once over the same mapping (ulp_pack_refetch: the
 *     addresses stay, so pins and cached pointers stay valid; the slot's
 *     epoch counts it, under refetch_mu, so that of several threads that
 *     saw the same damage only one fetches); a second failure drops the
 *     copy and forgets the slot's id, so that a later lookup fetches
 *     again (an object mended in the bucket is read without a remount).
 */
#include "backend.h"
#include "remote.h"
#include "index.h"
#include "pack.h"
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PACK_MAGIC "ULPpack1"
_Static_assert(sizeof(PACK_MAGIC) - 1 == ULP_PACK_HEADER, "the header store/index.h counts");

struct ulp_pack_writer {
	ulp_archive *a;
	int fd;
	char tmpname[160];   /* its temporary object under packs/ */
	char tmp[4200];     /* the same as a path (the streaming writer's file) */
	uint64_t size;
	int renamed;        /* the file is final, no longer tmp */
	int replaced;       /* a file of that final name was there before the rename */
	int sealed;         /* name holds the final name: the digest is taken */
	char name[80];
	EVP_MD_CTX *sha;
};

struct pack_map {
	int64_t id;            /* -1: forgotten or unmapped */
	const uint8_t *base;   /* NULL once unmapped (invariant 4) */
	uint64_t size;
	dev_t dev;             /* the mapped file, to tell it was removed */
	ino_t ino;
	unsigned users;        /* pins (invariant 2) */
	int gone;              /* its file was removed: unmap once unused */
	unsigned epoch;        /* times fetched anew over its mapping (invariant 6) */
	int checked;           /* its magic was checked (invariant 5) */
	char name[128];        /* file name under packs/ */
};

/* invariant 7: pages asked for in the background */
#define WN_QUEUE 256
typedef struct wn_item {
	size_t slot;
	uint64_t off, len;
} wn_item;

/*
 * The pack store's handle (a->ps): the mapping table and the pages given
 * back in batches. Its mutex is a leaf lock: no other lock is taken while it
 * is held (no index call, no ulp_arch_err, no cache call under it).
 */
struct ulp_packstore {
	ulp_backend *be;             /* set at open, read-only after: where the packs are
	                                (backend.h; the local directory ARCHIVE/packs) */
	pthread_mutex_t mu;
	struct pack_map *packs;      /* guarded by mu: mapped packs, by slot (invariant 4) */
	size_t n_packs, cap_packs;   /* guarded by mu */
	struct { uintptr_t lo, hi; } released[16]; /* guarded by mu: pages of packs that
	                                readers are done with, given back in batches
	                                (ulp_pack_release) */
	size_t n_released;           /* guarded by mu */
	uint64_t released_bytes;     /* guarded by mu */
	pthread_mutex_t refetch_mu;  /* one ulp_pack_refetch at a time (invariant 6);
	                                taken before mu, never under it */
	pthread_mutex_t wn_mu;       /* guards the wn_ fields; taken before mu, never under it */
	pthread_cond_t wn_cv;
	wn_item wn_q[WN_QUEUE];      /* guarded by wn_mu: spans of pinned slots (invariant 7) */
	unsigned wn_head, wn_n;      /* guarded by wn_mu */
	pthread_t wn_th;
	int wn_on, wn_stop;          /* guarded by wn_mu: its thread started; stopping */
};

int ulp_packstore_open(ulp_archive *a)
{
	ulp_packstore *ps = calloc(1, sizeof(*ps));
	if (!ps)
		return -ULP_E_NOMEM;
	char root[4200];
	snprintf(root, sizeof(root), "%s/packs", a->dir);
	int rc = a->rm ? ulp_backend_s3_open(a, root, &ps->be) : ulp_backend_dir_open(a, root, &ps->be);
	if (rc < 0) {
		free(ps);
		return rc;
	}
	pthread_mutex_init(&ps->mu, NULL);
	pthread_mutex_init(&ps->refetch_mu, NULL);
	pthread_mutex_init(&ps->wn_mu, NULL);
	pthread_cond_init(&ps->wn_cv, NULL);
	a->ps = ps;
	return 0;
}

static void willneed_stop(ulp_archive *a);

void ulp_packstore_close(ulp_archive *a)
{
	if (!a->ps)
		return;
	willneed_stop(a); /* its thread reads the mappings */
	ulp_pack_unmap_all(a);
	a->ps->be->ops->close(a->ps->be);
	pthread_mutex_destroy(&a->ps->mu);
	pthread_mutex_destroy(&a->ps->refetch_mu);
	pthread_mutex_destroy(&a->ps->wn_mu);
	pthread_cond_destroy(&a->ps->wn_cv);
	free(a->ps);
	a->ps = NULL;
}

/* invariant 1: a hint; the fsync of ulp_pack_commit stays the guarantee */
static void start_writeback(ulp_pack_writer *w, uint64_t off, size_t len)
{
#ifdef SYNC_FILE_RANGE_WRITE
	(void)sync_file_range(w->fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
#else
	(void)w, (void)off, (void)len;
#endif
}

static int write_all(ulp_pack_writer *w, const void *p, size_t len)
{
	if ((errno = ulp_write_full(w->fd, p, len)) != 0)
		return ulp_arch_io_err(w->a, w->tmp, "write");
	w->size += (uint64_t)len;
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
	char me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me)); /* (a pid alone is no name on a shared file system) */
	snprintf(w->tmpname, sizeof(w->tmpname), "tmp-%s-%u", me, __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
	snprintf(w->tmp, sizeof(w->tmp), "%s/packs/%s", a->dir, w->tmpname);
	/* not through the backend: the pack is written here a blob at a time,
	 * from several threads (ulp_pack_write_at), and put_file makes it the
	 * object at the commit (backend.h: the next issue extends the interface) */
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* private: archive.c */
	if (w->fd < 0) {
		int rc = ulp_arch_io_err(a, w->tmp, "create");
		EVP_MD_CTX_free(w->sha);
		free(w);
		return rc;
	}
	EVP_DigestUpdate(w->sha, PACK_MAGIC, 8);
	int rc = write_all(w, PACK_MAGIC, 8);
	if (rc < 0) {
		ulp_pack_discard(w);
		return rc;
	}
	*out = w;
	return 0;
}

int ulp_pack_append_digest(ulp_pack_writer *w, const void *blob, size_t len,
                           const uint8_t sha[ULP_SHA256_LEN], uint64_t *offset)
{
	uint8_t l8[8];
	ulp_st64(l8, len);
	*offset = w->size;
	ULP_TRY(write_all(w, blob, len));
	start_writeback(w, *offset, len);
	EVP_DigestUpdate(w->sha, sha, ULP_SHA256_LEN);
	EVP_DigestUpdate(w->sha, l8, 8);
	return 0;
}

int ulp_pack_reserve(ulp_pack_writer *w, size_t len, uint64_t *offset)
{
	*offset = w->size;
	w->size += len;
	/* write() appends after the reserved bytes, whoever fills them */
	if (lseek(w->fd, (off_t)w->size, SEEK_SET) < 0)
		return ulp_arch_io_err(w->a, w->tmp, "seek");
	return 0;
}

int ulp_pack_write_at(ulp_pack_writer *w, uint64_t offset, const void *p, size_t len)
{
	if ((errno = ulp_pwrite_full(w->fd, p, len, offset)) != 0)
		return ulp_arch_io_err(w->a, w->tmp, "write");
	start_writeback(w, offset, len);
	return 0;
}

void ulp_pack_reserved_digest(ulp_pack_writer *w, size_t len, const uint8_t sha[ULP_SHA256_LEN])
{
	uint8_t l8[8];
	ulp_st64(l8, len);
	EVP_DigestUpdate(w->sha, sha, ULP_SHA256_LEN);
	EVP_DigestUpdate(w->sha, l8, 8);
}

int ulp_pack_append(ulp_pack_writer *w, const void *blob, size_t len, uint64_t *offset)
{
	uint8_t sha[ULP_SHA256_LEN];
	ULP_TRY(ulp_content_digest(NULL, blob, len, sha));
	return ulp_pack_append_digest(w, blob, len, sha, offset);
}

int ulp_pack_replaced(const ulp_pack_writer *w)
{
	return w->replaced;
}

uint64_t ulp_pack_size(const ulp_pack_writer *w)
{
	return w->size;
}

void ulp_pack_seal(ulp_pack_writer *w, char name[80])
{
	if (!w->sealed) {
		uint8_t sha[32];
		unsigned int n = 0;
		char hex[65];
		EVP_DigestFinal_ex(w->sha, sha, &n);
		ulp_sha256_hex(sha, hex);
		snprintf(w->name, sizeof(w->name), "%s.pack", hex);
		w->sealed = 1;
	}
	memcpy(name, w->name, 80);
}

int ulp_pack_commit(ulp_pack_writer *w, char name[80])
{
	ulp_pack_seal(w, name);
	ulp_backend *be = w->a->ps->be;
	unsigned done = (w->replaced ? ULP_PUT_REPLACED : 0) | (w->renamed ? ULP_PUT_RENAMED : 0);
	int rc = be->ops->put_file(be, &w->fd, w->tmpname, w->name, &done); /* invariant 1 */
	w->replaced = (done & ULP_PUT_REPLACED) != 0;
	w->renamed = (done & ULP_PUT_RENAMED) != 0;
	return rc;
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
	ulp_backend *be = w->a->ps->be;
	be->ops->remove(be, w->renamed ? w->name : w->tmpname);
	ulp_pack_free(w);
}

void ulp_pack_free(ulp_pack_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0) {
		close(w->fd);
		w->a->ps->be->ops->remove(w->a->ps->be, w->tmpname);
	}
	EVP_MD_CTX_free(w->sha);
	free(w);
}

/* ---- reading ------------------------------------------------------------- */

/* Maps pack id; known: its name and size as the index has them (the file
 * table's), else asked of the index. */
static int map_pack(ulp_archive *a, int64_t id, const ulp_packref *known, struct pack_map *out)
{
	char name[128], path[4200];
	uint64_t size;
	if (known && strlen(known->name) < sizeof(name)) {
		snprintf(name, sizeof(name), "%s", known->name);
		size = known->size;
	} else {
		ULP_TRY(ulp_index_pack_row(a, id, name, sizeof(name), &size));
	}
	snprintf(path, sizeof(path), "%s/packs/%s", a->dir, name);
	ulp_backend *be = a->ps->be;
	if (!be->ops->map)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: the %s pack store maps no pack", path, be->ops->name);
	ulp_backend_map m;
	int rc = be->ops->map(be, name, size, &m);
	if (rc < 0 && a->follow && access(path, F_OK) != 0 && errno == ENOENT) { /* gen.c invariant 4 */
		ulp_generation g;
		ulp_archive_generation(a, &g);
		char why[1024];
		snprintf(why, sizeof(why), "%s", ulp_msgs_get(a->msgs));
		return ulp_arch_err(a, rc, "%s (the writer removed it: this reader's generation %llu was superseded more "
		                    "than the writer's grace ago; reopen the file to read the newest)", why,
		                    (unsigned long long)g.gen);
	}
	ULP_TRY(rc);
	if (be->ops->refetch) { /* invariant 5: an object store's copy, checked now */
		if (m.size >= 8 && memcmp(m.base, PACK_MAGIC, 8) != 0 && (rc = be->ops->refetch(be, name, &m)) < 0) {
			munmap((void *)m.base, (size_t)m.size); /* invariant 6: a damaged copy */
			return rc;
		}
		if (m.size < 8 || memcmp(m.base, PACK_MAGIC, 8) != 0) {
			if (m.size)
				munmap((void *)m.base, (size_t)m.size);
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s: not a pack file", path);
		}
	}
	memset(out, 0, sizeof(*out));
	out->checked = be->ops->refetch != NULL;
	out->id = id;
	out->base = m.base;
	out->size = m.size;
	out->dev = m.dev;
	out->ino = m.ino;
	snprintf(out->name, sizeof(out->name), "%s", name);
	return 0;
}

static void willneed_post(ulp_archive *a, size_t slot, uint64_t off, uint64_t len);

/* The slot of pack id, mapped if needed; optionally pinned. */
static int find_slot(ulp_archive *a, int64_t pack, const ulp_packref *known, int pin, size_t *slot)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++)
		if (ps->packs[i].id == pack && ps->packs[i].base) {
			ps->packs[i].users += pin;
			*slot = i;
			pthread_mutex_unlock(&ps->mu);
			return 0;
		}
	pthread_mutex_unlock(&ps->mu);
	struct pack_map pm;
	ULP_TRY(map_pack(a, pack, known, &pm));
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++)
		if (ps->packs[i].id == pack && ps->packs[i].base) { /* another thread won the race */
			munmap((void *)pm.base, (size_t)pm.size);
			ps->packs[i].users += pin;
			*slot = i;
			pthread_mutex_unlock(&ps->mu);
			return 0;
		}
	if (ps->n_packs == ps->cap_packs) {
		size_t nc = ps->cap_packs ? ps->cap_packs * 2 : 64;
		struct pack_map *np = realloc(ps->packs, nc * sizeof(*np));
		if (!np) {
			pthread_mutex_unlock(&ps->mu);
			munmap((void *)pm.base, (size_t)pm.size);
			return -ULP_E_NOMEM;
		}
		ps->packs = np;
		ps->cap_packs = nc;
	}
	pm.users = (unsigned)pin + 1; /* and one for its first page's read-ahead */
	*slot = ps->n_packs;
	ps->packs[ps->n_packs++] = pm;
	pthread_mutex_unlock(&ps->mu);
	if (!pm.checked)
		willneed_post(a, *slot, 0, 4096); /* invariant 5: what the magic check reads */
	else
		ulp_pack_unpin(a, *slot);
	return 0;
}

static int slot_blob(ulp_archive *a, size_t slot, uint64_t offset, uint64_t len, const uint8_t **p)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	struct pack_map pm = ps->packs[slot];
	pthread_mutex_unlock(&ps->mu);
	if (!pm.base)
		return ulp_arch_err(a, -ULP_E_IO, "%s/packs/%s: no longer mapped", a->dir, pm.name);
	if (!pm.checked) { /* invariant 5: at its first blob access */
		if (pm.size < 8 || memcmp(pm.base, PACK_MAGIC, 8) != 0)
			return ulp_arch_err(a, -ULP_E_CORRUPT, "%s/packs/%s: not a pack file", a->dir, pm.name);
		pthread_mutex_lock(&ps->mu);
		ps->packs[slot].checked = 1;
		pthread_mutex_unlock(&ps->mu);
	}
	if (offset > pm.size || len > pm.size - offset)
		return ulp_arch_err(a, -ULP_E_CORRUPT,
		                    "%s/packs/%s: %llu bytes, a blob needs [%llu, %llu): truncated pack",
		                    a->dir, pm.name, (unsigned long long)pm.size,
		                    (unsigned long long)offset, (unsigned long long)(offset + len));
	*p = pm.base + offset;
	return 0;
}

int ulp_pack_blob(ulp_archive *a, int64_t pack, uint64_t offset, uint64_t len, const uint8_t **p)
{
	size_t slot;
	ULP_TRY(find_slot(a, pack, NULL, 0, &slot));
	return slot_blob(a, slot, offset, len, p);
}

int ulp_pack_pin(ulp_archive *a, int64_t pack, size_t *slot)
{
	return find_slot(a, pack, NULL, 1, slot);
}

int ulp_pack_pin_known(ulp_archive *a, const ulp_packref *pk, size_t *slot)
{
	return find_slot(a, pk->id, pk, 1, slot);
}

/* ---- pages asked for in the background (invariant 7) ---------------------- */

static void *willneed_main(void *arg)
{
	ulp_archive *a = arg;
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->wn_mu);
	for (;;) {
		while (!ps->wn_n && !ps->wn_stop)
			pthread_cond_wait(&ps->wn_cv, &ps->wn_mu);
		if (!ps->wn_n) /* stopping, the queue drained */
			break;
		wn_item it = ps->wn_q[ps->wn_head];
		ps->wn_head = (ps->wn_head + 1) % WN_QUEUE;
		ps->wn_n--;
		int stop = ps->wn_stop;
		pthread_mutex_unlock(&ps->wn_mu);
		pthread_mutex_lock(&ps->mu);
		struct pack_map pm = ps->packs[it.slot]; /* pinned: its mapping stays */
		pthread_mutex_unlock(&ps->mu);
		if (!stop && pm.base && it.off < pm.size) {
			uint64_t end = ULP_MIN(pm.size, it.off + it.len);
			uintptr_t lo = (uintptr_t)(pm.base + it.off) & ~(uintptr_t)4095;
			madvise((void *)lo, (uintptr_t)(pm.base + end) - lo, MADV_WILLNEED);
		}
		ulp_pack_unpin(a, it.slot);
		pthread_mutex_lock(&ps->wn_mu);
	}
	pthread_mutex_unlock(&ps->wn_mu);
	return NULL;
}

/* Queues [off, off + len) of slot, which holds one pin the thread lets go
 * (the caller's, handed over); a full queue lets it go at once. */
static void willneed_post(ulp_archive *a, size_t slot, uint64_t off, uint64_t len)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->wn_mu);
	if (!ps->wn_on && !ps->wn_stop)
		ps->wn_on = pthread_create(&ps->wn_th, NULL, willneed_main, a) == 0 ? 1 : -1;
	int queued = ps->wn_on == 1 && !ps->wn_stop && ps->wn_n < WN_QUEUE;
	if (queued) {
		ps->wn_q[(ps->wn_head + ps->wn_n++) % WN_QUEUE] = (wn_item){slot, off, len};
		pthread_cond_signal(&ps->wn_cv);
	}
	pthread_mutex_unlock(&ps->wn_mu);
	if (!queued)
		ulp_pack_unpin(a, slot);
}

void ulp_pack_willneed(ulp_archive *a, size_t slot, uint64_t off, uint64_t len)
{
	if (ulp_pack_pin_slot(a, slot) == 0)
		willneed_post(a, slot, off, len);
}

static void willneed_stop(ulp_archive *a)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->wn_mu);
	ps->wn_stop = 1;
	int on = ps->wn_on == 1;
	pthread_cond_broadcast(&ps->wn_cv);
	pthread_mutex_unlock(&ps->wn_mu);
	if (on)
		pthread_join(ps->wn_th, NULL);
}

int ulp_pack_pin_slot(ulp_archive *a, size_t slot)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	int ok = slot < ps->n_packs && ps->packs[slot].base;
	if (ok)
		ps->packs[slot].users++;
	pthread_mutex_unlock(&ps->mu);
	return ok ? 0 : ulp_arch_err(a, -ULP_E_IO, "%s/packs: pack slot %zu is not mapped", a->dir, slot);
}

int ulp_pack_slot_blob(ulp_archive *a, size_t slot, uint64_t offset, uint64_t len, const uint8_t **p)
{
	return slot_blob(a, slot, offset, len, p);
}

void ulp_pack_unpin(ulp_archive *a, size_t slot)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	if (slot < ps->n_packs && ps->packs[slot].users)
		ps->packs[slot].users--;
	pthread_mutex_unlock(&ps->mu);
}

int ulp_pack_slot_gone(ulp_archive *a, size_t slot)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	int g = slot < ps->n_packs && ps->packs[slot].gone;
	pthread_mutex_unlock(&ps->mu);
	return g;
}

/* Used pack pages are given back in batches: a madvise per chunk costs a
 * TLB shootdown on every CPU of the process, which was a third of the time of
 * reading checkpoints of small tensors. Invariant: every pending range lies
 * inside a mapping that stays until ulp_pack_unmap_all, which drops them, or
 * ulp_pack_unmap_gone, which gives them back first. */
#define RELEASE_BATCH ((uint64_t)4 << 20)

static void release_flush(ulp_packstore *ps) /* ps->mu held */
{
	for (size_t i = 0; i < ps->n_released; i++)
		madvise((void *)ps->released[i].lo, ps->released[i].hi - ps->released[i].lo, MADV_DONTNEED);
	ps->n_released = 0;
	ps->released_bytes = 0;
}

void ulp_pack_release(ulp_archive *a, const void *p, size_t len)
{
	ulp_packstore *ps = a->ps;
	/* the pages stay in the page cache; this process just stops holding them,
	 * so its memory stays near the decode cache's size */
	const size_t n_max = sizeof(ps->released) / sizeof(ps->released[0]);
	uintptr_t page = 4096, lo = (uintptr_t)p & ~(page - 1);
	uintptr_t hi = ((uintptr_t)p + len + page - 1) & ~(page - 1);
	if (!len || hi <= lo)
		return;
	pthread_mutex_lock(&ps->mu);
	size_t i = 0;
	while (i < ps->n_released && (lo > ps->released[i].hi || hi < ps->released[i].lo))
		i++; /* a range that overlaps or touches this one, if any, grows */
	if (i == ps->n_released) {
		if (i == n_max) {
			release_flush(ps);
			i = 0;
		}
		ps->released[i].lo = lo;
		ps->released[i].hi = hi;
		ps->n_released++;
	} else {
		ps->released[i].lo = lo < ps->released[i].lo ? lo : ps->released[i].lo;
		ps->released[i].hi = hi > ps->released[i].hi ? hi : ps->released[i].hi;
	}
	ps->released_bytes += hi - lo;
	if (ps->released_bytes >= RELEASE_BATCH)
		release_flush(ps);
	pthread_mutex_unlock(&ps->mu);
}

void ulp_pack_forget(ulp_archive *a, int64_t pack)
{
	ulp_packstore *ps = a->ps;
	/* the mapping stays valid (invariant 2); only the lookup entry goes, so
	 * that a rewritten pack id is mapped afresh */
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++)
		if (ps->packs[i].id == pack) {
			ps->packs[i].id = -1;
			break;
		}
	pthread_mutex_unlock(&ps->mu);
}

unsigned ulp_pack_slot_epoch(ulp_archive *a, size_t slot)
{
	ulp_packstore *ps = a->ps;
	pthread_mutex_lock(&ps->mu);
	unsigned e = slot < ps->n_packs ? ps->packs[slot].epoch : 0;
	pthread_mutex_unlock(&ps->mu);
	return e;
}

int ulp_pack_refetch(ulp_archive *a, size_t slot, unsigned seen, const char *what)
{
	ulp_packstore *ps = a->ps;
	ulp_backend *be = ps->be;
	if (!be->ops->refetch)
		return 0;
	pthread_mutex_lock(&ps->refetch_mu);
	pthread_mutex_lock(&ps->mu);
	struct pack_map pm = ps->packs[slot]; /* (pinned: its mapping stays) */
	pthread_mutex_unlock(&ps->mu);
	int rc = 1;
	if (pm.epoch == seen && pm.epoch == 0) {
		ulp_backend_map m = {pm.base, pm.size, pm.dev, pm.ino};
		rc = be->ops->refetch(be, pm.name, &m);
		pthread_mutex_lock(&ps->mu);
		ps->packs[slot].epoch++; /* (failed too: the mapping may hold either copy) */
		if (rc == 0) {
			ps->packs[slot].dev = m.dev;
			ps->packs[slot].ino = m.ino;
		}
		pthread_mutex_unlock(&ps->mu);
		rc = rc < 0 ? rc : 1;
	} else if (pm.epoch == seen) { /* the fresh copy failed too */
		be->ops->refetch(be, pm.name, NULL);
		pthread_mutex_lock(&ps->mu);
		ps->packs[slot].id = -1; /* the next lookup maps (and fetches) it afresh */
		pthread_mutex_unlock(&ps->mu);
		rc = ulp_arch_err(a, -ULP_E_IO, "%s: pack %s: %s, again in a copy fetched anew from the bucket (the "
		                  "object is damaged there; the copy was dropped)", a->rm ? a->rm->url : a->dir, pm.name,
		                  what);
	}
	pthread_mutex_unlock(&ps->refetch_mu);
	return rc;
}

unsigned ulp_pack_mark_gone(ulp_archive *a)
{
	ulp_packstore *ps = a->ps;
	unsigned n = 0;
	char path[4300];
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++) {
		struct pack_map *pm = &ps->packs[i];
		if (!pm->base)
			continue;
		if (pm->gone) { /* still mapped: a user pinned it at the last trim */
			n++;
			continue;
		}
		/* not through the backend: the file's identity, to tell a removed
		 * or replaced pack from its mapping (the next issue extends the
		 * interface) */
		struct stat sb;
		snprintf(path, sizeof(path), "%s/packs/%s", a->dir, pm->name);
		if (stat(path, &sb) < 0 ? errno == ENOENT : sb.st_ino != pm->ino || sb.st_dev != pm->dev) {
			pm->gone = 1;
			pm->id = -1; /* a lookup by id maps afresh (and fails) */
		}
		n += pm->gone;
	}
	pthread_mutex_unlock(&ps->mu);
	return n;
}

unsigned ulp_pack_unmap_gone(ulp_archive *a)
{
	ulp_packstore *ps = a->ps;
	unsigned n = 0;
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++) {
		struct pack_map *pm = &ps->packs[i];
		if (!pm->base || !pm->gone || pm->users)
			continue;
		if (ps->n_released)
			release_flush(ps); /* no pending range may outlive its mapping */
		munmap((void *)pm->base, (size_t)pm->size);
		pm->base = NULL;
		n++;
	}
	pthread_mutex_unlock(&ps->mu);
	return n;
}

size_t ulp_pack_mapped(ulp_archive *a)
{
	ulp_packstore *ps = a->ps;
	size_t n = 0;
	pthread_mutex_lock(&ps->mu);
	for (size_t i = 0; i < ps->n_packs; i++)
		n += ps->packs[i].base != NULL;
	pthread_mutex_unlock(&ps->mu);
	return n;
}

void ulp_pack_unmap_all(ulp_archive *a)
{
	ulp_packstore *ps = a->ps;
	for (size_t i = 0; i < ps->n_packs; i++)
		if (ps->packs[i].base)
			munmap((void *)ps->packs[i].base, (size_t)ps->packs[i].size);
	free(ps->packs);
	ps->packs = NULL;
	ps->n_packs = ps->cap_packs = 0;
	ps->n_released = 0; /* unmapped with their packs */
	ps->released_bytes = 0;
}

int ulp_pack_remove(ulp_archive *a, const char *name)
{
	return a->ps->be->ops->remove(a->ps->be, name);
}

int ulp_pack_list(ulp_archive *a, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
                  void *arg)
{
	return a->ps->be->ops->list(a->ps->be, prefix, cb, arg);
}
