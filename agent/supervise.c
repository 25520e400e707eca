/* supervise.c: process supervision (STYLE §6). Signals are loop events; one
 * reap path (peek with WNOWAIT, kill what is left of a failed worker's group
 * while the zombie still pins its pgid, then reap); stopping with a grace timer.
 * Only the agent's own children are waited for, each by pid (waitid(P_PID)):
 * a host that embeds the agent keeps the exit status of children it forked.
 * Whether the process adopts orphans (subreaper) and how it treats SIGPIPE
 * are the program's choices (cmd/crun.c), not the library's.
 *
 * Poll mode (crun_agent_start) takes no signal at all: the embedding host
 * owns them. A worker's exit is then seen through its pidfd (readable when
 * it exits), and the same reap path runs.
 *
 * The guard: PR_SET_PDEATHSIG kills a worker when the agent dies, but not the
 * worker's own children. So at start-up the agent forks a tiny guard process
 * that reads "+pgid"/"-pgid" records from a pipe; when the agent dies (even by
 * SIGKILL) the pipe reaches EOF and the guard SIGKILLs every group still
 * registered. A group is unregistered before its leader is reaped, while the
 * zombie still pins the pgid, so the guard can never hit a reused id. The
 * guard leads its own session, so `kill -9 -PGID` of crun's group does not
 * take it along; it holds no fd but its channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <event2/event.h>

#include "agent/agent.h"
#include "common/common.h"
#include "agent/outputs.h"

#define GUARD_MAX 4096

static void note_exit(struct crun_agent *a, struct worker *w, int status)
{
	w->state = W_EXITED;
	w->stopped = false;
	w->exit_time = clock_wall_s();
	if (WIFSIGNALED(status)) {
		w->term_sig = WTERMSIG(status);
		w->exit_code = 128 + w->term_sig;
	} else {
		w->exit_code = WEXITSTATUS(status);
	}
	outputs_drain_worker(a->out, w->local_rank);
	log_at(LL_INFO, SUB_AGENT, "worker %d (pid %d) exited with %d", w->local_rank, (int)w->pid,
	       w->exit_code);
	agent_emit_worker(a, w, true);
}

/* Job control of a live worker: a stop holds the whole job, so say so. */
static void note_stop(struct worker *w, const siginfo_t *si)
{
	if (si->si_code == CLD_STOPPED || si->si_code == CLD_TRAPPED) {
		w->stopped = true;
		log_at(LL_WARN, SUB_AGENT,
		       "worker %d (pid %d) is stopped by %s; the job waits until it is continued",
		       w->local_rank, (int)w->pid, supervise_signame(si->si_status));
	} else if (si->si_code == CLD_CONTINUED) {
		w->stopped = false;
		log_at(LL_NOTICE, SUB_AGENT, "worker %d (pid %d) continues", w->local_rank,
		       (int)w->pid);
	}
}

/* Collects a stop or continue notice of live worker w, if any. */
static void check_stopped(struct worker *w)
{
	siginfo_t si = {0};

	if (waitid(P_PID, (id_t)w->pid, &si, WSTOPPED | WCONTINUED | WNOHANG) == 0 &&
	    si.si_pid == w->pid)
		note_stop(w, &si);
}

/* Reaps worker w if it exited; true when it did. */
static bool reap_worker(struct crun_agent *a, struct worker *w)
{
	siginfo_t si = {0};
	int status;

	while (waitid(P_PID, (id_t)w->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0)
		if (errno != EINTR)
			return false;
	if (si.si_pid != w->pid) {
		check_stopped(w); /* alive */
		return false;
	}
	/* The unreaped zombie still pins its pid and pgid, so killing
	 * what is left of its group cannot hit an unrelated process. A
	 * worker that succeeded keeps its group running, as under torchrun
	 * (an upload, a notifier): crun, the subreaper, adopts it and
	 * stops it with the attempt or at the job's end (orphans.c). */
	if (w->own_group) {
		bool ok = si.si_code == CLD_EXITED && si.si_status == 0;

		orphans_log_group(a, w, ok);
		if (!ok)
			(void)kill(-w->pid, SIGKILL);
		supervise_guard_del(a, w->pid);
	}
	supervise_unwatch_pid(w);
	while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR)
		;
	note_exit(a, w, status);
	return true;
}

/* When this process adopts orphans (crun is a subreaper), the worker's
 * killed group members come back to us: reap them by group. Bounded. */
static void sweep_group(struct worker *w)
{
	for (int i = 0; i < 64; i++) {
		siginfo_t si = {0};

		if (waitid(P_PGID, (id_t)w->pid, &si, WEXITED | WNOHANG) < 0 || si.si_pid == 0)
			return;
		log_at(LL_DEBUG, SUB_AGENT, "reaped orphan %d of worker %d", (int)si.si_pid,
		       w->local_rank);
	}
}

void supervise_reap(struct crun_agent *a)
{
	bool any = false;

	for (int i = 0; i < a->wk.nworkers; i++) {
		struct worker *w = &a->wk.workers[i];

		if (w->state == W_RUNNING)
			any |= reap_worker(a, w);
		if (w->state == W_EXITED && w->pid > 0 && w->own_group && a->subreaper)
			sweep_group(w);
	}
	/* A worker that exited during a stop hands us its orphans: stop them
	 * too; an orphan's exit moves the stop on like a worker's. */
	if (any)
		orphans_rescan(a);
	any |= orphans_reap(a);
	if (a->wk.guard_pid > 0 && waitpid(a->wk.guard_pid, NULL, WNOHANG) == a->wk.guard_pid) {
		log_at(LL_WARN, SUB_AGENT, "the guard process exited");
		a->wk.guard_pid = 0;
		fd_close(a->wk.guard_fd);
		a->wk.guard_fd = -1;
	}
	if (any)
		agent_fire(a, AE_WORKER_EXIT);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct crun_agent *a = arg;

	(void)what;
	if (sig == SIGCHLD) {
		supervise_reap(a);
		return;
	}
	a->stop_signal = (int)sig;
	agent_fire(a, AE_TERM_SIGNAL);
}

static void on_stop_req(evutil_socket_t fd, short what, void *arg)
{
	struct crun_agent *a = arg;
	unsigned char b[16];
	ssize_t n = read(fd, b, sizeof(b));

	(void)what;
	if (n <= 0)
		return;
	a->stop_signal = b[n - 1];
	agent_fire(a, AE_TERM_SIGNAL);
}

static void on_grace(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	agent_fire(arg, AE_GRACE_EXPIRED);
}

void supervise_signal_workers(struct crun_agent *a, int sig)
{
	for (int i = 0; i < a->wk.nworkers; i++) {
		struct worker *w = &a->wk.workers[i];

		if (w->state != W_RUNNING)
			continue;
		/* Poll mode has no SIGCHLD to tell of a stop: ask now, so a
		 * stopped group is continued and sees the signal. */
		if (w->pidfd >= 0)
			check_stopped(w);
		w->stopping = true;
		if (sig == SIGKILL)
			w->sigkilled_by_us = true;
		pid_t target = w->own_group ? -w->pid : w->pid;

		if (kill(target, sig) < 0 && errno != ESRCH)
			log_at(LL_WARN, SUB_AGENT, "kill(%d, %d): %s", (int)target, sig,
			       strerror(errno));
		/* A stopped group would hold the signal until continued. */
		if (w->stopped && sig != SIGKILL)
			(void)kill(target, SIGCONT);
	}
}

void supervise_arm_grace(struct crun_agent *a)
{
	struct timeval tv = {.tv_sec = a->cfg.shutdown_timeout_ms / 1000,
			     .tv_usec = (a->cfg.shutdown_timeout_ms % 1000) * 1000};

	evtimer_add(a->grace_timer, &tv);
}

static void on_window(evutil_socket_t fd, short what, void *arg)
{
	struct crun_agent *a = arg;

	(void)fd;
	(void)what;
	a->window_over = true;
	agent_fire(a, AE_FAILURE_WINDOW);
}

void supervise_arm_window(struct crun_agent *a)
{
	struct timeval tv = {.tv_sec = a->cfg.monitor_interval_ms / 1000,
			     .tv_usec = (a->cfg.monitor_interval_ms % 1000) * 1000};

	if (a->window_armed)
		return;
	a->window_armed = true;
	evtimer_add(a->window_timer, &tv);
}

void supervise_disarm_window(struct crun_agent *a)
{
	if (a->window_timer)
		evtimer_del(a->window_timer);
	a->window_armed = a->window_over = false;
}

void supervise_disarm_grace(struct crun_agent *a)
{
	if (a->grace_timer)
		evtimer_del(a->grace_timer);
	orphans_stop_over(a);
}

/* ---- the guard process -------------------------------------------------------- */

struct guard_rec {
	char op; /* '+' or '-' */
	int32_t pgid;
};

static void guard_send(struct crun_agent *a, char op, pid_t pgid)
{
	struct guard_rec rec;
	ssize_t n;

	if (a->wk.guard_fd < 0)
		return;
	memset(&rec, 0, sizeof(rec)); /* no uninitialised padding on the wire */
	rec.op = op;
	rec.pgid = (int32_t)pgid;
	/* 8 bytes on a stream socket the guard drains at once. MSG_NOSIGNAL: a
	 * dead guard must not raise SIGPIPE in a host that did not ignore it. */
	do
		n = send(a->wk.guard_fd, &rec, sizeof(rec), MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
}

void supervise_guard_add(struct crun_agent *a, pid_t pgid)
{
	guard_send(a, '+', pgid);
}

void supervise_guard_del(struct crun_agent *a, pid_t pgid)
{
	guard_send(a, '-', pgid);
}

/* Runs in the forked guard; async-signal-safe calls only (the agent may have
 * threads). The table lives on this stack, allocated before nothing. */
static _Noreturn void guard_main(int rd)
{
	int32_t groups[GUARD_MAX];
	int n = 0;
	struct guard_rec rec;

	for (int s = 1; s < 32; s++)
		if (s != SIGKILL && s != SIGSTOP)
			signal(s, SIG_IGN); /* a terminal ^C must not take us down */
	for (;;) {
		ssize_t got = read(rd, &rec, sizeof(rec));

		if (got < 0 && errno == EINTR)
			continue;
		if (got != (ssize_t)sizeof(rec))
			break; /* EOF: the agent is gone */
		if (rec.op == '+' && n < GUARD_MAX) {
			groups[n++] = rec.pgid;
		} else if (rec.op == '-') {
			for (int i = 0; i < n; i++)
				if (groups[i] == rec.pgid) {
					groups[i] = groups[--n];
					break;
				}
		}
	}
	for (int i = 0; i < n; i++)
		if (groups[i] > 1)
			kill(-groups[i], SIGKILL);
	_exit(0);
}

/* Child side: every fd above 2 but `keep` closed, whatever the limit. */
static void close_all_but(int keep)
{
	struct rlimit rl;

	if (keep != 3) {
		if (dup2(keep, 3) < 0)
			_exit(127);
		keep = 3;
	}
	if (syscall(SYS_close_range, 4u, ~0u, 0u) == 0)
		return;
	/* Before Linux 5.9: every fd up to the hard limit (the soft one may
	 * have been lowered after fds above it were opened). */
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_max == RLIM_INFINITY ||
	    rl.rlim_max > (1u << 20))
		rl.rlim_max = 1u << 20;
	for (rlim_t fd = 4; fd < rl.rlim_max; fd++)
		close((int)fd);
}

static int start_guard(struct crun_agent *a)
{
	sigset_t all, saved;
	int p[2];
	pid_t pid;

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) < 0)
		return -errno;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &saved);
	pid = fork();
	if (pid == 0) {
		/* Its own session: a signal to crun's process group (kill -9
		 * -PGID, a terminal's ^C) never reaches it. */
		(void)setsid();
		/* No sockets, worker files or the host's fds held open. */
		close_all_but(p[0]);
		/* Nor the stdio pipes of whoever started the agent. */
		int null = open("/dev/null", O_RDWR);

		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
			if (null > 3)
				close(null);
		}
		sigprocmask(SIG_SETMASK, &saved, NULL);
		guard_main(3);
	}
	pthread_sigmask(SIG_SETMASK, &saved, NULL);
	close(p[0]);
	if (pid < 0) {
		int r = -errno;

		close(p[1]);
		return r;
	}
	a->wk.guard_pid = pid;
	a->wk.guard_fd = p[1];
	return 0;
}

int supervise_init(struct crun_agent *a)
{
	int r;

	pthread_sigmask(SIG_SETMASK, NULL, &a->orig_mask);
	{
		int on = 0;

		/* The program (cmd/crun.c) may make us adopt orphans; then the
		 * killed members of a worker's group come back to be reaped. */
		a->subreaper = prctl(PR_GET_CHILD_SUBREAPER, &on) == 0 && on;
	}
	r = start_guard(a);
	if (r < 0)
		return log_fail(SUB_AGENT, r, "cannot start the guard process");
	a->grace_timer = evtimer_new(a->base, on_grace, a);
	a->window_timer = evtimer_new(a->base, on_window, a);
	if (!a->grace_timer || !a->window_timer)
		return CRUN_ENOMEM;
	if (pipe2(a->stop_req_fd, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	a->stop_req = event_new(a->base, a->stop_req_fd[0], EV_READ | EV_PERSIST, on_stop_req, a);
	if (!a->stop_req || event_add(a->stop_req, NULL) < 0)
		return CRUN_ENOMEM;
	return 0;
}

int supervise_watch_signals(struct crun_agent *a)
{
	uint64_t mask = a->cfg.signals_to_handle;

	if (!mask)
		mask = 1ull << SIGTERM | 1ull << SIGINT | 1ull << SIGHUP | 1ull << SIGQUIT;
	for (int s = 1; s < 64; s++) {
		if (s != SIGCHLD && !(mask & (1ull << s)))
			continue;
		a->sig_ev[s] = evsignal_new(a->base, s, on_signal, a);
		if (!a->sig_ev[s] || evsignal_add(a->sig_ev[s], NULL) < 0)
			return CRUN_ENOMEM;
	}
	return 0;
}

static void on_pidfd(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	supervise_reap(arg);
}

int supervise_watch_pid(struct crun_agent *a, struct worker *w)
{
	int fd = (int)syscall(SYS_pidfd_open, w->pid, 0);

	if (fd < 0)
		return -errno;
	w->pidfd = fd;
	/* Persistent: a pidfd stays readable once the pid exited, until the
	 * reap path unwatches it (a stop notice also lands here: harmless). */
	w->pid_ev = event_new(a->base, fd, EV_READ | EV_PERSIST, on_pidfd, a);
	if (!w->pid_ev || event_add(w->pid_ev, NULL) < 0) {
		supervise_unwatch_pid(w);
		return CRUN_ENOMEM;
	}
	return 0;
}

void supervise_unwatch_pid(struct worker *w)
{
	if (w->pid_ev)
		event_free(w->pid_ev);
	w->pid_ev = NULL;
	if (w->pidfd >= 0)
		fd_close(w->pidfd);
	w->pidfd = -1;
}

void supervise_fini(struct crun_agent *a)
{
	/* Before the guard goes: it is a child too, and known as such. */
	orphans_end(a, a->cfg.shutdown_timeout_ms);
	for (int s = 0; s < 65; s++)
		if (a->sig_ev[s]) {
			event_free(a->sig_ev[s]);
			a->sig_ev[s] = NULL;
		}
	if (a->grace_timer)
		event_free(a->grace_timer);
	a->grace_timer = NULL;
	if (a->window_timer)
		event_free(a->window_timer);
	a->window_timer = NULL;
	if (a->stop_req)
		event_free(a->stop_req);
	a->stop_req = NULL;
	fd_close(a->stop_req_fd[0]);
	fd_close(a->stop_req_fd[1]);
	a->stop_req_fd[0] = a->stop_req_fd[1] = -1;
	if (a->wk.guard_fd >= 0) {
		fd_close(a->wk.guard_fd); /* EOF: the guard kills what is left, exits */
		a->wk.guard_fd = -1;
	}
	if (a->wk.guard_pid > 0) {
		while (waitpid(a->wk.guard_pid, NULL, 0) < 0 && errno == EINTR)
			;
		a->wk.guard_pid = 0;
	}
}
