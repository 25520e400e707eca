/* coord_store.c: the coordination interface (coord.h) over crun's blocking
 * store client, talking to a crun store (an agent or crun-rdzvd) in the v2
 * dialect so that a timed-out WAIT is canceled and the connection stays
 * usable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "crun/store.h"
#include "rendezvous/coord.h"

struct coord {
	crun_store_t *s;
	char err[512];
};

static int fail(struct coord *c, int r, const char *what, const char *key)
{
	snprintf(c->err, sizeof(c->err), "%s '%.200s': %s - %.240s", what, key, crun_strerror(r),
		 crun_store_last_error(c->s));
	return r;
}

int coord_open(const struct coord_opts *o, struct coord **ret_c)
{
	crun_store_opts_t so = CRUN_STORE_OPTS_INIT;
	struct coord *c;
	int r;

	c = calloc(1, sizeof(*c));
	if (!c)
		return CRUN_ENOMEM;
	so.host = o->host;
	so.port = o->port;
	so.prefix = o->prefix;
	so.connect_timeout_ms = o->connect_timeout_ms;
	so.timeout_ms = o->timeout_ms;
	so.dialect = CRUN_STORE_V2;
	r = crun_store_open(&so, &c->s);
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
	crun_store_close(c->s);
	free(c);
}

const char *coord_last_error(const struct coord *c)
{
	return c ? c->err : "no connection";
}

int coord_add(struct coord *c, const char *key, int64_t delta, int64_t *ret_value)
{
	int r = crun_store_add(c->s, key, delta, ret_value);

	return r < 0 ? fail(c, r, "add", key) : 0;
}

int coord_set(struct coord *c, const char *key, const char *val)
{
	int r = crun_store_set(c->s, key, val, strlen(val));

	return r < 0 ? fail(c, r, "set", key) : 0;
}

int coord_get(struct coord *c, const char *key, uint32_t timeout_ms, char **ret_val)
{
	void *v = NULL;
	size_t len;
	int r = crun_store_get(c->s, key, timeout_ms, &v, &len);

	if (r < 0)
		return fail(c, r, "get", key);
	*ret_val = v; /* the client NUL-terminates values */
	return 0;
}

int coord_exists(struct coord *c, const char *key)
{
	int ready = 0;
	int r = crun_store_check(c->s, (const char *const[]){key}, 1, &ready);

	if (r < 0)
		return fail(c, r, "check", key);
	return ready ? 1 : 0;
}

int coord_try_get(struct coord *c, const char *key, char **ret_val)
{
	int r = coord_exists(c, key);

	if (r < 0)
		return r;
	if (r == 0)
		return CRUN_ENOTFOUND;
	return coord_get(c, key, 0, ret_val);
}

int coord_multi_get(struct coord *c, const char *const *keys, size_t n, uint32_t timeout_ms,
		    char **ret_vals)
{
	size_t *lens = calloc(n ? n : 1, sizeof(*lens));
	int r;

	if (!lens)
		return CRUN_ENOMEM;
	r = crun_store_multi_get(c->s, keys, n, timeout_ms, (void **)ret_vals, lens);
	free(lens);
	return r < 0 ? fail(c, r, "multi_get", n ? keys[0] : "") : 0;
}

int coord_compare_set(struct coord *c, const char *key, const char *expected, const char *desired,
		      char **ret_cur)
{
	void *v = NULL;
	size_t len;
	int r = crun_store_compare_set(c->s, key, expected, strlen(expected), desired,
				       strlen(desired), &v, &len);

	if (r < 0)
		return fail(c, r, "compare_set", key);
	if (ret_cur)
		*ret_cur = v;
	else
		crun_free(v);
	return 0;
}

int coord_wait(struct coord *c, const char *key, uint32_t timeout_ms)
{
	int r = crun_store_wait(c->s, (const char *const[]){key}, 1, timeout_ms ? timeout_ms : 1);

	if (r == CRUN_ETIMEDOUT)
		return r;
	return r < 0 ? fail(c, r, "wait", key) : 0;
}

int coord_watch(struct coord *c, const char *key, uint32_t timeout_ms)
{
	return coord_wait(c, key, timeout_ms);
}

int coord_lease_grant(struct coord *c, uint32_t ttl_ms, const char *expiry_key, const char *why,
		      uint64_t *ret_id)
{
	int r = crun_store_lease_grant(c->s, ttl_ms, expiry_key, why, strlen(why), ret_id);

	if (r == CRUN_ECLOSED || r == CRUN_EPROTO) {
		fail(c, r, "lease_grant", expiry_key);
		return CRUN_ENOTSUP;
	}
	return r < 0 ? fail(c, r, "lease_grant", expiry_key) : 0;
}

int coord_lease_keepalive(struct coord *c, uint64_t id)
{
	int r = crun_store_lease_keepalive(c->s, id);

	return r < 0 && r != CRUN_ENOTFOUND ? fail(c, r, "lease_keepalive", "") : r;
}

int coord_lease_revoke(struct coord *c, uint64_t id)
{
	int r = crun_store_lease_revoke(c->s, id);

	return r < 0 && r != CRUN_ENOTFOUND ? fail(c, r, "lease_revoke", "") : r;
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
