/* SPDX-License-Identifier: MIT */
/*
 * s3_probe.c - the S3 client (store/s3.c) from the command line, for
 * tests/cluster/ceph_s3.sh against a real radosgw. Endpoint and credentials
 * come as for any client (AWS_* variables, ~/.aws); S3_PROBE_TRIES,
 * S3_PROBE_BACKOFF_MS, S3_PROBE_RECV_SPEED (bytes/s), S3_PROBE_THRESHOLD
 * and S3_PROBE_PART (multipart, bytes) tune it.
 *
 *   s3_probe BUCKET mkbucket
 *   s3_probe BUCKET put KEY FILE          the file read into memory, one PUT (or parts)
 *   s3_probe BUCKET putfile KEY FILE      from the file descriptor
 *   s3_probe BUCKET putif KEY FILE [ETAG] If-None-Match: * (no ETAG) or If-Match; prints the new ETag
 *   s3_probe BUCKET get KEY OFF LEN       the range to stdout
 *   s3_probe BUCKET head KEY              "SIZE ETAG"
 *   s3_probe BUCKET del KEY
 *   s3_probe BUCKET list PREFIX [MAXKEYS] "KEY SIZE" lines
 *
 * Exit status: 0; 2 NOENT; 3 EXIST (a condition failed); 4 INVAL (4xx);
 * 5 CORRUPT; 1 anything else; the message on stderr.
 */
#include "ulpack.h"
#include "store/s3.h"
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int code(int rc)
{
	switch (rc) {
	case 0: return 0;
	case -ULP_E_NOENT: return 2;
	case -ULP_E_EXIST: return 3;
	case -ULP_E_INVAL: return 4;
	case -ULP_E_CORRUPT: return 5;
	default: return 1;
	}
}

static uint64_t envnum(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 10) : 0;
}

static int print_key(void *arg, const char *key, uint64_t size)
{
	(void)arg;
	printf("%s %llu\n", key, (unsigned long long)size);
	return 0;
}

static void *slurp(const char *path, size_t *n)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		perror(path);
		exit(1);
	}
	char *p = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (p && got < (size_t)st.st_size) {
		ssize_t r = read(fd, p + got, (size_t)st.st_size - got);
		if (r <= 0) {
			perror(path);
			exit(1);
		}
		got += (size_t)r;
	}
	close(fd);
	*n = got;
	return p;
}

int main(int argc, char **argv)
{
	char msg[1024] = "";
	ulp_err e = {msg, sizeof(msg)};
	ulp_s3_conf c;
	ulp_s3 *s = NULL;
	int rc;
	if (argc < 3) {
		fprintf(stderr, "usage: s3_probe BUCKET mkbucket|put|putfile|putif|get|head|del|list ...\n");
		return 1;
	}
	const char *op = argv[2];
	if ((rc = ulp_s3_conf_load(&c, NULL, &e)) < 0)
		goto out;
	c.max_tries = (int)envnum("S3_PROBE_TRIES");
	c.backoff_ms = (unsigned)envnum("S3_PROBE_BACKOFF_MS");
	c.max_recv_speed = envnum("S3_PROBE_RECV_SPEED");
	c.multipart_threshold = envnum("S3_PROBE_THRESHOLD");
	c.part_size = envnum("S3_PROBE_PART");
	rc = ulp_s3_open(&c, argv[1], &s, &e);
	ulp_s3_conf_free(&c);
	if (rc < 0)
		goto out;
	if (strcmp(op, "mkbucket") == 0) {
		rc = ulp_s3_bucket_create(s, &e);
	} else if ((strcmp(op, "put") == 0 || strcmp(op, "putif") == 0) && argc >= 5) {
		size_t n;
		void *p = slurp(argv[4], &n);
		char etag[ULP_S3_ETAG_MAX] = "";
		if (op[3] == 'i')
			rc = ulp_s3_put_cond(s, argv[3], p, n, argc >= 6 ? argv[5] : NULL, etag, &e);
		else
			rc = ulp_s3_put(s, argv[3], p, n, &e);
		if (rc == 0 && op[3] == 'i')
			printf("%s\n", etag);
		free(p);
	} else if (strcmp(op, "putfile") == 0 && argc >= 5) {
		int fd = open(argv[4], O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) != 0) {
			perror(argv[4]);
			return 1;
		}
		rc = ulp_s3_put_file(s, argv[3], fd, (uint64_t)st.st_size, &e);
		close(fd);
	} else if (strcmp(op, "get") == 0 && argc >= 6) {
		size_t len = (size_t)strtoull(argv[5], NULL, 10);
		char *p = malloc(len ? len : 1);
		rc = p ? ulp_s3_get_range(s, argv[3], strtoull(argv[4], NULL, 10), p, len, &e) : -ULP_E_NOMEM;
		if (rc == 0 && fwrite(p, 1, len, stdout) != len)
			rc = -ULP_E_IO;
		free(p);
	} else if (strcmp(op, "head") == 0 && argc >= 4) {
		uint64_t size = 0;
		char etag[ULP_S3_ETAG_MAX] = "";
		rc = ulp_s3_head(s, argv[3], &size, etag, &e);
		if (rc == 0)
			printf("%llu %s\n", (unsigned long long)size, etag);
	} else if (strcmp(op, "del") == 0 && argc >= 4) {
		rc = ulp_s3_delete(s, argv[3], &e);
	} else if (strcmp(op, "list") == 0 && argc >= 4) {
		rc = ulp_s3_list(s, argv[3], argc >= 5 ? (unsigned)atoi(argv[4]) : 0, print_key, NULL, &e);
	} else {
		fprintf(stderr, "s3_probe: bad arguments\n");
		rc = -ULP_E_INVAL;
	}
out:
	ulp_s3_close(s);
	if (rc < 0)
		fprintf(stderr, "s3_probe: %s (%s)\n", msg[0] ? msg : "failed", ulp_strerror(rc));
	return code(rc);
}
