/* monitor.c: the liveness monitor of a completed c10d round. It keeps this
 * agent's lease alive (its expiry, or our connection closing, sets the
 * round's change key on the server and deletes our alive key), blocks on the
 * change key, and posts one change: a restart, a membership change, the job
 * failed, or the rendezvous store lost. A store without leases: heartbeats,
 * watching the ring neighbour's. On stop (the agent moved on) the lease is
 * revoked, so leaving is not a failure.
 *
 * Its connection's operations are bounded by the lease TTL: a store host
 * that died or was cut off is noticed within about one TTL (the same time
 * the store would take to notice us), and said so naming it. A store no
 * member serves (crun-rdzvd) may be restarted under a running job (systemd
 * does so): its outage is ridden out for C10D_OUTAGE_MS, the client
 * redialling, before it counts as lost. Meanwhile the agent's loop fences
 * this node's workers once the lease went unrenewed for a TTL while the
 * store may be up for the others (c10d_fence.c): each renewal is published
 * in j->kept_ok_ms for it.
 *
 * A restarted crun-rdzvd starts empty (it keeps nothing on disk): our lease
 * is not found when the client re-attaches it. Each member then takes a new
 * lease (expiry key: the round's change key, as before), puts r<n>/back/<g>
 * under it, and puts back what a next round reads (conf, round, r<n>/closed
 * with the round's attempt; first writer wins). A member whose back key does
 * not appear within one TTL (plus a heartbeat and the client's redial pause)
 * of this member's return died during the outage: the round ends as for any
 * dead node and the survivors re-rendezvous. The put-back r<n>/closed has no
 * members (only the attempt is known to all), so a node that joins later
 * sees an abandoned round and opens the next one without a word on
 * r<n>/change: after a restart the monitor also watches the round counter
 * (one ADD a heartbeat) and ends the round for it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "rendezvous/round_int.h"

static void post(struct c10d_job *j, enum rdzv_change ch)
{
	j->change = ch;
	helper_post(&j->h);
}

static void store_lost(struct c10d_job *j, struct coord *c, int r)
{
	snprintf(j->err, sizeof(j->err),
		 "lost the rendezvous store at %.64s:%u%s%.64s%s (%.200s); a c10d job cannot go "
		 "on without the node serving its store (crun-rdzvd or etcd outlive any node)",
		 j->host, j->port, j->store_host[0] ? ", served by the agent on host '" : "",
		 j->store_host, j->store_host[0] ? "'" : "",
		 c && *coord_last_error(c) ? coord_last_error(c) : crun_strerror(r));
	post(j, RDZV_CHANGE_LOST);
}

/* The round is over: what its change key says, and the "failed" handshake.
 * 1 (nothing posted) when the job itself is over. What the watch's wake
 * brought along (taken): v, the change (closed was absent then: the wake
 * answers closed first), or done, the job's closed value; neither: read
 * both (the watch saw the change, and a change key is never deleted). */
static int read_change(struct c10d_job *j, struct coord *c, const char *chk, char *v, char *done)
{
	char k1[64], k2[64];
	bool failed = false, woke = v || done, have_why = false;
	int r = woke ? 0 : coord_get_now(c, chk, &v);

	if (r < 0) {
		store_lost(j, c, r);
		return r;
	}
	if (v) {
		snprintf(j->err, sizeof(j->err), "%s", v);
		failed = strncmp(v, "failed", 6) == 0;
	}
	if (!woke)
		(void)coord_try_get(c, "closed", &done); /* stays NULL when absent */
	if (done) {
		bool ended = strncmp(done, "done", 4) == 0;

		failed = !ended;
		/* The reason is what we hold: the node that wrote it may leave
		 * (taking the store along) before another read (issue 23:
		 * the peer printed "failed on another node:" with nothing). */
		have_why = failed;
		if (failed)
			snprintf(j->err, sizeof(j->err), "%s", done);
		crun_free(done);
		if (ended) {
			/* Every node passed the exit barrier: nodes leaving now
			 * are not a membership change. */
			crun_free(v);
			return 1;
		}
	}
	if (failed && !have_why) {
		char *why = NULL;

		/* Only the change ("failed") so far. The job is over either
		 * way: give the reason a few seconds on a starved machine
		 * rather than print the failure without its root cause. */
		r = coord_get(c, "closed", MAX(j->conf.ttl_ms, C10D_REASON_MS), &why);
		if (r == 0) {
			snprintf(j->err, sizeof(j->err), "%s", why);
			crun_free(why);
		} else {
			snprintf(j->err, sizeof(j->err),
				 "failed (the reason could not be read from the rendezvous store: "
				 "%.300s)",
				 *coord_last_error(c) ? coord_last_error(c) : crun_strerror(r));
		}
	}
	if (failed) {
		KEY(k1, "r%d/failed_ack", j->round);
		KEY(k2, "r%d/failed_acked", j->round);
		/* Everyone but the failing agent acknowledges. */
		(void)c10d_count_in(c, k1, k2, j->nnodes - 1);
		post(j, RDZV_CHANGE_FAILED);
	} else {
		post(j,
		     strncmp(v, "restart", 7) == 0 ? RDZV_CHANGE_RESTART : RDZV_CHANGE_MEMBERSHIP);
	}
	crun_free(v);
	return 0;
}

bool c10d_outage_over(struct c10d_job *j, uint64_t *since, int r)
{
	uint64_t now = clock_now_ms();

	if (!*since) {
		*since = now;
		log_at(LL_WARN, SUB_RDZV,
		       "the rendezvous store at %s:%u does not answer (%s); retrying for %u s "
		       "(a restarting crun-rdzvd costs no worker restart)",
		       j->host, j->port, crun_strerror(r), C10D_OUTAGE_MS / 1000);
	}
	if (now - *since >= C10D_OUTAGE_MS)
		return true;
	usleep(MIN(j->conf.hb_ms, 500u) * 1000u);
	return false;
}

/* Our lease is gone from a store that forgot it (restarted): a new lease
 * and back key, and the round's state a next round needs. *lease changes
 * only on success (a failure retries on the next keep-alive); *ret_by: until
 * when the others may come back. */
static int reestablish(struct c10d_job *j, struct coord *c, const char *chk, uint64_t *lease,
		       uint64_t *ret_by)
{
	char key[64], val[64], why[512], *closed = NULL;
	uint64_t nl = 0;
	uint32_t wait_ms = j->conf.ttl_ms + j->conf.hb_ms + C10D_REDIAL_MS;
	int r;

	KEY(why, "dead %s (group rank %d: lease lost after the rendezvous store restarted)",
	    j->hostname, j->info.group_rank);
	TRY(coord_lease_grant(c, j->conf.ttl_ms, chk, why, &nl));
	KEY(key, "r%d/back/%d", j->round, j->info.group_rank);
	r = coord_put_leased(c, nl, key, j->hostname);
	if (r == 0 && str_printf(val, sizeof(val), "%d:%d", j->min, j->max) >= 0)
		r = coord_compare_set(c, "conf", "", val, NULL);
	if (r == 0 && str_printf(val, sizeof(val), "%d", j->round) >= 0)
		r = coord_compare_set(c, "round", "", val, NULL);
	/* Only the attempt of r<n>/closed (its head) is read again, by the
	 * next round; the members know their places already. */
	if (r == 0) {
		struct round_head h = {.attempt = j->info.attempt}; /* nodes 0: no list */

		r = round_head_format(&h, &closed);
	}
	if (r == 0 && str_printf(key, sizeof(key), "r%d/closed", j->round) >= 0)
		r = coord_compare_set(c, key, "", closed, NULL);
	crun_free(closed);
	if (r < 0) {
		(void)coord_lease_revoke(c, nl);
		return r;
	}
	*lease = nl;
	*ret_by = clock_now_ms() + wait_ms;
	atomic_store(&j->kept_ok_ms, clock_now_ms());
	log_at(LL_WARN, SUB_RDZV,
	       "the rendezvous store at %s:%u lost round %d's state (restarted); lease taken "
	       "again, waiting up to %u ms for the round's %d nodes to come back",
	       j->host, j->port, j->round, wait_ms, j->nnodes);
	return 0;
}

/* After a restart: a node that joined since moved the round counter past
 * ours (see the top); end our round so that everyone joins its round. */
static int check_joiner(struct c10d_job *j, struct coord *c, const char *chk)
{
	int64_t cur;

	TRY(coord_add(c, "round", 0, &cur));
	if (cur <= j->round)
		return 0;
	log_at(LL_WARN, SUB_RDZV,
	       "rendezvous '%s': round %" PRId64 " was opened after the store restart (a node "
	       "joined); ending round %d",
	       j->prefix, cur, j->round);
	return coord_expire(c, chk, "join (a node joined after the rendezvous store restarted)");
}

/* After reestablish(): whether the members' back keys are all there.
 * *next: the first group rank not seen yet (each is looked up until seen,
 * once). Past *by, the first missing one ends the round; *by is 0 once
 * nothing is left to check. */
static int check_back(struct c10d_job *j, struct coord *c, const char *chk, uint64_t *by, int *next)
{
	char key[64], why[320];
	int r;

	for (; *next < j->nnodes; (*next)++) {
		KEY(key, "r%d/back/%d", j->round, *next);
		r = coord_exists(c, key);
		if (r < 0)
			return r;
		if (r == 0)
			break;
	}
	if (*next >= j->nnodes) {
		log_at(LL_NOTICE, SUB_RDZV,
		       "rendezvous '%s' round %d: all %d nodes are back after the store restart",
		       j->prefix, j->round, j->nnodes);
		*by = 0;
		return 0;
	}
	if (clock_now_ms() < *by)
		return 0;
	KEY(why,
	    "dead node of group rank %d (did not re-establish its lease within %" PRIu64
	    " ms after the rendezvous store restarted)",
	    *next, j->conf.ttl_ms + j->conf.hb_ms + (uint64_t)C10D_REDIAL_MS);
	log_at(LL_WARN, SUB_RDZV, "rendezvous '%s' round %d: %s", j->prefix, j->round, why);
	*by = 0;
	return coord_expire(c, chk, why);
}

/* The watch woke with a change or the job's end (why_v, done_v: owned,
 * given to read_change): reads it into j, gives the lease back at the job's
 * end, and holds the lease until the agent moves on. */
static int monitor_tail(struct c10d_job *j, struct coord *c, const char *chk, char *why_v,
			char *done_v, uint64_t lease, uint64_t kept_at)
{
	bool moved_on, ended;
	int r;

	r = read_change(j, c, chk, why_v, done_v);
	if (r < 0)
		return r;
	/* The round changed (the key its lease would set on expiry is set):
	 * its end writes nothing, so moving on needs no revoke - one request
	 * fewer per member between the change and the next round. */
	moved_on =
	    r == 0 && (j->change == RDZV_CHANGE_RESTART || j->change == RDZV_CHANGE_MEMBERSHIP);
	/* The job ended (every node passed the exit barrier): give the lease
	 * back now, an orderly end the store counts as released, not as an
	 * expiry (a node lost, what an alert is for), which the connection's
	 * close at this process's exit would otherwise be. The connection
	 * itself stays open until the agent exits: the host waits for it. */
	ended = r == 1;
	if (ended && lease && coord_lease_revoke(c, lease) == 0)
		lease = 0;
	if (ended) { /* the agent waits for this before it exits (c10d.c) */
		atomic_store(&j->released, true);
		helper_nudge(&j->h);
	}
	/* Stay connected (lease held) until the agent moves on: closing now
	 * would look like a failure of this node to the others. The next
	 * keep-alive is due a heartbeat after the last one: the agent
	 * usually moves on before (no request on the way to the next round). */
	for (int i = 0; i < 1 << 30 && !helper_stopping(&j->h); i++) {
		uint64_t now = clock_now_ms(), due = kept_at + j->conf.hb_ms;

		if (now < due) {
			usleep((useconds_t)MIN((due - now) * 1000u, 999999u));
			continue;
		}
		kept_at = now;
		if (!lease && ended) /* nothing left to fence: the workers are done */
			atomic_store(&j->kept_ok_ms, now);
		if (!lease)
			continue;
		if (coord_lease_keepalive(c, lease) < 0)
			break;
		atomic_store(&j->kept_ok_ms, now);
	}
	if (lease && helper_stopping(&j->h) && !moved_on)
		(void)coord_lease_revoke(c, lease);
	return 0;
}

/* Heartbeat stores (no leases): the next group rank's counter has not
 * moved for a TTL - say it is dead on the round's change key. */
static void peek_neighbour(struct c10d_job *j, struct coord *c, const char *nbr, const char *chk,
			   int64_t *last, uint64_t *last_move)
{
	char why[512];
	int64_t cnt;

	if (coord_heartbeat_peek(c, nbr, &cnt) < 0)
		return;
	if (cnt != *last) {
		*last = cnt;
		*last_move = clock_now_ms();
	} else if (clock_now_ms() - *last_move > j->conf.ttl_ms &&
		   str_printf(why, sizeof(why),
			      "dead node of group rank %d (no heartbeat for %u ms)",
			      (j->info.group_rank + 1) % j->nnodes, j->conf.ttl_ms) >= 0) {
		(void)coord_expire(c, chk, why);
	}
}

int c10d_job_monitor(struct c10d_job *j, struct coord **cp)
{
	char me[64], nbr[64], chk[64], ask[64] = "", *why_v = NULL, *done_v = NULL;
	int64_t last = -1;
	uint64_t last_move = clock_now_ms(), lease = j->lease, outage = 0, back_by = 0, kept_at = 0;
	bool hb = j->hb || !lease;
	/* Only a store no member serves can restart under us; etcd keeps its
	 * state, so a lease not found there has expired (and said so). */
	bool restartable = !hb && !j->host_member && !j->is_host && !j->etcd;
	int r = 0, back_next = 0;
	bool restored = false;
	/* The round kept the lease less than a heartbeat ago: the first
	 * keep-alive is due a heartbeat after that, not now - one request
	 * fewer per member when a whole round starts its monitors at once. A
	 * store that restarted meanwhile is noticed at that keep-alive, as at
	 * any other. */
	bool fresh = !hb && j->lease_kept_ms && clock_now_ms() - j->lease_kept_ms < j->conf.hb_ms;

	/* The job board: the next ask is a third key of the same wait. A
	 * heartbeat store (no WAIT_ANY) answers no ask: the asker times out. */
	bool board = j->board && !hb;

	KEY(me, "r%d/lease/%d", j->round, j->info.group_rank);
	KEY(nbr, "r%d/lease/%d", j->round, (j->info.group_rank + 1) % j->nnodes);
	KEY(chk, "r%d/change", j->round);
	for (int i = 0; r == 0 && i < 1 << 30 && !helper_stopping(&j->h); i++) {
		uint64_t left;

		kept_at = fresh ? j->lease_kept_ms : clock_now_ms();
		r = fresh ? 0 : hb ? coord_heartbeat(*cp, me) : coord_lease_keepalive(*cp, lease);
		fresh = false;
		if (r == 0)
			atomic_store(&j->kept_ok_ms, kept_at); /* the loop's fence reads it */
		if (r == CRUN_ENOTFOUND && restartable && !back_by) {
			r = reestablish(j, *cp, chk, &lease, &back_by);
			back_next = 0;
			atomic_store(&j->ask_seen, -1); /* the restarted store's asks start at 1 */
			restored = restored || r == 0;
		} else if (r == CRUN_ENOTFOUND) {
			r = 0; /* our lease lapsed: its expiry set the change key */
		}
		if (r == 0 && back_by)
			r = check_back(j, *cp, chk, &back_by, &back_next);
		if (r == 0 && restored)
			r = check_joiner(j, *cp, chk);
		if (r == 0) {
			/* With a lease the store has WAIT_ANY: one request that
			 * also reads the change, or the job's end (closed,
			 * first: a change after it is no membership change),
			 * until the next keep-alive is due. */
			left = kept_at + j->conf.hb_ms -
			       MIN(clock_now_ms(), kept_at + j->conf.hb_ms - 1);
			r = board ? c10d_board_next(j, *cp, ask, sizeof(ask)) : 0;
			if (r == 0)
				r = hb ? coord_watch(*cp, chk, j->conf.hb_ms)
				       : coord_wait_any_get(
					     *cp, (const char *const[]){"closed", chk, ask},
					     board ? 3 : 2, (uint32_t)left, 0, &why_v);
			if (r == 2) { /* an ask: answered, then back to the watch */
				crun_free(why_v);
				why_v = NULL;
				r = c10d_board_answer(j, *cp);
				if (r == 0)
					continue;
			}
			if (r >= 0) {
				done_v = r == 0 && !hb ? why_v : NULL;
				why_v = done_v ? NULL : why_v;
				r = 0;
				break;
			}
			if (r == CRUN_ETIMEDOUT)
				r = 0; /* the watch's own timeout is the normal case */
		}
		if (r < 0 && !j->host_member && !c10d_outage_over(j, &outage, r)) {
			r = 0;
			continue;
		}
		if (r < 0)
			break; /* a timeout here: the store did not answer within a TTL */
		outage = 0;
		if (hb && j->nnodes >= 2)
			peek_neighbour(j, *cp, nbr, chk, &last, &last_move);
	}
	if (helper_stopping(&j->h)) {
		crun_free(why_v);
		crun_free(done_v);
		if (lease && *cp)
			(void)coord_lease_revoke(*cp, lease);
		return 0;
	}
	if (r < 0) {
		crun_free(why_v);
		crun_free(done_v);
		store_lost(j, *cp, r);
		return r;
	}
	return monitor_tail(j, *cp, chk, why_v, done_v, lease, kept_at);
}
