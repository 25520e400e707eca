/* conn.c: one store connection's life: set up at accept (store_conn_new,
 * store_conn_start), fed by its read callbacks, its input sniffed, framed
 * and decoded into requests that server_ops.c, waits.c and lease.c run
 * (conn_process), until store_conn_close, the one close path; a drop for bad
 * or over-limit input is counted in the metric table and logged within a
 * rate limit. The output side, whose calls come from the operations as well,
 * is flow.c's; accepting is listen.c's. Split out of server.c, whose header
 * tells the whole design (WAIT ordering, hostile clients, connection life).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"
#include "store/tls.h"

#define LOGRATE_PER_S 10
/* One recv() of a plain connection (conn_on_raw_read; see flow.c's
 * plain-socket reading). */
#define RAW_READ_MAX 16384 /* a bufferevent's default single read */

/* ---- metrics and rate-limited logging -------------------------------------- */

static const char *const metric_names[] = {
#define X_(id, name, help) name,
    STORE_METRIC_MAP(X_)
#undef X_
};

static const char *const metric_help[] = {
#define X_(id, name, help) help,
    STORE_METRIC_MAP(X_)
#undef X_
};

const char *store_metric_name(enum store_metric m)
{
	return (unsigned)m < STORE_M__MAX ? metric_names[m] : "?";
}

const char *store_metric_help(enum store_metric m)
{
	return (unsigned)m < STORE_M__MAX ? metric_help[m] : "?";
}

uint64_t store_server_metric(const struct store_server *srv, enum store_metric m)
{
	return (unsigned)m < STORE_M__MAX ? srv->metrics[m] : 0;
}

/* Whether one more WARN line fits this second's budget; the first line of a
 * new second says how many were left out. */
bool store_server_log_budget(struct store_server *srv)
{
	uint64_t now = clock_now_ms();

	if (now - srv->lr.window_ms >= 1000) {
		if (srv->lr.suppressed)
			log_at(LL_WARN, SUB_STORE,
			       "%llu more refused or dropped clients not logged (see the metrics)",
			       (unsigned long long)srv->lr.suppressed);
		srv->lr.window_ms = now;
		srv->lr.lines = 0;
		srv->lr.suppressed = 0;
	}
	if (srv->lr.lines < LOGRATE_PER_S) {
		srv->lr.lines++;
		return true;
	}
	srv->lr.suppressed++;
	return false;
}

/* ---- connection teardown ----------------------------------------------------- */

/* The one close path: unregisters every wait and watch, frees the
 * bufferevent (closing the socket) and the connection. Callers return at once. */
void store_conn_close(struct store_conn *c)
{
	struct store_server *srv = c->srv;
	struct evbuffer *in = bufferevent_get_input(c->bev), *out = store_conn_out(c);

	store_conn_unregister(c);
	store_ext_conn_closed(c); /* after the waits are gone: it may SET keys */
	store_conn_auth_free(c);
	store_preauth_forget(c);
	dl_del(&c->link);
	dl_del(&c->stall_link);
	/* Freeing the buffers does not call their callbacks: settle by hand. */
	if (c->in_cb)
		evbuffer_remove_cb_entry(in, c->in_cb);
	if (c->out_cb)
		evbuffer_remove_cb_entry(out, c->out_cb);
	srv->in_bytes -= c->in_cb ? evbuffer_get_length(in) : 0;
	srv->out_bytes -= c->out_cb ? evbuffer_get_length(out) : 0;
	if (c->rd_ev)
		event_free(c->rd_ev); /* before the bufferevent closes the fd */
	bufferevent_free(c->bev);
	srv->st.conns--;
	free(c);
	if (!DL_EMPTY(&srv->stalled))
		event_active(srv->unstall, EV_TIMEOUT, 0); /* its output budget is free */
}

void store_peer_name(int fd, char *buf, size_t cap)
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

/* Closes a connection for bad or over-limit input: counted under `why`,
 * logged at WARN within the log budget. `what` adds detail (an op name). */
static void conn_drop(struct store_conn *c, enum store_metric why, const char *what)
{
	struct store_server *srv = c->srv;
	char peer[INET6_ADDRSTRLEN + 8];

	srv->metrics[why]++;
	srv->st.dropped_conns++;
	if (store_server_log_budget(srv)) {
		store_peer_name(bufferevent_getfd(c->bev), peer, sizeof(peer));
		log_at(LL_WARN, SUB_STORE, "dropping client %s: %s%s%s", peer, metric_help[why],
		       what ? ": " : "", what ? what : "");
	}
	store_conn_close(c);
}

void store_conn_drop(struct store_conn *c, enum store_metric why, const char *what)
{
	conn_drop(c, why, what);
}

/* The metric an op's failure counts under: the budget it named, else a
 * per-request limit or a failed op (which torch answers by closing too). */
static enum store_metric op_failure(struct store_conn *c, int r)
{
	if (c->why)
		return (enum store_metric)c->why;
	return r == CRUN_ETOOBIG ? STORE_M_DROP_REQUEST_LIMIT : STORE_M_DROP_OP_FAILED;
}

/* ERROR (store_ext.h, version 6) with text, to a crun client that takes it
 * (HELLO 6 or more, not muxed), written out now, behind the replies still
 * queued, because c closes next. Plaintext only: under TLS the bytes must
 * go through the record layer, which a closing connection does not wait
 * for. Best effort: what the socket cannot take at once is dropped. */
static void send_error(struct store_conn *c, const char *text)
{
	struct evbuffer *out = store_conn_out(c);
	uint8_t frame[STORE_EXT_ERROR_HEAD + STORE_EXT_ERROR_TEXT_MAX];
	evutil_socket_t fd = bufferevent_getfd(c->bev);
	size_t len;

	if (!c->ext || c->mux || c->ext_peer < STORE_EXT_VERSION_ERROR || c->srv->cfg.tls ||
	    fd < 0 ||
	    (c->srv->cfg.ext_version && c->srv->cfg.ext_version < STORE_EXT_VERSION_ERROR))
		return;
	if (store_ext_error_encode(text, strlen(text), frame, sizeof(frame), &len) < 0 ||
	    evbuffer_add(out, frame, len) < 0)
		return;
	/* As store_conn_flush: the socket bufferevent froze its output's start. */
	evbuffer_unfreeze(out, 1);
	for (int i = 0; i < 4 && evbuffer_get_length(out); i++)
		if (evbuffer_write(out, fd) <= 0)
			break;
	evbuffer_freeze(out, 1);
}

/* Closes c after its op `op` failed with r: a refusal by a share names the
 * job and the budget ("store full: job 'J' used 64 MiB of its 64 MiB key
 * bytes"), the rest the op. The torch protocol has no error reply, so the
 * close and this line are all a client and an operator get. */
static void conn_drop_op(struct store_conn *c, int r, const char *op)
{
	char text[STORE_AUTH_JOB_MAX + 160];

	store_share_refusal_text(c, text, sizeof(text));
	if (text[0])
		send_error(c, text);
	conn_drop(c, op_failure(c, r), text[0] ? text : op);
}

/* ---- accounting -------------------------------------------------------------- */

/* Buffer callbacks keep the server's totals and the progress counters the
 * sweep reads: a few additions per read or write. */
static void conn_on_in_change(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
	struct store_conn *c = arg;

	c->srv->in_bytes += info->n_added;
	c->srv->in_bytes -= info->n_deleted;
	c->rx_bytes += info->n_added;
	if (c->rd_full && info->n_deleted &&
	    evbuffer_get_length(b) < c->srv->cfg.max_conn_buffered_bytes)
		store_conn_read_unfull(c);
}

static void conn_on_out_change(struct evbuffer *b, const struct evbuffer_cb_info *info, void *arg)
{
	struct store_conn *c = arg;
	struct store_server *srv = c->srv;

	(void)b;
	srv->out_bytes += info->n_added;
	srv->out_bytes -= info->n_deleted;
	c->tx_bytes += info->n_deleted;
	/* Only once the smallest waiting reply fits: no wake-up per write. */
	if (info->n_deleted && !DL_EMPTY(&srv->stalled) &&
	    (srv->out_bytes == 0 ||
	     srv->out_bytes + srv->stall_min <= srv->cfg.max_total_output_bytes))
		event_active(srv->unstall, EV_TIMEOUT, 0);
}

/* ---- connection I/O -------------------------------------------------------- */

/* Whether q's reply fits the total output budget now. If not, c stops
 * reading until other connections' output drains (srv_on_unstall). */
static bool conn_output_budget(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	size_t budget = srv->cfg.max_total_output_bytes, cost;

	/* No reply but LIST_KEYS's can exceed the largest frame: the common
	 * case costs no lookup. */
	if (srv->out_bytes + srv->cfg.max_conn_buffered_bytes <= budget &&
	    q->op != STORE_OP_LIST_KEYS)
		return true;
	cost = store_conn_reply_cost(c, q);
	if (srv->out_bytes == 0 || srv->out_bytes + cost <= budget ||
	    (cost <= SMALL_REPLY && !evbuffer_get_length(store_conn_out(c))))
		return true;
	c->stalled = true;
	dl_add_tail(&srv->stalled, &c->stall_link);
	srv->stall_min = MIN(srv->stall_min, cost);
	store_conn_read(c, false);
	srv->metrics[STORE_M_PAUSE_TOTAL_OUTPUT]++;
	log_at(LL_DEBUG, SUB_STORE, "client paused: %zu output bytes in total", srv->out_bytes);
	return false;
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

/* A partial frame of len bytes at the front: keep it if it may still fit.
 * Returns false when it closed c. */
static bool conn_partial(struct store_conn *c, size_t len)
{
	if (len < c->srv->cfg.max_conn_buffered_bytes)
		return true;
	conn_drop(c, STORE_M_DROP_CONN_INPUT, NULL);
	return false;
}

/* An extension op (store_ext.h) at the front. Refused at its first byte
 * before HELLO, so nothing of a stranger's frame is buffered. */
static bool conn_ext(struct store_conn *c, const uint8_t *p, size_t len, size_t *used)
{
	int r;

	if (!c->ext && p[0] != STORE_EXT_HELLO) {
		conn_drop(c, STORE_M_DROP_EXT_BEFORE_HELLO, store_ext_op_name(p[0]));
		return false;
	}
	if (store_conn_auth_check_ext(c, p, len) < 0) {
		conn_drop(c, STORE_M_DROP_FOREIGN_KEY, store_ext_op_name(p[0]));
		return false;
	}
	c->why = 0;
	c->ref_share = NULL;
	r = store_ext_process(c, p, len, used);
	if (r == CRUN_EAGAIN) {
		*used = 0;
		return conn_partial(c, len);
	}
	if (r < 0) {
		if (r == CRUN_EPROTO)
			conn_drop(c, STORE_M_DROP_MALFORMED, store_ext_op_name(p[0]));
		else
			conn_drop_op(c, r, store_ext_op_name(p[0]));
		return false;
	}
	return true;
}

/* A greeting of a client configured for another server, instead of a
 * TCPStore frame: a TLS ClientHello on a plaintext port, or the head of an
 * authentication answer on a server without secrets. It is told in a way
 * its side recognises, so it fails at once saying why, and c is dropped.
 * Returns false for any other bytes (c untouched). */
static bool conn_foreign_greeting(struct store_conn *c, const uint8_t *p, size_t len)
{
	static const uint8_t no_secrets[] = {'C', 'R', 'A', '1', STORE_AUTH_NO_SECRETS};
	int fd = bufferevent_getfd(c->bev);

	if (!c->srv->cfg.tls && store_tls_record(p, len)) {
		/* A line it cannot take for a TLS record fails its handshake. */
		store_tls_tell_tls_peer(fd);
		conn_drop(c, STORE_M_DROP_MALFORMED, "a TLS handshake on a plaintext port");
		return true;
	}
	/* Written on the socket: under TLS it would have to be encrypted, and
	 * the bufferevent's output dies with c; a TLS client is not told. */
	if (!c->srv->cfg.auth && !c->srv->cfg.tls && len >= 4 && memcmp(p, no_secrets, 4) == 0) {
		(void)send(fd, no_secrets, sizeof(no_secrets), MSG_NOSIGNAL | MSG_DONTWAIT);
		conn_drop(c, STORE_M_DROP_MALFORMED,
			  "a client with a secret (this server has none)");
		return true;
	}
	return false;
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
			conn_drop(c, STORE_M_DROP_OUTPUT, NULL);
			return false;
		}
		if (len == 0 || c->throttled || c->stalled)
			return true;
		if (store_conn_auth_pending(c)) {
			const char *why = NULL;

			r = store_conn_auth_read(c, &why);
			if (r < 0)
				conn_drop(c, STORE_M_DROP_AUTH, why);
			if (r <= 0)
				return r == 0;
			if (!store_preauth_end(c))
				return false;
			continue;
		}
		if (!c->dialect && !conn_sniff(c, in, len))
			return true;
		len = evbuffer_get_length(in);
		if (len == 0)
			return true;
		/* Backpressure: no new request while the replies are unread. */
		if (evbuffer_get_length(store_conn_out(c)) > srv->cfg.max_conn_output_bytes) {
			store_conn_throttle(c, true);
			return true;
		}
		/* Amortised: pullup grows its chain geometrically and new reads
		 * land behind it, so a large frame is not copied per segment. */
		p = evbuffer_pullup(in, (ev_ssize_t)len);
		if (!p) {
			conn_drop(c, STORE_M_DROP_OP_FAILED, "out of memory");
			return false;
		}
		if (c->parked && p[0] != cancel)
			return true; /* answered in order once the WAIT completes */
		if (store_ext_is_op(p[0])) {
			if (!conn_ext(c, p, len, &used))
				return false;
			if (!used)
				return true;
			evbuffer_drain(in, used);
			continue;
		}
		/* c->dec makes this O(new bytes) for a list that arrives in
		 * pieces: only the strings not validated before are looked at. */
		r = store_proto_decode_req_from(c->dialect, &srv->cfg.limits, &c->dec, p, len, &q,
						&used);
		if (r == CRUN_EAGAIN)
			return conn_partial(c, len);
		if (r < 0 && conn_foreign_greeting(c, p, len))
			return false;
		if (r < 0) {
			conn_drop(c,
				  r == CRUN_ETOOBIG ? STORE_M_DROP_REQUEST_LIMIT
						    : STORE_M_DROP_MALFORMED,
				  NULL);
			return false;
		}
		if (!conn_output_budget(c, &q))
			return true; /* decoded again when resumed */
		if (store_conn_auth_check_req(c, &q) < 0) {
			conn_drop(c, STORE_M_DROP_FOREIGN_KEY, store_proto_op_name(q.op));
			return false;
		}
		c->why = 0;
		c->ref_share = NULL;
		r = store_conn_dispatch(c, &q);
		evbuffer_drain(in, used);
		c->dec = (struct store_dec_state){0};
		if (r < 0) {
			conn_drop_op(c, r, store_proto_op_name(q.op));
			return false;
		}
	}
}

/* Over the total input budget: the connection holding the most unprocessed
 * input goes (O(conns), only while over the budget). Returns false when
 * that was `self`. */
static bool srv_trim_input(struct store_server *srv, struct store_conn *self)
{
	while (srv->in_bytes > srv->cfg.max_total_input_bytes) {
		struct store_conn *big = NULL;
		size_t most = 0;

		for (struct dl *n = srv->conns.next; n != &srv->conns; n = n->next) {
			struct store_conn *c = DL_ENTRY(n, struct store_conn, link);
			size_t len = evbuffer_get_length(bufferevent_get_input(c->bev));

			if (len > most) {
				most = len;
				big = c;
			}
		}
		if (!big)
			break;
		conn_drop(big, STORE_M_DROP_TOTAL_INPUT, NULL);
		if (big == self)
			return false;
	}
	return true;
}

static void conn_on_read(struct bufferevent *bev, void *arg)
{
	struct store_conn *c = arg;

	(void)bev;
	if (!srv_trim_input(c->srv, c))
		return;
	if (conn_process(c))
		store_conn_flush(c);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct store_conn *c = arg;

	if (what & BEV_EVENT_CONNECTED) {
		/* The TLS handshake is done: without secrets, c is in. */
		if (!store_conn_auth_pending(c))
			(void)store_preauth_end(c);
		return;
	}
	if ((what & BEV_EVENT_ERROR) && c->srv->cfg.tls) {
		char why[256];
		bool plain;

		if (*store_tls_bev_error(bev, why, sizeof(why), &plain)) {
			/* A plaintext client waits for a challenge or a reply that
			 * will not come: tell it, in a way it can read, why. */
			struct store_server *srv = c->srv;
			int keep;

			if (plain)
				store_tls_tell_plaintext_peer(bufferevent_getfd(bev));
			/* The socket outlives the bufferevent's close: linger.c. */
			keep = fcntl(bufferevent_getfd(bev), F_DUPFD_CLOEXEC, 0);
			conn_drop(c, STORE_M_DROP_TLS, why);
			store_linger_close(srv, keep);
			return;
		}
	}
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		log_at(LL_DEBUG, SUB_STORE, "client closed (%s)",
		       what & BEV_EVENT_EOF ? "eof" : strerror(EVUTIL_SOCKET_ERROR()));
		c->peer_eof = (what & BEV_EVENT_EOF) != 0; /* leases: store_ext.h */
		store_conn_close(c);
	}
}

/* Readable: one recv() of what fits under the input ceiling, then the
 * same path as a bufferevent read (conn_on_read, conn_on_event). */
static void conn_on_raw_read(evutil_socket_t fd, short what, void *arg)
{
	struct store_conn *c = arg;
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t len = evbuffer_get_length(in), cap = c->srv->cfg.max_conn_buffered_bytes;
	uint8_t buf[RAW_READ_MAX];
	ssize_t n;
	int r;

	(void)what;
	if (len >= cap) { /* parked with a full buffer: wait for it to drain */
		c->rd_full = true;
		event_del(c->rd_ev);
		return;
	}
	n = recv(fd, buf, MIN(sizeof(buf), cap - len), 0);
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0) {
		conn_on_event(c->bev, BEV_EVENT_READING | (n ? BEV_EVENT_ERROR : BEV_EVENT_EOF), c);
		return;
	}
	/* A socket bufferevent freezes its input's end so only it fills it;
	 * fill it the way its own read callback does. */
	evbuffer_unfreeze(in, 0);
	r = evbuffer_add(in, buf, (size_t)n);
	evbuffer_freeze(in, 0);
	if (r < 0) {
		conn_drop(c, STORE_M_DROP_OP_FAILED, "out of memory");
		return;
	}
	conn_on_read(c->bev, c);
}

/* ---- setup ------------------------------------------------------------------ */

/* Takes ownership of fd. Sets up the connection with reading still off: see
 * store_conn_start. NULL when out of memory (fd closed). */
struct store_conn *store_conn_new(struct store_server *srv, int fd)
{
	struct store_conn *c;

	/* TCP_NODELAY and keepalive come from the listener (listener_sockopts). */
	c = calloc(1, sizeof(*c));
	if (!c)
		goto fail;
	if (srv->cfg.tls) {
		c->bev = store_tls_accept(srv->cfg.tls, srv->base, fd); /* owns fd */
		if (!c->bev) {
			free(c);
			goto fail_logged;
		}
	} else {
		c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
		if (!c->bev)
			goto fail;
	}
	c->srv = srv;
	DL_INIT(&c->waits);
	DL_INIT(&c->watches);
	DL_INIT(&c->leases);
	DL_INIT(&c->stall_link);
	DL_INIT(&c->preauth_link);
	dl_add_tail(&srv->conns, &c->link);
	srv->st.conns++;
	srv->metrics[STORE_M_CONNS_ACCEPTED]++;
	c->in_cb = evbuffer_add_cb(bufferevent_get_input(c->bev), conn_on_in_change, c);
	c->out_cb = evbuffer_add_cb(store_conn_out(c), conn_on_out_change, c);
	if (!c->in_cb || !c->out_cb) {
		store_conn_close(c);
		goto fail_logged;
	}
	bufferevent_setcb(c->bev, conn_on_read, store_conn_on_write, conn_on_event, c);
	/* Reading stops at the per-connection input ceiling. */
	bufferevent_setwatermark(c->bev, EV_READ, 0, srv->cfg.max_conn_buffered_bytes);
	/* EV_WRITE (on by default) only while output is left over: see conn_flush. */
	bufferevent_disable(c->bev, EV_WRITE | EV_READ);
	return c;
fail:
	if (c && c->bev)
		bufferevent_free(c->bev);
	else
		close(fd);
	free(c);
fail_logged:
	log_at(LL_WARN, SUB_STORE, "out of memory accepting a client");
	return NULL;
}

/* The connection is let in: requests are read from now on, by rd_ev for a
 * plain socket. The bufferevent reads under TLS (it decrypts) and behind the
 * auth gate (its watermark limits the answer, its read timeout is the
 * gate's deadline); also if rd_ev cannot be had (out of memory): slower,
 * but the same. */
void store_conn_start(struct store_conn *c)
{
	if (!c->srv->cfg.tls && !c->srv->cfg.auth)
		c->rd_ev = event_new(c->srv->base, bufferevent_getfd(c->bev), EV_READ | EV_PERSIST,
				     conn_on_raw_read, c);
	store_conn_read(c, true);
}
