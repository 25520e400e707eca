/* store_ext.h: crun's extensions to the TCPStore protocol - leases, keys
 * attached to a lease, and "on expiry, set key K" - for the elastic
 * rendezvous (DESIGN.md "Rendezvous: O(N) per round, O(1) per failure").
 *
 * Op codes are 0x80 and up, outside both PyTorch dialects (v1 uses 0..~12,
 * v2 0..~20). The server decodes them only on a connection that opted in
 * with HELLO (sent after the usual VALIDATE/PING handshake); on any other
 * connection a byte >= 0x80 is an unknown op code, exactly as before, so
 * PyTorch clients never see them. Little-endian integers; `bytes` is a u64
 * length then the bytes, as everywhere in TCPStore.
 *
 *   op    name             request after the op byte             reply
 *   0x80  HELLO            u32 magic 0x4352554e, u32 version     u32 version
 *   0x81  LEASE_GRANT      u64 ttl_ms, bytes expiry_key,          u64 lease id (> 0)
 *                          bytes expiry_value
 *   0x82  LEASE_KEEPALIVE  u64 lease id                          u8 status
 *   0x83  LEASE_REVOKE     u64 lease id                          u8 status
 *   0x84  SET_LEASED       u64 lease id, bytes key, bytes value  u8 status
 *   0x85  LEASE_ATTACH     u64 lease id                          u8 status  (version 2)
 *   0x86  WAIT_ANY         u64 n, n x bytes key                  later: u8 0, u64 index
 *                                                                (version 3)
 *   0x87  TRY_GET          bytes key                             u8 found, bytes value
 *   0x88  WAIT_ANY_GET     u64 lease id, u64 timeout_ms,         later: u8 0, u64 index,
 *                          u64 n, n x bytes key                  bytes value
 *   0x89  TICKET           bytes counter, bytes prefix,          i64 ticket
 *                          bytes value
 *   0x8a  GRANT_SET        u64 ttl_ms, bytes expiry_key,         u64 lease id (> 0)
 *                          bytes expiry_value, bytes key,
 *                          bytes value                           (0x87..0x8a: version 4)
 *   0x8b  WAIT_ANY_GET_WITH  WAIT_ANY_GET's request, then       later: WAIT_ANY_GET's
 *                          bytes with_key                        reply, then u8 found,
 *                                                                bytes with_value
 *   0x90  MUX              (nothing)                             none; framed from here
 *   0x91  WAIT_TAG         u64 tag, u64 n, n x bytes key         later: frame WAKE tag
 *   0x92  WAIT_TAG_CANCEL  u64 tag                               none   (0x8b, 0x90..0x92:
 *                                                                version 5)
 *   (reply) ERROR          -                                     8 bytes "\xee" "CRUNERR",
 *                                                                u32 n, n bytes of text
 *                                                                (version 6)
 *
 * status: 0 ok, 1 no such lease (ended, or held by another connection).
 * HELLO answers the server's version; a client sends LEASE_ATTACH only to a
 * server that answered 2 or more (a version-1 server closes on it), WAIT_ANY
 * only to one that answered 3 or more, the version-4 ops only to one that
 * answered 4 or more (the client falls back to the older sequence of ops).
 *
 * Version 4 folds the round trips of a rendezvous member into fewer
 * requests (each is what two older requests did, done in one step):
 *   - TRY_GET: CHECK then GET of a key that may be absent. found 0: absent
 *     (value empty);
 *   - WAIT_ANY_GET: WAIT_ANY whose wake carries the value of the key that
 *     exists (what a GET of it would read then; empty for a queue). Two
 *     more fields fold the waiter's LEASE_KEEPALIVE and its CANCEL_WAIT
 *     into it: a lease id other than 0, if this connection holds it, is
 *     kept alive as by LEASE_KEEPALIVE when the request arrives (else
 *     nothing: the holder learns it at its next keep-alive); a timeout_ms
 *     other than 0 ends the wait from the server when no key appeared by
 *     then (at most an hour), with index n and an empty value. So a member
 *     asleep in a round sends one request per heartbeat instead of three
 *     (the cancel of its wait, the keep-alive, the wait again). CANCEL_WAIT
 *     works as for WAIT_ANY;
 *   - TICKET: ADD 1 to counter, then SET prefix + the new count in decimal
 *     to value (a joiner's ticket and its record);
 *   - GRANT_SET: LEASE_GRANT, then SET_LEASED of key under the new lease
 *     (a lease never lapses between its grant and its first key).
 *
 * Version 5 lets one connection carry many waits without parking (the
 * node-local store proxy, proxy/proxy.c, needs then one upstream connection):
 *   - MUX (only on a v2 connection with no wait pending, once) switches the
 *     server's side of the connection to frames: every reply in request
 *     order goes out as STORE_EXT_FRAME_REPLY (u8 0) then the reply, and a
 *     completed tagged wait as STORE_EXT_FRAME_WAKE (u8 1) then its u64 tag,
 *     between two replies, never inside one. Ops that would park the
 *     connection (WAIT, BARRIER, WAIT_ANY, WAIT_ANY_GET(_WITH)) close a muxed one:
 *     its waits are tagged;
 *   - WAIT_TAG (muxed only) is a WAIT for every key of the list, with no
 *     reply in order: when all exist (at once if they do) the WAKE frame
 *     with its tag goes out. A tag pending already on the connection, or
 *     more than STORE_EXT_MUX_MAX_WAITS pending, closes it; the keys count
 *     against the connection's registrations like a WAIT's;
 *   - WAIT_TAG_CANCEL drops the tag's registrations, if it is still
 *     pending; no reply. A WAKE of that tag may already be on its way: the
 *     client ignores a WAKE of a tag it canceled (it never reuses a tag).
 * A client sends MUX only to a server that answered 5 or more to HELLO, and
 * reads frames from the next byte after that answer on.
 *
 * Version 5 also adds WAIT_ANY_GET_WITH (0x8b): a WAIT_ANY_GET whose answer
 * (the wake, or the server's timeout) also carries one more key's value as
 * a TRY_GET of with_key would read it then (found 0: absent, value empty).
 * A rendezvous member sleeps on its round's closed key and gets, with the
 * wake, its own assignment (written before the closed key): one request
 * fewer per member at the end of every round, when all of them wake at once.
 *
 * Version 6 adds the ERROR reply (issue 26): a server refuses a write
 * because a budget, or the job's or the connection's share of one, is full
 * ("store full: job 'J' used 64 MiB of its 64 MiB key_bytes", at most
 * STORE_EXT_ERROR_TEXT_MAX bytes). To a client whose HELLO named version 6
 * or more, on a connection that is not muxed, it sends ERROR where the
 * refused request's reply would be (after a request without a reply, SET:
 * where the next reply would be), then closes; a PyTorch client, or an
 * older crun, is closed without it, as before. No reply of any op can be
 * taken for it: a one-byte status or wait reply is never 0xee, and an
 * eight-byte count or length is never the magic's value (above any limit).
 * The client fails the call with CRUN_ENOSPC and the text as last_error,
 * and does not send it again.
 *
 * WAIT_ANY is WAIT with "any" for "all": the reply (STOP_WAITING, then the
 * index in the request of a key that exists) goes out as soon as one of the
 * keys exists - at once if one does already, lowest index first. It parks
 * the connection and is canceled exactly like a v2 WAIT: CANCEL_WAIT
 * answers WAIT_CANCELED, possibly after a reply that raced it. One request
 * lets a rendezvous member sleep until whichever of its round's events comes
 * first, instead of polling each.
 *
 * Semantics. A lease ends when ttl_ms pass after its last sign of life
 * (the grant, a keep-alive or an attach), or when its holder closes its
 * connection in order (below). Then every key set through SET_LEASED
 * under it is deleted, and, if expiry_key is not empty and does not exist
 * yet (the first reason wins), expiry_key is SET to expiry_value - waking
 * every WAIT on it, which is how one failure reaches every agent at O(1)
 * cost. LEASE_REVOKE ends a lease cleanly: its keys are deleted but the
 * expiry key is not set.
 *
 * Ownership and reconnects (version 2). A lease is held by one connection at
 * a time: only its holder may keep it alive, revoke it or set keys under it.
 * How the holder's connection ends decides what happens to its leases:
 *   - an orderly close by the peer (FIN: the client closed its handle, or
 *     its process exited or was killed, and its kernel closed the socket):
 *     its leases end at once, as an expiry (expiry key set). A dead agent is
 *     noticed in a round trip, not a TTL;
 *   - anything else (a reset from the network, the client aborting a stream
 *     it gave up on - crun's client closes those with RST - a read error, the
 *     server dropping the connection): its leases stay, held by nobody,
 *     until their TTL runs out from their last sign of life. A client that
 *     reconnects sends LEASE_ATTACH with the id (which also counts as a
 *     keep-alive) and nothing has failed.
 * LEASE_ATTACH takes the lease from whatever connection holds it (the client
 * may know its old connection is dead before the server does). A lease whose
 * TTL lapsed stays dead: attaching it answers "no such lease". A process that
 * leaves cleanly LEASE_REVOKEs first, or its expiry key is set as it closes.
 * Ids are random 64-bit numbers, so an id from before a server restart is
 * not found after it.
 *
 * Stalls. If the server's own loop was stalled (the process was SIGSTOPped,
 * or one loop iteration ran long), its clients' keep-alives could not be
 * read: a tick measures the loop's lag (CLOCK_MONOTONIC, the clock of the
 * loop's timers) and every lease's deadline is moved later by it, so a
 * stalled server does not evict the healthy clients it could not hear. (A
 * suspended host needs no measuring: CLOCK_MONOTONIC, and so every lease
 * timer, stands still while it sleeps.)
 *
 * Keys are given as on the wire (already mangled with "/" and prefixes).
 * ttl_ms is 1 ms .. 1 hour.
 */
#ifndef CRUN_STORE_STORE_EXT_H
#define CRUN_STORE_STORE_EXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#define STORE_EXT_VERSION_ATTACH 2u /* first version with LEASE_ATTACH */
#define STORE_EXT_VERSION_ANY	 3u /* first version with WAIT_ANY */
#define STORE_EXT_VERSION_FOLD	 4u /* first with TRY_GET WAIT_ANY_GET TICKET GRANT_SET */
#define STORE_EXT_VERSION_MUX	 5u /* first with MUX WAIT_TAG WAIT_TAG_CANCEL */
#define STORE_EXT_VERSION_WITH	 5u /* first with WAIT_ANY_GET_WITH */
#define STORE_EXT_VERSION_ERROR	 6u /* first whose clients take ERROR replies */

/* Which fields of a request (struct store_ext_req below) name keys. The
 * server checks each of them against a job-scoped client's run id
 * (server/server_auth.c), so every row must say what its op's keys are. */
enum store_ext_keys {
	STORE_EXT_K_KEY = 1u << 0,    /* key */
	STORE_EXT_K_EXPIRY = 1u << 1, /* key, the expiry key: empty means none */
	STORE_EXT_K_KEY2 = 1u << 2,   /* key2 (TICKET: a prefix of the key it sets) */
	STORE_EXT_K_LIST = 1u << 3,   /* every key of the list */
};

/* The one table of extension ops: X(NAME, code, version that introduced it,
 * reply size (store_ext_reply_size), keys (enum store_ext_keys)). */
#define STORE_EXT_OPS(X)                                                                     \
	X(HELLO, 0x80, 1, 4, 0)                                                              \
	X(LEASE_GRANT, 0x81, 1, 8, STORE_EXT_K_EXPIRY)                                       \
	X(LEASE_KEEPALIVE, 0x82, 1, 1, 0)                                                    \
	X(LEASE_REVOKE, 0x83, 1, 1, 0)                                                       \
	X(SET_LEASED, 0x84, 1, 1, STORE_EXT_K_KEY)                                           \
	X(LEASE_ATTACH, 0x85, STORE_EXT_VERSION_ATTACH, 1, 0)                                \
	X(WAIT_ANY, 0x86, STORE_EXT_VERSION_ANY, 9, STORE_EXT_K_LIST)                        \
	X(TRY_GET, 0x87, STORE_EXT_VERSION_FOLD, 9, STORE_EXT_K_KEY)                         \
	X(WAIT_ANY_GET, 0x88, STORE_EXT_VERSION_FOLD, 17, STORE_EXT_K_LIST)                  \
	X(TICKET, 0x89, STORE_EXT_VERSION_FOLD, 8, STORE_EXT_K_KEY | STORE_EXT_K_KEY2)       \
	X(GRANT_SET, 0x8a, STORE_EXT_VERSION_FOLD, 8, STORE_EXT_K_EXPIRY | STORE_EXT_K_KEY2) \
	X(WAIT_ANY_GET_WITH, 0x8b, STORE_EXT_VERSION_WITH, 17,                               \
	  STORE_EXT_K_LIST | STORE_EXT_K_KEY2)                                               \
	X(MUX, 0x90, STORE_EXT_VERSION_MUX, 0, 0)                                            \
	X(WAIT_TAG, 0x91, STORE_EXT_VERSION_MUX, 0, STORE_EXT_K_LIST)                        \
	X(WAIT_TAG_CANCEL, 0x92, STORE_EXT_VERSION_MUX, 0, 0)

enum store_ext_op {
#define STORE_EXT_X_(name, code, version, reply, keys) STORE_EXT_##name = code,
	STORE_EXT_OPS(STORE_EXT_X_)
#undef STORE_EXT_X_
};

/* Frame kinds on a muxed connection (server to client). */
enum { STORE_EXT_FRAME_REPLY = 0, STORE_EXT_FRAME_WAKE = 1 };
#define STORE_EXT_FRAME_WAKE_LEN 9u /* kind, u64 tag */
/* Tagged waits pending on one muxed connection (a proxy has at most one per
 * distinct key list of its clients). */
#define STORE_EXT_MUX_MAX_WAITS 4096u

#define STORE_EXT_MAGIC	  0x4352554eu
#define STORE_EXT_VERSION 6u
#define STORE_EXT_TTL_MAX (3600u * 1000)

enum { STORE_EXT_OK = 0, STORE_EXT_NO_LEASE = 1 };

struct store_ext_req {
	uint8_t op;
	uint32_t magic, version;	/* HELLO */
	uint64_t id;			/* KEEPALIVE REVOKE SET_LEASED ATTACH WAIT_ANY_GET(_WITH);
					 * WAIT_TAG(_CANCEL): the tag */
	uint64_t wait_ms;		/* WAIT_ANY_GET(_WITH): the server's timeout, 0: none */
	uint64_t ttl_ms;		/* GRANT GRANT_SET */
	struct store_bytes key;		/* GRANT(_SET): expiry key; SET_LEASED TRY_GET: key;
					 * TICKET: counter */
	struct store_bytes val;		/* GRANT(_SET): expiry value; SET_LEASED TICKET: value */
	struct store_bytes key2, val2;	/* GRANT_SET: key, value; TICKET: prefix (key2);
					 * WAIT_ANY_GET_WITH: with_key (key2) */
	uint64_t nitems;		/* WAIT_ANY(_GET) WAIT_TAG: key count */
	const struct store_bytes *keys; /* WAIT_ANY(_GET) WAIT_TAG, encode only, borrowed */
	const uint8_t *items;		/* ... decode only: store_items_next() */
};

/* True for an op code of the extension range. */
bool store_ext_is_op(uint8_t code);
/* "LEASE_GRANT"...; static text. */
const char *store_ext_op_name(uint8_t code);
/* Same contract as store_proto_decode_req (pure; CRUN_EAGAIN on a prefix,
 * CRUN_EPROTO for an unknown op, CRUN_ETOOBIG over a limit). */
int store_ext_decode_req(const struct store_limits *lim, const uint8_t *buf, size_t len,
			 struct store_ext_req *out, size_t *used);
size_t store_ext_req_size(const struct store_ext_req *req);
int store_ext_encode_req(const struct store_ext_req *req, uint8_t *buf, size_t cap,
			 size_t *ret_len);
/* The header of a frame on a muxed connection (MUX above): *ret_kind, and
 * for a WAKE its tag; *used is 1 (REPLY: the reply follows) or 9. CRUN_EAGAIN
 * on a prefix, CRUN_EPROTO for an unknown kind. Pure. */
int store_ext_frame_decode(const uint8_t *buf, size_t len, uint8_t *ret_kind, uint64_t *ret_tag,
			   size_t *used);
/* The ERROR reply (version 6, above): its magic and the longest text. */
#define STORE_EXT_ERROR_MAGIC \
	"\xee"                \
	"CRUNERR"
#define STORE_EXT_ERROR_HEAD	 12u /* the magic, u32 length */
#define STORE_EXT_ERROR_TEXT_MAX 512u
/* Writes ERROR with text (len bytes, at most STORE_EXT_ERROR_TEXT_MAX; longer
 * is cut) into buf: 0 with *ret_len, or CRUN_ENOSPC when cap is too small. */
int store_ext_error_encode(const char *text, size_t len, uint8_t *buf, size_t cap, size_t *ret_len);
/* Whether buf starts an ERROR reply: 0 with the text (pointing into buf) and
 * *used, CRUN_EAGAIN on a prefix of one (buf[0] is 0xee and what is there
 * matches), CRUN_EPROTO for anything else (a reply, or a text over
 * STORE_EXT_ERROR_TEXT_MAX). Pure. */
int store_ext_error_decode(const uint8_t *buf, size_t len, const char **ret_text,
			   size_t *ret_text_len, size_t *used);
/* Writes a WAKE frame of tag to buf[0..STORE_EXT_FRAME_WAKE_LEN). */
void store_ext_frame_wake(uint8_t *buf, uint64_t tag);
/* Size of the reply to op (4, 8, 9 or 1), 0 for an op without a reply in
 * order (MUX, WAIT_TAG, WAIT_TAG_CANCEL) or an unknown one; for TRY_GET
 * and WAIT_ANY_GET the part before the value's bytes (its u64 length last). */
size_t store_ext_reply_size(uint8_t op);
/* The extension version that introduced op (1 .. STORE_EXT_VERSION). */
uint32_t store_ext_op_version(uint8_t op);
/* Calls fn(arg, key, len) for every key a decoded request names, as its
 * op's row of STORE_EXT_OPS says; stops at and returns the first nonzero
 * return of fn, else 0. Pure. */
int store_ext_req_each_key(const struct store_ext_req *q,
			   int (*fn)(void *arg, const uint8_t *key, size_t len), void *arg);

/* ---- server side (server/lease.c) ---- */

struct store_server;
struct store_conn;

/* Runs one extension request from c's input (buf[0] is an extension op
 * code). Returns 0 with *used, CRUN_EAGAIN for a partial frame, or a negative
 * code after which the caller closes c (also: an extension op before HELLO). */
int store_ext_process(struct store_conn *c, const uint8_t *buf, size_t len, size_t *used);
/* c is closing: its leases stay, held by nobody, for the rest of their TTL
 * (a client may re-attach them from a new connection). */
void store_ext_conn_closed(struct store_conn *c);
/* WAIT_ANY and WAIT_ANY_GET on c (server/waits.c). */
int store_conn_wait_any(struct store_conn *c, const struct store_ext_req *q);
/* MUX, WAIT_TAG and WAIT_TAG_CANCEL on c (server/waits.c). */
int store_conn_mux_op(struct store_conn *c, const struct store_ext_req *q);
/* Before an op runs on a muxed connection: refuses one that would park it,
 * marks the reply frame of one that has a reply in order, and holds c's own
 * WAKE frames until store_conn_mux_end (an op may wake before it replies:
 * TICKET). has_reply: whether the op answers in order. */
int store_conn_mux_begin(struct store_conn *c, bool parks, bool has_reply);
void store_conn_mux_end(struct store_conn *c);
/* TRY_GET and TICKET on c (server/server_ops.c). */
int store_conn_ext_kv(struct store_conn *c, const struct store_ext_req *q);
/* The server is being freed (after every connection closed): its leases go
 * without setting expiry keys. */
void store_ext_server_free(struct store_server *srv);

/* ---- client side (client/; not exported) ---- */

/* What a caller that reports its own progress (the rendezvous) wants from
 * crun_store_open's dialing. */
struct store_dial_report {
	/* Called once, on the dialing thread, when the first round of
	 * attempts failed and dialing goes on for left_ms more: the failure
	 * (a crun code) and its text ("connection refused"). NULL: none. */
	void (*on_retry)(int r, const char *what, uint64_t left_ms, void *arg);
	void *arg;
	bool retry_unresolved; /* a name that does not resolve (yet) is retried too */
	char *err;	       /* on failure: crun_store_last_error's text */
	size_t err_cap;
};

/* crun_store_open with a report (NULL: none); the same codes. */
struct crun_store_opts;
struct crun_store;
int store_client_open(const struct crun_store_opts *opts, const struct store_dial_report *rep,
		      struct crun_store **ret_store);

/* WAIT_ANY on the handle's connection: *ret_idx is the index of a key of
 * keys[0..n) that exists, within timeout_ms (0: the handle's op timeout).
 * CRUN_ETIMEDOUT when none appeared (the connection stays usable),
 * CRUN_ENOTSUP when the server's extension predates WAIT_ANY. */
struct crun_store;
int store_client_wait_any(struct crun_store *s, const char *const *keys, size_t n,
			  uint32_t timeout_ms, size_t *ret_idx);
/* GET without the WAIT before it, for a key the caller knows is present
 * and never deleted (a missing key reads as empty here, or closes a 1.13
 * server's connection): one round trip instead of two. */
int store_client_get_now(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len);
/* The version-4 ops (CRUN_ENOTSUP, nothing sent, from an older server; the
 * caller falls back to the two requests each replaces). try_get:
 * CRUN_ENOTFOUND when absent. wait_any_get: store_client_wait_any that also
 * reads the key's value (malloc'd, NUL-terminated) from the wake, keeps lease
 * `keep` (0: none) alive with the request, and is timed out by the server
 * (no CANCEL_WAIT unless the server is late). ticket:
 * *ret_t = ADD(counter, 1), and prefix<t> set to val. grant_set: a lease as
 * crun_store_lease_grant with key set under it. */
/* The values of n keys (malloc'd, NUL-terminated; a missing key reads as
 * empty, as crun's server answers it): one MULTI_GET without the WAIT
 * before it, only on a connection that spoke extension version 4 (else
 * CRUN_ENOTSUP: another server may close on a missing key). */
int store_client_multi_get_now(struct crun_store *s, const char *const *keys, size_t n,
			       void **ret_vals, size_t *ret_lens);
int store_client_try_get(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len);
int store_client_wait_any_get(struct crun_store *s, const char *const *keys, size_t n,
			      uint32_t timeout_ms, uint64_t keep, size_t *ret_idx, void **ret_val,
			      size_t *ret_len);
/* Version 5: store_client_wait_any_get that also reads with_key's value at
 * the wake into *ret_with (malloc'd, NUL-terminated; NULL when absent or on
 * a timeout). CRUN_ENOTSUP, nothing sent, from an older server. */
int store_client_wait_any_get_with(struct crun_store *s, const char *const *keys, size_t n,
				   const char *with_key, uint32_t timeout_ms, uint64_t keep,
				   size_t *ret_idx, void **ret_val, void **ret_with);
int store_client_ticket(struct crun_store *s, const char *counter, const char *prefix,
			const void *val, size_t len, int64_t *ret_t);
int store_client_grant_set(struct crun_store *s, uint32_t ttl_ms, const char *expiry_key,
			   const void *expiry_val, size_t expiry_len, const char *key,
			   const void *val, size_t len, uint64_t *ret_id);

#endif /* CRUN_STORE_STORE_EXT_H */
