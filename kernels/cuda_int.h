/* cuda_int.h: what the files of the GPU object (libcrun-cuda.so.0: the .cu
 * kernels and worker_sdk/nccl*.c) share. Plain C declarations, no CUDA
 * types, so the NCCL backend's C files include it too. Never part of
 * libcrun itself.
 */
#ifndef CRUN_KERNELS_CUDA_INT_H
#define CRUN_KERNELS_CUDA_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A CUDA runtime error (cudaError_t as int) to a crun code; remembers its
 * text for kernels_cu_last_error() on this thread. 0 stays 0. */
int kernels_cu_err(int cuda_err, const char *what);
const char *kernels_cu_last_error(void);

/* crun_dtype_size() without linking libcrun: the values are ABI. */
static inline size_t kernels_cu_dtype_size(int dtype)
{
	static const unsigned char sizes[] = {4, 8, 2, 2, 1, 1, 4, 8}; /* crun_dtype_t order */

	return dtype >= 0 && dtype < (int)sizeof(sizes) ? sizes[dtype] : 0;
}

/* The kernels door (cuda_ops.cu), also the NCCL backend's device check. */
const struct kernels_cuda_ops *crun_cuda_kernels_v1(int abi, char *err, size_t cap);

int kernels_cu_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
			size_t ldb, float *c, size_t ldc, int accumulate, void *stream);
int kernels_cu_gemm_tc(size_t m, size_t n, size_t k, int dtype, const void *a, size_t lda,
		       const void *b, size_t ldb, float *c, size_t ldc, int accumulate,
		       void *stream);
int kernels_cu_reduce(void *dst, const void *src, size_t count, int dtype, int op, void *stream);
/* buf[i] /= divisor (integers truncate), as kernels_div. */
int kernels_cu_div(void *buf, size_t count, int dtype, int64_t divisor, void *stream);
int kernels_cu_reduce_multi(void *dst, const void *const *bufs, int nbufs, size_t count, int dtype,
			    int op, void *stream);

int kernels_cu_ipc_all_reduce(const struct kernels_ipc_args *a, void *dst, size_t count, int dtype,
			      int op, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_KERNELS_CUDA_INT_H */
