/* test_agent_core.c: the agent's pure parts without sockets or processes:
 * prefix-sum rank math, the restart decision and the state table, the
 * failure summary in torchrun's format, tee prefixes, the worker environment
 * and argv substitution, signal lists. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit/check_main.h"
#include "agent/agent.h"
#include "rendezvous/rdzv.h"
#include "common/common.h"

START_TEST(ranks_are_prefix_sums_over_group_ranks)
{
	const int np[] = { 2, 3, 1 };
	struct rdzv_info ri;

	ck_assert_int_eq(rdzv_assign_ranks(np, 3, 0, &ri), 0);
	ck_assert_int_eq(ri.base_rank, 0);
	ck_assert_int_eq(ri.world_size, 6);
	ck_assert_int_eq(ri.group_world_size, 3);
	ck_assert_int_eq(rdzv_assign_ranks(np, 3, 1, &ri), 0);
	ck_assert_int_eq(ri.base_rank, 2);
	ck_assert_int_eq(ri.group_rank, 1);
	ck_assert_int_eq(rdzv_assign_ranks(np, 3, 2, &ri), 0);
	ck_assert_int_eq(ri.base_rank, 5);
	ck_assert_int_eq(ri.role_base_rank, 5);
	ck_assert_int_eq(ri.role_world_size, 6);
}
END_TEST

START_TEST(rank_math_rejects_bad_input)
{
	const int np[] = { 2, 0 };
	struct rdzv_info ri;

	ck_assert_int_eq(rdzv_assign_ranks(np, 2, 0, &ri), CRUN_EINVAL);
	ck_assert_int_eq(rdzv_assign_ranks(np, 1, 1, &ri), CRUN_EINVAL);
	ck_assert_int_eq(rdzv_assign_ranks(np, 0, 0, &ri), CRUN_EINVAL);
}
END_TEST

START_TEST(decide_follows_torchruns_restart_policy)
{
	ck_assert_int_eq(agent_decide(0, 2, 0, 3), DECIDE_WAIT);
	ck_assert_int_eq(agent_decide(0, 0, 0, 3), DECIDE_SUCCESS);
	ck_assert_int_eq(agent_decide(1, 1, 0, 3), DECIDE_RESTART);
	ck_assert_int_eq(agent_decide(1, 1, 2, 3), DECIDE_RESTART);
	ck_assert_int_eq(agent_decide(1, 1, 3, 3), DECIDE_FAIL);
	ck_assert_int_eq(agent_decide(2, 0, 0, 0), DECIDE_FAIL);
}
END_TEST

START_TEST(fsm_table_has_the_documented_cells)
{
	ck_assert_ptr_nonnull(agent_fsm[AS_INIT][AE_START]);
	ck_assert_ptr_nonnull(agent_fsm[AS_RENDEZVOUS][AE_RDZV_COMPLETE]);
	ck_assert_ptr_nonnull(agent_fsm[AS_RENDEZVOUS][AE_RDZV_FAILED]);
	ck_assert_ptr_nonnull(agent_fsm[AS_RUNNING][AE_WORKER_EXIT]);
	ck_assert_ptr_nonnull(agent_fsm[AS_RUNNING][AE_PEER_CHANGED]);
	ck_assert_ptr_nonnull(agent_fsm[AS_RUNNING][AE_TERM_SIGNAL]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_WORKER_EXIT]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_GRACE_EXPIRED]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_TERM_SIGNAL]); /* 2nd ^C */
	ck_assert_ptr_nonnull(agent_fsm[AS_BARRIER][AE_BARRIER_DONE]);
	/* Events that cannot matter are ignored, not acted on. */
	ck_assert_ptr_null(agent_fsm[AS_RUNNING][AE_GRACE_EXPIRED]);
	ck_assert_ptr_null(agent_fsm[AS_STOPPING][AE_RDZV_COMPLETE]);
	ck_assert_ptr_null(agent_fsm[AS_BARRIER][AE_WORKER_EXIT]);
	for (int e = 0; e < AE__MAX; e++) {
		ck_assert_ptr_null(agent_fsm[AS_DONE][e]);
		ck_assert_str_ne(agent_event_name((enum agent_event)e), "?");
	}
	for (int s = 0; s < AS__MAX; s++)
		ck_assert_str_ne(agent_state_name((enum agent_state)s), "?");
}
END_TEST

static struct agent_failure mkfail(int rank, int exitcode, double ts, const char *msg,
				   const char *tb)
{
	struct agent_failure f = { 0 };

	f.global_rank = rank + 4;
	f.local_rank = rank;
	f.pid = 1000 + rank;
	f.exitcode = exitcode;
	f.timestamp = ts;
	f.message = str_dup(msg);
	f.traceback = tb ? str_dup(tb) : NULL;
	return f;
}

START_TEST(summary_matches_torchruns_layout)
{
	struct agent_failure f[2];
	char *s;

	f[0] = mkfail(0, -9, 200.0, "Signal 9 (SIGKILL) received by PID 1000", NULL);
	f[1] = mkfail(1, 1, 100.0, "ValueError: x", "Traceback (most recent call last):\nValueError: x");
	snprintf(f[1].errfile, sizeof(f[1].errfile), "/tmp/e/attempt_0/1/error.json");
	ck_assert_int_eq(errfile_root_cause(f, 2), 1);
	s = errfile_format_summary("train.py", "node7", f, 2);
	ck_assert_ptr_nonnull(s);
	/* Rules are as wide as the widest line (here the SIGKILL traceback,
	 * 53 columns), capped at 60. */
	{
		char want[256];
		const char *w53 = "=====================================================";
		const char *d53 = "-----------------------------------------------------";

		snprintf(want, sizeof(want), "%s\ntrain.py FAILED\n%s\nFailures:\n[0]:\n", w53,
			 d53);
		ck_assert_msg(strncmp(s, want, strlen(want)) == 0, "%s", s);
	}
	ck_assert_ptr_nonnull(strstr(s, "  exitcode  : -9 (pid: 1000)\n  error_file: <N/A>\n"
					"  traceback : Signal 9 (SIGKILL) received by PID 1000\n"));
	ck_assert_ptr_nonnull(strstr(s, "Root Cause (first observed failure):\n[1]:\n"));
	ck_assert_ptr_nonnull(strstr(s, "  host      : node7\n  rank      : 5 (local_rank: 1)\n"
					"  exitcode  : 1 (pid: 1001)\n"
					"  error_file: /tmp/e/attempt_0/1/error.json\n"
					"  traceback : Traceback (most recent call last):\n"
					"  ValueError: x\n"));
	free(s);
	errfile_failure_free(&f[0]);
	errfile_failure_free(&f[1]);
}
END_TEST

START_TEST(summary_with_one_failure_says_no_other_failures)
{
	struct agent_failure f = mkfail(0, 3, 1.0, "To enable traceback see: x", NULL);
	char *s;

	f.stderr_tail = str_dup("line a\nline b");
	s = errfile_format_summary("a", "h", &f, 1);
	ck_assert_ptr_nonnull(strstr(s, "Failures:\n  <NO_OTHER_FAILURES>\n"));
	ck_assert_ptr_nonnull(strstr(s, "  stderr    : line a\n  line b\n"));
	/* The rule is as wide as the widest line (under 60 here). */
	ck_assert_ptr_null(strstr(s, "=========================================================="
				     "=="));
	free(s);
	errfile_failure_free(&f);
}
END_TEST

START_TEST(prefix_templates_expand)
{
	char buf[128];

	ck_assert_int_eq(logs_render_prefix("[${role_name}${local_rank}]:", "default", 5, 1, 2, buf,
					    sizeof(buf)),
			 0);
	ck_assert_str_eq(buf, "[default1]:");
	ck_assert_int_eq(logs_render_prefix("$role_name-$rank-$local_rank-$group_rank $$ $other",
					    "t", 5, 1, 2, buf, sizeof(buf)),
			 0);
	ck_assert_str_eq(buf, "t-5-1-2 $ $other");
	ck_assert_int_eq(logs_render_prefix("[$rank_x]", "t", 5, 1, 2, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "[$rank_x]");
	ck_assert_int_eq(logs_render_prefix("$rank", "t", 5, 1, 2, buf, 1), CRUN_ETOOBIG);
}
END_TEST

START_TEST(env_has_torchruns_variables_and_keeps_the_rest)
{
	char *const base[] = { "PATH=/bin", "RANK=99", "NCCL_ASYNC_ERROR_HANDLING=0", NULL };
	struct env_vars v = {
		.local_rank = 1, .rank = 3, .group_rank = 1, .role_rank = 3, .role = "default",
		.local_world_size = 2, .world_size = 4, .group_world_size = 2,
		.role_world_size = 4, .master_addr = "127.0.0.1", .master_port = 29500,
		.restart_count = 2, .max_restarts = 5, .run_id = "none",
		.error_file = "/tmp/x/error.json", .signals = "SIGTERM",
	};
	char **e = env_build(base, &v);

	ck_assert_ptr_nonnull(e);
	ck_assert_str_eq(env_get(e, "PATH"), "/bin");
	ck_assert_str_eq(env_get(e, "RANK"), "3");
	ck_assert_str_eq(env_get(e, "LOCAL_RANK"), "1");
	ck_assert_str_eq(env_get(e, "GROUP_RANK"), "1");
	ck_assert_str_eq(env_get(e, "ROLE_RANK"), "3");
	ck_assert_str_eq(env_get(e, "ROLE_NAME"), "default");
	ck_assert_str_eq(env_get(e, "LOCAL_WORLD_SIZE"), "2");
	ck_assert_str_eq(env_get(e, "WORLD_SIZE"), "4");
	ck_assert_str_eq(env_get(e, "GROUP_WORLD_SIZE"), "2");
	ck_assert_str_eq(env_get(e, "ROLE_WORLD_SIZE"), "4");
	ck_assert_str_eq(env_get(e, "MASTER_ADDR"), "127.0.0.1");
	ck_assert_str_eq(env_get(e, "MASTER_PORT"), "29500");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_RESTART_COUNT"), "2");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_MAX_RESTARTS"), "5");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_RUN_ID"), "none");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_USE_AGENT_STORE"), "True");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_ERROR_FILE"), "/tmp/x/error.json");
	ck_assert_str_eq(env_get(e, "NCCL_ASYNC_ERROR_HANDLING"), "0");
	ck_assert_str_eq(env_get(e, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
	ck_assert_str_eq(env_get(e, "TORCHELASTIC_SIGNALS_TO_HANDLE"), "SIGTERM");
	ck_assert_ptr_null(env_get(e, "CUDA_VISIBLE_DEVICES"));
	env_free(e);
	v.virtual_local_rank = true;
	e = env_build(base, &v);
	ck_assert_str_eq(env_get(e, "LOCAL_RANK"), "0");
	ck_assert_str_eq(env_get(e, "CUDA_VISIBLE_DEVICES"), "1");
	env_free(e);
}
END_TEST

START_TEST(argv_substitutes_local_rank)
{
	char *const argv[] = { "p", "--x=${local_rank}", "${local_rank}${local_rank}", "$local_rank",
			       NULL };
	char **out = env_argv_subst(argv, 7);

	ck_assert_str_eq(out[0], "p");
	ck_assert_str_eq(out[1], "--x=7");
	ck_assert_str_eq(out[2], "77");
	ck_assert_str_eq(out[3], "$local_rank");
	ck_assert_ptr_null(out[4]);
	env_free(out);
}
END_TEST

START_TEST(signal_lists_parse)
{
	uint64_t m = 0;

	ck_assert_int_eq(supervise_parse_signals("SIGTERM,SIGINT,SIGHUP,SIGQUIT", &m), 0);
	ck_assert_uint_eq(m, 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT);
	ck_assert_int_eq(supervise_parse_signals("USR1, 15", &m), 0);
	ck_assert_uint_eq(m, 1ull << SIGUSR1 | 1ull << SIGTERM);
	ck_assert_int_eq(supervise_parse_signals("SIGKILL", &m), CRUN_EINVAL);
	ck_assert_int_eq(supervise_parse_signals("SIGCHLD", &m), CRUN_EINVAL);
	ck_assert_int_eq(supervise_parse_signals("", &m), CRUN_EINVAL);
	ck_assert_int_eq(supervise_parse_signals("SIGTERM,,", &m), CRUN_EINVAL);
	ck_assert_str_eq(supervise_signame(SIGSEGV), "SIGSEGV");
}
END_TEST

static Suite *agent_core_suite(void)
{
	Suite *s = suite_create("agent_core");
	TCase *tc = tcase_create("pure");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, ranks_are_prefix_sums_over_group_ranks);
	tcase_add_test(tc, rank_math_rejects_bad_input);
	tcase_add_test(tc, decide_follows_torchruns_restart_policy);
	tcase_add_test(tc, fsm_table_has_the_documented_cells);
	tcase_add_test(tc, summary_matches_torchruns_layout);
	tcase_add_test(tc, summary_with_one_failure_says_no_other_failures);
	tcase_add_test(tc, prefix_templates_expand);
	tcase_add_test(tc, env_has_torchruns_variables_and_keeps_the_rest);
	tcase_add_test(tc, argv_substitutes_local_rank);
	tcase_add_test(tc, signal_lists_parse);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_core_suite)
