/* test_store_proto.c: Check tests for the TCPStore wire codec (store/proto/proto.c):
 * opcode tables, round trips of every op in both dialects, incremental decoding
 * (every strict prefix asks for more), limits, sniffing, replies, the hex
 * vectors of torch-compat §1.9 and frames captured from real PyTorch 1.13.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "store/store.h"
#include "unit/check_main.h"
#include "unit/capture_vectors_113.h"

#define B(s)                                                                   \
	{                                                                      \
		.p = (const uint8_t *)(s), .len = sizeof(s) - 1                \
	}

static const struct store_limits lim_default = STORE_LIMITS_DEFAULT;

/* ---- helpers ---------------------------------------------------------------- */

static void assert_bytes_eq(struct store_bytes got, const void *want, size_t want_len)
{
	ck_assert_uint_eq(got.len, want_len);
	if (want_len)
		ck_assert_mem_eq(got.p, want, want_len);
}

/* Parses "00 0a ff" (spaces optional) into buf; returns the byte count. */
static size_t unhex(const char *hex, uint8_t *buf, size_t cap)
{
	size_t n = 0;
	unsigned v;

	while (*hex) {
		if (*hex == ' ') {
			hex++;
			continue;
		}
		ck_assert_int_eq(sscanf(hex, "%2x", &v), 1);
		ck_assert_uint_lt(n, cap);
		buf[n++] = (uint8_t)v;
		hex += 2;
	}
	return n;
}

static uint64_t next_items_eq(const uint8_t **it, const struct store_bytes *want)
{
	struct store_bytes got;

	store_items_next(it, &got);
	assert_bytes_eq(got, want->p, want->len);
	return got.len;
}

/* Decoded request == the request that was encoded (lists walked in full). */
static void assert_req_eq(const struct store_req *got, const struct store_req *want)
{
	const uint8_t *it = got->items;

	ck_assert_int_eq(got->op, want->op);
	assert_bytes_eq(got->key, want->key.p, want->key.len);
	assert_bytes_eq(got->val, want->val.p, want->val.len);
	assert_bytes_eq(got->val2, want->val2.p, want->val2.len);
	ck_assert_int_eq(got->num, want->num);
	ck_assert_uint_eq(got->u32, want->u32);
	ck_assert_uint_eq(got->nitems, want->nitems);
	for (uint64_t i = 0; i < want->nitems; i++) {
		next_items_eq(&it, &want->keys[i]);
		if (want->op == STORE_OP_MULTI_SET)
			next_items_eq(&it, &want->vals[i]);
	}
}

/* ---- sample requests: one or more per op ------------------------------------ */

static const struct store_bytes keys3[] = { B("/k1"), B(""), B("/a/long/key/with\0nul") };
static const struct store_bytes vals3[] = { B("v1"), B("\x00\xff"), B("") };

static const struct store_req samples[] = {
	{ .op = STORE_OP_VALIDATE, .u32 = STORE_VALIDATE_MAGIC },
	{ .op = STORE_OP_SET, .key = B("/k1"), .val = B("v1") },
	{ .op = STORE_OP_SET, .key = B(""), .val = B("") },
	{ .op = STORE_OP_COMPARE_SET, .key = B("/k1"), .val = B("v1"), .val2 = B("v2") },
	{ .op = STORE_OP_COMPARE_SET, .key = B("/m"), .val = B(""), .val2 = B("new") },
	{ .op = STORE_OP_GET, .key = B("/k1") },
	{ .op = STORE_OP_ADD, .key = B("/cnt"), .num = -2 },
	{ .op = STORE_OP_ADD, .key = B("init/"), .num = INT64_MIN },
	{ .op = STORE_OP_CHECK, .nitems = 3, .keys = keys3 },
	{ .op = STORE_OP_CHECK, .nitems = 0 },
	{ .op = STORE_OP_WAIT, .nitems = 1, .keys = keys3 },
	{ .op = STORE_OP_WAIT, .nitems = 0 },
	{ .op = STORE_OP_GETNUMKEYS },
	{ .op = STORE_OP_WATCH_KEY, .key = B("/a") },
	{ .op = STORE_OP_DELETE_KEY, .key = B("/k2") },
	{ .op = STORE_OP_APPEND, .key = B("/log"), .val = B("more") },
	{ .op = STORE_OP_MULTI_GET, .nitems = 3, .keys = keys3 },
	{ .op = STORE_OP_MULTI_SET, .nitems = 3, .keys = keys3, .vals = vals3 },
	{ .op = STORE_OP_MULTI_SET, .nitems = 0 },
	{ .op = STORE_OP_CANCEL_WAIT },
	{ .op = STORE_OP_PING, .u32 = 12345 },
	{ .op = STORE_OP_QUEUE_PUSH, .key = B("/q"), .val = B("item") },
	{ .op = STORE_OP_QUEUE_POP, .key = B("/q") },
	{ .op = STORE_OP_QUEUE_LEN, .key = B("/q") },
	{ .op = STORE_OP_LIST_KEYS },
	{ .op = STORE_OP_BARRIER, .key = B("/barrier"), .num = 8 },
};
#define NSAMPLES (sizeof(samples) / sizeof(samples[0]))

static bool v1_has(enum store_op op)
{
	return op <= STORE_OP_DELETE_KEY && op != STORE_OP_VALIDATE;
}

static bool v2_has(enum store_op op)
{
	return op != STORE_OP_WATCH_KEY;
}

/* ---- opcode tables ------------------------------------------------------------ */

START_TEST(opcode_tables_match_the_reference)
{
	/* torch-compat §1.2, written out independently of proto.c's table. */
	static const int v1[STORE_OP__MAX] = {
		[STORE_OP_VALIDATE] = -1,   [STORE_OP_SET] = 0,	       [STORE_OP_COMPARE_SET] = 1,
		[STORE_OP_GET] = 2,	    [STORE_OP_ADD] = 3,	       [STORE_OP_CHECK] = 4,
		[STORE_OP_WAIT] = 5,	    [STORE_OP_GETNUMKEYS] = 6, [STORE_OP_WATCH_KEY] = 7,
		[STORE_OP_DELETE_KEY] = 8,  [STORE_OP_APPEND] = -1,    [STORE_OP_MULTI_GET] = -1,
		[STORE_OP_MULTI_SET] = -1,  [STORE_OP_CANCEL_WAIT] = -1, [STORE_OP_PING] = -1,
		[STORE_OP_QUEUE_PUSH] = -1, [STORE_OP_QUEUE_POP] = -1, [STORE_OP_QUEUE_LEN] = -1,
		[STORE_OP_LIST_KEYS] = -1,  [STORE_OP_BARRIER] = -1,
	};
	static const int v2[STORE_OP__MAX] = {
		[STORE_OP_VALIDATE] = 0,    [STORE_OP_SET] = 1,	       [STORE_OP_COMPARE_SET] = 2,
		[STORE_OP_GET] = 3,	    [STORE_OP_ADD] = 4,	       [STORE_OP_CHECK] = 5,
		[STORE_OP_WAIT] = 6,	    [STORE_OP_GETNUMKEYS] = 7, [STORE_OP_WATCH_KEY] = -1,
		[STORE_OP_DELETE_KEY] = 8,  [STORE_OP_APPEND] = 9,     [STORE_OP_MULTI_GET] = 10,
		[STORE_OP_MULTI_SET] = 11,  [STORE_OP_CANCEL_WAIT] = 12, [STORE_OP_PING] = 13,
		[STORE_OP_QUEUE_PUSH] = 14, [STORE_OP_QUEUE_POP] = 15, [STORE_OP_QUEUE_LEN] = 16,
		[STORE_OP_LIST_KEYS] = 17,  [STORE_OP_BARRIER] = 18,
	};

	for (int op = 0; op < STORE_OP__MAX; op++) {
		ck_assert_int_eq(store_proto_opcode(STORE_V1, (enum store_op)op), v1[op]);
		ck_assert_int_eq(store_proto_opcode(STORE_V2, (enum store_op)op), v2[op]);
		if (v1[op] >= 0)
			ck_assert_int_eq(store_proto_op_from_code(STORE_V1, (uint8_t)v1[op]), op);
		if (v2[op] >= 0)
			ck_assert_int_eq(store_proto_op_from_code(STORE_V2, (uint8_t)v2[op]), op);
	}
	for (int code = 9; code < 256; code++)
		ck_assert_int_eq(store_proto_op_from_code(STORE_V1, (uint8_t)code), -1);
	for (int code = 19; code < 256; code++)
		ck_assert_int_eq(store_proto_op_from_code(STORE_V2, (uint8_t)code), -1);
	ck_assert_int_eq(store_proto_opcode((enum store_dialect)0, STORE_OP_SET), -1);
	ck_assert_int_eq(store_proto_opcode(STORE_V1, STORE_OP__MAX), -1);
	ck_assert_int_eq(store_proto_op_from_code((enum store_dialect)3, 0), -1);
}
END_TEST

START_TEST(op_names_and_reply_kinds_match_the_reference)
{
	static const char *const names[STORE_OP__MAX] = {
		"VALIDATE",    "SET",	      "COMPARE_SET", "GET",	   "ADD",
		"CHECK",       "WAIT",	      "GETNUMKEYS",  "WATCH_KEY",  "DELETE_KEY",
		"APPEND",      "MULTI_GET",   "MULTI_SET",   "CANCEL_WAIT", "PING",
		"QUEUE_PUSH",  "QUEUE_POP",   "QUEUE_LEN",   "LIST_KEYS",  "BARRIER",
	};
	static const enum store_reply_kind kinds[STORE_OP__MAX] = {
		[STORE_OP_VALIDATE] = STORE_REPLY_NONE,
		[STORE_OP_SET] = STORE_REPLY_NONE,
		[STORE_OP_COMPARE_SET] = STORE_REPLY_BYTES,
		[STORE_OP_GET] = STORE_REPLY_BYTES,
		[STORE_OP_ADD] = STORE_REPLY_I64,
		[STORE_OP_CHECK] = STORE_REPLY_U8,
		[STORE_OP_WAIT] = STORE_REPLY_U8,
		[STORE_OP_GETNUMKEYS] = STORE_REPLY_I64,
		[STORE_OP_WATCH_KEY] = STORE_REPLY_U8,
		[STORE_OP_DELETE_KEY] = STORE_REPLY_I64,
		[STORE_OP_APPEND] = STORE_REPLY_NONE,
		[STORE_OP_MULTI_GET] = STORE_REPLY_BYTES_N,
		[STORE_OP_MULTI_SET] = STORE_REPLY_NONE,
		[STORE_OP_CANCEL_WAIT] = STORE_REPLY_U8,
		[STORE_OP_PING] = STORE_REPLY_U32,
		[STORE_OP_QUEUE_PUSH] = STORE_REPLY_NONE,
		[STORE_OP_QUEUE_POP] = STORE_REPLY_COUNT_OPT,
		[STORE_OP_QUEUE_LEN] = STORE_REPLY_I64,
		[STORE_OP_LIST_KEYS] = STORE_REPLY_COUNT_STRINGS,
		[STORE_OP_BARRIER] = STORE_REPLY_U8,
	};

	for (int op = 0; op < STORE_OP__MAX; op++) {
		ck_assert_str_eq(store_proto_op_name((enum store_op)op), names[op]);
		ck_assert_int_eq(store_proto_reply_kind((enum store_op)op), kinds[op]);
	}
	ck_assert_ptr_nonnull(store_proto_op_name(STORE_OP__MAX));
}
END_TEST

START_TEST(integers_are_little_endian_on_the_wire)
{
	uint8_t b[32], *p;

	p = store_put_u64(b, 0x0102030405060708ull);
	ck_assert_ptr_eq(p, b + 8);
	ck_assert_mem_eq(b, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	ck_assert_uint_eq(store_get_u64(b), 0x0102030405060708ull);
	p = store_put_u32(b, STORE_VALIDATE_MAGIC);
	ck_assert_ptr_eq(p, b + 4);
	ck_assert_mem_eq(b, "\xce\xf7\x85\x3c", 4);
	ck_assert_uint_eq(store_get_u32(b), STORE_VALIDATE_MAGIC);
	p = store_put_bytes(b, "v1", 2);
	ck_assert_ptr_eq(p, b + 10);
	ck_assert_mem_eq(b, "\x02\0\0\0\0\0\0\0v1", 10);
	p = store_put_bytes(b, NULL, 0);
	ck_assert_ptr_eq(p, b + 8);
	ck_assert_uint_eq(store_get_u64(b), 0);
	store_put_u64(b, UINT64_MAX);
	ck_assert_uint_eq(store_get_u64(b), UINT64_MAX);
}
END_TEST

/* ---- round trips and prefixes (loop index = sample * 2 + dialect) -------------- */

static enum store_dialect loop_dialect(int i)
{
	return (i & 1) ? STORE_V2 : STORE_V1;
}

START_TEST(encode_then_decode_gives_the_same_fields)
{
	const struct store_req *req = &samples[_i / 2];
	enum store_dialect d = loop_dialect(_i);
	bool has = d == STORE_V1 ? v1_has(req->op) : v2_has(req->op);
	uint8_t buf[256];
	struct store_req out;
	size_t len = 7, used;

	if (!has) {
		ck_assert_uint_eq(store_proto_req_size(d, req), 0);
		ck_assert_int_eq(store_proto_encode_req(d, req, buf, sizeof(buf), &len),
				 CRUN_EDIALECT);
		ck_assert_uint_eq(len, 7); /* ret_len untouched on failure */
		return;
	}
	ck_assert_int_eq(store_proto_encode_req(d, req, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, store_proto_req_size(d, req));
	ck_assert_int_eq(buf[0], store_proto_opcode(d, req->op));
	ck_assert_int_eq(store_proto_decode_req(d, &lim_default, buf, len, &out, &used), 0);
	ck_assert_uint_eq(used, len);
	assert_req_eq(&out, req);
}
END_TEST

START_TEST(decode_asks_for_more_on_every_strict_prefix)
{
	const struct store_req *req = &samples[_i / 2];
	enum store_dialect d = loop_dialect(_i);
	uint8_t buf[256];
	struct store_req out = { .op = STORE_OP__MAX };
	size_t len, used = 99;

	if (store_proto_encode_req(d, req, buf, sizeof(buf), &len) < 0)
		return; /* op not in this dialect: covered above */
	for (size_t n = 0; n < len; n++) {
		ck_assert_int_eq(store_proto_decode_req(d, &lim_default, buf, n, &out, &used),
				 CRUN_EAGAIN);
		ck_assert_uint_eq(used, 99); /* outputs untouched */
		ck_assert_int_eq(out.op, STORE_OP__MAX);
	}
}
END_TEST

START_TEST(encode_refuses_a_short_buffer)
{
	const struct store_req *req = &samples[_i / 2];
	enum store_dialect d = loop_dialect(_i);
	uint8_t buf[256];
	size_t size = store_proto_req_size(d, req), len = 0;

	if (!size)
		return;
	for (size_t cap = 0; cap < size; cap++)
		ck_assert_int_eq(store_proto_encode_req(d, req, buf, cap, &len), CRUN_ENOSPC);
	ck_assert_int_eq(store_proto_encode_req(d, req, buf, size, &len), 0);
	ck_assert_uint_eq(len, size);
}
END_TEST

START_TEST(pipelined_frames_decode_one_after_another)
{
	enum store_dialect d = _i ? STORE_V2 : STORE_V1;
	uint8_t buf[4096];
	size_t off = 0, len, used, n = 0;
	struct store_req out;

	for (size_t i = 0; i < NSAMPLES; i++)
		if (store_proto_encode_req(d, &samples[i], buf + off, sizeof(buf) - off, &len) == 0)
			off += len;
	for (size_t i = 0, pos = 0; i < NSAMPLES; i++) {
		if (!store_proto_req_size(d, &samples[i]))
			continue;
		ck_assert_int_eq(
			store_proto_decode_req(d, &lim_default, buf + pos, off - pos, &out, &used), 0);
		assert_req_eq(&out, &samples[i]);
		pos += used;
		n++;
		if (pos == off)
			ck_assert_int_eq(store_proto_decode_req(d, &lim_default, buf + pos, 0, &out,
								&used),
					 CRUN_EAGAIN);
	}
	ck_assert_uint_eq(n, d == STORE_V1 ? 14 : 25);
}
END_TEST

START_TEST(encode_rejects_bad_arguments)
{
	struct store_req req = { .op = STORE_OP_WAIT, .nitems = 2, .keys = NULL };
	struct store_req ms = { .op = STORE_OP_MULTI_SET, .nitems = 1, .keys = keys3 };
	uint8_t buf[64];
	size_t len;

	ck_assert_int_eq(store_proto_encode_req(STORE_V1, &req, buf, sizeof(buf), &len),
			 CRUN_EINVAL);
	ck_assert_uint_eq(store_proto_req_size(STORE_V1, &req), 0);
	ck_assert_int_eq(store_proto_encode_req(STORE_V2, &ms, buf, sizeof(buf), &len),
			 CRUN_EINVAL);
	req.op = STORE_OP__MAX;
	ck_assert_int_eq(store_proto_encode_req(STORE_V2, &req, buf, sizeof(buf), &len),
			 CRUN_EINVAL);
	req.op = STORE_OP_GETNUMKEYS;
	ck_assert_int_eq(store_proto_encode_req((enum store_dialect)0, &req, buf, sizeof(buf),
						&len),
			 CRUN_EINVAL);
	ck_assert_uint_eq(store_proto_req_size(STORE_V1, NULL), 0);
}
END_TEST

START_TEST(encode_refuses_sizes_that_would_wrap)
{
	struct store_bytes huge[2] = { { (const uint8_t *)"x", SIZE_MAX / 2 },
				       { (const uint8_t *)"y", SIZE_MAX / 2 } };
	struct store_req req = { .op = STORE_OP_MULTI_GET, .nitems = 2, .keys = huge };
	struct store_req set = { .op = STORE_OP_SET, .key = { (const uint8_t *)"k", SIZE_MAX - 4 } };
	uint8_t buf[16];
	size_t len;

	ck_assert_uint_eq(store_proto_req_size(STORE_V2, &req), 0);
	ck_assert_int_eq(store_proto_encode_req(STORE_V2, &req, buf, sizeof(buf), &len),
			 CRUN_ETOOBIG);
	ck_assert_uint_eq(store_proto_req_size(STORE_V1, &set), 0);
	ck_assert_int_eq(store_proto_encode_req(STORE_V1, &set, buf, sizeof(buf), &len),
			 CRUN_ETOOBIG);
}
END_TEST

/* ---- limits and malformed input --------------------------------------------- */

static const struct store_limits lim_small = { .max_key_bytes = 16,
					       .max_value_bytes = 32,
					       .max_items = 4 };

/* Decodes buf[0..n) for every n from `from` to len: all must give `want`. */
static void assert_decode_all(enum store_dialect d, const struct store_limits *lim,
			      const uint8_t *buf, size_t from, size_t len, int want)
{
	struct store_req out;
	size_t used;

	for (size_t n = from; n <= len; n++)
		ck_assert_int_eq(store_proto_decode_req(d, lim, buf, n, &out, &used), want);
}

START_TEST(decode_rejects_an_oversized_key_from_its_length_alone)
{
	uint8_t b[64], *p = b;

	*p++ = 0x00; /* v1 SET */
	p = store_put_u64(p, 17);
	assert_decode_all(STORE_V1, &lim_small, b, 0, 8, CRUN_EAGAIN);
	assert_decode_all(STORE_V1, &lim_small, b, 9, 9, CRUN_ETOOBIG);
	/* The same with the default limit and a length one over it. */
	b[0] = 0x03; /* v2 GET */
	store_put_u64(b + 1, lim_default.max_key_bytes + 1);
	assert_decode_all(STORE_V2, &lim_default, b, 9, 9, CRUN_ETOOBIG);
	/* Exactly at the limit is fine. */
	store_put_u64(b + 1, 16);
	memset(b + 9, 'k', 16);
	assert_decode_all(STORE_V2, &lim_small, b, 9, 24, CRUN_EAGAIN);
	assert_decode_all(STORE_V2, &lim_small, b, 25, 25, 0);
	(void)p;
}
END_TEST

START_TEST(decode_rejects_an_oversized_value_from_its_length_alone)
{
	uint8_t b[64], *p = b;

	*p++ = 0x01; /* v2 SET */
	p = store_put_bytes(p, "/k", 2);
	p = store_put_u64(p, 33);
	assert_decode_all(STORE_V2, &lim_small, b, 0, (size_t)(p - b) - 1, CRUN_EAGAIN);
	assert_decode_all(STORE_V2, &lim_small, b, (size_t)(p - b), (size_t)(p - b),
			  CRUN_ETOOBIG);

	/* COMPARE_SET's desired value counts too. */
	p = b;
	*p++ = 0x01; /* v1 COMPARE_SET */
	p = store_put_bytes(p, "/k", 2);
	p = store_put_bytes(p, "", 0);
	p = store_put_u64(p, UINT64_MAX);
	assert_decode_all(STORE_V1, &lim_default, b, (size_t)(p - b), (size_t)(p - b),
			  CRUN_ETOOBIG);
}
END_TEST

START_TEST(decode_rejects_too_many_items_from_the_count_alone)
{
	/* CHECK, WAIT (v1 and v2), MULTI_GET, MULTI_SET. */
	static const struct {
		enum store_dialect d;
		uint8_t code;
	} lists[] = { { STORE_V1, 4 }, { STORE_V1, 5 }, { STORE_V2, 5 },
		      { STORE_V2, 6 }, { STORE_V2, 10 }, { STORE_V2, 11 } };
	uint8_t b[16];

	for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
		b[0] = lists[i].code;
		store_put_u64(b + 1, 5);
		assert_decode_all(lists[i].d, &lim_small, b, 0, 8, CRUN_EAGAIN);
		assert_decode_all(lists[i].d, &lim_small, b, 9, 9, CRUN_ETOOBIG);
		store_put_u64(b + 1, lim_default.max_items + 1);
		assert_decode_all(lists[i].d, &lim_default, b, 9, 9, CRUN_ETOOBIG);
		/* A negative i64 count, as a broken client could write it. */
		store_put_u64(b + 1, (uint64_t)-1);
		assert_decode_all(lists[i].d, &lim_default, b, 9, 9, CRUN_ETOOBIG);
		/* At the limit the decoder simply waits for the keys. */
		store_put_u64(b + 1, 4);
		assert_decode_all(lists[i].d, &lim_small, b, 9, 9, CRUN_EAGAIN);
	}
}
END_TEST

/* A list fed a byte at a time with resumable state: every call resumes where
 * the last stopped (the state's position only moves forward and never goes
 * back to the list's start), the final decode equals the one-shot one, and an
 * oversized string is still refused when it shows up. Before issue 9 every
 * call re-validated the whole list: O(n^2) for a trickled 300k-key CHECK. */
START_TEST(resumable_decode_validates_each_list_string_once)
{
	static uint8_t b[64 * 1024];
	struct store_req one, q;
	struct store_dec_state st = { 0 };
	size_t used1, used = 0, last_pos = 0, n, len;
	uint8_t *p = b;
	int r = CRUN_EAGAIN;

	*p++ = 10; /* v2 MULTI_GET, 2000 keys */
	p = store_put_u64(p, 2000);
	for (int i = 0; i < 2000; i++) {
		char k[16];

		n = (size_t)snprintf(k, sizeof(k), "/k%d", i);
		p = store_put_bytes(p, k, n);
	}
	len = (size_t)(p - b);
	ck_assert_int_eq(store_proto_decode_req(STORE_V2, NULL, b, len, &one, &used1), 0);
	for (size_t have = 1; have <= len; have++) {
		r = store_proto_decode_req_from(STORE_V2, NULL, &st, b, have, &q, &used);
		if (have < len) {
			ck_assert_int_eq(r, CRUN_EAGAIN);
			ck_assert_uint_ge(st.pos, last_pos);
			last_pos = st.pos;
		}
	}
	ck_assert_int_eq(r, 0);
	ck_assert_uint_eq(used, used1);
	ck_assert_uint_eq(q.nitems, 2000);
	ck_assert_ptr_eq(q.items, one.items);
	ck_assert_uint_eq(st.done, 1999); /* the last string was the one missing */

	/* v1 WAIT with an oversized 3rd key, resumed past the first two. */
	memset(&st, 0, sizeof(st));
	p = b;
	*p++ = 5;
	p = store_put_u64(p, 3);
	p = store_put_bytes(p, "/a", 2);
	p = store_put_bytes(p, "/b", 2);
	ck_assert_int_eq(store_proto_decode_req_from(STORE_V1, &lim_small, &st, b, (size_t)(p - b),
						     &q, &used), CRUN_EAGAIN);
	ck_assert_uint_eq(st.done, 2);
	p = store_put_u64(p, 17);
	ck_assert_int_eq(store_proto_decode_req_from(STORE_V1, &lim_small, &st, b, (size_t)(p - b),
						     &q, &used), CRUN_ETOOBIG);
}
END_TEST

START_TEST(decode_rejects_an_oversized_item_inside_a_list)
{
	uint8_t b[128], *p = b;

	*p++ = 11; /* v2 MULTI_SET, 2 pairs; the 2nd value is too big */
	p = store_put_u64(p, 2);
	p = store_put_bytes(p, "/a", 2);
	p = store_put_bytes(p, "1", 1);
	p = store_put_bytes(p, "/b", 2);
	p = store_put_u64(p, 33);
	assert_decode_all(STORE_V2, &lim_small, b, 0, (size_t)(p - b) - 1, CRUN_EAGAIN);
	assert_decode_all(STORE_V2, &lim_small, b, (size_t)(p - b), (size_t)(p - b),
			  CRUN_ETOOBIG);

	p = b;
	*p++ = 5; /* v1 WAIT, 2nd key too big */
	p = store_put_u64(p, 2);
	p = store_put_bytes(p, "/a", 2);
	p = store_put_u64(p, 17);
	assert_decode_all(STORE_V1, &lim_small, b, (size_t)(p - b), (size_t)(p - b),
			  CRUN_ETOOBIG);
}
END_TEST

START_TEST(decode_with_no_limits_waits_instead_of_overflowing)
{
	static const struct store_limits unlimited = { .max_key_bytes = SIZE_MAX,
						       .max_value_bytes = SIZE_MAX,
						       .max_items = UINT64_MAX };
	uint8_t b[32];

	/* A u64 length near 2^64 must not wrap a pointer or a size. */
	b[0] = 0x02; /* v1 GET */
	store_put_u64(b + 1, UINT64_MAX);
	memset(b + 9, 'x', sizeof(b) - 9);
	assert_decode_all(STORE_V1, &unlimited, b, 0, sizeof(b), CRUN_EAGAIN);
	store_put_u64(b + 1, UINT64_MAX - 8);
	assert_decode_all(STORE_V1, &unlimited, b, 0, sizeof(b), CRUN_EAGAIN);
	b[0] = 0x05; /* v1 WAIT with 2^64-1 keys */
	store_put_u64(b + 1, UINT64_MAX);
	store_put_u64(b + 9, 0);
	store_put_u64(b + 17, 0);
	assert_decode_all(STORE_V1, &unlimited, b, 0, 25, CRUN_EAGAIN);
	/* NULL limits mean the defaults. */
	b[0] = 0x02;
	store_put_u64(b + 1, lim_default.max_key_bytes + 1);
	assert_decode_all(STORE_V1, NULL, b, 9, 9, CRUN_ETOOBIG);
}
END_TEST

START_TEST(decode_rejects_unknown_opcodes)
{
	struct store_req out;
	size_t used;
	uint8_t b[16] = { 0 };

	for (int code = 0; code < 256; code++) {
		b[0] = (uint8_t)code;
		if (code > 8)
			ck_assert_int_eq(store_proto_decode_req(STORE_V1, &lim_default, b, 1, &out,
								&used),
					 CRUN_EPROTO);
		if (code > 18)
			ck_assert_int_eq(store_proto_decode_req(STORE_V2, &lim_default, b,
								sizeof(b), &out, &used),
					 CRUN_EPROTO);
	}
	ck_assert_int_eq(store_proto_decode_req((enum store_dialect)0, &lim_default, b, 1, &out,
						&used),
			 CRUN_EINVAL);
}
END_TEST

START_TEST(the_same_byte_means_different_ops_per_dialect)
{
	uint8_t b[16] = { 0x07 };
	struct store_req out;
	size_t used;

	/* 0x07 is v1 WATCH_KEY (a key follows) and v2 GETNUMKEYS (nothing). */
	ck_assert_int_eq(store_proto_decode_req(STORE_V2, &lim_default, b, 1, &out, &used), 0);
	ck_assert_int_eq(out.op, STORE_OP_GETNUMKEYS);
	ck_assert_uint_eq(used, 1);
	ck_assert_int_eq(store_proto_decode_req(STORE_V1, &lim_default, b, 1, &out, &used),
			 CRUN_EAGAIN);
	store_put_u64(b + 1, 2);
	memcpy(b + 9, "/a", 2);
	ck_assert_int_eq(store_proto_decode_req(STORE_V1, &lim_default, b, 11, &out, &used), 0);
	ck_assert_int_eq(out.op, STORE_OP_WATCH_KEY);
	assert_bytes_eq(out.key, "/a", 2);
	ck_assert_uint_eq(used, 11);
}
END_TEST

/* ---- dialect sniffing (§1.8) -------------------------------------------------- */

START_TEST(sniff_decides_v1_on_any_nonzero_first_byte)
{
	uint8_t b[1];
	enum store_dialect d = STORE_V2;
	size_t used = 9;

	for (int c = 1; c < 256; c++) {
		b[0] = (uint8_t)c;
		d = STORE_V2;
		ck_assert_int_eq(store_proto_sniff(b, 1, &d, &used), 0);
		ck_assert_int_eq(d, STORE_V1);
		ck_assert_uint_eq(used, 0);
	}
}
END_TEST

START_TEST(sniff_eats_validate_and_leaves_the_ping)
{
	uint8_t b[16];
	size_t n = unhex("00 ce f7 85 3c 0d 39 30 00 00", b, sizeof(b)), used;
	enum store_dialect d;
	struct store_req out;

	ck_assert_int_eq(store_proto_sniff(b, n, &d, &used), 0);
	ck_assert_int_eq(d, STORE_V2);
	ck_assert_uint_eq(used, 5);
	ck_assert_int_eq(store_proto_decode_req(d, &lim_default, b + used, n - used, &out, &used),
			 0);
	ck_assert_int_eq(out.op, STORE_OP_PING);
	ck_assert_uint_eq(out.u32, 12345);
	ck_assert_uint_eq(used, 5);
	/* VALIDATE alone is enough to decide; it is also a decodable v2 frame. */
	ck_assert_int_eq(store_proto_sniff(b, 5, &d, &used), 0);
	ck_assert_int_eq(d, STORE_V2);
	ck_assert_int_eq(store_proto_decode_req(STORE_V2, &lim_default, b, 5, &out, &used), 0);
	ck_assert_int_eq(out.op, STORE_OP_VALIDATE);
	ck_assert_uint_eq(out.u32, STORE_VALIDATE_MAGIC);
}
END_TEST

START_TEST(sniff_keeps_a_v1_set_that_starts_with_zero)
{
	uint8_t b[64];
	size_t n = unhex("00 03 00 00 00 00 00 00 00 2f 6b 31 02 00 00 00 00 00 00 00 76 31", b,
			 sizeof(b)),
	       used;
	enum store_dialect d;
	struct store_req out;

	ck_assert_int_eq(store_proto_sniff(b, 5, &d, &used), 0);
	ck_assert_int_eq(d, STORE_V1);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(store_proto_sniff(b, n, &d, &used), 0);
	ck_assert_int_eq(d, STORE_V1);
	ck_assert_uint_eq(used, 0);
	ck_assert_int_eq(store_proto_decode_req(d, &lim_default, b, n, &out, &used), 0);
	ck_assert_int_eq(out.op, STORE_OP_SET);
	assert_bytes_eq(out.key, "/k1", 3);
	assert_bytes_eq(out.val, "v1", 2);
	/* Almost the magic is still v1. */
	memcpy(b, "\x00\xce\xf7\x85\x3d", 5);
	ck_assert_int_eq(store_proto_sniff(b, 5, &d, &used), 0);
	ck_assert_int_eq(d, STORE_V1);
}
END_TEST

START_TEST(sniff_waits_on_a_partial_handshake)
{
	const uint8_t b[5] = { 0x00, 0xce, 0xf7, 0x85, 0x3c };
	enum store_dialect d = (enum store_dialect)0;
	size_t used = 77;

	for (size_t n = 0; n < 5; n++) {
		ck_assert_int_eq(store_proto_sniff(b, n, &d, &used), CRUN_EAGAIN);
		ck_assert_int_eq(d, 0);
		ck_assert_uint_eq(used, 77);
	}
	ck_assert_int_eq(store_proto_sniff(NULL, 0, &d, &used), CRUN_EAGAIN);
}
END_TEST

/* ---- replies ------------------------------------------------------------------ */

/* Decodes a reply, checks *used and that every strict prefix asks for more. */
static void decode_reply_ok(enum store_op op, uint64_t nitems, const uint8_t *b, size_t len,
			    struct store_reply *out)
{
	struct store_reply tmp;
	size_t used = 99;

	for (size_t n = 0; n < len; n++) {
		ck_assert_int_eq(store_proto_decode_reply(op, nitems, &lim_default, b, n, &tmp,
							  &used),
				 CRUN_EAGAIN);
		ck_assert_uint_eq(used, 99);
	}
	ck_assert_int_eq(store_proto_decode_reply(op, nitems, &lim_default, b, len, out, &used), 0);
	ck_assert_uint_eq(used, len);
}

START_TEST(replies_of_every_kind_decode)
{
	uint8_t b[256], *p;
	struct store_reply r;
	const uint8_t *it;

	memset(b, 0xee, sizeof(b));
	/* NONE: nothing to read, even from an empty buffer. */
	decode_reply_ok(STORE_OP_SET, 0, b, 0, &r);
	decode_reply_ok(STORE_OP_VALIDATE, 0, b, 0, &r);
	/* BYTES */
	p = store_put_bytes(b, "v2", 2);
	decode_reply_ok(STORE_OP_COMPARE_SET, 0, b, (size_t)(p - b), &r);
	assert_bytes_eq(r.val, "v2", 2);
	p = store_put_bytes(b, "", 0);
	decode_reply_ok(STORE_OP_GET, 0, b, (size_t)(p - b), &r);
	ck_assert_uint_eq(r.val.len, 0);
	/* I64 */
	p = store_put_u64(b, (uint64_t)-2);
	decode_reply_ok(STORE_OP_ADD, 0, b, (size_t)(p - b), &r);
	ck_assert_int_eq(r.num, -2);
	decode_reply_ok(STORE_OP_QUEUE_LEN, 0, b, 8, &r);
	/* U8 */
	b[0] = STORE_WATCH_REGISTERED;
	decode_reply_ok(STORE_OP_WATCH_KEY, 0, b, 1, &r);
	ck_assert_uint_eq(r.status, 3);
	b[0] = STORE_WAIT_CANCELED;
	decode_reply_ok(STORE_OP_CANCEL_WAIT, 0, b, 1, &r);
	ck_assert_uint_eq(r.status, 1);
	decode_reply_ok(STORE_OP_BARRIER, 0, b, 1, &r);
	/* U32 */
	p = store_put_u32(b, 12345);
	decode_reply_ok(STORE_OP_PING, 0, b, (size_t)(p - b), &r);
	ck_assert_uint_eq(r.u32, 12345);
	/* BYTES_N: as many vectors as the request had keys. */
	p = store_put_bytes(b, "a", 1);
	p = store_put_bytes(p, "", 0);
	p = store_put_bytes(p, "ccc", 3);
	decode_reply_ok(STORE_OP_MULTI_GET, 3, b, (size_t)(p - b), &r);
	ck_assert_uint_eq(r.nitems, 3);
	it = r.items;
	next_items_eq(&it, &(struct store_bytes)B("a"));
	next_items_eq(&it, &(struct store_bytes)B(""));
	next_items_eq(&it, &(struct store_bytes)B("ccc"));
	decode_reply_ok(STORE_OP_MULTI_GET, 0, b, 0, &r);
	ck_assert_uint_eq(r.nitems, 0);
	/* COUNT_STRINGS */
	p = store_put_u64(b, 2);
	p = store_put_bytes(p, "/x", 2);
	p = store_put_bytes(p, "init/", 5);
	decode_reply_ok(STORE_OP_LIST_KEYS, 0, b, (size_t)(p - b), &r);
	ck_assert_int_eq(r.num, 2);
	ck_assert_uint_eq(r.nitems, 2);
	it = r.items;
	next_items_eq(&it, &(struct store_bytes)B("/x"));
	next_items_eq(&it, &(struct store_bytes)B("init/"));
	/* COUNT_OPT: an item only when the queue was not empty. */
	p = store_put_u64(b, 0);
	decode_reply_ok(STORE_OP_QUEUE_POP, 0, b, (size_t)(p - b), &r);
	ck_assert_int_eq(r.num, 0);
	ck_assert_uint_eq(r.val.len, 0);
	p = store_put_u64(b, 2);
	p = store_put_bytes(p, "it", 2);
	decode_reply_ok(STORE_OP_QUEUE_POP, 0, b, (size_t)(p - b), &r);
	ck_assert_int_eq(r.num, 2);
	assert_bytes_eq(r.val, "it", 2);
}
END_TEST

START_TEST(replies_over_limits_or_malformed_are_rejected)
{
	uint8_t b[64];
	struct store_reply r;
	size_t used;

	/* A value length over the limit, seen before the bytes. */
	store_put_u64(b, 33);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_GET, 0, &lim_small, b, 8, &r, &used),
			 CRUN_ETOOBIG);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_QUEUE_POP, 0, &lim_small, b, 8, &r,
						  &used),
			 CRUN_EAGAIN); /* count 33, item length not here yet */
	store_put_u64(b + 8, 33);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_QUEUE_POP, 0, &lim_small, b, 16, &r,
						  &used),
			 CRUN_ETOOBIG);
	/* Too many strings, and a negative count. */
	store_put_u64(b, 5);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_LIST_KEYS, 0, &lim_small, b, 8, &r,
						  &used),
			 CRUN_ETOOBIG);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_MULTI_GET, 5, &lim_small, b, 8, &r,
						  &used),
			 CRUN_ETOOBIG);
	store_put_u64(b, (uint64_t)-1);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_LIST_KEYS, 0, &lim_small, b, 8, &r,
						  &used),
			 CRUN_EPROTO);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_QUEUE_POP, 0, &lim_small, b, 8, &r,
						  &used),
			 CRUN_EPROTO);
	/* A list key over the key limit. */
	store_put_u64(b, 1);
	store_put_u64(b + 8, 17);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_LIST_KEYS, 0, &lim_small, b, 16, &r,
						  &used),
			 CRUN_ETOOBIG);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP__MAX, 0, NULL, b, 16, &r, &used),
			 CRUN_EINVAL);
}
END_TEST

START_TEST(pipelined_replies_decode_in_order)
{
	/* §1.9 raw probe: two pipelined ADDs answered back to back. */
	uint8_t b[32];
	size_t n = unhex("01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00", b, sizeof(b)), used;
	struct store_reply r;

	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_ADD, 0, NULL, b, n, &r, &used), 0);
	ck_assert_int_eq(r.num, 1);
	ck_assert_int_eq(store_proto_decode_reply(STORE_OP_ADD, 0, NULL, b + used, n - used, &r,
						  &used),
			 0);
	ck_assert_int_eq(r.num, 2);
	ck_assert_uint_eq(used, 8);
}
END_TEST

/* ---- torch-compat §1.9 test vectors ------------------------------------------- */

struct hex_vec {
	const char *c2s;
	enum store_op op;
	struct store_bytes key, val, val2;
	int64_t num;
	uint64_t nitems;
	struct store_bytes k0, k1; /* the first keys of a list */
	const char *s2c;	   /* the reply, or NULL */
	int64_t rep_num;	   /* I64 replies; U8: the status */
	struct store_bytes rep_val;
};

static const struct hex_vec vecs[] = {
	{ "00 03 00 00 00 00 00 00 00 2f 6b 31 02 00 00 00 00 00 00 00 76 31", STORE_OP_SET,
	  B("/k1"), B("v1"), B(""), .num = 0 },
	{ "05 01 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 6b 31", STORE_OP_WAIT,
	  .nitems = 1, .k0 = B("/k1"), .s2c = "00", .rep_num = 0 },
	{ "02 03 00 00 00 00 00 00 00 2f 6b 31", STORE_OP_GET, B("/k1"),
	  .s2c = "02 00 00 00 00 00 00 00 76 31", .rep_val = B("v1") },
	{ "00 03 00 00 00 00 00 00 00 2f 6b 32 00 00 00 00 00 00 00 00", STORE_OP_SET, B("/k2"),
	  B(""), B(""), .num = 0 },
	{ "03 04 00 00 00 00 00 00 00 2f 63 6e 74 05 00 00 00 00 00 00 00", STORE_OP_ADD,
	  B("/cnt"), .num = 5, .s2c = "05 00 00 00 00 00 00 00", .rep_num = 5 },
	{ "03 04 00 00 00 00 00 00 00 2f 63 6e 74 fe ff ff ff ff ff ff ff", STORE_OP_ADD,
	  B("/cnt"), .num = -2, .s2c = "03 00 00 00 00 00 00 00", .rep_num = 3 },
	{ "02 04 00 00 00 00 00 00 00 2f 63 6e 74", STORE_OP_GET, B("/cnt"),
	  .s2c = "01 00 00 00 00 00 00 00 33", .rep_val = B("3") },
	{ "03 04 00 00 00 00 00 00 00 2f 62 69 67 00 00 00 00 00 01 00 00", STORE_OP_ADD,
	  B("/big"), .num = 1ll << 40, .s2c = "00 00 00 00 00 01 00 00", .rep_num = 1ll << 40 },
	{ "01 03 00 00 00 00 00 00 00 2f 6b 31 02 00 00 00 00 00 00 00 76 31 02 00 00 00 00 00 "
	  "00 00 76 32",
	  STORE_OP_COMPARE_SET, B("/k1"), B("v1"), B("v2"),
	  .s2c = "02 00 00 00 00 00 00 00 76 32", .rep_val = B("v2") },
	{ "01 03 00 00 00 00 00 00 00 2f 6b 31 05 00 00 00 00 00 00 00 77 72 6f 6e 67 02 00 00 "
	  "00 00 00 00 00 76 33",
	  STORE_OP_COMPARE_SET, B("/k1"), B("wrong"), B("v3"),
	  .s2c = "02 00 00 00 00 00 00 00 76 32", .rep_val = B("v2") },
	{ "01 08 00 00 00 00 00 00 00 2f 6d 69 73 73 69 6e 67 00 00 00 00 00 00 00 00 03 00 00 "
	  "00 00 00 00 00 6e 65 77",
	  STORE_OP_COMPARE_SET, B("/missing"), B(""), B("new"),
	  .s2c = "03 00 00 00 00 00 00 00 6e 65 77", .rep_val = B("new") },
	{ "01 09 00 00 00 00 00 00 00 2f 6d 69 73 73 69 6e 67 32 03 00 00 00 00 00 00 00 65 78 "
	  "70 01 00 00 00 00 00 00 00 78",
	  STORE_OP_COMPARE_SET, B("/missing2"), B("exp"), B("x"),
	  .s2c = "03 00 00 00 00 00 00 00 65 78 70", .rep_val = B("exp") },
	{ "05 02 00 00 00 00 00 00 00 03 00 00 00 00 00 00 00 2f 6b 31 04 00 00 00 00 00 00 00 "
	  "2f 63 6e 74",
	  STORE_OP_WAIT, .nitems = 2, .k0 = B("/k1"), .k1 = B("/cnt"), .s2c = "00" },
	{ "05 01 00 00 00 00 00 00 00 05 00 00 00 00 00 00 00 2f 6c 61 74 65", STORE_OP_WAIT,
	  .nitems = 1, .k0 = B("/late"), .s2c = "00" },
	{ "06", STORE_OP_GETNUMKEYS, .s2c = "05 00 00 00 00 00 00 00", .rep_num = 5 },
	{ "08 03 00 00 00 00 00 00 00 2f 6b 32", STORE_OP_DELETE_KEY, B("/k2"),
	  .s2c = "01 00 00 00 00 00 00 00", .rep_num = 1 },
	{ "08 03 00 00 00 00 00 00 00 2f 6b 32", STORE_OP_DELETE_KEY, B("/k2"),
	  .s2c = "00 00 00 00 00 00 00 00", .rep_num = 0 },
	{ "00 06 00 00 00 00 00 00 00 2f 70 66 78 2f 61 01 00 00 00 00 00 00 00 62", STORE_OP_SET,
	  B("/pfx/a"), B("b"), B(""), .num = 0 },
	{ "04 01 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 61", STORE_OP_CHECK, .nitems = 1,
	  .k0 = B("/a"), .s2c = "00", .rep_num = STORE_CHECK_READY },
	{ "04 02 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00 2f 61 03 00 00 00 00 00 00 00 2f "
	  "7a 7a",
	  STORE_OP_CHECK, .nitems = 2, .k0 = B("/a"), .k1 = B("/zz"), .s2c = "01",
	  .rep_num = STORE_CHECK_NOT_READY },
	{ "04 00 00 00 00 00 00 00 00", STORE_OP_CHECK, .nitems = 0, .s2c = "00" },
	{ "05 00 00 00 00 00 00 00 00", STORE_OP_WAIT, .nitems = 0, .s2c = "00" },
	{ "07 02 00 00 00 00 00 00 00 2f 61", STORE_OP_WATCH_KEY, B("/a"), .s2c = "03",
	  .rep_num = STORE_WATCH_REGISTERED },
	{ "03 05 00 00 00 00 00 00 00 69 6e 69 74 2f 01 00 00 00 00 00 00 00", STORE_OP_ADD,
	  B("init/"), .num = 1, .s2c = "01 00 00 00 00 00 00 00", .rep_num = 1 },
	/* c10d rendezvous: the first COMPARE_SET plants the null sentinel. */
	{ "01 16 00 00 00 00 00 00 00 2f 74 6f 72 63 68 2e 72 65 6e 64 65 7a 76 6f 75 73 2e 6a 6f "
	  "62 31 00 00 00 00 00 00 00 00 0c 00 00 00 00 00 00 00 59 32 46 75 61 57 31 68 5a 47 46 "
	  "74",
	  STORE_OP_COMPARE_SET, B("/torch.rendezvous.job1"), B(""), B("Y2FuaW1hZGFt"),
	  .s2c = "0c 00 00 00 00 00 00 00 59 32 46 75 61 57 31 68 5a 47 46 74",
	  .rep_val = B("Y2FuaW1hZGFt") },
};
#define NVECS (sizeof(vecs) / sizeof(vecs[0]))

static void check_vec_frame(enum store_dialect d, const struct hex_vec *v, const uint8_t *b,
			    size_t n)
{
	const struct store_bytes ks[2] = { v->k0, v->k1 };
	struct store_req out;
	struct store_bytes k;
	uint8_t again[256];
	size_t used, len;
	const uint8_t *it;

	ck_assert_int_eq(store_proto_decode_req(d, &lim_default, b, n, &out, &used), 0);
	ck_assert_uint_eq(used, n);
	ck_assert_int_eq(out.op, v->op);
	assert_bytes_eq(out.key, v->key.p, v->key.len);
	assert_bytes_eq(out.val, v->val.p, v->val.len);
	assert_bytes_eq(out.val2, v->val2.p, v->val2.len);
	ck_assert_int_eq(out.num, v->num);
	ck_assert_uint_eq(out.nitems, v->nitems);
	it = out.items;
	if (v->nitems > 0) {
		store_items_next(&it, &k);
		assert_bytes_eq(k, v->k0.p, v->k0.len);
	}
	if (v->nitems > 1) {
		store_items_next(&it, &k);
		assert_bytes_eq(k, v->k1.p, v->k1.len);
	}
	assert_decode_all(d, &lim_default, b, 0, n - 1, CRUN_EAGAIN);
	/* Re-encoding gives PyTorch's exact bytes. */
	out.keys = ks;
	ck_assert_int_eq(store_proto_encode_req(d, &out, again, sizeof(again), &len), 0);
	ck_assert_uint_eq(len, n);
	ck_assert_mem_eq(again, b, n);
}

START_TEST(reference_vectors_decode_to_the_right_ops)
{
	const struct hex_vec *v = &vecs[_i];
	uint8_t b[256], rb[64];
	size_t n = unhex(v->c2s, b, sizeof(b)), rn;
	struct store_reply r;
	int code;

	check_vec_frame(STORE_V1, v, b, n);
	/* The v2 form of the same request: only the opcode differs (§1.9). */
	code = store_proto_opcode(STORE_V2, v->op);
	if (code >= 0) {
		ck_assert_int_eq(code, b[0] == 8 ? 8 : b[0] + 1);
		b[0] = (uint8_t)code;
		check_vec_frame(STORE_V2, v, b, n);
	}
	if (!v->s2c)
		return;
	rn = unhex(v->s2c, rb, sizeof(rb));
	decode_reply_ok(v->op, v->nitems, rb, rn, &r);
	switch (store_proto_reply_kind(v->op)) {
	case STORE_REPLY_U8:
		ck_assert_int_eq(r.status, v->rep_num);
		break;
	case STORE_REPLY_I64:
		ck_assert_int_eq(r.num, v->rep_num);
		break;
	case STORE_REPLY_BYTES:
		assert_bytes_eq(r.val, v->rep_val.p, v->rep_val.len);
		break;
	default:
		ck_abort_msg("unexpected reply kind");
	}
}
END_TEST

/* ---- frames captured from real PyTorch 1.13 (capture_vectors_113.h) ------------- */

static void check_cap_frame(const struct cap_req *c, const struct store_req *out)
{
	const uint8_t *it = out->items;

	ck_assert_msg(out->op == (enum store_op)c->op, "%s conn %d: op %s, want %s", c->scenario,
		      c->conn, store_proto_op_name(out->op), store_proto_op_name(c->op));
	assert_bytes_eq(out->key, c->key.p, c->key.len);
	assert_bytes_eq(out->val, c->val.p, c->val.len);
	assert_bytes_eq(out->val2, c->val2.p, c->val2.len);
	ck_assert_int_eq(out->num, c->num);
	ck_assert_uint_eq(out->nitems, c->nkeys);
	for (size_t i = 0; i < c->nkeys; i++) {
		struct store_bytes k;

		store_items_next(&it, &k);
		assert_bytes_eq(k, c->keys[i].p, c->keys[i].len);
	}
}

START_TEST(captured_requests_decode_reencode_and_replies_match)
{
	const struct cap_req *c = &cap_reqs[_i];
	const uint8_t *f = (const uint8_t *)c->frame.p;
	struct store_bytes ks[64];
	struct store_req out;
	struct store_reply r;
	uint8_t again[4096];
	size_t used, len;

	ck_assert_int_eq(store_proto_decode_req(STORE_V1, &lim_default, f, c->frame.len, &out,
						&used),
			 0);
	ck_assert_uint_eq(used, c->frame.len);
	check_cap_frame(c, &out);
	assert_decode_all(STORE_V1, &lim_default, f, 0, c->frame.len - 1, CRUN_EAGAIN);

	ck_assert_uint_le(c->nkeys, 64);
	for (size_t i = 0; i < c->nkeys; i++)
		ks[i] = (struct store_bytes){ (const uint8_t *)c->keys[i].p, c->keys[i].len };
	out.keys = ks;
	ck_assert_int_eq(store_proto_encode_req(STORE_V1, &out, again, sizeof(again), &len), 0);
	ck_assert_uint_eq(len, c->frame.len);
	ck_assert_mem_eq(again, f, len);

	if (!c->has_reply)
		return;
	decode_reply_ok(out.op, out.nitems, (const uint8_t *)c->reply.p, c->reply.len, &r);
	switch (store_proto_reply_kind(out.op)) {
	case STORE_REPLY_U8:
		ck_assert_uint_eq(r.status, c->rep_status);
		break;
	case STORE_REPLY_I64:
		ck_assert_int_eq(r.num, c->rep_num);
		break;
	case STORE_REPLY_BYTES:
		assert_bytes_eq(r.val, c->rep_val.p, c->rep_val.len);
		break;
	default:
		ck_abort_msg("unexpected reply kind");
	}
}
END_TEST

/* Replays one captured connection segment by segment, as a server reads it:
 * sniff once, then decode every whole frame buffered so far. */
START_TEST(captured_streams_decode_segment_by_segment)
{
	const struct cap_conn *cc = &cap_conns[_i];
	static uint8_t buf[64 * 1024];
	size_t have = 0, pos = 0, next = cc->first_req, used;
	enum store_dialect d = (enum store_dialect)0;
	struct store_req out;
	int r;

	for (size_t s = 0; s < cc->nsegs; s++) {
		ck_assert_uint_le(have + cc->segs[s].len, sizeof(buf));
		memcpy(buf + have, cc->segs[s].p, cc->segs[s].len);
		have += cc->segs[s].len;
		if (!d) {
			r = store_proto_sniff(buf, have, &d, &used);
			if (r == CRUN_EAGAIN)
				continue;
			ck_assert_int_eq(r, 0);
			ck_assert_int_eq(d, STORE_V1); /* 1.13 never sends VALIDATE */
			ck_assert_uint_eq(used, 0);
		}
		while ((r = store_proto_decode_req(d, &lim_default, buf + pos, have - pos, &out,
						   &used)) == 0) {
			ck_assert_uint_lt(next, cc->first_req + cc->nreqs);
			ck_assert_uint_eq(used, cap_reqs[next].frame.len);
			ck_assert_mem_eq(buf + pos, cap_reqs[next].frame.p, used);
			check_cap_frame(&cap_reqs[next], &out);
			pos += used;
			next++;
		}
		ck_assert_int_eq(r, CRUN_EAGAIN);
	}
	ck_assert_uint_eq(pos, have);
	ck_assert_uint_eq(next, cc->first_req + cc->nreqs);
}
END_TEST

START_TEST(captures_cover_the_ops_1_13_sends)
{
	bool seen[STORE_OP__MAX] = { 0 };
	size_t replies = 0;

	for (size_t i = 0; i < CAP_NREQS; i++) {
		seen[cap_reqs[i].op] = true;
		replies += (size_t)cap_reqs[i].has_reply;
	}
	ck_assert(seen[STORE_OP_SET] && seen[STORE_OP_GET] && seen[STORE_OP_ADD]);
	ck_assert(seen[STORE_OP_COMPARE_SET] && seen[STORE_OP_WAIT]);
	ck_assert(seen[STORE_OP_GETNUMKEYS] && seen[STORE_OP_DELETE_KEY]);
	ck_assert_uint_ge(CAP_NREQS, 100);
	ck_assert_uint_ge(replies, 100);
}
END_TEST

static Suite *store_proto_suite(void)
{
	Suite *s = suite_create("store_proto");
	TCase *tc;

	tc = tcase_create("tables");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, opcode_tables_match_the_reference);
	tcase_add_test(tc, op_names_and_reply_kinds_match_the_reference);
	tcase_add_test(tc, integers_are_little_endian_on_the_wire);
	suite_add_tcase(s, tc);

	tc = tcase_create("requests");
	tcase_set_timeout(tc, 10);
	tcase_add_loop_test(tc, encode_then_decode_gives_the_same_fields, 0, 2 * NSAMPLES);
	tcase_add_loop_test(tc, decode_asks_for_more_on_every_strict_prefix, 0, 2 * NSAMPLES);
	tcase_add_loop_test(tc, encode_refuses_a_short_buffer, 0, 2 * NSAMPLES);
	tcase_add_loop_test(tc, pipelined_frames_decode_one_after_another, 0, 2);
	tcase_add_test(tc, encode_rejects_bad_arguments);
	tcase_add_test(tc, encode_refuses_sizes_that_would_wrap);
	suite_add_tcase(s, tc);

	tc = tcase_create("limits");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, decode_rejects_an_oversized_key_from_its_length_alone);
	tcase_add_test(tc, decode_rejects_an_oversized_value_from_its_length_alone);
	tcase_add_test(tc, decode_rejects_too_many_items_from_the_count_alone);
	tcase_add_test(tc, decode_rejects_an_oversized_item_inside_a_list);
	tcase_add_test(tc, decode_with_no_limits_waits_instead_of_overflowing);
	tcase_add_test(tc, decode_rejects_unknown_opcodes);
	tcase_add_test(tc, the_same_byte_means_different_ops_per_dialect);
	suite_add_tcase(s, tc);

	tc = tcase_create("sniff");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, sniff_decides_v1_on_any_nonzero_first_byte);
	tcase_add_test(tc, sniff_eats_validate_and_leaves_the_ping);
	tcase_add_test(tc, sniff_keeps_a_v1_set_that_starts_with_zero);
	tcase_add_test(tc, sniff_waits_on_a_partial_handshake);
	suite_add_tcase(s, tc);

	tc = tcase_create("replies");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, replies_of_every_kind_decode);
	tcase_add_test(tc, replies_over_limits_or_malformed_are_rejected);
	tcase_add_test(tc, pipelined_replies_decode_in_order);
	tcase_add_test(tc, resumable_decode_validates_each_list_string_once);
	suite_add_tcase(s, tc);

	tc = tcase_create("vectors");
	tcase_set_timeout(tc, 10);
	tcase_add_loop_test(tc, reference_vectors_decode_to_the_right_ops, 0, NVECS);
	suite_add_tcase(s, tc);

	tc = tcase_create("capture_113");
	tcase_set_timeout(tc, 20);
	tcase_add_loop_test(tc, captured_requests_decode_reencode_and_replies_match, 0, CAP_NREQS);
	tcase_add_loop_test(tc, captured_streams_decode_segment_by_segment, 0, CAP_NCONNS);
	tcase_add_test(tc, captures_cover_the_ops_1_13_sends);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(store_proto_suite)
