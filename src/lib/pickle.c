/* SPDX-License-Identifier: MIT */
/*
 * pickle.c - the part of Python's pickle machine that torch.save's data.pkl
 * needs: it builds the object graph (nothing is executed: a global is a
 * name, a reduction a record of callable and arguments), collects the
 * storages named by persistent ids and names each after the first tensor
 * that uses it.
 *
 * Invariants:
 *  1. Every value is allocated by newv() and owned by the parser's `all`
 *     list (freed there, once); values point at each other freely (memo
 *     sharing, cycles), never own each other. Strings point into the pickle.
 *  2. Stack and memo hold only values (marks are kept apart as stack
 *     heights), so an opcode never sees a mark as an operand; every pop
 *     checks the height against the innermost mark.
 *  3. The naming walk visits each value at most once (visited flag) and at
 *     most WALK_DEPTH deep, so cycles and shared subgraphs terminate.
 *  4. Storage keys are unique in the result, and so are names.
 *  5. Memory is bounded by the pickle's length: each opcode makes at most
 *     one value, and the memo is never larger than the values made.
 */
#include "torchzip.h"
#include <stdio.h>
#include <stdlib.h>

#define WALK_DEPTH 128
#define MEMO_MAX   ((uint64_t)1 << 24)

enum { V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_BYTES, V_TUPLE, V_LIST, V_DICT, V_GLOBAL, V_OBJ, V_PID };

typedef struct pv pv;
struct pv {
	uint8_t type, visited;
	int64_t i;                 /* V_INT, V_BOOL; V_PID: storage index */
	const uint8_t *s, *s2;     /* V_STR/V_BYTES: bytes; V_GLOBAL: module, name */
	size_t n, n2;
	pv **it;                   /* tuple/list items; dict and object: key, value pairs */
	size_t nit, cit;
	pv **li;                   /* object: appended items */
	size_t nli, cli;
	pv *args, *state;          /* object: reduction arguments, BUILD state */
};

struct ulp_pk {
	ulp_pk_storage *st;
	size_t n, cap;
	size_t *hash;              /* open addressing over st by key: index + 1, 0 empty */
	size_t hcap;
};

typedef struct px {
	const uint8_t *p, *end;
	ulp_err *e;
	pv **all;
	size_t nall, call;
	pv **stack;
	size_t nstack, cstack;
	size_t *marks;
	size_t nmarks, cmarks;
	pv **memo;
	size_t nmemo, cmemo;
	ulp_pk *k;
} px;

static pv *newv(px *x, int type)
{
	if (ulp_grow(&x->all, &x->call, x->nall, sizeof(pv *)) < 0)
		return NULL;
	pv *v = calloc(1, sizeof(*v));
	if (!v)
		return NULL;
	v->type = (uint8_t)type;
	x->all[x->nall++] = v;
	return v;
}

static int add_item(pv ***it, size_t *n, size_t *cap, pv *v)
{
	ULP_TRY(ulp_grow(it, cap, *n, sizeof(pv *)));
	(*it)[(*n)++] = v;
	return 0;
}

static size_t floor_mark(const px *x)
{
	return x->nmarks ? x->marks[x->nmarks - 1] : 0;
}

static int push(px *x, pv *v)
{
	if (!v)
		return -ULP_E_NOMEM;
	ULP_TRY(ulp_grow(&x->stack, &x->cstack, x->nstack, sizeof(pv *)));
	x->stack[x->nstack++] = v;
	return 0;
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
	if (idx >= MEMO_MAX || idx > x->nall)
		return ULP_CORRUPT(x->e, "pickle: memo index %llu", (unsigned long long)idx);
	while (x->cmemo <= idx) {
		size_t old = x->cmemo;
		ULP_TRY(ulp_grow(&x->memo, &x->cmemo, x->cmemo, sizeof(pv *)));
		memset(x->memo + old, 0, (x->cmemo - old) * sizeof(pv *));
	}
	x->memo[idx] = v;
	if (idx >= x->nmemo)
		x->nmemo = (size_t)idx + 1;
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
	return v->type == V_STR && v->n == strlen(s) && memcmp(v->s, s, v->n) == 0;
}

static ulp_dtype storage_dtype(const pv *g)
{
	static const struct { const char *name; ulp_dtype dt; } map[] = {
		{"DoubleStorage", ULP_DT_F64}, {"FloatStorage", ULP_DT_F32},
		{"HalfStorage", ULP_DT_F16},   {"BFloat16Storage", ULP_DT_BF16},
		{"LongStorage", ULP_DT_I64},   {"IntStorage", ULP_DT_I32},
		{"ShortStorage", ULP_DT_I16},  {"CharStorage", ULP_DT_I8},
		{"ByteStorage", ULP_DT_U8},    {"BoolStorage", ULP_DT_BOOL},
		{"UntypedStorage", ULP_DT_U8},
	};
	if (g->n != 5 || memcmp(g->s, "torch", 5) != 0)
		return ULP_DT_UNKNOWN;
	for (size_t i = 0; i < ULP_ARRAY_LEN(map); i++)
		if (g->n2 == strlen(map[i].name) && memcmp(g->s2, map[i].name, g->n2) == 0)
			return map[i].dt;
	return ULP_DT_UNKNOWN;
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
static long find_key(const ulp_pk *k, const uint8_t *key, size_t len, size_t *slot)
{
	size_t m = k->hcap - 1, i = (size_t)hash_bytes(key, len) & m;
	for (;; i = (i + 1) & m) {
		size_t h = k->hash[i];
		if (!h) {
			*slot = i;
			return -1;
		}
		const char *s = k->st[h - 1].key;
		if (strlen(s) == len && memcmp(s, key, len) == 0)
			return (long)(h - 1);
	}
}

static int rehash(ulp_pk *k)
{
	size_t ncap = k->hcap ? k->hcap * 2 : 64;
	size_t *nh = calloc(ncap, sizeof(size_t));
	if (!nh)
		return -ULP_E_NOMEM;
	free(k->hash);
	k->hash = nh;
	k->hcap = ncap;
	for (size_t j = 0; j < k->n; j++) {
		size_t slot;
		find_key(k, (const uint8_t *)k->st[j].key, strlen(k->st[j].key), &slot);
		k->hash[slot] = j + 1;
	}
	return 0;
}

/* BINPERSID: ('storage', torch.<T>Storage, key, location, numel). */
static int persid(px *x)
{
	pv *t;
	ULP_TRY(pop(x, &t));
	if (t->type != V_TUPLE || t->nit != 5 || !is_str(t->it[0], "storage") ||
	    t->it[1]->type != V_GLOBAL || t->it[2]->type != V_STR || t->it[3]->type != V_STR ||
	    t->it[4]->type != V_INT || t->it[4]->i < 0)
		return ULP_CORRUPT(x->e, "pickle: persistent id is not a storage");
	const pv *key = t->it[2];
	if (key->n == 0 || key->n > 256 || memchr(key->s, 0, key->n) || memchr(key->s, '/', key->n))
		return ULP_CORRUPT(x->e, "pickle: bad storage key");
	ulp_dtype dt = storage_dtype(t->it[1]);
	ulp_pk *k = x->k;
	if (k->n * 2 >= k->hcap)
		ULP_TRY(rehash(k));
	size_t slot;
	long idx = find_key(k, key->s, key->n, &slot);
	if (idx >= 0) {
		if (k->st[idx].dtype != dt || k->st[idx].numel != (uint64_t)t->it[4]->i)
			return ULP_CORRUPT(x->e, "pickle: storage '%.*s' used with two types or sizes",
			                   (int)key->n, key->s);
	} else {
		ULP_TRY(ulp_grow(&k->st, &k->cap, k->n, sizeof(*k->st)));
		ulp_pk_storage *s = &k->st[k->n];
		memset(s, 0, sizeof(*s));
		if (!(s->key = strndup((const char *)key->s, key->n)))
			return -ULP_E_NOMEM;
		s->dtype = dt;
		s->numel = (uint64_t)t->it[4]->i;
		idx = (long)k->n++;
		k->hash[slot] = k->n;
	}
	pv *v = newv(x, V_PID);
	if (!v)
		return -ULP_E_NOMEM;
	v->i = idx;
	return push(x, v);
}

static int str_op(px *x, int type, uint64_t n)
{
	if ((uint64_t)(x->end - x->p) < n)
		return ULP_CORRUPT(x->e, "pickle: string past the end");
	pv *v = newv(x, type);
	if (!v)
		return -ULP_E_NOMEM;
	v->s = x->p;
	v->n = (size_t)n;
	x->p += n;
	return push(x, v);
}

static int int_op(px *x, int64_t i)
{
	pv *v = newv(x, V_INT);
	if (!v)
		return -ULP_E_NOMEM;
	v->i = i;
	return push(x, v);
}

/* A collection made of stack[from, nstack). */
static int collect(px *x, int type, size_t from)
{
	pv *v = newv(x, type);
	if (!v)
		return -ULP_E_NOMEM;
	if (type == V_DICT && (x->nstack - from) % 2)
		return ULP_CORRUPT(x->e, "pickle: odd number of dict items");
	for (size_t i = from; i < x->nstack; i++)
		ULP_TRY(add_item(&v->it, &v->nit, &v->cit, x->stack[i]));
	x->nstack = from;
	return push(x, v);
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
		ULP_TRY(add_item(&d->it, &d->nit, &d->cit, x->stack[i]));
	x->nstack = from;
	return 0;
}

static int append_items(px *x, pv *l, size_t from)
{
	if (l->type != V_LIST && l->type != V_OBJ)
		return ULP_CORRUPT(x->e, "pickle: append to a non-list");
	for (size_t i = from; i < x->nstack; i++) {
		if (l->type == V_LIST)
			ULP_TRY(add_item(&l->it, &l->nit, &l->cit, x->stack[i]));
		else
			ULP_TRY(add_item(&l->li, &l->nli, &l->cli, x->stack[i]));
	}
	x->nstack = from;
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
	pv *v = newv(x, V_GLOBAL);
	if (!v)
		return -ULP_E_NOMEM;
	v->s = a;
	v->n = (size_t)(nl1 - a);
	v->s2 = b;
	v->n2 = (size_t)(nl2 - b);
	x->p = nl2 + 1;
	return push(x, v);
}

static int run(px *x, pv **result)
{
	size_t from = 0;
	pv *a, *b, *c;
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
				                   x->nstack, x->nmarks, (size_t)(x->end - x->p));
			*result = x->stack[0];
			return 0;
		case '(': /* MARK */
			ULP_TRY(ulp_grow(&x->marks, &x->cmarks, x->nmarks, sizeof(size_t)));
			x->marks[x->nmarks++] = x->nstack;
			break;
		case '0': /* POP */
			ULP_TRY(pop(x, &a));
			break;
		case '1': /* POP_MARK */
			ULP_TRY(pop_mark(x, &from));
			x->nstack = from;
			break;
		case '2': /* DUP */
			ULP_TRY(top(x, &a));
			ULP_TRY(push(x, a));
			break;
		case 'N':
			ULP_TRY(push(x, newv(x, V_NONE)));
			break;
		case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
			ULP_TRY(push(x, (a = newv(x, V_BOOL))));
			a->i = op == 0x88;
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
			ULP_TRY(push(x, newv(x, V_FLOAT)));
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
		case '}': case ']': case ')': case 0x8f: /* EMPTY_DICT, _LIST, _TUPLE, _SET */
			ULP_TRY(push(x, newv(x, op == '}' ? V_DICT : op == ')' ? V_TUPLE : V_LIST)));
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
		case 0x93: /* STACK_GLOBAL */
			ULP_TRY(pop(x, &b));
			ULP_TRY(pop(x, &a));
			if (a->type != V_STR || b->type != V_STR)
				return ULP_CORRUPT(x->e, "pickle: stack_global of non-strings");
			ULP_TRY(push(x, (c = newv(x, V_GLOBAL))));
			c->s = a->s, c->n = a->n, c->s2 = b->s, c->n2 = b->n;
			break;
		case 'R': case 0x81: /* REDUCE, NEWOBJ: callable (or class), args */
			ULP_TRY(pop(x, &b));
			ULP_TRY(pop(x, &a));
			if (b->type != V_TUPLE)
				return ULP_CORRUPT(x->e, "pickle: reduce without an argument tuple");
			ULP_TRY(push(x, (c = newv(x, V_OBJ))));
			c->args = b;
			(void)a; /* what is called does not matter to naming */
			break;
		case 'b': /* BUILD */
			ULP_TRY(pop(x, &b));
			ULP_TRY(top(x, &a));
			if (!a->state)
				a->state = b;
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
		path_add(path, pl, k->s, k->n);
	} else if (k->type == V_INT || k->type == V_BOOL) {
		int n = snprintf(num, sizeof(num), "%lld", (long long)k->i);
		path_add(path, pl, num, (size_t)n);
	} else {
		path_add(path, pl, "?", 1);
	}
}

static int walk(px *x, pv *v, char *path, size_t pl, unsigned depth)
{
	char num[32];
	if (!v || v->visited || depth > WALK_DEPTH)
		return 0;
	v->visited = 1;
	size_t l;
	switch (v->type) {
	case V_PID: {
		ulp_pk_storage *s = &x->k->st[v->i];
		if (!s->name && pl && !(s->name = strdup(path)))
			return -ULP_E_NOMEM;
		return 0;
	}
	case V_TUPLE: case V_LIST:
		for (size_t i = 0; i < v->nit; i++) {
			l = pl;
			int n = snprintf(num, sizeof(num), "%zu", i);
			path_add(path, &l, num, (size_t)n);
			ULP_TRY(walk(x, v->it[i], path, l, depth + 1));
			path[pl] = 0;
		}
		return 0;
	case V_DICT: case V_OBJ:
		/* an object's arguments (a tensor's storage, a Parameter's
		 * tensor) carry the object's own path */
		if (v->args && !v->args->visited) {
			v->args->visited = 1;
			for (size_t i = 0; i < v->args->nit; i++)
				ULP_TRY(walk(x, v->args->it[i], path, pl, depth + 1));
		}
		for (size_t i = 0; i + 1 < v->nit; i += 2) {
			l = pl;
			key_add(path, &l, v->it[i]);
			ULP_TRY(walk(x, v->it[i + 1], path, l, depth + 1));
			path[pl] = 0;
		}
		for (size_t i = 0; i < v->nli; i++) {
			l = pl;
			int n = snprintf(num, sizeof(num), "%zu", i);
			path_add(path, &l, num, (size_t)n);
			ULP_TRY(walk(x, v->li[i], path, l, depth + 1));
			path[pl] = 0;
		}
		if (v->state)
			ULP_TRY(walk(x, v->state, path, pl, depth + 1));
		return 0;
	default:
		return 0;
	}
}

/* Names must be unique (invariant 4): a storage no tensor names is
 * "storage:KEY"; a name already taken becomes "NAME#KEY", then
 * "storage:KEY#INDEX"; past that the pickle is refused. */
static int unique_names(ulp_pk *k, ulp_err *e)
{
	size_t hcap = 64;
	while (hcap < k->n * 2 + 2)
		hcap *= 2;
	size_t *h = calloc(hcap, sizeof(size_t));
	if (!h)
		return -ULP_E_NOMEM;
	int rc = 0;
	for (size_t i = 0; i < k->n && rc == 0; i++) {
		ulp_pk_storage *s = &k->st[i];
		int named = s->name != NULL;
		for (int attempt = named ? 0 : 1;; attempt++) {
			char buf[ULP_TZ_NAME_MAX + 300];
			if (attempt > 2) {
				rc = ULP_CORRUPT(e, "pickle: storage names collide");
				break;
			}
			if (attempt == 1 && named)
				snprintf(buf, sizeof(buf), "%s#%s", s->name, s->key);
			else if (attempt == 1)
				snprintf(buf, sizeof(buf), "storage:%s", s->key);
			else if (attempt == 2)
				snprintf(buf, sizeof(buf), "storage:%s#%zu", s->key, i);
			if (attempt > 0) {
				free(s->name);
				if (!(s->name = strdup(buf))) {
					rc = -ULP_E_NOMEM;
					break;
				}
			}
			size_t m = hcap - 1, j = (size_t)hash_bytes(s->name, strlen(s->name)) & m;
			int taken = 0;
			for (; h[j]; j = (j + 1) & m)
				if (strcmp(k->st[h[j] - 1].name, s->name) == 0) {
					taken = 1;
					break;
				}
			if (!taken) {
				h[j] = i + 1;
				break;
			}
		}
	}
	free(h);
	return rc;
}

int ulp_pk_parse(const uint8_t *p, size_t len, ulp_pk **out, char *why, size_t cap)
{
	ulp_err e = {why, cap};
	px x = {.p = p, .end = p + len, .e = &e};
	*out = NULL;
	if (!(x.k = calloc(1, sizeof(ulp_pk))))
		return -ULP_E_NOMEM;
	pv *root = NULL;
	int rc = run(&x, &root);
	if (rc == 0) {
		char path[ULP_TZ_NAME_MAX + 1] = "";
		rc = walk(&x, root, path, 0, 0);
	}
	if (rc == 0)
		rc = unique_names(x.k, &e);
	for (size_t i = 0; i < x.nall; i++) {
		free(x.all[i]->it);
		free(x.all[i]->li);
		free(x.all[i]);
	}
	free(x.all);
	free(x.stack);
	free(x.marks);
	free(x.memo);
	if (rc < 0) {
		ulp_pk_free(x.k);
		return rc;
	}
	*out = x.k;
	return 0;
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
	for (size_t i = 0; i < k->n; i++) {
		free(k->st[i].key);
		free(k->st[i].name);
	}
	free(k->st);
	free(k->hash);
	free(k);
}
