/* rdzv_int.h: the backend table behind the rendezvous front door (rdzv.c,
 * rdzv.h), as worker_sdk/backend_int.h is behind a process group. rdzv.c
 * picks a backend by name and drives it only through this table; static.c
 * (fixed node ranks, --standalone) and c10d.c (elastic rounds on the crun
 * store or on etcd, through coord.h) implement it. Every call is made on the
 * agent's loop thread.
 */
#ifndef CRUN_RENDEZVOUS_RDZV_INT_H
#define CRUN_RENDEZVOUS_RDZV_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "rendezvous/rdzv.h"

struct rdzv_backend;

/* The first member of every backend's state: a backend's struct starts with
 * it, so the front door holds one pointer and the backend casts it back. */
struct rdzv {
	const struct rdzv_backend *ops;
};

/* One backend. The operations have the contract of the rdzv_* function of
 * the same name in rdzv.h; those marked optional may be NULL, and the front
 * door then answers what a backend without that feature means. */
struct rdzv_backend {
	const char *name;
	/* rdzv_new: builds the backend's state (the front door sets ops). */
	int (*create)(const struct rdzv_params *p, struct rdzv **ret);
	void (*free)(struct rdzv *r); /* half-built state OK */
	int (*store_to_serve)(const struct rdzv *r, const char **ret_host, uint16_t *ret_port);
	void (*set_served_port)(struct rdzv *r, uint16_t port);
	int (*next_round)(struct rdzv *r);
	const struct rdzv_info *(*info)(const struct rdzv *r);
	int (*exit_barrier)(struct rdzv *r);
	int (*barrier_result)(const struct rdzv *r);
	int (*close_failed)(struct rdzv *r, const char *why);
	enum rdzv_change (*change_kind)(const struct rdzv *r);
	const char *(*last_error)(const struct rdzv *r);
	/* Optional: NULL means false, NULL, "no progress record", or
	 * CRUN_ERDZVCLOSED. */
	bool (*clears_store)(const struct rdzv *r);
	const char *(*peer_addrs)(const struct rdzv *r);
	const struct store_server *(*served_store)(const struct rdzv *r);
	bool (*worker_store_proxy)(const struct rdzv *r);
	void (*get_progress)(const struct rdzv *r, struct rdzv_progress *ret);
	int (*failure)(const struct rdzv *r);
	int (*stacks_gather)(struct rdzv *r, const char *why, uint32_t wait_ms, rdzv_gather_fn fn,
			     void *arg);
};

extern const struct rdzv_backend rdzv_static_backend; /* static.c */
extern const struct rdzv_backend rdzv_c10d_backend;   /* c10d.c: "c10d" and "etcd" */

#endif /* CRUN_RENDEZVOUS_RDZV_INT_H */
