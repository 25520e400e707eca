/* round.c: the pure core of a leaderless round (round_int.h). Every agent
 * runs the same functions on the same closed value, so no one assigns ranks
 * and no one's death can stop the others from learning them.
 */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "common/common.h"
#include "rendezvous/round_int.h"

int round_record_format(const struct round_node *n, char *buf, size_t cap)
{
	int r = str_printf(buf, cap, "%d %d %d %d %u %s %s", n->prev_round, n->prev_grank, n->nproc,
			   n->is_host, n->wport, n->addr, n->host);

	return r < 0 ? r : 0;
}

int round_record_parse(const char *s, int ticket, struct round_node *ret)
{
	struct round_node n = {.ticket = ticket};
	char tail;

	if (!s || strlen(s) >= ROUND_RECORD_MAX ||
	    sscanf(s, "%d %d %d %d %u %255s %255s %c", &n.prev_round, &n.prev_grank, &n.nproc,
		   &n.is_host, &n.wport, n.addr, n.host, &tail) != 7)
		return CRUN_EPROTO;
	if (n.nproc < 1 || n.wport > 65535 || n.prev_round < -1 || n.prev_grank < -1 ||
	    (n.is_host != 0 && n.is_host != 1))
		return CRUN_EPROTO;
	if (n.prev_round < 0 || n.prev_grank < 0)
		n.prev_round = n.prev_grank = -1;
	*ret = n;
	return 0;
}

/* The per-member integers of a closed value: one JSON array each. */
static const struct {
	const char *name;
	size_t off;
	int lo, hi;
} closed_ints[] = {
    {"t", offsetof(struct round_member, ticket), 1, 1 << 30},
    {"n", offsetof(struct round_member, nproc), 1, 1 << 20},
    {"pr", offsetof(struct round_member, prev_round), -1, 1 << 30},
    {"pg", offsetof(struct round_member, prev_grank), -1, 1 << 30},
};

#define FIELD(node, i) (*(int *)((char *)(node) + closed_ints[i].off))

int round_closed_format(int attempt, const struct round_node *m, int n, char **ret)
{
	cJSON *root = cJSON_CreateObject();
	int *grank = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL;
	struct round_member *mm = n > 0 ? calloc((size_t)n, sizeof(*mm)) : NULL;
	const char *maddr = "", *shost = "";
	unsigned mport = 0;
	int r = CRUN_ENOMEM;

	if (!root || (n > 0 && (!grank || !mm)))
		goto out;
	for (int i = 0; i < n; i++)
		mm[i] = (struct round_member){.ticket = m[i].ticket,
					      .prev_round = m[i].prev_round,
					      .prev_grank = m[i].prev_grank,
					      .nproc = m[i].nproc};
	if (n > 0) {
		/* The worker store is group rank 0's: its address travels once,
		 * not every member's. */
		r = round_order(mm, n, grank);
		if (r < 0)
			goto out;
		r = CRUN_ENOMEM;
		for (int i = 0; i < n; i++) {
			if (grank[i] == 0) {
				maddr = m[i].addr;
				mport = m[i].wport;
			}
			if (m[i].is_host && !*shost)
				shost = m[i].host;
		}
	}
	if (!cJSON_AddNumberToObject(root, "attempt", attempt) ||
	    !cJSON_AddStringToObject(root, "ma", maddr) ||
	    !cJSON_AddNumberToObject(root, "mp", mport) ||
	    !cJSON_AddStringToObject(root, "sh", shost))
		goto out;
	for (size_t f = 0; f < sizeof(closed_ints) / sizeof(closed_ints[0]); f++) {
		cJSON *arr = cJSON_AddArrayToObject(root, closed_ints[f].name);

		for (int i = 0; arr && i < n; i++) {
			cJSON *x = cJSON_CreateNumber(FIELD(&mm[i], f));

			if (!x || !cJSON_AddItemToArray(arr, x)) {
				cJSON_Delete(x);
				arr = NULL;
			}
		}
		if (!arr)
			goto out;
	}
	*ret = cJSON_PrintUnformatted(root);
	r = *ret ? 0 : CRUN_ENOMEM;
out:
	free(grank);
	free(mm);
	cJSON_Delete(root);
	return r;
}

void round_closed_free(struct round_closed *rc)
{
	if (!rc)
		return;
	free(rc->m);
	rc->m = NULL;
	rc->n = 0;
}

/* A string field of at most cap-1 bytes, no spaces (records split on them). */
static bool copy_word(const cJSON *s, char *buf, size_t cap)
{
	if (!cJSON_IsString(s) || strlen(s->valuestring) >= cap || strchr(s->valuestring, ' '))
		return false;
	snprintf(buf, cap, "%s", s->valuestring);
	return true;
}

int round_closed_parse(const char *s, int max_members, struct round_closed *ret)
{
	cJSON *root = s ? cJSON_Parse(s) : NULL;
	cJSON *a, *mp;
	struct round_closed rc = {0};
	int n = -1, r = CRUN_EPROTO;

	if (!root)
		return CRUN_EPROTO;
	a = cJSON_GetObjectItem(root, "attempt");
	mp = cJSON_GetObjectItem(root, "mp");
	if (!cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 1e9 ||
	    !cJSON_IsNumber(mp) || mp->valuedouble < 0 || mp->valuedouble > 65535 ||
	    !copy_word(cJSON_GetObjectItem(root, "ma"), rc.master_addr, sizeof(rc.master_addr)) ||
	    !copy_word(cJSON_GetObjectItem(root, "sh"), rc.store_host, sizeof(rc.store_host)))
		goto out;
	rc.attempt = a->valueint;
	rc.master_port = (unsigned)mp->valueint;
	for (size_t f = 0; f < sizeof(closed_ints) / sizeof(closed_ints[0]); f++) {
		cJSON *arr = cJSON_GetObjectItem(root, closed_ints[f].name);

		if (!cJSON_IsArray(arr) || (n >= 0 && cJSON_GetArraySize(arr) != n))
			goto out;
		if (n < 0) {
			n = cJSON_GetArraySize(arr);
			if (n > max_members)
				goto out;
			if (n > 0 && !(rc.m = calloc((size_t)n, sizeof(*rc.m)))) {
				r = CRUN_ENOMEM;
				goto out;
			}
		}
		/* Walk the list: cJSON_GetArrayItem(arr, i) starts from the head
		 * each time, O(n^2) per field (91% of a 2,048-agent simulation's
		 * CPU, every agent parsing the closed round). */
		cJSON *x = arr->child;

		for (int i = 0; i < n; i++, x = x->next) {
			if (!cJSON_IsNumber(x) || x->valuedouble < closed_ints[f].lo ||
			    x->valuedouble > closed_ints[f].hi)
				goto out;
			FIELD(&rc.m[i], f) = x->valueint;
		}
	}
	for (int i = 0; i < n; i++) {
		if (i > 0 && rc.m[i].ticket <= rc.m[i - 1].ticket)
			goto out; /* members are in ticket order */
		if (rc.m[i].prev_round < 0 || rc.m[i].prev_grank < 0)
			rc.m[i].prev_round = rc.m[i].prev_grank = -1;
	}
	if (n > 0 && (!rc.master_addr[0] || rc.master_port == 0))
		goto out; /* group rank 0 has no worker store */
	rc.n = n;
	*ret = rc;
	rc.m = NULL;
	r = 0;
out:
	free(rc.m);
	cJSON_Delete(root);
	return r;
}

int round_closed_find(const struct round_closed *rc, int ticket)
{
	int lo = 0, hi = rc->n - 1;

	while (lo <= hi) { /* members are in ticket order */
		int mid = lo + (hi - lo) / 2;

		if (rc->m[mid].ticket == ticket)
			return mid;
		if (rc->m[mid].ticket < ticket)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return -1;
}

int round_next_attempt(int prev_attempt, const char *prev_change)
{
	return prev_attempt + (prev_change && strncmp(prev_change, "restart", 7) == 0 ? 1 : 0);
}

bool round_watches_counts(int ticket)
{
	return ticket >= 1 && (unsigned)ticket <= ROUND_STAGGER_MAX + 1;
}

uint64_t round_close_at(int ticket, int max, uint64_t min_seen, uint64_t max_seen,
			uint32_t last_call_ms)
{
	uint64_t stagger =
	    (uint64_t)MIN((unsigned)(ticket - 1), ROUND_STAGGER_MAX) * ROUND_STAGGER_MS;

	if (max_seen)
		return max_seen + (ticket == max ? 0 : stagger + ROUND_STAGGER_MS);
	return min_seen ? min_seen + last_call_ms + stagger : 0;
}

bool round_should_close(int ticket, int max, uint64_t now, uint64_t min_seen, uint64_t max_seen,
			uint32_t last_call_ms)
{
	uint64_t at = round_close_at(ticket, max, min_seen, max_seen, last_call_ms);

	return at && now >= at;
}

int round_pick(const bool *live, int joined, int max, int *ret_idx)
{
	int n = 0;

	for (int i = 0; i < joined && n < max; i++)
		if (live[i])
			ret_idx[n++] = i;
	return n;
}

struct order_key {
	int kept, prev, ticket, idx;
};

static int order_cmp(const void *pa, const void *pb)
{
	const struct order_key *a = pa, *b = pb;

	if (a->kept != b->kept)
		return b->kept - a->kept;
	if (a->kept && a->prev != b->prev)
		return a->prev < b->prev ? -1 : 1;
	return a->ticket < b->ticket ? -1 : a->ticket > b->ticket;
}

int round_order(const struct round_member *m, int n, int *ret_grank)
{
	struct order_key *k;
	int newest = -1;

	if (!m || !ret_grank || n < 1)
		return CRUN_EINVAL;
	k = calloc((size_t)n, sizeof(*k));
	if (!k)
		return CRUN_ENOMEM;
	for (int i = 0; i < n; i++)
		if (m[i].prev_grank >= 0 && m[i].prev_round > newest)
			newest = m[i].prev_round;
	for (int i = 0; i < n; i++) {
		k[i].kept = newest >= 0 && m[i].prev_round == newest && m[i].prev_grank >= 0;
		k[i].prev = m[i].prev_grank;
		k[i].ticket = m[i].ticket;
		k[i].idx = i;
	}
	qsort(k, (size_t)n, sizeof(*k), order_cmp);
	for (int g = 0; g < n; g++)
		ret_grank[k[g].idx] = g;
	free(k);
	return 0;
}

int round_assign(const struct round_closed *rc, int me, struct round_assignment *ret)
{
	int n = rc->n, *grank, *nprocs;
	struct round_assignment a = {0};
	int r = CRUN_ENOMEM;

	if (me < 0 || me >= n)
		return CRUN_EINVAL;
	grank = calloc((size_t)n, sizeof(int));
	nprocs = calloc((size_t)n, sizeof(int));
	if (!grank || !nprocs)
		goto out;
	r = round_order(rc->m, n, grank);
	if (r < 0)
		goto out;
	for (int i = 0; i < n; i++)
		nprocs[grank[i]] = rc->m[i].nproc;
	r = rdzv_assign_ranks(nprocs, n, grank[me], &a.info);
	if (r < 0)
		goto out;
	snprintf(a.info.master_addr, sizeof(a.info.master_addr), "%s", rc->master_addr);
	a.info.master_port = (uint16_t)rc->master_port;
	a.info.attempt = rc->attempt;
	snprintf(a.store_host, sizeof(a.store_host), "%s", rc->store_host);
	a.host_member = rc->store_host[0] != '\0';
	*ret = a;
out:
	free(grank);
	free(nprocs);
	return r;
}

int round_head_format(const struct round_head *h, char **ret)
{
	cJSON *root = cJSON_CreateObject();
	int r = CRUN_ENOMEM;

	if (root && cJSON_AddNumberToObject(root, "attempt", h->attempt) &&
	    cJSON_AddNumberToObject(root, "by", h->by) &&
	    cJSON_AddNumberToObject(root, "nodes", h->nodes) &&
	    cJSON_AddStringToObject(root, "ma", h->master_addr) &&
	    cJSON_AddNumberToObject(root, "mp", h->master_port) &&
	    cJSON_AddStringToObject(root, "sh", h->store_host)) {
		*ret = cJSON_PrintUnformatted(root);
		r = *ret ? 0 : CRUN_ENOMEM;
	}
	cJSON_Delete(root);
	return r;
}

/* A JSON integer member within [lo, hi]. */
static bool int_in(const cJSON *root, const char *name, int lo, int hi, int *ret)
{
	const cJSON *x = cJSON_GetObjectItem(root, name);

	if (!cJSON_IsNumber(x) || x->valuedouble < lo || x->valuedouble > hi ||
	    x->valuedouble != (double)x->valueint)
		return false;
	*ret = x->valueint;
	return true;
}

int round_head_parse(const char *s, struct round_head *ret)
{
	cJSON *root = s ? cJSON_Parse(s) : NULL;
	struct round_head h = {0};
	int mp = 0;
	bool ok;

	if (!root)
		return CRUN_EPROTO;
	ok = int_in(root, "attempt", 0, 1000000000, &h.attempt) &&
	     int_in(root, "by", 0, 1 << 30, &h.by) && int_in(root, "nodes", 0, 1 << 30, &h.nodes) &&
	     int_in(root, "mp", 0, 65535, &mp) &&
	     copy_word(cJSON_GetObjectItem(root, "ma"), h.master_addr, sizeof(h.master_addr)) &&
	     copy_word(cJSON_GetObjectItem(root, "sh"), h.store_host, sizeof(h.store_host));
	cJSON_Delete(root);
	h.master_port = (unsigned)mp;
	/* Members need a closer and a worker store; an abandoned round has
	 * neither. */
	if (!ok || (h.nodes > 0 && (h.by < 1 || !h.master_addr[0] || h.master_port == 0)) ||
	    (h.nodes == 0 && h.by != 0))
		return CRUN_EPROTO;
	*ret = h;
	return 0;
}

void round_plan_free(struct round_plan *p)
{
	if (!p)
		return;
	free(p->ticket);
	free(p->val);
	crun_free(p->members);
	memset(p, 0, sizeof(*p));
}

int round_plan_make(int attempt, int by, const struct round_node *m, int n, struct round_plan *ret)
{
	struct round_plan p = {.n = n};
	struct round_member *mm = NULL;
	int *grank = NULL, *base = NULL;
	int64_t total = 0;
	int r = CRUN_EINVAL;

	if (!m || n < 1 || by < 1)
		return CRUN_EINVAL;
	mm = calloc((size_t)n, sizeof(*mm));
	grank = calloc((size_t)n, sizeof(int));
	base = calloc((size_t)n, sizeof(int));
	p.ticket = calloc((size_t)n, sizeof(int));
	p.val = calloc((size_t)n, sizeof(*p.val));
	if (!mm || !grank || !base || !p.ticket || !p.val) {
		r = CRUN_ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if (m[i].nproc < 1 || (i > 0 && m[i].ticket <= m[i - 1].ticket))
			goto out; /* ticket order, as the closed value says */
		mm[i] = (struct round_member){.ticket = m[i].ticket,
					      .prev_round = m[i].prev_round,
					      .prev_grank = m[i].prev_grank,
					      .nproc = m[i].nproc};
		p.ticket[i] = m[i].ticket;
	}
	r = round_order(mm, n, grank);
	if (r < 0)
		goto out;
	/* base[g]: nproc of group rank g, then the prefix sums. */
	for (int i = 0; i < n; i++)
		base[grank[i]] = m[i].nproc;
	for (int g = 0; g < n; g++) {
		int np = base[g];

		base[g] = (int)total;
		total += np;
	}
	r = CRUN_ERANGE;
	if (total > INT32_MAX)
		goto out;
	p.head = (struct round_head){.attempt = attempt, .by = by, .nodes = n};
	for (int i = 0; i < n; i++) {
		snprintf(p.val[i], sizeof(p.val[i]), "%d %d %" PRId64, grank[i], base[grank[i]],
			 total);
		if (grank[i] == 0) {
			snprintf(p.head.master_addr, sizeof(p.head.master_addr), "%s", m[i].addr);
			p.head.master_port = m[i].wport;
		}
		if (m[i].is_host && !p.head.store_host[0])
			snprintf(p.head.store_host, sizeof(p.head.store_host), "%s", m[i].host);
	}
	r = round_closed_format(attempt, m, n, &p.members);
out:
	free(mm);
	free(grank);
	free(base);
	if (r < 0)
		round_plan_free(&p);
	else
		*ret = p;
	return r;
}

int round_member_assign(const struct round_head *h, const char *val, struct round_assignment *ret)
{
	struct round_assignment a = {0};
	int g, base, world;
	char tail;

	if (!val || sscanf(val, "%d %d %d %c", &g, &base, &world, &tail) != 3 || h->nodes < 1 ||
	    g < 0 || g >= h->nodes || base < 0 || world < 1 || base >= world ||
	    world - base < h->nodes - g)
		return CRUN_EPROTO;
	a.info.group_rank = g;
	a.info.group_world_size = h->nodes;
	a.info.base_rank = a.info.role_base_rank = base;
	a.info.world_size = a.info.role_world_size = world;
	snprintf(a.info.master_addr, sizeof(a.info.master_addr), "%s", h->master_addr);
	a.info.master_port = (uint16_t)h->master_port;
	a.info.attempt = h->attempt;
	snprintf(a.store_host, sizeof(a.store_host), "%s", h->store_host);
	a.host_member = h->store_host[0] != '\0';
	*ret = a;
	return 0;
}
