/* SPDX-License-Identifier: MIT */
/*
 * scratch.c - per-thread scratch buffers that are reused from one call to the
 * next: fresh pages cost about 2.5 us each on first touch, more than coding
 * them, so hot paths borrow these instead of allocating.
 *
 * Invariants:
 *  1. A slot's buffer belongs to the calling thread; it stays valid until the
 *     thread asks the same slot again (which may move it) or exits (which
 *     frees it).
 */
#include "ulp_int.h"
#include <pthread.h>
#include <stdlib.h>

typedef struct scratch {
	void *p[ULP_SCRATCH_SLOTS];
	size_t cap[ULP_SCRATCH_SLOTS];
} scratch;

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void release(void *v)
{
	scratch *s = v;
	for (int i = 0; i < ULP_SCRATCH_SLOTS; i++)
		free(s->p[i]);
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
	if (s->cap[slot] < size || !s->p[slot]) {
		size_t cap = ULP_MAX(size, s->cap[slot] + s->cap[slot] / 2);
		void *np = realloc(s->p[slot], cap ? cap : 1);
		if (!np)
			return NULL;
		s->p[slot] = np;
		s->cap[slot] = cap;
	}
	return s->p[slot];
}
