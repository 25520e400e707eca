/* rdzv_sim.c: the 12k-node rendezvous, simulated on one machine. K agents run
 * crun's real c10d round logic -- c10d_job_round (rendezvous/c10d_join.c) over
 * coord_store.c over the blocking store client (store/client/), then the
 * liveness monitor c10d_job_monitor (monitor.c), exactly the job bodies an
 * agent's helper thread runs -- against a real store on loopback (crun-rdzvd,
 * a separate process), with ONE connection per agent (its lease on that same
 * connection, as c10d_join_on's lease_on_handle does).
 *
 * Not one thread per agent: every agent is a coroutine (sim_switch below, a lazily
 * touched mmap'd stack) and one epoll loop schedules them. The library is
 * linked unchanged; the linker (--wrap, see the Makefile) routes the blocking
 * primitives its client uses through this file: poll() on one socket parks
 * the coroutine until epoll reports the socket or its deadline passes,
 * poll(NULL, 0, ms) and usleep() become timers, connect() first binds one of
 * --sources loopback source addresses (connect's port search slows down past
 * half the ephemeral range per address pair), and send()/recv() count each
 * agent's requests and bytes. Time is the machine's monotonic clock: the
 * simulation runs in real time, at the speed the store and this loop manage.
 *
 * The run (one JSON line per phase on stdout):
 *   form  K - --late agents start (at most --inflight connecting at once) and
 *         form a round; --kill-join N of them are killed (connection reset)
 *         while they join, --kill-join-ms (default 0) after the last one
 *         connected;
 *   late  (--late L) L more agents start: the running round makes room
 *         ("join" change) and a round of everyone forms;
 *   fail  (--kill N, --cut N) N members are killed (reset: the store ends
 *         their leases at once) or cut off (never serviced again, socket left
 *         open: their leases lapse after the TTL); the survivors' monitors
 *         see the change and the next round forms without them.
 * Each phase reports seconds to the last member's assignment, the detection
 * (first monitor to post a change after the injection), the store requests
 * and bytes (sent + received) per agent in the round it formed, and whether
 * every member's group rank is unique and the ranks are 0..n-1.
 *
 *   rdzv_sim --port P -k K [--min M] [--late L] [--kill N] [--cut N]
 *            [--kill-join N --kill-join-ms MS] [--seed S] [--conf RDZV_CONF]
 *            [--sources N] [--inflight N] [--timeout S]
 * Exit 0 when every phase formed with valid ranks, 1 otherwise, 2 on bad flags.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <ucontext.h>
#include <unistd.h>

#include "agent/cli_rdzv_int.h"
#include "common/common.h"
#include "rendezvous/c10d_int.h"
#include "rendezvous/coord.h"
#include "store/store.h"
#include "store/store_ext.h"

#define SIM_K_MAX	16384
#define SIM_STACK	(256u * 1024) /* virtual; only touched pages cost memory */
#define SIM_ROUNDS	64	      /* rounds tracked; a run needs a handful */
#define SIM_EVENTS	1024
#define SIM_SOURCES_MAX 64
#define SIM_URGENT_US	20000 /* see make_ready */
#define SIM_BATCH	8     /* resumes between looks at epoll */

/* The library's own calls land in __wrap_X; __real_X is libc's. */
int __real_poll(struct pollfd *fds, nfds_t n, int ms);
int __real_usleep(useconds_t us);
int __real_connect(int fd, const struct sockaddr *sa, socklen_t len);
ssize_t __real_send(int fd, const void *p, size_t len, int flags);
ssize_t __real_recv(int fd, void *p, size_t len, int flags);
int __wrap_poll(struct pollfd *fds, nfds_t n, int ms);
int __wrap_usleep(useconds_t us);
int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len);
ssize_t __wrap_send(int fd, const void *p, size_t len, int flags);
ssize_t __wrap_recv(int fd, void *p, size_t len, int flags);

/* ---- coroutines ------------------------------------------------------------
 * glibc's swapcontext saves and restores the signal mask: one rt_sigprocmask
 * syscall per switch (with the switch itself ~7% of this program's CPU at
 * K = 12,288). On x86-64 sim_switch keeps only what a called function must
 * preserve - rbx, rbp, r12-r15, the stack pointer, the SSE and x87 control
 * words - which is all a coroutine that never touches its signal mask
 * needs. ASan builds (and other machines) keep ucontext: ASan must be told
 * about stack switches, and swapcontext is what it intercepts. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define SIM_FAST_SWITCH 1
struct fiber {
	void *sp; /* its saved stack pointer, at the frame sim_switch pushed */
};
/* Saves the callee-saved state on the current stack, *save = its stack
 * pointer, then resumes the one at `to` (a frame sim_switch pushed, or
 * fiber_make's first one). */
void sim_switch(void **save, void *to);
__asm__(".text\n"
	".p2align 4\n"
	".type sim_switch, @function\n"
	"sim_switch:\n"
	"	pushq %rbp\n"
	"	pushq %rbx\n"
	"	pushq %r12\n"
	"	pushq %r13\n"
	"	pushq %r14\n"
	"	pushq %r15\n"
	"	subq $8, %rsp\n"
	"	stmxcsr (%rsp)\n"
	"	fnstcw 4(%rsp)\n"
	"	movq %rsp, (%rdi)\n"
	"	movq %rsi, %rsp\n"
	"	ldmxcsr (%rsp)\n"
	"	fldcw 4(%rsp)\n"
	"	addq $8, %rsp\n"
	"	popq %r15\n"
	"	popq %r14\n"
	"	popq %r13\n"
	"	popq %r12\n"
	"	popq %rbx\n"
	"	popq %rbp\n"
	"	ret\n"
	".size sim_switch, .-sim_switch\n");
#else
#define SIM_FAST_SWITCH 0
struct fiber {
	ucontext_t uc;
};
#endif

enum agent_state { A_IDLE, A_CONNECTING, A_JOINING, A_MONITOR, A_DEAD, A_CUT, A_FAILED };

struct agent {
	int idx;
	enum agent_state state;
	struct fiber ctx;
	void *stack;
	struct coord *c;
	struct c10d_job *j;
	/* what it waits for: a socket (fd, events) and/or a deadline */
	int fd, reg_fd;
	short want;
	unsigned pending; /* epoll events seen since it last found the socket idle */
	bool queued, waiting_io;
	uint64_t deadline_us; /* 0: none */
	int heap_i;	      /* index in the timer heap, -1 when not in it */
	/* counters (wrapped send/recv) and the last round's result */
	uint64_t sends, bytes, r_sends, r_bytes;
	uint16_t *ops; /* requests by op code in the round being joined (A_JOINING) */
	int round, grank, nnodes;
	char err[160];
};

struct round_stat {
	int n, formed; /* members, members that got their assignment */
	uint64_t sends, bytes, max_sends, max_bytes;
	uint64_t ops[256]; /* the members' requests by op code (v2 and extension) */
	uint64_t t_last_us;
	unsigned char *seen; /* group ranks taken, max bytes */
	bool dup;
};

struct sim {
	/* flags */
	const char *host;
	uint16_t port;
	char prefix[320];
	struct c10d_conf conf;
	int k, min, max, late, kill, cut, kill_join, sources, inflight;
	uint32_t kill_join_ms;
	uint64_t seed;
	uint32_t timeout_s;
	/* scheduler */
	int ep;
	struct fiber main_ctx;
	struct agent *cur, *agents;
	struct agent **ready, **heap;
	int rq_head, rq_len, heap_n;
	/* the run */
	int started, connecting, live;
	int phase; /* 0 form, 1 late, 2 fail, 3 done */
	uint64_t t0_us, phase_us, inject_us, detect_us, connected_us;
	bool injected_join;
	int last_rd; /* the newest round reported */
	bool verbose;
	bool recv_edges; /* every read goes through recv() (no TLS): see __wrap_recv */
	uint64_t next_status_us;
	struct round_stat rs[SIM_ROUNDS];
	int failures;
};

/* The simulation is one process-wide object: the wrapped libc calls have no
 * argument to find it through. Set once in main. */
static struct sim *g_sim;

/* ---- timer heap (one deadline per agent) ------------------------------------ */

static void heap_swap(struct sim *s, int a, int b)
{
	struct agent *t = s->heap[a];

	s->heap[a] = s->heap[b];
	s->heap[b] = t;
	s->heap[a]->heap_i = a;
	s->heap[b]->heap_i = b;
}

static void heap_fix(struct sim *s, int i)
{
	while (i > 0 && s->heap[(i - 1) / 2]->deadline_us > s->heap[i]->deadline_us) {
		heap_swap(s, i, (i - 1) / 2);
		i = (i - 1) / 2;
	}
	for (;;) {
		int l = 2 * i + 1, m = i;

		if (l < s->heap_n && s->heap[l]->deadline_us < s->heap[m]->deadline_us)
			m = l;
		if (l + 1 < s->heap_n && s->heap[l + 1]->deadline_us < s->heap[m]->deadline_us)
			m = l + 1;
		if (m == i)
			return;
		heap_swap(s, i, m);
		i = m;
	}
}

static void heap_del(struct sim *s, struct agent *a)
{
	int i = a->heap_i;

	if (i < 0)
		return;
	a->heap_i = -1;
	if (i == --s->heap_n)
		return;
	s->heap[i] = s->heap[s->heap_n];
	s->heap[i]->heap_i = i;
	heap_fix(s, i);
}

static void heap_add(struct sim *s, struct agent *a)
{
	a->heap_i = s->heap_n;
	s->heap[s->heap_n++] = a;
	heap_fix(s, a->heap_i);
}

/* ---- run queue and switching ----------------------------------------------- */

/* Queues a parked agent. An agent whose socket became ready while it waits
 * with a short deadline (a store call with a small timeout) goes first, as
 * a woken thread would get a core at once: a long run queue must not turn
 * into timeouts that threads would not see. */
static void make_ready(struct sim *s, struct agent *a)
{
	bool urgent =
	    a->waiting_io && a->deadline_us && a->deadline_us < clock_now_us() + SIM_URGENT_US;

	if (a->queued || a->state == A_DEAD || a->state == A_CUT)
		return;
	heap_del(s, a);
	a->waiting_io = false;
	a->queued = true;
	if (urgent) {
		s->rq_head = (s->rq_head + s->k - 1) % s->k;
		s->ready[s->rq_head] = a;
		s->rq_len++;
		return;
	}
	s->ready[(s->rq_head + s->rq_len++) % s->k] = a;
}

/* From the running context (saved into `from`) to `to`. */
static void fiber_switch(struct fiber *from, struct fiber *to)
{
#if SIM_FAST_SWITCH
	sim_switch(&from->sp, to->sp);
#else
	swapcontext(&from->uc, &to->uc);
#endif
}

/* Parks the running agent until make_ready; the scheduler runs meanwhile. */
static void park(struct sim *s)
{
	struct agent *a = s->cur;

	if (a->deadline_us)
		heap_add(s, a);
	fiber_switch(&a->ctx, &s->main_ctx);
}

static struct agent *running(void)
{
	return g_sim ? g_sim->cur : NULL;
}

/* ---- the wrapped primitives ------------------------------------------------- */

static unsigned poll_to_ep(short ev)
{
	return (ev & POLLIN ? EPOLLIN : 0) | (ev & POLLOUT ? EPOLLOUT : 0);
}

/* Registers the socket edge-triggered for everything once: an edge that
 * arrives while its agent is not waiting is kept in `pending`. */
static int watch_fd(struct sim *s, struct agent *a, int fd)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
				 .data.u32 = (uint32_t)a->idx};

	if (a->reg_fd == fd)
		return 0;
	if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0 &&
	    (errno != EEXIST || epoll_ctl(s->ep, EPOLL_CTL_MOD, fd, &ev) < 0))
		return -1;
	a->reg_fd = fd;
	a->pending = EPOLLIN | EPOLLOUT; /* not yet known: look before parking */
	return 0;
}

int __wrap_poll(struct pollfd *fds, nfds_t n, int ms)
{
	struct agent *a = running();
	struct sim *s = g_sim;
	uint64_t deadline;

	if (!a || n > 1)
		return __real_poll(fds, n, ms);
	deadline = ms < 0 ? 0 : clock_now_us() + (uint64_t)ms * 1000u;
	if (n == 0) {
		if (ms <= 0)
			return 0;
		a->deadline_us = deadline;
		park(s);
		a->deadline_us = 0;
		return 0;
	}
	if (watch_fd(s, a, fds[0].fd) < 0)
		return __real_poll(fds, n, ms);
	for (int i = 0; i < 1 << 20; i++) {
		unsigned want = poll_to_ep(fds[0].events) | EPOLLERR | EPOLLHUP | EPOLLRDHUP;

		bool expired = ms == 0 || (ms > 0 && clock_now_us() >= deadline);

		/* Input seen and not yet read to the end (see __wrap_recv):
		 * readable, as poll() would say, without asking the kernel. */
		if (s->recv_edges && (fds[0].events & ~POLLIN) == 0 && (a->pending & EPOLLIN) &&
		    !expired && fds[0].fd == a->reg_fd) {
			fds[0].revents = POLLIN;
			return 1;
		}
		/* An edge not yet harvested may be on its way: at the deadline
		 * look once more, as poll() would have returned the socket. */
		if ((a->pending & want) || expired) {
			int r = __real_poll(fds, 1, 0);

			if (r != 0 || expired)
				return r;
			a->pending &= ~want; /* seen idle: the next edge is news */
		}
		a->fd = fds[0].fd;
		a->want = fds[0].events;
		a->waiting_io = true;
		a->deadline_us = deadline;
		park(s);
		a->deadline_us = 0;
		a->fd = -1;
	}
	return 0;
}

int __wrap_usleep(useconds_t us)
{
	struct agent *a = running();

	if (!a)
		return __real_usleep(us);
	if (a->j && helper_stopping(&a->j->h))
		return 0; /* the monitor was told to stop: do not sit out a heartbeat */
	a->deadline_us = clock_now_us() + us;
	park(g_sim);
	a->deadline_us = 0;
	return 0;
}

int __wrap_connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	struct agent *a = running();
	const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

	if (a && g_sim->sources > 1 && sa->sa_family == AF_INET &&
	    (ntohl(in->sin_addr.s_addr) >> 24) == 127) {
		struct sockaddr_in src = {.sin_family = AF_INET};
		int one = 1;

		/* 127.0.0.1, .2, ...: the port is chosen at connect, per pair */
		src.sin_addr.s_addr = htonl(0x7f000001u + (uint32_t)(a->idx % g_sim->sources));
		(void)setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
		(void)bind(fd, (struct sockaddr *)&src, sizeof(src));
	}
	return __real_connect(fd, sa, len);
}

ssize_t __wrap_send(int fd, const void *p, size_t len, int flags)
{
	struct agent *a = running();
	ssize_t n = __real_send(fd, p, len, flags);

	if (a && n > 0) {
		a->sends++;
		a->bytes += (uint64_t)n;
		/* The client writes each request with one send: its first
		 * byte is the op code (a partial send is counted as sent). */
		if (a->ops && a->state == A_JOINING && a->ops[*(const uint8_t *)p] < UINT16_MAX)
			a->ops[*(const uint8_t *)p]++;
	}
	return n;
}

/* A read that came back short (or EAGAIN) emptied the socket: its input
 * edge is consumed, the next one epoll reports (harvest) is news. Until
 * then __wrap_poll answers "readable" by itself - one poll() syscall fewer
 * per reply. */
ssize_t __wrap_recv(int fd, void *p, size_t len, int flags)
{
	struct agent *a = running();
	ssize_t n = __real_recv(fd, p, len, flags);

	if (a && n > 0)
		a->bytes += (uint64_t)n;
	if (a && fd == a->reg_fd &&
	    ((n >= 0 && (size_t)n < len) || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))))
		a->pending &= ~(unsigned)EPOLLIN;
	return n;
}

/* ---- one agent ---------------------------------------------------------------- */

static double secs(uint64_t from_us, uint64_t to_us)
{
	return to_us > from_us ? (double)(to_us - from_us) / 1e6 : 0.0;
}

/* Its assignment in round rd: counted into the round's stats. */
static void formed(struct sim *s, struct agent *a)
{
	struct round_stat *st;

	if (a->round < 0 || a->round >= SIM_ROUNDS) {
		s->failures++;
		return;
	}
	st = &s->rs[a->round];
	if (!st->seen)
		st->seen = calloc((size_t)s->max, 1);
	if (!st->seen) {
		s->failures++;
		return;
	}
	if (!st->n)
		st->n = a->nnodes;
	if (st->n != a->nnodes || a->grank < 0 || a->grank >= st->n || st->seen[a->grank])
		st->dup = true;
	else
		st->seen[a->grank] = 1;
	st->formed++;
	for (int i = 0; a->ops && i < 256; i++)
		st->ops[i] += a->ops[i];
	st->sends += a->r_sends;
	st->bytes += a->r_bytes;
	st->max_sends = MAX(st->max_sends, a->r_sends);
	st->max_bytes = MAX(st->max_bytes, a->r_bytes);
	st->t_last_us = clock_now_us();
}

static void agent_fail(struct agent *a, const char *what, const char *detail)
{
	snprintf(a->err, sizeof(a->err), "%s: %.140s", what, detail);
	a->state = A_FAILED;
	g_sim->live--;
	g_sim->failures++;
}

static void agent_body(struct sim *s, struct agent *a)
{
	struct coord_opts o = {0};
	int prev_round = -1, prev_grank = -1, r;
	bool change_seen = false;

	o.host = s->host;
	o.port = s->port;
	o.prefix = s->prefix;
	o.connect_timeout_ms = s->conf.join_ms;
	o.timeout_ms = s->conf.read_ms;
	c10d_auth_opts(&o, &s->conf, s->prefix);
	r = coord_open(&o, &a->c);
	s->connecting--;
	if (r < 0) {
		agent_fail(a, "connect", crun_strerror(r));
		return;
	}
	for (int rounds = 0; rounds < SIM_ROUNDS; rounds++) {
		struct c10d_job *j = c10d_job_new(JOB_ROUND);
		uint64_t s0, b0;

		if (!j) {
			agent_fail(a, "job", "out of memory");
			return;
		}
		/* what c10d_join_on sets up for a join on an open handle */
		snprintf(j->host, sizeof(j->host), "%s", s->host);
		j->port = s->port;
		snprintf(j->prefix, sizeof(j->prefix), "%s", s->prefix);
		j->conf = s->conf;
		j->min = s->min;
		j->max = s->max;
		j->nproc = 8;
		j->prev_round = prev_round;
		j->prev_grank = prev_grank;
		j->change_seen = change_seen; /* as c10d.c's start() */
		j->wport = 29500;
		snprintf(j->addr, sizeof(j->addr), "127.0.0.1");
		snprintf(j->hostname, sizeof(j->hostname), "node%05d", a->idx);
		j->take_lease = true;
		j->lease_c = a->c;
		a->j = j;
		if (!a->ops)
			a->ops = calloc(256, sizeof(*a->ops));
		if (a->ops)
			memset(a->ops, 0, 256 * sizeof(*a->ops));
		a->state = A_JOINING;
		s0 = a->sends;
		b0 = a->bytes;
		r = c10d_job_round(j, a->c);
		if (r < 0 || j->outcome == RO_SPARE_DONE) {
			agent_fail(a, "round", r < 0 ? j->err : "the job ended while a spare");
			return;
		}
		a->r_sends = a->sends - s0;
		a->r_bytes = a->bytes - b0;
		a->round = j->round;
		a->grank = j->info.group_rank;
		a->nnodes = j->nnodes;
		formed(s, a);
		/* the monitor, as the agent's second helper slot runs it, on
		 * the same connection (it holds the lease) */
		a->state = A_MONITOR;
		j->kind = JOB_MONITOR;
		j->lease_c = NULL;
		r = c10d_job_monitor(j, &a->c);
		if (r < 0) {
			agent_fail(a, "monitor", j->err);
			return;
		}
		prev_round = j->round;
		prev_grank = j->info.group_rank;
		change_seen =
		    j->change == RDZV_CHANGE_RESTART || j->change == RDZV_CHANGE_MEMBERSHIP;
		a->j = NULL;
		j->h.release(&j->h);
	}
	agent_fail(a, "rounds", "too many rounds");
}

/* A coroutine's first frame: the agent the scheduler switched to. It
 * never returns: at its end it goes back to the scheduler for good (a
 * failed agent is never run again). */
static void agent_entry(void)
{
	struct agent *a = g_sim->cur;

	agent_body(g_sim, a);
	if (a->state != A_FAILED) {
		a->state = A_FAILED;
		g_sim->live--;
	}
	fiber_switch(&a->ctx, &g_sim->main_ctx);
	abort(); /* not reached */
}

/* The context that starts agent_entry on the stack st[0..size). */
static int fiber_make(struct fiber *f, char *st, size_t size)
{
#if SIM_FAST_SWITCH
	/* What sim_switch pops, from the top of a 16-byte aligned stack: no
	 * return address for agent_entry (it never returns; at its entry the
	 * stack is 8 off 16, as after a call), agent_entry for the ret, six
	 * zeroed registers, MXCSR 0x1f80 and x87 control word 0x37f (the
	 * ABI's initial values). */
	uint64_t *sp = (uint64_t *)(((uintptr_t)st + size) & ~(uintptr_t)15);

	*--sp = 0;
	*--sp = (uint64_t)(uintptr_t)agent_entry;
	for (int i = 0; i < 6; i++)
		*--sp = 0;
	*--sp = 0x037f00001f80ull;
	f->sp = sp;
	return 0;
#else
	if (getcontext(&f->uc) < 0)
		return CRUN_EIO;
	f->uc.uc_stack.ss_sp = st;
	f->uc.uc_stack.ss_size = size;
	f->uc.uc_link = NULL; /* agent_entry switches back itself */
	makecontext(&f->uc, agent_entry, 0);
	return 0;
#endif
}

static int agent_start(struct sim *s, struct agent *a)
{
	long pg = sysconf(_SC_PAGESIZE);
	char *st = mmap(NULL, SIM_STACK, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);

	if (st == MAP_FAILED)
		return CRUN_ENOMEM;
	(void)mprotect(st, (size_t)pg, PROT_NONE); /* overflow faults, not corrupts */
	a->stack = st;
	if (fiber_make(&a->ctx, st, SIM_STACK) < 0)
		return CRUN_EIO;
	a->state = A_CONNECTING;
	s->started++;
	s->connecting++;
	s->live++;
	make_ready(s, a);
	return 0;
}

/* ---- faults -------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

/* Picks up to n agents in state `from` (seeded) and kills (reset: the store
 * sees the connection end now) or cuts them (never serviced again). */
static int inject(struct sim *s, enum agent_state from, int n, bool cut)
{
	int *pool = malloc(sizeof(int) * (size_t)s->k), np = 0, done = 0;

	if (!pool)
		return 0;
	for (int i = 0; i < s->k; i++)
		if (s->agents[i].state == from)
			pool[np++] = i;
	for (; done < n && np > 0; done++) {
		int p = (int)(rng_next(&s->seed) % (uint64_t)np);
		struct agent *a = &s->agents[pool[p]];

		pool[p] = pool[--np];
		heap_del(s, a);
		a->state = cut ? A_CUT : A_DEAD;
		s->live--;
		if (!cut && a->reg_fd >= 0) {
			struct linger lg = {.l_onoff = 1, .l_linger = 0};

			(void)setsockopt(a->reg_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			(void)epoll_ctl(s->ep, EPOLL_CTL_DEL, a->reg_fd, NULL);
			close(a->reg_fd); /* crun's own handle is never touched again */
		}
	}
	free(pool);
	return done;
}

/* ---- the run --------------------------------------------------------------- */

/* The newest round whose every member has its assignment, with n == live. */
static int complete_round(const struct sim *s)
{
	for (int r = SIM_ROUNDS - 1; r >= 0; r--)
		if (s->rs[r].n && s->rs[r].formed == s->rs[r].n && s->rs[r].n == s->live)
			return r;
	return -1;
}

static void report(struct sim *s, const char *phase, int rd)
{
	const struct round_stat *st = &s->rs[rd];
	bool ranks_ok = !st->dup && st->formed == st->n;

	printf("{\"phase\":\"%s\",\"k\":%d,\"n\":%d,\"round\":%d,\"t_s\":%.3f,", phase, s->k, st->n,
	       rd, secs(s->phase_us, st->t_last_us));
	if (!strcmp(phase, "form"))
		printf("\"t_connect_s\":%.3f,", secs(s->phase_us, s->connected_us));
	if (s->inject_us && s->detect_us) /* no change seen: nothing to say */
		printf("\"detect_s\":%.3f,\"reform_s\":%.3f,", secs(s->inject_us, s->detect_us),
		       secs(s->detect_us, st->t_last_us));
	/* Which requests a member made, per member (v2 codes, then crun's). */
	printf("\"ops\":{");
	for (int i = 0, first = 1; i < 256 && st->n; i++) {
		int op = store_proto_op_from_code(STORE_V2, (uint8_t)i);
		const char *name = store_ext_is_op((uint8_t)i) ? store_ext_op_name((uint8_t)i)
				   : op >= 0		       ? store_proto_op_name(op)
							       : "?";

		if (!st->ops[i])
			continue;
		printf("%s\"%s\":%.2f", first ? "" : ",", name, (double)st->ops[i] / st->n);
		first = 0;
	}
	printf("},");
	printf("\"req_per_agent\":%.1f,\"req_max\":%" PRIu64 ",\"bytes_per_agent\":%.0f,"
	       "\"bytes_max\":%" PRIu64 ",\"ranks_ok\":%s}\n",
	       (double)st->sends / st->n, st->max_sends, (double)st->bytes / st->n, st->max_bytes,
	       ranks_ok ? "true" : "false");
	fflush(stdout);
	if (!ranks_ok)
		s->failures++;
}

/* Moves the run on: paced starts, the timed kill, the end of each phase (a
 * round newer than the last one reported whose members are every live
 * agent, all with their assignment). */
static void drive(struct sim *s, uint64_t now)
{
	int upto = s->phase == 0 ? s->k - s->late : s->k, rd;

	while (s->started < upto && s->connecting < s->inflight)
		if (agent_start(s, &s->agents[s->started]) < 0)
			s->failures++, s->started++;
	if (s->started == upto && !s->connecting && !s->connected_us)
		s->connected_us = now;
	/* mid-join: --kill-join-ms after the last agent connected (its
	 * ticket, the one that completes the round, is still to come) */
	if (s->phase == 0 && s->kill_join && !s->injected_join && s->connected_us &&
	    now >= s->connected_us + (uint64_t)s->kill_join_ms * 1000u) {
		s->injected_join = true;
		s->inject_us = now;
		if (inject(s, A_JOINING, s->kill_join, false) < s->kill_join)
			fprintf(stderr, "rdzv_sim: fewer than %d agents were joining\n",
				s->kill_join);
	}
	if (s->started < upto || s->connecting)
		return;
	if (s->phase == 2 && !s->inject_us) {
		s->inject_us = s->phase_us = now;
		inject(s, A_MONITOR, s->kill, false);
		inject(s, A_MONITOR, s->cut, true);
		return;
	}
	rd = complete_round(s);
	if (rd <= s->last_rd)
		return;
	s->last_rd = rd;
	report(s, s->phase == 0 ? "form" : s->phase == 1 ? "late" : "fail", rd);
	s->phase = s->phase == 0 && s->late ? 1 : s->phase < 2 && (s->kill || s->cut) ? 2 : 3;
	s->phase_us = now;
	s->inject_us = s->detect_us = 0;
	s->connected_us = 0;
}

/* After an agent yielded: a monitor that posted a change is told to stop
 * (the agent moves on to the next round, as c10d.c does on the post). */
static void after_run(struct sim *s, struct agent *a)
{
	if (a->state != A_MONITOR || !a->j || !atomic_load(&a->j->h.posted) ||
	    helper_stopping(&a->j->h))
		return;
	/* only a change of the round the fault hit: a lease that lapsed
	 * before (a starved agent) is not the detection of the fault */
	if (s->inject_us && !s->detect_us && a->round == s->last_rd) {
		s->detect_us = clock_now_us();
		if (s->verbose)
			fprintf(stderr, "rdzv_sim: agent %d saw the change first: %s\n", a->idx,
				a->j->err);
	}
	atomic_store(&a->j->h.stop, 1);
	if (!a->waiting_io)
		make_ready(s, a); /* asleep between heartbeats: wake it now */
}

/* Wakes the agents whose sockets or deadlines are due. */
static void harvest(struct sim *s, struct epoll_event *evs, int wait_ms)
{
	int n = epoll_wait(s->ep, evs, SIM_EVENTS, wait_ms);
	uint64_t now;

	for (int i = 0; i < n; i++) {
		struct agent *a = &s->agents[evs[i].data.u32];

		a->pending |= evs[i].events;
		if (a->waiting_io &&
		    (evs[i].events & (poll_to_ep(a->want) | EPOLLERR | EPOLLHUP | EPOLLRDHUP)))
			make_ready(s, a);
	}
	now = clock_now_us();
	while (s->heap_n && s->heap[0]->deadline_us <= now)
		make_ready(s, s->heap[0]);
}

static int run(struct sim *s)
{
	struct epoll_event evs[SIM_EVENTS];
	uint64_t end;

	s->t0_us = s->phase_us = clock_now_us();
	end = s->t0_us + (uint64_t)s->timeout_s * 1000000u;
	while (s->phase < 3) {
		uint64_t now = clock_now_us();
		int wait_ms = 0;

		if (now >= end) {
			fprintf(stderr, "rdzv_sim: phase %d did not end within %u s (live %d)\n",
				s->phase, s->timeout_s, s->live);
			return 1;
		}
		drive(s, now);
		if (s->verbose && now >= s->next_status_us) {
			int cnt[A_FAILED + 1] = {0};

			for (int i = 0; i < s->k; i++)
				cnt[s->agents[i].state]++;
			s->next_status_us = now + 250000; /* 4 lines a second */
			fprintf(stderr,
				"rdzv_sim: %.1f s phase %d: idle %d connecting %d joining %d "
				"monitor %d dead %d cut %d failed %d; timers %d ready %d\n",
				secs(s->t0_us, now), s->phase, cnt[A_IDLE], cnt[A_CONNECTING],
				cnt[A_JOINING], cnt[A_MONITOR], cnt[A_DEAD], cnt[A_CUT],
				cnt[A_FAILED], s->heap_n, s->rq_len);
		}
		for (int m = s->rq_len; m > 0 && s->rq_len; m--) {
			struct agent *a = s->ready[s->rq_head];

			s->rq_head = (s->rq_head + 1) % s->k;
			s->rq_len--;
			a->queued = false;
			if (a->state == A_DEAD || a->state == A_CUT || a->state == A_FAILED)
				continue;
			s->cur = a;
			fiber_switch(&s->main_ctx, &a->ctx);
			s->cur = NULL;
			after_run(s, a);
			if (m % SIM_BATCH == 0)
				harvest(s, evs, 0);
		}
		if (!s->rq_len) {
			uint64_t t = s->heap_n ? s->heap[0]->deadline_us : now + 100000;

			now = clock_now_us();
			wait_ms = t <= now ? 0 : (int)MIN((t - now + 999) / 1000, 100);
		}
		harvest(s, evs, wait_ms);
	}
	return s->failures ? 1 : 0;
}

/* ---- flags ------------------------------------------------------------------- */

static int flag_int(const char *name, const char *v, int lo, int hi, int *ret)
{
	int64_t x;

	if (parse_i64(v, &x) < 0 || x < lo || x > hi) {
		fprintf(stderr, "rdzv_sim: --%s must be an integer in %d..%d, got '%s'\n", name, lo,
			hi, v);
		return -1;
	}
	*ret = (int)x;
	return 0;
}

static int parse_flags(struct sim *s, int argc, char **argv)
{
	static const struct option opts[] = {{"host", required_argument, NULL, 'H'},
					     {"port", required_argument, NULL, 'p'},
					     {"k", required_argument, NULL, 'k'},
					     {"min", required_argument, NULL, 'm'},
					     {"late", required_argument, NULL, 'l'},
					     {"kill", required_argument, NULL, 'x'},
					     {"cut", required_argument, NULL, 'c'},
					     {"kill-join", required_argument, NULL, 'j'},
					     {"kill-join-ms", required_argument, NULL, 'J'},
					     {"seed", required_argument, NULL, 's'},
					     {"conf", required_argument, NULL, 'C'},
					     {"sources", required_argument, NULL, 'S'},
					     {"inflight", required_argument, NULL, 'i'},
					     {"timeout", required_argument, NULL, 't'},
					     {"run-id", required_argument, NULL, 'r'},
					     {"verbose", no_argument, NULL, 'v'},
					     {NULL, 0, NULL, 0}};
	const char *conf = "join_timeout=600,read_timeout=60,last_call_timeout=0.5,"
			   "heartbeat_interval=1,lease_ttl=3";
	const char *run_id = "sim";
	char err[256];
	int c, v, port = 0, timeout = 600;

	s->host = "127.0.0.1";
	s->sources = 8;
	s->inflight = 128;
	s->seed = 1;
	s->min = -1;
	while ((c = getopt_long(argc, argv, "k:", opts, NULL)) != -1) {
		int rc = 0;

		switch (c) {
		case 'H':
			s->host = optarg;
			break;
		case 'p':
			rc = flag_int("port", optarg, 1, 65535, &port);
			break;
		case 'k':
			rc = flag_int("k", optarg, 1, SIM_K_MAX, &s->k);
			break;
		case 'm':
			rc = flag_int("min", optarg, 1, SIM_K_MAX, &s->min);
			break;
		case 'l':
			rc = flag_int("late", optarg, 0, SIM_K_MAX, &s->late);
			break;
		case 'x':
			rc = flag_int("kill", optarg, 0, SIM_K_MAX, &s->kill);
			break;
		case 'c':
			rc = flag_int("cut", optarg, 0, SIM_K_MAX, &s->cut);
			break;
		case 'j':
			rc = flag_int("kill-join", optarg, 0, SIM_K_MAX, &s->kill_join);
			break;
		case 'J':
			rc = flag_int("kill-join-ms", optarg, 0, 3600000, &v);
			s->kill_join_ms = (uint32_t)v;
			break;
		case 's':
			rc = flag_int("seed", optarg, 1, 1 << 30, &v);
			s->seed = (uint64_t)v * 0x9e3779b97f4a7c15ull;
			break;
		case 'C':
			conf = optarg;
			break;
		case 'S':
			rc = flag_int("sources", optarg, 1, SIM_SOURCES_MAX, &s->sources);
			break;
		case 'i':
			rc = flag_int("inflight", optarg, 1, 4096, &s->inflight);
			break;
		case 't':
			rc = flag_int("timeout", optarg, 1, 86400, &timeout);
			break;
		case 'r':
			run_id = optarg;
			break;
		case 'v':
			s->verbose = true;
			break;
		default:
			return -1;
		}
		if (rc < 0)
			return -1;
	}
	if (!port || !s->k || optind != argc) {
		fprintf(stderr, "usage: rdzv_sim --port P -k K [--min M] [--late L] [--kill N] "
				"[--cut N] [--kill-join N --kill-join-ms MS] [--seed S] [--conf C] "
				"[--sources N] [--inflight N] [--timeout S] [--run-id ID]\n");
		return -1;
	}
	if (s->late + s->kill + s->cut + s->kill_join >= s->k) {
		fprintf(stderr, "rdzv_sim: --late + --kill + --cut + --kill-join must leave "
				"agents (< --k)\n");
		return -1;
	}
	if (c10d_parse_conf(conf, &s->conf, err, sizeof(err)) < 0) {
		fprintf(stderr, "rdzv_sim: --conf: %s\n", err);
		return -1;
	}
	s->port = (uint16_t)port;
	s->timeout_s = (uint32_t)timeout;
	s->recv_edges = !s->conf.tls_ca[0]; /* TLS reads with read(), not recv() */
	s->max = s->k;
	if (s->min < 0)
		s->min = MAX(1, s->k - s->late - s->kill - s->cut - s->kill_join);
	if (s->min > s->max) {
		fprintf(stderr, "rdzv_sim: --min must be at most --k\n");
		return -1;
	}
	return str_printf(s->prefix, sizeof(s->prefix), "crun-c10d/%s", run_id) < 0 ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct sim s = {0};
	struct rlimit rl;
	int r;

	log_init("rdzv_sim", LL_ERROR);
	if (parse_flags(&s, argc, argv) < 0)
		return 2;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
		if (rl.rlim_cur < (rlim_t)s.k + 64) {
			fprintf(stderr, "rdzv_sim: -k %d needs %d descriptors, the limit is %ju\n",
				s.k, s.k + 64, (uintmax_t)rl.rlim_cur);
			return 2;
		}
	}
	s.agents = calloc((size_t)s.k, sizeof(*s.agents));
	s.ready = calloc((size_t)s.k, sizeof(*s.ready));
	s.heap = calloc((size_t)s.k, sizeof(*s.heap));
	s.ep = epoll_create1(EPOLL_CLOEXEC);
	if (!s.agents || !s.ready || !s.heap || s.ep < 0) {
		fprintf(stderr, "rdzv_sim: out of memory\n");
		free(s.agents);
		free(s.ready);
		free(s.heap);
		return 1;
	}
	for (int i = 0; i < s.k; i++) {
		s.agents[i].idx = i;
		s.agents[i].fd = s.agents[i].reg_fd = -1;
		s.agents[i].heap_i = -1;
		s.agents[i].round = s.agents[i].grank = -1;
	}
	s.last_rd = -1;
	g_sim = &s;
	r = run(&s);
	for (int i = 0, shown = 0; i < s.k && shown < 5; i++)
		if (s.agents[i].state == A_FAILED && s.agents[i].err[0])
			fprintf(stderr, "rdzv_sim: agent %d: %s\n", i, s.agents[i].err), shown++;
	fflush(stdout);
	/* Leaving without closing: the store sees every connection end at once. */
	_exit(r);
}
