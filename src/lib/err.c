/* SPDX-License-Identifier: MIT */
/* err.c - error codes, their text and errno mapping; the error sink. */
#include "ulp_int.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

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
	[ULP_E_NOTEMPTY] = "directory not empty",
	[ULP_E_NOTDIR] = "not a directory",
	[ULP_E_ISDIR] = "is a directory",
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
		[ULP_E_UNSUPPORTED] = EOPNOTSUPP, [ULP_E_NOTEMPTY] = ENOTEMPTY,
		[ULP_E_NOTDIR] = ENOTDIR, [ULP_E_ISDIR] = EISDIR,
	};
	if (rc < 0)
		rc = -rc;
	return rc < ULP_E__COUNT ? map[rc] : EIO;
}

int ulp_err_set(ulp_err *e, int code, const char *file, int line, const char *fmt, ...)
{
	if (e && e->buf && e->cap) {
		va_list ap;
		int n;
		va_start(ap, fmt);
		n = vsnprintf(e->buf, e->cap, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t)n < e->cap) {
			const char *base = strrchr(file, '/');
			snprintf(e->buf + n, e->cap - (size_t)n, " [%s:%d]", base ? base + 1 : file, line);
		}
	}
	return code;
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
