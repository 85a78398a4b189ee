/* SPDX-License-Identifier: MIT */
/*
 * dcp.h - internals: the reader of torch.distributed.checkpoint (DCP) rank
 * files (dcp.c). Never installed.
 *
 * What torch 2.x's FileSystemWriter writes (checked on torch 2.13): a step
 * directory holds one or more rank files "__<rank>_<n>.distcp" and, written
 * last by the coordinator, ".metadata" (a pickle of
 * torch.distributed.checkpoint.metadata.Metadata). A rank file is its items
 * back to back, from byte 0, without any framing: with the default
 * serialization format (TORCH_SAVE) each tensor item is a torch.save record
 * of that one tensor (a self-contained ZIP whose offsets count from the
 * record's first byte; local headers carry data descriptors), and each
 * BYTE_IO item (a non-tensor object) is a torch.save record too
 * (DefaultSavePlanner pickles it with torch.save).
 *
 * With serialization_format=SAFETENSORS (torch 2.13's FileSystemWriter
 * option, the only other layout its writers produce: HuggingFaceStorageWriter
 * writes plain .safetensors files, and _extensions' ZStandard streams are
 * compressed) a rank file is its BYTE_IO items (torch.save records) and
 * then one safetensors file of all its tensors, named by their fully
 * qualified names (.metadata's offsets of those items are not theirs).
 *
 * The reader scans a rank file for those records without needing
 * .metadata: a record starts with a local header where the previous one
 * ended, and ends with the first end-of-central-directory record after it
 * at which the window [start, end) parses as a whole torch.save zip
 * (torchzip.c, strict); where records stop, a safetensors part is tried.
 * So a rank file is coded per tensor whatever order the files of a step
 * arrive in (.metadata comes last), at the cost of one extra sequential
 * read of the file.
 *
 * Names (what a tensor is coded against: the tensor of the same name,
 * dtype and length in the reference file of the series, layout.c):
 *  - the step's .metadata given (the caller, ingest.c, gives it in an
 *    import only: there each step's .metadata is put before its rank
 *    files; a mount's archiver may or may not have taken it first, and
 *    steps named both ways would not match): "<fqn>@<chunk offsets>", the
 *    item of .metadata whose (file, offset, length) is exactly the record's
 *    window; the signature name below is its alt, tried when the reference
 *    has no tensor of the name;
 *  - otherwise (a mount: .metadata is written last) a signature name
 *    "dcp.<dtype>.<bytes>.<k>", the k-th tensor of that dtype and length
 *    in the file (k from 0). An item added, removed or moved leaves the
 *    other signatures' names alone; only the tensors of its own dtype and
 *    length after it shift (they are coded against their neighbours:
 *    lossless, larger). A re-sharding changes lengths: anchors;
 *  - a safetensors part: its names (the fully qualified names).
 * ulp_dcp_meta_parse reads .metadata (pickle.c) into the items' names,
 * chunk offsets and places. Anything after the last part that parsed is
 * not taken apart: the caller stores it opaque.
 */
#ifndef ULP_DCP_H
#define ULP_DCP_H

#include "ulp_int.h"

/* Limits: beyond them the rest of a rank file is left unparsed (opaque). */
#define ULP_DCP_MAX_ITEMS     ((size_t)1 << 20)  /* records in one rank file */
#define ULP_DCP_MAX_TRIES     8                  /* end-record candidates that fail, per record */
#define ULP_DCP_MAX_FAILS     64                 /* such failures in one file */
#define ULP_DCP_MAX_STHEAD    ((uint64_t)100 << 20) /* bytes of a safetensors part's header */
#define ULP_DCP_NAME_MAX      1024               /* bytes of a .metadata name: else the signature name */

/** A tensor of a rank file: the storage of one of its torch.save records. */
typedef struct ulp_dcp_tensor {
	const char *name;        /* unique in the file (dcp.c invariant 4); owned */
	const char *alt;         /* its signature name when name is .metadata's, else NULL; owned */
	ulp_dtype dtype;         /* never ULP_DT_UNKNOWN */
	uint64_t offset, length; /* in the rank file; length > 0 */
} ulp_dcp_tensor;

typedef struct ulp_dcp ulp_dcp;

typedef struct ulp_dcp_meta ulp_dcp_meta;

/**
 * Scans a rank file of size bytes through rd for its torch.save records
 * and a safetensors part after them. meta (may be NULL): the step's
 * .metadata, file: the rank file's name relative to the step directory;
 * they name the tensors (dcp.h). Succeeds (0) when at least one record or
 * a safetensors part parsed: *out lists the tensors of known dtype, sorted
 * by offset, disjoint, and *parsed is where the last part that parsed ends
 * (bytes from there on are not understood). CORRUPT (errbuf says why) when
 * nothing parses; NOMEM; rd's errors. Reads each byte of [0, *parsed)
 * about once, plus the records' directories; memory is bounded by
 * torchzip.c's limits per record, ULP_DCP_MAX_ITEMS and meta's size.
 */
int ulp_dcp_scan(ulp_tz_read_fn rd, void *arg, uint64_t size, const ulp_dcp_meta *meta, const char *file,
                 ulp_dcp **out, uint64_t *parsed, char *errbuf, size_t errcap);
int ulp_dcp_scan_mem(const uint8_t *data, size_t size, const ulp_dcp_meta *meta, const char *file,
                     ulp_dcp **out, uint64_t *parsed, char *errbuf, size_t errcap);
size_t ulp_dcp_count(const ulp_dcp *d);
/** Records found (tensor items and BYTE_IO items alike). */
size_t ulp_dcp_records(const ulp_dcp *d);
const ulp_dcp_tensor *ulp_dcp_at(const ulp_dcp *d, size_t i);
void ulp_dcp_free(ulp_dcp *d);

/* ---- .metadata (pickle.c: it needs the pickle machine's values) ---------- */

/** Where one item of a DCP checkpoint lies: storage_data's MetadataIndex ->
 *  _StorageInfo. */
typedef struct ulp_dcp_item {
	const char *fqn;          /* the fully qualified name; owned by the ulp_dcp_meta */
	const char *file;         /* the rank file, relative to the step directory; owned */
	uint64_t offset, length;  /* of the item in that file */
	const int64_t *chunk;     /* the chunk's offsets in the tensor (ndim of them; owned) */
	uint32_t ndim;            /* 0 for a BYTE_IO item or a 0-dim tensor */
	int64_t index;            /* MetadataIndex.index, -1 when None */
} ulp_dcp_item;

/**
 * Reads a .metadata pickle (torch.distributed.checkpoint.metadata.Metadata)
 * of len bytes without executing anything: the items of its storage_data,
 * in the pickle's order. Strict: CORRUPT (errbuf says why) for a pickle the
 * reader refuses (pickle.c's bound: 24 bytes of memory a byte) or one not
 * shaped as torch 2.x writes it (a Metadata object whose state holds a
 * storage_data dict of MetadataIndex -> _StorageInfo objects, each with its
 * fields of the right types, offset + length not overflowing); NOMEM.
 */
int ulp_dcp_meta_parse(const uint8_t *p, size_t len, ulp_dcp_meta **out, char *errbuf, size_t errcap);
size_t ulp_dcp_meta_count(const ulp_dcp_meta *m);
const ulp_dcp_item *ulp_dcp_meta_at(const ulp_dcp_meta *m, size_t i);
void ulp_dcp_meta_free(ulp_dcp_meta *m);

/** A rank file's name, by DCP's convention ("<anything>.distcp")? */
int ulp_dcp_name(const char *path);
/** A step's .metadata, by its name? */
int ulp_dcp_meta_name(const char *path);

#endif
