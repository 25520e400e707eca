/* status.c: the agent's part of its status page (service/status.c serves
 * the page): what /status, /jobs and /metrics show of the job (run id,
 * role, state, restarts, workers, rendezvous, node check), the worker exit
 * codes counted over the agent's life, and GET /stacks' local capture. The
 * page reads the agent only through these callbacks (struct status_source).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "agent/agent.h"
#include "agent/nodecheck_int.h"
#include "agent/stacks_int.h"
#include "agent/status.h"
#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "service/service.h"

#define STATUS_EXIT_CODES 256 /* codes 0..255; anything else counts as 255 */

/* What the callbacks read: the agent, and its exit counters or NULL. */
struct agent_view {
	struct crun_agent *a;
	const uint64_t *exits;
};

struct agent_status {
	struct status_page *page;
	struct agent_view view; /* view.a NULL until attached */
	/* Worker exits by code over the agent's life, counted when an attempt
	 * ends (agent_status_on_state); last is the previous public state. */
	uint64_t exits[STATUS_EXIT_CODES];
	crun_agent_state_t last;
};

static const char *worker_state(const struct worker *w)
{
	return w->state == W_RUNNING ? "running" : w->state == W_EXITED ? "exited" : "init";
}

static void rdzv_json(cJSON *root, const struct crun_agent *a)
{
	struct rdzv_progress *p = malloc(sizeof(*p));

	if (!p)
		return;
	rdzv_get_progress(a->rdzv, p);
	status_progress_json(root, p, a->run_id);
	free(p);
}

/* The job's fields of /status; with version (the live page) that count, and
 * at a change (st >= 0) the state being entered, with the agent's exit code
 * at the end. */
static void src_status_json(void *arg, cJSON *root, const uint64_t *version, int st)
{
	static const enum agent_state internal[] = {[CRUN_AGENT_RENDEZVOUS] = AS_RENDEZVOUS,
						    [CRUN_AGENT_RUNNING] = AS_RUNNING,
						    [CRUN_AGENT_STOPPING] = AS_STOPPING,
						    [CRUN_AGENT_BARRIER] = AS_BARRIER,
						    [CRUN_AGENT_DONE] = AS_DONE};
	const struct crun_agent *a = ((const struct agent_view *)arg)->a;
	cJSON *ws;

	cJSON_AddStringToObject(root, "run_id", a->run_id);
	cJSON_AddStringToObject(root, "role", a->role);
	cJSON_AddStringToObject(root, "host", a->host);
	cJSON_AddStringToObject(root, "state", agent_state_name(a->state));
	cJSON_AddStringToObject(root, "rdzv_backend", a->cfg.rdzv_backend);
	cJSON_AddNumberToObject(root, "restart_count", a->restart_count);
	cJSON_AddNumberToObject(root, "max_restarts", a->cfg.max_restarts);
	cJSON_AddNumberToObject(root, "group_rank", a->group_rank);
	if (a->rdzv &&
	    (a->state == AS_RUNNING || a->state == AS_STOPPING || a->state == AS_BARRIER)) {
		const struct rdzv_info *ri = rdzv_info(a->rdzv);

		cJSON_AddNumberToObject(root, "group_world_size", ri->group_world_size);
		cJSON_AddNumberToObject(root, "world_size", ri->world_size);
		cJSON_AddStringToObject(root, "master_addr", ri->master_addr);
		cJSON_AddNumberToObject(root, "master_port", ri->master_port);
	}
	if (a->rdzv)
		rdzv_json(root, a);
	nodecheck_status_json(a, root);
	ws = cJSON_AddArrayToObject(root, "workers");
	for (int i = 0; ws && a->wk.workers && i < a->wk.nworkers; i++) {
		const struct worker *w = &a->wk.workers[i];
		cJSON *o = cJSON_CreateObject();

		cJSON_AddNumberToObject(o, "local_rank", w->local_rank);
		cJSON_AddNumberToObject(o, "global_rank", w->global_rank);
		cJSON_AddNumberToObject(o, "pid", w->pid);
		cJSON_AddStringToObject(o, "state", worker_state(w));
		if (w->state == W_EXITED)
			cJSON_AddNumberToObject(o, "exit_code", w->exit_code);
		else
			cJSON_AddNullToObject(o, "exit_code");
		cJSON_AddItemToArray(ws, o);
	}
	if (!version)
		return;
	cJSON_AddNumberToObject(root, "version", (double)*version);
	if (st >= 0 && (unsigned)st < ARRAY_SIZE(internal))
		cJSON_ReplaceItemInObjectCaseSensitive(
		    root, "state", cJSON_CreateString(agent_state_name(internal[st])));
	if (st == CRUN_AGENT_DONE)
		cJSON_AddNumberToObject(root, "exit_code", a->exit_code);
}

static void src_jobs_json(void *arg, cJSON *jobs)
{
	const struct crun_agent *a = ((const struct agent_view *)arg)->a;
	cJSON *j = cJSON_CreateObject();

	if (!j)
		return;
	cJSON_AddStringToObject(j, "run_id", a->run_id);
	cJSON_AddStringToObject(j, "role", a->role);
	cJSON_AddStringToObject(j, "state", agent_state_name(a->state));
	cJSON_AddNumberToObject(j, "restart_count", a->restart_count);
	if (a->rdzv && a->state == AS_RUNNING)
		cJSON_AddNumberToObject(j, "world_size", rdzv_info(a->rdzv)->world_size);
	cJSON_AddItemToArray(jobs, j);
}

/* The rendezvous's round and its counters (one table: RDZV_COUNTER_MAP). */
static void rdzv_metrics(FILE *f, const struct rdzv *r)
{
	struct rdzv_progress *p = malloc(sizeof(*p));
	char name[96];

	if (!p)
		return;
	rdzv_get_progress(r, p);
	status_gauge(f, "crun_rdzv_round", "the round waited in, or the last completed (-1: none)",
		     "gauge");
	fprintf(f, "crun_rdzv_round %d\n", p->round);
	status_gauge(f, "crun_rdzv_waiting", "1 while this node waits for a round to complete",
		     "gauge");
	fprintf(f, "crun_rdzv_waiting %d\n", p->waiting ? 1 : 0);
	status_gauge(f, "crun_rdzv_nodes",
		     "nodes joined to the round waited in, or of the last completed", "gauge");
	fprintf(f, "crun_rdzv_nodes %d\n", p->joined);
	for (int c = 0; c < RDZV_C__MAX; c++) {
		snprintf(name, sizeof(name), "crun_rdzv_%s_total",
			 rdzv_counter_name((enum rdzv_counter)c));
		status_gauge(f, name, rdzv_counter_help((enum rdzv_counter)c), "counter");
		fprintf(f, "%s %" PRIu64 "\n", name, p->counters[c]);
	}
	free(p);
}

/* The agent's job, its state, restarts and workers now. */
static void job_metrics(FILE *f, const struct crun_agent *a)
{
	int running = 0, exited = 0;

	status_gauge(f, "crun_agent_info", "the agent's job (labels), always 1", "gauge");
	fputs("crun_agent_info{run_id=\"", f);
	status_label(f, a->run_id);
	fputs("\",role=\"", f);
	status_label(f, a->role);
	fputs("\",host=\"", f);
	status_label(f, a->host);
	fputs("\"} 1\n", f);
	status_gauge(f, "crun_agent_state", "1 for the agent's current state", "gauge");
	for (int st = AS_INIT; st < AS__MAX; st++)
		fprintf(f, "crun_agent_state{state=\"%s\"} %d\n",
			agent_state_name((enum agent_state)st), (int)a->state == st);
	status_gauge(f, "crun_agent_restarts_total", "worker group restarts so far", "counter");
	fprintf(f, "crun_agent_restarts_total %d\n", a->restart_count);
	status_gauge(f, "crun_agent_max_restarts", "restarts allowed (--max_restarts)", "gauge");
	fprintf(f, "crun_agent_max_restarts %d\n", a->cfg.max_restarts);
	status_gauge(f, "crun_agent_group_rank", "this node's rank in the current round", "gauge");
	fprintf(f, "crun_agent_group_rank %d\n", a->group_rank);
	for (int i = 0; a->wk.workers && i < a->wk.nworkers; i++) {
		running += a->wk.workers[i].state == W_RUNNING;
		exited += a->wk.workers[i].state == W_EXITED;
	}
	status_gauge(f, "crun_agent_workers", "workers of the current attempt by state", "gauge");
	fprintf(f, "crun_agent_workers{state=\"running\"} %d\n", running);
	fprintf(f, "crun_agent_workers{state=\"exited\"} %d\n", exited);
	status_gauge(f, "crun_agent_worker_exit_code",
		     "exit code of each exited worker of the current attempt", "gauge");
	for (int i = 0; a->wk.workers && i < a->wk.nworkers; i++)
		if (a->wk.workers[i].state == W_EXITED)
			fprintf(f, "crun_agent_worker_exit_code{local_rank=\"%d\"} %d\n",
				a->wk.workers[i].local_rank, a->wk.workers[i].exit_code);
}

static void src_metrics(void *arg, FILE *f)
{
	const struct agent_view *v = arg;
	const struct crun_agent *a = v->a;

	job_metrics(f, a);
	if (a->rdzv)
		rdzv_metrics(f, a->rdzv);
	nodecheck_metrics(f, a);
	if (!v->exits)
		return;
	status_gauge(f, "crun_agent_worker_exits_total",
		     "workers of finished attempts by exit code (128+N: signal N)", "counter");
	for (int code = 0; code < STATUS_EXIT_CODES; code++)
		if (v->exits[code] || code == 0)
			fprintf(f, "crun_agent_worker_exits_total{code=\"%d\"} %" PRIu64 "\n", code,
				v->exits[code]);
}

/* The worker store, and the rendezvous store when it serves the c10d
 * endpoint itself. */
static const struct store_server *src_store(void *arg, enum status_store kind)
{
	const struct crun_agent *a = ((const struct agent_view *)arg)->a;

	if (kind == STATUS_STORE_RENDEZVOUS)
		return a->rdzv ? rdzv_served_store(a->rdzv) : NULL;
	return a->store;
}

static struct rdzv *src_rdzv(void *arg)
{
	return ((struct agent_view *)arg)->a->rdzv;
}

static const char *src_run_id(void *arg)
{
	return ((struct agent_view *)arg)->a->run_id;
}

static const char *src_host(void *arg)
{
	return ((struct agent_view *)arg)->a->host;
}

static int src_stacks(void *arg, int rank, char **ret_body)
{
	return stacks_on_demand(((struct agent_view *)arg)->a, rank, ret_body);
}

/* The page's view of v's agent. */
static struct status_source source_of(struct agent_view *v)
{
	return (struct status_source){.arg = v,
				      .status_json = src_status_json,
				      .jobs_json = src_jobs_json,
				      .metrics = src_metrics,
				      .store = src_store,
				      .rdzv = src_rdzv,
				      .run_id = src_run_id,
				      .host = src_host,
				      .stacks = src_stacks};
}

char *agent_status_json(const struct crun_agent *a, const struct store_server *srv)
{
	struct agent_view v = {(struct crun_agent *)a, NULL};
	struct status_source src = source_of(&v);

	return status_json(srv, a ? &src : NULL);
}

char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv)
{
	struct agent_view v = {(struct crun_agent *)a, NULL};
	struct status_source src = source_of(&v);

	return status_jobs_json(srv, a ? &src : NULL);
}

char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const uint64_t *exits, uint64_t uptime_ms)
{
	struct agent_view v = {(struct crun_agent *)a, exits};
	struct status_source src = source_of(&v);

	return status_metrics(srv, a ? &src : NULL, uptime_ms);
}

int agent_status_start(struct event_base *base, const char *listen, struct agent_status **ret)
{
	struct agent_status *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return CRUN_ENOMEM;
	s->view.exits = s->exits;
	r = status_page_start(base, listen, &s->page);
	if (r < 0) {
		free(s);
		return r;
	}
	*ret = s;
	return 0;
}

void agent_status_on_state(struct agent_status *s, crun_agent_state_t st)
{
	const struct crun_agent *a = s ? s->view.a : NULL;

	if (!a)
		return;
	/* An attempt is over when the agent leaves RUNNING or STOPPING for a new
	 * round, the exit barrier or the end; the workers still hold their exit
	 * codes then (the next attempt resets them). */
	if ((s->last == CRUN_AGENT_RUNNING || s->last == CRUN_AGENT_STOPPING) &&
	    (st == CRUN_AGENT_RENDEZVOUS || st == CRUN_AGENT_BARRIER || st == CRUN_AGENT_DONE))
		for (int i = 0; a->wk.workers && i < a->wk.nworkers; i++)
			if (a->wk.workers[i].state == W_EXITED)
				s->exits[MIN((unsigned)a->wk.workers[i].exit_code,
					     STATUS_EXIT_CODES - 1u)]++;
	s->last = st;
	status_page_changed(s->page, st);
}

void agent_status_attach(struct agent_status *s, struct crun_agent *a)
{
	struct status_source src;

	if (!s)
		return;
	/* Another agent: a gather of stacks in flight for the one before ends
	 * (the page tells its source apart by arg, which stays s->view). */
	if (s->view.a && s->view.a != a)
		status_page_attach(s->page, NULL);
	s->view.a = a;
	src = source_of(&s->view);
	status_page_attach(s->page, a ? &src : NULL);
}

const char *agent_status_addr(const struct agent_status *s)
{
	return status_page_addr(s->page);
}

void agent_status_stop(struct agent_status *s)
{
	if (!s)
		return;
	status_page_stop(s->page);
	free(s);
}
