/* ctl_usage.c: crunctl usage's table of a crun-rdzvd page's GET /usage
 * body (service/status_usage.c builds it): one row per job, its holdings of
 * each budget and its refused writes summed.
 */
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "agent/ctl.h"
#include "common/common.h"
#include "store/server.h"

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
