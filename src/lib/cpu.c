/* SPDX-License-Identifier: MIT */
/* cpu.c - CPU feature probe and the process-wide kernel mask (ulp_set_cpu_mask). */
#include "config.h"
#include "ulp_int.h"

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
	return f;
}

unsigned ulp_cpu_mask_active = ~0u;

unsigned ulp_set_cpu_mask(unsigned mask)
{
	unsigned old = ulp_cpu_mask_active;
	__atomic_store_n(&ulp_cpu_mask_active, mask, __ATOMIC_RELAXED);
	return old;
}
