/* env.c: the worker environment of torch-compat §4.2 (a copy of the agent's
 * environment updated with the torchrun variables) and the worker argv with
 * torchrun's "${local_rank}" substitution.
 */
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include "agent/env.h"
#include "common/common.h"

#define ENV_MAX_VARS 65536

struct envb {
	char **v;
	size_t n, cap;
	bool oom;
};

char **env_copy(char *const *env)
{
	size_t n = 0;
	char **out;

	while (env && env[n] && n < ENV_MAX_VARS)
		n++;
	out = calloc(n + 1, sizeof(char *));
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		out[i] = str_dup(env[i]);
		if (!out[i]) {
			env_free(out);
			return NULL;
		}
	}
	return out;
}

void env_free(char **env)
{
	if (!env)
		return;
	for (size_t i = 0; env[i]; i++)
		free(env[i]);
	free(env);
}

const char *env_get(char *const *env, const char *name)
{
	size_t l = strlen(name);

	for (size_t i = 0; env && env[i]; i++)
		if (strncmp(env[i], name, l) == 0 && env[i][l] == '=')
			return env[i] + l + 1;
	return NULL;
}

static void eb_set(struct envb *b, const char *name, const char *val)
{
	size_t l = strlen(name);
	size_t sz = l + strlen(val) + 2;
	char *s;

	if (b->oom)
		return;
	s = malloc(sz);
	if (!s) {
		b->oom = true;
		return;
	}
	snprintf(s, sz, "%s=%s", name, val);
	for (size_t i = 0; i < b->n; i++) {
		if (strncmp(b->v[i], name, l) == 0 && b->v[i][l] == '=') {
			free(b->v[i]);
			b->v[i] = s;
			return;
		}
	}
	if (b->n + 2 > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		char **v = realloc(b->v, cap * sizeof(char *));

		if (!v) {
			free(s);
			b->oom = true;
			return;
		}
		b->v = v;
		b->cap = cap;
	}
	b->v[b->n++] = s;
	b->v[b->n] = NULL;
}

static void eb_seti(struct envb *b, const char *name, long v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%ld", v);
	eb_set(b, name, buf);
}

/* torchrun's --virtual-local-rank: the worker sees one device as device 0,
 * the local_rank-th of an inherited CUDA_VISIBLE_DEVICES (HIP_VISIBLE_DEVICES
 * first on ROCm, where it wins), else the local_rank-th device. The count is
 * checked when the agent is made (agent.c). */
static void set_visible_device(struct envb *b, char *const *base, int local_rank)
{
	const char *hip = env_get(base, "HIP_VISIBLE_DEVICES");
	const char *list = hip && *hip ? hip : env_get(base, "CUDA_VISIBLE_DEVICES");
	char dev[64];

	snprintf(dev, sizeof(dev), "%d", local_rank);
	if (list) {
		const char *p = list;
		size_t len;

		for (int i = 0; i < local_rank && p; i++)
			if ((p = strchr(p, ',')))
				p++;
		if (p) {
			while (*p == ' ')
				p++;
			len = strcspn(p, ",");
			while (len && p[len - 1] == ' ')
				len--;
			snprintf(dev, sizeof(dev), "%.*s", (int)len, p);
		}
	}
	eb_set(b, "CUDA_VISIBLE_DEVICES", dev);
	if (hip && *hip)
		eb_set(b, "HIP_VISIBLE_DEVICES", dev);
}

const char *env_python(char *const *env, char *buf, size_t cap)
{
	const char *py = env_get(env, "PYTHON_EXEC");
	char self[PATH_MAX];
	ssize_t n;

	/* torchrun runs workers with PYTHON_EXEC or its own interpreter; the
	 * nearest thing crun has to "its own" is the python3 installed beside
	 * it (a venv's bin/), so a venv's crun finds the venv's torch. */
	if (py && *py)
		return py;
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = '\0';
		slash = strrchr(self, '/');
		if (slash && str_printf(buf, cap, "%.*s/python3", (int)(slash - self), self) >= 0 &&
		    access(buf, X_OK) == 0)
			return buf;
	}
	return "python3";
}

char **env_build(char *const *base, const struct env_vars *v)
{
	struct envb b = {0};
	const char *inh;

	for (size_t i = 0; base && base[i] && i < ENV_MAX_VARS; i++) {
		const char *eq = strchr(base[i], '=');
		char name[256];

		if (!eq || (size_t)(eq - base[i]) >= sizeof(name))
			continue;
		memcpy(name, base[i], (size_t)(eq - base[i]));
		name[eq - base[i]] = '\0';
		eb_set(&b, name, eq + 1);
	}
	eb_seti(&b, "LOCAL_RANK", v->virtual_local_rank ? 0 : v->local_rank);
	eb_seti(&b, "RANK", v->rank);
	eb_seti(&b, "GROUP_RANK", v->group_rank);
	eb_seti(&b, "ROLE_RANK", v->role_rank);
	eb_set(&b, "ROLE_NAME", v->role);
	eb_seti(&b, "LOCAL_WORLD_SIZE", v->local_world_size);
	eb_seti(&b, "WORLD_SIZE", v->world_size);
	eb_seti(&b, "GROUP_WORLD_SIZE", v->group_world_size);
	eb_seti(&b, "ROLE_WORLD_SIZE", v->role_world_size);
	eb_set(&b, "MASTER_ADDR", v->master_addr);
	eb_seti(&b, "MASTER_PORT", v->master_port);
	eb_seti(&b, "TORCHELASTIC_RESTART_COUNT", v->restart_count);
	eb_seti(&b, "TORCHELASTIC_MAX_RESTARTS", v->max_restarts);
	eb_set(&b, "TORCHELASTIC_RUN_ID", v->run_id);
	/* The workers are always clients of the agent's store (2.x semantics;
	 * 1.13 workers then use the /worker/attempt_<n>/ prefix). */
	eb_set(&b, "TORCHELASTIC_USE_AGENT_STORE", "True");
	eb_set(&b, "TORCHELASTIC_ERROR_FILE", v->error_file ? v->error_file : "");
	inh = env_get(base, "NCCL_ASYNC_ERROR_HANDLING");
	eb_set(&b, "NCCL_ASYNC_ERROR_HANDLING", inh ? inh : "1");
	inh = env_get(base, "TORCH_NCCL_ASYNC_ERROR_HANDLING");
	eb_set(&b, "TORCH_NCCL_ASYNC_ERROR_HANDLING", inh ? inh : "1");
	if (v->signals)
		eb_set(&b, "TORCHELASTIC_SIGNALS_TO_HANDLE", v->signals);
	if (v->virtual_local_rank)
		set_visible_device(&b, base, v->local_rank);
	/* C workers authenticate their TCP mesh with the job's secret. */
	if (v->auth_secret_file && *v->auth_secret_file)
		eb_set(&b, "CRUN_AUTH_SECRET_FILE", v->auth_secret_file);
	if (b.oom || !b.v) {
		env_free(b.v);
		return NULL;
	}
	return b.v;
}

char **env_argv_subst(char *const *argv, int local_rank)
{
	static const char pat[] = "${local_rank}";
	size_t n = 0;
	char **out;
	char num[16];

	snprintf(num, sizeof(num), "%d", local_rank);
	while (argv[n])
		n++;
	out = calloc(n + 1, sizeof(char *));
	if (!out)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		const char *s = argv[i];
		size_t cap = strlen(s) + 1, o = 0;
		const char *p;
		char *d;

		for (p = strstr(s, pat); p; p = strstr(p + 1, pat))
			cap += strlen(num);
		d = malloc(cap);
		if (!d) {
			env_free(out);
			return NULL;
		}
		while (*s) {
			if (strncmp(s, pat, sizeof(pat) - 1) == 0) {
				memcpy(d + o, num, strlen(num));
				o += strlen(num);
				s += sizeof(pat) - 1;
			} else {
				d[o++] = *s++;
			}
		}
		d[o] = '\0';
		out[i] = d;
	}
	return out;
}
