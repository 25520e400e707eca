/* linger.c: a gentle close for a client refused in its TLS handshake.
 *
 * Under TLS 1.3 the client's handshake ends before the server has checked
 * the client's certificate, so a client refused for it ("certificate
 * required", a certificate from another CA) has already sent records the
 * server will never read. close() on a socket with unread input sends a
 * reset, not a FIN, and a reset that reaches the client before its next send
 * fails that send: the client reports a broken connection and never reads
 * the alert that names the refusal (seen under load as "the server closed
 * every connection during the handshake"). So the socket outlives its
 * connection for a moment: its write side is shut (a FIN behind the alert)
 * and what the client still sends is read and dropped until it closes, for
 * LINGER_MS at most and LINGER_MAX_BYTES at most, then it is closed.
 *
 * A stranger gains nothing by it: at most LINGER_MAX sockets linger at a
 * time (past that, a plain close as before), each on one absolute deadline.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"

enum {
	LINGER_MAX = 64,	      /* sockets lingering at once, per server */
	LINGER_MS = 2000,	      /* from the refusal to the close, at most */
	LINGER_MAX_BYTES = 64 * 1024, /* read and dropped, at most */
};

struct store_linger {
	struct dl link; /* in store_server.lingering */
	struct store_server *srv;
	struct event *ev;
	int fd;
	size_t dropped;	      /* bytes read and thrown away */
	uint64_t deadline_ms; /* clock_now_ms() */
};

static void linger_end(struct store_linger *l)
{
	dl_del(&l->link);
	l->srv->n_lingering--;
	event_free(l->ev);
	close(l->fd);
	free(l);
}

/* Re-arms the read for what is left of l's time; false: none is left. */
static bool linger_arm(struct store_linger *l)
{
	uint64_t now = clock_now_ms();
	uint64_t left = l->deadline_ms > now ? l->deadline_ms - now : 0;
	struct timeval tv = {(time_t)(left / 1000), (suseconds_t)(left % 1000) * 1000};

	return left > 0 && event_add(l->ev, &tv) == 0;
}

static void linger_on_read(evutil_socket_t fd, short what, void *arg)
{
	struct store_linger *l = arg;
	char buf[4096];
	ssize_t n = 0;

	if (what & EV_READ) {
		/* A few reads per wake-up: the bound is on bytes, not on calls. */
		for (int i = 0; i < 4; i++) {
			n = recv(fd, buf, sizeof(buf), 0);
			if (n <= 0)
				break;
			l->dropped += (size_t)n;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
			n = 1; /* drained for now */
	}
	/* EOF (the client read the alert and closed), an error, the time or
	 * the byte bound: close now. */
	if (!(what & EV_READ) || n <= 0 || l->dropped >= LINGER_MAX_BYTES || !linger_arm(l))
		linger_end(l);
}

void store_linger_close(struct store_server *srv, int fd)
{
	struct store_linger *l = NULL;

	if (fd < 0)
		return;
	if (srv->n_lingering >= LINGER_MAX || shutdown(fd, SHUT_WR) < 0)
		goto close_now;
	l = calloc(1, sizeof(*l));
	if (!l)
		goto close_now;
	l->srv = srv;
	l->fd = fd;
	l->deadline_ms = clock_now_ms() + LINGER_MS;
	l->ev = event_new(srv->base, fd, EV_READ, linger_on_read, l);
	if (!l->ev || !linger_arm(l))
		goto close_now;
	dl_add_tail(&srv->lingering, &l->link);
	srv->n_lingering++;
	return;
close_now:
	if (l && l->ev)
		event_free(l->ev);
	free(l);
	close(fd);
}

void store_linger_free_all(struct store_server *srv)
{
	while (!DL_EMPTY(&srv->lingering))
		linger_end(DL_ENTRY(srv->lingering.next, struct store_linger, link));
}
