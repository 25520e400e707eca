/* clock_shift.so: an LD_PRELOAD shim for tests that step the wall clock of
 * one process without root or a time namespace. CLOCK_REALTIME (and its
 * coarse and alarm variants), gettimeofday() and time() read
 * CRUN_TEST_CLOCK_SHIFT_S seconds (signed) off the real clock; monotonic
 * clocks and the kernel's own times (file mtimes) are left alone, as a real
 * `date -s` would leave them. With CRUN_TEST_CLOCK_SHIFT_FILE the step
 * happens when that file appears. The constructor removes LD_PRELOAD and the
 * shift from the environment, so only the process it was preloaded into
 * (the agent) sees the shifted clock, not the workers it starts.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* The build hides symbols by default; these must interpose. */
#define SHIM __attribute__((visibility("default")))

static long shift_s;
static char step_file[4096]; /* the shift starts once this exists; "": at once */

__attribute__((constructor)) static void clock_shift_init(void)
{
	const char *s = getenv("CRUN_TEST_CLOCK_SHIFT_S");
	const char *f = getenv("CRUN_TEST_CLOCK_SHIFT_FILE");

	shift_s = s ? strtol(s, NULL, 10) : 0;
	if (f && strlen(f) < sizeof(step_file))
		memcpy(step_file, f, strlen(f) + 1);
	unsetenv("CRUN_TEST_CLOCK_SHIFT_S");
	unsetenv("CRUN_TEST_CLOCK_SHIFT_FILE");
	unsetenv("LD_PRELOAD");
}

/* A step in the middle of a run: the test creates the file. Once seen, for
 * good (one access() per call until then). */
static long shift_now(void)
{
	static volatile int stepped;

	if (!stepped && (!step_file[0] || access(step_file, F_OK) == 0))
		stepped = 1;
	return stepped ? shift_s : 0;
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
		ts->tv_sec += shift_now();
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
