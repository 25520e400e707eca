/* cli_json.c: crun-agent's JSON config into the option table's slots. Every
 * key is a row's JSON path (cli_int.h); an unknown key, a wrong type or a bad
 * value is an error that names the path, and nothing starts. Values become
 * the same strings a flag would carry, so one apply function per row checks
 * them whichever way they came.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "agent/cli.h"
#include "agent/cli_int.h"
#include "common/common.h"

#define CONFIG_MAX_ITEMS 4096 /* args + env entries */

struct jload {
	struct cli *c;
	struct cli_ctx *x;
	const char *file;
};

static const char *expected(const struct cli_opt *o, char *buf, size_t cap)
{
	switch (o->type) {
	case CT_FLAG:
		return "true or false";
	case CT_INT:
		snprintf(buf, cap, "an integer %lld-%lld", (long long)o->min, (long long)o->max);
		return buf;
	case CT_SECS:
		return "a number of seconds";
	case CT_LIST:
		return "a string or an array of strings";
	case CT_ARGV:
		return "an array of strings";
	case CT_ENV:
		return "an object of strings";
	default:
		snprintf(buf, cap, "\"%s\"", o->metavar ? o->metavar : "string");
		return buf;
	}
}

static int wrong_type(struct jload *j, const struct cli_opt *o, const char *path, const cJSON *v)
{
	char *txt = cJSON_PrintUnformatted(v);
	char exp[64];
	int r;

	r = cli_fail(j->c, "%s: %s: expected %s, got %.60s%s", j->file, path,
		     expected(o, exp, sizeof(exp)), txt ? txt : "?",
		     txt && strlen(txt) > 60 ? "..." : "");
	free(txt);
	return r;
}

/* A JSON number as the string a flag would give: integers without ".0". */
static const char *number_text(struct jload *j, const cJSON *v)
{
	char buf[64];
	double d = v->valuedouble;

	if (d == (double)(long long)d && d > -1e15 && d < 1e15)
		snprintf(buf, sizeof(buf), "%lld", (long long)d);
	else
		snprintf(buf, sizeof(buf), "%.17g", d);
	return cli_keep(j->c, buf);
}

/* Strings of an array joined by ',' (a list row), or NULL on a non-string. */
static const char *joined(struct jload *j, const cJSON *arr)
{
	const cJSON *it;
	size_t cap = 1, n = 0;
	char *s;
	const char *kept;

	cJSON_ArrayForEach(it, arr)
	{
		if (!cJSON_IsString(it))
			return NULL;
		cap += strlen(it->valuestring) + 1;
	}
	s = calloc(1, cap);
	if (!s)
		return NULL;
	cJSON_ArrayForEach(it, arr) n +=
	    (size_t)snprintf(s + n, cap - n, "%s%s", n ? "," : "", it->valuestring);
	kept = cli_keep(j->c, s);
	free(s);
	return kept;
}

static char **string_list(const cJSON *v, bool env)
{
	int n = cJSON_GetArraySize(v), i = 0;
	const cJSON *it;
	char **l;

	if (n > CONFIG_MAX_ITEMS)
		return NULL;
	l = calloc((size_t)n + 1, sizeof(char *));
	if (!l)
		return NULL;
	cJSON_ArrayForEach(it, v)
	{
		if (!cJSON_IsString(it))
			goto fail;
		if (env) {
			if (asprintf(&l[i], "%s=%s", it->string, it->valuestring) < 0) {
				l[i] = NULL;
				goto fail;
			}
		} else if (!(l[i] = str_dup(it->valuestring))) {
			goto fail;
		}
		i++;
	}
	return l;
fail:
	for (int k = 0; k < i; k++)
		free(l[k]);
	free(l);
	return NULL;
}

/* One leaf: v at `path` for row id. */
static int leaf(struct jload *j, enum cli_id id, const char *path, const cJSON *v)
{
	const struct cli_opt *o = &cli_opts[id];
	const char *s = NULL;

	switch (o->type) {
	case CT_FLAG:
		if (cJSON_IsBool(v))
			s = cJSON_IsTrue(v) ? "1" : "0";
		break;
	case CT_INT:
	case CT_SECS:
		if (cJSON_IsNumber(v) && v->valuedouble >= 0)
			s = number_text(j, v);
		break;
	case CT_LIST:
		if (cJSON_IsString(v))
			s = v->valuestring;
		else if (cJSON_IsArray(v))
			s = joined(j, v);
		break;
	case CT_ARGV:
	case CT_ENV:
		if (o->type == CT_ARGV ? cJSON_IsArray(v) : cJSON_IsObject(v)) {
			char ***dst = o->type == CT_ARGV ? &j->c->file_args : &j->c->job_env;
			char **l = string_list(v, o->type == CT_ENV);

			if (!l)
				break;
			*dst = l;
			s = "1";
		}
		break;
	default:
		if (cJSON_IsString(v))
			s = v->valuestring;
		else if (cJSON_IsNumber(v) && (o->flags & CF_NUMOK))
			s = number_text(j, v);
		break;
	}
	if (!s)
		return wrong_type(j, o, path, v);
	if (j->x->src[id] >= SRC_FILE)
		return 0; /* a flag overrides the file */
	/* The tree is freed after loading: keep a copy of what points into it. */
	s = cli_keep(j->c, s);
	if (!s)
		return cli_fail(j->c, "%s: %s: out of memory or too many values", j->file, path);
	j->x->val[id] = s;
	j->x->src[id] = SRC_FILE;
	snprintf(j->x->who[id], sizeof(j->x->who[id]), "%.80s: %.70s", j->file, path);
	return 0;
}

static bool is_prefix_of_a_row(const char *path)
{
	size_t l = strlen(path);

	for (int k = 0; k < OPT__MAX; k++)
		if (cli_opts[k].json && strncmp(cli_opts[k].json, path, l) == 0 &&
		    cli_opts[k].json[l] == '.')
			return true;
	return false;
}

static int walk(struct jload *j, const cJSON *obj, const char *prefix, int depth)
{
	const cJSON *v;

	cJSON_ArrayForEach(v, obj)
	{
		char path[160];
		int id = -1;

		if (strcmp(v->string, "$comment") == 0) {
			if (!cJSON_IsString(v))
				return cli_fail(j->c, "%s: %s%s$comment: expected a string",
						j->file, prefix, *prefix ? "." : "");
			continue; /* JSON has no comments; configs use "$comment" keys */
		}
		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", v->string);
		for (int k = 0; k < OPT__MAX && id < 0; k++)
			if (cli_opts[k].json && strcmp(cli_opts[k].json, path) == 0)
				id = k;
		if (id >= 0) {
			TRY(leaf(j, (enum cli_id)id, path, v));
			continue;
		}
		if (!is_prefix_of_a_row(path) || depth > 4)
			return cli_fail(j->c, "%s: unknown key '%s'", j->file, path);
		if (!cJSON_IsObject(v)) {
			char *txt = cJSON_PrintUnformatted(v);
			int r = cli_fail(j->c, "%s: %s: expected an object, got %.60s", j->file,
					 path, txt ? txt : "?");

			free(txt);
			return r;
		}
		TRY(walk(j, v, path, depth + 1));
	}
	return 0;
}

int cli_json_load(struct cli *c, struct cli_ctx *x, const char *path)
{
	struct jload j = {.c = c, .x = x, .file = path};
	cJSON *root = cli_json_parse_file(path, c->err, sizeof(c->err));
	int r;

	if (!root)
		return CRUN_EINVAL;
	r = walk(&j, root, "", 0);
	cJSON_Delete(root);
	return r;
}

int cli_json_value(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *who,
		   const char *text)
{
	struct jload j = {.c = c, .x = x, .file = who};
	cJSON *v = cJSON_Parse(text);
	int r;

	if (!v)
		return cli_fail(c, "%s: not JSON: '%.60s'", who, text);
	x->src[id] = SRC_NONE; /* this value, not an earlier one */
	r = leaf(&j, id, cli_opts[id].json, v);
	cJSON_Delete(v);
	return r;
}
