/* service.h: what makes a crun program a service, shared by crun-agent (agent/)
 * and crun-rdzvd (cmd/), which must not link the agent (issue 24):
 *
 *   notify.c       systemd's notify protocol, the watchdog ping, SIGHUP reload
 *   unit.c         a node agent as a systemd unit, driven by its public events
 *   status_job.c   the job as its public events tell it (page and unit)
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

struct cJSON;

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

/* ---- unit.c: a node agent as a systemd unit (crun-agent) ---------------------------- */

/* Speaks the notify protocol for one agent from its public events: READY=1
 * once its workers run, STATUS= at every state change (and every tick while
 * a round forms), STOPPING=1 at its end, WATCHDOG=1 at half $WATCHDOG_USEC;
 * serves the status page on status_listen ("ADDR:PORT"; NULL: none) and
 * passes it the events. SIGHUP calls on_reload(arg), which re-reads the
 * owner's config and ends with service_unit_reloaded. label names the unit
 * in STATUS= (its config file); env is the unit's environment
 * (NOTIFY_SOCKET, WATCHDOG_USEC). All on base's loop. 0, or the page's
 * errors (status_page_start), CRUN_ENOMEM. */
struct service_unit;
struct status_source;
int service_unit_new(struct event_base *base, char *const *env, const char *label,
		     const char *status_listen, void (*on_reload)(void *arg), void *arg,
		     struct service_unit **ret);
/* A crun_agent_event_fn (arg: the unit): give it to the agent's on_event. */
void service_unit_on_event(const crun_agent_event_t *ev, void *unit);
/* The job the unit runs (copied; NULL: none any more), for its run id and
 * round in STATUS= and for the page. */
void service_unit_attach(struct service_unit *u, const struct status_source *src);
/* The end of a reload: err (the new config's error; NULL: it parsed), or
 * what applied live and what waits for a restart ("": nothing). */
void service_unit_reloaded(struct service_unit *u, const char *err, const char *live,
			   const char *restart);
/* The address the status page bound ("127.0.0.1:8123"), or "" when off. */
const char *service_unit_status_addr(const struct service_unit *u);
void service_unit_free(struct service_unit *u); /* sends STOPPING=1; NULL: no-op */

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
	CLI_CTL_WAIT,
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

/* ---- status*.c: the status page (GET /healthz, /status, /jobs, /metrics ...) -------- */

/* A page over libevent's evhttp: /healthz, /status and /jobs (JSON),
 * /metrics (Prometheus text 0.0.4, crun_ prefix), /stacks, and on
 * crun-rdzvd's page /jobs/ID, /usage and POST /drop. A page shows a store
 * server (crun-rdzvd's) or a job. What happens to the job (its state,
 * restarts, round and workers) the page hears as crun_agent_event_t, the
 * public events an embedder gets through crun_agent_config_t.on_event
 * (status_page_on_event is such a callback); what the job is (run id, role,
 * stores) it asks its struct status_source (agent/status.c implements it
 * over struct crun_agent). */
struct status_page;
struct store_server;
struct store_auth_secret;
struct rdzv;
struct rdzv_progress;

/* The store servers a page shows, by their store="..." label. */
enum status_store { STATUS_STORE_RENDEZVOUS, STATUS_STORE_WORKER, STATUS_STORE__MAX };

/* ---- status_job.c: the job as its events tell it ---------------------------------- */

#define STATUS_EXIT_CODES 256 /* exit codes counted 0..255; anything else counts as 255 */

/* What the public events (crun_agent_event_t) say of one job: its public
 * state, restarts, the round it runs in, the current attempt's workers (pid,
 * ranks, state, exit code) and the exit codes of the attempts that ended.
 * Pure: fed by status_job_apply, read by the printers below. */
struct status_job;
int status_job_new(struct status_job **ret); /* 0 or CRUN_ENOMEM */
void status_job_free(struct status_job *j);  /* NULL: no-op */
void status_job_apply(struct status_job *j, const crun_agent_event_t *ev);
/* /status: restart_count, the round (group_world_size, world_size,
 * master_addr, master_port) while an attempt runs in it, and "workers". */
void status_job_json(const struct status_job *j, struct cJSON *root);
/* Its /jobs entry's restart_count, and world_size while running. */
void status_job_entry_json(const struct status_job *j, struct cJSON *entry);
/* crun_agent_restarts_total, crun_agent_workers, crun_agent_worker_exit_code
 * and crun_agent_worker_exits_total. */
void status_job_metrics(const struct status_job *j, FILE *f);
/* While an attempt runs in a round: true with this node's place in it. */
bool status_job_round(const struct status_job *j, int *ret_group_rank, int *ret_group_world_size,
		      int *ret_world_size);

/* What a page asks of the job it serves. Every call runs on the page's loop
 * with arg; none may be NULL. */
struct status_source {
	void *arg;
	/* The job as its events told it; the page sets it (status_page_attach)
	 * and the bodies add its fields. NULL: a bare body. */
	const struct status_job *job;
	/* Adds what the job is to a /status body (the events' part is the
	 * page's). version: the page's count of state changes (NULL: the bare
	 * body of status_json()); st: the state being entered at a change (the
	 * page is told before the job's own state moves), else -1. */
	void (*status_json)(void *arg, struct cJSON *root, const uint64_t *version, int st);
	/* Fills the job's entry of /jobs' array (the page adds the events'
	 * part after it). */
	void (*jobs_json)(void *arg, struct cJSON *entry);
	/* Writes the job's metric families (after crun_agent_up and its uptime,
	 * before the events' and the store servers'). */
	void (*metrics)(void *arg, FILE *f);
	/* The store server the job serves as kind, or NULL. */
	const struct store_server *(*store)(void *arg, enum status_store kind);
	/* Its rendezvous, or NULL (GET /stacks?all=1 gathers through its job
	 * board); its run id and host name (never NULL). */
	struct rdzv *(*rdzv)(void *arg);
	const char *(*run_id)(void *arg);
	const char *(*host)(void *arg);
	/* GET /stacks: every local rank's stack (rank -1) or global rank
	 * rank's into *ret_body (malloc'd); CRUN_EAGAIN: asked too soon,
	 * another error: no running worker. */
	int (*stacks)(void *arg, int rank, char **ret_body);
};

/* Serves a page on `listen` ("ADDR:PORT", port 0: any free one) on base.
 * CRUN_EINVAL (bad address), CRUN_EADDRINUSE (cannot bind), CRUN_ENOMEM. */
int status_page_start(struct event_base *base, const char *listen, struct status_page **ret);
/* The job the page shows (copied; NULL: none, a pending gather of the one
 * before is answered 503). p NULL: no-op. */
void status_page_attach(struct status_page *p, const struct status_source *src);
/* A store server whose counters /status and /metrics show (crun-rdzvd's),
 * whose c10d jobs /jobs lists, and into which GET /stacks?rdzv_id=J posts
 * an ask of job J's board (rdzv.h). Borrowed; p NULL: no-op. */
void status_page_attach_store(struct status_page *p, struct store_server *srv);
/* Turns on POST /drop?job=J on p: it deletes job J's keys of srv
 * (store_server_drop_job) for a request whose "Authorization" header is
 * "Bearer " then token's bytes (compared in constant time); any other gets
 * 401 and a WARN line. Without this call /drop answers 403. srv is borrowed
 * (must outlive p), token copied. 0, CRUN_EINVAL (a token holding a byte a
 * header cannot carry) or CRUN_ENOMEM. */
int status_page_allow_drop(struct status_page *p, struct store_server *srv,
			   const struct store_auth_secret *token);
const char *status_page_addr(const struct status_page *p); /* "127.0.0.1:8123" */
/* A crun_agent_event_fn (arg: the page): what happens to the job. Each
 * state change is the next "version" of /status, whose watchers (GET
 * /status?after=) are answered now; at CRUN_AGENT_DONE the body is kept and
 * served from then on, the job's end. A page with no source ignores them. */
void status_page_on_event(const crun_agent_event_t *ev, void *page);
/* Answers the parked watchers; a page with no source left waits (at most
 * 2 s, turning the loop) for watchers it owes the final body. NULL: no-op. */
void status_page_stop(struct status_page *p);

/* The bodies, malloc'd (NULL on OOM): srv, src or both NULL give the bare
 * page. {"jobs": [...]}: src's job, or the c10d jobs whose keys srv holds.
 * With srv (crun-rdzvd's page) /metrics has crun_rdzvd_up and its store's
 * crun_store_* labelled store="rendezvous"; else crun_agent_up, and src's
 * stores by their role. */
char *status_json(const struct store_server *srv, const struct status_source *src);
char *status_jobs_json(const struct store_server *srv, const struct status_source *src);
char *status_metrics(const struct store_server *srv, const struct status_source *src,
		     uint64_t uptime_ms);
/* Issue 26. {"usage": [{"job", "used", "limit", "refused"}]}: what each job
 * (run id; "" keys of no known job) holds of srv's key space, its share of
 * each budget and its refused writes, each an object of the budgets
 * ("keys", "key_bytes", "value_bytes", "waiters"); malloc'd, NULL on OOM.
 * crun-rdzvd's GET /usage (status_usage.c). */
char *status_usage_json(const struct store_server *srv);

/* Pieces a source builds its part with. root as compact JSON (malloc'd;
 * NULL on OOM or a NULL root); takes root and frees it. */
char *status_print_tree(struct cJSON *root);
/* Adds the rendezvous's progress (rdzv.h) to root as "rendezvous": the round
 * waited in or the last one completed, its nodes (group ranks and addresses
 * once complete), the nodes waited for, and the counters. */
void status_progress_json(struct cJSON *root, const struct rdzv_progress *p, const char *run_id);
/* Prometheus: a family's HELP and TYPE lines; a label value escaped (\, "
 * and newline, exposition format 0.0.4). */
void status_gauge(FILE *f, const char *name, const char *help, const char *type);
void status_label(FILE *f, const char *v);

/* ---- stacks_text.c: the pure texts of worker stacks -------------------------------- */

#define STACKS_FRAME_MAX  192u /* one digest frame: "func (file:line)" */
#define STACKS_DIGEST_MAX 1024u
#define STACKS_MIN_GAP_MS 2000u /* GET /stacks: one capture (or gather) per this long */

/* Bounded append to buf (len: bytes so far, kept below cap). */
void stacks_append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
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

#define STACKS_MERGE_MAX 4096u /* ranks of one job-wide digest */

struct stacks_merged {
	int nranks;	/* ranks in the answers */
	int nodes;	/* answers that held a rank list */
	int nodd;	/* stragglers (0: no strict majority, or none odd) */
	int blame_rank; /* the first straggler's global rank, -1: none */
	char blame_frame[STACKS_FRAME_MAX];
	char digest[STACKS_DIGEST_MAX]; /* stacks_digest over every rank */
};
/* Pure: the digest over every rank of answers[0..n) (each an answer's JSON
 * or NULL), ranks in global order, stragglers named as stacks_digest does
 * ("rank 3 is in f (x.py:3) while ranks 0,1,2 are in g (y.py:9) when
 * WHEN"). 0, CRUN_ENOENT when no answer held a rank, CRUN_ENOMEM. */
int stacks_merge(char *const *answers, int n, const char *when, struct stacks_merged *ret);
/* Pure: what crunctl stacks --all prints: a head line, the digest, then
 * every rank of every node ("=== rank R (node G HOST, local rank L, pid
 * P): FRAME" and its stack), or a node's missing answer. malloc'd; NULL on
 * OOM. */
char *stacks_job_text(const char *job, int64_t ask, char *const *answers, int n);

#endif /* CRUN_SERVICE_SERVICE_H */
