/* SPDX-License-Identifier: MIT */
/*
 * pool.c - a fixed pool of worker threads running parallel-for jobs.
 *
 * Invariants:
 *  1. At most one ulp_pool_run() is in flight per pool: a caller that finds
 *     the pool busy runs its jobs itself, in order (so callers never wait on
 *     each other and a job may itself call ulp_pool_run()).
 *  2. Jobs are claimed through one atomic counter, so each index runs once.
 *  3. ulp_pool_run() returns only after every worker has left the job.
 *  4. Workers run a job at the scheduling niceness of the thread that
 *     called ulp_pool_run() (ulp_thread_set_nice), so that background work
 *     (the write-back session's archiver) stays background on every thread.
 *  5. The wall time of every outermost ulp_pool_run() of more than one job
 *     (a parallel region, even when the pool has one thread) is added to
 *     one process-wide counter, for the serial fraction of `ulpack bench`.
 */
#include "ulp_int.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t region_ns;            /* invariant 5 (atomic) */
static __thread unsigned region_depth; /* ulp_pool_run()s this thread is inside */
static __thread int thread_nice;      /* what ulp_thread_set_nice last set (invariant 4) */
static __thread const int *nice_src;  /* ulp_thread_follow_nice */

void ulp_thread_follow_nice(const int *src)
{
	nice_src = src;
}

int ulp_thread_set_nice(int nice)
{
	if (nice == thread_nice)
		return 0;
	/* Linux: PRIO_PROCESS with a thread id sets that thread alone */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice) < 0)
		return -errno; /* (lowering it needs CAP_SYS_NICE or RLIMIT_NICE) */
	thread_nice = nice;
	return 0;
}

uint64_t ulp_pool_parallel_ns(void)
{
	return __atomic_load_n(&region_ns, __ATOMIC_RELAXED);
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int pool_run(ulp_pool *p, size_t n, int (*fn)(void *, size_t), void *arg);

int ulp_pool_run(ulp_pool *p, size_t n, int (*fn)(void *, size_t), void *arg)
{
	if (nice_src && region_depth == 0)
		ulp_thread_set_nice(__atomic_load_n(nice_src, __ATOMIC_RELAXED));
	if (n <= 1 || region_depth > 0) /* one job: serial, but what it runs may not be */
		return pool_run(p, n, fn, arg);
	uint64_t t0 = now_ns();
	region_depth++;
	int rc = pool_run(p, n, fn, arg);
	region_depth--;
	__atomic_fetch_add(&region_ns, now_ns() - t0, __ATOMIC_RELAXED);
	return rc;
}

struct ulp_pool {
	int n_workers;          /* threads besides the caller */
	pthread_t *tid;
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done;
	uint64_t generation;    /* bumped for each job */
	int busy;               /* workers still inside the current job */
	int quit;
	/* current job */
	size_t n, next;         /* next is claimed atomically */
	int (*fn)(void *, size_t);
	void *arg;
	int rc;                 /* first error, 0 if none */
	int nice;               /* the caller's niceness (invariant 4) */
	pthread_mutex_t run_mu; /* held by the ulp_pool_run() in flight */
};

static void run_jobs(ulp_pool *p)
{
	for (;;) {
		size_t i = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
		if (i >= p->n)
			break;
		int rc = p->fn(p->arg, i);
		if (rc < 0) {
			int zero = 0;
			__atomic_compare_exchange_n(&p->rc, &zero, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
		}
	}
}

static void *worker(void *arg)
{
	ulp_pool *p = arg;
	uint64_t seen = 0;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->quit && p->generation == seen)
			pthread_cond_wait(&p->cv_work, &p->mu);
		if (p->quit)
			break;
		seen = p->generation;
		int nice = p->nice;
		pthread_mutex_unlock(&p->mu);
		ulp_thread_set_nice(nice); /* (refused: the job runs as it can) */
		run_jobs(p);
		pthread_mutex_lock(&p->mu);
		if (--p->busy == 0)
			pthread_cond_signal(&p->cv_done);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int ulp_pool_new(int threads, ulp_pool **out)
{
	if (threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (int)n : 1;
	}
	if (threads > ULP_MAX_THREADS)
		return -ULP_E_INVAL;
	ulp_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ULP_E_NOMEM;
	p->tid = calloc((size_t)threads, sizeof(pthread_t));
	if (!p->tid) {
		free(p);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv_work, NULL);
	pthread_cond_init(&p->cv_done, NULL);
	pthread_mutex_init(&p->run_mu, NULL);
	for (int i = 0; i < threads - 1; i++) {
		if (pthread_create(&p->tid[i], NULL, worker, p) != 0)
			break;
		p->n_workers++;
	}
	*out = p;
	return 0;
}

void ulp_pool_free(ulp_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->quit = 1;
	pthread_cond_broadcast(&p->cv_work);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->n_workers; i++)
		pthread_join(p->tid[i], NULL);
	pthread_cond_destroy(&p->cv_work);
	pthread_cond_destroy(&p->cv_done);
	pthread_mutex_destroy(&p->mu);
	pthread_mutex_destroy(&p->run_mu);
	free(p->tid);
	free(p);
}

int ulp_pool_threads(const ulp_pool *p)
{
	return p ? p->n_workers + 1 : 1;
}

static int pool_run(ulp_pool *p, size_t n, int (*fn)(void *, size_t), void *arg)
{
	if (!p || p->n_workers == 0 || n <= 1 || pthread_mutex_trylock(&p->run_mu) != 0) {
		int first = 0;
		for (size_t i = 0; i < n; i++) {
			int rc = fn(arg, i);
			if (rc < 0 && first == 0)
				first = rc;
		}
		return first;
	}
	pthread_mutex_lock(&p->mu);
	p->n = n;
	p->next = 0;
	p->fn = fn;
	p->arg = arg;
	p->rc = 0;
	p->nice = thread_nice;
	p->busy = p->n_workers;
	p->generation++;
	pthread_cond_broadcast(&p->cv_work);
	pthread_mutex_unlock(&p->mu);
	run_jobs(p);
	pthread_mutex_lock(&p->mu);
	while (p->busy > 0)
		pthread_cond_wait(&p->cv_done, &p->mu);
	int rc = p->rc;
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_unlock(&p->run_mu);
	return rc;
}
