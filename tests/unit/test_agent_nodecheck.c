/* test_agent_nodecheck.c: the node check's pure parts (agent/nodecheck.c):
 * reading crun-nodecheck's table lines and the verdict every node reaches
 * from the same table (slow, failed, missing, too many worker failures;
 * pinned nodes and MIN keep a named node in), and the state table's cells
 * for the check. */
#include <string.h>

#include "unit/check_main.h"
#include "agent/fsm.h"
#include "agent/nodecheck_int.h"

static struct nc_row row(double gf, double bw, int failures, enum nc_status st)
{
	struct nc_row r = {.gflops = gf, .gbps = bw, .failures = failures, .st = st};

	strcpy(r.host, "h");
	return r;
}

START_TEST(parse_reads_a_line_and_rejects_bad_ones)
{
	static const char *const bad[] = {
	    "node 0 1.0 2.0 0 0 ok",		/* no host */
	    "node -1 1.0 2.0 0 0 ok h",		/* negative rank */
	    "node 0 -1.0 2.0 0 0 ok h",		/* negative rate */
	    "node 0 1.0 2.0 0 0 maybe h",	/* unknown status */
	    "nodes 0 1.0 2.0 0 0 ok h",		/* not a node line */
	    "node 99999 1.0 2.0 0 0 ok h",	/* rank past NC_NODES_MAX */
	};
	struct nc_row r;

	ck_assert_int_eq(nodecheck_parse_line("node 2 12.5 0.25 3 1 failed vm@10.0.0.2", &r), 0);
	ck_assert_int_eq(r.rank, 2);
	ck_assert(r.gflops == 12.5 && r.gbps == 0.25);
	ck_assert_int_eq(r.failures, 3);
	ck_assert(r.pinned);
	ck_assert_int_eq(r.st, NC_FAILED);
	ck_assert_str_eq(r.host, "vm@10.0.0.2");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(nodecheck_parse_line(bad[i], &r), CRUN_EINVAL);
}
END_TEST

START_TEST(slow_node_below_threshold_is_excluded)
{
	struct nc_row t[3] = {row(40, 1, 0, NC_OK), row(4, 1, 0, NC_OK), row(38, 1, 0, NC_OK)};
	struct nc_policy p = {.threshold_pct = 50, .min_nodes = 2};
	double mg = 0, mb = 0;
	char why[256];

	ck_assert_int_eq(nodecheck_decide(t, 3, &p, &mg, &mb), 1);
	ck_assert(mg == 38 && mb == 1);
	ck_assert(!t[0].excluded && t[1].excluded && !t[2].excluded);
	ck_assert_uint_eq(t[1].why, NC_WHY_GFLOPS);
	nodecheck_why_text(&t[1], &p, mg, mb, why, sizeof(why));
	ck_assert_str_eq(why, "GEMM at 4.00 GFLOP/s is below 50% of the median 38.00");
}
END_TEST

START_TEST(slow_link_failed_and_missing_nodes_are_named)
{
	struct nc_row t[5] = {row(10, 1.0, 0, NC_OK), row(10, 0.1, 0, NC_OK),
			      row(0, 0, 0, NC_FAILED), row(0, 0, 0, NC_MISSING),
			      row(11, 1.1, 0, NC_OK)};
	struct nc_policy p = {.threshold_pct = 50, .min_nodes = 2};
	double mg = 0, mb = 0;

	/* Medians over the nodes that passed only: 10 and 1.0. */
	ck_assert_int_eq(nodecheck_decide(t, 5, &p, &mg, &mb), 3);
	ck_assert(mg == 10 && mb == 1.0);
	ck_assert_uint_eq(t[1].why, NC_WHY_GBPS);
	ck_assert_uint_eq(t[2].why, NC_WHY_FAILED);
	ck_assert_uint_eq(t[3].why, NC_WHY_FAILED);
	ck_assert(!t[0].excluded && !t[4].excluded);
}
END_TEST

START_TEST(min_nodes_and_pinned_keep_a_named_node)
{
	struct nc_row t[2] = {row(40, 1, 0, NC_OK), row(4, 1, 0, NC_OK)};
	struct nc_row u[3] = {row(40, 1, 0, NC_OK), row(4, 1, 0, NC_OK), row(39, 1, 0, NC_OK)};
	struct nc_policy p = {.threshold_pct = 50, .min_nodes = 2};

	/* Two nodes, MIN 2: named, kept. */
	ck_assert_int_eq(nodecheck_decide(t, 2, &p, NULL, NULL), 0);
	ck_assert_uint_eq(t[1].why, NC_WHY_GFLOPS);
	ck_assert_int_eq(t[1].kept, NC_KEPT_MIN);
	ck_assert(!t[1].excluded);
	/* It serves the rendezvous store: leaving would end the job. */
	u[1].pinned = true;
	ck_assert_int_eq(nodecheck_decide(u, 3, &p, NULL, NULL), 0);
	ck_assert_int_eq(u[1].kept, NC_KEPT_PINNED);
	ck_assert(!u[1].excluded);
}
END_TEST

START_TEST(worker_failures_retire_a_node_without_a_speed_check)
{
	struct nc_row t[3] = {row(0, 0, 1, NC_OK), row(0, 0, 2, NC_OK), row(0, 0, 0, NC_OK)};
	struct nc_policy p = {.threshold_pct = 0, .max_failures = 2, .min_nodes = 2};
	char why[256];

	ck_assert_int_eq(nodecheck_decide(t, 3, &p, NULL, NULL), 1);
	ck_assert(!t[0].excluded && t[1].excluded && !t[2].excluded);
	ck_assert_uint_eq(t[1].why, NC_WHY_FAILURES);
	nodecheck_why_text(&t[1], &p, 0, 0, why, sizeof(why));
	ck_assert_str_eq(why, "its workers failed in 2 attempts (--max_node_failures=2)");
	/* Off: never. */
	p.max_failures = 0;
	ck_assert_int_eq(nodecheck_decide(t, 3, &p, NULL, NULL), 0);
	ck_assert_uint_eq(t[1].why, 0);
}
END_TEST

START_TEST(fsm_has_the_check_cells)
{
	ck_assert_ptr_nonnull(agent_fsm[AS_CHECKING][AE_CHECK_DONE]);
	ck_assert_ptr_nonnull(agent_fsm[AS_CHECKING][AE_PEER_CHANGED]);
	ck_assert_ptr_nonnull(agent_fsm[AS_CHECKING][AE_TERM_SIGNAL]);
	ck_assert_ptr_null(agent_fsm[AS_RUNNING][AE_CHECK_DONE]);
	ck_assert_str_eq(agent_state_name(AS_CHECKING), "node-check");
	ck_assert_str_eq(agent_event_name(AE_CHECK_DONE), "check-done");
	ck_assert_int_eq(agent_public_state(AS_CHECKING), CRUN_AGENT_RENDEZVOUS);
}
END_TEST

static Suite *agent_nodecheck_suite(void)
{
	Suite *s = suite_create("agent_nodecheck");
	TCase *tc = tcase_create("verdict");

	tcase_set_timeout(tc, 5);
	tcase_add_test(tc, parse_reads_a_line_and_rejects_bad_ones);
	tcase_add_test(tc, slow_node_below_threshold_is_excluded);
	tcase_add_test(tc, slow_link_failed_and_missing_nodes_are_named);
	tcase_add_test(tc, min_nodes_and_pinned_keep_a_named_node);
	tcase_add_test(tc, worker_failures_retire_a_node_without_a_speed_check);
	tcase_add_test(tc, fsm_has_the_check_cells);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_nodecheck_suite)
