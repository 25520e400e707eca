/* rdzv_bench.c: rendezvous scale. K c10d rendezvous clients in ONE process
 * (one thread and one store connection each, running exactly the join an
 * agent's helper thread runs: rendezvous/c10d.c) form one round of K nodes
 * (MIN = MAX = K, so the K-th ticket closes the round without a last call)
 * against a crun store served in-process on 127.0.0.1 by a loop thread.
 * Reports the time from the first join to the last assignment, the store
 * requests, and the loopback bytes moved (from /proc/net/dev "lo": includes
 * TCP/IP headers and any other loopback traffic on the machine at the time).
 *
 *   rdzv_bench [K ...]     default: 16 64 256 1024 4096
 *   rdzv_bench --etcd HOST:PORT[,...] [K ...]
 *                          the same clients on an etcd cluster (the etcd
 *                          backend's coord_etcd.c); requests and keys are
 *                          not counted there (0)
 * Prints one JSON line per K.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "agent/cli_rdzv_int.h"
#include "common/common.h"
#include "rendezvous/c10d.h"
#include "rendezvous/etcd_int.h"
#include "store/server.h"

#define K_MAX 8192

struct client {
	pthread_t thr;
	int idx;
	uint16_t port;
	const char *run_id;
	int k;
	int result;
	struct rdzv_info info;
	uint64_t done_us;
	char err[256];
};

/* Start gate: every thread blocks here until all are created (a spin
 * would starve thread creation on a small machine). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_go;
static struct etcd_conf *g_etcd; /* --etcd: the cluster; NULL: a crun store */

static void *loop_main(void *arg)
{
	event_base_loop(arg, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void *client_main(void *arg)
{
	struct client *c = arg;
	struct c10d_join_args a = {0};
	char host[32];
	int round;

	pthread_mutex_lock(&g_mu);
	while (!g_go)
		pthread_cond_wait(&g_cv, &g_mu);
	pthread_mutex_unlock(&g_mu);
	snprintf(host, sizeof(host), "node%05d", c->idx);
	a.host = "127.0.0.1";
	a.port = c->port;
	a.run_id = c->run_id;
	if (c10d_parse_conf("join_timeout=120,read_timeout=120", &a.conf, c->err, sizeof(c->err)))
		return NULL;
	a.min = a.max = c->k;
	a.nproc = 8;
	a.prev_round = a.prev_grank = -1;
	a.wport = 1;
	a.addr = "127.0.0.1";
	a.hostname = host;
	a.etcd = g_etcd;
	c->result = c10d_join_blocking(&a, &c->info, &round, c->err, sizeof(c->err));
	c->done_us = clock_now_us();
	return NULL;
}

static uint64_t lo_bytes(void)
{
	FILE *f = fopen("/proc/net/dev", "re");
	char line[512];
	uint64_t rx = 0;

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "lo:");
		unsigned long long v;

		if (p && sscanf(p + 3, "%llu", &v) == 1)
			rx = v;
	}
	fclose(f);
	return rx;
}

static int run_k(int k)
{
	struct store_server_config sc = STORE_SERVER_CONFIG_DEFAULT;
	struct store_server_stats st;
	struct event_base *base = event_base_new();
	struct store_server *srv = NULL;
	struct client *cl = calloc((size_t)k, sizeof(*cl));
	pthread_attr_t attr;
	pthread_t loop;
	uint64_t t0, t1 = 0, b0, b1;
	char run_id[64];
	int ok = 0, bad_rank = 0, r;
	bool *seen = calloc((size_t)k, sizeof(bool));

	if (!base || !cl || !seen)
		return CRUN_ENOMEM;
	sc.host = "127.0.0.1";
	r = store_server_new(base, &sc, &srv);
	if (r < 0) {
		fprintf(stderr, "rdzv_bench: cannot serve: %s\n", crun_strerror(r));
		return r;
	}
	pthread_create(&loop, NULL, loop_main, base);
	/* etcd outlives one run: a fresh run id each time */
	snprintf(run_id, sizeof(run_id), "bench%d-%d-%" PRIu64, k, (int)getpid(), clock_now_us());
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	g_go = 0;
	for (int i = 0; i < k; i++) {
		cl[i].idx = i;
		cl[i].port = store_server_port(srv);
		cl[i].run_id = run_id;
		cl[i].k = k;
		cl[i].result = CRUN_EINVAL;
		if (pthread_create(&cl[i].thr, &attr, client_main, &cl[i])) {
			fprintf(stderr, "rdzv_bench: cannot start thread %d\n", i);
			return CRUN_ENOMEM;
		}
	}
	b0 = lo_bytes();
	t0 = clock_now_us();
	pthread_mutex_lock(&g_mu);
	g_go = 1;
	pthread_cond_broadcast(&g_cv);
	pthread_mutex_unlock(&g_mu);
	for (int i = 0; i < k; i++) {
		pthread_join(cl[i].thr, NULL);
		if (cl[i].result == 0) {
			int g = cl[i].info.group_rank;

			ok++;
			if (g < 0 || g >= k || seen[g] || cl[i].info.base_rank != g * 8 ||
			    cl[i].info.world_size != 8 * k)
				bad_rank++;
			else
				seen[g] = true;
		} else if (ok == 0 && i == 0) {
			fprintf(stderr, "rdzv_bench: client 0: %s\n", cl[i].err);
		}
		if (cl[i].done_us > t1)
			t1 = cl[i].done_us;
	}
	b1 = lo_bytes();
	event_base_loopbreak(base);
	pthread_join(loop, NULL);
	store_server_get_stats(srv, &st);
	printf("{\"bench\":\"rdzv\",\"backend\":\"%s\",\"k\":%d,\"ok\":%d,\"bad_ranks\":%d,"
	       "\"seconds\":%.3f,"
	       "\"requests\":%" PRIu64 ",\"requests_per_node\":%.1f,\"lo_bytes\":%" PRIu64
	       ",\"lo_bytes_per_node\":%.0f,\"keys\":%" PRIu64 "}\n",
	       g_etcd ? "etcd" : "c10d", k, ok, bad_rank, (double)(t1 - t0) / 1e6, st.requests,
	       (double)st.requests / k, b1 - b0, (double)(b1 - b0) / k, st.keys);
	fflush(stdout);
	store_server_free(srv);
	event_base_free(base);
	pthread_attr_destroy(&attr);
	free(cl);
	free(seen);
	return ok == k && bad_rank == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	static const int def[] = {16, 64, 256, 1024, 4096};
	struct rlimit rl;
	int rc = 0;

	log_init("rdzv_bench", LL_ERROR);
	signal(SIGPIPE, SIG_IGN);
	if (evthread_use_pthreads() < 0)
		return 1;
	/* two fds per client (both ends of the loopback connection) */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (argc > 2 && strcmp(argv[1], "--etcd") == 0) {
		static struct etcd_conf ec;
		char err[256];

		if (etcd_parse_endpoints(argv[2], &ec, err, sizeof(err)) < 0) {
			fprintf(stderr, "rdzv_bench: %s\n", err);
			return 2;
		}
		g_etcd = &ec;
		argv += 2;
		argc -= 2;
	}
	if (argc > 1) {
		for (int i = 1; i < argc; i++) {
			uint64_t k;

			if (parse_uint_range(argv[i], 1, K_MAX, &k) < 0) {
				fprintf(stderr, "rdzv_bench: K must be 1..%d: '%s'\n", K_MAX,
					argv[i]);
				return 2;
			}
			rc |= run_k((int)k);
		}
	} else {
		for (size_t i = 0; i < sizeof(def) / sizeof(def[0]); i++)
			rc |= run_k(def[i]);
	}
	return rc;
}
