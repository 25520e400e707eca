/* secure_bench.c: the cost of the store's security (store/auth.h,
 * store/tls.h). A crun store is served in-process on 127.0.0.1 by a loop
 * thread with the chosen protection; then, in one JSON line each:
 *   ops      T client threads, one crun_store connection each, closed-loop
 *            SET + GET pairs for S seconds: store ops/s
 *   connect  one thread opening and closing connections for S seconds:
 *            connections/s (the handshake's cost)
 *   rdzv     K c10d rendezvous clients (rendezvous/c10d.c, as rdzv_bench)
 *            form one round: seconds from the first join to the last rank
 *
 *   secure_bench --mode none|auth|tls|both [--secret FILE] [--certs DIR]
 *                [--threads T] [--seconds S] [--k K]
 * DIR holds server.pem, server.key (valid for 127.0.0.1) and ca.pem; FILE is
 * a 0600 secret file. bench/security_bench.py makes both and runs every mode.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "agent/cli_rdzv_int.h"
#include "common/common.h"
#include "crun/store.h"
#include "rendezvous/c10d.h"
#include "store/auth.h"
#include "store/server.h"
#include "store/tls.h"

#define T_MAX 256
#define K_MAX 1024

struct cfg {
	bool auth, tls;
	const char *secret;
	char cert[512], key[512], ca[512];
	int threads, k;
	uint32_t seconds;
	uint16_t port;
};

static void *loop_main(void *arg)
{
	event_base_loop(arg, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void client_opts(const struct cfg *c, crun_store_opts_t *o)
{
	o->host = "127.0.0.1";
	o->port = c->port;
	o->connect_timeout_ms = 30000;
	o->timeout_ms = 30000;
	o->auth_secret_file = c->auth ? c->secret : NULL;
	o->auth_job = "bench";
	o->tls_ca = c->tls ? c->ca : NULL;
}

struct worker {
	pthread_t thr;
	const struct cfg *c;
	int idx;
	uint64_t ops;
	int err;
};

static void *ops_main(void *arg)
{
	struct worker *w = arg;
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s;
	uint64_t end;
	char key[32];

	client_opts(w->c, &o);
	w->err = crun_store_open(&o, &s);
	if (w->err < 0)
		return NULL;
	snprintf(key, sizeof(key), "bench/%d", w->idx);
	end = clock_now_ms() + w->c->seconds * 1000u;
	while (clock_now_ms() < end) {
		void *v;
		size_t len;

		w->err = crun_store_set(s, key, "0123456789abcdef0123456789abcdef", 32);
		if (w->err == 0)
			w->err = crun_store_get(s, key, 0, &v, &len);
		if (w->err < 0)
			break;
		crun_free(v);
		w->ops += 2;
	}
	crun_store_close(s);
	return NULL;
}

static int bench_ops(const struct cfg *c)
{
	struct worker *w = calloc((size_t)c->threads, sizeof(*w));
	uint64_t t0, t1, ops = 0;
	int err = 0;

	if (!w)
		return CRUN_ENOMEM;
	t0 = clock_now_us();
	for (int i = 0; i < c->threads; i++) {
		w[i].c = c;
		w[i].idx = i;
		pthread_create(&w[i].thr, NULL, ops_main, &w[i]);
	}
	for (int i = 0; i < c->threads; i++) {
		pthread_join(w[i].thr, NULL);
		ops += w[i].ops;
		if (w[i].err < 0)
			err = w[i].err;
	}
	t1 = clock_now_us();
	printf("{\"bench\":\"ops\",\"mode\":\"%s\",\"threads\":%d,\"ops\":%" PRIu64
	       ",\"ops_per_s\":%.0f,\"error\":\"%s\"}\n",
	       c->auth ? (c->tls ? "auth+tls" : "auth") : (c->tls ? "tls" : "none"), c->threads,
	       ops, (double)ops * 1e6 / (double)(t1 - t0), err ? crun_err_name(err) : "");
	free(w);
	return err;
}

static int bench_connect(const struct cfg *c)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	uint64_t t0 = clock_now_us(), end = clock_now_ms() + c->seconds * 1000u, n = 0;
	int r = 0;

	client_opts(c, &o);
	while (clock_now_ms() < end) {
		crun_store_t *s;

		r = crun_store_open(&o, &s);
		if (r < 0)
			break;
		crun_store_close(s);
		n++;
	}
	printf("{\"bench\":\"connect\",\"mode\":\"%s\",\"connects\":%" PRIu64
	       ",\"connects_per_s\":%.0f,\"error\":\"%s\"}\n",
	       c->auth ? (c->tls ? "auth+tls" : "auth") : (c->tls ? "tls" : "none"), n,
	       (double)n * 1e6 / (double)(clock_now_us() - t0), r ? crun_err_name(r) : "");
	return r;
}

struct node {
	pthread_t thr;
	const struct cfg *c;
	int idx, result;
	char err[256];
};

static void *node_main(void *arg)
{
	struct node *n = arg;
	struct c10d_join_args a = {0};
	struct rdzv_info info;
	char host[32];
	int round;

	snprintf(host, sizeof(host), "node%05d", n->idx);
	a.host = "127.0.0.1";
	a.port = n->c->port;
	a.run_id = "bench";
	if (c10d_parse_conf("join_timeout=120,read_timeout=120", &a.conf, n->err, sizeof(n->err)))
		return NULL;
	if (n->c->auth)
		snprintf(a.conf.auth_file, sizeof(a.conf.auth_file), "%s", n->c->secret);
	if (n->c->tls)
		snprintf(a.conf.tls_ca, sizeof(a.conf.tls_ca), "%s", n->c->ca);
	a.min = a.max = n->c->k;
	a.nproc = 8;
	a.prev_round = a.prev_grank = -1;
	a.wport = 1;
	a.addr = "127.0.0.1";
	a.hostname = host;
	n->result = c10d_join_blocking(&a, &info, &round, n->err, sizeof(n->err));
	return NULL;
}

static int bench_rdzv(const struct cfg *c)
{
	struct node *n = calloc((size_t)c->k, sizeof(*n));
	pthread_attr_t attr;
	uint64_t t0;
	int ok = 0;

	if (!n)
		return CRUN_ENOMEM;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	t0 = clock_now_us();
	for (int i = 0; i < c->k; i++) {
		n[i].c = c;
		n[i].idx = i;
		n[i].result = CRUN_EINVAL;
		pthread_create(&n[i].thr, &attr, node_main, &n[i]);
	}
	for (int i = 0; i < c->k; i++) {
		pthread_join(n[i].thr, NULL);
		ok += n[i].result == 0;
	}
	printf("{\"bench\":\"rdzv\",\"mode\":\"%s\",\"k\":%d,\"ok\":%d,\"seconds\":%.3f,"
	       "\"error\":\"%s\"}\n",
	       c->auth ? (c->tls ? "auth+tls" : "auth") : (c->tls ? "tls" : "none"), c->k, ok,
	       (double)(clock_now_us() - t0) / 1e6, ok == c->k ? "" : n[0].err);
	pthread_attr_destroy(&attr);
	free(n);
	return ok == c->k ? 0 : CRUN_EPEER;
}

static int parse(int argc, char **argv, struct cfg *c)
{
	const char *certs = NULL;
	uint64_t v;

	for (int i = 1; i + 1 < argc; i += 2) {
		const char *a = argv[i], *val = argv[i + 1];

		if (!strcmp(a, "--mode")) {
			c->auth = !strcmp(val, "auth") || !strcmp(val, "both");
			c->tls = !strcmp(val, "tls") || !strcmp(val, "both");
		} else if (!strcmp(a, "--secret")) {
			c->secret = val;
		} else if (!strcmp(a, "--certs")) {
			certs = val;
		} else if (!strcmp(a, "--threads") && !parse_uint_range(val, 1, T_MAX, &v)) {
			c->threads = (int)v;
		} else if (!strcmp(a, "--seconds") && !parse_uint_range(val, 1, 600, &v)) {
			c->seconds = (uint32_t)v;
		} else if (!strcmp(a, "--k") && !parse_uint_range(val, 1, K_MAX, &v)) {
			c->k = (int)v;
		} else {
			fprintf(stderr, "secure_bench: bad argument %s %s\n", a, val);
			return -1;
		}
	}
	if ((c->auth && !c->secret) || (c->tls && !certs)) {
		fprintf(stderr, "secure_bench: auth needs --secret, tls needs --certs\n");
		return -1;
	}
	if (certs && (str_printf(c->cert, sizeof(c->cert), "%s/server.pem", certs) < 0 ||
		      str_printf(c->key, sizeof(c->key), "%s/server.key", certs) < 0 ||
		      str_printf(c->ca, sizeof(c->ca), "%s/ca.pem", certs) < 0))
		return -1;
	return 0;
}

int main(int argc, char **argv)
{
	struct cfg c = {.threads = 4, .seconds = 3, .k = 64};
	struct store_server_config sc = STORE_SERVER_CONFIG_DEFAULT;
	struct store_auth_keys *keys = NULL;
	struct store_auth_secret sec;
	struct store_tls *tls = NULL;
	struct store_server *srv;
	struct event_base *base;
	struct rlimit rl;
	pthread_t loop;
	char err[600];
	int rc = 0;

	log_init("secure_bench", LL_ERROR);
	signal(SIGPIPE, SIG_IGN);
	if (parse(argc, argv, &c) < 0 || evthread_use_pthreads() < 0)
		return 2;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (c.auth && (store_auth_secret_read(c.secret, &sec, err, sizeof(err)) < 0 ||
		       store_auth_keys_new(&keys) < 0 || store_auth_keys_add(keys, "", &sec) < 0)) {
		fprintf(stderr, "secure_bench: %s\n", err);
		return 2;
	}
	if (c.tls) {
		struct store_tls_opts to = {.cert = c.cert, .key = c.key};

		if (store_tls_new_server(&to, &tls, err, sizeof(err)) < 0) {
			fprintf(stderr, "secure_bench: %s\n", err);
			return 2;
		}
	}
	base = event_base_new();
	sc.host = "127.0.0.1";
	sc.auth = keys;
	sc.tls = tls;
	if (!base || store_server_new(base, &sc, &srv) < 0)
		return 1;
	c.port = store_server_port(srv);
	pthread_create(&loop, NULL, loop_main, base);
	fflush(stdout);
	rc |= bench_ops(&c) < 0;
	fflush(stdout);
	rc |= bench_connect(&c) < 0;
	fflush(stdout);
	rc |= bench_rdzv(&c) < 0;
	fflush(stdout);
	event_base_loopbreak(base);
	pthread_join(loop, NULL);
	store_server_free(srv);
	event_base_free(base);
	store_tls_free(tls);
	store_auth_keys_free(keys);
	return rc;
}
