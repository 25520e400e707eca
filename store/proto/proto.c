/* proto.c: the TCPStore wire codec, both opcode numberings (torch-compat §1).
 * Pure: no I/O, no allocation, no logging. Decoders work on whatever prefix of
 * the stream has arrived and answer CRUN_EAGAIN until a whole frame is there;
 * the server and the blocking client (client.c) build on it.
 */
#include <string.h>

#include "store/store.h"

/* How the fields after the opcode are laid out (§1.3). */
enum req_shape {
	SH_NONE,	/* GETNUMKEYS CANCEL_WAIT LIST_KEYS */
	SH_U32,		/* VALIDATE PING */
	SH_KEY,		/* GET WATCH_KEY DELETE_KEY QUEUE_POP QUEUE_LEN */
	SH_KEY_VAL,	/* SET APPEND QUEUE_PUSH */
	SH_KEY_VAL_VAL, /* COMPARE_SET */
	SH_KEY_I64,	/* ADD BARRIER */
	SH_KEYS,	/* CHECK WAIT MULTI_GET */
	SH_PAIRS,	/* MULTI_SET */
};

struct op_info {
	const char *name;
	int8_t v1; /* opcode byte, -1 when the dialect lacks the op */
	int8_t v2;
	uint8_t shape;
	uint8_t reply;
	uint8_t reach; /* enum store_op_reach: 0 unless it reaches every key */
};

/* One row per logical op: §1.2's two numberings, §1.3's request layout (which
 * says where its keys are) and reply shape; the two ops that reach every key
 * say so (the others: 0, STORE_REACH_ARGS). v2 grew only at the end since
 * 2.1; DELETE_KEY is 8 in both. */
static const struct op_info ops[STORE_OP__MAX] = {
    [STORE_OP_VALIDATE] = {"VALIDATE", -1, 0, SH_U32, STORE_REPLY_NONE},
    [STORE_OP_SET] = {"SET", 0, 1, SH_KEY_VAL, STORE_REPLY_NONE},
    [STORE_OP_COMPARE_SET] = {"COMPARE_SET", 1, 2, SH_KEY_VAL_VAL, STORE_REPLY_BYTES},
    [STORE_OP_GET] = {"GET", 2, 3, SH_KEY, STORE_REPLY_BYTES},
    [STORE_OP_ADD] = {"ADD", 3, 4, SH_KEY_I64, STORE_REPLY_I64},
    [STORE_OP_CHECK] = {"CHECK", 4, 5, SH_KEYS, STORE_REPLY_U8},
    [STORE_OP_WAIT] = {"WAIT", 5, 6, SH_KEYS, STORE_REPLY_U8},
    [STORE_OP_GETNUMKEYS] = {"GETNUMKEYS", 6, 7, SH_NONE, STORE_REPLY_I64, STORE_REACH_ALL},
    [STORE_OP_WATCH_KEY] = {"WATCH_KEY", 7, -1, SH_KEY, STORE_REPLY_U8},
    [STORE_OP_DELETE_KEY] = {"DELETE_KEY", 8, 8, SH_KEY, STORE_REPLY_I64},
    [STORE_OP_APPEND] = {"APPEND", -1, 9, SH_KEY_VAL, STORE_REPLY_NONE},
    [STORE_OP_MULTI_GET] = {"MULTI_GET", -1, 10, SH_KEYS, STORE_REPLY_BYTES_N},
    [STORE_OP_MULTI_SET] = {"MULTI_SET", -1, 11, SH_PAIRS, STORE_REPLY_NONE},
    [STORE_OP_CANCEL_WAIT] = {"CANCEL_WAIT", -1, 12, SH_NONE, STORE_REPLY_U8},
    [STORE_OP_PING] = {"PING", -1, 13, SH_U32, STORE_REPLY_U32},
    [STORE_OP_QUEUE_PUSH] = {"QUEUE_PUSH", -1, 14, SH_KEY_VAL, STORE_REPLY_NONE},
    [STORE_OP_QUEUE_POP] = {"QUEUE_POP", -1, 15, SH_KEY, STORE_REPLY_COUNT_OPT},
    [STORE_OP_QUEUE_LEN] = {"QUEUE_LEN", -1, 16, SH_KEY, STORE_REPLY_I64},
    [STORE_OP_LIST_KEYS] = {"LIST_KEYS", -1, 17, SH_NONE, STORE_REPLY_COUNT_STRINGS,
			    STORE_REACH_ALL_FILTERED},
    [STORE_OP_BARRIER] = {"BARRIER", -1, 18, SH_KEY_I64, STORE_REPLY_U8},
};

/* Used when a caller passes no limits. */
static const struct store_limits default_limits = STORE_LIMITS_DEFAULT;

/* ---- integers ----------------------------------------------------------- */

/* PyTorch sends host-order integers; every real peer is little-endian, so
 * crun pins little-endian explicitly and works on any host (§1.1). */
uint8_t *store_put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 8;
}

uint8_t *store_put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 4;
}

uint8_t *store_put_bytes(uint8_t *p, const void *b, size_t len)
{
	p = store_put_u64(p, len);
	if (len)
		memcpy(p, b, len);
	return p + len;
}

uint64_t store_get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

uint32_t store_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- opcode tables ------------------------------------------------------ */

static bool dialect_ok(enum store_dialect d)
{
	return d == STORE_V1 || d == STORE_V2;
}

int store_proto_opcode(enum store_dialect d, enum store_op op)
{
	if (!dialect_ok(d) || (unsigned)op >= STORE_OP__MAX)
		return -1;
	return d == STORE_V1 ? ops[op].v1 : ops[op].v2;
}

int store_proto_op_from_code(enum store_dialect d, uint8_t code)
{
	if (!dialect_ok(d))
		return -1;
	for (int op = 0; op < STORE_OP__MAX; op++)
		if (store_proto_opcode(d, (enum store_op)op) == (int)code)
			return op;
	return -1;
}

enum store_op_reach store_proto_op_reach(enum store_op op)
{
	return (unsigned)op < STORE_OP__MAX ? (enum store_op_reach)ops[op].reach : STORE_REACH_ALL;
}

int store_proto_req_each_key(const struct store_req *q,
			     int (*fn)(void *arg, const uint8_t *key, size_t len), void *arg)
{
	const uint8_t *it = q->items;
	struct store_bytes k;
	int r;

	if ((unsigned)q->op >= STORE_OP__MAX)
		return 0;
	switch (ops[q->op].shape) {
	case SH_NONE:
	case SH_U32:
		return 0;
	case SH_KEYS:
	case SH_PAIRS:
		for (uint64_t i = 0; i < q->nitems; i++) {
			store_items_next(&it, &k);
			r = fn(arg, k.p, k.len);
			if (r)
				return r;
			if (ops[q->op].shape == SH_PAIRS)
				store_items_next(&it, &k); /* the value */
		}
		return 0;
	default: /* SH_KEY* */
		return fn(arg, q->key.p, q->key.len);
	}
}

const char *store_proto_op_name(enum store_op op)
{
	if ((unsigned)op >= STORE_OP__MAX)
		return "UNKNOWN";
	return ops[op].name;
}

enum store_reply_kind store_proto_reply_kind(enum store_op op)
{
	if ((unsigned)op >= STORE_OP__MAX)
		return STORE_REPLY_NONE;
	return (enum store_reply_kind)ops[op].reply;
}

/* ---- incremental reader ------------------------------------------------- */

/* A read position in the bytes received so far. Every read first checks that
 * its bytes have arrived; no length from the wire is ever added to a pointer
 * or size before it was compared with what is left, so a hostile u64 cannot
 * overflow anything. */
struct cur {
	const uint8_t *p;
	size_t len;
	size_t pos;
};

static int cur_need(const struct cur *c, uint64_t n)
{
	return n <= c->len - c->pos ? 0 : CRUN_EAGAIN;
}

static int cur_u64(struct cur *c, uint64_t *v)
{
	if (cur_need(c, 8) < 0)
		return CRUN_EAGAIN;
	*v = store_get_u64(c->p + c->pos);
	c->pos += 8;
	return 0;
}

static int cur_u32(struct cur *c, uint32_t *v)
{
	if (cur_need(c, 4) < 0)
		return CRUN_EAGAIN;
	*v = store_get_u32(c->p + c->pos);
	c->pos += 4;
	return 0;
}

/* A u64-length-prefixed string. The limit is checked as soon as the length is
 * readable, so an oversized frame is refused before its bytes are buffered. */
static int cur_str(struct cur *c, uint64_t max, struct store_bytes *out)
{
	uint64_t n;
	int r;

	r = cur_u64(c, &n);
	if (r < 0)
		return r;
	if (n > max)
		return CRUN_ETOOBIG;
	if (cur_need(c, n) < 0)
		return CRUN_EAGAIN;
	out->p = c->p + c->pos;
	out->len = (size_t)n;
	c->pos += (size_t)n;
	return 0;
}

/* A u64 count, then count strings (per_item = 1) or count key/value pairs
 * (per_item = 2). The whole list is validated so that store_items_next() can
 * walk it later without bounds checks. Bounded: count <= max_items, and each
 * string needs 8 more input bytes. With st, a list cut short records how far
 * it was validated, and a later call on the longer prefix resumes there. */
static int cur_list(struct cur *c, const struct store_limits *lim, int per_item,
		    struct store_dec_state *st, uint64_t *ret_n, const uint8_t **ret_items)
{
	const uint8_t *items;
	struct store_bytes s;
	uint64_t n, i = 0;
	int r;

	r = cur_u64(c, &n);
	if (r < 0)
		return r;
	if (n > lim->max_items)
		return CRUN_ETOOBIG;
	items = c->p + c->pos;
	if (st && st->done && st->pos >= c->pos && st->pos <= c->len) {
		c->pos = st->pos; /* the strings before it were checked already */
		i = st->done;
	}
	for (; i < n * (uint64_t)per_item; i++) {
		size_t at = c->pos;

		r = cur_str(c, per_item == 2 && (i & 1) ? lim->max_value_bytes : lim->max_key_bytes,
			    &s);
		if (r == CRUN_EAGAIN && st) {
			st->pos = at;
			st->done = i;
		}
		if (r < 0)
			return r;
	}
	*ret_n = n;
	*ret_items = items;
	return 0;
}

void store_items_next(const uint8_t **it, struct store_bytes *ret_item)
{
	const uint8_t *p = *it;
	uint64_t n = store_get_u64(p);

	ret_item->p = p + 8;
	ret_item->len = (size_t)n;
	*it = p + 8 + n;
}

/* ---- requests ----------------------------------------------------------- */

static int decode_fields(struct cur *c, const struct store_limits *lim, enum req_shape shape,
			 struct store_dec_state *st, struct store_req *q)
{
	uint64_t v;
	int r;

	switch (shape) {
	case SH_NONE:
		return 0;
	case SH_U32:
		return cur_u32(c, &q->u32);
	case SH_KEYS:
		return cur_list(c, lim, 1, st, &q->nitems, &q->items);
	case SH_PAIRS:
		/* PyTorch's client writes this count as an i64 and its server reads
		 * a u64: the bytes are the same, a negative count is just huge. */
		return cur_list(c, lim, 2, st, &q->nitems, &q->items);
	default:
		break;
	}
	r = cur_str(c, lim->max_key_bytes, &q->key);
	if (r < 0)
		return r;
	switch (shape) {
	case SH_KEY_VAL:
		return cur_str(c, lim->max_value_bytes, &q->val);
	case SH_KEY_VAL_VAL:
		r = cur_str(c, lim->max_value_bytes, &q->val);
		if (r < 0)
			return r;
		return cur_str(c, lim->max_value_bytes, &q->val2);
	case SH_KEY_I64:
		r = cur_u64(c, &v);
		if (r < 0)
			return r;
		q->num = (int64_t)v;
		return 0;
	default:
		return 0; /* SH_KEY */
	}
}

int store_proto_decode_req_from(enum store_dialect d, const struct store_limits *lim,
				struct store_dec_state *st, const uint8_t *buf, size_t len,
				struct store_req *out, size_t *used)
{
	struct cur c = {.p = buf, .len = len, .pos = 0};
	struct store_req q = {0};
	int op, r;

	if (!dialect_ok(d))
		return CRUN_EINVAL;
	if (!lim)
		lim = &default_limits;
	if (len == 0)
		return CRUN_EAGAIN;
	op = store_proto_op_from_code(d, buf[0]);
	if (op < 0)
		return CRUN_EPROTO;
	c.pos = 1;
	q.op = (enum store_op)op;
	r = decode_fields(&c, lim, (enum req_shape)ops[op].shape, st, &q);
	if (r < 0)
		return r;
	*out = q;
	*used = c.pos;
	return 0;
}

int store_proto_decode_req(enum store_dialect d, const struct store_limits *lim, const uint8_t *buf,
			   size_t len, struct store_req *out, size_t *used)
{
	return store_proto_decode_req_from(d, lim, NULL, buf, len, out, used);
}

/* size += n, refusing to wrap. */
static int size_add(size_t *size, uint64_t n)
{
	if (n > SIZE_MAX - *size)
		return CRUN_ETOOBIG;
	*size += (size_t)n;
	return 0;
}

static int size_str(size_t *size, const struct store_bytes *b)
{
	int r = size_add(size, 8);

	return r < 0 ? r : size_add(size, b->len);
}

/* The list an encoder writes comes from keys[] (and vals[]), nitems long. */
static int size_list(size_t *size, const struct store_req *req, int per_item)
{
	int r;

	if (req->nitems && (!req->keys || (per_item == 2 && !req->vals)))
		return CRUN_EINVAL;
	r = size_add(size, 8);
	for (uint64_t i = 0; r == 0 && i < req->nitems; i++) {
		r = size_str(size, &req->keys[i]);
		if (r == 0 && per_item == 2)
			r = size_str(size, &req->vals[i]);
	}
	return r;
}

static int req_size(enum store_dialect d, const struct store_req *req, size_t *ret_size)
{
	size_t size = 1;
	int r = 0;

	if (store_proto_opcode(d, req->op) < 0)
		return CRUN_EDIALECT;
	switch ((enum req_shape)ops[req->op].shape) {
	case SH_NONE:
		break;
	case SH_U32:
		size += 4;
		break;
	case SH_KEY:
		r = size_str(&size, &req->key);
		break;
	case SH_KEY_VAL:
		r = size_str(&size, &req->key);
		if (r == 0)
			r = size_str(&size, &req->val);
		break;
	case SH_KEY_VAL_VAL:
		r = size_str(&size, &req->key);
		if (r == 0)
			r = size_str(&size, &req->val);
		if (r == 0)
			r = size_str(&size, &req->val2);
		break;
	case SH_KEY_I64:
		r = size_str(&size, &req->key);
		if (r == 0)
			r = size_add(&size, 8);
		break;
	case SH_KEYS:
		r = size_list(&size, req, 1);
		break;
	case SH_PAIRS:
		r = size_list(&size, req, 2);
		break;
	}
	if (r < 0)
		return r;
	*ret_size = size;
	return 0;
}

size_t store_proto_req_size(enum store_dialect d, const struct store_req *req)
{
	size_t size;

	if (!req || req_size(d, req, &size) < 0)
		return 0;
	return size;
}

int store_proto_encode_req(enum store_dialect d, const struct store_req *req, uint8_t *buf,
			   size_t cap, size_t *ret_len)
{
	size_t size;
	uint8_t *p = buf;
	int r;

	if (!req || !dialect_ok(d) || (unsigned)req->op >= STORE_OP__MAX)
		return CRUN_EINVAL;
	r = req_size(d, req, &size);
	if (r < 0)
		return r;
	if (size > cap)
		return CRUN_ENOSPC;
	*p++ = (uint8_t)store_proto_opcode(d, req->op);
	switch ((enum req_shape)ops[req->op].shape) {
	case SH_NONE:
		break;
	case SH_U32:
		p = store_put_u32(p, req->u32);
		break;
	case SH_KEY:
	case SH_KEY_VAL:
	case SH_KEY_VAL_VAL:
	case SH_KEY_I64:
		p = store_put_bytes(p, req->key.p, req->key.len);
		if (ops[req->op].shape == SH_KEY_I64)
			p = store_put_u64(p, (uint64_t)req->num);
		if (ops[req->op].shape == SH_KEY_VAL || ops[req->op].shape == SH_KEY_VAL_VAL)
			p = store_put_bytes(p, req->val.p, req->val.len);
		if (ops[req->op].shape == SH_KEY_VAL_VAL)
			p = store_put_bytes(p, req->val2.p, req->val2.len);
		break;
	case SH_KEYS:
	case SH_PAIRS:
		/* MULTI_SET's count goes out as PyTorch's client writes it (an
		 * i64); for any real count that is the same 8 bytes as a u64. */
		p = store_put_u64(p, req->nitems);
		for (uint64_t i = 0; i < req->nitems; i++) {
			p = store_put_bytes(p, req->keys[i].p, req->keys[i].len);
			if (ops[req->op].shape == SH_PAIRS)
				p = store_put_bytes(p, req->vals[i].p, req->vals[i].len);
		}
		break;
	}
	*ret_len = (size_t)(p - buf);
	return 0;
}

/* ---- dialect sniffing (§1.8) --------------------------------------------- */

int store_proto_sniff(const uint8_t *buf, size_t len, enum store_dialect *ret_d,
		      size_t *ret_consumed)
{
	static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};

	if (len == 0)
		return CRUN_EAGAIN;
	/* A v1 client may send a lone 1-byte GETNUMKEYS and wait, so any
	 * first byte but 0x00 decides at once. */
	if (buf[0] != 0x00) {
		*ret_d = STORE_V1;
		*ret_consumed = 0;
		return 0;
	}
	/* 0x00 is v1 SET or v2 VALIDATE. Waiting for 4 more bytes is safe: a
	 * v1 SET must send 8 key-length bytes anyway. Only a SET whose key
	 * length has low 32 bits 0x3C85F7CE (~1 GB) would be misread. */
	if (len < sizeof(validate))
		return CRUN_EAGAIN;
	if (memcmp(buf, validate, sizeof(validate)) == 0) {
		*ret_d = STORE_V2;
		*ret_consumed = sizeof(validate);
	} else {
		*ret_d = STORE_V1;
		*ret_consumed = 0;
	}
	return 0;
}

/* ---- replies ------------------------------------------------------------- */

/* Reads n byte vectors back to back (MULTI_GET) or n strings (LIST_KEYS). */
static int cur_vectors(struct cur *c, uint64_t n, uint64_t max_len, const uint8_t **ret_items)
{
	const uint8_t *items = c->p + c->pos;
	struct store_bytes s;
	int r;

	for (uint64_t i = 0; i < n; i++) {
		r = cur_str(c, max_len, &s);
		if (r < 0)
			return r;
	}
	*ret_items = items;
	return 0;
}

/* An i64 count from the server; a negative one is a protocol error. */
static int cur_count(struct cur *c, int64_t *ret_n)
{
	uint64_t v;
	int r;

	r = cur_u64(c, &v);
	if (r < 0)
		return r;
	if ((int64_t)v < 0)
		return CRUN_EPROTO;
	*ret_n = (int64_t)v;
	return 0;
}

static int decode_reply_fields(struct cur *c, enum store_reply_kind kind, uint64_t nitems,
			       const struct store_limits *lim, struct store_reply *rep)
{
	uint64_t v;
	int r;

	switch (kind) {
	case STORE_REPLY_NONE:
		return 0;
	case STORE_REPLY_BYTES:
		return cur_str(c, lim->max_value_bytes, &rep->val);
	case STORE_REPLY_I64:
		r = cur_u64(c, &v);
		if (r == 0)
			rep->num = (int64_t)v;
		return r;
	case STORE_REPLY_U8:
		if (cur_need(c, 1) < 0)
			return CRUN_EAGAIN;
		rep->status = c->p[c->pos++];
		return 0;
	case STORE_REPLY_U32:
		return cur_u32(c, &rep->u32);
	case STORE_REPLY_BYTES_N:
		if (nitems > lim->max_items)
			return CRUN_ETOOBIG;
		rep->nitems = nitems;
		return cur_vectors(c, nitems, lim->max_value_bytes, &rep->items);
	case STORE_REPLY_COUNT_STRINGS:
		r = cur_count(c, &rep->num);
		if (r < 0)
			return r;
		if ((uint64_t)rep->num > lim->max_items)
			return CRUN_ETOOBIG;
		rep->nitems = (uint64_t)rep->num;
		return cur_vectors(c, rep->nitems, lim->max_key_bytes, &rep->items);
	case STORE_REPLY_COUNT_OPT:
		/* QUEUE_POP: the queue length before the pop; an item follows
		 * only when there was one. */
		r = cur_count(c, &rep->num);
		if (r < 0 || rep->num == 0)
			return r;
		return cur_str(c, lim->max_value_bytes, &rep->val);
	}
	return CRUN_EINVAL;
}

int store_proto_decode_reply(enum store_op op, uint64_t nitems, const struct store_limits *lim,
			     const uint8_t *buf, size_t len, struct store_reply *out, size_t *used)
{
	struct cur c = {.p = buf, .len = len, .pos = 0};
	struct store_reply rep = {0};
	int r;

	if ((unsigned)op >= STORE_OP__MAX)
		return CRUN_EINVAL;
	if (!lim)
		lim = &default_limits;
	r = decode_reply_fields(&c, store_proto_reply_kind(op), nitems, lim, &rep);
	if (r < 0)
		return r;
	*out = rep;
	*used = c.pos;
	return 0;
}
