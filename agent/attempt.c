/* attempt.c: one attempt of the agent: the events its caller sees
 * (cfg.on_event), the spawn of every local worker with its environment and
 * output, the worker store's proxy, and the attempt's end with the failures
 * it collected (failures.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "agent/env.h"
#include "agent/event_print.h"
#include "agent/numa.h"
#include "agent/stacks_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "store/proxy.h"
#include "store/server.h"

/* ---- events ----------------------------------------------------------------- */

static void event_init(struct crun_agent *a, crun_agent_event_t *ev, crun_agent_event_type_t type)
{
	memset(ev, 0, sizeof(*ev));
	ev->struct_size = sizeof(*ev);
	ev->type = type;
	ev->state = agent_public_state(a->state);
	ev->restart_count = a->restart_count;
	ev->group_rank = ev->group_world_size = ev->base_rank = -1;
	ev->pid = ev->local_rank = ev->global_rank = -1;
}

/* To the agent's own listener (the status page), then the caller's. */
static void emit(struct crun_agent *a, const crun_agent_event_t *ev)
{
	if (a->listener)
		a->listener(ev, a->listener_arg);
	if (a->cfg.on_event)
		a->cfg.on_event(ev, a->cfg.on_event_arg);
}

void agent_emit_state(struct crun_agent *a, crun_agent_state_t st)
{
	crun_agent_event_t ev;

	if (a->cfg.event_log_handler && strcmp(a->cfg.event_log_handler, "console") == 0)
		agent_event_print(stderr, st, a->restart_count, a->role);
	event_init(a, &ev, CRUN_AGENT_EV_STATE);
	ev.state = st;
	emit(a, &ev);
}

static void emit_rendezvous(struct crun_agent *a, const struct rdzv_info *ri)
{
	crun_agent_event_t ev;

	event_init(a, &ev, CRUN_AGENT_EV_RENDEZVOUS);
	ev.group_rank = ri->group_rank;
	ev.group_world_size = ri->group_world_size;
	ev.world_size = ri->world_size;
	ev.base_rank = ri->base_rank;
	ev.local_world_size = a->wk.nworkers;
	ev.attempt = a->restart_count;
	ev.master_addr = ri->master_addr;
	ev.master_port = ri->master_port;
	emit(a, &ev);
}

void agent_emit_worker(struct crun_agent *a, const struct worker *w, bool exited)
{
	crun_agent_event_t ev;

	event_init(a, &ev, exited ? CRUN_AGENT_EV_WORKER_EXIT : CRUN_AGENT_EV_WORKER_START);
	ev.group_rank = a->group_rank;
	ev.pid = (int)w->pid;
	ev.local_rank = w->local_rank;
	ev.global_rank = w->global_rank;
	if (exited) {
		ev.exit_code = w->exit_code;
		ev.term_sig = w->term_sig;
	}
	emit(a, &ev);
}

/* ---- one attempt ------------------------------------------------------------ */

static int exec_exit_code(int err)
{
	/* Shell convention: found but not runnable is 126, not found 127. */
	return err == EACCES || err == ENOEXEC || err == EISDIR ? 126 : 127;
}

/* cfg.spawn: the caller starts the worker; it must be our child, the one
 * kind of pid the reap path may wait for. */
static int spawn_hooked(struct crun_agent *a, struct worker *w, const struct spawn_req *req)
{
	crun_agent_spawn_req_t hr = {
	    .struct_size = sizeof(hr),
	    .path = req->path ? req->path : req->argv[0],
	    .argv = req->argv,
	    .envp = req->envp,
	    .local_rank = w->local_rank,
	    .global_rank = w->global_rank,
	    .stdout_fd = req->stdout_fd,
	    .stderr_fd = req->stderr_fd,
	};
	siginfo_t si;
	int pid = 0;
	int r;

	r = a->cfg.spawn(&hr, a->cfg.spawn_arg, &pid);
	if (r < 0) {
		log_at(LL_ERROR, SUB_AGENT, "spawn hook failed for worker %d: %s", w->local_rank,
		       crun_strerror(r));
		return r < -4095 ? CRUN_ENOENT : r; /* a crun code: exec-like 127 */
	}
	memset(&si, 0, sizeof(si));
	if (pid <= 0 || waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0) {
		log_at(LL_ERROR, SUB_AGENT,
		       "spawn hook returned pid %d for worker %d, which is not a child of this "
		       "process",
		       pid, w->local_rank);
		return CRUN_ECHILD;
	}
	w->pid = pid;
	return 0;
}

/* Poll mode: without a pidfd the exit would never be seen; do not leave an
 * unwatched worker behind. */
static int watch_or_kill(struct crun_agent *a, struct worker *w)
{
	int r = supervise_watch_pid(a, w);

	if (r == 0)
		return 0;
	log_at(LL_ERROR, SUB_AGENT, "cannot watch worker %d (pid %d): %s", w->local_rank,
	       (int)w->pid, crun_strerror(r));
	(void)kill(w->own_group ? -w->pid : w->pid, SIGKILL);
	while (waitpid(w->pid, NULL, 0) < 0 && errno == EINTR)
		;
	return r == CRUN_ENOMEM ? CRUN_ENOMEM : CRUN_EIO;
}

static int start_one(struct crun_agent *a, struct worker *w, const struct rdzv_info *ri,
		     const char *attempt_dir)
{
	struct env_vars v = {0};
	struct spawn_req req = {0};
	char wdir[PATH_MAX];
	char **envp = NULL, **argv = NULL;
	cpu_set_t cpus;
	int out_fd = -1, err_fd = -1;
	int r;

	w->errfile[0] = '\0';
	if (attempt_dir[0]) {
		TRY(str_printf(wdir, sizeof(wdir), "%s/%d", attempt_dir, w->local_rank));
		TRY(logs_mkdirs(wdir));
		TRY(str_printf(w->errfile, sizeof(w->errfile), "%s/error.json", wdir));
	}
	r = outputs_open_worker(a->out, w->local_rank, w->global_rank, &out_fd, &err_fd);
	if (r < 0)
		goto out;
	v.local_rank = w->local_rank;
	v.rank = w->global_rank;
	v.group_rank = ri->group_rank;
	v.role_rank = ri->role_base_rank + w->local_rank;
	v.role = a->role;
	v.local_world_size = a->wk.nworkers;
	v.world_size = ri->world_size;
	v.group_world_size = ri->group_world_size;
	v.role_world_size = ri->role_world_size;
	v.master_addr = ri->master_addr;
	v.master_port = ri->master_port;
	v.restart_count = a->restart_count;
	v.max_restarts = a->cfg.max_restarts;
	v.run_id = a->run_id;
	v.error_file = w->errfile;
	v.signals = a->signals_str;
	v.virtual_local_rank = a->cfg.virtual_local_rank;
	v.auth_secret_file = a->cfg.auth_secret_file;
	envp = env_build(a->envp_base, &v);
	argv = env_argv_subst(a->argv, w->local_rank);
	r = CRUN_ENOMEM;
	if (!envp || !argv)
		goto out;
	r = heartbeat_prepare(a, w, attempt_dir, &envp); /* CRUN_HEARTBEAT_FILE */
	if (r < 0)
		goto out;
	if (!a->exe && !a->cfg.spawn) {
		r = -a->exe_errno;
	} else { /* a hook may start it elsewhere (a container): its call */
		req.path = a->exe;
		req.argv = argv;
		req.envp = envp;
		req.stdout_fd = out_fd;
		req.stderr_fd = err_fd;
		req.deathsig = SIGKILL;
		req.nofile = a->nofile_orig.rlim_cur ? &a->nofile_orig : NULL;
		if (a->numa_cpus && numa_parse_cpulist(a->numa_cpus[w->local_rank], &cpus) == 0)
			req.cpus = &cpus;
		r = a->cfg.spawn ? spawn_hooked(a, w, &req)
				 : spawn_worker(&req, &a->orig_mask, &w->pid);
		w->own_group = r == 0 && (!a->cfg.spawn || getpgid(w->pid) == w->pid);
	}
	if (r == 0 && a->poll_mode)
		r = watch_or_kill(a, w);
	if (r == 0) {
		w->state = W_RUNNING;
		if (w->own_group)
			supervise_guard_add(a, w->pid);
		log_at(LL_INFO, SUB_AGENT, "worker %d (rank %d) started as pid %d", w->local_rank,
		       w->global_rank, (int)w->pid);
		agent_emit_worker(a, w, false);
	} else if (r != CRUN_ENOMEM) {
		/* Exec failed: report it like a worker that exited 127. */
		w->state = W_EXITED;
		w->pid = 0;
		w->exec_err = -r;
		w->exit_code = exec_exit_code(-r);
		w->exit_time = clock_wall_s();
		agent_emit_worker(a, w, true);
		r = 0;
	}
out:
	outputs_after_spawn(a->out, w->local_rank);
	env_free(envp);
	env_free(argv);
	return r;
}

static void on_proxy_fail(void *arg)
{
	(void)arg;
	log_at(LL_WARN, SUB_AGENT,
	       "the worker store proxy lost group rank 0's store: its workers' connections "
	       "are closed");
}

/* rdzv_conf worker_store=proxy on a node that does not serve the round's
 * worker store: *wri (what the workers are told) names this agent's proxy
 * to it, on the address the agent's own store listens on (the workers are
 * local). A proxy that cannot start leaves the workers on the real store,
 * which is correct, only not fanned in. */
static void route_worker_store(struct crun_agent *a, const struct rdzv_info *ri,
			       struct rdzv_info *wri)
{
	struct store_proxy_config pc = STORE_PROXY_CONFIG_DEFAULT;
	const char *host = NULL;
	uint16_t port = 0;
	int r;

	*wri = *ri;
	store_proxy_free(a->proxy);
	a->proxy = NULL;
	if (!rdzv_worker_store_proxy(a->rdzv) || ri->group_rank == 0)
		return;
	(void)rdzv_store_to_serve(a->rdzv, &host, &port);
	pc.listen_host = host && *host ? host : "127.0.0.1";
	pc.upstream_host = ri->master_addr;
	pc.upstream_port = ri->master_port;
	pc.on_fail = on_proxy_fail;
	pc.arg = a;
	r = store_proxy_new(a->base, &pc, &a->proxy);
	if (r < 0) {
		log_at(LL_WARN, SUB_AGENT,
		       "cannot start the worker store proxy on %s to %s:%u: %s; the workers use "
		       "the store directly",
		       pc.listen_host, ri->master_addr, ri->master_port, crun_strerror(r));
		return;
	}
	snprintf(wri->master_addr, sizeof(wri->master_addr), "%s", pc.listen_host);
	wri->master_port = store_proxy_port(a->proxy);
	log_at(LL_INFO, SUB_AGENT, "worker store proxy on %s:%u to %s:%u", wri->master_addr,
	       wri->master_port, ri->master_addr, ri->master_port);
}

/* The worker store: loopback and this round's nodes only, unless
 * worker_store_allow_any (NAT). PyTorch's client cannot authenticate. */
void agent_allow_round_peers(struct crun_agent *a)
{
	if (a->store && !a->cfg.worker_store_allow_any && rdzv_peer_addrs(a->rdzv) &&
	    store_server_set_allowlist(a->store, rdzv_peer_addrs(a->rdzv)) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot narrow the worker store to '%s', ignoring",
		       rdzv_peer_addrs(a->rdzv));
}

int agent_start_attempt(struct crun_agent *a)
{
	const struct rdzv_info *ri = rdzv_info(a->rdzv);
	struct rdzv_info wri; /* ri as the workers see it (route_worker_store) */
	char attempt_dir[PATH_MAX] = "";
	bool exec_failed = false;
	int r;

	if (!ri)
		return CRUN_EINVAL;
	agent_allow_round_peers(a);
	a->group_rank = ri->group_rank;
	route_worker_store(a, ri, &wri);
	if (a->run_dir[0]) {
		TRY(str_printf(attempt_dir, sizeof(attempt_dir), "%s/attempt_%d", a->run_dir,
			       a->restart_count));
		(void)logs_rmtree(attempt_dir);
		TRY(logs_mkdirs(attempt_dir));
	}
	r = outputs_open_attempt(a->out, attempt_dir, a->group_rank);
	if (r < 0)
		return r;
	emit_rendezvous(a, ri);
	log_at(LL_INFO, SUB_AGENT,
	       "starting %d workers: group_rank=%d group_world_size=%d base_rank=%d "
	       "world_size=%d master=%s:%u restart_count=%d",
	       a->wk.nworkers, ri->group_rank, ri->group_world_size, ri->base_rank, ri->world_size,
	       ri->master_addr, ri->master_port, a->restart_count);
	for (int i = 0; i < a->wk.nworkers; i++) {
		struct worker *w = &a->wk.workers[i];

		supervise_unwatch_pid(w);
		memset(w, 0, sizeof(*w));
		w->pidfd = -1;
		w->local_rank = i;
		w->global_rank = ri->base_rank + i;
		r = start_one(a, w, &wri, attempt_dir);
		if (r < 0) {
			snprintf(a->err, sizeof(a->err), "cannot start worker %d: %s", i,
				 crun_strerror(r));
			log_at(LL_ERROR, SUB_AGENT, "%s", a->err);
			w->state = W_EXITED;
			w->exit_code = 1;
			w->exit_time = clock_wall_s();
		}
		if (w->state == W_EXITED)
			exec_failed = true;
	}
	if (heartbeat_arm(a) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot watch worker heartbeats, ignoring");
	stacks_reset(a);
	if (hang_arm(a, attempt_dir) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot watch for hangs, ignoring");
	if (exec_failed)
		event_active(a->wk.kick, 0, 0);
	return 0;
}

void agent_end_attempt(struct crun_agent *a)
{
	heartbeat_disarm(a);
	hang_disarm(a);
	if (a->proxy) {
		struct store_proxy_stats st;

		store_proxy_get_stats(a->proxy, &st);
		log_at(LL_INFO, SUB_AGENT,
		       "worker store proxy: %llu connections, %llu requests on the shared "
		       "connection, %llu waits of which %llu went upstream",
		       (unsigned long long)st.accepted, (unsigned long long)st.requests,
		       (unsigned long long)st.waits, (unsigned long long)st.upstream_waits);
	}
	store_proxy_free(a->proxy); /* its workers are gone */
	a->proxy = NULL;
	outputs_close_attempt(a->out);
	failures_clear(&a->fail);
}

/* A worker crun stopped is not a failure, unless the stop was for another
 * worker's failure and it ended by itself with an error before our signal
 * could act (torchrun lists every rank that failed by the time it looks). */
static bool counts_as_failure(const struct crun_agent *a, const struct worker *w)
{
	if (!w->stopping)
		return true;
	return (a->stop_reason == STOP_FAILED || a->stop_reason == STOP_RESTART) &&
	       w->term_sig == 0 && w->exit_code != 0;
}

/* What the failure records and the summary name besides the workers. */
static struct failures_ctx failures_ctx_of(struct crun_agent *a)
{
	/* A bare agent (the unit tests') may have no argv. */
	const char *argv0 = a->argv ? a->argv[0] : NULL;

	return (struct failures_ctx){.entrypoint = a->cfg.entrypoint ? a->cfg.entrypoint : argv0,
				     .argv0 = argv0,
				     .host = a->host,
				     .group_rank = a->group_rank,
				     .out = a->out};
}

int agent_collect_failures(struct crun_agent *a)
{
	const struct failures_ctx ctx = failures_ctx_of(a);

	for (int i = 0; i < a->wk.nworkers; i++) {
		struct worker *w = &a->wk.workers[i];

		if (w->state != W_EXITED || w->reported)
			continue;
		w->reported = true;
		if (w->exit_code == 0 || !counts_as_failure(a, w))
			continue;
		(void)failures_add(&a->fail, w, &ctx);
	}
	return a->fail.nfailures;
}

void agent_report_failure(struct crun_agent *a)
{
	const struct failures_ctx ctx = failures_ctx_of(a);

	failures_report(&a->fail, &ctx, env_get(a->envp_base, "TORCHELASTIC_ERROR_FILE"));
}

void agent_root_cause_line(struct crun_agent *a, char *buf, size_t cap)
{
	const struct failures_ctx ctx = failures_ctx_of(a);

	failures_root_cause_line(&a->fail, &ctx, buf, cap);
}
