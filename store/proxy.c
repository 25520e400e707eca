/* proxy.c: the node-local store proxy (proxy.h).
 *
 * Why. At 12,288 nodes x 8 ranks every rank connects to one worker store;
 * a single server is at the floor of the request/response protocol and one
 * process holds at most ~19,900 connections here (issue 16). With a proxy on
 * every node but the store's own, the store sees one shared connection (plus
 * one per distinct pending wait) and one waiter per node.
 *
 * Local side. Clients of both dialects are sniffed (store_proto_sniff) and
 * decoded with the pure codec (proto.c). A client has at most one request in
 * flight: its next request is decoded only when the previous one was answered
 * (TCPStore clients never pipeline, except a v2 CANCEL_WAIT behind its WAIT),
 * which keeps every client's replies in order without any per-client queue.
 * VALIDATE and PING are answered here.
 *
 * Upstream. One "main" connection (v2 dialect: VALIDATE, PING) carries every
 * client's requests, FIFO. The wire format after the op byte is the same in
 * both dialects, so a request is forwarded as its v2 op byte plus the raw
 * bytes; replies carry no dialect, so they are copied back verbatim. Replies
 * come in request order: a ring of pending entries (at most one per client)
 * says whose each reply is. A client that closes leaves its entry behind
 * with no owner; its reply is read and dropped.
 *
 * Waits. A blocking WAIT (2.x GET is WAIT + GET) must not block the shared
 * connection, so a local WAIT goes out as CHECK on it first. That also
 * orders it after the client's earlier SETs (which have no reply): the CHECK
 * is answered only after they ran. READY answers STOP_WAITING at once;
 * NOT_READY joins the client to the wait set of its exact key list (bytes as
 * on the wire: torch ranks send identical lists), and the first member's
 * join sends one WAIT for the set on a wait connection of its own (pooled
 * and reused; never more than one per pending set, so at most one per
 * client). Its STOP_WAITING releases every member. A client whose last
 * reply came back after its last reply-less request (nothing of it
 * unconfirmed upstream) joins a set already pending without its CHECK: that
 * is how the 8 ranks of a node share one round trip of the storm's barrier.
 * v2 clients are parked while they wait (only CANCEL_WAIT is read: it
 * leaves the set and answers WAIT_CANCELED; a set left empty closes its wait
 * connection, which drops the upstream registration); v1 clients are not
 * parked, as crun's server does not park them (a 1.13 client that timed out
 * goes on and later reads the stale STOP_WAITING, exactly as with torch).
 *
 * What is not multiplexed (store_proxy_route: v1 WATCH_KEY, queue ops,
 * BARRIER, any op code the codec does not know) moves that client, from that
 * request on, to a passthrough connection of its own, relayed verbatim in
 * its own dialect: correctness first, and the upstream sees exactly what the
 * client sent (an unknown op closes that connection there, as direct).
 *
 * Bounds. Clients: max_clients. A client's input: one legal frame (its
 * bufferevent's read watermark). Its output: the reply to its one request;
 * past max_client_out_bytes of unread replies its next request waits.
 * Pending entries: one per client. Wait sets and wait connections: at most
 * one per client. The shared connection is always read, so a slow client
 * never stalls the others.
 *
 * Failure. Any upstream connection of the shared kind (main or wait) that
 * fails or is closed by the store closes every local client and the
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
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/proxy.h"

#define DEFAULT_MAX_CLIENTS 1024u
#define DEFAULT_CLIENT_OUT  (1024u * 1024)
#define IDLE_WAIT_CONNS	    4 /* pooled wait connections kept open */
#define PASS_HIGH	    (4u * 1024 * 1024) /* passthrough relay buffering */
#define HS_NONCE	    0x50524f58u	       /* "PROX", echoed by PING */

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

/* ---- types ------------------------------------------------------------------ */

struct client;
struct waitset;

enum up_kind { UP_MAIN, UP_WAIT, UP_PASS };

/* An upstream connection. */
struct up {
	struct store_proxy *px;	 /* borrowed */
	struct bufferevent *bev; /* owns the fd */
	enum up_kind kind;
	size_t hs_left;	    /* bytes of the PING echo still to read (MAIN, WAIT) */
	struct waitset *ws; /* WAIT: the set it waits for; NULL while pooled */
	struct client *cl;  /* PASS: its client */
	struct up *next;    /* WAIT: the idle pool */
};

/* One reply the shared connection owes, in request order. */
enum pend_kind { PEND_REPLY, PEND_CHECK };
struct pend {
	struct client *cl; /* NULL: the client left; the reply is dropped */
	uint8_t op;	   /* enum store_op, to size the reply */
	uint8_t kind;
	uint32_t gen; /* PEND_CHECK: the client's wait generation */
	uint64_t nitems;
};

struct client {
	struct store_proxy *px;
	struct bufferevent *bev;
	struct client *prev, *next; /* px->clients */
	enum store_dialect d;
	bool sniffed;
	bool busy;	    /* a reply owed on the shared connection */
	bool unconfirmed;   /* a reply-less request sent after the last reply */
	bool waiting;	    /* a WAIT not yet answered */
	bool out_blocked;   /* stopped on max_client_out_bytes */
	uint32_t wait_gen;  /* bumped when a wait ends, so a stale CHECK is ignored */
	uint8_t *wkeys;	    /* the pending WAIT's key list (u64 n + strings) */
	size_t wkeys_len;
	uint64_t wnitems;
	struct waitset *ws; /* the set it is a member of */
	struct client *ws_prev, *ws_next;
	struct up *pass; /* passthrough connection, once moved */
	struct store_dec_state dec;
};

struct waitset {
	struct store_proxy *px;
	struct waitset *prev, *next; /* px->sets */
	uint8_t *keys;		     /* owned copy of the key list */
	size_t keys_len;
	uint64_t nitems;
	struct client *members;
	struct up *up;	/* the connection its WAIT is pending on */
	bool releasing; /* ws_release walks it: no longer findable */
};

struct store_proxy {
	struct event_base *base;
	struct store_proxy_config cfg;
	struct sockaddr_storage up_addr;
	socklen_t up_addr_len;
	struct evconnlistener *lsn;
	uint16_t port;
	struct up *main;
	struct up *idle; /* pooled wait connections */
	size_t n_idle;
	struct pend *ring; /* capacity max_clients + 1 */
	size_t ring_cap, ring_head, ring_len;
	struct client *clients;
	struct waitset *sets;
	bool failed;
	struct store_proxy_stats st;
};

static void client_close(struct client *cl);
static void client_process(struct client *cl);
static void proxy_fail(struct store_proxy *px);
static void up_free(struct up *u);

/* ---- small helpers ---------------------------------------------------------- */

static void sock_nodelay(evutil_socket_t fd)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int out_u8(struct client *cl, uint8_t b)
{
	return evbuffer_add(bufferevent_get_output(cl->bev), &b, 1) < 0 ? CRUN_ENOMEM : 0;
}

/* Forwards one decoded request (raw[0..len)) upstream as op `op` in v2. */
static int up_send(struct up *u, enum store_op op, const uint8_t *raw, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(u->bev);
	uint8_t code = (uint8_t)store_proto_opcode(STORE_V2, op);

	if (evbuffer_add(out, &code, 1) < 0 || evbuffer_add(out, raw + 1, len - 1) < 0)
		return CRUN_ENOMEM;
	return 0;
}

static int pend_push(struct store_proxy *px, const struct pend *p)
{
	if (px->ring_len == px->ring_cap)
		return CRUN_ENOSPC; /* cannot happen: one per client */
	px->ring[(px->ring_head + px->ring_len) % px->ring_cap] = *p;
	px->ring_len++;
	return 0;
}

/* ---- wait sets ---------------------------------------------------------------- */

static void ws_unlink_member(struct client *cl)
{
	struct waitset *ws = cl->ws;

	if (cl->ws_prev)
		cl->ws_prev->ws_next = cl->ws_next;
	else
		ws->members = cl->ws_next;
	if (cl->ws_next)
		cl->ws_next->ws_prev = cl->ws_prev;
	cl->ws = NULL;
	cl->ws_prev = cl->ws_next = NULL;
}

static void ws_unlink(struct waitset *ws)
{
	struct store_proxy *px = ws->px;

	if (ws->prev)
		ws->prev->next = ws->next;
	else
		px->sets = ws->next;
	if (ws->next)
		ws->next->prev = ws->prev;
	ws->prev = ws->next = NULL;
}

static void ws_free(struct waitset *ws)
{
	if (!ws->releasing)
		ws_unlink(ws);
	free(ws->keys);
	free(ws);
}

/* The client's wait is over (answered, canceled, or the client leaves). A
 * set left without members closes its connection: the store drops the
 * registration with it. */
static void client_end_wait(struct client *cl)
{
	struct waitset *ws = cl->ws;

	cl->waiting = false;
	cl->wait_gen++;
	free(cl->wkeys);
	cl->wkeys = NULL;
	if (!ws)
		return;
	ws_unlink_member(cl);
	if (!ws->members && !ws->releasing) {
		if (ws->up) {
			ws->up->ws = NULL;
			up_free(ws->up);
		}
		ws_free(ws);
	}
}

static struct waitset *ws_find(struct store_proxy *px, const uint8_t *keys, size_t len)
{
	for (struct waitset *ws = px->sets; ws; ws = ws->next)
		if (ws->keys_len == len && memcmp(ws->keys, keys, len) == 0)
			return ws;
	return NULL;
}

static int up_open(struct store_proxy *px, enum up_kind kind, struct up **ret);

/* Adds cl (waiting, keys in cl->wkeys) to its key list's set, sending the
 * set's WAIT when it is new. */
static int ws_join(struct client *cl)
{
	struct store_proxy *px = cl->px;
	struct waitset *ws = ws_find(px, cl->wkeys, cl->wkeys_len);
	struct up *u;
	uint8_t code;
	int r;

	if (!ws) {
		ws = calloc(1, sizeof(*ws));
		if (!ws)
			return CRUN_ENOMEM;
		ws->px = px;
		ws->keys = mem_dup(cl->wkeys, cl->wkeys_len);
		if (!ws->keys) {
			free(ws);
			return CRUN_ENOMEM;
		}
		ws->keys_len = cl->wkeys_len;
		ws->nitems = cl->wnitems;
		if (px->idle) {
			u = px->idle;
			px->idle = u->next;
			px->n_idle--;
			u->next = NULL;
		} else {
			r = up_open(px, UP_WAIT, &u);
			if (r < 0) {
				free(ws->keys);
				free(ws);
				return r;
			}
		}
		ws->up = u;
		u->ws = ws;
		ws->next = px->sets;
		if (px->sets)
			px->sets->prev = ws;
		px->sets = ws;
		code = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_WAIT);
		if (evbuffer_add(bufferevent_get_output(u->bev), &code, 1) < 0 ||
		    evbuffer_add(bufferevent_get_output(u->bev), ws->keys, ws->keys_len) < 0) {
			u->ws = NULL;
			ws->up = NULL;
			up_free(u);
			ws_free(ws);
			return CRUN_ENOMEM;
		}
		px->st.upstream_waits++;
	}
	cl->ws = ws;
	cl->ws_prev = NULL;
	cl->ws_next = ws->members;
	if (ws->members)
		ws->members->ws_prev = cl;
	ws->members = cl;
	return 0;
}

/* The set's WAIT was answered: every member stops waiting. The connection
 * goes back to the pool. */
static void ws_release(struct waitset *ws)
{
	struct store_proxy *px = ws->px;
	struct up *u = ws->up;

	/* Members answered here may wait again at once, on the same keys:
	 * that must make a new set, not join this finished one. */
	ws_unlink(ws);
	ws->releasing = true;
	ws->up = NULL;
	u->ws = NULL;
	if (px->n_idle < IDLE_WAIT_CONNS) {
		u->next = px->idle;
		px->idle = u;
		px->n_idle++;
	} else {
		up_free(u);
	}
	while (ws->members) {
		struct client *cl = ws->members;

		ws_unlink_member(cl);
		cl->waiting = false;
		cl->wait_gen++;
		free(cl->wkeys);
		cl->wkeys = NULL;
		if (out_u8(cl, STORE_WAIT_STOP_WAITING) < 0)
			client_close(cl);
		else
			client_process(cl);
	}
	ws_free(ws);
}

/* ---- upstream connections --------------------------------------------------- */

static void up_free(struct up *u)
{
	if (!u)
		return;
	if (u->bev)
		bufferevent_free(u->bev);
	u->px->st.upstream_conns--;
	free(u);
}

/* Reads the PING echo of the handshake; 0 when done, EAGAIN for more. */
static int up_handshake(struct up *u, struct evbuffer *in)
{
	uint8_t b[4];

	if (!u->hs_left)
		return 0;
	if (evbuffer_get_length(in) < 4)
		return CRUN_EAGAIN;
	evbuffer_remove(in, b, 4);
	u->hs_left = 0;
	return store_get_u32(b) == HS_NONCE ? 0 : CRUN_EPROTO;
}

/* One reply of the shared connection, for the ring's head. */
static int main_reply(struct store_proxy *px, struct evbuffer *in)
{
	size_t len = evbuffer_get_length(in);
	struct pend p = px->ring[px->ring_head];
	struct store_reply rep;
	const uint8_t *buf;
	size_t used;
	int r;

	buf = evbuffer_pullup(in, (ev_ssize_t)len);
	r = store_proto_decode_reply((enum store_op)p.op, p.nitems, &px->cfg.limits, buf, len,
				     &rep, &used);
	if (r < 0)
		return r;
	px->ring_head = (px->ring_head + 1) % px->ring_cap;
	px->ring_len--;
	if (p.cl) {
		struct client *cl = p.cl;

		cl->busy = false;
		cl->unconfirmed = false;
		if (p.kind == PEND_REPLY) {
			r = evbuffer_add(bufferevent_get_output(cl->bev), buf, used);
		} else if (p.gen != cl->wait_gen) {
			r = 0; /* canceled meanwhile */
		} else if (rep.status == STORE_CHECK_READY) {
			px->st.waits_ready++;
			client_end_wait(cl);
			r = out_u8(cl, STORE_WAIT_STOP_WAITING);
		} else {
			r = ws_join(cl);
		}
		evbuffer_drain(in, used);
		if (r < 0)
			client_close(cl);
		else
			client_process(cl);
		return 0;
	}
	evbuffer_drain(in, used);
	return 0;
}

static void up_on_read(struct bufferevent *bev, void *arg)
{
	struct up *u = arg;
	struct store_proxy *px = u->px;
	struct evbuffer *in = bufferevent_get_input(bev);
	int r;

	if (u->kind == UP_PASS) {
		struct client *cl = u->cl;
		struct evbuffer *out = bufferevent_get_output(cl->bev);

		if (evbuffer_add_buffer(out, in) < 0) {
			client_close(cl);
			return;
		}
		if (evbuffer_get_length(out) >= PASS_HIGH)
			bufferevent_disable(bev, EV_READ); /* resumed by cl's write cb */
		return;
	}
	r = up_handshake(u, in);
	if (r == CRUN_EAGAIN)
		return;
	if (r < 0)
		goto fail;
	if (u->kind == UP_WAIT) {
		uint8_t b;

		if (evbuffer_get_length(in) == 0)
			return;
		if (!u->ws || evbuffer_get_length(in) != 1)
			goto fail; /* nothing was asked: the stream is out of step */
		evbuffer_remove(in, &b, 1);
		if (b != STORE_WAIT_STOP_WAITING)
			goto fail;
		ws_release(u->ws);
		return;
	}
	while (evbuffer_get_length(in) > 0 && !px->failed) {
		if (px->ring_len == 0)
			goto fail;
		r = main_reply(px, in);
		if (r == CRUN_EAGAIN)
			return;
		if (r < 0)
			goto fail;
	}
	return;
fail:
	log_at(LL_DEBUG, SUB_STORE, "store proxy: upstream reply out of step");
	proxy_fail(px);
}

static void up_on_event(struct bufferevent *bev, short what, void *arg)
{
	struct up *u = arg;

	(void)bev;
	if (what & BEV_EVENT_CONNECTED)
		return;
	if (u->kind == UP_PASS) {
		struct client *cl = u->cl;

		/* The store closed this client's own connection: pass on what it
		 * said, then close the client, as a direct connection would be. */
		(void)evbuffer_add_buffer(bufferevent_get_output(cl->bev),
					  bufferevent_get_input(u->bev));
		client_close(cl);
		return;
	}
	log_at(LL_DEBUG, SUB_STORE, "store proxy: upstream connection lost");
	proxy_fail(u->px);
}

static void up_on_write(struct bufferevent *bev, void *arg)
{
	struct up *u = arg;

	/* A passthrough client paused on our output: read it again. */
	if (u->kind == UP_PASS && u->cl)
		bufferevent_enable(u->cl->bev, EV_READ);
}

/* Opens an upstream connection; MAIN and WAIT send VALIDATE and PING (the
 * echo is checked before anything else is read). */
static int up_open(struct store_proxy *px, enum up_kind kind, struct up **ret)
{
	struct up *u = calloc(1, sizeof(*u));
	uint8_t hs[10], *p = hs;
	int fd, r = CRUN_ENOMEM;

	if (!u)
		return CRUN_ENOMEM;
	u->px = px;
	u->kind = kind;
	px->st.upstream_conns++;
	/* Our own socket: libevent's would not be close-on-exec. */
	fd = socket(px->up_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		goto fail;
	}
	sock_nodelay(fd);
	u->bev = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!u->bev) {
		close(fd);
		goto fail;
	}
	bufferevent_setcb(u->bev, up_on_read, up_on_write, up_on_event, u);
	if (kind != UP_PASS) {
		*p++ = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_VALIDATE);
		p = store_put_u32(p, STORE_VALIDATE_MAGIC);
		*p++ = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_PING);
		p = store_put_u32(p, HS_NONCE);
		u->hs_left = 4;
		if (evbuffer_add(bufferevent_get_output(u->bev), hs, (size_t)(p - hs)) < 0)
			goto fail;
	}
	if (bufferevent_socket_connect(u->bev, (struct sockaddr *)&px->up_addr,
				       (int)px->up_addr_len) < 0)
		goto fail;
	if (bufferevent_enable(u->bev, EV_READ | EV_WRITE) < 0)
		goto fail;
	*ret = u;
	return 0;
fail:
	up_free(u);
	return r;
}

/* Every local client and the listener go; the proxy stays allocated. */
static void proxy_fail(struct store_proxy *px)
{
	if (px->failed)
		return;
	px->failed = true;
	if (px->lsn) {
		evconnlistener_free(px->lsn);
		px->lsn = NULL;
	}
	while (px->clients)
		client_close(px->clients);
	while (px->idle) {
		struct up *u = px->idle;

		px->idle = u->next;
		up_free(u);
	}
	px->n_idle = 0;
	up_free(px->main);
	px->main = NULL;
	px->ring_len = 0;
	if (px->cfg.on_fail)
		px->cfg.on_fail(px->cfg.arg);
}

/* ---- local clients ------------------------------------------------------------- */

static void client_close(struct client *cl)
{
	struct store_proxy *px = cl->px;

	if (cl->waiting)
		client_end_wait(cl);
	for (size_t i = 0; i < px->ring_len; i++) {
		struct pend *p = &px->ring[(px->ring_head + i) % px->ring_cap];

		if (p->cl == cl)
			p->cl = NULL;
	}
	if (cl->pass) {
		cl->pass->cl = NULL;
		up_free(cl->pass);
	}
	if (cl->prev)
		cl->prev->next = cl->next;
	else
		px->clients = cl->next;
	if (cl->next)
		cl->next->prev = cl->prev;
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

	TRY(up_open(px, UP_PASS, &u));
	u->cl = cl;
	cl->pass = u;
	px->st.passthrough++;
	if (cl->d == STORE_V2) {
		v[0] = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_VALIDATE);
		store_put_u32(v + 1, STORE_VALIDATE_MAGIC);
		if (evbuffer_add(bufferevent_get_output(u->bev), v, 5) < 0)
			return CRUN_ENOMEM;
	}
	/* No frame limit any more: the store applies its own. */
	bufferevent_setwatermark(cl->bev, EV_READ, 0, 0);
	return 0;
}

static int client_wait(struct client *cl, const struct store_req *q, const uint8_t *raw,
		       size_t used)
{
	struct store_proxy *px = cl->px;
	struct pend p = {.cl = cl, .op = STORE_OP_CHECK, .kind = PEND_CHECK, .nitems = q->nitems};

	px->st.waits++;
	if (cl->waiting) /* v1: a second WAIT replaces the first (torch's count) */
		client_end_wait(cl);
	cl->wkeys = mem_dup(raw + 1, used - 1);
	if (!cl->wkeys)
		return CRUN_ENOMEM;
	cl->wkeys_len = used - 1;
	cl->wnitems = q->nitems;
	cl->waiting = true;
	/* Nothing of this client unconfirmed upstream and its set pending:
	 * join without the CHECK round trip (file comment). */
	if (!cl->unconfirmed && ws_find(px, cl->wkeys, cl->wkeys_len))
		return ws_join(cl);
	p.gen = cl->wait_gen;
	TRY(up_send(px->main, STORE_OP_CHECK, raw, used));
	TRY(pend_push(px, &p));
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
		return evbuffer_add(bufferevent_get_output(cl->bev), b, 4) < 0 ? CRUN_ENOMEM : 0;
	case PROXY_FIFO_NOREPLY:
		px->st.requests++;
		cl->unconfirmed = true;
		return up_send(px->main, q->op, raw, used);
	case PROXY_FIFO:
		px->st.requests++;
		TRY(up_send(px->main, q->op, raw, used));
		TRY(pend_push(px, &p));
		cl->busy = true;
		return 0;
	case PROXY_WAIT:
		return client_wait(cl, q, raw, used);
	case PROXY_CANCEL:
		px->st.local_replies++;
		if (cl->waiting)
			client_end_wait(cl);
		return out_u8(cl, STORE_WAIT_CANCELED);
	case PROXY_PASS:
	default:
		return CRUN_EAGAIN; /* the caller moves the client */
	}
}

/* Decodes and acts on the client's requests while it may have one more. */
static void client_process(struct client *cl)
{
	struct store_proxy *px = cl->px;
	struct evbuffer *in = bufferevent_get_input(cl->bev);

	while (!cl->pass && !cl->busy) {
		size_t len = evbuffer_get_length(in), used;
		const uint8_t *p;
		struct store_req q;
		int r, op;

		if (len == 0)
			return;
		if (evbuffer_get_length(bufferevent_get_output(cl->bev)) >
		    px->cfg.max_client_out_bytes) {
			cl->out_blocked = true; /* resumed by the write callback */
			return;
		}
		p = evbuffer_pullup(in, (ev_ssize_t)len);
		if (!cl->sniffed) {
			size_t eaten;

			r = store_proto_sniff(p, len, &cl->d, &eaten);
			if (r == CRUN_EAGAIN)
				return;
			cl->sniffed = true;
			evbuffer_drain(in, eaten);
			continue;
		}
		op = store_proto_op_from_code(cl->d, p[0]);
		/* A parked v2 client: only a CANCEL_WAIT is read (as the server). */
		if (cl->waiting && cl->d == STORE_V2 && op != STORE_OP_CANCEL_WAIT)
			return;
		if (store_proxy_route(cl->d, op) == PROXY_PASS) {
			if (client_to_pass(cl) < 0)
				goto close;
			break;
		}
		r = store_proto_decode_req_from(cl->d, &px->cfg.limits, &cl->dec, p, len, &q, &used);
		if (r == CRUN_EAGAIN)
			return;
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
		if (evbuffer_get_length(out) >= PASS_HIGH)
			bufferevent_disable(cl->bev, EV_READ); /* resumed by up_on_write */
	}
	return;
close:
	client_close(cl);
}

static void client_on_read(struct bufferevent *bev, void *arg)
{
	(void)bev;
	client_process(arg);
}

static void client_on_write(struct bufferevent *bev, void *arg)
{
	struct client *cl = arg;

	if (cl->pass) {
		bufferevent_enable(cl->pass->bev, EV_READ);
		return;
	}
	if (cl->out_blocked) {
		cl->out_blocked = false;
		client_process(cl);
	}
}

static void client_on_event(struct bufferevent *bev, short what, void *arg)
{
	(void)bev;
	(void)what;
	client_close(arg); /* EOF or error: as the store drops a direct one */
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
	const struct store_limits *lim = &px->cfg.limits;
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
	cl->bev = bufferevent_socket_new(px->base, fd, BEV_OPT_CLOSE_ON_FREE);
	if (!cl->bev) {
		close(fd);
		free(cl);
		return;
	}
	sock_nodelay(fd);
	/* One legal frame at most (a MULTI_SET of max_items pairs aside, which
	 * the codec bounds by max_items * (key + value) anyway). */
	bufferevent_setwatermark(cl->bev, EV_READ, 0,
				 1 + 3 * 8 + lim->max_key_bytes + 2 * lim->max_value_bytes);
	bufferevent_setcb(cl->bev, client_on_read, client_on_write, client_on_event, cl);
	cl->next = px->clients;
	if (px->clients)
		px->clients->prev = cl;
	px->clients = cl;
	px->st.clients++;
	px->st.accepted++;
	if (bufferevent_enable(cl->bev, EV_READ | EV_WRITE) < 0)
		client_close(cl);
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
	const char *host = px->cfg.listen_host && *px->cfg.listen_host ? px->cfg.listen_host
									: "127.0.0.1";
	struct sockaddr_storage ss;
	socklen_t len;
	int fd, one = 1, r;

	TRY(resolve(host, px->cfg.listen_port, 1, &ss, &len));
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
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
	px->ring_cap = (size_t)px->cfg.max_clients + 1;
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
	r = up_open(px, UP_MAIN, &px->main);
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
	px->cfg.on_fail = NULL;
	if (px->lsn)
		evconnlistener_free(px->lsn);
	px->lsn = NULL;
	while (px->clients)
		client_close(px->clients);
	while (px->idle) {
		struct up *u = px->idle;

		px->idle = u->next;
		up_free(u);
	}
	up_free(px->main);
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
