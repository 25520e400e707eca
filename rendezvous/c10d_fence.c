/* c10d_fence.c: fencing a member cut off from its rendezvous store (c10d_int.h).
 * A store that cannot hear this agent ends its lease after a TTL, and the
 * other members move on without it; so once the lease has gone unrenewed
 * for a TTL, this agent must stop its workers, or two live workers would
 * hold one rank. Timed on the agent's loop, not by the monitor thread, which
 * may sit in a store call of up to a TTL when the store went silent.
 *
 * A store whose process is down (restarting crun-rdzvd: its host refuses
 * the connection) ends no lease while down, and comes back empty: the
 * members then wait for each other for a TTL, a heartbeat and a redial
 * (monitor.c). So while the renewal is overdue the loop probes the store's
 * address with a bare TCP connect, never sending a byte: a refusal moves the
 * fence out by that much from then; anything else (accepted, unreachable,
 * no answer within a heartbeat) leaves it at the TTL.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/event.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"

uint64_t c10d_fence_deadline(uint64_t kept_ms, uint64_t down_ms, uint32_t ttl_ms, uint32_t hb_ms)
{
	uint64_t back = down_ms ? down_ms + ttl_ms + hb_ms + C10D_REDIAL_MS : 0;

	return MAX(kept_ms + ttl_ms, back);
}

static void check(struct c10d_fence *f);

static void arm(struct c10d_fence *f, uint64_t in_ms)
{
	struct timeval tv = {(time_t)(in_ms / 1000), (suseconds_t)(in_ms % 1000 * 1000)};

	if (evtimer_add(f->timer, &tv) < 0)
		log_at(LL_WARN, SUB_RDZV, "cannot arm the rendezvous fence timer, ignoring");
}

static void probe_end(struct c10d_fence *f, int err)
{
	if (f->probe)
		event_free(f->probe);
	f->probe = NULL;
	fd_close(f->probe_fd);
	f->probe_fd = -1;
	if (err == ECONNREFUSED)
		f->down_ms = clock_now_ms();
	log_at(LL_DEBUG, SUB_RDZV, "fence: the renewal is overdue; a connect to the store: %s",
	       err ? strerror(err) : "accepted");
	f->probed = true;
	check(f);
}

static void probe_on_done(evutil_socket_t fd, short what, void *arg)
{
	int err = ETIMEDOUT;
	socklen_t len = sizeof(err);

	if (!(what & EV_TIMEOUT) && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		err = errno;
	probe_end(arg, err);
}

/* A non-blocking connect to the store; probe_end() gets its outcome. */
static void probe(struct c10d_fence *f)
{
	struct timeval tv = {(time_t)(f->hb_ms / 1000), (suseconds_t)(f->hb_ms % 1000 * 1000)};
	int fd = socket(f->sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int err;

	if (fd < 0) {
		f->probed = true; /* no verdict: the TTL stands */
		check(f);
		return;
	}
	f->probe_fd = fd;
	err = connect(fd, (const struct sockaddr *)&f->sa, f->salen) == 0 ? 0 : errno;
	if (err != EINPROGRESS) {
		probe_end(f, err);
		return;
	}
	f->probe = event_new(f->base, fd, EV_WRITE, probe_on_done, f);
	if (!f->probe || event_add(f->probe, &tv) < 0)
		probe_end(f, 0);
}

/* On the timer and at each probe's end: fence once the deadline passed with
 * no refusal in the last probe; probe while the renewal is overdue. */
static void check(struct c10d_fence *f)
{
	uint64_t now = clock_now_ms(), kept = f->kept(f->arg), due;
	bool probed = f->probed;

	f->probed = false;
	if (!f->on || !kept)
		return; /* stopped, or no monitor (any more) */
	due = c10d_fence_deadline(kept, f->down_ms, f->ttl_ms, f->hb_ms);
	if (f->salen && !probed && now >= kept + 2ull * f->hb_ms) {
		probe(f);
		return;
	}
	if (now >= due) {
		log_at(LL_DEBUG, SUB_RDZV,
		       "fence: last renewal %" PRIu64 " ms ago, last refusal %" PRIu64 " ms ago",
		       now - kept, f->down_ms ? now - f->down_ms : 0);
		f->on = false;
		f->on_fence(f->arg);
		return;
	}
	/* Overdue: the next probe a heartbeat on. Not yet: wake when it
	 * becomes overdue, not only at the deadline - a store that is down
	 * for a moment and back by then was never seen refusing, and the
	 * fence would fire at the TTL although that store ended no lease. */
	if (now >= kept + 2ull * f->hb_ms)
		arm(f, MIN(due - now, f->hb_ms));
	else
		arm(f, MIN(due, kept + 2ull * f->hb_ms) - now);
}

static void fence_on_timer(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	check(arg);
}

int c10d_fence_init(struct c10d_fence *f, struct event_base *base, const char *host, uint16_t port,
		    c10d_fence_kept_fn kept, void (*on_fence)(void *arg), void *arg)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char ps[8];

	memset(f, 0, sizeof(*f));
	f->base = base;
	f->probe_fd = -1;
	f->kept = kept;
	f->on_fence = on_fence;
	f->arg = arg;
	f->timer = evtimer_new(base, fence_on_timer, f);
	if (!f->timer)
		return CRUN_ENOMEM;
	/* Resolved once, here (before the loop runs); NULL host: no probe. */
	if (host && str_printf(ps, sizeof(ps), "%u", port) >= 0 &&
	    getaddrinfo(host, ps, &hints, &res) == 0 && res->ai_addrlen <= sizeof(f->sa)) {
		memcpy(&f->sa, res->ai_addr, res->ai_addrlen);
		f->salen = res->ai_addrlen;
	}
	if (res)
		freeaddrinfo(res);
	return 0;
}

void c10d_fence_start(struct c10d_fence *f, uint32_t ttl_ms, uint32_t hb_ms)
{
	c10d_fence_stop(f);
	f->ttl_ms = ttl_ms;
	f->hb_ms = MAX(hb_ms, 1u);
	f->down_ms = 0;
	f->on = true;
	arm(f, MIN(ttl_ms, f->hb_ms));
}

void c10d_fence_stop(struct c10d_fence *f)
{
	f->on = false;
	if (f->timer)
		evtimer_del(f->timer);
	if (f->probe) { /* its fd is open exactly while its event is */
		event_free(f->probe);
		f->probe = NULL;
		fd_close(f->probe_fd);
		f->probe_fd = -1;
	}
}

void c10d_fence_release(struct c10d_fence *f)
{
	c10d_fence_stop(f);
	if (f->timer)
		event_free(f->timer);
	f->timer = NULL;
}
