/* cli.h: the parsed command line and JSON config of crun, crun-agent, crun-rdzvd and crunctl
 * (cli*.c; the option table is agent/cli_int.h). */
#ifndef CRUN_AGENT_CLI_H
#define CRUN_AGENT_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "crun/agent.h"
#include "service/service.h"
/* The parsed command line (and JSON config); owns every string the config
 * points to. The option table is agent/cli_int.h. */
struct cli {
	crun_agent_config_t cfg;
	char **argv; /* worker command */
	int *redirects, *tee;
	unsigned char *console_ranks;
	char *strs[128]; /* owned strings */
	int nstrs;
	char **job_env;	  /* owned "K=V" list from job.env (the caller exports it) */
	char **file_args; /* owned job.args from the config file */
	char **resolved;  /* owned: each row's final value (cli_changes), or NULL */
	bool help, version;
	enum cli_prog prog;
	const char *completion;	       /* --print-completion SHELL, or NULL */
	bool schema;		       /* crun-agent --print-schema */
	bool man;		       /* --print-man (for packaging) */
	bool print_config;	       /* crun-agent --print-config (after a full parse) */
	const char *status_listen;     /* --status ADDR:PORT, or NULL (off) */
	const char *config_path;       /* crun-agent --config FILE, or NULL */
	const char *event_log_handler; /* "null" or "console" */
	int log_level;		       /* LL_* from --log_level/LOGLEVEL, or -1 */
	char err[512];		       /* message for exit code 2 */
	char note[512];		       /* informational banner (OMP_NUM_THREADS) */
	char warn[512];		       /* a warning for the caller to log once, or "" */
};

/* Parses torchrun's flags (argv[1..]) with PET_* defaults from env (crun's
 * rules). Returns 0, or CRUN_EINVAL with c->err naming the flag (exit 2).
 * `env` is borrowed. Equals cli_parse_prog(c, CLI_CRUN, ...). */
int cli_parse(struct cli *c, int argc, char *const *argv, char *const *env);
/* The same for `prog`: CLI_AGENT also reads --config FILE.json (a flag
 * overrides the file, the file overrides PET_* and defaults); errors in the
 * file name its JSON path. */
int cli_parse_prog(struct cli *c, enum cli_prog prog, int argc, char *const *argv,
		   char *const *env);
void cli_free(struct cli *c);
/* nproc_per_node value -> count; gpus from /proc or /dev, without CUDA;
 * Intel XPUs from /sys/class/drm (i915/xe render nodes). */
int cli_nproc(const char *v, int *ret);
int cli_gpu_count(void);
int cli_xpu_count(void);

/* --help of `prog`, from the option table; malloc'd (NULL on OOM). */
char *cli_help_new(enum cli_prog prog);
/* A completion script for shell "bash", "zsh" or "tcsh"; malloc'd, NULL for
 * another shell or OOM. */
char *cli_completion_new(enum cli_prog prog, const char *shell);
/* The man page of `prog` (roff, section 1) from the option table; malloc'd. */
char *cli_man_new(enum cli_prog prog);

/* The JSON schema (draft 2020-12) of crun-agent's config; malloc'd. */
char *cli_schema_new(void);
/* Every resolved setting of a parse as a JSON object keyed by JSON path
 * (the flag's name for rows without one) plus "argv"; malloc'd. */
char *cli_resolved_json(const struct cli *c);
/* What differs between two parses (a SIGHUP reload): settings that apply
 * live go to `live`, the others (a restart of the agent) to `restart`, both
 * as ", "-joined names ("" when none). */
void cli_changes(const struct cli *was, const struct cli *now, char *live, size_t live_cap,
		 char *restart, size_t restart_cap);

#endif /* CRUN_AGENT_CLI_H */
