/* crun/agent.h: the per-node elastic agent as a C API, for schedulers and for
 * crun's own programs. An agent joins a rendezvous, serves or uses the worker
 * store, spawns nproc_per_node workers with torchrun's environment, watches
 * them, restarts the group on failure and reports the root cause.
 *
 * Life cycle: fill a crun_agent_config_t from CRUN_AGENT_CONFIG_INIT, call
 * crun_agent_new(), then crun_agent_run() (blocks until the job is over) and
 * crun_agent_free(). crun_agent_stop() may be called from any thread or from
 * the state callback.
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
	/* Worker command, NULL-terminated; borrowed until crun_agent_free().
	 * argv[0] is resolved through PATH when it has no slash. The entry point
	 * name in the failure summary is `entrypoint` (NULL: argv[0]). */
	const char *const *argv;
	const char *entrypoint;
	const char *log_dir; /* NULL: a fresh $TMPDIR/torchelastic_XXXXXXXX */
	/* Per local rank redirect/tee masks (CRUN_STD_*); NULL = all 0. Arrays of
	 * nproc_per_node entries, borrowed. */
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
} crun_agent_config_t;

#define CRUN_AGENT_CONFIG_INIT                                                                     \
	{                                                                                          \
		sizeof(crun_agent_config_t), 1, 1, 0, 0, "static", NULL, "127.0.0.1", 29500, NULL, \
		    900000, 300000, 0, 30000, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0,   \
		    0, NULL, NULL, NULL, 0, 0, NULL, 0, NULL, NULL, NULL, 0, NULL, 0               \
	}

/* Validates cfg and prepares the agent: the log directory, the guard process
 * that kills the workers' process groups if the agent dies, the signal
 * events, the worker store (when this agent serves it). Nothing is spawned
 * yet. Returns 0 and *ret_agent, or CRUN_EINVAL (bad config), CRUN_ECONFIG
 * (inconsistent ranks), CRUN_ENOTSUP (a backend not built yet),
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

/* Asks the agent to stop its workers as if it had received signal `sig`
 * (SIGTERM when 0). Thread-safe, async-signal-unsafe. */
CRUN_API int crun_agent_stop(crun_agent_t *agent, int sig);

/* Detail of the last failure. Never NULL. */
CRUN_API const char *crun_agent_last_error(const crun_agent_t *agent);

/* Frees the agent; the workers must be gone (crun_agent_run returned).
 * NULL: no-op. */
CRUN_API void crun_agent_free(crun_agent_t *agent);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_AGENT_H */
