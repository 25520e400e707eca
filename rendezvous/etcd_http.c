/* etcd_http.c: the transport of the etcd backend (etcd_int.h): endpoint and
 * rdzv_conf parsing, a handle's private event_base and connections (plain or
 * TLS through libevent's OpenSSL bufferevents), the auth token, requests with
 * per-attempt timeouts that fail over across the members, and the /v3/watch
 * stream read line by line as the gateway sends it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "common/common.h"
#include "rendezvous/etcd_int.h"

#define ETCD_ATTEMPT_ONE_MS 10000	/* the same with a single member */
#define ETCD_ATTEMPT_MS	    2000	/* one request on one member: about two election timeouts */
#define ETCD_BODY_MAX	    (16u << 20) /* a reply; etcd's own limit is 1.5 MiB */
#define ETCD_MAX_TRIES	    (1 << 16)	/* a bound only: the deadline ends a call */
#define ETCD_WATCH_IDLE	    (24u * 3600) /* s: the stream is idle by design */
#define ETCD_LINE_MAX	    (4u << 20)	 /* one watch message */

/* ---- configuration ---------------------------------------------------------- */

int etcd_parse_endpoints(const char *list, struct etcd_conf *conf, char *err, size_t cap)
{
	const char *p = list ? list : "";

	conf->n_ep = 0;
	while (*p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		struct etcd_endpoint *ep;
		char item[300];

		if (len == 0 || len >= sizeof(item) || conf->n_ep == ETCD_MAX_ENDPOINTS) {
			snprintf(err, cap,
				 "argument --rdzv_endpoint: '%.200s' is not a list of at most %d "
				 "host:port entries",
				 list, ETCD_MAX_ENDPOINTS);
			return CRUN_EINVAL;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		ep = &conf->ep[conf->n_ep];
		{
			const char *hp = item;

			if (strncmp(hp, "https://", 8) == 0) {
				conf->https = true;
				hp += 8;
			} else if (strncmp(hp, "http://", 7) == 0) {
				hp += 7;
			}
			if (parse_host_port(hp, ETCD_DEFAULT_PORT, ep->host, sizeof(ep->host),
					    &ep->port) < 0 ||
			    ep->port == 0) {
				snprintf(err, cap,
					 "argument --rdzv_endpoint: invalid etcd endpoint '%s' "
					 "(expected host[:port])",
					 item);
				return CRUN_EINVAL;
			}
		}
		conf->n_ep++;
		if (!end)
			break;
		p = end + 1;
	}
	if (conf->n_ep == 0) {
		snprintf(err, cap, "argument --rdzv_endpoint: no etcd endpoint given");
		return CRUN_EINVAL;
	}
	return 0;
}

/* One table for the etcd keys of rdzv_conf (torchrun's names and aliases). */
enum conf_kind { CK_PROTOCOL, CK_FILE, CK_PREFIX, CK_USER };
static const struct {
	const char *name;
	enum conf_kind kind;
	size_t off, cap;
} conf_keys[] = {
#define F(n, k, field)                                                                          \
	{                                                                                       \
		n, k, offsetof(struct etcd_conf, field), sizeof(((struct etcd_conf *)0)->field) \
	}
    {"protocol", CK_PROTOCOL, 0, 0},  F("cacert", CK_FILE, cacert),
    F("ca_cert", CK_FILE, cacert),    F("cert", CK_FILE, cert),
    F("ssl_cert", CK_FILE, cert),     F("key", CK_FILE, key),
    F("ssl_cert_key", CK_FILE, key),  F("key_prefix", CK_PREFIX, prefix),
    F("username", CK_USER, username), F("password_file", CK_FILE, password_file),
#undef F
};

static int conf_item(struct etcd_conf *c, const char *k, const char *v, bool *ret_taken, char *err,
		     size_t cap)
{
	for (size_t i = 0; i < sizeof(conf_keys) / sizeof(conf_keys[0]); i++) {
		char *dst = (char *)c + conf_keys[i].off;

		if (strcmp(k, conf_keys[i].name) != 0)
			continue;
		*ret_taken = true;
		switch (conf_keys[i].kind) {
		case CK_PROTOCOL:
			if (strcmp(v, "http") != 0 && strcmp(v, "https") != 0) {
				snprintf(err, cap,
					 "argument --rdzv_conf: protocol=%s (expected http or "
					 "https)",
					 v);
				return CRUN_EINVAL;
			}
			c->https = strcmp(v, "https") == 0;
			return 0;
		case CK_FILE:
			if (access(v, R_OK) < 0) {
				snprintf(err, cap, "argument --rdzv_conf: %s=%s: %s", k, v,
					 strerror(errno));
				return CRUN_EINVAL;
			}
			break;
		case CK_PREFIX:
			if (v[0] != '/' || v[strlen(v) - 1] == '/') {
				snprintf(err, cap,
					 "argument --rdzv_conf: key_prefix=%s must start with '/' "
					 "and not end with one",
					 v);
				return CRUN_EINVAL;
			}
			break;
		case CK_USER:
			break;
		}
		if (str_printf(dst, conf_keys[i].cap, "%s", v) < 0) {
			snprintf(err, cap, "argument --rdzv_conf: %s is too long", k);
			return CRUN_EINVAL;
		}
		return 0;
	}
	*ret_taken = false;
	return 0;
}

int etcd_parse_conf(const char *rdzv_conf, struct etcd_conf *conf, char *rest, size_t rest_cap,
		    char *err, size_t cap)
{
	size_t o = 0;

	rest[0] = '\0';
	for (const char *p = rdzv_conf ? rdzv_conf : ""; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char item[ETCD_PATH_MAX + 32], *eq;
		bool taken = false;

		if (len >= sizeof(item)) {
			snprintf(err, cap, "argument --rdzv_conf: item too long");
			return CRUN_EINVAL;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		eq = strchr(item, '=');
		if (eq && eq != item && eq[1]) {
			*eq = '\0';
			TRY(conf_item(conf, item, eq + 1, &taken, err, cap));
			*eq = '=';
		}
		if (!taken && len) { /* c10d's key, or junk c10d names */
			if (o + len + 2 > rest_cap) {
				snprintf(err, cap, "argument --rdzv_conf: too long");
				return CRUN_EINVAL;
			}
			o += (size_t)snprintf(rest + o, rest_cap - o, "%s%s", o ? "," : "", item);
		}
		if (!end)
			break;
		p = end + 1;
	}
	if ((conf->cert[0] != 0) != (conf->key[0] != 0)) {
		snprintf(err, cap, "argument --rdzv_conf: cert and key go together");
		return CRUN_EINVAL;
	}
	if (conf->username[0] && !conf->password_file[0]) {
		snprintf(err, cap, "argument --rdzv_conf: username needs password_file");
		return CRUN_EINVAL;
	}
	return 0;
}

int etcd_prefix(const struct etcd_conf *conf, const char *run_id, char *buf, size_t cap)
{
	if (conf->prefix[0])
		return str_printf(buf, cap, "%s", conf->prefix);
	return str_printf(buf, cap, "/crun/rdzv/%s", run_id);
}

/* ---- helpers ------------------------------------------------------------------ */

int etcd_fail(struct etcd *e, int r, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(e->err, sizeof(e->err), fmt, ap);
	va_end(ap);
	return r;
}

const char *etcd_last_error(const struct etcd *e)
{
	return e ? e->err : "no etcd handle";
}

uint32_t etcd_timeout_ms(const struct etcd *e)
{
	return e->timeout_ms;
}

char *etcd_b64(const char *p, size_t len)
{
	char *out = malloc(4 * ((len + 2) / 3) + 1);

	if (out)
		EVP_EncodeBlock((unsigned char *)out, (const unsigned char *)p, (int)len);
	return out;
}

int etcd_unb64(const char *s, char **ret, size_t *ret_len)
{
	size_t n = strlen(s);
	char *out;
	int len;

	if (n % 4)
		return CRUN_EPROTO;
	out = malloc(n / 4 * 3 + 1);
	if (!out)
		return CRUN_ENOMEM;
	len = EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)s, (int)n);
	if (len < 0) {
		free(out);
		return CRUN_EPROTO;
	}
	/* EVP_DecodeBlock counts the padding as zero bytes. */
	for (size_t i = n; i > 0 && s[i - 1] == '='; i--)
		len--;
	out[len] = '\0';
	*ret = out;
	if (ret_len)
		*ret_len = (size_t)len;
	return 0;
}

int64_t etcd_json_i64(const cJSON *obj, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
	int64_t x = 0;

	if (cJSON_IsString(v) && parse_i64(v->valuestring, &x) == 0)
		return x;
	if (cJSON_IsNumber(v))
		return (int64_t)v->valuedouble;
	return 0;
}

static struct timeval ms_tv(uint64_t ms)
{
	return (struct timeval){.tv_sec = (time_t)(ms / 1000), .tv_usec = (long)(ms % 1000) * 1000};
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	((struct etcd *)arg)->ticked = true;
}

/* Runs the handle's loop until *flag turns true or until_ms passes. */
static void run_until(struct etcd *e, const bool *flag, uint64_t until_ms)
{
	uint64_t now = clock_now_ms();
	struct timeval tv = ms_tv(until_ms > now ? until_ms - now : 0);

	e->ticked = false;
	if (evtimer_add(e->tick, &tv) < 0)
		return;
	for (int i = 0; i < 1 << 30 && !*flag && !e->ticked; i++)
		if (event_base_loop(e->base, EVLOOP_ONCE) < 0)
			break;
	evtimer_del(e->tick);
}

/* ---- connections ------------------------------------------------------------- */

static struct evhttp_connection *conn_new(struct etcd *e, int ep, uint64_t timeout_ms)
{
	const struct etcd_endpoint *p = &e->conf.ep[ep];
	bool v6 = strchr(p->host, ':') != NULL;
	struct bufferevent *bev = NULL;
	struct evhttp_connection *c;
	struct timeval tv = ms_tv(timeout_ms);

	if (e->ssl) {
		SSL *ssl = SSL_new(e->ssl);
		X509_VERIFY_PARAM *vp;
		struct in6_addr a;

		if (!ssl)
			return NULL;
		vp = SSL_get0_param(ssl);
		/* The members' certificates must name what we dialled. */
		if (inet_pton(AF_INET, p->host, &a) == 1 || inet_pton(AF_INET6, p->host, &a) == 1) {
			X509_VERIFY_PARAM_set1_ip_asc(vp, p->host);
		} else {
			SSL_set_tlsext_host_name(ssl, p->host);
			X509_VERIFY_PARAM_set1_host(vp, p->host, 0);
		}
		bev =
		    bufferevent_openssl_socket_new(e->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
						   BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
		if (!bev)
			return NULL;
		bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
	}
	c = evhttp_connection_base_bufferevent_new(e->base, NULL, bev, p->host, p->port);
	if (!c) {
		if (bev)
			bufferevent_free(bev);
		return NULL;
	}
	evhttp_connection_set_family(c, v6 ? AF_INET6 : AF_INET);
	/* With a local address evhttp makes its socket through its bind path,
	 * which opens it close-on-exec; its plain connect path does not, and
	 * the agent forks workers while this thread holds the socket. */
	evhttp_connection_set_local_address(c, v6 ? "::" : "0.0.0.0");
	evhttp_connection_set_timeout_tv(c, &tv);
	evhttp_connection_set_retries(c, 0);
	return c;
}

static void conn_drop(struct etcd *e)
{
	if (e->conn)
		evhttp_connection_free(e->conn);
	e->conn = NULL;
}

/* Moves to the next member (a connection error, a timeout, no leader). */
static void next_member(struct etcd *e)
{
	conn_drop(e);
	e->ep = (e->ep + 1) % e->conf.n_ep;
	e->moves++;
}

struct reply {
	bool done;
	int status;
	char *body;
};

static void on_reply(struct evhttp_request *req, void *arg)
{
	struct reply *rp = arg;
	struct evbuffer *in;
	size_t n;

	rp->done = true;
	if (!req)
		return;
	rp->status = evhttp_request_get_response_code(req);
	in = evhttp_request_get_input_buffer(req);
	n = evbuffer_get_length(in);
	if (n > ETCD_BODY_MAX)
		return;
	rp->body = malloc(n + 1);
	if (!rp->body)
		return;
	evbuffer_remove(in, rp->body, n);
	rp->body[n] = '\0';
}

static int add_headers(struct etcd *e, struct evhttp_request *req, int ep, bool auth)
{
	struct evkeyvalq *h = evhttp_request_get_output_headers(req);
	char host[300];

	TRY(str_printf(host, sizeof(host), "%s:%u", e->conf.ep[ep].host, e->conf.ep[ep].port));
	if (evhttp_add_header(h, "Host", host) < 0 ||
	    evhttp_add_header(h, "Content-Type", "application/json") < 0 ||
	    (auth && e->token[0] && evhttp_add_header(h, "Authorization", e->token) < 0))
		return CRUN_ENOMEM;
	return 0;
}

/* One request on the current member: 0 with *rp filled (status 0 = no
 * answer), or a local error. */
static int attempt(struct etcd *e, const char *path, const char *body, uint64_t timeout_ms,
		   bool auth, struct reply *rp)
{
	struct evhttp_request *req;
	struct timeval tv = ms_tv(timeout_ms);

	if (!e->conn)
		e->conn = conn_new(e, e->ep, timeout_ms);
	if (!e->conn)
		return CRUN_ENOMEM;
	evhttp_connection_set_timeout_tv(e->conn, &tv);
	req = evhttp_request_new(on_reply, rp);
	if (!req)
		return CRUN_ENOMEM;
	if (add_headers(e, req, e->ep, auth) < 0 ||
	    evbuffer_add(evhttp_request_get_output_buffer(req), body, strlen(body)) < 0) {
		evhttp_request_free(req);
		return CRUN_ENOMEM;
	}
	if (evhttp_make_request(e->conn, req, EVHTTP_REQ_POST, path) < 0) {
		/* evhttp freed req. */
		conn_drop(e);
		return 0;
	}
	run_until(e, &rp->done, clock_now_ms() + timeout_ms + 1000);
	if (!rp->done) {
		/* The connection's own timeout did not fire: drop it (that frees
		 * the request without calling back). */
		conn_drop(e);
		rp->done = true;
	}
	return 0;
}

enum verdict { V_OK, V_MOVE, V_AUTH, V_FAIL };

/* Why a member gave no answer at the transport level: tcp_probe to it,
 * bounded by PROBE_MS, so the message names the errno - "connection
 * refused" - where evhttp only says the request failed. 0 when it connects
 * (then the member is up but did not answer in time). Used while opening
 * (etcd_open_report's say_retry). */
#define PROBE_MS 1000

/* What an answer means. The gateway maps gRPC errors to
 * {"error": ..., "code": <gRPC code>, "message": ...}. */
static enum verdict judge(struct etcd *e, const struct reply *rp, cJSON **ret_json, int *ret_err)
{
	cJSON *j = rp->body ? cJSON_Parse(rp->body) : NULL;
	const cJSON *msg;
	int code;

	*ret_json = NULL;
	if (rp->status == 0) {
		/* Only while opening: a probe of a partitioned member costs up to
		 * PROBE_MS, which a fail-over of a running job must not pay. */
		const struct etcd_endpoint *ep = &e->conf.ep[e->ep];
		int why = e->say_retry ? tcp_probe(ep->host, ep->port, PROBE_MS, NULL, 0) : 0;

		etcd_fail(e, CRUN_ECONNREFUSED, "no answer from %s:%u%s%s", ep->host, ep->port,
			  why ? ": " : "", why ? crun_strerror(why) : "");
		*ret_err = CRUN_ECONNREFUSED;
		cJSON_Delete(j);
		return V_MOVE;
	}
	if (rp->status == 200 && j) {
		*ret_json = j;
		return V_OK;
	}
	code = j ? (int)etcd_json_i64(j, "code") : 0;
	msg = j ? cJSON_GetObjectItemCaseSensitive(j, "message") : NULL;
	if (!cJSON_IsString(msg))
		msg = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
	etcd_fail(e, CRUN_EPROTO, "etcd %s:%u answered %d: %.300s", e->conf.ep[e->ep].host,
		  e->conf.ep[e->ep].port, rp->status,
		  cJSON_IsString(msg) ? msg->valuestring : (rp->body ? rp->body : "(no body)"));
	cJSON_Delete(j);
	*ret_err = CRUN_EPROTO;
	/* 14 Unavailable (leader changed, no leader, request timed out), 4
	 * DeadlineExceeded, 503/502 from the gateway: another member may do. */
	if (code == 14 || code == 4 || rp->status == 503 || rp->status == 502)
		return V_MOVE;
	if (code == 16 || strstr(e->err, "user name is empty") || strstr(e->err, "auth token"))
		return V_AUTH;
	if (code == 7 || strstr(e->err, "authentication failed")) {
		*ret_err = CRUN_EACCES; /* permission denied, wrong password */
	} else if (code == 8 || strstr(e->err, "too large") || strstr(e->err, "too many")) {
		*ret_err = CRUN_ETOOBIG;
	} else if (code == 5) {
		*ret_err = CRUN_ENOTFOUND;
	}
	return V_FAIL;
}

static int authenticate(struct etcd *e);

int etcd_call(struct etcd *e, const char *path, const char *body, cJSON **ret_json)
{
	uint64_t start = clock_now_ms(), deadline = start + e->timeout_ms;
	bool auth = strcmp(path, "/v3/auth/authenticate") != 0;
	int r = CRUN_ETIMEDOUT, reauth = 0, moves = 0;

	for (int i = 0; i < ETCD_MAX_TRIES; i++) {
		uint64_t now = clock_now_ms();
		struct reply rp = {0};
		cJSON *j = NULL;
		int err = 0;

		if (i > 0 && now >= deadline)
			break;
		/* One member: no other to try, so a longer wait before the
		 * request is resent (resending only adds to a loaded server's
		 * work; a lost request still ends). */
		r = attempt(e, path, body,
			    MIN(e->conf.n_ep > 1 ? ETCD_ATTEMPT_MS : ETCD_ATTEMPT_ONE_MS,
				MAX(deadline - now, 1)),
			    auth, &rp);
		if (r < 0)
			return etcd_fail(e, r, "%s: %s", path, crun_strerror(r));
		switch (judge(e, &rp, &j, &err)) {
		case V_OK:
			free(rp.body);
			*ret_json = j;
			return 0;
		case V_FAIL:
			free(rp.body);
			return err;
		case V_AUTH:
			free(rp.body);
			if (!auth || reauth++ > 2 || !e->conf.username[0])
				return CRUN_EACCES;
			e->token[0] = '\0';
			TRY(authenticate(e));
			continue;
		case V_MOVE:
			free(rp.body);
			r = err;
			next_member(e);
			break;
		}
		/* Every member tried once: back off a little (an election takes
		 * about one election timeout) before the next pass. */
		if (++moves % e->conf.n_ep == 0) {
			uint64_t pause = MIN(50u * (uint64_t)(moves / e->conf.n_ep), 500);

			now = clock_now_ms();
			if (e->say_retry && !e->told && now < deadline) {
				/* Said at once, not after the whole connect timeout. */
				e->told = true;
				log_at(LL_WARN, SUB_RDZV,
				       "cannot reach etcd: %s; retrying for %llu s", e->err,
				       (unsigned long long)((deadline - now + 999) / 1000));
			}
			if (now + pause < deadline)
				usleep((useconds_t)pause * 1000);
		}
	}
	return r == CRUN_EPROTO || r == CRUN_ECONNREFUSED ? CRUN_ETIMEDOUT : r;
}

static int authenticate(struct etcd *e)
{
	cJSON *req = cJSON_CreateObject(), *res = NULL;
	const cJSON *tok;
	char *body = NULL;
	int r = CRUN_ENOMEM;

	if (!req || !cJSON_AddStringToObject(req, "name", e->conf.username) ||
	    !cJSON_AddStringToObject(req, "password", e->password))
		goto out;
	body = cJSON_PrintUnformatted(req);
	if (!body)
		goto out;
	r = etcd_call(e, "/v3/auth/authenticate", body, &res);
	if (r < 0) {
		etcd_fail(e, r, "authenticating as '%s' failed: %s", e->conf.username,
			  crun_strerror(r));
		goto out;
	}
	tok = cJSON_GetObjectItemCaseSensitive(res, "token");
	if (!cJSON_IsString(tok) ||
	    str_printf(e->token, sizeof(e->token), "%s", tok->valuestring) < 0) {
		r = etcd_fail(e, CRUN_EPROTO, "etcd sent no usable auth token");
		goto out;
	}
	r = 0;
out:
	cJSON_Delete(req);
	cJSON_Delete(res);
	free(body);
	return r;
}

/* ---- the handle --------------------------------------------------------------- */

static int ssl_fail(struct etcd *e, const char *what, const char *path)
{
	char buf[256];

	ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
	return etcd_fail(e, CRUN_ECONFIG, "%s '%s': %s", what, path, buf);
}

static int tls_setup(struct etcd *e)
{
	const struct etcd_conf *c = &e->conf;

	e->ssl = SSL_CTX_new(TLS_client_method());
	if (!e->ssl)
		return CRUN_ENOMEM;
	SSL_CTX_set_min_proto_version(e->ssl, TLS1_2_VERSION);
	SSL_CTX_set_verify(e->ssl, SSL_VERIFY_PEER, NULL);
	if (c->cacert[0]) {
		if (SSL_CTX_load_verify_locations(e->ssl, c->cacert, NULL) != 1)
			return ssl_fail(e, "cannot load the CA certificate", c->cacert);
	} else if (SSL_CTX_set_default_verify_paths(e->ssl) != 1) {
		return ssl_fail(e, "cannot load the system CA certificates", "");
	}
	if (c->cert[0]) {
		if (SSL_CTX_use_certificate_chain_file(e->ssl, c->cert) != 1)
			return ssl_fail(e, "cannot load the client certificate", c->cert);
		if (SSL_CTX_use_PrivateKey_file(e->ssl, c->key, SSL_FILETYPE_PEM) != 1 ||
		    SSL_CTX_check_private_key(e->ssl) != 1)
			return ssl_fail(e, "cannot load the client key", c->key);
	}
	return 0;
}

static int read_password(struct etcd *e)
{
	FILE *f = fopen(e->conf.password_file, "re");
	size_t n;

	if (!f)
		return etcd_fail(e, CRUN_ECONFIG, "cannot read password_file '%s': %s",
				 e->conf.password_file, strerror(errno));
	if (!fgets(e->password, sizeof(e->password), f))
		e->password[0] = '\0';
	fclose(f);
	n = strcspn(e->password, "\r\n");
	e->password[n] = '\0';
	return 0;
}

void etcd_close(struct etcd *e)
{
	if (!e)
		return;
	etcd_watch_stop(e);
	if (e->base)
		etcd_leases_end(e);
	conn_drop(e);
	for (int i = 0; i < ETCD_MAX_LEASES; i++) {
		free(e->leases[i].reg);
		free(e->leases[i].live);
	}
	free(e->last_fence);
	if (e->w.line)
		evbuffer_free(e->w.line);
	if (e->tick)
		event_free(e->tick);
	if (e->base)
		event_base_free(e->base);
	SSL_CTX_free(e->ssl);
	explicit_bzero(e->password, sizeof(e->password));
	explicit_bzero(e->token, sizeof(e->token));
	free(e);
}

int etcd_open(const struct etcd_conf *conf, const char *prefix, uint32_t connect_timeout_ms,
	      uint32_t timeout_ms, struct etcd **ret)
{
	return etcd_open_report(conf, prefix, connect_timeout_ms, timeout_ms, false, NULL, 0, ret);
}

int etcd_open_report(const struct etcd_conf *conf, const char *prefix, uint32_t connect_timeout_ms,
		     uint32_t timeout_ms, bool say_retry, char *err, size_t err_cap,
		     struct etcd **ret)
{
	struct etcd *e;
	cJSON *res = NULL;
	int r = CRUN_ENOMEM;

	if (!conf || conf->n_ep < 1 || conf->n_ep > ETCD_MAX_ENDPOINTS)
		return CRUN_EINVAL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return CRUN_ENOMEM;
	e->conf = *conf;
	e->w.ep = -1;
	e->base = event_base_new();
	if (!e->base)
		goto fail;
	e->tick = evtimer_new(e->base, on_tick, e);
	e->w.line = evbuffer_new();
	if (!e->tick || !e->w.line)
		goto fail;
	r = str_printf(e->prefix, sizeof(e->prefix), "%s/", prefix ? prefix : "");
	if (r < 0)
		goto fail;
	e->prefix_len = strlen(e->prefix);
	if (getrandom(&e->nonce, sizeof(e->nonce), 0) != sizeof(e->nonce))
		e->nonce = clock_now_us() ^ ((uint64_t)getpid() << 32);
	if (conf->https) {
		r = tls_setup(e);
		if (r < 0)
			goto fail;
	}
	if (conf->username[0]) {
		r = read_password(e);
		if (r < 0)
			goto fail;
	}
	/* Reach one member (and log in) within the connect timeout. */
	e->timeout_ms = connect_timeout_ms ? connect_timeout_ms : 30000;
	e->say_retry = say_retry;
	if (conf->username[0])
		r = authenticate(e);
	else
		r = etcd_call(e, "/v3/maintenance/status", "{}", &res);
	cJSON_Delete(res);
	e->say_retry = false;
	if (r < 0)
		goto fail;
	e->timeout_ms = timeout_ms ? timeout_ms : 30000;
	*ret = e;
	return 0;
fail:
	/* The last member's failure, not only "timed out". */
	if (err && err_cap && r == CRUN_ETIMEDOUT && e->err[0])
		(void)snprintf(err, err_cap, "%s (tried for %u s)", e->err,
			       (e->timeout_ms + 999) / 1000);
	else if (err && err_cap)
		(void)snprintf(err, err_cap, "%s", e->err[0] ? e->err : crun_strerror(r));
	etcd_close(e);
	return r;
}

/* ---- the watch stream --------------------------------------------------------- */

static void watch_line(struct etcd *e, const char *line)
{
	cJSON *j = cJSON_Parse(line);
	const cJSON *res = j ? cJSON_GetObjectItemCaseSensitive(j, "result") : NULL;
	const cJSON *ev;

	if (!res) {
		/* {"error": ...}: the member lost its leader (we asked it to
		 * cancel then) or refused the watch. */
		e->w.alive = false;
		cJSON_Delete(j);
		return;
	}
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "canceled")) ||
	    etcd_json_i64(res, "compact_revision") > 0)
		e->w.alive = false;
	ev = cJSON_GetObjectItemCaseSensitive(res, "events");
	if (cJSON_IsArray(ev) && cJSON_GetArraySize(ev) > 0)
		e->w.event = true;
	cJSON_Delete(j);
}

static void watch_on_chunk(struct evhttp_request *req, void *arg)
{
	struct etcd *e = arg;
	struct evbuffer *in = evhttp_request_get_input_buffer(req);

	evbuffer_add_buffer(e->w.line, in);
	/* The gateway ends each message with a newline. */
	for (int i = 0; i < 1 << 16; i++) {
		size_t n;
		char *line = evbuffer_readln(e->w.line, &n, EVBUFFER_EOL_LF);

		if (!line)
			break;
		watch_line(e, line);
		free(line);
	}
	if (evbuffer_get_length(e->w.line) > ETCD_LINE_MAX)
		e->w.alive = false;
	if (e->w.event || !e->w.alive)
		e->w.wake = true;
}

static void watch_on_done(struct evhttp_request *req, void *arg)
{
	struct etcd *e = arg;

	(void)req;
	e->w.alive = false;
	e->w.wake = true;
	e->w.req = NULL; /* evhttp frees it after this callback */
}

void etcd_watch_stop(struct etcd *e)
{
	if (e->w.conn)
		evhttp_connection_free(e->w.conn); /* frees a running request */
	e->w.conn = NULL;
	e->w.req = NULL;
	e->w.alive = false;
	e->w.ep = -1;
	free(e->w.key);
	e->w.key = NULL;
	if (e->w.line)
		evbuffer_drain(e->w.line, evbuffer_get_length(e->w.line));
}

bool etcd_watch_matches(const struct etcd *e, const char *key, size_t key_len)
{
	return e->w.alive && e->w.ep == e->ep && e->w.key && e->w.key_len == key_len &&
	       memcmp(e->w.key, key, key_len) == 0;
}

/* One create_request per range, all in the stream's one body: etcd's
 * gateway hands each to the same watch stream. */
static int watch_body(const struct etcd_wrange *w, size_t n, int64_t start_rev,
		      struct evbuffer *out)
{
	for (size_t i = 0; i < n; i++) {
		char *k64 = etcd_b64(w[i].key, w[i].key_len);
		char *e64 = w[i].end ? etcd_b64(w[i].end, w[i].end_len) : NULL;
		int r = !k64 || (w[i].end && !e64) ? -1 : 0;

		if (r == 0)
			r = evbuffer_add_printf(out,
						"{\"create_request\":{\"key\":\"%s\"%s%s%s,\"start_"
						"revision\":\"%" PRId64 "\"%s}}",
						k64, e64 ? ",\"range_end\":\"" : "", e64 ? e64 : "",
						e64 ? "\"" : "", start_rev,
						w[i].noput ? ",\"filters\":[\"NOPUT\"]" : "");
		free(k64);
		free(e64);
		if (r < 0)
			return CRUN_ENOMEM;
	}
	return 0;
}

int etcd_watch_start(struct etcd *e, const char *key, size_t key_len, const char *end,
		     size_t end_len, int64_t start_rev)
{
	struct etcd_wrange w = {key, key_len, end, end_len, false};

	return etcd_watch_start_n(e, &w, 1, key, key_len, start_rev);
}

int etcd_watch_start_n(struct etcd *e, const struct etcd_wrange *w, size_t n, const char *ident,
		       size_t ident_len, int64_t start_rev)
{
	int r = CRUN_ENOMEM;

	etcd_watch_stop(e);
	e->w.key = mem_dup(ident, ident_len);
	if (!e->w.key)
		goto out;
	e->w.key_len = ident_len;
	r = CRUN_ENOMEM;
	e->w.conn = conn_new(e, e->ep, (uint64_t)ETCD_WATCH_IDLE * 1000);
	if (!e->w.conn)
		goto out;
	e->w.req = evhttp_request_new(watch_on_done, e);
	if (!e->w.req)
		goto out;
	evhttp_request_set_chunked_cb(e->w.req, watch_on_chunk);
	if (add_headers(e, e->w.req, e->ep, true) < 0 ||
	    /* A member cut off from the leader cancels the stream (etcd's
	     * require-leader metadata), so a partition ends the wait. */
	    evhttp_add_header(evhttp_request_get_output_headers(e->w.req),
			      "Grpc-Metadata-Hasleader", "true") < 0 ||
	    watch_body(w, n, start_rev, evhttp_request_get_output_buffer(e->w.req)) < 0) {
		evhttp_request_free(e->w.req);
		e->w.req = NULL;
		goto out;
	}
	if (evhttp_make_request(e->w.conn, e->w.req, EVHTTP_REQ_POST, "/v3/watch") < 0) {
		e->w.req = NULL;
		r = CRUN_ECONNREFUSED;
		goto out;
	}
	e->w.ep = e->ep;
	e->w.alive = true;
	e->w.event = false;
	r = 0;
out:
	if (r < 0)
		etcd_watch_stop(e);
	return r;
}

void etcd_watch_rearm(struct etcd *e)
{
	e->w.event = false;
}

enum etcd_watch_result etcd_watch_wait(struct etcd *e, uint64_t until_ms)
{
	if (!e->w.event && e->w.alive && clock_now_ms() < until_ms) {
		e->w.wake = false;
		run_until(e, &e->w.wake, until_ms);
	}
	if (e->w.event)
		return ETCD_W_EVENT;
	return e->w.alive ? ETCD_W_TIMEOUT : ETCD_W_DEAD;
}
