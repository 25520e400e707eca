/* proxy_int.h: private to the store proxy (proxy.c: routing, local
 * clients, life cycle; proxy_up.c: upstream connections, the shared
 * connection's reply ring, wait sets). The design is in proxy.c's header.
 */
#ifndef CRUN_STORE_PROXY_INT_H
#define CRUN_STORE_PROXY_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sys/socket.h>

#include <event2/event.h>

#include "store/dlist.h"
#include "store/proxy.h"

#define DEFAULT_MAX_CLIENTS 1024u
#define DEFAULT_CLIENT_OUT  (1024u * 1024)
/* Pooled wait connections kept open per proxy: the root pays a descriptor
 * for each, so one (a node rarely has two key lists pending at once). */
#define IDLE_WAIT_CONNS 1
#define PASS_HIGH	(4u * 1024 * 1024) /* passthrough relay buffering */
#define HS_NONCE	0x50524f58u	   /* "PROX", echoed by PING */

struct client;
struct waitset;

enum up_kind { UP_MAIN, UP_WAIT, UP_PASS };

/* An upstream connection. */
struct up {
	struct store_proxy *px;	 /* borrowed */
	struct bufferevent *bev; /* owns the fd */
	enum up_kind kind;
	size_t hs_left;	    /* handshake bytes still to read: the PING echo
			     * (MAIN, WAIT), then HELLO's answer (MAIN) */
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
	struct bufferevent *bev; /* owns the fd; writes only (rd_ev reads) */
	struct event *rd_ev;	 /* one recv() per readiness, no FIONREAD */
	struct evbuffer *in;	 /* unprocessed input (the bufferevent's own
				  * input is frozen to all but itself) */
	bool rd_on;
	bool relay_full; /* passthrough: the upstream's output is full */
	struct dl link;	 /* px->clients */
	enum store_dialect d;
	bool sniffed;
	bool busy;	   /* a reply owed on the shared connection */
	bool unconfirmed;  /* a reply-less request sent after the last reply */
	bool waiting;	   /* a WAIT not yet answered */
	bool out_blocked;  /* stopped on max_client_out_bytes */
	uint32_t wait_gen; /* bumped when a wait ends, so a stale CHECK is ignored */
	uint8_t *wkeys;	   /* the pending WAIT's key list (u64 n + strings) */
	size_t wkeys_len;
	uint64_t wnitems;
	struct waitset *ws; /* the set it is a member of */
	struct dl ws_link;  /* ws->members */
	struct up *pass;    /* passthrough connection, once moved */
	struct store_dec_state dec;
};

struct waitset {
	struct store_proxy *px;
	struct dl link; /* px->sets */
	uint8_t *keys;	/* owned copy of the key list */
	size_t keys_len;
	uint64_t nitems;
	struct dl members; /* struct client.ws_link */
	struct up *up;	   /* the connection its WAIT is pending on (not muxed) */
	uint64_t tag;	   /* muxed: its WAIT_TAG's tag */
	bool releasing;	   /* ws_release walks it: no longer findable */
};

struct store_proxy {
	struct event_base *base;
	struct store_proxy_config cfg;
	struct sockaddr_storage up_addr;
	socklen_t up_addr_len;
	struct evconnlistener *lsn;
	uint16_t port;
	struct up *main;
	bool ready;	   /* main's handshake done: clients are served */
	bool mux;	   /* main is muxed: waits are WAIT_TAGs on it (store_ext.h) */
	uint64_t last_tag; /* the newest WAIT_TAG's tag; tags are never reused */
	size_t n_tagged;   /* sets with a WAIT_TAG pending: < STORE_EXT_MUX_MAX_WAITS */
	struct up *idle;   /* pooled wait connections (not muxed) */
	size_t n_idle;
	struct pend *ring; /* capacity 2 * max_clients + 2 */
	size_t ring_cap, ring_head, ring_len;
	size_t in_max;	   /* a client's unprocessed input: one legal frame */
	struct dl clients; /* struct client.link */
	struct dl sets;	   /* struct waitset.link */
	bool failed;
	struct store_proxy_stats st;
};

/* proxy_up.c */
void proxy_nodelay(evutil_socket_t fd);
/* Sends a reply to a local client: at once when nothing is queued. */
int proxy_client_send(struct client *cl, const void *data, size_t len);
int proxy_out_u8(struct client *cl, uint8_t b);
/* Forwards one decoded request (raw[0..len)) upstream as op `op` in v2. */
int proxy_up_send(struct up *u, enum store_op op, const uint8_t *raw, size_t len);
int proxy_pend_push(struct store_proxy *px, const struct pend *p);
/* Opens an upstream connection; MAIN and WAIT send VALIDATE and PING. */
int proxy_up_open(struct store_proxy *px, enum up_kind kind, struct up **ret);
void proxy_up_free(struct up *u); /* NULL: no-op */
struct waitset *proxy_ws_find(struct store_proxy *px, const uint8_t *keys, size_t len);
/* Adds cl (waiting, keys in cl->wkeys) to its key list's set. */
int proxy_ws_join(struct client *cl);
/* The client's wait is over (answered, canceled, or the client leaves). */
void proxy_end_wait(struct client *cl);
/* Upstream lost: every local client and the listener go. */
void proxy_fail(struct store_proxy *px);
void proxy_close_all(struct store_proxy *px);

/* proxy.c */
void proxy_client_close(struct client *cl);
/* Reads from cl unless its input is at the frame ceiling or its relay full. */
void proxy_client_sync_read(struct client *cl);
/* Decodes and acts on the client's requests while it may have one more. */
void proxy_client_process(struct client *cl);

#endif /* CRUN_STORE_PROXY_INT_H */
