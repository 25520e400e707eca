/* c10d_int.h: what the parts of the c10d backend share. c10d.c is the loop
 * glue (configuration, the in-process rendezvous store, starting jobs and
 * turning their results into rdzv events); c10d_join.c holds the blocking
 * job bodies (join a round, exit barrier, close as failed), monitor.c the
 * liveness monitor and c10d_fence.c, on the loop, the fence that stops the
 * workers of a node cut off from the store. The jobs run on helper threads
 * (helper_int.h) against coord.h; the round algorithm itself is pure
 * (round_int.h).
 *
 * Keys (under "crun-c10d/<run_id>/"):
 *   conf              "MIN:MAX" of the first agent; others must match
 *   closed            "done <round>" or "failed: <why>": the run id is spent
 *   round             the current round number (decimal counter)
 *   r<n>/joined       ticket counter of round n
 *   r<n>/clock_min    set by every joiner whose ticket is MIN or more: the
 *                     members' last-call clocks start (c10d_join.c)
 *   r<n>/clock_max    the same at MAX: the round closes now
 *   r<n>/node/<t>     ticket t's record (round_int.h)
 *   r<n>/alive/<t>    ephemeral under ticket t's lease: t is alive
 *   r<n>/closing      the ticket of the member closing it now (one at a time)
 *   r<n>/closed       the head: attempt, size, worker store, closer T
 *                     (round_int.h), written once by COMPARE_SET by
 *                     whichever member closes first
 *   r<n>/closer       the ticket of the one member that writes the
 *                     assignments (first COMPARE_SET wins, for good)
 *   r<n>/a/<t>        ticket t's group rank, base rank and world size, by
 *                     that closer (before its head): what a member's wait
 *                     reads with the closed head
 *   r<n>/members/<T>  closer T's member list (group rank 0, status pages)
 *   r<n>/change       why round n is over ("restart ...", "join ...",
 *                     "dead ...", "failed"); every lease's expiry key
 *   r<n>/lease/<g>/hb heartbeat fallback of group rank g (see coord.h)
 *   r<n>/exit, departed, departed_all, failed_ack, failed_acked: barriers
 *   stacks/...        the job board (rdzv.h, board.c)
 */
#ifndef CRUN_RENDEZVOUS_C10D_INT_H
#define CRUN_RENDEZVOUS_C10D_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "rendezvous/c10d.h"
#include "rendezvous/helper_int.h"

#define C10D_PROGRESS_MS     3000
#define C10D_SPARE_MAX_MS    (7u * 24 * 3600 * 1000) /* a spare waits at most a week */
#define C10D_DEPART_MS	     10000
#define C10D_PROGRESS_MAX_MS 60000u /* progress lines double their interval up to this */
#define C10D_REASON_MS	     5000u  /* reading why the job failed, once it did */
#define C10D_OUTAGE_MS	     60000u /* a store no member serves may be down this long */
/* The store client's longest pause between dials (store/client/client_int.h BACKOFF_CAP_MS):
 * a live member may try that much later than another once the store is back. */
#define C10D_REDIAL_MS 2000u
/* At a clean end, how long an agent waits for its monitor to give its lease
 * back before it exits anyway (the revoke is one request, sent as soon as
 * the monitor's watch sees the job closed). */
#define C10D_RELEASE_WAIT_MS 2000u

enum c10d_job_kind { JOB_ROUND, JOB_BARRIER, JOB_FAIL, JOB_MONITOR, JOB_GATHER };

enum round_outcome { RO_OK, RO_SPARE_DONE };

/* What an exit barrier ended with. */
enum barrier_outcome { BO_PASSED, BO_FAILED, BO_TIMED_OUT };

struct coord;

/* One helper job's input and results. */
struct c10d_job {
	struct helper_job h; /* first: the helper's view */
	enum c10d_job_kind kind;
	char host[RDZV_HOST_MAX]; /* rendezvous store */
	uint16_t port;
	char prefix[320];
	struct c10d_conf conf;
	int min, max, nproc, is_host;
	int prev_round, prev_grank;
	/* ROUND: r<prev_round>/change is set (this agent's monitor read it):
	 * coming back, it need not write a reason there. */
	bool change_seen;
	bool prev_restart; /* ROUND, change_seen: that change was a restart */
	/* ROUND: the attempt of the round being joined, as far as this agent
	 * knows it (-1: not known), for a store that forgot it (c10d_join.c) */
	int next_attempt;
	char record[2 * RDZV_HOST_MAX + 64]; /* ROUND: this agent's node record */
	uint16_t wport;
	char addr[RDZV_HOST_MAX];
	char hostname[RDZV_HOST_MAX];
	char store_host[RDZV_HOST_MAX]; /* the agent serving the store, for messages */
	char why[512];			/* JOB_FAIL: root cause, "" when a peer closed */
	/* the round (input to BARRIER/FAIL/MONITOR, output of ROUND) */
	int round, nnodes, host_member;
	/* results, read by the loop only after the post */
	enum round_outcome outcome;
	enum barrier_outcome barrier;
	struct rdzv_info info;
	enum rdzv_change change;
	/* ROUND -> MONITOR: the connection holding this agent's lease, taken
	 * with the ticket (no unguarded window) */
	struct coord *mon_c;
	struct coord *lease_c; /* borrowed: take the lease on it (tests) */
	uint64_t lease;
	uint64_t lease_kept_ms; /* when the lease last showed life (its grant, a
				 * keep-alive sent), 0: unknown; the monitor's
				 * first keep-alive waits a heartbeat from then */
	bool hb, take_lease;
	/* MONITOR: when the lease (or heartbeat) was last renewed - the time the
	 * request went out - for the loop's fence (c10d_fence.c) */
	_Atomic uint64_t kept_ok_ms;
	/* ROUND: this agent fenced its workers (its lease went unrenewed for a
	 * TTL): it says so on the round's change key, and redials the store for
	 * C10D_OUTAGE_MS at most */
	bool fenced;
	char *peers;		/* ROUND, group rank 0: the nodes' addresses (c10d_peers.c) */
	struct etcd_conf *etcd; /* owned copy; NULL: the crun store */
	struct rdzv_prog *prog; /* a reference (progress_int.h), or NULL */
	/* MONITOR with board: answers the job board's asks (board.c). The
	 * last ask handled (-1: not known yet, read from the counter first);
	 * the one the loop is asked to answer (0: none), and its answer
	 * handed back under mu (answered: the ask it answers; answer:
	 * malloc'd or NULL). */
	bool board;
	/* MONITOR: the job ended and the lease was given back (or its revoke
	 * failed, or there was none): the agent may exit (c10d.c) */
	atomic_bool released;
	_Atomic int64_t ask_seen;
	_Atomic int64_t ask_pending;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int64_t answered;
	char *answer;
	/* GATHER: the ask posted (why: its record), how long to wait for the
	 * answers, and the nnodes answers gathered (each malloc'd or NULL) */
	int64_t ask;
	uint32_t gather_ms;
	char **answers;
	char err[512];
};

struct c10d_job *c10d_job_new(enum c10d_job_kind kind);
/* The job bodies (on a helper thread, or the caller's for c10d_join_on). */
int c10d_job_round(struct c10d_job *j, struct coord *c);
int c10d_job_barrier(struct c10d_job *j, struct coord *c);
int c10d_job_fail(struct c10d_job *j, struct coord *c);
/* c10d_join.c, for c10d_close.c: the attempt of round rd (what its
 * predecessor's closed value and change key say) and the lease kept alive
 * while waiting (*last: when last kept; CRUN_ENOTFOUND: the lease is gone). */
int c10d_attempt_of(struct c10d_job *j, struct coord *c, int64_t rd, int *ret);
int c10d_keep_lease(struct c10d_job *j, uint64_t now, uint64_t *last);
/* c10d_close.c: closing an open round - a member's turn claims the close
 * (r<n>/closing), looks which tickets are alive and, with MIN of them,
 * writes the closed value and the assignments (one closer: r<n>/closer). */
/* A member's turns at closing its round (wait_closed). */
struct c10d_close_turn {
	char claim[32];	   /* the closing claim seen last (c10d_close.c) */
	char lag[64];	   /* a lagging ticket's alive key to wake on, or "" */
	uint64_t next_try; /* when to claim and look again */
	uint64_t held_at;  /* when the close was first held for a lagging ticket */
};

/* A member's turn to close round rd (wait_closed calls it when its turn
 * came): 0 with *ret_closed set when closed, else ct says when to look
 * again and which lagging ticket's alive key to wake on. */
int c10d_close_turn(struct c10d_job *j, struct coord *c, int64_t rd, int64_t t,
		    struct c10d_close_turn *ct, uint64_t *last_keep, char **ret_closed);
/* board.c, GATHER: posts an ask and gathers the answers of group ranks
 * 0..nnodes-1 (j->gather_ms at most). */
int c10d_job_gather(struct c10d_job *j, struct coord *c);
/* board.c, MONITOR side: the key of the next ask to watch into buf (reads
 * the ask counter once when ask_seen is not known). */
int c10d_board_next(struct c10d_job *j, struct coord *c, char *buf, size_t cap);
/* The watched ask arrived: has the loop answer it (helper_nudge, then a
 * bounded wait for the answer) and posts the answer. */
int c10d_board_answer(struct c10d_job *j, struct coord *c);
/* Loop side, on the monitor's nudge: answers a pending ask through fn. */
void c10d_board_on_nudge(struct c10d_job *j, char *(*fn)(int64_t ask, void *arg), void *arg);
/* monitor.c: holds the lease, watches r<n>/change, posts one change. */
int c10d_job_monitor(struct c10d_job *j, struct coord **cp);
/* A store no member serves did not answer (r): true once the outage that
 * began at *since (0: now, said once in a log line) has lasted
 * C10D_OUTAGE_MS, else false after a short pause (the caller retries). */
bool c10d_outage_over(struct c10d_job *j, uint64_t *since, int r);
struct coord_opts;
/* Authentication and TLS of a connection to the rendezvous store: the job's
 * secret and its run id (the prefix is "crun-c10d/<run_id>"). */
void c10d_auth_opts(struct coord_opts *o, const struct c10d_conf *conf, const char *prefix);
/* Opens a connection to the rendezvous store with op timeout timeout_ms. */
int c10d_job_open(const struct c10d_job *j, uint32_t timeout_ms, struct coord **ret);
/* Fills j->err with "what: error[ - detail]" and returns r. */
int c10d_jfail(struct c10d_job *j, struct coord *c, int r, const char *what);
/* Counts key up by one; the caller that reaches `target` sets done_key. */
int c10d_count_in(struct coord *c, const char *rkey, const char *done_key, int64_t target);
/* c10d_progress.c: the waiting line (and j->prog) every C10D_PROGRESS_MS;
 * a completed round's members into j->prog. */
void c10d_progress(struct c10d_job *j, struct coord *c, int64_t rd, int64_t joined,
		   uint64_t min_seen, uint64_t left_ms);
struct round_head;
/* prev_n: the size of this node's previous round (j->nnodes before the
 * assignment). */
void c10d_progress_round(struct c10d_job *j, struct coord *c, const struct round_head *h,
			 int64_t rd, int prev_n);

/* c10d_fence.c: the loop side of a member's liveness - its workers stopped
 * once its lease went unrenewed for a TTL (the store may have ended it and
 * the others moved on), unless the store is seen down. */
typedef uint64_t (*c10d_fence_kept_fn)(void *arg); /* last renewal (ms); 0: no monitor */
struct c10d_fence {
	struct event_base *base; /* borrowed */
	struct event *timer;
	struct event *probe; /* the probe's connect in flight, or NULL */
	int probe_fd;
	struct sockaddr_storage sa; /* the store's address; salen 0: no probes */
	socklen_t salen;
	uint32_t ttl_ms, hb_ms;
	uint64_t down_ms; /* when a probe was last refused (0: never) */
	bool on, probed;
	c10d_fence_kept_fn kept;
	void (*on_fence)(void *arg);
	void *arg;
};
/* When a member whose lease was last renewed at kept_ms fences, given the
 * last refusal of a probe (down_ms, 0: none). Pure. */
uint64_t c10d_fence_deadline(uint64_t kept_ms, uint64_t down_ms, uint32_t ttl_ms, uint32_t hb_ms);
/* Sets f up on base (resolving host:port, blocking: before the loop runs;
 * NULL host: no probes). kept() tells the last renewal, on_fence() fences;
 * both are called on the loop with arg. 0 or CRUN_ENOMEM. */
int c10d_fence_init(struct c10d_fence *f, struct event_base *base, const char *host, uint16_t port,
		    c10d_fence_kept_fn kept, void (*on_fence)(void *arg), void *arg);
/* Watches a monitor just started (at most one on_fence per start). */
void c10d_fence_start(struct c10d_fence *f, uint32_t ttl_ms, uint32_t hb_ms);
void c10d_fence_stop(struct c10d_fence *f);
void c10d_fence_release(struct c10d_fence *f); /* after init, even a failed one */

#define KEY(buf, ...) TRY(str_printf(buf, sizeof(buf), __VA_ARGS__))

#endif /* CRUN_RENDEZVOUS_C10D_INT_H */
