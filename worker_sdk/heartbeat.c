/* heartbeat.c: crun_heartbeat(), the worker's half of the agent's
 * --worker_heartbeat_timeout: the agent watches the mtime of one file per
 * worker ($CRUN_HEARTBEAT_FILE) and restarts a job whose worker stops
 * touching it. A file rather than a socket so that any language (Python:
 * os.utime) can beat without crun's library, and so that a beat costs one
 * system call and never blocks on the agent.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker_sdk/worker.h"
#include "common/common.h"

CRUN_API int crun_heartbeat(void)
{
	const char *path = getenv("CRUN_HEARTBEAT_FILE");
	int fd;

	if (!path || !*path)
		return 0;
	if (utimensat(AT_FDCWD, path, NULL, 0) == 0)
		return 0;
	if (errno != ENOENT)
		return -errno;
	/* The agent normally creates it; a worker may beat first. */
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	fd_close(fd);
	return 0;
}
