/* static_jobs.c: the blocking bodies of the static backend's helper jobs
 * (static_int.h): the nproc exchange and start barrier, the exit barrier,
 * and the coordinated restart of a multi-node job (static.c's file
 * comment). Each runs on a helper thread with its own store connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/static_int.h"

int static_job_fail(struct rdzv_job *j, crun_store_t *s, int r, const char *what)
{
	const char *detail = s ? crun_store_last_error(s) : "";

	/* No dangling separator when the client has no detail to add. */
	snprintf(j->err, sizeof(j->err), "%s: %s%s%s", what, crun_strerror(r),
		 detail && *detail ? " - " : "", detail ? detail : "");
	return r;
}

int static_key(char *buf, size_t cap, const char *what, int v)
{
	return str_printf(buf, cap, "crun/rdzv/%s/%d", what, v);
}

/* torchrun's static rendezvous (elastic/rendezvous/static_tcp_rendezvous.py)
 * and its rank assignment (elastic/agent/server/api.py, _assign_worker_ranks)
 * use other keys under the same PrefixStore(run_id): node N sets
 * torchelastic/role_info/N, node 0 answers torchelastic/assigned_ranks/N, and
 * node 0's TCPStore constructor first waits for every node's raw "init/"
 * check-in. A job with torchrun on one node and crun on another waited for
 * its own launcher's keys until the join timeout on both. So crun checks in
 * as torchrun's clients do, publishes a role_info record of its own after
 * its nproc record, and reads each node's arrival from role_info: a node
 * whose role_info has no nproc beside it runs torchrun. crun's role_info is
 * not torchrun's JSON (no "role"), so a torchrun node 0 fails at once on it
 * (KeyError) instead of waiting; a torchrun node N gets the same in
 * assigned_ranks/N from a crun node 0. Mixed jobs are refused, not run:
 * torchrun does not take part in crun's barrier or coordinated restarts. */
#define MIXED_NOTE "a static job needs the same launcher, crun or torchrun, on every node"

static int role_key(char *buf, size_t cap, const char *what, int v)
{
	return str_printf(buf, cap, "torchelastic/%s/%d", what, v);
}

static int refuse_torchrun_node(struct rdzv_job *j, crun_store_t *s, int node)
{
	char key[128], val[256];

	snprintf(j->err, sizeof(j->err), "node_rank %d runs torchrun, not crun: %s", node,
		 MIXED_NOTE);
	if (j->node_rank == 0 && role_key(key, sizeof(key), "assigned_ranks", node) == 0 &&
	    str_printf(val, sizeof(val), "{\"crun\": \"node_rank 0 runs crun: %s\"}", MIXED_NOTE) ==
		0)
		(void)crun_store_set(s, key, val, strlen(val));
	return CRUN_ECONFIG;
}

/* Waits for node i's arrival and reads its nproc into j->nprocs[i]. */
static int read_node(struct rdzv_job *j, crun_store_t *s, int i)
{
	char key[128], nkey[128];
	const char *keys[1] = {nkey};
	void *v = NULL;
	size_t len;
	uint64_t np;
	int ready = 0, r;

	TRY(role_key(key, sizeof(key), "role_info", i));
	TRY(static_key(nkey, sizeof(nkey), "nproc", i));
	r = crun_store_wait(s, (const char *const[]){key}, 1, j->join_timeout_ms);
	if (r < 0)
		return static_job_fail(j, s, r,
				       r == CRUN_ETIMEDOUT ? "timed out waiting for an agent to "
							     "join (is every --node_rank started?)"
							   : "waiting for an agent to join");
	r = crun_store_check(s, keys, 1, &ready);
	if (r < 0)
		return static_job_fail(j, s, r, "reading an agent's nproc");
	if (!ready)
		return refuse_torchrun_node(j, s, i);
	r = crun_store_get(s, nkey, j->join_timeout_ms, &v, &len);
	if (r < 0)
		return static_job_fail(j, s, r, "reading an agent's nproc");
	r = parse_uint_range(v, 1, 1u << 20, &np);
	crun_free(v);
	if (r < 0)
		return static_job_fail(j, NULL, CRUN_EPROTO, "bad nproc record in the store");
	j->nprocs[i] = (int)np;
	return 0;
}

/* The nproc exchange plus a barrier (see the file comment). */
int static_job_join(struct rdzv_job *j, crun_store_t *s)
{
	char key[128], val[256];
	int64_t n;
	int r;

	TRY(static_key(key, sizeof(key), "claim", j->node_rank));
	r = crun_store_add(s, key, 1, &n);
	if (r < 0)
		return static_job_fail(j, s, r, "claiming the node rank");
	if (n != 1) {
		snprintf(j->err, sizeof(j->err),
			 "another agent already joined run '%s' with --node_rank=%d", j->run_id,
			 j->node_rank);
		return CRUN_ECONFIG;
	}
	r = crun_store_add_raw(s, "init/", 1, &n);
	if (r < 0)
		return static_job_fail(j, s, r, "checking in");
	TRY(static_key(key, sizeof(key), "nproc", j->node_rank));
	TRY(str_printf(val, sizeof(val), "%d", j->nproc));
	r = crun_store_set(s, key, val, strlen(val));
	if (r < 0)
		return static_job_fail(j, s, r, "publishing nproc");
	/* After nproc on the same connection: whoever sees this sees nproc. */
	TRY(role_key(key, sizeof(key), "role_info", j->node_rank));
	TRY(str_printf(val, sizeof(val), "{\"crun\": \"node_rank %d runs crun: %s\"}", j->node_rank,
		       MIXED_NOTE));
	r = crun_store_set(s, key, val, strlen(val));
	if (r < 0)
		return static_job_fail(j, s, r, "publishing the role record");
	for (int i = 0; i < j->nnodes; i++)
		TRY(read_node(j, s, i));
	r = crun_store_add(s, "crun/rdzv/joined", 1, &n);
	if (r < 0)
		return static_job_fail(j, s, r, "joining the start barrier");
	if (n == j->nnodes) {
		r = crun_store_set(s, "crun/rdzv/all_joined", "1", 1);
		if (r < 0)
			return static_job_fail(j, s, r, "closing the start barrier");
	}
	r = crun_store_wait(s, (const char *const[]){"crun/rdzv/all_joined"}, 1,
			    j->join_timeout_ms);
	if (r < 0)
		return static_job_fail(j, s, r, "waiting at the start barrier");
	return 0;
}

/* torchrun's 2.x exit barrier keys, plus a departure count so that node 0,
 * whose agent serves the store, leaves strictly after every other agent read
 * its wake-up. */
int static_job_barrier(struct rdzv_job *j, crun_store_t *s)
{
	const char *num = "torchelastic/agent/terminal_state/num_members";
	const char *last = "torchelastic/agent/terminal_state/last_member";
	char val[32];
	int64_t n;
	int r;

	r = crun_store_add(s, num, 1, &n);
	if (r < 0)
		return static_job_fail(j, s, r, "exit barrier");
	if (n == j->nnodes) {
		TRY(str_printf(val, sizeof(val), "%d", j->node_rank));
		r = crun_store_set(s, last, val, strlen(val));
		if (r < 0)
			return static_job_fail(j, s, r, "exit barrier");
	}
	r = crun_store_wait(s, &last, 1, j->barrier_timeout_ms);
	if (r < 0)
		return static_job_fail(j, s, r, "exit barrier");
	if (j->node_rank != 0) {
		r = crun_store_add(s, "crun/rdzv/departed", 1, &n);
		if (r < 0)
			return static_job_fail(j, s, r, "exit barrier");
		if (n == j->nnodes - 1)
			r = crun_store_set(s, "crun/rdzv/departed_all", "1", 1);
		return r < 0 ? static_job_fail(j, s, r, "exit barrier") : 0;
	}
	r = crun_store_wait(s, (const char *const[]){"crun/rdzv/departed_all"}, 1,
			    j->barrier_timeout_ms);
	return r < 0 ? static_job_fail(j, s, r, "exit barrier (waiting for agents to leave)") : 0;
}

/* Formats "crun/rdzv/<what>/<attempt>". */
static int akey(char *buf, size_t cap, const char *what, int attempt)
{
	return static_key(buf, cap, what, attempt);
}

/* A worker failed here (or a peer's restart woke us): say so, stop, and
 * count this node as stopped; node 0 waits until every node stopped, the
 * others until node 0 cleared its store and let attempt A+1 go. */
int static_job_restart(struct rdzv_job *j, crun_store_t *s)
{
	char key[128], why[64], k2[128];
	int64_t n;
	int r;

	TRY(akey(key, sizeof(key), "restart", j->attempt));
	TRY(str_printf(why, sizeof(why), "restart node %d", j->node_rank));
	r = crun_store_compare_set(s, key, "", 0, why, strlen(why), NULL, NULL);
	if (r < 0)
		return static_job_fail(j, s, r, "announcing the restart");
	TRY(akey(key, sizeof(key), "stopped", j->attempt));
	TRY(akey(k2, sizeof(k2), "all_stopped", j->attempt));
	r = crun_store_add(s, key, 1, &n);
	if (r == 0 && n == j->nnodes)
		r = crun_store_set(s, k2, "1", 1);
	if (r < 0)
		return static_job_fail(j, s, r, "counting the stopped nodes");
	if (j->node_rank == 0) {
		r = crun_store_wait(s, (const char *const[]){k2}, 1, j->join_timeout_ms);
		if (r < 0)
			return static_job_fail(j, s, r,
					       "waiting for every node to stop its workers");
		return 0; /* the loop clears the store, then JOB_GO */
	}
	/* The other nodes wait for "go" alone, which node 0 sets only after
	 * every node stopped: their wait for all_stopped could arrive after
	 * node 0 had cleared it with the rest of the store, and then never end
	 * (1 run in 6 of test_static_multi_node_restart_is_coordinated). */
	TRY(akey(key, sizeof(key), "go", j->attempt + 1));
	r = crun_store_wait(s, (const char *const[]){key}, 1, j->join_timeout_ms);
	return r < 0 ? static_job_fail(j, s, r, "waiting for node 0 to start the next attempt") : 0;
}

/* Node 0, after clearing its store: every node may start attempt A+1. */
int static_job_go(struct rdzv_job *j, crun_store_t *s)
{
	char key[128];
	int r;

	TRY(akey(key, sizeof(key), "go", j->attempt + 1));
	r = crun_store_set(s, key, "1", 1);
	return r < 0 ? static_job_fail(j, s, r, "starting the next attempt") : 0;
}

/* Out of restarts here: every node must stop. A peer's failure (no why):
 * nothing to write. */
int static_job_fail_all(struct rdzv_job *j, crun_store_t *s)
{
	char key[128], val[600];
	int r;

	if (!j->why[0])
		return 0;
	TRY(akey(key, sizeof(key), "restart", j->attempt));
	TRY(str_printf(val, sizeof(val), "failed: %s", j->why));
	r = crun_store_compare_set(s, key, "", 0, val, strlen(val), NULL, NULL);
	return r < 0 ? static_job_fail(j, s, r, "closing the job as failed") : 0;
}

/* Watches "restart/<A>" until the loop drops it; posts once. */
int static_job_monitor(struct rdzv_job *j, crun_store_t *s)
{
	char key[128];
	void *v = NULL;
	size_t len;
	int r = CRUN_ETIMEDOUT;

	TRY(akey(key, sizeof(key), "restart", j->attempt));
	for (int i = 0; i < 1 << 30 && !helper_stopping(&j->h) && r == CRUN_ETIMEDOUT; i++)
		r = crun_store_wait(s, (const char *const[]){key}, 1, RESTART_POLL_MS);
	if (helper_stopping(&j->h))
		return 0;
	if (r == 0)
		r = crun_store_get(s, key, 0, &v, &len);
	if (r < 0) {
		static_job_fail(j, s, r, "lost the agent store on node 0");
		j->change = RDZV_CHANGE_LOST;
	} else {
		snprintf(j->err, sizeof(j->err), "%s", (char *)v);
		j->change = strncmp(v, "failed", 6) == 0 ? RDZV_CHANGE_FAILED : RDZV_CHANGE_RESTART;
		crun_free(v);
	}
	helper_post(&j->h);
	return r;
}
