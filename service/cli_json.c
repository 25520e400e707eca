/* cli_json.c: a JSON config file read and parsed (crun-agent's and
 * crun-rdzvd's --config), and such a file read as flags, for programs whose
 * options are a getopt table (crun-rdzvd): each known leaf becomes
 * "--flag=value", parsed before the command line so that its flags win.
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

#include "common/common.h"
#include "service/service.h"

#define CONFIG_MAX_BYTES (1u << 20) /* a config is a few KiB */

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
cJSON *cli_json_parse_file(const char *path, char *err, size_t cap)
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
	cJSON *root = cli_json_parse_file(path, err, err_cap);
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
