/* lease.c: the server side of crun's store extension (store_ext.h): HELLO,
 * leases with a TTL, keys attached to a lease, and the expiry key that wakes
 * every waiter when a lease ends without a revoke. A lease belongs to the
 * connection that granted it (ids are looked up in that connection's short
 * list), so a dead agent's lease also ends the moment its socket closes.
 * Everything runs on the server's loop.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server_int.h"
#include "store/store_ext.h"

/* A key set under a lease, kept so the lease can delete it. */
struct lease_key {
	struct lease_key *next;
	size_t len;
	uint8_t key[];
};

struct store_lease {
	struct dl conn_link; /* in store_conn.leases */
	struct store_conn *conn;
	uint64_t id;
	uint32_t ttl_ms;
	struct event *timer;
	uint8_t *exp_key, *exp_val; /* owned; exp_key NULL = none */
	size_t exp_key_len, exp_val_len;
	struct lease_key *keys;
	uint32_t nkeys;
};

static int reply(struct store_conn *c, const void *p, size_t len)
{
	return evbuffer_add(store_conn_out(c), p, len) < 0 ? CRUN_ENOMEM : 0;
}

static int reply_u8(struct store_conn *c, uint8_t v)
{
	return reply(c, &v, 1);
}

static struct store_lease *find(struct store_conn *c, uint64_t id)
{
	for (struct dl *n = c->leases.next; n != &c->leases; n = n->next) {
		struct store_lease *l = DL_ENTRY(n, struct store_lease, conn_link);

		if (l->id == id)
			return l;
	}
	return NULL;
}

/* Deletes a key the lease set (without v1 watch notifications: leased keys
 * are a crun extension that PyTorch's WATCH_KEY clients never use). */
static void drop_key(struct store_server *srv, const uint8_t *k, size_t len)
{
	struct kv_ent *e = kv_find(&srv->kv, k, len);

	if (!e || !e->present)
		return;
	kv_drop_value(&srv->kv, e);
	kv_gc(&srv->kv, e);
}

static bool present(struct store_server *srv, const uint8_t *k, size_t len)
{
	struct kv_ent *e = kv_find(&srv->kv, k, len);

	return e && e->present;
}

/* A SET through the normal path, so waiters wake as for any SET. SET sends
 * no reply, so running it "on" c writes nothing to c. */
static int set_via(struct store_conn *c, const uint8_t *k, size_t klen, const uint8_t *v,
		   size_t vlen)
{
	struct store_req q = {.op = STORE_OP_SET};

	q.key = (struct store_bytes){k, klen};
	q.val = (struct store_bytes){v, vlen};
	return store_conn_dispatch(c, &q);
}

/* Ends a lease: its keys go; on expiry (not revoke) its expiry key is set. */
static void lease_end(struct store_lease *l, bool expired)
{
	struct store_server *srv = l->conn->srv;
	struct lease_key *k = l->keys;

	while (k) {
		struct lease_key *next = k->next;

		drop_key(srv, k->key, k->len);
		free(k);
		k = next;
	}
	/* The first reason wins: an expiry key already set (another failure,
	 * or a deliberate "failed") is left as it is. */
	if (expired && l->exp_key && !present(srv, l->exp_key, l->exp_key_len) &&
	    set_via(l->conn, l->exp_key, l->exp_key_len, l->exp_val, l->exp_val_len) < 0)
		log_at(LL_WARN, SUB_STORE, "lease %llu: cannot set its expiry key",
		       (unsigned long long)l->id);
	if (expired)
		log_at(LL_INFO, SUB_STORE, "lease %llu ended (%s)", (unsigned long long)l->id,
		       "expired or its connection closed");
	dl_del(&l->conn_link);
	l->conn->n_regs--;
	if (l->timer)
		event_free(l->timer);
	free(l->exp_key);
	free(l->exp_val);
	free(l);
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
	struct store_lease *l = arg;

	(void)fd;
	(void)what;
	lease_end(l, true);
}

static int arm(struct store_lease *l)
{
	struct timeval tv = {l->ttl_ms / 1000, (suseconds_t)(l->ttl_ms % 1000) * 1000};

	return evtimer_add(l->timer, &tv) < 0 ? CRUN_ENOMEM : 0;
}

static int op_grant(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_server *srv = c->srv;
	struct store_lease *l;
	uint8_t b[8];

	if (q->ttl_ms < 1 || q->ttl_ms > STORE_EXT_TTL_MAX)
		return CRUN_EPROTO;
	if (c->n_regs >= srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	l = calloc(1, sizeof(*l));
	if (!l)
		return CRUN_ENOMEM;
	DL_INIT(&l->conn_link);
	l->conn = c;
	l->ttl_ms = (uint32_t)q->ttl_ms;
	l->id = ++srv->next_lease_id;
	l->timer = evtimer_new(srv->base, on_expire, l);
	if (!l->timer)
		goto nomem;
	if (q->key.len) {
		l->exp_key = mem_dup(q->key.p, q->key.len);
		l->exp_val = mem_dup(q->val.p, q->val.len); /* 0 bytes: malloc(1) */
		if (!l->exp_key || !l->exp_val)
			goto nomem;
		l->exp_key_len = q->key.len;
		l->exp_val_len = q->val.len;
	}
	if (arm(l) < 0)
		goto nomem;
	dl_add_tail(&c->leases, &l->conn_link);
	c->n_regs++; /* leases count against max_items like waits */
	store_put_u64(b, l->id);
	return reply(c, b, 8);
nomem:
	if (l->timer)
		event_free(l->timer);
	free(l->exp_key);
	free(l->exp_val);
	free(l);
	return CRUN_ENOMEM;
}

static int op_set_leased(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_lease *l = find(c, q->id);
	struct lease_key *k;

	if (!l)
		return reply_u8(c, STORE_EXT_NO_LEASE);
	for (k = l->keys; k; k = k->next)
		if (k->len == q->key.len && memcmp(k->key, q->key.p, k->len) == 0)
			break;
	if (!k) {
		if (l->nkeys >= c->srv->cfg.limits.max_items)
			return CRUN_ETOOBIG;
		k = malloc(sizeof(*k) + q->key.len);
		if (!k)
			return CRUN_ENOMEM;
		k->len = q->key.len;
		memcpy(k->key, q->key.p, q->key.len);
		k->next = l->keys;
		l->keys = k;
		l->nkeys++;
	}
	TRY(set_via(c, q->key.p, q->key.len, q->val.p, q->val.len));
	return reply_u8(c, STORE_EXT_OK);
}

int store_ext_process(struct store_conn *c, const uint8_t *buf, size_t len, size_t *used)
{
	struct store_ext_req q;
	struct store_lease *l;
	int r;

	r = store_ext_decode_req(&c->srv->cfg.limits, buf, len, &q, used);
	if (r < 0)
		return r;
	if (!c->ext && q.op != STORE_EXT_HELLO)
		return CRUN_EPROTO; /* as any unknown op code on a PyTorch connection */
	c->srv->st.requests++;
	switch (q.op) {
	case STORE_EXT_HELLO: {
		uint8_t b[4];

		if (q.magic != STORE_EXT_MAGIC || q.version < 1)
			return CRUN_EPROTO;
		c->ext = true;
		store_put_u32(b, STORE_EXT_VERSION);
		return reply(c, b, 4);
	}
	case STORE_EXT_LEASE_GRANT:
		return op_grant(c, &q);
	case STORE_EXT_LEASE_KEEPALIVE:
		l = find(c, q.id);
		if (l)
			TRY(arm(l));
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_LEASE_REVOKE:
		l = find(c, q.id);
		if (l)
			lease_end(l, false);
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_SET_LEASED:
		return op_set_leased(c, &q);
	default:
		return CRUN_EPROTO;
	}
}

void store_ext_conn_closed(struct store_conn *c)
{
	if (!c->leases.next)
		return; /* never initialised (a connection that failed to set up) */
	while (!DL_EMPTY(&c->leases))
		lease_end(DL_ENTRY(c->leases.next, struct store_lease, conn_link), true);
}
