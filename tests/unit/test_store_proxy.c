/* test_store_proxy.c: Check tests for the node-local store proxy
 * (store/proxy/proxy.c). The routing table is pure and checked against the codec's
 * reply shapes; then a crun store server and a proxy to it share one
 * libevent thread and crun's own blocking client (both dialects) talks to
 * the proxy: every answer as direct, K waiters on one key sharing one
 * upstream WAIT and the server seeing one connection for K + 1 clients (two
 * from a server without MUX, extension version 4: the "e2e_v4" case runs
 * the same tests against one), waits on distinct key lists pending at once,
 * a timed-out wait leaving the stream in step, and the server's loss
 * closing the proxy's clients. PyTorch clients are in
 * tests/integration/test_store_proxy.py.
 */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include "crun/store.h"
#include "store/proxy.h"
#include "store/server.h"
#include "store/store_ext.h"
#include "unit/check_main.h"

/* ---- the routing table ------------------------------------------------------- */

/* Every op has a route, and the FIFO routes agree with the reply shapes:
 * the shared connection's replies are matched to clients by counting, so an
 * op sent as "no reply" that has one (or the reverse) would shift every
 * later reply to the wrong client. */
START_TEST(route_agrees_with_the_reply_shapes)
{
	for (int d = STORE_V1; d <= STORE_V2; d++) {
		enum store_proxy_route r = store_proxy_route((enum store_dialect)d, _i);
		enum store_reply_kind k = store_proto_reply_kind((enum store_op)_i);

		ck_assert_int_le(r, PROXY_PASS);
		if (r == PROXY_FIFO)
			ck_assert_int_ne(k, STORE_REPLY_NONE);
		if (r == PROXY_FIFO_NOREPLY)
			ck_assert_int_eq(k, STORE_REPLY_NONE);
	}
}
END_TEST

START_TEST(route_answers_the_handshake_locally_and_relays_the_unknown)
{
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_VALIDATE), PROXY_LOCAL);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_PING), PROXY_LOCAL);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_WAIT), PROXY_WAIT);
	ck_assert_int_eq(store_proxy_route(STORE_V1, STORE_OP_WAIT), PROXY_WAIT);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_CANCEL_WAIT), PROXY_CANCEL);
	/* Pushed notifications, one-waiter wake-ups, server-side blocking. */
	ck_assert_int_eq(store_proxy_route(STORE_V1, STORE_OP_WATCH_KEY), PROXY_PASS);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_QUEUE_POP), PROXY_PASS);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP_BARRIER), PROXY_PASS);
	/* What the codec does not know (an extension op: -1) goes verbatim. */
	ck_assert_int_eq(store_proxy_route(STORE_V2, -1), PROXY_PASS);
	ck_assert_int_eq(store_proxy_route(STORE_V2, STORE_OP__MAX), PROXY_PASS);
}
END_TEST

START_TEST(new_refuses_a_missing_upstream)
{
	struct event_base *base = event_base_new();
	struct store_proxy_config cfg = STORE_PROXY_CONFIG_DEFAULT;
	struct store_proxy *px = NULL;

	ck_assert_int_eq(store_proxy_new(base, &cfg, &px), CRUN_EINVAL);
	cfg.upstream_host = "127.0.0.1";
	ck_assert_int_eq(store_proxy_new(base, &cfg, &px), CRUN_EINVAL); /* no port */
	cfg.upstream_port = 1;
	cfg.listen_host = "not-an-address";
	ck_assert_int_eq(store_proxy_new(base, &cfg, &px), CRUN_ERESOLVE);
	ck_assert_ptr_null(px);
	event_base_free(base);
}
END_TEST

/* ---- against crun's server, on one libevent thread ------------------------------- */

static struct event_base *base;
static struct store_server *srv;
static struct store_proxy *px;
static pthread_t loop_thread;
static uint32_t srv_ext; /* the server's extension version: 0 newest (MUX), 4 */

static void *loop_main(void *arg)
{
	(void)arg;
	event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void loop_start(void)
{
	ck_assert_int_eq(pthread_create(&loop_thread, NULL, loop_main, NULL), 0);
}

static void loop_stop(void)
{
	event_base_loopexit(base, NULL);
	pthread_join(loop_thread, NULL);
}

static void setup(void)
{
	struct store_server_config sc = STORE_SERVER_CONFIG_DEFAULT;
	struct store_proxy_config pc = STORE_PROXY_CONFIG_DEFAULT;

	ck_assert_int_eq(evthread_use_pthreads(), 0);
	base = event_base_new();
	sc.host = "127.0.0.1";
	sc.ext_version = srv_ext;
	ck_assert_int_eq(store_server_new(base, &sc, &srv), 0);
	pc.upstream_host = "127.0.0.1";
	pc.upstream_port = store_server_port(srv);
	ck_assert_int_eq(store_proxy_new(base, &pc, &px), 0);
	ck_assert_int_ne(store_proxy_port(px), 0);
	loop_start();
}

static void setup_v4(void)
{
	srv_ext = 4;
	setup();
}

static void teardown(void)
{
	loop_stop();
	store_proxy_free(px);
	store_server_free(srv);
	event_base_free(base);
	srv_ext = 0;
}

static crun_store_t *open_px(int dialect, uint32_t timeout_ms)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	o.port = store_proxy_port(px);
	o.dialect = dialect;
	o.timeout_ms = timeout_ms;
	o.connect_timeout_ms = 5000;
	o.reconnect_ms = 0;
	ck_assert_int_eq(crun_store_open(&o, &s), 0);
	return s;
}

static void check_get(crun_store_t *s, const char *key, const char *want)
{
	void *v = NULL;
	size_t len = 0;

	ck_assert_msg(crun_store_get(s, key, 5000, &v, &len) == 0, "get %s: %s", key,
		      crun_store_last_error(s));
	ck_assert_uint_eq(len, strlen(want));
	ck_assert_mem_eq(v, want, len);
	crun_free(v);
}

START_TEST(answers_as_the_store_in_both_dialects)
{
	crun_store_t *s = open_px(_i ? CRUN_STORE_V2 : CRUN_STORE_V1, 10000);
	int64_t n = 0;
	void *v = NULL;
	size_t len = 0;

	ck_assert_int_eq(crun_store_set(s, "k", "v1", 2), 0);
	check_get(s, "k", "v1");
	ck_assert_int_eq(crun_store_add(s, "n", 5, &n), 0);
	ck_assert_int_eq(n, 5);
	ck_assert_int_eq(crun_store_add(s, "n", -7, &n), 0);
	ck_assert_int_eq(n, -2);
	ck_assert_int_eq(crun_store_compare_set(s, "k", "v1", 2, "v2", 2, &v, &len), 0);
	ck_assert_mem_eq(v, "v2", 2);
	crun_free(v);
	check_get(s, "n", "-2"); /* ADD stores decimal text */
	crun_store_close(s);
}
END_TEST

struct waiter {
	crun_store_t *s;
	int rc;
};

static void *wait_go(void *arg)
{
	struct waiter *w = arg;
	const char *keys[] = {"go"};
	int64_t n;

	w->rc = crun_store_add(w->s, "ready", 1, &n);
	if (w->rc == 0)
		w->rc = crun_store_wait(w->s, keys, 1, 20000);
	return NULL;
}

#define K 8

START_TEST(one_set_releases_every_waiter_through_one_upstream_wait)
{
	struct waiter w[K];
	pthread_t t[K];
	crun_store_t *setter = open_px(CRUN_STORE_V2, 20000);
	struct store_proxy_stats ps;
	struct store_server_stats ss;
	int64_t ready = 0;

	for (int i = 0; i < K; i++) {
		w[i].s = open_px(i % 2 ? CRUN_STORE_V1 : CRUN_STORE_V2, 20000);
		ck_assert_int_eq(pthread_create(&t[i], NULL, wait_go, &w[i]), 0);
	}
	while (ready < K) {
		ck_assert_int_eq(crun_store_add(setter, "ready", 0, &ready), 0);
		usleep(10000);
	}
	usleep(300000); /* let each ADD's WAIT follow it (either order is correct) */
	ck_assert_int_eq(crun_store_set(setter, "go", "1", 1), 0);
	for (int i = 0; i < K; i++) {
		pthread_join(t[i], NULL);
		ck_assert_int_eq(w[i].rc, 0);
	}
	loop_stop();
	store_proxy_get_stats(px, &ps);
	store_server_get_stats(srv, &ss);
	ck_assert_uint_eq(ps.waits, K);
	ck_assert_uint_le(ps.upstream_waits, 1);
	/* K + 1 clients (the v1 ones also open nothing more here): the server
	 * holds the shared connection only, its waits tagged on it (MUX); a
	 * version-4 server also the pooled wait connection. */
	ck_assert_uint_eq(ps.clients, K + 1);
	if (srv_ext == 4) {
		ck_assert_uint_le(ss.conns, 2);
		ck_assert_uint_ge(ps.upstream_conns, 2); /* the wait connection is kept */
	} else {
		ck_assert_uint_eq(ss.conns, 1);
		ck_assert_uint_eq(ps.upstream_conns, 1);
	}
	loop_start();
	for (int i = 0; i < K; i++)
		crun_store_close(w[i].s);
	crun_store_close(setter);
}
END_TEST

struct list_waiter {
	crun_store_t *s;
	const char *key;
	int rc;
};

static void *wait_key(void *arg)
{
	struct list_waiter *w = arg;

	w->rc = crun_store_wait(w->s, &w->key, 1, 20000);
	return NULL;
}

/* Distinct key lists pending at once, released one at a time in reverse
 * order of their waits, while other requests go through. */
START_TEST(waits_on_distinct_keys_are_pending_at_once)
{
	static const char *keys[] = {"w0", "w1", "w2", "w3"};
	struct list_waiter w[4];
	pthread_t t[4];
	crun_store_t *setter = open_px(CRUN_STORE_V2, 20000);
	struct store_proxy_stats ps;

	for (int i = 0; i < 4; i++) {
		w[i] = (struct list_waiter){open_px(CRUN_STORE_V2, 20000), keys[i], -1};
		ck_assert_int_eq(pthread_create(&t[i], NULL, wait_key, &w[i]), 0);
	}
	for (int pending = 0; pending < 4;) {
		loop_stop();
		store_proxy_get_stats(px, &ps);
		loop_start();
		pending = (int)ps.upstream_waits;
		usleep(10000);
	}
	for (int i = 3; i >= 0; i--) {
		ck_assert_int_eq(crun_store_set(setter, keys[i], "1", 1), 0);
		check_get(setter, keys[i], "1");
		pthread_join(t[i], NULL);
		ck_assert_int_eq(w[i].rc, 0);
		for (int j = 0; j < i; j++)
			ck_assert_int_eq(w[j].rc, -1); /* still waiting */
	}
	for (int i = 0; i < 4; i++)
		crun_store_close(w[i].s);
	crun_store_close(setter);
}
END_TEST

START_TEST(a_timed_out_wait_leaves_the_stream_in_step)
{
	crun_store_t *s = open_px(CRUN_STORE_V2, 10000);
	const char *keys[] = {"never"};

	ck_assert_int_eq(crun_store_set(s, "k", "x", 1), 0);
	ck_assert_int_eq(crun_store_wait(s, keys, 1, 200), CRUN_ETIMEDOUT);
	check_get(s, "k", "x");
	ck_assert_int_eq(crun_store_set(s, "never", "now", 3), 0);
	check_get(s, "never", "now");
	crun_store_close(s);
}
END_TEST

START_TEST(losing_the_store_closes_the_clients)
{
	crun_store_t *s = open_px(CRUN_STORE_V2, 10000);
	const char *keys[] = {"gone"};
	void *v = NULL;
	size_t len = 0;

	ck_assert_int_eq(crun_store_set(s, "alive", "1", 1), 0);
	check_get(s, "alive", "1"); /* connected, through the proxy */
	loop_stop();
	store_server_free(srv); /* closes the proxy's upstream connections */
	srv = NULL;
	loop_start();
	ck_assert_int_lt(crun_store_wait(s, keys, 1, 8000), 0);
	ck_assert_int_ne(crun_store_wait(s, keys, 1, 8000), CRUN_ETIMEDOUT);
	ck_assert_int_lt(crun_store_get(s, "x", 1000, &v, &len), 0);
	loop_stop();
	ck_assert(store_proxy_failed(px));
	loop_start();
	crun_store_close(s);
}
END_TEST

/* ---- against a scripted upstream ---------------------------------------------- */

/* A fake muxed store on a blocking socket, in a thread of its own: it
 * answers the handshake with version 5, leaves the client's wait pending as
 * a WAIT_TAG, sends a WAKE of that tag after the proxy canceled it (the race
 * a real store can lose), answers a GET, then sends a WAKE of a tag the
 * proxy never used. */
struct fake {
	int lfd;
	uint16_t port;
	const char *err; /* NULL: it saw what it expected */
};

static bool fake_read(int fd, uint8_t *b, size_t n)
{
	for (size_t got = 0; got < n;) {
		ssize_t r = read(fd, b + got, n - got);

		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

/* Skips a key list (u64 n, n x bytes); false on EOF or a silly length. */
static bool fake_skip_keys(int fd, uint64_t n)
{
	uint8_t b[256];

	for (uint64_t i = 0; i < n; i++) {
		if (!fake_read(fd, b, 8) || store_get_u64(b) > sizeof(b) ||
		    !fake_read(fd, b, (size_t)store_get_u64(b)))
			return false;
	}
	return true;
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	uint8_t b[64], wake[STORE_EXT_FRAME_WAKE_LEN];
	const uint8_t not_ready[2] = {STORE_EXT_FRAME_REPLY, STORE_CHECK_NOT_READY};
	uint64_t tag;
	int fd = accept(f->lfd, NULL, NULL);

	f->err = "handshake";
	/* VALIDATE (5), PING (5), HELLO (9): the PING's nonce back, version 5 */
	if (fd < 0 || !fake_read(fd, b, 19) || b[5] != 13 || b[10] != STORE_EXT_HELLO)
		goto out;
	memcpy(b + 32, b + 6, 4);
	store_put_u32(b + 36, 5);
	if (write(fd, b + 32, 8) != 8 || !fake_read(fd, b, 1) || b[0] != STORE_EXT_MUX)
		goto out;
	f->err = "CHECK";
	if (!fake_read(fd, b, 9) || b[0] != 5 || !fake_skip_keys(fd, store_get_u64(b + 1)) ||
	    write(fd, not_ready, 2) != 2)
		goto out;
	f->err = "WAIT_TAG";
	if (!fake_read(fd, b, 17) || b[0] != STORE_EXT_WAIT_TAG ||
	    !fake_skip_keys(fd, store_get_u64(b + 9)))
		goto out;
	tag = store_get_u64(b + 1);
	f->err = "WAIT_TAG_CANCEL";
	if (!fake_read(fd, b, 9) || b[0] != STORE_EXT_WAIT_TAG_CANCEL || store_get_u64(b + 1) != tag)
		goto out;
	store_ext_frame_wake(wake, tag); /* crossed the cancel: dropped */
	f->err = "GET (crun's client: WAIT, as CHECK here, then GET)";
	if (write(fd, wake, sizeof(wake)) != (ssize_t)sizeof(wake) || !fake_read(fd, b, 9) ||
	    b[0] != 5 || !fake_skip_keys(fd, store_get_u64(b + 1)))
		goto out;
	b[0] = STORE_EXT_FRAME_REPLY;
	b[1] = STORE_CHECK_READY;
	if (write(fd, b, 2) != 2 || !fake_read(fd, b, 9) || b[0] != 3 ||
	    store_get_u64(b + 1) > 32 || !fake_read(fd, b + 9, store_get_u64(b + 1)))
		goto out;
	b[0] = STORE_EXT_FRAME_REPLY;
	store_put_bytes(b + 1, "v", 1);
	if (write(fd, b, 10) != 10)
		goto out;
	store_ext_frame_wake(wake, tag + 100); /* never sent: out of step */
	f->err = "the proxy kept the connection after a WAKE it never asked for";
	if (write(fd, wake, sizeof(wake)) != (ssize_t)sizeof(wake) || read(fd, b, 1) != 0)
		goto out;
	f->err = NULL;
out:
	if (fd >= 0)
		close(fd);
	return NULL;
}

START_TEST(a_wake_after_its_cancel_is_dropped_and_an_unknown_one_fails)
{
	struct store_proxy_config pc = STORE_PROXY_CONFIG_DEFAULT;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	struct fake f = {.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
	const char *keys[] = {"k"};
	pthread_t ft;
	crun_store_t *s;
	bool failed = false;

	ck_assert_int_ge(f.lfd, 0);
	ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f.lfd, 4), 0);
	ck_assert_int_eq(getsockname(f.lfd, (struct sockaddr *)&sa, &len), 0);
	ck_assert_int_eq(pthread_create(&ft, NULL, fake_main, &f), 0);
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	base = event_base_new();
	pc.upstream_host = "127.0.0.1";
	pc.upstream_port = ntohs(sa.sin_port);
	ck_assert_int_eq(store_proxy_new(base, &pc, &px), 0);
	loop_start();
	s = open_px(CRUN_STORE_V2, 5000);
	ck_assert_int_eq(crun_store_wait(s, keys, 1, 300), CRUN_ETIMEDOUT);
	check_get(s, "x", "v"); /* the stale WAKE changed nothing */
	for (int i = 0; i < 500 && !failed; i++) {
		usleep(10000);
		loop_stop();
		failed = store_proxy_failed(px);
		loop_start();
	}
	ck_assert(failed);
	pthread_join(ft, NULL);
	ck_assert_msg(f.err == NULL, "fake store: %s", f.err);
	crun_store_close(s);
	loop_stop();
	store_proxy_free(px);
	event_base_free(base);
	close(f.lfd);
}
END_TEST

Suite *store_proxy_suite(void);
Suite *store_proxy_suite(void)
{
	Suite *s = suite_create("store_proxy");
	TCase *pure = tcase_create("route");
	TCase *e2e;

	tcase_set_timeout(pure, 10);
	tcase_add_loop_test(pure, route_agrees_with_the_reply_shapes, 0, STORE_OP__MAX);
	tcase_add_test(pure, route_answers_the_handshake_locally_and_relays_the_unknown);
	tcase_add_test(pure, new_refuses_a_missing_upstream);
	suite_add_tcase(s, pure);
	e2e = tcase_create("scripted");
	tcase_set_timeout(e2e, 30);
	tcase_add_test(e2e, a_wake_after_its_cancel_is_dropped_and_an_unknown_one_fails);
	suite_add_tcase(s, e2e);
	/* Against the newest server (MUX), then against one without it
	 * (extension version 4): the two-connection path. */
	for (int v4 = 0; v4 < 2; v4++) {
		e2e = tcase_create(v4 ? "e2e_v4" : "e2e");
		tcase_set_timeout(e2e, 60);
		tcase_add_checked_fixture(e2e, v4 ? setup_v4 : setup, teardown);
		tcase_add_loop_test(e2e, answers_as_the_store_in_both_dialects, 0, 2);
		tcase_add_test(e2e, one_set_releases_every_waiter_through_one_upstream_wait);
		tcase_add_test(e2e, a_timed_out_wait_leaves_the_stream_in_step);
		tcase_add_test(e2e, waits_on_distinct_keys_are_pending_at_once);
		tcase_add_test(e2e, losing_the_store_closes_the_clients);
		suite_add_tcase(s, e2e);
	}
	return s;
}

CRUN_CHECK_MAIN(store_proxy_suite)
