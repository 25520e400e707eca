/* test_slurm.c: Slurm's hostlist syntax and the allocation's defaults, from
 * an environment array (no Slurm needed). */
#include <stdio.h>
#include <string.h>

#include "unit/check_main.h"
#include "agent/slurm.h"
#include "common/common.h"

/* Expands `list` and compares with the space-separated `want`. */
static void expect_hosts(const char *list, const char *want)
{
	char **hosts = NULL;
	size_t n = 0;
	char joined[4096] = "";
	size_t len = 0;

	ck_assert_msg(slurm_hostlist_expand(list, SLURM_MAX_HOSTS, &hosts, &n) == 0, "%s", list);
	for (size_t i = 0; i < n && len < sizeof(joined); i++)
		len += (size_t)snprintf(joined + len, sizeof(joined) - len, "%s%s", i ? " " : "",
					hosts[i]);
	ck_assert_str_eq(joined, want);
	slurm_hostlist_free(hosts, n);
}

START_TEST(hostlists_expand_like_scontrol)
{
	expect_hosts("login2", "login2");
	expect_hosts("gpu[01-04,07],login2", "gpu01 gpu02 gpu03 gpu04 gpu07 login2");
	expect_hosts("n[8-11]", "n8 n9 n10 n11");
	expect_hosts("n[098-101]", "n098 n099 n100 n101");
	expect_hosts("rack[1-2]-n[1-2]", "rack1-n1 rack1-n2 rack2-n1 rack2-n2");
	expect_hosts("a,b[3],c", "a b3 c");
	expect_hosts("x[0]y", "x0y");
	expect_hosts("10.0.0.[1-2]", "10.0.0.1 10.0.0.2");
}
END_TEST

START_TEST(bad_hostlists_are_refused)
{
	static const char *const bad[] = { "",	   "a,",      ",a",	"a,,b",	 "n[",	   "n[]",
					   "n[1-]", "n[-1]",  "n[3-1]", "n[1,]", "n[a]",   "n]1[",
					   "n[[1]]", "n[1]]", "n1]",	"n[1-2", "n[1;2]", "n[1,,2]" };
	char **hosts = NULL;
	size_t n = 0;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(slurm_hostlist_expand(bad[i], 16, &hosts, &n) == CRUN_EINVAL, "%s",
			      bad[i]);
	ck_assert_int_eq(slurm_hostlist_expand(NULL, 16, &hosts, &n), CRUN_EINVAL);
}
END_TEST

START_TEST(huge_ranges_stop_at_the_bound)
{
	char **hosts = NULL;
	size_t n = 0;

	ck_assert_int_eq(slurm_hostlist_expand("n[0-99999999]", 1000, &hosts, &n), CRUN_ERANGE);
	ck_assert_int_eq(slurm_hostlist_expand("a[0-9]b[0-9]c[0-9]d[0-9]", 1000, &hosts, &n),
			 CRUN_ERANGE);
	ck_assert_int_eq(slurm_hostlist_expand("a[0-9]b[0-9]c[0-9]", 1000, &hosts, &n), 0);
	ck_assert_uint_eq(n, 1000);
	ck_assert_str_eq(hosts[999], "a9b9c9");
	slurm_hostlist_free(hosts, n);
}
END_TEST

START_TEST(job_defaults_come_from_the_allocation)
{
	char *const env[] = { "SLURM_JOB_ID=123457", "SLURM_NNODES=4", "SLURM_NODEID=2",
			      "SLURM_JOB_NODELIST=gpu[07-09],login2", NULL };
	struct slurm_job j;

	ck_assert_int_eq(slurm_job_from_env(env, &j), 0);
	ck_assert_uint_eq(j.job_id, 123457);
	ck_assert_int_eq(j.nnodes, 4);
	ck_assert_int_eq(j.node_id, 2);
	ck_assert_str_eq(j.first_host, "gpu07");
	ck_assert_uint_eq(j.port, SLURM_PORT_BASE + 123457 % SLURM_PORT_SPAN);
}
END_TEST

START_TEST(outside_or_broken_allocations)
{
	char *const none[] = { "HOME=/root", NULL };
	char *const bad_id[] = { "SLURM_JOB_ID=12x", NULL };
	char *const node_past_end[] = { "SLURM_JOB_ID=1", "SLURM_NNODES=2", "SLURM_NODEID=2",
					"SLURM_JOB_NODELIST=a,b", NULL };
	char *const no_list[] = { "SLURM_JOB_ID=1", "SLURM_NNODES=1", "SLURM_NODEID=0", NULL };
	char *const old_name[] = { "SLURM_JOB_ID=1", "SLURM_NNODES=1", "SLURM_NODEID=0",
				   "SLURM_NODELIST=h[3]", NULL };
	struct slurm_job j = { 0 };

	ck_assert_int_eq(slurm_job_from_env(none, &j), CRUN_ENOTFOUND);
	ck_assert_int_eq(slurm_job_from_env(bad_id, &j), CRUN_EINVAL);
	ck_assert_int_eq(slurm_job_from_env(node_past_end, &j), CRUN_EINVAL);
	ck_assert_int_eq(slurm_job_from_env(no_list, &j), CRUN_EINVAL);
	ck_assert_int_eq(slurm_job_from_env(old_name, &j), 0);
	ck_assert_str_eq(j.first_host, "h3");
}
END_TEST

static Suite *slurm_suite(void)
{
	Suite *s = suite_create("slurm");
	TCase *tc = tcase_create("hostlist");

	tcase_add_test(tc, hostlists_expand_like_scontrol);
	tcase_add_test(tc, bad_hostlists_are_refused);
	tcase_add_test(tc, huge_ranges_stop_at_the_bound);
	tcase_add_test(tc, job_defaults_come_from_the_allocation);
	tcase_add_test(tc, outside_or_broken_allocations);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(slurm_suite)
