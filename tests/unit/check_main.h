/* check_main.h: every tests/unit/test_*.c is its own Check binary; this
 * macro gives it a main() that runs the suites with CK_ENV verbosity, so
 * CK_RUN_SUITE, CK_RUN_CASE and CK_FORK=no (for gdb) work. */
#ifndef CRUN_TESTS_CHECK_MAIN_H
#define CRUN_TESTS_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

#define CRUN_CHECK_MAIN(...)                                                   \
	int main(void)                                                         \
	{                                                                      \
		Suite *(*suites[])(void) = { __VA_ARGS__ };                    \
		SRunner *sr = srunner_create(suites[0]());                     \
		int failed;                                                    \
                                                                               \
		for (size_t i = 1; i < sizeof(suites) / sizeof(suites[0]); i++) \
			srunner_add_suite(sr, suites[i]());                    \
		srunner_run_all(sr, CK_ENV);                                   \
		failed = srunner_ntests_failed(sr);                            \
		srunner_free(sr);                                              \
		return failed ? EXIT_FAILURE : EXIT_SUCCESS;                   \
	}

#endif
