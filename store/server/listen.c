/* listen.c: the store server's listening socket and accepting: binding
 * (dual stack), the socket options accepted connections inherit, the
 * allowlist, max_conns and pre-auth refusals at accept, and the fd-limit
 * fallback (a spare fd given up to accept-and-close). An accepted socket
 * becomes a connection through conn.c (store_conn_new). Split out of server.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>

#include "common/common.h"
#include "store/server/server_int.h"

/* ---- listener -------------------------------------------------------------- */

/* Keepalive probes after keepalive_s of silence, 4 of them keepalive_s/6
 * apart; TCP_USER_TIMEOUT gives unacknowledged output the same time, so a
 * vanished host's connections go in about keepalive_s * 5/3. */
void store_sock_keepalive(int fd, uint32_t idle_s)
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
	store_sock_keepalive(fd, keepalive_s);
}

/* A refused client: accepted and closed at once (it sees EOF, not a connect
 * timeout), logged within the log budget. Takes ownership of fd. */
static void srv_refuse(struct store_server *srv, int fd, enum store_metric why)
{
	srv->metrics[why]++;
	srv->st.dropped_conns++;
	if (store_server_log_budget(srv))
		log_at(LL_WARN, SUB_STORE, "refusing a client: %s (%llu open)",
		       store_metric_help(why), (unsigned long long)srv->st.conns);
	close(fd);
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
		store_peer_name(fd, peer, sizeof(peer));
		if (store_server_log_budget(srv))
			log_at(LL_WARN, SUB_STORE, "refusing client %s: %s", peer,
			       store_metric_help(STORE_M_REFUSED_ALLOWLIST));
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
	c = store_conn_new(srv, fd);
	if (!c)
		return;
	if (store_server_gated(srv) && store_preauth_begin(c, sa) < 0) {
		store_conn_drop(c, STORE_M_DROP_OP_FAILED, "out of memory");
		return;
	}
	/* The gate (server_auth.c): a challenge out, one answer in, before
	 * any request is read; with TLS the bufferevent runs the handshake. */
	if (store_conn_auth_start(c) < 0) {
		store_conn_drop(c, STORE_M_DROP_OP_FAILED, "cannot start authentication");
		return;
	}
	store_conn_start(c);
	store_conn_flush(c); /* the challenge */
}

void store_server_on_accept_retry(evutil_socket_t fd, short what, void *arg)
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
	if (store_server_log_budget(srv))
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

/* store_server_new's listening socket: the spare fd, host:port bound, the
 * listener (server_int.h). */
int store_server_listen(struct store_server *srv, const struct store_server_config *cfg)
{
	int fd = -1, r;

	/* Best effort: without it, the fd limit pauses accepting instead. */
	srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	r = srv_listen(srv, cfg->host, cfg->port, &fd);
	if (r < 0) {
		log_at(LL_ERROR, SUB_STORE, "cannot listen on %s:%u: %s",
		       cfg->host && *cfg->host ? cfg->host : "*", cfg->port, crun_strerror(r));
		return r;
	}
	srv->port = fd_port(fd);
	listener_sockopts(fd, srv->cfg.keepalive_s);
	/* backlog 0: the socket already listens. accept4 with CLOEXEC. */
	srv->lsn = evconnlistener_new(srv->base, srv_on_accept, srv,
				      LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC, 0, fd);
	if (!srv->lsn) {
		close(fd);
		r = CRUN_ENOMEM;
		return r;
	}
	evconnlistener_set_error_cb(srv->lsn, srv_on_accept_error);
	return 0;
}
