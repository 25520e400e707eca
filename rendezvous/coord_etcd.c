/* coord_etcd.c: coord.h's operations on etcd v3 (transport in etcd_http.c).
 *
 * Mapping:
 *   get/set/exists      range and put of "<prefix>/<key>"
 *   add                 read, then a txn that puts value+delta if the key's
 *                       mod_revision is unchanged (retried on contention);
 *                       the txn also writes a fence key unique to this call
 *                       and requires it absent, so a resend after a lost
 *                       answer (or a first send that lands late) never
 *                       counts twice; +1 on a counter is a put that keeps
 *                       the value (the number is the key's version)
 *   compare_set         a txn comparing the value (or create_revision 0 for
 *                       "absent"), reading the winner on failure
 *   wait / get          a /v3/watch stream from the revision just read: no
 *                       polling, and no event between the read and the watch
 *                       can be missed (revisions fence the two)
 *   leases              etcd leases. etcd deletes a lapsed lease's keys but
 *                       cannot set another key, so an expiry key K is
 *                       emulated with two keys next to it: a registration
 *                       "K\x01reg/<id>" = why (no lease) and a live key
 *                       "K\x01live/<id>" (under the lease). Revoke deletes
 *                       both; expiry deletes only the live one. K counts as
 *                       set to `why` while a registration outlives its live
 *                       key; whoever reads K first then writes it for good
 *                       (create-only txn), so every reader agrees on one value
 *   put_leased          a put with the lease (etcd's ephemeral keys)
 *
 * The "\x01" keys sort right after K and before any printable suffix of K,
 * so [K, K"\x02") holds exactly K and its lease keys: one range read and one
 * watch cover both.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/common.h"
#include "rendezvous/etcd_int.h"

#define WATCH_CHECK_MS 3000 /* a quiet watch: check its member still answers */
#define ADD_TRIES      (1 << 16)

/* ---- keys and JSON ---------------------------------------------------------- */

/* "<prefix><key><suffix>" into a malloc'd buffer (suffix may hold \x01). */
static char *fkey(struct etcd *e, const char *key, const char *suffix, size_t *ret_len)
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
static cJSON *req_range(const char *k, const char *end, bool count_only, bool keys_only)
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
static cJSON *req_put(const char *k, const char *v, uint64_t lease, bool prev_kv)
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
static bool op(cJSON *arr, const char *kind, cJSON *body)
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
static bool cmpr(cJSON *arr, const char *k, const char *target, const char *result, int64_t rev,
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

static bool cmp(cJSON *arr, const char *k, const char *target, int64_t rev, const char *value)
{
	return cmpr(arr, k, target, "EQUAL", rev, value);
}

struct txn {
	cJSON *root, *compare, *success, *failure;
};

static int txn_init(struct txn *t)
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
static int txn_run(struct etcd *e, struct txn *t, bool ok, cJSON **ret_json)
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
static const cJSON *txn_range(const cJSON *res, int i)
{
	const cJSON *rs = cJSON_GetObjectItemCaseSensitive(res, "responses");
	const cJSON *it = cJSON_GetArrayItem(rs, i);

	return it ? cJSON_GetObjectItemCaseSensitive(it, "response_range") : NULL;
}

/* Counters (etcd_add) are stored as CTR_TAG "<offset>": their value is the
 * key's version plus the offset, so adding 1 is a put that keeps the value
 * and needs no read first (no contention between joiners). Readers see the
 * decimal number. CTR_TAG sorts between CTR_LO and CTR_HI. */
#define CTR_TAG "\001c"
#define CTR_LO	"\001c"
#define CTR_HI	"\001d"

/* The offset of a counter kv: 1 and *ret_off, 0 not a counter. */
static int kv_counter(const char *raw, int64_t *ret_off)
{
	return strncmp(raw, CTR_TAG, 2) == 0 && parse_i64(raw + 2, ret_off) == 0;
}

/* A kv's value (malloc'd; a counter as its number) and mod revision. 0,
 * CRUN_EPROTO or CRUN_ENOMEM. */
static int kv_of(const cJSON *kv, char **ret_val, int64_t *ret_mod)
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
	if (kv_counter(raw, &off)) {
		free(raw);
		if (asprintf(&raw, "%" PRId64, etcd_json_i64(kv, "version") + off) < 0)
			return CRUN_ENOMEM;
	}
	*ret_val = raw;
	return 0;
}

/* The first kv of a range response: 0, CRUN_ENOTFOUND, or CRUN_EPROTO. */
static int kv_value(const cJSON *range, char **ret_val, int64_t *ret_mod)
{
	const cJSON *kvs = range ? cJSON_GetObjectItemCaseSensitive(range, "kvs") : NULL;
	const cJSON *kv = cJSON_GetArrayItem(kvs, 0);

	return kv ? kv_of(kv, ret_val, ret_mod) : CRUN_ENOTFOUND;
}

static int fail_op(struct etcd *e, int r, const char *what, const char *key)
{
	char prev[sizeof(e->err)];

	snprintf(prev, sizeof(prev), "%s", e->err);
	return etcd_fail(e, r, "%s '%.200s': %s - %.240s", what, key, crun_strerror(r), prev);
}

/* ---- reading a key (with its lease keys) ------------------------------------- */

/* Appends range requests for K's registrations and live keys to a txn
 * branch: counts only, or the keys (registrations with their values). */
static bool lease_ranges(cJSON *branch, const char *k, bool counts)
{
	char *reg = NULL, *rege = NULL, *live = NULL, *livee = NULL;
	bool ok = asprintf(&reg, "%s\x01reg/", k) >= 0 && asprintf(&rege, "%s\x01reg0", k) >= 0 &&
		  asprintf(&live, "%s\x01live/", k) >= 0 &&
		  asprintf(&livee, "%s\x01live0", k) >= 0 &&
		  op(branch, "range", req_range(reg, rege, counts, false)) &&
		  op(branch, "range", req_range(live, livee, counts, !counts));

	free(reg);
	free(rege);
	free(live);
	free(livee);
	return ok;
}

/* Writes K for good from the registration of a lapsed lease: create-only, so
 * the first writer (or a real set) wins; the registration goes either way. */
static int materialize(struct etcd *e, const char *k, char **ret_val)
{
	char *reg = NULL, *why = NULL;
	cJSON *res = NULL, *res2 = NULL;
	const cJSON *regs, *lives, *kv;
	size_t kl = strlen(k);
	struct txn t;
	int r;

	TRY(txn_init(&t));
	r = txn_run(e, &t, lease_ranges(t.success, k, false), &res);
	if (r < 0)
		goto out;
	regs = cJSON_GetObjectItemCaseSensitive(txn_range(res, 0), "kvs");
	lives = cJSON_GetObjectItemCaseSensitive(txn_range(res, 1), "kvs");
	r = CRUN_ENOTFOUND;
	cJSON_ArrayForEach(kv, regs)
	{
		const cJSON *kk = cJSON_GetObjectItemCaseSensitive(kv, "key");
		const cJSON *lk;
		char *rk = NULL, *want = NULL;
		bool alive = false;

		if (!cJSON_IsString(kk) || etcd_unb64(kk->valuestring, &rk, NULL) < 0 ||
		    strlen(rk) < kl + 5)
			continue;
		/* "K\x01reg/<id>" -> "K\x01live/<id>" */
		if (asprintf(&want, "%s\x01live/%s", k, rk + kl + 5) < 0) {
			free(rk);
			r = CRUN_ENOMEM;
			goto out;
		}
		cJSON_ArrayForEach(lk, lives)
		{
			const cJSON *lkk = cJSON_GetObjectItemCaseSensitive(lk, "key");
			char *x = NULL;

			if (cJSON_IsString(lkk) && etcd_unb64(lkk->valuestring, &x, NULL) == 0)
				alive |= strcmp(x, want) == 0;
			free(x);
		}
		free(want);
		if (alive) {
			free(rk);
			continue;
		}
		reg = rk; /* the lapsed registration */
		r = kv_of(kv, &why, NULL);
		break;
	}
	if (r < 0)
		goto out;
	r = txn_init(&t);
	if (r < 0)
		goto out;
	{
		cJSON *del = req_range(reg, NULL, false, false);
		cJSON *del2 = req_range(reg, NULL, false, false);
		bool ok = cmp(t.compare, k, "CREATE", 0, NULL) &&
			  op(t.success, "put", req_put(k, why, 0, false)) &&
			  op(t.success, "delete_range", del) &&
			  op(t.failure, "delete_range", del2) &&
			  op(t.failure, "range", req_range(k, NULL, false, false));

		r = txn_run(e, &t, ok, &res2);
	}
	if (r < 0)
		goto out;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res2, "succeeded"))) {
		*ret_val = why;
		why = NULL;
		r = 0;
	} else {
		r = kv_value(txn_range(res2, 1), ret_val, NULL);
	}
out:
	cJSON_Delete(res);
	cJSON_Delete(res2);
	free(reg);
	free(why);
	return r;
}

/* Reads K in one txn: its value, and how many registrations and live keys
 * it has. 0 with *ret_val (NULL: absent) and the store revision it read. */
static int probe(struct etcd *e, const char *k, char **ret_val, int64_t *ret_rev)
{
	char *v = NULL;
	cJSON *res = NULL;
	struct txn t;
	int64_t nreg, nlive;
	int r;

	TRY(txn_init(&t));
	r = txn_run(e, &t,
		    op(t.success, "range", req_range(k, NULL, false, false)) &&
			lease_ranges(t.success, k, true),
		    &res);
	if (r < 0)
		return r;
	*ret_rev = etcd_json_i64(cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
	r = kv_value(txn_range(res, 0), &v, NULL);
	if (r == CRUN_ENOTFOUND) {
		nreg = etcd_json_i64(txn_range(res, 1), "count");
		nlive = etcd_json_i64(txn_range(res, 2), "count");
		/* Revoke deletes a registration with its live key, expiry only
		 * the live key: more registrations than live keys = a lapse. */
		r = nreg > nlive ? materialize(e, k, &v) : CRUN_ENOTFOUND;
	}
	if (r == CRUN_ENOTFOUND) {
		v = NULL;
		r = 0;
	}
	if (r == 0)
		*ret_val = v;
	cJSON_Delete(res);
	return r;
}

/* Waits up to timeout_ms for K and returns its value (ret_val may be NULL). */
static int wait_value(struct etcd *e, const char *key, uint32_t timeout_ms, char **ret_val)
{
	uint64_t deadline = clock_now_ms() + timeout_ms;
	size_t kl;
	char *k = fkey(e, key, NULL, &kl), *end = fkey(e, key, "\x02", NULL);
	int r = CRUN_ENOMEM;

	if (!k || !end)
		goto out;
	for (int i = 0; i < 1 << 30; i++) {
		char *v = NULL;
		int64_t rev = 0;
		uint64_t now = clock_now_ms();

		/* A live watch on K with no event since the last read found K
		 * absent means K is still absent: no request. The read is repeated on an
		 * event, and every few seconds as a check that the watch's
		 * member still answers (a member that stopped answering never
		 * closes the stream; the read fails over). */
		if (!etcd_watch_matches(e, k, kl) || e->w.event ||
		    now - e->w.checked_ms >= WATCH_CHECK_MS) {
			etcd_watch_rearm(e);
			r = probe(e, k, &v, &rev);
			if (r < 0)
				break;
			e->w.checked_ms = now = clock_now_ms();
			if (v) {
				/* Present: the next wait must read again (the
				 * shortcut above holds only after "absent"). */
				e->w.checked_ms = 0;
				if (ret_val)
					*ret_val = v;
				else
					free(v);
				break;
			}
			/* Watch from the revision after the read: nothing in
			 * between can be missed. A watch on another member (we
			 * failed over) or a dead one is replaced. */
			if (!etcd_watch_matches(e, k, kl)) {
				r = etcd_watch_start(e, k, kl, end, kl + 1, rev + 1);
				if (r < 0)
					break;
				e->w.checked_ms = now;
			}
		}
		if (now >= deadline) {
			r = CRUN_ETIMEDOUT;
			break;
		}
		if (etcd_watch_wait(e, MIN(deadline, e->w.checked_ms + WATCH_CHECK_MS)) ==
		    ETCD_W_DEAD)
			etcd_watch_stop(e);
	}
out:
	free(k);
	free(end);
	return r;
}

/* ---- coord.h operations ---------------------------------------------------------- */

/* A put of "<prefix><key>", under lease id when not 0. */
static int put(struct etcd *e, const char *key, const char *val, uint64_t id)
{
	char *k = fkey(e, key, NULL, NULL), *body = NULL;
	cJSON *p = k ? req_put(k, val, id, false) : NULL, *res = NULL;
	int r = CRUN_ENOMEM;

	body = p ? cJSON_PrintUnformatted(p) : NULL;
	if (body)
		r = etcd_call(e, "/v3/kv/put", body, &res);
	cJSON_Delete(p);
	cJSON_Delete(res);
	free(body);
	free(k);
	return r;
}

int etcd_set(struct etcd *e, const char *key, const char *val)
{
	int r = put(e, key, val, 0);

	return r < 0 ? fail_op(e, r, "set", key) : 0;
}

int etcd_exists(struct etcd *e, const char *key)
{
	char *k = fkey(e, key, NULL, NULL), *v = NULL;
	int64_t rev;
	int r = k ? probe(e, k, &v, &rev) : CRUN_ENOMEM;

	free(k);
	if (r < 0)
		return fail_op(e, r, "exists", key);
	r = v ? 1 : 0;
	free(v);
	return r;
}

int etcd_try_get(struct etcd *e, const char *key, char **ret_val)
{
	char *k = fkey(e, key, NULL, NULL), *v = NULL;
	int64_t rev;
	int r = k ? probe(e, k, &v, &rev) : CRUN_ENOMEM;

	free(k);
	if (r < 0)
		return fail_op(e, r, "get", key);
	if (!v)
		return CRUN_ENOTFOUND;
	*ret_val = v;
	return 0;
}

int etcd_get(struct etcd *e, const char *key, uint32_t timeout_ms, char **ret_val)
{
	int r = wait_value(e, key, timeout_ms ? timeout_ms : etcd_timeout_ms(e), ret_val);

	return r < 0 ? fail_op(e, r, "get", key) : 0;
}

int etcd_wait(struct etcd *e, const char *key, uint32_t timeout_ms)
{
	int r = wait_value(e, key, timeout_ms ? timeout_ms : 1, NULL);

	if (r == CRUN_ETIMEDOUT)
		return r;
	return r < 0 ? fail_op(e, r, "wait", key) : 0;
}

/* Reads up to MGET_BATCH keys in one txn; a key found goes to vals[i], an
 * absent one (or a lapsed lease's key: wait_value materializes it) stays
 * NULL. */
#define MGET_BATCH 64 /* etcd's default --max-txn-ops is 128 */
static int mget_batch(struct etcd *e, const char *const *keys, size_t n, char **vals)
{
	cJSON *res = NULL;
	struct txn t;
	bool ok = true;
	int r;

	TRY(txn_init(&t));
	for (size_t i = 0; i < n && ok; i++) {
		char *k = fkey(e, keys[i], NULL, NULL);

		ok = k && op(t.success, "range", req_range(k, NULL, false, false));
		free(k);
	}
	r = txn_run(e, &t, ok, &res);
	for (size_t i = 0; i < n && r == 0; i++) {
		r = kv_value(txn_range(res, (int)i), &vals[i], NULL);
		if (r == CRUN_ENOTFOUND) {
			vals[i] = NULL;
			r = 0;
		}
	}
	cJSON_Delete(res);
	return r;
}

int etcd_multi_get(struct etcd *e, const char *const *keys, size_t n, uint32_t timeout_ms,
		   char **ret_vals)
{
	uint64_t deadline = clock_now_ms() + (timeout_ms ? timeout_ms : etcd_timeout_ms(e));
	size_t i;
	int r = 0;

	for (i = 0; i < n; i++)
		ret_vals[i] = NULL;
	/* Batched reads first (N records in N / MGET_BATCH round trips); a
	 * wait only for what was not there. Values are kept as read: records
	 * are written once before anyone reads them. */
	for (i = 0; i < n && r == 0; i += MGET_BATCH)
		r = mget_batch(e, keys + i, MIN(MGET_BATCH, n - i), ret_vals + i);
	for (i = 0; i < n && r == 0; i++) {
		uint64_t now = clock_now_ms();

		if (!ret_vals[i])
			r = wait_value(e, keys[i], now < deadline ? (uint32_t)(deadline - now) : 1,
				       &ret_vals[i]);
	}
	if (r == 0)
		return 0;
	for (size_t k = 0; k < n; k++) {
		free(ret_vals[k]);
		ret_vals[k] = NULL;
	}
	return fail_op(e, r, "multi_get", keys[i ? i - 1 : 0]);
}

/* A compare-and-set. A counter stores its number encoded (see CTR_TAG): when
 * the value compare fails but the number read is the expected one, the set
 * is retried against that counter's mod revision. */
static int cas(struct etcd *e, const char *k, const char *expected, const char *desired,
	       char **ret_cur)
{
	cJSON *res = NULL;
	struct txn t;
	char *cur = NULL;
	int64_t rev, mod = -1, m = 0;
	int r = CRUN_EBUSY;

	if (!*expected) {
		/* "Absent" must count a lapsed lease's expiry key as present. */
		TRY(probe(e, k, &cur, &rev));
		if (cur) {
			*ret_cur = cur;
			return 0;
		}
	}
	for (int i = 0; i < 64; i++) {
		TRY(txn_init(&t));
		r = txn_run(e, &t,
			    (!*expected ? cmp(t.compare, k, "CREATE", 0, NULL)
			     : mod >= 0 ? cmp(t.compare, k, "MOD", mod, NULL)
					: cmp(t.compare, k, "VALUE", 0, expected)) &&
				op(t.success, "put", req_put(k, desired, 0, false)) &&
				op(t.failure, "range", req_range(k, NULL, false, false)),
			    &res);
		if (r < 0)
			return r;
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "succeeded"))) {
			r = (*ret_cur = str_dup(desired)) ? 0 : CRUN_ENOMEM;
			break;
		}
		r = kv_value(txn_range(res, 0), &cur, &m);
		cJSON_Delete(res);
		res = NULL;
		if (r == 0 && *expected && strcmp(cur, expected) == 0 && m != mod) {
			mod = m; /* a counter showing the expected number */
			free(cur);
			continue;
		}
		if (r == 0) {
			*ret_cur = cur;
		} else if (r == CRUN_ENOTFOUND) {
			/* Absent but expected non-empty: the store answers with
			 * the expected value (TCPStore's compareSet does). A
			 * lapsed lease's value, if any, first. */
			r = probe(e, k, &cur, &rev);
			if (r == 0)
				*ret_cur = cur ? cur : str_dup(expected);
			if (r == 0 && !*ret_cur)
				r = CRUN_ENOMEM;
		}
		break;
	}
	cJSON_Delete(res);
	return r;
}

int etcd_compare_set(struct etcd *e, const char *key, const char *expected, const char *desired,
		     char **ret_cur)
{
	char *k = fkey(e, key, NULL, NULL), *cur = NULL;
	int r = k ? cas(e, k, expected, desired, &cur) : CRUN_ENOMEM;

	free(k);
	if (r < 0)
		return fail_op(e, r, "compare_set", key);
	if (ret_cur)
		*ret_cur = cur;
	else
		free(cur);
	return 0;
}

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
	TRY(kv_of(kv, &v, &c->mod));
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
		r = kv_value(res, NULL, &rev);
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
static int ctr_txn(struct etcd *e, struct txn *t, bool ok, const char *k, const char *fence,
		   cJSON **ret_res, int64_t *ret_applied)
{
	int r;

	ok = ok && cmp(t->compare, fence, "CREATE", 0, NULL) &&
	     op(t->success, "put", req_put(fence, "", 0, false)) &&
	     op(t->failure, "range", req_range(fence, NULL, false, true)) &&
	     op(t->failure, "range", req_range(k, NULL, false, false));
	/* The previous call's fence is no longer needed. */
	if (ok && e->last_fence)
		ok = op(t->success, "delete_range", req_range(e->last_fence, NULL, false, false));
	r = txn_run(e, t, ok, ret_res);
	if (r < 0)
		return r;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(*ret_res, "succeeded"))) {
		*ret_applied = INT64_MIN;
		return 1;
	}
	if (kv_value(txn_range(*ret_res, 0), NULL, NULL) == 0) /* an earlier send applied */
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
	struct txn t;
	char *raw = NULL;
	int64_t off = 0;
	int r;

	TRY(txn_init(&t));
	r = ctr_txn(e, &t,
		    cmpr(t.compare, k, "VALUE", "GREATER", 0, CTR_LO) &&
			cmpr(t.compare, k, "VALUE", "LESS", 0, CTR_HI) &&
			op(t.success, "put", req_put(k, NULL, 0, true)),
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
		if (r == 0 && !kv_counter(raw, &off))
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
	struct txn t;
	int r;

	/* The put makes version ver+1: choose the offset that shows val+delta. */
	snprintf(val, sizeof(val), CTR_TAG "%" PRId64, c->val + delta - (c->ver + 1));
	TRY(txn_init(&t));
	r = ctr_txn(e, &t,
		    cmp(t.compare, k, "MOD", c->mod, NULL) &&
			op(t.success, "put", req_put(k, val, 0, false)),
		    k, fence, &res, ret);
	if (r == 1 && *ret == INT64_MIN)
		*ret = c->val + delta;
	else if (r == 0)
		r = ctr_read(txn_range(res, 1), c);
	cJSON_Delete(res);
	return r;
}

int etcd_add(struct etcd *e, const char *key, int64_t delta, int64_t *ret_value)
{
	char *k = fkey(e, key, NULL, NULL), *fence = NULL, body[1024];
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
	return r < 0 ? fail_op(e, r, "add", key) : 0;
}

/* ---- leases ------------------------------------------------------------------------ */

static struct etcd_lease *lease_slot(struct etcd *e, uint64_t id)
{
	for (int i = 0; i < ETCD_MAX_LEASES; i++)
		if (e->leases[i].id == id)
			return &e->leases[i];
	return NULL;
}

static int lease_call(struct etcd *e, const char *path, uint64_t id, int64_t ttl_s, cJSON **ret_res)
{
	char body[96];

	if (ttl_s)
		snprintf(body, sizeof(body), "{\"TTL\":\"%" PRId64 "\"}", ttl_s);
	else
		snprintf(body, sizeof(body), "{\"ID\":\"%" PRIu64 "\"}", id);
	return etcd_call(e, path, body, ret_res);
}

int etcd_lease_grant(struct etcd *e, uint32_t ttl_ms, const char *expiry_key, const char *why,
		     uint64_t *ret_id)
{
	struct etcd_lease *l = lease_slot(e, 0);
	cJSON *res = NULL, *res2 = NULL;
	struct txn t;
	uint64_t id;
	int r;

	if (!l)
		return etcd_fail(e, CRUN_ETOOBIG, "more than %d leases on one handle",
				 ETCD_MAX_LEASES);
	/* etcd counts TTLs in seconds and raises them to its minimum. */
	r = lease_call(e, "/v3/lease/grant", 0, MAX(1, (int64_t)(ttl_ms + 999) / 1000), &res);
	if (r < 0)
		return fail_op(e, r, "lease_grant", expiry_key);
	id = (uint64_t)etcd_json_i64(res, "ID");
	cJSON_Delete(res);
	if (!id)
		return etcd_fail(e, CRUN_EPROTO, "lease_grant: etcd sent no lease id");
	l->id = id;
	if (expiry_key && *expiry_key) {
		char sfx[64];

		snprintf(sfx, sizeof(sfx), "\x01reg/%016" PRIx64, id);
		l->reg = fkey(e, expiry_key, sfx, NULL);
		snprintf(sfx, sizeof(sfx), "\x01live/%016" PRIx64, id);
		l->live = fkey(e, expiry_key, sfx, NULL);
		r = CRUN_ENOMEM;
		if (l->reg && l->live && txn_init(&t) == 0)
			r = txn_run(e, &t,
				    op(t.success, "put", req_put(l->reg, why, 0, false)) &&
					op(t.success, "put", req_put(l->live, "", id, false)),
				    &res2);
		cJSON_Delete(res2);
		if (r < 0) {
			(void)etcd_lease_revoke(e, id);
			return fail_op(e, r, "lease_grant", expiry_key);
		}
	}
	*ret_id = id;
	return 0;
}

int etcd_lease_keepalive(struct etcd *e, uint64_t id)
{
	cJSON *res = NULL;
	const cJSON *result;
	int r = lease_call(e, "/v3/lease/keepalive", id, 0, &res);

	if (r < 0)
		return fail_op(e, r, "lease_keepalive", "");
	result = cJSON_GetObjectItemCaseSensitive(res, "result");
	/* A lease etcd no longer knows comes back without a TTL. */
	r = etcd_json_i64(result, "TTL") > 0 ? 0 : CRUN_ENOTFOUND;
	cJSON_Delete(res);
	return r;
}

int etcd_lease_revoke(struct etcd *e, uint64_t id)
{
	struct etcd_lease *l = id ? lease_slot(e, id) : NULL;
	cJSON *res = NULL;
	struct txn t;
	int r = 0;

	/* The registration goes first, with the live key: from then on the
	 * lease ending is not an expiry. */
	if (l && l->reg && txn_init(&t) == 0) {
		r = txn_run(
		    e, &t,
		    op(t.success, "delete_range", req_range(l->reg, NULL, false, false)) &&
			op(t.success, "delete_range", req_range(l->live, NULL, false, false)),
		    &res);
		cJSON_Delete(res);
		res = NULL;
	}
	if (r == 0)
		r = lease_call(e, "/v3/lease/revoke", id, 0, &res);
	cJSON_Delete(res);
	if (l) {
		free(l->reg);
		free(l->live);
		memset(l, 0, sizeof(*l));
	}
	if (r == CRUN_ENOTFOUND)
		return r;
	return r < 0 ? fail_op(e, r, "lease_revoke", "") : 0;
}

void etcd_leases_end(struct etcd *e)
{
	/* Closing a handle ends its leases as an expiry would (the crun
	 * store ends a closed connection's leases the same way): the live
	 * keys go, the registrations stay, so the expiry keys read as set. */
	e->timeout_ms = MIN(e->timeout_ms, 1000);
	for (int i = 0; i < ETCD_MAX_LEASES; i++) {
		struct etcd_lease *l = &e->leases[i];
		cJSON *res = NULL;

		if (!l->id)
			continue;
		(void)lease_call(e, "/v3/lease/revoke", l->id, 0, &res);
		cJSON_Delete(res);
	}
}

int etcd_put_leased(struct etcd *e, uint64_t id, const char *key, const char *val)
{
	int r = put(e, key, val, id);

	if (r == CRUN_ENOTFOUND) /* etcd: "requested lease not found" */
		return r;
	return r < 0 ? fail_op(e, r, "put_leased", key) : 0;
}
