/* SPDX-License-Identifier: MIT */
/*
 * cmd_bench.c - `ulpack bench REF TARGET`: codes every tensor of TARGET
 * (safetensors, or the storages of a torch.save zip) against the same tensor
 * of REF, checks the round trip byte for byte and
 * byte identity across thread counts, and reports sizes and speeds next to
 * zstd -3/-19 on the byte-grouped XOR and memcpy, all measured in this run.
 * Speeds are medians of several repetitions; MB/s count raw bytes (10^6).
 */
#include "cli.h"
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

/* A file's tensors, whichever format: safetensors or torch.save zip. */
typedef struct tens {
	const char *name;
	const char *dtype_name;
	ulp_dtype dt;
	const uint8_t *p;
	size_t bytes;
} tens;

typedef struct tfile {
	uint8_t *buf;
	size_t len;
	ulp_st *st;               /* one of st, tz owns the names */
	ulp_tz *tz;
	tens *t;
	size_t n;
} tfile;

typedef struct pair {
	const tens *t;
	ulp_dtype dt;
	const uint8_t *src, *ref; /* ref NULL: no same-named tensor of the same size */
	uint8_t ref_sha[ULP_SHA256_LEN];
	size_t bytes;
	uint8_t *blob;
	size_t blob_len, blob_cap;
	ulp_enc_stats st;
	uint8_t *out;             /* decode target, pre-touched */
	uint8_t *bgxor;           /* byte-grouped XOR (or raw), for zstd */
	uint8_t *zbuf, *zbuf19;   /* zstd -3 and -19 frames of bgxor */
	size_t zcap, z3_len, z19_len;
} pair;

typedef struct group {
	const char *name;
	pair **p;
	size_t n;
	int enabled;
	/* results */
	uint64_t raw, ulp, z3, z19, elems, tables;
	double bound_bits;
	double enc1, dec1, encn, decn, mcpy; /* MB/s */
	double z3enc, z3dec, z3encn, z3decn, z19enc, z19dec, z19encn, z19decn;
	int ok;
} group;

typedef struct run {
	group *g;
	int mode;
	size_t *order;      /* M_ENC_MT, M_DEC_MT: tensors, largest first */
	ulp_pool *pool;     /* the pool the tensors' chunks run on */
} run;

/* M_ENC_CH, M_DEC_CH: one tensor at a time, chunk-parallel (small ones across
 * tensors): the serial fraction of coding one large tensor */
enum { M_ENC, M_DEC, M_ENC_MT, M_DEC_MT, M_Z3ENC, M_Z3DEC, M_Z19ENC, M_Z19DEC, M_MEMCPY, M_ENC_CH,
       M_DEC_CH };

/* zstd on one pair's byte-grouped XOR: level 3 or 19, compress or decompress */
static int zstd_one(pair *p, int mode)
{
	int l19 = mode == M_Z19ENC || mode == M_Z19DEC;
	uint8_t *zb = l19 ? p->zbuf19 : p->zbuf;
	if (mode == M_Z3ENC || mode == M_Z19ENC) {
		size_t z = ZSTD_compress(zb, p->zcap, p->bgxor, p->bytes, l19 ? 19 : 3);
		if (ZSTD_isError(z))
			return -ULP_E_NOMEM;
		*(l19 ? &p->z19_len : &p->z3_len) = z;
		return 0;
	}
	size_t z = ZSTD_decompress(p->out, p->bytes, zb, l19 ? p->z19_len : p->z3_len);
	return ZSTD_isError(z) || z != p->bytes ? -ULP_E_CORRUPT : 0;
}

/* with_stats: also compute the model bound (not part of the timed work) */
static int enc_one(pair *p, ulp_pool *pool, int with_stats)
{
	/* the reference's identity is known to whoever chose it (as in an archive) */
	ulp_enc_opts o = {.ref_sha256 = p->ref ? p->ref_sha : NULL};
	int64_t n = ulp_encode(&o, pool, p->dt, p->blob, p->blob_cap, p->src, p->bytes, p->ref,
	                       p->ref ? p->bytes : 0, with_stats ? &p->st : NULL);
	if (n < 0)
		return (int)n;
	p->blob_len = (size_t)n;
	return 0;
}

static int dec_one(pair *p, ulp_pool *pool)
{
	ulp_blob *b;
	int rc = ulp_blob_open(p->blob, p->blob_len, &b, NULL, 0);
	if (rc < 0)
		return rc;
	int64_t n = ulp_blob_decode(b, pool, p->out, p->bytes, p->ref, p->ref ? p->bytes : 0);
	ulp_blob_close(b);
	return n < 0 ? (int)n : 0;
}

static int job_small(void *arg, size_t i)
{
	run *r = arg;
	pair *p = r->g->p[i];
	if (r->mode != M_ENC_CH && r->mode != M_DEC_CH) /* zstd: one tensor a job */
		return zstd_one(p, r->mode);
	if (p->bytes > ((size_t)ulp_dtype_size(p->dt) << ULP_DEFAULT_CHUNK_LOG2))
		return 0; /* several chunks: done chunk-parallel */
	return r->mode == M_ENC_CH ? enc_one(p, NULL, 0) : dec_one(p, NULL);
}

/* ULPack on the pool: one tensor a job, largest first, each coding its
 * chunks on the same pool (nested: idle threads take chunks of any) */
static int job_tensor(void *arg, size_t i)
{
	run *r = arg;
	pair *p = r->g->p[r->order[i]];
	return r->mode == M_ENC_MT ? enc_one(p, r->pool, 0) : dec_one(p, r->pool);
}

/* One pass over the group in the given mode; zstd modes run across tensors
 * on the pool when one is given. */
static int run_once(group *g, ulp_pool *pool, int mode)
{
	int rc = 0;
	if (pool && mode >= M_Z3ENC && mode <= M_Z19DEC) {
		run r = {g, mode, NULL, NULL};
		return ulp_pool_run(pool, g->n, job_small, &r);
	}
	switch (mode) {
	case M_ENC:
	case M_DEC:
		for (size_t i = 0; i < g->n && rc == 0; i++)
			rc = mode == M_ENC ? enc_one(g->p[i], NULL, 0) : dec_one(g->p[i], NULL);
		return rc;
	case M_ENC_CH:
	case M_DEC_CH: {
		for (size_t i = 0; i < g->n && rc == 0; i++) {
			pair *p = g->p[i];
			if (p->bytes > ((size_t)ulp_dtype_size(p->dt) << ULP_DEFAULT_CHUNK_LOG2))
				rc = mode == M_ENC_CH ? enc_one(p, pool, 0) : dec_one(p, pool);
		}
		run r = {g, mode, NULL, pool};
		return rc ? rc : ulp_pool_run(pool, g->n, job_small, &r);
	}
	case M_ENC_MT:
	case M_DEC_MT: {
		size_t *order = malloc((g->n ? g->n : 1) * sizeof(size_t));
		if (!order)
			return -ULP_E_NOMEM;
		for (size_t i = 0; i < g->n; i++) { /* insertion sort: a few hundred tensors at most */
			size_t k = i;
			for (; k > 0 && g->p[order[k - 1]]->bytes < g->p[i]->bytes; k--)
				order[k] = order[k - 1];
			order[k] = i;
		}
		run r = {g, mode, order, pool};
		rc = ulp_pool_run(pool, g->n, job_tensor, &r);
		free(order);
		return rc;
	}
	case M_Z3ENC:
	case M_Z3DEC:
	case M_Z19ENC:
	case M_Z19DEC:
		for (size_t i = 0; i < g->n && rc == 0; i++)
			rc = zstd_one(g->p[i], mode);
		return rc;
	default:
		for (size_t i = 0; i < g->n; i++)
			memcpy(g->p[i]->out, g->p[i]->src, g->p[i]->bytes);
		return 0;
	}
}

/* Share of a one-thread pass's wall time spent outside parallel regions
 * (ulp_pool_parallel_ns): the part that more threads cannot shorten. The
 * pool has one thread, so every region runs on this thread. */
static double serial_share(group *g, int mode, int reps)
{
	ulp_pool *one;
	double best = 1;
	if (ulp_pool_new(1, &one) < 0)
		return -1;
	for (int r = 0; r < reps; r++) {
		uint64_t p0 = ulp_pool_parallel_ns();
		double t0 = cli_now();
		if (run_once(g, one, mode) < 0)
			break;
		double wall = (cli_now() - t0) * 1e9, par = (double)(ulp_pool_parallel_ns() - p0);
		if (wall > 0 && 1 - par / wall < best)
			best = 1 - par / wall; /* the least disturbed repetition */
	}
	ulp_pool_free(one);
	return best < 0 ? 0 : best;
}

/* The same for `ulpack import --threads 1` of REF then TARGET into a fresh
 * archive: the share of TARGET's put outside parallel regions (the commit's
 * fsyncs included); the least disturbed of three. */
static double serial_share_import_once(const char *ref, const char *target, double *fsync_share)
{
	char dir[] = "/tmp/ulpack-bench-XXXXXX", adir[64];
	double share = -1;
	if (!mkdtemp(dir))
		return -1;
	snprintf(adir, sizeof(adir), "%s/a", dir);
	ulp_archive *a = NULL;
	ulp_archive_opts o = {.threads = 1};
	if (mkdir(adir, 0700) == 0 && ulp_archive_init(adir, NULL, 0) == 0 &&
	    ulp_archive_open(adir, &o, &a, NULL, 0) == 0) {
		int f1 = open(ref, O_RDONLY), f2 = open(target, O_RDONLY);
		if (f1 >= 0 && f2 >= 0 && ulp_archive_put(a, "run/checkpoint-1/model.safetensors", f1, NULL, NULL) == 0) {
			uint64_t p0 = ulp_pool_parallel_ns(), s0 = ulp_pack_sync_ns();
			double t0 = cli_now();
			if (ulp_archive_put(a, "run/checkpoint-2/model.safetensors", f2, NULL, NULL) == 0) {
				double wall = (cli_now() - t0) * 1e9;
				share = 1 - (double)(ulp_pool_parallel_ns() - p0) / wall;
				*fsync_share = (double)(ulp_pack_sync_ns() - s0) / wall;
			}
		}
		if (f1 >= 0)
			close(f1);
		if (f2 >= 0)
			close(f2);
		ulp_archive_close(a);
	}
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	int rm = system(cmd); /* a leftover temporary directory is no failure */
	(void)rm;
	return share;
}

/* *fsync_share: of the same run, the share of the wall time spent in the
 * pack's fsyncs (ulp_pack_sync_ns: a disk's latency, which `ulpack import`
 * of a run overlaps with the next file's coding) */
static double serial_share_import(const char *ref, const char *target, double *fsync_share)
{
	double best = -1;
	*fsync_share = 0;
	for (int r = 0; r < 3; r++) {
		double fs = 0, s = serial_share_import_once(ref, target, &fs);
		if (s >= 0 && (best < 0 || s < best)) {
			best = s;
			*fsync_share = fs;
		}
	}
	return best;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median MB/s over `reps` repetitions, each at least min_time seconds. */
static double measure(group *g, ulp_pool *pool, int mode, int reps, double min_time, int *rc)
{
	double rates[16];
	if (reps > 16)
		reps = 16;
	/* calibrate: iterations per repetition */
	double t0 = cli_now();
	*rc = run_once(g, pool, mode);
	double one = cli_now() - t0;
	if (*rc < 0)
		return 0;
	long iters = one > 0 ? (long)ceil(min_time / one) : 1000;
	if (iters < 1)
		iters = 1;
	for (int r = 0; r < reps; r++) {
		t0 = cli_now();
		for (long i = 0; i < iters; i++)
			if ((*rc = run_once(g, pool, mode)) < 0)
				return 0;
		double dt = cli_now() - t0;
		rates[r] = (double)g->raw * (double)iters / dt / 1e6;
	}
	qsort(rates, (size_t)reps, sizeof(double), cmp_double);
	return rates[reps / 2];
}

static void json_group(FILE *f, const group *g, const char *indent)
{
	fprintf(f, "{\n%s  \"raw_bytes\": %llu, \"elements\": %llu,\n", indent,
	        (unsigned long long)g->raw, (unsigned long long)g->elems);
	fprintf(f, "%s  \"ulpack_bytes\": %llu, \"table_bytes\": %llu, \"bound_bytes\": %.0f,\n", indent,
	        (unsigned long long)g->ulp, (unsigned long long)g->tables, ceil(g->bound_bits / 8));
	fprintf(f, "%s  \"ratio\": %.6f, \"bits_per_weight\": %.4f, \"bound_bits_per_weight\": %.4f, \"ulpack_over_bound\": %.5f,\n",
	        indent, (double)g->ulp / (double)g->raw, 8.0 * (double)g->ulp / (double)g->elems,
	        g->bound_bits / (double)g->elems, g->bound_bits > 0 ? 8.0 * (double)g->ulp / g->bound_bits : 0.0);
	fprintf(f, "%s  \"zstd19_bgxor_bytes\": %llu, \"zstd3_bgxor_bytes\": %llu,\n", indent,
	        (unsigned long long)g->z19, (unsigned long long)g->z3);
	fprintf(f, "%s  \"encode_mbps\": %.1f, \"decode_mbps\": %.1f, \"encode_mbps_mt\": %.1f, \"decode_mbps_mt\": %.1f,\n",
	        indent, g->enc1, g->dec1, g->encn, g->decn);
	fprintf(f, "%s  \"zstd3_encode_mbps\": %.1f, \"zstd3_decode_mbps\": %.1f, \"zstd3_encode_mbps_mt\": %.1f, \"zstd3_decode_mbps_mt\": %.1f,\n",
	        indent, g->z3enc, g->z3dec, g->z3encn, g->z3decn);
	fprintf(f, "%s  \"zstd19_encode_mbps\": %.1f, \"zstd19_decode_mbps\": %.1f, \"zstd19_encode_mbps_mt\": %.1f, \"zstd19_decode_mbps_mt\": %.1f,\n",
	        indent, g->z19enc, g->z19dec, g->z19encn, g->z19decn);
	fprintf(f, "%s  \"memcpy_mbps\": %.1f,\n", indent, g->mcpy);
	fprintf(f, "%s  \"roundtrip_ok\": %s\n%s}", indent, g->ok ? "true" : "false", indent);
}

static void text_group(const group *g)
{
	printf("%-6s %10llu %10llu %7.4f %7.3f %7.3f %6.4f %10llu %10llu | %7.1f %7.1f %7.1f %7.1f |"
	       " %7.1f %7.1f %7.1f %7.1f | %6.1f %7.1f %6.1f %7.1f | %8.1f %s\n",
	       g->name, (unsigned long long)g->raw, (unsigned long long)g->ulp,
	       (double)g->ulp / (double)g->raw, 8.0 * (double)g->ulp / (double)g->elems,
	       g->bound_bits / (double)g->elems,
	       g->bound_bits > 0 ? 8.0 * (double)g->ulp / g->bound_bits : 0.0,
	       (unsigned long long)g->z19, (unsigned long long)g->z3, g->enc1, g->dec1, g->encn,
	       g->decn, g->z3enc, g->z3dec, g->z3encn, g->z3decn, g->z19enc, g->z19dec, g->z19encn,
	       g->z19decn, g->mcpy, g->ok ? "ok" : "FAILED");
}

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: ulpack bench REF TARGET [--json] [--threads N]\n"
	        "                    [--reps R] [--min-time SECONDS] [--cpu scalar|avx2|avx512|neon] [--quick]\n"
	        "REF and TARGET: two safetensors files, or two torch.save files (their storages).\n"
	        "Codes each tensor of TARGET against the same-named tensor of REF, decodes it,\n"
	        "checks byte identity, and reports per dtype and in total: raw and ULPack bytes,\n"
	        "bits/weight, the model bound, zstd -19/-3 on the byte-grouped XOR, and encode and\n"
	        "decode MB/s at 1 and N threads next to zstd -3 and memcpy in the same run.\n"
	        "--cpu limits the kernels to a path (default: the best this CPU has).\n"
	        "--quick skips zstd -19 (its columns read 0). serial_fraction: the share of a one-\n"
	        "thread encode, decode and import (of REF then TARGET) outside parallel regions;\n"
	        "import_fsync: the part of import's spent in the pack's fsyncs (the disk's).\n");
}

static void tfile_free(tfile *f)
{
	ulp_st_free(f->st);
	ulp_tz_free(f->tz);
	free(f->t);
	free(f->buf);
	memset(f, 0, sizeof(*f));
}

/* A ZIP (local header signature first) is read as torch.save, anything
 * else as safetensors. */
static int load(const char *path, tfile *f)
{
	char err[256];
	memset(f, 0, sizeof(*f));
	if (cli_read_file(path, &f->buf, &f->len) < 0)
		return -1;
	int zip = f->len >= 4 && memcmp(f->buf, "PK\3\4", 4) == 0;
	int rc = zip ? ulp_tz_parse_mem(f->buf, f->len, &f->tz, err, sizeof(err))
	             : ulp_st_parse(f->buf, f->len, f->len, &f->st, NULL, err, sizeof(err));
	if (rc < 0) {
		cli_fail("%s: not a valid %s file: %s", path, zip ? "torch.save" : "safetensors",
		         rc == -ULP_E_CORRUPT ? err : ulp_strerror(rc));
		tfile_free(f);
		return -1;
	}
	f->n = f->st ? ulp_st_count(f->st) : ulp_tz_count(f->tz);
	if (!(f->t = calloc(f->n ? f->n : 1, sizeof(tens)))) {
		tfile_free(f);
		return cli_fail("out of memory");
	}
	for (size_t i = 0; i < f->n; i++) {
		if (f->st) {
			const ulp_st_tensor *t = ulp_st_tensor_at(f->st, i);
			f->t[i] = (tens){t->name, t->dtype_name, t->dtype,
			                 f->buf + ulp_st_data_offset(f->st) + t->begin, (size_t)(t->end - t->begin)};
		} else {
			const ulp_tz_storage *t = ulp_tz_at(f->tz, i);
			f->t[i] = (tens){t->name, ulp_dtype_name(t->dtype), t->dtype, f->buf + t->offset,
			                 (size_t)t->length};
		}
	}
	return 0;
}

static const tens *tfind(const tfile *f, const char *name)
{
	for (size_t i = 0; i < f->n; i++)
		if (!strcmp(f->t[i].name, name))
			return &f->t[i];
	return NULL;
}

int cmd_bench(int argc, char **argv)
{
	const char *paths[2] = {0};
	int np = 0, json = 0, threads = 0, reps = 5, quick = 0;
	double min_time = 0.1;
	unsigned cpu = ulp_cpu_features();
	for (int i = 1; i < argc; i++) {
		if (cli_is_help(argv[i])) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--quick")) {
			quick = 1;
		} else if ((!strcmp(argv[i], "--threads") || !strcmp(argv[i], "--reps") ||
		            !strcmp(argv[i], "--min-time") || !strcmp(argv[i], "--cpu")) && i + 1 == argc) {
			return cli_opt_missing(argv[i]);
		} else if (!strcmp(argv[i], "--threads")) {
			int64_t v;
			if (cli_opt_int(argv[i], argv[i + 1], 0, ULP_MAX_THREADS, &v)) /* 0: one per CPU */
				return 2;
			threads = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--reps")) {
			int64_t v;
			if (cli_opt_int(argv[i], argv[i + 1], 1, 1000000, &v))
				return 2;
			reps = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--min-time")) {
			if (cli_opt_double(argv[i], argv[i + 1], 0, 3600, &min_time))
				return 2;
			i++;
		} else if (!strcmp(argv[i], "--cpu")) {
			const char *c = argv[++i];
			unsigned want = !strcmp(c, "scalar") ? 0
			                : !strcmp(c, "avx2") ? ULP_CPU_AVX2
			                : !strcmp(c, "avx512") ? ULP_CPU_AVX2 | ULP_CPU_AVX512
			                : !strcmp(c, "neon") ? ULP_CPU_NEON : ~0u;
			if (want == ~0u)
				return cli_fail("--cpu '%s': not a kernel set (scalar, avx2, avx512 or neon)", c) + 1;
			if ((ulp_cpu_features() & want) != want)
				return cli_fail("this CPU or build has no %s kernels", c) + 1;
			cpu = want;
		} else if (argv[i][0] == '-') {
			usage(stderr);
			return cli_fail("unknown option '%s'", argv[i]) + 1;
		} else if (np < 2) {
			paths[np++] = argv[i];
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (np != 2) {
		usage(stderr);
		return 2;
	}
	if (reps < 1)
		reps = 1;
	tfile rf, tf;
	if (load(paths[0], &rf) < 0)
		return 1;
	if (load(paths[1], &tf) < 0) {
		tfile_free(&rf);
		return 1;
	}
	ulp_set_cpu_mask(cpu);
	const char *path = (cpu & ULP_CPU_AVX512) ? "avx512" : (cpu & ULP_CPU_AVX2) ? "avx2"
	                   : (cpu & ULP_CPU_NEON) ? "neon" : "scalar";
	ulp_pool *pool = NULL;
	int rc = ulp_pool_new(threads, &pool);
	if (rc < 0)
		return cli_fail("cannot start threads: %s", ulp_strerror(rc));
	size_t n = tf.n;
	pair *pairs = calloc(n ? n : 1, sizeof(pair));
	pair **order = calloc(n ? n : 1, sizeof(pair *));
	group groups[ULP_DT__COUNT + 1];
	memset(groups, 0, sizeof(groups));
	int status = 0;
	for (size_t i = 0; i < n; i++) {
		pair *p = &pairs[i];
		p->t = &tf.t[i];
		p->dt = p->t->dt;
		p->bytes = p->t->bytes;
		p->src = p->t->p;
		const tens *r = tfind(&rf, p->t->name);
		if (r && r->dt == p->dt && r->bytes == p->bytes && strcmp(r->dtype_name, p->t->dtype_name) == 0)
			p->ref = r->p;
		if (p->ref)
			ulp_sha256(p->ref, p->bytes, p->ref_sha);
		p->blob_cap = ulp_encode_bound(p->dt, p->bytes, NULL);
		p->blob = malloc(p->blob_cap);
		p->out = malloc(p->bytes ? p->bytes : 1);
		p->bgxor = malloc(p->bytes ? p->bytes : 1);
		p->zcap = ZSTD_compressBound(p->bytes);
		p->zbuf = malloc(p->zcap);
		p->zbuf19 = malloc(p->zcap);
		if (!p->blob || !p->out || !p->bgxor || !p->zbuf || !p->zbuf19) {
			status = cli_fail("out of memory");
			goto out;
		}
		memset(p->out, 0, p->bytes);
		uint8_t *x = p->out; /* scratch: XOR, then group */
		for (size_t b = 0; b < p->bytes; b++)
			x[b] = p->src[b] ^ (p->ref ? p->ref[b] : 0);
		unsigned es = ulp_dtype_size(p->dt);
		for (unsigned j = 0; j < es; j++)
			for (size_t e = 0; e < p->bytes / es; e++)
				p->bgxor[j * (p->bytes / es) + e] = x[e * es + j];
		groups[p->dt].name = ulp_dtype_name(p->dt);
		groups[p->dt].enabled = 1;
	}
	/* group pointers: per dtype and total */
	group *total = &groups[ULP_DT__COUNT];
	total->name = "total";
	total->enabled = 1;
	for (int d = 0; d <= ULP_DT__COUNT; d++) {
		group *g = &groups[d];
		g->ok = 1;
		if (!g->enabled)
			continue;
		g->p = d == ULP_DT__COUNT ? order : calloc(n ? n : 1, sizeof(pair *));
		for (size_t i = 0; i < n; i++)
			if (d == ULP_DT__COUNT || pairs[i].dt == (ulp_dtype)d)
				g->p[g->n++] = &pairs[i];
	}
	/* sizes, round trip, identity across thread counts */
	for (size_t i = 0; i < n; i++) {
		pair *p = &pairs[i];
		group *g = &groups[p->dt];
		if ((rc = enc_one(p, NULL, 1)) < 0) {
			status = cli_fail("%s: encoding tensor '%s' failed: %s", paths[1], p->t->name,
			                  ulp_strerror(rc));
			goto out;
		}
		uint8_t *copy = malloc(p->blob_len ? p->blob_len : 1);
		size_t len1 = p->blob_len;
		memcpy(copy, p->blob, len1);
		int ok = dec_one(p, NULL) == 0 && memcmp(p->out, p->src, p->bytes) == 0;
		ok = ok && enc_one(p, pool, 0) == 0 && p->blob_len == len1 && memcmp(copy, p->blob, len1) == 0;
		ok = ok && dec_one(p, pool) == 0 && memcmp(p->out, p->src, p->bytes) == 0;
		free(copy);
		size_t z19 = ZSTD_compress(p->zbuf19, p->zcap, p->bgxor, p->bytes, 19);
		size_t z3 = ZSTD_compress(p->zbuf, p->zcap, p->bgxor, p->bytes, 3);
		p->z19_len = ZSTD_isError(z19) ? p->bytes : z19;
		p->z3_len = ZSTD_isError(z3) ? p->bytes : z3;
		for (group *x = g; x; x = x == total ? NULL : total) {
			x->raw += p->bytes;
			x->elems += p->bytes / ulp_dtype_size(p->dt);
			x->ulp += p->blob_len;
			x->tables += p->st.table_bytes;
			x->bound_bits += p->st.bound_bits;
			x->z19 += p->z19_len;
			x->z3 += p->z3_len;
			x->ok = x->ok && ok;
		}
		if (!ok) {
			cli_fail("tensor '%s' (%s) does not round-trip", p->t->name, ulp_dtype_name(p->dt));
			status = 1;
		}
	}
	/* speeds */
	int n_enabled = 0;
	for (int d = 0; d < ULP_DT__COUNT; d++)
		n_enabled += groups[d].enabled;
	for (int d = 0; d <= ULP_DT__COUNT; d++) {
		group *g = &groups[d];
		if (!g->enabled || g->raw == 0)
			continue;
		if (d == ULP_DT__COUNT && n_enabled == 1) { /* one dtype: the total is that group */
			group keep = *g;
			for (int e = 0; e < ULP_DT__COUNT; e++)
				if (groups[e].enabled)
					*g = groups[e];
			g->name = keep.name;
			g->p = keep.p;
			continue;
		}
		int r[15] = {0}, bad = 0;
		g->enc1 = measure(g, NULL, M_ENC, reps, min_time, &r[0]);
		g->dec1 = measure(g, NULL, M_DEC, reps, min_time, &r[1]);
		g->encn = measure(g, pool, M_ENC_MT, reps, min_time, &r[2]);
		g->decn = measure(g, pool, M_DEC_MT, reps, min_time, &r[3]);
		g->z3enc = measure(g, NULL, M_Z3ENC, reps, min_time, &r[4]);
		g->z3dec = measure(g, NULL, M_Z3DEC, reps, min_time, &r[5]);
		g->z3encn = measure(g, pool, M_Z3ENC, reps, min_time, &r[6]);
		g->z3decn = measure(g, pool, M_Z3DEC, reps, min_time, &r[7]);
		/* zstd -19 runs a few seconds a pass: fewer repetitions */
		int r19 = reps < 3 ? reps : 3;
		if (!quick) {
			g->z19enc = measure(g, NULL, M_Z19ENC, r19, 0, &r[8]);
			g->z19dec = measure(g, NULL, M_Z19DEC, reps, min_time, &r[9]);
			g->z19encn = measure(g, pool, M_Z19ENC, r19, 0, &r[10]);
			g->z19decn = measure(g, pool, M_Z19DEC, reps, min_time, &r[11]);
		}
		g->mcpy = measure(g, NULL, M_MEMCPY, reps, min_time, &r[12]);
		for (int i = 0; i < 13; i++)
			bad |= r[i] < 0;
		if (bad) {
			status = cli_fail("a timed run failed");
			goto out;
		}
	}
	double sf_enc = serial_share(total, M_ENC_CH, reps), sf_dec = serial_share(total, M_DEC_CH, reps);
	double sf_sync, sf_imp = serial_share_import(paths[0], paths[1], &sf_sync);
	if (json) {
		printf("{\n  \"ref\": \"%s\", \"target\": \"%s\", \"threads\": %d, \"tensors\": %zu,\n"
		       "  \"cpu\": \"%s\",\n",
		       paths[0], paths[1], ulp_pool_threads(pool), n, path);
		printf("  \"serial_fraction\": {\"encode\": %.4f, \"decode\": %.4f, \"import\": %.4f,"
		       " \"import_fsync\": %.4f},\n", sf_enc, sf_dec, sf_imp, sf_sync);
		printf("  \"total\": ");
		json_group(stdout, total, "  ");
		printf(",\n  \"by_dtype\": {");
		int first = 1;
		for (int d = 0; d < ULP_DT__COUNT; d++) {
			if (!groups[d].enabled)
				continue;
			printf("%s\n    \"%s\": ", first ? "" : ",", groups[d].name);
			json_group(stdout, &groups[d], "    ");
			first = 0;
		}
		printf("\n  }\n}\n");
	} else {
		printf("ulpack bench: %s -> %s, %zu tensors, %d threads, %s kernels (MB/s: median of %d)\n",
		       paths[0], paths[1], n, ulp_pool_threads(pool), path, reps);
		printf("%-6s %10s %10s %7s %7s %7s %6s %10s %10s | %-31s | %-31s | %-29s | %8s\n", "", "", "",
		       "", "", "", "", "", "", "ULPack MB/s", "zstd -3 (bgxor) MB/s", "zstd -19 (bgxor) MB/s", "");
		printf("%-6s %10s %10s %7s %7s %7s %6s %10s %10s | %7s %7s %7s %7s | %7s %7s %7s %7s | %6s %7s %6s %7s | %8s\n",
		       "dtype", "raw", "ulpack", "ratio", "bits/w", "bound", "x bnd", "zstd19bgx", "zstd3bgx",
		       "enc", "dec", "enc-mt", "dec-mt", "enc", "dec", "enc-mt", "dec-mt", "enc", "dec",
		       "enc-mt", "dec-mt", "memcpy");
		for (int d = 0; d < ULP_DT__COUNT; d++)
			if (groups[d].enabled)
				text_group(&groups[d]);
		text_group(total);
		printf("serial fraction (one thread, time outside parallel regions): encode %.4f, decode %.4f,"
		       " import %.4f (of which the pack's fsync %.4f)\n", sf_enc, sf_dec, sf_imp, sf_sync);
	}
	if (!total->ok)
		status = 1;
out:
	for (size_t i = 0; i < n; i++) {
		free(pairs[i].blob);
		free(pairs[i].out);
		free(pairs[i].bgxor);
		free(pairs[i].zbuf);
		free(pairs[i].zbuf19);
	}
	for (int d = 0; d < ULP_DT__COUNT; d++)
		free(groups[d].p);
	free(order);
	free(pairs);
	ulp_pool_free(pool);
	tfile_free(&rf);
	tfile_free(&tf);
	return status;
}
