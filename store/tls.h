/* tls.h: TLS for crun-to-crun store connections (OpenSSL), private to the
 * store module and the programs and modules above it that configure it.
 * Server side: an accepted socket becomes a libevent OpenSSL bufferevent, so
 * server/server.c only swaps the bufferevent constructor. Client side: a handshake
 * and read/write calls on the client's own non-blocking socket, driven with
 * poll() deadlines by store_io_* below (client/conn.c), which the store
 * client and auth_io.c share.
 *
 * Policy: TLS 1.3 unless min_version is 12; peers are verified against `ca`
 * (the client checks the server's name or IP address against its
 * certificate; a server with a `ca` requires and verifies client
 * certificates: mutual TLS). Everything OpenSSL says about a failure ends in
 * the caller's err text.
 */
#ifndef CRUN_STORE_TLS_H
#define CRUN_STORE_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct bufferevent;
struct event_base;

struct store_tls_opts {
	const char *cert; /* PEM certificate chain; server: required */
	const char *key;  /* PEM private key of cert */
	const char *ca;	  /* PEM CA bundle to verify the peer; client: required */
	int min_version;  /* 12 or 13 (0 = 13) */
};

struct store_tls;      /* an SSL_CTX with crun's policy; opaque */
struct store_tls_conn; /* one client connection; opaque */

/* 0, or CRUN_EINVAL / CRUN_ENOMEM with a message naming the file in err. */
int store_tls_new_server(const struct store_tls_opts *o, struct store_tls **ret, char *err,
			 size_t cap);
int store_tls_new_client(const struct store_tls_opts *o, struct store_tls **ret, char *err,
			 size_t cap);
/* NULL: no-op. Connections made from it must be freed first. */
void store_tls_free(struct store_tls *t);

/* Server: a bufferevent that runs the TLS handshake on the accepted fd and
 * then carries plaintext; it owns fd (closed on free, also when this fails:
 * then NULL). */
struct bufferevent *store_tls_accept(struct store_tls *t, struct event_base *base, int fd);
/* The OpenSSL reason of the last error on a TLS bufferevent ("" if none),
 * for the server's log line. *ret_plain: whether the peer's first bytes
 * were no TLS record at all (a plaintext client). */
const char *store_tls_bev_error(struct bufferevent *bev, char *buf, size_t cap, bool *ret_plain);
/* Server, a plaintext peer on a TLS port: reads what it sent (so closing
 * sends a FIN, not a reset that would lose this) and sends it a TLS alert
 * record in the clear, which crun's clients recognise (store_tls_record). */
void store_tls_tell_plaintext_peer(int fd);
/* Whether the first bytes a plaintext client read (len >= 2) are a TLS
 * record: the server speaks TLS. Pure. */
bool store_tls_record(const uint8_t *p, size_t len);
/* Plain server, a TLS ClientHello on its port (store_tls_record): reads it
 * and answers a line that is no TLS record, so the client's handshake fails
 * at once with "wrong version number" (store_tls_connect names it). */
void store_tls_tell_tls_peer(int fd);

/* Client: handshake on connected non-blocking fd (borrowed: the caller
 * closes it after store_tls_conn_free), verifying the certificate against
 * `host` (a name or an IP literal), until deadline_ms. 0 and *ret, or
 * CRUN_EPROTO (handshake or verification failed, or the server answered in
 * plaintext: err says which),
 * CRUN_ETIMEDOUT, -errno. */
int store_tls_connect(struct store_tls *t, int fd, const char *host, uint64_t deadline_ms,
		      struct store_tls_conn **ret, char *err, size_t cap);
void store_tls_conn_free(struct store_tls_conn *c); /* NULL: no-op */

/* Like send()/recv() on the non-blocking socket: > 0 bytes moved; 0 from
 * read = the peer closed; CRUN_EAGAIN with *ret_wait set to POLLIN or
 * POLLOUT = poll the fd for that, then call again; else CRUN_EPROTO or
 * -errno. */
long store_tls_write(struct store_tls_conn *c, const void *p, size_t len, short *ret_wait);
long store_tls_read(struct store_tls_conn *c, void *p, size_t cap, short *ret_wait);
/* OpenSSL's reason for the last CRUN_EPROTO of read/write ("" if none; NULL
 * c: ""). Valid until the next call on c. */
const char *store_tls_conn_error(const struct store_tls_conn *c);

/* ---- blocking I/O on a client's non-blocking socket, plain or TLS ------- */
/* (store/client/conn.c) tls: the socket's TLS connection, NULL for
 * plaintext. deadline_ms: clock_now_ms() time, UINT64_MAX for none; a
 * deadline already past still polls once without blocking, so bytes that
 * are already there are taken. Not thread-safe on one socket. */

/* Waits for events (POLLIN, POLLOUT) on fd: 0 (ready, or an error the
 * next call reports), CRUN_ETIMEDOUT, -errno. */
int store_io_wait(int fd, short events, uint64_t deadline_ms);
/* Sends all len bytes: 0, CRUN_ETIMEDOUT, CRUN_EPROTO (TLS), CRUN_EPIPE,
 * -errno. Bytes may have been sent on any failure. */
int store_io_send(int fd, struct store_tls_conn *tls, const void *p, size_t len,
		  uint64_t deadline_ms);
/* Receives what has arrived, at least 1 and at most cap bytes: the count;
 * CRUN_ECLOSED when the peer closed, CRUN_ETIMEDOUT, CRUN_EPROTO, -errno. */
long store_io_recv(int fd, struct store_tls_conn *tls, void *p, size_t cap, uint64_t deadline_ms);

#endif /* CRUN_STORE_TLS_H */
