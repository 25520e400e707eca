/* cli_int.h: crun's one option table, shared by the files that read it
 * (agent/ only): cli_table.c declares the table and what each row does,
 * cli.c runs the loop that resolves and applies values, cli_text.c prints
 * --help, man pages, shell completions and the JSON schema from it (with
 * service/'s row printers, which crun-rdzvd's and crunctl's rows share), and
 * cli_json.c reads a JSON config file into it. The row type is
 * service/service.h's struct cli_opt. Nothing else lists options:
 * a setting added here is a flag (both spellings), an environment alias, a
 * JSON key, a --help line and a completion at once.
 */
#ifndef CRUN_AGENT_CLI_INT_H
#define CRUN_AGENT_CLI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "agent/cli.h"
#include "agent/cli_rdzv_int.h"
#include "rendezvous/c10d.h"
#include "service/service.h"

/* Where a value came from; a higher source wins (flag > file > env > default). */
enum cli_src { SRC_NONE, SRC_DEFAULT, SRC_ENV, SRC_FILE, SRC_FLAG };

enum cli_id {
	/* Order matters twice: --help lists rows in this order, and values are
	 * applied in it (a row may read rows applied before it). */
	OPT_NNODES,
	OPT_NPROC,
	OPT_RDZV_BACKEND,
	OPT_RDZV_ENDPOINT,
	OPT_RDZV_ID,
	OPT_RDZV_CONF,
	OPT_STANDALONE,
	OPT_MAX_RESTARTS,
	OPT_MONITOR_INTERVAL,
	OPT_START_METHOD,
	OPT_EVENT_LOG_HANDLER,
	OPT_ROLE,
	OPT_MODULE,
	OPT_NO_PYTHON,
	OPT_RUN_PATH,
	OPT_LOG_DIR,
	OPT_REDIRECTS,
	OPT_TEE,
	OPT_LINE_PREFIX,
	OPT_LOCAL_RANKS_FILTER,
	OPT_DUP_STDOUT,
	OPT_DUP_STDERR,
	OPT_NODE_RANK,
	OPT_MASTER_ADDR,
	OPT_MASTER_PORT,
	OPT_LOCAL_ADDR,
	OPT_LOGS_SPECS,
	OPT_NUMA_BINDING,
	OPT_SIGNALS,
	OPT_SHUTDOWN_TIMEOUT,
	OPT_VIRTUAL_LOCAL_RANK,
	/* crun's own settings (exact names only, no abbreviations) */
	OPT_HEARTBEAT_TIMEOUT,
	OPT_NODE_CHECK,
	OPT_NODE_CHECK_THRESHOLD,
	OPT_MAX_NODE_FAILURES,
	OPT_HANG_TIMEOUT,
	OPT_STACK_DUMP_ON_STOP,
	OPT_STATUS,
	OPT_LOG_LEVEL,
	OPT_SECRET_FILE,
	OPT_STORE_ALLOW_ANY,
	OPT_NO_SLURM,
	OPT_INSECURE,
	OPT_CONFIG,
/* rendezvous.<key> in JSON: the c10d --rdzv_conf keys, one per row of
 * RDZV_C10D_KEYS (rendezvous/c10d.h) */
#define CLI_RK_ID_(id, ...) OPT_RK_##id,
	RDZV_C10D_KEYS(CLI_RK_ID_)
#undef CLI_RK_ID_
	/* the job itself in JSON (positional on the command line) */
	OPT_JOB_PROGRAM,
	OPT_JOB_ARGS,
	OPT_JOB_ENV,
	/* actions */
	OPT_HELP,
	OPT_VERSION,
	OPT_PRINT_COMPLETION,
	OPT_PRINT_SCHEMA,
	OPT_PRINT_CONFIG,
	OPT_PRINT_MAN,
	OPT__MAX,
};

/* Parse state: one resolved value per row. */
struct cli_ctx {
	const char *val[OPT__MAX];  /* string form; NULL = unset */
	enum cli_src src[OPT__MAX]; /* who set val */
	char who[OPT__MAX][160];    /* "argument --nproc-per-node", "PET_NNODES", "f.json: job.x" */
	char *const *env;	    /* borrowed */
	char rk_conf[512];	    /* "k=v,..." built from the rendezvous.<key> rows */
};

extern const struct cli_opt cli_opts[OPT__MAX];

/* A flag row's value is set and not "0". */
static inline bool cli_on(const struct cli_ctx *x, enum cli_id id)
{
	return x->val[id] && strcmp(x->val[id], "0") != 0;
}

/* A row has a non-empty value. */
static inline bool cli_given(const struct cli_ctx *x, enum cli_id id)
{
	return x->val[id] && *x->val[id];
}

/* Backends with elastic membership (etcd-v2: torchrun's other etcd name). */
static inline bool cli_elastic(const char *backend)
{
	return strcmp(backend, "c10d") == 0 || strcmp(backend, "etcd") == 0 ||
	       strcmp(backend, "etcd-v2") == 0;
}

/* Message helper: formats into c->err, returns CRUN_EINVAL. */
int cli_fail(struct cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Keeps a copy of s for the life of c; NULL on OOM or overflow. */
const char *cli_keep(struct cli *c, const char *s);

/* cli_json.c: reads the JSON config at path into x (rows with a JSON path,
 * SRC_FILE, "path: key" as who). 0, or CRUN_EINVAL with c->err naming the
 * JSON path; CRUN_ENOENT-style failures also come back as CRUN_EINVAL. */
int cli_json_load(struct cli *c, struct cli_ctx *x, const char *path);

/* One JSON text as row id's value (an array for job.args, an object for
 * job.env, ...), with the file loader's type rules; who names it in errors.
 * Sets x->val[id] (SRC_FILE: the caller may raise it). 0 or CRUN_EINVAL. */
int cli_json_value(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *who,
		   const char *text);

/* cli.c, for crun_agent_config_set (cli_api.c): applies the rows x holds
 * (no defaults, environment or Slurm) over c->cfg in table order, then the
 * cross-row checks a set of named values can break and, when job.program is
 * set, builds the worker command as the command line does. 0 or
 * CRUN_EINVAL with c->err. */
int cli_apply_named(struct cli *c, struct cli_ctx *x);

/* cli_slurm.c: inside a Slurm allocation, the rendezvous settings nothing
 * else set come from SLURM_* (nnodes, node rank, endpoint on the first host,
 * the job id as run id, a port derived from it), at the environment's rank:
 * any flag, file key or PET_* variable wins. 0, or CRUN_EINVAL naming the
 * SLURM_* variable that is malformed. */
int cli_slurm_defaults(struct cli *c, struct cli_ctx *x);

#endif /* CRUN_AGENT_CLI_INT_H */
