/* proxy.h: a node-local TCPStore proxy (store/proxy/proxy.c). The workers of one
 * node connect to it as to any TCPStore (PyTorch 1.13 v1 and 2.x v2
 * dialects); it carries their requests to the real store ("upstream", a
 * crun store server speaking v2) over a few shared connections, so the
 * upstream store sees one connection and one waiter per node instead of one
 * per rank. How requests are routed, and what is not multiplexed, is in the
 * header comment of proxy/proxy.c; store_proxy_route() is that table.
 *
 * Single-threaded: everything runs on the event_base given to
 * store_proxy_new(); several proxies may share one loop (bench).
 */
#ifndef CRUN_STORE_PROXY_H
#define CRUN_STORE_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

struct event_base;
struct store_proxy;

struct store_proxy_config {
	const char *listen_host;   /* numeric IP to listen on; NULL/"" = 127.0.0.1 */
	uint16_t listen_port;	   /* 0 = ephemeral; store_proxy_port() */
	const char *upstream_host; /* the real store; numeric, or a name resolved
				    * (blocking) by store_proxy_new */
	uint16_t upstream_port;
	uint32_t max_clients;	     /* local connections; 0 = 1024 */
	size_t max_client_out_bytes; /* a client's unread replies above which its
				      * next request waits; 0 = 1 MiB */
	struct store_limits limits;  /* per request, as the upstream's */
	bool allow_remote;	     /* accept peers from other hosts too (tests);
				      * default: loopback and this host's own
				      * address only */
	/* Upstream lost (the real store closed or died): every local client is
	 * closed, the listener too, and this is called once (may be NULL). The
	 * proxy stays allocated: free it when convenient, not from here. */
	void (*on_fail)(void *arg);
	void *arg;
};

#define STORE_PROXY_CONFIG_DEFAULT                                                    \
	{                                                                             \
		.listen_host = NULL, .listen_port = 0, .limits = STORE_LIMITS_DEFAULT \
	}

/* Resolves the upstream, binds the listener and starts connecting upstream
 * (non-blocking; requests queue until the connection is up). Returns 0,
 * CRUN_EINVAL (no upstream), CRUN_ERESOLVE, CRUN_EADDRINUSE, CRUN_ENOMEM. */
int store_proxy_new(struct event_base *base, const struct store_proxy_config *cfg,
		    struct store_proxy **ret_px);
/* Closes every connection and the listener; NULL: no-op. */
void store_proxy_free(struct store_proxy *px);
uint16_t store_proxy_port(const struct store_proxy *px);
/* True once the upstream was lost (then every client was closed). */
bool store_proxy_failed(const struct store_proxy *px);

struct store_proxy_stats {
	uint64_t clients;	 /* open local connections */
	uint64_t accepted;	 /* local connections accepted so far */
	uint64_t refused;	 /* refused: foreign peer or max_clients */
	uint64_t requests;	 /* requests forwarded on the shared connection */
	uint64_t local_replies;	 /* answered here (VALIDATE, PING, idle CANCEL_WAIT) */
	uint64_t waits;		 /* local WAITs */
	uint64_t waits_ready;	 /* ...answered by their CHECK (keys existed) */
	uint64_t upstream_waits; /* WAITs sent upstream (one per distinct key set) */
	uint64_t upstream_conns; /* open upstream connections of every kind */
	uint64_t passthrough;	 /* clients relayed verbatim (store_proxy_route) */
	uint64_t dropped;	 /* clients closed for malformed input */
};
void store_proxy_get_stats(const struct store_proxy *px, struct store_proxy_stats *ret);

/* ---- the routing table (pure) ---------------------------------------------- */

enum store_proxy_route {
	PROXY_LOCAL,	    /* answered by the proxy: VALIDATE, PING */
	PROXY_FIFO,	    /* forwarded on the shared connection, reply routed back */
	PROXY_FIFO_NOREPLY, /* forwarded on the shared connection, no reply */
	PROXY_WAIT,	    /* CHECK on the shared connection, then one coalesced
			     * upstream WAIT per distinct key list */
	PROXY_CANCEL,	    /* CANCEL_WAIT: drops this client's local wait */
	PROXY_PASS,	    /* this client gets its own upstream connection, relayed
			     * verbatim from this request on */
};

/* Where a request of logical op `op` (from a client of dialect d) goes; an
 * op outside enum store_op, or one crun does not multiplex safely (v1
 * WATCH_KEY, queue ops, BARRIER), is PROXY_PASS. */
enum store_proxy_route store_proxy_route(enum store_dialect d, int op);

#endif /* CRUN_STORE_PROXY_H */
