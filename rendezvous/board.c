/* board.c: the job board (rdzv.h): a node's ask for every node's stacks and
 * the answers, as keys of the job in the rendezvous store. The key names
 * are pure; the gather runs on a helper thread (c10d.c's third slot) and the
 * answering on the lease monitor's thread (monitor.c), which watches for the
 * next ask in the same request that watches its round: no extra request, no
 * poll. The stacks themselves are captured on the loop (agent/stacks.c),
 * which the monitor asks through a nudge and a bounded wait.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"

/* The monitor waits this long for the loop's answer: a capture takes
 * STACKS_DEADLINE_MS, a loop busy with a stop a little more. */
#define BOARD_ANSWER_WAIT_MS 5000u
#define BOARD_ASK_PREFIX     "stacks/ask/"

int rdzv_board_ask_key(char *buf, size_t cap, int64_t ask)
{
	return str_printf(buf, cap, BOARD_ASK_PREFIX "%" PRId64, ask) < 0 ? CRUN_ERANGE : 0;
}

uint32_t rdzv_board_wait_ms(uint32_t wait_ms)
{
	return wait_ms ? MIN(wait_ms, RDZV_BOARD_GATHER_MAX_MS) : RDZV_BOARD_GATHER_MS;
}

int rdzv_board_answer_key(char *buf, size_t cap, int64_t ask, int group_rank)
{
	return str_printf(buf, cap, "stacks/%" PRId64 "/%d", ask, group_rank) < 0 ? CRUN_ERANGE : 0;
}

int c10d_job_gather(struct c10d_job *j, struct coord *c)
{
	uint64_t deadline;
	int64_t cur = 0;
	char key[64];
	int r;

	j->answers = calloc((size_t)MAX(j->nnodes, 1), sizeof(*j->answers));
	if (!j->answers)
		return CRUN_ENOMEM;
	/* The cap is looked at before the ticket: a refused ask writes no key.
	 * Concurrent askers may pass it together, by as many as they are. */
	r = coord_add(c, RDZV_BOARD_ASKS, 0, &cur);
	if (r < 0)
		return c10d_jfail(j, c, r, "cannot read the job board's ask counter");
	if (cur >= RDZV_BOARD_ASKS_MAX) {
		snprintf(j->err, sizeof(j->err), "the job board holds %d asks already (its cap)",
			 RDZV_BOARD_ASKS_MAX);
		return CRUN_ETOOBIG;
	}
	r = coord_ticket(c, RDZV_BOARD_ASKS, BOARD_ASK_PREFIX, j->why, &j->ask);
	if (r < 0)
		return c10d_jfail(j, c, r, "cannot post an ask on the job board");
	deadline = clock_now_ms() + j->gather_ms;
	log_at(LL_DEBUG, SUB_RDZV, "job board: ask %" PRId64 " posted; gathering %d nodes", j->ask,
	       j->nnodes);
	/* One wait per node under one deadline: the answers come in about
	 * together (every node captures at once), so the later waits are short. */
	for (int g = 0; g < j->nnodes && !helper_stopping(&j->h); g++) {
		uint64_t now = clock_now_ms();

		TRY(rdzv_board_answer_key(key, sizeof(key), j->ask, g));
		r = coord_get(c, key, (uint32_t)(deadline > now ? deadline - now : 1),
			      &j->answers[g]);
		if (r < 0 && r != CRUN_ETIMEDOUT)
			return c10d_jfail(j, c, r, "cannot read an answer from the job board");
		if (r < 0)
			j->answers[g] = NULL;
	}
	return 0;
}

int c10d_board_next(struct c10d_job *j, struct coord *c, char *buf, size_t cap)
{
	int64_t seen = atomic_load(&j->ask_seen);

	if (seen < 0) {
		TRY(coord_add(c, RDZV_BOARD_ASKS, 0, &seen));
		atomic_store(&j->ask_seen, seen);
		log_at(LL_DEBUG, SUB_RDZV,
		       "job board: %" PRId64 " asks so far; watching for the next", seen);
	}
	return rdzv_board_ask_key(buf, cap, seen + 1);
}

/* Waits (bounded) for the loop's answer; true when it came. */
static bool wait_answer(struct c10d_job *j, int64_t ask, char **ret)
{
	uint64_t until = clock_now_ms() + BOARD_ANSWER_WAIT_MS;
	bool got;

	pthread_mutex_lock(&j->mu);
	/* Slices, so that a monitor the loop dropped meanwhile ends soon. */
	while (j->answered != ask && !helper_stopping(&j->h) && clock_now_ms() < until) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		(void)pthread_cond_timedwait(&j->cv, &j->mu, &ts);
	}
	got = j->answered == ask;
	*ret = got ? j->answer : NULL; /* taken */
	if (got)
		j->answer = NULL;
	pthread_mutex_unlock(&j->mu);
	return got;
}

int c10d_board_answer(struct c10d_job *j, struct coord *c)
{
	int64_t ask = atomic_load(&j->ask_seen) + 1;
	char key[64], *answer = NULL;
	uint64_t t0 = clock_now_ms(), t1;
	int r = 0;

	log_at(LL_DEBUG, SUB_RDZV, "job board: ask %" PRId64 " seen; asking the loop", ask);
	atomic_store(&j->ask_pending, ask);
	helper_nudge(&j->h);
	if (wait_answer(j, ask, &answer) && answer) {
		t1 = clock_now_ms();
		r = rdzv_board_answer_key(key, sizeof(key), ask, j->info.group_rank);
		if (r == 0)
			r = coord_set(c, key, answer);
		log_at(LL_DEBUG, SUB_RDZV,
		       "job board: answer to ask %" PRId64 " stored (%d): %" PRIu64
		       " ms for the loop, %" PRIu64 " ms for the store",
		       ask, r, t1 - t0, clock_now_ms() - t1);
	}
	atomic_store(&j->ask_pending, 0);
	atomic_store(&j->ask_seen, ask);
	free(answer);
	return r;
}

void c10d_board_on_nudge(struct c10d_job *j, char *(*fn)(int64_t ask, void *arg), void *arg)
{
	int64_t ask = atomic_exchange(&j->ask_pending, 0);
	char *answer;

	if (ask <= 0)
		return;
	answer = fn ? fn(ask, arg) : NULL;
	pthread_mutex_lock(&j->mu);
	free(j->answer);
	j->answer = answer;
	j->answered = ask;
	pthread_cond_signal(&j->cv);
	pthread_mutex_unlock(&j->mu);
}
