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
 *        [--gemm cpu|gpu] [n]                                  (default n = 512)
 *
 * --backend picks the world group's backend (CRUN_PG_BACKEND otherwise);
 * --gemm gpu runs the local product with the GPU object's SGEMM, reached
 * through kernels_cuda_load() like everything CUDA in crun. With nccl and
 * gpu together the matrices live on the device from broadcast to
 * all_reduce; otherwise they stay in host memory (nccl stages them).
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

struct opts {
	size_t n;
	const char *backend; /* NULL: CRUN_PG_BACKEND or auto */
	int gemm_gpu;
};

static int usage(const char *why)
{
	fprintf(stderr,
		"dist_matmul: %s\nusage: dist_matmul [--backend cpu|nccl|auto] "
		"[--gemm cpu|gpu] [n]\n",
		why);
	return 2;
}

static int parse(int argc, char **argv, struct opts *o)
{
	uint64_t n64 = 512;

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(argv[i], "--backend")) {
			if (!v || (strcmp(v, "cpu") && strcmp(v, "nccl") && strcmp(v, "auto")))
				return usage("--backend: want cpu, nccl or auto");
			o->backend = v;
			i++;
		} else if (!strcmp(argv[i], "--gemm")) {
			if (!v || (strcmp(v, "cpu") && strcmp(v, "gpu")))
				return usage("--gemm: want cpu or gpu");
			o->gemm_gpu = !strcmp(v, "gpu");
			i++;
		} else if (parse_uint_range(argv[i], 1, 16384, &n64) < 0) {
			return usage("n: want 1..16384");
		}
	}
	o->n = (size_t)n64;
	return 0;
}

/* Device copies of the three matrices (--gemm gpu). */
struct dev {
	const struct kernels_cuda_ops *k;
	float *a, *b, *c;
};

static int dev_open(struct dev *d, size_t n)
{
	char err[512];
	size_t bytes = n * n * sizeof(float);
	int r = kernels_cuda_load(&d->k, err, sizeof(err));

	if (r < 0) {
		fprintf(stderr, "dist_matmul: --gemm gpu: %s (%s)\n", crun_strerror(r), err);
		return r;
	}
	r = d->k->set_device(crun_local_rank());
	if (r == 0)
		r = d->k->alloc((void **)&d->a, bytes);
	if (r == 0)
		r = d->k->alloc((void **)&d->b, bytes);
	if (r == 0)
		r = d->k->alloc((void **)&d->c, bytes);
	if (r < 0)
		fprintf(stderr, "dist_matmul: --gemm gpu: %s\n", d->k->last_error());
	return r;
}

static void dev_close(struct dev *d)
{
	if (!d->k)
		return;
	d->k->free(d->a);
	d->k->free(d->b);
	d->k->free(d->c);
}

int main(int argc, char **argv)
{
	struct opts opt = {0};
	struct dev d = {0};
	int rank, world, r, on_dev;
	size_t n, k0, k1, bytes;
	float *a, *b, *c, *ma, *mb, *mc; /* mX: where the collectives work */
	double t0, t_bcast, t_mm, t_ar;

	r = parse(argc, argv, &opt);
	if (r)
		return r;
	n = opt.n;
	bytes = n * n * sizeof(float);
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
	if (opt.gemm_gpu && dev_open(&d, n) < 0)
		return 1;
	/* nccl + gpu: everything stays on the device. The backend in use is
	 * what the user asked for (auto may have fallen back to cpu, which
	 * cannot read device memory: then stay on the host). */
	on_dev = opt.gemm_gpu && opt.backend && !strcmp(opt.backend, "nccl");
	ma = a, mb = b, mc = c;
	if (on_dev) {
		ma = d.a, mb = d.b, mc = d.c;
		if (rank == 0 && (d.k->copy(ma, a, bytes) < 0 || d.k->copy(mb, b, bytes) < 0))
			return 1;
	}
	t0 = now_ms();
	r = crun_broadcast(crun_world(), ma, n * n, CRUN_F32, 0, NULL);
	if (r == 0)
		r = crun_broadcast(crun_world(), mb, n * n, CRUN_F32, 0, NULL);
	t_bcast = now_ms();
	if (r < 0)
		goto fail;
	/* Column block [k0, k1) of A times row block [k0, k1) of B; the
	 * remainder of n / world goes to the first ranks. */
	k0 = (size_t)rank * (n / (size_t)world) + MIN((size_t)rank, n % (size_t)world);
	k1 = k0 + n / (size_t)world + ((size_t)rank < n % (size_t)world);
	if (!opt.gemm_gpu) {
		r = kernels_gemm_f32(n, n, k1 - k0, a + k0, n, b + k0 * n, n, c, n, 0);
	} else {
		if (!on_dev && (d.k->copy(d.a, a, bytes) < 0 || d.k->copy(d.b, b, bytes) < 0))
			return 1;
		r = d.k->gemm_f32(n, n, k1 - k0, d.a + k0, n, d.b + k0 * n, n, d.c, n, 0, NULL);
		if (r == 0)
			r = d.k->sync(NULL);
		if (r == 0 && !on_dev)
			r = d.k->copy(c, d.c, bytes);
		if (r < 0)
			fprintf(stderr, "dist_matmul: gpu gemm: %s\n", d.k->last_error());
	}
	t_mm = now_ms();
	if (r == 0)
		r = crun_all_reduce(crun_world(), mc, mc, n * n, CRUN_F32, CRUN_SUM, NULL);
	if (r == 0 && on_dev) {
		r = d.k->copy(c, d.c, bytes);
		if (rank == 0 && r == 0)
			r = d.k->copy(a, d.a, bytes); /* the reference below reads a and b */
		if (rank == 0 && r == 0)
			r = d.k->copy(b, d.b, bytes);
	}
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
		printf("dist_matmul: n=%zu world=%d: broadcast %.1f ms, local matmul (%s) %.1f "
		       "ms, all_reduce %.1f ms, total %.1f ms\n",
		       n, world, t_bcast - t0, opt.gemm_gpu ? "gpu" : "cpu", t_mm - t_bcast,
		       t_ar - t_mm, t_ar - t0);
		printf("dist_matmul: max relative error vs single-process product %.3g: %s\n",
		       worst, worst < 1e-4 ? "OK" : "MISMATCH");
		free(ref);
		if (worst >= 1e-4)
			r = CRUN_EIO;
	}
	free(a);
	free(b);
	free(c);
	dev_close(&d);
	crun_finalize();
	return r < 0 ? 1 : 0;
fail:
	fprintf(stderr, "dist_matmul: rank %d: %s (%s)\n", rank, crun_strerror(r),
		crun_pg_last_error(crun_world()));
	return 1;
}
