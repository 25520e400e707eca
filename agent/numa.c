/* numa.c: --numa-binding, torchrun's torch/numa/binding.py in C. The GPU of
 * local rank i is the i-th NVIDIA device in PCI address order (nvidia-smi's
 * order, and CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID); its NUMA node comes
 * from /sys/bus/pci/devices/<bdf>/numa_node (-1 counts as node 0, as there)
 * and the cpus from /sys/devices/system/{node,cpu}. Everything is read under
 * a root path so that tests run on a fake sysfs tree. Pure apart from reads.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/numa.h"
#include "common/common.h"

#define NUMA_MAX_GPUS 64

int numa_parse_cpulist(const char *list, cpu_set_t *ret)
{
	cpu_set_t set;
	const char *p = list;

	CPU_ZERO(&set);
	while (*p && *p != '\n') {
		char *end;
		unsigned long a = strtoul(p, &end, 10), b = a;

		if (end == p)
			return CRUN_EINVAL;
		if (*end == '-') {
			p = end + 1;
			b = strtoul(p, &end, 10);
			if (end == p || b < a)
				return CRUN_EINVAL;
		}
		if (b >= CPU_SETSIZE)
			return CRUN_EINVAL;
		for (unsigned long c = a; c <= b; c++)
			CPU_SET(c, &set);
		p = end;
		if (*p == ',')
			p++;
		else if (*p && *p != '\n')
			return CRUN_EINVAL;
	}
	*ret = set;
	return 0;
}

static char *cpulist_of(const cpu_set_t *set)
{
	char buf[8192];
	size_t o = 0;

	buf[0] = '\0';
	for (int c = 0; c < CPU_SETSIZE; c++) {
		int e = c;

		if (!CPU_ISSET(c, set))
			continue;
		while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
			e++;
		o += (size_t)snprintf(buf + o, sizeof(buf) - o, e > c ? "%s%d-%d" : "%s%d",
				      o ? "," : "", c, e);
		if (o >= sizeof(buf))
			return NULL;
		c = e;
	}
	return str_dup(buf);
}

static int read_line(const char *root, const char *path, char *buf, size_t cap)
{
	char full[PATH_MAX];
	FILE *f;
	int r = 0;

	TRY(str_printf(full, sizeof(full), "%s%s", root, path));
	f = fopen(full, "re");
	if (!f)
		return -errno;
	if (!fgets(buf, (int)cap, f))
		r = CRUN_EIO;
	fclose(f);
	return r;
}

static int read_cpus(const char *root, const char *path, cpu_set_t *ret)
{
	char buf[4096];

	TRY(read_line(root, path, buf, sizeof(buf)));
	return numa_parse_cpulist(buf, ret);
}

static int read_int(const char *root, const char *path, long *ret)
{
	char buf[64], *end;

	TRY(read_line(root, path, buf, sizeof(buf)));
	*ret = strtol(buf, &end, 10);
	return end == buf ? CRUN_EINVAL : 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* NUMA node of every NVIDIA GPU in PCI order; returns the count. */
static int gpu_nodes(const char *root, int *nodes, int cap)
{
	char dir[PATH_MAX], *names[NUMA_MAX_GPUS];
	struct dirent *de;
	DIR *d;
	int n = 0;

	TRY(str_printf(dir, sizeof(dir), "%s/sys/bus/pci/drivers/nvidia", root));
	d = opendir(dir);
	if (!d)
		return 0;
	while ((de = readdir(d)) && n < NUMA_MAX_GPUS) {
		unsigned dom, bus, dev, fn;

		if (sscanf(de->d_name, "%x:%x:%x.%x", &dom, &bus, &dev, &fn) == 4)
			names[n++] = str_dup(de->d_name);
	}
	closedir(d);
	qsort(names, (size_t)n, sizeof(names[0]), cmp_str);
	for (int i = 0; i < n; i++) {
		char path[PATH_MAX];
		long node = 0;

		if (i < cap &&
		    str_printf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node",
			       names[i] ? names[i] : "") >= 0 &&
		    read_int(root, path, &node) == 0)
			nodes[i] = node < 0 ? 0 : (int)node;
		else if (i < cap)
			nodes[i] = 0;
		free(names[i]);
	}
	return n;
}

static int node_cpus(const char *root, int node, const cpu_set_t *allowed, cpu_set_t *ret)
{
	char path[128];

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d/cpulist", node);
	TRY(read_cpus(root, path, ret));
	if (allowed)
		CPU_AND(ret, ret, allowed);
	return CPU_COUNT(ret) ? 0 : CRUN_ENOENT;
}

static int first_cpu(const cpu_set_t *s)
{
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, s))
			return c;
	return -1;
}

/* The lowest cpu sharing cpu c's `what` (thread siblings or max-level cache). */
static int group_key(const char *root, int c, bool cache)
{
	char path[160];
	cpu_set_t s;

	if (!cache) {
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
		return read_cpus(root, path, &s) == 0 ? first_cpu(&s) : c;
	}
	int best_level = -1, key = c;

	for (int i = 0; i < 16; i++) {
		char buf[64];
		long level;

		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/cache/index%d/type", c,
			 i);
		if (read_line(root, path, buf, sizeof(buf)) < 0)
			break;
		if (strncmp(buf, "Unified", 7) != 0 && strncmp(buf, "Data", 4) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/cache/index%d/level", c,
			 i);
		if (read_int(root, path, &level) < 0 || level <= best_level)
			continue;
		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", c, i);
		if (read_cpus(root, path, &s) == 0) {
			best_level = (int)level;
			key = first_cpu(&s);
		}
	}
	return key;
}

/* Groups the cpus of `in` by group_key; groups[i] sorted by key. */
static int group_cpus(const char *root, const cpu_set_t *in, bool cache, cpu_set_t *groups,
		      int *keys, int cap)
{
	int n = 0;

	for (int c = 0; c < CPU_SETSIZE; c++) {
		int k, g;

		if (!CPU_ISSET(c, in))
			continue;
		k = group_key(root, c, cache);
		for (g = 0; g < n && keys[g] != k; g++)
			;
		if (g == n) {
			if (n == cap)
				return CRUN_ETOOBIG;
			keys[n] = k;
			CPU_ZERO(&groups[n]);
			n++;
		}
		CPU_SET(c, &groups[g]);
	}
	return n;
}

static int bind_one(const char *root, const char *mode, const int *nodes, int ngpus, int gpu,
		    const cpu_set_t *allowed, cpu_set_t *ret)
{
	enum { MAXG = 512 };
	int node = nodes[gpu], rel = 0, share = 0;
	cpu_set_t cpus;

	TRY(node_cpus(root, node, allowed, &cpus));
	for (int i = 0; i < ngpus; i++) {
		if (nodes[i] != node)
			continue;
		rel += i < gpu;
		share++;
	}
	if (strcmp(mode, "node") == 0) {
		*ret = cpus;
		return 0;
	}
	if (strcmp(mode, "socket") == 0) {
		char path[128];
		long pkg, other;

		snprintf(path, sizeof(path),
			 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
			 first_cpu(&cpus));
		TRY(read_int(root, path, &pkg));
		CPU_ZERO(ret);
		for (int nd = 0; nd < 1024; nd++) {
			cpu_set_t s;

			if (node_cpus(root, nd, allowed, &s) < 0)
				continue;
			snprintf(path, sizeof(path),
				 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id",
				 first_cpu(&s));
			if (read_int(root, path, &other) == 0 && other == pkg)
				CPU_OR(ret, ret, &s);
		}
		return 0;
	}
	if (strcmp(mode, "exclusive") == 0 || strcmp(mode, "core-complex") == 0) {
		bool cc = mode[0] == 'c';
		cpu_set_t *groups = calloc(MAXG, sizeof(*groups));
		int keys[MAXG];
		int n = groups ? group_cpus(root, &cpus, cc, groups, keys, MAXG) : CRUN_ENOMEM;
		int r = 0;

		if (n <= 0) { /* no core group in the node: nothing to bind to */
			free(groups);
			return n < 0 ? n : CRUN_ENOENT;
		}
		CPU_ZERO(ret);
		if (!cc) { /* physical cores, in key order, split between the GPUs */
			int per = n / share, extra = n % share;
			int start = rel * per + MIN(rel, extra);
			int end = start + per + (rel < extra);

			if (per < 1)
				r = CRUN_ETOOBIG;
			for (int k = 0, idx = 0; r == 0 && k < CPU_SETSIZE; k++)
				for (int g = 0; g < n; g++)
					if (keys[g] == k && idx++ >= start && idx <= end)
						CPU_OR(ret, ret, &groups[g]);
		} else { /* biggest cache groups first, then lowest key */
			int order[MAXG] = {0};

			for (int i = 0; i < n; i++)
				order[i] = i;
			for (int i = 1; i < n; i++)
				for (int j = i; j > 0; j--) {
					int a = order[j - 1], b = order[j];
					int ca = CPU_COUNT(&groups[a]), cb = CPU_COUNT(&groups[b]);

					if (ca > cb || (ca == cb && keys[a] < keys[b]))
						break;
					order[j - 1] = b;
					order[j] = a;
				}
			*ret = groups[order[rel % n]];
		}
		free(groups);
		return r;
	}
	return CRUN_EINVAL;
}

void numa_free(char **cpus, int n)
{
	if (!cpus)
		return;
	for (int i = 0; i < n; i++)
		free(cpus[i]);
	free(cpus);
}

int numa_cpus_for_gpus(const char *root, const char *mode, int n, char ***ret)
{
	int nodes[NUMA_MAX_GPUS];
	cpu_set_t allowed, *pa = NULL;
	char **out;
	int ngpus, r = 0;

	if (!mode || n < 1)
		return CRUN_EINVAL;
	if (strcmp(mode, "node") && strcmp(mode, "socket") && strcmp(mode, "exclusive") &&
	    strcmp(mode, "core-complex"))
		return CRUN_EINVAL;
	if (!root)
		root = "";
	/* The real machine: only the cpus this process may use (torchrun too). */
	if (!*root && sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
		pa = &allowed;
	ngpus = gpu_nodes(root, nodes, NUMA_MAX_GPUS);
	if (ngpus < 0)
		return ngpus;
	if (ngpus < n)
		return CRUN_ENOENT;
	out = calloc((size_t)n, sizeof(char *));
	if (!out)
		return CRUN_ENOMEM;
	for (int i = 0; i < n && r == 0; i++) {
		cpu_set_t s;

		r = bind_one(root, mode, nodes, ngpus, i, pa, &s);
		if (r == 0 && !(out[i] = cpulist_of(&s)))
			r = CRUN_ENOMEM;
	}
	if (r < 0) {
		numa_free(out, n);
		return r;
	}
	*ret = out;
	return 0;
}
