/* SPDX-License-Identifier: MIT */
/* cpu.c - CPU feature probe and the process-wide kernel mask (ulp_set_cpu_mask). */
#include "config.h"
#include "ulp_int.h"
#include <stdlib.h>
#include <string.h>
#if defined(ULP_HAVE_NEON) && defined(__aarch64__)
#include <sys/auxv.h>
#include <asm/hwcap.h>
#endif

/* What the environment variable ULP_CPU allows: unset, empty or "auto" all
 * kernels; "scalar", "avx2", "avx512" or "neon" that path only (and what it
 * builds on); any other value the scalar reference. Lets a test run pin a
 * path for the whole process (CI under qemu runs every unit test twice). */
static unsigned env_cpu_mask(void)
{
	const char *e = getenv("ULP_CPU");
	if (!e || !*e || !strcmp(e, "auto"))
		return ~0u;
	if (!strcmp(e, "avx2"))
		return ULP_CPU_AVX2;
	if (!strcmp(e, "avx512"))
		return ULP_CPU_AVX2 | ULP_CPU_AVX512;
	if (!strcmp(e, "neon"))
		return ULP_CPU_NEON;
	return 0;
}

unsigned ulp_cpu_features(void)
{
	unsigned f = 0;
#if defined(ULP_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2"))
		f |= ULP_CPU_AVX2;
#endif
#if defined(ULP_HAVE_AVX512) && (defined(__x86_64__) || defined(__i386__))
	/* the AVX-512 kernels also use AVX2 code for their tails */
	if ((f & ULP_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
	    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
	    __builtin_cpu_supports("avx512vbmi"))
		f |= ULP_CPU_AVX512;
#endif
#if defined(ULP_HAVE_NEON) && defined(__aarch64__)
	if (getauxval(AT_HWCAP) & HWCAP_ASIMD)
		f |= ULP_CPU_NEON;
#endif
	return f & env_cpu_mask();
}

unsigned ulp_cpu_mask_active = ~0u;

unsigned ulp_cpu_paths(void)
{
	static int have = -1; /* probed once; a race only stores the same value twice */
	int h = __atomic_load_n(&have, __ATOMIC_RELAXED);
	if (h < 0) {
		h = (int)ulp_cpu_features();
		__atomic_store_n(&have, h, __ATOMIC_RELAXED);
	}
	return (unsigned)h & __atomic_load_n(&ulp_cpu_mask_active, __ATOMIC_RELAXED);
}

unsigned ulp_set_cpu_mask(unsigned mask)
{
	unsigned old = ulp_cpu_mask_active;
	__atomic_store_n(&ulp_cpu_mask_active, mask, __ATOMIC_RELAXED);
	return old;
}
