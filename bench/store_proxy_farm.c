/* store_proxy_farm.c: P node-local store proxies (store/proxy.h) on one event
 * loop, each with its own listener and its own upstream connections to one
 * store, standing in for the proxies of P nodes in the worker-init storm
 * (bench/storm_bench.py, cell crun-proxy) and for the proxy's integration
 * tests (P = 1).
 *
 *   store_proxy_farm --upstream HOST:PORT --proxies P --ports-file FILE
 *
 * Writes the P listening ports to FILE (one a line, written whole, then
 * renamed into place) once every listener is up, serves until SIGTERM or
 * SIGINT, then prints the proxies' summed counters as one JSON line on
 * stdout. Exits 3 when an upstream was lost (every proxy's clients closed),
 * as the workers of a node would see it.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/proxy.h"

#define FARM_MAX 8192

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	(void)sig;
	(void)what;
	event_base_loopexit(arg, NULL);
}

static void on_fail(void *arg)
{
	int *lost = arg;

	(*lost)++;
}

static int write_ports(const char *path, struct store_proxy **px, uint32_t n)
{
	char tmp[4096];
	FILE *f;

	if (str_printf(tmp, sizeof(tmp), "%s.tmp", path) < 0)
		return CRUN_EINVAL;
	f = fopen(tmp, "we");
	if (!f)
		return CRUN_EIO;
	for (uint32_t i = 0; i < n; i++)
		fprintf(f, "%u\n", store_proxy_port(px[i]));
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		return CRUN_EIO;
	return 0;
}

static const char usage[] =
    "usage: store_proxy_farm --upstream HOST:PORT --proxies P --ports-file FILE\n"
    "                        [--listen ADDR] [--allow-remote]\n";

int main(int argc, char **argv)
{
	const char *up = NULL, *ports = NULL, *listen = "127.0.0.1";
	char host[256];
	uint16_t port = 0;
	uint64_t n = 1;
	bool allow_remote = false;
	struct store_proxy **px = NULL;
	struct event_base *base = NULL;
	struct event *sterm = NULL, *sint = NULL;
	struct store_proxy_stats sum = {0};
	struct rlimit rl;
	int lost = 0, rc = 1, r;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--allow-remote") == 0) {
			allow_remote = true;
			continue;
		}
		if (!v)
			goto bad;
		i++;
		if (strcmp(a, "--upstream") == 0)
			up = v;
		else if (strcmp(a, "--ports-file") == 0)
			ports = v;
		else if (strcmp(a, "--listen") == 0)
			listen = v;
		else if (strcmp(a, "--proxies") == 0) {
			if (parse_uint_range(v, 1, FARM_MAX, &n) < 0)
				goto bad;
		} else
			goto bad;
	}
	if (!up || !ports || parse_host_port(up, 0, host, sizeof(host), &port) < 0 || !port)
		goto bad;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &rl);
	}
	signal(SIGPIPE, SIG_IGN);
	base = event_base_new();
	px = calloc(n, sizeof(*px));
	if (!base || !px)
		goto out;
	for (uint64_t i = 0; i < n; i++) {
		struct store_proxy_config cfg = STORE_PROXY_CONFIG_DEFAULT;

		cfg.listen_host = listen;
		cfg.upstream_host = host;
		cfg.upstream_port = port;
		cfg.allow_remote = allow_remote;
		cfg.on_fail = on_fail;
		cfg.arg = &lost;
		r = store_proxy_new(base, &cfg, &px[i]);
		if (r < 0) {
			fprintf(stderr, "store_proxy_farm: proxy %" PRIu64 ": %s\n", i,
				crun_strerror(r));
			goto out;
		}
	}
	if (write_ports(ports, px, (uint32_t)n) < 0) {
		fprintf(stderr, "store_proxy_farm: cannot write '%s'\n", ports);
		goto out;
	}
	sterm = evsignal_new(base, SIGTERM, on_signal, base);
	sint = evsignal_new(base, SIGINT, on_signal, base);
	if (!sterm || !sint || event_add(sterm, NULL) || event_add(sint, NULL))
		goto out;
	event_base_dispatch(base);
	for (uint64_t i = 0; i < n; i++) {
		struct store_proxy_stats st;

		store_proxy_get_stats(px[i], &st);
		sum.accepted += st.accepted;
		sum.refused += st.refused;
		sum.requests += st.requests;
		sum.local_replies += st.local_replies;
		sum.waits += st.waits;
		sum.waits_ready += st.waits_ready;
		sum.upstream_waits += st.upstream_waits;
		sum.passthrough += st.passthrough;
		sum.dropped += st.dropped;
		sum.upstream_conns += st.upstream_conns;
	}
	printf("{\"proxies\": %" PRIu64 ", \"lost\": %d, \"accepted\": %" PRIu64
	       ", \"refused\": %" PRIu64 ", \"requests\": %" PRIu64 ", \"local_replies\": %" PRIu64
	       ", \"waits\": %" PRIu64 ", \"waits_ready\": %" PRIu64
	       ", \"upstream_waits\": %" PRIu64 ", \"passthrough\": %" PRIu64
	       ", \"dropped\": %" PRIu64 ", \"upstream_conns\": %" PRIu64 "}\n",
	       n, lost, sum.accepted, sum.refused, sum.requests, sum.local_replies, sum.waits,
	       sum.waits_ready, sum.upstream_waits, sum.passthrough, sum.dropped,
	       sum.upstream_conns);
	fflush(stdout);
	rc = lost ? 3 : 0;
out:
	if (px)
		for (uint64_t i = 0; i < n; i++)
			store_proxy_free(px[i]);
	free(px);
	if (sterm)
		event_free(sterm);
	if (sint)
		event_free(sint);
	if (base)
		event_base_free(base);
	return rc;
bad:
	fputs(usage, stderr);
	return 2;
}
