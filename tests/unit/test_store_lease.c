/* test_store_lease.c: Check tests for crun's store extension (store_ext.h):
 * the codec (proto_ext.c) and, against a real server on 127.0.0.1 driven by
 * a loop thread, leases through the public client: keep-alive, TTL expiry
 * setting the expiry key and waking a WAIT on it, a closed connection keeping
 * its leases for their TTL (re-attachable by id; a lapsed one stays dead)
 * while an orderly close (the holder's process closed or died) ends them,
 * revoke (keys go, no expiry key), the first reason winning, and extension
 * op codes refused on a connection that did not send HELLO. A server in a
 * child process is SIGSTOPped past the TTL (the stall must not evict a client
 * that keeps alive) and killed and restarted on its port (the client redials).
 */
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "common/common.h"
#include "crun/store.h"
#include "store/server.h"
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

static void srv_start_cfg(struct store_server_config c)
{
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

/* A server of extension version v (0: the newest). */
static void srv_start_version(uint32_t v)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	c.ext_version = v;
	srv_start_cfg(c);
}

static void srv_start(void)
{
	srv_start_version(0);
}

static void srv_stop(void)
{
	event_base_loopbreak(g_base);
	pthread_join(g_thread, NULL);
	store_server_free(g_srv);
	event_base_free(g_base);
}

/* Stops the server like srv_stop and returns how many leases it counted
 * expired and released (read after its loop thread ended). */
static void srv_stop_leases(uint64_t *ret_expired, uint64_t *ret_released)
{
	event_base_loopbreak(g_base);
	pthread_join(g_thread, NULL);
	*ret_expired = store_server_metric(g_srv, STORE_M_LEASE_EXPIRED);
	*ret_released = store_server_metric(g_srv, STORE_M_LEASE_RELEASED);
	store_server_free(g_srv);
	event_base_free(g_base);
}

static crun_store_t *client_rc(uint16_t port, uint32_t timeout_ms, uint32_t reconnect_ms)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	o.port = port;
	o.timeout_ms = timeout_ms;
	o.reconnect_ms = reconnect_ms;
	o.prefix = "job";
	ck_assert_int_eq(crun_store_open(&o, &s), 0);
	return s;
}

static crun_store_t *client_at(uint16_t port, uint32_t timeout_ms)
{
	return client_rc(port, timeout_ms, CRUN_STORE_RECONNECT_MS_DEFAULT);
}

static crun_store_t *client(void)
{
	return client_at(g_port, 5000);
}

/* The server's open connections, read on its loop thread. */
struct conns_q {
	int fd[2];
	uint64_t n;
};

static void conns_cb(evutil_socket_t fd, short what, void *arg)
{
	struct conns_q *q = arg;
	struct store_server_stats st;

	(void)fd;
	(void)what;
	store_server_get_stats(g_srv, &st);
	q->n = st.conns;
	if (write(q->fd[1], "x", 1) != 1)
		abort();
}

static uint64_t srv_conns(void)
{
	struct conns_q q = {0};
	struct timeval now = {0, 0};
	char c;

	ck_assert_int_eq(pipe2(q.fd, O_CLOEXEC), 0);
	ck_assert_int_eq(event_base_once(g_base, -1, EV_TIMEOUT, conns_cb, &q, &now), 0);
	ck_assert_int_eq(read(q.fd[0], &c, 1), 1);
	close(q.fd[0]);
	close(q.fd[1]);
	return q.n;
}

/* Polls until the server has seen connections close (event-driven enough:
 * the close is in flight; no time bound is asserted). */
static void await_conns(uint64_t n)
{
	for (int i = 0; i < 10000 && srv_conns() != n; i++)
		usleep(1000);
	ck_assert_uint_eq(srv_conns(), n);
}

/* A store server in a child process, which the test can SIGSTOP or kill:
 * listens on 127.0.0.1:port (0: any) and reports the port it got.
 * max_value: its value size limit (0: the default). */
static pid_t fork_server_lim(uint16_t port, size_t max_value, uint16_t *ret_port)
{
	int pfd[2];
	pid_t pid;

	ck_assert_int_eq(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	if (pid == 0) { /* no Check call in the child: it shares Check's message file */
		struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;
		struct event_base *base;
		struct store_server *srv = NULL;
		uint16_t got;

		(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
		log_init("test_store_lease_srv", LL_WARN);
		signal(SIGPIPE, SIG_IGN);
		close(pfd[0]);
		base = event_base_new();
		c.host = "127.0.0.1";
		c.port = port;
		if (max_value)
			c.limits.max_value_bytes = max_value;
		if (!base || store_server_new(base, &c, &srv) < 0)
			_exit(1);
		got = store_server_port(srv);
		if (write(pfd[1], &got, sizeof(got)) != (ssize_t)sizeof(got))
			_exit(1);
		event_base_loop(base, EVLOOP_NO_EXIT_ON_EMPTY);
		_exit(0);
	}
	ck_assert_int_ge(pid, 0);
	close(pfd[1]);
	ck_assert_int_eq(read(pfd[0], ret_port, sizeof(*ret_port)), (ssize_t)sizeof(*ret_port));
	close(pfd[0]);
	return pid;
}

static pid_t fork_server(uint16_t port, uint16_t *ret_port)
{
	return fork_server_lim(port, 0, ret_port);
}

static void kill_server(pid_t pid)
{
	int st;

	kill(pid, SIGKILL);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
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
	/* LEASE_ATTACH: an id, as KEEPALIVE. */
	q = (struct store_ext_req){.op = STORE_EXT_LEASE_ATTACH, .id = 0x1122334455667788ULL};
	ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, 9);
	ck_assert_uint_eq(buf[0], 0x85);
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &d, &used), 0);
	ck_assert_uint_eq(d.id, 0x1122334455667788ULL);
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_LEASE_ATTACH), 1);
	/* WAIT_ANY: a key list, as WAIT's. */
	{
		const struct store_bytes keys[2] = {{(const uint8_t *)"/a", 2},
						    {(const uint8_t *)"/bb", 3}};
		const uint8_t *it;
		struct store_bytes k;

		q = (struct store_ext_req){.op = STORE_EXT_WAIT_ANY, .nitems = 2, .keys = keys};
		ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
		ck_assert_uint_eq(len, 1 + 8 + 8 + 2 + 8 + 3);
		ck_assert_uint_eq(buf[0], 0x86);
		for (size_t n = 0; n < len; n++)
			ck_assert_int_eq(store_ext_decode_req(&lim, buf, n, &d, &used),
					 CRUN_EAGAIN);
		ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &d, &used), 0);
		ck_assert_uint_eq(d.nitems, 2);
		it = d.items;
		store_items_next(&it, &k);
		ck_assert_mem_eq(k.p, "/a", 2);
		store_items_next(&it, &k);
		ck_assert_uint_eq(k.len, 3);
		ck_assert_mem_eq(k.p, "/bb", 3);
		ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_WAIT_ANY), 9);
		store_put_u64(buf + 1, 0); /* an empty list is malformed */
		ck_assert_int_eq(store_ext_decode_req(&lim, buf, 9, &d, &used), CRUN_EPROTO);
	}
	/* Op codes outside the range are not extension ops. */
	ck_assert(!store_ext_is_op(0x7f));
	ck_assert(!store_ext_is_op(0x8c));
	buf[0] = 0x8c;
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, 9, &d, &used), CRUN_EPROTO);
}
END_TEST

/* Encodes q, checks every strict prefix asks for more and the whole decodes
 * into *d using all of it. */
static void round_trip(const struct store_ext_req *q, uint8_t *buf, size_t cap,
		       struct store_ext_req *d)
{
	const struct store_limits lim = STORE_LIMITS_DEFAULT;
	size_t len, used;

	ck_assert_int_eq(store_ext_encode_req(q, buf, cap, &len), 0);
	ck_assert_uint_eq(len, store_ext_req_size(q));
	ck_assert_uint_eq(buf[0], q->op);
	for (size_t n = 0; n < len; n++)
		ck_assert_int_eq(store_ext_decode_req(&lim, buf, n, d, &used), CRUN_EAGAIN);
	ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, d, &used), 0);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(d->op, q->op);
}

#define BYTES(s) ((struct store_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* A decoded WAIT_ANY_GET(_WITH) of op byte `op` for keys {"/a", "/bb"}. */
static void check_wait_any_frame(const uint8_t *buf, uint8_t op, const struct store_ext_req *d,
				 uint64_t id, uint32_t wait_ms)
{
	const uint8_t *it = d->items;
	struct store_bytes k;

	ck_assert_uint_eq(buf[0], op);
	ck_assert_uint_eq(d->id, id);
	ck_assert_uint_eq(d->wait_ms, wait_ms);
	ck_assert_uint_eq(d->nitems, 2);
	store_items_next(&it, &k);
	ck_assert_mem_eq(k.p, "/a", 2);
	store_items_next(&it, &k);
	ck_assert_mem_eq(k.p, "/bb", 3);
}

/* Version 4: TRY_GET, WAIT_ANY_GET, TICKET, GRANT_SET - fields, sizes, the
 * reply's fixed part, and the version each needs. */
START_TEST(codec_version4_ops)
{
	const struct store_bytes keys[2] = {BYTES("/a"), BYTES("/bb")};
	struct store_ext_req q, d;
	uint8_t buf[256];

	q = (struct store_ext_req){.op = STORE_EXT_TRY_GET, .key = BYTES("/key")};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(buf[0], 0x87);
	ck_assert_mem_eq(d.key.p, "/key", 4);
	q = (struct store_ext_req){
	    .op = STORE_EXT_WAIT_ANY_GET, .id = 77, .wait_ms = 1500, .nitems = 2, .keys = keys};
	round_trip(&q, buf, sizeof(buf), &d);
	check_wait_any_frame(buf, 0x88, &d, 77, 1500);
	q = (struct store_ext_req){.op = STORE_EXT_TICKET,
				   .key = BYTES("/r0/joined"),
				   .key2 = BYTES("/r0/node/"),
				   .val = BYTES("record")};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(buf[0], 0x89);
	ck_assert_mem_eq(d.key.p, "/r0/joined", 10);
	ck_assert_mem_eq(d.key2.p, "/r0/node/", 9);
	ck_assert_mem_eq(d.val.p, "record", 6);
	q = (struct store_ext_req){.op = STORE_EXT_GRANT_SET,
				   .ttl_ms = 3000,
				   .key = BYTES("/chg"),
				   .val = BYTES("dead"),
				   .key2 = BYTES("/alive/1"),
				   .val2 = BYTES("host")};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(buf[0], 0x8a);
	ck_assert_uint_eq(d.ttl_ms, 3000);
	ck_assert_mem_eq(d.val.p, "dead", 4);
	ck_assert_mem_eq(d.key2.p, "/alive/1", 8);
	ck_assert_mem_eq(d.val2.p, "host", 4);
	/* fixed reply parts: found + length; wake + index + length; i64; id */
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_TRY_GET), 9);
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_WAIT_ANY_GET), 17);
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_TICKET), 8);
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_GRANT_SET), 8);
	ck_assert_uint_eq(store_ext_op_version(STORE_EXT_LEASE_GRANT), 1);
	ck_assert_uint_eq(store_ext_op_version(STORE_EXT_LEASE_ATTACH), 2);
	ck_assert_uint_eq(store_ext_op_version(STORE_EXT_WAIT_ANY), 3);
	for (uint8_t op = STORE_EXT_TRY_GET; op <= STORE_EXT_GRANT_SET; op++)
		ck_assert_uint_eq(store_ext_op_version(op), 4);
	ck_assert_str_eq(store_ext_op_name(STORE_EXT_GRANT_SET), "GRANT_SET");
	/* a WAIT_ANY_GET timeout over the longest TTL is malformed */
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_ANY_GET,
				   .wait_ms = STORE_EXT_TTL_MAX + 1ull,
				   .nitems = 2,
				   .keys = keys};
	{
		const struct store_limits lim = STORE_LIMITS_DEFAULT;
		size_t len, used;

		ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
		ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &d, &used), CRUN_EPROTO);
	}
}
END_TEST

/* Version 5: WAIT_ANY_GET_WITH. */
START_TEST(codec_wait_any_get_with)
{
	const struct store_bytes keys[2] = {BYTES("/a"), BYTES("/bb")};
	struct store_ext_req q = {.op = STORE_EXT_WAIT_ANY_GET_WITH,
				  .id = 5,
				  .wait_ms = 700,
				  .nitems = 2,
				  .keys = keys,
				  .key2 = BYTES("/r1/a/7")};
	struct store_ext_req d;
	uint8_t buf[256];

	round_trip(&q, buf, sizeof(buf), &d);
	check_wait_any_frame(buf, 0x8b, &d, 5, 700);
	ck_assert_uint_eq(d.key2.len, 7);
	ck_assert_mem_eq(d.key2.p, "/r1/a/7", 7);
	ck_assert_uint_eq(store_ext_reply_size(STORE_EXT_WAIT_ANY_GET_WITH), 17);
	ck_assert_uint_eq(store_ext_op_version(STORE_EXT_WAIT_ANY_GET_WITH), 5);
	ck_assert_uint_eq(STORE_EXT_VERSION, 6);
	ck_assert(store_ext_is_op(0x8b));
	ck_assert(!store_ext_is_op(0x8c));
	ck_assert_str_eq(store_ext_op_name(0x8b), "WAIT_ANY_GET_WITH");
	/* every prefix of the frame is incomplete, not malformed */
	{
		const struct store_limits lim = STORE_LIMITS_DEFAULT;
		size_t len, used;

		ck_assert_int_eq(store_ext_encode_req(&q, buf, sizeof(buf), &len), 0);
		for (size_t n = 0; n < len; n++)
			ck_assert_int_eq(store_ext_decode_req(&lim, buf, n, &d, &used),
					 CRUN_EAGAIN);
	}
}
END_TEST

/* Version 5: MUX, WAIT_TAG, WAIT_TAG_CANCEL and the frames of a muxed
 * connection. */
START_TEST(codec_version5_ops)
{
	const struct store_bytes keys[2] = {BYTES("/a"), BYTES("/bb")};
	struct store_ext_req q, d;
	uint8_t buf[256], kind = 9;
	uint64_t tag = 0;
	size_t used = 0;

	q = (struct store_ext_req){.op = STORE_EXT_MUX};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(store_ext_req_size(&q), 1);
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 42, .nitems = 2, .keys = keys};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(buf[0], 0x91);
	ck_assert_uint_eq(d.id, 42);
	ck_assert_uint_eq(d.nitems, 2);
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG_CANCEL, .id = 43};
	round_trip(&q, buf, sizeof(buf), &d);
	ck_assert_uint_eq(d.id, 43);
	for (uint8_t op = STORE_EXT_MUX; op <= STORE_EXT_WAIT_TAG_CANCEL; op++) {
		ck_assert(store_ext_is_op(op));
		ck_assert_uint_eq(store_ext_op_version(op), 5);
		ck_assert_uint_eq(store_ext_reply_size(op), 0); /* nothing in order */
	}
	ck_assert(!store_ext_is_op(0x93));
	/* frames: a REPLY is its kind byte; a WAKE needs all 9 bytes */
	buf[0] = STORE_EXT_FRAME_REPLY;
	ck_assert_int_eq(store_ext_frame_decode(buf, 1, &kind, &tag, &used), 0);
	ck_assert_uint_eq(kind, STORE_EXT_FRAME_REPLY);
	ck_assert_uint_eq(used, 1);
	store_ext_frame_wake(buf, 0x0102030405060708ull);
	for (size_t n = 0; n < STORE_EXT_FRAME_WAKE_LEN; n++)
		ck_assert_int_eq(store_ext_frame_decode(buf, n, &kind, &tag, &used), CRUN_EAGAIN);
	ck_assert_int_eq(store_ext_frame_decode(buf, 9, &kind, &tag, &used), 0);
	ck_assert_uint_eq(kind, STORE_EXT_FRAME_WAKE);
	ck_assert_uint_eq(tag, 0x0102030405060708ull);
	ck_assert_uint_eq(used, 9);
	buf[0] = 2;
	ck_assert_int_eq(store_ext_frame_decode(buf, 9, &kind, &tag, &used), CRUN_EPROTO);
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

/* Sends one extension request on a raw socket and reads its reply. */
static void raw_ext(int fd, const struct store_ext_req *q, uint8_t *rep)
{
	uint8_t buf[256];
	size_t len, want = store_ext_reply_size(q->op), got = 0;

	ck_assert_int_eq(store_ext_encode_req(q, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
	while (got < want) {
		ssize_t n = read(fd, rep + got, want - got);

		ck_assert_int_gt(n, 0);
		got += (size_t)n;
	}
}

/* A raw v2 connection to the server (VALIDATE, then HELLO of `version`);
 * returns it and the version the server answered. */
static int raw_hello(uint32_t version, uint32_t *ret_served)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	struct store_ext_req q = {
	    .op = STORE_EXT_HELLO, .magic = STORE_EXT_MAGIC, .version = version};
	uint8_t v[5] = {0}, rep[4];
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	sa.sin_port = htons(g_port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	store_put_u32(v + 1, STORE_VALIDATE_MAGIC);
	ck_assert_int_eq(write(fd, v, 5), 5);
	raw_ext(fd, &q, rep);
	*ret_served = store_get_u32(rep);
	return fd;
}

/* A raw v2 connection (VALIDATE, HELLO) holding a lease on "job/change"
 * with "job/member/a" set under it, as crun_store_lease_grant would. */
static int raw_lease_holder(uint32_t ttl_ms, uint64_t *ret_id)
{
	struct store_ext_req q;
	uint8_t rep[8];
	uint32_t served;
	int fd = raw_hello(2, &served);

	q = (struct store_ext_req){.op = STORE_EXT_LEASE_GRANT, .ttl_ms = ttl_ms};
	q.key = (struct store_bytes){(const uint8_t *)"/job/change", 11};
	q.val = (struct store_bytes){(const uint8_t *)"gone", 4};
	raw_ext(fd, &q, rep);
	*ret_id = store_get_u64(rep);
	q = (struct store_ext_req){.op = STORE_EXT_SET_LEASED, .id = *ret_id};
	q.key = (struct store_bytes){(const uint8_t *)"/job/member/a", 13};
	q.val = (struct store_bytes){(const uint8_t *)"1", 1};
	raw_ext(fd, &q, rep);
	ck_assert_uint_eq(rep[0], STORE_EXT_OK);
	return fd;
}

/* Failed before: a reset ended the lease at once (expiry key set), so a
 * reconnecting client found nothing to re-attach. */
START_TEST(a_reset_connection_keeps_its_lease_for_the_ttl)
{
	struct linger lg = {1, 0};
	crun_store_t *b, *c;
	uint64_t id;
	int fd;

	srv_start();
	b = client();
	fd = raw_lease_holder(3000, &id);
	ck_assert_int_eq(exists(b, "member/a"), 1);
	/* A reset, as a middlebox or a dead NIC would cause. */
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd);
	await_conns(1);
	/* The server has seen the reset; the lease is still there. */
	c = client();
	ck_assert_msg(crun_store_lease_attach(c, id) == 0, "%s", crun_store_last_error(c));
	ck_assert_int_eq(exists(b, "member/a"), 1);
	ck_assert_int_eq(exists(b, "change"), 0);
	/* b takes it over: c's orderly close then does not touch it, and b
	 * revokes it cleanly (no expiry key). */
	ck_assert_int_eq(crun_store_lease_attach(b, id), 0);
	crun_store_close(c);
	ck_assert_int_eq(crun_store_lease_revoke(b, id), 0);
	ck_assert_int_eq(exists(b, "change"), 0);
	/* A lease reset away and never re-attached ends a TTL later. */
	fd = raw_lease_holder(300, &id);
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
	close(fd);
	ck_assert_int_eq(crun_store_wait(b, (const char *const[]){"change"}, 1, 30000), 0);
	expect_val(b, "change", "gone");
	ck_assert_int_eq(exists(b, "member/a"), 0);
	/* A lapsed lease stays dead. */
	c = client();
	ck_assert_int_eq(crun_store_lease_attach(c, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_lease_keepalive(c, id), CRUN_ENOTFOUND);
	crun_store_close(c);
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* The holder's process closes its socket or dies (its kernel sends FIN):
 * nobody will re-attach, so its leases end at once, as an expiry. */
START_TEST(an_orderly_close_ends_its_leases_at_once)
{
	crun_store_t *a, *b;
	uint64_t id, expired, released;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, "change", "gone", 4, &id), 0);
	ck_assert_int_eq(crun_store_set_leased(a, id, "member/a", "1", 1), 0);
	crun_store_close(a); /* like kill -9: the kernel closes the socket */
	ck_assert_int_eq(crun_store_wait(b, (const char *const[]){"change"}, 1, 5000), 0);
	expect_val(b, "change", "gone");
	ck_assert_int_eq(exists(b, "member/a"), 0);
	ck_assert_int_eq(crun_store_lease_attach(b, id), CRUN_ENOTFOUND);
	crun_store_close(b);
	srv_stop_leases(&expired, &released);
	/* counted as a holder lost: no revoke came */
	ck_assert_uint_eq(expired, 1);
	ck_assert_uint_eq(released, 0);
}
END_TEST

START_TEST(attach_moves_a_lease_between_connections)
{
	crun_store_t *a, *b;
	uint64_t id, id2;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, "change", "x", 1, &id), 0);
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, NULL, NULL, 0, &id2), 0);
	ck_assert_uint_ne(id, id2);
	/* The old holder may still be open (its peer knows it is dead first). */
	ck_assert_int_eq(crun_store_lease_attach(b, id), 0);
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_lease_keepalive(a, id2), 0);
	ck_assert_int_eq(crun_store_lease_keepalive(b, id), 0);
	ck_assert_int_eq(crun_store_set_leased(b, id, "member/b", "1", 1), 0);
	ck_assert_int_eq(crun_store_lease_revoke(b, id), 0);
	ck_assert_int_eq(exists(a, "member/b"), 0);
	ck_assert_int_eq(crun_store_lease_revoke(a, id2), 0);
	ck_assert_int_eq(crun_store_lease_attach(b, id), CRUN_ENOTFOUND);
	ck_assert_int_eq(exists(a, "change"), 0);
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* Failed before: on SIGCONT the lease's timer had passed and the lease
 * expired at once, though its client was healthy. */
START_TEST(a_stalled_server_does_not_evict_a_client_that_keeps_alive)
{
	const uint32_t ttl = 1500;
	uint16_t port;
	pid_t pid = fork_server(0, &port);
	crun_store_t *a = client_at(port, 60000), *b;
	uint64_t id;

	ck_assert_int_eq(crun_store_lease_grant(a, ttl, "change", "dead a", 6, &id), 0);
	ck_assert_int_eq(crun_store_set_leased(a, id, "member/a", "1", 1), 0);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(crun_store_lease_keepalive(a, id), 0);
		usleep(ttl / 5 * 1000);
	}
	ck_assert_int_eq(kill(pid, SIGSTOP), 0);
	usleep(3 * ttl * 1000); /* stopped for longer than the TTL */
	ck_assert_int_eq(kill(pid, SIGCONT), 0);
	for (int i = 0; i < 10; i++) {
		ck_assert_msg(crun_store_lease_keepalive(a, id) == 0, "keep-alive %d: %s", i,
			      crun_store_last_error(a));
		usleep(ttl / 5 * 1000);
	}
	b = client_at(port, 60000);
	ck_assert_int_eq(exists(b, "change"), 0);
	ck_assert_int_eq(exists(b, "member/a"), 1);
	/* Left alone, it still expires: the stall was forgiven, not the TTL. */
	ck_assert_int_eq(crun_store_wait(b, (const char *const[]){"change"}, 1, 30000), 0);
	expect_val(b, "change", "dead a");
	crun_store_close(a);
	crun_store_close(b);
	kill_server(pid);
}
END_TEST

/* One loop iteration blocks the server for three TTLs (here a callback that
 * sleeps on the loop thread, as a huge request or a slow disk would). When it
 * returns, the lease's timer is long past; the stall is measured first and
 * the client, which keeps alive once the loop answers again, keeps its lease. */
struct hog {
	useconds_t us;
	int done[2];
};

static void hog_cb(evutil_socket_t fd, short what, void *arg)
{
	struct hog *h = arg;

	(void)fd;
	(void)what;
	usleep(h->us);
	if (write(h->done[1], "x", 1) != 1)
		abort();
}

START_TEST(a_long_loop_iteration_does_not_evict_a_client_that_keeps_alive)
{
	const uint32_t ttl = 500;
	struct hog h = {.us = 3 * ttl * 1000};
	struct timeval now = {0, 0};
	crun_store_t *a, *b;
	uint64_t id;
	char c;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, ttl, "change", "dead a", 6, &id), 0);
	ck_assert_int_eq(pipe2(h.done, O_CLOEXEC), 0);
	ck_assert_int_eq(event_base_once(g_base, -1, EV_TIMEOUT, hog_cb, &h, &now), 0);
	ck_assert_int_eq(read(h.done[0], &c, 1), 1);
	for (int i = 0; i < 5; i++) {
		ck_assert_msg(crun_store_lease_keepalive(a, id) == 0, "keep-alive %d: %s", i,
			      crun_store_last_error(a));
		usleep(ttl / 5 * 1000);
	}
	ck_assert_int_eq(exists(b, "change"), 0);
	close(h.done[0]);
	close(h.done[1]);
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* The server is killed and a new one takes its port: the client redials,
 * replays a SET the dead server never confirmed, and its old lease is gone
 * (ids are random: the new server does not know it). */
START_TEST(a_restarted_server_is_redialed_and_old_leases_are_gone)
{
	uint16_t port, port2;
	pid_t pid = fork_server(0, &port);
	crun_store_t *a = client_at(port, 20000);
	uint64_t id;
	int r;

	ck_assert_int_eq(crun_store_lease_grant(a, 60000, "change", "dead a", 6, &id), 0);
	ck_assert_int_eq(crun_store_set(a, "k", "1", 1), 0);
	expect_val(a, "k", "1");
	kill_server(pid);
	pid = fork_server(port, &port2);
	ck_assert_uint_eq(port2, port);
	r = crun_store_set(a, "k2", "2", 1); /* may go into the dead socket */
	ck_assert_msg(r == 0, "%s", crun_store_last_error(a));
	expect_val(a, "k2", "2");
	ck_assert_int_eq(exists(a, "k"), 0); /* a new, empty server */
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), CRUN_ENOTFOUND);
	crun_store_close(a);
	kill_server(pid);
}
END_TEST

START_TEST(revoke_deletes_keys_without_expiry)
{
	crun_store_t *a, *b;
	uint64_t id, expired, released;

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
	srv_stop_leases(&expired, &released);
	/* an orderly end (lease_released), never a lost holder (lease_expired) */
	ck_assert_uint_eq(expired, 0);
	ck_assert_uint_eq(released, 1);
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

static void read_exact(int fd, uint8_t *buf, size_t want)
{
	size_t got = 0;

	while (got < want) {
		ssize_t n = read(fd, buf + got, want - got);

		ck_assert_int_gt(n, 0);
		got += (size_t)n;
	}
}

/* A raw v2 connection that said HELLO (answered `version`) and, when the
 * server offers it, MUX. */
static int raw_mux(uint32_t version)
{
	uint8_t mux = STORE_EXT_MUX;
	uint32_t served;
	int fd = raw_hello(STORE_EXT_VERSION, &served);

	ck_assert_uint_eq(served, version);
	ck_assert_int_eq(write(fd, &mux, 1), 1);
	return fd;
}

static void send_ext(int fd, const struct store_ext_req *q)
{
	uint8_t buf[256];
	size_t len;

	ck_assert_int_eq(store_ext_encode_req(q, buf, sizeof(buf), &len), 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t)len);
}

static void expect_wake(int fd, uint64_t tag)
{
	uint8_t f[STORE_EXT_FRAME_WAKE_LEN];

	read_exact(fd, f, sizeof(f));
	ck_assert_uint_eq(f[0], STORE_EXT_FRAME_WAKE);
	ck_assert_uint_eq(store_get_u64(f + 1), tag);
}

/* A v2 PING on the muxed connection: its answer comes as a REPLY frame. */
static void expect_ping(int fd, uint32_t nonce)
{
	uint8_t p[5] = {(uint8_t)store_proto_opcode(STORE_V2, STORE_OP_PING)}, f[5];

	store_put_u32(p + 1, nonce);
	ck_assert_int_eq(write(fd, p, 5), 5);
	read_exact(fd, f, 5);
	ck_assert_uint_eq(f[0], STORE_EXT_FRAME_REPLY);
	ck_assert_uint_eq(store_get_u32(f + 1), nonce);
}

/* Version 5: one connection carries several waits and keeps answering in
 * order; every reply is framed, every completed wait is a WAKE frame between
 * two replies. */
START_TEST(a_muxed_connection_waits_without_parking)
{
	const struct store_bytes ab[2] = {BYTES("/job/a"), BYTES("/job/b")},
				 c1[1] = {BYTES("/job/c")}, t1[1] = {BYTES("/job/t1")};
	struct store_ext_req q;
	crun_store_t *b;
	uint8_t f[9];
	int fd;

	srv_start();
	b = client();
	fd = raw_mux(STORE_EXT_VERSION);
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 7, .nitems = 2, .keys = ab};
	send_ext(fd, &q);
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 8, .nitems = 1, .keys = c1};
	send_ext(fd, &q);
	expect_ping(fd, 11); /* not parked: answered at once */
	/* TICKET wakes /t1 before it replies: the WAKE still follows the
	 * reply's frame, never inside it. */
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 9, .nitems = 1, .keys = t1};
	send_ext(fd, &q);
	q = (struct store_ext_req){.op = STORE_EXT_TICKET,
				   .key = BYTES("/job/n"),
				   .key2 = BYTES("/job/t"),
				   .val = BYTES("x")};
	send_ext(fd, &q);
	read_exact(fd, f, 9);
	ck_assert_uint_eq(f[0], STORE_EXT_FRAME_REPLY);
	ck_assert_uint_eq(store_get_u64(f + 1), 1);
	expect_wake(fd, 9);
	/* Both keys of tag 7, from another connection. */
	ck_assert_int_eq(crun_store_set(b, "a", "1", 1), 0);
	expect_val(b, "a", "1");
	expect_ping(fd, 12); /* one of two keys: no WAKE yet */
	ck_assert_int_eq(crun_store_set(b, "b", "1", 1), 0);
	expect_wake(fd, 7);
	/* A canceled tag never wakes. */
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG_CANCEL, .id = 8};
	send_ext(fd, &q);
	expect_ping(fd, 13);
	ck_assert_int_eq(crun_store_set(b, "c", "1", 1), 0);
	expect_val(b, "c", "1");
	expect_ping(fd, 14);
	/* Keys there already: the WAKE at once. */
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 10, .nitems = 2, .keys = ab};
	send_ext(fd, &q);
	expect_wake(fd, 10);
	/* A tag pending twice is out of step: closed. */
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_TAG, .id = 20, .nitems = 1};
	q.keys = (const struct store_bytes[]){BYTES("/job/never")};
	send_ext(fd, &q);
	send_ext(fd, &q);
	ck_assert_int_eq(read(fd, f, 1), 0);
	close(fd);
	/* A WAIT would park a muxed connection: closed, no reply. */
	fd = raw_mux(STORE_EXT_VERSION);
	{
		uint8_t w[1 + 8 + 8 + 6] = {(uint8_t)store_proto_opcode(STORE_V2, STORE_OP_WAIT)};

		store_put_u64(w + 1, 1);
		store_put_bytes(w + 9, "/job/a", 6);
		ck_assert_int_eq(write(fd, w, sizeof(w)), (ssize_t)sizeof(w));
		ck_assert_int_eq(read(fd, f, 1), 0);
	}
	close(fd);
	/* So would a WAIT_ANY_GET_WITH (its key absent). */
	fd = raw_mux(STORE_EXT_VERSION);
	q = (struct store_ext_req){.op = STORE_EXT_WAIT_ANY_GET_WITH,
				   .nitems = 1,
				   .keys = (const struct store_bytes[]){BYTES("/job/never")},
				   .key2 = BYTES("/job/a")};
	send_ext(fd, &q);
	ck_assert_int_eq(read(fd, f, 1), 0);
	close(fd);
	/* The server let go of the dropped connections' registrations. */
	ck_assert_int_eq(crun_store_set(b, "never", "1", 1), 0);
	expect_val(b, "never", "1");
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* The version-4 ops through the client against a real server: each does
 * what its two older requests did, in one. */
START_TEST(version4_ops_do_two_requests_in_one)
{
	const char *ab[] = {"wa", "wb"};
	crun_store_t *a, *b;
	void *v = NULL;
	size_t len = 0, idx = 9;
	int64_t t = 0;
	uint64_t id = 0;

	srv_start();
	a = client();
	b = client();
	/* TRY_GET: absent (nothing read), then present */
	ck_assert_int_eq(store_client_try_get(a, "k", &v, &len), CRUN_ENOTFOUND);
	ck_assert_ptr_null(v);
	ck_assert_int_eq(crun_store_set(b, "k", "value", 5), 0);
	expect_val(b, "k", "value"); /* a SET has no reply: make sure it is in */
	ck_assert_int_eq(store_client_try_get(a, "k", &v, &len), 0);
	ck_assert_uint_eq(len, 5);
	ck_assert_str_eq(v, "value");
	crun_free(v);
	/* TICKET: the counter's new value and prefix<t> = the value */
	ck_assert_int_eq(store_client_ticket(a, "r0/joined", "r0/node/", "rec", 3, &t), 0);
	ck_assert_int_eq(t, 1);
	ck_assert_int_eq(store_client_ticket(b, "r0/joined", "r0/node/", "rec2", 4, &t), 0);
	ck_assert_int_eq(t, 2);
	expect_val(a, "r0/node/1", "rec");
	expect_val(a, "r0/node/2", "rec2");
	expect_val(a, "r0/joined", "2");
	/* GRANT_SET: the key under the new lease; it goes with the lease */
	ck_assert_int_eq(store_client_grant_set(a, 5000, "chg", "dead", 4, "alive/1", "h", 1, &id),
			 0);
	ck_assert_uint_gt(id, 0);
	expect_val(b, "alive/1", "h");
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), 0);
	ck_assert_int_eq(crun_store_lease_revoke(a, id), 0);
	ck_assert_int_eq(exists(b, "alive/1"), 0);
	ck_assert_int_eq(exists(b, "chg"), 0);
	/* WAIT_ANY_GET: a timeout (canceled, the handle usable), a parked
	 * wait woken by another client's SET with the value, a present key */
	ck_assert_int_eq(store_client_wait_any_get(a, ab, 2, 100, 0, &idx, &v, &len),
			 CRUN_ETIMEDOUT);
	ck_assert_int_eq(crun_store_set(a, "after", "x", 1), 0);
	ck_assert_int_eq(crun_store_set(b, "wb", "bee", 3), 0);
	ck_assert_int_eq(store_client_wait_any_get(a, ab, 2, 5000, 0, &idx, &v, &len), 0);
	ck_assert_uint_eq(idx, 1);
	ck_assert_str_eq(v, "bee");
	crun_free(v);
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

struct later_set {
	crun_store_t *s;
	const char *key, *val;
};

static void *set_after(void *arg)
{
	struct later_set *l = arg;

	usleep(200000);
	ck_assert_int_eq(crun_store_set(l->s, l->key, l->val, strlen(l->val)), 0);
	return NULL;
}

/* A WAIT_ANY_GET parked on the server: the wake carries the value. */
START_TEST(wait_any_get_wakes_with_the_value)
{
	const char *keys[] = {"x", "y", "z"};
	struct later_set l;
	pthread_t thr;
	crun_store_t *a;
	void *v = NULL;
	size_t idx = 9, len = 0;

	srv_start();
	a = client();
	l = (struct later_set){client(), "z", "zed value"};
	ck_assert_int_eq(pthread_create(&thr, NULL, set_after, &l), 0);
	ck_assert_int_eq(store_client_wait_any_get(a, keys, 3, 10000, 0, &idx, &v, &len), 0);
	pthread_join(thr, NULL);
	ck_assert_uint_eq(idx, 2);
	ck_assert_uint_eq(len, 9);
	ck_assert_str_eq(v, "zed value");
	crun_free(v);
	ck_assert_int_eq(crun_store_set(a, "still", "ok", 2), 0);
	crun_store_close(l.s);
	crun_store_close(a);
	srv_stop();
}
END_TEST

/* WAIT_ANY_GET_WITH: the answer also carries the with_key's value as it
 * is at that moment - parked then woken, answered at once, timed out. */
START_TEST(wait_any_get_with_wakes_with_both_values)
{
	const char *keys[] = {"x", "y"};
	struct later_set l;
	pthread_t thr;
	crun_store_t *a;
	void *v = NULL, *w = NULL;
	size_t idx = 9;

	srv_start();
	a = client();
	l = (struct later_set){client(), "y", "why"};
	ck_assert_int_eq(crun_store_set(l.s, "mine", "0 0 8", 5), 0);
	ck_assert_int_eq(pthread_create(&thr, NULL, set_after, &l), 0);
	ck_assert_int_eq(store_client_wait_any_get_with(a, keys, 2, "mine", 10000, 0, &idx, &v, &w),
			 0);
	pthread_join(thr, NULL);
	ck_assert_uint_eq(idx, 1);
	ck_assert_str_eq(v, "why");
	ck_assert_str_eq(w, "0 0 8");
	crun_free(v);
	crun_free(w);
	v = w = NULL;
	/* present at once; the with_key absent */
	ck_assert_int_eq(
	    store_client_wait_any_get_with(a, keys, 2, "other", 10000, 0, &idx, &v, &w), 0);
	ck_assert_uint_eq(idx, 1);
	ck_assert_str_eq(v, "why");
	ck_assert_ptr_null(w);
	crun_free(v);
	v = NULL;
	/* the server's timeout: nothing, and the stream in step */
	ck_assert_int_eq(store_client_wait_any_get_with(a, (const char *[]){"never"}, 1, "mine",
							100, 0, &idx, &v, &w),
			 CRUN_ETIMEDOUT);
	ck_assert_ptr_null(v);
	ck_assert_ptr_null(w);
	ck_assert_int_eq(crun_store_set(a, "after", "x", 1), 0);
	expect_val(a, "after", "x");
	crun_store_close(l.s);
	crun_store_close(a);
	srv_stop();
}
END_TEST

/* A version-4 server (crun-rdzvd --ext-version 4): the client does not send
 * WAIT_ANY_GET_WITH (CRUN_ENOTSUP, nothing sent); version 4's ops work. */
START_TEST(a_version4_server_gets_no_version5_op)
{
	const char *ab[] = {"a", "b"};
	crun_store_t *a;
	void *v = NULL, *w = NULL;
	size_t idx;

	srv_start_version(4);
	a = client();
	ck_assert_int_eq(crun_store_set(a, "b", "bee", 3), 0);
	ck_assert_int_eq(store_client_wait_any_get_with(a, ab, 2, "b", 100, 0, &idx, &v, &w),
			 CRUN_ENOTSUP);
	ck_assert_ptr_null(w);
	ck_assert_int_eq(store_client_wait_any_get(a, ab, 2, 100, 0, &idx, &v, NULL), 0);
	ck_assert_uint_eq(idx, 1);
	ck_assert_str_eq(v, "bee");
	crun_free(v);
	crun_store_close(a);
	srv_stop();
}
END_TEST

/* WAIT_ANY_GET's folded fields: the server ends the wait at its timeout
 * (index n: no CANCEL_WAIT, the stream in step), and each wait keeps the
 * connection's lease alive, so waits alone hold a lease for many TTLs. */
START_TEST(wait_any_get_times_out_on_the_server_and_keeps_the_lease)
{
	const char *keys[] = {"never"};
	crun_store_t *a, *b;
	void *v = NULL;
	size_t idx = 9;
	uint64_t id = 0;

	srv_start();
	a = client();
	b = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 600, "lapsed", "dead", 4, &id), 0);
	for (int i = 0; i < 20; i++) /* 2 s of 100 ms waits: > 3 TTLs */
		ck_assert_int_eq(store_client_wait_any_get(a, keys, 1, 100, id, &idx, &v, NULL),
				 CRUN_ETIMEDOUT);
	ck_assert_ptr_null(v);
	ck_assert_int_eq(exists(b, "lapsed"), 0);
	ck_assert_int_eq(crun_store_lease_keepalive(a, id), 0);
	/* Waits that keep nothing: the lease lapses under them. */
	for (int i = 0; i < 20 && !exists(b, "lapsed"); i++)
		ck_assert_int_eq(store_client_wait_any_get(a, keys, 1, 100, 0, &idx, &v, NULL),
				 CRUN_ETIMEDOUT);
	ck_assert_int_eq(exists(b, "lapsed"), 1);
	ck_assert_int_eq(crun_store_set(a, "after", "x", 1), 0); /* in step */
	expect_val(a, "after", "x");
	crun_store_close(a);
	crun_store_close(b);
	srv_stop();
}
END_TEST

/* A server of extension version 3 (an older crun-rdzvd): the client sends
 * none of the version-4 ops (CRUN_ENOTSUP, the connection untouched), and
 * the server closes a connection that sends one anyway, as 3 would. */
START_TEST(an_older_server_gets_no_version4_op)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;
	const char *ab[] = {"a", "b"};
	crun_store_t *a;
	void *v = NULL;
	size_t idx;
	int64_t t;
	uint64_t id;

	log_init("test_store_lease", LL_WARN);
	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	g_base = event_base_new();
	c.host = "127.0.0.1";
	c.ext_version = 3;
	ck_assert_int_eq(store_server_new(g_base, &c, &g_srv), 0);
	g_port = store_server_port(g_srv);
	ck_assert_int_eq(pthread_create(&g_thread, NULL, loop_main, NULL), 0);
	a = client();
	ck_assert_int_eq(store_client_try_get(a, "k", &v, NULL), CRUN_ENOTSUP);
	ck_assert_int_eq(store_client_ticket(a, "n", "p/", "v", 1, &t), CRUN_ENOTSUP);
	ck_assert_int_eq(store_client_grant_set(a, 1000, "e", "d", 1, "k", "v", 1, &id),
			 CRUN_ENOTSUP);
	ck_assert_int_eq(store_client_wait_any_get(a, ab, 2, 100, 0, &idx, &v, NULL), CRUN_ENOTSUP);
	ck_assert_int_eq(store_client_wait_any(a, ab, 2, 100, &idx), CRUN_ETIMEDOUT);
	ck_assert_int_eq(crun_store_set(a, "k", "v", 1), 0); /* nothing was sent */
	expect_val(a, "k", "v");
	{
		struct sockaddr_in sa = {.sin_family = AF_INET};
		struct store_ext_req q = {
		    .op = STORE_EXT_HELLO, .magic = STORE_EXT_MAGIC, .version = STORE_EXT_VERSION};
		uint8_t vb[5] = {0}, rep[4], frame[64];
		size_t len;
		char ch;
		int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		sa.sin_port = htons(g_port);
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		store_put_u32(vb + 1, STORE_VALIDATE_MAGIC);
		ck_assert_int_eq(write(fd, vb, 5), 5);
		raw_ext(fd, &q, rep);
		ck_assert_uint_eq(store_get_u32(rep), 3);
		q = (struct store_ext_req){.op = _i ? STORE_EXT_MUX : STORE_EXT_TRY_GET,
					   .key = BYTES("/job/k")};
		ck_assert_int_eq(store_ext_encode_req(&q, frame, sizeof(frame), &len), 0);
		ck_assert_int_eq(write(fd, frame, len), (ssize_t)len);
		ck_assert_int_eq(read(fd, &ch, 1), 0); /* closed, no reply */
		close(fd);
	}
	crun_store_close(a);
	srv_stop();
}
END_TEST

/* A SET the server refuses by closing the connection (over its value limit)
 * has no reply: the client replays it once after redialing, and when that
 * connection is closed too it stops and fails one call, saying so, instead
 * of replaying it on every later call. */
START_TEST(a_write_the_server_refuses_is_replayed_once_not_forever)
{
	uint16_t port;
	pid_t pid = fork_server_lim(0, 64, &port);
	crun_store_t *a = client_at(port, 20000);
	char big[100];
	int r;

	memset(big, 'x', sizeof(big));
	ck_assert_int_eq(crun_store_set(a, "big", big, sizeof(big)), 0); /* no reply */
	r = crun_store_ping(a, NULL);
	ck_assert_int_lt(r, 0);
	ck_assert_msg(strstr(crun_store_last_error(a), "SET"), "%s", crun_store_last_error(a));
	ck_assert_msg(crun_store_ping(a, NULL) == 0, "%s", crun_store_last_error(a));
	ck_assert_int_eq(crun_store_set(a, "k", "1", 1), 0);
	expect_val(a, "k", "1");
	ck_assert_int_eq(exists(a, "big"), 0);
	crun_store_close(a);
	kill_server(pid);
}
END_TEST

/* The server process dies: the client sees it close the connection in
 * order, then every redial refused. It reports that after a short grace for
 * a supervised restart, not after its whole reconnect budget (10 minutes
 * here: without the grace this test runs into its tcase timeout). */
START_TEST(a_dead_server_is_reported_after_a_short_grace)
{
	uint16_t port;
	pid_t pid = fork_server(0, &port);
	crun_store_t *a = client_rc(port, 600000, 600000);
	const char *k = "never";

	ck_assert_int_eq(crun_store_set(a, "k", "1", 1), 0);
	expect_val(a, "k", "1");
	kill_server(pid);
	ck_assert_int_lt(crun_store_wait(a, &k, 1, 0), 0);
	ck_assert_msg(strstr(crun_store_last_error(a), "refused"), "%s", crun_store_last_error(a));
	ck_assert_int_lt(crun_store_ping(a, NULL), 0); /* still gone: same again */
	crun_store_close(a);
}
END_TEST

/* ---- ERROR (version 6, issue 26): a refusal that says so ---- */

static const char full_text[] = "store full: job 'J' used 64 MiB of its 64 MiB key_bytes";

START_TEST(codec_error_round_trips_and_every_prefix_asks_for_more)
{
	uint8_t buf[STORE_EXT_ERROR_HEAD + STORE_EXT_ERROR_TEXT_MAX];
	const char *text;
	size_t len, n, used;

	ck_assert_int_eq(
	    store_ext_error_encode(full_text, strlen(full_text), buf, sizeof(buf), &len), 0);
	ck_assert_uint_eq(len, STORE_EXT_ERROR_HEAD + strlen(full_text));
	ck_assert_int_eq(store_ext_error_decode(buf, len, &text, &n, &used), 0);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(n, strlen(full_text));
	ck_assert_mem_eq(text, full_text, n);
	for (size_t i = 1; i < len; i++)
		ck_assert_int_eq(store_ext_error_decode(buf, i, &text, &n, &used), CRUN_EAGAIN);
	/* Too small a buffer; a text over the maximum is cut to it. */
	ck_assert_int_eq(store_ext_error_encode(full_text, strlen(full_text), buf, 20, &len),
			 CRUN_ENOSPC);
}
END_TEST

/* What no reply can be taken for an ERROR: any byte but 0xee first, an
 * eight-byte field that is not the magic, or a text over the maximum. */
START_TEST(codec_error_is_told_from_every_reply)
{
	static const uint8_t status0[1] = {0}, status1[1] = {1},
			     ee_count[9] = {0xee, 0, 0, 0, 0, 0, 0, 0, 0};
	uint8_t big[STORE_EXT_ERROR_HEAD] = "\xee"
					    "CRUNERR";
	const char *text;
	size_t n, used;

	ck_assert_int_eq(store_ext_error_decode(status0, 1, &text, &n, &used), CRUN_EPROTO);
	ck_assert_int_eq(store_ext_error_decode(status1, 1, &text, &n, &used), CRUN_EPROTO);
	/* ADD's answer 238, or a 238-byte value's length: 0xee then zeros. */
	ck_assert_int_eq(store_ext_error_decode(ee_count, 9, &text, &n, &used), CRUN_EPROTO);
	store_put_u32(big + 8, STORE_EXT_ERROR_TEXT_MAX + 1);
	ck_assert_int_eq(store_ext_error_decode(big, sizeof(big), &text, &n, &used), CRUN_EPROTO);
}
END_TEST

/* A server whose connections may add 2 keys each (max-keys 8, conn-share 25 %). */
static void srv_start_small(void)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	c.max_keys = 8;
	srv_start_cfg(c);
}

/* A raw client that said HELLO `version` sets 3 keys where it may add 2:
 * version 6 reads the ERROR naming the budget, then the close; version 5
 * (an older crun) only the close, as a PyTorch client. */
START_TEST(a_refused_write_is_answered_with_error_only_to_a_client_that_takes_it)
{
	uint32_t version = _i ? STORE_EXT_VERSION_ERROR : STORE_EXT_VERSION_ERROR - 1, served;
	uint8_t buf[1024];
	size_t got = 0;
	ssize_t n;
	int fd;

	srv_start_small();
	fd = raw_hello(version, &served);
	ck_assert_uint_eq(served, STORE_EXT_VERSION);
	for (int i = 0; i < 3; i++) {
		uint8_t set[64], *p = set;
		char k[8];

		snprintf(k, sizeof(k), "/k%d", i);
		*p++ = (uint8_t)store_proto_opcode(STORE_V2, STORE_OP_SET);
		p = store_put_u64(p, strlen(k));
		memcpy(p, k, strlen(k));
		p += strlen(k);
		p = store_put_u64(p, 0);
		ck_assert_int_eq(write(fd, set, (size_t)(p - set)), p - set);
	}
	while ((n = read(fd, buf + got, sizeof(buf) - got)) > 0)
		got += (size_t)n;
	if (version < STORE_EXT_VERSION_ERROR) {
		ck_assert_uint_eq(got, 0);
	} else {
		const char *text;
		size_t tl, used;

		ck_assert_int_eq(store_ext_error_decode(buf, got, &text, &tl, &used), 0);
		ck_assert_uint_eq(used, got);
		ck_assert_msg(strncmp(text,
				      "store full: this connection (job '-') added 2 of its 2 keys",
				      tl) == 0,
			      "%.*s", (int)tl, text);
	}
	close(fd);
	srv_stop();
}
END_TEST

/* crun's own client: a SET refused by the connection's share fails the call
 * that reads the next reply with CRUN_ENOSPC, last_error naming the budget
 * (before: "server closed the connection"); it is not sent again. */
START_TEST(a_crun_client_is_told_which_budget_is_full)
{
	crun_store_t *a;
	uint64_t id;
	void *v = NULL;
	size_t vl;

	srv_start_small();
	a = client();
	ck_assert_int_eq(crun_store_lease_grant(a, 60000, NULL, NULL, 0, &id), 0); /* HELLO */
	ck_assert_int_eq(crun_store_set(a, "k1", "1", 1), 0);
	ck_assert_int_eq(crun_store_set(a, "k2", "2", 1), 0);
	ck_assert_int_eq(crun_store_set(a, "k3", "3", 1), 0); /* no reply: refused unseen */
	ck_assert_int_eq(crun_store_get(a, "k1", 0, &v, &vl), CRUN_ENOSPC);
	ck_assert_msg(strstr(crun_store_last_error(a),
			     "store full: this connection (job '-') added 2 of its 2 keys"),
		      "%s", crun_store_last_error(a));
	crun_store_close(a);
	srv_stop();
}
END_TEST

static Suite *lease_suite(void)
{
	Suite *s = suite_create("store_lease");
	TCase *tc = tcase_create("codec");

	tcase_add_test(tc, codec_round_trip_and_prefixes);
	tcase_add_test(tc, codec_rejects_oversized_key);
	tcase_add_test(tc, codec_version4_ops);
	tcase_add_test(tc, codec_wait_any_get_with);
	tcase_add_test(tc, codec_version5_ops);
	tcase_add_test(tc, codec_error_round_trips_and_every_prefix_asks_for_more);
	tcase_add_test(tc, codec_error_is_told_from_every_reply);
	tcase_set_timeout(tc, 10);
	suite_add_tcase(s, tc);
	tc = tcase_create("server");
	tcase_add_loop_test(
	    tc, a_refused_write_is_answered_with_error_only_to_a_client_that_takes_it, 0, 2);
	tcase_add_test(tc, a_crun_client_is_told_which_budget_is_full);
	tcase_add_test(tc, ttl_expiry_sets_key_and_deletes_leased_keys);
	tcase_add_test(tc, a_reset_connection_keeps_its_lease_for_the_ttl);
	tcase_add_test(tc, an_orderly_close_ends_its_leases_at_once);
	tcase_add_test(tc, attach_moves_a_lease_between_connections);
	tcase_add_test(tc, a_stalled_server_does_not_evict_a_client_that_keeps_alive);
	tcase_add_test(tc, a_long_loop_iteration_does_not_evict_a_client_that_keeps_alive);
	tcase_add_test(tc, a_restarted_server_is_redialed_and_old_leases_are_gone);
	tcase_add_test(tc, a_write_the_server_refuses_is_replayed_once_not_forever);
	tcase_add_test(tc, revoke_deletes_keys_without_expiry);
	tcase_add_test(tc, first_reason_wins);
	tcase_add_test(tc, leases_belong_to_their_connection);
	tcase_add_test(tc, extension_ops_need_hello);
	tcase_add_test(tc, version4_ops_do_two_requests_in_one);
	tcase_add_test(tc, wait_any_get_wakes_with_the_value);
	tcase_add_test(tc, wait_any_get_with_wakes_with_both_values);
	tcase_add_test(tc, a_version4_server_gets_no_version5_op);
	tcase_add_test(tc, wait_any_get_times_out_on_the_server_and_keeps_the_lease);
	/* 1: nor MUX (version 5) */
	tcase_add_loop_test(tc, an_older_server_gets_no_version4_op, 0, 2);
	tcase_add_test(tc, a_muxed_connection_waits_without_parking);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	tc = tcase_create("dead_server");
	tcase_add_test(tc, a_dead_server_is_reported_after_a_short_grace);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(lease_suite)
