/* dist_matmul.c: the distributed matmul example of the lecture notes
 * ("torchrun을 활용한 분산 행렬 곱셈 예제") written against crun's worker SDK.
 * Rank 0 builds A = arange(n*n).reshape(n, n) / n and B = ones(n, n); both
 * are broadcast; rank i multiplies its column block of A by its row block of
 * B (blocks chosen by the GLOBAL rank: by local rank, the second node would
 * redo the first node's blocks and nobody would do the last ones), and
 * all_reduce(SUM) adds the partial products up. Rank 0 checks the result
 * against a single-process product and prints it with the times.
 *
 *   crun --nproc-per-node 2 --nnodes 2 ... dist_matmul [--backend cpu|nccl|auto]
 *        [n]                                                   (default n = 512)
 *
 * --backend picks the world group's backend (CRUN_PG_BACKEND otherwise); the
 * matrices stay in host memory (nccl stages them). It uses only the installed
 * headers (pkg-config --cflags --libs crun), so the local product is a plain
 * loop here; crun's GPU GEMMs are exercised by tests/gpu.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <crun/crun.h>
#include <crun/worker.h>

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* c = a[:, k0:k1] * b[k0:k1, :] for n x n row-major matrices; i-k-j order so
 * the inner loop runs along rows of b and c. */
static void matmul_block(size_t n, size_t k0, size_t k1, const float *a, const float *b, float *c)
{
	memset(c, 0, n * n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		for (size_t k = k0; k < k1; k++) {
			float aik = a[i * n + k];
			const float *brow = b + k * n;
			float *crow = c + i * n;

			for (size_t j = 0; j < n; j++)
				crow[j] += aik * brow[j];
		}
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

struct opts {
	size_t n;
	const char *backend; /* NULL: CRUN_PG_BACKEND or auto */
};

static int usage(const char *why)
{
	fprintf(stderr, "dist_matmul: %s\nusage: dist_matmul [--backend cpu|nccl|auto] [n]\n", why);
	return 2;
}

static int parse(int argc, char **argv, struct opts *o)
{
	o->n = 512;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--backend")) {
			if (!v || (strcmp(v, "cpu") && strcmp(v, "nccl") && strcmp(v, "auto")))
				return usage("--backend: want cpu, nccl or auto");
			o->backend = v;
			i++;
		} else {
			char *end;
			unsigned long long n = strtoull(argv[i], &end, 10);

			if (argv[i][0] < '0' || argv[i][0] > '9' || *end || n < 1 || n > 16384)
				return usage("n: want 1..16384");
			o->n = (size_t)n;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct opts opt = {0};
	int rank, world, r;
	size_t n, k0, k1, rem;
	float *a, *b, *c;
	double t0, t_bcast, t_mm, t_ar;

	r = parse(argc, argv, &opt);
	if (r)
		return r;
	n = opt.n;
	if (opt.backend)
		setenv("CRUN_PG_BACKEND", opt.backend, 1);
	r = crun_init();
	if (r < 0) {
		fprintf(stderr, "dist_matmul: crun_init: %s (%s)\n", crun_strerror(r),
			crun_pg_last_error(NULL));
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
	rem = n % (size_t)world;
	k0 = (size_t)rank * (n / (size_t)world) + ((size_t)rank < rem ? (size_t)rank : rem);
	k1 = k0 + n / (size_t)world + ((size_t)rank < rem);
	matmul_block(n, k0, k1, a, b, c);
	t_mm = now_ms();
	r = crun_all_reduce(crun_world(), c, c, n * n, CRUN_F32, CRUN_SUM, NULL);
	t_ar = now_ms();
	if (r < 0)
		goto fail;
	if (rank == 0) {
		float *ref = malloc(n * n * sizeof(float));
		double worst = 0;

		if (!ref)
			return 1;
		matmul_block(n, 0, n, a, b, ref);
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
