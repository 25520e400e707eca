/* console.c: the agent's own stdout/stderr for worker output it must copy
 * (teed streams). The loop never writes to the console itself: a reader that
 * stops reading (`crun … | sleep 12`, a paused pager, Ctrl-S) would freeze the
 * loop that also serves the worker store, the rendezvous and the lease
 * timers of every node. The loop appends to a bounded queue per stream; one
 * writer thread does the blocking writes. When a queue is full the chunk is
 * dropped and counted; once there is room again the reader sees
 * "[crun: N lines dropped]" where the gap is.
 *
 * The writer thread is the only place that blocks on the console. It blocks
 * SIGPIPE for itself (an embedding host keeps its own disposition) and
 * treats EPIPE as "nobody reads": it discards from then on.
 *
 * Loop mode (an agent in the caller's poll loop: no thread of ours): the
 * same queues, written from the loop only when poll() says the fd takes a
 * write, at most PIPE_BUF bytes at a time (a pipe with room never blocks on
 * that; the caller's fd stays blocking, it may be shared), then an EV_WRITE
 * event for the rest. Regular files take every write at once.
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <event2/event.h>

#include "agent/console.h"
#include "common/common.h"
#include "crun/agent.h" /* CRUN_STD_ERR */

struct console_q {
	int fd;
	char *buf; /* ring of cap bytes */
	size_t cap, head, len;
	uint64_t dropped_lines; /* since the last marker */
	uint64_t dropped_total;
	bool last_nl;		/* the last queued byte was '\n' */
	bool dead;		/* EPIPE or another hard error: discard */
	bool writing;		/* the thread holds bytes it took out of the ring */
	uint64_t written_bytes; /* progress ... */
	uint64_t moved_ms;	/* ... and when it last moved, or the queue filled */
	bool regular;		/* loop mode: a regular file (never waits, no event) */
	struct event *wev;	/* loop mode: EV_WRITE for the rest of the queue */
};

struct agent_console {
	struct event_base *base; /* loop mode (no thread), else NULL */
	pthread_t thread;
	bool started;
	bool stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;	/* wakes the writer: data or stop */
	pthread_cond_t idle_cv; /* wakes a flusher: a queue emptied */
	struct console_q q[2];	/* [0] stdout, [1] stderr */
};

static struct console_q *q_of(struct agent_console *c, int which)
{
	return &c->q[which == CRUN_STD_ERR];
}

static void ring_put(struct console_q *q, const char *p, size_t n)
{
	size_t tail = (q->head + q->len) % q->cap;
	size_t first = MIN(n, q->cap - tail);

	memcpy(q->buf + tail, p, first);
	memcpy(q->buf, p + first, n - first);
	q->len += n;
	q->last_nl = p[n - 1] == '\n';
}

/* Lines begun in the chunk: each line is counted once, where it starts, so
 * printed plus dropped lines add up to what the workers wrote. */
static size_t count_lines(const char *p, size_t n, bool starts_line)
{
	size_t lines = starts_line;

	for (const char *e = p + n - 1; (p = memchr(p, '\n', (size_t)(e - p))) != NULL; p++)
		lines++;
	return lines;
}

/* Queues the "[crun: N lines dropped]" marker when it fits; lock held. */
static bool put_marker(struct console_q *q, size_t room_after)
{
	char marker[64];
	int mlen;

	if (!q->dropped_lines)
		return true;
	mlen = snprintf(marker, sizeof(marker), "%s[crun: %llu lines dropped]\n",
			q->last_nl ? "" : "\n", (unsigned long long)q->dropped_lines);
	if (q->len + (size_t)mlen + room_after > q->cap)
		return false;
	ring_put(q, marker, (size_t)mlen);
	q->dropped_lines = 0;
	return true;
}

/* ---- loop mode ------------------------------------------------------------------- */

static void on_writable(evutil_socket_t fd, short what, void *arg);

/* Writes what q's fd takes now; lock not needed (one thread in loop mode).
 * True when bytes are left for later. */
static bool loop_write(struct console_q *q)
{
	while (q->len && !q->dead) {
		struct pollfd pfd = {.fd = q->fd, .events = POLLOUT};
		size_t n = MIN(q->len, q->cap - q->head);
		ssize_t w;

		if (!q->regular) {
			int pr = poll(&pfd, 1, 0);

			if (pr < 0 && errno == EINTR)
				continue;
			if (pr == 0)
				return true;
			n = MIN(n, PIPE_BUF); /* room for one page: never blocks */
		}
		w = write(q->fd, q->buf + q->head, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN)
			return true;
		if (w <= 0) {
			q->dead = true; /* EPIPE or worse: nobody reads */
			q->len = 0;
			break;
		}
		q->head = (q->head + (size_t)w) % q->cap;
		q->len -= (size_t)w;
		q->written_bytes += (size_t)w;
		q->moved_ms = clock_now_ms();
	}
	return false;
}

/* Writes both queues as far as they go and waits for writability of the
 * rest through an event. SIGPIPE is blocked around the writes and a raised
 * one consumed: the host keeps its disposition, we see EPIPE. */
static void loop_pump(struct agent_console *c)
{
	struct timespec zero = {0, 0};
	sigset_t pipe_set, saved;

	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &saved);
	for (int i = 0; i < 2; i++) {
		struct console_q *q = &c->q[i];

		if (!q->dead && q->dropped_lines)
			(void)put_marker(q, 0);
		if (!loop_write(q))
			continue;
		if (!q->wev)
			q->wev = event_new(c->base, q->fd, EV_WRITE, on_writable, c);
		if (!q->wev || event_add(q->wev, NULL) < 0) {
			q->dead = true; /* cannot wait for it: stop writing to it */
			q->len = 0;
		}
	}
	if (!sigismember(&saved, SIGPIPE))
		while (sigtimedwait(&pipe_set, NULL, &zero) > 0)
			;
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
}

static void on_writable(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	loop_pump(arg);
}

/* Loop mode's bounded wait: pumps until done() or until_ms. */
static bool loop_wait(struct agent_console *c, bool (*done)(struct agent_console *, int, size_t),
		      int which, size_t need, uint64_t until_ms)
{
	for (;;) {
		struct pollfd pfd[2];
		nfds_t n = 0;
		uint64_t now;

		loop_pump(c);
		if (done(c, which, need))
			return true;
		now = clock_now_ms();
		if (now >= until_ms)
			return false;
		for (int i = 0; i < 2; i++)
			if (c->q[i].len && !c->q[i].dead)
				pfd[n++] = (struct pollfd){.fd = c->q[i].fd, .events = POLLOUT};
		if (n)
			(void)poll(pfd, n, (int)MIN(until_ms - now, 100));
	}
}

static bool has_room(struct agent_console *c, int which, size_t need)
{
	struct console_q *q = q_of(c, which);

	return q->dead || q->cap - q->len >= need;
}

static bool drained(struct agent_console *c, int which, size_t need)
{
	(void)which;
	(void)need;
	for (int i = 0; i < 2; i++)
		if (!c->q[i].dead && (c->q[i].len || c->q[i].dropped_lines))
			return false;
	return true;
}

void console_put(struct agent_console *c, int which, const char *p, size_t n, bool starts_line)
{
	struct console_q *q;

	if (!c || n == 0)
		return;
	q = q_of(c, which);
	pthread_mutex_lock(&c->mu);
	if (q->dead)
		goto out;
	if (!put_marker(q, n) || q->len + n > q->cap) {
		size_t lines = count_lines(p, n, starts_line);

		q->dropped_lines += lines;
		q->dropped_total += lines;
		goto out;
	}
	if (q->len == 0)
		q->moved_ms = clock_now_ms(); /* a stall counts from here */
	ring_put(q, p, n);
	pthread_cond_signal(&c->cv);
out:
	pthread_mutex_unlock(&c->mu);
	if (c->base)
		loop_pump(c);
}

size_t console_room(struct agent_console *c, int which, uint64_t *ret_stalled_ms)
{
	struct console_q *q;
	size_t room;

	if (!c)
		return SIZE_MAX;
	q = q_of(c, which);
	pthread_mutex_lock(&c->mu);
	room = q->dead ? SIZE_MAX : q->cap - q->len;
	if (ret_stalled_ms)
		*ret_stalled_ms = q->len && !q->dead ? clock_now_ms() - q->moved_ms : 0;
	pthread_mutex_unlock(&c->mu);
	return room;
}

bool console_wait_room(struct agent_console *c, int which, size_t need, uint64_t until_ms)
{
	struct console_q *q;
	bool ok;

	if (!c)
		return true;
	if (c->base)
		return loop_wait(c, has_room, which, need, until_ms);
	q = q_of(c, which);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		uint64_t now = clock_now_ms();
		struct timespec ts;

		ok = q->dead || q->cap - q->len >= need;
		if (ok || now >= until_ms)
			break;
		ts = clock_monotonic_in((uint32_t)MIN(until_ms - now, UINT32_MAX));
		(void)pthread_cond_timedwait(&c->idle_cv, &c->mu, &ts);
	}
	pthread_mutex_unlock(&c->mu);
	return ok;
}

uint64_t console_dropped(struct agent_console *c, int which)
{
	uint64_t n;

	if (!c)
		return 0;
	pthread_mutex_lock(&c->mu);
	n = q_of(c, which)->dropped_total;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* Writes one contiguous piece with the lock released; the only cancellation
 * point of the thread is this write (console_free's last resort). */
static bool write_piece(int fd, const char *p, size_t n)
{
	int old;

	while (n) {
		ssize_t w;

		pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
		w = write(fd, p, n);
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN) {
			/* Someone made the fd nonblocking: wait a little, never spin. */
			struct timespec ts = {0, 10 * 1000 * 1000};

			nanosleep(&ts, NULL);
			continue;
		}
		if (w <= 0)
			return false;
		p += w;
		n -= (size_t)w;
	}
	return true;
}

static void *writer_main(void *arg)
{
	struct agent_console *c = arg;
	sigset_t pipe_set;
	int old;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
	/* EPIPE instead of a process-wide SIGPIPE the host did not ask for. */
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct console_q *q = NULL;

		for (int i = 0; i < 2; i++)
			if (c->q[i].len && !c->q[i].dead)
				q = &c->q[i];
		if (!q) {
			pthread_cond_broadcast(&c->idle_cv);
			if (c->stop)
				break;
			pthread_cond_wait(&c->cv, &c->mu);
			continue;
		}
		/* Take the contiguous part, write it unlocked, then free it. */
		size_t n = MIN(q->len, q->cap - q->head);
		const char *p = q->buf + q->head;
		int fd = q->fd;
		bool ok;

		q->writing = true;
		pthread_mutex_unlock(&c->mu);
		ok = write_piece(fd, p, n);
		{
			struct timespec zero = {0, 0};

			/* A SIGPIPE this write raised is pending on this thread:
			 * consume it so it never reaches the process. */
			while (sigtimedwait(&pipe_set, NULL, &zero) > 0)
				;
		}
		pthread_mutex_lock(&c->mu);
		q->writing = false;
		if (!ok)
			q->dead = true;
		q->head = (q->head + n) % q->cap;
		q->len -= n;
		q->written_bytes += n;
		q->moved_ms = clock_now_ms();
		pthread_cond_broadcast(&c->idle_cv);
		if (q->dead)
			q->len = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int console_new(struct event_base *base, int out_fd, int err_fd, size_t cap_bytes,
		struct agent_console **ret)
{
	struct agent_console *c = calloc(1, sizeof(*c));
	int r = CRUN_ENOMEM;

	if (!c)
		return CRUN_ENOMEM;
	/* idle_cv has timed waits: on the monotonic clock, so a wall-clock
	 * step neither cuts a flush short nor stretches it by the step. */
	r = clock_cond_init(&c->idle_cv);
	if (r < 0) {
		free(c);
		return r;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->cv, NULL);
	r = CRUN_ENOMEM;
	c->q[0].fd = out_fd;
	c->q[1].fd = err_fd;
	for (int i = 0; i < 2; i++) {
		c->q[i].cap = cap_bytes;
		c->q[i].last_nl = true;
		c->q[i].buf = malloc(cap_bytes);
		if (!c->q[i].buf)
			goto fail;
	}
	if (base) {
		for (int i = 0; i < 2; i++) {
			struct stat st;

			c->q[i].regular = fstat(c->q[i].fd, &st) == 0 && S_ISREG(st.st_mode);
		}
		c->base = base;
		*ret = c;
		return 0;
	}
	{
		sigset_t all, saved;

		/* The thread must never run the host's or libevent's handlers. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &saved);
		r = -pthread_create(&c->thread, NULL, writer_main, c);
		pthread_sigmask(SIG_SETMASK, &saved, NULL);
	}
	if (r < 0)
		goto fail;
	c->started = true;
	*ret = c;
	return 0;
fail:
	console_free(c, 0);
	return r;
}

bool console_flush(struct agent_console *c, uint32_t timeout_ms)
{
	struct timespec until = clock_monotonic_in(timeout_ms);
	bool empty;

	if (!c)
		return true;
	if (c->base)
		return loop_wait(c, drained, 0, 0, clock_now_ms() + timeout_ms);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		empty = true;
		for (int i = 0; i < 2; i++) {
			struct console_q *q = &c->q[i];

			/* The count of a last drop is shown too, once there is room. */
			if (!q->dead && q->dropped_lines && put_marker(q, 0))
				pthread_cond_signal(&c->cv);
			if ((q->len || q->writing || q->dropped_lines) && !q->dead)
				empty = false;
		}
		if (empty || !c->started ||
		    pthread_cond_timedwait(&c->idle_cv, &c->mu, &until) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&c->mu);
	return empty;
}

void console_free(struct agent_console *c, uint32_t flush_timeout_ms)
{
	if (!c)
		return;
	if (c->started) {
		bool drained = console_flush(c, flush_timeout_ms);

		pthread_mutex_lock(&c->mu);
		c->stop = true;
		pthread_cond_signal(&c->cv);
		pthread_mutex_unlock(&c->mu);
		/* A reader that never reads must not hold the agent forever: the
		 * thread is then blocked in write(), its one cancellation point. */
		if (!drained)
			pthread_cancel(c->thread);
		pthread_join(c->thread, NULL);
	}
	if (c->base)
		(void)console_flush(c, flush_timeout_ms);
	for (int i = 0; i < 2; i++)
		if (c->q[i].wev)
			event_free(c->q[i].wev);
	pthread_cond_destroy(&c->idle_cv);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	for (int i = 0; i < 2; i++)
		free(c->q[i].buf);
	free(c);
}
