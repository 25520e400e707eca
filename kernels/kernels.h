/* kernels.h: the only door into crun's compute kernels: CPU reductions for
 * every dtype x op (vectorised, f16/bf16 through f32), a blocked CPU GEMM,
 * and the door to the CUDA kernels, which live in a separately loaded object
 * (libcrun-cuda.so.0) so that libcrun loads on hosts without CUDA. No CUDA
 * type crosses this header: device pointers and streams travel as void *.
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

/* ---- CUDA: reached only through the loaded GPU object -----------------------
 * libcrun itself never links CUDA. The kernels live in libcrun-cuda.so.0
 * (kernels/ *.cu plus the NCCL backend), which links libcudart and libnccl
 * and exports only versioned entry points; kernels_cuda_load() dlopens it and
 * hands back this table. Device pointers and streams are void * (a
 * cudaStream_t; NULL = the legacy default stream). Every function returns 0
 * or a negative crun code (CRUN_EINVAL, CRUN_ENOMEM, CRUN_ENOTSUP, CRUN_EIO
 * for any other CUDA error); the CUDA text of the last failure on the
 * calling thread is in last_error(). Thread-safe as the CUDA runtime is. */

#define KERNELS_CUDA_ABI      1
#define KERNELS_CUDA_SONAME   "libcrun-cuda.so.0"
#define KERNELS_CUDA_MAX_BUFS 8 /* buffers one reduce_multi call may combine */

/* ---- intra-node all_reduce over CUDA IPC -------------------------------------
 * Every rank owns a data buffer and a signal area, both peer-mapped into
 * every other rank. A call copies the input into the own data buffer, then
 * runs one kernel on every rank: barrier, reduce, (two-shot: barrier,
 * gather), barrier. The barriers are per block: block b of every rank
 * writes `epoch` into its slot in each peer's signal area and waits for the
 * peers' writes into its own, so all ranks must launch the same grid (it
 * depends only on count, dtype, nranks and two_shot) and bump epoch alike. */

#define KERNELS_IPC_MAX_BLOCKS 32
/* Bytes of one rank's signal area (zeroed before first use): 3 phases x
 * blocks x ranks of uint32. */
#define KERNELS_IPC_SIGNAL_BYTES (3u * KERNELS_IPC_MAX_BLOCKS * KERNELS_CUDA_MAX_BUFS * 4u)

struct kernels_ipc_args {
	void *data[KERNELS_CUDA_MAX_BUFS];	 /* rank r's data buffer, mapped here */
	uint32_t *signal[KERNELS_CUDA_MAX_BUFS]; /* rank r's signal area, mapped here */
	volatile const uint32_t *abort_flag;	 /* device view of a host-mapped word:
						    nonzero releases a waiting kernel */
	int rank, nranks;
	uint32_t epoch; /* strictly increasing per call (from 1), same on every rank */
	int two_shot;	/* 0: every rank reduces all; 1: reduce-scatter + all-gather */
};

struct kernels_cuda_ops {
	int abi; /* KERNELS_CUDA_ABI */
	/* Devices and memory (synchronous unless a stream is passed). */
	int (*device_count)(int *ret_count);
	int (*set_device)(int device);
	int (*alloc)(void **ret_ptr, size_t len_bytes);
	void (*free)(void *ptr); /* NULL: no-op */
	/* Any direction (host or device on either side, cudaMemcpyDefault). */
	int (*copy)(void *dst, const void *src, size_t len_bytes);
	int (*sync)(void *stream);
	/* C[m x n] (+)= A[m x k] * B[k x n] on device pointers, row-major,
	 * leading dimensions in elements, the contract of kernels_gemm_f32.
	 * Any shape; 16-byte-aligned pointers and leading dimensions that are
	 * multiples of 4 take the vectorised path. */
	int (*gemm_f32)(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
			size_t ldb, float *c, size_t ldc, int accumulate, void *stream);
	/* The same with f16 or bf16 A and B (dtype CRUN_F16 / CRUN_BF16) on the
	 * tensor cores, f32 accumulation and f32 C. Any shape; lda and ldb that
	 * are multiples of 8 with 16-byte-aligned A and B take cp.async. */
	int (*gemm_tc)(size_t m, size_t n, size_t k, int dtype, const void *a, size_t lda,
		       const void *b, size_t ldb, float *c, size_t ldc, int accumulate,
		       void *stream);
	/* dst = dst op src, dtype x op as kernels_reduce (AVG reduces as SUM). */
	int (*reduce)(void *dst, const void *src, size_t count, int dtype, int op, void *stream);
	/* dst = bufs[0] op ... op bufs[nbufs - 1], 1 <= nbufs <=
	 * KERNELS_CUDA_MAX_BUFS device (or peer-mapped) pointers; AVG divides
	 * by nbufs. dst may be one of bufs. */
	int (*reduce_multi)(void *dst, const void *const *bufs, int nbufs, size_t count, int dtype,
			    int op, void *stream);
	/* buf[i] /= divisor (integers truncate), as kernels_div. */
	int (*div)(void *buf, size_t count, int dtype, int64_t divisor, void *stream);
	/* dst = the op over every rank's data buffer (count elements; AVG
	 * divides by nranks), the own buffer already holding this rank's
	 * input. Enqueued on stream; it waits for the peers on the device. */
	int (*ipc_all_reduce)(const struct kernels_ipc_args *a, void *dst, size_t count, int dtype,
			      int op, void *stream);
	/* Text of the last CUDA failure on this thread; never NULL. */
	const char *(*last_error)(void);
};

/* The one symbol of the GPU object the kernels door looks up:
 *   const struct kernels_cuda_ops *crun_cuda_kernels_v1(int abi, char *err, size_t cap);
 * NULL (with err filled) when the ABI differs or CUDA has no usable device. */
typedef const struct kernels_cuda_ops *(*kernels_cuda_entry_fn)(int abi, char *err, size_t cap);

/* dlopens the GPU object (once per process in effect: later calls get the
 * same handle back from the dynamic loader, which is never closed). Looks
 * next to the object holding libcrun's code (libcrun.so.0, or a statically
 * linked program and its ../lib), then the normal search path
 * (LD_LIBRARY_PATH, ld.so.cache); CRUN_CUDA_LIB names the file explicitly.
 * Returns 0 and *ret_handle, or CRUN_ENOTSUP with the dlerror() text in err
 * (cap bytes, always terminated). */
int kernels_cuda_open(void **ret_handle, char *err, size_t cap);

/* kernels_cuda_open() + dlsym(name). CRUN_ENOTSUP and the text in err when
 * the object or the symbol is missing. */
int kernels_cuda_sym(const char *name, void **ret_sym, char *err, size_t cap);

/* The kernels table of the GPU object: 0 and *ret_ops (static in the
 * object), or CRUN_ENOTSUP naming what is missing (the object, the symbol,
 * the driver or a device: the dlerror() or CUDA text) in err. */
int kernels_cuda_load(const struct kernels_cuda_ops **ret_ops, char *err, size_t cap);

/* 1 when kernels_cuda_load() succeeds (a usable device), else 0. */
int kernels_available(void);

/* The device index of a rank that sees `visible` CUDA devices. Pure.
 * LOCAL_RANK when every rank sees at least LOCAL_WORLD_SIZE devices, else
 * LOCAL_RANK % visible (CUDA_VISIBLE_DEVICES narrowed per rank). Returns 0
 * and *ret_dev, or CRUN_ENOTSUP when none is visible or local_rank is not
 * in [0, local_world_size). */
int kernels_pick_device(int local_rank, int local_world_size, int visible, int *ret_dev);

#ifdef __cplusplus
}
#endif
#endif /* CRUN_KERNELS_H */
