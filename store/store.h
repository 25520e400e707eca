/* store.h: the store module's interface inside crun: the pure TCPStore wire
 * codec (proto.c), the libevent server (server.c, kv.c) and the glue the
 * blocking public client (include/crun/store.h, client.c) is built on.
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

/* ---- server --------------------------------------------------------------- */

struct event_base;
struct store_server;
struct store_auth_keys;
struct store_tls;

/* Every limit is on by default (../shared/STYLE.md §3.6). Budgets shared by
 * all connections protect the process (one misbehaving client must not take
 * down the job whose agent hosts the store); per-connection ceilings keep one
 * client from using a whole budget at once. For sizes and counts 0 means "the
 * default"; for the *_s times 0 means "off". store_server_limits() lists them
 * all with their flag names, for --help, rdzv_conf and the README. */
struct store_server_config {
	const char *host; /* bind address; NULL or "" = dual-stack any ("::") */
	uint16_t port;	  /* 0 = ephemeral; read back with store_server_port() */
	int backlog;	  /* listen backlog; 0 = SOMAXCONN */
	struct store_limits limits; /* per request; max_items also caps one
				     * connection's registrations (waits,
				     * watches, leases) */
	uint32_t max_conns; /* 0 = min(65536, RLIMIT_NOFILE soft limit less
			     * an eighth, at least 64, for other fds) */
	size_t max_conn_buffered_bytes; /* one connection's unprocessed input (a
					 * frame must fit); 0 = the largest legal
					 * frame under `limits` */
	size_t max_total_value_bytes;	/* values plus queued items, whole key space */
	/* Appended for issue 9 (hostile clients). */
	uint64_t max_keys;		/* entries in the key space (keys with a value,
					 * a queue or a registration) */
	size_t max_total_key_bytes;	/* bytes of those entries' keys */
	uint64_t max_waiters;		/* WAIT/BARRIER/WATCH_KEY registrations, all
					 * connections */
	size_t max_total_input_bytes;	/* unprocessed input, all connections */
	size_t max_conn_output_bytes;	/* reading pauses while a connection has
					 * more unsent replies than this */
	size_t max_total_output_bytes;	/* unsent replies, all connections */
	uint32_t keepalive_s;		/* TCP keepalive idle time; the peer is
					 * dropped ~keepalive_s * 5/3 after it
					 * vanished (0: off) */
	uint32_t stall_timeout_s;	/* a partial frame that gets no byte, or
					 * unsent output the peer does not read, for
					 * this long closes it (0: off) */
	uint32_t idle_timeout_s;	/* no byte from the peer for this long closes
					 * it (0: off, the default: torch 1.13 keeps
					 * an idle watch connection per store) */
	/* Secrets (store/auth.h), borrowed, must outlive the server; NULL: no
	 * authentication. With a table every client must pass the challenge. */
	const struct store_auth_keys *auth;
	/* TLS context (store/tls.h), borrowed like auth; NULL: plaintext. */
	struct store_tls *tls;
};

#define STORE_SERVER_CONFIG_DEFAULT                                                    \
	{                                                                              \
		.host = NULL, .port = 0, .backlog = 0, .limits = STORE_LIMITS_DEFAULT, \
		.max_conns = 0, .max_conn_buffered_bytes = 0,                          \
		.max_total_value_bytes = (size_t)1024 * 1024 * 1024,                   \
		.max_keys = 1u << 20, .max_total_key_bytes = 64u * 1024 * 1024,        \
		.max_waiters = 1u << 20, .max_total_input_bytes = 512u * 1024 * 1024,  \
		.max_conn_output_bytes = 1024 * 1024,                                  \
		.max_total_output_bytes = 512u * 1024 * 1024, .keepalive_s = 30,       \
		.stall_timeout_s = 60, .idle_timeout_s = 0,                            \
	}

/* One tunable of struct store_server_config, for flag parsers and help
 * texts: crun-rdzvd's --NAME flags and the c10d host's rdzv_conf
 * store_NAME keys are both this table. */
struct store_server_limit {
	const char *name; /* "max-keys"; '_' is accepted for '-' when setting */
	const char *unit; /* "bytes", "count" or "seconds" */
	const char *help; /* one line */
	uint64_t min, max;
	const char *zero; /* what 0 means ("auto", "off"), or NULL: not allowed */
	size_t offset;	  /* of the field in struct store_server_config... */
	size_t size;	  /* ...which is a uint32_t (4) or a uint64_t/size_t (8) */
};

/* The table of tunables (static) and its length. */
const struct store_server_limit *store_server_limits(size_t *ret_n);
/* The current value of tunable `i` in cfg. */
uint64_t store_server_limit_get(const struct store_server_config *cfg, size_t i);
/* Sets tunable `name` ("max-keys" or "max_keys") from decimal text. 0,
 * CRUN_ENOTFOUND for an unknown name, or CRUN_EINVAL with err naming the
 * tunable and its range. */
int store_server_config_set(struct store_server_config *cfg, const char *name, const char *text,
			    char *err, size_t cap);

/* Creates a server listening on cfg->host:cfg->port, driven by `base`
 * (borrowed; must outlive the server). Returns 0, CRUN_EADDRINUSE, CRUN_ENOMEM,
 * CRUN_ERESOLVE... */
int store_server_new(struct event_base *base, const struct store_server_config *cfg,
		     struct store_server **ret_srv);
/* Closes every connection and the listener and frees the server. NULL: no-op. */
void store_server_free(struct store_server *srv);
/* The bound port (useful after port 0). */
uint16_t store_server_port(const struct store_server *srv);
/* The configuration in force, defaults filled in (max_conns resolved). */
const struct store_server_config *store_server_get_config(const struct store_server *srv);
/* Deletes every key (waiters stay registered). The agent uses it between
 * restart attempts so 2.x workers, which use no attempt prefix, start clean. */
void store_server_clear(struct store_server *srv);

/* Narrows who may connect: loopback plus the numeric IPv4/IPv6 addresses
 * in `addrs` (separated by spaces or commas; "" = loopback only); NULL lifts
 * the limit (the default). Connections from anyone else are closed at
 * accept, logged and counted (metric refused_allowlist); open ones are kept. 0,
 * CRUN_EINVAL (a name or malformed address: the list is unchanged) or
 * CRUN_ENOMEM. Loop thread only. */
int store_server_set_allowlist(struct store_server *srv, const char *addrs);

struct store_server_stats {
	uint64_t conns;
	uint64_t keys;
	uint64_t value_bytes;
	uint64_t waiters;
	uint64_t requests;
	uint64_t dropped_conns; /* refused, or closed for bad/over-limit input */
	/* Appended for issue 9. */
	uint64_t entries;      /* max_keys counts these */
	uint64_t key_bytes;    /* max_total_key_bytes counts these */
	uint64_t registrations; /* waits and watches: max_waiters counts these */
	uint64_t input_bytes;  /* unprocessed input, all connections */
	uint64_t output_bytes; /* unsent output, all connections */
};
void store_server_get_stats(const struct store_server *srv, struct store_server_stats *ret);
/* PyTorch-protocol requests of one op served so far (crun's extension ops
 * count only in store_server_stats.requests). */
uint64_t store_server_op_count(const struct store_server *srv, enum store_op op);
/* Calls fn for every key that has a value (not for queues or bare
 * registrations), in no order; fn must not touch the server. O(keys): for
 * status pages, not for the request path. */
void store_server_each_key(const struct store_server *srv,
			   void (*fn)(const uint8_t *key, size_t len, void *arg), void *arg);

/* Counters of refusals and limit hits, one table: X(ID, name, help). Every
 * closed or refused connection counts in exactly one DROP_ or REFUSED_ row
 * (their sum is store_server_stats.dropped_conns) and is logged once at WARN
 * with the row's help text (rate-limited). PAUSE_ rows count backpressure,
 * which closes nothing. For an exporter: iterate 0..STORE_M__MAX. */
#define STORE_METRIC_MAP(X)                                                                   \
	X(CONNS_ACCEPTED, "conns_accepted", "connections accepted")                          \
	X(REFUSED_MAX_CONNS, "refused_max_conns", "connection limit reached (max_conns)")    \
	X(REFUSED_FD_LIMIT, "refused_fd_limit", "out of file descriptors")                   \
	X(DROP_MALFORMED, "drop_malformed", "malformed request")                              \
	X(DROP_REQUEST_LIMIT, "drop_request_limit", "request over a per-request limit")       \
	X(DROP_EXT_BEFORE_HELLO, "drop_ext_before_hello", "extension op before HELLO")        \
	X(DROP_KEYS, "drop_keys", "key space full (max-keys)")                                \
	X(DROP_KEY_BYTES, "drop_key_bytes", "key bytes full (max-total-key-bytes)")           \
	X(DROP_VALUE_BYTES, "drop_value_bytes", "value bytes full (max-total-value-bytes)")   \
	X(DROP_WAITERS, "drop_waiters", "too many registrations (max-waiters, "               \
					"max-keys-per-request)")                              \
	X(DROP_CONN_INPUT, "drop_conn_input", "frame over max-conn-buffer-bytes")             \
	X(DROP_TOTAL_INPUT, "drop_total_input", "largest input holder over "                  \
						"max-total-input-bytes")                      \
	X(DROP_OUTPUT, "drop_output", "pushed output not read (watch notifications, "         \
				      "wake-ups)")                                            \
	X(DROP_STALL, "drop_stall", "partial frame or unread output stalled "                 \
				    "(stall-timeout)")                                        \
	X(DROP_IDLE, "drop_idle", "idle (idle-timeout)")                                      \
	X(DROP_OP_FAILED, "drop_op_failed", "operation failed (as torch closes it)")          \
	X(REFUSED_ALLOWLIST, "refused_allowlist", "not a node of this job (worker store "     \
						  "allowlist)")                               \
	X(DROP_AUTH, "drop_auth", "authentication failed (wrong secret, unknown run id, or "  \
				  "no answer in time)")                                       \
	X(DROP_TLS, "drop_tls", "TLS handshake or record failed")                             \
	X(DROP_FOREIGN_KEY, "drop_foreign_key", "key outside the client's run id")            \
	X(PAUSE_CONN_OUTPUT, "pause_conn_output", "reading paused: replies unread "           \
						  "(max-conn-output-bytes)")                  \
	X(PAUSE_TOTAL_OUTPUT, "pause_total_output", "reading paused: "                        \
						    "max-total-output-bytes reached")

enum store_metric {
#define STORE_M_X_(id, name, help) STORE_M_##id,
	STORE_METRIC_MAP(STORE_M_X_)
#undef STORE_M_X_
	STORE_M__MAX,
};

/* "drop_keys"...; static text, "?" out of range. */
const char *store_metric_name(enum store_metric m);
/* One-line description; static text. */
const char *store_metric_help(enum store_metric m);
/* The counter's value since the server started. */
uint64_t store_server_metric(const struct store_server *srv, enum store_metric m);

#endif /* CRUN_STORE_STORE_H */
