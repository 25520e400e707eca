/* dist_matmul.c: the distributed matmul example of the lecture notes
 * ("torchrun을 활용한 분산 행렬 곱셈 예제") written against crun's worker SDK.
 * Rank 0 builds A = arange(n*n).reshape(n, n) / n and B = ones(n, n); both
 * are broadcast; rank i multiplies its column block of A by its row block of
 * B (blocks chosen by the GLOBAL rank: by local rank, the second node would
 * redo the first node's blocks and nobody would do the last ones), and
 * all_reduce(SUM) adds the partial products up. Rank 0 checks the result
 * against a single-process product and prints it with the times.
 *
 *   crun --nproc-per-node 2 --nnodes 2 ... dist_matmul [n]     (default n = 512)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "crun/worker.h"
#include "kernels/kernels.h"

static double now_ms(void)
{
	return (double)clock_now_us() / 1000.0;
}

static void print_matrix(const float *c, size_t n)
{
	size_t show[6] = {0, 1, 2, n - 3, n - 2, n - 1};
	int k = n > 6 ? 6 : (int)n;

	printf("tensor([");
	for (int a = 0; a < k; a++) {
		size_t i = n > 6 ? show[a] : (size_t)a;

		printf("%s[", a ? ",\n        " : "");
		for (int b = 0; b < k; b++) {
			size_t j = n > 6 ? show[b] : (size_t)b;

			printf("%s%.4e", b ? ", " : "", (double)c[i * n + j]);
			if (n > 6 && b == 2)
				printf(", ...");
		}
		printf("]");
		if (n > 6 && a == 2)
			printf(",\n        ...");
	}
	printf("])\n");
}

int main(int argc, char **argv)
{
	uint64_t n64 = 512;
	int rank, world, r;
	size_t n, k0, k1;
	float *a, *b, *c;
	double t0, t_bcast, t_mm, t_ar;

	if (argc > 1 && parse_uint_range(argv[1], 1, 16384, &n64) < 0) {
		fprintf(stderr, "usage: dist_matmul [n]\n");
		return 2;
	}
	n = (size_t)n64;
	r = crun_init();
	if (r < 0) {
		fprintf(stderr, "dist_matmul: crun_init: %s\n", crun_strerror(r));
		return 1;
	}
	rank = crun_rank();
	world = crun_world_size();
	a = malloc(n * n * sizeof(float));
	b = malloc(n * n * sizeof(float));
	c = malloc(n * n * sizeof(float));
	if (!a || !b || !c)
		return 1;
	if (rank == 0) {
		/* Values differ per column, so a wrong split shows. */
		for (size_t i = 0; i < n * n; i++) {
			a[i] = (float)i / (float)n;
			b[i] = 1.0f;
		}
	}
	t0 = now_ms();
	r = crun_broadcast(crun_world(), a, n * n, CRUN_F32, 0, NULL);
	if (r == 0)
		r = crun_broadcast(crun_world(), b, n * n, CRUN_F32, 0, NULL);
	t_bcast = now_ms();
	if (r < 0)
		goto fail;
	/* Column block [k0, k1) of A times row block [k0, k1) of B; the
	 * remainder of n / world goes to the first ranks. */
	k0 = (size_t)rank * (n / (size_t)world) + MIN((size_t)rank, n % (size_t)world);
	k1 = k0 + n / (size_t)world + ((size_t)rank < n % (size_t)world);
	r = kernels_gemm_f32(n, n, k1 - k0, a + k0, n, b + k0 * n, n, c, n, 0);
	t_mm = now_ms();
	if (r == 0)
		r = crun_all_reduce(crun_world(), c, c, n * n, CRUN_F32, CRUN_SUM, NULL);
	t_ar = now_ms();
	if (r < 0)
		goto fail;
	if (rank == 0) {
		float *ref = malloc(n * n * sizeof(float));
		double worst = 0;

		if (!ref)
			return 1;
		(void)kernels_gemm_f32(n, n, n, a, n, b, n, ref, n, 0);
		for (size_t i = 0; i < n * n; i++) {
			double e = fabs((double)c[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));

			worst = e > worst ? e : worst;
		}
		print_matrix(c, n);
		printf("dist_matmul: n=%zu world=%d: broadcast %.1f ms, local matmul %.1f ms, "
		       "all_reduce %.1f ms, total %.1f ms\n",
		       n, world, t_bcast - t0, t_mm - t_bcast, t_ar - t_mm, t_ar - t0);
		printf("dist_matmul: max relative error vs single-process product %.3g: %s\n",
		       worst, worst < 1e-4 ? "OK" : "MISMATCH");
		free(ref);
		if (worst >= 1e-4)
			r = CRUN_EIO;
	}
	free(a);
	free(b);
	free(c);
	crun_finalize();
	return r < 0 ? 1 : 0;
fail:
	fprintf(stderr, "dist_matmul: rank %d: %s (%s)\n", rank, crun_strerror(r),
		crun_pg_last_error(crun_world()));
	return 1;
}
