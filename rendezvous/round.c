/* round.c: the pure core of a leaderless round (round_int.h). Every agent
 * runs the same functions on the same closed value, so no one assigns ranks
 * and no one's death can stop the others from learning them.
 */
#include <inttypes.h>
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

int round_closed_format(int attempt, const struct round_node *m, int n, char **ret)
{
	cJSON *root = cJSON_CreateObject(), *t = cJSON_CreateArray(), *rec = cJSON_CreateArray();
	int r = CRUN_ENOMEM;

	if (!root || !t || !rec)
		goto out;
	cJSON_AddItemToObject(root, "tickets", t);
	cJSON_AddItemToObject(root, "records", rec);
	t = rec = NULL;
	if (!cJSON_AddNumberToObject(root, "attempt", attempt))
		goto out;
	for (int i = 0; i < n; i++) {
		char buf[ROUND_RECORD_MAX];
		cJSON *x;

		r = round_record_format(&m[i], buf, sizeof(buf));
		if (r < 0)
			goto out;
		r = CRUN_ENOMEM;
		x = cJSON_CreateNumber(m[i].ticket);
		if (!x || !cJSON_AddItemToArray(cJSON_GetObjectItem(root, "tickets"), x))
			goto out;
		x = cJSON_CreateString(buf);
		if (!x || !cJSON_AddItemToArray(cJSON_GetObjectItem(root, "records"), x))
			goto out;
	}
	*ret = cJSON_PrintUnformatted(root);
	r = *ret ? 0 : CRUN_ENOMEM;
out:
	cJSON_Delete(root);
	cJSON_Delete(t);
	cJSON_Delete(rec);
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

int round_closed_parse(const char *s, int max_members, struct round_closed *ret)
{
	cJSON *root = s ? cJSON_Parse(s) : NULL;
	cJSON *a, *t, *rec;
	struct round_closed rc = {0};
	int n, r = CRUN_EPROTO;

	if (!root)
		return CRUN_EPROTO;
	a = cJSON_GetObjectItem(root, "attempt");
	t = cJSON_GetObjectItem(root, "tickets");
	rec = cJSON_GetObjectItem(root, "records");
	if (!cJSON_IsNumber(a) || a->valuedouble < 0 || a->valuedouble > 1e9 || !cJSON_IsArray(t) ||
	    !cJSON_IsArray(rec))
		goto out;
	n = cJSON_GetArraySize(t);
	if (n != cJSON_GetArraySize(rec) || n > max_members)
		goto out;
	rc.attempt = a->valueint;
	rc.n = n;
	if (n > 0) {
		rc.m = calloc((size_t)n, sizeof(*rc.m));
		if (!rc.m) {
			r = CRUN_ENOMEM;
			goto out;
		}
	}
	for (int i = 0; i < n; i++) {
		cJSON *ti = cJSON_GetArrayItem(t, i), *ri = cJSON_GetArrayItem(rec, i);

		if (!cJSON_IsNumber(ti) || ti->valuedouble < 1 || ti->valuedouble > 1e9 ||
		    !cJSON_IsString(ri) ||
		    round_record_parse(ri->valuestring, ti->valueint, &rc.m[i]) < 0 ||
		    (i > 0 && rc.m[i].ticket <= rc.m[i - 1].ticket))
			goto out;
	}
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

bool round_should_close(int ticket, int max, uint64_t now, uint64_t min_seen, uint64_t max_seen,
			uint32_t last_call_ms)
{
	uint64_t stagger =
	    (uint64_t)MIN((unsigned)(ticket - 1), ROUND_STAGGER_MAX) * ROUND_STAGGER_MS;

	if (max_seen)
		return now >= max_seen + (ticket == max ? 0 : stagger + ROUND_STAGGER_MS);
	return min_seen && now >= min_seen + last_call_ms + stagger;
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

int round_order(const struct round_node *m, int n, int *ret_grank)
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
	int n = rc->n, *grank, *nprocs, *by_rank;
	struct round_assignment a = {0};
	int r = CRUN_ENOMEM;

	if (me < 0 || me >= n)
		return CRUN_EINVAL;
	grank = calloc((size_t)n, sizeof(int));
	nprocs = calloc((size_t)n, sizeof(int));
	by_rank = calloc((size_t)n, sizeof(int));
	if (!grank || !nprocs || !by_rank)
		goto out;
	r = round_order(rc->m, n, grank);
	if (r < 0)
		goto out;
	for (int i = 0; i < n; i++) {
		by_rank[grank[i]] = i;
		a.host_member |= rc->m[i].is_host;
		if (rc->m[i].is_host)
			snprintf(a.store_host, sizeof(a.store_host), "%s", rc->m[i].host);
	}
	for (int g = 0; g < n; g++)
		nprocs[g] = rc->m[by_rank[g]].nproc;
	r = rdzv_assign_ranks(nprocs, n, grank[me], &a.info);
	if (r < 0)
		goto out;
	snprintf(a.info.master_addr, sizeof(a.info.master_addr), "%s", rc->m[by_rank[0]].addr);
	a.info.master_port = (uint16_t)rc->m[by_rank[0]].wport;
	a.info.attempt = rc->attempt;
	snprintf(a.nbr_host, sizeof(a.nbr_host), "%s", rc->m[by_rank[(grank[me] + 1) % n]].host);
	if (a.info.master_port == 0) {
		r = CRUN_EPROTO; /* group rank 0 has no worker store */
		goto out;
	}
	*ret = a;
	r = 0;
out:
	free(grank);
	free(nprocs);
	free(by_rank);
	return r;
}
