/* proxy_up.c: the store proxy's upstream side: connections to the real
 * store, the shared connection's reply ring and the wait sets (design:
 * proxy.c's header comment).
 */
#include <errno.h>
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
#include "store/proxy/proxy_int.h"
#include "store/store_ext.h"

/* ---- small helpers ---------------------------------------------------------- */

void proxy_nodelay(evutil_socket_t fd)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* A reply goes out with one send() when nothing is queued before it: the
 * bufferevent would add and then remove its write event for every reply
 * (two epoll_ctl calls each, the largest cost of the proxy in strace -c).
 * What the socket does not take, or any error (the read side sees it),
 * leaves through the bufferevent as before. */
int proxy_client_send(struct client *cl, const void *data, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(cl->bev);
	const uint8_t *p = data;

	if (evbuffer_get_length(out) == 0 && !cl->pass) {
		ssize_t n = send(bufferevent_getfd(cl->bev), p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
		}
	}
	if (len == 0)
		return 0;
	return evbuffer_add(out, p, len) < 0 ? CRUN_ENOMEM : 0;
}

int proxy_out_u8(struct client *cl, uint8_t b)
{
	return proxy_client_send(cl, &b, 1);
}

/* Forwards one decoded request (raw[0..len)) upstream as op `op` in v2. */
int proxy_up_send(struct up *u, enum store_op op, const uint8_t *raw, size_t len)
{
	struct evbuffer *out = bufferevent_get_output(u->bev);
	uint8_t code = (uint8_t)store_proto_opcode(STORE_V2, op);

	if (evbuffer_add(out, &code, 1) < 0 || evbuffer_add(out, raw + 1, len - 1) < 0)
		return CRUN_ENOMEM;
	return 0;
}

int proxy_pend_push(struct store_proxy *px, const struct pend *p)
{
	if (px->ring_len == px->ring_cap)
		return CRUN_ENOSPC; /* clients that left still owe replies: refuse */
	px->ring[(px->ring_head + px->ring_len) % px->ring_cap] = *p;
	px->ring_len++;
	return 0;
}

/* ---- wait sets ---------------------------------------------------------------- */

static void ws_unlink_member(struct client *cl)
{
	dl_del(&cl->ws_link);
	cl->ws = NULL;
}

static void ws_free(struct waitset *ws)
{
	if (ws->tag)
		ws->px->n_tagged--;
	dl_del(&ws->link); /* a no-op once ws_release took it off */
	free(ws->keys);
	free(ws);
}

/* A tagged-wait op on the muxed main connection: op, u64 tag, then rest
 * (WAIT_TAG: the key list as the client sent it). */
static int send_tag_op(struct store_proxy *px, uint8_t op, uint64_t tag, const uint8_t *rest,
		       size_t rest_len)
{
	struct evbuffer *out = bufferevent_get_output(px->main->bev);
	uint8_t b[9];

	b[0] = op;
	store_put_u64(b + 1, tag);
	if (evbuffer_add(out, b, sizeof(b)) < 0 ||
	    (rest_len && evbuffer_add(out, rest, rest_len) < 0))
		return CRUN_ENOMEM;
	return 0;
}

/* The client's wait is over (answered, canceled, or the client leaves). A
 * set left without members cancels its WAIT_TAG, or closes its connection: the store drops the
 * registration with it. */
void proxy_end_wait(struct client *cl)
{
	struct waitset *ws = cl->ws;

	cl->waiting = false;
	cl->wait_gen++;
	free(cl->wkeys);
	cl->wkeys = NULL;
	if (!ws)
		return;
	ws_unlink_member(cl);
	if (DL_EMPTY(&ws->members) && !ws->releasing) {
		if (ws->up) {
			ws->up->ws = NULL;
			proxy_up_free(ws->up);
		} else if (cl->px->mux && cl->px->main) {
			/* Its WAKE may cross this: ws_wake ignores an old tag. */
			(void)send_tag_op(cl->px, STORE_EXT_WAIT_TAG_CANCEL, ws->tag, NULL, 0);
		}
		ws_free(ws);
	}
}

struct waitset *proxy_ws_find(struct store_proxy *px, const uint8_t *keys, size_t len)
{
	for (struct dl *n = px->sets.next; n != &px->sets; n = n->next) {
		struct waitset *ws = DL_ENTRY(n, struct waitset, link);

		if (ws->keys_len == len && memcmp(ws->keys, keys, len) == 0)
			return ws;
	}
	return NULL;
}

/* Adds cl (waiting, keys in cl->wkeys) to its key list's set, sending the
 * set's WAIT when it is new. */
int proxy_ws_join(struct client *cl)
{
	struct store_proxy *px = cl->px;
	struct waitset *ws = proxy_ws_find(px, cl->wkeys, cl->wkeys_len);
	struct up *u;
	uint8_t code;
	int r;

	if (!ws) {
		ws = calloc(1, sizeof(*ws));
		if (!ws)
			return CRUN_ENOMEM;
		ws->px = px;
		DL_INIT(&ws->link);
		DL_INIT(&ws->members);
		ws->keys = mem_dup(cl->wkeys, cl->wkeys_len);
		if (!ws->keys) {
			free(ws);
			return CRUN_ENOMEM;
		}
		ws->keys_len = cl->wkeys_len;
		ws->nitems = cl->wnitems;
		if (px->mux) {
			/* One upstream connection: the wait is tagged on it. The
			 * store closes it past its bound: refuse this client. */
			if (px->n_tagged >= STORE_EXT_MUX_MAX_WAITS) {
				free(ws->keys);
				free(ws);
				return CRUN_ENOSPC;
			}
			ws->tag = ++px->last_tag;
			px->n_tagged++;
			r = send_tag_op(px, STORE_EXT_WAIT_TAG, ws->tag, ws->keys, ws->keys_len);
			if (r < 0) {
				ws_free(ws);
				return r;
			}
			dl_add_tail(&px->sets, &ws->link);
			px->st.upstream_waits++;
			goto join;
		}
		if (px->idle) {
			u = px->idle;
			px->idle = u->next;
			px->n_idle--;
			u->next = NULL;
		} else {
			r = proxy_up_open(px, UP_WAIT, &u);
			if (r < 0) {
				free(ws->keys);
				free(ws);
				return r;
			}
		}
		ws->up = u;
		u->ws = ws;
		dl_add_tail(&px->sets, &ws->link);
		code = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_WAIT);
		if (evbuffer_add(bufferevent_get_output(u->bev), &code, 1) < 0 ||
		    evbuffer_add(bufferevent_get_output(u->bev), ws->keys, ws->keys_len) < 0) {
			u->ws = NULL;
			ws->up = NULL;
			proxy_up_free(u);
			ws_free(ws);
			return CRUN_ENOMEM;
		}
		px->st.upstream_waits++;
	}
join:
	cl->ws = ws;
	dl_add_tail(&ws->members, &cl->ws_link);
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
	dl_del(&ws->link);
	ws->releasing = true;
	ws->up = NULL;
	if (!u) {
		/* muxed: nothing to give back */
	} else if (px->n_idle < IDLE_WAIT_CONNS) {
		u->ws = NULL;
		u->next = px->idle;
		px->idle = u;
		px->n_idle++;
	} else {
		u->ws = NULL;
		proxy_up_free(u);
	}
	while (!DL_EMPTY(&ws->members)) {
		struct client *cl = DL_ENTRY(ws->members.next, struct client, ws_link);

		ws_unlink_member(cl);
		cl->waiting = false;
		cl->wait_gen++;
		free(cl->wkeys);
		cl->wkeys = NULL;
		if (proxy_out_u8(cl, STORE_WAIT_STOP_WAITING) < 0)
			proxy_client_close(cl);
		else
			proxy_client_process(cl);
	}
	ws_free(ws);
}

/* A WAKE frame on the muxed connection: its set is released. A tag of a set
 * that was canceled meanwhile is dropped; one never sent is out of step. */
static int ws_wake(struct store_proxy *px, uint64_t tag)
{
	for (struct dl *n = px->sets.next; n != &px->sets; n = n->next) {
		struct waitset *ws = DL_ENTRY(n, struct waitset, link);

		if (ws->tag == tag) {
			ws_release(ws);
			return 0;
		}
	}
	return tag && tag <= px->last_tag ? 0 : CRUN_EPROTO;
}

/* ---- upstream connections --------------------------------------------------- */

void proxy_up_free(struct up *u)
{
	if (!u)
		return;
	if (u->bev)
		bufferevent_free(u->bev);
	u->px->st.upstream_conns--;
	free(u);
}

/* The main connection's handshake is done: MUX when the store offers it
 * (one upstream connection), then the clients held until now are served. */
static void main_ready(struct store_proxy *px, uint32_t version)
{
	struct dl *n, *next;

	if (version >= STORE_EXT_VERSION_MUX) {
		uint8_t op = STORE_EXT_MUX;

		if (evbuffer_add(bufferevent_get_output(px->main->bev), &op, 1) < 0) {
			proxy_fail(px);
			return;
		}
		px->mux = true;
	}
	px->ready = true;
	for (n = px->clients.next; n != &px->clients && !px->failed; n = next) {
		next = n->next; /* processing may close this client, no other */
		proxy_client_process(DL_ENTRY(n, struct client, link));
	}
}

/* Reads the handshake's answers: the PING echo, and for MAIN HELLO's
 * version; 0 when done, EAGAIN for more. */
static int up_handshake(struct up *u, struct evbuffer *in)
{
	uint8_t b[8];
	size_t need = u->hs_left;

	if (!need)
		return 0;
	if (evbuffer_get_length(in) < need)
		return CRUN_EAGAIN;
	evbuffer_remove(in, b, need);
	u->hs_left = 0;
	if (store_get_u32(b) != HS_NONCE)
		return CRUN_EPROTO;
	if (u->kind == UP_MAIN)
		main_ready(u->px, store_get_u32(b + 4));
	return 0;
}

/* One reply of the shared connection, for the ring's head, after `skip`
 * bytes (muxed: the REPLY frame's kind). */
static int main_reply(struct store_proxy *px, struct evbuffer *in, size_t skip)
{
	size_t len = evbuffer_get_length(in);
	struct pend p = px->ring[px->ring_head];
	struct store_reply rep;
	const uint8_t *buf;
	size_t used;
	int r;

	buf = evbuffer_pullup(in, (ev_ssize_t)len);
	if (!buf)
		return CRUN_ENOMEM;
	r = store_proto_decode_reply((enum store_op)p.op, p.nitems, &px->cfg.limits, buf + skip,
				     len - skip, &rep, &used);
	if (r < 0)
		return r;
	evbuffer_drain(in, skip);
	buf = evbuffer_pullup(in, (ev_ssize_t)used);
	if (!buf)
		return CRUN_ENOMEM;
	px->ring_head = (px->ring_head + 1) % px->ring_cap;
	px->ring_len--;
	if (p.cl) {
		struct client *cl = p.cl;

		cl->busy = false;
		cl->unconfirmed = false;
		if (p.kind == PEND_REPLY) {
			r = proxy_client_send(cl, buf, used);
		} else if (p.gen != cl->wait_gen) {
			r = 0; /* canceled meanwhile */
		} else if (rep.status == STORE_CHECK_READY) {
			px->st.waits_ready++;
			proxy_end_wait(cl);
			r = proxy_out_u8(cl, STORE_WAIT_STOP_WAITING);
		} else {
			r = proxy_ws_join(cl);
		}
		evbuffer_drain(in, used);
		if (r < 0)
			proxy_client_close(cl);
		else
			proxy_client_process(cl);
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
			proxy_client_close(cl);
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
	/* px->failed first: a failure frees this connection and its buffer. */
	while (!px->failed && evbuffer_get_length(in) > 0) {
		size_t skip = 0;

		if (px->mux) {
			size_t len = MIN(evbuffer_get_length(in), STORE_EXT_FRAME_WAKE_LEN);
			const uint8_t *h = evbuffer_pullup(in, (ev_ssize_t)len);
			uint8_t kind;
			uint64_t tag = 0;

			if (!h)
				goto fail;
			r = store_ext_frame_decode(h, len, &kind, &tag, &skip);
			if (r == CRUN_EAGAIN)
				return;
			if (r < 0)
				goto fail;
			if (kind == STORE_EXT_FRAME_WAKE) {
				evbuffer_drain(in, skip);
				if (ws_wake(px, tag) < 0)
					goto fail;
				continue;
			}
		}
		if (px->ring_len == 0)
			goto fail;
		r = main_reply(px, in, skip);
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
		proxy_client_close(cl);
		return;
	}
	log_at(LL_DEBUG, SUB_STORE, "store proxy: upstream connection lost");
	proxy_fail(u->px);
}

static void up_on_write(struct bufferevent *bev, void *arg)
{
	struct up *u = arg;

	/* A passthrough client paused on our output: read it again. */
	if (u->kind == UP_PASS && u->cl) {
		u->cl->relay_full = false;
		proxy_client_sync_read(u->cl);
	}
}

/* Opens an upstream connection; MAIN and WAIT send VALIDATE and PING (the
 * echo is checked before anything else is read). */
int proxy_up_open(struct store_proxy *px, enum up_kind kind, struct up **ret)
{
	struct up *u = calloc(1, sizeof(*u));
	uint8_t hs[19], *p = hs;
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
	proxy_nodelay(fd);
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
		if (kind == UP_MAIN) { /* which extension version: MUX or not */
			*p++ = STORE_EXT_HELLO;
			p = store_put_u32(p, STORE_EXT_MAGIC);
			p = store_put_u32(p, STORE_EXT_VERSION);
			u->hs_left = 8;
		}
		if (evbuffer_add(bufferevent_get_output(u->bev), hs, (size_t)(p - hs)) < 0)
			goto fail;
	}
	if (bufferevent_socket_connect(u->bev, (struct sockaddr *)&px->up_addr,
				       (int)px->up_addr_len) < 0) {
		/* e.g. EADDRNOTAVAIL: no local port left, not a lack of memory */
		r = errno ? -errno : CRUN_EIO;
		goto fail;
	}
	if (bufferevent_enable(u->bev, EV_READ | EV_WRITE) < 0)
		goto fail;
	*ret = u;
	return 0;
fail:
	proxy_up_free(u);
	return r;
}

/* Closes the listener, every local client and every upstream connection
 * (proxy_fail, store_proxy_free). */
void proxy_close_all(struct store_proxy *px)
{
	if (px->lsn) {
		evconnlistener_free(px->lsn);
		px->lsn = NULL;
	}
	while (!DL_EMPTY(&px->clients))
		proxy_client_close(DL_ENTRY(px->clients.next, struct client, link));
	while (px->idle) {
		struct up *u = px->idle;

		px->idle = u->next;
		proxy_up_free(u);
	}
	px->n_idle = 0;
	proxy_up_free(px->main);
	px->main = NULL;
	px->ring_len = 0;
}

/* Every local client and the listener go; the proxy stays allocated. */
void proxy_fail(struct store_proxy *px)
{
	if (px->failed)
		return;
	px->failed = true;
	proxy_close_all(px);
	if (px->cfg.on_fail)
		px->cfg.on_fail(px->cfg.arg);
}
