/* crun/store.h: blocking client for a TCPStore-compatible key-value store
 * (crun-rdzvd, a crun agent, or PyTorch's own TCPStore server).
 *
 * Keys are mangled the way PyTorch's TCPStore and PrefixStore mangle them, so
 * a crun client and a PyTorch client see the same keys: crun_store_set(s, "k")
 * goes on the wire as "/k"; a view made with crun_store_view_new(s, "p") sends
 * "/p/k"; views nest like PrefixStore (the newest prefix is innermost).
 *
 * Threads: a handle (and every view sharing its connection) must be used from
 * one thread at a time.
 */
#ifndef CRUN_STORE_H
#define CRUN_STORE_H

#include "crun/crun.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct crun_store crun_store_t; /* opaque */

/* Wire numbering: v1 = PyTorch 1.13/2.0, v2 = PyTorch 2.1 and later. */
typedef enum crun_store_dialect {
	CRUN_STORE_V1 = 1,
	CRUN_STORE_V2 = 2,
} crun_store_dialect_t;

typedef struct crun_store_opts {
	size_t struct_size; /* set by CRUN_STORE_OPTS_INIT; append-only */
	const char *host;   /* borrowed; copied by crun_store_open() */
	uint16_t port;
	uint32_t connect_timeout_ms; /* total time for connect + retries */
	uint32_t timeout_ms;	     /* default for every op; 0 = wait forever */
	int dialect;		     /* crun_store_dialect_t */
	const char *prefix;	     /* optional PrefixStore-style prefix; copied */
	uint32_t reconnect_ms;	     /* time to re-establish a lost connection; 0 = never */
	/* Shared-secret authentication (crun stores started with a secret):
	 * the file's secret (mode 0600, 16..4096 bytes) and the run id the
	 * client speaks for (NULL = ""; a daemon with per-job secrets admits it
	 * to that run id's keys only). NULL file: no authentication. */
	const char *auth_secret_file;
	const char *auth_job;
	/* TLS (crun stores serving TLS): the CA that must have signed the
	 * server's certificate (setting it turns TLS on; the server's name or IP
	 * address, `host`, must match the certificate), and an optional client
	 * certificate and key for servers that require one (mutual TLS).
	 * tls_min_version: 13 (or 0) = TLS 1.3 only, 12 = TLS 1.2 allowed. */
	const char *tls_ca;
	const char *tls_cert;
	const char *tls_key;
	int tls_min_version;
} crun_store_opts_t;

/* Also what a caller built before reconnect_ms existed gets. */
#define CRUN_STORE_RECONNECT_MS_DEFAULT 10000

#define CRUN_STORE_OPTS_INIT                                                                       \
	{                                                                                          \
		sizeof(crun_store_opts_t), "127.0.0.1", 29500, 30000, 300000, CRUN_STORE_V2, NULL, \
		    CRUN_STORE_RECONNECT_MS_DEFAULT, NULL, NULL, NULL, NULL, NULL, 0               \
	}

/* Connects, retrying with exponential backoff and jitter (start 50 ms, x1.5,
 * cap 2 s) until connect_timeout_ms. With auth_secret_file, the
 * challenge/response runs first (store/auth.h). v2 sends VALIDATE + PING as
 * PyTorch 2.x does. Returns 0 and *ret_store, or CRUN_ETIMEDOUT, CRUN_ERESOLVE,
 * CRUN_EPROTO (bad PING echo; no challenge from a server we must
 * authenticate to), CRUN_EACCES (secret refused, or the server could not
 * prove it), CRUN_EINVAL. Free with crun_store_close(); on failure the reason
 * is logged at INFO and, for auth, at DEBUG with details. */
CRUN_API int crun_store_open(const crun_store_opts_t *opts, crun_store_t **ret_store);

/* A view on base's connection with `prefix` added, like PyTorch's
 * PrefixStore(prefix, base). base is borrowed and must outlive the view.
 * Close it with crun_store_close() (which leaves the connection open). */
CRUN_API int crun_store_view_new(crun_store_t *base, const char *prefix, crun_store_t **ret_view);

/* Closes the connection (or only the view). NULL: no-op. */
CRUN_API void crun_store_close(crun_store_t *store);

/* Detail of the last failure on this handle (or its views); valid until the
 * next call on the handle. Never NULL. */
CRUN_API const char *crun_store_last_error(const crun_store_t *store);

/* Changes the default timeout of later ops on this connection. */
CRUN_API void crun_store_set_timeout(crun_store_t *store, uint32_t timeout_ms);

/* On any I/O failure or timeout (other than a WAIT timed out and canceled
 * cleanly in v2) the socket is dropped: the TCPStore stream has no framing to
 * resynchronise on. Reconnecting (reconnect_ms > 0): a lost connection is
 * dialed again, with jittered exponential backoff, within reconnect_ms and
 * the call's deadline, by the call that lost it or by the next one; the
 * greeting, HELLO and lease re-attach are redone. A call whose request was
 * in flight is sent again only when applying it twice is harmless (SET, GET,
 * CHECK, WAIT, COMPARE_SET, MULTI_*, PING, QUEUE_LEN, LIST_KEYS and the lease
 * ops but GRANT); ADD, APPEND, DELETE_KEY, QUEUE_PUSH/POP, BARRIER and
 * LEASE_GRANT fail with the transport error (CRUN_ECLOSED, CRUN_ECONNRESET...)
 * and a last_error saying they may or may not have been applied. SET and
 * MULTI_SET have no reply: until the next reply confirms them they are
 * replayed after a reconnect; an unconfirmed APPEND or QUEUE_PUSH (or a very
 * large SET) cannot be, and the call that finds the reset fails with
 * CRUN_ECONNRESET saying so. reconnect_ms = 0: every call after a failure
 * returns CRUN_ENOTCONN. */

CRUN_API int crun_store_set(crun_store_t *s, const char *key, const void *val, size_t len);

/* WAIT then GET, like TCPStore.get(): blocks until the key exists or
 * timeout_ms passes (0 = the handle's default). *ret_val is allocated (plus a
 * NUL after len bytes for convenience); free it with crun_free(). */
CRUN_API int crun_store_get(crun_store_t *s, const char *key, uint32_t timeout_ms, void **ret_val,
			    size_t *ret_len);

/* Adds delta to the decimal counter at key (missing = 0); *ret_value is the
 * new value (may be NULL). */
CRUN_API int crun_store_add(crun_store_t *s, const char *key, int64_t delta, int64_t *ret_value);

/* PyTorch compare_set: sets desired if the current value equals expected (an
 * absent key matches an empty expected). *ret_val receives the reply: desired
 * on success, else the current value (or expected when the key is absent). */
CRUN_API int crun_store_compare_set(crun_store_t *s, const char *key, const void *expected,
				    size_t expected_len, const void *desired, size_t desired_len,
				    void **ret_val, size_t *ret_len);

/* *ret_ready = 1 when every key exists. */
CRUN_API int crun_store_check(crun_store_t *s, const char *const *keys, size_t nkeys,
			      int *ret_ready);

/* Blocks until every key exists. CRUN_ETIMEDOUT after timeout_ms (0 = the
 * handle's default); in v2 the wait is canceled on the server and the
 * connection stays usable, in v1 the connection is closed (a late wake-up
 * would desynchronise it, as it does for PyTorch 1.13). */
CRUN_API int crun_store_wait(crun_store_t *s, const char *const *keys, size_t nkeys,
			     uint32_t timeout_ms);

CRUN_API int crun_store_num_keys(crun_store_t *s, int64_t *ret_count);

/* *ret_deleted = 1 when the key existed (may be NULL). */
CRUN_API int crun_store_delete_key(crun_store_t *s, const char *key, int *ret_deleted);

/* ---- v2 only: CRUN_EDIALECT on a v1 connection ---- */

CRUN_API int crun_store_append(crun_store_t *s, const char *key, const void *val, size_t len);
/* WAIT then MULTI_GET. ret_vals[i] / ret_lens[i] are allocated per key; free
 * each with crun_free(). On failure nothing is allocated. */
CRUN_API int crun_store_multi_get(crun_store_t *s, const char *const *keys, size_t nkeys,
				  uint32_t timeout_ms, void **ret_vals, size_t *ret_lens);
CRUN_API int crun_store_multi_set(crun_store_t *s, const char *const *keys, const void *const *vals,
				  const size_t *lens, size_t n);
/* Round trip with a nonce; *ret_rtt_us may be NULL. */
CRUN_API int crun_store_ping(crun_store_t *s, uint64_t *ret_rtt_us);
CRUN_API int crun_store_queue_push(crun_store_t *s, const char *key, const void *val, size_t len);
/* block = 1: WAIT on the key first (timeout_ms, 0 = default), as PyTorch's
 * blocking pop does; block = 0: CRUN_ENOTFOUND at once if the queue is empty. */
CRUN_API int crun_store_queue_pop(crun_store_t *s, const char *key, int block, uint32_t timeout_ms,
				  void **ret_val, size_t *ret_len);
CRUN_API int crun_store_queue_len(crun_store_t *s, const char *key, int64_t *ret_len);
/* Keys under this handle's mangling ("/" + prefix), returned without it, as
 * PyTorch's list_keys does. *ret_keys is an array of *ret_n NUL-terminated
 * strings; free with crun_store_free_list(). */
CRUN_API int crun_store_list_keys(crun_store_t *s, char ***ret_keys, size_t *ret_n);
CRUN_API void crun_store_free_list(char **list, size_t n);
/* Server-side barrier on key for world_size participants. */
CRUN_API int crun_store_barrier(crun_store_t *s, const char *key, int64_t world_size,
				uint32_t timeout_ms);

/* ---- raw access ---- */

/* ADD on an exact wire key, without the "/" and prefix mangling; PyTorch's
 * world-size check-in uses the raw key "init/". */
CRUN_API int crun_store_add_raw(crun_store_t *s, const char *wire_key, int64_t delta,
				int64_t *ret_value);

/* ---- crun extension (crun stores only; see store/store_ext.h) ----
 * The first call sends HELLO on the connection; a server without the
 * extension (PyTorch's) closes the connection instead (CRUN_ECLOSED, and the
 * handle is broken). */

/* Grants a lease of ttl_ms (1 ms .. 1 h) held by this connection. When ttl_ms
 * passes without a keep-alive (or attach), every key set with
 * crun_store_set_leased() under it is deleted and, if expiry_key is not
 * NULL and not set yet, expiry_key (mangled like any key) is set to
 * expiry_val, waking every WAIT on it. The same happens at once when the
 * handle is closed or the process exits (the server sees the socket close);
 * revoke first to leave cleanly. A connection lost otherwise (a reset, a
 * timeout) does NOT end it: the handle redials and re-attaches its leases
 * within their TTL (see store/store_ext.h). */
CRUN_API int crun_store_lease_grant(crun_store_t *s, uint32_t ttl_ms, const char *expiry_key,
				    const void *expiry_val, size_t expiry_len, uint64_t *ret_id);
/* Restarts the lease's TTL. CRUN_ENOTFOUND when it already ended. */
CRUN_API int crun_store_lease_keepalive(crun_store_t *s, uint64_t id);
/* Makes this connection the lease's holder (taking it from any other) and
 * restarts its TTL: for a lease granted on another handle or process.
 * CRUN_ENOTFOUND when it already ended. */
CRUN_API int crun_store_lease_attach(crun_store_t *s, uint64_t id);
/* Ends the lease cleanly: its keys are deleted, its expiry key is NOT set. */
CRUN_API int crun_store_lease_revoke(crun_store_t *s, uint64_t id);
/* SET whose key is deleted when the lease ends. CRUN_ENOTFOUND: no lease. */
CRUN_API int crun_store_set_leased(crun_store_t *s, uint64_t id, const char *key, const void *val,
				   size_t len);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_STORE_H */
