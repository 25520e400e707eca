/* fsm.c: the agent as a state table (STYLE §5.6, after s6). Every transition
 * is one action; the restart policy (torchrun's: a failed worker stops every
 * local worker, and the group restarts with TORCHELASTIC_RESTART_COUNT + 1
 * until --max_restarts is spent) lives here and nowhere else. Spawn and reap
 * code know nothing about it.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "agent/nodecheck_int.h"
#include "agent/stacks_int.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "store/server.h"

enum agent_decision agent_decide(int nfailed, int nrunning, int restart_count, int max_restarts)
{
	if (nfailed > 0)
		return restart_count < max_restarts ? DECIDE_RESTART : DECIDE_FAIL;
	return nrunning > 0 ? DECIDE_WAIT : DECIDE_SUCCESS;
}

static enum agent_state finish(struct crun_agent *a, int code)
{
	a->exit_code = code;
	return AS_DONE;
}

static enum agent_state exit_on_signal(struct crun_agent *a);

static enum agent_state open_round(struct crun_agent *a)
{
	int r = rdzv_next_round(a->rdzv);

	if (r < 0) {
		log_at(LL_ERROR, SUB_AGENT, "cannot start the rendezvous: %s", crun_strerror(r));
		a->run_error = r;
		return finish(a, 1);
	}
	return AS_RENDEZVOUS;
}

static enum agent_state on_rdzv_failed(struct crun_agent *a)
{
	log_at(LL_ERROR, SUB_AGENT, "rendezvous failed: %s", rdzv_last_error(a->rdzv));
	snprintf(a->err, sizeof(a->err), "rendezvous failed: %s", rdzv_last_error(a->rdzv));
	/* CRUN_ECONFIG (a spent run id, conflicting settings) tells a service
	 * manager not to restart into the same error (crun-agent exits 2). */
	a->run_error = rdzv_failure(a->rdzv) == CRUN_ECONFIG ? CRUN_ECONFIG : CRUN_ERDZVCLOSED;
	return finish(a, 1);
}

static enum agent_state launch_workers(struct crun_agent *a)
{
	const struct rdzv_info *ri = rdzv_info(a->rdzv);
	int r;

	/* The round's job-wide attempt wins over this node's own count, so a
	 * node that joined late agrees with the others. */
	if (ri && ri->attempt >= 0)
		a->restart_count = ri->attempt;
	r = agent_start_attempt(a);

	if (r < 0) {
		a->run_error = r;
		return finish(a, 1);
	}
	return AS_RUNNING;
}

/* --node_check / --max_node_failures: the check runs between the round and
 * its workers (nodecheck.c). */
static enum agent_state start_workers(struct crun_agent *a)
{
	int r;

	if (!nodecheck_wanted(a))
		return launch_workers(a);
	r = nodecheck_start(a);
	if (r < 0) {
		log_at(LL_ERROR, SUB_AGENT, "%s", a->err);
		a->run_error = r;
		return finish(a, 1);
	}
	return AS_CHECKING;
}

/* Excluded by the node check: exit 2, so a service manager does not start
 * this node into the same job again. */
static enum agent_state leave_job(struct crun_agent *a, const char *why)
{
	log_at(LL_ERROR, SUB_AGENT, "%s", why);
	fprintf(stderr, "crun: error: %s\n", why);
	fflush(stderr);
	snprintf(a->err, sizeof(a->err), "%s", why);
	return finish(a, 2);
}

static enum agent_state check_done(struct crun_agent *a)
{
	char why[1024];

	switch (nodecheck_verdict(a, why, sizeof(why))) {
	case NC_LEAVE:
		return leave_job(a, why);
	case NC_AGAIN:
		log_at(LL_WARN, SUB_AGENT, "%s", why);
		return open_round(a);
	default:
		return launch_workers(a);
	}
}

/* The round changed during the check (a node that read the table opened the
 * next round, or a node died): a node the table excludes still leaves; the
 * others follow the change as from a stop. */
static enum agent_state check_interrupted(struct crun_agent *a)
{
	enum rdzv_change ch = rdzv_change_kind(a->rdzv);
	char why[1024];

	if (ch != RDZV_CHANGE_FAILED && ch != RDZV_CHANGE_LOST && nodecheck_take_table(a) &&
	    nodecheck_verdict(a, why, sizeof(why)) == NC_LEAVE)
		return leave_job(a, why);
	nodecheck_stop(a);
	a->stop_reason = ch == RDZV_CHANGE_FAILED || ch == RDZV_CHANGE_LOST ? STOP_PEER_FAILED
			 : ch == RDZV_CHANGE_RESTART			    ? STOP_RESTART
									    : STOP_PEER;
	return agent_after_stop(a);
}

static enum agent_state check_signalled(struct crun_agent *a)
{
	nodecheck_stop(a);
	return exit_on_signal(a);
}

/* Stops every worker still running; the state after the stop depends on
 * `reason`. With nothing left to stop, the stop is already over. */
static enum agent_state begin_stop(struct crun_agent *a, enum stop_reason reason, int sig)
{
	supervise_disarm_window(a);
	a->stop_reason = reason;
	stacks_before_stop(a, reason); /* the evidence, before the signal */
	/* What the workers left behind (crun adopts it) stops with them. */
	if (orphans_signal(a, SIGTERM) == 0 && workers_running(&a->wk) == 0)
		return agent_after_stop(a);
	supervise_signal_workers(a, sig);
	supervise_arm_grace(a);
	return AS_STOPPING;
}

enum agent_state agent_after_stop(struct crun_agent *a)
{
	supervise_disarm_grace(a);
	switch (a->stop_reason) {
	case STOP_RESTART:
	case STOP_PEER:
		agent_end_attempt(a);
		if (a->stop_reason == STOP_RESTART)
			a->restart_count++;
		log_at(LL_WARN, SUB_AGENT, "restarting workers (attempt %d of %d restarts)",
		       a->restart_count, a->cfg.max_restarts);
		/* 2.x workers use no attempt prefix: start them on an empty store
		 * (a shared static store: the backend clears it once every node
		 * stopped). */
		if (a->store && !rdzv_clears_store(a->rdzv))
			store_server_clear(a->store);
		return open_round(a);
	case STOP_FAILED: {
		char why[768] = "";

		agent_report_failure(a);
		stacks_report(a);
		agent_root_cause_line(a, why, sizeof(why));
		agent_end_attempt(a);
		/* Shared job state (c10d): close the job so every node stops. */
		if (rdzv_close_failed(a->rdzv, why) == 0) {
			a->failing = true;
			return AS_BARRIER;
		}
		return finish(a, 1);
	}
	case STOP_PEER_FAILED: {
		const char *lead = rdzv_change_kind(a->rdzv) == RDZV_CHANGE_LOST
				       ? ""
				       : "the job failed on another node: ";

		agent_end_attempt(a);
		fprintf(stderr, "crun: error: %s%s\n", lead, rdzv_last_error(a->rdzv));
		fflush(stderr);
		snprintf(a->err, sizeof(a->err), "%s%s", lead, rdzv_last_error(a->rdzv));
		if (rdzv_close_failed(a->rdzv, NULL) == 0) {
			a->failing = true;
			return AS_BARRIER;
		}
		return finish(a, 1);
	}
	default:
		agent_end_attempt(a);
		return finish(a, 1);
	}
}

/* torchrun looks at its workers every --monitor-interval and lists each one
 * that failed by then. crun learns of an exit at once, and stopping the
 * others at once would SIGTERM a worker in the middle of failing by itself
 * (two pythons that cannot open a missing script: one failure listed, the
 * other "stopped"). So the stop waits one interval after the first failure;
 * what exits meanwhile is collected as it comes. */
static enum agent_state stop_after_window(struct crun_agent *a, enum stop_reason reason)
{
	if (a->cfg.monitor_interval_ms && !a->window_over && workers_running(&a->wk) > 0) {
		supervise_arm_window(a);
		return AS_RUNNING;
	}
	return begin_stop(a, reason, SIGTERM);
}

static enum agent_state on_worker_exit(struct crun_agent *a)
{
	int nfailed = agent_collect_failures(a);

	switch (
	    agent_decide(nfailed, workers_running(&a->wk), a->restart_count, a->cfg.max_restarts)) {
	case DECIDE_WAIT:
		return AS_RUNNING;
	case DECIDE_SUCCESS:
		agent_end_attempt(a);
		if (rdzv_exit_barrier(a->rdzv) < 0)
			return finish(a, 0);
		return AS_BARRIER;
	case DECIDE_RESTART:
		nodecheck_count_failure(a);
		return stop_after_window(a, STOP_RESTART);
	case DECIDE_FAIL:
	default:
		nodecheck_count_failure(a);
		return stop_after_window(a, STOP_FAILED);
	}
}

/* c10d: the round is over somewhere else. A worker failure on another node
 * counts as a restart here too (TORCHELASTIC_RESTART_COUNT stays equal on
 * every node); a node joining or dying does not. */
static enum agent_state on_peer_changed(struct crun_agent *a)
{
	switch (rdzv_change_kind(a->rdzv)) {
	case RDZV_CHANGE_FAILED:
	case RDZV_CHANGE_LOST:
		return begin_stop(a, STOP_PEER_FAILED, SIGTERM);
	case RDZV_CHANGE_RESTART:
		return begin_stop(a, STOP_RESTART, SIGTERM);
	case RDZV_CHANGE_FENCED:
		/* The others may run our ranks by now: ours stop first, then this
		 * node rejoins (the next round redials the store). */
		log_at(LL_WARN, SUB_AGENT, "%s: stopping workers (fenced)",
		       rdzv_last_error(a->rdzv));
		return begin_stop(a, STOP_PEER, SIGTERM);
	default:
		log_at(LL_WARN, SUB_AGENT, "membership changed: %s; re-rendezvous",
		       rdzv_last_error(a->rdzv));
		return begin_stop(a, STOP_PEER, SIGTERM);
	}
}

/* A peer change while waiting for our own workers' stop is already being
 * handled, except a failure of the job, which must win. */
static enum agent_state peer_changed_while_stopping(struct crun_agent *a)
{
	enum rdzv_change ch = rdzv_change_kind(a->rdzv);

	if ((ch == RDZV_CHANGE_FAILED || ch == RDZV_CHANGE_LOST) && a->stop_reason != STOP_FAILED &&
	    a->stop_reason != STOP_SIGNAL)
		a->stop_reason = STOP_PEER_FAILED;
	if (ch == RDZV_CHANGE_FENCED)
		log_at(LL_WARN, SUB_AGENT, "%s: stopping workers (fenced)",
		       rdzv_last_error(a->rdzv));
	return AS_STOPPING;
}

static enum agent_state spare_done(struct crun_agent *a)
{
	log_at(LL_NOTICE, SUB_AGENT, "the job ended while this node waited as a spare");
	return finish(a, 0);
}

static enum agent_state stop_for_exit(struct crun_agent *a)
{
	log_at(LL_WARN, SUB_AGENT, "Received %d death signal, shutting down workers",
	       a->stop_signal);
	return begin_stop(a, STOP_SIGNAL, a->stop_signal);
}

static enum agent_state after_exit_while_stopping(struct crun_agent *a)
{
	/* A worker that failed on its own while the others were being
	 * stopped is a failure too (torchrun lists every failed rank). */
	(void)agent_collect_failures(a);
	if (workers_running(&a->wk) > 0 || orphans_alive(a) > 0)
		return AS_STOPPING;
	return agent_after_stop(a);
}

static enum agent_state kill_all(struct crun_agent *a)
{
	log_at(LL_WARN, SUB_AGENT, "workers did not stop within %u ms, forcefully exiting via %d",
	       a->cfg.shutdown_timeout_ms, SIGKILL);
	supervise_signal_workers(a, SIGKILL);
	(void)orphans_signal(a, SIGKILL);
	return AS_STOPPING;
}

/* A signal while stopping: the operator wants out now (second Ctrl-C). */
static enum agent_state signal_while_stopping(struct crun_agent *a)
{
	if (a->stop_reason != STOP_FAILED)
		a->stop_reason = STOP_SIGNAL;
	return kill_all(a);
}

static enum agent_state exit_on_signal(struct crun_agent *a)
{
	log_at(LL_WARN, SUB_AGENT, "Received %d death signal, exiting", a->stop_signal);
	return finish(a, 1);
}

/* The node serving the store leaves last: after the barrier it lingers
 * (bounded) until every other agent has closed its store connection. */
static enum agent_state barrier_done(struct crun_agent *a)
{
	struct store_server_stats st;

	if (a->failing)
		return finish(a, 1);
	if (rdzv_barrier_result(a->rdzv) < 0) {
		/* A peer failed or never finished: this job did not succeed. */
		fprintf(stderr, "crun: error: %s\n", rdzv_last_error(a->rdzv));
		fflush(stderr);
		snprintf(a->err, sizeof(a->err), "%s", rdzv_last_error(a->rdzv));
		return finish(a, 1);
	}
	/* Static: node 0's store is the agents' one; c10d/etcd linger in the backend. */
	if (a->store && a->cfg.nnodes > 1 &&
	    (!a->cfg.rdzv_backend || strcmp(a->cfg.rdzv_backend, "static") == 0)) {
		store_server_get_stats(a->store, &st);
		if (!a->linger_until_ms)
			a->linger_until_ms = clock_now_ms() + AGENT_LINGER_MS;
		if (st.conns > 0 && clock_now_ms() < a->linger_until_ms) {
			struct timeval tv = {0, 10000};

			evtimer_add(a->linger_timer, &tv);
			return AS_BARRIER;
		}
	}
	return finish(a, 0);
}

/* c10d: a peer restarted (or the membership changed) while this node waited
 * in the exit barrier: the nodes restart together. A failure ends the
 * barrier itself; a lost store ends the job here. */
static enum agent_state barrier_peer_changed(struct crun_agent *a)
{
	if (a->failing)
		return AS_BARRIER;
	switch (rdzv_change_kind(a->rdzv)) {
	case RDZV_CHANGE_RESTART:
		a->stop_reason = STOP_RESTART;
		return agent_after_stop(a);
	case RDZV_CHANGE_MEMBERSHIP:
		a->stop_reason = STOP_PEER;
		return agent_after_stop(a);
	case RDZV_CHANGE_LOST:
		a->stop_reason = STOP_PEER_FAILED;
		return agent_after_stop(a);
	default:
		return AS_BARRIER;
	}
}

const agent_action agent_fsm[AS__MAX][AE__MAX] = {
    [AS_INIT] = {[AE_START] = open_round, [AE_TERM_SIGNAL] = exit_on_signal},
    [AS_RENDEZVOUS] = {[AE_RDZV_COMPLETE] = start_workers,
		       [AE_RDZV_FAILED] = on_rdzv_failed,
		       [AE_SPARE_DONE] = spare_done,
		       [AE_TERM_SIGNAL] = exit_on_signal},
    [AS_RUNNING] = {[AE_WORKER_EXIT] = on_worker_exit,
		    [AE_FAILURE_WINDOW] = on_worker_exit,
		    [AE_PEER_CHANGED] = on_peer_changed,
		    [AE_TERM_SIGNAL] = stop_for_exit},
    [AS_STOPPING] = {[AE_WORKER_EXIT] = after_exit_while_stopping,
		     [AE_GRACE_EXPIRED] = kill_all,
		     [AE_PEER_CHANGED] = peer_changed_while_stopping,
		     [AE_TERM_SIGNAL] = signal_while_stopping},
    [AS_BARRIER] = {[AE_BARRIER_DONE] = barrier_done,
		    [AE_PEER_CHANGED] = barrier_peer_changed,
		    [AE_TERM_SIGNAL] = exit_on_signal},
    [AS_CHECKING] = {[AE_CHECK_DONE] = check_done,
		     [AE_PEER_CHANGED] = check_interrupted,
		     [AE_TERM_SIGNAL] = check_signalled},
};

crun_agent_state_t agent_public_state(enum agent_state s)
{
	switch (s) {
	case AS_RUNNING:
		return CRUN_AGENT_RUNNING;
	case AS_STOPPING:
		return CRUN_AGENT_STOPPING;
	case AS_BARRIER:
		return CRUN_AGENT_BARRIER;
	case AS_DONE:
		return CRUN_AGENT_DONE;
	default:
		return CRUN_AGENT_RENDEZVOUS;
	}
}

void agent_fire(struct crun_agent *a, enum agent_event ev)
{
	agent_action act = agent_fsm[a->state][ev];
	enum agent_state next;

	if (!act) {
		log_at(LL_DEBUG, SUB_AGENT, "ignoring %s while %s", agent_event_name(ev),
		       agent_state_name(a->state));
		return;
	}
	next = act(a);
	log_at(LL_INFO, SUB_AGENT, "%s --%s--> %s", agent_state_name(a->state),
	       agent_event_name(ev), agent_state_name(next));
	if (next != a->state && a->cfg.on_state)
		a->cfg.on_state(agent_public_state(next), a->restart_count, a->cfg.on_state_arg);
	if (next != a->state)
		agent_emit_state(a, agent_public_state(next));
	a->state = next;
	if (next == AS_DONE)
		event_base_loopexit(a->base, NULL);
}
