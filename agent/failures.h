/* failures.h: the failures of one attempt as torchrun reports them
 * (errfile.c): a record per failed worker, read from its error file (or its
 * stderr's last lines), the root cause (the earliest), the ChildFailedError
 * summary on stderr, the root cause's copy into the agent's own error file,
 * and the one-line root cause other nodes are told. Which exits count as
 * failures is the agent's restart policy (agent_collect_failures). Loop
 * thread only.
 */
#ifndef CRUN_AGENT_FAILURES_H
#define CRUN_AGENT_FAILURES_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct worker;
struct agent_outputs;

/* A worker failure as the summary reports it (torchrun's ProcessFailure). */
struct agent_failure {
	int global_rank, local_rank;
	pid_t pid;
	int exitcode; /* torchrun convention: -signal for signals */
	int exec_err;
	bool maybe_oom;		/* SIGKILL that crun did not send */
	double timestamp;	/* error file's, else the exit time */
	char errfile[PATH_MAX]; /* "" when absent */
	char *message;		/* owned: error-file message or synthesized text */
	char *traceback;	/* owned: py_callstack, or NULL */
	char *stderr_tail;	/* owned: last stderr lines, or NULL */
};

/* The failures of the current attempt, in exit order. Embedded in its
 * owner, zeroed; failures_release frees it. */
struct agent_failures {
	int nfailures;
	struct agent_failure *failures;
};

/* What the records and the summary name besides the workers. Borrowed. */
struct failures_ctx {
	const char *entrypoint; /* the summary's and the log line's binary */
	const char *argv0;	/* "exec <argv0> failed" */
	const char *host;
	int group_rank;
	struct agent_outputs *out; /* stderr tails, the flush before the summary; may be NULL */
};

/* Records reaped worker w's failure (reads its error file) and logs it.
 * 0 or CRUN_ENOMEM (nothing recorded). */
int failures_add(struct agent_failures *fl, const struct worker *w, const struct failures_ctx *ctx);
/* The summary on stderr (after ctx->out's teed lines: 2 s at most) and the
 * root cause's error file copied to own_errfile (NULL or "": not). */
void failures_report(const struct agent_failures *fl, const struct failures_ctx *ctx,
		     const char *own_errfile);
/* One line naming the root cause's node, rank and exit code ("" if none). */
void failures_root_cause_line(const struct agent_failures *fl, const struct failures_ctx *ctx,
			      char *buf, size_t cap);
void failures_clear(struct agent_failures *fl);	  /* drops the records, keeps the array */
void failures_release(struct agent_failures *fl); /* drops and frees everything */

/* Builds a failure record from a reaped worker (reads its error file). */
int errfile_record_failure(const struct worker *w, const struct failures_ctx *ctx,
			   struct agent_failure *ret);
void errfile_failure_free(struct agent_failure *f);
/* Index of the root cause: the smallest timestamp; -1 when n == 0. */
int errfile_root_cause(const struct agent_failure *f, int n);
/* torchrun's ChildFailedError text; malloc'd. */
char *errfile_format_summary(const char *entrypoint, const char *host,
			     const struct agent_failure *f, int n);
/* Copies the root cause's error file to path, adding "errorCode". */
int errfile_copy_root(const struct agent_failure *root, const char *path);
/* The `python -c` program --run-path runs: torchrun's run_script_path
 * (runpy.run_path of argv[1] as __main__, sys.argv = [script, args...])
 * under torchrun's @record, so an exception lands in the error file. */
extern const char errfile_runpy_src[];

#endif /* CRUN_AGENT_FAILURES_H */
