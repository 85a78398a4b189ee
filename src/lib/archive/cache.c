/* SPDX-License-Identifier: MIT */
/*
 * cache.c - the decode cache: values (decoded chunks, parsed blobs) keyed by
 * content, bounded in bytes, LRU, thread-safe, with single-flight loading.
 *
 * Invariants (checked by ulp_cache_state_ok):
 *  1. Every entry is in the hash table exactly once, but a failed one: it
 *     leaves the table as it fails (ulp_cache_fail), so that the next lookup
 *     loads afresh (a reader that can), and its last waiter frees it.
 *  2. An entry is on the LRU list iff it is loaded and unpinned (refs == 0).
 *  3. bytes == sum of the sizes of loaded entries.
 *  4. Eviction only frees loaded, unpinned entries; bytes may exceed cap
 *     only while pinned entries hold more than cap.
 *  5. A loading entry has exactly one loader; waiters hold a pin and wait on
 *     cv until it is loaded or failed.
 *  6. Cold entries (released by ulp_cache_put_cold) sit at the oldest end of
 *     the LRU: eviction and ulp_cache_alloc's recycling take them first.
 *  7. seed_bytes == sum of the sizes of loaded seeded entries (those the
 *     archiver filled with what it just coded, ulp_cache_fill_seed); a seed
 *     is only made while seed_bytes < seed_cap, so seeds hold at most
 *     seed_cap plus one chunk a filling thread (ulp_cache_seed_room is a
 *     hint taken before the fill). The readers' cache stays theirs: without
 *     this bound, archiving a file larger than the cache filled it with the
 *     file's own chunks (a 4.3 GB rank file: 3.2 GB of daemon memory with
 *     the default cache of 1/8 of memory).
 *
 * Chunk buffers of 128 KiB to 2 MiB are carved from shared huge-page slabs
 * (slab.c), larger ones get huge pages of their own (ulp_alloc_big): a cold
 * read through a delta chain fills one fresh buffer per link. bytes counts
 * the buffers, not the slab space their neighbours' eviction leaves unused.
 */
#include "arch_int.h"
#include "archive/cache.h"
#include <stdlib.h>

enum { ST_LOADING, ST_LOADED, ST_FAILED };

struct ulp_centry {
	ulp_ckey key;
	uint64_t hash;
	ulp_centry *next;          /* hash chain */
	ulp_centry *lru_prev, *lru_next;
	void *data;
	size_t size;
	void (*destroy)(void *);
	int refs;                  /* pins */
	int cold;                  /* last released by ulp_cache_put_cold */
	int served;                /* returned to a reader of its own file (atomic) */
	int seeded;                /* filled by ulp_cache_fill_seed (invariant 7) */
	int state;
	int rc;                    /* ST_FAILED: the loader's error */
};

#define FREE_BUFS 16

struct ulp_cache {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	ulp_centry **tab;
	size_t tab_size;           /* power of two */
	size_t count;
	ulp_centry lru;            /* sentinel: lru.lru_next is the oldest */
	uint64_t bytes, cap;
	uint64_t seed_bytes, seed_cap; /* invariant 7 */
	uint64_t recycled;         /* buffers taken from cold entries */
	void *free_buf[FREE_BUFS]; /* buffers of free_size bytes, for reuse */
	size_t free_size;
	int n_free;
	ulp_carver carver;         /* buffers under 2 MiB share huge pages (slab.c) */
};

/* Buffers carry their size in front, so a freed one can be reused, and the
 * slab they were carved from (NULL: malloc'd). */
typedef struct bufhdr {
	size_t size;
	ulp_slab *slab;
} bufhdr;

static void buf_free(bufhdr *h)
{
	if (h && h->slab)
		ulp_slab_put(h->slab);
	else
		free(h);
}

static uint64_t key_hash(const ulp_ckey *k)
{
	uint64_t h;
	memcpy(&h, k->sha, 8); /* the content hash is already uniform */
	return h ^ ((uint64_t)k->chunk * 0x9E3779B97F4A7C15ull) ^ k->kind;
}

int ulp_cache_new(uint64_t cap, ulp_cache **out)
{
	ulp_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ULP_E_NOMEM;
	c->tab_size = 1024;
	c->tab = calloc(c->tab_size, sizeof(*c->tab));
	if (!c->tab) {
		free(c);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	c->lru.lru_next = c->lru.lru_prev = &c->lru;
	c->cap = cap;
	c->seed_cap = ulp_cache_seed_cap(cap);
	ulp_carver_init(&c->carver);
	*out = c;
	return 0;
}

static void lru_unlink(ulp_centry *e)
{
	if (e->lru_next) {
		e->lru_prev->lru_next = e->lru_next;
		e->lru_next->lru_prev = e->lru_prev;
		e->lru_next = e->lru_prev = NULL;
	}
}

static void lru_push(ulp_cache *c, ulp_centry *e)
{
	e->lru_prev = c->lru.lru_prev;
	e->lru_next = &c->lru;
	c->lru.lru_prev->lru_next = e;
	c->lru.lru_prev = e;
}

/* at the other end: the next to go */
static void lru_push_oldest(ulp_cache *c, ulp_centry *e)
{
	e->lru_next = c->lru.lru_next;
	e->lru_prev = &c->lru;
	c->lru.lru_next->lru_prev = e;
	c->lru.lru_next = e;
}

static void tab_remove(ulp_cache *c, ulp_centry *e)
{
	ulp_centry **pp = &c->tab[e->hash & (c->tab_size - 1)];
	while (*pp != e)
		pp = &(*pp)->next;
	*pp = e->next;
	c->count--;
}

static void grow(ulp_cache *c)
{
	size_t ns = c->tab_size * 2;
	ulp_centry **nt = calloc(ns, sizeof(*nt));
	if (!nt)
		return; /* longer chains, still correct */
	for (size_t i = 0; i < c->tab_size; i++) {
		ulp_centry *e = c->tab[i];
		while (e) {
			ulp_centry *next = e->next;
			e->next = nt[e->hash & (ns - 1)];
			nt[e->hash & (ns - 1)] = e;
			e = next;
		}
	}
	free(c->tab);
	c->tab = nt;
	c->tab_size = ns;
}

/* Keeps a buffer of ulp_cache_alloc for reuse if the free list has room
 * for its size; 0 if the caller is to free it (mu held). */
static int keep_free(ulp_cache *c, bufhdr *h)
{
	if (c->n_free < FREE_BUFS && (c->n_free == 0 || h->size == c->free_size)) {
		c->free_size = h->size;
		c->free_buf[c->n_free++] = h;
		return 1;
	}
	return 0;
}

/* An entry's bytes leave the counts (mu held). */
static void uncount(ulp_cache *c, const ulp_centry *e)
{
	c->bytes -= e->size;
	if (e->seeded)
		c->seed_bytes -= e->size;
}

/* Frees the value of an entry that left the cache (mu held). */
static void release_value(ulp_cache *c, ulp_centry *e)
{
	if (!e->data)
		return;
	if (e->destroy == ulp_cache_free_buf && keep_free(c, (bufhdr *)e->data - 1))
		return;
	if (e->destroy)
		e->destroy(e->data);
}

void ulp_cache_give_buf(ulp_cache *c, void *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&c->mu);
	int kept = keep_free(c, (bufhdr *)p - 1);
	pthread_mutex_unlock(&c->mu);
	if (!kept)
		ulp_cache_free_buf(p);
}

static void evict(ulp_cache *c)
{
	while (c->bytes > c->cap && c->lru.lru_next != &c->lru) {
		ulp_centry *e = c->lru.lru_next;
		lru_unlink(e);
		tab_remove(c, e);
		uncount(c, e);
		release_value(c, e);
		free(e);
	}
}

void ulp_cache_free(ulp_cache *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->tab_size; i++) {
		ulp_centry *e = c->tab[i];
		while (e) {
			ulp_centry *next = e->next;
			if (e->data && e->destroy)
				e->destroy(e->data);
			free(e);
			e = next;
		}
	}
	for (int i = 0; i < c->n_free; i++)
		buf_free(c->free_buf[i]);
	ulp_carver_done(&c->carver);
	free(c->tab);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

int ulp_cache_get(ulp_cache *c, const ulp_ckey *key, ulp_centry **out, void **data, int *must_load)
{
	uint64_t h = key_hash(key);
	pthread_mutex_lock(&c->mu);
	ulp_centry *e = c->tab[h & (c->tab_size - 1)];
	while (e && (e->hash != h || memcmp(&e->key, key, sizeof(*key)) != 0))
		e = e->next;
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&c->mu);
			return -ULP_E_NOMEM;
		}
		e->key = *key;
		e->hash = h;
		e->state = ST_LOADING;
		e->refs = 1;
		if (c->count + 1 > c->tab_size)
			grow(c);
		e->next = c->tab[h & (c->tab_size - 1)];
		c->tab[h & (c->tab_size - 1)] = e;
		c->count++;
		pthread_mutex_unlock(&c->mu);
		*out = e;
		*data = NULL;
		*must_load = 1;
		return 0;
	}
	if (e->refs++ == 0)
		lru_unlink(e);
	while (e->state == ST_LOADING)
		pthread_cond_wait(&c->cv, &c->mu);
	if (e->state == ST_FAILED) { /* (out of the table already: invariant 1) */
		int rc = e->rc;
		if (--e->refs == 0)
			free(e);
		pthread_mutex_unlock(&c->mu);
		return rc;
	}
	pthread_mutex_unlock(&c->mu);
	*out = e;
	*data = e->data;
	*must_load = 0;
	return 0;
}

uint64_t ulp_cache_seed_cap(uint64_t cap)
{
	return ULP_MIN(cap / 4, ULP_CACHE_SEED_MAX);
}

static void fill(ulp_cache *c, ulp_centry *e, void *data, size_t size, void (*destroy)(void *), int seeded)
{
	pthread_mutex_lock(&c->mu);
	e->data = data;
	e->size = size;
	e->destroy = destroy;
	e->state = ST_LOADED;
	e->seeded = seeded;
	c->bytes += size;
	if (seeded)
		c->seed_bytes += size;
	pthread_cond_broadcast(&c->cv);
	evict(c);
	pthread_mutex_unlock(&c->mu);
}

void ulp_cache_fill(ulp_cache *c, ulp_centry *e, void *data, size_t size, void (*destroy)(void *))
{
	fill(c, e, data, size, destroy, 0);
}

void ulp_cache_fill_seed(ulp_cache *c, ulp_centry *e, void *data, size_t size, void (*destroy)(void *))
{
	fill(c, e, data, size, destroy, 1);
}

int ulp_cache_seed_room(ulp_cache *c, size_t size)
{
	pthread_mutex_lock(&c->mu);
	int room = size <= c->seed_cap && c->seed_bytes <= c->seed_cap - size;
	pthread_mutex_unlock(&c->mu);
	return room;
}

void ulp_cache_fail(ulp_cache *c, ulp_centry *e, int rc)
{
	pthread_mutex_lock(&c->mu);
	e->state = ST_FAILED;
	e->rc = rc < 0 ? rc : -ULP_E_IO;
	tab_remove(c, e); /* invariant 1: a later get loads afresh */
	pthread_cond_broadcast(&c->cv);
	if (--e->refs == 0) /* nobody waits */
		free(e);
	pthread_mutex_unlock(&c->mu);
}

static void put(ulp_cache *c, ulp_centry *e, int cold)
{
	if (!e)
		return;
	pthread_mutex_lock(&c->mu);
	if (--e->refs == 0) {
		if (e->state == ST_LOADED) {
			e->cold = cold;
			if (cold)
				lru_push_oldest(c, e);
			else
				lru_push(c, e);
			evict(c);
		} else { /* failed (out of the table), last waiter gone */
			if (e->state != ST_FAILED)
				tab_remove(c, e);
			free(e);
		}
	}
	pthread_mutex_unlock(&c->mu);
}

void ulp_cache_put(ulp_cache *c, ulp_centry *e)
{
	put(c, e, 0);
}

void ulp_cache_put_cold(ulp_cache *c, ulp_centry *e)
{
	put(c, e, 1);
}

void ulp_cache_put_ref(ulp_cache *c, ulp_centry *e)
{
	put(c, e, e && __atomic_load_n(&e->served, __ATOMIC_RELAXED));
}

void ulp_cache_purge(ulp_cache *c, int (*drop)(void *arg, const ulp_ckey *key, void *data), void *arg)
{
	pthread_mutex_lock(&c->mu);
	/* only loaded, unpinned entries are on the LRU (invariant 2) */
	for (ulp_centry *e = c->lru.lru_next, *next; e != &c->lru; e = next) {
		next = e->lru_next;
		if (!drop(arg, &e->key, e->data))
			continue;
		lru_unlink(e);
		tab_remove(c, e);
		uncount(c, e);
		release_value(c, e);
		free(e);
	}
	pthread_mutex_unlock(&c->mu);
}

void ulp_cache_retire(ulp_cache *c, const ulp_ckey *key)
{
	uint64_t h = key_hash(key);
	pthread_mutex_lock(&c->mu);
	ulp_centry *e = c->tab[h & (c->tab_size - 1)];
	while (e && (e->hash != h || memcmp(&e->key, key, sizeof(*key)) != 0))
		e = e->next;
	if (e && e->refs == 0 && e->state == ST_LOADED) { /* on the LRU (invariant 2) */
		lru_unlink(e);
		tab_remove(c, e);
		uncount(c, e);
		release_value(c, e);
		free(e);
	}
	pthread_mutex_unlock(&c->mu);
}

int ulp_cache_peek(ulp_cache *c, const ulp_ckey *key, ulp_centry **out, void **data, size_t *size)
{
	uint64_t h = key_hash(key);
	pthread_mutex_lock(&c->mu);
	ulp_centry *e = c->tab[h & (c->tab_size - 1)];
	while (e && (e->hash != h || memcmp(&e->key, key, sizeof(*key)) != 0))
		e = e->next;
	int found = e && e->state == ST_LOADED;
	if (found) {
		if (e->refs++ == 0)
			lru_unlink(e); /* invariant 2: pinned, off the LRU */
		*out = e;
		*data = e->data;
		*size = e->size;
	}
	pthread_mutex_unlock(&c->mu);
	return found;
}

int ulp_cache_has(ulp_cache *c, const ulp_ckey *key)
{
	uint64_t h = key_hash(key);
	pthread_mutex_lock(&c->mu);
	ulp_centry *e = c->tab[h & (c->tab_size - 1)];
	while (e && (e->hash != h || memcmp(&e->key, key, sizeof(*key)) != 0))
		e = e->next;
	int found = e && e->state != ST_FAILED;
	pthread_mutex_unlock(&c->mu);
	return found;
}

/* How far from the oldest end ulp_cache_alloc looks for a cold buffer. */
#define RECYCLE_SCAN 8

void *ulp_cache_alloc(ulp_cache *c, size_t size)
{
	bufhdr *h = NULL;
	pthread_mutex_lock(&c->mu);
	if (c->n_free && c->free_size == size)
		h = c->free_buf[--c->n_free];
	/* A cold chunk (a reference whose next step is decoded) that its own
	 * file's reader has had gives its buffer even while the cache has room:
	 * fresh pages cost the kernel more (zeroing, faults) than the decode
	 * that fills them, and in a read of steps in order that chunk is not
	 * wanted again. (One nobody has read yet, such as a step that another
	 * reader is about to read, stays.) */
	ulp_centry *e = c->lru.lru_next;
	for (int i = 0; !h && i < RECYCLE_SCAN && e != &c->lru && e->cold; i++, e = e->lru_next)
		if (e->destroy == ulp_cache_free_buf && ((bufhdr *)e->data - 1)->size == size &&
		    __atomic_load_n(&e->served, __ATOMIC_RELAXED)) {
			lru_unlink(e);
			tab_remove(c, e);
			uncount(c, e);
			c->recycled++;
			h = (bufhdr *)e->data - 1;
			free(e);
			break; /* e is gone */
		}
	pthread_mutex_unlock(&c->mu);
	if (!h) {
		size_t total = sizeof(bufhdr) + (size ? size : 1);
		ulp_slab *slab = NULL;
		h = ulp_carve(&c->carver, total, &slab);
		if (!h && !(h = ulp_alloc_big(total)))
			return NULL;
		h->size = size;
		h->slab = slab;
	}
	return h + 1;
}

void ulp_cache_free_buf(void *p)
{
	if (p)
		buf_free((bufhdr *)p - 1);
}

void ulp_cache_mark_served(ulp_centry *e)
{
	__atomic_store_n(&e->served, 1, __ATOMIC_RELAXED);
}

/* One of the cache's counters, read under its lock. */
static uint64_t counter(ulp_cache *c, const uint64_t *field)
{
	pthread_mutex_lock(&c->mu);
	uint64_t v = *field;
	pthread_mutex_unlock(&c->mu);
	return v;
}

uint64_t ulp_cache_recycled(ulp_cache *c)
{
	return counter(c, &c->recycled);
}

uint64_t ulp_cache_bytes(ulp_cache *c)
{
	return counter(c, &c->bytes);
}

uint64_t ulp_cache_seed_bytes(ulp_cache *c)
{
	return counter(c, &c->seed_bytes);
}

int ulp_cache_state_ok(ulp_cache *c)
{
	int ok = 1;
	uint64_t bytes = 0, seeds = 0;
	size_t count = 0;
	pthread_mutex_lock(&c->mu);
	for (size_t i = 0; i < c->tab_size; i++)
		for (ulp_centry *e = c->tab[i]; e; e = e->next) {
			count++;
			if ((e->hash & (c->tab_size - 1)) != i)
				ok = 0;
			if (e->state == ST_LOADED) {
				bytes += e->size;
				seeds += e->seeded ? e->size : 0;
			}
			int on_lru = e->lru_next != NULL;
			if (on_lru != (e->state == ST_LOADED && e->refs == 0))
				ok = 0;
		}
	if (count != c->count || bytes != c->bytes || seeds != c->seed_bytes) /* invariant 7 */
		ok = 0;
	int warm = 0; /* invariant 6: cold entries first */
	for (ulp_centry *e = c->lru.lru_next; e != &c->lru; e = e->lru_next) {
		if (e->cold && warm)
			ok = 0;
		warm |= !e->cold;
	}
	pthread_mutex_unlock(&c->mu);
	return ok;
}
