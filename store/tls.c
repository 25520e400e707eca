/* tls.c: OpenSSL contexts and connections behind tls.h. The server wraps
 * accepted sockets in libevent's OpenSSL bufferevents; the client drives
 * SSL_connect/SSL_read/SSL_write on its own non-blocking socket and lets the
 * caller poll() with its deadlines.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/common.h"
#include "store/tls.h"

struct store_tls {
	SSL_CTX *ctx;
};

struct store_tls_conn {
	SSL *ssl;
	char why[256]; /* OpenSSL's reason for the last failed read or write */
};

/* The queued OpenSSL errors as one line (the queue is emptied). */
static void ssl_errors(char *buf, size_t cap)
{
	unsigned long e;
	size_t n = 0;

	buf[0] = '\0';
	while ((e = ERR_get_error()) && n + 2 < cap) {
		char one[256];
		int w;

		ERR_error_string_n(e, one, sizeof(one));
		w = snprintf(buf + n, cap - n, "%s%s", n ? "; " : "", one);
		if (w < 0)
			break;
		n += (size_t)w < cap - n ? (size_t)w : cap - n - 1;
	}
}

static int ctx_new(const struct store_tls_opts *o, bool server, struct store_tls **ret, char *err,
		   size_t cap)
{
	struct store_tls *t = calloc(1, sizeof(*t));
	char why[512];
	const char *what = "";

	if (!t)
		return CRUN_ENOMEM;
	ERR_clear_error();
	t->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
	if (!t->ctx)
		goto fail;
	what = "TLS version";
	if (!SSL_CTX_set_min_proto_version(t->ctx,
					   o->min_version == 12 ? TLS1_2_VERSION : TLS1_3_VERSION))
		goto fail;
	/* No session tickets to keep around: connections are few and long. */
	SSL_CTX_set_options(t->ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
	/* A peer that closes without close_notify has simply hung up: every
	 * store frame is length-delimited, so truncation cannot go unnoticed. */
	SSL_CTX_set_options(t->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
	if (o->cert && *o->cert) {
		what = o->cert;
		if (SSL_CTX_use_certificate_chain_file(t->ctx, o->cert) != 1)
			goto fail;
		what = o->key && *o->key ? o->key : o->cert;
		if (SSL_CTX_use_PrivateKey_file(t->ctx, what, SSL_FILETYPE_PEM) != 1 ||
		    SSL_CTX_check_private_key(t->ctx) != 1)
			goto fail;
	}
	if (o->ca && *o->ca) {
		what = o->ca;
		if (SSL_CTX_load_verify_locations(t->ctx, o->ca, NULL) != 1)
			goto fail;
		/* Client: verify the server. Server: a CA means mutual TLS. */
		SSL_CTX_set_verify(
		    t->ctx, SSL_VERIFY_PEER | (server ? SSL_VERIFY_FAIL_IF_NO_PEER_CERT : 0), NULL);
	}
	*ret = t;
	return 0;
fail:
	ssl_errors(why, sizeof(why));
	snprintf(err, cap, "TLS setup (%s): %s", what, why[0] ? why : "failed");
	store_tls_free(t);
	return CRUN_EINVAL;
}

int store_tls_new_server(const struct store_tls_opts *o, struct store_tls **ret, char *err,
			 size_t cap)
{
	if (!o->cert || !*o->cert) {
		snprintf(err, cap, "TLS server needs a certificate and key (tls_cert, tls_key)");
		return CRUN_EINVAL;
	}
	return ctx_new(o, true, ret, err, cap);
}

int store_tls_new_client(const struct store_tls_opts *o, struct store_tls **ret, char *err,
			 size_t cap)
{
	if (!o->ca || !*o->ca) {
		snprintf(err, cap, "TLS client needs a CA to verify the server (tls_ca)");
		return CRUN_EINVAL;
	}
	return ctx_new(o, false, ret, err, cap);
}

void store_tls_free(struct store_tls *t)
{
	if (!t)
		return;
	SSL_CTX_free(t->ctx);
	free(t);
}

/* ---- server ------------------------------------------------------------------- */

struct bufferevent *store_tls_accept(struct store_tls *t, struct event_base *base, int fd)
{
	SSL *ssl = SSL_new(t->ctx);
	struct bufferevent *bev;

	if (!ssl) {
		close(fd);
		return NULL;
	}
	/* Owns ssl (BEV_OPT_CLOSE_ON_FREE frees it) and fd. */
	bev = bufferevent_openssl_socket_new(base, fd, ssl, BUFFEREVENT_SSL_ACCEPTING,
					     BEV_OPT_CLOSE_ON_FREE);
	if (!bev) {
		SSL_free(ssl);
		close(fd);
	}
	return bev;
}

/* OpenSSL's verdicts on a first record that is no TLS at all. */
static bool not_tls(unsigned long e)
{
	int why = ERR_GET_REASON(e);

	return why == SSL_R_WRONG_VERSION_NUMBER || why == SSL_R_HTTP_REQUEST ||
	       why == SSL_R_HTTPS_PROXY_REQUEST || why == SSL_R_UNKNOWN_PROTOCOL;
}

const char *store_tls_bev_error(struct bufferevent *bev, char *buf, size_t cap, bool *ret_plain)
{
	unsigned long e = bufferevent_get_openssl_error(bev);

	buf[0] = '\0';
	*ret_plain = e && not_tls(e);
	if (e)
		ERR_error_string_n(e, buf, cap);
	return buf;
}

/* Reads and drops what the peer sent (bounded: a peer that keeps sending
 * gets its reset), so that closing sends a FIN after our last bytes. */
static void drain(int fd)
{
	uint8_t buf[4096];

	for (int i = 0; i < 16 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0; i++)
		;
}

void store_tls_tell_plaintext_peer(int fd)
{
	/* alert, TLS 1.2 record version, 2 bytes: fatal, protocol_version. */
	static const uint8_t alert[] = {0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46};

	drain(fd);
	(void)send(fd, alert, sizeof(alert), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool store_tls_record(const uint8_t *p, size_t len)
{
	/* Content type alert (21) or handshake (22), then major version 3. */
	return len >= 2 && (p[0] == 0x15 || p[0] == 0x16) && p[1] == 0x03;
}

void store_tls_tell_tls_peer(int fd)
{
	static const char line[] = "crun store: this port speaks plaintext, not TLS\n";

	drain(fd);
	(void)send(fd, line, sizeof(line) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* ---- client -------------------------------------------------------------------- */

/* OpenSSL writes to the socket with write(), not send(MSG_NOSIGNAL): a
 * peer that hung up would kill a worker that does not ignore SIGPIPE. The
 * signal is blocked around each call and a SIGPIPE it raised is taken back
 * (one pending before the call is left alone). */
struct pipe_guard {
	sigset_t old;
	bool was_pending;
};

static void pipe_block(struct pipe_guard *g)
{
	sigset_t pipe_set, pend;

	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	sigpending(&pend);
	g->was_pending = sigismember(&pend, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &g->old);
}

static void pipe_restore(struct pipe_guard *g)
{
	sigset_t pipe_set, pend;
	const struct timespec zero = {0, 0};
	int saved = errno; /* the caller reads the write's errno next */

	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	sigpending(&pend);
	if (!g->was_pending && sigismember(&pend, SIGPIPE))
		(void)sigtimedwait(&pipe_set, NULL, &zero);
	pthread_sigmask(SIG_SETMASK, &g->old, NULL);
	errno = saved;
}

/* The peer name check: an IP literal against the certificate's IP SANs, a
 * name against its DNS names (OpenSSL does the matching). */
static int expect_host(SSL *ssl, const char *host)
{
	unsigned char ip[16];

	if (inet_pton(AF_INET, host, ip) == 1 || inet_pton(AF_INET6, host, ip) == 1)
		return X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) == 1 ? 0 : -1;
	if (SSL_set_tlsext_host_name(ssl, host) != 1)
		return -1;
	return SSL_set1_host(ssl, host) == 1 ? 0 : -1;
}

int store_tls_connect(struct store_tls *t, int fd, const char *host, uint64_t deadline_ms,
		      struct store_tls_conn **ret, char *err, size_t cap)
{
	struct store_tls_conn *c = calloc(1, sizeof(*c));
	char why[512];
	int r = CRUN_EPROTO;

	if (!c)
		return CRUN_ENOMEM;
	ERR_clear_error();
	c->ssl = SSL_new(t->ctx);
	if (!c->ssl || SSL_set_fd(c->ssl, fd) != 1 || expect_host(c->ssl, host) < 0) {
		ssl_errors(why, sizeof(why));
		snprintf(err, cap, "TLS setup for '%s': %s", host, why);
		goto fail;
	}
	for (;;) {
		struct pipe_guard g;
		int n, e;

		pipe_block(&g);
		n = SSL_connect(c->ssl);
		pipe_restore(&g);

		if (n == 1)
			break;
		e = SSL_get_error(c->ssl, n);
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			r = fd_wait_until(fd, e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT,
					  deadline_ms);
			if (r < 0) {
				snprintf(err, cap, "TLS handshake with '%s': %s", host,
					 crun_strerror(r));
				goto fail;
			}
			continue;
		}
		if (e == SSL_ERROR_SYSCALL &&
		    (errno == ECONNRESET || errno == ECONNABORTED || errno == EPIPE)) {
			/* The transport broke (a reset mid-handshake, e.g. `ss -K`
			 * or a restarting peer), not a TLS verdict: the caller
			 * retries it like a refused connect. */
			r = CRUN_ECONNRESET;
			snprintf(err, cap, "TLS handshake with '%s': %s", host, strerror(errno));
			goto fail;
		}
		r = CRUN_EPROTO;
		if (not_tls(ERR_peek_last_error()))
			snprintf(
			    err, cap,
			    "the server at '%s' does not speak TLS (it answered in plaintext): "
			    "remove tls_ca, or serve the store with TLS (tls_cert, tls_key)",
			    host);
		else if (SSL_get_verify_result(c->ssl) != X509_V_OK)
			snprintf(err, cap, "TLS: the certificate of '%s' is not trusted: %s", host,
				 X509_verify_cert_error_string(SSL_get_verify_result(c->ssl)));
		else {
			ssl_errors(why, sizeof(why));
			snprintf(
			    err, cap,
			    "TLS handshake with '%s' failed: %s (does the server speak TLS, and "
			    "does it accept our certificate?)",
			    host, why[0] ? why : "connection closed");
		}
		goto fail;
	}
	*ret = c;
	return 0;
fail:
	store_tls_conn_free(c);
	return r;
}

void store_tls_conn_free(struct store_tls_conn *c)
{
	if (!c)
		return;
	SSL_free(c->ssl); /* the fd stays open: the caller owns it */
	free(c);
}

static long io_result(struct store_tls_conn *c, int n, short *ret_wait)
{
	int e = SSL_get_error(c->ssl, n);

	switch (e) {
	case SSL_ERROR_WANT_READ:
		*ret_wait = POLLIN;
		return CRUN_EAGAIN;
	case SSL_ERROR_WANT_WRITE:
		*ret_wait = POLLOUT;
		return CRUN_EAGAIN;
	case SSL_ERROR_ZERO_RETURN:
		return 0;
	case SSL_ERROR_SYSCALL:
		ERR_clear_error();
		return errno ? -errno : 0; /* no errno: the peer closed without close_notify */
	default:
		ssl_errors(c->why, sizeof(c->why));
		return CRUN_EPROTO;
	}
}

const char *store_tls_conn_error(const struct store_tls_conn *c)
{
	return c ? c->why : "";
}

long store_tls_write(struct store_tls_conn *c, const void *p, size_t len, short *ret_wait)
{
	struct pipe_guard g;
	int n;

	errno = 0;
	pipe_block(&g);
	n = SSL_write(c->ssl, p, len > INT_MAX ? INT_MAX : (int)len);
	pipe_restore(&g);
	if (n > 0)
		return n;
	n = (int)io_result(c, n, ret_wait);
	return n == 0 ? CRUN_EPIPE : n;
}

long store_tls_read(struct store_tls_conn *c, void *p, size_t cap, short *ret_wait)
{
	int n;

	errno = 0;
	n = SSL_read(c->ssl, p, cap > INT_MAX ? INT_MAX : (int)cap);
	if (n > 0)
		return n;
	return io_result(c, n, ret_wait);
}
