/* static.c: the "static" rendezvous backend (and --standalone). Node ranks are
 * given on the command line; node 0's agent serves the store that both the
 * agents and the workers use (torchrun's static backend does the same). The
 * agents exchange their nproc under "<run_id>/crun/rdzv/" so that nodes with
 * different nproc get correct prefix-sum global ranks, then pass a barrier so
 * node 0 never starts (and possibly restarts and clears the store) before
 * every agent has read what it needs.
 *
 * The exchange uses the blocking client, so it runs on a helper thread and
 * posts back to the loop through a pipe: the loop (which on node 0 also serves
 * the store) never blocks.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "crun/store.h"
#include "rendezvous/c10d.h"
#include "rendezvous/etcd_int.h"
#include "rendezvous/rdzv.h"

#define RDZV_MAX_NODES 65536

enum job_kind { JOB_JOIN, JOB_BARRIER };

/* State shared with a helper thread. Two references: the rdzv's and the
 * thread's; whoever drops the last one frees it, so rdzv_free() never waits
 * for a thread blocked in the store client. */
struct rdzv_job {
	atomic_int refs;
	enum job_kind kind;
	char host[RDZV_HOST_MAX];
	uint16_t port;
	char run_id[256];
	int node_rank, nnodes, nproc;
	uint32_t join_timeout_ms, barrier_timeout_ms;
	int notify_fd; /* write end; the loop watches the read end */
	/* results, read by the loop only after the notify byte */
	int result;
	int *nprocs;
	char err[512];
};

struct rdzv {
	struct c10d *c10d; /* the c10d backend, when chosen: every call goes there */
	struct rdzv_params p;
	char run_id[256];
	char master_addr[RDZV_HOST_MAX];
	bool serve;
	uint16_t served_port;
	bool have_info;
	struct rdzv_info info;
	struct event *kick; /* deferred completion for one-node jobs */
	enum rdzv_event kick_ev;
	struct rdzv_job *job; /* running helper, or NULL */
	pthread_t thread;
	int notify_rd;
	struct event *notify_ev;
	char err[512];
};

static void job_put(struct rdzv_job *j)
{
	if (atomic_fetch_sub(&j->refs, 1) != 1)
		return;
	fd_close(j->notify_fd);
	free(j->nprocs);
	free(j);
}

int rdzv_assign_ranks(const int *nprocs, int nnodes, int me, struct rdzv_info *ret)
{
	int64_t base = 0, total = 0;

	if (!nprocs || nnodes < 1 || me < 0 || me >= nnodes)
		return CRUN_EINVAL;
	for (int i = 0; i < nnodes; i++) {
		if (nprocs[i] < 1)
			return CRUN_EINVAL;
		if (i < me)
			base += nprocs[i];
		total += nprocs[i];
	}
	if (total > INT32_MAX)
		return CRUN_ERANGE;
	ret->group_rank = me;
	ret->group_world_size = nnodes;
	ret->base_rank = (int)base;
	ret->world_size = (int)total;
	/* One role per job (as torchrun's launcher), so role ranks equal ranks. */
	ret->role_base_rank = (int)base;
	ret->role_world_size = (int)total;
	return 0;
}

static int job_fail(struct rdzv_job *j, crun_store_t *s, int r, const char *what)
{
	snprintf(j->err, sizeof(j->err), "%s: %s%s%s", what, crun_strerror(r), s ? " - " : "",
		 s ? crun_store_last_error(s) : "");
	return r;
}

static int key_printf(char *buf, size_t cap, const char *what, int v)
{
	return str_printf(buf, cap, "crun/rdzv/%s/%d", what, v);
}

/* The nproc exchange plus a barrier (see the file comment). */
static int job_join(struct rdzv_job *j, crun_store_t *s)
{
	char key[128], val[32];
	int64_t n;
	int r;

	TRY(key_printf(key, sizeof(key), "claim", j->node_rank));
	r = crun_store_add(s, key, 1, &n);
	if (r < 0)
		return job_fail(j, s, r, "claiming the node rank");
	if (n != 1) {
		snprintf(j->err, sizeof(j->err),
			 "another agent already joined run '%s' with --node_rank=%d", j->run_id,
			 j->node_rank);
		return CRUN_ECONFIG;
	}
	TRY(key_printf(key, sizeof(key), "nproc", j->node_rank));
	TRY(str_printf(val, sizeof(val), "%d", j->nproc));
	r = crun_store_set(s, key, val, strlen(val));
	if (r < 0)
		return job_fail(j, s, r, "publishing nproc");
	for (int i = 0; i < j->nnodes; i++) {
		void *v = NULL;
		size_t len;
		uint64_t np;

		TRY(key_printf(key, sizeof(key), "nproc", i));
		r = crun_store_get(s, key, j->join_timeout_ms, &v, &len);
		if (r < 0)
			return job_fail(j, s, r,
					r == CRUN_ETIMEDOUT ? "timed out waiting for an agent to "
							      "join (is every --node_rank started?)"
							    : "reading an agent's nproc");
		r = parse_uint_range(v, 1, 1u << 20, &np);
		crun_free(v);
		if (r < 0)
			return job_fail(j, NULL, CRUN_EPROTO, "bad nproc record in the store");
		j->nprocs[i] = (int)np;
	}
	r = crun_store_add(s, "crun/rdzv/joined", 1, &n);
	if (r < 0)
		return job_fail(j, s, r, "joining the start barrier");
	if (n == j->nnodes) {
		r = crun_store_set(s, "crun/rdzv/all_joined", "1", 1);
		if (r < 0)
			return job_fail(j, s, r, "closing the start barrier");
	}
	r = crun_store_wait(s, (const char *const[]){"crun/rdzv/all_joined"}, 1,
			    j->join_timeout_ms);
	if (r < 0)
		return job_fail(j, s, r, "waiting at the start barrier");
	return 0;
}

/* torchrun's 2.x exit barrier keys, plus a departure count so that node 0,
 * whose agent serves the store, leaves strictly after every other agent read
 * its wake-up. */
static int job_barrier(struct rdzv_job *j, crun_store_t *s)
{
	const char *num = "torchelastic/agent/terminal_state/num_members";
	const char *last = "torchelastic/agent/terminal_state/last_member";
	char val[32];
	int64_t n;
	int r;

	r = crun_store_add(s, num, 1, &n);
	if (r < 0)
		return job_fail(j, s, r, "exit barrier");
	if (n == j->nnodes) {
		TRY(str_printf(val, sizeof(val), "%d", j->node_rank));
		r = crun_store_set(s, last, val, strlen(val));
		if (r < 0)
			return job_fail(j, s, r, "exit barrier");
	}
	r = crun_store_wait(s, &last, 1, j->barrier_timeout_ms);
	if (r < 0)
		return job_fail(j, s, r, "exit barrier");
	if (j->node_rank != 0) {
		r = crun_store_add(s, "crun/rdzv/departed", 1, &n);
		if (r < 0)
			return job_fail(j, s, r, "exit barrier");
		if (n == j->nnodes - 1)
			r = crun_store_set(s, "crun/rdzv/departed_all", "1", 1);
		return r < 0 ? job_fail(j, s, r, "exit barrier") : 0;
	}
	r = crun_store_wait(s, (const char *const[]){"crun/rdzv/departed_all"}, 1,
			    j->barrier_timeout_ms);
	return r < 0 ? job_fail(j, s, r, "exit barrier (waiting for agents to leave)") : 0;
}

static void *job_main(void *arg)
{
	struct rdzv_job *j = arg;
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;
	char one = 1;
	ssize_t n;
	int r;

	o.host = j->host;
	o.port = j->port;
	o.connect_timeout_ms = j->kind == JOB_JOIN ? j->join_timeout_ms : 30000;
	o.timeout_ms = j->kind == JOB_JOIN ? j->join_timeout_ms : j->barrier_timeout_ms;
	o.prefix = j->run_id;
	r = crun_store_open(&o, &s);
	if (r < 0) {
		snprintf(j->err, sizeof(j->err), "cannot reach the agent store at %s:%u: %s",
			 j->host, j->port, crun_strerror(r));
	} else {
		r = j->kind == JOB_JOIN ? job_join(j, s) : job_barrier(j, s);
		crun_store_close(s);
	}
	j->result = r;
	/* The write is the release point for the results above. */
	do
		n = write(j->notify_fd, &one, 1);
	while (n < 0 && errno == EINTR);
	job_put(j);
	return NULL;
}

static void finish_job(struct rdzv *r)
{
	struct rdzv_job *j = r->job;
	enum rdzv_event ev;

	pthread_join(r->thread, NULL);
	r->job = NULL;
	/* The write end closes with the job's last reference: stop watching
	 * the pipe, or its EOF would wake the loop until the next job. */
	event_del(r->notify_ev);
	if (j->kind == JOB_BARRIER) {
		if (j->result < 0)
			log_at(LL_WARN, SUB_RDZV, "%s", j->err);
		ev = RDZV_EV_BARRIER_DONE;
	} else if (j->result < 0) {
		snprintf(r->err, sizeof(r->err), "%s", j->err);
		ev = RDZV_EV_FAILED;
	} else if (rdzv_assign_ranks(j->nprocs, j->nnodes, j->node_rank, &r->info) < 0) {
		snprintf(r->err, sizeof(r->err), "inconsistent nproc records");
		ev = RDZV_EV_FAILED;
	} else {
		snprintf(r->info.master_addr, sizeof(r->info.master_addr), "%s", r->master_addr);
		r->info.master_port = r->p.master_port;
		r->have_info = true;
		ev = RDZV_EV_COMPLETE;
	}
	job_put(j);
	r->p.on_event(ev, r->p.arg);
}

static void on_notify(evutil_socket_t fd, short what, void *arg)
{
	struct rdzv *r = arg;
	char buf[8];
	ssize_t n;

	(void)what;
	n = read(fd, buf, sizeof(buf));
	if (n <= 0 || !r->job)
		return;
	finish_job(r);
}

static void on_kick(evutil_socket_t fd, short what, void *arg)
{
	struct rdzv *r = arg;

	(void)fd;
	(void)what;
	r->p.on_event(r->kick_ev, r->p.arg);
}

static int start_job(struct rdzv *r, enum job_kind kind)
{
	struct rdzv_job *j;
	sigset_t all, saved;
	int pfd[2];
	int err;

	if (r->job)
		return CRUN_EBUSY;
	j = calloc(1, sizeof(*j));
	if (!j)
		return CRUN_ENOMEM;
	j->nprocs = calloc((size_t)r->p.nnodes, sizeof(int));
	if (!j->nprocs) {
		free(j);
		return CRUN_ENOMEM;
	}
	if (pipe2(pfd, O_CLOEXEC | O_NONBLOCK) < 0) {
		err = -errno;
		free(j->nprocs);
		free(j);
		return err;
	}
	atomic_init(&j->refs, 2);
	j->kind = kind;
	snprintf(j->host, sizeof(j->host), "%s", r->master_addr);
	j->port = r->p.master_port;
	snprintf(j->run_id, sizeof(j->run_id), "%s", r->run_id);
	j->node_rank = r->p.node_rank;
	j->nnodes = r->p.nnodes;
	j->nproc = r->p.nproc;
	j->join_timeout_ms = r->p.join_timeout_ms;
	j->barrier_timeout_ms = r->p.barrier_timeout_ms;
	j->notify_fd = pfd[1];
	if (r->notify_ev)
		event_free(r->notify_ev);
	fd_close(r->notify_rd); /* also when a failed start left no event */
	r->notify_rd = pfd[0];
	r->notify_ev = event_new(r->p.base, pfd[0], EV_READ | EV_PERSIST, on_notify, r);
	if (!r->notify_ev || event_add(r->notify_ev, NULL) < 0) {
		job_put(j);
		job_put(j);
		return CRUN_ENOMEM;
	}
	r->job = j;
	/* The helper takes no signals: they belong to the loop thread, and a
	 * write to a closed notify pipe must fail with EPIPE, not kill us. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	err = pthread_create(&r->thread, NULL, job_main, j);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	if (err) {
		r->job = NULL;
		job_put(j);
		job_put(j);
		return -err;
	}
	return 0;
}

int rdzv_new(const struct rdzv_params *p, struct rdzv **ret_rdzv)
{
	struct rdzv *r;

	if (!p->base || !p->on_event || p->nproc < 1)
		return CRUN_EINVAL;
	if ((strcmp(p->backend, "c10d") == 0 || strcmp(p->backend, "etcd") == 0) &&
	    !p->standalone) {
		struct c10d *c;

		TRY(c10d_new(p, &c));
		r = calloc(1, sizeof(*r));
		if (!r) {
			c10d_free(c);
			return CRUN_ENOMEM;
		}
		r->c10d = c;
		r->notify_rd = -1;
		*ret_rdzv = r;
		return 0;
	}
	if (strcmp(p->backend, "static") != 0 && !p->standalone)
		return CRUN_ENOTSUP;
	if (p->standalone && p->nnodes != 1)
		return CRUN_ECONFIG;
	if (p->nnodes < 1 || p->nnodes > RDZV_MAX_NODES || p->node_rank < 0 ||
	    p->node_rank >= p->nnodes)
		return CRUN_ECONFIG;
	r = calloc(1, sizeof(*r));
	if (!r)
		return CRUN_ENOMEM;
	r->p = *p;
	r->notify_rd = -1;
	snprintf(r->run_id, sizeof(r->run_id), "%s", p->run_id ? p->run_id : "none");
	r->p.run_id = r->run_id;
	if (p->standalone)
		snprintf(r->master_addr, sizeof(r->master_addr), "%s",
			 p->local_addr && *p->local_addr ? p->local_addr : "127.0.0.1");
	else
		snprintf(r->master_addr, sizeof(r->master_addr), "%s", p->master_addr);
	r->serve = p->standalone || p->node_rank == 0;
	r->kick = event_new(p->base, -1, 0, on_kick, r);
	if (!r->kick) {
		free(r);
		return CRUN_ENOMEM;
	}
	*ret_rdzv = r;
	return 0;
}

int rdzv_store_to_serve(const struct rdzv *r, const char **ret_host, uint16_t *ret_port)
{
	if (r->c10d)
		return c10d_store_to_serve(r->c10d, ret_host, ret_port);
	if (!r->serve)
		return 0;
	*ret_host = r->master_addr;
	*ret_port = r->p.standalone ? 0 : r->p.master_port;
	return 1;
}

void rdzv_set_served_port(struct rdzv *r, uint16_t port)
{
	if (r->c10d) {
		c10d_set_served_port(r->c10d, port);
		return;
	}
	r->served_port = port;
	if (r->p.standalone)
		r->p.master_port = port;
}

int rdzv_next_round(struct rdzv *r)
{
	if (r->c10d)
		return c10d_next_round(r->c10d);
	/* Static membership never changes: later rounds (restarts) reuse the
	 * first round's answer; re-running the exchange would race with node
	 * 0 clearing the store between attempts. */
	if (r->have_info || r->p.nnodes == 1) {
		if (!r->have_info) {
			int one[1] = {r->p.nproc};

			TRY(rdzv_assign_ranks(one, 1, 0, &r->info));
			snprintf(r->info.master_addr, sizeof(r->info.master_addr), "%s",
				 r->master_addr);
			r->info.master_port = r->p.master_port;
			r->have_info = true;
		}
		r->kick_ev = RDZV_EV_COMPLETE;
		event_active(r->kick, 0, 0);
		return 0;
	}
	return start_job(r, JOB_JOIN);
}

const struct rdzv_info *rdzv_info(const struct rdzv *r)
{
	if (r->c10d)
		return c10d_info(r->c10d);
	return r->have_info ? &r->info : NULL;
}

const char *rdzv_peer_addrs(const struct rdzv *r)
{
	return r->c10d ? c10d_peer_addrs(r->c10d) : NULL;
}

int rdzv_exit_barrier(struct rdzv *r)
{
	if (r->c10d)
		return c10d_exit_barrier(r->c10d);
	if (r->p.nnodes == 1) {
		r->kick_ev = RDZV_EV_BARRIER_DONE;
		event_active(r->kick, 0, 0);
		return 0;
	}
	return start_job(r, JOB_BARRIER);
}

const char *rdzv_last_error(const struct rdzv *r)
{
	return r->c10d ? c10d_last_error(r->c10d) : r->err;
}

enum rdzv_change rdzv_change_kind(const struct rdzv *r)
{
	return r->c10d ? c10d_change_kind(r->c10d) : RDZV_CHANGE_NONE;
}

int rdzv_close_failed(struct rdzv *r, const char *why)
{
	return r->c10d ? c10d_close_failed(r->c10d, why) : CRUN_ENOTSUP;
}

int rdzv_conf_check(const char *backend, const char *conf, char *err, size_t cap)
{
	struct c10d_conf c;
	struct etcd_conf e = {0};
	char rest[1024];

	if (strcmp(backend, "etcd") == 0) {
		TRY(etcd_parse_conf(conf, &e, rest, sizeof(rest), err, cap));
		return c10d_parse_conf(rest, &c, err, cap);
	}
	if (strcmp(backend, "c10d") != 0)
		return CRUN_ENOTSUP;
	return c10d_parse_conf(conf, &c, err, cap);
}

int rdzv_endpoint_check(const char *backend, const char *endpoint, char *err, size_t cap)
{
	struct etcd_conf e = {0};

	if (strcmp(backend, "etcd") != 0)
		return CRUN_ENOTSUP;
	return etcd_parse_endpoints(endpoint, &e, err, cap);
}

void rdzv_free(struct rdzv *r)
{
	if (!r)
		return;
	c10d_free(r->c10d);
	if (r->job) {
		pthread_detach(r->thread);
		job_put(r->job);
	}
	if (r->notify_ev)
		event_free(r->notify_ev);
	if (r->notify_rd >= 0)
		fd_close(r->notify_rd);
	if (r->kick)
		event_free(r->kick);
	free(r);
}
