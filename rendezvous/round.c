/* round.c: the pure core of a leaderless round (round_int.h). Every agent
 * runs the same functions on the same closed value, so no one assigns ranks
 * and no one's death can stop the others from learning them. It calls
 * nothing but libc (make lint checks its object's undefined symbols); the
 * JSON values are round_json.c's.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/round_int.h"

int round_record_format(const struct round_node *n, char *buf, size_t cap)
{
	int r = snprintf(buf, cap, "%d %d %d %d %u %s %s", n->prev_round, n->prev_grank, n->nproc,
			 n->is_host, n->wport, n->addr, n->host);

	if (r < 0)
		return CRUN_EINVAL;
	return (size_t)r < cap ? 0 : CRUN_ETOOBIG;
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

void round_closed_free(struct round_closed *rc)
{
	if (!rc)
		return;
	free(rc->m);
	rc->m = NULL;
	rc->n = 0;
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

struct round_member round_member_of(const struct round_node *n)
{
	return (struct round_member){.ticket = n->ticket,
				     .prev_round = n->prev_round,
				     .prev_grank = n->prev_grank,
				     .nproc = n->nproc};
}

int rdzv_assign_ranks(const int *nprocs, int nnodes, int me, struct rdzv_info *ret)
{
	int64_t base = 0, total = 0;

	if (!nprocs || nnodes < 1 || me < 0 || me >= nnodes)
		return CRUN_EINVAL;
	for (int i = 0; i < nnodes; i++) {
		if (nprocs[i] < 1)
			return CRUN_EINVAL;
		if (i < me)
			base += nprocs[i];
		total += nprocs[i];
	}
	if (total > INT32_MAX)
		return CRUN_ERANGE;
	ret->group_rank = me;
	ret->group_world_size = nnodes;
	ret->base_rank = (int)base;
	ret->world_size = (int)total;
	/* One role per job (as torchrun's launcher), so role ranks equal ranks. */
	ret->role_base_rank = (int)base;
	ret->role_world_size = (int)total;
	return 0;
}

int round_ranks(const struct round_member *m, int n, int *ret_grank, int *ret_base, int *ret_world)
{
	int64_t total = 0;
	int r = round_order(m, n, ret_grank); /* not TRY: its breadcrumb is not libc */

	if (r < 0)
		return r;
	/* ret_base[g]: nproc of group rank g, then the prefix sums. */
	for (int i = 0; i < n; i++) {
		if (m[i].nproc < 1)
			return CRUN_EINVAL;
		ret_base[ret_grank[i]] = m[i].nproc;
	}
	for (int g = 0; g < n; g++) {
		int np = ret_base[g];

		ret_base[g] = (int)total;
		total += np;
	}
	if (total > INT32_MAX)
		return CRUN_ERANGE;
	*ret_world = (int)total;
	return 0;
}

/* The ranks of an assignment; one role per job, so role ranks equal ranks. */
static void assignment_fill(struct round_assignment *a, int g, int nodes, int base, int world)
{
	a->info.group_rank = g;
	a->info.group_world_size = nodes;
	a->info.base_rank = a->info.role_base_rank = base;
	a->info.world_size = a->info.role_world_size = world;
}

/* Where the round's stores are, the same for every member. */
static void where_fill(struct round_assignment *a, const char *maddr, unsigned mport, int attempt,
		       const char *shost)
{
	snprintf(a->info.master_addr, sizeof(a->info.master_addr), "%s", maddr);
	a->info.master_port = (uint16_t)mport;
	a->info.attempt = attempt;
	snprintf(a->store_host, sizeof(a->store_host), "%s", shost);
	a->host_member = shost[0] != '\0';
}

int round_assign(const struct round_closed *rc, int me, struct round_assignment *ret)
{
	int n = rc->n, *grank, *base;
	struct round_assignment a = {0};
	int world, r = CRUN_ENOMEM;

	if (me < 0 || me >= n)
		return CRUN_EINVAL;
	grank = calloc((size_t)n, sizeof(int));
	base = calloc((size_t)n, sizeof(int));
	if (!grank || !base)
		goto out;
	r = round_ranks(rc->m, n, grank, base, &world);
	if (r < 0)
		goto out;
	assignment_fill(&a, grank[me], n, base[grank[me]], world);
	where_fill(&a, rc->master_addr, rc->master_port, rc->attempt, rc->store_host);
	*ret = a;
out:
	free(grank);
	free(base);
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
	assignment_fill(&a, g, h->nodes, base, world);
	where_fill(&a, h->master_addr, h->master_port, h->attempt, h->store_host);
	*ret = a;
	return 0;
}
