/* waits.c: the store server's registrations and wake-ups: a WAIT or
 * BARRIER of a missing key (and a v1 WATCH_KEY) registers the connection on
 * the key (struct kv_reg); a write wakes the key's waiters (store_wake_all,
 * QUEUE_PUSH's store_wake_one). Also crun's waits on top of them: WAIT_ANY
 * (one of several keys, its timeout and its values) and the tagged waits of
 * a muxed connection (MUX, WAIT_TAG, WAIT_TAG_CANCEL; store_ext.h). Split out
 * of server_ops.c, which runs the operations that write keys and calls in
 * here to wake; this file calls nothing of it.
 */
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"
#include "store/store_ext.h"

/* ---- registrations ------------------------------------------------------- */

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

void store_conn_drop_waits(struct store_conn *c)
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
	store_conn_drop_waits(c);
	if (c->any_timer)
		event_free(c->any_timer);
	c->any_timer = NULL;
	while (!DL_EMPTY(&c->watches))
		reg_free(c->srv, DL_ENTRY(c->watches.next, struct kv_reg, conn_link), false);
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

/* ---- wake-ups ---------------------------------------------------------------- */

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
	store_conn_drop_waits(c);
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
		store_conn_drop_waits(c);
	store_conn_flush(c);
	store_conn_unpark(c);
	store_conn_check_pushed(c);
	return true;
}

/* One waiter registration of e fired: unregistered, its wait stepped. */
static void reg_fire(struct store_server *srv, struct kv_reg *reg, const struct kv_ent *e)
{
	struct store_conn *w = reg->conn;
	struct store_twait *tw = reg->tw;
	uint64_t idx = reg->idx;

	reg_unlink(srv, reg, true);
	if (tw)
		twait_step(w, tw);
	else
		wait_step(w, e, idx);
}

/* Wakes every waiter of e (a key was created or written). */
void store_wake_all(struct store_server *srv, struct kv_ent *e)
{
	while (!DL_EMPTY(&e->waiters))
		reg_fire(srv, DL_ENTRY(e->waiters.next, struct kv_reg, key_link), e);
}

/* QUEUE_PUSH wakes one waiter, as torch's libuv server does: walking the
 * key's waiters oldest first, each count is decremented and the first to
 * reach 0 is woken and unregistered. The others stay registered with their
 * lowered count (so a later push or SET may complete them); a stale
 * registration (count already 0) is skipped. */
void store_wake_one(struct store_server *srv, struct kv_ent *e)
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
		reg_fire(srv, reg, e);
		return;
	}
}

/* Whether c may add n registrations: its own ceiling (max_items, which
 * leases share) and the server's (max_waiters). */
int store_reg_budget(struct store_conn *c, uint64_t n)
{
	struct store_server *srv = c->srv;

	if (c->n_regs + n > srv->cfg.limits.max_items || srv->n_regs + n > srv->cfg.max_waiters)
		return store_conn_refuse(c, STORE_M_DROP_WAITERS);
	return 0;
}

int store_reg_add(struct store_conn *c, struct kv_ent *e, bool is_wait)
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

/* ---- WAIT_ANY, WAIT_TAG, MUX (store_ext.h) --------------------------------- */

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
			store_conn_drop_waits(c); /* nothing registered yet: clears the fields */
			return r;
		}
	}
	r = store_reg_budget(c, q->nitems);
	if (r < 0) {
		store_conn_drop_waits(c);
		return r;
	}
	it = q->items;
	for (uint64_t i = 0; i < q->nitems; i++) {
		struct kv_ent *e = NULL;

		store_items_next(&it, &k);
		r = store_share_ent_get(srv, c, &k, &e);
		if (r == 0 && (r = store_reg_add(c, e, true)) < 0)
			kv_gc(&srv->kv, e);
		if (r < 0) {
			store_conn_drop_waits(c);
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
			store_conn_drop_waits(c);
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
	TRY(store_reg_budget(c, missing));
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
		r = store_share_ent_get(srv, c, &k, &e);
		if (r == 0 && key_exists(e))
			continue;
		if (r == 0 && (r = store_reg_add(c, e, true)) < 0)
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
