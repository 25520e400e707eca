/* test_heartbeat.c: crun_heartbeat() moves the mtime of $CRUN_HEARTBEAT_FILE
 * (the agent's --worker_heartbeat_timeout watches it), creates the file when
 * missing and does nothing when nobody watches. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "agent/agent.h"
#include "crun/worker.h"

START_TEST(beat_moves_the_mtime)
{
	struct timespec old[2] = { { .tv_sec = 1000000000 }, { .tv_sec = 1000000000 } };
	char path[64];
	struct stat st;

	snprintf(path, sizeof(path), "/tmp/crun-hb-%d", (int)getpid());
	unlink(path);
	unsetenv("CRUN_HEARTBEAT_FILE");
	ck_assert_int_eq(crun_heartbeat(), 0); /* nobody watches */
	ck_assert_int_ne(access(path, F_OK), 0);
	setenv("CRUN_HEARTBEAT_FILE", path, 1);
	ck_assert_int_eq(crun_heartbeat(), 0); /* created */
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_eq(utimensat(AT_FDCWD, path, old, 0), 0);
	ck_assert_int_eq(crun_heartbeat(), 0);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_int_gt(st.st_mtim.tv_sec, time(NULL) - 60);
	unlink(path);
	setenv("CRUN_HEARTBEAT_FILE", "/nonexistent-dir/x/hb", 1);
	ck_assert_int_lt(crun_heartbeat(), 0);
}
END_TEST

/* The agent's pure rule: the stalest watched worker past the timeout. */
START_TEST(silent_worker_rule)
{
	uint64_t seen[4] = { 100000, 98000, 97500, 99900 };
	bool all[4] = { true, true, true, true }, some[4] = { true, true, false, true };

	ck_assert_int_eq(heartbeat_silent(seen, all, 4, 100500, 4000), -1);
	ck_assert_int_eq(heartbeat_silent(seen, all, 4, 100000, 2000), 2);  /* 2.5 s > 2 s */
	ck_assert_int_eq(heartbeat_silent(seen, some, 4, 100000, 1000), 1); /* 2 unwatched */
	ck_assert_int_eq(heartbeat_silent(seen, all, 4, 100000, 2500), -1); /* not past it */
	ck_assert_int_eq(heartbeat_silent(seen, all, 0, 100000, 1), -1);
}
END_TEST

/* A beat is a change of the mtime, either way: a wall-clock step of -1 h
 * (the file's next mtime is an hour older) is a beat, not silence, and a
 * step of +1 h is one beat, not an hour of silence. */
START_TEST(mtime_change_either_way_is_a_beat)
{
	struct timespec last = { .tv_sec = 1700000000, .tv_nsec = 5 };
	struct timespec same = last, back = { .tv_sec = 1700000000 - 3600 },
			ahead = { .tv_sec = 1700000000 + 3600 };

	ck_assert_uint_eq(heartbeat_observe(&last, &same, 1000, 9000), 1000);
	ck_assert_uint_eq(heartbeat_observe(&last, &back, 1000, 9000), 9000);
	ck_assert_int_eq(last.tv_sec, back.tv_sec);
	ck_assert_uint_eq(heartbeat_observe(&last, &ahead, 9000, 9500), 9500);
	ck_assert_int_eq(last.tv_sec, ahead.tv_sec);
	ck_assert_uint_eq(heartbeat_observe(&last, &ahead, 9500, 20000), 9500);
}
END_TEST

static Suite *heartbeat_suite(void)
{
	Suite *s = suite_create("heartbeat");
	TCase *tc = tcase_create("sdk");

	tcase_add_test(tc, beat_moves_the_mtime);
	tcase_add_test(tc, silent_worker_rule);
	tcase_add_test(tc, mtime_change_either_way_is_a_beat);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(heartbeat_suite)
