/* agent.h: struct crun_agent and what works on the whole of it. The public
 * face is include/crun/agent.h (crun_agent_*). Each part has its own header,
 * and a file that does not touch struct crun_agent includes only the parts it
 * uses (issue 24: this header was 625 lines and 27 files included it):
 *   agent.c      life cycle, store server, rendezvous glue          (this header)
 *   attempt.c    one attempt: its workers' start, on_event, its end (this header)
 *   heartbeat.c  --worker_heartbeat_timeout                         (this header)
 *   orphans.c    what workers leave behind (crun the subreaper)     (this header)
 *   fsm.c        the state table and its actions, restart policy    fsm.h
 *   fsm_names.c  the names of its states and events                 fsm.h
 *   spawn.c, supervise.c, signals.c  the workers and their guard    workers.h
 *   logs.c       where worker output goes, tailing, prefixes        outputs.h
 *   console.c    the console writer (a thread, or the loop)         console.h
 *   errfile.c    error files, failure records, root cause           failures.h
 *   poll.c       poll mode: the loop's fds in one epoll fd          poll.h
 *   numa.c       --numa-binding from sysfs                          numa.h
 *   env.c        worker environment and argv                        env.h
 *   cli*.c       the option table: command line, JSON, env          cli.h (cli_int.h)
 *   daemon.c     crun-agent as a service (service/)                 daemon.h
 *   event_print.c  --event_log_handler=console's lines              event_print.h
 *   status.c     the agent as its status page's source              status.h
 *   timerfile.c  TORCHELASTIC_TIMER_FILE                            timerfile.h
 *   ctl.c        crunctl's client of the status pages               ctl.h
 *   slurm.c      defaults from a Slurm allocation                   slurm.h
 *   nodecheck.c  --node_check, --max_node_failures                  nodecheck_int.h
 *   stacks*.c, hang.c  stack captures, --hang_timeout                stacks_int.h
 * Everything runs on the agent's loop thread, except console.c's writer
 * thread (blocking mode) and the rendezvous helpers (rendezvous/helper.c).
 */
#ifndef CRUN_AGENT_AGENT_H
#define CRUN_AGENT_AGENT_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "crun/agent.h"
#include "agent/failures.h"
#include "agent/fsm.h"
#include "agent/workers.h"

struct event_base;
struct event;
struct store_server;
struct store_proxy;
struct rdzv;
struct status_page;

/* ---- workers ---------------------------------------------------------------- */

#define AGENT_LINGER_MS 5000 /* node 0 waits this long for the others to leave */

/* ---- the agent --------------------------------------------------------------- */

struct crun_agent {
	crun_agent_config_t cfg;
	struct event_base *base;
	bool own_base;
	enum agent_state state;
	enum stop_reason stop_reason;
	int stop_signal;   /* signal forwarded on STOP_SIGNAL */
	int restart_count; /* TORCHELASTIC_RESTART_COUNT */
	int group_rank;	   /* of the current round */
	int exit_code;	   /* crun_agent_run()'s *ret_exit_code */
	bool failing;	   /* c10d: closing the job as failed, exit 1 after */
	int run_error;	   /* crun_agent_run()'s return value */
	char role[64];
	char run_id[256];
	char host[256];
	char short_host[256];	 /* ${hostname}: up to the first dot */
	char signals_str[256];	 /* TORCHELASTIC_SIGNALS_TO_HANDLE */
	char log_base[PATH_MAX]; /* --log_dir or the temp dir */
	char run_dir[PATH_MAX];	 /* <log_base>/<run_id>_XXXXXXXX */
	char **argv;		 /* owned copy of the worker command */
	void *owned[24];	 /* copies of cfg's strings and arrays */
	int nowned;
	char *exe;	  /* resolved argv[0], or NULL */
	int exe_errno;	  /* why it did not resolve */
	char **envp_base; /* owned copy of the agent's environment */
	/* workers.h: the local workers and their guard (a->wk.workers). */
	struct agent_workers wk;
	/* failures.h: the current attempt's failures (a->fail.failures). */
	struct agent_failures fail;
	struct store_server *store;
	struct store_proxy *proxy; /* worker_store=proxy, not group rank 0: this
				    * attempt's proxy to the round's store */
	struct rdzv *rdzv;
	struct event *sig_ev[65];
	struct event *grace_timer;
	struct event *window_timer; /* fires AE_FAILURE_WINDOW */
	bool window_armed, window_over;
	struct event *linger_timer; /* re-fires AE_BARRIER_DONE while lingering */
	uint64_t linger_until_ms;
	struct event *stop_req; /* crun_agent_stop() from another thread */
	int stop_req_fd[2];
	volatile sig_atomic_t stop_req_sig;
	struct agent_heartbeat *hb; /* heartbeat.c; NULL when off or between attempts */
	/* poll mode (crun_agent_start): no signal events, pidfds, epoll mirror */
	bool started;
	bool poll_mode;
	struct agent_poll *poll;
	struct status_page *status_page; /* cfg.status_listen's page, or NULL */
	/* Told of every event before cfg.on_event (attempt.c): the status page
	 * of cfg.status_listen subscribes here with the public callback type,
	 * as an embedder subscribes through on_event (agent.c's start_status). */
	crun_agent_event_fn listener;
	void *listener_arg;
	sigset_t orig_mask;
	struct rlimit nofile_orig;  /* restored in the workers */
	bool subreaper;		    /* the process adopts orphans: sweep worker groups */
	struct agent_orphans *orph; /* orphans.c: adopted orphans being stopped */
	struct agent_outputs *out;  /* outputs.h: logs, console, filters */
	/* numa.c: cpu lists per local rank, or NULL */
	char **numa_cpus;
	char err[512];
	/* nodecheck.c: the node check and the node's failure count */
	struct agent_nodecheck *nc;
	int node_failures;	  /* attempts in which this node's workers failed */
	struct agent_stacks *stk; /* stacks.c: the last capture, or NULL */
	struct agent_hang *hang;  /* hang.c: --hang_timeout's watch, or NULL */
};

/* Events for cfg.on_event (agent.c); no-ops without a callback. */
void agent_emit_state(struct crun_agent *a, crun_agent_state_t st);
void agent_emit_worker(struct crun_agent *a, const struct worker *w, bool exited);

/* ---- heartbeat.c: --worker_heartbeat_timeout ----------------------------------- */

/* For worker w of the attempt: creates its heartbeat file and appends
 * CRUN_HEARTBEAT_FILE to *envp (reallocated). No-op when the timeout is 0. */
int heartbeat_prepare(struct crun_agent *a, const struct worker *w, const char *attempt_dir,
		      char ***envp);
/* Starts watching the attempt's files (after every worker was started); a
 * worker silent past the timeout gets an error file naming it and SIGKILL. */
int heartbeat_arm(struct crun_agent *a);
void heartbeat_disarm(struct crun_agent *a); /* stops, removes the files */
/* Pure: index of the watched worker whose last beat (seen_ms, monotonic; 0:
 * its file is gone) is oldest and more than timeout_ms before now_ms, or -1
 * (unit-tested). */
int heartbeat_silent(const uint64_t *seen_ms, const bool *watch, int n, uint64_t now_ms,
		     uint32_t timeout_ms);
/* Pure: the monotonic time of the last beat of a file whose mtime was *last
 * when its last beat was seen at seen_ms and is now_mtime at now_ms. Any
 * change of the mtime, forward or back (a wall-clock step), is a beat and
 * updates *last. The wall clock is never compared with the mtime. */
uint64_t heartbeat_observe(struct timespec *last, const struct timespec *now_mtime,
			   uint64_t seen_ms, uint64_t now_ms);

/* ---- orphans.c: what workers leave behind --------------------------------------- */

/* Pure: ppid, process group and state letter from the text of a
 * /proc/<pid>/stat (a comm with spaces or parentheses included). 0 or
 * CRUN_EINVAL. */
int orphans_parse_stat(const char *stat, pid_t *ret_ppid, pid_t *ret_pgrp, char *ret_state);
/* Subreaper only (else 0, nothing done): finds the adopted orphans (children
 * of this process that are neither a running worker nor the guard), logs the
 * new ones' pids, sends sig to every one (to the group an orphan leads) and
 * remembers sig as the stop's signal. Returns how many are tracked (alive,
 * signalled, not yet reaped). A zombie orphan is reaped on the way. */
int orphans_signal(struct crun_agent *a, int sig);
/* During a stop: the same for orphans adopted since (a worker just exited). */
void orphans_rescan(struct crun_agent *a);
/* At exited worker w's reap (its zombie still pins the pgid): one WARN line
 * naming what is left of its group, if any, and what becomes of it: the
 * SIGKILL that follows, or (succeeded) left running until the attempt or the
 * job ends, when a subreaper stops it as an orphan. */
void orphans_log_group(const struct crun_agent *a, const struct worker *w, bool succeeded);
/* Reaps tracked orphans that exited (WNOHANG); true when one did. */
bool orphans_reap(struct crun_agent *a);
int orphans_alive(const struct crun_agent *a); /* tracked, not yet reaped */
void orphans_stop_over(struct crun_agent *a);  /* the stop is over: no rescans */
/* The agent's end (blocking; the loop is over): SIGTERM to every orphan,
 * grace_ms, SIGKILL to the rest, reaped; frees the tracking. */
void orphans_end(struct crun_agent *a, uint32_t grace_ms);

#endif /* CRUN_AGENT_AGENT_H */
