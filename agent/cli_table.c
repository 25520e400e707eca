/* cli_table.c: crun's one option table (cli_int.h) and what each row does
 * with its value: an apply function per row, checked strings in, fields of
 * crun_agent_config_t (or struct cli) out. The loop that feeds it, from the
 * command line, a JSON file, the environment and the defaults, is cli.c.
 * Rows are applied in table order, after every value has been resolved, so
 * an apply function may read any other row's value through the context.
 */
#include <errno.h>
#include <sched.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "agent/cli.h"
#include "agent/numa.h"
#include "agent/slurm.h"
#include "agent/workers.h"
#include "agent/cli_int.h"
#include "rendezvous/rdzv.h"
#include "common/common.h"

#define CFG(field) offsetof(crun_agent_config_t, field)

static int ap_nnodes(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_nproc(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_backend(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_endpoint(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_rdzv_id(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_role(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_std(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_filter(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_master_addr(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_master_port(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_logs_specs(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_signals(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_event(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_status(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_log_level(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_rk(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int set_bool(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int ap_stack_dump(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int set_int(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int set_ms(struct cli *c, struct cli_ctx *x, int id, const char *v);
static int set_str(struct cli *c, struct cli_ctx *x, int id, const char *v);

#define TR CF_TORCHRUN
/* clang-format off */
const struct cli_opt cli_opts[OPT__MAX] = {
[OPT_NNODES] = {"nnodes", 0, CT_STR, TR | CF_NUMOK, "1", "PET_NNODES", "rendezvous.nnodes",
	"N|MIN:MAX", NULL, 0, 0, "number of nodes (static: N; c10d: elastic MIN:MAX)", ap_nnodes, 0},
[OPT_NPROC] = {"nproc_per_node", 0, CT_STR, TR | CF_NUMOK, "1", "PET_NPROC_PER_NODE",
	"job.nproc_per_node", "N|auto|cpu|gpu|xpu", NULL, 0, 0, "workers per node", ap_nproc, 0},
[OPT_RDZV_BACKEND] = {"rdzv_backend", 0, CT_STR, TR, "static", "PET_RDZV_BACKEND",
	"rendezvous.backend", "BACKEND", "static|c10d|etcd|etcd-v2", 0, 0,
	"rendezvous backend (etcd-v2 = etcd)", ap_backend, 0},
[OPT_RDZV_ENDPOINT] = {"rdzv_endpoint", 0, CT_STR, TR, NULL, "PET_RDZV_ENDPOINT",
	"rendezvous.endpoint", "HOST:PORT", NULL, 0, 0,
	"static: node 0's store [master_addr:master_port]; c10d: the rendezvous store "
	"(served by the agent whose address it is, else by another agent or crun-rdzvd); "
	"etcd: HOST[:2379][,HOST[:PORT]...], the etcd v3 members", ap_endpoint, 0},
[OPT_RDZV_ID] = {"rdzv_id", 0, CT_STR, TR, NULL, "PET_RDZV_ID", "rendezvous.id", "ID", NULL,
	0, 0, "run id [none]", ap_rdzv_id, 0},
[OPT_RDZV_CONF] = {"rdzv_conf", 0, CT_STR, TR, NULL, "PET_RDZV_CONF", "rendezvous.conf",
	"K=V,...", NULL, 0, 0,
	"static: timeout, join_timeout, read_timeout (seconds; other keys are ignored with a "
	"warning, as torchrun ignores them); c10d: the rendezvous keys below and "
	"store_<limit>; etcd: those and protocol, cacert, cert, key, key_prefix, username, "
	"password_file", NULL, 0},
[OPT_STANDALONE] = {"standalone", 0, CT_FLAG, TR, NULL, "PET_STANDALONE",
	"rendezvous.standalone", NULL, NULL, 0, 0,
	"one node, private store on an ephemeral port, a uuid run id", set_bool, CFG(standalone)},
[OPT_MAX_RESTARTS] = {"max_restarts", 0, CT_INT, TR, "0", "PET_MAX_RESTARTS",
	"restart.max_restarts", "N", NULL, 0, INT32_MAX,
	"restarts of the worker group on failure", set_int, CFG(max_restarts)},
[OPT_MONITOR_INTERVAL] = {"monitor_interval", 0, CT_SECS, TR, "0.1", "PET_MONITOR_INTERVAL",
	"restart.monitor_interval", "SECONDS", NULL, 0, 0,
	"after a worker fails, when the others are stopped: every worker failed by then is listed",
	set_ms, CFG(monitor_interval_ms)},
[OPT_START_METHOD] = {"start_method", 0, CT_STR, TR, "spawn", "PET_START_METHOD",
	"job.start_method", "METHOD", "spawn|fork|forkserver", 0, 0,
	"accepted; programs are always exec'd", NULL, 0},
[OPT_EVENT_LOG_HANDLER] = {"event_log_handler", 0, CT_STR, TR, "null", "PET_EVENT_LOG_HANDLER",
	"logs.event_log_handler", "HANDLER", "null|console", 0, 0,
	"console: one JSON event line per agent state change on stderr", ap_event, 0},
[OPT_ROLE] = {"role", 0, CT_STR, TR, "default", "PET_ROLE", "job.role", "NAME", NULL, 0, 0,
	"ROLE_NAME of the workers", ap_role, 0},
[OPT_MODULE] = {"module", 'm', CT_FLAG, TR, NULL, "PET_MODULE", "job.module", NULL, NULL, 0, 0,
	"run the program as python -m", NULL, 0},
[OPT_NO_PYTHON] = {"no_python", 0, CT_FLAG, TR, NULL, "PET_NO_PYTHON", "job.no_python", NULL,
	NULL, 0, 0, "exec the program directly", NULL, 0},
[OPT_RUN_PATH] = {"run_path", 0, CT_FLAG, TR, NULL, "PET_RUN_PATH", "job.run_path", NULL, NULL,
	0, 0, "run the script with runpy.run_path (sys.path[0] is the working directory); "
	"an exception is written to the error file, as torchrun's @record does",
	NULL, 0},
[OPT_LOG_DIR] = {"log_dir", 0, CT_STR, TR, NULL, "PET_LOG_DIR", "logs.dir", "DIR", NULL, 0, 0,
	"logs and error files [a new $TMPDIR/torchelastic_*]", set_str, CFG(log_dir)},
[OPT_REDIRECTS] = {"redirects", 'r', CT_STR, TR | CF_NUMOK, "0", "PET_REDIRECTS",
	"logs.redirects", "0-3|R:V,...", NULL, 0, 0,
	"redirect stdout(1)/stderr(2)/both(3) to files", ap_std, 0},
[OPT_TEE] = {"tee", 't', CT_STR, TR | CF_NUMOK, "0", "PET_TEE", "logs.tee", "0-3|R:V,...", NULL,
	0, 0, "redirect and echo with a prefix", ap_std, 0},
[OPT_LINE_PREFIX] = {"log_line_prefix_template", 0, CT_STR, TR, NULL,
	"PET_LOG_LINE_PREFIX_TEMPLATE TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
	"logs.line_prefix_template", "TEMPLATE", NULL, 0, 0,
	"prefix of teed lines: ${role_name} ${rank} ${local_rank} ${group_rank} ${hostname}",
	set_str, CFG(line_prefix_template)},
[OPT_LOCAL_RANKS_FILTER] = {"local_ranks_filter", 0, CT_LIST, TR, NULL, "PET_LOCAL_RANKS_FILTER",
	"logs.local_ranks_filter", "R,...", NULL, 0, 0,
	"only these local ranks reach the console", ap_filter, 0},
[OPT_DUP_STDOUT] = {"duplicate_stdout_filters", 0, CT_LIST, TR, NULL,
	"PET_DUPLICATE_STDOUT_FILTERS", "logs.duplicate_stdout_filters", "S,...", NULL, 0, 0,
	"copy stdout lines containing any S to filtered_stdout.log (',,' is a comma)",
	set_str, CFG(duplicate_stdout_filters)},
[OPT_DUP_STDERR] = {"duplicate_stderr_filters", 0, CT_LIST, TR, NULL,
	"PET_DUPLICATE_STDERR_FILTERS", "logs.duplicate_stderr_filters", "S,...", NULL, 0, 0,
	"copy stderr lines containing any S to filtered_stderr.log (',,' is a comma)",
	set_str, CFG(duplicate_stderr_filters)},
[OPT_NODE_RANK] = {"node_rank", 0, CT_INT, TR, "0", "PET_NODE_RANK", "rendezvous.node_rank",
	"N", NULL, 0, 65535, "static: this node's rank", set_int, CFG(node_rank)},
[OPT_MASTER_ADDR] = {"master_addr", 0, CT_STR, TR, "127.0.0.1", "PET_MASTER_ADDR",
	"rendezvous.master_addr", "HOST", NULL, 0, 0, "static: node 0's address",
	ap_master_addr, 0},
[OPT_MASTER_PORT] = {"master_port", 0, CT_INT, TR, NULL, "PET_MASTER_PORT",
	"rendezvous.master_port", "PORT", NULL, 1, 65535,
	"static: node 0's store port [29500; a one-node run without it, --rdzv_endpoint or "
	"--standalone uses a free port and a uuid run id, as torchrun 2.x]", ap_master_port, 0},
[OPT_LOCAL_ADDR] = {"local_addr", 0, CT_STR, TR, NULL, "PET_LOCAL_ADDR", "rendezvous.local_addr",
	"HOST", NULL, 0, 0, "address given to workers as MASTER_ADDR", set_str, CFG(local_addr)},
[OPT_LOGS_SPECS] = {"logs_specs", 0, CT_STR, TR, NULL, NULL, "logs.specs", "NAME", NULL, 0, 0,
	"torchrun's LogsSpecs plugin: only 'default' (crun's built-in layout)", ap_logs_specs, 0},
[OPT_NUMA_BINDING] = {"numa_binding", 0, CT_STR, TR, NULL, NULL, "job.numa_binding", "MODE",
	"node|socket|exclusive|core-complex", 0, 0,
	"bind each worker to the CPUs near its GPU (read from sysfs)", set_str,
	CFG(numa_binding)},
[OPT_SIGNALS] = {"signals_to_handle", 0, CT_LIST, TR, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
	"PET_SIGNALS_TO_HANDLE", "signals.to_handle", "SIG,...", NULL, 0, 0,
	"signals forwarded to the workers", ap_signals, 0},
[OPT_SHUTDOWN_TIMEOUT] = {"shutdown_timeout", 0, CT_SECS, TR, "30",
	"PET_SHUTDOWN_TIMEOUT TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "signals.shutdown_timeout",
	"SECONDS", NULL, 0, 0, "SIGTERM -> SIGKILL grace", set_ms, CFG(shutdown_timeout_ms)},
[OPT_VIRTUAL_LOCAL_RANK] = {"virtual_local_rank", 0, CT_FLAG, TR, NULL, "PET_VIRTUAL_LOCAL_RANK",
	"job.virtual_local_rank", NULL, NULL, 0, 0,
	"LOCAL_RANK=0 and one visible GPU per worker", set_bool, CFG(virtual_local_rank)},
[OPT_HEARTBEAT_TIMEOUT] = {"worker_heartbeat_timeout", 0, CT_SECS, 0, "0",
	"PET_WORKER_HEARTBEAT_TIMEOUT", "restart.worker_heartbeat_timeout", "SECONDS", NULL, 0, 0,
	"restart the workers when one stops beating (crun_heartbeat() or the mtime of "
	"$CRUN_HEARTBEAT_FILE) for this long; 0: off", set_ms, CFG(worker_heartbeat_timeout_ms)},
[OPT_NODE_CHECK] = {"node_check", 0, CT_FLAG, 0, NULL, "PET_NODE_CHECK", "health.node_check",
	NULL, NULL, 0, 0,
	"after each rendezvous, before the workers, check every node (GEMM GFLOP/s, ring "
	"all_reduce GB/s); a slow or failing node leaves the job (exit 2) when MIN nodes remain",
	set_bool, CFG(node_check)},
[OPT_NODE_CHECK_THRESHOLD] = {"node_check_threshold", 0, CT_INT, 0, "50",
	"PET_NODE_CHECK_THRESHOLD", "health.node_check_threshold", "PERCENT", NULL, 1, 100,
	"--node_check: a node below this percentage of the median is slow", set_int,
	CFG(node_check_threshold)},
[OPT_MAX_NODE_FAILURES] = {"max_node_failures", 0, CT_INT, 0, "0", "PET_MAX_NODE_FAILURES",
	"restart.max_node_failures", "K", NULL, 0, INT32_MAX,
	"a node whose workers failed in K attempts of the job leaves it (exit 2) when MIN nodes "
	"remain, for a spare to take its place; 0: never", set_int, CFG(max_node_failures)},
[OPT_HANG_TIMEOUT] = {"hang_timeout", 0, CT_SECS, 0, "0", "PET_HANG_TIMEOUT",
	"restart.hang_timeout", "SECONDS", NULL, 0, 0,
	"no worker of this node progresses (CPU time of its process tree, its log files, its "
	"heartbeat file) for this long: take every rank's stack, fail the straggler; 0: off",
	set_ms, CFG(hang_timeout_ms)},
[OPT_STACK_DUMP_ON_STOP] = {"stack_dump_on_stop", 0, CT_STR, 0, "failure",
	"PET_STACK_DUMP_ON_STOP", "restart.stack_dump_on_stop", "WHEN", "failure|always|never",
	0, 0, "write <attempt>/<rank>/stack.txt of each worker crun stops: when others failed, "
	"also on a signal or membership change (always), or never", ap_stack_dump, 0},
[OPT_STATUS] = {"status", 0, CT_STR, 0, NULL, "PET_STATUS", "status.listen", "ADDR:PORT", NULL,
	0, 0, "serve /healthz, /status, /jobs and /metrics over HTTP; 'off' for none [crun: off, "
	"crun-agent: 127.0.0.1:0, a free port announced in STATUS= and the log]", ap_status, 0},
[OPT_LOG_LEVEL] = {"log_level", 0, CT_STR, CF_LIVE, NULL, "PET_LOG_LEVEL CRUN_LOG_LEVEL LOGLEVEL",
	"daemon.log_level", "LEVEL", NULL, 0, 0,
	LOG_LEVEL_NAMES " (LOGLEVEL as torchrun; notice: normal events such as a round "
	"complete) [crun: notice, crun-agent: info]", ap_log_level, 0},
[OPT_SECRET_FILE] = {"auth_secret_file", 0, CT_STR, 0, NULL, "PET_AUTH_SECRET_FILE",
	"security.secret_file", "FILE", NULL, 0, 0,
	"shared secret for crun-to-crun connections", set_str, CFG(auth_secret_file)},
[OPT_STORE_ALLOW_ANY] = {"worker_store_allow_any", 0, CT_FLAG, 0, NULL,
	"PET_WORKER_STORE_ALLOW_ANY", "security.worker_store_allow_any", NULL, NULL, 0, 0,
	"the worker store accepts any peer address (NAT); default: loopback and the round's "
	"nodes", set_bool, CFG(worker_store_allow_any)},
[OPT_NO_SLURM] = {"no_slurm", 0, CT_FLAG, 0, NULL, "CRUN_NO_SLURM", "slurm.ignore", NULL, NULL, 0,
	0, "ignore a Slurm allocation (by default, inside one, SLURM_NNODES, SLURM_NODEID, the "
	"first host of SLURM_JOB_NODELIST and SLURM_JOB_ID fill the rendezvous settings no flag "
	"gives)", NULL, 0},
[OPT_INSECURE] = {"insecure", 0, CT_FLAG, CF_AGENT, NULL, NULL, "security.insecure", NULL, NULL,
	0, 0, "run a c10d rendezvous on a non-loopback endpoint without a secret or TLS (refused "
	"otherwise: anyone who reaches the port could change or end the job)", NULL, 0},
[OPT_CONFIG] = {"config", 0, CT_STR, CF_AGENT, NULL, NULL, NULL, "FILE.json", NULL, 0, 0,
	"read settings from a JSON file (configs/crun-agent.schema.json); flags win", NULL, 0},
/* The rendezvous.<key> rows: one per row of rendezvous/c10d.h's table. */
#define CLI_CT_RK_SECS CT_SECS
#define CLI_CT_RK_BOOL CT_FLAG
#define CLI_CT_RK_PATH CT_STR
#define CLI_CT_RK_RPATH CT_STR
#define CLI_CT_RK_STR CT_STR
#define CLI_CT_RK_PICK CT_STR
#define CLI_CT_RK_TLS CT_STR
#define CLI_RK_ROW_(id, nm, al, kd, sc, field, df, mv, ch, hp) \
	[OPT_RK_##id] = {NULL, 0, CLI_CT_##kd, CF_RDZVKEY, df, NULL, "rendezvous." #nm, mv, ch, \
	0, 0, hp, ap_rk, 0},
RDZV_C10D_KEYS(CLI_RK_ROW_)
#undef CLI_RK_ROW_
[OPT_JOB_PROGRAM] = {NULL, 0, CT_STR, 0, NULL, NULL, "job.program", "PROGRAM", NULL, 0, 0,
	"the training script or program (the first positional argument)", NULL, 0},
[OPT_JOB_ARGS] = {NULL, 0, CT_ARGV, 0, NULL, NULL, "job.args", "ARG", NULL, 0, 0,
	"its arguments (the positional arguments after it)", NULL, 0},
[OPT_JOB_ENV] = {NULL, 0, CT_ENV, 0, NULL, NULL, "job.env", "NAME=VALUE", NULL, 0, 0,
	"extra environment of the workers", NULL, 0},
[OPT_HELP] = {"help", 'h', CT_ACTION, TR, NULL, NULL, NULL, NULL, NULL, 0, 0, "this text",
	NULL, 0},
[OPT_VERSION] = {"version", 0, CT_ACTION, 0, NULL, NULL, NULL, NULL, NULL, 0, 0,
	"crun's version", NULL, 0},
[OPT_PRINT_COMPLETION] = {"print_completion", 0, CT_ACTION, TR, NULL, NULL, NULL, "SHELL",
	"bash|zsh|tcsh", 0, 0, "print a shell completion script and exit", NULL, 0},
[OPT_PRINT_SCHEMA] = {"print_schema", 0, CT_ACTION, CF_AGENT, NULL, NULL, NULL, NULL, NULL, 0, 0,
	"print the JSON schema of --config and exit", NULL, 0},
[OPT_PRINT_CONFIG] = {"print_config", 0, CT_ACTION, CF_AGENT, NULL, NULL, NULL, NULL, NULL, 0, 0,
	"check the configuration, print every resolved setting as JSON and exit", NULL, 0},
[OPT_PRINT_MAN] = {"print_man", 0, CT_ACTION, CF_HIDDEN, NULL, NULL, NULL, NULL, NULL, 0, 0,
	"print this program's man page (roff) and exit", NULL, 0},
};
/* clang-format on */
#undef TR

int cli_fail(struct cli *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return CRUN_EINVAL;
}

const char *cli_keep(struct cli *c, const char *s)
{
	char *d;

	if (!s || c->nstrs >= (int)ARRAY_SIZE(c->strs))
		return NULL;
	d = str_dup(s);
	if (d)
		c->strs[c->nstrs++] = d;
	return d;
}

static int keep_field(struct cli *c, enum cli_id id, const char *v)
{
	const char **dst = (const char **)((char *)&c->cfg + cli_opts[id].off);

	if (!*v) {
		*dst = NULL;
		return 0;
	}
	*dst = cli_keep(c, v);
	return *dst ? 0 : cli_fail(c, "out of memory");
}

/* ---- generic appliers (the value was checked against the row's type) ---- */

static int set_bool(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	*(int *)((char *)&c->cfg + cli_opts[id].off) = cli_on(x, id);
	return 0;
}

static int set_int(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	uint64_t u;

	if (parse_u64(v, &u) < 0)
		return CRUN_EINVAL; /* checked before */
	*(int *)((char *)&c->cfg + cli_opts[id].off) = (int)u;
	return 0;
}

static int set_ms(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	uint64_t ms;

	if (parse_seconds_ms(v, &ms) < 0 || ms > UINT32_MAX)
		return cli_fail(c, "%s: invalid number of seconds '%s'", x->who[id], v);
	*(uint32_t *)((char *)&c->cfg + cli_opts[id].off) = (uint32_t)ms;
	return 0;
}

static int set_str(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	return keep_field(c, id, v);
}

/* ---- torchrun's rows ------------------------------------------------------ */

static int ap_nnodes(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	const char *colon = strchr(v, ':');
	uint64_t lo, hi;
	char a[32];

	if (!colon) {
		if (parse_uint_range(v, 1, 65536, &lo) < 0)
			return cli_fail(c, "%s: invalid value '%s' (expected N or MIN:MAX)",
					x->who[id], v);
		c->cfg.nnodes = (int)lo;
		return 0;
	}
	if ((size_t)(colon - v) >= sizeof(a))
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	memcpy(a, v, (size_t)(colon - v));
	a[colon - v] = '\0';
	if (parse_uint_range(a, 1, 65536, &lo) < 0 ||
	    parse_uint_range(colon + 1, 1, 65536, &hi) < 0 || lo > hi)
		return cli_fail(c,
				"%s: invalid value '%s' (expected N or MIN:MAX with 0 < MIN <= "
				"MAX)",
				x->who[id], v);
	/* --standalone is one node on a private store: MIN:MAX with a MIN of 1 is
	 * accepted as torchrun does, and runs at once (torchrun waits out a 30 s
	 * last call for nodes that cannot join). A MIN above 1 is refused later. */
	if (cli_on(x, OPT_STANDALONE) && lo == 1)
		hi = 1;
	if (lo != hi && !cli_elastic(x->val[OPT_RDZV_BACKEND]) && !cli_on(x, OPT_STANDALONE))
		return cli_fail(c, "%s=%s: elastic MIN:MAX needs --rdzv_backend=c10d or etcd",
				x->who[id], v);
	c->cfg.nnodes = (int)lo;
	c->cfg.min_nnodes = (int)lo;
	c->cfg.max_nnodes = (int)hi;
	return 0;
}

static int ap_nproc(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	int r = cli_nproc(v, &c->cfg.nproc_per_node);

	if (r == CRUN_ENOTSUP)
		return cli_fail(c, "%s: '%s' given but no %s was found", x->who[id], v,
				strcmp(v, "xpu") == 0 ? "Intel XPU" : "NVIDIA GPU");
	if (r < 0)
		return cli_fail(c,
				"%s: invalid value '%s' (expected an integer 1-%d, auto, cpu, gpu "
				"or xpu)",
				x->who[id], v, CRUN_AGENT_MAX_LOCAL);
	return 0;
}

static int ap_backend(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	bool standalone = cli_on(x, OPT_STANDALONE);

	if (cli_elastic(v) && !standalone) {
		/* etcd-v2 is torchrun's other name for the same etcd backend */
		c->cfg.rdzv_backend = strcmp(v, "c10d") == 0 ? "c10d" : "etcd";
		c->cfg.master_port = strcmp(v, "c10d") == 0 ? 29400 : 2379; /* torchrun's ports */
	} else if (strcmp(v, "static") != 0 && !standalone) {
		return cli_fail(c,
				"%s=%s is not supported by crun yet (use static or --standalone)",
				x->who[id], v);
	}
	return 0;
}

/* The endpoint replaces master_addr/master_port (applied after them). */
static bool endpoint_used(const struct cli_ctx *x)
{
	return cli_given(x, OPT_RDZV_ENDPOINT) && !cli_on(x, OPT_STANDALONE);
}

static int ap_endpoint(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	bool c10d = strcmp(c->cfg.rdzv_backend, "c10d") == 0;
	char host[256];
	uint16_t port = 0;

	if (!endpoint_used(x))
		return 0;
	if (strcmp(c->cfg.rdzv_backend, "etcd") == 0) {
		/* A list of members: checked whole, kept whole. */
		if (rdzv_endpoint_check("etcd", v, c->err, sizeof(c->err)) < 0)
			return CRUN_EINVAL;
		c->cfg.master_addr = cli_keep(c, v);
		return c->cfg.master_addr ? 0 : cli_fail(c, "out of memory");
	}
	if (parse_host_port(v, 0, host, sizeof(host), &port) < 0 || !host[0])
		return cli_fail(c, "%s: invalid endpoint '%s' (expected HOST:PORT)", x->who[id], v);
	if (port == 0 && c10d)
		port = 29400;
	if (port == 0)
		return cli_fail(c, "%s: the static backend needs a port: '%s'", x->who[id], v);
	c->cfg.master_addr = cli_keep(c, host);
	c->cfg.master_port = port;
	return c->cfg.master_addr ? 0 : cli_fail(c, "out of memory");
}

static int ap_rdzv_id(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	if (cli_on(x, OPT_STANDALONE))
		return 0; /* torchrun: a fresh uuid */
	if (!*v || strlen(v) >= 200 || strchr(v, '/'))
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.rdzv_id = cli_keep(c, v);
	return 0;
}

static int ap_role(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	if (!*v || strlen(v) >= 64)
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.role = cli_keep(c, v);
	return 0;
}

/* "0".."3" for every rank, or "0:1,1:2" per local rank (others 0). */
static int ap_std(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	int nproc = c->cfg.nproc_per_node;
	int **dst = id == OPT_TEE ? &c->tee : &c->redirects;
	int *arr;
	uint64_t n;

	free(*dst);
	arr = *dst = calloc((size_t)nproc, sizeof(int));
	if (!arr)
		return cli_fail(c, "out of memory");
	if (id == OPT_TEE)
		c->cfg.tee = arr;
	else
		c->cfg.redirects = arr;
	if (!strchr(v, ':')) {
		if (parse_uint_range(v, 0, 3, &n) < 0)
			return cli_fail(c,
					"%s: invalid value '%s' (expected 0-3 or a map like "
					"0:1,1:2)",
					x->who[id], v);
		for (int i = 0; i < nproc; i++)
			arr[i] = (int)n;
		return 0;
	}
	for (const char *p = v; *p;) {
		size_t len = strcspn(p, ",");
		char item[32], *colon;
		uint64_t rank;

		if (len == 0 || len >= sizeof(item))
			return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
		memcpy(item, p, len);
		item[len] = '\0';
		colon = strchr(item, ':');
		if (!colon)
			return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
		*colon = '\0';
		if (parse_u64(item, &rank) < 0 || parse_uint_range(colon + 1, 0, 3, &n) < 0)
			return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
		if (rank < (uint64_t)nproc)
			arr[rank] = (int)n;
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

static int ap_filter(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	int nproc = c->cfg.nproc_per_node;
	uint64_t u;

	if (!*v)
		return 0;
	free(c->console_ranks);
	c->console_ranks = calloc((size_t)nproc, 1);
	if (!c->console_ranks)
		return cli_fail(c, "out of memory");
	for (const char *p = v; *p;) {
		size_t len = strcspn(p, ",");
		char item[16];

		if (len == 0 || len >= sizeof(item))
			return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
		memcpy(item, p, len);
		item[len] = '\0';
		if (parse_uint_range(item, 0, (uint64_t)nproc - 1, &u) < 0)
			return cli_fail(c, "%s: '%s' is not a local rank below %d", x->who[id],
					item, nproc);
		c->console_ranks[u] = 1;
		p += len;
		if (*p == ',')
			p++;
	}
	c->cfg.console_ranks = c->console_ranks;
	return 0;
}

static int ap_master_addr(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	if (endpoint_used(x))
		return 0;
	if (!*v || strlen(v) >= 255)
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.master_addr = cli_keep(c, v);
	return 0;
}

static int ap_master_port(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	uint64_t u;

	if (endpoint_used(x) || parse_u64(v, &u) < 0)
		return 0;
	c->cfg.master_port = (uint16_t)u;
	return 0;
}

static int ap_logs_specs(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	/* torchrun loads entry point torchrun.logs_specs[v]; its own "default"
	 * is DefaultLogsSpecs, the layout crun writes. Any other name is a Python
	 * class crun cannot load. */
	if (strcmp(v, "default") != 0)
		return cli_fail(c,
				"%s: '%s' names a Python LogsSpecs plugin (entry point "
				"torchrun.logs_specs), which crun cannot load; only 'default' "
				"(torchrun's DefaultLogsSpecs layout) is supported",
				x->who[id], v);
	return 0;
}

static int ap_signals(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	if (supervise_parse_signals(v, &c->cfg.signals_to_handle) < 0)
		return cli_fail(c, "%s: invalid signal list '%s'", x->who[id], v);
	return 0;
}

static int ap_event(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	c->event_log_handler = strcmp(v, "console") == 0 ? "console" : "null";
	return 0;
}

static int ap_status(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	char host[256];
	uint16_t port;

	if (!*v || strcmp(v, "off") == 0) {
		c->status_listen = NULL;
		return 0;
	}
	if (parse_host_port(v, 0, host, sizeof(host), &port) < 0 || !host[0] || !strrchr(v, ':'))
		return cli_fail(c, "%s: expected ADDR:PORT (port 0: any free one), got '%s'",
				x->who[id], v);
	c->status_listen = cli_keep(c, v);
	return 0;
}

static int ap_log_level(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	/* Python's logging names (LOGLEVEL is torchrun's), plus notice and trace. */
	int l = log_level_from_name(v);

	if (l >= 0) {
		c->log_level = l;
		return 0;
	}
	return cli_fail(c, "%s: invalid log level '%s' (choose from critical, " LOG_LEVEL_NAMES ")",
			x->who[id], v);
}

/* rendezvous.<key> from the file: "key=value," into x->rk_conf, checked by
 * the same rows as --rdzv_conf (cli_rdzv.c) so the two cannot disagree. */
static int ap_rk(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	const char *key = strchr(cli_opts[id].json, '.') + 1;
	size_t len = strlen(x->rk_conf);
	char one[128], err[256];

	snprintf(one, sizeof(one), "%s=%s", key, v);
	if (cli_rdzv_conf_check("c10d", one, err, sizeof(err)) < 0)
		return cli_fail(c, "%s: %s", x->who[id], err);
	if (len + strlen(one) + 2 > sizeof(x->rk_conf))
		return cli_fail(c, "%s: rendezvous settings too long", x->who[id]);
	snprintf(x->rk_conf + len, sizeof(x->rk_conf) - len, "%s%s", len ? "," : "", one);
	return 0;
}

/* ---- devices -------------------------------------------------------------- */

static int count_glob(const char *pattern)
{
	glob_t g;
	int n = 0;

	if (glob(pattern, 0, NULL, &g) == 0) {
		n = (int)g.gl_pathc;
		globfree(&g);
	}
	return n;
}

int cli_gpu_count(void)
{
	/* The driver lists one directory per GPU; no CUDA library is loaded. */
	int n = count_glob("/proc/driver/nvidia/gpus/*");

	return n ? n : count_glob("/dev/nvidia[0-9]*");
}

int cli_xpu_count(void)
{
	/* Intel GPUs are DRM render nodes driven by i915 or xe. */
	return count_glob("/sys/class/drm/renderD*/device/driver/module/drivers/pci:i915") +
	       count_glob("/sys/class/drm/renderD*/device/driver/module/drivers/pci:xe");
}

/* The CPUs this process may run on, as torchrun's os.sched_getaffinity: under
 * taskset, a cpuset cgroup or Slurm's --cpus-per-task the online count would
 * oversubscribe. The mask grows for hosts past CPU_SETSIZE. */
static long usable_cpus(void)
{
	for (int ncpu = CPU_SETSIZE; ncpu <= (1 << 20); ncpu *= 2) {
		cpu_set_t *set = CPU_ALLOC(ncpu);
		size_t size = CPU_ALLOC_SIZE(ncpu);
		long n;

		if (!set)
			break;
		if (sched_getaffinity(0, size, set) == 0) {
			n = CPU_COUNT_S(size, set);
			CPU_FREE(set);
			return n;
		}
		CPU_FREE(set);
		if (errno != EINVAL)
			break;
	}
	return sysconf(_SC_NPROCESSORS_ONLN);
}

int cli_nproc(const char *v, int *ret)
{
	long cpus = usable_cpus();
	uint64_t n;
	int dev;

	if (cpus < 1)
		cpus = 1;
	cpus = MIN(cpus, CRUN_AGENT_MAX_LOCAL);
	if (strcmp(v, "cpu") == 0) {
		*ret = (int)cpus;
		return 0;
	}
	if (strcmp(v, "gpu") == 0 || strcmp(v, "xpu") == 0) {
		dev = v[0] == 'g' ? cli_gpu_count() : cli_xpu_count();
		if (dev == 0)
			return CRUN_ENOTSUP;
		*ret = MIN(dev, CRUN_AGENT_MAX_LOCAL);
		return 0;
	}
	if (strcmp(v, "auto") == 0) {
		/* torchrun: the accelerator's device count, else the CPUs. */
		dev = cli_gpu_count();
		if (dev == 0)
			dev = cli_xpu_count();
		*ret = dev > 0 ? MIN(dev, CRUN_AGENT_MAX_LOCAL) : (int)cpus;
		return 0;
	}
	TRY(parse_uint_range(v, 1, CRUN_AGENT_MAX_LOCAL, &n));
	*ret = (int)n;
	return 0;
}

/* --stack_dump_on_stop: the choices (checked already) as the config's int. */
static int ap_stack_dump(struct cli *c, struct cli_ctx *x, int id, const char *v)
{
	(void)x;
	(void)id;
	c->cfg.stack_dump_on_stop = 0;
	if (strcmp(v, "always") == 0)
		c->cfg.stack_dump_on_stop = 1;
	else if (strcmp(v, "never") == 0)
		c->cfg.stack_dump_on_stop = -1;
	return 0;
}
