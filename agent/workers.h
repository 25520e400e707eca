/* workers.h: the agent's local workers (one per local rank), how one is
 * started (spawn.c) and how they are supervised (supervise.c: signals as
 * loop events, the one reap path, stopping, the guard process). The agent
 * embeds one agent_workers; loop thread only.
 */
#ifndef CRUN_AGENT_WORKERS_H
#define CRUN_AGENT_WORKERS_H

#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

struct event;
struct crun_agent;

enum worker_state { W_INIT, W_RUNNING, W_EXITED };

struct worker {
	int local_rank;
	int global_rank;
	pid_t pid;	/* also the process group and session id (own_group) */
	bool own_group; /* pid leads its group: signal -pid (a spawn hook's may not) */
	int pidfd;	/* poll mode: readable when pid exits, or -1 */
	struct event *pid_ev;
	enum worker_state state;
	int exit_code; /* shell convention: 128+sig, 127 exec failure */
	int term_sig;  /* signal that ended it, or 0 */
	int exec_err;  /* errno of a failed exec, or 0 */
	bool stopping; /* crun sent it a signal */
	bool stopped;  /* job control: stopped (SIGSTOP, SIGTSTP, ...) */
	bool reported; /* its exit went through on_worker_exit */
	bool sigkilled_by_us;
	double exit_time; /* wall seconds */
	char errfile[PATH_MAX];
};

/* The workers of the agent: nworkers of them, by local rank, and what
 * watches over them. Embedded in its owner, zeroed, guard_fd -1 before
 * anything can fail; workers_init and workers_release pair. */
struct agent_workers {
	int nworkers;
	struct worker *workers;
	struct event *kick; /* deferred AE_WORKER_EXIT for exec failures (the owner's) */
	int guard_fd;	    /* write end to the guard process (supervise.c) */
	pid_t guard_pid;
};

/* n workers holding nothing (no pid, no pidfd). 0 or CRUN_ENOMEM. */
int workers_init(struct agent_workers *wk, int n);
void workers_release(struct agent_workers *wk);
/* How many are running (started, not yet reaped). */
int workers_running(const struct agent_workers *wk);

/* ---- spawn.c ------------------------------------------------------------------ */

struct spawn_req {
	const char *path;
	char *const *argv;
	char *const *envp;
	int stdout_fd, stderr_fd; /* may be 1 and 2 themselves */
	int deathsig;
	const struct rlimit *nofile; /* RLIMIT_NOFILE for the worker, or NULL */
	const cpu_set_t *cpus;	     /* sched_setaffinity mask, or NULL */
};

/* Starts one worker in a new session (torchrun's start_new_session: reading
 * a terminal never stops it with SIGTTIN), so pid == pgid == sid. Returns 0 and *ret_pid once the
 * child has exec'd, or -errno from fork, child setup or exec (the failed child
 * has been reaped). Loop thread only: PDEATHSIG follows the creating thread. */
int spawn_worker(const struct spawn_req *req, const sigset_t *orig_mask, pid_t *ret_pid);

/* Resolves `name` through $PATH as execvp would (a name with a slash is taken
 * as is). Returns a malloc'd path, or NULL with errno set. */
char *spawn_resolve(const char *name);

/* ---- supervise.c -------------------------------------------------------------- */

int supervise_init(struct crun_agent *a); /* subreaper, guard, stop requests */
/* Blocking mode: TERM/INT/... (cfg.signals_to_handle) and CHLD as loop
 * events. Poll mode takes none: the caller owns the process's signals. */
int supervise_watch_signals(struct crun_agent *a);
/* Poll mode: watches w's exit through a pidfd (w->pid must be our child). */
int supervise_watch_pid(struct crun_agent *a, struct worker *w);
void supervise_unwatch_pid(struct worker *w);
/* Reaps every worker that exited (the one reap path). */
void supervise_reap(struct crun_agent *a);
void supervise_fini(struct crun_agent *a);
/* kill(-pgid, sig) for every worker not yet reaped. */
void supervise_signal_workers(struct crun_agent *a, int sig);
/* Registers/unregisters a worker's process group with the guard process,
 * which SIGKILLs the registered groups if the agent dies. */
void supervise_guard_add(struct crun_agent *a, pid_t pgid);
void supervise_guard_del(struct crun_agent *a, pid_t pgid);
void supervise_arm_grace(struct crun_agent *a);
void supervise_disarm_grace(struct crun_agent *a);
/* The failure window (cfg.monitor_interval_ms): armed once per attempt at
 * the first failure; disarming also forgets that it was armed. */
void supervise_arm_window(struct crun_agent *a);
void supervise_disarm_window(struct crun_agent *a);

/* ---- signals.c: signal names (a leaf; the supervise_ names predate it) ------- */

/* Parses "SIGTERM,SIGINT,..." (or numbers) into a mask. 0 or CRUN_EINVAL. */
int supervise_parse_signals(const char *list, uint64_t *ret_mask);
const char *supervise_signame(int sig); /* "SIGTERM"; static */

#endif /* CRUN_AGENT_WORKERS_H */
