/* dtype.c: the element sizes of the SDK's data types (crun/worker.h). Its
 * own file because every transport (shm.c, tcp.c) and the algorithms need
 * it while the process group (pg.c) needs them: kept in pg.c it tied them
 * all into one cycle of seven files.
 */
#include "worker_sdk/worker.h"

size_t crun_dtype_size(int dtype)
{
	static const size_t sizes[CRUN_DTYPE__MAX] = {
	    [CRUN_F32] = 4, [CRUN_F64] = 8, [CRUN_F16] = 2, [CRUN_BF16] = 2,
	    [CRUN_I8] = 1,  [CRUN_U8] = 1,  [CRUN_I32] = 4, [CRUN_I64] = 8,
	};

	return dtype >= 0 && dtype < CRUN_DTYPE__MAX ? sizes[dtype] : 0;
}
