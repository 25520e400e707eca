/* coord.h: the small coordination interface the c10d rendezvous algorithm
 * (c10d.c) is written against, so that other stores (etcd) can implement the
 * same operations later. Every call blocks (deadline-bounded) and is made from
 * a rendezvous helper thread, never from the agent's loop. A handle is used by
 * one thread at a time.
 *
 * Liveness ("lease"): a lease has a TTL and is kept alive by its holder; when
 * it lapses, or the holder's connection closes, the coordination service sets
 * the lease's expiry key so every waiter on it wakes. coord_store.c maps it
 * onto crun's store extension (store/store_ext.h: LEASE_GRANT, KEEPALIVE,
 * REVOKE). Against a store without the extension, callers fall back to
 * heartbeat counters (coord_heartbeat/coord_heartbeat_peek): the holder bumps
 * "<name>/hb", a watcher that sees it stand still for a TTL sets the expiry
 * key on the holder's behalf.
 */
#ifndef CRUN_RENDEZVOUS_COORD_H
#define CRUN_RENDEZVOUS_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct coord;
struct etcd_conf;

struct coord_opts {
	const char *host;
	uint16_t port;
	const char *prefix; /* every key lives under it */
	uint32_t connect_timeout_ms;
	uint32_t timeout_ms;			 /* default op deadline */
	const char *auth_secret_file;		 /* NULL: no authentication (store/auth.h) */
	const char *auth_job;			 /* the run id the connection speaks for */
	const char *tls_ca, *tls_cert, *tls_key; /* NULL tls_ca: plaintext */
	int tls_min_version;			 /* 12 or 13 (0 = 13) */
	/* Non-NULL: the etcd v3 cluster it describes (etcd_int.h, borrowed)
	 * instead of the crun store at host:port. Same contracts, with these
	 * differences: a lease ends only by its TTL or revoke (closing the
	 * handle ends its leases as an expiry would); a lapsed lease's expiry
	 * key is written by the first reader after the lapse (coord_etcd.c). */
	const struct etcd_conf *etcd;
	/* Reporting (issue 22): with say_retry, a first failed attempt to
	 * reach the store or cluster is logged at WARN at once ("cannot reach
	 * H:P: connection refused; retrying for N s"), and a name that does not
	 * resolve is retried like a refused connection. err (NULL: not
	 * wanted): on failure, what the last attempt got, naming the endpoint
	 * and the error. */
	bool say_retry;
	char *err;
	size_t err_cap;
};

/* 0 and *ret_c, or the store client's (crun/store.h) or etcd's code; with
 * o->err, its text. */
int coord_open(const struct coord_opts *o, struct coord **ret_c);

/* In-memory coordination shared by handles of one process (no sockets; no
 * leases, CRUN_ENOTSUP, unless coord_mem_leases() turned them on), for unit
 * tests of the round algorithm. */
struct coord_mem;
int coord_mem_new(struct coord_mem **ret);
void coord_mem_free(struct coord_mem *m); /* after every handle is closed */
uint64_t coord_mem_ops(struct coord_mem *m);
/* Value bytes its handles have read (get, multi_get, compare_set's answer). */
uint64_t coord_mem_read_bytes(struct coord_mem *m);
/* In-memory leases, for tests of liveness without sockets: after
 * coord_mem_leases(m, true), lease calls on m's handles succeed (TTL not
 * enforced) and coord_mem_expire(m, id) ends lease id as an expiry would:
 * its keys are deleted and its expiry key is set unless it exists. 0, or
 * CRUN_ENOTFOUND for an unknown or ended lease. */
void coord_mem_leases(struct coord_mem *m, bool on);
int coord_mem_expire(struct coord_mem *m, uint64_t id);
/* The next n leases granted on m lapse at once, as if each holder stalled
 * past the TTL between the grant and its first use. */
void coord_mem_lapse_grants(struct coord_mem *m, int n);
/* A slow store with a TTL counted in operations, for tests of lease upkeep
 * without wall-clock asserts: every operation on m takes at least op_us
 * (under m's lock), and a lease lapses once the handle that took it made
 * lease_ops operations without keeping it alive. 0, 0: off. */
void coord_mem_slow(struct coord_mem *m, uint32_t op_us, uint64_t lease_ops);
/* m answers coord_exists_each with CRUN_ENOTSUP, as a store older than
 * extension version 4 does: the callers' key-by-key fallbacks run. */
void coord_mem_old_store(struct coord_mem *m);
int coord_open_mem(struct coord_mem *m, const char *prefix, struct coord **ret_c);
void coord_close(struct coord *c);
const char *coord_last_error(const struct coord *c);

int coord_add(struct coord *c, const char *key, int64_t delta, int64_t *ret_value);
int coord_set(struct coord *c, const char *key, const char *val);
/* Waits up to timeout_ms for the key; *ret_val is malloc'd and NUL-terminated. */
int coord_get(struct coord *c, const char *key, uint32_t timeout_ms, char **ret_val);
/* Non-blocking: CRUN_ENOTFOUND when absent. Only for keys never deleted
 * once written (no leased key): the crun store looks, then reads without
 * waiting (coord_get_now). */
int coord_try_get(struct coord *c, const char *key, char **ret_val);
/* One read of a key known to be present and never deleted (seen by a wait,
 * or written before one that was): no WAIT before the GET. */
int coord_get_now(struct coord *c, const char *key, char **ret_val);
/* Waits for every key, then reads them all in one round trip. */
int coord_multi_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		    char **ret_vals);
/* Sets n keys in one request (etcd: one txn per 64); not atomic. */
int coord_multi_set(struct coord *c, const char *const *keys, const char *const *vals, size_t n);
/* Sets desired if the key holds expected ("" = absent); *ret_cur (malloc'd)
 * receives the value now stored. */
int coord_compare_set(struct coord *c, const char *key, const char *expected, const char *desired,
		      char **ret_cur);
/* Waits until the key exists: 0, or CRUN_ETIMEDOUT (the handle stays usable). */
int coord_wait(struct coord *c, const char *key, uint32_t timeout_ms);
/* 1 when the key exists, 0 when not. */
int coord_exists(struct coord *c, const char *key);
/* 1 when every key exists, 0 when one does not: one round trip on the crun
 * store (CHECK of n keys), never waiting. */
int coord_exists_all(struct coord *c, const char *const *keys, size_t n);
/* The values of n keys (malloc'd; "" for an absent key: only for keys never
 * set to "") in one round trip that never waits, on a crun store of
 * extension version 4 (and in memory); CRUN_ENOTSUP elsewhere: the caller
 * asks key by key. coord_exists_each: ret[i] = whether keys[i] exists. */
int coord_multi_get_now(struct coord *c, const char *const *keys, size_t n, char **ret_vals);
int coord_exists_each(struct coord *c, const char *const *keys, size_t n, bool *ret);
/* Waits up to timeout_ms until any of keys[0..n) exists (n <= COORD_ANY_MAX):
 * the index of one that does (the lowest, when several already did), or
 * CRUN_ETIMEDOUT (the handle stays usable). One request on the crun store
 * (WAIT_ANY), one watch stream on etcd; a store without WAIT_ANY (PyTorch's)
 * gets a poll every COORD_ANY_POLL_MS instead. This is how a waiter sleeps
 * until whichever of several events comes first; pass only keys not yet
 * seen (a present key answers at once). */
#define COORD_ANY_MAX	  16
#define COORD_ANY_POLL_MS 250
int coord_wait_any(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms);

/* coord_wait_any that also reads the value of the key it reports into
 * *ret_val (malloc'd), and keeps lease `keep` (0: none; held by this
 * handle) alive: one request on a crun store of extension version 4
 * (WAIT_ANY_GET, timed out by the store: no cancel), a keep-alive, a wait
 * and a read elsewhere. Only for keys never deleted once written. */
int coord_wait_any_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		       uint64_t keep, char **ret_val);
/* coord_wait_any_get that also reads with_key when keys[0] woke it: into
 * *ret_with (malloc'd; NULL when absent or when another key woke it). The
 * same one request on a crun store of extension version 5
 * (WAIT_ANY_GET_WITH), plus a read of with_key elsewhere. */
int coord_wait_any_get_with(struct coord *c, const char *const *keys, size_t n,
			    const char *with_key, uint32_t timeout_ms, uint64_t keep,
			    char **ret_val, char **ret_with);
/* A ticket and its record: *ret_t = the counter after adding 1, and key
 * <prefix><t> set to val. One request on a crun store of extension version
 * 4 (TICKET), an add then a set elsewhere (not atomic there: a holder that
 * dies between them leaves a ticket without its record, as before). */
int coord_ticket(struct coord *c, const char *counter, const char *prefix, const char *val,
		 int64_t *ret_t);

/* Leases (see the file comment): granted on this handle's connection; on
 * expiry expiry_key is set to `why`. CRUN_ENOTSUP (and the handle is
 * unusable) when the store lacks leases. */
int coord_lease_grant(struct coord *c, uint32_t ttl_ms, const char *expiry_key, const char *why,
		      uint64_t *ret_id);
/* CRUN_ENOTFOUND when the lease already ended. */
int coord_lease_keepalive(struct coord *c, uint64_t id);
int coord_lease_revoke(struct coord *c, uint64_t id);
/* Ephemeral key: sets key to val under lease `id`; the key is deleted when
 * the lease ends (expiry, revoke, or its holder lost for longer than the
 * TTL). This is how the round algorithm tells a live member from a dead one
 * without asking it: "r<r>/alive/<t>" exists exactly while ticket t's lease
 * does. CRUN_ENOTFOUND when the lease already ended, CRUN_ENOTSUP without
 * leases. A backend may implement it as its native put-with-lease (etcd). */
int coord_put_leased(struct coord *c, uint64_t id, const char *key, const char *val);

/* coord_lease_grant, then coord_put_leased of key under the new lease: one
 * request on a crun store of extension version 4 (GRANT_SET: the lease
 * cannot lapse between the two), two elsewhere. CRUN_ENOTFOUND (*ret_id
 * set) when the lease lapsed before the put; CRUN_ENOTSUP as
 * coord_lease_grant. */
int coord_lease_grant_put(struct coord *c, uint32_t ttl_ms, const char *expiry_key, const char *why,
			  const char *key, const char *val, uint64_t *ret_id);

/* Heartbeat fallback. `name` identifies the holder's liveness record. */
int coord_heartbeat(struct coord *c, const char *name);
/* *ret_counter: the peer's heartbeat counter (0 when it never beat). */
int coord_heartbeat_peek(struct coord *c, const char *name, int64_t *ret_counter);
/* Marks a peer dead: sets expiry_key to `why` unless set. */
int coord_expire(struct coord *c, const char *expiry_key, const char *why);

/* Watch: waits (up to timeout_ms) for the key to appear; 0 when it did,
 * CRUN_ETIMEDOUT when not. Same as coord_wait; named for the interface. */
int coord_watch(struct coord *c, const char *key, uint32_t timeout_ms);

#endif /* CRUN_RENDEZVOUS_COORD_H */
