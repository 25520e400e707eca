/* gpu_kernels.c: the CUDA kernels behind kernels.h against the CPU kernels,
 * then a short benchmark (GEMM GFLOP/s, reduce GB/s). Built and run by
 * tests/gpu/run.sh only where a device exists; --probe exits 1 without one.
 * Inputs are small integers, so every result is exact and compared bitwise.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "crun/worker.h"
#include "kernels/kernels.h"

static int fails, checks;

#define CK(cond, ...)                                                          \
	do {                                                                   \
		checks++;                                                      \
		if (!(cond)) {                                                 \
			fails++;                                               \
			fprintf(stderr, "gpu_kernels: FAIL: " __VA_ARGS__);    \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *dev_copy(const void *host, size_t len)
{
	void *d = NULL;

	if (cudaMalloc(&d, len ? len : 1) != cudaSuccess)
		exit(3);
	if (len && cudaMemcpy(d, host, len, cudaMemcpyHostToDevice) != cudaSuccess)
		exit(3);
	return d;
}

static void put(void *buf, size_t i, int dtype, int v)
{
	switch (dtype) {
	case CRUN_F32: ((float *)buf)[i] = (float)v; break;
	case CRUN_F64: ((double *)buf)[i] = v; break;
	case CRUN_F16: ((uint16_t *)buf)[i] = kernels_float_to_f16((float)v); break;
	case CRUN_BF16: ((uint16_t *)buf)[i] = kernels_float_to_bf16((float)v); break;
	case CRUN_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case CRUN_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case CRUN_I32: ((int32_t *)buf)[i] = v; break;
	case CRUN_I64: ((int64_t *)buf)[i] = v; break;
	}
}

static void test_gemm(void)
{
	size_t m = 257, n = 129, k = 300;
	float *a = malloc(m * k * 4), *b = malloc(k * n * 4), *c = malloc(m * n * 4);
	float *want = malloc(m * n * 4);
	float *da, *db, *dc;

	for (size_t i = 0; i < m * k; i++)
		a[i] = (float)((int)(i * 13 % 7) - 3);
	for (size_t i = 0; i < k * n; i++)
		b[i] = (float)((int)(i * 5 % 9) - 4);
	kernels_gemm_f32(m, n, k, a, k, b, n, want, n, 0);
	da = dev_copy(a, m * k * 4);
	db = dev_copy(b, k * n * 4);
	dc = dev_copy(want, m * n * 4);
	CK(kernels_cuda_gemm_f32(m, n, k, da, k, db, n, dc, n, 0, NULL) == 0, "gemm launch");
	CK(kernels_cuda_sync(NULL) == 0, "gemm sync");
	cudaMemcpy(c, dc, m * n * 4, cudaMemcpyDeviceToHost);
	CK(!memcmp(c, want, m * n * 4), "gemm result differs from the CPU GEMM");
	cudaFree(da);
	cudaFree(db);
	cudaFree(dc);
	free(a);
	free(b);
	free(c);
	free(want);
}

static void test_reduce(int dtype, int op)
{
	size_t n = 100003, esz = crun_dtype_size(dtype);
	uint8_t *x = malloc(n * esz), *y = malloc(n * esz), *got = malloc(n * esz);
	void *dx, *dy;

	for (size_t i = 0; i < n; i++) {
		put(x, i, dtype, op == CRUN_PROD ? 1 + (int)(i % 3) : (int)(i % 11) - 5);
		put(y, i, dtype, op == CRUN_PROD ? 1 + (int)(i % 2) : (int)(i * 7 % 13) - 6);
	}
	dx = dev_copy(x, n * esz);
	dy = dev_copy(y, n * esz);
	CK(kernels_cuda_reduce(dx, dy, n, dtype, op, NULL) == 0, "reduce launch %d/%d", dtype, op);
	cudaMemcpy(got, dx, n * esz, cudaMemcpyDeviceToHost);
	kernels_reduce(x, y, n, dtype, op);
	CK(!memcmp(got, x, n * esz), "reduce dtype %d op %d differs from the CPU kernel", dtype, op);
	cudaFree(dx);
	cudaFree(dy);
	free(x);
	free(y);
	free(got);
}

static void test_all_reduce(void)
{
	enum { NB = 4 };
	size_t n = 1 << 20;
	float *h = malloc(n * 4), *want = calloc(n, 4), *got = malloc(n * 4), *dst;
	const void *bufs[NB];

	for (int b = 0; b < NB; b++) {
		for (size_t i = 0; i < n; i++)
			h[i] = (float)((int)((i + (size_t)b) % 9) - 4);
		kernels_reduce(want, h, n, CRUN_F32, CRUN_SUM);
		bufs[b] = dev_copy(h, n * 4);
	}
	dst = dev_copy(want, n * 4);
	CK(kernels_cuda_all_reduce(dst, bufs, NB, n, CRUN_F32, CRUN_SUM, NULL) == 0, "all_reduce");
	cudaMemcpy(got, dst, n * 4, cudaMemcpyDeviceToHost);
	CK(!memcmp(got, want, n * 4), "all_reduce over %d buffers differs", NB);
	for (int b = 0; b < NB; b++)
		cudaFree((void *)bufs[b]);
	cudaFree(dst);
	free(h);
	free(want);
	free(got);
}

static void bench(void)
{
	size_t n = 4096, bytes = n * n * 4;
	float *h = calloc(n * n, 4), *da, *db, *dc;
	double t0, t;
	int reps = 5;

	da = dev_copy(h, bytes);
	db = dev_copy(h, bytes);
	dc = dev_copy(h, bytes);
	kernels_cuda_gemm_f32(n, n, n, da, n, db, n, dc, n, 0, NULL);
	kernels_cuda_sync(NULL);
	t0 = now_s();
	for (int i = 0; i < reps; i++)
		kernels_cuda_gemm_f32(n, n, n, da, n, db, n, dc, n, 0, NULL);
	kernels_cuda_sync(NULL);
	t = (now_s() - t0) / reps;
	printf("gpu bench: gemm f32 %zux%zux%zu: %.2f ms, %.1f GFLOP/s\n", n, n, n, t * 1e3,
	       2.0 * n * n * n / t / 1e9);
	t0 = now_s();
	for (int i = 0; i < reps; i++)
		kernels_cuda_reduce(da, db, n * n, CRUN_F32, CRUN_SUM, NULL);
	t = (now_s() - t0) / reps;
	printf("gpu bench: reduce f32 sum %zu MiB: %.3f ms, %.1f GB/s (3 x bytes moved)\n",
	       bytes >> 20, t * 1e3, 3.0 * bytes / t / 1e9);
	cudaFree(da);
	cudaFree(db);
	cudaFree(dc);
	free(h);
}

int main(int argc, char **argv)
{
	if (!kernels_available()) {
		if (argc < 2)
			puts("gpu suite skipped: no device");
		return argc > 1 ? 1 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--probe"))
		return 0;
	test_gemm();
	for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++)
		for (int op = 0; op < CRUN_RED_OP__MAX; op++)
			test_reduce(dt, op);
	test_all_reduce();
	printf("gpu_kernels: %d checks, %d failures\n", checks, fails);
	if (!fails)
		bench();
	return fails ? 1 : 0;
}
