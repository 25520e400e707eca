/* ctl.c: crunctl's side of the status pages (status.c): a bounded blocking
 * HTTP GET over libevent's evhttp client, and the tables crunctl prints from
 * the /status and /jobs JSON. Nothing here reads crun's private state: what
 * an operator's tool sees is exactly what the page serves.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

#include "agent/ctl.h"
#include "common/common.h"

#define CTL_MAX_BODY_BYTES   (4u << 20) /* a status page is a few KiB */
#define CTL_MAX_BEARER_BYTES 4096	/* a token: a secret file's bytes (store/auth.h) */

struct fetch {
	struct event_base *base;
	int status;
	char *body;
	bool done;
	int err; /* why there is no reply: a crun code */
};

static void on_reply(struct evhttp_request *req, void *arg)
{
	struct fetch *f = arg;
	struct evbuffer *b;
	size_t len;

	f->done = true;
	event_base_loopbreak(f->base);
	if (!req) /* on_error said why */
		return;
	f->status = evhttp_request_get_response_code(req);
	if (!f->status) /* the connection failed: tcp_probe() told why first */
		return;
	b = evhttp_request_get_input_buffer(req);
	len = evbuffer_get_length(b);
	if (len > CTL_MAX_BODY_BYTES)
		return;
	f->body = malloc(len + 1);
	if (!f->body)
		return;
	evbuffer_copyout(b, f->body, len);
	f->body[len] = '\0';
}

/* Runs before on_reply(NULL) when a reply was cut short or late. */
static void on_error(enum evhttp_request_error e, void *arg)
{
	struct fetch *f = arg;

	f->err = e == EVREQ_HTTP_TIMEOUT	 ? CRUN_ETIMEDOUT
		 : e == EVREQ_HTTP_DATA_TOO_LONG ? CRUN_ETOOBIG
		 : e == EVREQ_HTTP_EOF		 ? CRUN_ECLOSED
						 : CRUN_EPROTO;
}

/* What an operator must be told apart, a name that does not resolve, a page
 * that is not there (refused) and one that does not answer (timed out):
 * evhttp reports all of them as a request without a reply, so one plain
 * connect (tcp_probe) says which first, and gives the numeric address evhttp
 * then uses. */
static int ctl_request(const char *endpoint, enum evhttp_cmd_type cmd, const char *path,
		       const char *bearer, uint32_t timeout_ms, int *ret_status, char **ret_body)
{
	struct fetch f = {.err = CRUN_ECONNREFUSED}; /* gone since tcp_probe() */
	struct evhttp_connection *conn = NULL;
	struct evhttp_request *req;
	struct timeval tv = {.tv_sec = (time_t)(timeout_ms / 1000),
			     .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
	char host[256], addr[INET6_ADDRSTRLEN], hosthdr[300];
	uint16_t port;
	int r = CRUN_EINVAL;

	if (parse_host_port(endpoint, 0, host, sizeof(host), &port) < 0 || port == 0)
		return CRUN_EINVAL;
	TRY(tcp_probe(host, port, timeout_ms, addr, sizeof(addr)));
	f.base = event_base_new();
	if (!f.base)
		return CRUN_ENOMEM;
	r = CRUN_ENOMEM;
	conn = evhttp_connection_base_new(f.base, NULL, addr, port);
	if (!conn)
		goto out;
	evhttp_connection_set_timeout_tv(conn, &tv);
	evhttp_connection_set_max_body_size(conn, CTL_MAX_BODY_BYTES);
	evhttp_connection_set_retries(conn, 0);
	req = evhttp_request_new(on_reply, &f);
	if (!req)
		goto out;
	evhttp_request_set_error_cb(req, on_error);
	snprintf(hosthdr, sizeof(hosthdr), "%s", endpoint);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host", hosthdr);
	if (bearer) {
		char auth[CTL_MAX_BEARER_BYTES + 8];

		r = CRUN_ETOOBIG;
		if (str_printf(auth, sizeof(auth), "Bearer %s", bearer) < 0 ||
		    evhttp_add_header(evhttp_request_get_output_headers(req), "Authorization",
				      auth) < 0) {
			evhttp_request_free(req);
			goto out;
		}
		r = CRUN_ENOMEM;
	}
	if (evhttp_make_request(conn, req, cmd, path) < 0)
		goto out; /* the request was freed by libevent */
	/* The connection's own timeout ends the request; the loop only turns. */
	(void)event_base_dispatch(f.base);
	r = f.done && f.status ? 0 : f.err;
	if (r == 0 && !f.body)
		r = CRUN_ENOMEM;
	if (r == 0) {
		*ret_status = f.status;
		*ret_body = f.body;
		f.body = NULL;
	}
out:
	free(f.body);
	if (conn)
		evhttp_connection_free(conn);
	event_base_free(f.base);
	return r;
}

int agent_ctl_get(const char *endpoint, const char *path, uint32_t timeout_ms, int *ret_status,
		  char **ret_body)
{
	return ctl_request(endpoint, EVHTTP_REQ_GET, path, NULL, timeout_ms, ret_status, ret_body);
}

int agent_ctl_post(const char *endpoint, const char *path, const char *bearer, uint32_t timeout_ms,
		   int *ret_status, char **ret_body)
{
	return ctl_request(endpoint, EVHTTP_REQ_POST, path, bearer, timeout_ms, ret_status,
			   ret_body);
}

static const char *str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) ? v->valuestring : "-";
}

static void num(char *buf, size_t cap, const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	if (cJSON_IsNumber(v))
		snprintf(buf, cap, "%lld", (long long)v->valuedouble);
	else
		snprintf(buf, cap, "-");
}

/* The "rendezvous" object of /status: its line, the round's nodes with
 * their group ranks and addresses, the nodes waited for, the counters. */
static void print_rdzv(FILE *out, const cJSON *rz)
{
	const cJSON *n, *wf = cJSON_GetObjectItemCaseSensitive(rz, "waiting_for");
	char v[4][24];

	if (!cJSON_IsObject(rz))
		return;
	fprintf(out, "%s\n", str(rz, "line"));
	num(v[0], sizeof(v[0]), rz, "rounds_completed");
	num(v[1], sizeof(v[1]), rz, "rounds_abandoned");
	num(v[2], sizeof(v[2]), rz, "nodes_joined");
	num(v[3], sizeof(v[3]), rz, "nodes_lost");
	fprintf(out, "rounds %s completed, %s abandoned  nodes %s joined, %s lost\n", v[0], v[1],
		v[2], v[3]);
	if (cJSON_IsArray(wf) && cJSON_GetArraySize(wf) > 0) {
		fprintf(out, "waiting for:");
		cJSON_ArrayForEach(n, wf)
		{
			fprintf(out, " %s", cJSON_IsString(n) ? n->valuestring : "?");
		}
		fprintf(out, "\n");
	}
	fprintf(out, "%-10s %-24s %s\n", "GROUP_RANK", "HOST", "ADDR");
	cJSON_ArrayForEach(n, cJSON_GetObjectItemCaseSensitive(rz, "nodes"))
	{
		num(v[0], sizeof(v[0]), n, "group_rank");
		fprintf(out, "%-10s %-24s %s\n", v[0], str(n, "host"), str(n, "addr"));
	}
}

int agent_ctl_read_state(const char *json, struct agent_ctl_state *ret)
{
	cJSON *root = cJSON_Parse(json);
	const cJSON *v, *code;

	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return CRUN_EPROTO;
	}
	v = cJSON_GetObjectItemCaseSensitive(root, "version");
	code = cJSON_GetObjectItemCaseSensitive(root, "exit_code");
	ret->version = cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
	snprintf(ret->state, sizeof(ret->state), "%s",
		 cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "state"))
		     ? str(root, "state")
		     : "");
	ret->exit_code = cJSON_IsNumber(code) ? (int)code->valuedouble : -1;
	cJSON_Delete(root);
	return 0;
}

int agent_ctl_query(char *buf, size_t cap, const char *prefix, const char *value)
{
	size_t o = strlen(prefix);

	if (o >= cap)
		return CRUN_ETOOBIG;
	memcpy(buf, prefix, o);
	for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
		bool keep = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
			    (*p >= '0' && *p <= '9') || strchr("-._~", *p);

		if (o + (keep ? 1 : 3) >= cap)
			return CRUN_ETOOBIG;
		if (keep)
			buf[o++] = (char)*p;
		else
			o += (size_t)snprintf(buf + o, cap - o, "%%%02X", *p);
	}
	buf[o] = '\0';
	return 0;
}

bool agent_ctl_serves_job(const char *json, const char *run_id)
{
	cJSON *root = cJSON_Parse(json), *j;
	bool yes = root && strcmp(str(root, "run_id"), run_id) == 0;

	cJSON_ArrayForEach(j, cJSON_GetObjectItemCaseSensitive(root, "jobs"))
	{
		yes = yes || strcmp(str(j, "run_id"), run_id) == 0;
	}
	cJSON_Delete(root);
	return yes;
}

int agent_ctl_print_status(FILE *out, const char *json)
{
	cJSON *root = cJSON_Parse(json), *ws, *w;
	char restarts[24], maxr[24], grank[24], gws[24], world[24];

	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return CRUN_EPROTO;
	}
	num(restarts, sizeof(restarts), root, "restart_count");
	num(maxr, sizeof(maxr), root, "max_restarts");
	num(grank, sizeof(grank), root, "group_rank");
	num(gws, sizeof(gws), root, "group_world_size");
	num(world, sizeof(world), root, "world_size");
	if (!cJSON_GetObjectItemCaseSensitive(root, "run_id") &&
	    cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "jobs"))) {
		/* crun-rdzvd's page: its jobs (one: --rdzv_id) */
		cJSON_Delete(root);
		return agent_ctl_print_jobs(out, json);
	}
	if (!cJSON_GetObjectItemCaseSensitive(root, "role")) {
		/* a job as crun-rdzvd's store holds it: no agent's fields */
		fprintf(out, "job %s  backend %s  state %s\n", str(root, "run_id"),
			str(root, "rdzv_backend"), str(root, "state"));
		print_rdzv(out, cJSON_GetObjectItemCaseSensitive(root, "rendezvous"));
		cJSON_Delete(root);
		return 0;
	}
	fprintf(out, "job %s  role %s  host %s  backend %s\n", str(root, "run_id"),
		str(root, "role"), str(root, "host"), str(root, "rdzv_backend"));
	fprintf(out, "state %s  restarts %s/%s  node %s of %s  world size %s\n", str(root, "state"),
		restarts, maxr, grank, gws, world);
	print_rdzv(out, cJSON_GetObjectItemCaseSensitive(root, "rendezvous"));
	ws = cJSON_GetObjectItemCaseSensitive(root, "workers");
	fprintf(out, "%-6s %-6s %-8s %-8s %s\n", "RANK", "LOCAL", "PID", "STATE", "EXIT");
	cJSON_ArrayForEach(w, ws)
	{
		char rank[24], local[24], pid[24], code[24];

		num(rank, sizeof(rank), w, "global_rank");
		num(local, sizeof(local), w, "local_rank");
		num(pid, sizeof(pid), w, "pid");
		num(code, sizeof(code), w, "exit_code");
		fprintf(out, "%-6s %-6s %-8s %-8s %s\n", rank, local, pid, str(w, "state"), code);
	}
	cJSON_Delete(root);
	return 0;
}

int agent_ctl_print_jobs(FILE *out, const char *json)
{
	cJSON *root = cJSON_Parse(json), *jobs, *j;

	jobs = cJSON_GetObjectItemCaseSensitive(root, "jobs");
	if (!cJSON_IsArray(jobs)) {
		cJSON_Delete(root);
		return CRUN_EPROTO;
	}
	fprintf(out, "%-40s %-12s %-9s %-6s %s\n", "JOB", "STATE", "RESTARTS", "WORLD", "KEYS");
	cJSON_ArrayForEach(j, jobs)
	{
		char restarts[24], world[24], keys[24];

		num(restarts, sizeof(restarts), j, "restart_count");
		num(world, sizeof(world), j, "world_size");
		num(keys, sizeof(keys), j, "keys");
		fprintf(out, "%-40s %-12s %-9s %-6s %s\n", str(j, "run_id"), str(j, "state"),
			restarts, world, keys);
	}
	cJSON_Delete(root);
	return 0;
}
