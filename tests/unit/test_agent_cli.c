/* test_agent_cli.c: torchrun's command line into crun_agent_config_t, without
 * starting anything: defaults, both spellings, abbreviations, PET_* aliases,
 * rejected flags and bad values naming the flag, program detection. */
#include <stdio.h>
#include <string.h>

#include "unit/check_main.h"
#include "agent/agent.h"
#include "common/common.h"

static struct cli c;

/* argv from a NULL-terminated list; env likewise. */
static int parse(const char *const *args, const char *const *env)
{
	char *argv[64];
	int argc = 0;

	argv[argc++] = (char *)"crun";
	for (; args[argc - 1]; argc++)
		argv[argc] = (char *)args[argc - 1];
	return cli_parse(&c, argc, argv, (char *const *)env);
}

#define ARGS(...) ((const char *const[]){ __VA_ARGS__, NULL })
static const char *const no_env[] = { "PYTHON=/usr/bin/python3", NULL };

static void teardown(void)
{
	cli_free(&c);
}

START_TEST(defaults_are_torchruns)
{
	ck_assert_int_eq(parse(ARGS("train.py"), no_env), 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 1);
	ck_assert_int_eq(c.cfg.nnodes, 1);
	ck_assert_int_eq(c.cfg.node_rank, 0);
	ck_assert_int_eq(c.cfg.max_restarts, 0);
	ck_assert_str_eq(c.cfg.master_addr, "127.0.0.1");
	ck_assert_uint_eq(c.cfg.master_port, 29500);
	ck_assert_uint_eq(c.cfg.shutdown_timeout_ms, 30000);
	ck_assert_int_eq(c.cfg.standalone, 0);
	ck_assert_ptr_null(c.cfg.rdzv_id);
	ck_assert_str_eq(c.argv[0], "/usr/bin/python3");
	ck_assert_str_eq(c.argv[1], "-u");
	ck_assert_str_eq(c.argv[2], "train.py");
	ck_assert_ptr_null(c.argv[3]);
	ck_assert_str_eq(c.cfg.entrypoint, "train.py");
	ck_assert_str_eq(c.note, ""); /* one worker: no OMP banner */
}
END_TEST

START_TEST(both_spellings_and_prefixes_parse)
{
	ck_assert_int_eq(parse(ARGS("--nproc-per-node", "4", "--max_restarts=3", "--node-rank=1",
				    "--nnodes=2", "--master-port=1234", "--rdzv-id", "job",
				    "--role=r", "x.py", "a"),
			       no_env),
			 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 4);
	ck_assert_int_eq(c.cfg.max_restarts, 3);
	ck_assert_int_eq(c.cfg.node_rank, 1);
	ck_assert_int_eq(c.cfg.nnodes, 2);
	ck_assert_uint_eq(c.cfg.master_port, 1234);
	ck_assert_str_eq(c.cfg.rdzv_id, "job");
	ck_assert_str_eq(c.cfg.role, "r");
	ck_assert_str_ne(c.note, "");
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nproc_per", "2", "--max-r=1", "x.py"), no_env), 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 2);
	ck_assert_int_eq(c.cfg.max_restarts, 1);
	cli_free(&c);
	/* "--n" could be --nnodes, --nproc_per_node, --node_rank, --no_python... */
	ck_assert_int_eq(parse(ARGS("--n=2", "x.py"), no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "ambiguous"));
}
END_TEST

START_TEST(options_end_at_the_program)
{
	ck_assert_int_eq(parse(ARGS("--standalone", "x.py", "--nproc_per_node=9", "-m"), no_env),
			 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 1);
	ck_assert_str_eq(c.argv[3], "--nproc_per_node=9");
	ck_assert_str_eq(c.argv[4], "-m");
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("-m", "pkg.mod", "x"), no_env), 0);
	ck_assert_str_eq(c.argv[1], "-u");
	ck_assert_str_eq(c.argv[2], "-m");
	ck_assert_str_eq(c.argv[3], "pkg.mod");
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--no_python", "tool", "x"), no_env), 0);
	ck_assert_str_eq(c.argv[0], "tool");
	cli_free(&c);
	/* An ELF binary runs directly even without --no_python. */
	ck_assert_int_eq(parse(ARGS("/bin/true"), no_env), 0);
	ck_assert_str_eq(c.argv[0], "/bin/true");
}
END_TEST

START_TEST(pet_env_is_a_default_and_cli_wins)
{
	const char *const env[] = { "PET_NPROC_PER_NODE=3", "PET_STANDALONE=1",
				    "PET_MAX_RESTARTS=5", "PET_TEE=3", NULL };

	ck_assert_int_eq(parse(ARGS("x.py"), env), 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 3);
	ck_assert_int_eq(c.cfg.standalone, 1);
	ck_assert_int_eq(c.cfg.max_restarts, 5);
	ck_assert_int_eq(c.cfg.tee[2], 3);
	ck_assert_str_eq(c.argv[0], "python3"); /* no PYTHON: python3 */
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nproc_per_node=2", "x.py"), env), 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 2);
}
END_TEST

START_TEST(std_maps_and_filters)
{
	ck_assert_int_eq(parse(ARGS("--nproc_per_node=3", "-r", "0:1,2:3", "-t2",
				    "--local_ranks_filter=0,2", "x.py"),
			       no_env),
			 0);
	ck_assert_int_eq(c.cfg.redirects[0], 1);
	ck_assert_int_eq(c.cfg.redirects[1], 0);
	ck_assert_int_eq(c.cfg.redirects[2], 3);
	ck_assert_int_eq(c.cfg.tee[1], 2);
	ck_assert_int_eq(c.cfg.console_ranks[0], 1);
	ck_assert_int_eq(c.cfg.console_ranks[1], 0);
	ck_assert_int_eq(c.cfg.console_ranks[2], 1);
}
END_TEST

START_TEST(signals_and_timeouts)
{
	const char *const env[] = { "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=2.5", NULL };

	ck_assert_int_eq(parse(ARGS("--signals_to_handle=SIGUSR1,TERM,2", "x.py"), env), 0);
	ck_assert_uint_eq(c.cfg.signals_to_handle,
			  1ull << SIGUSR1 | 1ull << SIGTERM | 1ull << SIGINT);
	ck_assert_uint_eq(c.cfg.shutdown_timeout_ms, 2500);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--shutdown-timeout=1", "--rdzv_conf=timeout=7", "x.py"), env),
			 0);
	ck_assert_uint_eq(c.cfg.shutdown_timeout_ms, 1000);
	ck_assert_uint_eq(c.cfg.join_timeout_ms, 7000);
}
END_TEST

START_TEST(static_endpoint_sets_the_master)
{
	ck_assert_int_eq(parse(ARGS("--rdzv_endpoint=10.0.0.7:4242", "x.py"), no_env), 0);
	ck_assert_str_eq(c.cfg.master_addr, "10.0.0.7");
	ck_assert_uint_eq(c.cfg.master_port, 4242);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_endpoint=10.0.0.7", "x.py"), no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--rdzv_endpoint"));
}
END_TEST

START_TEST(etcd_takes_a_member_list)
{
	ck_assert_int_eq(parse(ARGS("--rdzv-backend=etcd-v2", "--nnodes=1:3",
				    "--rdzv_endpoint=10.0.0.1:2379,10.0.0.2,[::1]:2380",
				    "--rdzv_conf=protocol=https,key_prefix=/x/y,join_timeout=9",
				    "x.py"),
			       no_env),
			 0);
	ck_assert_str_eq(c.cfg.rdzv_backend, "etcd");
	ck_assert_str_eq(c.cfg.master_addr, "10.0.0.1:2379,10.0.0.2,[::1]:2380");
	ck_assert_int_eq(c.cfg.min_nnodes, 1);
	ck_assert_int_eq(c.cfg.max_nnodes, 3);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=etcd", "--rdzv_endpoint=a:1,,b:2", "x.py"),
			       no_env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--rdzv_endpoint"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=etcd", "--rdzv_conf=protocol=gopher", "x.py"),
			       no_env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "protocol"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=etcd", "--rdzv_conf=cacert=/nonexistent/ca",
				    "x.py"),
			       no_env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "cacert"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=etcd", "--rdzv_conf=bogus=1", "x.py"), no_env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "bogus"));
}
END_TEST

/* Every rejected or bad flag names itself in the error. */
static const struct {
	const char *arg;
	const char *needle;
} bad[] = {
	{ "--nproc_per_node=0", "--nproc_per_node" },
	{ "--nproc-per-node=x", "--nproc-per-node" },
	/* --rdzv_backend=c10d is accepted now: tests/unit/test_rdzv_c10d.c */
	{ "--rdzv_backend=nope", "--rdzv_backend" },
	{ "--run-path", "--run-path" },
	{ "--numa_binding=node", "--numa_binding" },
	{ "--logs-specs=x", "--logs-specs" },
	{ "--duplicate-stderr-filters=x", "--duplicate-stderr-filters" },
	{ "--max_restarts=x", "--max_restarts" },
	{ "--monitor_interval=x", "--monitor_interval" },
	{ "--start_method=thread", "--start_method" },
	{ "--master_port=0", "--master_port" },
	{ "--nnodes=2:4", "--nnodes" },
	{ "--nnodes=0", "--nnodes" },
	{ "--node_rank=1", "--node_rank" },
	{ "--redirects=4", "--redirects" },
	{ "--tee=1:", "--tee" },
	{ "--local_ranks_filter=5", "--local_ranks_filter" },
	{ "--signals_to_handle=SIGKILL", "--signals_to_handle" },
	{ "--rdzv_conf=a", "--rdzv_conf" },
	{ "--standalone=1", "--standalone" },
	{ "--what", "--what" },
	{ "-x", "-x" },
};

START_TEST(bad_flags_are_named)
{
	ck_assert_int_eq(parse(ARGS(bad[_i].arg, "x.py"), no_env), CRUN_EINVAL);
	ck_assert_msg(strstr(c.err, bad[_i].needle), "%s: %s", bad[_i].arg, c.err);
}
END_TEST

START_TEST(module_and_no_python_conflict)
{
	ck_assert_int_eq(parse(ARGS("-m", "--no-python", "x"), no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--no-python"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nproc_per_node=2"), no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "training_script"));
}
END_TEST

START_TEST(nproc_keywords)
{
	int n = 0;

	ck_assert_int_eq(cli_nproc("cpu", &n), 0);
	ck_assert_int_ge(n, 1);
	ck_assert_int_eq(cli_nproc("auto", &n), 0);
	ck_assert_int_ge(n, 1);
	if (cli_gpu_count() == 0)
		ck_assert_int_eq(cli_nproc("gpu", &n), CRUN_ENOTSUP);
	ck_assert_int_eq(cli_nproc("12", &n), 0);
	ck_assert_int_eq(n, 12);
	ck_assert_int_lt(cli_nproc("-1", &n), 0);
}
END_TEST

START_TEST(help_and_version)
{
	ck_assert_int_eq(parse(ARGS("--help"), no_env), 0);
	ck_assert(c.help);
	ck_assert_ptr_nonnull(strstr(cli_help_text(), "--nproc_per_node"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--version"), no_env), 0);
	ck_assert(c.version);
}
END_TEST

static Suite *agent_cli_suite(void)
{
	Suite *s = suite_create("agent_cli");
	TCase *tc = tcase_create("parse");

	tcase_set_timeout(tc, 10);
	tcase_add_checked_fixture(tc, NULL, teardown);
	tcase_add_test(tc, defaults_are_torchruns);
	tcase_add_test(tc, both_spellings_and_prefixes_parse);
	tcase_add_test(tc, options_end_at_the_program);
	tcase_add_test(tc, pet_env_is_a_default_and_cli_wins);
	tcase_add_test(tc, std_maps_and_filters);
	tcase_add_test(tc, signals_and_timeouts);
	tcase_add_test(tc, static_endpoint_sets_the_master);
	tcase_add_test(tc, etcd_takes_a_member_list);
	tcase_add_loop_test(tc, bad_flags_are_named, 0, (int)ARRAY_SIZE(bad));
	tcase_add_test(tc, module_and_no_python_conflict);
	tcase_add_test(tc, nproc_keywords);
	tcase_add_test(tc, help_and_version);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_cli_suite)
