/* c10d.c: the loop glue of the elastic c10d rendezvous (c10d_int.h): the
 * rdzv_conf, the in-process rendezvous store, and turning the results of
 * helper jobs (join a round, exit barrier, close as failed: c10d_join.c; the
 * liveness monitor: monitor.c) into rdzv events. Two helper slots: one for
 * the round/barrier/fail job, one for the monitor of the completed round.
 * The loop (which may serve the rendezvous store in-process) never blocks.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "rendezvous/etcd_int.h"
#include "rendezvous/progress_int.h"
#include "rendezvous/rdzv_int.h"
#include "store/auth.h"
#include "store/server.h"
#include "store/tls.h"

#define C10D_GRACE_MS 100 /* host: after the last hang-up */

struct c10d {
	struct rdzv base; /* first: the front door's handle (rdzv_int.h) */
	struct rdzv_params p;
	struct c10d_conf conf;
	char run_id[256];
	char ep_host[RDZV_HOST_MAX];
	uint16_t ep_port;
	char hostname[RDZV_HOST_MAX];
	char addr[RDZV_HOST_MAX];	 /* advertised as MASTER_ADDR */
	struct store_server *rdzv_store; /* served in-process, or NULL */
	struct store_auth_keys *auth;	 /* its secret (auth_secret_file), or NULL */
	struct store_tls *tls;		 /* its TLS (tls_cert), or NULL */
	char *peers;			 /* the last round's node addresses, or NULL */
	bool tls_ca_set;		 /* rendezvous connections use TLS */
	uint16_t wport;			 /* this agent's worker store */
	bool have_info;
	struct rdzv_info info;
	int round, nnodes, host_member, prev_grank;
	char store_host[RDZV_HOST_MAX];
	enum rdzv_change change;
	int barrier_result; /* 0, or why the exit barrier did not pass */
	struct helper job, mon;
	struct helper board;	  /* the job board's gather (board.c) */
	rdzv_gather_fn gather_fn; /* its caller, told once it ends */
	void *gather_arg;
	uint32_t gather_ms;   /* the next gather's wait for the answers */
	int64_t ask_seen;     /* the last ask answered (-1: not known) */
	struct coord *pend_c; /* lease connection handed from the round job */
	uint64_t pend_lease, pend_kept_ms;
	bool pend_hb;
	struct etcd_conf *etcd;	 /* backend "etcd": the cluster; NULL: c10d */
	char prefix[320];	 /* the run's keys */
	struct rdzv_prog *prog;	 /* progress record (progress_int.h), or NULL */
	struct event *linger;	 /* host: waits for the other agents to hang up */
	struct event *release;	 /* others: waits for the monitor's lease revoke */
	struct c10d_fence fence; /* stops the workers of a member cut off (c10d_fence.c) */
	bool fenced;		 /* since the last round completed */
	uint64_t linger_until;
	bool lingered;
	char err[512];
	int fail_code; /* why the last RDZV_EV_FAILED: CRUN_ECONFIG = never can succeed */
};

/* ---- helper jobs ------------------------------------------------------------ */

static int job_run(struct helper_job *h)
{
	struct c10d_job *j = (struct c10d_job *)h;
	struct coord *c = NULL;
	uint32_t connect_ms = j->kind == JOB_ROUND ? j->conf.join_ms : j->conf.read_ms;
	int r;

	/* Fenced: the store went silent; redial it for as long as a monitor
	 * rides out an outage, not for a whole join_timeout. */
	if (j->kind == JOB_ROUND && j->fenced)
		connect_ms = MIN(connect_ms, C10D_OUTAGE_MS);

	if (j->kind == JOB_GATHER)
		connect_ms = MIN(connect_ms, RDZV_BOARD_GATHER_MS);
	if (j->kind == JOB_MONITOR) {
		c = j->mon_c; /* the round's lease connection */
		j->mon_c = NULL;
		r = c10d_job_monitor(j, &c);
		coord_close(c);
		return r;
	}
	char why[400] = "";
	{
		struct coord_opts o = {0};

		o.host = j->host;
		o.port = j->port;
		o.prefix = j->prefix;
		o.connect_timeout_ms = connect_ms;
		o.timeout_ms = j->conf.read_ms;
		c10d_auth_opts(&o, &j->conf, j->prefix);
		o.etcd = j->etcd;
		/* A store that cannot be reached is said at once, not only
		 * after connect_ms; the failure names the cause. */
		o.say_retry = true;
		o.err = why;
		o.err_cap = sizeof(why);
		r = coord_open(&o, &c);
	}
	if (r < 0) {
		snprintf(j->err, sizeof(j->err),
			 "cannot reach the rendezvous store at %.100s:%u%s%.100s%s%s: %s", j->host,
			 j->port, j->store_host[0] ? " (served by the agent on host '" : "",
			 j->store_host, j->store_host[0] ? "')" : "",
			 j->fenced ? " since this node fenced its workers" : "",
			 why[0] ? why : crun_strerror(r));
		if (j->kind == JOB_BARRIER)
			j->barrier = BO_FAILED;
		return r;
	}
	switch (j->kind) {
	case JOB_ROUND:
		j->take_lease = true;
		r = c10d_job_round(j, c);
		break;
	case JOB_BARRIER:
		r = c10d_job_barrier(j, c);
		break;
	case JOB_GATHER:
		r = c10d_job_gather(j, c);
		break;
	default:
		r = c10d_job_fail(j, c);
		break;
	}
	coord_close(c);
	return r;
}

int c10d_join_on(struct coord *c, const struct c10d_join_args *a, struct rdzv_info *ret_info,
		 int *ret_round, char *err, size_t cap)
{
	struct c10d_job *j = c10d_job_new(JOB_ROUND);
	int r;

	if (!j)
		return CRUN_ENOMEM;
	snprintf(j->host, sizeof(j->host), "%s", a->host ? a->host : "");
	j->port = a->port;
	if (a->etcd && etcd_prefix(a->etcd, a->run_id, j->prefix, sizeof(j->prefix)) < 0) {
		j->h.release(&j->h);
		return CRUN_EINVAL;
	}
	if (!a->etcd)
		snprintf(j->prefix, sizeof(j->prefix), "crun-c10d/%s", a->run_id);
	j->conf = a->conf;
	j->min = a->min;
	j->max = a->max;
	j->nproc = a->nproc;
	j->prev_round = a->prev_round;
	j->prev_grank = a->prev_grank;
	j->wport = a->wport;
	snprintf(j->addr, sizeof(j->addr), "%s", a->addr);
	snprintf(j->hostname, sizeof(j->hostname), "%s", a->hostname);
	if (a->lease_on_handle) {
		j->take_lease = true;
		j->lease_c = c;
	}
	r = c10d_job_round(j, c);
	if (a->ret_lease)
		*a->ret_lease = j->lease;
	if (r < 0) {
		snprintf(err, cap, "%s", j->err);
	} else if (j->outcome == RO_SPARE_DONE) {
		snprintf(err, cap, "the job ended while this node waited as a spare");
		r = CRUN_ERDZVCLOSED;
	} else {
		*ret_info = j->info;
		*ret_round = j->round;
	}
	j->h.release(&j->h);
	return r;
}

int c10d_join_blocking(const struct c10d_join_args *a, struct rdzv_info *ret_info, int *ret_round,
		       char *err, size_t cap)
{
	struct coord_opts o = {0};
	struct coord *c = NULL;
	char prefix[320], why[400] = "";
	int r;

	if (a->etcd)
		TRY(etcd_prefix(a->etcd, a->run_id, prefix, sizeof(prefix)));
	else
		TRY(str_printf(prefix, sizeof(prefix), "crun-c10d/%s", a->run_id));
	o.host = a->host;
	o.port = a->port;
	o.prefix = prefix;
	o.connect_timeout_ms = a->conf.join_ms;
	o.timeout_ms = a->conf.read_ms;
	c10d_auth_opts(&o, &a->conf, prefix);
	o.etcd = a->etcd;
	o.say_retry = true;
	o.err = why;
	o.err_cap = sizeof(why);
	r = coord_open(&o, &c);
	if (r < 0) {
		snprintf(err, cap, "cannot reach the rendezvous store: %s",
			 why[0] ? why : crun_strerror(r));
		return r;
	}
	r = c10d_join_on(c, a, ret_info, ret_round, err, cap);
	coord_close(c);
	return r;
}

/* ---- the loop side ----------------------------------------------------------- */

static int start(struct c10d *c, enum c10d_job_kind kind, const char *why)
{
	struct c10d_job *j;

	struct helper *slot = kind == JOB_MONITOR  ? &c->mon
			      : kind == JOB_GATHER ? &c->board
						   : &c->job;

	if (slot->job)
		return CRUN_EBUSY;
	j = c10d_job_new(kind);
	if (!j)
		return CRUN_ENOMEM;
	j->h.run = job_run;
	snprintf(j->host, sizeof(j->host), "%s", c->ep_host);
	j->port = c->ep_port;
	snprintf(j->prefix, sizeof(j->prefix), "%s", c->prefix);
	if (c->etcd && !(j->etcd = mem_dup(c->etcd, sizeof(*c->etcd)))) {
		j->h.release(&j->h);
		return CRUN_ENOMEM;
	}
	j->conf = c->conf;
	j->min = c->p.min_nodes;
	j->max = c->p.max_nodes;
	j->nproc = c->p.nproc;
	j->is_host = c->rdzv_store != NULL;
	j->prev_round = c->have_info ? c->round : -1;
	j->change_seen = c->change == RDZV_CHANGE_RESTART || c->change == RDZV_CHANGE_MEMBERSHIP;
	j->prev_restart = c->change == RDZV_CHANGE_RESTART;
	j->fenced = c->fenced;
	j->prev_grank = c->prev_grank;
	j->wport = c->wport;
	snprintf(j->addr, sizeof(j->addr), "%s", c->addr);
	snprintf(j->hostname, sizeof(j->hostname), "%s", c->hostname);
	snprintf(j->store_host, sizeof(j->store_host), "%s", c->store_host);
	snprintf(j->why, sizeof(j->why), "%s", why ? why : "");
	j->round = c->round;
	j->nnodes = c->nnodes;
	j->host_member = c->host_member;
	j->info = c->info;
	j->prog = rdzv_prog_ref(c->prog);
	if (kind == JOB_ROUND)
		rdzv_prog_joining(c->prog);
	if (kind == JOB_MONITOR) {
		j->mon_c = c->pend_c;
		j->lease = c->pend_lease;
		j->lease_kept_ms = c->pend_kept_ms;
		j->hb = c->pend_hb;
		atomic_store(&j->kept_ok_ms, c->pend_kept_ms ? c->pend_kept_ms : clock_now_ms());
		c->pend_c = NULL;
		j->board = c->p.stacks_answer != NULL;
		atomic_store(&j->ask_seen, c->ask_seen);
	}
	j->gather_ms = c->gather_ms;
	return helper_start(slot, &j->h);
}

/* The fence's view of the running monitor: its last renewal. */
static uint64_t mon_kept(void *arg)
{
	struct c10d *c = arg;
	struct c10d_job *j = (struct c10d_job *)c->mon.job;

	return j && j->kind == JOB_MONITOR ? atomic_load(&j->kept_ok_ms) : 0;
}

static void on_fence(void *arg)
{
	struct c10d *c = arg;

	c->fenced = true;
	c->change = RDZV_CHANGE_FENCED;
	snprintf(c->err, sizeof(c->err), "lost the rendezvous store for %g s",
		 c->conf.ttl_ms / 1000.0);
	log_at(LL_WARN, SUB_RDZV,
	       "rendezvous '%s' round %d: this node's lease at %s:%u went unrenewed for "
	       "lease_ttl (%u ms): the store may have ended it and the other nodes moved on",
	       c->run_id, c->round, c->ep_host, c->ep_port, c->conf.ttl_ms);
	c->p.on_event(RDZV_EV_PEER_CHANGED, c->p.arg);
}

/* The monitor is no longer wanted (the agent moves on or leaves). */
static void drop_mon(struct c10d *c)
{
	struct c10d_job *j = (struct c10d_job *)c->mon.job;

	if (j) /* the next round's monitor watches for the ask after it */
		c->ask_seen = atomic_load(&j->ask_seen);
	c10d_fence_stop(&c->fence);
	helper_drop(&c->mon);
}

static void on_linger(evutil_socket_t fd, short what, void *arg)
{
	struct c10d *c = arg;
	struct store_server_stats st;
	struct timeval tv = {0, 10000};

	(void)fd;
	(void)what;
	store_server_get_stats(c->rdzv_store, &st);
	if (st.conns > 0 && clock_now_ms() < c->linger_until && c->linger &&
	    evtimer_add(c->linger, &tv) == 0)
		return;
	/* The others hung up as their processes exited; give those exits a
	 * moment to finish so this node is really the last one up. */
	if (!c->lingered && c->linger) {
		struct timeval grace = {0, C10D_GRACE_MS * 1000};

		c->lingered = true;
		if (evtimer_add(c->linger, &grace) == 0)
			return;
	}
	c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
}

/* The exit barrier passed on a node that is not the store's host, and its
 * monitor gave the lease back (on_mon), or C10D_RELEASE_WAIT_MS passed. */
static void on_released(evutil_socket_t fd, short what, void *arg)
{
	struct c10d *c = arg;

	(void)fd;
	(void)what;
	if (evtimer_pending(c->release, NULL))
		evtimer_del(c->release);
	c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
}

/* Whether the running monitor still holds a lease it will give back at the
 * job's end. Its own revoke must reach the store before this process exits:
 * the store counts a connection closed with its lease as a lease expired (a
 * node lost, what an alert is for). Under load the exit won that race. */
static bool releasing(struct c10d *c)
{
	struct c10d_job *m = (struct c10d_job *)c->mon.job;

	return m && m->kind == JOB_MONITOR && m->lease && !m->hb && !atomic_load(&m->h.posted) &&
	       !atomic_load(&m->released);
}

static void barrier_ended(struct c10d *c, struct c10d_job *j)
{
	c->barrier_result = 0;
	if (j->h.result < 0 || j->barrier != BO_PASSED) {
		/* The job did not succeed everywhere: this agent must not exit 0. */
		c->barrier_result = j->barrier == BO_TIMED_OUT ? CRUN_ETIMEDOUT : CRUN_ERDZVCLOSED;
		snprintf(c->err, sizeof(c->err), "%s", j->err);
		log_at(LL_ERROR, SUB_RDZV, "%s", j->err);
	}
	/* An agent that is not the host keeps its monitor connection (and
	 * lease) until it exits, so the host, which waits for every connection
	 * to close, leaves after the others' processes. */
	if (c->rdzv_store) {
		drop_mon(c);
		/* The store leaves last: wait for every other agent to hang up
		 * (bounded), then report the barrier done. */
		c->linger_until = clock_now_ms() + C10D_DEPART_MS;
		on_linger(-1, 0, c);
		return;
	}
	if (c->barrier_result == 0 && releasing(c)) {
		struct timeval bound = {C10D_RELEASE_WAIT_MS / 1000,
					(C10D_RELEASE_WAIT_MS % 1000) * 1000};

		if (evtimer_add(c->release, &bound) == 0)
			return; /* on_mon ends the wait */
	}
	c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
}

static void round_ended(struct c10d *c, struct c10d_job *j)
{
	c->info = j->info;
	free(c->peers);
	c->peers = j->peers; /* taken */
	j->peers = NULL;
	c->round = j->round;
	c->nnodes = j->nnodes;
	c->host_member = j->host_member;
	c->prev_grank = j->info.group_rank;
	snprintf(c->store_host, sizeof(c->store_host), "%s", j->store_host);
	c->have_info = true;
	c->change = RDZV_CHANGE_NONE;
	c->fenced = false;
	coord_close(c->pend_c);
	c->pend_c = j->mon_c;
	c->pend_lease = j->lease;
	c->pend_kept_ms = j->lease_kept_ms;
	c->pend_hb = j->hb;
	j->mon_c = NULL;
	log_at(LL_NOTICE, SUB_RDZV,
	       "rendezvous '%s' round %d complete: %d node%s, group_rank=%d world_size=%d "
	       "attempt=%d master=%s:%u",
	       c->run_id, c->round, c->nnodes, c->nnodes == 1 ? "" : "s", c->info.group_rank,
	       c->info.world_size, c->info.attempt, c->info.master_addr, c->info.master_port);
	if (start(c, JOB_MONITOR, NULL) < 0)
		log_at(LL_ERROR, SUB_RDZV, "cannot start the lease monitor");
	else if (!c->rdzv_store && !c->host_member)
		/* A store this node does not serve, and no member does (crun-rdzvd,
		 * etcd): it may be cut off from it while the others are not. A
		 * member's store is lost within a TTL anyway (monitor.c). */
		c10d_fence_start(&c->fence, c->conf.ttl_ms, c->conf.hb_ms);
}

static void on_job(struct helper *h, void *arg)
{
	struct c10d *c = arg;
	struct c10d_job *j = (struct c10d_job *)helper_finish(h);
	enum rdzv_event ev = RDZV_EV_COMPLETE;

	if (!j)
		return;
	if (j->kind == JOB_BARRIER || j->kind == JOB_FAIL) {
		if (j->kind == JOB_FAIL && j->h.result < 0)
			log_at(LL_WARN, SUB_RDZV, "%s", j->err);
		if (j->kind == JOB_BARRIER) {
			barrier_ended(c, j);
		} else {
			if (c->rdzv_store)
				drop_mon(c);
			c->p.on_event(RDZV_EV_BARRIER_DONE, c->p.arg);
		}
		helper_job_put(&j->h);
		return;
	}
	if (j->h.result < 0) {
		snprintf(c->err, sizeof(c->err), "%s", j->err);
		c->fail_code = j->h.result;
		ev = RDZV_EV_FAILED;
	} else if (j->outcome == RO_SPARE_DONE) {
		ev = RDZV_EV_SPARE_DONE;
	} else {
		round_ended(c, j);
	}
	helper_job_put(&j->h);
	c->p.on_event(ev, c->p.arg);
}

static void on_mon(struct helper *h, void *arg)
{
	struct c10d *c = arg;
	struct c10d_job *j = (struct c10d_job *)h->job;

	/* A nudge (an ask of the job board) or the post of the change, or
	 * both: the change was written before the post (posted). */
	c10d_board_on_nudge(j, c->p.stacks_answer, c->p.arg);
	if (atomic_load(&j->released) && evtimer_pending(c->release, NULL))
		on_released(-1, 0, c);
	if (!atomic_load(&j->h.posted))
		return;
	c->ask_seen = atomic_load(&j->ask_seen);
	c10d_fence_stop(&c->fence); /* the monitor spoke: the agent acts on that */
	c->change = j->change;
	snprintf(c->err, sizeof(c->err), "%s", j->err);
	log_at(c->change == RDZV_CHANGE_LOST ? LL_ERROR : LL_WARN, SUB_RDZV,
	       "rendezvous '%s' round %d is over: %s", c->run_id, c->round, j->err);
	c->p.on_event(RDZV_EV_PEER_CHANGED, c->p.arg);
}

/* The job board's gather ended: its caller has the answers. */
static void on_board(struct helper *h, void *arg)
{
	struct c10d *c = arg;
	struct c10d_job *j = (struct c10d_job *)helper_finish(h);
	rdzv_gather_fn fn = c->gather_fn;

	if (!j)
		return;
	c->gather_fn = NULL;
	if (j->h.result < 0)
		log_at(LL_WARN, SUB_RDZV, "rendezvous '%s': %s", c->run_id, j->err);
	if (fn)
		fn(j->h.result, j->ask, j->answers, j->answers ? j->nnodes : 0, c->gather_arg);
	helper_job_put(&j->h);
}

/* rdzv_stacks_gather: only in a round whose monitor answers asks (a store
 * with WAIT_ANY), or no node would answer. */
static int c10d_stacks_gather(struct rdzv *rz, const char *why, uint32_t wait_ms, rdzv_gather_fn fn,
			      void *arg)
{
	struct c10d *c = (struct c10d *)rz;

	if (!c->have_info || c->pend_hb || !c->mon.job || !c->p.stacks_answer)
		return CRUN_ENOTSUP;
	if (c->board.job)
		return CRUN_EBUSY;
	c->gather_ms = wait_ms; /* start() hands it to the job */
	TRY(start(c, JOB_GATHER, why));
	c->gather_fn = fn;
	c->gather_arg = arg;
	return 0;
}

/* The local address this host uses to reach host:port (a UDP connect sends
 * nothing): what the other nodes can reach this one at, even where the host
 * name does not resolve to it (network namespaces, several interfaces). */
static int route_addr(const char *host, uint16_t port, char *buf, size_t cap)
{
	struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char ps[8];
	int fd, r = CRUN_ERESOLVE;

	if (str_printf(ps, sizeof(ps), "%u", port) < 0 || getaddrinfo(host, ps, &hints, &res))
		return CRUN_ERESOLVE;
	fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
	    getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
	    getnameinfo((struct sockaddr *)&ss, sl, buf, (socklen_t)cap, NULL, 0, NI_NUMERICHOST) ==
		0)
		r = 0;
	if (fd >= 0)
		fd_close(fd);
	freeaddrinfo(res);
	return r;
}

/* Whether host:port can be bound here (a local address, a free port):
 * probing first keeps the store's own "cannot listen" error for real
 * failures. */
static bool endpoint_bindable(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char ps[8];
	bool ok = false;
	int one = 1;

	if (str_printf(ps, sizeof(ps), "%u", port) < 0 || getaddrinfo(host, ps, &hints, &res))
		return false;
	for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			continue;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		ok = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
		fd_close(fd);
	}
	freeaddrinfo(res);
	return ok;
}

/* Someone accepts connections on host:port (a connect succeeds at once). */
static bool endpoint_accepts(const char *host, uint16_t port)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res = NULL;
	char port_s[8];
	bool ok = false;

	snprintf(port_s, sizeof(port_s), "%u", port);
	if (getaddrinfo(host, port_s, &hints, &res) != 0)
		return false;
	for (struct addrinfo *ai = res; ai && !ok; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);

		if (fd < 0)
			continue;
		ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0;
		fd_close(fd);
	}
	freeaddrinfo(res);
	return ok;
}

/* Serves the rendezvous store here when the endpoint is ours: is_host=1, or
 * auto and the endpoint address binds (a local address whose port is free). */
static void maybe_serve(struct c10d *c)
{
	struct store_server_config sc = c->conf.store; /* rdzv_conf store_* limits */
	int r;

	if (c->conf.is_host == 0)
		return;
	if (c->conf.is_host < 0 && !endpoint_bindable(c->ep_host, c->ep_port))
		return;
	if (c->tls_ca_set && !c->tls) {
		log_at(LL_INFO, SUB_RDZV,
		       "not serving the rendezvous store: tls_ca without tls_cert");
		return;
	}
	sc.host = c->conf.is_host == 1 ? NULL : c->ep_host;
	sc.port = c->ep_port;
	sc.auth = c->auth;
	sc.tls = c->tls;
	/* Two agents of one host may race for the endpoint: with SO_REUSEADDR
	 * both binds can succeed and both listens fail. The loser of a real
	 * race finds the winner listening; after a tie, try again after a
	 * random pause (bounded: 5 tries, under 0.3 s in all). */
	for (int i = 0; i < 5; i++) {
		r = store_server_new(c->p.base, &sc, &c->rdzv_store);
		if (r != CRUN_EADDRINUSE || endpoint_accepts(c->ep_host, c->ep_port))
			break;
		usleep(10000u + (unsigned)(clock_now_us() % 40000u));
	}
	if (r < 0) {
		c->rdzv_store = NULL;
		log_at(LL_INFO, SUB_RDZV, "not serving the rendezvous store on %s:%u (%s)",
		       c->ep_host, c->ep_port, crun_strerror(r));
		return;
	}
	log_at(LL_NOTICE, SUB_RDZV, "serving the rendezvous store on %s:%u", c->ep_host,
	       c->ep_port);
	/* torchrun compatibility keeps this allowed; say what it means once. */
	if (!c->auth && !c->tls_ca_set && !store_host_is_loopback(sc.host))
		log_at(LL_WARN, SUB_RDZV,
		       "the rendezvous store on %s:%u has no authentication: anyone who reaches "
		       "it can change or end this job (give it a secret: CRUN_AUTH_SECRET_FILE "
		       "or --rdzv_conf auth_secret_file=FILE)",
		       sc.host ? sc.host : "*", c->ep_port);
}

/* TLS of the store served here (tls_cert) and a check of the client side
 * (tls_ca), before any connection: a bad file is one clear error. */
static int load_tls(struct c10d *c)
{
	struct store_tls_opts o = {.cert = c->conf.tls_cert,
				   .key = c->conf.tls_key,
				   .ca = c->conf.tls_ca,
				   .min_version = c->conf.tls_min};
	struct store_tls *probe = NULL;

	if ((c->conf.tls_cert[0] || c->conf.tls_key[0]) && !c->conf.tls_ca[0]) {
		snprintf(c->err, sizeof(c->err),
			 "argument --rdzv_conf: tls_cert needs tls_ca (agents verify the store)");
		return CRUN_EINVAL;
	}
	if (!c->conf.tls_ca[0])
		return 0;
	c->tls_ca_set = true;
	TRY(store_tls_new_client(&o, &probe, c->err, sizeof(c->err)));
	store_tls_free(probe);
	if (!c->conf.tls_cert[0])
		return 0; /* this agent can only join, not serve */
	return store_tls_new_server(&o, &c->tls, c->err, sizeof(c->err));
}

/* The job's secret: rdzv_conf auth_secret_file, else the agent's
 * --auth_secret_file, else $CRUN_AUTH_SECRET_FILE. Checked here, before any
 * connection, so a bad file is one clear error. */
static int load_auth(struct c10d *c, const char *from_agent)
{
	struct store_auth_secret s;
	const char *env = getenv("CRUN_AUTH_SECRET_FILE");
	int r;

	if (!c->conf.auth_file[0] && from_agent && *from_agent)
		TRY(str_printf(c->conf.auth_file, sizeof(c->conf.auth_file), "%s", from_agent));
	if (!c->conf.auth_file[0] && env && *env)
		TRY(str_printf(c->conf.auth_file, sizeof(c->conf.auth_file), "%s", env));
	if (!c->conf.auth_file[0])
		return 0;
	r = store_auth_secret_read(c->conf.auth_file, &s, c->err, sizeof(c->err));
	if (r == 0)
		r = store_auth_keys_new(&c->auth);
	if (r == 0)
		r = store_auth_keys_add(c->auth, "", &s);
	memset(&s, 0, sizeof(s));
	return r;
}

/* Backend "etcd": master_addr is the endpoint list; rdzv_conf's etcd rows
 * (c10d.h) say how to reach and use it. */
static int etcd_setup(struct c10d *c, const struct rdzv_params *p)
{
	struct etcd_conf *e;

	e = c->etcd = calloc(1, sizeof(*c->etcd));
	if (!e)
		return CRUN_ENOMEM;
	TRY(etcd_parse_endpoints(p->master_addr, e, c->err, sizeof(c->err)));
	/* An explicit protocol wins over the endpoints' scheme. */
	if (c->conf.etcd_https >= 0)
		e->https = c->conf.etcd_https;
	snprintf(e->cacert, sizeof(e->cacert), "%s", c->conf.etcd_cacert);
	snprintf(e->cert, sizeof(e->cert), "%s", c->conf.etcd_cert);
	snprintf(e->key, sizeof(e->key), "%s", c->conf.etcd_key);
	snprintf(e->prefix, sizeof(e->prefix), "%s", c->conf.etcd_prefix);
	snprintf(e->username, sizeof(e->username), "%s", c->conf.etcd_username);
	snprintf(e->password_file, sizeof(e->password_file), "%s", c->conf.etcd_password_file);
	TRY(etcd_prefix(e, c->run_id, c->prefix, sizeof(c->prefix)));
	snprintf(c->ep_host, sizeof(c->ep_host), "%s", e->ep[0].host);
	c->ep_port = e->ep[0].port;
	return 0;
}

static void c10d_free(struct rdzv *rz);

static int c10d_new(const struct rdzv_params *p, struct rdzv **ret)
{
	struct c10d *c;
	int r;

	if (p->min_nodes < 1 || p->max_nodes < p->min_nodes || !p->master_addr || !p->master_port ||
	    !p->conf)
		return CRUN_ECONFIG;
	c = calloc(1, sizeof(*c));
	if (!c)
		return CRUN_ENOMEM;
	c->p = *p;
	c->prev_grank = -1;
	c->prog = rdzv_prog_new(p->min_nodes, p->max_nodes);
	helper_init(&c->job, p->base, on_job, c);
	helper_init(&c->mon, p->base, on_mon, c);
	helper_init(&c->board, p->base, on_board, c);
	c->ask_seen = -1;
	{
		struct helper_runner hr = {p->run_blocking, p->run_blocking_arg};

		helper_use_runner(&c->job, &hr);
		helper_use_runner(&c->mon, &hr);
		helper_use_runner(&c->board, &hr);
	}
	snprintf(c->run_id, sizeof(c->run_id), "%s", p->run_id ? p->run_id : "none");
	c->p.run_id = c->run_id;
	snprintf(c->ep_host, sizeof(c->ep_host), "%s", p->master_addr);
	c->ep_port = p->master_port;
	snprintf(c->prefix, sizeof(c->prefix), "crun-c10d/%s", c->run_id);
	/* "etcd": the same rounds, on an etcd cluster */
	c->conf = *p->conf;
	c->p.conf = &c->conf;
	r = c10d_conf_check(&c->conf, c->err, sizeof(c->err));
	if (r == 0 && strcmp(p->backend, "etcd") == 0)
		r = etcd_setup(c, p);
	if (r < 0) {
		log_at(LL_ERROR, SUB_RDZV, "%s", c->err);
		rdzv_prog_unref(c->prog);
		free(c->etcd);
		free(c);
		return CRUN_ECONFIG;
	}
	snprintf(c->hostname, sizeof(c->hostname), "%s",
		 p->hostname && *p->hostname ? p->hostname : "localhost");
	/* MASTER_ADDR of this node: --local_addr, else the endpoint address
	 * when it is a loopback one (every node on this host), else the name. */
	if (p->local_addr && *p->local_addr)
		snprintf(c->addr, sizeof(c->addr), "%s", p->local_addr);
	else if (strncmp(c->ep_host, "127.", 4) == 0 || strcmp(c->ep_host, "localhost") == 0 ||
		 strcmp(c->ep_host, "::1") == 0)
		snprintf(c->addr, sizeof(c->addr), "%s", c->ep_host);
	else if (route_addr(c->ep_host, c->ep_port, c->addr, sizeof(c->addr)) < 0)
		snprintf(c->addr, sizeof(c->addr), "%s", c->hostname);
	for (char *s = c->hostname; *s; s++)
		if (*s == ' ')
			*s = '_';
	c->linger = evtimer_new(p->base, on_linger, c);
	c->release = evtimer_new(p->base, on_released, c);
	if (!c->linger || !c->release) {
		if (c->linger)
			event_free(c->linger);
		if (c->release)
			event_free(c->release);
		rdzv_prog_unref(c->prog);
		free(c);
		return CRUN_ENOMEM;
	}
	/* An etcd cluster keeps its leases across restarts: no probes there. */
	r = c10d_fence_init(&c->fence, p->base, c->etcd ? NULL : c->ep_host, c->ep_port, mon_kept,
			    on_fence, c);
	if (r < 0) {
		c10d_free(&c->base);
		return r;
	}
	r = load_auth(c, p->auth_secret_file);
	if (r == 0)
		r = load_tls(c);
	if (r < 0) {
		log_at(LL_ERROR, SUB_RDZV, "%s", c->err[0] ? c->err : crun_strerror(r));
		c10d_free(&c->base);
		return CRUN_ECONFIG;
	}
	if (!c->etcd)
		maybe_serve(c);
	*ret = &c->base;
	return 0;
}

static void c10d_free(struct rdzv *rz)
{
	struct c10d *c = (struct c10d *)rz;

	c10d_fence_release(&c->fence);
	helper_fini(&c->board);
	helper_fini(&c->mon);
	helper_fini(&c->job);
	coord_close(c->pend_c);
	if (c->linger)
		event_free(c->linger);
	if (c->release)
		event_free(c->release);
	store_server_free(c->rdzv_store);
	store_auth_keys_free(c->auth);
	store_tls_free(c->tls);
	free(c->peers);
	free(c->etcd);
	rdzv_prog_unref(c->prog);
	free(c);
}

static void c10d_get_progress(const struct rdzv *rz, struct rdzv_progress *ret)
{
	const struct c10d *c = (const struct c10d *)rz;

	rdzv_prog_copy(c->prog, ret);
}

static int c10d_store_to_serve(const struct rdzv *rz, const char **ret_host, uint16_t *ret_port)
{
	const struct c10d *c = (const struct c10d *)rz;
	unsigned char ip[16];

	/* Every agent serves a worker store on an ephemeral port; the round's
	 * group rank 0 publishes its own as MASTER_ADDR:MASTER_PORT. It listens
	 * on that advertised address only, when it is a local IP address (a
	 * NAT'd --local_addr or a host name: every interface, as before). */
	*ret_host =
	    (inet_pton(AF_INET, c->addr, ip) == 1 || inet_pton(AF_INET6, c->addr, ip) == 1) &&
		    endpoint_bindable(c->addr, 0)
		? c->addr
		: NULL;
	*ret_port = 0;
	return 1;
}

static void c10d_set_served_port(struct rdzv *rz, uint16_t port)
{
	((struct c10d *)rz)->wport = port;
}

static int c10d_next_round(struct rdzv *rz)
{
	struct c10d *c = (struct c10d *)rz;

	drop_mon(c);
	/* A node woken in the exit barrier by a peer's restart leaves it. */
	helper_drop(&c->job);
	return start(c, JOB_ROUND, NULL);
}

static const struct rdzv_info *c10d_info(const struct rdzv *rz)
{
	const struct c10d *c = (const struct c10d *)rz;

	return c->have_info ? &c->info : NULL;
}

static bool c10d_worker_store_proxy(const struct rdzv *rz)
{
	return ((const struct c10d *)rz)->conf.worker_store_proxy;
}

static const struct store_server *c10d_served_store(const struct rdzv *rz)
{
	return ((const struct c10d *)rz)->rdzv_store;
}

static const char *c10d_peer_addrs(const struct rdzv *rz)
{
	const struct c10d *c = (const struct c10d *)rz;

	if (!c->have_info)
		return NULL;
	/* Only group rank 0's worker store is published: the others' take
	 * loopback alone (also when the addresses could not be read). */
	return c->info.group_rank == 0 && c->peers ? c->peers : "";
}

static int c10d_exit_barrier(struct rdzv *rz)
{
	struct c10d *c = (struct c10d *)rz;

	if (!c->have_info)
		return CRUN_EINVAL;
	return start(c, JOB_BARRIER, NULL);
}

static int c10d_barrier_result(const struct rdzv *rz)
{
	return ((const struct c10d *)rz)->barrier_result;
}

static int c10d_close_failed(struct rdzv *rz, const char *why)
{
	struct c10d *c = (struct c10d *)rz;

	if (!c->have_info)
		return CRUN_EINVAL;
	/* Without its store the job cannot be closed: the agent just stops. */
	if (c->change == RDZV_CHANGE_LOST)
		return CRUN_ECLOSED;
	/* A peer closed it and our monitor acknowledged: with nothing to write
	 * and no store to keep serving for the others, just stop (a job would
	 * only dial a store whose host may already be gone, for read_timeout). */
	if ((!why || !*why) && !c->rdzv_store)
		return CRUN_ECLOSED;
	helper_drop(&c->job); /* a barrier a peer's failure woke */
	/* This node writes the reason: its own monitor must not wake on it
	 * and acknowledge it as one of the others (issue 23: the host then
	 * left at once, taking the store along before the others read why).
	 * Dropped, it revokes its lease, which says nothing on the change key. */
	if (why && *why)
		helper_drop(&c->mon);
	return start(c, JOB_FAIL, why && *why ? why : NULL);
}

static enum rdzv_change c10d_change_kind(const struct rdzv *rz)
{
	return ((const struct c10d *)rz)->change;
}

static const char *c10d_last_error(const struct rdzv *rz)
{
	return ((const struct c10d *)rz)->err;
}

static int c10d_failure(const struct rdzv *rz)
{
	const struct c10d *c = (const struct c10d *)rz;

	return c->fail_code < 0 ? c->fail_code : CRUN_ERDZVCLOSED;
}

/* "c10d" and "etcd" (rdzv.c): the same rounds, on the crun store or etcd. */
const struct rdzv_backend rdzv_c10d_backend = {
    .name = "c10d",
    .create = c10d_new,
    .free = c10d_free,
    .store_to_serve = c10d_store_to_serve,
    .set_served_port = c10d_set_served_port,
    .next_round = c10d_next_round,
    .info = c10d_info,
    .exit_barrier = c10d_exit_barrier,
    .barrier_result = c10d_barrier_result,
    .close_failed = c10d_close_failed,
    .change_kind = c10d_change_kind,
    .last_error = c10d_last_error,
    .peer_addrs = c10d_peer_addrs,
    .served_store = c10d_served_store,
    .worker_store_proxy = c10d_worker_store_proxy,
    .get_progress = c10d_get_progress,
    .failure = c10d_failure,
    .stacks_gather = c10d_stacks_gather,
};
