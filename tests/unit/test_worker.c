/* test_worker.c: the worker SDK's public API: argument checking that needs
 * no peers, crun_init()'s environment parsing, and small real jobs: the test
 * forks N ranks that call crun_init_explicit() with rank 0 hosting the store
 * in-process (PyTorch's non-agent mode), run collectives on shared memory
 * or TCP, and report through their exit codes. The full collective matrix
 * runs in tests/integration/test_collectives.py.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "common/common.h"
#include "crun/worker.h"

START_TEST(dtype_sizes_match_the_types)
{
	ck_assert_uint_eq(crun_dtype_size(CRUN_F32), 4);
	ck_assert_uint_eq(crun_dtype_size(CRUN_F64), 8);
	ck_assert_uint_eq(crun_dtype_size(CRUN_F16), 2);
	ck_assert_uint_eq(crun_dtype_size(CRUN_BF16), 2);
	ck_assert_uint_eq(crun_dtype_size(CRUN_I8), 1);
	ck_assert_uint_eq(crun_dtype_size(CRUN_U8), 1);
	ck_assert_uint_eq(crun_dtype_size(CRUN_I32), 4);
	ck_assert_uint_eq(crun_dtype_size(CRUN_I64), 8);
	ck_assert_uint_eq(crun_dtype_size(CRUN_DTYPE__MAX), 0);
	ck_assert_uint_eq(crun_dtype_size(-1), 0);
}
END_TEST

START_TEST(calls_without_a_group_are_invalid)
{
	float x = 0;
	crun_pg_t *pg = (crun_pg_t *)&x;
	int ranks[1] = {0};

	ck_assert_int_eq(crun_all_reduce(NULL, &x, &x, 1, CRUN_F32, CRUN_SUM, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_broadcast(NULL, &x, 1, CRUN_F32, 0, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_all_gather(NULL, &x, &x, 1, CRUN_F32, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_barrier(NULL, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_pg_abort(NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_work_wait(NULL), CRUN_EINVAL);
	crun_work_free(NULL);
	crun_pg_free(NULL);
	ck_assert_ptr_null(crun_world());
	ck_assert_int_eq(crun_rank(), -1);
	ck_assert_int_eq(crun_pg_new(ranks, 1, "cpu", &pg), CRUN_EINVAL); /* not initialised */
	crun_finalize(); /* not initialised: a no-op */
}
END_TEST

START_TEST(init_from_env_needs_the_torchrun_variables)
{
	unsetenv("RANK");
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "1", 1);
	ck_assert_int_eq(crun_init(), CRUN_ECONFIG);
	setenv("RANK", "x", 1);
	ck_assert_int_eq(crun_init(), CRUN_ECONFIG);
	setenv("RANK", "5", 1);
	ck_assert_int_eq(crun_init(), CRUN_EINVAL); /* rank outside the world */
	setenv("RANK", "0", 1);
	setenv("MASTER_PORT", "70000", 1);
	ck_assert_int_eq(crun_init(), CRUN_ECONFIG);
	setenv("MASTER_PORT", "1", 1);
	setenv("CRUN_PG_BACKEND", "nccl", 1);
	ck_assert_int_eq(crun_init(), CRUN_ENOTSUP); /* no NCCL backend in this build */
	setenv("CRUN_PG_BACKEND", "bogus", 1);
	ck_assert_int_eq(crun_init(), CRUN_EINVAL);
}
END_TEST

static int free_port(void)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	port = ntohs(sin.sin_port);
	close(fd);
	return port;
}

/* One rank: world all_reduce, a subgroup of ranks {n-1, 0}, async work and
 * send/recv; 0 on success, a distinct code per failed step. */
static int rank_main(int rank, int n, int port)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;
	int64_t v = rank + 1, want = (int64_t)n * (n + 1) / 2;
	int pair[2] = {n - 1, 0};
	crun_pg_t *sub = NULL;
	crun_work_t *w;
	double d[3] = {rank, rank, rank};

	o.rank = rank;
	o.world_size = n;
	o.master_port = (uint16_t)port;
	o.use_agent_store = 0; /* rank 0 hosts the store */
	o.timeout_ms = 20000;
	if (crun_init_explicit(&o) < 0)
		return 10;
	if (crun_init_explicit(&o) != CRUN_EALREADY)
		return 11;
	if (crun_rank() != rank || crun_world_size() != n || crun_pg_size(crun_world()) != n)
		return 12;
	if (crun_all_reduce(crun_world(), &v, &v, 1, CRUN_I64, CRUN_SUM, NULL) < 0 || v != want)
		return 13;
	if (crun_pg_new(pair, n > 1 ? 2 : 1, "cpu", &sub) < 0)
		return 14;
	if ((rank == 0 || rank == n - 1) != (sub != NULL))
		return 15;
	if (sub) {
		v = rank;
		if (crun_all_reduce(sub, &v, &v, 1, CRUN_I64, CRUN_MAX, NULL) < 0 || v != n - 1)
			return 16;
		if (crun_pg_rank(sub) != (rank == 0 && n > 1 ? 1 : 0))
			return 17;
	}
	if (crun_all_reduce(crun_world(), d, d, 3, CRUN_F64, CRUN_AVG, &w) < 0)
		return 18;
	if (crun_work_wait(w) < 0 || d[2] != (double)(n - 1) / 2)
		return 19;
	crun_work_free(w);
	if (n > 1 && rank < 2) {
		int32_t msg = rank == 0 ? 42 : 0;

		if (rank == 0 && crun_send(crun_world(), &msg, 1, CRUN_I32, 1, NULL) < 0)
			return 20;
		if (rank == 1 &&
		    (crun_recv(crun_world(), &msg, 1, CRUN_I32, 0, NULL) < 0 || msg != 42))
			return 21;
	}
	if (crun_send(crun_world(), &v, 1, CRUN_I64, rank, NULL) != CRUN_EINVAL)
		return 22; /* to self */
	if (crun_all_reduce(crun_world(), &v, &v, 1, CRUN_I64, 99, NULL) != CRUN_EINVAL)
		return 23;
	crun_pg_free(sub);
	crun_finalize();
	return 0;
}

/* Forks n ranks, waits up to 60 s, kills what is left; asserts all passed. */
static void run_job(int n, const char *transport)
{
	int port = free_port();
	pid_t pids[8];

	for (int r = 0; r < n; r++) {
		pids[r] = fork();
		if (pids[r] == 0) { /* no Check call here: Check's message file is shared */
			if (transport)
				setenv("CRUN_PG_TRANSPORT", transport, 1);
			_exit(rank_main(r, n, port));
		}
		ck_assert_int_ge(pids[r], 0);
	}
	for (int r = 0; r < n; r++) {
		int status = 0;
		uint64_t deadline = clock_now_ms() + 60000;
		pid_t got;

		while ((got = waitpid(pids[r], &status, WNOHANG)) == 0 && clock_now_ms() < deadline)
			usleep(10000);
		if (got == 0) {
			for (int k = 0; k < n; k++)
				kill(pids[k], SIGKILL);
			while (wait(NULL) > 0)
				;
			ck_abort_msg("rank %d did not finish", r);
		}
		ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
			      "rank %d failed with status %d", r, status);
	}
}

START_TEST(a_self_hosted_job_runs_collectives_over_shared_memory)
{
	run_job(3, "shm");
}
END_TEST

START_TEST(a_self_hosted_job_runs_collectives_over_tcp)
{
	run_job(3, "tcp");
}
END_TEST

START_TEST(a_single_rank_job_needs_no_peers)
{
	run_job(1, NULL);
}
END_TEST

/* The option struct as first released ends with store_dialect; a program
 * built then passes that struct_size (smaller than today's sizeof once
 * fields are appended, and without the trailing padding even now). The
 * append-only ABI: accept it and default the missing tail; reject less. */
#define FIRST_OPTS_SIZE (offsetof(crun_init_opts_t, store_dialect) + sizeof(int))

static int old_abi_main(int port)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;
	int64_t v = 7;

	o.world_size = 1;
	o.master_port = (uint16_t)port;
	o.use_agent_store = 0;
	o.timeout_ms = 20000;
	o.struct_size = FIRST_OPTS_SIZE - 1;
	if (crun_init_explicit(&o) != CRUN_EINVAL)
		return 30; /* shorter than the first version: rejected */
	o.struct_size = FIRST_OPTS_SIZE;
	if (crun_init_explicit(&o) < 0)
		return 31;
	if (crun_rank() != 0 || crun_world_size() != 1)
		return 32;
	if (crun_all_reduce(crun_world(), &v, &v, 1, CRUN_I64, CRUN_SUM, NULL) < 0 || v != 7)
		return 33;
	crun_finalize();
	return 0;
}

START_TEST(an_option_struct_of_the_first_version_is_accepted)
{
	int port = free_port(), status = 0;
	pid_t pid = fork();

	if (pid == 0)
		_exit(old_abi_main(port)); /* crun_init_explicit keeps process state */
	ck_assert_int_ge(pid, 0);
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
}
END_TEST

static Suite *worker_suite(void)
{
	Suite *s = suite_create("worker");
	TCase *api = tcase_create("api"), *job = tcase_create("job");

	tcase_set_timeout(api, 10);
	tcase_add_test(api, dtype_sizes_match_the_types);
	tcase_add_test(api, calls_without_a_group_are_invalid);
	tcase_add_test(api, init_from_env_needs_the_torchrun_variables);
	suite_add_tcase(s, api);
	tcase_set_timeout(job, 90);
	tcase_add_test(job, a_self_hosted_job_runs_collectives_over_shared_memory);
	tcase_add_test(job, a_self_hosted_job_runs_collectives_over_tcp);
	tcase_add_test(job, a_single_rank_job_needs_no_peers);
	tcase_add_test(job, an_option_struct_of_the_first_version_is_accepted);
	suite_add_tcase(s, job);
	return s;
}

CRUN_CHECK_MAIN(worker_suite)
