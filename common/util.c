/* util.c: checked number parsing, clocks, fd and string helpers. These are
 * the only places crun parses integers or reads clocks (systemd's rule).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include "common.h"

int parse_u64(const char *s, uint64_t *ret)
{
	unsigned long long v;
	char *end;

	if (!s || !isdigit((unsigned char)s[0]))
		return CRUN_EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return CRUN_ERANGE;
	if (*end)
		return CRUN_EINVAL;
	*ret = v;
	return 0;
}

int parse_i64(const char *s, int64_t *ret)
{
	long long v;
	char *end;
	const char *d = s;

	if (!s)
		return CRUN_EINVAL;
	if (*d == '-' || *d == '+')
		d++;
	if (!isdigit((unsigned char)*d))
		return CRUN_EINVAL;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno == ERANGE)
		return CRUN_ERANGE;
	if (*end)
		return CRUN_EINVAL;
	*ret = v;
	return 0;
}

int parse_uint_range(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	uint64_t v;
	int r = parse_u64(s, &v);

	if (r < 0)
		return r;
	if (v < min || v > max)
		return CRUN_ERANGE;
	*ret = v;
	return 0;
}

int parse_seconds_ms(const char *s, uint64_t *ret_ms)
{
	uint64_t whole = 0, frac_ms = 0, scale = 100;
	const char *p = s;

	if (!s || (!isdigit((unsigned char)*p) && *p != '.'))
		return CRUN_EINVAL;
	while (isdigit((unsigned char)*p)) {
		if (whole > UINT64_MAX / 10 / 1000)
			return CRUN_ERANGE;
		whole = whole * 10 + (uint64_t)(*p++ - '0');
	}
	if (*p == '.') {
		p++;
		if (!isdigit((unsigned char)*p) && p - s == 1)
			return CRUN_EINVAL;
		while (isdigit((unsigned char)*p)) {
			frac_ms += (uint64_t)(*p++ - '0') * scale;
			scale /= 10;
		}
	}
	if (*p)
		return CRUN_EINVAL;
	*ret_ms = whole * 1000 + frac_ms;
	return 0;
}

int parse_timeout_ms(const char *s, uint32_t *ret_ms, const char **why)
{
	uint64_t ms;

	*why = parse_seconds_ms(s, &ms) < 0 ? "is not a number of seconds"
	       : ms == 0		    ? "must be positive (as torchrun's timeouts)"
	       : ms > UINT32_MAX	    ? "is too long"
					    : NULL;
	if (*why)
		return CRUN_EINVAL;
	*ret_ms = (uint32_t)ms;
	return 0;
}

int parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = {"1", "true", "t", "yes", "y"};
	static const char *const no[] = {"0", "false", "f", "no", "n"};

	if (!s)
		return CRUN_EINVAL;
	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		if (!strcasecmp(s, yes[i])) {
			*ret = true;
			return 0;
		}
		if (!strcasecmp(s, no[i])) {
			*ret = false;
			return 0;
		}
	}
	return CRUN_EINVAL;
}

int parse_host_port(const char *s, uint16_t default_port, char *host_buf, size_t host_cap,
		    uint16_t *ret_port)
{
	const char *host = s, *port_s = NULL;
	size_t host_len;
	uint64_t port = default_port;

	if (!s || !*s)
		return CRUN_EINVAL;
	if (s[0] == '[') {
		const char *close = strchr(s, ']');

		if (!close)
			return CRUN_EINVAL;
		host = s + 1;
		host_len = (size_t)(close - host);
		if (close[1] == ':')
			port_s = close + 2;
		else if (close[1])
			return CRUN_EINVAL;
	} else {
		const char *colon = strrchr(s, ':');

		/* More than one colon without brackets: a bare IPv6 address. */
		if (colon && strchr(s, ':') == colon) {
			host_len = (size_t)(colon - s);
			port_s = colon + 1;
		} else {
			host_len = strlen(s);
		}
	}
	if (host_len == 0 || host_len >= host_cap)
		return host_len ? CRUN_ETOOBIG : CRUN_EINVAL;
	if (port_s && parse_uint_range(port_s, 0, 65535, &port) < 0)
		return CRUN_EINVAL;
	memcpy(host_buf, host, host_len);
	host_buf[host_len] = '\0';
	*ret_port = (uint16_t)port;
	return 0;
}

uint64_t clock_now_ms(void)
{
	return clock_now_us() / 1000;
}

uint64_t clock_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

double clock_wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timespec clock_monotonic_in(uint32_t timeout_ms)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	return ts;
}

int clock_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t attr;
	int r;

	r = pthread_condattr_init(&attr);
	if (r)
		return -r;
	r = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	if (!r)
		r = pthread_cond_init(cv, &attr);
	pthread_condattr_destroy(&attr);
	return -r;
}

int fd_set_nonblock(int fd, bool on)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0)
		return -errno;
	fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
	if (fcntl(fd, F_SETFL, fl) < 0)
		return -errno;
	return 0;
}

int fd_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

void fd_close(int fd)
{
	int saved = errno;

	if (fd >= 0)
		(void)close(fd);
	errno = saved;
}

int str_printf(char *buf, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, cap, fmt, ap);
	va_end(ap);
	if (n < 0)
		return CRUN_EINVAL;
	if ((size_t)n >= cap)
		return CRUN_ETOOBIG;
	return n;
}

char *str_dup(const char *s)
{
	return s ? mem_dup(s, strlen(s) + 1) : NULL;
}

void *mem_dup(const void *p, size_t len)
{
	void *d = malloc(len ? len : 1);

	if (d && len)
		memcpy(d, p, len);
	return d;
}

int fd_wait_until(int fd, short events, uint64_t deadline_ms)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		uint64_t now = clock_now_ms();
		int n;

		if (now >= deadline_ms)
			return CRUN_ETIMEDOUT;
		n = poll(&p, 1, deadline_ms - now > INT_MAX ? INT_MAX : (int)(deadline_ms - now));
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}

int tcp_probe(const char *host, uint16_t port, uint32_t timeout_ms, char *buf, size_t cap)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
	struct addrinfo *ai = NULL;
	char service[8];
	int fd, r = CRUN_ERESOLVE;

	snprintf(service, sizeof(service), "%u", port);
	if (getaddrinfo(host, service, &hints, &ai) != 0 || !ai)
		return CRUN_ERESOLVE;
	if (buf && getnameinfo(ai->ai_addr, ai->ai_addrlen, buf, (socklen_t)cap, NULL, 0,
			       NI_NUMERICHOST) != 0)
		goto out;
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	r = fd < 0 ? -errno : 0;
	if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		r = errno == EINPROGRESS ? fd_wait_until(fd, POLLOUT, clock_now_ms() + timeout_ms)
					 : -errno;
		if (r == 0) {
			int e = 0;
			socklen_t len = sizeof(e);

			r = getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0 ? -errno : -e;
		}
	}
	fd_close(fd);
out:
	freeaddrinfo(ai);
	return r;
}
