/* embed_crun: `crun` with the agent embedded the way a scheduler embeds it.
 * It is cmd/crun.c compiled again (the same command-line parse, the same
 * exit codes and messages) with the agent run through the public API's poll
 * mode in a poll() loop of its own, the workers started by a spawn hook
 * (posix_spawn, a new session each), blocking rendezvous calls on threads
 * this program starts, and the signals crun would forward read from a
 * signalfd and passed on with crun_agent_stop(). test_launcher.py runs every
 * launcher scenario through it as well as through crun.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "crun/agent.h"

static sigset_t embed_saved_mask; /* the program's mask before the loop */

/* The scheduler's own way of starting a worker. */
static int embed_spawn(const crun_agent_spawn_req_t *req, void *arg, int *ret_pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t def;
	pid_t pid;
	int err;

	(void)arg;
	posix_spawn_file_actions_init(&fa);
	posix_spawnattr_init(&at);
	/* dup2 onto itself clears close-on-exec: the caller's own stdout. */
	posix_spawn_file_actions_adddup2(&fa, req->stdout_fd, STDOUT_FILENO);
	posix_spawn_file_actions_adddup2(&fa, req->stderr_fd, STDERR_FILENO);
	sigfillset(&def);
	sigdelset(&def, SIGKILL);
	sigdelset(&def, SIGSTOP);
	posix_spawnattr_setsigdefault(&at, &def);
	posix_spawnattr_setsigmask(&at, &embed_saved_mask);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
					  POSIX_SPAWN_SETSIGMASK);
	err = posix_spawn(&pid, req->path, &fa, &at, req->argv, req->envp);
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	if (err)
		return -err; /* exec failed: the agent reports 127 with this errno */
	*ret_pid = (int)pid;
	return 0;
}

struct embed_job {
	void (*fn)(void *job);
	void *job;
};

static void *embed_thread(void *arg)
{
	struct embed_job j = *(struct embed_job *)arg;

	free(arg);
	j.fn(j.job);
	return NULL;
}

/* The scheduler's thread for a blocking rendezvous call. */
static int embed_run_blocking(void (*fn)(void *job), void *job, void *arg)
{
	struct embed_job *j = malloc(sizeof(*j));
	sigset_t all, saved;
	pthread_attr_t at;
	pthread_t t;
	int err;

	(void)arg;
	if (!j)
		return CRUN_ENOMEM;
	*j = (struct embed_job){fn, job};
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	sigfillset(&all); /* signals stay with the loop thread */
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	err = pthread_create(&t, &at, embed_thread, j);
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	pthread_attr_destroy(&at);
	if (err) {
		free(j);
		return -err;
	}
	return 0;
}

static void embed_configure(crun_agent_config_t *cfg)
{
	cfg->spawn = embed_spawn;
	cfg->run_blocking = embed_run_blocking;
}

/* crun's signals_to_handle, read from a signalfd and handed to the agent. */
static int embed_run(crun_agent_t *agent, const crun_agent_config_t *cfg, int *ret_code)
{
	uint64_t m = cfg->signals_to_handle;
	int done = 0, r, sfd;
	sigset_t set;

	if (!m)
		m = 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
	sigemptyset(&set);
	for (int s = 1; s < 64; s++)
		if (m & (1ull << s))
			sigaddset(&set, s);
	pthread_sigmask(SIG_BLOCK, &set, &embed_saved_mask);
	sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		return -errno;
	r = crun_agent_start(agent);
	while (r == 0 && !done) {
		struct pollfd p[2] = {{crun_agent_fd(agent), POLLIN, 0}, {sfd, POLLIN, 0}};
		struct signalfd_siginfo si;

		if (poll(p, 2, crun_agent_next_timeout_ms(agent)) < 0 && errno != EINTR) {
			r = -errno;
			break;
		}
		while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			(void)crun_agent_stop(agent, (int)si.ssi_signo);
		r = crun_agent_dispatch(agent, &done, ret_code);
	}
	close(sfd);
	return r;
}

#define CRUN_CONFIGURE_AGENT(cfg)	 embed_configure(cfg)
#define CRUN_RUN_AGENT(agent, cfg, code) embed_run((agent), (cfg), (code))
#include "../../cmd/crun.c"
