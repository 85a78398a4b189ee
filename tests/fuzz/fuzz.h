/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h - one source per fuzz target. Built with clang -fsanitize=fuzzer the
 * entry is LLVMFuzzerTestOneInput; built into the replay driver (make check,
 * any compiler) each target gets its own name so one binary replays all
 * committed corpora.
 */
#ifndef ULP_FUZZ_H
#define ULP_FUZZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef ULP_FUZZ_REPLAY
#define FUZZ_TARGET(name)                                     \
	int fuzz_##name(const uint8_t *data, size_t size);    \
	int fuzz_##name(const uint8_t *data, size_t size)
#else
#define FUZZ_TARGET(name)                                                    \
	int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);        \
	int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
#endif

/* A target's own consistency failure: abort so the fuzzer keeps the input. */
#define FUZZ_ASSERT(cond)                                                        \
	do {                                                                     \
		if (!(cond))                                                     \
			__builtin_trap();                                        \
	} while (0)

#endif
