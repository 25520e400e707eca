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

#include "agent/agent.h"
#include "common/common.h"

#define CTL_MAX_BODY_BYTES (4u << 20) /* a status page is a few KiB */

struct fetch {
	struct event_base *base;
	int status;
	char *body;
	bool done;
};

static void on_reply(struct evhttp_request *req, void *arg)
{
	struct fetch *f = arg;
	struct evbuffer *b;
	size_t len;

	f->done = true;
	event_base_loopbreak(f->base);
	if (!req) /* connection refused, reset or timed out */
		return;
	f->status = evhttp_request_get_response_code(req);
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

int agent_ctl_get(const char *endpoint, const char *path, uint32_t timeout_ms, int *ret_status,
		  char **ret_body)
{
	struct fetch f = {0};
	struct evhttp_connection *conn = NULL;
	struct evhttp_request *req;
	struct timeval tv = {.tv_sec = (time_t)(timeout_ms / 1000),
			     .tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000};
	char host[256], hosthdr[300];
	uint16_t port;
	int r = CRUN_EINVAL;

	if (parse_host_port(endpoint, 0, host, sizeof(host), &port) < 0 || port == 0)
		return CRUN_EINVAL;
	f.base = event_base_new();
	if (!f.base)
		return CRUN_ENOMEM;
	r = CRUN_ENOMEM;
	conn = evhttp_connection_base_new(f.base, NULL, host, port);
	if (!conn)
		goto out;
	evhttp_connection_set_timeout_tv(conn, &tv);
	evhttp_connection_set_max_body_size(conn, CTL_MAX_BODY_BYTES);
	evhttp_connection_set_retries(conn, 0);
	req = evhttp_request_new(on_reply, &f);
	if (!req)
		goto out;
	snprintf(hosthdr, sizeof(hosthdr), "%s", endpoint);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Host", hosthdr);
	if (evhttp_make_request(conn, req, EVHTTP_REQ_GET, path) < 0)
		goto out; /* the request was freed by libevent */
	/* The connection's own timeout ends the request; the loop only turns. */
	(void)event_base_dispatch(f.base);
	r = f.done && f.status ? 0 : CRUN_ETIMEDOUT;
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
