/* embed_scheduler.c: a tiny job scheduler that embeds libcrun. It runs a
 * two-node job as two agents in this one process (a static rendezvous on
 * loopback: node 0 serves the store), drives both from its own poll() loop
 * (crun_agent_fd / crun_agent_next_timeout_ms / crun_agent_dispatch), starts
 * every worker itself through the spawn hook (posix_spawn in a session of
 * its own, where a real scheduler would pick a cgroup or a container), runs
 * the rendezvous' blocking store calls on threads it starts, turns SIGINT and
 * SIGTERM into crun_agent_stop(), and prints every event.
 *
 *   embed_scheduler [-n NPROC] [-p PORT] [-- PROGRAM ARGS...]
 *
 * Without a program each worker prints its rank. Exits 0 when both nodes
 * succeeded, else 1. Build: cc embed_scheduler.c $(pkg-config --cflags --libs crun)
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <crun/agent.h>

#define NODES 2

static const char *const state_names[] = {"rendezvous", "running", "stopping", "barrier", "done"};
static sigset_t worker_mask; /* the mask workers start with */

/* Every event of one node, on this thread, from inside crun_agent_dispatch. */
static void on_event(const crun_agent_event_t *ev, void *arg)
{
	int node = (int)(long)arg;

	switch (ev->type) {
	case CRUN_AGENT_EV_STATE:
		printf("node%d: state %s (restart %d)\n", node, state_names[ev->state],
		       ev->restart_count);
		break;
	case CRUN_AGENT_EV_RENDEZVOUS:
		printf("node%d: rendezvous: group_rank %d of %d, ranks %d-%d of world %d, "
		       "attempt %d, master %s:%u\n",
		       node, ev->group_rank, ev->group_world_size, ev->base_rank,
		       ev->base_rank + ev->local_world_size - 1, ev->world_size, ev->attempt,
		       ev->master_addr, ev->master_port);
		break;
	case CRUN_AGENT_EV_WORKER_START:
		printf("node%d: worker start: pid %d, local rank %d, rank %d\n", node, ev->pid,
		       ev->local_rank, ev->global_rank);
		break;
	case CRUN_AGENT_EV_WORKER_EXIT:
		printf("node%d: worker exit: pid %d, rank %d, exit code %d, signal %d\n", node,
		       ev->pid, ev->global_rank, ev->exit_code, ev->term_sig);
		break;
	}
	fflush(stdout);
}

/* The scheduler's way to start a worker: crun computed argv and envp. */
static int spawn_worker(const crun_agent_spawn_req_t *req, void *arg, int *ret_pid)
{
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t dfl;
	pid_t pid;
	int err;

	(void)arg;
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, req->stdout_fd, STDOUT_FILENO);
	posix_spawn_file_actions_adddup2(&fa, req->stderr_fd, STDERR_FILENO);
	posix_spawnattr_init(&at);
	sigfillset(&dfl);
	posix_spawnattr_setsigdefault(&at, &dfl);
	posix_spawnattr_setsigmask(&at, &worker_mask);
	/* Its own session: crun signals the whole group on stop. */
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF |
					  POSIX_SPAWN_SETSIGMASK);
	err = posix_spawn(&pid, req->path, &fa, &at, req->argv, req->envp);
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	if (err)
		return -err;
	*ret_pid = pid;
	return 0;
}

struct job {
	void (*fn)(void *job);
	void *arg;
};

static void *job_thread(void *p)
{
	struct job j = *(struct job *)p;

	free(p);
	j.fn(j.arg);
	return NULL;
}

/* The scheduler's thread for a blocking rendezvous call (a pool would do). */
static int run_blocking(void (*fn)(void *job), void *job, void *arg)
{
	struct job *j = malloc(sizeof(*j));
	pthread_attr_t at;
	pthread_t t;
	int err;

	(void)arg;
	if (!j)
		return -ENOMEM;
	j->fn = fn;
	j->arg = job;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	err = pthread_create(&t, &at, job_thread, j); /* inherits the blocked signals */
	pthread_attr_destroy(&at);
	if (err)
		free(j);
	return -err;
}

static int free_port(void)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, len) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
		port = ntohs(sa.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* One node's agent, configured by option names as on crun's command line. */
static int new_agent(int node, const char *nproc, const char *port, const char *const *argv,
		     crun_agent_t **ret)
{
	crun_agent_config_t cfg = CRUN_AGENT_CONFIG_INIT;
	char rank[8];
	int r;

	snprintf(rank, sizeof(rank), "%d", node);
	if ((r = crun_agent_config_set(&cfg, "nnodes", "2")) < 0 ||
	    (r = crun_agent_config_set(&cfg, "node_rank", rank)) < 0 ||
	    (r = crun_agent_config_set(&cfg, "master_addr", "127.0.0.1")) < 0 ||
	    (r = crun_agent_config_set(&cfg, "master_port", port)) < 0 ||
	    (r = crun_agent_config_set(&cfg, "nproc_per_node", nproc)) < 0 ||
	    (r = crun_agent_config_set(&cfg, "rdzv_id", "embed-demo")) < 0 ||
	    (r = crun_agent_config_set(&cfg, "tee", "3")) < 0 ||
	    (r = crun_agent_config_set(&cfg, "log_line_prefix_template",
				       "[node${group_rank} rank${rank}]:")) < 0) {
		fprintf(stderr, "embed_scheduler: %s\n", crun_agent_config_last_error(&cfg));
		crun_agent_config_release(&cfg);
		return r;
	}
	cfg.argv = argv;
	cfg.on_event = on_event;
	cfg.on_event_arg = (void *)(long)node;
	cfg.spawn = spawn_worker;
	cfg.run_blocking = run_blocking;
	r = crun_agent_new(&cfg, ret);
	crun_agent_config_release(&cfg); /* the agent copied what it keeps */
	if (r == 0)
		r = crun_agent_start(*ret);
	if (r < 0)
		fprintf(stderr, "embed_scheduler: node%d: %s\n", node, crun_strerror(r));
	return r;
}

/* The scheduler's loop: both agents and the signals, one poll(). */
static int run_loop(crun_agent_t **agents, int sfd)
{
	int done[NODES] = {0}, codes[NODES] = {1, 1}, left = NODES, worst = 0;

	while (left > 0) {
		struct pollfd p[NODES + 1];
		struct signalfd_siginfo si;
		int timeout = -1;

		for (int i = 0; i < NODES; i++) {
			int t = done[i] ? -1 : crun_agent_next_timeout_ms(agents[i]);

			p[i] = (struct pollfd){.fd = crun_agent_fd(agents[i]), .events = POLLIN};
			if (t >= 0 && (timeout < 0 || t < timeout))
				timeout = t;
		}
		p[NODES] = (struct pollfd){.fd = sfd, .events = POLLIN};
		if (poll(p, NODES + 1, timeout) < 0 && errno != EINTR)
			return 1;
		while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
			for (int i = 0; i < NODES; i++)
				(void)crun_agent_stop(agents[i], (int)si.ssi_signo);
		for (int i = 0; i < NODES; i++) {
			if (done[i])
				continue;
			if (crun_agent_dispatch(agents[i], &done[i], &codes[i]) < 0)
				codes[i] = 1;
			if (done[i]) {
				printf("node%d: done, exit code %d\n", i, codes[i]);
				left--;
			}
		}
	}
	for (int i = 0; i < NODES; i++)
		worst = codes[i] > worst ? codes[i] : worst;
	return worst;
}

int main(int argc, char **argv)
{
	static const char *const demo[] = {
	    "/bin/sh", "-c", "echo \"hello from rank $RANK of $WORLD_SIZE (local $LOCAL_RANK)\"",
	    NULL};
	const char *const *prog = demo;
	const char *nproc = "2";
	crun_agent_t *agents[NODES] = {NULL, NULL};
	char port[16];
	sigset_t stop;
	int code = 1, sfd, opt;

	snprintf(port, sizeof(port), "%d", free_port());
	while ((opt = getopt(argc, argv, "n:p:")) != -1) {
		if (opt == 'n')
			nproc = optarg;
		else if (opt == 'p')
			snprintf(port, sizeof(port), "%s", optarg);
		else
			return 2;
	}
	if (optind < argc)
		prog = (const char *const *)argv + optind;
	/* SIGINT and SIGTERM become crun_agent_stop(); threads started from
	 * here on inherit the block, so only the signalfd sees them. */
	sigemptyset(&stop);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &stop, &worker_mask);
	sfd = signalfd(-1, &stop, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		return 1;
	if (new_agent(0, nproc, port, prog, &agents[0]) == 0 &&
	    new_agent(1, nproc, port, prog, &agents[1]) == 0)
		code = run_loop(agents, sfd);
	for (int i = 0; i < NODES; i++)
		crun_agent_free(agents[i]); /* a started agent not done: workers killed */
	close(sfd);
	printf("job exit code %d\n", code);
	return code;
}
