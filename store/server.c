/* server.c: the TCPStore-compatible store server on libevent: listener,
 * per-connection bufferevents, dialect sniffing, and the operation semantics
 * of ../shared/reference/torch-compat.md §1.4. One event_base, lent by the
 * caller; no threads, no locks. The key space lives in kv.c.
 *
 * WAIT ordering. PyTorch's servers never stop reading a connection that has a
 * WAIT pending; its STOP_WAITING simply goes out whenever the keys appear.
 *   - v1 (1.13): after a client-side wait timeout the 1.13 client keeps using
 *     the connection without telling the server, so a v1 connection is never
 *     parked; torch's exact counting (a later WAIT overwrites the count, older
 *     registrations still decrement it) is kept.
 *   - v2: the client cancels a timed-out wait with CANCEL_WAIT, so a v2
 *     connection with a pending WAIT/BARRIER is parked: its later input stays
 *     buffered (answers stay in request order) except a CANCEL_WAIT at the
 *     front, which is read and answered at once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/server_int.h"
#include "store/store.h"

struct store_server {
	struct event_base *base; /* borrowed */
	struct evconnlistener *lsn;
	struct event *accept_retry; /* re-enables accept after EMFILE */
	struct store_server_config cfg;
	struct kv_table kv;
	bool kv_ready;
	struct dl conns;
	uint16_t port;
	bool full_logged; /* max_conns warning printed since the last accept */
	struct store_server_stats st;
};

struct store_conn {
	struct dl link;	   /* in store_server.conns */
	struct dl waits;   /* struct kv_reg.conn_link of WAIT/BARRIER keys */
	struct dl watches; /* v1 WATCH_KEY registrations */
	struct store_server *srv;
	struct bufferevent *bev;
	uint64_t pending; /* keys this connection still waits for */
	uint32_t n_regs;  /* waits + watches, bounded by limits.max_items */
	uint8_t dialect;  /* 0 until sniffed, then enum store_dialect */
	bool parked;	  /* v2 WAIT/BARRIER outstanding: input stays buffered */
	bool throttled;	  /* output over the ceiling: reading paused */
	bool writing;	  /* EV_WRITE on: the bufferevent flushes what write() left */
	bool doomed;	  /* another connection's op overfilled our output */
};

static bool conn_process(struct store_conn *c);

/* ---- connection teardown --------------------------------------------------- */

static void reg_free(struct store_server *srv, struct kv_reg *reg, bool is_wait)
{
	struct kv_ent *e = reg->ent;

	dl_del(&reg->key_link);
	dl_del(&reg->conn_link);
	reg->conn->n_regs--;
	if (is_wait)
		srv->st.waiters--;
	free(reg);
	kv_gc(&srv->kv, e);
}

static void conn_drop_waits(struct store_conn *c)
{
	while (!DL_EMPTY(&c->waits))
		reg_free(c->srv, DL_ENTRY(c->waits.next, struct kv_reg, conn_link), true);
	c->pending = 0;
}

/* The one close path: unregisters every wait and watch, frees the
 * bufferevent (closing the socket) and the connection. Callers return at once. */
static void conn_close(struct store_conn *c)
{
	struct store_server *srv = c->srv;

	conn_drop_waits(c);
	while (!DL_EMPTY(&c->watches))
		reg_free(srv, DL_ENTRY(c->watches.next, struct kv_reg, conn_link), false);
	dl_del(&c->link);
	bufferevent_free(c->bev);
	srv->st.conns--;
	free(c);
}

static void peer_name(int fd, char *buf, size_t cap)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	uint16_t port = 0;

	if (getpeername(fd, (struct sockaddr *)&ss, &len) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;

			inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
			port = ntohs(a->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
			port = ntohs(a->sin6_port);
		}
	}
	if (str_printf(buf, cap, "%s:%u", host, port) < 0)
		buf[0] = '\0';
}

/* Closes a connection for bad or over-limit input, logged once at WARN. */
static void conn_drop(struct store_conn *c, int err, const char *what)
{
	char peer[INET6_ADDRSTRLEN + 8];

	peer_name(bufferevent_getfd(c->bev), peer, sizeof(peer));
	log_at(LL_WARN, SUB_STORE, "dropping client %s: %s (%s)", peer, what, crun_strerror(err));
	c->srv->st.dropped_conns++;
	conn_close(c);
}

/* ---- replies --------------------------------------------------------------- */

static struct evbuffer *conn_out(struct store_conn *c)
{
	return bufferevent_get_output(c->bev);
}

/* Replies are written straight from the callback that made them: one
 * writev, instead of arming EV_WRITE and writing on the next loop turn (two
 * epoll_ctl calls per request). Only what the socket does not take, or an
 * error, is left to the bufferevent, whose callbacks then finish the job. */
static void conn_flush(struct store_conn *c)
{
	struct evbuffer *out = conn_out(c);

	if (c->writing || !evbuffer_get_length(out))
		return;
	/* A socket bufferevent freezes its output's start so only it drains
	 * it; write the way its own write callback does. */
	evbuffer_unfreeze(out, 1);
	(void)evbuffer_write(out, bufferevent_getfd(c->bev));
	evbuffer_freeze(out, 1);
	if (!evbuffer_get_length(out))
		return;
	c->writing = true;
	bufferevent_enable(c->bev, EV_WRITE);
}

static int reply_u8(struct store_conn *c, uint8_t v)
{
	return evbuffer_add(conn_out(c), &v, 1) < 0 ? CRUN_ENOMEM : 0;
}

static int reply_i64(struct store_conn *c, int64_t v)
{
	uint8_t b[8];

	store_put_u64(b, (uint64_t)v);
	return evbuffer_add(conn_out(c), b, sizeof(b)) < 0 ? CRUN_ENOMEM : 0;
}

/* A u64 length and the bytes; small values go out in one evbuffer_add. */
static int reply_bytes(struct store_conn *c, const uint8_t *p, size_t len)
{
	uint8_t b[8 + 248];

	if (len <= sizeof(b) - 8) {
		store_put_bytes(b, p, len);
		return evbuffer_add(conn_out(c), b, 8 + len) < 0 ? CRUN_ENOMEM : 0;
	}
	store_put_u64(b, len);
	if (evbuffer_add(conn_out(c), b, 8) < 0 || evbuffer_add(conn_out(c), p, len) < 0)
		return CRUN_ENOMEM;
	return 0;
}

/* Output pushed to a connection by someone else's operation (wake-ups, watch
 * notifications) is not throttled; a connection that lets it pile up past the
 * ceiling is closed from its own (deferred) callback. */
static void conn_check_pushed(struct store_conn *c)
{
	/* Twice the ceiling: a throttled connection may already hold a full
	 * ceiling of its own replies when a wake-up arrives. */
	if (evbuffer_get_length(conn_out(c)) / 2 <= c->srv->cfg.max_conn_buffered_bytes)
		return;
	c->doomed = true;
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* ---- waits ----------------------------------------------------------------- */

/* Lets a parked connection read on; its buffered input is processed from a
 * deferred callback, never re-entrantly from another connection's op. */
static void conn_unpark(struct store_conn *c)
{
	if (!c->parked)
		return;
	c->parked = false;
	if (evbuffer_get_length(bufferevent_get_input(c->bev)))
		bufferevent_trigger(c->bev, EV_READ,
				    BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* One registration of c fired. Like torch, a count already at 0 (a stale
 * registration of an overwritten v1 WAIT) sends nothing. Returns true when
 * this completed c's wait. */
static bool wait_step(struct store_conn *c)
{
	if (c->pending == 0 || --c->pending)
		return false;
	if (reply_u8(c, STORE_WAIT_STOP_WAITING) < 0)
		c->doomed = true;
	conn_flush(c);
	conn_unpark(c);
	conn_check_pushed(c);
	return true;
}

/* Wakes every waiter of e (a key was created or written). */
static void wake_all(struct store_server *srv, struct kv_ent *e)
{
	while (!DL_EMPTY(&e->waiters)) {
		struct kv_reg *reg = DL_ENTRY(e->waiters.next, struct kv_reg, key_link);
		struct store_conn *w = reg->conn;

		dl_del(&reg->key_link);
		dl_del(&reg->conn_link);
		w->n_regs--;
		srv->st.waiters--;
		free(reg);
		wait_step(w);
	}
}

/* QUEUE_PUSH: the first waiter whose count reaches 0 gets the item; the
 * registrations visited on the way are consumed, as in torch's libuv server. */
static void wake_one(struct store_server *srv, struct kv_ent *e)
{
	while (!DL_EMPTY(&e->waiters)) {
		struct kv_reg *reg = DL_ENTRY(e->waiters.next, struct kv_reg, key_link);
		struct store_conn *w = reg->conn;

		dl_del(&reg->key_link);
		dl_del(&reg->conn_link);
		w->n_regs--;
		srv->st.waiters--;
		free(reg);
		if (wait_step(w))
			return;
	}
}

static int reg_add(struct store_conn *c, struct kv_ent *e, bool is_wait)
{
	struct kv_reg *reg = malloc(sizeof(*reg));

	if (!reg)
		return CRUN_ENOMEM;
	reg->conn = c;
	reg->ent = e;
	dl_add_tail(is_wait ? &e->waiters : &e->watchers, &reg->key_link);
	dl_add_tail(is_wait ? &c->waits : &c->watches, &reg->conn_link);
	c->n_regs++;
	if (is_wait)
		c->srv->st.waiters++;
	return 0;
}

static bool key_exists(const struct kv_ent *e)
{
	/* Newest torch counts a non-empty queue as present for CHECK/WAIT, so a
	 * blocking QUEUE_POP (WAIT, then POP) wakes on a push. */
	return e && (e->present || e->q_len);
}

/* ---- writes ---------------------------------------------------------------- */

/* v1 WATCH_KEY notification: type, key, old value, new value. */
static void notify_watchers(struct store_server *srv, struct kv_ent *e, uint8_t type,
			    const uint8_t *old, size_t old_len, const uint8_t *nv, size_t new_len)
{
	struct dl *n;
	uint8_t hdr[9];

	hdr[0] = type;
	store_put_u64(hdr + 1, e->key_len);
	for (n = e->watchers.next; n != &e->watchers; n = n->next) {
		struct store_conn *w = DL_ENTRY(n, struct kv_reg, key_link)->conn;
		struct evbuffer *out = conn_out(w);
		uint8_t l[8];
		int r = evbuffer_add(out, hdr, sizeof(hdr));

		r |= evbuffer_add(out, e->key, e->key_len);
		store_put_u64(l, old_len);
		r |= evbuffer_add(out, l, 8);
		if (old_len)
			r |= evbuffer_add(out, old, old_len);
		store_put_u64(l, new_len);
		r |= evbuffer_add(out, l, 8);
		if (new_len)
			r |= evbuffer_add(out, nv, new_len);
		if (r)
			w->doomed = true;
		conn_flush(w);
		conn_check_pushed(w);
	}
}

/* Stores (or appends) a value under e, enforcing the key space's total value
 * ceiling, and tells v1 watchers. The caller replies, then wakes waiters. */
static int put_value(struct store_server *srv, struct kv_ent *e, const uint8_t *v, size_t len,
		     bool append)
{
	size_t old_len = e->present ? e->val_len : 0;
	size_t after = srv->kv.value_bytes - (append ? 0 : old_len) + len;
	bool created = !e->present;
	uint8_t *old = NULL;
	int r;

	if (after > srv->cfg.max_total_value_bytes)
		return CRUN_ETOOBIG;
	if (!DL_EMPTY(&e->watchers) && old_len) {
		old = mem_dup(e->val, old_len);
		if (!old)
			return CRUN_ENOMEM;
	}
	r = kv_put(&srv->kv, e, v, len, append);
	if (r < 0) {
		free(old);
		return r;
	}
	if (!DL_EMPTY(&e->watchers))
		notify_watchers(srv, e, created ? STORE_WATCH_CREATED : STORE_WATCH_UPDATED, old,
				old ? old_len : 0, e->val, e->val_len);
	free(old);
	return 0;
}

static int set_key(struct store_server *srv, const struct store_bytes *k,
		   const struct store_bytes *v, bool append)
{
	struct kv_ent *e;

	TRY(kv_get_or_add(&srv->kv, k->p, k->len, &e));
	TRY(put_value(srv, e, v->p, v->len, append));
	wake_all(srv, e);
	return 0;
}

/* std::stoll as torch's ADD applies it to the stored text: leading
 * whitespace, an optional sign, at least one digit, trailing junk ignored;
 * no digits or overflow is an error (torch closes the connection). */
static int parse_stoll(const uint8_t *p, size_t len, int64_t *ret)
{
	size_t i = 0;
	bool neg = false;
	uint64_t v = 0, lim;

	while (i < len && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
		i++;
	if (i < len && (p[i] == '+' || p[i] == '-'))
		neg = p[i++] == '-';
	if (i >= len || p[i] < '0' || p[i] > '9')
		return CRUN_EPROTO;
	lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
		unsigned d = p[i] - '0';

		if (v > (lim - d) / 10)
			return CRUN_ERANGE;
		v = v * 10 + d;
	}
	*ret = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
}

/* std::to_string of an int64; returns the length written into buf[21]. */
static size_t i64_text(int64_t v, char *buf)
{
	char tmp[24];
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = 0, len = 0;

	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		buf[len++] = '-';
	while (n)
		buf[len++] = tmp[--n];
	return len;
}

/* ADD and BARRIER: the value is a decimal counter (missing = 0) stored back
 * as text. Wrapping on overflow, where torch has undefined behaviour. */
static int add_counter(struct store_server *srv, struct kv_ent *e, int64_t delta, int64_t *ret)
{
	int64_t cur = 0;
	char text[24];

	if (e->present)
		TRY(parse_stoll(e->val, e->val_len, &cur));
	cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
	TRY(put_value(srv, e, (const uint8_t *)text, i64_text(cur, text), false));
	*ret = cur;
	return 0;
}

/* ---- operations ------------------------------------------------------------ */

static int op_get(struct store_conn *c, const struct store_req *q)
{
	struct kv_ent *e = kv_find(&c->srv->kv, q->key.p, q->key.len);

	if (e && e->present)
		return reply_bytes(c, e->val, e->val_len);
	/* Missing key: 1.13's server throws and closes; libuv sends empty. */
	if (c->dialect == STORE_V1)
		return CRUN_ENOTFOUND;
	return reply_bytes(c, NULL, 0);
}

static int op_add(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;
	int64_t v;

	TRY(kv_get_or_add(&srv->kv, q->key.p, q->key.len, &e));
	TRY(add_counter(srv, e, q->num, &v));
	TRY(reply_i64(c, v));
	wake_all(srv, e);
	return 0;
}

/* The COMPARE_SET table of §1.4, including "absent key, non-empty expected:
 * reply expected, store nothing". Waiters wake whenever the key exists after
 * the operation (torch's libuv server wakes always, legacy never). */
static int op_compare_set(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);

	if (!e || !e->present) {
		if (q->val.len)
			return reply_bytes(c, q->val.p, q->val.len);
		TRY(kv_get_or_add(&srv->kv, q->key.p, q->key.len, &e));
		TRY(put_value(srv, e, q->val2.p, q->val2.len, false));
	} else if (e->val_len == q->val.len && !memcmp(e->val, q->val.p, q->val.len)) {
		TRY(put_value(srv, e, q->val2.p, q->val2.len, false));
	}
	TRY(reply_bytes(c, e->val, e->val_len));
	wake_all(srv, e);
	return 0;
}

/* CHECK and WAIT over a key list. A WAIT counts the missing keys and
 * registers on each; its STOP_WAITING goes out when the count reaches 0. */
static int op_wait(struct store_conn *c, const struct store_req *q, bool check)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	uint64_t missing = 0;
	struct store_bytes k;

	for (uint64_t i = 0; i < q->nitems; i++) {
		store_items_next(&it, &k);
		if (!key_exists(kv_find(&srv->kv, k.p, k.len)))
			missing++;
	}
	if (check)
		return reply_u8(c, missing ? STORE_CHECK_NOT_READY : STORE_CHECK_READY);
	if (!missing)
		return reply_u8(c, STORE_WAIT_STOP_WAITING);
	if (c->n_regs + missing > srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		int r;

		TRY(kv_get_or_add(&srv->kv, k.p, k.len, &e));
		if (key_exists(e))
			continue;
		r = reg_add(c, e, true);
		if (r < 0) {
			kv_gc(&srv->kv, e);
			return r;
		}
	}
	c->pending = missing; /* torch: a second WAIT overwrites the count */
	c->parked = c->dialect == STORE_V2;
	return 0;
}

static int op_delete(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);

	if (!e || !e->present)
		return reply_i64(c, 0);
	if (!DL_EMPTY(&e->watchers))
		notify_watchers(srv, e, STORE_WATCH_DELETED, e->val, e->val_len, NULL, 0);
	kv_drop_value(&srv->kv, e);
	kv_gc(&srv->kv, e);
	return reply_i64(c, 1);
}

static int op_watch(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;

	if (c->n_regs + 1 > srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	TRY(kv_get_or_add(&srv->kv, q->key.p, q->key.len, &e));
	TRY(reg_add(c, e, false));
	return reply_u8(c, STORE_WATCH_REGISTERED);
}

static int op_multi_get(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	struct store_bytes k;
	size_t total = 0;

	/* Bound the reply before building any of it. */
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		e = kv_find(&srv->kv, k.p, k.len);
		total += 8 + (e && e->present ? e->val_len : 0);
		if (total > srv->cfg.max_conn_buffered_bytes)
			return CRUN_ETOOBIG;
	}
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		e = kv_find(&srv->kv, k.p, k.len);
		if (e && e->present)
			TRY(reply_bytes(c, e->val, e->val_len));
		else
			TRY(reply_bytes(c, NULL, 0)); /* libuv: missing = empty */
	}
	return 0;
}

static int op_multi_set(struct store_conn *c, const struct store_req *q)
{
	const uint8_t *it = q->items;

	for (uint64_t i = 0; i < q->nitems; i++) {
		struct store_bytes k, v;

		store_items_next(&it, &k);
		store_items_next(&it, &v);
		TRY(set_key(c->srv, &k, &v, false));
	}
	return 0;
}

static int op_cancel_wait(struct store_conn *c)
{
	conn_drop_waits(c);
	c->parked = false;
	return reply_u8(c, STORE_WAIT_CANCELED);
}

static int op_queue_push(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;

	if (srv->kv.value_bytes + q->val.len > srv->cfg.max_total_value_bytes)
		return CRUN_ETOOBIG;
	TRY(kv_get_or_add(&srv->kv, q->key.p, q->key.len, &e));
	TRY(kv_queue_push(&srv->kv, e, q->val.p, q->val.len));
	wake_one(srv, e);
	return 0;
}

static int op_queue_pop(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);
	struct kv_item *item;
	int r;

	if (!e || !e->q_len)
		return reply_i64(c, 0);
	TRY(reply_i64(c, (int64_t)e->q_len));
	item = kv_queue_pop(&srv->kv, e);
	r = reply_bytes(c, item->data, item->len);
	free(item);
	kv_gc(&srv->kv, e);
	return r;
}

static int op_queue_len(struct store_conn *c, const struct store_req *q)
{
	struct kv_ent *e = kv_find(&c->srv->kv, q->key.p, q->key.len);

	return reply_i64(c, e ? (int64_t)e->q_len : 0);
}

struct list_ctx {
	struct store_conn *c;
	int r;
};

static void list_one(struct kv_ent *e, void *arg)
{
	struct list_ctx *lc = arg;

	if (e->present && lc->r == 0)
		lc->r = reply_bytes(lc->c, e->key, e->key_len);
}

static int op_list_keys(struct store_conn *c)
{
	struct list_ctx lc = {.c = c, .r = 0};

	TRY(reply_i64(c, (int64_t)c->srv->kv.n_keys));
	kv_foreach(&c->srv->kv, list_one, &lc);
	return lc.r;
}

/* Newest torch: the key is a counter like ADD's; the caller passes once the
 * count reaches world_size (waking everyone parked on it) and parks otherwise.
 * The counter is never reset. */
static int op_barrier(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;
	int64_t n;

	TRY(kv_get_or_add(&srv->kv, q->key.p, q->key.len, &e));
	TRY(add_counter(srv, e, 1, &n));
	if (n >= q->num) {
		TRY(reply_u8(c, STORE_WAIT_STOP_WAITING));
		wake_all(srv, e);
		return 0;
	}
	if (c->n_regs + 1 > srv->cfg.limits.max_items)
		return CRUN_ETOOBIG;
	TRY(reg_add(c, e, true));
	c->pending = 1;
	c->parked = c->dialect == STORE_V2;
	return 0;
}

/* Runs one decoded request. Pointers in q point into the input buffer, which
 * the caller drains afterwards: whatever is kept is copied. */
static int conn_dispatch(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;

	srv->st.requests++;
	switch (q->op) {
	case STORE_OP_VALIDATE:
		return q->u32 == STORE_VALIDATE_MAGIC ? 0 : CRUN_EPROTO;
	case STORE_OP_SET:
		return set_key(srv, &q->key, &q->val, false);
	case STORE_OP_APPEND:
		return set_key(srv, &q->key, &q->val, true);
	case STORE_OP_GET:
		return op_get(c, q);
	case STORE_OP_ADD:
		return op_add(c, q);
	case STORE_OP_COMPARE_SET:
		return op_compare_set(c, q);
	case STORE_OP_CHECK:
		return op_wait(c, q, true);
	case STORE_OP_WAIT:
		return op_wait(c, q, false);
	case STORE_OP_GETNUMKEYS:
		return reply_i64(c, (int64_t)srv->kv.n_keys);
	case STORE_OP_WATCH_KEY:
		return op_watch(c, q);
	case STORE_OP_DELETE_KEY:
		return op_delete(c, q);
	case STORE_OP_MULTI_GET:
		return op_multi_get(c, q);
	case STORE_OP_MULTI_SET:
		return op_multi_set(c, q);
	case STORE_OP_CANCEL_WAIT:
		return op_cancel_wait(c);
	case STORE_OP_PING: {
		uint8_t b[4];

		store_put_u32(b, q->u32);
		return evbuffer_add(conn_out(c), b, 4) < 0 ? CRUN_ENOMEM : 0;
	}
	case STORE_OP_QUEUE_PUSH:
		return op_queue_push(c, q);
	case STORE_OP_QUEUE_POP:
		return op_queue_pop(c, q);
	case STORE_OP_QUEUE_LEN:
		return op_queue_len(c, q);
	case STORE_OP_LIST_KEYS:
		return op_list_keys(c);
	case STORE_OP_BARRIER:
		return op_barrier(c, q);
	default:
		return CRUN_EPROTO;
	}
}

/* ---- connection I/O -------------------------------------------------------- */

static void conn_throttle(struct store_conn *c, bool on);

/* The bufferevent drained the output to the low watermark. */
static void conn_on_write(struct bufferevent *bev, void *arg)
{
	struct store_conn *c = arg;

	if (c->throttled) {
		conn_throttle(c, false);
		return;
	}
	if (!evbuffer_get_length(bufferevent_get_output(bev))) {
		c->writing = false;
		bufferevent_disable(bev, EV_WRITE);
	}
}

/* Pauses reading while the peer does not read its replies; the write
 * callback (output drained to half the ceiling) resumes it. */
static void conn_throttle(struct store_conn *c, bool on)
{
	size_t cap = c->srv->cfg.max_conn_buffered_bytes;

	c->throttled = on;
	log_at(LL_DEBUG, SUB_STORE, "client %s reading: %zu reply bytes unsent",
	       on ? "paused" : "resumed", evbuffer_get_length(conn_out(c)));
	if (on) {
		bufferevent_disable(c->bev, EV_READ);
		bufferevent_setwatermark(c->bev, EV_WRITE, cap / 2, 0);
		c->writing = true;
		bufferevent_enable(c->bev, EV_WRITE);
		return;
	}
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	bufferevent_enable(c->bev, EV_READ);
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* Decides the dialect from the first bytes (§1.8). Returns 1 when decided,
 * 0 when more bytes are needed. */
static int conn_sniff(struct store_conn *c, struct evbuffer *in, size_t len)
{
	enum store_dialect d;
	size_t used;
	const uint8_t *p = evbuffer_pullup(in, (ev_ssize_t)MIN(len, 5));

	if (store_proto_sniff(p, MIN(len, 5), &d, &used) < 0)
		return 0;
	c->dialect = (uint8_t)d;
	evbuffer_drain(in, used);
	return 1;
}

/* Decodes and runs every complete request in the input buffer, in order.
 * Returns false when it closed the connection. */
static bool conn_process(struct store_conn *c)
{
	struct store_server *srv = c->srv;
	struct evbuffer *in = bufferevent_get_input(c->bev);
	uint8_t cancel = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_CANCEL_WAIT);

	for (;;) {
		size_t len = evbuffer_get_length(in), used;
		struct store_req q;
		const uint8_t *p;
		int r;

		if (c->doomed) {
			conn_drop(c, CRUN_ETOOBIG, "undrained output");
			return false;
		}
		if (len == 0 || c->throttled)
			return true;
		if (!c->dialect && !conn_sniff(c, in, len))
			return true;
		len = evbuffer_get_length(in);
		if (len == 0)
			return true;
		if (evbuffer_get_length(conn_out(c)) > srv->cfg.max_conn_buffered_bytes) {
			conn_throttle(c, true);
			return true;
		}
		/* Amortised: pullup grows its chain geometrically and new reads
		 * land behind it, so a large frame is not copied per segment. */
		p = evbuffer_pullup(in, (ev_ssize_t)len);
		if (!p) {
			conn_drop(c, CRUN_ENOMEM, "input");
			return false;
		}
		if (c->parked && p[0] != cancel)
			return true; /* answered in order once the WAIT completes */
		r = store_proto_decode_req(c->dialect, &srv->cfg.limits, p, len, &q, &used);
		if (r == CRUN_EAGAIN) {
			if (len < srv->cfg.max_conn_buffered_bytes)
				return true;
			conn_drop(c, CRUN_ETOOBIG, "frame over the buffer ceiling");
			return false;
		}
		if (r < 0) {
			conn_drop(c, r,
				  r == CRUN_ETOOBIG ? "request over a limit" : "malformed request");
			return false;
		}
		r = conn_dispatch(c, &q);
		evbuffer_drain(in, used);
		if (r < 0) {
			conn_drop(c, r, store_proto_op_name(q.op));
			return false;
		}
	}
}

static void conn_on_read(struct bufferevent *bev, void *arg)
{
	(void)bev;
	if (conn_process(arg))
		conn_flush(arg);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct store_conn *c = arg;

	(void)bev;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		log_at(LL_DEBUG, SUB_STORE, "client closed (%s)",
		       what & BEV_EVENT_EOF ? "eof" : strerror(EVUTIL_SOCKET_ERROR()));
		conn_close(c);
	}
}

/* ---- listener -------------------------------------------------------------- */

static void srv_on_accept(struct evconnlistener *lsn, evutil_socket_t fd, struct sockaddr *sa,
			  int salen, void *arg)
{
	struct store_server *srv = arg;
	struct store_conn *c;
	int one = 1;

	(void)lsn;
	(void)sa;
	(void)salen;
	if (srv->st.conns >= srv->cfg.max_conns) {
		if (!srv->full_logged)
			log_at(LL_WARN, SUB_STORE, "refusing connections: %u open (max_conns)",
			       srv->cfg.max_conns);
		srv->full_logged = true;
		srv->st.dropped_conns++;
		close(fd);
		return;
	}
	srv->full_logged = false;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c = calloc(1, sizeof(*c));
	if (!c)
		goto fail;
	c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!c->bev)
		goto fail;
	c->srv = srv;
	DL_INIT(&c->waits);
	DL_INIT(&c->watches);
	dl_add_tail(&srv->conns, &c->link);
	srv->st.conns++;
	bufferevent_setcb(c->bev, conn_on_read, conn_on_write, conn_on_event, c);
	bufferevent_setwatermark(c->bev, EV_READ, 0, srv->cfg.max_conn_buffered_bytes);
	/* EV_WRITE (on by default) only while output is left over: see conn_flush. */
	bufferevent_disable(c->bev, EV_WRITE);
	bufferevent_enable(c->bev, EV_READ);
	return;
fail:
	log_at(LL_WARN, SUB_STORE, "out of memory accepting a client");
	free(c);
	close(fd);
}

static void srv_on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
	struct store_server *srv = arg;

	(void)fd;
	(void)what;
	evconnlistener_enable(srv->lsn);
}

/* accept() failed (EMFILE, ENFILE, ENOBUFS): pause accepting for 100 ms
 * instead of spinning on a listener that stays readable. */
static void srv_on_accept_error(struct evconnlistener *lsn, void *arg)
{
	struct store_server *srv = arg;
	struct timeval tv = {0, 100 * 1000};
	int err = EVUTIL_SOCKET_ERROR();

	log_at(LL_WARN, SUB_STORE, "accept: %s; pausing 100 ms", strerror(err));
	evconnlistener_disable(lsn);
	evtimer_add(srv->accept_retry, &tv);
}

static int bind_addr(const struct sockaddr *sa, socklen_t salen, int backlog, int *ret_fd)
{
	int fd, one = 1, zero = 0, r;

	fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
		goto fail;
	/* Dual stack, as torch binds "::" with IPV6_V6ONLY off. */
	if (sa->sa_family == AF_INET6 &&
	    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) < 0)
		goto fail;
	if (bind(fd, sa, salen) < 0 || listen(fd, backlog) < 0)
		goto fail;
	*ret_fd = fd;
	return 0;
fail:
	r = -errno;
	close(fd);
	return r;
}

/* Binds host:port (host NULL or "": "::" dual stack, else 0.0.0.0). Names
 * are resolved here, before the loop runs. */
static int srv_listen(struct store_server *srv, const char *host, uint16_t port, int *ret_fd)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
	struct addrinfo *res, *ai;
	char portstr[8];
	int backlog = srv->cfg.backlog > 0 ? srv->cfg.backlog : SOMAXCONN;
	int r = CRUN_EINVAL, g;

	if (!host || !*host) {
		struct sockaddr_in6 a6 = {.sin6_family = AF_INET6,
					  .sin6_port = htons(port),
					  .sin6_addr = IN6ADDR_ANY_INIT};
		struct sockaddr_in a4 = {.sin_family = AF_INET,
					 .sin_port = htons(port),
					 .sin_addr.s_addr = htonl(INADDR_ANY)};

		r = bind_addr((struct sockaddr *)&a6, sizeof(a6), backlog, ret_fd);
		if (r == 0 || r == CRUN_EADDRINUSE)
			return r;
		return bind_addr((struct sockaddr *)&a4, sizeof(a4), backlog, ret_fd);
	}
	if (str_printf(portstr, sizeof(portstr), "%u", port) < 0)
		return CRUN_EINVAL;
	g = getaddrinfo(host, portstr, &hints, &res);
	if (g != 0) {
		log_at(LL_ERROR, SUB_STORE, "cannot resolve %s: %s", host, gai_strerror(g));
		return CRUN_ERESOLVE;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		r = bind_addr(ai->ai_addr, ai->ai_addrlen, backlog, ret_fd);
		if (r == 0)
			break;
	}
	freeaddrinfo(res);
	return r;
}

static uint16_t fd_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return 0;
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* ---- public ---------------------------------------------------------------- */

static void cfg_fill(struct store_server_config *dst, const struct store_server_config *src)
{
	const struct store_server_config def = STORE_SERVER_CONFIG_DEFAULT;

	*dst = *src;
	dst->host = NULL; /* borrowed; only used while binding */
	/* 0 means "the default" for every limit. */
	if (!dst->limits.max_key_bytes)
		dst->limits.max_key_bytes = def.limits.max_key_bytes;
	if (!dst->limits.max_value_bytes)
		dst->limits.max_value_bytes = def.limits.max_value_bytes;
	if (!dst->limits.max_items)
		dst->limits.max_items = def.limits.max_items;
	if (!dst->max_conns)
		dst->max_conns = def.max_conns;
	if (!dst->max_conn_buffered_bytes)
		dst->max_conn_buffered_bytes = def.max_conn_buffered_bytes;
	if (!dst->max_total_value_bytes)
		dst->max_total_value_bytes = def.max_total_value_bytes;
}

int store_server_new(struct event_base *base, const struct store_server_config *cfg,
		     struct store_server **ret_srv)
{
	struct store_server *srv;
	int fd = -1, r;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return CRUN_ENOMEM;
	srv->base = base;
	cfg_fill(&srv->cfg, cfg);
	DL_INIT(&srv->conns);
	r = kv_init(&srv->kv);
	if (r < 0)
		goto fail;
	srv->kv_ready = true;
	srv->accept_retry = evtimer_new(base, srv_on_accept_retry, srv);
	if (!srv->accept_retry) {
		r = CRUN_ENOMEM;
		goto fail;
	}
	r = srv_listen(srv, cfg->host, cfg->port, &fd);
	if (r < 0) {
		log_at(LL_ERROR, SUB_STORE, "cannot listen on %s:%u: %s",
		       cfg->host && *cfg->host ? cfg->host : "*", cfg->port, crun_strerror(r));
		goto fail;
	}
	srv->port = fd_port(fd);
	/* backlog 0: the socket already listens. accept4 with CLOEXEC. */
	srv->lsn = evconnlistener_new(base, srv_on_accept, srv,
				      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
	if (!srv->lsn) {
		close(fd);
		r = CRUN_ENOMEM;
		goto fail;
	}
	evconnlistener_set_error_cb(srv->lsn, srv_on_accept_error);
	*ret_srv = srv;
	return 0;
fail:
	store_server_free(srv);
	return r;
}

void store_server_free(struct store_server *srv)
{
	if (!srv)
		return;
	while (!DL_EMPTY(&srv->conns))
		conn_close(DL_ENTRY(srv->conns.next, struct store_conn, link));
	if (srv->lsn)
		evconnlistener_free(srv->lsn);
	if (srv->accept_retry)
		event_free(srv->accept_retry);
	if (srv->kv_ready)
		kv_release(&srv->kv);
	free(srv);
}

uint16_t store_server_port(const struct store_server *srv)
{
	return srv->port;
}

static void clear_one(struct kv_ent *e, void *arg)
{
	struct store_server *srv = arg;
	struct kv_item *it;

	kv_drop_value(&srv->kv, e);
	while ((it = kv_queue_pop(&srv->kv, e)))
		free(it);
	kv_gc(&srv->kv, e);
}

void store_server_clear(struct store_server *srv)
{
	kv_foreach(&srv->kv, clear_one, srv);
}

void store_server_get_stats(const struct store_server *srv, struct store_server_stats *ret)
{
	*ret = srv->st;
	ret->keys = srv->kv.n_keys;
	ret->value_bytes = srv->kv.value_bytes;
}
