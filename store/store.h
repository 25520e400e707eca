/* store.h: the store module's interface inside crun: the pure TCPStore wire
 * codec (proto/proto.c) that the blocking public client (include/crun/store.h,
 * client/) and the server are built on. The server's API is store/server.h:
 * include that only where a store server is started (check-layers.sh).
 *
 * Wire facts come from ../shared/reference/torch-compat.md §1: two opcode
 * numberings ("dialects"), no framing header, little-endian integers, a u64
 * length before every key and value.
 */
#ifndef CRUN_STORE_STORE_H
#define CRUN_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crun/crun.h"
#include "crun/store.h"

/* ---- dialects and operations -------------------------------------------- */

/* v1: torch 1.13 / 2.0 numbering; v2: torch 2.1+ (VALIDATE first). The values
 * match crun_store_dialect_t in the public header. */
enum store_dialect {
	STORE_V1 = 1,
	STORE_V2 = 2,
};

/* Logical operations, independent of the numbering on the wire. */
enum store_op {
	STORE_OP_VALIDATE,
	STORE_OP_SET,
	STORE_OP_COMPARE_SET,
	STORE_OP_GET,
	STORE_OP_ADD,
	STORE_OP_CHECK,
	STORE_OP_WAIT,
	STORE_OP_GETNUMKEYS,
	STORE_OP_WATCH_KEY, /* v1 only */
	STORE_OP_DELETE_KEY,
	STORE_OP_APPEND, /* v2 from here on */
	STORE_OP_MULTI_GET,
	STORE_OP_MULTI_SET,
	STORE_OP_CANCEL_WAIT,
	STORE_OP_PING,
	STORE_OP_QUEUE_PUSH,
	STORE_OP_QUEUE_POP,
	STORE_OP_QUEUE_LEN,
	STORE_OP_LIST_KEYS,
	STORE_OP_BARRIER,
	STORE_OP__MAX,
};

#define STORE_VALIDATE_MAGIC 0x3C85F7CEu

/* Reply status bytes (§1.2). */
enum {
	STORE_CHECK_READY = 0,
	STORE_CHECK_NOT_READY = 1,
	STORE_WAIT_STOP_WAITING = 0,
	STORE_WAIT_CANCELED = 1,
	STORE_WATCH_UPDATED = 0,
	STORE_WATCH_CREATED = 1,
	STORE_WATCH_DELETED = 2,
	STORE_WATCH_REGISTERED = 3,
};

/* Opcode byte of `op` in dialect `d`, or -1 when the dialect lacks it. */
int store_proto_opcode(enum store_dialect d, enum store_op op);
/* Inverse: the logical op of an opcode byte, or -1 when unknown in `d`. */
int store_proto_op_from_code(enum store_dialect d, uint8_t code);
/* "SET", "COMPARE_SET", ...; static text. */
const char *store_proto_op_name(enum store_op op);

/* Which keys an op reaches: those its request names, or every key - as a
 * count (GETNUMKEYS) or as a list a server can filter (LIST_KEYS). A server
 * that limits a client to some keys (store/auth.h's job scopes) goes by this. */
enum store_op_reach {
	STORE_REACH_ARGS,
	STORE_REACH_ALL,
	STORE_REACH_ALL_FILTERED,
};
enum store_op_reach store_proto_op_reach(enum store_op op);

/* ---- requests ----------------------------------------------------------- */

/* A byte string on the wire; `p` is borrowed (points into the caller's or the
 * decoder's input buffer). */
struct store_bytes {
	const uint8_t *p;
	size_t len;
};

/* One request. Which fields count depends on op:
 *   key         SET GET ADD WATCH_KEY DELETE_KEY APPEND COMPARE_SET
 *               QUEUE_PUSH QUEUE_POP QUEUE_LEN BARRIER
 *   val         SET APPEND QUEUE_PUSH; COMPARE_SET: expected
 *   val2        COMPARE_SET: desired
 *   num         ADD: delta; BARRIER: world size
 *   u32         VALIDATE: magic; PING: nonce
 *   nitems      CHECK WAIT MULTI_GET: key count; MULTI_SET: pair count
 * For encoding, lists come from keys[] (and vals[] for MULTI_SET). For
 * decoding, the decoder validates the whole list and points `items` at its
 * first element; walk it with store_items_next(). */
struct store_req {
	enum store_op op;
	struct store_bytes key;
	struct store_bytes val;
	struct store_bytes val2;
	int64_t num;
	uint32_t u32;
	uint64_t nitems;
	const struct store_bytes *keys; /* encode only, borrowed */
	const struct store_bytes *vals; /* encode only, borrowed */
	const uint8_t *items;		/* decode only, into the input */
};

/* Per-request ceilings; a frame over any of them is rejected with
 * CRUN_ETOOBIG as soon as its length field is seen, before its bytes arrive. */
struct store_limits {
	size_t max_key_bytes; /* defaults: STORE_LIMITS_DEFAULT */
	size_t max_value_bytes;
	uint64_t max_items; /* keys per CHECK/WAIT/MULTI_*, pairs per MULTI_SET */
};

/* At least PyTorch's libuv limits (torch-compat §1.4): keys per request equal
 * them (131072) so a hostile CHECK/WAIT list stays bounded. */
#define STORE_LIMITS_DEFAULT                                                      \
	{                                                                         \
		.max_key_bytes = 64 * 1024, .max_value_bytes = 64u * 1024 * 1024, \
		.max_items = 1u << 17                                             \
	}

/* Decodes one request from buf[0..len). Returns 0 with *out and *used (bytes
 * consumed) set; CRUN_EAGAIN when buf holds only a strict prefix of a frame;
 * CRUN_EPROTO for an opcode unknown in the dialect; CRUN_ETOOBIG when a length
 * or count exceeds `lim`. Pure: no I/O, no allocation. */
int store_proto_decode_req(enum store_dialect d, const struct store_limits *lim, const uint8_t *buf,
			   size_t len, struct store_req *out, size_t *used);

/* What decoding learnt about a partial frame, so that the next call on the
 * same, longer prefix resumes where the last one stopped: a key list trickled
 * in small pieces would otherwise be re-validated from its start on every read
 * (O(n^2) CPU for one connection). Zero it before a frame's first call; it
 * only means something while the bytes before st->pos stay unchanged. */
struct store_dec_state {
	size_t pos;    /* 0, or where the next unvalidated list string starts */
	uint64_t done; /* list strings validated before pos (a pair counts 2) */
};

/* store_proto_decode_req with resumable state (st updated on CRUN_EAGAIN,
 * left alone otherwise: reset it once the frame is consumed). */
int store_proto_decode_req_from(enum store_dialect d, const struct store_limits *lim,
				struct store_dec_state *st, const uint8_t *buf, size_t len,
				struct store_req *out, size_t *used);

/* Iterates an `items` list from a decoded request: *it starts at req->items.
 * Each call yields the next string. Only valid on lists the decoder accepted. */
void store_items_next(const uint8_t **it, struct store_bytes *ret_item);

/* Calls fn(arg, key, len) for every key a decoded request names (its op's
 * request layout in the table of proto/proto.c); stops at and returns the first
 * nonzero return of fn, else 0. Pure. */
int store_proto_req_each_key(const struct store_req *q,
			     int (*fn)(void *arg, const uint8_t *key, size_t len), void *arg);

/* Encoded size of `req` in dialect `d`, or 0 if the dialect lacks the op. */
size_t store_proto_req_size(enum store_dialect d, const struct store_req *req);
/* Encodes `req` into buf (cap bytes). Returns 0 and *ret_len, CRUN_ENOSPC when
 * cap is too small, CRUN_EDIALECT when the dialect lacks the op. */
int store_proto_encode_req(enum store_dialect d, const struct store_req *req, uint8_t *buf,
			   size_t cap, size_t *ret_len);

/* Dialect sniffing per connection (§1.8). Returns CRUN_EAGAIN when more bytes
 * are needed (first byte 0x00 and fewer than 5 bytes), else 0 with *ret_d and
 * *ret_consumed (5 when a VALIDATE frame was recognised and eaten, else 0). */
int store_proto_sniff(const uint8_t *buf, size_t len, enum store_dialect *ret_d,
		      size_t *ret_consumed);

/* ---- replies -------------------------------------------------------------- */

enum store_reply_kind {
	STORE_REPLY_NONE,	   /* SET APPEND MULTI_SET QUEUE_PUSH VALIDATE */
	STORE_REPLY_BYTES,	   /* GET COMPARE_SET */
	STORE_REPLY_I64,	   /* ADD GETNUMKEYS DELETE_KEY QUEUE_LEN */
	STORE_REPLY_U8,		   /* CHECK WAIT WATCH_KEY CANCEL_WAIT BARRIER */
	STORE_REPLY_U32,	   /* PING */
	STORE_REPLY_BYTES_N,	   /* MULTI_GET: nitems byte vectors */
	STORE_REPLY_COUNT_STRINGS, /* LIST_KEYS: i64 n, then n strings */
	STORE_REPLY_COUNT_OPT,	   /* QUEUE_POP: i64 n, then one vector if n > 0 */
};

enum store_reply_kind store_proto_reply_kind(enum store_op op);

/* A decoded reply; byte fields point into the decoder's input. */
struct store_reply {
	uint8_t status;		/* U8 */
	int64_t num;		/* I64, and the count of COUNT_* */
	uint32_t u32;		/* U32 */
	struct store_bytes val; /* BYTES, and the item of COUNT_OPT */
	uint64_t nitems;	/* BYTES_N and COUNT_STRINGS: list length */
	const uint8_t *items;	/* walk with store_items_next() */
};

/* Decodes the reply to `op` (for BYTES_N, `nitems` is the request's count).
 * Same return contract as store_proto_decode_req. */
int store_proto_decode_reply(enum store_op op, uint64_t nitems, const struct store_limits *lim,
			     const uint8_t *buf, size_t len, struct store_reply *out, size_t *used);

/* Little-endian writers for building replies; return p advanced. */
uint8_t *store_put_u64(uint8_t *p, uint64_t v);
uint8_t *store_put_u32(uint8_t *p, uint32_t v);
uint8_t *store_put_bytes(uint8_t *p, const void *b, size_t len); /* u64 len + bytes */
uint64_t store_get_u64(const uint8_t *p);
uint32_t store_get_u32(const uint8_t *p);

#endif /* CRUN_STORE_STORE_H */
