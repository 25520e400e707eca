/* test_stacks.c: the pure parts of stack captures and hang detection: the
 * innermost frame of py-spy, gdb and /proc texts, the straggler rule, the
 * digest line and what counts as a worker's progress. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "unit/check_main.h"
#include "agent/stacks_int.h"
#include "rendezvous/rdzv.h"

static const char pyspy[] = "Process 4639: /usr/bin/python3 /tmp/fx/w.py\n"
			    "Python v3.11.2 (/usr/bin/python3.11)\n\n"
			    "Thread 4639 (idle): \"MainThread\"\n"
			    "    stuck_waiting_for_the_batch (/tmp/job/train.py:41)\n"
			    "    <module> (/tmp/job/train.py:50)\n"
			    "Thread 4700 (idle): \"pin_memory\"\n"
			    "    wait (threading.py:320)\n";
static const char gdb_in[] =
    "[Thread debugging using libthread_db enabled]\n"
    "Thread 1 (Thread 0x7f (LWP 4690) \"python3\"):\n"
    "#0  0x00007f214a in __GI___poll (fds=0x1, nfds=1) at ../sysdeps/unix/poll.c:29\n"
    "#1  0x00000000005d64b4 in ?? ()\n";
static const char gdb_bare[] = "Thread 1 (LWP 7):\n#0  spin () at /src/x/spin.c:12\n";
static const char gdb_nofile[] = "Thread 1 (LWP 7):\n#0  0x0000 in ?? ()\n";
static const char procfb[] = "--- /proc/12 (each thread's kernel wait)\nthread 12\n"
			     "wchan: do_select\nthread 13\nwchan: futex_wait_queue\n";

START_TEST(top_frame_of_each_tool)
{
	static const struct {
		const char *text, *want;
	} cases[] = {
	    {pyspy, "stuck_waiting_for_the_batch (train.py:41)"},
	    {gdb_in, "__GI___poll (poll.c:29)"},
	    {gdb_bare, "spin (spin.c:12)"},
	    {gdb_nofile, "??"},
	    {procfb, "do_select (kernel)"},
	};
	char buf[STACKS_FRAME_MAX];

	ck_assert_int_eq(stacks_top_frame(cases[_i].text, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, cases[_i].want);
}
END_TEST

START_TEST(top_frame_of_no_stack_is_enoent)
{
	char buf[STACKS_FRAME_MAX] = "x";

	ck_assert_int_eq(stacks_top_frame("", buf, sizeof(buf)), CRUN_ENOENT);
	ck_assert_int_eq(stacks_top_frame("Error: Permission Denied\n", buf, sizeof(buf)),
			 CRUN_ENOENT);
	ck_assert_int_eq(stacks_top_frame("Thread 1 (idle)\n", buf, sizeof(buf)), CRUN_ENOENT);
}
END_TEST

START_TEST(top_frame_is_cut_to_the_buffer)
{
	char buf[12];

	ck_assert_int_eq(stacks_top_frame(pyspy, buf, sizeof(buf)), 0);
	ck_assert_uint_eq(strlen(buf), sizeof(buf) - 1);
}
END_TEST

START_TEST(straggler_is_the_rank_off_the_majority)
{
	const char *f[] = {"all_reduce (c10d.py:9)", "slow (w.py:3)", "all_reduce (c10d.py:9)",
			   "all_reduce (c10d.py:9)"};
	bool odd[4];

	ck_assert_int_eq(stacks_stragglers(f, 4, odd), 1);
	ck_assert(!odd[0] && odd[1] && !odd[2] && !odd[3]);
}
END_TEST

START_TEST(no_straggler_without_a_strict_majority)
{
	const char *same[] = {"a (x:1)", "a (x:1)", "a (x:1)"};
	const char *tie[] = {"a (x:1)", "b (x:2)", "a (x:1)", "b (x:2)"};
	const char *two[] = {"a (x:1)", "b (x:2)"};
	const char *empty[] = {"", "a (x:1)", ""};
	bool odd[4];

	ck_assert_int_eq(stacks_stragglers(same, 3, odd), 0);
	ck_assert(!odd[0] && !odd[1] && !odd[2]);
	ck_assert_int_eq(stacks_stragglers(tie, 4, odd), 0);
	ck_assert_int_eq(stacks_stragglers(two, 2, odd), 0);
	ck_assert_int_eq(stacks_stragglers(empty, 3, odd), 0); /* one known frame: no odd one */
	ck_assert_int_eq(stacks_stragglers(NULL, 0, odd), 0);
}
END_TEST

START_TEST(digest_of_a_stop_names_every_rank)
{
	const int ranks[] = {0, 2};
	const char *f[] = {"stuck (train.py:41)", "stuck (train.py:41)"};
	char buf[STACKS_DIGEST_MAX];

	stacks_digest(ranks, f, NULL, 2, "rank 1 failed", buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank 0 was in stuck (train.py:41), rank 2 was in stuck "
			      "(train.py:41) when rank 1 failed");
}
END_TEST

START_TEST(digest_of_a_hang_names_the_straggler_first)
{
	const int ranks[] = {4, 5, 6};
	const char *f[] = {"all_reduce (c10d.py:9)", "slow (w.py:3)", "all_reduce (c10d.py:9)"};
	const bool odd[] = {false, true, false};
	char buf[STACKS_DIGEST_MAX];

	stacks_digest(ranks, f, odd, 3, "hung", buf, sizeof(buf));
	ck_assert_str_eq(buf, "rank 5 is in slow (w.py:3) while ranks 4,6 are in all_reduce "
			      "(c10d.py:9) when hung");
}
END_TEST

START_TEST(digest_is_bounded)
{
	int ranks[64];
	const char *f[64];
	char small[40], big[STACKS_DIGEST_MAX];

	for (int i = 0; i < 64; i++) {
		ranks[i] = i;
		f[i] = "a_rather_long_function_name (some_file.py:1234)";
	}
	stacks_digest(ranks, f, NULL, 64, "rank 99 failed", small, sizeof(small));
	ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
	stacks_digest(ranks, f, NULL, 64, "rank 99 failed", big, sizeof(big));
	ck_assert_ptr_nonnull(strstr(big, "rank 7 was in"));
	ck_assert_ptr_null(strstr(big, "rank 8 was in")); /* eight named, then "..." */
	ck_assert_ptr_nonnull(strstr(big, ", ... when rank 99 failed"));
}
END_TEST

START_TEST(progress_is_cpu_output_or_a_beat)
{
	const struct hang_sample last = {.cpu_ms = 1000, .out_bytes = 10, .beat_ns = 5};
	struct hang_sample now = last;

	ck_assert(!hang_progressed(&last, &now, 1000)); /* nothing moved */
	now.cpu_ms = 1000 + 20;				/* 2 % of one core: housekeeping */
	ck_assert(!hang_progressed(&last, &now, 1000));
	now.cpu_ms = 1000 + 21;
	ck_assert(hang_progressed(&last, &now, 1000));
	now = last;
	now.cpu_ms = 900; /* a child exited: its CPU time is gone, not progress */
	ck_assert(!hang_progressed(&last, &now, 1000));
	now = last;
	now.out_bytes = 11;
	ck_assert(hang_progressed(&last, &now, 1000));
	now = last;
	now.beat_ns = 6;
	ck_assert(hang_progressed(&last, &now, 1000));
}
END_TEST

/* ---- the job-wide digest over the job board's answers ---- */

static const char node0[] =
    "{\"node\":0,\"host\":\"a\",\"ranks\":["
    "{\"rank\":1,\"local_rank\":1,\"pid\":11,\"frame\":\"allreduce (gloo.py:5)\",\"stack\":\"s1\"},"
    "{\"rank\":0,\"local_rank\":0,\"pid\":10,\"frame\":\"allreduce "
    "(gloo.py:5)\",\"stack\":\"s0\"}]}";
static const char node1[] =
    "{\"node\":1,\"host\":\"b\",\"ranks\":["
    "{\"rank\":3,\"local_rank\":1,\"pid\":21,\"frame\":\"late (w.py:9)\",\"stack\":\"s3\"},"
    "{\"rank\":2,\"local_rank\":0,\"pid\":20,\"frame\":\"allreduce "
    "(gloo.py:5)\",\"stack\":\"s2\"}]}";

START_TEST(merge_names_the_straggler_of_another_node)
{
	char *answers[] = {(char *)node1, (char *)node0}; /* any order of nodes */
	struct stacks_merged m;

	ck_assert_int_eq(stacks_merge(answers, 2, "hung", &m), 0);
	ck_assert_int_eq(m.nranks, 4);
	ck_assert_int_eq(m.nodes, 2);
	ck_assert_int_eq(m.nodd, 1);
	ck_assert_int_eq(m.blame_rank, 3);
	ck_assert_str_eq(m.blame_frame, "late (w.py:9)");
	ck_assert_str_eq(
	    m.digest, "rank 3 is in late (w.py:9) while ranks 0,1,2 are in allreduce (gloo.py:5) "
		      "when hung");
}
END_TEST

START_TEST(merge_skips_missing_and_bad_answers)
{
	char *answers[] = {NULL, (char *)"not json", (char *)"{\"ranks\":7}", (char *)node1};
	char *none[] = {NULL, (char *)"{}"};
	struct stacks_merged m;

	ck_assert_int_eq(stacks_merge(answers, 4, NULL, &m), 0);
	ck_assert_int_eq(m.nranks, 2);
	ck_assert_int_eq(m.nodes, 1);
	ck_assert_int_eq(m.nodd, 0); /* one against one: a tie names nobody */
	ck_assert_int_eq(m.blame_rank, -1);
	ck_assert_str_eq(m.digest,
			 "rank 2 was in allreduce (gloo.py:5), rank 3 was in late (w.py:9)");
	ck_assert_int_eq(stacks_merge(none, 2, NULL, &m), CRUN_ENOENT);
}
END_TEST

START_TEST(job_text_lists_every_node_and_rank)
{
	char *answers[] = {(char *)node0, NULL, (char *)node1};
	char *t = stacks_job_text("j1", 7, answers, 3);

	ck_assert_ptr_nonnull(t);
	ck_assert_ptr_nonnull(strstr(t, "job 'j1' (ask 7): 4 ranks on 2 of 3 nodes\n"));
	ck_assert_ptr_nonnull(strstr(t, "digest: rank 3 is in late (w.py:9) while"));
	ck_assert_ptr_nonnull(
	    strstr(t, "=== rank 3 (node 2 b, local rank 1, pid 21): late (w.py:9)\ns3\n"));
	ck_assert_ptr_nonnull(strstr(t, "=== node 1: no answer within 2500 ms\n"));
	ck_assert(strstr(t, "=== rank 1 ") < strstr(t, "=== node 1:"));
	free(t);
}
END_TEST

START_TEST(board_keys)
{
	char buf[32];

	ck_assert_int_eq(rdzv_board_ask_key(buf, sizeof(buf), 12), 0);
	ck_assert_str_eq(buf, "stacks/ask/12");
	ck_assert_int_eq(rdzv_board_answer_key(buf, sizeof(buf), 12, 3), 0);
	ck_assert_str_eq(buf, "stacks/12/3");
	ck_assert_int_eq(rdzv_board_answer_key(buf, 8, 12, 3), CRUN_ERANGE);
}
END_TEST

static Suite *stacks_suite(void)
{
	Suite *s = suite_create("stacks");
	TCase *tc = tcase_create("pure");

	tcase_set_timeout(tc, 5);
	tcase_add_loop_test(tc, top_frame_of_each_tool, 0, 5);
	tcase_add_test(tc, top_frame_of_no_stack_is_enoent);
	tcase_add_test(tc, top_frame_is_cut_to_the_buffer);
	tcase_add_test(tc, straggler_is_the_rank_off_the_majority);
	tcase_add_test(tc, no_straggler_without_a_strict_majority);
	tcase_add_test(tc, digest_of_a_stop_names_every_rank);
	tcase_add_test(tc, digest_of_a_hang_names_the_straggler_first);
	tcase_add_test(tc, digest_is_bounded);
	tcase_add_test(tc, progress_is_cpu_output_or_a_beat);
	tcase_add_test(tc, merge_names_the_straggler_of_another_node);
	tcase_add_test(tc, merge_skips_missing_and_bad_answers);
	tcase_add_test(tc, job_text_lists_every_node_and_rank);
	tcase_add_test(tc, board_keys);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(stacks_suite)
