/* SPDX-License-Identifier: MIT */
/*
 * ulpack.h - the one public header of libulpack.
 *
 * libulpack stores training checkpoints compactly: each tensor is coded as a
 * ULPack delta against the same tensor of a reference checkpoint (ordered-
 * integer ULP residuals, rANS-coded bit length and two refinement bits
 * conditioned on the reference's exponent, low bits raw), or standalone.
 *
 * Conventions (all of the API):
 *  - Functions return 0 (or a size >= 0) on success and a negative ULP_E_*
 *    code on failure; ulp_strerror() turns one into text.
 *  - Out-parameters are written only on success.
 *  - Buffers are passed as (dst, dst_cap, src, src_len).
 *  - Every _new/_open has a _free/_close that accepts NULL; each comment says
 *    who owns what.
 *  - Objects are not thread-safe unless the comment says so.
 */
#ifndef ULPACK_H
#define ULPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The shared library (libulpack.so) exports what this header declares and
 * nothing else: its objects are compiled with -fvisibility=hidden, and every
 * declaration below takes default visibility from this pragma (internal
 * functions, declared in ulp_int.h and arch_int.h, stay hidden). */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define ULP_VERSION_STRING "0.1.0"

/* ---- errors ------------------------------------------------------------ */

enum {
	ULP_OK = 0,
	ULP_E_NOMEM = 1,   /* out of memory */
	ULP_E_IO,          /* read/write failed */
	ULP_E_NOSPC,       /* no space left on the device */
	ULP_E_CORRUPT,     /* malformed input (blob, header, file) */
	ULP_E_CHECKSUM,    /* decoded content does not match its checksum */
	ULP_E_VERSION,     /* format version not supported */
	ULP_E_INVAL,       /* invalid argument */
	ULP_E_NOENT,       /* no such object */
	ULP_E_EXIST,       /* object exists */
	ULP_E_BUSY,        /* resource busy */
	ULP_E_OVERFLOW,    /* output does not fit in dst_cap */
	ULP_E_UNSUPPORTED, /* valid input this build cannot handle */
	ULP_E_NAMETOOLONG, /* a path component over ULP_NAME_MAX or a path over ULP_PATH_MAX bytes */
	ULP_E_NOTEMPTY,    /* directory not empty */
	ULP_E_NOTDIR,      /* a directory was needed */
	ULP_E_ISDIR,       /* is a directory */
	ULP_E_FENCED,      /* this writer lost a shared archive's lease to another */
	ULP_E_INTR,        /* the call was interrupted (ulp_set_interrupt) */
	ULP_E__COUNT
};

/** Text for a ULP_E_* code, positive or negative. Never NULL. */
const char *ulp_strerror(int rc);
/** errno value (positive) for a ULP_E_* code: CORRUPT/CHECKSUM -> EIO, ... */
int ulp_to_errno(int rc);
/** Interrupting a wait (an archive in an object store): the calling
 *  thread's later calls ask check(arg) about once a second (at most every
 *  100 ms) while they wait on the store (a request, a pause between
 *  retries); a non-zero answer ends the wait and the call fails with
 *  -ULP_E_INTR (errno EINTR). check NULL: none (the default). Per thread;
 *  ulpackfs passes libfuse's fuse_interrupted(), so that a FUSE interrupt
 *  (the program waiting on the mount got a signal) ends the request. */
void ulp_set_interrupt(int (*check)(void *arg), void *arg);

/* ---- dtypes ------------------------------------------------------------- */

typedef enum ulp_dtype {
	ULP_DT_UNKNOWN = 0, /* opaque bytes */
	ULP_DT_BOOL, ULP_DT_U8, ULP_DT_I8, ULP_DT_U16, ULP_DT_I16,
	ULP_DT_U32, ULP_DT_I32, ULP_DT_U64, ULP_DT_I64,
	ULP_DT_F16, ULP_DT_BF16, ULP_DT_F32, ULP_DT_F64,
	ULP_DT_F8_E4M3, ULP_DT_F8_E5M2,
	ULP_DT__COUNT
} ulp_dtype;

/** safetensors name ("BF16"), or "UNKNOWN". */
const char *ulp_dtype_name(ulp_dtype dt);
/** Parses a safetensors dtype name of len bytes; ULP_DT_UNKNOWN if unknown. */
ulp_dtype ulp_dtype_from_name(const char *name, size_t len);
/** Element size in bytes; 1 for ULP_DT_UNKNOWN (opaque bytes). */
unsigned ulp_dtype_size(ulp_dtype dt);
/** 1 if dt is a floating-point type that ULPack models. */
int ulp_dtype_is_float(ulp_dtype dt);

/* ---- thread pool -------------------------------------------------------- */

typedef struct ulp_pool ulp_pool;

/** A pool of `threads` workers (0: one per online CPU). Caller frees it. */
int ulp_pool_new(int threads, ulp_pool **out);
void ulp_pool_free(ulp_pool *pool);
/** Number of threads that run jobs (1 for a NULL pool). */
int ulp_pool_threads(const ulp_pool *pool);
/**
 * Runs fn(arg, i) for i in [0, n) on the pool and the calling thread; returns
 * the first negative value any call returned (all jobs still run), else 0.
 * A NULL pool runs them in order on the calling thread. A job may call
 * ulp_pool_run() itself and several threads may share one pool: every idle
 * thread, a caller waiting for its last jobs included, takes jobs of any.
 */
int ulp_pool_run(ulp_pool *pool, size_t n, int (*fn)(void *arg, size_t i), void *arg);
/**
 * Nanoseconds spent so far, process-wide, inside outermost ulp_pool_run()s of
 * more than one job (parallel regions, whatever the pool's size): a one-thread
 * run's time outside them is its serial part (`ulpack bench` serial_fraction).
 */
uint64_t ulp_pool_parallel_ns(void);
/**
 * Nanoseconds spent so far, process-wide, waiting in the fsyncs that make a
 * pack durable (the pack and its directory): the disk's part of a serial
 * share, which `ulpack import` overlaps with the next file's coding.
 */
uint64_t ulp_pack_sync_ns(void);

/* ---- blobs: the codec --------------------------------------------------- */

/* Codec ids (ulpack-format(5) section 3). */
enum {
	ULP_CODEC_RAW = 0,      /* bytes verbatim */
	ULP_CODEC_IDENT = 1,    /* identical to the reference */
	ULP_CODEC_ZSTD = 2,     /* zstd of the byte-grouped bytes */
	ULP_CODEC_ZSTD_XOR = 3, /* zstd of the byte-grouped XOR with the reference */
	ULP_CODEC_DELTA = 4,    /* ULPack residuals against the reference */
	ULP_CODEC_ANCHOR = 5,   /* standalone: rANS-coded high byte, raw low bits */
	ULP_CODEC__COUNT
};
const char *ulp_codec_name(int codec);
/* 1 if blobs of this codec decode from a reference (IDENT, ZSTD_XOR, DELTA): the one
 * test the blob parser, ingest and re-coding use for "the reference is used". */
int ulp_codec_uses_ref(int codec);

#define ULP_SHA256_LEN 32
#define ULP_DEFAULT_CHUNK_LOG2 20 /* elements per chunk: 2^20 */
#define ULP_DIGEST_LEAF ((size_t)1 << 20) /* bytes a leaf of the content digest */
#define ULP_BLOB_VERSION 2        /* the blob format ulp_encode writes by default */

/**
 * The content digest of ulpack-format(5) 2.4 (blob format v2): SHA-256 of the
 * SHA-256s of each ULP_DIGEST_LEAF bytes of data and of its length, the
 * leaves hashed in parallel on pool (may be NULL). A content's identity in an
 * archive (blobs of format v1 carry the plain SHA-256 instead).
 * @return 0 or -ULP_E_NOMEM.
 */
int ulp_content_digest(ulp_pool *pool, const void *data, size_t len, uint8_t out[ULP_SHA256_LEN]);

typedef struct ulp_enc_opts {
	unsigned chunk_log2; /* elements per chunk = 2^chunk_log2, 10..24; 0: default */
	int zstd_level;      /* level of the zstd candidates; 0: 3 */
	int effort;          /* 0: try zstd only where ULPack looks weak; 1: try every codec */
	int force_codec;     /* 0: choose; ULP_CODEC_x + 1: use codec x (tests, benchmarks);
	                        -INVAL if x cannot code this input */
	const uint8_t *ref_sha256; /* identity of the reference when the caller knows it
	                              (an archive does: its content digest, or the plain
	                              SHA-256 of a v1 blob's content), or NULL to compute
	                              it (the digest of the format written) */
	const uint8_t *src_sha256; /* digest of src in the format written (v2:
	                              ulp_content_digest, v1: SHA-256) when the caller
	                              has it, or NULL */
	unsigned format_version;   /* 0: ULP_BLOB_VERSION; 1: write format v1 (tests) */
} ulp_enc_opts;

typedef struct ulp_enc_stats {
	int codec;            /* codec chosen */
	uint64_t raw_bytes;   /* input bytes */
	uint64_t blob_bytes;  /* output bytes, everything included */
	uint64_t table_bytes; /* bytes of probability tables (ULPack codecs) */
	double bound_bits;    /* ULPack model bound of the delta: n*H(sym|e_r) + raw-tail
	                         bits, tables excluded (0 without a reference) */
} ulp_enc_stats;

/** Largest blob ulp_encode() can produce for src_len bytes of dtype dt. */
size_t ulp_encode_bound(ulp_dtype dt, size_t src_len, const ulp_enc_opts *opts);

/**
 * Encodes a tensor of dtype dt (src_len bytes, a whole number of elements
 * unless dt is ULP_DT_UNKNOWN) into one self-contained blob, against ref
 * (same dtype and length, or NULL for a standalone coding). Keeps the
 * smallest of the codecs that apply. The output bytes depend only on
 * (opts, dt, src, ref): never on the pool. Callers that store the blob should
 * decode it and compare (ulp_blob_validate with deep) before relying on it.
 * @return blob size written to dst, or a negative ULP_E_*.
 * Thread-safe; pool may be NULL; stats may be NULL.
 */
int64_t ulp_encode(const ulp_enc_opts *opts, ulp_pool *pool, ulp_dtype dt,
                   void *dst, size_t dst_cap, const void *src, size_t src_len,
                   const void *ref, size_t ref_len, ulp_enc_stats *stats);

typedef struct ulp_blob_info {
	unsigned version;            /* format version, 1 or 2 */
	int codec;                   /* ULP_CODEC_* */
	ulp_dtype dtype;
	uint64_t n_elems;            /* elements */
	uint64_t raw_bytes;          /* decoded size in bytes */
	uint32_t chunk_elems;        /* elements per chunk (the last may be shorter) */
	uint32_t n_chunks;
	int has_ref;                 /* 1 if decoding needs the reference */
	uint8_t content_sha256[ULP_SHA256_LEN]; /* digest of the decoded bytes (v2: the
	                                           content digest; v1: SHA-256) */
	uint8_t ref_sha256[ULP_SHA256_LEN];     /* identity of the reference; zero if none */
} ulp_blob_info;

/** A parsed, validated blob, ready to decode chunks. */
typedef struct ulp_blob ulp_blob;

/**
 * Parses and validates a blob's header, directory and tables. The blob
 * borrows `data`, which must outlive it. Errors: CORRUPT, VERSION, NOMEM.
 * errbuf (may be NULL) receives a one-line reason on failure.
 */
int ulp_blob_open(const void *data, size_t len, ulp_blob **out, char *errbuf, size_t errcap);
void ulp_blob_close(ulp_blob *b);
const ulp_blob_info *ulp_blob_get_info(const ulp_blob *b);
/** Byte range [*off, *off + *len) of the decoded content held by chunk k. */
void ulp_blob_chunk_range(const ulp_blob *b, uint32_t k, uint64_t *off, uint64_t *len);
/** The stored bytes of chunk k (inside the blob's data; empty for ident). */
void ulp_blob_chunk_payload(const ulp_blob *b, uint32_t k, const uint8_t **p, size_t *len);
/**
 * Decodes chunk k into dst (at least its length). ref points at the same byte
 * range of the reference (NULL when the blob has none). Thread-safe for one
 * blob. Errors: CORRUPT, CHECKSUM, OVERFLOW, INVAL.
 * @return bytes written.
 */
int64_t ulp_blob_decode_chunk(const ulp_blob *b, uint32_t k, void *dst, size_t dst_cap,
                              const void *ref, size_t ref_len);
/** Decodes every chunk (pool may be NULL). @return bytes written. */
int64_t ulp_blob_decode(const ulp_blob *b, ulp_pool *pool, void *dst, size_t dst_cap,
                        const void *ref, size_t ref_len);
/**
 * ulp_blob_decode, and checks the decoded bytes against the blob's content
 * digest: for v2 the leaves are hashed by the threads that decode their
 * chunks. Errors as ulp_blob_decode, and CHECKSUM when the digest differs.
 */
int64_t ulp_blob_decode_verify(const ulp_blob *b, ulp_pool *pool, void *dst, size_t dst_cap,
                               const void *ref, size_t ref_len);
/**
 * Checks a blob: header, tables, directory; with deep, also decodes it against
 * ref and checks every chunk checksum and the content digest.
 */
int ulp_blob_validate(const void *data, size_t len, const void *ref, size_t ref_len,
                      int deep, char *errbuf, size_t errcap);

/** Model statistics of a ULPack delta (for `ulpack bench`). */
void ulp_sha256(const void *data, size_t len, uint8_t out[ULP_SHA256_LEN]);
/** Lowercase hex of a sha256 into out[65]. */
void ulp_sha256_hex(const uint8_t sha[ULP_SHA256_LEN], char out[65]);

/* ---- archives ------------------------------------------------------------ */

/*
 * An archive is a directory: ulpack.db (the SQLite index), packs/ (immutable
 * pack files of blobs) and staging/ (files being written through a mount).
 * Paths inside an archive are relative, '/'-separated, without '.' or '..'
 * components ("run/checkpoint-100/model.safetensors"); "" is the root.
 * An archive handle is thread-safe: every thread gets its own index
 * connection; the decode cache and pool are shared.
 */
typedef struct ulp_archive ulp_archive;

#define ULP_DEFAULT_MAX_CHAIN 16
/** The largest max_chain an archive is opened with (ulp_archive_open refuses
 *  more with INVAL; `ulpack --max-chain` and `ulpackfs -o max_chain=` take
 *  1..ULP_MAX_CHAIN). A read walks a chain back to its anchor and stops with
 *  CORRUPT past 4096 links, so a longer limit would write unreadable files. */
#define ULP_MAX_CHAIN 1024
/** The most decode/encode threads an archive is opened with (more: INVAL). */
#define ULP_MAX_THREADS 1024

/** Decode cache bytes when none is given: an eighth of the machine's memory,
 *  at least 1 GiB and at most 64 GiB (the cache holds only what was decoded;
 *  reading a run's steps in order wants one checkpoint's worth). */
uint64_t ulp_default_cache_size(void);

typedef struct ulp_archive_opts {
	uint64_t cache_size;  /* decode cache bytes; 0: ulp_default_cache_size() */
	unsigned max_chain;   /* deltas a chain may hold before an anchor; 0: stored value;
	                       * at most ULP_MAX_CHAIN */
	int threads;          /* decode/encode threads; 0: one per CPU; at most ULP_MAX_THREADS */
	int read_only;        /* open the index read-only; writes fail with -INVAL */
	/* a shared archive (ulp_archive_share; ulpackfs(1) "MANY HOSTS"): */
	unsigned poll_ms;     /* read-only: how often to look for a newer published
	                       * generation; 0: 2000 */
	unsigned lease_ms;    /* writer: its lease, renewed while it runs; 0: 15000 */
	unsigned grace_s;     /* writer: a superseded generation, and a pack the index
	                       * dropped, stay this long for the readers of other
	                       * hosts; 0: 600 */
	int contribute;       /* read-write open of a shared archive on a directory whose
	                       * lease another host holds: open as a contributor (its
	                       * new files staged in staging/h-HOST for the lease
	                       * holder to archive; ulpackfs(1) "MANY HOSTS") instead
	                       * of failing with BUSY */
	/* an archive in an object store (dir "s3://BUCKET/PREFIX"; ulpackfs(1)
	 * "OBJECT STORES"): */
	const char *cache_dir; /* the local home: the writer's live index and
	                        * staging, a reader's generations, and the pack
	                        * cache, under CACHE_DIR/s3/BUCKET/PREFIX/writer or
	                        * reader; NULL: $ULPACK_CACHE_DIR, else
	                        * $XDG_CACHE_HOME/ulpack, else ~/.cache/ulpack */
	uint64_t pack_cache;   /* bytes of packs kept in it; 0: 8 GiB */
	int file_table;        /* keep the index's files and their chains in memory,
	                        * loaded at open and again after changes, so that
	                        * stat and ulp_file_open run no query (ulpackfs sets
	                        * it; about 200 bytes a file and 70 a blob) */
} ulp_archive_opts;

/** 1 where name is an archive in an object store ("s3://BUCKET/PREFIX"),
 *  which ulp_archive_init and ulp_archive_open take as well as a directory. */
int ulp_archive_is_url(const char *name);
/** Creates an empty archive in dir (created if missing; must be empty of
 *  archive files). Errors: EXIST, IO. errbuf gets the cause. */
int ulp_archive_init(const char *dir, char *errbuf, size_t errcap);
/** Opens an archive. Errors: NOENT (no archive), VERSION (schema too new),
 *  CORRUPT (not an archive), INVAL (max_chain or threads over their limits), IO. errbuf gets the cause. Caller closes. */
int ulp_archive_open(const char *dir, const ulp_archive_opts *opts, ulp_archive **out,
                     char *errbuf, size_t errcap);
void ulp_archive_close(ulp_archive *a);

/* Many hosts (DESIGN.md 7): one writer, fenced by a lease with an epoch,
 * publishes generations of its index; read-only opens on any host follow
 * them. An archive is shared once ulp_archive_share made it so (or once a
 * writer opened it on a network file system). */
typedef struct ulp_generation {
	int shared;           /* 0: an archive of one host (the rest is 0) */
	int writer;           /* 1: this handle holds the lease */
	int fenced;           /* 1: it lost the lease to another writer, or could not renew it */
	int contributor;      /* 1: opened with contribute while another host holds the
	                         lease: stages new files for it (ulp_archive_staging_dir) */
	uint64_t gen;         /* the generation followed (reader) or last published (writer) */
	uint64_t epoch;       /* the writer's epoch (of that generation, for a reader) */
	unsigned poll_ms, lease_ms, grace_s;
} ulp_generation;
/** Makes an archive open read-write shared: takes the lease and publishes
 *  the first generation. Errors: BUSY (another writer's lease), IO. */
int ulp_archive_share(ulp_archive *a);
/** A shared archive's writer publishes what it archived since the last
 *  generation (0 at once where nothing changed or the archive is not
 *  shared). Errors: FENCED, IO, NOSPC. */
int ulp_archive_publish(ulp_archive *a);
/** Where this handle stands among the hosts (g->shared 0: not shared). */
int ulp_archive_generation(ulp_archive *a, ulp_generation *g);
/** The calling thread's last error on this archive: names the file and cause. */
const char *ulp_archive_errmsg(const ulp_archive *a);
/** The archive's directory. */
const char *ulp_archive_dir(const ulp_archive *a);
/** The directory whose lock (ulp_mount_lock) a read-write mount of this
 *  handle takes: the archive's, or a contributor's own staging directory
 *  ARCHIVE/staging/h-HOST (ulp_archive_opts.contribute). */
const char *ulp_archive_lock_dir(const ulp_archive *a);

/* Times: seconds since 1970-01-01 UTC (any int64, as the kernel's time64_t)
 * and a nanosecond part, like a struct timespec; every time a Linux file
 * system can hold is kept exactly (ulpack-format(5) 9: entries.mtime_sec and
 * mtime_nsec). */
typedef struct ulp_time {
	int64_t sec;            /* seconds since the epoch, negative before 1970 */
	uint32_t nsec;          /* [0, 1e9) */
} ulp_time;

/* What an archive knows of a path. */
typedef struct ulp_stat {
	int is_dir, is_symlink;
	uint64_t size;          /* bytes (symlink: target length) */
	uint32_t mode;          /* permission bits and type (S_IFREG, S_IFDIR, S_IFLNK) */
	uint32_t uid, gid;
	ulp_time mtime;
	uint8_t sha256[ULP_SHA256_LEN]; /* files: of the whole content */
	uint64_t stored_bytes;  /* bytes of the blobs only this file introduced */
	int64_t step;           /* parsed from the path, -1 if none */
	unsigned chain_depth;   /* deepest delta chain among its tensors */
	int anchor;             /* 1 if no tensor needs a reference */
	int kind;               /* 1 safetensors, 2 torch.save zip (both coded per
	                           tensor), 0 opaque */
} ulp_stat;

/** Metadata of a path without decoding anything. Errors: NOENT. */
int ulp_archive_stat(ulp_archive *a, const char *path, ulp_stat *st);
/** Calls cb for each entry of directory path (name, stat); stops at a
 *  non-zero return, which it returns. Errors: NOENT. */
int ulp_archive_readdir(ulp_archive *a, const char *path,
                        int (*cb)(void *arg, const char *name, const ulp_stat *st), void *arg);
/** Symlink target into buf (NUL-terminated). */
int ulp_archive_readlink(ulp_archive *a, const char *path, char *buf, size_t cap);

/* Reading: a handle maps byte ranges onto the stored header and the chunks
 * they overlap, decoded through the shared cache. */
typedef struct ulp_file ulp_file;
int ulp_file_open(ulp_archive *a, const char *path, ulp_file **out);
/** Reads up to len bytes at off; thread-safe. @return bytes read (0 at EOF). */
int64_t ulp_file_pread(ulp_file *f, void *dst, size_t len, uint64_t off);
const ulp_stat *ulp_file_get_stat(const ulp_file *f);
/** Writes the whole file into fd at offsets [0, size) with pwrite (fd must
 *  be seekable; its offset is left alone): the chunks are decoded on the
 *  archive's pool, each chunk's chain walked once from its nearest cached
 *  link, the links below the file's own chunk entering the cache as a read's
 *  do (so that exporting the steps of a run in step order decodes each link
 *  once, backward parts of the layout included: ulpack-format(5)), and each
 *  chunk written as soon as it is decoded. For `ulpack export` and `ulpack cat` into a file: a cold
 *  file costs one decode per link of its chains, and all threads work.
 *  Errors: IO, NOSPC (writing to fd: the message says so), and those of
 *  ulp_file_pread. */
int ulp_file_write_to(ulp_file *f, int fd);
/** Read-ahead (on by default): reads in order have the chunks after them
 *  decoded in the background. A reader of chosen ranges (one tensor of a
 *  checkpoint) turns it off so that only the chunks it reads are decoded,
 *  as POSIX_FADV_RANDOM. Thread-safe. */
void ulp_file_set_readahead(ulp_file *f, int on);
void ulp_file_close(ulp_file *f);

/* Writing. */
typedef struct ulp_meta {
	uint32_t mode;          /* permission bits (type bits ignored) */
	uint32_t uid, gid;
	ulp_time mtime;
} ulp_meta;

typedef struct ulp_put_result {
	uint64_t raw_bytes;      /* size of the file */
	uint64_t stored_bytes;   /* new blob bytes written */
	unsigned tensors, deltas, anchors, reused; /* tensors coded, as deltas, standalone, deduplicated */
	int skipped;             /* 1: an identical file was already there */
	char ref_path[512];      /* the file it was coded against ("" if none) */
} ulp_put_result;

/**
 * Archives the file open on fd (read from offset 0 to EOF) at path, replacing
 * what was there atomically. Safetensors files are coded per tensor against
 * the nearest step of their series; anything else is stored as zstd blobs.
 * Every blob is decoded and compared with the input before the index
 * transaction commits; on any error the archive is unchanged.
 * Errors: IO, NOSPC, NOMEM, INVAL. res may be NULL.
 */
int ulp_archive_put(ulp_archive *a, const char *path, int fd, const ulp_meta *meta,
                    ulp_put_result *res);
/**
 * A pipelined put (import): ulp_putq_put codes a file like ulp_archive_put
 * (the same stored bytes) and returns with it in flight: its pack is made
 * durable on a thread of its own while the next file codes, and its index
 * transaction commits at the start of the next ulp_putq_put, ulp_putq_flush
 * or ulp_putq_free, each of which fails with the in-flight file's error if
 * that commit fails (the message names it; the file being put then is not
 * archived either). On any error the archive holds exactly the files
 * committed before: ulp_putq_committed counts them. Call every function of
 * a queue from one thread, and flush before any other change to the archive
 * (mkdir, symlink, remove, another writer).
 */
typedef struct ulp_putq ulp_putq;
int ulp_putq_new(ulp_archive *a, ulp_putq **out);
int ulp_putq_put(ulp_putq *q, const char *path, int fd, const ulp_meta *meta, ulp_put_result *res);
int ulp_putq_flush(ulp_putq *q);
unsigned ulp_putq_committed(const ulp_putq *q);
/** Flushes (its result) and frees q (NULL accepted). A queue's commits are
 *  made durable against power loss here, at the end (a crash before leaves
 *  the archive as after one of them, not torn). */
int ulp_putq_free(ulp_putq *q);
/**
 * Tells the archive which files an import is about to put (paths inside the
 * archive), so that each is coded where the final layout of its series puts
 * it (ulpack-format(5): the newest step an anchor, deltas at most about
 * max_chain/2 deep), with no re-coding afterwards. rank[i] receives the
 * order to put paths[i] in (lowest first; equal ranks in any order): every
 * file's reference is archived before it. The list holds until the next call
 * (n = 0 clears it) or the close. Errors: NOMEM, IO.
 */
int ulp_archive_expect(ulp_archive *a, const char *const *paths, size_t n, uint32_t *rank);
int ulp_archive_symlink(ulp_archive *a, const char *path, const char *target, const ulp_meta *meta);
int ulp_archive_mkdir(ulp_archive *a, const char *path, const ulp_meta *meta);
/** Removes a file or symlink (rm) or an empty directory (rmdir). Blobs stay
 *  until gc. Errors: NOENT, NOTEMPTY (directory not empty). */
int ulp_archive_remove(ulp_archive *a, const char *path);
/** Renames a file, symlink or directory, as rename(2): over an existing file,
 *  or a directory over an empty directory. Errors: NOENT, NOTEMPTY (the
 *  target directory is not empty), ISDIR (a file onto a directory), NOTDIR
 *  (a directory onto a file), INVAL (a directory into itself). */
int ulp_archive_rename(ulp_archive *a, const char *from, const char *to);
/** Changes mode, owner or mtime (fields with the flag set in which). */
enum { ULP_SET_MODE = 1, ULP_SET_OWNER = 2, ULP_SET_MTIME = 4 };
int ulp_archive_setattr(ulp_archive *a, const char *path, unsigned which, const ulp_meta *meta);

/* Progress of a long call: done of total (bytes, unless it says otherwise). */
typedef void (*ulp_progress_fn)(void *arg, uint64_t done, uint64_t total);

typedef struct ulp_gc_result {
	uint64_t blobs_removed, packs_removed, packs_rewritten, bytes_reclaimed;
	uint64_t blobs_rebased;  /* blobs re-coded off removed steps or onto nearer ones */
} ulp_gc_result;
/** Re-bases first (ulp_archive_rebase_pending, then _orphans: a removed
 *  step's blobs that kept files need are re-coded against a remaining
 *  step), then reclaims everything (ulp_archive_reclaim with full set and
 *  every pack with a dead byte rewritten: stored bytes = pack bytes after).
 *  The library's write paths (a mount's session when idle and at close;
 *  `ulpack import`, `rm`, `forget`) reclaim by themselves: gc is for
 *  archives of older builds and for a forced full pass. */
int ulp_archive_gc(ulp_archive *a, ulp_gc_result *res);

/* A pack is rewritten when less than this share of its bytes is live. */
#define ULP_RECLAIM_LIVE_PERCENT 50u
typedef struct ulp_reclaim_opts {
	unsigned live_percent;   /* rewrite threshold (0: ULP_RECLAIM_LIVE_PERCENT) */
	int full;                /* also remove pack files the index does not name
	                            (a crash's leftovers) and dead processes' temporaries */
	int (*stop)(void *arg);  /* asked before each pack rewrite: non-zero ends the
	                            pass there (bounded steps; the rest waits) */
	void *stop_arg;
	ulp_progress_fn progress; /* bytes of sparse packs rewritten of those to rewrite */
	void *progress_arg;
} ulp_reclaim_opts;
/** Gives space back without re-basing: drops blobs nothing reaches, removes
 *  packs with nothing live (an unlink), rewrites packs whose live share is
 *  under the threshold (each blob decoded and checked first, each pack in
 *  a transaction of its own), then truncates the index's write-ahead log.
 *  Crash-safe as gc. Adds its counts to *res (may be NULL). o may be NULL. */
int ulp_archive_reclaim(ulp_archive *a, const ulp_reclaim_opts *o, ulp_gc_result *res);

/* Where the archive's disk space goes (ulp_archive_space). Disk figures are
 * allocated blocks, as du(1) counts them. */
typedef struct ulp_space {
	uint64_t disk_bytes;        /* the archive directory: index, packs, staging */
	uint64_t index_bytes;       /* of which ulpack.db with its -wal and -shm, and ulpack.reserve */
	uint64_t pack_disk_bytes;   /* of which the files under packs/ */
	uint64_t staging_bytes;     /* of which staged files (not archived yet) */
	uint64_t pack_bytes;        /* bytes of the packs the index names */
	uint64_t live_bytes;        /* bytes of the blobs a file or a chain needs */
	uint64_t reclaimable_bytes; /* pack bytes nothing needs (dead blobs, dead or
	                               unnamed pack files): what gc would give back */
	uint64_t packs, dead_packs, sparse_packs; /* packs; with nothing live; under the threshold */
	uint64_t pending_recodes;   /* files queued for re-basing (a newer step arrived,
	                               a rename) and tensors coded against removed steps */
	/* An archive in an object store ("s3://..."): the disk figures above are
	 * its local home's (a cache of packs and generations); the archive is
	 * the bucket's objects, listed: */
	int in_bucket;              /* 1: an archive in a bucket (the fields below set) */
	uint64_t bucket_bytes;      /* every object under the archive's prefix */
	uint64_t bucket_pack_bytes; /* of which the packs (PREFIX/packs/) */
	uint64_t bucket_packs;      /* pack objects */
	uint64_t bucket_unnamed_bytes; /* of which packs the index does not name (dropped:
	                               reclaimable_bytes counts them, gc removes them once
	                               past the grace) */
} ulp_space;
/** Measures the archive's disk use (a walk of its directory and index
 *  queries; read-only archives too; an archive in a bucket: a listing of
 *  the bucket too). */
int ulp_archive_space(ulp_archive *a, ulp_space *out);
/** Its disk_bytes alone: the walk of the directory, no index query (df).
 *  An archive in a bucket: the bucket's bytes (bucket_bytes) as listed at
 *  most 30 s before, the listing made in the background (the figure of
 *  the last one meanwhile; before the first, at most 2 s waited for it,
 *  then the local home's). */
uint64_t ulp_archive_disk_bytes(ulp_archive *a);
/** sp as one JSON object ({"disk_bytes": ..., ...}, every field; the
 *  bucket_* ones only where in_bucket) into
 *  dst[cap], NUL-terminated: the form of `ulpack stat --json`'s "space", of
 *  `ulpack gc --json` and of the mount root's user.ulpack.space.
 *  @return its length (truncated if >= cap). */
int ulp_space_json(const ulp_space *sp, char *dst, size_t cap);

/* ---- re-basing (recode.c) ------------------------------------------------
 *
 * A stored tensor can be re-coded against another reference, or as an
 * anchor, without changing its content: each re-coded blob is decoded and
 * compared before it counts, the new pack is durable before one index
 * transaction commits the new codings (a crash leaves the old state or the
 * new one), no chain exceeds max_chain, and readers see the same bytes
 * throughout. Work runs on the archive's pool. */
typedef struct ulp_rebase_result {
	uint64_t planned;        /* blobs considered for re-coding */
	uint64_t recoded;        /* blobs re-coded and committed */
	uint64_t anchors;        /* of which now standalone */
	uint64_t not_better;     /* tried and kept as they were (not smaller) */
	uint64_t raw_bytes;      /* decoded bytes of the re-coded blobs */
	uint64_t stored_before, stored_after; /* their stored bytes, before and after */
	double seconds;          /* wall time of the call */
} ulp_rebase_result;

/** Re-codes tensor `tensor` of file path against the same tensor of file
 *  ref_path (same dtype and size), or standalone when ref_path is NULL.
 *  Errors: NOENT, INVAL (ref_path needs this tensor, or the chain would
 *  exceed max_chain). res may be NULL. */
int ulp_archive_rebase(ulp_archive *a, const char *path, const char *tensor, const char *ref_path,
                       ulp_rebase_result *res);
/** Handles the re-basing queue that the index keeps (in the transactions
 *  of puts and renames, so a crash loses none of it): a file whose series
 *  changed by a rename, or that arrived between archived steps, and its
 *  neighbouring steps are re-coded against their nearest step where that is
 *  smaller. Call it after archiving (a mount's idle time, unmount, gc). */
int ulp_archive_rebase_pending(ulp_archive *a, ulp_progress_fn progress, void *arg, ulp_rebase_result *res);
/** Re-codes the tensors whose reference no file uses any more (its step
 *  was removed) against the nearest remaining step of their series (in step
 *  order, as an import of the remaining steps would), or standalone, so that
 *  gc can drop the removed steps' blobs. */
int ulp_archive_rebase_orphans(ulp_archive *a, ulp_progress_fn progress, void *arg, ulp_rebase_result *res);

/* Retention: which steps of a run to keep. A step is kept if any rule keeps
 * it; files without a step are always kept. */
typedef struct ulp_forget_opts {
	int64_t keep_last;     /* the N highest steps (0: no such rule) */
	int64_t keep_every;    /* steps that are multiples of K (0: no such rule); by step
	                          number, not position, so that a new step never changes
	                          which older ones are kept */
	const int64_t *keep;   /* these steps */
	size_t n_keep;
	int dry_run;           /* 1: report only */
} ulp_forget_opts;
/** Removes the files of the steps of run (a path prefix) that no rule
 *  keeps, and the directories that leaves empty, in one transaction;
 *  cb(arg, step, files, kept) is called for each step, ascending (may be
 *  NULL). Space returns with ulp_archive_gc. Errors: INVAL (no rule),
 *  NOENT (no such run).
 *  @return the number of steps forgotten (or that would be, dry_run). */
int64_t ulp_archive_forget(ulp_archive *a, const char *run, const ulp_forget_opts *o,
                           int (*cb)(void *arg, int64_t step, uint64_t files, int kept), void *arg);

/**
 * Decodes every file under prefix ("" for all) and checks its sha256 (and its
 * stored header's); calls bad(arg, path, why) for each damaged file and for
 * each index row (file, directory, symlink) that no directory reaches.
 * @return number of damaged files and unreachable rows, or a negative error.
 */
int64_t ulp_archive_verify(ulp_archive *a, const char *prefix,
                           void (*bad)(void *arg, const char *path, const char *why), void *arg);
/** ulp_archive_verify with progress(parg, bytes checked, bytes to check)
 *  (from any thread, one call at a time). */
int64_t ulp_archive_verify_progress(ulp_archive *a, const char *prefix,
                                    void (*bad)(void *arg, const char *path, const char *why), void *arg,
                                    ulp_progress_fn progress, void *parg);

/* Counters of the decode cache (monotonic since open). */
typedef struct ulp_counters {
	uint64_t chunks_decoded;  /* chunk decodes of any codec */
	uint64_t deltas_decoded;  /* of which needed a reference */
	uint64_t cache_hits, cache_misses;
	uint64_t cache_bytes;     /* bytes held now */
	uint64_t cache_recycled;  /* chunk buffers reused from references already used */
	uint64_t max_walk;        /* longest chain walked by one cold chunk read */
} ulp_counters;
void ulp_archive_counters(ulp_archive *a, ulp_counters *c);
/** Lets go of the mapped packs whose files were removed meanwhile (by gc,
 *  maybe in another process) and that no open file uses, so that their disk
 *  space goes back. Costs a stat(2) per mapped pack. Thread-safe.
 *  @return the number of packs let go. */
int ulp_archive_trim(ulp_archive *a);

/* Sizes for `ulpack stat`: per file under prefix, and totals per dtype. */
typedef struct ulp_dtype_total {
	uint64_t raw_bytes, stored_bytes, elements, tensors, deltas, anchors;
} ulp_dtype_total;
typedef struct ulp_report {
	uint64_t files, dirs, raw_bytes, stored_bytes, blobs, pack_bytes;
	unsigned max_chain_depth;
	ulp_dtype_total by_dtype[ULP_DT__COUNT]; /* tensors only (kind 1 and 2 files) */
	uint64_t opaque_raw, opaque_stored;      /* other files and non-tensor bytes */
} ulp_report;
int ulp_archive_report(ulp_archive *a, const char *prefix,
                       int (*per_file)(void *arg, const char *path, const ulp_stat *st), void *arg,
                       ulp_report *out);

/* Staging: files being written (through a mount) before they are archived. */
typedef struct ulp_stage ulp_stage;
/** A new staged file in ARCHIVE/staging, empty or a copy of the archived
 *  file copy_from (when not NULL). Caller commits or discards it. */
int ulp_stage_new(ulp_archive *a, const char *copy_from, ulp_stage **out);
/** Its file descriptor (read/write). */
int ulp_stage_fd(const ulp_stage *s);
/** pwrite(2) into the staged file: bytes written, or -ULP_E_NOSPC / -ULP_E_IO
 *  with a message naming the staging file. */
int64_t ulp_stage_write(ulp_stage *s, const void *buf, size_t len, uint64_t off);
/** Makes the staged bytes durable and records path and meta, so that a crash
 *  before the commit is recovered at the next open (ulp_stage_recover). */
int ulp_stage_sync(ulp_stage *s, const char *path, const ulp_meta *meta);
/** Records path and meta without fsync: a crash of this process (not of the
 *  machine) before the commit is then recovered under path. Durable if the
 *  stage was synced before. */
int ulp_stage_record(ulp_stage *s, const char *path, const ulp_meta *meta);
/** After a rename: if path and meta were recorded or synced, records them
 *  again (as durably as before) under the new path; else does nothing. */
int ulp_stage_relabel(ulp_stage *s, const char *path, const ulp_meta *meta);
/** Removes the record of path and meta (durably if it was synced), so that
 *  no recovery brings the staged file back: for a staged file unlinked or
 *  replaced while still open. s stays valid. */
int ulp_stage_forget(ulp_stage *s);
/** Archives the staged file at path (ulp_archive_put) and frees s on
 *  success; on failure s stays staged and valid. */
int ulp_stage_commit(ulp_stage *s, const char *path, const ulp_meta *meta, ulp_put_result *res);
/** Removes the staged file and frees s (NULL accepted). */
void ulp_stage_discard(ulp_stage *s);
/** Frees s and leaves its files: after ulp_stage_sync they are archived by
 *  the next ulp_stage_recover (a file that could not be archived now). */
void ulp_stage_close(ulp_stage *s);
/** At mount: archives staged files left by a crash after ulp_stage_sync, and
 *  removes the others (never acknowledged to a writer). */
int ulp_stage_recover(ulp_archive *a, unsigned *recovered, unsigned *removed);
/** Staged files that a process which is gone left with a record (a mount
 *  killed before it archived them): invisible to the index until recovered.
 *  Counts them into *n (read-only archives too). */
int ulp_stage_orphans(ulp_archive *a, unsigned *n);
/** Recovers those files (ulp_stage_recover) when no mount holds the archive
 *  (its mount lock is free, taken for the while): the commands that write
 *  run it first, so that a staged copy is archived before, never over, what
 *  they write. Errors: BUSY (a mount holds the archive: its staging is its
 *  own; nothing done), or ulp_stage_recover's. */
int ulp_stage_recover_unmounted(ulp_archive *a, unsigned *recovered);

/*
 * The write-back session: POSIX file semantics over an archive, for the
 * mount (ulpackfs) and for tests. Files are staged (ARCHIVE/staging) while
 * written; close records them there (a crash of the process then recovers
 * them, ulp_stage_recover) and queues them; one background thread archives
 * them in close/rename order, coding each on the archive's pool. fsync makes
 * a staged file durable against power loss. Thread-safe. Paths as in the
 * archive; every call returns 0 or a negative ULP_E_* (message:
 * ulp_archive_errmsg).
 */
typedef struct ulp_session ulp_session;
/** An open file description: refers to the staged file or archived file it
 *  opened, whatever names that file gets later. */
typedef struct ulp_sfile ulp_sfile;
typedef struct ulp_session_opts {
	uint64_t staging_max;  /* queued staged bytes before writes wait; 0: half the free space (>= 64M) */
	void (*log)(void *arg, const char *msg); /* errors of background work; may be NULL */
	void *log_arg;
	void (*note)(void *arg, const char *msg); /* one line per archived step (with log_arg);
	                                             may be NULL */
} ulp_session_opts;
typedef struct ulp_session_counters {
	uint64_t queued, queued_bytes;      /* waiting for or being archived */
	uint64_t staged, staged_bytes;      /* files that differ from the archive (open, queued, failed) */
	uint64_t archived, archived_bytes;  /* archived in the background since open */
	uint64_t failed;                    /* background archivings that failed */
	uint64_t bytes_per_s;               /* archived bytes per second of archiving */
	uint64_t staging_max;
	int archiving_nice;                 /* niceness archiving takes now: 0, or 19 while writers
	                                       come first (ulpackfs(1)) */
	int archiving_overlaps;             /* 1: a closed file's archiving may start while others
	                                       are written (4 threads or more); 0: it waits for
	                                       writing to pause (ulpackfs(1)) */
	uint64_t steps;                     /* steps archived (one note line each) */
	uint64_t errors;                    /* errors of background work logged since open */
	uint64_t tidies, reclaimed_bytes;   /* tidy passes; the bytes they gave back */
	char current[512];                  /* the file being archived now ("": none; cut to fit) */
	uint64_t current_ms;                /* for how long it has been */
} ulp_session_stats;
enum { ULP_RENAME_NOREPLACE = 1 };
/** Starts a session (and its archiver thread) on an archive open for writing. */
int ulp_session_open(ulp_archive *a, const ulp_session_opts *opts, ulp_session **out);
/** Archives what is queued, in order, re-bases, then archives what is still
 *  staged (kept in staging for the next recovery when that fails), and frees
 *  s. Returns the number of files kept in staging. */
unsigned ulp_session_close(ulp_session *s);
/** Opens path: flags O_RDONLY/O_WRONLY/O_RDWR, O_TRUNC; create (not NULL:
 *  O_CREAT) gives the mode, uid and gid of a new file. Opening for writing
 *  stages the file (a copy of the archived one unless truncated). */
int ulp_session_open_file(ulp_session *s, const char *path, int flags, const ulp_meta *create, ulp_sfile **out);
/** 1 if h reads an archived file (immutable: may be cached), 0 if staged. */
int ulp_session_file_archived(const ulp_sfile *h);
int64_t ulp_session_read(ulp_sfile *h, void *dst, size_t dst_cap, uint64_t off);
/** Writes into the staged file; waits while the queue holds more than
 *  staging_max bytes. Errors: NOSPC, IO. */
int64_t ulp_session_write(ulp_sfile *h, const void *src, size_t len, uint64_t off);
/** What write(2) or truncation by a process without CAP_FSETID does to the
 *  mode (the caller decides who that is): clears S_ISUID, and S_ISGID when
 *  group execute is set; the cleared mode is what gets archived. */
int ulp_session_kill_suid(ulp_sfile *h);
int ulp_session_ftruncate(ulp_sfile *h, uint64_t size);
int ulp_session_truncate(ulp_session *s, const char *path, uint64_t size);
/** close(2) of a descriptor of h: the last handle open for writing records
 *  the file in staging and queues it for archiving; never codes. A file that
 *  a dup'd descriptor still writes is archived after ulp_session_release. */
int ulp_session_flush(ulp_sfile *h);
/** Makes h's staged bytes and name durable (power loss). */
int ulp_session_fsync(ulp_sfile *h);
/** The last close of h (frees it). */
void ulp_session_release(ulp_sfile *h);
int ulp_session_fstat(ulp_sfile *h, ulp_stat *st);
/** stat of a staged file, a file unlinked while open, or the archive's. */
int ulp_session_stat(ulp_session *s, const char *path, ulp_stat *st);
/** 1 if a staged file at path or under it (a directory; "" for all) is open
 *  for writing, or waits under a temporary name (ulp_session_temp_name) for
 *  the rename that gives it its final name; else 0. Files closed and queued
 *  or being archived are not busy. */
int ulp_session_busy_under(ulp_session *s, const char *path);
/** The archive's stat of path once its queued archiving is done; 1 if path
 *  is staged only (not archived: open, or failed). */
int ulp_session_stat_archived(ulp_session *s, const char *path, ulp_stat *st);
/** Lists a directory: archived entries and staged files, not hidden names. */
int ulp_session_readdir(ulp_session *s, const char *path, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                        void *arg);
/** rename(2); a target that is a hidden name (ulp_session_hidden_name) hides
 *  a file unlinked while open. flags: ULP_RENAME_NOREPLACE. */
int ulp_session_rename(ulp_session *s, const char *from, const char *to, unsigned flags);
int ulp_session_unlink(ulp_session *s, const char *path);
int ulp_session_rmdir(ulp_session *s, const char *path);
/** mkdir(2): in the archive, or on a contributor host (ulp_archive_opts.contribute)
 *  in this host's view until its files are published. */
int ulp_session_mkdir(ulp_session *s, const char *path, const ulp_meta *meta);
/** chmod/chown/utimens by path or by handle (h may be NULL). */
int ulp_session_setattr(ulp_session *s, const char *path, ulp_sfile *h, unsigned which, const ulp_meta *meta);
/** Barrier: returns when every file queued before the call is archived
 *  (failed ones are tried again first); a file still open for writing (and
 *  written since a close) is not waited for: it stays staged until its last
 *  release. Calls failed(arg, path, why) for
 *  every staged file whose archiving failed; returns their number. */
int ulp_session_sync(ulp_session *s, void (*failed)(void *arg, const char *path, const char *why), void *arg);
/** path's archiving state into dst: "staged", "staged queued", "archived",
 *  "failed ERRNO MESSAGE" ("" for a directory). Errors: NOENT. */
int ulp_session_state(ulp_session *s, const char *path, char *dst, size_t dst_cap);
void ulp_session_counters(ulp_session *s, ulp_session_stats *c);
/** libfuse's names for files unlinked while open (".fuse_hidden" + 16 hex). */
int ulp_session_hidden_name(const char *path);

/* What a daemon (or an archive at rest) is doing: `ulpack status`, the
 * mount root's user.ulpack.status and ulpackfs -o metrics (archive/status.c).
 *
 * A log (ulp_log) is where a daemon's lines go: errors once each (a damaged
 * file read five times logs one line; repeats are counted), a shared
 * archive's lines prefixed with the host. Thread-safe. */
typedef struct ulp_log ulp_log;
/** sink(arg, is_error, line) gets each line (not NULL); host: prefix every
 *  line with "[host] " (NULL or "": none). Frees with ulp_log_free. */
int ulp_log_new(void (*sink)(void *arg, int is_error, const char *line), void *arg, const char *host,
                ulp_log **out);
void ulp_log_free(ulp_log *l);
/** Logs msg as an error the first time key (NULL: msg itself) is seen;
 *  counts it every time. @return 1 if logged, 0 if a repeat. */
int ulp_log_error(ulp_log *l, const char *key, const char *msg);
/** Logs msg (not an error: never deduplicated). */
void ulp_log_note(ulp_log *l, const char *msg);
/** Errors reported since ulp_log_new, repeats included, and distinct ones. */
void ulp_log_errors(ulp_log *l, uint64_t *all, uint64_t *distinct);

typedef struct ulp_status {
	int live;                     /* 1: a mounted daemon's (a session's) figures; 0: at rest */
	int read_only;                /* the mount (or open) is read-only */
	uint64_t uptime_ms;           /* since the mount (live) */
	int64_t now_ms;               /* wall clock, ms since 1970, when taken */
	/* the queue (live): files closed and waiting for, or being, archived */
	uint64_t queued, queued_bytes, staged, staged_bytes;
	uint64_t archived, archived_bytes, failed, steps;
	uint64_t bytes_per_s;         /* archiving rate: bytes per second of archiving */
	char current[512];            /* file being archived now, "" none */
	uint64_t current_ms;          /* for how long */
	uint64_t errors, errors_distinct; /* logged since the mount (live) */
	/* space (the index): ulp_archive_space */
	uint64_t disk_bytes, live_bytes, reclaimable_bytes, pending_recodes, packs;
	/* the decode and pack cache */
	uint64_t cache_bytes, cache_hits, cache_misses;
	/* many hosts */
	int shared, writer, fenced;
	uint64_t gen, epoch;          /* generation followed or published; lease epoch */
	char holder[256];             /* host holding the lease ("" none known) */
	int64_t published_ms;         /* wall ms of the last publication (0: none known): the
	                                 writer's; a reader's generation file's mtime */
} ulp_status;
/** Fills st from a (and s, a mounted daemon's session, and l, its log; each
 *  may be NULL). Reads the index (space). Errors: IO (message:
 *  ulp_archive_errmsg). */
int ulp_status_get(ulp_archive *a, ulp_session *s, ulp_log *l, ulp_status *st);
/** st as one JSON object (flat: numbers and strings) into dst.
 *  @return its length, or -ULP_E_INVAL when dst_cap is too small. */
int ulp_status_json(const ulp_status *st, char *dst, size_t dst_cap);
/** Parses what ulp_status_json wrote (unknown keys are skipped). Errors: INVAL. */
int ulp_status_parse(const char *json, ulp_status *st);
/** b for people: "512 B", "1.5 KiB", "16.1 MiB" (powers of 1024, one decimal). */
void ulp_format_bytes(uint64_t b, char *dst, size_t dst_cap);
/** st for people: a few lines (ulpack status). @return length or -ULP_E_INVAL. */
int ulp_status_text(const ulp_status *st, char *dst, size_t dst_cap);
/** st in Prometheus's text exposition format (version 0.0.4): ulpack_*
 *  metrics with HELP and TYPE lines, labelled archive and host.
 *  @return length or -ULP_E_INVAL. */
int ulp_status_metrics(const ulp_status *st, const char *archive, const char *host, char *dst, size_t dst_cap);
/** Writes data to path atomically (PATH.tmp-PID, then rename; mode 0644), as
 *  node_exporter's textfile collector wants. Errors: IO (errno says why). */
int ulp_status_write_file(const char *path, const char *data, size_t len);
/** rsync's temporary names (".name.XXXXXX"): archived once renamed. */
int ulp_session_temp_name(const char *path);

/** Parses a size such as "512M", "4G", "1.5T" or "65536" (K, M, G, T are
 *  powers of 1024; a trailing B is allowed). Errors: INVAL. */
int ulp_parse_size(const char *s, uint64_t *out);

/* Paths inside an archive: components of at most ULP_NAME_MAX bytes (what
 * export, rsync and every local file system can write back), at most
 * ULP_PATH_MAX bytes in all. */
#define ULP_NAME_MAX 255
#define ULP_PATH_MAX 4095
/** 0 if path (relative to the archive's root) may be created in an archive.
 *  Errors: NAMETOOLONG, INVAL (a ".." component). */
int ulp_path_check(const char *path);

/* Times (ulp_time, above). */
/** sec + nsec, normalised so that nsec is in [0, 1e9) (nsec may be any value,
 *  e.g. a timespec's, -1 or 1e9); a sum beyond the int64 seconds saturates at
 *  {INT64_MIN, 0} or {INT64_MAX, 999999999}. */
ulp_time ulp_time_make(int64_t sec, int64_t nsec);
/** ns nanoseconds since the epoch as a time (exact for every int64). */
ulp_time ulp_time_from_ns(int64_t ns);
/** The current time (CLOCK_REALTIME). */
ulp_time ulp_time_now(void);
/** sec + nsec as int64 nanoseconds, which cover 1677-09-21 to 2262-04-11 only
 *  (the index's legacy mtime_ns column): a time outside is clamped to the
 *  nearest end. nsec is in [0, 1e9) (a timespec's). */
int64_t ulp_time_ns(int64_t sec, int64_t nsec);
/** Splits ns into seconds and a nanosecond part in [0, 1e9) (rounds toward
 *  minus infinity, so a time before 1970 with a fraction stays exact). */
void ulp_time_split(int64_t ns, int64_t *sec, long *nsec);

/** Parses a decimal integer strictly: an optional '-', then digits only (no
 *  blanks, no trailing characters, no overflow), within [min, max].
 *  Errors: INVAL (not such an integer), OVERFLOW (outside [min, max]). */
int ulp_parse_int(const char *s, int64_t min, int64_t max, int64_t *out);

/** Step number parsed from a path (checkpoint-1500, step_1500, step-1500,
 *  global_step1500, iter_0001500, epoch3-step1500, else the last number of
 *  the file name), or -1. *series receives the path with the step's digits
 *  replaced by "{S}" (malloc'd; NULL when there is no step). */
int64_t ulp_parse_step(const char *path, char **series);

/* ---- steps and runs (steps.c) -------------------------------------------- */

/** Compares names as people read numbered names: runs of digits by their
 *  value (checkpoint-200 before checkpoint-1000), the rest bytewise; a total
 *  order, 0 only for equal strings. For qsort of names and paths. */
int ulp_name_cmp(const char *a, const char *b);
/** The step of a step directory's name (checkpoint-N, checkpoint_N, step_N,
 *  step-N, step=N, stepN, iter_N, iteration_N, ckpt-N, epochE-stepN, or
 *  digits only), or -1: names starting with '.' or "tmp" (temporaries) and
 *  DeepSpeed's global_stepN are not step directories. A run directory is a
 *  directory that is neither a step directory nor inside one and holds at
 *  least one step directory or step file. */
int64_t ulp_name_step(const char *name);
/** The step of a step file's name (model_step_1000.pt, epoch=0-step=100.ckpt,
 *  checkpoint-5.pth: a name with an extension whose stem is a step name by
 *  ulp_name_step and not digits only), or -1. A step file outside any step
 *  directory is a step of the directory holding it. */
int64_t ulp_name_step_file(const char *name);

/* One step of a run, for ulp_archive_steps. */
typedef struct ulp_step_info {
	const char *run;        /* the run directory ("" for the archive's root) */
	const char *dir;        /* the step directory's path */
	int64_t step;
	uint64_t files;         /* files under it, at any depth */
	uint64_t raw_bytes, stored_bytes; /* their sizes and the blob bytes they introduced */
	unsigned chain_depth;   /* deepest delta chain among them */
	int is_file;            /* a step file: dir is its path, files 1 */
} ulp_step_info;
/** Calls cb for each step directory and step file under prefix ("" for all),
 *  by run (path order) and then by step; a file counts in its shallowest
 *  ancestor step directory. Stops at a non-zero return of cb, which it returns. Strings
 *  are valid during the call. Errors: NOENT (prefix), NOMEM. */
int ulp_archive_steps(ulp_archive *a, const char *prefix, int (*cb)(void *arg, const ulp_step_info *s),
                      void *arg);
/** The name of the child of run directory dir (a step directory or step
 *  file) with the highest step (ties: the greatest by ulp_name_cmp) into
 *  name[cap], passing over empty step directories. Errors: NOENT (dir is not
 *  a run directory, or no step qualifies), EXIST (dir has a real entry
 *  called "latest": it wins), OVERFLOW (cap). */
int ulp_archive_latest(ulp_archive *a, const char *dir, char *name, size_t cap);
/** ulp_archive_latest as session s (on a; NULL: the archive alone) shows
 *  dir: staged files count, and a step with a file open for writing or
 *  waiting for its rename (ulp_session_busy_under) is passed over for the
 *  step before it; closed files still queued for archiving count. */
int ulp_archive_latest_live(ulp_archive *a, ulp_session *s, const char *dir, char *name, size_t cap);

/* ---- the change between two checkpoints (diff.c) ---------------------------
 *
 * Decodes the tensors of two files (through the decode cache, a chunk pair
 * at a time) and measures, per tensor of the same name, dtype and size, what
 * changed. ULP distances are between the values' ordered integers (the
 * codec's: a float's bits with the sign folded so that the integers keep the
 * values' order), exact; percentiles are of every element's distance (0 for
 * an unchanged one), the value at rank floor(q (n - 1)) of them sorted. */
typedef struct ulp_tensor_diff {
	char *name;
	int dtype;               /* ulp_dtype */
	uint64_t elements;
	uint64_t changed;        /* elements whose bits differ */
	double frac_changed;     /* changed / elements */
	uint64_t median_ulps, p99_ulps, max_ulps; /* floats; 0 for other dtypes */
	double rel_change;       /* ||b - a|| / ||a|| over the values, in double (floats:
	                            NaN where a is all zeros and b is not; other dtypes: NaN) */
	double norm_a, norm_diff; /* ||a|| and ||b - a|| */
	uint64_t exponent_moves; /* floats: elements whose exponent field differs */
} ulp_tensor_diff;
/** The tensors of path_a and path_b that match by name, dtype and size,
 *  in *out (n of them, malloc'd; ulp_tensor_diffs_free), sorted by
 *  rel_change, largest first (NaN last). Memory: the largest pair of
 *  tensors. Errors: NOENT, INVAL (no tensor in common), NOMEM, IO, CORRUPT. */
int ulp_archive_diff(ulp_archive *a, const char *path_a, const char *path_b, ulp_tensor_diff **out, size_t *n);
void ulp_tensor_diffs_free(ulp_tensor_diff *v, size_t n);

/* ---- training dynamics (dynamics.c) ---------------------------------------
 *
 * What a run's index says about its training, with nothing decoded: for each
 * step and each tensor, the stored bits per weight of the tensor's blob, its
 * role (anchor, delta, same blob as the step before) and chain, and the size
 * of the update from the step before (the delta that links the two steps,
 * whichever of them it codes), summed per layer and per step. ulpack(1)
 * DYNAMICS defines each figure. */

/* Roles of a tensor at a step. */
enum {
	ULP_DYN_ABSENT = 0, /* the step has no tensor of that name and file */
	ULP_DYN_ANCHOR,     /* stored standalone */
	ULP_DYN_DELTA,      /* a delta against another blob */
	ULP_DYN_SAME        /* the same blob as at the step before (no change) */
};

typedef struct ulp_dyn_cell {
	int role;               /* ULP_DYN_* */
	int codec;              /* ULP_CODEC_* of its blob; -1 if absent */
	uint64_t stored_bytes;  /* its blob's stored bytes; 0 for ULP_DYN_SAME */
	double bits_per_weight; /* 8 x stored_bytes / elements (0 if absent) */
	int64_t ref_step;       /* the step of this run whose same tensor its blob
	                           is a delta against; -1 for none (an anchor, a
	                           same blob, or a reference outside the run) */
	unsigned chain_depth;   /* deltas between its blob and an anchor */
	double update_bits;     /* bits per weight of the change from the step
	                           before: the stored bits of the delta linking the
	                           two steps (this one against it, or it against
	                           this one), 0 for the same blob; NaN where no delta
	                           links them (the first step, an anchor's far
	                           side, a delta over several steps) */
	int update_bound;       /* 1: update_bits is a lower bound: the step that
	                           would be the delta (by the direction the file's
	                           other tensors link the two steps) holds this
	                           tensor standalone, the delta being no smaller */
} ulp_dyn_cell;

/* Excess bits: an update's bits per weight less the median of the same
 * figure at the ULP_DYN_WINDOW steps each side (itself left out). A delta
 * stores each element's change as a count of units in the last place, about
 * log2 of it in bits: one more bit per weight is about twice the change. */
#define ULP_DYN_WINDOW 3

/* The step whose update stands out most from its neighbours'. */
typedef struct ulp_dyn_jump {
	size_t step_index;      /* into steps */
	int64_t step;
	double excess_bits;     /* its step update's excess bits (the largest) */
	double ratio;           /* 2^excess_bits: about how many times its neighbours' change */
	double update_bits, median_bits; /* its update and the neighbours' median, bits per weight */
	size_t layer_first, layer_last;  /* the layers (into layers, adjacent in
	                                    their order) that moved most: the top one
	                                    and its neighbours within half its excess */
	double layer_excess;    /* the top layer's excess bits */
	size_t top_tensor;      /* into tensors: the tensor with the largest excess */
	double tensor_excess;   /* its excess bits (NaN: none) */
} ulp_dyn_jump;

typedef struct ulp_dynamics {
	char *run;
	size_t n_steps, n_tensors, n_layers;
	int64_t *steps;         /* n_steps, ascending */
	char **tensors;         /* n_tensors names, in the order met (by file path, then offset) */
	char **tensor_files;    /* each tensor's file: its series under run ("checkpoint-{S}/model.safetensors") */
	int *tensor_dtypes;     /* ulp_dtype */
	uint64_t *tensor_elements;
	size_t *tensor_layer;   /* into layers */
	char **layers;          /* n_layers (ulp_dynamics_layer), in ulp_name_cmp order */
	ulp_dyn_cell *cells;    /* n_steps x n_tensors: cells[s * n_tensors + t] */
	double *layer_bits;     /* n_steps x n_layers: 8 x stored bytes / elements of its tensors */
	double *layer_update;   /* n_steps x n_layers: its tensors' update bits per weight
	                           of them; NaN unless every tensor there at both steps
	                           has an update figure */
	double *layer_excess;   /* n_steps x n_layers: excess bits of layer_update (NaN: none) */
	double *step_bits, *step_update; /* n_steps: the same over every tensor */
	double *step_excess;    /* n_steps: excess bits of step_update (NaN: none) */
	uint64_t *step_stored;  /* n_steps: stored bytes (ULP_DYN_SAME counts 0) */
	size_t n_files;         /* the run's files (series) */
	size_t *tensor_file_index; /* n_tensors: into the files */
	char **file_paths;      /* n_steps x n_files: each file's path at each step (NULL: absent) */
	/* ulp_dynamics_norms (NULL until then): the change from the step before */
	ulp_tensor_diff *norms; /* n_steps x n_tensors (elements 0: no figure) */
	double *layer_rel_change, *step_rel_change; /* n_steps x n_layers, n_steps:
	                           sqrt(sum ||b - a||^2 / sum ||a||^2) over their tensors (NaN: none) */
	double *layer_frac_changed, *step_frac_changed; /* elements changed / elements */
	int has_jump;           /* jump is set: 3 steps or more have an update figure */
	ulp_dyn_jump jump;
} ulp_dynamics;

/** The layer of a tensor name: the name up to its first component that is
 *  digits only ("model.layers.17.mlp.up_proj.weight" -> "model.layers.17");
 *  a name without one less its last component ("model.norm.weight" ->
 *  "model.norm"); a name of one component, itself. Writes at most cap bytes
 *  with the NUL; @return its length (truncated if >= cap). */
size_t ulp_dynamics_layer(const char *name, char *dst, size_t cap);
/** The dynamics of run (a directory of the archive; "" for the whole
 *  archive) from its index alone: the files with a step under it, their
 *  tensors whose name matches glob (fnmatch(3), NULL for all). One query,
 *  nothing decoded. Errors: NOENT (no such directory, or no tensor with a
 *  step under it; a step directory or a path in one), NOTDIR, NOMEM.
 *  Caller frees *out with ulp_dynamics_free. */
int ulp_archive_dynamics(ulp_archive *a, const char *run, const char *glob, ulp_dynamics **out);
void ulp_dynamics_free(ulp_dynamics *d);
/** Adds the decoded figures of each step's update (each tensor of each
 *  file against the same at the step before, as ulp_archive_diff measures
 *  it: d->norms and the per-layer and per-step relative change and share of
 *  elements changed). Walks the run in step order through the decode cache,
 *  a chunk pair at a time: each delta is decoded once, against the step
 *  before still cached (or its chain); progress (may be NULL) gets steps
 *  done of steps. Errors: NOMEM, IO, CORRUPT, CHECKSUM. */
int ulp_dynamics_norms(ulp_archive *a, ulp_dynamics *d, ulp_progress_fn progress, void *arg);
/** The one-line verdict ("step 4200: +1.6 bits/weight over its neighbours'
 *  update (about 3.1x the change), layers model.layers.17-19 +4.2, most
 *  model.layers.18.self_attn.o_proj.weight +4.9"), or a line saying why
 *  there is none, into dst[cap]. @return its length (truncated if >= cap). */
int ulp_dynamics_summary(const ulp_dynamics *d, char *dst, size_t cap);
/** d as JSON (every figure; NaN as null) into a malloc'd string *out of
 *  *len bytes (NUL-terminated); caller frees. compact: the steps, layers,
 *  per-layer and per-step figures and the jump only (no per-tensor
 *  matrices). Errors: NOMEM. */
int ulp_dynamics_json(const ulp_dynamics *d, int compact, char **out, size_t *len);

/** Bytes of the file being archived by ulp_archive_put (on any thread) that
 *  are coded so far; 0 between files. Thread-safe: for progress display. */
uint64_t ulp_archive_put_progress(const ulp_archive *a);

/* ---- mount lock (mountlock.c) ----------------------------------------------- */

/* Who holds an archive's mount lock. */
typedef struct ulp_mount_owner {
	long pid;               /* 0 if not recorded yet */
	char mountpoint[ULP_PATH_MAX + 1]; /* "" if not recorded yet */
	int alive;              /* the process runs */
	int mounted;            /* mountpoint is a live ulpackfs mount (this mount namespace) */
} ulp_mount_owner;
/** Takes the lock that allows one read-write mount of archive dir at a
 *  time (an exclusive flock on DIR/mount.lock, held while *fd is open, kept
 *  across fork). Never waits. Errors: BUSY (another process holds it; holder,
 *  when not NULL, says who and where), IO. errbuf gets the cause. */
int ulp_mount_lock(const char *dir, int *fd, ulp_mount_owner *holder, char *errbuf, size_t errcap);
/** Records the holder's pid and mount point in the lock open on fd. */
int ulp_mount_lock_note(int fd, long pid, const char *mountpoint);
/** Who holds dir's mount lock now, without taking it (ulpack status ARCHIVE):
 *  holder->mounted is 1 where a live ulpackfs serves it at
 *  holder->mountpoint. Errors: NOENT (never mounted read-write), IO. */
int ulp_mount_owner_get(const char *dir, ulp_mount_owner *holder);
/** 1 if mountpoint is a ulpackfs mount in /proc/self/mountinfo. */
int ulp_mount_active(const char *mountpoint);

/* ---- CPU dispatch -------------------------------------------------------- */

/* ULP_CPU_AVX512: AVX-512 F, BW, VL and VBMI (Ice Lake, Zen 4 and later).
 * ULP_CPU_NEON: aarch64 Advanced SIMD. */
enum { ULP_CPU_AVX2 = 1u << 0, ULP_CPU_AVX512 = 1u << 1, ULP_CPU_NEON = 1u << 2 };
/** Restricts the kernels used to those in mask (0: scalar only); returns the
 *  previous mask. Affects speed only, never output bytes. Process-wide. */
unsigned ulp_set_cpu_mask(unsigned mask);
/** Kernels this CPU and build support, less those the environment variable
 *  ULP_CPU rules out (scalar, avx2, avx512, neon or auto). */
unsigned ulp_cpu_features(void);

/* ---- safetensors ---------------------------------------------------------- */

typedef struct ulp_st_tensor {
	char *name;        /* NUL-terminated, owned by the ulp_st */
	ulp_dtype dtype;   /* ULP_DT_UNKNOWN for a dtype this build does not know */
	char dtype_name[16];
	unsigned ndim;
	uint64_t shape[8];
	uint64_t begin, end; /* byte range inside the data section */
} ulp_st_tensor;

typedef struct ulp_st ulp_st;

/**
 * Parses a safetensors header from the first bytes of a file. `head` holds
 * the first head_len bytes (at least 8; the whole header to succeed) and
 * file_size is the size of the whole file. Validates the length prefix, JSON,
 * UTF-8, dtypes, shapes, offsets (in range, not overlapping, matching
 * shape x dtype). Errors: CORRUPT (errbuf says why), NOMEM.
 * If the header is longer than head_len, returns ULP_E_OVERFLOW and writes the
 * needed length to *need (when need is not NULL).
 */
int ulp_st_parse(const void *head, size_t head_len, uint64_t file_size, ulp_st **out,
                 uint64_t *need, char *errbuf, size_t errcap);
void ulp_st_free(ulp_st *st);
size_t ulp_st_count(const ulp_st *st);
/** Tensors in order of their data offset. */
const ulp_st_tensor *ulp_st_tensor_at(const ulp_st *st, size_t i);
/** The tensor called name, or NULL. */
const ulp_st_tensor *ulp_st_find(const ulp_st *st, const char *name);
/** Size of the 8-byte prefix plus the JSON header: file offset of the data. */
uint64_t ulp_st_data_offset(const ulp_st *st);
/** The verbatim header (prefix + JSON), ulp_st_data_offset() bytes. */
const uint8_t *ulp_st_header_bytes(const ulp_st *st);

/** A tensor to write with ulp_st_write(). */
typedef struct ulp_st_wtensor {
	const char *name;
	ulp_dtype dtype;
	unsigned ndim;
	const uint64_t *shape;
	const void *data; /* product(shape) * ulp_dtype_size(dtype) bytes */
} ulp_st_wtensor;

/** Writes a safetensors file (tensors in the given order, header padded to 8
 *  bytes with spaces). Errors: IO (errno preserved), INVAL. */
int ulp_st_write(const char *path, const ulp_st_wtensor *t, size_t n, const char *metadata_json);

/* ---- torch.save zip files (torchzip.c) ------------------------------------ */

/** A storage of a torch.save file: a tensor's bytes in the file. */
typedef struct ulp_tz_storage {
	const char *name;        /* path of the first tensor using it ("state.0.exp_avg",
	                            "model.layers.3.mlp.up_proj.weight"), else
	                            "storage:KEY"; unique; owned by the ulp_tz */
	ulp_dtype dtype;         /* never ULP_DT_UNKNOWN (other storages are not listed) */
	uint64_t offset, length; /* in the file; length = numel x itemsize > 0 */
} ulp_tz_storage;

typedef struct ulp_tz ulp_tz;

/** Reads len bytes at off into buf: 0, or a negative code. */
typedef int (*ulp_tz_read_fn)(void *arg, void *buf, size_t len, uint64_t off);

/**
 * Reads a torch.save zip (PyTorch >= 1.6) of size bytes through rd: ZIP and
 * ZIP64 directories, local headers, and data.pkl's persistent ids. On
 * success *out lists the storages of known dtype, sorted by offset,
 * disjoint. Strict: CORRUPT (errbuf says why) for anything it does not
 * fully understand; NOMEM; rd's errors.
 */
int ulp_tz_parse(ulp_tz_read_fn rd, void *arg, uint64_t size, ulp_tz **out, char *errbuf,
                 size_t errcap);
/** The same over a buffer holding the whole file. */
int ulp_tz_parse_mem(const uint8_t *data, size_t size, ulp_tz **out, char *errbuf, size_t errcap);
size_t ulp_tz_count(const ulp_tz *z);
const ulp_tz_storage *ulp_tz_at(const ulp_tz *z, size_t i);
void ulp_tz_free(ulp_tz *z);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* ULPACK_H */
