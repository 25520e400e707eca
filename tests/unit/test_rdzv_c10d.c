/* test_rdzv_c10d.c: Check tests for the c10d rendezvous: prefix-sum global
 * ranks for heterogeneous nproc, rdzv_conf parsing, the command line
 * accepting c10d with MIN:MAX, and whole rounds of several agents (threads)
 * over the in-memory coordination, with in-memory leases for the liveness
 * cases: a dead or silent ticket 1, a joiner that dies before its record, a
 * node back from an older round, the job-wide attempt.
 */
#include <arpa/inet.h>
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "agent/cli.h"
#include "agent/cli_rdzv_int.h"
#include "rendezvous/c10d.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/round_int.h"
#include "common/common.h"
#include "store/server.h"
#include "unit/check_main.h"

START_TEST(heterogeneous_prefix_sums)
{
	const int nprocs[3] = {1, 3, 2};
	struct rdzv_info in;

	ck_assert_int_eq(rdzv_assign_ranks(nprocs, 3, 0, &in), 0);
	ck_assert_int_eq(in.base_rank, 0);
	ck_assert_int_eq(in.world_size, 6);
	ck_assert_int_eq(rdzv_assign_ranks(nprocs, 3, 1, &in), 0);
	ck_assert_int_eq(in.base_rank, 1);
	ck_assert_int_eq(rdzv_assign_ranks(nprocs, 3, 2, &in), 0);
	ck_assert_int_eq(in.base_rank, 4);
	ck_assert_int_eq(in.group_world_size, 3);
}
END_TEST

START_TEST(conf_defaults_and_keys)
{
	struct c10d_conf c;
	char err[256];

	ck_assert_int_eq(c10d_parse_conf(NULL, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.hb_ms, 1000);
	ck_assert_uint_eq(c.ttl_ms, 3000);
	ck_assert_int_eq(c.is_host, -1);
	ck_assert_int_eq(c10d_parse_conf("last_call_timeout=0.5,lease_ttl=2,heartbeat_interval=0.2,"
					 "is_host=true,join_timeout=9,read_timeout=3,"
					 "close_timeout=4",
					 &c, err, sizeof(err)),
			 0);
	ck_assert_uint_eq(c.last_call_ms, 500);
	ck_assert_uint_eq(c.ttl_ms, 2000);
	ck_assert_uint_eq(c.hb_ms, 200);
	ck_assert_int_eq(c.is_host, 1);
	ck_assert_uint_eq(c.join_ms, 9000);
	ck_assert_uint_eq(c.read_ms, 3000);
	ck_assert_uint_eq(c.close_ms, 4000);
}
END_TEST

START_TEST(conf_errors_name_the_key)
{
	struct c10d_conf c;
	char err[256];

	ck_assert_int_eq(c10d_parse_conf("bogus=1", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "bogus"));
	ck_assert_int_eq(c10d_parse_conf("lease_ttl=soon", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "lease_ttl"));
	ck_assert_int_eq(c10d_parse_conf("is_host=maybe", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_int_eq(c10d_parse_conf("lease_ttl=1,heartbeat_interval=2", &c, err, sizeof(err)),
			 CRUN_EINVAL);
	ck_assert_int_eq(rdzv_conf_check("c10d", "x", err, sizeof(err)), CRUN_EINVAL);
}
END_TEST

/* The hosted store's limits come from store_<limit> keys (issue 9). */
START_TEST(conf_store_limits)
{
	struct c10d_conf c;
	char err[256];

	ck_assert_int_eq(c10d_parse_conf(NULL, &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.store.max_keys, 1u << 20);
	ck_assert_int_eq(
	    c10d_parse_conf("store_max_keys=5000,store_stall_timeout=0", &c, err, sizeof(err)), 0);
	ck_assert_uint_eq(c.store.max_keys, 5000);
	ck_assert_uint_eq(c.store.stall_timeout_s, 0);
	ck_assert_int_eq(c10d_parse_conf("store_max_keys=none", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "store_max_keys: expected"));
	ck_assert_int_eq(c10d_parse_conf("store_bogus=1", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "store_bogus"));
}
END_TEST

/* worker_store=proxy|direct (store/proxy.h); anything else names the key. */
START_TEST(conf_worker_store)
{
	struct c10d_conf c;
	char err[256];

	ck_assert_int_eq(c10d_parse_conf(NULL, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.worker_store_proxy, 0);
	ck_assert_int_eq(c10d_parse_conf("worker_store=proxy", &c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.worker_store_proxy, 1);
	ck_assert_int_eq(c10d_parse_conf("worker_store=direct", &c, err, sizeof(err)), 0);
	ck_assert_int_eq(c.worker_store_proxy, 0);
	ck_assert_int_eq(c10d_parse_conf("worker_store=pro", &c, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "worker_store=pro is not direct or proxy"));
}
END_TEST

static char *const no_env[] = {NULL};

START_TEST(cli_accepts_elastic_c10d)
{
	char *argv[] = {"crun",
			"--nnodes=1:3",
			"--nproc_per_node=2",
			"--rdzv_backend=c10d",
			"--rdzv_endpoint=10.0.0.1",
			"--rdzv_id=job",
			"--rdzv_conf=last_call_timeout=1,lease_ttl=2",
			"x.py",
			NULL};
	struct cli c;

	ck_assert_int_eq(cli_parse(&c, 8, argv, no_env), 0);
	ck_assert_str_eq(c.cfg.rdzv_backend, "c10d");
	ck_assert_int_eq(c.cfg.min_nnodes, 1);
	ck_assert_int_eq(c.cfg.max_nnodes, 3);
	ck_assert_str_eq(c.cfg.master_addr, "10.0.0.1");
	ck_assert_uint_eq(c.cfg.master_port, 29400); /* torchrun's c10d default */
	ck_assert_str_eq(c.cfg.rdzv_conf, "last_call_timeout=1,lease_ttl=2");
	cli_free(&c);
}
END_TEST

START_TEST(cli_min_max_needs_c10d)
{
	char *argv[] = {"crun", "--nnodes=1:3", "x.py", NULL};
	struct cli c;

	ck_assert_int_eq(cli_parse(&c, 3, argv, no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--nnodes"));
	cli_free(&c);
}
END_TEST

/* ---- rounds over the in-memory coordination (no sockets) ---------------------- */

struct ag {
	pthread_t thr;
	struct coord_mem *mem;
	struct c10d_join_args a;
	char host[32], addr[32];
	int result, round;
	struct rdzv_info info;
	char err[512];
};

static void *ag_main(void *arg)
{
	struct ag *g = arg;
	struct coord *c;

	if (g->a.port) { /* a real store: one connection, the lease on it (as the sim) */
		g->result = c10d_join_blocking(&g->a, &g->info, &g->round, g->err, sizeof(g->err));
		return NULL;
	}
	g->result = coord_open_mem(g->mem, "crun-c10d/job", &c);
	if (g->result == 0) {
		g->result = c10d_join_on(c, &g->a, &g->info, &g->round, g->err, sizeof(g->err));
		coord_close(c);
	}
	return NULL;
}

static void ag_init(struct ag *g, struct coord_mem *m, int idx, int min, int max, int nproc,
		    const char *conf)
{
	memset(g, 0, sizeof(*g));
	g->mem = m;
	snprintf(g->host, sizeof(g->host), "host%d", idx);
	snprintf(g->addr, sizeof(g->addr), "10.0.0.%d", idx);
	ck_assert_int_eq(c10d_parse_conf(conf, &g->a.conf, g->err, sizeof(g->err)), 0);
	g->a.run_id = "job";
	g->a.min = min;
	g->a.max = max;
	g->a.nproc = nproc;
	g->a.prev_round = g->a.prev_grank = -1;
	g->a.wport = (uint16_t)(1000 + idx);
	g->a.addr = g->addr;
	g->a.hostname = g->host;
	g->result = 1;
}

static void ag_start(struct ag *g)
{
	ck_assert_int_eq(pthread_create(&g->thr, NULL, ag_main, g), 0);
}

static void ag_join(struct ag *g)
{
	pthread_join(g->thr, NULL);
}

/* Waits for g's join and checks it succeeded. */
static void ag_ok(struct ag *g)
{
	ag_join(g);
	ck_assert_msg(g->result == 0, "%s", g->err);
}

/* g comes back for the next round with the rank of the one it completed. */
static void ag_rejoin(struct ag *g)
{
	g->a.prev_round = g->round;
	g->a.prev_grank = g->info.group_rank;
	ag_start(g);
}

/* How a test's rounds close (issue 23: a 50 ms last call decided who was in
 * a round when a thread started late, and the test lost the race, not the
 * agents). LAST_CALL_AT_MAX: the last call outlasts any test (a hang guard),
 * so a round closes when MAX nodes joined, or when the test ends its last
 * call (end_last_call). LAST_CALL_ONCE_ALL_IN: a short last call, only for
 * rounds the test runs exactly MIN agents for: it begins when the last of
 * them joined, and no one else can come. */
#define LAST_CALL_AT_MAX      "last_call_timeout=60"
#define LAST_CALL_ONCE_ALL_IN "last_call_timeout=0.05"

/* g's next rounds close as LAST_CALL_AT_MAX (at_max) or LAST_CALL_ONCE_ALL_IN. */
static void ag_last_call(struct ag *g, bool at_max)
{
	ck_assert_int_eq(c10d_parse_conf(at_max ? LAST_CALL_AT_MAX : LAST_CALL_ONCE_ALL_IN,
					 &g->a.conf, g->err, sizeof(g->err)),
			 0);
}

static char *mem_val(struct coord_mem *m, const char *key)
{
	struct coord *c;
	char *v = NULL;

	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	if (coord_try_get(c, key, &v) < 0)
		v = NULL;
	coord_close(c);
	return v;
}

static void wait_key(struct coord_mem *m, const char *key)
{
	struct coord *c;

	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_wait(c, key, 10000), 0);
	coord_close(c);
}

/* The test ends round rd's last call now, once everyone it expects there
 * has joined: it writes the count marker a joiner reaching MAX writes
 * (c10d_join.c mark_counts), so the members close the round with whoever
 * joined, as when a last call runs out. */
static void end_last_call(struct coord_mem *m, int rd)
{
	struct coord *c;
	char key[64];

	snprintf(key, sizeof(key), "r%d/clock_max", rd);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_set(c, key, "0"), 0);
	coord_close(c);
}

START_TEST(round_closes_at_max_with_prefix_sums)
{
	struct coord_mem *m;
	struct ag g[4];
	int seen[4] = {0}, nproc_of[4];

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 4; i++) {
		ag_init(&g[i], m, i, 4, 4, i + 1, "last_call_timeout=60");
		ag_start(&g[i]);
	}
	for (int i = 0; i < 4; i++)
		ag_join(&g[i]);
	for (int i = 0; i < 4; i++) {
		ck_assert_msg(g[i].result == 0, "%s", g[i].err);
		ck_assert_int_eq(g[i].round, 0);
		ck_assert_int_eq(g[i].info.group_world_size, 4);
		ck_assert_int_eq(g[i].info.world_size, 1 + 2 + 3 + 4);
		seen[g[i].info.group_rank]++;
		nproc_of[g[i].info.group_rank] = i + 1;
	}
	for (int i = 0; i < 4; i++) {
		int base = 0;

		ck_assert_int_eq(seen[i], 1);
		for (int k = 0; k < g[i].info.group_rank; k++)
			base += nproc_of[k];
		ck_assert_int_eq(g[i].info.base_rank, base);
	}
	/* One worker store: group rank 0's. */
	for (int i = 0; i < 4; i++) {
		if (g[i].info.group_rank != 0)
			continue;
		for (int k = 0; k < 4; k++) {
			ck_assert_uint_eq(g[k].info.master_port, g[i].a.wport);
			ck_assert_str_eq(g[k].info.master_addr, g[i].addr);
		}
	}
	coord_mem_free(m);
}
END_TEST

START_TEST(round_closes_after_min_and_last_call)
{
	struct coord_mem *m;
	struct ag g[2];
	char *closed;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 2; i++) { /* MIN agents: the last call starts once both joined */
		ag_init(&g[i], m, i, 2, 8, 1, LAST_CALL_ONCE_ALL_IN);
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].info.group_world_size, 2);
	}
	closed = mem_val(m, "r0/closed");
	{
		struct round_head h;
		struct round_closed rc;
		char key[64], *list;

		ck_assert_int_eq(round_head_parse(closed, &h), 0);
		ck_assert_int_eq(h.nodes, 2);
		ck_assert_int_eq(h.attempt, 0);
		/* The closer's member list, for whoever needs all of it. */
		snprintf(key, sizeof(key), "r0/members/%d", h.by);
		list = mem_val(m, key);
		ck_assert_int_eq(round_closed_parse(list, 8, &rc), 0);
		ck_assert_int_eq(rc.n, 2);
		round_closed_free(&rc);
		free(list);
	}
	free(closed);
	coord_mem_free(m);
}
END_TEST

/* Requests (and value bytes read, into *ret_bytes) per member of one round
 * of k agents (MIN = k, MAX above it: the round closes by the last call,
 * which begins only once all k joined). */
static double per_member(int k, const char *conf, double *ret_bytes)
{
	struct coord_mem *m;
	struct ag *g = calloc((size_t)k, sizeof(*g));
	uint64_t ops;

	ck_assert_ptr_nonnull(g);
	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < k; i++) {
		ag_init(&g[i], m, i, k, 2 * k, 1, conf);
		ag_start(&g[i]);
	}
	for (int i = 0; i < k; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].info.group_world_size, k);
	}
	ops = coord_mem_ops(m);
	if (ret_bytes)
		*ret_bytes = (double)coord_mem_read_bytes(m) / k;
	coord_mem_free(m);
	free(g);
	return (double)ops / k;
}

/* The join waits on events, not by polling: what a member asks of the store
 * per round is the same at 8 and 64 members and with a last call 10 times
 * as long (it grew with both when every member polled every 250 ms). */
START_TEST(requests_per_member_are_constant)
{
	double small = per_member(8, "last_call_timeout=0.1", NULL);
	double big = per_member(64, "last_call_timeout=0.1", NULL);
	double slow = per_member(8, "last_call_timeout=1.5", NULL);

	fprintf(stderr, "requests per member: %.1f at k=8, %.1f at k=64, %.1f slow\n", small, big,
		slow);
	ck_assert_msg(big <= small + 1.0 && slow <= small + 1.0,
		      "requests per member: %.1f at k=8, %.1f at k=64, %.1f with a 1.5 s last "
		      "call",
		      small, big, slow);
}
END_TEST

/* A member reads its own small assignment, not the whole round: the bytes
 * read per member (the closer's records and group rank 0's member list
 * spread over all) do not grow with the round's size (they grew by ~15
 * bytes per member of the round when everyone read the whole closed value). */
START_TEST(bytes_per_member_are_constant)
{
	double small, big;

	(void)per_member(8, "last_call_timeout=0.1", &small);
	(void)per_member(128, "last_call_timeout=0.1", &big);
	fprintf(stderr, "value bytes read per member: %.0f at k=8, %.0f at k=128\n", small, big);
	ck_assert_msg(big <= small + 48, "bytes per member: %.0f at k=8, %.0f at k=128", small,
		      big);
}
END_TEST

/* ---- rounds over a real crun store (in this process, on 127.0.0.1) -------------- */

struct rsrv {
	struct event_base *base;
	struct store_server *srv;
	pthread_t thr;
	int fd[2];
	uint64_t requests;
};

static void *rsrv_loop(void *arg)
{
	event_base_loop(((struct rsrv *)arg)->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void rsrv_up(struct rsrv *v, uint32_t ext_version)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	memset(v, 0, sizeof(*v));
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	v->base = event_base_new();
	ck_assert_ptr_nonnull(v->base);
	c.host = "127.0.0.1";
	c.ext_version = ext_version;
	ck_assert_int_eq(store_server_new(v->base, &c, &v->srv), 0);
	ck_assert_int_eq(pipe2(v->fd, O_CLOEXEC), 0);
	ck_assert_int_eq(pthread_create(&v->thr, NULL, rsrv_loop, v), 0);
}

static void rsrv_down(struct rsrv *v)
{
	event_base_loopbreak(v->base);
	pthread_join(v->thr, NULL);
	store_server_free(v->srv);
	event_base_free(v->base);
	close(v->fd[0]);
	close(v->fd[1]);
}

static void rsrv_count(evutil_socket_t fd, short what, void *arg)
{
	struct rsrv *v = arg;
	struct store_server_stats st;

	(void)fd;
	(void)what;
	store_server_get_stats(v->srv, &st);
	v->requests = st.requests;
	if (write(v->fd[1], "x", 1) != 1)
		abort();
}

/* Requests the server has served so far (read on its loop thread). */
static uint64_t rsrv_requests(struct rsrv *v)
{
	struct timeval now = {0, 0};
	char c;

	ck_assert_int_eq(event_base_once(v->base, -1, EV_TIMEOUT, rsrv_count, v, &now), 0);
	ck_assert_int_eq(read(v->fd[0], &c, 1), 1);
	return v->requests;
}

/* k agents (threads, one connection each with its lease on it) form round
 * 0 and, all coming back, round 1 on a real store of extension version
 * ext_version (0: the newest): the store's requests per member of each. */
static void rounds_on_store(int k, uint32_t ext_version, double *ret_first, double *ret_rejoin)
{
	struct ag *g = calloc((size_t)k, sizeof(*g));
	struct rsrv v;
	uint64_t r0, r1;

	ck_assert_ptr_nonnull(g);
	rsrv_up(&v, ext_version);
	for (int i = 0; i < k; i++) {
		/* A long TTL and heartbeat: no keep-alive falls due in a round. */
		ag_init(&g[i], NULL, i, k, k, 1,
			"last_call_timeout=0.1,heartbeat_interval=30,lease_ttl=90,join_timeout=60");
		g[i].a.host = "127.0.0.1";
		g[i].a.port = store_server_port(v.srv);
		g[i].a.lease_on_handle = true;
	}
	r0 = rsrv_requests(&v);
	for (int i = 0; i < k; i++)
		ag_start(&g[i]);
	for (int i = 0; i < k; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 0);
	}
	r1 = rsrv_requests(&v);
	*ret_first = (double)(r1 - r0) / k;
	for (int i = 0; i < k; i++)
		ag_rejoin(&g[i]);
	for (int i = 0; i < k; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
		ck_assert_int_eq(g[i].info.group_world_size, k);
	}
	*ret_rejoin = (double)(rsrv_requests(&v) - r1) / k;
	rsrv_down(&v);
	free(g);
}

/* The store's round trips per member, counted by the store itself, so that
 * they cannot silently grow again: 40 members (more than the
 * ROUND_STAGGER_MAX + 1 that watch the counts), a first round and a rejoin
 * of everyone. Each member: connect (VALIDATE, PING, HELLO: 3), then a
 * first round of 6 (conf, closed, round, TICKET, GRANT_SET,
 * WAIT_ANY_GET_WITH: the wake brings its assignment), a rejoin of 5
 * (change, round, TICKET, GRANT_SET, WAIT_ANY_GET_WITH); plus the closer's
 * and group rank 0's reads spread over all and a second wait for some of
 * the first 31 (the count markers). Measured 9.9 / 9.0 when written (10.9 /
 * 9.9 before version 5); 10.9 / 9.9 on a server of version 4 (its
 * WAIT_ANY_GET, then a read of the assignment) and 16.4 / 15.5 on one of
 * version 3, which still form both rounds through the fallbacks (and the
 * closer's ticket-by-ticket look). */
START_TEST(store_round_trips_per_member)
{
	double first, rejoin, first3, rejoin3, first4, rejoin4;

	rounds_on_store(40, 0, &first, &rejoin);
	rounds_on_store(40, 4, &first4, &rejoin4);
	rounds_on_store(40, 3, &first3, &rejoin3);
	fprintf(stderr,
		"store requests per member: first round %.1f, rejoin %.1f; on a version-4 "
		"server %.1f, %.1f; on a version-3 server %.1f, %.1f\n",
		first, rejoin, first4, rejoin4, first3, rejoin3);
	ck_assert_msg(first <= 11.0 && rejoin <= 10.0,
		      "requests per member: first round %.1f, rejoin %.1f", first, rejoin);
	/* Version 4 costs one request more than version 5's floor (connect 3,
	 * first round 6, rejoin 5 after a reconnect of 3), version 3 three more.
	 * Each is checked against that floor, not against another timed run:
	 * the count markers' second waits vary with scheduling (issue 23: under
	 * two CPU hogs "10.1, 10.0 vs 9.8, 9.0" failed a comparison of runs). */
	ck_assert_msg(first4 >= 10.0 && rejoin4 >= 9.0, "version 4: %.1f, %.1f", first4, rejoin4);
	ck_assert_msg(first3 >= 13.0 && rejoin3 >= 12.0, "version 3: %.1f, %.1f", first3, rejoin3);
}
END_TEST

static void *monitor_main(void *arg)
{
	struct c10d_job *j = arg;

	j->h.result = c10d_job_monitor(j, &j->mon_c);
	return NULL;
}

/* A monitor on a lease its round kept alive kept_ago_ms ago (0: unknown),
 * heartbeat 30 s: the store's requests from its start until another node
 * ends the round (one SET, included). */
static uint64_t monitor_requests(uint32_t kept_ago_ms)
{
	struct coord_opts o = {.host = "127.0.0.1", .prefix = "mon", .timeout_ms = 20000};
	struct c10d_job *j = c10d_job_new(JOB_MONITOR);
	struct coord *other = NULL;
	struct rsrv v;
	pthread_t thr;
	uint64_t r0, r1;

	ck_assert_ptr_nonnull(j);
	rsrv_up(&v, 0);
	o.port = store_server_port(v.srv);
	ck_assert_int_eq(coord_open(&o, &j->mon_c), 0);
	ck_assert_int_eq(coord_open(&o, &other), 0);
	ck_assert_int_eq(coord_lease_grant(j->mon_c, 60000, "r0/change", "dead", &j->lease), 0);
	ck_assert_int_eq(c10d_parse_conf("heartbeat_interval=30,lease_ttl=90", &j->conf, NULL, 0),
			 0);
	snprintf(j->host, sizeof(j->host), "127.0.0.1");
	j->nnodes = 2;
	j->lease_kept_ms = kept_ago_ms ? clock_now_ms() - kept_ago_ms : 0;
	r0 = rsrv_requests(&v);
	ck_assert_int_eq(pthread_create(&thr, NULL, monitor_main, j), 0);
	/* The change comes once the monitor waits for it: its wait (and the
	 * keep-alive before it, for a lease not kept a heartbeat ago) reached
	 * the store, which counts a request when it arrives. */
	for (int i = 0;
	     i < 2000 && rsrv_requests(&v) < r0 + (kept_ago_ms && kept_ago_ms < 30000 ? 1 : 2); i++)
		usleep(10000);
	ck_assert_int_eq(coord_set(other, "r0/change", "restart node1"), 0);
	while (!atomic_load(&j->h.posted))
		usleep(10000);
	ck_assert_int_eq(j->change, RDZV_CHANGE_RESTART);
	atomic_store(&j->h.stop, 1); /* the agent moved on */
	pthread_join(thr, NULL);
	ck_assert_int_eq(j->h.result, 0);
	r1 = rsrv_requests(&v);
	coord_close(other);
	j->h.release(&j->h);
	rsrv_down(&v);
	return r1 - r0;
}

/* The round kept the lease alive just now: the monitor's first keep-alive
 * waits a heartbeat (the wait on the change key is its only request); an
 * unknown or old keep-alive is renewed first, as before. */
START_TEST(monitor_keeps_a_fresh_lease_a_heartbeat_later)
{
	ck_assert_uint_eq(monitor_requests(50), 2); /* WAIT_ANY_GET, the SET */
	ck_assert_uint_eq(monitor_requests(0), 3);  /* + LEASE_KEEPALIVE */
	ck_assert_uint_eq(monitor_requests(31000), 3);
}
END_TEST

START_TEST(late_joiner_triggers_next_round_and_ranks_stay)
{
	struct coord_mem *m;
	struct ag g[3];
	char *ch;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 2; i++) { /* round 0: MIN agents */
		ag_init(&g[i], m, i, 2, 3, 2, LAST_CALL_ONCE_ALL_IN);
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
	}
	/* A third node: round 0 is closed with 2 < MAX, so it asks for more. */
	ag_init(&g[2], m, 2, 2, 3, 2, LAST_CALL_AT_MAX);
	ag_start(&g[2]);
	wait_key(m, "r0/change");
	ch = mem_val(m, "r0/change");
	ck_assert_str_eq(ch, "join host2");
	free(ch);
	/* The members come back for round 1 with their old group ranks; it
	 * closes when the three are in (MAX), whoever comes last. */
	for (int i = 0; i < 2; i++) {
		ag_last_call(&g[i], true);
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 3; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
		ck_assert_int_eq(g[i].info.group_world_size, 3);
		ck_assert_int_eq(g[i].info.world_size, 6);
	}
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(g[i].info.group_rank, g[i].a.prev_grank);
	ck_assert_int_eq(g[2].info.group_rank, 2);
	coord_mem_free(m);
}
END_TEST

START_TEST(restart_marks_the_round_and_bumps_it)
{
	struct coord_mem *m;
	struct ag g[2];
	char *ch;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 2; i++) {
		ag_init(&g[i], m, i, 2, 2, 1, NULL);
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++)
		ag_join(&g[i]);
	for (int i = 0; i < 2; i++) {
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
		ck_assert_int_eq(g[i].info.group_rank, g[i].a.prev_grank);
	}
	ch = mem_val(m, "r0/change");
	ck_assert_ptr_nonnull(ch);
	ck_assert_int_eq(strncmp(ch, "restart ", 8), 0);
	free(ch);
	coord_mem_free(m);
}
END_TEST

START_TEST(spare_waits_then_job_ends)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g[3];

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 2; i++) {
		ag_init(&g[i], m, i, 1, 2, 1, LAST_CALL_AT_MAX); /* both in round 0 */
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
	}
	ag_init(&g[2], m, 2, 1, 2, 1, NULL);
	ag_start(&g[2]);
	wait_key(m, "r0/joined");
	/* MAX reached: no change is asked for; the job ends. */
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	for (int i = 0; i < 200; i++) {
		int64_t n = 0;

		ck_assert_int_eq(coord_add(c, "r0/joined", 0, &n), 0);
		if (n == 3)
			break;
		usleep(10000);
	}
	ck_assert_int_eq(coord_exists(c, "r0/change"), 0);
	ck_assert_int_eq(coord_set(c, "closed", "done 0"), 0);
	coord_close(c);
	ag_join(&g[2]);
	ck_assert_int_eq(g[2].result, CRUN_ERDZVCLOSED);
	coord_mem_free(m);
}
END_TEST

/* A job that ends while a member waits in an open round wakes it at once
 * with the reason (before, it slept until the join timeout; an agent coming
 * back for a next round no longer reads "closed" before joining). */
START_TEST(job_closed_while_joining_wakes_the_member)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ag_init(&g, m, 0, 2, 2, 1, "join_timeout=600");
	g.a.prev_round = 0; /* coming back: no look at "closed" first */
	g.a.prev_grank = 0;
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_set(c, "round", "0"), 0);
	ag_start(&g);
	wait_key(m, "r1/joined");
	ck_assert_int_eq(coord_set(c, "closed", "failed: node3 exited with 1"), 0);
	coord_close(c);
	ag_join(&g);
	ck_assert_int_eq(g.result, CRUN_ERDZVCLOSED);
	ck_assert_ptr_nonnull(strstr(g.err, "failed: node3 exited with 1"));
	coord_mem_free(m);
}
END_TEST

/* A round-n exit barrier job of group rank 0 of two nodes (the host or not). */
static struct c10d_job *barrier_job(int round, bool is_host, const char *conf)
{
	struct c10d_job *j = c10d_job_new(JOB_BARRIER);
	char err[256];

	ck_assert_ptr_nonnull(j);
	ck_assert_int_eq(c10d_parse_conf(conf, &j->conf, err, sizeof(err)), 0);
	snprintf(j->prefix, sizeof(j->prefix), "crun-c10d/job");
	snprintf(j->hostname, sizeof(j->hostname), "host0");
	j->round = round;
	j->nnodes = 2;
	j->host_member = 1;
	j->is_host = is_host;
	return j;
}

/* The round-0 barrier job a restart woke (the loop dropped it) wakes again
 * when round 1 ends the job ("done 1"): that is not round 0 passing, and the
 * host must not wait C10D_DEPART_MS for round 0's departures (before, it
 * did: a connection, and so the host's exit, held 10 s after round 1). */
START_TEST(barrier_woken_by_a_later_round_does_not_pass)
{
	struct coord_mem *m;
	struct coord *c;
	struct c10d_job *j = barrier_job(0, true, NULL);

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_set(c, "closed", "done 1"), 0);
	ck_assert_int_eq(c10d_job_barrier(j, c), 0);
	ck_assert_int_ne(j->barrier, BO_PASSED);
	ck_assert_ptr_nonnull(strstr(j->err, "later round"));
	coord_close(c);
	j->h.release(&j->h);
	coord_mem_free(m);
}
END_TEST

/* The host's barrier times out: it closes the job as failed, so that the
 * node still running learns it from the store (closed, and the round's
 * change key its monitor watches) and hangs up, instead of the host
 * lingering C10D_DEPART_MS for a node never told. */
START_TEST(host_barrier_timeout_closes_the_job_as_failed)
{
	struct coord_mem *m;
	struct coord *c;
	struct c10d_job *j = barrier_job(0, true, "join_timeout=1");
	char *v;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(c10d_job_barrier(j, c), CRUN_ETIMEDOUT);
	ck_assert_int_eq(j->barrier, BO_TIMED_OUT);
	ck_assert_ptr_nonnull(strstr(j->err, "exit barrier: timed out"));
	v = mem_val(m, "closed");
	ck_assert_ptr_nonnull(v);
	ck_assert_msg(strncmp(v, "failed: exit barrier: timed out", 31) == 0, "%s", v);
	ck_assert_ptr_nonnull(strstr(v, "host0"));
	crun_free(v);
	v = mem_val(m, "r0/change");
	ck_assert_ptr_nonnull(v);
	ck_assert_str_eq(v, "failed");
	crun_free(v);
	coord_close(c);
	j->h.release(&j->h);
	coord_mem_free(m);
}
END_TEST

/* A round-0 barrier job that times out and must leave the job open (no
 * "closed", no change key): the host's job once dropped, or a member's. */
static void barrier_timeout_leaves_the_job_open(bool is_host, bool dropped)
{
	struct coord_mem *m;
	struct coord *c;
	struct c10d_job *j = barrier_job(0, is_host, "join_timeout=1");

	if (dropped)
		atomic_store(&j->h.stop, 1); /* what helper_drop does */
	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(c10d_job_barrier(j, c), CRUN_ETIMEDOUT);
	ck_assert_int_eq(j->barrier, BO_TIMED_OUT);
	ck_assert_int_eq(coord_exists(c, "closed"), 0);
	ck_assert_int_eq(coord_exists(c, "r0/change"), 0);
	coord_close(c);
	j->h.release(&j->h);
	coord_mem_free(m);
}

/* The round-0 barrier a restart dropped times out while round 1 runs (a
 * long round): it must not close the job that round 1 is running. */
START_TEST(dropped_barrier_timeout_leaves_the_job_open)
{
	barrier_timeout_leaves_the_job_open(true, true);
}
END_TEST

/* A node that is not the host leaves the store as it was: its timeout fails
 * it alone (the host, still serving, decides for the rest). */
START_TEST(member_barrier_timeout_leaves_the_job_open)
{
	barrier_timeout_leaves_the_job_open(false, false);
}
END_TEST

START_TEST(conflicts_and_reuse_are_errors)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_set(c, "conf", "2:2"), 0);
	ag_init(&g, m, 0, 2, 3, 1, NULL);
	ag_main(&g);
	ck_assert_int_eq(g.result, CRUN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(g.err, "conflicting settings"));
	ck_assert_int_eq(coord_set(c, "closed", "done 0"), 0);
	ag_init(&g, m, 0, 2, 2, 1, NULL);
	ag_main(&g);
	ck_assert_int_eq(g.result, CRUN_ECONFIG);
	ck_assert_ptr_nonnull(strstr(g.err, "run id already used"));
	coord_close(c);
	coord_mem_free(m);
}
END_TEST

START_TEST(too_few_nodes_time_out)
{
	struct coord_mem *m;
	struct ag g;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ag_init(&g, m, 0, 2, 2, 1, "join_timeout=0.3");
	ag_main(&g);
	ck_assert_int_eq(g.result, CRUN_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(g.err, "waiting for 2 nodes"));
	coord_mem_free(m);
}
END_TEST

/* Issue 8, item 1: ticket 1 drew its ticket and died before writing its
 * record (no record, no alive key). The others close the round without it
 * once its lease could have been taken (one TTL, short here): no one waits
 * for ticket 1 to assign. */
START_TEST(dead_ticket_1_before_its_record_is_dropped)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g[2];
	int64_t t;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_add(c, "r0/joined", 1, &t), 0);
	ck_assert_int_eq(t, 1);
	for (int i = 0; i < 2; i++) {
		/* Tickets 2 and 3: the round closes at MAX (3), ticket 1 dropped. */
		ag_init(&g[i], m, i + 1, 2, 3, 1,
			LAST_CALL_AT_MAX ",lease_ttl=0.5,heartbeat_interval=0.1,join_timeout=20");
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 0);
		ck_assert_int_eq(g[i].info.group_world_size, 2);
	}
	ck_assert_int_ne(g[0].info.group_rank, g[1].info.group_rank);
	coord_close(c);
	coord_mem_free(m);
}
END_TEST

/* A log line a test waits for (crun_set_log_handler): set once seen. */
struct log_watch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const char *want;
	bool seen;
};

static void log_watch_fn(crun_log_level_t level, const char *line, void *arg)
{
	struct log_watch *w = arg;

	(void)level;
	if (!strstr(line, w->want))
		return;
	pthread_mutex_lock(&w->mu);
	w->seen = true;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

/* Whether w's line came within guard_s (a hang guard, not the outcome). */
static bool log_watch_wait(struct log_watch *w, int guard_s)
{
	struct timespec until;
	bool seen;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += guard_s;
	pthread_mutex_lock(&w->mu);
	while (!w->seen && pthread_cond_timedwait(&w->cv, &w->mu, &until) == 0)
		;
	seen = w->seen;
	pthread_mutex_unlock(&w->mu);
	return seen;
}

/* Ticket 1 drew its ticket (record included) but had not taken its lease
 * when ticket 3 reached MAX (3) and looked: 2 of 3 alive. Agents 2 and 3
 * run with MIN min; the closer must wait for ticket 1's alive key and close
 * the round with all 3 when it comes. The TTL outlasts the join timeout, so
 * waiting a TTL, or closing without ticket 1, fails the test. */
static void closer_waits_for_ticket_1(int min)
{
	struct log_watch w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
			      "waiting for ticket 1's alive key", false};
	struct coord_mem *m;
	struct coord *c;
	struct ag g[2];
	int64_t t;
	bool seen;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(
	    coord_ticket(c, "r0/joined", "r0/node/", "-1 -1 1 0 999 10.0.0.9 host9", &t), 0);
	ck_assert_int_eq(t, 1);
	crun_set_log_handler(log_watch_fn, &w);
	crun_set_log_level(CRUN_LOG_DEBUG);
	for (int i = 0; i < 2; i++) {
		ag_init(&g[i], m, i + 1, min, 3, 1,
			LAST_CALL_AT_MAX ",lease_ttl=60,heartbeat_interval=20,join_timeout=5");
		ag_start(&g[i]);
	}
	seen = log_watch_wait(&w, 20);
	if (seen) /* ticket 1 took its lease (the store has no leases: its key) */
		ck_assert_int_eq(coord_set(c, "r0/alive/1", "host9"), 0);
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 0);
		ck_assert_int_eq(g[i].info.group_world_size, 3);
	}
	ck_assert_msg(seen, "the closer never waited for ticket 1");
	crun_set_log_handler(NULL, NULL);
	coord_close(c);
	coord_mem_free(m);
}

/* MIN 3: 2 alive is below MIN. The closer looked again only a lease TTL
 * later before (issue 23: 40 agents beside two CPU hogs, lease_ttl=90,
 * stuck at 40/40 joined until the 60 s join timeout, then every agent's
 * leaving abandoned round after round). */
START_TEST(closer_waits_for_a_ticket_still_taking_its_lease)
{
	closer_waits_for_ticket_1(3);
}
END_TEST

/* Issue 23: MIN 2, so 2 alive could close. The closer closed without
 * ticket 1 before, and a node that was in time waited alone for round 1
 * (test_rdzv_c10d's three-agent tests failed so, 2 in 11 runs beside two
 * CPU hogs). Now it waits for ticket 1, up to one TTL. */
START_TEST(closer_at_max_waits_for_a_ticket_still_taking_its_lease)
{
	closer_waits_for_ticket_1(2);
}
END_TEST

/* Ticket 1 wrote its record and took its lease, then died while the round
 * was open (its lease expired): the round is abandoned and the survivors
 * form the next one at once. */
START_TEST(ticket_1_dying_in_an_open_round_abandons_it)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g[2];
	uint64_t lease = 0;
	int64_t t;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	coord_mem_leases(m, true);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_add(c, "r0/joined", 1, &t), 0);
	ck_assert_int_eq(coord_set(c, "r0/node/1", "-1 -1 1 0 999 10.0.0.9 host9"), 0);
	ck_assert_int_eq(coord_lease_grant(c, 1000, "r0/change", "dead host9", &lease), 0);
	ck_assert_int_eq(coord_put_leased(c, lease, "r0/alive/1", "host9"), 0);
	for (int i = 0; i < 2; i++) {
		/* No last call ends round 0 before ticket 1 dies. */
		ag_init(&g[i], m, i + 1, 2, 4, 1, LAST_CALL_AT_MAX ",join_timeout=5");
		g[i].a.lease_on_handle = true;
		ag_start(&g[i]);
	}
	wait_key(m, "r0/alive/3");
	ck_assert_int_eq(coord_mem_expire(m, lease), 0);
	ck_assert_int_eq(coord_exists(c, "r0/alive/1"), 0);
	/* Both in round 1 (2 < MAX): its last call ends now. */
	wait_key(m, "r1/alive/2");
	end_last_call(m, 1);
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
		ck_assert_int_eq(g[i].info.group_world_size, 2);
		ck_assert_int_eq(g[i].info.attempt, 0); /* a death is no restart */
	}
	coord_close(c);
	coord_mem_free(m);
}
END_TEST

/* A lease that lapses between its grant and the agent's first use of it (the
 * agent stalled past the TTL, as 12,288 simulated agents on one loop do):
 * its expiry ended the round, so the agent takes a new lease and everyone
 * forms the next round. Before: that agent failed its whole rendezvous with
 * "taking the lease: key not found". The first agent is alone in round 0
 * (MIN 2) when its lease lapses, so the round cannot close before the
 * expiry ends it: with both started at once, the second one's close at MAX
 * could win the race against that end (both are right; the monitors then
 * restart the round: issue 23 saw round 0 on a fresh-clone CI). */
START_TEST(lease_lapsed_before_use_is_taken_again)
{
	struct coord_mem *m;
	struct round_head h;
	struct ag g[2];
	char *closed;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	coord_mem_leases(m, true);
	coord_mem_lapse_grants(m, 1);
	for (int i = 0; i < 2; i++) {
		ag_init(&g[i], m, i + 1, 2, 2, 1, "join_timeout=10");
		g[i].a.lease_on_handle = true;
	}
	ag_start(&g[0]);
	wait_key(m, "r1/alive/1"); /* round 0 ended by the lapse; in round 1 with a new lease */
	closed = mem_val(m, "r0/closed");
	ck_assert_ptr_nonnull(closed);
	ck_assert_int_eq(round_head_parse(closed, &h), 0);
	ck_assert_int_eq(h.nodes, 0); /* abandoned */
	free(closed);
	ag_start(&g[1]);
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
		ck_assert_int_eq(g[i].info.group_world_size, 2);
	}
	ck_assert_int_ne(g[0].info.group_rank, g[1].info.group_rank);
	coord_mem_free(m);
}
END_TEST

/* An agent whose every lease lapses before it can use it fails, and says
 * why (bounded: no endless retry). */
START_TEST(lease_that_always_lapses_fails_clearly)
{
	struct coord_mem *m;
	struct ag g;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	coord_mem_leases(m, true);
	coord_mem_lapse_grants(m, 1000);
	ag_init(&g, m, 1, 1, 1, 1, "join_timeout=10");
	g.a.lease_on_handle = true;
	ag_main(&g);
	ck_assert_int_eq(g.result, CRUN_ENOTFOUND);
	ck_assert_msg(strstr(g.err, "lapsed") != NULL, "%s", g.err);
	ck_assert_msg(strstr(g.err, "lease_ttl") != NULL, "%s", g.err);
	coord_mem_free(m);
}
END_TEST

/* The closer looks tickets up one by one when not all are alive (here 6,000
 * drew a ticket and died before their record): a loop that, on a slow
 * store, outlasts the TTL. Each lookup takes >= 100 us and a lease lapses
 * after 3,000 of its holder's operations without a keep-alive, so keeping it
 * every 10 ms is at most ~100 operations apart. Before: the closer's lease
 * lapsed inside the loop, round 0 was abandoned and the two formed round 1. */
START_TEST(closer_keeps_its_lease_while_looking_tickets_up)
{
	struct coord_mem *m;
	struct coord *c;
	struct ag g[2];
	int64_t t;

	ck_assert_int_eq(coord_mem_new(&m), 0);
	coord_mem_leases(m, true);
	ck_assert_int_eq(coord_open_mem(m, "crun-c10d/job", &c), 0);
	ck_assert_int_eq(coord_add(c, "r0/joined", 6000, &t), 0);
	coord_mem_old_store(m); /* no bulk look: the key-by-key fallback runs */
	coord_mem_slow(m, 100, 3000);
	for (int i = 0; i < 2; i++) {
		ag_init(&g[i], m, i + 1, 2, 6002, 1,
			/* Tickets 6001 and 6002 = MAX: it closes when both are in. */
			LAST_CALL_AT_MAX ",heartbeat_interval=0.01,lease_ttl=1,join_timeout=20");
		g[i].a.lease_on_handle = true;
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 0);
		ck_assert_int_eq(g[i].info.group_world_size, 2);
	}
	coord_close(c);
	coord_mem_free(m);
}
END_TEST

/* Issue 8, item 2: B missed round 1 and rejoins in round 2 carrying its
 * round-0 group rank, which C holds since round 1. Before: "ordering the
 * nodes: invalid argument" on every agent. */
START_TEST(node_back_from_an_older_round_gets_a_new_rank)
{
	struct coord_mem *m;
	struct ag g[3];
	int seen[3] = {0};

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 3; i++) { /* round 0 closes when all three are in */
		ag_init(&g[i], m, i, 2, 3, 1, LAST_CALL_AT_MAX);
		ag_start(&g[i]);
	}
	for (int i = 0; i < 3; i++) {
		ag_ok(&g[i]);
	}
	/* Round 1 without B (g[1]): A and C restart (MIN agents). */
	for (int i = 0; i < 3; i += 2) {
		ag_last_call(&g[i], false);
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 3; i += 2) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 1);
	}
	/* B comes back late (round 1 closed with 2 < MAX: it asks for room),
	 * the others follow it into round 2, which closes at MAX. */
	ag_rejoin(&g[1]);
	wait_key(m, "r1/change");
	for (int i = 0; i < 3; i += 2) {
		ag_last_call(&g[i], true);
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 3; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 2);
		ck_assert_int_eq(g[i].info.group_world_size, 3);
		seen[g[i].info.group_rank]++;
	}
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(seen[i], 1);
	ck_assert_int_eq(g[1].info.group_rank, 2);
	coord_mem_free(m);
}
END_TEST

/* Issue 8, item 3: after a counted restart, a node that joins later starts at
 * the job's attempt, not at 0. */
START_TEST(late_node_gets_the_job_wide_attempt)
{
	struct coord_mem *m;
	struct ag g[3];

	ck_assert_int_eq(coord_mem_new(&m), 0);
	for (int i = 0; i < 2; i++) { /* rounds 0 and 1: MIN agents */
		ag_init(&g[i], m, i, 2, 3, 1, LAST_CALL_ONCE_ALL_IN);
		ag_start(&g[i]);
	}
	for (int i = 0; i < 2; i++)
		ag_join(&g[i]);
	for (int i = 0; i < 2; i++) { /* a worker failed: both restart */
		ck_assert_int_eq(g[i].info.attempt, 0);
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 2; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].info.attempt, 1);
	}
	ag_init(&g[2], m, 2, 2, 3, 1, LAST_CALL_AT_MAX);
	ag_start(&g[2]);
	wait_key(m, "r1/change");
	for (int i = 0; i < 2; i++) { /* round 2 closes when the three are in */
		ag_last_call(&g[i], true);
		ag_rejoin(&g[i]);
	}
	for (int i = 0; i < 3; i++) {
		ag_ok(&g[i]);
		ck_assert_int_eq(g[i].round, 2);
		ck_assert_int_eq(g[i].info.attempt, 1); /* a join is no restart */
	}
	coord_mem_free(m);
}
END_TEST

/* ---- a rendezvous store restarted (empty) while a round forms ------------------- */

/* v's store killed and started again, empty, on its port (as systemd restarts
 * crun-rdzvd): every connection closed, every key and lease gone. */
static void rsrv_restart(struct rsrv *v)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	event_base_loopbreak(v->base);
	pthread_join(v->thr, NULL);
	c.host = "127.0.0.1";
	c.port = store_server_port(v->srv);
	store_server_free(v->srv);
	ck_assert_int_eq(store_server_new(v->base, &c, &v->srv), 0);
	ck_assert_int_eq(pthread_create(&v->thr, NULL, rsrv_loop, v), 0);
}

/* One agent's round job as the agent runs it (job_run): its own connection,
 * the lease on a second one (the monitor's to be). */
struct rj {
	pthread_t thr;
	struct c10d_job *j;
	struct coord *c;
};

static void *rj_main(void *arg)
{
	struct rj *x = arg;

	x->j->h.result = c10d_job_round(x->j, x->c);
	return NULL;
}

/* Agent idx joins on port; prev: the round it completed (NULL: a first
 * join), restart: why it left it (its own worker failed, or it read a
 * restart of another node's). */
static void rj_start(struct rj *x, uint16_t port, int idx, const struct c10d_job *prev,
		     bool own_failure)
{
	struct c10d_job *j = c10d_job_new(JOB_ROUND);

	ck_assert_ptr_nonnull(j);
	snprintf(j->host, sizeof(j->host), "127.0.0.1");
	snprintf(j->prefix, sizeof(j->prefix), "crun-c10d/restarted");
	snprintf(j->addr, sizeof(j->addr), "10.0.0.%d", idx);
	snprintf(j->hostname, sizeof(j->hostname), "host%d", idx);
	ck_assert_int_eq(c10d_parse_conf("heartbeat_interval=0.1,lease_ttl=1,last_call_timeout=0.1,"
					 "join_timeout=10",
					 &j->conf, NULL, 0),
			 0);
	j->port = port;
	j->min = j->max = 2;
	j->nproc = 1;
	j->wport = (uint16_t)(1000 + idx);
	j->take_lease = true;
	j->prev_round = prev ? prev->round : -1;
	j->prev_grank = prev ? prev->info.group_rank : -1;
	if (prev)
		j->info = prev->info;
	j->change_seen = j->prev_restart = prev && !own_failure;
	x->j = j;
	ck_assert_int_eq(c10d_job_open(j, 5000, &x->c), 0);
	ck_assert_int_eq(pthread_create(&x->thr, NULL, rj_main, x), 0);
}

static void rj_end(struct rj *x)
{
	pthread_join(x->thr, NULL);
	coord_close(x->c);
	x->c = NULL;
	ck_assert_msg(x->j->h.result == 0, "%s", x->j->err);
}

static void rj_free(struct rj *x)
{
	x->j->h.release(&x->j->h);
}

/* Waits until `key` exists on the store at port. */
static void rsrv_wait_key(uint16_t port, const char *key)
{
	struct coord_opts o = {.host = "127.0.0.1",
			       .port = port,
			       .prefix = "crun-c10d/restarted",
			       .connect_timeout_ms = 5000,
			       .timeout_ms = 10000};
	struct coord *c = NULL;

	ck_assert_int_eq(coord_open(&o, &c), 0);
	ck_assert_int_eq(coord_wait(c, key, 10000), 0);
	coord_close(c);
}

/* The store restarts (empty) while agent A waits alone in an open round:
 * _i 0, the job's first round; _i 1, the round after a worker failure (A's
 * own; B read it). A finds its lease gone at its next keep-alive, puts the
 * job's state back and joins the round the store has now; B, started after
 * the restart, joins it too: the round forms with both, in the same round
 * number and attempt as without the restart. (Before: A waited in the
 * forgotten round and timed out at join_timeout.) */
START_TEST(round_forms_after_the_store_restarts)
{
	struct rj a, b;
	struct rsrv v;
	uint16_t port;
	int want_round = _i;

	rsrv_up(&v, 0);
	port = store_server_port(v.srv);
	if (_i == 1) { /* round 0 forms; A's worker fails: both come back */
		rj_start(&a, port, 0, NULL, false);
		rj_start(&b, port, 1, NULL, false);
		rj_end(&a);
		rj_end(&b);
		ck_assert_int_eq(a.j->info.attempt, 0);
		{
			struct c10d_job *pa = a.j, *pb = b.j;

			rj_start(&a, port, 0, pa, true);
			rsrv_wait_key(port, "r1/alive/1");
			rsrv_restart(&v);
			rj_start(&b, port, 1, pb, false);
			pa->h.release(&pa->h);
			pb->h.release(&pb->h);
		}
	} else {
		rj_start(&a, port, 0, NULL, false);
		rsrv_wait_key(port, "r0/alive/1");
		rsrv_restart(&v);
		rj_start(&b, port, 1, NULL, false);
	}
	rj_end(&a);
	rj_end(&b);
	ck_assert_int_eq(a.j->round, want_round);
	ck_assert_int_eq(b.j->round, want_round);
	ck_assert_int_eq(a.j->info.group_world_size, 2);
	ck_assert_int_eq(a.j->info.group_rank + b.j->info.group_rank, 1);
	ck_assert_int_eq(a.j->info.attempt, _i);
	ck_assert_int_eq(b.j->info.attempt, _i);
	rj_free(&a);
	rj_free(&b);
	rsrv_down(&v);
}
END_TEST

/* ---- fencing a member cut off from its store (c10d_fence.c) ---------------------- */

START_TEST(fence_deadline_is_a_ttl_after_the_last_renewal)
{
	/* lease_ttl 3 s, heartbeat 1 s: a TTL after the last renewal... */
	ck_assert_uint_eq(c10d_fence_deadline(10000, 0, 3000, 1000), 13000);
	/* ...or, when the store was last seen refusing (restarting), as long
	 * as the others wait for this node once it is back (monitor.c) */
	ck_assert_uint_eq(c10d_fence_deadline(10000, 12000, 3000, 1000),
			  12000 + 3000 + 1000 + C10D_REDIAL_MS);
	ck_assert_uint_eq(c10d_fence_deadline(20000, 12000, 3000, 1000), 23000);
}
END_TEST

struct fence_t {
	struct event_base *base;
	uint64_t kept; /* the last renewal the fence is told about */
	int checks, fenced;
	uint64_t fenced_ms; /* when it fired */
	int listen_fd;	    /* fence_t_back: starts listening on it */
};

static uint64_t fence_t_kept(void *arg)
{
	struct fence_t *t = arg;

	if (++t->checks >= 40) /* enough looks without a fence: end the loop */
		event_base_loopbreak(t->base);
	return t->kept;
}

static void fence_t_on(void *arg)
{
	struct fence_t *t = arg;

	t->fenced++;
	t->fenced_ms = clock_now_ms();
	event_base_loopbreak(t->base);
}

/* A fence on its own loop, TTL 200 ms, heartbeat 20 ms, renewed just now,
 * probing 127.0.0.1:port. */
static void fence_t_begin(struct fence_t *t, struct c10d_fence *f, uint16_t port)
{
	t->base = event_base_new();
	ck_assert_ptr_nonnull(t->base);
	t->kept = clock_now_ms();
	ck_assert_int_eq(
	    c10d_fence_init(f, t->base, "127.0.0.1", port, fence_t_kept, fence_t_on, t), 0);
	c10d_fence_start(f, 200, 20);
}

/* A lease unrenewed for a TTL: with the store's address answering (_i 0:
 * a listener; it may have ended the lease) the workers are fenced; with it
 * refusing (_i 1: the store process is down, as while crun-rdzvd restarts,
 * and ends no lease) they are not, however long the probes go on. */
START_TEST(fence_fires_unless_the_store_refuses)
{
	struct fence_t t = {0};
	struct c10d_fence f;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	if (_i == 0)
		ck_assert_int_eq(listen(fd, 4), 0);
	else
		close(fd); /* a port nobody listens on: refused */
	fence_t_begin(&t, &f, ntohs(sa.sin_port));
	ck_assert_int_eq(event_base_dispatch(t.base), 0);
	ck_assert_int_eq(t.fenced, _i == 0 ? 1 : 0);
	if (_i == 1)
		ck_assert_uint_gt(f.down_ms, 0);
	c10d_fence_release(&f);
	event_base_free(t.base);
	if (_i == 0)
		close(fd);
}
END_TEST

static void fence_t_back(evutil_socket_t fd, short what, void *arg)
{
	struct fence_t *t = arg;

	(void)fd;
	(void)what;
	ck_assert_int_eq(listen(t->listen_fd, 4), 0);
}

/* The store refuses (down) from the last renewal until shortly before the
 * TTL, then answers again (crun-rdzvd restarted quickly) while the lease is
 * not renewed yet: the fence must have seen the refusal, and gives the
 * members the time they wait for each other from it. Failed before: the
 * first probe came at the TTL, found the store back, and fenced at once. */
START_TEST(fence_sees_a_store_that_was_down_before_the_ttl)
{
	struct fence_t t = {0};
	struct c10d_fence f;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t len = sizeof(sa);
	struct timeval back = {0, 150 * 1000}; /* the TTL is 200 ms */
	struct event *ev;

	/* Bound, not listening: connects are refused, then listen() is the
	 * restart, on the same port. */
	t.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(t.listen_fd, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(t.listen_fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(getsockname(t.listen_fd, (struct sockaddr *)&sa, &len), 0);
	fence_t_begin(&t, &f, ntohs(sa.sin_port));
	ev = evtimer_new(t.base, fence_t_back, &t);
	ck_assert_ptr_nonnull(ev);
	ck_assert_int_eq(evtimer_add(ev, &back), 0);
	ck_assert_int_eq(event_base_dispatch(t.base), 0);
	ck_assert_msg(f.down_ms > 0, "the fence never saw the store refuse (fenced: %d)", t.fenced);
	if (t.fenced) /* only once the members' wait after the refusal passed */
		ck_assert_uint_ge(t.fenced_ms, c10d_fence_deadline(t.kept, f.down_ms, 200, 20));
	event_free(ev);
	c10d_fence_release(&f);
	event_base_free(t.base);
	close(t.listen_fd);
}
END_TEST

static void add_restart_tests(Suite *s)
{
	TCase *tc = tcase_create("store_restart");

	tcase_add_loop_test(tc, round_forms_after_the_store_restarts, 0, 2);
	tcase_add_test(tc, fence_deadline_is_a_ttl_after_the_last_renewal);
	tcase_add_loop_test(tc, fence_fires_unless_the_store_refuses, 0, 2);
	tcase_add_test(tc, fence_sees_a_store_that_was_down_before_the_ttl);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
}

static Suite *c10d_suite(void)
{
	Suite *s = suite_create("rdzv_c10d");
	TCase *tc = tcase_create("pure");

	tcase_add_test(tc, conf_store_limits);
	tcase_add_test(tc, conf_worker_store);
	tcase_add_test(tc, heterogeneous_prefix_sums);
	tcase_add_test(tc, conf_defaults_and_keys);
	tcase_add_test(tc, conf_errors_name_the_key);
	tcase_add_test(tc, cli_accepts_elastic_c10d);
	tcase_add_test(tc, cli_min_max_needs_c10d);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	tc = tcase_create("rounds");
	tcase_add_test(tc, round_closes_at_max_with_prefix_sums);
	tcase_add_test(tc, round_closes_after_min_and_last_call);
	tcase_add_test(tc, requests_per_member_are_constant);
	tcase_add_test(tc, bytes_per_member_are_constant);
	tcase_add_test(tc, monitor_keeps_a_fresh_lease_a_heartbeat_later);
	tcase_add_test(tc, late_joiner_triggers_next_round_and_ranks_stay);
	tcase_add_test(tc, restart_marks_the_round_and_bumps_it);
	tcase_add_test(tc, spare_waits_then_job_ends);
	tcase_add_test(tc, job_closed_while_joining_wakes_the_member);
	tcase_add_test(tc, barrier_woken_by_a_later_round_does_not_pass);
	tcase_add_test(tc, host_barrier_timeout_closes_the_job_as_failed);
	tcase_add_test(tc, member_barrier_timeout_leaves_the_job_open);
	tcase_add_test(tc, dropped_barrier_timeout_leaves_the_job_open);
	tcase_add_test(tc, conflicts_and_reuse_are_errors);
	tcase_add_test(tc, too_few_nodes_time_out);
	tcase_add_test(tc, dead_ticket_1_before_its_record_is_dropped);
	tcase_add_test(tc, closer_waits_for_a_ticket_still_taking_its_lease);
	tcase_add_test(tc, closer_at_max_waits_for_a_ticket_still_taking_its_lease);
	tcase_add_test(tc, ticket_1_dying_in_an_open_round_abandons_it);
	tcase_add_test(tc, lease_lapsed_before_use_is_taken_again);
	tcase_add_test(tc, lease_that_always_lapses_fails_clearly);
	tcase_add_test(tc, closer_keeps_its_lease_while_looking_tickets_up);
	tcase_add_test(tc, node_back_from_an_older_round_gets_a_new_rank);
	tcase_add_test(tc, late_node_gets_the_job_wide_attempt);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	/* 120 agents' rounds over real sockets: 10 s alone, past 30 s beside
	 * two CPU hogs (make flake-hunt: 3 timeouts in 15 runs). A hang guard. */
	tc = tcase_create("store");
	tcase_add_test(tc, store_round_trips_per_member);
	tcase_set_timeout(tc, 180);
	suite_add_tcase(s, tc);
	add_restart_tests(s);
	return s;
}

CRUN_CHECK_MAIN(c10d_suite)
