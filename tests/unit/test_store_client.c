/* test_store_client.c: Check tests for the blocking store client
 * (store/client/). A scripted peer on a thread checks the exact bytes the
 * client sends (key mangling, nested views, the v2 greeting, WAIT before GET,
 * CANCEL_WAIT on timeout) and feeds it exact replies, including broken ones;
 * then end-to-end tests run every call of include/crun/store.h against crun's
 * own server (store_server_new on a libevent thread), in both dialects.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "crun/store.h"
#include "store/server.h"
#include "unit/check_main.h"

/* ---- a scripted peer ---------------------------------------------------------- */

/* One exchange: read exactly `expect` from the client (compared byte for
 * byte), then write `reply`, then optionally close. */
struct step {
	uint8_t expect[256];
	size_t elen;
	uint8_t reply[64];
	size_t rlen;
	int close_after;
	int delay_ms; /* before the reply */
};

struct peer {
	int lfd;
	uint16_t port;
	pthread_t th;
	struct step steps[8];
	size_t n;
	int accept; /* 0: listen only, never accept (a server that never answers) */
	int failed;
	char why[1100];
};

static int read_full(int fd, uint8_t *buf, size_t len, int timeout_ms)
{
	size_t got = 0;

	while (got < len) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, timeout_ms) <= 0)
			return -1;
		n = read(fd, buf + got, len - got);
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static void hexdump(char *out, size_t cap, const uint8_t *b, size_t len)
{
	size_t o = 0;

	for (size_t i = 0; i < len && o + 4 < cap; i++)
		o += (size_t)snprintf(out + o, cap - o, "%02x ", b[i]);
	out[o] = '\0';
}

static void *peer_main(void *arg)
{
	struct peer *p = arg;
	struct pollfd pl = {.fd = p->lfd, .events = POLLIN};
	uint8_t buf[256];
	int fd;

	if (poll(&pl, 1, 10000) <= 0) {
		p->failed = 1;
		snprintf(p->why, sizeof(p->why), "no connection");
		return NULL;
	}
	fd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0) {
		p->failed = 1;
		return NULL;
	}
	for (size_t i = 0; i < p->n; i++) {
		struct step *s = &p->steps[i];

		if (read_full(fd, buf, s->elen, 10000) < 0) {
			p->failed = 1;
			snprintf(p->why, sizeof(p->why), "step %zu: short read", i);
			break;
		}
		if (memcmp(buf, s->expect, s->elen)) {
			char got[256], want[256];

			hexdump(got, sizeof(got), buf, s->elen);
			hexdump(want, sizeof(want), s->expect, s->elen);
			p->failed = 1;
			snprintf(p->why, sizeof(p->why), "step %zu: got %s want %s", i, got, want);
			break;
		}
		if (s->delay_ms)
			usleep((useconds_t)s->delay_ms * 1000u);
		if (s->rlen && write(fd, s->reply, s->rlen) != (ssize_t)s->rlen) {
			p->failed = 1;
			break;
		}
		if (s->close_after) {
			close(fd);
			return NULL;
		}
	}
	/* Drain until the client hangs up, so it never sees an early reset. */
	for (int i = 0; i < 1000; i++) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};

		if (poll(&pf, 1, 10000) <= 0 || read(fd, buf, sizeof(buf)) <= 0)
			break;
	}
	close(fd);
	return NULL;
}

static void peer_listen(struct peer *p)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);

	p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(p->lfd, 0);
	ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(p->lfd, 8), 0);
	ck_assert_int_eq(getsockname(p->lfd, (struct sockaddr *)&a, &al), 0);
	p->port = ntohs(a.sin_port);
}

static void peer_start(struct peer *p)
{
	peer_listen(p);
	ck_assert_int_eq(pthread_create(&p->th, NULL, peer_main, p), 0);
}

static void peer_finish(struct peer *p)
{
	pthread_join(p->th, NULL);
	close(p->lfd);
	ck_assert_msg(!p->failed, "peer: %s", p->why);
}

/* Byte builders for the steps. */
static size_t put_u64(uint8_t *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	return 8;
}

static size_t put_str(uint8_t *b, const char *s, size_t len)
{
	put_u64(b, len);
	memcpy(b + 8, s, len);
	return 8 + len;
}

static void expect_op(struct step *s, uint8_t code, const char *key)
{
	s->elen = 0;
	s->expect[s->elen++] = code;
	s->elen += put_str(s->expect + s->elen, key, strlen(key));
}

static void expect_wait1(struct step *s, uint8_t code, const char *key)
{
	s->elen = 0;
	s->expect[s->elen++] = code;
	s->elen += put_u64(s->expect + s->elen, 1);
	s->elen += put_str(s->expect + s->elen, key, strlen(key));
}

static void greeting(struct step *s)
{
	uint32_t pid = (uint32_t)getpid();
	const uint8_t v[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x0d};

	memcpy(s->expect, v, sizeof(v));
	memcpy(s->expect + 6, &pid, 4); /* little-endian hosts only, like PyTorch */
	s->elen = 10;
	memcpy(s->reply, &pid, 4);
	s->rlen = 4;
}

static crun_store_t *open_rc(uint16_t port, int dialect, const char *prefix, uint32_t cto,
			     uint32_t to, uint32_t reconnect_ms)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	o.port = port;
	o.dialect = dialect;
	o.prefix = prefix;
	o.connect_timeout_ms = cto;
	o.timeout_ms = to;
	o.reconnect_ms = reconnect_ms;
	ck_assert_int_eq(crun_store_open(&o, &s), 0);
	return s;
}

/* The scripted peer accepts one connection: these handles never reconnect,
 * so a failure leaves them broken (CRUN_ENOTCONN), the reconnect_ms = 0 rule. */
static crun_store_t *open_at(uint16_t port, int dialect, const char *prefix, uint32_t cto,
			     uint32_t to)
{
	return open_rc(port, dialect, prefix, cto, to, 0);
}

/* ---- wire bytes: mangling, views, greeting ------------------------------------ */

START_TEST(set_sends_the_captured_113_bytes)
{
	/* torch-compat §1.9: set("k1", b"v1") from a 1.13 client. */
	static const uint8_t want[] = {0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x2f, 0x6b,
				       0x31, 0x02, 0, 0, 0, 0, 0, 0, 0, 0x76, 0x31};
	struct peer p = {0};
	crun_store_t *s;

	memcpy(p.steps[0].expect, want, sizeof(want));
	p.steps[0].elen = sizeof(want);
	p.n = 1;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_set(s, "k1", "v1", 2), 0);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(get_sends_wait_then_get)
{
	struct peer p = {0};
	crun_store_t *s;
	void *val = NULL;
	size_t len = 0;

	expect_wait1(&p.steps[0], 0x05, "/k1");
	p.steps[0].reply[0] = 0x00;
	p.steps[0].rlen = 1;
	expect_op(&p.steps[1], 0x02, "/k1");
	p.steps[1].rlen = put_str(p.steps[1].reply, "v1", 2);
	p.n = 2;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_get(s, "k1", 0, &val, &len), 0);
	ck_assert_uint_eq(len, 2);
	ck_assert_str_eq(val, "v1"); /* NUL-terminated for convenience */
	crun_free(val);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(prefix_and_nested_views_mangle_like_prefixstore)
{
	struct peer p = {0};
	crun_store_t *s, *inner, *outer, *empty;
	int64_t v = 0;

	/* opts prefix "pfx": PrefixStore("pfx", tcp) → "/pfx/a" (§1.9 vector). */
	expect_op(&p.steps[0], 0x03, "/pfx/a");
	p.steps[0].elen += put_u64(p.steps[0].expect + p.steps[0].elen, 1);
	p.steps[0].rlen = put_u64(p.steps[0].reply, 1);
	/* PrefixStore("outer", PrefixStore("inner", ...)): newest innermost. */
	expect_op(&p.steps[1], 0x03, "/pfx/inner/outer/a");
	p.steps[1].elen += put_u64(p.steps[1].expect + p.steps[1].elen, 2);
	p.steps[1].rlen = put_u64(p.steps[1].reply, 2);
	/* An empty PrefixStore layer still adds its "/". */
	expect_op(&p.steps[2], 0x03, "/pfx//a");
	p.steps[2].elen += put_u64(p.steps[2].expect + p.steps[2].elen, 3);
	p.steps[2].rlen = put_u64(p.steps[2].reply, 3);
	/* add_raw: no mangling at all (PyTorch's "init/" check-in). */
	expect_op(&p.steps[3], 0x03, "init/");
	p.steps[3].elen += put_u64(p.steps[3].expect + p.steps[3].elen, 1);
	p.steps[3].rlen = put_u64(p.steps[3].reply, 7);
	p.n = 4;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, "pfx", 5000, 5000);
	ck_assert_int_eq(crun_store_view_new(s, "inner", &inner), 0);
	ck_assert_int_eq(crun_store_view_new(inner, "outer", &outer), 0);
	ck_assert_int_eq(crun_store_view_new(s, "", &empty), 0);
	ck_assert_int_eq(crun_store_add(s, "a", 1, &v), 0);
	ck_assert_int_eq(v, 1);
	ck_assert_int_eq(crun_store_add(outer, "a", 2, &v), 0);
	ck_assert_int_eq(v, 2);
	ck_assert_int_eq(crun_store_add(empty, "a", 3, &v), 0);
	ck_assert_int_eq(v, 3);
	ck_assert_int_eq(crun_store_add_raw(outer, "init/", 1, &v), 0);
	ck_assert_int_eq(v, 7);
	/* Closing views leaves the connection to the base. */
	crun_store_close(outer);
	crun_store_close(inner);
	crun_store_close(empty);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(v2_greets_with_validate_and_ping)
{
	struct peer p = {0};
	crun_store_t *s;
	int64_t n = 0;

	greeting(&p.steps[0]);
	p.steps[1].expect[0] = 0x07; /* v2 GETNUMKEYS */
	p.steps[1].elen = 1;
	p.steps[1].rlen = put_u64(p.steps[1].reply, 42);
	p.n = 2;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V2, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_num_keys(s, &n), 0);
	ck_assert_int_eq(n, 42);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(a_wrong_ping_echo_fails_open_with_eproto)
{
	struct peer p = {0};
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = (crun_store_t *)&o; /* must stay untouched */

	greeting(&p.steps[0]);
	p.steps[0].reply[0] ^= 0xff;
	p.n = 1;
	peer_start(&p);
	o.port = p.port;
	o.connect_timeout_ms = 5000;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EPROTO);
	ck_assert_ptr_eq(s, (crun_store_t *)&o);
	peer_finish(&p);
}
END_TEST

/* ---- timeouts, broken streams ---------------------------------------------------- */

START_TEST(v2_wait_timeout_cancels_and_keeps_the_connection)
{
	struct peer p = {0};
	crun_store_t *s;
	const char *k = "never";
	int64_t n = 0;

	greeting(&p.steps[0]);
	expect_wait1(&p.steps[1], 0x06, "/never"); /* no answer: the client times out */
	p.steps[2].expect[0] = 0x0c;		   /* CANCEL_WAIT */
	p.steps[2].elen = 1;
	/* The wake-up raced the cancel: a late STOP_WAITING, then WAIT_CANCELED. */
	p.steps[2].reply[0] = 0x00;
	p.steps[2].reply[1] = 0x01;
	p.steps[2].rlen = 2;
	p.steps[3].expect[0] = 0x07;
	p.steps[3].elen = 1;
	p.steps[3].rlen = put_u64(p.steps[3].reply, 5);
	p.n = 4;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V2, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_wait(s, &k, 1, 100), CRUN_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(crun_store_last_error(s), "/never"));
	ck_assert_int_eq(crun_store_num_keys(s, &n), 0);
	ck_assert_int_eq(n, 5);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

/* The timeout of a MULTI_GET bounds the wait for its keys, not the read of
 * keys that exist: a WAIT that used up a short timeout left the read no time
 * and broke the connection (the rendezvous closer's 1 ms look, under load). */
START_TEST(multi_get_timeout_bounds_the_wait_not_the_read)
{
	struct peer p = {0};
	crun_store_t *s;
	const char *k = "k1";
	void *val = NULL;
	size_t len = 0;

	greeting(&p.steps[0]);
	expect_wait1(&p.steps[1], 0x06, "/k1");
	p.steps[1].reply[0] = 0x00; /* STOP_WAITING at once: the key exists */
	p.steps[1].rlen = 1;
	expect_wait1(&p.steps[2], 0x0a, "/k1"); /* MULTI_GET: count, key */
	p.steps[2].delay_ms = 1500;		/* a busy server: past the 500 ms timeout */
	p.steps[2].rlen = put_str(p.steps[2].reply, "v1", 2);
	p.n = 3;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V2, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_multi_get(s, &k, 1, 500, &val, &len), 0);
	ck_assert_uint_eq(len, 2);
	ck_assert_str_eq(val, "v1");
	crun_free(val);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(v1_wait_timeout_breaks_the_connection)
{
	struct peer p = {0};
	crun_store_t *s;
	const char *k = "never";
	int64_t n = 0;
	void *val = NULL;
	size_t len;

	expect_wait1(&p.steps[0], 0x05, "/never");
	p.n = 1;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_wait(s, &k, 1, 100), CRUN_ETIMEDOUT);
	ck_assert_int_eq(crun_store_num_keys(s, &n), CRUN_ENOTCONN);
	ck_assert_int_eq(crun_store_get(s, "x", 0, &val, &len), CRUN_ENOTCONN);
	ck_assert_ptr_null(val);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(an_over_limit_reply_length_is_a_protocol_error)
{
	struct peer p = {0};
	crun_store_t *s;
	void *val = (void *)&p;
	size_t len = 99;

	expect_op(&p.steps[0], 0x01, "/k"); /* v1 COMPARE_SET */
	p.steps[0].elen += put_str(p.steps[0].expect + p.steps[0].elen, "", 0);
	p.steps[0].elen += put_str(p.steps[0].expect + p.steps[0].elen, "d", 1);
	p.steps[0].rlen = put_u64(p.steps[0].reply, (uint64_t)1 << 40);
	p.n = 1;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_compare_set(s, "k", "", 0, "d", 1, &val, &len), CRUN_EPROTO);
	ck_assert_ptr_eq(val, (void *)&p); /* ret_* untouched on failure */
	ck_assert_uint_eq(len, 99);
	ck_assert_int_eq(crun_store_set(s, "k", "v", 1), CRUN_ENOTCONN);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(a_server_closing_mid_reply_gives_eclosed)
{
	struct peer p = {0};
	crun_store_t *s;
	int64_t v = 0;
	const char *err;

	expect_op(&p.steps[0], 0x03, "/cnt");
	p.steps[0].elen += put_u64(p.steps[0].expect + p.steps[0].elen, 1);
	p.steps[0].reply[0] = 0x01; /* 3 of the 8 reply bytes, then EOF */
	p.steps[0].rlen = 3;
	p.steps[0].close_after = 1;
	p.n = 1;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_add(s, "cnt", 1, &v), CRUN_ECLOSED);
	err = crun_store_last_error(s);
	/* The message names the op, the key and the server. */
	ck_assert_ptr_nonnull(strstr(err, "ADD"));
	ck_assert_ptr_nonnull(strstr(err, "/cnt"));
	ck_assert_ptr_nonnull(strstr(err, "127.0.0.1:"));
	ck_assert_int_eq(crun_store_add(s, "cnt", 1, &v), CRUN_ENOTCONN);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

START_TEST(an_op_timeout_on_a_silent_server_breaks_the_connection)
{
	struct peer p = {0};
	crun_store_t *s;
	int64_t n;

	greeting(&p.steps[0]);
	p.steps[1].expect[0] = 0x07; /* GETNUMKEYS, never answered */
	p.steps[1].elen = 1;
	p.n = 2;
	peer_start(&p);
	s = open_at(p.port, CRUN_STORE_V2, NULL, 5000, 100);
	ck_assert_int_eq(crun_store_num_keys(s, &n), CRUN_ETIMEDOUT);
	ck_assert_int_eq(crun_store_ping(s, NULL), CRUN_ENOTCONN);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

/* ---- connecting ---------------------------------------------------------------- */

START_TEST(a_closed_port_times_out_after_retrying)
{
	struct peer p = {0};
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	peer_listen(&p); /* take a free port, then close it: connects are refused */
	close(p.lfd);
	o.port = p.port;
	o.dialect = _i ? CRUN_STORE_V2 : CRUN_STORE_V1;
	o.connect_timeout_ms = 300;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_ETIMEDOUT);
	ck_assert_ptr_null(s);
}
END_TEST

/* A server that closed in order (crun-rdzvd killed: its kernel sends FIN)
 * and then refuses dials has GONE_MS from the loss to come back; after that
 * a call hears "refused" even if each call is shorter than GONE_MS (an agent
 * waiting between 300 ms heartbeats). Failed before: the grace restarted at
 * each call, so every call ended CRUN_ETIMEDOUT, which a waiter reads as
 * "nothing happened yet", and the outage was never noticed. */
START_TEST(a_server_gone_in_order_is_refused_a_grace_after_the_loss)
{
	struct peer p = {0};
	crun_store_t *s;
	void *val = NULL;
	size_t len = 0;
	int fd, r = CRUN_ETIMEDOUT, calls = 0;

	peer_listen(&p);
	s = open_rc(p.port, CRUN_STORE_V1, NULL, 5000, 200, 10000);
	fd = accept4(p.lfd, NULL, NULL, SOCK_CLOEXEC);
	ck_assert_int_ge(fd, 0);
	close(fd);    /* FIN: gone in order */
	close(p.lfd); /* and refusing from now on */
	/* Bounded: 40 calls of 200 ms are 8 s, GONE_MS is 1 s. */
	for (; calls < 40 && r == CRUN_ETIMEDOUT; calls++)
		r = crun_store_get(s, "k", 200, &val, &len);
	ck_assert_msg(r == CRUN_ECONNREFUSED, "after %d calls: %s (%s)", calls, crun_err_name(r),
		      crun_store_last_error(s));
	crun_store_close(s);
}
END_TEST

START_TEST(a_listener_that_never_answers_ping_times_out)
{
	struct peer p = {0};
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	peer_listen(&p); /* the kernel completes the connect; nobody reads */
	o.port = p.port;
	o.connect_timeout_ms = 300;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_ETIMEDOUT);
	ck_assert_ptr_null(s);
	/* connect_timeout_ms = 0: one attempt, bounded by the op timeout. */
	o.connect_timeout_ms = 0;
	o.timeout_ms = 200;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_ETIMEDOUT);
	ck_assert_ptr_null(s);
	close(p.lfd);
}
END_TEST

struct late {
	struct peer *p;
	int delay_ms;
};

static void *late_listen(void *arg)
{
	struct late *l = arg;
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(l->p->port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int one = 1;

	poll(NULL, 0, l->delay_ms);
	l->p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	setsockopt(l->p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->p->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l->p->lfd, 8) < 0) {
		l->p->failed = 1;
		snprintf(l->p->why, sizeof(l->p->why), "rebind: %s", strerror(errno));
		return NULL;
	}
	return peer_main(l->p);
}

START_TEST(open_retries_until_the_server_appears)
{
	struct peer p = {0};
	struct late l = {&p, 300};
	crun_store_t *s;

	peer_listen(&p);
	close(p.lfd);
	greeting(&p.steps[0]);
	p.n = 1;
	ck_assert_int_eq(pthread_create(&p.th, NULL, late_listen, &l), 0);
	s = open_at(p.port, CRUN_STORE_V2, NULL, 10000, 5000);
	crun_store_close(s);
	peer_finish(&p);
}
END_TEST

/* ---- argument checks ------------------------------------------------------------- */

START_TEST(open_rejects_bad_options)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;
	crun_store_t *s = NULL;

	ck_assert_int_eq(crun_store_open(NULL, &s), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_open(&o, NULL), CRUN_EINVAL);
	o.host = NULL;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EINVAL);
	o.host = "";
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EINVAL);
	o.host = "127.0.0.1";
	o.dialect = 3;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EINVAL);
	o.dialect = CRUN_STORE_V1;
	o.struct_size = 4;
	ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EINVAL);
	ck_assert_ptr_null(s);
	/* NULL handles are refused, and close/last_error accept NULL. */
	ck_assert_int_eq(crun_store_set(NULL, "k", "v", 1), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_ping(NULL, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_view_new(NULL, "p", &s), CRUN_EINVAL);
	crun_store_close(NULL);
	ck_assert_ptr_nonnull(crun_store_last_error(NULL));
}
END_TEST

START_TEST(calls_reject_bad_arguments_and_v2_ops_on_v1)
{
	struct peer p = {0};
	crun_store_t *s;
	const char *keys[] = {"a", NULL};
	const char *big_key;
	char *big;
	void *val;
	size_t len;
	char **list;
	int64_t n;

	peer_listen(&p); /* v1 needs no greeting: open succeeds without a reply */
	s = open_at(p.port, CRUN_STORE_V1, NULL, 5000, 5000);
	ck_assert_int_eq(crun_store_set(s, NULL, "v", 1), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_set(s, "k", NULL, 1), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_get(s, "k", 0, NULL, &len), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_check(s, keys, 2, NULL), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_wait(s, NULL, 1, 0), CRUN_EINVAL);
	ck_assert_int_eq(crun_store_view_new(s, NULL, &s), CRUN_EINVAL);
	big = malloc(70000);
	ck_assert_ptr_nonnull(big);
	memset(big, 'k', 69999);
	big[69999] = '\0';
	big_key = big;
	ck_assert_int_eq(crun_store_set(s, big_key, "v", 1), CRUN_ETOOBIG);
	free(big);
	ck_assert_int_eq(crun_store_append(s, "k", "v", 1), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_multi_get(s, keys, 1, 0, &val, &len), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_multi_set(s, keys, (const void *const *)keys, &len, 1),
			 CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_ping(s, NULL), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_queue_push(s, "q", "v", 1), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_queue_pop(s, "q", 0, 0, &val, &len), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_queue_len(s, "q", &n), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_list_keys(s, &list, &len), CRUN_EDIALECT);
	ck_assert_int_eq(crun_store_barrier(s, "b", 2, 0), CRUN_EDIALECT);
	ck_assert_ptr_nonnull(strstr(crun_store_last_error(s), "BARRIER"));
	/* None of that sent a byte or broke the connection. */
	ck_assert_int_eq(crun_store_set(s, "k", "", 0), 0);
	crun_store_close(s);
	close(p.lfd);
}
END_TEST

Suite *store_client_wire_suite(void);
Suite *store_client_wire_suite(void)
{
	Suite *s = suite_create("store_client_wire");
	TCase *tc = tcase_create("bytes");
	TCase *tt = tcase_create("failures");
	TCase *tn = tcase_create("connect");

	tcase_set_timeout(tc, 20);
	tcase_add_test(tc, set_sends_the_captured_113_bytes);
	tcase_add_test(tc, get_sends_wait_then_get);
	tcase_add_test(tc, multi_get_timeout_bounds_the_wait_not_the_read);
	tcase_add_test(tc, prefix_and_nested_views_mangle_like_prefixstore);
	tcase_add_test(tc, v2_greets_with_validate_and_ping);
	tcase_add_test(tc, a_wrong_ping_echo_fails_open_with_eproto);
	suite_add_tcase(s, tc);
	tcase_set_timeout(tt, 20);
	tcase_add_test(tt, v2_wait_timeout_cancels_and_keeps_the_connection);
	tcase_add_test(tt, v1_wait_timeout_breaks_the_connection);
	tcase_add_test(tt, an_over_limit_reply_length_is_a_protocol_error);
	tcase_add_test(tt, a_server_closing_mid_reply_gives_eclosed);
	tcase_add_test(tt, an_op_timeout_on_a_silent_server_breaks_the_connection);
	tcase_add_test(tt, calls_reject_bad_arguments_and_v2_ops_on_v1);
	tcase_add_test(tt, open_rejects_bad_options);
	suite_add_tcase(s, tt);
	tcase_set_timeout(tn, 20);
	tcase_add_loop_test(tn, a_closed_port_times_out_after_retrying, 0, 2);
	tcase_add_test(tn, a_server_gone_in_order_is_refused_a_grace_after_the_loss);
	tcase_add_test(tn, a_listener_that_never_answers_ping_times_out);
	tcase_add_test(tn, open_retries_until_the_server_appears);
	suite_add_tcase(s, tn);
	return s;
}

/* ---- end to end against crun's own server ----------------------------------------- */

static struct event_base *e2e_base;
static struct store_server *e2e_srv;
static uint16_t e2e_port;
static pthread_t e2e_thread;

static void *e2e_loop(void *arg)
{
	(void)arg;
	event_base_loop(e2e_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

/* Checked fixture: a store server on its own libevent thread, per test. */
static void e2e_setup(void)
{
	struct store_server_config cfg = STORE_SERVER_CONFIG_DEFAULT;

	cfg.host = "127.0.0.1";
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	e2e_base = event_base_new();
	ck_assert_ptr_nonnull(e2e_base);
	ck_assert_int_eq(store_server_new(e2e_base, &cfg, &e2e_srv), 0);
	e2e_port = store_server_port(e2e_srv);
	ck_assert_int_ne(e2e_port, 0);
	ck_assert_int_eq(pthread_create(&e2e_thread, NULL, e2e_loop, NULL), 0);
}

static void e2e_teardown(void)
{
	event_base_loopexit(e2e_base, NULL);
	pthread_join(e2e_thread, NULL);
	store_server_free(e2e_srv);
	event_base_free(e2e_base);
}

static crun_store_t *e2e_open(int dialect)
{
	return open_rc(e2e_port, dialect, NULL, 5000, 10000, CRUN_STORE_RECONNECT_MS_DEFAULT);
}

static void assert_get(crun_store_t *s, const char *key, const char *want)
{
	void *val = NULL;
	size_t len = 0;

	ck_assert_msg(crun_store_get(s, key, 2000, &val, &len) == 0, "get %s: %s", key,
		      crun_store_last_error(s));
	ck_assert_uint_eq(len, strlen(want));
	ck_assert_mem_eq(val, want, len);
	crun_free(val);
}

static void assert_cas(crun_store_t *s, const char *key, const char *exp, const char *des,
		       const char *want)
{
	void *val = NULL;
	size_t len = 0;

	ck_assert_int_eq(
	    crun_store_compare_set(s, key, exp, strlen(exp), des, strlen(des), &val, &len), 0);
	ck_assert_uint_eq(len, strlen(want));
	ck_assert_mem_eq(val, want, len);
	crun_free(val);
}

/* _i = 0: v1, 1: v2. */
START_TEST(every_common_call_works_in_both_dialects)
{
	crun_store_t *s = e2e_open(_i ? CRUN_STORE_V2 : CRUN_STORE_V1);
	const char *both[] = {"k1", "cnt"};
	const char *missing[] = {"k1", "zz"};
	int64_t v = 0;
	int ready = -1, deleted = -1;

	ck_assert_int_eq(crun_store_set(s, "k1", "v1", 2), 0);
	assert_get(s, "k1", "v1");
	ck_assert_int_eq(crun_store_set(s, "empty", "", 0), 0);
	assert_get(s, "empty", "");
	ck_assert_int_eq(crun_store_add(s, "cnt", 5, &v), 0);
	ck_assert_int_eq(v, 5);
	ck_assert_int_eq(crun_store_add(s, "cnt", -2, &v), 0);
	ck_assert_int_eq(v, 3);
	assert_get(s, "cnt", "3"); /* ADD stores decimal text */
	assert_cas(s, "k1", "v1", "v2", "v2");
	assert_cas(s, "k1", "wrong", "v3", "v2");
	assert_cas(s, "new", "", "n", "n");
	assert_cas(s, "absent", "exp", "x", "exp");
	ck_assert_int_eq(crun_store_check(s, both, 2, &ready), 0);
	ck_assert_int_eq(ready, 1);
	ck_assert_int_eq(crun_store_check(s, missing, 2, &ready), 0);
	ck_assert_int_eq(ready, 0);
	ck_assert_int_eq(crun_store_check(s, NULL, 0, &ready), 0);
	ck_assert_int_eq(ready, 1);
	ck_assert_int_eq(crun_store_wait(s, both, 2, 0), 0);
	ck_assert_int_eq(crun_store_num_keys(s, &v), 0);
	ck_assert_int_eq(v, 4);
	ck_assert_int_eq(crun_store_delete_key(s, "empty", &deleted), 0);
	ck_assert_int_eq(deleted, 1);
	ck_assert_int_eq(crun_store_delete_key(s, "empty", &deleted), 0);
	ck_assert_int_eq(deleted, 0);
	ck_assert_int_eq(crun_store_add_raw(s, "init/", 1, &v), 0);
	ck_assert_int_eq(crun_store_num_keys(s, &v), 0);
	ck_assert_int_eq(v, 4);
	crun_store_close(s);
}
END_TEST

START_TEST(every_v2_call_works)
{
	crun_store_t *s = e2e_open(CRUN_STORE_V2);
	crun_store_t *view;
	const char *mk[] = {"m1", "m2", "m3"};
	const void *mv[] = {"a", "", "\x00\xff"};
	const size_t ml[] = {1, 0, 2};
	void *vals[3];
	size_t lens[3];
	void *val;
	size_t len;
	int64_t n;
	char **list;
	uint64_t rtt = 0;

	ck_assert_int_eq(crun_store_append(s, "ap", "x", 1), 0);
	ck_assert_int_eq(crun_store_append(s, "ap", "yz", 2), 0);
	assert_get(s, "ap", "xyz");
	ck_assert_int_eq(crun_store_multi_set(s, mk, mv, ml, 3), 0);
	ck_assert_int_eq(crun_store_multi_get(s, mk, 3, 0, vals, lens), 0);
	ck_assert_uint_eq(lens[0], 1);
	ck_assert_uint_eq(lens[1], 0);
	ck_assert_uint_eq(lens[2], 2);
	ck_assert_mem_eq(vals[2], "\x00\xff", 2);
	for (int i = 0; i < 3; i++)
		crun_free(vals[i]);
	ck_assert_int_eq(crun_store_ping(s, &rtt), 0);
	ck_assert_int_eq(crun_store_queue_push(s, "q", "one", 3), 0);
	ck_assert_int_eq(crun_store_queue_push(s, "q", "two", 3), 0);
	ck_assert_int_eq(crun_store_queue_len(s, "q", &n), 0);
	ck_assert_int_eq(n, 2);
	ck_assert_int_eq(crun_store_queue_pop(s, "q", 0, 0, &val, &len), 0);
	ck_assert_str_eq(val, "one");
	crun_free(val);
	ck_assert_int_eq(crun_store_queue_pop(s, "q", 1, 1000, &val, &len), 0);
	ck_assert_str_eq(val, "two");
	crun_free(val);
	ck_assert_int_eq(crun_store_queue_pop(s, "q", 0, 0, &val, &len), CRUN_ENOTFOUND);
	ck_assert_int_eq(crun_store_barrier(s, "bar", 1, 1000), 0);
	assert_get(s, "bar", "1");
	ck_assert_int_eq(crun_store_view_new(s, "p", &view), 0);
	ck_assert_int_eq(crun_store_set(view, "inside", "1", 1), 0);
	ck_assert_int_eq(crun_store_add_raw(s, "init/", 1, &n), 0);
	ck_assert_int_eq(crun_store_list_keys(view, &list, &len), 0);
	ck_assert_uint_eq(len, 1);
	ck_assert_str_eq(list[0], "inside");
	crun_store_free_list(list, len);
	ck_assert_int_eq(crun_store_list_keys(s, &list, &len), 0);
	ck_assert_uint_eq(len, 6); /* ap m1 m2 m3 bar p/inside; no init/, no queue */
	crun_store_free_list(list, len);
	crun_store_close(view);
	crun_store_close(s);
}
END_TEST

struct later {
	int dialect;
	int delay_ms;
	int what; /* 0: set "late"; 1: barrier "b" of 2; 2: push to "q" */
	int rc;
};

static void *do_later(void *arg)
{
	struct later *l = arg;
	crun_store_t *s = open_at(e2e_port, l->dialect, NULL, 5000, 10000);

	poll(NULL, 0, l->delay_ms);
	if (l->what == 0)
		l->rc = crun_store_set(s, "late", "L", 1);
	else if (l->what == 1)
		l->rc = crun_store_barrier(s, "b", 2, 10000);
	else
		l->rc = crun_store_queue_push(s, "q", "item", 4);
	/* A round trip makes sure a reply-less request was applied. */
	if (l->rc == 0)
		l->rc = crun_store_check(s, NULL, 0, NULL);
	crun_store_close(s);
	return NULL;
}

START_TEST(blocking_get_is_woken_by_another_client)
{
	struct later l = {_i ? CRUN_STORE_V2 : CRUN_STORE_V1, 100, 0, -1};
	crun_store_t *s = e2e_open(l.dialect);
	pthread_t th;

	ck_assert_int_eq(pthread_create(&th, NULL, do_later, &l), 0);
	assert_get(s, "late", "L");
	pthread_join(th, NULL);
	ck_assert_int_eq(l.rc, 0);
	crun_store_close(s);
}
END_TEST

START_TEST(barrier_and_blocking_pop_wait_for_the_other_client)
{
	struct later lb = {CRUN_STORE_V2, 100, 1, -1};
	struct later lq = {CRUN_STORE_V2, 100, 2, -1};
	crun_store_t *s = e2e_open(CRUN_STORE_V2);
	pthread_t th;
	void *val;
	size_t len;

	ck_assert_int_eq(pthread_create(&th, NULL, do_later, &lb), 0);
	ck_assert_int_eq(crun_store_barrier(s, "b", 2, 10000), 0);
	pthread_join(th, NULL);
	ck_assert_int_eq(lb.rc, 0);
	ck_assert_int_eq(pthread_create(&th, NULL, do_later, &lq), 0);
	ck_assert_int_eq(crun_store_queue_pop(s, "q", 1, 10000, &val, &len), 0);
	ck_assert_uint_eq(len, 4);
	ck_assert_str_eq(val, "item");
	crun_free(val);
	pthread_join(th, NULL);
	ck_assert_int_eq(lq.rc, 0);
	crun_store_close(s);
}
END_TEST

START_TEST(v2_wait_timeout_keeps_the_connection_usable)
{
	crun_store_t *s = e2e_open(CRUN_STORE_V2);
	crun_store_t *other = e2e_open(CRUN_STORE_V2);
	const char *k = "never";
	void *val = NULL;
	size_t len;
	int64_t n;

	ck_assert_int_eq(crun_store_wait(s, &k, 1, 100), CRUN_ETIMEDOUT);
	ck_assert_int_eq(crun_store_get(s, "never2", 100, &val, &len), CRUN_ETIMEDOUT);
	ck_assert_ptr_null(val);
	ck_assert_int_eq(crun_store_barrier(s, "bb", 2, 100), CRUN_ETIMEDOUT);
	/* The key appears after the cancel: no stale wake-up may reach s. */
	ck_assert_int_eq(crun_store_set(other, "never", "n", 1), 0);
	ck_assert_int_eq(crun_store_ping(other, NULL), 0);
	ck_assert_int_eq(crun_store_ping(s, NULL), 0);
	ck_assert_int_eq(crun_store_num_keys(s, &n), 0);
	ck_assert_int_eq(n, 2); /* never, and the barrier counter bb */
	assert_get(s, "never", "n");
	crun_store_close(other);
	crun_store_close(s);
}
END_TEST

/* v1 has no CANCEL_WAIT: a timed-out WAIT closes its socket, and the next
 * call dials a fresh one, so the late STOP_WAITING (sent when the key
 * appears) can never be read as the answer to a later request. */
START_TEST(v1_wait_timeout_closes_the_connection_and_the_next_call_redials)
{
	crun_store_t *s = e2e_open(CRUN_STORE_V1);
	crun_store_t *other = e2e_open(CRUN_STORE_V1);
	const char *k = "never";
	int64_t n = -1;

	ck_assert_int_eq(crun_store_wait(s, &k, 1, 100), CRUN_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(crun_store_last_error(s), "closed"));
	ck_assert_int_eq(crun_store_set(other, "never", "n", 1), 0);
	ck_assert_int_eq(crun_store_num_keys(other, &n), 0);
	ck_assert_int_eq(n, 1);
	n = -1;
	ck_assert_int_eq(crun_store_num_keys(s, &n), 0);
	ck_assert_int_eq(n, 1);
	assert_get(s, "never", "n");
	crun_store_close(other);
	crun_store_close(s);
}
END_TEST

START_TEST(large_values_round_trip)
{
	crun_store_t *s = e2e_open(CRUN_STORE_V2);
	size_t big = 8u << 20;
	uint8_t *v = malloc(big);
	const char *keys[] = {"big1", "big2"};
	const void *vals[] = {v, v};
	const size_t lens[] = {big, big - 1};
	void *got[2];
	size_t got_len[2];

	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < big; i++)
		v[i] = (uint8_t)(i * 2654435761u >> 13);
	ck_assert_int_eq(crun_store_multi_set(s, keys, vals, lens, 2), 0);
	ck_assert_int_eq(crun_store_multi_get(s, keys, 2, 0, got, got_len), 0);
	ck_assert_uint_eq(got_len[0], big);
	ck_assert_uint_eq(got_len[1], big - 1);
	ck_assert(memcmp(got[0], v, big) == 0);
	ck_assert(memcmp(got[1], v, big - 1) == 0);
	crun_free(got[0]);
	crun_free(got[1]);
	free(v);
	/* The buffers shrink back; small ops keep working. */
	ck_assert_int_eq(crun_store_ping(s, NULL), 0);
	crun_store_close(s);
}
END_TEST

/* ---- reconnecting, through a TCP proxy that resets on command ---------------------- */

/* Forwards every connection to the e2e server. Commands on a pipe: 'r'
 * resets every connection now (RST both ways, SO_LINGER 0); 'c' arms a cut:
 * the next bytes a client sends are dropped and that connection is reset,
 * so the request is in flight and never reaches the server. Each command is
 * acknowledged on a second pipe once done (for 'c': once armed). */
#define PX_PAIRS 8

struct proxy {
	int lfd, ctl[2], ack[2];
	uint16_t port, to_port;
	pthread_t th;
	int cli[PX_PAIRS], srv[PX_PAIRS];
	int cut;	   /* armed */
	unsigned accepted; /* connections accepted (read after proxy_stop) */
	unsigned cuts;	   /* cuts done */
};

static void px_reset(int fd)
{
	struct linger lg = {1, 0};

	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void px_drop(struct proxy *p, int i)
{
	px_reset(p->cli[i]);
	px_reset(p->srv[i]);
	p->cli[i] = p->srv[i] = -1;
}

static int px_connect(uint16_t port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

static void *proxy_main(void *arg)
{
	struct proxy *p = arg;
	uint8_t buf[65536];

	for (int iter = 0; iter < 1000000; iter++) {
		struct pollfd pf[2 + 2 * PX_PAIRS];
		int n = 0;
		char cmd;

		pf[n++] = (struct pollfd){.fd = p->ctl[0], .events = POLLIN};
		pf[n++] = (struct pollfd){.fd = p->lfd, .events = POLLIN};
		for (int i = 0; i < PX_PAIRS; i++) {
			pf[n++] = (struct pollfd){.fd = p->cli[i], .events = POLLIN};
			pf[n++] = (struct pollfd){.fd = p->srv[i], .events = POLLIN};
		}
		if (poll(pf, (nfds_t)n, 10000) < 0)
			continue;
		if (pf[0].revents) {
			if (read(p->ctl[0], &cmd, 1) != 1 || cmd == 'q')
				break;
			if (cmd == 'r')
				for (int i = 0; i < PX_PAIRS; i++)
					if (p->cli[i] >= 0)
						px_drop(p, i);
			if (cmd == 'c')
				p->cut = 1;
			if (write(p->ack[1], &cmd, 1) != 1)
				break;
			continue; /* the fd set changed */
		}
		if (pf[1].revents) {
			int c = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);

			for (int i = 0; c >= 0 && i < PX_PAIRS; i++) {
				if (p->cli[i] >= 0)
					continue;
				p->cli[i] = c;
				p->srv[i] = px_connect(p->to_port);
				if (p->srv[i] < 0) {
					close(c);
					p->cli[i] = -1;
				}
				p->accepted++;
				c = -1;
			}
			if (c >= 0)
				close(c); /* full */
		}
		for (int i = 0; i < PX_PAIRS; i++) {
			for (int side = 0; side < 2 && p->cli[i] >= 0; side++) {
				struct pollfd *f = &pf[2 + 2 * i + side];
				int from = side ? p->srv[i] : p->cli[i];
				int to = side ? p->cli[i] : p->srv[i];
				ssize_t got;

				if (!f->revents)
					continue;
				got = read(from, buf, sizeof(buf));
				if (got > 0 && side == 0 && p->cut) {
					p->cut = 0;
					p->cuts++;
					px_drop(p, i);
				} else if (got <= 0 || write(to, buf, (size_t)got) != got) {
					px_drop(p, i);
				}
			}
		}
	}
	for (int i = 0; i < PX_PAIRS; i++)
		if (p->cli[i] >= 0)
			px_drop(p, i);
	return NULL;
}

static void proxy_start(struct proxy *p, uint16_t to_port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);

	memset(p, 0, sizeof(*p));
	for (int i = 0; i < PX_PAIRS; i++)
		p->cli[i] = p->srv[i] = -1;
	p->to_port = to_port;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(p->lfd, 0);
	ck_assert_int_eq(bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(p->lfd, 16), 0);
	ck_assert_int_eq(getsockname(p->lfd, (struct sockaddr *)&sa, &sl), 0);
	p->port = ntohs(sa.sin_port);
	ck_assert_int_eq(pipe2(p->ctl, O_CLOEXEC), 0);
	ck_assert_int_eq(pipe2(p->ack, O_CLOEXEC), 0);
	ck_assert_int_eq(pthread_create(&p->th, NULL, proxy_main, p), 0);
}

static void proxy_cmd(struct proxy *p, char cmd)
{
	char a;

	ck_assert_int_eq(write(p->ctl[1], &cmd, 1), 1);
	if (cmd != 'q')
		ck_assert_int_eq(read(p->ack[0], &a, 1), 1);
}

static void proxy_stop(struct proxy *p)
{
	proxy_cmd(p, 'q');
	pthread_join(p->th, NULL);
	close(p->lfd);
	close(p->ctl[0]);
	close(p->ctl[1]);
	close(p->ack[0]);
	close(p->ack[1]);
}

/* Failed before: the first call after a reset returned CRUN_ECONNRESET or
 * CRUN_ECLOSED and every later one CRUN_ENOTCONN. */
START_TEST(a_reset_connection_is_redialed_and_idempotent_ops_go_on)
{
	int dialect = _i ? CRUN_STORE_V2 : CRUN_STORE_V1;
	struct proxy px;
	crun_store_t *s, *direct = e2e_open(dialect);
	void *val = NULL;
	size_t len = 0;

	proxy_start(&px, e2e_port);
	s = open_rc(px.port, dialect, "job", 5000, 10000, 10000);
	ck_assert_int_eq(crun_store_set(s, "k", "v", 1), 0);
	assert_get(s, "k", "v");
	/* A reset between calls: the next call redials (and, in v2, greets). */
	proxy_cmd(&px, 'r');
	assert_get(s, "k", "v");
	/* A GET whose request is cut in flight is sent again. */
	proxy_cmd(&px, 'c');
	assert_get(s, "k", "v");
	/* A SET has no reply: cut in flight, it is replayed on the new
	 * connection before the GET that found the reset. */
	proxy_cmd(&px, 'c');
	ck_assert_int_eq(crun_store_set(s, "k2", "v2", 2), 0);
	assert_get(s, "k2", "v2");
	/* COMPARE_SET cut in flight: sent again, same answer. */
	proxy_cmd(&px, 'c');
	ck_assert_msg(crun_store_compare_set(s, "cas", "", 0, "d", 1, &val, &len) == 0, "%s",
		      crun_store_last_error(s));
	ck_assert_uint_eq(len, 1);
	ck_assert_mem_eq(val, "d", 1);
	crun_free(val);
	assert_get(direct, "job/cas", "d");
	proxy_stop(&px);
	ck_assert_uint_eq(px.cuts, 3);
	ck_assert_uint_eq(px.accepted, 5); /* the first connection and 4 redials */
	crun_store_close(s);
	crun_store_close(direct);
}
END_TEST

START_TEST(a_non_idempotent_op_in_flight_fails_clearly_and_is_not_applied_twice)
{
	int dialect = _i ? CRUN_STORE_V2 : CRUN_STORE_V1;
	struct proxy px;
	crun_store_t *s;
	int64_t v = 0;

	proxy_start(&px, e2e_port);
	s = open_rc(px.port, dialect, NULL, 5000, 10000, 10000);
	ck_assert_int_eq(crun_store_add(s, "cnt", 1, &v), 0);
	ck_assert_int_eq(v, 1);
	proxy_cmd(&px, 'c');
	ck_assert_int_lt(crun_store_add(s, "cnt", 1, &v), 0);
	ck_assert_msg(strstr(crun_store_last_error(s), "may or may not have been applied"), "%s",
		      crun_store_last_error(s));
	/* The next call redials; the cut ADD never reached the server. */
	ck_assert_int_eq(crun_store_add(s, "cnt", 1, &v), 0);
	ck_assert_int_eq(v, 2);
	if (dialect == CRUN_STORE_V2) {
		/* An APPEND has no reply and cannot be replayed: the call that
		 * finds the reset says so; the one after works. */
		proxy_cmd(&px, 'c');
		ck_assert_int_eq(crun_store_append(s, "ap", "x", 1), 0);
		ck_assert_int_eq(crun_store_ping(s, NULL), CRUN_ECONNRESET);
		ck_assert_msg(strstr(crun_store_last_error(s), "APPEND"), "%s",
			      crun_store_last_error(s));
		ck_assert_int_eq(crun_store_ping(s, NULL), 0);
	}
	proxy_stop(&px);
	crun_store_close(s);
}
END_TEST

START_TEST(without_reconnect_ms_a_lost_connection_stays_lost)
{
	struct proxy px;
	crun_store_t *s;
	int64_t n;

	proxy_start(&px, e2e_port);
	s = open_rc(px.port, CRUN_STORE_V2, NULL, 5000, 10000, 0);
	ck_assert_int_eq(crun_store_num_keys(s, &n), 0);
	proxy_cmd(&px, 'r');
	ck_assert_int_lt(crun_store_num_keys(s, &n), 0);
	ck_assert_int_eq(crun_store_num_keys(s, &n), CRUN_ENOTCONN);
	proxy_stop(&px);
	ck_assert_uint_eq(px.accepted, 1);
	crun_store_close(s);
}
END_TEST

/* The e2e server's waiter count, read on its loop thread. */
struct waiters_q {
	int fd[2];
	uint64_t n;
};

static void waiters_cb(evutil_socket_t fd, short what, void *arg)
{
	struct waiters_q *q = arg;
	struct store_server_stats st;

	(void)fd;
	(void)what;
	store_server_get_stats(e2e_srv, &st);
	q->n = st.waiters;
	if (write(q->fd[1], "x", 1) != 1)
		abort();
}

static uint64_t e2e_waiters(void)
{
	struct waiters_q q = {0};
	struct timeval now = {0, 0};
	char c;

	ck_assert_int_eq(pipe2(q.fd, O_CLOEXEC), 0);
	ck_assert_int_eq(event_base_once(e2e_base, -1, EV_TIMEOUT, waiters_cb, &q, &now), 0);
	ck_assert_int_eq(read(q.fd[0], &c, 1), 1);
	close(q.fd[0]);
	close(q.fd[1]);
	return q.n;
}

struct blocked_get {
	crun_store_t *s;
	int r;
	char val[16];
};

static void *blocked_get_main(void *arg)
{
	struct blocked_get *g = arg;
	void *v = NULL;
	size_t len = 0;

	g->r = crun_store_get(g->s, "late", 20000, &v, &len);
	if (g->r == 0) {
		snprintf(g->val, sizeof(g->val), "%.*s", (int)len, (const char *)v);
		crun_free(v);
	}
	return NULL;
}

/* A GET blocked in WAIT when the connection is reset: the wait registration
 * died with the old socket; the client registers it again on the new one
 * and is woken when the key appears. */
START_TEST(a_wait_in_flight_during_a_reset_is_registered_again)
{
	int dialect = _i ? CRUN_STORE_V2 : CRUN_STORE_V1;
	struct proxy px;
	struct blocked_get g = {0};
	crun_store_t *direct = e2e_open(dialect);
	pthread_t th;

	proxy_start(&px, e2e_port);
	g.s = open_rc(px.port, dialect, NULL, 5000, 30000, 10000);
	ck_assert_int_eq(pthread_create(&th, NULL, blocked_get_main, &g), 0);
	for (int i = 0; i < 10000 && e2e_waiters() != 1; i++)
		usleep(1000);
	ck_assert_uint_eq(e2e_waiters(), 1);
	proxy_cmd(&px, 'r');
	/* Registered again from the new connection (the old one is gone). */
	for (int i = 0; i < 10000 && e2e_waiters() != 1; i++)
		usleep(1000);
	ck_assert_int_eq(crun_store_set(direct, "late", "v", 1), 0);
	pthread_join(th, NULL);
	ck_assert_msg(g.r == 0, "%s", crun_store_last_error(g.s));
	ck_assert_str_eq(g.val, "v");
	proxy_stop(&px);
	ck_assert_uint_eq(px.accepted, 2);
	crun_store_close(g.s);
	crun_store_close(direct);
}
END_TEST

/* Failed before: the server ended the lease when the proxy reset its
 * connection (expiry key set), and the client never came back. */
START_TEST(a_lease_survives_a_reset_and_is_reattached)
{
	struct proxy px;
	crun_store_t *s, *b = e2e_open(CRUN_STORE_V2);
	const char *change = "change", *member = "member/a";
	uint64_t id = 0;
	int ready = -1;

	proxy_start(&px, e2e_port);
	s = open_rc(px.port, CRUN_STORE_V2, NULL, 5000, 10000, 10000);
	ck_assert_int_eq(crun_store_lease_grant(s, 60000, "change", "dead a", 6, &id), 0);
	ck_assert_int_eq(crun_store_set_leased(s, id, "member/a", "1", 1), 0);
	proxy_cmd(&px, 'r');
	ck_assert_msg(crun_store_lease_keepalive(s, id) == 0, "%s", crun_store_last_error(s));
	ck_assert_int_eq(crun_store_check(b, &member, 1, &ready), 0);
	ck_assert_int_eq(ready, 1);
	/* Cut in flight: a keep-alive is sent again after the re-attach. */
	proxy_cmd(&px, 'c');
	ck_assert_msg(crun_store_lease_keepalive(s, id) == 0, "%s", crun_store_last_error(s));
	ck_assert_int_eq(crun_store_lease_revoke(s, id), 0);
	ck_assert_int_eq(crun_store_check(b, &member, 1, &ready), 0);
	ck_assert_int_eq(ready, 0);
	ck_assert_int_eq(crun_store_check(b, &change, 1, &ready), 0);
	ck_assert_int_eq(ready, 0); /* revoked, never expired */
	proxy_stop(&px);
	crun_store_close(s);
	crun_store_close(b);
}
END_TEST

Suite *store_client_e2e_suite(void);
Suite *store_client_e2e_suite(void)
{
	Suite *s = suite_create("store_client_e2e");
	TCase *tc = tcase_create("crun_server");

	tcase_add_checked_fixture(tc, e2e_setup, e2e_teardown);
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, every_common_call_works_in_both_dialects, 0, 2);
	tcase_add_test(tc, every_v2_call_works);
	tcase_add_loop_test(tc, blocking_get_is_woken_by_another_client, 0, 2);
	tcase_add_test(tc, barrier_and_blocking_pop_wait_for_the_other_client);
	tcase_add_test(tc, v2_wait_timeout_keeps_the_connection_usable);
	tcase_add_test(tc, v1_wait_timeout_closes_the_connection_and_the_next_call_redials);
	tcase_add_test(tc, large_values_round_trip);
	tcase_add_loop_test(tc, a_reset_connection_is_redialed_and_idempotent_ops_go_on, 0, 2);
	tcase_add_loop_test(
	    tc, a_non_idempotent_op_in_flight_fails_clearly_and_is_not_applied_twice, 0, 2);
	tcase_add_test(tc, without_reconnect_ms_a_lost_connection_stays_lost);
	tcase_add_loop_test(tc, a_wait_in_flight_during_a_reset_is_registered_again, 0, 2);
	tcase_add_test(tc, a_lease_survives_a_reset_and_is_reattached);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(store_client_wire_suite, store_client_e2e_suite)
