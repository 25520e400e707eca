/* kernels.h: the only door into crun's compute kernels: CPU reductions for
 * every dtype x op (vectorised, f16/bf16 through f32), a blocked CPU GEMM,
 * and the CUDA entry points (kernels/ *.cu, or kernels_stub.c in CPU-only
 * builds, where they return CRUN_ENOTSUP). No CUDA type crosses this header:
 * device pointers and streams travel as void *.
 */
#ifndef CRUN_KERNELS_H
#define CRUN_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "crun/worker.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CPU reductions ------------------------------------------------------- */

/* dst[i] = dst[i] op src[i] for i < count. dtype is a crun_dtype_t, op a
 * crun_red_op_t; AVG reduces as SUM here (the caller divides once at the
 * end with kernels_div). dst and src must not overlap.
 * Returns 0 or CRUN_EINVAL. */
int kernels_reduce(void *dst, const void *src, size_t count, int dtype, int op);

/* buf[i] /= divisor (integers: truncating). CRUN_EINVAL for divisor 0. */
int kernels_div(void *buf, size_t count, int dtype, int64_t divisor);

/* Conversions used to reduce f16/bf16 in f32 (round to nearest even). */
void kernels_f16_to_f32(float *dst, const uint16_t *src, size_t count);
void kernels_f32_to_f16(uint16_t *dst, const float *src, size_t count);
void kernels_bf16_to_f32(float *dst, const uint16_t *src, size_t count);
void kernels_f32_to_bf16(uint16_t *dst, const float *src, size_t count);
float kernels_f16_to_float(uint16_t h);
uint16_t kernels_float_to_f16(float f);
float kernels_bf16_to_float(uint16_t h);
uint16_t kernels_float_to_bf16(float f);

/* memcpy for a large destination that will not be read again soon: non-
 * temporal stores (x86-64), so the copy neither reads the destination nor
 * evicts the source. Ordered (sfence) before the function returns. */
void kernels_copy_stream(void *dst, const void *src, size_t n);

/* ---- CPU GEMM ----------------------------------------------------------------
 * C[m x n] (+)= A[m x k] * B[k x n], row-major with leading dimensions lda,
 * ldb, ldc (elements). accumulate = 0 overwrites C. Blocked for the caches,
 * inner loop vectorised. Returns 0 or CRUN_EINVAL. */
int kernels_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
		     size_t ldb, float *c, size_t ldc, int accumulate);

/* ---- CUDA (kernels/ *.cu; CRUN_ENOTSUP from kernels_stub.c) ----------------- */

/* 1 only when built with CUDA and a device is usable. */
int kernels_available(void);
/* Device GEMM, same contract as kernels_gemm_f32 on device pointers,
 * enqueued on stream (a cudaStream_t, NULL = default). */
int kernels_cuda_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
			  size_t ldb, float *c, size_t ldc, int accumulate, void *stream);
/* Device dst = dst op src (dtype x op as kernels_reduce). */
int kernels_cuda_reduce(void *dst, const void *src, size_t count, int dtype, int op, void *stream);
/* Intra-node all_reduce step over peer-mapped (CUDA IPC) device buffers:
 * dst = bufs[0] op ... op bufs[nbufs - 1], AVG divides by nbufs. */
int kernels_cuda_all_reduce(void *dst, const void *const *bufs, int nbufs, size_t count, int dtype,
			    int op, void *stream);
/* Waits for stream; maps CUDA errors to crun codes. */
int kernels_cuda_sync(void *stream);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_KERNELS_H */
