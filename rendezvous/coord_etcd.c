/* coord_etcd.c: coord.h's operations on etcd v3 (transport in etcd_http.c,
 * request builders in etcd_txn.c, counters in etcd_counter.c).
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
#define MGET_BATCH     64   /* ops per txn: etcd's default --max-txn-ops is 128 */

/* ---- reading a key (with its lease keys) ------------------------------------- */

/* Appends range requests for K's registrations and live keys to a txn
 * branch: counts only, or the keys (registrations with their values). */
static bool lease_ranges(cJSON *branch, const char *k, bool counts)
{
	char *reg = NULL, *rege = NULL, *live = NULL, *livee = NULL;
	bool ok = asprintf(&reg, "%s\x01reg/", k) >= 0 && asprintf(&rege, "%s\x01reg0", k) >= 0 &&
		  asprintf(&live, "%s\x01live/", k) >= 0 &&
		  asprintf(&livee, "%s\x01live0", k) >= 0 &&
		  etcd_op(branch, "range", etcd_req_range(reg, rege, counts, false)) &&
		  etcd_op(branch, "range", etcd_req_range(live, livee, counts, !counts));

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
	struct etcd_txn t;
	int r;

	TRY(etcd_txn_init(&t));
	r = etcd_txn_run(e, &t, lease_ranges(t.success, k, false), &res);
	if (r < 0)
		goto out;
	regs = cJSON_GetObjectItemCaseSensitive(etcd_txn_range(res, 0), "kvs");
	lives = cJSON_GetObjectItemCaseSensitive(etcd_txn_range(res, 1), "kvs");
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
		r = etcd_kv_of(kv, &why, NULL);
		break;
	}
	if (r < 0)
		goto out;
	r = etcd_txn_init(&t);
	if (r < 0)
		goto out;
	{
		cJSON *del = etcd_req_range(reg, NULL, false, false);
		cJSON *del2 = etcd_req_range(reg, NULL, false, false);
		bool ok = etcd_cmp(t.compare, k, "CREATE", 0, NULL) &&
			  etcd_op(t.success, "put", etcd_req_put(k, why, 0, false)) &&
			  etcd_op(t.success, "delete_range", del) &&
			  etcd_op(t.failure, "delete_range", del2) &&
			  etcd_op(t.failure, "range", etcd_req_range(k, NULL, false, false));

		r = etcd_txn_run(e, &t, ok, &res2);
	}
	if (r < 0)
		goto out;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res2, "succeeded"))) {
		*ret_val = why;
		why = NULL;
		r = 0;
	} else {
		r = etcd_kv_value(etcd_txn_range(res2, 1), ret_val, NULL);
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
	struct etcd_txn t;
	int64_t nreg, nlive;
	int r;

	TRY(etcd_txn_init(&t));
	r = etcd_txn_run(e, &t,
			 etcd_op(t.success, "range", etcd_req_range(k, NULL, false, false)) &&
			     lease_ranges(t.success, k, true),
			 &res);
	if (r < 0)
		return r;
	*ret_rev = etcd_json_i64(cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
	r = etcd_kv_value(etcd_txn_range(res, 0), &v, NULL);
	if (r == CRUN_ENOTFOUND) {
		nreg = etcd_json_i64(etcd_txn_range(res, 1), "count");
		nlive = etcd_json_i64(etcd_txn_range(res, 2), "count");
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

/* What a wait is about: reads the state it waits for (1 done, 0 not yet, or
 * an error) and the store revision it read. */
typedef int (*wait_check_fn)(struct etcd *e, void *arg, int64_t *ret_rev);

/* The one wait loop: check, and between checks a watch on w[0..nw) (named
 * ident) from the revision after the read, so that nothing in between can
 * be missed. 0 when check said done, CRUN_ETIMEDOUT, or an error. */
static int watch_until(struct etcd *e, const char *ident, size_t il, const struct etcd_wrange *w,
		       size_t nw, uint64_t deadline, wait_check_fn check, void *arg)
{
	for (int i = 0; i < 1 << 30; i++) {
		int64_t rev = 0;
		uint64_t now = clock_now_ms();
		int r;

		/* A live watch with no event since the last check said "not
		 * yet" means still not: no request. The check is repeated on an
		 * event, and every few seconds as a check that the watch's
		 * member still answers (a member that stopped answering never
		 * closes the stream; the read fails over). */
		if (!etcd_watch_matches(e, ident, il) || e->w.event ||
		    now - e->w.checked_ms >= WATCH_CHECK_MS) {
			etcd_watch_rearm(e);
			r = check(e, arg, &rev);
			if (r < 0)
				return r;
			e->w.checked_ms = now = clock_now_ms();
			if (r == 1) {
				/* Done: the next wait must read again (the
				 * shortcut above holds only after "not yet"). */
				e->w.checked_ms = 0;
				return 0;
			}
			/* A watch on another member (we failed over) or a
			 * dead one is replaced. */
			if (!etcd_watch_matches(e, ident, il)) {
				TRY(etcd_watch_start_n(e, w, nw, ident, il, rev + 1));
				e->w.checked_ms = now;
			}
		}
		if (now >= deadline)
			return CRUN_ETIMEDOUT;
		if (etcd_watch_wait(e, MIN(deadline, e->w.checked_ms + WATCH_CHECK_MS)) ==
		    ETCD_W_DEAD)
			etcd_watch_stop(e);
	}
	return CRUN_ETIMEDOUT;
}

struct value_wait {
	const char *k;
	char *v;
};

static int value_check(struct etcd *e, void *arg, int64_t *ret_rev)
{
	struct value_wait *vw = arg;

	TRY(probe(e, vw->k, &vw->v, ret_rev));
	return vw->v ? 1 : 0;
}

/* Waits up to timeout_ms for K and returns its value (ret_val may be NULL).
 * The watch covers [K, K"\x02"): K and its lease keys. */
static int wait_value(struct etcd *e, const char *key, uint32_t timeout_ms, char **ret_val)
{
	size_t kl;
	char *k = etcd_key(e, key, NULL, &kl), *end = etcd_key(e, key, "\x02", NULL);
	struct value_wait vw = {k, NULL};
	struct etcd_wrange w = {k, kl, end, kl + 1, false};
	int r = CRUN_ENOMEM;

	if (k && end)
		r = watch_until(e, k, kl, &w, 1, clock_now_ms() + timeout_ms, value_check, &vw);
	if (r == 0 && ret_val)
		*ret_val = vw.v;
	else
		free(vw.v);
	free(k);
	free(end);
	return r;
}

/* ---- waiting for any of several keys ------------------------------------------ */

struct any_wait {
	char **k; /* full keys */
	size_t n;
	int idx; /* the first present, -1 none */
};

/* Reads every key's presence and lease keys in one txn; a key whose lease
 * lapsed is written for good (materialize) and counts as present. */
static int any_check(struct etcd *e, void *arg, int64_t *ret_rev)
{
	struct any_wait *aw = arg;
	cJSON *res = NULL;
	struct etcd_txn t;
	bool ok = true;
	int r;

	TRY(etcd_txn_init(&t));
	for (size_t i = 0; ok && i < aw->n; i++)
		ok = etcd_op(t.success, "range", etcd_req_range(aw->k[i], NULL, true, false)) &&
		     lease_ranges(t.success, aw->k[i], true);
	TRY(etcd_txn_run(e, &t, ok, &res));
	*ret_rev = etcd_json_i64(cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
	r = 0;
	aw->idx = -1;
	for (size_t i = 0; r == 0 && aw->idx < 0 && i < aw->n; i++) {
		int b = (int)(3 * i);
		char *v = NULL;

		if (etcd_json_i64(etcd_txn_range(res, b), "count") > 0) {
			aw->idx = (int)i;
		} else if (etcd_json_i64(etcd_txn_range(res, b + 1), "count") >
			   etcd_json_i64(etcd_txn_range(res, b + 2), "count")) {
			r = materialize(e, aw->k[i], &v);
			free(v);
			if (r == 0)
				aw->idx = (int)i;
			else if (r == CRUN_ENOTFOUND)
				r = 0;
		}
	}
	cJSON_Delete(res);
	return r < 0 ? r : aw->idx >= 0;
}

int etcd_wait_any(struct etcd *e, const char *const *keys, size_t n, uint32_t timeout_ms)
{
	struct any_wait aw = {calloc(n, sizeof(char *)), n, -1};
	struct etcd_wrange *w = calloc(2 * n, sizeof(*w));
	char **ends = calloc(2 * n, sizeof(char *)), *ident = NULL;
	size_t il = 0;
	int r = CRUN_ENOMEM;

	if (!aw.k || !w || !ends || n == 0 || n > ETCD_ANY_MAX)
		goto out;
	/* Per key, one stream carries two watches: the key itself, and the
	 * deletions of its lease keys (a lapse): the lease keys' puts, one per
	 * member that joined, are no event to anyone. */
	for (size_t i = 0; i < n; i++) {
		size_t kl;

		aw.k[i] = etcd_key(e, keys[i], NULL, &kl);
		ends[2 * i] = etcd_key(e, keys[i], "\x01live/", NULL);
		ends[2 * i + 1] = etcd_key(e, keys[i], "\x01live0", NULL);
		if (!aw.k[i] || !ends[2 * i] || !ends[2 * i + 1])
			goto out;
		w[2 * i] = (struct etcd_wrange){aw.k[i], kl, NULL, 0, false};
		w[2 * i + 1] =
		    (struct etcd_wrange){ends[2 * i], kl + 6, ends[2 * i + 1], kl + 6, true};
		il += kl + 1;
	}
	ident = malloc(il + 1);
	if (!ident)
		goto out;
	/* The set's name: "\x03" then the keys, so no single key's watch
	 * (wait_value) is taken for it. */
	ident[0] = '\x03';
	for (size_t i = 0, o = 1; i < n; i++) {
		memcpy(ident + o, aw.k[i], w[2 * i].key_len);
		o += w[2 * i].key_len;
		if (i + 1 < n)
			ident[o++] = '\n';
	}
	il = il > 0 ? il : 1;
	r = watch_until(e, ident, il, w, 2 * n, clock_now_ms() + (timeout_ms ? timeout_ms : 1),
			any_check, &aw);
out:
	for (size_t i = 0; aw.k && i < n; i++)
		free(aw.k[i]);
	for (size_t i = 0; ends && i < 2 * n; i++)
		free(ends[i]);
	free(aw.k);
	free(ends);
	free(w);
	free(ident);
	if (r == 0)
		return aw.idx;
	if (r == CRUN_ETIMEDOUT)
		return r;
	return etcd_fail_op(e, r, "wait_any", n ? keys[0] : "");
}

/* ---- coord.h operations ---------------------------------------------------------- */

/* A put of "<prefix><key>", under lease id when not 0. */
static int put(struct etcd *e, const char *key, const char *val, uint64_t id)
{
	char *k = etcd_key(e, key, NULL, NULL), *body = NULL;
	cJSON *p = k ? etcd_req_put(k, val, id, false) : NULL, *res = NULL;
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

	return r < 0 ? etcd_fail_op(e, r, "set", key) : 0;
}

int etcd_multi_set(struct etcd *e, const char *const *keys, const char *const *vals, size_t n)
{
	int r = 0;

	/* MGET_BATCH puts per txn (etcd caps the ops of one). */
	for (size_t o = 0; o < n && r == 0; o += MGET_BATCH) {
		struct etcd_txn t;
		cJSON *res = NULL;
		bool ok = true;

		TRY(etcd_txn_init(&t));
		for (size_t i = o; i < n && i < o + MGET_BATCH && ok; i++) {
			char *k = etcd_key(e, keys[i], NULL, NULL);

			ok = k && etcd_op(t.success, "put", etcd_req_put(k, vals[i], 0, false));
			free(k);
		}
		r = etcd_txn_run(e, &t, ok, &res);
		cJSON_Delete(res);
	}
	return r < 0 ? etcd_fail_op(e, r, "multi_set", n ? keys[0] : "") : 0;
}

/* key's value into *ret_v (NULL: no such key); a failure is said for op. */
static int read_value(struct etcd *e, const char *key, const char *op, char **ret_v)
{
	char *k = etcd_key(e, key, NULL, NULL);
	int64_t rev;
	int r = k ? probe(e, k, ret_v, &rev) : CRUN_ENOMEM;

	free(k);
	return r < 0 ? etcd_fail_op(e, r, op, key) : 0;
}

int etcd_exists(struct etcd *e, const char *key)
{
	char *v = NULL;
	bool found;

	TRY(read_value(e, key, "exists", &v));
	found = v != NULL;
	free(v);
	return found;
}

int etcd_try_get(struct etcd *e, const char *key, char **ret_val)
{
	char *v = NULL;

	TRY(read_value(e, key, "get", &v));
	if (!v)
		return CRUN_ENOTFOUND;
	*ret_val = v;
	return 0;
}

int etcd_get(struct etcd *e, const char *key, uint32_t timeout_ms, char **ret_val)
{
	int r = wait_value(e, key, timeout_ms ? timeout_ms : etcd_timeout_ms(e), ret_val);

	return r < 0 ? etcd_fail_op(e, r, "get", key) : 0;
}

int etcd_wait(struct etcd *e, const char *key, uint32_t timeout_ms)
{
	int r = wait_value(e, key, timeout_ms ? timeout_ms : 1, NULL);

	if (r == CRUN_ETIMEDOUT)
		return r;
	return r < 0 ? etcd_fail_op(e, r, "wait", key) : 0;
}

/* Reads up to MGET_BATCH keys in one txn; a key found goes to vals[i], an
 * absent one (or a lapsed lease's key: wait_value materializes it) stays
 * NULL. */
static int mget_batch(struct etcd *e, const char *const *keys, size_t n, char **vals)
{
	cJSON *res = NULL;
	struct etcd_txn t;
	bool ok = true;
	int r;

	TRY(etcd_txn_init(&t));
	for (size_t i = 0; i < n && ok; i++) {
		char *k = etcd_key(e, keys[i], NULL, NULL);

		ok = k && etcd_op(t.success, "range", etcd_req_range(k, NULL, false, false));
		free(k);
	}
	r = etcd_txn_run(e, &t, ok, &res);
	for (size_t i = 0; i < n && r == 0; i++) {
		r = etcd_kv_value(etcd_txn_range(res, (int)i), &vals[i], NULL);
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
	return etcd_fail_op(e, r, "multi_get", keys[i ? i - 1 : 0]);
}

/* A compare-and-set. A counter stores its number encoded (see CTR_TAG): when
 * the value compare fails but the number read is the expected one, the set
 * is retried against that counter's mod revision. */
static int cas(struct etcd *e, const char *k, const char *expected, const char *desired,
	       char **ret_cur)
{
	cJSON *res = NULL;
	struct etcd_txn t;
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
		TRY(etcd_txn_init(&t));
		r = etcd_txn_run(
		    e, &t,
		    (!*expected ? etcd_cmp(t.compare, k, "CREATE", 0, NULL)
		     : mod >= 0 ? etcd_cmp(t.compare, k, "MOD", mod, NULL)
				: etcd_cmp(t.compare, k, "VALUE", 0, expected)) &&
			etcd_op(t.success, "put", etcd_req_put(k, desired, 0, false)) &&
			etcd_op(t.failure, "range", etcd_req_range(k, NULL, false, false)),
		    &res);
		if (r < 0)
			return r;
		if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "succeeded"))) {
			r = (*ret_cur = str_dup(desired)) ? 0 : CRUN_ENOMEM;
			break;
		}
		r = etcd_kv_value(etcd_txn_range(res, 0), &cur, &m);
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
	char *k = etcd_key(e, key, NULL, NULL), *cur = NULL;
	int r = k ? cas(e, k, expected, desired, &cur) : CRUN_ENOMEM;

	free(k);
	if (r < 0)
		return etcd_fail_op(e, r, "compare_set", key);
	if (ret_cur)
		*ret_cur = cur;
	else
		free(cur);
	return 0;
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
	struct etcd_txn t;
	uint64_t id;
	int r;

	if (!l)
		return etcd_fail(e, CRUN_ETOOBIG, "more than %d leases on one handle",
				 ETCD_MAX_LEASES);
	/* etcd counts TTLs in seconds and raises them to its minimum. */
	r = lease_call(e, "/v3/lease/grant", 0, MAX(1, (int64_t)(ttl_ms + 999) / 1000), &res);
	if (r < 0)
		return etcd_fail_op(e, r, "lease_grant", expiry_key);
	id = (uint64_t)etcd_json_i64(res, "ID");
	cJSON_Delete(res);
	if (!id)
		return etcd_fail(e, CRUN_EPROTO, "lease_grant: etcd sent no lease id");
	l->id = id;
	if (expiry_key && *expiry_key) {
		char sfx[64];

		snprintf(sfx, sizeof(sfx), "\x01reg/%016" PRIx64, id);
		l->reg = etcd_key(e, expiry_key, sfx, NULL);
		snprintf(sfx, sizeof(sfx), "\x01live/%016" PRIx64, id);
		l->live = etcd_key(e, expiry_key, sfx, NULL);
		r = CRUN_ENOMEM;
		if (l->reg && l->live && etcd_txn_init(&t) == 0)
			r = etcd_txn_run(
			    e, &t,
			    etcd_op(t.success, "put", etcd_req_put(l->reg, why, 0, false)) &&
				etcd_op(t.success, "put", etcd_req_put(l->live, "", id, false)),
			    &res2);
		cJSON_Delete(res2);
		if (r < 0) {
			(void)etcd_lease_revoke(e, id);
			return etcd_fail_op(e, r, "lease_grant", expiry_key);
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
		return etcd_fail_op(e, r, "lease_keepalive", "");
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
	struct etcd_txn t;
	int r = 0;

	/* The registration goes first, with the live key: from then on the
	 * lease ending is not an expiry. */
	if (l && l->reg && etcd_txn_init(&t) == 0) {
		r = etcd_txn_run(e, &t,
				 etcd_op(t.success, "delete_range",
					 etcd_req_range(l->reg, NULL, false, false)) &&
				     etcd_op(t.success, "delete_range",
					     etcd_req_range(l->live, NULL, false, false)),
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
	return r < 0 ? etcd_fail_op(e, r, "lease_revoke", "") : 0;
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
	return r < 0 ? etcd_fail_op(e, r, "put_leased", key) : 0;
}
