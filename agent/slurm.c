/* slurm.c: what a Slurm allocation tells crun, as pure functions of the
 * environment (no I/O), so `srun --ntasks-per-node=1 crun ... train.py` needs
 * no rendezvous flags. Slurm's hostlist syntax ("gpu[01-04,07],login2",
 * "rack[1-2]-n[1-3]") is expanded here rather than by running `scontrol show
 * hostnames`: the agent must not depend on Slurm's tools being on PATH of
 * every compute node, and only the first host is needed on the hot path.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/env.h"
#include "agent/slurm.h"
#include "common/common.h"

struct hostvec {
	char **hosts;
	size_t n, cap;
};

/* One range of a bracket "[01-04,07]": "01-04" or "07". */
struct range {
	unsigned long lo, hi;
	int width; /* digits of lo as written: "01" pads to 2 */
};

#define SLURM_MAX_RANGES 256

/* Parses the inside of one bracket (s .. end, exclusive) into ranges. */
static int bracket_parse(const char *s, const char *end, struct range *rs, size_t *ret_n,
			 unsigned long long *ret_count)
{
	size_t n = 0;
	unsigned long long count = 0;

	while (s < end) {
		const char *start = s;
		char *e;
		struct range r;

		if (n == SLURM_MAX_RANGES || !isdigit((unsigned char)*s))
			return CRUN_EINVAL;
		errno = 0;
		r.lo = strtoul(s, &e, 10);
		if (errno || e > end)
			return CRUN_EINVAL;
		r.width = (int)(e - start);
		r.hi = r.lo;
		s = e;
		if (s < end && *s == '-') {
			s++;
			if (s >= end || !isdigit((unsigned char)*s))
				return CRUN_EINVAL;
			errno = 0;
			r.hi = strtoul(s, &e, 10);
			if (errno || e > end || r.hi < r.lo)
				return CRUN_EINVAL;
			s = e;
		}
		if (s < end && *s++ != ',')
			return CRUN_EINVAL;
		if (s == end && s[-1] == ',')
			return CRUN_EINVAL;
		count += r.hi - r.lo + 1;
		rs[n++] = r;
	}
	if (n == 0)
		return CRUN_EINVAL;
	*ret_n = n;
	*ret_count = count;
	return 0;
}

/* The idx-th value of a parsed bracket, zero-padded as written. */
static int bracket_value(const struct range *rs, size_t n, unsigned long long idx, char *out,
			 size_t cap)
{
	for (size_t i = 0; i < n; i++) {
		unsigned long long span = rs[i].hi - rs[i].lo + 1;

		if (idx < span) {
			int w = snprintf(out, cap, "%0*llu", rs[i].width,
					 (unsigned long long)rs[i].lo + idx);
			return w < 0 || (size_t)w >= cap ? CRUN_EINVAL : w;
		}
		idx -= span;
	}
	return CRUN_EINVAL;
}

/* Appends one host name (s .. end) to the growing list. */
static int host_push(const char *s, const char *end, size_t max, struct hostvec *v)
{
	if (v->n == max)
		return CRUN_ERANGE;
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 16;
		char **h = reallocarray(v->hosts, cap, sizeof(*h));

		if (!h)
			return CRUN_ENOMEM;
		v->hosts = h;
		v->cap = cap;
	}
	v->hosts[v->n] = strndup(s, (size_t)(end - s));
	if (!v->hosts[v->n])
		return CRUN_ENOMEM;
	v->n++;
	return 0;
}

/* One top-level entry (no top-level commas inside): expands to its hosts,
 * the cartesian product of its brackets, appended to v. */
static int entry_expand(const char *s, const char *end, size_t max, struct hostvec *v)
{
	struct range rs[SLURM_MAX_RANGES];
	const char *open = memchr(s, '[', (size_t)(end - s));
	const char *close;
	size_t nr;
	unsigned long long count;
	int r;

	if (!open) {
		if (end == s || memchr(s, ']', (size_t)(end - s)))
			return CRUN_EINVAL;
		return host_push(s, end, max, v);
	}
	close = memchr(open, ']', (size_t)(end - open));
	if (!close || memchr(s, ']', (size_t)(open - s)))
		return CRUN_EINVAL;
	r = bracket_parse(open + 1, close, rs, &nr, &count);
	if (r < 0)
		return r;
	if (count > max)
		return CRUN_ERANGE;
	for (unsigned long long i = 0; i < count; i++) {
		char buf[512];
		size_t plen = (size_t)(open - s);
		int w;

		if (plen >= sizeof(buf))
			return CRUN_EINVAL;
		memcpy(buf, s, plen);
		w = bracket_value(rs, nr, i, buf + plen, sizeof(buf) - plen);
		if (w < 0)
			return w;
		/* The rest may hold more brackets: recurse on "prefix+value+rest". */
		{
			size_t rest = (size_t)(end - close - 1);
			size_t have = plen + (size_t)w;

			if (have + rest >= sizeof(buf))
				return CRUN_EINVAL;
			memcpy(buf + have, close + 1, rest);
			r = entry_expand(buf, buf + have + rest, max, v);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

void slurm_hostlist_free(char **hosts, size_t n)
{
	if (!hosts)
		return;
	for (size_t i = 0; i < n; i++)
		free(hosts[i]);
	free(hosts);
}

int slurm_hostlist_expand(const char *list, size_t max, char ***ret_hosts, size_t *ret_n)
{
	struct hostvec v = {0};
	const char *s = list;
	int r = 0;

	if (!list || !*list || max == 0)
		return CRUN_EINVAL;
	while (*s) {
		const char *e = s;
		int depth = 0;

		/* A top-level comma ends an entry; commas inside brackets do not. */
		for (; *e && (depth || *e != ','); e++) {
			if (*e == '[' && depth++)
				break;
			if (*e == ']' && --depth < 0)
				break;
		}
		if (depth != 0 || (*e && *e != ',')) {
			r = CRUN_EINVAL;
			goto fail;
		}
		r = entry_expand(s, e, max, &v);
		if (r < 0)
			goto fail;
		s = *e ? e + 1 : e;
		if (*e && !*s) { /* trailing comma */
			r = CRUN_EINVAL;
			goto fail;
		}
	}
	*ret_hosts = v.hosts;
	*ret_n = v.n;
	return 0;
fail:
	slurm_hostlist_free(v.hosts, v.n);
	return r;
}

static int env_ulong(char *const *env, const char *name, unsigned long max, unsigned long *ret)
{
	const char *v = env_get(env, name);
	char *e;
	unsigned long x;

	if (!v || !*v)
		return CRUN_ENOTFOUND;
	errno = 0;
	x = strtoul(v, &e, 10);
	if (errno || *e || x > max)
		return CRUN_EINVAL;
	*ret = x;
	return 0;
}

int slurm_job_from_env(char *const *env, struct slurm_job *ret_job)
{
	struct slurm_job j = {0};
	char **hosts = NULL;
	size_t nhosts = 0;
	unsigned long v;
	const char *list;
	int r;

	r = env_ulong(env, "SLURM_JOB_ID", 0xffffffffUL, &v);
	if (r == CRUN_ENOTFOUND)
		return r; /* not inside an allocation */
	if (r < 0)
		goto bad;
	j.job_id = v;
	r = env_ulong(env, "SLURM_NNODES", SLURM_MAX_HOSTS, &v);
	if (r < 0 || v == 0)
		goto bad;
	j.nnodes = (int)v;
	r = env_ulong(env, "SLURM_NODEID", SLURM_MAX_HOSTS - 1, &v);
	if (r < 0 || v >= (unsigned long)j.nnodes)
		goto bad;
	j.node_id = (int)v;
	list = env_get(env, "SLURM_JOB_NODELIST");
	if (!list)
		list = env_get(env, "SLURM_NODELIST");
	/* The job's list may name more hosts than this step uses: bound it by
	 * the largest allocation, not by SLURM_NNODES. */
	r = list ? slurm_hostlist_expand(list, SLURM_MAX_HOSTS, &hosts, &nhosts) : CRUN_EINVAL;
	if (r < 0 || nhosts == 0 || strlen(hosts[0]) >= sizeof(j.first_host)) {
		slurm_hostlist_free(hosts, nhosts);
		goto bad;
	}
	snprintf(j.first_host, sizeof(j.first_host), "%s", hosts[0]);
	slurm_hostlist_free(hosts, nhosts);
	/* Below the default ephemeral range (32768-60999) and away from the
	 * well-known 29400/29500, so that concurrent jobs rarely share a port. */
	j.port = (uint16_t)(SLURM_PORT_BASE + j.job_id % SLURM_PORT_SPAN);
	*ret_job = j;
	return 0;
bad:
	return CRUN_EINVAL;
}
