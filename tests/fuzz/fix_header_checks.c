/* SPDX-License-Identifier: MIT */
/*
 * fix_header_checks.c - fix_header_checks FILE... rewrites, in place, the
 * header check of each blob corpus input that opens with the checks off, so
 * that the normal build (the corpus replay of make check, which keeps every
 * check) opens it too and runs its decoder. Inputs grown by the fuzzing build
 * mostly carry a stale header check: without this, the replay stops them at
 * the header. The fuzzing build ignores the check's value, so its coverage is
 * unchanged. Built with the fuzz targets (--enable-fuzzing); run it on
 * tests/fuzz/corpus/blob after each merge of new inputs.
 */
#include "ulpack.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#error "needs the library built with its checks off (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION)"
#endif

int main(int argc, char **argv)
{
	int fixed = 0, opened = 0;
	for (int a = 1; a < argc; a++) {
		FILE *f = fopen(argv[a], "rb");
		if (!f) {
			perror(argv[a]);
			return 1;
		}
		fseek(f, 0, SEEK_END);
		long len = ftell(f);
		fseek(f, 0, SEEK_SET);
		uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
		size_t got = fread(buf, 1, len > 0 ? (size_t)len : 0, f);
		fclose(f);
		ulp_blob *b;
		if (ulp_blob_open(buf, got, &b, NULL, 0) < 0) {
			free(buf);
			continue;
		}
		/* the payloads follow the 4-byte check that ends the header */
		const ulp_blob_info *in = ulp_blob_get_info(b);
		size_t payload = 0;
		for (uint32_t k = 0; k < in->n_chunks; k++) {
			const uint8_t *p;
			size_t l;
			ulp_blob_chunk_payload(b, k, &p, &l);
			payload += l;
		}
		ulp_blob_close(b);
		opened++;
		size_t end = got - payload - 4;
		uint32_t want = (uint32_t)XXH3_64bits(buf, end), have;
		memcpy(&have, buf + end, 4); /* little-endian, as the format */
		if (want != have) {
			memcpy(buf + end, &want, 4);
			f = fopen(argv[a], "wb");
			if (!f || fwrite(buf, 1, got, f) != got || fclose(f) != 0) {
				perror(argv[a]);
				return 1;
			}
			fixed++;
		}
		free(buf);
	}
	printf("%d inputs, %d open with the checks off, %d header checks rewritten\n", argc - 1, opened, fixed);
	return 0;
}
