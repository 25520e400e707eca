/* test_store_auth.c: Check tests for the store's HMAC challenge/response
 * (store/auth.c, store/auth_io.c, store/server/server_auth.c): the pure core without
 * sockets (frames, MACs, replay, prefixes, job scopes, secret files), then a
 * real server with secrets in a loop thread: the public client with the
 * right, a wrong and no secret; a raw socket that sends a store frame before
 * answering; a replayed answer; a client of one job reaching for another's.
 */
#include <check.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/thread.h>

#include "common/common.h"
#include "crun/store.h"
#include "store/auth.h"
#include "store/server/server_int.h"
#include "store/server.h"
#include "store/store_ext.h"
#include "unit/check_main.h"

static const struct store_auth_secret SEC_A = {.bytes = "secret-of-job-A-0123456789", .len = 26};
static const struct store_auth_secret SEC_B = {.bytes = "secret-of-job-B-9876543210", .len = 26};

/* ---- the pure core -------------------------------------------------------- */

static struct store_auth_keys *keys_of(const char *job, const struct store_auth_secret *s)
{
	struct store_auth_keys *k;

	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_add(k, job, s), 0);
	return k;
}

/* The answer of secret s for job to challenge ns, verified by k as the
 * answer to challenge ns_v: 0 or store_auth_verify's code. */
static int answer_verified(const struct store_auth_keys *k, const struct store_auth_secret *s,
			   const char *job, const uint8_t *ns, const uint8_t *ns_v,
			   struct store_auth_grant *g)
{
	uint8_t nc[32], ans[STORE_AUTH_ANSWER_MAX];
	size_t len, used;

	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, s, job, ns, ans, &len, nc), 0);
	return store_auth_verify(STORE_AUTH_STORE, k, ns_v, ans, len, &used, g);
}

START_TEST(right_secret_verifies_both_ways)
{
	struct store_auth_keys *k = keys_of("", &SEC_A);
	uint8_t ns[32], nc[32], ans[STORE_AUTH_ANSWER_MAX];
	struct store_auth_grant g;
	size_t len, used;

	ck_assert_int_eq(store_auth_nonce(ns), 0);
	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, &SEC_A, "job1", ns, ans, &len, nc), 0);
	ck_assert_int_eq(store_auth_verify(STORE_AUTH_STORE, k, ns, ans, len, &used, &g), 0);
	ck_assert_uint_eq(used, len);
	ck_assert_str_eq(g.job, "job1");
	ck_assert(!g.scoped);
	ck_assert_int_eq(store_auth_check_proof(STORE_AUTH_STORE, &SEC_A, "job1", ns, nc, g.proof,
						sizeof(g.proof)),
			 0);
	/* A server without the secret cannot produce the proof. */
	ck_assert_int_eq(store_auth_check_proof(STORE_AUTH_STORE, &SEC_B, "job1", ns, nc, g.proof,
						sizeof(g.proof)),
			 CRUN_EACCES);
	/* The client's own MAC is not a valid proof (role labels differ). */
	{
		uint8_t refl[STORE_AUTH_PROOF_BYTES];

		memcpy(refl, "CRA1", 4);
		memcpy(refl + 4, ans + len - 32, 32);
		ck_assert_int_eq(store_auth_check_proof(STORE_AUTH_STORE, &SEC_A, "job1", ns, nc,
							refl, sizeof(refl)),
				 CRUN_EACCES);
	}
	store_auth_keys_free(k);
}
END_TEST

START_TEST(wrong_secret_and_replay_are_refused)
{
	struct store_auth_keys *k = keys_of("", &SEC_A);
	uint8_t ns[32], ns2[32], nc[32], ans[STORE_AUTH_ANSWER_MAX];
	struct store_auth_grant g;
	size_t len, used;

	ck_assert_int_eq(store_auth_nonce(ns), 0);
	ck_assert_int_eq(store_auth_nonce(ns2), 0);
	ck_assert_mem_ne(ns, ns2, 32); /* fresh per call */
	ck_assert_int_eq(answer_verified(k, &SEC_B, "", ns, ns, &g), CRUN_EACCES);
	/* A correct answer replayed against a new challenge. */
	ck_assert_int_eq(answer_verified(k, &SEC_A, "", ns, ns2, &g), CRUN_EACCES);
	/* A flipped job byte breaks the MAC too. */
	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, &SEC_A, "ab", ns, ans, &len, nc), 0);
	ans[5] ^= 1;
	ck_assert_int_eq(store_auth_verify(STORE_AUTH_STORE, k, ns, ans, len, &used, &g),
			 CRUN_EACCES);
	store_auth_keys_free(k);
}
END_TEST

/* _i over every strict prefix of an answer: more bytes needed, never a verdict. */
START_TEST(every_prefix_of_an_answer_asks_for_more)
{
	struct store_auth_keys *k = keys_of("", &SEC_A);
	uint8_t ns[32] = {1}, nc[32], ans[STORE_AUTH_ANSWER_MAX];
	struct store_auth_grant g;
	size_t len, used;

	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, &SEC_A, "some-run", ns, ans, &len, nc),
			 0);
	if ((size_t)_i < len)
		ck_assert_int_eq(
		    store_auth_verify(STORE_AUTH_STORE, k, ns, ans, (size_t)_i, &used, &g),
		    CRUN_EAGAIN);
	store_auth_keys_free(k);
}
END_TEST

START_TEST(a_store_frame_is_not_an_answer)
{
	struct store_auth_keys *k = keys_of("", &SEC_A);
	const uint8_t validate[] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
	uint8_t ns[32] = {0}, ch[STORE_AUTH_CHALLENGE_BYTES];
	struct store_auth_grant g;
	size_t used;

	ck_assert_int_eq(store_auth_verify(STORE_AUTH_STORE, k, ns, validate, 1, &used, &g),
			 CRUN_EPROTO);
	ck_assert_int_eq(store_auth_verify(STORE_AUTH_STORE, k, ns, validate, 5, &used, &g),
			 CRUN_EPROTO);
	ck_assert_int_eq(store_auth_decode_challenge(validate, 5, ns), CRUN_EPROTO);
	store_auth_encode_challenge(ns, ch);
	ck_assert_int_eq(store_auth_decode_challenge(ch, 10, ns), CRUN_EAGAIN);
	ck_assert_int_eq(store_auth_decode_challenge(ch, sizeof(ch), ns), 0);
	store_auth_keys_free(k);
}
END_TEST

START_TEST(per_job_secrets_scope_keys)
{
	struct store_auth_keys *k = keys_of("A", &SEC_A);
	uint8_t ns[32] = {2};
	struct store_auth_grant g;

	ck_assert_int_eq(store_auth_keys_add(k, "B", &SEC_B), 0);
	ck_assert_int_eq(store_auth_keys_add(k, "a/b", &SEC_B), CRUN_EINVAL);
	/* B's secret does not open A, and an unknown job has no secret. */
	ck_assert_int_eq(answer_verified(k, &SEC_B, "A", ns, ns, &g), CRUN_EACCES);
	ck_assert_int_eq(answer_verified(k, &SEC_A, "C", ns, ns, &g), CRUN_ENOENT);
	ck_assert_int_eq(answer_verified(k, &SEC_A, "A", ns, ns, &g), 0);
	ck_assert(g.scoped);
#define OK(key)	 ck_assert(store_auth_key_allowed(&g, (const uint8_t *)key, strlen(key)))
#define BAD(key) ck_assert(!store_auth_key_allowed(&g, (const uint8_t *)key, strlen(key)))
	OK("/crun-c10d/A/round");
	OK("/crun-c10d/A/r0/assign/1");
	BAD("/crun-c10d/B/round");
	BAD("/crun-c10d/AB/round"); /* a longer run id with A as prefix */
	BAD("/crun-c10d/A");
	BAD("/other/A/round");
	BAD("");
#undef OK
#undef BAD
	store_auth_keys_free(k);
}
END_TEST

static void write_file(const char *path, const char *text, mode_t mode)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fd_write_all(fd, text, strlen(text)), 0);
	ck_assert_int_eq(fchmod(fd, mode), 0);
	close(fd);
}

START_TEST(secret_files_must_be_private_and_long_enough)
{
	char dir[] = "/tmp/crun-auth-XXXXXX", p[128], err[600];
	struct store_auth_secret s;
	struct store_auth_keys *k;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_ge(str_printf(p, sizeof(p), "%s/ok", dir), 0);
	write_file(p, "0123456789abcdef-secret\n", 0600);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), 0);
	ck_assert_uint_eq(s.len, 23); /* the newline is not part of it */
	ck_assert_mem_eq(s.bytes, "0123456789abcdef-secret", 23);
	chmod(p, 0640);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EACCES);
	ck_assert_ptr_nonnull(strstr(err, "accessible by group or others"));
	ck_assert_ptr_nonnull(strstr(err, p));
	write_file(p, "short\n", 0600);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "shorter than 16"));
	ck_assert_int_eq(store_auth_secret_read("/nonexistent/x", &s, err, sizeof(err)),
			 CRUN_ENOENT);
	/* A directory of per-run-id secrets. */
	write_file(p, "0123456789abcdef-secret-ok\n", 0600);
	ck_assert_int_ge(str_printf(p, sizeof(p), "%s/job2", dir), 0);
	write_file(p, "another-secret-of-job-2\n", 0600);
	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_load_dir(k, dir, err, sizeof(err)), 2);
	ck_assert_uint_eq(store_auth_keys_count(k), 2);
	store_auth_keys_free(k);
	chmod(p, 0604);
	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_load_dir(k, dir, err, sizeof(err)), CRUN_EACCES);
	store_auth_keys_free(k);
	unlink(p);
	ck_assert_int_ge(str_printf(p, sizeof(p), "%s/ok", dir), 0);
	unlink(p);
	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_load_dir(k, dir, err, sizeof(err)), CRUN_EINVAL);
	store_auth_keys_free(k);
	rmdir(dir);
}
END_TEST

/* Refused before a byte is read, each with its reason and the path: a FIFO
 * (open() of one would wait for a writer: the test's timeout is the hang
 * guard), a symbolic link, a file of another user, a directory others can
 * write to; a sticky one (as /tmp) is fine. */
START_TEST(secret_files_that_are_fifos_links_foreign_or_in_open_dirs_are_refused)
{
	char dir[] = "/tmp/crun-auth-XXXXXX", p[128], l[128], err[600];
	struct store_auth_secret s;
	struct store_auth_keys *k;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	ck_assert_int_ge(str_printf(p, sizeof(p), "%s/job", dir), 0);
	ck_assert_int_ge(str_printf(l, sizeof(l), "%s/link", dir), 0);
	ck_assert_int_eq(mkfifo(p, 0600), 0);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "not a regular file"));
	ck_assert_ptr_nonnull(strstr(err, p));
	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_load_dir(k, dir, err, sizeof(err)), CRUN_EINVAL);
	store_auth_keys_free(k);
	unlink(p);
	write_file(p, "0123456789abcdef-secret\n", 0600);
	ck_assert_int_eq(symlink(p, l), 0);
	ck_assert_int_lt(store_auth_secret_read(l, &s, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(strstr(err, "symbolic link"));
	ck_assert_ptr_nonnull(strstr(err, l));
	unlink(l);
	/* The directory: writable by others, unless sticky. */
	chmod(dir, 0777);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EACCES);
	ck_assert_ptr_nonnull(strstr(err, "writable by group or others"));
	ck_assert_ptr_nonnull(strstr(err, dir));
	ck_assert_int_eq(store_auth_keys_new(&k), 0);
	ck_assert_int_eq(store_auth_keys_load_dir(k, dir, err, sizeof(err)), CRUN_EACCES);
	ck_assert_ptr_nonnull(strstr(err, "auth secrets directory"));
	store_auth_keys_free(k);
	chmod(dir, 01777);
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), 0);
	chmod(dir, 0700);
	/* Another user's file or directory (needs root to make one). */
	if (geteuid() == 0) {
		ck_assert_int_eq(chown(p, 65534, 65534), 0);
		ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EACCES);
		ck_assert_ptr_nonnull(strstr(err, "owned by uid 65534"));
		ck_assert_int_eq(chown(p, 0, 0), 0);
		ck_assert_int_eq(chown(dir, 65534, 65534), 0);
		ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), CRUN_EACCES);
		ck_assert_ptr_nonnull(strstr(err, "owned by uid 65534"));
		ck_assert_int_eq(chown(dir, 0, 0), 0);
	}
	ck_assert_int_eq(store_auth_secret_read(p, &s, err, sizeof(err)), 0);
	unlink(p);
	rmdir(dir);
}
END_TEST

/* ---- a server with secrets ------------------------------------------------- */

static struct event_base *g_base;
static struct store_server *g_srv;
static struct store_auth_keys *g_keys;
static pthread_t g_thread;
static uint16_t g_port;
static char g_dir[64], g_file_a[128], g_file_b[128];

static uint64_t metric(enum store_metric m);

static void *loop_main(void *arg)
{
	event_base_loop(arg ? arg : g_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

/* Job "A" and job "B" each with their own secret (as crun-rdzvd
 * --auth-secrets-dir), or with daemon = 1 one secret for all (SEC_A). */
static void start(int daemon)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;

	log_init("test_store_auth", LL_ERROR);
	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(evthread_use_pthreads(), 0);
	g_base = event_base_new();
	ck_assert_ptr_nonnull(g_base);
	g_keys = keys_of(daemon ? "" : "A", &SEC_A);
	if (!daemon)
		ck_assert_int_eq(store_auth_keys_add(g_keys, "B", &SEC_B), 0);
	c.host = "127.0.0.1";
	c.auth = g_keys;
	ck_assert_int_eq(store_server_new(g_base, &c, &g_srv), 0);
	g_port = store_server_port(g_srv);
	ck_assert_int_eq(pthread_create(&g_thread, NULL, loop_main, NULL), 0);
	ck_assert_int_ge(str_printf(g_dir, sizeof(g_dir), "/tmp/crun-auth-XXXXXX"), 0);
	ck_assert_ptr_nonnull(mkdtemp(g_dir));
	ck_assert_int_ge(str_printf(g_file_a, sizeof(g_file_a), "%s/a", g_dir), 0);
	ck_assert_int_ge(str_printf(g_file_b, sizeof(g_file_b), "%s/b", g_dir), 0);
	write_file(g_file_a, (const char *)SEC_A.bytes, 0600);
	write_file(g_file_b, (const char *)SEC_B.bytes, 0600);
	/* event_base_loop() clears a pending break when it starts: a test that
	 * never talks to the server would otherwise race stop()'s loopbreak
	 * against the loop's start, and lose it (join forever). */
	(void)metric(STORE_M_DROP_AUTH);
}

static void start_daemon_secret(void)
{
	start(1);
}

static void start_job_secrets(void)
{
	start(0);
}

static void stop(void)
{
	/* loopexit, not loopbreak: a test that ends before the loop thread
	 * entered the loop would have its break cleared on entry (a hang). */
	event_base_loopexit(g_base, NULL);
	pthread_join(g_thread, NULL);
	store_server_free(g_srv);
	event_base_free(g_base);
	store_auth_keys_free(g_keys);
	unlink(g_file_a);
	unlink(g_file_b);
	rmdir(g_dir);
}

struct metric_read {
	enum store_metric m;
	uint64_t v;
	volatile int done;
	struct store_server_config cfg; /* do_set_limits: the limits to set */
};

static void do_metric(evutil_socket_t fd, short what, void *arg)
{
	struct metric_read *mr = arg;

	(void)fd;
	(void)what;
	mr->v = store_server_metric(g_srv, mr->m);
	mr->done = 1;
}

/* A counter of the server's metric table, read on its loop thread. */
static uint64_t metric(enum store_metric m)
{
	struct metric_read mr = {.m = m};
	const struct timeval now = {0, 0};

	ck_assert_int_eq(event_base_once(g_base, -1, EV_TIMEOUT, do_metric, &mr, &now), 0);
	for (int i = 0; i < 1000 && !mr.done; i++)
		usleep(1000);
	ck_assert(mr.done);
	return mr.v;
}

/* Waits (bounded) until the server counted at least n auth failures: a
 * refused client may return before the server has processed its bytes. */
static void wait_auth_failures(uint64_t n)
{
	uint64_t seen = 0;

	for (int i = 0; i < 500 && (seen = metric(STORE_M_DROP_AUTH)) < n; i++)
		usleep(2000);
	ck_assert_uint_ge(seen, n);
}

static int open_store(const char *file, const char *job, crun_store_t **ret)
{
	crun_store_opts_t o = CRUN_STORE_OPTS_INIT;

	o.host = "127.0.0.1";
	o.port = g_port;
	o.connect_timeout_ms = 3000;
	o.timeout_ms = 3000;
	o.auth_secret_file = file;
	o.auth_job = job;
	return crun_store_open(&o, ret);
}

START_TEST(client_with_the_secret_works_and_others_are_refused)
{
	crun_store_t *s, *bad;
	void *v;
	size_t len;

	ck_assert_int_eq(open_store(g_file_a, "anyjob", &s), 0);
	ck_assert_int_eq(crun_store_set(s, "k", "v", 1), 0);
	ck_assert_int_eq(crun_store_get(s, "k", 1000, &v, &len), 0);
	ck_assert_mem_eq(v, "v", 1);
	crun_free(v);
	ck_assert_int_eq(open_store(g_file_b, "anyjob", &bad), CRUN_EACCES);
	/* No secret: the client waits for a PING echo it never gets. */
	ck_assert_int_lt(open_store(NULL, NULL, &bad), 0);
	wait_auth_failures(2);
	/* The authenticated connection is unaffected. */
	ck_assert_int_eq(crun_store_get(s, "k", 1000, &v, &len), 0);
	crun_free(v);
	crun_store_close(s);
}
END_TEST

/* A TCP connection to the server from source address `from` (host order;
 * any 127/8 address is this host's loopback). */
static int raw_conn_from(uint32_t from)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(g_port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(from)};
	struct timeval tv = {5, 0};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&src, sizeof(src)), 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static int raw_conn(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
				.sin_port = htons(g_port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	struct timeval tv = {5, 0};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void read_n(int fd, uint8_t *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = recv(fd, buf + got, n - got, 0);

		ck_assert_int_gt(r, 0);
		got += (size_t)r;
	}
}

static void send_all(int fd, const void *p, size_t len)
{
	ck_assert_int_eq(send(fd, p, len, MSG_NOSIGNAL), (ssize_t)len);
}

/* EOF (or reset) within the receive timeout: the server hung up. */
static void assert_closed(int fd)
{
	uint8_t b;
	ssize_t r = recv(fd, &b, 1, 0);

	/* Not a receive timeout (EAGAIN): the peer hung up. */
	ck_assert(r == 0 || (r < 0 && errno == ECONNRESET));
	close(fd);
}

START_TEST(a_store_frame_before_the_answer_is_dropped_unread)
{
	/* VALIDATE then SET "/x" = "evil", as PyTorch's client would send. */
	const uint8_t frames[] = {0x00, 0xce, 0xf7, 0x85, 0x3c, 0x01, 2,   0,	0,  0,
				  0,	0,    0,    0,	  '/',	'x',  4,   0,	0,  0,
				  0,	0,    0,    0,	  0,	'e',  'v', 'i', 'l'};
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES];
	crun_store_t *s;
	int ready = 1, fd = raw_conn();
	const char *key = "x";

	read_n(fd, ch, sizeof(ch));
	ck_assert_mem_eq(ch, "CRA1", 4);
	ck_assert_int_eq(send(fd, frames, sizeof(frames), MSG_NOSIGNAL), (ssize_t)sizeof(frames));
	assert_closed(fd);
	ck_assert_int_eq(open_store(g_file_a, "", &s), 0);
	ck_assert_int_eq(crun_store_check(s, &key, 1, &ready), 0);
	ck_assert_int_eq(ready, 0); /* nothing was written */
	crun_store_close(s);
	wait_auth_failures(1);
}
END_TEST

START_TEST(a_replayed_answer_is_refused)
{
	uint8_t ns[32], nc[32], ch[STORE_AUTH_CHALLENGE_BYTES], ans[STORE_AUTH_ANSWER_MAX];
	uint8_t proof[STORE_AUTH_PROOF_BYTES];
	size_t len;
	int fd = raw_conn(), fd2;

	/* A genuine exchange, recorded. */
	read_n(fd, ch, sizeof(ch));
	ck_assert_int_eq(store_auth_decode_challenge(ch, sizeof(ch), ns), 0);
	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, &SEC_A, "", ns, ans, &len, nc), 0);
	ck_assert_int_eq(send(fd, ans, len, MSG_NOSIGNAL), (ssize_t)len);
	read_n(fd, proof, sizeof(proof));
	ck_assert_int_eq(
	    store_auth_check_proof(STORE_AUTH_STORE, &SEC_A, "", ns, nc, proof, sizeof(proof)), 0);
	close(fd);
	/* The same bytes on a new connection: its challenge is different. */
	fd2 = raw_conn();
	read_n(fd2, ch, sizeof(ch));
	ck_assert_mem_ne(ch + 5, ns, 32);
	ck_assert_int_eq(send(fd2, ans, len, MSG_NOSIGNAL), (ssize_t)len);
	assert_closed(fd2);
}
END_TEST

START_TEST(a_silent_client_is_dropped_after_the_preauth_deadline)
{
	struct timeval tv = {25, 0};
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES];
	int fd = raw_conn();

	read_n(fd, ch, sizeof(ch));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	/* Half an answer, then silence: the server gives up (10 s), we do not. */
	ck_assert_int_eq(send(fd, "CRA1", 4, MSG_NOSIGNAL), 4);
	assert_closed(fd);
	wait_auth_failures(1);
}
END_TEST

static void do_set_limits(evutil_socket_t fd, short what, void *arg)
{
	struct metric_read *done = arg;

	(void)fd;
	(void)what;
	store_server_set_limits(g_srv, &done->cfg);
	done->done = 1;
}

/* Issue 28: strangers that never authenticate hold pre-auth slots of their
 * own address, not slots of max_conns; past their per-address budget they
 * are refused at accept; the real client still gets in, and max_conns is
 * checked when it does. */
START_TEST(strangers_do_not_take_max_conns_and_have_a_budget_per_address)
{
	struct metric_read set = {.cfg = STORE_SERVER_CONFIG_DEFAULT};
	const struct timeval now = {0, 0};
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES];
	crun_store_t *s, *s2;
	int fds[3];

	set.cfg.max_conns = 1;
	set.cfg.max_preauth_per_addr = 2;
	set.cfg.preauth_timeout_s = 600;
	ck_assert_int_eq(event_base_once(g_base, -1, EV_TIMEOUT, do_set_limits, &set, &now), 0);
	for (int i = 0; i < 1000 && !set.done; i++)
		usleep(1000);
	ck_assert(set.done);
	/* Two strangers from 127.0.0.2 get a challenge and stay silent. */
	for (int i = 0; i < 2; i++) {
		fds[i] = raw_conn_from(0x7f000002);
		read_n(fds[i], ch, sizeof(ch));
	}
	/* A third from there is refused at accept. */
	fds[2] = raw_conn_from(0x7f000002);
	assert_closed(fds[2]);
	ck_assert_uint_eq(metric(STORE_M_REFUSED_PREAUTH_ADDR), 1);
	/* The job's client, from 127.0.0.1, takes the one slot of max_conns. */
	ck_assert_int_eq(open_store(g_file_a, "", &s), 0);
	ck_assert_int_eq(crun_store_set(s, "k", "v", 1), 0);
	/* A second one authenticates, then finds max_conns full. */
	ck_assert_int_lt(open_store(g_file_a, "", &s2), 0);
	ck_assert_uint_ge(metric(STORE_M_REFUSED_MAX_CONNS), 1); /* it retried */
	crun_store_close(s);
	close(fds[0]);
	close(fds[1]);
}
END_TEST

START_TEST(a_client_without_a_challenge_fails_clearly)
{
	/* Against a server without secrets a client with one must not hang
	 * past its deadline, and must say why. */
	struct event_base *b = event_base_new();
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;
	struct store_server *plain;
	crun_store_t *s;
	pthread_t t;
	uint16_t port;

	c.host = "127.0.0.1";
	ck_assert_int_eq(store_server_new(b, &c, &plain), 0);
	port = store_server_port(plain);
	ck_assert_int_eq(pthread_create(&t, NULL, loop_main, b), 0);
	{
		crun_store_opts_t o = CRUN_STORE_OPTS_INIT;

		o.host = "127.0.0.1";
		o.port = port;
		o.connect_timeout_ms = 1000;
		o.auth_secret_file = g_file_a;
		ck_assert_int_eq(crun_store_open(&o, &s), CRUN_EPROTO);
	}
	/* The client fails at once (the server answers that it has no
	 * secret), maybe before the loop started: as in stop(). */
	event_base_loopexit(b, NULL);
	pthread_join(t, NULL);
	store_server_free(plain);
	event_base_free(b);
}
END_TEST

START_TEST(a_job_cannot_touch_or_list_another_jobs_keys)
{
	crun_store_t *a, *b, *va, *vb;
	char **keys;
	size_t n;
	void *v;
	size_t len;
	int64_t cnt;

	ck_assert_int_eq(open_store(g_file_a, "A", &a), 0);
	ck_assert_int_eq(open_store(g_file_b, "B", &b), 0);
	ck_assert_int_eq(crun_store_view_new(a, "crun-c10d/A", &va), 0);
	ck_assert_int_eq(crun_store_view_new(b, "crun-c10d/B", &vb), 0);
	ck_assert_int_eq(crun_store_set(va, "round", "1", 1), 0);
	ck_assert_int_eq(crun_store_set(vb, "round", "7", 1), 0);
	/* A lists only its own keys. */
	ck_assert_int_eq(crun_store_list_keys(a, &keys, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_str_eq(keys[0], "crun-c10d/A/round");
	crun_store_free_list(keys, n);
	/* The wrong secret for a job is refused outright. */
	{
		crun_store_t *x;

		ck_assert_int_eq(open_store(g_file_b, "A", &x), CRUN_EACCES);
	}
	/* Any op on B's keys from A is an error (the connection is closed). */
	crun_store_close(va);
	ck_assert_int_eq(crun_store_view_new(a, "crun-c10d/B", &va), 0);
	ck_assert_int_lt(crun_store_add(va, "round", 1, &cnt), 0);
	crun_store_close(va);
	crun_store_close(a);
	ck_assert_int_eq(open_store(g_file_a, "A", &a), 0);
	ck_assert_int_lt(crun_store_num_keys(a, &cnt), 0); /* would count B's keys */
	crun_store_close(a);
	/* B's value is untouched. */
	ck_assert_int_eq(crun_store_get(vb, "round", 1000, &v, &len), 0);
	ck_assert_mem_eq(v, "7", 1);
	crun_free(v);
	crun_store_close(vb);
	crun_store_close(b);
}
END_TEST

/* ---- a relay between the store's exchange and the mesh's ---------------- */

/* One end of the exchange, run on its own thread as the real code runs it. */
struct side {
	int fd;
	bool mesh_server; /* else: the client half, of the mesh (mesh) or store */
	bool mesh;
	int r;
	pthread_t t;
};

static void *side_main(void *arg)
{
	struct side *sd = arg;
	char err[300];
	uint64_t deadline = clock_now_ms() + 10000;

	if (sd->mesh_server)
		sd->r = store_auth_mesh_server_run(sd->fd, &SEC_A, deadline, err, sizeof(err));
	else if (sd->mesh)
		sd->r = store_auth_mesh_client_run(sd->fd, &SEC_A, deadline, err, sizeof(err));
	else
		sd->r = store_auth_client_run(sd->fd, NULL, &SEC_A, "", deadline, err, sizeof(err));
	return NULL;
}

/* A socketpair whose test end ([1]) gives up a read after 10 s (a hang guard). */
static void pair(int sv[2])
{
	struct timeval tv = {10, 0};

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
}

static void side_start(struct side *sd, int fd, bool mesh_server, bool mesh)
{
	*sd = (struct side){.fd = fd, .mesh_server = mesh_server, .mesh = mesh};
	ck_assert_int_eq(pthread_create(&sd->t, NULL, side_main, sd), 0);
}

/* The answer of a client for run id "" (job_len 0). */
#define ANSWER_BYTES (5 + STORE_AUTH_NONCE_BYTES + STORE_AUTH_MAC_BYTES)

/* An intruder who can write the worker store (so mesh ranks dial it) but
 * cannot read the secret takes the daemon's challenge, presents it to a mesh
 * rank that dials it, and hands the rank's answer back to the daemon. */
START_TEST(a_daemon_challenge_relayed_through_a_mesh_client_is_refused)
{
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES], ans[ANSWER_BYTES], b;
	struct side mesh_client;
	int sv[2], fd = raw_conn();
	ssize_t r;

	pair(sv);
	side_start(&mesh_client, sv[0], false, true);
	read_n(fd, ch, sizeof(ch));	 /* the daemon's challenge */
	send_all(sv[1], ch, sizeof(ch)); /* ... to the mesh rank */
	read_n(sv[1], ans, sizeof(ans)); /* its answer */
	send_all(fd, ans, sizeof(ans));	 /* ... to the daemon */
	r = recv(fd, &b, 1, 0);		 /* a proof, or the door */
	ck_assert_msg(r == 0 || (r < 0 && errno == ECONNRESET),
		      "the daemon admitted a relayed mesh answer (recv %zd)", r);
	close(fd);
	close(sv[1]);
	pthread_join(mesh_client.t, NULL);
	ck_assert_int_lt(mesh_client.r, 0);
	close(sv[0]);
	wait_auth_failures(1);
}
END_TEST

/* The reverse: a mesh rank's challenge, answered by a store client that
 * dialed the intruder as its store, fed back to the mesh rank. */
START_TEST(a_mesh_challenge_relayed_through_a_store_client_is_refused)
{
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES], ans[ANSWER_BYTES];
	struct side mesh_server, store_client;
	int m[2], c[2];

	pair(m);
	pair(c);
	side_start(&mesh_server, m[0], true, true);
	side_start(&store_client, c[0], false, false);
	read_n(m[1], ch, sizeof(ch)); /* the mesh rank's challenge */
	send_all(c[1], ch, sizeof(ch));
	read_n(c[1], ans, sizeof(ans)); /* the store client's answer */
	send_all(m[1], ans, sizeof(ans));
	pthread_join(mesh_server.t, NULL);
	ck_assert_msg(mesh_server.r < 0, "the mesh rank admitted a relayed store answer");
	close(m[1]);
	close(c[1]);
	pthread_join(store_client.t, NULL);
	close(m[0]);
	close(c[0]);
}
END_TEST

/* ---- every op of both tables, from job A, naming a key of job B ------------ */

#define KEY_A "/crun-c10d/A/k"
#define KEY_B "/crun-c10d/B/k"
#define VAL_B "B-value"

/* A raw connection authenticated as `job`; for v2 its VALIDATE is sent. */
static int raw_job_conn(const struct store_auth_secret *s, const char *job, enum store_dialect d)
{
	static const uint8_t validate[5] = {0x00, 0xce, 0xf7, 0x85, 0x3c};
	uint8_t ch[STORE_AUTH_CHALLENGE_BYTES], ans[STORE_AUTH_ANSWER_MAX];
	uint8_t proof[STORE_AUTH_PROOF_BYTES], ns[32], nc[32];
	size_t len;
	int fd = raw_conn();

	read_n(fd, ch, sizeof(ch));
	ck_assert_int_eq(store_auth_decode_challenge(ch, sizeof(ch), ns), 0);
	ck_assert_int_eq(store_auth_answer(STORE_AUTH_STORE, s, job, ns, ans, &len, nc), 0);
	send_all(fd, ans, len);
	read_n(fd, proof, sizeof(proof));
	ck_assert_int_eq(
	    store_auth_check_proof(STORE_AUTH_STORE, s, job, ns, nc, proof, sizeof(proof)), 0);
	if (d == STORE_V2)
		send_all(fd, validate, sizeof(validate));
	return fd;
}

static const struct store_bytes BK = {(const uint8_t *)KEY_B, sizeof(KEY_B) - 1};
static const struct store_bytes AK = {(const uint8_t *)KEY_A, sizeof(KEY_A) - 1};
static const struct store_bytes VAL = {(const uint8_t *)"v", 1};

/* Where a test puts B's key in a request: its key field, its second key
 * field, or the second entry of its key list (the first is A's). */
enum slot { SLOT_KEY, SLOT_KEY2, SLOT_LIST, SLOT__MAX };

/* The frame of `op` (v1/v2: a PyTorch op; 0: the extension op `code`) with
 * B's key in `slot` (SLOT__MAX: nowhere), the rest of its fields filled with
 * A's key and valid numbers. Returns its length, 0 when it cannot be encoded. */
static size_t frame_of(int d, int code, enum slot sl, uint8_t *buf, size_t cap)
{
	struct store_bytes list[2] = {AK, sl == SLOT_LIST ? BK : AK}, vals[2] = {VAL, VAL};
	size_t len = 0;
	int r;

	if (d) {
		struct store_req q = {.op = (enum store_op)code,
				      .key = sl == SLOT_KEY ? BK : AK,
				      .val = VAL,
				      .val2 = VAL,
				      .num = 1,
				      .u32 = 7,
				      .nitems = 2,
				      .keys = list,
				      .vals = vals};

		r = store_proto_encode_req((enum store_dialect)d, &q, buf, cap, &len);
	} else {
		struct store_ext_req q = {.op = (uint8_t)code,
					  .magic = STORE_EXT_MAGIC,
					  .version = STORE_EXT_VERSION,
					  .id = 1,
					  .ttl_ms = 60000,
					  .key = sl == SLOT_KEY ? BK : AK,
					  .val = VAL,
					  .key2 = sl == SLOT_KEY2 ? BK : AK,
					  .val2 = VAL,
					  .nitems = 2,
					  .keys = list};

		r = store_ext_encode_req(&q, buf, cap, &len);
	}
	return r < 0 ? 0 : len;
}

/* frame_of with B's key in `slot`, 0 when the op puts nothing of that slot
 * on the wire - decided by the encoder, not by any table of which fields
 * are keys, so an op whose keys a table forgets is still tried. */
static size_t frame_with_b(int d, int code, enum slot sl, uint8_t *buf, size_t cap)
{
	size_t len = frame_of(d, code, sl, buf, cap);

	return len && memmem(buf, len, KEY_B, sizeof(KEY_B) - 1) ? len : 0;
}

static size_t count_in(const uint8_t *p, size_t len, const char *what)
{
	size_t n = 0, wl = strlen(what);
	const uint8_t *at;

	while ((at = memmem(p, len, what, wl))) {
		n++;
		len -= (size_t)(at - p) + wl;
		p = at + wl;
	}
	return n;
}

static int count_key(void *arg, const uint8_t *key, size_t len)
{
	ck_assert_uint_eq(len, AK.len);
	ck_assert_mem_eq(key, KEY_A, AK.len);
	(*(size_t *)arg)++;
	return 0;
}

/* The tables' key columns name every key an op puts on the wire, no more:
 * the keys each_key walks in a decoded frame are the copies of A's key in
 * its bytes (the values are "v"). */
START_TEST(the_op_tables_name_exactly_the_keys_on_the_wire)
{
	const struct store_limits lim = STORE_LIMITS_DEFAULT;
	uint8_t buf[512];
	size_t len, used, seen, with_keys = 0;

	for (int d = 0; d <= STORE_V2; d++)
		for (int code = 0; code < (d ? STORE_OP__MAX : 256); code++) {
			if (d == 0 && !store_ext_is_op((uint8_t)code))
				continue;
			len = frame_of(d, code, SLOT__MAX, buf, sizeof(buf));
			if (!len)
				continue;
			seen = 0;
			if (d) {
				struct store_req q;

				ck_assert_int_eq(store_proto_decode_req((enum store_dialect)d, &lim,
									buf, len, &q, &used),
						 0);
				ck_assert_int_eq(store_proto_req_each_key(&q, count_key, &seen), 0);
			} else {
				struct store_ext_req q;

				ck_assert_int_eq(store_ext_decode_req(&lim, buf, len, &q, &used),
						 0);
				ck_assert_int_eq(store_ext_req_each_key(&q, count_key, &seen), 0);
			}
			ck_assert_msg(
			    seen == count_in(buf, len, KEY_A),
			    "op %d (dialect %d): the table names %zu keys, the frame holds "
			    "%zu",
			    code, d, seen, count_in(buf, len, KEY_A));
			with_keys += seen > 0;
		}
	ck_assert_uint_ge(with_keys, 20);
	ck_assert_int_eq(store_proto_op_reach(STORE_OP_GETNUMKEYS), STORE_REACH_ALL);
	ck_assert_int_eq(store_proto_op_reach(STORE_OP_LIST_KEYS), STORE_REACH_ALL_FILTERED);
	ck_assert_int_eq(store_proto_op_reach(STORE_OP_GET), STORE_REACH_ARGS);
}
END_TEST

/* Sends the frame on a fresh connection of job A (after HELLO, and MUX for
 * the ops that need it, for an extension op); the server must close it as
 * a foreign key, counted as such. */
static void expect_refused(int d, int code, const uint8_t *frame, size_t len, uint64_t *n)
{
	int fd = raw_job_conn(&SEC_A, "A", d ? (enum store_dialect)d : STORE_V2);
	const char *name = d ? store_proto_op_name((enum store_op)code) : store_ext_op_name(code);

	if (!d) {
		const struct store_ext_req h = {
		    .op = STORE_EXT_HELLO, .magic = STORE_EXT_MAGIC, .version = STORE_EXT_VERSION};
		uint8_t hb[16], ver[4];
		size_t hl;

		ck_assert_int_eq(store_ext_encode_req(&h, hb, sizeof(hb), &hl), 0);
		send_all(fd, hb, hl);
		read_n(fd, ver, sizeof(ver));
		if (code == STORE_EXT_WAIT_TAG || code == STORE_EXT_WAIT_TAG_CANCEL) {
			const uint8_t mux = STORE_EXT_MUX;

			send_all(fd, &mux, 1);
		}
	}
	send_all(fd, frame, len);
	{
		uint8_t b;
		ssize_t r = recv(fd, &b, 1, 0);

		ck_assert_msg(r == 0 || (r < 0 && errno == ECONNRESET),
			      "%s (dialect %d) on job B's key was not refused (recv %zd)", name, d,
			      r);
	}
	close(fd);
	ck_assert_msg(metric(STORE_M_DROP_FOREIGN_KEY) == ++*n,
		      "%s (dialect %d) was closed, but not as a foreign key", name, d);
}

START_TEST(every_op_of_every_table_is_refused_on_another_jobs_key)
{
	uint8_t buf[512], ans[64];
	uint64_t refused = 0, tried_ext = 0;
	size_t len;
	int fd;

	/* B's key and value, written by B. */
	fd = raw_job_conn(&SEC_B, "B", STORE_V2);
	{
		const struct store_req set = {
		    .op = STORE_OP_SET, .key = BK, .val = {(const uint8_t *)VAL_B, 7}};
		const struct store_req get = {.op = STORE_OP_GET, .key = BK};

		ck_assert_int_eq(store_proto_encode_req(STORE_V2, &set, buf, sizeof(buf), &len), 0);
		send_all(fd, buf, len);
		ck_assert_int_eq(store_proto_encode_req(STORE_V2, &get, buf, sizeof(buf), &len), 0);
		send_all(fd, buf, len);
		read_n(fd, ans, 8 + 7);
		ck_assert_mem_eq(ans + 8, VAL_B, 7);
	}
	/* Every PyTorch op of both numberings. */
	for (int d = STORE_V1; d <= STORE_V2; d++)
		for (int op = 0; op < STORE_OP__MAX; op++)
			for (int sl = 0; sl < SLOT__MAX; sl++) {
				len = frame_with_b(d, op, (enum slot)sl, buf, sizeof(buf));
				if (len)
					expect_refused(d, op, buf, len, &refused);
			}
	/* Every op of the extension's table. */
	for (int code = 0; code < 256; code++) {
		if (!store_ext_is_op((uint8_t)code))
			continue;
		for (int sl = 0; sl < SLOT__MAX; sl++) {
			len = frame_with_b(0, code, (enum slot)sl, buf, sizeof(buf));
			if (!len)
				continue;
			expect_refused(0, code, buf, len, &refused);
			tried_ext++;
		}
	}
	ck_assert_uint_ge(tried_ext, 10);
	/* B's key is as B left it. */
	{
		const struct store_req get = {.op = STORE_OP_GET, .key = BK};

		ck_assert_int_eq(store_proto_encode_req(STORE_V2, &get, buf, sizeof(buf), &len), 0);
		send_all(fd, buf, len);
		read_n(fd, ans, 8 + 7);
		ck_assert_uint_eq(store_get_u64(ans), 7);
		ck_assert_mem_eq(ans + 8, VAL_B, 7);
	}
	close(fd);
}
END_TEST

/* ---- the worker store's allowlist (allow.c) ------------------------------- */

static bool allowed(struct store_server *srv, const char *ip)
{
	struct sockaddr_in6 a6 = {.sin6_family = AF_INET6};
	struct sockaddr_in a4 = {.sin_family = AF_INET};

	if (inet_pton(AF_INET, ip, &a4.sin_addr) == 1)
		return store_server_peer_allowed(srv, (struct sockaddr *)&a4);
	ck_assert_int_eq(inet_pton(AF_INET6, ip, &a6.sin6_addr), 1);
	return store_server_peer_allowed(srv, (struct sockaddr *)&a6);
}

START_TEST(allowlist_admits_loopback_and_the_listed_nodes_only)
{
	struct store_server_config c = STORE_SERVER_CONFIG_DEFAULT;
	struct event_base *b = event_base_new();
	struct store_server *srv;

	c.host = "127.0.0.1";
	ck_assert_int_eq(store_server_new(b, &c, &srv), 0);
	ck_assert(allowed(srv, "10.9.9.9")); /* no list: anyone */
	ck_assert_int_eq(store_server_set_allowlist(srv, "10.0.0.1 10.0.0.2,fd00::7"), 0);
	ck_assert(allowed(srv, "10.0.0.1"));
	ck_assert(allowed(srv, "::ffff:10.0.0.2")); /* v4 on a dual-stack listener */
	ck_assert(allowed(srv, "fd00::7"));
	ck_assert(allowed(srv, "127.0.0.1"));
	ck_assert(allowed(srv, "127.3.4.5"));
	ck_assert(allowed(srv, "::1"));
	ck_assert(!allowed(srv, "10.0.0.3"));
	ck_assert(!allowed(srv, "::ffff:10.0.0.3"));
	ck_assert(!allowed(srv, "fd00::8"));
	/* A name is refused and leaves the list as it was. */
	ck_assert_int_eq(store_server_set_allowlist(srv, "10.0.0.3 node7"), CRUN_EINVAL);
	ck_assert(!allowed(srv, "10.0.0.3"));
	ck_assert(allowed(srv, "10.0.0.1"));
	ck_assert_int_eq(store_server_set_allowlist(srv, ""), 0); /* loopback only */
	ck_assert(!allowed(srv, "10.0.0.1"));
	ck_assert(allowed(srv, "127.0.0.1"));
	ck_assert_int_eq(store_server_set_allowlist(srv, NULL), 0);
	ck_assert(allowed(srv, "10.0.0.1"));
	store_server_free(srv);
	event_base_free(b);
}
END_TEST

Suite *store_auth_suite(void);
Suite *store_auth_suite(void)
{
	Suite *s = suite_create("store_auth");
	TCase *core = tcase_create("core");
	TCase *srv = tcase_create("server");
	TCase *jobs = tcase_create("jobs");

	tcase_set_timeout(core, 20);
	tcase_add_test(core, right_secret_verifies_both_ways);
	tcase_add_test(core, wrong_secret_and_replay_are_refused);
	tcase_add_loop_test(core, every_prefix_of_an_answer_asks_for_more, 0, 110);
	tcase_add_test(core, a_store_frame_is_not_an_answer);
	tcase_add_test(core, per_job_secrets_scope_keys);
	tcase_add_test(core, the_op_tables_name_exactly_the_keys_on_the_wire);
	tcase_add_test(core, secret_files_must_be_private_and_long_enough);
	tcase_add_test(core, secret_files_that_are_fifos_links_foreign_or_in_open_dirs_are_refused);
	tcase_add_test(core, allowlist_admits_loopback_and_the_listed_nodes_only);
	tcase_add_test(core, a_mesh_challenge_relayed_through_a_store_client_is_refused);
	suite_add_tcase(s, core);

	tcase_add_checked_fixture(srv, start_daemon_secret, stop);
	tcase_set_timeout(srv, 60);
	tcase_add_test(srv, client_with_the_secret_works_and_others_are_refused);
	tcase_add_test(srv, a_store_frame_before_the_answer_is_dropped_unread);
	tcase_add_test(srv, a_replayed_answer_is_refused);
	tcase_add_test(srv, a_silent_client_is_dropped_after_the_preauth_deadline);
	tcase_add_test(srv, a_client_without_a_challenge_fails_clearly);
	tcase_add_test(srv, a_daemon_challenge_relayed_through_a_mesh_client_is_refused);
	tcase_add_test(srv, strangers_do_not_take_max_conns_and_have_a_budget_per_address);
	suite_add_tcase(s, srv);

	tcase_add_checked_fixture(jobs, start_job_secrets, stop);
	tcase_set_timeout(jobs, 30);
	tcase_add_test(jobs, a_job_cannot_touch_or_list_another_jobs_keys);
	tcase_add_test(jobs, every_op_of_every_table_is_refused_on_another_jobs_key);
	suite_add_tcase(s, jobs);
	return s;
}

CRUN_CHECK_MAIN(store_auth_suite)
