/* status_jobs.c: the JSON views behind the status page that read a store
 * rather than an agent: a c10d job as crun-rdzvd's store holds it (its round,
 * nodes, ranks and end, with a version for watchers) and the list of the
 * jobs a store holds; and the rendezvous-progress object both pages share.
 * Pure functions of what they are given (status_int.h, service.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "service/status_int.h"
#include "store/server.h"

/* The rendezvous's progress (rdzv.h) under root's "rendezvous": the round
 * waited in or the last one completed, its nodes (group ranks and addresses
 * once complete), the nodes waited for, and the counters. */
void status_progress_json(cJSON *root, const struct rdzv_progress *p, const char *run_id)
{
	cJSON *o, *arr;
	char line[1024];

	o = cJSON_AddObjectToObject(root, "rendezvous");
	if (!o)
		return;
	(void)rdzv_progress_line(p, run_id, line, sizeof(line));
	cJSON_AddStringToObject(o, "line", line);
	cJSON_AddNumberToObject(o, "round", p->round);
	cJSON_AddBoolToObject(o, "waiting", p->waiting);
	cJSON_AddNumberToObject(o, "joined", p->joined);
	cJSON_AddNumberToObject(o, "min_nodes", p->min);
	cJSON_AddNumberToObject(o, "max_nodes", p->max);
	if (p->waiting && p->last_call_s >= 0)
		cJSON_AddNumberToObject(o, "last_call_in_s", (double)p->last_call_s);
	else
		cJSON_AddNullToObject(o, "last_call_in_s");
	arr = cJSON_AddArrayToObject(o, "nodes");
	for (int i = 0; arr && i < p->nnodes; i++) {
		cJSON *n = cJSON_CreateObject();

		cJSON_AddStringToObject(n, "host", p->nodes[i].host);
		if (p->nodes[i].addr[0])
			cJSON_AddStringToObject(n, "addr", p->nodes[i].addr);
		else
			cJSON_AddNullToObject(n, "addr");
		if (p->nodes[i].group_rank >= 0)
			cJSON_AddNumberToObject(n, "group_rank", p->nodes[i].group_rank);
		else
			cJSON_AddNullToObject(n, "group_rank");
		cJSON_AddItemToArray(arr, n);
	}
	if (p->nawait < 0) {
		cJSON_AddNullToObject(o, "waiting_for"); /* not known */
	} else if ((arr = cJSON_AddArrayToObject(o, "waiting_for"))) {
		for (int i = 0; i < p->nawait; i++)
			cJSON_AddItemToArray(arr, cJSON_CreateString(p->await[i]));
	}
	for (int c = 0; c < RDZV_C__MAX; c++)
		cJSON_AddNumberToObject(o, rdzv_counter_name((enum rdzv_counter)c),
					(double)p->counters[c]);
}

/* A c10d job's key in crun-rdzvd's store: crun's and torch 2.x's clients
 * send "/crun-c10d/<id>/<key>", the v1 dialect the same without the '/'. */
struct job_keys {
	const struct store_server *srv; /* borrowed */
	const char *run_id;
};

static char *job_key_get(const char *key, void *arg)
{
	const struct job_keys *jk = arg;
	char full[512];
	const uint8_t *v;
	size_t len;
	char *out;
	int n = snprintf(full, sizeof(full), "/" RDZV_C10D_PREFIX "%s/%s", jk->run_id, key);

	if (n < 0 || (size_t)n >= sizeof(full))
		return NULL;
	if (store_server_peek(jk->srv, (const uint8_t *)full, (size_t)n, &v, &len) < 0 &&
	    store_server_peek(jk->srv, (const uint8_t *)full + 1, (size_t)n - 1, &v, &len) < 0)
		return NULL;
	out = malloc(len + 1);
	if (!out)
		return NULL;
	memcpy(out, v, len);
	out[len] = '\0';
	return out;
}

int status_store_job_round(const struct store_server *srv, const char *run_id, char *prefix,
			   size_t cap, int *ret_nodes, const char **ret_state)
{
	struct job_keys jk = {srv, run_id};
	struct rdzv_progress *p = malloc(sizeof(*p));
	const uint8_t *v;
	size_t len;
	int r;

	if (!p)
		return CRUN_ENOMEM;
	r = rdzv_c10d_view(job_key_get, &jk, p, ret_state);
	if (r == 0)
		r = str_printf(prefix, cap, "/" RDZV_C10D_PREFIX "%s/round", run_id) < 0
			? CRUN_ERANGE
			: 0;
	if (r == 0) {
		/* The dialect of the job's own keys: "round" is always there. */
		size_t n = strlen(prefix);
		bool slash = store_server_peek(srv, (const uint8_t *)prefix, n, &v, &len) == 0;

		prefix[n - strlen("round")] = '\0';
		if (!slash)
			memmove(prefix, prefix + 1, strlen(prefix));
		*ret_nodes = p->waiting ? 0 : p->joined;
	}
	free(p);
	return r;
}

char *status_print_tree(cJSON *root)
{
	char *out = root ? cJSON_PrintUnformatted(root) : NULL;

	cJSON_Delete(root);
	return out;
}

/* One job of crun-rdzvd's store (GET /jobs/ID, /status?rdzv_id=ID): its
 * round, nodes, group ranks and the nodes waited for, as an agent's page
 * shows them; NULL when the store holds no round of it. */
static cJSON *store_job_tree(const struct store_server *srv, const char *run_id)
{
	struct job_keys jk = {srv, run_id};
	struct rdzv_progress *p = malloc(sizeof(*p));
	const char *state;
	cJSON *root = NULL;

	if (!p)
		return NULL;
	if (rdzv_c10d_view(job_key_get, &jk, p, &state) == 0 && (root = cJSON_CreateObject())) {
		cJSON_AddBoolToObject(root, "ok", 1);
		cJSON_AddStringToObject(root, "run_id", run_id);
		cJSON_AddStringToObject(root, "rdzv_backend", "c10d");
		cJSON_AddStringToObject(root, "state", state);
		status_progress_json(root, p, run_id);
	}
	free(p);
	return root;
}

/* A job's body with its "version": a hash of the view (53 bits, exact as a
 * JSON number), the same for the same view, so a watcher can ask for the
 * next one (?after=) although the store counts no per-job changes. NULL
 * when the store holds no round of the job. */
char *status_store_job_body(const struct store_server *srv, const char *run_id,
			    uint64_t *ret_version)
{
	cJSON *root = store_job_tree(srv, run_id);
	char *view = root ? cJSON_PrintUnformatted(root) : NULL;
	uint64_t h = 14695981039346656037ull; /* FNV-1a */

	if (!view) {
		cJSON_Delete(root);
		return NULL;
	}
	for (const unsigned char *p = (const unsigned char *)view; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	free(view);
	h &= (1ull << 53) - 1;
	cJSON_AddNumberToObject(root, "version", (double)h);
	*ret_version = h;
	return status_print_tree(root);
}

#define STATUS_MAX_JOBS 1024 /* a page lists at most this many jobs */

/* crun-rdzvd's jobs: the run ids its keys belong to, with their key counts. */
struct job_count {
	cJSON *jobs;
	int n;
};

static void count_key(const uint8_t *key, size_t len, void *arg)
{
	struct job_count *jc = arg;
	char id[256];
	cJSON *j, *keys;

	if (!rdzv_run_id_of_key(key, len, id, sizeof(id)))
		return;
	cJSON_ArrayForEach(j, jc->jobs)
	{
		if (strcmp(cJSON_GetObjectItemCaseSensitive(j, "run_id")->valuestring, id) == 0) {
			keys = cJSON_GetObjectItemCaseSensitive(j, "keys");
			cJSON_SetNumberValue(keys, keys->valuedouble + 1);
			return;
		}
	}
	if (jc->n >= STATUS_MAX_JOBS || !(j = cJSON_CreateObject()))
		return;
	cJSON_AddStringToObject(j, "run_id", id);
	cJSON_AddStringToObject(j, "backend", "c10d");
	cJSON_AddNumberToObject(j, "keys", 1);
	cJSON_AddItemToArray(jc->jobs, j);
	jc->n++;
}

/* A /jobs row of crun-rdzvd's: the job's state, round and nodes from its
 * keys (store_job_tree), beside its key count. */
static void job_summary(cJSON *j, const struct store_server *srv)
{
	cJSON *t = store_job_tree(srv, cJSON_GetObjectItemCaseSensitive(j, "run_id")->valuestring);
	const cJSON *rz = cJSON_GetObjectItemCaseSensitive(t, "rendezvous");
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(t, "state");
	const cJSON *rd = cJSON_GetObjectItemCaseSensitive(rz, "round");
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(rz, "joined");

	if (cJSON_IsString(st) && cJSON_IsNumber(rd) && cJSON_IsNumber(n)) {
		cJSON_AddStringToObject(j, "state", st->valuestring);
		cJSON_AddNumberToObject(j, "round", rd->valuedouble);
		cJSON_AddNumberToObject(j, "nodes", n->valuedouble);
	}
	cJSON_Delete(t);
}

/* crun-rdzvd's jobs into the array jobs: one row per run id its keys hold. */
void status_store_jobs(cJSON *jobs, const struct store_server *srv)
{
	struct job_count jc = {jobs, 0};
	cJSON *j;

	store_server_each_key(srv, count_key, &jc);
	cJSON_ArrayForEach(j, jobs)
	{
		job_summary(j, srv);
	}
}
