/* SPDX-License-Identifier: MIT */
/*
 * tap.h - a tiny TAP-ish harness for the unit tests: CHECK() counts and
 * reports failures with file:line, tap_done() returns the exit status
 * (0 pass, 1 fail); tap_skip() exits 77 (automake's skip).
 */
#ifndef ULP_TAP_H
#define ULP_TAP_H

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>

static int tap_failures, tap_checks;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		tap_checks++;                                                   \
		if (!(cond)) {                                                  \
			tap_failures++;                                         \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                           \
			fputc('\n', stderr);                                    \
		}                                                               \
	} while (0)

/* Stops the test at the first failure of a check that later ones depend on. */
#define REQUIRE(cond, ...)                                                      \
	do {                                                                    \
		int tap_ok_ = !!(cond); /* evaluated once */                    \
		CHECK(tap_ok_, __VA_ARGS__);                                    \
		if (!tap_ok_)                                                   \
			exit(tap_done());                                       \
	} while (0)

static inline int tap_done(void)
{
	printf("%d checks, %d failed\n", tap_checks, tap_failures);
	return tap_failures ? 1 : 0;
}

static inline void tap_skip(const char *why)
{
	printf("SKIP: %s\n", why);
	exit(77);
}

/* Deterministic PRNG for tests (xorshift64*). */
static uint64_t tap_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t tap_rand(void)
{
	tap_rng ^= tap_rng >> 12;
	tap_rng ^= tap_rng << 25;
	tap_rng ^= tap_rng >> 27;
	return tap_rng * 0x2545F4914F6CDD1Dull;
}

#endif
