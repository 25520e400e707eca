/* ext.c: the client side of crun's store extension (store/store_ext.h):
 * leases held by the handle (re-attached by session.c after a reconnect),
 * TRY_GET, TICKET, GRANT_SET, and the WAIT_ANY family, whose wakes carry an
 * index and values. PyTorch's servers have none of it: HELLO first, and a
 * server that closes on it has no extension.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/client/client_int.h"
#include "store/tls.h"

/* One extension call with HELLO first where the socket has not had it, and
 * the reconnect rules of session.c: every extension op but
 * LEASE_GRANT is safe to send twice (a second GRANT would leave an orphan
 * lease whose expiry reports a failure that did not happen); a second REVOKE
 * of a lease the first one ended answers "no such lease". */
static int ext_call_val(struct crun_store *s, const struct store_ext_req *q, uint8_t *rep,
			void **ret_val, size_t *ret_len)
{
	struct client_conn *c = s->conn;
	const char *name = store_ext_op_name(q->op);
	uint64_t deadline = client_op_deadline(c, 0);
	/* TICKET counts like ADD: a second one would draw a second ticket. */
	bool again = q->op != STORE_EXT_LEASE_GRANT && q->op != STORE_EXT_GRANT_SET &&
		     q->op != STORE_EXT_TICKET;
	int r;

	for (unsigned tries = 1;; tries++) {
		bool hello = false;

		if (c->broken)
			TRY(client_revive(c, name, deadline));
		if (!c->ext) {
			hello = true;
			r = client_ext_hello(c, deadline);
		} else {
			r = 0;
		}
		if (r == 0 && c->ext_version < store_ext_op_version(q->op))
			return client_set_err(c, CRUN_ENOTSUP, name, NULL, 0,
					      "the server's extension is version %u",
					      c->ext_version);
		if (r == 0)
			r = client_ext_rpc_val(c, q, rep, deadline, ret_val, ret_len);
		if (r == 0)
			return 0;
		if (!c->broken) /* nothing was sent */
			return client_set_err(c, r, name, NULL, 0, "%s", client_cause(c, r));
		if (hello && !c->ext_used && r == CRUN_ECLOSED)
			/* A version-4 op has an older sequence to fall back to. */
			return client_set_err(
			    c,
			    store_ext_op_version(q->op) >= STORE_EXT_VERSION_FOLD ? CRUN_ENOTSUP
										  : r,
			    name, NULL, 0, "closed by the server (no crun extension support?)");
		/* Sent again on the new connection client_lost made, if it may be. */
		TRY(client_lost(c, r, name, NULL,
				again ? NULL
				      : "a lease may have been granted; it expires on its own",
				tries, deadline));
	}
}

static int ext_call(struct crun_store *s, const struct store_ext_req *q, uint8_t *rep)
{
	return ext_call_val(s, q, rep, NULL, NULL);
}

/* A status reply: 0, or CRUN_ENOTFOUND (and the handle forgets the lease). */
static int ext_status(struct crun_store *s, const char *op, uint64_t id, uint8_t st)
{
	if (st == STORE_EXT_OK)
		return 0;
	client_lease_forget(s->conn, id);
	return client_set_err(s->conn, CRUN_ENOTFOUND, op, NULL, 0,
			      "no such lease %016llx (expired, revoked, or held elsewhere)",
			      (unsigned long long)id);
}

/* LEASE_GRANT, or GRANT_SET with key (non-NULL) set to val under the lease. */
static int grant(crun_store_t *s, uint32_t ttl_ms, const char *expiry_key, const void *expiry_val,
		 size_t expiry_len, const char *key, const void *val, size_t len, uint64_t *ret_id)
{
	struct store_ext_req q = {.op = key ? STORE_EXT_GRANT_SET : STORE_EXT_LEASE_GRANT,
				  .ttl_ms = ttl_ms};
	const char *op = store_ext_op_name(q.op);
	const char *keys[2] = {expiry_key ? expiry_key : key, key};
	uint8_t rep[8];

	if (!s || !ret_id || ttl_ms < 1 || ttl_ms > STORE_EXT_TTL_MAX)
		return CRUN_EINVAL;
	if (key)
		TRY(client_check_val(s->conn, op, val, len));
	if (expiry_key)
		TRY(client_check_val(s->conn, op, expiry_val, expiry_len));
	if (expiry_key || key)
		TRY(client_mangle(s, op, expiry_key ? keys : keys + 1, expiry_key && key ? 2 : 1,
				  false));
	if (expiry_key) {
		q.key = s->conn->kv[0];
		q.val = (struct store_bytes){expiry_val, expiry_len};
	}
	if (key) {
		q.key2 = s->conn->kv[expiry_key ? 1 : 0];
		q.val2 = (struct store_bytes){val, len};
	}
	TRY(ext_call(s, &q, rep));
	*ret_id = store_get_u64(rep);
	client_lease_note(s->conn, *ret_id);
	return 0;
}

CRUN_API int crun_store_lease_grant(crun_store_t *s, uint32_t ttl_ms, const char *expiry_key,
				    const void *expiry_val, size_t expiry_len, uint64_t *ret_id)
{
	return grant(s, ttl_ms, expiry_key, expiry_val, expiry_len, NULL, NULL, 0, ret_id);
}

int store_client_grant_set(struct crun_store *s, uint32_t ttl_ms, const char *expiry_key,
			   const void *expiry_val, size_t expiry_len, const char *key,
			   const void *val, size_t len, uint64_t *ret_id)
{
	if (!key)
		return CRUN_EINVAL;
	return grant(s, ttl_ms, expiry_key, expiry_val, expiry_len, key, val, len, ret_id);
}

int store_client_try_get(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len)
{
	struct store_ext_req q = {.op = STORE_EXT_TRY_GET};
	uint8_t rep[9];
	void *v = NULL;

	if (!s || !key || !ret_val)
		return CRUN_EINVAL;
	TRY(client_mangle(s, "TRY_GET", &key, 1, false));
	q.key = s->conn->kv[0];
	TRY(ext_call_val(s, &q, rep, &v, ret_len));
	if (rep[0] == 0) {
		free(v);
		return CRUN_ENOTFOUND;
	}
	*ret_val = v;
	return 0;
}

int store_client_ticket(struct crun_store *s, const char *counter, const char *prefix,
			const void *val, size_t len, int64_t *ret_t)
{
	struct store_ext_req q = {.op = STORE_EXT_TICKET};
	const char *keys[2] = {counter, prefix};
	uint8_t rep[8];

	if (!s || !counter || !prefix || !ret_t)
		return CRUN_EINVAL;
	TRY(client_check_val(s->conn, "TICKET", val, len));
	TRY(client_mangle(s, "TICKET", keys, 2, false));
	q.key = s->conn->kv[0];
	q.key2 = s->conn->kv[1];
	q.val = (struct store_bytes){val, len};
	TRY(ext_call(s, &q, rep));
	*ret_t = (int64_t)store_get_u64(rep);
	return 0;
}

/* KEEPALIVE, ATTACH or REVOKE of lease id: the status byte in *ret_st. */
static int lease_call(crun_store_t *s, uint8_t op, uint64_t id, uint8_t *ret_st)
{
	struct store_ext_req q = {.op = op, .id = id};

	if (!s)
		return CRUN_EINVAL;
	return ext_call(s, &q, ret_st);
}

CRUN_API int crun_store_lease_keepalive(crun_store_t *s, uint64_t id)
{
	uint8_t st;

	TRY(lease_call(s, STORE_EXT_LEASE_KEEPALIVE, id, &st));
	return ext_status(s, "LEASE_KEEPALIVE", id, st);
}

CRUN_API int crun_store_lease_attach(crun_store_t *s, uint64_t id)
{
	uint8_t st;

	if (s && s->conn->ext && s->conn->ext_version < STORE_EXT_VERSION_ATTACH)
		return client_set_err(s->conn, CRUN_ENOTSUP, "LEASE_ATTACH", NULL, 0,
				      "the server's extension is version %u", s->conn->ext_version);
	TRY(lease_call(s, STORE_EXT_LEASE_ATTACH, id, &st));
	TRY(ext_status(s, "LEASE_ATTACH", id, st));
	client_lease_note(s->conn, id);
	return 0;
}

CRUN_API int crun_store_lease_revoke(crun_store_t *s, uint64_t id)
{
	uint8_t st;

	TRY(lease_call(s, STORE_EXT_LEASE_REVOKE, id, &st));
	client_lease_forget(s->conn, id);
	return ext_status(s, "LEASE_REVOKE", id, st);
}

CRUN_API int crun_store_set_leased(crun_store_t *s, uint64_t id, const char *key, const void *val,
				   size_t len)
{
	struct store_ext_req q = {.op = STORE_EXT_SET_LEASED, .id = id};
	uint8_t rep[1];

	if (!s || !key)
		return CRUN_EINVAL;
	TRY(client_check_val(s->conn, "SET_LEASED", val, len));
	TRY(client_mangle(s, "SET_LEASED", &key, 1, false));
	q.key = s->conn->kv[0];
	q.val = (struct store_bytes){val, len};
	TRY(ext_call(s, &q, rep));
	return ext_status(s, "SET_LEASED", id, rep[0]);
}

/* Reads n raw bytes of a reply into b. */
static int read_raw(struct client_conn *c, uint8_t *b, size_t n, uint64_t deadline)
{
	while (c->rlen - c->rpos < n)
		TRY(client_fill(c, deadline));
	memcpy(b, c->rbuf + c->rpos, n);
	c->rpos += n;
	return 0;
}

/* Where a WAIT_ANY's wake goes: the index, and for WAIT_ANY_GET (val
 * non-NULL) the key's value. */
struct any_out {
	size_t *idx;
	void **val;
	size_t *len;
	bool timed_out;	 /* WAIT_ANY_GET: the server's timeout answered (index n) */
	bool with;	 /* WAIT_ANY_GET_WITH: the with_key's value follows */
	void **with_val; /* its value, NULL when absent */
};

/* The wake of a WAIT_ANY after its STOP_WAITING: the index (and value). */
static int read_any_wake(struct client_conn *c, size_t n, uint64_t deadline, struct any_out *o)
{
	uint8_t b[8];
	uint64_t idx;
	void *v = NULL;

	TRY(read_raw(c, b, 8, deadline));
	idx = store_get_u64(b);
	if (idx > n || (idx == n && !o->val))
		return CRUN_EPROTO;
	if (o->val) {
		TRY(read_raw(c, b, 8, deadline));
		TRY(client_read_tail(c, b, deadline, &v, o->len));
	}
	if (o->with) {
		void *w = NULL;
		uint8_t found;
		int r = read_raw(c, &found, 1, deadline);

		if (r == 0)
			r = read_raw(c, b, 8, deadline);
		if (r == 0)
			r = client_read_tail(c, b, deadline, &w, NULL);
		if (r < 0 || found > 1) {
			free(v);
			return r < 0 ? r : CRUN_EPROTO;
		}
		if (found && idx < n)
			*o->with_val = w;
		else
			free(w);
	}
	o->timed_out = idx == n;
	if (o->val && !o->timed_out)
		*o->val = v;
	else
		free(v);
	*o->idx = (size_t)idx;
	client_confirm(c);
	return 0;
}

/* Like await_wake: a timeout cancels the wait and keeps the stream in sync;
 * a wake that raced the cancel is a wake (a key exists). */
static int await_any(struct client_conn *c, size_t n, uint64_t deadline, struct any_out *o)
{
	struct store_req cancel = {.op = STORE_OP_CANCEL_WAIT};
	uint8_t st;
	int r = client_error_reply(c, deadline);
	bool woke = false;

	if (r == 0)
		r = read_raw(c, &st, 1, deadline);

	if (r == 0)
		return st == STORE_WAIT_STOP_WAITING ? read_any_wake(c, n, deadline, o)
						     : CRUN_EPROTO;
	if (r != CRUN_ETIMEDOUT)
		return r;
	deadline =
	    client_deadline(c->timeout_ms ? MIN(CANCEL_REPLY_MS, c->timeout_ms) : CANCEL_REPLY_MS);
	r = client_send_req(c, &cancel, deadline);
	for (int i = 0; r == 0 && i < 2; i++) {
		r = read_raw(c, &st, 1, deadline);
		if (r == 0 && st == STORE_WAIT_CANCELED) {
			client_confirm(c);
			return woke ? 0 : CRUN_ETIMEDOUT;
		}
		if (r == 0 && st == STORE_WAIT_STOP_WAITING && !woke) {
			woke = true;
			r = read_any_wake(c, n, deadline, o);
		} else if (r == 0) {
			r = CRUN_EPROTO;
		}
	}
	client_break(c); /* the stream is out of step */
	return r < 0 ? r : CRUN_EPROTO;
}

/* A server-side timeout comes this long before the client's own deadline,
 * which cancels the wait only when the server is late. */
#define ANY_SERVER_SLACK_MS 1000u

static int wait_any(struct crun_store *s, const char *const *keys, size_t n, uint32_t timeout_ms,
		    uint64_t keep, struct any_out *o)
{
	struct store_ext_req q = {.op = o->with	 ? STORE_EXT_WAIT_ANY_GET_WITH
					: o->val ? STORE_EXT_WAIT_ANY_GET
						 : STORE_EXT_WAIT_ANY,
				  .nitems = n,
				  .id = keep};
	const char *name = store_ext_op_name(q.op);
	struct client_conn *c;
	uint64_t deadline;
	size_t len;
	int r;

	if (!s || !o->idx || n == 0)
		return CRUN_EINVAL;
	TRY(client_key_list(s, STORE_OP_WAIT, keys, n + o->with)); /* the with_key last */
	c = s->conn;
	deadline = client_op_deadline(c, timeout_ms);
	if (o->val) { /* the server answers the timeout itself (store_ext.h) */
		q.wait_ms = timeout_ms ? timeout_ms : c->timeout_ms;
		deadline += MIN(q.wait_ms, ANY_SERVER_SLACK_MS);
	}
	for (unsigned tries = 1;; tries++) {
		if (c->broken)
			TRY(client_revive(c, name, deadline));
		bool hello = !c->ext;

		r = hello ? client_ext_hello(c, deadline) : 0;
		if (hello && r == CRUN_ECLOSED && !c->ext_used)
			return client_set_err(c, CRUN_ENOTSUP, name, NULL, 0,
					      "closed by the server (no crun extension support?)");
		if (r == 0 && c->ext_version < store_ext_op_version(q.op))
			return client_set_err(c, CRUN_ENOTSUP, name, NULL, 0,
					      "the server's extension is version %u",
					      c->ext_version);
		q.keys = c->kv;
		if (o->with)
			q.key2 = c->kv[n];
		if (r == 0 &&
		    client_grow((void **)&c->wbuf, &c->wcap, store_ext_req_size(&q), 1) < 0)
			return CRUN_ENOMEM;
		if (r == 0)
			r = store_ext_encode_req(&q, c->wbuf, c->wcap, &len);
		if (r == 0) {
			r = store_io_send(c->fd, c->tls, c->wbuf, len, deadline);
			client_wbuf_trim(c);
		}
		if (r == 0)
			r = await_any(c, n, deadline, o);
		if (r == 0 && o->timed_out)
			return client_set_err(c, CRUN_ETIMEDOUT, name, c->kv[0].p, c->kv[0].len,
					      "timed out (by the server)");
		if (r == 0)
			return 0;
		if (r == CRUN_ETIMEDOUT && !c->broken)
			return client_set_err(c, r, name, c->kv[0].p, c->kv[0].len,
					      "timed out (wait canceled)");
		TRY(client_lost(c, r, "WAIT", &c->kv[0], NULL, tries, deadline));
	}
}

int store_client_wait_any(struct crun_store *s, const char *const *keys, size_t n,
			  uint32_t timeout_ms, size_t *ret_idx)
{
	struct any_out o = {ret_idx, NULL, NULL, false, false, NULL};

	return wait_any(s, keys, n, timeout_ms, 0, &o);
}

int store_client_wait_any_get(struct crun_store *s, const char *const *keys, size_t n,
			      uint32_t timeout_ms, uint64_t keep, size_t *ret_idx, void **ret_val,
			      size_t *ret_len)
{
	struct any_out o = {ret_idx, ret_val, ret_len, false, false, NULL};

	if (!ret_val)
		return CRUN_EINVAL;
	return wait_any(s, keys, n, timeout_ms, keep, &o);
}

int store_client_wait_any_get_with(struct crun_store *s, const char *const *keys, size_t n,
				   const char *with_key, uint32_t timeout_ms, uint64_t keep,
				   size_t *ret_idx, void **ret_val, void **ret_with)
{
	const char **all = NULL;
	struct any_out o = {ret_idx, ret_val, NULL, false, true, ret_with};
	int r;

	if (!ret_val || !ret_with || !with_key || !keys || n == 0 || n >= SIZE_MAX / sizeof(*all))
		return CRUN_EINVAL;
	all = malloc((n + 1) * sizeof(*all));
	if (!all)
		return CRUN_ENOMEM;
	memcpy(all, keys, n * sizeof(*all));
	all[n] = with_key;
	*ret_with = NULL;
	r = wait_any(s, all, n, timeout_ms, keep, &o);
	free(all);
	return r;
}
