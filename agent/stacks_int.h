/* stacks_int.h: worker stacks before a stop, on demand and on a hang
 * (stacks.c), and silent-hang detection (hang.c). Inside agent/ only.
 *
 * A capture runs one tool per worker, all in parallel, under one deadline
 * (STACKS_DEADLINE_MS): py-spy (Python frames) when it is on the agent's
 * PATH and the worker's executable is a python, else gdb (native frames of
 * every thread) when on PATH; whatever a tool did not deliver in time is
 * completed from /proc (each thread's wchan and syscall). No signal is ever
 * sent to a worker for a stack: a faulthandler signal would kill a worker
 * that registered no handler. The agent is every worker's parent, so ptrace
 * is allowed under Yama scope 1.
 */
#ifndef CRUN_AGENT_STACKS_INT_H
#define CRUN_AGENT_STACKS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/agent.h"
#include "agent/outputs.h"
#include "service/service.h"

#define STACKS_DEADLINE_MS     800u	   /* every tool of one capture, in total */
#define STACKS_FILE_MAX	       (64u << 10) /* bytes of one stack.txt read back */
#define STACKS_ANSWER_REUSE_MS 1000u	   /* asks this close share a capture */

/* The last capture of this attempt (a->stk); stacks.c and stacks_job.c. */
struct agent_stacks {
	char frame[CRUN_AGENT_MAX_LOCAL][STACKS_FRAME_MAX]; /* per local rank, "" none */
	bool taken[CRUN_AGENT_MAX_LOCAL];		    /* captured this attempt */
	bool held; /* a hang's capture: the stop that follows keeps it */
	char digest[STACKS_DIGEST_MAX];
	uint64_t last_demand_ms;
	/* The last answer to the job board (malloc'd JSON) and when it was
	 * made: asks of several nodes that come together share one capture. */
	char *answer;
	uint64_t answer_ms;
};

/* Helpers stacks_job.c shares: the first STACKS_FILE_MAX bytes of a file
 * (malloc'd, "" when unreadable; NULL on OOM); a->stk allocated (0 or
 * CRUN_ENOMEM). The pure texts (frames, digests) are service/'s. */
char *stacks_read_text(const char *path);
int stacks_ensure(struct crun_agent *a);

/* cfg.stack_dump_on_stop */
enum { STACKS_ON_FAILURE = 0, STACKS_ALWAYS = 1, STACKS_NEVER = -1 };

/* Captures the stacks of every running worker that crun is not already
 * stopping into <attempt>/<local_rank>/stack.txt and fills a->stk's frames.
 * Blocks at most STACKS_DEADLINE_MS plus the reaping of killed tools.
 * Returns how many workers were captured (0 when there is no log dir). */
int stacks_capture(struct crun_agent *a);

/* fsm.c's begin_stop(): takes the stacks when this stop wants them
 * (cfg.stack_dump_on_stop, the reason) and logs the digest. */
void stacks_before_stop(struct crun_agent *a, enum stop_reason reason);
/* After the failure summary: the digest of the stop, on stderr. */
void stacks_report(struct crun_agent *a);
/* A new attempt: forget the last capture. */
void stacks_reset(struct crun_agent *a);
void stacks_free(struct crun_agent *a); /* NULL a->stk: no-op */

/* hang.c: capture, digest naming the ranks whose stacks differ from the
 * majority ("... when WHEN"), kept for the stop that follows. Returns the
 * local rank to blame (the first straggler, else the first captured), or -1
 * when nothing was captured. */
int stacks_on_hang(struct crun_agent *a, const char *when);
const char *stacks_last_digest(const struct crun_agent *a); /* "" when none */

/* ---- stacks_job.c: the whole job's stacks through the job board --------------- */

/* rdzv_params.stacks_answer (arg: the agent): captures this node's stacks
 * (or reuses a capture under STACKS_ANSWER_REUSE_MS old) and returns the
 * answer's JSON (malloc'd), NULL on OOM. Blocks as stacks_capture does. */
char *stacks_board_answer(int64_t ask, void *arg);
/* hang.c, with the answers of a gather: the job-wide digest (kept for the
 * stop, as stacks_on_hang's), every stack into <attempt>/job_stacks.txt and
 * a log line timing it from t0_ms. Returns the local rank to blame: the
 * straggler when it is here, else the first running one; -1 with
 * *ret_remote when the straggler is on another node. No answer with ranks:
 * stacks_on_hang's result. */
int stacks_on_hang_job(struct crun_agent *a, const char *when, int64_t ask, char *const *answers,
		       int n, uint64_t t0_ms, bool *ret_remote);

/* GET /stacks: captures (at most once per STACKS_MIN_GAP_MS, else
 * CRUN_EAGAIN) and returns in *ret_body (malloc'd) every local rank's stack,
 * or only global rank `rank` (>= 0). CRUN_ENOENT: no running worker. */
int stacks_on_demand(struct crun_agent *a, int rank, char **ret_body);

/* ---- hang.c: --hang_timeout ----------------------------------------------- */

/* Pure: a worker's progress since the last look. cpu_ms: CPU time of its
 * process tree; out_bytes: its stdout/stderr log sizes; beat: its heartbeat
 * file's mtime (ns). It progressed when its CPU time grew by more than
 * HANG_CPU_PERMILLE of the elapsed wall time, or output or beat moved. */
#define HANG_CPU_PERMILLE 20u
struct hang_sample {
	uint64_t cpu_ms;
	uint64_t out_bytes;
	int64_t beat_ns;
};
bool hang_progressed(const struct hang_sample *last, const struct hang_sample *now,
		     uint64_t elapsed_ms);

/* Starts watching the attempt's workers (after they were started); no-op
 * with cfg.hang_timeout_ms 0. No progress from any worker for the timeout:
 * stacks of every local rank, the straggler digest, an error file and
 * SIGKILL for the straggler (or local rank 0), and the usual failure path. */
int hang_arm(struct crun_agent *a, const char *attempt_dir);
void hang_disarm(struct crun_agent *a);

#endif
