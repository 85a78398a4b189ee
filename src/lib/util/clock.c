/* SPDX-License-Identifier: MIT */
/*
 * clock.c - the library's clocks: monotonic time (intervals, timeouts: it
 * never jumps) and wall time (what other hosts compare: lease renewals,
 * since when a pack waits for the grace), and the absolute deadline that
 * pthread_cond_timedwait wants.
 */
#include "ulp_int.h"
#include <time.h>

int64_t ulp_mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t ulp_mono_ms(void)
{
	return ulp_mono_ns() / 1000000;
}

int64_t ulp_wall_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void ulp_deadline_ms(struct timespec *ts, int64_t ms)
{
	clock_gettime(CLOCK_REALTIME, ts); /* (condition variables' default clock) */
	ts->tv_sec += (time_t)(ms / 1000);
	ts->tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}
