/* orphans.c: what a worker leaves behind. A process that makes itself a
 * subreaper (cmd/crun.c) adopts every descendant of a worker whose parent
 * died: a setsid()'d helper, a daemonised data loader, a `cmd &` of a shell
 * worker. Such an orphan is in no worker's process group, so stopping the
 * workers missed it; one that ignores SIGTERM outlived crun, one per restart
 * (on a GPU with its memory). At the end of each attempt, with the workers'
 * stop, every adopted orphan gets SIGTERM, the stop's grace, then SIGKILL,
 * and each is named in the log; the stop is over only once they are reaped.
 * At the agent's end (success included) the same, blocking: the loop is over.
 *
 * What a worker that exited 0 leaves in its own process group (an upload, a
 * notifier started with `cmd &`) is not killed at its exit, as under
 * torchrun: it runs on while the attempt runs, and is stopped as an orphan
 * (SIGTERM, grace, SIGKILL, named in the log) when the attempt or the job
 * ends. A failed worker's group is SIGKILLed at its exit (supervise.c).
 * Unlike torchrun, nothing outlives crun's own end, but for a SIGKILL of crun:
 * the guard holds only the running workers' groups.
 *
 * An adopted orphan is a child of this process that is neither a worker nor
 * the guard: a subreaper host's own other children would be taken for
 * orphans too, so only a program that owns every child of its process should
 * make it a subreaper (crun does; an embedding host that is not a subreaper
 * is never affected). Children are found in /proc/<pid>/stat (ppid), not in
 * .../children, which needs CONFIG_PROC_CHILDREN and lists per thread.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/common.h"

#define ORPHANS_MAX	     256 /* tracked at once; more wait for the next look */
#define ORPHANS_PIDS_TEXT    512 /* the pid list in one log line */
#define ORPHANS_KILL_WAIT_MS 5000

struct agent_orphans {
	pid_t pid[ORPHANS_MAX]; /* signalled, not yet reaped */
	int n;
	int sig; /* the stop's signal while a stop is on, else 0 */
};

int orphans_parse_stat(const char *stat, pid_t *ret_ppid, pid_t *ret_pgrp, char *ret_state)
{
	/* "pid (comm) S ppid pgrp ...": comm may hold spaces and parentheses,
	 * so the fields start after the last ')'. */
	const char *p = strrchr(stat, ')');
	char state;
	int ppid, pgrp;

	if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3)
		return CRUN_EINVAL;
	*ret_ppid = (pid_t)ppid;
	*ret_pgrp = (pid_t)pgrp;
	*ret_state = state;
	return 0;
}

/* Reads a small /proc file (one read: the kernel fills it at once) into buf
 * as a string. The byte count (0: empty), or a negative code: -errno from
 * open (gone), CRUN_EINVAL from read. A count of cap - 1 means the file may
 * be longer than buf. */
static ssize_t read_proc(const char *path, char *buf, size_t cap)
{
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, cap - 1);
	fd_close(fd);
	if (n < 0)
		return CRUN_EINVAL;
	buf[n] = '\0';
	return n;
}

/* The stat of /proc/<name>: 0, or a negative code (gone, not a pid). */
static int read_stat(const char *name, pid_t *ret_ppid, pid_t *ret_pgrp, char *ret_state)
{
	char path[64], buf[1024];
	ssize_t n;

	if (snprintf(path, sizeof(path), "/proc/%s/stat", name) >= (int)sizeof(path))
		return CRUN_EINVAL;
	n = read_proc(path, buf, sizeof(buf));
	if (n <= 0)
		return n < 0 ? (int)n : CRUN_EINVAL;
	return orphans_parse_stat(buf, ret_ppid, ret_pgrp, ret_state);
}

static bool is_known_child(const struct crun_agent *a, pid_t pid)
{
	if (pid == a->wk.guard_pid)
		return true;
	for (int i = 0; a->wk.workers && i < a->wk.nworkers; i++)
		if (a->wk.workers[i].pid == pid && a->wk.workers[i].state == W_RUNNING)
			return true;
	return false;
}

static bool tracked(const struct agent_orphans *o, pid_t pid)
{
	for (int i = 0; i < o->n; i++)
		if (o->pid[i] == pid)
			return true;
	return false;
}

static void append_pid(char *text, size_t cap, pid_t pid)
{
	size_t len = strlen(text);

	if (len + 16 < cap)
		snprintf(text + len, cap - len, "%s%d", len ? ", " : "", (int)pid);
	else if (len + 5 < cap && strcmp(text + len - 3, "...") != 0)
		snprintf(text + len, cap - len, ", ...");
}

/* Whether pid is a child of ours that the agent does not know (neither a
 * running worker nor the guard, nor an orphan already tracked). */
static bool unknown(const struct crun_agent *a, pid_t pid)
{
	return !is_known_child(a, pid) && !(a->orph && tracked(a->orph, pid));
}

/* One thread's /proc/self/task/<tid>/children: 1 when it lists a child
 * unknown(), 0 when not, -1 when it cannot tell (unreadable, or too long). */
static int thread_has_unknown_child(const struct crun_agent *a, const char *tid)
{
	char path[64], buf[4096], *p, *end;
	ssize_t n;

	if (snprintf(path, sizeof(path), "/proc/self/task/%s/children", tid) >= (int)sizeof(path))
		return -1;
	n = read_proc(path, buf, sizeof(buf));
	if (n < 0 || n == (ssize_t)sizeof(buf) - 1)
		return -1;
	for (p = buf;; p = end) {
		long pid = strtol(p, &end, 10);

		if (end == p)
			return 0;
		if (pid > 0 && unknown(a, (pid_t)pid))
			return 1;
	}
}

/* Whether this process has a child that unknown() holds: 1, 0, or -1 when the
 * kernel cannot say (the children files need CONFIG_PROC_CHILDREN). Whatever a
 * worker leaves behind descends from such a child of ours, the first of its
 * line whose parent died (crun is the subreaper), so with none the /proc scans
 * below find nothing: they read every process's stat, and a restart of N
 * workers ran N + 1 of them (7 -> 19 ms at N = 8 with ~100 processes on the
 * machine; more on a node full of data loaders). */
static int has_unknown_child(const struct crun_agent *a)
{
	char self[24];
	struct dirent *de;
	DIR *d;
	int r;

	/* The loop thread's own file tells whether the kernel lists children;
	 * another thread's may vanish with it (that thread had no children). */
	(void)snprintf(self, sizeof(self), "%d", (int)gettid());
	r = thread_has_unknown_child(a, self);
	if (r != 0)
		return r;
	d = opendir("/proc/self/task");
	if (!d)
		return -1;
	while (r == 0 && (de = readdir(d)) != NULL)
		if (de->d_name[0] != '.' && strcmp(de->d_name, self) != 0 &&
		    thread_has_unknown_child(a, de->d_name) == 1)
			r = 1;
	closedir(d);
	return r;
}

/* One process as scan_proc sees it. */
struct proc_entry {
	pid_t pid, ppid, pgrp;
	char state;
};

/* Calls fn for every process in /proc whose stat reads, until fn says stop
 * (returns false). */
static void scan_proc(bool (*fn)(const struct proc_entry *p, void *arg), void *arg)
{
	struct dirent *de;
	DIR *d = opendir("/proc");

	if (!d)
		return;
	while ((de = readdir(d)) != NULL) {
		struct proc_entry p = {.pid = (pid_t)strtol(de->d_name, NULL, 10)};

		if (p.pid > 0 && read_stat(de->d_name, &p.ppid, &p.pgrp, &p.state) == 0 &&
		    !fn(&p, arg))
			break;
	}
	closedir(d);
}

struct look_ctx {
	struct crun_agent *a;
	struct agent_orphans *o;
	pid_t self;
	char *fresh; /* the new pids, for the log */
	size_t cap;
};

/* Tracks p if it is an adopted orphan not yet tracked (a zombie one is just
 * reaped). */
static bool look_one(const struct proc_entry *p, void *arg)
{
	struct look_ctx *c = arg;

	if (p->ppid != c->self || is_known_child(c->a, p->pid) || tracked(c->o, p->pid))
		return true;
	if (p->state == 'Z') { /* it ended on its own: only the reap is left */
		if (waitpid(p->pid, NULL, WNOHANG) == p->pid)
			log_at(LL_DEBUG, SUB_AGENT, "reaped orphan %d", (int)p->pid);
		return true;
	}
	c->o->pid[c->o->n++] = p->pid;
	append_pid(c->fresh, c->cap, p->pid);
	return c->o->n < ORPHANS_MAX;
}

static void look(struct crun_agent *a, struct agent_orphans *o, char *fresh, size_t cap)
{
	struct look_ctx c = {.a = a, .o = o, .self = getpid(), .fresh = fresh, .cap = cap};

	if (o->n < ORPHANS_MAX && has_unknown_child(a) != 0)
		scan_proc(look_one, &c);
}

struct group_ctx {
	pid_t pgid;
	char pids[ORPHANS_PIDS_TEXT];
};

static bool group_one(const struct proc_entry *p, void *arg)
{
	struct group_ctx *c = arg;

	if (p->pid != c->pgid && p->pgrp == c->pgid && p->state != 'Z')
		append_pid(c->pids, sizeof(c->pids), p->pid);
	return true;
}

void orphans_log_group(const struct crun_agent *a, const struct worker *w, bool succeeded)
{
	struct group_ctx c = {.pgid = w->pid};
	const char *fate = "killing them (SIGKILL)";

	if (succeeded && a->subreaper)
		fate = "leaving them running until this attempt or the job ends "
		       "(then SIGTERM, the --shutdown-timeout grace, SIGKILL)";
	else if (succeeded) /* not adopted: nothing names them later */
		fate = "leaving them running (this process is not a subreaper: never stopped)";
	/* The subreaper adopted whatever outlived the worker (its zombie, still
	 * a known child, pins the group): no new child, nothing left in it. */
	if (a->subreaper && has_unknown_child(a) == 0)
		return;
	scan_proc(group_one, &c);
	if (c.pids[0])
		log_at(LL_WARN, SUB_AGENT,
		       "worker %d (pid %d) %s leaving pids %s in its process group: %s",
		       w->local_rank, (int)w->pid, succeeded ? "exited with 0" : "failed", c.pids,
		       fate);
}

/* The unreaped orphan pins its pid and, when it leads one, its process
 * group: a group it leads (a setsid()'d helper's) goes with it. */
static void send_one(pid_t pid, int sig)
{
	pid_t target = getpgid(pid) == pid ? -pid : pid;

	if (kill(target, sig) < 0 && errno != ESRCH)
		log_at(LL_WARN, SUB_AGENT, "kill(%d, %s): %s, ignoring", (int)target,
		       supervise_signame(sig), strerror(errno));
}

int orphans_signal(struct crun_agent *a, int sig)
{
	char fresh[ORPHANS_PIDS_TEXT] = "", all[ORPHANS_PIDS_TEXT] = "";
	struct agent_orphans *o;

	if (!a->subreaper)
		return 0;
	if (!a->orph) {
		a->orph = calloc(1, sizeof(*a->orph));
		if (!a->orph)
			return 0; /* the end of the agent still sweeps, blocking */
	}
	o = a->orph;
	if (sig == SIGKILL)
		for (int i = 0; i < o->n; i++)
			append_pid(all, sizeof(all), o->pid[i]);
	look(a, o, fresh, sizeof(fresh));
	if (sig == SIGKILL && all[0])
		log_at(LL_WARN, SUB_AGENT,
		       "orphaned worker descendants %s did not exit within %u ms of SIGTERM: "
		       "sending SIGKILL",
		       all, a->cfg.shutdown_timeout_ms);
	if (fresh[0])
		log_at(LL_WARN, SUB_AGENT,
		       "stopping processes the workers left behind (orphans adopted by crun) "
		       "with %s: pids %s",
		       supervise_signame(sig), fresh);
	o->sig = sig;
	for (int i = 0; i < o->n; i++)
		send_one(o->pid[i], sig);
	return o->n;
}

void orphans_rescan(struct crun_agent *a)
{
	if (a->orph && a->orph->sig)
		(void)orphans_signal(a, a->orph->sig);
}

bool orphans_reap(struct crun_agent *a)
{
	struct agent_orphans *o = a->orph;
	bool any = false;

	for (int i = 0; o && i < o->n;) {
		siginfo_t si = {0};
		int r = waitid(P_PID, (id_t)o->pid[i], &si, WEXITED | WNOHANG);

		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0 && si.si_pid != o->pid[i]) { /* still running */
			i++;
			continue;
		}
		if (r == 0) /* else ECHILD: not ours any more, nothing to reap */
			log_at(LL_INFO, SUB_AGENT, "orphan %d exited (%s %d)", (int)o->pid[i],
			       si.si_code == CLD_EXITED ? "status" : "signal", si.si_status);
		o->pid[i] = o->pid[--o->n];
		any = true;
	}
	return any;
}

int orphans_alive(const struct crun_agent *a)
{
	return a->orph ? a->orph->n : 0;
}

void orphans_stop_over(struct crun_agent *a)
{
	if (a->orph)
		a->orph->sig = 0;
}

/* Reaps until none is tracked or until_ms; 10 ms naps (the loop is over). */
static void reap_until(struct crun_agent *a, uint64_t until_ms)
{
	while (orphans_reap(a), orphans_alive(a) > 0 && clock_now_ms() < until_ms) {
		struct timespec nap = {0, 10 * 1000 * 1000};

		nanosleep(&nap, NULL);
	}
}

void orphans_end(struct crun_agent *a, uint32_t grace_ms)
{
	if (orphans_signal(a, SIGTERM) > 0) {
		reap_until(a, clock_now_ms() + grace_ms);
		if (orphans_alive(a) > 0)
			(void)orphans_signal(a, SIGKILL);
		/* SIGKILL ends them at once, unless one sleeps in the kernel
		 * (D state): bounded, it is then left to init. */
		reap_until(a, clock_now_ms() + ORPHANS_KILL_WAIT_MS);
		if (orphans_alive(a) > 0)
			log_at(LL_WARN, SUB_AGENT, "%d orphans outlive SIGKILL, leaving them",
			       orphans_alive(a));
	}
	free(a->orph);
	a->orph = NULL;
}
