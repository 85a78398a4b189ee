/* SPDX-License-Identifier: MIT */
/*
 * s3.c - an S3 client on libcurl (s3.h): path-style requests signed with
 * SigV4 by libcurl, retries with backoff, a strict little XML reader for the
 * store's answers (hostile input), the AWS environment and files.
 *
 * Invariants:
 *  1. Credentials go to libcurl only (CURLOPT_USERNAME/PASSWORD and the
 *     x-amz-security-token header); no message, log or URL holds them, and
 *     CURLOPT_VERBOSE is never set.
 *  2. Every request carries x-amz-content-sha256 with the hex SHA-256 of
 *     its body (libcurl 7.88 signs that value; RGW refuses a request
 *     without the header), and its query is sorted and percent-encoded
 *     here, before libcurl signs it as given.
 *  3. A GET writes into the caller's buffer only bytes the answer says are
 *     of the range asked for, never past it, and succeeds only when exactly
 *     len bytes came: a retry starts the buffer over.
 *  4. A conditional PUT that was retried after a failure the request may
 *     have survived (a timeout, a dropped connection) and then got 412
 *     checks with HEAD whether the object is its own (ETag = MD5 of the
 *     body, as for every single-part PUT) before it reports -ULP_E_EXIST.
 */
#include "store/s3.h"
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define S3_POOL 8                     /* idle handles a client keeps */
#define S3_ERRBODY_MAX (64u << 10)    /* an error answer read (the rest dropped) */
#define S3_XML_MAX (16u << 20)        /* a list or multipart answer */
#define S3_KEY_MAX 1024               /* S3's limit on a key, in bytes */
#define S3_TOKEN_MAX 4096             /* a continuation token or upload id */
#define S3_LIST_PAGE_MAX 10000        /* keys in one list answer */
#define S3_XML_DEPTH 16
#define S3_PARTS_MAX 10000            /* S3's limit on parts */
#define S3_PART_MIN (5ull << 20)

struct ulp_s3 {
	ulp_s3_conf c; /* a deep copy, read-only after open */
	char *bucket;
	char *sigv4; /* "aws:amz:REGION:s3" */
	pthread_mutex_t lock;
	CURL *pool[S3_POOL]; /* idle handles (their connections stay open) */
	int npool;
};

/* ---- small helpers ----------------------------------------------------- */
static void hex(const unsigned char *d, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = digits[d[i] >> 4];
		out[2 * i + 1] = digits[d[i] & 15];
	}
	out[2 * n] = 0;
}

/* hex SHA-256 (65 bytes) or MD5 (33 bytes) of p */
static int digest_hex(const EVP_MD *md, const void *p, size_t n, char *out)
{
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned dn = 0;
	if (!EVP_Digest(p, n, d, &dn, md, NULL))
		return -ULP_E_NOMEM;
	hex(d, dn, out);
	return 0;
}

static int fd_sha256_hex(int fd, uint64_t off, uint64_t len, char out[65])
{
	EVP_MD_CTX *x = EVP_MD_CTX_new();
	unsigned char *buf = malloc(1u << 20);
	int rc = 0;
	if (!x || !buf || !EVP_DigestInit_ex(x, EVP_sha256(), NULL)) {
		rc = -ULP_E_NOMEM;
		goto out;
	}
	while (len > 0) {
		size_t want = len < (1u << 20) ? (size_t)len : (1u << 20);
		ssize_t got = pread(fd, buf, want, (off_t)off);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0) {
			rc = got < 0 ? -ULP_E_IO : -ULP_E_CORRUPT;
			goto out;
		}
		EVP_DigestUpdate(x, buf, (size_t)got);
		off += (uint64_t)got;
		len -= (uint64_t)got;
	}
	unsigned char d[EVP_MAX_MD_SIZE];
	unsigned dn = 0;
	if (!EVP_DigestFinal_ex(x, d, &dn))
		rc = -ULP_E_NOMEM;
	else
		hex(d, dn, out);
out:
	EVP_MD_CTX_free(x);
	free(buf);
	return rc;
}

char *ulp_s3_uri_encode(const char *s, size_t n, int keep_slash)
{
	static const char digits[] = "0123456789ABCDEF";
	char *o = malloc(3 * n + 1), *q = o;
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		if (isalnum(ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~' || (keep_slash && ch == '/')) {
			*q++ = (char)ch;
		} else {
			*q++ = '%';
			*q++ = digits[ch >> 4];
			*q++ = digits[ch & 15];
		}
	}
	*q = 0;
	return o;
}

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static int sdup(char **dst, const char *s)
{
	if (!s)
		return 0;
	*dst = strdup(s);
	return *dst ? 0 : -ULP_E_NOMEM;
}

/* a growable byte buffer with a ceiling */
typedef struct dbuf {
	char *p;
	size_t len, cap, max;
	int over; /* more came than max */
} dbuf;

static int dbuf_add(dbuf *b, const void *p, size_t n)
{
	if (n > b->max - b->len) {
		b->over = 1;
		return -1;
	}
	if (b->len + n + 1 > b->cap) {
		size_t nc = b->cap ? b->cap : 4096;
		while (nc < b->len + n + 1)
			nc *= 2;
		char *np = realloc(b->p, nc);
		if (!np)
			return -1;
		b->p = np;
		b->cap = nc;
	}
	memcpy(b->p + b->len, p, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

/* ---- a strict little XML reader ---------------------------------------- */
/* Elements, attributes (skipped), text with the five named entities and
 * character references; an XML declaration first. No comments, CDATA,
 * DOCTYPE or processing instructions (S3 sends none; a DOCTYPE is how
 * entity bombs come). Text beside child elements must be blank. */
typedef struct xml_ev {
	int (*open)(void *arg, int depth, const char *name, size_t nlen);
	int (*close)(void *arg, int depth, const char *name, size_t nlen, const char *text, size_t tlen);
	void *arg;
} xml_ev;

static int xml_namech(unsigned char c) { return isalnum(c) || c == '_' || c == '-' || c == '.' || c == ':'; }
static int xml_blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int utf8_put(dbuf *t, unsigned long cp)
{
	char u[4];
	size_t n;
	if (cp == 0 || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
		return -1;
	if (cp < 0x80) {
		u[0] = (char)cp;
		n = 1;
	} else if (cp < 0x800) {
		u[0] = (char)(0xc0 | cp >> 6);
		u[1] = (char)(0x80 | (cp & 0x3f));
		n = 2;
	} else if (cp < 0x10000) {
		u[0] = (char)(0xe0 | cp >> 12);
		u[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		u[2] = (char)(0x80 | (cp & 0x3f));
		n = 3;
	} else {
		u[0] = (char)(0xf0 | cp >> 18);
		u[1] = (char)(0x80 | (cp >> 12 & 0x3f));
		u[2] = (char)(0x80 | (cp >> 6 & 0x3f));
		u[3] = (char)(0x80 | (cp & 0x3f));
		n = 4;
	}
	return dbuf_add(t, u, n);
}

/* 0, -1 malformed, or a callback's non-zero return */
static int xml_walk(const char *p, size_t n, const xml_ev *ev)
{
	const char *name[S3_XML_DEPTH];
	size_t nlen[S3_XML_DEPTH];
	int kids[S3_XML_DEPTH];
	int depth = 0, roots = 0, rc = 0;
	dbuf t = {.max = n};
	size_t i = 0;
	if (n >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0)
		i = 3;
	while (i < n && xml_blank((unsigned char)p[i]))
		i++;
	if (n - i >= 5 && memcmp(p + i, "<?xml", 5) == 0) {
		const char *end = memmem(p + i, n - i, "?>", 2);
		if (!end)
			return -1;
		i = (size_t)(end - p) + 2;
	}
	while (i < n) {
		unsigned char c = (unsigned char)p[i];
		if (c == '<') {
			if (i + 1 >= n)
				goto bad;
			if (p[i + 1] == '/') { /* a closing tag */
				size_t s = i + 2, e = s;
				while (e < n && xml_namech((unsigned char)p[e]))
					e++;
				size_t k = e;
				while (k < n && xml_blank((unsigned char)p[k]))
					k++;
				if (depth == 0 || k >= n || p[k] != '>' || e - s != nlen[depth - 1] ||
				    memcmp(p + s, name[depth - 1], e - s) != 0)
					goto bad;
				if (kids[depth - 1]) {
					for (size_t j = 0; j < t.len; j++)
						if (!xml_blank((unsigned char)t.p[j]))
							goto bad;
				}
				rc = ev->close ? ev->close(ev->arg, depth, name[depth - 1], nlen[depth - 1],
				                           kids[depth - 1] ? "" : (t.p ? t.p : ""),
				                           kids[depth - 1] ? 0 : t.len)
				               : 0;
				if (rc)
					goto out;
				depth--;
				t.len = 0;
				i = k + 1;
				continue;
			}
			if (!xml_namech((unsigned char)p[i + 1]) || p[i + 1] == '-' || p[i + 1] == '.' ||
			    isdigit((unsigned char)p[i + 1]))
				goto bad; /* <! <? or junk */
			size_t s = i + 1, e = s;
			while (e < n && xml_namech((unsigned char)p[e]))
				e++;
			/* attributes: blank name = "value" ... */
			size_t k = e;
			for (;;) {
				size_t b = k;
				while (k < n && xml_blank((unsigned char)p[k]))
					k++;
				if (k >= n)
					goto bad;
				if (p[k] == '>' || p[k] == '/')
					break;
				if (k == b || !xml_namech((unsigned char)p[k]))
					goto bad;
				while (k < n && xml_namech((unsigned char)p[k]))
					k++;
				while (k < n && xml_blank((unsigned char)p[k]))
					k++;
				if (k >= n || p[k] != '=')
					goto bad;
				k++;
				while (k < n && xml_blank((unsigned char)p[k]))
					k++;
				if (k >= n || (p[k] != '"' && p[k] != '\''))
					goto bad;
				char q = p[k++];
				while (k < n && p[k] != q && p[k] != '<')
					k++;
				if (k >= n || p[k] != q)
					goto bad;
				k++;
			}
			int empty = p[k] == '/';
			if (empty && (k + 1 >= n || p[k + 1] != '>'))
				goto bad;
			if (depth == 0 && roots++)
				goto bad; /* a second root */
			if (depth >= S3_XML_DEPTH)
				goto bad;
			if (depth > 0) {
				for (size_t j = 0; j < t.len; j++)
					if (!xml_blank((unsigned char)t.p[j]))
						goto bad; /* text before a child */
				kids[depth - 1] = 1;
			}
			t.len = 0;
			name[depth] = p + s;
			nlen[depth] = e - s;
			kids[depth] = 0;
			depth++;
			rc = ev->open ? ev->open(ev->arg, depth, p + s, e - s) : 0;
			if (rc)
				goto out;
			if (empty) {
				rc = ev->close ? ev->close(ev->arg, depth, p + s, e - s, "", 0) : 0;
				if (rc)
					goto out;
				depth--;
			}
			i = k + (empty ? 2 : 1);
			continue;
		}
		if (depth == 0) {
			if (!xml_blank(c))
				goto bad;
			i++;
			continue;
		}
		if (c == '&') {
			const char *semi = memchr(p + i, ';', n - i < 12 ? n - i : 12);
			if (!semi)
				goto bad;
			size_t el = (size_t)(semi - (p + i)) + 1;
			const char *ent = p + i;
			char ch = 0;
			if (el == 5 && memcmp(ent, "&amp;", 5) == 0)
				ch = '&';
			else if (el == 4 && memcmp(ent, "&lt;", 4) == 0)
				ch = '<';
			else if (el == 4 && memcmp(ent, "&gt;", 4) == 0)
				ch = '>';
			else if (el == 6 && memcmp(ent, "&quot;", 6) == 0)
				ch = '"';
			else if (el == 6 && memcmp(ent, "&apos;", 6) == 0)
				ch = '\'';
			if (ch) {
				if (dbuf_add(&t, &ch, 1))
					goto bad;
			} else if (el >= 4 && ent[1] == '#') {
				unsigned long cp = 0;
				int x = ent[2] == 'x';
				size_t j = x ? 3 : 2;
				if (j >= el - 1)
					goto bad;
				for (; j < el - 1; j++) {
					unsigned char d = (unsigned char)ent[j];
					if (x ? !isxdigit(d) : !isdigit(d))
						goto bad;
					cp = cp * (x ? 16 : 10) + (unsigned long)(isdigit(d) ? d - '0' : (tolower(d) - 'a' + 10));
					if (cp > 0x10ffff)
						goto bad;
				}
				if ((cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || utf8_put(&t, cp))
					goto bad;
			} else {
				goto bad;
			}
			i += el;
			continue;
		}
		if (c < 0x20 && !xml_blank(c))
			goto bad;
		if (dbuf_add(&t, &c, 1))
			goto bad;
		i++;
	}
	if (depth != 0 || roots != 1)
		goto bad;
out:
	free(t.p);
	return rc;
bad:
	free(t.p);
	return -1;
}

static int name_is(const char *name, size_t nlen, const char *want)
{
	return strlen(want) == nlen && memcmp(name, want, nlen) == 0;
}

struct child_ctx {
	const char *want;
	char *out;
	size_t cap;
	int found;
	const char *root; /* the root's name, NULL: any */
	int root_ok;
};
static int child_open(void *arg, int depth, const char *name, size_t nlen)
{
	struct child_ctx *x = arg;
	if (depth == 1)
		x->root_ok = !x->root || name_is(name, nlen, x->root);
	return 0;
}
static int child_close(void *arg, int depth, const char *name, size_t nlen, const char *text, size_t tlen)
{
	struct child_ctx *x = arg;
	if (depth == 2 && !x->found && name_is(name, nlen, x->want)) {
		size_t k = tlen < x->cap - 1 ? tlen : x->cap - 1;
		memcpy(x->out, text, k);
		x->out[k] = 0;
		x->found = 1;
	}
	return 0;
}

int ulp_s3_xml_child(const char *xml, size_t n, const char *name, char *out, size_t cap)
{
	struct child_ctx x = {.want = name, .out = out, .cap = cap};
	xml_ev ev = {child_open, child_close, &x};
	if (!cap)
		return -ULP_E_INVAL;
	out[0] = 0;
	if (xml_walk(xml, n, &ev) != 0)
		return -ULP_E_CORRUPT;
	return x.found;
}

/* the root's name is want and child name's text (whole, at most cap - 1 bytes) */
static int xml_root_child(const char *xml, size_t n, const char *root, const char *name, char *out, size_t cap)
{
	struct child_ctx x = {.want = name, .out = out, .cap = cap, .root = root};
	xml_ev ev = {child_open, child_close, &x};
	out[0] = 0;
	if (xml_walk(xml, n, &ev) != 0 || !x.root_ok)
		return -ULP_E_CORRUPT;
	return x.found;
}

/* ---- ListObjectsV2 ------------------------------------------------------ */
struct list_ent {
	char *key;
	uint64_t size;
};
struct list_ctx {
	const char *prefix;
	struct list_ent *ents;
	size_t n, cap;
	int in_contents;
	char *key; /* of the Contents being read */
	int has_size;
	uint64_t size;
	int truncated, has_truncated;
	char *next;
	const char *why; /* what was wrong */
};

static int parse_u64(const char *s, size_t n, uint64_t *v)
{
	uint64_t x = 0;
	if (n == 0 || n > 20)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (!isdigit((unsigned char)s[i]))
			return -1;
		unsigned d = (unsigned)(s[i] - '0');
		if (x > (UINT64_MAX - d) / 10)
			return -1;
		x = x * 10 + d;
	}
	*v = x;
	return 0;
}

static int list_open(void *arg, int depth, const char *name, size_t nlen)
{
	struct list_ctx *x = arg;
	if (depth == 1 && !name_is(name, nlen, "ListBucketResult")) {
		x->why = "the answer is not a ListBucketResult";
		return 1;
	}
	if (depth == 2 && name_is(name, nlen, "Contents")) {
		free(x->key);
		x->key = NULL;
		x->has_size = 0;
		x->in_contents = 1;
	}
	return 0;
}

static int list_close(void *arg, int depth, const char *name, size_t nlen, const char *text, size_t tlen)
{
	struct list_ctx *x = arg;
	if (depth == 3 && !x->in_contents)
		return 0;
	if (depth == 3 && name_is(name, nlen, "Key")) {
		if (x->key) {
			x->why = "a Contents with two keys";
			return 1;
		}
		if (tlen == 0 || tlen > S3_KEY_MAX || memchr(text, 0, tlen)) {
			x->why = "a key empty, over 1024 bytes or with a NUL";
			return 1;
		}
		if (strncmp(text, x->prefix, strlen(x->prefix)) != 0) {
			x->why = "a key outside the prefix asked for";
			return 1;
		}
		x->key = strndup(text, tlen);
		if (!x->key) {
			x->why = "out of memory";
			return 1;
		}
	} else if (depth == 3 && name_is(name, nlen, "Size")) {
		if (x->has_size || parse_u64(text, tlen, &x->size)) {
			x->why = "a bad or second Size";
			return 1;
		}
		x->has_size = 1;
	} else if (depth == 2 && name_is(name, nlen, "Contents")) {
		x->in_contents = 0;
		if (!x->key || !x->has_size) {
			x->why = "a Contents without Key or Size";
			return 1;
		}
		if (x->n == S3_LIST_PAGE_MAX) {
			x->why = "over 10000 keys in one page";
			return 1;
		}
		if (x->n == x->cap) {
			size_t nc = x->cap ? 2 * x->cap : 64;
			struct list_ent *ne = realloc(x->ents, nc * sizeof(*ne));
			if (!ne) {
				x->why = "out of memory";
				return 1;
			}
			x->ents = ne;
			x->cap = nc;
		}
		x->ents[x->n].key = x->key;
		x->ents[x->n].size = x->size;
		x->n++;
		x->key = NULL;
	} else if (depth == 2 && name_is(name, nlen, "IsTruncated")) {
		if (x->has_truncated || !((tlen == 4 && !memcmp(text, "true", 4)) || (tlen == 5 && !memcmp(text, "false", 5)))) {
			x->why = "a bad or second IsTruncated";
			return 1;
		}
		x->has_truncated = 1;
		x->truncated = tlen == 4;
	} else if (depth == 2 && name_is(name, nlen, "NextContinuationToken")) {
		if (x->next || tlen == 0 || tlen > S3_TOKEN_MAX || memchr(text, 0, tlen)) {
			x->why = "a bad or second NextContinuationToken";
			return 1;
		}
		x->next = strndup(text, tlen);
		if (!x->next) {
			x->why = "out of memory";
			return 1;
		}
	}
	return 0;
}

int ulp_s3_parse_list(const char *xml, size_t n, const char *prefix,
                      int (*cb)(void *arg, const char *key, uint64_t size), void *arg, int *truncated,
                      char **next, ulp_err *e)
{
	struct list_ctx x = {.prefix = prefix ? prefix : ""};
	xml_ev ev = {list_open, list_close, &x};
	int rc = xml_walk(xml, n, &ev);
	*next = NULL;
	*truncated = 0;
	if (rc == 0 && !x.has_truncated) {
		x.why = "no IsTruncated";
		rc = 1;
	}
	if (rc == 0 && x.truncated && !x.next) {
		x.why = "truncated without a NextContinuationToken";
		rc = 1;
	}
	if (rc != 0) {
		rc = ULP_ERR(e, -ULP_E_CORRUPT, "malformed ListObjectsV2 answer: %s",
		             x.why ? x.why : "not well-formed XML");
		free(x.next);
		x.next = NULL;
	}
	for (size_t i = 0; i < x.n; i++) {
		if (rc == 0)
			rc = cb(arg, x.ents[i].key, x.ents[i].size);
		free(x.ents[i].key);
	}
	free(x.ents);
	free(x.key);
	if (rc == 0) {
		*truncated = x.truncated;
		*next = x.next;
	} else {
		free(x.next);
	}
	return rc;
}

/* ---- INI files (AWS credentials and config) ------------------------------ */
static void trim(const char **s, const char **e)
{
	while (*s < *e && isspace((unsigned char)**s))
		(*s)++;
	while (*e > *s && isspace((unsigned char)(*e)[-1]))
		(*e)--;
}

int ulp_s3_ini_get(const char *text, size_t n, const char *section, const char *key, char **out)
{
	const char *p = text, *end = text + n;
	int in = 0;
	*out = NULL;
	while (p < end) {
		const char *le = memchr(p, '\n', (size_t)(end - p));
		if (!le)
			le = end;
		const char *s = p, *e = le;
		int indented = s < e && (*s == ' ' || *s == '\t');
		p = le < end ? le + 1 : end;
		trim(&s, &e);
		if (s == e || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			if (e[-1] != ']') {
				in = 0;
				continue;
			}
			s++;
			e--;
			trim(&s, &e);
			in = (size_t)(e - s) == strlen(section) && memcmp(s, section, (size_t)(e - s)) == 0;
			continue;
		}
		if (!in || indented) /* indented: a nested key ("s3 =\n  endpoint_url = ...") */
			continue;
		const char *eq = memchr(s, '=', (size_t)(e - s));
		if (!eq)
			continue;
		const char *ks = s, *ke = eq, *vs = eq + 1, *ve = e;
		trim(&ks, &ke);
		trim(&vs, &ve);
		if ((size_t)(ke - ks) == strlen(key) && strncasecmp(ks, key, (size_t)(ke - ks)) == 0) {
			if (vs == ve)
				return 0; /* "s3 =" opens a nested block: no value */
			*out = strndup(vs, (size_t)(ve - vs));
			return *out ? 1 : -ULP_E_NOMEM;
		}
	}
	return 0;
}

static char *read_small(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char *b = malloc((1u << 20) + 1);
	size_t n = b ? fread(b, 1, 1u << 20, f) : 0;
	fclose(f);
	if (b)
		b[n] = 0;
	return b;
}

static char *aws_path(const char *env, const char *leaf)
{
	const char *v = getenv(env), *home = getenv("HOME");
	char *p;
	if (v && *v)
		return strdup(v);
	if (!home || !*home)
		return NULL;
	if (asprintf(&p, "%s/.aws/%s", home, leaf) < 0)
		return NULL;
	return p;
}

static const char *envs(const char *a, const char *b)
{
	const char *v = getenv(a);
	if (v && *v)
		return v;
	v = b ? getenv(b) : NULL;
	return v && *v ? v : NULL;
}

/* the profile's key in the config file ([profile NAME], [default]) */
static int conf_get(const char *cfg, const char *profile, const char *key, char **out)
{
	char sect[300];
	*out = NULL;
	if (!cfg)
		return 0;
	snprintf(sect, sizeof(sect), "profile %s", profile);
	int rc = ulp_s3_ini_get(cfg, strlen(cfg), sect, key, out);
	if (rc == 0 && strcmp(profile, "default") == 0)
		rc = ulp_s3_ini_get(cfg, strlen(cfg), "default", key, out);
	return rc;
}

void ulp_s3_conf_free(ulp_s3_conf *c)
{
	if (!c)
		return;
	free(c->endpoint);
	free(c->region);
	if (c->secret_key)
		memset(c->secret_key, 0, strlen(c->secret_key));
	if (c->session_token)
		memset(c->session_token, 0, strlen(c->session_token));
	free(c->access_key);
	free(c->secret_key);
	free(c->session_token);
	free(c->ca_bundle);
	memset(c, 0, sizeof(*c));
}

int ulp_s3_conf_load(ulp_s3_conf *c, const char *profile, ulp_err *e)
{
	char *credp = aws_path("AWS_SHARED_CREDENTIALS_FILE", "credentials");
	char *cfgp = aws_path("AWS_CONFIG_FILE", "config");
	char *cred = credp ? read_small(credp) : NULL, *cfg = cfgp ? read_small(cfgp) : NULL;
	int rc = 0;
	memset(c, 0, sizeof(*c));
	if (!profile || !*profile)
		profile = envs("AWS_PROFILE", NULL);
	if (!profile)
		profile = "default";
	if (strlen(profile) > 256 || strpbrk(profile, "[]\n")) {
		rc = ULP_ERR(e, -ULP_E_INVAL, "AWS profile name '%.64s' is not valid", profile);
		goto out;
	}
#define TRY(x) do { if ((rc = (x)) < 0) goto nomem; } while (0)
	/* credentials: the environment as a pair, else the profile */
	if (envs("AWS_ACCESS_KEY_ID", NULL) && envs("AWS_SECRET_ACCESS_KEY", NULL)) {
		TRY(sdup(&c->access_key, envs("AWS_ACCESS_KEY_ID", NULL)));
		TRY(sdup(&c->secret_key, envs("AWS_SECRET_ACCESS_KEY", NULL)));
		TRY(sdup(&c->session_token, envs("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")));
	} else {
		static const char *const names[3] = {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"};
		char **dst[3] = {&c->access_key, &c->secret_key, &c->session_token};
		for (int i = 0; i < 3; i++) {
			if (cred)
				TRY(ulp_s3_ini_get(cred, strlen(cred), profile, names[i], dst[i]));
			if (!*dst[i])
				TRY(conf_get(cfg, profile, names[i], dst[i]));
		}
	}
	if (envs("AWS_REGION", "AWS_DEFAULT_REGION")) {
		TRY(sdup(&c->region, envs("AWS_REGION", "AWS_DEFAULT_REGION")));
	} else {
		TRY(conf_get(cfg, profile, "region", &c->region));
		if (!c->region)
			TRY(sdup(&c->region, "us-east-1"));
	}
	if (envs("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")) {
		TRY(sdup(&c->endpoint, envs("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")));
	} else {
		TRY(conf_get(cfg, profile, "endpoint_url", &c->endpoint));
		if (!c->endpoint && asprintf(&c->endpoint, "https://s3.%s.amazonaws.com", c->region) < 0) {
			c->endpoint = NULL;
			goto nomem;
		}
	}
	if (envs("AWS_CA_BUNDLE", NULL))
		TRY(sdup(&c->ca_bundle, envs("AWS_CA_BUNDLE", NULL)));
	else
		TRY(conf_get(cfg, profile, "ca_bundle", &c->ca_bundle));
#undef TRY
	/* the numbers (s3.h): tries, and the time limits in seconds */
	{
		char *ma = NULL;
		const char *v = envs("AWS_MAX_ATTEMPTS", NULL);
		if (!v && conf_get(cfg, profile, "max_attempts", &ma) < 0)
			goto nomem;
		if (!v)
			v = ma;
		long n = 0;
		char *end = NULL;
		if (v)
			n = strtol(v, &end, 10);
		int bad = v && (end == v || *end || n < 1 || n > 100);
		if (!bad && v)
			c->max_tries = (int)n;
		free(ma);
		if (bad) {
			rc = ULP_ERR(e, -ULP_E_INVAL, "AWS_MAX_ATTEMPTS (or max_attempts) '%.32s' is not a number of tries "
			             "from 1 to 100", v);
			goto out;
		}
		static const char *const names[3] = {"ULPACK_S3_CONNECT_TIMEOUT", "ULPACK_S3_STALL_TIMEOUT",
		                                      "ULPACK_S3_TIMEOUT"};
		for (int i = 0; i < 3; i++) {
			if (!(v = envs(names[i], NULL)))
				continue;
			double d = strtod(v, &end);
			if (end == v || *end || !(d > 0) || d > 86400) {
				rc = ULP_ERR(e, -ULP_E_INVAL, "%s '%.32s' is not a number of seconds (more than 0, at most 86400)", names[i], v);
				goto out;
			}
			unsigned ms = (unsigned)(d * 1000 + 0.5);
			if (i == 0)
				c->connect_timeout_ms = ms ? ms : 1;
			else if (i == 1)
				c->stall_s = ms < 1000 ? 1 : (ms + 999) / 1000;
			else
				c->deadline_ms = ms ? ms : 1;
		}
	}
	if (!c->access_key || !c->secret_key) {
		rc = ULP_ERR(e, -ULP_E_INVAL,
		             "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give profile '%s' "
		             "aws_access_key_id and aws_secret_access_key in %s",
		             profile, credp ? credp : "~/.aws/credentials");
		goto out;
	}
	rc = 0;
	goto out;
nomem:
	rc = ULP_ERR(e, -ULP_E_NOMEM, "S3 configuration: out of memory");
out:
	if (rc < 0)
		ulp_s3_conf_free(c);
	free(cred);
	free(cfg);
	free(credp);
	free(cfgp);
	return rc;
}

/* ---- the client ----------------------------------------------------------- */
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static int bucket_ok(const char *b)
{
	size_t n = strlen(b);
	if (n < 3 || n > 63)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!(islower((unsigned char)b[i]) || isdigit((unsigned char)b[i]) || b[i] == '.' || b[i] == '-'))
			return 0;
	return 1;
}

int ulp_s3_open(const ulp_s3_conf *c, const char *bucket, ulp_s3 **out, ulp_err *e)
{
	*out = NULL;
	if (!bucket || !bucket_ok(bucket))
		return ULP_ERR(e, -ULP_E_INVAL, "S3 bucket name '%.80s' is not valid (3-63 of a-z 0-9 . -)",
		               bucket ? bucket : "");
	if (!c->endpoint || (strncmp(c->endpoint, "http://", 7) != 0 && strncmp(c->endpoint, "https://", 8) != 0))
		return ULP_ERR(e, -ULP_E_INVAL, "S3 endpoint '%.200s' is not an http:// or https:// URL",
		               c->endpoint ? c->endpoint : "");
	if (!c->access_key || !c->secret_key)
		return ULP_ERR(e, -ULP_E_INVAL, "no S3 credentials");
	if (!c->region || !*c->region || strpbrk(c->region, ":/ \n"))
		return ULP_ERR(e, -ULP_E_INVAL, "S3 region '%.64s' is not valid", c->region ? c->region : "");
	pthread_once(&curl_once, curl_init);
	if (curl_init_rc != CURLE_OK)
		return ULP_ERR(e, -ULP_E_IO, "curl_global_init: %s", curl_easy_strerror(curl_init_rc));
	ulp_s3 *s = calloc(1, sizeof(*s));
	if (!s)
		return ULP_ERR(e, -ULP_E_NOMEM, "S3 client: out of memory");
	pthread_mutex_init(&s->lock, NULL);
	s->c = *c;
	s->c.endpoint = xstrdup(c->endpoint);
	s->c.region = xstrdup(c->region);
	s->c.access_key = xstrdup(c->access_key);
	s->c.secret_key = xstrdup(c->secret_key);
	s->c.session_token = xstrdup(c->session_token);
	s->c.ca_bundle = xstrdup(c->ca_bundle);
	s->bucket = strdup(bucket);
	if (asprintf(&s->sigv4, "aws:amz:%s:s3", c->region) < 0)
		s->sigv4 = NULL;
	if (!s->c.endpoint || !s->c.region || !s->c.access_key || !s->c.secret_key || !s->bucket || !s->sigv4 ||
	    (c->session_token && !s->c.session_token) || (c->ca_bundle && !s->c.ca_bundle)) {
		ulp_s3_close(s);
		return ULP_ERR(e, -ULP_E_NOMEM, "S3 client: out of memory");
	}
	size_t el = strlen(s->c.endpoint);
	while (el > 0 && s->c.endpoint[el - 1] == '/')
		s->c.endpoint[--el] = 0;
	if (s->c.max_tries <= 0)
		s->c.max_tries = 5;
	if (!s->c.backoff_ms)
		s->c.backoff_ms = 100;
	if (!s->c.connect_timeout_ms)
		s->c.connect_timeout_ms = 10000;
	if (!s->c.stall_s)
		s->c.stall_s = 15;
	if (!s->c.deadline_ms)
		s->c.deadline_ms = 60000;
	if (!s->c.multipart_threshold)
		s->c.multipart_threshold = 64ull << 20;
	if (!s->c.part_size)
		s->c.part_size = 16ull << 20;
	if (s->c.part_size < S3_PART_MIN)
		s->c.part_size = S3_PART_MIN;
	*out = s;
	return 0;
}

void ulp_s3_close(ulp_s3 *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->npool; i++)
		curl_easy_cleanup(s->pool[i]);
	pthread_mutex_destroy(&s->lock);
	ulp_s3_conf_free(&s->c);
	free(s->bucket);
	free(s->sigv4);
	free(s);
}

static CURL *handle_get(ulp_s3 *s)
{
	CURL *h = NULL;
	pthread_mutex_lock(&s->lock);
	if (s->npool > 0)
		h = s->pool[--s->npool];
	pthread_mutex_unlock(&s->lock);
	if (h)
		curl_easy_reset(h);
	else
		h = curl_easy_init();
	return h;
}

static void handle_put(ulp_s3 *s, CURL *h)
{
	pthread_mutex_lock(&s->lock);
	if (s->npool < S3_POOL) {
		s->pool[s->npool++] = h;
		h = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	if (h)
		curl_easy_cleanup(h);
}

/* ---- one request, with its retries ------------------------------------------ */
typedef struct s3_req {
	const char *op;     /* for messages */
	const char *method; /* GET PUT HEAD DELETE POST */
	const char *key;    /* NULL: the bucket */
	const char *query;  /* canonical (sorted, encoded), or NULL */
	/* the body: up_buf, or up_fd from up_off; up_len bytes */
	const uint8_t *up_buf;
	int up_fd;
	uint64_t up_off, up_len, up_pos;
	int has_body;
	char sha[65]; /* the body's hex SHA-256 */
	const char *if_match;
	int if_none_match;
	/* a range GET into out */
	int ranged;
	uint64_t r_off;
	uint8_t *out;
	size_t out_cap, out_len;
	int out_over;
	dbuf body; /* an XML answer or an error's */
	/* the answer */
	long status;
	char etag[ULP_S3_ETAG_MAX];
	uint64_t clen;
	int has_clen;
	char crange[96];
	int tries; /* how many were made */
	int maybe_done; /* a try failed in a way the store may have acted on */
	int64_t next_check_ms; /* monotonic: the next ask of the interrupt check */
	int intr;              /* the interrupt check said stop */
} s3_req;

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* libcurl's progress callback: the thread's interrupt check, at most every
 * 100 ms (non-zero: the transfer ends, CURLE_ABORTED_BY_CALLBACK) */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	s3_req *r = arg;
	(void)dt, (void)dn, (void)ut, (void)un;
	int64_t now = mono_ms();
	if (now < r->next_check_ms)
		return 0;
	r->next_check_ms = now + 100;
	if (ulp_interrupted())
		r->intr = 1;
	return r->intr;
}

static size_t on_write(char *p, size_t sz, size_t nm, void *arg)
{
	s3_req *r = arg;
	size_t n = sz * nm;
	if (r->status >= 200 && r->status < 300 && r->out) {
		if (n > r->out_cap - r->out_len) {
			r->out_over = 1;
			return 0; /* more than asked for: abort, never write past */
		}
		memcpy(r->out + r->out_len, p, n);
		r->out_len += n;
		return n;
	}
	if (r->status < 200 || r->status >= 300) {
		/* an error's text: keep the head of it */
		size_t room = r->body.max - r->body.len;
		if (room && dbuf_add(&r->body, p, n < room ? n : room))
			return 0;
		return n;
	}
	if (!r->body.max)
		return n; /* an answer nobody reads */
	return dbuf_add(&r->body, p, n) ? 0 : n;
}

static void hdr_value(const char *p, size_t n, const char *name, char *out, size_t cap)
{
	size_t nl = strlen(name);
	if (n <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
		return;
	const char *s = p + nl + 1, *e = p + n;
	trim(&s, &e);
	size_t k = (size_t)(e - s) < cap - 1 ? (size_t)(e - s) : cap - 1;
	memcpy(out, s, k);
	out[k] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *arg)
{
	s3_req *r = arg;
	size_t n = sz * nm;
	if (n >= 5 && memcmp(p, "HTTP/", 5) == 0) { /* a new answer (after 100 Continue, too) */
		r->etag[0] = 0;
		r->crange[0] = 0;
		r->has_clen = 0;
		const char *sp = memchr(p, ' ', n);
		r->status = sp ? strtol(sp + 1, NULL, 10) : 0;
		return n;
	}
	hdr_value(p, n, "etag", r->etag, sizeof(r->etag));
	hdr_value(p, n, "content-range", r->crange, sizeof(r->crange));
	char cl[32] = "";
	hdr_value(p, n, "content-length", cl, sizeof(cl));
	if (cl[0] && parse_u64(cl, strlen(cl), &r->clen) == 0)
		r->has_clen = 1;
	return n;
}

static size_t on_read(char *p, size_t sz, size_t nm, void *arg)
{
	s3_req *r = arg;
	size_t n = sz * nm;
	uint64_t left = r->up_len - r->up_pos;
	if (n > left)
		n = (size_t)left;
	if (!n)
		return 0;
	if (r->up_buf) {
		memcpy(p, r->up_buf + r->up_pos, n);
	} else {
		ssize_t got;
		do
			got = pread(r->up_fd, p, n, (off_t)(r->up_off + r->up_pos));
		while (got < 0 && errno == EINTR);
		if (got <= 0)
			return CURL_READFUNC_ABORT;
		n = (size_t)got;
	}
	r->up_pos += n;
	return n;
}

static int on_seek(void *arg, curl_off_t off, int origin)
{
	s3_req *r = arg;
	if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->up_len)
		return CURL_SEEKFUNC_CANTSEEK;
	r->up_pos = (uint64_t)off;
	return CURL_SEEKFUNC_OK;
}

int ulp_s3_status_err(long st)
{
	if (st >= 200 && st < 300)
		return 0;
	if (st >= 500 || st == 429 || st == 408)
		return 1; /* worth another try */
	switch (st) {
	case 404: return -ULP_E_NOENT;
	case 412: return -ULP_E_EXIST;
	case 416: return -ULP_E_CORRUPT;
	case 409: return -ULP_E_BUSY;
	default: return -ULP_E_INVAL;
	}
}

static int curl_transient(CURLcode cc)
{
	switch (cc) {
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
	case CURLE_SSL_CONNECT_ERROR:
		return 1;
	default:
		return 0;
	}
}

static char *req_url(ulp_s3 *s, const s3_req *r)
{
	char *k = NULL, *u = NULL;
	if (r->key && !(k = ulp_s3_uri_encode(r->key, strlen(r->key), 1)))
		return NULL;
	if (asprintf(&u, "%s/%s%s%s%s%s", s->c.endpoint, s->bucket, k ? "/" : "", k ? k : "", r->query ? "?" : "",
	             r->query ? r->query : "") < 0)
		u = NULL;
	free(k);
	return u;
}

/* the headers of invariant 2, the session token and the conditions */
static struct curl_slist *req_headers(ulp_s3 *s, const char *sha, const char *if_match, int if_none_match)
{
	struct curl_slist *l = NULL, *n;
	char line[ULP_S3_ETAG_MAX + 64];
	snprintf(line, sizeof(line), "x-amz-content-sha256: %s", sha);
	if (!(l = curl_slist_append(l, line)))
		return NULL;
	if (s->c.session_token) {
		char *t = NULL;
		if (asprintf(&t, "x-amz-security-token: %s", s->c.session_token) < 0)
			goto bad;
		n = curl_slist_append(l, t);
		memset(t, 0, strlen(t));
		free(t);
		if (!n)
			goto bad;
	}
	if (if_none_match && !curl_slist_append(l, "If-None-Match: *"))
		goto bad;
	if (if_match) {
		snprintf(line, sizeof(line), "If-Match: %s", if_match);
		if (!curl_slist_append(l, line))
			goto bad;
	}
	return l;
bad:
	curl_slist_free_all(l);
	return NULL;
}

int ulp_s3_debug_headers(ulp_s3 *s, const char *payload_hash, const char *if_match, int if_none_match,
                         char *out, size_t cap)
{
	struct curl_slist *l = req_headers(s, payload_hash, if_match, if_none_match);
	size_t k = 0;
	if (!l)
		return -ULP_E_NOMEM;
	out[0] = 0;
	for (struct curl_slist *i = l; i; i = i->next) {
		int w = strncasecmp(i->data, "x-amz-security-token:", 21) == 0
		            ? snprintf(out + k, cap - k, "x-amz-security-token: (set)\n")
		            : snprintf(out + k, cap - k, "%s\n", i->data);
		if (w < 0 || (size_t)w >= cap - k)
			break;
		k += (size_t)w;
	}
	curl_slist_free_all(l);
	return 0;
}

/* A pause of ms, in slices that ask the interrupt check: 1 if it said stop. */
static int pause_ms(unsigned ms)
{
	for (;;) {
		if (ulp_interrupted())
			return 1;
		if (!ms)
			return 0;
		unsigned step = ms < 50 ? ms : 50;
		struct timespec ts = {0, (long)step * 1000000L};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
		ms -= step;
	}
}

/* "s3://bucket/key" for messages */
static void where(ulp_s3 *s, const s3_req *r, char *out, size_t cap)
{
	snprintf(out, cap, "s3://%s%s%.300s", s->bucket, r->key ? "/" : "", r->key ? r->key : "");
}

static int req_run(ulp_s3 *s, s3_req *r, ulp_err *e)
{
	char w[400], errbuf[CURL_ERROR_SIZE];
	CURL *h = handle_get(s);
	char *url = req_url(s, r);
	struct curl_slist *hd = req_headers(s, r->sha, r->if_match, r->if_none_match);
	int rc = 0;
	unsigned pause = s->c.backoff_ms;
	where(s, r, w, sizeof(w));
	if (!h || !url || !hd) {
		rc = ULP_ERR(e, -ULP_E_NOMEM, "%s: %s: out of memory", w, r->op);
		goto out;
	}
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
	curl_easy_setopt(h, CURLOPT_USERNAME, s->c.access_key);
	curl_easy_setopt(h, CURLOPT_PASSWORD, s->c.secret_key);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
	curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->c.connect_timeout_ms);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
	curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)s->c.stall_s);
	curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(h, CURLOPT_XFERINFODATA, r);
	if (s->c.ca_bundle)
		curl_easy_setopt(h, CURLOPT_CAINFO, s->c.ca_bundle);
	if (s->c.max_recv_speed)
		curl_easy_setopt(h, CURLOPT_MAX_RECV_SPEED_LARGE, (curl_off_t)s->c.max_recv_speed);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	if (strcmp(r->method, "HEAD") == 0) {
		curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
	} else if (strcmp(r->method, "PUT") == 0) {
		curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(h, CURLOPT_READDATA, r);
		curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
		curl_easy_setopt(h, CURLOPT_SEEKDATA, r);
		curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->up_len);
	} else if (strcmp(r->method, "POST") == 0) {
		curl_easy_setopt(h, CURLOPT_POST, 1L);
		curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)r->up_len);
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, r->up_buf ? (const char *)r->up_buf : "");
	} else if (strcmp(r->method, "GET") != 0) {
		curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, r->method);
	}
	char range[64];
	if (r->ranged) {
		snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)r->r_off,
		         (unsigned long long)(r->r_off + r->out_cap - 1));
		curl_easy_setopt(h, CURLOPT_RANGE, range);
	}
	/* the deadline: the configured time, and a second more per MiB moved */
	uint64_t moved = r->ranged ? r->out_cap : r->up_len;
	int64_t start = mono_ms(), deadline = start + (int64_t)s->c.deadline_ms + (int64_t)(moved >> 20) * 1000;
	r->next_check_ms = 0;
	r->intr = 0;
	for (r->tries = 1;; r->tries++) {
		int64_t left = deadline - mono_ms();
		curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(left > 1 ? left : 1));
		r->status = 0;
		r->out_len = 0;
		r->out_over = 0;
		r->body.len = 0;
		r->body.over = 0;
		r->up_pos = 0;
		r->etag[0] = 0;
		r->crange[0] = 0;
		r->has_clen = 0;
		errbuf[0] = 0;
		CURLcode cc = curl_easy_perform(h);
		long st = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
		char code[64] = "";
		int cls;
		if (cc == CURLE_OK) {
			r->status = st;
			cls = ulp_s3_status_err(st);
			if (cls == 0)
				break;
			if (r->body.len)
				(void)ulp_s3_xml_child(r->body.p, r->body.len, "Code", code, sizeof(code));
			for (char *c = code; *c; c++) /* what the store wrote: printable only */
				if (!isalnum((unsigned char)*c))
					*c = '?';
			if (cls < 0) {
				const char *why = st == 401 || st == 403 ? ": access denied: check the credentials and the region"
				                  : st == 412 ? ": the condition failed"
				                  : st == 404 ? ": no such key or bucket"
				                  : st == 416 ? ": the range is past the object's end"
				                              : "";
				rc = ULP_ERR(e, cls, "%s: %s: HTTP %ld%s%s%s", w, r->op, st, code[0] ? " " : "", code, why);
				goto out;
			}
			r->maybe_done = 1;
		} else if (cc == CURLE_ABORTED_BY_CALLBACK && r->intr) {
			rc = ULP_ERR(e, -ULP_E_INTR, "%s: %s: interrupted", w, r->op);
			goto out;
		} else if (r->out_over || r->body.over) {
			rc = ULP_ERR(e, -ULP_E_CORRUPT, "%s: %s: the answer is longer than asked for", w, r->op);
			goto out;
		} else if (!curl_transient(cc)) {
			rc = ULP_ERR(e, -ULP_E_IO, "%s: %s: %s", w, r->op, errbuf[0] ? errbuf : curl_easy_strerror(cc));
			goto out;
		} else if (cc != CURLE_COULDNT_CONNECT && cc != CURLE_COULDNT_RESOLVE_HOST) {
			r->maybe_done = 1;
		}
		/* a pause of 50-100% of the backoff, so that clients spread out */
		unsigned wait = pause / 2 + (unsigned)(((uint64_t)rand() * (pause / 2 + 1)) / ((uint64_t)RAND_MAX + 1));
		int64_t now = mono_ms();
		int late = now + (int64_t)wait >= deadline;
		if (r->tries >= s->c.max_tries || late) {
			char why[96];
			snprintf(why, sizeof(why), "after %d tries in %.1f s%s", r->tries, (double)(now - start) / 1000,
			         late ? " (its deadline: ULPACK_S3_TIMEOUT)" : "");
			if (cc == CURLE_OK)
				rc = ULP_ERR(e, -ULP_E_IO, "%s: %s: HTTP %ld%s%s %s", w, r->op, st, code[0] ? " " : "", code,
				             why);
			else
				rc = ULP_ERR(e, -ULP_E_IO, "%s: %s: %s (%s) %s", w, r->op,
				             errbuf[0] ? errbuf : curl_easy_strerror(cc), s->c.endpoint, why);
			goto out;
		}
		if (pause_ms(wait)) {
			rc = ULP_ERR(e, -ULP_E_INTR, "%s: %s: interrupted (between tries)", w, r->op);
			goto out;
		}
		pause = pause >= 2500 ? 5000 : pause * 2;
	}
out:
	curl_slist_free_all(hd);
	free(url);
	if (h) {
		curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
		handle_put(s, h);
	}
	return rc;
}

static int key_ok(ulp_s3 *s, const char *key, ulp_err *e)
{
	size_t n = key ? strlen(key) : 0;
	if (n == 0 || n > S3_KEY_MAX)
		return ULP_ERR(e, -ULP_E_INVAL, "s3://%s: an S3 key must be 1-1024 bytes", s->bucket);
	return 0;
}

/* ---- operations ---------------------------------------------------------------- */
#define EMPTY_SHA "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

int ulp_s3_bucket_create(ulp_s3 *s, ulp_err *e)
{
	s3_req r = {.op = "create bucket", .method = "PUT", .body.max = S3_ERRBODY_MAX};
	char *xml = NULL;
	int rc;
	if (strcmp(s->c.region, "us-east-1") != 0) {
		if (asprintf(&xml, "<CreateBucketConfiguration><LocationConstraint>%s</LocationConstraint>"
		                   "</CreateBucketConfiguration>", s->c.region) < 0)
			return ULP_ERR(e, -ULP_E_NOMEM, "s3://%s: out of memory", s->bucket);
		r.up_buf = (const uint8_t *)xml;
		r.up_len = strlen(xml);
	}
	if ((rc = digest_hex(EVP_sha256(), xml ? xml : "", r.up_len, r.sha)) < 0) {
		free(xml);
		return ULP_ERR(e, rc, "s3://%s: SHA-256 failed", s->bucket);
	}
	rc = req_run(s, &r, e);
	if (rc == -ULP_E_BUSY && r.body.len) {
		char code[64];
		if (ulp_s3_xml_child(r.body.p, r.body.len, "Code", code, sizeof(code)) == 1 &&
		    strcmp(code, "BucketAlreadyOwnedByYou") == 0)
			rc = 0;
	}
	free(r.body.p);
	free(xml);
	return rc;
}

static int put_one(ulp_s3 *s, const char *key, const uint8_t *p, int fd, uint64_t off, uint64_t len,
                   const char *query, const char *if_match, int if_none_match, char *etag_out, int *maybe_done,
                   ulp_err *e)
{
	s3_req r = {.op = "PUT", .method = "PUT", .key = key, .query = query, .up_buf = p, .up_fd = fd,
	            .up_off = off, .up_len = len, .if_match = if_match, .if_none_match = if_none_match,
	            .body.max = S3_ERRBODY_MAX};
	int rc = p ? digest_hex(EVP_sha256(), p, (size_t)len, r.sha) : fd_sha256_hex(fd, off, len, r.sha);
	if (rc < 0)
		return ULP_ERR(e, rc, "s3://%s/%s: PUT: %s of the body failed", s->bucket, key,
		               rc == -ULP_E_NOMEM ? "SHA-256" : "reading the file for the SHA-256");
	if (query)
		r.op = "PUT part";
	rc = req_run(s, &r, e);
	if (maybe_done)
		*maybe_done = r.maybe_done;
	if (rc == 0 && etag_out)
		snprintf(etag_out, ULP_S3_ETAG_MAX, "%s", r.etag);
	free(r.body.p);
	return rc;
}

static int etag_ok(const char *t)
{
	if (!*t)
		return 0;
	for (; *t; t++)
		if ((unsigned char)*t < 0x20 || *t == '<' || *t == '&' || (unsigned char)*t >= 0x7f)
			return 0;
	return 1;
}

/* multipart upload of p (or fd) */
static int put_multi(ulp_s3 *s, const char *key, const uint8_t *p, int fd, uint64_t len, ulp_err *e)
{
	uint64_t psz = s->c.part_size;
	uint64_t nparts = (len + psz - 1) / psz;
	char upload[S3_TOKEN_MAX + 1], *enc = NULL, *q = NULL;
	dbuf parts = {.max = SIZE_MAX / 2};
	s3_req c;
	int rc;
	while (nparts > S3_PARTS_MAX) {
		psz *= 2;
		nparts = (len + psz - 1) / psz;
	}
	s3_req r = {.op = "start multipart upload", .method = "POST", .key = key, .query = "uploads=",
	            .body.max = S3_XML_MAX};
	memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
	rc = req_run(s, &r, e);
	if (rc == 0) {
		int f = r.body.len ? xml_root_child(r.body.p, r.body.len, "InitiateMultipartUploadResult", "UploadId",
		                                    upload, sizeof(upload))
		                   : -ULP_E_CORRUPT;
		if (f != 1 || !upload[0] || strlen(upload) >= S3_TOKEN_MAX)
			rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: start multipart upload: no UploadId in the answer",
			             s->bucket, key);
	}
	free(r.body.p);
	if (rc < 0)
		return rc;
	if (!(enc = ulp_s3_uri_encode(upload, strlen(upload), 0))) {
		rc = ULP_ERR(e, -ULP_E_NOMEM, "s3://%s/%s: out of memory", s->bucket, key);
		goto abort;
	}
	if (dbuf_add(&parts, "<CompleteMultipartUpload>", 25))
		goto nomem;
	for (uint64_t i = 0; i < nparts; i++) {
		uint64_t off = i * psz, n = len - off < psz ? len - off : psz;
		char etag[ULP_S3_ETAG_MAX], line[ULP_S3_ETAG_MAX + 80];
		free(q);
		if (asprintf(&q, "partNumber=%llu&uploadId=%s", (unsigned long long)(i + 1), enc) < 0) {
			q = NULL;
			goto nomem;
		}
		rc = put_one(s, key, p ? p + off : NULL, fd, p ? 0 : off, n, q, NULL, 0, etag, NULL, e);
		if (rc < 0)
			goto abort;
		if (!etag_ok(etag)) {
			rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: part %llu: no usable ETag in the answer", s->bucket,
			             key, (unsigned long long)(i + 1));
			goto abort;
		}
		int k = snprintf(line, sizeof(line), "<Part><PartNumber>%llu</PartNumber><ETag>%s</ETag></Part>",
		                 (unsigned long long)(i + 1), etag);
		if (dbuf_add(&parts, line, (size_t)k))
			goto nomem;
	}
	if (dbuf_add(&parts, "</CompleteMultipartUpload>", 26))
		goto nomem;
	free(q);
	if (asprintf(&q, "uploadId=%s", enc) < 0) {
		q = NULL;
		goto nomem;
	}
	c = (s3_req){.op = "complete multipart upload", .method = "POST", .key = key, .query = q,
	             .up_buf = (const uint8_t *)parts.p, .up_len = parts.len, .body.max = S3_XML_MAX};
	if (digest_hex(EVP_sha256(), parts.p, parts.len, c.sha) < 0)
		goto nomem;
	rc = req_run(s, &c, e);
	if (rc == 0) {
		/* a 200 may still carry an Error (S3 writes it after the headers) */
		char etag[ULP_S3_ETAG_MAX];
		if (!c.body.len || xml_root_child(c.body.p, c.body.len, "CompleteMultipartUploadResult", "ETag", etag,
		                                  sizeof(etag)) < 0) {
			char code[64] = "";
			if (c.body.len)
				(void)ulp_s3_xml_child(c.body.p, c.body.len, "Code", code, sizeof(code));
			for (char *t = code; *t; t++)
				if (!isalnum((unsigned char)*t))
					*t = '?';
			rc = ULP_ERR(e, -ULP_E_IO, "s3://%s/%s: complete multipart upload failed%s%s", s->bucket, key,
			             code[0] ? ": " : "", code);
		}
	}
	free(c.body.p);
	if (rc == 0)
		goto out;
	goto abort;
nomem:
	rc = ULP_ERR(e, -ULP_E_NOMEM, "s3://%s/%s: out of memory", s->bucket, key);
abort:
	if (enc) {
		/* the parts uploaded so far go; a failure here is not reported */
		free(q);
		q = NULL;
		if (asprintf(&q, "uploadId=%s", enc) >= 0) {
			s3_req a = {.op = "abort multipart upload", .method = "DELETE", .key = key, .query = q,
			            .body.max = S3_ERRBODY_MAX};
			memcpy(a.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
			(void)req_run(s, &a, NULL);
			free(a.body.p);
		} else {
			q = NULL;
		}
	}
out:
	free(parts.p);
	free(q);
	free(enc);
	return rc;
}

int ulp_s3_put(ulp_s3 *s, const char *key, const void *p, size_t len, ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	if (len > s->c.multipart_threshold)
		return put_multi(s, key, p, -1, len, e);
	return put_one(s, key, p, -1, 0, len, NULL, NULL, 0, NULL, NULL, e);
}

int ulp_s3_put_file(ulp_s3 *s, const char *key, int fd, uint64_t len, ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	if (len > s->c.multipart_threshold)
		return put_multi(s, key, NULL, fd, len, e);
	return put_one(s, key, NULL, fd, 0, len, NULL, NULL, 0, NULL, NULL, e);
}

/* the ETag without its quotes (and a W/ prefix) into out */
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

int ulp_s3_put_cond(ulp_s3 *s, const char *key, const void *p, size_t len, const char *if_match,
                    char etag[ULP_S3_ETAG_MAX], ulp_err *e)
{
	char bare[ULP_S3_ETAG_MAX], quoted[ULP_S3_ETAG_MAX + 2];
	int maybe = 0, rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	if (if_match) {
		etag_bare(if_match, bare, sizeof(bare));
		if (!etag_ok(bare) || strchr(bare, '"'))
			return ULP_ERR(e, -ULP_E_INVAL, "s3://%s/%s: conditional PUT: ETag '%.64s' is not valid", s->bucket,
			               key, if_match);
		snprintf(quoted, sizeof(quoted), "\"%s\"", bare);
	}
	/* RGW 16.2 matches If-Match only against the bare ETag, others want it
	 * quoted as HEAD gives it: bare first, then quoted after a 412 */
	rc = put_one(s, key, p, -1, 0, len, NULL, if_match ? bare : NULL, !if_match, etag, &maybe, e);
	if (rc == -ULP_E_EXIST && if_match) {
		int m2 = 0;
		rc = put_one(s, key, p, -1, 0, len, NULL, quoted, 0, etag, &m2, e);
		maybe |= m2;
	}
	if (rc == -ULP_E_EXIST && maybe) {
		/* invariant 4: did an earlier try of ours land? */
		char md5[33], cur[ULP_S3_ETAG_MAX], cb[ULP_S3_ETAG_MAX];
		if (digest_hex(EVP_md5(), p, len, md5) == 0 && ulp_s3_head(s, key, NULL, cur, NULL) == 0) {
			etag_bare(cur, cb, sizeof(cb));
			if (strcmp(cb, md5) == 0) {
				if (etag)
					snprintf(etag, ULP_S3_ETAG_MAX, "%s", cur);
				rc = 0;
			}
		}
	}
	return rc;
}

int ulp_s3_get_range(ulp_s3 *s, const char *key, uint64_t off, void *p, size_t len, ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0 || len == 0)
		return rc;
	if (off > UINT64_MAX - len)
		return ULP_ERR(e, -ULP_E_INVAL, "s3://%s/%s: range past 2^64", s->bucket, key);
	s3_req r = {.op = "GET", .method = "GET", .key = key, .ranged = 1, .r_off = off, .out = p, .out_cap = len,
	            .body.max = S3_ERRBODY_MAX};
	memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
	rc = req_run(s, &r, e);
	if (rc == 0) {
		char want[64];
		int k = snprintf(want, sizeof(want), "bytes %llu-%llu/", (unsigned long long)off,
		                 (unsigned long long)(off + len - 1));
		int whole = r.status == 200 && off == 0 && r.has_clen && r.clen == len;
		if (!whole && (r.status != 206 || strncasecmp(r.crange, want, (size_t)k) != 0))
			rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: GET [%llu, %llu): the answer is another range (HTTP %ld%s%s)",
			             s->bucket, key, (unsigned long long)off, (unsigned long long)(off + len), r.status,
			             r.crange[0] ? ", " : "", r.crange);
		else if (r.out_len != len)
			rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: GET [%llu, %llu): %zu bytes came (a short object?)",
			             s->bucket, key, (unsigned long long)off, (unsigned long long)(off + len), r.out_len);
	}
	if (rc < 0 && len)
		memset(p, 0, len); /* nothing half read looks like data */
	free(r.body.p);
	return rc;
}

int ulp_s3_get(ulp_s3 *s, const char *key, void *p, size_t cap, size_t *len, char etag[ULP_S3_ETAG_MAX],
               ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	s3_req r = {.op = "GET", .method = "GET", .key = key, .out = p, .out_cap = cap, .body.max = S3_ERRBODY_MAX};
	memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
	rc = req_run(s, &r, e);
	if (rc == 0 && r.status != 200)
		rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: GET: HTTP %ld, not 200", s->bucket, key, r.status);
	if (rc == 0 && r.has_clen && r.clen != r.out_len)
		rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: GET: %zu bytes came of %llu", s->bucket, key, r.out_len,
		             (unsigned long long)r.clen);
	if (rc == 0) {
		*len = r.out_len;
		if (etag)
			snprintf(etag, ULP_S3_ETAG_MAX, "%s", r.etag);
	}
	free(r.body.p);
	return rc;
}

int ulp_s3_head(ulp_s3 *s, const char *key, uint64_t *size, char etag[ULP_S3_ETAG_MAX], ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	s3_req r = {.op = "HEAD", .method = "HEAD", .key = key};
	memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
	rc = req_run(s, &r, e);
	if (rc == 0 && size && !r.has_clen)
		rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s/%s: HEAD: no Content-Length", s->bucket, key);
	if (rc == 0) {
		if (size)
			*size = r.clen;
		if (etag)
			snprintf(etag, ULP_S3_ETAG_MAX, "%s", r.etag);
	}
	free(r.body.p);
	return rc;
}

int ulp_s3_delete(ulp_s3 *s, const char *key, ulp_err *e)
{
	int rc = key_ok(s, key, e);
	if (rc < 0)
		return rc;
	s3_req r = {.op = "DELETE", .method = "DELETE", .key = key, .body.max = S3_ERRBODY_MAX};
	memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
	rc = req_run(s, &r, e);
	free(r.body.p);
	return rc;
}

int ulp_s3_list(ulp_s3 *s, const char *prefix, unsigned max_keys,
                int (*cb)(void *arg, const char *key, uint64_t size), void *arg, ulp_err *e)
{
	char *pe = ulp_s3_uri_encode(prefix ? prefix : "", prefix ? strlen(prefix) : 0, 0);
	char *token = NULL, *q = NULL, mk[32] = "";
	int rc = 0;
	if (!pe)
		return ULP_ERR(e, -ULP_E_NOMEM, "s3://%s: list: out of memory", s->bucket);
	if (max_keys)
		snprintf(mk, sizeof(mk), "&max-keys=%u", max_keys);
	for (;;) {
		char *te = token ? ulp_s3_uri_encode(token, strlen(token), 0) : NULL;
		free(q);
		/* sorted by name: continuation-token, list-type, max-keys, prefix */
		if ((token && !te) || asprintf(&q, "%s%s%slist-type=2%s&prefix=%s", te ? "continuation-token=" : "",
		                               te ? te : "", te ? "&" : "", mk, pe) < 0) {
			free(te);
			q = NULL;
			rc = ULP_ERR(e, -ULP_E_NOMEM, "s3://%s: list: out of memory", s->bucket);
			break;
		}
		free(te);
		s3_req r = {.op = "list", .method = "GET", .query = q, .body.max = S3_XML_MAX};
		memcpy(r.sha, EMPTY_SHA, sizeof(EMPTY_SHA));
		rc = req_run(s, &r, e);
		if (rc == 0) {
			int trunc = 0;
			char *next = NULL;
			char sub[256];
			ulp_err se = {sub, sizeof(sub)};
			rc = ulp_s3_parse_list(r.body.p ? r.body.p : "", r.body.len, prefix ? prefix : "", cb, arg, &trunc,
			                       &next, &se);
			if (rc < 0)
				rc = ULP_ERR(e, rc, "s3://%s: list '%.200s': %s", s->bucket, prefix ? prefix : "", sub);
			else if (rc == 0 && trunc && token && strcmp(next, token) == 0)
				rc = ULP_ERR(e, -ULP_E_CORRUPT, "s3://%s: list: the store gave the same continuation token again",
				             s->bucket);
			free(token);
			token = next;
			if (rc == 0 && !trunc) {
				free(r.body.p);
				break;
			}
		}
		free(r.body.p);
		if (rc != 0)
			break;
	}
	free(token);
	free(q);
	free(pe);
	return rc;
}
