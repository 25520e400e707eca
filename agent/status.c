/* status.c: the agent as its status page's source (service/status.c serves
 * the page): what the job is, which only the agent knows (run id, role,
 * host, its precise state, rendezvous progress, node check, the stores it
 * serves, GET /stacks' local capture). What happens to the job (restarts,
 * the round, the workers and their exit codes) the page hears through the
 * public events, as an embedder would (service/status_job.c), so nothing
 * here reads the worker table.
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

static void rdzv_json(cJSON *root, const struct crun_agent *a)
{
	struct rdzv_progress *p = malloc(sizeof(*p));

	if (!p)
		return;
	rdzv_get_progress(a->rdzv, p);
	status_progress_json(root, p, a->run_id);
	free(p);
}

/* What the agent knows of its job for /status; with version (the live page)
 * that count, and at a change (st >= 0) the state being entered, named as
 * precisely as the agent names its own, with its exit code at the end. */
static void src_status_json(void *arg, cJSON *root, const uint64_t *version, int st)
{
	static const enum agent_state internal[] = {[CRUN_AGENT_RENDEZVOUS] = AS_RENDEZVOUS,
						    [CRUN_AGENT_RUNNING] = AS_RUNNING,
						    [CRUN_AGENT_STOPPING] = AS_STOPPING,
						    [CRUN_AGENT_BARRIER] = AS_BARRIER,
						    [CRUN_AGENT_DONE] = AS_DONE};
	const struct crun_agent *a = arg;

	cJSON_AddStringToObject(root, "run_id", a->run_id);
	cJSON_AddStringToObject(root, "role", a->role);
	cJSON_AddStringToObject(root, "host", a->host);
	cJSON_AddStringToObject(root, "state", agent_state_name(a->state));
	cJSON_AddStringToObject(root, "rdzv_backend", a->cfg.rdzv_backend);
	cJSON_AddNumberToObject(root, "max_restarts", a->cfg.max_restarts);
	cJSON_AddNumberToObject(root, "group_rank", a->group_rank);
	if (a->rdzv)
		rdzv_json(root, a);
	nodecheck_status_json(a, root);
	if (!version)
		return;
	cJSON_AddNumberToObject(root, "version", (double)*version);
	if (st >= 0 && (unsigned)st < ARRAY_SIZE(internal))
		cJSON_ReplaceItemInObjectCaseSensitive(
		    root, "state", cJSON_CreateString(agent_state_name(internal[st])));
	if (st == CRUN_AGENT_DONE)
		cJSON_AddNumberToObject(root, "exit_code", a->exit_code);
}

static void src_jobs_json(void *arg, cJSON *entry)
{
	const struct crun_agent *a = arg;

	cJSON_AddStringToObject(entry, "run_id", a->run_id);
	cJSON_AddStringToObject(entry, "role", a->role);
	cJSON_AddStringToObject(entry, "state", agent_state_name(a->state));
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

/* The agent's job and its state now. */
static void job_metrics(FILE *f, const struct crun_agent *a)
{
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
	status_gauge(f, "crun_agent_max_restarts", "restarts allowed (--max_restarts)", "gauge");
	fprintf(f, "crun_agent_max_restarts %d\n", a->cfg.max_restarts);
	status_gauge(f, "crun_agent_group_rank", "this node's rank in the current round", "gauge");
	fprintf(f, "crun_agent_group_rank %d\n", a->group_rank);
}

static void src_metrics(void *arg, FILE *f)
{
	const struct crun_agent *a = arg;

	job_metrics(f, a);
	if (a->rdzv)
		rdzv_metrics(f, a->rdzv);
	nodecheck_metrics(f, a);
}
/* The worker store, and the rendezvous store when it serves the c10d
 * endpoint itself. */
static const struct store_server *src_store(void *arg, enum status_store kind)
{
	const struct crun_agent *a = (const struct crun_agent *)arg;

	if (kind == STATUS_STORE_RENDEZVOUS)
		return a->rdzv ? rdzv_served_store(a->rdzv) : NULL;
	return a->store;
}

static struct rdzv *src_rdzv(void *arg)
{
	return ((struct crun_agent *)arg)->rdzv;
}

static const char *src_run_id(void *arg)
{
	return ((struct crun_agent *)arg)->run_id;
}

static const char *src_host(void *arg)
{
	return ((struct crun_agent *)arg)->host;
}

static int src_stacks(void *arg, int rank, char **ret_body)
{
	return stacks_on_demand(((struct crun_agent *)arg), rank, ret_body);
}

void agent_status_source(struct crun_agent *a, struct status_source *ret)
{
	*ret = (struct status_source){.arg = a,
				      .status_json = src_status_json,
				      .jobs_json = src_jobs_json,
				      .metrics = src_metrics,
				      .store = src_store,
				      .rdzv = src_rdzv,
				      .run_id = src_run_id,
				      .host = src_host,
				      .stacks = src_stacks};
}

/* a's source for a body with no page (tests), with job's events or none;
 * a NULL agent gives the bare page. */
static const struct status_source *
source_of(const struct crun_agent *a, const struct status_job *job, struct status_source *src)
{
	if (!a)
		return NULL;
	agent_status_source((struct crun_agent *)a, src);
	src->job = job;
	return src;
}

char *agent_status_json(const struct crun_agent *a, const struct store_server *srv)
{
	struct status_source src;

	return status_json(srv, source_of(a, NULL, &src));
}

char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv)
{
	struct status_source src;

	return status_jobs_json(srv, source_of(a, NULL, &src));
}

char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const struct status_job *job, uint64_t uptime_ms)
{
	struct status_source src;

	return status_metrics(srv, source_of(a, job, &src), uptime_ms);
}
