/* c10d_close.c: closing an open round of the c10d jobs (c10d_int.h). Any
 * member whose last-call turn came (or at MAX) claims r<n>/closing, reads
 * which tickets are alive (one CHECK, else one MULTI_GET) and, with MIN of
 * them, compare-sets r<n>/closed with their records; the first to
 * compare-set r<n>/closer writes each member's assignment. A drawn ticket
 * whose lease is not there yet holds the close (below MIN until it comes,
 * else one TTL at most). Split from c10d_join.c, which waits for the close.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "rendezvous/round_int.h"

/* Which of tickets 1..n have their alive key, into live[0..n): 0, or 1 when
 * the store cannot say in bulk (the caller asks ticket by ticket). First
 * whether the first `max` all exist, in one round trip that never waits (a
 * CHECK of them): the common case. Else which ones, in one more (a MULTI_GET
 * without a WAIT on a crun store). A MULTI_GET with a 1 ms timeout did the
 * first before: on a busy store its WAIT outlived the millisecond, the
 * closer fell back to n lookups without keeping its lease alive, the lease
 * lapsed and the round was abandoned (6 rounds in a row at 8,192 simulated
 * agents); and the n lookups, one round trip each, were still the fallback
 * whenever a joiner had its ticket but not yet its lease (12,288 CHECKs by
 * one closer at 12,288 simulated agents: 1.0 request per member). */
static int alive_look(struct coord *c, int64_t rd, int n, int max, bool *live)
{
	char **keys = calloc((size_t)n, sizeof(char *));
	int r = keys && n > 0 ? 0 : CRUN_ENOMEM, first = MIN(n, max);

	for (int i = 0; r >= 0 && i < n; i++) {
		keys[i] = malloc(64);
		r = keys[i] ? str_printf(keys[i], 64, "r%" PRId64 "/alive/%d", rd, i + 1)
			    : CRUN_ENOMEM;
	}
	if (r >= 0)
		r = coord_exists_all(c, (const char *const *)keys, (size_t)first);
	if (r == 1) {
		for (int i = 0; i < first; i++)
			live[i] = true;
		r = 0;
	} else if (r == 0) {
		r = coord_exists_each(c, (const char *const *)keys, (size_t)n, live);
		r = r == CRUN_ENOTSUP ? 1 : r;
	}
	for (int i = 0; keys && i < n; i++)
		free(keys[i]);
	free(keys);
	return r;
}

/* Whether ticket t is the one closer of round rd: the first to compare-set
 * r<rd>/closer (a slow closer and the member that took its claim over must
 * not both write the assignments, which are under no closer's name). 1:
 * it is, 0: another closer is. */
static int win_closer(struct coord *c, int64_t rd, int64_t t)
{
	char key[64], me[32], *cur = NULL;
	int r;

	KEY(key, "r%" PRId64 "/closer", rd);
	KEY(me, "%" PRId64, t);
	TRY(coord_compare_set(c, key, "", me, &cur));
	r = strcmp(cur, me) == 0;
	crun_free(cur);
	return r;
}

/* Closes round rd as ticket t with members m[0..n): first every member's
 * assignment (r<rd>/a/<ticket>: a member's wait reads its own with the
 * closed key, so the key cannot depend on the closer; win_closer makes it
 * one writer) and the member list under this closer's name (one
 * MULTI_SET), then the head by COMPARE_SET. Whoever won, *ret_closed gets
 * the head now stored: no need to wait for it (the store may be busy
 * serving it to everyone). Nothing when another member is the closer. */
static int write_close(struct coord *c, int64_t rd, int64_t t, int attempt,
		       const struct round_node *m, int n, char **ret_closed)
{
	struct round_plan p;
	char **keys = calloc((size_t)n + 1, sizeof(char *)), *head = NULL, key[64];
	const char **vals = calloc((size_t)n + 1, sizeof(char *));
	int r = keys && vals ? round_plan_make(attempt, (int)t, m, n, &p) : CRUN_ENOMEM;

	if (r < 0) {
		free(keys);
		free(vals);
		return r;
	}
	r = win_closer(c, rd, t);
	if (r <= 0) {
		free(keys);
		free(vals);
		round_plan_free(&p);
		return r;
	}
	r = 0;
	for (int i = 0; i < n && r == 0; i++) {
		r = asprintf(&keys[i], "r%" PRId64 "/a/%d", rd, p.ticket[i]) < 0 ? CRUN_ENOMEM : 0;
		vals[i] = p.val[i];
	}
	if (r == 0)
		r = asprintf(&keys[n], "r%" PRId64 "/members/%" PRId64, rd, t) < 0 ? CRUN_ENOMEM
										   : 0;
	vals[n] = p.members;
	if (r == 0)
		r = coord_multi_set(c, (const char *const *)keys, vals, (size_t)n + 1);
	if (r == 0)
		r = round_head_format(&p.head, &head);
	if (r == 0)
		r = str_printf(key, sizeof(key), "r%" PRId64 "/closed", rd);
	if (r >= 0)
		r = coord_compare_set(c, key, "", head, ret_closed);
	crun_free(head);
	for (int i = 0; i <= n; i++)
		free(keys[i]);
	free(keys);
	free(vals);
	round_plan_free(&p);
	return r;
}

/* Reads which of tickets 1..joined are alive (until MAX of them) and, with
 * at least MIN, closes the round with them and their records (one
 * MULTI_GET: a record is written before its alive key). 0 whether or not
 * it closed; *ret_closed (malloc'd) is set when this call wrote or found
 * the closed value, else the caller waits for it. *ret_lag: the first
 * ticket drawn whose alive key is not there yet (a joiner between its
 * ticket and its lease, or dead there) when the round stays open for it:
 * below MIN always, below MAX too while hold_lag (a ticket drawn in time
 * is a member, not a spare: closing without it made a node that had just
 * taken ticket 3 of MAX 3 wait alone for the next round, issue 23), else
 * 0. *last_keep: c10d_keep_lease's. */
static int try_close(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t, bool hold_lag,
		     uint64_t *last_keep, char **ret_closed, int *ret_lag)
{
	struct round_node *m = NULL;
	char **keys = NULL, **vals = NULL;
	char key[96];
	int r, n = 0, k = 0, good = 0, attempt, lag = 0;
	int64_t joined;
	bool *live = NULL, each;

	*ret_lag = 0;
	KEY(key, "r%" PRId64 "/closed", rd);
	r = coord_exists(c, key);
	if (r != 0) /* closed already (1), or an error */
		goto out;
	KEY(key, "r%" PRId64 "/joined", rd);
	r = coord_add(c, key, 0, &joined);
	if (r < 0)
		goto out;
	n = (int)MIN(joined, (int64_t)j->max + 4096); /* bounded read */
	m = calloc((size_t)n, sizeof(*m));
	keys = calloc((size_t)n, sizeof(char *));
	vals = calloc((size_t)n, sizeof(char *));
	live = calloc((size_t)n, sizeof(bool));
	r = CRUN_ENOMEM;
	if (!m || !keys || !vals || !live)
		goto out;
	r = n > 0 ? alive_look(c, rd, n, j->max, live) : 0;
	if (r < 0)
		goto out;
	each = r == 1;
	for (int i = 0; i < n && k < j->max; i++) {
		r = str_printf(key, sizeof(key), "r%" PRId64 "/alive/%d", rd, i + 1);
		/* One lookup per ticket may outlast the TTL (thousands of
		 * tickets on a busy store): keep the lease meanwhile. */
		if (r >= 0 && each)
			(void)c10d_keep_lease(j, clock_now_ms(), last_keep); /* the wait looks */
		if (r >= 0)
			r = each ? coord_exists(c, key) : live[i];
		if (r < 0)
			goto out;
		if (r == 0) {
			lag = lag ? lag : i + 1;
			continue; /* dead, or not there yet: not a member */
		}
		m[k].ticket = i + 1;
		r = CRUN_ENOMEM;
		keys[k] = malloc(64);
		if (!keys[k])
			goto out;
		snprintf(keys[k++], 64, "r%" PRId64 "/node/%d", rd, i + 1);
	}
	r = 0;
	if (k < j->min || (hold_lag && lag && k < j->max)) {
		*ret_lag = lag;
		goto out;
	}
	r = coord_multi_get(c, (const char *const *)keys, (size_t)k, j->conf.read_ms, vals);
	if (r < 0)
		goto out;
	for (int i = 0; i < k; i++) {
		if (round_record_parse(vals[i], m[i].ticket, &m[good]) == 0)
			good++;
		else
			log_at(LL_WARN, SUB_RDZV, "ignoring a bad node record of ticket %d: %.200s",
			       m[i].ticket, vals[i]);
	}
	if (good < j->min)
		goto out;
	r = c10d_attempt_of(j, c, rd, &attempt);
	if (r == 0)
		r = write_close(c, rd, t, attempt, m, good, ret_closed);
out:
	for (int i = 0; keys && vals && i < n; i++) {
		free(keys[i]);
		crun_free(vals[i]);
	}
	free(keys);
	free(vals);
	free(live);
	free(m);
	return r < 0 ? c10d_jfail(j, c, r, "closing the round") : 0;
}

/* One closer at a time: reading every record and writing every member's
 * assignment costs O(K), so the members whose close timers fire together
 * (past the stagger, or when the closer is slow) must not all do it. A
 * member closes only when it takes r<n>/closing - free, or still held by
 * the claimant it saw last time (given a while and no round, which a dead
 * claimant's lease would have ended). 1: closing is ours, 0: another
 * member's (claim: its value, for the next try). */
static int claim_close(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t, char *claim,
		       size_t cap)
{
	char key[64], me[32], *cur = NULL;
	int r;

	KEY(key, "r%" PRId64 "/closing", rd);
	KEY(me, "%" PRId64, t);
	if (strcmp(claim, me) == 0)
		return 1; /* ours already: try again (below MIN live tickets) */
	r = coord_compare_set(c, key, claim, me, &cur);
	if (r < 0)
		return c10d_jfail(j, c, r, "claiming the close");
	r = strcmp(cur, me) == 0;
	snprintf(claim, cap, "%s", cur);
	crun_free(cur);
	return r;
}

/* This member's turn to close round rd: claims the close and, when the
 * claim is its own, tries. 0 with *ret_closed set: closed. Else when to
 * look again (ct): once the first lagging ticket takes its lease (a joiner
 * between its ticket and its lease when the closer looked: under load,
 * 14 of 40 at once), else after a TTL (such a joiner that died is dropped
 * then); a member that lost the claim after two (a closer that died ended
 * the round through its lease before then). Waiting the TTL for a lagging
 * lease too held a full round (MAX joined) that long, and past the join
 * timeout with a TTL longer than it (issue 23). With MIN alive the close
 * is held for a lagging ticket for one TTL at most (ct->held_at): then it
 * is taken as dead and the round closes without it. */
int c10d_close_turn(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t,
		    struct c10d_close_turn *ct, uint64_t *last_keep, char **ret_closed)
{
	uint64_t now = clock_now_ms();
	int r, lag = 0;

	ct->lag[0] = '\0';
	r = claim_close(j, c, rd, t, ct->claim, sizeof(ct->claim));
	if (r < 0)
		return r;
	if (r == 1) {
		bool hold = !ct->held_at || now - ct->held_at < j->conf.ttl_ms;

		TRY(try_close(j, c, rd, t, hold, last_keep, ret_closed, &lag));
		if (*ret_closed)
			return 0;
	}
	if (lag) {
		ct->held_at = ct->held_at ? ct->held_at : now;
		KEY(ct->lag, "r%" PRId64 "/alive/%d", rd, lag);
		log_at(LL_DEBUG, SUB_RDZV,
		       "rendezvous '%s' round %" PRId64 ": ticket %d drawn but not alive yet "
		       "(between its ticket and its lease); waiting for ticket %d's alive key",
		       j->prefix, rd, lag, lag);
	}
	ct->next_try = now + (r == 1 ? j->conf.ttl_ms : 2 * j->conf.ttl_ms);
	return 0;
}
