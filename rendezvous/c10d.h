/* c10d.h: the c10d rendezvous backend behind rdzv.h (static.c dispatches to
 * it), plus rdzv_conf parsing and a blocking join for tests and benchmarks.
 * The round algorithm's pure core is round_int.h.
 */
#ifndef CRUN_RENDEZVOUS_C10D_H
#define CRUN_RENDEZVOUS_C10D_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/rdzv.h"
#include "store/server.h"

struct c10d;
struct etcd_conf;

struct c10d_conf {
	uint32_t join_ms;      /* join_timeout: a round must complete within it */
	uint32_t last_call_ms; /* last_call_timeout: wait after MIN for more nodes */
	uint32_t close_ms;     /* close_timeout: how long the host waits for acks */
	uint32_t read_ms;      /* read_timeout: one store operation */
	uint32_t hb_ms;	       /* heartbeat_interval */
	uint32_t ttl_ms;       /* lease_ttl */
	int is_host;	       /* -1 auto (endpoint local), 0, 1 */
	/* store_<tunable>=N keys (store_max_keys=..., the names of crun-rdzvd's
	 * limit flags): the limits of the store this host serves. */
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
	bool worker_store_proxy;
};

/* Parses torchrun's rdzv_conf ("k=v,...", seconds) over the defaults. 0, or
 * CRUN_EINVAL with err naming the key. */
int c10d_parse_conf(const char *s, struct c10d_conf *ret, char *err, size_t cap);

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

int c10d_new(const struct rdzv_params *p, struct c10d **ret);
void c10d_free(struct c10d *c);
int c10d_store_to_serve(const struct c10d *c, const char **ret_host, uint16_t *ret_port);
void c10d_set_served_port(struct c10d *c, uint16_t port);
int c10d_next_round(struct c10d *c);
const struct rdzv_info *c10d_info(const struct c10d *c);
/* Numeric addresses of the last round's nodes, space separated, when this
 * agent is group rank 0 (its worker store is the round's); NULL otherwise. */
const char *c10d_peer_addrs(const struct c10d *c);
/* The rendezvous store served in-process (is_host), or NULL; borrowed. */
const struct store_server *c10d_served_store(const struct c10d *c);
/* rdzv_conf worker_store=proxy was given. */
bool c10d_worker_store_proxy(const struct c10d *c);
void c10d_get_progress(const struct c10d *c, struct rdzv_progress *ret);

/* c10d_peers.c. The address field of a node record into out: 0,
 * CRUN_EPROTO (not a record) or CRUN_ETOOBIG. Pure. */
int c10d_record_addr(const char *rec, char *out, size_t cap);
/* Reads the node records of round rd's members and resolves their
 * addresses: *ret (malloc'd) is "a b ...", every address of every node.
 * Blocking. */
struct round_closed;
int c10d_read_peer_addrs(struct coord *c, int rd, const struct round_closed *rc, uint32_t read_ms,
			 char **ret);
int c10d_exit_barrier(struct c10d *c);
int c10d_barrier_result(const struct c10d *c);
int c10d_close_failed(struct c10d *c, const char *why);
enum rdzv_change c10d_change_kind(const struct c10d *c);
const char *c10d_last_error(const struct c10d *c);
int c10d_failure(const struct c10d *c); /* rdzv_failure() */

#endif /* CRUN_RENDEZVOUS_C10D_H */
