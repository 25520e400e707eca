/* crun/agent.h: the per-node elastic agent as a C API, for schedulers and for
 * crun's own programs. An agent joins a rendezvous, serves or uses the worker
 * store, spawns nproc_per_node workers with torchrun's environment, watches
 * them, restarts the group on failure and reports the root cause.
 *
 * Life cycle: fill a crun_agent_config_t from CRUN_AGENT_CONFIG_INIT (typed
 * fields, or any option of crun's table by name with crun_agent_config_set),
 * call crun_agent_new(), then either crun_agent_run() (blocks until the job
 * is over) or crun_agent_start() and crun_agent_dispatch() from the caller's
 * own poll loop, then crun_agent_free(). crun_agent_stop() may be called from
 * any thread or from a callback. Every other call on one agent must come
 * from one thread at a time, the one that runs or dispatches it.
 * Callbacks (on_state, on_event, spawn, run_blocking) are called on that
 * thread, from inside crun_agent_run()/crun_agent_dispatch().
 */
#ifndef CRUN_AGENT_H
#define CRUN_AGENT_H

#include "crun/crun.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct crun_agent crun_agent_t; /* opaque */

/* The agent's externally visible states, reported through on_state. */
typedef enum crun_agent_state {
	CRUN_AGENT_RENDEZVOUS = 0, /* joining a round (also between restarts) */
	CRUN_AGENT_RUNNING = 1,	   /* workers are up */
	CRUN_AGENT_STOPPING = 2,   /* workers are being stopped */
	CRUN_AGENT_BARRIER = 3,	   /* exit barrier after local success */
	CRUN_AGENT_DONE = 4,	   /* final; crun_agent_run() is about to return */
} crun_agent_state_t;

/* Called on the agent's loop thread at every state change. restart_count is
 * TORCHELASTIC_RESTART_COUNT of the current attempt. Must not block. */
typedef void (*crun_agent_state_fn)(crun_agent_state_t state, int restart_count, void *arg);

/* Redirect / tee values per stream, as torchrun's Std: bit 1 stdout, bit 2
 * stderr (0 none, 1 out, 2 err, 3 both). */
#define CRUN_STD_NONE	     0
#define CRUN_STD_OUT	     1
#define CRUN_STD_ERR	     2
#define CRUN_STD_ALL	     3
#define CRUN_AGENT_MAX_LOCAL 1024 /* nproc_per_node ceiling */

/* ---- events (on_event) --------------------------------------------------------- */

typedef enum crun_agent_event_type {
	CRUN_AGENT_EV_STATE = 0,	/* state, restart_count */
	CRUN_AGENT_EV_RENDEZVOUS = 1,	/* a round completed: the rdzv fields */
	CRUN_AGENT_EV_WORKER_START = 2, /* a worker was started: the worker fields */
	CRUN_AGENT_EV_WORKER_EXIT = 3,	/* a worker was reaped: the worker fields */
} crun_agent_event_type_t;

/* One event, valid only during the callback (copy what you keep). Fields
 * that do not belong to `type` are 0 (pid, ranks: -1). Append-only. */
typedef struct crun_agent_event {
	size_t struct_size;
	crun_agent_event_type_t type;
	crun_agent_state_t state; /* the agent's state when the event happened */
	int restart_count;	  /* TORCHELASTIC_RESTART_COUNT of the attempt */
	/* CRUN_AGENT_EV_RENDEZVOUS: this node's place in the round. Its workers
	 * get global ranks base_rank .. base_rank + local_world_size - 1. */
	int group_rank, group_world_size;
	int world_size, base_rank, local_world_size;
	int attempt;		 /* the round's job-wide attempt (= restart_count) */
	const char *master_addr; /* the worker store (MASTER_ADDR); borrowed */
	uint16_t master_port;
	/* CRUN_AGENT_EV_WORKER_START / _EXIT */
	int pid, local_rank, global_rank;
	/* _EXIT: exit_code in the shell convention (128 + signal for a signal,
	 * 126/127 when exec failed: then pid is 0), term_sig the signal or 0. */
	int exit_code, term_sig;
} crun_agent_event_t;

/* Called on the thread that runs crun_agent_run() or crun_agent_dispatch(),
 * from inside those calls, for every event (also every state change, after
 * on_state). Must not block and must not call crun_agent_run/dispatch/free;
 * crun_agent_stop() is allowed. */
typedef void (*crun_agent_event_fn)(const crun_agent_event_t *ev, void *arg);

/* ---- the spawn hook ------------------------------------------------------------ */

/* What crun would exec for one worker; every pointer is borrowed for the
 * duration of the hook call only. */
typedef struct crun_agent_spawn_req {
	size_t struct_size;
	const char *path;  /* argv[0] resolved through PATH */
	char *const *argv; /* NULL-terminated, ${local_rank} substituted */
	char *const *envp; /* the full environment crun computed (RANK, ...) */
	int local_rank, global_rank;
	int stdout_fd, stderr_fd; /* give them to the worker as its fds 1 and 2 */
} crun_agent_spawn_req_t;

/* Starts one worker the scheduler's way (a cgroup, a container, srun
 * --overlap). Returns 0 with *ret_pid, or a negative code (-errno): the
 * agent then reports the worker as failed to exec (exit 127, or 126 for
 * -EACCES/-ENOEXEC) and the restart policy applies.
 * The pid must be a child of the calling process that has not been waited
 * for: the agent watches it (a pidfd in poll mode, SIGCHLD when blocking),
 * reaps it with waitid(P_PID), signals it on stop and restarts; it never
 * waits for any other pid. Make the worker lead its own process group
 * (setsid or setpgid before exec) so signals reach its children; otherwise
 * only the pid is signalled. Whether it dies with the agent
 * (PR_SET_PDEATHSIG) is the hook's choice. Called on the agent's thread. */
typedef int (*crun_agent_spawn_fn)(const crun_agent_spawn_req_t *req, void *arg, int *ret_pid);

/* Runs fn(job) once, on a thread of the caller's choosing, never on the
 * thread that dispatches the agent (fn blocks on network calls the agent's
 * own loop may have to answer). Returns 0 when it took the job, or a
 * negative code (the rendezvous step then fails). fn may run for as long as
 * the rendezvous keeps a watch open (until the round ends or the agent is
 * freed); a pool needs one thread per concurrent job (at most two per
 * agent). Called on the agent's thread. */
typedef int (*crun_agent_run_blocking_fn)(void (*fn)(void *job), void *job, void *arg);

typedef struct crun_agent_config {
	size_t struct_size;	      /* set by CRUN_AGENT_CONFIG_INIT; append-only */
	int nproc_per_node;	      /* workers on this node, 1..CRUN_AGENT_MAX_LOCAL */
	int nnodes;		      /* static: number of agents */
	int node_rank;		      /* static: this agent's group rank */
	int standalone;		      /* 1: one node, private store on 127.0.0.1:0 */
	const char *rdzv_backend;     /* "static", "c10d" or "etcd" (master_addr: members) */
	const char *rdzv_id;	      /* run id; NULL = "none" (standalone: a uuid4) */
	const char *master_addr;      /* static: node 0's agent store address */
	uint16_t master_port;	      /* static: its port */
	const char *local_addr;	      /* standalone: address advertised as MASTER_ADDR */
	uint32_t join_timeout_ms;     /* static: time to wait for every agent */
	uint32_t barrier_timeout_ms;  /* exit barrier (torchrun: 300 s) */
	int max_restarts;	      /* failed attempts restarted before giving up */
	uint32_t shutdown_timeout_ms; /* SIGTERM -> SIGKILL grace */
	const char *role;	      /* ROLE_NAME; NULL = "default" */
	/* Worker command, NULL-terminated.
	 * argv[0] is resolved through PATH when it has no slash. The entry point
	 * name in the failure summary is `entrypoint` (NULL: argv[0]). */
	const char *const *argv;
	const char *entrypoint;
	const char *log_dir; /* NULL: a fresh $TMPDIR/torchelastic_XXXXXXXX */
	/* Per local rank redirect/tee masks (CRUN_STD_*); NULL = all 0. Arrays of
	 * nproc_per_node entries. */
	const int *redirects;
	const int *tee;
	/* Console filter: NULL = every rank; else a bitmap of nproc_per_node
	 * bytes, 1 = that local rank's lines reach the console. */
	const unsigned char *console_ranks;
	/* Prefix template for teed lines ($role_name $rank $local_rank
	 * $group_rank); NULL = "[${role_name}${local_rank}]:". */
	const char *line_prefix_template;
	/* Signals forwarded to the workers (bitmask of 1u << signo); 0 = TERM,
	 * INT, HUP, QUIT. */
	uint64_t signals_to_handle;
	int virtual_local_rank; /* LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=<rank> */
	crun_agent_state_fn on_state;
	void *on_state_arg;
	/* struct event_base * to run on (borrowed); NULL = the agent makes one. */
	void *event_base;
	/* c10d (rdzv_backend "c10d"): elastic membership MIN..MAX nodes (0 =
	 * nnodes); master_addr/master_port are the rendezvous endpoint; rdzv_conf
	 * is torchrun's "k=v,..." (join_timeout, last_call_timeout, close_timeout,
	 * read_timeout, is_host, heartbeat_interval, lease_ttl). */
	int min_nnodes;
	int max_nnodes;
	const char *rdzv_conf;
	/* Appended fields (ABI: only ever add at the end, and extend the _INIT
	 * macro below in the same order). */
	int run_path; /* 1: run argv[0] as a Python file path (runpy semantics) */
	/* torchrun's --duplicate-std{out,err}-filters: comma-separated substrings;
	 * matching worker lines are copied to filtered_std{out,err}.log under the
	 * log directory. NULL = off. */
	const char *duplicate_stdout_filters;
	const char *duplicate_stderr_filters;
	const char *numa_binding; /* NULL, "node", "socket", "exclusive", "core-complex" */
	/* Restart the workers when one stops beating for this long; 0 = off. */
	uint32_t worker_heartbeat_timeout_ms;
	/* Shared secret (file path) for crun-to-crun connections; NULL = none. */
	const char *auth_secret_file;
	/* 1: the worker store accepts any peer address (NAT); 0: loopback and
	 * the current round's node addresses only. */
	int worker_store_allow_any;
	/* Every event (see crun_agent_event_t); NULL = none. */
	crun_agent_event_fn on_event;
	void *on_event_arg;
	/* Start workers through this hook instead of fork/exec; NULL = crun's
	 * own spawn (new session, PDEATHSIG, NUMA binding, rlimits). */
	crun_agent_spawn_fn spawn;
	void *spawn_arg;
	/* Blocking rendezvous calls (store/etcd round trips) run through this
	 * hook; NULL = one short-lived pthread per call, as crun itself does.
	 * Set it for a poll-mode agent that must start no thread. */
	crun_agent_run_blocking_fn run_blocking;
	void *run_blocking_arg;
	/* Extra "NAME=VALUE" entries for every worker's environment, NULL-
	 * terminated. */
	const char *const *worker_env;
	/* Serve /healthz, /status, /jobs, /metrics on "ADDR:PORT" (port 0: any
	 * free one); NULL = off. */
	const char *status_listen;
	/* "console": one JSON line per state change on stderr (torchrun's
	 * --event_log_handler); NULL or "null": none. */
	const char *event_log_handler;
	/* Owned by crun_agent_config_set(); release with
	 * crun_agent_config_release(). Leave NULL otherwise. */
	void *settings;
	/* torchrun's --monitor-interval: after a worker fails, the others are
	 * stopped this long later, and every worker that failed by then is a
	 * failure (torchrun lists what its next poll finds). 0: at once;
	 * CRUN_AGENT_CONFIG_INIT: 100, torchrun's default. */
	uint32_t monitor_interval_ms;
} crun_agent_config_t;

#define CRUN_AGENT_CONFIG_INIT                                                                     \
	{                                                                                          \
		sizeof(crun_agent_config_t), 1, 1, 0, 0, "static", NULL, "127.0.0.1", 29500, NULL, \
		    900000, 300000, 0, 30000, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,   \
		    0, NULL, NULL, NULL, 0, 0, NULL, 0, NULL, NULL, NULL, 0, NULL, 0, NULL, NULL,  \
		    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 100                            \
	}

/* Sets one option of crun's option table by name: the long flag without
 * dashes in either spelling ("nproc_per_node", "rdzv-endpoint") or the JSON
 * path of crun-agent's config ("rendezvous.endpoint"); value as on the
 * command line ("3", "c10d", "30.5" seconds, "1"/"0" for flags). job.args
 * takes a JSON array of strings and job.env a JSON object; "config" loads a
 * crun-agent JSON file (the names set here win over it). Every named value
 * is applied again at each call, in the table's order, so a value that
 * depends on another (tee on nproc_per_node, rdzv_endpoint on the backend)
 * is right whatever came first; but each call also runs the command line's
 * checks, so a value that is invalid without another (nnodes MIN:MAX needs
 * an elastic backend, node_rank must be below nnodes, a local_ranks_filter
 * rank below nproc_per_node) must come after it. A typed field written
 * between calls may be overwritten by a named setting that writes the same
 * field: set names first. Named values are not read from the environment
 * (PET_*) or Slurm, and get no defaults but the struct's own.
 * Settings of the program rather than the agent: log_level sets the
 * process-wide crun_set_log_level() at once; no_slurm, insecure
 * and start_method are accepted and checked but change
 * nothing (the library never reads Slurm's variables nor refuses an
 * endpoint; workers are always exec'd); help, version and print_* are
 * actions, CRUN_EINVAL.
 * Strings the settings need are owned by cfg->settings (allocated on the
 * first call); free them with crun_agent_config_release() after
 * crun_agent_new() (which copies what it keeps). Returns 0, CRUN_EINVAL
 * (unknown name, bad value, a cross-check failed: the text naming the
 * option is crun_agent_config_last_error(cfg)), CRUN_ETOOBIG (more than
 * 1024 calls on one cfg) or CRUN_ENOMEM; cfg is unchanged on failure. Only
 * for a cfg whose struct_size is this header's. Not thread-safe for one
 * cfg; different cfgs may be set from different threads. */
CRUN_API int crun_agent_config_set(crun_agent_config_t *cfg, const char *name, const char *value);
/* The reason of the last failed crun_agent_config_set() on cfg, "" when
 * none. Valid until the next call on cfg. Never NULL. */
CRUN_API const char *crun_agent_config_last_error(const crun_agent_config_t *cfg);
/* Frees what crun_agent_config_set() allocated and resets cfg->settings;
 * the fields pointing at those strings must not be used afterwards. NULL
 * cfg or settings: no-op. */
CRUN_API void crun_agent_config_release(crun_agent_config_t *cfg);

/* Validates cfg and prepares the agent. cfg and every string and array it
 * points to are copied: the caller may free or reuse them (and call
 * crun_agent_config_release) once this returns; the callbacks' arg pointers
 * and event_base stay borrowed. Prepares the log directory, the guard process
 * that kills the workers' process groups if the agent dies, the worker store
 * (when this agent serves it). No signal handler is installed yet (only
 * crun_agent_run does) and nothing is spawned. Returns 0 and *ret_agent, or CRUN_EINVAL (bad
 * config), CRUN_ECONFIG (inconsistent ranks), CRUN_ENOTSUP (an unknown rendezvous backend),
 * CRUN_EADDRINUSE (store port taken), CRUN_ENOMEM or -errno; the detail is
 * logged through the log hook. *ret_agent is untouched on failure. */
CRUN_API int crun_agent_new(const crun_agent_config_t *cfg, crun_agent_t **ret_agent);

/* Runs the job to its end on the agent's loop. Workers get PR_SET_PDEATHSIG
 * tied to the calling thread, so call it from a thread that lives until it
 * returns (the main thread, in practice). *ret_exit_code (may be NULL)
 * receives what torchrun would exit with: 0 when every worker of every node
 * succeeded, 1 otherwise. Returns 0, or a negative code when the agent itself
 * could not run (store port in use, rendezvous failed). */
CRUN_API int crun_agent_run(crun_agent_t *agent, int *ret_exit_code);

/* ---- poll mode: the agent inside the caller's own event loop ------------------ *
 *
 *	crun_agent_start(a);
 *	while (!done) {
 *		struct pollfd p = {crun_agent_fd(a), POLLIN, 0};
 *		poll(&p, 1, crun_agent_next_timeout_ms(a));
 *		crun_agent_dispatch(a, &done, &code);
 *	}
 *
 * In this mode the agent installs no signal handler (the caller owns the
 * process's signals and forwards what it wants with crun_agent_stop()); it
 * learns of worker exits through pidfds, so SIGCHLD must not be SIG_IGN.
 * Teed worker output is written to the console from dispatch with
 * non-blocking writes (a bounded queue; a reader that stops reading loses
 * lines, counted in "[crun: N lines dropped]"). It starts no thread when
 * cfg.run_blocking is set; without it each blocking rendezvous call runs on
 * a short-lived pthread of its own, as in blocking mode. With a lent
 * cfg.event_base, dispatch runs every ready event of that base (the
 * caller's own too) and the fd covers its I/O events and timers, not signal
 * events. The pidfd needs Linux 5.3. */

/* Starts the job without blocking: the first rendezvous step begins and
 * events are delivered from crun_agent_dispatch(). Call it once instead of
 * crun_agent_run(), on the thread that will dispatch (workers get
 * PR_SET_PDEATHSIG tied to it). Returns 0, CRUN_EINVAL (NULL or already
 * started), CRUN_ENOTSUP (no pidfd_open) or -errno. */
CRUN_API int crun_agent_start(crun_agent_t *agent);

/* An fd that becomes readable when crun_agent_dispatch() has work: poll it
 * for POLLIN (or add it to an epoll set; edge-triggered is fine too, as
 * every dispatch rearms it). Owned by the agent, valid from
 * crun_agent_start() until crun_agent_free(); never read from it.
 * Returns the fd or CRUN_EINVAL (not started in poll mode). Any thread. */
CRUN_API int crun_agent_fd(const crun_agent_t *agent);

/* Milliseconds until the agent's next timer (a grace period, a rendezvous
 * timeout), -1 when none: the caller's poll timeout. Dispatch thread. */
CRUN_API int crun_agent_next_timeout_ms(crun_agent_t *agent);

/* Runs every ready event and expired timer without waiting for new ones
 * (the one exception: at the very end of a job, flushing teed output to a
 * console reader that makes progress may wait up to 2 s). Callbacks run
 * from inside it. *ret_done (may be NULL) becomes 1 once the job is over;
 * then *ret_exit_code (may be NULL) is what crun_agent_run() would have
 * returned in it. Returns 0, the agent's run error once done (as
 * crun_agent_run()), or CRUN_EINVAL (not started). Call it from the thread
 * that called crun_agent_start(). */
CRUN_API int crun_agent_dispatch(crun_agent_t *agent, int *ret_done, int *ret_exit_code);

/* Asks the agent to stop its workers as if it had received signal `sig`
 * (SIGTERM when 0). Thread-safe, async-signal-unsafe. */
CRUN_API int crun_agent_stop(crun_agent_t *agent, int sig);

/* Detail of the last failure. Never NULL. */
CRUN_API const char *crun_agent_last_error(const crun_agent_t *agent);

/* Frees the agent; the workers must be gone (crun_agent_run returned, or
 * crun_agent_dispatch reported done). Freeing a started poll-mode agent
 * that is not done SIGKILLs its workers and reaps them first. Dispatch
 * thread. NULL: no-op. */
CRUN_API void crun_agent_free(crun_agent_t *agent);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_AGENT_H */
