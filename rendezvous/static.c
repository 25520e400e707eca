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
#include "rendezvous/etcd_int.h"
#include "rendezvous/helper_int.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/static_int.h"

#define RDZV_MAX_NODES 65536

struct rdzv {
	struct c10d *c10d; /* the c10d backend, when chosen: every call goes there */
	struct rdzv_params p;
	char run_id[256];
	char master_addr[RDZV_HOST_MAX];
	bool serve;
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

int rdzv_assign_ranks(const int *nprocs, int nnodes, int me, struct rdzv_info *ret)
{
	int64_t base = 0, total = 0;

	if (!nprocs || nnodes < 1 || me < 0 || me >= nnodes)
		return CRUN_EINVAL;
	for (int i = 0; i < nnodes; i++) {
		if (nprocs[i] < 1)
			return CRUN_EINVAL;
		if (i < me)
			base += nprocs[i];
		total += nprocs[i];
	}
	if (total > INT32_MAX)
		return CRUN_ERANGE;
	ret->group_rank = me;
	ret->group_world_size = nnodes;
	ret->base_rank = (int)base;
	ret->world_size = (int)total;
	/* One role per job (as torchrun's launcher), so role ranks equal ranks. */
	ret->role_base_rank = (int)base;
	ret->role_world_size = (int)total;
	return 0;
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

static int start_job(struct rdzv *r, enum job_kind kind);

/* A round (the first, or a coordinated restart) is done: workers may start;
 * a multi-node job watches for the next restart from now on. */
static enum rdzv_event round_done(struct rdzv *r)
{
	r->info.attempt = r->multi ? r->attempt : -1;
	r->change = RDZV_CHANGE_NONE;
	if (r->multi && start_job(r, JOB_MONITOR) < 0)
		log_at(LL_ERROR, SUB_RDZV, "cannot watch the job for restarts");
	return RDZV_EV_COMPLETE;
}

static void on_job(struct helper *h, void *arg)
{
	struct rdzv *r = arg;
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
	struct rdzv *r = arg;
	struct rdzv_job *j = (struct rdzv_job *)h->job;

	r->change = j->change;
	snprintf(r->err, sizeof(r->err), "%s", j->err);
	log_at(LL_WARN, SUB_RDZV, "attempt %d is over: %s", r->attempt, j->err);
	r->p.on_event(RDZV_EV_PEER_CHANGED, r->p.arg);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct rdzv *r = arg;

	(void)fd;
	(void)what;
	r->p.on_event(r->kick_ev, r->p.arg);
}

static int start_job(struct rdzv *r, enum job_kind kind)
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
	j->join_timeout_ms = r->p.join_timeout_ms;
	j->barrier_timeout_ms = r->p.barrier_timeout_ms;
	j->attempt = r->attempt;
	snprintf(j->why, sizeof(j->why), "%s", r->why);
	return helper_start(slot, &j->h);
}

int rdzv_new(const struct rdzv_params *p, struct rdzv **ret_rdzv)
{
	struct rdzv *r;

	if (!p->base || !p->on_event || p->nproc < 1)
		return CRUN_EINVAL;
	if ((strcmp(p->backend, "c10d") == 0 || strcmp(p->backend, "etcd") == 0) &&
	    !p->standalone) {
		struct c10d *c;

		TRY(c10d_new(p, &c));
		r = calloc(1, sizeof(*r));
		if (!r) {
			c10d_free(c);
			return CRUN_ENOMEM;
		}
		r->c10d = c;
		*ret_rdzv = r;
		return 0;
	}
	if (strcmp(p->backend, "static") != 0 && !p->standalone)
		return CRUN_ENOTSUP;
	if (p->standalone && p->nnodes != 1)
		return CRUN_ECONFIG;
	if (p->nnodes < 1 || p->nnodes > RDZV_MAX_NODES || p->node_rank < 0 ||
	    p->node_rank >= p->nnodes)
		return CRUN_ECONFIG;
	r = calloc(1, sizeof(*r));
	if (!r)
		return CRUN_ENOMEM;
	r->p = *p;
	helper_init(&r->job, p->base, on_job, r);
	helper_init(&r->mon, p->base, on_mon, r);
	{
		struct helper_runner hr = {p->run_blocking, p->run_blocking_arg};

		helper_use_runner(&r->job, &hr);
		helper_use_runner(&r->mon, &hr);
	}
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
		free(r);
		return CRUN_ENOMEM;
	}
	*ret_rdzv = r;
	return 0;
}

int rdzv_store_to_serve(const struct rdzv *r, const char **ret_host, uint16_t *ret_port)
{
	if (r->c10d)
		return c10d_store_to_serve(r->c10d, ret_host, ret_port);
	if (!r->serve)
		return 0;
	*ret_host = r->master_addr;
	*ret_port = r->p.standalone ? 0 : r->p.master_port;
	return 1;
}

void rdzv_set_served_port(struct rdzv *r, uint16_t port)
{
	if (r->c10d) {
		c10d_set_served_port(r->c10d, port);
		return;
	}
	r->served_port = port;
	if (r->p.standalone)
		r->p.master_port = port;
}

int rdzv_next_round(struct rdzv *r)
{
	if (r->c10d)
		return c10d_next_round(r->c10d);
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

bool rdzv_clears_store(const struct rdzv *r)
{
	return !r->c10d && r->multi;
}

const struct rdzv_info *rdzv_info(const struct rdzv *r)
{
	if (r->c10d)
		return c10d_info(r->c10d);
	return r->have_info ? &r->info : NULL;
}

void rdzv_get_progress(const struct rdzv *r, struct rdzv_progress *ret)
{
	if (r->c10d) {
		c10d_get_progress(r->c10d, ret);
		return;
	}
	memset(ret, 0, sizeof(*ret));
	ret->round = ret->last_call_s = ret->timeout_s = ret->nawait = -1;
}

const char *rdzv_peer_addrs(const struct rdzv *r)
{
	return r->c10d ? c10d_peer_addrs(r->c10d) : NULL;
}

const struct store_server *rdzv_served_store(const struct rdzv *r)
{
	return r->c10d ? c10d_served_store(r->c10d) : NULL;
}

bool rdzv_worker_store_proxy(const struct rdzv *r)
{
	return r->c10d && c10d_worker_store_proxy(r->c10d);
}

int rdzv_exit_barrier(struct rdzv *r)
{
	if (r->c10d)
		return c10d_exit_barrier(r->c10d);
	if (r->p.nnodes == 1) {
		r->kick_ev = RDZV_EV_BARRIER_DONE;
		event_active(r->kick, 0, 0);
		return 0;
	}
	return start_job(r, JOB_BARRIER);
}

int rdzv_barrier_result(const struct rdzv *r)
{
	return r->c10d ? c10d_barrier_result(r->c10d) : r->barrier_result;
}

const char *rdzv_last_error(const struct rdzv *r)
{
	return r->c10d ? c10d_last_error(r->c10d) : r->err;
}

int rdzv_failure(const struct rdzv *r)
{
	return r->c10d ? c10d_failure(r->c10d) : CRUN_ERDZVCLOSED;
}

enum rdzv_change rdzv_change_kind(const struct rdzv *r)
{
	return r->c10d ? c10d_change_kind(r->c10d) : r->change;
}

int rdzv_close_failed(struct rdzv *r, const char *why)
{
	if (r->c10d)
		return c10d_close_failed(r->c10d, why);
	if (!r->multi || !r->have_info || r->change == RDZV_CHANGE_LOST)
		return CRUN_ENOTSUP;
	snprintf(r->why, sizeof(r->why), "%s", why ? why : "");
	helper_drop(&r->job);
	return start_job(r, JOB_FAIL);
}

int rdzv_conf_check(const char *backend, const char *conf, char *err, size_t cap)
{
	struct c10d_conf c;
	struct etcd_conf e = {0};
	char rest[1024];

	if (strcmp(backend, "etcd") == 0) {
		TRY(etcd_parse_conf(conf, &e, rest, sizeof(rest), err, cap));
		return c10d_parse_conf(rest, &c, err, cap);
	}
	if (strcmp(backend, "c10d") != 0)
		return CRUN_ENOTSUP;
	return c10d_parse_conf(conf, &c, err, cap);
}

int rdzv_endpoint_check(const char *backend, const char *endpoint, char *err, size_t cap)
{
	struct etcd_conf e = {0};

	if (strcmp(backend, "etcd") != 0)
		return CRUN_ENOTSUP;
	return etcd_parse_endpoints(endpoint, &e, err, cap);
}

void rdzv_free(struct rdzv *r)
{
	if (!r)
		return;
	c10d_free(r->c10d);
	if (!r->c10d) {
		helper_fini(&r->mon);
		helper_fini(&r->job);
	}
	if (r->kick)
		event_free(r->kick);
	free(r);
}
