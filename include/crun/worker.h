/* crun/worker.h: the worker SDK. A C program started by crun (or torchrun)
 * joins the job's worker store the way a PyTorch worker does, then builds
 * process groups and runs collectives over them (CPU backend: shared memory
 * between ranks on one host, TCP between hosts).
 *
 * Store keys. The SDK follows the PyTorch 2.x convention: no attempt prefix
 * on the worker store, the world-size check-in is an ADD on the raw key
 * "init/", and every group lives under PrefixStore("default_pg") and then
 * "<group name>/" (wire prefix "/default_pg/<g>//"), the world group being
 * "0" and each crun_pg_new() taking the next integer, as new_group() does.
 * crun's own keys sit in a "crun/a<restart count>/" namespace below that, so
 * they never collide with gloo's or NCCL's keys in a shared store, nor with
 * keys left by an earlier attempt on an agent store that outlived it.
 *
 * Threads. Apart from crun_pg_abort(), a process group (and the global state
 * made by crun_init()) must be used from one thread at a time. Asynchronous
 * work runs on one progress thread per group, in submission order (nccl
 * groups: enqueued at once on the group's CUDA stream, each work tied to a
 * CUDA event that crun_work_test() / crun_work_wait() poll).
 *
 * Errors. Every call that can fail returns 0 or a negative crun_err_t; ret_*
 * parameters are written only on success. After a transport failure a group
 * is broken: that call and every later one on it return the same code.
 */
#ifndef CRUN_WORKER_H
#define CRUN_WORKER_H

#include "crun/crun.h"
#include "crun/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct crun_pg crun_pg_t;     /* opaque: a process group */
typedef struct crun_work crun_work_t; /* opaque: one asynchronous operation */

/* Element types. Values are part of the ABI. */
typedef enum crun_dtype {
	CRUN_F32 = 0,
	CRUN_F64 = 1,
	CRUN_F16 = 2,  /* IEEE binary16; reduced in f32 */
	CRUN_BF16 = 3, /* bfloat16; reduced in f32 */
	CRUN_I8 = 4,
	CRUN_U8 = 5,
	CRUN_I32 = 6,
	CRUN_I64 = 7,
	CRUN_DTYPE__MAX
} crun_dtype_t;

/* Reduction operators. AVG divides the sum by the group size (integer types:
 * truncating division, as C does). Integer SUM and PROD wrap modulo 2^bits. */
typedef enum crun_red_op {
	CRUN_SUM = 0,
	CRUN_PROD = 1,
	CRUN_MIN = 2,
	CRUN_MAX = 3,
	CRUN_AVG = 4,
	CRUN_RED_OP__MAX
} crun_red_op_t;

/* Size in bytes of one element of dtype; 0 for an unknown dtype. */
CRUN_API size_t crun_dtype_size(int dtype);

/* ---- initialisation ------------------------------------------------------ */

typedef struct crun_init_opts {
	size_t struct_size; /* set by CRUN_INIT_OPTS_INIT; append-only */
	int rank;
	int world_size;
	int local_rank;		 /* informational */
	int local_world_size;	 /* with local_rank, picks the nccl device */
	const char *master_addr; /* worker store host; borrowed, copied */
	uint16_t master_port;
	int restart_count;   /* TORCHELASTIC_RESTART_COUNT */
	int use_agent_store; /* 1: every rank is a store client; 0: rank 0 hosts it */
	uint32_t timeout_ms; /* store ops and collectives; 0 = 300000 */
	const char *backend; /* world group backend, as crun_pg_new(); NULL = auto */
	int store_dialect;   /* crun_store_dialect_t; 0 = v2 */
} crun_init_opts_t;

#define CRUN_INIT_OPTS_INIT                                                                \
	{                                                                                  \
		sizeof(crun_init_opts_t), 0, 1, 0, 1, "127.0.0.1", 29500, 0, 1, 0, NULL, 0 \
	}

/* Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT, TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_USE_AGENT_STORE
 * ("True" = client of the agent's store; anything else = rank 0 hosts a store
 * server on MASTER_PORT inside this process, on its own thread, as PyTorch's
 * rank 0 does), plus crun's own CRUN_PG_TIMEOUT_MS, CRUN_PG_BACKEND and
 * CRUN_STORE_DIALECT (1 or 2), and CRUN_LOG_LEVEL / CRUN_LOG_SUBSYS (SDK
 * debug lines on stderr), then calls crun_init_explicit(). Returns 0,
 * CRUN_ECONFIG (a missing or malformed variable), CRUN_EALREADY, or what the
 * store and the world group's creation return.
 *
 * Tuning variables read whenever a group is made: CRUN_PG_TRANSPORT
 * (auto|shm|tcp), CRUN_PG_ADDR (address TCP peers dial; default: the local
 * address that routes to MASTER_ADDR), CRUN_SHM_RING_BYTES (per-pair ring,
 * a power of two, default 1 MiB), CRUN_PG_RING_THRESHOLD (bytes from which
 * the ring algorithms replace recursive doubling and trees, default 128 KiB). */
CRUN_API int crun_init(void);

/* Connects to (or hosts) the store, checks in with ADD "init/" +1 (rank 0 of
 * a self-hosted store then waits until all world_size ranks have), and builds
 * the world group. Collective over all ranks. opts->struct_size may be that
 * of any earlier version of the struct (fields it lacks take their defaults). */
CRUN_API int crun_init_explicit(const crun_init_opts_t *opts);

/* Frees the world group and closes the store (and stops a hosted server after
 * every rank has checked out). Safe to call when not initialised. */
CRUN_API void crun_finalize(void);

/* The world group made by crun_init(); NULL before it. Owned by the SDK. */
CRUN_API crun_pg_t *crun_world(void);
/* Values from crun_init(); -1 before it. */
CRUN_API int crun_rank(void);
CRUN_API int crun_world_size(void);
CRUN_API int crun_local_rank(void);
CRUN_API int crun_local_world_size(void);
/* The worker store connection (owned by the SDK; one thread at a time, and
 * not while crun_pg_new() runs on another thread); NULL before crun_init(). */
CRUN_API crun_store_t *crun_worker_store(void);

/* ---- process groups ------------------------------------------------------ */

/* Makes a group of the world ranks ranks[0..n-1] (distinct, in group-rank
 * order). Collective over the WHOLE world, like torch new_group(): every rank
 * calls it in the same order; a rank that is not listed gets *ret_pg = NULL.
 * backend: "cpu", "nccl" or "auto"; NULL = "auto".
 *   cpu:  shared memory between ranks on one host, TCP otherwise
 *         (CRUN_PG_TRANSPORT=tcp|shm|auto overrides).
 *   nccl: NCCL on the GPU LOCAL_RANK of the visible ones (LOCAL_RANK %
 *         visible where a rank sees fewer GPUs than LOCAL_WORLD_SIZE: one
 *         GPU per rank through CUDA_VISIBLE_DEVICES), from the
 *         separately loaded libcrun-cuda.so.0 (libcrun itself never links
 *         CUDA). Buffers may be device memory (used in place) or host memory
 *         (staged through the device). Collectives are ordered after the
 *         work already queued on the default stream (and every blocking
 *         stream of the device), as PyTorch orders them after the current
 *         stream; finish work on cudaStreamNonBlocking streams first.
 *         Between ranks on one host, all_reduce up to
 *         CRUN_NCCL_IPC_MAX_BYTES (8 MiB; 0 = off) runs over CUDA IPC
 *         (one-shot up to CRUN_NCCL_IPC_ONESHOT_BYTES, 256 KiB, then
 *         two-shot). CRUN_ENOTSUP when the object, CUDA, NCCL or a device is
 *         missing; crun_pg_last_error(NULL) names what.
 *   auto: nccl where it loads and a device is usable, else cpu (said once
 *         per process in the SDK log, CRUN_LOG_LEVEL=info). Every rank must
 *         come to the same answer: give a job GPUs on all nodes or none.
 * Free with crun_pg_free(). */
CRUN_API int crun_pg_new(const int *ranks, int n, const char *backend, crun_pg_t **ret_pg);

/* Waits for queued work, then frees the group. NULL: no-op. Freeing the
 * world group is crun_finalize()'s job. */
CRUN_API void crun_pg_free(crun_pg_t *pg);

/* This process's rank in pg, and pg's size. */
CRUN_API int crun_pg_rank(const crun_pg_t *pg);
CRUN_API int crun_pg_size(const crun_pg_t *pg);

/* Default timeout of later operations on pg (0 = wait forever). */
CRUN_API void crun_pg_set_timeout(crun_pg_t *pg, uint32_t timeout_ms);

/* Any thread: fails in-flight and later work on pg with CRUN_ECANCELED.
 * cpu groups: the peers' work fails with CRUN_EPEER instead of hanging.
 * nccl groups: the abort is local (ncclCommAbort); a peer's work ends with
 * CRUN_EPEER only where NCCL notices the lost connection, else at the
 * peer's own timeout (crun_pg_set_timeout; 0 waits forever), so give nccl
 * groups a timeout where a rank may abort. */
CRUN_API int crun_pg_abort(crun_pg_t *pg);

/* Detail of the last failure on pg. Never NULL. pg == NULL: why the last
 * crun_init*() or crun_pg_new() failed (e.g. what the nccl backend lacks),
 * "" when none did. */
CRUN_API const char *crun_pg_last_error(const crun_pg_t *pg);

/* ---- collectives ----------------------------------------------------------
 * Counts are in elements. Every call takes ret_work last: NULL runs the
 * operation to completion (blocking); non-NULL queues it on pg's progress
 * thread and returns a handle at once. The buffers of queued work belong to
 * the SDK until the work is waited for. In-place: pass the same pointer for
 * sendbuf and recvbuf (all_gather: sendbuf == recvbuf + rank * count;
 * gather/scatter/reduce use recvbuf / sendbuf only at the root).
 * Errors: CRUN_EINVAL (bad argument), CRUN_EPEER (a peer died or failed),
 * CRUN_ETIMEDOUT, CRUN_ECANCELED (crun_pg_abort), CRUN_ENOMEM. */

CRUN_API int crun_broadcast(crun_pg_t *pg, void *buf, size_t count, int dtype, int root,
			    crun_work_t **ret_work);
CRUN_API int crun_all_reduce(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
			     int dtype, int op, crun_work_t **ret_work);
CRUN_API int crun_reduce(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count, int dtype,
			 int op, int root, crun_work_t **ret_work);
/* recvbuf holds size * count elements, rank i's at offset i * count. */
CRUN_API int crun_all_gather(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
			     int dtype, crun_work_t **ret_work);
CRUN_API int crun_gather(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count, int dtype,
			 int root, crun_work_t **ret_work);
/* sendbuf (root only) holds size * count elements. */
CRUN_API int crun_scatter(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
			  int dtype, int root, crun_work_t **ret_work);
/* sendbuf holds size * count elements; rank i receives reduced block i. */
CRUN_API int crun_reduce_scatter(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
				 int dtype, int op, crun_work_t **ret_work);
/* Block i (count elements) of sendbuf goes to rank i, landing in block
 * `rank` of its recvbuf. */
CRUN_API int crun_all_to_all(crun_pg_t *pg, const void *sendbuf, void *recvbuf, size_t count,
			     int dtype, crun_work_t **ret_work);
CRUN_API int crun_barrier(crun_pg_t *pg, crun_work_t **ret_work);
/* Point to point; messages between a pair arrive in order. */
CRUN_API int crun_send(crun_pg_t *pg, const void *buf, size_t count, int dtype, int peer,
		       crun_work_t **ret_work);
CRUN_API int crun_recv(crun_pg_t *pg, void *buf, size_t count, int dtype, int peer,
		       crun_work_t **ret_work);

/* ---- asynchronous work ---------------------------------------------------- */

/* Blocks until the work is done; returns its result. Does not free it. */
CRUN_API int crun_work_wait(crun_work_t *work);
/* *ret_done = 1 when finished (then crun_work_wait() returns at once). */
CRUN_API int crun_work_test(crun_work_t *work, int *ret_done);
/* Waits for the work if it is still running, then frees it. NULL: no-op. */
CRUN_API void crun_work_free(crun_work_t *work);

/* ---- liveness ---------------------------------------------------------------- */

/* Tells the agent this worker is alive, for --worker_heartbeat_timeout: sets
 * the modification time of the file named by $CRUN_HEARTBEAT_FILE (set by the
 * agent, one per worker) to now, creating it if needed. Python workers do the
 * same with os.utime(os.environ["CRUN_HEARTBEAT_FILE"]). Needs no crun_init();
 * any thread; one system call. Returns 0 (also when the variable is unset:
 * nobody watches) or -errno. */
CRUN_API int crun_heartbeat(void);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_WORKER_H */
