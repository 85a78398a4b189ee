/* SPDX-License-Identifier: MIT */
/*
 * err.c - error codes, their text and errno mapping; the error sink; and an
 * object's messages, one per thread (ulp_msgs: the archive's, which every
 * floor of the library writes through ulp_arch_err).
 *
 * ulp_msgs invariants: a thread's message buffer is reached through the
 * key by that thread only; the list of all buffers is guarded by mu and is
 * only for the free at the object's end (the key deleted first, so no
 * destructor runs after).
 */
#include "ulp_int.h"
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *const messages[ULP_E__COUNT] = {
	[ULP_OK] = "success",
	[ULP_E_NOMEM] = "out of memory",
	[ULP_E_IO] = "input/output error",
	[ULP_E_NOSPC] = "no space left on device",
	[ULP_E_CORRUPT] = "corrupt or malformed data",
	[ULP_E_CHECKSUM] = "checksum mismatch",
	[ULP_E_VERSION] = "unsupported format version",
	[ULP_E_INVAL] = "invalid argument",
	[ULP_E_NOENT] = "no such file or object",
	[ULP_E_EXIST] = "already exists",
	[ULP_E_BUSY] = "resource busy",
	[ULP_E_OVERFLOW] = "output buffer too small",
	[ULP_E_UNSUPPORTED] = "not supported",
	[ULP_E_NAMETOOLONG] = "file name or path too long",
	[ULP_E_NOTEMPTY] = "directory not empty",
	[ULP_E_NOTDIR] = "not a directory",
	[ULP_E_ISDIR] = "is a directory",
	[ULP_E_FENCED] = "another writer took the archive over (lease lost)",
	[ULP_E_INTR] = "interrupted",
};

const char *ulp_strerror(int rc)
{
	if (rc < 0)
		rc = -rc;
	if (rc >= ULP_E__COUNT)
		return "unknown error";
	return messages[rc];
}

int ulp_to_errno(int rc)
{
	static const int map[ULP_E__COUNT] = {
		[ULP_OK] = 0, [ULP_E_NOMEM] = ENOMEM, [ULP_E_IO] = EIO,
		[ULP_E_NOSPC] = ENOSPC, [ULP_E_CORRUPT] = EIO, [ULP_E_CHECKSUM] = EIO,
		[ULP_E_VERSION] = EPROTO, [ULP_E_INVAL] = EINVAL, [ULP_E_NOENT] = ENOENT,
		[ULP_E_EXIST] = EEXIST, [ULP_E_BUSY] = EBUSY, [ULP_E_OVERFLOW] = EOVERFLOW,
		[ULP_E_UNSUPPORTED] = EOPNOTSUPP, [ULP_E_NAMETOOLONG] = ENAMETOOLONG,
		[ULP_E_NOTEMPTY] = ENOTEMPTY,
		[ULP_E_NOTDIR] = ENOTDIR, [ULP_E_ISDIR] = EISDIR, [ULP_E_FENCED] = EROFS,
		[ULP_E_INTR] = EINTR,
	};
	if (rc < 0)
		rc = -rc;
	return rc < ULP_E__COUNT ? map[rc] : EIO;
}

/* ulp_set_interrupt: the calling thread's check (ulp_int.h) */
static __thread int (*intr_check)(void *arg);
static __thread void *intr_arg;

void ulp_set_interrupt(int (*check)(void *arg), void *arg)
{
	intr_check = check;
	intr_arg = arg;
}

void ulp_interrupt_get(ulp_intr *out)
{
	out->check = intr_check;
	out->arg = intr_arg;
}

int ulp_interrupted(void)
{
	return intr_check && intr_check(intr_arg);
}

int ulp_err_set(ulp_err *e, int code, const char *file, int line, const char *fmt, ...)
{
	if (e && e->buf && e->cap) {
		va_list ap;
		int n;
		va_start(ap, fmt);
		n = vsnprintf(e->buf, e->cap, fmt, ap);
		va_end(ap);
		const char *dbg = getenv("ULP_DEBUG"); /* the source location, for developers */
		if (n >= 0 && (size_t)n < e->cap && dbg && *dbg && strcmp(dbg, "0") != 0) {
			const char *base = strrchr(file, '/');
			snprintf(e->buf + n, e->cap - (size_t)n, " [%s:%d]", base ? base + 1 : file, line);
		}
	}
	return code;
}

/* the length of byte c in ulp_quote's text */
static size_t quoted_len(unsigned char c)
{
	return c == '\\' || c == '\n' || c == '\r' || c == '\t' ? 2 : c >= 0x20 && c < 0x7f ? 1 : 4;
}

const char *ulp_quote(char *out, size_t cap, const void *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = s;
	size_t o = 0, need = 0;
	if (!cap)
		return out;
	for (size_t i = 0; i < n && need < cap; i++)
		need += quoted_len(p[i]);
	int cut = need >= cap; /* then room is kept for the "..." */
	for (size_t i = 0; i < n; i++) {
		unsigned char c = p[i];
		size_t k = quoted_len(c);
		if (cut && o + k + 3 > cap - 1) {
			for (int d = 0; d < 3 && o + 1 < cap; d++)
				out[o++] = '.';
			break;
		}
		if (k == 1) {
			out[o] = (char)c;
		} else {
			out[o] = '\\';
			out[o + 1] = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\\' ? '\\' : 'x';
			if (k == 4) {
				out[o + 2] = hex[c >> 4];
				out[o + 3] = hex[c & 15];
			}
		}
		o += k;
	}
	out[o] = 0;
	return out;
}

int ulp_parse_size(const char *s, uint64_t *out)
{
	char *end;
	double v = strtod(s, &end);
	uint64_t m = 1;
	switch (*end) {
	case 'k': case 'K': m = 1ull << 10; end++; break;
	case 'm': case 'M': m = 1ull << 20; end++; break;
	case 'g': case 'G': m = 1ull << 30; end++; break;
	case 't': case 'T': m = 1ull << 40; end++; break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (end == s || *end || !(v > 0) || v * (double)m >= 18e18)
		return -ULP_E_INVAL;
	*out = (uint64_t)(v * (double)m);
	return 0;
}

int64_t ulp_time_ns(int64_t sec, int64_t nsec)
{
	const int64_t g = 1000000000;
	/* normalise nsec into [0, g) first, then check sec against the range
	 * without overflowing: INT64_MIN / g rounds toward zero */
	sec += nsec / g;
	nsec %= g;
	if (nsec < 0) {
		nsec += g;
		sec--;
	}
	if (sec > INT64_MAX / g || (sec == INT64_MAX / g && nsec > INT64_MAX % g))
		return INT64_MAX;
	if (sec < INT64_MIN / g - 1 || (sec == INT64_MIN / g - 1 && nsec < g + INT64_MIN % g))
		return INT64_MIN;
	/* sec * g may be just below INT64_MIN when sec == INT64_MIN / g - 1:
	 * add nsec first then */
	if (sec == INT64_MIN / g - 1)
		return (sec + 1) * g - (g - nsec);
	return sec * g + nsec;
}

void ulp_time_split(int64_t ns, int64_t *sec, long *nsec)
{
	int64_t s = ns / 1000000000, r = ns % 1000000000;
	if (r < 0) { /* C division truncates toward zero: floor it */
		r += 1000000000;
		s--;
	}
	*sec = s;
	*nsec = (long)r;
}

ulp_time ulp_time_make(int64_t sec, int64_t nsec)
{
	const int64_t g = 1000000000;
	int64_t carry = nsec / g, r = nsec % g;
	if (r < 0) { /* floor, as ulp_time_split */
		r += g;
		carry--;
	}
	/* carry is within (-1e10, 1e10): only sec + carry can overflow */
	if (carry > 0 && sec > INT64_MAX - carry)
		return (ulp_time){INT64_MAX, (uint32_t)(g - 1)};
	if (carry < 0 && sec < INT64_MIN - carry)
		return (ulp_time){INT64_MIN, 0};
	return (ulp_time){sec + carry, (uint32_t)r};
}

ulp_time ulp_time_from_ns(int64_t ns)
{
	int64_t sec;
	long nsec;
	ulp_time_split(ns, &sec, &nsec);
	return (ulp_time){sec, (uint32_t)nsec};
}

ulp_time ulp_time_now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return ulp_time_make(t.tv_sec, t.tv_nsec);
}

int ulp_parse_int(const char *s, int64_t min, int64_t max, int64_t *out)
{
	int neg = *s == '-';
	const char *p = s + neg;
	uint64_t v = 0; /* magnitude; stays <= 2^63 (the magnitude of INT64_MIN) */
	if (!*p)
		return -ULP_E_INVAL;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return -ULP_E_INVAL;
		unsigned d = (unsigned)(*p - '0');
		if (v > ((1ull << 63) - d) / 10)
			return -ULP_E_OVERFLOW;
		v = v * 10 + d;
	}
	if (!neg && v > (uint64_t)INT64_MAX)
		return -ULP_E_OVERFLOW;
	int64_t x = neg ? (v == 1ull << 63 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
	if (x < min || x > max)
		return -ULP_E_OVERFLOW;
	*out = x;
	return 0;
}

int ulp_grow(void *arr, size_t *cap, size_t n, size_t size)
{
	void **pp = arr;
	if (n < *cap)
		return 0;
	size_t nc = *cap ? *cap * 2 : 16;
	void *np = realloc(*pp, nc * size);
	if (!np)
		return -ULP_E_NOMEM;
	*pp = np;
	*cap = nc;
	return 0;
}

int ulp_errno_code(int e)
{
	return e == ENOSPC || e == EDQUOT ? -ULP_E_NOSPC : e == ENOMEM ? -ULP_E_NOMEM : -ULP_E_IO;
}

typedef struct msgbuf {
	struct ulp_msgs *m;   /* set at creation, read-only after */
	struct msgbuf *next;  /* guarded by m->mu */
	char text[1024];      /* the thread's own */
} msgbuf;

struct ulp_msgs {
	pthread_key_t key;    /* set at creation, read-only after: each thread's msgbuf */
	pthread_mutex_t mu;
	msgbuf *all;          /* guarded by mu */
};

/* Key destructor: a thread that ends takes its message with it. */
static void msgbuf_exit(void *p)
{
	msgbuf *b = p;
	pthread_mutex_lock(&b->m->mu);
	for (msgbuf **pp = &b->m->all; *pp; pp = &(*pp)->next)
		if (*pp == b) {
			*pp = b->next;
			break;
		}
	pthread_mutex_unlock(&b->m->mu);
	free(b);
}

int ulp_msgs_new(ulp_msgs **out)
{
	ulp_msgs *m = calloc(1, sizeof(*m));
	if (!m)
		return -ULP_E_NOMEM;
	if (pthread_key_create(&m->key, msgbuf_exit) != 0) {
		free(m);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_init(&m->mu, NULL);
	*out = m;
	return 0;
}

void ulp_msgs_free(ulp_msgs *m)
{
	if (!m)
		return;
	pthread_key_delete(m->key); /* no destructor runs after this */
	for (msgbuf *b = m->all; b;) {
		msgbuf *n = b->next;
		free(b);
		b = n;
	}
	pthread_mutex_destroy(&m->mu);
	free(m);
}

static msgbuf *own(ulp_msgs *m)
{
	msgbuf *b = pthread_getspecific(m->key);
	if (!b && (b = calloc(1, sizeof(*b)))) {
		b->m = m;
		pthread_setspecific(m->key, b);
		pthread_mutex_lock(&m->mu);
		b->next = m->all;
		m->all = b;
		pthread_mutex_unlock(&m->mu);
	}
	return b;
}

int ulp_msgs_set(ulp_msgs *m, int code, const char *file, int line, const char *fmt, ...)
{
	msgbuf *b = m ? own(m) : NULL;
	if (b) {
		ulp_err e = {b->text, sizeof(b->text)};
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(e.buf, e.cap, fmt, ap);
		va_end(ap);
		const char *dbg = getenv("ULP_DEBUG"); /* the source location, for developers */
		if (n >= 0 && (size_t)n < e.cap && dbg && *dbg && strcmp(dbg, "0") != 0) {
			const char *base = strrchr(file, '/');
			snprintf(e.buf + n, e.cap - (size_t)n, " [%s:%d]", base ? base + 1 : file, line);
		}
	}
	return code;
}

int ulp_msgs_errno(ulp_msgs *m, int e, const char *file, int line, const char *path, const char *what)
{
	return ulp_msgs_set(m, ulp_errno_code(e), file, line, "%s: %s: %s", path, what, strerror(e));
}

const char *ulp_msgs_get(ulp_msgs *m)
{
	msgbuf *b = m ? pthread_getspecific(m->key) : NULL;
	return b && b->text[0] ? b->text : "no error";
}
