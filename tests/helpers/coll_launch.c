/* coll_launch.c: the collective tests' launcher: starts N ranks of a worker
 * program with the torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*) by fork/exec,
 * waits for all of them under a deadline and kills the lot on expiry. With
 * --agent-store it hosts a crun store server itself (a thread running its
 * own libevent loop) and the ranks connect as clients, as under an agent;
 * without it rank 0 hosts the store, as in PyTorch's non-agent mode.
 *
 *   coll_launch -n N [--agent-store | --store-port P] [--timeout S] [--env K=V]...
 *               -- PROG ARGS
 *
 * --store-port P: the ranks are clients (agent mode) of a store someone else
 * runs on MASTER_ADDR:P (a PyTorch TCPStore, crun-rdzvd, ...).
 * --world W --rank-base B --master-addr A: this launcher is one "node" that
 * starts ranks B..B+N-1 of W, with the store at A (bound there when hosted;
 * it prints "coll_launch: store on A:PORT"); used with network namespaces.
 * --master-port P: MASTER_PORT for the non-agent mode (rank 0 hosts there).
 *
 * Prints "coll_launch: rank R exit CODE" per rank; exits 0 when all exited
 * 0, 1 when one did not, 124 on the deadline.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <event2/event.h>

#include "common/common.h"
#include "store/server.h"

extern char **environ;

#define MAX_RANKS 64
#define MAX_ENV	  32

static struct event_base *srv_base;

static void *srv_main(void *arg)
{
	(void)arg;
	(void)event_base_loop(srv_base, EVLOOP_NO_EXIT_ON_EMPTY);
	return NULL;
}

static int pick_port(void)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sin, &sl) == 0)
		port = ntohs(sin.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* envp for one rank: the parent's, minus what we set, plus ours. Built
 * before fork: nothing but exec runs in the child. */
/* A slice [base, base + n) of a world of `world` ranks, as one node. */
static const char *master = "127.0.0.1";
static int world, base, fixed_port;

static char **make_env(int rank, int n, int port, int agent, char **extra, int nextra)
{
	static const char *const ours[] = {"RANK=",
					   "WORLD_SIZE=",
					   "LOCAL_RANK=",
					   "LOCAL_WORLD_SIZE=",
					   "MASTER_ADDR=",
					   "MASTER_PORT=",
					   "TORCHELASTIC_RESTART_COUNT=",
					   "TORCHELASTIC_USE_AGENT_STORE=",
					   "GROUP_RANK="};
	size_t ne = 0, k = 0;
	char **env;

	while (environ[ne])
		ne++;
	env = calloc(ne + ARRAY_SIZE(ours) + (size_t)nextra + 1, sizeof(char *));
	if (!env)
		exit(2);
	for (size_t i = 0; i < ne; i++) {
		int skip = 0;

		for (size_t j = 0; j < ARRAY_SIZE(ours); j++)
			skip |= !strncmp(environ[i], ours[j], strlen(ours[j]));
		if (!skip)
			env[k++] = environ[i];
	}
	if (asprintf(&env[k++], "RANK=%d", base + rank) < 0 ||
	    asprintf(&env[k++], "WORLD_SIZE=%d", world ? world : n) < 0 ||
	    asprintf(&env[k++], "LOCAL_RANK=%d", rank) < 0 ||
	    asprintf(&env[k++], "LOCAL_WORLD_SIZE=%d", n) < 0 ||
	    asprintf(&env[k++], "MASTER_ADDR=%s", master) < 0 ||
	    asprintf(&env[k++], "MASTER_PORT=%d", port) < 0 ||
	    asprintf(&env[k++], "TORCHELASTIC_RESTART_COUNT=0") < 0 ||
	    asprintf(&env[k++], "GROUP_RANK=0") < 0 ||
	    asprintf(&env[k++], "TORCHELASTIC_USE_AGENT_STORE=%s", agent ? "True" : "False") < 0)
		exit(2);
	for (int i = 0; i < nextra; i++)
		env[k++] = extra[i];
	return env;
}

/* The nine variables make_env() allocated sit just before the extras. */
static void free_env(char **env, int nextra)
{
	size_t k = 0;

	while (env[k])
		k++;
	for (size_t i = k - (size_t)nextra - 9; i < k - (size_t)nextra; i++)
		free(env[i]);
	free(env);
}

int main(int argc, char **argv)
{
	int n = 2, agent = 0, store_port = 0, timeout_s = 120, nextra = 0, port, argi = 1,
	    failed = 0, left;
	char *extra[MAX_ENV];
	pid_t pids[MAX_RANKS];
	int codes[MAX_RANKS];
	struct store_server *srv = NULL;
	pthread_t th;
	uint64_t deadline;

	for (; argi < argc && strcmp(argv[argi], "--"); argi++) {
		uint64_t v;

		if (!strcmp(argv[argi], "-n") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 1, MAX_RANKS, &v) < 0)
				return 2;
			n = (int)v;
		} else if (!strcmp(argv[argi], "--timeout") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 1, 3600, &v) < 0)
				return 2;
			timeout_s = (int)v;
		} else if (!strcmp(argv[argi], "--agent-store")) {
			agent = 1;
		} else if (!strcmp(argv[argi], "--world") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 1, 4096, &v) < 0)
				return 2;
			world = (int)v;
		} else if (!strcmp(argv[argi], "--rank-base") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 0, 4095, &v) < 0)
				return 2;
			base = (int)v;
		} else if (!strcmp(argv[argi], "--master-port") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 1, 65535, &v) < 0)
				return 2;
			fixed_port = (int)v; /* rank 0 hosts the store there */
		} else if (!strcmp(argv[argi], "--master-addr") && argi + 1 < argc) {
			master = argv[++argi];
		} else if (!strcmp(argv[argi], "--store-port") && argi + 1 < argc) {
			if (parse_uint_range(argv[++argi], 1, 65535, &v) < 0)
				return 2;
			store_port = (int)v; /* someone else's store: agent mode */
		} else if (!strcmp(argv[argi], "--env") && argi + 1 < argc && nextra < MAX_ENV) {
			extra[nextra++] = argv[++argi];
		} else {
			fprintf(
			    stderr,
			    "usage: coll_launch -n N [--agent-store | --store-port P] [--world W] "
			    "[--rank-base B] [--master-addr A] [--master-port P] "
			    "[--timeout S] "
			    "[--env K=V]... -- PROG ARGS\n");
			return 2;
		}
	}
	if (argi + 1 >= argc)
		return 2;
	argi++;
	port = fixed_port ? fixed_port : pick_port();
	if (agent && !store_port) {
		struct store_server_config cfg = STORE_SERVER_CONFIG_DEFAULT;

		cfg.host = master;
		cfg.port = 0;
		srv_base = event_base_new();
		if (!srv_base || store_server_new(srv_base, &cfg, &srv) < 0) {
			fprintf(stderr, "coll_launch: cannot start the store server\n");
			return 2;
		}
		port = store_server_port(srv);
		if (pthread_create(&th, NULL, srv_main, NULL))
			return 2;
		printf("coll_launch: store on %s:%d\n", master, port);
		fflush(stdout);
	}
	if (store_port) {
		agent = 1;
		port = store_port;
	}
	if (port <= 0)
		return 2;
	for (int r = 0; r < n; r++) {
		char **env = make_env(r, n, port, agent, extra, nextra);
		pid_t pid = fork();

		if (pid < 0) {
			perror("fork");
			free_env(env, nextra);
			failed = 1;
			n = r;
			break;
		}
		if (pid == 0) {
			/* Die with the launcher, so a killed test leaves no rank. */
			(void)prctl(PR_SET_PDEATHSIG, SIGKILL);
			execve(argv[argi], &argv[argi], env);
			_exit(127);
		}
		pids[r] = pid;
		codes[r] = -1;
		free_env(env, nextra);
	}
	deadline = clock_now_ms() + (uint64_t)timeout_s * 1000;
	for (left = n; left > 0;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);

		if (pid > 0) {
			for (int r = 0; r < n; r++)
				if (pids[r] == pid) {
					codes[r] = WIFEXITED(status) ? WEXITSTATUS(status)
								     : 128 + WTERMSIG(status);
					left--;
				}
			continue;
		}
		if (clock_now_ms() >= deadline) {
			fprintf(stderr, "coll_launch: deadline of %d s passed, killing\n",
				timeout_s);
			for (int r = 0; r < n; r++)
				if (codes[r] < 0)
					(void)kill(pids[r], SIGKILL);
			while (waitpid(-1, NULL, 0) > 0)
				;
			return 124;
		}
		usleep(5000);
	}
	for (int r = 0; r < n; r++) {
		printf("coll_launch: rank %d exit %d\n", base + r, codes[r]);
		failed |= codes[r] != 0;
	}
	(void)srv; /* the server dies with the process */
	return failed ? 1 : 0;
}
