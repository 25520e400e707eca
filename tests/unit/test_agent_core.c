/* test_agent_core.c: the agent's pure parts without sockets or processes:
 * prefix-sum rank math, the restart decision and the state table, the
 * failure summary in torchrun's format, tee prefixes, the worker environment
 * and argv substitution, signal lists. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <event2/event.h>

#include "unit/check_main.h"
#include "agent/agent.h"
#include "agent/env.h"
#include "agent/numa.h"
#include "agent/nodecheck_int.h"
#include "rendezvous/rdzv.h"
#include "common/common.h"
#include "agent/outputs.h"

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

/* Issue 29 item 4: the first failure arms the monitor-interval window and
 * signals no one; the sibling that fails inside it is a failure too. */
START_TEST(a_failure_stops_the_others_one_monitor_interval_later)
{
	struct crun_agent a = {0};
	struct worker w[2] = {{.local_rank = 0, .state = W_EXITED, .exit_code = 2},
			      {.local_rank = 1, .global_rank = 1, .state = W_RUNNING, .pid = -1}};

	a.base = event_base_new();
	ck_assert_ptr_nonnull(a.base);
	a.window_timer = evtimer_new(a.base, NULL, NULL);
	a.cfg.monitor_interval_ms = 100;
	a.cfg.entrypoint = "w.py";
	a.wk.workers = w;
	a.wk.nworkers = 2;
	a.state = AS_RUNNING;
	ck_assert_int_eq(agent_fsm[AS_RUNNING][AE_WORKER_EXIT](&a), AS_RUNNING);
	ck_assert(a.window_armed && !a.window_over);
	ck_assert(!w[1].stopping);
	ck_assert_int_eq(a.fail.nfailures, 1);
	w[1].state = W_EXITED;
	w[1].exit_code = 2;
	ck_assert_int_eq(agent_collect_failures(&a), 2);
	for (int i = 0; i < a.fail.nfailures; i++)
		errfile_failure_free(&a.fail.failures[i]);
	free(a.fail.failures);
	nodecheck_free(&a); /* the failure was counted for --max_node_failures */
	event_free(a.window_timer);
	event_base_free(a.base);
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
	ck_assert_ptr_nonnull(agent_fsm[AS_RUNNING][AE_FAILURE_WINDOW]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_WORKER_EXIT]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_GRACE_EXPIRED]);
	ck_assert_ptr_nonnull(agent_fsm[AS_STOPPING][AE_TERM_SIGNAL]); /* 2nd ^C */
	ck_assert_ptr_nonnull(agent_fsm[AS_BARRIER][AE_BARRIER_DONE]);
	/* Events that cannot matter are ignored, not acted on. */
	ck_assert_ptr_null(agent_fsm[AS_RUNNING][AE_GRACE_EXPIRED]);
	ck_assert_ptr_null(agent_fsm[AS_STOPPING][AE_RDZV_COMPLETE]);
	ck_assert_ptr_null(agent_fsm[AS_STOPPING][AE_FAILURE_WINDOW]);
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

	ck_assert_int_eq(logs_render_prefix("[${role_name}${local_rank}]:", "default", "h", 5, 1, 2,
					    buf, sizeof(buf)),
			 0);
	ck_assert_str_eq(buf, "[default1]:");
	ck_assert_int_eq(logs_render_prefix("$role_name-$rank-$local_rank-$group_rank $$ $other",
					    "t", "h", 5, 1, 2, buf, sizeof(buf)),
			 0);
	ck_assert_str_eq(buf, "t-5-1-2 $ $other");
	ck_assert_int_eq(logs_render_prefix("[$rank_x]", "t", "h", 5, 1, 2, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "[$rank_x]");
	ck_assert_int_eq(logs_render_prefix("$rank", "t", "h", 5, 1, 2, buf, 1), CRUN_ETOOBIG);
	/* Issue 11.5: ${hostname} was printed literally. */
	ck_assert_int_eq(logs_render_prefix("${hostname}:${rank}: $hostname", "t", "node7", 5, 1,
					    2, buf, sizeof(buf)),
			 0);
	ck_assert_str_eq(buf, "node7:5: node7");
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

/* Issue 11.4: with an inherited CUDA_VISIBLE_DEVICES=4,5 the workers got 0/1,
 * the wrong GPUs on a shared node; torchrun maps rank i to the i-th entry. */
START_TEST(virtual_local_rank_keeps_the_inherited_mapping)
{
	char *const cuda[] = { "CUDA_VISIBLE_DEVICES=4, 5", NULL };
	char *const hip[] = { "CUDA_VISIBLE_DEVICES=0,1", "HIP_VISIBLE_DEVICES=2,3", NULL };
	struct env_vars v = { .local_rank = 1, .role = "default", .master_addr = "h",
			      .run_id = "r", .virtual_local_rank = true };
	char **e = env_build(cuda, &v);

	ck_assert_str_eq(env_get(e, "CUDA_VISIBLE_DEVICES"), "5");
	ck_assert_str_eq(env_get(e, "LOCAL_RANK"), "0");
	env_free(e);
	e = env_build(hip, &v);
	ck_assert_str_eq(env_get(e, "CUDA_VISIBLE_DEVICES"), "3");
	ck_assert_str_eq(env_get(e, "HIP_VISIBLE_DEVICES"), "3");
	env_free(e);
	v.virtual_local_rank = false; /* plain mode leaves the inherited list alone */
	e = env_build(cuda, &v);
	ck_assert_str_eq(env_get(e, "CUDA_VISIBLE_DEVICES"), "4, 5");
	env_free(e);
}
END_TEST

/* Issue 11.7: $PYTHON no longer picks the interpreter; PYTHON_EXEC does. */
START_TEST(python_is_python_exec_else_python3)
{
	char *const with[] = { "PYTHON=/usr/bin/false", "PYTHON_EXEC=/opt/py/bin/python", NULL };
	char *const without[] = { "PYTHON=/usr/bin/false", NULL };
	char buf[PATH_MAX];

	ck_assert_str_eq(env_python(with, buf, sizeof(buf)), "/opt/py/bin/python");
	/* This test binary has no python3 beside it (build/tests/). */
	ck_assert_str_eq(env_python(without, buf, sizeof(buf)), "python3");
}
END_TEST

/* ---- --numa-binding on a fake sysfs tree ----------------------------------------- */

static char sysroot[64];

/* The directories above path, made in this process: a `mkdir -p` shell per
 * file (about 200 per test) outlasted the 10 s guard beside two CPU hogs
 * (make flake-hunt: 2 timeouts in 30 runs). */
static void make_parents(char *path)
{
	for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		ck_assert_msg(mkdir(path, 0700) == 0 || errno == EEXIST, "mkdir %s: %s", path,
			      strerror(errno));
		*p = '/';
	}
}

static void put(const char *rel, const char *text)
{
	char path[512];
	FILE *f;

	snprintf(path, sizeof(path), "%s%s", sysroot, rel);
	make_parents(path);
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

/* Node 0: cpus 0-7 (hyperthread pairs n, n+4; two L3 complexes {0,1,4,5} and
 * {2,3,6,7}), node 1: cpus 8-15, both on package 0; node 2: cpus 16-23 on
 * package 1. GPUs: two on node 0, two on node 1 (one says -1: node 0 in
 * torch's rule... here it is the first of node 1 by its numa_node file). */
static void fake_sysfs(int ngpus)
{
	static const char *const bdf[] = { "0000:17:00.0", "0000:3a:00.0", "0000:86:00.0",
					   "0000:af:00.0" };
	static const char *const node[] = { "0\n", "-1\n", "1\n", "1\n" };
	char rel[256], val[64];

	snprintf(sysroot, sizeof(sysroot), "/tmp/crun-sysfs-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(sysroot));
	put("/sys/devices/system/node/node0/cpulist", "0-7\n");
	put("/sys/devices/system/node/node1/cpulist", "8-15\n");
	put("/sys/devices/system/node/node2/cpulist", "16-23\n");
	for (int c = 0; c < 24; c++) {
		int sib = c % 8 < 4 ? c + 4 : c - 4;

		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
		snprintf(val, sizeof(val), "%d,%d\n", MIN(c, sib), MAX(c, sib));
		put(rel, val);
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
		put(rel, c < 16 ? "0\n" : "1\n");
		if (c >= 8)
			continue;
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index0/type", c);
		put(rel, "Instruction\n");
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index0/level", c);
		put(rel, "1\n");
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index1/type", c);
		put(rel, "Unified\n");
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index1/level", c);
		put(rel, "3\n");
		snprintf(rel, sizeof(rel), "/sys/devices/system/cpu/cpu%d/cache/index1/shared_cpu_list", c);
		put(rel, c % 4 < 2 ? "0-1,4-5\n" : "2-3,6-7\n");
	}
	for (int g = 0; g < ngpus; g++) {
		snprintf(rel, sizeof(rel), "/sys/bus/pci/drivers/nvidia/%s", bdf[g]);
		put(rel, "");
		snprintf(rel, sizeof(rel), "/sys/bus/pci/devices/%s/numa_node", bdf[g]);
		put(rel, node[g]);
	}
	put("/sys/bus/pci/drivers/nvidia/module", ""); /* not a PCI address: skipped */
}

static void rm_sysfs(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", sysroot);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(numa_binding_maps_gpus_to_cpus)
{
	static const struct {
		const char *mode;
		const char *want[4];
	} cases[] = {
		{ "node", { "0-7", "0-7", "8-15", "8-15" } },
		{ "socket", { "0-15", "0-15", "0-15", "0-15" } },
		{ "exclusive", { "0-1,4-5", "2-3,6-7", "8-9,12-13", "10-11,14-15" } },
		/* Node 1 has no cache files: every cpu is its own complex. */
		{ "core-complex", { "0-1,4-5", "2-3,6-7", "8", "9" } },
	};
	char **cpus = NULL;

	fake_sysfs(4);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		ck_assert_int_eq(numa_cpus_for_gpus(sysroot, cases[i].mode, 4, &cpus), 0);
		for (int g = 0; g < 4; g++)
			ck_assert_msg(strcmp(cpus[g], cases[i].want[g]) == 0, "%s gpu %d: %s != %s",
				      cases[i].mode, g, cpus[g], cases[i].want[g]);
		numa_free(cpus, 4);
	}
	ck_assert_int_eq(numa_cpus_for_gpus(sysroot, "node", 5, &cpus), CRUN_ENOENT);
	ck_assert_int_eq(numa_cpus_for_gpus(sysroot, "nodes", 1, &cpus), CRUN_EINVAL);
	rm_sysfs();
	fake_sysfs(0);
	ck_assert_int_eq(numa_cpus_for_gpus(sysroot, "node", 1, &cpus), CRUN_ENOENT);
	rm_sysfs();
}
END_TEST

START_TEST(cpulists_parse)
{
	cpu_set_t s;

	ck_assert_int_eq(numa_parse_cpulist("0-2,5\n", &s), 0);
	ck_assert_int_eq(CPU_COUNT(&s), 4);
	ck_assert(CPU_ISSET(5, &s) && !CPU_ISSET(3, &s));
	ck_assert_int_eq(numa_parse_cpulist("3-1", &s), CRUN_EINVAL);
	ck_assert_int_eq(numa_parse_cpulist("x", &s), CRUN_EINVAL);
	ck_assert_int_eq(numa_parse_cpulist("99999", &s), CRUN_EINVAL);
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

/* /proc/<pid>/stat as the orphan sweep reads it: a comm with spaces and
 * parentheses does not shift the fields. */
START_TEST(proc_stat_fields_parse)
{
	pid_t ppid = 0, pgrp = 0;
	char state = 0;

	ck_assert_int_eq(orphans_parse_stat("42 (python3) S 7 42 42 0 -1", &ppid, &pgrp, &state),
			 0);
	ck_assert_int_eq(ppid, 7);
	ck_assert_int_eq(pgrp, 42);
	ck_assert_int_eq(state, 'S');
	ck_assert_int_eq(orphans_parse_stat("9 (a) b) (c) Z 1 3 3 0", &ppid, &pgrp, &state), 0);
	ck_assert_int_eq(ppid, 1);
	ck_assert_int_eq(pgrp, 3);
	ck_assert_int_eq(state, 'Z');
	ppid = 5;
	ck_assert_int_eq(orphans_parse_stat("9 (no close", &ppid, &pgrp, &state), CRUN_EINVAL);
	ck_assert_int_eq(orphans_parse_stat("9 (x) R", &ppid, &pgrp, &state), CRUN_EINVAL);
	ck_assert_int_eq(ppid, 5); /* untouched on failure */
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
	tcase_add_test(tc, a_failure_stops_the_others_one_monitor_interval_later);
	tcase_add_test(tc, summary_matches_torchruns_layout);
	tcase_add_test(tc, summary_with_one_failure_says_no_other_failures);
	tcase_add_test(tc, prefix_templates_expand);
	tcase_add_test(tc, env_has_torchruns_variables_and_keeps_the_rest);
	tcase_add_test(tc, argv_substitutes_local_rank);
	tcase_add_test(tc, virtual_local_rank_keeps_the_inherited_mapping);
	tcase_add_test(tc, python_is_python_exec_else_python3);
	tcase_add_test(tc, numa_binding_maps_gpus_to_cpus);
	tcase_add_test(tc, cpulists_parse);
	tcase_add_test(tc, signal_lists_parse);
	tcase_add_test(tc, proc_stat_fields_parse);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(agent_core_suite)
