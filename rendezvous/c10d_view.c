/* c10d_view.c: a c10d job's rendezvous as the store that serves it holds
 * it (round_int.h's key layout), for that store's status page (crun-rdzvd
 * has no agent of the job, only its keys). Pure: the caller reads keys.
 *
 * The current round is "round"; it is complete when its head r<n>/closed
 * names members (the member list r<n>/members/<by> gives their group ranks,
 * their records r<n>/node/<t> hosts and addresses), else open with
 * r<n>/joined tickets so far. The previous round's members whose records do
 * not reappear in the open round (a record carries the node's previous round
 * and group rank) are the nodes it waits for, as an agent's page says.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/round_int.h"

static int get_i64(rdzv_key_get_fn get, void *arg, const char *key, int64_t *ret)
{
	char *v = get(key, arg);
	int r = v ? parse_i64(v, ret) : CRUN_ENOTFOUND;

	free(v);
	return r;
}

/* Ticket t's record in round rd; 0 or a negative code. */
static int record(rdzv_key_get_fn get, void *arg, int64_t rd, int t, struct round_node *ret)
{
	char key[64], *v;
	int r;

	if (str_printf(key, sizeof(key), "r%" PRId64 "/node/%d", rd, t) < 0)
		return CRUN_EINVAL;
	v = get(key, arg);
	r = v ? round_record_parse(v, t, ret) : CRUN_ENOTFOUND;
	free(v);
	return r;
}

/* Round rd's members by group rank (rc, grank: the caller frees), or a
 * negative code when it is not complete or cannot be read. */
static int members(rdzv_key_get_fn get, void *arg, int64_t rd, struct round_closed *rc,
		   int **ret_grank)
{
	struct round_head h;
	char key[64], *v;
	int r, *grank;

	if (str_printf(key, sizeof(key), "r%" PRId64 "/closed", rd) < 0)
		return CRUN_EINVAL;
	v = get(key, arg);
	r = v ? round_head_parse(v, &h) : CRUN_ENOTFOUND;
	free(v);
	if (r < 0 || h.nodes <= 0)
		return r < 0 ? r : CRUN_ENOTFOUND; /* open, or abandoned */
	if (str_printf(key, sizeof(key), "r%" PRId64 "/members/%d", rd, h.by) < 0)
		return CRUN_EINVAL;
	v = get(key, arg);
	r = v ? round_closed_parse(v, h.nodes, rc) : CRUN_ENOTFOUND;
	free(v);
	if (r < 0)
		return r;
	grank = calloc((size_t)MAX(rc->n, 1), sizeof(*grank));
	if (!grank || round_order(rc->m, rc->n, grank) < 0) {
		free(grank);
		round_closed_free(rc);
		return grank ? CRUN_EPROTO : CRUN_ENOMEM;
	}
	*ret_grank = grank;
	return 0;
}

static void complete(rdzv_key_get_fn get, void *arg, int64_t rd, const struct round_closed *rc,
		     const int *grank, struct rdzv_progress *p)
{
	p->waiting = false;
	p->joined = rc->n;
	p->nawait = 0;
	for (int i = 0; i < rc->n; i++) {
		struct rdzv_progress_node *o;
		struct round_node rn;

		if (grank[i] < 0 || grank[i] >= RDZV_PROGRESS_NODES)
			continue; /* listed up to RDZV_PROGRESS_NODES, as an agent's page */
		o = &p->nodes[grank[i]];
		o->group_rank = grank[i];
		if (record(get, arg, rd, rc->m[i].ticket, &rn) == 0) {
			snprintf(o->host, sizeof(o->host), "%s", rn.host);
			snprintf(o->addr, sizeof(o->addr), "%s", rn.addr);
		}
		p->nnodes = MAX(p->nnodes, grank[i] + 1);
	}
}

/* Open round rd: its joined nodes, and the previous round's members whose
 * records are not among them. */
static void open_round(rdzv_key_get_fn get, void *arg, int64_t rd, struct rdzv_progress *p)
{
	struct round_closed prev = {0};
	struct round_node rn;
	int64_t joined = 0;
	int *grank = NULL;
	char key[64];
	bool *back = NULL;

	p->waiting = true;
	if (str_printf(key, sizeof(key), "r%" PRId64 "/joined", rd) >= 0 &&
	    get_i64(get, arg, key, &joined) == 0)
		p->joined = (int)MIN(MAX(joined, 0), (int64_t)INT32_MAX);
	if (rd > 0 && members(get, arg, rd - 1, &prev, &grank) == 0)
		back = calloc((size_t)MAX(prev.n, 1), sizeof(*back));
	for (int t = 1; t <= p->joined; t++) {
		if (record(get, arg, rd, t, &rn) < 0)
			continue;
		if (p->nnodes < RDZV_PROGRESS_NODES) {
			struct rdzv_progress_node *o = &p->nodes[p->nnodes++];

			snprintf(o->host, sizeof(o->host), "%s", rn.host);
			snprintf(o->addr, sizeof(o->addr), "%s", rn.addr);
			o->group_rank = -1;
		}
		for (int i = 0; back && i < prev.n; i++)
			back[i] = back[i] || (rn.prev_round == rd - 1 && rn.prev_grank == grank[i]);
	}
	p->nawait = back ? 0 : -1;
	for (int i = 0; back && i < prev.n && p->nawait < RDZV_PROGRESS_AWAIT; i++) {
		if (back[i])
			continue;
		if (record(get, arg, rd - 1, prev.m[i].ticket, &rn) == 0)
			snprintf(p->await[p->nawait], RDZV_HOST_MAX, "%s", rn.host);
		else
			snprintf(p->await[p->nawait], RDZV_HOST_MAX, "group rank %d", grank[i]);
		p->nawait++;
	}
	free(back);
	free(grank);
	round_closed_free(&prev);
}

int rdzv_c10d_view(rdzv_key_get_fn get, void *arg, struct rdzv_progress *ret,
		   const char **ret_state)
{
	struct rdzv_progress *p = calloc(1, sizeof(*p));
	struct round_closed rc = {0};
	int64_t rd, lo, hi;
	int *grank = NULL;
	char *v, *colon;

	if (!p)
		return CRUN_ENOMEM;
	if (get_i64(get, arg, "round", &rd) < 0 || rd < 0 || rd > INT32_MAX) {
		free(p);
		return CRUN_ENOTFOUND;
	}
	p->round = (int)rd;
	p->last_call_s = p->timeout_s = -1; /* the agents' timers: not in the store */
	v = get("conf", arg);		    /* "MIN:MAX" */
	colon = v ? strchr(v, ':') : NULL;
	if (colon) {
		*colon = '\0';
		if (parse_i64(v, &lo) == 0 && parse_i64(colon + 1, &hi) == 0 && lo > 0 &&
		    hi >= lo && hi <= INT32_MAX) {
			p->min = (int)lo;
			p->max = (int)hi;
		}
	}
	free(v);
	if (members(get, arg, rd, &rc, &grank) == 0) {
		complete(get, arg, rd, &rc, grank, p);
		free(grank);
		round_closed_free(&rc);
	} else {
		open_round(get, arg, rd, p);
	}
	/* The job's end, once every node passed the exit barrier or it failed. */
	v = get("closed", arg);
	*ret_state = v && strncmp(v, "done", 4) == 0	 ? "done"
		     : v && strncmp(v, "failed", 6) == 0 ? "failed"
		     : p->waiting			 ? "rendezvous"
							 : "running";
	free(v);
	*ret = *p;
	free(p);
	return 0;
}
