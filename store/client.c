/* client.c: the blocking TCPStore client behind include/crun/store.h. It
 * speaks both dialects through the pure codec in proto.c, one request at a
 * time, over a socket with poll() deadlines. The agent, the rendezvous and the
 * worker SDK call it from their own threads; it never touches an event loop.
 *
 * Reconnecting. A TCPStore stream has no framing to resynchronise on, so a
 * failed exchange always drops its socket; what follows happens on a new one
 * (which is also why a v1 connection cannot desync: a late reply can only
 * arrive on the socket that was closed). Within reconnect_ms, with jittered
 * exponential backoff, the client dials again, redoes the dialect's
 * greeting (v2 VALIDATE + PING), HELLO if the extension was in use, and
 * LEASE_ATTACH for every lease the handle holds, so a reset within a lease's
 * TTL is not a node failure. Then:
 *   - an op whose request may have been applied is sent again only if
 *     applying it twice gives the same state and the same answer (the
 *     retry_safe table); any other (ADD, APPEND, DELETE_KEY, QUEUE_*,
 *     BARRIER, LEASE_GRANT) fails with the transport error and a message
 *     saying it may or may not have been applied; the next call reconnects;
 *   - writes without a reply (SET, MULTI_SET, APPEND, QUEUE_PUSH) are
 *     confirmed only by the next reply on the stream; until then SET and
 *     MULTI_SET are kept (up to UNACKED_MAX bytes) and replayed first on the
 *     new connection; an unconfirmed APPEND or QUEUE_PUSH, or a bigger write,
 *     cannot be replayed, and the call that finds the reset fails saying so.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/store.h"
#include "store/store_ext.h"
#include "store/tls.h"

#define NO_DEADLINE UINT64_MAX
#define RBUF_MIN    4096
#define RBUF_KEEP   (256u * 1024) /* a bigger read buffer is freed after the op */
/* Ceiling on one buffered reply (MULTI_GET of many big values included); a
 * reply that needs more is treated as a protocol error, like an over-limit
 * length field, so a bad peer cannot make us allocate without bound. */
#define REPLY_MAX ((size_t)1 << 30)
/* How long we wait for WAIT_CANCELED after CANCEL_WAIT. PyTorch waits without
 * a bound; we bound it and mark the connection broken if it passes. */
#define CANCEL_REPLY_MS	 30000
#define BACKOFF_START_MS 50
#define BACKOFF_CAP_MS	 2000
/* Unconfirmed writes kept for replay after a reconnect (see the top). */
#define UNACKED_MAX (256u * 1024)
/* Sends of one op, the first included, across reconnects. */
#define SEND_TRIES 3
/* A server that closed the connection in order and then refuses to be
 * dialed has exited: give it this long to come back (a supervised restart)
 * rather than the whole reconnect_ms, so a dead store host is reported
 * within a lease TTL. */
#define GONE_MS 1000

struct client_conn {
	unsigned refs; /* the base handle plus each open view */
	int fd;
	enum store_dialect dialect;
	bool broken;
	uint32_t timeout_ms; /* default per op; 0 = no deadline */
	struct store_limits lim;
	char peer[300];	 /* "host:port" for messages */
	char err[640];	 /* last_error of the base and of every view */
	char broke[400]; /* the failure that broke the connection, for later calls */
	/* The text of the server's last ERROR reply (store_ext.h, version 6):
	 * a write refused because a budget or a share of one was full. */
	char full[STORE_EXT_ERROR_TEXT_MAX + 1];
	int broke_r; /* and its code */
	/* Buffered reader: bytes [rpos, rlen) of rbuf are received, unparsed. */
	uint8_t *rbuf;
	size_t rcap, rpos, rlen;
	uint8_t *wbuf; /* one whole request, sent with one send() */
	size_t wcap;
	char *kbuf; /* mangled keys of the current request, back to back */
	size_t kcap;
	struct store_bytes *kv; /* views into kbuf */
	size_t kvcap;
	uint64_t rng;
	bool ext; /* HELLO answered on this socket: extension ops allowed */
	/* Reconnecting (see the top of the file). */
	char *host; /* owned, for dialing again */
	uint16_t port;
	uint32_t reconnect_ms; /* 0: a lost connection stays lost */
	bool ext_used;	       /* HELLO was sent once: send it after a reconnect */
	uint32_t ext_version;  /* the server's answer to HELLO */
	uint64_t *leases;      /* ids this handle holds, re-attached after a reconnect */
	size_t nleases, lcap;
	uint8_t *unacked; /* encoded SET/MULTI_SET sent since the last reply */
	size_t ulen, ucap;
	const char *lossy; /* an unconfirmed write that cannot be replayed, or NULL */
	bool replayed;	   /* unacked was replayed once: a second loss drops it */
	struct store_auth_secret *secret;    /* NULL: no authentication (auth.h) */
	char *auth_job;			     /* the run id we speak for */
	struct store_tls *tls_ctx;	     /* NULL: plaintext (store/tls.h) */
	struct store_tls_conn *tls;	     /* the live connection's TLS, or NULL */
	const struct store_dial_report *rep; /* while crun_store_open dials; else NULL */
};

struct crun_store {
	struct client_conn *conn;
	/* Wire prefix: "/" (TCPStore) then "p/" per PrefixStore layer. */
	char *pfx;
	size_t pfx_len;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem);

/* ---- errors ---------------------------------------------------------------- */

/* Writes key bytes printable into out, shortened with "..." when long. */
static void key_desc(const void *key, size_t len, char *out, size_t cap)
{
	const uint8_t *k = key;
	size_t o = 0;

	for (size_t i = 0; i < len && o + 8 < cap; i++) {
		if (o + 12 >= cap || i >= 96) {
			memcpy(out + o, "...", 3);
			o += 3;
			break;
		}
		if (k[i] >= 0x20 && k[i] < 0x7f && k[i] != '\\') {
			out[o++] = (char)k[i];
		} else {
			static const char hex[] = "0123456789abcdef";

			out[o++] = '\\';
			out[o++] = 'x';
			out[o++] = hex[k[i] >> 4];
			out[o++] = hex[k[i] & 15];
		}
	}
	out[o] = '\0';
}

/* Records "OP key 'K' on HOST:PORT: cause" as the handle's last error and
 * returns r. `key` may be NULL for ops without one. */
__attribute__((format(printf, 6, 7))) static int set_err(struct client_conn *c, int r,
							 const char *op, const void *key,
							 size_t key_len, const char *fmt, ...)
{
	char kd[128] = "";
	char cause[384];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(cause, sizeof(cause), fmt, ap);
	va_end(ap);
	if (n < 0)
		cause[0] = '\0';
	if (key)
		key_desc(key, key_len, kd, sizeof(kd));
	if (key)
		n = snprintf(c->err, sizeof(c->err), "%s key '%s' on %s: %s (%s)", op, kd, c->peer,
			     cause, crun_err_name(r));
	else
		n = snprintf(c->err, sizeof(c->err), "%s on %s: %s (%s)", op, c->peer, cause,
			     crun_err_name(r));
	(void)n;
	if (c->broken && !c->broke[0]) {
		memcpy(c->broke, c->err, sizeof(c->broke) - 1);
		c->broke_r = r;
	}
	log_at(LL_DEBUG, SUB_STORE, "%s", c->err);
	return r;
}

/* An I/O failure leaves an unknown number of reply bytes in flight: the
 * stream has no framing to resynchronise on, so the connection is dropped. */
static void conn_break(struct client_conn *c)
{
	c->broken = true;
	c->ext = false;
	store_tls_conn_free(c->tls);
	c->tls = NULL;
	if (c->fd >= 0) {
		/* Abortive close (RST): the server keeps this connection's
		 * leases for their TTL, for the re-attach after the redial. An
		 * orderly close (crun_store_close, or the process exiting)
		 * ends them at once (store_ext.h). */
		struct linger lg = {1, 0};

		(void)setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		fd_close(c->fd);
		c->fd = -1;
	}
	c->rpos = c->rlen = 0;
}

/* ---- deadlines and raw I/O -------------------------------------------------- */

static uint64_t deadline_after(uint32_t ms)
{
	return ms ? clock_now_ms() + ms : NO_DEADLINE;
}

/* Milliseconds left for poll(): -1 = forever, 0 = expired. */
static int poll_ms(uint64_t deadline)
{
	uint64_t now;

	if (deadline == NO_DEADLINE)
		return -1;
	now = clock_now_ms();
	if (now >= deadline)
		return 0;
	return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Waits for `events` on fd until the deadline: 0, CRUN_ETIMEDOUT or -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int ms = poll_ms(deadline);
		int n;

		n = poll(&p, 1, ms);
		if (n > 0)
			return 0; /* readable, writable, or an error the next call reports */
		if (n == 0 && ms >= 0)
			return CRUN_ETIMEDOUT;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

static int send_all(struct client_conn *c, const uint8_t *p, size_t len, uint64_t deadline)
{
	int fd = c->fd;

	while (len > 0) {
		short ev = POLLOUT;
		ssize_t n = c->tls ? store_tls_write(c->tls, p, len, &ev)
				   : send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (c->tls && n < 0) {
			if (n != CRUN_EAGAIN)
				return (int)n;
			TRY(wait_fd(fd, ev, deadline));
			continue;
		}
		if (n >= 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		TRY(wait_fd(fd, POLLOUT, deadline));
	}
	return 0;
}

/* Reads whatever the socket has (at least one byte) into the read buffer,
 * compacting or growing it first when it is full. */
static int conn_fill(struct client_conn *c, uint64_t deadline)
{
	ssize_t n;
	int r;

	if (c->rpos == c->rlen)
		c->rpos = c->rlen = 0;
	if (c->rlen == c->rcap && c->rpos > 0) {
		memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
		c->rlen -= c->rpos;
		c->rpos = 0;
	}
	if (c->rlen == c->rcap) {
		size_t ncap = c->rcap ? c->rcap * 2 : RBUF_MIN;
		uint8_t *nb;

		if (c->rcap >= REPLY_MAX)
			return CRUN_EPROTO;
		nb = realloc(c->rbuf, ncap);
		if (!nb)
			return CRUN_ENOMEM;
		c->rbuf = nb;
		c->rcap = ncap;
	}
	for (;;) {
		short ev = POLLIN;

		if (c->tls) {
			/* Read first: TLS may hold decrypted bytes already. */
			n = store_tls_read(c->tls, c->rbuf + c->rlen, c->rcap - c->rlen, &ev);
			if (n == CRUN_EAGAIN) {
				r = wait_fd(c->fd, ev, deadline);
				if (r < 0)
					return r;
				continue;
			}
			if (n < 0)
				return (int)n;
		} else {
			r = wait_fd(c->fd, POLLIN, deadline);
			if (r < 0)
				return r;
			n = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, MSG_DONTWAIT);
		}
		if (n > 0) {
			c->rlen += (size_t)n;
			return 0;
		}
		if (n == 0)
			return CRUN_ECLOSED;
		if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
	}
}

/* A reply arrived. Replies come in request order: every write sent before
 * its request was applied, so nothing is left to replay. */
static void confirm(struct client_conn *c)
{
	c->ulen = 0;
	c->lossy = NULL;
	c->replayed = false;
}

/* Where a reply starts: the server's ERROR instead of it (store_ext.h; only
 * a server of version 6 or more, which this client's HELLO named, sends
 * one) is CRUN_ENOSPC with its text kept for last_error; 0 when the bytes
 * are a reply, left unread; else the read's failure. */
static int conn_error_reply(struct client_conn *c, uint64_t deadline)
{
	const char *text;
	size_t n, used;
	int r;

	if (!c->ext || c->ext_version < STORE_EXT_VERSION_ERROR)
		return 0;
	for (;;) {
		if (c->rlen > c->rpos) {
			r = store_ext_error_decode(c->rbuf + c->rpos, c->rlen - c->rpos, &text, &n,
						   &used);
			if (r == CRUN_EPROTO)
				return 0;
			if (r == 0) {
				memcpy(c->full, text, n);
				c->full[n] = '\0';
				c->rpos += used;
				return CRUN_ENOSPC;
			}
		}
		TRY(conn_fill(c, deadline));
	}
}

/* Reads one reply to `op`. *out points into the read buffer and stays valid
 * until the next read on this connection. */
static int conn_read_reply(struct client_conn *c, enum store_op op, uint64_t nitems,
			   uint64_t deadline, struct store_reply *out)
{
	TRY(conn_error_reply(c, deadline));
	for (;;) {
		size_t used;
		int r;

		if (c->rlen > c->rpos) {
			r = store_proto_decode_reply(op, nitems, &c->lim, c->rbuf + c->rpos,
						     c->rlen - c->rpos, out, &used);
			if (r == 0) {
				c->rpos += used;
				confirm(c);
				return 0;
			}
			if (r != CRUN_EAGAIN)
				return CRUN_EPROTO; /* over a limit or malformed */
		}
		r = conn_fill(c, deadline);
		if (r < 0)
			return r;
	}
}

static void conn_trim(struct client_conn *c)
{
	if (c->rpos == c->rlen && c->rcap > RBUF_KEEP) {
		free(c->rbuf);
		c->rbuf = NULL;
		c->rcap = c->rpos = c->rlen = 0;
	}
}

/* Frees a write buffer that a big request grew, as conn_trim does for reads. */
static void wbuf_trim(struct client_conn *c)
{
	if (c->wcap > RBUF_KEEP) {
		free(c->wbuf);
		c->wbuf = NULL;
		c->wcap = 0;
	}
}

/* A write without a reply went out: keep it for replay until a reply
 * confirms it, or remember that it cannot be replayed. */
static void note_unacked(struct client_conn *c, enum store_op op, const uint8_t *p, size_t len)
{
	if (c->lossy)
		return; /* the next reset fails anyway; keeping more is useless */
	if ((op != STORE_OP_SET && op != STORE_OP_MULTI_SET) || c->ulen + len > UNACKED_MAX ||
	    grow((void **)&c->unacked, &c->ucap, c->ulen + len, 1) < 0) {
		c->lossy = store_proto_op_name(op);
		c->ulen = 0;
		return;
	}
	memcpy(c->unacked + c->ulen, p, len);
	c->ulen += len;
}

/* Encodes req into the connection's write buffer and sends it in one go. */
static int conn_send_req(struct client_conn *c, const struct store_req *req, uint64_t deadline)
{
	size_t need = store_proto_req_size(c->dialect, req);
	size_t len;
	int r;

	if (need == 0)
		return CRUN_EDIALECT;
	if (need > c->wcap) {
		uint8_t *nb = realloc(c->wbuf, need);

		if (!nb)
			return CRUN_ENOMEM;
		c->wbuf = nb;
		c->wcap = need;
	}
	r = store_proto_encode_req(c->dialect, req, c->wbuf, c->wcap, &len);
	if (r < 0)
		return r;
	r = send_all(c, c->wbuf, len, deadline);
	if (r == 0 && store_proto_reply_kind(req->op) == STORE_REPLY_NONE)
		note_unacked(c, req->op, c->wbuf, len);
	wbuf_trim(c);
	return r;
}

static const char *cause_text(const struct client_conn *c, int r)
{
	if (r == CRUN_ENOSPC && c->full[0])
		return c->full; /* the server's ERROR (store_ext.h) */
	switch (r) {
	case CRUN_ETIMEDOUT:
		return "timed out";
	case CRUN_ECLOSED:
		return "server closed the connection";
	case CRUN_EPROTO:
		return "malformed or over-limit reply";
	default:
		return crun_strerror(r);
	}
}

/* Ops sent again after a reconnect when the request may already have been
 * applied: applying them twice leaves the same state and gives the same
 * answer (with no other writer in between). COMPARE_SET qualifies: a second
 * try finds its own desired value and answers it. ADD, APPEND, DELETE_KEY
 * (the answer changes), QUEUE_* and BARRIER (they count) do not. WATCH_KEY
 * and CANCEL_WAIT belong to the socket they were sent on. */
static const bool retry_safe[STORE_OP__MAX] = {
    [STORE_OP_SET] = true,	 [STORE_OP_COMPARE_SET] = true, [STORE_OP_GET] = true,
    [STORE_OP_CHECK] = true,	 [STORE_OP_WAIT] = true,	[STORE_OP_GETNUMKEYS] = true,
    [STORE_OP_MULTI_GET] = true, [STORE_OP_MULTI_SET] = true,	[STORE_OP_PING] = true,
    [STORE_OP_QUEUE_LEN] = true, [STORE_OP_LIST_KEYS] = true,
};

/* Failures a new connection may cure: the peer or the path went away. A
 * timeout is not one (its deadline is spent), nor a malformed reply. */
static bool transient(int r)
{
	switch (r) {
	case CRUN_ECLOSED:
	case CRUN_ECONNRESET:
	case CRUN_EPIPE:
	case CRUN_ECONNABORTED:
	case CRUN_ENOTCONN:
	case CRUN_ENETUNREACH:
	case CRUN_EHOSTUNREACH:
		return true;
	default:
		return false;
	}
}

/* ---- handles, key mangling, argument checks ----------------------------------- */

static uint32_t next_rand(struct client_conn *c)
{
	/* xorshift64*: only jitters the backoff and picks PING nonces. */
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return (uint32_t)((c->rng * 0x2545F4914F6CDD1DULL) >> 32);
}

static void conn_free(struct client_conn *c)
{
	if (!c)
		return;
	store_tls_conn_free(c->tls);
	store_tls_free(c->tls_ctx);
	if (c->fd >= 0)
		fd_close(c->fd);
	free(c->rbuf);
	free(c->wbuf);
	free(c->kbuf);
	free(c->kv);
	if (c->secret)
		OPENSSL_cleanse(c->secret, sizeof(*c->secret));
	free(c->secret);
	free(c->auth_job);
	free(c->host);
	free(c->leases);
	free(c->unacked);
	free(c);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
	void *np;

	if (need <= *cap)
		return 0;
	np = realloc(*p, need * elem);
	if (!np)
		return CRUN_ENOMEM;
	*p = np;
	*cap = need;
	return 0;
}

/* Fills c->kv[0..n) with the handle's prefix + each key (all in c->kbuf).
 * raw: keys go on the wire unchanged. Over-limit keys give CRUN_ETOOBIG. */
static int mangle(struct crun_store *s, const char *op, const char *const *keys, size_t n, bool raw)
{
	struct client_conn *c = s->conn;
	size_t plen = raw ? 0 : s->pfx_len;
	size_t total = 0, off = 0;

	if (n > c->lim.max_items)
		return set_err(c, CRUN_ETOOBIG, op, NULL, 0, "%zu keys, the limit is %llu", n,
			       (unsigned long long)c->lim.max_items);
	for (size_t i = 0; i < n; i++) {
		size_t kl;

		if (!keys[i])
			return set_err(c, CRUN_EINVAL, op, NULL, 0, "key %zu is NULL", i);
		kl = strlen(keys[i]);
		if (plen + kl > c->lim.max_key_bytes)
			return set_err(c, CRUN_ETOOBIG, op, keys[i], kl,
				       "key of %zu bytes, the limit is %zu", plen + kl,
				       c->lim.max_key_bytes);
		total += plen + kl;
	}
	if (grow((void **)&c->kbuf, &c->kcap, total ? total : 1, 1) < 0 ||
	    grow((void **)&c->kv, &c->kvcap, n ? n : 1, sizeof(*c->kv)) < 0)
		return set_err(c, CRUN_ENOMEM, op, NULL, 0, "out of memory");
	for (size_t i = 0; i < n; i++) {
		size_t kl = strlen(keys[i]);

		memcpy(c->kbuf + off, s->pfx, plen);
		memcpy(c->kbuf + off + plen, keys[i], kl);
		c->kv[i].p = (const uint8_t *)c->kbuf + off;
		c->kv[i].len = plen + kl;
		off += plen + kl;
	}
	return 0;
}

static int conn_revive(struct client_conn *c, const char *name, uint64_t deadline);

/* Common entry checks: the op exists in the dialect, and the connection is
 * up (reconnecting if an earlier call lost it). */
static int enter(struct crun_store *s, enum store_op op)
{
	struct client_conn *c = s->conn;

	if (store_proto_opcode(c->dialect, op) < 0)
		return set_err(c, CRUN_EDIALECT, store_proto_op_name(op), NULL, 0,
			       "not in the v%d store dialect", (int)c->dialect);
	if (c->broken)
		return conn_revive(c, store_proto_op_name(op), deadline_after(c->timeout_ms));
	return 0;
}

static int check_val(struct client_conn *c, const char *op, const void *val, size_t len)
{
	if (!val && len)
		return set_err(c, CRUN_EINVAL, op, NULL, 0, "NULL value of %zu bytes", len);
	if (len > c->lim.max_value_bytes)
		return set_err(c, CRUN_ETOOBIG, op, NULL, 0, "value of %zu bytes, the limit is %zu",
			       len, c->lim.max_value_bytes);
	return 0;
}

static uint64_t op_deadline(struct client_conn *c, uint32_t timeout_ms)
{
	return deadline_after(timeout_ms ? timeout_ms : c->timeout_ms);
}

/* The connection broke (r) with `op` sent, or partly sent, `tries` times.
 * Returns 0 when it is back and op should be sent again (retry_safe ops,
 * transport failures, time and tries left), else the error, recorded. */
static int lost(struct client_conn *c, int r, enum store_op op, const struct store_bytes *k,
		unsigned tries, uint64_t deadline)
{
	const char *name = store_proto_op_name(op);
	const uint8_t *kp = k ? k->p : NULL;
	size_t kl = k ? k->len : 0;

	conn_break(c);
	if (!c->reconnect_ms || !transient(r))
		return set_err(c, r, name, kp, kl, "%s", cause_text(c, r));
	if (!retry_safe[op])
		return set_err(c, r, name, kp, kl,
			       "%s with the request in flight; not sent again (not idempotent: "
			       "it may or may not have been applied)",
			       cause_text(c, r));
	if (tries >= SEND_TRIES || poll_ms(deadline) == 0)
		return set_err(c, r, name, kp, kl, "%s (sent %u times)", cause_text(c, r), tries);
	(void)snprintf(c->broke, sizeof(c->broke), "%s: %s", name, cause_text(c, r));
	c->broke_r = r;
	return conn_revive(c, name, deadline);
}

/* One request and its reply, no waiting semantics: any failure after a byte
 * may have been sent breaks the connection (then lost() decides). */
static int call(struct client_conn *c, const struct store_req *req, uint64_t nitems,
		uint64_t deadline, struct store_reply *out)
{
	const char *name = store_proto_op_name(req->op);
	const struct store_bytes *k = req->key.p ? &req->key : (req->keys ? &req->keys[0] : NULL);
	int r;

	for (unsigned tries = 1;; tries++) {
		r = conn_send_req(c, req, deadline);
		if (r == CRUN_ENOMEM || r == CRUN_EDIALECT) /* nothing was sent */
			return set_err(c, r, name, k ? k->p : NULL, k ? k->len : 0, "%s",
				       cause_text(c, r));
		if (r == 0 && store_proto_reply_kind(req->op) != STORE_REPLY_NONE)
			r = conn_read_reply(c, req->op, nitems, deadline, out);
		if (r == 0)
			return 0;
		TRY(lost(c, r, req->op, k, tries, deadline));
	}
}

/* Reads the 1-byte answer of WAIT or BARRIER. On a timeout, v2 cancels the
 * wait on the server and keeps the stream in sync (what PyTorch 2.x does);
 * v1 has no CANCEL_WAIT, and a late STOP_WAITING would be read as the answer
 * to a later request (the 1.13 desync of torch-compat §1.7), so v1 drops the
 * connection. */
static int await_wake(struct client_conn *c, enum store_op op, const struct store_bytes *key,
		      uint64_t deadline)
{
	const char *name = store_proto_op_name(op);
	struct store_req cancel = {.op = STORE_OP_CANCEL_WAIT};
	struct store_reply rep;
	int r;

	r = conn_read_reply(c, op, 0, deadline, &rep);
	if (r == 0) {
		if (rep.status == STORE_WAIT_STOP_WAITING)
			return 0;
		conn_break(c);
		return set_err(c, CRUN_EPROTO, name, key ? key->p : NULL, key ? key->len : 0,
			       "unexpected wait status %u", rep.status);
	}
	if (r != CRUN_ETIMEDOUT || c->dialect == STORE_V1) {
		conn_break(c);
		return set_err(
		    c, r, name, key ? key->p : NULL, key ? key->len : 0, "%s%s", cause_text(c, r),
		    r == CRUN_ETIMEDOUT ? "; v1 connection closed (no CANCEL_WAIT)" : "");
	}
	/* A peer that stopped answering must not hold a caller with a short
	 * op timeout (a lease monitor) for the full cancel allowance. */
	deadline =
	    deadline_after(c->timeout_ms ? MIN(CANCEL_REPLY_MS, c->timeout_ms) : CANCEL_REPLY_MS);
	r = conn_send_req(c, &cancel, deadline);
	for (int i = 0; r == 0 && i < 2; i++) {
		r = conn_read_reply(c, STORE_OP_CANCEL_WAIT, 0, deadline, &rep);
		if (r < 0)
			break;
		if (rep.status == STORE_WAIT_CANCELED)
			return set_err(c, CRUN_ETIMEDOUT, name, key ? key->p : NULL,
				       key ? key->len : 0, "timed out (wait canceled)");
		/* One late STOP_WAITING may precede WAIT_CANCELED; anything else,
		 * or a second one, is a broken stream. */
		if (rep.status != STORE_WAIT_STOP_WAITING || i == 1)
			r = CRUN_EPROTO;
	}
	conn_break(c);
	return set_err(c, r, name, key ? key->p : NULL, key ? key->len : 0,
		       "timed out, and CANCEL_WAIT failed: %s", cause_text(c, r));
}

/* WAIT on c->kv[0..n): the first half of GET, MULTI_GET and blocking POP.
 * A wait registration dies with its socket, so after a reset the WAIT is
 * simply sent again on the new one. */
static int do_wait(struct client_conn *c, size_t n, uint64_t deadline)
{
	struct store_req req = {.op = STORE_OP_WAIT, .nitems = n, .keys = c->kv};
	const struct store_bytes *k = n ? &c->kv[0] : NULL;
	int r;

	for (unsigned tries = 1;; tries++) {
		r = conn_send_req(c, &req, deadline);
		if (r == 0) {
			r = await_wake(c, STORE_OP_WAIT, k, deadline);
			if (r == 0 || !c->broken || !transient(r))
				return r;
		}
		TRY(lost(c, r, STORE_OP_WAIT, k, tries, deadline));
	}
}

/* ---- open / view / close ---------------------------------------------------- */

#define OPT_HAS(o, f) ((o)->struct_size >= offsetof(crun_store_opts_t, f) + sizeof((o)->f))

static int make_prefix(const char *base, size_t base_len, const char *add, char **ret,
		       size_t *ret_len)
{
	size_t al = add ? strlen(add) : 0;
	size_t len = base_len + (add ? al + 1 : 0);
	char *p = malloc(len + 1);

	if (!p)
		return CRUN_ENOMEM;
	memcpy(p, base, base_len);
	if (add) {
		memcpy(p + base_len, add, al);
		p[base_len + al] = '/';
	}
	p[len] = '\0';
	*ret = p;
	*ret_len = len;
	return 0;
}

/* One connect attempt to one address, bounded by the deadline. */
static int try_connect(const struct addrinfo *ai, uint64_t deadline, int *ret_fd)
{
	int fd =
	    socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	int one = 1, soerr = 0;
	socklen_t sl = sizeof(soerr);
	int r;

	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			r = -errno;
			goto out_close;
		}
		r = wait_fd(fd, POLLOUT, deadline);
		if (r < 0)
			goto out_close;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) {
			r = -errno;
			goto out_close;
		}
		if (soerr) {
			r = -soerr;
			goto out_close;
		}
	}
	/* Requests are small and answered one at a time: never batch. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*ret_fd = fd;
	return 0;
out_close:
	fd_close(fd);
	return r;
}

/* v2 greeting, as PyTorch 2.x sends it: VALIDATE (no reply), then PING with
 * the pid as nonce, both in one segment; the server must echo the nonce. */
static int handshake(struct client_conn *c, uint64_t deadline)
{
	struct store_req v = {.op = STORE_OP_VALIDATE, .u32 = STORE_VALIDATE_MAGIC};
	struct store_req p = {.op = STORE_OP_PING, .u32 = (uint32_t)getpid()};
	uint8_t buf[64];
	size_t l1, l2;
	struct store_reply rep;
	int r;

	TRY(store_proto_encode_req(STORE_V2, &v, buf, sizeof(buf), &l1));
	TRY(store_proto_encode_req(STORE_V2, &p, buf + l1, sizeof(buf) - l1, &l2));
	TRY(send_all(c, buf, l1 + l2, deadline));
	r = conn_read_reply(c, STORE_OP_PING, 0, deadline, &rep);
	if (r == 0 && rep.u32 == p.u32)
		return 0;
	/* No echo: a TLS server answers a plaintext greeting with a TLS alert
	 * (store_tls_tell_plaintext_peer), the first bytes of the stream. Only
	 * then: a right echo may start with those bytes (pid 789, 790...). */
	if (!c->tls && store_tls_record(c->rbuf, c->rlen))
		return set_err(c, CRUN_EPROTO, "connect", NULL, 0,
			       "the server speaks TLS: set tls_ca (and tls_cert, tls_key if it "
			       "wants a client certificate)");
	/* An authenticating crun server sent its challenge (auth.h) at accept,
	 * and that is what we read as the echo. */
	if (!c->secret && c->rlen >= 4 && memcmp(c->rbuf, "CRA1", 4) == 0)
		return set_err(c, CRUN_EACCES, "connect", NULL, 0,
			       "authentication required: the server wants a secret (set "
			       "auth_secret_file, or CRUN_AUTH_SECRET_FILE)");
	return r < 0 ? r : CRUN_EPROTO;
}

/* The auth.h exchange before the first TCPStore byte; the error names the
 * cause (no challenge, refused, impostor) in last_error. */
static int client_auth(struct client_conn *c, uint64_t deadline)
{
	char why[300];
	int r = store_auth_client_run(c->fd, c->tls, c->secret, c->auth_job, deadline, why,
				      sizeof(why));

	if (r < 0 && r != CRUN_ETIMEDOUT && r != CRUN_ECONNRESET && r != CRUN_ECLOSED)
		return set_err(c, r, "connect", NULL, 0, "%s", why);
	return r;
}

/* TLS handshake on the fresh socket, the certificate checked against host. */
static int client_tls(struct client_conn *c, const char *host, uint64_t deadline)
{
	char why[600];
	int r = store_tls_connect(c->tls_ctx, c->fd, host, deadline, &c->tls, why, sizeof(why));

	if (r < 0 && r != CRUN_ETIMEDOUT)
		return set_err(c, r, "connect", NULL, 0, "%s", why);
	return r;
}

/* Resolves and connects to c->host:c->port until the deadline, with
 * exponential backoff and jitter between rounds (every address is tried once
 * per round; one_round: no second round). From refused_until on, a round
 * whose last answer was "connection refused" ends the dialing with it. */
static int conn_dial(struct client_conn *c, uint64_t deadline, bool one_round,
		     uint64_t refused_until)
{
	struct addrinfo hints = {
	    .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	uint32_t backoff = BACKOFF_START_MS;
	bool hung_up = false; /* the server accepted, then closed on our greeting */
	char port_s[8], what[160] = "";
	uint64_t start = clock_now_ms();
	int last = CRUN_ETIMEDOUT;
	int n;

	n = snprintf(port_s, sizeof(port_s), "%u", (unsigned)c->port);
	(void)n;
	/* A bound on rounds as well as on time: 0 ms means one round only. */
	for (unsigned round = 0; round < 1000000; round++) {
		struct addrinfo *res = NULL;
		int g = getaddrinfo(c->host, port_s, &hints, &res);

		if (g == 0) {
			for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
				int fd = -1;

				last = try_connect(ai, deadline, &fd);
				if (last < 0)
					continue;
				c->fd = fd;
				c->rpos = c->rlen = 0;
				last = c->tls_ctx ? client_tls(c, c->host, deadline) : 0;
				if (last == 0 && c->secret)
					last = client_auth(c, deadline);
				if (last == 0)
					last = c->dialect == STORE_V2 ? handshake(c, deadline) : 0;
				if (last == CRUN_EPROTO && *store_tls_conn_error(c->tls))
					/* e.g. the server wanted our certificate */
					(void)set_err(c, last, "connect", NULL, 0, "TLS: %s",
						      store_tls_conn_error(c->tls));
				if (last == 0)
					break;
				store_tls_conn_free(c->tls);
				c->tls = NULL;
				fd_close(c->fd);
				c->fd = -1;
				if (last == CRUN_EPROTO || last == CRUN_EACCES)
					break; /* a wrong echo or secret is not worth retrying */
			}
			freeaddrinfo(res);
			if (last == 0 || last == CRUN_EPROTO || last == CRUN_EACCES)
				return last;
		} else if ((g == EAI_NONAME && !(c->rep && c->rep->retry_unresolved)) ||
			   g == EAI_SERVICE || g == EAI_FAMILY) {
			return set_err(c, CRUN_ERESOLVE, "connect", NULL, 0, "%s", gai_strerror(g));
		} else {
			last = CRUN_ERESOLVE;
		}
		if (last == CRUN_ERESOLVE)
			n = snprintf(what, sizeof(what), "cannot resolve '%s': %s", c->host,
				     gai_strerror(g));
		else
			n = snprintf(what, sizeof(what), "%s", crun_strerror(last));
		if (last == CRUN_ECONNREFUSED && refused_until != NO_DEADLINE &&
		    clock_now_ms() >= refused_until)
			return last;
		log_at(LL_DEBUG, SUB_STORE, "connect to %s: %s; retrying", c->peer,
		       crun_strerror(last));
		hung_up |= last == CRUN_ECLOSED || last == CRUN_ECONNRESET;
		{
			uint32_t j = backoff / 2 + next_rand(c) % (backoff + 1);
			int left = poll_ms(deadline);

			if (left == 0 || one_round)
				break;
			if (round == 0 && c->rep && c->rep->on_retry)
				c->rep->on_retry(last, what, left < 0 ? UINT64_MAX : (uint64_t)left,
						 c->rep->arg);
			if (left > 0 && (uint32_t)left < j)
				j = (uint32_t)left;
			(void)poll(NULL, 0, (int)j);
			backoff = backoff + backoff / 2 > BACKOFF_CAP_MS ? BACKOFF_CAP_MS
									 : backoff + backoff / 2;
		}
	}
	if (hung_up && last != CRUN_ECONNREFUSED)
		/* A TLS or authenticating server hangs up on a client without
		 * them, and says nothing a plaintext client could read. */
		(void)set_err(c, CRUN_ETIMEDOUT, "connect", NULL, 0,
			      "the server closed every connection during the handshake (does "
			      "it require TLS (tls_ca) or a secret (auth_secret_file)?)");
	else if (!one_round && !c->broken)
		/* Opening: the cause, not only "timed out" (a revive says its own). */
		(void)set_err(c, last, "connect", NULL, 0, "%s (tried for %llu s)", what,
			      (unsigned long long)((clock_now_ms() - start + 500) / 1000));
	return last == CRUN_ETIMEDOUT || last == CRUN_ECONNREFUSED || last == CRUN_ECLOSED ||
		       last == CRUN_ECONNRESET
		   ? CRUN_ETIMEDOUT
		   : last;
}

/* Loads the secret before connecting: a bad file fails at once, named. */
static int client_secret(struct client_conn *c, const char *path, const char *job)
{
	char why[512];
	int r;

	c->secret = malloc(sizeof(*c->secret));
	c->auth_job = str_dup(job ? job : "");
	if (!c->secret || !c->auth_job)
		return CRUN_ENOMEM;
	r = store_auth_secret_read(path, c->secret, why, sizeof(why));
	if (r < 0) {
		log_at(LL_DEBUG, SUB_STORE, "%s", why); /* callers check the file first */
		return r;
	}
	if (strlen(c->auth_job) > STORE_AUTH_JOB_MAX)
		return CRUN_EINVAL;
	return 0;
}

/* ---- the extension's wire calls, and leases held by the handle ---------------- */

/* Reads the value bytes that end a reply (their u64 length was the last of
 * the fixed part, lenb) into a fresh allocation with a NUL after them. */
static int read_tail(struct client_conn *c, const uint8_t *lenb, uint64_t deadline, void **ret_val,
		     size_t *ret_len)
{
	uint64_t n = store_get_u64(lenb);
	uint8_t *p;

	if (n > c->lim.max_value_bytes)
		return CRUN_EPROTO;
	while (c->rlen - c->rpos < n)
		TRY(conn_fill(c, deadline));
	p = malloc((size_t)n + 1);
	if (!p)
		return CRUN_ENOMEM;
	memcpy(p, c->rbuf + c->rpos, (size_t)n);
	p[n] = '\0';
	c->rpos += (size_t)n;
	*ret_val = p;
	if (ret_len)
		*ret_len = (size_t)n;
	return 0;
}

/* Sends one extension request and reads its reply: the fixed part into rep,
 * and (ret_val non-NULL: TRY_GET) the value after it. No retries. On an I/O
 * failure the connection is broken and r returned. */
static int ext_rpc_val(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		       uint64_t deadline, void **ret_val, size_t *ret_len)
{
	size_t need = store_ext_req_size(q), want = store_ext_reply_size(q->op), len;
	int r;

	if (grow((void **)&c->wbuf, &c->wcap, need, 1) < 0)
		return CRUN_ENOMEM;
	r = store_ext_encode_req(q, c->wbuf, c->wcap, &len);
	if (r < 0)
		return r;
	r = send_all(c, c->wbuf, len, deadline);
	wbuf_trim(c);
	if (r == 0 && want)
		r = conn_error_reply(c, deadline);
	while (r == 0 && c->rlen - c->rpos < want)
		r = conn_fill(c, deadline);
	if (r == 0) {
		memcpy(rep, c->rbuf + c->rpos, want);
		c->rpos += want;
	}
	if (r == 0 && ret_val)
		r = read_tail(c, rep + want - 8, deadline, ret_val, ret_len);
	if (r < 0) {
		conn_break(c);
		return r;
	}
	confirm(c);
	conn_trim(c);
	return 0;
}

static int ext_rpc(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		   uint64_t deadline)
{
	return ext_rpc_val(c, q, rep, deadline, NULL, NULL);
}

static int ext_hello(struct client_conn *c, uint64_t deadline)
{
	struct store_ext_req q = {
	    .op = STORE_EXT_HELLO, .magic = STORE_EXT_MAGIC, .version = STORE_EXT_VERSION};
	uint8_t rep[4];

	TRY(ext_rpc(c, &q, rep, deadline));
	if (store_get_u32(rep) < 1) {
		conn_break(c);
		return CRUN_EPROTO;
	}
	c->ext = true;
	c->ext_used = true;
	c->ext_version = store_get_u32(rep);
	return 0;
}

static void lease_forget(struct client_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nleases; i++) {
		if (c->leases[i] == id) {
			c->leases[i] = c->leases[--c->nleases];
			return;
		}
	}
}

/* Remembers a lease to re-attach after a reconnect (bounded like the
 * server's registrations; past that a lease is simply not re-attached). */
static void lease_note(struct client_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nleases; i++)
		if (c->leases[i] == id)
			return;
	if (c->nleases >= c->lim.max_items ||
	    grow((void **)&c->leases, &c->lcap, c->nleases + 1, sizeof(*c->leases)) < 0)
		return;
	c->leases[c->nleases++] = id;
}

/* On a new connection: HELLO again, then LEASE_ATTACH every lease held. One
 * whose TTL lapsed meanwhile is not found: it stays dead (its expiry key is
 * set), and later calls on it answer CRUN_ENOTFOUND. */
static int ext_reopen(struct client_conn *c, uint64_t deadline)
{
	TRY(ext_hello(c, deadline));
	if (c->ext_version < STORE_EXT_VERSION_ATTACH) {
		c->nleases = 0; /* an old server ended them with the old connection */
		return 0;
	}
	for (size_t i = 0; i < c->nleases && i < c->lim.max_items;) {
		struct store_ext_req q = {.op = STORE_EXT_LEASE_ATTACH, .id = c->leases[i]};
		uint8_t st;

		TRY(ext_rpc(c, &q, &st, deadline));
		if (st == STORE_EXT_OK)
			i++;
		else
			lease_forget(c, c->leases[i]);
	}
	return 0;
}

/* Dials again after the connection was lost (why: c->broke), within
 * reconnect_ms and the caller's deadline: greeting, HELLO and lease
 * re-attach, then the replay of unconfirmed writes. 0 when the connection is
 * back; an error (recorded, the handle stays broken) when it is not, or when
 * an unconfirmed write could not be replayed (then the connection is back but
 * this call fails, saying so). */
static int conn_revive(struct client_conn *c, const char *name, uint64_t deadline)
{
	uint64_t d = deadline_after(c->reconnect_ms);
	size_t log_len = c->ulen;
	const char *lossy = c->lossy;
	bool replayed = c->replayed;
	char why[sizeof(c->broke)];
	int r;

	if (!c->reconnect_ms)
		return set_err(c, CRUN_ENOTCONN, name, NULL, 0,
			       "connection closed after an earlier failure: %s", c->broke);
	/* Replayed once and lost again before a reply: maybe the server closes
	 * on that very write (over its limits). Not again: fail, saying so. */
	if (log_len && replayed) {
		lossy = "SET (already replayed once)";
		log_len = 0;
		replayed = false;
	}
	memcpy(why, c->broke, sizeof(why));
	if (deadline < d)
		d = deadline;
	conn_break(c);
	/* its PING reply clears ulen: restored below */
	r = conn_dial(c, d, false,
		      c->broke_r == CRUN_ECLOSED || c->broke_r == CRUN_EPIPE
			  ? deadline_after(GONE_MS) /* the server closed in order */
			  : NO_DEADLINE);
	if (r == 0 && c->ext_used)
		r = ext_reopen(c, d);
	if (r == 0 && log_len) {
		r = send_all(c, c->unacked, log_len, d);
		replayed = true;
	}
	c->ulen = log_len; /* still unconfirmed until the next reply */
	c->lossy = lossy;
	c->replayed = replayed;
	if (r < 0) {
		conn_break(c);
		return set_err(c, r, name, NULL, 0, "connection lost (%s); reconnecting failed: %s",
			       why, cause_text(c, r));
	}
	c->broken = false;
	c->broke[0] = '\0';
	c->broke_r = 0;
	log_at(LL_DEBUG, SUB_STORE, "reconnected to %s after: %s", c->peer, why);
	if (lossy) {
		c->lossy = NULL;
		return set_err(c, CRUN_ECONNRESET, name, NULL, 0,
			       "connection lost (%s) before an earlier %s was confirmed: it may "
			       "not have been applied (reconnected; this call was not sent)",
			       why, lossy);
	}
	return 0;
}

CRUN_API int crun_store_open(const crun_store_opts_t *opts, crun_store_t **ret_store)
{
	return store_client_open(opts, NULL, ret_store);
}

int store_client_open(const struct crun_store_opts *opts, const struct store_dial_report *rep,
		      struct crun_store **ret_store)
{
	struct store_limits lim = STORE_LIMITS_DEFAULT;
	struct client_conn *c;
	struct crun_store *s;
	const char *prefix = NULL;
	int dialect = CRUN_STORE_V2;
	uint32_t cto = 30000, to = 300000, reconnect = CRUN_STORE_RECONNECT_MS_DEFAULT;
	int r;

	if (!opts || !ret_store || !OPT_HAS(opts, port) || !opts->host || !*opts->host)
		return CRUN_EINVAL;
	if (OPT_HAS(opts, connect_timeout_ms))
		cto = opts->connect_timeout_ms;
	if (OPT_HAS(opts, timeout_ms))
		to = opts->timeout_ms;
	if (OPT_HAS(opts, dialect))
		dialect = opts->dialect;
	if (OPT_HAS(opts, prefix))
		prefix = opts->prefix;
	if (OPT_HAS(opts, reconnect_ms))
		reconnect = opts->reconnect_ms;
	if (dialect != CRUN_STORE_V1 && dialect != CRUN_STORE_V2)
		return CRUN_EINVAL;
	/* NULL or "" means no prefix here; crun_store_view_new("") follows
	 * PrefixStore exactly and adds an empty layer ("//k"). */
	if (prefix && !*prefix)
		prefix = NULL;

	c = calloc(1, sizeof(*c));
	s = calloc(1, sizeof(*s));
	if (!c || !s) {
		r = CRUN_ENOMEM;
		goto fail;
	}
	c->refs = 1;
	c->fd = -1;
	c->dialect = (enum store_dialect)dialect;
	c->timeout_ms = to;
	c->reconnect_ms = reconnect;
	c->lim = lim;
	c->port = opts->port;
	c->host = str_dup(opts->host);
	if (!c->host) {
		r = CRUN_ENOMEM;
		goto fail;
	}
	c->rng = clock_now_us() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)c;
	if (!c->rng)
		c->rng = 1;
	r = snprintf(c->peer, sizeof(c->peer), strchr(opts->host, ':') ? "[%s]:%u" : "%s:%u",
		     opts->host, (unsigned)opts->port);
	if (r < 0 || (size_t)r >= sizeof(c->peer)) {
		r = CRUN_EINVAL;
		goto fail;
	}
	s->conn = c;
	if (OPT_HAS(opts, tls_ca) && opts->tls_ca) {
		struct store_tls_opts tlo = {
		    .ca = opts->tls_ca,
		    .cert = OPT_HAS(opts, tls_cert) ? opts->tls_cert : NULL,
		    .key = OPT_HAS(opts, tls_key) ? opts->tls_key : NULL,
		    .min_version = OPT_HAS(opts, tls_min_version) ? opts->tls_min_version : 0};
		char why[600];

		r = store_tls_new_client(&tlo, &c->tls_ctx, why, sizeof(why));
		if (r < 0) {
			log_at(LL_DEBUG, SUB_STORE, "%s", why);
			goto fail;
		}
	}
	if (OPT_HAS(opts, auth_secret_file) && opts->auth_secret_file) {
		r = client_secret(c, opts->auth_secret_file,
				  OPT_HAS(opts, auth_job) ? opts->auth_job : NULL);
		if (r < 0)
			goto fail;
	}
	r = make_prefix("/", 1, prefix, &s->pfx, &s->pfx_len);
	if (r < 0)
		goto fail;
	/* connect_timeout_ms = 0: one round, bounded by the op timeout. */
	c->rep = rep;
	r = conn_dial(c, deadline_after(cto ? cto : to), cto == 0, NO_DEADLINE);
	c->rep = NULL;
	if (r < 0 && rep && rep->err && rep->err_cap)
		(void)snprintf(rep->err, rep->err_cap, "%s", c->err[0] ? c->err : crun_strerror(r));
	if (r < 0) {
		log_at(LL_INFO, SUB_STORE, "cannot connect to store %s (v%d): %s", c->peer, dialect,
		       c->err[0] ? c->err : crun_strerror(r));
		goto fail;
	}
	*ret_store = s;
	return 0;
fail:
	if (s)
		free(s->pfx);
	free(s);
	conn_free(c);
	return r;
}

CRUN_API int crun_store_view_new(crun_store_t *base, const char *prefix, crun_store_t **ret_view)
{
	struct crun_store *v;
	int r;

	if (!base || !prefix || !ret_view)
		return CRUN_EINVAL;
	v = calloc(1, sizeof(*v));
	if (!v)
		return CRUN_ENOMEM;
	r = make_prefix(base->pfx, base->pfx_len, prefix, &v->pfx, &v->pfx_len);
	if (r < 0) {
		free(v);
		return r;
	}
	v->conn = base->conn;
	v->conn->refs++;
	*ret_view = v;
	return 0;
}

CRUN_API void crun_store_close(crun_store_t *s)
{
	if (!s)
		return;
	if (--s->conn->refs == 0)
		conn_free(s->conn);
	free(s->pfx);
	free(s);
}

CRUN_API const char *crun_store_last_error(const crun_store_t *s)
{
	if (!s)
		return "no store handle";
	return s->conn->err[0] ? s->conn->err : "no error";
}

CRUN_API void crun_store_set_timeout(crun_store_t *s, uint32_t timeout_ms)
{
	if (s)
		s->conn->timeout_ms = timeout_ms;
}

/* ---- operations ------------------------------------------------------------- */

/* Copies a reply's bytes into a fresh allocation with a NUL after them. */
static int dup_bytes(struct client_conn *c, const char *op, const struct store_bytes *b,
		     void **ret_val, size_t *ret_len)
{
	uint8_t *p = malloc(b->len + 1);

	if (!p)
		return set_err(c, CRUN_ENOMEM, op, NULL, 0, "out of memory for %zu bytes", b->len);
	if (b->len)
		memcpy(p, b->p, b->len);
	p[b->len] = '\0';
	*ret_val = p;
	if (ret_len)
		*ret_len = b->len;
	return 0;
}

/* Mangle and send one single-key request with an optional value. */
static int one_key(struct crun_store *s, enum store_op op, const char *key, bool raw)
{
	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, op));
	if (!key)
		return set_err(s->conn, CRUN_EINVAL, store_proto_op_name(op), NULL, 0, "NULL key");
	return mangle(s, store_proto_op_name(op), &key, 1, raw);
}

CRUN_API int crun_store_set(crun_store_t *s, const char *key, const void *val, size_t len)
{
	struct store_req req = {.op = STORE_OP_SET};

	TRY(one_key(s, STORE_OP_SET, key, false));
	TRY(check_val(s->conn, "SET", val, len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){val, len};
	return call(s->conn, &req, 0, op_deadline(s->conn, 0), NULL);
}

CRUN_API int crun_store_get(crun_store_t *s, const char *key, uint32_t timeout_ms, void **ret_val,
			    size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_GET};
	struct store_reply rep;
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_GET, key, false));
	if (!ret_val)
		return set_err(s->conn, CRUN_EINVAL, "GET", key, strlen(key), "NULL ret_val");
	deadline = op_deadline(s->conn, timeout_ms);
	TRY(do_wait(s->conn, 1, deadline));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, deadline, &rep));
	r = dup_bytes(s->conn, "GET", &rep.val, ret_val, ret_len);
	conn_trim(s->conn);
	return r;
}

int store_client_get_now(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_GET};
	struct store_reply rep;
	int r;

	TRY(one_key(s, STORE_OP_GET, key, false));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	r = dup_bytes(s->conn, "GET", &rep.val, ret_val, ret_len);
	conn_trim(s->conn);
	return r;
}

static int add_common(crun_store_t *s, const char *key, int64_t delta, int64_t *ret_value, bool raw)
{
	struct store_req req = {.op = STORE_OP_ADD, .num = delta};
	struct store_reply rep;

	TRY(one_key(s, STORE_OP_ADD, key, raw));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (ret_value)
		*ret_value = rep.num;
	return 0;
}

CRUN_API int crun_store_add(crun_store_t *s, const char *key, int64_t delta, int64_t *ret_value)
{
	return add_common(s, key, delta, ret_value, false);
}

CRUN_API int crun_store_add_raw(crun_store_t *s, const char *wire_key, int64_t delta,
				int64_t *ret_value)
{
	return add_common(s, wire_key, delta, ret_value, true);
}

CRUN_API int crun_store_compare_set(crun_store_t *s, const char *key, const void *expected,
				    size_t expected_len, const void *desired, size_t desired_len,
				    void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_COMPARE_SET};
	struct store_reply rep;
	int r;

	TRY(one_key(s, STORE_OP_COMPARE_SET, key, false));
	TRY(check_val(s->conn, "COMPARE_SET", expected, expected_len));
	TRY(check_val(s->conn, "COMPARE_SET", desired, desired_len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){expected, expected_len};
	req.val2 = (struct store_bytes){desired, desired_len};
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (!ret_val)
		return 0;
	r = dup_bytes(s->conn, "COMPARE_SET", &rep.val, ret_val, ret_len);
	conn_trim(s->conn);
	return r;
}

static int key_list(struct crun_store *s, enum store_op op, const char *const *keys, size_t n)
{
	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, op));
	if (!keys && n)
		return set_err(s->conn, CRUN_EINVAL, store_proto_op_name(op), NULL, 0,
			       "NULL key list");
	return mangle(s, store_proto_op_name(op), keys, n, false);
}

CRUN_API int crun_store_check(crun_store_t *s, const char *const *keys, size_t nkeys,
			      int *ret_ready)
{
	struct store_req req = {.op = STORE_OP_CHECK, .nitems = nkeys};
	struct store_reply rep;

	TRY(key_list(s, STORE_OP_CHECK, keys, nkeys));
	req.keys = s->conn->kv;
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (rep.status != STORE_CHECK_READY && rep.status != STORE_CHECK_NOT_READY) {
		conn_break(s->conn);
		return set_err(s->conn, CRUN_EPROTO, "CHECK", NULL, 0, "bad status %u", rep.status);
	}
	if (ret_ready)
		*ret_ready = rep.status == STORE_CHECK_READY;
	return 0;
}

CRUN_API int crun_store_wait(crun_store_t *s, const char *const *keys, size_t nkeys,
			     uint32_t timeout_ms)
{
	TRY(key_list(s, STORE_OP_WAIT, keys, nkeys));
	return do_wait(s->conn, nkeys, op_deadline(s->conn, timeout_ms));
}

CRUN_API int crun_store_num_keys(crun_store_t *s, int64_t *ret_count)
{
	struct store_req req = {.op = STORE_OP_GETNUMKEYS};
	struct store_reply rep;

	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_GETNUMKEYS));
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (ret_count)
		*ret_count = rep.num;
	return 0;
}

CRUN_API int crun_store_delete_key(crun_store_t *s, const char *key, int *ret_deleted)
{
	struct store_req req = {.op = STORE_OP_DELETE_KEY};
	struct store_reply rep;

	TRY(one_key(s, STORE_OP_DELETE_KEY, key, false));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (ret_deleted)
		*ret_deleted = rep.num == 1;
	return 0;
}

/* ---- v2 only ------------------------------------------------------------------ */

static int key_val(crun_store_t *s, enum store_op op, const char *key, const void *val, size_t len)
{
	struct store_req req = {.op = op};

	TRY(one_key(s, op, key, false));
	TRY(check_val(s->conn, store_proto_op_name(op), val, len));
	req.key = s->conn->kv[0];
	req.val = (struct store_bytes){val, len};
	return call(s->conn, &req, 0, op_deadline(s->conn, 0), NULL);
}

CRUN_API int crun_store_append(crun_store_t *s, const char *key, const void *val, size_t len)
{
	return key_val(s, STORE_OP_APPEND, key, val, len);
}

CRUN_API int crun_store_queue_push(crun_store_t *s, const char *key, const void *val, size_t len)
{
	return key_val(s, STORE_OP_QUEUE_PUSH, key, val, len);
}

CRUN_API int crun_store_multi_get(crun_store_t *s, const char *const *keys, size_t nkeys,
				  uint32_t timeout_ms, void **ret_vals, size_t *ret_lens)
{
	struct store_req req = {.op = STORE_OP_MULTI_GET, .nitems = nkeys};
	struct store_reply rep;
	const uint8_t *it;
	uint64_t deadline;
	void **tmp;

	TRY(key_list(s, STORE_OP_MULTI_GET, keys, nkeys));
	if (nkeys && (!ret_vals || !ret_lens))
		return set_err(s->conn, CRUN_EINVAL, "MULTI_GET", NULL, 0, "NULL result arrays");
	deadline = op_deadline(s->conn, timeout_ms);
	TRY(do_wait(s->conn, nkeys, deadline));
	req.keys = s->conn->kv;
	/* timeout_ms bounds the wait for the keys; reading keys that exist is
	 * an ordinary request. Under the wait's deadline a short timeout (the
	 * rendezvous closer's 1 ms "are all alive?") that the WAIT used up
	 * left the read none: it timed out unanswered and broke the
	 * connection, with the agent's lease on it (seen at 2,048 simulated
	 * agents, bench/rdzv_sim.c). */
	TRY(call(s->conn, &req, nkeys, MAX(deadline, op_deadline(s->conn, 0)), &rep));
	/* Allocate into a scratch array first: ret_* are written only on success. */
	tmp = calloc(nkeys ? nkeys : 1, sizeof(*tmp));
	if (!tmp)
		return set_err(s->conn, CRUN_ENOMEM, "MULTI_GET", NULL, 0, "out of memory");
	it = rep.items;
	for (size_t i = 0; i < nkeys; i++) {
		struct store_bytes b;
		size_t l;

		store_items_next(&it, &b);
		if (dup_bytes(s->conn, "MULTI_GET", &b, &tmp[i], &l) < 0) {
			for (size_t j = 0; j < i; j++)
				free(tmp[j]);
			free(tmp);
			return CRUN_ENOMEM;
		}
	}
	it = rep.items;
	for (size_t i = 0; i < nkeys; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		ret_vals[i] = tmp[i];
		ret_lens[i] = b.len;
	}
	free(tmp);
	conn_trim(s->conn);
	return 0;
}

int store_client_multi_get_now(struct crun_store *s, const char *const *keys, size_t n,
			       void **ret_vals, size_t *ret_lens)
{
	struct store_req req = {.op = STORE_OP_MULTI_GET, .nitems = n};
	struct store_reply rep;
	const uint8_t *it;
	size_t i;

	TRY(key_list(s, STORE_OP_MULTI_GET, keys, n));
	if (!ret_vals || !ret_lens)
		return CRUN_EINVAL;
	/* Other servers may fail a MULTI_GET of a missing key. */
	if (!s->conn->ext || s->conn->ext_version < STORE_EXT_VERSION_FOLD)
		return set_err(s->conn, CRUN_ENOTSUP, "MULTI_GET", NULL, 0,
			       "needs crun's store extension version %u", STORE_EXT_VERSION_FOLD);
	req.keys = s->conn->kv;
	TRY(call(s->conn, &req, n, op_deadline(s->conn, 0), &rep));
	it = rep.items;
	for (i = 0; i < n; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		if (dup_bytes(s->conn, "MULTI_GET", &b, &ret_vals[i], &ret_lens[i]) < 0)
			break;
	}
	conn_trim(s->conn);
	if (i == n)
		return 0;
	while (i--)
		free(ret_vals[i]);
	return CRUN_ENOMEM;
}

CRUN_API int crun_store_multi_set(crun_store_t *s, const char *const *keys, const void *const *vals,
				  const size_t *lens, size_t n)
{
	struct store_req req = {.op = STORE_OP_MULTI_SET, .nitems = n};
	struct store_bytes *vb;
	int r;

	TRY(key_list(s, STORE_OP_MULTI_SET, keys, n));
	if (n && (!vals || !lens))
		return set_err(s->conn, CRUN_EINVAL, "MULTI_SET", NULL, 0, "NULL value arrays");
	vb = calloc(n ? n : 1, sizeof(*vb));
	if (!vb)
		return set_err(s->conn, CRUN_ENOMEM, "MULTI_SET", NULL, 0, "out of memory");
	for (size_t i = 0; i < n; i++) {
		r = check_val(s->conn, "MULTI_SET", vals[i], lens[i]);
		if (r < 0)
			goto out_free;
		vb[i] = (struct store_bytes){vals[i], lens[i]};
	}
	req.keys = s->conn->kv;
	req.vals = vb;
	r = call(s->conn, &req, 0, op_deadline(s->conn, 0), NULL);
out_free:
	free(vb);
	return r;
}

CRUN_API int crun_store_ping(crun_store_t *s, uint64_t *ret_rtt_us)
{
	struct store_req req = {.op = STORE_OP_PING};
	struct store_reply rep;
	uint64_t t0;

	if (!s)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_PING));
	req.u32 = next_rand(s->conn);
	t0 = clock_now_us();
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (rep.u32 != req.u32) {
		conn_break(s->conn);
		return set_err(s->conn, CRUN_EPROTO, "PING", NULL, 0, "nonce %08x echoed as %08x",
			       req.u32, rep.u32);
	}
	if (ret_rtt_us)
		*ret_rtt_us = clock_now_us() - t0;
	return 0;
}

CRUN_API int crun_store_queue_pop(crun_store_t *s, const char *key, int block, uint32_t timeout_ms,
				  void **ret_val, size_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_QUEUE_POP};
	struct store_reply rep;
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_QUEUE_POP, key, false));
	if (!ret_val)
		return set_err(s->conn, CRUN_EINVAL, "QUEUE_POP", NULL, 0, "NULL ret_val");
	deadline = op_deadline(s->conn, timeout_ms);
	if (block)
		TRY(do_wait(s->conn, 1, deadline));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, deadline, &rep));
	if (rep.num <= 0)
		return set_err(s->conn, CRUN_ENOTFOUND, "QUEUE_POP", key, strlen(key),
			       "queue is empty");
	r = dup_bytes(s->conn, "QUEUE_POP", &rep.val, ret_val, ret_len);
	conn_trim(s->conn);
	return r;
}

CRUN_API int crun_store_queue_len(crun_store_t *s, const char *key, int64_t *ret_len)
{
	struct store_req req = {.op = STORE_OP_QUEUE_LEN};
	struct store_reply rep;

	TRY(one_key(s, STORE_OP_QUEUE_LEN, key, false));
	req.key = s->conn->kv[0];
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	if (ret_len)
		*ret_len = rep.num;
	return 0;
}

CRUN_API void crun_store_free_list(char **list, size_t n)
{
	if (!list)
		return;
	for (size_t i = 0; i < n; i++)
		free(list[i]);
	free(list);
}

CRUN_API int crun_store_list_keys(crun_store_t *s, char ***ret_keys, size_t *ret_n)
{
	struct store_req req = {.op = STORE_OP_LIST_KEYS};
	struct store_reply rep;
	const uint8_t *it;
	char **list;
	size_t n = 0;

	if (!s || !ret_keys || !ret_n)
		return CRUN_EINVAL;
	TRY(enter(s, STORE_OP_LIST_KEYS));
	TRY(call(s->conn, &req, 0, op_deadline(s->conn, 0), &rep));
	/* The decoder has checked every string lies within the reply, so
	 * nitems bounds the list by the reply's size. */
	list = calloc(rep.nitems ? rep.nitems : 1, sizeof(*list));
	if (!list)
		return set_err(s->conn, CRUN_ENOMEM, "LIST_KEYS", NULL, 0, "out of memory");
	it = rep.items;
	for (uint64_t i = 0; i < rep.nitems; i++) {
		struct store_bytes b;

		store_items_next(&it, &b);
		/* Like PyTorch: keep keys under our prefix, return them without it
		 * (which also hides the raw "init/" key). */
		if (b.len < s->pfx_len || memcmp(b.p, s->pfx, s->pfx_len))
			continue;
		list[n] = malloc(b.len - s->pfx_len + 1);
		if (!list[n]) {
			crun_store_free_list(list, n);
			return set_err(s->conn, CRUN_ENOMEM, "LIST_KEYS", NULL, 0, "out of memory");
		}
		memcpy(list[n], b.p + s->pfx_len, b.len - s->pfx_len);
		list[n][b.len - s->pfx_len] = '\0';
		n++;
	}
	conn_trim(s->conn);
	*ret_keys = list;
	*ret_n = n;
	return 0;
}

CRUN_API int crun_store_barrier(crun_store_t *s, const char *key, int64_t world_size,
				uint32_t timeout_ms)
{
	struct store_req req = {.op = STORE_OP_BARRIER, .num = world_size};
	uint64_t deadline;
	int r;

	TRY(one_key(s, STORE_OP_BARRIER, key, false));
	if (world_size <= 0)
		return set_err(s->conn, CRUN_EINVAL, "BARRIER", key, strlen(key), "world size %lld",
			       (long long)world_size);
	deadline = op_deadline(s->conn, timeout_ms);
	req.key = s->conn->kv[0];
	r = conn_send_req(s->conn, &req, deadline);
	if (r < 0) /* not retry_safe: fails, saying so */
		return lost(s->conn, r, STORE_OP_BARRIER, &req.key, 1, deadline);
	return await_wake(s->conn, STORE_OP_BARRIER, &req.key, deadline);
}

/* ---- crun's extension ops (store/store_ext.h) -------------------------------- */

/* One extension call with HELLO first where the socket has not had it, and
 * the reconnect rules of the top of the file: every extension op but
 * LEASE_GRANT is safe to send twice (a second GRANT would leave an orphan
 * lease whose expiry reports a failure that did not happen); a second REVOKE
 * of a lease the first one ended answers "no such lease". */
static int ext_call_val(struct crun_store *s, const struct store_ext_req *q, uint8_t *rep,
			void **ret_val, size_t *ret_len)
{
	struct client_conn *c = s->conn;
	const char *name = store_ext_op_name(q->op);
	uint64_t deadline = op_deadline(c, 0);
	/* TICKET counts like ADD: a second one would draw a second ticket. */
	bool again = q->op != STORE_EXT_LEASE_GRANT && q->op != STORE_EXT_GRANT_SET &&
		     q->op != STORE_EXT_TICKET;
	int r;

	for (unsigned tries = 1;; tries++) {
		bool hello = false;

		if (c->broken)
			TRY(conn_revive(c, name, deadline));
		if (!c->ext) {
			hello = true;
			r = ext_hello(c, deadline);
		} else {
			r = 0;
		}
		if (r == 0 && c->ext_version < store_ext_op_version(q->op))
			return set_err(c, CRUN_ENOTSUP, name, NULL, 0,
				       "the server's extension is version %u", c->ext_version);
		if (r == 0)
			r = ext_rpc_val(c, q, rep, deadline, ret_val, ret_len);
		if (r == 0)
			return 0;
		if (!c->broken) /* nothing was sent */
			return set_err(c, r, name, NULL, 0, "%s", cause_text(c, r));
		if (hello && !c->ext_used && r == CRUN_ECLOSED)
			/* A version-4 op has an older sequence to fall back to. */
			return set_err(
			    c,
			    store_ext_op_version(q->op) >= STORE_EXT_VERSION_FOLD ? CRUN_ENOTSUP
										  : r,
			    name, NULL, 0, "closed by the server (no crun extension support?)");
		if (!c->reconnect_ms || !transient(r))
			return set_err(c, r, name, NULL, 0, "%s", cause_text(c, r));
		if (!again)
			return set_err(c, r, name, NULL, 0,
				       "%s with the request in flight; not sent again (a lease may "
				       "have been granted; it expires on its own)",
				       cause_text(c, r));
		if (tries >= SEND_TRIES || poll_ms(deadline) == 0)
			return set_err(c, r, name, NULL, 0, "%s (sent %u times)", cause_text(c, r),
				       tries);
		(void)snprintf(c->broke, sizeof(c->broke), "%s: %s", name, cause_text(c, r));
		c->broke_r = r;
	}
}

static int ext_call(struct crun_store *s, const struct store_ext_req *q, uint8_t *rep)
{
	return ext_call_val(s, q, rep, NULL, NULL);
}

/* A status reply: 0, or CRUN_ENOTFOUND (and the handle forgets the lease). */
static int ext_status(struct crun_store *s, const char *op, uint64_t id, uint8_t st)
{
	if (st == STORE_EXT_OK)
		return 0;
	lease_forget(s->conn, id);
	return set_err(s->conn, CRUN_ENOTFOUND, op, NULL, 0,
		       "no such lease %016llx (expired, revoked, or held elsewhere)",
		       (unsigned long long)id);
}

/* LEASE_GRANT, or GRANT_SET with key (non-NULL) set to val under the lease. */
static int grant(crun_store_t *s, uint32_t ttl_ms, const char *expiry_key, const void *expiry_val,
		 size_t expiry_len, const char *key, const void *val, size_t len, uint64_t *ret_id)
{
	struct store_ext_req q = {.op = key ? STORE_EXT_GRANT_SET : STORE_EXT_LEASE_GRANT,
				  .ttl_ms = ttl_ms};
	const char *op = store_ext_op_name(q.op);
	const char *keys[2] = {expiry_key ? expiry_key : key, key};
	uint8_t rep[8];

	if (!s || !ret_id || ttl_ms < 1 || ttl_ms > STORE_EXT_TTL_MAX)
		return CRUN_EINVAL;
	if (key)
		TRY(check_val(s->conn, op, val, len));
	if (expiry_key)
		TRY(check_val(s->conn, op, expiry_val, expiry_len));
	if (expiry_key || key)
		TRY(mangle(s, op, expiry_key ? keys : keys + 1, expiry_key && key ? 2 : 1, false));
	if (expiry_key) {
		q.key = s->conn->kv[0];
		q.val = (struct store_bytes){expiry_val, expiry_len};
	}
	if (key) {
		q.key2 = s->conn->kv[expiry_key ? 1 : 0];
		q.val2 = (struct store_bytes){val, len};
	}
	TRY(ext_call(s, &q, rep));
	*ret_id = store_get_u64(rep);
	lease_note(s->conn, *ret_id);
	return 0;
}

CRUN_API int crun_store_lease_grant(crun_store_t *s, uint32_t ttl_ms, const char *expiry_key,
				    const void *expiry_val, size_t expiry_len, uint64_t *ret_id)
{
	return grant(s, ttl_ms, expiry_key, expiry_val, expiry_len, NULL, NULL, 0, ret_id);
}

int store_client_grant_set(struct crun_store *s, uint32_t ttl_ms, const char *expiry_key,
			   const void *expiry_val, size_t expiry_len, const char *key,
			   const void *val, size_t len, uint64_t *ret_id)
{
	if (!key)
		return CRUN_EINVAL;
	return grant(s, ttl_ms, expiry_key, expiry_val, expiry_len, key, val, len, ret_id);
}

int store_client_try_get(struct crun_store *s, const char *key, void **ret_val, size_t *ret_len)
{
	struct store_ext_req q = {.op = STORE_EXT_TRY_GET};
	uint8_t rep[9];
	void *v = NULL;

	if (!s || !key || !ret_val)
		return CRUN_EINVAL;
	TRY(mangle(s, "TRY_GET", &key, 1, false));
	q.key = s->conn->kv[0];
	TRY(ext_call_val(s, &q, rep, &v, ret_len));
	if (rep[0] == 0) {
		free(v);
		return CRUN_ENOTFOUND;
	}
	*ret_val = v;
	return 0;
}

int store_client_ticket(struct crun_store *s, const char *counter, const char *prefix,
			const void *val, size_t len, int64_t *ret_t)
{
	struct store_ext_req q = {.op = STORE_EXT_TICKET};
	const char *keys[2] = {counter, prefix};
	uint8_t rep[8];

	if (!s || !counter || !prefix || !ret_t)
		return CRUN_EINVAL;
	TRY(check_val(s->conn, "TICKET", val, len));
	TRY(mangle(s, "TICKET", keys, 2, false));
	q.key = s->conn->kv[0];
	q.key2 = s->conn->kv[1];
	q.val = (struct store_bytes){val, len};
	TRY(ext_call(s, &q, rep));
	*ret_t = (int64_t)store_get_u64(rep);
	return 0;
}

CRUN_API int crun_store_lease_keepalive(crun_store_t *s, uint64_t id)
{
	struct store_ext_req q = {.op = STORE_EXT_LEASE_KEEPALIVE, .id = id};
	uint8_t rep[1];

	if (!s)
		return CRUN_EINVAL;
	TRY(ext_call(s, &q, rep));
	return ext_status(s, "LEASE_KEEPALIVE", id, rep[0]);
}

CRUN_API int crun_store_lease_attach(crun_store_t *s, uint64_t id)
{
	struct store_ext_req q = {.op = STORE_EXT_LEASE_ATTACH, .id = id};
	uint8_t rep[1];

	if (!s)
		return CRUN_EINVAL;
	if (s->conn->ext && s->conn->ext_version < STORE_EXT_VERSION_ATTACH)
		return set_err(s->conn, CRUN_ENOTSUP, "LEASE_ATTACH", NULL, 0,
			       "the server's extension is version %u", s->conn->ext_version);
	TRY(ext_call(s, &q, rep));
	TRY(ext_status(s, "LEASE_ATTACH", id, rep[0]));
	lease_note(s->conn, id);
	return 0;
}

CRUN_API int crun_store_lease_revoke(crun_store_t *s, uint64_t id)
{
	struct store_ext_req q = {.op = STORE_EXT_LEASE_REVOKE, .id = id};
	uint8_t rep[1];

	if (!s)
		return CRUN_EINVAL;
	TRY(ext_call(s, &q, rep));
	lease_forget(s->conn, id);
	return ext_status(s, "LEASE_REVOKE", id, rep[0]);
}

CRUN_API int crun_store_set_leased(crun_store_t *s, uint64_t id, const char *key, const void *val,
				   size_t len)
{
	struct store_ext_req q = {.op = STORE_EXT_SET_LEASED, .id = id};
	uint8_t rep[1];

	if (!s || !key)
		return CRUN_EINVAL;
	TRY(check_val(s->conn, "SET_LEASED", val, len));
	TRY(mangle(s, "SET_LEASED", &key, 1, false));
	q.key = s->conn->kv[0];
	q.val = (struct store_bytes){val, len};
	TRY(ext_call(s, &q, rep));
	return ext_status(s, "SET_LEASED", id, rep[0]);
}

/* ---- WAIT_ANY (store_ext.h) ------------------------------------------------------ */

/* Reads n raw bytes of a reply into b. */
static int read_raw(struct client_conn *c, uint8_t *b, size_t n, uint64_t deadline)
{
	while (c->rlen - c->rpos < n)
		TRY(conn_fill(c, deadline));
	memcpy(b, c->rbuf + c->rpos, n);
	c->rpos += n;
	return 0;
}

/* Where a WAIT_ANY's wake goes: the index, and for WAIT_ANY_GET (val
 * non-NULL) the key's value. */
struct any_out {
	size_t *idx;
	void **val;
	size_t *len;
	bool timed_out;	 /* WAIT_ANY_GET: the server's timeout answered (index n) */
	bool with;	 /* WAIT_ANY_GET_WITH: the with_key's value follows */
	void **with_val; /* its value, NULL when absent */
};

/* The wake of a WAIT_ANY after its STOP_WAITING: the index (and value). */
static int read_any_wake(struct client_conn *c, size_t n, uint64_t deadline, struct any_out *o)
{
	uint8_t b[8];
	uint64_t idx;
	void *v = NULL;

	TRY(read_raw(c, b, 8, deadline));
	idx = store_get_u64(b);
	if (idx > n || (idx == n && !o->val))
		return CRUN_EPROTO;
	if (o->val) {
		TRY(read_raw(c, b, 8, deadline));
		TRY(read_tail(c, b, deadline, &v, o->len));
	}
	if (o->with) {
		void *w = NULL;
		uint8_t found;
		int r = read_raw(c, &found, 1, deadline);

		if (r == 0)
			r = read_raw(c, b, 8, deadline);
		if (r == 0)
			r = read_tail(c, b, deadline, &w, NULL);
		if (r < 0 || found > 1) {
			free(v);
			return r < 0 ? r : CRUN_EPROTO;
		}
		if (found && idx < n)
			*o->with_val = w;
		else
			free(w);
	}
	o->timed_out = idx == n;
	if (o->val && !o->timed_out)
		*o->val = v;
	else
		free(v);
	*o->idx = (size_t)idx;
	confirm(c);
	return 0;
}

/* Like await_wake: a timeout cancels the wait and keeps the stream in sync;
 * a wake that raced the cancel is a wake (a key exists). */
static int await_any(struct client_conn *c, size_t n, uint64_t deadline, struct any_out *o)
{
	struct store_req cancel = {.op = STORE_OP_CANCEL_WAIT};
	uint8_t st;
	int r = conn_error_reply(c, deadline);
	bool woke = false;

	if (r == 0)
		r = read_raw(c, &st, 1, deadline);

	if (r == 0)
		return st == STORE_WAIT_STOP_WAITING ? read_any_wake(c, n, deadline, o)
						     : CRUN_EPROTO;
	if (r != CRUN_ETIMEDOUT)
		return r;
	deadline =
	    deadline_after(c->timeout_ms ? MIN(CANCEL_REPLY_MS, c->timeout_ms) : CANCEL_REPLY_MS);
	r = conn_send_req(c, &cancel, deadline);
	for (int i = 0; r == 0 && i < 2; i++) {
		r = read_raw(c, &st, 1, deadline);
		if (r == 0 && st == STORE_WAIT_CANCELED) {
			confirm(c);
			return woke ? 0 : CRUN_ETIMEDOUT;
		}
		if (r == 0 && st == STORE_WAIT_STOP_WAITING && !woke) {
			woke = true;
			r = read_any_wake(c, n, deadline, o);
		} else if (r == 0) {
			r = CRUN_EPROTO;
		}
	}
	conn_break(c); /* the stream is out of step */
	return r < 0 ? r : CRUN_EPROTO;
}

/* A server-side timeout comes this long before the client's own deadline,
 * which cancels the wait only when the server is late. */
#define ANY_SERVER_SLACK_MS 1000u

static int wait_any(struct crun_store *s, const char *const *keys, size_t n, uint32_t timeout_ms,
		    uint64_t keep, struct any_out *o)
{
	struct store_ext_req q = {.op = o->with	 ? STORE_EXT_WAIT_ANY_GET_WITH
					: o->val ? STORE_EXT_WAIT_ANY_GET
						 : STORE_EXT_WAIT_ANY,
				  .nitems = n,
				  .id = keep};
	const char *name = store_ext_op_name(q.op);
	struct client_conn *c;
	uint64_t deadline;
	size_t len;
	int r;

	if (!s || !o->idx || n == 0)
		return CRUN_EINVAL;
	TRY(key_list(s, STORE_OP_WAIT, keys, n + o->with)); /* the with_key last */
	c = s->conn;
	deadline = op_deadline(c, timeout_ms);
	if (o->val) { /* the server answers the timeout itself (store_ext.h) */
		q.wait_ms = timeout_ms ? timeout_ms : c->timeout_ms;
		deadline += MIN(q.wait_ms, ANY_SERVER_SLACK_MS);
	}
	for (unsigned tries = 1;; tries++) {
		if (c->broken)
			TRY(conn_revive(c, name, deadline));
		bool hello = !c->ext;

		r = hello ? ext_hello(c, deadline) : 0;
		if (hello && r == CRUN_ECLOSED && !c->ext_used)
			return set_err(c, CRUN_ENOTSUP, name, NULL, 0,
				       "closed by the server (no crun extension support?)");
		if (r == 0 && c->ext_version < store_ext_op_version(q.op))
			return set_err(c, CRUN_ENOTSUP, name, NULL, 0,
				       "the server's extension is version %u", c->ext_version);
		q.keys = c->kv;
		if (o->with)
			q.key2 = c->kv[n];
		if (r == 0 && grow((void **)&c->wbuf, &c->wcap, store_ext_req_size(&q), 1) < 0)
			return CRUN_ENOMEM;
		if (r == 0)
			r = store_ext_encode_req(&q, c->wbuf, c->wcap, &len);
		if (r == 0) {
			r = send_all(c, c->wbuf, len, deadline);
			wbuf_trim(c);
		}
		if (r == 0)
			r = await_any(c, n, deadline, o);
		if (r == 0 && o->timed_out)
			return set_err(c, CRUN_ETIMEDOUT, name, c->kv[0].p, c->kv[0].len,
				       "timed out (by the server)");
		if (r == 0)
			return 0;
		if (r == CRUN_ETIMEDOUT && !c->broken)
			return set_err(c, r, name, c->kv[0].p, c->kv[0].len,
				       "timed out (wait canceled)");
		TRY(lost(c, r, STORE_OP_WAIT, &c->kv[0], tries, deadline));
	}
}

int store_client_wait_any(struct crun_store *s, const char *const *keys, size_t n,
			  uint32_t timeout_ms, size_t *ret_idx)
{
	struct any_out o = {ret_idx, NULL, NULL, false, false, NULL};

	return wait_any(s, keys, n, timeout_ms, 0, &o);
}

int store_client_wait_any_get(struct crun_store *s, const char *const *keys, size_t n,
			      uint32_t timeout_ms, uint64_t keep, size_t *ret_idx, void **ret_val,
			      size_t *ret_len)
{
	struct any_out o = {ret_idx, ret_val, ret_len, false, false, NULL};

	if (!ret_val)
		return CRUN_EINVAL;
	return wait_any(s, keys, n, timeout_ms, keep, &o);
}

int store_client_wait_any_get_with(struct crun_store *s, const char *const *keys, size_t n,
				   const char *with_key, uint32_t timeout_ms, uint64_t keep,
				   size_t *ret_idx, void **ret_val, void **ret_with)
{
	const char **all = NULL;
	struct any_out o = {ret_idx, ret_val, NULL, false, true, ret_with};
	int r;

	if (!ret_val || !ret_with || !with_key || !keys || n == 0 || n >= SIZE_MAX / sizeof(*all))
		return CRUN_EINVAL;
	all = malloc((n + 1) * sizeof(*all));
	if (!all)
		return CRUN_ENOMEM;
	memcpy(all, keys, n * sizeof(*all));
	all[n] = with_key;
	*ret_with = NULL;
	r = wait_any(s, all, n, timeout_ms, keep, &o);
	free(all);
	return r;
}
