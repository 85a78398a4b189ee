/* SPDX-License-Identifier: MIT */
/*
 * senc.h - the streaming encoder (blob.c): the blob ulp_encode() would make
 * of a content too large to hold in memory, coded a window of chunks at a
 * time. Memory: a few chunk-sized buffers per chunk of the window, never the
 * content, the reference or the blob.
 *
 * The content and its reference are read through io->get, as often as the
 * codec choice needs (two passes for a delta: the symbol counts that choose
 * the table, then the coding); coded payloads go to a spill (io->spill_put,
 * a sparse scratch file: chunk k of candidate slot s at
 * s * n_chunks * slot_stride + k * slot_stride), because the header that
 * precedes them holds their sizes. ulp_senc_read() then serves the blob's
 * bytes in any order, to be written where they belong.
 *
 * Invariants:
 *  1. The blob is byte for byte the one ulp_encode() makes from the same
 *     options, content and reference: the same candidates in the same order,
 *     the same table from the same integer counts, the same chunk payloads.
 *  2. Every payload of the result was decoded and compared with its input
 *     chunk (and its checksum checked) before it went to the spill, and the
 *     header was parsed back and matches the payloads' directory.
 */
#ifndef ULP_SENC_H
#define ULP_SENC_H

#include "ulp_int.h"

typedef struct ulp_senc_io {
	void *arg;
	/* bytes [off, off + len) of the content into src and, when ref is not
	 * NULL, of the reference into ref; 0 or a negative ULP_E_* */
	int (*get)(void *arg, uint64_t off, size_t len, uint8_t *src, uint8_t *ref);
	int (*spill_put)(void *arg, uint64_t off, const void *p, size_t len);
	int (*spill_get)(void *arg, uint64_t off, void *p, size_t len);
} ulp_senc_io;

typedef struct ulp_senc {
	int codec;              /* ULP_CODEC_* chosen */
	uint64_t blob_len;
	uint8_t *header;        /* the blob's first header_len bytes */
	size_t header_len;
	size_t n_chunks;        /* payloads (0 for ident) */
	uint64_t *pos;          /* n_chunks + 1: payload k is blob bytes [pos[k], pos[k + 1]) */
	uint64_t spill_base;    /* spill offset of payload 0; payload k at base + k * stride */
	uint64_t stride;
	uint64_t chunk_bytes;   /* raw: payload k is content bytes [k * chunk_bytes, ...) */
} ulp_senc;

/* Codes src_len bytes of dtype dt (a reference of the same length when
 * has_ref) as ulp_encode(opts, ...) would; opts->src_sha256 (and
 * opts->ref_sha256 with a reference) must be given. window: chunks in
 * flight (0: twice the pool's threads). */
int ulp_encode_stream(const ulp_enc_opts *opts, ulp_pool *pool, ulp_dtype dt, uint64_t src_len,
                      int has_ref, size_t window, const ulp_senc_io *io, ulp_senc *out);
/* Blob bytes [off, off + len) of s into dst. */
int ulp_senc_read(const ulp_senc *s, const ulp_senc_io *io, uint64_t off, size_t len, uint8_t *dst);
void ulp_senc_free(ulp_senc *s);

/* The blob of s written to pack pw at offset at (reserved by the caller),
 * leaf by leaf on the pool, its pack digest (ulpack-format(5) 9) into
 * blob_sha (ingest.c). */
typedef struct ulp_pack_writer ulp_pack_writer;
int ulp_senc_to_pack(ulp_pool *pool, ulp_pack_writer *pw, uint64_t at, const ulp_senc *s,
                     const ulp_senc_io *io, uint8_t blob_sha[ULP_SHA256_LEN]);

#endif
