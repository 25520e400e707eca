/* static.c: the "static" rendezvous backend (and --standalone). Node ranks are
 * given on the command line; node 0's agent serves the store that both the
 * agents and the workers use (torchrun's static backend does the same). The
 * agents exchange their nproc under "<run_id>/crun/rdzv/" so that nodes with
 * different nproc get correct prefix-sum global ranks, then pass a barrier so
 * node 0 never starts (and possibly restarts and clears the store) before
 * every agent has read what it needs. A node's arrival is read from
 * torchrun's own "torchelastic/role_info/<N>" key, so that a node running
 * torchrun is named at once (static_jobs.c).
 *
 * Restarts of a multi-node job are coordinated through the same store, as
 * c10d does: a monitor on every node watches "crun/rdzv/restart/<A>"; the
 * node whose worker failed sets it (first reason wins), every node stops its
 * workers and counts in under "stopped/<A>"; once all stopped, node 0 clears
 * its store (2.x workers use no attempt prefix) and sets "go/<A+1>", and
 * attempt A+1 starts everywhere with the same TORCHELASTIC_RESTART_COUNT. A
 * node out of restarts writes "failed: <why>" there instead, and every node
 * stops and exits 1.
 *
 * Store calls use the blocking client, so they run on helper threads
 * (helper_int.h): the loop (which on node 0 also serves the store) never
 * blocks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "crun/store.h"
#include "rendezvous/c10d.h"
#include "rendezvous/helper_int.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/rdzv_int.h"
#include "rendezvous/static_int.h"

#define RDZV_MAX_NODES 65536

struct rdzv_static {
	struct rdzv base; /* first: the front door's handle (rdzv_int.h) */
	struct rdzv_params p;
	char run_id[256];
	char master_addr[RDZV_HOST_MAX];
	bool serve;
	uint32_t join_ms; /* rdzv_conf join_timeout (c10d.h) */
	uint16_t served_port;
	bool have_info;
	struct rdzv_info info;
	struct event *kick; /* deferred completion for one-node jobs */
	enum rdzv_event kick_ev;
	struct helper job, mon;
	bool multi; /* several nodes: restarts are coordinated */
	int attempt;
	enum rdzv_change change;
	int barrier_result;
	char why[512]; /* for JOB_FAIL */
	char err[512];
};

static void job_release(struct helper_job *h)
{
	struct rdzv_job *j = (struct rdzv_job *)h;

	free(j->nprocs);
	free(j);
}

static int job_run(struct helper_job *h)
{
	struct rdzv_job *j = (struct rdzv_job *)h;
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;
	int r;

	o.host = j->host;
	o.port = j->port;
	o.connect_timeout_ms = j->kind == JOB_JOIN ? j->join_timeout_ms : 30000;
	o.timeout_ms = j->kind == JOB_JOIN || j->kind == JOB_RESTART ? j->join_timeout_ms
								     : j->barrier_timeout_ms;
	o.prefix = j->run_id;
	r = crun_store_open(&o, &s);
	if (r < 0) {
		snprintf(j->err, sizeof(j->err), "cannot reach the agent store at %s:%u: %s",
			 j->host, j->port, crun_strerror(r));
		return r;
	}
	switch (j->kind) {
	case JOB_JOIN:
		r = static_job_join(j, s);
		break;
	case JOB_BARRIER:
		r = static_job_barrier(j, s);
		break;
	case JOB_RESTART:
		r = static_job_restart(j, s);
		break;
	case JOB_GO:
		r = static_job_go(j, s);
		break;
	case JOB_FAIL:
		r = static_job_fail_all(j, s);
		break;
	default:
		r = static_job_monitor(j, s);
		break;
	}
	crun_store_close(s);
	return r;
}

static int start_job(struct rdzv_static *r, enum job_kind kind);

/* A round (the first, or a coordinated restart) is done: workers may start;
 * a multi-node job watches for the next restart from now on. */
static enum rdzv_event round_done(struct rdzv_static *r)
{
	r->info.attempt = r->multi ? r->attempt : -1;
	r->change = RDZV_CHANGE_NONE;
	if (r->multi && start_job(r, JOB_MONITOR) < 0)
		log_at(LL_ERROR, SUB_RDZV, "cannot watch the job for restarts");
	return RDZV_EV_COMPLETE;
}

static void on_job(struct helper *h, void *arg)
{
	struct rdzv_static *r = arg;
	struct rdzv_job *j = (struct rdzv_job *)helper_finish(h);
	enum rdzv_event ev;

	if (!j)
		return;
	if (j->kind == JOB_BARRIER || j->kind == JOB_FAIL) {
		r->barrier_result = j->kind == JOB_BARRIER && j->h.result < 0 ? CRUN_ETIMEDOUT : 0;
		if (j->h.result < 0) {
			snprintf(r->err, sizeof(r->err), "%s", j->err);
			log_at(LL_ERROR, SUB_RDZV, "%s", j->err);
		}
		/* Node 0 waits for every other agent to hang up: ours too. */
		helper_drop(&r->mon);
		ev = RDZV_EV_BARRIER_DONE;
	} else if (j->h.result < 0) {
		snprintf(r->err, sizeof(r->err), "%s", j->err);
		ev = RDZV_EV_FAILED;
	} else if (j->kind == JOB_RESTART && r->p.node_rank == 0) {
		/* Every node stopped its workers: clear, then let them go. */
		if (r->p.clear_store)
			r->p.clear_store(r->p.arg);
		helper_job_put(&j->h);
		if (start_job(r, JOB_GO) < 0) {
			snprintf(r->err, sizeof(r->err), "cannot start the next attempt");
			r->p.on_event(RDZV_EV_FAILED, r->p.arg);
		}
		return;
	} else if (j->kind == JOB_RESTART || j->kind == JOB_GO) {
		r->attempt++;
		ev = round_done(r);
	} else if (rdzv_assign_ranks(j->nprocs, j->nnodes, j->node_rank, &r->info) < 0) {
		snprintf(r->err, sizeof(r->err), "inconsistent nproc records");
		ev = RDZV_EV_FAILED;
	} else {
		snprintf(r->info.master_addr, sizeof(r->info.master_addr), "%s", r->master_addr);
		r->info.master_port = r->p.master_port;
		r->have_info = true;
		ev = round_done(r);
	}
	helper_job_put(&j->h);
	r->p.on_event(ev, r->p.arg);
}

static void on_mon(struct helper *h, void *arg)
{
	struct rdzv_static *r = arg;
	struct rdzv_job *j = (struct rdzv_job *)h->job;

	r->change = j->change;
	snprintf(r->err, sizeof(r->err), "%s", j->err);
	log_at(LL_WARN, SUB_RDZV, "attempt %d is over: %s", r->attempt, j->err);
	r->p.on_event(RDZV_EV_PEER_CHANGED, r->p.arg);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct rdzv_static *r = arg;

	(void)fd;
	(void)what;
	r->p.on_event(r->kick_ev, r->p.arg);
}

static int start_job(struct rdzv_static *r, enum job_kind kind)
{
	struct helper *slot = kind == JOB_MONITOR ? &r->mon : &r->job;
	struct rdzv_job *j;

	if (slot->job)
		return CRUN_EBUSY;
	j = calloc(1, sizeof(*j));
	if (!j)
		return CRUN_ENOMEM;
	j->h.run = job_run;
	j->h.release = job_release;
	j->nprocs = calloc((size_t)r->p.nnodes, sizeof(int));
	if (!j->nprocs) {
		free(j);
		return CRUN_ENOMEM;
	}
	j->kind = kind;
	snprintf(j->host, sizeof(j->host), "%s", r->master_addr);
	j->port = r->p.master_port;
	snprintf(j->run_id, sizeof(j->run_id), "%s", r->run_id);
	j->node_rank = r->p.node_rank;
	j->nnodes = r->p.nnodes;
	j->nproc = r->p.nproc;
	j->join_timeout_ms = r->join_ms;
	j->barrier_timeout_ms = r->p.barrier_timeout_ms;
	j->attempt = r->attempt;
	snprintf(j->why, sizeof(j->why), "%s", r->why);
	return helper_start(slot, &j->h);
}

static struct rdzv_static *st(struct rdzv *r)
{
	return (struct rdzv_static *)r;
}

static const struct rdzv_static *cst(const struct rdzv *r)
{
	return (const struct rdzv_static *)r;
}

static void st_free(struct rdzv *rz)
{
	struct rdzv_static *r = st(rz);

	helper_fini(&r->mon);
	helper_fini(&r->job);
	if (r->kick)
		event_free(r->kick);
	free(r);
}

static int st_new(const struct rdzv_params *p, struct rdzv **ret)
{
	struct helper_runner hr = {p->run_blocking, p->run_blocking_arg};
	struct rdzv_static *r;

	if (p->standalone && p->nnodes != 1)
		return CRUN_ECONFIG;
	if (p->nnodes < 1 || p->nnodes > RDZV_MAX_NODES || p->node_rank < 0 ||
	    p->node_rank >= p->nnodes || !p->conf)
		return CRUN_ECONFIG;
	r = calloc(1, sizeof(*r));
	if (!r)
		return CRUN_ENOMEM;
	r->p = *p;
	r->p.conf = NULL; /* borrowed for the call: what static reads is copied */
	r->join_ms = p->conf->join_ms;
	helper_init(&r->job, p->base, on_job, r);
	helper_init(&r->mon, p->base, on_mon, r);
	helper_use_runner(&r->job, &hr);
	helper_use_runner(&r->mon, &hr);
	r->multi = !p->standalone && p->nnodes > 1;
	snprintf(r->run_id, sizeof(r->run_id), "%s", p->run_id ? p->run_id : "none");
	r->p.run_id = r->run_id;
	if (p->standalone)
		snprintf(r->master_addr, sizeof(r->master_addr), "%s",
			 p->local_addr && *p->local_addr ? p->local_addr : "127.0.0.1");
	else
		snprintf(r->master_addr, sizeof(r->master_addr), "%s", p->master_addr);
	r->serve = p->standalone || p->node_rank == 0;
	r->kick = event_new(p->base, -1, 0, on_kick, r);
	if (!r->kick) {
		st_free(&r->base);
		return CRUN_ENOMEM;
	}
	*ret = &r->base;
	return 0;
}

static int st_store_to_serve(const struct rdzv *rz, const char **ret_host, uint16_t *ret_port)
{
	const struct rdzv_static *r = cst(rz);

	if (!r->serve)
		return 0;
	*ret_host = r->master_addr;
	*ret_port = r->p.standalone ? 0 : r->p.master_port;
	return 1;
}

static void st_set_served_port(struct rdzv *rz, uint16_t port)
{
	struct rdzv_static *r = st(rz);

	r->served_port = port;
	if (r->p.standalone)
		r->p.master_port = port;
}

static int st_next_round(struct rdzv *rz)
{
	struct rdzv_static *r = st(rz);

	/* Static membership never changes: later rounds (restarts) reuse the
	 * first round's answer. Several nodes restart together (file comment). */
	if (r->multi && r->have_info) {
		helper_drop(&r->mon);
		helper_drop(&r->job); /* an exit barrier a peer's restart woke */
		return start_job(r, JOB_RESTART);
	}
	if (r->have_info || r->p.nnodes == 1) {
		if (!r->have_info) {
			int one[1] = {r->p.nproc};

			TRY(rdzv_assign_ranks(one, 1, 0, &r->info));
			snprintf(r->info.master_addr, sizeof(r->info.master_addr), "%s",
				 r->master_addr);
			r->info.master_port = r->p.master_port;
			r->info.attempt = -1;
			r->have_info = true;
		}
		r->kick_ev = RDZV_EV_COMPLETE;
		event_active(r->kick, 0, 0);
		return 0;
	}
	return start_job(r, JOB_JOIN);
}

static bool st_clears_store(const struct rdzv *rz)
{
	return cst(rz)->multi;
}

static const struct rdzv_info *st_info(const struct rdzv *rz)
{
	const struct rdzv_static *r = cst(rz);

	return r->have_info ? &r->info : NULL;
}

static int st_exit_barrier(struct rdzv *rz)
{
	struct rdzv_static *r = st(rz);

	if (r->p.nnodes == 1) {
		r->kick_ev = RDZV_EV_BARRIER_DONE;
		event_active(r->kick, 0, 0);
		return 0;
	}
	return start_job(r, JOB_BARRIER);
}

static int st_barrier_result(const struct rdzv *rz)
{
	return cst(rz)->barrier_result;
}

static const char *st_last_error(const struct rdzv *rz)
{
	return cst(rz)->err;
}

static enum rdzv_change st_change_kind(const struct rdzv *rz)
{
	return cst(rz)->change;
}

static int st_close_failed(struct rdzv *rz, const char *why)
{
	struct rdzv_static *r = st(rz);

	if (!r->multi || !r->have_info || r->change == RDZV_CHANGE_LOST)
		return CRUN_ENOTSUP;
	snprintf(r->why, sizeof(r->why), "%s", why ? why : "");
	helper_drop(&r->job);
	return start_job(r, JOB_FAIL);
}

/* No progress record, peer list, served rendezvous store or proxy: the
 * front door answers those (rdzv_int.h). */
const struct rdzv_backend rdzv_static_backend = {
    .name = "static",
    .create = st_new,
    .free = st_free,
    .store_to_serve = st_store_to_serve,
    .set_served_port = st_set_served_port,
    .next_round = st_next_round,
    .info = st_info,
    .exit_barrier = st_exit_barrier,
    .barrier_result = st_barrier_result,
    .close_failed = st_close_failed,
    .change_kind = st_change_kind,
    .last_error = st_last_error,
    .clears_store = st_clears_store,
};
