/* agent.c: the agent's life cycle (crun_agent_*), the worker store it serves
 * and the rendezvous glue; one attempt is attempt.c. The state machine that
 * drives all of it is in fsm.c.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "agent/cli.h"
#include "agent/env.h"
#include "agent/numa.h"
#include "agent/poll.h"
#include "agent/nodecheck_int.h"
#include "agent/stacks_int.h"
#include "agent/status.h"
#include "common/common.h"
#include "rendezvous/c10d.h"
#include "rendezvous/rdzv.h"
#include "store/server.h"
#include "service/service.h"
#include "agent/cli_rdzv_int.h"

extern char **environ;

static void make_uuid4(char *buf, size_t cap)
{
	uint8_t b[16] = {0};

	if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
		uint64_t t = clock_now_us() ^ (uint64_t)getpid() << 32;

		memcpy(b, &t, sizeof(t));
	}
	b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
	b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
	snprintf(buf, cap, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
		 b[13], b[14], b[15]);
}

static bool log_to_null(const struct crun_agent *a)
{
	return a->cfg.log_dir && strcmp(a->cfg.log_dir, "/dev/null") == 0;
}

/* Python's tempfile.mkdtemp(prefix=..., dir=...): prefix plus 8 characters
 * of [a-z0-9_] (mkdtemp(3) has 6 and wants them spelled XXXXXX). */
static int make_temp_dir(const char *dir, const char *prefix, char *out, size_t cap)
{
	static const char chars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";

	for (int tries = 0; tries < 100; tries++) {
		uint8_t rnd[8];
		char name[9];

		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			return CRUN_EIO;
		for (int i = 0; i < 8; i++)
			name[i] = chars[rnd[i] % (sizeof(chars) - 1)];
		name[8] = '\0';
		TRY(str_printf(out, cap, "%s/%s%s", dir, prefix, name));
		if (mkdir(out, 0700) == 0)
			return 0;
		if (errno != EEXIST)
			return -errno;
	}
	return CRUN_EEXIST;
}

/* torchrun's layout (torch-compat §4.4): <base>/<run_id>_<8 chars>/. */
static int make_log_dirs(struct crun_agent *a)
{
	char prefix[300];

	if (log_to_null(a))
		return 0;
	if (a->cfg.log_dir && *a->cfg.log_dir) {
		struct stat st;

		/* torchrun's words ("log_dir: PATH is a file"): mkdir's ENOTDIR
		 * alone does not say which path is wrong. */
		if (stat(a->cfg.log_dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
			snprintf(a->err, sizeof(a->err), "log_dir: %s is a file", a->cfg.log_dir);
			return CRUN_EINVAL;
		}
		TRY(str_printf(a->log_base, sizeof(a->log_base), "%s", a->cfg.log_dir));
		TRY(logs_mkdirs(a->log_base));
	} else {
		const char *tmp = getenv("TMPDIR");

		TRY(make_temp_dir(tmp && *tmp ? tmp : "/tmp", "torchelastic_", a->log_base,
				  sizeof(a->log_base)));
	}
	TRY(str_printf(prefix, sizeof(prefix), "%s_", a->run_id));
	return make_temp_dir(a->log_base, prefix, a->run_dir, sizeof(a->run_dir));
}

static void clear_store(void *arg)
{
	struct crun_agent *a = arg;

	if (a->store)
		store_server_clear(a->store);
}

static void on_rdzv_event(enum rdzv_event ev, void *arg)
{
	static const enum agent_event map[] = {
	    [RDZV_EV_COMPLETE] = AE_RDZV_COMPLETE,    [RDZV_EV_FAILED] = AE_RDZV_FAILED,
	    [RDZV_EV_PEER_CHANGED] = AE_PEER_CHANGED, [RDZV_EV_BARRIER_DONE] = AE_BARRIER_DONE,
	    [RDZV_EV_SPARE_DONE] = AE_SPARE_DONE,
	};

	agent_fire(arg, map[ev]);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	agent_fire(arg, AE_WORKER_EXIT);
}

static void on_linger(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	agent_fire(arg, AE_BARRIER_DONE);
}

static int serve_store(struct crun_agent *a)
{
	struct store_server_config sc = STORE_SERVER_CONFIG_DEFAULT;
	const char *host;
	uint16_t port;
	int r;

	if (!rdzv_store_to_serve(a->rdzv, &host, &port))
		return 0;
	sc.host = host;
	sc.port = port;
	r = store_server_new(a->base, &sc, &a->store);
	if (r < 0) {
		snprintf(a->err, sizeof(a->err), "cannot serve the agent store on %s:%u: %s", host,
			 port, crun_strerror(r));
		log_at(LL_ERROR, SUB_AGENT, "%s", a->err);
		return r;
	}
	rdzv_set_served_port(a->rdzv, store_server_port(a->store));
	log_at(LL_INFO, SUB_AGENT, "serving the worker store on %s:%u", host,
	       store_server_port(a->store));
	return 0;
}

/* --run-path (API callers): errfile_runpy_src in a fresh interpreter, as
 * torchrun's run_script_path under @record in its spawned worker. */
static int prepare_program(struct crun_agent *a)
{
	char py[PATH_MAX];
	const char *pre[4] = {env_python(a->envp_base, py, sizeof(py)), "-u", "-c",
			      errfile_runpy_src};
	size_t n = 0;
	char **argv;

	if (!a->cfg.run_path)
		return 0;
	while (a->argv[n])
		n++;
	argv = calloc(n + 5, sizeof(char *));
	if (!argv)
		return CRUN_ENOMEM;
	for (size_t i = 0; i < 4; i++)
		if (!(argv[i] = str_dup(pre[i]))) {
			env_free(argv);
			return CRUN_ENOMEM;
		}
	memcpy(argv + 4, a->argv, (n + 1) * sizeof(char *));
	free(a->argv); /* its strings moved to argv */
	a->argv = argv;
	return 0;
}

/* torchrun's --virtual-local-rank: rank i sees the i-th inherited device. */
static int check_visible_devices(struct crun_agent *a)
{
	const char *name = env_get(a->envp_base, "HIP_VISIBLE_DEVICES") ? "HIP_VISIBLE_DEVICES"
									: "CUDA_VISIBLE_DEVICES";
	const char *v = env_get(a->envp_base, name);
	int n = 1;

	if (!a->cfg.virtual_local_rank || !v || !*v)
		return 0;
	for (const char *p = v; *p; p++)
		n += *p == ',';
	if (n >= a->wk.nworkers)
		return 0;
	snprintf(a->err, sizeof(a->err),
		 "--virtual-local-rank: %d workers but %s=%s names only %d devices", a->wk.nworkers,
		 name, v, n);
	return CRUN_EINVAL;
}

static int prepare_numa(struct crun_agent *a)
{
	const char *mode = a->cfg.numa_binding;
	int r;

	if (!mode || !*mode)
		return 0;
	r = numa_cpus_for_gpus(env_get(a->envp_base, "CRUN_SYSFS_ROOT"), mode, a->wk.nworkers,
			       &a->numa_cpus);
	if (r == CRUN_ENOENT)
		snprintf(a->err, sizeof(a->err),
			 "--numa-binding=%s binds each worker to the cpus of its GPU, but this "
			 "machine has fewer NVIDIA GPUs than the %d workers (read from "
			 "/sys/bus/pci/drivers/nvidia)",
			 mode, a->wk.nworkers);
	else if (r < 0)
		snprintf(a->err, sizeof(a->err), "--numa-binding=%s: %s", mode, crun_strerror(r));
	for (int i = 0; r == 0 && i < a->wk.nworkers; i++)
		log_at(LL_INFO, SUB_AGENT, "numa binding: local rank %d on cpus %s", i,
		       a->numa_cpus[i]);
	return r;
}

/* The agent hosts job-wide stores: raise the soft fd limit to the hard one
 * (as crun-rdzvd does); the workers get the original back (spawn.c). */
static void raise_nofile(struct crun_agent *a)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &a->nofile_orig) < 0)
		return;
	rl = a->nofile_orig;
	if (rl.rlim_cur >= rl.rlim_max)
		return;
	rl.rlim_cur = rl.rlim_max;
	if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot raise RLIMIT_NOFILE: %s, ignoring",
		       strerror(errno));
}

/* Copies a string field: the caller may free its config after new(). */
static int own_str(struct crun_agent *a, const char **field)
{
	char *d;

	if (!*field)
		return 0;
	if (a->nowned >= (int)ARRAY_SIZE(a->owned) || !(d = str_dup(*field)))
		return CRUN_ENOMEM;
	a->owned[a->nowned++] = d;
	*field = d;
	return 0;
}

static int own_mem(struct crun_agent *a, const void **field, size_t len)
{
	void *d;

	if (!*field)
		return 0;
	if (a->nowned >= (int)ARRAY_SIZE(a->owned) || !(d = malloc(len)))
		return CRUN_ENOMEM;
	memcpy(d, *field, len);
	a->owned[a->nowned++] = d;
	*field = d;
	return 0;
}

/* Everything cfg points at that the agent reads after new() returns. */
static int own_config(struct crun_agent *a)
{
	crun_agent_config_t *c = &a->cfg;
	const char **strs[] = {
	    &c->rdzv_backend,
	    &c->rdzv_id,
	    &c->master_addr,
	    &c->local_addr,
	    &c->role,
	    &c->entrypoint,
	    &c->log_dir,
	    &c->line_prefix_template,
	    &c->rdzv_conf,
	    &c->duplicate_stdout_filters,
	    &c->duplicate_stderr_filters,
	    &c->numa_binding,
	    &c->auth_secret_file,
	    &c->event_log_handler,
	};
	size_t n = (size_t)c->nproc_per_node;

	for (size_t i = 0; i < ARRAY_SIZE(strs); i++)
		TRY(own_str(a, strs[i]));
	TRY(own_mem(a, (const void **)&c->redirects, n * sizeof(int)));
	TRY(own_mem(a, (const void **)&c->tee, n * sizeof(int)));
	TRY(own_mem(a, (const void **)&c->console_ranks, n));
	return 0;
}

static int copy_config(struct crun_agent *a, const crun_agent_config_t *cfg)
{
	size_t n = 0;

	/* Fields past the caller's struct_size keep their zero (default). */
	memcpy(&a->cfg, cfg, MIN(cfg->struct_size, sizeof(a->cfg)));
	if (a->cfg.nproc_per_node < 1 || a->cfg.nproc_per_node > CRUN_AGENT_MAX_LOCAL ||
	    !a->cfg.argv || !a->cfg.argv[0] || a->cfg.max_restarts < 0) {
		snprintf(a->err, sizeof(a->err), "invalid agent configuration");
		return CRUN_EINVAL;
	}
	TRY(str_printf(a->role, sizeof(a->role), "%s", cfg->role ? cfg->role : "default"));
	if (cfg->rdzv_id && *cfg->rdzv_id)
		TRY(str_printf(a->run_id, sizeof(a->run_id), "%s", cfg->rdzv_id));
	else if (cfg->standalone)
		make_uuid4(a->run_id, sizeof(a->run_id));
	else
		TRY(str_printf(a->run_id, sizeof(a->run_id), "none"));
	a->cfg.settings = NULL; /* the caller's */
	TRY(own_config(a));
	while (cfg->argv[n])
		n++;
	a->argv = calloc(n + 1, sizeof(char *));
	if (!a->argv)
		return CRUN_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		a->argv[i] = str_dup(cfg->argv[i]);
		if (!a->argv[i])
			return CRUN_ENOMEM;
	}
	a->cfg.argv = NULL; /* use a->argv from here on */
	return 0;
}

/* cfg.worker_env: "NAME=VALUE" entries over the copied environment. */
static int add_worker_env(struct crun_agent *a)
{
	const char *const *kv = a->cfg.worker_env;
	size_t n = 0, extra = 0;
	char **env;

	if (!kv)
		return 0;
	while (a->envp_base[n])
		n++;
	while (kv[extra])
		extra++;
	env = realloc(a->envp_base, (n + extra + 1) * sizeof(char *));
	if (!env)
		return CRUN_ENOMEM;
	a->envp_base = env;
	for (size_t k = 0; k < extra; k++) {
		const char *eq = strchr(kv[k], '=');
		size_t i, len = eq ? (size_t)(eq - kv[k]) + 1 : 0;
		char *dup;

		if (!eq || len == 1) {
			snprintf(a->err, sizeof(a->err), "worker_env: '%s' is not NAME=VALUE",
				 kv[k]);
			return CRUN_EINVAL;
		}
		dup = str_dup(kv[k]);
		if (!dup)
			return CRUN_ENOMEM;
		for (i = 0; i < n && strncmp(env[i], kv[k], len) != 0; i++)
			;
		if (i < n)
			free(env[i]);
		else
			n++;
		env[i] = dup;
		env[n] = NULL;
	}
	a->cfg.worker_env = NULL; /* borrowed only until new() returns */
	return 0;
}

/* cfg.status_listen: libcrun serves the page itself, subscribed to the
 * agent's events as crun's programs subscribe through on_event. */
static int start_status(struct crun_agent *a)
{
	const char *listen = a->cfg.status_listen;
	struct status_source src;
	int r;

	a->cfg.status_listen = NULL; /* borrowed only until new() returns */
	if (!listen || !*listen || strcmp(listen, "off") == 0)
		return 0;
	r = status_page_start(a->base, listen, &a->status_page);
	if (r < 0) {
		snprintf(a->err, sizeof(a->err), "status page on '%s': %s", listen,
			 crun_strerror(r));
		return r;
	}
	agent_status_source(a, &src);
	status_page_attach(a->status_page, &src);
	a->listener = status_page_on_event;
	a->listener_arg = a->status_page;
	log_at(LL_INFO, SUB_AGENT, "status page on http://%s/status",
	       status_page_addr(a->status_page));
	return 0;
}

/* The node's names (${hostname}: up to the first dot) and
 * TORCHELASTIC_SIGNALS_TO_HANDLE's list. */
static void name_node(struct crun_agent *a)
{
	uint64_t m = a->cfg.signals_to_handle;
	size_t o = 0;

	if (gethostname(a->host, sizeof(a->host) - 1) < 0)
		snprintf(a->host, sizeof(a->host), "localhost");
	snprintf(a->short_host, sizeof(a->short_host), "%.*s", (int)strcspn(a->host, "."), a->host);
	if (!m)
		m = 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
	for (int s = 1; s < 64; s++)
		if (m & (1ull << s) && o + 16 < sizeof(a->signals_str))
			o += (size_t)snprintf(a->signals_str + o, sizeof(a->signals_str) - o,
					      "%s%s", o ? "," : "", supervise_signame(s));
}

/* What every worker runs: the environment, --run-path's program and the
 * executable (a failed lookup is each worker's exec failure). */
static int prepare_command(struct crun_agent *a)
{
	a->envp_base = env_copy(environ);
	if (!a->envp_base || add_worker_env(a) < 0)
		return CRUN_ENOMEM;
	TRY(prepare_program(a));
	a->exe = spawn_resolve(a->argv[0]);
	if (!a->exe)
		a->exe_errno = errno;
	return 0;
}

static int prepare_log_dirs(struct crun_agent *a)
{
	int r = make_log_dirs(a);

	if (r < 0 && !a->err[0])
		snprintf(a->err, sizeof(a->err), "cannot create the log directory in '%s': %s",
			 a->cfg.log_dir && *a->cfg.log_dir ? a->cfg.log_dir : "$TMPDIR",
			 crun_strerror(r));
	return r;
}

/* The loop: the caller's, or one of our own. */
static int use_base(struct crun_agent *a, struct event_base *caller)
{
	if (caller) {
		a->base = caller;
		return 0;
	}
	a->base = event_base_new();
	a->own_base = true;
	return a->base ? 0 : CRUN_ENOMEM;
}

/* Worker output: its config points at the agent's own copies. */
static int start_outputs(struct crun_agent *a)
{
	const struct outputs_config oc = {
	    .base = a->base,
	    .nworkers = a->wk.nworkers,
	    .redirects = a->cfg.redirects,
	    .tee = a->cfg.tee,
	    .console_ranks = a->cfg.console_ranks,
	    .stdout_filters = a->cfg.duplicate_stdout_filters,
	    .stderr_filters = a->cfg.duplicate_stderr_filters,
	    .line_prefix_template = a->cfg.line_prefix_template,
	    .role = a->role,
	    .host = a->short_host,
	};
	int r = outputs_new(&oc, &a->out);

	if (r < 0)
		snprintf(a->err, sizeof(a->err), "cannot set up worker output: %s",
			 crun_strerror(r));
	return r;
}

/* The FSM's own timers: the deferred exit of failed execs, the linger. */
static int make_timers(struct crun_agent *a)
{
	a->wk.kick = event_new(a->base, -1, 0, on_kick, a);
	a->linger_timer = evtimer_new(a->base, on_linger, a);
	return a->wk.kick && a->linger_timer ? 0 : CRUN_ENOMEM;
}

static int start_rdzv(struct crun_agent *a)
{
	struct rdzv_params rp = {0};
	struct c10d_conf rconf; /* the typed --rdzv_conf, copied by rdzv_new */
	int r;

	rp.backend = a->cfg.rdzv_backend ? a->cfg.rdzv_backend : "static";
	rp.standalone = a->cfg.standalone;
	rp.run_id = a->run_id;
	rp.node_rank = a->cfg.node_rank;
	rp.nnodes = a->cfg.nnodes;
	rp.nproc = a->cfg.nproc_per_node;
	rp.master_addr = a->cfg.master_addr ? a->cfg.master_addr : "127.0.0.1";
	rp.master_port = a->cfg.master_port;
	rp.local_addr = a->cfg.local_addr;
	rp.barrier_timeout_ms = a->cfg.barrier_timeout_ms;
	rp.min_nodes = a->cfg.min_nnodes > 0 ? a->cfg.min_nnodes : a->cfg.nnodes;
	rp.max_nodes = a->cfg.max_nnodes > 0 ? a->cfg.max_nnodes : a->cfg.nnodes;
	if (cli_rdzv_conf_of(&a->cfg, &rconf, a->err, sizeof(a->err)) < 0)
		return CRUN_ECONFIG;
	rp.conf = &rconf;
	rp.auth_secret_file = a->cfg.auth_secret_file;
	rp.hostname = a->host;
	rp.base = a->base;
	rp.on_event = on_rdzv_event;
	rp.arg = a;
	rp.clear_store = clear_store;
	rp.run_blocking = a->cfg.run_blocking;
	rp.run_blocking_arg = a->cfg.run_blocking_arg;
	rp.stacks_answer = stacks_board_answer;
	r = rdzv_new(&rp, &a->rdzv);
	if (r < 0)
		snprintf(a->err, sizeof(a->err), "rendezvous backend '%s': %s", rp.backend,
			 crun_strerror(r));
	return r;
}

/* Each step sets itself up and says what failed in a->err; crun_agent_free
 * undoes a half-built agent. */
CRUN_API int crun_agent_new(const crun_agent_config_t *cfg, crun_agent_t **ret_agent)
{
	struct crun_agent *a;
	int r;

	if (!cfg || !ret_agent || cfg->struct_size < offsetof(crun_agent_config_t, on_state))
		return CRUN_EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return CRUN_ENOMEM;
	a->wk.guard_fd = -1; /* supervise_fini closes one >= 0 */
	a->stop_req_fd[0] = a->stop_req_fd[1] = -1;
	r = copy_config(a, cfg);
	if (r < 0)
		goto fail;
	raise_nofile(a);
	name_node(a);
	r = prepare_command(a);
	if (r < 0)
		goto fail;
	r = workers_init(&a->wk, a->cfg.nproc_per_node);
	if (r < 0)
		goto fail;
	r = check_visible_devices(a);
	if (r < 0)
		goto fail;
	r = prepare_numa(a);
	if (r < 0)
		goto fail;
	r = prepare_log_dirs(a);
	if (r < 0)
		goto fail;
	r = use_base(a, cfg->event_base);
	if (r < 0)
		goto fail;
	r = start_outputs(a);
	if (r < 0)
		goto fail;
	r = make_timers(a);
	if (r < 0)
		goto fail;
	r = start_rdzv(a);
	if (r < 0)
		goto fail;
	r = supervise_init(a);
	if (r < 0)
		goto fail;
	r = serve_store(a);
	if (r < 0)
		goto fail;
	r = start_status(a);
	if (r < 0)
		goto fail;
	a->state = AS_INIT;
	*ret_agent = a;
	return 0;
fail:
	if (a->err[0])
		log_at(LL_ERROR, SUB_AGENT, "%s", a->err);
	crun_agent_free(a);
	return r < 0 ? r : CRUN_ENOMEM;
}

CRUN_API int crun_agent_run(crun_agent_t *a, int *ret_exit_code)
{
	if (!a || a->state != AS_INIT || a->started)
		return CRUN_EINVAL;
	sigset_t pipe_set, saved;
	int r;

	a->started = true;
	r = supervise_watch_signals(a);
	if (r == 0)
		r = outputs_start_console(a->out, false);
	if (r < 0) {
		snprintf(a->err, sizeof(a->err), "cannot start: %s", crun_strerror(r));
		return r;
	}

	/* A write to a vanished store client or worker pipe must fail with
	 * EPIPE, not kill a host that left SIGPIPE at its default: block it on
	 * this thread for the run and discard what was raised meanwhile. */
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &saved);
	agent_fire(a, AE_START);
	if (a->state != AS_DONE && event_base_dispatch(a->base) < 0)
		r = CRUN_EIO;
	if (!sigismember(&saved, SIGPIPE)) {
		struct timespec zero = {0, 0};
		sigset_t pending;

		while (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) &&
		       sigtimedwait(&pipe_set, NULL, &zero) > 0)
			;
	}
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (r < 0)
		return r;
	if (a->state != AS_DONE) {
		/* The loop ended under us (a borrowed base stopped by its owner):
		 * make sure nothing we started outlives the call. */
		supervise_signal_workers(a, SIGKILL);
		a->exit_code = 1;
	}
	if (ret_exit_code)
		*ret_exit_code = a->exit_code;
	return a->run_error;
}

CRUN_API int crun_agent_stop(crun_agent_t *a, int sig)
{
	unsigned char b;
	ssize_t n;

	if (!a || sig < 0 || sig > 64)
		return CRUN_EINVAL;
	b = (unsigned char)(sig ? sig : SIGTERM);
	do
		n = write(a->stop_req_fd[1], &b, 1);
	while (n < 0 && errno == EINTR);
	return n == 1 ? 0 : -errno;
}

CRUN_API const char *crun_agent_last_error(const crun_agent_t *a)
{
	return a ? a->err : "no agent";
}

CRUN_API void crun_agent_free(crun_agent_t *a)
{
	if (!a)
		return;
	if (a->poll_mode && a->state != AS_DONE && a->wk.workers) {
		/* Freed mid-job: nothing we started may outlive the agent. */
		supervise_signal_workers(a, SIGKILL);
		for (int i = 0; i < a->wk.nworkers; i++)
			if (a->wk.workers[i].state == W_RUNNING)
				while (waitpid(a->wk.workers[i].pid, NULL, 0) < 0 && errno == EINTR)
					;
	}
	for (int i = 0; a->wk.workers && i < a->wk.nworkers; i++)
		supervise_unwatch_pid(&a->wk.workers[i]);
	nodecheck_free(a);    /* kills a check still running */
	agent_end_attempt(a); /* closes every worker's log streams */
	/* The console may take a while to flush: keep the signal events (a
	 * SIGTERM now is only recorded) until it is done. */
	outputs_free(a->out);
	supervise_fini(a);
	numa_free(a->numa_cpus, a->wk.nworkers);
	stacks_free(a);
	rdzv_free(a->rdzv);
	status_page_stop(a->status_page);
	store_server_free(a->store);
	agent_poll_free(a->poll);
	if (a->wk.kick)
		event_free(a->wk.kick);
	if (a->linger_timer)
		event_free(a->linger_timer);
	if (a->own_base && a->base)
		event_base_free(a->base);
	if (a->argv)
		for (int i = 0; a->argv[i]; i++)
			free(a->argv[i]);
	free(a->argv);
	for (int i = 0; i < a->nowned; i++)
		free(a->owned[i]);
	free(a->exe);
	env_free(a->envp_base);
	workers_release(&a->wk);
	failures_release(&a->fail);
	free(a);
}
