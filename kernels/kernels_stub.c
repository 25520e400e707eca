/* kernels_stub.c: what CPU-only builds (WITH_CUDA=0) link instead of
 * kernels/ *.cu: every CUDA entry point of kernels.h says CRUN_ENOTSUP, so
 * callers fall back to the CPU path (NCCL's stub-transport pattern).
 */
#include "common/common.h"
#include "kernels/kernels.h"

int kernels_available(void)
{
	return 0;
}

int kernels_cuda_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
			  size_t ldb, float *c, size_t ldc, int accumulate, void *stream)
{
	return CRUN_ENOTSUP;
}

int kernels_cuda_reduce(void *dst, const void *src, size_t count, int dtype, int op, void *stream)
{
	return CRUN_ENOTSUP;
}

int kernels_cuda_all_reduce(void *dst, const void *const *bufs, int nbufs, size_t count, int dtype,
			    int op, void *stream)
{
	return CRUN_ENOTSUP;
}

int kernels_cuda_sync(void *stream)
{
	return CRUN_ENOTSUP;
}
