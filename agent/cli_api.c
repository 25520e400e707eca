/* cli_api.c: crun_agent_config_set(), the option table (cli_table.c) as a
 * C API. A name is looked up in the same rows the command line and the JSON
 * config use, its value goes through the same checks and apply functions
 * (cli.c's cli_apply_named), so the API can say whatever a flag can say and
 * cannot drift from it. Every named value is kept and the whole set is
 * applied again at each call, in table order, over the caller's struct: a
 * row that reads another (tee reads nproc_per_node, rdzv_endpoint reads the
 * backend) sees it whatever order the calls came in.
 *
 * Each application's strings live until crun_agent_config_release(): a row
 * that writes nothing this time (rdzv_id once standalone is set) leaves the
 * caller's field pointing at an earlier application's copy. So the
 * applications are kept, at most CFG_MAX_SETS of them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/cli.h"
#include "agent/env.h"
#include "agent/cli_int.h"
#include "common/common.h"

extern char **environ;

#define CFG_MAX_SETS 1024

struct cfg_gen {
	struct cli c; /* one application: owns what cfg's fields point at */
	struct cfg_gen *prev;
};

struct cfg_settings {
	char *val[OPT__MAX]; /* owned: every value set by name */
	struct cfg_gen *gens;
	int ngens;
	char err[512];
};

/* Row of `name`: the flag's name in either spelling, or its JSON path. */
static int find_row(const char *name)
{
	char norm[128];

	if (strlen(name) >= sizeof(norm))
		return -1;
	snprintf(norm, sizeof(norm), "%s", name);
	for (char *p = norm; *p; p++)
		if (*p == '-')
			*p = '_';
	for (int k = 0; k < OPT__MAX; k++)
		if ((cli_opts[k].name && strcmp(cli_opts[k].name, norm) == 0) ||
		    (cli_opts[k].json && strcmp(cli_opts[k].json, name) == 0))
			return k;
	return -1;
}

static void set_who(struct cli_ctx *x, int k)
{
	const struct cli_opt *o = &cli_opts[k];

	snprintf(x->who[k], sizeof(x->who[k]), "option '%s'", o->name ? o->name : o->json);
}

/* The program's own settings, which the agent takes as fields. */
static int program_fields(struct cli *c)
{
	const char *omp = "OMP_NUM_THREADS=1";

	c->cfg.status_listen = c->status_listen;
	c->cfg.event_log_handler = c->event_log_handler;
	if (c->log_level >= 0)
		log_set_level(c->log_level);
	/* torchrun's default for more than one worker, as crun exports it. */
	if (c->note[0] && !env_get(c->job_env, "OMP_NUM_THREADS") && !getenv("OMP_NUM_THREADS")) {
		size_t n = 0;
		char **l;

		while (c->job_env && c->job_env[n])
			n++;
		l = realloc(c->job_env, (n + 2) * sizeof(char *));
		if (!l)
			return cli_fail(c, "out of memory");
		c->job_env = l;
		l[n] = str_dup(omp);
		l[n + 1] = NULL;
		if (!l[n])
			return cli_fail(c, "out of memory");
	}
	c->cfg.worker_env = (const char *const *)c->job_env;
	return 0;
}

/* Applies vals over base into c. 0 or CRUN_EINVAL/CRUN_ENOMEM with c->err. */
static int resolve(struct cli *c, const crun_agent_config_t *base, char *const *vals)
{
	struct cli_ctx *x;
	int r = 0;

	memset(c, 0, sizeof(*c));
	c->cfg = *base;
	c->prog = CLI_CRUN;
	c->log_level = -1;
	c->event_log_handler = base->event_log_handler;
	c->status_listen = base->status_listen;
	x = calloc(1, sizeof(*x));
	if (!x)
		return cli_fail(c, "out of memory");
	x->env = environ; /* PYTHON_EXEC, OMP_NUM_THREADS: what the workers inherit */
	if (vals[OPT_CONFIG])
		r = cli_json_load(c, x, vals[OPT_CONFIG]);
	for (int k = 0; r == 0 && k < OPT__MAX; k++) {
		if (!vals[k] || k == OPT_CONFIG)
			continue;
		set_who(x, k);
		if (cli_opts[k].type == CT_ARGV || cli_opts[k].type == CT_ENV)
			r = cli_json_value(c, x, (enum cli_id)k, x->who[k], vals[k]);
		else
			x->val[k] = vals[k];
		x->src[k] = SRC_FLAG;
	}
	if (r == 0)
		r = cli_apply_named(c, x);
	if (r == 0)
		r = program_fields(c);
	free(x);
	return r < 0 ? CRUN_EINVAL : 0;
}

CRUN_API int crun_agent_config_set(crun_agent_config_t *cfg, const char *name, const char *value)
{
	struct cfg_settings *st;
	char *vals[OPT__MAX], *copy;
	struct cfg_gen *g;
	int k, r;

	if (!cfg || !name || !value || cfg->struct_size < sizeof(*cfg))
		return CRUN_EINVAL;
	st = cfg->settings;
	if (!st) {
		st = calloc(1, sizeof(*st));
		if (!st)
			return CRUN_ENOMEM;
		cfg->settings = st;
	}
	k = find_row(name);
	if (k < 0 || cli_opts[k].type == CT_ACTION) {
		snprintf(st->err, sizeof(st->err), "%s option '%s'",
			 k < 0 ? "unknown" : "an action, not a setting:", name);
		return CRUN_EINVAL;
	}
	if (st->ngens >= CFG_MAX_SETS) {
		snprintf(st->err, sizeof(st->err), "more than %d settings", CFG_MAX_SETS);
		return CRUN_ETOOBIG;
	}
	copy = str_dup(value);
	g = calloc(1, sizeof(*g));
	if (!copy || !g) {
		free(copy);
		free(g);
		return CRUN_ENOMEM;
	}
	memcpy(vals, st->val, sizeof(vals));
	vals[k] = copy;
	r = resolve(&g->c, cfg, vals);
	if (r < 0) {
		snprintf(st->err, sizeof(st->err), "%s", g->c.err[0] ? g->c.err : "out of memory");
		cli_free(&g->c);
		free(g);
		free(copy);
		return r;
	}
	free(st->val[k]);
	st->val[k] = copy;
	g->prev = st->gens;
	st->gens = g;
	st->ngens++;
	st->err[0] = '\0';
	*cfg = g->c.cfg;
	cfg->settings = st;
	return 0;
}

CRUN_API const char *crun_agent_config_last_error(const crun_agent_config_t *cfg)
{
	const struct cfg_settings *st = cfg ? cfg->settings : NULL;

	return st ? st->err : "";
}

CRUN_API void crun_agent_config_release(crun_agent_config_t *cfg)
{
	struct cfg_settings *st = cfg ? cfg->settings : NULL;

	if (!st)
		return;
	for (int k = 0; k < OPT__MAX; k++)
		free(st->val[k]);
	while (st->gens) {
		struct cfg_gen *g = st->gens;

		st->gens = g->prev;
		cli_free(&g->c);
		free(g);
	}
	free(st);
	cfg->settings = NULL;
}
