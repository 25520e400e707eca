/* nccl_int.h: what the two files of the NCCL backend share (nccl.c: the
 * backend table and the NCCL collectives; nccl_ipc.c: the intra-node CUDA
 * IPC all_reduce). Both are compiled only into libcrun-cuda.so.0.
 */
#ifndef CRUN_WORKER_SDK_NCCL_INT_H
#define CRUN_WORKER_SDK_NCCL_INT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "worker_sdk/backend_int.h"

/* Defaults of the IPC path, overridable per group at creation:
 * CRUN_NCCL_IPC_MAX_BYTES (0 turns IPC off) and CRUN_NCCL_IPC_ONESHOT_BYTES. */
#define NCCL_IPC_MAX_BYTES_DEFAULT     (8u << 20)
#define NCCL_IPC_ONESHOT_BYTES_DEFAULT (256u << 10)

struct nccl_ipc; /* opaque outside nccl_ipc.c */

/* The GPU object's backend door (see pg_backend_entry_fn). */
__attribute__((visibility("default"))) const struct pg_backend *
crun_cuda_pg_backend_v1(int abi, char *err, size_t cap);

/* Sets up the IPC buffers of a group whose members all share this host:
 * allocates and publishes this rank's buffers, maps every peer's, and turns
 * the path on only if every rank managed to (a second store round), so the
 * choice is the same on all ranks. *ret_ipc = NULL (and 0) when it is off;
 * a negative code only for a store failure, which fails the group. */
int nccl_ipc_setup(const struct pg_backend_args *a, struct nccl_ipc **ret_ipc, char *err,
		   size_t cap);
void nccl_ipc_free(struct nccl_ipc *ipc); /* NULL OK */

/* 1 when a message of `bytes` goes over IPC (0 < bytes <= the limit). */
int nccl_ipc_fits(const struct nccl_ipc *ipc, size_t bytes);

/* Enqueues the all_reduce of sbuf (device) into rbuf (device) on stream.
 * The caller waits for the stream, and calls nccl_ipc_abort() when it gives
 * up (timeout, abort), which releases the spinning kernel. A failure leaves
 * this rank out of step with its peers for good: every later call fails
 * (CRUN_EPROTO), and the caller must break its group. */
int nccl_ipc_all_reduce(struct nccl_ipc *ipc, const void *sbuf, void *rbuf, size_t count, int dtype,
			int op, cudaStream_t stream);
void nccl_ipc_abort(struct nccl_ipc *ipc); /* any thread; NULL OK */

#endif /* CRUN_WORKER_SDK_NCCL_INT_H */
