/* SPDX-License-Identifier: MIT */
/*
 * ulp_int.h - internals shared by the modules of libulpack. Never installed.
 *
 * Error helpers: ULP_CORRUPT() records where a parser rejected its input and
 * why (file:line, like SQLite's SQLITE_CORRUPT_BKPT), so a message can name
 * the cause; ULP_TRY() forwards a negative code.
 */
#ifndef ULP_INT_H
#define ULP_INT_H

#include "ulpack.h"
#include <pthread.h>
#include <stdarg.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "libulpack assumes a little-endian host (tensors and formats are little-endian)"
#endif

#define ULP_TRY(expr) do { int ulp_rc_ = (int)(expr); if (ulp_rc_ < 0) return ulp_rc_; } while (0)
#define ULP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define ULP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define ULP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ULP_FORCE_INLINE: the codec's small kernels are inlined into each caller,
 * whose constant arguments specialize their loops. Under AddressSanitizer the
 * compiler chooses instead: with UBSan's checks in every forced copy, clang 14
 * took 100 s to compile codec.c (8 s when it chooses). */
#if defined(__SANITIZE_ADDRESS__)
#define ULP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ULP_SANITIZED 1
#endif
#endif
#ifdef ULP_SANITIZED
#define ULP_FORCE_INLINE inline
#else
#define ULP_FORCE_INLINE inline __attribute__((always_inline))
#endif

/* A small error sink: "why" plus where it was detected. */
typedef struct ulp_err {
	char *buf;  /* may be NULL */
	size_t cap;
} ulp_err;

int ulp_err_set(ulp_err *e, int code, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
#define ULP_ERR(e, code, ...) ulp_err_set((e), (code), __FILE__, __LINE__, __VA_ARGS__)
/* errno e as a code: NOSPC (ENOSPC, EDQUOT), NOMEM, else IO */
int ulp_errno_code(int e);
/* An object's last error message, one per thread (err.c): the archive's
 * (a->msgs), written through ulp_arch_err and ulp_arch_io_err. */
typedef struct ulp_msgs ulp_msgs;
int ulp_msgs_new(ulp_msgs **out);
void ulp_msgs_free(ulp_msgs *m);
int ulp_msgs_set(ulp_msgs *m, int code, const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
/* "path: what: strerror(e)", its code ulp_errno_code(e) */
int ulp_msgs_errno(ulp_msgs *m, int e, const char *file, int line, const char *path, const char *what);
const char *ulp_msgs_get(ulp_msgs *m);
/* The calling thread's interrupt check (ulp_set_interrupt; util/err.c):
 * ulp_interrupted is 1 where it says the wait should end. A thread that
 * works for another (a parallel fetch) installs the other's with
 * ulp_set_interrupt(saved.check, saved.arg) or a check of its own. */
typedef struct ulp_intr {
	int (*check)(void *arg);
	void *arg;
} ulp_intr;
void ulp_interrupt_get(ulp_intr *out);
int ulp_interrupted(void);
#define ULP_CORRUPT(e, ...) ULP_ERR((e), -ULP_E_CORRUPT, __VA_ARGS__)

/* The n bytes at s as text for a message (out, cap bytes, NUL-terminated;
 * returned): printable ASCII kept, a backslash doubled, \n \r \t, other
 * bytes as \xHH, so that what a file or a URL holds never reaches a terminal
 * raw; where it does not fit, cut after whole escapes and ended with "...".
 * cap bounds the length: 64 shows about 60 bytes. */
const char *ulp_quote(char *out, size_t cap, const void *s, size_t n);

/* Little-endian loads and stores. */
static inline uint16_t ulp_ld16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t ulp_ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t ulp_ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline void ulp_st16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void ulp_st32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void ulp_st64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/*
 * Makes room for one more element in a growing array: *arr (elements of
 * size bytes, *cap of them, n in use) doubles when full. 0 or -ULP_E_NOMEM
 * (*arr unchanged). Usage: if (ulp_grow(&v, &cap, n, sizeof(*v)) < 0) ...
 */
int ulp_grow(void *arr, size_t *cap, size_t n, size_t size);
/* Sets the calling thread's scheduling niceness (pool.c); pool workers take
 * the niceness of the thread whose ulp_pool_run() they serve. 0 or -errno. */
int ulp_thread_set_nice(int nice);
/* From now on the calling thread takes the niceness *src holds (read
 * atomically) at each outermost ulp_pool_run(); NULL stops it. */
void ulp_thread_follow_nice(const int *src);

/* A per-thread buffer of at least size bytes, reused across calls (scratch.c);
 * valid until the same slot is asked again on this thread. NULL: no memory. */
enum {
	ULP_SCRATCH_REF, ULP_SCRATCH_CHECK,                   /* ingest */
	ULP_SCRATCH_SYMS, ULP_SCRATCH_ARENA0, ULP_SCRATCH_ARENA1, /* encoder */
	ULP_SCRATCH_COUNTS,                                   /* encoder pass 1 */
	ULP_SCRATCH_DTAB,                                     /* blob.c: decode slot table */
	ULP_SCRATCH_HIST,                                     /* diff.c: a piece's distances */
	ULP_SCRATCH_SLOTS
};
void *ulp_scratch(unsigned slot, size_t size);
/* A thread that runs someone else's job while it waits (pool.c) sets its
 * buffers aside: ulp_scratch then serves a fresh set until the matching pop.
 * ulp_scratch_can_push: 0 when ULP_SCRATCH_LEVELS sets are in use. */
#define ULP_SCRATCH_LEVELS 4
int ulp_scratch_can_push(void);
void ulp_scratch_push(void);
void ulp_scratch_pop(void);
/* The calling thread's current level, 0 .. ULP_SCRATCH_LEVELS - 1. */
unsigned ulp_scratch_level(void);
/* Buffers above this size are not kept between calls (a thread would hold
 * on to them for good): ulp_scratch_or_malloc mallocs them instead. */
#define ULP_SCRATCH_KEEP_MAX ((size_t)64 << 20)
/* A buffer for bulk data, freed with free(): from 2 MiB on it is 2 MiB
 * aligned and asks for transparent huge pages, so that its first touch costs
 * one page fault per 2 MiB instead of 512 (scratch.c). */
void *ulp_alloc_big(size_t size);
/* Buffers carved side by side from shared 2 MiB huge-page slabs (slab.c):
 * ulp_carve returns NULL for a size outside ULP_SLAB_MIN..ULP_SLAB_BYTES or
 * without memory (then malloc), else the buffer and its slab, whose
 * reference the buffer holds: ulp_slab_put(*slab) frees it, from any thread.
 * A carver (its own lock) is set up and torn down by its owner; buffers may
 * outlive it. */
#define ULP_SLAB_BYTES ((size_t)2 << 20)
#define ULP_SLAB_MIN ((size_t)128 << 10)
#define ULP_SLAB_SPAN (ULP_SLAB_BYTES + 4096) /* a slab: its huge page and a small one */
typedef struct ulp_slab ulp_slab;
typedef struct ulp_carver {
	pthread_mutex_t mu;
	ulp_slab *open[2];
} ulp_carver;
void ulp_carver_init(ulp_carver *c);
void ulp_carver_done(ulp_carver *c);
void *ulp_carve(ulp_carver *c, size_t size, ulp_slab **slab);
void ulp_slab_put(ulp_slab *s);
/* ulp_scratch(slot, size) for sizes up to ULP_SCRATCH_KEEP_MAX (*owned = 0),
 * else malloc(size) (*owned = 1: the caller frees it). */
void *ulp_scratch_or_malloc(unsigned slot, size_t size, int *owned);

/* 64-bit content checksum of a decoded chunk (XXH3-64, seed 0). */
uint64_t ulp_xxh64(const void *data, size_t len);
/* XXH3-64 with a seed (the same values as XXH3_64bits_withSeed). */
uint64_t ulp_xxh64_seed(const void *data, size_t len, uint64_t seed);

/* io.c: all n bytes at off (short transfers continued, EINTR retried):
 * 0, or the errno (EIO where a write wrote nothing or a read met the end). */
int ulp_pwrite_full(int fd, const void *buf, size_t n, uint64_t off);
int ulp_pread_full(int fd, void *buf, size_t n, uint64_t off); /* ENODATA: the file ends before */
/* write(2) of all n bytes at the file's position (pipes too): 0 or errno */
int ulp_write_full(int fd, const void *buf, size_t n);
/* in copied whole into out from offset 0: 0 or errno (*failed_out: 1 where
 * the write failed, 0 the read) */
int ulp_copy_fd(int in, int out, int *failed_out);
/* A directory fsynced (of path: its parent): 0 or errno. */
int ulp_fsync_dir(const char *dir);
int ulp_fsync_parent(const char *path);
/* path replaced by n bytes of data whole, through path.tmp-<proc tag> and a
 * rename; durable: the file and its directory fsynced. 0 or errno. */
int ulp_replace_file(const char *path, const void *data, size_t n, int durable);
/* proc.c: "<pid>-<host>", this process's part of the names of the files it
 * makes in a directory other hosts may share (temporaries, staged files) */
#define ULP_PROC_TAG_MAX 96
void ulp_proc_tag(char *out, size_t cap);
/* clock.c: monotonic and wall clocks; the absolute CLOCK_REALTIME deadline
 * ms from now, for pthread_cond_timedwait */
int64_t ulp_mono_ns(void);
int64_t ulp_mono_ms(void);
int64_t ulp_wall_ms(void);
struct timespec;
void ulp_deadline_ms(struct timespec *ts, int64_t ms);
void ulp_proc_tag_test_host(const char *host); /* tests: this process as another host (NULL: itself) */
/* the content digest's parts (hash.c, ulpack-format(5) 2.4): leaves of
 * [p, p + len) where p is at a leaf boundary of its content, into
 * leaves[32 * i]; the number of leaves of a content; the digest from all
 * of its leaves */
void ulp_digest_leaves(const uint8_t *p, size_t len, uint8_t *leaves);
size_t ulp_digest_n_leaves(uint64_t len);
void ulp_digest_root(const uint8_t *leaves, uint64_t len, uint8_t out[ULP_SHA256_LEN]);

/* CPU dispatch state (cpu.c). */
extern unsigned ulp_cpu_mask_active;
/* The CPU paths in use (ULP_CPU_*): the features, probed once, that
 * ulp_set_cpu_mask allows now. The codec's row (ulp_kernels_get) and the
 * dynamics' scan (diff.c) choose by it. */
unsigned ulp_cpu_paths(void);

/* Bytes of memory an open blob holds (its decode tables and chunk
 * directory; the blob's own bytes are the caller's), for cache accounting. */
size_t ulp_blob_footprint(const ulp_blob *b);

/* Byte grouping: plane j of the output holds byte j of every element. */
void ulp_byte_group(uint8_t *dst, const uint8_t *src, size_t n_elems, unsigned esize);
void ulp_byte_ungroup(uint8_t *dst, const uint8_t *src, size_t n_elems, unsigned esize);

#endif
