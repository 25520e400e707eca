/* progress.c: what the rendezvous is doing (rdzv.h "progress"), written by
 * the join job on its helper thread at the points where it already looks at
 * the round (no store requests of its own), read by the agent's loop for
 * the status page, STATUS= and /metrics. One mutex; copies out.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/progress_int.h"

struct rdzv_prog {
	atomic_int refs;
	pthread_mutex_t mu;
	struct rdzv_progress p;
	/* the last completed round's hosts, for "waiting for" */
	char prev[RDZV_PROGRESS_NODES][RDZV_HOST_MAX];
	int nprev;     /* listed */
	bool prev_all; /* every member is listed */
	/* waiting: when the last call and the join timeout come (clock_now_ms;
	 * 0: not known), so a copy says what is left now, between looks */
	uint64_t last_call_at, timeout_at;
};

/* Seconds from now to `at` (rounded up), or -1 when at is 0. */
static int64_t secs_to(uint64_t at, uint64_t now)
{
	return !at ? -1 : at <= now ? 0 : (int64_t)((at - now + 999) / 1000);
}

static const struct {
	const char *name, *help;
} counter_rows[] = {
#define RDZV_C_X_(field, name, help) {name, help},
    RDZV_COUNTER_MAP(RDZV_C_X_)
#undef RDZV_C_X_
};

const char *rdzv_counter_name(enum rdzv_counter c)
{
	return (unsigned)c < RDZV_C__MAX ? counter_rows[c].name : "?";
}

const char *rdzv_counter_help(enum rdzv_counter c)
{
	return (unsigned)c < RDZV_C__MAX ? counter_rows[c].help : "?";
}

struct rdzv_prog *rdzv_prog_new(int min, int max)
{
	struct rdzv_prog *p = calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	atomic_init(&p->refs, 1);
	pthread_mutex_init(&p->mu, NULL);
	p->p.round = -1;
	p->p.min = min;
	p->p.max = max;
	p->p.last_call_s = p->p.timeout_s = -1;
	p->p.nawait = -1;
	return p;
}

struct rdzv_prog *rdzv_prog_ref(struct rdzv_prog *p)
{
	if (p)
		atomic_fetch_add(&p->refs, 1);
	return p;
}

void rdzv_prog_unref(struct rdzv_prog *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&p->mu);
	free(p);
}

void rdzv_prog_copy(struct rdzv_prog *p, struct rdzv_progress *ret)
{
	if (!p) {
		memset(ret, 0, sizeof(*ret));
		ret->round = -1;
		ret->last_call_s = ret->timeout_s = ret->nawait = -1;
		return;
	}
	pthread_mutex_lock(&p->mu);
	*ret = p->p;
	if (ret->waiting) {
		uint64_t now = clock_now_ms();

		ret->last_call_s = secs_to(p->last_call_at, now);
		ret->timeout_s = secs_to(p->timeout_at, now);
	}
	pthread_mutex_unlock(&p->mu);
}

void rdzv_prog_joining(struct rdzv_prog *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->p.waiting = true;
	p->p.joined = 0;
	p->p.nnodes = 0;
	p->p.last_call_s = p->p.timeout_s = -1;
	p->last_call_at = p->timeout_at = 0;
	p->p.nawait = -1;
	pthread_mutex_unlock(&p->mu);
}

/* The previous round's hosts that none of the joined hosts accounts for
 * (one joined host matches one previous host: several agents may share a
 * host name). Known only when every joined host and every member is. */
static void awaited(struct rdzv_prog *p, const char (*hosts)[RDZV_HOST_MAX], int nhosts)
{
	bool used[RDZV_PROGRESS_NODES] = {false};

	p->p.nawait = 0;
	for (int i = 0; i < p->nprev; i++) {
		int k = 0;

		while (k < nhosts && (used[k] || strcmp(hosts[k], p->prev[i])))
			k++;
		if (k < nhosts) {
			used[k] = true;
			continue;
		}
		if (p->p.nawait < RDZV_PROGRESS_AWAIT)
			snprintf(p->p.await[p->p.nawait], RDZV_HOST_MAX, "%s", p->prev[i]);
		p->p.nawait++;
	}
	p->p.nawait = MIN(p->p.nawait, RDZV_PROGRESS_AWAIT);
}

void rdzv_prog_waiting(struct rdzv_prog *p, int round, int joined, int64_t last_call_ms,
		       int64_t left_ms, const char (*hosts)[RDZV_HOST_MAX], int nhosts)
{
	if (!p)
		return;
	nhosts = MIN(nhosts, RDZV_PROGRESS_NODES);
	pthread_mutex_lock(&p->mu);
	p->p.waiting = true;
	p->p.round = round;
	p->p.joined = joined;
	p->last_call_at = last_call_ms < 0 ? 0 : clock_now_ms() + (uint64_t)last_call_ms;
	p->timeout_at = left_ms < 0 ? 0 : clock_now_ms() + (uint64_t)left_ms;
	p->p.nnodes = nhosts;
	for (int i = 0; i < nhosts; i++) {
		snprintf(p->p.nodes[i].host, RDZV_HOST_MAX, "%s", hosts[i]);
		p->p.nodes[i].addr[0] = '\0';
		p->p.nodes[i].group_rank = -1;
	}
	if (p->prev_all && nhosts == joined)
		awaited(p, hosts, nhosts);
	else
		p->p.nawait = p->nprev ? -1 : 0;
	pthread_mutex_unlock(&p->mu);
}

void rdzv_prog_abandoned(struct rdzv_prog *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	p->p.counters[RDZV_C_rounds_abandoned]++;
	pthread_mutex_unlock(&p->mu);
}

void rdzv_prog_completed(struct rdzv_prog *p, int round, int n, const struct rdzv_progress_node *m,
			 int nlisted, int continuing, int prev_n)
{
	if (!p)
		return;
	nlisted = MIN(nlisted, RDZV_PROGRESS_NODES);
	pthread_mutex_lock(&p->mu);
	p->p.waiting = false;
	p->p.round = round;
	p->p.joined = n;
	p->p.last_call_s = p->p.timeout_s = -1;
	p->last_call_at = p->timeout_at = 0;
	p->p.nawait = 0;
	p->p.nnodes = nlisted;
	if (nlisted)
		memcpy(p->p.nodes, m, (size_t)nlisted * sizeof(*m));
	for (int i = 0; i < nlisted; i++)
		memcpy(p->prev[i], m[i].host, RDZV_HOST_MAX);
	p->nprev = nlisted;
	p->prev_all = nlisted == n;
	p->p.counters[RDZV_C_rounds_completed]++;
	if (continuing >= 0) { /* else not known: not counted */
		p->p.counters[RDZV_C_nodes_joined] += (uint64_t)MAX(0, n - continuing);
		p->p.counters[RDZV_C_nodes_lost] += (uint64_t)MAX(0, prev_n - continuing);
	}
	pthread_mutex_unlock(&p->mu);
}

/* Appends to buf at *o, bounded (a cut line stays NUL-terminated). */
static void put(char *buf, size_t cap, size_t *o, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t cap, size_t *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*o >= cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *o, cap - *o, fmt, ap);
	va_end(ap);
	*o = n < 0 ? cap : MIN(cap, *o + (size_t)n);
}

int rdzv_progress_line(const struct rdzv_progress *p, const char *run_id, char *buf, size_t cap)
{
	size_t o = 0;

	if (!cap)
		return CRUN_EINVAL;
	buf[0] = '\0';
	put(buf, cap, &o, "rendezvous '%s'", run_id);
	if (p->round < 0 || (p->waiting && p->joined == 0)) {
		put(buf, cap, &o,
		    p->waiting ? ": joining (min %d, max %d nodes)" : ": no round yet", p->min,
		    p->max);
		return 0;
	}
	put(buf, cap, &o, " round %d", p->round);
	if (!p->waiting) {
		put(buf, cap, &o, " complete: %d node%s", p->joined, p->joined == 1 ? "" : "s");
		for (int i = 0; i < p->nnodes; i++)
			put(buf, cap, &o, "%s%s%s%s%s (rank %d)", i ? ", " : ": ", p->nodes[i].host,
			    p->nodes[i].addr[0] ? " " : "", p->nodes[i].addr[0] ? "at " : "",
			    p->nodes[i].addr, p->nodes[i].group_rank);
		return 0;
	}
	put(buf, cap, &o, ": %d/%d nodes joined (min %d, max %d)", p->joined, p->max, p->min,
	    p->max);
	if (p->last_call_s >= 0)
		put(buf, cap, &o, ", last call in %" PRId64 " s", p->last_call_s);
	else if (p->joined < p->min && p->timeout_s >= 0)
		put(buf, cap, &o, ", %d more needed within %" PRId64 " s", p->min - p->joined,
		    p->timeout_s);
	for (int i = 0; i < p->nawait; i++)
		put(buf, cap, &o, "%s%s", i ? ", " : "; waiting for: ", p->await[i]);
	for (int i = 0; i < p->nnodes; i++)
		put(buf, cap, &o, "%s%s", i ? ", " : "; joined: ", p->nodes[i].host);
	if (p->nnodes < p->joined)
		put(buf, cap, &o, ", ...");
	return 0;
}
