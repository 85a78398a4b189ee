/* SPDX-License-Identifier: MIT */
/*
 * pool.c - a fixed pool of worker threads running parallel-for jobs, nested
 * and shared: a job may itself call ulp_pool_run(), and so may unrelated
 * callers at the same time; every idle thread takes work from any of them.
 *
 * Each ulp_pool_run() of more than one job is a loop on the pool's stack of
 * open loops, at the depth of its caller (how many jobs it is inside). Its
 * caller claims indices of its own loop; workers claim from the innermost
 * open loop (the newest), so the chunks of a tensor finish before more
 * tensors start; a caller whose indices are all claimed helps with loops
 * at its own depth or deeper (chunks of other tensors, not more tensors:
 * memory stays that of the jobs in flight) until the last of its own jobs
 * returns, instead of waiting idle at the barrier.
 *
 * Invariants:
 *  1. Indices are claimed through one atomic counter per loop, so each index
 *     runs once; a loop stays on the stack (under mu) until its caller finds
 *     every index claimed, so a thread that takes it from the stack under mu
 *     reads a live loop.
 *  2. ulp_pool_run() returns only after every job of its loop has returned
 *     (done == n, counted with release, read with acquire).
 *  3. A thread that helps with another loop while it waits runs that job with
 *     its own per-thread scratch buffers set aside (ulp_scratch_push), so the
 *     job cannot overwrite buffers the waiting caller still uses; help nests
 *     at most ULP_SCRATCH_LEVELS - 1 deep.
 *  4. The wall time of every outermost ulp_pool_run() of more than one job
 *     (a parallel region, even when the pool has one thread) is added to
 *     one process-wide counter, for the serial fraction of `ulpack bench`.
 *  5. Every job runs at the scheduling niceness of the thread that opened
 *     its loop (ulp_thread_set_nice; the lowest, 19, also as SCHED_IDLE),
 *     or, where that thread follows one (ulp_thread_follow_nice), at the
 *     niceness it follows as the job starts (so do the jobs of loops those
 *     jobs open), whichever thread runs it, and a thread gets its own
 *     niceness back afterwards: background work (the write-back
 *     session's archiver) stays background on every thread, and a caller
 *     that helps with it does not stay background.
 */
#include "ulp_int.h"
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static uint64_t region_ns;            /* invariant 4 (atomic) */
static __thread unsigned region_depth; /* ulp_pool_run()s this thread is inside */
static __thread int thread_nice;      /* what ulp_thread_set_nice last set (invariant 5) */
static __thread const int *nice_src;  /* ulp_thread_follow_nice */
static __thread const int *job_src;   /* the nice_src of the loop whose job this thread runs */
static __thread unsigned job_depth;    /* loop jobs this thread is inside */

void ulp_thread_follow_nice(const int *src)
{
	nice_src = src;
}

int ulp_thread_set_nice(int nice)
{
	if (nice == thread_nice)
		return 0;
	/* Linux: PRIO_PROCESS and sched_setscheduler with a thread id set that
	 * thread alone. The lowest niceness also takes SCHED_IDLE where the
	 * kernel has it: a thread of any other policy that wakes then takes the
	 * core at once, where niceness alone lets the running thread finish its
	 * slice first (a FUSE request waited up to a slice behind archiving) */
	pid_t tid = (pid_t)syscall(SYS_gettid);
	struct sched_param sp = {0};
#ifdef SCHED_IDLE
	if (thread_nice >= 19 && nice < 19 && sched_setscheduler(tid, SCHED_OTHER, &sp) < 0)
		return -errno; /* (needs CAP_SYS_NICE or RLIMIT_NICE) */
#endif
	if (setpriority(PRIO_PROCESS, (id_t)tid, nice) < 0)
		return -errno; /* (lowering it needs CAP_SYS_NICE or RLIMIT_NICE) */
#ifdef SCHED_IDLE
	if (nice >= 19)
		(void)sched_setscheduler(tid, SCHED_IDLE, &sp); /* (refused: niceness alone) */
#endif
	thread_nice = nice;
	return 0;
}

uint64_t ulp_pool_parallel_ns(void)
{
	return __atomic_load_n(&region_ns, __ATOMIC_RELAXED);
}

static uint64_t now_ns(void)
{
	return (uint64_t)ulp_mono_ns();
}

typedef struct loop {
	int (*fn)(void *, size_t);
	void *arg;
	size_t n;
	unsigned depth;         /* job_depth of its caller */
	int nice;               /* its caller's niceness (invariant 5) */
	const int *src;         /* or, read at each job, what its caller follows */
	size_t next;            /* atomic: next index to claim */
	size_t done;            /* atomic: jobs returned */
	int rc;                 /* atomic: first error, 0 if none */
	struct loop *below;     /* the stack of open loops (under mu) */
} loop;

struct ulp_pool {
	int n_workers;          /* threads besides the callers */
	pthread_t *tid;
	pthread_mutex_t mu;
	pthread_cond_t cv;      /* a loop opened, or a loop's last job returned */
	loop *top;              /* innermost open loop (under mu) */
	int quit;
};

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

/* Runs index i of l and counts it (invariant 2); a region it opens is
 * inside its caller's (invariant 4). l may be gone once done reaches n. */
static void run_one(ulp_pool *p, loop *l, size_t i)
{
	size_t n = l->n;
	unsigned jd = job_depth;
	int own_nice = thread_nice;
	const int *own_src = job_src;
	/* invariant 5 (refused: the job runs as it can); a followed niceness
	 * is read at each job, so a barrier that brings the archiver forward
	 * reaches the jobs of a loop already open */
	ulp_thread_set_nice(l->src ? __atomic_load_n(l->src, __ATOMIC_RELAXED) : l->nice);
	job_src = l->src;
	region_depth++;
	job_depth = l->depth + 1;
	int rc = l->fn(l->arg, i);
	job_depth = jd;
	region_depth--;
	job_src = own_src;
	ulp_thread_set_nice(own_nice);
	if (rc < 0) {
		int zero = 0;
		__atomic_compare_exchange_n(&l->rc, &zero, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
	}
	if (__atomic_add_fetch(&l->done, 1, __ATOMIC_ACQ_REL) == n) {
		pthread_mutex_lock(&p->mu); /* the caller checks done under mu: no lost wake-up */
		pthread_cond_broadcast(&p->cv);
		pthread_mutex_unlock(&p->mu);
	}
}

/* Under mu: claims an index of the innermost loop at depth min_depth or
 * deeper that has one left. */
static loop *claim(ulp_pool *p, unsigned min_depth, size_t *i)
{
	for (loop *l = p->top; l; l = l->below) {
		if (l->depth < min_depth)
			continue;
		size_t k = __atomic_fetch_add(&l->next, 1, __ATOMIC_RELAXED);
		if (k < l->n) {
			*i = k;
			return l;
		}
	}
	return NULL;
}

static void unlink_loop(ulp_pool *p, loop *l)
{
	for (loop **q = &p->top; *q; q = &(*q)->below)
		if (*q == l) {
			*q = l->below;
			return;
		}
}

static void *worker(void *arg)
{
	ulp_pool *p = arg;
	pthread_mutex_lock(&p->mu);
	while (!p->quit) {
		size_t i;
		loop *l = claim(p, 0, &i);
		if (!l) {
			pthread_cond_wait(&p->cv, &p->mu);
			continue;
		}
		pthread_mutex_unlock(&p->mu);
		run_one(p, l, i);
		pthread_mutex_lock(&p->mu);
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
	pthread_cond_init(&p->cv, NULL);
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
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < p->n_workers; i++)
		pthread_join(p->tid[i], NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p->tid);
	free(p);
}

int ulp_pool_threads(const ulp_pool *p)
{
	return p ? p->n_workers + 1 : 1;
}

static int pool_run(ulp_pool *p, size_t n, int (*fn)(void *, size_t), void *arg)
{
	if (!p || p->n_workers == 0 || n <= 1) {
		int first = 0;
		for (size_t i = 0; i < n; i++) {
			int rc = fn(arg, i);
			if (rc < 0 && first == 0)
				first = rc;
		}
		return first;
	}
	loop l = {.fn = fn, .arg = arg, .n = n, .depth = job_depth, .nice = thread_nice,
	          .src = nice_src ? nice_src : job_src};
	pthread_mutex_lock(&p->mu);
	l.below = p->top;
	p->top = &l;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (;;) { /* its own indices first */
		size_t i = __atomic_fetch_add(&l.next, 1, __ATOMIC_RELAXED);
		if (i >= n)
			break;
		run_one(p, &l, i);
	}
	pthread_mutex_lock(&p->mu);
	unlink_loop(p, &l); /* all claimed (invariant 1) */
	while (__atomic_load_n(&l.done, __ATOMIC_ACQUIRE) < n) {
		size_t i;
		loop *o = ulp_scratch_can_push() ? claim(p, l.depth, &i) : NULL;
		if (!o) {
			pthread_cond_wait(&p->cv, &p->mu);
			continue;
		}
		pthread_mutex_unlock(&p->mu);
		ulp_scratch_push(); /* invariant 3 */
		run_one(p, o, i);
		ulp_scratch_pop();
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return __atomic_load_n(&l.rc, __ATOMIC_RELAXED);
}
