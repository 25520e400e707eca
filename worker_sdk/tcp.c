/* tcp.c: the TCP transport between hosts (or between any ranks when
 * CRUN_PG_TRANSPORT=tcp). Each rank listens on an ephemeral port, publishes
 * "addr:port" in the store, connects to every lower TCP peer and accepts
 * every higher one: one full-duplex, non-blocking, TCP_NODELAY socket per
 * pair. A hello frame (magic, group rank) says who connected; incoming
 * connections are read concurrently, each with a short hello deadline, so a
 * stranger that connects and stays silent cannot stall group creation.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "store/auth.h"
#include "worker_sdk/worker.h"

#define TCP_MAGIC	0x63727470u /* "crtp" */
#define TCP_STAGE_BYTES (256u * 1024)
#define TCP_AUTH_MS	5000 /* one stranger may stall the accept loop this long */

/* With $CRUN_AUTH_SECRET_FILE (the job's secret, store/auth.h) every mesh
 * connection runs the HMAC challenge/response right after its hello: the
 * listening rank challenges, the dialing rank answers, each proves the
 * secret to the other, so a stranger can neither join the group nor feed it
 * data. 1 with *ret filled, 0 without a secret, or a negative code. */
static int mesh_secret(struct crun_pg *pg, struct store_auth_secret *ret)
{
	const char *path = getenv("CRUN_AUTH_SECRET_FILE");
	char err[600];
	int r;

	if (!path || !*path)
		return 0;
	r = store_auth_secret_read(path, ret, err, sizeof(err));
	if (r < 0) {
		log_at(LL_DEBUG, SUB_PG, "rank %d: %s", pg->rank, err);
		return r;
	}
	return 1;
}
/* An accepted connection must say who it is within this (peers send their
 * hello right after connecting; generous for a loaded host)... */
#define TCP_HELLO_MS 10000u
/* ...and at most this many wait for it at a time. */
#define TCP_HELLO_PENDING 64

/* The address peers should dial: CRUN_PG_ADDR, else the local address the
 * kernel would use to reach the store host (a UDP connect sends nothing). */
static int local_addr(char *buf, size_t cap)
{
	const char *env = getenv("CRUN_PG_ADDR");
	const char *master = getenv("MASTER_ADDR");
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM};
	struct addrinfo *ai = NULL;
	struct sockaddr_in sin;
	socklen_t sl = sizeof(sin);
	int fd, r = CRUN_ERESOLVE;

	if (env && *env)
		return pg_fmt(buf, cap, "%s", env);
	if (!master || !*master)
		master = "127.0.0.1";
	if (getaddrinfo(master, "9", &hints, &ai) != 0 || !ai)
		return CRUN_ERESOLVE;
	fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sin, &sl) == 0 &&
	    inet_ntop(AF_INET, &sin.sin_addr, buf, (socklen_t)cap))
		r = 0;
	if (fd >= 0)
		fd_close(fd);
	freeaddrinfo(ai);
	return r;
}

/* Small collectives are latency-bound: no Nagle. Buffer sizes are left to
 * the kernel's autotuning (a fixed SO_RCVBUF would switch it off and cap the
 * window at net.core.rmem_max). */
static void tune(int fd)
{
	int one = 1;

	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Blocking I/O with a deadline, for the hello frames only. */
static int io_full(int fd, void *buf, size_t len, int rd, uint64_t deadline_ms)
{
	size_t done = 0;

	while (done < len) {
		struct pollfd pfd = {.fd = fd, .events = rd ? POLLIN : POLLOUT};
		uint64_t now = clock_now_ms();
		ssize_t n;

		if (now >= deadline_ms)
			return CRUN_ETIMEDOUT;
		if (poll(&pfd, 1, (int)MIN(deadline_ms - now, 1000u)) <= 0)
			continue;
		n = rd ? recv(fd, (uint8_t *)buf + done, len - done, MSG_DONTWAIT)
		       : send(fd, (uint8_t *)buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n == 0)
			return CRUN_EPEER;
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				continue;
			return CRUN_EPEER;
		}
		done += (size_t)n;
	}
	return 0;
}

static int dial(const char *hostport, uint64_t deadline_ms, int *ret_fd)
{
	char host[128];
	uint16_t port = 0;
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai = NULL;
	char sport[8];
	int fd, r;

	TRY(parse_host_port(hostport, 0, host, sizeof(host), &port));
	TRY(pg_fmt(sport, sizeof(sport), "%u", port));
	if (getaddrinfo(host, sport, &hints, &ai) != 0 || !ai)
		return CRUN_ERESOLVE;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		r = -errno;
		goto out;
	}
	tune(fd);
	r = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS ? 0 : -errno;
	if (r == 0) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		int err = 0;
		socklen_t el = sizeof(err);
		uint64_t now = clock_now_ms();

		if (poll(&pfd, 1, now < deadline_ms ? (int)(deadline_ms - now) : 0) <= 0)
			r = CRUN_ETIMEDOUT;
		else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err)
			r = err ? -err : CRUN_EPEER;
	}
	if (r < 0) {
		fd_close(fd);
		goto out;
	}
	*ret_fd = fd;
out:
	freeaddrinfo(ai);
	return r;
}

static int do_listen(int *ret_fd, uint16_t *ret_port, const char *addr, int backlog)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sin);
	int fd;

	if (inet_pton(AF_INET, addr, &sin.sin_addr) != 1)
		sin.sin_addr.s_addr = htonl(INADDR_ANY);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, backlog) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sin, &sl) < 0) {
		int r = -errno;

		fd_close(fd);
		return r;
	}
	*ret_fd = fd;
	*ret_port = ntohs(sin.sin_port);
	return 0;
}

/* One incoming connection that has not said who it is yet. */
struct hello_wait {
	int fd;
	uint64_t deadline_ms; /* TCP_HELLO_MS after accept, at most the setup's */
	size_t got;
	uint32_t hello[2];
};

/* Reads what c's hello has so far. 1: complete, 0: not yet, < 0: gone. */
static int hello_read(struct hello_wait *h)
{
	ssize_t n =
	    recv(h->fd, (uint8_t *)h->hello + h->got, sizeof(h->hello) - h->got, MSG_DONTWAIT);

	if (n == 0)
		return CRUN_EPEER;
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : CRUN_EPEER;
	h->got += (size_t)n;
	return h->got == sizeof(h->hello);
}

/* A complete hello from a higher TCP peer we still lack: take its fd. With
 * a secret the peer must then pass the challenge (at most TCP_AUTH_MS: a
 * stranger with a plausible hello stalls the others that long, once). */
static bool hello_take(struct crun_pg *pg, const struct hello_wait *h,
		       const struct store_auth_secret *sec)
{
	uint32_t r = h->hello[1];
	char why[300];

	if (h->hello[0] != TCP_MAGIC || r <= (uint32_t)pg->rank || r >= (uint32_t)pg->size ||
	    pg->peers[r].kind != PEER_TCP || pg->peers[r].fd >= 0)
		return false; /* a stranger or a duplicate: not one of ours */
	if (sec && store_auth_mesh_server_run(h->fd, sec, clock_now_ms() + TCP_AUTH_MS, why,
					      sizeof(why)) < 0) {
		log_at(LL_DEBUG, SUB_PG, "rank %d: mesh peer claiming rank %u refused: %s",
		       pg->rank, r, why);
		return false;
	}
	pg->peers[r].fd = h->fd;
	return true;
}

/* Accepts the `expect` higher peers. Every incoming connection is read
 * concurrently with its own short hello deadline, so one that sends nothing
 * (a port scanner) costs a slot for TCP_HELLO_MS, not the whole setup. At
 * most TCP_HELLO_PENDING wait at once; a flood evicts the oldest. */
static int accept_peers(struct crun_pg *pg, int lfd, int expect, uint64_t deadline_ms,
			const struct store_auth_secret *sec)
{
	struct hello_wait hw[TCP_HELLO_PENDING];
	struct pollfd pfd[TCP_HELLO_PENDING + 1];
	int np = 0, r = 0;

	while (expect > 0) {
		uint64_t now = clock_now_ms(), next = deadline_ms;

		if (now >= deadline_ms) {
			r = CRUN_ETIMEDOUT;
			break;
		}
		pfd[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
		for (int i = 0; i < np; i++) {
			pfd[i + 1] = (struct pollfd){.fd = hw[i].fd, .events = POLLIN};
			next = MIN(next, hw[i].deadline_ms);
		}
		if (poll(pfd, (nfds_t)np + 1, next > now ? (int)MIN(next - now, 1000u) : 0) < 0 &&
		    errno != EINTR)
			return -errno;
		now = clock_now_ms();
		/* Backwards: removing i moves the last (already seen) into i. */
		for (int i = np - 1; i >= 0; i--) {
			int got = pfd[i + 1].revents ? hello_read(&hw[i]) : 0;

			if (got == 1 && hello_take(pg, &hw[i], sec))
				expect--;
			else if (got != 0 || now >= hw[i].deadline_ms)
				fd_close(hw[i].fd);
			else
				continue;
			hw[i] = hw[--np];
		}
		for (int k = 0; k < TCP_HELLO_PENDING && (pfd[0].revents & POLLIN); k++) {
			int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

			if (fd < 0)
				break;
			tune(fd);
			if (np == TCP_HELLO_PENDING) {
				fd_close(hw[0].fd); /* the oldest: closest to its deadline */
				hw[0] = hw[--np];
			}
			hw[np++] =
			    (struct hello_wait){fd, MIN(now + TCP_HELLO_MS, deadline_ms), 0, {0}};
		}
	}
	while (np > 0)
		fd_close(hw[--np].fd);
	return r;
}

int pg_tcp_setup(struct crun_pg *pg, crun_store_t *st, const char *ns, const int *is_tcp)
{
	uint32_t tmo = atomic_load(&pg->timeout_ms);
	uint64_t deadline = clock_now_ms() + (tmo ? tmo : PG_DEFAULT_TIMEOUT_MS);
	char addr[64], key[256], val[128];
	struct store_auth_secret sec;
	int lfd = -1, higher = 0, r, have_sec;
	uint16_t port = 0;

	have_sec = mesh_secret(pg, &sec);
	if (have_sec < 0)
		return have_sec;

	for (int p = 0; p < pg->size; p++) {
		if (!is_tcp[p])
			continue;
		pg->peers[p].kind = PEER_TCP;
		pg->peers[p].stage = malloc(TCP_STAGE_BYTES);
		if (!pg->peers[p].stage)
			return CRUN_ENOMEM;
		higher += p > pg->rank;
	}
	if (higher) {
		TRY(local_addr(addr, sizeof(addr)));
		TRY(do_listen(&lfd, &port, addr, pg->size));
		r = pg_fmt(val, sizeof(val), "%s:%u", addr, port);
		if (r == 0)
			r = pg_fmt(key, sizeof(key), "%stcp/%d", ns, pg->rank);
		if (r == 0)
			r = crun_store_set(st, key, val, strlen(val));
		if (r < 0)
			goto out;
	}
	/* Lower peers listen before they publish, so connects complete in
	 * their backlog even before they get round to accept(). */
	for (int p = 0; p < pg->rank; p++) {
		uint32_t hello[2] = {TCP_MAGIC, (uint32_t)pg->rank};
		void *v;
		size_t vlen;

		if (!is_tcp[p])
			continue;
		r = pg_fmt(key, sizeof(key), "%stcp/%d", ns, p);
		if (r == 0)
			r = crun_store_get(st, key, 0, &v, &vlen);
		if (r < 0)
			goto out;
		r = dial(v, deadline, &pg->peers[p].fd);
		crun_free(v);
		if (r == 0)
			r = io_full(pg->peers[p].fd, hello, sizeof(hello), 0, deadline);
		if (r == 0 && have_sec) {
			char why[300];

			r = store_auth_mesh_client_run(pg->peers[p].fd, &sec, deadline, why,
						       sizeof(why));
			if (r < 0)
				log_at(LL_DEBUG, SUB_PG, "rank %d: mesh peer %d: %s", pg->rank, p,
				       why);
		}
		if (r < 0)
			goto out;
	}
	r = higher ? accept_peers(pg, lfd, higher, deadline, have_sec ? &sec : NULL) : 0;
out:
	if (lfd >= 0)
		fd_close(lfd);
	memset(&sec, 0, sizeof(sec));
	return r;
}

void pg_tcp_release(struct crun_pg *pg)
{
	for (int p = 0; p < pg->size; p++) {
		struct pg_peer *peer = &pg->peers[p];

		if (peer->fd >= 0)
			fd_close(peer->fd);
		peer->fd = -1;
		free(peer->stage);
		peer->stage = NULL;
	}
}

ssize_t pg_tcp_progress(struct crun_pg *pg, struct xfer *x)
{
	struct pg_peer *p = &pg->peers[x->peer];
	size_t esz, want, whole;
	ssize_t n;

	if (x->dir == XF_SEND)
		n = send(p->fd, x->buf + x->done, x->len - x->done, MSG_DONTWAIT | MSG_NOSIGNAL);
	else if (x->dir == XF_RECV)
		n = recv(p->fd, x->buf + x->done, x->len - x->done, MSG_DONTWAIT);
	else {
		/* Receive into the staging buffer, reduce whole elements, keep
		 * a partial element's bytes for the next round. */
		want =
		    MIN((size_t)TCP_STAGE_BYTES - p->stage_fill, x->len - x->done - p->stage_fill);
		n = recv(p->fd, p->stage + p->stage_fill, want, MSG_DONTWAIT);
		if (n > 0) {
			esz = crun_dtype_size(x->dtype);
			p->stage_fill += (size_t)n;
			whole = p->stage_fill - p->stage_fill % esz;
			if (x->acc)
				memcpy(x->buf + x->done, x->acc + x->done, whole);
			(void)kernels_reduce(x->buf + x->done, p->stage, whole / esz, x->dtype,
					     x->op);
			x->done += whole;
			p->stage_fill -= whole;
			memmove(p->stage, p->stage + whole, p->stage_fill);
			return n;
		}
	}
	if (n == 0 && x->len)
		return CRUN_EPEER; /* orderly EOF mid-operation: the peer left */
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : CRUN_EPEER;
	if (x->dir != XF_RECV_REDUCE)
		x->done += (size_t)n;
	return n;
}
