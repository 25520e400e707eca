/* cuda_kernels.cu: the CUDA side of kernels.h: a tiled f32 GEMM, an
 * elementwise reduce for every dtype x op (f16/bf16 in f32), and the
 * intra-node all_reduce step over peer-mapped (CUDA IPC) buffers. CUDA errors
 * become crun codes here, at the edge; nothing CUDA-typed leaves this file.
 */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "crun/crun.h"
#include "kernels/kernels.h"

/* Private CUDACHECK: map a CUDA error to a crun code. */
static int cuda_err(cudaError_t e)
{
	switch (e) {
	case cudaSuccess:
		return 0;
	case cudaErrorMemoryAllocation:
		return CRUN_ENOMEM;
	case cudaErrorInvalidValue:
		return CRUN_EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		return CRUN_ENOTSUP;
	default:
		return CRUN_EIO;
	}
}

extern "C" int kernels_available(void)
{
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess)
		return 0;
	return n > 0;
}

enum { TILE = 16 };

/* Classic shared-memory tiling: each block computes a TILE x TILE tile of C. */
__global__ void gemm_f32_kernel(size_t m, size_t n, size_t k, const float *a, size_t lda,
				const float *b, size_t ldb, float *c, size_t ldc, int accumulate)
{
	__shared__ float as[TILE][TILE];
	__shared__ float bs[TILE][TILE];
	size_t row = (size_t)blockIdx.y * TILE + threadIdx.y;
	size_t col = (size_t)blockIdx.x * TILE + threadIdx.x;
	float acc = 0.0f;

	for (size_t t = 0; t < k; t += TILE) {
		as[threadIdx.y][threadIdx.x] =
			(row < m && t + threadIdx.x < k) ? a[row * lda + t + threadIdx.x] : 0.0f;
		bs[threadIdx.y][threadIdx.x] =
			(col < n && t + threadIdx.y < k) ? b[(t + threadIdx.y) * ldb + col] : 0.0f;
		__syncthreads();
		for (int p = 0; p < TILE; p++)
			acc += as[threadIdx.y][p] * bs[p][threadIdx.x];
		__syncthreads();
	}
	if (row < m && col < n)
		c[row * ldc + col] = accumulate ? c[row * ldc + col] + acc : acc;
}

extern "C" int kernels_cuda_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda,
				     const float *b, size_t ldb, float *c, size_t ldc,
				     int accumulate, void *stream)
{
	if (lda < k || ldb < n || ldc < n)
		return CRUN_EINVAL;
	if (!m || !n)
		return 0;
	dim3 block(TILE, TILE);
	dim3 grid((unsigned)((n + TILE - 1) / TILE), (unsigned)((m + TILE - 1) / TILE));
	gemm_f32_kernel<<<grid, block, 0, (cudaStream_t)stream>>>(m, n, k, a, lda, b, ldb, c,
								 ldc, accumulate);
	return cuda_err(cudaGetLastError());
}

/* Values travel through a wider accumulator type: float for the half types. */
template <typename T> struct acc_of {
	typedef T type;
};
template <> struct acc_of<__half> {
	typedef float type;
};
template <> struct acc_of<__nv_bfloat16> {
	typedef float type;
};

template <typename T> __device__ typename acc_of<T>::type load(T v)
{
	return v;
}
template <> __device__ float load<__half>(__half v)
{
	return __half2float(v);
}
template <> __device__ float load<__nv_bfloat16>(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}

template <typename T> __device__ T store(typename acc_of<T>::type v)
{
	return (T)v;
}
template <> __device__ __half store<__half>(float v)
{
	return __float2half_rn(v);
}
template <> __device__ __nv_bfloat16 store<__nv_bfloat16>(float v)
{
	return __float2bfloat16_rn(v);
}

template <typename A> __device__ A apply(A x, A y, int op)
{
	switch (op) {
	case CRUN_PROD:
		return x * y;
	case CRUN_MIN:
		return y < x ? y : x;
	case CRUN_MAX:
		return y > x ? y : x;
	default: /* SUM and AVG */
		return x + y;
	}
}

/* dst = bufs[0] op ... op bufs[nbufs-1] (reduce: bufs = {dst, src}). */
template <typename T>
__global__ void reduce_kernel(T *dst, const T *const *bufs, int nbufs, size_t count, int op,
			      int avg)
{
	typedef typename acc_of<T>::type A;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
	     i += (size_t)gridDim.x * blockDim.x) {
		A acc = load<T>(bufs[0][i]);

		for (int b = 1; b < nbufs; b++)
			acc = apply<A>(acc, load<T>(bufs[b][i]), op);
		if (avg)
			acc = acc / (A)nbufs;
		dst[i] = store<T>(acc);
	}
}

template <typename T>
static int launch(void *dst, const void *const *dbufs, int nbufs, size_t count, int op, int avg,
		  cudaStream_t st)
{
	unsigned blocks = (unsigned)((count + 255) / 256);

	if (blocks > 4096)
		blocks = 4096;
	reduce_kernel<T><<<blocks, 256, 0, st>>>((T *)dst, (const T *const *)dbufs, nbufs, count,
						 op, avg);
	return cuda_err(cudaGetLastError());
}

/* dbufs is a device-side array of nbufs device pointers. */
static int reduce_dispatch(void *dst, const void *const *dbufs, int nbufs, size_t count,
			   int dtype, int op, int avg, cudaStream_t st)
{
	switch (dtype) {
	case CRUN_F32:
		return launch<float>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_F64:
		return launch<double>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_F16:
		return launch<__half>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_BF16:
		return launch<__nv_bfloat16>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_I8:
		return launch<int8_t>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_U8:
		return launch<uint8_t>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_I32:
		return launch<int32_t>(dst, dbufs, nbufs, count, op, avg, st);
	case CRUN_I64:
		return launch<int64_t>(dst, dbufs, nbufs, count, op, avg, st);
	default:
		return CRUN_EINVAL;
	}
}

/* Copies the pointer table to the device, runs, frees it after the stream. */
static int reduce_ptrs(void *dst, const void *const *bufs, int nbufs, size_t count, int dtype,
		       int op, int avg, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	void **dbufs = NULL;
	int r;

	if (nbufs < 1 || op < 0 || op >= CRUN_RED_OP__MAX)
		return CRUN_EINVAL;
	if (!count)
		return 0;
	r = cuda_err(cudaMallocAsync((void **)&dbufs, sizeof(void *) * nbufs, st));
	if (r < 0)
		return r;
	r = cuda_err(cudaMemcpyAsync(dbufs, bufs, sizeof(void *) * nbufs,
				     cudaMemcpyHostToDevice, st));
	if (r == 0)
		r = reduce_dispatch(dst, (const void *const *)dbufs, nbufs, count, dtype, op, avg,
				    st);
	(void)cudaFreeAsync(dbufs, st);
	if (r == 0)
		r = cuda_err(cudaStreamSynchronize(st)); /* bufs is host memory we borrowed */
	return r;
}

extern "C" int kernels_cuda_reduce(void *dst, const void *src, size_t count, int dtype, int op,
				   void *stream)
{
	const void *bufs[2] = { dst, src };

	return reduce_ptrs(dst, bufs, 2, count, dtype, op, 0, stream);
}

extern "C" int kernels_cuda_all_reduce(void *dst, const void *const *bufs, int nbufs,
				       size_t count, int dtype, int op, void *stream)
{
	return reduce_ptrs(dst, bufs, nbufs, count, dtype, op, op == CRUN_AVG, stream);
}

extern "C" int kernels_cuda_sync(void *stream)
{
	return cuda_err(cudaStreamSynchronize((cudaStream_t)stream));
}
