/* test_backend.c: the process-group code drives whatever struct pg_backend
 * it is given. A fake GPU object (fake_backend.c, loaded the way
 * libcrun-cuda.so.0 is, through CRUN_CUDA_LIB) stands in for NCCL, so the
 * nccl path runs without CUDA: the door and its ABI check, dispatch, abort,
 * a backend failure that breaks the group, the reason crun_pg_last_error(NULL)
 * gives, and subgroups split from the world (non-members take part too).
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "crun/worker.h"

struct fake_stats {
	int inits, splits, split_skips, finis, collectives, aborts;
	int deferred, marks, tests, waits, tokens_freed;
};

static char fake_path[4200];

/* libfake_backend.so sits next to this test binary. */
static void use_fake(const char *knobs)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);

	ck_assert_int_gt(n, 0);
	exe[n] = '\0';
	*strrchr(exe, '/') = '\0';
	snprintf(fake_path, sizeof(fake_path), "%s/libfake_backend.so", exe);
	ck_assert_int_eq(access(fake_path, R_OK), 0);
	setenv("CRUN_CUDA_LIB", fake_path, 1);
	setenv("FAKE_BACKEND", knobs, 1);
}

static const struct fake_stats *stats(void)
{
	void *h = dlopen(fake_path, RTLD_NOW | RTLD_NOLOAD);
	const struct fake_stats *(*fn)(void);

	ck_assert_ptr_nonnull(h); /* the SDK has loaded it */
	fn = (const struct fake_stats *(*)(void))dlsym(h, "fake_backend_stats");
	ck_assert_ptr_nonnull(fn);
	dlclose(h);
	return fn();
}

/* A port free on every address: the store listens on the wildcard, and on a
 * busy host a loopback-only probe can return a port some other address
 * (127.0.0.4, a test namespace) still holds in TIME_WAIT. */
static int free_port(void)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	port = ntohs(sin.sin_port);
	close(fd);
	return port;
}

static int init(int rank, int world, int port, const char *backend)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;

	o.rank = rank;
	o.world_size = world;
	o.master_port = (uint16_t)port;
	o.use_agent_store = 0;
	o.timeout_ms = 20000;
	o.backend = backend;
	return crun_init_explicit(&o);
}

START_TEST(nccl_runs_on_the_loaded_backend_and_abort_reaches_it)
{
	float x[4] = {1, 2, 3, 4}, y[4] = {0};
	crun_work_t *w = NULL;

	use_fake("");
	ck_assert_int_eq(init(0, 1, free_port(), "nccl"), 0);
	ck_assert_int_eq(stats()->inits, 1);
	ck_assert_int_eq(crun_all_reduce(crun_world(), x, y, 4, CRUN_F32, CRUN_SUM, NULL), 0);
	ck_assert(!memcmp(x, y, sizeof(x))); /* the fake's group of one copies */
	ck_assert_int_eq(crun_broadcast(crun_world(), x, 4, CRUN_F32, 0, &w), 0);
	ck_assert_int_eq(crun_work_wait(w), 0); /* async work goes through it too */
	crun_work_free(w);
	ck_assert_int_eq(stats()->collectives, 2);
	ck_assert_int_eq(stats()->deferred, 1); /* enqueued on the caller's thread ... */
	ck_assert_int_eq(stats()->marks, 1);	/* ... with a token ... */
	ck_assert_int_eq(stats()->waits, 1);	/* ... that the wait asks about */
	ck_assert_int_eq(stats()->tokens_freed, 1);
	ck_assert_int_eq(crun_pg_abort(crun_world()), 0);
	ck_assert_int_eq(stats()->aborts, 1);
	ck_assert_int_eq(crun_barrier(crun_world(), NULL), CRUN_ECANCELED);
	crun_finalize();
	ck_assert_int_eq(stats()->finis, 1);
}
END_TEST

START_TEST(a_backend_failure_breaks_the_group_with_its_reason)
{
	float x = 1;

	use_fake("peer-dies");
	ck_assert_int_eq(init(0, 1, free_port(), "nccl"), 0);
	ck_assert_int_eq(crun_all_reduce(crun_world(), &x, &x, 1, CRUN_F32, CRUN_SUM, NULL),
			 CRUN_EPEER);
	ck_assert_str_eq(crun_pg_last_error(crun_world()), "fake: peer 1 vanished");
	ck_assert_int_eq(crun_barrier(crun_world(), NULL), CRUN_EPEER); /* sticks */
	ck_assert_int_eq(stats()->collectives, 1); /* without asking the backend again */
	crun_finalize();
}
END_TEST

START_TEST(async_work_is_settled_by_its_token)
{
	float x = 1;
	crun_work_t *w = NULL;
	int done = -1;

	use_fake("");
	ck_assert_int_eq(init(0, 1, free_port(), "nccl"), 0);
	ck_assert_int_eq(crun_all_reduce(crun_world(), &x, &x, 1, CRUN_F32, CRUN_SUM, &w), 0);
	ck_assert_int_eq(crun_work_test(w, &done), 0);
	ck_assert_int_eq(done, 0); /* the token says "not yet" once */
	ck_assert_int_eq(crun_work_test(w, &done), 0);
	ck_assert_int_eq(done, 1);
	ck_assert_int_eq(crun_work_wait(w), 0); /* settled: no second look */
	ck_assert_int_eq(stats()->waits, 0);
	ck_assert_int_eq(stats()->tokens_freed, 1);
	crun_work_free(w);
	crun_finalize();
}
END_TEST

START_TEST(a_failure_seen_by_a_token_breaks_the_group)
{
	float x = 1;
	crun_work_t *w = NULL;

	use_fake("token-fails");
	ck_assert_int_eq(init(0, 1, free_port(), "nccl"), 0);
	ck_assert_int_eq(crun_all_reduce(crun_world(), &x, &x, 1, CRUN_F32, CRUN_SUM, &w), 0);
	ck_assert_int_eq(crun_work_wait(w), CRUN_EPEER);
	ck_assert_int_eq(crun_work_wait(w), CRUN_EPEER); /* the same answer again */
	crun_work_free(w);
	ck_assert_str_eq(crun_pg_last_error(crun_world()), "fake: the stream saw peer 1 die");
	ck_assert_int_eq(crun_barrier(crun_world(), NULL), CRUN_EPEER);
	ck_assert_int_eq(stats()->collectives, 1);
	crun_finalize();
}
END_TEST

/* _i: 0 no device, 1 other ABI, 2 init fails, 3 the object is missing */
START_TEST(nccl_says_what_is_missing)
{
	static const char *const knobs[] = {"no-device", "old-abi", "init-fails", ""};
	static const char *const want[] = {"no CUDA-capable device", "ABI",
					   "no device for LOCAL_RANK 0", "/nonexistent"};

	use_fake(knobs[_i]);
	if (_i == 3)
		setenv("CRUN_CUDA_LIB", "/nonexistent/libcrun-cuda.so.0", 1);
	ck_assert_int_eq(init(0, 1, free_port(), "nccl"), CRUN_ENOTSUP);
	ck_assert_msg(strstr(crun_pg_last_error(NULL), want[_i]) != NULL, "reason '%s'",
		      crun_pg_last_error(NULL));
	ck_assert_ptr_null(crun_world());
	/* auto never fails for want of a GPU: cpu, here (no NVIDIA driver). */
	ck_assert_int_eq(init(0, 1, free_port(), "auto"), 0);
	crun_finalize();
}
END_TEST

/* Two ranks; group {1} split from the world: rank 0 sits out through
 * split_skip, rank 1 splits; a cpu group does neither. */
static int split_rank(int rank, int port)
{
	int one[1] = {1}, both[2] = {0, 1};
	crun_pg_t *pg = NULL, *cpu = NULL;

	if (init(rank, 2, port, "nccl") < 0)
		return 10;
	if (crun_pg_new(one, 1, "nccl", &pg) < 0 || (pg != NULL) != (rank == 1))
		return 11;
	if (stats()->split_skips != (rank == 0) || stats()->splits != (rank == 1))
		return 12;
	if (crun_pg_new(both, 2, "cpu", &cpu) < 0 || !cpu)
		return 13;
	if (stats()->split_skips + stats()->splits != 1 || stats()->inits != 1 + (rank == 1))
		return 14;
	crun_pg_free(cpu);
	crun_pg_free(pg);
	crun_finalize();
	return stats()->finis == 1 + (rank == 1) ? 0 : 15;
}

START_TEST(subgroups_split_from_the_world_on_every_world_rank)
{
	int port = free_port();
	pid_t pids[2];

	use_fake("");
	for (int r = 0; r < 2; r++) {
		pids[r] = fork();
		if (pids[r] == 0) /* no Check call in the child: it shares Check's message file */
			_exit(split_rank(r, port));
		ck_assert_int_ge(pids[r], 0);
	}
	for (int r = 0; r < 2; r++) {
		int st = 0;

		ck_assert_int_eq(waitpid(pids[r], &st, 0), pids[r]);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d", r, st);
	}
}
END_TEST

static Suite *backend_suite(void)
{
	Suite *s = suite_create("backend");
	TCase *tc = tcase_create("fake");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, nccl_runs_on_the_loaded_backend_and_abort_reaches_it);
	tcase_add_test(tc, a_backend_failure_breaks_the_group_with_its_reason);
	tcase_add_test(tc, async_work_is_settled_by_its_token);
	tcase_add_test(tc, a_failure_seen_by_a_token_breaks_the_group);
	tcase_add_loop_test(tc, nccl_says_what_is_missing, 0, 4);
	tcase_add_test(tc, subgroups_split_from_the_world_on_every_world_rank);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(backend_suite)
