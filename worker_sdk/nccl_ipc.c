/* nccl_ipc.c: the intra-node all_reduce of the NCCL backend over CUDA IPC.
 * Below a size limit and when every member is on this host, one kernel per
 * rank reads the peers' buffers directly over NVLink/PCIe (one-shot: each
 * rank reduces everything; two-shot for larger messages: reduce-scatter
 * into the own buffer, then all-gather), which skips NCCL's protocol
 * set-up for small messages. The buffer handles travel through the store.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crun/crun.h"
#include "crun/worker.h"
#include "kernels/cuda_int.h"
#include "worker_sdk/nccl_int.h"

struct nccl_ipc {
	int rank, size;
	size_t max_bytes, oneshot_bytes;
	void *data;	  /* own data buffer (max_bytes) */
	uint32_t *signal; /* own signal area */
	void *peer_data[KERNELS_CUDA_MAX_BUFS];
	uint32_t *peer_signal[KERNELS_CUDA_MAX_BUFS];
	int opened[KERNELS_CUDA_MAX_BUFS]; /* peer handles to close */
	volatile uint32_t *abort_host;	   /* mapped pinned word the kernel polls */
	uint32_t *abort_dev;
	uint32_t epoch;
	int out_of_step; /* a step failed: the peers' epochs moved on without us */
};

/* What a rank publishes: its two handles, or ok = 0. */
struct ipc_card {
	uint32_t ok;
	cudaIpcMemHandle_t data, signal;
};

static size_t env_bytes(const char *name, size_t def)
{
	const char *s = getenv(name);
	char *end;
	unsigned long long v;

	if (!s || !*s)
		return def;
	v = strtoull(s, &end, 10);
	return *end || v > (1ull << 32) ? def : (size_t)v;
}

void nccl_ipc_free(struct nccl_ipc *ipc)
{
	if (!ipc)
		return;
	for (int p = 0; p < ipc->size; p++) {
		if (ipc->opened[p] && ipc->peer_data[p])
			(void)cudaIpcCloseMemHandle(ipc->peer_data[p]);
		if (ipc->opened[p] && ipc->peer_signal[p])
			(void)cudaIpcCloseMemHandle(ipc->peer_signal[p]);
	}
	if (ipc->data)
		(void)cudaFree(ipc->data);
	if (ipc->signal)
		(void)cudaFree(ipc->signal);
	if (ipc->abort_host)
		(void)cudaFreeHost((void *)ipc->abort_host);
	free(ipc);
}

/* Our buffers and handles; card->ok = 0 when CUDA refuses any of it. */
static void make_card(struct nccl_ipc *ipc, struct ipc_card *card)
{
	void *host = NULL;

	memset(card, 0, sizeof(*card));
	if (cudaMalloc(&ipc->data, ipc->max_bytes) != cudaSuccess ||
	    cudaMalloc((void **)&ipc->signal, KERNELS_IPC_SIGNAL_BYTES) != cudaSuccess ||
	    cudaMemset(ipc->signal, 0, KERNELS_IPC_SIGNAL_BYTES) != cudaSuccess ||
	    cudaHostAlloc(&host, sizeof(uint32_t), cudaHostAllocMapped) != cudaSuccess)
		return;
	ipc->abort_host = host;
	*ipc->abort_host = 0;
	if (cudaHostGetDevicePointer((void **)&ipc->abort_dev, host, 0) != cudaSuccess ||
	    cudaIpcGetMemHandle(&card->data, ipc->data) != cudaSuccess ||
	    cudaIpcGetMemHandle(&card->signal, ipc->signal) != cudaSuccess ||
	    cudaDeviceSynchronize() != cudaSuccess) /* the zeroed signals land first */
		return;
	card->ok = 1;
}

/* Maps the peer's buffers; 1 on success. */
static int open_peer(struct nccl_ipc *ipc, int p, const struct ipc_card *card)
{
	if (!card->ok)
		return 0;
	if (cudaIpcOpenMemHandle(&ipc->peer_data[p], card->data, cudaIpcMemLazyEnablePeerAccess) !=
	    cudaSuccess)
		return 0;
	ipc->opened[p] = 1;
	if (cudaIpcOpenMemHandle((void **)&ipc->peer_signal[p], card->signal,
				 cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
		return 0;
	return 1;
}

/* Publishes `val` under <ns>ipc/<what>/<rank> and reads every rank's. */
static int exchange(const struct pg_backend_args *a, const char *what, const void *val, size_t len,
		    int (*take)(struct nccl_ipc *, int, const void *, size_t), struct nccl_ipc *ipc,
		    int *ret_all_ok)
{
	char key[256];
	int all_ok = 1;
	int r;

	snprintf(key, sizeof(key), "%sipc/%s/%d", a->ns, what, a->rank);
	r = a->store_set(a->store, key, val, len);
	if (r < 0)
		return r;
	for (int p = 0; p < a->size; p++) {
		void *v;
		size_t vlen;

		snprintf(key, sizeof(key), "%sipc/%s/%d", a->ns, what, p);
		r = a->store_get(a->store, key, a->timeout_ms, &v, &vlen);
		if (r < 0)
			return r;
		all_ok &= take(ipc, p, v, vlen);
		a->free_val(v);
	}
	*ret_all_ok = all_ok;
	return 0;
}

static int take_card(struct nccl_ipc *ipc, int p, const void *v, size_t len)
{
	struct ipc_card card;

	if (len != sizeof(card))
		return 0;
	memcpy(&card, v, sizeof(card));
	if (p == ipc->rank) {
		ipc->peer_data[p] = ipc->data;
		ipc->peer_signal[p] = ipc->signal;
		return card.ok;
	}
	return open_peer(ipc, p, &card);
}

static int take_verdict(struct nccl_ipc *ipc, int p, const void *v, size_t len)
{
	return len == 1 && *(const char *)v == '1';
}

int nccl_ipc_setup(const struct pg_backend_args *a, struct nccl_ipc **ret_ipc, char *err,
		   size_t cap)
{
	struct nccl_ipc *ipc;
	struct ipc_card card;
	int mapped = 0, all = 0;
	int r;

	*ret_ipc = NULL;
	if (!a->single_host || a->size < 2 || a->size > KERNELS_CUDA_MAX_BUFS ||
	    env_bytes("CRUN_NCCL_IPC_MAX_BYTES", NCCL_IPC_MAX_BYTES_DEFAULT) == 0)
		return 0;
	ipc = calloc(1, sizeof(*ipc));
	if (!ipc)
		return CRUN_ENOMEM;
	ipc->rank = a->rank;
	ipc->size = a->size;
	ipc->max_bytes = env_bytes("CRUN_NCCL_IPC_MAX_BYTES", NCCL_IPC_MAX_BYTES_DEFAULT);
	ipc->oneshot_bytes =
	    env_bytes("CRUN_NCCL_IPC_ONESHOT_BYTES", NCCL_IPC_ONESHOT_BYTES_DEFAULT);
	make_card(ipc, &card);
	/* Every rank publishes and reads even when its own part failed, so
	 * nobody waits for a card that never comes. */
	r = exchange(a, "card", &card, sizeof(card), take_card, ipc, &mapped);
	if (r == 0)
		r = exchange(a, "ok", mapped ? "1" : "0", 1, take_verdict, ipc, &all);
	if (r < 0) {
		snprintf(err, cap, "ipc set-up: store: %d", r);
		nccl_ipc_free(ipc);
		return r;
	}
	(void)cudaGetLastError(); /* a failed open is not the next call's error */
	if (!all) {
		nccl_ipc_free(ipc); /* some rank could not: NCCL for everything */
		return 0;
	}
	*ret_ipc = ipc;
	return 0;
}

int nccl_ipc_fits(const struct nccl_ipc *ipc, size_t bytes)
{
	return ipc && bytes > 0 && bytes <= ipc->max_bytes;
}

int nccl_ipc_all_reduce(struct nccl_ipc *ipc, const void *sbuf, void *rbuf, size_t count, int dtype,
			int op, cudaStream_t stream)
{
	size_t bytes = count * kernels_cu_dtype_size(dtype);
	struct kernels_ipc_args k;
	int r;

	memset(&k, 0, sizeof(k));
	for (int p = 0; p < ipc->size; p++) {
		k.data[p] = ipc->peer_data[p];
		k.signal[p] = ipc->peer_signal[p];
	}
	k.abort_flag = ipc->abort_dev;
	k.rank = ipc->rank;
	k.nranks = ipc->size;
	/* Every rank makes the same calls in the same order, so the epoch is
	 * a call count: the peers count this call whether or not our part of
	 * it runs, and after a failure here no later call of ours can pair
	 * with theirs again. */
	k.epoch = ++ipc->epoch;
	k.two_shot = bytes > ipc->oneshot_bytes;
	if (ipc->out_of_step)
		return CRUN_EPROTO;
	r = kernels_cu_err(
	    cudaMemcpyAsync(ipc->data, sbuf, bytes, cudaMemcpyDeviceToDevice, stream),
	    "ipc input copy");
	if (r == 0)
		r = kernels_cu_ipc_all_reduce(&k, rbuf, count, dtype, op, stream);
	if (r < 0)
		ipc->out_of_step = 1;
	return r;
}

void nccl_ipc_abort(struct nccl_ipc *ipc)
{
	if (ipc && ipc->abort_host)
		*ipc->abort_host = 1;
}
