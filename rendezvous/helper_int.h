/* helper_int.h: one blocking rendezvous job on its own thread, posting back
 * to the agent's loop through a pipe, shared by the static and c10d
 * backends. The loop (which may serve the store the job talks to) never
 * blocks: it starts a job, is called back when the job posts, and may drop a
 * job still blocked in a store call (the thread then frees it when the call
 * returns).
 *
 * A job embeds struct helper_job first; two references (the loop's and the
 * thread's), whoever drops the last one calls release().
 */
#ifndef CRUN_RENDEZVOUS_HELPER_INT_H
#define CRUN_RENDEZVOUS_HELPER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct event;
struct event_base;

struct helper_job {
	atomic_int refs;
	atomic_int stop;		       /* the loop no longer wants it: a long job ends */
	atomic_int posted;		       /* it posted at least once (no final post then) */
	int notify_fd;			       /* write end */
	int result;			       /* run()'s return value, read after the post */
	int (*run)(struct helper_job *j);      /* on the helper thread */
	void (*release)(struct helper_job *j); /* frees the enclosing job */
};

struct helper;
/* On the loop, after the job posted. The callee calls helper_finish() for a
 * job that ended, or leaves a long job (a monitor) running. */
typedef void (*helper_post_fn)(struct helper *h, void *arg);

/* Where a job runs instead of a pthread of its own: the embedder's hook
 * (crun_agent_config_t.run_blocking). NULL fn: a pthread. */
struct helper_runner {
	int (*fn)(void (*run)(void *job), void *job, void *arg);
	void *arg;
};

struct helper {
	struct event_base *base;
	struct helper_job *job; /* running, or NULL */
	struct helper_runner runner;
	bool threaded; /* job runs on thr (joined/detached), not on the runner */
	pthread_t thr;
	int rd;
	struct event *ev;
	helper_post_fn on_post;
	void *arg;
};

void helper_init(struct helper *h, struct event_base *base, helper_post_fn on_post, void *arg);
/* Makes later jobs run through `runner` (copied; NULL or a NULL fn: a
 * pthread each). */
void helper_use_runner(struct helper *h, const struct helper_runner *runner);
/* Starts j (refs, pipe, thread with every signal blocked). CRUN_EBUSY while
 * another job runs; on failure j is released. */
int helper_start(struct helper *h, struct helper_job *j);
/* Thread side: wakes the loop; the results written before it are visible. */
void helper_post(struct helper_job *j);
/* Thread side: wakes the loop without counting as the job's post (a long
 * job asking the loop something while it runs on). */
void helper_nudge(struct helper_job *j);
/* Loop side, for a job that ended after posting: joins its thread and hands
 * the loop's reference to the caller (helper_job_put when done). */
struct helper_job *helper_finish(struct helper *h);
/* Loop side: tells a running job to stop and forgets it (no wait). */
void helper_drop(struct helper *h);
/* helper_drop plus freeing the pipe and event. */
void helper_fini(struct helper *h);
void helper_job_put(struct helper_job *j);
static inline bool helper_stopping(struct helper_job *j)
{
	return atomic_load(&j->stop) != 0;
}

#endif /* CRUN_RENDEZVOUS_HELPER_INT_H */
