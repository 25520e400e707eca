/* device.c: which CUDA device a rank uses, as a pure function of its local
 * rank, the local world size and how many devices it sees. Compiled into
 * libcrun (for its unit tests) and into the GPU object (nccl.c calls it),
 * which links nothing of libcrun.
 */
#include "crun/crun.h"
#include "kernels/kernels.h"

/* Launchers that narrow CUDA_VISIBLE_DEVICES per rank (SLURM's gres, crun's
 * own --virtual-local-rank, Kubernetes device plugins) leave each rank fewer
 * devices than ranks: then it is LOCAL_RANK % visible, as PyTorch programs
 * write torch.cuda.set_device(local_rank % device_count()). With every
 * device visible to every rank it stays LOCAL_RANK. */
int kernels_pick_device(int local_rank, int local_world_size, int visible, int *ret_dev)
{
	if (visible < 1 || local_rank < 0 || local_world_size < 1 || local_rank >= local_world_size)
		return CRUN_ENOTSUP;
	if (visible < local_world_size) {
		*ret_dev = local_rank % visible;
		return 0;
	}
	*ret_dev = local_rank;
	return 0;
}
