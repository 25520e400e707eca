/* status_job.c: the job as its public events tell it (crun_agent_event_t,
 * the stream an embedder of libcrun gets through on_event): its state and
 * restarts, the round it runs in, the workers of the current attempt and
 * the exit codes of every attempt that ended. The status page and the
 * service unit subscribe to the events and read the job from here, so
 * neither looks inside the agent. Pure: no sockets, no clock.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "service/service.h"

enum job_worker_state { JW_INIT, JW_RUNNING, JW_EXITED };

struct job_worker {
	int local_rank, global_rank, pid, exit_code;
	enum job_worker_state state;
};

struct status_job {
	crun_agent_state_t state;
	int restart_count;
	/* The last round (CRUN_AGENT_EV_RENDEZVOUS); valid while have_round. */
	bool have_round;
	bool done_in_round; /* DONE came while an attempt ran in the round */
	int group_rank, group_world_size, world_size;
	char master_addr[256];
	uint16_t master_port;
	struct job_worker *workers; /* the current attempt's, nworkers of them */
	int nworkers;
	/* Worker exits by code (0..255, anything else counts as 255) of the
	 * attempts that ended. */
	uint64_t exits[STATUS_EXIT_CODES];
};

int status_job_new(struct status_job **ret)
{
	struct status_job *j = calloc(1, sizeof(*j));

	if (!j)
		return CRUN_ENOMEM;
	j->group_rank = -1;
	*ret = j;
	return 0;
}

void status_job_free(struct status_job *j)
{
	if (!j)
		return;
	free(j->workers);
	free(j);
}

/* A new attempt's workers, all not yet started. */
static void new_attempt(struct status_job *j, const crun_agent_event_t *ev)
{
	int n = ev->local_world_size;
	struct job_worker *w;

	if (n < 0 || n > CRUN_AGENT_MAX_LOCAL)
		n = 0;
	w = n > j->nworkers ? realloc(j->workers, (size_t)n * sizeof(*w)) : j->workers;
	if (!w && n) {
		j->nworkers = 0; /* OOM: the page shows no workers, not stale ones */
		return;
	}
	j->workers = w;
	j->nworkers = n;
	for (int i = 0; i < n; i++)
		w[i] = (struct job_worker){.local_rank = i, .global_rank = ev->base_rank + i};
}

static struct job_worker *worker_of(struct status_job *j, int local_rank)
{
	return local_rank >= 0 && local_rank < j->nworkers ? &j->workers[local_rank] : NULL;
}

/* An attempt is over when the job leaves RUNNING or STOPPING for a new
 * round, the exit barrier or the end; its workers hold their exit codes
 * until the next attempt's round replaces them. */
static void count_exits(struct status_job *j, crun_agent_state_t next)
{
	if ((j->state != CRUN_AGENT_RUNNING && j->state != CRUN_AGENT_STOPPING) ||
	    (next != CRUN_AGENT_RENDEZVOUS && next != CRUN_AGENT_BARRIER &&
	     next != CRUN_AGENT_DONE))
		return;
	for (int i = 0; i < j->nworkers; i++)
		if (j->workers[i].state == JW_EXITED)
			j->exits[MIN((unsigned)j->workers[i].exit_code, STATUS_EXIT_CODES - 1u)]++;
}

/* The round's fields belong to the attempt that runs in it, and stay on the
 * job's final page when it ended there. */
static bool in_round(const struct status_job *j)
{
	if (j->state == CRUN_AGENT_DONE)
		return j->done_in_round;
	return j->have_round && (j->state == CRUN_AGENT_RUNNING ||
				 j->state == CRUN_AGENT_STOPPING || j->state == CRUN_AGENT_BARRIER);
}

void status_job_apply(struct status_job *j, const crun_agent_event_t *ev)
{
	struct job_worker *w;

	j->restart_count = ev->restart_count;
	switch (ev->type) {
	case CRUN_AGENT_EV_STATE:
		count_exits(j, ev->state);
		if (ev->state == CRUN_AGENT_DONE)
			j->done_in_round = in_round(j);
		j->state = ev->state;
		break;
	case CRUN_AGENT_EV_RENDEZVOUS:
		j->have_round = true;
		j->group_rank = ev->group_rank;
		j->group_world_size = ev->group_world_size;
		j->world_size = ev->world_size;
		snprintf(j->master_addr, sizeof(j->master_addr), "%s",
			 ev->master_addr ? ev->master_addr : "");
		j->master_port = ev->master_port;
		new_attempt(j, ev);
		break;
	case CRUN_AGENT_EV_WORKER_START:
	case CRUN_AGENT_EV_WORKER_EXIT:
		w = worker_of(j, ev->local_rank);
		if (!w)
			break;
		w->pid = ev->pid;
		w->global_rank = ev->global_rank;
		w->state = ev->type == CRUN_AGENT_EV_WORKER_EXIT ? JW_EXITED : JW_RUNNING;
		w->exit_code = ev->exit_code;
		break;
	}
}

static const char *worker_state(const struct job_worker *w)
{
	static const char *const names[] = {
	    [JW_INIT] = "init", [JW_RUNNING] = "running", [JW_EXITED] = "exited"};

	return names[w->state];
}

void status_job_json(const struct status_job *j, cJSON *root)
{
	cJSON *ws;

	cJSON_AddNumberToObject(root, "restart_count", j->restart_count);
	if (in_round(j)) {
		cJSON_AddNumberToObject(root, "group_world_size", j->group_world_size);
		cJSON_AddNumberToObject(root, "world_size", j->world_size);
		cJSON_AddStringToObject(root, "master_addr", j->master_addr);
		cJSON_AddNumberToObject(root, "master_port", j->master_port);
	}
	ws = cJSON_AddArrayToObject(root, "workers");
	for (int i = 0; ws && i < j->nworkers; i++) {
		const struct job_worker *w = &j->workers[i];
		cJSON *o = cJSON_CreateObject();

		cJSON_AddNumberToObject(o, "local_rank", w->local_rank);
		cJSON_AddNumberToObject(o, "global_rank", w->global_rank);
		cJSON_AddNumberToObject(o, "pid", w->pid);
		cJSON_AddStringToObject(o, "state", worker_state(w));
		if (w->state == JW_EXITED)
			cJSON_AddNumberToObject(o, "exit_code", w->exit_code);
		else
			cJSON_AddNullToObject(o, "exit_code");
		cJSON_AddItemToArray(ws, o);
	}
}

void status_job_entry_json(const struct status_job *j, cJSON *entry)
{
	cJSON_AddNumberToObject(entry, "restart_count", j->restart_count);
	if (j->have_round && j->state == CRUN_AGENT_RUNNING)
		cJSON_AddNumberToObject(entry, "world_size", j->world_size);
}

void status_job_metrics(const struct status_job *j, FILE *f)
{
	int running = 0, exited = 0;

	status_gauge(f, "crun_agent_restarts_total", "worker group restarts so far", "counter");
	fprintf(f, "crun_agent_restarts_total %d\n", j->restart_count);
	for (int i = 0; i < j->nworkers; i++) {
		running += j->workers[i].state == JW_RUNNING;
		exited += j->workers[i].state == JW_EXITED;
	}
	status_gauge(f, "crun_agent_workers", "workers of the current attempt by state", "gauge");
	fprintf(f, "crun_agent_workers{state=\"running\"} %d\n", running);
	fprintf(f, "crun_agent_workers{state=\"exited\"} %d\n", exited);
	status_gauge(f, "crun_agent_worker_exit_code",
		     "exit code of each exited worker of the current attempt", "gauge");
	for (int i = 0; i < j->nworkers; i++)
		if (j->workers[i].state == JW_EXITED)
			fprintf(f, "crun_agent_worker_exit_code{local_rank=\"%d\"} %d\n",
				j->workers[i].local_rank, j->workers[i].exit_code);
	status_gauge(f, "crun_agent_worker_exits_total",
		     "workers of finished attempts by exit code (128+N: signal N)", "counter");
	for (int code = 0; code < STATUS_EXIT_CODES; code++)
		if (j->exits[code] || code == 0)
			fprintf(f, "crun_agent_worker_exits_total{code=\"%d\"} %" PRIu64 "\n", code,
				j->exits[code]);
}

bool status_job_round(const struct status_job *j, int *ret_group_rank, int *ret_group_world_size,
		      int *ret_world_size)
{
	if (!in_round(j))
		return false;
	*ret_group_rank = j->group_rank;
	*ret_group_world_size = j->group_world_size;
	*ret_world_size = j->world_size;
	return true;
}
