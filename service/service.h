/* service.h: what makes a crun program a service, shared by crun-agent (agent/)
 * and crun-rdzvd (cmd/), which must not link the agent (issue 24):
 *
 *   notify.c       systemd's notify protocol, the watchdog ping, SIGHUP reload
 *   status*.c      the status page over HTTP (/healthz, /status, /jobs,
 *                  /metrics, /usage, /stacks, POST /drop); what only an agent
 *                  knows comes through struct status_source (agent/status.c)
 *   stacks_text.c  the pure texts of worker stacks (frames, digest, merge)
 *   cli_*.c        the option-row machinery: rows as getopt tables, --help,
 *                  man pages, completions, JSON schemas, a JSON config as flags;
 *                  crun-rdzvd's and crunctl's rows (cli_rows.c)
 *
 * Layering: agent -> service -> rendezvous, store, common. Nothing here knows
 * struct crun_agent; the page speaks crun_agent_state_t, the public state.
 */
#ifndef CRUN_SERVICE_SERVICE_H
#define CRUN_SERVICE_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "crun/agent.h"

/* ---- notify.c: systemd's notify socket, watchdog and SIGHUP ---------------------- */

/* The service half both daemons share: systemd's notify socket, the watchdog
 * ping at half $WATCHDOG_USEC (then on_tick, e.g. a fresh STATUS=, may be
 * NULL), and SIGHUP, which sends RELOADING=1 and calls on_reload (which ends
 * with READY=1). Embedded by its owner; everything on `base`'s loop. */
struct notify;
struct event;
struct event_base;
struct service {
	struct notify *notify;		 /* NULL when not under systemd: sends are no-ops */
	struct event *watchdog, *sighup; /* watchdog: also STATUS= ticks */
	bool wd;			 /* WATCHDOG_USEC is set: ping */
	bool stopping;			 /* STOPPING=1 sent: nothing follows it */
	void (*on_reload)(void *arg);
	void (*on_tick)(void *arg);
	void *arg;
};
int service_start(struct service *s, struct event_base *base, char *const *env,
		  void (*on_reload)(void *arg), void (*on_tick)(void *arg), void *arg);
/* Sends STOPPING=1 once: the service's last word (a STATUS= after it would
 * contradict the stop systemd shows). */
void service_stopping(struct service *s);
void service_stop(struct service *s); /* STOPPING=1 unless sent */

/* ---- cli_*.c: option rows ----------------------------------------------------------- */

/* crun, crun-agent: agent/'s option table (agent/cli_int.h); crun-rdzvd,
 * crunctl: their own rows (cli_rows.c). The same printers serve both. */
enum cli_prog { CLI_CRUN, CLI_AGENT, CLI_RDZVD, CLI_CTL };

/* How a value is spelled on the command line and in JSON. */
enum cli_type {
	CT_FLAG,   /* store_true: no value on the command line; JSON true/false */
	CT_INT,	   /* integer in [min, max]; JSON number */
	CT_SECS,   /* seconds, fractions allowed; JSON number */
	CT_STR,	   /* string; JSON string (a number too with CF_NUMOK) */
	CT_LIST,   /* comma-separated; JSON string or array of strings */
	CT_ARGV,   /* JSON only: array of strings (the program's arguments) */
	CT_ENV,	   /* JSON only: object of strings (the workers' environment) */
	CT_ACTION, /* command line only: --help, --version, --print-completion */
	CT__MAX,
};

enum cli_flags {
	CF_TORCHRUN = 1u << 0, /* torchrun's flag: argparse prefix abbreviations apply */
	CF_NUMOK = 1u << 1,    /* CT_STR that JSON may give as a number ("nproc": 8) */
	CF_AGENT = 1u << 2,    /* crun-agent only (--config) */
	CF_RDZVKEY = 1u << 3,  /* a --rdzv_conf key: JSON rendezvous.<key>, no flag */
	CF_HIDDEN = 1u << 4,   /* left out of --help (still completed and parsed) */
	CF_LIVE = 1u << 5,     /* crun-agent applies a change on SIGHUP without a restart */
};

/* What the row's owner does with a value (agent/'s table: struct cli and its
 * parse context; id is its enum cli_id). The printers never call it. */
struct cli;
struct cli_ctx;
typedef int (*cli_apply_fn)(struct cli *c, struct cli_ctx *x, int id, const char *v);

/* One option: a flag (both spellings), an environment alias, a JSON key, a
 * --help line and a completion at once. */
struct cli_opt {
	const char *name; /* underscore spelling (argparse dest); NULL: JSON only */
	char short_name;
	enum cli_type type;
	unsigned flags;	     /* enum cli_flags */
	const char *def;     /* default, applied when nothing else set it; NULL none */
	const char *env;     /* environment aliases, space-separated, first set wins */
	const char *json;    /* dotted JSON path; NULL: command line only */
	const char *metavar; /* value placeholder in --help */
	const char *choices; /* "a|b|c": checked before apply; NULL any */
	int64_t min, max;    /* CT_INT range */
	const char *help;    /* one line; "[default]" is added from def */
	cli_apply_fn apply;  /* NULL: validated only (accepted, no effect) */
	size_t off;	     /* the owner's: a field its generic appliers set */
	const char *section; /* crun-rdzvd, crunctl: a --help heading this row starts */
};

/* A program's rows and what its completion adds after them. */
struct cli_rowset {
	enum cli_prog prog;
	const char *cmd;	    /* "crun-rdzvd" */
	const struct cli_opt *rows; /* borrowed */
	size_t n;
	const char *zsh_tail; /* zsh _arguments specs after the options ("" none) */
};

/* cli_print.c: the row printers. */
void cli_wrap(FILE *f, const char *text, int indent); /* wrapped at 78 columns */
void cli_roff(FILE *f, const char *s);		      /* roff-escaped text */
void cli_help_row(FILE *f, const struct cli_opt *o);
/* "-n, --nproc-per-node, --nproc_per_node" (one spelling when they agree). */
void cli_spellings(const struct cli_opt *o, char *buf, size_t cap);
void cli_man_row(FILE *f, const struct cli_opt *o);
/* Whether prog shows row o (--help, completion): CF_AGENT rows only crun-agent. */
bool cli_row_shown(const struct cli_opt *o, enum cli_prog prog);
#define CLI_MAN_SEE_ALSO                                                                    \
	".SH SEE ALSO\n\\fBcrun\\fR(1), \\fBcrun\\-agent\\fR(8), \\fBcrun\\-rdzvd\\fR(8), " \
	"\\fBcrunctl\\fR(1), \\fBlibcrun\\fR(3), \\fBsystemd.service\\fR(5)\n"
/* cli_complete.c: a completion script of set's rows for shell ("bash",
 * "zsh", "tcsh"); malloc'd, NULL for another shell or OOM. */
char *cli_rows_completion_new(const struct cli_rowset *set, const char *shell);
/* cli_schema.c: the JSON schema (draft 2020-12) of the rows with a JSON
 * path; malloc'd. */
char *cli_rows_schema_new(const struct cli_rowset *set);

/* cli_json.c: a JSON config file, read and parsed: an object, or NULL with
 * err naming the file (and line:column for a syntax error). */
struct cJSON;
struct cJSON *cli_json_parse_file(const char *path, char *err, size_t cap);
/* A JSON config read as flags, for programs whose options are a getopt
 * table (crun-rdzvd): each leaf at a known dotted path becomes "--flag=value"
 * in *ret_argv (NULL-terminated, *ret_argc entries; free each and the array),
 * to be parsed before the command line's flags so that those win. Unknown
 * keys, wrong types and unreadable files are CRUN_EINVAL with err naming the
 * file and the path; "$comment" keys are skipped. */
struct cli_json_flag {
	const char *json; /* "limits.max-keys" */
	const char *flag; /* "max-keys" */
	bool number;	  /* a whole number, else a string */
};
int cli_json_flags(const char *path, const struct cli_json_flag *table, size_t n, char ***ret_argv,
		   int *ret_argc, char *err, size_t err_cap);

/* cli_rows.c, cli_doc.c: crun-rdzvd's and crunctl's rows. */

/* crun-rdzvd's rows, in --help order; CLI_RD_LIMIT + i is the store's tunable i
 * (store_server_limits()), named as its flag. */
enum cli_rd_opt {
	CLI_RD_HOST,
	CLI_RD_PORT,
	CLI_RD_BACKLOG,
	CLI_RD_LOG_LEVEL,
	CLI_RD_STATUS,
	CLI_RD_CONFIG,
	CLI_RD_PRINT_SCHEMA,
	CLI_RD_EXT_VERSION,
	CLI_RD_HELP,
	CLI_RD_VERSION,
	CLI_RD_PRINT_MAN,
	CLI_RD_PRINT_COMPLETION,
	CLI_RD_AUTH_FILE,
	CLI_RD_AUTH_DIR,
	CLI_RD_INSECURE,
	CLI_RD_ADMIN_TOKEN,
	CLI_RD_TLS_CERT,
	CLI_RD_TLS_KEY,
	CLI_RD_TLS_CA,
	CLI_RD_TLS_MIN,
	CLI_RD_LIMIT,
};
/* crunctl's rows, in --help order. */
enum cli_ctl_opt {
	CLI_CTL_ENDPOINT,
	CLI_CTL_RDZV_ID,
	CLI_CTL_JSON,
	CLI_CTL_INTERVAL,
	CLI_CTL_COUNT,
	CLI_CTL_TIMEOUT,
	CLI_CTL_RANK,
	CLI_CTL_JOB,
	CLI_CTL_TOKEN_FILE,
	CLI_CTL_ALL,
	CLI_CTL_HELP,
	CLI_CTL_VERSION,
	CLI_CTL_PRINT_MAN,
	CLI_CTL_PRINT_COMPLETION,
	CLI_CTL__MAX,
};
/* A crunctl command, for its --help, man page and completion. */
struct cli_command {
	const char *name;
	const char *help;
};
/* getopt_long's value for row id (short names are their own characters). */
#define CLI_GETOPT_VAL(id) (0x100 + (id))
struct option;
/* getopt_long's tables for prog's rows (CLI_RDZVD or CLI_CTL): *ret_longs with
 * every spelling (a name with '_' also with '-'), .val CLI_GETOPT_VAL(id), and
 * *ret_shorts ("H:p:h"); both malloc'd (free them). 0 or CRUN_ENOMEM. */
int cli_getopt_new(enum cli_prog prog, struct option **ret_longs, char **ret_shorts);
/* The row id getopt_long returned c for, or -1 (':' and '?'). */
int cli_getopt_id(enum cli_prog prog, int c);
/* --config's keys: every row of prog with a JSON path, for cli_json_flags
 * (malloc'd, *ret_n rows; its strings are static). 0 or CRUN_ENOMEM. */
int cli_config_flags_new(enum cli_prog prog, struct cli_json_flag **ret, size_t *ret_n);
/* What the rows print, for CLI_RDZVD and CLI_CTL (cmds: crunctl's commands,
 * or NULL): kind "help", "man", "schema" or a shell ("bash", "zsh", "tcsh").
 * malloc'd; NULL for an unknown kind or OOM. */
char *cli_doc_new(enum cli_prog prog, const char *kind, const struct cli_command *cmds,
		  size_t ncmds);

#endif /* CRUN_SERVICE_SERVICE_H */
