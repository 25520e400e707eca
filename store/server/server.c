/* server.c: the TCPStore-compatible store server on libevent: listener,
 * per-connection bufferevents, dialect sniffing, framing, flow control and
 * the one close path. The operations themselves (semantics of
 * ../shared/reference/torch-compat.md §1.4) are in server_ops.c, the key
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
 * Connection life: srv_on_accept -> conn_new (bufferevent,
 * accounting) -> conn_start (reading on) -> conn_on_read -> conn_process,
 * until conn_close, the one close path. An authentication or TLS handshake
 * gate goes between conn_new and conn_start: it owns c->bev until it calls
 * conn_start() (passed) or conn_drop() (failed), and no request is decoded
 * before that.
 *
 * libevent writes with writev(), so the process embedding the server must
 * ignore SIGPIPE (crun-rdzvd and the agent do), or a vanished client kills it.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"
#include "store/tls.h"

/* Output a peer may leave unread without counting as stalled: a 1.13 client
 * reads a late STOP_WAITING only with its next request (torch-compat §1.6). */
#define STALL_OUTPUT_MIN (64 * 1024)
/* A reply this small is never held back by the total output budget while
 * the connection has nothing else unsent: one per connection at a time, so a
 * client filling the budget cannot stall everyone's small requests. */
#define SMALL_REPLY   4096
#define LOGRATE_PER_S 10
#define SWEEP_MS      1000

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
static bool log_budget(struct store_server *srv)
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
static void conn_close(struct store_conn *c)
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

/* Closes a connection for bad or over-limit input: counted under `why`,
 * logged at WARN within the log budget. `what` adds detail (an op name). */
static void conn_drop(struct store_conn *c, enum store_metric why, const char *what)
{
	struct store_server *srv = c->srv;
	char peer[INET6_ADDRSTRLEN + 8];

	srv->metrics[why]++;
	srv->st.dropped_conns++;
	if (log_budget(srv)) {
		peer_name(bufferevent_getfd(c->bev), peer, sizeof(peer));
		log_at(LL_WARN, SUB_STORE, "dropping client %s: %s%s%s", peer, metric_help[why],
		       what ? ": " : "", what ? what : "");
	}
	conn_close(c);
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

/* ---- output ------------------------------------------------------------------ */

/* Replies are written straight from the callback that made them: one
 * writev, instead of arming EV_WRITE and writing on the next loop turn (two
 * epoll_ctl calls per request). Only what the socket does not take, or an
 * error, is left to the bufferevent, whose callbacks then finish the job. */
void store_conn_flush(struct store_conn *c)
{
	struct evbuffer *out = store_conn_out(c);

	if (c->writing || !evbuffer_get_length(out))
		return;
	if (c->srv->cfg.tls) {
		/* Only the TLS bufferevent may write: it encrypts. */
		c->writing = true;
		bufferevent_enable(c->bev, EV_WRITE);
		return;
	}
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

static void conn_doom(struct store_conn *c)
{
	c->doomed = true;
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* Output pushed to a connection by someone else's operation (wake-ups, watch
 * notifications) is not throttled; a connection that lets it pile up past its
 * hard ceiling is closed from its own (deferred) callback. */
void store_conn_check_pushed(struct store_conn *c)
{
	if (evbuffer_get_length(store_conn_out(c)) > c->srv->out_hard_cap)
		conn_doom(c);
}

bool store_conn_may_push(struct store_conn *c, size_t bytes)
{
	struct store_server *srv = c->srv;

	if (c->doomed)
		return false;
	if (evbuffer_get_length(store_conn_out(c)) + bytes <= srv->out_hard_cap &&
	    (bytes <= SMALL_REPLY || srv->out_bytes + bytes <= srv->cfg.max_total_output_bytes))
		return true;
	conn_doom(c);
	return false;
}

/* Lets a parked connection read on; its buffered input is processed from a
 * deferred callback, never re-entrantly from another connection's op. */
void store_conn_unpark(struct store_conn *c)
{
	if (!c->parked)
		return;
	c->parked = false;
	if (evbuffer_get_length(bufferevent_get_input(c->bev)))
		bufferevent_trigger(c->bev, EV_READ,
				    BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* ---- plain-socket reading ---------------------------------------------------- */

/* A plain TCP connection is read by an event of its own, one recv() per
 * readiness, instead of by its socket bufferevent: libevent's evbuffer_read
 * asks FIONREAD (an ioctl) before every read, a quarter of the system calls
 * a request costs in a worker-init storm. Output, the deferred read
 * triggers and the callbacks stay the bufferevent's. Connections whose
 * bufferevent must read (TLS decrypts in it) have rd_ev NULL. */
#define RAW_READ_MAX 16384 /* a bufferevent's default single read */

/* Reading on or off for flow control (throttled, stalled). */
static void conn_read(struct store_conn *c, bool on)
{
	if (!c->rd_ev) {
		if (on)
			bufferevent_enable(c->bev, EV_READ);
		else
			bufferevent_disable(c->bev, EV_READ);
		return;
	}
	c->rd_on = on;
	if (on && !c->rd_full)
		event_add(c->rd_ev, NULL);
	else
		event_del(c->rd_ev);
}

/* The input fell below its ceiling (the bufferevent's read high watermark). */
static void conn_read_unfull(struct store_conn *c)
{
	c->rd_full = false;
	if (c->rd_on)
		event_add(c->rd_ev, NULL);
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
		conn_read_unfull(c);
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

/* Resumes every connection paused on the total output budget; each
 * re-checks its front request from a deferred callback (and may pause again). */
static void srv_on_unstall(evutil_socket_t fd, short what, void *arg)
{
	struct store_server *srv = arg;

	(void)fd;
	(void)what;
	srv->stall_min = SIZE_MAX;
	while (!DL_EMPTY(&srv->stalled)) {
		struct store_conn *c = DL_ENTRY(srv->stalled.next, struct store_conn, stall_link);

		dl_del(&c->stall_link);
		c->stalled = false;
		if (!c->throttled)
			conn_read(c, true);
		bufferevent_trigger(c->bev, EV_READ,
				    BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
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
	size_t cap = c->srv->cfg.max_conn_output_bytes;

	c->throttled = on;
	log_at(LL_DEBUG, SUB_STORE, "client %s reading: %zu reply bytes unsent",
	       on ? "paused" : "resumed", evbuffer_get_length(store_conn_out(c)));
	if (on) {
		c->srv->metrics[STORE_M_PAUSE_CONN_OUTPUT]++;
		conn_read(c, false);
		bufferevent_setwatermark(c->bev, EV_WRITE, cap / 2, 0);
		c->writing = true;
		bufferevent_enable(c->bev, EV_WRITE);
		return;
	}
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	if (!c->stalled)
		conn_read(c, true);
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

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
	conn_read(c, false);
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
			conn_throttle(c, true);
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
			if (plain)
				store_tls_tell_plaintext_peer(bufferevent_getfd(bev));
			conn_drop(c, STORE_M_DROP_TLS, why);
			return;
		}
	}
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		log_at(LL_DEBUG, SUB_STORE, "client closed (%s)",
		       what & BEV_EVENT_EOF ? "eof" : strerror(EVUTIL_SOCKET_ERROR()));
		c->peer_eof = (what & BEV_EVENT_EOF) != 0; /* leases: store_ext.h */
		conn_close(c);
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
			conn_drop(c, STORE_M_DROP_STALL, NULL);
		else if (cfg->idle_timeout_s && c->idle_s >= cfg->idle_timeout_s)
			conn_drop(c, STORE_M_DROP_IDLE, NULL);
	}
}

/* ---- listener -------------------------------------------------------------- */

/* Keepalive probes after keepalive_s of silence, 4 of them keepalive_s/6
 * apart; TCP_USER_TIMEOUT gives unacknowledged output the same time, so a
 * vanished host's connections go in about keepalive_s * 5/3. */
static void sock_keepalive(int fd, uint32_t idle_s)
{
	int on = 1, idle = (int)MIN(idle_s, 32767u), intvl = MAX(1, idle / 6), cnt = 4;
	unsigned user_ms = (unsigned)(idle + intvl * cnt) * 1000u;

	if (!idle_s)
		return;
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
	(void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms));
}

/* Accepted sockets inherit these from the listener (Linux copies the
 * listener's socket into each connection: TCP_NODELAY, SO_KEEPALIVE and its
 * timers, TCP_USER_TIMEOUT), so they cost six setsockopt calls once instead
 * of per accept, a fifth of the system calls of a worker-init storm. */
static void listener_sockopts(int fd, uint32_t keepalive_s)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	sock_keepalive(fd, keepalive_s);
}

/* A refused client: accepted and closed at once (it sees EOF, not a connect
 * timeout), logged within the log budget. Takes ownership of fd. */
static void srv_refuse(struct store_server *srv, int fd, enum store_metric why)
{
	srv->metrics[why]++;
	srv->st.dropped_conns++;
	if (log_budget(srv))
		log_at(LL_WARN, SUB_STORE, "refusing a client: %s (%llu open)", metric_help[why],
		       (unsigned long long)srv->st.conns);
	close(fd);
}

/* Takes ownership of fd. Sets up the connection with reading still off: see
 * conn_start. NULL when out of memory (fd closed). */
static struct store_conn *conn_new(struct store_server *srv, int fd)
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
		conn_close(c);
		goto fail_logged;
	}
	bufferevent_setcb(c->bev, conn_on_read, conn_on_write, conn_on_event, c);
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
static void conn_start(struct store_conn *c)
{
	if (!c->srv->cfg.tls && !c->srv->cfg.auth)
		c->rd_ev = event_new(c->srv->base, bufferevent_getfd(c->bev), EV_READ | EV_PERSIST,
				     conn_on_raw_read, c);
	conn_read(c, true);
}

static void srv_on_accept(struct evconnlistener *lsn, evutil_socket_t fd, struct sockaddr *sa,
			  int salen, void *arg)
{
	struct store_server *srv = arg;
	struct store_conn *c;

	(void)lsn;
	(void)salen;
	if (!store_server_peer_allowed(srv, sa)) {
		char peer[INET6_ADDRSTRLEN + 8];

		srv->metrics[STORE_M_REFUSED_ALLOWLIST]++;
		srv->st.dropped_conns++;
		peer_name(fd, peer, sizeof(peer));
		if (log_budget(srv))
			log_at(LL_WARN, SUB_STORE, "refusing client %s: %s", peer,
			       metric_help[STORE_M_REFUSED_ALLOWLIST]);
		close(fd);
		return;
	}
	/* Behind a gate a stranger takes a pre-auth slot, not one of
	 * max_conns (checked when it gets in: store_preauth_end). */
	if (store_server_gated(srv)) {
		int why = store_preauth_admit(srv, sa);

		if (why) {
			srv_refuse(srv, fd, (enum store_metric)why);
			return;
		}
	} else if (srv->st.conns >= srv->cfg.max_conns) {
		srv_refuse(srv, fd, STORE_M_REFUSED_MAX_CONNS);
		return;
	}
	c = conn_new(srv, fd);
	if (!c)
		return;
	if (store_server_gated(srv) && store_preauth_begin(c, sa) < 0) {
		conn_drop(c, STORE_M_DROP_OP_FAILED, "out of memory");
		return;
	}
	/* The gate (server_auth.c): a challenge out, one answer in, before
	 * any request is read; with TLS the bufferevent runs the handshake. */
	if (store_conn_auth_start(c) < 0) {
		conn_drop(c, STORE_M_DROP_OP_FAILED, "cannot start authentication");
		return;
	}
	conn_start(c);
	store_conn_flush(c); /* the challenge */
}

static void srv_on_accept_retry(evutil_socket_t fd, short what, void *arg)
{
	struct store_server *srv = arg;

	(void)fd;
	(void)what;
	evconnlistener_enable(srv->lsn);
}

/* accept() failed. Out of fds (EMFILE, ENFILE), the spare fd is given up
 * so the waiting clients can be accepted and closed - they see a clean EOF
 * instead of a connect timeout - and taken back. Without a spare (or on
 * ENOBUFS), accepting pauses for 100 ms instead of spinning on a listener
 * that stays readable. Either way the log line is rate-limited. */
static void srv_on_accept_error(struct evconnlistener *lsn, void *arg)
{
	struct store_server *srv = arg;
	struct timeval tv = {0, 100 * 1000};
	int err = EVUTIL_SOCKET_ERROR(), lfd = evconnlistener_get_fd(lsn);

	if ((err == EMFILE || err == ENFILE) && srv->reserve_fd >= 0) {
		close(srv->reserve_fd);
		srv->reserve_fd = -1;
		for (int i = 0; i < 64; i++) {
			int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

			if (fd < 0)
				break;
			srv_refuse(srv, fd, STORE_M_REFUSED_FD_LIMIT);
		}
		srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (srv->reserve_fd >= 0)
			return;
	}
	if (log_budget(srv))
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

/* ---- configuration ------------------------------------------------------- */

#define CFG_FIELD(f) \
	offsetof(struct store_server_config, f), sizeof(((struct store_server_config *)0)->f)
#define BIG ((uint64_t)1 << 40) /* 1 TiB: keeps size arithmetic safe */

/* Every tunable, once: crun-rdzvd's flags and help, rdzv_conf's store_* keys
 * and the README table are generated from it. */
static const struct store_server_limit limit_rows[] = {
    {"max-conns", "count",
     "open client connections (with TLS or a secret: authenticated ones); auto: min(65536, the fd "
     "limit less the fds open at start, 64 and the pre-auth budget)",
     1, UINT32_MAX, "auto", CFG_FIELD(max_conns)},
    {"max-key-bytes", "bytes", "longest key accepted", 1, BIG, NULL,
     CFG_FIELD(limits.max_key_bytes)},
    {"max-value-bytes", "bytes", "longest value accepted", 1, BIG, NULL,
     CFG_FIELD(limits.max_value_bytes)},
    {"max-keys-per-request", "count",
     "keys per CHECK/WAIT/MULTI_*; also one connection's waits, watches and leases", 1, BIG, NULL,
     CFG_FIELD(limits.max_items)},
    {"max-keys", "count", "keys in the store, waited-for ones included", 1, BIG, NULL,
     CFG_FIELD(max_keys)},
    {"max-total-key-bytes", "bytes", "bytes of all those keys together", 1, BIG * 64, NULL,
     CFG_FIELD(max_total_key_bytes)},
    {"max-total-value-bytes", "bytes", "all values and queued items together", 1, BIG * 64, NULL,
     CFG_FIELD(max_total_value_bytes)},
    {"max-waiters", "count", "WAIT/BARRIER/WATCH_KEY registrations, all clients", 1, BIG, NULL,
     CFG_FIELD(max_waiters)},
    {"max-conn-buffer-bytes", "bytes",
     "unprocessed input per connection, so a frame must fit; auto: the largest frame the key and "
     "value limits allow",
     64, BIG, "auto", CFG_FIELD(max_conn_buffered_bytes)},
    {"max-total-input-bytes", "bytes",
     "unprocessed input, all connections; over it the largest holder is closed", 4096, BIG * 64,
     NULL, CFG_FIELD(max_total_input_bytes)},
    {"max-conn-output-bytes", "bytes", "unsent replies past which a connection is not read", 64,
     BIG, NULL, CFG_FIELD(max_conn_output_bytes)},
    {"max-total-output-bytes", "bytes",
     "unsent replies, all connections; past it large replies wait", 4096, BIG * 64, NULL,
     CFG_FIELD(max_total_output_bytes)},
    {"keepalive", "seconds", "TCP keepalive idle time; a vanished peer goes after ~5/3 of it", 0,
     32767, "off", CFG_FIELD(keepalive_s)},
    {"stall-timeout", "seconds",
     "close a connection whose partial frame or unread output makes no progress", 0, 86400, "off",
     CFG_FIELD(stall_timeout_s)},
    {"idle-timeout", "seconds",
     "close a connection silent this long (torch 1.13 keeps an idle one per store)", 0, UINT32_MAX,
     "off", CFG_FIELD(idle_timeout_s)},
    {"preauth-timeout", "seconds",
     "with TLS or a secret: time from accept to authenticated, however the bytes trickle", 1, 86400,
     NULL, CFG_FIELD(preauth_timeout_s)},
    {"max-preauth-conns", "count",
     "with TLS or a secret: connections not authenticated yet, all addresses (not in max-conns)", 1,
     UINT32_MAX, NULL, CFG_FIELD(max_preauth_conns)},
    {"max-preauth-per-addr", "count",
     "with TLS or a secret: connections not authenticated yet from one source address", 1,
     UINT32_MAX, NULL, CFG_FIELD(max_preauth_per_addr)},
    {"job-share", "percent",
     "one job (run id) may hold this much of each of max-keys, max-total-key-bytes, "
     "max-total-value-bytes and max-waiters",
     1, 100, NULL, CFG_FIELD(job_share_pct)},
    {"conn-share", "percent", "one connection may add this much of each of those budgets", 1, 100,
     NULL, CFG_FIELD(conn_share_pct)},
    {"reserve", "percent",
     "the last part of each of those budgets that only crun's rendezvous keys (/crun-c10d/) may "
     "use",
     0, 99, "off", CFG_FIELD(reserve_pct)},
};

const struct store_server_limit *store_server_limits(size_t *ret_n)
{
	*ret_n = ARRAY_SIZE(limit_rows);
	return limit_rows;
}

uint64_t store_server_limit_get(const struct store_server_config *cfg, size_t i)
{
	const struct store_server_limit *l = &limit_rows[i];
	const char *p = (const char *)cfg + l->offset;
	uint64_t v64;
	uint32_t v32;

	if (l->size == sizeof(v32)) {
		memcpy(&v32, p, sizeof(v32));
		return v32;
	}
	memcpy(&v64, p, sizeof(v64));
	return v64;
}

static void limit_put(struct store_server_config *cfg, size_t i, uint64_t v)
{
	const struct store_server_limit *l = &limit_rows[i];
	char *p = (char *)cfg + l->offset;
	uint32_t v32 = (uint32_t)v;

	if (l->size == sizeof(v32))
		memcpy(p, &v32, sizeof(v32));
	else
		memcpy(p, &v, sizeof(v));
}

int store_server_config_set(struct store_server_config *cfg, const char *name, const char *text,
			    char *err, size_t cap)
{
	for (size_t i = 0; i < ARRAY_SIZE(limit_rows); i++) {
		const struct store_server_limit *l = &limit_rows[i];
		size_t k = 0;
		uint64_t v;

		while (l->name[k] &&
		       (name[k] == l->name[k] || (name[k] == '_' && l->name[k] == '-')))
			k++;
		if (l->name[k] || name[k])
			continue;
		if (parse_uint_range(text, l->min, l->max, &v) < 0) {
			if (str_printf(err, cap,
				       "%s: expected an integer (%s) in [%llu, %llu], got '%s'",
				       l->name, l->unit, (unsigned long long)l->min,
				       (unsigned long long)l->max, text) < 0 &&
			    cap)
				err[0] = '\0';
			return CRUN_EINVAL;
		}
		limit_put(cfg, i, v);
		return 0;
	}
	return CRUN_ENOTFOUND;
}

/* The largest frame `lim` allows: COMPARE_SET's key and two values. */
static size_t largest_frame(const struct store_limits *lim)
{
	return 1 + 8 + lim->max_key_bytes + 2 * (8 + lim->max_value_bytes);
}

/* Descriptors this process has open now (its /proc/self/fd entries, less
 * the one reading them); -1 when that cannot be read. */
static long open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	long n = 0;

	if (!d)
		return -1;
	while ((de = readdir(d)))
		n += de->d_name[0] != '.';
	closedir(d);
	return n - 1;
}

/* max_conns 0: what the fd limit leaves after what the process holds when
 * the server starts and AUTO_FD_MARGIN more for what it opens later (the
 * agent serving its worker store holds about 13 whatever its worker count,
 * crun-rdzvd fewer), at most 65536. A fixed reserve, not a share of the
 * limit: an eighth of 20,000 kept 2,500 descriptors idle and refused a job's
 * ranks past 17,500. Without /proc, an eighth as before. `preauth`: the
 * pre-auth budget of a gated server, whose descriptors come on top. */
#define AUTO_FD_MARGIN 64
static uint32_t auto_max_conns(uint64_t preauth)
{
	struct rlimit rl;
	uint64_t lim = 1024, reserve;
	long held = open_fds();

	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		lim = rl.rlim_cur == RLIM_INFINITY ? 65536 + 8192 : rl.rlim_cur;
	reserve = held >= 0 ? (uint64_t)held + AUTO_FD_MARGIN : MAX(AUTO_FD_MARGIN, lim / 8);
	reserve += preauth;
	return lim > reserve + 1 ? (uint32_t)MIN(65536, lim - reserve) : 1;
}

/* auto_conns: what max_conns 0 means, computed once when the server starts
 * (a reload would count the descriptors opened since and move it). */
static void cfg_fill(struct store_server_config *dst, const struct store_server_config *src,
		     uint32_t auto_conns)
{
	const struct store_server_config def = STORE_SERVER_CONFIG_DEFAULT;

	*dst = *src;
	dst->host = NULL; /* borrowed; only used while binding */
	/* 0 means "the default" for every size and count, and for the times
	 * that cannot be off; for the others (zero "off") it means off. */
	for (size_t i = 0; i < ARRAY_SIZE(limit_rows); i++)
		if (!(limit_rows[i].zero && !strcmp(limit_rows[i].zero, "off")) &&
		    !store_server_limit_get(dst, i))
			limit_put(dst, i, store_server_limit_get(&def, i));
	if (!dst->max_conns)
		dst->max_conns = auto_conns;
	if (!dst->max_conn_buffered_bytes)
		dst->max_conn_buffered_bytes = largest_frame(&dst->limits);
}

/* ---- public ---------------------------------------------------------------- */

int store_server_new(struct event_base *base, const struct store_server_config *cfg,
		     struct store_server **ret_srv)
{
	struct store_server *srv;
	struct timeval sweep = {SWEEP_MS / 1000, 0};
	int fd = -1, r;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return CRUN_ENOMEM;
	srv->base = base;
	srv->reserve_fd = -1;
	srv->stall_min = SIZE_MAX;
	cfg_fill(&srv->cfg, cfg, 1);
	srv->auto_conns = auto_max_conns(cfg->tls || cfg->auth ? srv->cfg.max_preauth_conns : 0);
	cfg_fill(&srv->cfg, cfg, srv->auto_conns);
	srv->out_hard_cap = srv->cfg.max_conn_output_bytes + srv->cfg.max_conn_buffered_bytes;
	DL_INIT(&srv->conns);
	DL_INIT(&srv->stalled);
	DL_INIT(&srv->preauth);
	store_preauth_set_timeout(srv);
	r = store_share_init(srv);
	if (r < 0)
		goto fail;
	r = kv_init(&srv->kv, srv->cfg.max_keys, srv->cfg.max_total_key_bytes);
	if (r < 0)
		goto fail;
	srv->kv_ready = true;
	r = CRUN_ENOMEM;
	srv->accept_retry = evtimer_new(base, srv_on_accept_retry, srv);
	srv->unstall = event_new(base, -1, 0, srv_on_unstall, srv);
	srv->sweep = event_new(base, -1, EV_PERSIST, srv_on_sweep, srv);
	if (!srv->accept_retry || !srv->unstall || !srv->sweep)
		goto fail;
	if ((srv->cfg.stall_timeout_s || srv->cfg.idle_timeout_s) && event_add(srv->sweep, &sweep))
		goto fail;
	/* Best effort: without it, the fd limit pauses accepting instead. */
	srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	r = srv_listen(srv, cfg->host, cfg->port, &fd);
	if (r < 0) {
		log_at(LL_ERROR, SUB_STORE, "cannot listen on %s:%u: %s",
		       cfg->host && *cfg->host ? cfg->host : "*", cfg->port, crun_strerror(r));
		goto fail;
	}
	srv->port = fd_port(fd);
	listener_sockopts(fd, srv->cfg.keepalive_s);
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
	int off = 0;

	cfg_fill(&n, cfg, srv->auto_conns);
	for (size_t i = 0; i < ARRAY_SIZE(limit_rows); i++)
		limit_put(&srv->cfg, i, store_server_limit_get(&n, i));
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
			sock_keepalive(fd, srv->cfg.keepalive_s);
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
