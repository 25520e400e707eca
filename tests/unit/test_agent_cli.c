/* test_agent_cli.c: torchrun's command line into crun_agent_config_t, without
 * starting anything: defaults, both spellings, abbreviations, PET_* aliases,
 * rejected flags and bad values naming the flag, program detection. */
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#include "unit/check_main.h"
#include "agent/cli.h"
#include "agent/numa.h"
#include "agent/slurm.h"
#include "agent/cli_int.h"
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
static const char *const no_env[] = { "PYTHON_EXEC=/usr/bin/python3", NULL };

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
	/* torchrun 2.x: one node, no --master_port/--rdzv_endpoint: a private
	 * store on a free port with a uuid run id (crun's --standalone). */
	ck_assert_int_eq(c.cfg.standalone, 1);
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
	ck_assert_str_eq(c.argv[0], "python3"); /* no PYTHON_EXEC: python3 */
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nproc_per_node=2", "x.py"), env), 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 2);
}
END_TEST

/* Issue 11 item 7: $PYTHON is not read (torchrun ignores it); python3 beside
 * the program as invoked (a venv's bin/) comes before python3 on PATH. */
START_TEST(interpreter_choice)
{
	const char *const env[] = { "PYTHON=/nonexistent/python", NULL };
	char dir[64], py[96], *argv[] = { NULL, (char *)"x.py", NULL };
	char self[96];
	FILE *f;

	ck_assert_int_eq(parse(ARGS("x.py"), env), 0);
	ck_assert_str_eq(c.argv[0], "python3");
	cli_free(&c);
	snprintf(dir, sizeof(dir), "/tmp/crun-venv-%d", (int)getpid());
	snprintf(py, sizeof(py), "%s/python3", dir);
	snprintf(self, sizeof(self), "%s/crun", dir);
	ck_assert_int_eq(mkdir(dir, 0700), 0);
	f = fopen(py, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	ck_assert_int_eq(chmod(py, 0700), 0);
	argv[0] = self;
	ck_assert_int_eq(cli_parse(&c, 2, argv, (char *const *)env), 0);
	ck_assert_str_eq(c.argv[0], py);
	cli_free(&c);
	unlink(py);
	rmdir(dir);
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
	{ "--run-path=1", "--run-path" },
	{ "--numa_binding=nodes", "--numa_binding" },
	{ "--logs-specs=x", "--logs-specs" },
	{ "--event-log-handler=kafka", "--event-log-handler" },
	{ "--print-completion=fish", "--print-completion" },
	{ "--log_level=loud", "--log_level" },
	{ "--status=nohost", "--status" },
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

/* A zero timeout is refused as torchrun refuses it, and said so: it was
 * "not a number of seconds" (issue 22). The same words for crun's static
 * reading of --rdzv_conf and the c10d backend's. */
static const struct {
	const char *backend, *conf, *needle;
} timeouts[] = {
	{ "--rdzv_backend=static", "--rdzv_conf=timeout=0", "timeout=0 must be positive" },
	{ "--rdzv_backend=c10d", "--rdzv_conf=last_call_timeout=0",
	  "last_call_timeout=0 must be positive" },
	{ "--rdzv_backend=c10d", "--rdzv_conf=join_timeout=soon",
	  "join_timeout=soon is not a number of seconds" },
	{ "--rdzv_backend=c10d", "--rdzv_conf=read_timeout=99999999", "read_timeout=99999999 is "
								      "too long" },
	{ "--rdzv_backend=static", "--rdzv_conf=timeout=99999999", "timeout=99999999 is too long" },
};

START_TEST(timeout_errors_say_what_is_wrong)
{
	ck_assert_int_eq(parse(ARGS(timeouts[_i].backend, "--rdzv_endpoint=127.0.0.1:29400",
				    timeouts[_i].conf, "x.py"),
			       no_env),
			 CRUN_EINVAL);
	ck_assert_msg(strstr(c.err, timeouts[_i].needle), "%s: %s", timeouts[_i].conf, c.err);
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
	char *help;

	ck_assert_int_eq(parse(ARGS("--help"), no_env), 0);
	ck_assert(c.help);
	help = cli_help_new(CLI_CRUN);
	ck_assert_ptr_nonnull(strstr(help, "--nproc_per_node"));
	ck_assert_ptr_nonnull(strstr(help, "--print-completion"));
	ck_assert_ptr_null(strstr(help, "\n  --config")); /* crun-agent only */
	free(help);
	help = cli_help_new(CLI_AGENT);
	ck_assert_ptr_nonnull(strstr(help, "\n  --config"));
	ck_assert_ptr_nonnull(strstr(help, "job.program"));
	free(help);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--version"), no_env), 0);
	ck_assert(c.version);
}
END_TEST


/* torchrun 2.x run.py: static, at most one node, neither --rdzv_endpoint nor
 * --master_port (flag or PET_) -> c10d on localhost:0 with a uuid run id. */
START_TEST(single_node_run_gets_a_free_port)
{
	const char *const pet_port[] = { "PET_MASTER_PORT=2345", NULL };

	ck_assert_int_eq(parse(ARGS("--master_addr=10.0.0.1", "--nnodes=1:1", "x.py"), no_env),
			 0);
	ck_assert_int_eq(c.cfg.standalone, 1);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--master_port=1234", "x.py"), no_env), 0);
	ck_assert_int_eq(c.cfg.standalone, 0);
	ck_assert_uint_eq(c.cfg.master_port, 1234);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), pet_port), 0);
	ck_assert_int_eq(c.cfg.standalone, 0);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_endpoint=127.0.0.1:5000", "x.py"), no_env), 0);
	ck_assert_int_eq(c.cfg.standalone, 0);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nnodes=2", "x.py"), no_env), 0);
	ck_assert_int_eq(c.cfg.standalone, 0);
	ck_assert_uint_eq(c.cfg.master_port, 29500);
}
END_TEST

START_TEST(torchrun_2x_flags)
{
	const char *const env[] = { "PYTHON_EXEC=py", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=E",
				    NULL };

	ck_assert_int_eq(parse(ARGS("--logs-specs=default", "--duplicate-stdout-filters=a,b",
				    "--duplicate_stderr_filters", "c", "--event-log-handler",
				    "console", "--numa-binding=core-complex", "x.py"),
			       env),
			 0);
	ck_assert_str_eq(c.cfg.line_prefix_template, "E");
	ck_assert_str_eq(c.cfg.duplicate_stdout_filters, "a,b");
	ck_assert_str_eq(c.cfg.duplicate_stderr_filters, "c");
	ck_assert_str_eq(c.event_log_handler, "console");
	ck_assert_str_eq(c.cfg.numa_binding, "core-complex");
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--log-line-prefix-template=[${rank}]", "--run-path", "s.py",
				    "a"),
			       env),
			 0);
	ck_assert_str_eq(c.cfg.line_prefix_template, "[${rank}]");
	/* torchrun's run_script_path(): runpy.run_path(script, run_name="__main__") */
	ck_assert_str_eq(c.argv[0], "py");
	ck_assert_str_eq(c.argv[2], "-c");
	ck_assert_ptr_nonnull(strstr(c.argv[3], "runpy.run_path(sys.argv[0]"));
	ck_assert_str_eq(c.argv[4], "s.py");
	ck_assert_str_eq(c.argv[5], "a");
	ck_assert_int_eq(c.cfg.run_path, 0); /* built here, not wrapped again */
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--print-completion", "zsh"), no_env), 0);
	ck_assert_str_eq(c.completion, "zsh");
	cli_free(&c);
	if (cli_xpu_count() == 0) {
		ck_assert_int_eq(parse(ARGS("--nproc-per-node=xpu", "x.py"), no_env), CRUN_EINVAL);
		ck_assert_ptr_nonnull(strstr(c.err, "XPU"));
	}
}
END_TEST

START_TEST(log_level_sources)
{
	const char *const ll[] = { "LOGLEVEL=INFO", NULL };
	const char *const both[] = { "LOGLEVEL=INFO", "CRUN_LOG_LEVEL=debug", NULL };
	const char *const bad_ll[] = { "LOGLEVEL=LOUD", NULL };

	ck_assert_int_eq(parse(ARGS("x.py"), no_env), 0);
	ck_assert_int_eq(c.log_level, -1);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), ll), 0);
	ck_assert_int_eq(c.log_level, LL_INFO);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), both), 0);
	ck_assert_int_eq(c.log_level, LL_DEBUG);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--log_level=error", "x.py"), both), 0);
	ck_assert_int_eq(c.log_level, LL_ERROR);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), bad_ll), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "LOGLEVEL"));
}
END_TEST

/* torchrun ignores --rdzv_conf keys its static/standalone path does not read:
 * crun warns once, naming the mode the user chose. */
START_TEST(unknown_rdzv_conf_keys_warn)
{
	ck_assert_int_eq(parse(ARGS("--standalone", "--rdzv_conf=is_host=1,timeout=5,x=2",
				    "x.py"),
			       no_env),
			 0);
	ck_assert_uint_eq(c.cfg.join_timeout_ms, 5000);
	ck_assert_ptr_nonnull(strstr(c.warn, "'is_host', 'x'"));
	ck_assert_ptr_nonnull(strstr(c.warn, "--standalone"));
	ck_assert_ptr_null(strstr(c.warn, "static backend"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--nnodes=2", "--master_port=9", "--rdzv_conf=is_host=1",
				    "x.py"),
			       no_env),
			 0);
	ck_assert_ptr_nonnull(strstr(c.warn, "static backend"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--rdzv_conf=timeout=3", "x.py"), no_env), 0);
	ck_assert_str_eq(c.warn, "");
}
END_TEST

START_TEST(crun_only_flags_are_exact)
{
	ck_assert_int_eq(parse(ARGS("--worker_heartbeat_timeout=2.5", "--status=127.0.0.1:0",
				    "--auth-secret-file=/s", "--worker-store-allow-any", "x.py"),
			       no_env),
			 0);
	ck_assert_uint_eq(c.cfg.worker_heartbeat_timeout_ms, 2500);
	ck_assert_str_eq(c.status_listen, "127.0.0.1:0");
	ck_assert_str_eq(c.cfg.auth_secret_file, "/s");
	ck_assert_int_eq(c.cfg.worker_store_allow_any, 1);
	cli_free(&c);
	/* no abbreviation of crun's own flags; --config is crun-agent's */
	ck_assert_int_eq(parse(ARGS("--worker_heart=1", "x.py"), no_env), CRUN_EINVAL);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--config=x.json", "x.py"), no_env), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--config"));
}
END_TEST

START_TEST(completion_scripts)
{
	static const char *const shells[] = { "bash", "zsh", "tcsh" };

	for (size_t i = 0; i < ARRAY_SIZE(shells); i++) {
		char *s = cli_completion_new(CLI_CRUN, shells[i]);

		ck_assert_ptr_nonnull(s);
		ck_assert_msg(strstr(s, "nproc-per-node") && strstr(s, "nproc_per_node"), "%s",
			      shells[i]);
		ck_assert_msg(strstr(s, "core-complex"), "%s: choices", shells[i]);
		ck_assert_ptr_null(strstr(s, "--config"));
		free(s);
	}
	ck_assert_ptr_null(cli_completion_new(CLI_CRUN, "fish"));
}
END_TEST

/* ---- crun-agent --config ------------------------------------------------------ */

static char cfg_path[64];

static int parse_file(const char *json, const char *const *args)
{
	char *argv[16];
	int argc = 0, fd;

	snprintf(cfg_path, sizeof(cfg_path), "/tmp/crun-cli-test-%d.json", (int)getpid());
	fd = open(cfg_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
	close(fd);
	argv[argc++] = (char *)"crun-agent";
	argv[argc++] = (char *)"--config";
	argv[argc++] = cfg_path;
	for (; args && *args && argc < 15; args++)
		argv[argc++] = (char *)*args;
	argv[argc] = NULL;
	argc = cli_parse_prog(&c, CLI_AGENT, argc, argv, (char *const *)no_env);
	unlink(cfg_path);
	return argc;
}

START_TEST(config_file_good)
{
	ck_assert_int_eq(
		parse_file("{\"job\": {\"program\": \"t.py\", \"args\": [\"--lr\", \"0.1\"],"
			   " \"nproc_per_node\": 3, \"env\": {\"A\": \"1\"}},"
			   " \"rendezvous\": {\"backend\": \"c10d\", \"endpoint\": \"10.0.0.1:7\","
			   " \"nnodes\": \"1:4\", \"join_timeout\": 30, \"is_host\": false},"
			   " \"restart\": {\"max_restarts\": 2},"
			   " \"logs\": {\"tee\": 3, \"local_ranks_filter\": [\"0\", \"2\"]},"
			   " \"status\": {\"listen\": \"127.0.0.1:0\"},"
			   " \"security\": {\"secret_file\": \"/etc/crun/s\"},"
			   " \"daemon\": {\"log_level\": \"info\"}}",
			   NULL),
		0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 3);
	ck_assert_str_eq(c.cfg.rdzv_backend, "c10d");
	ck_assert_str_eq(c.cfg.master_addr, "10.0.0.1");
	ck_assert_uint_eq(c.cfg.master_port, 7);
	ck_assert_int_eq(c.cfg.min_nnodes, 1);
	ck_assert_int_eq(c.cfg.max_nnodes, 4);
	ck_assert_str_eq(c.cfg.rdzv_conf, "join_timeout=30,is_host=0");
	ck_assert_int_eq(c.cfg.max_restarts, 2);
	ck_assert_int_eq(c.cfg.tee[1], 3);
	ck_assert_int_eq(c.cfg.console_ranks[1], 0);
	ck_assert_int_eq(c.cfg.console_ranks[2], 1);
	ck_assert_str_eq(c.status_listen, "127.0.0.1:0");
	ck_assert_int_eq(c.log_level, LL_INFO);
	ck_assert_str_eq(c.argv[2], "t.py");
	ck_assert_str_eq(c.argv[3], "--lr");
	ck_assert_str_eq(c.argv[4], "0.1");
	ck_assert_str_eq(c.job_env[0], "A=1");
}
END_TEST

/* SIGHUP compares the fresh config with the running one (issue 22.3): the
 * workers' environment and arguments are lists, and a change inside one
 * needs a restart too. */
START_TEST(reload_changes_name_job_env_and_args)
{
	struct cli was;
	char live[256], restart[512];

	ck_assert_int_eq(parse_file("{\"job\": {\"program\": \"t.py\", \"env\": {\"A\": \"1\"},"
				    " \"args\": [\"x\"]}}",
				    NULL),
			 0);
	was = c;
	memset(&c, 0, sizeof(c));
	ck_assert_int_eq(parse_file("{\"job\": {\"program\": \"t.py\", \"env\": {\"A\": \"2\"},"
				    " \"args\": [\"x\"]}, \"daemon\": {\"log_level\": \"notice\"}}",
				    NULL),
			 0);
	ck_assert_int_eq(c.log_level, LL_NOTICE);
	cli_changes(&was, &c, live, sizeof(live), restart, sizeof(restart));
	ck_assert_str_eq(live, "log_level");
	ck_assert_str_eq(restart, "job.env");
	cli_free(&c);
	ck_assert_int_eq(parse_file("{\"job\": {\"program\": \"t.py\", \"env\": {\"A\": \"1\"},"
				    " \"args\": [\"x\", \"y\"]}}",
				    NULL),
			 0);
	cli_changes(&was, &c, live, sizeof(live), restart, sizeof(restart));
	ck_assert_str_eq(live, "");
	ck_assert_str_eq(restart, "job.args");
	cli_free(&was);
}
END_TEST

static const struct {
	const char *json;
	const char *needle;
} bad_files[] = {
	{ "{\"job\": {\"program\": \"t.py\", \"colour\": 1}}", "unknown key 'job.colour'" },
	{ "{\"jobs\": {}}", "unknown key 'jobs'" },
	{ "{\"rendezvous\": {\"endpoint\": 42}}",
	  "rendezvous.endpoint: expected \"HOST:PORT\", got 42" },
	{ "{\"restart\": {\"max_restarts\": \"3\"}}", "restart.max_restarts: expected an integer" },
	{ "{\"rendezvous\": {\"standalone\": 1}}", "rendezvous.standalone: expected true or false" },
	{ "{\"job\": {\"args\": [1]}}", "job.args: expected an array of strings" },
	{ "{\"job\": 3}", "job: expected an object" },
	{ "{\"job\": {\"nproc_per_node\": 0, \"program\": \"t.py\"}}", "job.nproc_per_node" },
	{ "{\"rendezvous\": {\"backend\": \"c10d\", \"lease_ttl\": 0.001}, \"job\": {\"program\": "
	  "\"t.py\"}}", "rendezvous.lease_ttl" },
	{ "{\"job\": {\"numa_binding\": \"all\", \"program\": \"t.py\"}}", "job.numa_binding" },
	{ "{\"job\": {\"program\": \"t.py\"},}", ":1:" },
	{ "[]", "expected a JSON object" },
	{ "{\"rendezvous\": {\"nnodes\": 2}}", "job.program" },
};

START_TEST(config_file_errors_name_the_path)
{
	ck_assert_int_eq(parse_file(bad_files[_i].json, NULL), CRUN_EINVAL);
	ck_assert_msg(strstr(c.err, bad_files[_i].needle), "%s: %s", bad_files[_i].json, c.err);
}
END_TEST

START_TEST(config_file_missing_and_flag_wins)
{
	char *argv[] = { (char *)"crun-agent", (char *)"--config=/nonexistent/x.json", NULL };

	ck_assert_int_eq(cli_parse_prog(&c, CLI_AGENT, 2, argv, (char *const *)no_env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "/nonexistent/x.json"));
	cli_free(&c);
	ck_assert_int_eq(parse_file("{\"job\": {\"program\": \"t.py\", \"nproc_per_node\": 3},"
				    " \"restart\": {\"max_restarts\": 2}}",
				    ARGS("--nproc-per-node=2", "other.py", "z")),
			 0);
	ck_assert_int_eq(c.cfg.nproc_per_node, 2);
	ck_assert_int_eq(c.cfg.max_restarts, 2);
	ck_assert_str_eq(c.argv[2], "other.py"); /* the command line's program wins */
	ck_assert_str_eq(c.argv[3], "z");
}
END_TEST

/* crun-rdzvd --config: a JSON file as flags for a getopt table. */
START_TEST(json_as_flags)
{
	static const struct cli_json_flag t[] = {
		{ "host", "host", false },
		{ "port", "port", true },
		{ "limits.max-keys", "max-keys", true },
	};
	static const struct {
		const char *json, *needle;
	} badj[] = {
		{ "{\"limits\": {\"nope\": 1}}", "unknown key 'limits.nope'" },
		{ "{\"port\": \"1\"}", "port: expected a whole number, got \"1\"" },
		{ "{\"port\": -1}", "port: expected a whole number" },
		{ "{\"host\": 7}", "host: expected a string" },
		{ "{\"limits\": 3}", "limits: expected an object" },
		{ "{", ": not valid JSON" },
	};
	char **argv = NULL, err[256];
	int argc = 0, fd;

	snprintf(cfg_path, sizeof(cfg_path), "/tmp/crun-jf-%d.json", (int)getpid());
	for (size_t i = 0; i <= ARRAY_SIZE(badj); i++) {
		const char *json = i < ARRAY_SIZE(badj) ? badj[i].json
						       : "{\"$comment\": \"x\", \"host\": \"h\", "
							 "\"port\": 1, \"limits\": {\"max-keys\": 5}}";

		fd = open(cfg_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		ck_assert_int_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
		close(fd);
		if (i < ARRAY_SIZE(badj)) {
			ck_assert_int_eq(cli_json_flags(cfg_path, t, 3, &argv, &argc, err,
							sizeof(err)),
					 CRUN_EINVAL);
			ck_assert_msg(strstr(err, badj[i].needle), "%s: %s", json, err);
		}
	}
	ck_assert_int_eq(cli_json_flags(cfg_path, t, 3, &argv, &argc, err, sizeof(err)), 0);
	unlink(cfg_path);
	ck_assert_int_eq(argc, 3);
	ck_assert_str_eq(argv[0], "--host=h");
	ck_assert_str_eq(argv[1], "--port=1");
	ck_assert_str_eq(argv[2], "--max-keys=5");
	ck_assert_ptr_null(argv[3]);
	for (int i = 0; i < argc; i++)
		free(argv[i]);
	free(argv);
}
END_TEST

/* Every flag has a JSON key and every JSON key a flag (or a --rdzv_conf key,
 * or the positional program), and both ways give the same config: each row
 * is parsed once as a flag and once from a file, and the results compared. */
static const struct {
	const char *json;  /* the row */
	const char *flag;  /* as a flag (NULL: "--name=<value>") */
	const char *value; /* JSON text */
	const char *extra; /* a flag both parses get */
} samples[] = {
	{ "rendezvous.nnodes", NULL, "3", "--master_port=5" },
	{ "job.nproc_per_node", NULL, "2", NULL },
	{ "rendezvous.backend", NULL, "\"c10d\"", NULL },
	{ "rendezvous.endpoint", NULL, "\"10.1.1.1:5\"", NULL },
	{ "rendezvous.id", NULL, "\"j\"", "--master_port=5" },
	{ "rendezvous.conf", NULL, "\"timeout=9\"", NULL },
	{ "rendezvous.standalone", "--standalone", "true", "--master_port=5" },
	{ "restart.max_restarts", NULL, "2", NULL },
	{ "restart.monitor_interval", NULL, "0.5", NULL },
	{ "job.start_method", NULL, "\"fork\"", NULL },
	{ "logs.event_log_handler", NULL, "\"console\"", NULL },
	{ "job.role", NULL, "\"r\"", NULL },
	{ "job.module", "--module", "true", NULL },
	{ "job.no_python", "--no_python", "true", NULL },
	{ "job.run_path", "--run_path", "true", NULL },
	{ "logs.dir", NULL, "\"/tmp/x\"", NULL },
	{ "logs.redirects", NULL, "\"3\"", NULL },
	{ "logs.tee", NULL, "1", NULL },
	{ "logs.line_prefix_template", NULL, "\"P\"", NULL },
	{ "logs.local_ranks_filter", NULL, "\"0\"", NULL },
	{ "logs.duplicate_stdout_filters", "--duplicate_stdout_filters=a,b", "[\"a\", \"b\"]", NULL },
	{ "logs.duplicate_stderr_filters", NULL, "\"c\"", NULL },
	{ "rendezvous.node_rank", NULL, "1", "--nnodes=2" },
	{ "rendezvous.master_addr", NULL, "\"10.0.0.9\"", NULL },
	{ "rendezvous.master_port", NULL, "1234", NULL },
	{ "rendezvous.local_addr", NULL, "\"h\"", NULL },
	{ "logs.specs", NULL, "\"default\"", NULL },
	{ "job.numa_binding", NULL, "\"socket\"", NULL },
	{ "signals.to_handle", NULL, "\"SIGUSR1\"", NULL },
	{ "signals.shutdown_timeout", NULL, "5", NULL },
	{ "job.virtual_local_rank", "--virtual_local_rank", "true", NULL },
	{ "restart.worker_heartbeat_timeout", NULL, "7", NULL },
	{ "health.node_check", "--node_check", "true", NULL },
	{ "health.node_check_threshold", NULL, "35", NULL },
	{ "restart.max_node_failures", NULL, "3", NULL },
	{ "restart.hang_timeout", NULL, "7.5", NULL },
	{ "restart.stack_dump_on_stop", NULL, "\"always\"", NULL },
	{ "status.listen", "--status=127.0.0.1:1", "\"127.0.0.1:1\"", NULL },
	{ "daemon.log_level", NULL, "\"debug\"", NULL },
	{ "security.secret_file", "--auth_secret_file=/s", "\"/s\"", NULL },
	{ "security.worker_store_allow_any", "--worker_store_allow_any", "true", NULL },
	{ "slurm.ignore", "--no_slurm", "true", NULL },
	{ "security.insecure", "--insecure", "true", NULL },
	{ "rendezvous.join_timeout", "--rdzv_conf=join_timeout=9", "9", "--rdzv_backend=c10d" },
	{ "rendezvous.last_call_timeout", "--rdzv_conf=last_call_timeout=9", "9",
	  "--rdzv_backend=c10d" },
	{ "rendezvous.close_timeout", "--rdzv_conf=close_timeout=9", "9", "--rdzv_backend=c10d" },
	{ "rendezvous.read_timeout", "--rdzv_conf=read_timeout=9", "9", "--rdzv_backend=c10d" },
	{ "rendezvous.is_host", "--rdzv_conf=is_host=1", "true", "--rdzv_backend=c10d" },
	{ "rendezvous.heartbeat_interval", "--rdzv_conf=heartbeat_interval=2", "2",
	  "--rdzv_backend=c10d" },
	{ "rendezvous.lease_ttl", "--rdzv_conf=lease_ttl=9", "9", "--rdzv_backend=c10d" },
	{ "rendezvous.auth_secret_file", "--rdzv_conf=auth_secret_file=/s", "\"/s\"",
	  "--rdzv_backend=c10d" },
	{ "rendezvous.tls_cert", "--rdzv_conf=tls_cert=/c", "\"/c\"", "--rdzv_backend=c10d" },
	{ "rendezvous.tls_key", "--rdzv_conf=tls_key=/k", "\"/k\"", "--rdzv_backend=c10d" },
	{ "rendezvous.tls_ca", "--rdzv_conf=tls_ca=/a", "\"/a\"", "--rdzv_backend=c10d" },
	{ "rendezvous.tls_min_version", "--rdzv_conf=tls_min_version=1.2", "\"1.2\"",
	  "--rdzv_backend=c10d" },
	{ "rendezvous.worker_store", "--rdzv_conf=worker_store=proxy", "\"proxy\"",
	  "--rdzv_backend=c10d" },
	{ "job.program", "t.py", "\"t.py\"", NULL },
	{ "job.args", "t.py", "[]", NULL },
	{ "job.env", "t.py", "{}", NULL },
};

/* What a parse produced, as one comparable string. */
static void dump(const struct cli *p, char *buf, size_t cap)
{
	const crun_agent_config_t *g = &p->cfg;
	size_t n;

#define S(x) ((x) ? (x) : "-")
	n = (size_t)snprintf(
		buf, cap,
		"%d %d %d %d %s %s %s %u %s %u %d %u %s %s %d %d %s %" PRIu64 " %d %d %d %s %d %s "
		"%s %s %u %s %d %d %s %s %d %d %d",
		g->nproc_per_node, g->nnodes, g->node_rank, g->standalone, S(g->rdzv_backend),
		S(g->rdzv_id), S(g->master_addr), g->master_port, S(g->local_addr),
		g->join_timeout_ms, g->max_restarts, g->shutdown_timeout_ms, S(g->role),
		S(g->log_dir), g->redirects ? g->redirects[0] : -1, g->tee ? g->tee[0] : -1,
		S(g->line_prefix_template), g->signals_to_handle, g->virtual_local_rank,
		g->min_nnodes, g->max_nnodes, S(g->rdzv_conf), g->run_path,
		S(g->duplicate_stdout_filters), S(g->duplicate_stderr_filters), S(g->numa_binding),
		g->worker_heartbeat_timeout_ms, S(g->auth_secret_file), g->worker_store_allow_any,
		p->log_level, S(p->status_listen), S(p->event_log_handler), g->node_check,
		g->node_check_threshold, g->max_node_failures);
	if (n < cap)
		n += (size_t)snprintf(buf + n, cap - n, " hang=%u stacks=%d", g->hang_timeout_ms,
				      g->stack_dump_on_stop);
#undef S
	for (int i = 0; p->argv && p->argv[i] && n < cap; i++)
		n += (size_t)snprintf(buf + n, cap - n, " [%s]", p->argv[i]);
	if (p->console_ranks && n < cap)
		snprintf(buf + n, cap - n, " console0=%d", p->console_ranks[0]);
}

START_TEST(every_row_round_trips_between_flag_and_json)
{
	for (int k = 0; k < OPT__MAX; k++) {
		const struct cli_opt *o = &cli_opts[k];
		char flag[128], json[512], a[2048], b[2048];
		const char *args[4] = { 0 };
		int s = -1, n = 0;

		if (o->type == CT_ACTION || k == OPT_CONFIG) {
			ck_assert_msg(!o->json, "%s: actions have no JSON key", o->name);
			continue;
		}
		ck_assert_msg(o->json, "--%s has no JSON key", o->name);
		ck_assert_msg(o->name || (o->flags & CF_RDZVKEY) || !strncmp(o->json, "job.", 4),
			      "%s has no flag", o->json);
		for (size_t i = 0; i < ARRAY_SIZE(samples); i++)
			if (strcmp(samples[i].json, o->json) == 0)
				s = (int)i;
		ck_assert_msg(s >= 0, "%s: add a round-trip sample", o->json);
		if (samples[s].flag)
			snprintf(flag, sizeof(flag), "%s", samples[s].flag);
		else
			snprintf(flag, sizeof(flag), "--%s=%s", o->name, samples[s].value);
		for (char *q = flag; *q; q++) /* the flag takes the JSON string bare */
			if (*q == '"')
				memmove(q, q + 1, strlen(q));
		if (samples[s].extra)
			args[n++] = samples[s].extra;
		args[n++] = flag;
		if (strcmp(flag, "t.py") != 0)
			args[n++] = "t.py";
		{
			char *argv[6] = { (char *)"crun-agent" };

			for (int i = 0; i < n; i++)
				argv[i + 1] = (char *)args[i];
			ck_assert_msg(cli_parse_prog(&c, CLI_AGENT, n + 1, argv,
						     (char *const *)no_env) == 0,
				      "%s: %s", flag, c.err);
			dump(&c, a, sizeof(a));
			cli_free(&c);
		}
		/* the same through the file: {"a": {"b": value}} */
		{
			const char *dot = strchr(o->json, '.');

			snprintf(json, sizeof(json), "{\"%.*s\": {\"%s\": %s}}",
				 (int)(dot - o->json), o->json, dot + 1, samples[s].value);
			args[0] = samples[s].extra;
			args[1] = strcmp(o->json, "job.program") ? "t.py" : NULL;
			if (!samples[s].extra) {
				args[0] = args[1];
				args[1] = NULL;
			}
			args[2] = NULL;
			ck_assert_msg(parse_file(json, args) == 0, "%s: %s", json, c.err);
			dump(&c, b, sizeof(b));
			cli_free(&c);
		}
		ck_assert_msg(strcmp(a, b) == 0, "%s:\n flag %s\n file %s", o->json, a, b);
	}
}
END_TEST

/* Slurm: the allocation fills what nothing else gave (issue 14). */
#define SLURM_ENV                                                                           \
	"PYTHON_EXEC=/usr/bin/python3", "SLURM_JOB_ID=4242", "SLURM_NNODES=4", "SLURM_NODEID=3", \
		"SLURM_JOB_NODELIST=gpu[07-09],login2"

START_TEST(slurm_fills_the_rendezvous)
{
	const char *const env[] = { SLURM_ENV, NULL };

	ck_assert_int_eq(parse(ARGS("--nproc_per_node=8", "train.py"), env), 0);
	ck_assert_str_eq(c.cfg.rdzv_backend, "c10d");
	ck_assert_int_eq(c.cfg.min_nnodes, 4);
	ck_assert_int_eq(c.cfg.max_nnodes, 4);
	ck_assert_str_eq(c.cfg.rdzv_id, "4242");
	ck_assert_str_eq(c.cfg.master_addr, "gpu07");
	ck_assert_uint_eq(c.cfg.master_port, SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN);
	ck_assert_int_eq(c.cfg.standalone, 0);
}
END_TEST

START_TEST(slurm_loses_to_every_explicit_setting)
{
	const char *const env[] = { SLURM_ENV, "PET_RDZV_ID=mine", NULL };

	ck_assert_int_eq(parse(ARGS("--nnodes=1:2", "--rdzv_endpoint=head:1234", "x.py"), env), 0);
	ck_assert_int_eq(c.cfg.min_nnodes, 1);
	ck_assert_int_eq(c.cfg.max_nnodes, 2);
	ck_assert_str_eq(c.cfg.master_addr, "head");
	ck_assert_uint_eq(c.cfg.master_port, 1234);
	ck_assert_str_eq(c.cfg.rdzv_id, "mine");
	cli_free(&c);
	/* static chosen by hand: node 0 of the list serves the store */
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=static", "x.py"), env), 0);
	ck_assert_str_eq(c.cfg.rdzv_backend, "static");
	ck_assert_int_eq(c.cfg.nnodes, 4);
	ck_assert_int_eq(c.cfg.node_rank, 3);
	ck_assert_str_eq(c.cfg.master_addr, "gpu07");
	ck_assert_uint_eq(c.cfg.master_port, SLURM_PORT_BASE + 4242 % SLURM_PORT_SPAN);
}
END_TEST

START_TEST(slurm_off_standalone_and_broken)
{
	const char *const env[] = { SLURM_ENV, NULL };
	const char *const off[] = { SLURM_ENV, "CRUN_NO_SLURM=1", NULL };
	const char *const broken[] = { "SLURM_JOB_ID=7", "SLURM_NNODES=2", NULL };

	ck_assert_int_eq(parse(ARGS("--no_slurm", "x.py"), env), 0);
	ck_assert_int_eq(c.cfg.standalone, 1); /* a plain one-node run, as without Slurm */
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), off), 0);
	ck_assert_int_eq(c.cfg.standalone, 1);
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("--standalone", "x.py"), env), 0);
	ck_assert_int_eq(c.cfg.nnodes, 1);
	ck_assert_ptr_null(strstr(c.cfg.rdzv_id ? c.cfg.rdzv_id : "", "4242"));
	cli_free(&c);
	ck_assert_int_eq(parse(ARGS("x.py"), broken), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "SLURM_"));
	ck_assert_ptr_nonnull(strstr(c.err, "--no_slurm"));
}
END_TEST

/* crun-agent's secure default (issue 10): an unauthenticated c10d rendezvous
 * beyond loopback is refused unless --insecure; crun keeps torchrun's way. */
static int parse_agent(const char *const *args, const char *const *env)
{
	char *argv[64];
	int argc = 0;

	argv[argc++] = (char *)"crun-agent";
	for (; args[argc - 1]; argc++)
		argv[argc] = (char *)args[argc - 1];
	return cli_parse_prog(&c, CLI_AGENT, argc, argv, (char *const *)env);
}

START_TEST(agent_refuses_an_open_rendezvous_beyond_loopback)
{
	const char *const env[] = { "PYTHON_EXEC=/usr/bin/python3", NULL };
	const char *const secret_env[] = { "CRUN_AUTH_SECRET_FILE=/etc/crun/s", NULL };

	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
					  "--nnodes=2", "x.py"),
				     env),
			 CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(c.err, "--insecure"));
	cli_free(&c);
	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
					  "--nnodes=2", "--insecure", "x.py"),
				     env),
			 0);
	cli_free(&c);
	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
					  "--nnodes=2", "--auth_secret_file=/etc/crun/s", "x.py"),
				     env),
			 0);
	cli_free(&c);
	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
					  "--nnodes=2", "--rdzv_conf=tls_ca=/etc/crun/ca.pem",
					  "x.py"),
				     env),
			 0);
	cli_free(&c);
	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
					  "--nnodes=2", "x.py"),
				     secret_env),
			 0);
	cli_free(&c);
	ck_assert_int_eq(parse_agent(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400",
					  "--nnodes=2", "x.py"),
				     env),
			 0);
	cli_free(&c);
	/* crun is torchrun: allowed (it warns when it serves such a store) */
	ck_assert_int_eq(parse(ARGS("--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29400",
				    "--nnodes=2", "x.py"),
			       env),
			 0);
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
	tcase_add_test(tc, interpreter_choice);
	tcase_add_test(tc, signals_and_timeouts);
	tcase_add_test(tc, static_endpoint_sets_the_master);
	tcase_add_test(tc, etcd_takes_a_member_list);
	tcase_add_loop_test(tc, bad_flags_are_named, 0, (int)ARRAY_SIZE(bad));
	tcase_add_loop_test(tc, timeout_errors_say_what_is_wrong, 0, (int)ARRAY_SIZE(timeouts));
	tcase_add_test(tc, module_and_no_python_conflict);
	tcase_add_test(tc, nproc_keywords);
	tcase_add_test(tc, help_and_version);
	tcase_add_test(tc, single_node_run_gets_a_free_port);
	tcase_add_test(tc, torchrun_2x_flags);
	tcase_add_test(tc, log_level_sources);
	tcase_add_test(tc, unknown_rdzv_conf_keys_warn);
	tcase_add_test(tc, crun_only_flags_are_exact);
	tcase_add_test(tc, completion_scripts);
	tcase_add_test(tc, config_file_good);
	tcase_add_test(tc, reload_changes_name_job_env_and_args);
	tcase_add_loop_test(tc, config_file_errors_name_the_path, 0, (int)ARRAY_SIZE(bad_files));
	tcase_add_test(tc, config_file_missing_and_flag_wins);
	tcase_add_test(tc, every_row_round_trips_between_flag_and_json);
	tcase_add_test(tc, json_as_flags);
	tcase_add_test(tc, slurm_fills_the_rendezvous);
	tcase_add_test(tc, slurm_loses_to_every_explicit_setting);
	tcase_add_test(tc, slurm_off_standalone_and_broken);
	tcase_add_test(tc, agent_refuses_an_open_rendezvous_beyond_loopback);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_cli_suite)
