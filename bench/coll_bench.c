/* coll_bench.c: an nccl-tests-style benchmark of the worker SDK's
 * collectives. Run one per rank under a launcher (crun, torchrun or
 * tests/helpers/coll_launch); rank 0 prints, per message size, the time per
 * call (the slowest rank's mean), algbw = bytes / time and busbw = algbw x
 * the collective's bus factor (all_reduce 2(n-1)/n; all_gather,
 * reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1), as nccl-tests
 * does, so numbers compare across world sizes and with bench/gloo_bench.py.
 *
 *   coll_bench [-b MIN_BYTES] [-e MAX_BYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
 *              [-c all_reduce,broadcast,all_gather,reduce_scatter,all_to_all,reduce]
 *              [-t f32|...]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "crun/worker.h"

enum coll {
	C_ALL_REDUCE,
	C_BROADCAST,
	C_ALL_GATHER,
	C_REDUCE_SCATTER,
	C_ALL_TO_ALL,
	C_REDUCE,
	C__MAX
};

static const char *const coll_names[C__MAX] = {"all_reduce",	 "broadcast",  "all_gather",
					       "reduce_scatter", "all_to_all", "reduce"};

static double bus_factor(int c, int n)
{
	switch (c) {
	case C_ALL_REDUCE:
		return 2.0 * (n - 1) / n;
	case C_ALL_GATHER:
	case C_REDUCE_SCATTER:
	case C_ALL_TO_ALL:
		return (double)(n - 1) / n;
	default:
		return 1.0;
	}
}

/* `bytes` is the per-rank message size, as nccl-tests reports it: the
 * all_reduce buffer, the gathered output, the scattered input. */
static int run_one(crun_pg_t *pg, int c, uint8_t *sbuf, uint8_t *rbuf, size_t bytes, int dtype)
{
	size_t esz = crun_dtype_size(dtype), n = (size_t)crun_pg_size(pg);
	size_t count = bytes / esz;

	switch (c) {
	case C_ALL_REDUCE:
		return crun_all_reduce(pg, sbuf, rbuf, count, dtype, CRUN_SUM, NULL);
	case C_BROADCAST:
		return crun_broadcast(pg, rbuf, count, dtype, 0, NULL);
	case C_ALL_GATHER:
		return crun_all_gather(pg, sbuf, rbuf, count / n, dtype, NULL);
	case C_REDUCE_SCATTER:
		return crun_reduce_scatter(pg, sbuf, rbuf, count / n, dtype, CRUN_SUM, NULL);
	case C_ALL_TO_ALL:
		return crun_all_to_all(pg, sbuf, rbuf, count / n, dtype, NULL);
	default:
		return crun_reduce(pg, sbuf, rbuf, count, dtype, CRUN_SUM, 0, NULL);
	}
}

static int parse_colls(const char *s, int *want)
{
	char buf[256];
	char *save = NULL;

	if (strlen(s) >= sizeof(buf))
		return -1;
	memcpy(buf, s, strlen(s) + 1);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		int found = 0;

		for (int c = 0; c < C__MAX; c++)
			if (!strcmp(t, coll_names[c]) || !strcmp(t, "all"))
				want[c] = found = 1;
		if (!found)
			return -1;
	}
	return 0;
}

static int bench(crun_pg_t *pg, int c, size_t bytes, int dtype, int iters, int warmup,
		 uint8_t *sbuf, uint8_t *rbuf)
{
	int n = crun_pg_size(pg);
	size_t esz = crun_dtype_size(dtype);
	double t, worst;
	uint64_t t0;
	int r;

	if ((c != C_ALL_REDUCE && c != C_BROADCAST && c != C_REDUCE && bytes < esz * (size_t)n) ||
	    bytes < esz)
		return 0; /* below one element per rank */
	for (int i = 0; i < warmup; i++)
		TRY(run_one(pg, c, sbuf, rbuf, bytes, dtype));
	TRY(crun_barrier(pg, NULL));
	t0 = clock_now_us();
	for (int i = 0; i < iters; i++)
		TRY(run_one(pg, c, sbuf, rbuf, bytes, dtype));
	t = (double)(clock_now_us() - t0) / iters;
	/* The slowest rank's mean is the collective's time. */
	worst = t;
	r = crun_all_reduce(pg, &t, &worst, 1, CRUN_F64, CRUN_MAX, NULL);
	if (r < 0)
		return r;
	if (crun_pg_rank(pg) == 0) {
		double algbw = (double)bytes / worst / 1e3; /* bytes/us -> GB/s */

		printf("%-14s %12zu %12zu %4d %12.2f %10.3f %10.3f\n", coll_names[c], bytes,
		       bytes / esz, n, worst, algbw, algbw * bus_factor(c, n));
	}
	return 0;
}

int main(int argc, char **argv)
{
	uint64_t minb = 8, maxb = 256u << 20, factor = 2, iters = 20, warmup = 5;
	int want[C__MAX] = {0}, dtype = CRUN_F32, opt, r;
	uint8_t *sbuf, *rbuf;
	crun_pg_t *pg;

	while ((opt = getopt(argc, argv, "b:e:f:n:w:c:t:")) != -1) {
		int bad = 0;

		switch (opt) {
		case 'b':
			bad = parse_uint_range(optarg, 1, 1ull << 32, &minb);
			break;
		case 'e':
			bad = parse_uint_range(optarg, 1, 1ull << 32, &maxb);
			break;
		case 'f':
			bad = parse_uint_range(optarg, 2, 1024, &factor);
			break;
		case 'n':
			bad = parse_uint_range(optarg, 1, 1000000, &iters);
			break;
		case 'w':
			bad = parse_uint_range(optarg, 0, 1000000, &warmup);
			break;
		case 'c':
			bad = parse_colls(optarg, want);
			break;
		case 't':
			bad = strcmp(optarg, "f32") ? -1 : 0; /* f32 only, like the goals */
			break;
		default:
			bad = -1;
		}
		if (bad < 0) {
			fprintf(stderr,
				"usage: coll_bench [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] "
				"[-w WARMUP] [-c all_reduce,...|all] [-t f32]\n");
			return 2;
		}
	}
	if (!want[0] && !want[1] && !want[2] && !want[3] && !want[4] && !want[5])
		want[C_ALL_REDUCE] = 1;
	r = crun_init();
	if (r < 0) {
		fprintf(stderr, "coll_bench: crun_init: %s\n", crun_strerror(r));
		return 1;
	}
	pg = crun_world();
	sbuf = calloc(1, (size_t)maxb);
	rbuf = calloc(1, (size_t)maxb);
	if (!sbuf || !rbuf)
		return 1;
	if (crun_rank() == 0)
		printf("# crun coll_bench: %d ranks, f32, %llu iters (+%llu warm-up)\n"
		       "%-14s %12s %12s %4s %12s %10s %10s\n",
		       crun_world_size(), (unsigned long long)iters, (unsigned long long)warmup,
		       "# collective", "size(B)", "count", "n", "time(us)", "algbw(GB/s)",
		       "busbw(GB/s)");
	for (int c = 0; c < C__MAX && r == 0; c++) {
		if (!want[c])
			continue;
		for (uint64_t b = minb; b <= maxb && r == 0; b *= factor) {
			/* Fewer iterations for the big sizes keeps runs short. */
			int it = b >= (16u << 20) ? (int)MAX(iters / 4, 2) : (int)iters;

			r = bench(pg, c, (size_t)b, dtype, it, b >= (16u << 20) ? 1 : (int)warmup,
				  sbuf, rbuf);
		}
	}
	if (r < 0)
		fprintf(stderr, "coll_bench: rank %d: %s (%s)\n", crun_rank(), crun_strerror(r),
			crun_pg_last_error(pg));
	free(sbuf);
	free(rbuf);
	crun_finalize();
	return r < 0 ? 1 : 0;
}
