/* session.c: the client's session (client_int.h): dialing (resolve,
 * connect, TLS, the auth.h exchange, the v2 greeting), reconnecting after a
 * loss, re-attaching the handle's leases, replaying unconfirmed writes, and
 * opening and closing handles and their prefix views.
 *
 * Reconnecting. A TCPStore stream has no framing to resynchronise on, so a
 * failed exchange always drops its socket; what follows happens on a new one
 * (which is also why a v1 connection cannot desync: a late reply can only
 * arrive on the socket that was closed). Within reconnect_ms, with jittered
 * exponential backoff, the client dials again, redoes the dialect's
 * greeting (v2 VALIDATE + PING), HELLO if the extension was in use, and
 * LEASE_ATTACH for every lease the handle holds, so a reset within a lease's
 * TTL is not a node failure. Then:
 *   - an op whose request may have been applied is sent again only if
 *     applying it twice gives the same state and the same answer (the
 *     retry_safe table); any other (ADD, APPEND, DELETE_KEY, QUEUE_*,
 *     BARRIER, LEASE_GRANT) fails with the transport error and a message
 *     saying it may or may not have been applied; the next call reconnects;
 *   - writes without a reply (SET, MULTI_SET, APPEND, QUEUE_PUSH) are
 *     confirmed only by the next reply on the stream; until then SET and
 *     MULTI_SET are kept (up to UNACKED_MAX bytes) and replayed first on the
 *     new connection; an unconfirmed APPEND or QUEUE_PUSH, or a bigger write,
 *     cannot be replayed, and the call that finds the reset fails saying so.
 */
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
#include "store/auth.h"
#include "store/client/client_int.h"
#include "store/tls.h"

#define OPT_HAS(o, f) ((o)->struct_size >= offsetof(crun_store_opts_t, f) + sizeof((o)->f))

/* Failures a new connection may cure: the peer or the path went away. A
 * timeout is not one (its deadline is spent), nor a malformed reply. */
bool client_transient(int r)
{
	switch (r) {
	case CRUN_ECLOSED:
	case CRUN_ECONNRESET:
	case CRUN_EPIPE:
	case CRUN_ECONNABORTED:
	case CRUN_ENOTCONN:
	case CRUN_ENETUNREACH:
	case CRUN_EHOSTUNREACH:
		return true;
	default:
		return false;
	}
}

int client_lost(struct client_conn *c, int r, const char *name, const struct store_bytes *k,
		const char *unsafe, unsigned tries, uint64_t deadline)
{
	const uint8_t *kp = k ? k->p : NULL;
	size_t kl = k ? k->len : 0;

	client_break(c);
	if (!c->reconnect_ms || !client_transient(r))
		return client_set_err(c, r, name, kp, kl, "%s", client_cause(c, r));
	if (unsafe)
		return client_set_err(c, r, name, kp, kl,
				      "%s with the request in flight; not sent again (%s)",
				      client_cause(c, r), unsafe);
	if (tries >= SEND_TRIES || client_poll_ms(deadline) == 0)
		return client_set_err(c, r, name, kp, kl, "%s (sent %u times)", client_cause(c, r),
				      tries);
	(void)snprintf(c->broke, sizeof(c->broke), "%s: %s", name, client_cause(c, r));
	c->broke_r = r;
	c->broke_ms = clock_now_ms();
	return client_revive(c, name, deadline);
}

static int make_prefix(const char *base, size_t base_len, const char *add, char **ret,
		       size_t *ret_len)
{
	size_t al = add ? strlen(add) : 0;
	size_t len = base_len + (add ? al + 1 : 0);
	char *p = malloc(len + 1);

	if (!p)
		return CRUN_ENOMEM;
	memcpy(p, base, base_len);
	if (add) {
		memcpy(p + base_len, add, al);
		p[base_len + al] = '/';
	}
	p[len] = '\0';
	*ret = p;
	*ret_len = len;
	return 0;
}

/* One connect attempt to one address, bounded by the deadline. */
static int try_connect(const struct addrinfo *ai, uint64_t deadline, int *ret_fd)
{
	int fd =
	    socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	int one = 1, soerr = 0;
	socklen_t sl = sizeof(soerr);
	int r;

	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			r = -errno;
			goto out_close;
		}
		r = store_io_wait(fd, POLLOUT, deadline);
		if (r < 0)
			goto out_close;
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0) {
			r = -errno;
			goto out_close;
		}
		if (soerr) {
			r = -soerr;
			goto out_close;
		}
	}
	/* Requests are small and answered one at a time: never batch. */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*ret_fd = fd;
	return 0;
out_close:
	fd_close(fd);
	return r;
}

/* v2 greeting, as PyTorch 2.x sends it: VALIDATE (no reply), then PING with
 * the pid as nonce, both in one segment; the server must echo the nonce. */
static int handshake(struct client_conn *c, uint64_t deadline)
{
	struct store_req v = {.op = STORE_OP_VALIDATE, .u32 = STORE_VALIDATE_MAGIC};
	struct store_req p = {.op = STORE_OP_PING, .u32 = (uint32_t)getpid()};
	uint8_t buf[64];
	size_t l1, l2;
	struct store_reply rep;
	int r;

	TRY(store_proto_encode_req(STORE_V2, &v, buf, sizeof(buf), &l1));
	TRY(store_proto_encode_req(STORE_V2, &p, buf + l1, sizeof(buf) - l1, &l2));
	TRY(store_io_send(c->fd, c->tls, buf, l1 + l2, deadline));
	r = client_read_reply(c, STORE_OP_PING, 0, deadline, &rep);
	if (r == 0 && rep.u32 == p.u32)
		return 0;
	/* No echo: a TLS server answers a plaintext greeting with a TLS alert
	 * (store_tls_tell_plaintext_peer), the first bytes of the stream. Only
	 * then: a right echo may start with those bytes (pid 789, 790...). */
	if (!c->tls && store_tls_record(c->rbuf, c->rlen))
		return client_set_err(
		    c, CRUN_EPROTO, "connect", NULL, 0,
		    "the server speaks TLS: set tls_ca (and tls_cert, tls_key if it "
		    "wants a client certificate)");
	/* An authenticating crun server sent its challenge (auth.h) at accept,
	 * and that is what we read as the echo. */
	if (!c->secret && c->rlen >= 4 && memcmp(c->rbuf, "CRA1", 4) == 0)
		return client_set_err(c, CRUN_EACCES, "connect", NULL, 0,
				      "authentication required: the server wants a secret (set "
				      "auth_secret_file, or CRUN_AUTH_SECRET_FILE)");
	return r < 0 ? r : CRUN_EPROTO;
}

/* The auth.h exchange before the first TCPStore byte; the error names the
 * cause (no challenge, refused, impostor) in last_error. */
static int client_auth(struct client_conn *c, uint64_t deadline)
{
	char why[300];
	int r = store_auth_client_run(c->fd, c->tls, c->secret, c->auth_job, deadline, why,
				      sizeof(why));

	if (r < 0 && r != CRUN_ETIMEDOUT && r != CRUN_ECONNRESET && r != CRUN_ECLOSED)
		return client_set_err(c, r, "connect", NULL, 0, "%s", why);
	return r;
}

/* TLS handshake on the fresh socket, the certificate checked against host. */
static int client_tls(struct client_conn *c, const char *host, uint64_t deadline)
{
	char why[600];
	int r = store_tls_connect(c->tls_ctx, c->fd, host, deadline, &c->tls, why, sizeof(why));

	if (r < 0 && r != CRUN_ETIMEDOUT)
		return client_set_err(c, r, "connect", NULL, 0, "%s", why);
	return r;
}

/* One address: connect, then TLS, the auth.h exchange and the v2 greeting on
 * the new socket. 0 leaves c on it; a failure closes it again. */
static int dial_addr(struct client_conn *c, const struct addrinfo *ai, uint64_t deadline)
{
	int fd = -1;
	int r;

	r = try_connect(ai, deadline, &fd);
	if (r < 0)
		return r;
	c->fd = fd;
	c->rpos = c->rlen = 0;
	r = c->tls_ctx ? client_tls(c, c->host, deadline) : 0;
	if (r == 0 && c->secret)
		r = client_auth(c, deadline);
	if (r == 0)
		r = c->dialect == STORE_V2 ? handshake(c, deadline) : 0;
	if (r == CRUN_EPROTO && *store_tls_conn_error(c->tls))
		/* e.g. the server wanted our certificate */
		(void)client_set_err(c, r, "connect", NULL, 0, "TLS: %s",
				     store_tls_conn_error(c->tls));
	if (r == 0)
		return 0;
	store_tls_conn_free(c->tls);
	c->tls = NULL;
	fd_close(c->fd);
	c->fd = -1;
	return r;
}

/* The state of one conn_dial. */
struct dial {
	uint64_t deadline;
	uint64_t refused_until;
	uint64_t start_ms;
	bool one_round;
	bool hung_up; /* the server accepted, then closed on our greeting */
	uint32_t backoff_ms;
	char port[8];
	char what[160]; /* the last round's failure, for messages */
};

/* One round: the name resolved, every address tried once. *ret_done: the
 * answer is final - connected (0), a verdict not worth retrying (a wrong
 * echo or secret), or a name that cannot resolve (recorded); else the last
 * failure, with its text in d->what. */
static int dial_round(struct client_conn *c, struct dial *d, bool *ret_done)
{
	struct addrinfo hints = {
	    .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	int g = getaddrinfo(c->host, d->port, &hints, &res);
	int last = CRUN_ETIMEDOUT;

	*ret_done = false;
	if (g == 0) {
		for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
			last = dial_addr(c, ai, d->deadline);
			if (last == 0 || last == CRUN_EPROTO || last == CRUN_EACCES)
				break; /* a wrong echo or secret is not worth retrying */
		}
		freeaddrinfo(res);
		*ret_done = last == 0 || last == CRUN_EPROTO || last == CRUN_EACCES;
		(void)snprintf(d->what, sizeof(d->what), "%s", crun_strerror(last));
		return last;
	}
	if ((g == EAI_NONAME && !(c->rep && c->rep->retry_unresolved)) || g == EAI_SERVICE ||
	    g == EAI_FAMILY) {
		*ret_done = true;
		return client_set_err(c, CRUN_ERESOLVE, "connect", NULL, 0, "%s", gai_strerror(g));
	}
	(void)snprintf(d->what, sizeof(d->what), "cannot resolve '%s': %s", c->host,
		       gai_strerror(g));
	return CRUN_ERESOLVE;
}

/* Between rounds: false when the dialing is over (its time is spent, or it
 * had one round), else a jittered exponential backoff slept. After the
 * first round the caller hears of the failure (rep->on_retry). */
static bool dial_pause(struct client_conn *c, struct dial *d, unsigned round, int last)
{
	uint32_t j = d->backoff_ms / 2 + client_rand(c) % (d->backoff_ms + 1);
	int left = client_poll_ms(d->deadline);

	if (left == 0 || d->one_round)
		return false;
	if (round == 0 && c->rep && c->rep->on_retry)
		c->rep->on_retry(last, d->what, left < 0 ? UINT64_MAX : (uint64_t)left,
				 c->rep->arg);
	if (left > 0 && (uint32_t)left < j)
		j = (uint32_t)left;
	(void)poll(NULL, 0, (int)j);
	d->backoff_ms = d->backoff_ms + d->backoff_ms / 2 > BACKOFF_CAP_MS
			    ? BACKOFF_CAP_MS
			    : d->backoff_ms + d->backoff_ms / 2;
	return true;
}

/* The dialing ran out of time or rounds after `last`: the cause recorded,
 * and CRUN_ETIMEDOUT for any failure a later try might have cured. */
static int dial_give_up(struct client_conn *c, const struct dial *d, int last)
{
	if (d->hung_up && last != CRUN_ECONNREFUSED)
		/* A TLS or authenticating server hangs up on a client without
		 * them, and says nothing a plaintext client could read. */
		(void)client_set_err(
		    c, CRUN_ETIMEDOUT, "connect", NULL, 0,
		    "the server closed every connection during the handshake "
		    "(does it require TLS (tls_ca) or a secret (auth_secret_file)?)");
	else if (!d->one_round && !c->broken)
		/* Opening: the cause, not only "timed out" (a revive says its own). */
		(void)client_set_err(
		    c, last, "connect", NULL, 0, "%s (tried for %llu s)", d->what,
		    (unsigned long long)((clock_now_ms() - d->start_ms + 500) / 1000));
	return last == CRUN_ETIMEDOUT || last == CRUN_ECONNREFUSED || last == CRUN_ECLOSED ||
		       last == CRUN_ECONNRESET
		   ? CRUN_ETIMEDOUT
		   : last;
}

/* Resolves and connects to c->host:c->port until the deadline, with
 * exponential backoff and jitter between rounds (every address is tried once
 * per round; one_round: no second round). From refused_until on, a round
 * whose last answer was "connection refused" ends the dialing with it. */
static int conn_dial(struct client_conn *c, uint64_t deadline, bool one_round,
		     uint64_t refused_until)
{
	struct dial d = {.deadline = deadline,
			 .refused_until = refused_until,
			 .start_ms = clock_now_ms(),
			 .one_round = one_round,
			 .backoff_ms = BACKOFF_START_MS};
	int last = CRUN_ETIMEDOUT;
	bool done;
	int n;

	n = snprintf(d.port, sizeof(d.port), "%u", (unsigned)c->port);
	(void)n;
	/* A bound on rounds as well as on time: 0 ms means one round only. */
	for (unsigned round = 0; round < 1000000; round++) {
		last = dial_round(c, &d, &done);
		if (done)
			return last;
		if (last == CRUN_ECONNREFUSED && refused_until != NO_DEADLINE &&
		    clock_now_ms() >= refused_until)
			return last;
		log_at(LL_DEBUG, SUB_STORE, "connect to %s: %s; retrying", c->peer,
		       crun_strerror(last));
		d.hung_up |= last == CRUN_ECLOSED || last == CRUN_ECONNRESET;
		if (!dial_pause(c, &d, round, last))
			break;
	}
	return dial_give_up(c, &d, last);
}

/* Loads the secret before connecting: a bad file fails at once, named. */
static int client_secret(struct client_conn *c, const char *path, const char *job)
{
	char why[512];
	int r;

	c->secret = malloc(sizeof(*c->secret));
	c->auth_job = str_dup(job ? job : "");
	if (!c->secret || !c->auth_job)
		return CRUN_ENOMEM;
	r = store_auth_secret_read(path, c->secret, why, sizeof(why));
	if (r < 0) {
		log_at(LL_DEBUG, SUB_STORE, "%s", why); /* callers check the file first */
		return r;
	}
	if (strlen(c->auth_job) > STORE_AUTH_JOB_MAX)
		return CRUN_EINVAL;
	return 0;
}

int client_ext_hello(struct client_conn *c, uint64_t deadline)
{
	struct store_ext_req q = {
	    .op = STORE_EXT_HELLO, .magic = STORE_EXT_MAGIC, .version = STORE_EXT_VERSION};
	uint8_t rep[4];

	TRY(client_ext_rpc(c, &q, rep, deadline));
	if (store_get_u32(rep) < 1) {
		client_break(c);
		return CRUN_EPROTO;
	}
	c->ext = true;
	c->ext_used = true;
	c->ext_version = store_get_u32(rep);
	return 0;
}

void client_lease_forget(struct client_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nleases; i++) {
		if (c->leases[i] == id) {
			c->leases[i] = c->leases[--c->nleases];
			return;
		}
	}
}

/* Remembers a lease to re-attach after a reconnect (bounded like the
 * server's registrations; past that a lease is simply not re-attached). */
void client_lease_note(struct client_conn *c, uint64_t id)
{
	for (size_t i = 0; i < c->nleases; i++)
		if (c->leases[i] == id)
			return;
	if (c->nleases >= c->lim.max_items ||
	    client_grow((void **)&c->leases, &c->lcap, c->nleases + 1, sizeof(*c->leases)) < 0)
		return;
	c->leases[c->nleases++] = id;
}

/* On a new connection: HELLO again, then LEASE_ATTACH every lease held. One
 * whose TTL lapsed meanwhile is not found: it stays dead (its expiry key is
 * set), and later calls on it answer CRUN_ENOTFOUND. */
static int ext_reopen(struct client_conn *c, uint64_t deadline)
{
	TRY(client_ext_hello(c, deadline));
	if (c->ext_version < STORE_EXT_VERSION_ATTACH) {
		c->nleases = 0; /* an old server ended them with the old connection */
		return 0;
	}
	for (size_t i = 0; i < c->nleases && i < c->lim.max_items;) {
		struct store_ext_req q = {.op = STORE_EXT_LEASE_ATTACH, .id = c->leases[i]};
		uint8_t st;

		TRY(client_ext_rpc(c, &q, &st, deadline));
		if (st == STORE_EXT_OK)
			i++;
		else
			client_lease_forget(c, c->leases[i]);
	}
	return 0;
}

/* Dials again after the connection was lost (why: c->broke), within
 * reconnect_ms and the caller's deadline: greeting, HELLO and lease
 * re-attach, then the replay of unconfirmed writes. 0 when the connection is
 * back; an error (recorded, the handle stays broken) when it is not, or when
 * an unconfirmed write could not be replayed (then the connection is back but
 * this call fails, saying so). */
int client_revive(struct client_conn *c, const char *name, uint64_t deadline)
{
	uint64_t d = client_deadline(c->reconnect_ms);
	size_t log_len = c->ulen;
	const char *lossy = c->lossy;
	bool replayed = c->replayed;
	char why[sizeof(c->broke)];
	int r;

	if (!c->reconnect_ms)
		return client_set_err(c, CRUN_ENOTCONN, name, NULL, 0,
				      "connection closed after an earlier failure: %s", c->broke);
	/* Replayed once and lost again before a reply: maybe the server closes
	 * on that very write (over its limits). Not again: fail, saying so. */
	if (log_len && replayed) {
		lossy = "SET (already replayed once)";
		log_len = 0;
		replayed = false;
	}
	memcpy(why, c->broke, sizeof(why));
	if (deadline < d)
		d = deadline;
	client_break(c);
	/* its PING reply clears ulen: restored below */
	r = conn_dial(c, d, false,
		      c->broke_r == CRUN_ECLOSED || c->broke_r == CRUN_EPIPE
			  /* The server closed in order: it has GONE_MS from the
			   * loss, not from each call, to take dials again; a
			   * caller whose calls are shorter than that (a waiter
			   * between heartbeats) hears of the refusal too. */
			  ? c->broke_ms + GONE_MS
			  : NO_DEADLINE);
	if (r == 0 && c->ext_used)
		r = ext_reopen(c, d);
	if (r == 0 && log_len) {
		r = store_io_send(c->fd, c->tls, c->unacked, log_len, d);
		replayed = true;
	}
	c->ulen = log_len; /* still unconfirmed until the next reply */
	c->lossy = lossy;
	c->replayed = replayed;
	if (r < 0) {
		client_break(c);
		return client_set_err(c, r, name, NULL, 0,
				      "connection lost (%s); reconnecting failed: %s", why,
				      client_cause(c, r));
	}
	c->broken = false;
	c->broke[0] = '\0';
	c->broke_r = 0;
	log_at(LL_DEBUG, SUB_STORE, "reconnected to %s after: %s", c->peer, why);
	if (lossy) {
		c->lossy = NULL;
		return client_set_err(
		    c, CRUN_ECONNRESET, name, NULL, 0,
		    "connection lost (%s) before an earlier %s was confirmed: it may "
		    "not have been applied (reconnected; this call was not sent)",
		    why, lossy);
	}
	return 0;
}

CRUN_API int crun_store_open(const crun_store_opts_t *opts, crun_store_t **ret_store)
{
	return store_client_open(opts, NULL, ret_store);
}

/* The fields of a new connection from the caller's options (checked). */
static int conn_init(struct client_conn *c, const struct crun_store_opts *opts, int dialect,
		     uint32_t timeout_ms, uint32_t reconnect_ms)
{
	struct store_limits lim = STORE_LIMITS_DEFAULT;
	int r;

	c->refs = 1;
	c->fd = -1;
	c->dialect = (enum store_dialect)dialect;
	c->timeout_ms = timeout_ms;
	c->reconnect_ms = reconnect_ms;
	c->lim = lim;
	c->port = opts->port;
	c->host = str_dup(opts->host);
	if (!c->host)
		return CRUN_ENOMEM;
	c->rng = clock_now_us() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)c;
	if (!c->rng)
		c->rng = 1;
	r = snprintf(c->peer, sizeof(c->peer), strchr(opts->host, ':') ? "[%s]:%u" : "%s:%u",
		     opts->host, (unsigned)opts->port);
	if (r < 0 || (size_t)r >= sizeof(c->peer))
		return CRUN_EINVAL;
	return 0;
}

/* The TLS context and the secret the options name, loaded before dialing. */
static int conn_secure(struct client_conn *c, const struct crun_store_opts *opts)
{
	int r;

	if (OPT_HAS(opts, tls_ca) && opts->tls_ca) {
		struct store_tls_opts tlo = {
		    .ca = opts->tls_ca,
		    .cert = OPT_HAS(opts, tls_cert) ? opts->tls_cert : NULL,
		    .key = OPT_HAS(opts, tls_key) ? opts->tls_key : NULL,
		    .min_version = OPT_HAS(opts, tls_min_version) ? opts->tls_min_version : 0};
		char why[600];

		r = store_tls_new_client(&tlo, &c->tls_ctx, why, sizeof(why));
		if (r < 0) {
			log_at(LL_DEBUG, SUB_STORE, "%s", why);
			return r;
		}
	}
	if (OPT_HAS(opts, auth_secret_file) && opts->auth_secret_file)
		return client_secret(c, opts->auth_secret_file,
				     OPT_HAS(opts, auth_job) ? opts->auth_job : NULL);
	return 0;
}

int store_client_open(const struct crun_store_opts *opts, const struct store_dial_report *rep,
		      struct crun_store **ret_store)
{
	struct client_conn *c;
	struct crun_store *s;
	const char *prefix = NULL;
	int dialect = CRUN_STORE_V2;
	uint32_t cto = 30000, to = 300000, reconnect = CRUN_STORE_RECONNECT_MS_DEFAULT;
	int r;

	if (!opts || !ret_store || !OPT_HAS(opts, port) || !opts->host || !*opts->host)
		return CRUN_EINVAL;
	if (OPT_HAS(opts, connect_timeout_ms))
		cto = opts->connect_timeout_ms;
	if (OPT_HAS(opts, timeout_ms))
		to = opts->timeout_ms;
	if (OPT_HAS(opts, dialect))
		dialect = opts->dialect;
	if (OPT_HAS(opts, prefix))
		prefix = opts->prefix;
	if (OPT_HAS(opts, reconnect_ms))
		reconnect = opts->reconnect_ms;
	if (dialect != CRUN_STORE_V1 && dialect != CRUN_STORE_V2)
		return CRUN_EINVAL;
	/* NULL or "" means no prefix here; crun_store_view_new("") follows
	 * PrefixStore exactly and adds an empty layer ("//k"). */
	if (prefix && !*prefix)
		prefix = NULL;

	c = calloc(1, sizeof(*c));
	s = calloc(1, sizeof(*s));
	if (!c || !s) {
		r = CRUN_ENOMEM;
		goto fail;
	}
	r = conn_init(c, opts, dialect, to, reconnect);
	if (r < 0)
		goto fail;
	s->conn = c;
	r = conn_secure(c, opts);
	if (r < 0)
		goto fail;
	r = make_prefix("/", 1, prefix, &s->pfx, &s->pfx_len);
	if (r < 0)
		goto fail;
	/* connect_timeout_ms = 0: one round, bounded by the op timeout. */
	c->rep = rep;
	r = conn_dial(c, client_deadline(cto ? cto : to), cto == 0, NO_DEADLINE);
	c->rep = NULL;
	if (r < 0 && rep && rep->err && rep->err_cap)
		(void)snprintf(rep->err, rep->err_cap, "%s", c->err[0] ? c->err : crun_strerror(r));
	if (r < 0) {
		log_at(LL_INFO, SUB_STORE, "cannot connect to store %s (v%d): %s", c->peer, dialect,
		       c->err[0] ? c->err : crun_strerror(r));
		goto fail;
	}
	*ret_store = s;
	return 0;
fail:
	if (s)
		free(s->pfx);
	free(s);
	client_conn_free(c);
	return r;
}

CRUN_API int crun_store_view_new(crun_store_t *base, const char *prefix, crun_store_t **ret_view)
{
	struct crun_store *v;
	int r;

	if (!base || !prefix || !ret_view)
		return CRUN_EINVAL;
	v = calloc(1, sizeof(*v));
	if (!v)
		return CRUN_ENOMEM;
	r = make_prefix(base->pfx, base->pfx_len, prefix, &v->pfx, &v->pfx_len);
	if (r < 0) {
		free(v);
		return r;
	}
	v->conn = base->conn;
	v->conn->refs++;
	*ret_view = v;
	return 0;
}

CRUN_API void crun_store_close(crun_store_t *s)
{
	if (!s)
		return;
	if (--s->conn->refs == 0)
		client_conn_free(s->conn);
	free(s->pfx);
	free(s);
}

CRUN_API const char *crun_store_last_error(const crun_store_t *s)
{
	if (!s)
		return "no store handle";
	return s->conn->err[0] ? s->conn->err : "no error";
}

CRUN_API void crun_store_set_timeout(crun_store_t *s, uint32_t timeout_ms)
{
	if (s)
		s->conn->timeout_ms = timeout_ms;
}
