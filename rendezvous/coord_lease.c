/* coord_lease.c: the coordination interface's (coord.h) waits on several
 * keys (WAIT_ANY and its GET forms, polled on a store without them),
 * tickets, leases, watches, heartbeats and expiry keys, over crun's store,
 * etcd (coord_etcd.c) or the in-memory store, whose leases (TTL in
 * operations, for unit tests) are here too. Split out of coord_store.c,
 * which keeps the handle and the plain key operations.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "crun/store.h"
#include "rendezvous/coord.h"
#include "rendezvous/coord_int.h"
#include "rendezvous/etcd_int.h"
#include "store/store_ext.h"

/* ---- the in-memory store's leases ------------------------------------------ */

void coord_mem_leases(struct coord_mem *m, bool on)
{
	pthread_mutex_lock(&m->mu);
	m->leases_on = on;
	pthread_mutex_unlock(&m->mu);
}

/* Locked: the live lease id, or NULL. */
static struct mlease **mlease_find(struct coord_mem *m, uint64_t id)
{
	for (struct mlease **l = &m->leases; *l; l = &(*l)->next)
		if ((*l)->id == id)
			return l;
	return NULL;
}

/* Locked: ends lease id; its keys go, its expiry key is set when `expire`. */
static int mlease_end(struct coord_mem *m, uint64_t id, bool expire)
{
	struct mlease **lp = mlease_find(m, id), *l;

	if (!lp)
		return CRUN_ENOTFOUND;
	l = *lp;
	*lp = l->next;
	for (struct mkv **e = &m->head; *e;) {
		struct mkv *x = *e;

		if (x->lease != id) {
			e = &x->next;
			continue;
		}
		*e = x->next;
		free(x->key);
		free(x->val);
		free(x);
	}
	if (expire && l->expiry_key[0]) {
		struct coord raw = {.mem = m}; /* empty prefix: the key is full */

		if (!coord_mfind(&raw, l->expiry_key))
			(void)coord_mput(&raw, l->expiry_key, l->why);
	}
	pthread_cond_broadcast(&m->cv);
	free(l->expiry_key);
	free(l->why);
	free(l);
	return 0;
}

/* Locked: counts one operation of handle c; under coord_mem_slow it lasts
 * op_us and lapses c's leases not kept alive within lease_ops of c's
 * operations (a holder busy that long, whatever the others do). */
void coord_mem_tick(struct coord *c)
{
	struct coord_mem *m = c->mem;

	m->ops++;
	c->mem_ops++;
	if (m->op_us)
		usleep(m->op_us);
	for (struct mlease *l = m->leases; m->lease_ops && l;) {
		struct mlease *next = l->next;

		if (l->owner == c->mem_id && c->mem_ops - l->kept > m->lease_ops)
			(void)mlease_end(m, l->id, true);
		l = next;
	}
}

void coord_mem_slow(struct coord_mem *m, uint32_t op_us, uint64_t lease_ops)
{
	pthread_mutex_lock(&m->mu);
	m->op_us = op_us;
	m->lease_ops = lease_ops;
	pthread_mutex_unlock(&m->mu);
}

int coord_mem_expire(struct coord_mem *m, uint64_t id)
{
	int r;

	pthread_mutex_lock(&m->mu);
	r = mlease_end(m, id, true);
	pthread_mutex_unlock(&m->mu);
	return r;
}

void coord_mem_old_store(struct coord_mem *m)
{
	pthread_mutex_lock(&m->mu);
	m->old_store = true;
	pthread_mutex_unlock(&m->mu);
}

void coord_mem_lapse_grants(struct coord_mem *m, int n)
{
	pthread_mutex_lock(&m->mu);
	m->lapse_grants = n;
	pthread_mutex_unlock(&m->mu);
}

static int mem_grant(struct coord *c, const char *expiry_key, const char *why, uint64_t *ret)
{
	struct coord_mem *m = c->mem;
	struct mlease *l;
	size_t kl = strlen(c->prefix) + strlen(expiry_key) + 1;
	int r = CRUN_ENOMEM;

	pthread_mutex_lock(&m->mu);
	coord_mem_tick(c);
	if (!m->leases_on) {
		pthread_mutex_unlock(&m->mu);
		return CRUN_ENOTSUP;
	}
	l = calloc(1, sizeof(*l));
	if (l)
		l->expiry_key = malloc(kl);
	if (l && l->expiry_key && (l->why = str_dup(why)) != NULL) {
		snprintf(l->expiry_key, kl, "%s%s", expiry_key[0] ? c->prefix : "", expiry_key);
		l->id = ++m->next_lease;
		l->owner = c->mem_id;
		l->kept = c->mem_ops;
		l->next = m->leases;
		m->leases = l;
		*ret = l->id;
		r = 0;
		if (m->lapse_grants > 0) { /* its holder stalled past the TTL */
			m->lapse_grants--;
			(void)mlease_end(m, l->id, true);
		}
	} else if (l) {
		free(l->expiry_key);
		free(l);
	}
	pthread_mutex_unlock(&m->mu);
	return r;
}

static int mem_put_leased(struct coord *c, uint64_t id, const char *key, const char *val)
{
	struct coord_mem *m = c->mem;
	int r;

	pthread_mutex_lock(&m->mu);
	coord_mem_tick(c);
	if (!m->leases_on)
		r = CRUN_ENOTSUP;
	else if (!mlease_find(m, id))
		r = CRUN_ENOTFOUND;
	else
		r = coord_mput(c, key, val);
	if (r == 0)
		coord_mfind(c, key)->lease = id;
	pthread_mutex_unlock(&m->mu);
	return r;
}

/* keepalive (expire = false, nothing to do but check) or revoke. */
static int mem_lease_op(struct coord *c, uint64_t id, bool revoke)
{
	struct coord_mem *m = c->mem;
	int r = 0;

	pthread_mutex_lock(&m->mu);
	coord_mem_tick(c);
	if (!m->leases_on)
		r = CRUN_ENOTSUP;
	else if (revoke)
		r = mlease_end(m, id, false);
	else if (mlease_find(m, id))
		(*mlease_find(m, id))->kept = c->mem_ops;
	else
		r = CRUN_ENOTFOUND;
	pthread_mutex_unlock(&m->mu);
	return r;
}

/* ---- waits on several keys, tickets, leases ------------------------------- */

/* Locked: the index of the first of keys that exists, or -1. */
static int mfind_any(struct coord *c, const char *const *keys, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (coord_mfind(c, keys[i]))
			return (int)i;
	return -1;
}

static int mem_wait_any(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms)
{
	struct timespec ts = clock_monotonic_in(timeout_ms);
	int r;

	pthread_mutex_lock(&c->mem->mu);
	coord_mem_tick(c);
	while ((r = mfind_any(c, keys, n)) < 0)
		if (pthread_cond_timedwait(&c->mem->cv, &c->mem->mu, &ts) == ETIMEDOUT &&
		    (r = mfind_any(c, keys, n)) < 0) {
			r = CRUN_ETIMEDOUT;
			break;
		}
	pthread_mutex_unlock(&c->mem->mu);
	return r;
}

/* A store without WAIT_ANY: look at each key, wait on the first a while. */
static int poll_any(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms)
{
	uint64_t deadline = clock_now_ms() + timeout_ms;

	for (int i = 0; i < 1 << 30; i++) {
		uint64_t now = clock_now_ms();
		int r;

		for (size_t k = 0; k < n; k++) {
			r = coord_exists(c, keys[k]);
			if (r != 0)
				return r < 0 ? r : (int)k;
		}
		if (now >= deadline)
			return CRUN_ETIMEDOUT;
		r = coord_wait(c, keys[0], (uint32_t)MIN(COORD_ANY_POLL_MS, deadline - now));
		if (r != CRUN_ETIMEDOUT)
			return r < 0 ? r : 0;
	}
	return CRUN_ETIMEDOUT;
}

int coord_wait_any(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms)
{
	size_t idx;
	int r;

	if (!keys || n == 0 || n > COORD_ANY_MAX)
		return CRUN_EINVAL;
	timeout_ms = timeout_ms ? timeout_ms : 1;
	if (c->etcd)
		return etcd_wait_any(c->etcd, keys, n, timeout_ms);
	if (c->mem)
		return mem_wait_any(c, keys, n, timeout_ms);
	if (!c->no_any) {
		r = store_client_wait_any(c->s, keys, n, timeout_ms, &idx);
		if (r == 0)
			return (int)idx;
		if (r == CRUN_ETIMEDOUT)
			return r;
		if (r != CRUN_ENOTSUP)
			return coord_fail(c, r, "wait_any", keys[0]);
		c->no_any = true;
	}
	return poll_any(c, keys, n, timeout_ms);
}

int coord_wait_any_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		       uint64_t keep, char **ret_val)
{
	void *v = NULL;
	size_t idx;
	int r;

	if (!c->etcd && !c->mem && !c->no_any && !c->no_fold) {
		if (!keys || n == 0 || n > COORD_ANY_MAX)
			return CRUN_EINVAL;
		r = store_client_wait_any_get(c->s, keys, n, timeout_ms ? timeout_ms : 1, keep,
					      &idx, &v, NULL);
		if (r == 0) {
			*ret_val = v;
			return (int)idx;
		}
		if (r == CRUN_ETIMEDOUT)
			return r;
		if (!coord_fold_missing(c, r))
			return coord_fail(c, r, "wait_any_get", keys[0]);
	}
	if (keep)
		(void)coord_lease_keepalive(c, keep); /* as the folded one: result unseen */
	r = coord_wait_any(c, keys, n, timeout_ms);
	if (r >= 0 && coord_get_now(c, keys[r], ret_val) < 0)
		return CRUN_EPROTO;
	return r;
}

int coord_wait_any_get_with(struct coord *c, const char *const *keys, size_t n,
			    const char *with_key, uint32_t timeout_ms, uint64_t keep,
			    char **ret_val, char **ret_with)
{
	void *v = NULL, *w = NULL;
	char *val = NULL, *with = NULL;
	size_t idx;
	int r;

	if (!c->etcd && !c->mem && !c->no_any && !c->no_fold && !c->no_with) {
		if (!keys || !with_key || n == 0 || n > COORD_ANY_MAX)
			return CRUN_EINVAL;
		r = store_client_wait_any_get_with(c->s, keys, n, with_key,
						   timeout_ms ? timeout_ms : 1, keep, &idx, &v, &w);
		if (r == 0) {
			if (idx != 0) { /* another key woke it: with_key was not read for it */
				free(w);
				w = NULL;
			}
			*ret_val = v;
			*ret_with = w;
			return (int)idx;
		}
		if (r == CRUN_ETIMEDOUT)
			return r;
		if (r != CRUN_ENOTSUP)
			return coord_fail(c, r, "wait_any_get_with", keys[0]);
		c->no_with = true; /* a version-4 store: its WAIT_ANY_GET, then a read */
	}
	r = coord_wait_any_get(c, keys, n, timeout_ms, keep, &val);
	if (r < 0)
		return r;
	if (r == 0) {
		int t = coord_try_get(c, with_key, &with);

		if (t < 0 && t != CRUN_ENOTFOUND) {
			crun_free(val);
			return t;
		}
	}
	*ret_val = val;
	*ret_with = with;
	return r;
}

int coord_ticket(struct coord *c, const char *counter, const char *prefix, const char *val,
		 int64_t *ret_t)
{
	char key[512];
	int r;

	if (!c->etcd && !c->mem && !c->no_fold) {
		r = store_client_ticket(c->s, counter, prefix, val, strlen(val), ret_t);
		if (!coord_fold_missing(c, r))
			return r < 0 ? coord_fail(c, r, "ticket", counter) : 0;
	}
	TRY(coord_add(c, counter, 1, ret_t));
	TRY(str_printf(key, sizeof(key), "%s%" PRId64, prefix, *ret_t));
	return coord_set(c, key, val);
}

int coord_lease_grant_put(struct coord *c, uint32_t ttl_ms, const char *expiry_key, const char *why,
			  const char *key, const char *val, uint64_t *ret_id)
{
	int r;

	if (!c->etcd && !c->mem && !c->no_fold) {
		r = store_client_grant_set(c->s, ttl_ms, expiry_key, why, strlen(why), key, val,
					   strlen(val), ret_id);
		if (r == CRUN_ECLOSED || r == CRUN_EPROTO) {
			coord_fail(c, r, "grant_set", expiry_key);
			return CRUN_ENOTSUP; /* no extension at all, as coord_lease_grant */
		}
		if (!coord_fold_missing(c, r))
			return r < 0 ? coord_fail(c, r, "grant_set", key) : 0;
	}
	TRY(coord_lease_grant(c, ttl_ms, expiry_key, why, ret_id));
	return coord_put_leased(c, *ret_id, key, val);
}

int coord_watch(struct coord *c, const char *key, uint32_t timeout_ms)
{
	return coord_wait(c, key, timeout_ms);
}

int coord_lease_grant(struct coord *c, uint32_t ttl_ms, const char *expiry_key, const char *why,
		      uint64_t *ret_id)
{
	int r;

	if (c->etcd)
		return etcd_lease_grant(c->etcd, ttl_ms, expiry_key, why, ret_id);
	if (c->mem)
		return mem_grant(c, expiry_key, why, ret_id);
	r = crun_store_lease_grant(c->s, ttl_ms, expiry_key, why, strlen(why), ret_id);

	if (r == CRUN_ECLOSED || r == CRUN_EPROTO) {
		coord_fail(c, r, "lease_grant", expiry_key);
		return CRUN_ENOTSUP;
	}
	return r < 0 ? coord_fail(c, r, "lease_grant", expiry_key) : 0;
}

int coord_lease_keepalive(struct coord *c, uint64_t id)
{
	int r;

	if (c->etcd)
		return etcd_lease_keepalive(c->etcd, id);
	if (c->mem)
		return mem_lease_op(c, id, false);
	r = crun_store_lease_keepalive(c->s, id);

	return r < 0 && r != CRUN_ENOTFOUND ? coord_fail(c, r, "lease_keepalive", "") : r;
}

int coord_lease_revoke(struct coord *c, uint64_t id)
{
	int r;

	if (c->etcd)
		return etcd_lease_revoke(c->etcd, id);
	if (c->mem)
		return mem_lease_op(c, id, true);
	r = crun_store_lease_revoke(c->s, id);

	return r < 0 && r != CRUN_ENOTFOUND ? coord_fail(c, r, "lease_revoke", "") : r;
}

int coord_put_leased(struct coord *c, uint64_t id, const char *key, const char *val)
{
	int r;

	if (c->etcd)
		return etcd_put_leased(c->etcd, id, key, val);
	if (c->mem)
		return mem_put_leased(c, id, key, val);
	r = crun_store_set_leased(c->s, id, key, val, strlen(val));
	return r < 0 && r != CRUN_ENOTFOUND ? coord_fail(c, r, "set_leased", key) : r;
}

int coord_heartbeat(struct coord *c, const char *name)
{
	char key[512];

	TRY(str_printf(key, sizeof(key), "%s/hb", name));
	return coord_add(c, key, 1, NULL);
}

int coord_heartbeat_peek(struct coord *c, const char *name, int64_t *ret_counter)
{
	char key[512];

	TRY(str_printf(key, sizeof(key), "%s/hb", name));
	return coord_add(c, key, 0, ret_counter);
}

int coord_expire(struct coord *c, const char *expiry_key, const char *why)
{
	return coord_compare_set(c, expiry_key, "", why, NULL);
}
