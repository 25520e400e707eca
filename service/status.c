/* status.c: a status page over libevent's evhttp (--status ADDR:PORT): the
 * routes, the watchers parked on GET /status?after= until the next state
 * change (or, on crun-rdzvd's page, ?rdzv_id= until that job's view
 * changes), and the page's end. The bodies are status_body.c's; what only
 * an agent knows comes through the page's struct status_source.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/common.h"
#include "service/status_int.h"
#include "store/server.h"

#define STATUS_MAX_HEADERS_BYTES 8192 /* a status client sends a GET line and a few headers */

#define STATUS_MAX_HELD	   64	 /* watchers parked on ?after= at once */
#define STATUS_MAX_HOLD_MS 60000 /* the longest ?wait_ms= a watcher is held */
/* How long a closing page waits for a watcher it answered to come back
 * for the job's end (a hang guard: a watcher asks again at once). */
#define STATUS_LINGER_MS 2000

/* How often crun-rdzvd's page looks at the jobs its watchers wait on: the
 * store has no change hook, and a look is a few key reads. */
#define STATUS_JOB_POLL_MS 200

/* A GET /status?after=VERSION&wait_ms=N parked until the state changes;
 * on crun-rdzvd's page (&rdzv_id=JOB) until that job's view changes. */
struct status_hold {
	struct status_page *s;	    /* borrowed back-pointer */
	struct evhttp_request *req; /* NULL: the slot is free */
	struct event *timer;
	char *job;	      /* owned: the run id watched, NULL on an agent's page */
	uint64_t job_version; /* the view the watcher has */
};

struct status_page {
	struct evhttp *http;
	struct event_base *base; /* borrowed */
	/* The job's state changes so far; the body carries it as "version",
	 * and a watcher asks for the next one with ?after=VERSION (crunctl
	 * watch). */
	uint64_t version;
	char *final; /* the body at DONE, served from then on: the job's end */
	/* Watchers told a state short of the end, not yet back for the next:
	 * a closing page waits for them until owed_until_ms. */
	int owed;
	uint64_t owed_until_ms;
	struct status_hold held[STATUS_MAX_HELD];
	struct event *job_poll;	  /* while a job watcher is parked (crun-rdzvd) */
	struct status_source src; /* the job shown; meaningful while has_src */
	bool has_src;
	struct status_job *job;		  /* what the job's events said (status_page_on_event) */
	const struct store_server *store; /* borrowed: crun-rdzvd's server, or NULL */
	struct store_server *board_store; /* the same, writable: GET /stacks?rdzv_id= */
	struct status_stacks *stk;	  /* GET /stacks: its gathers (status_stacks.c) */
	struct status_drop drop;	  /* POST /drop (status_drop.c) */
	uint64_t started_ms;
	char addr[300];
};

/* The page's source, or NULL while it shows none. */
static const struct status_source *source(const struct status_page *s)
{
	return s->has_src ? &s->src : NULL;
}

/* The page's /status body: its version, and at a state change (st >= 0)
 * the state the job is entering (the page hears of it before the job's
 * own state moves). */
static char *status_body(const struct status_page *s, int st)
{
	if (s->final)
		return str_dup(s->final);
	return status_print_tree(
	    status_tree(s->store, source(s), s->has_src ? &s->version : NULL, st));
}

void status_reply(struct evhttp_request *req, int code, const char *type, char *body)
{
	struct evbuffer *b = evhttp_request_get_output_buffer(req);

	if (!body) {
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", type);
	evbuffer_add(b, body, strlen(body));
	free(body);
	evhttp_send_reply(req, code, code == 200 ? "OK" : "Not Found", NULL);
}

/* Answers a watcher (a GET /status?after=) and writes the answer out at
 * once: it may be the job's end, after which the loop may not turn again
 * before the page closes. A watcher that got a state short of the end owes
 * a next request, which a closing page waits for (status_page_stop). */
static void answer_watcher(struct status_page *s, struct evhttp_request *req, int st)
{
	struct evhttp_connection *conn = evhttp_request_get_connection(req);
	struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);

	status_reply(req, 200, "application/json", status_body(s, st));
	if (s->has_src && !s->final && st != CRUN_AGENT_DONE) {
		s->owed++;
		s->owed_until_ms = clock_now_ms() + STATUS_LINGER_MS;
	}
	(void)evbuffer_write(bufferevent_get_output(bev), bufferevent_getfd(bev));
}

/* A job watcher's answer: the job as it is now, or 404 once the store
 * holds no round of it (a restarted crun-rdzvd). */
static void answer_job(struct status_page *s, struct evhttp_request *req, const char *run_id)
{
	uint64_t v;
	char *body = status_store_job_body(s->store, run_id, &v);

	if (body)
		status_reply(req, 200, "application/json", body);
	else
		evhttp_send_error(req, HTTP_NOTFOUND, "no such job in this store");
}

/* Frees the slot; returns the job it watched (the caller's to free). */
static char *hold_release(struct status_hold *h)
{
	char *job = h->job;

	evhttp_connection_set_closecb(evhttp_request_get_connection(h->req), NULL, NULL);
	event_free(h->timer);
	h->req = NULL;
	h->job = NULL;
	return job;
}

/* Answers a parked watcher now. st: the state being entered, or -1. */
static void hold_answer(struct status_hold *h, int st)
{
	struct evhttp_request *req = h->req;
	char *job = hold_release(h);

	if (job)
		answer_job(h->s, req, job);
	else
		answer_watcher(h->s, req, st);
	free(job);
}

static void hold_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	hold_answer(arg, -1);
}

/* The watcher hung up: libevent frees its request. */
static void hold_on_close(struct evhttp_connection *conn, void *arg)
{
	struct status_hold *h = arg;

	event_free(h->timer);
	h->req = NULL;
	free(h->job);
	h->job = NULL;
}

/* st: the state being entered, or -1 (the job's own). */
static void wake_all(struct status_page *s, int st)
{
	for (int i = 0; i < STATUS_MAX_HELD; i++)
		if (s->held[i].req)
			hold_answer(&s->held[i], st);
}

/* Every STATUS_JOB_POLL_MS while job watchers are parked: answers those
 * whose job changed (or vanished); stops when none is left. */
static void job_poll_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct status_page *s = arg;
	int left = 0;

	for (int i = 0; i < STATUS_MAX_HELD; i++) {
		struct status_hold *h = &s->held[i];
		uint64_t v = 0;
		char *body;

		if (!h->req || !h->job)
			continue;
		body = status_store_job_body(s->store, h->job, &v);
		free(body);
		if (body && v == h->job_version)
			left++;
		else
			hold_answer(h, -1);
	}
	if (!left)
		event_del(s->job_poll);
}

static bool hold(struct status_page *s, struct evhttp_request *req, uint64_t wait_ms,
		 const char *job, uint64_t job_version)
{
	static const struct timeval poll_tv = {.tv_usec = STATUS_JOB_POLL_MS * 1000};
	struct status_hold *h = NULL;
	struct timeval tv;

	for (int i = 0; !h && i < STATUS_MAX_HELD; i++)
		h = s->held[i].req ? NULL : &s->held[i];
	if (!h)
		return false;
	if (job) {
		if (!s->job_poll)
			s->job_poll = event_new(s->base, -1, EV_PERSIST, job_poll_on_timer, s);
		if (!s->job_poll ||
		    (!evtimer_pending(s->job_poll, NULL) && evtimer_add(s->job_poll, &poll_tv) < 0))
			return false;
		h->job = str_dup(job);
		if (!h->job)
			return false;
		h->job_version = job_version;
	}
	wait_ms = MIN(wait_ms, STATUS_MAX_HOLD_MS);
	tv.tv_sec = (time_t)(wait_ms / 1000);
	tv.tv_usec = (suseconds_t)(wait_ms % 1000) * 1000;
	h->timer = evtimer_new(s->base, hold_on_timeout, h);
	if (!h->timer || evtimer_add(h->timer, &tv) < 0) {
		if (h->timer)
			event_free(h->timer);
		free(h->job);
		h->job = NULL;
		return false;
	}
	h->s = s;
	h->req = req;
	evhttp_connection_set_closecb(evhttp_request_get_connection(req), hold_on_close, h);
	return true;
}

/* One job of crun-rdzvd's store; a watcher (wait_ms > 0) that has the
 * current view is parked until it changes or wait_ms passes. */
static void get_store_job(struct status_page *s, struct evhttp_request *req, const char *run_id,
			  uint64_t after, uint64_t wait_ms)
{
	uint64_t v;
	char *body = status_store_job_body(s->store, run_id, &v);

	if (!body) {
		evhttp_send_error(req, HTTP_NOTFOUND, "no such job in this store");
		return;
	}
	if (wait_ms && v == after) {
		free(body);
		if (!hold(s, req, wait_ms, run_id, v))
			evhttp_send_error(req, 503, "too many watchers");
		return;
	}
	status_reply(req, 200, "application/json", body);
}

/* GET /status, or, from a watcher, ?after=VERSION&wait_ms=N: with VERSION
 * the current one it is parked until the next state change or N ms,
 * whichever is first (503 when every slot is taken: an answer now would
 * make a busy loop); once the job is over, the final body at once. */
static void get_status(struct status_page *s, struct evhttp_request *req, const char *query)
{
	struct evkeyvalq q = {0};
	const char *after = NULL, *wait = NULL, *job = NULL;
	uint64_t version = 0, wait_ms = 0;
	bool watcher;

	if (query && evhttp_parse_query_str(query, &q) == 0) {
		after = evhttp_find_header(&q, "after");
		wait = evhttp_find_header(&q, "wait_ms");
		job = evhttp_find_header(&q, "rdzv_id");
	}
	watcher = after && parse_u64(after, &version) == 0 && wait &&
		  parse_u64(wait, &wait_ms) == 0 && wait_ms;
	/* crun-rdzvd's page: one job of its store, as GET /jobs/ID. */
	if (job && s->store && !s->has_src) {
		get_store_job(s, req, job, version, watcher ? wait_ms : 0);
		evhttp_clear_headers(&q);
		return;
	}
	evhttp_clear_headers(&q);
	if (!watcher) {
		status_reply(req, 200, "application/json", status_body(s, -1));
		return;
	}
	if (s->owed)
		s->owed--;
	if (!s->has_src || s->final || version != s->version)
		answer_watcher(s, req, -1);
	else if (!hold(s, req, wait_ms, NULL, 0))
		evhttp_send_error(req, 503, "too many watchers");
}

/* GET /jobs/ID: ID percent-decoded (a run id may hold any byte but '/'). */
static void get_store_job_path(struct status_page *s, struct evhttp_request *req, const char *raw)
{
	char *id = evhttp_uridecode(raw, 0, NULL);

	if (!id) {
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	get_store_job(s, req, id, 0, 0);
	free(id);
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct status_page *s = arg;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;

	if (path && evhttp_request_get_command(req) == EVHTTP_REQ_POST &&
	    strcmp(path, "/drop") == 0) {
		status_drop_post(&s->drop, req, evhttp_uri_get_query(uri));
		return;
	}
	if (evhttp_request_get_command(req) != EVHTTP_REQ_GET || !path) {
		evhttp_send_error(req, 405, "only GET (and POST /drop)");
		return;
	}
	if (strcmp(path, "/healthz") == 0)
		status_reply(req, 200, "text/plain; charset=utf-8", str_dup("ok\n"));
	else if (strcmp(path, "/status") == 0)
		get_status(s, req, evhttp_uri_get_query(uri));
	else if (strcmp(path, "/jobs") == 0)
		status_reply(req, 200, "application/json", status_jobs_json(s->store, source(s)));
	else if (strncmp(path, "/jobs/", 6) == 0 && path[6] && s->store && !s->has_src)
		get_store_job_path(s, req, path + 6);
	else if (strcmp(path, "/stacks") == 0 && (s->has_src || s->board_store))
		status_stacks_get(s->stk, req, evhttp_uri_get_query(uri), source(s),
				  s->board_store);
	else if (strcmp(path, "/usage") == 0 && s->store)
		status_reply(req, 200, "application/json", status_usage_json(s->store));
	else if (strcmp(path, "/metrics") == 0)
		status_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8",
			     status_metrics(s->store, source(s), clock_now_ms() - s->started_ms));
	else
		evhttp_send_error(req, HTTP_NOTFOUND, "try /healthz, /status, /jobs or /metrics");
}

int status_page_start(struct event_base *base, const char *listen, struct status_page **ret)
{
	struct status_page *s = calloc(1, sizeof(*s));
	struct evhttp_bound_socket *bs;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[256], ip[INET6_ADDRSTRLEN];
	uint16_t port = 0;
	int r = CRUN_EINVAL;

	if (!s)
		return CRUN_ENOMEM;
	if (parse_host_port(listen, 0, host, sizeof(host), &port) < 0)
		goto fail;
	r = CRUN_ENOMEM;
	s->base = base;
	s->http = evhttp_new(base);
	if (!s->http)
		goto fail;
	evhttp_set_max_headers_size(s->http, STATUS_MAX_HEADERS_BYTES);
	evhttp_set_max_body_size(s->http, 0);
	evhttp_set_timeout(s->http, 10);
	evhttp_set_gencb(s->http, on_request, s);
	bs = evhttp_bind_socket_with_handle(s->http, host, port);
	if (!bs) {
		r = log_fail(SUB_AGENT, CRUN_EADDRINUSE, "cannot serve the status page on '%s'",
			     listen);
		goto fail;
	}
	if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
		const void *in = ss.ss_family == AF_INET6
				     ? (const void *)&((struct sockaddr_in6 *)&ss)->sin6_addr
				     : (const void *)&((struct sockaddr_in *)&ss)->sin_addr;

		port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						      : ((struct sockaddr_in *)&ss)->sin_port);
		inet_ntop(ss.ss_family, in, ip, sizeof(ip));
		snprintf(s->addr, sizeof(s->addr), ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u",
			 ip, port);
	}
	r = status_stacks_new(base, &s->stk);
	if (r < 0)
		goto fail;
	r = status_job_new(&s->job);
	if (r < 0)
		goto fail;
	s->started_ms = clock_now_ms();
	log_at(LL_INFO, SUB_AGENT, "status page on http://%s/status", s->addr);
	*ret = s;
	return 0;
fail:
	status_page_stop(s);
	return r;
}

void status_page_on_event(const crun_agent_event_t *ev, void *page)
{
	struct status_page *s = page;
	crun_agent_state_t st = ev->state;

	status_job_apply(s->job, ev);
	if (ev->type != CRUN_AGENT_EV_STATE || !s->has_src)
		return;
	s->version++;
	if (st == CRUN_AGENT_DONE)
		s->final = status_body(s, (int)st); /* NULL (OOM): the live page */
	wake_all(s, (int)st);
}

void status_page_attach(struct status_page *s, const struct status_source *src)
{
	if (!s)
		return;
	status_stacks_attach(s->stk, src ? src->arg : NULL);
	s->has_src = src != NULL;
	if (src) {
		s->src = *src;
		s->src.job = s->job;
	}
}

void status_page_attach_store(struct status_page *s, struct store_server *srv)
{
	if (s) {
		s->store = srv;
		s->board_store = srv;
	}
}

int status_page_allow_drop(struct status_page *s, struct store_server *srv,
			   const struct store_auth_secret *token)
{
	return status_drop_allow(&s->drop, srv, token);
}

const char *status_page_addr(const struct status_page *s)
{
	return s->addr;
}

static void linger_on_timer(evutil_socket_t fd, short what, void *arg)
{
}

/* A page its program closes after the job is gone (detached: nothing of
 * the job's is left on the loop) turns the loop until every watcher it
 * owes has been back for the final body, or the bound passes. */
static void linger(struct status_page *s)
{
	struct event *t =
	    s->owed && !s->has_src ? evtimer_new(s->base, linger_on_timer, NULL) : NULL;

	while (t && s->owed > 0 && clock_now_ms() < s->owed_until_ms) {
		uint64_t left = s->owed_until_ms - clock_now_ms();
		struct timeval tv = {.tv_sec = (time_t)(left / 1000),
				     .tv_usec = (suseconds_t)(left % 1000) * 1000};

		if (evtimer_add(t, &tv) < 0 || event_base_loop(s->base, EVLOOP_ONCE) < 0)
			break;
	}
	if (t)
		event_free(t);
}

void status_page_stop(struct status_page *s)
{
	if (!s)
		return;
	wake_all(s, -1);
	linger(s);
	status_stacks_free(s->stk); /* answers its pending requests first */
	if (s->job_poll)
		event_free(s->job_poll);
	if (s->http)
		evhttp_free(s->http);
	free(s->final);
	status_job_free(s->job);
	status_drop_clear(&s->drop);
	free(s);
}
