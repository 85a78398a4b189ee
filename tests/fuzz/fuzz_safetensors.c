/* SPDX-License-Identifier: MIT */
/*
 * fuzz_safetensors.c - the safetensors header reader on hostile input, with
 * the file as long as the input and as long as the input plus a tail.
 * Consistency on success: tensors sorted, inside the data, not overlapping.
 */
#include "fuzz.h"
#include "ulpack.h"
#include <string.h>

FUZZ_TARGET(safetensors)
{
	for (int pass = 0; pass < 2; pass++) {
		uint64_t file_size = size + (pass ? (uint64_t)(size ? data[size - 1] : 0) * 4096 : 0);
		ulp_st *st;
		char err[256];
		if (ulp_st_parse(data, size, file_size, &st, NULL, err, sizeof(err)) < 0)
			continue;
		uint64_t data_size = file_size - ulp_st_data_offset(st), prev_end = 0;
		for (size_t i = 0; i < ulp_st_count(st); i++) {
			const ulp_st_tensor *t = ulp_st_tensor_at(st, i);
			FUZZ_ASSERT(t->begin <= t->end && t->end <= data_size && t->begin >= prev_end);
			FUZZ_ASSERT(ulp_st_find(st, t->name) == t);
			prev_end = t->end;
		}
		FUZZ_ASSERT(memcmp(ulp_st_header_bytes(st), data, (size_t)ulp_st_data_offset(st)) == 0);
		ulp_st_free(st);
	}
	return 0;
}
