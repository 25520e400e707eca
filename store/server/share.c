/* share.c: fairness of the store server's key space (issue 26). Each global
 * budget (entries, key bytes, value bytes, registrations) is shared: one job
 * may hold at most job_share_pct percent of it, one connection may add at
 * most conn_share_pct percent, and the last reserve_pct percent is kept for
 * crun's own rendezvous keys, so one flooding client or job is refused while
 * every other job's rendezvous goes on. etcd (NOSPACE) and Redis (maxmemory)
 * refuse writes the same way; reads, deletes and waits keep working.
 *
 * Defaults (server.h): job 50 %, connection 25 %, reserve 5 % of max_keys
 * 1 Mi, max_total_key_bytes 64 MiB, max_total_value_bytes 1 GiB, max_waiters
 * 1 Mi. A job's share is then 524,288 keys, 32 MiB of keys, 512 MiB of values
 * and 524,288 registrations; a connection's is half that.
 * - A 12,288-node c10d rendezvous, measured (bench/store_share_bench.py,
 *   rdzv_sim against crun-rdzvd's defaults): at its peak the job held 46,346
 *   keys (8.8 % of its share), 1.2 MB of keys (3.7 %), 1.3 MB of values
 *   (0.24 %) and 19,829 registrations (3.8 %), none refused, crun-rdzvd at
 *   43 MiB RSS: about 4 keys, 100 key bytes and 2 waits per node, so even a
 *   rendezvous ten times that size fits its job's share, and one store proxy
 *   carrying a whole node's agents on one upstream stays far inside a
 *   connection's quarter.
 * - A 98,304-rank worker store (arithmetic, not measured: torch writes an
 *   address, a barrier and a few collective keys per rank, ~4 keys of under
 *   64 bytes, values under 256 bytes, ~2 waits per rank): 393,216 keys (75 %
 *   of the share of keys of no job, ""), 24 MiB of keys (75 %), 96 MiB of
 *   values (19 %), 196,608 registrations (38 %); each rank is its own
 *   connection and adds ~4 keys. The tightest, keys, leaves a quarter free;
 *   a bigger worker store raises max-keys or job-share.
 * Single-threaded: the server's loop.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/auth.h"
#include "store/server/server_int.h"

enum ref_kind {
	REF_GLOBAL,  /* the global budget itself is full */
	REF_RESERVE, /* only the reserve is left, and this is no rendezvous key */
	REF_JOB,     /* the job's share is used up */
	REF_CONN,    /* the connection's share is used up */
};

static const char *const budget_names[STORE_B__MAX] = {
#define STORE_B_NAME_(id, name) [STORE_B_##id] = name,
    STORE_BUDGET_MAP(STORE_B_NAME_)
#undef STORE_B_NAME_
};

/* The metric each budget's refusals count under (server.h's table). */
static const enum store_metric budget_metric[STORE_B__MAX] = {
    [STORE_B_KEYS] = STORE_M_DROP_KEYS,
    [STORE_B_KEY_BYTES] = STORE_M_DROP_KEY_BYTES,
    [STORE_B_VALUE_BYTES] = STORE_M_DROP_VALUE_BYTES,
    [STORE_B_WAITERS] = STORE_M_DROP_WAITERS,
};

const char *store_budget_name(enum store_budget b)
{
	return (unsigned)b < STORE_B__MAX ? budget_names[b] : "?";
}

static uint64_t global_limit(const struct store_server *srv, enum store_budget b)
{
	switch (b) {
	case STORE_B_KEYS:
		return srv->cfg.max_keys;
	case STORE_B_KEY_BYTES:
		return srv->cfg.max_total_key_bytes;
	case STORE_B_VALUE_BYTES:
		return srv->cfg.max_total_value_bytes;
	default:
		return srv->cfg.max_waiters;
	}
}

static uint64_t global_used(const struct store_server *srv, enum store_budget b)
{
	switch (b) {
	case STORE_B_KEYS:
		return srv->kv.n_ents;
	case STORE_B_KEY_BYTES:
		return srv->kv.key_bytes;
	case STORE_B_VALUE_BYTES:
		return srv->kv.value_bytes;
	default:
		return srv->n_regs;
	}
}

/* pct percent of budget b; limits are at most 64 TiB, so no overflow. */
static uint64_t pct_of(const struct store_server *srv, enum store_budget b, uint32_t pct)
{
	return global_limit(srv, b) / 100 * pct + global_limit(srv, b) % 100 * pct / 100;
}

static struct store_share *share_new(const char *job, size_t len)
{
	struct store_share *s = calloc(1, sizeof(*s) + len + 1);

	if (!s)
		return NULL;
	memcpy(s->job, job, len);
	s->job_len = len;
	return s;
}

static bool share_idle(const struct store_share *s)
{
	for (int b = 0; b < STORE_B__MAX; b++)
		if (s->used[b])
			return false;
	return true;
}

/* The share of job (len bytes), found or made. A full table reuses an idle
 * share (its refusal counts start over) before falling back to `other`. */
static struct store_share *share_get(struct store_server *srv, const char *job, size_t len)
{
	struct store_share **pp, **idle = NULL, *s;

	for (pp = &srv->shares; (s = *pp); pp = &s->next) {
		if (s->job_len == len && !memcmp(s->job, job, len)) {
			*pp = s->next; /* to the front: a job's keys come in runs */
			s->next = srv->shares;
			srv->shares = s;
			return s;
		}
		if (share_idle(s))
			idle = pp;
	}
	if (srv->n_shares >= STORE_SHARE_MAX_JOBS) {
		if (!idle)
			return srv->share_other;
		s = *idle;
		*idle = s->next;
		free(s);
		srv->n_shares--;
	}
	s = share_new(job, len);
	if (!s)
		return srv->share_other;
	s->next = srv->shares;
	srv->shares = s;
	srv->n_shares++;
	return s;
}

/* The run id of a key under STORE_AUTH_JOB_ROOT "J/" (leading '/' optional:
 * torch 1.13 sends keys without it), or false. */
static bool key_job(const uint8_t *key, size_t len, const uint8_t **ret_job, size_t *ret_len)
{
	const char *root = STORE_AUTH_JOB_ROOT + 1;
	const size_t rl = sizeof(STORE_AUTH_JOB_ROOT) - 2;
	const uint8_t *slash;

	if (len && key[0] == '/') {
		key++;
		len--;
	}
	if (len <= rl || memcmp(key, root, rl))
		return false;
	slash = memchr(key + rl, '/', len - rl);
	if (!slash || slash == key + rl || (size_t)(slash - key - rl) > STORE_AUTH_JOB_MAX)
		return false;
	*ret_job = key + rl;
	*ret_len = (size_t)(slash - key - rl);
	return true;
}

struct store_share *store_share_for_key(struct store_server *srv, const struct store_conn *c,
					const uint8_t *key, size_t len, bool *ret_rdzv)
{
	const uint8_t *job;
	const char *named;
	size_t jl;

	*ret_rdzv = key_job(key, len, &job, &jl);
	if (*ret_rdzv)
		return share_get(srv, (const char *)job, jl);
	named = c ? store_conn_job(c) : NULL;
	return share_get(srv, named ? named : "", named ? strlen(named) : 0);
}

int store_conn_refuse(struct store_conn *c, enum store_metric why)
{
	c->why = (uint8_t)why;
	return CRUN_ETOOBIG;
}

/* Records why c was refused, for its close's log line. */
static int refused(struct store_server *srv, struct store_conn *c, struct store_share *s,
		   enum store_budget b, enum ref_kind kind)
{
	s->refused[b]++;
	if (!c) {
		srv->metrics[budget_metric[b]]++;
		return CRUN_ETOOBIG;
	}
	c->ref_share = s;
	c->ref_kind = (uint8_t)kind;
	c->ref_budget = (uint8_t)b;
	return store_conn_refuse(c, budget_metric[b]);
}

int store_share_admit(struct store_server *srv, struct store_conn *c, struct store_share *s,
		      bool rdzv, const uint64_t d[STORE_B__MAX])
{
	const struct store_server_config *cfg = &srv->cfg;

	for (int i = 0; i < STORE_B__MAX; i++) {
		enum store_budget b = (enum store_budget)i;
		uint64_t lim = global_limit(srv, b), used = global_used(srv, b);
		uint64_t mine = b == STORE_B_WAITERS && c ? c->n_regs : c ? c->added[b] : 0;

		if (!d[b])
			continue;
		if (used + d[b] > lim)
			return refused(srv, c, s, b, REF_GLOBAL);
		/* The server's own writes (a lease's expiry key) are crun's. */
		if (c && !rdzv && used + d[b] > lim - pct_of(srv, b, cfg->reserve_pct))
			return refused(srv, c, s, b, REF_RESERVE);
		if (s->used[b] + d[b] > pct_of(srv, b, cfg->job_share_pct))
			return refused(srv, c, s, b, REF_JOB);
		if (c && mine + d[b] > pct_of(srv, b, cfg->conn_share_pct))
			return refused(srv, c, s, b, REF_CONN);
	}
	return 0;
}

void store_share_note(struct store_conn *c, enum store_budget b, int64_t delta)
{
	if (!c)
		return;
	if (delta < 0 && (uint64_t)-delta > c->added[b])
		c->added[b] = 0;
	else
		c->added[b] += (uint64_t)delta;
}

/* A write over a budget: counted, and refused to the client when there is
 * one (c is NULL for the server's own writes, a lease's expiry key). */
static int refuse(struct store_server *srv, struct store_conn *c, enum store_metric m)
{
	if (c)
		return store_conn_refuse(c, m);
	srv->metrics[m]++;
	return CRUN_ETOOBIG;
}

/* kv_get_or_add, where a new key must fit its job's and c's shares (NULL
 * c: the server's own key); a refusal counts under the budget that was full. */
int store_share_ent_get(struct store_server *srv, struct store_conn *c, const struct store_bytes *k,
			struct kv_ent **ret)
{
	struct kv_table *t = &srv->kv;
	struct store_share *share;
	bool rdzv;
	int r;

	*ret = kv_find(t, k->p, k->len);
	if (*ret)
		return 0;
	share = store_share_for_key(srv, c, k->p, k->len, &rdzv);
	TRY(store_share_admit(srv, c, share, rdzv, (uint64_t[STORE_B__MAX]){1, k->len, 0, 0}));
	r = kv_get_or_add(t, k->p, k->len, share, ret);
	if (r == CRUN_ETOOBIG)
		return refuse(
		    srv, c, t->n_ents >= t->max_ents ? STORE_M_DROP_KEYS : STORE_M_DROP_KEY_BYTES);
	if (r < 0)
		return r;
	(*ret)->rdzv = rdzv;
	store_share_note(c, STORE_B_KEYS, 1);
	store_share_note(c, STORE_B_KEY_BYTES, (int64_t)k->len);
	return 0;
}

/* "64 MiB", "3 KiB", "100 bytes" or "5": exact amounts round down. */
static void amount(enum store_budget b, uint64_t v, char *buf, size_t cap)
{
	unsigned long long n = v;
	const char *unit = "";

	if (b == STORE_B_KEY_BYTES || b == STORE_B_VALUE_BYTES) {
		unit = v >= (1u << 20) ? " MiB" : v >= 1024 ? " KiB" : " bytes";
		n = v >= (1u << 20) ? v >> 20 : v >= 1024 ? v >> 10 : v;
	}
	if (str_printf(buf, cap, "%llu%s", n, unit) < 0 && cap)
		buf[0] = '\0';
}

void store_share_refusal_text(const struct store_conn *c, char *buf, size_t cap)
{
	const struct store_server *srv = c->srv;
	enum store_budget b = (enum store_budget)c->ref_budget;
	const char *what = budget_names[b];
	const struct store_share *s = c->ref_share;
	const char *job = s && s->job_len ? s->job : "-";
	char u[32], l[32];
	int r;

	if (cap)
		buf[0] = '\0';
	if (!s)
		return;
	switch ((enum ref_kind)c->ref_kind) {
	case REF_JOB:
		amount(b, s->used[b], u, sizeof(u));
		amount(b, pct_of(srv, b, srv->cfg.job_share_pct), l, sizeof(l));
		r = str_printf(buf, cap, "store full: job '%s' used %s of its %s %s", job, u, l,
			       what);
		break;
	case REF_CONN:
		amount(b, b == STORE_B_WAITERS ? c->n_regs : c->added[b], u, sizeof(u));
		amount(b, pct_of(srv, b, srv->cfg.conn_share_pct), l, sizeof(l));
		r = str_printf(buf, cap,
			       "store full: this connection (job '%s') added %s of its %s %s", job,
			       u, l, what);
		break;
	case REF_RESERVE:
		amount(b, pct_of(srv, b, srv->cfg.reserve_pct), l, sizeof(l));
		r = str_printf(
		    buf, cap,
		    "store full: job '%s': the last %s %s are kept for crun's rendezvous "
		    "keys",
		    job, l, what);
		break;
	default:
		amount(b, global_limit(srv, b), l, sizeof(l));
		r = str_printf(buf, cap, "store full: all %s %s used (job '%s')", l, what, job);
		break;
	}
	if (r < 0 && cap)
		buf[0] = '\0';
}

int store_share_init(struct store_server *srv)
{
	srv->share_other = share_new(STORE_SHARE_OTHER, sizeof(STORE_SHARE_OTHER) - 1);
	return srv->share_other ? 0 : CRUN_ENOMEM;
}

void store_share_release(struct store_server *srv)
{
	while (srv->shares) {
		struct store_share *s = srv->shares;

		srv->shares = s->next;
		free(s);
	}
	free(srv->share_other);
	srv->share_other = NULL;
	srv->n_shares = 0;
}

static void share_info(const struct store_server *srv, const struct store_share *s,
		       void (*fn)(const struct store_share_info *si, void *arg), void *arg)
{
	struct store_share_info si = {.job = s->job};
	bool any = false;

	for (int b = 0; b < STORE_B__MAX; b++) {
		si.used[b] = s->used[b];
		si.refused[b] = s->refused[b];
		si.limit[b] = pct_of(srv, (enum store_budget)b, srv->cfg.job_share_pct);
		any |= s->used[b] || s->refused[b];
	}
	if (any)
		fn(&si, arg);
}

void store_server_each_share(const struct store_server *srv,
			     void (*fn)(const struct store_share_info *si, void *arg), void *arg)
{
	for (const struct store_share *s = srv->shares; s; s = s->next)
		share_info(srv, s, fn, arg);
	if (srv->share_other)
		share_info(srv, srv->share_other, fn, arg);
}
