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

#define STACKS_DEADLINE_MS 800u	       /* every tool of one capture, in total */
#define STACKS_FRAME_MAX   192u	       /* one digest frame: "func (file:line)" */
#define STACKS_FILE_MAX	   (64u << 10) /* bytes of one stack.txt read back */
#define STACKS_MIN_GAP_MS  2000u       /* GET /stacks: one capture per this long */
#define STACKS_DIGEST_MAX  1024u

/* cfg.stack_dump_on_stop */
enum { STACKS_ON_FAILURE = 0, STACKS_ALWAYS = 1, STACKS_NEVER = -1 };

/* Pure: the innermost frame of the first thread in a stack text, from
 * py-spy ("    func (path/file.py:41)"), gdb ("#0  0x.. in func (..) at
 * f.c:12") or the /proc fallback ("wchan: do_select"), as "func (file:41)"
 * with the file's directories dropped. 0, or CRUN_ENOENT when none. */
int stacks_top_frame(const char *text, char *buf, size_t cap);

/* Pure: marks odd[i] for each frame that differs from the one most ranks
 * are in (empty frames are ignored). Returns how many are odd; 0 when there
 * is no strict majority (a tie names nobody). */
int stacks_stragglers(const char *const *frames, int n, bool *odd);

/* Pure: the digest line: for a stop, "rank 0 was in f (x.py:3), rank 2 was
 * in ... when WHEN"; with odd (a hang), the odd ranks first ("rank 1 is in
 * f (x.py:3) while ranks 0,2 are in g (y.py:9)"). At most cap bytes. */
void stacks_digest(const int *ranks, const char *const *frames, const bool *odd, int n,
		   const char *when, char *buf, size_t cap);

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

/* hang.c: capture, digest naming the ranks whose stacks differ from the
 * majority ("... when WHEN"), kept for the stop that follows. Returns the
 * local rank to blame (the first straggler, else the first captured), or -1
 * when nothing was captured. */
int stacks_on_hang(struct crun_agent *a, const char *when);
const char *stacks_last_digest(const struct crun_agent *a); /* "" when none */

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
