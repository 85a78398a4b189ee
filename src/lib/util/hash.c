/* SPDX-License-Identifier: MIT */
/*
 * hash.c - content identity (SHA-256, from libcrypto: hardware-accelerated and
 * audited) and chunk checksums (XXH3-64 from libxxhash: checked on every
 * decode, so it must run at memory speed: through libxxhash's x86 dispatcher,
 * its AVX2 or AVX-512 loop, where the library has one).
 */
#include "config.h"
#include "ulp_int.h"
#include <openssl/evp.h>
#include <stdlib.h>
#include <xxhash.h>
#if defined(HAVE_XXH3_64BITS_DISPATCH) && defined(HAVE_XXH3_64BITS_WITHSEED_DISPATCH)
#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <xxh_x86dispatch.h>
/* weak: in a fully static link Debian's libxxhash.a has no dispatcher (its
 * shared library has), the addresses are then NULL and the plain entry
 * points run */
#pragma weak XXH3_64bits_dispatch
#pragma weak XXH3_64bits_withSeed_dispatch
#define ULP_XXH3(p, n) (XXH3_64bits_dispatch ? XXH3_64bits_dispatch(p, n) : XXH3_64bits(p, n))
#define ULP_XXH3_SEED(p, n, s) \
	(XXH3_64bits_withSeed_dispatch ? XXH3_64bits_withSeed_dispatch(p, n, s) : XXH3_64bits_withSeed(p, n, s))
#else
#define ULP_XXH3(p, n) XXH3_64bits(p, n)
#define ULP_XXH3_SEED(p, n, s) XXH3_64bits_withSeed(p, n, s)
#endif

void ulp_sha256(const void *data, size_t len, uint8_t out[ULP_SHA256_LEN])
{
	unsigned int n = 0;
	/* EVP_Digest cannot fail for SHA-256 short of memory corruption. */
	EVP_Digest(data, len, out, &n, EVP_sha256(), NULL);
}

/* ulpack-format(5) 2.4: the content digest is a tree of one level. Leaf i
 * is SHA-256 of bytes [i * 2^20, min(len, (i + 1) * 2^20)); the digest is
 * SHA-256 of the leaf digests in order followed by len as 8 bytes little
 * endian. Leaves depend on the bytes only (not on the dtype or the chunk
 * size), so one content has one identity whatever coded it, and the leaves
 * are hashed by whichever threads hold the bytes. */
void ulp_digest_leaves(const uint8_t *p, size_t len, uint8_t *leaves)
{
	for (size_t o = 0; o < len; o += ULP_DIGEST_LEAF, leaves += ULP_SHA256_LEN)
		ulp_sha256(p + o, ULP_MIN(ULP_DIGEST_LEAF, len - o), leaves);
}

size_t ulp_digest_n_leaves(uint64_t len)
{
	return (size_t)((len + ULP_DIGEST_LEAF - 1) / ULP_DIGEST_LEAF);
}

void ulp_digest_root(const uint8_t *leaves, uint64_t len, uint8_t out[ULP_SHA256_LEN])
{
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	uint8_t l8[8];
	unsigned int n = 0;
	ulp_st64(l8, len);
	if (!c || !EVP_DigestInit_ex(c, EVP_sha256(), NULL)) {
		/* no memory for a context: one buffer (small: 32 bytes a MiB) */
		size_t m = ulp_digest_n_leaves(len) * ULP_SHA256_LEN;
		uint8_t *buf = malloc(m + 8);
		if (buf) {
			memcpy(buf, leaves, m);
			memcpy(buf + m, l8, 8);
			ulp_sha256(buf, m + 8, out);
		} else {
			memset(out, 0, ULP_SHA256_LEN); /* never matches a real digest by chance */
		}
		free(buf);
		EVP_MD_CTX_free(c);
		return;
	}
	EVP_DigestUpdate(c, leaves, ulp_digest_n_leaves(len) * ULP_SHA256_LEN);
	EVP_DigestUpdate(c, l8, 8);
	EVP_DigestFinal_ex(c, out, &n);
	EVP_MD_CTX_free(c);
}

typedef struct digest_job {
	const uint8_t *p;
	size_t len;
	uint8_t *leaves;
	size_t per_job; /* leaves a job */
} digest_job;

static int job_digest(void *arg, size_t k)
{
	digest_job *j = arg;
	size_t first = k * j->per_job * ULP_DIGEST_LEAF;
	size_t len = ULP_MIN(j->per_job * ULP_DIGEST_LEAF, j->len - first);
	ulp_digest_leaves(j->p + first, len, j->leaves + k * j->per_job * ULP_SHA256_LEN);
	return 0;
}

int ulp_content_digest(ulp_pool *pool, const void *data, size_t len, uint8_t out[ULP_SHA256_LEN])
{
	size_t m = ulp_digest_n_leaves(len);
	uint8_t one[ULP_SHA256_LEN];
	uint8_t *leaves = m <= 1 ? one : malloc(m * ULP_SHA256_LEN);
	if (!leaves)
		return -ULP_E_NOMEM;
	digest_job j = {data, len, leaves, 1};
	if (m > 1 && pool) /* one thread too: a parallel region (ulp_pool_parallel_ns) */
		ulp_pool_run(pool, m, job_digest, &j);
	else
		ulp_digest_leaves(data, len, leaves);
	ulp_digest_root(leaves, len, out);
	if (leaves != one)
		free(leaves);
	return 0;
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
	return ULP_XXH3(data, len);
}

uint64_t ulp_xxh64_seed(const void *data, size_t len, uint64_t seed)
{
	return ULP_XXH3_SEED(data, len, seed);
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
