/* status.c: the agent's status page over libevent's evhttp (--status
 * ADDR:PORT): GET /healthz, GET /status and /jobs (JSON) and GET /metrics (Prometheus
 * text exposition format 0.0.4, crun_ prefix). The JSON and metrics bodies
 * are built by pure functions from the agent's state, so tests can check
 * them without a socket.
 */
#include <inttypes.h>
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

#include "agent/agent.h"
#include "agent/nodecheck_int.h"
#include "agent/stacks_int.h"
#include "rendezvous/rdzv.h"
#include "agent/status_int.h"
#include "store/auth.h"
#include "store/server.h"
#include "common/common.h"

#define STATUS_MAX_HEADERS_BYTES 8192 /* a status client sends a GET line and a few headers */

#define STATUS_EXIT_CODES 256 /* codes 0..255; anything else counts as 255 */

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
	struct agent_status *s;	    /* borrowed back-pointer */
	struct evhttp_request *req; /* NULL: the slot is free */
	struct event *timer;
	char *job;	      /* owned: the run id watched, NULL on an agent's page */
	uint64_t job_version; /* the view the watcher has */
};

struct agent_status {
	struct evhttp *http;
	struct event_base *base; /* borrowed */
	/* Agent state changes so far; the body carries it as "version", and a
	 * watcher asks for the next one with ?after=VERSION (crunctl watch). */
	uint64_t version;
	char *final; /* the body at DONE, served from then on: the job's end */
	/* Watchers told a state short of the end, not yet back for the next:
	 * a closing page waits for them until owed_until_ms. */
	int owed;
	uint64_t owed_until_ms;
	struct status_hold held[STATUS_MAX_HELD];
	struct event *job_poll; /* while a job watcher is parked (crun-rdzvd) */
	/* Worker exits by code over the agent's life, counted when an attempt
	 * ends (agent_status_on_state); last is the previous public state. */
	uint64_t exits[STATUS_EXIT_CODES];
	crun_agent_state_t last;
	struct crun_agent *agent;	  /* borrowed, NULL until attached */
	const struct store_server *store; /* borrowed: crun-rdzvd's server, or NULL */
	struct store_server *board_store; /* the same, writable: GET /stacks?rdzv_id= */
	struct status_stacks *stk;	  /* GET /stacks: its gathers (status_stacks.c) */
	/* POST /drop (agent_status_allow_drop): the same server, writable, and
	 * the token a request must carry; NULL: /drop is off. */
	struct store_server *drop_store; /* borrowed */
	char *token;			 /* owned, NUL-terminated */
	size_t token_len;
	uint64_t started_ms;
	char addr[300];
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

/* The store servers a page shows, by the store="..." label. */
enum status_store { STATUS_STORE_RENDEZVOUS, STATUS_STORE_WORKER, STATUS_STORE__MAX };
static const char *const status_store_kind[STATUS_STORE__MAX] = {"rendezvous", "worker"};

/* srv: crun-rdzvd's server (its page has no agent); an agent's page has its
 * worker store and, when it serves the c10d endpoint, the rendezvous store. */
static const struct store_server *served_store(const struct crun_agent *a,
					       const struct store_server *srv, enum status_store k)
{
	if (k == STATUS_STORE_RENDEZVOUS)
		return srv ? srv : a && a->rdzv ? rdzv_served_store(a->rdzv) : NULL;
	return srv || !a ? NULL : a->store;
}

static void store_json(cJSON *o, const struct store_server *srv)
{
	struct store_server_stats st;

	if (!o)
		return;
	store_server_get_stats(srv, &st);
	cJSON_AddNumberToObject(o, "port", store_server_port(srv));
	cJSON_AddNumberToObject(o, "connections", (double)st.conns);
	cJSON_AddNumberToObject(o, "keys", (double)st.keys);
	cJSON_AddNumberToObject(o, "value_bytes", (double)st.value_bytes);
	cJSON_AddNumberToObject(o, "waiters", (double)st.waiters);
	cJSON_AddNumberToObject(o, "requests", (double)st.requests);
	cJSON_AddNumberToObject(o, "dropped_connections", (double)st.dropped_conns);
	cJSON_AddNumberToObject(o, "leases_expired",
				(double)store_server_metric(srv, STORE_M_LEASE_EXPIRED));
	cJSON_AddNumberToObject(o, "leases_released",
				(double)store_server_metric(srv, STORE_M_LEASE_RELEASED));
}

static cJSON *status_tree(const struct crun_agent *a, const struct store_server *srv)
{
	cJSON *root = cJSON_CreateObject(), *ws, *stores;

	if (!root)
		return NULL;
	cJSON_AddBoolToObject(root, "ok", 1);
	if (srv || (a && a->store))
		store_json(cJSON_AddObjectToObject(root, "store"), srv ? srv : a->store);
	/* Every store served here by its role: crun-rdzvd's, an agent's
	 * worker store and, on a self-hosted c10d agent, the rendezvous store
	 * it serves to its peers (their leases live there, not in "store"). */
	stores = NULL;
	for (int k = 0; k < STATUS_STORE__MAX; k++) {
		const struct store_server *ss = served_store(a, srv, (enum status_store)k);

		if (ss && !stores)
			stores = cJSON_AddObjectToObject(root, "stores");
		if (ss && stores)
			store_json(cJSON_AddObjectToObject(stores, status_store_kind[k]), ss);
	}
	/* crun-rdzvd's page: no job of its own, the jobs its store holds (one
	 * of them: ?rdzv_id=ID or /jobs/ID). */
	if (!a && srv) {
		cJSON *jobs = cJSON_AddArrayToObject(root, "jobs");

		if (jobs)
			status_store_jobs(jobs, srv);
	}
	if (a) {
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
		for (int i = 0; ws && a->workers && i < a->nworkers; i++) {
			const struct worker *w = &a->workers[i];
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
	}
	return root;
}

char *agent_status_json(const struct crun_agent *a, const struct store_server *srv)
{
	return status_print_tree(status_tree(a, srv));
}

/* The page's /status body: its version, and at a state change (st >= 0)
 * the state the agent is entering (on_state runs before the agent's own
 * state moves), with the agent's exit code at the end. */
static char *status_body(const struct agent_status *s, int st)
{
	static const enum agent_state internal[] = {[CRUN_AGENT_RENDEZVOUS] = AS_RENDEZVOUS,
						    [CRUN_AGENT_RUNNING] = AS_RUNNING,
						    [CRUN_AGENT_STOPPING] = AS_STOPPING,
						    [CRUN_AGENT_BARRIER] = AS_BARRIER,
						    [CRUN_AGENT_DONE] = AS_DONE};
	cJSON *root;

	if (s->final)
		return str_dup(s->final);
	root = status_tree(s->agent, s->store);
	if (root && s->agent) {
		cJSON_AddNumberToObject(root, "version", (double)s->version);
		if (st >= 0 && (unsigned)st < ARRAY_SIZE(internal))
			cJSON_ReplaceItemInObjectCaseSensitive(
			    root, "state", cJSON_CreateString(agent_state_name(internal[st])));
		if (st == CRUN_AGENT_DONE)
			cJSON_AddNumberToObject(root, "exit_code", s->agent->exit_code);
	}
	return status_print_tree(root);
}

char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv)
{
	cJSON *root = cJSON_CreateObject(), *jobs, *j;
	char *out;

	if (!root)
		return NULL;
	jobs = cJSON_AddArrayToObject(root, "jobs");
	if (!a && srv && jobs)
		status_store_jobs(jobs, srv);
	if (a && jobs && (j = cJSON_CreateObject())) {
		cJSON_AddStringToObject(j, "run_id", a->run_id);
		cJSON_AddStringToObject(j, "role", a->role);
		cJSON_AddStringToObject(j, "state", agent_state_name(a->state));
		cJSON_AddNumberToObject(j, "restart_count", a->restart_count);
		if (a->rdzv && a->state == AS_RUNNING)
			cJSON_AddNumberToObject(j, "world_size", rdzv_info(a->rdzv)->world_size);
		cJSON_AddItemToArray(jobs, j);
	}
	out = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	return out;
}

/* Prometheus label values escape \, " and newline (exposition format 0.0.4). */
static void label(FILE *f, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fputc('\\', f);
		if (*v == '\n') {
			fputs("\\n", f);
			continue;
		}
		fputc(*v, f);
	}
}

static void gauge(FILE *f, const char *name, const char *help, const char *type)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The store server's gauges and counters (crun-rdzvd's, or the store this
 * agent serves): one row per field of struct store_server_stats. */
static const struct {
	const char *name, *type, *help;
	size_t off;
} store_rows[] = {
#define ROW(name, type, field, help)                                         \
	{                                                                    \
		name, type, help, offsetof(struct store_server_stats, field) \
	}
    ROW("crun_store_connections", "gauge", conns, "client connections open"),
    ROW("crun_store_keys", "gauge", keys, "keys held"),
    ROW("crun_store_value_bytes", "gauge", value_bytes, "bytes of the values held"),
    ROW("crun_store_waiters", "gauge", waiters, "clients blocked in WAIT"),
    ROW("crun_store_requests_total", "counter", requests, "requests served"),
    ROW("crun_store_dropped_connections_total", "counter", dropped_conns,
	"connections refused or closed for bad or over-limit input"),
    ROW("crun_store_entries", "gauge", entries, "keys with a value, a queue or a registration"),
    ROW("crun_store_key_bytes", "gauge", key_bytes, "bytes of those keys"),
    ROW("crun_store_registrations", "gauge", registrations, "waits and watches registered"),
    ROW("crun_store_input_bytes", "gauge", input_bytes, "unprocessed input, all connections"),
    ROW("crun_store_output_bytes", "gauge", output_bytes, "unsent output, all connections"),
#undef ROW
};

/* Issue 26: what each job holds and how often its writes were refused, by
 * budget; at most STORE_SHARE_MAX_JOBS + 1 jobs, so the series are bounded. */
struct share_rows {
	FILE *f;
	const char *kind;
	bool refused; /* the pass: refusals (jobs with any) or holdings */
};

static void share_row(const struct store_share_info *si, void *arg)
{
	const struct share_rows *sr = arg;
	uint64_t any = 0;

	for (int b = 0; b < STORE_B__MAX; b++)
		any |= si->refused[b];
	if (sr->refused && !any)
		return;
	for (int b = 0; b < STORE_B__MAX; b++) {
		fprintf(sr->f, "%s{store=\"%s\",job=\"",
			sr->refused ? "crun_store_refused_total" : "crun_store_job_used", sr->kind);
		label(sr->f, si->job);
		fprintf(sr->f, "\",budget=\"%s\"} %" PRIu64 "\n",
			store_budget_name((enum store_budget)b),
			sr->refused ? si->refused[b] : si->used[b]);
	}
}

/* Both passes (holdings, then refusals) run over every served store (ss[k]
 * NULL: not served here), so each family's HELP/TYPE comes once, before all
 * its samples. */
static void share_metrics(FILE *f, const struct store_server *const *ss)
{
	static const char *const help[2][3] = {
	    {"crun_store_job_used",
	     "what one job (run id; \"\" no known job) holds of each shared budget", "gauge"},
	    {"crun_store_refused_total",
	     "writes refused because a budget or the job's or connection's share was full, by "
	     "job and budget",
	     "counter"},
	};

	for (int pass = 0; pass < 2; pass++) {
		struct share_rows sr = {f, NULL, pass == 1};

		gauge(f, help[pass][0], help[pass][1], help[pass][2]);
		for (int k = 0; k < STATUS_STORE__MAX; k++) {
			sr.kind = status_store_kind[k];
			if (ss[k])
				store_server_each_share(ss[k], share_row, &sr);
		}
	}
}

/* Every store served here (served_store), each sample labelled store="..."
 * by its role, so one query does not add the two up; a family's HELP/TYPE
 * comes once, before all its samples (the exposition format wants that). */
static void store_metrics(FILE *f, const struct crun_agent *a, const struct store_server *srv)
{
	const struct store_server *ss[STATUS_STORE__MAX];
	struct store_server_stats st[STATUS_STORE__MAX];
	int k, n = 0;

	for (k = 0; k < STATUS_STORE__MAX; k++) {
		ss[k] = served_store(a, srv, (enum status_store)k);
		if (!ss[k])
			continue;
		store_server_get_stats(ss[k], &st[k]);
		n++;
	}
	if (!n)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(store_rows); i++) {
		gauge(f, store_rows[i].name, store_rows[i].help, store_rows[i].type);
		for (k = 0; k < STATUS_STORE__MAX; k++)
			if (ss[k])
				fprintf(
				    f, "%s{store=\"%s\"} %" PRIu64 "\n", store_rows[i].name,
				    status_store_kind[k],
				    *(const uint64_t *)((const char *)&st[k] + store_rows[i].off));
	}
	gauge(f, "crun_store_ops_total", "requests served by operation", "counter");
	for (k = 0; k < STATUS_STORE__MAX; k++)
		for (int op = 0; ss[k] && op < STORE_OP__MAX; op++)
			fprintf(f, "crun_store_ops_total{store=\"%s\",op=\"%s\"} %" PRIu64 "\n",
				status_store_kind[k], store_proto_op_name((enum store_op)op),
				store_server_op_count(ss[k], (enum store_op)op));
	/* The server's own table of refusals and limit hits, one label each. */
	gauge(f, "crun_store_events_total",
	      "connections accepted, refused or dropped, backpressure pauses, and leases "
	      "expired or released, by reason",
	      "counter");
	for (k = 0; k < STATUS_STORE__MAX; k++)
		for (int m = 0; ss[k] && m < STORE_M__MAX; m++)
			fprintf(f,
				"crun_store_events_total{store=\"%s\",event=\"%s\"} %" PRIu64 "\n",
				status_store_kind[k], store_metric_name((enum store_metric)m),
				store_server_metric(ss[k], (enum store_metric)m));
	share_metrics(f, ss);
}

/* The rendezvous's round and its counters (one table: RDZV_COUNTER_MAP). */
static void rdzv_metrics(FILE *f, const struct rdzv *r)
{
	struct rdzv_progress *p = malloc(sizeof(*p));
	char name[96];

	if (!p)
		return;
	rdzv_get_progress(r, p);
	gauge(f, "crun_rdzv_round", "the round waited in, or the last completed (-1: none)",
	      "gauge");
	fprintf(f, "crun_rdzv_round %d\n", p->round);
	gauge(f, "crun_rdzv_waiting", "1 while this node waits for a round to complete", "gauge");
	fprintf(f, "crun_rdzv_waiting %d\n", p->waiting ? 1 : 0);
	gauge(f, "crun_rdzv_nodes", "nodes joined to the round waited in, or of the last completed",
	      "gauge");
	fprintf(f, "crun_rdzv_nodes %d\n", p->joined);
	for (int c = 0; c < RDZV_C__MAX; c++) {
		snprintf(name, sizeof(name), "crun_rdzv_%s_total",
			 rdzv_counter_name((enum rdzv_counter)c));
		gauge(f, name, rdzv_counter_help((enum rdzv_counter)c), "counter");
		fprintf(f, "%s %" PRIu64 "\n", name, p->counters[c]);
	}
	free(p);
}

char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const uint64_t *exits, uint64_t uptime_ms)
{
	char *s = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&s, &len);
	const char *prog;

	if (!f)
		return NULL;
	/* srv: crun-rdzvd's page, which is no agent (sum(crun_agent_up) counts
	 * agents); an agent's page has its own store through a. */
	prog = srv ? "rdzvd" : "agent";
	fprintf(f, "# HELP crun_%s_up 1 while the %s serves this page\n# TYPE crun_%s_up gauge\n",
		prog, prog, prog);
	fprintf(f, "crun_%s_up 1\n", prog);
	fprintf(f,
		"# HELP crun_%s_uptime_seconds seconds since the status page started\n"
		"# TYPE crun_%s_uptime_seconds gauge\ncrun_%s_uptime_seconds %.3f\n",
		prog, prog, prog, (double)uptime_ms / 1000.0);
	if (a) {
		int running = 0, exited = 0;

		gauge(f, "crun_agent_info", "the agent's job (labels), always 1", "gauge");
		fputs("crun_agent_info{run_id=\"", f);
		label(f, a->run_id);
		fputs("\",role=\"", f);
		label(f, a->role);
		fputs("\",host=\"", f);
		label(f, a->host);
		fputs("\"} 1\n", f);
		gauge(f, "crun_agent_state", "1 for the agent's current state", "gauge");
		for (int st = AS_INIT; st < AS__MAX; st++)
			fprintf(f, "crun_agent_state{state=\"%s\"} %d\n",
				agent_state_name((enum agent_state)st), (int)a->state == st);
		gauge(f, "crun_agent_restarts_total", "worker group restarts so far", "counter");
		fprintf(f, "crun_agent_restarts_total %d\n", a->restart_count);
		gauge(f, "crun_agent_max_restarts", "restarts allowed (--max_restarts)", "gauge");
		fprintf(f, "crun_agent_max_restarts %d\n", a->cfg.max_restarts);
		gauge(f, "crun_agent_group_rank", "this node's rank in the current round", "gauge");
		fprintf(f, "crun_agent_group_rank %d\n", a->group_rank);
		for (int i = 0; a->workers && i < a->nworkers; i++) {
			running += a->workers[i].state == W_RUNNING;
			exited += a->workers[i].state == W_EXITED;
		}
		gauge(f, "crun_agent_workers", "workers of the current attempt by state", "gauge");
		fprintf(f, "crun_agent_workers{state=\"running\"} %d\n", running);
		fprintf(f, "crun_agent_workers{state=\"exited\"} %d\n", exited);
		gauge(f, "crun_agent_worker_exit_code",
		      "exit code of each exited worker of the current attempt", "gauge");
		for (int i = 0; a->workers && i < a->nworkers; i++)
			if (a->workers[i].state == W_EXITED)
				fprintf(f, "crun_agent_worker_exit_code{local_rank=\"%d\"} %d\n",
					a->workers[i].local_rank, a->workers[i].exit_code);
	}
	if (a && a->rdzv)
		rdzv_metrics(f, a->rdzv);
	if (a)
		nodecheck_metrics(f, a);
	if (a && exits) {
		gauge(f, "crun_agent_worker_exits_total",
		      "workers of finished attempts by exit code (128+N: signal N)", "counter");
		for (int code = 0; code < STATUS_EXIT_CODES; code++)
			if (exits[code] || code == 0)
				fprintf(f,
					"crun_agent_worker_exits_total{code=\"%d\"} %" PRIu64 "\n",
					code, exits[code]);
	}
	store_metrics(f, a, srv);
	if (fclose(f) != 0) {
		free(s);
		return NULL;
	}
	return s;
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
 * a next request, which a closing page waits for (agent_status_stop). */
static void answer_watcher(struct agent_status *s, struct evhttp_request *req, int st)
{
	struct evhttp_connection *conn = evhttp_request_get_connection(req);
	struct bufferevent *bev = evhttp_connection_get_bufferevent(conn);

	status_reply(req, 200, "application/json", status_body(s, st));
	if (s->agent && !s->final && st != CRUN_AGENT_DONE) {
		s->owed++;
		s->owed_until_ms = clock_now_ms() + STATUS_LINGER_MS;
	}
	(void)evbuffer_write(bufferevent_get_output(bev), bufferevent_getfd(bev));
}

/* A job watcher's answer: the job as it is now, or 404 once the store
 * holds no round of it (a restarted crun-rdzvd). */
static void answer_job(struct agent_status *s, struct evhttp_request *req, const char *run_id)
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

/* st: the state being entered, or -1 (the agent's own). */
static void wake_all(struct agent_status *s, int st)
{
	for (int i = 0; i < STATUS_MAX_HELD; i++)
		if (s->held[i].req)
			hold_answer(&s->held[i], st);
}

/* Every STATUS_JOB_POLL_MS while job watchers are parked: answers those
 * whose job changed (or vanished); stops when none is left. */
static void job_poll_on_timer(evutil_socket_t fd, short what, void *arg)
{
	struct agent_status *s = arg;
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

static bool hold(struct agent_status *s, struct evhttp_request *req, uint64_t wait_ms,
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
static void get_store_job(struct agent_status *s, struct evhttp_request *req, const char *run_id,
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
static void get_status(struct agent_status *s, struct evhttp_request *req, const char *query)
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
	if (job && s->store && !s->agent) {
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
	if (!s->agent || s->final || version != s->version)
		answer_watcher(s, req, -1);
	else if (!hold(s, req, wait_ms, NULL, 0))
		evhttp_send_error(req, 503, "too many watchers");
}

/* GET /jobs/ID: ID percent-decoded (a run id may hold any byte but '/'). */
static void get_store_job_path(struct agent_status *s, struct evhttp_request *req, const char *raw)
{
	char *id = evhttp_uridecode(raw, 0, NULL);

	if (!id) {
		evhttp_send_error(req, HTTP_INTERNAL, "out of memory");
		return;
	}
	get_store_job(s, req, id, 0, 0);
	free(id);
}

/* Whether req carries "Authorization: Bearer <token>"; constant time in
 * the token's bytes, so the answer's timing does not leak a prefix. */
static bool bearer_ok(const struct agent_status *s, struct evhttp_request *req)
{
	const char *h = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
	unsigned char diff = 0;
	size_t n;

	if (!h || strncmp(h, "Bearer ", 7) != 0)
		return false;
	h += 7;
	n = strlen(h);
	if (n != s->token_len)
		return false;
	for (size_t i = 0; i < n; i++)
		diff |= (unsigned char)(h[i] ^ s->token[i]);
	return diff == 0;
}

/* {"job": J, "dropped_keys": n}, malloc'd; NULL on OOM. */
static char *drop_body(const char *job, uint64_t n)
{
	cJSON *o = cJSON_CreateObject();
	char *out = NULL;

	if (o && cJSON_AddStringToObject(o, "job", job) &&
	    cJSON_AddNumberToObject(o, "dropped_keys", (double)n))
		out = cJSON_PrintUnformatted(o);
	cJSON_Delete(o);
	return out;
}

/* POST /drop?job=J (crunctl drop --job J): an operator's way out after a
 * flood - job J's keys go, as DELETE_KEY would delete them. Off (403)
 * unless crun-rdzvd was given --admin-token-file; a request without that
 * token is refused (401) and logged. */
static void post_drop(struct agent_status *s, struct evhttp_request *req, const char *query)
{
	struct evkeyvalq q = {0};
	const char *job = NULL;
	uint64_t n = 0;
	int r;

	if (!s->drop_store) {
		evhttp_send_error(req, 403,
				  "drop is off: crun-rdzvd --admin-token-file turns it on");
		return;
	}
	if (!bearer_ok(s, req)) {
		log_at(LL_WARN, SUB_AGENT, "refusing a drop from %s: no or wrong admin token",
		       evhttp_request_get_host(req) ? evhttp_request_get_host(req) : "?");
		evhttp_send_error(req, 401, "the admin token is missing or wrong");
		return;
	}
	if (query && evhttp_parse_query_str(query, &q) == 0)
		job = evhttp_find_header(&q, "job");
	if (!job) {
		evhttp_clear_headers(&q);
		evhttp_send_error(req, HTTP_BADREQUEST, "drop needs ?job=RUN_ID");
		return;
	}
	r = store_server_drop_job(s->drop_store, job, &n);
	if (r == CRUN_ENOTFOUND) {
		evhttp_clear_headers(&q);
		evhttp_send_error(req, HTTP_NOTFOUND, "the job holds no keys");
		return;
	}
	if (r == 0)
		log_at(LL_WARN, SUB_AGENT,
		       "dropped %" PRIu64 " keys of job '%s' (an operator's drop)", n, job);
	if (r < 0)
		evhttp_send_error(req, HTTP_INTERNAL, crun_strerror(r));
	else
		status_reply(req, 200, "application/json", drop_body(job, n));
	evhttp_clear_headers(&q); /* job points into it */
}

static void on_request(struct evhttp_request *req, void *arg)
{
	struct agent_status *s = arg;
	const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
	const char *path = uri ? evhttp_uri_get_path(uri) : NULL;

	if (path && evhttp_request_get_command(req) == EVHTTP_REQ_POST &&
	    strcmp(path, "/drop") == 0) {
		post_drop(s, req, evhttp_uri_get_query(uri));
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
		status_reply(req, 200, "application/json",
			     agent_status_jobs_json(s->agent, s->store));
	else if (strncmp(path, "/jobs/", 6) == 0 && path[6] && s->store && !s->agent)
		get_store_job_path(s, req, path + 6);
	else if (strcmp(path, "/stacks") == 0 && (s->agent || s->board_store))
		status_stacks_get(s->stk, req, evhttp_uri_get_query(uri), s->agent, s->board_store);
	else if (strcmp(path, "/usage") == 0 && s->store)
		status_reply(req, 200, "application/json", agent_status_usage_json(s->store));
	else if (strcmp(path, "/metrics") == 0)
		status_reply(req, 200, "text/plain; version=0.0.4; charset=utf-8",
			     agent_status_metrics(s->agent, s->store, s->exits,
						  clock_now_ms() - s->started_ms));
	else
		evhttp_send_error(req, HTTP_NOTFOUND, "try /healthz, /status, /jobs or /metrics");
}

int agent_status_start(struct event_base *base, const char *listen, struct agent_status **ret)
{
	struct agent_status *s = calloc(1, sizeof(*s));
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
	s->started_ms = clock_now_ms();
	log_at(LL_INFO, SUB_AGENT, "status page on http://%s/status", s->addr);
	*ret = s;
	return 0;
fail:
	agent_status_stop(s);
	return r;
}

void agent_status_on_state(struct agent_status *s, crun_agent_state_t st)
{
	const struct crun_agent *a = s ? s->agent : NULL;

	if (!a)
		return;
	/* An attempt is over when the agent leaves RUNNING or STOPPING for a new
	 * round, the exit barrier or the end; the workers still hold their exit
	 * codes then (the next attempt resets them). */
	if ((s->last == CRUN_AGENT_RUNNING || s->last == CRUN_AGENT_STOPPING) &&
	    (st == CRUN_AGENT_RENDEZVOUS || st == CRUN_AGENT_BARRIER || st == CRUN_AGENT_DONE))
		for (int i = 0; a->workers && i < a->nworkers; i++)
			if (a->workers[i].state == W_EXITED)
				s->exits[MIN((unsigned)a->workers[i].exit_code,
					     STATUS_EXIT_CODES - 1u)]++;
	s->last = st;
	s->version++;
	if (st == CRUN_AGENT_DONE)
		s->final = status_body(s, st); /* NULL (OOM): the live page */
	wake_all(s, st);
}

void agent_status_attach(struct agent_status *s, struct crun_agent *a)
{
	if (!s)
		return;
	status_stacks_attach(s->stk, a);
	s->agent = a;
}

void agent_status_attach_store(struct agent_status *s, struct store_server *srv)
{
	if (s) {
		s->store = srv;
		s->board_store = srv;
	}
}

const char *agent_status_addr(const struct agent_status *s)
{
	return s->addr;
}

static void linger_on_timer(evutil_socket_t fd, short what, void *arg)
{
}

/* A page its program closes after the agent is gone (detached: nothing of
 * the agent's is left on the loop) turns the loop until every watcher it
 * owes has been back for the final body, or the bound passes. */
static void linger(struct agent_status *s)
{
	struct event *t = s->owed && !s->agent ? evtimer_new(s->base, linger_on_timer, NULL) : NULL;

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

void agent_status_stop(struct agent_status *s)
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
	free(s->token);
	free(s);
}

int agent_status_allow_drop(struct agent_status *s, struct store_server *srv,
			    const struct store_auth_secret *token)
{
	char *t;

	/* It travels in a header: no NUL, CR, LF or other control byte. */
	for (size_t i = 0; i < token->len; i++)
		if (token->bytes[i] < 0x20 || token->bytes[i] == 0x7f)
			return CRUN_EINVAL;
	t = malloc(token->len + 1);
	if (!t)
		return CRUN_ENOMEM;
	memcpy(t, token->bytes, token->len);
	t[token->len] = '\0';
	free(s->token);
	s->token = t;
	s->token_len = token->len;
	s->drop_store = srv;
	return 0;
}
