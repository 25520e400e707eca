/* agent.h: the agent module's interface inside crun. The public face is
 * include/crun/agent.h (crun_agent_*); this header joins the agent's files:
 *   agent.c      life cycle, store server, rendezvous glue
 *   attempt.c    one attempt: its workers' start, on_event, its end and failures
 *   fsm.c        the state table and its actions (restart policy lives here)
 *   fsm_names.c  the names of its states and events
 *   spawn.c      fork/exec of one worker (STYLE §6 protocol) (workers.h)
 *   supervise.c  signals as loop events, the one reap path, stopping, guard (workers.h)
 *   signals.c    signal names and --signals_to_handle lists (workers.h)
 *   logs.c       where worker output goes, tailing teed files, prefixes (outputs.h)
 *   console.c    the console writer, a thread or the loop in poll mode (console.h)
 *   poll.c       poll mode: the loop's fds mirrored into one epoll fd
 *   numa.c       --numa-binding: a GPU's NUMA node/socket/cores from sysfs
 *   errfile.c    error files, failure records, the root-cause summary (failures.h)
 *   env.c        worker environment and argv
 *   cli*.c       the option table: command line, JSON config, env -> config
 *   daemon.c     crun-agent as a service (STATUS= lines, SIGHUP reload; service/)
 *   event_print.c  --event_log_handler=console's JSON lines
 *   status.c     the agent's part of the status page (service/status.c)
 *   ctl.c        crunctl's client of the status pages
 *   heartbeat.c  --worker_heartbeat_timeout
 *   orphans.c    stopping what workers leave behind (when crun is the subreaper)
 *   nodecheck.c  --node_check and --max_node_failures (nodecheck_int.h)
 * Everything runs on the agent's loop thread, except console.c's writer
 * thread (blocking mode) and the rendezvous helpers (rendezvous/helper.c).
 */
#ifndef CRUN_AGENT_AGENT_H
#define CRUN_AGENT_AGENT_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sched.h>
#include <sys/resource.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "crun/agent.h"
#include "agent/cli_rdzv_int.h"
#include "agent/failures.h"
#include "agent/outputs.h"
#include "agent/workers.h"
#include "service/service.h"

struct event_base;
struct event;
struct store_server;
struct store_proxy;
struct rdzv;

/* ---- state machine (fsm.c) ------------------------------------------------ */

/* AS_CHECKING: the node check between a round and its workers (nodecheck.c). */
enum agent_state {
	AS_INIT,
	AS_RENDEZVOUS,
	AS_RUNNING,
	AS_STOPPING,
	AS_BARRIER,
	AS_DONE,
	AS_CHECKING,
	AS__MAX
};
enum agent_event {
	AE_START,	  /* crun_agent_run() began */
	AE_RDZV_COMPLETE, /* round result available */
	AE_RDZV_FAILED,
	AE_WORKER_EXIT,	  /* one or more workers were reaped */
	AE_PEER_CHANGED,  /* membership changed (c10d) */
	AE_TERM_SIGNAL,	  /* operator signal or crun_agent_stop() */
	AE_GRACE_EXPIRED, /* shutdown timeout passed */
	AE_BARRIER_DONE,
	AE_SPARE_DONE,	   /* c10d: the job ended while this node waited as a spare */
	AE_FAILURE_WINDOW, /* monitor_interval_ms passed since the first failure */
	AE_CHECK_DONE,	   /* the node check ended (nodecheck.c) */
	AE__MAX,
};

/* Why the workers are being stopped; decides what follows AS_STOPPING. */
enum stop_reason { STOP_NONE, STOP_RESTART, STOP_FAILED, STOP_SIGNAL, STOP_PEER, STOP_PEER_FAILED };

struct crun_agent;
typedef enum agent_state (*agent_action)(struct crun_agent *a);

/* The transition table; a NULL cell means the event is ignored there.
 * Exposed for unit tests of the table. */
extern const agent_action agent_fsm[AS__MAX][AE__MAX];
crun_agent_state_t agent_public_state(enum agent_state s); /* the API's name for s */
/* "running", "worker-exit": log lines, the status page (fsm_names.c, a leaf) */
const char *agent_state_name(enum agent_state s);
const char *agent_event_name(enum agent_event e);
void agent_fire(struct crun_agent *a, enum agent_event ev);

/* The restart policy as a pure function (unit-tested): what to do after a
 * worker exit given the failures of this attempt and the workers still up. */
enum agent_decision { DECIDE_WAIT, DECIDE_SUCCESS, DECIDE_RESTART, DECIDE_FAIL };
enum agent_decision agent_decide(int nfailed, int nrunning, int restart_count, int max_restarts);
enum agent_state agent_after_stop(struct crun_agent *a);

/* agent.c, used by the actions: */
/* The worker store admits this round's nodes (and loopback) only; the node
 * check reaches it before the workers do. */
void agent_allow_round_peers(struct crun_agent *a);
int agent_start_attempt(struct crun_agent *a); /* spawn every worker of the attempt */
void agent_end_attempt(struct crun_agent *a);  /* close logs, drop failure records */
/* Records the new failures of reaped workers (failures.h; which exits count
 * is the restart policy); returns the count of the attempt. */
int agent_collect_failures(struct crun_agent *a);
void agent_report_failure(struct crun_agent *a); /* root-cause summary on stderr */
/* One line naming the root cause's node, rank and exit code ("" if none). */
void agent_root_cause_line(struct crun_agent *a, char *buf, size_t cap);

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
	struct agent_status *status; /* cfg.status_listen's page, or NULL */
	/* Told of every public state change (attempt.c). The status page
	 * subscribes here (agent.c's start_status) rather than being called
	 * by name, which kept status.c in the agent's call loop (issue 24). */
	void (*state_listener)(void *arg, crun_agent_state_t st);
	void *state_listener_arg;
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

/* ---- poll.c: poll mode ---------------------------------------------------------- */

struct agent_poll;
int agent_poll_new(struct event_base *base, struct agent_poll **ret);
void agent_poll_free(struct agent_poll *p); /* NULL: no-op */
int agent_poll_fd(const struct agent_poll *p);
/* Mirrors the fds the loop waits on into the epoll fd (after each pass). */
int agent_poll_refresh(struct agent_poll *p);
/* Milliseconds to the loop's next timer, 0 when events are active, -1. */
int agent_poll_timeout_ms(struct agent_poll *p);

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

/* ---- numa.c ---------------------------------------------------------------------- */

/* For --numa-binding: the cpu list (as in sysfs, "0-3,8-11") each of the
 * first n GPUs should run on, read under `root` ("" = the real /). Modes:
 * node (the GPU's NUMA node), socket (every node of its package),
 * exclusive (the node's cpus split evenly between the GPUs sharing it),
 * core-complex (the cpus sharing the L3 cache with the first cpu of the
 * share exclusive gives). Returns 0 and a malloc'd array of n malloc'd
 * strings (free with numa_free), CRUN_ENOENT when there are fewer than n
 * GPUs, CRUN_EINVAL for an unknown mode, or -errno. */
int numa_cpus_for_gpus(const char *root, const char *mode, int n, char ***ret);
void numa_free(char **cpus, int n);
/* "0-3,8" -> mask; 0 or CRUN_EINVAL. */
int numa_parse_cpulist(const char *list, cpu_set_t *ret);

/* ---- env.c ---------------------------------------------------------------------- */

struct env_vars {
	int local_rank, rank, group_rank, role_rank;
	const char *role;
	int local_world_size, world_size, group_world_size, role_world_size;
	const char *master_addr;
	uint16_t master_port;
	int restart_count, max_restarts;
	const char *run_id;
	const char *error_file;
	const char *signals; /* TORCHELASTIC_SIGNALS_TO_HANDLE, or NULL */
	bool virtual_local_rank;
	const char *auth_secret_file; /* CRUN_AUTH_SECRET_FILE for the SDK's mesh, or NULL */
};

/* The interpreter for *.py and -m programs: $PYTHON_EXEC when set, else the
 * python3 beside the running program (a venv's bin/), else "python3" (looked
 * up on PATH at spawn). Returns a string borrowed from env, buf (cap bytes,
 * PATH_MAX is enough) or a static one. */
const char *env_python(char *const *env, char *buf, size_t cap);

/* A new NULL-terminated environment: `base` (borrowed) updated with the
 * torchrun worker variables. Free with env_free(). */
char **env_build(char *const *base, const struct env_vars *v);
char **env_copy(char *const *env);
void env_free(char **env);
const char *env_get(char *const *env, const char *name);
/* argv with "${local_rank}" replaced in every element; malloc'd. */
char **env_argv_subst(char *const *argv, int local_rank);

/* ---- cli.c ----------------------------------------------------------------------- */

/* The parsed command line (and JSON config); owns every string the config
 * points to. The option table is agent/cli_int.h. */
struct cli {
	crun_agent_config_t cfg;
	char **argv; /* worker command */
	int *redirects, *tee;
	unsigned char *console_ranks;
	char *strs[128]; /* owned strings */
	int nstrs;
	char **job_env;	  /* owned "K=V" list from job.env (the caller exports it) */
	char **file_args; /* owned job.args from the config file */
	char **resolved;  /* owned: each row's final value (cli_changes), or NULL */
	bool help, version;
	enum cli_prog prog;
	const char *completion;	       /* --print-completion SHELL, or NULL */
	bool schema;		       /* crun-agent --print-schema */
	bool man;		       /* --print-man (for packaging) */
	bool print_config;	       /* crun-agent --print-config (after a full parse) */
	const char *status_listen;     /* --status ADDR:PORT, or NULL (off) */
	const char *config_path;       /* crun-agent --config FILE, or NULL */
	const char *event_log_handler; /* "null" or "console" */
	int log_level;		       /* LL_* from --log_level/LOGLEVEL, or -1 */
	char err[512];		       /* message for exit code 2 */
	char note[512];		       /* informational banner (OMP_NUM_THREADS) */
	char warn[512];		       /* a warning for the caller to log once, or "" */
};

/* Parses torchrun's flags (argv[1..]) with PET_* defaults from env (crun's
 * rules). Returns 0, or CRUN_EINVAL with c->err naming the flag (exit 2).
 * `env` is borrowed. Equals cli_parse_prog(c, CLI_CRUN, ...). */
int cli_parse(struct cli *c, int argc, char *const *argv, char *const *env);
/* The same for `prog`: CLI_AGENT also reads --config FILE.json (a flag
 * overrides the file, the file overrides PET_* and defaults); errors in the
 * file name its JSON path. */
int cli_parse_prog(struct cli *c, enum cli_prog prog, int argc, char *const *argv,
		   char *const *env);
void cli_free(struct cli *c);
/* nproc_per_node value -> count; gpus from /proc or /dev, without CUDA;
 * Intel XPUs from /sys/class/drm (i915/xe render nodes). */
int cli_nproc(const char *v, int *ret);
int cli_gpu_count(void);
int cli_xpu_count(void);

/* --help of `prog`, from the option table; malloc'd (NULL on OOM). */
char *cli_help_new(enum cli_prog prog);
/* A completion script for shell "bash", "zsh" or "tcsh"; malloc'd, NULL for
 * another shell or OOM. */
char *cli_completion_new(enum cli_prog prog, const char *shell);
/* The man page of `prog` (roff, section 1) from the option table; malloc'd. */
char *cli_man_new(enum cli_prog prog);

/* The JSON schema (draft 2020-12) of crun-agent's config; malloc'd. */
char *cli_schema_new(void);
/* Every resolved setting of a parse as a JSON object keyed by JSON path
 * (the flag's name for rows without one) plus "argv"; malloc'd. */
char *cli_resolved_json(const struct cli *c);
/* What differs between two parses (a SIGHUP reload): settings that apply
 * live go to `live`, the others (a restart of the agent) to `restart`, both
 * as ", "-joined names ("" when none). */
void cli_changes(const struct cli *was, const struct cli *now, char *live, size_t live_cap,
		 char *restart, size_t restart_cap);

/* ---- daemon.c: crun-agent as a service ---------------------------------------- */

struct agent_daemon;
/* Speaks systemd's notify protocol ($NOTIFY_SOCKET: READY=1 once workers run,
 * STATUS= at every state change, WATCHDOG=1 at half $WATCHDOG_USEC,
 * STOPPING=1 at the end) and reloads the config on SIGHUP (RELOADING=1 ...
 * READY=1; the log level applies live, other changes are named as needing a
 * restart). Takes SIGHUP out of c->cfg.signals_to_handle (it means reload
 * here) and sets c->cfg.on_state. c, argv and env are borrowed for the
 * daemon's life (argv/env are parsed again on reload). */
int agent_daemon_new(struct event_base *base, struct cli *c, int argc, char *const *argv,
		     char *const *env, struct agent_daemon **ret);
/* The agent whose state STATUS= and the status page report (borrowed). */
void agent_daemon_attach(struct agent_daemon *d, struct crun_agent *a);
/* The address the status page bound ("127.0.0.1:8123"), or "" when off. */
const char *agent_daemon_status_addr(const struct agent_daemon *d);
void agent_daemon_free(struct agent_daemon *d); /* sends STOPPING=1; NULL: no-op */
/* crun-agent's exit status for an error `err` (< 0) that ended it: 2 when
 * retrying cannot help (CRUN_ECONFIG: config, secret, a spent run id;
 * CRUN_EADDRINUSE: a port taken), else 1. The units' RestartPreventExitStatus=2. */
int agent_daemon_exit_code(int err);
/* After crun_agent_run(): the signal that stopped the agent because an
 * operator asked (SIGTERM, SIGINT, ...: not a job that failed meanwhile),
 * or 0. crun-agent dies by it, which systemd counts as a clean stop. */
int agent_daemon_stop_signal(const struct crun_agent *a);
/* What crun_agent_new() would refuse but the parser cannot see: the secret
 * file (--auth_secret_file, security.secret_file, CRUN_AUTH_SECRET_FILE) of a
 * c10d or etcd rendezvous is readable and private. 0, or CRUN_ECONFIG with
 * err; for --print-config, which must not say yes to a config that cannot run. */
int agent_daemon_check(const struct cli *c, char *const *env, char *err, size_t cap);

/* ---- event_print.c: --event_log_handler=console's lines ------------------------- */

/* --event_log_handler=console: one JSON line for a state change, in the
 * shape of torchrun's events (name, source, timestamp, metadata). */
void agent_event_print(FILE *f, crun_agent_state_t st, int restart_count, const char *role);
/* That line's JSON (no newline), malloc'd; NULL on OOM. role NULL: "default". */
char *agent_event_json(crun_agent_state_t st, int restart_count, const char *role,
		       double timestamp_s);

/* ---- status.c: the agent's status page (service/'s page, this agent's job) ------- */

/* The page itself (routes, watchers, store counters) is service/status.c's;
 * agent/status.c feeds it the agent's job through struct status_source and
 * counts the workers' exit codes. */
struct agent_status;
/* Serves the page on `listen` ("ADDR:PORT", port 0: any free one) on base.
 * CRUN_EINVAL (bad address), CRUN_EADDRINUSE (cannot bind), CRUN_ENOMEM. */
int agent_status_start(struct event_base *base, const char *listen, struct agent_status **ret);
void agent_status_attach(struct agent_status *s, struct crun_agent *a); /* s NULL: no-op */
const char *agent_status_addr(const struct agent_status *s);		/* "127.0.0.1:8123" */
void agent_status_stop(struct agent_status *s);				/* NULL: no-op */
/* The bodies, malloc'd (NULL on OOM); a NULL agent gives the bare page. */
char *agent_status_json(const struct crun_agent *a, const struct store_server *srv);
/* {"jobs": [...]}: the agent's job, or the c10d jobs whose keys srv holds. */
char *agent_status_jobs_json(const struct crun_agent *a, const struct store_server *srv);
/* exits: 256 counters of worker exit codes, or NULL. With srv (crun-rdzvd's
 * page) crun_rdzvd_up and its store's crun_store_* labelled
 * store="rendezvous"; else crun_agent_up and a's store as store="worker". */
char *agent_status_metrics(const struct crun_agent *a, const struct store_server *srv,
			   const uint64_t *exits, uint64_t uptime_ms);
/* Call from the agent's state callback: counts the exit codes of each
 * attempt that ends (crun_agent_worker_exits_total) and moves the page's
 * version on. s NULL: no-op. */
void agent_status_on_state(struct agent_status *s, crun_agent_state_t st);

/* ---- timerfile.c: torchrun's expiry timers (TORCHELASTIC_TIMER_FILE) ---------- */

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

/* ---- ctl.c: crunctl's client of the status pages ---------------------------------- */

/* GET http://endpoint/path within timeout_ms: 0 with the HTTP status and the
 * body (malloc'd, NUL-terminated; free()), CRUN_EINVAL (bad endpoint),
 * CRUN_ERESOLVE (the name does not resolve), CRUN_ECONNREFUSED (nothing
 * listens), CRUN_ETIMEDOUT (no answer in time), CRUN_ECLOSED (closed before
 * a reply), CRUN_EHOSTUNREACH/CRUN_ENETUNREACH, CRUN_ETOOBIG or CRUN_ENOMEM. */
int agent_ctl_get(const char *endpoint, const char *path, uint32_t timeout_ms, int *ret_status,
		  char **ret_body);
/* As agent_ctl_get, a POST with no body and, unless bearer is NULL, an
 * "Authorization: Bearer <bearer>" header (crunctl drop). */
int agent_ctl_post(const char *endpoint, const char *path, const char *bearer, uint32_t timeout_ms,
		   int *ret_status, char **ret_body);
/* prefix then value percent-encoded (RFC 3986 unreserved bytes kept) into
 * buf: 0, or CRUN_ETOOBIG when it does not fit. */
int agent_ctl_query(char *buf, size_t cap, const char *prefix, const char *value);
/* Whether a /status or /jobs JSON body is about job run_id (its run_id, or
 * one of its jobs'). */
bool agent_ctl_serves_job(const char *json, const char *run_id);
/* What crunctl watch follows in a /status body (status.c). */
struct agent_ctl_state {
	int64_t version; /* state changes so far; -1: none on this page (crun-rdzvd) */
	char state[32];	 /* the agent's state; "" on a page without an agent */
	int exit_code;	 /* the agent's exit code once state is "done", else -1 */
};
/* 0, or CRUN_EPROTO when json is not a status page's body. */
int agent_ctl_read_state(const char *json, struct agent_ctl_state *ret);
/* The /status and /jobs JSON as tables; CRUN_EPROTO for something else. */
int agent_ctl_print_status(FILE *out, const char *json);
int agent_ctl_print_jobs(FILE *out, const char *json);
/* The /usage JSON as a table: JOB KEYS KEY_BYTES VALUE_BYTES WAITERS REFUSED
 * (ctl_usage.c); CRUN_EPROTO for something else. */
int agent_ctl_print_usage(FILE *out, const char *json);

/* ---- slurm.c: defaults from a Slurm allocation --------------------------------- */

#define SLURM_MAX_HOSTS 65536
#define SLURM_PORT_BASE 20000 /* rendezvous port = base + job id % span */
#define SLURM_PORT_SPAN 9000
#define SLURM_HOST_MAX	256

struct slurm_job {
	unsigned long job_id;		 /* SLURM_JOB_ID: the run id */
	int nnodes;			 /* SLURM_NNODES */
	int node_id;			 /* SLURM_NODEID */
	char first_host[SLURM_HOST_MAX]; /* first of SLURM_JOB_NODELIST: the endpoint */
	uint16_t port;			 /* derived from the job id */
};

/* Expands a Slurm hostlist ("gpu[01-04,07],login2") into at most max names
 * (malloc'd array of malloc'd strings; free with slurm_hostlist_free).
 * CRUN_EINVAL on bad syntax, CRUN_ERANGE past max. */
int slurm_hostlist_expand(const char *list, size_t max, char ***ret_hosts, size_t *ret_n);
void slurm_hostlist_free(char **hosts, size_t n);
/* The allocation's facts from env: CRUN_ENOTFOUND outside Slurm (no
 * SLURM_JOB_ID), CRUN_EINVAL when a variable is missing or malformed. */
int slurm_job_from_env(char *const *env, struct slurm_job *ret_job);

#endif /* CRUN_AGENT_AGENT_H */
