/* storm.c: the worker-init storm. N simulated PyTorch 2.x ranks (or 1.13 with
 * --dialect v1) start at once against one TCPStore-protocol server and do what
 * a rank does at init_process_group under crun (TORCHELASTIC_USE_AGENT_STORE):
 *
 *   connect; v2: VALIDATE + PING            (the client's handshake)
 *   ADD  init/ +1                           (world-size check-in)
 *   ADD  <pg>store_based_barrier_key:0 +1, then +0 (TORCH_DIST_INIT_BARRIER=1);
 *        a rank whose +0 reads N SETs <key>:last_worker; every rank WAITs on it
 *   rank 0 SETs the 128-byte NCCL unique id <pg>0//cuda//0, the others WAIT + GET it
 *
 * The sequence is that of a capture of a real 2.15 gloo job through
 * shared/tools/torch-capture (bench/README.md), with NCCL's unique-id
 * exchange in place of gloo's all-to-all address exchange (O(N) keys per rank,
 * which no NCCL job does);
 * requests are encoded with crun's codec (store/proto/proto.c, checked against
 * captured PyTorch frames). One thread and one epoll drive every connection.
 * Connects are paced (at most --inflight outstanding) so the server's accept
 * backlog is never overrun, and spread over --sources loopback addresses
 * (127.0.0.2, .3, ...) because connect()'s port search slows down past half the
 * ephemeral range per address pair.
 *
 * Prints one JSON line: seconds from the first connect to the last rank done,
 * to the last connect, and two views of the barrier's release, both from the
 * first SET of :last_worker being sent:
 *   wake_s    to the last of the ranks whose WAIT went out before that SET
 *             (`parked`) released: the fan-out of one SET waking every waiter
 *             (a rank whose ADD +0 read less but whose WAIT went out after
 *             the SET is neither parked nor a setter);
 *   fanout_s  to the last rank past the barrier at all. This also holds the
 *             ranks that were still between their ADDs when the SET went out
 *             (`setters`: each reads N, SETs and WAITs itself); how many there
 *             are depends on how the last connect wave (--inflight) lines up
 *             with the server's pace, not on the wake-up, and the one thread
 *             here serves their round trips before the wake-ups queued behind.
 * fanout_first_s is the SET to the first release (the server's latency).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "store/store.h"

#define STORM_MAX_RANKS 65536	   /* driven by one generator */
#define STORM_MAX_WORLD (1u << 17) /* the world: several generators (--first) */
#define STORM_BUF	1024 /* per-connection in/out: the largest frame is the 128-byte id SET */
#define NCCL_ID_BYTES	128

/* The steps of one rank, in order. */
enum step {
	S_CONNECTING,
	S_PING,
	S_INIT_ADD,
	S_BARRIER_ADD,
	S_BARRIER_CHECK, /* ADD +0 */
	S_BARRIER_WAIT,	 /* WAIT on :last_worker */
	S_ID_WAIT,
	S_ID_GET,
	S_DONE,
};

struct rank {
	int fd;
	uint32_t idx;
	enum step step;
	enum store_op op; /* the request in flight */
	uint8_t out[STORM_BUF];
	size_t out_len, out_off;
	uint8_t in[STORM_BUF];
	size_t in_len;
	bool parked; /* its barrier WAIT went out before the first SET */
};

struct storm {
	struct sockaddr_in server;
	enum store_dialect dialect;
	uint32_t n, sources, inflight;
	/* This generator drives ranks first .. first + count - 1 of the n (the
	 * world the barrier counts); the others are other processes'. */
	uint32_t first, count;
	const char *prefix;
	char init_key[64], barrier_key[256], last_key[300], id_key[256];
	int ep;
	struct rank *ranks;
	uint32_t next_connect, connecting, done;
	uint64_t t_start, t_last_connect, t_last_set, t_first_wake, t_last_wake, t_last_parked;
	uint64_t t_done;
	uint32_t woken;	  /* barrier WAITs released after the first SET was sent */
	uint32_t parked;  /* barrier WAITs sent before the first SET: its real waiters */
	uint32_t setters; /* ranks whose ADD +0 read N and which SET :last_worker */
	uint64_t requests;
	const char *error;
	struct store_limits lim;
	/* --ports-file: rank i connects to ports[i / per_port] (node-local
	 * proxies, bench/store_proxy_farm.c); none: every rank to server. */
	uint16_t *ports;
	uint32_t n_ports, per_port;
	uint32_t src_port0; /* this run's first source port (src_port) */
	char why[96];	    /* the error text of a failed connect */
};

/* The explicit source ports: rank i binds 127.0.0.(2 + i % sources) and the
 * port after its predecessors on that address, in a window of
 * [SRC_PORT_LO, SRC_PORT_HI) that starts at a different place each run.
 * Why not port 0: bind() then searches the range for a free port, in the
 * kernel, for every socket; past tens of thousands of sockets and the
 * previous storms' TIME_WAITs that search cost up to 2.5 ms a connect (49 s
 * of the generator's system time in one 19,900-rank cell, which the tables
 * showed as 5-50 s connect phases). */
#define SRC_PORT_LO 10000u
#define SRC_PORT_HI 60000u
static uint16_t src_port(const struct storm *s, uint32_t idx)
{
	return (uint16_t)(SRC_PORT_LO +
			  (s->src_port0 + idx / s->sources) % (SRC_PORT_HI - SRC_PORT_LO));
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Seconds from a to b; 0 when either is unset or b is not later. */
static double secs_between(uint64_t a, uint64_t b)
{
	return a && b > a ? (double)(b - a) / 1e9 : 0.0;
}

static void fail(struct storm *s, const char *why)
{
	if (!s->error)
		s->error = why;
}

/* Appends one request to the rank's output; the caller flushes. */
static void push(struct storm *s, struct rank *r, enum store_op op, const char *key,
		 const void *val, size_t val_len, int64_t num)
{
	struct store_bytes k = {(const uint8_t *)key, key ? strlen(key) : 0};
	struct store_req req = {.op = op, .key = k, .num = num};
	size_t len;

	req.val = (struct store_bytes){val, val_len};
	if (op == STORE_OP_WAIT) {
		req.nitems = 1;
		req.keys = &k;
	} else if (op == STORE_OP_VALIDATE) {
		req.u32 = STORE_VALIDATE_MAGIC;
	} else if (op == STORE_OP_PING) {
		req.u32 = r->idx;
	}
	if (store_proto_encode_req(s->dialect, &req, r->out + r->out_len,
				   sizeof(r->out) - r->out_len, &len) < 0) {
		fail(s, "encode");
		return;
	}
	r->out_len += len;
	s->requests++;
	if (store_proto_reply_kind(op) != STORE_REPLY_NONE)
		r->op = op;
}

static void want_out(struct storm *s, struct rank *r, int on)
{
	struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = r};

	if (epoll_ctl(s->ep, EPOLL_CTL_MOD, r->fd, &ev) < 0)
		fail(s, "epoll_ctl");
}

static void flush(struct storm *s, struct rank *r)
{
	while (r->out_off < r->out_len) {
		ssize_t w = send(r->fd, r->out + r->out_off, r->out_len - r->out_off, MSG_NOSIGNAL);

		if (w < 0) {
			if (errno == EAGAIN) {
				want_out(s, r, 1);
				return;
			}
			fail(s, "send");
			return;
		}
		r->out_off += (size_t)w;
	}
	r->out_off = r->out_len = 0;
}

static void finish(struct storm *s, struct rank *r)
{
	r->step = S_DONE;
	s->done++;
	if (s->done == s->count)
		s->t_done = now_ns();
}

/* The rank's next request after the reply to the current one. */
static void advance(struct storm *s, struct rank *r, const struct store_reply *rep)
{
	static const uint8_t id_fill = 0x5a;
	uint8_t id[NCCL_ID_BYTES];

	switch (r->step) {
	case S_PING:
		if (rep->u32 != r->idx)
			fail(s, "ping nonce");
		r->step = S_CONNECTING; /* the handshake is done */
					/* fall through */
	case S_CONNECTING:
		r->step = S_INIT_ADD;
		push(s, r, STORE_OP_ADD, s->init_key, NULL, 0, 1);
		break;
	case S_INIT_ADD:
		r->step = S_BARRIER_ADD;
		push(s, r, STORE_OP_ADD, s->barrier_key, NULL, 0, 1);
		break;
	case S_BARRIER_ADD:
		r->step = S_BARRIER_CHECK;
		push(s, r, STORE_OP_ADD, s->barrier_key, NULL, 0, 0);
		break;
	case S_BARRIER_CHECK:
		if (rep->num == (int64_t)s->n) {
			/* Whoever reads N releases everyone (PyTorch 2.x's barrier;
			 * several ranks may). */
			push(s, r, STORE_OP_SET, s->last_key, "1", 1, 0);
			if (!s->t_last_set)
				s->t_last_set = now_ns();
			s->setters++;
		} else if (!s->t_last_set) {
			s->parked++;
			r->parked = true;
		}
		r->step = S_BARRIER_WAIT;
		push(s, r, STORE_OP_WAIT, s->last_key, NULL, 0, 0);
		break;
	case S_BARRIER_WAIT:
		s->t_last_wake = now_ns();
		if (s->t_last_set && s->woken++ == 0)
			s->t_first_wake = s->t_last_wake;
		if (r->parked)
			s->t_last_parked = s->t_last_wake;
		if (r->idx == 0) {
			memset(id, id_fill, sizeof(id));
			push(s, r, STORE_OP_SET, s->id_key, id, sizeof(id), 0);
			finish(s, r);
		} else {
			r->step = S_ID_WAIT;
			push(s, r, STORE_OP_WAIT, s->id_key, NULL, 0, 0);
		}
		break;
	case S_ID_WAIT:
		r->step = S_ID_GET;
		push(s, r, STORE_OP_GET, s->id_key, NULL, 0, 0);
		break;
	case S_ID_GET:
		if (rep->val.len != NCCL_ID_BYTES || rep->val.p[0] != id_fill)
			fail(s, "unique id");
		finish(s, r);
		break;
	default:
		fail(s, "reply in a step that expects none");
	}
	flush(s, r);
}

static void on_connected(struct storm *s, struct rank *r)
{
	int one = 1;
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(r->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 || err) {
		fail(s, "connect");
		return;
	}
	(void)setsockopt(r->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	s->connecting--;
	s->t_last_connect = now_ns();
	want_out(s, r, 0);
	if (s->dialect == STORE_V2) {
		r->step = S_PING;
		push(s, r, STORE_OP_VALIDATE, NULL, NULL, 0, 0);
		push(s, r, STORE_OP_PING, NULL, NULL, 0, 0);
		flush(s, r);
	} else {
		advance(s, r, NULL);
	}
}

static void on_readable(struct storm *s, struct rank *r)
{
	ssize_t n = recv(r->fd, r->in + r->in_len, sizeof(r->in) - r->in_len, 0);
	size_t off = 0;

	if (n <= 0) {
		if (n < 0 && errno == EAGAIN)
			return;
		fail(s, n == 0 ? "server closed a connection" : "recv");
		return;
	}
	r->in_len += (size_t)n;
	while (off < r->in_len && r->step != S_DONE) {
		struct store_reply rep;
		size_t used;
		int rc = store_proto_decode_reply(r->op, 1, &s->lim, r->in + off, r->in_len - off,
						  &rep, &used);

		if (rc == CRUN_EAGAIN)
			break;
		if (rc < 0) {
			fail(s, "bad reply");
			return;
		}
		off += used;
		advance(s, r, &rep);
	}
	memmove(r->in, r->in + off, r->in_len - off);
	r->in_len -= off;
}

static int start_connect(struct storm *s, struct rank *r)
{
	struct sockaddr_in src = {.sin_family = AF_INET};
	struct epoll_event ev = {.events = EPOLLOUT, .data.ptr = r};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -errno;
	if (s->sources > 0) {
		/* 127.0.0.2 .. 127.0.0.(1 + sources), any port. */
		int one = 1;

		src.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + r->idx % s->sources);
		/* (A window too small for this run's ranks per address would
		 * hand a port out twice: the kernel's search then.) */
		if ((s->n + s->sources - 1) / s->sources < SRC_PORT_HI - SRC_PORT_LO)
			src.sin_port = htons(src_port(s, r->idx));
		/* SO_REUSEADDR: the port may still be in TIME_WAIT from an
		 * earlier storm (towards another server port). Held by a live
		 * socket: the kernel's search, as before. */
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0) {
			src.sin_port = 0;
			if (errno != EADDRINUSE ||
			    bind(fd, (struct sockaddr *)&src, sizeof(src)) < 0)
				goto fail;
		}
	}
	struct sockaddr_in dst = s->server;

	if (s->n_ports)
		dst.sin_port = htons(s->ports[MIN(r->idx / s->per_port, s->n_ports - 1)]);
	if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0 && errno != EINPROGRESS)
		goto fail;
	r->fd = fd;
	if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		goto fail;
	s->connecting++;
	return 0;
fail : {
	int e = -errno;

	close(fd);
	r->fd = -1;
	return e;
}
}

/* start_at: CLOCK_MONOTONIC ns to begin at (0: now), so that generators of
 * one world start together; src_port0: the source port window's start
 * (UINT32_MAX: one of this run's own). */
static int run(struct storm *s, uint32_t timeout_ms, uint64_t start_at, uint32_t src_port0)
{
	struct epoll_event evs[512];
	uint64_t deadline, now = now_ns();

	if (start_at > now) {
		uint64_t d = start_at - now;
		struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};

		while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
	}
	s->t_start = now_ns();
	/* A window of its own per run: ports the last storms left in TIME_WAIT
	 * are bound again (SO_REUSEADDR) only when the windows overlap. The
	 * generators of one world share one (ports follow the global rank). */
	s->src_port0 = src_port0 != UINT32_MAX
			   ? src_port0 % (SRC_PORT_HI - SRC_PORT_LO)
			   : (uint32_t)((s->t_start / 1000u) % (SRC_PORT_HI - SRC_PORT_LO));
	deadline = s->t_start + (uint64_t)timeout_ms * 1000000u;
	while (s->done < s->count && !s->error) {
		int n;

		while (s->next_connect < s->count && s->connecting < s->inflight) {
			struct rank *r = &s->ranks[s->next_connect];

			r->idx = s->first + s->next_connect++;
			int e = start_connect(s, r);

			if (e < 0) {
				snprintf(s->why, sizeof(s->why), "socket/bind/connect: %s",
					 strerror(-e));
				fail(s, s->why);
				break;
			}
		}
		if (now_ns() > deadline) {
			fail(s, "timed out");
			break;
		}
		n = epoll_wait(s->ep, evs, (int)ARRAY_SIZE(evs), 100);
		if (n < 0 && errno != EINTR)
			return -errno;
		for (int i = 0; i < n; i++) {
			struct rank *r = evs[i].data.ptr;

			if (evs[i].events & (EPOLLERR | EPOLLHUP) && r->step != S_CONNECTING) {
				fail(s, "connection error");
				continue;
			}
			if (r->step == S_CONNECTING) {
				on_connected(s, r);
				continue;
			}
			if (evs[i].events & EPOLLOUT) {
				want_out(s, r, 0);
				flush(s, r);
			}
			if (evs[i].events & EPOLLIN)
				on_readable(s, r);
		}
	}
	return s->error ? CRUN_EPROTO : 0;
}

static const char usage[] =
    "usage: storm [options]\n"
    "  --host ADDR        server address (127.0.0.1)\n"
    "  --port PORT        server port (required)\n"
    "  -n, --ranks N      simulated ranks (1..65536; each holds one connection); with\n"
    "                     --first/--count the world size (..131072) the barrier counts\n"
    "  --first R          this process drives ranks R .. R+C-1 of the N (0)\n"
    "  --count C          (N - R); the other ranks are other storm processes'\n"
    "  --start-at-ns T    begin at CLOCK_MONOTONIC time T, so that the processes of\n"
    "                     one world start together (0: now)\n"
    "  --src-port0 P      the source port window's start (shared by those processes)\n"
    "  --dialect v1|v2    PyTorch 1.13 or 2.x wire dialect (v2)\n"
    "  --prefix P         key prefix of the default group (/default_pg/, as 2.x under crun)\n"
    "  --sources K        spread connects over 127.0.0.2..127.0.0.(K+1) (8; 0: any)\n"
    "  --inflight C       concurrent connects (256)\n"
    "  --timeout-ms MS    give up after MS (120000)\n"
    "  --hold-ms MS       keep the connections MS after printing the result, so a\n"
    "                     caller can tell the server's work before and during the\n"
    "                     teardown (0)\n"
    "  --ports-file F     ports one a line (node-local proxies): rank i connects to\n"
    "                     line i / --per-port (8); --port is then not needed\n";

/* Reads up to STORM_MAX_RANKS ports, one a line. */
static int read_ports(struct storm *s, const char *path)
{
	FILE *f = fopen(path, "re");
	unsigned v;

	if (!f)
		return -1;
	s->ports = calloc(STORM_MAX_RANKS, sizeof(*s->ports));
	while (s->ports && s->n_ports < STORM_MAX_RANKS && fscanf(f, "%u", &v) == 1 && v &&
	       v < 65536)
		s->ports[s->n_ports++] = (uint16_t)v;
	fclose(f);
	return s->n_ports ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"host", required_argument, NULL, 'h'},
	    {"port", required_argument, NULL, 'p'},
	    {"ranks", required_argument, NULL, 'n'},
	    {"dialect", required_argument, NULL, 'd'},
	    {"prefix", required_argument, NULL, 'P'},
	    {"sources", required_argument, NULL, 's'},
	    {"inflight", required_argument, NULL, 'c'},
	    {"timeout-ms", required_argument, NULL, 't'},
	    {"hold-ms", required_argument, NULL, 'o'},
	    {"ports-file", required_argument, NULL, 'f'},
	    {"per-port", required_argument, NULL, 'k'},
	    {"first", required_argument, NULL, 'F'},
	    {"count", required_argument, NULL, 'C'},
	    {"start-at-ns", required_argument, NULL, 'S'},
	    {"src-port0", required_argument, NULL, 'W'},
	    {"help", no_argument, NULL, 'H'},
	    {NULL, 0, NULL, 0},
	};
	struct storm s = {.dialect = STORE_V2,
			  .sources = 8,
			  .inflight = 256,
			  .prefix = "/default_pg/",
			  .per_port = 8,
			  .lim = STORE_LIMITS_DEFAULT};
	const char *host = "127.0.0.1";
	unsigned long port = 0, timeout_ms = 120000, hold_ms = 0, v, count = 0;
	unsigned long long start_at = 0;
	uint32_t src_port0 = UINT32_MAX;
	struct rlimit rl;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "n:", longopts, NULL)) != -1) {
		char *end = NULL;

		switch (opt) {
		case 'h':
			host = optarg;
			continue;
		case 'P':
			s.prefix = optarg;
			continue;
		case 'f':
			if (read_ports(&s, optarg) < 0)
				goto bad;
			port = s.ports[0];
			continue;
		case 'd':
			if (strcmp(optarg, "v1") && strcmp(optarg, "v2"))
				goto bad;
			s.dialect = optarg[1] == '1' ? STORE_V1 : STORE_V2;
			continue;
		case 'H':
			fputs(usage, stdout);
			return 0;
		case 'S':
			errno = 0;
			start_at = strtoull(optarg, &end, 10);
			if (errno || !*optarg || *end)
				goto bad;
			continue;
		case 'p':
		case 'F':
		case 'C':
		case 'W':
		case 'n':
		case 's':
		case 'c':
		case 't':
		case 'o':
		case 'k':
			errno = 0;
			v = strtoul(optarg, &end, 10);
			if (errno || !*optarg || *end)
				goto bad;
			if (opt == 'p')
				port = v;
			else if (opt == 'n')
				s.n = (uint32_t)MIN(v, (unsigned long)UINT32_MAX);
			else if (opt == 's')
				s.sources = (uint32_t)MIN(v, 250ul);
			else if (opt == 'k')
				s.per_port = (uint32_t)MAX(MIN(v, 65536ul), 1ul);
			else if (opt == 'c')
				s.inflight = (uint32_t)MIN(v, 65536ul);
			else if (opt == 'o')
				hold_ms = MIN(v, 600000ul);
			else if (opt == 'F')
				s.first = (uint32_t)MIN(v, (unsigned long)STORM_MAX_WORLD);
			else if (opt == 'C')
				count = MIN(v, (unsigned long)STORM_MAX_WORLD);
			else if (opt == 'W')
				src_port0 = (uint32_t)MIN(v, 65535ul);
			else
				timeout_ms = v;
			continue;
		default:
			goto bad;
		}
	}
	if (port == 0 || port > 65535 || s.n == 0 || s.n > STORM_MAX_WORLD || s.inflight == 0 ||
	    s.first >= s.n)
		goto bad;
	s.count = count ? (uint32_t)count : s.n - s.first;
	if (s.count > STORM_MAX_RANKS || s.count > s.n - s.first)
		goto bad;
	s.server.sin_family = AF_INET;
	s.server.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, host, &s.server.sin_addr) != 1)
		goto bad;
	snprintf(s.init_key, sizeof(s.init_key), "init/");
	snprintf(s.barrier_key, sizeof(s.barrier_key), "%sstore_based_barrier_key:0", s.prefix);
	snprintf(s.last_key, sizeof(s.last_key), "%s:last_worker", s.barrier_key);
	snprintf(s.id_key, sizeof(s.id_key), "%s0//cuda//0", s.prefix);

	/* One descriptor per rank plus a few: raise the soft limit to the hard one. */
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
		if (rl.rlim_cur < (rlim_t)s.count + 16) {
			fprintf(stderr, "storm: %u ranks need %u descriptors; the limit is %llu\n",
				s.count, s.count + 16, (unsigned long long)rl.rlim_cur);
			return 2;
		}
	}
	s.ranks = calloc(s.count, sizeof(*s.ranks));
	s.ep = epoll_create1(EPOLL_CLOEXEC);
	if (!s.ranks || s.ep < 0) {
		fprintf(stderr, "storm: out of memory or descriptors\n");
		return 1;
	}
	rc = run(&s, (uint32_t)timeout_ms, start_at, src_port0);
	/* The *_ns times are CLOCK_MONOTONIC (one clock for every process of
	 * the machine): the caller of several generators takes the first start
	 * and the last done over all of them. */
	printf("{\"ranks\": %u, \"first\": %u, \"count\": %u, \"dialect\": \"v%d\", "
	       "\"ok\": %s, \"error\": \"%s\", "
	       "\"done\": %u, \"requests\": %" PRIu64 ", \"total_s\": %.6f, "
	       "\"connect_s\": %.6f, \"wake_s\": %.6f, \"fanout_s\": %.6f, "
	       "\"fanout_first_s\": %.6f, "
	       "\"woken\": %u, \"parked\": %u, \"setters\": %u, \"t_start_ns\": %" PRIu64
	       ", \"t_last_connect_ns\": %" PRIu64 ", \"t_done_ns\": %" PRIu64
	       ", \"t_first_set_ns\": %" PRIu64 ", \"t_last_wake_ns\": %" PRIu64 "}\n",
	       s.n, s.first, s.count, s.dialect, rc == 0 ? "true" : "false", s.error ? s.error : "",
	       s.done, s.requests, s.t_done ? (double)(s.t_done - s.t_start) / 1e9 : -1.0,
	       s.t_last_connect ? (double)(s.t_last_connect - s.t_start) / 1e9 : -1.0,
	       secs_between(s.t_last_set, s.t_last_parked),
	       secs_between(s.t_last_set, s.t_last_wake),
	       secs_between(s.t_last_set, s.t_first_wake), s.woken, s.parked, s.setters, s.t_start,
	       s.t_last_connect, s.t_done, s.t_last_set, s.t_last_wake);
	fflush(stdout);
	if (hold_ms) {
		struct timespec ts = {(time_t)(hold_ms / 1000), (long)(hold_ms % 1000) * 1000000L};

		nanosleep(&ts, NULL);
	}
	for (uint32_t i = 0; i < s.next_connect; i++)
		if (s.ranks[i].fd > 0)
			close(s.ranks[i].fd);
	close(s.ep);
	free(s.ranks);
	free(s.ports);
	return rc == 0 ? 0 : 1;
bad:
	fputs(usage, stderr);
	return 2;
}
