/* etcd_counter.c: coord_add on etcd (etcd_int.h). A counter is stored as
 * CTR_TAG "<offset>" and reads as the key's version plus the offset, so +1
 * is one put that keeps the value (ignore_value) and never contends; other
 * deltas, and creating it, are a compare-and-set on the mod revision. Every
 * update writes a fence key unique to the call and requires it absent: a
 * resend after a lost answer, or a first send that reaches etcd after the
 * resend, counts once.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "rendezvous/etcd_int.h"

#define ADD_TRIES (1 << 16)

/* ---- counters ------------------------------------------------------------------- */

/* A counter's state as read: its number, mod revision and version (0, 0, 0
 * when absent). */
struct ctr {
	int64_t val, mod, ver;
};

static int ctr_read(const cJSON *range, struct ctr *c)
{
	const cJSON *kv = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(range, "kvs"), 0);
	char *v = NULL;
	int r;

	memset(c, 0, sizeof(*c));
	if (!kv)
		return 0;
	TRY(etcd_kv_of(kv, &v, &c->mod));
	c->ver = etcd_json_i64(kv, "version");
	r = parse_i64(v, &c->val) == 0 ? 0 : CRUN_EPROTO;
	free(v);
	return r;
}

/* Whether this call's fence exists. It was written in the same txn as the
 * counter, so the counter at the fence's revision is what the call made.
 * 1 applied (*ret), 0 not. */
static int fence_check(struct etcd *e, const char *k, const char *fence, int64_t *ret)
{
	char body[1024], *f64 = etcd_b64(fence, strlen(fence)), *k64 = etcd_b64(k, strlen(k));
	cJSON *res = NULL, *res2 = NULL;
	struct ctr c;
	int64_t rev = 0;
	int r = CRUN_ENOMEM;

	if (!f64 || !k64 || str_printf(body, sizeof(body), "{\"key\":\"%s\"}", f64) < 0)
		goto out;
	r = etcd_call(e, "/v3/kv/range", body, &res);
	if (r == 0)
		r = etcd_kv_value(res, NULL, &rev);
	if (r == CRUN_ENOTFOUND) {
		r = 0;
		goto out;
	}
	if (r < 0 ||
	    (r = str_printf(body, sizeof(body), "{\"key\":\"%s\",\"revision\":\"%" PRId64 "\"}",
			    k64, rev)) < 0)
		goto out;
	r = etcd_call(e, "/v3/kv/range", body, &res2);
	if (r == 0)
		r = ctr_read(res2, &c);
	if (r == 0) {
		*ret = c.val;
		r = 1;
	}
out:
	free(f64);
	free(k64);
	cJSON_Delete(res);
	cJSON_Delete(res2);
	return r;
}

/* Sends a counter txn. It also requires this call's fence to be absent and
 * writes it, so it can be resent after a lost answer, and a first send that
 * lands late (after a resend) changes nothing: a call never counts twice.
 * On failure the txn reads the fence (entry 0) and the counter (entry 1).
 * 1 applied (*ret_applied INT64_MIN: by this reply, whose entries are the
 * success branch's; else the number an earlier send made), 0 not applied
 * (*ret_res holds the reply), or an error. */
static int ctr_txn(struct etcd *e, struct etcd_txn *t, bool ok, const char *k, const char *fence,
		   cJSON **ret_res, int64_t *ret_applied)
{
	int r;

	ok = ok && etcd_cmp(t->compare, fence, "CREATE", 0, NULL) &&
	     etcd_op(t->success, "put", etcd_req_put(fence, "", 0, false)) &&
	     etcd_op(t->failure, "range", etcd_req_range(fence, NULL, false, true)) &&
	     etcd_op(t->failure, "range", etcd_req_range(k, NULL, false, false));
	/* The previous call's fence is no longer needed. */
	if (ok && e->last_fence)
		ok = etcd_op(t->success, "delete_range",
			     etcd_req_range(e->last_fence, NULL, false, false));
	r = etcd_txn_run(e, t, ok, ret_res);
	if (r < 0)
		return r;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(*ret_res, "succeeded"))) {
		*ret_applied = INT64_MIN;
		return 1;
	}
	if (etcd_kv_value(etcd_txn_range(*ret_res, 0), NULL, NULL) ==
	    0) /* an earlier send applied */
		return fence_check(e, k, fence, ret_applied);
	return 0;
}

/* +1 on an existing counter: a put that keeps the value, so every joiner
 * succeeds at once; the number is the version it made plus the offset.
 * 1 done, 0 not a counter yet (absent, or a plain number). */
static int add_one(struct etcd *e, const char *k, const char *fence, int64_t *ret)
{
	const cJSON *prev;
	cJSON *res = NULL;
	struct etcd_txn t;
	char *raw = NULL;
	int64_t off = 0;
	int r;

	TRY(etcd_txn_init(&t));
	r = ctr_txn(e, &t,
		    etcd_cmpr(t.compare, k, "VALUE", "GREATER", 0, CTR_LO) &&
			etcd_cmpr(t.compare, k, "VALUE", "LESS", 0, CTR_HI) &&
			etcd_op(t.success, "put", etcd_req_put(k, NULL, 0, true)),
		    k, fence, &res, ret);
	if (r == 1 && *ret == INT64_MIN) {
		prev = cJSON_GetObjectItemCaseSensitive(
		    cJSON_GetObjectItemCaseSensitive(
			cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(res, "responses"), 0),
			"response_put"),
		    "prev_kv");
		r = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(prev, "value"))
			? etcd_unb64(cJSON_GetObjectItemCaseSensitive(prev, "value")->valuestring,
				     &raw, NULL)
			: CRUN_EPROTO;
		if (r == 0 && !etcd_kv_counter(raw, &off))
			r = CRUN_EPROTO;
		if (r == 0) {
			*ret = etcd_json_i64(prev, "version") + 1 + off;
			r = 1;
		}
	}
	free(raw);
	cJSON_Delete(res);
	return r;
}

/* Any delta, and the first +1: a compare-and-set on the mod revision that
 * writes the counter form; *c is the state read, refreshed on a lost race.
 * 1 done (*ret), 0 retry. */
static int add_cas(struct etcd *e, const char *k, const char *fence, int64_t delta, struct ctr *c,
		   int64_t *ret)
{
	char val[48];
	cJSON *res = NULL;
	struct etcd_txn t;
	int r;

	/* The put makes version ver+1: choose the offset that shows val+delta. */
	snprintf(val, sizeof(val), CTR_TAG "%" PRId64, c->val + delta - (c->ver + 1));
	TRY(etcd_txn_init(&t));
	r = ctr_txn(e, &t,
		    etcd_cmp(t.compare, k, "MOD", c->mod, NULL) &&
			etcd_op(t.success, "put", etcd_req_put(k, val, 0, false)),
		    k, fence, &res, ret);
	if (r == 1 && *ret == INT64_MIN)
		*ret = c->val + delta;
	else if (r == 0)
		r = ctr_read(etcd_txn_range(res, 1), c);
	cJSON_Delete(res);
	return r;
}

int etcd_add(struct etcd *e, const char *key, int64_t delta, int64_t *ret_value)
{
	char *k = etcd_key(e, key, NULL, NULL), *fence = NULL, body[1024];
	cJSON *res = NULL;
	struct ctr c = {0};
	int64_t val = 0;
	int r = CRUN_ENOMEM;

	if (!k ||
	    asprintf(&fence, "%s\x01op/%016" PRIx64 "-%" PRIu64, e->prefix, e->nonce, ++e->seq) < 0)
		goto out;
	r = delta == 1 ? add_one(e, k, fence, &val) : 0;
	if (r == 0) {
		char *k64 = etcd_b64(k, strlen(k));

		r = k64 ? str_printf(body, sizeof(body), "{\"key\":\"%s\"}", k64) : CRUN_ENOMEM;
		free(k64);
		if (r >= 0)
			r = etcd_call(e, "/v3/kv/range", body, &res);
		if (r == 0)
			r = ctr_read(res, &c);
		if (r == CRUN_EPROTO)
			etcd_fail(e, r, "'%s' is not a counter", key);
		/* Adding 0 to an existing counter only reads it; to an absent
		 * one it creates "0", as the store's ADD does. */
		if (r == 0 && delta == 0 && c.mod) {
			val = c.val;
			r = 2;
		}
	}
	for (int i = 0; i < ADD_TRIES && r == 0; i++) {
		r = add_cas(e, k, fence, delta, &c, &val);
		/* Lost the race to create the counter: it exists now, so +1
		 * is one put again (no compare-and-set queue of joiners). */
		if (r == 0 && delta == 1 && c.mod)
			r = add_one(e, k, fence, &val);
	}
	if (r == 0)
		r = CRUN_EBUSY;
	if (r == 1) { /* our fence is the one to delete next time */
		free(e->last_fence);
		e->last_fence = fence;
		fence = NULL;
	}
	if (r > 0 && ret_value)
		*ret_value = val;
out:
	cJSON_Delete(res);
	free(k);
	free(fence);
	return r < 0 ? etcd_fail_op(e, r, "add", key) : 0;
}
