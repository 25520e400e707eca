/* cli.c: crun's one option table (cli_int.h) and the loop that turns the
 * command line, a JSON config (crun-agent), the environment and the table's
 * defaults into a crun_agent_config_t. torchrun's rules (torch-compat §4.1):
 * both spellings of every flag, argparse's unique-prefix abbreviations (for
 * torchrun's flags only, so crun's own flags never make a torchrun
 * abbreviation ambiguous), "--flag=value" and "--flag value", PET_<DEST>
 * environment defaults, options ending at the first non-option (the program).
 * Precedence: flag > JSON file > environment > default.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/cli_int.h"
#include "rendezvous/rdzv.h"
#include "common/common.h"

#define CFG(field) offsetof(crun_agent_config_t, field)

static int ap_nnodes(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_nproc(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_backend(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_endpoint(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_rdzv_id(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_role(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_std(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_filter(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_master_addr(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_master_port(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_logs_specs(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_signals(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_event(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_status(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_log_level(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int ap_rk(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int set_bool(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int set_int(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int set_ms(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);
static int set_str(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v);

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
	"warning, as torchrun ignores them); c10d: the rendezvous keys below; etcd: those "
	"and protocol, cacert, cert, key, key_prefix, username, password_file", NULL, 0},
[OPT_STANDALONE] = {"standalone", 0, CT_FLAG, TR, NULL, "PET_STANDALONE",
	"rendezvous.standalone", NULL, NULL, 0, 0,
	"one node, private store on an ephemeral port, a uuid run id", set_bool, CFG(standalone)},
[OPT_MAX_RESTARTS] = {"max_restarts", 0, CT_INT, TR, "0", "PET_MAX_RESTARTS",
	"restart.max_restarts", "N", NULL, 0, INT32_MAX,
	"restarts of the worker group on failure", set_int, CFG(max_restarts)},
[OPT_MONITOR_INTERVAL] = {"monitor_interval", 0, CT_SECS, TR, "0.1", "PET_MONITOR_INTERVAL",
	"restart.monitor_interval", "SECONDS", NULL, 0, 0,
	"accepted; crun reacts to worker exits at once", NULL, 0},
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
	0, 0, "run the script with runpy.run_path (sys.path[0] is the working directory)",
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
[OPT_STATUS] = {"status", 0, CT_STR, 0, NULL, "PET_STATUS", "status.listen", "ADDR:PORT", NULL,
	0, 0, "serve /healthz, /status and /metrics over HTTP [crun: off]", ap_status, 0},
[OPT_LOG_LEVEL] = {"log_level", 0, CT_STR, 0, NULL, "PET_LOG_LEVEL CRUN_LOG_LEVEL LOGLEVEL",
	"daemon.log_level", "LEVEL", NULL, 0, 0,
	"error, warning, info, debug or trace (LOGLEVEL as torchrun) [warning]", ap_log_level, 0},
[OPT_SECRET_FILE] = {"auth_secret_file", 0, CT_STR, 0, NULL, "PET_AUTH_SECRET_FILE",
	"security.secret_file", "FILE", NULL, 0, 0,
	"shared secret for crun-to-crun connections", set_str, CFG(auth_secret_file)},
[OPT_STORE_ALLOW_ANY] = {"worker_store_allow_any", 0, CT_FLAG, 0, NULL,
	"PET_WORKER_STORE_ALLOW_ANY", "security.worker_store_allow_any", NULL, NULL, 0, 0,
	"the worker store accepts any peer address (NAT); default: loopback and the round's "
	"nodes", set_bool, CFG(worker_store_allow_any)},
[OPT_CONFIG] = {"config", 0, CT_STR, CF_AGENT, NULL, NULL, NULL, "FILE.json", NULL, 0, 0,
	"read settings from a JSON file (configs/crun-agent.schema.json); flags win", NULL, 0},
[OPT_RK_JOIN] = {NULL, 0, CT_SECS, CF_RDZVKEY, "600", NULL, "rendezvous.join_timeout",
	"SECONDS", NULL, 0, 0, "c10d: time for the first round to gather min nodes", ap_rk, 0},
[OPT_RK_LAST_CALL] = {NULL, 0, CT_SECS, CF_RDZVKEY, "30", NULL, "rendezvous.last_call_timeout",
	"SECONDS", NULL, 0, 0, "c10d: extra wait for more nodes once min joined", ap_rk, 0},
[OPT_RK_CLOSE] = {NULL, 0, CT_SECS, CF_RDZVKEY, "30", NULL, "rendezvous.close_timeout",
	"SECONDS", NULL, 0, 0, "c10d: wait for the others to read a closed job", ap_rk, 0},
[OPT_RK_READ] = {NULL, 0, CT_SECS, CF_RDZVKEY, "60", NULL, "rendezvous.read_timeout",
	"SECONDS", NULL, 0, 0, "c10d: store read timeout", ap_rk, 0},
[OPT_RK_IS_HOST] = {NULL, 0, CT_FLAG, CF_RDZVKEY, NULL, NULL, "rendezvous.is_host", NULL, NULL,
	0, 0, "c10d: this agent serves the rendezvous store [auto: its address]", ap_rk, 0},
[OPT_RK_HEARTBEAT] = {NULL, 0, CT_SECS, CF_RDZVKEY, "1", NULL, "rendezvous.heartbeat_interval",
	"SECONDS", NULL, 0, 0, "c10d: lease renewal period", ap_rk, 0},
[OPT_RK_LEASE_TTL] = {NULL, 0, CT_SECS, CF_RDZVKEY, "3", NULL, "rendezvous.lease_ttl",
	"SECONDS", NULL, 0, 0, "c10d: a node whose lease is this old is gone", ap_rk, 0},
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

static bool on(const struct cli_ctx *x, enum cli_id id)
{
	return x->val[id] && strcmp(x->val[id], "0") != 0;
}

static bool given(const struct cli_ctx *x, enum cli_id id)
{
	return x->val[id] && *x->val[id];
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

static int set_bool(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	*(int *)((char *)&c->cfg + cli_opts[id].off) = on(x, id);
	return 0;
}

static int set_int(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	uint64_t u;

	if (parse_u64(v, &u) < 0)
		return CRUN_EINVAL; /* checked before */
	*(int *)((char *)&c->cfg + cli_opts[id].off) = (int)u;
	return 0;
}

static int set_ms(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	uint64_t ms;

	if (parse_seconds_ms(v, &ms) < 0 || ms > UINT32_MAX)
		return cli_fail(c, "%s: invalid number of seconds '%s'", x->who[id], v);
	*(uint32_t *)((char *)&c->cfg + cli_opts[id].off) = (uint32_t)ms;
	return 0;
}

static int set_str(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	return keep_field(c, id, v);
}

/* ---- torchrun's rows ------------------------------------------------------ */

/* Backends with elastic membership (etcd-v2: torchrun's other etcd name). */
static bool elastic(const char *backend)
{
	return strcmp(backend, "c10d") == 0 || strcmp(backend, "etcd") == 0 ||
	       strcmp(backend, "etcd-v2") == 0;
}

static int ap_nnodes(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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
	if (lo != hi && !elastic(x->val[OPT_RDZV_BACKEND]))
		return cli_fail(c, "%s=%s: elastic MIN:MAX needs --rdzv_backend=c10d or etcd",
				x->who[id], v);
	c->cfg.nnodes = (int)lo;
	c->cfg.min_nnodes = (int)lo;
	c->cfg.max_nnodes = (int)hi;
	return 0;
}

static int ap_nproc(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_backend(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	bool standalone = on(x, OPT_STANDALONE);

	if (elastic(v) && !standalone) {
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
	return given(x, OPT_RDZV_ENDPOINT) && !on(x, OPT_STANDALONE);
}

static int ap_endpoint(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_rdzv_id(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	if (on(x, OPT_STANDALONE))
		return 0; /* torchrun: a fresh uuid */
	if (!*v || strlen(v) >= 200 || strchr(v, '/'))
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.rdzv_id = cli_keep(c, v);
	return 0;
}

static int ap_role(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	if (!*v || strlen(v) >= 64)
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.role = cli_keep(c, v);
	return 0;
}

/* "0".."3" for every rank, or "0:1,1:2" per local rank (others 0). */
static int ap_std(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_filter(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_master_addr(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	if (endpoint_used(x))
		return 0;
	if (!*v || strlen(v) >= 255)
		return cli_fail(c, "%s: invalid value '%s'", x->who[id], v);
	c->cfg.master_addr = cli_keep(c, v);
	return 0;
}

static int ap_master_port(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	uint64_t u;

	if (endpoint_used(x) || parse_u64(v, &u) < 0)
		return 0;
	c->cfg.master_port = (uint16_t)u;
	return 0;
}

static int ap_logs_specs(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_signals(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	if (supervise_parse_signals(v, &c->cfg.signals_to_handle) < 0)
		return cli_fail(c, "%s: invalid signal list '%s'", x->who[id], v);
	return 0;
}

static int ap_event(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	c->event_log_handler = strcmp(v, "console") == 0 ? "console" : "null";
	return 0;
}

static int ap_status(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
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

static int ap_log_level(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	/* Python's logging names (LOGLEVEL is torchrun's), plus crun's trace. */
	static const struct {
		const char *name;
		int level;
	} names[] = {{"critical", LL_ERROR}, {"fatal", LL_ERROR}, {"error", LL_ERROR},
		     {"warning", LL_WARN},   {"warn", LL_WARN},	  {"info", LL_INFO},
		     {"debug", LL_DEBUG},    {"trace", LL_TRACE}};

	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (strcasecmp(v, names[i].name) == 0) {
			c->log_level = names[i].level;
			return 0;
		}
	return cli_fail(c,
			"%s: invalid log level '%s' (choose from critical, error, warning, info, "
			"debug, trace)",
			x->who[id], v);
}

/* rendezvous.<key> from the file: "key=value," into x->rk_conf, checked by
 * the c10d parser itself so the two cannot disagree on a key. */
static int ap_rk(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	const char *key = strchr(cli_opts[id].json, '.') + 1;
	size_t len = strlen(x->rk_conf);
	char one[128], err[256];

	snprintf(one, sizeof(one), "%s=%s", key, v);
	if (rdzv_conf_check("c10d", one, err, sizeof(err)) < 0)
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

int cli_nproc(const char *v, int *ret)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
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

/* ---- collecting values ------------------------------------------------------ */

static void normalise(char *s)
{
	for (; *s; s++)
		if (*s == '-')
			*s = '_';
}

static bool row_on_cli(const struct cli_opt *o, enum cli_prog prog)
{
	return o->name && (!(o->flags & CF_AGENT) || prog == CLI_AGENT);
}

/* Exact name, else argparse's unique prefix among torchrun's flags. -1
 * unknown, -2 ambiguous. */
static int find_long(const char *name, enum cli_prog prog)
{
	size_t l = strlen(name);
	int hit = -1;

	for (int i = 0; i < OPT__MAX; i++)
		if (row_on_cli(&cli_opts[i], prog) && strcmp(cli_opts[i].name, name) == 0)
			return i;
	for (int i = 0; i < OPT__MAX; i++) {
		if (!row_on_cli(&cli_opts[i], prog) || !(cli_opts[i].flags & CF_TORCHRUN) ||
		    strncmp(cli_opts[i].name, name, l) != 0)
			continue;
		if (hit >= 0)
			return -2;
		hit = i;
	}
	return hit;
}

static bool takes_value(const struct cli_opt *o)
{
	return o->type != CT_FLAG && !(o->type == CT_ACTION && !o->metavar);
}

/* One option at argv[*i]; advances *i past its value. */
static int read_flag(struct cli *c, struct cli_ctx *x, int argc, char *const *argv, int *i)
{
	const char *a = argv[*i], *eq = NULL;
	char name[64];
	int id = -1;

	if (a[1] == '-') {
		size_t l = strcspn(a + 2, "=");

		if (a[2 + l] == '=')
			eq = a + 3 + l;
		if (l == 0 || l >= sizeof(name))
			return cli_fail(c, "unrecognized argument: %s", a);
		memcpy(name, a + 2, l);
		name[l] = '\0';
		normalise(name);
		id = find_long(name, c->prog);
		if (id == -2)
			return cli_fail(c, "ambiguous option: %.*s", (int)(l + 2), a);
		if (id < 0)
			return cli_fail(c, "unrecognized argument: %.*s", (int)(l + 2), a);
		snprintf(x->who[id], sizeof(x->who[id]), "argument %.*s", (int)(l + 2), a);
	} else {
		for (int k = 0; k < OPT__MAX; k++)
			if (cli_opts[k].short_name && cli_opts[k].short_name == a[1])
				id = k;
		if (id < 0)
			return cli_fail(c, "unrecognized argument: %s", a);
		snprintf(x->who[id], sizeof(x->who[id]), "argument -%c", a[1]);
		if (a[2])
			eq = a + 2;
	}
	x->src[id] = SRC_FLAG;
	if (!takes_value(&cli_opts[id])) {
		if (eq)
			return cli_fail(c, "%s: ignored explicit argument '%s'", x->who[id], eq);
		x->val[id] = "1";
		return 0;
	}
	if (!eq) {
		if (*i + 1 >= argc)
			return cli_fail(c, "%s: expected one argument", x->who[id]);
		eq = argv[++*i];
	}
	x->val[id] = eq;
	return 0;
}

/* Environment aliases of every row nothing stronger has set. */
static int read_env(struct cli *c, struct cli_ctx *x)
{
	for (int k = 0; k < OPT__MAX; k++) {
		const char *aliases = cli_opts[k].env, *e = NULL;
		char name[64];

		if (!aliases || x->src[k] >= SRC_ENV || !x->env)
			continue;
		for (const char *p = aliases; *p && !e;) {
			size_t l = strcspn(p, " ");

			snprintf(name, sizeof(name), "%.*s", (int)l, p);
			e = env_get(x->env, name);
			p += l;
			if (*p == ' ')
				p++;
		}
		if (!e)
			continue;
		snprintf(x->who[k], sizeof(x->who[k]), "%s", name);
		if (cli_opts[k].type == CT_FLAG) {
			int64_t b;

			/* torchrun's check_env: int(value) != 0 */
			if (parse_i64(e, &b) < 0)
				return cli_fail(c, "%s: invalid int value '%s'", name, e);
			e = b ? "1" : "0";
		}
		x->val[k] = e;
		x->src[k] = SRC_ENV;
	}
	return 0;
}

/* Checks v against the row's type and choices before its apply runs. */
static int check_value(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v)
{
	const struct cli_opt *o = &cli_opts[id];
	uint64_t u;

	if (o->choices) {
		size_t l = strlen(v);
		bool ok = false;

		for (const char *p = o->choices; *p && !ok;) {
			size_t n = strcspn(p, "|");

			ok = n == l && strncmp(p, v, l) == 0;
			p += n;
			if (*p == '|')
				p++;
		}
		if (!ok) {
			char list[128];

			snprintf(list, sizeof(list), "%s", o->choices);
			for (char *s = list; *s; s++)
				if (*s == '|')
					*s = ',';
			return cli_fail(c, "%s: invalid choice '%s' (choose from %s)", x->who[id],
					v, list);
		}
	}
	if (o->type == CT_INT && parse_uint_range(v, (uint64_t)o->min, (uint64_t)o->max, &u) < 0)
		return cli_fail(c, "%s: invalid int value '%s' (expected %lld-%lld)", x->who[id], v,
				(long long)o->min, (long long)o->max);
	if (o->type == CT_SECS && (parse_seconds_ms(v, &u) < 0 || u > UINT32_MAX))
		return cli_fail(c, "%s: invalid float value '%s' (seconds)", x->who[id], v);
	return 0;
}

/* ---- cross-row rules ------------------------------------------------------------ */

/* Static and standalone read only the timeouts; torchrun ignores the rest, so
 * crun warns once instead of failing (torchrun-parity issue 11, item 8). */
static int static_conf(struct cli *c, struct cli_ctx *x, const char *v, const char *mode)
{
	char unknown[256] = "";

	for (const char *p = v; *p;) {
		size_t len = strcspn(p, ",");
		char item[256], *eq;
		uint64_t ms;

		if (len >= sizeof(item))
			return cli_fail(c, "%s: item too long", x->who[OPT_RDZV_CONF]);
		memcpy(item, p, len);
		item[len] = '\0';
		p += len;
		if (*p == ',')
			p++;
		eq = strchr(item, '=');
		if (!eq || eq == item || !eq[1])
			return cli_fail(c,
					"%s: '%s' is not key=value with a non-empty key and value",
					x->who[OPT_RDZV_CONF], item);
		*eq = '\0';
		if (strcmp(item, "timeout") && strcmp(item, "join_timeout") &&
		    strcmp(item, "read_timeout")) {
			size_t ul = strlen(unknown);

			snprintf(unknown + ul, sizeof(unknown) - ul, "%s'%.60s'", ul ? ", " : "",
				 item);
			continue;
		}
		if (parse_seconds_ms(eq + 1, &ms) < 0 || ms == 0 || ms > UINT32_MAX)
			return cli_fail(c, "%s: %s=%s is not a number of seconds",
					x->who[OPT_RDZV_CONF], item, eq + 1);
		c->cfg.join_timeout_ms = (uint32_t)ms;
	}
	if (unknown[0])
		snprintf(c->warn, sizeof(c->warn),
			 "%s: ignoring %s: %s reads only timeout, join_timeout and read_timeout",
			 x->who[OPT_RDZV_CONF], unknown, mode);
	return 0;
}

static int rdzv_conf(struct cli *c, struct cli_ctx *x, bool auto_standalone)
{
	const char *v = x->val[OPT_RDZV_CONF] ? x->val[OPT_RDZV_CONF] : "";
	char all[1024];

	if (!x->rk_conf[0] && !*v)
		return 0;
	if (elastic(c->cfg.rdzv_backend) && !c->cfg.standalone) {
		/* File keys first, so a --rdzv_conf key given as a flag wins. */
		snprintf(all, sizeof(all), "%s%s%s", x->rk_conf, x->rk_conf[0] && *v ? "," : "", v);
		if (rdzv_conf_check(c->cfg.rdzv_backend, all, c->err, sizeof(c->err)) < 0)
			return CRUN_EINVAL;
		c->cfg.rdzv_conf = cli_keep(c, all);
		return 0;
	}
	if (x->rk_conf[0])
		snprintf(c->warn, sizeof(c->warn),
			 "rendezvous settings '%.400s' are for --rdzv_backend=c10d, ignoring",
			 x->rk_conf);
	return static_conf(c, x, v,
			   c->cfg.standalone
			       ? (auto_standalone ? "a one-node run (a private store, as "
						    "torchrun's c10d on localhost:0)"
						  : "--standalone")
			       : "the static backend");
}

/* torchrun 2.x run.py: a static run of at most one node with neither
 * --rdzv_endpoint nor --master_port becomes c10d on localhost:0 with a uuid
 * run id, so two such runs on a host do not fight over port 29500. crun's
 * --standalone is exactly that. */
static bool single_node_run(const struct cli *c, const struct cli_ctx *x)
{
	int max = c->cfg.max_nnodes ? c->cfg.max_nnodes : c->cfg.nnodes;

	return !c->cfg.standalone && strcmp(c->cfg.rdzv_backend, "static") == 0 &&
	       !given(x, OPT_RDZV_ENDPOINT) && x->src[OPT_MASTER_PORT] == SRC_NONE && max == 1;
}

static int cross_checks(struct cli *c, struct cli_ctx *x)
{
	bool auto_standalone = single_node_run(c, x);

	if (auto_standalone)
		c->cfg.standalone = 1;
	if (elastic(c->cfg.rdzv_backend) && !c->cfg.max_nnodes)
		c->cfg.min_nnodes = c->cfg.max_nnodes = c->cfg.nnodes;
	if (c->cfg.standalone && c->cfg.nnodes != 1)
		return cli_fail(c, "--standalone runs one node, but %s=%d",
				x->who[OPT_NNODES][0] ? x->who[OPT_NNODES] : "--nnodes",
				c->cfg.nnodes);
	if (on(x, OPT_MODULE) && on(x, OPT_NO_PYTHON) && !on(x, OPT_RUN_PATH))
		return cli_fail(c, "Don't use both the '--no-python' flag and the '--module' flag "
				   "at the same time.");
	if (c->cfg.node_rank >= c->cfg.nnodes)
		return cli_fail(c, "%s: %d is not below --nnodes=%d",
				x->src[OPT_NODE_RANK] > SRC_DEFAULT ? x->who[OPT_NODE_RANK]
								    : "--node_rank",
				c->cfg.node_rank, c->cfg.nnodes);
	return rdzv_conf(c, x, auto_standalone);
}

/* ---- the worker command ------------------------------------------------------------ */

/* torchrun runs every program under Python unless --no_python; crun also
 * execs ELF binaries and scripts whose shebang names no Python directly. */
static bool runs_directly(const char *prog)
{
	char head[256];
	char *path = NULL;
	ssize_t n;
	int fd;

	fd = open(prog, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && !strchr(prog, '/')) {
		path = spawn_resolve(prog);
		if (path)
			fd = open(path, O_RDONLY | O_CLOEXEC);
	}
	free(path);
	if (fd < 0)
		return false;
	n = read(fd, head, sizeof(head) - 1);
	fd_close(fd);
	if (n < 4)
		return false;
	head[n] = '\0';
	if (memcmp(head, "\177ELF", 4) == 0)
		return true;
	if (head[0] == '#' && head[1] == '!') {
		head[strcspn(head, "\n")] = '\0';
		return !strstr(head, "python");
	}
	return false;
}

/* torchrun's run_script_path(): runpy.run_path in the worker's interpreter. */
static const char runpy_src[] = "import runpy, sys; sys.argv = sys.argv[1:]; "
				"runpy.run_path(sys.argv[0], run_name='__main__')";

static int build_argv(struct cli *c, const struct cli_ctx *x, const char *prog, char *const *rest,
		      int nrest)
{
	size_t pl = strlen(prog);
	/* The command line builds the runpy command itself, so cfg.run_path (for
	 * API callers) stays 0 and nothing wraps it twice. */
	bool module = on(x, OPT_MODULE), run_path = on(x, OPT_RUN_PATH);
	bool is_py = pl >= 3 && strcmp(prog + pl - 3, ".py") == 0;
	bool direct =
	    !run_path && (on(x, OPT_NO_PYTHON) || (!module && !is_py && runs_directly(prog)));
	const char *py = env_get(x->env, "PYTHON_EXEC");
	int n = 0;

	if (!py || !*py)
		py = env_get(x->env, "PYTHON");
	if (!py || !*py)
		py = "python3";
	c->argv = calloc((size_t)nrest + 6, sizeof(char *));
	if (!c->argv)
		return CRUN_ENOMEM;
	if (!direct) {
		c->argv[n++] = str_dup(py);
		c->argv[n++] = str_dup("-u");
		if (run_path) {
			c->argv[n++] = str_dup("-c");
			c->argv[n++] = str_dup(runpy_src);
		} else if (module) {
			c->argv[n++] = str_dup("-m");
		}
	}
	c->argv[n++] = str_dup(prog);
	for (int i = 0; i < nrest; i++)
		c->argv[n++] = str_dup(rest[i]);
	for (int i = 0; i < n; i++)
		if (!c->argv[i])
			return CRUN_ENOMEM;
	c->cfg.argv = (const char *const *)c->argv;
	c->cfg.entrypoint = cli_keep(c, prog);
	return 0;
}

static int program(struct cli *c, struct cli_ctx *x, int i, int argc, char *const *argv)
{
	const char *prog = i < argc ? argv[i] : x->val[OPT_JOB_PROGRAM];
	int nfile = 0;

	if (!prog || !*prog)
		return cli_fail(c, "the following arguments are required: training_script%s",
				c->prog == CLI_AGENT ? " (or job.program in --config)" : "");
	while (c->file_args && c->file_args[nfile])
		nfile++;
	/* A program on the command line replaces the file's program and args. */
	if (i < argc ? build_argv(c, x, prog, argv + i + 1, argc - i - 1)
		     : build_argv(c, x, prog, c->file_args, nfile))
		return cli_fail(c, "out of memory");
	if (c->cfg.nproc_per_node > 1 && !env_get(x->env, "OMP_NUM_THREADS"))
		snprintf(c->note, sizeof(c->note),
			 "\n*****************************************\n"
			 "Setting OMP_NUM_THREADS environment variable for each process to be 1 "
			 "in default, to avoid your system being overloaded, please further tune "
			 "the variable for optimal performance in your application as needed. \n"
			 "*****************************************");
	return 0;
}

/* ---- the loop ------------------------------------------------------------------------ */

static int apply_all(struct cli *c, struct cli_ctx *x)
{
	for (int k = 0; k < OPT__MAX; k++) {
		const struct cli_opt *o = &cli_opts[k];

		if (!x->val[k] && o->def && !(o->flags & CF_RDZVKEY)) {
			x->val[k] = o->def;
			x->src[k] = SRC_DEFAULT;
			snprintf(x->who[k], sizeof(x->who[k]), "--%s", o->name);
		}
	}
	for (int k = 0; k < OPT__MAX; k++) {
		const char *v = x->val[k];

		if (!v || cli_opts[k].type == CT_ACTION)
			continue;
		TRY(check_value(c, x, (enum cli_id)k, v));
		if (cli_opts[k].apply)
			TRY(cli_opts[k].apply(c, x, (enum cli_id)k, v));
	}
	return 0;
}

int cli_parse_prog(struct cli *c, enum cli_prog prog, int argc, char *const *argv, char *const *env)
{
	crun_agent_config_t init = CRUN_AGENT_CONFIG_INIT;
	struct cli_ctx *x;
	int i, r;

	memset(c, 0, sizeof(*c));
	c->cfg = init;
	c->prog = prog;
	c->log_level = -1;
	c->event_log_handler = "null";
	x = calloc(1, sizeof(*x));
	if (!x)
		return cli_fail(c, "out of memory");
	x->env = env;
	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0) {
			i++;
			break;
		}
		if (argv[i][0] != '-' || argv[i][1] == '\0')
			break; /* the program: everything from here is the worker's */
		r = read_flag(c, x, argc, argv, &i);
		if (r < 0)
			goto out;
	}
	r = 0;
	if (x->val[OPT_HELP] || x->val[OPT_VERSION]) {
		c->help = x->val[OPT_HELP] != NULL;
		c->version = !c->help;
		goto out;
	}
	if (x->val[OPT_PRINT_COMPLETION]) {
		r = check_value(c, x, OPT_PRINT_COMPLETION, x->val[OPT_PRINT_COMPLETION]);
		c->completion = r < 0 ? NULL : cli_keep(c, x->val[OPT_PRINT_COMPLETION]);
		goto out;
	}
	if (x->val[OPT_CONFIG]) {
		c->config_path = cli_keep(c, x->val[OPT_CONFIG]);
		r = cli_json_load(c, x, x->val[OPT_CONFIG]);
		if (r < 0)
			goto out;
	}
	r = read_env(c, x);
	if (r < 0)
		goto out;
	r = apply_all(c, x);
	if (r < 0)
		goto out;
	r = cross_checks(c, x);
	if (r < 0)
		goto out;
	r = program(c, x, i, argc, argv);
out:
	free(x);
	return r < 0 ? CRUN_EINVAL : 0;
}

int cli_parse(struct cli *c, int argc, char *const *argv, char *const *env)
{
	return cli_parse_prog(c, CLI_CRUN, argc, argv, env);
}

static void free_list(char **l)
{
	for (int i = 0; l && l[i]; i++)
		free(l[i]);
	free(l);
}

void cli_free(struct cli *c)
{
	free_list(c->argv);
	free_list(c->job_env);
	free_list(c->file_args);
	free(c->redirects);
	free(c->tee);
	free(c->console_ranks);
	for (int i = 0; i < c->nstrs; i++)
		free(c->strs[i]);
	memset(c, 0, sizeof(*c));
}
