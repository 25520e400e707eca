/* coord.h: the small coordination interface the c10d rendezvous algorithm
 * (c10d.c) is written against, so that other stores (etcd) can implement the
 * same operations later. Every call blocks (deadline-bounded) and is made from
 * a rendezvous helper thread, never from the agent's loop. A handle is used by
 * one thread at a time.
 *
 * Liveness ("lease"): a lease has a TTL and is kept alive by its holder; when
 * it lapses the coordination service must set the lease's expiry key so every
 * waiter on it wakes. coord_store.c implements it over crun's store client
 * with heartbeat counters (the holder bumps "<name>/hb"; a watcher that sees
 * the counter stand still for a TTL sets the expiry key on the holder's
 * behalf): the server-side lease op codes of the store extension are not
 * wired into the server yet.
 */
#ifndef CRUN_RENDEZVOUS_COORD_H
#define CRUN_RENDEZVOUS_COORD_H

#include <stddef.h>
#include <stdint.h>

struct coord;

struct coord_opts {
	const char *host;
	uint16_t port;
	const char *prefix; /* every key lives under it */
	uint32_t connect_timeout_ms;
	uint32_t timeout_ms; /* default op deadline */
};

int coord_open(const struct coord_opts *o, struct coord **ret_c);
void coord_close(struct coord *c);
const char *coord_last_error(const struct coord *c);

int coord_add(struct coord *c, const char *key, int64_t delta, int64_t *ret_value);
int coord_set(struct coord *c, const char *key, const char *val);
/* Waits up to timeout_ms for the key; *ret_val is malloc'd and NUL-terminated. */
int coord_get(struct coord *c, const char *key, uint32_t timeout_ms, char **ret_val);
/* Non-blocking: CRUN_ENOTFOUND when absent. */
int coord_try_get(struct coord *c, const char *key, char **ret_val);
/* Waits for every key, then reads them all in one round trip. */
int coord_multi_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		    char **ret_vals);
/* Sets desired if the key holds expected ("" = absent); *ret_cur (malloc'd)
 * receives the value now stored. */
int coord_compare_set(struct coord *c, const char *key, const char *expected, const char *desired,
		      char **ret_cur);
/* Waits until the key exists: 0, or CRUN_ETIMEDOUT (the handle stays usable). */
int coord_wait(struct coord *c, const char *key, uint32_t timeout_ms);
/* 1 when the key exists, 0 when not. */
int coord_exists(struct coord *c, const char *key);

/* Leases (see the file comment). `name` identifies the holder's liveness
 * record; expiry_key is set by whoever sees the lease lapse. */
int coord_lease_keepalive(struct coord *c, const char *name);
/* Checks a peer's lease: *ret_counter is its keep-alive counter (0 when it
 * never kept alive). The caller decides staleness against its TTL. */
int coord_lease_peek(struct coord *c, const char *name, int64_t *ret_counter);
/* Marks the peer's lease expired: sets expiry_key to `why` unless set. */
int coord_lease_expire(struct coord *c, const char *expiry_key, const char *why);

/* Watch: waits (up to timeout_ms) for the key to appear; 0 when it did,
 * CRUN_ETIMEDOUT when not. Same as coord_wait; named for the interface. */
int coord_watch(struct coord *c, const char *key, uint32_t timeout_ms);

#endif /* CRUN_RENDEZVOUS_COORD_H */
