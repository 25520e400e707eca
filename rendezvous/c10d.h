/* c10d.h: what the c10d rendezvous backend (rdzv_c10d_backend, behind the
 * front door rdzv.c) offers beside its table: rdzv_conf parsing and a
 * blocking join for tests and benchmarks.
 * The round algorithm's pure core is round_int.h.
 */
#ifndef CRUN_RENDEZVOUS_C10D_H
#define CRUN_RENDEZVOUS_C10D_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/rdzv.h"
#include "store/server.h"

struct etcd_conf;

/* Every --rdzv_conf key of the elastic backends, one row each:
 *   X(ID, name, alias, kind, scope, field, default, metavar, choices, help)
 * The text "k=v,..." is parsed above this module, over these rows
 * (agent/cli_rdzv.c); the rendezvous.<name> JSON keys, --help, the man page
 * and the schema come from the RDZV_C10D_KEYS rows (agent/cli_table.c). A
 * new setting is one row plus its use. kind (how the value is spelled, and
 * the field's type): RK_SECS seconds -> uint32_t ms; RK_BOOL -> int (-1
 * unset); RK_PATH -> char[] path; RK_RPATH a readable file -> char[]; RK_STR
 * -> char[]; RK_PICK one of two choices -> int (1: the second); RK_TLS "1.2" or
 * "1.3" -> int 12 or 13. scope: RS_ALL is read by the static backend too
 * (as its join timeout), RS_ELASTIC by c10d and etcd, RS_ETCD by etcd only.
 * default: the text --help shows and the CLI applies; NULL: what
 * cli_rdzv_conf_init leaves (zero; -1, unset, for is_host and protocol).
 */
#define RDZV_C10D_KEYS(X)                                                                          \
	X(JOIN, join_timeout, "timeout", RK_SECS, RS_ALL, join_ms, "600", "SECONDS", NULL,         \
	  "c10d: time for the first round to gather min nodes")                                    \
	X(LAST_CALL, last_call_timeout, NULL, RK_SECS, RS_ELASTIC, last_call_ms, "30", "SECONDS",  \
	  NULL, "c10d: extra wait for more nodes once min joined")                                 \
	X(CLOSE, close_timeout, NULL, RK_SECS, RS_ELASTIC, close_ms, "30", "SECONDS", NULL,        \
	  "c10d: wait for the others to read a closed job")                                        \
	X(READ, read_timeout, NULL, RK_SECS, RS_ALL, read_ms, "60", "SECONDS", NULL,               \
	  "c10d: store read timeout")                                                              \
	X(IS_HOST, is_host, NULL, RK_BOOL, RS_ELASTIC, is_host, NULL, NULL, NULL,                  \
	  "c10d: this agent serves the rendezvous store [auto: its address]")                      \
	X(HEARTBEAT, heartbeat_interval, NULL, RK_SECS, RS_ELASTIC, hb_ms, "1", "SECONDS", NULL,   \
	  "c10d: lease renewal period")                                                            \
	X(LEASE_TTL, lease_ttl, NULL, RK_SECS, RS_ELASTIC, ttl_ms, "3", "SECONDS", NULL,           \
	  "c10d: a node whose lease is this old is gone")                                          \
	X(AUTH_FILE, auth_secret_file, NULL, RK_PATH, RS_ELASTIC, auth_file, NULL, "FILE", NULL,   \
	  "c10d: the job's shared secret (mode 0600, 16+ bytes) [--auth_secret_file]")             \
	X(TLS_CERT, tls_cert, NULL, RK_PATH, RS_ELASTIC, tls_cert, NULL, "FILE", NULL,             \
	  "c10d: this node's PEM certificate chain (the store it serves, and its client "          \
	  "certificate)")                                                                          \
	X(TLS_KEY, tls_key, NULL, RK_PATH, RS_ELASTIC, tls_key, NULL, "FILE", NULL,                \
	  "c10d: its PEM private key [in tls_cert]")                                               \
	X(TLS_CA, tls_ca, NULL, RK_PATH, RS_ELASTIC, tls_ca, NULL, "FILE", NULL,                   \
	  "c10d: TLS on every rendezvous connection, trusting this CA; the store served here "     \
	  "requires client certificates")                                                          \
	X(TLS_MIN, tls_min_version, NULL, RK_TLS, RS_ELASTIC, tls_min, NULL, "V", "1.2|1.3",       \
	  "c10d: oldest TLS version [1.3]")                                                        \
	X(WORKER_STORE, worker_store, NULL, RK_PICK, RS_ELASTIC, worker_store_proxy, NULL, "MODE", \
	  "direct|proxy",                                                                          \
	  "c10d: workers reach the round's store directly, or through their own agent's proxy "    \
	  "[direct]")

/* etcd's own keys (torchrun's etcd backend names; --rdzv_conf only). */
#define RDZV_ETCD_KEYS(X)                                                                          \
	X(PROTOCOL, protocol, NULL, RK_PICK, RS_ETCD, etcd_https, NULL, "SCHEME", "http|https",    \
	  "etcd: talk to the members over https")                                                  \
	X(CACERT, cacert, "ca_cert", RK_RPATH, RS_ETCD, etcd_cacert, NULL, "FILE", NULL,           \
	  "etcd: the CA that signed the members' certificates")                                    \
	X(CERT, cert, "ssl_cert", RK_RPATH, RS_ETCD, etcd_cert, NULL, "FILE", NULL,                \
	  "etcd: client certificate (with key)")                                                   \
	X(KEY, key, "ssl_cert_key", RK_RPATH, RS_ETCD, etcd_key, NULL, "FILE", NULL,               \
	  "etcd: its private key (with cert)")                                                     \
	X(KEY_PREFIX, key_prefix, NULL, RK_STR, RS_ETCD, etcd_prefix, NULL, "/PATH", NULL,         \
	  "etcd: the run's key prefix [/crun/rdzv/<rdzv_id>]")                                     \
	X(USERNAME, username, NULL, RK_STR, RS_ETCD, etcd_username, NULL, "USER", NULL,            \
	  "etcd: user of etcd's authentication (with password_file)")                              \
	X(PASSWORD_FILE, password_file, NULL, RK_RPATH, RS_ETCD, etcd_password_file, NULL, "FILE", \
	  NULL, "etcd: its password, the file's first line")

#define RDZV_CONF_KEYS(X) RDZV_C10D_KEYS(X) RDZV_ETCD_KEYS(X)

enum rdzv_key_kind { RK_SECS, RK_BOOL, RK_PATH, RK_RPATH, RK_STR, RK_PICK, RK_TLS, RK__MAX };
enum rdzv_key_scope { RS_ALL, RS_ELASTIC, RS_ETCD, RS__MAX };

#define RDZV_CONF_PATH_MAX 1024 /* etcd_int.h's ETCD_PATH_MAX */

/* The typed --rdzv_conf of an elastic rendezvous (the rows above). */
struct c10d_conf {
	uint32_t join_ms;      /* join_timeout: a round must complete within it */
	uint32_t last_call_ms; /* last_call_timeout: wait after MIN for more nodes */
	uint32_t close_ms;     /* close_timeout: how long the host waits for acks */
	uint32_t read_ms;      /* read_timeout: one store operation */
	uint32_t hb_ms;	       /* heartbeat_interval */
	uint32_t ttl_ms;       /* lease_ttl */
	int is_host;	       /* -1 auto (endpoint local), 0, 1 */
	/* store_<tunable>=N keys (store_max_keys=..., the names of crun-rdzvd's
	 * limit flags, store/server.h's table): the limits of the store this
	 * host serves. */
	struct store_server_config store;
	/* auth_secret_file: the job's shared secret (store/auth.h) for every
	 * connection to the rendezvous store, and for the store served here;
	 * "" = none (then --auth_secret_file / CRUN_AUTH_SECRET_FILE apply). */
	char auth_file[512];
	/* tls_cert/tls_key: this node's certificate (served store, and client
	 * certificate); tls_ca: turns TLS on for every rendezvous connection
	 * and, on the served store, requires client certificates (mutual);
	 * tls_min_version: 13 (default) or 12. "" = unset. */
	char tls_cert[512];
	char tls_key[512];
	char tls_ca[512];
	int tls_min;
	/* worker_store=proxy: the workers of every node but group rank 0's
	 * reach the worker store through a proxy of their agent (store/proxy.h);
	 * direct (0, the default): every worker connects to group rank 0's. */
	int worker_store_proxy;
	/* etcd (RDZV_ETCD_KEYS): copied into its etcd_conf by c10d.c. */
	int etcd_https; /* protocol: 1 https, 0 http, -1 unset (the endpoints' scheme) */
	char etcd_cacert[RDZV_CONF_PATH_MAX];
	char etcd_cert[RDZV_CONF_PATH_MAX];
	char etcd_key[RDZV_CONF_PATH_MAX];
	char etcd_prefix[256];
	char etcd_username[128];
	char etcd_password_file[RDZV_CONF_PATH_MAX];
};

/* The rules between keys (lease_ttl not below heartbeat_interval; etcd's
 * cert with key, username with password_file): 0, or CRUN_EINVAL with err
 * naming them. Typed: the text was parsed above (agent/cli_rdzv.c). */
int c10d_conf_check(const struct c10d_conf *c, char *err, size_t cap);

/* One agent's join of the next round, run synchronously on the calling
 * thread (what the agent's helper thread does): for benchmarks and tests
 * that drive many rendezvous clients in one process. */
struct c10d_join_args {
	const char *host; /* rendezvous store */
	uint16_t port;
	const char *run_id;
	struct c10d_conf conf;
	int min, max, nproc;
	int prev_round, prev_grank; /* -1, -1 for a first join */
	uint16_t wport;		    /* this agent's worker store port */
	const char *addr, *hostname;
	/* take a lease on the join's own handle (in-memory tests of liveness,
	 * coord_mem_leases); *ret_lease then receives its id */
	bool lease_on_handle;
	uint64_t *ret_lease;
	const struct etcd_conf *etcd; /* non-NULL: rounds on etcd (host/port unused) */
};
int c10d_join_blocking(const struct c10d_join_args *a, struct rdzv_info *ret_info, int *ret_round,
		       char *err, size_t cap);
/* The same on an open coordination handle (coord.h; e.g. in-memory). A spare
 * whose job ended returns CRUN_ERDZVCLOSED. */
struct coord;
int c10d_join_on(struct coord *c, const struct c10d_join_args *a, struct rdzv_info *ret_info,
		 int *ret_round, char *err, size_t cap);

/* c10d_peers.c. The address field of a node record into out: 0,
 * CRUN_EPROTO (not a record) or CRUN_ETOOBIG. Pure. */
int c10d_record_addr(const char *rec, char *out, size_t cap);
/* Reads the node records of round rd's members and resolves their
 * addresses: *ret (malloc'd) is "a b ...", every address of every node.
 * Blocking. */
struct round_closed;
int c10d_read_peer_addrs(struct coord *c, int rd, const struct round_closed *rc, uint32_t read_ms,
			 char **ret);

#endif /* CRUN_RENDEZVOUS_C10D_H */
