/* coll_worker.c: one rank of the collective tests, started by coll_launch
 * (or any launcher) with RANK, WORLD_SIZE, MASTER_ADDR, ... set. Modes:
 *   matrix [quick]  every collective x dtype x op x count against a
 *                   reference computed locally from every rank's input
 *   subgroup        groups over even ranks, odd ranks, and a reversed list
 *   async           several async all_reduces in flight, then waits
 *   kill VICTIM     VICTIM exits mid-job; every other rank must get an error
 *   abort           rank 0 aborts the world group; the others must get errors
 *   timeout         rank 0 never joins; the others must time out
 * Prints "coll_worker rank R: ok N checks" and exits 0 on success.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "crun/worker.h"
#include "kernels/kernels.h"

static int rank, nranks, checks, fails;

#define FAILF(...)                                              \
	do {                                                    \
		fprintf(stderr, "coll_worker rank %d: ", rank); \
		fprintf(stderr, __VA_ARGS__);                   \
		fputc('\n', stderr);                            \
		fails++;                                        \
	} while (0)

#define CALL(expr)                                                                    \
	do {                                                                          \
		int r_ = (expr);                                                      \
		if (r_ < 0) {                                                         \
			fprintf(stderr, "coll_worker rank %d: %s: %s\n", rank, #expr, \
				crun_err_name(r_));                                   \
			exit(3);                                                      \
		}                                                                     \
	} while (0)

/* Input element i of group rank r: small integers, so every reduction is
 * exact in every type and the reference can be computed in double. */
static double input_val(int r, size_t i, int op)
{
	if (op == CRUN_PROD)
		return 1 + (double)((r + i) % 2);
	return (double)((r * 7 + i * 3) % 11) - 3;
}

static void put(void *buf, size_t i, int dtype, double v)
{
	switch (dtype) {
	case CRUN_F32:
		((float *)buf)[i] = (float)v;
		break;
	case CRUN_F64:
		((double *)buf)[i] = v;
		break;
	case CRUN_F16:
		((uint16_t *)buf)[i] = kernels_float_to_f16((float)v);
		break;
	case CRUN_BF16:
		((uint16_t *)buf)[i] = kernels_float_to_bf16((float)v);
		break;
	case CRUN_I8:
		((int8_t *)buf)[i] = (int8_t)(int64_t)v;
		break;
	case CRUN_U8:
		((uint8_t *)buf)[i] = (uint8_t)(int64_t)v;
		break;
	case CRUN_I32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case CRUN_I64:
		((int64_t *)buf)[i] = (int64_t)v;
		break;
	}
}

static int is_float(int dtype)
{
	return dtype <= CRUN_BF16;
}

/* The value an element of dtype holds once v is stored (u8 wraps -3). */
static double as_stored(int dtype, double v)
{
	uint8_t tmp[8];

	put(tmp, 0, dtype, v);
	switch (dtype) {
	case CRUN_U8:
		return *(uint8_t *)tmp;
	case CRUN_I8:
		return *(int8_t *)tmp;
	default:
		return v;
	}
}

/* Reference reduction of element i over group ranks 0..n-1, stored in out. */
static void reference(void *out, size_t i, int dtype, int op, int n)
{
	double acc = as_stored(dtype, input_val(0, i, op));
	uint64_t iacc = (uint64_t)(int64_t)acc;

	for (int r = 1; r < n; r++) {
		double v = as_stored(dtype, input_val(r, i, op));
		uint64_t iv = (uint64_t)(int64_t)v;

		switch (op) {
		case CRUN_SUM:
		case CRUN_AVG:
			acc += v;
			iacc += iv;
			break;
		case CRUN_PROD:
			acc *= v;
			iacc *= iv;
			break;
		case CRUN_MIN:
			acc = v < acc ? v : acc;
			iacc = (uint64_t)(int64_t)acc;
			break;
		case CRUN_MAX:
			acc = v > acc ? v : acc;
			iacc = (uint64_t)(int64_t)acc;
			break;
		}
	}
	if (is_float(dtype)) {
		if (op == CRUN_AVG)
			acc = dtype == CRUN_F64 ? acc / n : (double)((float)acc / (float)n);
		put(out, i, dtype, acc);
		return;
	}
	/* Integers wrap modulo 2^bits, then AVG divides the wrapped sum. */
	switch (dtype) {
	case CRUN_I8: {
		int8_t x = (int8_t)iacc;
		((int8_t *)out)[i] = op == CRUN_AVG ? (int8_t)(x / n) : x;
		break;
	}
	case CRUN_U8: {
		uint8_t x = (uint8_t)iacc;
		((uint8_t *)out)[i] = op == CRUN_AVG ? (uint8_t)(x / n) : x;
		break;
	}
	case CRUN_I32: {
		int32_t x = (int32_t)iacc;
		((int32_t *)out)[i] = op == CRUN_AVG ? x / n : x;
		break;
	}
	case CRUN_I64: {
		int64_t x = (int64_t)iacc;
		((int64_t *)out)[i] = op == CRUN_AVG ? x / n : x;
		break;
	}
	}
}

static void fill(void *buf, size_t count, int dtype, int op, int r, size_t base)
{
	for (size_t i = 0; i < count; i++)
		put(buf, i, dtype, input_val(r, base + i, op));
}

static void expect_eq(const char *what, const void *got, const void *want, size_t bytes, int dtype,
		      int op, size_t count)
{
	checks++;
	if (memcmp(got, want, bytes))
		FAILF("%s dtype %d op %d count %zu: mismatch", what, dtype, op, count);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		exit(4);
	return p;
}

/* ---- the matrix --------------------------------------------------------------- */

static void test_reductions(crun_pg_t *pg, size_t count, int dtype, int op, int inplace)
{
	int n = crun_pg_size(pg), me = crun_pg_rank(pg), root = (int)(count % (size_t)n);
	size_t esz = crun_dtype_size(dtype), bytes = count * esz;
	uint8_t *in = xmalloc(bytes * (size_t)n), *out = xmalloc(bytes * (size_t)n);
	uint8_t *want = xmalloc(bytes * (size_t)n);

	/* all_reduce */
	fill(in, count, dtype, op, me, 0);
	for (size_t i = 0; i < count; i++)
		reference(want, i, dtype, op, n);
	if (inplace) {
		CALL(crun_all_reduce(pg, in, in, count, dtype, op, NULL));
		expect_eq("all_reduce(in place)", in, want, bytes, dtype, op, count);
	} else {
		CALL(crun_all_reduce(pg, in, out, count, dtype, op, NULL));
		expect_eq("all_reduce", out, want, bytes, dtype, op, count);
	}
	/* reduce */
	fill(in, count, dtype, op, me, 0);
	memset(out, 0xee, bytes);
	CALL(crun_reduce(pg, in, inplace ? in : out, count, dtype, op, root, NULL));
	if (me == root)
		expect_eq("reduce", inplace ? in : out, want, bytes, dtype, op, count);
	/* reduce_scatter: rank me's block is elements [me*count, (me+1)*count) */
	fill(in, count * (size_t)n, dtype, op, me, 0);
	for (size_t i = 0; i < count; i++)
		reference(want, (size_t)me * count + i, dtype, op, n);
	/* reference() wrote at index me*count+i; move it to the front */
	memmove(want, want + (size_t)me * bytes, bytes);
	CALL(crun_reduce_scatter(pg, in, out, count, dtype, op, NULL));
	expect_eq("reduce_scatter", out, want, bytes, dtype, op, count);
	free(in);
	free(out);
	free(want);
}

static void test_movement(crun_pg_t *pg, size_t count, int dtype, int inplace)
{
	int n = crun_pg_size(pg), me = crun_pg_rank(pg), root = (int)((count + 1) % (size_t)n);
	size_t esz = crun_dtype_size(dtype), bytes = count * esz, all = bytes * (size_t)n;
	uint8_t *in = xmalloc(all), *out = xmalloc(all), *want = xmalloc(all);

	/* broadcast */
	if (me == root)
		fill(in, count, dtype, CRUN_SUM, root, 0);
	else
		memset(in, 0, bytes);
	fill(want, count, dtype, CRUN_SUM, root, 0);
	CALL(crun_broadcast(pg, in, count, dtype, root, NULL));
	expect_eq("broadcast", in, want, bytes, dtype, -1, count);
	/* all_gather: block r holds rank r's input */
	for (int r = 0; r < n; r++)
		fill(want + (size_t)r * bytes, count, dtype, CRUN_SUM, r, 0);
	fill(in, count, dtype, CRUN_SUM, me, 0);
	if (inplace) {
		memcpy(out + (size_t)me * bytes, in, bytes);
		CALL(crun_all_gather(pg, out + (size_t)me * bytes, out, count, dtype, NULL));
	} else {
		CALL(crun_all_gather(pg, in, out, count, dtype, NULL));
	}
	expect_eq("all_gather", out, want, all, dtype, -1, count);
	/* gather */
	memset(out, 0, all);
	CALL(crun_gather(pg, in, out, count, dtype, root, NULL));
	if (me == root)
		expect_eq("gather", out, want, all, dtype, -1, count);
	/* scatter: root's block r goes to r */
	if (me == root)
		for (int r = 0; r < n; r++)
			fill(in + (size_t)r * bytes, count, dtype, CRUN_SUM, r, 1000);
	memset(out, 0, bytes);
	CALL(crun_scatter(pg, in, out, count, dtype, root, NULL));
	fill(want, count, dtype, CRUN_SUM, me, 1000);
	expect_eq("scatter", out, want, bytes, dtype, -1, count);
	/* all_to_all: block d of rank s's input is input_val(s, d*1000 + i) */
	for (int d = 0; d < n; d++)
		fill(in + (size_t)d * bytes, count, dtype, CRUN_SUM, me, (size_t)d * 1000);
	for (int s = 0; s < n; s++)
		fill(want + (size_t)s * bytes, count, dtype, CRUN_SUM, s, (size_t)me * 1000);
	if (inplace) {
		CALL(crun_all_to_all(pg, in, in, count, dtype, NULL));
		expect_eq("all_to_all(in place)", in, want, all, dtype, -1, count);
	} else {
		CALL(crun_all_to_all(pg, in, out, count, dtype, NULL));
		expect_eq("all_to_all", out, want, all, dtype, -1, count);
	}
	/* send/recv around the ring (even ranks send first) */
	if (n > 1) {
		int to = (me + 1) % n, from = (me + n - 1) % n;

		fill(in, count, dtype, CRUN_SUM, me, 7);
		if (me % 2 == 0) {
			CALL(crun_send(pg, in, count, dtype, to, NULL));
			CALL(crun_recv(pg, out, count, dtype, from, NULL));
		} else {
			CALL(crun_recv(pg, out, count, dtype, from, NULL));
			CALL(crun_send(pg, in, count, dtype, to, NULL));
		}
		fill(want, count, dtype, CRUN_SUM, from, 7);
		expect_eq("send/recv", out, want, bytes, dtype, -1, count);
	}
	CALL(crun_barrier(pg, NULL));
	free(in);
	free(out);
	free(want);
}

static void run_matrix(crun_pg_t *pg, int quick)
{
	static const size_t counts[] = {0, 1, 7, 1001};
	size_t big = 70001; /* over the ring threshold for every dtype >= 1 byte */

	for (size_t c = 0; c < ARRAY_SIZE(counts); c++)
		for (int dt = 0; dt < CRUN_DTYPE__MAX; dt++) {
			for (int op = 0; op < CRUN_RED_OP__MAX; op++)
				if (!quick || op == (int)((c + (size_t)dt) % CRUN_RED_OP__MAX))
					test_reductions(pg, counts[c], dt, op,
							(int)(c + (size_t)op) % 2);
			test_movement(pg, counts[c], dt, (int)(c + (size_t)dt) % 2);
		}
	/* Large messages take the ring paths; sample dtypes and ops. */
	test_reductions(pg, big, CRUN_F32, CRUN_SUM, 0);
	test_reductions(pg, big, CRUN_I32, CRUN_MAX, 1);
	test_reductions(pg, big + 3, CRUN_BF16, CRUN_AVG, 0);
	test_reductions(pg, big, CRUN_U8, CRUN_PROD, 1);
	test_movement(pg, big, CRUN_F64, 0);
	test_movement(pg, big * 4 + 1, CRUN_U8, 1);
	if (!quick) {
		test_reductions(pg, big, CRUN_F16, CRUN_MIN, 0);
		test_reductions(pg, big, CRUN_I64, CRUN_SUM, 1);
	}
}

/* ---- the other modes ------------------------------------------------------------ */

static void run_subgroups(void)
{
	int n = crun_world_size(), evens[8], odds[8], rev[8], ne = 0, no = 0;
	crun_pg_t *ge = NULL, *go = NULL, *gr = NULL;

	if (n > (int)ARRAY_SIZE(rev)) {
		fprintf(stderr, "coll_worker: subgroup mode takes at most %d ranks\n",
			(int)ARRAY_SIZE(rev));
		exit(2);
	}
	for (int r = 0; r < n; r++) {
		if (r % 2 == 0)
			evens[ne++] = r;
		else
			odds[no++] = r;
		rev[r] = n - 1 - r;
	}
	CALL(crun_pg_new(evens, ne, "cpu", &ge));
	if (no)
		CALL(crun_pg_new(odds, no, "auto", &go));
	CALL(crun_pg_new(rev, n, NULL, &gr));
	checks++;
	if ((rank % 2 == 0) != (ge != NULL) || (rank % 2 == 1) != (go != NULL) || !gr)
		FAILF("membership wrong");
	if (crun_pg_rank(gr) != n - 1 - rank)
		FAILF("reversed group rank %d", crun_pg_rank(gr));
	run_matrix(ge ? ge : go, 1);
	run_matrix(gr, 1);
	/* Group sums differ: check one value explicitly. */
	{
		int64_t v = rank, want = 0;

		for (int r = rank % 2; r < n; r += 2)
			want += r;
		CALL(crun_all_reduce(ge ? ge : go, &v, &v, 1, CRUN_I64, CRUN_SUM, NULL));
		checks++;
		if (v != want)
			FAILF("subgroup sum %lld want %lld", (long long)v, (long long)want);
	}
	checks++;
	if (crun_pg_new(evens, ne, "nccl", &ge) != CRUN_ENOTSUP)
		FAILF("nccl backend should be CRUN_ENOTSUP");
	crun_pg_free(ge);
	crun_pg_free(go);
	crun_pg_free(gr);
}

static void run_async(crun_pg_t *pg)
{
	enum { NW = 6, CNT = 50000 };
	crun_work_t *w[NW];
	float *bufs[NW];
	int n = crun_pg_size(pg);

	for (int k = 0; k < NW; k++) {
		bufs[k] = xmalloc(sizeof(float) * CNT);
		for (int i = 0; i < CNT; i++)
			bufs[k][i] = (float)(rank + k + i % 3);
		CALL(crun_all_reduce(pg, bufs[k], bufs[k], CNT, CRUN_F32, CRUN_SUM, &w[k]));
	}
	/* Overlap: compute while the work runs, then a blocking call queues
	 * behind it and must see the same order on every rank. */
	{
		int64_t v = 1;

		CALL(crun_all_reduce(pg, &v, &v, 1, CRUN_I64, CRUN_SUM, NULL));
		checks++;
		if (v != n)
			FAILF("blocking call behind async work: %lld", (long long)v);
	}
	for (int k = NW - 1; k >= 0; k--) {
		int done = 0;

		CALL(crun_work_wait(w[k]));
		CALL(crun_work_test(w[k], &done));
		checks++;
		if (!done)
			FAILF("work %d not done after wait", k);
		for (int i = 0; i < CNT; i++) {
			float want = (float)(n * (n - 1) / 2 + n * (k + i % 3));

			if (bufs[k][i] != want) {
				FAILF("async work %d elem %d: %g want %g", k, i, bufs[k][i], want);
				break;
			}
		}
		checks++;
		crun_work_free(w[k]);
		free(bufs[k]);
	}
}

/* Expected failure modes: print the code the survivors got. */
static int run_failure(crun_pg_t *pg, const char *mode, int victim)
{
	float buf[4096] = {0};
	int r = 0;

	CALL(crun_barrier(pg, NULL));
	if (!strcmp(mode, "kill") && rank == victim) {
		fprintf(stderr, "coll_worker rank %d: dying\n", rank);
		_exit(9);
	}
	if (!strcmp(mode, "abort") && rank == victim) {
		crun_work_t *w;

		CALL(crun_all_reduce(pg, buf, buf, 4096, CRUN_F32, CRUN_SUM, &w));
		usleep(100 * 1000);
		CALL(crun_pg_abort(pg));
		r = crun_work_wait(w);
		crun_work_free(w);
		printf("coll_worker rank %d: result %s\n", rank, crun_err_name(r));
		return r == CRUN_ECANCELED ? 0 : 1;
	}
	if (!strcmp(mode, "abort"))
		usleep(1000 * 1000); /* join late: the victim's work is in flight */
	if (!strcmp(mode, "timeout")) {
		if (rank == victim) {
			sleep(4); /* stays alive but never joins */
			printf("coll_worker rank %d: result skipped\n", rank);
			return 0;
		}
		crun_pg_set_timeout(pg, 1000);
	}
	/* Up to 50 rounds: the failure must surface as an error. */
	for (int i = 0; i < 50 && r == 0; i++)
		r = crun_all_reduce(pg, buf, buf, 4096, CRUN_F32, CRUN_SUM, NULL);
	printf("coll_worker rank %d: result %s (%s)\n", rank, crun_err_name(r),
	       crun_pg_last_error(pg));
	/* A broken group stays broken. */
	if (r < 0 && crun_barrier(pg, NULL) != r)
		return 1;
	return r < 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "matrix";
	crun_pg_t *world;
	int rc = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CALL(crun_init());
	world = crun_world();
	rank = crun_rank();
	nranks = crun_world_size();
	if (!strcmp(mode, "matrix")) {
		run_matrix(world, argc > 2 && !strcmp(argv[2], "quick"));
	} else if (!strcmp(mode, "subgroup")) {
		run_subgroups();
	} else if (!strcmp(mode, "async")) {
		run_async(world);
	} else if (!strcmp(mode, "kill") || !strcmp(mode, "abort") || !strcmp(mode, "timeout")) {
		rc = run_failure(world, mode, argc > 2 ? (int)strtol(argv[2], NULL, 10) : 0);
		/* Skip finalize's checkout: a peer is gone. */
		_exit(rc);
	} else {
		fprintf(stderr, "coll_worker: unknown mode '%s'\n", mode);
		return 2;
	}
	crun_finalize();
	if (fails) {
		printf("coll_worker rank %d: FAILED %d of %d checks\n", rank, fails, checks);
		return 1;
	}
	printf("coll_worker rank %d: ok %d checks\n", rank, checks);
	return 0;
}
