/* test_agent_embed.c: libcrun as a scheduler embeds it. The option table
 * through crun_agent_config_set (every row reachable, checked like a flag,
 * order-free); poll mode from the test's own poll() loop with no thread of
 * the agent's (counted in /proc/self/task); the events (rendezvous ranks,
 * worker start and exit); the spawn hook (the computed environment, errors,
 * a pid that is not a child); crun_agent_stop from another thread; two
 * static agents in one loop. Each test runs in Check's forked child. */
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "crun/agent.h"
#include "agent/cli_int.h"

extern char **environ;

/* ---- the option table through the API ------------------------------------------ */

/* A valid value for a row; NULL when the test has none (a new row must get
 * one here, so a row cannot be added without being tried through the API). */
static const char *sample(const struct cli_opt *o)
{
	static const struct {
		const char *key, *val;
	} by_name[] = {
	    {"nnodes", "2"},
	    {"nproc_per_node", "2"},
	    {"rdzv_endpoint", "127.0.0.1:29999"},
	    {"rdzv_id", "job7"},
	    {"rdzv_conf", "join_timeout=5"},
	    {"event_log_handler", "console"},
	    {"role", "trainer"},
	    {"log_dir", "/tmp"},
	    {"redirects", "0:1,1:2"},
	    {"tee", "3"},
	    {"log_line_prefix_template", "[${rank}]"},
	    {"local_ranks_filter", "0"},
	    {"duplicate_stdout_filters", "a,b"},
	    {"duplicate_stderr_filters", "c"},
	    {"master_addr", "10.0.0.1"},
	    {"local_addr", "127.0.0.1"},
	    {"logs_specs", "default"},
	    {"signals_to_handle", "SIGTERM,SIGUSR1"},
	    {"status", "127.0.0.1:0"},
	    {"log_level", "warning"},
	    {"auth_secret_file", "/nonexistent/secret"},
	    {"config", NULL}, /* a file: config_file_and_json_values */
	    {"rendezvous.auth_secret_file", "/nonexistent/secret"},
	    {"rendezvous.tls_cert", "/nonexistent/cert.pem"},
	    {"rendezvous.tls_key", "/nonexistent/key.pem"},
	    {"rendezvous.tls_ca", "/nonexistent/ca.pem"},
	    {"job.program", "train.py"},
	    {"job.args", "[\"--epochs\", \"3\"]"},
	    {"job.env", "{\"A\": \"1\"}"},
	};

	for (size_t i = 0; i < sizeof(by_name) / sizeof(by_name[0]); i++)
		if (strcmp(by_name[i].key, o->name ? o->name : o->json) == 0)
			return by_name[i].val ? by_name[i].val : "";
	if (o->choices) {
		static char first[64];

		snprintf(first, sizeof(first), "%.*s", (int)strcspn(o->choices, "|"), o->choices);
		return first;
	}
	switch (o->type) {
	case CT_FLAG:
		return "1";
	case CT_INT:
		return o->min > 0 ? "1" : "0";
	case CT_SECS:
		return "2.5";
	default:
		return NULL;
	}
}

START_TEST(every_row_of_the_table_is_reachable)
{
	int tried = 0;

	for (int k = 0; k < OPT__MAX; k++) {
		const struct cli_opt *o = &cli_opts[k];
		const char *v = sample(o);
		char dashed[64];

		if (o->type == CT_ACTION) {
			crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;

			ck_assert_int_eq(crun_agent_config_set(&cfg, o->name, ""), CRUN_EINVAL);
			ck_assert_ptr_nonnull(strstr(crun_agent_config_last_error(&cfg), o->name));
			crun_agent_config_release(&cfg);
			continue;
		}
		ck_assert_msg(v, "row '%s' has no sample value in this test: add one",
			      o->name ? o->name : o->json);
		if (k == OPT_CONFIG)
			continue; /* needs a file: its own test */
		/* Both spellings of the flag and the JSON path name the row. */
		for (int how = 0; how < 3; how++) {
			crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
			const char *name = how == 0		 ? o->name
					   : how == 1 && o->name ? dashed
					   : how == 2		 ? o->json
								 : NULL;
			int r;

			if (!name)
				continue;
			snprintf(dashed, sizeof(dashed), "%s", o->name ? o->name : "");
			for (char *p = dashed; *p; p++)
				*p = *p == '_' ? '-' : *p;
			r = crun_agent_config_set(&cfg, name, v);
			ck_assert_msg(r == 0, "'%s'='%s': %s", name, v,
				      crun_agent_config_last_error(&cfg));
			crun_agent_config_release(&cfg);
			ck_assert_ptr_null(cfg.settings);
			tried++;
		}
	}
	ck_assert_int_gt(tried, OPT__MAX);
	crun_set_log_level(CRUN_LOG_WARN);
}
END_TEST

START_TEST(bad_values_are_refused_naming_the_option)
{
	static const struct {
		const char *name, *val, *needle;
	} bad[] = {
	    {"max_restarts", "many", "max_restarts"},
	    {"rdzv_backend", "zookeeper", "zookeeper"},
	    {"shutdown_timeout", "soon", "shutdown_timeout"},
	    {"nproc-per-node", "0", "nproc_per_node"},
	    {"rendezvous.endpoint", "nohostport", "rdzv_endpoint"},
	    {"job.args", "{\"not\": \"a list\"}", "job.args"},
	    {"no_such_option", "1", "no_such_option"},
	    {"help", "1", "help"},
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
		crun_agent_config_t before;

		ck_assert_int_eq(crun_agent_config_set(&cfg, "nnodes", "2"), 0);
		before = cfg;
		ck_assert_int_eq(crun_agent_config_set(&cfg, bad[i].name, bad[i].val), CRUN_EINVAL);
		ck_assert_msg(strstr(crun_agent_config_last_error(&cfg), bad[i].needle), "'%s': %s",
			      bad[i].name, crun_agent_config_last_error(&cfg));
		ck_assert_mem_eq(&cfg, &before, sizeof(cfg)); /* untouched */
		crun_agent_config_release(&cfg);
	}
}
END_TEST

START_TEST(named_values_land_in_the_fields)
{
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;

	/* tee reads nproc_per_node and the endpoint the backend: set before
	 * them, they are applied again once those are known. */
	ck_assert_int_eq(crun_agent_config_set(&cfg, "tee", "0:3,2:1"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "rdzv_endpoint", "node0:1234"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "rdzv_backend", "c10d"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "nnodes", "2:4"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "nproc_per_node", "3"), 0);
	/* A value checked against another (a rank below nproc) comes after it. */
	ck_assert_int_eq(crun_agent_config_set(&cfg, "local-ranks-filter", "2"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "rendezvous.join_timeout", "7"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "shutdown_timeout", "1.5"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "job.program", "/bin/echo"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "job.args", "[\"a\", \"${local_rank}\"]"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "job.env", "{\"K\": \"v=1\"}"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "status", "127.0.0.1:0"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "event_log_handler", "console"), 0);
	ck_assert_int_eq(cfg.nproc_per_node, 3);
	ck_assert_int_eq(cfg.tee[0], 3);
	ck_assert_int_eq(cfg.tee[1], 0);
	ck_assert_int_eq(cfg.tee[2], 1);
	ck_assert_int_eq(cfg.console_ranks[2], 1);
	ck_assert_int_eq(cfg.console_ranks[0], 0);
	ck_assert_str_eq(cfg.rdzv_backend, "c10d");
	ck_assert_str_eq(cfg.master_addr, "node0");
	ck_assert_int_eq(cfg.master_port, 1234);
	ck_assert_int_eq(cfg.min_nnodes, 2);
	ck_assert_int_eq(cfg.max_nnodes, 4);
	ck_assert_ptr_nonnull(strstr(cfg.rdzv_conf, "join_timeout=7"));
	ck_assert_uint_eq(cfg.shutdown_timeout_ms, 1500);
	ck_assert_str_eq(cfg.argv[0], "/bin/echo");
	ck_assert_str_eq(cfg.argv[1], "a");
	ck_assert_str_eq(cfg.argv[2], "${local_rank}");
	ck_assert_ptr_null(cfg.argv[3]);
	ck_assert_str_eq(cfg.worker_env[0], "K=v=1");
	ck_assert_str_eq(cfg.status_listen, "127.0.0.1:0");
	ck_assert_str_eq(cfg.event_log_handler, "console");
	/* The command line's cross-checks apply. */
	ck_assert_int_eq(crun_agent_config_set(&cfg, "node_rank", "5"), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(crun_agent_config_last_error(&cfg), "node_rank"));
	crun_agent_config_release(&cfg);
}
END_TEST

START_TEST(config_file_and_json_values)
{
	char path[] = "/tmp/crun-embed-cfg-XXXXXX";
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	int fd = mkstemp(path);
	const char *json = "{\"job\": {\"nproc_per_node\": 2, \"program\": \"/bin/true\"},"
			   " \"restart\": {\"max_restarts\": 4}}";

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
	close(fd);
	/* The file, then a name that overrides one of its keys. */
	ck_assert_int_eq(crun_agent_config_set(&cfg, "max_restarts", "1"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "config", path), 0);
	ck_assert_int_eq(cfg.nproc_per_node, 2);
	ck_assert_int_eq(cfg.max_restarts, 1);
	ck_assert_str_eq(cfg.argv[0], "/bin/true");
	unlink(path);
	crun_agent_config_release(&cfg);
}
END_TEST

/* ---- poll mode ----------------------------------------------------------------------- */

/* The test's own thread pool for run_blocking: POOL threads made up front,
 * so the process has exactly 1 + POOL threads unless the agent adds one. */
#define POOL 4 /* two agents, a job and a watch each */
struct pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	void (*fn[16])(void *);
	void *job[16];
	int n;
	bool stop;
	pthread_t t[POOL];
	atomic_int jobs_run;
};

static void *pool_main(void *arg)
{
	struct pool *p = arg;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->n && !p->stop)
			pthread_cond_wait(&p->cv, &p->mu);
		if (!p->n)
			break;
		void (*fn)(void *) = p->fn[0];
		void *job = p->job[0];

		p->n--;
		memmove(p->fn, p->fn + 1, (size_t)p->n * sizeof(p->fn[0]));
		memmove(p->job, p->job + 1, (size_t)p->n * sizeof(p->job[0]));
		pthread_mutex_unlock(&p->mu);
		fn(job);
		atomic_fetch_add(&p->jobs_run, 1);
		pthread_mutex_lock(&p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

static int pool_run(void (*fn)(void *job), void *job, void *arg)
{
	struct pool *p = arg;
	int r = 0;

	pthread_mutex_lock(&p->mu);
	if (p->n == 16) {
		r = CRUN_EBUSY;
	} else {
		p->fn[p->n] = fn;
		p->job[p->n++] = job;
		pthread_cond_signal(&p->cv);
	}
	pthread_mutex_unlock(&p->mu);
	return r;
}

static void pool_start(struct pool *p)
{
	sigset_t all, saved;

	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	for (int i = 0; i < POOL; i++)
		ck_assert_int_eq(pthread_create(&p->t[i], NULL, pool_main, p), 0);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

static void pool_stop(struct pool *p)
{
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 0; i < POOL; i++)
		pthread_join(p->t[i], NULL);
}

static int count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* What the events said, per agent. */
struct seen {
	int states, rdzv, starts, exits;
	int group_rank, world_size, base_rank, local_world_size, master_port;
	int start_pid[8], exit_pid[8], exit_code[8], exit_rank[8];
	crun_agent_t *stop_on_start; /* crun_agent_stop from a thread at the first start */
	pthread_t stopper;
	bool stopper_started;
};

static void *stopper_main(void *arg)
{
	ck_assert_int_eq(crun_agent_stop(arg, SIGTERM), 0);
	return NULL;
}

static void on_event(const crun_agent_event_t *ev, void *arg)
{
	struct seen *s = arg;

	ck_assert_uint_eq(ev->struct_size, sizeof(*ev));
	switch (ev->type) {
	case CRUN_AGENT_EV_STATE:
		s->states++;
		break;
	case CRUN_AGENT_EV_RENDEZVOUS:
		s->rdzv++;
		s->group_rank = ev->group_rank;
		s->world_size = ev->world_size;
		s->base_rank = ev->base_rank;
		s->local_world_size = ev->local_world_size;
		s->master_port = ev->master_port;
		ck_assert_ptr_nonnull(ev->master_addr);
		break;
	case CRUN_AGENT_EV_WORKER_START:
		ck_assert_int_gt(ev->pid, 0);
		ck_assert_int_eq(ev->global_rank, s->base_rank + ev->local_rank);
		if (s->starts < 8)
			s->start_pid[s->starts] = ev->pid;
		s->starts++;
		if (s->stop_on_start && !s->stopper_started) {
			ck_assert_int_eq(
			    pthread_create(&s->stopper, NULL, stopper_main, s->stop_on_start), 0);
			s->stopper_started = true;
		}
		break;
	case CRUN_AGENT_EV_WORKER_EXIT:
		if (s->exits < 8) {
			s->exit_pid[s->exits] = ev->pid;
			s->exit_code[s->exits] = ev->exit_code;
			s->exit_rank[s->exits] = ev->global_rank;
		}
		s->exits++;
		break;
	}
}

static char logdir[64];

static void mk_logdir(void)
{
	snprintf(logdir, sizeof(logdir), "/tmp/crun-embed-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
}

static void rm_logdir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", logdir);
	ck_assert_int_eq(system(cmd), 0);
}

/* Dispatches agents from one poll() until all are done; checks the thread
 * count at every turn when want_threads > 0. */
static void poll_until_done(crun_agent_t **a, int n, int *codes, int want_threads)
{
	int done[4] = {0}, left = n;

	for (int turns = 0; left > 0; turns++) {
		struct pollfd p[4];
		int timeout = -1;

		ck_assert_int_lt(turns, 1000000);
		for (int i = 0; i < n; i++) {
			int t = done[i] ? -1 : crun_agent_next_timeout_ms(a[i]);

			p[i] = (struct pollfd){crun_agent_fd(a[i]), POLLIN, 0};
			ck_assert_int_ge(p[i].fd, 0);
			if (t >= 0 && (timeout < 0 || t < timeout))
				timeout = t;
		}
		ck_assert_int_ge(poll(p, (nfds_t)n, timeout < 0 ? 1000 : timeout), 0);
		for (int i = 0; i < n; i++) {
			if (done[i])
				continue;
			ck_assert_int_eq(crun_agent_dispatch(a[i], &done[i], &codes[i]), 0);
			left -= done[i];
		}
		if (want_threads)
			ck_assert_int_eq(count_threads(), want_threads);
	}
}

START_TEST(poll_mode_runs_standalone_with_no_thread_of_its_own)
{
	/* Teed output (the console) and a standalone rendezvous (its store
	 * calls) are the two places that used threads. */
	const char *argv[] = {"/bin/sh", "-c", "echo out-$RANK; exit $LOCAL_RANK", NULL};
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	struct seen s = {0};
	struct pool pool;
	int code = -1;

	mk_logdir();
	pool_start(&pool);
	ck_assert_int_eq(count_threads(), 1 + POOL);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "standalone", "1"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "nproc_per_node", "2"), 0);
	ck_assert_int_eq(crun_agent_config_set(&cfg, "tee", "3"), 0);
	cfg.argv = argv;
	cfg.log_dir = logdir;
	cfg.on_event = on_event;
	cfg.on_event_arg = &s;
	cfg.run_blocking = pool_run;
	cfg.run_blocking_arg = &pool;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	crun_agent_config_release(&cfg);
	ck_assert_int_eq(crun_agent_fd(a), CRUN_EINVAL); /* not started */
	ck_assert_int_eq(crun_agent_start(a), 0);
	ck_assert_int_eq(crun_agent_start(a), CRUN_EINVAL);
	poll_until_done(&a, 1, &code, 1 + POOL);
	ck_assert_int_eq(code, 1); /* local rank 1 exited 1 */
	ck_assert_int_eq(s.rdzv, 1);
	ck_assert_int_eq(s.world_size, 2);
	ck_assert_int_eq(s.local_world_size, 2);
	ck_assert_int_eq(s.group_rank, 0);
	ck_assert_int_eq(s.starts, 2);
	ck_assert_int_eq(s.exits, 2);
	ck_assert_int_gt(s.states, 2);
	for (int i = 0; i < 2; i++) {
		int j = s.exit_pid[0] == s.start_pid[i] ? 0 : 1;

		ck_assert_int_eq(s.exit_pid[j], s.start_pid[i]);
		ck_assert_int_eq(s.exit_code[j], s.exit_rank[j]); /* exit $LOCAL_RANK */
	}
	crun_agent_free(a);
	pool_stop(&pool);
	rm_logdir();
}
END_TEST

START_TEST(poll_mode_stop_from_another_thread)
{
	const char *argv[] = {"/bin/sh", "-c", "exec sleep 600", NULL};
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	struct seen s = {0};
	int code = -1;

	mk_logdir();
	cfg.standalone = 1;
	cfg.nproc_per_node = 2;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	cfg.on_event = on_event;
	cfg.on_event_arg = &s;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	s.stop_on_start = a;
	ck_assert_int_eq(crun_agent_start(a), 0);
	poll_until_done(&a, 1, &code, 0);
	pthread_join(s.stopper, NULL);
	ck_assert_int_eq(code, 1);
	ck_assert_int_eq(s.exits, 2);
	ck_assert_int_eq(s.exit_code[0], 128 + SIGTERM);
	ck_assert_int_eq(s.exit_code[1], 128 + SIGTERM);
	crun_agent_free(a);
	rm_logdir();
}
END_TEST

static int free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, len), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

START_TEST(two_static_agents_in_one_poll_loop)
{
	const char *argv[] = {"/bin/sh", "-c", "test \"$WORLD_SIZE\" = 4 && test -n \"$RANK\"",
			      NULL};
	crun_agent_t *a[2] = {NULL, NULL};
	struct seen s[2] = {{0}};
	char port[16];
	struct pool pool;
	int codes[2] = {-1, -1};

	mk_logdir();
	pool_start(&pool);
	snprintf(port, sizeof(port), "%d", free_port());
	for (int i = 0; i < 2; i++) {
		crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
		char rank[4];

		snprintf(rank, sizeof(rank), "%d", i);
		ck_assert_int_eq(crun_agent_config_set(&cfg, "nnodes", "2"), 0);
		ck_assert_int_eq(crun_agent_config_set(&cfg, "node_rank", rank), 0);
		ck_assert_int_eq(crun_agent_config_set(&cfg, "master_port", port), 0);
		ck_assert_int_eq(crun_agent_config_set(&cfg, "nproc_per_node", "2"), 0);
		ck_assert_int_eq(crun_agent_config_set(&cfg, "rdzv_id", "two"), 0);
		cfg.argv = argv;
		cfg.log_dir = logdir;
		cfg.on_event = on_event;
		cfg.on_event_arg = &s[i];
		cfg.run_blocking = pool_run;
		cfg.run_blocking_arg = &pool;
		ck_assert_int_eq(crun_agent_new(&cfg, &a[i]), 0);
		crun_agent_config_release(&cfg);
		ck_assert_int_eq(crun_agent_start(a[i]), 0);
	}
	poll_until_done(a, 2, codes, 1 + POOL);
	ck_assert_int_gt(atomic_load(&pool.jobs_run), 0); /* the hook ran the store calls */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(codes[i], 0);
		ck_assert_int_eq(s[i].group_rank, i);
		ck_assert_int_eq(s[i].base_rank, 2 * i);
		ck_assert_int_eq(s[i].world_size, 4);
		ck_assert_int_eq(s[i].starts, 2);
		ck_assert_int_eq(s[i].exits, 2);
		crun_agent_free(a[i]);
	}
	pool_stop(&pool);
	rm_logdir();
}
END_TEST

/* ---- the spawn hook --------------------------------------------------------------- */

struct hook {
	int mode; /* 0 posix_spawn, 1 fail -EACCES, 2 a pid that is not a child */
	int calls;
	char rank_env[2][32];
	char path[256];
};

static int hook_spawn(const crun_agent_spawn_req_t *req, void *arg, int *ret_pid)
{
	struct hook *h = arg;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	pid_t pid;
	int err;

	ck_assert_uint_eq(req->struct_size, sizeof(*req));
	h->calls++;
	for (int i = 0; req->envp[i]; i++)
		if (strncmp(req->envp[i], "RANK=", 5) == 0 && req->local_rank < 2)
			snprintf(h->rank_env[req->local_rank], sizeof(h->rank_env[0]), "%s",
				 req->envp[i]);
	snprintf(h->path, sizeof(h->path), "%s", req->path);
	if (h->mode == 1)
		return -EACCES;
	if (h->mode == 2) {
		*ret_pid = (int)getppid(); /* Check's runner: not our child */
		return 0;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, req->stdout_fd, 1);
	posix_spawn_file_actions_adddup2(&fa, req->stderr_fd, 2);
	posix_spawnattr_init(&at);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID);
	err = posix_spawn(&pid, req->path, &fa, &at, req->argv, req->envp);
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	if (err)
		return -err;
	*ret_pid = (int)pid;
	return 0;
}

static int run_hooked(struct hook *h, struct seen *s, bool poll_mode)
{
	const char *argv[] = {"sh", "-c", "test \"$RANK\" = \"$LOCAL_RANK\"", NULL};
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	int code = -1;

	cfg.standalone = 1;
	cfg.nproc_per_node = 2;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	cfg.spawn = hook_spawn;
	cfg.spawn_arg = h;
	cfg.on_event = on_event;
	cfg.on_event_arg = s;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	if (poll_mode) {
		ck_assert_int_eq(crun_agent_start(a), 0);
		poll_until_done(&a, 1, &code, 0);
	} else {
		ck_assert_int_eq(crun_agent_run(a, &code), 0);
	}
	crun_agent_free(a);
	return code;
}

START_TEST(spawn_hook_gets_the_environment_and_its_workers_are_supervised)
{
	for (int poll_mode = 0; poll_mode < 2; poll_mode++) {
		struct hook h = {0};
		struct seen s = {0};

		mk_logdir();
		ck_assert_int_eq(run_hooked(&h, &s, poll_mode), 0);
		ck_assert_int_eq(h.calls, 2);
		ck_assert_str_eq(h.rank_env[0], "RANK=0");
		ck_assert_str_eq(h.rank_env[1], "RANK=1");
		ck_assert_ptr_nonnull(strstr(h.path, "/sh")); /* resolved through PATH */
		ck_assert_int_eq(s.exits, 2);
		ck_assert_int_eq(s.exit_code[0], 0);
		rm_logdir();
	}
}
END_TEST

START_TEST(spawn_hook_errors_are_exec_failures)
{
	struct hook h = {.mode = 1};
	struct seen s = {0};
	int status;

	mk_logdir();
	ck_assert_int_eq(run_hooked(&h, &s, true), 1);
	ck_assert_int_eq(s.exits, 2);
	ck_assert_int_eq(s.exit_code[0], 126); /* EACCES: found, not runnable */
	ck_assert_int_eq(s.exit_pid[0], 0);
	rm_logdir();
	/* A pid that is not ours is refused, never waited for. */
	mk_logdir();
	memset(&s, 0, sizeof(s));
	h.mode = 2;
	ck_assert_int_eq(run_hooked(&h, &s, true), 1);
	ck_assert_int_eq(s.exit_code[0], 127);
	ck_assert_int_eq(waitpid(-1, &status, WNOHANG), -1); /* nothing left */
	rm_logdir();
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("agent_embed");
	TCase *tc = tcase_create("core");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, every_row_of_the_table_is_reachable);
	tcase_add_test(tc, bad_values_are_refused_naming_the_option);
	tcase_add_test(tc, named_values_land_in_the_fields);
	tcase_add_test(tc, config_file_and_json_values);
	tcase_add_test(tc, poll_mode_runs_standalone_with_no_thread_of_its_own);
	tcase_add_test(tc, poll_mode_stop_from_another_thread);
	tcase_add_test(tc, two_static_agents_in_one_poll_loop);
	tcase_add_test(tc, spawn_hook_gets_the_environment_and_its_workers_are_supervised);
	tcase_add_test(tc, spawn_hook_errors_are_exec_failures);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(suite)
