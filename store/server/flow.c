/* flow.c: a store connection's output and flow control: replies written
 * straight from the callback that made them, output pushed by other
 * connections' operations and its ceiling, parking, and reading turned off
 * and on for backpressure (a connection whose replies are unread) and for the
 * total output budget (srv->stalled). Split out of server.c so that the
 * operations (server_ops.c, waits.c), which call these, do not depend on the
 * connection's close path (conn.c), which calls them: nothing here calls back.
 */
#include <stdint.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>

#include "common/common.h"
#include "store/server/server_int.h"

/* ---- output ------------------------------------------------------------------ */

/* Replies are written straight from the callback that made them: one
 * writev, instead of arming EV_WRITE and writing on the next loop turn (two
 * epoll_ctl calls per request). Only what the socket does not take, or an
 * error, is left to the bufferevent, whose callbacks then finish the job. */
void store_conn_flush(struct store_conn *c)
{
	struct evbuffer *out = store_conn_out(c);

	if (c->writing || !evbuffer_get_length(out))
		return;
	if (c->srv->cfg.tls) {
		/* Only the TLS bufferevent may write: it encrypts. */
		c->writing = true;
		bufferevent_enable(c->bev, EV_WRITE);
		return;
	}
	/* A socket bufferevent freezes its output's start so only it drains
	 * it; write the way its own write callback does. */
	evbuffer_unfreeze(out, 1);
	(void)evbuffer_write(out, bufferevent_getfd(c->bev));
	evbuffer_freeze(out, 1);
	if (!evbuffer_get_length(out))
		return;
	c->writing = true;
	bufferevent_enable(c->bev, EV_WRITE);
}

static void conn_doom(struct store_conn *c)
{
	c->doomed = true;
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* Output pushed to a connection by someone else's operation (wake-ups, watch
 * notifications) is not throttled; a connection that lets it pile up past its
 * hard ceiling is closed from its own (deferred) callback. */
void store_conn_check_pushed(struct store_conn *c)
{
	if (evbuffer_get_length(store_conn_out(c)) > c->srv->out_hard_cap)
		conn_doom(c);
}

bool store_conn_may_push(struct store_conn *c, size_t bytes)
{
	struct store_server *srv = c->srv;

	if (c->doomed)
		return false;
	if (evbuffer_get_length(store_conn_out(c)) + bytes <= srv->out_hard_cap &&
	    (bytes <= SMALL_REPLY || srv->out_bytes + bytes <= srv->cfg.max_total_output_bytes))
		return true;
	conn_doom(c);
	return false;
}

/* Lets a parked connection read on; its buffered input is processed from a
 * deferred callback, never re-entrantly from another connection's op. */
void store_conn_unpark(struct store_conn *c)
{
	if (!c->parked)
		return;
	c->parked = false;
	if (evbuffer_get_length(bufferevent_get_input(c->bev)))
		bufferevent_trigger(c->bev, EV_READ,
				    BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}

/* ---- plain-socket reading ---------------------------------------------------- */

/* A plain TCP connection is read by an event of its own, one recv() per
 * readiness, instead of by its socket bufferevent: libevent's evbuffer_read
 * asks FIONREAD (an ioctl) before every read, a quarter of the system calls
 * a request costs in a worker-init storm. Output, the deferred read
 * triggers and the callbacks stay the bufferevent's. Connections whose
 * bufferevent must read (TLS decrypts in it) have rd_ev NULL. */

/* Reading on or off for flow control (throttled, stalled). */
void store_conn_read(struct store_conn *c, bool on)
{
	if (!c->rd_ev) {
		if (on)
			bufferevent_enable(c->bev, EV_READ);
		else
			bufferevent_disable(c->bev, EV_READ);
		return;
	}
	c->rd_on = on;
	if (on && !c->rd_full)
		event_add(c->rd_ev, NULL);
	else
		event_del(c->rd_ev);
}

/* The input fell below its ceiling (the bufferevent's read high watermark). */
void store_conn_read_unfull(struct store_conn *c)
{
	c->rd_full = false;
	if (c->rd_on)
		event_add(c->rd_ev, NULL);
}

/* ---- the total output budget --------------------------------------------- */

/* Resumes every connection paused on the total output budget; each
 * re-checks its front request from a deferred callback (and may pause again). */
void store_server_on_unstall(evutil_socket_t fd, short what, void *arg)
{
	struct store_server *srv = arg;

	(void)fd;
	(void)what;
	srv->stall_min = SIZE_MAX;
	while (!DL_EMPTY(&srv->stalled)) {
		struct store_conn *c = DL_ENTRY(srv->stalled.next, struct store_conn, stall_link);

		dl_del(&c->stall_link);
		c->stalled = false;
		if (!c->throttled)
			store_conn_read(c, true);
		bufferevent_trigger(c->bev, EV_READ,
				    BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
	}
}

/* ---- one connection's output ceiling -------------------------------------- */

/* The bufferevent drained the output to the low watermark. */
void store_conn_on_write(struct bufferevent *bev, void *arg)
{
	struct store_conn *c = arg;

	if (c->throttled) {
		store_conn_throttle(c, false);
		return;
	}
	if (!evbuffer_get_length(bufferevent_get_output(bev))) {
		c->writing = false;
		bufferevent_disable(bev, EV_WRITE);
	}
}

/* Pauses reading while the peer does not read its replies; the write
 * callback (output drained to half the ceiling) resumes it. */
void store_conn_throttle(struct store_conn *c, bool on)
{
	size_t cap = c->srv->cfg.max_conn_output_bytes;

	c->throttled = on;
	log_at(LL_DEBUG, SUB_STORE, "client %s reading: %zu reply bytes unsent",
	       on ? "paused" : "resumed", evbuffer_get_length(store_conn_out(c)));
	if (on) {
		c->srv->metrics[STORE_M_PAUSE_CONN_OUTPUT]++;
		store_conn_read(c, false);
		bufferevent_setwatermark(c->bev, EV_WRITE, cap / 2, 0);
		c->writing = true;
		bufferevent_enable(c->bev, EV_WRITE);
		return;
	}
	bufferevent_setwatermark(c->bev, EV_WRITE, 0, 0);
	if (!c->stalled)
		store_conn_read(c, true);
	bufferevent_trigger(c->bev, EV_READ, BEV_TRIG_IGNORE_WATERMARKS | BEV_TRIG_DEFER_CALLBACKS);
}
