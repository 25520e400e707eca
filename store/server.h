/* server.h: the store module's server: the libevent TCPStore-compatible
 * server (server/: server.c, server_ops.c, kv.c, lease.c) and its configuration.
 * Separate from store/store.h (the pure wire codec, which the blocking
 * client is built on) so that scripts/check-layers.sh can see who starts a
 * store server: agent/, cmd/, tests/ and bench/, plus the two hosts listed
 * there (the c10d rendezvous host and the worker SDK's rank 0).
 */
#ifndef CRUN_STORE_SERVER_H
#define CRUN_STORE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

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
	const char *host;		/* bind address; NULL or "" = dual-stack any ("::") */
	uint16_t port;			/* 0 = ephemeral; read back with store_server_port() */
	int backlog;			/* listen backlog; 0 = SOMAXCONN */
	struct store_limits limits;	/* per request; max_items also caps one
					 * connection's registrations (waits,
					 * watches, leases) */
	uint32_t max_conns;		/* 0 = min(65536, RLIMIT_NOFILE soft limit less
					 * the fds open at start and 64 more, and
					 * with TLS or secrets max_preauth_conns);
					 * with TLS or secrets it counts only
					 * connections that got through */
	size_t max_conn_buffered_bytes; /* one connection's unprocessed input (a
					 * frame must fit); 0 = the largest legal
					 * frame under `limits` */
	size_t max_total_value_bytes;	/* values plus queued items, whole key space */
	/* Appended for issue 9 (hostile clients). */
	uint64_t max_keys;	       /* entries in the key space (keys with a value,
					* a queue or a registration) */
	size_t max_total_key_bytes;    /* bytes of those entries' keys */
	uint64_t max_waiters;	       /* WAIT/BARRIER/WATCH_KEY registrations, all
					* connections */
	size_t max_total_input_bytes;  /* unprocessed input, all connections */
	size_t max_conn_output_bytes;  /* reading pauses while a connection has
					* more unsent replies than this */
	size_t max_total_output_bytes; /* unsent replies, all connections */
	uint32_t keepalive_s;	       /* TCP keepalive idle time; the peer is
					* dropped ~keepalive_s * 5/3 after it
					* vanished (0: off) */
	uint32_t stall_timeout_s;      /* a partial frame that gets no byte, or
					* unsent output the peer does not read, for
					* this long closes it (0: off) */
	uint32_t idle_timeout_s;       /* no byte from the peer for this long closes
					* it (0: off, the default: torch 1.13 keeps
					* an idle watch connection per store) */
	/* Secrets (store/auth.h), borrowed, must outlive the server; NULL: no
	 * authentication. With a table every client must pass the challenge. */
	const struct store_auth_keys *auth;
	/* TLS context (store/tls.h), borrowed like auth; NULL: plaintext. */
	struct store_tls *tls;
	/* The crun extension version served (store_ext.h; 0 = the newest):
	 * HELLO answers it and newer ops close the connection, as an older
	 * crun-rdzvd would - for tests of the clients' fallbacks. */
	uint32_t ext_version;
	/* Appended for issue 28 (pre-auth exhaustion). With TLS or secrets a
	 * connection is "pre-auth" from accept until it passed the TLS
	 * handshake and the challenge: it must get there within
	 * preauth_timeout_s of accept (one deadline, not reset by bytes), and
	 * such connections have their own budget - max_preauth_conns in all,
	 * max_preauth_per_addr from one source address - instead of counting in
	 * max_conns, so strangers cannot take the slots of real clients. */
	uint32_t preauth_timeout_s;
	uint32_t max_preauth_conns;
	uint32_t max_preauth_per_addr;
	/* Appended for issue 26 (fairness). Each global budget of the key
	 * space (max_keys, max_total_key_bytes, max_total_value_bytes,
	 * max_waiters) is shared: one job (run id, see server/share.c) may hold at
	 * most job_share_pct percent of it and one connection may add at most
	 * conn_share_pct percent, so a flooder is refused before it locks the
	 * other jobs out. The last reserve_pct percent of each budget only
	 * crun's own rendezvous keys (under STORE_AUTH_JOB_ROOT) may use. */
	uint32_t job_share_pct;
	uint32_t conn_share_pct;
	uint32_t reserve_pct;
};

#define STORE_SERVER_CONFIG_DEFAULT                                                                \
	{                                                                                          \
		.host = NULL, .port = 0, .backlog = 0, .limits = STORE_LIMITS_DEFAULT,             \
		.max_conns = 0, .max_conn_buffered_bytes = 0,                                      \
		.max_total_value_bytes = (size_t)1024 * 1024 * 1024, .max_keys = 1u << 20,         \
		.max_total_key_bytes = 64u * 1024 * 1024, .max_waiters = 1u << 20,                 \
		.max_total_input_bytes = 512u * 1024 * 1024, .max_conn_output_bytes = 1024 * 1024, \
		.max_total_output_bytes = 512u * 1024 * 1024, .keepalive_s = 30,                   \
		.stall_timeout_s = 60, .idle_timeout_s = 0, .preauth_timeout_s = 10,               \
		.max_preauth_conns = 128, .max_preauth_per_addr = 16, .job_share_pct = 50,         \
		.conn_share_pct = 25, .reserve_pct = 5,                                            \
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
/* Changes the tunables of store_server_limits() on a running server to
 * cfg's (0 = default, as for store_server_new; cfg's other fields are
 * ignored: address, backlog, auth and TLS need a new server). They hold for
 * every request from now on and for connections accepted from now on (an
 * open connection keeps its input watermark); nothing already held is
 * evicted: a lowered key or byte budget refuses further growth. Loop thread
 * only (crun-rdzvd's SIGHUP). */
void store_server_set_limits(struct store_server *srv, const struct store_server_config *cfg);
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
	uint64_t entries;	/* max_keys counts these */
	uint64_t key_bytes;	/* max_total_key_bytes counts these */
	uint64_t registrations; /* waits and watches: max_waiters counts these */
	uint64_t input_bytes;	/* unprocessed input, all connections */
	uint64_t output_bytes;	/* unsent output, all connections */
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

/* The value of key without a request (a status page's view): 0 and a
 * borrowed pointer, valid until the server's loop runs again, or
 * CRUN_ENOTFOUND when the key has no value. */
int store_server_peek(const struct store_server *srv, const uint8_t *key, size_t len,
		      const uint8_t **ret_val, size_t *ret_len);

/* SET on the server's own behalf (crun-rdzvd's status page posting an ask
 * into a job's keys): waiters and watchers are told as for a client's SET.
 * Loop thread only. 0, CRUN_ENOMEM, or CRUN_ETOOBIG over the value budget. */
int store_server_put(struct store_server *srv, const uint8_t *key, size_t klen, const uint8_t *val,
		     size_t vlen);

/* Counters of refusals and limit hits, one table: X(ID, name, help). Every
 * closed or refused connection counts in exactly one DROP_ or REFUSED_ row
 * (their sum is store_server_stats.dropped_conns) and is logged once at WARN
 * with the row's help text (rate-limited). PAUSE_ rows count backpressure,
 * which closes nothing; LEASE_ rows count lease ends (store_ext.h). For an
 * exporter: iterate 0..STORE_M__MAX. */
#define STORE_METRIC_MAP(X)                                                                 \
	X(CONNS_ACCEPTED, "conns_accepted", "connections accepted")                         \
	X(REFUSED_MAX_CONNS, "refused_max_conns", "connection limit reached (max_conns)")   \
	X(REFUSED_FD_LIMIT, "refused_fd_limit", "out of file descriptors")                  \
	X(REFUSED_PREAUTH, "refused_preauth",                                               \
	  "too many connections not authenticated yet (max-preauth-conns)")                 \
	X(REFUSED_PREAUTH_ADDR, "refused_preauth_addr",                                     \
	  "too many connections not authenticated yet from one address "                    \
	  "(max-preauth-per-addr)")                                                         \
	X(DROP_MALFORMED, "drop_malformed", "malformed request")                            \
	X(DROP_REQUEST_LIMIT, "drop_request_limit", "request over a per-request limit")     \
	X(DROP_EXT_BEFORE_HELLO, "drop_ext_before_hello", "extension op before HELLO")      \
	X(DROP_KEYS, "drop_keys", "key space full (max-keys)")                              \
	X(DROP_KEY_BYTES, "drop_key_bytes", "key bytes full (max-total-key-bytes)")         \
	X(DROP_VALUE_BYTES, "drop_value_bytes", "value bytes full (max-total-value-bytes)") \
	X(DROP_WAITERS, "drop_waiters",                                                     \
	  "too many registrations (max-waiters, "                                           \
	  "max-keys-per-request)")                                                          \
	X(DROP_CONN_INPUT, "drop_conn_input", "frame over max-conn-buffer-bytes")           \
	X(DROP_TOTAL_INPUT, "drop_total_input",                                             \
	  "largest input holder over "                                                      \
	  "max-total-input-bytes")                                                          \
	X(DROP_OUTPUT, "drop_output",                                                       \
	  "pushed output not read (watch notifications, "                                   \
	  "wake-ups)")                                                                      \
	X(DROP_STALL, "drop_stall",                                                         \
	  "partial frame or unread output stalled "                                         \
	  "(stall-timeout)")                                                                \
	X(DROP_IDLE, "drop_idle", "idle (idle-timeout)")                                    \
	X(DROP_OP_FAILED, "drop_op_failed", "operation failed (as torch closes it)")        \
	X(REFUSED_ALLOWLIST, "refused_allowlist",                                           \
	  "not a node of this job (worker store "                                           \
	  "allowlist)")                                                                     \
	X(DROP_AUTH, "drop_auth",                                                           \
	  "authentication failed (wrong secret, unknown run id, or "                        \
	  "no answer in time)")                                                             \
	X(DROP_TLS, "drop_tls", "TLS handshake or record failed")                           \
	X(DROP_FOREIGN_KEY, "drop_foreign_key", "key outside the client's run id")          \
	X(PAUSE_CONN_OUTPUT, "pause_conn_output",                                           \
	  "reading paused: replies unread "                                                 \
	  "(max-conn-output-bytes)")                                                        \
	X(PAUSE_TOTAL_OUTPUT, "pause_total_output",                                         \
	  "reading paused: "                                                                \
	  "max-total-output-bytes reached")                                                 \
	X(LEASE_EXPIRED, "lease_expired",                                                   \
	  "leases ended without a revoke: no keep-alive for a TTL, or the holder's "        \
	  "connection closed (a node lost)")                                                \
	X(LEASE_RELEASED, "lease_released",                                                 \
	  "leases revoked by their holder (an orderly end: the job ended or the agent "     \
	  "stopped)")

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

/* ---- shares (issue 26): who holds what, and who was refused ---- */

/* The budgets a job's and a connection's share apply to, one table:
 * X(ID, name). */
#define STORE_BUDGET_MAP(X)           \
	X(KEYS, "keys")               \
	X(KEY_BYTES, "key_bytes")     \
	X(VALUE_BYTES, "value_bytes") \
	X(WAITERS, "waiters")

enum store_budget {
#define STORE_B_X_(id, name) STORE_B_##id,
	STORE_BUDGET_MAP(STORE_B_X_)
#undef STORE_B_X_
	    STORE_B__MAX,
};

/* "keys"...; static text, "?" out of range. */
const char *store_budget_name(enum store_budget b);

/* What one job holds. A job is a run id: the J of a key under
 * STORE_AUTH_JOB_ROOT "J/", else the run id an authenticated client named,
 * else "" (keys of no known job, e.g. a worker store's, share one entry).
 * At most STORE_SHARE_MAX_JOBS jobs are told apart; keys of further jobs
 * count under STORE_SHARE_OTHER, so the metric's cardinality is bounded. */
#define STORE_SHARE_MAX_JOBS 256
#define STORE_SHARE_OTHER    "~other"
struct store_share_info {
	const char *job;		/* valid during the callback only */
	uint64_t used[STORE_B__MAX];	/* entries, key bytes, value bytes, registrations */
	uint64_t limit[STORE_B__MAX];	/* the job's share of each global budget */
	uint64_t refused[STORE_B__MAX]; /* writes of this job refused, by budget */
};
/* Calls fn for every job that holds something or was refused, in no order;
 * fn must not touch the server. O(jobs). */
void store_server_each_share(const struct store_server *srv,
			     void (*fn)(const struct store_share_info *si, void *arg), void *arg);
/* Deletes every key, value and queue of job `job` ("" for keys of no known
 * job), as DELETE_KEY would (watchers told, waiters stay registered): an
 * operator's way out after a flood (crunctl drop). Sets *ret_keys to the
 * keys deleted (may be NULL). 0, or CRUN_ENOTFOUND for a job that holds
 * nothing. Loop thread only. */
int store_server_drop_job(struct store_server *srv, const char *job, uint64_t *ret_keys);

#endif /* CRUN_STORE_SERVER_H */
