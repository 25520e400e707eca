/* test_rdzv_round.c: Check tests for the pure core of a leaderless round
 * (rendezvous/round_int.h): node records and closed values on the wire,
 * when a member closes, which tickets make the round, the group rank order
 * (total for any input, previous ranks only from the newest round), the
 * assignment every member computes alone, and the job-wide attempt.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "rendezvous/round_int.h"
#include "unit/check_main.h"

static struct round_node node(int t, int prev_round, int prev_grank, int nproc)
{
	struct round_node n = {.ticket = t,
			       .prev_round = prev_round,
			       .prev_grank = prev_grank,
			       .nproc = nproc,
			       .wport = (unsigned)(2000 + t)};

	snprintf(n.addr, sizeof(n.addr), "10.0.0.%d", t);
	snprintf(n.host, sizeof(n.host), "host%d", t);
	return n;
}

static struct round_member mem(int t, int prev_round, int prev_grank)
{
	return (struct round_member){
	    .ticket = t, .prev_round = prev_round, .prev_grank = prev_grank, .nproc = 1};
}

START_TEST(record_round_trip_and_errors)
{
	struct round_node a = node(3, 4, 1, 8), b;
	char buf[ROUND_RECORD_MAX];

	a.is_host = 1;
	ck_assert_int_eq(round_record_format(&a, buf, sizeof(buf)), 0);
	ck_assert_int_eq(round_record_parse(buf, 3, &b), 0);
	ck_assert_int_eq(b.prev_round, 4);
	ck_assert_int_eq(b.prev_grank, 1);
	ck_assert_int_eq(b.nproc, 8);
	ck_assert_int_eq(b.is_host, 1);
	ck_assert_uint_eq(b.wport, 2003);
	ck_assert_str_eq(b.addr, "10.0.0.3");
	ck_assert_str_eq(b.host, "host3");
	/* A rank without its round is no previous rank at all. */
	ck_assert_int_eq(round_record_parse("-1 2 1 0 5 a b", 1, &b), 0);
	ck_assert_int_eq(b.prev_grank, -1);
	ck_assert_int_eq(round_record_parse("0 0 0 0 5 a b", 1, &b), CRUN_EPROTO); /* nproc */
	ck_assert_int_eq(round_record_parse("0 0 1 0 70000 a b", 1, &b), CRUN_EPROTO);
	ck_assert_int_eq(round_record_parse("0 0 1 2 5 a b", 1, &b), CRUN_EPROTO);
	ck_assert_int_eq(round_record_parse("0 0 1 0 5 a", 1, &b), CRUN_EPROTO);
	ck_assert_int_eq(round_record_parse("0 0 1 0 5 a b extra", 1, &b), CRUN_EPROTO);
	ck_assert_int_eq(round_record_parse("", 1, &b), CRUN_EPROTO);
	ck_assert_int_eq(round_record_parse(NULL, 1, &b), CRUN_EPROTO);
}
END_TEST

START_TEST(closed_round_trip_and_errors)
{
	struct round_node m[3] = {node(1, -1, -1, 2), node(4, -1, -1, 1), node(7, -1, -1, 3)};
	struct round_closed rc;
	char *v = NULL;

	ck_assert_int_eq(round_closed_format(5, m, 3, &v), 0);
	ck_assert_int_eq(round_closed_parse(v, 8, &rc), 0);
	ck_assert_int_eq(rc.attempt, 5);
	ck_assert_int_eq(rc.n, 3);
	ck_assert_int_eq(rc.m[2].ticket, 7);
	ck_assert_int_eq(rc.m[2].nproc, 3);
	ck_assert_str_eq(rc.master_addr, "10.0.0.1"); /* group rank 0: ticket 1 */
	ck_assert_uint_eq(rc.master_port, 2001);
	ck_assert_str_eq(rc.store_host, "");
	ck_assert_int_eq(round_closed_find(&rc, 4), 1);
	ck_assert_int_eq(round_closed_find(&rc, 5), -1);
	round_closed_free(&rc);
	/* More members than MAX: rejected. */
	ck_assert_int_eq(round_closed_parse(v, 2, &rc), CRUN_EPROTO);
	free(v);
	/* Abandoned: no members, the attempt still travels. */
	ck_assert_int_eq(round_closed_format(2, NULL, 0, &v), 0);
	ck_assert_int_eq(round_closed_parse(v, 8, &rc), 0);
	ck_assert_int_eq(rc.n, 0);
	ck_assert_int_eq(rc.attempt, 2);
	round_closed_free(&rc);
	free(v);
	ck_assert_int_eq(round_closed_parse("3", 8, &rc), CRUN_EPROTO); /* the old format */
	/* not in ticket order */
	ck_assert_int_eq(
	    round_closed_parse("{\"attempt\":0,\"ma\":\"a\",\"mp\":5,\"sh\":\"\","
			       "\"t\":[2,1],\"n\":[1,1],\"pr\":[-1,-1],\"pg\":[-1,-1]}",
			       8, &rc),
	    CRUN_EPROTO);
	/* arrays of different lengths */
	ck_assert_int_eq(round_closed_parse("{\"attempt\":0,\"ma\":\"a\",\"mp\":5,\"sh\":\"\","
					    "\"t\":[1],\"n\":[],\"pr\":[-1],\"pg\":[-1]}",
					    8, &rc),
			 CRUN_EPROTO);
	/* members without a worker store */
	ck_assert_int_eq(round_closed_parse("{\"attempt\":0,\"ma\":\"\",\"mp\":0,\"sh\":\"\","
					    "\"t\":[1],\"n\":[1],\"pr\":[-1],\"pg\":[-1]}",
					    8, &rc),
			 CRUN_EPROTO);
	/* nproc 0, a negative attempt, a space in an address */
	ck_assert_int_eq(round_closed_parse("{\"attempt\":0,\"ma\":\"a\",\"mp\":5,\"sh\":\"\","
					    "\"t\":[1],\"n\":[0],\"pr\":[-1],\"pg\":[-1]}",
					    8, &rc),
			 CRUN_EPROTO);
	ck_assert_int_eq(round_closed_parse("{\"attempt\":-1,\"ma\":\"\",\"mp\":0,\"sh\":\"\","
					    "\"t\":[],\"n\":[],\"pr\":[],\"pg\":[]}",
					    8, &rc),
			 CRUN_EPROTO);
	ck_assert_int_eq(round_closed_parse("{\"attempt\":0,\"ma\":\"a b\",\"mp\":5,\"sh\":\"\","
					    "\"t\":[1],\"n\":[1],\"pr\":[-1],\"pg\":[-1]}",
					    8, &rc),
			 CRUN_EPROTO);
	ck_assert_int_eq(round_closed_parse("not json", 8, &rc), CRUN_EPROTO);
}
END_TEST

START_TEST(order_first_round_is_ticket_order)
{
	struct round_member m[4] = {mem(1, -1, -1), mem(2, -1, -1), mem(3, -1, -1), mem(4, -1, -1)};
	int g[4];

	ck_assert_int_eq(round_order(m, 4, g), 0);
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(g[i], i);
}
END_TEST

START_TEST(order_keeps_survivors_stable)
{
	/* Round 2 after group rank 1 died: survivors (old 0, 2, 3) keep their
	 * relative order, the newcomer goes last. */
	struct round_member m[4] = {mem(1, 1, 3), mem(2, -1, -1), mem(3, 1, 0), mem(4, 1, 2)};
	int g[4];

	ck_assert_int_eq(round_order(m, 4, g), 0);
	ck_assert_int_eq(g[2], 0);
	ck_assert_int_eq(g[3], 1);
	ck_assert_int_eq(g[0], 2);
	ck_assert_int_eq(g[1], 3);
}
END_TEST

START_TEST(order_drops_a_rank_from_an_older_round)
{
	/* Issue 8, item 2: B missed round 1 and comes back in round 2 with
	 * its round-0 rank 1, which C holds since round 1. B is new again. */
	struct round_member m[3] = {mem(1, 1, 0), mem(2, 0, 1), mem(3, 1, 1)};
	int g[3];

	ck_assert_int_eq(round_order(m, 3, g), 0);
	ck_assert_int_eq(g[0], 0);
	ck_assert_int_eq(g[2], 1);
	ck_assert_int_eq(g[1], 2);
}
END_TEST

START_TEST(order_is_total_for_any_input)
{
	/* Duplicates, huge ranks, everything from one round: never an error,
	 * always a permutation. */
	struct round_member m[5] = {mem(1, 3, 0), mem(2, 3, 0), mem(3, 3, 1000000), mem(4, 2, 0),
				    mem(5, -1, -1)};
	int g[5], seen[5] = {0};

	ck_assert_int_eq(round_order(m, 5, g), 0);
	for (int i = 0; i < 5; i++) {
		ck_assert(g[i] >= 0 && g[i] < 5);
		seen[g[i]]++;
	}
	for (int i = 0; i < 5; i++)
		ck_assert_int_eq(seen[i], 1);
	ck_assert_int_eq(g[0], 0); /* tie on rank 0: by ticket */
	ck_assert_int_eq(g[1], 1);
	ck_assert_int_eq(g[2], 2);
	ck_assert_int_eq(g[3], 3); /* old round: new again, by ticket */
	ck_assert_int_eq(g[4], 4);
	ck_assert_int_eq(round_order(m, 0, g), CRUN_EINVAL);
}
END_TEST

START_TEST(assign_is_the_same_everywhere)
{
	struct round_node m[3] = {node(2, 0, 1, 2), node(5, 0, 0, 3), node(6, -1, -1, 1)};
	struct round_closed rc;
	struct round_assignment a[3];
	char *v = NULL;

	m[2].is_host = 1;
	/* What every member reads: the closed value, not the records. */
	ck_assert_int_eq(round_closed_format(4, m, 3, &v), 0);
	ck_assert_int_eq(round_closed_parse(v, 8, &rc), 0);
	free(v);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(round_assign(&rc, i, &a[i]), 0);
	ck_assert_int_eq(a[1].info.group_rank, 0);
	ck_assert_int_eq(a[0].info.group_rank, 1);
	ck_assert_int_eq(a[2].info.group_rank, 2);
	ck_assert_int_eq(a[1].info.base_rank, 0);
	ck_assert_int_eq(a[0].info.base_rank, 3);
	ck_assert_int_eq(a[2].info.base_rank, 5);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(a[i].info.world_size, 6);
		ck_assert_int_eq(a[i].info.group_world_size, 3);
		ck_assert_int_eq(a[i].info.attempt, 4);
		ck_assert_str_eq(a[i].info.master_addr, "10.0.0.5"); /* group rank 0 */
		ck_assert_uint_eq(a[i].info.master_port, 2005);
		ck_assert_int_eq(a[i].host_member, 1);
		ck_assert_str_eq(a[i].store_host, "host6");
	}
	ck_assert_int_eq(round_assign(&rc, 3, &a[0]), CRUN_EINVAL);
	round_closed_free(&rc);
}
END_TEST

/* The closer's plan gives each member, through the head and its own small
 * value, exactly what round_assign computes from the whole member list -
 * for members with kept ranks, ranks from an older round, new ones and
 * mixed nproc, whatever their order. */
START_TEST(plan_matches_assign_for_every_member)
{
	enum { N = 40 };
	struct round_node m[N];
	struct round_plan p;
	struct round_closed rc;
	struct round_head h;
	char *hv = NULL;
	unsigned seed = 7;

	for (int i = 0; i < N; i++) {
		int kind = (int)(rand_r(&seed) % 3);

		m[i] =
		    node(3 * i + 1,
			 kind == 0   ? -1
			 : kind == 1 ? 5
				     : 4,
			 kind == 0 ? -1 : (int)(rand_r(&seed) % N), 1 + (int)(rand_r(&seed) % 8));
	}
	m[N / 2].is_host = 1;
	ck_assert_int_eq(round_plan_make(9, 4, m, N, &p), 0);
	ck_assert_int_eq(round_closed_parse(p.members, N, &rc), 0);
	ck_assert_int_eq(round_head_format(&p.head, &hv), 0);
	ck_assert_int_lt(strlen(hv), 120); /* the same few bytes for any N */
	ck_assert_int_eq(round_head_parse(hv, &h), 0);
	free(hv);
	ck_assert_int_eq(h.by, 4);
	ck_assert_int_eq(h.nodes, N);
	for (int i = 0; i < N; i++) {
		struct round_assignment want, got;

		ck_assert_int_eq(p.ticket[i], m[i].ticket);
		ck_assert_int_lt(strlen(p.val[i]), 24);
		ck_assert_int_eq(round_assign(&rc, i, &want), 0);
		ck_assert_int_eq(round_member_assign(&h, p.val[i], &got), 0);
		ck_assert_mem_eq(&got.info, &want.info, sizeof(got.info));
		ck_assert_str_eq(got.store_host, want.store_host);
		ck_assert_str_eq(got.store_host, "host61");
		ck_assert_int_eq(got.host_member, want.host_member);
	}
	round_closed_free(&rc);
	round_plan_free(&p);
	/* Members out of ticket order, or none, are refused. */
	{
		struct round_node two[2] = {node(5, -1, -1, 1), node(2, -1, -1, 1)};

		ck_assert_int_eq(round_plan_make(0, 1, two, 2, &p), CRUN_EINVAL);
		ck_assert_int_eq(round_plan_make(0, 1, two, 0, &p), CRUN_EINVAL);
	}
}
END_TEST

START_TEST(head_and_member_values_reject_garbage)
{
	struct round_head h = {.attempt = 2}, back;
	struct round_assignment a;
	char *v = NULL;

	/* Abandoned: no closer, no store. */
	ck_assert_int_eq(round_head_format(&h, &v), 0);
	ck_assert_int_eq(round_head_parse(v, &back), 0);
	free(v);
	ck_assert_int_eq(back.nodes, 0);
	ck_assert_int_eq(back.attempt, 2);
	ck_assert_int_eq(round_head_parse("{\"attempt\":0,\"by\":1,\"nodes\":2,\"ma\":\"\","
					  "\"mp\":0,\"sh\":\"\"}",
					  &back),
			 CRUN_EPROTO); /* members but no worker store */
	ck_assert_int_eq(round_head_parse("{\"attempt\":0,\"by\":0,\"nodes\":2,\"ma\":\"a\","
					  "\"mp\":5,\"sh\":\"\"}",
					  &back),
			 CRUN_EPROTO); /* members but no closer */
	ck_assert_int_eq(round_head_parse("{\"attempt\":0.5,\"by\":1,\"nodes\":1,\"ma\":\"a\","
					  "\"mp\":5,\"sh\":\"\"}",
					  &back),
			 CRUN_EPROTO);
	ck_assert_int_eq(round_head_parse("{\"attempt\":0,\"t\":[1]}", &back), CRUN_EPROTO);
	ck_assert_int_eq(round_head_parse("nope", &back), CRUN_EPROTO);
	ck_assert_int_eq(round_head_parse(NULL, &back), CRUN_EPROTO);
	h = (struct round_head){.attempt = 1, .by = 1, .nodes = 2, .master_port = 5};
	snprintf(h.master_addr, sizeof(h.master_addr), "a");
	ck_assert_int_eq(round_member_assign(&h, "1 3 4", &a), 0);
	ck_assert_int_eq(a.info.group_rank, 1);
	ck_assert_int_eq(a.info.base_rank, 3);
	ck_assert_int_eq(a.info.world_size, 4);
	ck_assert_int_eq(a.host_member, 0);
	ck_assert_int_eq(round_member_assign(&h, "2 3 4", &a), CRUN_EPROTO); /* rank >= nodes */
	ck_assert_int_eq(round_member_assign(&h, "0 4 4", &a), CRUN_EPROTO); /* base >= world */
	ck_assert_int_eq(round_member_assign(&h, "0 3 4", &a), CRUN_EPROTO); /* no room for 2 */
	ck_assert_int_eq(round_member_assign(&h, "1 3 4 x", &a), CRUN_EPROTO);
	ck_assert_int_eq(round_member_assign(&h, "", &a), CRUN_EPROTO);
}
END_TEST

START_TEST(attempt_counts_worker_failures_only)
{
	ck_assert_int_eq(round_next_attempt(0, "restart host1"), 1);
	ck_assert_int_eq(round_next_attempt(3, "dead host1 (ticket 2: lease expired)"), 3);
	ck_assert_int_eq(round_next_attempt(3, "join host4"), 3);
	ck_assert_int_eq(round_next_attempt(3, NULL), 3);
}
END_TEST

START_TEST(close_timers_are_staggered_by_ticket)
{
	/* MIN seen at t=1000, last call 500 ms. */
	ck_assert(!round_should_close(1, 4, 1499, 1000, 0, 500));
	ck_assert(round_should_close(1, 4, 1500, 1000, 0, 500));
	ck_assert(!round_should_close(2, 4, 1500, 1000, 0, 500));
	ck_assert(round_should_close(2, 4, 1500 + ROUND_STAGGER_MS, 1000, 0, 500));
	ck_assert(!round_should_close(1, 4, 5000, 0, 0, 500)); /* below MIN */
	/* MAX: the MAX-th ticket at once, the others shortly after. */
	ck_assert(round_should_close(4, 4, 2000, 1000, 2000, 500));
	ck_assert(!round_should_close(1, 4, 2000, 1000, 2000, 500));
	ck_assert(round_should_close(1, 4, 2000 + ROUND_STAGGER_MS, 1000, 2000, 500));
	/* The stagger is bounded: ticket 10000 does not wait for minutes. */
	ck_assert(round_should_close(10000, 20000, 1500 + ROUND_STAGGER_MS * ROUND_STAGGER_MAX,
				     1000, 0, 500));
	/* The same as times a member can sleep until. */
	ck_assert_uint_eq(round_close_at(1, 4, 1000, 0, 500), 1500);
	ck_assert_uint_eq(round_close_at(3, 4, 1000, 0, 500), 1500 + 2 * ROUND_STAGGER_MS);
	ck_assert_uint_eq(round_close_at(1, 4, 0, 0, 500), 0);
	ck_assert_uint_eq(round_close_at(4, 4, 1000, 2000, 500), 2000);
	ck_assert_uint_eq(round_close_at(2, 4, 1000, 2000, 500), 2000 + 2 * ROUND_STAGGER_MS);
	/* Only the tickets whose turns come first wake on the count markers:
	 * the others' turns are all at the stagger's end, after theirs. */
	ck_assert(round_watches_counts(1));
	ck_assert(round_watches_counts(ROUND_STAGGER_MAX + 1));
	ck_assert(!round_watches_counts(ROUND_STAGGER_MAX + 2));
	ck_assert(!round_watches_counts(0));
	ck_assert_uint_eq(round_close_at(ROUND_STAGGER_MAX + 1, 9999, 1000, 0, 500),
			  round_close_at(ROUND_STAGGER_MAX + 2, 9999, 1000, 0, 500));
}
END_TEST

START_TEST(pick_drops_dead_and_caps_at_max)
{
	bool live[6] = {false, true, true, false, true, true};
	int idx[6];

	ck_assert_int_eq(round_pick(live, 6, 3, idx), 3);
	ck_assert_int_eq(idx[0], 1);
	ck_assert_int_eq(idx[1], 2);
	ck_assert_int_eq(idx[2], 4);
	ck_assert_int_eq(round_pick(live, 1, 3, idx), 0);
}
END_TEST

static Suite *round_suite(void)
{
	Suite *s = suite_create("rdzv_round");
	TCase *tc = tcase_create("pure");

	tcase_add_test(tc, record_round_trip_and_errors);
	tcase_add_test(tc, closed_round_trip_and_errors);
	tcase_add_test(tc, order_first_round_is_ticket_order);
	tcase_add_test(tc, order_keeps_survivors_stable);
	tcase_add_test(tc, order_drops_a_rank_from_an_older_round);
	tcase_add_test(tc, order_is_total_for_any_input);
	tcase_add_test(tc, assign_is_the_same_everywhere);
	tcase_add_test(tc, plan_matches_assign_for_every_member);
	tcase_add_test(tc, head_and_member_values_reject_garbage);
	tcase_add_test(tc, attempt_counts_worker_failures_only);
	tcase_add_test(tc, close_timers_are_staggered_by_ticket);
	tcase_add_test(tc, pick_drops_dead_and_caps_at_max);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(round_suite)
