/* SPDX-License-Identifier: MIT */
/*
 * scratch.c - per-thread scratch buffers that are reused from one call to the
 * next: fresh pages cost about 2.5 us each on first touch, more than coding
 * them, so hot paths borrow these instead of allocating; and large buffers
 * that will be filled (ulp_alloc_big) ask for huge pages.
 *
 * Invariants:
 *  1. A slot's buffer belongs to the calling thread; it stays valid until the
 *     thread asks the same slot again (which may move it) or exits (which
 *     frees it).
 *  2. Each thread has ULP_SCRATCH_LEVELS sets of slots; ulp_scratch serves
 *     the set of the thread's current level (ulp_scratch_push/pop), so a job
 *     the thread runs for another loop while it waits (pool.c) never moves a
 *     buffer the waiting code holds.
 */
#include "ulp_int.h"
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

typedef struct scratch {
	void *p[ULP_SCRATCH_LEVELS][ULP_SCRATCH_SLOTS];
	size_t cap[ULP_SCRATCH_LEVELS][ULP_SCRATCH_SLOTS];
} scratch;

static __thread unsigned level; /* invariant 2 */

int ulp_scratch_can_push(void)
{
	return level + 1 < ULP_SCRATCH_LEVELS;
}

unsigned ulp_scratch_level(void)
{
	return level;
}

void ulp_scratch_push(void)
{
	level++;
}

void ulp_scratch_pop(void)
{
	level--;
}

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void release(void *v)
{
	scratch *s = v;
	for (int l = 0; l < ULP_SCRATCH_LEVELS; l++)
		for (int i = 0; i < ULP_SCRATCH_SLOTS; i++)
			free(s->p[l][i]);
	free(s);
}

static void init(void)
{
	pthread_key_create(&key, release);
}

void *ulp_scratch(unsigned slot, size_t size)
{
	pthread_once(&once, init);
	scratch *s = pthread_getspecific(key);
	if (!s) {
		s = calloc(1, sizeof(*s));
		if (!s || pthread_setspecific(key, s) != 0) {
			free(s);
			return NULL;
		}
	}
	if (slot >= ULP_SCRATCH_SLOTS)
		return NULL;
	void **p = &s->p[level][slot];
	size_t *c = &s->cap[level][slot];
	if (*c < size || !*p) {
		size_t cap = ULP_MAX(size, *c + *c / 2);
		free(*p); /* the contents need not survive (invariant 1) */
		/* the encoder's arenas are sized for the worst case and mostly
		 * left untouched: huge pages would make all of them resident */
		*p = slot == ULP_SCRATCH_ARENA0 || slot == ULP_SCRATCH_ARENA1
		             ? malloc(cap ? cap : 1) : ulp_alloc_big(cap ? cap : 1);
		*c = *p ? cap : 0;
	}
	return *p;
}

#define HUGE_PAGE ((size_t)2 << 20)

void *ulp_alloc_big(size_t size)
{
	if (size < HUGE_PAGE)
		return malloc(size ? size : 1);
	void *p;
	if (posix_memalign(&p, HUGE_PAGE, size) != 0)
		return NULL;
	/* a hint: where the kernel has no transparent huge pages it fails, harmlessly */
	madvise(p, size & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);
	return p;
}

void *ulp_scratch_or_malloc(unsigned slot, size_t size, int *owned)
{
	*owned = size > ULP_SCRATCH_KEEP_MAX;
	return *owned ? malloc(size) : ulp_scratch(slot, size);
}
