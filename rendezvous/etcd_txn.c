/* etcd_txn.c: the etcd backend's request builders (etcd_int.h): prefixed
 * keys, the gateway's base64 JSON for range, put and txn requests, compares,
 * and reading kvs back (counters shown as their number).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "rendezvous/etcd_int.h"

/* ---- keys and JSON ---------------------------------------------------------- */

/* "<prefix><key><suffix>" into a malloc'd buffer (suffix may hold \x01). */
char *etcd_key(struct etcd *e, const char *key, const char *suffix, size_t *ret_len)
{
	size_t kl = strlen(key), sl = suffix ? strlen(suffix) : 0;
	char *k = malloc(e->prefix_len + kl + sl + 1);

	if (!k)
		return NULL;
	memcpy(k, e->prefix, e->prefix_len);
	memcpy(k + e->prefix_len, key, kl);
	if (sl)
		memcpy(k + e->prefix_len + kl, suffix, sl);
	k[e->prefix_len + kl + sl] = '\0';
	if (ret_len)
		*ret_len = e->prefix_len + kl + sl;
	return k;
}

static bool add_b64(cJSON *o, const char *name, const char *p, size_t len)
{
	char *b = etcd_b64(p, len);
	bool ok = b && cJSON_AddStringToObject(o, name, b);

	free(b);
	return ok;
}

/* {"key": k, "range_end": end?, ...} for range, delete and put requests. */
cJSON *etcd_req_range(const char *k, const char *end, bool count_only, bool keys_only)
{
	cJSON *o = cJSON_CreateObject();

	if (!o || !add_b64(o, "key", k, strlen(k)) ||
	    (end && !add_b64(o, "range_end", end, strlen(end))) ||
	    (count_only && !cJSON_AddTrueToObject(o, "count_only")) ||
	    (keys_only && !cJSON_AddTrueToObject(o, "keys_only"))) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* A put; v NULL keeps the value (ignore_value), prev_kv returns the old kv. */
cJSON *etcd_req_put(const char *k, const char *v, uint64_t lease, bool prev_kv)
{
	cJSON *o = cJSON_CreateObject();
	char id[32];

	snprintf(id, sizeof(id), "%" PRIu64, lease);
	if (!o || !add_b64(o, "key", k, strlen(k)) || (v && !add_b64(o, "value", v, strlen(v))) ||
	    (!v && !cJSON_AddTrueToObject(o, "ignore_value")) ||
	    (prev_kv && !cJSON_AddTrueToObject(o, "prev_kv")) ||
	    (lease && !cJSON_AddStringToObject(o, "lease", id))) {
		cJSON_Delete(o);
		return NULL;
	}
	return o;
}

/* Appends {"request_<kind>": body} to a txn branch (takes body). */
bool etcd_op(cJSON *arr, const char *kind, cJSON *body)
{
	cJSON *o = cJSON_CreateObject();
	char name[32];

	snprintf(name, sizeof(name), "request_%s", kind);
	if (!o || !body || !cJSON_AddItemToObject(o, name, body)) {
		cJSON_Delete(o);
		cJSON_Delete(body);
		return false;
	}
	if (!cJSON_AddItemToArray(arr, o)) {
		cJSON_Delete(o);
		return false;
	}
	return true;
}

/* A compare on k: target MOD/CREATE (int) or VALUE (string); result EQUAL,
 * GREATER, LESS or NOT_EQUAL. */
bool etcd_cmpr(cJSON *arr, const char *k, const char *target, const char *result, int64_t rev,
	       const char *value)
{
	cJSON *o = cJSON_CreateObject();
	char num[32];

	snprintf(num, sizeof(num), "%" PRId64, rev);
	if (!o)
		return false;
	if (!cJSON_AddItemToArray(arr, o)) {
		cJSON_Delete(o);
		return false;
	}
	if (!add_b64(o, "key", k, strlen(k)) || !cJSON_AddStringToObject(o, "target", target) ||
	    !cJSON_AddStringToObject(o, "result", result))
		return false;
	if (value)
		return add_b64(o, "value", value, strlen(value));
	return cJSON_AddStringToObject(
		   o, strcmp(target, "MOD") == 0 ? "mod_revision" : "create_revision", num) != NULL;
}

bool etcd_cmp(cJSON *arr, const char *k, const char *target, int64_t rev, const char *value)
{
	return etcd_cmpr(arr, k, target, "EQUAL", rev, value);
}

int etcd_txn_init(struct etcd_txn *t)
{
	t->root = cJSON_CreateObject();
	t->compare = cJSON_AddArrayToObject(t->root, "compare");
	t->success = cJSON_AddArrayToObject(t->root, "success");
	t->failure = cJSON_AddArrayToObject(t->root, "failure");
	if (!t->root || !t->compare || !t->success || !t->failure) {
		cJSON_Delete(t->root);
		return CRUN_ENOMEM;
	}
	return 0;
}

/* Sends the txn (freeing it); *ret_json is the reply. */
int etcd_txn_run(struct etcd *e, struct etcd_txn *t, bool ok, cJSON **ret_json)
{
	char *body = ok ? cJSON_PrintUnformatted(t->root) : NULL;
	int r;

	cJSON_Delete(t->root);
	if (!body)
		return CRUN_ENOMEM;
	r = etcd_call(e, "/v3/kv/txn", body, ret_json);
	free(body);
	return r;
}

/* The response_range of txn reply entry i, or NULL. */
const cJSON *etcd_txn_range(const cJSON *res, int i)
{
	const cJSON *rs = cJSON_GetObjectItemCaseSensitive(res, "responses");
	const cJSON *it = cJSON_GetArrayItem(rs, i);

	return it ? cJSON_GetObjectItemCaseSensitive(it, "response_range") : NULL;
}

/* The offset of a counter kv: 1 and *ret_off, 0 not a counter. */
int etcd_kv_counter(const char *raw, int64_t *ret_off)
{
	return strncmp(raw, CTR_TAG, 2) == 0 && parse_i64(raw + 2, ret_off) == 0;
}

/* A kv's value (malloc'd; a counter as its number) and mod revision. 0,
 * CRUN_EPROTO or CRUN_ENOMEM. */
int etcd_kv_of(const cJSON *kv, char **ret_val, int64_t *ret_mod)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
	char *raw = NULL;
	int64_t off;

	if (ret_mod)
		*ret_mod = etcd_json_i64(kv, "mod_revision");
	if (!ret_val)
		return 0;
	if (!v) { /* the gateway leaves out empty values */
		*ret_val = str_dup("");
		return *ret_val ? 0 : CRUN_ENOMEM;
	}
	if (!cJSON_IsString(v))
		return CRUN_EPROTO;
	TRY(etcd_unb64(v->valuestring, &raw, NULL));
	if (etcd_kv_counter(raw, &off)) {
		free(raw);
		if (asprintf(&raw, "%" PRId64, etcd_json_i64(kv, "version") + off) < 0)
			return CRUN_ENOMEM;
	}
	*ret_val = raw;
	return 0;
}

/* The first kv of a range response: 0, CRUN_ENOTFOUND, or CRUN_EPROTO. */
int etcd_kv_value(const cJSON *range, char **ret_val, int64_t *ret_mod)
{
	const cJSON *kvs = range ? cJSON_GetObjectItemCaseSensitive(range, "kvs") : NULL;
	const cJSON *kv = cJSON_GetArrayItem(kvs, 0);

	return kv ? etcd_kv_of(kv, ret_val, ret_mod) : CRUN_ENOTFOUND;
}

int etcd_fail_op(struct etcd *e, int r, const char *what, const char *key)
{
	char prev[sizeof(e->err)];

	snprintf(prev, sizeof(prev), "%s", e->err);
	return etcd_fail(e, r, "%s '%.200s': %s - %.240s", what, key, crun_strerror(r), prev);
}
