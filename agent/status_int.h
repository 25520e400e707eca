/* status_int.h: what status.c (the page and its watchers), status_jobs.c
 * (the JSON views of a store's jobs) and status_stacks.c (GET /stacks)
 * share inside agent/. The views are pure: no sockets, no clock.
 */
#ifndef CRUN_AGENT_STATUS_INT_H
#define CRUN_AGENT_STATUS_INT_H

#include <stddef.h>
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

/* crun-rdzvd's store: job run_id's key prefix as its agents spell it
 * ("/crun-c10d/<id>/" or without the '/') into prefix, the nodes of its
 * round (*ret_nodes) and its state as rdzv_c10d_view says it. 0, or
 * CRUN_ENOTFOUND when the store holds no round of the job, CRUN_ENOMEM. */
int status_store_job_round(const struct store_server *srv, const char *run_id, char *prefix,
			   size_t cap, int *ret_nodes, const char **ret_state);

struct evhttp_request;
struct crun_agent;
struct event_base;
/* status.c: answers req with body (taken; NULL: a 500) as type. */
void status_reply(struct evhttp_request *req, int code, const char *type, char *body);

/* status_stacks.c: GET /stacks of one page (see there). a: the agent's
 * page, or srv: crun-rdzvd's (writable: an ask is posted into it). */
struct status_stacks;
int status_stacks_new(struct event_base *base, struct status_stacks **ret);
void status_stacks_get(struct status_stacks *ss, struct evhttp_request *req, const char *query,
		       struct crun_agent *a, struct store_server *srv);
/* The page's agent is a (NULL: none): a gather in flight for another
 * agent is answered 503. */
void status_stacks_attach(struct status_stacks *ss, struct crun_agent *a);
/* Answers a pending request 503, then frees; NULL: no-op. */
void status_stacks_free(struct status_stacks *ss);
#endif
