/* preauth.c: what a store server with TLS or secrets grants a connection that
 * has not passed its TLS handshake and challenge yet (issue 28). Such a
 * stranger costs a descriptor and a little memory and nothing else, so it
 * gets its own small budget - max_preauth_conns in all, max_preauth_per_addr
 * from one source address - instead of a slot of max_conns, and one absolute
 * deadline from accept: a byte every few seconds does not buy more time, and
 * neither does a trickled ClientHello.
 */
#include <string.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"

bool store_server_gated(const struct store_server *srv)
{
	return srv->cfg.tls || srv->cfg.auth;
}

int store_preauth_admit(const struct store_server *srv, const struct sockaddr *sa)
{
	struct in6_addr a;
	uint32_t same = 0;

	if (srv->n_preauth >= srv->cfg.max_preauth_conns)
		return STORE_M_REFUSED_PREAUTH;
	if (sa->sa_family != AF_INET && sa->sa_family != AF_INET6)
		return 0; /* no address to count (a test's socketpair) */
	store_addr_v6(sa, &a);
	/* A scan, not an index: the list is at most max_preauth_conns long. */
	for (const struct dl *n = srv->preauth.next; n != &srv->preauth; n = n->next) {
		const struct store_conn *c = DL_ENTRY(n, struct store_conn, preauth_link);

		same += memcmp(&c->addr, &a, sizeof(a)) == 0;
	}
	return same >= srv->cfg.max_preauth_per_addr ? STORE_M_REFUSED_PREAUTH_ADDR : 0;
}

static void preauth_on_deadline(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	store_conn_drop(arg, STORE_M_DROP_AUTH,
			"no TLS handshake or authentication within preauth-timeout of accept");
}

int store_preauth_begin(struct store_conn *c, const struct sockaddr *sa)
{
	struct store_server *srv = c->srv;

	c->preauth_timer = evtimer_new(srv->base, preauth_on_deadline, c);
	if (!c->preauth_timer || evtimer_add(c->preauth_timer, &srv->preauth_tv) < 0) {
		if (c->preauth_timer)
			event_free(c->preauth_timer);
		c->preauth_timer = NULL;
		return CRUN_ENOMEM;
	}
	if (sa->sa_family == AF_INET || sa->sa_family == AF_INET6)
		store_addr_v6(sa, &c->addr);
	dl_add_tail(&srv->preauth, &c->preauth_link);
	srv->n_preauth++;
	return 0;
}

void store_preauth_forget(struct store_conn *c)
{
	if (!c->preauth_timer)
		return;
	event_free(c->preauth_timer);
	c->preauth_timer = NULL;
	dl_del(&c->preauth_link);
	c->srv->n_preauth--;
}

bool store_preauth_end(struct store_conn *c)
{
	struct store_server *srv = c->srv;

	store_preauth_forget(c);
	/* max_conns counts the connections that got in; the check is here,
	 * not at accept, so strangers in the handshake cannot fill it. */
	if (srv->st.conns - srv->n_preauth > srv->cfg.max_conns) {
		store_conn_drop(c, STORE_M_REFUSED_MAX_CONNS, NULL);
		return false;
	}
	return true;
}

void store_preauth_set_timeout(struct store_server *srv)
{
	struct timeval tv = {srv->cfg.preauth_timeout_s, 0};
	const struct timeval *common = event_base_init_common_timeout(srv->base, &tv);

	/* A common timeout keeps thousands of equal deadlines in one queue;
	 * connections armed before a change keep the deadline they had. */
	srv->preauth_tv = common ? *common : tv;
}
