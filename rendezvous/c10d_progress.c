/* c10d_progress.c: what the c10d/etcd join job tells the progress record
 * (progress_int.h): the waiting line at the join loop's progress points,
 * from the node records read for it, and, once a round of up to
 * PROGRESS_COUNT_MAX nodes completed, its member list (one GET: the joined
 * and lost counters) and the members' records (one MULTI_GET: names,
 * addresses, group ranks).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "rendezvous/progress_int.h"
#include "rendezvous/round_int.h"

#define PROGRESS_HOSTS_READ 8 /* records read per waiting line */
/* Rounds up to this many nodes: every member reads the member list and the
 * records once (node list, joined/lost counters). Bigger rounds are counted
 * as rounds only: the round protocol keeps a member's reads independent of
 * the round's size, and a status page must not undo that. */
#define PROGRESS_COUNT_MAX RDZV_PROGRESS_NODES

/* The progress prefix is "crun-c10d/<run_id>": the run id alone. */
static const char *run_id_of(const struct c10d_job *j)
{
	const char *s = strrchr(j->prefix, '/');

	return s && s[1] ? s + 1 : j->prefix;
}

void c10d_progress(struct c10d_job *j, struct coord *c, int64_t rd, int64_t joined,
		   uint64_t min_seen, uint64_t left_ms)
{
	char hosts[PROGRESS_HOSTS_READ][RDZV_HOST_MAX], kb[PROGRESS_HOSTS_READ][64], line[1024];
	const char *keys[PROGRESS_HOSTS_READ];
	char *vals[PROGRESS_HOSTS_READ] = {0};
	int n = 0, nk = (int)MIN(joined, (int64_t)PROGRESS_HOSTS_READ);
	int64_t last_call = -1;
	struct rdzv_progress p;
	bool bulk, alone;

	for (int i = 0; i < nk; i++) {
		if (str_printf(kb[i], sizeof(kb[i]), "r%" PRId64 "/node/%d", rd, i + 1) < 0)
			nk = i; /* cannot happen: 64 bytes hold any such key */
		keys[i] = kb[i];
	}
	/* The first records in one request where the store can (a line every
	 * few seconds from every waiting member), else one by one. */
	bulk = nk > 0 && coord_multi_get_now(c, keys, (size_t)nk, vals) == 0;
	for (int i = 0; i < nk; i++) {
		struct round_node rn;

		if (!bulk && coord_try_get(c, keys[i], &vals[i]) < 0)
			vals[i] = NULL;
		if (vals[i] && round_record_parse(vals[i], i + 1, &rn) == 0)
			snprintf(hosts[n++], RDZV_HOST_MAX, "%s", rn.host);
		crun_free(vals[i]);
	}
	if (min_seen) {
		uint64_t at = min_seen + j->conf.last_call_ms, now = clock_now_ms();

		last_call = at > now ? (int64_t)(at - now) : 0;
	}
	rdzv_prog_waiting(j->prog, (int)rd, (int)joined, last_call, (int64_t)left_ms,
			  (const char(*)[RDZV_HOST_MAX])hosts, n);
	rdzv_prog_copy(j->prog, &p);
	if (!j->prog) { /* no record (c10d_join_on): the line from what we have */
		p.round = (int)rd;
		p.waiting = true;
		p.joined = (int)joined;
		p.min = j->min;
		p.max = j->max;
		p.last_call_s = last_call < 0 ? -1 : (last_call + 999) / 1000;
		p.timeout_s = (int64_t)(left_ms / 1000);
		p.nawait = 0;
	}
	(void)rdzv_progress_line(&p, run_id_of(j), line, sizeof(line));
	alone = j->is_host && joined == 1 && j->prev_round >= 0;
	/* Waiting is normal (NOTICE); alone after a round may be a cut link. */
	log_at(alone ? LL_WARN : LL_NOTICE, SUB_RDZV, "%s%s", line,
	       /* The store host cannot tell "everyone else died" from "my link is
		* cut"; in the second case the others have already ended the job
		* (they lost the store), so say it rather than wait in silence. */
	       alone ? "; this node serves the rendezvous store and is alone: if its network "
		       "was cut, the other nodes could not reach the store and have ended the job"
		     : "");
}

void c10d_progress_round(struct c10d_job *j, struct coord *c, const struct round_head *h,
			 int64_t rd, int prev_n)
{
	struct round_closed rc = {0};
	struct rdzv_progress_node *m = NULL;
	int *grank = NULL, continuing = 0, listed = 0;
	char key[96], **keys = NULL, **vals = NULL, *v = NULL;

	if (!j->prog)
		return;
	/* The member list: what every member's previous round was (for the
	 * counters) and the tickets whose records name the nodes. Only for
	 * rounds a member can read whole cheaply. The closer writes it before
	 * the head: absent now is absent for good (a forged or foreign head),
	 * and waiting read_timeout for it would hold the join up. */
	if (h->nodes > PROGRESS_COUNT_MAX ||
	    str_printf(key, sizeof(key), "r%" PRId64 "/members/%d", rd, h->by) < 0 ||
	    coord_try_get(c, key, &v) < 0 || round_closed_parse(v, h->nodes, &rc) < 0) {
		crun_free(v);
		rdzv_prog_completed(j->prog, (int)rd, h->nodes, NULL, 0, -1, 0);
		return;
	}
	crun_free(v);
	for (int i = 0; i < rc.n; i++)
		continuing += j->prev_round >= 0 && rc.m[i].prev_round == j->prev_round;
	if (rc.n <= RDZV_PROGRESS_NODES) {
		m = calloc((size_t)rc.n, sizeof(*m));
		grank = calloc((size_t)rc.n, sizeof(*grank));
		keys = calloc((size_t)rc.n, sizeof(*keys));
		vals = calloc((size_t)rc.n, sizeof(*vals));
	}
	if (m && grank && keys && vals && round_order(rc.m, rc.n, grank) == 0) {
		bool ok = true;

		for (int i = 0; ok && i < rc.n; i++) {
			keys[i] = malloc(64);
			ok = keys[i] && str_printf(keys[i], 64, "r%" PRId64 "/node/%d", rd,
						   rc.m[i].ticket) >= 0;
		}
		if (ok && coord_multi_get(c, (const char *const *)keys, (size_t)rc.n,
					  j->conf.read_ms, vals) == 0) {
			for (int i = 0; i < rc.n; i++) {
				struct round_node rn;
				struct rdzv_progress_node *o = &m[grank[i]];

				o->group_rank = grank[i];
				if (round_record_parse(vals[i], rc.m[i].ticket, &rn) == 0) {
					snprintf(o->host, sizeof(o->host), "%s", rn.host);
					snprintf(o->addr, sizeof(o->addr), "%s", rn.addr);
				}
				crun_free(vals[i]);
			}
			listed = rc.n;
		}
	}
	rdzv_prog_completed(j->prog, (int)rd, rc.n, m, listed, continuing,
			    j->prev_round >= 0 ? prev_n : 0);
	for (int i = 0; keys && i < rc.n; i++)
		free(keys[i]);
	free(keys);
	free(vals);
	free(grank);
	free(m);
	round_closed_free(&rc);
}
