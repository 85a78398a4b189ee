/* SPDX-License-Identifier: MIT */
/*
 * upkeep.c - a shared archive's writer keeps its readers current: a thread
 * of its own (the publisher) publishes what was archived since the last
 * publication (at most a tenth of the time goes to publishing: gen.c),
 * retires generations and sweeps packs past the grace (maint.c), while the
 * lease holds; at close it publishes what was archived last. The lease's
 * renewer (store/lease.c) starts it beside itself, in the process that
 * writes (a daemon forks after it opened the archive, and threads do not
 * cross a fork), through the hook it installs at open.
 *
 * Invariants:
 *  1. The publisher runs only in the process that started it and only
 *     while the lease holds (ulp_lease_ok before each round); a fenced
 *     writer's publisher ends.
 *  2. ulp_upkeep_stop joins it before the lease is given back
 *     (ulp_shared_free), and publishes last: nothing archived before close
 *     is left unpublished by a writer whose lease held.
 */
#include "arch_int.h"
#include "store/shared.h"
#include "archive/writer.h"
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct ulp_upkeep {
	pthread_mutex_t mu;
	pthread_cond_t cv;  /* with mu: wakes the publisher to end */
	pthread_t th;       /* guarded by mu */
	long pid;           /* guarded by mu: the process it runs in (0: none) */
	int stop;           /* guarded by mu */
};

/* Waits for the next round (a second, at most a quarter lease): 0 to go
 * on, 1 to end (stop, or fenced). mu held on entry and exit. */
static int tick(ulp_archive *a, ulp_upkeep *u)
{
	ulp_shared *sh = a->sh;
	struct timespec ts;
	ulp_deadline_ms(&ts, ulp_lease_tick_ms(sh));
	pthread_cond_timedwait(&u->cv, &u->mu, &ts);
	return u->stop || __atomic_load_n(&sh->fenced, __ATOMIC_ACQUIRE);
}

static void *publisher(void *arg)
{
	ulp_archive *a = arg;
	ulp_upkeep *u = a->w->upkeep;
	int64_t last_pub = 0, pub_cost = 0;
	pthread_mutex_lock(&u->mu);
	while (!tick(a, u)) {
		pthread_mutex_unlock(&u->mu);
		int64_t now = ulp_mono_ms();
		if (ulp_lease_ok(a) == 0 && now - last_pub >= 10 * pub_cost) {
			int64_t t0 = ulp_mono_ms();
			ulp_generation before, after;
			ulp_archive_generation(a, &before);
			if (ulp_gen_publish(a, 0) == 0 && (ulp_archive_generation(a, &after), after.gen != before.gen)) {
				pub_cost = ulp_mono_ms() - t0;
				last_pub = ulp_mono_ms();
			}
			ulp_gen_retire(a);
			ulp_archive_grace_sweep(a, 0);
		}
		pthread_mutex_lock(&u->mu);
	}
	pthread_mutex_unlock(&u->mu);
	return NULL;
}

/* The renewer's hook (shared.h on_renewer): the publisher, once per process. */
static void start(ulp_archive *a)
{
	ulp_upkeep *u = a->w->upkeep;
	long me = (long)getpid();
	pthread_mutex_lock(&u->mu);
	if (u->pid != me && !u->stop && pthread_create(&u->th, NULL, publisher, a) == 0)
		u->pid = me;
	pthread_mutex_unlock(&u->mu);
}

int ulp_upkeep_new(ulp_archive *a)
{
	ulp_upkeep *u = calloc(1, sizeof(*u));
	if (!u)
		return -ULP_E_NOMEM;
	pthread_mutex_init(&u->mu, NULL);
	pthread_cond_init(&u->cv, NULL);
	a->w->upkeep = u;
	a->sh->on_renewer = start;
	return 0;
}

void ulp_upkeep_stop(ulp_archive *a)
{
	ulp_upkeep *u = a->w->upkeep;
	if (!u)
		return;
	pthread_mutex_lock(&u->mu);
	u->stop = 1;
	pthread_cond_broadcast(&u->cv);
	int mine = u->pid == (long)getpid();
	pthread_mutex_unlock(&u->mu);
	if (mine)
		pthread_join(u->th, NULL);
	if (a->sh && a->sh->writer && a->sh->epoch && ulp_lease_ok(a) == 0)
		ulp_gen_publish(a, 0); /* invariant 2: what was archived last */
	pthread_mutex_destroy(&u->mu);
	pthread_cond_destroy(&u->cv);
	free(u);
	a->w->upkeep = NULL;
}
