/* gpu_nccl.c: the nccl backend end to end. Forks --nranks workers (one per
 * GPU; 1 on a single-GPU host), each joins through crun_init_explicit()
 * with backend "nccl" (rank 0 hosts the store) and checks every collective
 * against values computed on the CPU, with device buffers and with host
 * buffers (staged), async work, abort (CRUN_ECANCELED, no hang), the IPC
 * all_reduce around its thresholds when there are several GPUs; then rank 0
 * reports the SDK's all_reduce beside a raw NCCL loop in the same run, both
 * blocking (a sync per call) and queued (async works / plain enqueues, one
 * wait at the end), and with several GPUs IPC beside NCCL.
 * Also: a GEMM still running on the default stream when all_reduce reads
 * its output (issue 27: the group's stream did not wait for it). With
 * --narrow each rank sees only its own GPU (CUDA_VISIBLE_DEVICES=<rank>, as
 * SLURM and device plugins give) and runs a few all_reduces: the device is
 * LOCAL_RANK % visible, where before it was CRUN_ENOTSUP.
 * Exit 77 when the backend says CRUN_ENOTSUP (no device).
 *
 *   gpu_nccl [--nranks N] [--port P] [--no-bench] [--narrow]
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crun/store.h"
#include "crun/worker.h"
#include "gpu/gpu_test.h"
#include "kernels/kernels.h"

static int rank, world;

/* Rank r's element i: small non-negative integers (PROD: 1 or 2). */
static double val(int r, size_t i, int op)
{
	return op == CRUN_PROD ? 1 + (int)((i + (size_t)r) % 2) : (double)((i * 7 + (size_t)r * 3) % 5);
}

static void fill(void *buf, int r, size_t count, int dtype, int op)
{
	for (size_t i = 0; i < count; i++)
		gt_put(buf, i, dtype, val(r, i, op));
}

static void *dev(size_t len)
{
	void *d = NULL;

	if (cudaMalloc(&d, len ? len : 1) != cudaSuccess)
		exit(1);
	return d;
}

/* all_reduce of every dtype x op, device and host buffers, in and out of
 * place; the expected value folds the ranks' inputs with the CPU kernels. */
static void check_all_reduce(crun_pg_t *pg, size_t count, int dtype, int op, int on_dev)
{
	size_t b = count * crun_dtype_size(dtype);
	uint8_t *want = malloc(b), *h = malloc(b), *got = malloc(b);
	void *s, *r;
	int rc;

	fill(want, 0, count, dtype, op);
	for (int p = 1; p < world; p++) {
		fill(h, p, count, dtype, op);
		kernels_reduce(want, h, count, dtype, op);
	}
	if (op == CRUN_AVG)
		kernels_div(want, count, dtype, world);
	fill(h, rank, count, dtype, op);
	if (on_dev) {
		s = dev(b);
		r = dev(b);
		cudaMemcpy(s, h, b, cudaMemcpyHostToDevice);
	} else {
		s = h;
		r = got;
	}
	rc = crun_all_reduce(pg, s, r, count, dtype, op, NULL);
	if (on_dev)
		cudaMemcpy(got, r, b, cudaMemcpyDeviceToHost);
	CK(rc == 0, "all_reduce %zu x dtype %d op %d dev %d: %s (%s)", count, dtype, op, on_dev,
	   crun_strerror(rc), crun_pg_last_error(pg));
	CK(rc || !memcmp(got, want, b), "all_reduce %zu x dtype %d op %d dev %d: wrong result",
	   count, dtype, op, on_dev);
	if (on_dev) {
		cudaFree(s);
		cudaFree(r);
	}
	free(want), free(h), free(got);
}

/* The other collectives on f32 host buffers (staging) and device buffers. */
static void check_others(crun_pg_t *pg, int on_dev)
{
	enum { N = 1031 };
	size_t W = (size_t)world;
	float *in = malloc(N * W * 4), *out = malloc(N * W * 4), *want = malloc(N * W * 4);
	float *din = on_dev ? dev(N * W * 4) : in, *dout = on_dev ? dev(N * W * 4) : out;
	int root = world - 1, rc;

#define IN_TO_DEV()                                                                     \
	do {                                                                            \
		if (on_dev)                                                             \
			cudaMemcpy(din, in, N * W * 4, cudaMemcpyHostToDevice);         \
	} while (0)
#define OUT_FROM_DEV()                                                                  \
	do {                                                                            \
		if (on_dev)                                                             \
			cudaMemcpy(out, dout, N * W * 4, cudaMemcpyDeviceToHost);      \
	} while (0)

	/* broadcast from root */
	for (size_t i = 0; i < N; i++)
		in[i] = rank == root ? (float)(i % 13) : -1.0f;
	IN_TO_DEV();
	rc = crun_broadcast(pg, din, N, CRUN_F32, root, NULL);
	if (on_dev)
		cudaMemcpy(in, din, N * 4, cudaMemcpyDeviceToHost);
	for (size_t i = 0; i < N; i++)
		want[i] = (float)(i % 13);
	CK(rc == 0 && !memcmp(in, want, N * 4), "broadcast dev %d", on_dev);

	/* all_gather: block p = p + i */
	for (size_t i = 0; i < N; i++)
		in[i] = (float)(rank + (int)i);
	IN_TO_DEV();
	rc = crun_all_gather(pg, din, dout, N, CRUN_F32, NULL);
	OUT_FROM_DEV();
	for (size_t p = 0; p < W; p++)
		for (size_t i = 0; i < N; i++)
			want[p * N + i] = (float)(p + i);
	CK(rc == 0 && !memcmp(out, want, N * W * 4), "all_gather dev %d", on_dev);

	/* gather at root: same blocks */
	memset(out, 0, N * W * 4);
	if (on_dev)
		cudaMemset(dout, 0, N * W * 4);
	rc = crun_gather(pg, din, dout, N, CRUN_F32, root, NULL);
	OUT_FROM_DEV();
	CK(rc == 0 && (rank != root || !memcmp(out, want, N * W * 4)), "gather dev %d", on_dev);

	/* scatter from root: rank p gets block p of want */
	memcpy(in, want, N * W * 4);
	IN_TO_DEV();
	rc = crun_scatter(pg, din, dout, N, CRUN_F32, root, NULL);
	OUT_FROM_DEV();
	CK(rc == 0 && !memcmp(out, want + (size_t)rank * N, N * 4), "scatter dev %d", on_dev);

	/* reduce_scatter SUM: input block p = p + i + rank -> sum over ranks */
	for (size_t p = 0; p < W; p++)
		for (size_t i = 0; i < N; i++)
			in[p * N + i] = (float)(p + i + (size_t)rank);
	IN_TO_DEV();
	rc = crun_reduce_scatter(pg, din, dout, N, CRUN_F32, CRUN_SUM, NULL);
	OUT_FROM_DEV();
	for (size_t i = 0; i < N; i++)
		want[i] = (float)(W * ((size_t)rank + i) + W * (W - 1) / 2);
	CK(rc == 0 && !memcmp(out, want, N * 4), "reduce_scatter dev %d", on_dev);

	/* ... and in place: the result lands at the start of the buffer */
	for (size_t p = 0; p < W; p++)
		for (size_t i = 0; i < N; i++)
			in[p * N + i] = (float)(p + i + (size_t)rank);
	IN_TO_DEV();
	rc = crun_reduce_scatter(pg, din, din, N, CRUN_F32, CRUN_SUM, NULL);
	if (on_dev)
		cudaMemcpy(in, din, N * 4, cudaMemcpyDeviceToHost);
	CK(rc == 0 && !memcmp(in, want, N * 4), "reduce_scatter in place dev %d", on_dev);

	/* all_reduce in place */
	for (size_t i = 0; i < N; i++)
		in[i] = (float)(rank + (int)i);
	IN_TO_DEV();
	rc = crun_all_reduce(pg, din, din, N, CRUN_F32, CRUN_SUM, NULL);
	if (on_dev)
		cudaMemcpy(in, din, N * 4, cudaMemcpyDeviceToHost);
	for (size_t i = 0; i < N; i++)
		want[i] = (float)(W * i + W * (W - 1) / 2);
	CK(rc == 0 && !memcmp(in, want, N * 4), "all_reduce in place dev %d", on_dev);

	/* reduce SUM at root of in = rank + i */
	for (size_t i = 0; i < N; i++)
		in[i] = (float)(rank + (int)i);
	IN_TO_DEV();
	rc = crun_reduce(pg, din, dout, N, CRUN_F32, CRUN_SUM, root, NULL);
	OUT_FROM_DEV();
	for (size_t i = 0; i < N; i++)
		want[i] = (float)(W * i + W * (W - 1) / 2);
	CK(rc == 0 && (rank != root || !memcmp(out, want, N * 4)), "reduce dev %d", on_dev);

	/* all_to_all: block p of rank q's input = 1000 q + p + i */
	for (size_t p = 0; p < W; p++)
		for (size_t i = 0; i < N; i++)
			in[p * N + i] = (float)(1000 * rank + (int)(p + i));
	IN_TO_DEV();
	rc = crun_all_to_all(pg, din, dout, N, CRUN_F32, NULL);
	OUT_FROM_DEV();
	for (size_t q = 0; q < W; q++)
		for (size_t i = 0; i < N; i++)
			want[q * N + i] = (float)(1000 * q + (size_t)rank + i);
	CK(rc == 0 && !memcmp(out, want, N * W * 4), "all_to_all dev %d", on_dev);
	for (size_t p = 0; p < W; p++) /* in place */
		for (size_t i = 0; i < N; i++)
			in[p * N + i] = (float)(1000 * rank + (int)(p + i));
	IN_TO_DEV();
	rc = crun_all_to_all(pg, din, din, N, CRUN_F32, NULL);
	if (on_dev)
		cudaMemcpy(in, din, N * W * 4, cudaMemcpyDeviceToHost);
	CK(rc == 0 && !memcmp(in, want, N * W * 4), "all_to_all in place dev %d", on_dev);

	/* send / recv around a ring */
	if (world > 1) {
		crun_work_t *w = NULL;

		for (size_t i = 0; i < N; i++)
			in[i] = (float)(rank * 3 + (int)i);
		IN_TO_DEV();
		/* Async send, then a blocking receive: the progress thread runs
		 * the send while this thread waits in the receive. */
		rc = crun_send(pg, din, N, CRUN_F32, (rank + 1) % world, &w);
		if (rc == 0)
			rc = crun_recv(pg, dout, N, CRUN_F32, (rank + world - 1) % world, NULL);
		if (w)
			rc = rc ? rc : crun_work_wait(w);
		crun_work_free(w);
		OUT_FROM_DEV();
		for (size_t i = 0; i < N; i++)
			want[i] = (float)(((rank + world - 1) % world) * 3 + (int)i);
		CK(rc == 0 && !memcmp(out, want, N * 4), "send/recv dev %d: %s", on_dev,
		   crun_strerror(rc));
	}
	CK(crun_barrier(pg, NULL) == 0, "barrier");
	if (on_dev) {
		cudaFree(din);
		cudaFree(dout);
	}
	free(in), free(out), free(want);
#undef IN_TO_DEV
#undef OUT_FROM_DEV
}

static void check_async(crun_pg_t *pg)
{
	enum { N = 4096, Q = 8 };
	crun_work_t *w[Q];
	float *buf[Q];
	int rc = 0;

	for (int q = 0; q < Q; q++) {
		buf[q] = dev(N * 4);
		cudaMemset(buf[q], 0, N * 4);
		rc |= crun_all_reduce(pg, buf[q], buf[q], N, CRUN_F32, CRUN_SUM, &w[q]);
	}
	for (int q = 0; q < Q; q++) {
		rc |= crun_work_wait(w[q]);
		crun_work_free(w[q]);
		cudaFree(buf[q]);
	}
	CK(rc == 0, "async all_reduce queue");
}

/* Groups split from the world's communicator (ncclCommSplit): every world
 * rank in reverse order, then {last, first} with the others sitting out. */
static void check_subgroups(void)
{
	int *ranks = malloc(sizeof(int) * (size_t)world);
	int pair[2] = {world - 1, 0};
	crun_pg_t *rev = NULL, *two = NULL;
	int32_t *d = dev(4), v;
	int rc;

	for (int i = 0; i < world; i++)
		ranks[i] = world - 1 - i;
	rc = crun_pg_new(ranks, world, "auto", &rev);
	CK(rc == 0 && rev && crun_pg_rank(rev) == world - 1 - rank, "reversed group: %s (%s)",
	   crun_strerror(rc), crun_pg_last_error(NULL));
	v = crun_pg_rank(rev) + 1;
	cudaMemcpy(d, &v, 4, cudaMemcpyHostToDevice);
	rc = crun_all_reduce(rev, d, d, 1, CRUN_I32, CRUN_SUM, NULL);
	cudaMemcpy(&v, d, 4, cudaMemcpyDeviceToHost);
	CK(rc == 0 && v == world * (world + 1) / 2, "reversed group all_reduce: %d", v);
	rc = crun_pg_new(pair, world > 1 ? 2 : 1, "nccl", &two);
	CK(rc == 0 && (rank == 0 || rank == world - 1) == (two != NULL), "pair group: %s (%s)",
	   crun_strerror(rc), crun_pg_last_error(NULL));
	if (two) {
		v = rank;
		rc = crun_all_reduce(two, &v, &v, 1, CRUN_I32, CRUN_MAX, NULL); /* host: staged */
		CK(rc == 0 && v == world - 1, "pair group all_reduce: %d", v);
	}
	crun_pg_free(two);
	crun_pg_free(rev);
	cudaFree(d);
	free(ranks);
}

/* A group aborted on every rank fails at once with CRUN_ECANCELED. */
static void check_abort(void)
{
	int *ranks = malloc(sizeof(int) * (size_t)world);
	crun_pg_t *pg = NULL;
	float *d = dev(64);
	int rc;

	for (int i = 0; i < world; i++)
		ranks[i] = i;
	rc = crun_pg_new(ranks, world, "nccl", &pg);
	CK(rc == 0 && pg, "crun_pg_new nccl: %s (%s)", crun_strerror(rc), crun_pg_last_error(NULL));
	if (pg) {
		CK(crun_all_reduce(pg, d, d, 16, CRUN_F32, CRUN_SUM, NULL) == 0, "before abort");
		crun_pg_abort(pg);
		rc = crun_all_reduce(pg, d, d, 16, CRUN_F32, CRUN_SUM, NULL);
		CK(rc == CRUN_ECANCELED, "after abort: %s", crun_strerror(rc));
		crun_pg_free(pg);
	}
	cudaFree(d);
	free(ranks);
}

/* ---- benchmarks (rank 0 reports) ------------------------------------------------- */

struct raw {
	ncclComm_t comm;
	cudaStream_t st;
};

/* A raw NCCL communicator over the same store, for the baseline. */
static int raw_open(struct raw *raw)
{
	crun_store_t *st = crun_worker_store();
	ncclUniqueId id;
	void *v;
	size_t len;

	if (rank == 0) {
		ncclGetUniqueId(&id);
		crun_store_set(st, "gpu_nccl/raw_id", &id, sizeof(id));
	} else {
		if (crun_store_get(st, "gpu_nccl/raw_id", 0, &v, &len) < 0 || len != sizeof(id))
			return -1;
		memcpy(&id, v, sizeof(id));
		crun_free(v);
	}
	cudaStreamCreateWithFlags(&raw->st, cudaStreamNonBlocking);
	return ncclCommInitRank(&raw->comm, world, id, rank) == ncclSuccess ? 0 : -1;
}

static int iters_for(size_t bytes)
{
	return bytes <= (1u << 20) ? 200 : bytes <= (16u << 20) ? 50 : 10;
}

/* Microseconds per blocking all_reduce: the SDK's, then NCCL's own with a
 * stream sync per call (what a blocking SDK call promises). */
static double time_sdk(crun_pg_t *pg, float *buf, size_t count)
{
	int it = iters_for(count * 4);
	double t0;

	crun_all_reduce(pg, buf, buf, count, CRUN_F32, CRUN_SUM, NULL);
	crun_barrier(pg, NULL);
	t0 = gt_now_s();
	for (int i = 0; i < it; i++)
		crun_all_reduce(pg, buf, buf, count, CRUN_F32, CRUN_SUM, NULL);
	return (gt_now_s() - t0) / it * 1e6;
}

static double time_raw(struct raw *raw, crun_pg_t *pg, float *buf, size_t count)
{
	int it = iters_for(count * 4);
	double t0;

	ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw->comm, raw->st);
	cudaStreamSynchronize(raw->st);
	crun_barrier(pg, NULL);
	t0 = gt_now_s();
	for (int i = 0; i < it; i++) {
		ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw->comm, raw->st);
		cudaStreamSynchronize(raw->st);
	}
	return (gt_now_s() - t0) / it * 1e6;
}

/* The same loops queued: every call async (the SDK's works, tied to CUDA
 * events) or plain enqueues (NCCL), then one wait at the end. */
static double time_sdk_async(crun_pg_t *pg, float *buf, size_t count)
{
	enum { MAXIT = 200 };
	crun_work_t *w[MAXIT];
	int it = iters_for(count * 4);
	double t0;

	crun_barrier(pg, NULL);
	t0 = gt_now_s();
	for (int i = 0; i < it; i++)
		crun_all_reduce(pg, buf, buf, count, CRUN_F32, CRUN_SUM, &w[i]);
	for (int i = 0; i < it; i++)
		crun_work_free(w[i]);
	return (gt_now_s() - t0) / it * 1e6;
}

static double time_raw_async(struct raw *raw, crun_pg_t *pg, float *buf, size_t count)
{
	int it = iters_for(count * 4);
	double t0;

	crun_barrier(pg, NULL);
	t0 = gt_now_s();
	for (int i = 0; i < it; i++)
		ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, raw->comm, raw->st);
	cudaStreamSynchronize(raw->st);
	return (gt_now_s() - t0) / it * 1e6;
}

static void bench(crun_pg_t *world_pg)
{
	struct raw raw;
	crun_pg_t *no_ipc = NULL;
	int *ranks = malloc(sizeof(int) * (size_t)world);
	float *buf = dev(256u << 20);

	cudaMemset(buf, 0, 256u << 20);
	for (int i = 0; i < world; i++)
		ranks[i] = i;
	setenv("CRUN_NCCL_IPC_MAX_BYTES", "0", 1); /* a second group: NCCL only */
	CK(crun_pg_new(ranks, world, "nccl", &no_ipc) == 0, "group without IPC");
	unsetenv("CRUN_NCCL_IPC_MAX_BYTES");
	if (raw_open(&raw) < 0 || !no_ipc) {
		CK(0, "raw NCCL communicator");
		return;
	}
	if (rank == 0) {
		gt_row("| bytes | crun nccl (IPC <= 8 MiB) us | crun nccl, IPC off us | raw NCCL us "
		       "| crun/raw | crun async us | raw async us | crun/raw async | ranks |");
		gt_row("|---|---|---|---|---|---|---|---|---|");
	}
	for (size_t bytes = 8; bytes <= (256u << 20); bytes *= 4) {
		size_t count = bytes / 4;
		double t_ipc = time_sdk(world_pg, buf, count);
		double t_sdk = time_sdk(no_ipc, buf, count);
		double t_raw = time_raw(&raw, world_pg, buf, count);
		double t_sdk_a = time_sdk_async(no_ipc, buf, count);
		double t_raw_a = time_raw_async(&raw, world_pg, buf, count);

		if (rank == 0)
			gt_row("| %zu | %.1f | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %d |", bytes,
			       t_ipc, t_sdk, t_raw, t_sdk / t_raw, t_sdk_a, t_raw_a,
			       t_sdk_a / t_raw_a, world);
	}
	ncclCommDestroy(raw.comm);
	crun_pg_free(no_ipc);
	cudaFree(buf);
	free(ranks);
}

/* ---- one rank ------------------------------------------------------------------------ */

/* A GEMM of ones (C = A B, every element n) queued on the default stream,
 * then at once an all_reduce that reads C: the result must be n * world
 * everywhere, which it is only if the collective waited for the GEMM. The
 * first part goes over IPC where there are several ranks, all of it over
 * NCCL. */
static void check_after_caller_stream(crun_pg_t *pg)
{
	const int n = 4096;
	const size_t count = (size_t)n * n, parts[] = {1u << 20, (size_t)n * n};
	const float one = 1.0f, zero = 0.0f;
	float *a = dev(count * 4), *b = dev(count * 4), *c = dev(count * 4), *r = dev(count * 4);
	float *h = malloc(count * 4);
	cublasHandle_t blas;

	for (size_t i = 0; i < count; i++)
		h[i] = 1.0f;
	cudaMemcpy(a, h, count * 4, cudaMemcpyHostToDevice);
	cudaMemcpy(b, h, count * 4, cudaMemcpyHostToDevice);
	CK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
	for (size_t p = 0; p < 2; p++) {
		size_t bad = 0;

		cudaMemset(c, 0, count * 4);
		cudaMemset(r, 0, count * 4);
		cudaDeviceSynchronize();
		cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
		int rc = crun_all_reduce(pg, c, r, parts[p], CRUN_F32, CRUN_SUM, NULL);

		CK(rc == 0, "all_reduce after a gemm: %s (%s)", crun_strerror(rc),
		   crun_pg_last_error(pg));
		cudaMemcpy(h, r, parts[p] * 4, cudaMemcpyDeviceToHost);
		for (size_t i = 0; i < parts[p]; i++)
			bad += h[i] != (float)n * (float)world;
		CK(bad == 0, "all_reduce of %zu floats right after a gemm: %zu wrong (first %g)",
		   parts[p], bad, (double)h[0]);
	}
	cublasDestroy(blas);
	cudaFree(a);
	cudaFree(b);
	cudaFree(c);
	cudaFree(r);
	free(h);
}

static int run_rank(int r, int n, int port, int do_bench, int narrow)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;
	static const size_t ipc_sizes[] = {1, 255, 1000, 60000, 70000, 300000, (1u << 20) + 7,
					   (3u << 20) + 1};
	int rc;

	rank = r;
	world = n;
	o.rank = r;
	o.world_size = n;
	o.local_rank = r;
	o.local_world_size = n;
	o.master_port = (uint16_t)port;
	o.use_agent_store = 0;
	o.timeout_ms = 120000;
	o.backend = "nccl";
	rc = crun_init_explicit(&o);
	if (rc == CRUN_ENOTSUP)
		return gt_skip(crun_pg_last_error(NULL));
	if (rc < 0) {
		fprintf(stderr, "rank %d: crun_init_explicit: %s (%s)\n", r, crun_strerror(rc),
			crun_pg_last_error(NULL));
		return 1;
	}
	if (narrow) {
		check_all_reduce(crun_world(), 1001, CRUN_F32, CRUN_SUM, 1);
		check_all_reduce(crun_world(), 300001, CRUN_I32, CRUN_AVG, 0);
		if (r == 0)
			printf("gpu_nccl --narrow: %d ranks: %d checks, %d failures\n", n,
			       gt_checks, gt_fails);
		crun_finalize();
		return gt_fails ? 1 : 0;
	}
	check_after_caller_stream(crun_world());
	for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++)
		for (int op = 0; op < CRUN_RED_OP__MAX; op++) {
			check_all_reduce(crun_world(), 1001, dt, op, 1);
			check_all_reduce(crun_world(), 333, dt, op, 0);
		}
	/* Around the IPC thresholds (one-shot <= 256 KiB < two-shot <= 8 MiB). */
	for (size_t i = 0; i < sizeof(ipc_sizes) / sizeof(ipc_sizes[0]); i++) {
		check_all_reduce(crun_world(), ipc_sizes[i], CRUN_F32, CRUN_SUM, 1);
		check_all_reduce(crun_world(), ipc_sizes[i], CRUN_BF16, CRUN_AVG, 1);
		check_all_reduce(crun_world(), ipc_sizes[i], CRUN_I32, CRUN_MAX, 1);
	}
	check_others(crun_world(), 1);
	check_others(crun_world(), 0);
	check_async(crun_world());
	check_subgroups();
	check_abort();
	/* The benchmark is collective: every rank must agree to run it. */
	int32_t any_fail = gt_fails;

	if (crun_all_reduce(crun_world(), &any_fail, &any_fail, 1, CRUN_I32, CRUN_MAX, NULL) < 0)
		any_fail = 1;
	if (do_bench && !any_fail)
		bench(crun_world());
	if (r == 0)
		printf("gpu_nccl: %d ranks: %d checks, %d failures\n", n, gt_checks, gt_fails);
	crun_finalize();
	return gt_fails ? 1 : 0;
}

int main(int argc, char **argv)
{
	int n = 1, port = 29731, do_bench = 1, narrow = 0, skips = 0, fails = 0;
	pid_t pids[8];

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--nranks") && i + 1 < argc)
			n = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--port") && i + 1 < argc)
			port = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--no-bench"))
			do_bench = 0;
		else if (!strcmp(argv[i], "--narrow"))
			narrow = 1;
		else {
			fprintf(stderr, "usage: gpu_nccl [--nranks 1-8] [--port P] [--no-bench] "
					"[--narrow]\n");
			return 2;
		}
	}
	if (n < 1 || n > 8)
		return 2;
	/* No CUDA call before the fork: the runtime does not survive one. */
	for (int r = 0; r < n; r++) {
		pids[r] = fork();
		if (pids[r] == 0) {
			char vis[16];
			int rc;

			if (narrow) { /* before any CUDA call: the runtime reads it once */
				snprintf(vis, sizeof(vis), "%d", r);
				setenv("CUDA_VISIBLE_DEVICES", vis, 1);
			}
			rc = run_rank(r, n, port, do_bench, narrow);

			fflush(NULL); /* _exit does not flush stdio */
			_exit(rc);
		}
	}
	for (int r = 0; r < n; r++)
		gt_reap(pids[r], &skips, &fails);
	if (skips == n)
		return GPU_SKIP;
	printf("gpu_nccl: %d of %d ranks failed\n", fails, n);
	return fails || skips ? 1 : 0;
}
