/* poll.c: poll mode's one fd. libevent does not hand out its backend's fd,
 * so after every pass of the loop the fds it waits on (event_base_foreach_
 * event: every added I/O event; signals are not used in poll mode) are
 * mirrored into an epoll set of our own, level-triggered with the same
 * directions. The caller polls that set's fd; a readable one means a pass
 * of the loop (crun_agent_dispatch) has work. Timers come out as a timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "agent/poll.h"
#include "common/common.h"
#include "agent/outputs.h"

#define POLL_MAX_FDS 65536 /* far above what one agent watches */

struct poll_fd {
	int fd;
	uint32_t mask; /* EPOLLIN | EPOLLOUT */
};

struct agent_poll {
	struct event_base *base; /* borrowed */
	int epfd;
	struct poll_fd *cur, *want; /* registered now; being collected */
	size_t ncur, nwant, cap;
	bool overflow;
	int64_t next_ms;     /* agent_poll_timeout_ms's scan */
	struct timeval now;  /* ... and "now" in event_pending's frame */
	struct event *probe; /* a timer that reads that "now" */
};

int agent_poll_new(struct event_base *base, struct agent_poll **ret)
{
	struct agent_poll *p = calloc(1, sizeof(*p));

	if (!p)
		return CRUN_ENOMEM;
	p->base = base;
	p->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (p->epfd < 0) {
		int r = -errno;

		free(p);
		return r;
	}
	*ret = p;
	return 0;
}

void agent_poll_free(struct agent_poll *p)
{
	if (!p)
		return;
	if (p->probe)
		event_free(p->probe);
	fd_close(p->epfd);
	free(p->cur);
	free(p->want);
	free(p);
}

int agent_poll_fd(const struct agent_poll *p)
{
	return p->epfd;
}

static int collect(const struct event_base *b, const struct event *ev, void *arg)
{
	struct agent_poll *p = arg;
	short what = event_get_events(ev);
	evutil_socket_t fd = event_get_fd(ev);
	uint32_t mask = (what & EV_READ ? EPOLLIN : 0) | (what & EV_WRITE ? EPOLLOUT : 0);

	(void)b;
	if (fd < 0 || (what & EV_SIGNAL) || !mask || !event_pending(ev, EV_READ | EV_WRITE, NULL))
		return 0;
	for (size_t i = 0; i < p->nwant; i++)
		if (p->want[i].fd == fd) {
			p->want[i].mask |= mask;
			return 0;
		}
	if (p->nwant == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 32;
		struct poll_fd *a, *c;

		if (cap > POLL_MAX_FDS) {
			p->overflow = true;
			return 0;
		}
		a = realloc(p->want, cap * sizeof(*a));
		if (a)
			p->want = a;
		c = realloc(p->cur, cap * sizeof(*c));
		if (c)
			p->cur = c;
		if (!a || !c) {
			p->overflow = true;
			return 0;
		}
		p->cap = cap;
	}
	p->want[p->nwant++] = (struct poll_fd){(int)fd, mask};
	return 0;
}

static const struct poll_fd *find(const struct poll_fd *v, size_t n, int fd)
{
	for (size_t i = 0; i < n; i++)
		if (v[i].fd == fd)
			return &v[i];
	return NULL;
}

int agent_poll_refresh(struct agent_poll *p)
{
	int r = 0;

	p->nwant = 0;
	p->overflow = false;
	(void)event_base_foreach_event(p->base, collect, p);
	if (p->overflow)
		return CRUN_ENOMEM;
	/* An fd that was closed left the set by itself; its number may be in
	 * use again, so every wanted fd is (re)registered by MOD, else ADD. */
	for (size_t i = 0; i < p->ncur; i++)
		if (!find(p->want, p->nwant, p->cur[i].fd))
			(void)epoll_ctl(p->epfd, EPOLL_CTL_DEL, p->cur[i].fd, NULL);
	for (size_t i = 0; i < p->nwant; i++) {
		const struct poll_fd *was = find(p->cur, p->ncur, p->want[i].fd);
		struct epoll_event ev = {.events = p->want[i].mask, .data.fd = p->want[i].fd};

		if (was && was->mask == p->want[i].mask &&
		    epoll_ctl(p->epfd, EPOLL_CTL_MOD, ev.data.fd, &ev) == 0)
			continue;
		if (epoll_ctl(p->epfd, EPOLL_CTL_MOD, ev.data.fd, &ev) == 0)
			continue;
		if (epoll_ctl(p->epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) < 0 && r == 0)
			r = -errno;
	}
	memcpy(p->cur, p->want, p->nwant * sizeof(*p->cur));
	p->ncur = p->nwant;
	return r;
}

static int earliest(const struct event_base *b, const struct event *ev, void *arg)
{
	struct agent_poll *p = arg;
	struct timeval tv;
	int64_t ms;

	(void)b;
	if (!event_pending(ev, EV_TIMEOUT, &tv))
		return 0;
	ms = ((int64_t)tv.tv_sec - p->now.tv_sec) * 1000 +
	     (tv.tv_usec - p->now.tv_usec + 999) / 1000;
	if (ms < 0)
		ms = 0;
	if (p->next_ms < 0 || ms < p->next_ms)
		p->next_ms = ms;
	return 0;
}

static void probe_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	(void)arg;
}

/* event_pending gives a timer's expiry as its monotonic expiry plus the
 * wall-clock offset libevent last measured (it refreshes it every few
 * seconds, in the loop). "Now" must be read in that same frame: the wall
 * clock read here (there is no cached time outside the loop) differed from
 * it by the size of any step since, so a -1 h step told the host to sleep
 * an hour past every timer (heartbeat checks, leases), a +1 h one to spin.
 * A probe timer R from now reads back as now + R in the frame. */
static int frame_now(struct agent_poll *p, struct timeval *ret_now)
{
	struct timeval r = {3600, 0}, t;
	bool ok;

	if (!p->probe)
		p->probe = evtimer_new(p->base, probe_on_timeout, NULL);
	if (!p->probe || evtimer_add(p->probe, &r) < 0)
		return CRUN_ENOMEM;
	ok = event_pending(p->probe, EV_TIMEOUT, &t);
	(void)evtimer_del(p->probe);
	if (!ok)
		return CRUN_EIO;
	timersub(&t, &r, ret_now);
	return 0;
}

int agent_poll_timeout_ms(struct agent_poll *p)
{
	if (event_base_get_num_events(p->base, EVENT_BASE_COUNT_ACTIVE) > 0)
		return 0;
	if (frame_now(p, &p->now) < 0)
		return 100; /* cannot tell: look again soon rather than never */
	p->next_ms = -1;
	(void)event_base_foreach_event(p->base, earliest, p);
	return p->next_ms > INT32_MAX ? INT32_MAX : (int)p->next_ms;
}

/* ---- the public poll-mode calls ------------------------------------------------ */

CRUN_API int crun_agent_start(crun_agent_t *a)
{
	int r;

	if (!a || a->state != AS_INIT || a->started)
		return CRUN_EINVAL;
	a->started = true;
	a->poll_mode = true;
	r = agent_poll_new(a->base, &a->poll);
	if (r == 0)
		r = outputs_start_console(a->out, true);
	if (r < 0) {
		snprintf(a->err, sizeof(a->err), "cannot start: %s", crun_strerror(r));
		return r;
	}
	/* pidfd_open (Linux 5.3) on ourselves: fail here, not at the first
	 * worker. */
	{
		struct worker probe = {.pid = getpid(), .pidfd = -1};

		r = supervise_watch_pid(a, &probe);
		supervise_unwatch_pid(&probe);
		if (r < 0) {
			snprintf(a->err, sizeof(a->err), "poll mode needs pidfd_open: %s",
				 crun_strerror(r));
			return r == -ENOSYS ? CRUN_ENOTSUP : r;
		}
	}
	agent_fire(a, AE_START);
	return agent_poll_refresh(a->poll);
}

CRUN_API int crun_agent_fd(const crun_agent_t *a)
{
	if (!a || !a->poll)
		return CRUN_EINVAL;
	return agent_poll_fd(a->poll);
}

CRUN_API int crun_agent_next_timeout_ms(crun_agent_t *a)
{
	if (!a || !a->poll)
		return CRUN_EINVAL;
	if (a->state == AS_DONE)
		return 0;
	return agent_poll_timeout_ms(a->poll);
}

CRUN_API int crun_agent_dispatch(crun_agent_t *a, int *ret_done, int *ret_exit_code)
{
	struct timespec zero = {0, 0};
	sigset_t pipe_set, saved;
	int r;

	if (!a || !a->poll)
		return CRUN_EINVAL;
	/* As in crun_agent_run: EPIPE from a vanished peer, never a SIGPIPE
	 * that kills a host which left it at its default. */
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &saved);
	if (a->state != AS_DONE && event_base_loop(a->base, EVLOOP_NONBLOCK) < 0)
		a->run_error = a->run_error ? a->run_error : CRUN_EIO;
	if (!sigismember(&saved, SIGPIPE))
		while (sigtimedwait(&pipe_set, NULL, &zero) > 0)
			;
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	r = agent_poll_refresh(a->poll);
	if (r < 0)
		log_at(LL_WARN, SUB_AGENT, "poll mode: cannot watch every fd: %s, ignoring",
		       crun_strerror(r));
	if (ret_done)
		*ret_done = a->state == AS_DONE;
	if (a->state != AS_DONE)
		return 0;
	if (ret_exit_code)
		*ret_exit_code = a->exit_code;
	return a->run_error;
}
