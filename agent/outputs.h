/* outputs.h: where the workers' output goes (logs.c, torchrun's layout) and
 * the agent's console that teed streams are copied to (console.c). The agent
 * owns one agent_outputs; it holds every worker's two streams (by local
 * rank), the duplicate filters and their files, the tailing timer and the
 * console. Everything runs on the agent's loop thread (the console has its
 * own writer thread in blocking mode).
 *
 * One attempt: outputs_open_attempt, then per worker outputs_open_worker
 * (fds for the child) and outputs_after_spawn; outputs_drain_worker at its
 * reap; outputs_close_attempt at the end.
 */
#ifndef CRUN_AGENT_OUTPUTS_H
#define CRUN_AGENT_OUTPUTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AGENT_RING_LINES       8	  /* stderr lines shown per worker in the summary */
#define AGENT_RING_LINE	       256	  /* bytes per shown line */
#define AGENT_LINE_MAX	       16384	  /* duplicate filters decide on this much of a line */
#define AGENT_CONSOLE_BYTES    (4u << 20) /* console queue per stream */
#define AGENT_CONSOLE_STALL_MS 1000	  /* no progress this long: drop, not wait */
#define AGENT_CONSOLE_FLUSH_MS 10000	  /* at exit, wait this long for a slow reader */

struct event_base;
struct agent_outputs;

/* Every pointer is borrowed and must outlive the outputs (the agent's own
 * copies of its config); the filter specs are parsed by outputs_new. */
struct outputs_config {
	struct event_base *base;
	int nworkers;			    /* local ranks 0..nworkers-1 */
	const int *redirects, *tee;	    /* CRUN_STD_* masks per local rank, or NULL */
	const unsigned char *console_ranks; /* shown on the console per local rank, or NULL */
	const char *stdout_filters;	    /* torchrun's duplicate filters ("a,b"), or NULL */
	const char *stderr_filters;
	const char *line_prefix_template; /* NULL or "": "[${role_name}${local_rank}]:" */
	const char *role;
	const char *host; /* ${hostname}: the short name */
};

/* Parses the duplicate filters and sets up the tailing timer; the console
 * comes later (outputs_start_console). 0 or CRUN_ENOMEM. */
int outputs_new(const struct outputs_config *cfg, struct agent_outputs **ret);
/* Closes what is open and frees the console (flushing it for at most
 * AGENT_CONSOLE_FLUSH_MS). NULL: no-op. */
void outputs_free(struct agent_outputs *o);
/* Creates the console when the agent starts: a writer thread, or (loop)
 * writes from the loop only. */
int outputs_start_console(struct agent_outputs *o, bool loop);

/* Opens an attempt's filtered_std{out,err}.log (when filtered) in
 * attempt_dir ("" with --log_dir=/dev/null: no files) and marks every
 * worker's streams as holding nothing. group_rank goes into the prefixes. */
int outputs_open_attempt(struct agent_outputs *o, const char *attempt_dir, int group_rank);
/* Copies the rest of every worker's teed files and closes its streams, then
 * the filtered files. On the loop a full console queue drops (counted); a
 * reader that keeps reading is waited for, AGENT_CONSOLE_FLUSH_MS in all.
 * NULL: no-op. */
void outputs_close_attempt(struct agent_outputs *o);
/* Decides where the streams of the worker at local_rank go for this
 * attempt and opens their files; *ret_out_fd and *ret_err_fd are the fds
 * for the child (valid until outputs_after_spawn). */
int outputs_open_worker(struct agent_outputs *o, int local_rank, int global_rank, int *ret_out_fd,
			int *ret_err_fd);
/* Closes the agent's copies of the child fds (after the spawn, or its failure). */
void outputs_after_spawn(struct agent_outputs *o, int local_rank);
/* Copies more of the worker's teed files (called at reap time; the rest
 * follows on the loop). */
void outputs_drain_worker(struct agent_outputs *o, int local_rank);
/* Copies every teed file to its end and waits until the console wrote it:
 * at most timeout_ms in all. Blocks: for the end of a job only. */
void outputs_flush(struct agent_outputs *o, uint32_t timeout_ms);
/* The last stderr lines (at most AGENT_RING_LINES) of the worker at
 * local_rank whose error file is errfile, read back from the stderr.log
 * beside it; malloc'd; NULL when its stderr went to no file (o NULL too). */
char *outputs_stderr_tail(const struct agent_outputs *o, int local_rank, const char *errfile);

/* Expands $role_name $rank $local_rank $group_rank $hostname (and ${...}). */
int logs_render_prefix(const char *tmpl, const char *role, const char *host, int rank,
		       int local_rank, int group_rank, char *buf, size_t cap);
/* mkdir -p and rm -rf helpers for the log layout. */
int logs_mkdirs(const char *path);
int logs_rmtree(const char *path);

#endif /* CRUN_AGENT_OUTPUTS_H */
