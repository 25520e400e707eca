/* worker.h: the worker SDK module's internal interface: the process group
 * object, the per-peer transports (shared-memory rings, TCP sockets), the
 * transfer engine that drives several sends and receives at once, and the
 * collective algorithms built on it. The public API is include/crun/worker.h.
 */
#ifndef CRUN_WORKER_SDK_WORKER_H
#define CRUN_WORKER_SDK_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "crun/store.h"
#include "crun/worker.h"

#define PG_MAX_WORLD		  4096	 /* ceiling on group size (limits rule) */
#define PG_DEFAULT_TIMEOUT_MS	  300000 /* like PyTorch's 5 min store default */
#define PG_SHM_RING_BYTES_DEFAULT (1u << 20)

/* Message size (bytes) at and above which all_reduce, reduce and broadcast
 * switch from recursive doubling / trees to the ring algorithms.
 * CRUN_PG_RING_THRESHOLD overrides. Measured with bench/coll_bench on the
 * 2-core dev VM (shared and noisy: best of 3 runs, 200 iterations), shared
 * memory, f32 sum, time per all_reduce in us, recursive doubling / ring:
 *   bytes       256        4 KiB      16 KiB     64 KiB     256 KiB    1 MiB
 *   2 ranks     0.5/0.7    4.8/4.8    2.4/2.3    8.0/6.9    35/21      237/146
 *   4 ranks     19.8/22.5  57/41      28.7/32.4  64.2/72.6  207/162    813/463
 * The ring wins from 256 KiB on both; at 64 KiB and below recursive
 * doubling holds its own (4 ranks) or ties (2 ranks): the switch is 128 KiB. */
#define PG_RING_THRESHOLD_DEFAULT (128u * 1024)

/* str_printf() returns the length; this yields 0 or CRUN_ETOOBIG. */
#define pg_fmt(buf, cap, ...) (str_printf((buf), (cap), __VA_ARGS__) < 0 ? CRUN_ETOOBIG : 0)

/* Receives of messages this large copy out of the shm ring with streaming
 * stores (kernels_copy_stream): beyond the caches, that skips reading the
 * destination first. */
#define PG_STREAM_BYTES (4u << 20)

enum pg_peer_kind { PEER_SELF, PEER_SHM, PEER_TCP, PEER__MAX };

/* One single-producer single-consumer byte ring in a shared segment. head is
 * advanced by the writer, tail by the reader; both only grow (mod 2^64).
 * Every message is padded to 8 bytes on the ring so the next one starts
 * aligned for any element type (the reader reduces straight from the ring). */
struct shm_ring {
	_Alignas(64) _Atomic uint64_t head;
	_Alignas(64) _Atomic uint64_t tail;
	_Alignas(64) uint8_t data[];
};

/* Header of each rank's inbox segment: rings[p] is written by group rank p. */
struct shm_seg_hdr {
	uint64_t magic;
	uint64_t ring_bytes; /* capacity of each ring (a power of two) */
	uint32_t nranks;
	_Alignas(64) _Atomic uint32_t abort; /* set by any rank whose group failed */
	/* Doorbell: the owner sleeps on `bell` (a futex) with `sleeping` set;
	 * a peer that moves data into, or frees space out of, a ring the owner
	 * waits on bumps it and wakes the owner. */
	_Alignas(64) _Atomic uint32_t bell;
	_Atomic uint32_t sleeping;
};

struct pg_peer {
	int kind; /* enum pg_peer_kind */
	/* shm */
	struct shm_ring *tx; /* our ring in the peer's inbox; borrowed from its map */
	struct shm_ring *rx; /* its ring in our inbox */
	void *map;	     /* the peer's inbox segment, mapped */
	size_t map_len;
	int pidfd; /* to notice the peer's death; -1 if unsupported */
	pid_t pid;
	/* tcp */
	int fd;
	uint8_t *stage; /* receive-and-reduce staging buffer */
	size_t stage_fill;
};

struct pg_backend;

struct crun_pg {
	const struct pg_backend *be; /* cpu built in, or nccl from the GPU object */
	void *be_ctx;		     /* the backend's state (the cpu backend's is pg) */
	int rank, size;
	int world_rank;
	int *world_ranks; /* group rank -> world rank */
	char name[32];	  /* group name ("0" for the world) */
	struct pg_peer *peers;
	struct shm_seg_hdr *inbox; /* our own segment (also peers[rank].map) */
	size_t ring_bytes;
	size_t ring_threshold;
	_Atomic uint32_t timeout_ms;
	_Atomic int aborted; /* crun_pg_abort() was called */
	_Atomic int broken;  /* a transport failure: the code every call returns */
	char last_error[256];
	/* async work: a FIFO run by one progress thread */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int mu_ready;
	int thread_started;
	int stopping;
	pthread_t thread;
	struct crun_work *q_head, *q_tail;
	unsigned pending; /* queued + running */
	uint8_t *scratch; /* per-group scratch, grown as needed */
	size_t scratch_len;
};

/* ---- transfer engine -------------------------------------------------------- */

enum xfer_dir {
	XF_SEND,
	XF_RECV,
	XF_RECV_REDUCE, /* buf = buf op incoming, element-wise */
};

struct xfer {
	int peer; /* group rank */
	int dir;  /* enum xfer_dir */
	uint8_t *buf;
	size_t len; /* bytes */
	/* XF_RECV_REDUCE only: when set, buf = acc op incoming (buf is not
	 * read), which saves copying the input into the output first. */
	const uint8_t *acc;
	int dtype, op;
	size_t done; /* bytes of payload moved */
	size_t wire; /* bytes moved on the ring, padding included (shm) */
};

/* Drives every op to completion, interleaving them so ring exchanges cannot
 * deadlock. Returns 0, CRUN_EPEER, CRUN_ETIMEDOUT or CRUN_ECANCELED; any
 * failure breaks the group (pg_fail). */
int pg_xfer(struct crun_pg *pg, struct xfer *ops, int nops);
/* Convenience: one send to `to` and one receive from `from` at once. */
int pg_sendrecv(struct crun_pg *pg, int to, const void *sbuf, size_t slen, int from, void *rbuf,
		size_t rlen, int reduce, int dtype, int op);

/* Marks pg broken with `err` (first one wins), tells the peers (shm abort
 * flags, TCP shutdown) and records the detail. Returns err. */
int pg_fail(struct crun_pg *pg, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- transports --------------------------------------------------------------- */

/* Creates our inbox segment, publishes its name, maps every shm peer's,
 * then unlinks ours once all have mapped it. `is_shm[p]` says which peers. */
int pg_shm_setup(struct crun_pg *pg, crun_store_t *st, const char *ns, const int *is_shm);
void pg_shm_release(struct crun_pg *pg);
/* Moves what it can right now; returns bytes moved (0 = would block). */
size_t pg_shm_progress(struct crun_pg *pg, struct xfer *x);
/* Wakes the owner of hdr if it sleeps on its doorbell (force: always). */
void pg_shm_ring_bell(struct shm_seg_hdr *hdr, int force);
/* Sleeps on our doorbell until it moves from `seen` or timeout_ms passes. */
void pg_shm_sleep(struct crun_pg *pg, uint32_t seen, unsigned timeout_ms);

/* Listens, publishes addr:port, connects the mesh for every TCP peer. */
int pg_tcp_setup(struct crun_pg *pg, crun_store_t *st, const char *ns, const int *is_tcp);
void pg_tcp_release(struct crun_pg *pg);
/* Moves what it can right now: >= 0 bytes, or CRUN_EPEER on EOF/error. */
ssize_t pg_tcp_progress(struct crun_pg *pg, struct xfer *x);

/* ---- algorithms (group-rank arguments, byte counts derived from dtype) ------ */

int algo_barrier(struct crun_pg *pg);
int algo_broadcast(struct crun_pg *pg, void *buf, size_t count, int dtype, int root);
int algo_all_reduce(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		    int op);
int algo_reduce(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int op,
		int root);
int algo_all_gather(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype);
int algo_gather(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		int root);
int algo_scatter(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		 int root);
int algo_reduce_scatter(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
			int op);
int algo_all_to_all(struct crun_pg *pg, const void *sbuf, void *rbuf, size_t count, int dtype);

/* ---- shared by env.c and pg.c ------------------------------------------------ */

/* What pg_create() needs beyond the member list. */
struct pg_create_args {
	crun_store_t *store; /* the worker store (PrefixStore "default_pg"); borrowed */
	int restart_count;
	const char *gname; /* group name: keys live under "<gname>//crun/a<restart>/" */
	int my_world_rank;
	int local_rank;	      /* picks the device of a GPU backend */
	int local_world_size; /* with the visible device count (kernels_pick_device) */
	uint32_t timeout_ms;
	const char *backend;	/* "cpu", "nccl", "auto" or NULL (= auto) */
	int *auto_noted;	/* set once "auto fell back to cpu" has been logged */
	struct crun_pg *parent; /* the world group: split from it where the backend can */
};

/* Builds a group over world ranks (collective among the members only).
 * CRUN_ENOTSUP for "nccl" where the GPU object, CUDA or a device is
 * missing (the reason in *ret_err when ret_err is not NULL: cap bytes). */
int pg_create(const struct pg_create_args *ca, const int *world_ranks, int n,
	      struct crun_pg **ret_pg, char *ret_err, size_t cap);
void pg_destroy(struct crun_pg *pg);
/* A world rank's share in building a group it is not a member of: where
 * the group's backend splits from the world's (nccl), the split is
 * collective over the world. 0 when there is nothing to do. */
int pg_split_skip(struct crun_pg *world, const char *backend, char *err, size_t cap);
/* Why the last crun_init*() or crun_pg_new() failed ("" if none): what
 * crun_pg_last_error(NULL) returns. Valid until the next such call. */
const char *pg_init_last_error(void);
/* Waits for queued work, stops the progress thread, then pg_destroy(). */
void pg_stop_and_destroy(struct crun_pg *pg);

#endif /* CRUN_WORKER_SDK_WORKER_H */
