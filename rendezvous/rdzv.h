/* rdzv.h: the rendezvous module's interface. The agent asks a backend for the
 * outcome of a round (its group rank, the global rank offset of its workers,
 * the world size and the worker store address) and is told about peer changes
 * and the end of the exit barrier. Every call is made from the agent's loop
 * thread; results come back as callbacks on that loop (backends that need the
 * blocking store client run it on a helper thread and post back).
 *
 * Backends: "static" (fixed node ranks, node 0's agent serves the store; also
 * --standalone, a one-node static job with a private store), "c10d"
 * (elastic membership, c10d.h) and
 * "etcd" (the same rounds on an etcd v3 cluster through coord.h: master_addr
 * is then the member list "host:port,..."; the agent with group rank 0 still
 * serves the workers' store). rdzv.c picks one and drives it through its
 * table (rdzv_int.h).
 */
#ifndef CRUN_RENDEZVOUS_RDZV_H
#define CRUN_RENDEZVOUS_RDZV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct event_base;
struct c10d_conf;
struct rdzv;
struct store_server;

#define RDZV_HOST_MAX 256

/* The result of one round. */
struct rdzv_info {
	int group_rank;
	int group_world_size;
	int base_rank;	    /* global rank of this node's local rank 0 */
	int world_size;	    /* sum of every agent's nproc */
	int role_base_rank; /* same prefix sum within the role (one role here) */
	int role_world_size;
	char master_addr[RDZV_HOST_MAX]; /* worker store, MASTER_ADDR */
	uint16_t master_port;
	/* Job-wide attempt (restarts so far) the round carries, the same on
	 * every node: TORCHELASTIC_RESTART_COUNT and the workers' store
	 * prefixes. -1: the backend does not keep one (one node: the agent
	 * counts its own). */
	int attempt;
};

enum rdzv_event {
	RDZV_EV_COMPLETE,     /* a round finished: rdzv_info() is valid */
	RDZV_EV_FAILED,	      /* the round failed: rdzv_last_error() says why */
	RDZV_EV_PEER_CHANGED, /* membership changed: restart without counting */
	RDZV_EV_BARRIER_DONE, /* exit barrier over: rdzv_barrier_result() says how */
	RDZV_EV_SPARE_DONE,   /* c10d: this agent waited as a spare; the job ended */
};

/* What a RDZV_EV_PEER_CHANGED means (c10d). */
enum rdzv_change {
	RDZV_CHANGE_NONE,
	RDZV_CHANGE_RESTART,	/* a worker failed somewhere: counts as a restart */
	RDZV_CHANGE_MEMBERSHIP, /* a node joined or died: not counted */
	RDZV_CHANGE_FAILED,	/* the job was closed as failed: stop and exit 1 */
	RDZV_CHANGE_LOST,	/* the rendezvous store is gone: stop and exit 1 */
	/* c10d: this node's lease went unrenewed for a TTL (cut off from the
	 * store, which may have ended it: the others may have moved on): stop
	 * the workers, then join the next round (redialling the store) */
	RDZV_CHANGE_FENCED,
};

typedef void (*rdzv_event_fn)(enum rdzv_event ev, void *arg);

struct rdzv_params {
	const char *backend; /* "static", "c10d" or "etcd" */
	bool standalone;
	const char *run_id; /* key prefix "<run_id>/" */
	int node_rank;
	int nnodes;
	int nproc;		 /* this agent's local world size */
	const char *master_addr; /* static: where node 0 serves the store */
	uint16_t master_port;
	const char *local_addr; /* standalone: advertised address, or NULL */
	uint32_t barrier_timeout_ms;
	/* c10d: master_addr/master_port are the rendezvous endpoint */
	int min_nodes, max_nodes;
	/* The typed --rdzv_conf (c10d.h; the CLI parsed the text), copied by
	 * rdzv_new; the static backend reads its join_ms (the time to wait for
	 * every agent). Required: the defaults are the CLI's rows, not known
	 * here, so rdzv_new refuses NULL (CRUN_ECONFIG). */
	const struct c10d_conf *conf;
	const char *hostname;	      /* for records and messages */
	const char *auth_secret_file; /* c10d: shared secret; NULL = CRUN_AUTH_SECRET_FILE */
	struct event_base *base;      /* borrowed, the agent's loop */
	rdzv_event_fn on_event;
	void *arg;
	/* Static multi-node: clears the store this agent serves (node 0), on
	 * the loop, once every node stopped its workers for a restart. */
	void (*clear_store)(void *arg);
	/* c10d, etcd: another node asked for this node's stacks (ask number
	 * ask, the job board above): the answer, malloc'd JSON of at most
	 * RDZV_BOARD_ANSWER_MAX bytes, or NULL (none is posted). On the loop;
	 * NULL: this node answers no ask. */
	char *(*stacks_answer)(int64_t ask, void *arg);
	/* Where blocking store/etcd calls run; NULL fn: a pthread per call. */
	int (*run_blocking)(void (*fn)(void *job), void *job, void *arg);
	void *run_blocking_arg;
};

/* Creates a backend. CRUN_ENOTSUP for a backend not implemented, CRUN_ECONFIG
 * for inconsistent parameters (the message is logged). */
int rdzv_new(const struct rdzv_params *p, struct rdzv **ret_rdzv);

/* Where this agent must serve the shared worker store before the first round:
 * returns 1 with *ret_host (static text owned by r) and *ret_port (0 =
 * ephemeral) when it must serve one, 0 when another agent serves it. */
int rdzv_store_to_serve(const struct rdzv *r, const char **ret_host, uint16_t *ret_port);
/* Tells the backend the port the agent's store actually bound. */
void rdzv_set_served_port(struct rdzv *r, uint16_t port);

/* The rendezvous store this agent serves in-process (c10d is_host), or
 * NULL; borrowed, valid until rdzv_free. For the status page and metrics. */
const struct store_server *rdzv_served_store(const struct rdzv *r);

/* Whether the backend clears the served store itself between attempts
 * (static multi-node: only once every node stopped); else the agent does. */
bool rdzv_clears_store(const struct rdzv *r);

/* The job board (board.c): how a node asks every node of its job for
 * something (today: its ranks' stacks) and gathers the answers, through the
 * rendezvous store (c10d, etcd). Keys, relative to the job's prefix:
 *   stacks/asks    counter: the number of the last ask (1, 2, ...)
 *   stacks/ask/N   ask N's record: who asked and why
 *   stacks/N/G     group rank G's answer to ask N (JSON, see stacks_int.h)
 * Each member's lease monitor (monitor.c) watches for the next ask in the
 * same store request that watches its round, and answers it through
 * rdzv_params.stacks_answer. The keys are never deleted while the job runs:
 * at most RDZV_BOARD_ASKS_MAX asks per job, answers of at most
 * RDZV_BOARD_ANSWER_MAX bytes each. */
#define RDZV_BOARD_ASKS	      "stacks/asks"
#define RDZV_BOARD_ASKS_MAX   256
#define RDZV_BOARD_ANSWER_MAX (16u << 10)
/* How long an asker waits for every answer: the answerers' capture
 * (STACKS_DEADLINE_MS, 800 ms), a second for the store round trips, and a
 * margin for a second ask captured just before (an ASan build on etcd
 * missed 1.8 s). The default: an asker may wait longer (a job on a loaded
 * store), up to RDZV_BOARD_GATHER_MAX_MS. */
#define RDZV_BOARD_GATHER_MS	 2500u
#define RDZV_BOARD_GATHER_MAX_MS 120000u
/* Pure: "stacks/ask/N" and "stacks/N/G" into buf. 0 or CRUN_ERANGE. */
int rdzv_board_ask_key(char *buf, size_t cap, int64_t ask);
int rdzv_board_answer_key(char *buf, size_t cap, int64_t ask, int group_rank);

/* Called with a gather's answers: r 0 or why nothing was gathered (no ask
 * was posted); answers[g] is group rank g's answer (NULL: none came within
 * the gather's wait), n the round's nodes, ask the ask's number. The
 * array and strings are borrowed for the call. On the loop. */
typedef void (*rdzv_gather_fn)(int r, int64_t ask, char *const *answers, int n, void *arg);
/* Posts an ask (why: a short text for the record) and gathers every node's
 * answer of the current round, waiting up to wait_ms for them (0:
 * RDZV_BOARD_GATHER_MS; more than RDZV_BOARD_GATHER_MAX_MS: that); fn is
 * called once, on the loop, as soon as every answer is in or the wait is
 * over, unless the backend is freed first. CRUN_ENOTSUP: no board (static
 * backend, no round yet, a store without leases); CRUN_EBUSY: a gather is
 * running. */
int rdzv_stacks_gather(struct rdzv *r, const char *why, uint32_t wait_ms, rdzv_gather_fn fn,
		       void *arg);
/* wait_ms as a gather takes it (0: the default, capped at the maximum). */
uint32_t rdzv_board_wait_ms(uint32_t wait_ms);

/* Starts the next round; completion arrives as RDZV_EV_COMPLETE or
 * RDZV_EV_FAILED. Returns 0 or a negative code if it could not start. */
int rdzv_next_round(struct rdzv *r);
/* The last completed round; valid after RDZV_EV_COMPLETE. */
const struct rdzv_info *rdzv_info(const struct rdzv *r);
/* The addresses allowed to reach this agent's worker store after the last
 * round ("a b ...", numeric; valid until the next round), or NULL when the
 * backend does not know them (then the agent does not narrow its store). */
const char *rdzv_peer_addrs(const struct rdzv *r);
/* Whether the workers of a node that does not serve the round's worker store
 * reach it through a node-local proxy (rdzv_conf worker_store=proxy; c10d
 * and etcd backends only). */
bool rdzv_worker_store_proxy(const struct rdzv *r);

/* Starts the exit barrier (every agent reached a terminal state, so the node
 * serving the store leaves last); ends with RDZV_EV_BARRIER_DONE. A backend
 * with one node completes it at once. */
int rdzv_exit_barrier(struct rdzv *r);

const char *rdzv_last_error(const struct rdzv *r);
/* After RDZV_EV_FAILED: CRUN_ECONFIG when the job can never succeed as this
 * agent is set up (conflicting settings, a run id that already ended: a
 * service must not restart into it), else the code the round failed with
 * (CRUN_ERDZVCLOSED when there is none). */
int rdzv_failure(const struct rdzv *r);
/* After RDZV_EV_BARRIER_DONE: 0 when every node finished, else
 * CRUN_ETIMEDOUT (the barrier timed out: a peer is still running or hung)
 * or CRUN_ERDZVCLOSED (the job failed elsewhere); rdzv_last_error() says
 * which. An agent must not report success then. */
int rdzv_barrier_result(const struct rdzv *r);

/* The kind of the last RDZV_EV_PEER_CHANGED (c10d, static multi-node). */
enum rdzv_change rdzv_change_kind(const struct rdzv *r);
/* Closes the job as failed (why = root cause, or NULL when a peer closed
 * it) so every agent stops (c10d, static multi-node); the agent serving the
 * c10d store waits (bounded) for the others to read it. Ends with
 * RDZV_EV_BARRIER_DONE. CRUN_ENOTSUP for a one-node job. */
int rdzv_close_failed(struct rdzv *r, const char *why);
/* Checks an --rdzv_endpoint value for `backend` ("etcd": a comma-separated
 * member list); 0 or CRUN_EINVAL with err naming the bad entry. */
int rdzv_endpoint_check(const char *backend, const char *endpoint, char *err, size_t cap);

/* c10d keeps a job's keys under RDZV_C10D_PREFIX "<run_id>/" in the
 * rendezvous store (c10d.c). For status pages: 1 and the run id of a store
 * key (NUL-terminated in ret, cut to cap), 0 for a key of no c10d job. */
#define RDZV_C10D_PREFIX "crun-c10d/"
int rdzv_run_id_of_key(const uint8_t *key, size_t len, char *ret, size_t cap);

/* Frees the backend. A helper thread still blocked in the store client is
 * detached and frees its own state when its call returns. NULL: no-op. */
void rdzv_free(struct rdzv *r);

/* Pure rank math (round.c, unit-tested): given every node's nproc in group-rank order,
 * fill the fields of *ret for group rank `me`. Returns 0 or CRUN_EINVAL. */
int rdzv_assign_ranks(const int *nprocs, int nnodes, int me, struct rdzv_info *ret);

/* ---- progress.c: what the rendezvous is doing, for the status page,
 * STATUS= and the waiting log. The c10d/etcd join job (a helper thread)
 * updates it under a mutex; any thread reads a copy. Static backends have
 * none (round -1). ---- */
#define RDZV_PROGRESS_NODES 32 /* nodes listed: joined hosts, or the round's members */
#define RDZV_PROGRESS_AWAIT 8  /* awaited hosts listed */

/* Counters over the agent's life, one table: X(field, metric name, help).
 * crun_rdzv_<name>_total on /metrics; the same names in /status. */
#define RDZV_COUNTER_MAP(X)                                                                       \
	X(rounds_completed, "rounds_completed", "rounds completed with this node a member")       \
	X(rounds_abandoned, "rounds_abandoned",                                                   \
	  "rounds abandoned before they closed (a joiner died), joined again")                    \
	X(nodes_joined, "nodes_joined", "nodes new to a completed round (the first round's too)") \
	X(nodes_lost, "nodes_lost", "nodes of the previous round missing from a completed one")

enum rdzv_counter {
#define RDZV_C_X_(field, name, help) RDZV_C_##field,
	RDZV_COUNTER_MAP(RDZV_C_X_)
#undef RDZV_C_X_
	    RDZV_C__MAX,
};

struct rdzv_progress_node {
	char host[RDZV_HOST_MAX];
	char addr[RDZV_HOST_MAX]; /* "" when not known */
	int group_rank;		  /* -1 while the round is open */
};

struct rdzv_progress {
	int round;	     /* the round waited in, or the last completed; -1: none yet */
	bool waiting;	     /* this agent is joining or waits in `round` */
	int joined;	     /* waiting: nodes joined so far; else the round's nodes */
	int min, max;	     /* nodes the job accepts */
	int64_t last_call_s; /* waiting: seconds to the last call; -1: MIN not reached */
	int64_t timeout_s;   /* waiting: seconds left of the join timeout; -1: unknown */
	int nnodes;	     /* entries of nodes[]: joined hosts, or members by group rank */
	struct rdzv_progress_node nodes[RDZV_PROGRESS_NODES];
	int nawait; /* nodes of the last completed round not joined yet; -1: unknown */
	char await[RDZV_PROGRESS_AWAIT][RDZV_HOST_MAX];
	uint64_t counters[RDZV_C__MAX];
};

/* A consistent copy of r's progress (round -1 for a backend without one). */
void rdzv_get_progress(const struct rdzv *r, struct rdzv_progress *ret);
/* One line for logs and STATUS=: "rendezvous 'job42' round 2: 3/4 nodes
 * joined (min 2, max 4), last call in 12 s; waiting for: node-7", or the
 * completed round ("... round 2 complete: 3 nodes: a (rank 0), ..."). */
int rdzv_progress_line(const struct rdzv_progress *p, const char *run_id, char *buf, size_t cap);
/* "rounds_completed"...; static text, "?" out of range. */
const char *rdzv_counter_name(enum rdzv_counter c);
const char *rdzv_counter_help(enum rdzv_counter c);

/* Reads one key of a c10d job, named relative to the job's prefix ("round",
 * "r0/closed"): a malloc'd NUL-terminated value, or NULL when absent. */
typedef char *(*rdzv_key_get_fn)(const char *key, void *arg);
/* A c10d job's rendezvous from what the store serving it holds (a store's
 * status page: crun-rdzvd, which has no agent of the job): its current round,
 * complete (members by group rank with hosts and addresses) or open (nodes
 * joined so far, and the previous round's members not back: nawait/await);
 * min and max from the job's settings. The agents' timers and counters are
 * not in the store: -1 and 0. *ret_state (static text): "rendezvous" while
 * the round is open, "running", or the job's end, "done" or "failed".
 * Returns 0, or CRUN_ENOTFOUND when the store holds no round of the job. */
int rdzv_c10d_view(rdzv_key_get_fn get, void *arg, struct rdzv_progress *ret,
		   const char **ret_state);

#endif /* CRUN_RENDEZVOUS_RDZV_H */
