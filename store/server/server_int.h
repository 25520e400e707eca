/* server_int.h: private to the store server: server.c (create, configure,
 * free), listen.c, conn.c and flow.c (connections, I/O), server_ops.c and
 * waits.c (operations), kv.c (key space). The key space is one
 * chained hash table of byte-string keys. An entry exists while it holds
 * anything: a value, a FIFO queue (QUEUE_* ops), or a registration tying a
 * connection to the key (a pending WAIT, a v1 WATCH_KEY).
 * Single-threaded: everything runs on the server's event loop.
 */
#ifndef CRUN_STORE_SERVER_INT_H
#define CRUN_STORE_SERVER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <netinet/in.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "store/dlist.h"
#include "store/server.h"
#include "store/store.h"

/* ---- the key space -------------------------------------------------------- */

/* One queued item of a QUEUE_PUSH. */
struct kv_item {
	struct kv_item *next;
	size_t len;
	uint8_t data[];
};

/* One job's part of the key space (share.c). Owned by the server's share
 * list; entries point at it (borrowed) for as long as they exist. */
struct store_share {
	struct store_share *next;
	uint64_t used[STORE_B__MAX];
	uint64_t refused[STORE_B__MAX];
	size_t job_len;
	char job[]; /* NUL-terminated */
};

struct kv_ent {
	struct kv_ent *next;	   /* hash chain */
	struct store_share *share; /* whose budget the entry counts in (borrowed) */
	bool rdzv;		   /* a crun rendezvous key: may use the reserve */
	uint64_t hash;
	uint8_t *val; /* owned; NULL while val_cap is 0 */
	size_t val_len;
	size_t val_cap;
	struct dl waiters;  /* struct kv_reg.key_link, oldest first */
	struct dl watchers; /* v1 WATCH_KEY registrations */
	struct kv_item *q_head, *q_tail;
	uint64_t q_len;
	uint32_t key_len;
	bool present; /* has a value (an empty value counts) */
	uint8_t key[];
};

struct kv_table {
	struct kv_ent **buckets;
	size_t mask;	      /* bucket count - 1; a power of two minus one */
	size_t n_ents;	      /* every entry, for the load factor */
	size_t n_keys;	      /* entries with a value: GETNUMKEYS */
	size_t value_bytes;   /* values plus queued items */
	size_t key_bytes;     /* key lengths of every entry */
	size_t max_ents;      /* kv_get_or_add refuses to create more... */
	size_t max_key_bytes; /* ...or to go past this many key bytes */
};

/* Ties a connection to a key: a missing key of a WAIT/BARRIER, or a watch. */
struct kv_reg {
	struct dl key_link;  /* in kv_ent.waiters or .watchers */
	struct dl conn_link; /* in the owning connection's list */
	struct store_conn *conn;
	struct kv_ent *ent;
	uint64_t idx;		/* the key's index in its WAIT_ANY request */
	struct store_twait *tw; /* its WAIT_TAG (conn_link in tw->regs); NULL: none */
};

/* A tagged wait of a muxed connection (store_ext.h, WAIT_TAG). */
struct store_twait {
	struct dl link; /* in conn->twaits; in conn->fired while its WAKE is held */
	struct dl regs; /* struct kv_reg.conn_link, one per missing key */
	uint64_t tag;
	uint64_t pending; /* keys still missing */
};

/* 0 or CRUN_ENOMEM. The budgets are max_ents entries, max_key_bytes of keys. */
int kv_init(struct kv_table *t, size_t max_ents, size_t max_key_bytes);
/* Frees every entry, value and queued item; registrations must be gone. */
void kv_release(struct kv_table *t);
/* The entry for key, or NULL. */
struct kv_ent *kv_find(const struct kv_table *t, const uint8_t *key, size_t len);
/* The entry for key, created empty if needed and counted in `share`
 * (borrowed; must outlive the entry). 0, CRUN_ENOMEM, or CRUN_ETOOBIG when
 * creating it would go over max_ents or max_key_bytes. */
int kv_get_or_add(struct kv_table *t, const uint8_t *key, size_t len, struct store_share *share,
		  struct kv_ent **ret_ent);
/* Frees `e` if it holds nothing any more (no value, queue or registration). */
void kv_gc(struct kv_table *t, struct kv_ent *e);
/* Replaces (append = false) or extends the value; marks the key present.
 * 0 or CRUN_ENOMEM (then the entry is unchanged). */
int kv_put(struct kv_table *t, struct kv_ent *e, const uint8_t *v, size_t len, bool append);
/* Drops the value (the key becomes absent); the entry is not freed. */
void kv_drop_value(struct kv_table *t, struct kv_ent *e);
/* Appends a copy of v to e's queue. 0 or CRUN_ENOMEM. */
int kv_queue_push(struct kv_table *t, struct kv_ent *e, const uint8_t *v, size_t len);
/* Unlinks the queue's front item (NULL when empty); the caller frees it. */
struct kv_item *kv_queue_pop(struct kv_table *t, struct kv_ent *e);
/* Calls fn on every entry; fn may kv_gc() the entry it was given. */
void kv_foreach(struct kv_table *t, void (*fn)(struct kv_ent *e, void *arg), void *arg);

/* ---- server and connections ------------------------------------------------ */

/* A log line budget: at most LOGRATE_PER_S lines a second; the rest are
 * counted and summed up in the next line that gets through, so a connect
 * storm cannot flood the log (the metrics still count every event). */
struct lograte {
	uint64_t window_ms;
	uint32_t lines;
	uint64_t suppressed;
};

struct store_server {
	struct event_base *base; /* borrowed */
	struct evconnlistener *lsn;
	struct event *accept_retry; /* re-enables accept after EMFILE */
	struct event *sweep;	    /* 1 s: stall and idle timeouts */
	struct event *unstall;	    /* resumes connections paused on the total output */
	struct store_server_config cfg;
	struct kv_table kv;
	bool kv_ready;
	struct dl conns;
	struct dl stalled; /* struct store_conn.stall_link: waiting for output budget */
	uint16_t port;
	int reserve_fd;	     /* spare fd given up to accept-and-close at the fd limit */
	uint32_t auto_conns; /* max_conns 0, computed at start (server.c auto_max_conns) */
	struct store_server_stats st;
	/* PyTorch-protocol requests by op, for /metrics. */
	uint64_t op_counts[STORE_OP__MAX];
	struct lease_table *leases; /* lease.c: every lease by id; NULL until the first */
	uint64_t n_regs;	    /* kv_reg registrations (waits and watches), all conns */
	size_t in_bytes;	    /* unprocessed input, all connections */
	size_t out_bytes;	    /* unsent output, all connections */
	size_t out_hard_cap;	    /* one connection's output past which pushes doom it */
	size_t stall_min;	    /* smallest reply a stalled connection waits to send */
	uint64_t metrics[STORE_M__MAX];
	struct lograte lr;
	/* share.c: every job's share, most recently used first; `other` takes
	 * the keys of jobs past STORE_SHARE_MAX_JOBS. */
	struct store_share *shares;
	struct store_share *share_other;
	uint32_t n_shares;
	struct in6_addr *allow; /* allow.c: allowed peers (v4 as v4-mapped) */
	size_t n_allow;
	bool allow_on; /* false: any peer */
	/* preauth.c: connections not authenticated yet (TLS or secrets on). */
	struct dl preauth;	   /* struct store_conn.preauth_link */
	uint32_t n_preauth;	   /* its length: they do not count in max_conns */
	struct timeval preauth_tv; /* preauth_timeout_s, as a common timeout of base */
	/* linger.c: sockets of clients refused in the TLS handshake, kept
	 * open a moment so the alert is read, not reset away. */
	struct dl lingering;
	uint32_t n_lingering;
};

struct store_conn {
	struct dl link;	      /* in store_server.conns */
	struct dl waits;      /* struct kv_reg.conn_link of WAIT/BARRIER keys */
	struct dl watches;    /* v1 WATCH_KEY registrations */
	struct dl stall_link; /* in store_server.stalled while stalled */
	struct store_server *srv;
	struct bufferevent *bev;
	struct event *rd_ev; /* plain TCP: reads itself (server.c, conn_read); NULL: bev reads */
	struct evbuffer_cb_entry *in_cb, *out_cb; /* keep srv->in/out_bytes */
	struct store_dec_state dec;		  /* how far the front frame was validated */
	uint64_t rx_bytes, tx_bytes;		  /* totals, for the sweep's progress check */
	uint64_t rx_seen, tx_seen;		  /* the totals at the last sweep */
	uint32_t stall_s, idle_s;		  /* seconds without progress, by the sweep */
	uint64_t pending;			  /* keys this connection still waits for */
	uint32_t n_regs; /* waits + watches + leases, at most limits.max_items */
	uint8_t dialect; /* 0 until sniffed, then enum store_dialect */
	uint8_t why;	 /* enum store_metric of a refusal an op reported */
	/* share.c: what this connection added to the key space, net of what it
	 * deleted (floored at 0), by budget; and its last refusal, for the log. */
	uint64_t added[STORE_B__MAX];
	struct store_share *ref_share; /* borrowed; valid until c's op returns */
	uint8_t ref_kind, ref_budget;
	bool parked;		 /* v2 WAIT/BARRIER outstanding: input stays buffered */
	bool any;		 /* the outstanding wait is a WAIT_ANY (store_ext.h) */
	bool any_get;		 /* ...a WAIT_ANY_GET: the wake carries the value */
	uint64_t any_n;		 /* its key count: the index a timeout answers */
	struct event *any_timer; /* its server-side timeout (store_ext.h), NULL: none yet */
	uint8_t *any_with;	 /* ...a WAIT_ANY_GET_WITH: its with_key (malloc'd), else NULL */
	size_t any_with_len;	 /* its length */
	bool throttled;		 /* output over the ceiling: reading paused */
	bool stalled;		 /* total output over budget: reading paused */
	bool writing;		 /* EV_WRITE on: the bufferevent flushes what write() left */
	bool rd_on;		 /* rd_ev: reading wanted (not paused by flow control) */
	bool rd_full;		 /* rd_ev: input at max_conn_buffered_bytes, off until drained */
	bool doomed;		 /* another connection's op overfilled our output */
	bool ext;		 /* sent HELLO: crun's extension ops (store_ext.h) allowed */
	bool peer_eof;		 /* closing because the peer closed in order (FIN), not reset */
	struct dl leases;	 /* struct store_lease.conn_link (lease.c) */
	bool mux;		 /* sent MUX: framed output, tagged waits (store_ext.h) */
	uint32_t ext_peer;	 /* the version its HELLO named (ERROR from 6 on) */
	bool mux_hold;		 /* an op runs: its own WAKE frames wait in `fired` */
	uint32_t n_twaits;	 /* tagged waits pending or held */
	struct dl twaits;	 /* struct store_twait.link; set up by MUX */
	struct dl fired;	 /* completed during the running op, WAKE not sent yet */
	struct conn_auth *auth;	 /* server_auth.c; NULL: the server has no secrets */
	/* preauth.c: while in srv->preauth (TLS handshake or challenge not
	 * passed yet), its source address and its one deadline from accept. */
	struct dl preauth_link;
	struct in6_addr addr;
	struct event *preauth_timer; /* NULL: not pre-auth */
};

static inline struct evbuffer *store_conn_out(struct store_conn *c)
{
	return bufferevent_get_output(c->bev);
}

/* Replies: a byte, an integer, a u64 length and the bytes. 0 or CRUN_ENOMEM. */
static inline int reply_u8(struct store_conn *c, uint8_t v)
{
	return evbuffer_add(store_conn_out(c), &v, 1) < 0 ? CRUN_ENOMEM : 0;
}

static inline int reply_i64(struct store_conn *c, int64_t v)
{
	uint8_t b[8];

	store_put_u64(b, (uint64_t)v);
	return evbuffer_add(store_conn_out(c), b, sizeof(b)) < 0 ? CRUN_ENOMEM : 0;
}

/* A u64 length and the bytes; small values go out in one evbuffer_add. */
static inline int reply_bytes(struct store_conn *c, const uint8_t *p, size_t len)
{
	uint8_t b[8 + 248];

	if (len <= sizeof(b) - 8) {
		store_put_bytes(b, p, len);
		return evbuffer_add(store_conn_out(c), b, 8 + len) < 0 ? CRUN_ENOMEM : 0;
	}
	store_put_u64(b, len);
	if (evbuffer_add(store_conn_out(c), b, 8) < 0 ||
	    evbuffer_add(store_conn_out(c), p, len) < 0)
		return CRUN_ENOMEM;
	return 0;
}

/* Whether a WAIT or CHECK finds the key there. */
static inline bool key_exists(const struct kv_ent *e)
{
	/* Newest torch counts a non-empty queue as present for CHECK/WAIT, so a
	 * blocking QUEUE_POP (WAIT, then POP) wakes on a push. */
	return e && (e->present || e->q_len);
}

/* A reply this small is never held back by the total output budget while
 * the connection has nothing else unsent: one per connection at a time, so a
 * client filling the budget cannot stall everyone's small requests. */
#define SMALL_REPLY 4096

/* ---- flow.c: output and flow control ---- */

/* Writes c's pending output now (what the socket refuses is left to the
 * bufferevent). */
void store_conn_flush(struct store_conn *c);
/* A parked connection resumes reading (from a deferred callback). */
void store_conn_unpark(struct store_conn *c);
/* Closes c later, from its own callback, if output pushed to it by other
 * connections' ops has piled up past the ceiling. */
void store_conn_check_pushed(struct store_conn *c);
/* The budget check of an op that is about to push `bytes` to c (a watch
 * notification): false, and c doomed, when it would go over c's ceiling or
 * the total output budget. */
bool store_conn_may_push(struct store_conn *c, size_t bytes);
/* Reading on or off for flow control (throttled, stalled). */
void store_conn_read(struct store_conn *c, bool on);
/* The input fell below its ceiling (the bufferevent's read high watermark). */
void store_conn_read_unfull(struct store_conn *c);
/* Pauses (on) or resumes reading while the peer does not read its replies. */
void store_conn_throttle(struct store_conn *c, bool on);
/* c's bufferevent write callback: the output drained to the low watermark. */
void store_conn_on_write(struct bufferevent *bev, void *arg);
/* srv->unstall's callback: resumes the connections paused on the total
 * output budget. */
void store_server_on_unstall(evutil_socket_t fd, short what, void *arg);

/* ---- conn.c: a connection's life ---- */

/* Takes ownership of fd. Sets up the connection with reading still off: see
 * store_conn_start. NULL when out of memory (fd closed). */
struct store_conn *store_conn_new(struct store_server *srv, int fd);
/* The connection is let in: requests are read from now on. */
void store_conn_start(struct store_conn *c);
/* The one close path: unregisters every wait and watch, frees the
 * bufferevent (closing the socket) and c. Callers return at once. */
void store_conn_close(struct store_conn *c);
/* Whether one more WARN line fits this second's budget. */
bool store_server_log_budget(struct store_server *srv);
/* fd's peer as "host:port" ("?:0" when unknown). */
void store_peer_name(int fd, char *buf, size_t cap);

/* ---- listen.c and limits.c ---- */

/* Binds cfg's host:port and starts accepting. 0 or a negative code. */
int store_server_listen(struct store_server *srv, const struct store_server_config *cfg);
/* srv->accept_retry's callback: accepting resumes after a pause. */
void store_server_on_accept_retry(evutil_socket_t fd, short what, void *arg);
/* TCP keepalive on fd after idle_s of silence (0: nothing). */
void store_sock_keepalive(int fd, uint32_t idle_s);
/* dst = src with every 0 that means "the default" filled in, max_conns 0
 * as auto_conns. */
void store_server_cfg_fill(struct store_server_config *dst, const struct store_server_config *src,
			   uint32_t auto_conns);
/* What max_conns 0 means now (the fd limit; `preauth` more held back). */
uint32_t store_server_auto_conns(uint64_t preauth);
/* Sets row i of store_server_limits() in cfg to v. */
void store_server_limit_put(struct store_server_config *cfg, size_t i, uint64_t v);

/* server_ops.c: an upper bound of the bytes q's reply adds to c's output,
 * for the total output budget (0 for small fixed-size replies). */
size_t store_conn_reply_cost(struct store_conn *c, const struct store_req *q);

/* server_ops.c: runs one decoded request; pointers in q point into c's input
 * buffer, so whatever is kept is copied. 0, or a negative crun code after
 * which the caller closes c. */
int store_conn_dispatch(struct store_conn *c, const struct store_req *q);
/* server_ops.c: SET on the server's own behalf (a lease's expiry key, which
 * may outlive every connection): waiters wake as for a client's SET. 0 or a
 * negative code (CRUN_ENOMEM, CRUN_ETOOBIG over the value budget). */
int store_server_set_key(struct store_server *srv, const struct store_bytes *k,
			 const struct store_bytes *v);

/* ---- waits.c: registrations and wake-ups ---- */

/* Drops every wait and watch registration of c (close path). */
void store_conn_unregister(struct store_conn *c);
/* Drops c's pending WAIT/BARRIER/WAIT_ANY registrations and its counts
 * (CANCEL_WAIT; a WAIT_ANY that completed or failed). */
void store_conn_drop_waits(struct store_conn *c);
/* Wakes every waiter of e (a key was created or written). */
void store_wake_all(struct store_server *srv, struct kv_ent *e);
/* QUEUE_PUSH's wake: the first waiter of e whose count reaches 0. */
void store_wake_one(struct store_server *srv, struct kv_ent *e);
/* 0, or CRUN_ETOOBIG (refused) when c may not add n registrations: its own
 * ceiling (max_items, which leases share) and the server's (max_waiters). */
int store_reg_budget(struct store_conn *c, uint64_t n);
/* Registers c on e: as a waiter (is_wait) or a v1 watcher. 0 or a negative
 * code (a share's refusal, CRUN_ENOMEM); e is not collected on failure. */
int store_reg_add(struct store_conn *c, struct kv_ent *e, bool is_wait);

/* ---- share.c: one job or one connection cannot take a whole budget ---- */

/* Records which budget refused an op and returns CRUN_ETOOBIG, so the close
 * is logged and counted under that reason. */
int store_conn_refuse(struct store_conn *c, enum store_metric why);
/* The entry of key k, created if needed where a new key fits the global
 * budgets, its job's and c's shares (NULL c: the server's own key). 0, or
 * CRUN_ETOOBIG counted under the budget that was full, or CRUN_ENOMEM. */
int store_share_ent_get(struct store_server *srv, struct store_conn *c, const struct store_bytes *k,
			struct kv_ent **ret);

/* The share that key `key` counts in when c (NULL: the server) creates it:
 * its job's (see store_share_info), created on first use. Never NULL: with
 * the table full or no memory it is share_other. *ret_rdzv tells whether the
 * key is one of crun's rendezvous keys (under STORE_AUTH_JOB_ROOT). */
struct store_share *store_share_for_key(struct store_server *srv, const struct store_conn *c,
					const uint8_t *key, size_t len, bool *ret_rdzv);
/* Whether c (NULL: the server's own write, which may use the reserve) may
 * add d[b] of each budget b to share s: the global budget (less the reserve
 * unless rdzv), s's job share and c's connection share. 0, or CRUN_ETOOBIG
 * after counting the refusal for s and recording it in c (why, ref_*). */
int store_share_admit(struct store_server *srv, struct store_conn *c, struct store_share *s,
		      bool rdzv, const uint64_t d[STORE_B__MAX]);
/* Connection c's own count of budget b moves by delta (a write or a delete
 * it made); never below 0. NULL c: nothing. */
void store_share_note(struct store_conn *c, enum store_budget b, int64_t delta);
/* Writes c's last refusal as a sentence into buf ("store full: job 'J' used
 * 64 MiB of its 64 MiB key bytes"); "" when there was none. */
void store_share_refusal_text(const struct store_conn *c, char *buf, size_t cap);
/* Makes share_other, so store_share_for_key never fails. 0 or CRUN_ENOMEM. */
int store_share_init(struct store_server *srv);
/* Frees every share (the key space must be released first). */
void store_share_release(struct store_server *srv);
/* The run id an authenticated client named, or NULL (server_auth.c). */
const char *store_conn_job(const struct store_conn *c);

/* allow.c: sa's address as IPv6 (IPv4 v4-mapped), one form to compare. */
void store_addr_v6(const struct sockaddr *sa, struct in6_addr *ret);
/* allow.c: whether a connection from sa passes the allowlist. */
bool store_server_peer_allowed(const struct store_server *srv, const struct sockaddr *sa);

/* conn.c: closes c for bad or over-limit input, counted under `why` and
 * logged (rate-limited); `what` adds detail or is NULL. Frees c. */
void store_conn_drop(struct store_conn *c, enum store_metric why, const char *what);

/* ---- preauth.c: the budget and deadline of unauthenticated connections ---- */

/* Whether a server gates its connections (TLS or secrets): only then are
 * new connections pre-auth. */
bool store_server_gated(const struct store_server *srv);
/* At accept, before anything is allocated: 0 when a connection from sa fits
 * the pre-auth budget, else the metric of the refusal (REFUSED_PREAUTH or
 * REFUSED_PREAUTH_ADDR). O(max_preauth_conns). */
int store_preauth_admit(const struct store_server *srv, const struct sockaddr *sa);
/* c enters pre-auth: linked, counted, its deadline armed (preauth_timeout_s
 * from now; bytes do not move it). At the deadline c is dropped (drop_auth).
 * 0 or CRUN_ENOMEM (c is left as it was). */
int store_preauth_begin(struct store_conn *c, const struct sockaddr *sa);
/* c passed the gate: out of the pre-auth budget, into max_conns. Returns
 * false when max_conns is full: c was dropped (refused_max_conns, freed). */
bool store_preauth_end(struct store_conn *c);
/* Close path: forgets c's pre-auth state, if any. */
void store_preauth_forget(struct store_conn *c);
/* The deadline's common timeout, after store_server_new or a limit change. */
void store_preauth_set_timeout(struct store_server *srv);

/* linger.c: closes fd (a duplicate of a dropped TLS connection's socket,
 * owned from here on) once its client has read what was sent, within a
 * bound; store_linger_free_all closes every such socket at once. */
void store_linger_close(struct store_server *srv, int fd);
void store_linger_free_all(struct store_server *srv);

/* ---- server_auth.c: the pre-auth gate (auth.h) ---- */

/* At accept: when the server has secrets, queues the challenge and limits
 * reading to one answer frame (the deadline is preauth.c's). 0 or a
 * negative code (close c). */
int store_conn_auth_start(struct store_conn *c);
/* Close path: frees the auth state. */
void store_conn_auth_free(struct store_conn *c);
/* True while c has not passed authentication: nothing but the answer is read. */
bool store_conn_auth_pending(const struct store_conn *c);
/* Reads the answer: 1 passed (proof queued), 0 incomplete, or a negative code
 * with *ret_why (the caller drops c, counted as drop_auth). */
int store_conn_auth_read(struct store_conn *c, const char **ret_why);
/* Whether c may see or touch wire key `key` (its job scope). */
bool store_conn_key_visible(const struct store_conn *c, const uint8_t *key, size_t len);
/* True when c is limited to one job's keys. */
bool store_conn_scoped(const struct store_conn *c);
/* 0, or CRUN_EACCES when a request names a key outside c's scope. */
int store_conn_auth_check_req(const struct store_conn *c, const struct store_req *q);
/* The same for an extension request at p (partial frames pass: the
 * extension decoder reports them). */
int store_conn_auth_check_ext(const struct store_conn *c, const uint8_t *p, size_t len);

#endif /* CRUN_STORE_SERVER_INT_H */
