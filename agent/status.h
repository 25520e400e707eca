/* status.h: the agent's status page: its job fed to service/'s page (status.c). */
#ifndef CRUN_AGENT_STATUS_H
#define CRUN_AGENT_STATUS_H

#include <stdint.h>

#include "crun/agent.h"

struct event_base;
struct crun_agent;
struct store_server;

/* The page itself (routes, watchers, store counters) is service/status.c's;
 * agent/status.c feeds it the agent's job through struct status_source and
 * counts the workers' exit codes. */
struct agent_status;
/* Serves the page on `listen` ("ADDR:PORT", port 0: any free one) on base.
 * CRUN_EINVAL (bad address), CRUN_EADDRINUSE (cannot bind), CRUN_ENOMEM. */
int agent_status_start(struct event_base *base, const char *listen, struct agent_status **ret);
void agent_status_attach(struct agent_status *s, struct crun_agent *a); /* s NULL: no-op */
const char *agent_status_addr(const struct agent_status *s);		/* "127.0.0.1:8123" */
void agent_status_stop(struct agent_status *s);				/* NULL: no-op */
/* The bodies, malloc'd (NULL on OOM); a NULL agent gives the bare page. */
char *agent_status_json(const struct crun_agent *a, const struct store_server *srv);
/* {"jobs": [...]}: the agent's job, or the c10d jobs whose keys srv holds. */
char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv);
/* exits: 256 counters of worker exit codes, or NULL. With srv (crun-rdzvd's
 * page) crun_rdzvd_up and its store's crun_store_* labelled
 * store="rendezvous"; else crun_agent_up and a's store as store="worker". */
char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const uint64_t *exits, uint64_t uptime_ms);
/* Call from the agent's state callback: counts the exit codes of each
 * attempt that ends (crun_agent_worker_exits_total) and moves the page's
 * version on. s NULL: no-op. */
void agent_status_on_state(struct agent_status *s, crun_agent_state_t st);

#endif /* CRUN_AGENT_STATUS_H */
