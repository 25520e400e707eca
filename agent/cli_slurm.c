/* cli_slurm.c: `srun --ntasks-per-node=1 crun --nproc_per_node=8 train.py`
 * needs no rendezvous flags. Inside an allocation (SLURM_JOB_ID set) every
 * rendezvous setting that no flag, config key or PET_* variable gave is
 * filled from the allocation (agent/slurm.c reads it): c10d on the first host
 * of the node list at a port derived from the job id, the job id as the run
 * id, SLURM_NNODES nodes, and for the static backend SLURM_NODEID as the node
 * rank with the store on the first host. --standalone and --no_slurm leave everything alone.
 */
#include <stdio.h>

#include "agent/cli.h"
#include "agent/slurm.h"
#include "agent/cli_int.h"
#include "common/common.h"

/* Sets row id from the allocation unless something set it already. */
static int fill(struct cli *c, struct cli_ctx *x, enum cli_id id, const char *v, const char *from)
{
	if (x->src[id] >= SRC_ENV)
		return 0;
	x->val[id] = cli_keep(c, v);
	if (!x->val[id])
		return cli_fail(c, "out of memory");
	x->src[id] = SRC_ENV;
	snprintf(x->who[id], sizeof(x->who[id]), "%s", from);
	return 0;
}

int cli_slurm_defaults(struct cli *c, struct cli_ctx *x)
{
	struct slurm_job j;
	char num[32], ep[SLURM_HOST_MAX + 8];
	bool is_static;
	int r;

	if (cli_on(x, OPT_NO_SLURM) || cli_on(x, OPT_STANDALONE) || !x->env)
		return 0;
	r = slurm_job_from_env(x->env, &j);
	if (r == CRUN_ENOTFOUND)
		return 0;
	if (r < 0)
		return cli_fail(c, "SLURM_JOB_ID is set but SLURM_NNODES, SLURM_NODEID or "
				   "SLURM_JOB_NODELIST is missing or malformed (--no_slurm ignores "
				   "the allocation)");
	is_static =
	    x->src[OPT_RDZV_BACKEND] >= SRC_ENV && strcmp(x->val[OPT_RDZV_BACKEND], "static") == 0;
	TRY(fill(c, x, OPT_RDZV_BACKEND, "c10d", "SLURM_JOB_ID"));
	snprintf(num, sizeof(num), "%d", j.nnodes);
	TRY(fill(c, x, OPT_NNODES, num, "SLURM_NNODES"));
	snprintf(num, sizeof(num), "%lu", j.job_id);
	TRY(fill(c, x, OPT_RDZV_ID, num, "SLURM_JOB_ID"));
	if (is_static) {
		/* Only the static backend takes a node rank; c10d assigns them. */
		snprintf(num, sizeof(num), "%d", j.node_id);
		TRY(fill(c, x, OPT_NODE_RANK, num, "SLURM_NODEID"));
		TRY(fill(c, x, OPT_MASTER_ADDR, j.first_host, "SLURM_JOB_NODELIST"));
		snprintf(num, sizeof(num), "%u", j.port);
		return fill(c, x, OPT_MASTER_PORT, num, "SLURM_JOB_ID");
	}
	if (x->src[OPT_MASTER_ADDR] >= SRC_ENV)
		return 0; /* the user named the rendezvous host another way */
	snprintf(ep, sizeof(ep), "%s:%u", j.first_host, j.port);
	return fill(c, x, OPT_RDZV_ENDPOINT, ep, "SLURM_JOB_NODELIST");
}
