/* heartbeat.c: --worker_heartbeat_timeout. Each worker of an attempt gets a
 * file (<attempt>/<local_rank>/heartbeat, or under $TMPDIR without a log
 * directory) named by CRUN_HEARTBEAT_FILE; crun_heartbeat() in the SDK, or
 * os.utime() in Python, moves its mtime. A timer on the agent's loop looks at
 * the mtimes; a worker silent for longer than the timeout is taken as hung:
 * the agent writes its error file (so the failure summary names the silent
 * rank as the root cause) and SIGKILLs its process group, and the usual
 * failure path restarts the group or fails the job. A file, not a socket:
 * any language can beat, a beat never blocks on the agent, and a worker that
 * stopped being scheduled (SIGSTOP, a stuck collective) stops beating too.
 *
 * Silence is measured on the monotonic clock, never by comparing an mtime
 * with the wall clock: a wall-clock step (NTP, an operator's `date -s`) of
 * +1 h killed every healthy worker at once, and one of -1 h let a hung one
 * live for an hour. An mtime is only compared with the previous mtime of
 * the same file; a change (either way) is a beat, dated by the monotonic time
 * at which the agent saw it.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "common/common.h"

#define HB_CHECK_MIN_MS 50
#define HB_CHECK_MAX_MS 1000

struct hb_rank {
	char path[PATH_MAX];
	struct timespec mtime; /* as last seen */
	uint64_t seen_ms;      /* monotonic: when mtime was seen to change; 0: gone */
};

struct agent_heartbeat {
	struct crun_agent *a; /* borrowed back-pointer */
	struct event *timer;
	int n;
	struct hb_rank *rank; /* per local rank */
};

int heartbeat_silent(const uint64_t *seen_ms, const bool *watch, int n, uint64_t now_ms,
		     uint32_t timeout_ms)
{
	uint64_t worst = 0;
	int who = -1;

	for (int i = 0; i < n; i++) {
		uint64_t age = now_ms - MIN(seen_ms[i], now_ms);

		if (watch[i] && age > timeout_ms && age > worst) {
			worst = age;
			who = i;
		}
	}
	return who;
}

uint64_t heartbeat_observe(struct timespec *last, const struct timespec *now_mtime,
			   uint64_t seen_ms, uint64_t now_ms)
{
	if (last->tv_sec == now_mtime->tv_sec && last->tv_nsec == now_mtime->tv_nsec)
		return seen_ms;
	*last = *now_mtime; /* moved, forward or back: a beat */
	return now_ms;
}

/* The hung worker's error file, torchrun's format, so the summary says why. */
static void write_reason(const struct worker *w, uint64_t silent_ms, uint32_t timeout_ms)
{
	char why[256], text[1024];
	int fd;

	if (!w->errfile[0])
		return;
	snprintf(why, sizeof(why),
		 "crun: no heartbeat from rank %d (local rank %d, pid %d) for %.1f s "
		 "(--worker_heartbeat_timeout=%.1f): killed as hung",
		 w->global_rank, w->local_rank, (int)w->pid, silent_ms / 1000.0,
		 timeout_ms / 1000.0);
	/* The summary prints py_callstack as the root cause's traceback. */
	snprintf(text, sizeof(text),
		 "{\"message\": {\"message\": \"%s\", \"extraInfo\": {\"py_callstack\": "
		 "\"%s\", \"timestamp\": \"%.0f\"}}}\n",
		 why, why, clock_wall_s());
	fd = open(w->errfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (fd_write_all(fd, text, strlen(text)) < 0)
		log_at(LL_WARN, SUB_AGENT, "cannot write '%s', ignoring", w->errfile);
	fd_close(fd);
}

/* Notes which files moved since the last look; a deleted file is as silent
 * as it gets. */
static void look(struct agent_heartbeat *hb, bool *watch, uint64_t now_ms)
{
	struct crun_agent *a = hb->a;

	for (int i = 0; i < hb->n; i++) {
		struct hb_rank *r = &hb->rank[i];
		struct stat st;

		watch[i] = a->wk.workers[i].state == W_RUNNING && !a->wk.workers[i].stopping;
		if (!watch[i])
			continue;
		if (stat(r->path, &st) == 0)
			r->seen_ms = heartbeat_observe(&r->mtime, &st.st_mtim, r->seen_ms, now_ms);
		else
			r->seen_ms = 0;
	}
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
	struct agent_heartbeat *hb = arg;
	struct crun_agent *a = hb->a;
	uint64_t seen[CRUN_AGENT_MAX_LOCAL];
	bool watch[CRUN_AGENT_MAX_LOCAL];
	uint64_t now = clock_now_ms();
	int who;

	(void)fd;
	(void)what;
	look(hb, watch, now);
	for (int i = 0; i < hb->n; i++)
		seen[i] = hb->rank[i].seen_ms;
	who = heartbeat_silent(seen, watch, hb->n, now, a->cfg.worker_heartbeat_timeout_ms);
	if (who < 0)
		return;
	{
		struct worker *w = &a->wk.workers[who];
		uint64_t silent = seen[who] ? now - seen[who] : 0;

		log_at(LL_WARN, SUB_AGENT,
		       "worker rank %d (local rank %d, pid %d) sent no heartbeat for %.1f s "
		       "(--worker_heartbeat_timeout): killing it as hung",
		       w->global_rank, w->local_rank, (int)w->pid, silent / 1000.0);
		write_reason(w, silent, a->cfg.worker_heartbeat_timeout_ms);
		/* Its exit is a failure like any other (not a stop crun asked for),
		 * only not an OOM kill; reset the clock so the next check, before
		 * the reap, does not count it twice. */
		w->sigkilled_by_us = true;
		hb->rank[who].seen_ms = now;
		if (kill(-w->pid, SIGKILL) < 0 && errno != ESRCH)
			log_at(LL_WARN, SUB_AGENT, "kill(-%d, SIGKILL): %s, ignoring", (int)w->pid,
			       strerror(errno));
	}
}

int heartbeat_prepare(struct crun_agent *a, const struct worker *w, const char *attempt_dir,
		      char ***envp)
{
	struct agent_heartbeat *hb;
	struct hb_rank *r;
	struct stat st;
	char *kv;
	size_t n = 0;
	char **grown;
	int fd;

	if (!a->cfg.worker_heartbeat_timeout_ms)
		return 0;
	if (!a->hb) {
		a->hb = calloc(1, sizeof(*a->hb));
		if (!a->hb)
			return CRUN_ENOMEM;
		a->hb->a = a;
	}
	hb = a->hb;
	if (!hb->rank) {
		hb->rank = calloc((size_t)a->wk.nworkers, sizeof(*hb->rank));
		if (!hb->rank)
			return CRUN_ENOMEM;
		hb->n = a->wk.nworkers;
	}
	r = &hb->rank[w->local_rank];
	if (attempt_dir[0])
		TRY(str_printf(r->path, sizeof(r->path), "%s/%d/heartbeat", attempt_dir,
			       w->local_rank));
	else
		TRY(str_printf(r->path, sizeof(r->path), "%s/crun-heartbeat-%d-%d",
			       getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
			       w->local_rank));
	/* Created now: the timeout runs from the spawn. */
	fd = open(r->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0) {
		int e = -errno;

		fd_close(fd);
		return e;
	}
	fd_close(fd);
	r->mtime = st.st_mtim;
	r->seen_ms = clock_now_ms();
	if (asprintf(&kv, "CRUN_HEARTBEAT_FILE=%s", r->path) < 0)
		return CRUN_ENOMEM;
	while ((*envp)[n])
		n++;
	grown = realloc(*envp, (n + 2) * sizeof(char *));
	if (!grown) {
		free(kv);
		return CRUN_ENOMEM;
	}
	grown[n] = kv;
	grown[n + 1] = NULL;
	*envp = grown;
	return 0;
}

int heartbeat_arm(struct crun_agent *a)
{
	uint32_t t = a->cfg.worker_heartbeat_timeout_ms;
	uint32_t every = MIN(MAX(t / 4, HB_CHECK_MIN_MS), HB_CHECK_MAX_MS);
	struct timeval tv = {.tv_sec = every / 1000, .tv_usec = (every % 1000) * 1000};

	if (!t || !a->hb)
		return 0;
	if (!a->hb->timer) {
		a->hb->timer = event_new(a->base, -1, EV_PERSIST, on_check, a->hb);
		if (!a->hb->timer)
			return CRUN_ENOMEM;
	}
	return event_add(a->hb->timer, &tv) < 0 ? CRUN_ENOMEM : 0;
}

void heartbeat_disarm(struct crun_agent *a)
{
	if (!a->hb)
		return;
	if (a->hb->timer)
		event_free(a->hb->timer);
	for (int i = 0; a->hb->rank && i < a->hb->n; i++)
		if (a->hb->rank[i].path[0])
			(void)unlink(a->hb->rank[i].path);
	free(a->hb->rank);
	free(a->hb);
	a->hb = NULL;
}
