/* cli_rdzv.c: --rdzv_conf ("k=v,...", torchrun's syntax) as a multi-row
 * setter over the rendezvous key rows of rendezvous/c10d.h: the one place
 * settings text of the rendezvous is parsed. The backends get the typed
 * struct c10d_conf (rdzv_params.conf); the static backend reads its join
 * timeout from the rows of scope RS_ALL.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "agent/cli_rdzv_int.h"
#include "common/common.h"
#include "rendezvous/c10d.h"

/* One row of c10d.h, with where its value goes. */
struct rk_row {
	const char *name, *alias;
	enum rdzv_key_kind kind;
	enum rdzv_key_scope scope;
	size_t off, cap;
	const char *def, *choices;
};

static const struct rk_row rows[] = {
#define RK_ROW_(id, nm, al, kd, sc, field, df, mv, ch, hp) \
	{                                                  \
	    #nm,                                           \
	    al,                                            \
	    kd,                                            \
	    sc,                                            \
	    offsetof(struct c10d_conf, field),             \
	    sizeof(((struct c10d_conf *)0)->field),        \
	    df,                                            \
	    ch},
    RDZV_CONF_KEYS(RK_ROW_)
#undef RK_ROW_
};

#define ERR_PREFIX "argument --rdzv_conf: "

/* The row named k (or its alias) that `scope` reads, or NULL. */
static const struct rk_row *row_find(const char *k, enum rdzv_key_scope scope)
{
	for (size_t i = 0; i < ARRAY_SIZE(rows); i++)
		if ((strcmp(k, rows[i].name) == 0 ||
		     (rows[i].alias && !strcmp(k, rows[i].alias))) &&
		    rows[i].scope <= scope)
			return &rows[i];
	return NULL;
}

/* "first|second": *ret_second when v is the second, CRUN_EINVAL when neither. */
static int pick(const char *choices, const char *v, bool *ret_second)
{
	const char *bar = strchr(choices, '|');
	size_t first = (size_t)(bar - choices);

	if (strlen(v) == first && strncmp(v, choices, first) == 0)
		*ret_second = false;
	else if (strcmp(v, bar + 1) == 0)
		*ret_second = true;
	else
		return CRUN_EINVAL;
	return 0;
}

/* Row `w`'s value v (spelled k) into c. */
static int row_set(const struct rk_row *w, struct c10d_conf *c, const char *k, const char *v,
		   char *err, size_t cap)
{
	void *dst = (char *)c + w->off;
	const char *why;
	bool b;

	switch (w->kind) {
	case RK_SECS:
		if (parse_timeout_ms(v, dst, &why) < 0)
			goto bad;
		return 0;
	case RK_BOOL:
		why = "is not a boolean";
		if (parse_bool(v, &b) < 0)
			goto bad;
		*(int *)dst = b;
		return 0;
	case RK_PICK:
	case RK_TLS:
		if (pick(w->choices, v, &b) < 0) {
			snprintf(err, cap, ERR_PREFIX "%s=%s is not %.*s or %s", k, v,
				 (int)(strchr(w->choices, '|') - w->choices), w->choices,
				 strchr(w->choices, '|') + 1);
			return CRUN_EINVAL;
		}
		if (w->kind == RK_TLS)
			*(int *)dst = b ? 13 : 12;
		else
			*(int *)dst = b;
		return 0;
	case RK_RPATH:
		if (access(v, R_OK) < 0) {
			snprintf(err, cap, ERR_PREFIX "%s=%s: %s", k, v, strerror(errno));
			return CRUN_EINVAL;
		}
		/* fall through */
	default:
		if (str_printf(dst, w->cap, "%s", v) < 0) {
			snprintf(err, cap, ERR_PREFIX "%s too long", k);
			return CRUN_EINVAL;
		}
		return 0;
	}
bad:
	snprintf(err, cap, ERR_PREFIX "%s=%s %s", k, v, why);
	return CRUN_EINVAL;
}

/* store_<limit>=N: a limit of the store a c10d host serves, by the store's
 * own table (the names of crun-rdzvd's limit flags). */
static int store_key(struct c10d_conf *c, const char *k, const char *v, char *err, size_t cap)
{
	char why[200];
	int r = store_server_config_set(&c->store, k + 6, v, why, sizeof(why));

	/* why starts with the tunable's name, which is as long as ours: print
	 * it under our spelling. */
	if (r < 0)
		snprintf(err, cap, ERR_PREFIX "%s%s", k,
			 r == CRUN_ENOTFOUND ? " is not a store limit (see crun-rdzvd --help)"
					     : why + strlen(k + 6));
	return r < 0 ? CRUN_EINVAL : 0;
}

static void unknown_key(const char *k, enum rdzv_key_scope scope, char *err, size_t cap)
{
	size_t n = (size_t)snprintf(err, cap, ERR_PREFIX "unknown key '%s' (expected", k);

	for (size_t i = 0; i < ARRAY_SIZE(rows) && n < cap; i++)
		if (rows[i].scope <= scope)
			n +=
			    (size_t)snprintf(err + n, cap - n, "%s %s", i ? "," : "", rows[i].name);
	if (n < cap)
		snprintf(err + n, cap - n, ", store_<limit>)");
}

/* Calls fn(k, v, arg) for each "k=v" item of text; an item that is not one
 * (empty key or value, too long) is an error. */
static int each_item(const char *text, int (*fn)(const char *k, const char *v, void *arg),
		     void *arg, char *err, size_t cap)
{
	for (const char *p = text ? text : ""; *p;) {
		size_t len = strcspn(p, ",");
		char item[RDZV_CONF_PATH_MAX + 32], *eq;

		if (len >= sizeof(item)) {
			snprintf(err, cap, ERR_PREFIX "item too long");
			return CRUN_EINVAL;
		}
		memcpy(item, p, len);
		item[len] = '\0';
		eq = strchr(item, '=');
		if (!eq || eq == item || !eq[1]) {
			snprintf(err, cap,
				 ERR_PREFIX "'%s' is not key=value with a non-empty key and value",
				 item);
			return CRUN_EINVAL;
		}
		*eq = '\0';
		TRY(fn(item, eq + 1, arg));
		p += len;
		if (*p == ',')
			p++;
	}
	return 0;
}

struct set_ctx {
	struct c10d_conf *c;
	enum rdzv_key_scope scope;
	char *err;
	size_t cap;
	/* static: the last RS_ALL value, and the keys it does not read */
	uint32_t *join_ms;
	char *unknown;
	size_t ucap;
};

static int set_one(const char *k, const char *v, void *arg)
{
	struct set_ctx *s = arg;
	const struct rk_row *w = row_find(k, s->scope);

	if (s->join_ms) { /* static: only the RS_ALL rows, the rest is listed */
		size_t ul = strlen(s->unknown);

		if (w) {
			TRY(row_set(w, s->c, k, v, s->err, s->cap));
			*s->join_ms = *(uint32_t *)((char *)s->c + w->off);
		} else {
			snprintf(s->unknown + ul, s->ucap - ul, "%s'%.60s'", ul ? ", " : "", k);
		}
		return 0;
	}
	if (w)
		return row_set(w, s->c, k, v, s->err, s->cap);
	if (strncmp(k, "store_", 6) == 0)
		return store_key(s->c, k, v, s->err, s->cap);
	unknown_key(k, s->scope, s->err, s->cap);
	return CRUN_EINVAL;
}

void cli_rdzv_conf_init(struct c10d_conf *c)
{
	char err[16];

	memset(c, 0, sizeof(*c));
	c->is_host = -1;
	c->etcd_https = -1;
	c->store = (struct store_server_config)STORE_SERVER_CONFIG_DEFAULT;
	for (size_t i = 0; i < ARRAY_SIZE(rows); i++)
		if (rows[i].def) /* checked by the unit tests: cannot fail */
			(void)row_set(&rows[i], c, rows[i].name, rows[i].def, err, sizeof(err));
}

int cli_rdzv_conf_set(struct c10d_conf *c, const char *backend, const char *text, char *err,
		      size_t cap)
{
	struct set_ctx s = {.c = c,
			    .scope = strcmp(backend, "etcd") == 0 ? RS_ETCD : RS_ELASTIC,
			    .err = err,
			    .cap = cap};

	TRY(each_item(text, set_one, &s, err, cap));
	return c10d_conf_check(c, err, cap);
}

int cli_rdzv_conf_static(const char *text, uint32_t *ret_join_ms, char *unknown, size_t ucap,
			 char *err, size_t cap)
{
	struct c10d_conf c;
	struct set_ctx s = {.c = &c,
			    .scope = RS_ALL,
			    .err = err,
			    .cap = cap,
			    .join_ms = ret_join_ms,
			    .unknown = unknown,
			    .ucap = ucap};

	cli_rdzv_conf_init(&c);
	unknown[0] = '\0';
	return each_item(text, set_one, &s, err, cap);
}

int cli_rdzv_conf_of(const crun_agent_config_t *cfg, struct c10d_conf *ret, char *err, size_t cap)
{
	const char *backend = cfg->rdzv_backend ? cfg->rdzv_backend : "static";

	cli_rdzv_conf_init(ret);
	if (cfg->standalone || (strcmp(backend, "c10d") && strcmp(backend, "etcd"))) {
		/* static: crun_agent_config_t's own field (the static keys of
		 * --rdzv_conf were read into it by the CLI) */
		ret->join_ms = cfg->join_timeout_ms;
		return 0;
	}
	return cli_rdzv_conf_set(ret, backend, cfg->rdzv_conf, err, cap);
}

int c10d_parse_conf(const char *s, struct c10d_conf *ret, char *err, size_t cap)
{
	struct c10d_conf c;

	cli_rdzv_conf_init(&c);
	TRY(cli_rdzv_conf_set(&c, "c10d", s, err, cap));
	*ret = c;
	return 0;
}

int cli_rdzv_conf_check(const char *backend, const char *conf, char *err, size_t cap)
{
	struct c10d_conf c;

	if (strcmp(backend, "c10d") != 0 && strcmp(backend, "etcd") != 0)
		return CRUN_ENOTSUP;
	cli_rdzv_conf_init(&c);
	return cli_rdzv_conf_set(&c, backend, conf, err, cap);
}

int rdzv_conf_check(const char *backend, const char *conf, char *err, size_t cap)
{
	return cli_rdzv_conf_check(backend, conf, err, cap);
}
