/* timerfile.c: torchrun's expiry-timer protocol (TORCHELASTIC_ENABLE_FILE_TIMER=1,
 * torch.distributed.elastic.timer.FileTimerServer): the agent makes a named
 * pipe, names it in TORCHELASTIC_TIMER_FILE, and workers' FileTimerClient
 * writes one JSON line per request ({"version": 1, "pid", "scope_id",
 * "expiration_time", "signal"}; a negative expiration releases the timer).
 * Every 100 ms (torch's max_interval) a timer past its expiration gets its
 * signal sent to its worker, which the usual failure path then reports. Only
 * this agent's own running workers are signalled: a request cannot aim the
 * agent at another process.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <event2/event.h>

#include "agent/agent.h"
#include "agent/env.h"
#include "agent/timerfile.h"
#include "common/common.h"

#define TIMERS_MAX	1024 /* live (pid, scope) timers */
#define TIMER_LINE_MAX	4096 /* PIPE_BUF: torch's client refuses longer requests */
#define TIMER_SCOPE_MAX 128
#define TIMER_CHECK_MS	100 /* torch's LocalElasticAgent: max_interval=0.1 */

struct ftimer {
	pid_t pid;
	int sig;
	double expires; /* wall seconds, as time.time() */
	char scope[TIMER_SCOPE_MAX];
};

struct agent_timers {
	struct crun_agent *agent; /* borrowed; NULL: nobody to signal yet */
	int rfd, wfd;		  /* the FIFO; our own write end keeps EOF away */
	struct event *rev, *tick;
	bool created;
	char path[PATH_MAX];
	size_t len;
	char buf[TIMER_LINE_MAX];
	int n;
	struct ftimer t[TIMERS_MAX];
};

int agent_timers_parse(const char *line, struct agent_timer_req *ret)
{
	cJSON *j = cJSON_Parse(line), *pid, *scope, *exp, *sig;
	int r = CRUN_EPROTO;

	if (!j)
		return CRUN_EPROTO;
	pid = cJSON_GetObjectItemCaseSensitive(j, "pid");
	scope = cJSON_GetObjectItemCaseSensitive(j, "scope_id");
	exp = cJSON_GetObjectItemCaseSensitive(j, "expiration_time");
	sig = cJSON_GetObjectItemCaseSensitive(j, "signal");
	if (cJSON_IsNumber(pid) && pid->valuedouble > 0 && pid->valuedouble < 4194304 &&
	    cJSON_IsString(scope) && strlen(scope->valuestring) < sizeof(ret->scope) &&
	    cJSON_IsNumber(exp) && (!sig || cJSON_IsNumber(sig))) {
		ret->pid = (pid_t)pid->valuedouble;
		snprintf(ret->scope, sizeof(ret->scope), "%s", scope->valuestring);
		ret->expires = exp->valuedouble;
		ret->sig = sig && sig->valuedouble > 0 && sig->valuedouble < 65
			       ? (int)sig->valuedouble
			       : 0;
		r = 0;
	}
	cJSON_Delete(j);
	return r;
}

static int find(const struct agent_timers *t, pid_t pid, const char *scope)
{
	for (int i = 0; i < t->n; i++)
		if (t->t[i].pid == pid && strcmp(t->t[i].scope, scope) == 0)
			return i;
	return -1;
}

static void drop(struct agent_timers *t, int i)
{
	t->t[i] = t->t[--t->n];
}

static void apply(struct agent_timers *t, const struct agent_timer_req *q)
{
	int i = find(t, q->pid, q->scope);

	if (q->expires < 0) { /* release */
		if (i >= 0)
			drop(t, i);
		return;
	}
	if (i < 0) {
		if (t->n >= TIMERS_MAX) {
			log_at(LL_WARN, SUB_AGENT, "expiry timers: %d live, ignoring pid %d's '%s'",
			       TIMERS_MAX, (int)q->pid, q->scope);
			return;
		}
		i = t->n++;
	}
	t->t[i] = (struct ftimer){.pid = q->pid, .sig = q->sig, .expires = q->expires};
	snprintf(t->t[i].scope, sizeof(t->t[i].scope), "%s", q->scope);
}

static void on_read(evutil_socket_t fd, short what, void *arg)
{
	struct agent_timers *t = arg;

	for (;;) {
		ssize_t n = read(t->rfd, t->buf + t->len, sizeof(t->buf) - 1 - t->len);
		char *line, *nl;

		if (n <= 0)
			return; /* EAGAIN; EOF cannot happen while wfd is open */
		t->len += (size_t)n;
		t->buf[t->len] = '\0';
		line = t->buf;
		while ((nl = strchr(line, '\n'))) {
			struct agent_timer_req q;

			*nl = '\0';
			if (agent_timers_parse(line, &q) == 0)
				apply(t, &q);
			else
				log_at(LL_WARN, SUB_AGENT,
				       "expiry timers: bad request '%.80s', ignoring", line);
			line = nl + 1;
		}
		t->len -= (size_t)(line - t->buf);
		memmove(t->buf, line, t->len);
		if (t->len == sizeof(t->buf) - 1)
			t->len = 0; /* a line longer than PIPE_BUF: not a client's */
	}
}

static bool our_worker(const struct crun_agent *a, pid_t pid)
{
	for (int i = 0; a && a->wk.workers && i < a->wk.nworkers; i++)
		if (a->wk.workers[i].pid == pid && a->wk.workers[i].state == W_RUNNING)
			return true;
	return false;
}

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
	struct agent_timers *t = arg;
	double now = clock_wall_s();

	for (int i = 0; i < t->n;) {
		struct ftimer *f = &t->t[i];

		if (!our_worker(t->agent, f->pid)) {
			if (kill(f->pid, 0) < 0 && errno == ESRCH)
				drop(t, i); /* gone: its timers go with it */
			else
				i++;
			continue;
		}
		if (f->expires > now) {
			i++;
			continue;
		}
		log_at(LL_WARN, SUB_AGENT,
		       "worker pid %d: expiry timer '%s' passed %.1f s ago "
		       "(TORCHELASTIC_TIMER_FILE)%s",
		       (int)f->pid, f->scope, now - f->expires,
		       f->sig ? ", killing it" : "; no signal given, leaving it");
		if (f->sig && kill(f->pid, f->sig) < 0 && errno != ESRCH)
			log_at(LL_WARN, SUB_AGENT, "kill(%d, %d): %s, ignoring", (int)f->pid,
			       f->sig, strerror(errno));
		drop(t, i);
	}
}

int agent_timers_start(struct event_base *base, const char *path, struct agent_timers **ret)
{
	struct agent_timers *t = calloc(1, sizeof(*t));
	struct timeval tv = {.tv_sec = 0, .tv_usec = TIMER_CHECK_MS * 1000};
	int r;

	if (!t)
		return CRUN_ENOMEM;
	t->rfd = t->wfd = -1;
	r = str_printf(t->path, sizeof(t->path), "%s", path);
	if (r < 0)
		goto fail;
	if (mkfifo(path, 0600) == 0) {
		t->created = true;
	} else {
		struct stat st;

		/* An existing path must be a FIFO (torch: "must have created it by
		 * calling os.mkfifo()"); it stays when we stop. */
		r = errno == EEXIST && stat(path, &st) == 0 && S_ISFIFO(st.st_mode) ? 0
										    : CRUN_EINVAL;
		if (r < 0)
			goto fail;
	}
	t->rfd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	t->wfd = t->rfd < 0 ? -1 : open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (t->rfd < 0 || t->wfd < 0) {
		r = -errno;
		goto fail;
	}
	r = CRUN_ENOMEM;
	t->rev = event_new(base, t->rfd, EV_READ | EV_PERSIST, on_read, t);
	t->tick = event_new(base, -1, EV_PERSIST, on_tick, t);
	if (!t->rev || !t->tick || event_add(t->rev, NULL) < 0 || event_add(t->tick, &tv) < 0)
		goto fail;
	*ret = t;
	return 0;
fail:
	agent_timers_stop(t);
	return r;
}

void agent_timers_attach(struct agent_timers *t, struct crun_agent *a)
{
	if (t)
		t->agent = a;
}

void agent_timers_stop(struct agent_timers *t)
{
	if (!t)
		return;
	if (t->rev)
		event_free(t->rev);
	if (t->tick)
		event_free(t->tick);
	if (t->rfd >= 0)
		fd_close(t->rfd);
	if (t->wfd >= 0)
		fd_close(t->wfd);
	if (t->created)
		(void)unlink(t->path);
	free(t);
}

int agent_timers_from_env(struct event_base *base, char *const *env, char *path, size_t cap,
			  struct agent_timers **ret)
{
	const char *on = env_get(env, "TORCHELASTIC_ENABLE_FILE_TIMER");
	const char *p = env_get(env, "TORCHELASTIC_TIMER_FILE"), *tmp = env_get(env, "TMPDIR");

	*ret = NULL;
	if (!on || strcmp(on, "1") != 0)
		return 0; /* torchrun's switch: off unless exactly "1" */
	if (p && *p)
		TRY(str_printf(path, cap, "%s", p));
	else
		TRY(str_printf(path, cap, "%s/crun-timer-%d.fifo", tmp && *tmp ? tmp : "/tmp",
			       (int)getpid()));
	return agent_timers_start(base, path, ret);
}
