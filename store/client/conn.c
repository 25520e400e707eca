/* conn.c: the client's connection (client_int.h): the blocking transport,
 * plain or TLS, with poll() deadlines - shared with auth_io.c through
 * tls.h's store_io_* - the buffered reader and writer on it, and the
 * handle's last_error. An I/O failure drops the socket (client_break);
 * reconnecting is session.c's.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/client/client_int.h"
#include "store/tls.h"

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
int client_set_err(struct client_conn *c, int r, const char *op, const void *key, size_t key_len,
		   const char *fmt, ...)
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
		c->broke_ms = clock_now_ms();
	}
	log_at(LL_DEBUG, SUB_STORE, "%s", c->err);
	return r;
}

/* An I/O failure leaves an unknown number of reply bytes in flight: the
 * stream has no framing to resynchronise on, so the connection is dropped. */
void client_break(struct client_conn *c)
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

uint64_t client_deadline(uint32_t ms)
{
	return ms ? clock_now_ms() + ms : NO_DEADLINE;
}

int client_poll_ms(uint64_t deadline)
{
	uint64_t now;

	if (deadline == NO_DEADLINE)
		return -1;
	now = clock_now_ms();
	if (now >= deadline)
		return 0;
	return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* ---- the transport (tls.h's store_io_*, also auth_io.c's) ------------------ */

int store_io_wait(int fd, short events, uint64_t deadline_ms)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int ms = client_poll_ms(deadline_ms);
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

int store_io_send(int fd, struct store_tls_conn *tls, const void *buf, size_t len,
		  uint64_t deadline_ms)
{
	const uint8_t *p = buf;

	while (len > 0) {
		short ev = POLLOUT;
		ssize_t n = tls ? store_tls_write(tls, p, len, &ev)
				: send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (tls && n < 0) {
			if (n != CRUN_EAGAIN)
				return (int)n;
			TRY(store_io_wait(fd, ev, deadline_ms));
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
		TRY(store_io_wait(fd, POLLOUT, deadline_ms));
	}
	return 0;
}

long store_io_recv(int fd, struct store_tls_conn *tls, void *p, size_t cap, uint64_t deadline_ms)
{
	for (;;) {
		short ev = POLLIN;
		ssize_t n;
		int r;

		if (tls) {
			/* Read first: TLS may hold decrypted bytes the socket no
			 * longer shows as readable. */
			n = store_tls_read(tls, p, cap, &ev);
			if (n == CRUN_EAGAIN) {
				r = store_io_wait(fd, ev, deadline_ms);
				if (r < 0)
					return r;
				continue;
			}
			if (n < 0)
				return n;
		} else {
			r = store_io_wait(fd, POLLIN, deadline_ms);
			if (r < 0)
				return r;
			n = recv(fd, p, cap, MSG_DONTWAIT);
		}
		if (n > 0)
			return n;
		if (n == 0)
			return CRUN_ECLOSED;
		if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
	}
}

/* ---- the buffered reader and writer ------------------------------------------ */

int client_fill(struct client_conn *c, uint64_t deadline)
{
	long n;

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
	n = store_io_recv(c->fd, c->tls, c->rbuf + c->rlen, c->rcap - c->rlen, deadline);
	if (n < 0)
		return (int)n;
	c->rlen += (size_t)n;
	return 0;
}

/* A reply arrived. Replies come in request order: every write sent before
 * its request was applied, so nothing is left to replay. */
void client_confirm(struct client_conn *c)
{
	c->ulen = 0;
	c->lossy = NULL;
	c->replayed = false;
}

/* Where a reply starts: the server's ERROR instead of it (store_ext.h; only
 * a server of version 6 or more, which this client's HELLO named, sends
 * one) is CRUN_ENOSPC with its text kept for last_error; 0 when the bytes
 * are a reply, left unread; else the read's failure. */
int client_error_reply(struct client_conn *c, uint64_t deadline)
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
		TRY(client_fill(c, deadline));
	}
}

/* Reads one reply to `op`. *out points into the read buffer and stays valid
 * until the next read on this connection. */
int client_read_reply(struct client_conn *c, enum store_op op, uint64_t nitems, uint64_t deadline,
		      struct store_reply *out)
{
	TRY(client_error_reply(c, deadline));
	for (;;) {
		size_t used;
		int r;

		if (c->rlen > c->rpos) {
			r = store_proto_decode_reply(op, nitems, &c->lim, c->rbuf + c->rpos,
						     c->rlen - c->rpos, out, &used);
			if (r == 0) {
				c->rpos += used;
				client_confirm(c);
				return 0;
			}
			if (r != CRUN_EAGAIN)
				return CRUN_EPROTO; /* over a limit or malformed */
		}
		r = client_fill(c, deadline);
		if (r < 0)
			return r;
	}
}

void client_trim(struct client_conn *c)
{
	if (c->rpos == c->rlen && c->rcap > RBUF_KEEP) {
		free(c->rbuf);
		c->rbuf = NULL;
		c->rcap = c->rpos = c->rlen = 0;
	}
}

/* Frees a write buffer that a big request grew, as conn_trim does for reads. */
void client_wbuf_trim(struct client_conn *c)
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
	    client_grow((void **)&c->unacked, &c->ucap, c->ulen + len, 1) < 0) {
		c->lossy = store_proto_op_name(op);
		c->ulen = 0;
		return;
	}
	memcpy(c->unacked + c->ulen, p, len);
	c->ulen += len;
}

/* Encodes req into the connection's write buffer and sends it in one go. */
int client_send_req(struct client_conn *c, const struct store_req *req, uint64_t deadline)
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
	r = store_io_send(c->fd, c->tls, c->wbuf, len, deadline);
	if (r == 0 && store_proto_reply_kind(req->op) == STORE_REPLY_NONE)
		note_unacked(c, req->op, c->wbuf, len);
	client_wbuf_trim(c);
	return r;
}

const char *client_cause(const struct client_conn *c, int r)
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

uint32_t client_rand(struct client_conn *c)
{
	/* xorshift64*: only jitters the backoff and picks PING nonces. */
	c->rng ^= c->rng >> 12;
	c->rng ^= c->rng << 25;
	c->rng ^= c->rng >> 27;
	return (uint32_t)((c->rng * 0x2545F4914F6CDD1DULL) >> 32);
}

void client_conn_free(struct client_conn *c)
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

int client_grow(void **p, size_t *cap, size_t need, size_t elem)
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

/* Reads the value bytes that end a reply (their u64 length was the last of
 * the fixed part, lenb) into a fresh allocation with a NUL after them. */
int client_read_tail(struct client_conn *c, const uint8_t *lenb, uint64_t deadline, void **ret_val,
		     size_t *ret_len)
{
	uint64_t n = store_get_u64(lenb);
	uint8_t *p;

	if (n > c->lim.max_value_bytes)
		return CRUN_EPROTO;
	while (c->rlen - c->rpos < n)
		TRY(client_fill(c, deadline));
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
int client_ext_rpc_val(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		       uint64_t deadline, void **ret_val, size_t *ret_len)
{
	size_t need = store_ext_req_size(q), want = store_ext_reply_size(q->op), len;
	int r;

	if (client_grow((void **)&c->wbuf, &c->wcap, need, 1) < 0)
		return CRUN_ENOMEM;
	r = store_ext_encode_req(q, c->wbuf, c->wcap, &len);
	if (r < 0)
		return r;
	r = store_io_send(c->fd, c->tls, c->wbuf, len, deadline);
	client_wbuf_trim(c);
	if (r == 0 && want)
		r = client_error_reply(c, deadline);
	while (r == 0 && c->rlen - c->rpos < want)
		r = client_fill(c, deadline);
	if (r == 0) {
		memcpy(rep, c->rbuf + c->rpos, want);
		c->rpos += want;
	}
	if (r == 0 && ret_val)
		r = client_read_tail(c, rep + want - 8, deadline, ret_val, ret_len);
	if (r < 0) {
		client_break(c);
		return r;
	}
	client_confirm(c);
	client_trim(c);
	return 0;
}

int client_ext_rpc(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		   uint64_t deadline)
{
	return client_ext_rpc_val(c, q, rep, deadline, NULL, NULL);
}
