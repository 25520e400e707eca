/* server_ops.c: the store server's operations, as torch's servers run them
 * (../shared/reference/torch-compat.md §1.4): replies, WAIT registrations and
 * wake-ups, v1 watch notifications, ADD's decimal text, the COMPARE_SET
 * table, queues and barriers. Called from server.c with one decoded request
 * at a time; everything runs on the server's loop thread.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

int store_conn_refuse(struct store_conn *c, enum store_metric why)
{
	c->why = (uint8_t)why;
	return CRUN_ETOOBIG;
}

/* Unlinks and frees a registration; the entry stays (see reg_free). */
static void reg_unlink(struct store_server *srv, struct kv_reg *reg, bool is_wait)
{
	dl_del(&reg->key_link);
	dl_del(&reg->conn_link);
	reg->ent->share->used[STORE_B_WAITERS]--;
	reg->conn->n_regs--;
	srv->n_regs--;
	if (is_wait)
		srv->st.waiters--;
	free(reg);
}

static void reg_free(struct store_server *srv, struct kv_reg *reg, bool is_wait)
{
	struct kv_ent *e = reg->ent;

	reg_unlink(srv, reg, is_wait);
	kv_gc(&srv->kv, e);
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
static int ent_get(struct store_server *srv, struct store_conn *c, const struct store_bytes *k,
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

static void conn_drop_waits(struct store_conn *c)
{
	while (!DL_EMPTY(&c->waits))
		reg_free(c->srv, DL_ENTRY(c->waits.next, struct kv_reg, conn_link), true);
	c->pending = 0;
	c->any = false;
	c->any_get = false;
	free(c->any_with);
	c->any_with = NULL;
	if (c->any_timer)
		evtimer_del(c->any_timer);
}

static void mux_free(struct store_conn *c);

void store_conn_unregister(struct store_conn *c)
{
	mux_free(c);
	conn_drop_waits(c);
	if (c->any_timer)
		event_free(c->any_timer);
	c->any_timer = NULL;
	while (!DL_EMPTY(&c->watches))
		reg_free(c->srv, DL_ENTRY(c->watches.next, struct kv_reg, conn_link), false);
}

static int reply_u8(struct store_conn *c, uint8_t v)
{
	return evbuffer_add(store_conn_out(c), &v, 1) < 0 ? CRUN_ENOMEM : 0;
}

static int reply_i64(struct store_conn *c, int64_t v)
{
	uint8_t b[8];

	store_put_u64(b, (uint64_t)v);
	return evbuffer_add(store_conn_out(c), b, sizeof(b)) < 0 ? CRUN_ENOMEM : 0;
}

/* A u64 length and the bytes; small values go out in one evbuffer_add. */
static int reply_bytes(struct store_conn *c, const uint8_t *p, size_t len)
{
	uint8_t b[8 + 248];

	if (len <= sizeof(b) - 8) {
		store_put_bytes(b, p, len);
		return evbuffer_add(store_conn_out(c), b, 8 + len) < 0 ? CRUN_ENOMEM : 0;
	}
	store_put_u64(b, len);
	if (evbuffer_add(store_conn_out(c), b, 8) < 0 ||
	    evbuffer_add(store_conn_out(c), p, len) < 0)
		return CRUN_ENOMEM;
	return 0;
}

/* ---- tagged waits (store_ext.h: MUX, WAIT_TAG) ------------------------------- */

static void twait_free(struct store_conn *c, struct store_twait *tw)
{
	while (!DL_EMPTY(&tw->regs))
		reg_free(c->srv, DL_ENTRY(tw->regs.next, struct kv_reg, conn_link), true);
	dl_del(&tw->link);
	c->n_twaits--;
	free(tw);
}

/* Sends tw's WAKE frame and frees it. A frame that cannot be queued dooms
 * c: the client would wait forever for it. */
static void twait_send(struct store_conn *c, struct store_twait *tw)
{
	uint8_t b[STORE_EXT_FRAME_WAKE_LEN];

	store_ext_frame_wake(b, tw->tag);
	if (evbuffer_add(store_conn_out(c), b, sizeof(b)) < 0)
		c->doomed = true;
	twait_free(c, tw);
}

/* One key of tw appeared. The last one completes it: its WAKE goes out now,
 * or after the op that c is running itself (its reply may not be out yet). */
static void twait_step(struct store_conn *c, struct store_twait *tw)
{
	if (tw->pending == 0 || --tw->pending)
		return;
	if (c->mux_hold) {
		dl_del(&tw->link);
		dl_add_tail(&c->fired, &tw->link);
		return;
	}
	twait_send(c, tw);
	store_conn_flush(c);
	store_conn_check_pushed(c);
}

static struct store_twait *twait_find(struct store_conn *c, uint64_t tag)
{
	for (struct dl *n = c->twaits.next; n != &c->twaits; n = n->next) {
		struct store_twait *tw = DL_ENTRY(n, struct store_twait, link);

		if (tw->tag == tag)
			return tw;
	}
	return NULL;
}

static void mux_free(struct store_conn *c)
{
	if (!c->mux)
		return;
	while (!DL_EMPTY(&c->twaits))
		twait_free(c, DL_ENTRY(c->twaits.next, struct store_twait, link));
	while (!DL_EMPTY(&c->fired))
		twait_free(c, DL_ENTRY(c->fired.next, struct store_twait, link));
}

int store_conn_mux_begin(struct store_conn *c, bool parks, bool has_reply)
{
	if (!c->mux)
		return 0;
	if (parks)
		return CRUN_EPROTO; /* a muxed connection never parks: WAIT_TAG */
	c->mux_hold = true;
	if (!has_reply)
		return 0;
	return reply_u8(c, STORE_EXT_FRAME_REPLY);
}

void store_conn_mux_end(struct store_conn *c)
{
	if (!c->mux)
		return;
	c->mux_hold = false;
	while (!DL_EMPTY(&c->fired))
		twait_send(c, DL_ENTRY(c->fired.next, struct store_twait, link));
}

/* A WAIT_ANY_GET_WITH's answer ends with its with_key's value, as TRY_GET
 * reads it now (found, bytes). Nothing for the other waits. */
static int reply_with(struct store_conn *c)
{
	const struct kv_ent *w;

	if (!c->any_with)
		return 0;
	w = kv_find(&c->srv->kv, c->any_with, c->any_with_len);
	TRY(reply_u8(c, w && w->present ? 1 : 0));
	return w && w->present ? reply_bytes(c, w->val, w->val_len) : reply_bytes(c, NULL, 0);
}

/* The wake of a WAIT_ANY: the index, and for WAIT_ANY_GET(_WITH) the value
 * of e (the key at idx), as a GET would read it now (and the with_key's). */
static int reply_any(struct store_conn *c, const struct kv_ent *e, uint64_t idx)
{
	TRY(reply_u8(c, STORE_WAIT_STOP_WAITING));
	TRY(reply_i64(c, (int64_t)idx));
	if (!c->any_get)
		return 0;
	TRY(e->present ? reply_bytes(c, e->val, e->val_len) : reply_bytes(c, NULL, 0));
	return reply_with(c);
}

/* A WAIT_ANY_GET's timeout passed with no key there: index n, no value. */
static void any_timed_out(evutil_socket_t fd, short what, void *arg)
{
	struct store_conn *c = arg;

	(void)fd;
	(void)what;
	if (!c->any || !c->pending)
		return; /* woken or canceled meanwhile */
	if (reply_u8(c, STORE_WAIT_STOP_WAITING) < 0 || reply_i64(c, (int64_t)c->any_n) < 0 ||
	    reply_bytes(c, NULL, 0) < 0 || reply_with(c) < 0)
		c->doomed = true;
	conn_drop_waits(c);
	store_conn_flush(c);
	store_conn_unpark(c);
	store_conn_check_pushed(c);
}

/* One registration of c on e fired. Like torch, a count already at 0 (a
 * stale registration of an overwritten v1 WAIT) sends nothing. Returns true
 * when this completed c's wait. */
static bool wait_step(struct store_conn *c, const struct kv_ent *e, uint64_t idx)
{
	if (c->pending == 0 || --c->pending)
		return false;
	if (c->any ? reply_any(c, e, idx) < 0 : reply_u8(c, STORE_WAIT_STOP_WAITING) < 0)
		c->doomed = true;
	if (c->any) /* the other keys' registrations are moot now */
		conn_drop_waits(c);
	store_conn_flush(c);
	store_conn_unpark(c);
	store_conn_check_pushed(c);
	return true;
}

/* Wakes every waiter of e (a key was created or written). */
static void wake_all(struct store_server *srv, struct kv_ent *e)
{
	while (!DL_EMPTY(&e->waiters)) {
		struct kv_reg *reg = DL_ENTRY(e->waiters.next, struct kv_reg, key_link);
		struct store_conn *w = reg->conn;
		struct store_twait *tw = reg->tw;
		uint64_t idx = reg->idx;

		reg_unlink(srv, reg, true);
		if (tw)
			twait_step(w, tw);
		else
			wait_step(w, e, idx);
	}
}

/* QUEUE_PUSH wakes one waiter, as torch's libuv server does: walking the
 * key's waiters oldest first, each count is decremented and the first to
 * reach 0 is woken and unregistered. The others stay registered with their
 * lowered count (so a later push or SET may complete them); a stale
 * registration (count already 0) is skipped. */
static void wake_one(struct store_server *srv, struct kv_ent *e)
{
	struct dl *n, *next;

	for (n = e->waiters.next; n != &e->waiters; n = next) {
		struct kv_reg *reg = DL_ENTRY(n, struct kv_reg, key_link);
		struct store_conn *w = reg->conn;
		struct store_twait *tw = reg->tw;
		uint64_t *pending = tw ? &tw->pending : &w->pending;

		next = n->next;
		if (*pending == 0 || *pending > 1) {
			if (*pending)
				(*pending)--;
			continue;
		}
		uint64_t idx = reg->idx;

		reg_unlink(srv, reg, true);
		if (tw)
			twait_step(w, tw);
		else
			wait_step(w, e, idx);
		return;
	}
}

/* Whether c may add n registrations: its own ceiling (max_items, which
 * leases share) and the server's (max_waiters). */
static int reg_budget(struct store_conn *c, uint64_t n)
{
	struct store_server *srv = c->srv;

	if (c->n_regs + n > srv->cfg.limits.max_items || srv->n_regs + n > srv->cfg.max_waiters)
		return store_conn_refuse(c, STORE_M_DROP_WAITERS);
	return 0;
}

static int reg_add(struct store_conn *c, struct kv_ent *e, bool is_wait)
{
	struct kv_reg *reg;

	TRY(store_share_admit(c->srv, c, e->share, e->rdzv, (uint64_t[STORE_B__MAX]){0, 0, 0, 1}));
	reg = malloc(sizeof(*reg));
	if (!reg)
		return CRUN_ENOMEM;
	e->share->used[STORE_B_WAITERS]++;
	reg->conn = c;
	reg->ent = e;
	reg->idx = 0;
	reg->tw = NULL;
	dl_add_tail(is_wait ? &e->waiters : &e->watchers, &reg->key_link);
	dl_add_tail(is_wait ? &c->waits : &c->watches, &reg->conn_link);
	c->n_regs++;
	c->srv->n_regs++;
	if (is_wait)
		c->srv->st.waiters++;
	return 0;
}

static bool key_exists(const struct kv_ent *e)
{
	/* Newest torch counts a non-empty queue as present for CHECK/WAIT, so a
	 * blocking QUEUE_POP (WAIT, then POP) wakes on a push. */
	return e && (e->present || e->q_len);
}

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

	TRY(ent_get(srv, c, k, &e));
	TRY(put_value(srv, c, e, v->p, v->len, append));
	wake_all(srv, e);
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

	TRY(ent_get(c->srv, c, &q->key, &e));
	TRY(add_counter(c, e, q->num, &v));
	TRY(reply_i64(c, v));
	wake_all(srv, e);
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
		TRY(ent_get(c->srv, c, &q->key, &e));
		TRY(put_value(c->srv, c, e, q->val2.p, q->val2.len, false));
	} else if (e->val_len == q->val.len && !memcmp(e->val, q->val.p, q->val.len)) {
		TRY(put_value(c->srv, c, e, q->val2.p, q->val2.len, false));
	}
	TRY(reply_bytes(c, e->val, e->val_len));
	wake_all(srv, e);
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
	TRY(reg_budget(c, missing));
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		int r;

		TRY(ent_get(c->srv, c, &k, &e));
		if (key_exists(e))
			continue;
		r = reg_add(c, e, true);
		if (r < 0) {
			kv_gc(&srv->kv, e);
			return r;
		}
	}
	c->pending = missing; /* torch: a second WAIT overwrites the count */
	c->parked = c->dialect == STORE_V2;
	return 0;
}

int store_conn_wait_any(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	struct store_bytes k;
	int r;

	if (c->pending || c->dialect != STORE_V2)
		return CRUN_EPROTO; /* one wait at a time; v1 cannot cancel it */
	c->any_get = q->op != STORE_EXT_WAIT_ANY;
	if (q->op == STORE_EXT_WAIT_ANY_GET_WITH) {
		/* kept until the answer (+1: a with_key may be empty) */
		c->any_with = malloc(q->key2.len + 1);
		if (!c->any_with)
			return CRUN_ENOMEM;
		memcpy(c->any_with, q->key2.p, q->key2.len);
		c->any_with_len = q->key2.len;
	}
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;

		store_items_next(&it, &k);
		e = kv_find(&srv->kv, k.p, k.len);
		if (key_exists(e)) {
			r = reply_any(c, e, i);
			conn_drop_waits(c); /* nothing registered yet: clears the fields */
			return r;
		}
	}
	r = reg_budget(c, q->nitems);
	if (r < 0) {
		conn_drop_waits(c);
		return r;
	}
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e = NULL;

		store_items_next(&it, &k);
		r = ent_get(srv, c, &k, &e);
		if (r == 0 && (r = reg_add(c, e, true)) < 0)
			kv_gc(&srv->kv, e);
		if (r < 0) {
			conn_drop_waits(c);
			return r;
		}
		DL_ENTRY(c->waits.prev, struct kv_reg, conn_link)->idx = i;
	}
	if (q->wait_ms) {
		const struct timeval tv = {(time_t)(q->wait_ms / 1000),
					   (suseconds_t)(q->wait_ms % 1000 * 1000)};

		if (!c->any_timer)
			c->any_timer = evtimer_new(srv->base, any_timed_out, c);
		if (!c->any_timer || evtimer_add(c->any_timer, &tv) < 0) {
			conn_drop_waits(c);
			return CRUN_ENOMEM;
		}
	}
	c->any_n = q->nitems;
	c->pending = 1;
	c->any = true;
	c->parked = true;
	return 0;
}

/* WAIT_TAG: a WAIT on a muxed connection that does not park it. */
static int op_wait_tag(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_server *srv = c->srv;
	const uint8_t *it = q->items;
	struct store_twait *tw;
	uint64_t missing = 0;
	struct store_bytes k;
	uint8_t b[STORE_EXT_FRAME_WAKE_LEN];

	if (twait_find(c, q->id))
		return CRUN_EPROTO; /* a tag is pending once */
	for (uint64_t i = 0; i < q->nitems; i++) {
		store_items_next(&it, &k);
		if (!key_exists(kv_find(&srv->kv, k.p, k.len)))
			missing++;
	}
	if (!missing) {
		store_ext_frame_wake(b, q->id);
		return evbuffer_add(store_conn_out(c), b, sizeof(b)) < 0 ? CRUN_ENOMEM : 0;
	}
	if (c->n_twaits >= STORE_EXT_MUX_MAX_WAITS)
		return store_conn_refuse(c, STORE_M_DROP_WAITERS);
	TRY(reg_budget(c, missing));
	tw = calloc(1, sizeof(*tw));
	if (!tw)
		return CRUN_ENOMEM;
	tw->tag = q->id;
	tw->pending = missing;
	DL_INIT(&tw->regs);
	dl_add_tail(&c->twaits, &tw->link);
	c->n_twaits++;
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e;
		struct kv_reg *reg;
		int r;

		store_items_next(&it, &k);
		r = ent_get(srv, c, &k, &e);
		if (r == 0 && key_exists(e))
			continue;
		if (r == 0 && (r = reg_add(c, e, true)) < 0)
			kv_gc(&srv->kv, e);
		if (r < 0) {
			twait_free(c, tw);
			return r;
		}
		reg = DL_ENTRY(c->waits.prev, struct kv_reg, conn_link);
		dl_del(&reg->conn_link);
		dl_add_tail(&tw->regs, &reg->conn_link);
		reg->tw = tw;
	}
	return 0;
}

int store_conn_mux_op(struct store_conn *c, const struct store_ext_req *q)
{
	struct store_twait *tw;

	switch (q->op) {
	case STORE_EXT_MUX:
		if (c->mux || c->dialect != STORE_V2 || c->pending || c->parked)
			return CRUN_EPROTO;
		c->mux = true;
		DL_INIT(&c->twaits);
		DL_INIT(&c->fired);
		return 0;
	case STORE_EXT_WAIT_TAG:
		return c->mux ? op_wait_tag(c, q) : CRUN_EPROTO;
	case STORE_EXT_WAIT_TAG_CANCEL:
		if (!c->mux)
			return CRUN_EPROTO;
		tw = twait_find(c, q->id);
		if (tw) /* else it fired: its WAKE may be on its way (store_ext.h) */
			twait_free(c, tw);
		return 0;
	default:
		return CRUN_EPROTO;
	}
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
	r = ent_get(srv, c, &q->key, &e);
	if (r == 0)
		r = add_counter(c, e, 1, &t);
	if (r == 0) {
		wake_all(srv, e);
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

	TRY(reg_budget(c, 1));
	TRY(ent_get(c->srv, c, &q->key, &e));
	r = reg_add(c, e, false);
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
	conn_drop_waits(c);
	c->parked = false;
	return reply_u8(c, STORE_WAIT_CANCELED);
}

static int op_queue_push(struct store_conn *c, const struct store_req *q)
{
	struct store_server *srv = c->srv;
	struct kv_ent *e;

	int r;

	TRY(ent_get(c->srv, c, &q->key, &e));
	r = store_share_admit(srv, c, e->share, e->rdzv,
			      (uint64_t[STORE_B__MAX]){0, 0, q->val.len, 0});
	if (r == 0)
		r = kv_queue_push(&srv->kv, e, q->val.p, q->val.len);
	if (r < 0) {
		kv_gc(&srv->kv, e);
		return r;
	}
	store_share_note(c, STORE_B_VALUE_BYTES, (int64_t)q->val.len);
	wake_one(srv, e);
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

	TRY(ent_get(c->srv, c, &q->key, &e));
	TRY(add_counter(c, e, 1, &n));
	if (n >= q->num) {
		TRY(reply_u8(c, STORE_WAIT_STOP_WAITING));
		wake_all(srv, e);
		return 0;
	}
	TRY(reg_budget(c, 1));
	TRY(reg_add(c, e, true));
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
