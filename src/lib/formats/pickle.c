/* SPDX-License-Identifier: MIT */
/*
 * pickle.c - the part of Python's pickle machine that torch.save's data.pkl
 * needs: it builds the object graph (nothing is executed: a global is a
 * name, a reduction a record of callable and arguments), collects the
 * storages named by persistent ids and names each after the first tensor
 * that uses it. The same machine reads DCP's .metadata (ulp_dcp_meta_parse,
 * dcp.h): the items of its storage_data, copied out of the arena.
 *
 * Memory bound: parsing a pickle of LEN bytes holds at most
 * PK_BYTES_PER_BYTE x LEN + PK_BYTES_FIXED bytes (24 x LEN + 1 MiB), the
 * result included; a pickle that needs more is refused (CORRUPT, "pickle too
 * complex": the file is stored opaque). torch.save-shaped pickles need 7 to
 * 12 bytes per byte beyond the fixed part (measured: a 16000-tensor
 * state_dict, AdamW's state of 20000 parameters with its params list, long
 * lists of ints, floats and strings). Everything but the result lives in an
 * arena of anonymous mappings unmapped before returning, so the memory goes
 * back to the system whatever the allocator keeps.
 *
 * Invariants:
 *  1. Every value and array is allocated in the parser's arena (pk_alloc)
 *     and freed with it, at once; values point at each other freely (memo
 *     sharing, cycles), never own each other. Strings point into the pickle.
 *  2. Stack and memo hold only values (marks are kept apart as stack
 *     heights), so an opcode never sees a mark as an operand; every pop
 *     checks the height against the innermost mark.
 *  3. The naming walk visits each value at most once (visited flag) and at
 *     most WALK_DEPTH deep, so cycles and shared subgraphs terminate.
 *  4. Storage keys are unique in the result, and so are names.
 *  5. The arena's mappings, plus the result, never exceed the memory bound
 *     (pk_alloc and the copy-out check it); the memo is never larger than
 *     the values made. Immutable values with nothing to name (None, booleans,
 *     floats, the empty tuple, integers 0..255) are one value each per parse.
 */
#include "torchzip.h"
#include "dcp.h"
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#ifdef ULP_SANITIZED
#include <sanitizer/asan_interface.h>
#define PK_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define PK_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#define PK_REDZONE 16
#else
#define PK_POISON(p, n) ((void)(p), (void)(n))
#define PK_UNPOISON(p, n) ((void)(p), (void)(n))
#define PK_REDZONE 0
#endif

#define WALK_DEPTH 128
#define MEMO_MAX   ((uint64_t)1 << 24)
#define PK_BYTES_PER_BYTE 24
#define PK_BYTES_FIXED    ((size_t)1 << 20)
#define PK_BLOCK_MIN      ((size_t)64 << 10)  /* arena mappings: 64 KiB, doubling to 4 MiB */
#define PK_BLOCK_MAX      ((size_t)4 << 20)

enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_TUPLE, V_LIST, V_DICT, V_GLOBAL, V_OBJ, V_PID };

/* Every value starts with a pv; its type says which of the records below it is. */
typedef struct pv {
	uint8_t type, visited;
	uint32_t n;                /* V_STR/V_BYTES/V_GLOBAL: bytes of s; V_TUPLE/V_LIST/V_DICT/V_OBJ: items */
} pv;
typedef struct { pv h; int64_t i; } pv_int;                          /* V_BOOL, V_INT; V_PID: storage index */
typedef struct { pv h; const uint8_t *s; } pv_str;                   /* V_STR, V_BYTES */
typedef struct { pv h; uint32_t n2; const uint8_t *s, *s2; } pv_glob; /* V_GLOBAL: module (n), name (n2) */
typedef struct { pv h; uint32_t cap; pv **it; } pv_seq;              /* tuple, list; dict: key, value pairs */
typedef struct { pv_seq kv; pv_seq *li; pv *args, *state; } pv_obj;  /* V_OBJ: set items, appended items */
#define INT(v)  ((pv_int *)(v))
#define STR(v)  ((pv_str *)(v))
#define GLOB(v) ((pv_glob *)(v))
#define SEQ(v)  ((pv_seq *)(v))
#define OBJ(v)  ((pv_obj *)(v))

struct ulp_pk {
	ulp_pk_storage *st;
	size_t n;
	char *strs;                /* keys and names */
};

typedef struct blk {
	struct blk *next;
	size_t size;
} blk;

typedef struct px {
	const uint8_t *p, *end;
	ulp_err *e;
	int fail;                  /* what pk_alloc's NULL means */
	size_t budget, used;       /* bytes mapped (and the result), at most budget */
	blk *blocks;
	uint8_t *cur;
	size_t left;
	unsigned nblk;
	uint64_t made;             /* values pushed by opcodes that make one */
	pv **stack;
	uint32_t nstack, cstack;
	uint32_t *marks;
	uint32_t nmarks, cmarks;
	pv **memo;
	uint32_t nmemo, cmemo;
	pv none, flt;              /* the shared immutable values (invariant 5) */
	pv_int bools[2];
	pv_seq empty_tuple;
	pv_int *small[256];
	ulp_pk_storage *st;        /* the storages, in the arena until the copy-out */
	uint32_t nst, cst;
	uint32_t *hash;            /* open addressing over st by key: index + 1, 0 empty */
	size_t hcap;
	size_t len;
} px;

/* ---- the arena (invariants 1 and 5) --------------------------------------- */

static int too_complex(px *x)
{
	return ULP_CORRUPT(x->e, "pickle too complex: more than %zu bytes of parser memory for %zu bytes",
	                   x->budget, x->len);
}

/* n bytes, zeroed, 8-aligned; NULL with x->fail set when the bound or the
 * system says no */
static void *pk_alloc(px *x, size_t n)
{
	n = (n + 7) & ~(size_t)7;
	if (n + PK_REDZONE > x->left) {
		size_t want = n + PK_REDZONE + sizeof(blk), bs = PK_BLOCK_MIN << ULP_MIN(x->nblk, 6u);
		if (want > bs)
			bs = (want + 4095) & ~(size_t)4095;
		if (bs > x->budget - x->used && want <= x->budget - x->used)
			bs = (x->budget - x->used) & ~(size_t)4095;
		if (want > bs || bs > x->budget - x->used) {
			x->fail = too_complex(x);
			return NULL;
		}
		void *m = mmap(NULL, bs, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED) {
			x->fail = -ULP_E_NOMEM;
			return NULL;
		}
		blk *b = m;
		b->next = x->blocks;
		b->size = bs;
		x->blocks = b;
		x->nblk++;
		x->used += bs;
		x->cur = (uint8_t *)m + sizeof(blk);
		x->left = bs - sizeof(blk);
		PK_POISON(x->cur, x->left);
	}
	void *p = x->cur;
	PK_UNPOISON(p, n);
	x->cur += n + PK_REDZONE;
	x->left -= n + PK_REDZONE;
	return p;
}

static void pk_unmap(px *x)
{
	while (x->blocks) {
		blk *b = x->blocks;
		x->blocks = b->next;
		size_t size = b->size;
		PK_UNPOISON(b, size); /* the addresses may be mapped again */
		munmap(b, size);
	}
}

/* Room in array *arr (*cap elements of size sz, n used) for one more: a
 * copy twice as large (the old one stays in the arena, unused). */
static int pk_grow(px *x, void *arr, uint32_t *cap, size_t n, size_t sz)
{
	void **a = arr;
	if (n < *cap)
		return 0;
	size_t nc = *cap ? (size_t)*cap * 2 : 4;
	if (nc > UINT32_MAX)
		return too_complex(x);
	void *p = pk_alloc(x, nc * sz);
	if (!p)
		return x->fail;
	if (n)
		memcpy(p, *a, n * sz);
	if (*a)
		PK_POISON(*a, (size_t)*cap * sz);
	*a = p;
	*cap = (uint32_t)nc;
	return 0;
}

static char *pk_strndup(px *x, const void *s, size_t n)
{
	char *d = pk_alloc(x, n + 1);
	if (d)
		memcpy(d, s, n); /* zeroed: terminated */
	return d;
}

static pv *newv(px *x, int type, size_t size)
{
	pv *v = pk_alloc(x, size);
	if (v)
		v->type = (uint8_t)type;
	return v;
}

static int add_item(px *x, pv_seq *q, pv *v)
{
	ULP_TRY(pk_grow(x, &q->it, &q->cap, q->h.n, sizeof(pv *)));
	q->it[q->h.n++] = v;
	return 0;
}

static size_t floor_mark(const px *x)
{
	return x->nmarks ? x->marks[x->nmarks - 1] : 0;
}

static int push(px *x, pv *v)
{
	if (!v)
		return x->fail;
	ULP_TRY(pk_grow(x, &x->stack, &x->cstack, x->nstack, sizeof(pv *)));
	x->stack[x->nstack++] = v;
	return 0;
}

/* pushes a value an opcode made (the memo may name it) */
static int made(px *x, pv *v)
{
	x->made++;
	return push(x, v);
}

/* invariant 2 */
static int pop(px *x, pv **v)
{
	if (x->nstack <= floor_mark(x))
		return ULP_CORRUPT(x->e, "pickle: stack underflow");
	*v = x->stack[--x->nstack];
	return 0;
}

static int top(px *x, pv **v)
{
	if (x->nstack <= floor_mark(x))
		return ULP_CORRUPT(x->e, "pickle: stack underflow");
	*v = x->stack[x->nstack - 1];
	return 0;
}

/* Pops the innermost mark: the values above it are stack[*from, nstack). */
static int pop_mark(px *x, size_t *from)
{
	if (!x->nmarks)
		return ULP_CORRUPT(x->e, "pickle: no mark");
	*from = x->marks[--x->nmarks];
	return 0;
}

static int need(px *x, size_t n)
{
	if ((size_t)(x->end - x->p) < n)
		return ULP_CORRUPT(x->e, "pickle: truncated");
	return 0;
}

static int memo_put(px *x, uint64_t idx)
{
	pv *v;
	ULP_TRY(top(x, &v));
	/* a pickler numbers its memo 0, 1, 2...: an index past the values made
	 * so far is a lie, and would size the memo (invariant 5) */
	if (idx >= MEMO_MAX || idx > x->made)
		return ULP_CORRUPT(x->e, "pickle: memo index %llu", (unsigned long long)idx);
	while (x->cmemo <= idx)
		ULP_TRY(pk_grow(x, &x->memo, &x->cmemo, x->cmemo, sizeof(pv *))); /* zeroed */
	x->memo[idx] = v;
	if (idx >= x->nmemo)
		x->nmemo = (uint32_t)idx + 1;
	return 0;
}

static int memo_get(px *x, uint64_t idx)
{
	if (idx >= x->nmemo || !x->memo[idx])
		return ULP_CORRUPT(x->e, "pickle: memo %llu not set", (unsigned long long)idx);
	return push(x, x->memo[idx]);
}

static int is_str(const pv *v, const char *s)
{
	return v->type == V_STR && v->n == strlen(s) && memcmp(STR(v)->s, s, v->n) == 0;
}

static ulp_dtype storage_dtype(const pv_glob *g)
{
	static const struct { const char *name; ulp_dtype dt; } map[] = {
		{"DoubleStorage", ULP_DT_F64}, {"FloatStorage", ULP_DT_F32},
		{"HalfStorage", ULP_DT_F16},   {"BFloat16Storage", ULP_DT_BF16},
		{"LongStorage", ULP_DT_I64},   {"IntStorage", ULP_DT_I32},
		{"ShortStorage", ULP_DT_I16},  {"CharStorage", ULP_DT_I8},
		{"ByteStorage", ULP_DT_U8},    {"BoolStorage", ULP_DT_BOOL},
		{"UntypedStorage", ULP_DT_U8},
	};
	/* torch 2.x names torch.storage.UntypedStorage by its module */
	if (g->h.n == 13 && memcmp(g->s, "torch.storage", 13) == 0 && g->n2 == 14 &&
	    memcmp(g->s2, "UntypedStorage", 14) == 0)
		return ULP_DT_U8;
	if (g->h.n != 5 || memcmp(g->s, "torch", 5) != 0)
		return ULP_DT_UNKNOWN;
	for (size_t i = 0; i < ULP_ARRAY_LEN(map); i++)
		if (g->n2 == strlen(map[i].name) && memcmp(g->s2, map[i].name, g->n2) == 0)
			return map[i].dt;
	return ULP_DT_UNKNOWN;
}

/* A torch.<dtype> global (the last argument of _rebuild_tensor_v3), or
 * ULP_DT_UNKNOWN. */
static ulp_dtype global_dtype(const pv *v)
{
	static const struct { const char *name; ulp_dtype dt; } map[] = {
		{"float8_e4m3fn", ULP_DT_F8_E4M3}, {"float8_e5m2", ULP_DT_F8_E5M2},
		{"bfloat16", ULP_DT_BF16}, {"float16", ULP_DT_F16}, {"half", ULP_DT_F16},
		{"float32", ULP_DT_F32}, {"float", ULP_DT_F32}, {"float64", ULP_DT_F64},
		{"double", ULP_DT_F64}, {"uint16", ULP_DT_U16}, {"uint32", ULP_DT_U32},
		{"uint64", ULP_DT_U64}, {"int64", ULP_DT_I64}, {"long", ULP_DT_I64},
		{"int32", ULP_DT_I32}, {"int", ULP_DT_I32}, {"int16", ULP_DT_I16},
		{"short", ULP_DT_I16}, {"int8", ULP_DT_I8}, {"uint8", ULP_DT_U8},
		{"bool", ULP_DT_BOOL},
	};
	const pv_glob *g = GLOB(v);
	if (v->type != V_GLOBAL || g->h.n != 5 || memcmp(g->s, "torch", 5) != 0)
		return ULP_DT_UNKNOWN;
	for (size_t i = 0; i < ULP_ARRAY_LEN(map); i++)
		if (g->n2 == strlen(map[i].name) && memcmp(g->s2, map[i].name, g->n2) == 0)
			return map[i].dt;
	return ULP_DT_UNKNOWN;
}

static int is_global(const pv *v, const char *module, const char *name)
{
	const pv_glob *g = GLOB(v);
	return v->type == V_GLOBAL && g->h.n == strlen(module) && memcmp(g->s, module, g->h.n) == 0 &&
	       g->n2 == strlen(name) && memcmp(g->s2, name, g->n2) == 0;
}

/* REDUCE of torch._utils._rebuild_tensor_v3(storage, offset, size, stride,
 * requires_grad, hooks, dtype): an UntypedStorage gets the tensor's dtype
 * (torch 2.x writes float8_* and uint16/32/64 tensors so). Its bytes must
 * be whole elements; a storage two v3 tensors give two dtypes is refused
 * (torch refuses to save one). Any other reduction names no dtype. */
static int rebuild_v3(px *x, const pv *fn, const pv *args)
{
	if (!is_global(fn, "torch._utils", "_rebuild_tensor_v3") || args->n < 2)
		return 0;
	const pv *pid = SEQ(args)->it[0];
	ulp_dtype dt = global_dtype(SEQ(args)->it[args->n - 1]);
	if (pid->type != V_PID || dt == ULP_DT_UNKNOWN)
		return 0;
	ulp_pk_storage *s = &x->st[INT(pid)->i];
	if (s->pid_dtype != ULP_DT_U8 || !s->key || s->pid_numel % ulp_dtype_size(dt) != 0)
		return 0;
	if (s->retyped && s->dtype != dt)
		return ULP_CORRUPT(x->e, "pickle: storage '%s' used with two dtypes", s->key);
	s->dtype = dt;
	s->numel = s->pid_numel / ulp_dtype_size(dt);
	s->retyped = 1;
	return 0;
}

static uint64_t hash_bytes(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ull;
	return h;
}

/* Index of the storage with key (len bytes), or -1; *slot: where to insert. */
static long find_key(const px *x, const uint8_t *key, size_t len, size_t *slot)
{
	size_t m = x->hcap - 1, i = (size_t)hash_bytes(key, len) & m;
	for (;; i = (i + 1) & m) {
		size_t h = x->hash[i];
		if (!h) {
			*slot = i;
			return -1;
		}
		const char *s = x->st[h - 1].key;
		if (strlen(s) == len && memcmp(s, key, len) == 0)
			return (long)(h - 1);
	}
}

static int rehash(px *x)
{
	size_t ncap = x->hcap ? x->hcap * 2 : 64;
	uint32_t *nh = pk_alloc(x, ncap * sizeof(uint32_t));
	if (!nh)
		return x->fail;
	x->hash = nh;
	x->hcap = ncap;
	for (size_t j = 0; j < x->nst; j++) {
		size_t slot;
		find_key(x, (const uint8_t *)x->st[j].key, strlen(x->st[j].key), &slot);
		x->hash[slot] = (uint32_t)j + 1;
	}
	return 0;
}

/* BINPERSID: ('storage', torch.<T>Storage, key, location, numel). */
static int persid(px *x)
{
	pv *t;
	ULP_TRY(pop(x, &t));
	pv **it = t->type == V_TUPLE && t->n == 5 ? SEQ(t)->it : NULL;
	if (!it || !is_str(it[0], "storage") || it[1]->type != V_GLOBAL || it[2]->type != V_STR ||
	    it[3]->type != V_STR || it[4]->type != V_INT || INT(it[4])->i < 0)
		return ULP_CORRUPT(x->e, "pickle: persistent id is not a storage");
	const pv_str *key = STR(it[2]);
	if (key->h.n == 0 || key->h.n > 256 || memchr(key->s, 0, key->h.n) || memchr(key->s, '/', key->h.n))
		return ULP_CORRUPT(x->e, "pickle: bad storage key");
	ulp_dtype dt = storage_dtype(GLOB(it[1]));
	uint64_t numel = (uint64_t)INT(it[4])->i;
	if (x->nst * 2 >= x->hcap)
		ULP_TRY(rehash(x));
	size_t slot;
	long idx = find_key(x, key->s, key->h.n, &slot);
	if (idx >= 0) {
		if (x->st[idx].pid_dtype != dt || x->st[idx].pid_numel != numel)
			return ULP_CORRUPT(x->e, "pickle: storage '%.*s' used with two types or sizes",
			                   (int)key->h.n, key->s);
	} else {
		ULP_TRY(pk_grow(x, &x->st, &x->cst, x->nst, sizeof(*x->st)));
		ulp_pk_storage *s = &x->st[x->nst];
		if (!(s->key = pk_strndup(x, key->s, key->h.n)))
			return x->fail;
		s->dtype = s->pid_dtype = dt;
		s->numel = s->pid_numel = numel;
		s->retyped = 0;
		s->name = NULL;
		idx = (long)x->nst++;
		x->hash[slot] = x->nst;
	}
	pv_int *v = (pv_int *)newv(x, V_PID, sizeof(pv_int));
	if (!v)
		return x->fail;
	v->i = idx;
	return made(x, &v->h);
}

static int str_op(px *x, int type, uint64_t n)
{
	if ((uint64_t)(x->end - x->p) < n)
		return ULP_CORRUPT(x->e, "pickle: string past the end");
	pv_str *v = (pv_str *)newv(x, type, sizeof(pv_str));
	if (!v)
		return x->fail;
	v->s = x->p;
	v->h.n = (uint32_t)n; /* < len <= UINT32_MAX */
	x->p += n;
	return made(x, &v->h);
}

static int int_op(px *x, int64_t i)
{
	if (i >= 0 && i < 256) { /* one value each (invariant 5) */
		if (!x->small[i]) {
			if (!(x->small[i] = (pv_int *)newv(x, V_INT, sizeof(pv_int))))
				return x->fail;
			x->small[i]->i = i;
		}
		return made(x, &x->small[i]->h);
	}
	pv_int *v = (pv_int *)newv(x, V_INT, sizeof(pv_int));
	if (!v)
		return x->fail;
	v->i = i;
	return made(x, &v->h);
}

/* A collection made of stack[from, nstack). */
static int collect(px *x, int type, size_t from)
{
	if (type == V_DICT && (x->nstack - from) % 2)
		return ULP_CORRUPT(x->e, "pickle: odd number of dict items");
	if (type == V_TUPLE && from == x->nstack)
		return made(x, &x->empty_tuple.h);
	pv_seq *v = (pv_seq *)newv(x, type, sizeof(pv_seq));
	if (!v)
		return x->fail;
	size_t n = x->nstack - from;
	if (n && !(v->it = pk_alloc(x, n * sizeof(pv *))))
		return x->fail;
	if (n) /* (an empty list or dict has no items array) */
		memcpy(v->it, x->stack + from, n * sizeof(pv *));
	v->h.n = v->cap = (uint32_t)n;
	x->nstack = (uint32_t)from;
	return made(x, &v->h);
}

static int tuple_n(px *x, size_t n)
{
	if (x->nstack - floor_mark(x) < n)
		return ULP_CORRUPT(x->e, "pickle: stack underflow");
	return collect(x, V_TUPLE, x->nstack - n);
}

/* SETITEM(S) into a dict or an object (OrderedDict's reduction). */
static int set_items(px *x, pv *d, size_t from)
{
	if (d->type != V_DICT && d->type != V_OBJ)
		return ULP_CORRUPT(x->e, "pickle: setitems on a non-dict");
	if ((x->nstack - from) % 2)
		return ULP_CORRUPT(x->e, "pickle: odd number of dict items");
	for (size_t i = from; i < x->nstack; i++)
		ULP_TRY(add_item(x, SEQ(d), x->stack[i]));
	x->nstack = (uint32_t)from;
	return 0;
}

static int append_items(px *x, pv *l, size_t from)
{
	if (l->type != V_LIST && l->type != V_OBJ)
		return ULP_CORRUPT(x->e, "pickle: append to a non-list");
	pv_seq *q = SEQ(l);
	if (l->type == V_OBJ) {
		if (!OBJ(l)->li && !(OBJ(l)->li = (pv_seq *)newv(x, V_LIST, sizeof(pv_seq))))
			return x->fail;
		q = OBJ(l)->li;
	}
	for (size_t i = from; i < x->nstack; i++)
		ULP_TRY(add_item(x, q, x->stack[i]));
	x->nstack = (uint32_t)from;
	return 0;
}

/* GLOBAL: "module\nname\n". */
static int global_op(px *x)
{
	const uint8_t *a = x->p, *nl1 = memchr(a, '\n', (size_t)(x->end - a));
	if (!nl1)
		return ULP_CORRUPT(x->e, "pickle: unterminated global");
	const uint8_t *b = nl1 + 1, *nl2 = memchr(b, '\n', (size_t)(x->end - b));
	if (!nl2)
		return ULP_CORRUPT(x->e, "pickle: unterminated global");
	pv_glob *v = (pv_glob *)newv(x, V_GLOBAL, sizeof(pv_glob));
	if (!v)
		return x->fail;
	v->s = a;
	v->h.n = (uint32_t)(nl1 - a);
	v->s2 = b;
	v->n2 = (uint32_t)(nl2 - b);
	x->p = nl2 + 1;
	return made(x, &v->h);
}

static int run(px *x, pv **result)
{
	size_t from = 0;
	pv *a, *b;
	while (x->p < x->end) {
		uint8_t op = *x->p++;
		switch (op) {
		case 0x80: /* PROTO */
			ULP_TRY(need(x, 1));
			if (*x->p++ > 5)
				return ULP_CORRUPT(x->e, "pickle: protocol %u", x->p[-1]);
			break;
		case 0x95: /* FRAME */
			ULP_TRY(need(x, 8));
			x->p += 8;
			break;
		case '.': /* STOP */
			if (x->p != x->end || x->nmarks || x->nstack != 1)
				return ULP_CORRUPT(x->e, "pickle: STOP with %zu values, %zu marks, %zu bytes after",
				                   (size_t)x->nstack, (size_t)x->nmarks, (size_t)(x->end - x->p));
			*result = x->stack[0];
			return 0;
		case '(': /* MARK */
			ULP_TRY(pk_grow(x, &x->marks, &x->cmarks, x->nmarks, sizeof(uint32_t)));
			x->marks[x->nmarks++] = x->nstack;
			break;
		case '0': /* POP */
			ULP_TRY(pop(x, &a));
			break;
		case '1': /* POP_MARK */
			ULP_TRY(pop_mark(x, &from));
			x->nstack = (uint32_t)from;
			break;
		case '2': /* DUP */
			ULP_TRY(top(x, &a));
			ULP_TRY(push(x, a));
			break;
		case 'N':
			ULP_TRY(made(x, &x->none));
			break;
		case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
			ULP_TRY(made(x, &x->bools[op == 0x88].h));
			break;
		case 'J': /* BININT */
			ULP_TRY(need(x, 4));
			ULP_TRY(int_op(x, (int32_t)ulp_ld32(x->p)));
			x->p += 4;
			break;
		case 'K': /* BININT1 */
			ULP_TRY(need(x, 1));
			ULP_TRY(int_op(x, *x->p++));
			break;
		case 'M': /* BININT2 */
			ULP_TRY(need(x, 2));
			ULP_TRY(int_op(x, ulp_ld16(x->p)));
			x->p += 2;
			break;
		case 0x8a: { /* LONG1: n bytes, little-endian two's complement */
			ULP_TRY(need(x, 1));
			size_t n = *x->p++;
			ULP_TRY(need(x, n));
			if (n > 8)
				return ULP_CORRUPT(x->e, "pickle: integer of %zu bytes", n);
			uint64_t u = 0;
			for (size_t i = 0; i < n; i++)
				u |= (uint64_t)x->p[i] << (8 * i);
			if (n && n < 8 && (x->p[n - 1] & 0x80))
				u |= ~(uint64_t)0 << (8 * n);
			x->p += n;
			ULP_TRY(int_op(x, (int64_t)u));
			break;
		}
		case 'G': /* BINFLOAT */
			ULP_TRY(need(x, 8));
			x->p += 8;
			ULP_TRY(made(x, &x->flt));
			break;
		case 'X': case 'T': case 'B': /* BINUNICODE, BINSTRING, BINBYTES */
			ULP_TRY(need(x, 4));
			x->p += 4;
			ULP_TRY(str_op(x, op == 'B' ? V_BYTES : V_STR, ulp_ld32(x->p - 4)));
			break;
		case 0x8c: case 'U': case 'C': /* SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES */
			ULP_TRY(need(x, 1));
			x->p += 1;
			ULP_TRY(str_op(x, op == 'C' ? V_BYTES : V_STR, x->p[-1]));
			break;
		case 0x8d: case 0x8e: /* BINUNICODE8, BINBYTES8 */
			ULP_TRY(need(x, 8));
			x->p += 8;
			ULP_TRY(str_op(x, op == 0x8e ? V_BYTES : V_STR, ulp_ld64(x->p - 8)));
			break;
		case ')': /* EMPTY_TUPLE */
			ULP_TRY(made(x, &x->empty_tuple.h));
			break;
		case '}': case ']': case 0x8f: /* EMPTY_DICT, _LIST, _SET */
			ULP_TRY(made(x, newv(x, op == '}' ? V_DICT : V_LIST, sizeof(pv_seq))));
			break;
		case 't': case 'l': case 'd': case 0x91: /* TUPLE, LIST, DICT, FROZENSET */
			ULP_TRY(pop_mark(x, &from));
			ULP_TRY(collect(x, op == 'd' ? V_DICT : op == 't' ? V_TUPLE : V_LIST, from));
			break;
		case 0x85: case 0x86: case 0x87: /* TUPLE1..3 */
			ULP_TRY(tuple_n(x, (size_t)(op - 0x84)));
			break;
		case 'a': /* APPEND */
			ULP_TRY(pop(x, &a));
			ULP_TRY(top(x, &b));
			ULP_TRY(push(x, a));
			ULP_TRY(append_items(x, b, x->nstack - 1));
			break;
		case 'e': case 0x90: /* APPENDS, ADDITEMS */
			ULP_TRY(pop_mark(x, &from));
			if (from == 0 || from <= floor_mark(x))
				return ULP_CORRUPT(x->e, "pickle: appends without a list");
			ULP_TRY(append_items(x, x->stack[from - 1], from));
			break;
		case 's': /* SETITEM */
			if (x->nstack < floor_mark(x) + 3)
				return ULP_CORRUPT(x->e, "pickle: stack underflow");
			ULP_TRY(set_items(x, x->stack[x->nstack - 3], x->nstack - 2));
			break;
		case 'u': /* SETITEMS */
			ULP_TRY(pop_mark(x, &from));
			if (from == 0 || from <= floor_mark(x))
				return ULP_CORRUPT(x->e, "pickle: setitems without a dict");
			ULP_TRY(set_items(x, x->stack[from - 1], from));
			break;
		case 'c': /* GLOBAL */
			ULP_TRY(global_op(x));
			break;
		case 0x93: { /* STACK_GLOBAL */
			ULP_TRY(pop(x, &b));
			ULP_TRY(pop(x, &a));
			if (a->type != V_STR || b->type != V_STR)
				return ULP_CORRUPT(x->e, "pickle: stack_global of non-strings");
			pv_glob *g = (pv_glob *)newv(x, V_GLOBAL, sizeof(pv_glob));
			if (!g)
				return x->fail;
			ULP_TRY(made(x, &g->h));
			g->s = STR(a)->s, g->h.n = a->n, g->s2 = STR(b)->s, g->n2 = b->n;
			break;
		}
		case 'R': case 0x81: { /* REDUCE, NEWOBJ: callable (or class), args */
			ULP_TRY(pop(x, &b));
			ULP_TRY(pop(x, &a));
			if (b->type != V_TUPLE)
				return ULP_CORRUPT(x->e, "pickle: reduce without an argument tuple");
			pv_obj *o = (pv_obj *)newv(x, V_OBJ, sizeof(pv_obj));
			if (!o)
				return x->fail;
			ULP_TRY(made(x, &o->kv.h));
			o->args = b;
			ULP_TRY(rebuild_v3(x, a, b)); /* else what is called does not matter */
			break;
		}
		case 'b': /* BUILD: only an object's state names anything */
			ULP_TRY(pop(x, &b));
			ULP_TRY(top(x, &a));
			if (a->type == V_OBJ && !OBJ(a)->state)
				OBJ(a)->state = b;
			break;
		case 'Q': /* BINPERSID */
			ULP_TRY(persid(x));
			break;
		case 'q': /* BINPUT */
			ULP_TRY(need(x, 1));
			ULP_TRY(memo_put(x, *x->p++));
			break;
		case 'r': /* LONG_BINPUT */
			ULP_TRY(need(x, 4));
			x->p += 4;
			ULP_TRY(memo_put(x, ulp_ld32(x->p - 4)));
			break;
		case 0x94: /* MEMOIZE */
			ULP_TRY(memo_put(x, x->nmemo));
			break;
		case 'h': /* BINGET */
			ULP_TRY(need(x, 1));
			ULP_TRY(memo_get(x, *x->p++));
			break;
		case 'j': /* LONG_BINGET */
			ULP_TRY(need(x, 4));
			x->p += 4;
			ULP_TRY(memo_get(x, ulp_ld32(x->p - 4)));
			break;
		default:
			return ULP_CORRUPT(x->e, "pickle: opcode 0x%02x not read", op);
		}
	}
	return ULP_CORRUPT(x->e, "pickle: no STOP");
}

/* ---- naming --------------------------------------------------------------- */

/* Appends component c (n bytes) to path (length *pl): printable ASCII kept,
 * anything else '_'; the whole name is cut at ULP_TZ_NAME_MAX bytes. */
static void path_add(char *path, size_t *pl, const void *c, size_t n)
{
	const uint8_t *b = c;
	if (*pl && *pl < ULP_TZ_NAME_MAX)
		path[(*pl)++] = '.';
	for (size_t i = 0; i < n && *pl < ULP_TZ_NAME_MAX; i++)
		path[(*pl)++] = b[i] > 0x20 && b[i] < 0x7f ? (char)b[i] : '_';
	path[*pl] = 0;
}

static void key_add(char *path, size_t *pl, const pv *k)
{
	char num[32];
	if (k->type == V_STR || k->type == V_BYTES) {
		path_add(path, pl, STR(k)->s, k->n);
	} else if (k->type == V_INT || k->type == V_BOOL) {
		int n = snprintf(num, sizeof(num), "%lld", (long long)INT(k)->i);
		path_add(path, pl, num, (size_t)n);
	} else {
		path_add(path, pl, "?", 1);
	}
}

static int walk_items(px *x, const pv_seq *q, char *path, size_t pl, unsigned depth);

static int walk(px *x, pv *v, char *path, size_t pl, unsigned depth)
{
	if (!v || v->visited || depth > WALK_DEPTH)
		return 0;
	v->visited = 1;
	size_t l;
	switch (v->type) {
	case V_PID: {
		ulp_pk_storage *s = &x->st[INT(v)->i];
		if (!s->name && pl && !(s->name = pk_strndup(x, path, pl)))
			return x->fail;
		return 0;
	}
	case V_TUPLE: case V_LIST:
		return walk_items(x, SEQ(v), path, pl, depth);
	case V_DICT: case V_OBJ: {
		/* an object's arguments (a tensor's storage, a Parameter's
		 * tensor) carry the object's own path */
		pv *args = v->type == V_OBJ ? OBJ(v)->args : NULL;
		if (args && !args->visited) {
			args->visited = 1;
			for (size_t i = 0; i < args->n; i++)
				ULP_TRY(walk(x, SEQ(args)->it[i], path, pl, depth + 1));
		}
		const pv_seq *q = SEQ(v);
		for (size_t i = 0; i + 1 < q->h.n; i += 2) {
			l = pl;
			key_add(path, &l, q->it[i]);
			ULP_TRY(walk(x, q->it[i + 1], path, l, depth + 1));
			path[pl] = 0;
		}
		if (v->type == V_OBJ && OBJ(v)->li)
			ULP_TRY(walk_items(x, OBJ(v)->li, path, pl, depth));
		if (v->type == V_OBJ && OBJ(v)->state)
			ULP_TRY(walk(x, OBJ(v)->state, path, pl, depth + 1));
		return 0;
	}
	default:
		return 0;
	}
}

/* items i of a tuple, a list or an object's appends, at PATH.i */
static int walk_items(px *x, const pv_seq *q, char *path, size_t pl, unsigned depth)
{
	char num[32];
	for (size_t i = 0; i < q->h.n; i++) {
		size_t l = pl;
		int n = snprintf(num, sizeof(num), "%zu", i);
		path_add(path, &l, num, (size_t)n);
		ULP_TRY(walk(x, q->it[i], path, l, depth + 1));
		path[pl] = 0;
	}
	return 0;
}

/* Names must be unique (invariant 4): a storage no tensor names is
 * "storage:KEY"; a name already taken becomes "NAME#KEY", then
 * "storage:KEY#INDEX"; past that the pickle is refused. */
static int unique_names(px *x)
{
	size_t hcap = 64;
	while (hcap < (size_t)x->nst * 2 + 2)
		hcap *= 2;
	uint32_t *h = pk_alloc(x, hcap * sizeof(uint32_t));
	if (!h)
		return x->fail;
	for (size_t i = 0; i < x->nst; i++) {
		ulp_pk_storage *s = &x->st[i];
		int named = s->name != NULL;
		for (int attempt = named ? 0 : 1;; attempt++) {
			char buf[ULP_TZ_NAME_MAX + 300];
			int bl = 0;
			if (attempt > 2)
				return ULP_CORRUPT(x->e, "pickle: storage names collide");
			if (attempt == 1 && named)
				bl = snprintf(buf, sizeof(buf), "%s#%s", s->name, s->key);
			else if (attempt == 1)
				bl = snprintf(buf, sizeof(buf), "storage:%s", s->key);
			else if (attempt == 2)
				bl = snprintf(buf, sizeof(buf), "storage:%s#%zu", s->key, i);
			if (attempt > 0 && !(s->name = pk_strndup(x, buf, (size_t)bl)))
				return x->fail;
			size_t m = hcap - 1, j = (size_t)hash_bytes(s->name, strlen(s->name)) & m;
			int taken = 0;
			for (; h[j]; j = (j + 1) & m)
				if (strcmp(x->st[h[j] - 1].name, s->name) == 0) {
					taken = 1;
					break;
				}
			if (!taken) {
				h[j] = (uint32_t)i + 1;
				break;
			}
		}
	}
	return 0;
}

/* The result, out of the arena: the storages and one block of strings. */
static int copy_out(px *x, ulp_pk **out)
{
	size_t sl = 0;
	for (size_t i = 0; i < x->nst; i++)
		sl += strlen(x->st[i].key) + strlen(x->st[i].name) + 2;
	size_t total = sizeof(ulp_pk) + x->nst * sizeof(ulp_pk_storage) + sl;
	if (total > x->budget - x->used)
		return too_complex(x);
	x->used += total;
	ulp_pk *k = calloc(1, sizeof(*k));
	if (k) {
		k->st = malloc(x->nst ? x->nst * sizeof(ulp_pk_storage) : 1);
		k->strs = malloc(sl ? sl : 1);
	}
	if (!k || !k->st || !k->strs) {
		ulp_pk_free(k);
		return -ULP_E_NOMEM;
	}
	char *p = k->strs;
	for (size_t i = 0; i < x->nst; i++) {
		ulp_pk_storage *s = &k->st[k->n++];
		*s = x->st[i];
		size_t kl = strlen(s->key) + 1, nl = strlen(s->name) + 1;
		s->key = memcpy(p, s->key, kl);
		s->name = memcpy(p + kl, s->name, nl);
		p += kl + nl;
	}
	*out = k;
	return 0;
}

int ulp_pk_parse_peak(const uint8_t *p, size_t len, ulp_pk **out, size_t *peak, char *why, size_t cap)
{
	ulp_err e = {why, cap};
	*out = NULL;
	if (peak)
		*peak = 0;
	if (len >= UINT32_MAX)
		return ULP_CORRUPT(&e, "pickle: %zu bytes", len);
	px *x = calloc(1, sizeof(*x));
	if (!x)
		return -ULP_E_NOMEM;
	*x = (px){.p = p, .end = p + len, .e = &e, .len = len};
	x->budget = PK_BYTES_PER_BYTE * len + PK_BYTES_FIXED;
	x->used = sizeof(*x);
	x->none.type = V_NONE;
	x->flt.type = V_FLOAT;
	x->bools[0] = (pv_int){{V_BOOL, 0, 0}, 0};
	x->bools[1] = (pv_int){{V_BOOL, 0, 0}, 1};
	x->empty_tuple.h.type = V_TUPLE;
	pv *root = NULL;
	int rc = run(x, &root);
	if (rc == 0) {
		char path[ULP_TZ_NAME_MAX + 1] = "";
		rc = walk(x, root, path, 0, 0);
	}
	if (rc == 0)
		rc = unique_names(x);
	if (rc == 0)
		rc = copy_out(x, out);
	if (peak)
		*peak = x->used;
	pk_unmap(x);
	free(x);
	return rc;
}

int ulp_pk_parse(const uint8_t *p, size_t len, ulp_pk **out, char *why, size_t cap)
{
	return ulp_pk_parse_peak(p, len, out, NULL, why, cap);
}

size_t ulp_pk_count(const ulp_pk *k)
{
	return k->n;
}

const ulp_pk_storage *ulp_pk_at(const ulp_pk *k, size_t i)
{
	return i < k->n ? &k->st[i] : NULL;
}

void ulp_pk_free(ulp_pk *k)
{
	if (!k)
		return;
	free(k->st);
	free(k->strs);
	free(k);
}

/* ---- DCP .metadata (dcp.h) ------------------------------------------------ */

struct ulp_dcp_meta {
	ulp_dcp_item *it;
	size_t n;
	char *strs;     /* names and paths, NUL-terminated */
	int64_t *dims;  /* chunk offsets */
};

/* The value of key in dict d (a V_DICT, or an object's state dict), or NULL. */
static pv *dict_get(const pv *d, const char *key)
{
	if (!d || d->type != V_DICT)
		return NULL;
	const pv_seq *q = SEQ(d);
	for (size_t i = 0; i + 1 < q->h.n; i += 2)
		if (is_str(q->it[i], key))
			return q->it[i + 1];
	return NULL;
}

static pv *state_of(const pv *o)
{
	return o && o->type == V_OBJ ? OBJ(o)->state : NULL;
}

/* torch.Size((d0, d1, ...)): an object whose single argument is a tuple of
 * ints (an empty tuple for a 0-dim tensor) */
static const pv_seq *size_dims(const pv *v)
{
	if (!v || v->type != V_OBJ || !OBJ(v)->args || OBJ(v)->args->n != 1)
		return NULL;
	const pv *t = SEQ(OBJ(v)->args)->it[0];
	if (t->type != V_TUPLE)
		return NULL;
	for (size_t i = 0; i < t->n; i++)
		if (SEQ(t)->it[i]->type != V_INT)
			return NULL;
	return SEQ(t);
}

void ulp_dcp_meta_free(ulp_dcp_meta *m)
{
	if (!m)
		return;
	free(m->it);
	free(m->strs);
	free(m->dims);
	free(m);
}

size_t ulp_dcp_meta_count(const ulp_dcp_meta *m)
{
	return m->n;
}

const ulp_dcp_item *ulp_dcp_meta_at(const ulp_dcp_meta *m, size_t i)
{
	return i < m->n ? &m->it[i] : NULL;
}

/* Checks the shape of the items and sizes what the result needs. */
static int meta_items(px *x, const pv *sd, size_t *strs, size_t *dims)
{
	const pv_seq *q = SEQ(sd);
	*strs = *dims = 0;
	for (size_t i = 0; i + 1 < q->h.n; i += 2) {
		pv *ks = state_of(q->it[i]), *vs = state_of(q->it[i + 1]);
		pv *fqn = dict_get(ks, "fqn"), *idx = dict_get(ks, "index"), *file = dict_get(vs, "relative_path"),
		   *off = dict_get(vs, "offset"), *len = dict_get(vs, "length");
		/* offset and index are left out (or None) for a BYTE_IO item */
		pv *ko = dict_get(ks, "offset");
		const pv_seq *d = size_dims(ko);
		if (!fqn || fqn->type != V_STR || !file || file->type != V_STR || (ko && ko->type != V_NONE && !d) ||
		    !off || off->type != V_INT || !len || len->type != V_INT ||
		    (idx && idx->type != V_INT && idx->type != V_NONE))
			return ULP_CORRUPT(x->e, "dcp metadata: storage_data item %zu is not MetadataIndex -> _StorageInfo",
			                   i / 2);
		if (INT(off)->i < 0 || INT(len)->i < 0 || INT(len)->i > INT64_MAX - INT(off)->i)
			return ULP_CORRUPT(x->e, "dcp metadata: item %zu: offset %lld, length %lld", i / 2,
			                   (long long)INT(off)->i, (long long)INT(len)->i);
		*strs += (size_t)fqn->n + 1 + (size_t)file->n + 1;
		*dims += d ? d->h.n : 0;
	}
	return 0;
}

static int meta_copy(px *x, const pv *sd, ulp_dcp_meta *m, size_t strs, size_t dims)
{
	const pv_seq *q = SEQ(sd);
	size_t n = q->h.n / 2, s = 0, k = 0;
	if (!(m->it = calloc(n ? n : 1, sizeof(*m->it))) || !(m->strs = malloc(strs ? strs : 1)) ||
	    !(m->dims = malloc((dims ? dims : 1) * sizeof(int64_t))))
		return -ULP_E_NOMEM;
	(void)x;
	for (size_t i = 0; i + 1 < q->h.n; i += 2) {
		pv *ks = state_of(q->it[i]), *vs = state_of(q->it[i + 1]);
		pv *fqn = dict_get(ks, "fqn"), *idx = dict_get(ks, "index"), *file = dict_get(vs, "relative_path");
		const pv_seq *d = size_dims(dict_get(ks, "offset"));
		ulp_dcp_item *it = &m->it[m->n++];
		it->fqn = m->strs + s;
		memcpy(m->strs + s, STR(fqn)->s, fqn->n);
		s += fqn->n;
		m->strs[s++] = 0;
		it->file = m->strs + s;
		memcpy(m->strs + s, STR(file)->s, file->n);
		s += file->n;
		m->strs[s++] = 0;
		it->offset = (uint64_t)INT(dict_get(vs, "offset"))->i;
		it->length = (uint64_t)INT(dict_get(vs, "length"))->i;
		it->index = idx && idx->type == V_INT ? INT(idx)->i : -1;
		it->ndim = d ? d->h.n : 0;
		it->chunk = m->dims + k;
		for (size_t j = 0; j < it->ndim; j++)
			m->dims[k++] = INT(d->it[j])->i;
	}
	return 0;
}

int ulp_dcp_meta_parse(const uint8_t *p, size_t len, ulp_dcp_meta **out, char *why, size_t cap)
{
	ulp_err e = {why, cap};
	*out = NULL;
	if (len >= UINT32_MAX)
		return ULP_CORRUPT(&e, "pickle: %zu bytes", len);
	px *x = calloc(1, sizeof(*x));
	ulp_dcp_meta *m = calloc(1, sizeof(*m));
	if (!x || !m) {
		free(x);
		free(m);
		return -ULP_E_NOMEM;
	}
	*x = (px){.p = p, .end = p + len, .e = &e, .len = len};
	x->budget = PK_BYTES_PER_BYTE * len + PK_BYTES_FIXED;
	x->used = sizeof(*x);
	x->none.type = V_NONE;
	x->flt.type = V_FLOAT;
	x->bools[0] = (pv_int){{V_BOOL, 0, 0}, 0};
	x->bools[1] = (pv_int){{V_BOOL, 0, 0}, 1};
	x->empty_tuple.h.type = V_TUPLE;
	pv *root = NULL;
	size_t strs = 0, dims = 0;
	int rc = run(x, &root);
	pv *sd = rc == 0 ? dict_get(state_of(root), "storage_data") : NULL;
	if (rc == 0 && !sd)
		rc = ULP_CORRUPT(&e, "dcp metadata: no Metadata object with a storage_data dict");
	if (rc == 0)
		rc = meta_items(x, sd, &strs, &dims);
	if (rc == 0 && strs + dims * sizeof(int64_t) + (sd->n / 2) * sizeof(ulp_dcp_item) > x->budget)
		rc = too_complex(x);
	if (rc == 0)
		rc = meta_copy(x, sd, m, strs, dims);
	pk_unmap(x);
	free(x);
	if (rc < 0) {
		ulp_dcp_meta_free(m);
		return rc;
	}
	*out = m;
	return 0;
}
