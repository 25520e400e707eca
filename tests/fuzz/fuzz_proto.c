/* fuzz_proto.c: libFuzzer target for the TCPStore wire codec (store/proto/proto.c).
 * Arbitrary bytes go through sniffing and pipelined request decoding in both
 * dialects and through the reply decoder of every op; every frame the decoder
 * accepts must re-encode to exactly the bytes it consumed, and every strict
 * prefix of it must ask for more; the same for crun's ERROR reply
 * (store_ext.h). Build: make fuzz; run:
 *   ./build-fuzz/fuzz_proto -max_total_time=30 tests/fuzz/seeds
 */
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "store/store_ext.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Small limits so the fuzzer reaches the over-limit paths, and large ones so
 * it reaches the accept paths; the first input byte picks. */
static const struct store_limits lim_small = { .max_key_bytes = 32,
					       .max_value_bytes = 64,
					       .max_items = 8 };
static const struct store_limits lim_big = STORE_LIMITS_DEFAULT;

#define MAX_ITEMS 4096

static struct store_bytes keys[MAX_ITEMS], vals[MAX_ITEMS];
static uint8_t out[1 << 20];

static void check_ok(int ok)
{
	if (!ok)
		abort();
}

/* decode -> encode must give the consumed bytes back (the encoding is
 * canonical: every field is fixed-width or length-prefixed). */
static void roundtrip(enum store_dialect d, const struct store_limits *lim,
		      const struct store_req *req, const uint8_t *frame, size_t used)
{
	struct store_req copy = *req;
	const uint8_t *it = req->items;
	size_t len = 0;
	int per = req->op == STORE_OP_MULTI_SET ? 2 : 1;

	if (req->nitems > MAX_ITEMS || used > sizeof(out))
		return;
	/* Everything accepted is within the limits. */
	check_ok(req->key.len <= lim->max_key_bytes && req->val.len <= lim->max_value_bytes &&
		 req->val2.len <= lim->max_value_bytes && req->nitems <= lim->max_items);
	for (uint64_t i = 0; req->items && i < req->nitems; i++) {
		store_items_next(&it, &keys[i]);
		check_ok(keys[i].len <= lim->max_key_bytes);
		if (per == 2) {
			store_items_next(&it, &vals[i]);
			check_ok(vals[i].len <= lim->max_value_bytes);
		}
	}
	if (req->items)
		check_ok(it == frame + used); /* the list ends where the frame does */
	copy.keys = keys;
	copy.vals = vals;
	check_ok(store_proto_req_size(d, &copy) == used);
	check_ok(store_proto_encode_req(d, &copy, out, sizeof(out), &len) == 0);
	check_ok(len == used && memcmp(out, frame, used) == 0);
	if (used > 0)
		check_ok(store_proto_encode_req(d, &copy, out, used - 1, &len) == CRUN_ENOSPC);
}

/* Pipelined decoding of a whole buffer, as a connection's read callback does. */
static void decode_stream(enum store_dialect d, const struct store_limits *lim,
			  const uint8_t *buf, size_t len)
{
	struct store_req req;
	size_t pos = 0, used = 0;
	int r;

	for (int n = 0; n < 4096; n++) {
		r = store_proto_decode_req(d, lim, buf + pos, len - pos, &req, &used);
		if (r < 0) {
			check_ok(r == CRUN_EAGAIN || r == CRUN_EPROTO || r == CRUN_ETOOBIG);
			return;
		}
		check_ok(used >= 1 && used <= len - pos);
		check_ok(store_proto_opcode(d, req.op) == buf[pos]);
		/* Only the first frame gets the costlier checks. */
		if (n == 0) {
			struct store_req tmp;
			size_t u2;

			roundtrip(d, lim, &req, buf + pos, used);
			if (used > 1)
				check_ok(store_proto_decode_req(d, lim, buf + pos, used - 1, &tmp,
								&u2) == CRUN_EAGAIN);
		}
		pos += used;
	}
}

static void decode_replies(const struct store_limits *lim, const uint8_t *buf, size_t len)
{
	struct store_reply rep;
	const uint8_t *it;
	struct store_bytes s;
	size_t used;
	uint64_t nitems = len ? buf[0] % 16 : 0;
	int r;

	for (int op = 0; op < STORE_OP__MAX; op++) {
		r = store_proto_decode_reply((enum store_op)op, nitems, lim, buf, len, &rep, &used);
		if (r < 0) {
			check_ok(r == CRUN_EAGAIN || r == CRUN_EPROTO || r == CRUN_ETOOBIG);
			continue;
		}
		check_ok(used <= len);
		it = rep.items;
		for (uint64_t i = 0; it && i < rep.nitems; i++) {
			store_items_next(&it, &s);
			check_ok(s.p + s.len <= buf + used);
		}
		if (rep.val.len)
			check_ok(rep.val.p + rep.val.len <= buf + used);
	}
}

/* The ERROR reply (store_ext.h, version 6): what it accepts re-encodes to
 * the bytes it consumed, and every strict prefix of that asks for more. */
static void decode_error(const uint8_t *data, size_t size)
{
	const char *text;
	size_t n, used, len;

	if (!size || store_ext_error_decode(data, size, &text, &n, &used) != 0)
		return;
	check_ok(n <= STORE_EXT_ERROR_TEXT_MAX && used == STORE_EXT_ERROR_HEAD + n);
	check_ok(store_ext_error_encode(text, n, out, sizeof(out), &len) == 0 && len == used &&
		 memcmp(out, data, used) == 0);
	for (size_t i = 1; i < used; i++)
		check_ok(store_ext_error_decode(data, i, &text, &n, &len) == CRUN_EAGAIN);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct store_limits *lim;
	enum store_dialect d;
	size_t consumed;
	int r;

	if (size < 1)
		return 0;
	lim = (data[0] & 1) ? &lim_small : &lim_big;
	data++;
	size--;

	r = store_proto_sniff(data, size, &d, &consumed);
	if (r == 0) {
		check_ok(consumed == 0 || (consumed == 5 && d == STORE_V2));
		decode_stream(d, lim, data + consumed, size - consumed);
	} else {
		check_ok(r == CRUN_EAGAIN && size < 5);
	}
	decode_stream(STORE_V1, lim, data, size);
	decode_stream(STORE_V2, lim, data, size);
	decode_replies(lim, data, size);
	decode_error(data, size);
	return 0;
}
