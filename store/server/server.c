/* server.c: the TCPStore-compatible store server on libevent: creating,
 * reconfiguring and freeing it, the 1 s sweep of stalled and idle
 * connections, and the read-only views of server.h. The rest, by what it
 * owns: listen.c (the listener, accepting and refusing), conn.c (one
 * connection's life: reading, dialect sniffing, framing, the one close
 * path), flow.c (output and flow control), limits.c (the tunables). The
 * operations themselves (semantics of ../shared/reference/torch-compat.md
 * §1.4) are in server_ops.c and waits.c, crun's leases in lease.c, the key
 * space in kv.c. One event_base, lent by the caller; no threads, no locks.
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
 *
 * Hostile clients (issue 9). Every resource a client can make grow has a
 * budget (store.h, struct store_server_config): the key space (entries, key
 * bytes, value bytes), registrations, and the bytes buffered per connection
 * and in total, input and output. Output is never buffered without bound:
 * a connection whose replies are not read stops being read (backpressure),
 * and while the total is over its budget, requests with large replies wait.
 * A connection over a budget is closed, logged (rate-limited) and counted in
 * the metric table (STORE_METRIC_MAP). A 1 s sweep closes connections whose
 * partial frame or unread output stalls, and TCP keepalive finds vanished
 * hosts. Idle connections are otherwise kept: torch 1.13 opens an idle watch
 * connection per store object (torch-compat §1.5).
 *
 * Connection life: srv_on_accept (listen.c) -> store_conn_new (bufferevent,
 * accounting) -> store_conn_start (reading on) -> conn_on_read ->
 * conn_process (conn.c), until store_conn_close, the one close path. An
 * authentication or TLS handshake gate goes between store_conn_new and
 * store_conn_start: it owns c->bev until it calls store_conn_start()
 * (passed) or store_conn_drop() (failed), and no request is decoded before
 * that.
 *
 * libevent writes with writev(), so the process embedding the server must
 * ignore SIGPIPE (crun-rdzvd and the agent do), or a vanished client kills it.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

/* Output a peer may leave unread without counting as stalled: a 1.13 client
 * reads a late STOP_WAITING only with its next request (torch-compat §1.6). */
#define STALL_OUTPUT_MIN (64 * 1024)
#define SWEEP_MS	 1000

/* ---- timeouts ---------------------------------------------------------------- */

/* Once a second: a connection owing the rest of a frame, or not reading more
 * than STALL_OUTPUT_MIN of output, without progress for stall_timeout_s is
 * closed; so is one silent for idle_timeout_s when that is on. Waiting that
 * the server imposed (parked, paused) does not count. */
static void srv_on_sweep(evutil_socket_t fd, short what, void *arg)
{
	struct store_server *srv = arg;
	const struct store_server_config *cfg = &srv->cfg;
	struct dl *n, *next;

	(void)fd;
	(void)what;
	for (n = srv->conns.next; n != &srv->conns; n = next) {
		struct store_conn *c = DL_ENTRY(n, struct store_conn, link);
		size_t in = evbuffer_get_length(bufferevent_get_input(c->bev));
		size_t out = evbuffer_get_length(store_conn_out(c));
		bool rx = c->rx_bytes != c->rx_seen, tx = c->tx_bytes != c->tx_seen;
		bool owed = in && !rx && !c->parked && !c->throttled && !c->stalled;

		next = n->next; /* c may be closed below */
		c->rx_seen = c->rx_bytes;
		c->tx_seen = c->tx_bytes;
		c->stall_s = owed || (out > STALL_OUTPUT_MIN && !tx) ? c->stall_s + 1 : 0;
		c->idle_s = rx ? 0 : c->idle_s + 1;
		if (cfg->stall_timeout_s && c->stall_s >= cfg->stall_timeout_s)
			store_conn_drop(c, STORE_M_DROP_STALL, NULL);
		else if (cfg->idle_timeout_s && c->idle_s >= cfg->idle_timeout_s)
			store_conn_drop(c, STORE_M_DROP_IDLE, NULL);
	}
}

/* ---- public ---------------------------------------------------------------- */

int store_server_new(struct event_base *base, const struct store_server_config *cfg,
		     struct store_server **ret_srv)
{
	struct store_server *srv;
	struct timeval sweep = {SWEEP_MS / 1000, 0};
	int r;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return CRUN_ENOMEM;
	srv->base = base;
	srv->reserve_fd = -1;
	srv->stall_min = SIZE_MAX;
	store_server_cfg_fill(&srv->cfg, cfg, 1);
	srv->auto_conns =
	    store_server_auto_conns(cfg->tls || cfg->auth ? srv->cfg.max_preauth_conns : 0);
	store_server_cfg_fill(&srv->cfg, cfg, srv->auto_conns);
	srv->out_hard_cap = srv->cfg.max_conn_output_bytes + srv->cfg.max_conn_buffered_bytes;
	DL_INIT(&srv->conns);
	DL_INIT(&srv->stalled);
	DL_INIT(&srv->preauth);
	DL_INIT(&srv->lingering);
	store_preauth_set_timeout(srv);
	r = store_share_init(srv);
	if (r < 0)
		goto fail;
	r = kv_init(&srv->kv, srv->cfg.max_keys, srv->cfg.max_total_key_bytes);
	if (r < 0)
		goto fail;
	srv->kv_ready = true;
	r = CRUN_ENOMEM;
	srv->accept_retry = evtimer_new(base, store_server_on_accept_retry, srv);
	srv->unstall = event_new(base, -1, 0, store_server_on_unstall, srv);
	srv->sweep = event_new(base, -1, EV_PERSIST, srv_on_sweep, srv);
	if (!srv->accept_retry || !srv->unstall || !srv->sweep)
		goto fail;
	if ((srv->cfg.stall_timeout_s || srv->cfg.idle_timeout_s) && event_add(srv->sweep, &sweep))
		goto fail;
	r = store_server_listen(srv, cfg);
	if (r < 0)
		goto fail;
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
		store_conn_close(DL_ENTRY(srv->conns.next, struct store_conn, link));
	store_linger_free_all(srv);
	store_ext_server_free(srv); /* leases outlive connections, not the server */
	if (srv->lsn)
		evconnlistener_free(srv->lsn);
	if (srv->accept_retry)
		event_free(srv->accept_retry);
	if (srv->unstall)
		event_free(srv->unstall);
	if (srv->sweep)
		event_free(srv->sweep);
	if (srv->reserve_fd >= 0)
		close(srv->reserve_fd);
	if (srv->kv_ready)
		kv_release(&srv->kv);
	store_share_release(srv); /* after the entries that point at them */
	free(srv->allow);
	free(srv);
}

void store_server_set_limits(struct store_server *srv, const struct store_server_config *cfg)
{
	struct store_server_config n;
	struct timeval sweep = {SWEEP_MS / 1000, 0};
	uint32_t ka = srv->cfg.keepalive_s;
	size_t rows;
	int off = 0;

	store_server_cfg_fill(&n, cfg, srv->auto_conns);
	(void)store_server_limits(&rows);
	for (size_t i = 0; i < rows; i++)
		store_server_limit_put(&srv->cfg, i, store_server_limit_get(&n, i));
	srv->out_hard_cap = srv->cfg.max_conn_output_bytes + srv->cfg.max_conn_buffered_bytes;
	srv->kv.max_ents = srv->cfg.max_keys;
	srv->kv.max_key_bytes = srv->cfg.max_total_key_bytes;
	store_preauth_set_timeout(srv);
	if (srv->cfg.stall_timeout_s || srv->cfg.idle_timeout_s) {
		if (!evtimer_pending(srv->sweep, NULL))
			(void)event_add(srv->sweep, &sweep);
	} else {
		(void)event_del(srv->sweep);
	}
	/* New connections inherit the listener's keepalive (listener_sockopts). */
	if (srv->lsn && ka != srv->cfg.keepalive_s) {
		int fd = evconnlistener_get_fd(srv->lsn);

		if (srv->cfg.keepalive_s)
			store_sock_keepalive(fd, srv->cfg.keepalive_s);
		else
			(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &off, sizeof(off));
	}
}

uint16_t store_server_port(const struct store_server *srv)
{
	return srv->port;
}

const struct store_server_config *store_server_get_config(const struct store_server *srv)
{
	return &srv->cfg;
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

struct each_key {
	void (*fn)(const uint8_t *key, size_t len, void *arg);
	void *arg;
};

static void each_key_one(struct kv_ent *e, void *arg)
{
	const struct each_key *k = arg;

	if (e->present)
		k->fn(e->key, e->key_len, k->arg);
}

uint64_t store_server_op_count(const struct store_server *srv, enum store_op op)
{
	return (unsigned)op < STORE_OP__MAX ? srv->op_counts[op] : 0;
}

void store_server_each_key(const struct store_server *srv,
			   void (*fn)(const uint8_t *key, size_t len, void *arg), void *arg)
{
	struct each_key k = {fn, arg};

	/* kv_foreach takes the table mutable for its other callers; nothing
	 * here changes it. */
	kv_foreach((struct kv_table *)&srv->kv, each_key_one, &k);
}

int store_server_peek(const struct store_server *srv, const uint8_t *key, size_t len,
		      const uint8_t **ret_val, size_t *ret_len)
{
	struct kv_ent *e = kv_find(&srv->kv, key, len);

	if (!e || !e->present)
		return CRUN_ENOTFOUND;
	*ret_val = e->val ? e->val : (const uint8_t *)"";
	*ret_len = e->val_len;
	return 0;
}

void store_server_get_stats(const struct store_server *srv, struct store_server_stats *ret)
{
	*ret = srv->st;
	ret->keys = srv->kv.n_keys;
	ret->value_bytes = srv->kv.value_bytes;
	ret->entries = srv->kv.n_ents;
	ret->key_bytes = srv->kv.key_bytes;
	ret->registrations = srv->n_regs;
	ret->input_bytes = srv->in_bytes;
	ret->output_bytes = srv->out_bytes;
}
