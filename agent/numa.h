/* numa.h: --numa-binding: a GPU's NUMA node, socket or cores from sysfs (numa.c). */
#ifndef CRUN_AGENT_NUMA_H
#define CRUN_AGENT_NUMA_H

#include <sched.h>
/* For --numa-binding: the cpu list (as in sysfs, "0-3,8-11") each of the
 * first n GPUs should run on, read under `root` ("" = the real /). Modes:
 * node (the GPU's NUMA node), socket (every node of its package),
 * exclusive (the node's cpus split evenly between the GPUs sharing it),
 * core-complex (the cpus sharing the L3 cache with the first cpu of the
 * share exclusive gives). Returns 0 and a malloc'd array of n malloc'd
 * strings (free with numa_free), CRUN_ENOENT when there are fewer than n
 * GPUs, CRUN_EINVAL for an unknown mode, or -errno. */
int numa_cpus_for_gpus(const char *root, const char *mode, int n, char ***ret);
void numa_free(char **cpus, int n);
/* "0-3,8" -> mask; 0 or CRUN_EINVAL. */
int numa_parse_cpulist(const char *list, cpu_set_t *ret);

#endif /* CRUN_AGENT_NUMA_H */
