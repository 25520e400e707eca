/* cli_json.c: crun-agent's JSON config into the option table's slots. Every
 * key is a row's JSON path (cli_int.h); an unknown key, a wrong type or a bad
 * value is an error that names the path, and nothing starts. Values become
 * the same strings a flag would carry, so one apply function per row checks
 * them whichever way they came.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "agent/agent.h"
#include "agent/cli_int.h"
#include "common/common.h"

#define CONFIG_MAX_BYTES (1u << 20) /* a job config is a few KiB */
#define CONFIG_MAX_ITEMS 4096	    /* args + env entries */

struct jload {
	struct cli *c;
	struct cli_ctx *x;
	const char *file;
};

static char *read_file(const char *path, size_t *ret_len, int *ret_errno)
{
	struct stat st;
	char *buf = NULL;
	size_t got = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	*ret_errno = 0;
	if (fd < 0)
		goto fail;
	if (fstat(fd, &st) < 0)
		goto fail;
	if (!S_ISREG(st.st_mode) || st.st_size > CONFIG_MAX_BYTES) {
		errno = S_ISREG(st.st_mode) ? EFBIG : EINVAL;
		goto fail;
	}
	buf = malloc((size_t)st.st_size + 1);
	if (!buf)
		goto fail;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';
	fd_close(fd);
	*ret_len = got;
	return buf;
fail:
	*ret_errno = errno;
	free(buf);
	if (fd >= 0)
		fd_close(fd);
	return NULL;
}

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

/* Line and column of byte offset `off`, for parse errors. */
static void position(const char *text, size_t off, int *ret_line, int *ret_col)
{
	int line = 1, col = 1;

	for (size_t i = 0; i < off && text[i]; i++) {
		col++;
		if (text[i] == '\n') {
			line++;
			col = 1;
		}
	}
	*ret_line = line;
	*ret_col = col;
}

/* Reads and parses the file; NULL with err set (file and line:column). */
static cJSON *parse_file(const char *path, char *err, size_t cap)
{
	const char *at = NULL;
	cJSON *root;
	size_t len = 0;
	char *text;
	int e;

	text = read_file(path, &len, &e);
	if (!text) {
		snprintf(err, cap, "--config: cannot read '%s': %s", path, strerror(e));
		return NULL;
	}
	root = cJSON_ParseWithLengthOpts(text, len, &at, 0);
	if (!root) {
		int line = 0, col = 0;

		if (at && at >= text && at <= text + len)
			position(text, (size_t)(at - text), &line, &col);
		snprintf(err, cap, "%s:%d:%d: not valid JSON", path, line, col);
	} else if (!cJSON_IsObject(root)) {
		snprintf(err, cap, "%s: expected a JSON object at the top", path);
		cJSON_Delete(root);
		root = NULL;
	}
	free(text);
	return root;
}

int cli_json_load(struct cli *c, struct cli_ctx *x, const char *path)
{
	struct jload j = {.c = c, .x = x, .file = path};
	cJSON *root = parse_file(path, c->err, sizeof(c->err));
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

/* ---- a JSON config as flags (crun-rdzvd --config) --------------------------------- */

static const struct cli_json_flag *find_jf(const struct cli_json_flag *t, size_t n,
					   const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(t[i].json, path) == 0)
			return &t[i];
	return NULL;
}

static bool jf_prefix(const struct cli_json_flag *t, size_t n, const char *path)
{
	size_t l = strlen(path);

	for (size_t i = 0; i < n; i++)
		if (strncmp(t[i].json, path, l) == 0 && t[i].json[l] == '.')
			return true;
	return false;
}

struct jflags {
	const struct cli_json_flag *t;
	size_t n;
	const char *file;
	char **argv;
	int argc, cap;
	char *err;
	size_t err_cap;
};

static int jf_fail(struct jflags *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int jf_fail(struct jflags *j, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(j->err, j->err_cap, "%s: ", j->file);

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < j->err_cap)
		vsnprintf(j->err + n, j->err_cap - (size_t)n, fmt, ap);
	va_end(ap);
	return CRUN_EINVAL;
}

static int jf_leaf(struct jflags *j, const struct cli_json_flag *f, const char *path,
		   const cJSON *v)
{
	char *arg = NULL;
	int r;

	if (f->number && cJSON_IsNumber(v) && v->valuedouble >= 0 &&
	    v->valuedouble == (double)(unsigned long long)v->valuedouble)
		r = asprintf(&arg, "--%s=%llu", f->flag, (unsigned long long)v->valuedouble);
	else if (!f->number && cJSON_IsString(v))
		r = asprintf(&arg, "--%s=%s", f->flag, v->valuestring);
	else {
		char *txt = cJSON_PrintUnformatted(v);

		r = jf_fail(j, "%s: expected %s, got %.60s", path,
			    f->number ? "a whole number" : "a string", txt ? txt : "?");
		free(txt);
		return r;
	}
	if (r < 0)
		return CRUN_ENOMEM;
	if (j->argc + 1 >= j->cap) {
		free(arg);
		return jf_fail(j, "too many settings");
	}
	j->argv[j->argc++] = arg;
	return 0;
}

static int jf_walk(struct jflags *j, const cJSON *obj, const char *prefix, int depth)
{
	const cJSON *v;

	cJSON_ArrayForEach(v, obj)
	{
		const struct cli_json_flag *f;
		char path[160];

		if (strcmp(v->string, "$comment") == 0)
			continue;
		snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", v->string);
		f = find_jf(j->t, j->n, path);
		if (f) {
			TRY(jf_leaf(j, f, path, v));
			continue;
		}
		if (!jf_prefix(j->t, j->n, path) || depth > 4)
			return jf_fail(j, "unknown key '%s'", path);
		if (!cJSON_IsObject(v))
			return jf_fail(j, "%s: expected an object", path);
		TRY(jf_walk(j, v, path, depth + 1));
	}
	return 0;
}

int cli_json_flags(const char *path, const struct cli_json_flag *table, size_t n, char ***ret_argv,
		   int *ret_argc, char *err, size_t err_cap)
{
	struct jflags j = {.t = table, .n = n, .file = path, .err = err, .err_cap = err_cap};
	cJSON *root = parse_file(path, err, err_cap);
	int r;

	if (!root)
		return CRUN_EINVAL;
	j.cap = (int)n + 2;
	j.argv = calloc((size_t)j.cap, sizeof(char *));
	r = j.argv ? jf_walk(&j, root, "", 0) : CRUN_ENOMEM;
	cJSON_Delete(root);
	if (r < 0) {
		for (int i = 0; j.argv && i < j.argc; i++)
			free(j.argv[i]);
		free(j.argv);
		return r;
	}
	*ret_argv = j.argv;
	*ret_argc = j.argc;
	return 0;
}
