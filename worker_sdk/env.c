/* env.c: crun_init() and friends: the process-wide worker state (ranks, the
 * worker store connection, the world group), read from the environment the
 * way torch.distributed's env:// init reads it. When the job has no agent
 * store (TORCHELASTIC_USE_AGENT_STORE != "True"), rank 0 hosts a store server
 * on MASTER_PORT on a thread of its own, as PyTorch's rank 0 does.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/server.h"
#include "worker_sdk/backend_int.h"
#include "worker_sdk/worker.h"

/* The hosted server's loop runs on its own thread; the only cross-thread
 * action is a byte on stop_pipe, whose event lives in that loop. */
struct host {
	struct event_base *base;
	struct store_server *srv;
	struct event *stop_ev;
	int stop_pipe[2];
	pthread_t thread;
	int running;
};

/* One worker per process, as in torch.distributed's default group. */
static struct {
	int inited;
	int rank, world_size, local_rank, local_world_size, restart_count;
	uint32_t timeout_ms;
	crun_store_t *store; /* the connection */
	crun_store_t *dpg;   /* view "default_pg" */
	crun_pg_t *world;
	int next_group; /* name of the next crun_pg_new() group */
	struct host *host;
	int auto_noted;	    /* "auto fell back to cpu" was said once */
	char last_err[512]; /* why the last crun_init*() / crun_pg_new() failed */
} g = {.rank = -1, .world_size = -1, .local_rank = -1, .local_world_size = -1};

static void host_on_stop(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	event_base_loopbreak(arg);
}

static void *host_main(void *arg)
{
	struct host *h = arg;

	(void)event_base_loop(h->base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void host_stop(struct host *h)
{
	if (!h)
		return;
	if (h->running) {
		(void)!write(h->stop_pipe[1], "x", 1);
		pthread_join(h->thread, NULL);
	}
	store_server_free(h->srv);
	if (h->stop_ev)
		event_free(h->stop_ev);
	if (h->base)
		event_base_free(h->base);
	if (h->stop_pipe[0] >= 0)
		fd_close(h->stop_pipe[0]);
	if (h->stop_pipe[1] >= 0)
		fd_close(h->stop_pipe[1]);
	free(h);
}

static int host_start(uint16_t port, struct host **ret_host)
{
	struct store_server_config cfg = STORE_SERVER_CONFIG_DEFAULT;
	struct host *h = calloc(1, sizeof(*h));
	int r;

	if (!h)
		return CRUN_ENOMEM;
	h->stop_pipe[0] = h->stop_pipe[1] = -1;
	r = CRUN_ENOMEM;
	h->base = event_base_new();
	if (!h->base)
		goto fail;
	if (pipe2(h->stop_pipe, O_CLOEXEC) < 0) {
		r = -errno;
		goto fail;
	}
	h->stop_ev = event_new(h->base, h->stop_pipe[0], EV_READ, host_on_stop, h->base);
	if (!h->stop_ev || event_add(h->stop_ev, NULL) < 0)
		goto fail;
	cfg.port = port;
	r = store_server_new(h->base, &cfg, &h->srv);
	if (r < 0)
		goto fail;
	r = -pthread_create(&h->thread, NULL, host_main, h);
	if (r < 0)
		goto fail;
	h->running = 1;
	*ret_host = h;
	return 0;
fail:
	host_stop(h);
	return r;
}

/* Rank 0 of a self-hosted store waits for every rank's "init/" check-in,
 * polling with ADD +0 as TCPStore's waitForWorkers does. */
static int wait_for_workers(crun_store_t *st, int world_size, uint32_t timeout_ms)
{
	uint64_t deadline = clock_now_ms() + timeout_ms;

	for (;;) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		int64_t v;

		TRY(crun_store_add_raw(st, "init/", 0, &v));
		if (v >= world_size)
			return 0;
		if (clock_now_ms() >= deadline)
			return CRUN_ETIMEDOUT;
		(void)nanosleep(&ts, NULL);
	}
}

static int open_store(const crun_init_opts_t *o, uint32_t tmo)
{
	crun_store_opts_t so = CRUN_STORE_OPTS_INIT;
	int64_t v;

	so.host = o->master_addr;
	so.port = o->master_port;
	so.connect_timeout_ms = tmo;
	so.timeout_ms = tmo;
	so.dialect = o->store_dialect ? o->store_dialect : CRUN_STORE_V2;
	TRY(crun_store_open(&so, &g.store));
	TRY(crun_store_add_raw(g.store, "init/", 1, &v));
	if (!o->use_agent_store && o->rank == 0)
		TRY(wait_for_workers(g.store, o->world_size, tmo));
	return crun_store_view_new(g.store, "default_pg", &g.dpg);
}

static int world_group(const crun_init_opts_t *o, uint32_t tmo)
{
	int *ranks = malloc(sizeof(int) * (size_t)o->world_size);
	struct pg_create_args ca = {.store = g.dpg,
				    .restart_count = o->restart_count,
				    .gname = "0",
				    .my_world_rank = o->rank,
				    .local_rank = o->local_rank,
				    .local_world_size = o->local_world_size,
				    .timeout_ms = tmo,
				    .backend = o->backend,
				    .auto_noted = &g.auto_noted};
	int r;

	if (!ranks)
		return CRUN_ENOMEM;
	for (int i = 0; i < o->world_size; i++)
		ranks[i] = i;
	r = pg_create(&ca, ranks, o->world_size, &g.world, g.last_err, sizeof(g.last_err));
	free(ranks);
	return r;
}

/* Checked before anything collective happens, so every rank fails the same
 * way and at once: a bad name, or "nccl" where the GPU object, CUDA or a
 * device is missing (CRUN_ENOTSUP, the reason in g.last_err). */
static int check_backend(const char *b)
{
	const struct pg_backend *be;
	int fell_back;

	g.last_err[0] = '\0';
	if (!b || !strcmp(b, "auto") || !strcmp(b, "cpu"))
		return 0;
	return pg_backend_pick(b, &be, &fell_back, g.last_err, sizeof(g.last_err));
}

/* crun_init_opts_t as first released ends with store_dialect. Option structs
 * only grow at the end (STYLE §2): a caller built against an older header
 * passes its smaller struct_size, and the fields it lacks take their
 * defaults from CRUN_INIT_OPTS_INIT. */
#define INIT_OPTS_FIRST_SIZE (offsetof(crun_init_opts_t, store_dialect) + sizeof(int))

int crun_init_explicit(const crun_init_opts_t *opts)
{
	crun_init_opts_t full = CRUN_INIT_OPTS_INIT;
	const crun_init_opts_t *o = &full;
	uint32_t tmo;
	int r;

	if (g.inited)
		return CRUN_EALREADY;
	if (!opts || opts->struct_size < INIT_OPTS_FIRST_SIZE)
		return CRUN_EINVAL;
	/* Read no further than the caller's struct; a newer, bigger one keeps
	 * its extra tail to itself. */
	memcpy(&full, opts, MIN(opts->struct_size, sizeof(full)));
	full.struct_size = sizeof(full);
	if (o->world_size < 1 || o->world_size > PG_MAX_WORLD || o->rank < 0 ||
	    o->rank >= o->world_size || !o->master_addr || o->restart_count < 0)
		return CRUN_EINVAL;
	TRY(check_backend(o->backend));
	tmo = o->timeout_ms ? o->timeout_ms : PG_DEFAULT_TIMEOUT_MS;
	if (!o->use_agent_store && o->rank == 0) {
		r = host_start(o->master_port, &g.host);
		if (r < 0)
			return r;
	}
	r = open_store(o, tmo);
	if (r == 0)
		r = world_group(o, tmo);
	if (r < 0)
		goto fail;
	g.rank = o->rank;
	g.world_size = o->world_size;
	g.local_rank = o->local_rank;
	g.local_world_size = o->local_world_size;
	g.restart_count = o->restart_count;
	g.timeout_ms = tmo;
	g.next_group = 1;
	g.inited = 1;
	return 0;
fail:
	crun_store_close(g.dpg);
	crun_store_close(g.store);
	g.dpg = g.store = NULL;
	host_stop(g.host);
	g.host = NULL;
	return r;
}

static int env_int(const char *name, int def, int max, int *ret)
{
	const char *s = getenv(name);
	uint64_t v;

	if (!s || !*s) {
		if (def < 0)
			return CRUN_ECONFIG;
		*ret = def;
		return 0;
	}
	if (parse_uint_range(s, 0, (uint64_t)max, &v) < 0)
		return CRUN_ECONFIG;
	*ret = (int)v;
	return 0;
}

int crun_init(void)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;
	const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
	int port, tmo, dialect;

	/* CRUN_LOG_LEVEL / CRUN_LOG_SUBSYS, like NCCL_DEBUG for NCCL users. */
	if (getenv("CRUN_LOG_LEVEL"))
		log_init("crun-worker", LL_WARN);

	TRY(env_int("RANK", -1, PG_MAX_WORLD - 1, &o.rank));
	TRY(env_int("WORLD_SIZE", -1, PG_MAX_WORLD, &o.world_size));
	TRY(env_int("LOCAL_RANK", 0, PG_MAX_WORLD - 1, &o.local_rank));
	TRY(env_int("LOCAL_WORLD_SIZE", 1, PG_MAX_WORLD, &o.local_world_size));
	TRY(env_int("MASTER_PORT", -1, 65535, &port));
	TRY(env_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30, &o.restart_count));
	TRY(env_int("CRUN_PG_TIMEOUT_MS", 0, INT32_MAX, &tmo));
	TRY(env_int("CRUN_STORE_DIALECT", 2, 2, &dialect));
	o.master_addr = getenv("MASTER_ADDR");
	if (!o.master_addr || !*o.master_addr || o.world_size < 1)
		return CRUN_ECONFIG;
	o.master_port = (uint16_t)port;
	o.timeout_ms = (uint32_t)tmo;
	o.store_dialect = dialect == 1 ? CRUN_STORE_V1 : CRUN_STORE_V2;
	/* PyTorch compares the exact string "True". */
	o.use_agent_store = agent && !strcmp(agent, "True");
	o.backend = getenv("CRUN_PG_BACKEND");
	return crun_init_explicit(&o);
}

void crun_finalize(void)
{
	char key[64];
	int64_t v;

	if (!g.inited)
		return;
	pg_stop_and_destroy(g.world);
	g.world = NULL;
	/* Check out, so a hosting rank 0 keeps the store up until everyone
	 * is done with it (bounded: a dead rank never checks out). */
	if (pg_fmt(key, sizeof(key), "crun/a%d/finalized", g.restart_count) == 0 &&
	    crun_store_add(g.dpg, key, 1, &v) == 0 && g.host) {
		uint64_t deadline = clock_now_ms() + MIN(g.timeout_ms, 30000u);

		while (v < g.world_size && clock_now_ms() < deadline) {
			struct timespec ts = {0, 10 * 1000 * 1000};

			(void)nanosleep(&ts, NULL);
			if (crun_store_add(g.dpg, key, 0, &v) < 0)
				break;
		}
	}
	crun_store_close(g.dpg);
	crun_store_close(g.store);
	g.dpg = g.store = NULL;
	host_stop(g.host);
	g.host = NULL;
	g.inited = 0;
	g.rank = g.world_size = g.local_rank = g.local_world_size = -1;
}

int crun_pg_new(const int *ranks, int n, const char *backend, crun_pg_t **ret_pg)
{
	char name[16];
	int me = 0;

	if (!g.inited || !ranks || n < 1 || n > g.world_size || !ret_pg)
		return CRUN_EINVAL;
	TRY(check_backend(backend));
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= g.world_size)
			return CRUN_EINVAL;
		for (int j = 0; j < i; j++)
			if (ranks[j] == ranks[i])
				return CRUN_EINVAL;
		me |= ranks[i] == g.rank;
	}
	/* Every world rank takes the next name, member or not, so names agree
	 * as long as all ranks create groups in the same order (new_group). */
	TRY(pg_fmt(name, sizeof(name), "%d", g.next_group++));
	if (!me) {
		int r = pg_split_skip(g.world, backend, g.last_err, sizeof(g.last_err));

		if (r == 0)
			*ret_pg = NULL;
		return r;
	}
	struct pg_create_args ca = {.store = g.dpg,
				    .restart_count = g.restart_count,
				    .gname = name,
				    .my_world_rank = g.rank,
				    .local_rank = g.local_rank,
				    .local_world_size = g.local_world_size,
				    .timeout_ms = g.timeout_ms,
				    .backend = backend,
				    .auto_noted = &g.auto_noted,
				    .parent = g.world};

	return pg_create(&ca, ranks, n, ret_pg, g.last_err, sizeof(g.last_err));
}

void crun_pg_free(crun_pg_t *pg)
{
	if (pg && pg != g.world)
		pg_stop_and_destroy(pg);
}

const char *pg_init_last_error(void)
{
	return g.last_err;
}

crun_pg_t *crun_world(void)
{
	return g.world;
}

int crun_rank(void)
{
	return g.rank;
}

int crun_world_size(void)
{
	return g.world_size;
}

int crun_local_rank(void)
{
	return g.local_rank;
}

int crun_local_world_size(void)
{
	return g.local_world_size;
}

crun_store_t *crun_worker_store(void)
{
	return g.store;
}
