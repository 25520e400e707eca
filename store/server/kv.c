/* kv.c: the store server's key space, a chained hash table of byte-string
 * keys with values, FIFO queues and per-key registration lists. Chaining keeps
 * entry addresses stable, which the registrations (struct kv_reg) rely on.
 * Private to store/ (see server_int.h).
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/server/server_int.h"

#define KV_MIN_BUCKETS 64

/* 64-bit multiply-xorshift over 8-byte words with a murmur3 finaliser: keys
 * are short ("/rank/17") and differ mostly in their last bytes. */
static uint64_t kv_hash(const uint8_t *p, size_t n)
{
	uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
	uint64_t w;

	while (n >= 8) {
		memcpy(&w, p, 8);
		h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
		h ^= h >> 31;
		p += 8;
		n -= 8;
	}
	w = 0;
	memcpy(&w, p, n);
	h ^= w;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

int kv_init(struct kv_table *t, size_t max_ents, size_t max_key_bytes)
{
	memset(t, 0, sizeof(*t));
	t->max_ents = max_ents;
	t->max_key_bytes = max_key_bytes;
	t->buckets = calloc(KV_MIN_BUCKETS, sizeof(*t->buckets));
	if (!t->buckets)
		return CRUN_ENOMEM;
	t->mask = KV_MIN_BUCKETS - 1;
	return 0;
}

static void kv_free_queue(struct kv_table *t, struct kv_ent *e)
{
	struct kv_item *it = e->q_head;

	while (it) {
		struct kv_item *next = it->next;

		t->value_bytes -= it->len;
		e->share->used[STORE_B_VALUE_BYTES] -= it->len;
		free(it);
		it = next;
	}
	e->q_head = e->q_tail = NULL;
	e->q_len = 0;
}

void kv_release(struct kv_table *t)
{
	if (!t->buckets)
		return;
	for (size_t i = 0; i <= t->mask; i++) {
		struct kv_ent *e = t->buckets[i];

		while (e) {
			struct kv_ent *next = e->next;

			kv_free_queue(t, e);
			free(e->val);
			free(e);
			e = next;
		}
	}
	free(t->buckets);
	memset(t, 0, sizeof(*t));
}

struct kv_ent *kv_find(const struct kv_table *t, const uint8_t *key, size_t len)
{
	uint64_t h = kv_hash(key, len);
	struct kv_ent *e = t->buckets[h & t->mask];

	for (; e; e = e->next)
		if (e->hash == h && e->key_len == len && !memcmp(e->key, key, len))
			return e;
	return NULL;
}

/* Doubles the bucket array; on allocation failure the table just stays
 * denser, which is slower but still correct. */
static void kv_grow(struct kv_table *t)
{
	size_t n = (t->mask + 1) * 2;
	struct kv_ent **b = calloc(n, sizeof(*b));

	if (!b)
		return;
	for (size_t i = 0; i <= t->mask; i++) {
		struct kv_ent *e = t->buckets[i];

		while (e) {
			struct kv_ent *next = e->next;

			e->next = b[e->hash & (n - 1)];
			b[e->hash & (n - 1)] = e;
			e = next;
		}
	}
	free(t->buckets);
	t->buckets = b;
	t->mask = n - 1;
}

int kv_get_or_add(struct kv_table *t, const uint8_t *key, size_t len, struct store_share *share,
		  struct kv_ent **ret_ent)
{
	uint64_t h = kv_hash(key, len);
	struct kv_ent *e = t->buckets[h & t->mask];

	for (; e; e = e->next) {
		if (e->hash == h && e->key_len == len && !memcmp(e->key, key, len)) {
			*ret_ent = e;
			return 0;
		}
	}
	/* Every entry counts, not only keys with a value: a WAIT on a missing
	 * key or an empty SET costs the same memory. */
	if (len > UINT32_MAX || t->n_ents >= t->max_ents || len > t->max_key_bytes - t->key_bytes)
		return CRUN_ETOOBIG;
	e = calloc(1, sizeof(*e) + len);
	if (!e)
		return CRUN_ENOMEM;
	e->hash = h;
	e->share = share;
	share->used[STORE_B_KEYS]++;
	share->used[STORE_B_KEY_BYTES] += len;
	e->key_len = (uint32_t)len;
	if (len)
		memcpy(e->key, key, len);
	DL_INIT(&e->waiters);
	DL_INIT(&e->watchers);
	e->next = t->buckets[h & t->mask];
	t->buckets[h & t->mask] = e;
	t->n_ents++;
	t->key_bytes += len;
	if (t->n_ents > t->mask + 1)
		kv_grow(t);
	*ret_ent = e;
	return 0;
}

void kv_gc(struct kv_table *t, struct kv_ent *e)
{
	struct kv_ent **pp;

	if (e->present || e->q_len || !DL_EMPTY(&e->waiters) || !DL_EMPTY(&e->watchers))
		return;
	for (pp = &t->buckets[e->hash & t->mask]; *pp; pp = &(*pp)->next) {
		if (*pp == e) {
			*pp = e->next;
			break;
		}
	}
	t->n_ents--;
	t->key_bytes -= e->key_len;
	e->share->used[STORE_B_KEYS]--;
	e->share->used[STORE_B_KEY_BYTES] -= e->key_len;
	free(e->val);
	free(e);
}

int kv_put(struct kv_table *t, struct kv_ent *e, const uint8_t *v, size_t len, bool append)
{
	size_t old = e->val_len;
	size_t need = append ? old + len : len;

	if (need > e->val_cap || (!append && e->val_cap > 4096 && need < e->val_cap / 4)) {
		/* Grow geometrically for APPEND; shrink a big buffer a SET no
		 * longer fills so a key's footprint follows its value. */
		size_t cap = append && need < SIZE_MAX / 2 ? need + need / 2 : need;
		uint8_t *p = append ? realloc(e->val, cap ? cap : 1) : malloc(cap ? cap : 1);

		if (!p)
			return CRUN_ENOMEM;
		if (!append)
			free(e->val);
		e->val = p;
		e->val_cap = cap ? cap : 1;
	}
	if (len)
		memcpy(e->val + (append ? old : 0), v, len);
	e->val_len = need;
	t->value_bytes = t->value_bytes - (e->present ? old : 0) + need;
	e->share->used[STORE_B_VALUE_BYTES] += need - (e->present ? old : 0);
	if (!e->present) {
		e->present = true;
		t->n_keys++;
	}
	return 0;
}

void kv_drop_value(struct kv_table *t, struct kv_ent *e)
{
	if (!e->present)
		return;
	t->value_bytes -= e->val_len;
	e->share->used[STORE_B_VALUE_BYTES] -= e->val_len;
	t->n_keys--;
	e->present = false;
	free(e->val);
	e->val = NULL;
	e->val_len = e->val_cap = 0;
}

int kv_queue_push(struct kv_table *t, struct kv_ent *e, const uint8_t *v, size_t len)
{
	struct kv_item *it = malloc(sizeof(*it) + len);

	if (!it)
		return CRUN_ENOMEM;
	it->next = NULL;
	it->len = len;
	if (len)
		memcpy(it->data, v, len);
	if (e->q_tail)
		e->q_tail->next = it;
	else
		e->q_head = it;
	e->q_tail = it;
	e->q_len++;
	t->value_bytes += len;
	e->share->used[STORE_B_VALUE_BYTES] += len;
	return 0;
}

struct kv_item *kv_queue_pop(struct kv_table *t, struct kv_ent *e)
{
	struct kv_item *it = e->q_head;

	if (!it)
		return NULL;
	e->q_head = it->next;
	if (!e->q_head)
		e->q_tail = NULL;
	e->q_len--;
	t->value_bytes -= it->len;
	e->share->used[STORE_B_VALUE_BYTES] -= it->len;
	it->next = NULL;
	return it;
}

void kv_foreach(struct kv_table *t, void (*fn)(struct kv_ent *e, void *arg), void *arg)
{
	for (size_t i = 0; i <= t->mask; i++) {
		struct kv_ent *e = t->buckets[i];

		while (e) {
			struct kv_ent *next = e->next;

			fn(e, arg);
			e = next;
		}
	}
}
