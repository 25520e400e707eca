/* proxy.c: the node-local store proxy (proxy.h).
 *
 * Why. At 12,288 nodes x 8 ranks every rank connects to one worker store;
 * a single server is at the floor of the request/response protocol and one
 * process holds at most ~19,900 connections here (issue 16). With a proxy on
 * every node but the store's own, the store sees one connection and one
 * waiter per node (12,288 nodes fit one process's 20,000 descriptors).
 *
 * Local side. Clients of both dialects are sniffed (store_proto_sniff) and
 * decoded with the pure codec (proto.c). A client has at most one request in
 * flight: its next request is decoded only when the previous one was answered
 * (TCPStore clients never pipeline, except a v2 CANCEL_WAIT behind its WAIT),
 * which keeps every client's replies in order without any per-client queue.
 * VALIDATE and PING are answered here.
 *
 * Upstream. One "main" connection (v2 dialect: VALIDATE, PING, HELLO, and
 * MUX when the store answers HELLO with extension version 5 or more)
 * carries every client's requests, FIFO. Clients are served once HELLO is
 * answered (main_ready), so MUX is the first request after it. The wire format after the op byte is
 * the same in both dialects, so a request is forwarded as its v2 op byte plus the raw bytes;
 * replies carry no dialect, so they are copied back verbatim. Replies come in request order: a ring
 * of pending entries (at most one per client) says whose each reply is. A client that closes leaves
 * its entry behind with no owner; its reply is read and dropped.
 *
 * Waits. A blocking WAIT (2.x GET is WAIT + GET) must not block the shared
 * connection, so a local WAIT goes out as CHECK on it first. That also
 * orders it after the client's earlier SETs (which have no reply): the CHECK
 * is answered only after they ran. READY answers STOP_WAITING at once;
 * NOT_READY joins the client to the wait set of its exact key list (bytes as
 * on the wire: torch ranks send identical lists), and the first member's
 * join sends one wait for the set. On a muxed main connection that is a
 * WAIT_TAG with a new tag (store_ext.h): the store answers it with a WAKE
 * frame between two in-order replies, so the main connection never parks
 * and is the only one. A store without MUX (crun-rdzvd --ext-version 4)
 * gets a plain WAIT on a wait connection of the set's own (pooled and
 * reused; never more than one per pending set, so at most one per client).
 * The wake releases every member. A client whose last
 * reply came back after its last reply-less request (nothing of it
 * unconfirmed upstream) joins a set already pending without its CHECK: that
 * is how the 8 ranks of a node share one round trip of the storm's barrier.
 * v2 clients are parked while they wait (only CANCEL_WAIT is read: it
 * leaves the set and answers WAIT_CANCELED; a set left empty sends
 * WAIT_TAG_CANCEL, or closes its wait connection, either of which drops the
 * upstream registration; a WAKE that crossed the cancel carries a tag no set
 * has and is dropped, one never sent fails the proxy); v1 clients are not
 * parked, as crun's server does not park them (a 1.13 client that timed out
 * goes on and later reads the stale STOP_WAITING, exactly as with torch).
 *
 * What is not multiplexed (store_proxy_route: v1 WATCH_KEY, queue ops,
 * BARRIER, any op code the codec does not know) moves that client, from that
 * request on, to a passthrough connection of its own, relayed verbatim in
 * its own dialect: correctness first, and the upstream sees exactly what the
 * client sent (an unknown op closes that connection there, as direct).
 *
 * Bounds. Clients: max_clients. A client's input: one legal frame (reading
 * pauses at px->in_max; the codec refuses an oversized length at once). Its
 * output: the reply to its one request; past max_client_out_bytes of unread
 * replies its next request waits. Pending entries: one per client (and the
 * owed replies of clients that left). Wait sets (tags) and wait
 * connections: at most one per client, within the store's
 * STORE_EXT_MUX_MAX_WAITS. The shared connection is always read, so a slow
 * client never stalls the others.
 *
 * System calls. Clients are read with one recv() per readiness (no
 * bufferevent read: it adds an ioctl(FIONREAD) to each) and answered with
 * one send() when nothing is queued (the bufferevent would add and remove
 * its write event per reply): ~21 calls per rank in the storm, against ~44
 * with plain bufferevents.
 *
 * Failure. Any upstream connection of the shared kind (main or wait) that
 * fails, is closed by the store or sends what was not asked (a reply with
 * nothing owed, an unknown frame) closes every local client and the
 * listener: the workers see their store gone exactly as when the real one
 * dies. A passthrough connection that closes closes only its client, as the
 * store closing a direct connection would. A malformed frame closes only its
 * client.
 *
 * Known differences from a direct connection (README): an ADD on a
 * non-numeric value, which the store answers by closing the connection,
 * closes the shared one and so every client of the node; a v1 GET of a
 * missing key reads an empty value (the upstream speaks v2) where a direct
 * v1 connection would be closed; a v2 WAIT on a queue key is coalesced like
 * any other, so a QUEUE_PUSH that wakes one upstream waiter wakes every local
 * client of that set.
 *
 * Security. The listener binds the agent's own address (or loopback) and
 * accepts only peers on this host. The worker store is plaintext without
 * authentication (PyTorch cannot authenticate; the agent narrows it to the
 * round's nodes), so the upstream needs no credentials.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/proxy/proxy_int.h"

/* ---- the routing table ------------------------------------------------------ */

static const uint8_t route_of[STORE_OP__MAX] = {
    [STORE_OP_VALIDATE] = PROXY_LOCAL,
    [STORE_OP_PING] = PROXY_LOCAL,
    [STORE_OP_SET] = PROXY_FIFO_NOREPLY,
    [STORE_OP_APPEND] = PROXY_FIFO_NOREPLY,
    [STORE_OP_MULTI_SET] = PROXY_FIFO_NOREPLY,
    [STORE_OP_GET] = PROXY_FIFO,
    [STORE_OP_COMPARE_SET] = PROXY_FIFO,
    [STORE_OP_ADD] = PROXY_FIFO,
    [STORE_OP_CHECK] = PROXY_FIFO,
    [STORE_OP_GETNUMKEYS] = PROXY_FIFO,
    [STORE_OP_DELETE_KEY] = PROXY_FIFO,
    [STORE_OP_MULTI_GET] = PROXY_FIFO,
    [STORE_OP_LIST_KEYS] = PROXY_FIFO,
    [STORE_OP_WAIT] = PROXY_WAIT,
    [STORE_OP_CANCEL_WAIT] = PROXY_CANCEL,
    /* Pushed notifications (v1 watch), one-waiter wake-ups (queues) and a
     * server-side blocking counter (BARRIER): one connection each. */
    [STORE_OP_WATCH_KEY] = PROXY_PASS,
    [STORE_OP_QUEUE_PUSH] = PROXY_PASS,
    [STORE_OP_QUEUE_POP] = PROXY_PASS,
    [STORE_OP_QUEUE_LEN] = PROXY_PASS,
    [STORE_OP_BARRIER] = PROXY_PASS,
};

enum store_proxy_route store_proxy_route(enum store_dialect d, int op)
{
	(void)d; /* the logical op decides; v1 lacks some ops, never differs */
	if (op < 0 || op >= STORE_OP__MAX)
		return PROXY_PASS;
	return (enum store_proxy_route)route_of[op];
}

/* ---- local clients ------------------------------------------------------------- */

void proxy_client_close(struct client *cl)
{
	struct store_proxy *px = cl->px;

	if (cl->waiting)
		proxy_end_wait(cl);
	for (size_t i = 0; i < px->ring_len; i++) {
		struct pend *p = &px->ring[(px->ring_head + i) % px->ring_cap];

		if (p->cl == cl)
			p->cl = NULL;
	}
	if (cl->pass) {
		cl->pass->cl = NULL;
		proxy_up_free(cl->pass);
	}
	dl_del(&cl->link);
	if (cl->in)
		evbuffer_free(cl->in);
	if (cl->rd_ev)
		event_free(cl->rd_ev);
	bufferevent_free(cl->bev);
	free(cl->wkeys);
	px->st.clients--;
	free(cl);
}

/* From this request on, the client is relayed verbatim on a connection of
 * its own (v2: after the VALIDATE the proxy already took from it). */
static int client_to_pass(struct client *cl)
{
	struct store_proxy *px = cl->px;
	struct up *u;
	uint8_t v[5];

	TRY(proxy_up_open(px, UP_PASS, &u));
	u->cl = cl;
	cl->pass = u;
	px->st.passthrough++;
	if (cl->d == STORE_V2) {
		v[0] = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_VALIDATE);
		store_put_u32(v + 1, STORE_VALIDATE_MAGIC);
		if (evbuffer_add(bufferevent_get_output(u->bev), v, 5) < 0)
			return CRUN_ENOMEM;
	}
	return 0; /* no frame limit any more: the store applies its own */
}

static int client_wait(struct client *cl, const struct store_req *q, const uint8_t *raw,
		       size_t used)
{
	struct store_proxy *px = cl->px;
	struct pend p = {.cl = cl, .op = STORE_OP_CHECK, .kind = PEND_CHECK, .nitems = q->nitems};

	px->st.waits++;
	if (cl->waiting) /* v1: a second WAIT replaces the first (torch's count) */
		proxy_end_wait(cl);
	cl->wkeys = mem_dup(raw + 1, used - 1);
	if (!cl->wkeys)
		return CRUN_ENOMEM;
	cl->wkeys_len = used - 1;
	cl->wnitems = q->nitems;
	cl->waiting = true;
	/* Nothing of this client unconfirmed upstream and its set pending:
	 * join without the CHECK round trip (file comment). */
	if (!cl->unconfirmed && proxy_ws_find(px, cl->wkeys, cl->wkeys_len))
		return proxy_ws_join(cl);
	p.gen = cl->wait_gen;
	TRY(proxy_up_send(px->main, STORE_OP_CHECK, raw, used));
	TRY(proxy_pend_push(px, &p));
	px->st.requests++;
	cl->busy = true;
	return 0;
}

/* Acts on one decoded request; raw[0..used) is its frame. */
static int client_dispatch(struct client *cl, const struct store_req *q, const uint8_t *raw,
			   size_t used)
{
	struct store_proxy *px = cl->px;
	struct pend p = {.cl = cl, .op = (uint8_t)q->op, .kind = PEND_REPLY, .nitems = q->nitems};
	uint8_t b[4];

	switch (store_proxy_route(cl->d, q->op)) {
	case PROXY_LOCAL:
		px->st.local_replies++;
		if (q->op == STORE_OP_VALIDATE)
			return q->u32 == STORE_VALIDATE_MAGIC ? 0 : CRUN_EPROTO;
		store_put_u32(b, q->u32);
		return proxy_client_send(cl, b, 4);
	case PROXY_FIFO_NOREPLY:
		px->st.requests++;
		cl->unconfirmed = true;
		return proxy_up_send(px->main, q->op, raw, used);
	case PROXY_FIFO:
		px->st.requests++;
		TRY(proxy_up_send(px->main, q->op, raw, used));
		TRY(proxy_pend_push(px, &p));
		cl->busy = true;
		return 0;
	case PROXY_WAIT:
		return client_wait(cl, q, raw, used);
	case PROXY_CANCEL:
		px->st.local_replies++;
		if (cl->waiting)
			proxy_end_wait(cl);
		return proxy_out_u8(cl, STORE_WAIT_CANCELED);
	case PROXY_PASS:
	default:
		return CRUN_EAGAIN; /* the caller moves the client */
	}
}

/* Decodes and acts on the client's requests while it may have one more. */
void proxy_client_process(struct client *cl)
{
	struct store_proxy *px = cl->px;
	struct evbuffer *in = cl->in;

	/* Held until the main connection knows whether it is muxed (its
	 * first request must be MUX); main_ready processes it then. */
	while (px->ready && !cl->pass && !cl->busy) {
		size_t len = evbuffer_get_length(in), used;
		const uint8_t *p;
		struct store_req q;
		int r, op;

		if (len == 0)
			break;
		if (evbuffer_get_length(bufferevent_get_output(cl->bev)) >
		    px->cfg.max_client_out_bytes) {
			cl->out_blocked = true; /* resumed by the write callback */
			break;
		}
		/* Amortised, as in server.c: the pulled-up chain grows
		 * geometrically and new reads land behind it. */
		p = evbuffer_pullup(in, (ev_ssize_t)len);
		if (!p)
			goto close;
		if (!cl->sniffed) {
			size_t eaten;

			r = store_proto_sniff(p, len, &cl->d, &eaten);
			if (r == CRUN_EAGAIN)
				break;
			cl->sniffed = true;
			evbuffer_drain(in, eaten);
			continue;
		}
		op = store_proto_op_from_code(cl->d, p[0]);
		/* A parked v2 client: only a CANCEL_WAIT is read (as the server). */
		if (cl->waiting && cl->d == STORE_V2 && op != STORE_OP_CANCEL_WAIT)
			break;
		if (store_proxy_route(cl->d, op) == PROXY_PASS) {
			if (client_to_pass(cl) < 0)
				goto close;
			break;
		}
		r = store_proto_decode_req_from(cl->d, &px->cfg.limits, &cl->dec, p, len, &q,
						&used);
		if (r == CRUN_EAGAIN)
			break;
		if (r < 0) {
			px->st.dropped++;
			goto close;
		}
		r = client_dispatch(cl, &q, p, used);
		evbuffer_drain(in, used);
		memset(&cl->dec, 0, sizeof(cl->dec));
		if (r < 0) {
			px->st.dropped++;
			goto close;
		}
	}
	if (cl->pass && evbuffer_get_length(in) > 0) {
		struct evbuffer *out = bufferevent_get_output(cl->pass->bev);

		if (evbuffer_add_buffer(out, in) < 0)
			goto close;
		cl->relay_full = evbuffer_get_length(out) >= PASS_HIGH; /* up_on_write */
	}
	proxy_client_sync_read(cl);
	return;
close:
	proxy_client_close(cl);
}

void proxy_client_sync_read(struct client *cl)
{
	bool on = !cl->relay_full && (cl->pass || evbuffer_get_length(cl->in) < cl->px->in_max);

	if (on == cl->rd_on)
		return;
	if (on ? event_add(cl->rd_ev, NULL) : event_del(cl->rd_ev))
		return; /* stays as it was; the next call retries */
	cl->rd_on = on;
}

/* Plain reading: one recv() into the input buffer per readiness (the
 * bufferevent's reads cost an ioctl(FIONREAD) each). EOF or an error closes
 * the client, as the store drops a direct one. */
static void client_on_raw_read(evutil_socket_t fd, short what, void *arg)
{
	struct client *cl = arg;
	uint8_t buf[16384];
	ssize_t n = recv(fd, buf, sizeof(buf), 0);

	(void)what;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
		return;
	if (n <= 0 || evbuffer_add(cl->in, buf, (size_t)n) < 0) {
		proxy_client_close(cl);
		return;
	}
	proxy_client_process(cl);
}

static void client_on_write(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;

	if (cl->pass) {
		bufferevent_enable(cl->pass->bev, EV_READ);
		return;
	}
	proxy_client_sync_read(cl);
	if (cl->out_blocked) {
		cl->out_blocked = false;
		proxy_client_process(cl);
	}
}

static void client_on_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	(void)what;
	proxy_client_close(arg); /* EOF or error: as the store drops a direct one */
}

/* Same host: the peer is loopback, or has the address it reached us on. */
static bool peer_is_local(int fd, const struct sockaddr *peer)
{
	struct sockaddr_storage me;
	socklen_t len = sizeof(me);

	if (peer->sa_family == AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)peer;

		if ((ntohl(a->sin_addr.s_addr) >> 24) == 127)
			return true;
	} else if (peer->sa_family == AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)peer;

		if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr))
			return true;
	}
	if (getsockname(fd, (struct sockaddr *)&me, &len) < 0 || me.ss_family != peer->sa_family)
		return false;
	if (peer->sa_family == AF_INET)
		return ((struct sockaddr_in *)&me)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)peer)->sin_addr.s_addr;
	return memcmp(&((struct sockaddr_in6 *)&me)->sin6_addr,
		      &((const struct sockaddr_in6 *)peer)->sin6_addr, 16) == 0;
}

static void px_on_accept(struct evconnlistener *lsn, evutil_socket_t fd, struct sockaddr *sa,
			 int salen, void *arg)
{
	struct store_proxy *px = arg;
	struct client *cl;

	(void)lsn;
	(void)salen;
	if (px->failed || px->st.clients >= px->cfg.max_clients ||
	    (!px->cfg.allow_remote && !peer_is_local(fd, sa))) {
		px->st.refused++;
		close(fd);
		return;
	}
	cl = calloc(1, sizeof(*cl));
	if (!cl) {
		close(fd);
		return;
	}
	cl->px = px;
	DL_INIT(&cl->link);
	DL_INIT(&cl->ws_link);
	cl->bev = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!cl->bev) {
		close(fd);
		free(cl);
		return;
	}
	cl->rd_ev = event_new(px->base, fd, EV_READ | EV_PERSIST, client_on_raw_read, cl);
	cl->in = evbuffer_new();
	bufferevent_setcb(cl->bev, NULL, client_on_write, client_on_event, cl);
	dl_add_tail(&px->clients, &cl->link);
	px->st.clients++;
	px->st.accepted++;
	/* Writing is enabled from birth; its event is added only while output
	 * waits (enabling it here would cost two epoll_ctl per connection). */
	if (!cl->rd_ev || !cl->in) {
		proxy_client_close(cl);
		return;
	}
	proxy_client_sync_read(cl);
}

/* ---- life cycle ------------------------------------------------------------------ */

static int resolve(const char *host, uint16_t port, int passive, struct sockaddr_storage *ret,
		   socklen_t *ret_len)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
	struct addrinfo *res;
	char ps[8];

	if (str_printf(ps, sizeof(ps), "%u", port) < 0)
		return CRUN_EINVAL;
	hints.ai_flags |= AI_NUMERICHOST;
	if (getaddrinfo(host, ps, &hints, &res) != 0) {
		hints.ai_flags &= ~AI_NUMERICHOST;
		if (passive || getaddrinfo(host, ps, &hints, &res) != 0)
			return CRUN_ERESOLVE;
	}
	memcpy(ret, res->ai_addr, res->ai_addrlen);
	*ret_len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int px_listen(struct store_proxy *px)
{
	const char *host =
	    px->cfg.listen_host && *px->cfg.listen_host ? px->cfg.listen_host : "127.0.0.1";
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, one = 1, r;

	TRY(resolve(host, px->cfg.listen_port, 1, &ss, &len));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	proxy_nodelay(fd); /* Linux copies it into every accepted socket */
	if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	len = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	px->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						  : ((struct sockaddr_in *)&ss)->sin_port);
	px->lsn = evconnlistener_new(px->base, px_on_accept, px,
				     LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
	if (!px->lsn) {
		close(fd);
		return CRUN_ENOMEM;
	}
	return 0;
}

int store_proxy_new(struct event_base *base, const struct store_proxy_config *cfg,
		    struct store_proxy **ret_px)
{
	struct store_proxy *px;
	int r;

	if (!base || !cfg || !cfg->upstream_host || !*cfg->upstream_host || !cfg->upstream_port)
		return CRUN_EINVAL;
	px = calloc(1, sizeof(*px));
	if (!px)
		return CRUN_ENOMEM;
	px->base = base;
	DL_INIT(&px->clients);
	DL_INIT(&px->sets);
	px->cfg = *cfg;
	px->cfg.upstream_host = NULL; /* borrowed strings are not kept */
	px->cfg.listen_host = NULL;
	if (!px->cfg.max_clients)
		px->cfg.max_clients = DEFAULT_MAX_CLIENTS;
	if (!px->cfg.max_client_out_bytes)
		px->cfg.max_client_out_bytes = DEFAULT_CLIENT_OUT;
	if (!px->cfg.limits.max_items) {
		const struct store_limits def = STORE_LIMITS_DEFAULT;

		px->cfg.limits = def;
	}
	/* One legal frame (a MULTI_SET of many pairs aside: the codec bounds
	 * those by max_items anyway, and rejects an oversized length at once). */
	px->in_max = 1 + 3 * 8 + px->cfg.limits.max_key_bytes + 2 * px->cfg.limits.max_value_bytes;
	px->ring_cap =
	    2 * (size_t)px->cfg.max_clients + 2; /* slack: owed replies of clients that left */
	px->ring = calloc(px->ring_cap, sizeof(*px->ring));
	r = CRUN_ENOMEM;
	if (!px->ring)
		goto fail;
	r = resolve(cfg->upstream_host, cfg->upstream_port, 0, &px->up_addr, &px->up_addr_len);
	if (r < 0)
		goto fail;
	px->cfg.listen_host = cfg->listen_host;
	r = px_listen(px);
	px->cfg.listen_host = NULL;
	if (r < 0)
		goto fail;
	r = proxy_up_open(px, UP_MAIN, &px->main);
	if (r < 0)
		goto fail;
	*ret_px = px;
	return 0;
fail:
	store_proxy_free(px);
	return r;
}

void store_proxy_free(struct store_proxy *px)
{
	if (!px)
		return;
	proxy_close_all(px);
	free(px->ring);
	free(px);
}

uint16_t store_proxy_port(const struct store_proxy *px)
{
	return px->port;
}

bool store_proxy_failed(const struct store_proxy *px)
{
	return px->failed;
}

void store_proxy_get_stats(const struct store_proxy *px, struct store_proxy_stats *ret)
{
	*ret = px->st;
}
