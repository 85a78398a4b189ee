/* SPDX-License-Identifier: MIT */
/*
 * proc.c - this process's name in the files it makes beside other hosts'
 * (temporaries of packs and generations, staged files): "<pid>-<host>".
 * A pid alone is no name on a shared file system: every container's daemon
 * may run as the same small pid, and one host's late write into another's
 * temporary of the same name would corrupt it.
 *
 * Invariant: the tag holds only [A-Za-z0-9_.] after the pid and its '-', so
 * that "<tag>-<n>" parses back (strtol gives the pid; the tag is a prefix).
 */
#include "ulp_int.h"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static pthread_mutex_t tag_mu = PTHREAD_MUTEX_INITIALIZER;
static char tag[96];      /* guarded by tag_mu */
static long tag_pid;      /* guarded by tag_mu: the pid tag was made for */
static char test_host[64]; /* guarded by tag_mu: tests' second "host" */

void ulp_proc_tag_test_host(const char *host)
{
	pthread_mutex_lock(&tag_mu);
	snprintf(test_host, sizeof(test_host), "%s", host ? host : "");
	tag_pid = 0;
	pthread_mutex_unlock(&tag_mu);
}

void ulp_proc_tag(char *out, size_t cap)
{
	pthread_mutex_lock(&tag_mu);
	long me = (long)getpid();
	if (tag_pid != me) { /* the first call, or the first after a fork */
		char host[64] = "";
		if (test_host[0])
			snprintf(host, sizeof(host), "%s", test_host);
		else if (gethostname(host, sizeof(host) - 1) < 0 || !host[0])
			snprintf(host, sizeof(host), "host");
		host[sizeof(host) - 1] = 0;
		for (char *c = host; *c; c++)
			if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.'))
				*c = '_';
		snprintf(tag, sizeof(tag), "%ld-%s", me, host);
		tag_pid = me;
	}
	snprintf(out, cap, "%s", tag);
	pthread_mutex_unlock(&tag_mu);
}
