/* test_coord.c: conformance of the coordination interface (coord.h). The same
 * cases run against every backend in one table: the crun store (a server on
 * a loop thread) and etcd (a real one-member etcd on loopback ports, from
 * Debian's etcd-server). Counters, get/set/exists, waits that time out and
 * then succeed, multi_get, compare-and-set semantics, concurrent tickets and
 * CAS winners, leases: revoke is not an expiry, a lapsed lease sets its
 * expiry key and wakes a waiter, closing the holder ends its lease, the
 * first value wins; and every socket the backend opens is close-on-exec.
 * etcd alone: a counter update whose answer is lost (and whose first send
 * reaches etcd only after the resend) counts once.
 */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "common/common.h"
#include "rendezvous/coord.h"
#include "rendezvous/etcd_int.h"
#include "store/server.h"
#include "unit/check_main.h"

#define ETCD_BIN "/usr/bin/etcd"

/* ---- backends ------------------------------------------------------------------- */

static struct event_base *g_base;
static struct store_server *g_srv;
static pthread_t g_thread;
static uint16_t g_store_port;

static pid_t g_etcd_pid;
static char g_etcd_dir[256];
static struct etcd_conf g_etcd;

static void *loop_main(void *arg)
{
	(void)arg;
	event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void store_up_version(uint32_t ext_version)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	g_base = event_base_new();
	ck_assert_ptr_nonnull(g_base);
	c.host = "127.0.0.1";
	c.ext_version = ext_version;
	ck_assert_int_eq(store_server_new(g_base, &c, &g_srv), 0);
	g_store_port = store_server_port(g_srv);
	ck_assert_int_eq(pthread_create(&g_thread, NULL, loop_main, NULL), 0);
}

static void store_up(void)
{
	store_up_version(0);
}

/* A crun-rdzvd from before extension version 4 (no TRY_GET, WAIT_ANY_GET,
 * TICKET, GRANT_SET): every case must pass on it too, through the fallbacks. */
static void store_up_v3(void)
{
	store_up_version(3);
}

static void store_down(void)
{
	event_base_loopbreak(g_base);
	pthread_join(g_thread, NULL);
	store_server_free(g_srv);
	event_base_free(g_base);
}

static uint16_t free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t l = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
	close(fd);
	return ntohs(a.sin_port);
}

/* One etcd member for the whole binary (an unchecked fixture: it outlives
 * the forked test processes). */
static void etcd_up(void)
{
	uint16_t cp = free_port(), pp = free_port();
	char curl[64], purl[64], cluster[96], log[300];

	ck_assert_msg(access(ETCD_BIN, X_OK) == 0,
		      ETCD_BIN " is missing: install Debian's etcd-server (make test does)");
	snprintf(g_etcd_dir, sizeof(g_etcd_dir), "/tmp/crun-test-coord-%d", (int)getpid());
	mkdir(g_etcd_dir, 0700);
	snprintf(curl, sizeof(curl), "http://127.0.0.1:%u", cp);
	snprintf(purl, sizeof(purl), "http://127.0.0.1:%u", pp);
	snprintf(cluster, sizeof(cluster), "n0=%s", purl);
	snprintf(log, sizeof(log), "%s/etcd.log", g_etcd_dir);
	/* The child must not touch Check before exec: every ck_assert writes a
	 * location record to Check's message file, whose offset the child
	 * shares with this process, and this fixture's parent reads that file
	 * back as soon as etcd_up returns; a child's write landing in the middle
	 * of that read broke the stream ("Bad message type arg 1919168099",
	 * i.e. "rd.c" of "test_coord.c" read as a type). So assert on the
	 * parent's side only. */
	g_etcd_pid = fork();
	if (g_etcd_pid == 0) {
		char data[300];
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

		/* etcd gets 0-2 only: not Check's message file, not the log fd. */
		close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
		snprintf(data, sizeof(data), "%s/data", g_etcd_dir);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		execl(ETCD_BIN, "etcd", "--name", "n0", "--data-dir", data, "--listen-client-urls",
		      curl, "--advertise-client-urls", curl, "--listen-peer-urls", purl,
		      "--initial-advertise-peer-urls", purl, "--initial-cluster", cluster,
		      "--log-level", "warn", (char *)NULL);
		_exit(127);
	}
	ck_assert_int_ge(g_etcd_pid, 0);
	memset(&g_etcd, 0, sizeof(g_etcd));
	g_etcd.n_ep = 1;
	snprintf(g_etcd.ep[0].host, sizeof(g_etcd.ep[0].host), "127.0.0.1");
	g_etcd.ep[0].port = cp;
}

static void etcd_down(void)
{
	char cmd[320];

	if (g_etcd_pid > 0) {
		kill(g_etcd_pid, SIGTERM);
		waitpid(g_etcd_pid, NULL, 0);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_etcd_dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", g_etcd_dir);
}

static void nothing(void)
{
}

struct backend {
	const char *name;
	void (*up)(void); /* per test, in the test's process */
	void (*down)(void);
	void (*open_opts)(struct coord_opts *o);
};

static void store_opts(struct coord_opts *o)
{
	o->host = "127.0.0.1";
	o->port = g_store_port;
}

/* ...and one of version 4 (no WAIT_ANY_GET_WITH). */
static void store_up_v4(void)
{
	store_up_version(4);
}

static void etcd_opts(struct coord_opts *o)
{
	o->etcd = &g_etcd;
}

static const struct backend backends[] = {
    {"store", store_up, store_down, store_opts},
    {"etcd", nothing, nothing, etcd_opts},
    {"store-v3", store_up_v3, store_down, store_opts},
    {"store-v4", store_up_v4, store_down, store_opts},
};
#define NB ((int)(sizeof(backends) / sizeof(backends[0])))

static const struct backend *g_b;
static char g_prefix[64];

static struct coord *opn(void)
{
	struct coord_opts o = {0};
	struct coord *c = NULL;
	int r;

	o.prefix = g_prefix;
	o.connect_timeout_ms = 30000; /* etcd may still be starting */
	o.timeout_ms = 10000;
	g_b->open_opts(&o);
	r = coord_open(&o, &c);
	ck_assert_msg(r == 0, "%s: coord_open: %s", g_b->name, crun_strerror(r));
	return c;
}

/* Each test: the backend of loop index _i, a fresh key prefix. */
static void begin(int i)
{
	static int seq;

	g_b = &backends[i];
	g_b->up();
	snprintf(g_prefix, sizeof(g_prefix), "test-%d-%d", (int)getpid(), ++seq);
}

static void end(void)
{
	g_b->down();
}

static void expect(struct coord *c, const char *key, const char *want)
{
	char *v = NULL;
	int r = coord_get(c, key, 5000, &v);

	ck_assert_msg(r == 0, "%s: get %s: %s (%s)", g_b->name, key, crun_strerror(r),
		      coord_last_error(c));
	ck_assert_str_eq(v, want);
	free(v);
}

static void cas(struct coord *c, const char *k, const char *exp, const char *des, const char *want)
{
	char *cur = NULL;
	int r = coord_compare_set(c, k, exp, des, &cur);

	ck_assert_msg(r == 0, "%s: cas: %s", g_b->name, coord_last_error(c));
	ck_assert_msg(strcmp(cur, want) == 0, "%s: cas(%s,'%s','%s') gave '%s', want '%s'",
		      g_b->name, k, exp, des, cur, want);
	free(cur);
}

/* ---- cases ------------------------------------------------------------------------ */

START_TEST(counters)
{
	struct coord *c;
	int64_t v = -1;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_add(c, "n", 1, &v), 0);
	ck_assert_int_eq(v, 1);
	ck_assert_int_eq(coord_add(c, "n", 0, &v), 0);
	ck_assert_int_eq(v, 1);
	ck_assert_int_eq(coord_add(c, "n", 5, &v), 0);
	ck_assert_int_eq(v, 6);
	ck_assert_int_eq(coord_add(c, "n", -2, &v), 0);
	ck_assert_int_eq(v, 4);
	expect(c, "n", "4");
	/* Adding 0 to an absent counter creates it. */
	ck_assert_int_eq(coord_exists(c, "z"), 0);
	ck_assert_int_eq(coord_add(c, "z", 0, &v), 0);
	ck_assert_int_eq(v, 0);
	ck_assert_int_eq(coord_exists(c, "z"), 1);
	expect(c, "z", "0");
	/* A counter compares as its number (the round counter's CAS). */
	cas(c, "z", "0", "1", "1");
	cas(c, "z", "0", "2", "1");
	ck_assert_int_eq(coord_add(c, "z", 1, &v), 0);
	ck_assert_int_eq(v, 2);
	/* A number written with set counts on from there. */
	ck_assert_int_eq(coord_set(c, "s", "41"), 0);
	ck_assert_int_eq(coord_add(c, "s", 1, &v), 0);
	ck_assert_int_eq(v, 42);
	ck_assert_int_eq(coord_add(c, "s", 1, &v), 0);
	ck_assert_int_eq(v, 43);
	expect(c, "s", "43");
	ck_assert_int_eq(coord_add(c, "fresh", 1, &v), 0);
	ck_assert_int_eq(v, 1);
	coord_close(c);
	end();
}
END_TEST

START_TEST(set_get_exists)
{
	struct coord *c;
	char *v = NULL;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_exists(c, "k"), 0);
	ck_assert_int_eq(coord_try_get(c, "k", &v), CRUN_ENOTFOUND);
	ck_assert_int_eq(coord_set(c, "k", "v1"), 0);
	ck_assert_int_eq(coord_exists(c, "k"), 1);
	expect(c, "k", "v1");
	ck_assert_int_eq(coord_set(c, "k", "v2 with spaces"), 0);
	ck_assert_int_eq(coord_try_get(c, "k", &v), 0);
	ck_assert_str_eq(v, "v2 with spaces");
	free(v);
	/* A key known to be there: one read, no wait before it. */
	ck_assert_int_eq(coord_get_now(c, "k", &v), 0);
	ck_assert_str_eq(v, "v2 with spaces");
	free(v);
	/* Keys sharing a prefix stay apart. */
	ck_assert_int_eq(coord_set(c, "k0", "other"), 0);
	expect(c, "k", "v2 with spaces");
	ck_assert_int_eq(coord_set(c, "empty", ""), 0);
	ck_assert_int_eq(coord_exists(c, "empty"), 1);
	expect(c, "empty", "");
	coord_close(c);
	end();
}
END_TEST

/* All of n keys, in one look that never waits: the closer's "are all
 * tickets alive?" (a 1 ms MULTI_GET before, which a busy store turned into
 * n lookups). */
START_TEST(exists_all_looks_without_waiting)
{
	const char *keys[] = {"a1", "a2", "a3"};
	struct coord *c;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_set(c, "a1", "x"), 0);
	ck_assert_int_eq(coord_set(c, "a3", "x"), 0);
	ck_assert_int_eq(coord_exists_all(c, keys, 3), 0);
	ck_assert_int_eq(coord_set(c, "a2", ""), 0);
	ck_assert_int_eq(coord_exists_all(c, keys, 3), 1);
	ck_assert_int_eq(coord_exists_all(c, keys, 1), 1);
	ck_assert_int_eq(coord_exists(c, "a1"), 1); /* the handle stays usable */
	coord_close(c);
	end();
}
END_TEST

struct later {
	const char *keys[4];
	int n;
	useconds_t delay_us;
};

static void *set_later(void *arg)
{
	struct later *l = arg;
	struct coord *c = opn();

	usleep(l->delay_us);
	for (int i = 0; i < l->n; i++) {
		char v[32];

		snprintf(v, sizeof(v), "val-%s", l->keys[i]);
		ck_assert_int_eq(coord_set(c, l->keys[i], v), 0);
	}
	coord_close(c);
	return NULL;
}

START_TEST(get_waits_and_times_out)
{
	struct later l = {.keys = {"late"}, .n = 1, .delay_us = 300000};
	struct coord *c;
	pthread_t t;
	char *v = NULL;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_get(c, "never", 200, &v), CRUN_ETIMEDOUT);
	ck_assert_int_eq(coord_wait(c, "never", 100), CRUN_ETIMEDOUT);
	/* The handle stays usable after a timeout. */
	ck_assert_int_eq(coord_set(c, "after", "ok"), 0);
	expect(c, "after", "ok");
	ck_assert_int_eq(pthread_create(&t, NULL, set_later, &l), 0);
	ck_assert_int_eq(coord_get(c, "late", 20000, &v), 0);
	ck_assert_str_eq(v, "val-late");
	free(v);
	pthread_join(t, NULL);
	ck_assert_int_eq(coord_wait(c, "late", 100), 0);
	ck_assert_int_eq(coord_watch(c, "late", 100), 0);
	coord_close(c);
	end();
}
END_TEST

START_TEST(wait_on_one_key_repeatedly)
{
	struct later l = {.keys = {"w"}, .n = 1, .delay_us = 500000};
	struct coord *c;
	pthread_t t;
	int r = CRUN_ETIMEDOUT, n = 0;

	/* Short waits in a loop, as the round algorithm does: each times out
	 * until the key appears, then succeeds. */
	begin(_i);
	c = opn();
	ck_assert_int_eq(pthread_create(&t, NULL, set_later, &l), 0);
	for (; n < 400 && r == CRUN_ETIMEDOUT; n++)
		r = coord_wait(c, "w", 50);
	ck_assert_int_eq(r, 0);
	ck_assert_int_gt(n, 1);
	pthread_join(t, NULL);
	coord_close(c);
	end();
}
END_TEST

START_TEST(present_stays_present_across_waits)
{
	struct coord *c;

	/* A wait that armed a watch on an absent key, the key set by this
	 * handle, then repeated reads: each finds it at once (a read after a
	 * "present" must not wait for another change). */
	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_wait(c, "p", 50), CRUN_ETIMEDOUT);
	ck_assert_int_eq(coord_set(c, "p", "1"), 0);
	ck_assert_int_eq(coord_wait(c, "p", 200), 0);
	ck_assert_int_eq(coord_wait(c, "p", 200), 0);
	expect(c, "p", "1");
	ck_assert_int_eq(coord_wait(c, "p", 200), 0);
	coord_close(c);
	end();
}
END_TEST

/* coord_wait_any: the index of whichever key appears first, at once for a
 * present one, a timeout that leaves the handle usable, and a lapsed lease's
 * expiry key counting as set. */
START_TEST(wait_any_wakes_on_the_first_key)
{
	struct later l = {.keys = {"b"}, .n = 1, .delay_us = 300000};
	const char *abc[] = {"a", "b", "c"}, *ca[] = {"c", "a"}, *yx[] = {"y", "x"};
	struct coord *c, *holder;
	pthread_t t;
	uint64_t id = 0;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_wait_any(c, abc, 3, 100), CRUN_ETIMEDOUT);
	ck_assert_int_eq(coord_set(c, "after", "ok"), 0);
	expect(c, "after", "ok");
	ck_assert_int_eq(pthread_create(&t, NULL, set_later, &l), 0);
	ck_assert_int_eq(coord_wait_any(c, abc, 3, 20000), 1);
	pthread_join(t, NULL);
	ck_assert_int_eq(coord_wait_any(c, abc, 3, 100), 1);
	ck_assert_int_eq(coord_wait_any(c, ca, 2, 100), CRUN_ETIMEDOUT);
	ck_assert_int_eq(coord_set(c, "c", "1"), 0);
	ck_assert_int_eq(coord_wait_any(c, abc, 3, 100), 1); /* the lowest present */
	/* A lease's expiry key, set by its lapse. */
	holder = opn();
	ck_assert_int_eq(coord_lease_grant(holder, 1000, "x", "dead", &id), 0);
	ck_assert_int_eq(coord_wait_any(c, yx, 2, 20000), 1);
	expect(c, "x", "dead");
	coord_close(holder);
	coord_close(c);
	end();
}
END_TEST

/* The folded calls (one request each on a crun store of extension version
 * 4, two elsewhere): same results on every backend. */
START_TEST(folded_calls_do_what_their_two_requests_did)
{
	const char *ab[] = {"fa", "fb"}, *eachk[] = {"fa", "fb", "fc"};
	struct later l = {.keys = {"fb"}, .n = 1, .delay_us = 300000};
	struct coord *c, *holder;
	char *v = NULL;
	int64_t t = 0;
	uint64_t id = 0;
	bool live[3] = {true, true, true};
	pthread_t thr;
	int r;

	begin(_i);
	c = opn();
	/* ticket: the counter's new value, and the record under it */
	ck_assert_int_eq(coord_ticket(c, "r0/joined", "r0/node/", "rec one", &t), 0);
	ck_assert_int_eq(t, 1);
	ck_assert_int_eq(coord_ticket(c, "r0/joined", "r0/node/", "rec two", &t), 0);
	ck_assert_int_eq(t, 2);
	expect(c, "r0/node/1", "rec one");
	expect(c, "r0/node/2", "rec two");
	expect(c, "r0/joined", "2");
	/* try_get: absent, then the value */
	ck_assert_int_eq(coord_try_get(c, "fa", &v), CRUN_ENOTFOUND);
	/* wait_any_get: a timeout, a wake by another handle's set (with its
	 * value), and a present key answered at once */
	ck_assert_int_eq(coord_wait_any_get(c, ab, 2, 100, 0, &v), CRUN_ETIMEDOUT);
	ck_assert_int_eq(pthread_create(&thr, NULL, set_later, &l), 0);
	ck_assert_int_eq(coord_wait_any_get(c, ab, 2, 20000, 0, &v), 1);
	pthread_join(thr, NULL);
	ck_assert_str_eq(v, "val-fb");
	free(v);
	ck_assert_int_eq(coord_set(c, "fa", "va"), 0);
	ck_assert_int_eq(coord_wait_any_get(c, ab, 2, 100, 0, &v), 0);
	ck_assert_str_eq(v, "va");
	free(v);
	ck_assert_int_eq(coord_try_get(c, "fa", &v), 0);
	ck_assert_str_eq(v, "va");
	free(v);
	/* wait_any_get_with: the with key's value when keys[0] woke it (fb
	 * is there), none when absent or another key woke it */
	{
		const char *gz[] = {"fg", "fz"};
		char *w = NULL;

		ck_assert_int_eq(coord_wait_any_get_with(c, ab, 2, "fb", 100, 0, &v, &w), 0);
		ck_assert_str_eq(v, "va");
		ck_assert_str_eq(w, "val-fb");
		free(v);
		free(w);
		ck_assert_int_eq(coord_wait_any_get_with(c, ab, 2, "fc", 100, 0, &v, &w), 0);
		ck_assert_ptr_null(w);
		free(v);
		ck_assert_int_eq(coord_wait_any_get_with(c, gz, 2, "fa", 100, 0, &v, &w),
				 CRUN_ETIMEDOUT);
		ck_assert_ptr_null(w);
		ck_assert_int_eq(coord_wait_any_get_with(c, (const char *[]){"fz", "fa"}, 2, "fb",
							 100, 0, &v, &w),
				 1);
		ck_assert_str_eq(v, "va");
		ck_assert_ptr_null(w);
		free(v);
	}
	/* exists_each: which ones, or "ask one by one" */
	r = coord_exists_each(c, eachk, 3, live);
	ck_assert(r == 0 || r == CRUN_ENOTSUP);
	if (r == 0)
		ck_assert(live[0] && live[1] && !live[2]);
	{
		char *vals[3] = {0};

		ck_assert_int_eq(coord_multi_get_now(c, eachk, 3, vals), r);
		if (r == 0) {
			ck_assert_str_eq(vals[0], "va");
			ck_assert_str_eq(vals[1], "val-fb");
			ck_assert_str_eq(vals[2], "");
		}
		for (int i = 0; r == 0 && i < 3; i++)
			free(vals[i]);
	}
	/* grant_put: the key lives exactly as long as the lease */
	holder = opn();
	ck_assert_int_eq(
	    coord_lease_grant_put(holder, 5000, "gp/exp", "dead", "gp/alive", "me", &id), 0);
	ck_assert_uint_ne(id, 0);
	expect(c, "gp/alive", "me");
	ck_assert_int_eq(coord_lease_keepalive(holder, id), 0);
	ck_assert_int_eq(coord_lease_revoke(holder, id), 0);
	ck_assert_int_eq(coord_exists(c, "gp/alive"), 0);
	ck_assert_int_eq(coord_exists(c, "gp/exp"), 0);
	ck_assert_int_eq(coord_exists(c, "fa"), 1); /* both handles stay usable */
	ck_assert_int_eq(coord_exists(holder, "fa"), 1);
	coord_close(holder);
	coord_close(c);
	end();
}
END_TEST

START_TEST(multi_get_waits_for_all)
{
	struct later l = {.keys = {"a", "b", "c"}, .n = 3, .delay_us = 200000};
	const char *keys[] = {"c", "a", "b"};
	char *vals[3] = {0};
	struct coord *c;
	pthread_t t;

	begin(_i);
	c = opn();
	ck_assert_int_eq(pthread_create(&t, NULL, set_later, &l), 0);
	ck_assert_int_eq(coord_multi_get(c, keys, 3, 20000, vals), 0);
	ck_assert_str_eq(vals[0], "val-c");
	ck_assert_str_eq(vals[1], "val-a");
	ck_assert_str_eq(vals[2], "val-b");
	for (int i = 0; i < 3; i++)
		free(vals[i]);
	pthread_join(t, NULL);
	coord_close(c);
	end();
}
END_TEST

START_TEST(compare_set_semantics)
{
	struct coord *c;

	begin(_i);
	c = opn();
	cas(c, "k", "", "a", "a");   /* absent: created */
	cas(c, "k", "", "b", "a");   /* present: unchanged, current back */
	cas(c, "k", "x", "c", "a");  /* wrong expectation */
	cas(c, "k", "a", "d", "d");  /* right one */
	cas(c, "no", "x", "y", "x"); /* absent, non-empty expectation: TCPStore's answer */
	ck_assert_int_eq(coord_exists(c, "no"), 0);
	ck_assert_int_eq(coord_expire(c, "k", "late"), 0); /* first value wins */
	expect(c, "k", "d");
	coord_close(c);
	end();
}
END_TEST

#define T_THREADS 4
#define T_ADDS	  12

struct adder {
	int64_t got[T_ADDS];
	char winner[32], mine[32];
};

static void *add_many(void *arg)
{
	struct adder *a = arg;
	struct coord *c = opn();
	char *cur = NULL;

	for (int i = 0; i < T_ADDS; i++)
		ck_assert_int_eq(coord_add(c, "tickets", 1, &a->got[i]), 0);
	ck_assert_int_eq(coord_compare_set(c, "leader", "", a->mine, &cur), 0);
	snprintf(a->winner, sizeof(a->winner), "%s", cur);
	free(cur);
	coord_close(c);
	return NULL;
}

START_TEST(concurrent_tickets_and_one_winner)
{
	struct adder a[T_THREADS];
	pthread_t t[T_THREADS];
	char seen[T_THREADS * T_ADDS + 1] = {0};
	bool winner_is_one = false;

	begin(_i);
	for (int i = 0; i < T_THREADS; i++) {
		memset(&a[i], 0, sizeof(a[i]));
		snprintf(a[i].mine, sizeof(a[i].mine), "agent-%d", i);
		ck_assert_int_eq(pthread_create(&t[i], NULL, add_many, &a[i]), 0);
	}
	for (int i = 0; i < T_THREADS; i++)
		pthread_join(t[i], NULL);
	/* Every ticket 1..N handed out exactly once. */
	for (int i = 0; i < T_THREADS; i++)
		for (int k = 0; k < T_ADDS; k++) {
			int64_t v = a[i].got[k];

			ck_assert_int_ge(v, 1);
			ck_assert_int_le(v, T_THREADS * T_ADDS);
			ck_assert_int_eq(seen[v], 0);
			seen[v] = 1;
		}
	for (int i = 0; i < T_THREADS; i++) {
		ck_assert_str_eq(a[i].winner, a[0].winner);
		winner_is_one |= strcmp(a[0].winner, a[i].mine) == 0;
	}
	ck_assert(winner_is_one);
	end();
}
END_TEST

START_TEST(lease_revoke_is_not_expiry)
{
	struct coord *c;
	uint64_t id = 0;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_lease_grant(c, 1000, "gone", "dead a", &id), 0);
	ck_assert_uint_ne(id, 0);
	ck_assert_int_eq(coord_lease_keepalive(c, id), 0);
	ck_assert_int_eq(coord_lease_revoke(c, id), 0);
	ck_assert_int_eq(coord_lease_keepalive(c, id), CRUN_ENOTFOUND);
	/* Well past the TTL (etcd raises it to its 2 s minimum), nothing set. */
	ck_assert_int_eq(coord_wait(c, "gone", 3500), CRUN_ETIMEDOUT);
	ck_assert_int_eq(coord_exists(c, "gone"), 0);
	coord_close(c);
	end();
}
END_TEST

struct waiter {
	const char *key;
	int r;
	char *val;
};

static void *wait_for(void *arg)
{
	struct waiter *w = arg;
	struct coord *c = opn();

	w->r = coord_get(c, w->key, 30000, &w->val);
	coord_close(c);
	return NULL;
}

START_TEST(lease_lapse_sets_key_and_wakes_waiter)
{
	struct waiter w = {.key = "change"};
	struct coord *holder, *other;
	pthread_t t;
	uint64_t id = 0;

	begin(_i);
	holder = opn();
	ck_assert_int_eq(pthread_create(&t, NULL, wait_for, &w), 0);
	ck_assert_int_eq(coord_lease_grant(holder, 1000, "change", "dead b", &id), 0);
	/* No keep-alive from now on: the lease lapses. */
	pthread_join(t, NULL);
	ck_assert_msg(w.r == 0, "%s: waiter: %s", g_b->name, crun_strerror(w.r));
	ck_assert_str_eq(w.val, "dead b");
	free(w.val);
	other = opn();
	expect(other, "change", "dead b");
	ck_assert_int_eq(coord_lease_keepalive(holder, id), CRUN_ENOTFOUND);
	coord_close(other);
	coord_close(holder);
	end();
}
END_TEST

START_TEST(closing_the_holder_ends_its_lease)
{
	struct waiter w = {.key = "bye"};
	struct coord *holder;
	pthread_t t;
	uint64_t id = 0;

	begin(_i);
	holder = opn();
	ck_assert_int_eq(coord_lease_grant(holder, 60000, "bye", "dead c", &id), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, wait_for, &w), 0);
	usleep(200000);
	coord_close(holder); /* long TTL: only the close can end it in time */
	pthread_join(t, NULL);
	ck_assert_int_eq(w.r, 0);
	ck_assert_str_eq(w.val, "dead c");
	free(w.val);
	end();
}
END_TEST

START_TEST(lapse_does_not_overwrite_a_set_key)
{
	struct coord *holder, *other;
	uint64_t id = 0;
	char *cur = NULL;

	begin(_i);
	holder = opn();
	other = opn();
	ck_assert_int_eq(coord_lease_grant(holder, 1000, "first", "dead d", &id), 0);
	ck_assert_int_eq(coord_compare_set(other, "first", "", "restart e", &cur), 0);
	ck_assert_str_eq(cur, "restart e");
	free(cur);
	coord_close(holder);
	ck_assert_int_eq(coord_wait(other, "first", 1000), 0);
	usleep(300000);
	expect(other, "first", "restart e");
	coord_close(other);
	end();
}
END_TEST

START_TEST(sockets_are_cloexec)
{
	struct coord *c;
	struct dirent *d;
	DIR *dir;
	int socks = 0;

	begin(_i);
	c = opn();
	ck_assert_int_eq(coord_set(c, "x", "1"), 0);
	ck_assert_int_eq(coord_wait(c, "y", 50), CRUN_ETIMEDOUT); /* etcd: a watch stream */
	dir = opendir("/proc/self/fd");
	ck_assert_ptr_nonnull(dir);
	while ((d = readdir(dir))) {
		char path[300], target[300];
		ssize_t n;
		uint64_t u;
		int fd;

		if (parse_uint_range(d->d_name, 0, 1 << 20, &u) < 0)
			continue;
		fd = (int)u;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", d->d_name);
		n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		if (strncmp(target, "socket:", 7) != 0)
			continue;
		socks++;
		ck_assert_msg(fcntl(fd, F_GETFD) & FD_CLOEXEC, "%s: socket fd %d lacks FD_CLOEXEC",
			      g_b->name, fd);
	}
	closedir(dir);
	ck_assert_int_gt(socks, 0);
	coord_close(c);
	end();
}
END_TEST

/* ---- etcd only: a lost answer ------------------------------------------------------ */

/* A TCP proxy in front of etcd that, once armed, swallows the next request
 * carrying `match`: it hangs up on the client at once (the answer is lost)
 * and delivers the request to etcd only 1.5 s later, after the client has
 * resent it. A counter update must count once. */
struct proxy {
	int lfd;
	uint16_t port;
	atomic_int armed;
	atomic_int go;	      /* the test: deliver the swallowed request now */
	atomic_int delivered; /* etcd answered the swallowed request */
	const char *match;
};

struct relay {
	struct proxy *px;
	int cfd;
};

static int to_etcd(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_port = htons(g_etcd.ep[0].port);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

struct late {
	struct proxy *px; /* borrowed: the test waits for delivered */
	char *buf;
	size_t len;
};

static void *deliver_late(void *arg)
{
	struct late *l = arg;
	char sink[4096];
	int fd;

	/* Late: once the client's retry was answered (the test says go). */
	for (int i = 0; i < 6000 && !atomic_load(&l->px->go); i++)
		usleep(10000);
	fd = to_etcd();
	if (fd >= 0 && write(fd, l->buf, l->len) == (ssize_t)l->len)
		(void)read(fd, sink, sizeof(sink)); /* etcd's answer: nobody gets it */
	if (fd >= 0)
		close(fd);
	atomic_store(&l->px->delivered, 1);
	free(l->buf);
	free(l);
	return NULL;
}

static void *relay_main(void *arg)
{
	struct relay *rl = arg;
	int sfd = to_etcd();
	struct pollfd p[2] = {{.fd = rl->cfd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
	char buf[65536];

	for (int i = 0; sfd >= 0 && i < 1 << 20; i++) {
		ssize_t n;

		if (poll(p, 2, 60000) <= 0)
			break;
		if (p[0].revents) {
			n = read(rl->cfd, buf, sizeof(buf));
			if (n <= 0)
				break;
			if (memmem(buf, (size_t)n, rl->px->match, strlen(rl->px->match)) &&
			    atomic_exchange(&rl->px->armed, 0)) {
				struct late *l = calloc(1, sizeof(*l));
				pthread_t t;

				l->px = rl->px;
				l->buf = mem_dup(buf, (size_t)n);
				l->len = (size_t)n;
				pthread_create(&t, NULL, deliver_late, l);
				pthread_detach(t);
				break; /* hang up: the answer is lost */
			}
			if (write(sfd, buf, (size_t)n) != n)
				break;
		}
		if (p[1].revents) {
			n = read(sfd, buf, sizeof(buf));
			if (n <= 0 || write(rl->cfd, buf, (size_t)n) != n)
				break;
		}
	}
	close(rl->cfd);
	if (sfd >= 0)
		close(sfd);
	free(rl);
	return NULL;
}

static void *proxy_main(void *arg)
{
	struct proxy *px = arg;

	for (;;) {
		int cfd = accept4(px->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct relay *rl;
		pthread_t t;

		if (cfd < 0)
			return NULL;
		rl = calloc(1, sizeof(*rl));
		rl->px = px;
		rl->cfd = cfd;
		pthread_create(&t, NULL, relay_main, rl);
		pthread_detach(t);
	}
}

START_TEST(etcd_counts_once_when_an_answer_is_lost)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	struct proxy px = {.match = "ignore_value"}; /* the +1 txn */
	struct etcd_conf via = g_etcd;
	struct coord_opts o = {0};
	struct coord *c = NULL;
	pthread_t t;
	int64_t v = 0;

	begin(1);
	px.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(px.lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(px.lfd, 16), 0);
	ck_assert_int_eq(getsockname(px.lfd, (struct sockaddr *)&a, &al), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, proxy_main, &px), 0);
	pthread_detach(t);
	via.ep[0].port = ntohs(a.sin_port);
	o.prefix = g_prefix;
	o.connect_timeout_ms = 30000;
	o.timeout_ms = 10000;
	o.etcd = &via;
	ck_assert_int_eq(coord_open(&o, &c), 0);
	ck_assert_int_eq(coord_add(c, "n", 1, &v), 0); /* creates it: no ignore_value */
	ck_assert_int_eq(v, 1);
	atomic_store(&px.armed, 1);
	ck_assert_int_eq(coord_add(c, "n", 1, &v), 0);
	ck_assert_int_eq(atomic_load(&px.armed), 0); /* the proxy did swallow one */
	ck_assert_int_eq(v, 2);
	/* The swallowed request reaches etcd now, after the retry. */
	atomic_store(&px.go, 1);
	for (int i = 0; i < 6000 && !atomic_load(&px.delivered); i++)
		usleep(10000);
	ck_assert_int_eq(atomic_load(&px.delivered), 1);
	ck_assert_int_eq(coord_add(c, "n", 0, &v), 0);
	ck_assert_int_eq(v, 2);
	ck_assert_int_eq(coord_add(c, "n", 1, &v), 0);
	ck_assert_int_eq(v, 3);
	coord_close(c);
	end();
}
END_TEST

/* coord_put_leased (the rdzv branch's ephemeral keys) on etcd: a key that
 * lives exactly as long as its lease. */
START_TEST(etcd_put_leased_key_dies_with_its_lease)
{
	struct etcd *e = NULL;
	uint64_t id = 0;

	begin(1);
	ck_assert_int_eq(etcd_open(&g_etcd, g_prefix, 30000, 10000, &e), 0);
	ck_assert_int_eq(etcd_lease_grant(e, 1000, "", "", &id), 0);
	ck_assert_int_eq(etcd_put_leased(e, id, "alive/1", "host-a"), 0);
	ck_assert_int_eq(etcd_exists(e, "alive/1"), 1);
	ck_assert_int_eq(etcd_lease_revoke(e, id), 0);
	ck_assert_int_eq(etcd_exists(e, "alive/1"), 0);
	ck_assert_int_eq(etcd_put_leased(e, id, "alive/2", "host-a"), CRUN_ENOTFOUND);
	etcd_close(e);
	end();
}
END_TEST

static Suite *coord_suite(void)
{
	Suite *s = suite_create("coord");
	TCase *tc = tcase_create("conformance");

	log_init("test_coord", LL_WARN);
	signal(SIGPIPE, SIG_IGN);
	evthread_use_pthreads();
	tcase_add_unchecked_fixture(tc, etcd_up, etcd_down);
	tcase_set_timeout(tc, 90);
	tcase_add_loop_test(tc, counters, 0, NB);
	tcase_add_loop_test(tc, set_get_exists, 0, NB);
	tcase_add_loop_test(tc, exists_all_looks_without_waiting, 0, NB);
	tcase_add_loop_test(tc, get_waits_and_times_out, 0, NB);
	tcase_add_loop_test(tc, wait_on_one_key_repeatedly, 0, NB);
	tcase_add_loop_test(tc, present_stays_present_across_waits, 0, NB);
	tcase_add_loop_test(tc, multi_get_waits_for_all, 0, NB);
	tcase_add_loop_test(tc, wait_any_wakes_on_the_first_key, 0, NB);
	tcase_add_loop_test(tc, folded_calls_do_what_their_two_requests_did, 0, NB);
	tcase_add_loop_test(tc, compare_set_semantics, 0, NB);
	tcase_add_loop_test(tc, concurrent_tickets_and_one_winner, 0, NB);
	tcase_add_loop_test(tc, lease_revoke_is_not_expiry, 0, NB);
	tcase_add_loop_test(tc, lease_lapse_sets_key_and_wakes_waiter, 0, NB);
	tcase_add_loop_test(tc, closing_the_holder_ends_its_lease, 0, NB);
	tcase_add_loop_test(tc, lapse_does_not_overwrite_a_set_key, 0, NB);
	tcase_add_loop_test(tc, sockets_are_cloexec, 0, NB);
	tcase_add_test(tc, etcd_counts_once_when_an_answer_is_lost);
	tcase_add_test(tc, etcd_put_leased_key_dies_with_its_lease);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(coord_suite)
