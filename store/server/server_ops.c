/* server_ops.c: the store server's operations, as torch's servers run them
 * (../shared/reference/torch-compat.md §1.4): replies, v1 watch
 * notifications, ADD's decimal text, the COMPARE_SET table, queues and
 * barriers, and crun's key-value extension ops (TRY_GET, TICKET). WAIT
 * registrations and wake-ups are waits.c's, the shares' admission of a new
 * key share.c's. Called from conn.c with one decoded request at a time;
 * everything runs on the server's loop thread.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

/* ---- writes ---------------------------------------------------------------- */

/* v1 WATCH_KEY notification: type, key, old value, new value. */
static void notify_watchers(struct store_server *srv, struct kv_ent *e, uint8_t type,
			    const uint8_t *old, size_t old_len, const uint8_t *nv, size_t new_len)
{
	struct dl *n;
	uint8_t hdr[9];

	hdr[0] = type;
	store_put_u64(hdr + 1, e->key_len);
	for (n = e->watchers.next; n != &e->watchers; n = n->next) {
		struct store_conn *w = DL_ENTRY(n, struct kv_reg, key_link)->conn;
		struct evbuffer *out = store_conn_out(w);
		uint8_t l[8];
		int r;

		/* A notification can carry two whole values: never buffered
		 * for a watcher that does not read, nor past the total. */
		if (!store_conn_may_push(w, sizeof(hdr) + e->key_len + 16 + old_len + new_len))
			continue;
		r = evbuffer_add(out, hdr, sizeof(hdr));

		r |= evbuffer_add(out, e->key, e->key_len);
		store_put_u64(l, old_len);
		r |= evbuffer_add(out, l, 8);
		if (old_len)
			r |= evbuffer_add(out, old, old_len);
		store_put_u64(l, new_len);
		r |= evbuffer_add(out, l, 8);
		if (new_len)
			r |= evbuffer_add(out, nv, new_len);
		if (r)
			w->doomed = true;
		store_conn_flush(w);
		store_conn_check_pushed(w);
	}
}

/* Stores (or appends) a value under e, enforcing the key space's total value
 * ceiling, and tells v1 watchers. The caller replies, then wakes waiters. On
 * failure an entry left holding nothing (a key just created for this write) is
 * freed, so e must not be used after an error. */
static int put_value(struct store_server *srv, struct store_conn *c, struct kv_ent *e,
		     const uint8_t *v, size_t len, bool append)
{
	size_t old_len = e->present ? e->val_len : 0;
	int64_t grow = append ? (int64_t)len : (int64_t)len - (int64_t)old_len;
	bool created = !e->present;
	uint8_t *old = NULL;
	int r;

	if (grow > 0) {
		r = store_share_admit(srv, c, e->share, e->rdzv,
				      (uint64_t[STORE_B__MAX]){0, 0, (uint64_t)grow, 0});
		if (r < 0)
			goto fail;
	}
	if (!DL_EMPTY(&e->watchers) && old_len) {
		old = mem_dup(e->val, old_len);
		if (!old) {
			r = CRUN_ENOMEM;
			goto fail;
		}
	}
	r = kv_put(&srv->kv, e, v, len, append);
	if (r < 0)
		goto fail;
	store_share_note(c, STORE_B_VALUE_BYTES, grow);
	if (!DL_EMPTY(&e->watchers))
		notify_watchers(srv, e, created ? STORE_WATCH_CREATED : STORE_WATCH_UPDATED, old,
				old ? old_len : 0, e->val, e->val_len);
	free(old);
	return 0;
fail:
	free(old);
	kv_gc(&srv->kv, e);
	return r;
}

static int set_key(struct store_server *srv, struct store_conn *c, const struct store_bytes *k,
		   const struct store_bytes *v, bool append)
{
	struct kv_ent *e;

	TRY(store_share_ent_get(srv, c, k, &e));
	TRY(put_value(srv, c, e, v->p, v->len, append));
	store_wake_all(srv, e);
	return 0;
}

int store_server_set_key(struct store_server *srv, const struct store_bytes *k,
			 const struct store_bytes *v)
{
	return set_key(srv, NULL, k, v, false);
}

int store_server_put(struct store_server *srv, const uint8_t *key, size_t klen, const uint8_t *val,
		     size_t vlen)
{
	struct store_bytes k = {key, klen}, v = {val, vlen};

	return store_server_set_key(srv, &k, &v);
}

/* std::stoll as torch's ADD applies it to the stored text: leading
 * whitespace, an optional sign, at least one digit, trailing junk ignored;
 * no digits or overflow is an error (torch closes the connection). */
static int parse_stoll(const uint8_t *p, size_t len, int64_t *ret)
{
	size_t i = 0;
	bool neg = false;
	uint64_t v = 0, lim;

	while (i < len && (p[i] == ' ' || (p[i] >= '\t' && p[i] <= '\r')))
		i++;
	if (i < len && (p[i] == '+' || p[i] == '-'))
		neg = p[i++] == '-';
	if (i >= len || p[i] < '0' || p[i] > '9')
		return CRUN_EPROTO;
	lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
	for (; i < len && p[i] >= '0' && p[i] <= '9'; i++) {
		unsigned d = p[i] - '0';

		if (v > (lim - d) / 10)
			return CRUN_ERANGE;
		v = v * 10 + d;
	}
	*ret = neg ? (int64_t)(0 - v) : (int64_t)v;
	return 0;
}

/* std::to_string of an int64; returns the length written into buf[21]. */
static size_t i64_text(int64_t v, char *buf)
{
	char tmp[24];
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = 0, len = 0;

	do {
		tmp[n++] = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		buf[len++] = '-';
	while (n)
		buf[len++] = tmp[--n];
	return len;
}

/* ADD and BARRIER: the value is a decimal counter (missing = 0) stored back
 * as text. Wrapping on overflow, where torch has undefined behaviour. */
static int add_counter(struct store_conn *c, struct kv_ent *e, int64_t delta, int64_t *ret)
{
	int64_t cur = 0;
	char text[24];

	if (e->present)
		TRY(parse_stoll(e->val, e->val_len, &cur));
	cur = (int64_t)((uint64_t)cur + (uint64_t)delta);
	TRY(put_value(c->srv, c, e, (const uint8_t *)text, i64_text(cur, text), false));
	*ret = cur;
	return 0;
}

/* ---- operations ------------------------------------------------------------ */

static int op_get(struct store_conn *c, const struct store_req *q)
{
	struct kv_ent *e = kv_find(&c->srv->kv, q->key.p, q->key.len);

	if (e && e->present)
		return reply_bytes(c, e->val, e->val_len);
	/* Missing key: 1.13's server throws and closes; libuv sends empty. */
	if (c->dialect == STORE_V1)
		return CRUN_ENOTFOUND;
	return reply_bytes(c, NULL, 0);
}

static int op_add(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;
	int64_t v;

	TRY(store_share_ent_get(c->srv, c, &q->key, &e));
	TRY(add_counter(c, e, q->num, &v));
	TRY(reply_i64(c, v));
	store_wake_all(srv, e);
	return 0;
}

/* The COMPARE_SET table of §1.4, including "absent key, non-empty expected:
 * reply expected, store nothing". Waiters wake whenever the key exists after
 * the operation (torch's libuv server wakes always, legacy never). */
static int op_compare_set(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);

	if (!e || !e->present) {
		if (q->val.len)
			return reply_bytes(c, q->val.p, q->val.len);
		TRY(store_share_ent_get(c->srv, c, &q->key, &e));
		TRY(put_value(c->srv, c, e, q->val2.p, q->val2.len, false));
	} else if (e->val_len == q->val.len && !memcmp(e->val, q->val.p, q->val.len)) {
		TRY(put_value(c->srv, c, e, q->val2.p, q->val2.len, false));
	}
	TRY(reply_bytes(c, e->val, e->val_len));
	store_wake_all(srv, e);
	return 0;
}

/* CHECK and WAIT over a key list. A WAIT counts the missing keys and
 * registers on each; its STOP_WAITING goes out when the count reaches 0. */
static int op_wait(struct store_conn *c, const struct store_req *q, bool check)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	uint64_t missing = 0;
	struct store_bytes k;

	for (uint64_t i = 0; i < q->nitems; i++) {
		store_items_next(&it, &k);
		if (!key_exists(kv_find(&srv->kv, k.p, k.len)))
			missing++;
	}
	if (check)
		return reply_u8(c, missing ? STORE_CHECK_NOT_READY : STORE_CHECK_READY);
	if (!missing)
		return reply_u8(c, STORE_WAIT_STOP_WAITING);
	TRY(store_reg_budget(c, missing));
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		int r;

		TRY(store_share_ent_get(c->srv, c, &k, &e));
		if (key_exists(e))
			continue;
		r = store_reg_add(c, e, true);
		if (r < 0) {
			kv_gc(&srv->kv, e);
			return r;
		}
	}
	c->pending = missing; /* torch: a second WAIT overwrites the count */
	c->parked = c->dialect == STORE_V2;
	return 0;
}

/* TICKET: ADD 1 to the counter, then SET prefix + the count to the value. */
static int op_ticket(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_server *srv = c->srv;
	size_t cap = q->key2.len + 24;
	uint8_t *key = malloc(cap);
	struct store_bytes k = {key, 0};
	struct kv_ent *e;
	int64_t t;
	int r;

	if (!key)
		return CRUN_ENOMEM;
	r = store_share_ent_get(srv, c, &q->key, &e);
	if (r == 0)
		r = add_counter(c, e, 1, &t);
	if (r == 0) {
		store_wake_all(srv, e);
		memcpy(key, q->key2.p, q->key2.len);
		k.len = q->key2.len + i64_text(t, (char *)key + q->key2.len);
		r = k.len > srv->cfg.limits.max_key_bytes ? CRUN_ETOOBIG : 0;
	}
	if (r == 0)
		r = set_key(srv, c, &k, &q->val, false);
	free(key);
	return r < 0 ? r : reply_i64(c, t);
}

int store_conn_ext_kv(struct store_conn *c, const struct store_ext_req *q)
{
	struct kv_ent *e;

	if (q->op == STORE_EXT_TICKET)
		return op_ticket(c, q);
	e = kv_find(&c->srv->kv, q->key.p, q->key.len);
	TRY(reply_u8(c, e && e->present ? 1 : 0));
	return e && e->present ? reply_bytes(c, e->val, e->val_len) : reply_bytes(c, NULL, 0);
}

/* Deletes e's value, as DELETE_KEY does; e may be freed. */
static void del_value(struct store_server *srv, struct kv_ent *e)
{
	if (!DL_EMPTY(&e->watchers))
		notify_watchers(srv, e, STORE_WATCH_DELETED, e->val, e->val_len, NULL, 0);
	kv_drop_value(&srv->kv, e);
	kv_gc(&srv->kv, e);
}

static int op_delete(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);

	if (!e || !e->present)
		return reply_i64(c, 0);
	/* What c deletes it may add again (a round's keys come and go). */
	store_share_note(c, STORE_B_VALUE_BYTES, -(int64_t)e->val_len);
	if (!e->q_len && DL_EMPTY(&e->waiters) && DL_EMPTY(&e->watchers)) {
		store_share_note(c, STORE_B_KEYS, -1);
		store_share_note(c, STORE_B_KEY_BYTES, -(int64_t)e->key_len);
	}
	del_value(srv, e);
	return reply_i64(c, 1);
}

static int op_watch(struct store_conn *c, const struct store_req *q)
{
	struct kv_ent *e;
	int r;

	TRY(store_reg_budget(c, 1));
	TRY(store_share_ent_get(c->srv, c, &q->key, &e));
	r = store_reg_add(c, e, false);
	if (r < 0) {
		kv_gc(&c->srv->kv, e);
		return r;
	}
	return reply_u8(c, STORE_WATCH_REGISTERED);
}

static int op_multi_get(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	struct store_bytes k;
	size_t total = 0;

	/* Bound the reply before building any of it. */
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		e = kv_find(&srv->kv, k.p, k.len);
		total += 8 + (e && e->present ? e->val_len : 0);
		if (total > srv->cfg.max_conn_buffered_bytes)
			return CRUN_ETOOBIG;
	}
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		e = kv_find(&srv->kv, k.p, k.len);
		if (e && e->present)
			TRY(reply_bytes(c, e->val, e->val_len));
		else
			TRY(reply_bytes(c, NULL, 0)); /* libuv: missing = empty */
	}
	return 0;
}

static int op_multi_set(struct store_conn *c, const struct store_req *q)
{
	const uint8_t *it = q->items;

	for (uint64_t i = 0; i < q->nitems; i++) {
		struct store_bytes k, v;

		store_items_next(&it, &k);
		store_items_next(&it, &v);
		TRY(set_key(c->srv, c, &k, &v, false));
	}
	return 0;
}

static int op_cancel_wait(struct store_conn *c)
{
	store_conn_drop_waits(c);
	c->parked = false;
	return reply_u8(c, STORE_WAIT_CANCELED);
}

static int op_queue_push(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;

	int r;

	TRY(store_share_ent_get(c->srv, c, &q->key, &e));
	r = store_share_admit(srv, c, e->share, e->rdzv,
			      (uint64_t[STORE_B__MAX]){0, 0, q->val.len, 0});
	if (r == 0)
		r = kv_queue_push(&srv->kv, e, q->val.p, q->val.len);
	if (r < 0) {
		kv_gc(&srv->kv, e);
		return r;
	}
	store_share_note(c, STORE_B_VALUE_BYTES, (int64_t)q->val.len);
	store_wake_one(srv, e);
	return 0;
}

static int op_queue_pop(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e = kv_find(&srv->kv, q->key.p, q->key.len);
	struct kv_item *item;
	int r;

	if (!e || !e->q_len)
		return reply_i64(c, 0);
	TRY(reply_i64(c, (int64_t)e->q_len));
	item = kv_queue_pop(&srv->kv, e);
	store_share_note(c, STORE_B_VALUE_BYTES, -(int64_t)item->len);
	r = reply_bytes(c, item->data, item->len);
	free(item);
	kv_gc(&srv->kv, e);
	return r;
}

static int op_queue_len(struct store_conn *c, const struct store_req *q)
{
	struct kv_ent *e = kv_find(&c->srv->kv, q->key.p, q->key.len);

	return reply_i64(c, e ? (int64_t)e->q_len : 0);
}

struct list_ctx {
	struct store_conn *c;
	int r;
	int64_t n;
};

/* A client authenticated for one job sees only that job's keys. */
static void count_one(struct kv_ent *e, void *arg)
{
	struct list_ctx *lc = arg;

	if (e->present && store_conn_key_visible(lc->c, e->key, e->key_len))
		lc->n++;
}

static void list_one(struct kv_ent *e, void *arg)
{
	struct list_ctx *lc = arg;

	if (e->present && lc->r == 0 && store_conn_key_visible(lc->c, e->key, e->key_len))
		lc->r = reply_bytes(lc->c, e->key, e->key_len);
}

static int op_list_keys(struct store_conn *c)
{
	struct list_ctx lc = {.c = c, .r = 0, .n = (int64_t)c->srv->kv.n_keys};

	if (store_conn_scoped(c)) {
		lc.n = 0;
		kv_foreach(&c->srv->kv, count_one, &lc);
	}
	TRY(reply_i64(c, lc.n));
	kv_foreach(&c->srv->kv, list_one, &lc);
	return lc.r;
}

/* Newest torch: the key is a counter like ADD's; the caller passes once the
 * count reaches world_size (waking everyone parked on it) and parks otherwise.
 * The counter is never reset. */
static int op_barrier(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;
	int64_t n;

	TRY(store_share_ent_get(c->srv, c, &q->key, &e));
	TRY(add_counter(c, e, 1, &n));
	if (n >= q->num) {
		TRY(reply_u8(c, STORE_WAIT_STOP_WAITING));
		store_wake_all(srv, e);
		return 0;
	}
	TRY(store_reg_budget(c, 1));
	TRY(store_reg_add(c, e, true));
	c->pending = 1;
	c->parked = c->dialect == STORE_V2;
	return 0;
}

size_t store_conn_reply_cost(struct store_conn *c, const struct store_req *q)
{
	struct kv_table *t = &c->srv->kv;
	const uint8_t *it = q->items;
	struct kv_ent *e;
	struct store_bytes k;
	size_t total = 0;

	switch (q->op) {
	case STORE_OP_GET:
		e = kv_find(t, q->key.p, q->key.len);
		return e && e->present ? 8 + e->val_len : 8;
	case STORE_OP_COMPARE_SET:
		e = kv_find(t, q->key.p, q->key.len);
		total = MAX(q->val.len, q->val2.len);
		return 8 + (e && e->present ? MAX(total, e->val_len) : total);
	case STORE_OP_QUEUE_POP:
		e = kv_find(t, q->key.p, q->key.len);
		return e && e->q_head ? 16 + e->q_head->len : 8;
	case STORE_OP_LIST_KEYS:
		return 8 + 8 * t->n_keys + t->key_bytes;
	case STORE_OP_MULTI_GET:
		for (uint64_t i = 0; i < q->nitems; i++) {
			store_items_next(&it, &k);
			e = kv_find(t, k.p, k.len);
			total += 8 + (e && e->present ? e->val_len : 0);
		}
		return total;
	default:
		return 8; /* one status byte, integer or nonce */
	}
}

static int dispatch_op(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;

	srv->st.requests++;
	if ((unsigned)q->op < STORE_OP__MAX)
		srv->op_counts[q->op]++;
	switch (q->op) {
	case STORE_OP_VALIDATE:
		return q->u32 == STORE_VALIDATE_MAGIC ? 0 : CRUN_EPROTO;
	case STORE_OP_SET:
		return set_key(c->srv, c, &q->key, &q->val, false);
	case STORE_OP_APPEND:
		return set_key(c->srv, c, &q->key, &q->val, true);
	case STORE_OP_GET:
		return op_get(c, q);
	case STORE_OP_ADD:
		return op_add(c, q);
	case STORE_OP_COMPARE_SET:
		return op_compare_set(c, q);
	case STORE_OP_CHECK:
		return op_wait(c, q, true);
	case STORE_OP_WAIT:
		return op_wait(c, q, false);
	case STORE_OP_GETNUMKEYS:
		return reply_i64(c, (int64_t)srv->kv.n_keys);
	case STORE_OP_WATCH_KEY:
		return op_watch(c, q);
	case STORE_OP_DELETE_KEY:
		return op_delete(c, q);
	case STORE_OP_MULTI_GET:
		return op_multi_get(c, q);
	case STORE_OP_MULTI_SET:
		return op_multi_set(c, q);
	case STORE_OP_CANCEL_WAIT:
		return op_cancel_wait(c);
	case STORE_OP_PING: {
		uint8_t b[4];

		store_put_u32(b, q->u32);
		return evbuffer_add(store_conn_out(c), b, 4) < 0 ? CRUN_ENOMEM : 0;
	}
	case STORE_OP_QUEUE_PUSH:
		return op_queue_push(c, q);
	case STORE_OP_QUEUE_POP:
		return op_queue_pop(c, q);
	case STORE_OP_QUEUE_LEN:
		return op_queue_len(c, q);
	case STORE_OP_LIST_KEYS:
		return op_list_keys(c);
	case STORE_OP_BARRIER:
		return op_barrier(c, q);
	default:
		return CRUN_EPROTO;
	}
}

/* Runs one decoded request. Pointers in q point into the input buffer, which
 * the caller drains afterwards: whatever is kept is copied. */
int store_conn_dispatch(struct store_conn *c, const struct store_req *q)
{
	bool parks =
	    q->op == STORE_OP_WAIT || q->op == STORE_OP_BARRIER || q->op == STORE_OP_WATCH_KEY;
	int r;

	TRY(store_conn_mux_begin(c, parks, store_proto_reply_kind(q->op) != STORE_REPLY_NONE));
	r = dispatch_op(c, q);
	store_conn_mux_end(c);
	return r;
}

/* ---- an operator's drop of one job's keys (server.h) ---- */

struct drop_ctx {
	struct store_server *srv;
	const char *job;
	size_t job_len;
	uint64_t n;
};

static void drop_one(struct kv_ent *e, void *arg)
{
	struct drop_ctx *dc = arg;
	struct kv_item *it;

	if (e->share->job_len != dc->job_len || memcmp(e->share->job, dc->job, dc->job_len))
		return;
	if (e->present || e->q_len)
		dc->n++;
	while ((it = kv_queue_pop(&dc->srv->kv, e)))
		free(it);
	if (e->present)
		del_value(dc->srv, e); /* frees e unless someone waits on it */
	else
		kv_gc(&dc->srv->kv, e);
}

int store_server_drop_job(struct store_server *srv, const char *job, uint64_t *ret_keys)
{
	struct drop_ctx dc = {.srv = srv, .job = job, .job_len = strlen(job)};

	kv_foreach(&srv->kv, drop_one, &dc);
	if (ret_keys)
		*ret_keys = dc.n;
	return dc.n ? 0 : CRUN_ENOTFOUND;
}
