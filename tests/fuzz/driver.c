/* SPDX-License-Identifier: MIT */
/*
 * driver.c - replays the committed fuzz corpora through every target with
 * any compiler (make check), so crashes once found stay fixed.
 * Usage: test_fuzz_replay [CORPUS_DIR]   (default $ULP_CORPUS_DIR)
 */
#include "fuzz.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fuzz_blob(const uint8_t *data, size_t size);
int fuzz_safetensors(const uint8_t *data, size_t size);
int fuzz_roundtrip(const uint8_t *data, size_t size);
int fuzz_torchzip(const uint8_t *data, size_t size);
int fuzz_genpatch(const uint8_t *data, size_t size);
int fuzz_dcp(const uint8_t *data, size_t size);

static const struct {
	const char *name;
	int (*fn)(const uint8_t *, size_t);
} targets[] = {{"blob", fuzz_blob}, {"safetensors", fuzz_safetensors}, {"roundtrip", fuzz_roundtrip},
               {"torchzip", fuzz_torchzip}, {"genpatch", fuzz_genpatch},
               {"dcp", fuzz_dcp}};

int main(int argc, char **argv)
{
	const char *root = argc > 1 ? argv[1] : getenv("ULP_CORPUS_DIR");
	if (!root)
		root = "tests/fuzz/corpus";
	int total = 0;
	for (size_t t = 0; t < sizeof(targets) / sizeof(targets[0]); t++) {
		char dir[4096];
		snprintf(dir, sizeof(dir), "%s/%s", root, targets[t].name);
		DIR *d = opendir(dir);
		if (!d) {
			fprintf(stderr, "FAIL: no corpus %s\n", dir);
			return 1;
		}
		struct dirent *de;
		int n = 0;
		while ((de = readdir(d))) {
			if (de->d_name[0] == '.')
				continue;
			char path[8192];
			snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
			FILE *f = fopen(path, "rb");
			if (!f)
				continue;
			fseek(f, 0, SEEK_END);
			long len = ftell(f);
			fseek(f, 0, SEEK_SET);
			uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
			size_t got = fread(buf, 1, (size_t)(len > 0 ? len : 0), f);
			fclose(f);
			targets[t].fn(buf, got);
			free(buf);
			n++;
		}
		closedir(d);
		printf("%s: replayed %d inputs\n", targets[t].name, n);
		total += n;
	}
	return total > 0 ? 0 : 1;
}
