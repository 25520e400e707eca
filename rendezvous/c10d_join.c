/* c10d_join.c: the blocking bodies of the c10d jobs (c10d_int.h): joining
 * rounds until one counts this agent in, the exit barrier and closing the
 * job as failed. A round is leaderless: every member sleeps on the round's
 * events (closed, change, and the count reaching MIN or MAX: wait_closed),
 * any of them closes it (COMPARE_SET r<n>/closed) once its own last-call
 * timer fired or MAX tickets were drawn, dropping tickets whose alive key is
 * gone, and every member computes the assignment from the closed value
 * (round.c). A death while the round is open abandons it (closed with no
 * members) and everyone joins the next one. Closing is c10d_close.c's, the
 * job's end (exit barrier, failure) c10d_exit.c's.
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
#include "store/auth.h"

static void job_release(struct helper_job *h)
{
	struct c10d_job *j = (struct c10d_job *)h;

	coord_close(j->mon_c);
	rdzv_prog_unref(j->prog);
	for (int g = 0; j->answers && g < j->nnodes; g++)
		free(j->answers[g]);
	free(j->answers);
	free(j->answer);
	pthread_cond_destroy(&j->cv);
	pthread_mutex_destroy(&j->mu);
	free(j->peers);
	free(j->etcd);
	free(j);
}

struct c10d_job *c10d_job_new(enum c10d_job_kind kind)
{
	struct c10d_job *j = calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->kind = kind;
	j->h.notify_fd = -1;
	atomic_init(&j->ask_seen, -1);
	atomic_init(&j->ask_pending, 0);
	atomic_init(&j->released, false);
	pthread_mutex_init(&j->mu, NULL);
	pthread_cond_init(&j->cv, NULL);
	j->h.release = job_release;
	return j;
}

int c10d_jfail(struct c10d_job *j, struct coord *c, int r, const char *what)
{
	const char *detail = c ? coord_last_error(c) : "";

	/* A timed-out wait leaves no detail: no dangling separator then. */
	snprintf(j->err, sizeof(j->err), "%s: %s%s%s", what, crun_strerror(r), *detail ? " - " : "",
		 detail);
	return r;
}

void c10d_auth_opts(struct coord_opts *o, const struct c10d_conf *conf, const char *prefix)
{
	o->auth_secret_file = conf->auth_file[0] ? conf->auth_file : NULL;
	o->auth_job = prefix + sizeof(STORE_AUTH_JOB_ROOT) - 2;
	o->tls_ca = conf->tls_ca[0] ? conf->tls_ca : NULL;
	o->tls_cert = conf->tls_cert[0] ? conf->tls_cert : NULL;
	o->tls_key = conf->tls_key[0] ? conf->tls_key : NULL;
	o->tls_min_version = conf->tls_min;
}

int c10d_job_open(const struct c10d_job *j, uint32_t timeout_ms, struct coord **ret)
{
	struct coord_opts o = {0};

	o.host = j->host;
	o.port = j->port;
	o.prefix = j->prefix;
	o.connect_timeout_ms = timeout_ms;
	o.timeout_ms = timeout_ms;
	c10d_auth_opts(&o, &j->conf, j->prefix);
	o.etcd = j->etcd;
	return coord_open(&o, ret);
}

int c10d_count_in(struct coord *c, const char *rkey, const char *done_key, int64_t target)
{
	int64_t n;

	TRY(coord_add(c, rkey, 1, &n));
	if (n == target)
		TRY(coord_set(c, done_key, "1"));
	return 0;
}

/* The same MIN:MAX for every agent (written once, by the first). */
static int check_conf(struct c10d_job *j, struct coord *c)
{
	char want[64], *cur = NULL;
	int r;

	KEY(want, "%d:%d", j->min, j->max);
	r = coord_compare_set(c, "conf", "", want, &cur);
	if (r < 0)
		return c10d_jfail(j, c, r, "reading the job configuration");
	r = strcmp(cur, want) == 0 ? 0 : CRUN_ECONFIG;
	if (r < 0)
		snprintf(
		    j->err, sizeof(j->err),
		    "conflicting settings: this agent has --nnodes=%s but run '%s' was started "
		    "with --nnodes=%s",
		    want, j->prefix, cur);
	crun_free(cur);
	return r;
}

/* Checks before joining: the settings and no joining a run id that already
 * ended - once: an agent coming back for the next round checked both when
 * it first joined, and a job that ends while it joins wakes its wait
 * (wait_closed). */
static int check_job(struct c10d_job *j, struct coord *c)
{
	char *closed = NULL;
	int r;

	if (j->prev_round >= 0)
		return 0;
	TRY(check_conf(j, c));
	r = coord_try_get(c, "closed", &closed);
	if (r == 0) {
		snprintf(j->err, sizeof(j->err),
			 "run id already used: the rendezvous '%s' was closed (%s); use a new "
			 "--rdzv_id",
			 j->prefix, closed);
		crun_free(closed);
		return CRUN_ECONFIG;
	}
	return r == CRUN_ENOTFOUND ? 0 : c10d_jfail(j, c, r, "reading the job state");
}

/* The attempt round rd carries: round rd-1 is closed (or abandoned) before
 * anyone can join rd, so its value and why it ended decide. */
int c10d_attempt_of(struct c10d_job *j, struct coord *c, int64_t rd, int *ret)
{
	struct round_head prev;
	char key[64], *v = NULL, *chg = NULL;
	int r;

	if (rd == 0) {
		*ret = 0;
		return 0;
	}
	KEY(key, "r%" PRId64 "/closed", rd - 1);
	r = coord_get(c, key, j->conf.read_ms, &v);
	if (r < 0)
		return c10d_jfail(j, c, r, "reading the previous round");
	r = round_head_parse(v, &prev);
	crun_free(v);
	if (r < 0)
		return c10d_jfail(j, NULL, r, "bad closed value of the previous round");
	KEY(key, "r%" PRId64 "/change", rd - 1);
	r = coord_try_get(c, key, &chg);
	if (r < 0 && r != CRUN_ENOTFOUND)
		return c10d_jfail(j, c, r, "reading why the previous round ended");
	*ret = round_next_attempt(prev.attempt, r == 0 ? chg : NULL);
	crun_free(chg);
	return 0;
}

/* Ends an open round rd with no members (a joiner died before it closed):
 * first writer wins; *ret_cur gets whatever closed it. */
static int abandon(struct c10d_job *j, struct coord *c, int64_t rd, char **ret_cur)
{
	struct round_head h = {0};
	char key[64], *val = NULL;
	int r;

	TRY(c10d_attempt_of(j, c, rd, &h.attempt));
	r = round_head_format(&h, &val);
	if (r < 0)
		return c10d_jfail(j, NULL, r, "abandoning the round");
	KEY(key, "r%" PRId64 "/closed", rd);
	r = coord_compare_set(c, key, "", val, ret_cur);
	crun_free(val);
	return r < 0 ? c10d_jfail(j, c, r, "abandoning the round") : 0;
}

/* Moves the job from round rd (closed) to rd+1, saying why on r<rd>/change
 * unless a reason is there already. *ret_now (may be NULL): the round the
 * job is in now, as the compare-set answered (rd+1, or later if others moved
 * it on meanwhile), or -1 when that answer does not parse: the joiner need
 * not read it again. *ret_restart (may be NULL; set only with a why):
 * whether the reason now there is a restart (the next attempt is one more). */
static int open_next(struct c10d_job *j, struct coord *c, int64_t rd, const char *why,
		     int64_t *ret_now, bool *ret_restart)
{
	char key[64], cur[32], nxt[32], *now = NULL, *end = NULL, *chg = NULL;
	int r = 0;

	if (why) {
		KEY(key, "r%" PRId64 "/change", rd);
		r = coord_compare_set(c, key, "", why, &chg);
	}
	if (r == 0 && chg && ret_restart)
		*ret_restart = round_next_attempt(0, chg) > 0;
	crun_free(chg);
	if (r == 0) {
		KEY(cur, "%" PRId64, rd);
		KEY(nxt, "%" PRId64, rd + 1);
		r = coord_compare_set(c, "round", cur, nxt, &now);
	}
	if (r == 0 && ret_now) {
		long long v = strtoll(now, &end, 10);

		*ret_now = end != now && *end == '\0' && v > rd ? (int64_t)v : -1;
	}
	crun_free(now);
	return r < 0 ? c10d_jfail(j, c, r, "opening the next round") : 0;
}

/* Keeps this agent's lease alive while it waits in an open round (the
 * monitor does it once the round completes): the keep-alive's result, 0
 * when none was due. CRUN_ENOTFOUND: the lease is gone (store_forgot). */
int c10d_keep_lease(struct c10d_job *j, uint64_t now, uint64_t *last)
{
	struct coord *lc = j->lease_c ? j->lease_c : j->mon_c;

	if (!j->lease || !lc || now - *last < j->conf.hb_ms)
		return 0;
	*last = j->lease_kept_ms = now;
	return coord_lease_keepalive(lc, j->lease);
}

_Static_assert(sizeof(((struct c10d_job *)0)->record) >= ROUND_RECORD_MAX, "record size");

/* wait_closed's answer when the store forgot the round it waited in. */
#define WAIT_FORGOT 1

/* This agent's lease in open round rd was not found. Either it lapsed (the
 * process stalled past the TTL): its expiry set the round's change key,
 * which the wait sees, and the round is abandoned and joined again as for
 * any dead joiner - 0. Or the store forgot it with everything else (a
 * crun-rdzvd restarted: it keeps nothing on disk): then ticket t's record
 * is gone too, or another joiner's is under its number in the new store,
 * and nobody will ever count this agent in - WAIT_FORGOT. */
static int store_forgot(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t)
{
	char key[64], *v = NULL;
	int r;

	j->lease = 0; /* gone either way: no more keep-alives of it */
	KEY(key, "r%" PRId64 "/node/%" PRId64, rd, t);
	r = coord_try_get(c, key, &v);
	if (r < 0 && r != CRUN_ENOTFOUND)
		return c10d_jfail(j, c, r, "reading this node's record");
	r = r == 0 && strcmp(v, j->record) == 0 ? 0 : WAIT_FORGOT;
	crun_free(v);
	return r;
}

/* Waits for round rd+1 to open (a spare): asleep until its first ticket
 * or the job's end. RO_SPARE_DONE when the job ended instead. */
static int wait_next_round(struct c10d_job *j, struct coord *c, int64_t rd, uint64_t deadline)
{
	char key[64];
	const char *keys[2] = {key, "closed"};
	uint64_t every = C10D_PROGRESS_MS * 2, next_log = clock_now_ms() + every;

	KEY(key, "r%" PRId64 "/joined", rd + 1);
	for (int i = 0; i < 1 << 30; i++) {
		uint64_t now = clock_now_ms();
		int r;

		if (now >= deadline) {
			snprintf(j->err, sizeof(j->err),
				 "timed out waiting for the next round of rendezvous '%s'",
				 j->prefix);
			return CRUN_ETIMEDOUT;
		}
		r = coord_wait_any(c, keys, 2, (uint32_t)(MIN(deadline, next_log) - now));
		if (r == 0)
			return 0;
		if (r == 1) {
			j->outcome = RO_SPARE_DONE;
			return 0;
		}
		if (r != CRUN_ETIMEDOUT)
			return c10d_jfail(j, c, r, "waiting for the next round");
		if (clock_now_ms() >= next_log) {
			every = MIN(every * 2, C10D_PROGRESS_MAX_MS);
			next_log = clock_now_ms() + every;
			log_at(LL_NOTICE, SUB_RDZV,
			       "rendezvous '%s': round %" PRId64 " is full (%d/%d nodes); waiting "
			       "as a spare",
			       j->prefix, rd, j->nnodes, j->max);
		}
	}
	return CRUN_ETIMEDOUT;
}

/* Takes this agent's lease for round rd as soon as it holds a ticket, on the
 * connection the monitor will keep: from then on its death (connection
 * closed, or silence for a TTL) deletes its alive key and sets r<rd>/change,
 * even before the round completes. A store without leases: heartbeats
 * (monitor) and a plain alive key instead. */
enum { LEASE_TRIES = 3 }; /* leases lapsed before use, in a row, before failing */

static int lease_for(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t)
{
	char chk[64], why[512], alive[64];
	struct coord *lc;
	int r = 0;

	KEY(alive, "r%" PRId64 "/alive/%" PRId64, rd, t);
	if (!j->take_lease || j->hb) {
		r = coord_set(c, alive, j->hostname);
		return r < 0 ? c10d_jfail(j, c, r, "writing the alive key") : 0;
	}
	KEY(chk, "r%" PRId64 "/change", rd);
	KEY(why, "dead %s (ticket %" PRId64 ": lease expired or connection lost)", j->hostname, t);
	if (j->lease)
		(void)coord_lease_revoke(j->lease_c ? j->lease_c : j->mon_c, j->lease);
	j->lease = 0;
	if (!j->mon_c && !j->lease_c)
		r = c10d_job_open(j, j->conf.ttl_ms, &j->mon_c);
	if (r < 0)
		return c10d_jfail(j, NULL, r, "connecting the lease monitor");
	lc = j->lease_c ? j->lease_c : j->mon_c;
	j->lease_kept_ms = clock_now_ms(); /* (before: a bound on its life) */
	r = coord_lease_grant_put(lc, j->conf.ttl_ms, chk, why, alive, j->hostname, &j->lease);
	if (r == CRUN_ENOTSUP) {
		log_at(LL_WARN, SUB_RDZV,
		       "the rendezvous store has no leases; falling back to heartbeats");
		coord_close(j->mon_c);
		j->mon_c = NULL;
		j->hb = true;
		if (!j->lease_c)
			r = c10d_job_open(j, j->conf.ttl_ms, &j->mon_c);
		if (r == 0)
			r = coord_set(c, alive, j->hostname);
		return r < 0 ? c10d_jfail(j, c, r, "writing the alive key") : 0;
	}
	/* The lease may lapse before its first use (this agent stalled past
	 * the TTL after the grant, on a store that grants and puts in two
	 * requests): its expiry already ended the round, which the wait will
	 * see; take a new one, a few times at most. */
	for (int i = 1; r == CRUN_ENOTFOUND && i < LEASE_TRIES; i++) {
		log_at(LL_WARN, SUB_RDZV,
		       "rendezvous '%s': the lease lapsed before its first use; taking another",
		       j->prefix);
		j->lease = 0;
		r = coord_lease_grant_put(lc, j->conf.ttl_ms, chk, why, alive, j->hostname,
					  &j->lease);
	}
	if (r == CRUN_ENOTFOUND) {
		j->lease = 0;
		snprintf(j->err, sizeof(j->err),
			 "taking the lease: it lapsed before its first use %d times in a row "
			 "(lease_ttl=%u ms is too short for this store's latency)",
			 LEASE_TRIES, j->conf.ttl_ms);
		return r;
	}
	return r < 0 ? c10d_jfail(j, lc, r, "taking the lease") : 0;
}

/* A ticket the closed round does not list: a spare waits for the next
 * round; a late joiner asks the running round to make room and joins the
 * next one at once. RO_SPARE_DONE when the job ended meanwhile. */
static int not_counted_in(struct c10d_job *j, struct coord *c, int64_t rd, int n,
			  uint64_t *deadline)
{
	bool spare = n >= j->max;
	char why[320];

	log_at(LL_NOTICE, SUB_RDZV, "rendezvous '%s': round %" PRId64 " closed with %d nodes; %s",
	       j->prefix, rd, n,
	       spare ? "waiting as a spare" : "a new round will include this node");
	if (!spare) {
		bool restart = false;

		KEY(why, "join %s", j->hostname);
		TRY(open_next(j, c, rd, why, NULL, &restart));
		j->next_attempt += restart ? 1 : 0;
		return 0;
	}
	j->next_attempt = -1; /* a spare: the running round may end by a restart */
	if (j->lease) {
		/* A spare's death must not disturb the running job. */
		(void)coord_lease_revoke(j->lease_c ? j->lease_c : j->mon_c, j->lease);
		j->lease = 0;
	}
	TRY(wait_next_round(j, c, rd, clock_now_ms() + C10D_SPARE_MAX_MS));
	*deadline = clock_now_ms() + j->conf.join_ms;
	return 0;
}

/* Group rank 0: the addresses of every member, from the member list. */
static int read_peers(struct c10d_job *j, struct coord *c, const struct round_head *h, int64_t rd)
{
	struct round_closed rc;
	char key[96], *v = NULL;
	int r;

	KEY(key, "r%" PRId64 "/members/%d", rd, h->by);
	r = coord_get(c, key, j->conf.read_ms, &v);
	if (r == 0)
		r = round_closed_parse(v, h->nodes, &rc);
	crun_free(v);
	if (r < 0)
		return r;
	r = c10d_read_peer_addrs(c, (int)rd, &rc, j->conf.read_ms, &j->peers);
	round_closed_free(&rc);
	return r;
}

/* What the wait brought along with the closed head: ticket t's
 * assignment (read at the wake, after the head was set), or nothing read. */
struct pre_read {
	bool read;
	char *val; /* malloc'd; NULL: absent */
};

/* Ticket t's place in the closed round rd (head h): its own assignment key,
 * read with the wake (pre) or now - a small read whatever the round's size.
 * 1 when t is not a member. */
static int take_assignment(struct c10d_job *j, struct coord *c, const struct round_head *h,
			   int64_t rd, int64_t t, struct pre_read *pre)
{
	struct round_assignment a;
	char key[96], *v = pre->val;
	int r = pre->read ? (v ? 0 : CRUN_ENOTFOUND) : 0;

	pre->val = NULL;
	KEY(key, "r%" PRId64 "/a/%" PRId64, rd, t);
	if (!pre->read)
		r = coord_try_get(c, key, &v);
	if (r == CRUN_ENOTFOUND)
		return 1; /* written before the head: absent = not a member */
	if (r < 0)
		return c10d_jfail(j, c, r, "reading the rank assignment");
	r = round_member_assign(h, v, &a);
	crun_free(v);
	if (r < 0)
		return c10d_jfail(j, NULL, r, "bad rank assignment");
	/* Group rank 0 serves the round's worker store: learn who may reach
	 * it (the one member that reads the whole member list). */
	if (a.info.group_rank == 0 && read_peers(j, c, h, rd) < 0)
		log_at(LL_WARN, SUB_RDZV,
		       "cannot read the round's node addresses: the worker store allows "
		       "loopback only");
	j->info = a.info;
	snprintf(j->store_host, sizeof(j->store_host), "%s", a.store_host);
	j->host_member = a.host_member;
	j->nnodes = h->nodes;
	j->round = (int)rd;
	return 0;
}

/* What a member of an open round sleeps on, in the order they win: the
 * round closed, it ended before closing (a joiner died: its lease set the
 * change key), the whole job ended (its "closed" key, no round prefix), the
 * ticket count reached MAX, then MIN (the last call starts). The two counts
 * are marker keys the joiners at or past them set. */
enum round_event { EV_CLOSED, EV_CHANGE, EV_ENDED, EV_MAX, EV_MIN, EV_N };

static const char *const event_key[EV_N] = {"closed", "change", "closed", "clock_max", "clock_min"};

/* Tells the others the count reached MIN (and MAX): every joiner at or past
 * it says so, as the one whose ticket reached it may die before it could. */
static int mark_counts(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t)
{
	char key[64], val[32];
	int r = 0;

	KEY(val, "%" PRId64, t);
	if (t >= j->min) {
		KEY(key, "r%" PRId64 "/%s", rd, event_key[EV_MIN]);
		r = coord_set(c, key, val);
	}
	if (r == 0 && t >= j->max) {
		KEY(key, "r%" PRId64 "/%s", rd, event_key[EV_MAX]);
		r = coord_set(c, key, val);
	}
	return r < 0 ? c10d_jfail(j, c, r, "marking the node count") : 0;
}

/* The round timed out: say how many joined (one read, at the end). */
static int join_timed_out(struct c10d_job *j, struct coord *c, int64_t rd)
{
	char key[64];
	int64_t joined = -1;

	KEY(key, "r%" PRId64 "/joined", rd);
	(void)coord_add(c, key, 0, &joined);
	snprintf(j->err, sizeof(j->err),
		 "timed out after %u s waiting for %d nodes to join rendezvous '%s' round %" PRId64
		 " (%" PRId64 " joined)",
		 j->conf.join_ms / 1000, j->min, j->prefix, rd, joined);
	return CRUN_ETIMEDOUT;
}

/* The round's change key (a ticket holder died - its lease set it - before
 * the round closed: nobody can tell whether it would have been counted, so
 * start over) or the job's closed key (ended) woke the wait; ev: its value,
 * freed here. */
static int round_ended(struct c10d_job *j, struct coord *c, int64_t rd, bool ended, char *ev,
		       char **ret_closed)
{
	if (ended) {
		snprintf(j->err, sizeof(j->err),
			 "the rendezvous '%s' was closed while this node joined round %" PRId64
			 " (%s)",
			 j->prefix, rd, ev);
		crun_free(ev);
		return CRUN_ERDZVCLOSED;
	}
	log_at(LL_WARN, SUB_RDZV,
	       "rendezvous '%s' round %" PRId64 " ended before it closed (%.200s); starting over",
	       j->prefix, rd, ev);
	crun_free(ev);
	return abandon(j, c, rd, ret_closed);
}

/* The waiting line, rarer as the wait goes on (a line costs a read). */
static int log_waiting(struct c10d_job *j, struct coord *c, int64_t rd, uint64_t min_seen,
		       uint64_t deadline, uint64_t *every, uint64_t *next_log)
{
	char jk[64];
	int64_t joined = 0;

	*every = MIN(*every * 2, C10D_PROGRESS_MAX_MS);
	*next_log = clock_now_ms() + *every;
	KEY(jk, "r%" PRId64 "/joined", rd);
	if (coord_add(c, jk, 0, &joined) == 0)
		c10d_progress(j, c, rd, joined, min_seen, deadline - clock_now_ms());
	return 0;
}

/* Sleeps in round rd (open) until it is closed: wakes on its events
 * (round_event) and on its own timers only - closing the round when its
 * last-call turn comes, keeping the lease alive, an occasional progress
 * line - so what a member asks of the store per round does not grow with
 * the number of members nor with how long the round takes. Abandons the
 * round when a joiner died. *ret_closed: the value. WAIT_FORGOT when the
 * store forgot the round (store_forgot; seen at a keep-alive, so not with
 * a lease kept by the wait itself - tests and simulators only). */
static int wait_closed(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t,
		       uint64_t deadline, char **ret_closed, struct pre_read *pre)
{
	char kb[EV_N][64], mine[64];
	const char *keys[EV_N + 1];
	uint64_t now = clock_now_ms(), last_keep = now;
	uint64_t min_seen = t >= j->min ? now : 0, max_seen = t >= j->max ? now : 0;
	uint64_t every = C10D_PROGRESS_MS, next_log = now + every, outage = 0;
	struct c10d_close_turn ct = {"", "", 0, 0};
	bool watch_counts = round_watches_counts((int)t);
	bool fold_keep = j->lease && j->lease_c == c;
	uint64_t keep;
	int r;

	for (int e = 0; e < EV_N; e++) {
		if (e == EV_ENDED)
			KEY(kb[e], "%s", event_key[e]);
		else
			KEY(kb[e], "r%" PRId64 "/%s", rd, event_key[e]);
	}
	KEY(mine, "r%" PRId64 "/a/%" PRId64, rd, t);
	for (int i = 0; i < 1 << 30; i++) {
		/* Only the events not seen yet (a present key answers at once),
		 * and the counts only for a member that may have to close. */
		size_t n = max_seen || !watch_counts ? EV_MAX : min_seen ? EV_MIN : EV_N, nk = n;
		char *ev = NULL;
		uint64_t at =
		    round_close_at((int)t, j->max, min_seen, max_seen, j->conf.last_call_ms);
		uint64_t wake = MIN(deadline, next_log);

		now = clock_now_ms();
		if (now >= deadline)
			return join_timed_out(j, c, rd);
		/* A lease on this handle is kept by the wait's own request. */
		keep = fold_keep && now - last_keep >= j->conf.hb_ms ? j->lease : 0;
		if (keep) {
			last_keep = j->lease_kept_ms = now;
		} else if (!fold_keep) {
			r = c10d_keep_lease(j, now, &last_keep);
			r = r == CRUN_ENOTFOUND ? store_forgot(j, c, rd, t) : 0;
			if (r != 0)
				return r;
		}
		if (at && now >= at && now >= ct.next_try) {
			TRY(c10d_close_turn(j, c, rd, t, &ct, &last_keep, ret_closed));
			if (*ret_closed)
				return 0;
		}
		if (at)
			wake = MIN(wake, MAX(at, ct.next_try));
		if (j->lease)
			wake = MIN(wake, last_keep + j->conf.hb_ms);
		for (size_t e = 0; e < n; e++)
			keys[e] = kb[e];
		if (ct.lag[0]) /* after the events: they win over it */
			keys[nk++] = ct.lag;
		/* The wake carries the key's value and this ticket's
		 * assignment: the closed head and the place need no reads. */
		r = coord_wait_any_get_with(c, keys, nk, mine,
					    (uint32_t)(wake > now ? wake - now : 1), keep, &ev,
					    &pre->val);
		if (r >= 0 || r == CRUN_ETIMEDOUT)
			outage = 0; /* the store answered */
		if (ct.lag[0] && r == (int)n) {
			/* The lagging ticket took its lease. */
			crun_free(ev);
			ct.lag[0] = '\0';
			ct.next_try = 0; /* look again now */
			ct.held_at = 0;	 /* a next lagging ticket gets its own TTL */
			continue;
		}
		if (r == EV_CLOSED) {
			pre->read = true;
			*ret_closed = ev;
			return 0;
		}
		if (r == EV_CHANGE || r == EV_ENDED)
			return round_ended(j, c, rd, r == EV_ENDED, ev, ret_closed);
		crun_free(ev);
		if (r == EV_MAX || r == EV_MIN) {
			now = clock_now_ms();
			max_seen = r == EV_MAX ? now : max_seen;
			min_seen = min_seen ? min_seen : now;
			continue;
		}
		/* A store this agent does not serve did not answer (crun-rdzvd
		 * restarting, its host out of reach a while): ride it out as the
		 * monitor does, the client redialling at the next call; a store
		 * back empty is noticed at the next keep-alive (store_forgot). */
		if (r != CRUN_ETIMEDOUT && !j->is_host && !c10d_outage_over(j, &outage, r))
			continue;
		if (r != CRUN_ETIMEDOUT)
			return c10d_jfail(j, c, r, "waiting for the round to close");
		if (clock_now_ms() >= next_log)
			TRY(log_waiting(j, c, rd, min_seen, deadline, &every, &next_log));
	}
	return CRUN_ETIMEDOUT;
}

/* Round rd-1's closed value with no members, for c10d_attempt_of(rd): the
 * attempt of round rd as this agent knows it, less what a restart reason on
 * r<rd-1>/change adds (a returning agent may have just written one there). */
static int put_back_head(struct c10d_job *j, struct coord *c, int64_t rd)
{
	struct round_head h = {0}; /* nodes 0: no member list */
	char key[64], *chg = NULL, *head = NULL;
	int r;

	KEY(key, "r%" PRId64 "/change", rd - 1);
	r = coord_try_get(c, key, &chg);
	if (r < 0 && r != CRUN_ENOTFOUND)
		return r;
	h.attempt = MAX(0, j->next_attempt - round_next_attempt(0, r == 0 ? chg : NULL));
	crun_free(chg);
	TRY(round_head_format(&h, &head));
	KEY(key, "r%" PRId64 "/closed", rd - 1);
	r = coord_compare_set(c, key, "", head, NULL);
	crun_free(head);
	return r;
}

/* The store forgot the job's state - the open round rd this agent waited
 * in (store_forgot), or the round counter it moved on from: a restarted
 * crun-rdzvd keeps nothing on disk. Puts back what joining needs, each by
 * COMPARE_SET so that the first joiner back wins: the job's settings, the
 * round counter and, when this agent knows the attempt of round rd (a node
 * of the round before does), round rd-1's closed value (put_back_head; a
 * late joiner leaves it to the others, or to their monitors, which put back
 * the same for a round they completed: monitor.c). *ret_rd: the round the
 * store has now (rd, or the one another joiner or monitor put back), which
 * this agent joins with a new ticket and lease; -1: read it. */
static int put_back(struct c10d_job *j, struct coord *c, int64_t rd, int64_t *ret_rd)
{
	char val[32], *cur = NULL, *end = NULL;
	long long now;
	int r;

	log_at(LL_WARN, SUB_RDZV,
	       "rendezvous '%s': the store forgot round %" PRId64 " (a restarted crun-rdzvd "
	       "keeps nothing); putting it back and joining the round the store has now",
	       j->prefix, rd);
	TRY(check_conf(j, c));
	KEY(val, "%" PRId64, rd);
	r = coord_compare_set(c, "round", "", val, &cur);
	if (r < 0)
		return c10d_jfail(j, c, r, "putting the round back");
	now = strtoll(cur, &end, 10);
	if (end == cur || *end != '\0' || now < 0)
		now = -1;
	crun_free(cur);
	if (now == rd && rd != 0 && j->next_attempt >= 0) {
		r = put_back_head(j, c, rd);
		if (r < 0)
			return c10d_jfail(j, c, r, "putting the previous round back");
	}
	*ret_rd = (int64_t)now;
	return 0;
}

/* An agent of round prev_round comes back (a restart, a fence): whoever
 * comes first moves the job to the next round; the round's change key says
 * why, if nobody said it yet (an agent whose monitor read it knows it is
 * there). *ret_rd: the round to join. */
static int come_back(struct c10d_job *j, struct coord *c, int64_t *ret_rd)
{
	bool restart = j->prev_restart;
	char val[ROUND_RECORD_MAX];

	if (j->fenced)
		KEY(val, "dead %s (fenced: its lease went unrenewed for %u ms)", j->hostname,
		    j->conf.ttl_ms);
	else
		KEY(val, "restart %s", j->hostname);
	TRY(open_next(j, c, j->prev_round, j->change_seen ? NULL : val, ret_rd, &restart));
	j->next_attempt = j->info.attempt + (restart ? 1 : 0);
	/* No round counter to move on: the store restarted meanwhile. */
	if (*ret_rd < 0)
		TRY(put_back(j, c, j->prev_round + 1, ret_rd));
	return 0;
}

/* This agent's record (j->record), written under each ticket it draws. */
static int format_record(struct c10d_job *j)
{
	struct round_node me = {0};

	me.prev_round = j->prev_round;
	me.prev_grank = j->prev_grank;
	me.nproc = j->nproc;
	me.is_host = j->is_host;
	me.wport = j->wport;
	snprintf(me.addr, sizeof(me.addr), "%s", j->addr);
	snprintf(me.host, sizeof(me.host), "%s", j->hostname);
	return round_record_format(&me, j->record, sizeof(j->record));
}

/* Joins rounds until one that counts this agent in completes. */
int c10d_job_round(struct c10d_job *j, struct coord *c)
{
	uint64_t deadline = clock_now_ms() + j->conf.join_ms;
	char key[128];
	int64_t rd = -1, t;
	int r;

	TRY(check_job(j, c));
	j->next_attempt = -1;
	if (j->prev_round >= 0)
		TRY(come_back(j, c, &rd));
	TRY(format_record(j));
	for (int attempt = 0; attempt < 1 << 20; attempt++) {
		struct round_head h;
		struct pre_read pre = {false, NULL};
		char *closed = NULL;

		/* The round open_next moved to, else a read of it. */
		r = rd >= 0 ? 0 : coord_add(c, "round", 0, &rd);
		if (r < 0)
			return c10d_jfail(j, c, r, "reading the round");
		/* The ticket and the record under it in one request (a ticket
		 * without its record, left by a holder that died between the
		 * two on a store without TICKET, is dropped by the closer). */
		char pfx[64];

		KEY(key, "r%" PRId64 "/joined", rd);
		KEY(pfx, "r%" PRId64 "/node/", rd);
		r = coord_ticket(c, key, pfx, j->record, &t);
		if (r < 0)
			return c10d_jfail(j, c, r, "joining");
		TRY(lease_for(j, c, rd, t));
		TRY(mark_counts(j, c, rd, t));
		log_at(LL_NOTICE, SUB_RDZV,
		       "joined rendezvous '%s' round %" PRId64 " as ticket %" PRId64, j->prefix, rd,
		       t);
		r = wait_closed(j, c, rd, t, deadline, &closed, &pre);
		if (r == WAIT_FORGOT) {
			TRY(put_back(j, c, rd, &rd));
			continue; /* a new ticket in the round the store has */
		}
		if (r < 0)
			return r;
		r = round_head_parse(closed, &h);
		crun_free(closed);
		if (r < 0 || h.nodes == 0) {
			crun_free(pre.val); /* an abandoned round has no places */
			pre.val = NULL;
		}
		if (r < 0)
			return c10d_jfail(j, NULL, r, "bad closed round value");
		log_at(LL_DEBUG, SUB_RDZV, "round %" PRId64 " closed with %d, ticket %" PRId64, rd,
		       h.nodes, t);
		if (h.nodes == 0) { /* abandoned: everyone joins the next round */
			log_at(LL_NOTICE, SUB_RDZV,
			       "rendezvous '%s' round %" PRId64 " was abandoned; joining the next",
			       j->prefix, rd);
			rdzv_prog_abandoned(j->prog);
			j->next_attempt = h.attempt; /* an abandoned round's next keeps it */
			r = open_next(j, c, rd, NULL, &rd, NULL);
		} else {
			int prev_n = j->nnodes;

			r = take_assignment(j, c, &h, rd, t, &pre);
			if (r == 0)
				c10d_progress_round(j, c, &h, rd, prev_n);
			if (r <= 0)
				return r;
			j->next_attempt = h.attempt;
			r = not_counted_in(j, c, rd, h.nodes, &deadline);
			rd = -1; /* read it again: others moved the job on */
			if (r == 0 && j->outcome == RO_SPARE_DONE)
				return 0;
		}
		if (r < 0)
			return r;
	}
	return CRUN_ETIMEDOUT;
}
