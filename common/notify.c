/* notify.c: systemd's service notification protocol without libsystemd
 * (sd_notify(3) and the "notify socket" documentation): each message is one
 * AF_UNIX datagram of newline-separated VAR=VALUE lines sent to the path in
 * $NOTIFY_SOCKET ('@' starts an abstract name). Also the watchdog interval
 * from $WATCHDOG_USEC/$WATCHDOG_PID. Nothing here keeps global state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"

struct notify {
	int fd;
	struct sockaddr_un addr;
	socklen_t addr_len;
};

int notify_open(const char *path, struct notify **ret)
{
	struct notify *n;
	size_t len;

	if (!path || !*path) {
		*ret = NULL; /* not under a service manager: every send is a no-op */
		return 0;
	}
	len = strlen(path);
	if ((path[0] != '/' && path[0] != '@') || len >= sizeof(n->addr.sun_path))
		return CRUN_EINVAL;
	n = calloc(1, sizeof(*n));
	if (!n)
		return CRUN_ENOMEM;
	n->addr.sun_family = AF_UNIX;
	memcpy(n->addr.sun_path, path, len);
	if (path[0] == '@')
		n->addr.sun_path[0] = '\0'; /* abstract namespace: no trailing NUL counted */
	n->addr_len =
	    (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (path[0] == '@' ? 0 : 1));
	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (n->fd < 0) {
		int r = -errno;

		free(n);
		return r;
	}
	*ret = n;
	return 0;
}

int notify_send(struct notify *n, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	int len;

	if (!n)
		return 0;
	va_start(ap, fmt);
	len = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (len < 0)
		return CRUN_EINVAL;
	if ((size_t)len >= sizeof(msg))
		len = (int)sizeof(msg) - 1; /* a STATUS= text cut short is still useful */
	/* A full or vanished socket must never stall the agent's loop: the
	 * socket is nonblocking and a failed datagram is dropped. */
	if (sendto(n->fd, msg, (size_t)len, MSG_NOSIGNAL, (struct sockaddr *)&n->addr,
		   n->addr_len) < 0)
		return -errno;
	return 0;
}

uint64_t notify_watchdog_ms(const char *usec, const char *pid)
{
	uint64_t us, p;

	if (!usec || parse_u64(usec, &us) < 0 || us == 0)
		return 0;
	/* WATCHDOG_PID names the process the manager expects pings from. */
	if (pid && (parse_u64(pid, &p) < 0 || p != (uint64_t)getpid()))
		return 0;
	/* sd_watchdog_enabled(3): ping at half the interval. */
	return MAX(us / 2000, 1);
}

void notify_close(struct notify *n)
{
	if (!n)
		return;
	fd_close(n->fd);
	free(n);
}
