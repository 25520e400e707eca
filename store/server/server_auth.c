/* server_auth.c: the store server's pre-auth gate (auth.h). When the server
 * has a table of secrets, a new connection starts "pre-auth": the server
 * sends a challenge and reads at most one ANSWER frame (the read high
 * watermark is lowered to its maximum size), answers no store op, and closes
 * the connection - logged with the peer address and counted - on anything
 * but a valid answer. After the proof went out the connection is a normal
 * store connection, limited to its job's keys when its secret was per-job.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <openssl/crypto.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

struct conn_auth {
	uint8_t nonce_s[STORE_AUTH_NONCE_BYTES];
	bool done;
	struct store_auth_grant grant;
	char why[STORE_AUTH_JOB_MAX + 64]; /* a refusal's cause, for the drop's log line */
};

/* The cause of a refused answer in an operator's words: a client without
 * a secret sends no answer at all (a PyTorch TCPStore's first frame), one
 * with another secret a MAC that does not match. The run id is the
 * client's, so only its printable bytes are shown. */
static const char *refusal(struct conn_auth *a, int r, const uint8_t *p, size_t len)
{
	char job[65];
	size_t jl = len > 5 ? MIN((size_t)p[4], len - 5) : 0, n = 0;
	int w;

	if (r == CRUN_EPROTO)
		return "authentication required: the client sent no authentication answer (it has "
		       "no secret)";
	for (size_t i = 0; i < jl && n < sizeof(job) - 1; i++)
		job[n++] = p[5 + i] >= 0x20 && p[5 + i] < 0x7f ? (char)p[5 + i] : '?';
	job[n] = '\0';
	if (r == CRUN_ENOENT)
		w = snprintf(a->why, sizeof(a->why), "unknown run id '%s': no secret for it", job);
	else if (r == CRUN_EACCES)
		w = snprintf(a->why, sizeof(a->why), "wrong secret for run id '%s'", job);
	else
		w = snprintf(a->why, sizeof(a->why), "authentication: %s", crun_strerror(r));
	return w < 0 ? "authentication" : a->why;
}

int store_conn_auth_start(struct store_conn *c)
{
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES];
	struct conn_auth *a;

	if (!c->srv->cfg.auth)
		return 0;
	a = calloc(1, sizeof(*a));
	if (!a)
		return CRUN_ENOMEM;
	c->auth = a;
	TRY(store_auth_nonce(a->nonce_s));
	store_auth_encode_challenge(a->nonce_s, ch);
	if (evbuffer_add(store_conn_out(c), ch, sizeof(ch)) < 0)
		return CRUN_ENOMEM;
	/* Read no more than one answer until it checks out. */
	bufferevent_setwatermark(c->bev, EV_READ, 0, STORE_AUTH_ANSWER_MAX);
	return 0;
}

void store_conn_auth_free(struct store_conn *c)
{
	if (c->auth)
		OPENSSL_cleanse(c->auth, sizeof(*c->auth));
	free(c->auth);
	c->auth = NULL;
}

bool store_conn_auth_pending(const struct store_conn *c)
{
	return c->auth && !c->auth->done;
}

int store_conn_auth_read(struct store_conn *c, const char **ret_why)
{
	struct evbuffer *in = bufferevent_get_input(c->bev);
	size_t len = evbuffer_get_length(in), used;
	const uint8_t *p;
	int r;

	if (len == 0)
		return 0;
	p = evbuffer_pullup(in, (ev_ssize_t)len);
	if (!p)
		return CRUN_ENOMEM;
	r = store_auth_verify(STORE_AUTH_STORE, c->srv->cfg.auth, c->auth->nonce_s, p, len, &used,
			      &c->auth->grant);
	if (r == CRUN_EAGAIN)
		return 0;
	if (r == 0 && len > used) {
		/* The client must wait for our proof: bytes behind the answer
		 * are a client that does not follow the protocol. */
		*ret_why = "bytes behind the authentication answer (not a crun client)";
		return CRUN_EPROTO;
	}
	if (r < 0) {
		*ret_why = refusal(c->auth, r, p, len);
		return r;
	}
	evbuffer_drain(in, used);
	if (evbuffer_add(store_conn_out(c), c->auth->grant.proof, STORE_AUTH_PROOF_BYTES) < 0)
		return CRUN_ENOMEM;
	c->auth->done = true;
	bufferevent_setwatermark(c->bev, EV_READ, 0, c->srv->cfg.max_conn_buffered_bytes);
	log_at(LL_DEBUG, SUB_STORE, "client authenticated for run id '%s'%s", c->auth->grant.job,
	       c->auth->grant.scoped ? " (its keys only)" : "");
	return 1;
}

bool store_conn_key_visible(const struct store_conn *c, const uint8_t *key, size_t len)
{
	return !c->auth || store_auth_key_allowed(&c->auth->grant, key, len);
}

const char *store_conn_job(const struct store_conn *c)
{
	return c->auth && c->auth->done && c->auth->grant.job[0] ? c->auth->grant.job : NULL;
}

bool store_conn_scoped(const struct store_conn *c)
{
	return c->auth && c->auth->grant.scoped;
}

static int key_refused(void *arg, const uint8_t *key, size_t len)
{
	return store_conn_key_visible(arg, key, len) ? 0 : CRUN_EACCES;
}

/* Every key a request names must be in the connection's scope: which
 * fields are keys comes from the codec's tables (proto.c, STORE_EXT_OPS),
 * so an op added there is checked here without a line of its own. */
int store_conn_auth_check_req(const struct store_conn *c, const struct store_req *q)
{
	if (!store_conn_scoped(c))
		return 0;
	switch (store_proto_op_reach(q->op)) {
	case STORE_REACH_ALL_FILTERED:
		return 0; /* server_ops.c answers with the client's own keys */
	case STORE_REACH_ALL:
		return CRUN_EACCES; /* would count other jobs' keys */
	default:
		return store_proto_req_each_key(q, key_refused, (void *)c);
	}
}

int store_conn_auth_check_ext(const struct store_conn *c, const uint8_t *p, size_t len)
{
	struct store_ext_req q;
	size_t used;
	int r;

	if (!store_conn_scoped(c))
		return 0;
	r = store_ext_decode_req(&c->srv->cfg.limits, p, len, &q, &used);
	if (r < 0)
		return 0; /* partial or malformed: store_ext_process deals with it */
	return store_ext_req_each_key(&q, key_refused, (void *)c);
}
