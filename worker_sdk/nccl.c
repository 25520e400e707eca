/* nccl.c: the nccl backend (struct pg_backend), compiled only into
 * libcrun-cuda.so.0. One communicator and one CUDA stream per group on the
 * device kernels_pick_device() names (LOCAL_RANK, or LOCAL_RANK % visible
 * where CUDA_VISIBLE_DEVICES is narrowed per rank); the unique id goes
 * through the worker store (rank 0 makes it). Communicators are
 * non-blocking, and every wait is a poll of the stream's event and
 * ncclCommGetAsyncError, so a timeout or crun_pg_abort() (->
 * ncclCommAbort) ends a collective that hangs on a dead peer: CRUN_EPEER /
 * CRUN_ETIMEDOUT / CRUN_ECANCELED as on the cpu backend (the abort itself
 * is local: peers learn of it only if NCCL does, see worker.h). Buffers
 * may be device memory (used in place) or host memory (staged through
 * device scratch), so "auto" is safe for programs written for the cpu
 * backend.
 */
#include <sched.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "crun/crun.h"
#include "crun/worker.h"
#include "kernels/cuda_int.h"
#include "worker_sdk/nccl_int.h"

struct nccl_ctx {
	int rank, size, device;
	ncclComm_t comm;
	cudaStream_t stream;
	cudaEvent_t done;
	cudaEvent_t ready;    /* the caller's work so far, which the stream waits for */
	struct nccl_ipc *ipc; /* NULL: NCCL for every size */
	_Atomic int aborted;
	_Atomic uint32_t timeout_ms;
	int broken;   /* the code every later call returns */
	int deferred; /* collectives only enqueue (async work, see mark()) */
	char err[512];
	void *scratch[2]; /* staging of host buffers: [0] send, [1] receive */
	size_t scratch_len[2];
	void *one; /* one int32 on the device, for barrier() */
};

/* One collective: the device views of its buffers, and where a staged
 * receive buffer goes back to. */
struct call {
	const void *ds;
	void *dr;
	void *host_r;
	const void *dev_r;
	size_t r_bytes;
};

/* The GPU object links nothing of libcrun, so not common.h's TRY either. */
#define TRY_NC(expr)               \
	do {                       \
		int r_ = (expr);   \
		if (r_ < 0)        \
			return r_; \
	} while (0)

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int fail(struct nccl_ctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records the detail; codes that break the group stick. */
static int fail(struct nccl_ctx *c, int code, const char *fmt, ...)
{
	va_list ap;

	if (c->broken)
		return c->broken;
	va_start(ap, fmt);
	(void)vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	if (code == CRUN_EPEER || code == CRUN_ETIMEDOUT || code == CRUN_ECANCELED)
		c->broken = code;
	return code;
}

static int nccl_code(ncclResult_t r)
{
	switch (r) {
	case ncclSuccess:
		return 0;
	case ncclInvalidArgument:
	case ncclInvalidUsage:
		return CRUN_EINVAL;
	case ncclRemoteError:
	case ncclSystemError:
		return CRUN_EPEER; /* a peer died or the network failed */
	default:
		return CRUN_EIO;
	}
}

static int nfail(struct nccl_ctx *c, ncclResult_t r, const char *what)
{
	const char *last = c->comm ? ncclGetLastError(c->comm) : ncclGetLastError(NULL);

	return fail(c, nccl_code(r), "%s: %s%s%s", what, ncclGetErrorString(r),
		    last && *last ? ": " : "", last ? last : "");
}

static int cfail(struct nccl_ctx *c, cudaError_t e, const char *what)
{
	int code = kernels_cu_err(e, what);

	return code ? fail(c, code, "%s", kernels_cu_last_error()) : 0;
}

/* Gives up on the communicator: frees the spinning IPC kernel and makes
 * NCCL's kernels return, so the stream drains. */
static void kill_comm(struct nccl_ctx *c)
{
	nccl_ipc_abort(c->ipc);
	if (c->comm) {
		(void)ncclCommAbort(c->comm);
		c->comm = NULL;
	}
}

/* A step failed after the peers moved on (the IPC epoch is counted per
 * call on every rank): this rank is out of step, and a later call would
 * pair with the peers' wrong call. Break the group, which also frees our
 * spinning kernel and aborts the communicator. CRUN_EPEER, one of the codes
 * pg.c makes sticky (with this text in crun_pg_last_error): to the group,
 * this rank has failed. */
static int break_group(struct nccl_ctx *c, int code, const char *what, const char *detail)
{
	if (c->broken)
		return c->broken;
	(void)snprintf(c->err, sizeof(c->err), "%s: %s (the group is broken: out of step)", what,
		       detail);
	c->broken = code;
	kill_comm(c);
	return code;
}

/* Backs off from spinning to short sleeps: the first waits are the short
 * collectives whose latency matters. */
static void pause_a_bit(unsigned spins)
{
	struct timespec ts = {0, 50 * 1000};

	if (spins < 2000)
		sched_yield();
	else
		(void)nanosleep(&ts, NULL);
}

/* One poll step for everything that ends a wait; 0 = keep waiting. */
static int check_wait(struct nccl_ctx *c, uint64_t deadline, const char *what)
{
	ncclResult_t ar = ncclSuccess;

	if (atomic_load(&c->aborted)) {
		kill_comm(c);
		return fail(c, CRUN_ECANCELED, "%s: aborted by crun_pg_abort", what);
	}
	if (c->comm && ncclCommGetAsyncError(c->comm, &ar) == ncclSuccess && ar != ncclSuccess &&
	    ar != ncclInProgress) {
		int r = nfail(c, ar, what);

		kill_comm(c);
		if (r != CRUN_EPEER && !c->broken)
			c->broken = r = CRUN_EPEER; /* the communicator is gone either way */
		return r;
	}
	if (deadline && now_ms() >= deadline) {
		kill_comm(c);
		return fail(c, CRUN_ETIMEDOUT, "%s: timed out after %u ms", what,
			    (unsigned)atomic_load(&c->timeout_ms));
	}
	return 0;
}

static uint64_t deadline_of(struct nccl_ctx *c)
{
	uint32_t t = atomic_load(&c->timeout_ms);

	return t ? now_ms() + t : 0;
}

/* A non-blocking communicator may answer ncclInProgress to any call: wait
 * until the enqueue is through. */
static int enqueued(struct nccl_ctx *c, ncclResult_t res, const char *what)
{
	uint64_t deadline = deadline_of(c);
	unsigned spins = 0;

	if (res != ncclInProgress)
		return res == ncclSuccess ? 0 : nfail(c, res, what);
	for (;;) {
		ncclResult_t ar = ncclInProgress;
		int r;

		if (ncclCommGetAsyncError(c->comm, &ar) == ncclSuccess && ar == ncclSuccess)
			return 0;
		r = check_wait(c, deadline, what);
		if (r < 0)
			return r;
		pause_a_bit(spins++);
	}
}

/* Waits for ev, watching for peers' failures, the timeout and abort. */
static int wait_event(struct nccl_ctx *c, cudaEvent_t ev, const char *what)
{
	uint64_t deadline = deadline_of(c);
	unsigned spins = 0;
	cudaError_t e;

	for (;;) {
		int r;

		e = cudaEventQuery(ev);
		if (e == cudaSuccess)
			return 0;
		if (e != cudaErrorNotReady)
			return cfail(c, e, what);
		r = check_wait(c, deadline, what);
		if (r < 0)
			return r;
		pause_a_bit(spins++);
	}
}

/* Waits for everything enqueued on the group's stream. */
static int drain(struct nccl_ctx *c, const char *what)
{
	cudaError_t e = cudaEventRecord(c->done, c->stream);

	return e == cudaSuccess ? wait_event(c, c->done, what) : cfail(c, e, "cudaEventRecord");
}

/* Every call starts here: the calling thread may not be the one that made
 * the group (any thread may drive it, one at a time), so set the device. */
static int begin(struct nccl_ctx *c)
{
	if (c->broken)
		return c->broken;
	if (atomic_load(&c->aborted))
		return fail(c, CRUN_ECANCELED, "aborted by crun_pg_abort");
	if (!c->comm)
		return fail(c, CRUN_EPEER, "communicator is gone");
	return cfail(c, cudaSetDevice(c->device), "cudaSetDevice");
}

/* The group's stream is non-blocking, so nothing orders it after the
 * caller's kernels: a gemm still writing the buffer would be read half
 * done. As PyTorch's ProcessGroupNCCL does with the current stream, record
 * an event where the caller works and make our stream wait for it. The SDK
 * takes no stream, so that is the legacy default stream, which itself
 * waits for every blocking stream of the device (the per-thread default
 * streams included); work on the caller's own cudaStreamNonBlocking
 * streams is the caller's to finish first (worker.h says so). */
static int after_caller(struct nccl_ctx *c)
{
	cudaError_t e = cudaEventRecord(c->ready, cudaStreamLegacy);

	if (e == cudaSuccess)
		e = cudaStreamWaitEvent(c->stream, c->ready, 0);
	return e == cudaSuccess ? 0 : cfail(c, e, "ordering after the caller's stream");
}

/* Grows scratch[slot] to at least bytes. Nothing on the stream uses it:
 * every call drains the stream before it returns. */
static int scratch_get(struct nccl_ctx *c, int slot, size_t bytes)
{
	cudaError_t e;

	if (c->scratch_len[slot] >= bytes)
		return 0;
	/* Async work may still read the old buffer: let it finish first. */
	if (c->deferred && c->scratch[slot])
		TRY_NC(drain(c, "scratch"));
	(void)cudaFree(c->scratch[slot]);
	c->scratch[slot] = NULL;
	c->scratch_len[slot] = 0;
	e = cudaMalloc(&c->scratch[slot], bytes);
	if (e != cudaSuccess)
		return cfail(c, e, "cudaMalloc (scratch)");
	c->scratch_len[slot] = bytes;
	return 0;
}

/* Device memory (or managed) is used in place; anything else is staged
 * through scratch[slot], copied in when `in`. */
static int stage_ptr(struct nccl_ctx *c, int slot, const void *p, size_t bytes, int in,
		     const void **ret_dev)
{
	struct cudaPointerAttributes at;

	if (!p || !bytes) {
		*ret_dev = p;
		return 0;
	}
	if (cudaPointerGetAttributes(&at, p) == cudaSuccess &&
	    (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged)) {
		*ret_dev = p;
		return 0;
	}
	(void)cudaGetLastError(); /* an unregistered host pointer is not an error */
	TRY_NC(scratch_get(c, slot, bytes));
	if (in) {
		cudaError_t e =
		    cudaMemcpyAsync(c->scratch[slot], p, bytes, cudaMemcpyHostToDevice, c->stream);

		if (e != cudaSuccess)
			return cfail(c, e, "staging copy in");
	}
	*ret_dev = c->scratch[slot];
	return 0;
}

/* A device-side copy of src (bytes) in scratch[slot], enqueued. */
static int scratch_copy(struct nccl_ctx *c, int slot, const void *src, size_t bytes,
			const void **ret_copy)
{
	cudaError_t e;

	TRY_NC(scratch_get(c, slot, bytes));
	e = cudaMemcpyAsync(c->scratch[slot], src, bytes, cudaMemcpyDeviceToDevice, c->stream);
	if (e != cudaSuccess)
		return cfail(c, e, "scratch copy");
	*ret_copy = c->scratch[slot];
	return 0;
}

/* Every collective starts here: checks the group, makes the calling thread
 * use the group's device (async work runs on the progress thread), and
 * stages the (send, receive) pair. In place (s == r) shares one buffer. */
static int start(struct nccl_ctx *c, const void *s, size_t s_bytes, void *r, size_t r_bytes,
		 struct call *k)
{
	const void *dr;
	int rc;

	memset(k, 0, sizeof(*k));
	TRY_NC(begin(c));
	TRY_NC(after_caller(c));
	if (s && s == r) {
		/* The buffer holds the larger of the two (reduce_scatter reads
		 * size * count elements and writes count). */
		rc = stage_ptr(c, 1, r, s_bytes > r_bytes ? s_bytes : r_bytes, 1, &dr);
		if (rc < 0)
			return rc;
		k->ds = dr;
	} else {
		rc = stage_ptr(c, 0, s, s_bytes, 1, &k->ds);
		if (rc == 0)
			rc = stage_ptr(c, 1, r, r_bytes, 0, &dr);
		if (rc < 0)
			return rc;
	}
	k->dr = (void *)dr;
	if (r && dr != r) {
		k->host_r = r;
		k->dev_r = dr;
		k->r_bytes = r_bytes;
	}
	return 0;
}

/* Waits for the enqueued work, then copies a staged result out (after the
 * wait, so a hang stays abortable). */
static int finish(struct nccl_ctx *c, int r, const struct call *st, const char *what)
{
	if (r < 0) {
		/* Work enqueued before a failure still runs: let it drain. */
		if (!c->broken)
			(void)drain(c, what);
		return r;
	}
	if (c->deferred && !st->host_r)
		return 0; /* async work: its token is waited for instead */
	r = drain(c, what);
	if (r == 0 && st->host_r)
		r = cfail(c, cudaMemcpy(st->host_r, st->dev_r, st->r_bytes, cudaMemcpyDeviceToHost),
			  "staging copy out");
	return r;
}

static ncclDataType_t nccl_type(int dtype)
{
	static const ncclDataType_t map[CRUN_DTYPE__MAX] = {
	    [CRUN_F32] = ncclFloat32,	[CRUN_F64] = ncclFloat64, [CRUN_F16] = ncclFloat16,
	    [CRUN_BF16] = ncclBfloat16, [CRUN_I8] = ncclInt8,	  [CRUN_U8] = ncclUint8,
	    [CRUN_I32] = ncclInt32,	[CRUN_I64] = ncclInt64,
	};

	return map[dtype];
}

static int is_float(int dtype)
{
	return dtype == CRUN_F32 || dtype == CRUN_F64 || dtype == CRUN_F16 || dtype == CRUN_BF16;
}

/* Integer AVG is SUM then a truncating division, as on the cpu backend
 * (ncclAvg is defined for floating types only). */
static ncclRedOp_t nccl_op(int op, int dtype)
{
	static const ncclRedOp_t map[CRUN_RED_OP__MAX] = {
	    [CRUN_SUM] = ncclSum, [CRUN_PROD] = ncclProd, [CRUN_MIN] = ncclMin,
	    [CRUN_MAX] = ncclMax, [CRUN_AVG] = ncclAvg,
	};

	return op == CRUN_AVG && !is_float(dtype) ? ncclSum : map[op];
}

/* The division of an integer AVG, enqueued after the sum. */
static int int_avg(struct nccl_ctx *c, void *buf, size_t count, int dtype, int op)
{
	if (op != CRUN_AVG || is_float(dtype) || !count)
		return 0;
	return kernels_cu_div(buf, count, dtype, c->size, c->stream) < 0
		   ? fail(c, CRUN_EIO, "%s", kernels_cu_last_error())
		   : 0;
}

static size_t bytes_of(size_t count, int dtype)
{
	return count * kernels_cu_dtype_size(dtype);
}

/* ---- collectives --------------------------------------------------------------- */

static int nc_all_reduce(void *ctx, const void *s, void *r, size_t count, int dtype, int op)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	struct call k;
	int rc = start(c, s, b, r, b, &k);

	if (rc == 0 && nccl_ipc_fits(c->ipc, b)) {
		if (nccl_ipc_all_reduce(c->ipc, k.ds, k.dr, count, dtype, op, c->stream) < 0)
			rc = break_group(c, CRUN_EPEER, "all_reduce over CUDA IPC",
					 kernels_cu_last_error());
	} else if (rc == 0) {
		rc = enqueued(c,
			      ncclAllReduce(k.ds, k.dr, count, nccl_type(dtype), nccl_op(op, dtype),
					    c->comm, c->stream),
			      "ncclAllReduce");
		if (rc == 0)
			rc = int_avg(c, k.dr, count, dtype, op);
	}
	return finish(c, rc, &k, "all_reduce");
}

static int nc_broadcast(void *ctx, void *buf, size_t count, int dtype, int root)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	struct call k;
	int rc = start(c, buf, b, buf, b, &k);

	if (rc == 0)
		rc = enqueued(
		    c, ncclBroadcast(k.ds, k.dr, count, nccl_type(dtype), root, c->comm, c->stream),
		    "ncclBroadcast");
	return finish(c, rc, &k, "broadcast");
}

static int nc_reduce(void *ctx, const void *s, void *r, size_t count, int dtype, int op, int root)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	struct call k;
	int rc = start(c, s, b, c->rank == root ? r : NULL, b, &k);

	if (rc == 0) {
		/* recvbuff matters only at the root. */
		rc = enqueued(c,
			      ncclReduce(k.ds, k.dr ? k.dr : (void *)k.ds, count, nccl_type(dtype),
					 nccl_op(op, dtype), root, c->comm, c->stream),
			      "ncclReduce");
		if (rc == 0 && c->rank == root)
			rc = int_avg(c, k.dr, count, dtype, op);
	}
	return finish(c, rc, &k, "reduce");
}

static int nc_all_gather(void *ctx, const void *s, void *r, size_t count, int dtype)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	struct call k;
	/* In place (s == r + rank * count) on the host is staged as two
	 * buffers; on the device it is NCCL's own in-place form. */
	int rc = start(c, s, b, r, b * c->size, &k);

	if (rc == 0)
		rc = enqueued(
		    c, ncclAllGather(k.ds, k.dr, count, nccl_type(dtype), c->comm, c->stream),
		    "ncclAllGather");
	return finish(c, rc, &k, "all_gather");
}

static int nc_reduce_scatter(void *ctx, const void *s, void *r, size_t count, int dtype, int op)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	struct call k;
	int rc = start(c, s, b * c->size, r, b, &k);

	if (rc == 0) {
		/* In place, NCCL wants recvbuff = sendbuff + rank * count; the
		 * SDK's contract puts the result at the start: move it there. */
		uint8_t *out = k.ds == k.dr ? (uint8_t *)k.dr + b * c->rank : k.dr;

		rc = enqueued(c,
			      ncclReduceScatter(k.ds, out, count, nccl_type(dtype),
						nccl_op(op, dtype), c->comm, c->stream),
			      "ncclReduceScatter");
		if (rc == 0 && out != k.dr)
			rc = cfail(
			    c, cudaMemcpyAsync(k.dr, out, b, cudaMemcpyDeviceToDevice, c->stream),
			    "reduce_scatter in place");
		if (rc == 0)
			rc = int_avg(c, k.dr, count, dtype, op);
	}
	return finish(c, rc, &k, "reduce_scatter");
}

/* Grouped point-to-point for all_to_all (root < 0: everybody exchanges
 * every block, our own by a device copy), gather and scatter (only root <->
 * each peer; the root's blocks sit at b * peer). */
static int p2p_round(struct nccl_ctx *c, const uint8_t *ds, uint8_t *dr, size_t count, int dtype,
		     int sends, int recvs, int root, const char *what)
{
	size_t b = bytes_of(count, dtype);
	ncclDataType_t t = nccl_type(dtype);
	int blocks = root < 0 || c->rank == root;
	ncclResult_t res;
	int rc;

	if (sends && recvs && ds && dr) {
		cudaError_t e = cudaMemcpyAsync(dr + b * c->rank, ds + b * c->rank, b,
						cudaMemcpyDeviceToDevice, c->stream);

		if (e != cudaSuccess)
			return cfail(c, e, what);
	}
	rc = enqueued(c, ncclGroupStart(), "ncclGroupStart");
	for (int p = 0; rc == 0 && p < c->size; p++) {
		if (p == c->rank || !(root < 0 || p == root || c->rank == root))
			continue;
		if (sends)
			rc = enqueued(
			    c, ncclSend(ds + (blocks ? b * p : 0), count, t, p, c->comm, c->stream),
			    "ncclSend");
		if (rc == 0 && recvs)
			rc = enqueued(
			    c, ncclRecv(dr + (blocks ? b * p : 0), count, t, p, c->comm, c->stream),
			    "ncclRecv");
	}
	res = ncclGroupEnd();
	return rc ? rc : enqueued(c, res, "ncclGroupEnd");
}

static int nc_all_to_all(void *ctx, const void *s, void *r, size_t count, int dtype)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype) * c->size;
	struct call k;
	int rc = start(c, s, b, r, b, &k);

	/* In place: send from a copy (scratch[0] is free: in-place staging
	 * only uses scratch[1]). */
	if (rc == 0 && k.ds == k.dr)
		rc = scratch_copy(c, 0, k.ds, b, &k.ds);
	if (rc == 0)
		rc = p2p_round(c, k.ds, k.dr, count, dtype, 1, 1, -1, "all_to_all");
	return finish(c, rc, &k, "all_to_all");
}

/* The root's own block of gather / scatter is a device copy. */
static int own_block(struct nccl_ctx *c, void *dst, const void *src, size_t b, const char *what)
{
	return cfail(c, cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, c->stream), what);
}

static int nc_gather(void *ctx, const void *s, void *r, size_t count, int dtype, int root)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	int me_root = c->rank == root;
	struct call k;
	int rc = start(c, s, b, me_root ? r : NULL, b * c->size, &k);

	if (rc == 0 && me_root)
		rc = own_block(c, (uint8_t *)k.dr + b * root, k.ds, b, "gather");
	if (rc == 0)
		rc = p2p_round(c, me_root ? NULL : k.ds, k.dr, count, dtype, !me_root, me_root,
			       root, "gather");
	return finish(c, rc, &k, "gather");
}

static int nc_scatter(void *ctx, const void *s, void *r, size_t count, int dtype, int root)
{
	struct nccl_ctx *c = ctx;
	size_t b = bytes_of(count, dtype);
	int me_root = c->rank == root;
	struct call k;
	int rc = start(c, me_root ? s : NULL, b * c->size, r, b, &k);

	if (rc == 0 && me_root)
		rc = own_block(c, k.dr, (const uint8_t *)k.ds + b * root, b, "scatter");
	if (rc == 0)
		rc = p2p_round(c, k.ds, me_root ? NULL : k.dr, count, dtype, me_root, !me_root,
			       root, "scatter");
	return finish(c, rc, &k, "scatter");
}

static int nc_barrier(void *ctx)
{
	struct nccl_ctx *c = ctx;
	struct call k;
	int rc = start(c, NULL, 0, NULL, 0, &k);

	if (rc == 0)
		rc = enqueued(
		    c, ncclAllReduce(c->one, c->one, 1, ncclInt32, ncclSum, c->comm, c->stream),
		    "ncclAllReduce (barrier)");
	return finish(c, rc, &k, "barrier");
}

static int nc_send(void *ctx, const void *buf, size_t count, int dtype, int peer)
{
	struct nccl_ctx *c = ctx;
	struct call k;
	int rc = start(c, buf, bytes_of(count, dtype), NULL, 0, &k);

	if (rc == 0)
		rc = enqueued(c, ncclSend(k.ds, count, nccl_type(dtype), peer, c->comm, c->stream),
			      "ncclSend");
	return finish(c, rc, &k, "send");
}

static int nc_recv(void *ctx, void *buf, size_t count, int dtype, int peer)
{
	struct nccl_ctx *c = ctx;
	struct call k;
	int rc = start(c, NULL, 0, buf, bytes_of(count, dtype), &k);

	if (rc == 0)
		rc = enqueued(c, ncclRecv(k.dr, count, nccl_type(dtype), peer, c->comm, c->stream),
			      "ncclRecv");
	return finish(c, rc, &k, "recv");
}

/* ---- life cycle ----------------------------------------------------------------- */

/* How long nc_fini waits for ncclCommFinalize before it aborts: the
 * group's timeout, or NCCL_FINI_MAX_MS where that is 0 (wait forever). */
#define NCCL_FINI_MAX_MS 30000u
static uint32_t fini_bound_ms(uint32_t timeout_ms)
{
	return timeout_ms ? timeout_ms : NCCL_FINI_MAX_MS;
}

static void nc_fini(void *ctx)
{
	struct nccl_ctx *c = ctx;

	if (!c)
		return;
	(void)cudaSetDevice(c->device);
	if (c->comm && !c->broken && !atomic_load(&c->aborted)) {
		/* Flush, bounded even with timeout 0: a peer that never
		 * finalizes must not hang crun_finalize(). */
		uint64_t deadline = now_ms() + fini_bound_ms(atomic_load(&c->timeout_ms));
		ncclResult_t res = ncclCommFinalize(c->comm), ar = ncclInProgress;

		while (res == ncclInProgress || res == ncclSuccess) {
			if (ncclCommGetAsyncError(c->comm, &ar) != ncclSuccess ||
			    ar != ncclInProgress || (deadline && now_ms() >= deadline))
				break;
			pause_a_bit(2000);
		}
		if (ar == ncclSuccess && ncclCommDestroy(c->comm) == ncclSuccess)
			c->comm = NULL;
	}
	kill_comm(c); /* whatever is left */
	nccl_ipc_free(c->ipc);
	if (c->stream)
		(void)cudaStreamDestroy(c->stream);
	if (c->done)
		(void)cudaEventDestroy(c->done);
	if (c->ready)
		(void)cudaEventDestroy(c->ready);
	(void)cudaFree(c->scratch[0]);
	(void)cudaFree(c->scratch[1]);
	(void)cudaFree(c->one);
	free(c);
}

/* Rank 0 makes the id and publishes it; the others wait for it. */
static int share_id(const struct pg_backend_args *a, struct nccl_ctx *c, ncclUniqueId *id)
{
	char key[256];
	void *v;
	size_t len;
	int r;

	snprintf(key, sizeof(key), "%snccl/id", a->ns);
	if (a->rank == 0) {
		ncclResult_t res = ncclGetUniqueId(id);

		if (res != ncclSuccess)
			return nfail(c, res, "ncclGetUniqueId");
		r = a->store_set(a->store, key, id, sizeof(*id));
		return r < 0 ? fail(c, r, "store: cannot publish the NCCL id") : 0;
	}
	r = a->store_get(a->store, key, a->timeout_ms, &v, &len);
	if (r < 0)
		return fail(c, r, "store: no NCCL id from rank 0");
	if (len == sizeof(*id))
		memcpy(id, v, sizeof(*id));
	a->free_val(v);
	return len == sizeof(*id) ? 0 : fail(c, CRUN_EPROTO, "NCCL id of %zu bytes", len);
}

/* LOCAL_WORLD_SIZE from a core that passes it; else (an explicit init that
 * left it 0) as if this rank were the last one, which keeps LOCAL_RANK
 * where it is visible. */
static int local_world_of(const struct pg_backend_args *a)
{
	size_t end = offsetof(struct pg_backend_args, local_world_size) + sizeof(int);

	if (a->struct_size >= end && a->local_world_size > 0)
		return a->local_world_size;
	return a->local_rank + 1;
}

static int open_device(const struct pg_backend_args *a, struct nccl_ctx *c)
{
	int n = 0, lws = local_world_of(a);
	cudaError_t e = cudaGetDeviceCount(&n);

	if (e != cudaSuccess)
		return cfail(c, e, "cudaGetDeviceCount");
	if (kernels_pick_device(a->local_rank, lws, n, &c->device) < 0)
		return fail(c, CRUN_ENOTSUP,
			    "LOCAL_RANK %d of LOCAL_WORLD_SIZE %d but %d visible CUDA device(s)",
			    a->local_rank, lws, n);
	e = cudaSetDevice(c->device);
	if (e == cudaSuccess)
		e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
	if (e == cudaSuccess)
		e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming);
	if (e == cudaSuccess)
		e = cudaMalloc(&c->one, sizeof(int32_t));
	if (e == cudaSuccess)
		e = cudaMemset(c->one, 0, sizeof(int32_t));
	return e == cudaSuccess ? 0 : cfail(c, e, "device set-up");
}

static int nc_init(const struct pg_backend_args *a, void **ret_ctx, char *err, size_t cap)
{
	struct nccl_ctx *c = calloc(1, sizeof(*c));
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId id;
	int r;

	if (!c)
		return CRUN_ENOMEM;
	c->rank = a->rank;
	c->size = a->size;
	atomic_store(&c->timeout_ms, a->timeout_ms);
	r = open_device(a, c);
	cfg.blocking = 0; /* so that init, too, can time out and abort */
	if (r == 0 && a->parent) {
		/* Keyed by group rank, so NCCL ranks follow the group's order. */
		r = enqueued(
		    c,
		    ncclCommSplit(((struct nccl_ctx *)a->parent)->comm, 0, a->rank, &c->comm, &cfg),
		    "ncclCommSplit");
	} else if (r == 0) {
		r = share_id(a, c, &id);
		if (r == 0)
			r = enqueued(c,
				     ncclCommInitRankConfig(&c->comm, a->size, id, a->rank, &cfg),
				     "ncclCommInitRankConfig");
	}
	if (r == 0)
		r = nccl_ipc_setup(a, &c->ipc, c->err, sizeof(c->err));
	if (r < 0) {
		if (c->err[0])
			snprintf(err, cap, "%s", c->err);
		else
			snprintf(err, cap, "nccl backend set-up failed (%d)", r);
		nc_fini(c);
		return r;
	}
	*ret_ctx = c;
	return 0;
}

/* A world rank outside a group split from the world: NCCL_SPLIT_NOCOLOR,
 * waited for on the parent communicator. */
static int nc_split_skip(void *parent_ctx, char *err, size_t cap)
{
	struct nccl_ctx *p = parent_ctx;
	ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
	ncclComm_t none = NULL;
	int r = begin(p);

	cfg.blocking = 0;
	if (r == 0)
		r = enqueued(p, ncclCommSplit(p->comm, NCCL_SPLIT_NOCOLOR, 0, &none, &cfg),
			     "ncclCommSplit (not a member)");
	if (r < 0)
		snprintf(err, cap, "%s", p->err);
	return r;
}

/* ---- asynchronous work: a CUDA event per work ----------------------------------- */

static void nc_defer(void *ctx, int on)
{
	((struct nccl_ctx *)ctx)->deferred = on;
}

static int nc_mark(void *ctx, void **ret_token)
{
	struct nccl_ctx *c = ctx;
	cudaEvent_t ev;
	cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);

	if (e != cudaSuccess)
		return cfail(c, e, "cudaEventCreate");
	e = cudaEventRecord(ev, c->stream);
	if (e != cudaSuccess) {
		(void)cudaEventDestroy(ev);
		return cfail(c, e, "cudaEventRecord");
	}
	*ret_token = ev;
	return 0;
}

static int nc_wait_token(void *ctx, void *token)
{
	struct nccl_ctx *c = ctx;

	if (c->broken)
		return c->broken;
	TRY_NC(cfail(c, cudaSetDevice(c->device), "cudaSetDevice"));
	return wait_event(c, (cudaEvent_t)token, "async work");
}

/* One look, no waiting: a failure found on the way counts (no timeout
 * here: the wait that follows, if any, has one). */
static int nc_test_token(void *ctx, void *token, int *ret_done)
{
	struct nccl_ctx *c = ctx;
	cudaError_t e;
	int r;

	if (c->broken)
		return c->broken;
	e = cudaEventQuery((cudaEvent_t)token);
	if (e == cudaSuccess) {
		*ret_done = 1;
		return 0;
	}
	if (e != cudaErrorNotReady)
		return cfail(c, e, "async work");
	r = check_wait(c, 0, "async work");
	if (r == 0)
		*ret_done = 0;
	return r;
}

static void nc_free_token(void *ctx, void *token)
{
	if (token)
		(void)cudaEventDestroy((cudaEvent_t)token);
}

static void nc_abort(void *ctx)
{
	struct nccl_ctx *c = ctx;

	/* The waiting thread sees the flag and aborts the communicator: NCCL
	 * allows ncclCommAbort from another thread, but a communicator that is
	 * freed under a thread still polling it is not safe. The IPC kernel
	 * spins on the device, so its flag goes up right here. */
	atomic_store(&c->aborted, 1);
	nccl_ipc_abort(c->ipc);
}

static void nc_set_timeout(void *ctx, uint32_t timeout_ms)
{
	atomic_store(&((struct nccl_ctx *)ctx)->timeout_ms, timeout_ms);
}

static const char *nc_last_error(void *ctx)
{
	return ((struct nccl_ctx *)ctx)->err;
}

static const struct pg_backend nccl_backend = {
    .abi = PG_BACKEND_ABI,
    .name = "nccl",
    .init = nc_init,
    .fini = nc_fini,
    .broadcast = nc_broadcast,
    .all_reduce = nc_all_reduce,
    .reduce = nc_reduce,
    .all_gather = nc_all_gather,
    .gather = nc_gather,
    .scatter = nc_scatter,
    .reduce_scatter = nc_reduce_scatter,
    .all_to_all = nc_all_to_all,
    .barrier = nc_barrier,
    .send = nc_send,
    .recv = nc_recv,
    .abort = nc_abort,
    .set_timeout = nc_set_timeout,
    .last_error = nc_last_error,
    .split_skip = nc_split_skip,
    .defer = nc_defer,
    .mark = nc_mark,
    .test_token = nc_test_token,
    .wait_token = nc_wait_token,
    .free_token = nc_free_token,
};

/* The door backend.c looks up. NULL, with CUDA's or NCCL's words in err,
 * where no device is usable. */
const struct pg_backend *crun_cuda_pg_backend_v1(int abi, char *err, size_t cap)
{
	int v = 0;

	if (abi != PG_BACKEND_ABI) {
		snprintf(err, cap, "GPU object backend ABI %d, libcrun wants %d", PG_BACKEND_ABI,
			 abi);
		return NULL;
	}
	if (!crun_cuda_kernels_v1(KERNELS_CUDA_ABI, err, cap))
		return NULL; /* err: CUDA's words for "no driver" or "no device" */
	if (ncclGetVersion(&v) != ncclSuccess) {
		snprintf(err, cap, "ncclGetVersion failed");
		return NULL;
	}
	return &nccl_backend;
}
