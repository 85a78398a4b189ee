/* SPDX-License-Identifier: MIT */
/*
 * slab.c - buffers of 128 KiB to 2 MiB carved from shared 2 MiB slabs that
 * ask for transparent huge pages.
 *
 * The first touch of a fresh 4 KiB page costs 5-25 us on the virtual
 * machines we measure on (a guest page fault each), more than decoding the
 * bytes that fill it; a huge page costs one fault and its zeroing. Buffers
 * from 2 MiB up already get huge pages of their own (ulp_alloc_big). Smaller
 * ones, the last chunk of a tensor or a tensor under 2 MiB, would fault page
 * by page: a cold read through a delta chain fills one such buffer per link.
 * Carved side by side from 2 MiB slabs, they fault once per slab.
 *
 * Invariants:
 *  1. A slab's refs is the number of its live buffers, plus one while it is
 *     one of its carver's open slabs. Whoever drops the last reference frees it,
 *     so buffers may outlive their carver, and any thread may free them.
 *  2. Buffers are carved in address order and never cross the slab's end
 *     (ULP_SLAB_SPAN: the huge page and one small page after it, so that
 *     buffers of 512 KiB or 1.5 MiB plus a small header still pack a huge
 *     page exactly); a slab's space is reused only once all of it is free
 *     (it is then freed, and malloc or the kernel hands out its pages again).
 *  3. Only sizes from ULP_SLAB_MIN to ULP_SLAB_BYTES are carved: a live
 *     buffer keeps at most ULP_SLAB_SPAN / ULP_SLAB_MIN (about 16) times its own
 *     size resident. Buffers are freed roughly in the order they were carved
 *     (the decode cache's LRU), so a slab is usually freed soon after its last
 *     buffer ages out.
 *  4. A carver keeps two slabs open and carves from the one that fits with
 *     the least room left (best fit), so a request that does not fit one
 *     slab does not end the other's use; a new slab replaces the fuller.
 */
#include "ulp_int.h"
#include <stdint.h>
#include <stdlib.h>

struct ulp_slab {
	uint8_t *base;  /* ULP_SLAB_SPAN bytes, 2 MiB aligned */
	size_t used;    /* bytes carved so far (carver's mu) */
	int refs;       /* invariant 1 (atomic) */
};

#define CARVE_ALIGN 16 /* as malloc's */

void ulp_carver_init(ulp_carver *c)
{
	pthread_mutex_init(&c->mu, NULL);
	c->open[0] = c->open[1] = NULL;
}

void ulp_slab_put(ulp_slab *s)
{
	if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0) {
		free(s->base);
		free(s);
	}
}

void ulp_carver_done(ulp_carver *c)
{
	ulp_slab_put(c->open[0]);
	ulp_slab_put(c->open[1]);
	c->open[0] = c->open[1] = NULL;
	pthread_mutex_destroy(&c->mu);
}

static size_t room(const ulp_slab *s)
{
	return s ? ULP_SLAB_SPAN - s->used : 0;
}

void *ulp_carve(ulp_carver *c, size_t size, ulp_slab **slab)
{
	if (size < ULP_SLAB_MIN || size > ULP_SLAB_BYTES)
		return NULL;
	size_t take = (size + CARVE_ALIGN - 1) & ~(size_t)(CARVE_ALIGN - 1);
	pthread_mutex_lock(&c->mu);
	/* invariant 4: the open slab that fits with the least room left */
	int i = room(c->open[0]) >= take ? 0 : -1;
	if (room(c->open[1]) >= take && (i < 0 || room(c->open[1]) < room(c->open[0])))
		i = 1;
	if (i < 0) {
		/* a new slab in place of the fuller one: the memory is untouched,
		 * so this holds the lock for an allocation, not for its faults */
		ulp_slab *n = malloc(sizeof(*n));
		void *base = n ? ulp_alloc_big(ULP_SLAB_SPAN) : NULL;
		if (!base) {
			free(n);
			pthread_mutex_unlock(&c->mu);
			return NULL; /* the caller falls back to malloc */
		}
		n->base = base;
		n->used = 0;
		n->refs = 1; /* the carver's (invariant 1) */
		i = room(c->open[0]) <= room(c->open[1]) ? 0 : 1;
		ulp_slab_put(c->open[i]); /* it lives on while its buffers do */
		c->open[i] = n;
	}
	ulp_slab *s = c->open[i];
	void *p = s->base + s->used;
	s->used += take;
	__atomic_add_fetch(&s->refs, 1, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&c->mu);
	*slab = s;
	return p;
}
