/* cli.c: the loop over crun's option table (cli_table.c) that turns the
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
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/cli.h"
#include "agent/env.h"
#include "agent/failures.h"
#include "agent/workers.h"
#include "agent/cli_int.h"
#include "rendezvous/rdzv.h"
#include "store/auth.h"
#include "common/common.h"

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
	static const char prefix[] = "argument --rdzv_conf: ";
	char unknown[256], err[sizeof(c->err)];

	if (cli_rdzv_conf_static(v, &c->cfg.join_timeout_ms, unknown, sizeof(unknown), err,
				 sizeof(err)) < 0)
		return cli_fail(
		    c, "%s: %s", x->who[OPT_RDZV_CONF],
		    strncmp(err, prefix, sizeof(prefix) - 1) == 0 ? err + sizeof(prefix) - 1 : err);
	if (unknown[0])
		snprintf(
		    c->warn, sizeof(c->warn),
		    "%s: ignoring %.200s: %s reads only timeout, join_timeout and read_timeout",
		    x->who[OPT_RDZV_CONF], unknown, mode);
	return 0;
}

static int rdzv_conf(struct cli *c, struct cli_ctx *x, bool auto_standalone)
{
	const char *v = x->val[OPT_RDZV_CONF] ? x->val[OPT_RDZV_CONF] : "";
	char all[1024];

	if (!x->rk_conf[0] && !*v)
		return 0;
	if (cli_elastic(c->cfg.rdzv_backend) && !c->cfg.standalone) {
		/* File keys first, so a --rdzv_conf key given as a flag wins. */
		snprintf(all, sizeof(all), "%s%s%s", x->rk_conf, x->rk_conf[0] && *v ? "," : "", v);
		if (cli_rdzv_conf_check(c->cfg.rdzv_backend, all, c->err, sizeof(c->err)) < 0)
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
	       !cli_given(x, OPT_RDZV_ENDPOINT) && x->src[OPT_MASTER_PORT] == SRC_NONE && max == 1;
}

/* crun-agent is a new program with no torchrun behaviour to keep: its c10d
 * rendezvous beyond loopback must be authenticated (a secret or TLS) unless
 * the operator says --insecure. crun only warns (c10d.c), for drop-in use. */
static int agent_secure_default(struct cli *c, const struct cli_ctx *x)
{
	const char *conf = x->val[OPT_RDZV_CONF] ? x->val[OPT_RDZV_CONF] : "";
	bool secured = c->cfg.auth_secret_file ||
		       (x->env && env_get(x->env, "CRUN_AUTH_SECRET_FILE")) ||
		       strstr(conf, "auth_secret_file=") || strstr(conf, "tls_ca=");

	if (c->prog != CLI_AGENT || strcmp(c->cfg.rdzv_backend, "c10d") != 0 || c->cfg.standalone ||
	    secured || cli_on(x, OPT_INSECURE) || store_host_is_loopback(c->cfg.master_addr))
		return 0;
	return cli_fail(
	    c,
	    "refusing an unauthenticated c10d rendezvous on %s:%u (not loopback): give "
	    "a secret (security.secret_file, --auth_secret_file, CRUN_AUTH_SECRET_FILE) "
	    "or TLS (--rdzv_conf tls_ca=...), or --insecure",
	    c->cfg.master_addr, c->cfg.master_port);
}

static int cross_checks(struct cli *c, struct cli_ctx *x)
{
	bool auto_standalone = single_node_run(c, x);

	if (auto_standalone)
		c->cfg.standalone = 1;
	if (cli_elastic(c->cfg.rdzv_backend) && !c->cfg.max_nnodes)
		c->cfg.min_nnodes = c->cfg.max_nnodes = c->cfg.nnodes;
	if (c->cfg.standalone && c->cfg.nnodes != 1)
		return cli_fail(c, "--standalone runs one node, but %s=%d",
				x->who[OPT_NNODES][0] ? x->who[OPT_NNODES] : "--nnodes",
				c->cfg.nnodes);
	if (cli_on(x, OPT_MODULE) && cli_on(x, OPT_NO_PYTHON) && !cli_on(x, OPT_RUN_PATH))
		return cli_fail(c, "Don't use both the '--no-python' flag and the '--module' flag "
				   "at the same time.");
	if (c->cfg.node_rank >= c->cfg.nnodes)
		return cli_fail(c, "%s: %d is not below --nnodes=%d",
				x->src[OPT_NODE_RANK] > SRC_DEFAULT ? x->who[OPT_NODE_RANK]
								    : "--node_rank",
				c->cfg.node_rank, c->cfg.nnodes);
	TRY(agent_secure_default(c, x));
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

/* The interpreter (issue 11, item 7): $PYTHON_EXEC as torchrun reads it,
 * else the python3 beside this program as it was invoked (a venv's bin/crun
 * finds the venv's bin/python3 even when the venv is not on PATH, as
 * torchrun uses its own interpreter), else python3 on PATH. $PYTHON, often
 * set for unrelated reasons, is not read. The path is kept in c. */
static const char *pick_python(struct cli *c, const struct cli_ctx *x, const char *self)
{
	const char *py = env_get(x->env, "PYTHON_EXEC"), *slash;
	char *found = NULL, beside[PATH_MAX];

	if (py && *py)
		return py;
	if (self && *self && !strchr(self, '/'))
		self = found = spawn_resolve(self); /* how a shell found us on PATH */
	slash = self ? strrchr(self, '/') : NULL;
	py = "python3";
	if (slash && (size_t)(slash - self) + sizeof("/python3") <= sizeof(beside)) {
		snprintf(beside, sizeof(beside), "%.*s/python3", (int)(slash - self), self);
		if (access(beside, X_OK) == 0)
			py = cli_keep(c, beside);
	}
	free(found);
	return py ? py : "python3";
}

static int build_argv(struct cli *c, const struct cli_ctx *x, const char *self, const char *prog,
		      char *const *rest, int nrest)
{
	size_t pl = strlen(prog);
	/* The command line builds the runpy command itself, so cfg.run_path (for
	 * API callers) stays 0 and nothing wraps it twice. */
	bool module = cli_on(x, OPT_MODULE), run_path = cli_on(x, OPT_RUN_PATH);
	bool is_py = pl >= 3 && strcmp(prog + pl - 3, ".py") == 0;
	bool direct =
	    !run_path && (cli_on(x, OPT_NO_PYTHON) || (!module && !is_py && runs_directly(prog)));
	const char *py = direct ? NULL : pick_python(c, x, self);
	int n = 0;

	c->argv = calloc((size_t)nrest + 6, sizeof(char *));
	if (!c->argv)
		return CRUN_ENOMEM;
	if (!direct) {
		c->argv[n++] = str_dup(py);
		c->argv[n++] = str_dup("-u");
		if (run_path) {
			c->argv[n++] = str_dup("-c");
			c->argv[n++] = str_dup(errfile_runpy_src);
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
	if (i < argc ? build_argv(c, x, argv[0], prog, argv + i + 1, argc - i - 1)
		     : build_argv(c, x, argc > 0 ? argv[0] : NULL, prog, c->file_args, nfile))
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

/* A list row's value (job.env, job.args) as one string for cli_changes: its
 * own value is only "1" (the list is in c). Items length-prefixed, so no
 * two lists read the same. */
static char *list_text(char *const *l)
{
	size_t cap = 1, o = 0;
	char *s;

	for (size_t i = 0; l && l[i]; i++)
		cap += strlen(l[i]) + 24;
	s = malloc(cap);
	if (!s)
		return NULL;
	s[0] = '\0';
	for (size_t i = 0; l && l[i]; i++)
		o += (size_t)snprintf(s + o, cap - o, "%zu:%s;", strlen(l[i]), l[i]);
	return s;
}

static int keep_resolved(struct cli *c, const struct cli_ctx *x)
{
	c->resolved = calloc(OPT__MAX + 1, sizeof(char *));
	if (!c->resolved)
		return cli_fail(c, "out of memory");
	for (int k = 0; k < OPT__MAX; k++) {
		enum cli_type t = cli_opts[k].type;

		if (!x->val[k])
			continue;
		c->resolved[k] = t == CT_ENV	? list_text(c->job_env)
				 : t == CT_ARGV ? list_text(c->file_args)
						: str_dup(x->val[k]);
		if (!c->resolved[k])
			return cli_fail(c, "out of memory");
	}
	return 0;
}

static void add_name(char *buf, size_t cap, const struct cli_opt *o)
{
	size_t n = strlen(buf);

	if (n + 2 < cap)
		snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", o->name ? o->name : o->json);
}

void cli_changes(const struct cli *was, const struct cli *now, char *live, size_t live_cap,
		 char *restart, size_t restart_cap)
{
	live[0] = restart[0] = '\0';
	for (int k = 0; k < OPT__MAX; k++) {
		const char *a = was->resolved ? was->resolved[k] : NULL;
		const char *b = now->resolved ? now->resolved[k] : NULL;

		if ((!a && !b) || (a && b && strcmp(a, b) == 0))
			continue;
		if (cli_opts[k].flags & CF_LIVE)
			add_name(live, live_cap, &cli_opts[k]);
		else
			add_name(restart, restart_cap, &cli_opts[k]);
	}
}

/* ---- the loop ------------------------------------------------------------------------ */

/* Applies the rows whose value came from min_src or a stronger source. */
static int apply_rows(struct cli *c, struct cli_ctx *x, enum cli_src min_src)
{
	for (int k = 0; k < OPT__MAX; k++) {
		const char *v = x->val[k];

		if (!v || cli_opts[k].type == CT_ACTION || x->src[k] < min_src)
			continue;
		TRY(check_value(c, x, (enum cli_id)k, v));
		if (cli_opts[k].apply)
			TRY(cli_opts[k].apply(c, x, k, v));
	}
	return 0;
}

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
	return apply_rows(c, x, SRC_DEFAULT);
}

int cli_apply_named(struct cli *c, struct cli_ctx *x)
{
	/* Rows read a few others' values (nnodes: the backend; the endpoint:
	 * standalone): those not named come from the fields, as context only. */
	if (!x->val[OPT_RDZV_BACKEND]) {
		x->val[OPT_RDZV_BACKEND] = c->cfg.rdzv_backend ? c->cfg.rdzv_backend : "static";
		x->src[OPT_RDZV_BACKEND] = SRC_DEFAULT;
	}
	if (!x->val[OPT_STANDALONE]) {
		x->val[OPT_STANDALONE] = c->cfg.standalone ? "1" : "0";
		x->src[OPT_STANDALONE] = SRC_DEFAULT;
	}
	TRY(apply_rows(c, x, SRC_FILE));
	if (c->cfg.standalone && c->cfg.nnodes != 1)
		return cli_fail(c, "standalone runs one node, but nnodes is %d", c->cfg.nnodes);
	if (c->cfg.node_rank >= c->cfg.nnodes)
		return cli_fail(c, "node_rank %d is not below nnodes %d", c->cfg.node_rank,
				c->cfg.nnodes);
	if (cli_elastic(c->cfg.rdzv_backend) && !c->cfg.max_nnodes)
		c->cfg.min_nnodes = c->cfg.max_nnodes = c->cfg.nnodes;
	TRY(rdzv_conf(c, x, false));
	if (!x->val[OPT_JOB_PROGRAM]) {
		/* The caller's argv: run_path wraps it in the agent. */
		if (x->val[OPT_RUN_PATH])
			c->cfg.run_path = cli_on(x, OPT_RUN_PATH);
		return 0;
	}
	return program(c, x, 0, 0, NULL);
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
	if (x->val[OPT_PRINT_MAN]) {
		c->man = true;
		goto out;
	}
	if (x->val[OPT_PRINT_SCHEMA]) {
		c->schema = true;
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
	if (r == 0)
		r = cli_slurm_defaults(c, x);
	if (r < 0)
		goto out;
	/* The daemon serves its status page unless told not to; crun does not. */
	if (prog == CLI_AGENT && !x->val[OPT_STATUS]) {
		x->val[OPT_STATUS] = "127.0.0.1:0";
		x->src[OPT_STATUS] = SRC_DEFAULT;
		snprintf(x->who[OPT_STATUS], sizeof(x->who[OPT_STATUS]), "--status");
	}
	r = apply_all(c, x);
	if (r < 0)
		goto out;
	r = cross_checks(c, x);
	if (r < 0)
		goto out;
	r = program(c, x, i, argc, argv);
	if (r == 0)
		r = keep_resolved(c, x);
	c->print_config = x->val[OPT_PRINT_CONFIG] != NULL;
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
	if (c->resolved)
		for (int k = 0; k < OPT__MAX; k++)
			free(c->resolved[k]);
	free(c->resolved);
	free(c->redirects);
	free(c->tee);
	free(c->console_ranks);
	for (int i = 0; i < c->nstrs; i++)
		free(c->strs[i]);
	memset(c, 0, sizeof(*c));
}
