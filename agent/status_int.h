/* status_int.h: what status.c (the page and its watchers) and status_jobs.c
 * (the JSON views of a store's jobs) share inside agent/. Every function is
 * pure: no sockets, no clock.
 */
#ifndef CRUN_AGENT_STATUS_INT_H
#define CRUN_AGENT_STATUS_INT_H

#include <stdint.h>

#include <cjson/cJSON.h>

struct rdzv_progress;
struct store_server;

/* Adds the rendezvous's progress (rdzv.h) to root as "rendezvous": the round
 * waited in or the last one completed, its nodes (group ranks and addresses
 * once complete), the nodes waited for, and the counters. */
void status_progress_json(cJSON *root, const struct rdzv_progress *p, const char *run_id);

/* root as compact JSON (malloc'd; NULL on OOM or a NULL root). Takes
 * ownership of root, and frees it. */
char *status_print_tree(cJSON *root);

/* One c10d job of crun-rdzvd's store (GET /jobs/ID, /status?rdzv_id=ID): its
 * round, nodes, group ranks, the nodes waited for and its state
 * (rendezvous, running, done, failed), with "version": a hash of that view,
 * equal for equal views, which *ret_version gets too. malloc'd; NULL when
 * the store holds no round of the job (or on OOM). srv is borrowed. */
char *status_store_job_body(const struct store_server *srv, const char *run_id,
			    uint64_t *ret_version);

/* Adds to jobs (an object) one entry per run id srv's keys belong to, with
 * its key count and, for a c10d job, its round and state. */
void status_store_jobs(cJSON *jobs, const struct store_server *srv);

#endif
