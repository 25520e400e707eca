/* lease.c: the server side of crun's store extension (store_ext.h): HELLO,
 * leases with a TTL, keys attached to a lease, the expiry key that wakes
 * every waiter when a lease ends without a revoke, re-attaching a lease from
 * a new connection, and stretching deadlines over a stall of the loop.
 *
 * Every lease is in one table by id (random, so ids from before a server
 * restart are not found after it). A lease is held by at most one
 * connection. An orderly close by the holder's peer (FIN: its process closed
 * the socket or exited) ends its leases at once, as an expiry; any other end
 * of the connection (a reset, an error, the server dropping it) only detaches
 * them: they end TTL after their last sign of life (grant, keep-alive,
 * attach), held or not, unless re-attached. Deadlines are kept
 * here on CLOCK_MONOTONIC (the loop's timer clock); a lease's timer is only a
 * wake-up that checks the deadline, so moving deadlines later (stall_check)
 * needs no timer surgery: an early timer re-arms itself.
 * Everything runs on the server's loop.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

/* The tick that measures the loop's lag while leases exist. A gap between
 * ticks longer than LEASE_TICK_MS + LEASE_STALL_MIN_MS is a stall: the loop
 * could not read keep-alives for (gap - LEASE_TICK_MS) and every deadline
 * moves later by that much. Smaller lags are ordinary jitter the TTL absorbs. */
#define LEASE_TICK_MS	   100
#define LEASE_STALL_MIN_MS 100
#define LEASE_BUCKETS_MIN  64

/* A key set under a lease, kept so the lease can delete it. */
struct lease_key {
	struct lease_key *next;
	size_t len;
	uint8_t key[];
};

struct store_lease {
	struct dl conn_link;	   /* in holder->leases; self-linked while detached */
	struct store_lease *hnext; /* lease_table chain */
	struct lease_table *tab;   /* borrowed */
	struct store_conn *holder; /* borrowed; NULL while detached */
	uint64_t id;
	uint32_t ttl_ms;
	uint64_t deadline_ms; /* clock_now_ms() from which it is over */
	struct event *timer;
	uint8_t *exp_key, *exp_val; /* owned; exp_key NULL = none */
	size_t exp_key_len, exp_val_len;
	struct lease_key *keys;
	uint32_t nkeys;
};

struct lease_table {
	struct store_server *srv; /* borrowed */
	struct store_lease **b;	  /* chains by id */
	size_t mask;		  /* bucket count - 1 */
	size_t n;		  /* leases, held or detached */
	struct event *tick;	  /* pending while n > 0 */
	uint64_t last_tick_ms;
	uint64_t seq; /* fallback id source when getrandom() fails */
};

static int reply(struct store_conn *c, const void *p, size_t len)
{
	return evbuffer_add(store_conn_out(c), p, len) < 0 ? CRUN_ENOMEM : 0;
}

/* ---- the table ------------------------------------------------------------------ */

static void on_tick(evutil_socket_t fd, short what, void *arg);

static struct lease_table *tab_get(struct store_server *srv)
{
	struct lease_table *t = srv->leases;

	if (t)
		return t;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->srv = srv;
	t->b = calloc(LEASE_BUCKETS_MIN, sizeof(*t->b));
	t->tick = event_new(srv->base, -1, EV_PERSIST, on_tick, t);
	if (!t->b || !t->tick) {
		if (t->tick)
			event_free(t->tick);
		free(t->b);
		free(t);
		return NULL;
	}
	t->mask = LEASE_BUCKETS_MIN - 1;
	srv->leases = t;
	return t;
}

static struct store_lease *tab_find(const struct lease_table *t, uint64_t id)
{
	if (!t)
		return NULL;
	for (struct store_lease *l = t->b[id & t->mask]; l; l = l->hnext)
		if (l->id == id)
			return l;
	return NULL;
}

/* Doubles the bucket array when the table is full; on ENOMEM the chains just
 * grow longer, which is slower, not wrong. */
static void tab_grow(struct lease_table *t)
{
	size_t nb = (t->mask + 1) * 2;
	struct store_lease **b;

	if (t->n < t->mask + 1)
		return;
	b = calloc(nb, sizeof(*b));
	if (!b)
		return;
	for (size_t i = 0; i <= t->mask; i++) {
		struct store_lease *l = t->b[i];

		while (l) {
			struct store_lease *next = l->hnext;

			l->hnext = b[l->id & (nb - 1)];
			b[l->id & (nb - 1)] = l;
			l = next;
		}
	}
	free(t->b);
	t->b = b;
	t->mask = nb - 1;
}

static void tab_remove(struct lease_table *t, struct store_lease *l)
{
	for (struct store_lease **pp = &t->b[l->id & t->mask]; *pp; pp = &(*pp)->hnext) {
		if (*pp == l) {
			*pp = l->hnext;
			t->n--;
			break;
		}
	}
	if (t->n == 0)
		event_del(t->tick);
}

/* A fresh id: random (not guessable, and not reused by a restarted server),
 * non-zero, not in use. */
static uint64_t new_id(struct lease_table *t)
{
	for (int i = 0; i < 16; i++) {
		uint64_t id = 0;

		if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != (ssize_t)sizeof(id)) {
			/* splitmix64 of a counter and the clock */
			id = clock_now_us() + ++t->seq * 0x9E3779B97F4A7C15ULL;
			id = (id ^ (id >> 30)) * 0xBF58476D1CE4E5B9ULL;
			id = (id ^ (id >> 27)) * 0x94D049BB133111EBULL;
			id ^= id >> 31;
		}
		if (id && !tab_find(t, id))
			return id;
	}
	return 0;
}

/* ---- stalls ----------------------------------------------------------------------- */

/* Measures the loop's lag since the last tick; after a stall, moves every
 * deadline later by it (their timers re-arm when they fire early). */
static void stall_check(struct lease_table *t)
{
	uint64_t now = clock_now_ms(), gap = now - t->last_tick_ms, lag;

	t->last_tick_ms = now;
	if (gap <= LEASE_TICK_MS + LEASE_STALL_MIN_MS)
		return;
	lag = gap - LEASE_TICK_MS;
	for (size_t i = 0; i <= t->mask; i++)
		for (struct store_lease *l = t->b[i]; l; l = l->hnext)
			l->deadline_ms += lag;
	log_at(LL_INFO, SUB_STORE,
	       "store loop stalled for %llu ms: %zu leases extended by the stall",
	       (unsigned long long)lag, t->n);
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	stall_check(arg);
}

/* ---- one lease -------------------------------------------------------------------- */

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

static void detach(struct store_lease *l)
{
	if (!l->holder)
		return;
	dl_del(&l->conn_link);
	l->holder->n_regs--;
	l->holder = NULL;
}

/* Frees l and its key list; no effect on the key space. */
static void lease_free(struct store_lease *l)
{
	struct lease_key *k = l->keys;

	while (k) {
		struct lease_key *next = k->next;

		free(k);
		k = next;
	}
	detach(l);
	tab_remove(l->tab, l);
	if (l->timer)
		event_free(l->timer);
	free(l->exp_key);
	free(l->exp_val);
	free(l);
}

/* Ends a lease: its keys go; on expiry (not revoke) its expiry key is set. */
static void lease_end(struct store_lease *l, bool expired)
{
	struct store_server *srv = l->tab->srv;

	for (struct lease_key *k = l->keys; k; k = k->next)
		drop_key(srv, k->key, k->len);
	/* The first reason wins: an expiry key already set (another failure,
	 * or a deliberate "failed") is left as it is. */
	if (expired && l->exp_key && !present(srv, l->exp_key, l->exp_key_len)) {
		struct store_bytes k = {l->exp_key, l->exp_key_len};
		struct store_bytes v = {l->exp_val, l->exp_val_len};

		if (store_server_set_key(srv, &k, &v) < 0)
			log_at(LL_WARN, SUB_STORE, "lease %016llx: cannot set its expiry key",
			       (unsigned long long)l->id);
	}
	/* Two rows: an expiry means a holder was lost (what an alert is for), a
	 * revoke is its holder saying it is done (crun's agents revoke when the
	 * job ended and when they stop). */
	srv->metrics[expired ? STORE_M_LEASE_EXPIRED : STORE_M_LEASE_RELEASED]++;
	if (expired && l->holder && l->holder->peer_eof)
		log_at(LL_INFO, SUB_STORE, "lease %016llx ended: its holder closed the connection",
		       (unsigned long long)l->id);
	else if (expired)
		log_at(LL_INFO, SUB_STORE, "lease %016llx expired: no keep-alive for %u ms (%s)",
		       (unsigned long long)l->id, l->ttl_ms,
		       l->holder ? "its connection is open" : "its connection was reset");
	lease_free(l);
}

static int arm_in(struct store_lease *l, uint64_t ms)
{
	struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

	return evtimer_add(l->timer, &tv) < 0 ? CRUN_ENOMEM : 0;
}

/* A sign of life: the TTL starts again. */
static int arm(struct store_lease *l)
{
	l->deadline_ms = clock_now_ms() + l->ttl_ms;
	return arm_in(l, l->ttl_ms);
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
	struct store_lease *l = arg;
	uint64_t now;

	(void)fd;
	(void)what;
	/* Timers of a stalled loop fire together on resume, maybe before the
	 * tick: measure the stall first so it is not charged to the lease. */
	stall_check(l->tab);
	now = clock_now_ms();
	if (now < l->deadline_ms && arm_in(l, l->deadline_ms - now) == 0)
		return;
	lease_end(l, true);
}

/* c becomes l's holder (taking it from another connection, if any). */
static int attach(struct store_conn *c, struct store_lease *l)
{
	if (l->holder != c) {
		if (c->n_regs >= c->srv->cfg.limits.max_items)
			return CRUN_ETOOBIG;
		detach(l);
		l->holder = c;
		dl_add_tail(&c->leases, &l->conn_link);
		c->n_regs++; /* leases count against max_items like waits */
	}
	return arm(l);
}

/* The lease id if c holds it, else NULL. */
static struct store_lease *held(struct store_conn *c, uint64_t id)
{
	struct store_lease *l = tab_find(c->srv->leases, id);

	return l && l->holder == c ? l : NULL;
}

/* A new lease held by c (GRANT, GRANT_SET); the caller replies its id. */
static int grant(struct store_conn *c, const struct store_ext_req *q, struct store_lease **ret)
{
	struct store_server *srv = c->srv;
	struct lease_table *t;
	struct store_lease *l;

	if (q->ttl_ms < 1 || q->ttl_ms > STORE_EXT_TTL_MAX)
		return CRUN_EPROTO;
	if (c->n_regs >= srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	t = tab_get(srv);
	if (!t)
		return CRUN_ENOMEM;
	/* Detached leases outlive their connection: bound them server-wide. */
	if (t->n >= srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	l = calloc(1, sizeof(*l));
	if (!l)
		return CRUN_ENOMEM;
	DL_INIT(&l->conn_link);
	l->tab = t;
	l->ttl_ms = (uint32_t)q->ttl_ms;
	l->id = new_id(t);
	l->timer = evtimer_new(srv->base, on_expire, l);
	if (!l->id || !l->timer)
		goto nomem;
	if (q->key.len) {
		l->exp_key = mem_dup(q->key.p, q->key.len);
		l->exp_val = mem_dup(q->val.p, q->val.len); /* 0 bytes: malloc(1) */
		if (!l->exp_key || !l->exp_val)
			goto nomem;
		l->exp_key_len = q->key.len;
		l->exp_val_len = q->val.len;
	}
	if (t->n == 0) {
		const struct timeval tv = {0, LEASE_TICK_MS * 1000};

		if (evtimer_add(t->tick, &tv) < 0)
			goto nomem;
		t->last_tick_ms = clock_now_ms();
	}
	tab_grow(t);
	l->hnext = t->b[l->id & t->mask];
	t->b[l->id & t->mask] = l;
	t->n++;
	if (attach(c, l) < 0) {
		lease_free(l);
		return CRUN_ENOMEM;
	}
	*ret = l;
	return 0;
nomem:
	if (l->timer)
		event_free(l->timer);
	free(l->exp_key);
	free(l->exp_val);
	free(l);
	return CRUN_ENOMEM;
}

/* Sets key to val under l (SET_LEASED, GRANT_SET). */
static int set_leased(struct store_conn *c, struct store_lease *l, struct store_bytes key,
		      struct store_bytes val)
{
	struct lease_key *k;

	for (k = l->keys; k; k = k->next)
		if (k->len == key.len && memcmp(k->key, key.p, k->len) == 0)
			break;
	if (!k) {
		if (l->nkeys >= c->srv->cfg.limits.max_items)
			return CRUN_ETOOBIG;
		k = malloc(sizeof(*k) + key.len);
		if (!k)
			return CRUN_ENOMEM;
		k->len = key.len;
		memcpy(k->key, key.p, key.len);
		k->next = l->keys;
		l->keys = k;
		l->nkeys++;
	}
	return store_server_set_key(c->srv, &key, &val);
}

/* LEASE_GRANT, and GRANT_SET: the grant and its first key in one step. */
static int op_grant(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_lease *l = NULL;
	uint8_t b[8];

	TRY(grant(c, q, &l));
	if (q->op == STORE_EXT_GRANT_SET)
		TRY(set_leased(c, l, q->key2, q->val2));
	store_put_u64(b, l->id);
	return reply(c, b, 8);
}

static int ext_run(struct store_conn *c, const struct store_ext_req *req, uint32_t served)
{
	const struct store_ext_req q = *req;
	struct store_lease *l;

	switch (q.op) {
	case STORE_EXT_HELLO: {
		uint8_t b[4];

		if (q.magic != STORE_EXT_MAGIC || q.version < 1)
			return CRUN_EPROTO;
		c->ext = true;
		c->ext_peer = q.version;
		store_put_u32(b, served);
		return reply(c, b, 4);
	}
	case STORE_EXT_LEASE_GRANT:
	case STORE_EXT_GRANT_SET:
		return op_grant(c, &q);
	case STORE_EXT_LEASE_KEEPALIVE:
		l = held(c, q.id);
		if (l)
			TRY(arm(l));
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_LEASE_ATTACH:
		l = tab_find(c->srv->leases, q.id);
		if (l)
			TRY(attach(c, l));
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_LEASE_REVOKE:
		l = held(c, q.id);
		if (l)
			lease_end(l, false);
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_SET_LEASED:
		l = held(c, q.id);
		if (l)
			TRY(set_leased(c, l, q.key, q.val));
		return reply_u8(c, l ? STORE_EXT_OK : STORE_EXT_NO_LEASE);
	case STORE_EXT_WAIT_ANY_GET:
	case STORE_EXT_WAIT_ANY_GET_WITH:
		l = q.id ? held(c, q.id) : NULL;
		if (l) /* the wait's keep-alive (store_ext.h) */
			TRY(arm(l));
		return store_conn_wait_any(c, &q);
	case STORE_EXT_WAIT_ANY:
		return store_conn_wait_any(c, &q);
	case STORE_EXT_TRY_GET:
	case STORE_EXT_TICKET:
		return store_conn_ext_kv(c, &q);
	case STORE_EXT_MUX:
	case STORE_EXT_WAIT_TAG:
	case STORE_EXT_WAIT_TAG_CANCEL:
		return store_conn_mux_op(c, &q);
	default:
		return CRUN_EPROTO;
	}
}

int store_ext_process(struct store_conn *c, const uint8_t *buf, size_t len, size_t *used)
{
	uint32_t served = c->srv->cfg.ext_version ? MIN(c->srv->cfg.ext_version, STORE_EXT_VERSION)
						  : STORE_EXT_VERSION;
	struct store_ext_req q;
	int r;

	r = store_ext_decode_req(&c->srv->cfg.limits, buf, len, &q, used);
	if (r < 0)
		return r;
	if (!c->ext && q.op != STORE_EXT_HELLO)
		return CRUN_EPROTO; /* as any unknown op code on a PyTorch connection */
	if (store_ext_op_version(q.op) > served)
		return CRUN_EPROTO; /* as a server of that version: an unknown op */
	c->srv->st.requests++;
	/* A muxed connection frames each reply (store_ext.h). */
	TRY(store_conn_mux_begin(c,
				 q.op == STORE_EXT_WAIT_ANY || q.op == STORE_EXT_WAIT_ANY_GET ||
				     q.op == STORE_EXT_WAIT_ANY_GET_WITH,
				 store_ext_reply_size(q.op) != 0));
	r = ext_run(c, &q, served);
	store_conn_mux_end(c);
	return r;
}

void store_ext_conn_closed(struct store_conn *c)
{
	if (!c->leases.next)
		return; /* never initialised (a connection that failed to set up) */
	while (!DL_EMPTY(&c->leases)) {
		struct store_lease *l = DL_ENTRY(c->leases.next, struct store_lease, conn_link);

		if (c->peer_eof) {
			/* The holder's process closed the socket or died (its
			 * kernel sent FIN): nobody will re-attach. */
			lease_end(l, true);
			continue;
		}
		log_at(LL_DEBUG, SUB_STORE, "lease %016llx: its connection was reset; kept %s",
		       (unsigned long long)l->id, "for the rest of its TTL");
		detach(l);
	}
}

void store_ext_server_free(struct store_server *srv)
{
	struct lease_table *t = srv->leases;

	if (!t)
		return;
	for (size_t i = 0; i <= t->mask; i++)
		while (t->b[i])
			lease_free(t->b[i]);
	event_free(t->tick);
	free(t->b);
	free(t);
	srv->leases = NULL;
}
