/* round_int.h: the pure core of a leaderless rendezvous round (DESIGN.md
 * "Rendezvous"), shared by the store (c10d.c) and etcd backends. No I/O: the
 * backends read records, alive keys and the previous round from their
 * coordination service and ask these functions what to write and decide.
 *
 *   node record  "r<r>/node/<t>": "<prev_round> <prev_grank> <nproc> <is_host>
 *                <wport> <addr> <host>" (prev_* -1 when the node is new)
 *   closed value "r<r>/closed" (the head): {"attempt":A,"by":T,"nodes":N,
 *                "ma":addr,"mp":port,"sh":store host}, written once by
 *                COMPARE_SET: the same few bytes whatever N. "ma:mp" is group
 *                rank 0's worker store, T the ticket of the member that
 *                closed it. N = 0: the round was abandoned (a joiner died
 *                before it closed) and everyone joins the next one.
 *   assignment   "r<r>/a/<t>": "<group rank> <base rank> <world size>",
 *                ticket t's place, written before the head (one MULTI_SET)
 *                by the one closer that won "r<r>/closer": a member reads
 *                two small keys (with one request on a crun store, see
 *                coord_wait_any_get_with), O(1) bytes, and a ticket with no
 *                such key is not a member.
 *   member list  "r<r>/members/<T>": {"attempt":A,"t":[tickets],"n":[nproc],
 *                "pr":[prev round],"pg":[prev rank],"ma":..,"mp":..,"sh":..}
 *                (members in ticket order), for the few that need everyone:
 *                group rank 0 (who may reach its store), status pages.
 */
#ifndef CRUN_RENDEZVOUS_ROUND_INT_H
#define CRUN_RENDEZVOUS_ROUND_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rendezvous/rdzv.h"

/* Spreads the close attempts of the members over time: the ticket-t member
 * tries last_call + min(t-1, ROUND_STAGGER_MAX) * ROUND_STAGGER_MS after MIN
 * (one reader of the records in the common case, another one soon after if
 * the first is dead). */
#define ROUND_STAGGER_MS  100u
#define ROUND_STAGGER_MAX 30u
#define ROUND_RECORD_MAX  (2 * RDZV_HOST_MAX + 64)

/* A node's record, as its joiner wrote it. */
struct round_node {
	int ticket;
	int prev_round, prev_grank; /* -1, -1: not in any earlier round */
	int nproc, is_host;
	unsigned wport;
	char addr[RDZV_HOST_MAX], host[RDZV_HOST_MAX];
};

/* What the assignment needs of a member (a closed value carries only this). */
struct round_member {
	int ticket;
	int prev_round, prev_grank;
	int nproc;
};

/* One closed round. Members carry only what the assignment needs (ticket,
 * nproc, previous round and rank: no addresses), so every member reads a
 * few bytes per node; the worker store (group rank 0's address) and the
 * store host's name travel once. */
struct round_closed {
	int attempt;
	int n;			/* members; 0 = abandoned */
	struct round_member *m; /* n members in ticket order (malloc'd) */
	char master_addr[RDZV_HOST_MAX];
	unsigned master_port;
	char store_host[RDZV_HOST_MAX]; /* "" when the store host is no member */
};

int round_record_format(const struct round_node *n, char *buf, size_t cap);
/* CRUN_EPROTO for a malformed record (bounded fields, nproc >= 1). */
int round_record_parse(const char *s, int ticket, struct round_node *ret);

/* round_json.c: *ret malloc'd JSON; m: full records (their addresses pick the worker
 * store and the store host). */
int round_closed_format(int attempt, const struct round_node *m, int n, char **ret);
/* round_json.c: at most max_members members; CRUN_EPROTO for anything
 * malformed. */
int round_closed_parse(const char *s, int max_members, struct round_closed *ret);
void round_closed_free(struct round_closed *rc);
/* Index of ticket t among the members, or -1. */
int round_closed_find(const struct round_closed *rc, int ticket);

/* The attempt of a round from the round before it: +1 when that round ended
 * by a worker failure (its change value starts with "restart"). */
int round_next_attempt(int prev_attempt, const char *prev_change);

/* Whether the ticket-t member must wake when the count reaches MIN or MAX:
 * only the first ROUND_STAGGER_MAX + 1 tickets (their close turns come
 * before everyone else's; each of them either closes the round or, dead,
 * ends it through its lease). The others sleep until the round closes or
 * ends - one wake per round instead of two or three, the same whatever K. */
bool round_watches_counts(int ticket);
/* When the member holding `ticket` tries to close: at MAX at once (the
 * MAX-th ticket first, the others staggered), else after MIN plus the last
 * call (staggered). min_seen / max_seen: when this member first saw that
 * many tickets (0 = not yet). */
bool round_should_close(int ticket, int max, uint64_t now, uint64_t min_seen, uint64_t max_seen,
			uint32_t last_call_ms);
/* The same as a time: when that member tries to close (0: not before MIN is
 * seen), so that it can sleep until then. A time 0 never counts as seen. */
uint64_t round_close_at(int ticket, int max, uint64_t min_seen, uint64_t max_seen,
			uint32_t last_call_ms);

/* Members from what the closer read of tickets 1..joined: live[i] says
 * ticket i+1 has both its record and its alive key. The first `max` live
 * tickets; dead and silent ones are dropped. Returns how many (into
 * ret_idx, indexes into live). */
int round_pick(const bool *live, int joined, int max, int *ret_idx);

/* Group rank order, total for any input: previous group ranks are kept only
 * when they come from the newest round any member was in (a node back from
 * an older round is new again), ties and new nodes by ticket. ret_grank[i]
 * is member i's group rank. 0, or CRUN_EINVAL / CRUN_ENOMEM. */
int round_order(const struct round_member *m, int n, int *ret_grank);

/* The assignment part of a node's record. */
struct round_member round_member_of(const struct round_node *n);

/* Group ranks (round_order) and the prefix sums of nproc in that order, for
 * members m[0..n): ret_grank[i] is member i's group rank, ret_base[g] the
 * base rank of group rank g, *ret_world their sum. The one place ranks are
 * summed for a round (round_assign and round_plan_make both call it). 0,
 * CRUN_EINVAL (nproc < 1), CRUN_ERANGE or CRUN_ENOMEM. */
int round_ranks(const struct round_member *m, int n, int *ret_grank, int *ret_base, int *ret_world);

/* Member `me`'s assignment: ranks (prefix sums in group rank order), the
 * worker store (group rank 0's addr:wport) and whether (and which) the store
 * host is a member. */
struct round_assignment {
	struct rdzv_info info;
	char store_host[RDZV_HOST_MAX]; /* the member serving the store, or "" */
	int host_member;
};
int round_assign(const struct round_closed *rc, int me, struct round_assignment *ret);

/* ---- round_json.c: the JSON values (the rest of this header is round.c,
 * which calls only libc) ---- */

/* The closed value (see the top). */
struct round_head {
	int attempt, by, nodes; /* nodes 0 (and by 0): abandoned */
	char master_addr[RDZV_HOST_MAX];
	unsigned master_port;
	char store_host[RDZV_HOST_MAX];
};
int round_head_format(const struct round_head *h, char **ret);
/* CRUN_EPROTO for anything malformed (members but no worker store...). */
int round_head_parse(const char *s, struct round_head *ret);

/* What closer `by` writes for members m[0..n) (ticket order): the head,
 * every member's assignment value and the member list. One pass (sort and
 * prefix sums), not one round_assign per member. */
#define ROUND_ASSIGN_MAX 48
struct round_plan {
	struct round_head head;
	int n;
	int *ticket;		       /* n, ticket order */
	char (*val)[ROUND_ASSIGN_MAX]; /* n: "<group rank> <base rank> <world size>" */
	char *members;		       /* the member list (round_closed_format) */
};
int round_plan_make(int attempt, int by, const struct round_node *m, int n, struct round_plan *ret);
void round_plan_free(struct round_plan *p);
/* A member's assignment from the head and its value (what round_assign
 * computes from the whole list). CRUN_EPROTO for a malformed value. */
int round_member_assign(const struct round_head *h, const char *val, struct round_assignment *ret);

#endif /* CRUN_RENDEZVOUS_ROUND_INT_H */
