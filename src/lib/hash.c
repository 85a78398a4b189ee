/* SPDX-License-Identifier: MIT */
/*
 * hash.c - content identity (SHA-256, from libcrypto: hardware-accelerated and
 * audited) and chunk checksums (XXH3-64 from libxxhash: checked on every
 * decode, so it must run at memory speed).
 */
#include "ulp_int.h"
#include <openssl/evp.h>
#include <xxhash.h>

void ulp_sha256(const void *data, size_t len, uint8_t out[ULP_SHA256_LEN])
{
	unsigned int n = 0;
	/* EVP_Digest cannot fail for SHA-256 short of memory corruption. */
	EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

void ulp_sha256_hex(const uint8_t sha[ULP_SHA256_LEN], char out[65])
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < ULP_SHA256_LEN; i++) {
		out[2 * i] = hex[sha[i] >> 4];
		out[2 * i + 1] = hex[sha[i] & 15];
	}
	out[64] = 0;
}

uint64_t ulp_xxh64(const void *data, size_t len)
{
	return XXH3_64bits(data, len);
}

void ulp_byte_group(uint8_t *dst, const uint8_t *src, size_t n, unsigned es)
{
	if (es == 1) {
		memcpy(dst, src, n);
		return;
	}
	for (unsigned j = 0; j < es; j++) {
		uint8_t *d = dst + (size_t)j * n;
		for (size_t i = 0; i < n; i++)
			d[i] = src[i * es + j];
	}
}

void ulp_byte_ungroup(uint8_t *dst, const uint8_t *src, size_t n, unsigned es)
{
	if (es == 1) {
		memcpy(dst, src, n);
		return;
	}
	for (unsigned j = 0; j < es; j++) {
		const uint8_t *s = src + (size_t)j * n;
		for (size_t i = 0; i < n; i++)
			dst[i * es + j] = s[i];
	}
}
