/* test_agent_api.c: the public agent API (include/crun/agent.h) as a
 * scheduler uses it: configure, run real /bin/sh workers, watch the state
 * callback, stop from another thread. Each test runs in Check's forked child,
 * which becomes the workers' parent and subreaper. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "crun/agent.h"

static crun_agent_state_t seen[64];
static int nseen;

static void on_state(crun_agent_state_t st, int restart_count, void *arg)
{
	(void)restart_count;
	(void)arg;
	if (nseen < 64)
		seen[nseen++] = st;
}

static char logdir[64];

static void mk_logdir(void)
{
	snprintf(logdir, sizeof(logdir), "/tmp/crun-agent-api-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(logdir));
}

static void rm_logdir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", logdir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(runs_workers_to_success_and_reports_states)
{
	const char *argv[] = { "/bin/sh", "-c", "test \"$LOCAL_WORLD_SIZE\" = 3", NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	int code = -1;

	cfg.nproc_per_node = 3;
	cfg.standalone = 1;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	cfg.on_state = on_state;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	ck_assert_int_eq(crun_agent_run(a, &code), 0);
	ck_assert_int_eq(code, 0);
	ck_assert_int_ge(nseen, 3);
	ck_assert_int_eq(seen[0], CRUN_AGENT_RENDEZVOUS);
	ck_assert_int_eq(seen[1], CRUN_AGENT_RUNNING);
	ck_assert_int_eq(seen[nseen - 1], CRUN_AGENT_DONE);
	crun_agent_free(a);
}
END_TEST

START_TEST(failure_restarts_then_exits_1)
{
	const char *argv[] = { "/bin/sh", "-c", "exit 3", NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	int code = -1, running = 0;

	cfg.nproc_per_node = 2;
	cfg.standalone = 1;
	cfg.max_restarts = 2;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	cfg.on_state = on_state;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	ck_assert_int_eq(crun_agent_run(a, &code), 0);
	ck_assert_int_eq(code, 1);
	for (int i = 0; i < nseen; i++)
		running += seen[i] == CRUN_AGENT_RUNNING;
	ck_assert_int_eq(running, 3); /* the first attempt and two restarts */
	crun_agent_free(a);
}
END_TEST

static void *stopper(void *arg)
{
	usleep(200 * 1000);
	crun_agent_stop(arg, SIGTERM);
	return NULL;
}

START_TEST(stop_from_another_thread_ends_the_job)
{
	const char *argv[] = { "/bin/sh", "-c", "sleep 30", NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	pthread_t t;
	int code = -1;

	cfg.nproc_per_node = 2;
	cfg.standalone = 1;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, stopper, a), 0);
	ck_assert_int_eq(crun_agent_run(a, &code), 0);
	pthread_join(t, NULL);
	ck_assert_int_eq(code, 1);
	crun_agent_free(a);
}
END_TEST

START_TEST(bad_config_is_refused)
{
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;

	ck_assert_int_eq(crun_agent_new(&cfg, &a), CRUN_EINVAL); /* no argv */
	ck_assert_ptr_null(a);
	crun_agent_free(NULL);
}
END_TEST

static Suite *agent_api_suite(void)
{
	Suite *s = suite_create("agent_api");
	TCase *tc = tcase_create("run");

	tcase_set_timeout(tc, 30);
	tcase_add_checked_fixture(tc, mk_logdir, rm_logdir);
	tcase_add_test(tc, runs_workers_to_success_and_reports_states);
	tcase_add_test(tc, failure_restarts_then_exits_1);
	tcase_add_test(tc, stop_from_another_thread_ends_the_job);
	tcase_add_test(tc, bad_config_is_refused);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_api_suite)
