/* gpu_kernels.c: the kernels of libcrun-cuda.so.0, reached the way the SDK
 * reaches them (kernels_cuda_load), against CPU references: both GEMMs for
 * many shapes (odd ones, k = 0, unaligned pointers and leading dimensions,
 * aligned rows over k % 4 != 0 and n % 8 != 0, accumulate), every dtype x
 * op of reduce / reduce_multi / div (integer AVG over up to 1000 ranks),
 * and the IPC all_reduce kernel with N "ranks" as N concurrent streams on
 * one device.
 * Integer-valued inputs make every result exact: compared bit for bit.
 * Then the benchmarks beside cuBLAS in the same run. Exit 77 without a GPU.
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "crun/worker.h"
#include "gpu/gpu_test.h"
#include "kernels/kernels.h"

static const struct kernels_cuda_ops *K;

static void *up(const void *host, size_t len)
{
	void *d = NULL;

	if (K->alloc(&d, len) < 0 || K->copy(d, host, len) < 0) {
		fprintf(stderr, "device alloc/copy of %zu bytes failed: %s\n", len,
			K->last_error());
		exit(1);
	}
	return d;
}

/* ---- GEMM ------------------------------------------------------------------------ */

struct shape {
	size_t m, n, k;
};

static const struct shape shapes[] = {
	{1, 1, 1},	 {1, 7, 3},	{7, 1, 5},	 {5, 5, 0},	   {3, 4, 8},
	{13, 17, 19},	 {31, 33, 7},	{64, 64, 64},	 {127, 129, 131},  {128, 128, 8},
	{129, 127, 9},	 {128, 256, 32}, {200, 300, 40}, {257, 129, 300},  {513, 257, 1000},
	{1000, 24, 999}, {24, 1000, 33}, {1024, 1024, 1024},
};

/* Rows rounded up to a multiple of 8 elements: aligned leading dimensions
 * (the vectorised and cp.async paths) over a k or n that is not a multiple
 * of the vector width, so the last vector of a row is partial. */
#define PAD_ROUND8 ((size_t)-1)
static size_t padded(size_t len, size_t pad)
{
	return pad == PAD_ROUND8 ? (len + 7) / 8 * 8 : len + pad;
}

/* f32 or (dtype = F16/BF16) tensor-core GEMM of one shape against the CPU.
 * pad: extra elements per row (unaligned ld), or PAD_ROUND8; off: pointer
 * offset (unaligned base). */
static void gemm_case(int dtype, struct shape s, size_t pad, size_t off, int accumulate)
{
	size_t lda = padded(s.k, pad), ldb = padded(s.n, pad), ldc = padded(s.n, pad);
	size_t esz = dtype == CRUN_F32 ? 4 : 2;
	size_t na = s.m * lda + off, nb = (s.k ? s.k : 1) * ldb + off, nc = s.m * ldc + off;
	float *a32 = calloc(na, 4), *b32 = calloc(nb, 4), *want = calloc(nc, 4);
	float *got = calloc(nc, 4);
	uint8_t *a = calloc(na, esz), *b = calloc(nb, esz);
	uint8_t *da, *db;
	float *dc;
	int r;

	for (size_t i = 0; i < na; i++) {
		a32[i] = (float)gt_val(i, 1);
		gt_put(a, i, dtype, a32[i]);
	}
	for (size_t i = 0; i < nb; i++) {
		b32[i] = (float)gt_val(i, 2);
		gt_put(b, i, dtype, b32[i]);
	}
	for (size_t i = 0; i < nc; i++)
		want[i] = (float)gt_val(i, 3); /* what accumulate adds to */
	da = up(a, na * esz);
	db = up(b, nb * esz);
	dc = up(want, nc * 4);
	kernels_gemm_f32(s.m, s.n, s.k, a32 + off, lda, b32 + off, ldb, want + off, ldc,
			 accumulate);
	if (dtype == CRUN_F32)
		r = K->gemm_f32(s.m, s.n, s.k, (float *)da + off, lda, (float *)db + off, ldb,
				dc + off, ldc, accumulate, NULL);
	else
		r = K->gemm_tc(s.m, s.n, s.k, dtype, da + off * esz, lda, db + off * esz, ldb,
			       dc + off, ldc, accumulate, NULL);
	CK(r == 0 && K->sync(NULL) == 0, "gemm dtype %d %zux%zux%zu: %d %s", dtype, s.m, s.n, s.k,
	   r, K->last_error());
	K->copy(got, dc, nc * 4);
	CK(!memcmp(got, want, nc * 4), "gemm dtype %d %zux%zux%zu pad %zu off %zu acc %d differs",
	   dtype, s.m, s.n, s.k, pad, off, accumulate);
	K->free(da);
	K->free(db);
	K->free(dc);
	free(a32), free(b32), free(want), free(got), free(a), free(b);
}

static void test_gemm(void)
{
	static const int dtypes[] = {CRUN_F32, CRUN_F16, CRUN_BF16};

	for (size_t d = 0; d < 3; d++)
		for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
			gemm_case(dtypes[d], shapes[i], 0, 0, 0);
			gemm_case(dtypes[d], shapes[i], 3, 1, 1); /* the scalar-load path */
			if (shapes[i].m * shapes[i].n < 100000)
				gemm_case(dtypes[d], shapes[i], 8, 0, 1);
		}
	/* k % 4 != 0 and n % 8 != 0 with aligned rows: partial vectors. */
	static const struct shape partial[] = {
	    {33, 37, 13}, {64, 12, 6}, {100, 65, 70}, {130, 250, 31}, {17, 9, 5}};
	for (size_t d = 0; d < 3; d++)
		for (size_t i = 0; i < sizeof(partial) / sizeof(partial[0]); i++) {
			gemm_case(dtypes[d], partial[i], PAD_ROUND8, 0, 0);
			gemm_case(dtypes[d], partial[i], PAD_ROUND8, 0, 1);
		}
	CK(K->gemm_f32(4, 4, 4, NULL, 4, NULL, 4, NULL, 3, 0, NULL) == CRUN_EINVAL, "ldc < n");
	CK(K->gemm_tc(4, 4, 4, CRUN_F32, NULL, 4, NULL, 4, NULL, 4, 0, NULL) == CRUN_EINVAL,
	   "tensor-core gemm of f32");
}

/* ---- reductions ------------------------------------------------------------------------ */

static double input(int dtype, int op, size_t i, int which)
{
	if (op == CRUN_PROD)
		return 1 + (int)((i + (size_t)which) % 2); /* 1 or 2: no overflow in f16 */
	return gt_val(i, (unsigned)which + 7) * (dtype == CRUN_U8 ? -1 : 1) + (dtype == CRUN_U8) * 3;
}

static void test_reduce(int dtype, int op)
{
	size_t n = 100003, esz = crun_dtype_size(dtype);
	uint8_t *x = malloc(n * esz), *y = malloc(n * esz), *got = malloc(n * esz);
	void *dx, *dy;

	for (size_t i = 0; i < n; i++) {
		gt_put(x, i, dtype, input(dtype, op, i, 0));
		gt_put(y, i, dtype, input(dtype, op, i, 1));
	}
	dx = up(x, n * esz);
	dy = up(y, n * esz);
	CK(K->reduce(dx, dy, n, dtype, op, NULL) == 0 && K->sync(NULL) == 0, "reduce %d/%d",
	   dtype, op);
	K->copy(got, dx, n * esz);
	kernels_reduce(x, y, n, dtype, op);
	CK(!memcmp(got, x, n * esz), "reduce dtype %d op %d differs from the CPU kernel", dtype,
	   op);
	K->free(dx);
	K->free(dy);
	free(x), free(y), free(got);
}

/* reduce_multi over nb buffers (AVG divides): the CPU folds pairwise. */
static void test_reduce_multi(int dtype, int op, int nb)
{
	size_t n = 4099, esz = crun_dtype_size(dtype);
	uint8_t *want = malloc(n * esz), *h = malloc(n * esz), *got = malloc(n * esz);
	const void *bufs[KERNELS_CUDA_MAX_BUFS];
	void *dst;

	for (int b = 0; b < nb; b++) {
		for (size_t i = 0; i < n; i++)
			gt_put(b ? h : want, i, dtype, input(dtype, op, i, b));
		if (b)
			kernels_reduce(want, h, n, dtype, op);
		bufs[b] = up(b ? h : want, n * esz);
	}
	if (op == CRUN_AVG)
		kernels_div(want, n, dtype, nb);
	dst = up(want, n * esz); /* overwritten */
	CK(K->reduce_multi(dst, bufs, nb, n, dtype, op, NULL) == 0 && K->sync(NULL) == 0,
	   "reduce_multi %d/%d/%d", dtype, op, nb);
	K->copy(got, dst, n * esz);
	CK(!memcmp(got, want, n * esz), "reduce_multi dtype %d op %d x%d differs", dtype, op, nb);
	for (int b = 0; b < nb; b++)
		K->free((void *)bufs[b]);
	K->free(dst);
	free(want), free(h), free(got);
}

/* The division of an integer AVG by group sizes an 8-bit type cannot hold
 * (issue 27: div_kernel narrowed the divisor to the element type). */
static void test_div_by_group_size(int dtype)
{
	static const int64_t divisors[] = {1, 3, 127, 128, 200, 255, 256, 300, 1000};
	size_t esz = crun_dtype_size(dtype), n = 256;
	uint8_t *want = malloc(n * esz), *got = malloc(n * esz);

	for (size_t d = 0; d < sizeof(divisors) / sizeof(divisors[0]); d++) {
		void *dx;

		for (size_t i = 0; i < n; i++)
			gt_put(want, i, dtype, (double)((int)i - (dtype == CRUN_U8 ? 0 : 128)));
		dx = up(want, n * esz);
		kernels_div(want, n, dtype, divisors[d]);
		CK(K->div(dx, n, dtype, divisors[d], NULL) == 0 && K->sync(NULL) == 0,
		   "div dtype %d by %lld", dtype, (long long)divisors[d]);
		K->copy(got, dx, n * esz);
		CK(!memcmp(got, want, n * esz), "div dtype %d by %lld differs from the CPU", dtype,
		   (long long)divisors[d]);
		K->free(dx);
	}
	free(want), free(got);
}

/* ---- the IPC all_reduce kernel: N ranks as N streams of one device ---------------- */

static void test_ipc(int nranks, size_t count, int dtype, int op, int two_shot, uint32_t *epoch)
{
	size_t esz = crun_dtype_size(dtype), bytes = count * esz;
	struct kernels_ipc_args a[KERNELS_CUDA_MAX_BUFS];
	cudaStream_t st[KERNELS_CUDA_MAX_BUFS];
	void *out[KERNELS_CUDA_MAX_BUFS];
	uint8_t *want = malloc(bytes), *h = malloc(bytes), *got = malloc(bytes);
	volatile uint32_t *abort_host;
	uint32_t *abort_dev;
	double t0;
	int r = 0;

	cudaHostAlloc((void **)&abort_host, 4, cudaHostAllocMapped);
	*abort_host = 0;
	cudaHostGetDevicePointer((void **)&abort_dev, (void *)abort_host, 0);
	memset(a, 0, sizeof(a));
	for (int p = 0; p < nranks; p++) {
		for (size_t i = 0; i < count; i++)
			gt_put(p ? h : want, i, dtype, input(dtype, op, i, p));
		if (p)
			kernels_reduce(want, h, count, dtype, op);
		a[0].data[p] = up(p ? h : want, bytes);
		cudaMalloc((void **)&a[0].signal[p], KERNELS_IPC_SIGNAL_BYTES);
		cudaMemset(a[0].signal[p], 0, KERNELS_IPC_SIGNAL_BYTES);
		out[p] = up(h, bytes);
		cudaStreamCreateWithFlags(&st[p], cudaStreamNonBlocking);
	}
	if (op == CRUN_AVG)
		kernels_div(want, count, dtype, nranks);
	cudaDeviceSynchronize();
	++*epoch;
	for (int p = 0; p < nranks; p++) {
		a[p] = a[0];
		a[p].rank = p;
		a[p].nranks = nranks;
		a[p].epoch = *epoch;
		a[p].two_shot = two_shot;
		a[p].abort_flag = abort_dev;
		r |= K->ipc_all_reduce(&a[p], out[p], count, dtype, op, st[p]);
	}
	/* The ranks wait for each other on the device; if they could not all
	 * be resident, the flag releases them and the check fails. */
	t0 = gt_now_s();
	for (int p = 0; p < nranks; p++)
		while (cudaStreamQuery(st[p]) == cudaErrorNotReady && !*abort_host)
			if (gt_now_s() - t0 > 20)
				*abort_host = 1;
	CK(r == 0 && cudaDeviceSynchronize() == cudaSuccess && !*abort_host,
	   "ipc all_reduce %d ranks dtype %d op %d two_shot %d did not finish", nranks, dtype, op,
	   two_shot);
	for (int p = 0; p < nranks; p++) {
		K->copy(got, out[p], bytes);
		CK(!memcmp(got, want, bytes),
		   "ipc all_reduce rank %d/%d count %zu dtype %d op %d two_shot %d differs", p, nranks,
		   count, dtype, op, two_shot);
		K->free(a[0].data[p]);
		cudaFree(a[0].signal[p]);
		K->free(out[p]);
		cudaStreamDestroy(st[p]);
	}
	cudaFreeHost((void *)abort_host);
	free(want), free(h), free(got);
}

static void test_ipc_all(void)
{
	uint32_t epoch = 0;

	for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++)
		for (int op = 0; op < CRUN_RED_OP__MAX; op++) {
			test_ipc(4, 1001, dt, op, 0, &epoch);
			test_ipc(3, 70001, dt, op, 1, &epoch);
		}
	for (int n = 2; n <= KERNELS_CUDA_MAX_BUFS; n++) {
		test_ipc(n, 1, CRUN_F32, CRUN_SUM, 0, &epoch);
		test_ipc(n, 5, CRUN_F32, CRUN_SUM, 1, &epoch); /* fewer elements than ranks */
		test_ipc(n, (1 << 20) + 3, CRUN_F32, CRUN_SUM, 1, &epoch);
	}
}

/* The IPC all_reduce between two processes on GPU 0, as two ranks of one
 * host share a GPU: each maps the other's buffers through cudaIpc handles
 * (sent over a socketpair) and runs the kernel on its own stream. One
 * process per rank, so it runs before this process touches CUDA (a forked
 * child cannot use the parent's runtime). Returns the failures. */
struct ipc_card {
	cudaIpcMemHandle_t data, signal;
};

static int ipc_proc_rank(int sock, int me, size_t count, int two_shot)
{
	size_t bytes = count * 4;
	struct kernels_ipc_args a;
	struct ipc_card mine, peer;
	float *h = malloc(bytes), want;
	volatile uint32_t *abort_host;
	cudaStream_t st;
	void *out;
	char err[512];
	double t0;
	int r;

	if (kernels_cuda_load(&K, err, sizeof(err)) < 0)
		return gt_skip(err);
	memset(&a, 0, sizeof(a));
	for (size_t i = 0; i < count; i++)
		h[i] = (float)(i % 7 + (size_t)me);
	a.data[me] = up(h, bytes);
	cudaMalloc((void **)&a.signal[me], KERNELS_IPC_SIGNAL_BYTES);
	cudaMemset(a.signal[me], 0, KERNELS_IPC_SIGNAL_BYTES);
	out = up(h, bytes);
	cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
	cudaHostAlloc((void **)&abort_host, 4, cudaHostAllocMapped);
	*abort_host = 0;
	cudaHostGetDevicePointer((void **)&a.abort_flag, (void *)abort_host, 0);
	cudaIpcGetMemHandle(&mine.data, a.data[me]);
	cudaIpcGetMemHandle(&mine.signal, a.signal[me]);
	CK(cudaDeviceSynchronize() == cudaSuccess, "ipc procs: set-up: %s", K->last_error());
	CK(write(sock, &mine, sizeof(mine)) == (ssize_t)sizeof(mine) &&
	       read(sock, &peer, sizeof(peer)) == (ssize_t)sizeof(peer),
	   "ipc procs: handle exchange");
	CK(cudaIpcOpenMemHandle(&a.data[!me], peer.data, cudaIpcMemLazyEnablePeerAccess) ==
		   cudaSuccess &&
	       cudaIpcOpenMemHandle((void **)&a.signal[!me], peer.signal,
				    cudaIpcMemLazyEnablePeerAccess) == cudaSuccess,
	   "ipc procs: cudaIpcOpenMemHandle");
	if (gt_fails)
		return 1;
	a.rank = me;
	a.nranks = 2;
	a.epoch = 1;
	a.two_shot = two_shot;
	r = K->ipc_all_reduce(&a, out, count, CRUN_F32, CRUN_SUM, st);
	t0 = gt_now_s();
	while (r == 0 && cudaStreamQuery(st) == cudaErrorNotReady && !*abort_host)
		if (gt_now_s() - t0 > 20)
			*abort_host = 1; /* the peer never came: release the kernel */
	CK(r == 0 && cudaStreamSynchronize(st) == cudaSuccess && !*abort_host,
	   "ipc procs rank %d: did not finish (%s)", me, K->last_error());
	cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost);
	for (size_t i = 0; i < count && !gt_fails; i++) {
		want = (float)(2 * (i % 7) + 1);
		CK(h[i] == want, "ipc procs rank %d: [%zu] = %g, want %g", me, i, (double)h[i],
		   (double)want);
	}
	/* Neither unmaps or frees while the other may still read. */
	CK(write(sock, "x", 1) == 1 && read(sock, err, 1) == 1, "ipc procs: closing handshake");
	return gt_fails ? 1 : 0;
}

static int test_ipc_processes(void)
{
	static const struct {
		size_t count;
		int two_shot;
	} cases[] = {{1001, 0}, {300001, 1}};
	int fails = 0, skips = 0;

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int sv[2];
		pid_t pid[2];

		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			return 1;
		for (int me = 0; me < 2; me++) {
			pid[me] = fork();
			if (pid[me] == 0) {
				int rc =
				    ipc_proc_rank(sv[me], me, cases[c].count, cases[c].two_shot);

				fflush(NULL);
				_exit(rc);
			}
		}
		close(sv[0]);
		close(sv[1]);
		for (int me = 0; me < 2; me++)
			gt_reap(pid[me], &skips, &fails);
	}
	printf("gpu_kernels --ipc-procs: %d failed, %d skipped processes\n", fails, skips);
	return fails ? 1 : skips ? GPU_SKIP : 0;
}

/* ---- benchmarks -------------------------------------------------------------------------- */

/* Seconds per call of fn, timed with events after one warm-up call. */
static double time_it(void (*fn)(void *), void *arg, int reps)
{
	cudaEvent_t e0, e1;
	float ms = 0;

	fn(arg);
	cudaEventCreate(&e0);
	cudaEventCreate(&e1);
	cudaEventRecord(e0, NULL);
	for (int i = 0; i < reps; i++)
		fn(arg);
	cudaEventRecord(e1, NULL);
	cudaEventSynchronize(e1);
	cudaEventElapsedTime(&ms, e0, e1);
	cudaEventDestroy(e0);
	cudaEventDestroy(e1);
	return ms / 1e3 / reps;
}

struct gemm_run {
	cublasHandle_t h;
	int n, dtype;
	void *a, *b;
	float *c;
};

static void run_crun(void *arg)
{
	struct gemm_run *g = arg;

	if (g->dtype == CRUN_F32)
		K->gemm_f32(g->n, g->n, g->n, g->a, g->n, g->b, g->n, g->c, g->n, 0, NULL);
	else
		K->gemm_tc(g->n, g->n, g->n, g->dtype, g->a, g->n, g->b, g->n, g->c, g->n, 0, NULL);
}

/* Row-major C = A B is column-major C^T = B^T A^T: swap the operands. */
static void run_cublas(void *arg)
{
	struct gemm_run *g = arg;
	const float one = 1, zero = 0;
	cudaDataType_t t = g->dtype == CRUN_F32 ? CUDA_R_32F
			   : g->dtype == CRUN_F16 ? CUDA_R_16F
						  : CUDA_R_16BF;

	cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->b, t, g->n, g->a,
		     t, g->n, &zero, g->c, CUDA_R_32F, g->n, CUBLAS_COMPUTE_32F,
		     CUBLAS_GEMM_DEFAULT);
}

static void bench_gemm(cublasHandle_t h, int dtype, int n)
{
	size_t esz = dtype == CRUN_F32 ? 4 : 2, cnt = (size_t)n * n;
	struct gemm_run g = {h, n, dtype, NULL, NULL, NULL};
	uint8_t *host = malloc(cnt * esz);
	float *c1 = malloc(cnt * 4), *c2 = malloc(cnt * 4);
	double flop = 2.0 * n * n * n, t_crun, t_blas, worst = 0;
	int reps = flop > 2e11 ? 5 : 20;

	for (size_t i = 0; i < cnt; i++)
		gt_put(host, i, dtype, gt_val(i, 11) / 4.0);
	g.a = up(host, cnt * esz);
	g.b = up(host, cnt * esz);
	K->alloc((void **)&g.c, cnt * 4);
	t_crun = time_it(run_crun, &g, reps);
	K->copy(c1, g.c, cnt * 4);
	t_blas = time_it(run_cublas, &g, reps);
	K->copy(c2, g.c, cnt * 4);
	for (size_t i = 0; i < cnt; i += 97) /* large shapes: cuBLAS is the reference */
		worst = fmax(worst, fabs(c1[i] - c2[i]) / fmax(1.0, fabs(c2[i])));
	CK(worst < 1e-3, "gemm dtype %d n=%d differs from cuBLAS by %.3g", dtype, n, worst);
	gt_row("| gemm %s | %d^3 | %.1f TFLOP/s | %.1f TFLOP/s | %.0f %% |",
	       dtype == CRUN_F32 ? "f32 (SGEMM)" : dtype == CRUN_F16 ? "f16 (mma.sync)" : "bf16 (mma.sync)",
	       n, flop / t_crun / 1e12, flop / t_blas / 1e12, 100.0 * t_blas / t_crun);
	K->free(g.a);
	K->free(g.b);
	K->free(g.c);
	free(host), free(c1), free(c2);
}

struct red_run {
	void *x, *y;
	size_t n;
};

static void run_reduce(void *arg)
{
	struct red_run *r = arg;

	K->reduce(r->x, r->y, r->n, CRUN_F32, CRUN_SUM, NULL);
}

static void bench(void)
{
	static const int sizes[] = {1024, 2048, 4096, 8192};
	struct red_run rr = {NULL, NULL, 64u << 20};
	cublasHandle_t h;
	double t;

	if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) {
		CK(0, "cublasCreate failed");
		return;
	}
	gt_row("| kernel | shape | crun | cuBLAS | crun / cuBLAS |");
	gt_row("|---|---|---|---|---|");
	for (int d = 0; d < 3; d++)
		for (size_t i = 0; i < 4; i++)
			bench_gemm(h, d == 0 ? CRUN_F32 : d == 1 ? CRUN_BF16 : CRUN_F16, sizes[i]);
	cublasDestroy(h);
	K->alloc(&rr.x, rr.n * 4);
	K->alloc(&rr.y, rr.n * 4);
	t = time_it(run_reduce, &rr, 20);
	gt_row("| reduce f32 sum | 256 MiB | %.0f GB/s (3 x bytes moved) | | |",
	       3.0 * rr.n * 4 / t / 1e9);
	K->free(rr.x);
	K->free(rr.y);
}

int main(int argc, char **argv)
{
	char err[512];
	double t0 = gt_now_s();

	if (argc > 1 && !strcmp(argv[1], "--ipc-procs"))
		return test_ipc_processes();
	if (kernels_cuda_load(&K, err, sizeof(err)) < 0)
		return gt_skip(err);
	test_gemm();
	printf("gpu_kernels: gemm done (%.1f s)\n", gt_now_s() - t0);
	for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++)
		for (int op = 0; op < CRUN_RED_OP__MAX; op++) {
			test_reduce(dt, op);
			test_reduce_multi(dt, op, 3);
		}
	for (int nb = 1; nb <= KERNELS_CUDA_MAX_BUFS; nb++)
		test_reduce_multi(CRUN_F32, CRUN_AVG, nb);
	for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++)
		test_div_by_group_size(dt);
	printf("gpu_kernels: reductions done (%.1f s)\n", gt_now_s() - t0);
	test_ipc_all();
	printf("gpu_kernels: %d checks, %d failures (%.1f s)\n", gt_checks, gt_fails,
	       gt_now_s() - t0);
	if (argc > 1 && !strcmp(argv[1], "--no-bench"))
		return gt_fails ? 1 : 0;
	bench();
	printf("gpu_kernels: %d checks, %d failures with the benchmarks (%.1f s)\n", gt_checks,
	       gt_fails, gt_now_s() - t0);
	return gt_fails ? 1 : 0;
}
