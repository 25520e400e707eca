/* hb_worker: a C worker for --worker_heartbeat_timeout tests. Beats with
 * crun_heartbeat() every 50 ms for BEATS beats; then rank HANG (on the first
 * attempt only) stops beating and sleeps as if stuck in a collective, while
 * the others exit 0. Every sleep is bounded (30 s).
 *   hb_worker BEATS HANG
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "crun/worker.h"

static void nap_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	const char *rank_s = getenv("RANK"), *restart_s = getenv("TORCHELASTIC_RESTART_COUNT");
	int beats = argc > 1 ? atoi(argv[1]) : 10, hang = argc > 2 ? atoi(argv[2]) : -1;
	int rank = rank_s ? atoi(rank_s) : -1, restart = restart_s ? atoi(restart_s) : 0;

	for (int i = 0; i < beats; i++) {
		if (crun_heartbeat() < 0) {
			perror("crun_heartbeat");
			return 3;
		}
		nap_ms(50);
	}
	if (rank == hang && restart == 0) {
		printf("rank %d hangs\n", rank);
		fflush(stdout);
		nap_ms(30000);
		return 4;
	}
	printf("rank %d done after %d beats (file %s)\n", rank, beats,
	       getenv("CRUN_HEARTBEAT_FILE") ? "set" : "unset");
	return 0;
}
