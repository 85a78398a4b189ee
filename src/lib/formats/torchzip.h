/* SPDX-License-Identifier: MIT */
/*
 * torchzip.h - internals: the reader of torch.save zip checkpoints
 * (torchzip.c) and the pickle subset it needs (pickle.c). Never installed.
 *
 * A torch.save file (PyTorch >= 1.6) is an uncompressed ZIP: <stem>/data.pkl
 * (a pickle whose persistent ids name storages), <stem>/data/<key> (each
 * storage's raw little-endian bytes) and small records (version, byteorder,
 * serialization_id). The reader finds the byte range, dtype and a stable
 * name of every storage; everything else in the file is, to the archive,
 * bytes kept verbatim. Hostile input: the reader accepts only what it fully
 * checked and fails (CORRUPT, with a reason) on anything else, which the
 * caller takes as "store this file opaque".
 */
#ifndef ULP_TORCHZIP_H
#define ULP_TORCHZIP_H

#include "ulp_int.h"

/* Limits: beyond them a file is not taken apart (stored opaque). */
#define ULP_TZ_MAX_ENTRIES  ((size_t)1 << 20)
#define ULP_TZ_MAX_CD       ((uint64_t)64 << 20)  /* central directory bytes */
#define ULP_TZ_MAX_PICKLE   ((uint64_t)64 << 20)  /* data.pkl bytes */
#define ULP_TZ_NAME_MAX     400                   /* bytes of a storage's name */

/* ---- pickle (pickle.c) ------------------------------------------------- */

/* A storage a pickle refers to through a persistent id
 * ('storage', torch.<Type>Storage, key, location, numel). */
typedef struct ulp_pk_storage {
	char *key;               /* NUL-terminated, owned by the ulp_pk */
	ulp_dtype dtype;         /* ULP_DT_UNKNOWN: a storage type this build does not code */
	uint64_t numel;          /* elements of dtype */
	char *name;              /* path of the first tensor using it, or NULL */
	/* what its persistent id said: an UntypedStorage (torch 2.x, for dtypes
	 * without a legacy <T>Storage: float8_*, uint16/32/64) is U8 with numel
	 * its bytes until a _rebuild_tensor_v3 over it names the dtype, which
	 * dtype and numel then give */
	ulp_dtype pid_dtype;
	uint64_t pid_numel;
	int retyped;             /* dtype set by a _rebuild_tensor_v3 */
} ulp_pk_storage;

typedef struct ulp_pk ulp_pk;

/* Runs the pickle p[0, len) (protocol <= 2 as torch.save writes it, plus the
 * common protocol 3/4 opcodes) without executing anything: globals are names,
 * reductions are recorded. The pickle must end with STOP at its last byte.
 * On success *out lists each distinct storage key once, in order of first
 * reference, named after the path of the first tensor using it (dict keys and
 * list indices joined by '.'; key-derived fallback; names unique). */
int ulp_pk_parse(const uint8_t *p, size_t len, ulp_pk **out, char *why, size_t cap);
/* The same; *peak: the most memory it held (its arena and the result), at
 * most 24 x len + 1 MiB (pickle.c), beyond which it refuses the pickle. */
int ulp_pk_parse_peak(const uint8_t *p, size_t len, ulp_pk **out, size_t *peak, char *why, size_t cap);
size_t ulp_pk_count(const ulp_pk *k);
const ulp_pk_storage *ulp_pk_at(const ulp_pk *k, size_t i);
void ulp_pk_free(ulp_pk *k);

/* ---- torch zip (torchzip.c) --------------------------------------------- */

/* The torch zip reader itself is public: ulp_tz_* in ulpack.h. */

#endif
