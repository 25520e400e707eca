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

struct agent_heartbeat {
	struct crun_agent *a; /* borrowed back-pointer */
	struct event *timer;
	int n;
	char (*path)[PATH_MAX]; /* per local rank */
};

int heartbeat_silent(const double *mtime, const bool *watch, int n, double now, uint32_t timeout_ms)
{
	double worst = 0;
	int who = -1;

	for (int i = 0; i < n; i++) {
		double age = now - mtime[i];

		if (watch[i] && age * 1000.0 > (double)timeout_ms && age > worst) {
			worst = age;
			who = i;
		}
	}
	return who;
}

/* The hung worker's error file, torchrun's format, so the summary says why. */
static void write_reason(const struct worker *w, double silent_s, uint32_t timeout_ms)
{
	char why[256], text[1024];
	int fd;

	if (!w->errfile[0])
		return;
	snprintf(why, sizeof(why),
		 "crun: no heartbeat from rank %d (local rank %d, pid %d) for %.1f s "
		 "(--worker_heartbeat_timeout=%.1f): killed as hung",
		 w->global_rank, w->local_rank, (int)w->pid, silent_s, timeout_ms / 1000.0);
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

static void on_check(evutil_socket_t fd, short what, void *arg)
{
	struct agent_heartbeat *hb = arg;
	struct crun_agent *a = hb->a;
	double mtime[CRUN_AGENT_MAX_LOCAL];
	bool watch[CRUN_AGENT_MAX_LOCAL];
	double now = clock_wall_s();
	int who;

	for (int i = 0; i < hb->n; i++) {
		struct stat st;

		watch[i] = a->workers[i].state == W_RUNNING && !a->workers[i].stopping;
		mtime[i] = now;
		if (watch[i] && stat(hb->path[i], &st) == 0)
			mtime[i] = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
		else if (watch[i])
			mtime[i] = 0; /* deleted: as silent as it gets */
	}
	who = heartbeat_silent(mtime, watch, hb->n, now, a->cfg.worker_heartbeat_timeout_ms);
	if (who < 0)
		return;
	{
		struct worker *w = &a->workers[who];
		double silent = mtime[who] > 0 ? now - mtime[who] : 0;

		log_at(LL_WARN, SUB_AGENT,
		       "worker rank %d (local rank %d, pid %d) sent no heartbeat for %.1f s "
		       "(--worker_heartbeat_timeout): killing it as hung",
		       w->global_rank, w->local_rank, (int)w->pid, silent);
		write_reason(w, silent, a->cfg.worker_heartbeat_timeout_ms);
		/* Its exit is a failure like any other (not a stop crun asked for),
		 * only not an OOM kill; reset the clock so the next check, before
		 * the reap, does not count it twice. */
		w->sigkilled_by_us = true;
		(void)utimensat(AT_FDCWD, hb->path[who], NULL, 0);
		if (kill(-w->pid, SIGKILL) < 0 && errno != ESRCH)
			log_at(LL_WARN, SUB_AGENT, "kill(-%d, SIGKILL): %s, ignoring", (int)w->pid,
			       strerror(errno));
	}
}

int heartbeat_prepare(struct crun_agent *a, const struct worker *w, const char *attempt_dir,
		      char ***envp)
{
	struct agent_heartbeat *hb;
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
	if (!hb->path) {
		hb->path = calloc((size_t)a->nworkers, sizeof(*hb->path));
		if (!hb->path)
			return CRUN_ENOMEM;
		hb->n = a->nworkers;
	}
	if (attempt_dir[0])
		TRY(str_printf(hb->path[w->local_rank], sizeof(hb->path[0]), "%s/%d/heartbeat",
			       attempt_dir, w->local_rank));
	else
		TRY(str_printf(
		    hb->path[w->local_rank], sizeof(hb->path[0]), "%s/crun-heartbeat-%d-%d",
		    getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), w->local_rank));
	/* Created (and its mtime set) now: the timeout runs from the spawn. */
	fd = open(hb->path[w->local_rank], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	fd_close(fd);
	if (asprintf(&kv, "CRUN_HEARTBEAT_FILE=%s", hb->path[w->local_rank]) < 0)
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
	for (int i = 0; a->hb->path && i < a->hb->n; i++)
		if (a->hb->path[i][0])
			(void)unlink(a->hb->path[i]);
	free(a->hb->path);
	free(a->hb);
	a->hb = NULL;
}
