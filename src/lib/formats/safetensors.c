/* SPDX-License-Identifier: MIT */
/*
 * safetensors.c - a strict reader and a small writer of the safetensors
 * format: u64 LE header length N, N bytes of UTF-8 JSON, then the data.
 *
 * The reader treats the file as hostile: every length, offset and nesting is
 * bounded; any violation is rejected with a message naming the cause. The
 * header bytes are kept verbatim so that the file can be rebuilt exactly.
 *
 * Invariants of a parsed ulp_st:
 *  1. tensors[] is sorted by begin; for each, begin <= end <= data size and
 *     end <= the next tensor's begin (no overlap).
 *  2. For a known dtype, end - begin == product(shape) * dtype size.
 *  3. Names are unique, valid UTF-8, NUL-free.
 */
#include "ulp_int.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ST_HEADER_MAX (100u << 20) /* the reference implementation's limit */
#define ST_DEPTH_MAX 16

struct ulp_st {
	uint8_t *header;        /* 8 + N bytes, verbatim */
	uint64_t data_offset;   /* 8 + N */
	ulp_st_tensor *t;
	size_t n, cap;
};

typedef struct jp {
	const uint8_t *p, *end, *start;
	ulp_err *err;
	int depth;
} jp;

#define JFAIL(j, ...) ULP_CORRUPT((j)->err, __VA_ARGS__)

static void ws(jp *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

static int expect(jp *j, char c)
{
	ws(j);
	if (j->p >= j->end || *j->p != (uint8_t)c)
		return JFAIL(j, "header JSON: expected '%c' at byte %zu", c, (size_t)(j->p - j->start));
	j->p++;
	return 0;
}

/* Validates one UTF-8 sequence at p; returns its length or 0. */
static size_t utf8_len(const uint8_t *p, const uint8_t *end)
{
	uint8_t c = p[0];
	if (c < 0x80)
		return 1;
	size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
	if (n == 0 || c > 0xf4 || (size_t)(end - p) < n)
		return 0;
	for (size_t i = 1; i < n; i++)
		if ((p[i] & 0xc0) != 0x80)
			return 0;
	if (n == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0)))
		return 0; /* overlong or surrogate */
	if (n == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90)))
		return 0;
	return n;
}

static int hexval(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c |= 0x20;
	return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static size_t put_utf8(uint8_t *o, uint32_t cp)
{
	if (cp < 0x80) { o[0] = (uint8_t)cp; return 1; }
	if (cp < 0x800) { o[0] = (uint8_t)(0xc0 | cp >> 6); o[1] = (uint8_t)(0x80 | (cp & 63)); return 2; }
	if (cp < 0x10000) {
		o[0] = (uint8_t)(0xe0 | cp >> 12); o[1] = (uint8_t)(0x80 | (cp >> 6 & 63));
		o[2] = (uint8_t)(0x80 | (cp & 63)); return 3;
	}
	o[0] = (uint8_t)(0xf0 | cp >> 18); o[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
	o[2] = (uint8_t)(0x80 | (cp >> 6 & 63)); o[3] = (uint8_t)(0x80 | (cp & 63));
	return 4;
}

/* Parses a JSON string. If out is not NULL it receives a malloc'd unescaped
 * copy (NUL-terminated; embedded NULs rejected) and *olen its length. */
static int jstring(jp *j, char **out, size_t *olen)
{
	ULP_TRY(expect(j, '"'));
	const uint8_t *s = j->p;
	uint8_t *buf = NULL;
	size_t n = 0;
	if (out) {
		buf = malloc((size_t)(j->end - s) + 1);
		if (!buf)
			return -ULP_E_NOMEM;
	}
	int rc;
	while (1) {
		if (j->p >= j->end) {
			rc = JFAIL(j, "header JSON: unterminated string");
			goto fail;
		}
		uint8_t c = *j->p;
		if (c == '"') {
			j->p++;
			break;
		}
		if (c < 0x20) {
			rc = JFAIL(j, "header JSON: control character in string at byte %zu",
			           (size_t)(j->p - j->start));
			goto fail;
		}
		if (c == '\\') {
			if (j->end - j->p < 2) {
				rc = JFAIL(j, "header JSON: truncated escape");
				goto fail;
			}
			uint8_t e = j->p[1];
			uint32_t cp;
			j->p += 2;
			switch (e) {
			case '"': cp = '"'; break;
			case '\\': cp = '\\'; break;
			case '/': cp = '/'; break;
			case 'b': cp = '\b'; break;
			case 'f': cp = '\f'; break;
			case 'n': cp = '\n'; break;
			case 'r': cp = '\r'; break;
			case 't': cp = '\t'; break;
			case 'u': {
				if (j->end - j->p < 4)
					goto bad_escape;
				cp = 0;
				for (int i = 0; i < 4; i++) {
					int h = hexval(j->p[i]);
					if (h < 0)
						goto bad_escape;
					cp = cp << 4 | (uint32_t)h;
				}
				j->p += 4;
				if (cp >= 0xd800 && cp < 0xdc00) { /* surrogate pair */
					if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u')
						goto bad_escape;
					uint32_t lo = 0;
					for (int i = 0; i < 4; i++) {
						int h = hexval(j->p[2 + i]);
						if (h < 0)
							goto bad_escape;
						lo = lo << 4 | (uint32_t)h;
					}
					if (lo < 0xdc00 || lo > 0xdfff)
						goto bad_escape;
					j->p += 6;
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
				} else if (cp >= 0xdc00 && cp < 0xe000) {
					goto bad_escape;
				}
				break;
			}
			default:
				goto bad_escape;
			}
			if (cp == 0 && out) {
				rc = JFAIL(j, "header JSON: NUL character in a name");
				goto fail;
			}
			if (buf)
				n += put_utf8(buf + n, cp);
			continue;
		bad_escape:
			rc = JFAIL(j, "header JSON: invalid escape at byte %zu", (size_t)(j->p - j->start));
			goto fail;
		}
		size_t l = utf8_len(j->p, j->end);
		if (!l) {
			rc = JFAIL(j, "header JSON: invalid UTF-8 at byte %zu", (size_t)(j->p - j->start));
			goto fail;
		}
		if (buf)
			memcpy(buf + n, j->p, l);
		n += l;
		j->p += l;
	}
	if (out) {
		buf[n] = 0;
		*out = (char *)buf;
		*olen = n;
	}
	return 0;
fail:
	free(buf);
	return rc;
}

static int juint(jp *j, uint64_t *out)
{
	ws(j);
	const uint8_t *s = j->p;
	uint64_t v = 0;
	while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
		unsigned d = *j->p - '0';
		if (v > (UINT64_MAX - d) / 10)
			return JFAIL(j, "header JSON: integer too large at byte %zu", (size_t)(s - j->start));
		v = v * 10 + d;
		j->p++;
	}
	if (j->p == s || (j->p - s > 1 && *s == '0'))
		return JFAIL(j, "header JSON: expected a non-negative integer at byte %zu",
		             (size_t)(s - j->start));
	if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E'))
		return JFAIL(j, "header JSON: expected an integer, found a fraction at byte %zu",
		             (size_t)(s - j->start));
	*out = v;
	return 0;
}

/* Skips any JSON value (bounded depth). */
static int jskip(jp *j)
{
	ws(j);
	if (j->p >= j->end)
		return JFAIL(j, "header JSON: value expected");
	uint8_t c = *j->p;
	if (c == '"')
		return jstring(j, NULL, NULL);
	if (c == '{' || c == '[') {
		uint8_t close = c == '{' ? '}' : ']';
		if (++j->depth > ST_DEPTH_MAX)
			return JFAIL(j, "header JSON: nested deeper than %d", ST_DEPTH_MAX);
		j->p++;
		ws(j);
		if (j->p < j->end && *j->p == close) {
			j->p++;
			j->depth--;
			return 0;
		}
		for (;;) {
			if (c == '{') {
				ULP_TRY(jstring(j, NULL, NULL));
				ULP_TRY(expect(j, ':'));
			}
			ULP_TRY(jskip(j));
			ws(j);
			if (j->p < j->end && *j->p == ',') {
				j->p++;
				continue;
			}
			ULP_TRY(expect(j, (char)close));
			j->depth--;
			return 0;
		}
	}
	if (c == '-' || (c >= '0' && c <= '9')) {
		j->p++;
		while (j->p < j->end && strchr("0123456789.eE+-", *j->p))
			j->p++;
		return 0;
	}
	static const char *const words[] = {"true", "false", "null"};
	for (size_t i = 0; i < 3; i++) {
		size_t l = strlen(words[i]);
		if ((size_t)(j->end - j->p) >= l && memcmp(j->p, words[i], l) == 0) {
			j->p += l;
			return 0;
		}
	}
	return JFAIL(j, "header JSON: unexpected character at byte %zu", (size_t)(j->p - j->start));
}

static int parse_metadata(jp *j)
{
	/* __metadata__ must be an object of strings */
	ULP_TRY(expect(j, '{'));
	ws(j);
	if (j->p < j->end && *j->p == '}') {
		j->p++;
		return 0;
	}
	for (;;) {
		ULP_TRY(jstring(j, NULL, NULL));
		ULP_TRY(expect(j, ':'));
		ws(j);
		if (j->p >= j->end || *j->p != '"')
			return JFAIL(j, "header JSON: __metadata__ values must be strings");
		ULP_TRY(jstring(j, NULL, NULL));
		ws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		return expect(j, '}');
	}
}

static int parse_tensor(jp *j, ulp_st_tensor *t)
{
	int have_dtype = 0, have_shape = 0, have_off = 0;
	ULP_TRY(expect(j, '{'));
	for (;;) {
		char *key;
		size_t klen;
		ULP_TRY(jstring(j, &key, &klen));
		int rc = expect(j, ':');
		if (rc < 0) {
			free(key);
			return rc;
		}
		if (strcmp(key, "dtype") == 0 && !have_dtype) {
			char *dt;
			size_t dl;
			free(key);
			ULP_TRY(jstring(j, &dt, &dl));
			if (dl == 0 || dl >= sizeof(t->dtype_name)) {
				free(dt);
				return JFAIL(j, "tensor '%s': dtype name of %zu bytes", t->name, dl);
			}
			memcpy(t->dtype_name, dt, dl + 1);
			t->dtype = ulp_dtype_from_name(dt, dl);
			free(dt);
			have_dtype = 1;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			free(key);
			ULP_TRY(expect(j, '['));
			ws(j);
			t->ndim = 0;
			if (j->p < j->end && *j->p == ']') {
				j->p++;
			} else {
				for (;;) {
					uint64_t d;
					ULP_TRY(juint(j, &d));
					if (t->ndim >= ULP_ARRAY_LEN(t->shape))
						return JFAIL(j, "tensor '%s': more than %zu dimensions", t->name,
						             ULP_ARRAY_LEN(t->shape));
					t->shape[t->ndim++] = d;
					ws(j);
					if (j->p < j->end && *j->p == ',') {
						j->p++;
						continue;
					}
					ULP_TRY(expect(j, ']'));
					break;
				}
			}
			have_shape = 1;
		} else if (strcmp(key, "data_offsets") == 0 && !have_off) {
			free(key);
			ULP_TRY(expect(j, '['));
			ULP_TRY(juint(j, &t->begin));
			ULP_TRY(expect(j, ','));
			ULP_TRY(juint(j, &t->end));
			ULP_TRY(expect(j, ']'));
			have_off = 1;
		} else if (!strcmp(key, "dtype") || !strcmp(key, "shape") || !strcmp(key, "data_offsets")) {
			free(key);
			return JFAIL(j, "tensor '%s': duplicate field", t->name);
		} else {
			free(key);
			ULP_TRY(jskip(j));
		}
		ws(j);
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		ULP_TRY(expect(j, '}'));
		break;
	}
	if (!have_dtype || !have_shape || !have_off)
		return JFAIL(j, "tensor '%s': missing %s", t->name,
		             !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
	return 0;
}

void ulp_st_free(ulp_st *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->n; i++)
		free(st->t[i].name);
	free(st->t);
	free(st->header);
	free(st);
}

static int cmp_begin(const void *a, const void *b)
{
	const ulp_st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const ulp_st_tensor *const *)a)->name, (*(const ulp_st_tensor *const *)b)->name);
}

int ulp_st_parse(const void *head, size_t head_len, uint64_t file_size, ulp_st **out,
                 uint64_t *need, char *errbuf, size_t errcap)
{
	ulp_err err = {errbuf, errcap};
	const uint8_t *h = head;
	if (head_len < 8 || file_size < 8)
		return ULP_CORRUPT(&err, "file of %llu bytes is too short for a safetensors header",
		                   (unsigned long long)file_size);
	uint64_t n = ulp_ld64(h);
	if (n > ST_HEADER_MAX)
		return ULP_CORRUPT(&err, "header length %llu exceeds the %u-byte limit",
		                   (unsigned long long)n, ST_HEADER_MAX);
	if (n + 8 > file_size)
		return ULP_CORRUPT(&err, "header length %llu runs past the end of the %llu-byte file",
		                   (unsigned long long)n, (unsigned long long)file_size);
	if (n < 2)
		return ULP_CORRUPT(&err, "header length %llu cannot hold a JSON object",
		                   (unsigned long long)n);
	if (head_len < n + 8) {
		if (need)
			*need = n + 8;
		return -ULP_E_OVERFLOW;
	}
	ulp_st *st = calloc(1, sizeof(*st));
	if (!st)
		return -ULP_E_NOMEM;
	int rc = -ULP_E_NOMEM;
	st->header = malloc((size_t)n + 8);
	if (!st->header)
		goto fail;
	memcpy(st->header, h, (size_t)n + 8);
	st->data_offset = n + 8;
	uint64_t data_size = file_size - st->data_offset;
	jp j = {h + 8, h + 8 + n, h + 8, &err, 0};
	int have_meta = 0;
	rc = expect(&j, '{');
	if (rc < 0)
		goto fail;
	ws(&j);
	if (j.p < j.end && *j.p == '}') {
		j.p++;
	} else {
		for (;;) {
			char *name;
			size_t nl;
			rc = jstring(&j, &name, &nl);
			if (rc < 0)
				goto fail;
			if ((rc = expect(&j, ':')) < 0) {
				free(name);
				goto fail;
			}
			if (strcmp(name, "__metadata__") == 0) {
				free(name);
				rc = have_meta ? JFAIL(&j, "duplicate __metadata__") : parse_metadata(&j);
				if (rc < 0)
					goto fail;
				have_meta = 1;
			} else {
				if ((rc = ulp_grow(&st->t, &st->cap, st->n, sizeof(*st->t))) < 0) {
					free(name);
					goto fail;
				}
				ulp_st_tensor *t = &st->t[st->n++];
				memset(t, 0, sizeof(*t));
				t->name = name;
				rc = parse_tensor(&j, t);
				if (rc < 0)
					goto fail;
			}
			ws(&j);
			if (j.p < j.end && *j.p == ',') {
				j.p++;
				continue;
			}
			if ((rc = expect(&j, '}')) < 0)
				goto fail;
			break;
		}
	}
	ws(&j);
	if (j.p != j.end) {
		rc = ULP_CORRUPT(&err, "header JSON: trailing bytes after the object at byte %zu",
		                 (size_t)(j.p - j.start));
		goto fail;
	}
	/* shapes and offsets */
	for (size_t i = 0; i < st->n; i++) {
		ulp_st_tensor *t = &st->t[i];
		if (t->begin > t->end || t->end > data_size) {
			rc = ULP_CORRUPT(&err, "tensor '%s': data_offsets [%llu, %llu] outside the %llu data bytes",
			                 t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
			                 (unsigned long long)data_size);
			goto fail;
		}
		if (t->dtype != ULP_DT_UNKNOWN) {
			unsigned __int128 bytes = ulp_dtype_size(t->dtype);
			for (unsigned d = 0; d < t->ndim; d++) {
				bytes *= t->shape[d];
				if (bytes > data_size)
					bytes = (unsigned __int128)data_size + 1; /* saturate */
			}
			if (bytes != t->end - t->begin) {
				rc = ULP_CORRUPT(&err, "tensor '%s': %llu bytes of data do not match shape x %s",
				                 t->name, (unsigned long long)(t->end - t->begin), t->dtype_name);
				goto fail;
			}
		}
	}
	if (st->n) {
		ulp_st_tensor **byname = malloc(st->n * sizeof(*byname));
		rc = -ULP_E_NOMEM;
		if (!byname)
			goto fail;
		for (size_t i = 0; i < st->n; i++)
			byname[i] = &st->t[i];
		qsort(byname, st->n, sizeof(*byname), cmp_name);
		for (size_t i = 1; i < st->n; i++)
			if (strcmp(byname[i - 1]->name, byname[i]->name) == 0) {
				rc = ULP_CORRUPT(&err, "tensor name '%s' appears twice", byname[i]->name);
				free(byname);
				goto fail;
			}
		free(byname);
	}
	if (st->n)
		qsort(st->t, st->n, sizeof(*st->t), cmp_begin);
	for (size_t i = 1; i < st->n; i++)
		if (st->t[i].begin < st->t[i - 1].end) {
			rc = ULP_CORRUPT(&err, "tensors '%s' and '%s' overlap", st->t[i - 1].name,
			                 st->t[i].name);
			goto fail;
		}
	*out = st;
	return 0;
fail:
	ulp_st_free(st);
	return rc;
}

size_t ulp_st_count(const ulp_st *st) { return st->n; }
const ulp_st_tensor *ulp_st_tensor_at(const ulp_st *st, size_t i) { return i < st->n ? &st->t[i] : NULL; }
uint64_t ulp_st_data_offset(const ulp_st *st) { return st->data_offset; }
const uint8_t *ulp_st_header_bytes(const ulp_st *st) { return st->header; }

const ulp_st_tensor *ulp_st_find(const ulp_st *st, const char *name)
{
	for (size_t i = 0; i < st->n; i++)
		if (strcmp(st->t[i].name, name) == 0)
			return &st->t[i];
	return NULL;
}

/* ---- writer ------------------------------------------------------------- */

typedef struct sbuf {
	char *p;
	size_t n, cap;
	int oom;
} sbuf;

static void sb_add(sbuf *s, const char *str, size_t len)
{
	if (s->oom)
		return;
	if (s->n + len + 1 > s->cap) {
		size_t nc = (s->n + len + 1) * 2;
		char *np = realloc(s->p, nc);
		if (!np) {
			s->oom = 1;
			return;
		}
		s->p = np;
		s->cap = nc;
	}
	memcpy(s->p + s->n, str, len);
	s->n += len;
	s->p[s->n] = 0;
}

static void sb_str(sbuf *s, const char *str)
{
	sb_add(s, str, strlen(str));
}

static void sb_json_string(sbuf *s, const char *str)
{
	sb_add(s, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
		char esc[8];
		if (*c == '"' || *c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)*c;
			sb_add(s, esc, 2);
		} else if (*c < 0x20) {
			snprintf(esc, sizeof(esc), "\\u%04x", *c);
			sb_add(s, esc, 6);
		} else {
			sb_add(s, (const char *)c, 1);
		}
	}
	sb_add(s, "\"", 1);
}

static int write_all(int fd, const void *buf, size_t len)
{
	int e = ulp_write_full(fd, buf, len);
	return e ? ulp_errno_code(e) == -ULP_E_NOSPC ? -ULP_E_NOSPC : -ULP_E_IO : 0;
}

int ulp_st_write(const char *path, const ulp_st_wtensor *t, size_t n, const char *metadata_json)
{
	sbuf s = {0};
	char num[64];
	uint64_t off = 0;
	sb_str(&s, "{");
	if (metadata_json) {
		sb_str(&s, "\"__metadata__\":");
		sb_str(&s, metadata_json);
		if (n)
			sb_str(&s, ",");
	}
	for (size_t i = 0; i < n; i++) {
		uint64_t bytes = ulp_dtype_size(t[i].dtype);
		if (t[i].ndim > 8 || t[i].dtype == ULP_DT_UNKNOWN) {
			free(s.p);
			return -ULP_E_INVAL;
		}
		sb_json_string(&s, t[i].name);
		sb_str(&s, ":{\"dtype\":\"");
		sb_str(&s, ulp_dtype_name(t[i].dtype));
		sb_str(&s, "\",\"shape\":[");
		for (unsigned d = 0; d < t[i].ndim; d++) {
			snprintf(num, sizeof(num), "%s%llu", d ? "," : "", (unsigned long long)t[i].shape[d]);
			sb_str(&s, num);
			bytes *= t[i].shape[d];
		}
		snprintf(num, sizeof(num), "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
		         (unsigned long long)(off + bytes));
		sb_str(&s, num);
		if (i + 1 < n)
			sb_str(&s, ",");
		off += bytes;
	}
	sb_str(&s, "}");
	while (!s.oom && s.n % 8)
		sb_str(&s, " ");
	if (s.oom) {
		free(s.p);
		return -ULP_E_NOMEM;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		free(s.p);
		return -ULP_E_IO;
	}
	uint8_t len8[8];
	ulp_st64(len8, s.n);
	int rc = write_all(fd, len8, 8);
	if (rc == 0)
		rc = write_all(fd, s.p, s.n);
	for (size_t i = 0; rc == 0 && i < n; i++) {
		uint64_t bytes = ulp_dtype_size(t[i].dtype);
		for (unsigned d = 0; d < t[i].ndim; d++)
			bytes *= t[i].shape[d];
		rc = write_all(fd, t[i].data, (size_t)bytes);
	}
	if (close(fd) < 0 && rc == 0)
		rc = -ULP_E_IO;
	free(s.p);
	return rc;
}
