/* etcd_failover.c: how long the etcd backend's coordination stalls when a
 * member goes away (bench/etcd_failover.py kills or freezes the leader while
 * this runs). One handle adds to a counter back to back and keeps a lease
 * alive (TTL 10 s, with an expiry key); a second handle blocks on a key the
 * first sets at the end. Reports the longest gap between two successful
 * adds, whether the lease survived (its expiry key never set), and how late
 * the waiter woke after the final set.
 *
 *   etcd_failover HOST:PORT[,...] SECONDS
 * Prints one JSON line.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "rendezvous/coord.h"
#include "rendezvous/etcd_int.h"

static struct etcd_conf g_conf;
static char g_prefix[128];

struct waiter {
	int r;
	uint64_t woke_ms;
};

static int opn(struct coord **c)
{
	struct coord_opts o = {0};

	o.prefix = g_prefix;
	o.connect_timeout_ms = 30000;
	o.timeout_ms = 30000;
	o.etcd = &g_conf;
	return coord_open(&o, c);
}

static void *wait_main(void *arg)
{
	struct waiter *w = arg;
	struct coord *c = NULL;

	w->r = opn(&c);
	if (w->r == 0)
		w->r = coord_wait(c, "stop", 120000);
	w->woke_ms = clock_now_ms();
	coord_close(c);
	return NULL;
}

int main(int argc, char **argv)
{
	struct waiter w = {0};
	struct coord *c = NULL;
	uint64_t secs, id = 0, t0, last, gap = 0, gap_at = 0, ops = 0, set_ms, last_ka;
	int64_t v;
	char err[256];
	pthread_t thr;
	int r, lease_lost = 0, failed_ops = 0;

	log_init("etcd_failover", LL_ERROR);
	signal(SIGPIPE, SIG_IGN);
	if (argc != 3 || etcd_parse_endpoints(argv[1], &g_conf, err, sizeof(err)) < 0 ||
	    parse_uint_range(argv[2], 1, 3600, &secs) < 0) {
		fprintf(stderr, "usage: etcd_failover HOST:PORT[,...] SECONDS\n");
		return 2;
	}
	snprintf(g_prefix, sizeof(g_prefix), "/crun/bench/failover-%d", (int)getpid());
	r = opn(&c);
	if (r == 0)
		r = coord_lease_grant(c, 10000, "lapsed", "lease lost", &id);
	if (r < 0) {
		fprintf(stderr, "etcd_failover: %s\n", c ? coord_last_error(c) : crun_strerror(r));
		return 1;
	}
	pthread_create(&thr, NULL, wait_main, &w);
	t0 = last = last_ka = clock_now_ms();
	while (clock_now_ms() - t0 < secs * 1000) {
		uint64_t now;

		r = coord_add(c, "n", 1, &v);
		now = clock_now_ms();
		if (r < 0) {
			failed_ops++;
			continue;
		}
		ops++;
		if (now - last > gap) {
			gap = now - last;
			gap_at = last - t0;
		}
		last = now;
		if (now - last_ka >= 1000) {
			lease_lost |= coord_lease_keepalive(c, id) == CRUN_ENOTFOUND;
			last_ka = now;
		}
	}
	lease_lost |= coord_exists(c, "lapsed") == 1;
	set_ms = clock_now_ms();
	r = coord_set(c, "stop", "1");
	pthread_join(thr, NULL);
	printf("{\"bench\":\"etcd_failover\",\"ops\":%" PRIu64 ",\"failed_ops\":%d,"
	       "\"max_gap_ms\":%" PRIu64 ",\"gap_at_ms\":%" PRIu64 ",\"lease_kept\":%s,"
	       "\"counter_ok\":%s,\"waiter_ok\":%s,\"waiter_lag_ms\":%" PRIu64 "}\n",
	       ops, failed_ops, gap, gap_at, lease_lost ? "false" : "true",
	       v == (int64_t)ops ? "true" : "false", r == 0 && w.r == 0 ? "true" : "false",
	       w.woke_ms > set_ms ? w.woke_ms - set_ms : 0);
	(void)coord_lease_revoke(c, id);
	coord_close(c);
	return 0;
}
