/* client_int.h: private to the blocking TCPStore client behind
 * include/crun/store.h: conn.c (the socket, plain or TLS, with deadlines;
 * buffered replies; errors), session.c (dial, reconnect, lease re-attach,
 * replay; open and close), ops.c (the TCPStore ops over one call path) and
 * ext.c (crun's extension: leases, WAIT_ANY). One request at a time; the
 * agent, the rendezvous and the worker SDK call it from their own threads,
 * and it never touches an event loop.
 */
#ifndef CRUN_STORE_CLIENT_INT_H
#define CRUN_STORE_CLIENT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/store.h"
#include "store/store_ext.h"

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
/* Unconfirmed writes kept for replay after a reconnect (session.c). */
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
	int broke_r;	   /* and its code */
	uint64_t broke_ms; /* and when (clock_now_ms), for GONE_MS */
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
	/* Reconnecting (session.c). */
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

/* ---- conn.c: errors, the socket, buffered replies ------------------------ */

/* Records "OP key 'K' on HOST:PORT: cause (CODE)" as the handle's last
 * error (and as why it broke, if it is broken and had no reason yet) and
 * returns r. `key` may be NULL for ops without one. */
__attribute__((format(printf, 6, 7))) int client_set_err(struct client_conn *c, int r,
							 const char *op, const void *key,
							 size_t key_len, const char *fmt, ...);
/* The text for r in messages: the server's ERROR text for CRUN_ENOSPC. */
const char *client_cause(const struct client_conn *c, int r);
/* Drops the socket after an I/O failure (abortive close: the server keeps
 * its leases for the re-attach); the next call reconnects. */
void client_break(struct client_conn *c);
/* Frees everything c owns (NULL: no-op). */
void client_conn_free(struct client_conn *c);

/* Now + ms, or NO_DEADLINE for 0. */
uint64_t client_deadline(uint32_t ms);
/* Milliseconds left for poll(): -1 = forever, 0 = expired. */
int client_poll_ms(uint64_t deadline);
/* Grows *p (elem-sized items) to hold need of them: 0 or CRUN_ENOMEM. */
int client_grow(void **p, size_t *cap, size_t need, size_t elem);
/* A pseudo-random number (backoff jitter, PING nonces). */
uint32_t client_rand(struct client_conn *c);

/* Reads at least one more byte into the read buffer: 0, CRUN_ECLOSED,
 * CRUN_ETIMEDOUT, CRUN_EPROTO (a reply over REPLY_MAX), -errno. */
int client_fill(struct client_conn *c, uint64_t deadline);
/* A reply arrived: every write sent before it was applied. */
void client_confirm(struct client_conn *c);
/* The server's ERROR where a reply should start: CRUN_ENOSPC with its text
 * in c->full; 0 when a reply starts there (left unread); else the read's
 * failure. */
int client_error_reply(struct client_conn *c, uint64_t deadline);
/* Reads one reply to op; *out points into the read buffer until the next
 * read on c. */
int client_read_reply(struct client_conn *c, enum store_op op, uint64_t nitems, uint64_t deadline,
		      struct store_reply *out);
/* Reads the value that ends a reply (lenb: its u64 length) into a fresh,
 * NUL-terminated allocation. */
int client_read_tail(struct client_conn *c, const uint8_t *lenb, uint64_t deadline, void **ret_val,
		     size_t *ret_len);
/* Frees a read or write buffer that a big op grew. */
void client_trim(struct client_conn *c);
void client_wbuf_trim(struct client_conn *c);
/* Encodes req into the write buffer and sends it in one go; a write
 * without a reply is kept for replay until a reply confirms it. */
int client_send_req(struct client_conn *c, const struct store_req *req, uint64_t deadline);
/* One extension request and its fixed-size reply into rep (ret_val
 * non-NULL: and the value after it). No retries; an I/O failure breaks c. */
int client_ext_rpc_val(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		       uint64_t deadline, void **ret_val, size_t *ret_len);
int client_ext_rpc(struct client_conn *c, const struct store_ext_req *q, uint8_t *rep,
		   uint64_t deadline);

/* ---- session.c: dialing, reconnecting, leases held ------------------------ */

/* Failures a new connection may cure (the peer or the path went away). */
bool client_transient(int r);
/* The connection broke (r) with op `name` sent `tries` times. unsafe: NULL
 * when sending it again is safe, else why it is not (in the message). 0
 * when the connection is back and the op should be sent again, else the
 * error, recorded. */
int client_lost(struct client_conn *c, int r, const char *name, const struct store_bytes *k,
		const char *unsafe, unsigned tries, uint64_t deadline);
/* Dials again after a loss (why: c->broke): greeting, HELLO, lease
 * re-attach, replay of unconfirmed writes. 0, or the error, recorded. */
int client_revive(struct client_conn *c, const char *name, uint64_t deadline);
/* HELLO on the live socket: c->ext, c->ext_version. */
int client_ext_hello(struct client_conn *c, uint64_t deadline);
/* The leases the handle re-attaches after a reconnect. */
void client_lease_note(struct client_conn *c, uint64_t id);
void client_lease_forget(struct client_conn *c, uint64_t id);

/* ---- ops.c: argument checks shared with ext.c ----------------------------- */

/* Fills c->kv[0..n) with the handle's prefix + each key (raw: unchanged). */
int client_mangle(struct crun_store *s, const char *op, const char *const *keys, size_t n,
		  bool raw);
/* Entry checks (op in the dialect, connection up), then client_mangle. */
int client_key_list(struct crun_store *s, enum store_op op, const char *const *keys, size_t n);
int client_check_val(struct client_conn *c, const char *op, const void *val, size_t len);
/* The deadline of an op: timeout_ms, or the handle's default for 0. */
uint64_t client_op_deadline(struct client_conn *c, uint32_t timeout_ms);

#endif /* CRUN_STORE_CLIENT_INT_H */
