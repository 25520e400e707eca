/* notify.c: the service half of crun-agent and crun-rdzvd: systemd's notify
 * protocol (common/notify.c), the watchdog ping that proves the loop turns,
 * and SIGHUP as "re-read the config" (the owner's on_reload). All of it runs
 * on the owner's loop; what STATUS= says is the owner's.
 */
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include <event2/event.h>

#include "common/common.h"
#include "service/service.h"

/* STATUS= refresh without a watchdog (with one: every ping). */
#define SERVICE_TICK_MS 3000

/* name's value in env ("NAME=value" strings), or NULL: the owner's
 * environment, which may not be the process's. */
static const char *env_value(char *const *env, const char *name)
{
	size_t n = strlen(name);

	for (; env && *env; env++)
		if (strncmp(*env, name, n) == 0 && (*env)[n] == '=')
			return *env + n + 1;
	return NULL;
}

static void svc_on_watchdog(evutil_socket_t fd, short what, void *arg)
{
	struct service *s = arg;

	/* The ping proves the loop turns; a wedged loop misses it and systemd
	 * restarts the unit (WatchdogSec=). Without a watchdog the timer only
	 * refreshes STATUS=. */
	if (s->wd)
		(void)notify_send(s->notify, "WATCHDOG=1");
	if (s->on_tick)
		s->on_tick(s->arg);
}

static void svc_on_sighup(evutil_socket_t fd, short what, void *arg)
{
	struct service *s = arg;

	(void)notify_send(s->notify, "RELOADING=1\nMONOTONIC_USEC=%llu",
			  (unsigned long long)clock_now_us());
	s->on_reload(s->arg); /* ends with READY=1 and a STATUS= */
}

int service_start(struct service *s, struct event_base *base, char *const *env,
		  void (*on_reload)(void *arg), void (*on_tick)(void *arg), void *arg)
{
	uint64_t wd_ms =
	    notify_watchdog_ms(env_value(env, "WATCHDOG_USEC"), env_value(env, "WATCHDOG_PID"));

	memset(s, 0, sizeof(*s));
	s->on_reload = on_reload;
	s->on_tick = on_tick;
	s->arg = arg;
	if (notify_open(env_value(env, "NOTIFY_SOCKET"), &s->notify) < 0) {
		log_at(LL_WARN, SUB_AGENT, "NOTIFY_SOCKET '%s' is not usable, ignoring",
		       env_value(env, "NOTIFY_SOCKET"));
		s->notify = NULL;
	}
	s->sighup = evsignal_new(base, SIGHUP, svc_on_sighup, s);
	if (!s->sighup || evsignal_add(s->sighup, NULL) < 0)
		return CRUN_ENOMEM;
	s->wd = wd_ms != 0;
	if (!wd_ms && on_tick)
		wd_ms = SERVICE_TICK_MS;
	if (wd_ms && s->notify) {
		struct timeval tv = {.tv_sec = (time_t)(wd_ms / 1000),
				     .tv_usec = (suseconds_t)(wd_ms % 1000) * 1000};

		s->watchdog = event_new(base, -1, EV_PERSIST, svc_on_watchdog, s);
		if (!s->watchdog || event_add(s->watchdog, &tv) < 0)
			return CRUN_ENOMEM;
		if (s->wd)
			(void)notify_send(s->notify, "WATCHDOG=1");
	}
	return 0;
}

void service_stopping(struct service *s)
{
	if (!s->stopping)
		(void)notify_send(s->notify, "STOPPING=1");
	s->stopping = true;
}

void service_stop(struct service *s)
{
	service_stopping(s);
	if (s->watchdog)
		event_free(s->watchdog);
	if (s->sighup)
		event_free(s->sighup);
	notify_close(s->notify);
	memset(s, 0, sizeof(*s));
}
