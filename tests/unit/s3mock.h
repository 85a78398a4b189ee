/* SPDX-License-Identifier: MIT */
/*
 * s3mock.h - an in-process S3 emulator for unit tests: an HTTP/1.1 server
 * on 127.0.0.1 (an ephemeral port, keep-alive, a thread per connection)
 * that keeps buckets and objects in memory, so that code on store/s3.c can
 * be tested in `make check` without a store. Compiled into the tests that
 * need it (Makefile.am: S3MOCK_SOURCES).
 *
 * What it serves (path-style: /BUCKET, /BUCKET/KEY, the key percent-decoded
 * and free to hold '/'):
 *   PUT /B                      creates B (409 BucketAlreadyOwnedByYou if it exists)
 *   HEAD /B, DELETE /B          200 / 204 (409 BucketNotEmpty)
 *   GET /B?list-type=2          ListObjectsV2: prefix, max-keys (<= 1000),
 *                               continuation-token, start-after; keys sorted
 *                               by their bytes
 *   PUT /B/K                    Content-Length or chunked body; If-None-Match: *
 *                               and If-Match: ETAG (quoted or not) -> 412
 *   GET /B/K                    whole, or Range: bytes=A-B, A-, -N -> 206 with
 *                               Content-Range; 416 from past the end
 *   HEAD /B/K                   Content-Length, ETag
 *   DELETE /B/K                 204, also for a missing key
 *   POST /B/K?uploads           multipart: UploadId XML; then
 *   PUT /B/K?partNumber=N&uploadId=U, POST /B/K?uploadId=U (the
 *   CompleteMultipartUpload XML; parts but the last >= 5 MiB),
 *   DELETE /B/K?uploadId=U (abort)
 * Errors carry S3's XML body (<Error><Code>..</Code><Message>..</Message>..)
 * with S3's codes: NoSuchBucket, NoSuchKey, NoSuchUpload, PreconditionFailed,
 * InvalidRange, InvalidPart, InvalidPartOrder, EntityTooSmall, MalformedXML,
 * AccessDenied, InvalidAccessKeyId, XAmzContentSHA256Mismatch, ...
 *
 * ETags: a single PUT's is the quoted hex MD5 of its bytes (as S3's); a
 * multipart object's is "HEX-N", HEX the MD5 of its parts' binary MD5s
 * one after the other (as S3's too).
 *
 * Every request must carry Authorization: AWS4-HMAC-SHA256
 * Credential=KEYID/... (403 AccessDenied without it; 403 InvalidAccessKeyId
 * when KEYID is not the mock's, "testkey" unless s3mock_set_key said
 * otherwise) and x-amz-content-sha256 (403 AccessDenied without it); the
 * signature is not checked, but a hex payload hash is, against the body
 * (400 XAmzContentSHA256Mismatch); UNSIGNED-PAYLOAD is taken as is.
 *
 * Objects in the test API are named "BUCKET/KEY" (the path without its
 * leading '/'). Every function is thread-safe (one mutex guards all of the
 * mock's state); none may be called after s3mock_stop.
 */
#ifndef ULP_S3MOCK_H
#define ULP_S3MOCK_H

#include <stddef.h>
#include <stdint.h>

typedef struct s3mock s3mock;

/* Starts a mock listening on 127.0.0.1, an ephemeral port: 0 and *out, or
 * -1 (errno set). No bucket exists yet. */
int s3mock_start(s3mock **out);
/* "http://127.0.0.1:PORT": valid until s3mock_stop. */
const char *s3mock_endpoint(s3mock *m);
/* Closes the listener and every connection, joins every thread, frees all;
 * NULL is a no-op. Clients may still hold connections (they see them close). */
void s3mock_stop(s3mock *m);

/* The access key id requests must name (a copy is kept; default "testkey"). */
void s3mock_set_key(s3mock *m, const char *key_id);

/* ---- faults (each applies to requests whose head arrives after the call) -- */
/* The next n requests are answered with HTTP status (e.g. 500, 503), an
 * S3 error body and nothing done; the body is read first, the connection kept. */
void s3mock_fail_next(s3mock *m, int n, int status);
/* The next n requests: the connection is closed once their head is read,
 * without an answer. Checked before s3mock_fail_next's. */
void s3mock_drop_next(s3mock *m, int n);
/* Flips (XOR 0xff) the byte at offset of object "BUCKET/KEY", its ETag
 * unchanged (bit rot): 0, or -1 when there is no such object or byte. */
int s3mock_corrupt(s3mock *m, const char *path, uint64_t offset);
/* Every answer waits ms milliseconds after its request was read (0: none). */
void s3mock_stall_ms(s3mock *m, unsigned ms);
/* on: a hung store (not refusing, silent): connections are accepted and
 * requests read, and none is answered; each request held is dropped (the
 * connection closed, no answer) once the hang is lifted (on 0) or the mock
 * stops. */
void s3mock_hang(s3mock *m, int on);

/* Requests whose head arrived (faulted ones included), by kind: "PUT",
 * "GET" (an object), "LIST" (a GET of a bucket), "HEAD", "DELETE", "POST",
 * or "ALL"; 0 for another name. */
unsigned long s3mock_count(s3mock *m, const char *what);
/* Multipart uploads started and not yet completed or aborted. */
int s3mock_uploads(s3mock *m);

/* ---- direct access to the store ------------------------------------------ */
/* A malloc'ed copy of object "BUCKET/KEY" (the caller frees it; one byte
 * more is allocated and set to 0) and its size in *len, or NULL when there
 * is none (or no memory). */
void *s3mock_get_object(s3mock *m, const char *path, size_t *len);
/* Stores len bytes at p as "BUCKET/KEY" (ETag: the quoted MD5), creating
 * the bucket if it is missing: 0, or -1 (a path without '/', no memory). */
int s3mock_put_object(s3mock *m, const char *path, const void *p, size_t len);
/* Removes "BUCKET/KEY": 0, or -1 when it was not there. */
int s3mock_delete_object(s3mock *m, const char *path);

#endif
