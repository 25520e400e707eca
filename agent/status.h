/* status.h: the agent as its status page's source (status.c). */
#ifndef CRUN_AGENT_STATUS_H
#define CRUN_AGENT_STATUS_H

#include <stdint.h>

struct crun_agent;
struct status_job;
struct status_source;
struct store_server;

/* The page itself (routes, watchers, store counters) and the job as its
 * public events tell it (restarts, round, workers) are service/'s: a
 * program starts a page (status_page_start), gives it this source
 * (status_page_attach) and passes it the agent's events
 * (status_page_on_event), as any embedder of libcrun could. The source
 * answers what only the agent knows: run id, role, host, its precise
 * state, rendezvous progress, node check, its stores, local stacks. a is
 * borrowed for as long as a page holds the source. */
void agent_status_source(struct crun_agent *a, struct status_source *ret);
/* The bodies without a page, malloc'd (NULL on OOM); a NULL agent gives the
 * bare page, job (NULL: none) the events' part of /metrics. */
char *agent_status_json(const struct crun_agent *a, const struct store_server *srv);
/* {"jobs": [...]}: the agent's job, or the c10d jobs whose keys srv holds. */
char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv);
/* With srv (crun-rdzvd's page) crun_rdzvd_up and its store's crun_store_*
 * labelled store="rendezvous"; else crun_agent_up and a's stores by role. */
char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const struct status_job *job, uint64_t uptime_ms);

#endif /* CRUN_AGENT_STATUS_H */
