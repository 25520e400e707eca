/* pg.c: process groups: creation (host discovery and transport set-up
 * through the store), the public collective entry points with their
 * argument checks, and asynchronous work (one FIFO and one progress thread
 * per group, started on first use). Blocking calls run on the caller's
 * thread when no async work is queued, so small collectives pay no thread
 * hand-off.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/kernels.h"
#include "worker_sdk/backend_int.h"
#include "worker_sdk/worker.h"

enum pg_op_kind {
	OP_BROADCAST,
	OP_ALL_REDUCE,
	OP_REDUCE,
	OP_ALL_GATHER,
	OP_GATHER,
	OP_SCATTER,
	OP_REDUCE_SCATTER,
	OP_ALL_TO_ALL,
	OP_BARRIER,
	OP_SEND,
	OP_RECV,
	OP__MAX
};

struct pg_op {
	int kind;
	const void *sbuf;
	void *rbuf;
	size_t count;
	int dtype, op, root; /* root doubles as the peer of send/recv */
};

struct crun_work {
	struct crun_work *next;
	struct crun_pg *pg; /* borrowed; the group outlives its work */
	struct pg_op op;
	int done;
	int result;
	void *token; /* deferred work: the backend's mark (a CUDA event) */
};

/* ---- creation ------------------------------------------------------------------ */

/* Ranks with the same boot id, hostname and network namespace are on one
 * "host" and talk through /dev/shm. Different network namespaces (containers,
 * or the namespace "hosts" of the tests) count as different hosts: they may
 * not share /dev/shm, and their traffic is meant to cross the network. */
static int host_id(char *buf, size_t cap)
{
	char boot[64] = "", host[128] = "", netns[64] = "";
	ssize_t nl = readlink("/proc/self/ns/net", netns, sizeof(netns) - 1);
	int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		ssize_t n = read(fd, boot, sizeof(boot) - 1);

		boot[n > 0 ? n : 0] = '\0';
		boot[strcspn(boot, "\n")] = '\0';
		fd_close(fd);
	}
	(void)gethostname(host, sizeof(host) - 1);
	netns[nl > 0 ? nl : 0] = '\0';
	return pg_fmt(buf, cap, "%s/%s/%s", boot, host, netns);
}

static size_t env_size(const char *name, size_t def, size_t min, size_t max)
{
	const char *s = getenv(name);
	uint64_t v;

	if (!s || parse_uint_range(s, min, max, &v) < 0)
		return def;
	return (size_t)v;
}

/* Publishes our host id and learns which members share this host: the cpu
 * backend picks shm or TCP from it, a GPU backend whether CUDA IPC may work. */
static int find_hosts(struct crun_pg *pg, crun_store_t *st, const char *ns, int *same_host)
{
	char me[256], key[300];

	TRY(host_id(me, sizeof(me)));
	TRY(pg_fmt(key, sizeof(key), "%shost/%d", ns, pg->rank));
	TRY(crun_store_set(st, key, me, strlen(me)));
	for (int p = 0; p < pg->size; p++) {
		void *v;
		size_t len;

		if (p == pg->rank) {
			same_host[p] = 1;
			continue;
		}
		TRY(pg_fmt(key, sizeof(key), "%shost/%d", ns, p));
		TRY(crun_store_get(st, key, 0, &v, &len));
		same_host[p] = len == strlen(me) && memcmp(v, me, len) == 0;
		crun_free(v);
	}
	return 0;
}

static int store_set_fn(void *st, const char *key, const void *val, size_t len)
{
	return crun_store_set(st, key, val, len);
}

static int store_get_fn(void *st, const char *key, uint32_t timeout_ms, void **ret_val,
			size_t *ret_len)
{
	return crun_store_get(st, key, timeout_ms, ret_val, ret_len);
}

static int splits_from(const struct crun_pg *parent, const struct pg_backend *be);
static void quiesce(struct crun_pg *parent);

/* Picks and starts the backend. "auto" that lands on cpu says why once per
 * process (the SDK's log; CRUN_LOG_LEVEL=info shows it). */
static int start_backend(struct crun_pg *pg, const struct pg_create_args *ca, const char *ns,
			 const int *same_host, char *err, size_t cap)
{
	struct pg_backend_args a = {.struct_size = sizeof(a),
				    .rank = pg->rank,
				    .size = pg->size,
				    .local_rank = ca->local_rank,
				    .local_world_size = ca->local_world_size,
				    .single_host = 1,
				    .timeout_ms = ca->timeout_ms,
				    .ns = ns,
				    .store = ca->store,
				    .store_set = store_set_fn,
				    .store_get = store_get_fn,
				    .free_val = crun_free,
				    .core = pg,
				    .same_host = same_host};
	int fell_back;

	for (int p = 0; p < pg->size; p++)
		a.single_host &= same_host[p];
	TRY(pg_backend_pick(ca->backend, &pg->be, &fell_back, err, cap));
	if (fell_back && !*ca->auto_noted) {
		*ca->auto_noted = 1;
		log_at(LL_INFO, SUB_PG, "backend auto: using cpu (%s)", err);
	}
	err[0] = '\0';
	if (splits_from(ca->parent, pg->be)) {
		quiesce(ca->parent);
		a.parent = ca->parent->be_ctx;
	}
	return pg->be->init(&a, &pg->be_ctx, err, cap);
}

/* Whether a new group of backend be is split from parent's communicator.
 * Members and non-members must come to the same answer, and do: both pick
 * the backend the same way and compare it with the world's. */
static int splits_from(const struct crun_pg *parent, const struct pg_backend *be)
{
	return parent && parent->be == be && be->split_skip &&
	       !atomic_load(&((struct crun_pg *)parent)->broken);
}

/* Waits until parent has no queued work: the split is an operation on its
 * communicator, which only one thread may drive at a time. */
static void quiesce(struct crun_pg *parent)
{
	pthread_mutex_lock(&parent->mu);
	while (parent->pending)
		pthread_cond_wait(&parent->cv, &parent->mu);
	pthread_mutex_unlock(&parent->mu);
}

int pg_split_skip(struct crun_pg *world, const char *backend, char *err, size_t cap)
{
	const struct pg_backend *be;
	int fell_back;

	err[0] = '\0';
	TRY(pg_backend_pick(backend, &be, &fell_back, err, cap));
	if (!splits_from(world, be))
		return 0;
	quiesce(world);
	return be->split_skip(world->be_ctx, err, cap);
}

void pg_destroy(struct crun_pg *pg)
{
	if (!pg)
		return;
	if (pg->be && pg->be_ctx)
		pg->be->fini(pg->be_ctx);
	if (pg->mu_ready) {
		pthread_mutex_destroy(&pg->mu);
		pthread_cond_destroy(&pg->cv);
	}
	free(pg->peers);
	free(pg->world_ranks);
	free(pg->scratch);
	free(pg);
}

int pg_create(const struct pg_create_args *ca, const int *world_ranks, int n,
	      struct crun_pg **ret_pg, char *ret_err, size_t cap)
{
	struct crun_pg *pg;
	int *same_host = NULL;
	char ns[96], err[512] = "";
	int r;

	pg = calloc(1, sizeof(*pg));
	if (!pg)
		return CRUN_ENOMEM;
	pg->size = n;
	pg->rank = -1;
	pg->world_rank = ca->my_world_rank;
	atomic_store(&pg->timeout_ms, ca->timeout_ms);
	pg->ring_bytes = env_size("CRUN_SHM_RING_BYTES", PG_SHM_RING_BYTES_DEFAULT, 4096, 1u << 30);
	if (pg->ring_bytes & (pg->ring_bytes - 1))
		pg->ring_bytes = PG_SHM_RING_BYTES_DEFAULT; /* must be a power of two */
	pg->ring_threshold =
	    env_size("CRUN_PG_RING_THRESHOLD", PG_RING_THRESHOLD_DEFAULT, 0, SIZE_MAX / 2);
	r = pg_fmt(pg->name, sizeof(pg->name), "%s", ca->gname);
	if (r < 0)
		goto fail;
	r = CRUN_ENOMEM;
	pg->world_ranks = calloc((size_t)n, sizeof(int));
	pg->peers = calloc((size_t)n, sizeof(*pg->peers));
	same_host = calloc((size_t)n, sizeof(int));
	if (!pg->world_ranks || !pg->peers || !same_host)
		goto fail;
	for (int p = 0; p < n; p++) {
		pg->world_ranks[p] = world_ranks[p];
		pg->peers[p].fd = -1;
		pg->peers[p].pidfd = -1;
		if (world_ranks[p] == ca->my_world_rank)
			pg->rank = p;
	}
	pg->peers[pg->rank].kind = PEER_SELF;
	if (pthread_mutex_init(&pg->mu, NULL) || pthread_cond_init(&pg->cv, NULL))
		goto fail;
	pg->mu_ready = 1;
	/* PyTorch 2.x group store "<group>/" under "default_pg", then crun's
	 * own namespace with the attempt, so a reused agent store is safe. */
	r = pg_fmt(ns, sizeof(ns), "%s//crun/a%d/", ca->gname, ca->restart_count);
	if (r == 0)
		r = find_hosts(pg, ca->store, ns, same_host);
	if (r == 0)
		r = start_backend(pg, ca, ns, same_host, err, sizeof(err));
	if (r < 0)
		goto fail;
	free(same_host);
	*ret_pg = pg;
	return 0;
fail:
	if (ret_err && cap)
		(void)pg_fmt(ret_err, cap, "pg %s: %s", ca->gname, err[0] ? err : crun_strerror(r));
	log_at(LL_DEBUG, SUB_PG, "pg %s: cannot create: %s", ca->gname,
	       err[0] ? err : crun_strerror(r));
	free(same_host);
	pg_destroy(pg);
	return r;
}

/* ---- running work ----------------------------------------------------------------- */

/* Runs one operation on the group's backend. A backend failure that breaks
 * the group (peer lost, timeout, abort) sticks: every later call returns it. */
static int run_op(struct crun_pg *pg, const struct pg_op *o)
{
	const struct pg_backend *be = pg->be;
	void *c = pg->be_ctx;
	int b = atomic_load(&pg->broken);
	int r;

	if (b)
		return b;
	if (atomic_load(&pg->aborted))
		return pg_fail(pg, CRUN_ECANCELED, "aborted");
	switch (o->kind) {
	case OP_BROADCAST:
		r = be->broadcast(c, o->rbuf, o->count, o->dtype, o->root);
		break;
	case OP_ALL_REDUCE:
		r = be->all_reduce(c, o->sbuf, o->rbuf, o->count, o->dtype, o->op);
		break;
	case OP_REDUCE:
		r = be->reduce(c, o->sbuf, o->rbuf, o->count, o->dtype, o->op, o->root);
		break;
	case OP_ALL_GATHER:
		r = be->all_gather(c, o->sbuf, o->rbuf, o->count, o->dtype);
		break;
	case OP_GATHER:
		r = be->gather(c, o->sbuf, o->rbuf, o->count, o->dtype, o->root);
		break;
	case OP_SCATTER:
		r = be->scatter(c, o->sbuf, o->rbuf, o->count, o->dtype, o->root);
		break;
	case OP_REDUCE_SCATTER:
		r = be->reduce_scatter(c, o->sbuf, o->rbuf, o->count, o->dtype, o->op);
		break;
	case OP_ALL_TO_ALL:
		r = be->all_to_all(c, o->sbuf, o->rbuf, o->count, o->dtype);
		break;
	case OP_BARRIER:
		r = be->barrier(c);
		break;
	case OP_SEND:
		r = be->send(c, o->sbuf, o->count, o->dtype, o->root);
		break;
	case OP_RECV:
		r = be->recv(c, o->rbuf, o->count, o->dtype, o->root);
		break;
	default:
		return CRUN_EINVAL;
	}
	if (r == CRUN_EPEER || r == CRUN_ETIMEDOUT || r == CRUN_ECANCELED)
		r = pg_fail(pg, r, "%s", be->last_error(c)); /* no-op if already broken */
	return r;
}

static void *progress_main(void *arg)
{
	struct crun_pg *pg = arg;

	pthread_mutex_lock(&pg->mu);
	for (;;) {
		struct crun_work *w;
		int r;

		while (!pg->q_head && !pg->stopping)
			pthread_cond_wait(&pg->cv, &pg->mu);
		if (!pg->q_head)
			break;
		w = pg->q_head;
		pg->q_head = w->next;
		if (!pg->q_head)
			pg->q_tail = NULL;
		pthread_mutex_unlock(&pg->mu);
		r = run_op(pg, &w->op);
		pthread_mutex_lock(&pg->mu);
		w->result = r;
		w->done = 1;
		pg->pending--;
		pthread_cond_broadcast(&pg->cv);
	}
	pthread_mutex_unlock(&pg->mu);
	return NULL;
}

/* Async work on a backend with its own ordered queue: enqueue it here, on
 * the caller's thread (so it keeps its place among blocking calls, which
 * enqueue the same way), and keep the backend's token for the wait. An
 * enqueue failure is the work's result, as it would be on the thread. */
static int submit_deferred(struct crun_pg *pg, const struct pg_op *o, crun_work_t **ret_work)
{
	struct crun_work *w = calloc(1, sizeof(*w));
	int r;

	if (!w)
		return CRUN_ENOMEM;
	w->pg = pg;
	w->op = *o;
	pg->be->defer(pg->be_ctx, 1);
	r = run_op(pg, o);
	pg->be->defer(pg->be_ctx, 0);
	if (r == 0)
		r = pg->be->mark(pg->be_ctx, &w->token);
	if (r < 0) {
		w->done = 1;
		w->result = r;
	}
	*ret_work = w;
	return 0;
}

/* Settles deferred work once its token reports (done or failed). */
static void settle(struct crun_work *w, int r)
{
	struct crun_pg *pg = w->pg;

	if (r == CRUN_EPEER || r == CRUN_ETIMEDOUT || r == CRUN_ECANCELED)
		r = pg_fail(pg, r, "%s", pg->be->last_error(pg->be_ctx));
	pg->be->free_token(pg->be_ctx, w->token);
	w->token = NULL;
	w->result = r;
	w->done = 1;
}

static int submit(struct crun_pg *pg, const struct pg_op *o, crun_work_t **ret_work)
{
	struct crun_work *w;
	int r;

	if (ret_work && pg->be->mark)
		return submit_deferred(pg, o, ret_work);

	if (!ret_work) {
		unsigned pending;

		pthread_mutex_lock(&pg->mu);
		pending = pg->pending;
		pthread_mutex_unlock(&pg->mu);
		/* Nothing queued: the progress thread is idle and only this
		 * thread may submit, so running here keeps the order. */
		if (!pending)
			return run_op(pg, o);
	}
	w = calloc(1, sizeof(*w));
	if (!w)
		return CRUN_ENOMEM;
	w->pg = pg;
	w->op = *o;
	pthread_mutex_lock(&pg->mu);
	if (!pg->thread_started) {
		r = pthread_create(&pg->thread, NULL, progress_main, pg);
		if (r) {
			pthread_mutex_unlock(&pg->mu);
			free(w);
			return -r;
		}
		pg->thread_started = 1;
	}
	if (pg->q_tail)
		pg->q_tail->next = w;
	else
		pg->q_head = w;
	pg->q_tail = w;
	pg->pending++;
	pthread_cond_broadcast(&pg->cv);
	pthread_mutex_unlock(&pg->mu);
	if (ret_work) {
		*ret_work = w;
		return 0;
	}
	r = crun_work_wait(w);
	free(w);
	return r;
}

int crun_work_wait(crun_work_t *w)
{
	int r;

	if (!w)
		return CRUN_EINVAL;
	if (w->token) {
		settle(w, w->pg->be->wait_token(w->pg->be_ctx, w->token));
		return w->result;
	}
	pthread_mutex_lock(&w->pg->mu);
	while (!w->done)
		pthread_cond_wait(&w->pg->cv, &w->pg->mu);
	r = w->result;
	pthread_mutex_unlock(&w->pg->mu);
	return r;
}

int crun_work_test(crun_work_t *w, int *ret_done)
{
	if (!w || !ret_done)
		return CRUN_EINVAL;
	if (w->token) {
		int done = 0;
		int r = w->pg->be->test_token(w->pg->be_ctx, w->token, &done);

		if (r < 0 || done)
			settle(w, r);
		*ret_done = w->done;
		return 0;
	}
	pthread_mutex_lock(&w->pg->mu);
	*ret_done = w->done;
	pthread_mutex_unlock(&w->pg->mu);
	return 0;
}

void crun_work_free(crun_work_t *w)
{
	if (!w)
		return;
	(void)crun_work_wait(w);
	free(w);
}

/* ---- public group calls --------------------------------------------------------------- */

void pg_stop_and_destroy(struct crun_pg *pg)
{
	if (!pg)
		return;
	pthread_mutex_lock(&pg->mu);
	while (pg->pending)
		pthread_cond_wait(&pg->cv, &pg->mu);
	pg->stopping = 1;
	pthread_cond_broadcast(&pg->cv);
	pthread_mutex_unlock(&pg->mu);
	if (pg->thread_started)
		pthread_join(pg->thread, NULL);
	pg_destroy(pg);
}

int crun_pg_rank(const crun_pg_t *pg)
{
	return pg ? pg->rank : CRUN_EINVAL;
}

int crun_pg_size(const crun_pg_t *pg)
{
	return pg ? pg->size : CRUN_EINVAL;
}

void crun_pg_set_timeout(crun_pg_t *pg, uint32_t timeout_ms)
{
	if (!pg)
		return;
	atomic_store(&pg->timeout_ms, timeout_ms);
	pg->be->set_timeout(pg->be_ctx, timeout_ms);
}

int crun_pg_abort(crun_pg_t *pg)
{
	if (!pg)
		return CRUN_EINVAL;
	atomic_store(&pg->aborted, 1);
	pg->be->abort(pg->be_ctx);
	(void)pg_fail(pg, CRUN_ECANCELED, "aborted by crun_pg_abort");
	return 0;
}

const char *crun_pg_last_error(const crun_pg_t *pg)
{
	if (!pg)
		return pg_init_last_error();
	return atomic_load(&((crun_pg_t *)pg)->broken) ? pg->last_error : "";
}

/* Shared argument checks: every size product must fit in size_t. */
static int check(const crun_pg_t *pg, size_t count, int dtype, int op, int root, int per_rank)
{
	size_t esz = crun_dtype_size(dtype), mult;

	if (!pg || !esz || op < 0 || op >= CRUN_RED_OP__MAX || root < 0 || root >= pg->size)
		return CRUN_EINVAL;
	mult = per_rank ? (size_t)pg->size : 1;
	if (count > SIZE_MAX / 8 / esz / mult)
		return CRUN_ERANGE;
	return 0;
}

#define NEED(p) ((p) || !count)

int crun_broadcast(crun_pg_t *pg, void *buf, size_t count, int dtype, int root,
		   crun_work_t **ret_work)
{
	struct pg_op o = {OP_BROADCAST, buf, buf, count, dtype, 0, root};

	TRY(check(pg, count, dtype, 0, root, 0));
	if (!NEED(buf))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_all_reduce(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int op,
		    crun_work_t **ret_work)
{
	struct pg_op o = {OP_ALL_REDUCE, sbuf, rbuf, count, dtype, op, 0};

	TRY(check(pg, count, dtype, op, 0, 0));
	if (!NEED(sbuf) || !NEED(rbuf))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_reduce(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int op,
		int root, crun_work_t **ret_work)
{
	struct pg_op o = {OP_REDUCE, sbuf, rbuf, count, dtype, op, root};

	TRY(check(pg, count, dtype, op, root, 0));
	if (!NEED(sbuf) || (pg->rank == root && !NEED(rbuf)))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_all_gather(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		    crun_work_t **ret_work)
{
	struct pg_op o = {OP_ALL_GATHER, sbuf, rbuf, count, dtype, 0, 0};

	TRY(check(pg, count, dtype, 0, 0, 1));
	if (!NEED(sbuf) || !NEED(rbuf))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_gather(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int root,
		crun_work_t **ret_work)
{
	struct pg_op o = {OP_GATHER, sbuf, rbuf, count, dtype, 0, root};

	TRY(check(pg, count, dtype, 0, root, 1));
	if (!NEED(sbuf) || (pg->rank == root && !NEED(rbuf)))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_scatter(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype, int root,
		 crun_work_t **ret_work)
{
	struct pg_op o = {OP_SCATTER, sbuf, rbuf, count, dtype, 0, root};

	TRY(check(pg, count, dtype, 0, root, 1));
	if (!NEED(rbuf) || (pg->rank == root && !NEED(sbuf)))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_reduce_scatter(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
			int op, crun_work_t **ret_work)
{
	struct pg_op o = {OP_REDUCE_SCATTER, sbuf, rbuf, count, dtype, op, 0};

	TRY(check(pg, count, dtype, op, 0, 1));
	if (!NEED(sbuf) || !NEED(rbuf))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_all_to_all(crun_pg_t *pg, const void *sbuf, void *rbuf, size_t count, int dtype,
		    crun_work_t **ret_work)
{
	struct pg_op o = {OP_ALL_TO_ALL, sbuf, rbuf, count, dtype, 0, 0};

	TRY(check(pg, count, dtype, 0, 0, 1));
	if (!NEED(sbuf) || !NEED(rbuf))
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_barrier(crun_pg_t *pg, crun_work_t **ret_work)
{
	struct pg_op o = {OP_BARRIER, NULL, NULL, 0, CRUN_U8, 0, 0};

	TRY(check(pg, 0, CRUN_U8, 0, 0, 0));
	return submit(pg, &o, ret_work);
}

int crun_send(crun_pg_t *pg, const void *buf, size_t count, int dtype, int peer,
	      crun_work_t **ret_work)
{
	struct pg_op o = {OP_SEND, buf, NULL, count, dtype, 0, peer};

	TRY(check(pg, count, dtype, 0, peer, 0));
	if (!NEED(buf) || peer == pg->rank)
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}

int crun_recv(crun_pg_t *pg, void *buf, size_t count, int dtype, int peer, crun_work_t **ret_work)
{
	struct pg_op o = {OP_RECV, NULL, buf, count, dtype, 0, peer};

	TRY(check(pg, count, dtype, 0, peer, 0));
	if (!NEED(buf) || peer == pg->rank)
		return CRUN_EINVAL;
	return submit(pg, &o, ret_work);
}
