/* launch_worker.c: the worker of bench/launch_bench.py, run by crun and by
 * torchrun (--no_python) alike. Without arguments it exits 0 at once: the
 * trivial worker of the launch-time rows. With a FILE it records when it
 * started and, on attempt 0, fails: once every local rank has started (so a
 * whole live group must be stopped), local rank 0 exits 1 and the other ranks
 * wait to be stopped; the launcher must restart the group. Each
 * record is one appended line "S|E attempt local_rank pid monotonic_ns"; the
 * bench subtracts rank 0's E of attempt 0 from the first S of attempt 1.
 * "launch_worker hold FILE" records its start, waits until every local rank
 * has started, lingers HOLD_MS and exits 0: the agent then holds a full,
 * live group for a while (the memory runs sample it then).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"

#define WAIT_MAX_S  60 /* attempt-0 peers give up if nobody stops them */
#define PEERS_MAX_S 20 /* rank 0 fails anyway if its peers never all start */
#define HOLD_MS	    30 /* hold: how long the full group stays alive together */

static uint64_t env_u64(const char *name)
{
	const char *s = getenv(name);
	uint64_t v;

	if (!s || parse_u64(s, &v) < 0)
		return 0;
	return v;
}

/* Number of "S 0 " lines (attempt-0 starts) in the record file. */
static uint64_t count_starts(const char *path)
{
	char line[128];
	uint64_t n = 0;
	FILE *f = fopen(path, "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strncmp(line, "S 0 ", 4) == 0;
	fclose(f);
	return n;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	(void)clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* One write(2) of a short line to an O_APPEND file: lines of concurrent
 * workers never interleave. */
static void record(const char *path, char what, uint64_t attempt, uint64_t rank, uint64_t ns)
{
	char line[128];
	int fd, n;

	n = snprintf(line, sizeof(line), "%c %llu %llu %ld %llu\n", what,
		     (unsigned long long)attempt, (unsigned long long)rank, (long)getpid(),
		     (unsigned long long)ns);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (n > 0 && (size_t)n < sizeof(line))
		(void)!write(fd, line, (size_t)n);
	close(fd);
}

/* Bounded wait until every local rank has recorded its attempt-0 start. */
static void wait_peers(const char *path)
{
	uint64_t world = env_u64("LOCAL_WORLD_SIZE");

	for (int i = 0; i < PEERS_MAX_S * 1000 && count_starts(path) < world; i++)
		usleep(1000);
}

static void wait_all_started(const char *path, uint64_t start_ns)
{
	record(path, 'S', 0, env_u64("LOCAL_RANK"), start_ns);
	wait_peers(path);
}

int main(int argc, char **argv)
{
	uint64_t start_ns = mono_ns(); /* first thing: the replacement "started" */
	uint64_t attempt, rank;

	if (argc < 2)
		return 0;
	if (argc == 3 && strcmp(argv[1], "hold") == 0) {
		wait_all_started(argv[2], start_ns);
		usleep(HOLD_MS * 1000);
		return 0;
	}
	attempt = env_u64("TORCHELASTIC_RESTART_COUNT");
	rank = env_u64("LOCAL_RANK");
	record(argv[1], 'S', attempt, rank, start_ns);
	if (attempt != 0)
		return 0;
	if (rank == 0) {
		wait_peers(argv[1]);
		record(argv[1], 'E', attempt, rank, mono_ns());
		_exit(1);
	}
	/* Bounded: the launcher stops us long before this runs out. */
	for (int i = 0; i < WAIT_MAX_S * 100; i++)
		usleep(10000);
	return 0;
}
