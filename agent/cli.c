/* cli.c: torchrun's command line (torch-compat §4.1) into a crun_agent_config_t.
 * Both spellings of every flag, argparse's unique-prefix abbreviations,
 * "--flag=value" and "--flag value", PET_<DEST> environment defaults (an
 * explicit flag wins) and options ending at the first non-option (the
 * program). A flag crun does not implement yet is rejected by name: nothing
 * is silently ignored. Lives in the agent module (not cmd/) so unit tests can
 * drive it.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "rendezvous/rdzv.h"
#include "common/common.h"

enum opt_id {
	O_NNODES,
	O_NPROC,
	O_RDZV_BACKEND,
	O_RDZV_ENDPOINT,
	O_RDZV_ID,
	O_RDZV_CONF,
	O_STANDALONE,
	O_MAX_RESTARTS,
	O_MONITOR_INTERVAL,
	O_START_METHOD,
	O_EVENT_LOG_HANDLER,
	O_ROLE,
	O_MODULE,
	O_NO_PYTHON,
	O_RUN_PATH,
	O_LOG_DIR,
	O_REDIRECTS,
	O_TEE,
	O_LOCAL_RANKS_FILTER,
	O_DUP_STDOUT,
	O_DUP_STDERR,
	O_NODE_RANK,
	O_MASTER_ADDR,
	O_MASTER_PORT,
	O_LOCAL_ADDR,
	O_LOGS_SPECS,
	O_NUMA_BINDING,
	O_SIGNALS,
	O_SHUTDOWN_TIMEOUT,
	O_VIRTUAL_LOCAL_RANK,
	O_HELP,
	O_VERSION,
	O__MAX,
};

struct opt {
	const char *name; /* underscore spelling (= argparse dest) */
	char short_name;
	bool flag; /* store_true */
	bool env;  /* has a PET_ alias */
};

static const struct opt opts[O__MAX] = {
    [O_NNODES] = {"nnodes", 0, false, true},
    [O_NPROC] = {"nproc_per_node", 0, false, true},
    [O_RDZV_BACKEND] = {"rdzv_backend", 0, false, true},
    [O_RDZV_ENDPOINT] = {"rdzv_endpoint", 0, false, true},
    [O_RDZV_ID] = {"rdzv_id", 0, false, true},
    [O_RDZV_CONF] = {"rdzv_conf", 0, false, true},
    [O_STANDALONE] = {"standalone", 0, true, true},
    [O_MAX_RESTARTS] = {"max_restarts", 0, false, true},
    [O_MONITOR_INTERVAL] = {"monitor_interval", 0, false, true},
    [O_START_METHOD] = {"start_method", 0, false, true},
    [O_EVENT_LOG_HANDLER] = {"event_log_handler", 0, false, true},
    [O_ROLE] = {"role", 0, false, true},
    [O_MODULE] = {"module", 'm', true, true},
    [O_NO_PYTHON] = {"no_python", 0, true, true},
    [O_RUN_PATH] = {"run_path", 0, true, true},
    [O_LOG_DIR] = {"log_dir", 0, false, true},
    [O_REDIRECTS] = {"redirects", 'r', false, true},
    [O_TEE] = {"tee", 't', false, true},
    [O_LOCAL_RANKS_FILTER] = {"local_ranks_filter", 0, false, true},
    [O_DUP_STDOUT] = {"duplicate_stdout_filters", 0, false, true},
    [O_DUP_STDERR] = {"duplicate_stderr_filters", 0, false, true},
    [O_NODE_RANK] = {"node_rank", 0, false, true},
    [O_MASTER_ADDR] = {"master_addr", 0, false, true},
    [O_MASTER_PORT] = {"master_port", 0, false, true},
    [O_LOCAL_ADDR] = {"local_addr", 0, false, true},
    [O_LOGS_SPECS] = {"logs_specs", 0, false, false},
    [O_NUMA_BINDING] = {"numa_binding", 0, false, false},
    [O_SIGNALS] = {"signals_to_handle", 0, false, true},
    [O_SHUTDOWN_TIMEOUT] = {"shutdown_timeout", 0, false, true},
    [O_VIRTUAL_LOCAL_RANK] = {"virtual_local_rank", 0, true, true},
    [O_HELP] = {"help", 'h', true, false},
    [O_VERSION] = {"version", 0, true, false},
};

static const char help_text[] =
    "usage: crun [options] training_script [training_script_args ...]\n"
    "\n"
    "torchrun-compatible launcher. Every option also takes its dash spelling\n"
    "(--nproc-per-node) and a PET_<NAME> environment default (PET_NPROC_PER_NODE).\n"
    "\n"
    "  --nnodes N|MIN:MAX          number of nodes (static: N; c10d: elastic) [1]\n"
    "  --nproc_per_node N|auto|cpu|gpu  workers per node [1]\n"
    "  --rdzv_backend static|c10d  rendezvous backend (etcd: not yet) [static]\n"
    "  --rdzv_endpoint HOST:PORT   static: the store of node 0 [master_addr:master_port];\n"
    "                              c10d: the rendezvous store (served by the agent whose\n"
    "                              address it is, else by another agent or crun-rdzvd)\n"
    "  --rdzv_id ID                run id [none]\n"
    "  --rdzv_conf K=V,...         static: timeout/join_timeout/read_timeout (seconds);\n"
    "                              c10d: join_timeout, last_call_timeout, close_timeout,\n"
    "                              read_timeout, is_host, heartbeat_interval, lease_ttl\n"
    "  --standalone                one node, private store on an ephemeral port\n"
    "  --max_restarts N            restarts of the worker group on failure [0]\n"
    "  --monitor_interval S        accepted; crun reacts to exits at once [0.1]\n"
    "  --start_method M            spawn|fork|forkserver (scripts always exec) [spawn]\n"
    "  --event_log_handler null    [null]\n"
    "  --role NAME                 ROLE_NAME [default]\n"
    "  -m, --module                run the program as python -m\n"
    "  --no_python                 exec the program directly\n"
    "  --log_dir DIR               logs and error files [a new /tmp/torchelastic_*]\n"
    "  -r, --redirects 0-3|R:V,..  redirect stdout(1)/stderr(2)/both(3) to files [0]\n"
    "  -t, --tee 0-3|R:V,..        redirect and echo with a prefix [0]\n"
    "  --local_ranks_filter R,..   only these local ranks reach the console\n"
    "  --node_rank N               static: this node's rank [0]\n"
    "  --master_addr HOST          static: node 0's address [127.0.0.1]\n"
    "  --master_port PORT          static: node 0's store port [29500]\n"
    "  --local_addr HOST           standalone: address given to workers\n"
    "  --signals_to_handle LIST    forwarded signals [SIGTERM,SIGINT,SIGHUP,SIGQUIT]\n"
    "  --shutdown_timeout S        SIGTERM -> SIGKILL grace [TORCH_ELASTIC_SHUTDOWN_TIMEOUT or "
    "30]\n"
    "  --virtual_local_rank        LOCAL_RANK=0, CUDA_VISIBLE_DEVICES=<local rank>\n"
    "  -h, --help                  this text\n"
    "  --version                   crun's version\n"
    "\n"
    "Not supported yet (rejected): --rdzv_backend=etcd|etcd-v2 without --standalone,\n"
    "--run_path, --logs_specs, --numa_binding,\n"
    "--duplicate_stdout_filters, --duplicate_stderr_filters, --event_log_handler other than null.\n"
    "Programs: *.py and -m run under $PYTHON_EXEC, else python3 with -u; ELF binaries\n"
    "and non-Python scripts run directly.\n";

const char *cli_help_text(void)
{
	return help_text;
}

static int fail(struct cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct cli *c, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->err, sizeof(c->err), fmt, ap);
	va_end(ap);
	return CRUN_EINVAL;
}

static char *keep(struct cli *c, const char *s)
{
	char *d;

	if (!s || c->nstrs >= (int)ARRAY_SIZE(c->strs))
		return NULL;
	d = str_dup(s);
	if (d)
		c->strs[c->nstrs++] = d;
	return d;
}

static void normalise(char *s)
{
	for (; *s; s++)
		if (*s == '-')
			*s = '_';
}

/* Exact name, else argparse's unique prefix. -1 unknown, -2 ambiguous. */
static int find_long(const char *name)
{
	int hit = -1;
	size_t l = strlen(name);

	for (int i = 0; i < O__MAX; i++)
		if (strcmp(opts[i].name, name) == 0)
			return i;
	for (int i = 0; i < O__MAX; i++) {
		if (strncmp(opts[i].name, name, l) != 0)
			continue;
		if (hit >= 0)
			return -2;
		hit = i;
	}
	return hit;
}

int cli_gpu_count(void)
{
	glob_t g;
	int n = 0;

	/* The driver lists one directory per GPU; no CUDA library is loaded. */
	if (glob("/proc/driver/nvidia/gpus/*", 0, NULL, &g) == 0) {
		n = (int)g.gl_pathc;
		globfree(&g);
		return n;
	}
	if (glob("/dev/nvidia[0-9]*", 0, NULL, &g) == 0) {
		n = (int)g.gl_pathc;
		globfree(&g);
	}
	return n;
}

int cli_nproc(const char *v, int *ret)
{
	uint64_t n;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);

	if (cpus < 1)
		cpus = 1;
	if (strcmp(v, "cpu") == 0) {
		*ret = (int)MIN(cpus, CRUN_AGENT_MAX_LOCAL);
		return 0;
	}
	if (strcmp(v, "gpu") == 0) {
		n = (uint64_t)cli_gpu_count();
		if (n == 0)
			return CRUN_ENOTSUP;
		*ret = (int)n;
		return 0;
	}
	if (strcmp(v, "auto") == 0) {
		int g = cli_gpu_count();

		*ret = g > 0 ? g : (int)MIN(cpus, CRUN_AGENT_MAX_LOCAL);
		return 0;
	}
	TRY(parse_uint_range(v, 1, CRUN_AGENT_MAX_LOCAL, &n));
	*ret = (int)n;
	return 0;
}

/* "0".."3" for every rank, or "0:1,1:2" per local rank (others 0). */
static int parse_std(struct cli *c, const char *flag, const char *v, int nproc, int **ret)
{
	int *arr = calloc((size_t)nproc, sizeof(int));
	uint64_t x;

	if (!arr)
		return CRUN_ENOMEM;
	*ret = arr;
	if (!strchr(v, ':')) {
		if (parse_uint_range(v, 0, 3, &x) < 0)
			return fail(c,
				    "argument %s: invalid value '%s' (expected 0-3 or a map "
				    "like 0:1,1:2)",
				    flag, v);
		for (int i = 0; i < nproc; i++)
			arr[i] = (int)x;
		return 0;
	}
	for (const char *p = v; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char item[32], *colon;
		uint64_t rank;

		if (len == 0 || len >= sizeof(item))
			return fail(c, "argument %s: invalid value '%s'", flag, v);
		memcpy(item, p, len);
		item[len] = '\0';
		colon = strchr(item, ':');
		if (!colon)
			return fail(c, "argument %s: invalid value '%s'", flag, v);
		*colon = '\0';
		if (parse_u64(item, &rank) < 0 || parse_uint_range(colon + 1, 0, 3, &x) < 0)
			return fail(c, "argument %s: invalid value '%s'", flag, v);
		if (rank < (uint64_t)nproc)
			arr[rank] = (int)x;
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

static int parse_rdzv_conf(struct cli *c, const char *v)
{
	for (const char *p = v; *p;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		char item[256], *eq;
		uint64_t ms;

		if (len >= sizeof(item))
			return fail(c, "argument --rdzv_conf: item too long");
		memcpy(item, p, len);
		item[len] = '\0';
		eq = strchr(item, '=');
		if (!eq || eq == item || !eq[1])
			return fail(c,
				    "argument --rdzv_conf: '%s' is not key=value with a non-empty "
				    "key and value",
				    item);
		*eq = '\0';
		if (strcmp(item, "timeout") == 0 || strcmp(item, "join_timeout") == 0 ||
		    strcmp(item, "read_timeout") == 0) {
			if (parse_seconds_ms(eq + 1, &ms) < 0 || ms == 0 || ms > UINT32_MAX)
				return fail(c,
					    "argument --rdzv_conf: %s=%s is not a number of "
					    "seconds",
					    item, eq + 1);
			c->cfg.join_timeout_ms = (uint32_t)ms;
		} else {
			return fail(c,
				    "argument --rdzv_conf: key '%s' is not supported by the "
				    "static backend yet",
				    item);
		}
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

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
		char *nl = strchr(head, '\n');

		if (nl)
			*nl = '\0';
		return !strstr(head, "python");
	}
	return false;
}

static int build_argv(struct cli *c, const char *py, bool module, bool no_python, char *const *rest,
		      int nrest)
{
	int n = 0;
	const char *prog = rest[0];
	size_t pl = strlen(prog);
	bool is_py = pl >= 3 && strcmp(prog + pl - 3, ".py") == 0;
	bool direct = no_python || (!module && !is_py && runs_directly(prog));

	c->argv = calloc((size_t)nrest + 4, sizeof(char *));
	if (!c->argv)
		return CRUN_ENOMEM;
	if (!direct) {
		c->argv[n++] = str_dup(py);
		c->argv[n++] = str_dup("-u");
		if (module)
			c->argv[n++] = str_dup("-m");
	}
	for (int i = 0; i < nrest; i++)
		c->argv[n++] = str_dup(rest[i]);
	for (int i = 0; i < n; i++)
		if (!c->argv[i])
			return CRUN_ENOMEM;
	c->cfg.argv = (const char *const *)c->argv;
	c->cfg.entrypoint = keep(c, prog);
	return 0;
}

static const char *envval(char *const *env, const char *name)
{
	return env ? env_get(env, name) : NULL;
}

int cli_parse(struct cli *c, int argc, char *const *argv, char *const *env)
{
	crun_agent_config_t init = CRUN_AGENT_CONFIG_INIT;
	const char *val[O__MAX] = {0};
	const char *from[O__MAX] = {0}; /* how the user spelled it */
	bool set[O__MAX] = {0};
	char spelled[O__MAX][96];
	char pet[80];
	int i;
	uint64_t u;

	memset(c, 0, sizeof(*c));
	c->cfg = init;
	for (i = 1; i < argc; i++) {
		const char *a = argv[i];
		char name[64];
		const char *eq = NULL;
		int id;

		if (strcmp(a, "--") == 0) {
			i++;
			break;
		}
		if (a[0] != '-' || a[1] == '\0')
			break; /* the program: everything from here is the worker's */
		if (a[1] == '-') {
			eq = strchr(a + 2, '=');
			size_t l = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);

			if (l == 0 || l >= sizeof(name))
				return fail(c, "unrecognized argument: %s", a);
			memcpy(name, a + 2, l);
			name[l] = '\0';
			normalise(name);
			id = find_long(name);
			if (id == -2)
				return fail(c, "ambiguous option: %.*s", (int)(l + 2), a);
			if (id < 0)
				return fail(c, "unrecognized argument: %.*s", (int)(l + 2), a);
			snprintf(spelled[id], sizeof(spelled[id]), "%.*s", (int)(l + 2), a);
			if (eq)
				eq++;
		} else {
			id = -1;
			for (int k = 0; k < O__MAX; k++)
				if (opts[k].short_name && opts[k].short_name == a[1])
					id = k;
			if (id < 0)
				return fail(c, "unrecognized argument: %s", a);
			snprintf(spelled[id], sizeof(spelled[id]), "-%c", a[1]);
			if (a[2])
				eq = a + 2;
		}
		from[id] = spelled[id];
		if (opts[id].flag) {
			if (eq)
				return fail(c, "argument %s: ignored explicit argument '%s'",
					    from[id], eq);
			set[id] = true;
			val[id] = "1";
			continue;
		}
		if (!eq) {
			if (i + 1 >= argc)
				return fail(c, "argument %s: expected one argument", from[id]);
			eq = argv[++i];
		}
		set[id] = true;
		val[id] = eq;
	}
	if (set[O_HELP]) {
		c->help = true;
		return 0;
	}
	if (set[O_VERSION]) {
		c->version = true;
		return 0;
	}
	/* PET_<DEST> defaults for everything not given explicitly. */
	for (int k = 0; k < O__MAX; k++) {
		const char *e;
		size_t l;

		if (set[k] || !opts[k].env)
			continue;
		l = (size_t)snprintf(pet, sizeof(pet), "PET_%s", opts[k].name);
		for (size_t j = 4; j < l; j++)
			if (pet[j] >= 'a' && pet[j] <= 'z')
				pet[j] = (char)(pet[j] - 'a' + 'A');
		e = envval(env, pet);
		if (!e)
			continue;
		snprintf(spelled[k], sizeof(spelled[k]), "%s", pet);
		from[k] = spelled[k];
		if (opts[k].flag) {
			int64_t b;

			if (parse_i64(e, &b) < 0)
				return fail(c, "%s: invalid int value '%s'", pet, e);
			set[k] = b != 0;
			val[k] = b ? "1" : NULL;
		} else {
			set[k] = true;
			val[k] = e;
		}
	}

	/* Rejected until implemented: named, never ignored. */
	if (set[O_RUN_PATH])
		return fail(c, "%s is not supported by crun yet", from[O_RUN_PATH]);
	if (set[O_LOGS_SPECS])
		return fail(c, "%s is not supported by crun yet", from[O_LOGS_SPECS]);
	if (set[O_NUMA_BINDING])
		return fail(c, "%s is not supported by crun yet", from[O_NUMA_BINDING]);
	if (set[O_DUP_STDOUT] && *val[O_DUP_STDOUT])
		return fail(c, "%s is not supported by crun yet", from[O_DUP_STDOUT]);
	if (set[O_DUP_STDERR] && *val[O_DUP_STDERR])
		return fail(c, "%s is not supported by crun yet", from[O_DUP_STDERR]);
	if (set[O_EVENT_LOG_HANDLER] && strcmp(val[O_EVENT_LOG_HANDLER], "null") != 0)
		return fail(c, "%s=%s is not supported by crun yet (only 'null')",
			    from[O_EVENT_LOG_HANDLER], val[O_EVENT_LOG_HANDLER]);

	c->cfg.standalone = set[O_STANDALONE];
	if (set[O_NPROC]) {
		int r = cli_nproc(val[O_NPROC], &c->cfg.nproc_per_node);

		if (r == CRUN_ENOTSUP)
			return fail(c, "argument %s: 'gpu' given but no NVIDIA GPU was found",
				    from[O_NPROC]);
		if (r < 0)
			return fail(c,
				    "argument %s: invalid value '%s' (expected an integer "
				    "1-%d, auto, cpu or gpu)",
				    from[O_NPROC], val[O_NPROC], CRUN_AGENT_MAX_LOCAL);
	}
	if (set[O_NNODES]) {
		const char *v = val[O_NNODES], *colon = strchr(v, ':');
		uint64_t lo, hi;

		if (colon) {
			char a[32];

			if ((size_t)(colon - v) >= sizeof(a))
				return fail(c, "argument %s: invalid value '%s'", from[O_NNODES],
					    v);
			memcpy(a, v, (size_t)(colon - v));
			a[colon - v] = '\0';
			if (parse_uint_range(a, 1, 65536, &lo) < 0 ||
			    parse_uint_range(colon + 1, 1, 65536, &hi) < 0 || lo > hi)
				return fail(c,
					    "argument %s: invalid value '%s' (expected N or "
					    "MIN:MAX with 0 < MIN <= MAX)",
					    from[O_NNODES], v);
			if (lo != hi &&
			    !(set[O_RDZV_BACKEND] && strcmp(val[O_RDZV_BACKEND], "c10d") == 0))
				return fail(c,
					    "argument %s=%s: elastic MIN:MAX needs "
					    "--rdzv_backend=c10d",
					    from[O_NNODES], v);
			c->cfg.min_nnodes = (int)lo;
			c->cfg.max_nnodes = (int)hi;
		} else if (parse_uint_range(v, 1, 65536, &lo) < 0) {
			return fail(c, "argument %s: invalid value '%s' (expected N or MIN:MAX)",
				    from[O_NNODES], v);
		}
		c->cfg.nnodes = (int)lo;
	}
	if (set[O_RDZV_BACKEND]) {
		const char *b = val[O_RDZV_BACKEND];

		if (strcmp(b, "c10d") == 0 && !c->cfg.standalone) {
			c->cfg.rdzv_backend = "c10d";
			if (!c->cfg.max_nnodes)
				c->cfg.min_nnodes = c->cfg.max_nnodes = c->cfg.nnodes;
			/* torchrun's c10d endpoint port when none is given */
			c->cfg.master_port = 29400;
		} else if (strcmp(b, "c10d") == 0 || strcmp(b, "etcd") == 0 ||
			   strcmp(b, "etcd-v2") == 0) {
			if (!c->cfg.standalone)
				return fail(c,
					    "%s=%s is not supported by crun yet (use static or "
					    "--standalone)",
					    from[O_RDZV_BACKEND], b);
		} else if (strcmp(b, "static") != 0) {
			return fail(c,
				    "argument %s: invalid value '%s' (expected static, c10d, "
				    "etcd or etcd-v2)",
				    from[O_RDZV_BACKEND], b);
		}
	}
	if (c->cfg.standalone && c->cfg.nnodes != 1)
		return fail(c, "--standalone runs one node, but %s=%d", from[O_NNODES],
			    c->cfg.nnodes);
	if (set[O_MAX_RESTARTS]) {
		if (parse_uint_range(val[O_MAX_RESTARTS], 0, INT32_MAX, &u) < 0)
			return fail(c, "argument %s: invalid int value '%s'", from[O_MAX_RESTARTS],
				    val[O_MAX_RESTARTS]);
		c->cfg.max_restarts = (int)u;
	}
	if (set[O_MONITOR_INTERVAL] && parse_seconds_ms(val[O_MONITOR_INTERVAL], &u) < 0)
		return fail(c, "argument %s: invalid float value '%s'", from[O_MONITOR_INTERVAL],
			    val[O_MONITOR_INTERVAL]);
	if (set[O_START_METHOD] && strcmp(val[O_START_METHOD], "spawn") != 0 &&
	    strcmp(val[O_START_METHOD], "fork") != 0 &&
	    strcmp(val[O_START_METHOD], "forkserver") != 0)
		return fail(c,
			    "argument %s: invalid choice '%s' (choose from spawn, fork, "
			    "forkserver)",
			    from[O_START_METHOD], val[O_START_METHOD]);
	if (set[O_ROLE]) {
		if (!*val[O_ROLE] || strlen(val[O_ROLE]) >= 64)
			return fail(c, "argument %s: invalid value '%s'", from[O_ROLE],
				    val[O_ROLE]);
		c->cfg.role = keep(c, val[O_ROLE]);
	}
	if (set[O_MODULE] && set[O_NO_PYTHON])
		return fail(c, "Don't use both the '--no-python' flag and the '--module' flag at "
			       "the same time.");
	if (set[O_LOG_DIR])
		c->cfg.log_dir = keep(c, val[O_LOG_DIR]);
	if (set[O_NODE_RANK]) {
		if (parse_uint_range(val[O_NODE_RANK], 0, 65535, &u) < 0)
			return fail(c, "argument %s: invalid int value '%s'", from[O_NODE_RANK],
				    val[O_NODE_RANK]);
		c->cfg.node_rank = (int)u;
	}
	if (c->cfg.node_rank >= c->cfg.nnodes)
		return fail(c, "argument %s: %d is not below --nnodes=%d",
			    from[O_NODE_RANK] ? from[O_NODE_RANK] : "--node_rank", c->cfg.node_rank,
			    c->cfg.nnodes);
	if (set[O_MASTER_ADDR]) {
		if (!*val[O_MASTER_ADDR] || strlen(val[O_MASTER_ADDR]) >= 255)
			return fail(c, "argument %s: invalid value '%s'", from[O_MASTER_ADDR],
				    val[O_MASTER_ADDR]);
		c->cfg.master_addr = keep(c, val[O_MASTER_ADDR]);
	}
	if (set[O_MASTER_PORT]) {
		if (parse_uint_range(val[O_MASTER_PORT], 1, 65535, &u) < 0)
			return fail(c, "argument %s: invalid port '%s' (expected 1-65535)",
				    from[O_MASTER_PORT], val[O_MASTER_PORT]);
		c->cfg.master_port = (uint16_t)u;
	}
	if (set[O_RDZV_ENDPOINT] && *val[O_RDZV_ENDPOINT] && !c->cfg.standalone) {
		char host[256];
		uint16_t port = 0;

		if (parse_host_port(val[O_RDZV_ENDPOINT], 0, host, sizeof(host), &port) < 0 ||
		    !host[0])
			return fail(c, "argument %s: invalid endpoint '%s'", from[O_RDZV_ENDPOINT],
				    val[O_RDZV_ENDPOINT]);
		if (port == 0 && c->cfg.rdzv_backend && strcmp(c->cfg.rdzv_backend, "c10d") == 0)
			port = 29400;
		if (port == 0)
			return fail(c, "argument %s: the static backend needs a port: '%s'",
				    from[O_RDZV_ENDPOINT], val[O_RDZV_ENDPOINT]);
		c->cfg.master_addr = keep(c, host);
		c->cfg.master_port = port;
	}
	if (set[O_RDZV_ID] && !c->cfg.standalone) {
		if (!*val[O_RDZV_ID] || strlen(val[O_RDZV_ID]) >= 200 ||
		    strchr(val[O_RDZV_ID], '/'))
			return fail(c, "argument %s: invalid value '%s'", from[O_RDZV_ID],
				    val[O_RDZV_ID]);
		c->cfg.rdzv_id = keep(c, val[O_RDZV_ID]);
	}
	if (set[O_RDZV_CONF] && *val[O_RDZV_CONF] && c->cfg.rdzv_backend &&
	    strcmp(c->cfg.rdzv_backend, "c10d") == 0 && !c->cfg.standalone) {
		if (rdzv_conf_check("c10d", val[O_RDZV_CONF], c->err, sizeof(c->err)) < 0)
			return CRUN_EINVAL;
		c->cfg.rdzv_conf = keep(c, val[O_RDZV_CONF]);
	} else if (set[O_RDZV_CONF] && *val[O_RDZV_CONF] &&
		   parse_rdzv_conf(c, val[O_RDZV_CONF]) < 0) {
		return CRUN_EINVAL;
	}
	if (set[O_LOCAL_ADDR])
		c->cfg.local_addr = keep(c, val[O_LOCAL_ADDR]);
	if (set[O_SIGNALS] &&
	    supervise_parse_signals(val[O_SIGNALS], &c->cfg.signals_to_handle) < 0)
		return fail(c, "argument %s: invalid signal list '%s'", from[O_SIGNALS],
			    val[O_SIGNALS]);
	{
		const char *st = set[O_SHUTDOWN_TIMEOUT]
				     ? val[O_SHUTDOWN_TIMEOUT]
				     : envval(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
		const char *who = set[O_SHUTDOWN_TIMEOUT] ? from[O_SHUTDOWN_TIMEOUT]
							  : "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";

		if (st && (parse_seconds_ms(st, &u) < 0 || u > UINT32_MAX))
			return fail(c, "%s: invalid number of seconds '%s'", who, st);
		if (st)
			c->cfg.shutdown_timeout_ms = (uint32_t)u;
	}
	c->cfg.virtual_local_rank = set[O_VIRTUAL_LOCAL_RANK];
	if (set[O_REDIRECTS] && parse_std(c, from[O_REDIRECTS], val[O_REDIRECTS],
					  c->cfg.nproc_per_node, &c->redirects) < 0)
		return CRUN_EINVAL;
	if (set[O_TEE] && parse_std(c, from[O_TEE], val[O_TEE], c->cfg.nproc_per_node, &c->tee) < 0)
		return CRUN_EINVAL;
	c->cfg.redirects = c->redirects;
	c->cfg.tee = c->tee;
	if (set[O_LOCAL_RANKS_FILTER] && *val[O_LOCAL_RANKS_FILTER]) {
		const char *v = val[O_LOCAL_RANKS_FILTER];

		c->console_ranks = calloc((size_t)c->cfg.nproc_per_node, 1);
		if (!c->console_ranks)
			return CRUN_ENOMEM;
		for (const char *p = v; *p;) {
			const char *end = strchr(p, ',');
			size_t len = end ? (size_t)(end - p) : strlen(p);
			char item[16];

			if (len == 0 || len >= sizeof(item))
				return fail(c, "argument %s: invalid value '%s'",
					    from[O_LOCAL_RANKS_FILTER], v);
			memcpy(item, p, len);
			item[len] = '\0';
			if (parse_uint_range(item, 0, (uint64_t)c->cfg.nproc_per_node - 1, &u) < 0)
				return fail(c, "argument %s: '%s' is not a local rank below %d",
					    from[O_LOCAL_RANKS_FILTER], item,
					    c->cfg.nproc_per_node);
			c->console_ranks[u] = 1;
			if (!end)
				break;
			p = end + 1;
		}
		c->cfg.console_ranks = c->console_ranks;
	}
	c->cfg.line_prefix_template = keep(c, envval(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"));

	if (i >= argc)
		return fail(c, "the following arguments are required: training_script");
	{
		char pybuf[PATH_MAX];
		const char *py = env_python(env, pybuf, sizeof(pybuf)); /* PYTHON_EXEC, python3 */

		if (build_argv(c, py, set[O_MODULE], set[O_NO_PYTHON], argv + i, argc - i) < 0)
			return fail(c, "out of memory");
	}
	if (c->cfg.nproc_per_node > 1 && !envval(env, "OMP_NUM_THREADS"))
		snprintf(c->note, sizeof(c->note),
			 "\n*****************************************\n"
			 "Setting OMP_NUM_THREADS environment variable for each process to be 1 "
			 "in default, to avoid your system being overloaded, please further tune "
			 "the variable for optimal performance in your application as needed. \n"
			 "*****************************************");
	return 0;
}

void cli_free(struct cli *c)
{
	if (c->argv)
		for (int i = 0; c->argv[i]; i++)
			free(c->argv[i]);
	free(c->argv);
	free(c->redirects);
	free(c->tee);
	free(c->console_ranks);
	for (int i = 0; i < c->nstrs; i++)
		free(c->strs[i]);
	memset(c, 0, sizeof(*c));
}
