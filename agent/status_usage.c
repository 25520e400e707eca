/* status_usage.c: which job holds what of a store's key space (issue 26),
 * for crun-rdzvd's GET /usage and `crunctl usage`: the JSON body built from
 * store_server_each_share (pure: no socket), and its table for crunctl.
 * POST /drop, which frees one job's keys, is routed in status.c.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "agent/agent.h"
#include "store/server.h"
#include "common/common.h"

/* {"keys": n, "key_bytes": n, ...}, one member per budget (server.h's table). */
static cJSON *budgets(const uint64_t *v)
{
	cJSON *o = cJSON_CreateObject();

	for (int b = 0; o && b < STORE_B__MAX; b++)
		cJSON_AddNumberToObject(o, store_budget_name((enum store_budget)b), (double)v[b]);
	return o;
}

static void usage_row(const struct store_share_info *si, void *arg)
{
	cJSON *arr = arg, *j = cJSON_CreateObject();

	if (!j)
		return;
	cJSON_AddStringToObject(j, "job", si->job);
	cJSON_AddItemToObject(j, "used", budgets(si->used));
	cJSON_AddItemToObject(j, "limit", budgets(si->limit));
	cJSON_AddItemToObject(j, "refused", budgets(si->refused));
	cJSON_AddItemToArray(arr, j);
}

char *agent_status_usage_json(const struct store_server *srv)
{
	cJSON *root = cJSON_CreateObject(), *arr;
	char *out = NULL;

	if (!root)
		return NULL;
	arr = cJSON_AddArrayToObject(root, "usage");
	if (arr && srv)
		store_server_each_share(srv, usage_row, arr);
	if (arr)
		out = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	return out;
}

static uint64_t member(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) && v->valuedouble > 0 ? (uint64_t)v->valuedouble : 0;
}

int agent_ctl_print_usage(FILE *out, const char *json)
{
	cJSON *root = cJSON_Parse(json), *rows, *j;

	rows = cJSON_GetObjectItemCaseSensitive(root, "usage");
	if (!cJSON_IsArray(rows)) {
		cJSON_Delete(root);
		return CRUN_EPROTO;
	}
	fprintf(out, "%-32s %9s %12s %14s %8s %s\n", "JOB", "KEYS", "KEY_BYTES", "VALUE_BYTES",
		"WAITERS", "REFUSED");
	cJSON_ArrayForEach(j, rows)
	{
		const cJSON *job = cJSON_GetObjectItemCaseSensitive(j, "job");
		const cJSON *u = cJSON_GetObjectItemCaseSensitive(j, "used");
		const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "refused");
		uint64_t refused = 0;

		for (int b = 0; b < STORE_B__MAX; b++)
			refused += member(r, store_budget_name((enum store_budget)b));
		/* "" is the keys of no known job (a worker store's, plain keys). */
		fprintf(out, "%-32s %9llu %12llu %14llu %8llu %llu\n",
			cJSON_IsString(job) && job->valuestring[0] ? job->valuestring : "-",
			(unsigned long long)member(u, "keys"),
			(unsigned long long)member(u, "key_bytes"),
			(unsigned long long)member(u, "value_bytes"),
			(unsigned long long)member(u, "waiters"), (unsigned long long)refused);
	}
	cJSON_Delete(root);
	return 0;
}
