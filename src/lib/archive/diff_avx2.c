/* SPDX-License-Identifier: MIT */
/*
 * diff_avx2.c - the element scan of diff.c for bf16 and f32 in 256-bit
 * vectors, compiled alone with -mavx2 and chosen at run time
 * (ulp_cpu_paths() & ULP_CPU_AVX2): the same figures as diff.c's 128-bit scan (its contract
 * below), 8 elements at a time. Leaf code: no calls but memcpy.
 */
#include "arch_int.h"
#include "archive/diff.h"

typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef double v4d __attribute__((vector_size(32)));
typedef int64_t v4l __attribute__((vector_size(32)));

#define EXACT 2048u

static inline unsigned key_of(uint32_t d, int wide)
{
	if (!wide || d < EXACT)
		return d;
	unsigned b = 32u - (unsigned)__builtin_clz(d);
	return EXACT + (b - 12) * 1024 + ((d >> (b - 11)) & 1023);
}

size_t ulp_diff_scan_avx2(int f32, const uint8_t *pa, const uint8_t *pb, size_t n, unsigned mb, uint32_t em,
                          ulp_scan_out *o, uint32_t *h)
{
	const v8u z = {0}, vem = z + em, vbias = z + 0x80000000u;
	v4d sa0 = {0}, sa1 = {0}, sd0 = {0}, sd1 = {0};
	v8u emv = z;
	v8i vmax = (v8i)vbias;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		v8u x, y, fx, fy;
		v8i sx, sy;
		v8u dd;
		if (f32) {
			memcpy(&x, pa + 4 * i, sizeof(x));
			memcpy(&y, pb + 4 * i, sizeof(y));
			fx = x, fy = y;
			sx = (v8i)x ^ (((v8i)x >> 31) & 0x7fffffff);
			sy = (v8i)y ^ (((v8i)y >> 31) & 0x7fffffff);
			v8u g = (v8u)(sx > sy), ua = (v8u)sx, ub = (v8u)sy;
			dd = ((ua - ub) & g) | ((ub - ua) & ~g);
		} else {
			v8h xh, yh;
			memcpy(&xh, pa + 2 * i, sizeof(xh));
			memcpy(&yh, pb + 2 * i, sizeof(yh));
			x = __builtin_convertvector(xh, v8u);
			y = __builtin_convertvector(yh, v8u);
			fx = x << 16, fy = y << 16;
			v8i vx = (v8i)fx >> 16, vy = (v8i)fy >> 16;
			sx = vx ^ ((vx >> 31) & 0x7fff);
			sy = vy ^ ((vy >> 31) & 0x7fff);
			v8i d = sx - sy, s = d >> 31;
			dd = (v8u)((d ^ s) - s);
		}
		v8i eq = (v8i)(x == y);
		v8f ax = (v8f)fx, ay = (v8f)fy;
		v4d a0 = {ax[0], ax[1], ax[2], ax[3]}, a1 = {ax[4], ax[5], ax[6], ax[7]};
		v4d d0 = (v4d){ay[0], ay[1], ay[2], ay[3]} - a0, d1 = (v4d){ay[4], ay[5], ay[6], ay[7]} - a1;
		v4l e0 = {eq[0], eq[1], eq[2], eq[3]}, e1 = {eq[4], eq[5], eq[6], eq[7]};
		sa0 += a0 * a0;
		sa1 += a1 * a1;
		sd0 += (v4d)((v4l)(d0 * d0) & ~e0);
		sd1 += (v4d)((v4l)(d1 * d1) & ~e1);
		emv -= (v8u)((((x ^ y) >> mb) & vem) != 0);
		v8i bd = (v8i)(dd ^ vbias), up = bd > vmax;
		vmax = (bd & up) | (vmax & ~up);
		for (int j = 0; j < 8; j++)
			h[key_of(dd[j], f32)]++;
	}
	/* lanes in order: the same sums for the same input on every run */
	for (int j = 0; j < 4; j++) {
		o->sa += sa0[j] + sa1[j];
		o->sd += sd0[j] + sd1[j];
	}
	o->changed += i - h[0];
	h[0] = 0;
	for (int j = 0; j < 8; j++) {
		uint64_t mx = (uint32_t)vmax[j] ^ 0x80000000u;
		o->emoves += emv[j];
		o->maxd = mx > o->maxd ? mx : o->maxd;
	}
	return i;
}
