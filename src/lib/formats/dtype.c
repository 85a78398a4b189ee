/* SPDX-License-Identifier: MIT */
/* dtype.c - the safetensors dtypes libulpack knows, their sizes and names. */
#include "ulp_int.h"

static const struct {
	const char *name;
	unsigned size;
	int is_float;
} dtypes[ULP_DT__COUNT] = {
	[ULP_DT_UNKNOWN] = {"UNKNOWN", 1, 0},
	[ULP_DT_BOOL] = {"BOOL", 1, 0},  [ULP_DT_U8] = {"U8", 1, 0},   [ULP_DT_I8] = {"I8", 1, 0},
	[ULP_DT_U16] = {"U16", 2, 0},    [ULP_DT_I16] = {"I16", 2, 0}, [ULP_DT_U32] = {"U32", 4, 0},
	[ULP_DT_I32] = {"I32", 4, 0},    [ULP_DT_U64] = {"U64", 8, 0}, [ULP_DT_I64] = {"I64", 8, 0},
	[ULP_DT_F16] = {"F16", 2, 1},    [ULP_DT_BF16] = {"BF16", 2, 1},
	[ULP_DT_F32] = {"F32", 4, 1},    [ULP_DT_F64] = {"F64", 8, 1},
	[ULP_DT_F8_E4M3] = {"F8_E4M3", 1, 1}, [ULP_DT_F8_E5M2] = {"F8_E5M2", 1, 1},
};

const char *ulp_dtype_name(ulp_dtype dt)
{
	return (unsigned)dt < ULP_DT__COUNT ? dtypes[dt].name : "UNKNOWN";
}

ulp_dtype ulp_dtype_from_name(const char *name, size_t len)
{
	for (int i = 1; i < ULP_DT__COUNT; i++)
		if (strlen(dtypes[i].name) == len && memcmp(dtypes[i].name, name, len) == 0)
			return (ulp_dtype)i;
	return ULP_DT_UNKNOWN;
}

unsigned ulp_dtype_size(ulp_dtype dt)
{
	return (unsigned)dt < ULP_DT__COUNT ? dtypes[dt].size : 1;
}

int ulp_dtype_is_float(ulp_dtype dt)
{
	return (unsigned)dt < ULP_DT__COUNT && dtypes[dt].is_float;
}
