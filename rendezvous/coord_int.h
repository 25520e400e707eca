/* coord_int.h: private to the coordination interface's store and
 * in-memory backends: coord_store.c (opening, closing, the plain key
 * operations) and coord_lease.c (waits on several keys, tickets, leases,
 * heartbeats, and the in-memory backend's leases). The handle and the
 * in-memory key list are shared by both.
 */
#ifndef CRUN_RENDEZVOUS_COORD_INT_H
#define CRUN_RENDEZVOUS_COORD_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "crun/store.h"
#include "rendezvous/coord.h"

/* In-memory coordination (coord_mem_*): a key list under one lock, WAIT as a
 * condition variable. No sockets: lets the round algorithm run in unit tests
 * with many "agents" as threads of one process. */
struct mkv {
	struct mkv *next;
	char *key, *val;
	uint64_t lease; /* 0: a plain key */
};

/* An in-memory lease: its expiry key (full, prefixed) and value. */
struct mlease {
	struct mlease *next;
	uint64_t id;
	uint64_t owner, kept; /* granting handle; its ops when granted or kept */
	char *expiry_key, *why;
};

struct coord_mem {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct mkv *head;
	struct mlease *leases;
	uint64_t ops, next_lease, next_handle;
	uint64_t read_bytes; /* value bytes handed to callers */
	int lapse_grants;    /* coord_mem_lapse_grants: leases still to lapse */
	uint32_t op_us;	     /* coord_mem_slow: each operation's least duration */
	uint64_t lease_ops;  /* coord_mem_slow: a lease's TTL, in operations */
	bool old_store;	     /* coord_mem_old_store: no coord_exists_each */
	bool leases_on;
};

struct coord {
	crun_store_t *s;
	struct coord_mem *mem;	  /* instead of s */
	struct etcd *etcd;	  /* instead of s: coord_etcd.c does the work */
	bool no_any;		  /* the store lacks WAIT_ANY: coord_wait_any polls */
	bool no_fold;		  /* the store's extension predates version 4: two requests */
	bool no_with;		  /* ...predates version 5: a wait, then a read */
	uint64_t mem_id, mem_ops; /* coord_mem: this handle, its operations */
	char prefix[320];
	char err[512];
};

/* Sets c's last error ("what 'key': reason - the store's detail") and
 * returns r. */
int coord_fail(struct coord *c, int r, const char *what, const char *key);
/* A version-4 op answered r: true when the store predates it (remembered). */
bool coord_fold_missing(struct coord *c, int r);
/* Locked: the entry of the prefixed key, or NULL. */
struct mkv *coord_mfind(struct coord *c, const char *key);
/* Locked: stores val under key; 0 or CRUN_ENOMEM. */
int coord_mput(struct coord *c, const char *key, const char *val);
/* Locked: counts one operation of handle c; under coord_mem_slow it lasts
 * op_us and lapses c's leases not kept alive within lease_ops of c's
 * operations (a holder busy that long, whatever the others do). */
void coord_mem_tick(struct coord *c);

#endif /* CRUN_RENDEZVOUS_COORD_INT_H */
