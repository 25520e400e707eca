/* backend_int.h: the collective backend behind a process group (STYLE §7).
 * pg.c drives a group only through this table; the cpu backend (shared
 * memory and TCP, backend_cpu.c) is built into libcrun, the nccl backend
 * (nccl.c) lives in libcrun-cuda.so.0 and is found by backend.c through one
 * versioned entry point. The GPU object links nothing of libcrun, so
 * everything a backend needs from the core (the store) is lent to it as
 * function pointers in struct pg_backend_args.
 */
#ifndef CRUN_WORKER_SDK_BACKEND_INT_H
#define CRUN_WORKER_SDK_BACKEND_INT_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever struct pg_backend or struct pg_backend_args change; the
 * GPU object refuses any other value, so a stale object cannot be driven. */
#define PG_BACKEND_ABI 1

/* What the core lends a backend while it sets a group up; every pointer is
 * borrowed and valid only during init(). Keys are relative to the group's
 * namespace in the worker store (ns is already part of them). */
struct pg_backend_args {
	size_t struct_size;
	int rank, size;	 /* in the group */
	int local_rank;	 /* LOCAL_RANK of this process: picks the device */
	int single_host; /* 1: every member is on this host (IPC allowed) */
	uint32_t timeout_ms;
	const char *ns; /* store key prefix of the group, e.g. "1//crun/a0/" */
	void *store;	/* a crun_store_t */
	int (*store_set)(void *store, const char *key, const void *val, size_t len);
	/* Blocks until key exists (or timeout_ms; 0 = the store default);
	 * *ret_val is freed with free_val(). */
	int (*store_get)(void *store, const char *key, uint32_t timeout_ms, void **ret_val,
			 size_t *ret_len);
	void (*free_val)(void *val);
	void *core;	      /* the struct crun_pg being built; only the cpu backend looks */
	const int *same_host; /* [size]: 1 where that member shares our host */
	/* A context of this same backend (the world group's) to split the new
	 * group from, or NULL to build it from scratch. Set only for backends
	 * with split_skip, and then every world rank takes part: the members
	 * through init(), the others through split_skip(). Its queued work is
	 * done and nothing else uses it during the call. */
	void *parent;
	/* LOCAL_WORLD_SIZE (<= 0: unknown). Appended: a backend reads it only
	 * where struct_size covers it. */
	int local_world_size;
};

/* One backend. Every collective has the crun_* contract of
 * include/crun/worker.h in group ranks, blocks until the result is in the
 * caller's buffer, and returns 0 or a negative crun code; CRUN_EPEER,
 * CRUN_ETIMEDOUT and CRUN_ECANCELED leave the backend broken (pg.c then
 * fails every later call with that code). Apart from abort(), a context is
 * used from one thread at a time. */
struct pg_backend {
	int abi; /* PG_BACKEND_ABI */
	const char *name;
	/* Builds the backend's state for one group; collective over the group.
	 * On failure err (cap bytes) says what is missing. */
	int (*init)(const struct pg_backend_args *a, void **ret_ctx, char *err, size_t cap);
	void (*fini)(void *ctx); /* NULL and half-built contexts OK */
	int (*broadcast)(void *ctx, void *buf, size_t count, int dtype, int root);
	int (*all_reduce)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype, int op);
	int (*reduce)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype, int op,
		      int root);
	int (*all_gather)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype);
	int (*gather)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype, int root);
	int (*scatter)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype, int root);
	int (*reduce_scatter)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype,
			      int op);
	int (*all_to_all)(void *ctx, const void *sbuf, void *rbuf, size_t count, int dtype);
	int (*barrier)(void *ctx);
	int (*send)(void *ctx, const void *buf, size_t count, int dtype, int peer);
	int (*recv)(void *ctx, void *buf, size_t count, int dtype, int peer);
	/* Any thread: in-flight and later work fails with CRUN_ECANCELED. */
	void (*abort)(void *ctx);
	void (*set_timeout)(void *ctx, uint32_t timeout_ms);
	/* Detail of the last failure; never NULL. */
	const char *(*last_error)(void *ctx);
	/* Optional (NULL: groups are always built from scratch). The share of
	 * a world rank that is not in a group being split from parent_ctx. */
	int (*split_skip)(void *parent_ctx, char *err, size_t cap);
	/* Optional, all five or none: asynchronous work on the backend's own
	 * ordered queue (a CUDA stream) instead of pg.c's progress thread.
	 * Between defer(ctx, 1) and defer(ctx, 0) a collective returns once
	 * its work is enqueued (one that must copy a result to host memory
	 * still waits); mark() then returns a token for everything enqueued
	 * so far (a CUDA event). test_token() and wait_token() report it with
	 * the collectives' codes, timeout and abort included; free_token()
	 * releases it (NULL OK). */
	void (*defer)(void *ctx, int on);
	int (*mark)(void *ctx, void **ret_token);
	int (*test_token)(void *ctx, void *token, int *ret_done);
	int (*wait_token)(void *ctx, void *token);
	void (*free_token)(void *ctx, void *token);
};

/* The GPU object's entry point, looked up by name:
 *   const struct pg_backend *crun_cuda_pg_backend_v1(int abi, char *err, size_t cap);
 * NULL (err filled) when abi differs or no device is usable. */
typedef const struct pg_backend *(*pg_backend_entry_fn)(int abi, char *err, size_t cap);

/* The cpu backend (always built in). */
extern const struct pg_backend pg_backend_cpu;

/* Resolves a backend name for a new group: "cpu"; "nccl" (CRUN_ENOTSUP,
 * err naming what is missing: the GPU object, its libraries, the driver, a
 * device); "auto" or NULL: nccl where it loads, else cpu, and then
 * *ret_fell_back = 1 with the reason in err. CRUN_EINVAL for other names. */
int pg_backend_pick(const char *name, const struct pg_backend **ret_be, int *ret_fell_back,
		    char *err, size_t cap);

#endif /* CRUN_WORKER_SDK_BACKEND_INT_H */
