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
 * libevent writes with writev(), so the process embedding the server must
 * ignore SIGPIPE (crun-rdzvd and the agent do), or a vanished client kills it.
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
#include "store/store_ext.h"

/* ---- connection teardown ----------------------------------------------------- */

/* The one close path: unregisters every wait and watch, frees the
 * bufferevent (closing the socket) and the connection. Callers return at once. */
static void conn_close(struct store_conn *c)
{
	struct store_server *srv = c->srv;

	store_conn_unregister(c);
	store_ext_conn_closed(c); /* after the waits are gone: it may SET keys */
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

/* Output pushed to a connection by someone else's operation (wake-ups, watch
 * notifications) is not throttled; a connection that lets it pile up past the
 * ceiling is closed from its own (deferred) callback. */
void store_conn_check_pushed(struct store_conn *c)
{
	/* Twice the ceiling: a throttled connection may already hold a full
	 * ceiling of its own replies when a wake-up arrives. */
	if (evbuffer_get_length(store_conn_out(c)) / 2 <= c->srv->cfg.max_conn_buffered_bytes)
		return;
	c->doomed = true;
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
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
	       on ? "paused" : "resumed", evbuffer_get_length(store_conn_out(c)));
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
		if (evbuffer_get_length(store_conn_out(c)) > srv->cfg.max_conn_buffered_bytes) {
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
		if (store_ext_is_op(p[0])) {
			/* crun's extension ops (store_ext.h), only after HELLO. */
			r = store_ext_process(c, p, len, &used);
			if (r == CRUN_EAGAIN) {
				if (len < srv->cfg.max_conn_buffered_bytes)
					return true;
				conn_drop(c, CRUN_ETOOBIG, "frame over the buffer ceiling");
				return false;
			}
			if (r < 0) {
				conn_drop(c, r, store_ext_op_name(p[0]));
				return false;
			}
			evbuffer_drain(in, used);
			continue;
		}
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
		r = store_conn_dispatch(c, &q);
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
		store_conn_flush(arg);
}

static void conn_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct store_conn *c = arg;

	(void)bev;
	if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
		log_at(LL_DEBUG, SUB_STORE, "client closed (%s)",
		       what & BEV_EVENT_EOF ? "eof" : strerror(EVUTIL_SOCKET_ERROR()));
		c->peer_eof = (what & BEV_EVENT_EOF) != 0; /* leases: store_ext.h */
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
	DL_INIT(&c->leases);
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
	store_ext_server_free(srv); /* leases outlive connections, not the server */
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
