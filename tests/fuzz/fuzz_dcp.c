/* SPDX-License-Identifier: MIT */
/*
 * fuzz_dcp.c - the DCP rank-file scanner (dcp.c) on hostile input: the input
 * is a whole rank file (records of torch.save zips back to back), and then
 * also a pickle (what a .metadata holds: its storage_data items, and the
 * torch.save pickle reader on it). Consistency on success: at least
 * one record, where parsing stopped inside the file, tensors sorted,
 * disjoint, inside the parsed part, each of a known dtype with a whole
 * number of elements, names non-empty and unique; the pickle parser's
 * memory within its bound. The seed corpus is real torch 2.13 output
 * (tests/fuzz/corpus/dcp: rank files and .metadata of a dcp.save, whole,
 * cut and with a BYTE_IO item; rank files of the SAFETENSORS serialization;
 * and inputs "DCPM" <u32 n> <n bytes of .metadata> <a rank file>, so that
 * the .metadata names the rank file's tensors). Checks: the same, and
 * names unique among all the tensors of a file.
 */
#include "fuzz.h"
#include "dcp.h"
#include "torchzip.h"
#include <stdlib.h>
#include <string.h>

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void check_scan(const uint8_t *data, size_t size, const ulp_dcp_meta *meta)
{
	ulp_dcp *d;
	uint64_t parsed;
	char why[256];
	if (ulp_dcp_scan_mem(data, size, meta, "__0_0.distcp", &d, &parsed, why, sizeof(why)) != 0)
		return;
	FUZZ_ASSERT(parsed > 0 && parsed <= size);
	uint64_t prev_end = 0;
	for (size_t i = 0; i < ulp_dcp_count(d); i++) {
		const ulp_dcp_tensor *t = ulp_dcp_at(d, i);
		FUZZ_ASSERT(t->dtype != ULP_DT_UNKNOWN && t->length > 0);
		FUZZ_ASSERT(t->length % ulp_dtype_size(t->dtype) == 0);
		FUZZ_ASSERT(t->offset >= prev_end && t->length <= parsed && t->offset <= parsed - t->length);
		FUZZ_ASSERT(t->name && t->name[0] && (!t->alt || t->alt[0]));
		prev_end = t->offset + t->length;
	}
	size_t n = ulp_dcp_count(d);
	const char **names = malloc((n ? n : 1) * sizeof(*names));
	if (names) { /* unique: sorted, no two neighbours alike */
		for (size_t i = 0; i < n; i++)
			names[i] = ulp_dcp_at(d, i)->name;
		qsort(names, n, sizeof(*names), cmp_str);
		for (size_t i = 1; i < n; i++)
			FUZZ_ASSERT(strcmp(names[i - 1], names[i]) != 0);
		free(names);
	}
	ulp_dcp_free(d);
}

FUZZ_TARGET(dcp)
{
	char why[256];
	if (size >= 8 && memcmp(data, "DCPM", 4) == 0) { /* a .metadata, then a rank file */
		uint32_t n = ulp_ld32(data + 4);
		if (n > size - 8 || size > (1u << 20))
			return 0;
		ulp_dcp_meta *m;
		if (ulp_dcp_meta_parse(data + 8, n, &m, why, sizeof(why)) == 0) {
			check_scan(data + 8 + n, size - 8 - n, m);
			ulp_dcp_meta_free(m);
		}
		return 0;
	}
	check_scan(data, size, NULL);
	ulp_dcp_meta *m;
	if (ulp_dcp_meta_parse(data, size, &m, why, sizeof(why)) == 0) {
		for (size_t i = 0; i < ulp_dcp_meta_count(m); i++) {
			const ulp_dcp_item *it = ulp_dcp_meta_at(m, i);
			FUZZ_ASSERT(it->fqn && it->file && it->offset + it->length >= it->offset);
			for (uint32_t j = 0; j < it->ndim; j++)
				(void)it->chunk[j];
		}
		ulp_dcp_meta_free(m);
	}
	ulp_pk *k;
	size_t peak;
	int rc = ulp_pk_parse_peak(data, size, &k, &peak, why, sizeof(why));
	FUZZ_ASSERT(peak <= 24 * size + ((size_t)1 << 20));
	if (rc == 0)
		ulp_pk_free(k);
	return 0;
}
