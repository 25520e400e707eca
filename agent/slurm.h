/* slurm.h: defaults from a Slurm allocation (slurm.c). */
#ifndef CRUN_AGENT_SLURM_H
#define CRUN_AGENT_SLURM_H

#include <stddef.h>
#include <stdint.h>
#define SLURM_MAX_HOSTS 65536
#define SLURM_PORT_BASE 20000 /* rendezvous port = base + job id % span */
#define SLURM_PORT_SPAN 9000
#define SLURM_HOST_MAX	256

struct slurm_job {
	unsigned long job_id;		 /* SLURM_JOB_ID: the run id */
	int nnodes;			 /* SLURM_NNODES */
	int node_id;			 /* SLURM_NODEID */
	char first_host[SLURM_HOST_MAX]; /* first of SLURM_JOB_NODELIST: the endpoint */
	uint16_t port;			 /* derived from the job id */
};

/* Expands a Slurm hostlist ("gpu[01-04,07],login2") into at most max names
 * (malloc'd array of malloc'd strings; free with slurm_hostlist_free).
 * CRUN_EINVAL on bad syntax, CRUN_ERANGE past max. */
int slurm_hostlist_expand(const char *list, size_t max, char ***ret_hosts, size_t *ret_n);
void slurm_hostlist_free(char **hosts, size_t n);
/* The allocation's facts from env: CRUN_ENOTFOUND outside Slurm (no
 * SLURM_JOB_ID), CRUN_EINVAL when a variable is missing or malformed. */
int slurm_job_from_env(char *const *env, struct slurm_job *ret_job);

#endif /* CRUN_AGENT_SLURM_H */
