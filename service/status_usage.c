/* status_usage.c: which job holds what of a store's key space (issue 26),
 * for crun-rdzvd's GET /usage: the JSON body built from
 * store_server_each_share (pure: no socket); crunctl's table of it is
 * agent/ctl_usage.c's. POST /drop, which frees one job's keys, is
 * status_drop.c's.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "service/service.h"
#include "store/server.h"

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

char *status_usage_json(const struct store_server *srv)
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
