/* crun-nodecheck: the node check an agent runs after a round and before its
 * workers (--node_check, --max_node_failures; agent/nodecheck.c starts it).
 * One process per node: a CPU GEMM timed for --gemm-ms (the SDK's blocked
 * kernel: GFLOP/s), then a ring all_reduce of 4 MiB between the round's nodes
 * over the SDK's TCP transport (bus GB/s), then every node's result is
 * exchanged through the round's worker store under "crun-nodecheck/<ns>/" so
 * every node prints the same table. Each node acknowledges the table and
 * waits (bounded) for the others' acknowledgements, so no node moves on
 * (opens a next round) before every node has read it.
 *
 * Output, on stdout, one line per node in group-rank order, then "end":
 *     node RANK GFLOPS GBPS FAILURES PINNED ok|failed|missing HOST
 * Exit codes: 0 with the table printed, 1 when the store cannot be used, 2
 * for a bad argument.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "crun/store.h"
#include "crun/worker.h"
#include "kernels/kernels.h"

#define PROG	     "crun-nodecheck"
#define GEMM_N	     128	/* one product: 4 MFLOP, about a millisecond */
#define GEMM_WINDOWS 5		/* see gemm_rate */
#define RING_FLOATS  (1u << 20) /* 4 MiB: past the SDK's ring threshold */
#define RING_ITERS   5
#define NODES_MAX    4096
#define RESULT_MAX   384

struct args {
	char host[256];
	uint16_t port;
	int rank, world, ns, failures, pinned;
	const char *node, *addr;
	uint32_t gemm_ms, timeout_ms;
	bool measure;
};

static int usage(const char *why)
{
	fprintf(stderr,
		PROG ": %s\nusage: " PROG
		     " --store HOST:PORT --rank R --world W --ns N --node NAME "
		     "[--addr ADDR] [--failures F] [--pinned 0|1] [--gemm-ms MS] [--timeout-ms MS] "
		     "[--no-measure]\n",
		why);
	return 2;
}

static int num(const char *v, uint64_t max, uint64_t *ret)
{
	return parse_uint_range(v, 0, max, ret);
}

static int parse_args(int argc, char **argv, struct args *a)
{
	static const struct option lo[] = {
	    {"store", 1, 0, 's'},      {"rank", 1, 0, 'r'},	  {"world", 1, 0, 'w'},
	    {"ns", 1, 0, 'n'},	       {"node", 1, 0, 'N'},	  {"addr", 1, 0, 'a'},
	    {"failures", 1, 0, 'f'},   {"pinned", 1, 0, 'p'},	  {"gemm-ms", 1, 0, 'g'},
	    {"timeout-ms", 1, 0, 't'}, {"no-measure", 0, 0, 'm'}, {0, 0, 0, 0},
	};
	uint64_t v = 0;
	int o;

	a->gemm_ms = 500;
	a->timeout_ms = 60000;
	a->measure = true;
	a->world = 0;
	while ((o = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		const char *bad = NULL;

		switch (o) {
		case 's':
			if (parse_host_port(optarg, 0, a->host, sizeof(a->host), &a->port) < 0 ||
			    !a->port)
				bad = "--store: want HOST:PORT";
			break;
		case 'r':
		case 'w':
		case 'n':
		case 'f':
		case 'p':
		case 'g':
		case 't':
			if (num(optarg, o == 'w' ? NODES_MAX : INT32_MAX, &v) < 0) {
				bad = "a numeric option has a bad value";
				break;
			}
			if (o == 'g' || o == 't')
				*(o == 'g' ? &a->gemm_ms : &a->timeout_ms) = (uint32_t)v;
			else
				*(o == 'r'   ? &a->rank
				  : o == 'w' ? &a->world
				  : o == 'n' ? &a->ns
				  : o == 'f' ? &a->failures
					     : &a->pinned) = (int)v;
			break;
		case 'N':
			a->node = optarg;
			break;
		case 'a':
			a->addr = optarg;
			break;
		case 'm':
			a->measure = false;
			break;
		default:
			bad = "unknown option";
		}
		if (bad)
			return usage(bad);
	}
	if (!a->port || a->world < 1 || a->rank >= a->world || !a->node || strchr(a->node, ' '))
		return usage("--store, --world, a --rank below it and a --node without spaces are "
			     "needed");
	return 0;
}

/* GFLOP/s of GEMM_N^3 products run back to back for at least ms. */
static double gemm_window(float *m, uint32_t ms)
{
	size_t n = GEMM_N;
	uint64_t t0 = clock_now_ms(), el;
	long iters = 0;

	do {
		if (kernels_gemm_f32(n, n, n, m, n, m + n * n, n, m + 2 * n * n, n, 0) < 0)
			break;
		iters++;
	} while ((el = clock_now_ms() - t0) < ms && iters < (1L << 30));
	el = clock_now_ms() - t0;
	return el ? 2.0 * (double)(n * n * n) * (double)iters / ((double)el * 1e6) : 0;
}

/* The best of GEMM_WINDOWS windows filling ms: a healthy node that a
 * neighbour's burst starves for a moment is slow in some windows, not all
 * (one 500 ms window made a starved healthy node look as slow as a
 * throttled one, and the median moved); a node that is slow all the time
 * (a 5 % CPU quota: at most two of its 100 ms periods' quota in a window)
 * is slow in every one. */
static double gemm_rate(uint32_t ms)
{
	size_t n = GEMM_N;
	float *m = malloc(3 * n * n * sizeof(float));
	double best = 0;

	if (!m)
		return 0;
	for (size_t i = 0; i < 3 * n * n; i++)
		m[i] = (float)(i % 7) * 0.25f;
	for (int w = 0; w < GEMM_WINDOWS; w++)
		best = MAX(best, gemm_window(m, MAX(ms / GEMM_WINDOWS, 1)));
	free(m);
	return best;
}

/* Bus GB/s of a ring all_reduce between the nodes (the SDK's TCP
 * transport), or a negative code. Keys go to the "crun/a<ns>/" namespace of
 * the worker store, which the workers' attempts never use. */
static int ring_rate(const struct args *a, double *ret_gbps)
{
	crun_init_opts_t o = CRUN_INIT_OPTS_INIT;
	float *buf = calloc(RING_FLOATS, sizeof(float));
	uint64_t t0, el;
	int r;

	if (!buf)
		return CRUN_ENOMEM;
	(void)setenv("CRUN_PG_TRANSPORT", "tcp", 1);
	if (a->addr && *a->addr)
		(void)setenv("CRUN_PG_ADDR", a->addr, 1);
	o.rank = a->rank;
	o.world_size = a->world;
	o.master_addr = a->host;
	o.master_port = a->port;
	o.restart_count = a->ns;
	o.use_agent_store = 1;
	o.timeout_ms = a->timeout_ms;
	o.backend = "cpu";
	r = crun_init_explicit(&o);
	if (r < 0)
		goto out;
	r = crun_all_reduce(crun_world(), buf, buf, RING_FLOATS, CRUN_F32, CRUN_SUM, NULL);
	t0 = clock_now_ms();
	for (int i = 0; r == 0 && i < RING_ITERS; i++)
		r = crun_all_reduce(crun_world(), buf, buf, RING_FLOATS, CRUN_F32, CRUN_SUM, NULL);
	el = clock_now_ms() - t0;
	if (r == 0)
		*ret_gbps = 2.0 * (a->world - 1) / a->world * (double)RING_FLOATS * sizeof(float) *
			    RING_ITERS / ((double)(el ? el : 1) * 1e6);
	else
		fprintf(stderr, PROG ": all_reduce failed: %s\n", crun_pg_last_error(crun_world()));
	crun_finalize();
out:
	if (r < 0 && r != CRUN_EPEER)
		fprintf(stderr, PROG ": all_reduce: %s (%s)\n", crun_strerror(r),
			crun_pg_last_error(NULL));
	free(buf);
	return r;
}

static int key_of(char *buf, size_t cap, int ns, const char *what, int rank)
{
	int r = str_printf(buf, cap, "crun-nodecheck/%d/%s/%d", ns, what, rank);

	return r < 0 ? r : 0;
}

/* Publishes this node's result, prints every node's (waiting for each until
 * the deadline), then acknowledges and waits for the acknowledgements of the
 * nodes that answered. */
static int exchange(crun_store_t *s, const struct args *a, const char *mine)
{
	uint64_t deadline = clock_now_ms() + a->timeout_ms;
	char(*keys)[64] = calloc((size_t)a->world, sizeof(*keys));
	const char **acks = calloc((size_t)a->world, sizeof(*acks));
	char key[64];
	size_t nok = 0;
	int r;

	r = CRUN_ENOMEM;
	if (!keys || !acks)
		goto out;
	r = key_of(key, sizeof(key), a->ns, "r", a->rank);
	if (r == 0)
		r = crun_store_set(s, key, mine, strlen(mine));
	for (int i = 0; r == 0 && i < a->world; i++) {
		uint64_t now = clock_now_ms();
		void *v = NULL;
		size_t n = 0;
		int g;

		r = key_of(key, sizeof(key), a->ns, "r", i);
		if (r < 0)
			break;
		g = crun_store_get(s, key, now < deadline ? (uint32_t)(deadline - now) : 1, &v, &n);
		if (g == 0 && n < RESULT_MAX &&
		    key_of(keys[nok], sizeof(keys[nok]), a->ns, "ack", i) == 0) {
			printf("node %d %s\n", i, (char *)v);
			acks[nok] = keys[nok];
			nok++;
		} else {
			printf("node %d 0 0 0 0 missing ?\n", i);
		}
		crun_free(v);
	}
	if (r < 0)
		goto out;
	printf("end\n");
	fflush(stdout);
	r = key_of(key, sizeof(key), a->ns, "ack", a->rank);
	if (r == 0)
		r = crun_store_set(s, key, "1", 1);
	if (r == 0) {
		uint64_t now = clock_now_ms();

		r = crun_store_wait(s, acks, nok, now < deadline ? (uint32_t)(deadline - now) : 1);
	}
out:
	free(keys);
	free(acks);
	return r;
}

int main(int argc, char **argv)
{
	crun_store_opts_t so = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;
	struct args a = {0};
	char mine[RESULT_MAX];
	double gf = 0, bw = 0;
	bool ok = true;
	int r;

	r = parse_args(argc, argv, &a);
	if (r)
		return r;
	if (a.measure) {
		gf = gemm_rate(a.gemm_ms);
		ok = gf > 0;
		if (a.world > 1 && ring_rate(&a, &bw) < 0)
			ok = false;
	}
	(void)snprintf(mine, sizeof(mine), "%.3f %.3f %d %d %s %s", gf, bw, a.failures, a.pinned,
		       ok ? "ok" : "failed", a.node);
	so.host = a.host;
	so.port = a.port;
	so.connect_timeout_ms = a.timeout_ms;
	so.timeout_ms = a.timeout_ms;
	r = crun_store_open(&so, &s);
	if (r < 0) {
		fprintf(stderr, PROG ": cannot reach the worker store %s:%u: %s\n", a.host, a.port,
			crun_strerror(r));
		return 1;
	}
	r = exchange(s, &a, mine);
	if (r < 0)
		fprintf(stderr, PROG ": exchanging results in the worker store: %s\n",
			crun_strerror(r));
	crun_store_close(s);
	return r < 0 ? 1 : 0;
}
