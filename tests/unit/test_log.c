/* test_log.c: common/log.c's levels: the names that select them, NOTICE
 * between WARN and INFO (issue 22.2), the journald priorities written when
 * stderr is the journal, and the public levels a host program sees. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "common/common.h"

START_TEST(names_select_levels_notice_between_warn_and_info)
{
	ck_assert_int_eq(log_level_from_name("critical"), LL_ERROR);
	ck_assert_int_eq(log_level_from_name("WARNING"), LL_WARN);
	ck_assert_int_eq(log_level_from_name("warn"), LL_WARN);
	ck_assert_int_eq(log_level_from_name("notice"), LL_NOTICE);
	ck_assert_int_eq(log_level_from_name("Info"), LL_INFO);
	ck_assert_int_eq(log_level_from_name("trace"), LL_TRACE);
	ck_assert_int_eq(log_level_from_name("noisy"), -1);
	ck_assert_int_eq(log_level_from_name(""), -1);
	ck_assert_int_lt(LL_WARN, LL_NOTICE);
	ck_assert_int_lt(LL_NOTICE, LL_INFO);
}
END_TEST

static crun_log_level_t got_level;
static int got_calls;

static void take(crun_log_level_t level, const char *line, void *arg)
{
	(void)line;
	(void)arg;
	got_level = level;
	got_calls++;
}

/* A host's handler knows only the public levels: NOTICE arrives as INFO,
 * and its CRUN_LOG_WARN keeps notices out as it always kept INFO out. */
START_TEST(a_host_sees_notice_as_info_and_warn_hides_it)
{
	crun_set_log_handler(take, NULL);
	crun_set_log_level(CRUN_LOG_WARN);
	log_at(LL_NOTICE, SUB_ALL, "round %d complete", 0);
	ck_assert_int_eq(got_calls, 0);
	log_at(LL_WARN, SUB_ALL, "a warning");
	ck_assert_int_eq(got_calls, 1);
	ck_assert_int_eq(got_level, CRUN_LOG_WARN);
	crun_set_log_level(CRUN_LOG_INFO);
	log_at(LL_NOTICE, SUB_ALL, "round %d complete", 0);
	ck_assert_int_eq(got_calls, 2);
	ck_assert_int_eq(got_level, CRUN_LOG_INFO);
	log_at(LL_DEBUG, SUB_ALL, "hidden");
	ck_assert_int_eq(got_calls, 2);
	crun_set_log_level(CRUN_LOG_TRACE);
	log_at(LL_TRACE, SUB_ALL, "shown");
	ck_assert_int_eq(got_level, CRUN_LOG_TRACE);
	crun_set_log_handler(NULL, NULL);
}
END_TEST

/* stderr on a file whose dev:ino is $JOURNAL_STREAM, as systemd sets it. */
START_TEST(the_journal_gets_syslog_priorities_notice_is_5)
{
	static const struct {
		int level;
		const char *prefix;
	} want[] = {{LL_ERROR, "<3>"},
		    {LL_WARN, "<4>"},
		    {LL_NOTICE, "<5>"},
		    {LL_INFO, "<6>"},
		    {LL_DEBUG, "<7>"}};
	char path[] = "/tmp/crun-test-log-XXXXXX", js[64], line[256];
	struct stat st;
	FILE *f;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
	snprintf(js, sizeof(js), "%llu:%llu", (unsigned long long)st.st_dev,
		 (unsigned long long)st.st_ino);
	ck_assert_int_eq(setenv("JOURNAL_STREAM", js, 1), 0);
	ck_assert_int_eq(unsetenv("CRUN_LOG_LEVEL"), 0);
	log_init("t", LL_DEBUG);
	for (size_t i = 0; i < ARRAY_SIZE(want); i++)
		log_at(want[i].level, SUB_ALL, "level %d", want[i].level);
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	for (size_t i = 0; i < ARRAY_SIZE(want); i++) {
		char expect[64];

		ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
		snprintf(expect, sizeof(expect), "%st: level %d\n", want[i].prefix, want[i].level);
		ck_assert_str_eq(line, expect);
	}
	fclose(f);
	unlink(path);
	close(fd);
}
END_TEST

/* Without the journal: one letter per level, N for NOTICE. */
START_TEST(a_terminal_line_carries_the_levels_letter)
{
	char path[] = "/tmp/crun-test-log-XXXXXX", line[256], expect[64];
	FILE *f;
	int fd = mkstemp(path);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
	ck_assert_int_eq(unsetenv("JOURNAL_STREAM"), 0);
	ck_assert_int_eq(setenv("CRUN_LOG_LEVEL", "notice", 1), 0);
	log_init("t", LL_ERROR);
	log_at(LL_NOTICE, SUB_ALL, "round 3 complete");
	log_at(LL_INFO, SUB_ALL, "hidden at notice");
	f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
	snprintf(expect, sizeof(expect), "t[%d] N round 3 complete\n", (int)getpid());
	ck_assert_str_eq(line, expect);
	ck_assert_ptr_null(fgets(line, sizeof(line), f));
	fclose(f);
	unlink(path);
	close(fd);
}
END_TEST

static Suite *log_suite(void)
{
	Suite *s = suite_create("log");
	TCase *tc = tcase_create("levels");

	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, names_select_levels_notice_between_warn_and_info);
	tcase_add_test(tc, a_host_sees_notice_as_info_and_warn_hides_it);
	tcase_add_test(tc, the_journal_gets_syslog_priorities_notice_is_5);
	tcase_add_test(tc, a_terminal_line_carries_the_levels_letter);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(log_suite)
