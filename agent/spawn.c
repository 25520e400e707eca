/* spawn.c: fork/exec of one worker, following STYLE §6.2: everything is built
 * before the fork, every signal is blocked across it, and the child runs only
 * async-signal-safe calls until execve. Errors in the child come back through
 * a close-on-exec pipe as an errno; EOF on that pipe means the exec worked.
 * The worker leads a new session (torchrun's start_new_session=True): a
 * worker reading the terminal is never stopped by SIGTTIN, and kill(-pid)
 * still reaches its whole group. The worker table (workers_*) is here too.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/workers.h"
#include "common/common.h"

/* Child side: send errno through the status pipe and die. A 4-byte pipe
 * write is atomic; on a successful exec the pipe simply closes. */
static _Noreturn void child_fail(int status_fd, int err)
{
	ssize_t n = write(status_fd, &err, sizeof(err));

	(void)n;
	_exit(127);
}

int spawn_worker(const struct spawn_req *req, const sigset_t *orig_mask, pid_t *ret_pid)
{
	sigset_t all, saved;
	int status_pipe[2];
	pid_t parent = getpid();
	pid_t pid;
	int child_err = 0;
	ssize_t n;

	if (pipe2(status_pipe, O_CLOEXEC) < 0)
		return -errno;

	/* None of our handlers may run in the child before exec: libevent's
	 * would write into the agent's own signal socketpair. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	pid = fork();
	if (pid == 0) {
		int fd = status_pipe[1];

		if (setsid() < 0)
			child_fail(fd, errno);
		if (prctl(PR_SET_PDEATHSIG, req->deathsig) < 0)
			child_fail(fd, errno);
		if (getppid() != parent) /* agent died before prctl() */
			_exit(127);
		for (int s = 1; s < 32; s++) /* leave glibc's RT signals alone */
			if (s != SIGKILL && s != SIGSTOP)
				signal(s, SIG_DFL);
		if (sigprocmask(SIG_SETMASK, orig_mask, NULL) < 0)
			child_fail(fd, errno);
		/* The agent's raised fd limit is its own: workers get the one
		 * crun was started with, as under torchrun. */
		if (req->nofile && setrlimit(RLIMIT_NOFILE, req->nofile) < 0)
			child_fail(fd, errno);
		if (req->cpus && sched_setaffinity(0, sizeof(*req->cpus), req->cpus) < 0)
			child_fail(fd, errno);
		/* dup2 onto itself keeps the fd (the caller's own stdout). */
		if (dup2(req->stdout_fd, STDOUT_FILENO) < 0 ||
		    dup2(req->stderr_fd, STDERR_FILENO) < 0)
			child_fail(fd, errno);
		execve(req->path, req->argv, req->envp);
		child_fail(fd, errno);
	}
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	close(status_pipe[1]);
	if (pid < 0) {
		int r = -errno;

		close(status_pipe[0]);
		return r;
	}

	do
		n = read(status_pipe[0], &child_err, sizeof(child_err));
	while (n < 0 && errno == EINTR);
	close(status_pipe[0]);

	if (n == (ssize_t)sizeof(child_err)) { /* setup or exec failed */
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		return -child_err;
	}
	*ret_pid = pid; /* EOF: exec succeeded, so setsid() has run too */
	return 0;
}

static bool is_exec_file(const char *p)
{
	struct stat st;

	return stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0;
}

char *spawn_resolve(const char *name)
{
	const char *path = getenv("PATH");
	const char *p;
	int err = ENOENT;

	if (!name || !*name) {
		errno = ENOENT;
		return NULL;
	}
	if (strchr(name, '/')) {
		if (access(name, F_OK) < 0)
			return NULL;
		return str_dup(name);
	}
	if (!path)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (p = path;;) {
		const char *end = strchr(p, ':');
		size_t dlen = end ? (size_t)(end - p) : strlen(p);
		char buf[PATH_MAX];

		if (dlen == 0 ? str_printf(buf, sizeof(buf), "./%s", name) >= 0
			      : str_printf(buf, sizeof(buf), "%.*s/%s", (int)dlen, p, name) >= 0) {
			if (is_exec_file(buf))
				return str_dup(buf);
			if (access(buf, F_OK) == 0)
				err = EACCES;
		}
		if (!end)
			break;
		p = end + 1;
	}
	errno = err;
	return NULL;
}

/* ---- the worker table -------------------------------------------------------- */

int workers_init(struct agent_workers *wk, int n)
{
	struct worker *w = calloc((size_t)n, sizeof(*w));

	if (!w)
		return CRUN_ENOMEM;
	for (int i = 0; i < n; i++)
		w[i].pidfd = -1;
	wk->workers = w;
	wk->nworkers = n;
	return 0;
}

void workers_release(struct agent_workers *wk)
{
	free(wk->workers);
	wk->workers = NULL;
	wk->nworkers = 0;
}

int workers_running(const struct agent_workers *wk)
{
	int n = 0;

	for (int i = 0; i < wk->nworkers; i++)
		n += wk->workers[i].state == W_RUNNING;
	return n;
}
