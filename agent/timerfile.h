/* timerfile.h: torchrun's expiry timers, TORCHELASTIC_TIMER_FILE (timerfile.c). */
#ifndef CRUN_AGENT_TIMERFILE_H
#define CRUN_AGENT_TIMERFILE_H

#include <stddef.h>
#include <sys/types.h>

struct event_base;
struct crun_agent;

struct agent_timers;
/* One FileTimerClient request line, parsed (pure; unit-tested). */
struct agent_timer_req {
	pid_t pid;
	int sig;	/* 0: do not signal */
	double expires; /* wall seconds; negative: release */
	char scope[128];
};
int agent_timers_parse(const char *line, struct agent_timer_req *ret);
/* With TORCHELASTIC_ENABLE_FILE_TIMER=1 in env: makes the FIFO (at
 * $TORCHELASTIC_TIMER_FILE, else $TMPDIR/crun-timer-<pid>.fifo, written to
 * path) and serves it on base; the caller exports path as
 * TORCHELASTIC_TIMER_FILE before the agent copies its environment. *ret is
 * NULL when not enabled. 0 or -errno / CRUN_EINVAL (not a FIFO). */
int agent_timers_from_env(struct event_base *base, char *const *env, char *path, size_t cap,
			  struct agent_timers **ret);
int agent_timers_start(struct event_base *base, const char *path, struct agent_timers **ret);
/* The agent whose running workers may be signalled (borrowed). t NULL: no-op. */
void agent_timers_attach(struct agent_timers *t, struct crun_agent *a);
void agent_timers_stop(struct agent_timers *t); /* removes a FIFO it made; NULL: no-op */

#endif /* CRUN_AGENT_TIMERFILE_H */
