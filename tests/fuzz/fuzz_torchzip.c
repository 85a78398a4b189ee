/* SPDX-License-Identifier: MIT */
/*
 * fuzz_torchzip.c - the torch.save zip reader (ZIP, ZIP64, pickle) on hostile
 * input. The input is the whole file, and then also the pickle alone.
 * Consistency on success: storages sorted, disjoint, inside the file, each
 * of a known dtype with a whole number of elements, names non-empty and
 * unique; the pickle parser's memory within its bound.
 */
#include "fuzz.h"
#include "torchzip.h"
#include <string.h>

FUZZ_TARGET(torchzip)
{
	ulp_tz *z;
	char why[256];
	if (ulp_tz_parse_mem(data, size, &z, why, sizeof(why)) == 0) {
		uint64_t prev_end = 0;
		for (size_t i = 0; i < ulp_tz_count(z); i++) {
			const ulp_tz_storage *s = ulp_tz_at(z, i);
			FUZZ_ASSERT(s->dtype != ULP_DT_UNKNOWN && s->length > 0);
			FUZZ_ASSERT(s->length % ulp_dtype_size(s->dtype) == 0);
			FUZZ_ASSERT(s->offset >= prev_end && s->offset + s->length <= size);
			FUZZ_ASSERT(s->name && s->name[0]);
			for (size_t j = 0; j < i; j++)
				FUZZ_ASSERT(strcmp(ulp_tz_at(z, j)->name, s->name) != 0);
			prev_end = s->offset + s->length;
		}
		ulp_tz_free(z);
	}
	ulp_pk *k;
	size_t peak;
	int rc = ulp_pk_parse_peak(data, size, &k, &peak, why, sizeof(why));
	/* the parser's memory bound (pickle.c): 24 bytes per byte and 1 MiB */
	FUZZ_ASSERT(peak <= 24 * size + ((size_t)1 << 20));
	if (rc == 0) {
		for (size_t i = 0; i < ulp_pk_count(k); i++)
			FUZZ_ASSERT(ulp_pk_at(k, i)->name && ulp_pk_at(k, i)->key);
		ulp_pk_free(k);
	}
	return 0;
}
