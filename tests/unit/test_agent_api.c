/* test_agent_api.c: the public agent API (include/crun/agent.h) as a
 * scheduler uses it: configure, run real /bin/sh workers, watch the state
 * callback, stop from another thread, and what embedding must not change in
 * the host (its children, subreaper flag, SIGPIPE, fds). Each test runs in
 * Check's forked child, which becomes the workers' parent. */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

static char *slurp(const char *path)
{
	static char buf[4096];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return NULL;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return buf;
}

/* Issue 8.11: the agent reaped with waitid(P_ALL) and stole the exit status
 * of children the host forked itself; it also made the host a subreaper and
 * ignored SIGPIPE process-wide. */
START_TEST(host_children_and_dispositions_stay_the_hosts)
{
	const char *argv[] = { "/bin/sh", "-c", "sleep 0.3", NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	struct sigaction sa;
	int code = -1, status = 0, sub = -1;
	pid_t child = fork();

	if (child == 0)
		_exit(7); /* exits while the agent runs */
	ck_assert_int_gt(child, 0);
	signal(SIGPIPE, SIG_DFL);
	cfg.nproc_per_node = 2;
	cfg.standalone = 1;
	cfg.argv = argv;
	cfg.log_dir = logdir;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
	ck_assert_int_eq(crun_agent_run(a, &code), 0);
	ck_assert_int_eq(code, 0);
	crun_agent_free(a);
	ck_assert_int_eq(waitpid(child, &status, 0), child);
	ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 7);
	ck_assert_int_eq(prctl(PR_GET_CHILD_SUBREAPER, &sub), 0);
	ck_assert_int_eq(sub, 0);
	ck_assert_int_eq(sigaction(SIGPIPE, NULL, &sa), 0);
	ck_assert_ptr_eq((void *)sa.sa_handler, (void *)SIG_DFL);
}
END_TEST

/* The guard process: the agent's only child before the workers start. */
static pid_t find_child(void)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	pid_t found = 0;

	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d))) {
		char path[64], *stat, *rp;
		int ppid;

		if (atoi(de->d_name) <= 0)
			continue;
		snprintf(path, sizeof(path), "/proc/%d/stat", atoi(de->d_name));
		stat = slurp(path);
		if (!stat || !(rp = strrchr(stat, ')')))
			continue;
		if (sscanf(rp + 2, "%*c %d", &ppid) == 1 && ppid == getpid())
			found = atoi(de->d_name);
	}
	closedir(d);
	return found;
}

/* Issue 8.10 and 8.7: the soft fd limit goes up to the hard one (workers get
 * the original back); the guard holds no fd above 2 but its channel, even
 * above 1024, and leads its own session. */
START_TEST(fd_limit_raised_and_the_guard_holds_no_host_fd)
{
	char out[128], fdpath[64];
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	crun_agent_t *a = NULL;
	struct rlimit rl, low;
	int code = -1, high, nfd = 0;
	pid_t guard;
	DIR *d;
	struct dirent *de;

	ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	ck_assert_uint_gt(rl.rlim_max, 1600);
	high = dup2(STDIN_FILENO, 1500); /* a host fd above 1024, not CLOEXEC */
	ck_assert_int_eq(high, 1500);
	low = rl;
	low.rlim_cur = 256;
	ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
	snprintf(out, sizeof(out), "%s/ulimit.txt", logdir);
	{
		const char *full[] = { "/bin/sh", "-c", "ulimit -n > \"$0\"", out, NULL };

		cfg.argv = full;
		cfg.standalone = 1;
		cfg.log_dir = logdir;
		ck_assert_int_eq(crun_agent_new(&cfg, &a), 0);
		ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
		ck_assert_uint_eq(rl.rlim_cur, rl.rlim_max);
		guard = find_child();
		ck_assert_int_gt(guard, 0);
		snprintf(fdpath, sizeof(fdpath), "/proc/%d/fd", (int)guard);
		/* The guard may still be closing fds: poll until it is settled
		 * (bounded; an fd it keeps, like 1500 before, fails the test). */
		for (int tries = 0; tries < 250; tries++) {
			int maxfd = -1;

			nfd = 0;
			d = opendir(fdpath);
			ck_assert_ptr_nonnull(d);
			while ((de = readdir(d))) {
				if (de->d_name[0] == '.')
					continue;
				if (atoi(de->d_name) > maxfd)
					maxfd = atoi(de->d_name);
				nfd++;
			}
			closedir(d);
			if (nfd == 4 && maxfd == 3 && getsid(guard) == guard)
				break; /* 0-2 /dev/null, 3 the channel; its own session */
			usleep(20 * 1000);
		}
		ck_assert_int_eq(nfd, 4);
		ck_assert_int_eq(getsid(guard), guard);
		ck_assert_int_eq(crun_agent_run(a, &code), 0);
		ck_assert_int_eq(code, 0);
		crun_agent_free(a);
	}
	ck_assert_str_eq(slurp(out), "256\n");
	close(high);
}
END_TEST

/* ---- issue 11.9's config fields (the flags come with cli.c's option table) ---- */

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

static int run_agent(crun_agent_config_t *cfg)
{
	crun_agent_t *a = NULL;
	int code = -1;

	cfg->standalone = 1;
	cfg->log_dir = logdir;
	ck_assert_int_eq(crun_agent_new(cfg, &a), 0);
	ck_assert_int_eq(crun_agent_run(a, &code), 0);
	crun_agent_free(a);
	return code;
}

/* run_path: argv[0] is a Python file run through runpy.run_path, as
 * torchrun's run_script_path: __name__ "__main__", sys.argv [script, args]. */
START_TEST(run_path_runs_the_script_through_runpy)
{
	char script[160], out[160];
	const char *argv[] = { script, out, "--flag", NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;

	snprintf(script, sizeof(script), "%s/s.py", logdir);
	snprintf(out, sizeof(out), "%s/out.txt", logdir);
	write_file(script, "import sys\n"
			   "open(sys.argv[1], 'w').write(repr((__name__, sys.argv, 'runpy' in sys.modules)))\n");
	ck_assert_int_eq(setenv("PYTHON_EXEC", "/usr/bin/python3", 1), 0);
	cfg.argv = argv;
	cfg.run_path = 1;
	ck_assert_int_eq(run_agent(&cfg), 0);
	{
		char want[512];

		snprintf(want, sizeof(want), "('__main__', ['%s', '%s', '--flag'], True)", script,
			 out);
		ck_assert_str_eq(slurp(out), want);
	}
}
END_TEST

/* Duplicate filters: matching lines of teed streams, prefixed, go to
 * <attempt>/filtered_std{out,err}.log as torchrun lays them out; ",," is a
 * literal comma; long lines stay whole. */
START_TEST(duplicate_filters_copy_matching_lines)
{
	const char *argv[] = { "/bin/sh", "-c",
			       "echo keep one; echo drop two; echo 'a,b three'; echo err keep >&2;"
			       "printf 'keep %070000d\n' 0; printf 'keep unfinished'",
			       NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	int tee[2] = { CRUN_STD_ALL, CRUN_STD_NONE };
	char cmd[512], *got;

	cfg.argv = argv;
	cfg.nproc_per_node = 2;
	cfg.tee = tee;
	cfg.duplicate_stdout_filters = "keep,a,,b";
	cfg.duplicate_stderr_filters = "nothing";
	ck_assert_int_eq(run_agent(&cfg), 0);
	snprintf(cmd, sizeof(cmd),
		 "cd %s/*/attempt_0 && test -f filtered_stderr.log && ! test -s filtered_stderr.log"
		 " && cat filtered_stdout.log > ../../filtered.txt",
		 logdir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cmd, sizeof(cmd), "%s/filtered.txt", logdir);
	{
		FILE *f = fopen(cmd, "r");
		static char buf[80000];
		size_t n;

		ck_assert_ptr_nonnull(f);
		n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		buf[n] = '\0';
		got = buf;
	}
	/* Rank 1 is not teed: torchrun filters teed streams only. */
	ck_assert_ptr_nonnull(strstr(got, "[default0]:keep one\n[default0]:a,b three\n"
					  "[default0]:keep 0000"));
	ck_assert_ptr_null(strstr(got, "drop"));
	ck_assert_ptr_null(strstr(got, "default1"));
	ck_assert_int_eq((int)strlen(got), (int)(strlen("[default0]:keep one\n[default0]:a,b three\n") +
						 strlen("[default0]:keep ") + 70000 + 1 +
						 strlen("[default0]:keep unfinished")));
}
END_TEST

/* --numa-binding on a fake sysfs tree (CRUN_SYSFS_ROOT): GPU 0 sits on node
 * 1 (cpu 1), GPU 1 on node 0 (cpu 0); each worker runs on its GPU's cpus. */
START_TEST(numa_binding_pins_each_worker_to_its_gpu)
{
	const char *argv[] = { "/bin/sh", "-c",
			       "grep Cpus_allowed_list /proc/self/status > \"$0.$LOCAL_RANK\"",
			       NULL, NULL };
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	char root[160], out[160], cmd[1024];
	crun_agent_t *a = NULL;

	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		return; /* needs two cpus to tell the bindings apart */
	snprintf(root, sizeof(root), "%s/sys-root", logdir);
	snprintf(cmd, sizeof(cmd),
		 "set -e; r=%s/sys; mkdir -p $r/bus/pci/drivers/nvidia $r/devices/system/node/node0"
		 " $r/devices/system/node/node1 $r/bus/pci/devices/0000:01:00.0"
		 " $r/bus/pci/devices/0000:02:00.0;"
		 " touch $r/bus/pci/drivers/nvidia/0000:01:00.0 $r/bus/pci/drivers/nvidia/0000:02:00.0;"
		 " echo 1 > $r/bus/pci/devices/0000:01:00.0/numa_node;"
		 " echo 0 > $r/bus/pci/devices/0000:02:00.0/numa_node;"
		 " echo 0 > $r/devices/system/node/node0/cpulist;"
		 " echo 1 > $r/devices/system/node/node1/cpulist",
		 root);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(out, sizeof(out), "%s/cpus", logdir);
	argv[3] = out;
	ck_assert_int_eq(setenv("CRUN_SYSFS_ROOT", root, 1), 0);
	cfg.argv = argv;
	cfg.nproc_per_node = 2;
	cfg.numa_binding = "node";
	ck_assert_int_eq(run_agent(&cfg), 0);
	snprintf(cmd, sizeof(cmd), "%s.0", out);
	ck_assert_str_eq(slurp(cmd), "Cpus_allowed_list:\t1\n");
	snprintf(cmd, sizeof(cmd), "%s.1", out);
	ck_assert_str_eq(slurp(cmd), "Cpus_allowed_list:\t0\n");
	/* Three workers, two GPUs: a clear error before anything starts. */
	cfg.nproc_per_node = 3;
	ck_assert_int_eq(crun_agent_new(&cfg, &a), CRUN_ENOENT);
	ck_assert_ptr_null(a);
	unsetenv("CRUN_SYSFS_ROOT");
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
	tcase_add_test(tc, host_children_and_dispositions_stay_the_hosts);
	tcase_add_test(tc, fd_limit_raised_and_the_guard_holds_no_host_fd);
	tcase_add_test(tc, run_path_runs_the_script_through_runpy);
	tcase_add_test(tc, duplicate_filters_copy_matching_lines);
	tcase_add_test(tc, numa_binding_pins_each_worker_to_its_gpu);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_api_suite)
