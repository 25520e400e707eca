/* rdzv.c: the rendezvous front door (rdzv.h). It picks a backend by name
 * (--standalone is always the static one) and forwards every call through
 * the backend's table (rdzv_int.h); what a backend leaves out is answered
 * here, once, for all of them.
 */
#include <string.h>

#include "common/common.h"
#include "rendezvous/etcd_int.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/rdzv_int.h"

/* The names --rdzv_backend accepts, one row each. */
static const struct {
	const char *name;
	const struct rdzv_backend *ops;
} backends[] = {
    {"static", &rdzv_static_backend},
    {"c10d", &rdzv_c10d_backend},
    {"etcd", &rdzv_c10d_backend}, /* the same rounds, on an etcd cluster */
};

static const struct rdzv_backend *backend_of(const struct rdzv_params *p)
{
	if (p->standalone)
		return &rdzv_static_backend;
	for (size_t i = 0; i < ARRAY_SIZE(backends); i++)
		if (strcmp(p->backend, backends[i].name) == 0)
			return backends[i].ops;
	return NULL;
}

int rdzv_new(const struct rdzv_params *p, struct rdzv **ret_rdzv)
{
	const struct rdzv_backend *ops;
	struct rdzv *r;

	if (!p->base || !p->on_event || p->nproc < 1)
		return CRUN_EINVAL;
	ops = backend_of(p);
	if (!ops)
		return CRUN_ENOTSUP;
	TRY(ops->create(p, &r));
	r->ops = ops;
	*ret_rdzv = r;
	return 0;
}

void rdzv_free(struct rdzv *r)
{
	if (r)
		r->ops->free(r);
}

int rdzv_store_to_serve(const struct rdzv *r, const char **ret_host, uint16_t *ret_port)
{
	return r->ops->store_to_serve(r, ret_host, ret_port);
}

void rdzv_set_served_port(struct rdzv *r, uint16_t port)
{
	r->ops->set_served_port(r, port);
}

int rdzv_next_round(struct rdzv *r)
{
	return r->ops->next_round(r);
}

const struct rdzv_info *rdzv_info(const struct rdzv *r)
{
	return r->ops->info(r);
}

int rdzv_exit_barrier(struct rdzv *r)
{
	return r->ops->exit_barrier(r);
}

int rdzv_barrier_result(const struct rdzv *r)
{
	return r->ops->barrier_result(r);
}

int rdzv_close_failed(struct rdzv *r, const char *why)
{
	return r->ops->close_failed(r, why);
}

enum rdzv_change rdzv_change_kind(const struct rdzv *r)
{
	return r->ops->change_kind(r);
}

const char *rdzv_last_error(const struct rdzv *r)
{
	return r->ops->last_error(r);
}

bool rdzv_clears_store(const struct rdzv *r)
{
	return r->ops->clears_store && r->ops->clears_store(r);
}

const char *rdzv_peer_addrs(const struct rdzv *r)
{
	return r->ops->peer_addrs ? r->ops->peer_addrs(r) : NULL;
}

const struct store_server *rdzv_served_store(const struct rdzv *r)
{
	return r->ops->served_store ? r->ops->served_store(r) : NULL;
}

bool rdzv_worker_store_proxy(const struct rdzv *r)
{
	return r->ops->worker_store_proxy && r->ops->worker_store_proxy(r);
}

void rdzv_get_progress(const struct rdzv *r, struct rdzv_progress *ret)
{
	if (r->ops->get_progress) {
		r->ops->get_progress(r, ret);
		return;
	}
	memset(ret, 0, sizeof(*ret));
	ret->round = ret->last_call_s = ret->timeout_s = ret->nawait = -1;
}

int rdzv_failure(const struct rdzv *r)
{
	return r->ops->failure ? r->ops->failure(r) : CRUN_ERDZVCLOSED;
}

int rdzv_stacks_gather(struct rdzv *r, const char *why, uint32_t wait_ms, rdzv_gather_fn fn,
		       void *arg)
{
	return r->ops->stacks_gather
		   ? r->ops->stacks_gather(r, why, rdzv_board_wait_ms(wait_ms), fn, arg)
		   : CRUN_ENOTSUP;
}

int rdzv_endpoint_check(const char *backend, const char *endpoint, char *err, size_t cap)
{
	struct etcd_conf e = {0};

	if (strcmp(backend, "etcd") != 0)
		return CRUN_ENOTSUP;
	return etcd_parse_endpoints(endpoint, &e, err, cap);
}
