/* SPDX-License-Identifier: MIT */
/*
 * s3.h - an S3 client on libcurl (issue 26 item 1), for the object-store
 * pack store that comes behind backend.h. Not wired into archives yet.
 *
 * Requests are path-style (ENDPOINT/BUCKET/KEY: RGW and MinIO need it) and
 * signed by libcurl (CURLOPT_AWS_SIGV4 "aws:amz:REGION:s3") with an explicit
 * x-amz-content-sha256 header (the payload's hex SHA-256, or
 * UNSIGNED-PAYLOAD for uploads from a file: RGW answers 403 to a request
 * without it); query strings are built sorted and percent-encoded before
 * signing (libcurl 7.88 signs the query as given).
 *
 * Errors are negative ULP_E_*, with a message in e naming the bucket/key,
 * the operation and the cause (HTTP status and the store's error code);
 * credentials never appear in a message:
 *   404                       -ULP_E_NOENT
 *   412 (a condition failed)  -ULP_E_EXIST: the key exists (If-None-Match: *)
 *                             or its ETag is not the one given (If-Match)
 *   416, a short or long body -ULP_E_CORRUPT (never wrong bytes in p)
 *   401, 403                  -ULP_E_INVAL, "access denied: check the credentials"
 *   409, other 4xx            -ULP_E_INVAL (409: -ULP_E_BUSY)
 *   5xx, 429, connection errors and timeouts: retried (conf max_tries, with
 *                             doubling pauses) while the request's deadline
 *                             allows, then -ULP_E_IO
 *   the thread's interrupt check said stop (ulp_set_interrupt)  -ULP_E_INTR
 *
 * Every request ends within its deadline (issue 34 item 6): a try that
 * moves no byte for stall_s fails, and each try may take only what is left
 * of deadline_ms (plus a second per MiB of its body or range), counted
 * from the request's start across its tries and pauses. While it waits,
 * libcurl's progress callback asks the thread's interrupt check at most
 * every 100 ms (libcurl calls it about once a second when nothing moves),
 * and the pauses between tries ask it every 50 ms.
 *   a malformed response (XML) -ULP_E_CORRUPT
 *
 * A ulp_s3 may be used from any number of threads at once: each request
 * takes a libcurl handle from the client's pool (under its lock) and gives
 * it back after, so connections are reused. The only global state is
 * curl_global_init, done once.
 */
#ifndef ULP_S3_H
#define ULP_S3_H

#include "ulp_int.h"
#include <stddef.h>
#include <stdint.h>

/* Where the store is and who we are. ulp_s3_conf_load fills it from the
 * environment and the AWS files:
 *   endpoint       AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
 *                  endpoint_url in the config file, else https://s3.REGION.amazonaws.com
 *   region         AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1
 *   keys, token    AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 *                  else the profile's aws_access_key_id, aws_secret_access_key,
 *                  aws_session_token in the credentials file, then in the config file
 *   ca_bundle      AWS_CA_BUNDLE, the profile's ca_bundle; NULL: libcurl's default
 *   max_tries      AWS_MAX_ATTEMPTS, the profile's max_attempts
 *   connect_timeout_ms, stall_s, deadline_ms  ULPACK_S3_CONNECT_TIMEOUT,
 *                  ULPACK_S3_STALL_TIMEOUT, ULPACK_S3_TIMEOUT (seconds,
 *                  decimals allowed; a bad value is an error)
 *   profile        the argument, AWS_PROFILE, else "default"; the files
 *                  AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and
 *                  AWS_CONFIG_FILE (~/.aws/config, sections "[profile NAME]" or
 *                  "[default]")
 * The numbers (0: the default in brackets) may be set by the caller after. */
typedef struct ulp_s3_conf {
	char *endpoint; /* scheme://host[:port], http or https */
	char *region;
	char *access_key, *secret_key, *session_token; /* never printed */
	char *ca_bundle;
	int max_tries;                /* [5] tries of a request that failed transiently */
	unsigned backoff_ms;          /* [100] pause after the first try, doubled after each, up to 5 s */
	unsigned connect_timeout_ms;  /* [10000] */
	unsigned stall_s;             /* [15] a try that moves no byte for this long fails */
	unsigned deadline_ms;         /* [60000] a request's whole time, tries and pauses
	                                 included, plus 1 s per MiB it sends or asks for */
	uint64_t multipart_threshold; /* [64 MiB] ulp_s3_put/put_file of more go in parts */
	uint64_t part_size;           /* [16 MiB] (at least 5 MiB, S3's minimum) */
	uint64_t max_recv_speed;      /* [0: no limit] bytes/s (tests) */
} ulp_s3_conf;

int ulp_s3_conf_load(ulp_s3_conf *c, const char *profile, ulp_err *e);
void ulp_s3_conf_free(ulp_s3_conf *c);

typedef struct ulp_s3 ulp_s3;

/* A client of bucket (a DNS-compatible name: 3-63 of [a-z0-9.-]) with a copy
 * of c. */
int ulp_s3_open(const ulp_s3_conf *c, const char *bucket, ulp_s3 **out, ulp_err *e);
void ulp_s3_close(ulp_s3 *s);

/* Creates the bucket (an existing one of ours is not an error). */
int ulp_s3_bucket_create(ulp_s3 *s, ulp_err *e);

#define ULP_S3_ETAG_MAX 128 /* an ETag as the store gives it, quotes included, NUL */

/* Stores the len bytes at p as key (whole, or multipart over the threshold). */
int ulp_s3_put(ulp_s3 *s, const char *key, const void *p, size_t len, ulp_err *e);
/* Stores len bytes of fd from offset 0 as key (pread; the file must not change). */
int ulp_s3_put_file(ulp_s3 *s, const char *key, int fd, uint64_t len, ulp_err *e);
/* Conditional PUT (one request, never multipart): if_match NULL: only if
 * key does not exist (If-None-Match: *); else only if key's ETag is if_match
 * (quoted as HEAD gives it, or not: both are tried, as RGW 16.2 matches only
 * the unquoted form). -ULP_E_EXIST when the condition failed. etag (may be
 * NULL) receives the new object's ETag. */
int ulp_s3_put_cond(ulp_s3 *s, const char *key, const void *p, size_t len, const char *if_match,
                    char etag[ULP_S3_ETAG_MAX], ulp_err *e);
/* len bytes of key from offset off into p (a range GET, 206). */
int ulp_s3_get_range(ulp_s3 *s, const char *key, uint64_t off, void *p, size_t len, ulp_err *e);
/* A whole small object into p (at most cap bytes: a longer one is
 * -ULP_E_CORRUPT), its length in *len and its ETag in etag (may be NULL). */
int ulp_s3_get(ulp_s3 *s, const char *key, void *p, size_t cap, size_t *len, char etag[ULP_S3_ETAG_MAX],
               ulp_err *e);
/* key's size and ETag (either may be NULL). */
int ulp_s3_head(ulp_s3 *s, const char *key, uint64_t *size, char etag[ULP_S3_ETAG_MAX], ulp_err *e);
/* Removes key (0 also when it was not there: S3 does not tell). */
int ulp_s3_delete(ulp_s3 *s, const char *key, ulp_err *e);
/* Calls cb for every key that starts with prefix, in the store's order,
 * with its size (ListObjectsV2, max_keys a page, 0: the store's 1000). A
 * non-zero return of cb stops the walk and is returned. */
int ulp_s3_list(ulp_s3 *s, const char *prefix, unsigned max_keys,
                int (*cb)(void *arg, const char *key, uint64_t size), void *arg, ulp_err *e);

/* ---- internals, exposed for tests/unit/test_s3.c ---- */
/* Percent-encodes n bytes of s as SigV4 wants (unreserved kept; '/' kept
 * where keep_slash): a malloc'ed string, or NULL. */
char *ulp_s3_uri_encode(const char *s, size_t n, int keep_slash);
/* The value of key in [section] of an INI text (AWS credentials/config
 * syntax): 1 and *out (malloc'ed), 0 when absent, or -ULP_E_NOMEM. */
int ulp_s3_ini_get(const char *text, size_t n, const char *section, const char *key, char **out);
/* One ListObjectsV2 page: each key (it must start with prefix) and its size
 * to cb, only once the whole page parsed; *truncated, and the
 * continuation token (malloc'ed, NULL when none) in *next. */
int ulp_s3_parse_list(const char *xml, size_t n, const char *prefix,
                      int (*cb)(void *arg, const char *key, uint64_t size), void *arg, int *truncated,
                      char **next, ulp_err *e);
/* The ULP_E_* of an HTTP status (0 for 2xx; 1 where it is worth a retry). */
int ulp_s3_status_err(long status);
/* The text of element name (a child of the root) in an XML response, into
 * out (cap bytes, truncated): 1 found, 0 not, <0 malformed. */
int ulp_s3_xml_child(const char *xml, size_t n, const char *name, char *out, size_t cap);
/* The headers a request of the client sends besides those libcurl adds
 * (one "Name: value" per line into out; a session token's value is shown
 * as "(set)"): for test_s3. */
int ulp_s3_debug_headers(ulp_s3 *s, const char *payload_hash, const char *if_match, int if_none_match,
                         char *out, size_t cap);

#endif
