/* test_notify.c: systemd's notify protocol (common/notify.c) against real
 * AF_UNIX datagram sockets bound here, path and abstract, and the watchdog
 * interval rules. */
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "common/common.h"

static int bind_dgram(const char *name, bool abstract)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	socklen_t len;
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s%s", abstract ? "@" : "", name);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(a.sun_path) +
			  (abstract ? 0 : 1));
	if (abstract)
		a.sun_path[0] = '\0';
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, len), 0);
	return fd;
}

static void expect(int fd, const char *want)
{
	char buf[256];
	ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);

	ck_assert_int_ge(n, 0);
	buf[n] = '\0';
	ck_assert_str_eq(buf, want);
}

START_TEST(path_and_abstract_sockets_receive_datagrams)
{
	char path[96], name[64];
	struct notify *n;
	int fd;

	snprintf(path, sizeof(path), "/tmp/crun-notify-%d", (int)getpid());
	unlink(path);
	fd = bind_dgram(path, false);
	ck_assert_int_eq(notify_open(path, &n), 0);
	ck_assert_int_eq(notify_send(n, "READY=1"), 0);
	ck_assert_int_eq(notify_send(n, "STATUS=round %d: %d/%d nodes", 3, 2, 4), 0);
	expect(fd, "READY=1");
	expect(fd, "STATUS=round 3: 2/4 nodes");
	notify_close(n);
	close(fd);
	unlink(path);

	snprintf(name, sizeof(name), "crun-notify-abstract-%d", (int)getpid());
	fd = bind_dgram(name, true);
	snprintf(path, sizeof(path), "@%s", name);
	ck_assert_int_eq(notify_open(path, &n), 0);
	ck_assert_int_eq(notify_send(n, "WATCHDOG=1"), 0);
	expect(fd, "WATCHDOG=1");
	notify_close(n);
	close(fd);
}
END_TEST

START_TEST(no_socket_is_a_no_op_and_bad_paths_fail)
{
	struct notify *n = (struct notify *)1;

	ck_assert_int_eq(notify_open(NULL, &n), 0);
	ck_assert_ptr_null(n);
	ck_assert_int_eq(notify_send(n, "READY=1"), 0);
	notify_close(NULL);
	ck_assert_int_eq(notify_open("relative/path", &n), CRUN_EINVAL);
	/* nobody listening: the datagram is dropped, the caller is told */
	ck_assert_int_eq(notify_open("/tmp/crun-notify-nobody-listens", &n), 0);
	ck_assert_int_lt(notify_send(n, "READY=1"), 0);
	notify_close(n);
}
END_TEST

START_TEST(watchdog_interval_is_half_and_pid_checked)
{
	char pid[32];

	ck_assert_uint_eq(notify_watchdog_ms("30000000", NULL), 15000);
	ck_assert_uint_eq(notify_watchdog_ms("1000", NULL), 1);
	ck_assert_uint_eq(notify_watchdog_ms(NULL, NULL), 0);
	ck_assert_uint_eq(notify_watchdog_ms("0", NULL), 0);
	ck_assert_uint_eq(notify_watchdog_ms("x", NULL), 0);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	ck_assert_uint_eq(notify_watchdog_ms("200000", pid), 100);
	ck_assert_uint_eq(notify_watchdog_ms("200000", "1"), 0); /* someone else's */
}
END_TEST

static Suite *notify_suite(void)
{
	Suite *s = suite_create("notify");
	TCase *tc = tcase_create("protocol");

	tcase_add_test(tc, path_and_abstract_sockets_receive_datagrams);
	tcase_add_test(tc, no_socket_is_a_no_op_and_bad_paths_fail);
	tcase_add_test(tc, watchdog_interval_is_half_and_pid_checked);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(notify_suite)
