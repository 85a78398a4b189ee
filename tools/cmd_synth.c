/* SPDX-License-Identifier: MIT */
/*
 * cmd_synth.c - `ulpack synth OUTDIR`: a deterministic synthetic training
 * trajectory, OUTDIR/checkpoint-<step>/model.safetensors, from fp32 master
 * weights updated by AdamW on synthetic gradients (linear warm-up, cosine
 * decay, weight decay). It has transformer-like shapes, norms initialized to
 * one, zero-initialized biases, a frozen tensor and one tensor of at least a
 * million elements, so it exercises every path of the codec. --layers sets
 * the transformer blocks (default 2); --spike STEP plants a jump at STEP:
 * the optimizer steps that lead to it move the middle block and the one
 * after it 30 times as far (a loss spike's update, for `ulpack dynamics`).
 * Without them the output is what it always was.
 */
#include "cli.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct stensor {
	char name[96];
	uint64_t shape[2];
	unsigned ndim;
	int kind;        /* 0 matrix (normal init), 1 norm (ones), 2 bias (zeros) */
	int frozen;
	ulp_dtype dt;
	float *w, *m, *v;
	size_t n;
} stensor;

static uint64_t rng_state;

static uint64_t rng_next(void)
{
	uint64_t x = rng_state;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return x * 0x2545F4914F6CDD1Dull;
}

/* approximately N(0, 1): Irwin-Hall of four uniforms, rescaled */
static float gauss(void)
{
	float s = 0;
	for (int i = 0; i < 4; i++)
		s += (float)(rng_next() >> 40) * (1.0f / 16777216.0f);
	return (s - 2.0f) * 1.7320508f;
}

static uint16_t to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)(u >> 16 | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static uint16_t to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000u;
	int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
	uint32_t m = u & 0x7fffffu;
	if (((u >> 23) & 0xff) == 0xff)
		return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) { /* subnormal or zero, round to nearest even */
		if (e < -10)
			return (uint16_t)sign;
		m |= 0x800000u;
		unsigned shift = (unsigned)(14 - e);
		uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = (uint32_t)e << 10 | m >> 13, rem = m & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* approximately N(0, 1) from the hash h: Irwin-Hall of its four 16-bit parts */
static float hgauss(uint64_t h)
{
	float s = 0;
	for (int i = 0; i < 4; i++, h >>= 16)
		s += (float)(h & 0xffff) * (1.0f / 65536.0f);
	return (s - 2.0f) * 1.7320508f;
}

/*
 * --big-tensor-mb: element j at step index s of a tensor that drifts like a
 * trained embedding (a fixed start, a steady direction, fresh noise each
 * step), computed from j alone, so the tensor is written in blocks and never
 * held. Its bytes go to a file of their own, mapped for ulp_st_write: file
 * pages, not anonymous memory.
 */
static int big_tensor_file(const char *path, uint64_t bytes, uint64_t seed, int s, const void **map)
{
	enum { BLOCK = 1 << 22 };
	uint16_t *blk = malloc(BLOCK);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int rc = blk && fd >= 0 ? 0 : -1;
	for (uint64_t off = 0; rc == 0 && off < bytes; off += BLOCK) {
		size_t n = (size_t)(bytes - off < BLOCK ? bytes - off : BLOCK) / 2;
		for (size_t k = 0; k < n; k++) {
			uint64_t j = off / 2 + k, h = mix64(seed ^ j * 3);
			float w = 0.02f * (hgauss(h) + 0.01f * (float)s * hgauss(mix64(h + 1)) +
			                   0.003f * hgauss(mix64(h + 2 + (uint64_t)s)));
			blk[k] = to_bf16(w);
		}
		if (pwrite(fd, blk, n * 2, (off_t)off) != (ssize_t)(n * 2))
			rc = -1;
	}
	free(blk);
	*map = NULL;
	if (rc == 0 && bytes) {
		void *m = mmap(NULL, (size_t)bytes, PROT_READ, MAP_SHARED, fd, 0);
		if (m == MAP_FAILED)
			rc = -1;
		else
			*map = m;
	}
	if (fd >= 0)
		close(fd);
	unlink(path);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f,
	        "usage: ulpack synth OUTDIR [--steps N] [--interval K] [--dtype bf16|f16|f32|mixed]\n"
	        "                    [--dim D] [--vocab V] [--seed S] [--layers L] [--spike STEP]\n"
	        "Writes a deterministic synthetic trajectory: OUTDIR/checkpoint-<step>/model.safetensors\n"
	        "for steps K, 2K, ... NK (defaults: 8 steps, interval 100, bf16, D = 512: about\n"
	        "8.4M parameters a checkpoint). --vocab sets the rows of the embedding and the\n"
	        "lm_head (default 4D): --dim 8192 --vocab 131072 gives two 2 GiB bf16 tensors\n"
	        "(synth itself then holds 12 bytes a parameter).\n"
	        "--big-tensor-mb N adds model.big_embed.weight, N MiB of bf16 made up afresh at\n"
	        "each step (a drifting embedding: deltas like the other tensors'), written in\n"
	        "blocks: a 2 GiB tensor costs synth no memory (--dim 64 --big-tensor-mb 2048).\n"
	        "--layers L: L transformer blocks (default 2, at most 12). --spike STEP: the update\n"
	        "that leads to checkpoint STEP moves blocks L/2 and L/2 + 1 30 times as far.\n");
}

static int mkdir_p(const char *path)
{
	char tmp[4096];
	size_t len = strlen(path);
	if (len >= sizeof(tmp))
		return -1;
	memcpy(tmp, path, len + 1);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return mkdir(tmp, 0755) < 0 && errno != EEXIST ? -1 : 0;
}

int cmd_synth(int argc, char **argv)
{
	const char *out = NULL, *dtype = "bf16";
	int steps = 8, interval = 100, dim = 512;
	int64_t vocab_rows = 0; /* 0: 4 * dim */
	int64_t big_mb = 0;     /* --big-tensor-mb: 0 none */
	int64_t spike = -1;     /* --spike: the step whose update is planted */
	int layers = 2;
	unsigned long long seed = 20261130;
	int64_t v;
	for (int i = 1; i < argc; i++) {
		if (cli_is_help(argv[i])) {
			usage(stdout);
			return 0;
		} else if ((!strcmp(argv[i], "--steps") || !strcmp(argv[i], "--interval") || !strcmp(argv[i], "--dtype") ||
		            !strcmp(argv[i], "--dim") || !strcmp(argv[i], "--seed") ||
		            !strcmp(argv[i], "--vocab") || !strcmp(argv[i], "--big-tensor-mb") ||
		            !strcmp(argv[i], "--layers") || !strcmp(argv[i], "--spike")) && i + 1 == argc) {
			return cli_opt_missing(argv[i]);
		} else if (!strcmp(argv[i], "--steps")) {
			if (cli_opt_int(argv[i], argv[i + 1], 1, 100000, &v))
				return 2;
			steps = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--interval")) {
			/* the last step, steps * interval, stays far inside an int64 */
			if (cli_opt_int(argv[i], argv[i + 1], 1, 1000000000, &v))
				return 2;
			interval = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--dtype")) {
			dtype = argv[++i];
		} else if (!strcmp(argv[i], "--dim")) {
			if (cli_opt_int(argv[i], argv[i + 1], 8, 8192, &v))
				return 2;
			if (v % 8)
				return cli_fail("--dim '%s': not a multiple of 8", argv[i + 1]) + 1;
			dim = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--vocab")) {
			if (cli_opt_int(argv[i], argv[i + 1], 1, (int64_t)1 << 24, &v))
				return 2;
			vocab_rows = v;
			i++;
		} else if (!strcmp(argv[i], "--big-tensor-mb")) {
			if (cli_opt_int(argv[i], argv[i + 1], 0, (int64_t)1 << 20, &v))
				return 2;
			big_mb = v;
			i++;
		} else if (!strcmp(argv[i], "--layers")) {
			if (cli_opt_int(argv[i], argv[i + 1], 1, 12, &v))
				return 2;
			layers = (int)v;
			i++;
		} else if (!strcmp(argv[i], "--spike")) {
			if (cli_opt_int(argv[i], argv[i + 1], 1, INT32_MAX, &v))
				return 2;
			spike = v;
			i++;
		} else if (!strcmp(argv[i], "--seed")) {
			if (cli_opt_int(argv[i], argv[i + 1], 0, INT64_MAX, &v))
				return 2;
			seed = (unsigned long long)v;
			i++;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			usage(stderr);
			return cli_fail("unknown option '%s'", argv[i]) + 1;
		} else if (out) {
			usage(stderr);
			return 2;
		} else {
			out = argv[i];
		}
	}
	if (out && (int64_t)steps * interval > INT32_MAX) /* step numbers are ints */
		return cli_fail("--steps %d --interval %d: the last step, %lld, is past %d", steps, interval,
		                (long long)steps * interval, INT32_MAX) + 1;
	if (!out || steps < 1 || steps > 100000 || interval < 1 || dim < 8 || dim > 8192 || dim % 8) {
		usage(stderr);
		return 2;
	}
	ulp_dtype mat_dt, vec_dt;
	if (!strcmp(dtype, "bf16"))
		mat_dt = vec_dt = ULP_DT_BF16;
	else if (!strcmp(dtype, "f16"))
		mat_dt = vec_dt = ULP_DT_F16;
	else if (!strcmp(dtype, "f32"))
		mat_dt = vec_dt = ULP_DT_F32;
	else if (!strcmp(dtype, "mixed"))
		mat_dt = ULP_DT_BF16, vec_dt = ULP_DT_F32;
	else
		return cli_fail("unknown dtype '%s' (bf16, f16, f32 or mixed)", dtype);

	rng_state = seed * 2 + 1;
	const uint64_t d = (uint64_t)dim, vocab = vocab_rows ? (uint64_t)vocab_rows : 4 * d;
	stensor ts[8 + 7 * 12];
	size_t nt = 0;
#define ADD(nm, r, c, k, fz) do {                                              \
		stensor *t = &ts[nt++];                                          \
		memset(t, 0, sizeof(*t));                                         \
		snprintf(t->name, sizeof(t->name), "%s", nm);                     \
		t->shape[0] = (r); t->shape[1] = (c); t->ndim = (c) != 0 ? 2 : 1;  \
		t->n = (size_t)(r) * ((c) != 0 ? (uint64_t)(c) : 1u);              \
		t->kind = (k); t->frozen = (fz);                                  \
		t->dt = (k) ? vec_dt : mat_dt;                                    \
	} while (0)
	char nm[96];
	ADD("model.embed_tokens.weight", vocab, d, 0, 0);
	ADD("model.pos_embed.weight", 128, d, 0, 1);
	for (int l = 0; l < layers; l++) {
		snprintf(nm, sizeof(nm), "model.layers.%d.input_layernorm.weight", l);
		ADD(nm, d, 0, 1, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.self_attn.qkv_proj.weight", l);
		ADD(nm, 3 * d, d, 0, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.self_attn.o_proj.weight", l);
		ADD(nm, d, d, 0, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.post_attention_layernorm.weight", l);
		ADD(nm, d, 0, 1, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.mlp.up_proj.weight", l);
		ADD(nm, 4 * d, d, 0, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.mlp.up_proj.bias", l);
		ADD(nm, 4 * d, 0, 2, 0);
		snprintf(nm, sizeof(nm), "model.layers.%d.mlp.down_proj.weight", l);
		ADD(nm, d, 4 * d, 0, 0);
	}
	ADD("model.norm.weight", d, 0, 1, 0);
	ADD("lm_head.weight", vocab, d, 0, 0);
#undef ADD
	int status = 0;
	size_t max_n = 0;
	for (size_t i = 0; i < nt; i++) {
		stensor *t = &ts[i];
		t->w = malloc(t->n * sizeof(float));
		t->m = calloc(t->n, sizeof(float));
		t->v = calloc(t->n, sizeof(float));
		if (!t->w || !t->m || !t->v) {
			status = cli_fail("out of memory");
			goto done;
		}
		float scale = 0.02f * (i == 0 ? 1.0f : 1.0f / sqrtf((float)t->shape[1] / (float)d));
		for (size_t j = 0; j < t->n; j++)
			t->w[j] = t->kind == 1 ? 1.0f : t->kind == 2 ? 0.0f : gauss() * scale;
		if (t->n > max_n)
			max_n = t->n;
	}
	uint8_t *conv = malloc(max_n * 4 * nt);
	ulp_st_wtensor *wt = calloc(nt + 1, sizeof(*wt));
	const uint64_t big_bytes = (uint64_t)big_mb << 20, big_shape[2] = {big_bytes / 2 / d, d};
	if (!conv || !wt) {
		free(conv);
		free(wt);
		status = cli_fail("out of memory");
		goto done;
	}
	const int inner = 4, total = steps * interval;
	const float peak = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
	int t_step = 0;
	for (int s = 1; s <= steps; s++) {
		/* `inner` optimizer steps stand for the `interval` real ones */
		for (int k = 0; k < inner; k++) {
			t_step++;
			double prog = (double)(s - 1) * interval + (double)(k + 1) * interval / inner;
			double warm = 0.1 * total;
			float lr = prog < warm ? (float)(peak * prog / warm)
			                       : (float)(1e-4 + 0.5 * (peak - 1e-4) *
			                                 (1 + cos(M_PI * (prog - warm) / (total - warm))));
			lr *= (float)interval / (float)inner; /* the inner step stands for several */
			int spiking = (int64_t)s * interval == spike;
			float c1 = 1.0f - powf(b1, (float)t_step), c2 = 1.0f - powf(b2, (float)t_step);
			for (size_t i = 0; i < nt; i++) {
				stensor *t = &ts[i];
				if (t->frozen)
					continue;
				float tl = lr;
				if (spiking) { /* blocks L/2 and L/2 + 1 (those there are) */
					int lo = layers / 2, hi = layers / 2 + 1, bl = -1;
					if (sscanf(t->name, "model.layers.%d.", &bl) == 1 && bl >= lo && bl <= hi)
						tl = lr * 30.0f;
				}
				for (size_t j = 0; j < t->n; j++) {
					float g = gauss() * 0.01f + (t->w[j] - (t->kind == 1 ? 1.0f : 0.0f)) * 0.05f;
					t->m[j] = b1 * t->m[j] + (1 - b1) * g;
					t->v[j] = b2 * t->v[j] + (1 - b2) * g * g;
					float upd = (t->m[j] / c1) / (sqrtf(t->v[j] / c2) + eps);
					t->w[j] -= tl * 0.1f * (upd + (t->kind ? 0.0f : wd * t->w[j]));
				}
			}
		}
		char dir[4096], path[4200];
		snprintf(dir, sizeof(dir), "%s/checkpoint-%d", out, s * interval);
		if (mkdir_p(dir) < 0) {
			status = cli_fail("%s: cannot create: %s", dir, strerror(errno));
			break;
		}
		uint8_t *p = conv;
		for (size_t i = 0; i < nt; i++) {
			stensor *t = &ts[i];
			wt[i] = (ulp_st_wtensor){t->name, t->dt, t->ndim, t->shape, p};
			for (size_t j = 0; j < t->n; j++) {
				if (t->dt == ULP_DT_F32) {
					memcpy(p, &t->w[j], 4);
					p += 4;
				} else {
					uint16_t h = t->dt == ULP_DT_BF16 ? to_bf16(t->w[j]) : to_f16(t->w[j]);
					memcpy(p, &h, 2);
					p += 2;
				}
			}
		}
		const void *big = NULL;
		size_t nw = nt;
		if (big_bytes) { /* rows of D elements: the size rounds down to a row */
			snprintf(path, sizeof(path), "%s/.big-tensor.tmp", dir);
			if (big_tensor_file(path, big_shape[0] * d * 2, seed, s, &big) < 0) {
				status = cli_fail("%s: %s", path, strerror(errno));
				break;
			}
			wt[nw++] = (ulp_st_wtensor){"model.big_embed.weight", ULP_DT_BF16, 2, big_shape, big};
		}
		snprintf(path, sizeof(path), "%s/model.safetensors", dir);
		int rc = ulp_st_write(path, wt, nw, "{\"format\":\"pt\",\"generator\":\"ulpack synth\"}");
		if (big)
			munmap((void *)big, (size_t)(big_shape[0] * d * 2));
		if (rc < 0) {
			status = cli_fail("%s: %s", path, ulp_strerror(rc));
			break;
		}
	}
	free(conv);
	free(wt);
done:
	for (size_t i = 0; i < nt; i++) {
		free(ts[i].w);
		free(ts[i].m);
		free(ts[i].v);
	}
	return status;
}
