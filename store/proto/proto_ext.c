/* proto_ext.c: the codec of crun's store extension (store_ext.h), pure like
 * proto.c: no I/O, no allocation. */
#include <string.h>

#include "common/common.h"
#include "store/store_ext.h"

struct ext_op_info {
	const char *name; /* NULL: no such op */
	uint8_t version;
	uint8_t reply_bytes;
	uint8_t keys; /* enum store_ext_keys */
};

/* STORE_EXT_OPS as an array indexed by code - 0x80. */
static const struct ext_op_info ext_ops[0x80] = {
#define X_(name, code, version, reply, keys) [(code)-0x80] = {#name, version, reply, keys},
    STORE_EXT_OPS(X_)
#undef X_
};

static const struct ext_op_info *ext_op(uint8_t code)
{
	return code >= 0x80 && ext_ops[code - 0x80].name ? &ext_ops[code - 0x80] : NULL;
}

bool store_ext_is_op(uint8_t code)
{
	return ext_op(code) != NULL;
}

uint32_t store_ext_op_version(uint8_t op)
{
	return ext_op(op) ? ext_op(op)->version : 1;
}

const char *store_ext_op_name(uint8_t code)
{
	return ext_op(code) ? ext_op(code)->name : "?";
}

size_t store_ext_reply_size(uint8_t op)
{
	return ext_op(op) ? ext_op(op)->reply_bytes : 0;
}

int store_ext_req_each_key(const struct store_ext_req *q,
			   int (*fn)(void *arg, const uint8_t *key, size_t len), void *arg)
{
	const struct ext_op_info *o = ext_op(q->op);
	const uint8_t *it = q->items;
	struct store_bytes k;
	int r;

	if (!o)
		return 0;
	if ((o->keys & STORE_EXT_K_KEY) || ((o->keys & STORE_EXT_K_EXPIRY) && q->key.len)) {
		r = fn(arg, q->key.p, q->key.len);
		if (r)
			return r;
	}
	if (o->keys & STORE_EXT_K_KEY2) {
		r = fn(arg, q->key2.p, q->key2.len);
		if (r)
			return r;
	}
	for (uint64_t i = 0; (o->keys & STORE_EXT_K_LIST) && i < q->nitems; i++) {
		store_items_next(&it, &k);
		r = fn(arg, k.p, k.len);
		if (r)
			return r;
	}
	return 0;
}

int store_ext_frame_decode(const uint8_t *buf, size_t len, uint8_t *ret_kind, uint64_t *ret_tag,
			   size_t *used)
{
	if (len == 0)
		return CRUN_EAGAIN;
	if (buf[0] == STORE_EXT_FRAME_REPLY) {
		*ret_kind = buf[0];
		*used = 1;
		return 0;
	}
	if (buf[0] != STORE_EXT_FRAME_WAKE)
		return CRUN_EPROTO;
	if (len < STORE_EXT_FRAME_WAKE_LEN)
		return CRUN_EAGAIN;
	*ret_kind = buf[0];
	*ret_tag = store_get_u64(buf + 1);
	*used = STORE_EXT_FRAME_WAKE_LEN;
	return 0;
}

void store_ext_frame_wake(uint8_t *buf, uint64_t tag)
{
	buf[0] = STORE_EXT_FRAME_WAKE;
	store_put_u64(buf + 1, tag);
}

/* A cursor over the input; every read checks the bytes are there. */
struct cur {
	const uint8_t *p;
	size_t left;
};

static int take_u64(struct cur *c, uint64_t *ret)
{
	if (c->left < 8)
		return CRUN_EAGAIN;
	*ret = store_get_u64(c->p);
	c->p += 8;
	c->left -= 8;
	return 0;
}

static int take_u32(struct cur *c, uint32_t *ret)
{
	if (c->left < 4)
		return CRUN_EAGAIN;
	*ret = store_get_u32(c->p);
	c->p += 4;
	c->left -= 4;
	return 0;
}

static int take_bytes(struct cur *c, size_t max, struct store_bytes *ret)
{
	uint64_t n;

	TRY(take_u64(c, &n));
	if (n > max)
		return CRUN_ETOOBIG;
	if (c->left < n)
		return CRUN_EAGAIN;
	ret->p = c->p;
	ret->len = (size_t)n;
	c->p += n;
	c->left -= (size_t)n;
	return 0;
}

/* WAIT_ANY's key list: validated whole, so store_items_next() can walk it. */
static int take_list(struct cur *c, const struct store_limits *lim, struct store_ext_req *q)
{
	struct store_bytes k;

	TRY(take_u64(c, &q->nitems));
	if (q->nitems == 0 || q->nitems > lim->max_items)
		return q->nitems ? CRUN_ETOOBIG : CRUN_EPROTO;
	q->items = c->p;
	for (uint64_t i = 0; i < q->nitems; i++)
		TRY(take_bytes(c, lim->max_key_bytes, &k));
	return 0;
}

int store_ext_decode_req(const struct store_limits *lim, const uint8_t *buf, size_t len,
			 struct store_ext_req *out, size_t *used)
{
	struct store_ext_req q = {0};
	struct cur c = {buf + 1, len ? len - 1 : 0};

	if (len == 0)
		return CRUN_EAGAIN;
	if (!store_ext_is_op(buf[0]))
		return CRUN_EPROTO;
	q.op = buf[0];
	switch (q.op) {
	case STORE_EXT_HELLO:
		TRY(take_u32(&c, &q.magic));
		TRY(take_u32(&c, &q.version));
		break;
	case STORE_EXT_LEASE_GRANT:
		TRY(take_u64(&c, &q.ttl_ms));
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key));
		TRY(take_bytes(&c, lim->max_value_bytes, &q.val));
		break;
	case STORE_EXT_LEASE_KEEPALIVE:
	case STORE_EXT_LEASE_REVOKE:
	case STORE_EXT_LEASE_ATTACH:
		TRY(take_u64(&c, &q.id));
		break;
	case STORE_EXT_SET_LEASED:
		TRY(take_u64(&c, &q.id));
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key));
		TRY(take_bytes(&c, lim->max_value_bytes, &q.val));
		break;
	case STORE_EXT_WAIT_ANY_GET:
	case STORE_EXT_WAIT_ANY_GET_WITH:
		TRY(take_u64(&c, &q.id));
		TRY(take_u64(&c, &q.wait_ms));
		if (q.wait_ms > STORE_EXT_TTL_MAX)
			return CRUN_EPROTO;
		TRY(take_list(&c, lim, &q));
		if (q.op == STORE_EXT_WAIT_ANY_GET_WITH)
			TRY(take_bytes(&c, lim->max_key_bytes, &q.key2));
		break;
	case STORE_EXT_WAIT_ANY:
		TRY(take_list(&c, lim, &q));
		break;
	case STORE_EXT_MUX:
		break;
	case STORE_EXT_WAIT_TAG:
		TRY(take_u64(&c, &q.id));
		TRY(take_list(&c, lim, &q));
		break;
	case STORE_EXT_WAIT_TAG_CANCEL:
		TRY(take_u64(&c, &q.id));
		break;
	case STORE_EXT_TRY_GET:
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key));
		break;
	case STORE_EXT_TICKET:
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key));
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key2));
		TRY(take_bytes(&c, lim->max_value_bytes, &q.val));
		break;
	case STORE_EXT_GRANT_SET:
		TRY(take_u64(&c, &q.ttl_ms));
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key));
		TRY(take_bytes(&c, lim->max_value_bytes, &q.val));
		TRY(take_bytes(&c, lim->max_key_bytes, &q.key2));
		TRY(take_bytes(&c, lim->max_value_bytes, &q.val2));
		break;
	default:
		return CRUN_EPROTO;
	}
	*out = q;
	*used = len - c.left;
	return 0;
}

size_t store_ext_req_size(const struct store_ext_req *q)
{
	switch (q->op) {
	case STORE_EXT_HELLO:
		return 1 + 4 + 4;
	case STORE_EXT_LEASE_GRANT:
	case STORE_EXT_SET_LEASED:
		return 1 + 8 + 8 + q->key.len + 8 + q->val.len;
	case STORE_EXT_LEASE_KEEPALIVE:
	case STORE_EXT_LEASE_REVOKE:
	case STORE_EXT_LEASE_ATTACH:
	case STORE_EXT_WAIT_TAG_CANCEL:
		return 1 + 8;
	case STORE_EXT_MUX:
		return 1;
	case STORE_EXT_TRY_GET:
		return 1 + 8 + q->key.len;
	case STORE_EXT_TICKET:
		return 1 + 8 + q->key.len + 8 + q->key2.len + 8 + q->val.len;
	case STORE_EXT_GRANT_SET:
		return 1 + 8 + 8 + q->key.len + 8 + q->val.len + 8 + q->key2.len + 8 + q->val2.len;
	case STORE_EXT_WAIT_ANY:
	case STORE_EXT_WAIT_ANY_GET:
	case STORE_EXT_WAIT_ANY_GET_WITH:
	case STORE_EXT_WAIT_TAG: {
		size_t n =
		    1 + 8 +
		    (q->op == STORE_EXT_WAIT_ANY_GET || q->op == STORE_EXT_WAIT_ANY_GET_WITH ? 16
											     : 0) +
		    (q->op == STORE_EXT_WAIT_TAG ? 8 : 0);

		if (q->op == STORE_EXT_WAIT_ANY_GET_WITH)
			n += 8 + q->key2.len;
		for (uint64_t i = 0; i < q->nitems; i++)
			n += 8 + q->keys[i].len;
		return q->nitems ? n : 0;
	}
	default:
		return 0;
	}
}

static uint8_t *put_list(uint8_t *p, const struct store_ext_req *q)
{
	p = store_put_u64(p, q->nitems);
	for (uint64_t i = 0; i < q->nitems; i++)
		p = store_put_bytes(p, q->keys[i].p, q->keys[i].len);
	return p;
}

int store_ext_encode_req(const struct store_ext_req *q, uint8_t *buf, size_t cap, size_t *ret_len)
{
	size_t need = store_ext_req_size(q);
	uint8_t *p = buf;

	if (need == 0)
		return CRUN_EINVAL;
	if (cap < need)
		return CRUN_ENOSPC;
	*p++ = q->op;
	switch (q->op) {
	case STORE_EXT_HELLO:
		p = store_put_u32(p, q->magic);
		p = store_put_u32(p, q->version);
		break;
	case STORE_EXT_LEASE_GRANT:
		p = store_put_u64(p, q->ttl_ms);
		p = store_put_bytes(p, q->key.p, q->key.len);
		p = store_put_bytes(p, q->val.p, q->val.len);
		break;
	case STORE_EXT_SET_LEASED:
		p = store_put_u64(p, q->id);
		p = store_put_bytes(p, q->key.p, q->key.len);
		p = store_put_bytes(p, q->val.p, q->val.len);
		break;
	case STORE_EXT_GRANT_SET:
		p = store_put_u64(p, q->ttl_ms);
		p = store_put_bytes(p, q->key.p, q->key.len);
		p = store_put_bytes(p, q->val.p, q->val.len);
		p = store_put_bytes(p, q->key2.p, q->key2.len);
		p = store_put_bytes(p, q->val2.p, q->val2.len);
		break;
	case STORE_EXT_TRY_GET:
		p = store_put_bytes(p, q->key.p, q->key.len);
		break;
	case STORE_EXT_TICKET:
		p = store_put_bytes(p, q->key.p, q->key.len);
		p = store_put_bytes(p, q->key2.p, q->key2.len);
		p = store_put_bytes(p, q->val.p, q->val.len);
		break;
	case STORE_EXT_MUX:
		break;
	case STORE_EXT_WAIT_ANY_GET:
	case STORE_EXT_WAIT_ANY_GET_WITH:
		p = store_put_u64(p, q->id);
		p = store_put_u64(p, q->wait_ms);
		p = put_list(p, q);
		if (q->op == STORE_EXT_WAIT_ANY_GET_WITH)
			p = store_put_bytes(p, q->key2.p, q->key2.len);
		break;
	case STORE_EXT_WAIT_TAG:
		p = store_put_u64(p, q->id);
		/* fall through - then the key list */
	case STORE_EXT_WAIT_ANY:
		p = put_list(p, q);
		break;
	default:
		p = store_put_u64(p, q->id);
		break;
	}
	*ret_len = (size_t)(p - buf);
	return 0;
}

/* ---- ERROR (version 6) ---------------------------------------------------------- */

int store_ext_error_encode(const char *text, size_t len, uint8_t *buf, size_t cap, size_t *ret_len)
{
	len = MIN(len, (size_t)STORE_EXT_ERROR_TEXT_MAX);
	if (cap < STORE_EXT_ERROR_HEAD + len)
		return CRUN_ENOSPC;
	memcpy(buf, STORE_EXT_ERROR_MAGIC, 8);
	store_put_u32(buf + 8, (uint32_t)len);
	if (len)
		memcpy(buf + STORE_EXT_ERROR_HEAD, text, len);
	*ret_len = STORE_EXT_ERROR_HEAD + len;
	return 0;
}

int store_ext_error_decode(const uint8_t *buf, size_t len, const char **ret_text,
			   size_t *ret_text_len, size_t *used)
{
	uint32_t n;

	/* A prefix of the magic may be the start of a reply too: only the
	 * whole magic tells (store_ext.h). */
	if (memcmp(buf, STORE_EXT_ERROR_MAGIC, MIN(len, (size_t)8)) != 0)
		return CRUN_EPROTO;
	if (len < STORE_EXT_ERROR_HEAD)
		return CRUN_EAGAIN;
	n = store_get_u32(buf + 8);
	if (n > STORE_EXT_ERROR_TEXT_MAX)
		return CRUN_EPROTO;
	if (len < STORE_EXT_ERROR_HEAD + n)
		return CRUN_EAGAIN;
	*ret_text = (const char *)buf + STORE_EXT_ERROR_HEAD;
	*ret_text_len = n;
	*used = STORE_EXT_ERROR_HEAD + n;
	return 0;
}
