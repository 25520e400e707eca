/* test_store_lease.c: Check tests for crun's store extension (store_ext.h):
 * the codec (proto_ext.c) and, against a real server on 127.0.0.1 driven by
 * a loop thread, leases through the public client: keep-alive, TTL expiry
 * setting the expiry key and waking a WAIT on it, a closed connection ending
 * its leases, revoke (keys go, no expiry key), the first reason winning, and
 * extension op codes refused on a connection that did not send HELLO.
 */
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "common/common.h"
#include "crun/store.h"
#include "store/store.h"
#include "store/store_ext.h"
#include "unit/check_main.h"

static struct event_base *g_base;
static struct store_server *g_srv;
static pthread_t g_thread;
static uint16_t g_port;

static void *loop_main(void *arg)
{
	(void)arg;
	event_base_loop(g_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static void srv_start(void)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	log_init("test_store_lease", LL_WARN);
	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	g_base = event_base_new();
	ck_assert_ptr_nonnull(g_base);
	c.host = "127.0.0.1";
	ck_assert_int_eq(store_server_new(g_base, &c, &g_srv), 0);
	g_port = store_server_port(g_srv);
	ck_assert_int_eq(pthread_create(&g_thread, NULL, loop_main, NULL), 0);
}

static void srv_stop(void)
{
	event_base_loopbreak(g_base);
	pthread_join(g_thread, NULL);
	store_server_free(g_srv);
	event_base_free(g_base);
}

static crun_store_t *client(void)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	o.port = g_port;
	o.timeout_ms = 5000;
	o.prefix = "job";
	ck_assert_int_eq(crun_store_open(&o, &s), 0);
	return s;
}

static int exists(crun_store_t *s, const char *key)
{
	int ready = -1;

	ck_assert_int_eq(crun_store_check(s, (const char *const[]){key}, 1, &ready), 0);
	return ready;
}

static void expect_val(crun_store_t *s, const char *key, const char *want)
{
	void *v = NULL;
	size_t len;

	ck_assert_int_eq(crun_store_get(s, key, 5000, &v, &len), 0);
	ck_assert_uint_eq(len, strlen(want));
	ck_assert_mem_eq(v, want, len);
	crun_free(v);
}

/* ---- codec ------------------------------------------------------------------- */

START_TEST(codec_round_trip_and_prefixes)
{
	const struct store_limits lim = STORE_LIMITS_DEFAULT;
	struct store_ext_req q = {.op = STORE_EXT_SET_LEASED, .id = 7};
	struct store_ext_req d;
	uint8_t buf[128];
	size_t len, used;

	q.key = (struct store_bytes){(const uint8_t *)"/k", 2};
	q.val = (struct store_bytes){(const uint8_t *)"vv", 2};
	ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, store_ext_req_size(&q));
	ck_assert_uint_eq(buf[0], 0x84);
	/* Every strict prefix asks for more bytes. */
	for (size_t n = 0; n < len; n++)
		ck_assert_int_eq(store_ext_decode_req(&lim, buf, n, &d, &used), CRUN_EAGAIN);
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &d, &used), 0);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(d.id, 7);
	ck_assert_mem_eq(d.key.p, "/k", 2);
	ck_assert_mem_eq(d.val.p, "vv", 2);
	ck_assert_int_eq(store_ext_encode_req(&q, buf, len - 1, &len), CRUN_ENOSPC);
	/* Op codes outside the range are not extension ops. */
	ck_assert(!store_ext_is_op(0x7f));
	ck_assert(!store_ext_is_op(0x85));
	buf[0] = 0x85;
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, 9, &d, &used), CRUN_EPROTO);
}
END_TEST

START_TEST(codec_rejects_oversized_key)
{
	struct store_limits lim = STORE_LIMITS_DEFAULT;
	struct store_ext_req q = {.op = STORE_EXT_LEASE_GRANT, .ttl_ms = 10};
	struct store_ext_req d;
	uint8_t buf[128];
	size_t len, used;

	q.key = (struct store_bytes){(const uint8_t *)"0123456789", 10};
	ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
	lim.max_key_bytes = 4;
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &d, &used), CRUN_ETOOBIG);
}
END_TEST

/* ---- server ------------------------------------------------------------------- */

START_TEST(ttl_expiry_sets_key_and_deletes_leased_keys)
{
	crun_store_t *a, *b;
	uint64_t id;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 300, "change", "dead a", 6, &id), 0);
	ck_assert_uint_gt(id, 0);
	ck_assert_int_eq(crun_store_set_leased(a, id, "member/a", "1", 1), 0);
	ck_assert_int_eq(exists(b, "member/a"), 1);
	/* Kept alive past several TTLs: nothing happens. */
	for (int i = 0; i < 6; i++) {
		usleep(100 * 1000);
		ck_assert_int_eq(crun_store_lease_keepalive(a, id), 0);
	}
	ck_assert_int_eq(exists(b, "change"), 0);
	/* Then silence: the WAIT on the expiry key wakes. */
	ck_assert_int_eq(crun_store_wait(b, (const char *const[]){"change"}, 1, 5000), 0);
	expect_val(b, "change", "dead a");
	ck_assert_int_eq(exists(b, "member/a"), 0);
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), CRUN_ENOTFOUND);
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

START_TEST(closed_connection_ends_its_leases)
{
	crun_store_t *a, *b;
	uint64_t id;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, "change", "gone", 4, &id), 0);
	ck_assert_int_eq(crun_store_set_leased(a, id, "member/a", "1", 1), 0);
	crun_store_close(a); /* like kill -9: the socket closes */
	ck_assert_int_eq(crun_store_wait(b, (const char *const[]){"change"}, 1, 5000), 0);
	expect_val(b, "change", "gone");
	ck_assert_int_eq(exists(b, "member/a"), 0);
	crun_store_close(b);
	srv_stop();
}
END_TEST

START_TEST(revoke_deletes_keys_without_expiry)
{
	crun_store_t *a, *b;
	uint64_t id;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 200, "change", "x", 1, &id), 0);
	ck_assert_int_eq(crun_store_set_leased(a, id, "member/a", "1", 1), 0);
	ck_assert_int_eq(crun_store_lease_revoke(a, id), 0);
	ck_assert_int_eq(exists(b, "member/a"), 0);
	ck_assert_int_eq(crun_store_lease_revoke(a, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_set_leased(a, id, "k", "v", 1), CRUN_ENOTFOUND);
	usleep(400 * 1000);
	crun_store_close(a);
	usleep(100 * 1000);
	ck_assert_int_eq(exists(b, "change"), 0);
	crun_store_close(b);
	srv_stop();
}
END_TEST

START_TEST(first_reason_wins)
{
	crun_store_t *a, *b;
	uint64_t id;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, "change", "dead a", 6, &id), 0);
	ck_assert_int_eq(crun_store_set(b, "change", "failed", 6), 0);
	crun_store_close(a);
	usleep(200 * 1000);
	expect_val(b, "change", "failed");
	crun_store_close(b);
	srv_stop();
}
END_TEST

START_TEST(leases_belong_to_their_connection)
{
	crun_store_t *a, *b;
	uint64_t id;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, NULL, NULL, 0, &id), 0);
	ck_assert_int_eq(crun_store_lease_keepalive(b, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_lease_revoke(b, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), 0);
	/* Ordinary ops still work on a connection that sent HELLO. */
	ck_assert_int_eq(crun_store_set(a, "plain", "p", 1), 0);
	expect_val(b, "plain", "p");
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* A raw socket that never sent HELLO: an extension op is an unknown op code
 * and the server closes that connection only. */
START_TEST(extension_ops_need_hello)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	uint8_t frame[9] = {STORE_EXT_LEASE_KEEPALIVE, 1};
	crun_store_t *b;
	char c;
	int fd;

	srv_start();
	b = client();
	sa.sin_port = htons(g_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	/* v2 VALIDATE first, as PyTorch 2.x sends it. */
	{
		uint8_t v[5] = {0};

		store_put_u32(v + 1, STORE_VALIDATE_MAGIC);
		ck_assert_int_eq(write(fd, v, 5), 5);
	}
	ck_assert_int_eq(write(fd, frame, sizeof(frame)), (int)sizeof(frame));
	ck_assert_int_eq(read(fd, &c, 1), 0); /* closed, no reply */
	close(fd);
	ck_assert_int_eq(crun_store_set(b, "still", "up", 2), 0);
	crun_store_close(b);
	srv_stop();
}
END_TEST

static Suite *lease_suite(void)
{
	Suite *s = suite_create("store_lease");
	TCase *tc = tcase_create("codec");

	tcase_add_test(tc, codec_round_trip_and_prefixes);
	tcase_add_test(tc, codec_rejects_oversized_key);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	tc = tcase_create("server");
	tcase_add_test(tc, ttl_expiry_sets_key_and_deletes_leased_keys);
	tcase_add_test(tc, closed_connection_ends_its_leases);
	tcase_add_test(tc, revoke_deletes_keys_without_expiry);
	tcase_add_test(tc, first_reason_wins);
	tcase_add_test(tc, leases_belong_to_their_connection);
	tcase_add_test(tc, extension_ops_need_hello);
	tcase_set_timeout(tc, 30);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(lease_suite)
