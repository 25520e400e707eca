/* store_load.c: a closed-loop load generator for TCPStore-protocol servers
 * (crun-rdzvd and PyTorch's 1.13 / 2.x legacy / 2.x libuv daemons). One thread
 * and one epoll drive every connection; each load connection keeps exactly one
 * request with a reply in flight, as a real client does. It speaks the wire
 * protocol from raw bytes (torch-compat.md §1.1-1.3), independently of
 * store/proto/proto.c, so it also cross-checks crun's codec. Prints one JSON line.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <getopt.h>

#include "common/common.h"

#define KEY_LEN		 16	   /* "/bench/k00000042": fixed width, so frames have fixed size */
#define MAX_KEYS	 10000000u /* key space ceiling */
#define MAX_VALUE	 (16u << 20) /* value size ceiling */
#define MAX_CONNS	 60000u	     /* load + idle; RLIMIT_NOFILE is the practical bound */
#define MAX_BATCH_SETS	 64	     /* SETs (no reply) sent ahead of one request with a reply */
#define CONNECT_INFLIGHT 256 /* concurrent non-blocking connects: stay below listen backlogs */
#define SMALL_IN	 16  /* inline read buffer of idle connections */
#define H_SUB		 64  /* histogram sub-buckets per power of two: <= 1.6% error */
#define H_BUCKETS	 (2 * H_SUB + 58 * H_SUB)

/* Logical operations of the mix, then the internal ones. */
enum op {
	OP_SET,
	OP_GET,
	OP_ADD,
	OP_CHECK,
	OP__MIX, /* the mix has this many entries */
	OP_WAIT = OP__MIX,
	OP_NUMKEYS,
	OP_PING,
	OP_VALIDATE,
	OP__MAX,
};

static const char *const op_names[OP__MAX] = {"set",  "get",	 "add",	 "check",
					      "wait", "numkeys", "ping", "validate"};

/* Opcode bytes per dialect (torch-compat §1.2); v2 shifts codes 0-6 by one. */
static uint8_t opcode(int dialect, enum op op)
{
	static const uint8_t v1[OP__MAX] = {0, 2, 3, 4, 5, 6, 0xff, 0xff};
	static const uint8_t v2[OP__MAX] = {1, 3, 4, 5, 6, 7, 13, 0};

	return dialect == 1 ? v1[op] : v2[op];
}

/* What a connection is waiting for; the reply layout follows from it. */
enum purpose {
	P_NONE,
	P_HANDSHAKE, /* v2: VALIDATE + PING, awaiting the u32 echo */
	P_PREFILL,   /* a chunk of SETs closed by GETNUMKEYS */
	P_OP,	     /* a measured request (after any batched SETs) */
	P_TWAIT,     /* --get torch: the WAIT half of a GET */
	P_VERIFY,    /* idle connection: one request at the end proves it is served */
};

enum cstate { C_FREE, C_CONNECTING, C_OPEN, C_DEAD };

struct conn {
	int fd;
	enum cstate state;
	enum purpose purpose;
	bool idle;
	bool want_out;	/* EPOLLOUT registered */
	enum op op;	/* the request whose reply is awaited */
	uint32_t nsets; /* SETs batched ahead of it */
	uint32_t key;	/* key index of the request */
	uint64_t t0_ns; /* when the logical op started */
	uint64_t rng;
	uint32_t prefill_next, prefill_end; /* this connection's share of the prefill */
	uint8_t *out;
	size_t out_len, out_off, out_cap;
	uint8_t *in;
	size_t in_len, in_cap;
	uint8_t small[SMALL_IN];
};

struct hist {
	uint64_t n, max_ns, sum_ns;
	uint64_t b[H_BUCKETS];
};

struct opts {
	const char *host;
	uint16_t port;
	int dialect;
	uint32_t conns;
	uint32_t idle;
	uint32_t mix[OP__MIX];
	uint32_t keys;
	uint32_t value_bytes;
	uint64_t duration_ms;
	uint64_t warmup_ms;
	uint64_t ops_target; /* 0: run for duration_ms */
	uint64_t hold_ms;
	uint64_t op_timeout_ms;
	uint64_t max_time_ms;
	bool torch_get;
	const char *label;
};

enum phase { PH_SETUP, PH_WARMUP, PH_MEASURE, PH_DONE };

struct bench {
	struct opts o;
	int ep;
	struct sockaddr_storage addr;
	socklen_t addr_len;
	struct conn *c;
	uint32_t nconns; /* idle first, then load */
	uint8_t *value;
	enum phase phase;
	uint64_t t_start_ns, deadline_ns;
	uint64_t measure_start_ns, measure_end_ns;
	/* Progress counters for the setup phases. */
	uint32_t connecting, handshaking, connected, connect_failed, handshaken, prefilled;
	uint32_t verified;
	/* Results of the measured window. */
	uint64_t ops, reqs, per_op[OP__MIX];
	uint64_t timeouts, closed, bad_reply, idle_dropped;
	struct hist h_all, h_op[OP__MIX];
	uint64_t cpu_start_us, cpu_us; /* this process's CPU time over the measured window */
	uint32_t alive_load;
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_now_us(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) < 0)
		return 0;
	return (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000u +
	       (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static uint64_t rng_next(uint64_t *s)
{
	/* xorshift64*: cheap and good enough to pick keys and ops. */
	uint64_t x = *s;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/* ---- latency histogram (log-linear, like HdrHistogram) -------------------- */

static unsigned hist_index(uint64_t ns)
{
	unsigned e;

	if (ns < 2 * H_SUB)
		return (unsigned)ns;
	e = 63u - (unsigned)__builtin_clzll(ns); /* >= 7 */
	return 2 * H_SUB + (e - 7) * H_SUB + (unsigned)((ns >> (e - 6)) - H_SUB);
}

/* Midpoint of bucket i, in ns. */
static double hist_value(unsigned i)
{
	unsigned e, m;

	if (i < 2 * H_SUB)
		return i;
	e = (i - 2 * H_SUB) / H_SUB + 7;
	m = (i - 2 * H_SUB) % H_SUB + H_SUB;
	return ((double)m + 0.5) * (double)(1ull << (e - 6));
}

static void hist_add(struct hist *h, uint64_t ns)
{
	unsigned i = hist_index(ns);

	h->b[i < H_BUCKETS ? i : H_BUCKETS - 1]++;
	h->n++;
	h->sum_ns += ns;
	if (ns > h->max_ns)
		h->max_ns = ns;
}

static double hist_quantile_us(const struct hist *h, double q)
{
	uint64_t want, seen = 0;

	if (!h->n)
		return 0;
	want = (uint64_t)(q * (double)h->n);
	if (want < 1)
		want = 1;
	for (unsigned i = 0; i < H_BUCKETS; i++) {
		seen += h->b[i];
		if (seen >= want)
			return MIN(hist_value(i), (double)h->max_ns) / 1000.0;
	}
	return (double)h->max_ns / 1000.0;
}

/* ---- frames ------------------------------------------------------------------ */

static uint8_t *put_u64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		*p++ = (uint8_t)(v >> (8 * i));
	return p;
}

static uint8_t *put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		*p++ = (uint8_t)(v >> (8 * i));
	return p;
}

static uint64_t get_u64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint32_t get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Keys: "/bench/k%08u" for values, "/bench/c%08u" for ADD counters (an ADD on
 * a non-numeric value closes the connection on every server, §1.4). */
static uint8_t *put_key(uint8_t *p, char kind, uint32_t idx)
{
	p = put_u64(p, KEY_LEN);
	memcpy(p, "/bench/", 7);
	p[7] = (uint8_t)kind;
	for (int i = 15; i >= 8; i--, idx /= 10)
		p[i] = (uint8_t)('0' + idx % 10);
	return p + KEY_LEN;
}

/* Worst-case frame sizes, to check room before appending. */
#define FRAME_MAX_SMALL (1 + 8 + 8 + KEY_LEN + 8)
static size_t set_frame_len(const struct bench *b)
{
	return 1 + 8 + KEY_LEN + 8 + b->o.value_bytes;
}

/* Appends one request to c->out; the caller made room. */
static void append_req(struct bench *b, struct conn *c, enum op op, uint32_t key)
{
	uint8_t *p = c->out + c->out_len;

	*p++ = opcode(b->o.dialect, op);
	switch (op) {
	case OP_SET:
		p = put_key(p, 'k', key);
		p = put_u64(p, b->o.value_bytes);
		memcpy(p, b->value, b->o.value_bytes);
		p += b->o.value_bytes;
		break;
	case OP_GET:
		p = put_key(p, 'k', key);
		break;
	case OP_ADD:
		p = put_key(p, 'c', key);
		p = put_u64(p, 1);
		break;
	case OP_CHECK:
	case OP_WAIT:
		p = put_u64(p, 1);
		p = put_key(p, 'k', key);
		break;
	case OP_PING:
		p = put_u32(p, (uint32_t)getpid() ^ key);
		break;
	case OP_VALIDATE:
		p = put_u32(p, 0x3C85F7CEu);
		break;
	case OP_NUMKEYS:
	case OP__MAX:
		break;
	}
	c->out_len = (size_t)(p - c->out);
}

/* Bytes of the complete reply to `op` in buf[0..len), or 0 if more are needed. */
static size_t reply_len(enum op op, const uint8_t *buf, size_t len)
{
	size_t need;

	switch (op) {
	case OP_CHECK:
	case OP_WAIT:
		need = 1;
		break;
	case OP_PING:
		need = 4;
		break;
	case OP_ADD:
	case OP_NUMKEYS:
		need = 8;
		break;
	case OP_GET:
		if (len < 8)
			return 0;
		need = 8 + get_u64(buf); /* bounded by the in_cap check in the caller */
		break;
	default:
		need = 1;
		break;
	}
	return len >= need ? need : 0;
}

/* ---- connections ------------------------------------------------------------- */

static void conn_kill(struct bench *b, struct conn *c)
{
	if (c->state == C_FREE || c->state == C_DEAD)
		return;
	if (c->state == C_CONNECTING)
		b->connecting--;
	if (c->purpose == P_HANDSHAKE)
		b->handshaking--;
	c->purpose = P_NONE;
	(void)epoll_ctl(b->ep, EPOLL_CTL_DEL, c->fd, NULL);
	fd_close(c->fd);
	c->fd = -1;
	c->state = C_DEAD;
	if (!c->idle && b->alive_load)
		b->alive_load--;
}

/* A connection closed under us: count it by phase, then drop it. */
static void conn_lost(struct bench *b, struct conn *c)
{
	if (c->purpose == P_HANDSHAKE)
		b->connect_failed++; /* e.g. a v1 server resetting a v2 handshake */
	else if (c->idle)
		b->idle_dropped++;
	else if (b->phase != PH_DONE)
		b->closed++;
	conn_kill(b, c);
}

static void conn_want_out(struct bench *b, struct conn *c, bool on)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0),
				 .data.ptr = c};

	if (c->want_out == on)
		return;
	c->want_out = on;
	(void)epoll_ctl(b->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_flush(struct bench *b, struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			conn_want_out(b, c, true);
			return;
		}
		if (n <= 0) {
			conn_lost(b, c);
			return;
		}
		c->out_off += (size_t)n;
	}
	c->out_off = c->out_len = 0;
	conn_want_out(b, c, false);
}

static int conn_alloc_bufs(struct bench *b, struct conn *c)
{
	if (c->idle) {
		/* Idle connections send at most 9 bytes and read at most 8. */
		c->out = c->small;
		c->out_cap = SMALL_IN;
		c->in = c->small; /* never both in use: a reply arrives after the send */
		c->in_cap = SMALL_IN;
		return 0;
	}
	c->out_cap = 64 * 1024 + 2 * set_frame_len(b);
	c->in_cap = 64 + b->o.value_bytes;
	c->out = malloc(c->out_cap);
	c->in = malloc(c->in_cap);
	return c->out && c->in ? 0 : CRUN_ENOMEM;
}

static int conn_start(struct bench *b, struct conn *c)
{
	struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = c};
	int one = 1;
	int fd;

	fd = socket(b->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&b->addr, b->addr_len) < 0 && errno != EINPROGRESS) {
		int r = -errno;

		fd_close(fd);
		return r;
	}
	if (epoll_ctl(b->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
		int r = -errno;

		fd_close(fd);
		return r;
	}
	c->fd = fd;
	c->state = C_CONNECTING;
	c->want_out = true;
	b->connecting++;
	return 0;
}

static void issue_handshake(struct bench *b, struct conn *c)
{
	/* What a 2.x client sends first: VALIDATE, then PING, read the echo. */
	append_req(b, c, OP_VALIDATE, 0);
	append_req(b, c, OP_PING, (uint32_t)(c - b->c));
	c->op = OP_PING;
	c->purpose = P_HANDSHAKE;
	b->handshaking++;
	conn_flush(b, c);
}

static void on_connected(struct bench *b, struct conn *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
		b->connect_failed++;
		conn_kill(b, c);
		return;
	}
	b->connecting--;
	c->state = C_OPEN;
	c->want_out = true;
	conn_want_out(b, c, false);
	b->connected++;
	if (!c->idle)
		b->alive_load++;
	if (b->o.dialect == 2)
		issue_handshake(b, c);
	else
		b->handshaken++; /* v1 has no handshake: the 1.13 client sends nothing first */
}

/* ---- the load ------------------------------------------------------------------ */

static enum op pick_op(struct bench *b, struct conn *c, bool reply_only)
{
	uint32_t total = 0, r;
	int i;

	for (i = reply_only ? 1 : 0; i < OP__MIX; i++)
		total += b->o.mix[i];
	r = (uint32_t)(rng_next(&c->rng) % total);
	for (i = reply_only ? 1 : 0; i < OP__MIX - 1; i++) {
		if (r < b->o.mix[i])
			break;
		r -= b->o.mix[i];
	}
	return (enum op)i;
}

/* Starts one logical op on a load connection. SET has no reply on the wire
 * (PyTorch's client does not wait either), so SETs drawn from the mix are
 * queued and go out in one write with the next request that has a reply;
 * their cost shows in that request's latency. This keeps the loop closed. */
static void issue_op(struct bench *b, struct conn *c)
{
	enum op op = pick_op(b, c, false);

	c->nsets = 0;
	c->out_len = c->out_off = 0;
	while (op == OP_SET) {
		if (c->nsets >= MAX_BATCH_SETS ||
		    c->out_len + set_frame_len(b) + FRAME_MAX_SMALL > c->out_cap) {
			op = pick_op(b, c, true);
			break;
		}
		append_req(b, c, OP_SET, (uint32_t)(rng_next(&c->rng) % b->o.keys));
		c->nsets++;
		op = pick_op(b, c, false);
	}
	c->key = (uint32_t)(rng_next(&c->rng) % b->o.keys);
	if (op == OP_GET && b->o.torch_get) {
		/* PyTorch's get() is WAIT([k]) then GET(k) (torch-compat §1.6). */
		append_req(b, c, OP_WAIT, c->key);
		c->op = OP_WAIT;
		c->purpose = P_TWAIT;
	} else {
		append_req(b, c, op, c->key);
		c->op = op;
		c->purpose = P_OP;
	}
	c->t0_ns = now_ns();
	conn_flush(b, c);
}

/* The next chunk of this connection's share of the key space, then a
 * GETNUMKEYS so we know the server has applied it. */
static void issue_prefill(struct bench *b, struct conn *c)
{
	c->out_len = c->out_off = 0;
	while (c->prefill_next < c->prefill_end &&
	       c->out_len + set_frame_len(b) + FRAME_MAX_SMALL <= c->out_cap)
		append_req(b, c, OP_SET, c->prefill_next++);
	append_req(b, c, OP_NUMKEYS, 0);
	c->op = OP_NUMKEYS;
	c->purpose = P_PREFILL;
	conn_flush(b, c);
}

static bool reply_ok(struct bench *b, struct conn *c, const uint8_t *p, size_t n)
{
	switch (c->op) {
	case OP_GET:
		return n == 8 + (size_t)b->o.value_bytes; /* every value has this size */
	case OP_CHECK:
	case OP_WAIT:
		return p[0] == 0; /* READY / STOP_WAITING: the keys were prefilled */
	case OP_ADD:
		return (int64_t)get_u64(p) > 0;
	case OP_PING: /* the nonce echoed (torch-compat §1.3) */
		return get_u32(p) == ((uint32_t)getpid() ^ (uint32_t)(c - b->c));
	default:
		return true;
	}
}

static void record(struct bench *b, struct conn *c, enum op logical, uint64_t t1)
{
	uint64_t dt = t1 - c->t0_ns;

	if (b->phase != PH_MEASURE || t1 < b->measure_start_ns)
		return;
	hist_add(&b->h_all, dt);
	hist_add(&b->h_op[logical], dt);
	b->ops += 1 + c->nsets;
	b->per_op[logical]++;
	b->per_op[OP_SET] += c->nsets;
	b->reqs += 1 + c->nsets + (b->o.torch_get && logical == OP_GET);
}

static void on_reply(struct bench *b, struct conn *c, const uint8_t *p, size_t n)
{
	if (!reply_ok(b, c, p, n)) {
		b->bad_reply++;
		conn_kill(b, c);
		return;
	}
	c->in_len = 0;
	switch (c->purpose) {
	case P_HANDSHAKE:
		b->handshaken++;
		b->handshaking--;
		c->purpose = P_NONE;
		return;
	case P_PREFILL:
		if (c->prefill_next < c->prefill_end)
			issue_prefill(b, c);
		else
			b->prefilled++, c->purpose = P_NONE;
		return;
	case P_VERIFY:
		b->verified++;
		c->purpose = P_NONE;
		return;
	case P_TWAIT:
		c->out_len = c->out_off = 0;
		append_req(b, c, OP_GET, c->key);
		c->op = OP_GET;
		c->purpose = P_OP;
		conn_flush(b, c);
		return;
	case P_OP:
		record(b, c, c->op, now_ns());
		c->purpose = P_NONE;
		if (b->phase == PH_WARMUP || b->phase == PH_MEASURE)
			issue_op(b, c);
		return;
	case P_NONE:
		return;
	}
}

static void on_readable(struct bench *b, struct conn *c)
{
	for (;;) {
		ssize_t n;
		size_t used;

		if (c->in_len == c->in_cap) {
			b->bad_reply++; /* a reply larger than any we asked for */
			conn_kill(b, c);
			return;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			return;
		if (n <= 0) {
			conn_lost(b, c);
			return;
		}
		if (c->purpose == P_NONE) {
			b->bad_reply++; /* bytes nobody asked for */
			conn_kill(b, c);
			return;
		}
		c->in_len += (size_t)n;
		used = reply_len(c->op, c->in, c->in_len);
		if (!used)
			continue;
		if (used != c->in_len) {
			b->bad_reply++; /* one request in flight: nothing may follow its reply */
			conn_kill(b, c);
			return;
		}
		on_reply(b, c, c->in, used);
		return;
	}
}

static void on_event(struct bench *b, struct conn *c, uint32_t events)
{
	if (c->state == C_CONNECTING) {
		on_connected(b, c);
		return;
	}
	if (c->state != C_OPEN)
		return;
	if ((events & EPOLLOUT) && c->out_off < c->out_len)
		conn_flush(b, c);
	if (c->state == C_OPEN && (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
		on_readable(b, c);
}

/* ---- the loop and its phases ----------------------------------------------------- */

static void poll_once(struct bench *b, int timeout_ms)
{
	struct epoll_event evs[512];
	int n = epoll_wait(b->ep, evs, (int)ARRAY_SIZE(evs), timeout_ms);

	for (int i = 0; i < n; i++)
		on_event(b, evs[i].data.ptr, evs[i].events);
}

static bool past_deadline(const struct bench *b)
{
	return now_ns() >= b->deadline_ns;
}

/* Connects conns [first, first+count) with a bounded number of connects in
 * flight, and waits for the v2 handshakes. Returns how many are ready. */
static uint32_t connect_range(struct bench *b, uint32_t first, uint32_t count, uint64_t limit_ns)
{
	uint32_t next = first, end = first + count, ready = 0;
	uint64_t until = MIN(now_ns() + limit_ns, b->deadline_ns);

	while (now_ns() < until) {
		while (next < end && b->connecting < CONNECT_INFLIGHT) {
			struct conn *c = &b->c[next++];

			if (conn_alloc_bufs(b, c) < 0 || conn_start(b, c) < 0) {
				b->connect_failed++;
				c->state = C_DEAD;
			}
		}
		if (next == end && !b->connecting && !b->handshaking)
			break;
		poll_once(b, 10);
	}
	for (uint32_t i = first; i < end; i++) {
		struct conn *c = &b->c[i];

		if (c->state == C_FREE || c->state == C_CONNECTING ||
		    (c->state == C_OPEN && c->purpose == P_HANDSHAKE)) {
			b->connect_failed++; /* not started or not finished in time */
			if (c->state == C_FREE)
				c->state = C_DEAD;
			conn_kill(b, c);
		}
		ready += c->state == C_OPEN;
	}
	return ready;
}

/* Every key gets a value before the load starts: the legacy servers close the
 * connection on a GET of a missing key (torch-compat §1.4). The key space is
 * split over the open connections. */
static int prefill(struct bench *b, uint32_t first, uint32_t count)
{
	uint32_t open = 0, per, i, k = 0;

	for (i = first; i < first + count; i++)
		open += b->c[i].state == C_OPEN;
	if (!open)
		return CRUN_EIO;
	per = (b->o.keys + open - 1) / open;
	b->prefilled = 0;
	for (i = first; i < first + count; i++) {
		struct conn *c = &b->c[i];

		if (c->state != C_OPEN)
			continue;
		c->prefill_next = MIN(k * per, b->o.keys);
		c->prefill_end = MIN((k + 1) * per, b->o.keys);
		k++;
		issue_prefill(b, c);
	}
	while (b->prefilled < open && b->alive_load == open && !past_deadline(b))
		poll_once(b, 10);
	return b->prefilled == open ? 0 : CRUN_EIO;
}

static void check_op_timeouts(struct bench *b, uint32_t first, uint32_t count, uint64_t t)
{
	uint64_t limit = b->o.op_timeout_ms * 1000000u;

	for (uint32_t i = first; i < first + count; i++) {
		struct conn *c = &b->c[i];

		if (c->state == C_OPEN && c->purpose != P_NONE && t - c->t0_ns > limit) {
			if (b->phase == PH_MEASURE)
				b->timeouts++;
			conn_kill(b, c); /* its stream is out of step now */
		}
	}
}

/* A watcher (store_bench.py) reads the server's CPU time at these lines. */
static void note_measuring(void)
{
	fputs("store_load: measuring\n", stderr);
}

static void run_load(struct bench *b, uint32_t first, uint32_t count)
{
	uint64_t t = now_ns(), last_scan = t;
	uint64_t warm_end = t + b->o.warmup_ms * 1000000u;

	b->phase = b->o.warmup_ms ? PH_WARMUP : PH_MEASURE;
	b->measure_start_ns = b->phase == PH_MEASURE ? t : warm_end;
	b->measure_end_ns = b->measure_start_ns + b->o.duration_ms * 1000000u;
	b->cpu_start_us = cpu_now_us();
	if (b->phase == PH_MEASURE)
		note_measuring();
	for (uint32_t i = first; i < first + count; i++)
		if (b->c[i].state == C_OPEN)
			issue_op(b, &b->c[i]);
	while (b->alive_load) {
		poll_once(b, 5);
		t = now_ns();
		if (b->phase == PH_WARMUP && t >= warm_end) {
			b->phase = PH_MEASURE;
			b->cpu_start_us = cpu_now_us();
			note_measuring();
		}
		if (t >= b->measure_end_ns || t >= b->deadline_ns ||
		    (b->o.ops_target && b->ops >= b->o.ops_target))
			break;
		if (t - last_scan > 100000000u) {
			check_op_timeouts(b, first, count, t);
			last_scan = t;
		}
	}
	b->cpu_us = cpu_now_us() - b->cpu_start_us;
	fputs("store_load: measured\n", stderr); /* a watcher may sample the server now */
	b->measure_end_ns = MIN(t, b->measure_end_ns);
	if (b->measure_end_ns < b->measure_start_ns)
		b->measure_end_ns = b->measure_start_ns;
	b->phase = PH_DONE;
}

/* Each idle connection answers one request at the end (v1: GETNUMKEYS, v2:
 * PING): proof that the server still serves it, not merely holds the fd. */
static void verify_idle(struct bench *b, uint64_t limit_ns)
{
	uint64_t until = MIN(now_ns() + limit_ns, b->deadline_ns);
	uint32_t sent = 0;

	for (uint32_t i = 0; i < b->o.idle; i++) {
		struct conn *c = &b->c[i];

		if (c->state != C_OPEN)
			continue;
		c->out_len = c->out_off = c->in_len = 0;
		c->op = b->o.dialect == 1 ? OP_NUMKEYS : OP_PING;
		append_req(b, c, c->op, i); /* PING nonce: pid ^ connection index */
		c->purpose = P_VERIFY;
		conn_flush(b, c);
		sent++;
	}
	while (b->verified < sent && now_ns() < until)
		poll_once(b, 10);
}

static void hold_idle(struct bench *b, uint64_t ms)
{
	uint64_t until = MIN(now_ns() + ms * 1000000u, b->deadline_ns);

	while (now_ns() < until)
		poll_once(b, 10);
}

/* ---- output -------------------------------------------------------------------- */

static void print_hist(const char *name, const struct hist *h, bool comma)
{
	printf("\"%s\":{\"n\":%llu,\"mean_us\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
	       "\"p999_us\":%.1f,\"max_us\":%.1f}%s",
	       name, (unsigned long long)h->n, h->n ? (double)h->sum_ns / h->n / 1000.0 : 0.0,
	       hist_quantile_us(h, 0.50), hist_quantile_us(h, 0.99), hist_quantile_us(h, 0.999),
	       (double)h->max_ns / 1000.0, comma ? "," : "");
}

static void print_json(const struct bench *b, const char *error, uint32_t idle_ready,
		       uint64_t idle_connect_ms, uint64_t verify_ms)
{
	double secs = (double)(b->measure_end_ns - b->measure_start_ns) / 1e9;
	const struct opts *o = &b->o;

	printf("{\"label\":\"%s\",\"dialect\":%d,\"conns\":%u,\"get\":\"%s\","
	       "\"mix\":\"%u:%u:%u:%u\",\"keys\":%u,\"value_bytes\":%u,",
	       o->label, o->dialect, o->conns, o->torch_get ? "torch" : "raw", o->mix[0], o->mix[1],
	       o->mix[2], o->mix[3], o->keys, o->value_bytes);
	if (o->conns) {
		printf("\"seconds\":%.3f,\"ops\":%llu,\"ops_per_s\":%.0f,\"reqs_per_s\":%.0f,"
		       "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"max_us\":%.1f,",
		       secs, (unsigned long long)b->ops, secs > 0 ? (double)b->ops / secs : 0.0,
		       secs > 0 ? (double)b->reqs / secs : 0.0, hist_quantile_us(&b->h_all, 0.5),
		       hist_quantile_us(&b->h_all, 0.99), hist_quantile_us(&b->h_all, 0.999),
		       (double)b->h_all.max_ns / 1000.0);
		printf("\"sets\":%llu,\"per_op\":{", (unsigned long long)b->per_op[OP_SET]);
		for (int i = OP_GET; i < OP__MIX; i++)
			print_hist(op_names[i], &b->h_op[i], i + 1 < OP__MIX);
		/* The generator shares the machine with the server: its own cost per op
		 * bounds what any server can show here. */
		printf("},\"client_cpu_us_per_op\":%.2f,\"conns_alive\":%u,",
		       b->ops ? (double)b->cpu_us / (double)b->ops : 0.0, b->alive_load);
	}
	if (o->idle)
		printf("\"idle\":{\"requested\":%u,\"ready\":%u,\"connect_ms\":%llu,"
		       "\"dropped\":%llu,\"answered\":%u,\"verify_ms\":%llu},",
		       o->idle, idle_ready, (unsigned long long)idle_connect_ms,
		       (unsigned long long)b->idle_dropped, b->verified,
		       (unsigned long long)verify_ms);
	printf("\"errors\":{\"connect\":%u,\"timeouts\":%llu,\"closed\":%llu,\"bad_reply\":%llu}",
	       b->connect_failed, (unsigned long long)b->timeouts, (unsigned long long)b->closed,
	       (unsigned long long)b->bad_reply);
	if (error)
		printf(",\"error\":\"%s\"", error);
	printf("}\n");
	fflush(stdout);
}

/* ---- set-up ---------------------------------------------------------------------- */

static const char usage[] =
    "usage: store_load --port N [options]\n"
    "Closed-loop TCPStore load: one request with a reply in flight per connection.\n"
    "  --host ADDR         server address (default 127.0.0.1)\n"
    "  --port N            server port (required)\n"
    "  --dialect 1|2       1: torch 1.13/2.0 numbering; 2: torch 2.1+ (VALIDATE + PING first)\n"
    "  --conns N           load connections (default 16; 0 with --idle only)\n"
    "  --mix S:G:A:C       weights of set:get:add:check (default 20:50:20:10); SETs have no\n"
    "                      reply and go out with the next request that has one\n"
    "  --get raw|torch     raw: one GET request; torch: WAIT([k]) then GET(k) as PyTorch's\n"
    "                      get() does, timed as one op (default raw)\n"
    "  --keys N            key space, prefilled before the run (default 1000)\n"
    "  --value-size N      bytes per value, >= 1 (default 64)\n"
    "  --duration SEC      measured time (default 5)\n"
    "  --ops N             stop after N measured ops instead (duration still bounds it)\n"
    "  --warmup SEC        unmeasured load first (default 1)\n"
    "  --idle N            also hold N idle connections (v1: silent; v2: VALIDATE + PING)\n"
    "  --hold SEC          hold the idle connections this long before the load (default 1)\n"
    "  --op-timeout SEC    a request unanswered this long counts as a timeout (default 10)\n"
    "  --max-time SEC      hard bound on the whole run (default warmup+duration+hold+120)\n"
    "  --label TEXT        copied into the JSON ([A-Za-z0-9._:-])\n"
    "Prints one JSON line: ops_per_s, p50_us, p99_us, p999_us, per-op histograms, errors.\n";

static int parse_weights(const char *s, uint32_t *w)
{
	char buf[64];
	char *p = buf, *colon;
	uint64_t v, total = 0;
	int i;

	if (str_printf(buf, sizeof(buf), "%s", s) < 0)
		return CRUN_EINVAL;
	for (i = 0; i < OP__MIX; i++) {
		colon = strchr(p, ':');
		if ((colon == NULL) != (i == OP__MIX - 1))
			return CRUN_EINVAL;
		if (colon)
			*colon = '\0';
		TRY(parse_uint_range(p, 0, 1000000, &v));
		w[i] = (uint32_t)v;
		total += v;
		p = colon + 1;
	}
	/* The loop needs a request with a reply to stay closed. */
	return total > w[OP_SET] ? 0 : CRUN_EINVAL;
}

static int parse_label(const char *s)
{
	if (strlen(s) > 100)
		return CRUN_EINVAL;
	for (; *s; s++)
		if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-",
			    *s))
			return CRUN_EINVAL;
	return 0;
}

static int parse_opt(struct opts *o, int opt, const char *arg)
{
	uint64_t v;

	switch (opt) {
	case 'H':
		o->host = arg;
		return 0;
	case 'p':
		TRY(parse_uint_range(arg, 1, 65535, &v));
		o->port = (uint16_t)v;
		return 0;
	case 'D':
		TRY(parse_uint_range(arg, 1, 2, &v));
		o->dialect = (int)v;
		return 0;
	case 'c':
		TRY(parse_uint_range(arg, 0, MAX_CONNS, &v));
		o->conns = (uint32_t)v;
		return 0;
	case 'i':
		TRY(parse_uint_range(arg, 0, MAX_CONNS, &v));
		o->idle = (uint32_t)v;
		return 0;
	case 'm':
		return parse_weights(arg, o->mix);
	case 'g':
		if (strcmp(arg, "raw") && strcmp(arg, "torch"))
			return CRUN_EINVAL;
		o->torch_get = !strcmp(arg, "torch");
		return 0;
	case 'k':
		TRY(parse_uint_range(arg, 1, MAX_KEYS, &v));
		o->keys = (uint32_t)v;
		return 0;
	case 'v':
		/* >= 1: the 1.13 server needs ~200 ms for an empty GET (§1.8). */
		TRY(parse_uint_range(arg, 1, MAX_VALUE, &v));
		o->value_bytes = (uint32_t)v;
		return 0;
	case 'd':
		return parse_seconds_ms(arg, &o->duration_ms);
	case 'n':
		return parse_u64(arg, &o->ops_target);
	case 'w':
		return parse_seconds_ms(arg, &o->warmup_ms);
	case 'h':
		return parse_seconds_ms(arg, &o->hold_ms);
	case 't':
		return parse_seconds_ms(arg, &o->op_timeout_ms);
	case 'T':
		return parse_seconds_ms(arg, &o->max_time_ms);
	case 'l':
		TRY(parse_label(arg));
		o->label = arg;
		return 0;
	}
	return CRUN_EINVAL;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
	    {"host", 1, NULL, 'H'},	{"port", 1, NULL, 'p'},	      {"dialect", 1, NULL, 'D'},
	    {"conns", 1, NULL, 'c'},	{"idle", 1, NULL, 'i'},	      {"mix", 1, NULL, 'm'},
	    {"get", 1, NULL, 'g'},	{"keys", 1, NULL, 'k'},	      {"value-size", 1, NULL, 'v'},
	    {"duration", 1, NULL, 'd'}, {"ops", 1, NULL, 'n'},	      {"warmup", 1, NULL, 'w'},
	    {"hold", 1, NULL, 'h'},	{"op-timeout", 1, NULL, 't'}, {"max-time", 1, NULL, 'T'},
	    {"label", 1, NULL, 'l'},	{"help", 0, NULL, 'u'},	      {NULL, 0, NULL, 0},
	};
	int opt, idx;

	*o = (struct opts){.host = "127.0.0.1",
			   .dialect = 1,
			   .conns = 16,
			   .mix = {20, 50, 20, 10},
			   .keys = 1000,
			   .value_bytes = 64,
			   .duration_ms = 5000,
			   .warmup_ms = 1000,
			   .hold_ms = 1000,
			   .op_timeout_ms = 10000,
			   .label = ""};
	while ((opt = getopt_long(argc, argv, "", lo, &idx)) != -1) {
		if (opt == 'u') {
			fputs(usage, stdout);
			exit(0);
		}
		if (opt == '?') {
			fputs(usage, stderr);
			return CRUN_EINVAL;
		}
		if (parse_opt(o, opt, optarg) < 0) {
			fprintf(stderr, "store_load: bad value '%s' for --%s\n", optarg,
				lo[idx].name);
			return CRUN_EINVAL;
		}
	}
	if (optind < argc || !o->port || (!o->conns && !o->idle) ||
	    (uint64_t)o->conns + o->idle > MAX_CONNS) {
		fputs(usage, stderr);
		return CRUN_EINVAL;
	}
	if ((uint64_t)o->keys * (o->value_bytes + 64u) > (1ull << 30)) {
		fputs("store_load: --keys x --value-size over 1 GiB\n", stderr);
		return CRUN_EINVAL;
	}
	if (!o->max_time_ms)
		o->max_time_ms = o->warmup_ms + o->duration_ms + o->hold_ms + 120000;
	return 0;
}

/* 10,000 idle connections need more fds than the usual soft limit of 1024. */
static int raise_nofile(uint32_t need)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return -errno;
	if (rl.rlim_cur >= need)
		return 0;
	if (rl.rlim_max < need) {
		fprintf(stderr, "store_load: need %u fds, hard RLIMIT_NOFILE is %llu\n", need,
			(unsigned long long)rl.rlim_max);
		return CRUN_EMFILE;
	}
	rl.rlim_cur = need;
	return setrlimit(RLIMIT_NOFILE, &rl) < 0 ? -errno : 0;
}

static int resolve(struct bench *b)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res;
	char port[8];

	TRY(str_printf(port, sizeof(port), "%u", b->o.port));
	if (getaddrinfo(b->o.host, port, &hints, &res) != 0)
		return CRUN_ERESOLVE;
	memcpy(&b->addr, res->ai_addr, res->ai_addrlen);
	b->addr_len = res->ai_addrlen;
	freeaddrinfo(res);
	return 0;
}

static int bench_init(struct bench *b)
{
	b->nconns = b->o.idle + b->o.conns;
	TRY(raise_nofile(b->nconns + 64));
	TRY(resolve(b));
	b->ep = epoll_create1(EPOLL_CLOEXEC);
	if (b->ep < 0)
		return -errno;
	b->c = calloc(b->nconns, sizeof(*b->c));
	b->value = malloc(b->o.value_bytes);
	if (!b->c || !b->value)
		return CRUN_ENOMEM;
	for (uint32_t i = 0; i < b->o.value_bytes; i++)
		b->value[i] = (uint8_t)('a' + i % 26);
	for (uint32_t i = 0; i < b->nconns; i++) {
		b->c[i].fd = -1;
		b->c[i].idle = i < b->o.idle;
		b->c[i].rng = 0x9E3779B97F4A7C15ull * (i + 1) ^ (uint64_t)getpid();
	}
	b->t_start_ns = now_ns();
	b->deadline_ns = b->t_start_ns + b->o.max_time_ms * 1000000u;
	return 0;
}

static void bench_release(struct bench *b)
{
	for (uint32_t i = 0; b->c && i < b->nconns; i++) {
		struct conn *c = &b->c[i];

		if (c->fd >= 0)
			fd_close(c->fd);
		if (!c->idle) {
			free(c->out);
			free(c->in);
		}
	}
	free(b->c);
	free(b->value);
	if (b->ep >= 0)
		fd_close(b->ep);
}

int main(int argc, char **argv)
{
	static struct bench b; /* large histograms: keep them off the stack */
	uint64_t t, idle_ms = 0, verify_ms = 0;
	uint32_t idle_ready = 0;
	const char *error = NULL;
	int r;

	b.ep = -1;
	signal(SIGPIPE, SIG_IGN);
	if (parse_args(argc, argv, &b.o) < 0)
		return 2;
	r = bench_init(&b);
	if (r < 0) {
		fprintf(stderr, "store_load: set-up failed: %s\n", crun_strerror(r));
		bench_release(&b);
		return 1;
	}
	if (b.o.idle) {
		t = now_ns();
		idle_ready = connect_range(&b, 0, b.o.idle, 120000000000ull);
		idle_ms = (now_ns() - t) / 1000000u;
		fprintf(stderr, "store_load: idle %u/%u ready in %llu ms, holding\n", idle_ready,
			b.o.idle, (unsigned long long)idle_ms);
		hold_idle(&b, b.o.hold_ms);
	}
	if (b.o.conns) {
		if (connect_range(&b, b.o.idle, b.o.conns, 30000000000ull) == 0)
			error = "no load connection could be opened";
		else if (prefill(&b, b.o.idle, b.o.conns) < 0)
			error = "prefill failed";
		else
			run_load(&b, b.o.idle, b.o.conns);
		fprintf(stderr, "store_load: load done\n");
	}
	if (b.o.idle) {
		t = now_ns();
		verify_idle(&b, 60000000000ull);
		verify_ms = (now_ns() - t) / 1000000u;
	}
	if (!error && b.o.idle && !idle_ready)
		error = "no idle connection could be opened";
	if (!error && past_deadline(&b))
		error = "max-time reached";
	print_json(&b, error, idle_ready, idle_ms, verify_ms);
	bench_release(&b);
	return error ? 1 : 0;
}
