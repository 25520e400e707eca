/* fake_backend.c: a stand-in for libcrun-cuda.so.0, built as a shared
 * object for test_backend.c. It exports the same versioned door and a
 * struct pg_backend whose collectives act on host memory for a group of
 * one, so the whole nccl path of the SDK (loading through CRUN_CUDA_LIB, the
 * ABI check, dispatch through the table, abort, broken groups, error text,
 * subgroup splits) runs on machines without CUDA. Its behaviour is steered
 * by FAKE_BACKEND (a word per knob) and it reports what it saw in its own
 * counters, read through fake_backend_stats().
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crun/crun.h"
#include "crun/worker.h"
#include "worker_sdk/backend_int.h"

struct fake {
	int rank, size, split, deferred;
	_Atomic int aborted;
	int broken;
	char err[128];
};

/* What the test reads back: calls per kind (process-wide, one test at a time). */
struct fake_stats {
	int inits, splits, split_skips, finis, collectives, aborts;
	int deferred, marks, tests, waits, tokens_freed;
};

static struct fake_stats stats;

__attribute__((visibility("default"))) const struct fake_stats *fake_backend_stats(void);
__attribute__((visibility("default"))) const struct pg_backend *
crun_cuda_pg_backend_v1(int abi, char *err, size_t cap);

const struct fake_stats *fake_backend_stats(void)
{
	return &stats;
}

/* crun_dtype_size() lives in libcrun, which this object must not need. */
static size_t size_of(int dtype)
{
	static const size_t sizes[CRUN_DTYPE__MAX] = {4, 8, 2, 2, 1, 1, 4, 8};

	return dtype >= 0 && dtype < CRUN_DTYPE__MAX ? sizes[dtype] : 0;
}

static int knob(const char *word)
{
	const char *v = getenv("FAKE_BACKEND");

	return v && strstr(v, word) != NULL;
}

static int fk_init(const struct pg_backend_args *a, void **ret_ctx, char *err, size_t cap)
{
	struct fake *f;

	if (a->struct_size != sizeof(*a) || !a->store_set || !a->store_get || !a->ns) {
		snprintf(err, cap, "fake: bad arguments");
		return CRUN_EINVAL;
	}
	if (knob("init-fails")) {
		snprintf(err, cap, "fake: no device for LOCAL_RANK %d", a->local_rank);
		return CRUN_ENOTSUP;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		return CRUN_ENOMEM;
	f->rank = a->rank;
	f->size = a->size;
	f->split = a->parent != NULL;
	stats.inits++;
	stats.splits += f->split;
	*ret_ctx = f;
	return 0;
}

static void fk_fini(void *ctx)
{
	stats.finis++;
	free(ctx);
}

/* Every collective of a group of one: the result is the input. */
static int one(struct fake *f, const void *s, void *r, size_t count, int dtype)
{
	stats.collectives++;
	stats.deferred += f->deferred;
	if (atomic_load(&f->aborted)) {
		snprintf(f->err, sizeof(f->err), "fake: aborted");
		return CRUN_ECANCELED;
	}
	if (knob("peer-dies")) {
		snprintf(f->err, sizeof(f->err), "fake: peer 1 vanished");
		return CRUN_EPEER;
	}
	if (f->size != 1)
		return CRUN_EINVAL;
	if (s && r && s != r)
		memmove(r, s, count * size_of(dtype));
	return 0;
}

static int fk_broadcast(void *c, void *buf, size_t n, int dt, int root)
{
	return one(c, buf, buf, n, dt);
}

static int fk_all_reduce(void *c, const void *s, void *r, size_t n, int dt, int op)
{
	return one(c, s, r, n, dt);
}

static int fk_reduce(void *c, const void *s, void *r, size_t n, int dt, int op, int root)
{
	return one(c, s, r, n, dt);
}

static int fk_gatherish(void *c, const void *s, void *r, size_t n, int dt)
{
	return one(c, s, r, n, dt);
}

static int fk_rooted(void *c, const void *s, void *r, size_t n, int dt, int root)
{
	return one(c, s, r, n, dt);
}

static int fk_reduce_scatter(void *c, const void *s, void *r, size_t n, int dt, int op)
{
	return one(c, s, r, n, dt);
}

static int fk_barrier(void *c)
{
	return one(c, NULL, NULL, 0, CRUN_U8);
}

static int fk_p2p(void *c, const void *buf, size_t n, int dt, int peer)
{
	return one(c, NULL, NULL, 0, dt);
}

static int fk_recv(void *c, void *buf, size_t n, int dt, int peer)
{
	return one(c, NULL, NULL, 0, dt);
}

static void fk_abort(void *ctx)
{
	stats.aborts++;
	atomic_store(&((struct fake *)ctx)->aborted, 1);
}

static void fk_set_timeout(void *ctx, uint32_t t)
{
}

static const char *fk_last_error(void *ctx)
{
	return ((struct fake *)ctx)->err;
}

static int fk_split_skip(void *parent, char *err, size_t cap)
{
	stats.split_skips++;
	return 0;
}

/* Tokens: a countdown of test_token() looks before the work is "done". */
static void fk_defer(void *ctx, int on)
{
	((struct fake *)ctx)->deferred = on;
}

static int fk_mark(void *ctx, void **ret_token)
{
	int *t = malloc(sizeof(*t));

	if (!t)
		return CRUN_ENOMEM;
	*t = 2;
	stats.marks++;
	*ret_token = t;
	return 0;
}

static int token_result(struct fake *f)
{
	if (knob("token-fails")) {
		snprintf(f->err, sizeof(f->err), "fake: the stream saw peer 1 die");
		return CRUN_EPEER;
	}
	return 0;
}

static int fk_test_token(void *ctx, void *token, int *ret_done)
{
	stats.tests++;
	if (--*(int *)token > 0) {
		*ret_done = 0;
		return 0;
	}
	*ret_done = 1;
	return token_result(ctx);
}

static int fk_wait_token(void *ctx, void *token)
{
	stats.waits++;
	return token_result(ctx);
}

static void fk_free_token(void *ctx, void *token)
{
	stats.tokens_freed += token != NULL;
	free(token);
}

static const struct pg_backend fake = {
	.abi = PG_BACKEND_ABI,
	.name = "fake",
	.init = fk_init,
	.fini = fk_fini,
	.broadcast = fk_broadcast,
	.all_reduce = fk_all_reduce,
	.reduce = fk_reduce,
	.all_gather = fk_gatherish,
	.gather = fk_rooted,
	.scatter = fk_rooted,
	.reduce_scatter = fk_reduce_scatter,
	.all_to_all = fk_gatherish,
	.barrier = fk_barrier,
	.send = fk_p2p,
	.recv = fk_recv,
	.abort = fk_abort,
	.set_timeout = fk_set_timeout,
	.last_error = fk_last_error,
	.split_skip = fk_split_skip,
	.defer = fk_defer,
	.mark = fk_mark,
	.test_token = fk_test_token,
	.wait_token = fk_wait_token,
	.free_token = fk_free_token,
};

const struct pg_backend *crun_cuda_pg_backend_v1(int abi, char *err, size_t cap)
{
	if (knob("no-device")) {
		snprintf(err, cap, "fake: cudaGetDeviceCount: no CUDA-capable device is detected");
		return NULL;
	}
	if (abi != PG_BACKEND_ABI || knob("old-abi")) {
		snprintf(err, cap, "GPU object backend ABI %d, libcrun wants %d",
			 PG_BACKEND_ABI + 1, abi);
		return NULL;
	}
	return &fake;
}
