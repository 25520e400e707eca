/* ops.c: the TCPStore operations of include/crun/store.h, both dialects,
 * through the pure codec (store/store.h): key mangling under the handle's
 * prefix and argument checks, then one call path - call() for a request and
 * its reply, do_wait() and await_wake() for the ops that park on the server
 * - with session.c's reconnect rules behind each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/client/client_int.h"

/* Ops sent again after a reconnect when the request may already have been
 * applied: applying them twice leaves the same state and gives the same
 * answer (with no other writer in between). COMPARE_SET qualifies: a second
 * try finds its own desired value and answers it. ADD, APPEND, DELETE_KEY
 * (the answer changes), QUEUE_* and BARRIER (they count) do not. WATCH_KEY
 * and CANCEL_WAIT belong to the socket they were sent on. */
static const bool retry_safe[STORE_OP__MAX] = {
    [STORE_OP_SET] = true,	 [STORE_OP_COMPARE_SET] = true, [STORE_OP_GET] = true,
    [STORE_OP_CHECK] = true,	 [STORE_OP_WAIT] = true,	[STORE_OP_GETNUMKEYS] = true,
    [STORE_OP_MULTI_GET] = true, [STORE_OP_MULTI_SET] = true,	[STORE_OP_PING] = true,
    [STORE_OP_QUEUE_LEN] = true, [STORE_OP_LIST_KEYS] = true,
};

/* client_lost with the retry_safe table's verdict on op. */
static int lost(struct client_conn *c, int r, enum store_op op, const struct store_bytes *k,
		unsigned tries, uint64_t deadline)
{
	return client_lost(c, r, store_proto_op_name(op), k,
			   retry_safe[op] ? NULL
					  : "not idempotent: it may or may not have been applied",
			   tries, deadline);
}

/* Fills c->kv[0..n) with the handle's prefix + each key (all in c->kbuf).
 * raw: keys go on the wire unchanged. Over-limit keys give CRUN_ETOOBIG. */
int client_mangle(struct crun_store *s, const char *op, const char *const *keys, size_t n, bool raw)
{
	struct client_conn *c = s->conn;
	size_t plen = raw ? 0 : s->pfx_len;
	size_t total = 0, off = 0;

	if (n > c->lim.max_items)
		return client_set_err(c, CRUN_ETOOBIG, op, NULL, 0, "%zu keys, the limit is %llu",
				      n, (unsigned long long)c->lim.max_items);
	for (size_t i = 0; i < n; i++) {
		size_t kl;

		if (!keys[i])
			return client_set_err(c, CRUN_EINVAL, op, NULL, 0, "key %zu is NULL", i);
		kl = strlen(keys[i]);
		if (plen + kl > c->lim.max_key_bytes)
			return client_set_err(c, CRUN_ETOOBIG, op, keys[i], kl,
					      "key of %zu bytes, the limit is %zu", plen + kl,
					      c->lim.max_key_bytes);
		total += plen + kl;
	}
	if (client_grow((void **)&c->kbuf, &c->kcap, total ? total : 1, 1) < 0 ||
	    client_grow((void **)&c->kv, &c->kvcap, n ? n : 1, sizeof(*c->kv)) < 0)
		return client_set_err(c, CRUN_ENOMEM, op, NULL, 0, "out of memory");
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(keys[i]);

		memcpy(c->kbuf + off, s->pfx, plen);
		memcpy(c->kbuf + off + plen, keys[i], kl);
		c->kv[i].p = (const uint8_t *)c->kbuf + off;
		c->kv[i].len = plen + kl;
		off += plen + kl;
	}
	return 0;
}

/* Common entry checks: the op exists in the dialect, and the connection is
 * up (reconnecting if an earlier call lost it). */
static int enter(struct crun_store *s, enum store_op op)
{
	struct client_conn *c = s->conn;

	if (store_proto_opcode(c->dialect, op) < 0)
		return client_set_err(c, CRUN_EDIALECT, store_proto_op_name(op), NULL, 0,
				      "not in the v%d store dialect", (int)c->dialect);
	if (c->broken)
		return client_revive(c, store_proto_op_name(op), client_deadline(c->timeout_ms));
	return 0;
}

int client_check_val(struct client_conn *c, const char *op, const void *val, size_t len)
{
	if (!val && len)
		return client_set_err(c, CRUN_EINVAL, op, NULL, 0, "NULL value of %zu bytes", len);
	if (len > c->lim.max_value_bytes)
		return client_set_err(c, CRUN_ETOOBIG, op, NULL, 0,
				      "value of %zu bytes, the limit is %zu", len,
				      c->lim.max_value_bytes);
	return 0;
}

uint64_t client_op_deadline(struct client_conn *c, uint32_t timeout_ms)
{
	return client_deadline(timeout_ms ? timeout_ms : c->timeout_ms);
}

/* One request and its reply, no waiting semantics: any failure after a byte
 * may have been sent breaks the connection (then lost() decides). */
static int call(struct client_conn *c, const struct store_req *req, uint64_t nitems,
		uint64_t deadline, struct store_reply *out)
{
	const char *name = store_proto_op_name(req->op);
	const struct store_bytes *k = req->key.p ? &req->key : (req->keys ? &req->keys[0] : NULL);
	int r;

	for (unsigned tries = 1;; tries++) {
		r = client_send_req(c, req, deadline);
		if (r == CRUN_ENOMEM || r == CRUN_EDIALECT) /* nothing was sent */
			return client_set_err(c, r, name, k ? k->p : NULL, k ? k->len : 0, "%s",
					      client_cause(c, r));
		if (r == 0 && store_proto_reply_kind(req->op) != STORE_REPLY_NONE)
			r = client_read_reply(c, req->op, nitems, deadline, out);
		if (r == 0)
			return 0;
		TRY(lost(c, r, req->op, k, tries, deadline));
	}
}

/* Reads the 1-byte answer of WAIT or BARRIER. On a timeout, v2 cancels the
 * wait on the server and keeps the stream in sync (what PyTorch 2.x does);
 * v1 has no CANCEL_WAIT, and a late STOP_WAITING would be read as the answer
 * to a later request (the 1.13 desync of torch-compat §1.7), so v1 drops the
 * connection. */
static int await_wake(struct client_conn *c, enum store_op op, const struct store_bytes *key,
		      uint64_t deadline)
{
	const char *name = store_proto_op_name(op);
	struct store_req cancel = {.op = STORE_OP_CANCEL_WAIT};
	struct store_reply rep;
	int r;

	r = client_read_reply(c, op, 0, deadline, &rep);
	if (r == 0) {
		if (rep.status == STORE_WAIT_STOP_WAITING)
			return 0;
		client_break(c);
		return client_set_err(c, CRUN_EPROTO, name, key ? key->p : NULL, key ? key->len : 0,
				      "unexpected wait status %u", rep.status);
	}
	if (r != CRUN_ETIMEDOUT || c->dialect == STORE_V1) {
		client_break(c);
		return client_set_err(
		    c, r, name, key ? key->p : NULL, key ? key->len : 0, "%s%s", client_cause(c, r),
		    r == CRUN_ETIMEDOUT ? "; v1 connection closed (no CANCEL_WAIT)" : "");
	}
	/* A peer that stopped answering must not hold a caller with a short
	 * op timeout (a lease monitor) for the full cancel allowance. */
	deadline =
	    client_deadline(c->timeout_ms ? MIN(CANCEL_REPLY_MS, c->timeout_ms) : CANCEL_REPLY_MS);
	r = client_send_req(c, &cancel, deadline);
	for (int i = 0; r == 0 && i < 2; i++) {
		r = client_read_reply(c, STORE_OP_CANCEL_WAIT, 0, deadline, &rep);
		if (r < 0)
			break;
		if (rep.status == STORE_WAIT_CANCELED)
			return client_set_err(c, CRUN_ETIMEDOUT, name, key ? key->p : NULL,
					      key ? key->len : 0, "timed out (wait canceled)");
		/* One late STOP_WAITING may precede WAIT_CANCELED; anything else,
		 * or a second one, is a broken stream. */
		if (rep.status != STORE_WAIT_STOP_WAITING || i == 1)
			r = CRUN_EPROTO;
	}
	client_break(c);
	return client_set_err(c, r, name, key ? key->p : NULL, key ? key->len : 0,
			      "timed out, and CANCEL_WAIT failed: %s", client_cause(c, r));
}

/* WAIT on c->kv[0..n): the first half of GET, MULTI_GET and blocking POP.
 * A wait registration dies with its socket, so after a reset the WAIT is
 * simply sent again on the new one. */
static int do_wait(struct client_conn *c, size_t n, uint64_t deadline)
{
	struct store_req req = {.op = STORE_OP_WAIT, .nitems = n, .keys = c->kv};
	const struct store_bytes *k = n ? &c->kv[0] : NULL;
	int r;

	for (unsigned tries = 1;; tries++) {
		r = client_send_req(c, &req, deadline);
		if (r == 0) {
			r = await_wake(c, STORE_OP_WAIT, k, deadline);
			if (r == 0 || !c->broken || !client_transient(r))
				return r;
		}
		TRY(lost(c, r, STORE_OP_WAIT, k, tries, deadline));
	}
}

/* Copies a reply's bytes into a fresh allocation with a NUL after them. */
static int dup_bytes(struct client_conn *c, const char *op, const struct store_bytes *b,
		     void **ret_val, size_t *ret_len)
{
	uint8_t *p = malloc(b->len + 1);

	if (!p)
		return client_set_err(c, CRUN_ENOMEM, op, NULL, 0, "out of memory for %zu bytes",
				      b->len);
	if (b->len)
		memcpy(p, b->p, b->len);
	p[b->len] = '\0';
	*ret_val = p;
	if (ret_len)
		*ret_len = b->len;
	return 0;
}

/* Mangle and send one single-key request with an optional value. */
static int one_key(struct crun_store *s, enum store_op op, const char *key, bool raw)
{
	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, op));
	if (!key)
		return client_set_err(s->conn, CRUN_EINVAL, store_proto_op_name(op), NULL, 0,
				      "NULL key");
	return client_mangle(s, store_proto_op_name(op), &key, 1, raw);
}

CRUN_API int crun_store_set(crun_store_t *s, const char *key, const void *val, size_t len)
{
	struct store_req req = {.op = STORE_OP_SET};

	TRY(one_key(s, STORE_OP_SET, key, false));
	TRY(client_check_val(s->conn, "SET", val, len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){val, len};
	return call(s->conn, &req, 0, client_op_deadline(s->conn, 0), NULL);
}

CRUN_API int crun_store_get(crun_store_t *s, const char *key, uint32_t timeout_ms, void **ret_val,
			    size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_GET};
	struct store_reply rep;
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_GET, key, false));
	if (!ret_val)
		return client_set_err(s->conn, CRUN_EINVAL, "GET", key, strlen(key),
				      "NULL ret_val");
	deadline = client_op_deadline(s->conn, timeout_ms);
	TRY(do_wait(s->conn, 1, deadline));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, deadline, &rep));
	r = dup_bytes(s->conn, "GET", &rep.val, ret_val, ret_len);
	client_trim(s->conn);
	return r;
}

int store_client_get_now(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_GET};
	struct store_reply rep;
	int r;

	TRY(one_key(s, STORE_OP_GET, key, false));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	r = dup_bytes(s->conn, "GET", &rep.val, ret_val, ret_len);
	client_trim(s->conn);
	return r;
}

/* A single-key op answered by a number (ADD, DELETE_KEY, QUEUE_LEN). */
static int key_num(crun_store_t *s, enum store_op op, const char *key, int64_t num, bool raw,
		   int64_t *ret_num)
{
	struct store_req req = {.op = op, .num = num};
	struct store_reply rep;

	TRY(one_key(s, op, key, raw));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	*ret_num = rep.num;
	return 0;
}

static int add_common(crun_store_t *s, const char *key, int64_t delta, int64_t *ret_value, bool raw)
{
	int64_t v;

	TRY(key_num(s, STORE_OP_ADD, key, delta, raw, &v));
	if (ret_value)
		*ret_value = v;
	return 0;
}

CRUN_API int crun_store_add(crun_store_t *s, const char *key, int64_t delta, int64_t *ret_value)
{
	return add_common(s, key, delta, ret_value, false);
}

CRUN_API int crun_store_add_raw(crun_store_t *s, const char *wire_key, int64_t delta,
				int64_t *ret_value)
{
	return add_common(s, wire_key, delta, ret_value, true);
}

CRUN_API int crun_store_compare_set(crun_store_t *s, const char *key, const void *expected,
				    size_t expected_len, const void *desired, size_t desired_len,
				    void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_COMPARE_SET};
	struct store_reply rep;
	int r;

	TRY(one_key(s, STORE_OP_COMPARE_SET, key, false));
	TRY(client_check_val(s->conn, "COMPARE_SET", expected, expected_len));
	TRY(client_check_val(s->conn, "COMPARE_SET", desired, desired_len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){expected, expected_len};
	req.val2 = (struct store_bytes){desired, desired_len};
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	if (!ret_val)
		return 0;
	r = dup_bytes(s->conn, "COMPARE_SET", &rep.val, ret_val, ret_len);
	client_trim(s->conn);
	return r;
}

int client_key_list(struct crun_store *s, enum store_op op, const char *const *keys, size_t n)
{
	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, op));
	if (!keys && n)
		return client_set_err(s->conn, CRUN_EINVAL, store_proto_op_name(op), NULL, 0,
				      "NULL key list");
	return client_mangle(s, store_proto_op_name(op), keys, n, false);
}

CRUN_API int crun_store_check(crun_store_t *s, const char *const *keys, size_t nkeys,
			      int *ret_ready)
{
	struct store_req req = {.op = STORE_OP_CHECK, .nitems = nkeys};
	struct store_reply rep;

	TRY(client_key_list(s, STORE_OP_CHECK, keys, nkeys));
	req.keys = s->conn->kv;
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	if (rep.status != STORE_CHECK_READY && rep.status != STORE_CHECK_NOT_READY) {
		client_break(s->conn);
		return client_set_err(s->conn, CRUN_EPROTO, "CHECK", NULL, 0, "bad status %u",
				      rep.status);
	}
	if (ret_ready)
		*ret_ready = rep.status == STORE_CHECK_READY;
	return 0;
}

CRUN_API int crun_store_wait(crun_store_t *s, const char *const *keys, size_t nkeys,
			     uint32_t timeout_ms)
{
	TRY(client_key_list(s, STORE_OP_WAIT, keys, nkeys));
	return do_wait(s->conn, nkeys, client_op_deadline(s->conn, timeout_ms));
}

CRUN_API int crun_store_num_keys(crun_store_t *s, int64_t *ret_count)
{
	struct store_req req = {.op = STORE_OP_GETNUMKEYS};
	struct store_reply rep;

	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_GETNUMKEYS));
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	if (ret_count)
		*ret_count = rep.num;
	return 0;
}

CRUN_API int crun_store_delete_key(crun_store_t *s, const char *key, int *ret_deleted)
{
	int64_t n;

	TRY(key_num(s, STORE_OP_DELETE_KEY, key, 0, false, &n));
	if (ret_deleted)
		*ret_deleted = n == 1;
	return 0;
}

static int key_val(crun_store_t *s, enum store_op op, const char *key, const void *val, size_t len)
{
	struct store_req req = {.op = op};

	TRY(one_key(s, op, key, false));
	TRY(client_check_val(s->conn, store_proto_op_name(op), val, len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){val, len};
	return call(s->conn, &req, 0, client_op_deadline(s->conn, 0), NULL);
}

CRUN_API int crun_store_append(crun_store_t *s, const char *key, const void *val, size_t len)
{
	return key_val(s, STORE_OP_APPEND, key, val, len);
}

CRUN_API int crun_store_queue_push(crun_store_t *s, const char *key, const void *val, size_t len)
{
	return key_val(s, STORE_OP_QUEUE_PUSH, key, val, len);
}

CRUN_API int crun_store_multi_get(crun_store_t *s, const char *const *keys, size_t nkeys,
				  uint32_t timeout_ms, void **ret_vals, size_t *ret_lens)
{
	struct store_req req = {.op = STORE_OP_MULTI_GET, .nitems = nkeys};
	struct store_reply rep;
	const uint8_t *it;
	uint64_t deadline;
	void **tmp;

	TRY(client_key_list(s, STORE_OP_MULTI_GET, keys, nkeys));
	if (nkeys && (!ret_vals || !ret_lens))
		return client_set_err(s->conn, CRUN_EINVAL, "MULTI_GET", NULL, 0,
				      "NULL result arrays");
	deadline = client_op_deadline(s->conn, timeout_ms);
	TRY(do_wait(s->conn, nkeys, deadline));
	req.keys = s->conn->kv;
	/* timeout_ms bounds the wait for the keys; reading keys that exist is
	 * an ordinary request. Under the wait's deadline a short timeout (the
	 * rendezvous closer's 1 ms "are all alive?") that the WAIT used up
	 * left the read none: it timed out unanswered and broke the
	 * connection, with the agent's lease on it (seen at 2,048 simulated
	 * agents, bench/rdzv_sim.c). */
	TRY(call(s->conn, &req, nkeys, MAX(deadline, client_op_deadline(s->conn, 0)), &rep));
	/* Allocate into a scratch array first: ret_* are written only on success. */
	tmp = calloc(nkeys ? nkeys : 1, sizeof(*tmp));
	if (!tmp)
		return client_set_err(s->conn, CRUN_ENOMEM, "MULTI_GET", NULL, 0, "out of memory");
	it = rep.items;
	for (size_t i = 0; i < nkeys; i++) {
		struct store_bytes b;
		size_t l;

		store_items_next(&it, &b);
		if (dup_bytes(s->conn, "MULTI_GET", &b, &tmp[i], &l) < 0) {
			for (size_t j = 0; j < i; j++)
				free(tmp[j]);
			free(tmp);
			return CRUN_ENOMEM;
		}
	}
	it = rep.items;
	for (size_t i = 0; i < nkeys; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		ret_vals[i] = tmp[i];
		ret_lens[i] = b.len;
	}
	free(tmp);
	client_trim(s->conn);
	return 0;
}

int store_client_multi_get_now(struct crun_store *s, const char *const *keys, size_t n,
			       void **ret_vals, size_t *ret_lens)
{
	struct store_req req = {.op = STORE_OP_MULTI_GET, .nitems = n};
	struct store_reply rep;
	const uint8_t *it;
	size_t i;

	TRY(client_key_list(s, STORE_OP_MULTI_GET, keys, n));
	if (!ret_vals || !ret_lens)
		return CRUN_EINVAL;
	/* Other servers may fail a MULTI_GET of a missing key. */
	if (!s->conn->ext || s->conn->ext_version < STORE_EXT_VERSION_FOLD)
		return client_set_err(s->conn, CRUN_ENOTSUP, "MULTI_GET", NULL, 0,
				      "needs crun's store extension version %u",
				      STORE_EXT_VERSION_FOLD);
	req.keys = s->conn->kv;
	TRY(call(s->conn, &req, n, client_op_deadline(s->conn, 0), &rep));
	it = rep.items;
	for (i = 0; i < n; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		if (dup_bytes(s->conn, "MULTI_GET", &b, &ret_vals[i], &ret_lens[i]) < 0)
			break;
	}
	client_trim(s->conn);
	if (i == n)
		return 0;
	while (i--)
		free(ret_vals[i]);
	return CRUN_ENOMEM;
}

CRUN_API int crun_store_multi_set(crun_store_t *s, const char *const *keys, const void *const *vals,
				  const size_t *lens, size_t n)
{
	struct store_req req = {.op = STORE_OP_MULTI_SET, .nitems = n};
	struct store_bytes *vb;
	int r;

	TRY(client_key_list(s, STORE_OP_MULTI_SET, keys, n));
	if (n && (!vals || !lens))
		return client_set_err(s->conn, CRUN_EINVAL, "MULTI_SET", NULL, 0,
				      "NULL value arrays");
	vb = calloc(n ? n : 1, sizeof(*vb));
	if (!vb)
		return client_set_err(s->conn, CRUN_ENOMEM, "MULTI_SET", NULL, 0, "out of memory");
	for (size_t i = 0; i < n; i++) {
		r = client_check_val(s->conn, "MULTI_SET", vals[i], lens[i]);
		if (r < 0)
			goto out_free;
		vb[i] = (struct store_bytes){vals[i], lens[i]};
	}
	req.keys = s->conn->kv;
	req.vals = vb;
	r = call(s->conn, &req, 0, client_op_deadline(s->conn, 0), NULL);
out_free:
	free(vb);
	return r;
}

CRUN_API int crun_store_ping(crun_store_t *s, uint64_t *ret_rtt_us)
{
	struct store_req req = {.op = STORE_OP_PING};
	struct store_reply rep;
	uint64_t t0;

	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_PING));
	req.u32 = client_rand(s->conn);
	t0 = clock_now_us();
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	if (rep.u32 != req.u32) {
		client_break(s->conn);
		return client_set_err(s->conn, CRUN_EPROTO, "PING", NULL, 0,
				      "nonce %08x echoed as %08x", req.u32, rep.u32);
	}
	if (ret_rtt_us)
		*ret_rtt_us = clock_now_us() - t0;
	return 0;
}

CRUN_API int crun_store_queue_pop(crun_store_t *s, const char *key, int block, uint32_t timeout_ms,
				  void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_QUEUE_POP};
	struct store_reply rep;
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_QUEUE_POP, key, false));
	if (!ret_val)
		return client_set_err(s->conn, CRUN_EINVAL, "QUEUE_POP", NULL, 0, "NULL ret_val");
	deadline = client_op_deadline(s->conn, timeout_ms);
	if (block)
		TRY(do_wait(s->conn, 1, deadline));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, deadline, &rep));
	if (rep.num <= 0)
		return client_set_err(s->conn, CRUN_ENOTFOUND, "QUEUE_POP", key, strlen(key),
				      "queue is empty");
	r = dup_bytes(s->conn, "QUEUE_POP", &rep.val, ret_val, ret_len);
	client_trim(s->conn);
	return r;
}

CRUN_API int crun_store_queue_len(crun_store_t *s, const char *key, int64_t *ret_len)
{
	int64_t n;

	TRY(key_num(s, STORE_OP_QUEUE_LEN, key, 0, false, &n));
	if (ret_len)
		*ret_len = n;
	return 0;
}

CRUN_API void crun_store_free_list(char **list, size_t n)
{
	if (!list)
		return;
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

CRUN_API int crun_store_list_keys(crun_store_t *s, char ***ret_keys, size_t *ret_n)
{
	struct store_req req = {.op = STORE_OP_LIST_KEYS};
	struct store_reply rep;
	const uint8_t *it;
	char **list;
	size_t n = 0;

	if (!s || !ret_keys || !ret_n)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_LIST_KEYS));
	TRY(call(s->conn, &req, 0, client_op_deadline(s->conn, 0), &rep));
	/* The decoder has checked every string lies within the reply, so
	 * nitems bounds the list by the reply's size. */
	list = calloc(rep.nitems ? rep.nitems : 1, sizeof(*list));
	if (!list)
		return client_set_err(s->conn, CRUN_ENOMEM, "LIST_KEYS", NULL, 0, "out of memory");
	it = rep.items;
	for (uint64_t i = 0; i < rep.nitems; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		/* Like PyTorch: keep keys under our prefix, return them without it
		 * (which also hides the raw "init/" key). */
		if (b.len < s->pfx_len || memcmp(b.p, s->pfx, s->pfx_len))
			continue;
		list[n] = malloc(b.len - s->pfx_len + 1);
		if (!list[n]) {
			crun_store_free_list(list, n);
			return client_set_err(s->conn, CRUN_ENOMEM, "LIST_KEYS", NULL, 0,
					      "out of memory");
		}
		memcpy(list[n], b.p + s->pfx_len, b.len - s->pfx_len);
		list[n][b.len - s->pfx_len] = '\0';
		n++;
	}
	client_trim(s->conn);
	*ret_keys = list;
	*ret_n = n;
	return 0;
}

CRUN_API int crun_store_barrier(crun_store_t *s, const char *key, int64_t world_size,
				uint32_t timeout_ms)
{
	struct store_req req = {.op = STORE_OP_BARRIER, .num = world_size};
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_BARRIER, key, false));
	if (world_size <= 0)
		return client_set_err(s->conn, CRUN_EINVAL, "BARRIER", key, strlen(key),
				      "world size %lld", (long long)world_size);
	deadline = client_op_deadline(s->conn, timeout_ms);
	req.key = s->conn->kv[0];
	r = client_send_req(s->conn, &req, deadline);
	if (r < 0) /* not retry_safe: fails, saying so */
		return lost(s->conn, r, STORE_OP_BARRIER, &req.key, 1, deadline);
	return await_wake(s->conn, STORE_OP_BARRIER, &req.key, deadline);
}
