/* etcd_int.h: the etcd v3 client behind coord.h (folder-private). It speaks
 * etcd's JSON/HTTP gateway (range, put and txn under /v3/kv, lease grant,
 * keepalive and revoke, watch, auth/authenticate) with libevent's evhttp
 * and cJSON; no other etcd client library.
 *
 * etcd_http.c: configuration (endpoints, rdzv_conf keys), one handle's
 * private event_base, its connections, TLS, authentication, requests with
 * per-attempt timeouts and fail-over across endpoints, and the watch stream.
 * etcd_txn.c: request builders (keys, range/put/txn JSON, reading kvs).
 * coord_etcd.c: the coord.h operations (reads, waits on a watch,
 * compare-and-set, leases with expiry keys); etcd_counter.c: coord_add.
 *
 * A handle is used by one thread at a time (coord.h); every call blocks up to
 * its deadline. Nothing here logs above DEBUG: errors come back as codes with
 * etcd_last_error() saying why.
 */
#ifndef CRUN_RENDEZVOUS_ETCD_INT_H
#define CRUN_RENDEZVOUS_ETCD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ETCD_MAX_ENDPOINTS 8
#define ETCD_PATH_MAX	   1024
#define ETCD_MAX_LEASES	   16	/* leases one handle holds at once */
#define ETCD_DEFAULT_PORT  2379 /* etcd's client port */

struct etcd_endpoint {
	char host[256];
	uint16_t port;
};

/* Where and how to reach the cluster: a plain value, copied by whoever keeps
 * it (helper threads outlive the object that parsed it). */
struct etcd_conf {
	int n_ep;
	struct etcd_endpoint ep[ETCD_MAX_ENDPOINTS];
	bool https;			   /* rdzv_conf protocol=https (c10d.h's etcd rows) */
	char cacert[ETCD_PATH_MAX];	   /* cacert / ca_cert: verify the members */
	char cert[ETCD_PATH_MAX];	   /* cert / ssl_cert: client certificate */
	char key[ETCD_PATH_MAX];	   /* key / ssl_cert_key */
	char prefix[256];		   /* key_prefix; "" = /crun/rdzv/<rdzv_id> */
	char username[128];		   /* etcd auth; "" = none */
	char password_file[ETCD_PATH_MAX]; /* first line is the password */
};

/* Parses "host[:port][,host[:port]...]" (port default ETCD_DEFAULT_PORT; an
 * http:// or https:// scheme in front of an entry is accepted and sets
 * https). 0, or CRUN_EINVAL with err naming the bad entry. */
int etcd_parse_endpoints(const char *list, struct etcd_conf *conf, char *err, size_t cap);

/* The key prefix for a run: conf->prefix, else "/crun/rdzv/<run_id>". */
int etcd_prefix(const struct etcd_conf *conf, const char *run_id, char *buf, size_t cap);

struct etcd;

/* Opens a handle: its own event_base, TLS context, and (with a username) an
 * auth token. Reaches one member within connect_timeout_ms, trying each in
 * turn. timeout_ms bounds every later operation (0: 30 s). Keys are
 * "<prefix>/<key>". 0, CRUN_ECONFIG (TLS files, password), or the error of
 * the last member tried. */
int etcd_open(const struct etcd_conf *conf, const char *prefix, uint32_t connect_timeout_ms,
	      uint32_t timeout_ms, struct etcd **ret);
/* etcd_open that, with say_retry, logs at WARN once when no member answered
 * the first pass and it keeps trying, and writes the last error (member
 * and cause) into err on failure (NULL: not wanted). */
int etcd_open_report(const struct etcd_conf *conf, const char *prefix, uint32_t connect_timeout_ms,
		     uint32_t timeout_ms, bool say_retry, char *err, size_t err_cap,
		     struct etcd **ret);
/* Closes connections; leases it holds are left to expire (NULL: no-op). */
void etcd_close(struct etcd *e);
const char *etcd_last_error(const struct etcd *e);

/* coord.h's operations, same contracts (coord_store.c dispatches here). */
int etcd_add(struct etcd *e, const char *key, int64_t delta, int64_t *ret_value);
int etcd_set(struct etcd *e, const char *key, const char *val);
int etcd_get(struct etcd *e, const char *key, uint32_t timeout_ms, char **ret_val);
int etcd_try_get(struct etcd *e, const char *key, char **ret_val);
int etcd_exists(struct etcd *e, const char *key);
int etcd_multi_get(struct etcd *e, const char *const *keys, size_t n, uint32_t timeout_ms,
		   char **ret_vals);
int etcd_compare_set(struct etcd *e, const char *key, const char *expected, const char *desired,
		     char **ret_cur);
int etcd_wait(struct etcd *e, const char *key, uint32_t timeout_ms);
int etcd_multi_set(struct etcd *e, const char *const *keys, const char *const *vals, size_t n);
#define ETCD_ANY_MAX 16 /* keys of one wait_any: 3 txn ops and 2 watches each */
int etcd_wait_any(struct etcd *e, const char *const *keys, size_t n, uint32_t timeout_ms);
int etcd_lease_grant(struct etcd *e, uint32_t ttl_ms, const char *expiry_key, const char *why,
		     uint64_t *ret_id);
int etcd_lease_keepalive(struct etcd *e, uint64_t id);
int etcd_lease_revoke(struct etcd *e, uint64_t id);
int etcd_put_leased(struct etcd *e, uint64_t id, const char *key, const char *val);
/* Ends every lease of the handle as if it had lapsed (etcd_close). */
void etcd_leases_end(struct etcd *e);

/* ---- transport, shared by etcd_http.c and coord_etcd.c -------------------- */

struct cJSON;

/* POSTs body (JSON text) to path on the current member and parses the reply.
 * Connection errors, timeouts and "leader changed"/"no leader" answers move
 * to the next member and resend until the handle's deadline; an expired auth
 * token is renewed. Every request crun sends is safe to resend: reads, puts,
 * compare-and-sets, and counter updates (fenced, coord_etcd.c). *ret_json is
 * freed with cJSON_Delete. */
int etcd_call(struct etcd *e, const char *path, const char *body, struct cJSON **ret_json);

/* The watch stream: one at a time per handle, on its own connection to the
 * current member, over [key, range_end) from start_rev. */
int etcd_watch_start(struct etcd *e, const char *key, size_t key_len, const char *end,
		     size_t end_len, int64_t start_rev);
/* Several ranges on the one stream (one create_request each); a range
 * without end is its key alone; noput: deletions only. `ident` names the
 * set for etcd_watch_matches. */
struct etcd_wrange {
	const char *key;
	size_t key_len;
	const char *end; /* NULL: key alone */
	size_t end_len;
	bool noput;
};
int etcd_watch_start_n(struct etcd *e, const struct etcd_wrange *w, size_t n, const char *ident,
		       size_t ident_len, int64_t start_rev);
void etcd_watch_stop(struct etcd *e);
/* Whether the running watch covers exactly this range on the current member
 * and is still alive. */
bool etcd_watch_matches(const struct etcd *e, const char *key, size_t key_len);

enum etcd_watch_result {
	ETCD_W_EVENT,	/* something in the range changed since the last call */
	ETCD_W_DEAD,	/* the stream ended (member lost, canceled, compacted) */
	ETCD_W_TIMEOUT, /* until_ms passed quietly */
};
/* Clears the event flag (call before reading the state the wait is about). */
void etcd_watch_rearm(struct etcd *e);
/* Runs the handle's loop until an event, the stream's end, or until_ms
 * (clock_now_ms time). */
enum etcd_watch_result etcd_watch_wait(struct etcd *e, uint64_t until_ms);

/* ---- request builders (etcd_txn.c) ---------------------------------------- */

/* "<prefix><key><suffix>" (suffix may be NULL or hold \x01), malloc'd. */
char *etcd_key(struct etcd *e, const char *key, const char *suffix, size_t *ret_len);
/* {"key": k, "range_end": end?, ...}: range and delete_range bodies. */
struct cJSON *etcd_req_range(const char *k, const char *end, bool count_only, bool keys_only);
/* A put body; v NULL keeps the value (ignore_value), prev_kv returns the
 * old kv, lease 0 = none. */
struct cJSON *etcd_req_put(const char *k, const char *v, uint64_t lease, bool prev_kv);
/* Appends {"request_<kind>": body} to a txn branch; takes body even when
 * it fails. */
bool etcd_op(struct cJSON *arr, const char *kind, struct cJSON *body);
/* A compare on k: target "MOD"/"CREATE" (rev) or "VALUE" (value); result
 * "EQUAL", "GREATER", "LESS" or "NOT_EQUAL" (etcd_cmp: EQUAL). */
bool etcd_cmpr(struct cJSON *arr, const char *k, const char *target, const char *result,
	       int64_t rev, const char *value);
bool etcd_cmp(struct cJSON *arr, const char *k, const char *target, int64_t rev, const char *value);

struct etcd_txn {
	struct cJSON *root, *compare, *success, *failure;
};
int etcd_txn_init(struct etcd_txn *t);
/* Sends the txn when ok (frees it either way); *ret_json is the reply. */
int etcd_txn_run(struct etcd *e, struct etcd_txn *t, bool ok, struct cJSON **ret_json);
/* The response_range of a txn reply's entry i, or NULL. */
const struct cJSON *etcd_txn_range(const struct cJSON *res, int i);

/* Counters (etcd_counter.c) are stored as CTR_TAG "<offset>": their value
 * is the key's version plus the offset. Readers see the decimal number.
 * CTR_TAG sorts between CTR_LO and CTR_HI. */
#define CTR_TAG "\001c"
#define CTR_LO	"\001c"
#define CTR_HI	"\001d"
/* 1 and *ret_off when raw is a counter, else 0. */
int etcd_kv_counter(const char *raw, int64_t *ret_off);
/* A kv's value (malloc'd; a counter as its number) and mod revision. */
int etcd_kv_of(const struct cJSON *kv, char **ret_val, int64_t *ret_mod);
/* The first kv of a range response: 0, CRUN_ENOTFOUND, or CRUN_EPROTO. */
int etcd_kv_value(const struct cJSON *range, char **ret_val, int64_t *ret_mod);
/* Sets the error as "<what> '<key>': <code> - <previous detail>"; returns r. */
int etcd_fail_op(struct etcd *e, int r, const char *what, const char *key);

/* The handle's default operation timeout and its error buffer. */
uint32_t etcd_timeout_ms(const struct etcd *e);
int etcd_fail(struct etcd *e, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* base64 helpers for the gateway's bytes fields: malloc'd, NUL-terminated. */
char *etcd_b64(const char *p, size_t len);
/* Decodes into a malloc'd NUL-terminated string (*ret_len without the NUL). */
int etcd_unb64(const char *s, char **ret, size_t *ret_len);
/* An int64 the gateway sent as a JSON string (or number); 0 when absent. */
int64_t etcd_json_i64(const struct cJSON *obj, const char *name);

/* ---- the handle (shared by the two files) --------------------------------- */

struct event_base;
struct event;
struct evbuffer;
struct evhttp_connection;
struct evhttp_request;
struct ssl_ctx_st;

/* A lease this handle granted with an expiry key: the registration key
 * (outlives the lease) and the live key (dies with it); see coord_etcd.c. */
struct etcd_lease {
	uint64_t id;
	char *reg, *live; /* full keys; NULL without an expiry key */
};

struct etcd_watch {
	struct evhttp_connection *conn; /* owned; frees req */
	struct evhttp_request *req;	/* borrowed from conn while running */
	char *key;			/* the watched range's start */
	size_t key_len;
	int ep; /* the member it runs on, -1 none */
	bool alive, event, wake;
	uint64_t checked_ms;   /* when the watched key was last read */
	struct evbuffer *line; /* a message not yet ended by its newline */
};

struct etcd {
	struct etcd_conf conf;
	struct event_base *base; /* private: only this handle's requests */
	struct event *tick;
	bool ticked;
	struct ssl_ctx_st *ssl; /* NULL: plain http */
	int ep;			/* the member requests go to */
	unsigned moves;		/* fail-overs so far */
	struct evhttp_connection *conn;
	uint32_t timeout_ms;
	char token[1024];
	char password[256];
	char prefix[320]; /* "<prefix>/" */
	size_t prefix_len;
	uint64_t nonce, seq; /* fence keys of counter updates */
	char *last_fence;
	struct etcd_lease leases[ETCD_MAX_LEASES];
	struct etcd_watch w;
	char err[512];
	bool say_retry; /* etcd_open_report: the first pass without an answer is logged... */
	bool told;	/* ...once */
};

#endif /* CRUN_RENDEZVOUS_ETCD_INT_H */
