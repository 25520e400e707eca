/* c10d_exit.c: the end of a c10d job (c10d_int.h) - the exit barrier every
 * node of the last round passes ("done <round>" on the job's closed key,
 * then the departures the store host waits for) and closing the job as
 * failed with its reason. Split from c10d_join.c, which joins rounds.
 */
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"

/* closed is "done <this job's round>": every node of this round passed. */
static bool barrier_done_here(const struct c10d_job *j, const char *closed)
{
	char want[32];

	snprintf(want, sizeof(want), "done %d", j->round);
	return strcmp(closed, want) == 0;
}

/* Waits for the job's end. A peer that restarts instead wakes this node
 * through its monitor (the agent then leaves the barrier for the next round);
 * a peer that fails sets "closed" to the failure. */
static int barrier_wait(struct c10d_job *j, struct coord *c)
{
	char *v = NULL;
	int r = coord_wait(c, "closed", j->conf.join_ms);

	if (r == CRUN_ETIMEDOUT) {
		j->barrier = BO_TIMED_OUT;
		snprintf(j->err, sizeof(j->err),
			 "exit barrier: timed out after %u s waiting for the other nodes of "
			 "rendezvous '%s' round %d to finish",
			 j->conf.join_ms / 1000, j->prefix, j->round);
		return r;
	}
	if (r == 0)
		r = coord_get(c, "closed", j->conf.read_ms, &v);
	if (r < 0)
		return c10d_jfail(j, c, r, "exit barrier");
	if (strncmp(v, "failed", 6) == 0) {
		j->barrier = BO_FAILED;
		snprintf(j->err, sizeof(j->err), "the job failed on another node: %s", v);
	} else if (!barrier_done_here(j, v) || helper_stopping(&j->h)) {
		/* A later round ended the job: this barrier's agent left it for
		 * that round (the loop dropped this job). Waiting for this
		 * round's departures would hold a connection, and the host's
		 * exit, for C10D_DEPART_MS. */
		j->barrier = BO_FAILED;
		snprintf(j->err, sizeof(j->err),
			 "exit barrier of round %d: left for a later round (closed: %.200s)",
			 j->round, v);
	}
	crun_free(v);
	return 0;
}

/* The host gives up on the barrier, and its exit takes the store along:
 * close the job as failed, so that the nodes still running learn it now
 * (their monitors watch "closed" and r<n>/change), stop and hang up, instead
 * of finding the store gone after the host's linger (C10D_DEPART_MS). A node
 * that arrived meanwhile may have passed the barrier: then it passed here. */
static int barrier_give_up(struct c10d_job *j, struct coord *c)
{
	char val[700], key[64], *cur = NULL;
	int r;

	snprintf(val, sizeof(val), "failed: %.400s (on %.200s, which serves the rendezvous store)",
		 j->err, j->hostname);
	r = coord_compare_set(c, "closed", "", val, &cur);
	if (r == 0 && strcmp(cur, val) != 0) {
		if (barrier_done_here(j, cur)) {
			j->barrier = BO_PASSED;
			j->err[0] = '\0';
		} else {
			j->barrier = BO_FAILED;
			snprintf(j->err, sizeof(j->err), "the job failed on another node: %s", cur);
		}
		crun_free(cur);
		return j->barrier == BO_PASSED ? 0 : CRUN_ERDZVCLOSED;
	}
	crun_free(cur);
	if (r == 0 && str_printf(key, sizeof(key), "r%d/change", j->round) >= 0)
		r = coord_set(c, key, "failed");
	if (r < 0)
		log_at(LL_WARN, SUB_RDZV,
		       "cannot tell the other nodes that the exit barrier failed: %s",
		       crun_strerror(r));
	return CRUN_ETIMEDOUT;
}

int c10d_job_barrier(struct c10d_job *j, struct coord *c)
{
	char k1[64], k2[64], val[64];
	int64_t n;
	int r;

	j->barrier = BO_PASSED;
	KEY(k1, "r%d/exit", j->round);
	r = coord_add(c, k1, 1, &n);
	if (r < 0)
		return c10d_jfail(j, c, r, "exit barrier");
	if (n == j->nnodes) {
		KEY(val, "done %d", j->round);
		r = coord_compare_set(c, "closed", "", val, NULL);
		if (r < 0)
			return c10d_jfail(j, c, r, "exit barrier");
	}
	r = barrier_wait(j, c);
	/* Not a dropped job: the barrier a restart left may time out in the
	 * middle of a later round, which it must not end. */
	if (r == CRUN_ETIMEDOUT && j->barrier == BO_TIMED_OUT && j->is_host &&
	    !helper_stopping(&j->h))
		r = barrier_give_up(j, c);
	if (r < 0 && j->barrier == BO_PASSED)
		j->barrier = BO_FAILED;
	if (r < 0 || j->barrier != BO_PASSED)
		return r;
	KEY(k1, "r%d/departed", j->round);
	KEY(k2, "r%d/departed_all", j->round);
	if (!j->is_host)
		return c10d_count_in(c, k1, k2, j->nnodes - j->host_member);
	if (j->nnodes - j->host_member > 0) {
		r = coord_wait(c, k2, C10D_DEPART_MS);
		if (r < 0)
			log_at(LL_WARN, SUB_RDZV,
			       "not every agent left within %u s; leaving anyway",
			       C10D_DEPART_MS / 1000);
	}
	return 0;
}

int c10d_job_fail(struct c10d_job *j, struct coord *c)
{
	char key[64], val[600];
	int r;

	if (j->why[0]) {
		KEY(val, "failed: %s", j->why);
		r = coord_compare_set(c, "closed", "", val, NULL);
		if (r == 0) {
			/* Overwrites any earlier reason: members still watching
			 * must learn that this is the end. */
			KEY(key, "r%d/change", j->round);
			r = coord_set(c, key, "failed");
		}
		if (r < 0)
			return c10d_jfail(j, c, r, "closing the rendezvous as failed");
	}
	/* The agent serving the store waits for the others to have read it. */
	if (j->is_host && j->nnodes > 1) {
		KEY(key, "r%d/failed_acked", j->round);
		r = coord_wait(c, key, j->conf.close_ms);
		if (r < 0)
			log_at(LL_WARN, SUB_RDZV, "not every agent saw the failure within %u s",
			       j->conf.close_ms / 1000);
	}
	return 0;
}
