/* clock_shift.so: an LD_PRELOAD shim for tests that step the wall clock of
 * one process without root or a time namespace. CLOCK_REALTIME (and its
 * coarse and alarm variants), gettimeofday() and time() read
 * CRUN_TEST_CLOCK_SHIFT_S seconds (signed) off the real clock; monotonic
 * clocks and the kernel's own times (file mtimes) are left alone, as a real
 * `date -s` would leave them. The constructor removes LD_PRELOAD and the
 * shift from the environment, so only the process it was preloaded into
 * (the agent) sees the shifted clock, not the workers it starts.
 */
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The build hides symbols by default; these must interpose. */
#define SHIM __attribute__((visibility("default")))

static long shift_s;

__attribute__((constructor)) static void clock_shift_init(void)
{
	const char *s = getenv("CRUN_TEST_CLOCK_SHIFT_S");

	shift_s = s ? strtol(s, NULL, 10) : 0;
	unsetenv("CRUN_TEST_CLOCK_SHIFT_S");
	unsetenv("LD_PRELOAD");
}

static int is_wall(clockid_t id)
{
	return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_REALTIME_ALARM;
}

SHIM int clock_gettime(clockid_t id, struct timespec *ts)
{
	/* The raw system call: the shim needs no symbol lookup of the real one. */
	long r = syscall(SYS_clock_gettime, id, ts);

	if (r == 0 && is_wall(id))
		ts->tv_sec += shift_s;
	return (int)r;
}

SHIM int gettimeofday(struct timeval *restrict tv, void *restrict tz)
{
	struct timespec ts;

	(void)tz;
	if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
		return -1;
	tv->tv_sec = ts.tv_sec; /* glibc declares tv nonnull */
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

SHIM time_t time(time_t *t)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
		return (time_t)-1;
	if (t)
		*t = ts.tv_sec;
	return ts.tv_sec;
}
