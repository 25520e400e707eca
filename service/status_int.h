/* status_int.h: what the status page's files share inside service/: the
 * page (status.c), its bodies (status_body.c), the JSON views of a store's
 * jobs (status_jobs.c), POST /drop (status_drop.c) and GET /stacks
 * (status_stacks.c). The views are pure: no sockets, no clock.
 */
#ifndef CRUN_SERVICE_STATUS_INT_H
#define CRUN_SERVICE_STATUS_INT_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "service/service.h"

struct evhttp_request;
struct event_base;

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

/* status_body.c: the /status tree of srv and src (either may be NULL);
 * version and st as struct status_source's status_json takes them. */
cJSON *status_tree(const struct store_server *srv, const struct status_source *src,
		   const uint64_t *version, int st);

/* status.c: answers req with body (taken; NULL: a 500) as type. */
void status_reply(struct evhttp_request *req, int code, const char *type, char *body);

/* status_drop.c: POST /drop?job=J on a page whose drop is on (drop_store,
 * token: status_page_allow_drop); 403 when it is off. */
struct status_drop {
	struct store_server *store; /* borrowed; NULL: /drop is off */
	char *token;		    /* owned, NUL-terminated */
	size_t token_len;
};
void status_drop_post(const struct status_drop *d, struct evhttp_request *req, const char *query);
int status_drop_allow(struct status_drop *d, struct store_server *srv,
		      const struct store_auth_secret *token);
void status_drop_clear(struct status_drop *d);

/* status_stacks.c: GET /stacks of one page (see there). src: the page's
 * job (NULL: none), or srv: crun-rdzvd's store (writable: an ask is posted
 * into it). */
struct status_stacks;
int status_stacks_new(struct event_base *base, struct status_stacks **ret);
void status_stacks_get(struct status_stacks *ss, struct evhttp_request *req, const char *query,
		       const struct status_source *src, struct store_server *srv);
/* The page's job is now owner's (a source's arg; NULL: none): a gather in
 * flight for another is answered 503. */
void status_stacks_attach(struct status_stacks *ss, const void *owner);
/* Answers a pending request 503, then frees; NULL: no-op. */
void status_stacks_free(struct status_stacks *ss);
#endif
