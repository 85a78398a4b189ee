/* SPDX-License-Identifier: MIT */
/*
 * s3mock.c - an in-process S3 emulator for unit tests (s3mock.h): an
 * accept thread, a thread per connection reading HTTP/1.1 requests one
 * after another (keep-alive), buckets and objects in memory.
 *
 * Invariants:
 *  1. All mutable state of the mock (buckets, objects, uploads, faults,
 *     counters, the connection list, blob reference counts) is guarded by
 *     m->lock; the endpoint and the listener's fd are set before any thread
 *     starts and read-only after.
 *  2. A blob's bytes never change once it is reachable from the store: a
 *     GET takes a reference under the lock and sends outside it; a PUT
 *     replaces the blob, s3mock_corrupt makes a changed copy.
 *  3. A connection's fd is closed only by its own thread and only under the
 *     lock (fd then -1), so s3mock_stop's shutdown() under the lock never
 *     hits a reused descriptor.
 *  4. A request's whole body is read (after "100 Continue" when asked)
 *     before it is answered, so the connection can be kept; a request
 *     that cannot be read whole (a bad head, a body too large, a broken
 *     chunk) is answered, if at all, with Connection: close.
 *  5. Objects are kept sorted by the bytes of their keys (strcmp), the
 *     order ListObjectsV2 gives.
 */
#include "s3mock.h"
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HEAD_MAX (64u << 10)                /* a request's line and headers */
#define RD_CAP (HEAD_MAX + (64u << 10))     /* a connection's read buffer */
#define BODY_MAX ((uint64_t)4 << 30)        /* a request's body */
#define PART_MIN ((size_t)5 << 20)          /* S3's least part but the last */
#define PARTS_MAX 10000
#define KEY_MAX 1024
#define LIST_MAX 1000
#define NPARAM 32
#define ETAG_CAP 48 /* "32 hex digits-NNNNN" and the quotes */

/* ---- the store ------------------------------------------------------------ */
typedef struct blob {
	size_t refs; /* under m->lock */
	size_t len;
	unsigned char data[]; /* len bytes and a NUL */
} blob;

struct obj {
	char *key;
	blob *b;
	char etag[ETAG_CAP]; /* quoted */
	time_t mtime;
};

struct bucket {
	char *name;
	struct obj *objs; /* sorted by key (invariant 5) */
	size_t n, cap;
	struct bucket *next;
};

struct part {
	int num;
	blob *b;
	unsigned char md5[16];
};

struct upload {
	char id[40];
	char *bucket, *key;
	struct part *parts; /* in the order they came */
	size_t n, cap;
	struct upload *next;
};

struct conn {
	struct s3mock *m;
	int fd;   /* under m->lock: -1 once closed (invariant 3) */
	int done; /* under m->lock: the thread is about to return */
	pthread_t th;
	struct conn *next; /* under m->lock */
};

enum { K_PUT, K_GET, K_LIST, K_HEAD, K_DELETE, K_POST, K_OTHER, K_N };

struct s3mock {
	pthread_mutex_t lock;
	int lfd;           /* the listener (read-only after start) */
	char endpoint[40]; /* read-only after start */
	pthread_t accept_th;
	/* all below under lock */
	int stopping;
	struct conn *conns;
	struct bucket *buckets;
	struct upload *uploads;
	unsigned upload_seq;
	char *key_id;
	int fail_n, fail_status, drop_n;
	int hang; /* s3mock_hang */
	unsigned stall;
	unsigned long counts[K_N], total;
	unsigned long req_seq;
};

static blob *blob_new(size_t len)
{
	blob *b = malloc(sizeof(*b) + len + 1);
	if (!b)
		return NULL;
	b->refs = 1;
	b->len = len;
	b->data[len] = 0;
	return b;
}

/* under m->lock, or on a blob nobody else sees */
static void blob_unref(blob *b)
{
	if (b && --b->refs == 0)
		free(b);
}

static void blob_put(s3mock *m, blob *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&m->lock);
	blob_unref(b);
	pthread_mutex_unlock(&m->lock);
}

static struct bucket *bucket_find(s3mock *m, const char *name)
{
	for (struct bucket *b = m->buckets; b; b = b->next)
		if (strcmp(b->name, name) == 0)
			return b;
	return NULL;
}

static struct bucket *bucket_add(s3mock *m, const char *name)
{
	struct bucket *b = calloc(1, sizeof(*b));
	if (!b || !(b->name = strdup(name))) {
		free(b);
		return NULL;
	}
	b->next = m->buckets;
	m->buckets = b;
	return b;
}

/* the index of key in bk, or where it would go: 1 found, 0 not */
static int obj_find(const struct bucket *bk, const char *key, size_t *at)
{
	size_t lo = 0, hi = bk->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(bk->objs[mid].key, key);
		if (c == 0) {
			*at = mid;
			return 1;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*at = lo;
	return 0;
}

/* stores b (the reference passes to the store) as key: 0, or -1 (no memory:
 * the caller keeps b) */
static int obj_set(struct bucket *bk, const char *key, blob *b, const char *etag)
{
	size_t at;
	if (obj_find(bk, key, &at)) {
		struct obj *o = &bk->objs[at];
		blob_unref(o->b);
		o->b = b;
		snprintf(o->etag, sizeof(o->etag), "%s", etag);
		o->mtime = time(NULL);
		return 0;
	}
	if (bk->n == bk->cap) {
		size_t nc = bk->cap ? 2 * bk->cap : 16;
		struct obj *no = realloc(bk->objs, nc * sizeof(*no));
		if (!no)
			return -1;
		bk->objs = no;
		bk->cap = nc;
	}
	char *k = strdup(key);
	if (!k)
		return -1;
	memmove(&bk->objs[at + 1], &bk->objs[at], (bk->n - at) * sizeof(bk->objs[0]));
	bk->objs[at] = (struct obj){.key = k, .b = b, .mtime = time(NULL)};
	snprintf(bk->objs[at].etag, sizeof(bk->objs[at].etag), "%s", etag);
	bk->n++;
	return 0;
}

static void obj_del(struct bucket *bk, size_t at)
{
	free(bk->objs[at].key);
	blob_unref(bk->objs[at].b);
	memmove(&bk->objs[at], &bk->objs[at + 1], (bk->n - at - 1) * sizeof(bk->objs[0]));
	bk->n--;
}

static void upload_free(struct upload *u)
{
	for (size_t i = 0; i < u->n; i++)
		blob_unref(u->parts[i].b);
	free(u->parts);
	free(u->bucket);
	free(u->key);
	free(u);
}

static struct upload *upload_find(s3mock *m, const char *id, const char *bucket, const char *key)
{
	for (struct upload *u = m->uploads; u; u = u->next)
		if (strcmp(u->id, id) == 0 && strcmp(u->bucket, bucket) == 0 && strcmp(u->key, key) == 0)
			return u;
	return NULL;
}

static void upload_unlink(s3mock *m, struct upload *u)
{
	for (struct upload **pp = &m->uploads; *pp; pp = &(*pp)->next)
		if (*pp == u) {
			*pp = u->next;
			return;
		}
}

/* ---- small helpers ---------------------------------------------------------- */
static void hex(const unsigned char *d, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[d[i] >> 4];
		out[2 * i + 1] = digits[d[i] & 15];
	}
	out[2 * n] = 0;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static void md5(const void *p, size_t n, unsigned char out[16])
{
	unsigned dn = 16;
	if (!EVP_Digest(p, n, out, &dn, EVP_md5(), NULL))
		memset(out, 0, 16);
}

/* the ETag without W/ and quotes, into out */
static void etag_bare(const char *t, char *out, size_t cap)
{
	if (strncmp(t, "W/", 2) == 0)
		t += 2;
	size_t n = strlen(t);
	if (n >= 2 && t[0] == '"' && t[n - 1] == '"') {
		t++;
		n -= 2;
	}
	if (n >= cap)
		n = cap - 1;
	memcpy(out, t, n);
	out[n] = 0;
}

static int etag_eq(const char *a, const char *b)
{
	char x[256], y[256];
	etag_bare(a, x, sizeof(x));
	etag_bare(b, y, sizeof(y));
	return strcmp(x, y) == 0;
}

/* decodes %XX in place: 0, or -1 (a bad escape, or a NUL) */
static int pct_decode(char *s)
{
	char *o = s;
	for (; *s; s++) {
		if (*s == '%') {
			int h = hexval((unsigned char)s[1]), l = h < 0 ? -1 : hexval((unsigned char)s[2]);
			if (h < 0 || l < 0 || (h == 0 && l == 0))
				return -1;
			*o++ = (char)(h * 16 + l);
			s += 2;
		} else {
			*o++ = *s;
		}
	}
	*o = 0;
	return 0;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* a growable string */
typedef struct sbuf {
	char *p;
	size_t n, cap;
	int oom;
} sbuf;

static void sb_add(sbuf *s, const char *p, size_t n)
{
	if (s->oom)
		return;
	if (s->n + n + 1 > s->cap) {
		size_t nc = s->cap ? s->cap : 256;
		while (nc < s->n + n + 1)
			nc *= 2;
		char *np = realloc(s->p, nc);
		if (!np) {
			s->oom = 1;
			return;
		}
		s->p = np;
		s->cap = nc;
	}
	memcpy(s->p + s->n, p, n);
	s->n += n;
	s->p[s->n] = 0;
}

static void sb_printf(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *s, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (k < 0) {
		s->oom = 1;
		return;
	}
	if ((size_t)k < sizeof(small)) {
		sb_add(s, small, (size_t)k);
		return;
	}
	char *big = malloc((size_t)k + 1);
	if (!big) {
		s->oom = 1;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)k + 1, fmt, ap);
	va_end(ap);
	sb_add(s, big, (size_t)k);
	free(big);
}

/* text escaped for XML */
static void sb_xml(sbuf *s, const char *t)
{
	for (; *t; t++) {
		unsigned char c = (unsigned char)*t;
		switch (c) {
		case '&': sb_add(s, "&amp;", 5); break;
		case '<': sb_add(s, "&lt;", 4); break;
		case '>': sb_add(s, "&gt;", 4); break;
		case '"': sb_add(s, "&quot;", 6); break;
		case '\'': sb_add(s, "&apos;", 6); break;
		default:
			if (c < 0x20)
				sb_printf(s, "&#x%X;", c);
			else
				sb_add(s, t, 1);
		}
	}
}

static void http_date(time_t t, char *out, size_t cap)
{
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(out, cap, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

static void iso_date(time_t t, char *out, size_t cap)
{
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(out, cap, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
}

/* ---- a connection's reader ------------------------------------------------- */
struct rd {
	int fd;
	size_t a, b; /* unread bytes: buf[a, b) */
	char buf[RD_CAP];
};

/* more bytes into buf: >0, 0 at EOF, -1 on an error */
static ssize_t rd_more(struct rd *r)
{
	if (r->a == r->b)
		r->a = r->b = 0;
	if (r->b == sizeof(r->buf)) {
		memmove(r->buf, r->buf + r->a, r->b - r->a);
		r->b -= r->a;
		r->a = 0;
	}
	ssize_t got;
	do
		got = read(r->fd, r->buf + r->b, sizeof(r->buf) - r->b);
	while (got < 0 && errno == EINTR);
	if (got > 0)
		r->b += (size_t)got;
	return got;
}

/* a request's head (line, headers, the blank line) into a malloc'ed copy:
 * 1, 0 at a clean EOF, -1 on an error or a cut, -2 over HEAD_MAX */
static int rd_head(struct rd *r, char **out)
{
	for (;;) {
		while (r->b - r->a >= 2 && r->buf[r->a] == '\r' && r->buf[r->a + 1] == '\n')
			r->a += 2; /* blank lines between requests */
		char *end = memmem(r->buf + r->a, r->b - r->a, "\r\n\r\n", 4);
		if (end) {
			size_t n = (size_t)(end - (r->buf + r->a)) + 4;
			if (n > HEAD_MAX)
				return -2;
			char *h = malloc(n + 1);
			if (!h)
				return -1;
			memcpy(h, r->buf + r->a, n);
			h[n] = 0;
			r->a += n;
			*out = h;
			return 1;
		}
		if (r->b - r->a > HEAD_MAX)
			return -2;
		if (r->a > 0 && r->b == sizeof(r->buf)) {
			memmove(r->buf, r->buf + r->a, r->b - r->a);
			r->b -= r->a;
			r->a = 0;
		}
		ssize_t got = rd_more(r);
		if (got <= 0)
			return got == 0 && r->a == r->b ? 0 : -1;
	}
}

/* exactly n bytes into dst: the buffered ones, then straight from the socket */
static int rd_exact(struct rd *r, void *dst, size_t n)
{
	unsigned char *d = dst;
	size_t k = r->b - r->a < n ? r->b - r->a : n;
	memcpy(d, r->buf + r->a, k);
	r->a += k;
	while (k < n) {
		ssize_t got = read(r->fd, d + k, n - k);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return -1;
		k += (size_t)got;
	}
	return 0;
}

/* one CRLF-ended line (at most cap - 1 bytes) into out, CRLF dropped */
static int rd_line(struct rd *r, char *out, size_t cap)
{
	for (;;) {
		char *nl = memmem(r->buf + r->a, r->b - r->a, "\r\n", 2);
		if (nl) {
			size_t n = (size_t)(nl - (r->buf + r->a));
			if (n >= cap)
				return -1;
			memcpy(out, r->buf + r->a, n);
			out[n] = 0;
			r->a += n + 2;
			return 0;
		}
		if (r->b - r->a >= cap)
			return -1;
		if (rd_more(r) <= 0)
			return -1;
	}
}

static int send_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w;
		n -= (size_t)w;
	}
	return 0;
}

/* ---- requests and answers ------------------------------------------------- */
struct req {
	unsigned long id;
	char *head; /* malloc'ed, cut into the strings below */
	const char *method, *target;
	int http10, close, expect, chunked, kind;
	int64_t clen; /* -1: none */
	const char *auth, *sha, *range, *if_match, *if_none_match;
	char *path;   /* malloc'ed copy of the target, cut into bucket, key, query */
	char *bucket; /* decoded; "" for / */
	char *key;    /* decoded; NULL for the bucket itself */
	char *qname[NPARAM], *qval[NPARAM];
	int nq;
	blob *body; /* the request's body (NULL when none), this thread's */
};

struct resp {
	int status;
	sbuf hdr;  /* extra header lines, each with its CRLF */
	sbuf body; /* a small body (XML) */
	blob *b;   /* or these bytes of an object (a reference) */
	size_t boff, blen;
	int64_t head_len; /* >= 0: a HEAD's Content-Length */
	int close;
};

static const char *reason(int st)
{
	switch (st) {
	case 100: return "Continue";
	case 200: return "OK";
	case 204: return "No Content";
	case 206: return "Partial Content";
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 409: return "Conflict";
	case 411: return "Length Required";
	case 412: return "Precondition Failed";
	case 413: return "Payload Too Large";
	case 416: return "Range Not Satisfiable";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	default: return "Status";
	}
}

static const char *qget(const struct req *q, const char *name)
{
	for (int i = 0; i < q->nq; i++)
		if (strcmp(q->qname[i], name) == 0)
			return q->qval[i];
	return NULL;
}

static void err(struct resp *p, const struct req *q, int status, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));
static void err(struct resp *p, const struct req *q, int status, const char *code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	p->status = status;
	p->hdr.n = 0;
	p->body.n = 0;
	sb_printf(&p->hdr, "Content-Type: application/xml\r\n");
	sb_printf(&p->body, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>", code);
	sb_xml(&p->body, msg);
	sb_add(&p->body, "</Message><Resource>/", 21);
	sb_xml(&p->body, q->bucket ? q->bucket : "");
	if (q->key) {
		sb_add(&p->body, "/", 1);
		sb_xml(&p->body, q->key);
	}
	sb_printf(&p->body, "</Resource><RequestId>s3mock-%lu</RequestId></Error>", q->id);
}

static int hdr_is(const char *name, const char *want) { return strcasecmp(name, want) == 0; }

/* the request line and headers: 0, or -1 (malformed) */
static int parse_head(struct req *q)
{
	char *s = q->head, *eol = strstr(s, "\r\n");
	q->clen = -1;
	*eol = 0;
	char *sp1 = strchr(s, ' ');
	if (!sp1)
		return -1;
	*sp1 = 0;
	char *sp2 = strchr(sp1 + 1, ' ');
	if (!sp2)
		return -1;
	*sp2 = 0;
	q->method = s;
	q->target = sp1 + 1;
	if (strcmp(sp2 + 1, "HTTP/1.0") == 0)
		q->http10 = 1;
	else if (strcmp(sp2 + 1, "HTTP/1.1") != 0)
		return -1;
	for (char *l = eol + 2; *l;) {
		char *e = strstr(l, "\r\n");
		if (!e || e == l)
			break;
		*e = 0;
		char *c = strchr(l, ':');
		if (!c || c == l)
			return -1;
		*c = 0;
		char *v = c + 1, *ve = e;
		while (*v == ' ' || *v == '\t')
			v++;
		while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
			*--ve = 0;
		if (hdr_is(l, "content-length")) {
			int64_t n = 0;
			if (!*v || strlen(v) > 18)
				return -1;
			for (const char *d = v; *d; d++) {
				if (!isdigit((unsigned char)*d))
					return -1;
				n = n * 10 + (*d - '0');
			}
			if (q->clen >= 0 && q->clen != n)
				return -1;
			q->clen = n;
		} else if (hdr_is(l, "transfer-encoding")) {
			if (strcasecmp(v, "chunked") != 0)
				return -1;
			q->chunked = 1;
		} else if (hdr_is(l, "expect")) {
			q->expect = strcasecmp(v, "100-continue") == 0;
		} else if (hdr_is(l, "connection")) {
			q->close = strcasestr(v, "close") != NULL;
		} else if (hdr_is(l, "authorization")) {
			q->auth = v;
		} else if (hdr_is(l, "x-amz-content-sha256")) {
			q->sha = v;
		} else if (hdr_is(l, "range")) {
			q->range = v;
		} else if (hdr_is(l, "if-match")) {
			q->if_match = v;
		} else if (hdr_is(l, "if-none-match")) {
			q->if_none_match = v;
		}
		l = e + 2;
	}
	if (q->chunked && q->clen >= 0)
		return -1;
	/* the target: /BUCKET[/KEY][?QUERY] */
	if (q->target[0] != '/' || !(q->path = strdup(q->target)))
		return -1;
	char *qs = strchr(q->path, '?');
	if (qs)
		*qs++ = 0;
	q->bucket = q->path + 1;
	char *slash = strchr(q->bucket, '/');
	if (slash) {
		*slash = 0;
		if (slash[1])
			q->key = slash + 1;
	}
	if (pct_decode(q->bucket) < 0 || (q->key && pct_decode(q->key) < 0))
		return -1;
	for (char *t = qs; t && *t;) {
		char *amp = strchr(t, '&');
		if (amp)
			*amp = 0;
		if (*t) {
			if (q->nq == NPARAM)
				return -1;
			char *eq = strchr(t, '=');
			if (eq)
				*eq = 0;
			q->qname[q->nq] = t;
			q->qval[q->nq] = eq ? eq + 1 : t + strlen(t);
			if (pct_decode(q->qname[q->nq]) < 0 || pct_decode(q->qval[q->nq]) < 0)
				return -1;
			q->nq++;
		}
		t = amp ? amp + 1 : NULL;
	}
	if (strcmp(q->method, "PUT") == 0)
		q->kind = K_PUT;
	else if (strcmp(q->method, "GET") == 0)
		q->kind = q->key ? K_GET : K_LIST;
	else if (strcmp(q->method, "HEAD") == 0)
		q->kind = K_HEAD;
	else if (strcmp(q->method, "DELETE") == 0)
		q->kind = K_DELETE;
	else if (strcmp(q->method, "POST") == 0)
		q->kind = K_POST;
	else
		q->kind = K_OTHER;
	return 0;
}

/* the body (invariant 4): 0, or -1 with p set to an answer that closes (or
 * p->status 0: close without one) */
static int read_body(struct rd *r, struct req *q, struct resp *p)
{
	if (q->clen < 0 && !q->chunked)
		return 0;
	if (q->clen > (int64_t)BODY_MAX) {
		err(p, q, 413, "EntityTooLarge", "a body of %lld bytes is over the mock's limit", (long long)q->clen);
		p->close = 1;
		return -1;
	}
	if (q->expect && q->clen != 0 && send_all(r->fd, "HTTP/1.1 100 Continue\r\n\r\n", 25) < 0)
		return -1;
	if (!q->chunked) {
		if (!(q->body = blob_new((size_t)q->clen))) {
			err(p, q, 500, "InternalError", "out of memory for a body of %lld bytes", (long long)q->clen);
			p->close = 1;
			return -1;
		}
		return rd_exact(r, q->body->data, (size_t)q->clen);
	}
	size_t len = 0;
	char line[1024];
	if (!(q->body = blob_new(0)))
		return -1;
	for (;;) {
		if (rd_line(r, line, sizeof(line)) < 0)
			return -1;
		uint64_t n = 0;
		const char *c = line;
		if (!isxdigit((unsigned char)*c))
			goto bad;
		for (; isxdigit((unsigned char)*c); c++) {
			n = n * 16 + (uint64_t)hexval((unsigned char)*c);
			if (n > BODY_MAX)
				goto bad;
		}
		if (*c && *c != ';' && *c != ' ')
			goto bad;
		if (n == 0)
			break;
		if (len + n > BODY_MAX)
			goto bad;
		blob *nb = realloc(q->body, sizeof(*nb) + len + n + 1);
		if (!nb)
			goto bad;
		q->body = nb;
		if (rd_exact(r, nb->data + len, (size_t)n) < 0)
			return -1;
		len += (size_t)n;
		nb->len = len;
		nb->data[len] = 0;
		if (rd_line(r, line, sizeof(line)) < 0 || line[0])
			goto bad;
	}
	do /* trailers, up to the blank line */
		if (rd_line(r, line, sizeof(line)) < 0)
			return -1;
	while (line[0]);
	return 0;
bad:
	err(p, q, 400, "IncompleteBody", "a malformed chunked body");
	p->close = 1;
	return -1;
}

/* Authorization and x-amz-content-sha256: 0, or -1 with p set */
static int check_auth(s3mock *m, const struct req *q, struct resp *p)
{
	static const char scheme[] = "AWS4-HMAC-SHA256 ";
	if (!q->auth || strncmp(q->auth, scheme, sizeof(scheme) - 1) != 0) {
		err(p, q, 403, "AccessDenied", "no AWS4-HMAC-SHA256 Authorization header");
		return -1;
	}
	const char *cred = strstr(q->auth, "Credential=");
	const char *id = cred ? cred + 11 : NULL, *slash = id ? strchr(id, '/') : NULL;
	if (!slash) {
		err(p, q, 400, "AuthorizationHeaderMalformed", "no Credential=KEYID/... in the Authorization header");
		return -1;
	}
	pthread_mutex_lock(&m->lock);
	int ok = strlen(m->key_id) == (size_t)(slash - id) && strncmp(m->key_id, id, (size_t)(slash - id)) == 0;
	pthread_mutex_unlock(&m->lock);
	if (!ok) {
		err(p, q, 403, "InvalidAccessKeyId", "The AWS Access Key Id '%.*s' does not exist in our records.",
		    (int)(slash - id < 64 ? slash - id : 64), id);
		return -1;
	}
	if (!q->sha) {
		err(p, q, 403, "AccessDenied", "no x-amz-content-sha256 header");
		return -1;
	}
	if (strcmp(q->sha, "UNSIGNED-PAYLOAD") == 0)
		return 0;
	if (strncmp(q->sha, "STREAMING-", 10) == 0) {
		err(p, q, 400, "NotImplemented", "streaming (chunk-signed) uploads are not served by the mock");
		return -1;
	}
	unsigned char d[32];
	unsigned dn = sizeof(d);
	char want[65];
	if (!EVP_Digest(q->body ? q->body->data : (const unsigned char *)"", q->body ? q->body->len : 0, d, &dn,
	                EVP_sha256(), NULL)) {
		err(p, q, 500, "InternalError", "SHA-256 failed");
		return -1;
	}
	hex(d, 32, want);
	if (strcasecmp(q->sha, want) != 0) {
		err(p, q, 400, "XAmzContentSHA256Mismatch",
		    "The provided 'x-amz-content-sha256' header does not match what was computed.");
		return -1;
	}
	return 0;
}

static int bucket_name_ok(const char *b)
{
	size_t n = strlen(b);
	if (n < 3 || n > 63)
		return 0;
	for (; *b; b++)
		if (!islower((unsigned char)*b) && !isdigit((unsigned char)*b) && *b != '.' && *b != '-')
			return 0;
	return 1;
}

/* ---- the operations (m->lock taken inside) --------------------------------- */
static void list_objects(s3mock *m, const struct req *q, struct resp *p)
{
	const char *lt = qget(q, "list-type"), *prefix = qget(q, "prefix"), *mk = qget(q, "max-keys");
	const char *tok = qget(q, "continuation-token"), *after = qget(q, "start-after");
	if (!lt || strcmp(lt, "2") != 0) {
		err(p, q, 400, "InvalidArgument", "only ListObjectsV2 (list-type=2) is served by the mock");
		return;
	}
	if (qget(q, "delimiter") || qget(q, "encoding-type")) {
		err(p, q, 400, "InvalidArgument", "delimiter and encoding-type are not served by the mock");
		return;
	}
	if (!prefix)
		prefix = "";
	unsigned long max = LIST_MAX;
	if (mk) {
		char *end;
		errno = 0;
		max = strtoul(mk, &end, 10);
		if (!*mk || *end || errno || mk[0] == '-') {
			err(p, q, 400, "InvalidArgument", "max-keys '%.40s' is not a number", mk);
			return;
		}
		if (max > LIST_MAX)
			max = LIST_MAX;
	}
	/* the token: the hex of the last key given */
	char *from = NULL;
	if (tok) {
		size_t tl = strlen(tok);
		if (!tl || tl % 2 || tl / 2 > KEY_MAX || !(from = malloc(tl / 2 + 1))) {
			err(p, q, 400, "InvalidArgument", "The continuation token provided is incorrect");
			return;
		}
		for (size_t i = 0; i < tl / 2; i++) {
			int h = hexval((unsigned char)tok[2 * i]), l = hexval((unsigned char)tok[2 * i + 1]);
			if (h < 0 || l < 0 || (h == 0 && l == 0)) {
				free(from);
				err(p, q, 400, "InvalidArgument", "The continuation token provided is incorrect");
				return;
			}
			from[i] = (char)(h * 16 + l);
		}
		from[tl / 2] = 0;
	}
	const char *start = from ? from : after;
	size_t plen = strlen(prefix);
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, q->bucket);
	if (!bk) {
		pthread_mutex_unlock(&m->lock);
		free(from);
		err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
		return;
	}
	size_t i;
	if (start && strcmp(start, prefix) >= 0) {
		if (obj_find(bk, start, &i))
			i++; /* after it */
	} else {
		obj_find(bk, prefix, &i);
	}
	sbuf *x = &p->body;
	sbuf items = {0};
	unsigned long n = 0;
	const char *last = NULL;
	int truncated = 0;
	for (; i < bk->n && strncmp(bk->objs[i].key, prefix, plen) == 0; i++) {
		if (n == max) {
			truncated = max > 0;
			break;
		}
		char date[40];
		const struct obj *o = &bk->objs[i];
		iso_date(o->mtime, date, sizeof(date));
		sb_add(&items, "<Contents><Key>", 15);
		sb_xml(&items, o->key);
		sb_printf(&items, "</Key><LastModified>%s</LastModified><ETag>", date);
		sb_xml(&items, o->etag);
		sb_printf(&items, "</ETag><Size>%zu</Size><StorageClass>STANDARD</StorageClass></Contents>", o->b->len);
		last = o->key;
		n++;
	}
	sb_printf(x, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	             "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>");
	sb_xml(x, q->bucket);
	sb_add(x, "</Name><Prefix>", 15);
	sb_xml(x, prefix);
	sb_printf(x, "</Prefix><KeyCount>%lu</KeyCount><MaxKeys>%lu</MaxKeys><IsTruncated>%s</IsTruncated>", n, max,
	          truncated ? "true" : "false");
	if (tok) {
		sb_add(x, "<ContinuationToken>", 19);
		sb_xml(x, tok);
		sb_add(x, "</ContinuationToken>", 20);
	}
	if (after) {
		sb_add(x, "<StartAfter>", 12);
		sb_xml(x, after);
		sb_add(x, "</StartAfter>", 13);
	}
	if (items.p)
		sb_add(x, items.p, items.n);
	x->oom |= items.oom;
	if (truncated) {
		size_t kl = strlen(last);
		char *t = malloc(2 * kl + 1);
		if (t) {
			hex((const unsigned char *)last, kl, t);
			sb_printf(x, "<NextContinuationToken>%s</NextContinuationToken>", t);
			free(t);
		} else {
			x->oom = 1;
		}
	}
	pthread_mutex_unlock(&m->lock);
	sb_add(x, "</ListBucketResult>", 19);
	free(items.p);
	free(from);
	p->status = 200;
	sb_printf(&p->hdr, "Content-Type: application/xml\r\n");
}

static void bucket_op(s3mock *m, struct req *q, struct resp *p)
{
	if (q->kind == K_LIST) {
		list_objects(m, q, p);
		return;
	}
	if (!q->bucket[0]) {
		err(p, q, 400, "InvalidRequest", "ListBuckets is not served by the mock");
		return;
	}
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, q->bucket);
	switch (q->kind) {
	case K_PUT:
		if (bk)
			err(p, q, 409, "BucketAlreadyOwnedByYou",
			    "Your previous request to create the named bucket succeeded and you already own it.");
		else if (!bucket_name_ok(q->bucket))
			err(p, q, 400, "InvalidBucketName", "The specified bucket is not valid.");
		else if (!bucket_add(m, q->bucket))
			err(p, q, 500, "InternalError", "out of memory");
		else {
			p->status = 200;
			sb_printf(&p->hdr, "Location: /%s\r\n", q->bucket);
		}
		break;
	case K_HEAD:
		if (bk)
			p->status = 200;
		else
			err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
		break;
	case K_DELETE:
		if (!bk) {
			err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
		} else if (bk->n) {
			err(p, q, 409, "BucketNotEmpty", "The bucket you tried to delete is not empty");
		} else {
			for (struct bucket **pp = &m->buckets; *pp; pp = &(*pp)->next)
				if (*pp == bk) {
					*pp = bk->next;
					break;
				}
			free(bk->objs);
			free(bk->name);
			free(bk);
			p->status = 204;
		}
		break;
	default:
		err(p, q, 405, "MethodNotAllowed", "The specified method is not allowed against this resource.");
	}
	pthread_mutex_unlock(&m->lock);
}

static void put_object(s3mock *m, struct req *q, struct resp *p)
{
	blob *b = q->body ? q->body : blob_new(0);
	unsigned char d[16];
	char etag[ETAG_CAP];
	if (!b) {
		err(p, q, 500, "InternalError", "out of memory");
		return;
	}
	q->body = b;
	md5(b->data, b->len, d);
	etag[0] = '"';
	hex(d, 16, etag + 1);
	strcat(etag, "\"");
	if (q->if_none_match && strcmp(q->if_none_match, "*") != 0) {
		err(p, q, 501, "NotImplemented", "If-None-Match other than '*' is not served");
		return;
	}
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, q->bucket);
	size_t at;
	int exists = bk && obj_find(bk, q->key, &at);
	if (!bk)
		err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
	else if (q->if_none_match && exists)
		err(p, q, 412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold");
	else if (q->if_match && !(exists && (strcmp(q->if_match, "*") == 0 || etag_eq(q->if_match, bk->objs[at].etag))))
		err(p, q, 412, "PreconditionFailed", "At least one of the pre-conditions you specified did not hold");
	else if (obj_set(bk, q->key, b, etag) < 0)
		err(p, q, 500, "InternalError", "out of memory");
	else {
		q->body = NULL; /* the store's now */
		p->status = 200;
		sb_printf(&p->hdr, "ETag: %s\r\n", etag);
	}
	pthread_mutex_unlock(&m->lock);
}

/* Range: bytes=A-B | A- | -N against size: 0 whole, 1 [*a, *e], -1 unsatisfiable */
static int parse_range(const char *r, size_t size, size_t *a, size_t *e)
{
	unsigned long long x = 0, y = 0;
	int hx = 0, hy = 0;
	if (!r || strncasecmp(r, "bytes=", 6) != 0 || strchr(r, ','))
		return 0; /* none, or several: the whole object */
	const char *c = r + 6;
	for (; isdigit((unsigned char)*c); c++, hx = 1)
		x = x * 10 + (unsigned)(*c - '0');
	if (*c++ != '-')
		return 0;
	for (; isdigit((unsigned char)*c); c++, hy = 1)
		y = y * 10 + (unsigned)(*c - '0');
	if (*c || (!hx && !hy))
		return 0;
	if (!hx) { /* the last y bytes */
		if (y == 0 || size == 0)
			return -1;
		*a = y >= size ? 0 : size - (size_t)y;
		*e = size - 1;
		return 1;
	}
	if (hy && y < x)
		return 0; /* invalid: ignored, as HTTP says */
	if (x >= size)
		return -1;
	*a = (size_t)x;
	*e = !hy || y >= size ? size - 1 : (size_t)y;
	return 1;
}

static void get_object(s3mock *m, struct req *q, struct resp *p)
{
	char etag[ETAG_CAP], date[64];
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, q->bucket);
	size_t at;
	blob *b = NULL;
	time_t mt = 0;
	if (!bk) {
		err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
	} else if (!obj_find(bk, q->key, &at)) {
		err(p, q, 404, "NoSuchKey", "The specified key does not exist.");
	} else {
		b = bk->objs[at].b;
		b->refs++;
		snprintf(etag, sizeof(etag), "%s", bk->objs[at].etag);
		mt = bk->objs[at].mtime;
	}
	pthread_mutex_unlock(&m->lock);
	if (!b)
		return;
	http_date(mt, date, sizeof(date));
	if (q->kind == K_HEAD) {
		p->status = 200;
		p->head_len = (int64_t)b->len;
		sb_printf(&p->hdr, "ETag: %s\r\nLast-Modified: %s\r\nAccept-Ranges: bytes\r\n"
		                   "Content-Type: application/octet-stream\r\n", etag, date);
		blob_put(m, b);
		return;
	}
	size_t a = 0, e = 0;
	int rc = parse_range(q->range, b->len, &a, &e);
	if (rc < 0) {
		err(p, q, 416, "InvalidRange", "The requested range is not satisfiable");
		sb_printf(&p->hdr, "Content-Range: bytes */%zu\r\n", b->len);
		blob_put(m, b);
		return;
	}
	p->b = b;
	if (rc == 0) {
		p->status = 200;
		p->boff = 0;
		p->blen = b->len;
	} else {
		p->status = 206;
		p->boff = a;
		p->blen = e - a + 1;
		sb_printf(&p->hdr, "Content-Range: bytes %zu-%zu/%zu\r\n", a, e, b->len);
	}
	sb_printf(&p->hdr, "ETag: %s\r\nLast-Modified: %s\r\nAccept-Ranges: bytes\r\n"
	                   "Content-Type: application/octet-stream\r\n", etag, date);
}

static void delete_object(s3mock *m, struct req *q, struct resp *p)
{
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, q->bucket);
	size_t at;
	if (!bk) {
		err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
	} else {
		if (obj_find(bk, q->key, &at))
			obj_del(bk, at);
		p->status = 204;
	}
	pthread_mutex_unlock(&m->lock);
}

static void mpu_start(s3mock *m, struct req *q, struct resp *p)
{
	struct upload *u = calloc(1, sizeof(*u));
	if (!u || !(u->bucket = strdup(q->bucket)) || !(u->key = strdup(q->key))) {
		if (u)
			upload_free(u);
		err(p, q, 500, "InternalError", "out of memory");
		return;
	}
	pthread_mutex_lock(&m->lock);
	if (!bucket_find(m, q->bucket)) {
		pthread_mutex_unlock(&m->lock);
		upload_free(u);
		err(p, q, 404, "NoSuchBucket", "The specified bucket does not exist");
		return;
	}
	unsigned seq = ++m->upload_seq;
	/* an id with characters a client must encode in a query ('+', '/') */
	snprintf(u->id, sizeof(u->id), "2~s3mock+%u/%08x", seq, (seq * 2654435761u) ^ 0x5bd1e995u);
	u->next = m->uploads;
	m->uploads = u;
	pthread_mutex_unlock(&m->lock);
	p->status = 200;
	sb_printf(&p->hdr, "Content-Type: application/xml\r\n");
	sb_printf(&p->body, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult "
	                    "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Bucket>");
	sb_xml(&p->body, q->bucket);
	sb_add(&p->body, "</Bucket><Key>", 14);
	sb_xml(&p->body, q->key);
	sb_add(&p->body, "</Key><UploadId>", 16);
	sb_xml(&p->body, u->id);
	sb_add(&p->body, "</UploadId></InitiateMultipartUploadResult>", 43);
}

static void mpu_part(s3mock *m, struct req *q, struct resp *p, const char *id)
{
	const char *pn = qget(q, "partNumber");
	char *end = NULL;
	long num = pn ? strtol(pn, &end, 10) : 0;
	if (!pn || !*pn || *end || num < 1 || num > PARTS_MAX) {
		err(p, q, 400, "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive");
		return;
	}
	blob *b = q->body ? q->body : blob_new(0);
	if (!b) {
		err(p, q, 500, "InternalError", "out of memory");
		return;
	}
	q->body = b;
	unsigned char d[16];
	char etag[ETAG_CAP];
	md5(b->data, b->len, d);
	etag[0] = '"';
	hex(d, 16, etag + 1);
	strcat(etag, "\"");
	pthread_mutex_lock(&m->lock);
	struct upload *u = upload_find(m, id, q->bucket, q->key);
	struct part *pt = NULL;
	if (u) {
		for (size_t i = 0; i < u->n; i++)
			if (u->parts[i].num == (int)num)
				pt = &u->parts[i];
		if (!pt && u->n == u->cap) {
			size_t nc = u->cap ? 2 * u->cap : 8;
			struct part *np = realloc(u->parts, nc * sizeof(*np));
			if (np) {
				u->parts = np;
				u->cap = nc;
			}
		}
		if (!pt && u->n < u->cap) {
			pt = &u->parts[u->n++];
			pt->b = NULL;
		}
	}
	if (!u) {
		err(p, q, 404, "NoSuchUpload", "The specified upload does not exist.");
	} else if (!pt) {
		err(p, q, 500, "InternalError", "out of memory");
	} else {
		blob_unref(pt->b);
		pt->num = (int)num;
		pt->b = b;
		memcpy(pt->md5, d, 16);
		q->body = NULL;
		p->status = 200;
		sb_printf(&p->hdr, "ETag: %s\r\n", etag);
	}
	pthread_mutex_unlock(&m->lock);
}

/* the text of <tag>...</tag> in [s, end), entities decoded: 1, 0 none, -1 bad */
static int xml_text(const char *s, const char *end, const char *tag, char *out, size_t cap)
{
	char open[40], close[40];
	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	const char *a = memmem(s, (size_t)(end - s), open, strlen(open));
	if (!a)
		return 0;
	a += strlen(open);
	const char *e = memmem(a, (size_t)(end - a), close, strlen(close));
	if (!e)
		return -1;
	static const struct { const char *ent; char ch; } ents[] = {
		{"&quot;", '"'}, {"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&apos;", '\''}};
	size_t k = 0;
	while (a < e) {
		char ch = *a;
		size_t adv = 1;
		if (ch == '&') {
			size_t i;
			for (i = 0; i < sizeof(ents) / sizeof(ents[0]); i++) {
				size_t el = strlen(ents[i].ent);
				if ((size_t)(e - a) >= el && memcmp(a, ents[i].ent, el) == 0) {
					ch = ents[i].ch;
					adv = el;
					break;
				}
			}
			if (i == sizeof(ents) / sizeof(ents[0]))
				return -1;
		}
		if (k + 1 >= cap)
			return -1;
		out[k++] = ch;
		a += adv;
	}
	out[k] = 0;
	return 1;
}

static void mpu_complete(s3mock *m, struct req *q, struct resp *p, const char *id)
{
	const char *x = q->body ? (const char *)q->body->data : "";
	const char *xend = x + (q->body ? q->body->len : 0);
	struct want {
		int num;
		char etag[ETAG_CAP + 16];
	} *w = NULL;
	size_t nw = 0, wcap = 0;
	if (!memmem(x, (size_t)(xend - x), "<CompleteMultipartUpload", 24)) {
		err(p, q, 400, "MalformedXML", "The XML you provided was not well-formed");
		return;
	}
	for (const char *s = x; (s = memmem(s, (size_t)(xend - s), "<Part>", 6));) {
		const char *e = memmem(s, (size_t)(xend - s), "</Part>", 7);
		char num[16];
		struct want one;
		char *nend;
		if (!e || xml_text(s, e, "PartNumber", num, sizeof(num)) != 1 ||
		    xml_text(s, e, "ETag", one.etag, sizeof(one.etag)) != 1 || !num[0] ||
		    (one.num = (int)strtol(num, &nend, 10), *nend) || nw == PARTS_MAX) {
			free(w);
			err(p, q, 400, "MalformedXML", "The XML you provided was not well-formed");
			return;
		}
		if (nw == wcap) {
			wcap = wcap ? 2 * wcap : 16;
			struct want *nwp = realloc(w, wcap * sizeof(*nwp));
			if (!nwp) {
				free(w);
				err(p, q, 500, "InternalError", "out of memory");
				return;
			}
			w = nwp;
		}
		w[nw++] = one;
		s = e + 7;
	}
	if (!nw) {
		err(p, q, 400, "MalformedXML", "The XML you provided was not well-formed (no Part)");
		return;
	}
	for (size_t i = 1; i < nw; i++)
		if (w[i].num <= w[i - 1].num) {
			free(w);
			err(p, q, 400, "InvalidPartOrder", "The list of parts was not in ascending order.");
			return;
		}
	pthread_mutex_lock(&m->lock);
	struct upload *u = upload_find(m, id, q->bucket, q->key);
	struct bucket *bk = bucket_find(m, q->bucket);
	struct part **use = u ? calloc(nw, sizeof(*use)) : NULL;
	size_t total = 0;
	if (!u || !bk) {
		err(p, q, 404, "NoSuchUpload", "The specified upload does not exist.");
		goto out;
	}
	if (!use) {
		err(p, q, 500, "InternalError", "out of memory");
		goto out;
	}
	for (size_t i = 0; i < nw; i++) {
		char have[40];
		for (size_t j = 0; j < u->n; j++)
			if (u->parts[j].num == w[i].num)
				use[i] = &u->parts[j];
		if (use[i]) {
			have[0] = '"';
			hex(use[i]->md5, 16, have + 1);
			strcat(have, "\"");
		}
		if (!use[i] || !etag_eq(w[i].etag, have)) {
			err(p, q, 400, "InvalidPart", "part %d was not uploaded or its ETag is not %.60s", w[i].num,
			    w[i].etag);
			goto out;
		}
		if (i + 1 < nw && use[i]->b->len < PART_MIN) {
			err(p, q, 400, "EntityTooSmall",
			    "Your proposed upload is smaller than the minimum allowed object size (part %d: %zu bytes)",
			    w[i].num, use[i]->b->len);
			goto out;
		}
		total += use[i]->b->len;
	}
	blob *b = blob_new(total);
	EVP_MD_CTX *c = EVP_MD_CTX_new();
	unsigned char d[16];
	unsigned dn = sizeof(d);
	char etag[ETAG_CAP];
	if (!b || !c || !EVP_DigestInit_ex(c, EVP_md5(), NULL)) {
		free(b);
		EVP_MD_CTX_free(c);
		err(p, q, 500, "InternalError", "out of memory");
		goto out;
	}
	size_t off = 0;
	for (size_t i = 0; i < nw; i++) {
		memcpy(b->data + off, use[i]->b->data, use[i]->b->len);
		off += use[i]->b->len;
		EVP_DigestUpdate(c, use[i]->md5, 16);
	}
	EVP_DigestFinal_ex(c, d, &dn);
	EVP_MD_CTX_free(c);
	etag[0] = '"';
	hex(d, 16, etag + 1);
	snprintf(etag + 33, sizeof(etag) - 33, "-%zu\"", nw);
	if (obj_set(bk, q->key, b, etag) < 0) {
		free(b);
		err(p, q, 500, "InternalError", "out of memory");
		goto out;
	}
	upload_unlink(m, u);
	upload_free(u);
	p->status = 200;
	sb_printf(&p->hdr, "Content-Type: application/xml\r\n");
	sb_printf(&p->body, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult "
	                    "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Location>/");
	sb_xml(&p->body, q->bucket);
	sb_add(&p->body, "/", 1);
	sb_xml(&p->body, q->key);
	sb_add(&p->body, "</Location><Bucket>", 19);
	sb_xml(&p->body, q->bucket);
	sb_add(&p->body, "</Bucket><Key>", 14);
	sb_xml(&p->body, q->key);
	sb_add(&p->body, "</Key><ETag>", 12);
	sb_xml(&p->body, etag);
	sb_add(&p->body, "</ETag></CompleteMultipartUploadResult>", 39);
out:
	pthread_mutex_unlock(&m->lock);
	free(use);
	free(w);
}

static void mpu_abort(s3mock *m, struct req *q, struct resp *p, const char *id)
{
	pthread_mutex_lock(&m->lock);
	struct upload *u = upload_find(m, id, q->bucket, q->key);
	if (u) {
		upload_unlink(m, u);
		upload_free(u);
		p->status = 204;
	} else {
		err(p, q, 404, "NoSuchUpload", "The specified upload does not exist.");
	}
	pthread_mutex_unlock(&m->lock);
}

static void object_op(s3mock *m, struct req *q, struct resp *p)
{
	const char *id = qget(q, "uploadId");
	if (strlen(q->key) > KEY_MAX) {
		err(p, q, 400, "KeyTooLongError", "Your key is too long");
		return;
	}
	switch (q->kind) {
	case K_PUT:
		if (id)
			mpu_part(m, q, p, id);
		else
			put_object(m, q, p);
		return;
	case K_GET:
	case K_HEAD:
		if (id)
			err(p, q, 400, "InvalidRequest", "ListParts is not served by the mock");
		else
			get_object(m, q, p);
		return;
	case K_DELETE:
		if (id)
			mpu_abort(m, q, p, id);
		else
			delete_object(m, q, p);
		return;
	case K_POST:
		if (qget(q, "uploads"))
			mpu_start(m, q, p);
		else if (id)
			mpu_complete(m, q, p, id);
		else
			err(p, q, 405, "MethodNotAllowed", "The specified method is not allowed against this resource.");
		return;
	default:
		err(p, q, 405, "MethodNotAllowed", "The specified method is not allowed against this resource.");
	}
}

static void handle(s3mock *m, struct req *q, struct resp *p)
{
	if (check_auth(m, q, p) < 0)
		return;
	if (q->key)
		object_op(m, q, p);
	else
		bucket_op(m, q, p);
}

static const char *fault_code(int st)
{
	switch (st) {
	case 400: return "BadRequest";
	case 403: return "AccessDenied";
	case 404: return "NoSuchKey";
	case 409: return "OperationAborted";
	case 412: return "PreconditionFailed";
	case 429: return "TooManyRequests";
	case 500: return "InternalError";
	case 501: return "NotImplemented";
	case 503: return "SlowDown";
	default: return "InjectedFault";
	}
}

static int send_resp(int fd, const struct req *q, const struct resp *p)
{
	static const char oom[] = "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
	sbuf h = {0};
	int head = q->kind == K_HEAD, rc;
	if (p->hdr.oom || p->body.oom) {
		(void)send_all(fd, oom, sizeof(oom) - 1);
		return -1;
	}
	uint64_t clen = p->b ? p->blen : p->body.n;
	if (head && p->head_len >= 0)
		clen = (uint64_t)p->head_len;
	sb_printf(&h, "HTTP/1.1 %d %s\r\nServer: s3mock\r\nx-amz-request-id: s3mock-%lu\r\n", p->status,
	          reason(p->status), q->id);
	if (p->status != 204)
		sb_printf(&h, "Content-Length: %llu\r\n", (unsigned long long)clen);
	if (p->close)
		sb_printf(&h, "Connection: close\r\n");
	if (p->hdr.p)
		sb_add(&h, p->hdr.p, p->hdr.n);
	sb_add(&h, "\r\n", 2);
	if (h.oom) {
		free(h.p);
		(void)send_all(fd, oom, sizeof(oom) - 1);
		return -1;
	}
	rc = send_all(fd, h.p, h.n);
	free(h.p);
	if (rc == 0 && !head && p->status != 204) {
		if (p->b)
			rc = send_all(fd, p->b->data + p->boff, p->blen);
		else if (p->body.n)
			rc = send_all(fd, p->body.p, p->body.n);
	}
	return rc;
}

/* ---- threads ------------------------------------------------------------- */
static void *conn_main(void *arg)
{
	struct conn *c = arg;
	s3mock *m = c->m;
	struct rd *r = malloc(sizeof(*r));
	if (r) {
		r->fd = c->fd; /* constant until this thread closes it */
		r->a = r->b = 0;
	}
	while (r) {
		struct req q = {0};
		struct resp p = {.head_len = -1};
		int drop = 0, fail = 0, keep = 0;
		int rc = rd_head(r, &q.head);
		if (rc == -2) {
			err(&p, &q, 431, "RequestHeaderSectionTooLarge", "the request's head is over 64 KiB");
			p.close = 1;
			(void)send_resp(r->fd, &q, &p);
		}
		if (rc <= 0)
			goto next;
		pthread_mutex_lock(&m->lock);
		q.id = ++m->req_seq;
		pthread_mutex_unlock(&m->lock);
		if (parse_head(&q) < 0) {
			err(&p, &q, 400, "BadRequest", "a malformed request");
			p.close = 1;
			(void)send_resp(r->fd, &q, &p);
			goto next;
		}
		pthread_mutex_lock(&m->lock);
		m->counts[q.kind]++;
		m->total++;
		if (m->hang) {
			drop = 1; /* held, unanswered, until the hang ends */
			while (m->hang && !m->stopping) {
				pthread_mutex_unlock(&m->lock);
				sleep_ms(10);
				pthread_mutex_lock(&m->lock);
			}
		} else if (m->drop_n > 0) {
			m->drop_n--;
			drop = 1;
		} else if (m->fail_n > 0) {
			m->fail_n--;
			fail = m->fail_status;
		}
		pthread_mutex_unlock(&m->lock);
		if (drop)
			goto next;
		if (read_body(r, &q, &p) < 0) {
			if (p.status)
				(void)send_resp(r->fd, &q, &p);
			goto next;
		}
		if (fail)
			err(&p, &q, fail, fault_code(fail), "injected fault (s3mock_fail_next)");
		else
			handle(m, &q, &p);
		pthread_mutex_lock(&m->lock);
		unsigned stall = m->stall;
		pthread_mutex_unlock(&m->lock);
		for (unsigned slept = 0; slept < stall; slept += 10) { /* in slices: s3mock_stop cuts it short */
			pthread_mutex_lock(&m->lock);
			int stop = m->stopping;
			pthread_mutex_unlock(&m->lock);
			if (stop)
				break;
			sleep_ms(stall - slept < 10 ? stall - slept : 10);
		}
		if (q.close || q.http10)
			p.close = 1;
		keep = send_resp(r->fd, &q, &p) == 0 && !p.close;
	next:
		blob_put(m, p.b);
		blob_unref(q.body);
		free(p.hdr.p);
		free(p.body.p);
		free(q.path);
		free(q.head);
		if (!keep)
			break;
	}
	free(r);
	pthread_mutex_lock(&m->lock);
	close(c->fd);
	c->fd = -1;
	c->done = 1;
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* joins the connection threads that are done */
static void reap(s3mock *m)
{
	struct conn *dead = NULL;
	pthread_mutex_lock(&m->lock);
	for (struct conn **pp = &m->conns; *pp;) {
		struct conn *c = *pp;
		if (c->done) {
			*pp = c->next;
			c->next = dead;
			dead = c;
		} else {
			pp = &c->next;
		}
	}
	pthread_mutex_unlock(&m->lock);
	while (dead) {
		struct conn *c = dead;
		dead = c->next;
		pthread_join(c->th, NULL);
		free(c);
	}
}

static void *accept_main(void *arg)
{
	s3mock *m = arg;
	for (;;) {
		int fd = accept(m->lfd, NULL, NULL);
		if (fd < 0) {
			pthread_mutex_lock(&m->lock);
			int stop = m->stopping;
			pthread_mutex_unlock(&m->lock);
			if (stop)
				break;
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				sleep_ms(10);
				continue;
			}
			break;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		reap(m);
		struct conn *c = calloc(1, sizeof(*c));
		pthread_mutex_lock(&m->lock);
		if (m->stopping || !c) {
			pthread_mutex_unlock(&m->lock);
			close(fd);
			free(c);
			if (!c)
				continue;
			break;
		}
		c->m = m;
		c->fd = fd;
		if (pthread_create(&c->th, NULL, conn_main, c) != 0) {
			close(fd);
			free(c);
		} else {
			c->next = m->conns;
			m->conns = c;
		}
		pthread_mutex_unlock(&m->lock);
	}
	return NULL;
}

/* ---- the API --------------------------------------------------------------- */
int s3mock_start(s3mock **out)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	s3mock *m = calloc(1, sizeof(*m));
	*out = NULL;
	if (!m)
		return -1;
	m->lfd = -1;
	if (!(m->key_id = strdup("testkey")) || pthread_mutex_init(&m->lock, NULL) != 0) {
		free(m->key_id);
		free(m);
		return -1;
	}
	m->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (m->lfd < 0 || bind(m->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(m->lfd, 64) != 0 ||
	    getsockname(m->lfd, (struct sockaddr *)&a, &al) != 0)
		goto fail;
	snprintf(m->endpoint, sizeof(m->endpoint), "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
	if (pthread_create(&m->accept_th, NULL, accept_main, m) != 0)
		goto fail;
	*out = m;
	return 0;
fail:;
	int keep = errno;
	if (m->lfd >= 0)
		close(m->lfd);
	pthread_mutex_destroy(&m->lock);
	free(m->key_id);
	free(m);
	errno = keep;
	return -1;
}

const char *s3mock_endpoint(s3mock *m) { return m->endpoint; }

void s3mock_stop(s3mock *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->lock);
	m->stopping = 1;
	pthread_mutex_unlock(&m->lock);
	shutdown(m->lfd, SHUT_RDWR); /* wakes accept() */
	pthread_join(m->accept_th, NULL);
	close(m->lfd);
	pthread_mutex_lock(&m->lock);
	for (struct conn *c = m->conns; c; c = c->next)
		if (c->fd >= 0)
			shutdown(c->fd, SHUT_RDWR); /* wakes read() and send() */
	struct conn *all = m->conns;
	m->conns = NULL;
	pthread_mutex_unlock(&m->lock);
	while (all) {
		struct conn *c = all;
		all = c->next;
		pthread_join(c->th, NULL);
		free(c);
	}
	while (m->buckets) {
		struct bucket *b = m->buckets;
		m->buckets = b->next;
		while (b->n)
			obj_del(b, b->n - 1);
		free(b->objs);
		free(b->name);
		free(b);
	}
	while (m->uploads) {
		struct upload *u = m->uploads;
		m->uploads = u->next;
		upload_free(u);
	}
	free(m->key_id);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

void s3mock_set_key(s3mock *m, const char *key_id)
{
	char *k = strdup(key_id);
	if (!k)
		return;
	pthread_mutex_lock(&m->lock);
	free(m->key_id);
	m->key_id = k;
	pthread_mutex_unlock(&m->lock);
}

void s3mock_fail_next(s3mock *m, int n, int status)
{
	pthread_mutex_lock(&m->lock);
	m->fail_n = n > 0 ? n : 0;
	m->fail_status = status;
	pthread_mutex_unlock(&m->lock);
}

void s3mock_drop_next(s3mock *m, int n)
{
	pthread_mutex_lock(&m->lock);
	m->drop_n = n > 0 ? n : 0;
	pthread_mutex_unlock(&m->lock);
}

void s3mock_stall_ms(s3mock *m, unsigned ms)
{
	pthread_mutex_lock(&m->lock);
	m->stall = ms;
	pthread_mutex_unlock(&m->lock);
}

unsigned long s3mock_count(s3mock *m, const char *what)
{
	static const char *const names[K_N] = {"PUT", "GET", "LIST", "HEAD", "DELETE", "POST", NULL};
	unsigned long n = 0;
	pthread_mutex_lock(&m->lock);
	if (strcmp(what, "ALL") == 0)
		n = m->total;
	for (int i = 0; i < K_N; i++)
		if (names[i] && strcmp(what, names[i]) == 0)
			n = m->counts[i];
	pthread_mutex_unlock(&m->lock);
	return n;
}

int s3mock_uploads(s3mock *m)
{
	int n = 0;
	pthread_mutex_lock(&m->lock);
	for (struct upload *u = m->uploads; u; u = u->next)
		n++;
	pthread_mutex_unlock(&m->lock);
	return n;
}

/* "BUCKET/KEY" split into a malloc'ed bucket and a pointer into path */
static char *split_path(const char *path, const char **key)
{
	const char *s = strchr(path, '/');
	if (!s || s == path || !s[1])
		return NULL;
	*key = s + 1;
	return strndup(path, (size_t)(s - path));
}

/* the object of path, lock held: NULL when none */
static struct obj *obj_at(s3mock *m, const char *path, struct bucket **bkout, size_t *atout)
{
	const char *key;
	char *bn = split_path(path, &key);
	struct bucket *bk = bn ? bucket_find(m, bn) : NULL;
	size_t at;
	free(bn);
	if (!bk || !obj_find(bk, key, &at))
		return NULL;
	if (bkout)
		*bkout = bk;
	if (atout)
		*atout = at;
	return &bk->objs[at];
}

int s3mock_corrupt(s3mock *m, const char *path, uint64_t offset)
{
	int rc = -1;
	pthread_mutex_lock(&m->lock);
	struct obj *o = obj_at(m, path, NULL, NULL);
	if (o && offset < o->b->len) {
		blob *nb = blob_new(o->b->len); /* invariant 2: a changed copy */
		if (nb) {
			memcpy(nb->data, o->b->data, o->b->len);
			nb->data[offset] ^= 0xff;
			blob_unref(o->b);
			o->b = nb;
			rc = 0;
		}
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}

void *s3mock_get_object(s3mock *m, const char *path, size_t *len)
{
	unsigned char *out = NULL;
	pthread_mutex_lock(&m->lock);
	struct obj *o = obj_at(m, path, NULL, NULL);
	if (o && (out = malloc(o->b->len + 1))) {
		memcpy(out, o->b->data, o->b->len);
		out[o->b->len] = 0;
		*len = o->b->len;
	}
	pthread_mutex_unlock(&m->lock);
	return out;
}

int s3mock_put_object(s3mock *m, const char *path, const void *p, size_t len)
{
	const char *key;
	char *bn = split_path(path, &key);
	blob *b = bn ? blob_new(len) : NULL;
	unsigned char d[16];
	char etag[ETAG_CAP];
	int rc = -1;
	if (!b) {
		free(bn);
		return -1;
	}
	if (len)
		memcpy(b->data, p, len);
	md5(b->data, len, d);
	etag[0] = '"';
	hex(d, 16, etag + 1);
	strcat(etag, "\"");
	pthread_mutex_lock(&m->lock);
	struct bucket *bk = bucket_find(m, bn);
	if (!bk)
		bk = bucket_add(m, bn);
	if (bk && obj_set(bk, key, b, etag) == 0) {
		b = NULL;
		rc = 0;
	}
	pthread_mutex_unlock(&m->lock);
	free(b);
	free(bn);
	return rc;
}

int s3mock_delete_object(s3mock *m, const char *path)
{
	struct bucket *bk;
	size_t at;
	int rc = -1;
	pthread_mutex_lock(&m->lock);
	if (obj_at(m, path, &bk, &at)) {
		obj_del(bk, at);
		rc = 0;
	}
	pthread_mutex_unlock(&m->lock);
	return rc;
}

void s3mock_hang(s3mock *m, int on)
{
	pthread_mutex_lock(&m->lock);
	m->hang = on;
	pthread_mutex_unlock(&m->lock);
}
