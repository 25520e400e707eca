/* coord_store.c: the coordination interface (coord.h) over crun's blocking
 * store client, talking to a crun store (an agent or crun-rdzvd) in the v2
 * dialect so that a timed-out WAIT is canceled and the connection stays
 * usable; or over etcd (coord_etcd.c) or an in-memory store for unit tests.
 * This file: opening and closing a handle and the plain key operations
 * (with the in-memory store's key list); waits on several keys, tickets,
 * leases and heartbeats are coord_lease.c's.
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

int coord_fail(struct coord *c, int r, const char *what, const char *key)
{
	snprintf(c->err, sizeof(c->err), "%s '%.200s': %s - %.240s", what, key, crun_strerror(r),
		 crun_store_last_error(c->s));
	return r;
}

int coord_mem_new(struct coord_mem **ret)
{
	struct coord_mem *m = calloc(1, sizeof(*m));
	int r;

	if (!m)
		return CRUN_ENOMEM;
	/* Waits run on the monotonic clock: a wall-clock step neither ends a
	 * wait early nor stretches it by the size of the step. */
	r = clock_cond_init(&m->cv);
	if (r < 0) {
		free(m);
		return r;
	}
	pthread_mutex_init(&m->mu, NULL);
	*ret = m;
	return 0;
}

void coord_mem_free(struct coord_mem *m)
{
	if (!m)
		return;
	while (m->head) {
		struct mkv *n = m->head->next;

		free(m->head->key);
		free(m->head->val);
		free(m->head);
		m->head = n;
	}
	while (m->leases) {
		struct mlease *n = m->leases->next;

		free(m->leases->expiry_key);
		free(m->leases->why);
		free(m->leases);
		m->leases = n;
	}
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

/* One of m's counters, read under its lock. */
static uint64_t mem_counter(struct coord_mem *m, const uint64_t *counter)
{
	uint64_t n;

	pthread_mutex_lock(&m->mu);
	n = *counter;
	pthread_mutex_unlock(&m->mu);
	return n;
}

uint64_t coord_mem_ops(struct coord_mem *m)
{
	return mem_counter(m, &m->ops);
}

uint64_t coord_mem_read_bytes(struct coord_mem *m)
{
	return mem_counter(m, &m->read_bytes);
}

int coord_open_mem(struct coord_mem *m, const char *prefix, struct coord **ret_c)
{
	struct coord *c = calloc(1, sizeof(*c));

	if (!c)
		return CRUN_ENOMEM;
	c->mem = m;
	pthread_mutex_lock(&m->mu);
	c->mem_id = ++m->next_handle;
	pthread_mutex_unlock(&m->mu);
	if (str_printf(c->prefix, sizeof(c->prefix), "%s/", prefix ? prefix : "") < 0) {
		free(c);
		return CRUN_ETOOBIG;
	}
	*ret_c = c;
	return 0;
}

/* Locked: the entry of the prefixed key, or NULL. */
struct mkv *coord_mfind(struct coord *c, const char *key)
{
	size_t pl = strlen(c->prefix);

	for (struct mkv *e = c->mem->head; e; e = e->next)
		if (strncmp(e->key, c->prefix, pl) == 0 && strcmp(e->key + pl, key) == 0)
			return e;
	return NULL;
}

/* Locked: stores val under key; 0 or CRUN_ENOMEM. */
int coord_mput(struct coord *c, const char *key, const char *val)
{
	struct mkv *e = coord_mfind(c, key);
	char *v = str_dup(val);

	if (!v)
		return CRUN_ENOMEM;
	if (!e) {
		size_t kl = strlen(c->prefix) + strlen(key) + 1;

		e = calloc(1, sizeof(*e));
		if (e)
			e->key = malloc(kl);
		if (!e || !e->key) {
			free(e);
			free(v);
			return CRUN_ENOMEM;
		}
		snprintf(e->key, kl, "%s%s", c->prefix, key);
		e->next = c->mem->head;
		c->mem->head = e;
	}
	free(e->val);
	e->val = v;
	pthread_cond_broadcast(&c->mem->cv);
	return 0;
}

/* Locked: waits until key exists or the deadline (0 = none) passes. */
static int mwait(struct coord *c, const char *key, uint32_t timeout_ms)
{
	struct timespec ts = clock_monotonic_in(timeout_ms);

	while (!coord_mfind(c, key))
		if (pthread_cond_timedwait(&c->mem->cv, &c->mem->mu, &ts) == ETIMEDOUT &&
		    !coord_mfind(c, key))
			return CRUN_ETIMEDOUT;
	return 0;
}

static int mem_add(struct coord *c, const char *key, int64_t delta, int64_t *ret)
{
	struct mkv *e;
	char buf[32];
	int64_t v = 0;
	int r;

	pthread_mutex_lock(&c->mem->mu);
	coord_mem_tick(c);
	e = coord_mfind(c, key);
	if (e && sscanf(e->val, "%" SCNd64, &v) != 1)
		v = 0;
	v += delta;
	snprintf(buf, sizeof(buf), "%" PRId64, v);
	r = coord_mput(c, key, buf);
	pthread_mutex_unlock(&c->mem->mu);
	if (r == 0 && ret)
		*ret = v;
	return r;
}

static int mem_get(struct coord *c, const char *key, uint32_t timeout_ms, char **ret)
{
	int r;

	pthread_mutex_lock(&c->mem->mu);
	coord_mem_tick(c);
	r = mwait(c, key, timeout_ms ? timeout_ms : 60000);
	if (r == 0) {
		*ret = str_dup(coord_mfind(c, key)->val);
		r = *ret ? 0 : CRUN_ENOMEM;
		c->mem->read_bytes += *ret ? strlen(*ret) : 0;
	}
	pthread_mutex_unlock(&c->mem->mu);
	if (r < 0)
		snprintf(c->err, sizeof(c->err), "get '%.200s': %s", key, crun_strerror(r));
	return r;
}

static int mem_cas(struct coord *c, const char *key, const char *expected, const char *desired,
		   char **ret_cur)
{
	struct mkv *e;
	const char *cur;
	int r = 0;

	pthread_mutex_lock(&c->mem->mu);
	coord_mem_tick(c);
	e = coord_mfind(c, key);
	if ((!e && !*expected) || (e && strcmp(e->val, expected) == 0))
		r = coord_mput(c, key, desired);
	e = coord_mfind(c, key);
	cur = e ? e->val : expected;
	if (r == 0 && ret_cur) {
		c->mem->read_bytes += strlen(cur);
		*ret_cur = str_dup(cur);
		if (!*ret_cur)
			r = CRUN_ENOMEM;
	}
	pthread_mutex_unlock(&c->mem->mu);
	return r;
}

/* The first failed attempt to reach the rendezvous store, said at once:
 * the retries that follow are otherwise silent until the deadline. */
static void coord_on_retry(int r, const char *what, uint64_t left_ms, void *arg)
{
	const struct coord_opts *o = arg;

	(void)r;
	log_at(LL_WARN, SUB_RDZV,
	       "cannot reach the rendezvous store at %s%s%s:%u: %s; retrying for %llu s",
	       strchr(o->host, ':') ? "[" : "", o->host, strchr(o->host, ':') ? "]" : "", o->port,
	       what, (unsigned long long)((left_ms + 999) / 1000));
}

int coord_open(const struct coord_opts *o, struct coord **ret_c)
{
	crun_store_opts_t so = CRUN_STORE_OPTS_INIT;
	struct store_dial_report rep = {
	    .on_retry = o->say_retry ? coord_on_retry : NULL,
	    .arg = (void *)o,
	    .retry_unresolved = o->say_retry,
	    .err = o->err,
	    .err_cap = o->err_cap,
	};
	struct coord *c;
	int r;

	c = calloc(1, sizeof(*c));
	if (!c)
		return CRUN_ENOMEM;
	if (o->etcd) {
		r = etcd_open_report(o->etcd, o->prefix, o->connect_timeout_ms, o->timeout_ms,
				     o->say_retry, o->err, o->err_cap, &c->etcd);
		if (r < 0)
			free(c);
		else
			*ret_c = c;
		return r;
	}
	so.host = o->host;
	so.port = o->port;
	so.prefix = o->prefix;
	so.connect_timeout_ms = o->connect_timeout_ms;
	so.timeout_ms = o->timeout_ms;
	so.dialect = CRUN_STORE_V2;
	so.auth_secret_file = o->auth_secret_file;
	so.auth_job = o->auth_job;
	so.tls_ca = o->tls_ca;
	so.tls_cert = o->tls_cert;
	so.tls_key = o->tls_key;
	so.tls_min_version = o->tls_min_version;
	r = store_client_open(&so, &rep, &c->s);
	if (r < 0) {
		free(c);
		return r;
	}
	*ret_c = c;
	return 0;
}

void coord_close(struct coord *c)
{
	if (!c)
		return;
	if (c->s)
		crun_store_close(c->s);
	etcd_close(c->etcd);
	free(c);
}

const char *coord_last_error(const struct coord *c)
{
	if (c && c->etcd)
		return etcd_last_error(c->etcd);
	return c ? c->err : "no connection";
}

int coord_add(struct coord *c, const char *key, int64_t delta, int64_t *ret_value)
{
	int r;

	if (c->etcd)
		return etcd_add(c->etcd, key, delta, ret_value);
	if (c->mem)
		return mem_add(c, key, delta, ret_value);
	r = crun_store_add(c->s, key, delta, ret_value);

	return r < 0 ? coord_fail(c, r, "add", key) : 0;
}

int coord_set(struct coord *c, const char *key, const char *val)
{
	int r;

	if (c->etcd)
		return etcd_set(c->etcd, key, val);
	if (c->mem) {
		pthread_mutex_lock(&c->mem->mu);
		coord_mem_tick(c);
		r = coord_mput(c, key, val);
		pthread_mutex_unlock(&c->mem->mu);
		return r;
	}
	r = crun_store_set(c->s, key, val, strlen(val));
	return r < 0 ? coord_fail(c, r, "set", key) : 0;
}

int coord_get(struct coord *c, const char *key, uint32_t timeout_ms, char **ret_val)
{
	void *v = NULL;
	size_t len;
	int r;

	if (c->etcd)
		return etcd_get(c->etcd, key, timeout_ms, ret_val);
	if (c->mem)
		return mem_get(c, key, timeout_ms, ret_val);
	r = crun_store_get(c->s, key, timeout_ms, &v, &len);

	if (r < 0)
		return coord_fail(c, r, "get", key);
	*ret_val = v; /* the client NUL-terminates values */
	return 0;
}

int coord_exists_all(struct coord *c, const char *const *keys, size_t n)
{
	int ready = 0, r;

	if (c->etcd) {
		/* etcd reads every key in one range request and has no waiting
		 * store loop to outlive the millisecond: the look it always had. */
		char **vals = calloc(n ? n : 1, sizeof(char *));

		if (!vals)
			return CRUN_ENOMEM;
		r = etcd_multi_get(c->etcd, keys, n, 1, vals);
		for (size_t i = 0; r == 0 && i < n; i++)
			free(vals[i]);
		free(vals);
		return r == 0 ? 1 : 0;
	}
	if (c->mem) {
		for (size_t i = 0; i < n; i++) {
			r = coord_exists(c, keys[i]);
			if (r != 1)
				return r;
		}
		return 1;
	}
	r = crun_store_check(c->s, keys, n, &ready);
	if (r < 0)
		return coord_fail(c, r, "check", n ? keys[0] : "");
	return ready ? 1 : 0;
}

int coord_multi_get_now(struct coord *c, const char *const *keys, size_t n, char **ret_vals)
{
	size_t *lens;
	int r;

	if (c->mem && !c->mem->old_store) {
		pthread_mutex_lock(&c->mem->mu);
		coord_mem_tick(c);
		for (size_t i = 0; i < n; i++) {
			struct mkv *e = coord_mfind(c, keys[i]);

			ret_vals[i] = strdup(e ? e->val : "");
			c->mem->read_bytes += e ? strlen(e->val) : 0;
		}
		pthread_mutex_unlock(&c->mem->mu);
		for (size_t i = 0; i < n; i++)
			if (!ret_vals[i]) {
				for (size_t k = 0; k < n; k++)
					free(ret_vals[k]);
				return CRUN_ENOMEM;
			}
		return 0;
	}
	if (c->mem || c->etcd || c->no_fold)
		return CRUN_ENOTSUP;
	lens = calloc(n ? n : 1, sizeof(*lens));
	if (!lens)
		return CRUN_ENOMEM;
	r = store_client_multi_get_now(c->s, keys, n, (void **)ret_vals, lens);
	free(lens);
	return r < 0 && r != CRUN_ENOTSUP ? coord_fail(c, r, "multi_get", n ? keys[0] : "") : r;
}

int coord_exists_each(struct coord *c, const char *const *keys, size_t n, bool *ret)
{
	char **vals = calloc(n ? n : 1, sizeof(char *));
	int r = vals ? coord_multi_get_now(c, keys, n, vals) : CRUN_ENOMEM;

	for (size_t i = 0; r == 0 && i < n; i++) {
		ret[i] = vals[i][0] != '\0';
		free(vals[i]);
	}
	free(vals);
	return r;
}

int coord_exists(struct coord *c, const char *key)
{
	int ready = 0;
	int r;

	if (c->etcd)
		return etcd_exists(c->etcd, key);
	if (c->mem) {
		pthread_mutex_lock(&c->mem->mu);
		coord_mem_tick(c);
		r = coord_mfind(c, key) ? 1 : 0;
		pthread_mutex_unlock(&c->mem->mu);
		return r;
	}
	r = crun_store_check(c->s, (const char *const[]){key}, 1, &ready);

	if (r < 0)
		return coord_fail(c, r, "check", key);
	return ready ? 1 : 0;
}

int coord_get_now(struct coord *c, const char *key, char **ret_val)
{
	void *v = NULL;
	size_t len;
	int r;

	if (c->etcd)
		return etcd_try_get(c->etcd, key, ret_val);
	if (c->mem)
		return mem_get(c, key, 0, ret_val);
	r = store_client_get_now(c->s, key, &v, &len);
	if (r < 0)
		return coord_fail(c, r, "get", key);
	*ret_val = v; /* the client NUL-terminates values */
	return 0;
}

/* A version-4 op answered r: true when the store predates it (remembered:
 * the caller uses the two older requests from then on). */
bool coord_fold_missing(struct coord *c, int r)
{
	if (r == CRUN_ENOTSUP)
		c->no_fold = true;
	return r == CRUN_ENOTSUP;
}

int coord_try_get(struct coord *c, const char *key, char **ret_val)
{
	if (c->etcd)
		return etcd_try_get(c->etcd, key, ret_val);
	if (!c->mem && !c->no_fold) {
		void *v = NULL;
		int r = store_client_try_get(c->s, key, &v, NULL);

		if (r == 0)
			*ret_val = v;
		if (!coord_fold_missing(c, r))
			return r < 0 && r != CRUN_ENOTFOUND ? coord_fail(c, r, "try_get", key) : r;
	}
	int r = coord_exists(c, key);

	if (r < 0)
		return r;
	if (r == 0)
		return CRUN_ENOTFOUND;
	return c->mem ? coord_get(c, key, 0, ret_val) : coord_get_now(c, key, ret_val);
}

int coord_multi_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		    char **ret_vals)
{
	size_t *lens;
	int r;

	if (c->etcd)
		return etcd_multi_get(c->etcd, keys, n, timeout_ms, ret_vals);
	if (c->mem) {
		for (size_t i = 0; i < n; i++) {
			r = mem_get(c, keys[i], timeout_ms, &ret_vals[i]);

			if (r < 0) {
				for (size_t k = 0; k < i; k++)
					free(ret_vals[k]);
				return r;
			}
		}
		return 0;
	}
	lens = calloc(n ? n : 1, sizeof(*lens));
	if (!lens)
		return CRUN_ENOMEM;
	r = crun_store_multi_get(c->s, keys, n, timeout_ms, (void **)ret_vals, lens);
	free(lens);
	return r < 0 ? coord_fail(c, r, "multi_get", n ? keys[0] : "") : 0;
}

int coord_multi_set(struct coord *c, const char *const *keys, const char *const *vals, size_t n)
{
	size_t *lens;
	int r = 0;

	if (c->etcd)
		return etcd_multi_set(c->etcd, keys, vals, n);
	if (c->mem) {
		pthread_mutex_lock(&c->mem->mu);
		coord_mem_tick(c);
		for (size_t i = 0; i < n && r == 0; i++)
			r = coord_mput(c, keys[i], vals[i]);
		pthread_mutex_unlock(&c->mem->mu);
		return r;
	}
	lens = calloc(n ? n : 1, sizeof(*lens));
	if (!lens)
		return CRUN_ENOMEM;
	for (size_t i = 0; i < n; i++)
		lens[i] = strlen(vals[i]);
	r = crun_store_multi_set(c->s, keys, (const void *const *)vals, lens, n);
	free(lens);
	return r < 0 ? coord_fail(c, r, "multi_set", n ? keys[0] : "") : 0;
}

int coord_compare_set(struct coord *c, const char *key, const char *expected, const char *desired,
		      char **ret_cur)
{
	void *v = NULL;
	size_t len;
	int r;

	if (c->etcd)
		return etcd_compare_set(c->etcd, key, expected, desired, ret_cur);
	if (c->mem)
		return mem_cas(c, key, expected, desired, ret_cur);
	r = crun_store_compare_set(c->s, key, expected, strlen(expected), desired, strlen(desired),
				   &v, &len);

	if (r < 0)
		return coord_fail(c, r, "compare_set", key);
	if (ret_cur)
		*ret_cur = v;
	else
		crun_free(v);
	return 0;
}

int coord_wait(struct coord *c, const char *key, uint32_t timeout_ms)
{
	int r;

	if (c->etcd)
		return etcd_wait(c->etcd, key, timeout_ms);
	if (c->mem) {
		pthread_mutex_lock(&c->mem->mu);
		coord_mem_tick(c);
		r = mwait(c, key, timeout_ms ? timeout_ms : 1);
		pthread_mutex_unlock(&c->mem->mu);
		return r;
	}
	r = crun_store_wait(c->s, (const char *const[]){key}, 1, timeout_ms ? timeout_ms : 1);

	if (r == CRUN_ETIMEDOUT)
		return r;
	return r < 0 ? coord_fail(c, r, "wait", key) : 0;
}