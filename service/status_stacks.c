/* status_stacks.c: GET /stacks on a status page. An agent's page: every
 * local rank's stack now (?rank=R: one; the source captures them), or with
 * ?all=1 every rank of every node of its job, gathered through the job
 * board (rdzv.h) of the source's rendezvous. crun-rdzvd's
 * page: ?rdzv_id=J posts an ask into job J's keys of its own store (the
 * page shares the store's loop: a SET on the server's behalf wakes the
 * agents' watches) and collects the answers as they land. One gather at a
 * time per page, one capture per STACKS_MIN_GAP_MS; the request is answered
 * once every node answered, or after its wait: &wait_ms=N, by default
 * RDZV_BOARD_GATHER_MS (plus the local capture). A caller on a loaded
 * machine or store asks for a longer one (crunctl stacks --wait) rather
 * than read a node's silence as its absence.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "service/status_int.h"
#include "store/server.h"

/* crun-rdzvd looks for the answers this often: in-process key reads. */
#define STACKS_POLL_MS 20

struct status_stacks {
	struct event_base *base;	 /* borrowed */
	struct evhttp_request *req;	 /* the gather's request, NULL: none */
	const void *owner;		 /* a source's gather: its arg, else NULL */
	struct store_server *srv;	 /* borrowed: crun-rdzvd's gather, else NULL */
	struct event *timer;		 /* crun-rdzvd: looks for the answers */
	char job[RDZV_HOST_MAX];	 /* the job gathered */
	char prefix[RDZV_HOST_MAX + 32]; /* its keys, as its agents spell them */
	int nodes;
	int64_t ask;
	uint64_t deadline_ms;
	uint64_t last_ms; /* the last gather's start (rate limit) */
};

static void fail(struct evhttp_request *req, int code, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A plain-text error whose body says what to do (crunctl prints it). */
static void fail(struct evhttp_request *req, int code, const char *reason, const char *fmt, ...)
{
	struct evbuffer *b = evhttp_request_get_output_buffer(req);
	va_list ap;

	va_start(ap, fmt);
	evbuffer_add_vprintf(b, fmt, ap);
	va_end(ap);
	evbuffer_add(b, "\n", 1);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; charset=utf-8");
	evhttp_send_reply(req, code, reason, NULL);
}

/* One gather per STACKS_MIN_GAP_MS: each costs every node a capture. */
static bool limited(const struct status_stacks *ss, struct evhttp_request *req)
{
	if (!ss->last_ms || clock_now_ms() - ss->last_ms >= STACKS_MIN_GAP_MS)
		return false;
	evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "2");
	fail(req, 429, "Too Many Requests", "one gather of stacks per 2 s");
	return true;
}

static void on_close(struct evhttp_connection *conn, void *arg)
{
	struct status_stacks *ss = arg;

	(void)conn;
	ss->req = NULL; /* the client left: the gather ends unanswered */
}

/* Forgets the request (answered by the caller, or gone). */
static struct evhttp_request *take_req(struct status_stacks *ss)
{
	struct evhttp_request *req = ss->req;

	if (req)
		evhttp_connection_set_closecb(evhttp_request_get_connection(req), NULL, NULL);
	ss->req = NULL;
	ss->owner = NULL;
	ss->srv = NULL;
	if (ss->timer)
		evtimer_del(ss->timer);
	return req;
}

static void park(struct status_stacks *ss, struct evhttp_request *req)
{
	ss->req = req;
	ss->last_ms = clock_now_ms();
	evhttp_connection_set_closecb(evhttp_request_get_connection(req), on_close, ss);
}

static void answer(struct status_stacks *ss, int64_t ask, char *const *answers, int n)
{
	struct evhttp_request *req = take_req(ss);

	if (req)
		status_reply(req, 200, "text/plain; charset=utf-8",
			     stacks_job_text(ss->job, ask, answers, n));
}

/* ---- an agent's page: ?all=1 ---------------------------------------------------- */

static void on_gathered(int r, int64_t ask, char *const *answers, int n, void *arg)
{
	struct status_stacks *ss = arg;

	if (!ss->owner)
		return; /* the request went away, or another job was attached */
	if (r < 0) {
		struct evhttp_request *req = take_req(ss);

		if (req)
			fail(req, 503, "Service Unavailable", "no stacks gathered: %s",
			     crun_strerror(r));
		return;
	}
	answer(ss, ask, answers, n);
}

static void get_all(struct status_stacks *ss, struct evhttp_request *req,
		    const struct status_source *src, uint32_t wait_ms)
{
	char why[320];
	int r;

	if (limited(ss, req))
		return;
	snprintf(why, sizeof(why), "crunctl stacks --all on %s", src->host(src->arg));
	r = rdzv_stacks_gather(src->rdzv(src->arg), why, wait_ms, on_gathered, ss);
	if (r == CRUN_ENOTSUP) {
		fail(req, 404, "Not Found",
		     "no job board: a static or standalone job, or no round running (crunctl "
		     "stacks without --all prints this node's ranks)");
		return;
	}
	if (r < 0) {
		fail(req, 503, "Service Unavailable", "cannot gather the job's stacks now: %s",
		     crun_strerror(r));
		return;
	}
	snprintf(ss->job, sizeof(ss->job), "%s", src->run_id(src->arg));
	ss->owner = src->arg;
	park(ss, req);
}

/* ---- crun-rdzvd's page: ?rdzv_id=J ----------------------------------------------- */

/* A key of the job into buf, as its agents spell it. */
static int job_key(const struct status_stacks *ss, const char *key, char *buf, size_t cap)
{
	return str_printf(buf, cap, "%s%s", ss->prefix, key);
}

static char *peek_text(const struct store_server *srv, const char *key)
{
	const uint8_t *v;
	size_t len;
	char *out;

	if (store_server_peek(srv, (const uint8_t *)key, strlen(key), &v, &len) < 0)
		return NULL;
	out = malloc(len + 1);
	if (out) {
		memcpy(out, v, len);
		out[len] = '\0';
	}
	return out;
}

/* Every answer there, or the deadline: the reply. */
static void on_poll(evutil_socket_t fd, short what, void *arg)
{
	struct status_stacks *ss = arg;
	static const struct timeval tv = {.tv_usec = STACKS_POLL_MS * 1000};
	char **answers = calloc((size_t)ss->nodes, sizeof(*answers));
	char key[RDZV_HOST_MAX + 96], rel[64];
	int got = 0;

	(void)fd;
	(void)what;
	for (int g = 0; answers && g < ss->nodes; g++)
		if (rdzv_board_answer_key(rel, sizeof(rel), ss->ask, g) == 0 &&
		    job_key(ss, rel, key, sizeof(key)) >= 0)
			got += (answers[g] = peek_text(ss->srv, key)) != NULL;
	if (answers && got < ss->nodes && clock_now_ms() < ss->deadline_ms && ss->req &&
	    evtimer_add(ss->timer, &tv) == 0)
		goto out;
	if (!answers && ss->req)
		fail(take_req(ss), 500, "Internal Server Error", "out of memory");
	else
		answer(ss, ss->ask, answers, ss->nodes);
out:
	for (int g = 0; answers && g < ss->nodes; g++)
		free(answers[g]);
	free(answers);
}

/* Posts ask N (the counter moved on by one, then its record): what the
 * agents' ticket would write, in the same keys. */
static int post_ask(struct status_stacks *ss, char *err, size_t cap)
{
	char key[RDZV_HOST_MAX + 96], rel[64], num[24], *cur;
	int64_t n = 0;

	TRY(job_key(ss, RDZV_BOARD_ASKS, key, sizeof(key)));
	cur = peek_text(ss->srv, key);
	if (cur && parse_i64(cur, &n) < 0)
		n = 0;
	free(cur);
	if (n >= RDZV_BOARD_ASKS_MAX) {
		snprintf(err, cap, "job '%s' holds %d asks already (the job board's cap)", ss->job,
			 RDZV_BOARD_ASKS_MAX);
		return CRUN_ETOOBIG;
	}
	ss->ask = n + 1;
	snprintf(num, sizeof(num), "%" PRId64, ss->ask);
	TRY(store_server_put(ss->srv, (const uint8_t *)key, strlen(key), (const uint8_t *)num,
			     strlen(num)));
	TRY(rdzv_board_ask_key(rel, sizeof(rel), ss->ask));
	TRY(job_key(ss, rel, key, sizeof(key)));
	return store_server_put(ss->srv, (const uint8_t *)key, strlen(key),
				(const uint8_t *)"crunctl stacks --job via crun-rdzvd",
				strlen("crunctl stacks --job via crun-rdzvd"));
}

static void get_job(struct status_stacks *ss, struct evhttp_request *req, struct store_server *srv,
		    const char *job, uint32_t wait_ms)
{
	static const struct timeval now = {0, 0};
	const char *state = "";
	char err[320] = "";
	int r;

	r = status_store_job_round(srv, job, ss->prefix, sizeof(ss->prefix), &ss->nodes, &state);
	if (r == CRUN_ENOTFOUND) {
		fail(req, 404, "Not Found", "no job '%s' in this store (crunctl jobs lists them)",
		     job);
		return;
	}
	if (r < 0 || strcmp(state, "running") != 0 || ss->nodes <= 0) {
		fail(req, 409, "Conflict", "job '%s' has no running round (state: %s)", job,
		     r < 0 ? crun_strerror(r) : state);
		return;
	}
	if (limited(ss, req))
		return;
	snprintf(ss->job, sizeof(ss->job), "%s", job);
	ss->srv = srv;
	r = post_ask(ss, err, sizeof(err));
	if (r < 0) {
		ss->srv = NULL;
		fail(req, r == CRUN_ETOOBIG ? 507 : 500, "Error", "%s",
		     err[0] ? err : crun_strerror(r));
		return;
	}
	ss->deadline_ms = clock_now_ms() + rdzv_board_wait_ms(wait_ms);
	park(ss, req);
	if (evtimer_add(ss->timer, &now) < 0)
		fail(take_req(ss), 500, "Internal Server Error", "cannot arm a timer");
}

/* ---- the page's entry --------------------------------------------------------------- */

/* The local ranks (?rank=R: one), as before the job board. */
static void get_local(struct evhttp_request *req, const struct status_source *src, const char *rv)
{
	int64_t rank = -1;
	char *body = NULL;
	int r;

	if (rv && parse_i64(rv, &rank) < 0) {
		evhttp_send_error(req, HTTP_BADREQUEST, "rank: not a number");
		return;
	}
	r = src->stacks(src->arg, rank < 0 || rank > INT32_MAX ? -1 : (int)rank, &body);
	if (r == CRUN_EAGAIN) {
		evhttp_add_header(evhttp_request_get_output_headers(req), "Retry-After", "2");
		evhttp_send_error(req, 429, "one stack capture per 2 s");
	} else if (r < 0) {
		evhttp_send_error(req, HTTP_NOTFOUND, "no running worker");
	} else {
		status_reply(req, 200, "text/plain; charset=utf-8", body);
	}
}

void status_stacks_get(struct status_stacks *ss, struct evhttp_request *req, const char *query,
		       const struct status_source *src, struct store_server *srv)
{
	struct evkeyvalq q = {0};
	const char *all = NULL, *job = NULL, *rv = NULL, *wv = NULL;
	uint64_t wait_ms = 0;

	if (query && evhttp_parse_query_str(query, &q) == 0) {
		all = evhttp_find_header(&q, "all");
		job = evhttp_find_header(&q, "rdzv_id");
		rv = evhttp_find_header(&q, "rank");
		wv = evhttp_find_header(&q, "wait_ms");
	}
	if (wv &&
	    (parse_u64(wv, &wait_ms) < 0 || wait_ms == 0 || wait_ms > RDZV_BOARD_GATHER_MAX_MS)) {
		fail(req, 400, "Bad Request", "wait_ms: expected 1 to %u milliseconds, got '%s'",
		     RDZV_BOARD_GATHER_MAX_MS, wv);
	} else if (src && !all) {
		get_local(req, src, rv);
	} else if ((src && !src->rdzv(src->arg)) || (!src && !job)) {
		fail(req, 400, "Bad Request",
		     src ? "no rendezvous yet" : "crun-rdzvd's page: GET /stacks?rdzv_id=JOB");
	} else if (ss->req) {
		fail(req, 503, "Service Unavailable", "a gather of stacks is running: try again");
	} else if (src) {
		get_all(ss, req, src, (uint32_t)wait_ms);
	} else {
		get_job(ss, req, srv, job, (uint32_t)wait_ms);
	}
	evhttp_clear_headers(&q);
}

int status_stacks_new(struct event_base *base, struct status_stacks **ret)
{
	struct status_stacks *ss = calloc(1, sizeof(*ss));

	if (!ss)
		return CRUN_ENOMEM;
	ss->base = base;
	ss->timer = evtimer_new(base, on_poll, ss);
	if (!ss->timer) {
		free(ss);
		return CRUN_ENOMEM;
	}
	*ret = ss;
	return 0;
}

void status_stacks_attach(struct status_stacks *ss, const void *owner)
{
	struct evhttp_request *req = ss && ss->owner && ss->owner != owner ? take_req(ss) : NULL;

	if (req)
		fail(req, 503, "Service Unavailable", "the agent went away");
}

void status_stacks_free(struct status_stacks *ss)
{
	struct evhttp_request *req;

	if (!ss)
		return;
	req = take_req(ss);
	if (req)
		fail(req, 503, "Service Unavailable", "the page is closing");
	event_free(ss->timer);
	free(ss);
}
