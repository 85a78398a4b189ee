/* SPDX-License-Identifier: MIT */
/*
 * read.h - reading (read.c): chunks and blobs through the decode cache,
 * whole contents, the read-ahead (the reader handle's, arch_int.h), a
 * cache seeded with what an ingest holds decoded.
 */
#ifndef ULP_READ_H
#define ULP_READ_H

#include "arch_int.h"
#include "archive/cache.h"

/* Pins the decoded chunk k of content sha (walking its chain through the
 * cache). *walk receives the number of decodes this call performed. */
int ulp_read_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                   ulp_centry **e, const uint8_t **data, size_t *len, unsigned *walk);
/* Pins the parsed blob of content sha. */
int ulp_read_blob(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], ulp_centry **e,
                  const ulp_blob **b);
/* Decodes a whole content into dst (raw_bytes of its blob). */
int ulp_read_content(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint8_t *dst, size_t len);
/* Caches the chunks of a content the caller holds decoded. */
void ulp_read_seed(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], const uint8_t *content,
                   size_t len, size_t chunk_bytes);
/* The same for chunk k alone (l bytes at chunk): chunks in parallel. */
int ulp_read_seed_chunk(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], uint32_t k,
                        const uint8_t *chunk, size_t l);
/* Lets the cached chunks of a content go (unless in use), their memory kept
 * for the next ones: an ingest retires a reference its new step supersedes. */
void ulp_read_retire(ulp_archive *a, const uint8_t sha[ULP_SHA256_LEN], size_t len,
                     size_t chunk_bytes);

void ulp_readahead_stop(ulp_archive *a);    /* read.c: joins its thread */

#endif
