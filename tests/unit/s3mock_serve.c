/* SPDX-License-Identifier: MIT */
/*
 * s3mock_serve.c - the S3 emulator (s3mock.c) as a process of its own, for
 * the integration tests that mount an s3:// archive
 * (tests/integration/fuse_s3_hang.sh). Prints its endpoint
 * ("http://127.0.0.1:PORT") on a line, then reads commands on standard
 * input, one a line:
 *   hang      a hung store from now on: requests read, never answered
 *   answer    answers again (each held request's connection is closed)
 *   count K   prints s3mock_count(K) on a line (K: GET, PUT, LIST, ALL, ...)
 * and stops at "quit" or the end of its input.
 */
#include "s3mock.h"
#include <stdio.h>
#include <string.h>

int main(void)
{
	s3mock *m = NULL;
	char line[256];
	if (s3mock_start(&m) != 0) {
		perror("s3mock_start");
		return 1;
	}
	printf("%s\n", s3mock_endpoint(m));
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "hang")) {
			s3mock_hang(m, 1);
		} else if (!strcmp(line, "answer")) {
			s3mock_hang(m, 0);
		} else if (!strncmp(line, "count ", 6)) {
			printf("%lu\n", s3mock_count(m, line + 6));
			fflush(stdout);
		} else if (!strcmp(line, "quit")) {
			break;
		} else if (line[0]) {
			fprintf(stderr, "s3mock_serve: unknown command '%s'\n", line);
		}
	}
	s3mock_stop(m);
	return 0;
}
