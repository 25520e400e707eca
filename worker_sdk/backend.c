/* backend.c: the cpu backend's table (the algorithms of algo.c over the
 * shared-memory and TCP transports) and the choice of a backend for a new
 * group, which is where the nccl backend is loaded from libcrun-cuda.so.0.
 * Nothing else in the SDK knows which backend a group drives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "worker_sdk/backend_int.h"
#include "worker_sdk/worker.h"

/* ---- cpu ------------------------------------------------------------------------ */

/* Which peers go over shm and which over TCP (CRUN_PG_TRANSPORT overrides). */
static int cpu_init(const struct pg_backend_args *a, void **ret_ctx, char *err, size_t cap)
{
	struct crun_pg *pg = a->core;
	const char *mode = getenv("CRUN_PG_TRANSPORT");
	int *is_shm, *is_tcp;
	int r;

	if (mode && *mode && strcmp(mode, "tcp") && strcmp(mode, "shm") && strcmp(mode, "auto")) {
		snprintf(err, cap, "CRUN_PG_TRANSPORT '%s': want auto, shm or tcp", mode);
		return CRUN_ECONFIG;
	}
	is_shm = calloc((size_t)a->size, sizeof(int));
	is_tcp = calloc((size_t)a->size, sizeof(int));
	r = CRUN_ENOMEM;
	if (!is_shm || !is_tcp)
		goto out;
	r = CRUN_ECONFIG;
	for (int p = 0; p < a->size; p++) {
		int shm;

		if (p == a->rank)
			continue;
		if (mode && !strcmp(mode, "shm") && !a->same_host[p]) {
			snprintf(err, cap, "CRUN_PG_TRANSPORT=shm but rank %d is on another host",
				 p);
			goto out;
		}
		shm = a->same_host[p] && !(mode && !strcmp(mode, "tcp"));
		is_shm[p] = shm;
		is_tcp[p] = !shm;
		log_at(LL_DEBUG, SUB_PG, "pg %s: rank %d reaches rank %d over %s", pg->name,
		       pg->rank, p, shm ? "shm" : "tcp");
	}
	r = pg_shm_setup(pg, a->store, a->ns, is_shm);
	if (r == 0)
		r = pg_tcp_setup(pg, a->store, a->ns, is_tcp);
	if (r == 0)
		*ret_ctx = pg;
out:
	free(is_shm);
	free(is_tcp);
	return r;
}

static void cpu_fini(void *ctx)
{
	struct crun_pg *pg = ctx;

	if (!pg || !pg->peers)
		return;
	pg_shm_release(pg);
	pg_tcp_release(pg);
}

static int cpu_broadcast(void *ctx, void *buf, size_t count, int dtype, int root)
{
	return algo_broadcast(ctx, buf, count, dtype, root);
}

static int cpu_all_reduce(void *ctx, const void *s, void *r, size_t count, int dtype, int op)
{
	return algo_all_reduce(ctx, s, r, count, dtype, op);
}

static int cpu_reduce(void *ctx, const void *s, void *r, size_t count, int dtype, int op, int root)
{
	return algo_reduce(ctx, s, r, count, dtype, op, root);
}

static int cpu_all_gather(void *ctx, const void *s, void *r, size_t count, int dtype)
{
	return algo_all_gather(ctx, s, r, count, dtype);
}

static int cpu_gather(void *ctx, const void *s, void *r, size_t count, int dtype, int root)
{
	return algo_gather(ctx, s, r, count, dtype, root);
}

static int cpu_scatter(void *ctx, const void *s, void *r, size_t count, int dtype, int root)
{
	return algo_scatter(ctx, s, r, count, dtype, root);
}

static int cpu_reduce_scatter(void *ctx, const void *s, void *r, size_t count, int dtype, int op)
{
	return algo_reduce_scatter(ctx, s, r, count, dtype, op);
}

static int cpu_all_to_all(void *ctx, const void *s, void *r, size_t count, int dtype)
{
	return algo_all_to_all(ctx, s, r, count, dtype);
}

static int cpu_barrier(void *ctx)
{
	struct crun_pg *pg = ctx;

	return pg->size > 1 ? algo_barrier(pg) : 0;
}

static int cpu_p2p(struct crun_pg *pg, int dir, const void *buf, size_t count, int dtype, int peer)
{
	struct xfer x = {
	    .peer = peer, .dir = dir, .buf = (uint8_t *)buf, .len = count * crun_dtype_size(dtype)};

	return pg_xfer(pg, &x, 1);
}

static int cpu_send(void *ctx, const void *buf, size_t count, int dtype, int peer)
{
	return cpu_p2p(ctx, XF_SEND, buf, count, dtype, peer);
}

static int cpu_recv(void *ctx, void *buf, size_t count, int dtype, int peer)
{
	return cpu_p2p(ctx, XF_RECV, buf, count, dtype, peer);
}

/* Tells the peers too (shm abort words, TCP shutdown), so none hangs. */
static void cpu_abort(void *ctx)
{
	(void)pg_fail(ctx, CRUN_ECANCELED, "aborted by crun_pg_abort");
}

static void cpu_set_timeout(void *ctx, uint32_t timeout_ms)
{
	/* The transports read pg->timeout_ms, which pg.c has already set. */
}

static const char *cpu_last_error(void *ctx)
{
	return ((struct crun_pg *)ctx)->last_error;
}

const struct pg_backend pg_backend_cpu = {
    .abi = PG_BACKEND_ABI,
    .name = "cpu",
    .init = cpu_init,
    .fini = cpu_fini,
    .broadcast = cpu_broadcast,
    .all_reduce = cpu_all_reduce,
    .reduce = cpu_reduce,
    .all_gather = cpu_all_gather,
    .gather = cpu_gather,
    .scatter = cpu_scatter,
    .reduce_scatter = cpu_reduce_scatter,
    .all_to_all = cpu_all_to_all,
    .barrier = cpu_barrier,
    .send = cpu_send,
    .recv = cpu_recv,
    .abort = cpu_abort,
    .set_timeout = cpu_set_timeout,
    .last_error = cpu_last_error,
};

/* ---- choosing ----------------------------------------------------------------------- */

static int load_nccl(const struct pg_backend **ret_be, char *err, size_t cap)
{
	pg_backend_entry_fn fn;
	const struct pg_backend *be;
	char why[512];
	void *sym;
	int r;

	r = kernels_cuda_sym("crun_cuda_pg_backend_v1", &sym, why, sizeof(why));
	if (r < 0) {
		snprintf(err, cap, "nccl backend unavailable: %s", why);
		return CRUN_ENOTSUP;
	}
	fn = (pg_backend_entry_fn)sym;
	why[0] = '\0';
	be = fn(PG_BACKEND_ABI, why, sizeof(why));
	if (!be) {
		snprintf(err, cap, "nccl backend unavailable: %s",
			 why[0] ? why : "no usable device");
		return CRUN_ENOTSUP;
	}
	*ret_be = be;
	return 0;
}

int pg_backend_pick(const char *name, const struct pg_backend **ret_be, int *ret_fell_back,
		    char *err, size_t cap)
{
	int auto_pick = !name || !strcmp(name, "auto");

	*ret_fell_back = 0;
	if (name && !strcmp(name, "cpu")) {
		*ret_be = &pg_backend_cpu;
		return 0;
	}
	if (!auto_pick && strcmp(name, "nccl")) {
		snprintf(err, cap, "backend '%s': want cpu, nccl or auto", name);
		return CRUN_EINVAL;
	}
	/* auto on a host without the NVIDIA driver (its control device, or
	 * WSL's /dev/dxg): do not even map the 200 MB of libnccl to find out
	 * what the device files already say. */
	if (auto_pick && access("/dev/nvidiactl", F_OK) != 0 && access("/dev/dxg", F_OK) != 0) {
		snprintf(err, cap, "no NVIDIA driver (/dev/nvidiactl missing)");
		*ret_fell_back = 1;
		*ret_be = &pg_backend_cpu;
		return 0;
	}
	if (load_nccl(ret_be, err, cap) == 0)
		return 0;
	if (!auto_pick)
		return CRUN_ENOTSUP;
	*ret_fell_back = 1;
	*ret_be = &pg_backend_cpu;
	return 0;
}
