/* reduce.cu: element-wise reductions of the GPU object for every SDK dtype x
 * op (f16/bf16 through f32, integers wrapping like the CPU kernels), and
 * the intra-node all_reduce over CUDA IPC buffers (cuda_int.h explains the
 * protocol). The CPU kernels in reduce.c are the reference the GPU tests
 * compare against bit for bit.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "crun/crun.h"
#include "crun/worker.h"
#include "kernels/cuda_int.h"
#include "kernels/reduce_int.cuh"

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

template <typename T> __device__ __forceinline__ typename acc_of<T>::type load(T v)
{
	return v;
}
template <> __device__ __forceinline__ float load<__half>(__half v)
{
	return __half2float(v);
}
template <> __device__ __forceinline__ float load<__nv_bfloat16>(__nv_bfloat16 v)
{
	return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T store(typename acc_of<T>::type v)
{
	return (T)v;
}
template <> __device__ __forceinline__ __half store<__half>(float v)
{
	return __float2half_rn(v);
}
template <> __device__ __forceinline__ __nv_bfloat16 store<__nv_bfloat16>(float v)
{
	return __float2bfloat16_rn(v);
}

/* Integer SUM and PROD wrap modulo 2^bits as on the CPU: do them unsigned
 * (signed overflow would be undefined), then convert back. Floating types
 * map to themselves. */
template <typename A> struct uns {
	typedef A type;
};
template <> struct uns<int8_t> {
	typedef uint8_t type;
};
template <> struct uns<int32_t> {
	typedef uint32_t type;
};
template <> struct uns<int64_t> {
	typedef uint64_t type;
};

template <typename A> __device__ __forceinline__ A apply(A x, A y, int op)
{
	typedef typename uns<A>::type U;

	switch (op) {
	case CRUN_PROD:
		return (A)(U)((U)x * (U)y);
	case CRUN_MIN: /* the CPU kernels' exact expressions, NaN included */
		return x < y ? x : y;
	case CRUN_MAX:
		return x > y ? x : y;
	default: /* SUM and AVG */
		return (A)(U)((U)x + (U)y);
	}
}
/* Pointers by value: no device-side table, nothing to free, no sync. */
struct ptrs {
	const void *p[KERNELS_CUDA_MAX_BUFS];
};

/* The reduction of element i over n buffers, in the accumulator type. PEER:
 * the buffers are peer-mapped and another GPU has just rewritten them, so
 * the loads are ld.global.cv (fetch again, never a line cached by an
 * earlier call). */
template <typename T, bool PEER>
__device__ __forceinline__ typename acc_of<T>::type reduce_at(const ptrs &b, int n, size_t i,
							       int op, int avg)
{
	typedef typename acc_of<T>::type A;
	A acc = load<T>(PEER ? __ldcv((const T *)b.p[0] + i) : ((const T *)b.p[0])[i]);

	/* Unrolled with constant indices: a runtime index into b would copy
	 * the whole parameter struct to local memory. */
#pragma unroll
	for (int j = 1; j < KERNELS_CUDA_MAX_BUFS; j++)
		if (j < n)
			acc = apply<A>(acc,
				       load<T>(PEER ? __ldcv((const T *)b.p[j] + i)
						    : ((const T *)b.p[j])[i]),
				       op);
	if (avg)
		acc = acc / (A)n;
	return acc;
}

template <typename T>
__global__ void reduce_kernel(T *dst, ptrs b, int n, size_t count, int op, int avg)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
	     i += (size_t)gridDim.x * blockDim.x)
		dst[i] = store<T>(reduce_at<T, false>(b, n, i, op, avg));
}

template <typename T>
static void launch_reduce(void *dst, const ptrs &b, int n, size_t count, int op, int avg,
			  cudaStream_t st)
{
	size_t blocks = (count + 255) / 256;

	reduce_kernel<T><<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, st>>>(
		(T *)dst, b, n, count, op, avg);
}

/* One switch from dtype to the element type, shared by every entry point. */
#define DTYPE_SWITCH(dtype, FN, ...)                                 \
	switch (dtype) {                                             \
	case CRUN_F32: FN<float>(__VA_ARGS__); break;                 \
	case CRUN_F64: FN<double>(__VA_ARGS__); break;                \
	case CRUN_F16: FN<__half>(__VA_ARGS__); break;                \
	case CRUN_BF16: FN<__nv_bfloat16>(__VA_ARGS__); break;        \
	case CRUN_I8: FN<int8_t>(__VA_ARGS__); break;                 \
	case CRUN_U8: FN<uint8_t>(__VA_ARGS__); break;                \
	case CRUN_I32: FN<int32_t>(__VA_ARGS__); break;               \
	case CRUN_I64: FN<int64_t>(__VA_ARGS__); break;               \
	default: return CRUN_EINVAL;                                  \
	}

extern "C" int kernels_cu_reduce_multi(void *dst, const void *const *bufs, int nbufs,
				       size_t count, int dtype, int op, void *stream)
{
	ptrs b = {};

	if (nbufs < 1 || nbufs > KERNELS_CUDA_MAX_BUFS || op < 0 || op >= CRUN_RED_OP__MAX ||
	    !kernels_cu_dtype_size(dtype) || (count && (!dst || !bufs)))
		return CRUN_EINVAL;
	if (!count)
		return 0;
	for (int i = 0; i < nbufs; i++)
		b.p[i] = bufs[i];
	DTYPE_SWITCH(dtype, launch_reduce, dst, b, nbufs, count, op, op == CRUN_AVG,
		     (cudaStream_t)stream);
	return kernels_cu_err(cudaGetLastError(), "reduce launch");
}

extern "C" int kernels_cu_reduce(void *dst, const void *src, size_t count, int dtype, int op,
				 void *stream)
{
	const void *bufs[2] = {dst, src};

	if (op == CRUN_AVG)
		op = CRUN_SUM; /* kernels_reduce's contract: the caller divides */
	return kernels_cu_reduce_multi(dst, bufs, 2, count, dtype, op, stream);
}

template <typename T> __global__ void div_kernel(T *buf, size_t count, int64_t d)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
	     i += (size_t)gridDim.x * blockDim.x)
		buf[i] = kernels_div_elem<T>(buf[i], d);
}
/* The half types divide in f32, as the CPU kernels do. */
template <> __global__ void div_kernel<__half>(__half *buf, size_t count, int64_t d)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
	     i += (size_t)gridDim.x * blockDim.x)
		buf[i] = store<__half>(load<__half>(buf[i]) / (float)d);
}
template <>
__global__ void div_kernel<__nv_bfloat16>(__nv_bfloat16 *buf, size_t count, int64_t d)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
	     i += (size_t)gridDim.x * blockDim.x)
		buf[i] = store<__nv_bfloat16>(load<__nv_bfloat16>(buf[i]) / (float)d);
}

template <typename T> static void launch_div(void *buf, size_t count, int64_t d, cudaStream_t st)
{
	size_t blocks = (count + 255) / 256;

	div_kernel<T><<<(unsigned)(blocks > 4096 ? 4096 : blocks), 256, 0, st>>>((T *)buf, count, d);
}

extern "C" int kernels_cu_div(void *buf, size_t count, int dtype, int64_t divisor, void *stream)
{
	if (!divisor || !kernels_cu_dtype_size(dtype) || (count && !buf))
		return CRUN_EINVAL;
	if (!count)
		return 0;
	DTYPE_SWITCH(dtype, launch_div, buf, count, divisor, (cudaStream_t)stream);
	return kernels_cu_err(cudaGetLastError(), "div launch");
}

/* ---- IPC all_reduce ----------------------------------------------------------------- */

enum { IPC_THREADS = 512 };

__device__ __forceinline__ void st_release_sys(uint32_t *p, uint32_t v)
{
	asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t *p)
{
	uint32_t v;

	asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
	return v;
}

/* Phase `ph` barrier of block blockIdx.x across ranks: thread r < nranks
 * tells rank r we arrived, then waits until rank r told us. The slot
 * [ph][block][source rank] is written by exactly one thread in the job.
 * Returns 0, or 1 when the host raised the abort flag (a dead peer would
 * otherwise hold us here forever). */
__device__ int ipc_barrier(const kernels_ipc_args &a, int ph)
{
	unsigned spins = 0;
	int bail = 0;

	__syncthreads(); /* the whole block is done with the previous phase */
	if (threadIdx.x < (unsigned)a.nranks) {
		size_t slot = ((size_t)ph * KERNELS_IPC_MAX_BLOCKS + blockIdx.x) *
			      KERNELS_CUDA_MAX_BUFS;

		__threadfence_system(); /* our writes of the last phase go first */
		st_release_sys(a.signal[threadIdx.x] + slot + a.rank, a.epoch);
		while ((int32_t)(ld_acquire_sys(a.signal[a.rank] + slot + threadIdx.x) -
				 a.epoch) < 0) {
			/* The flag is host memory across PCIe: look now and then. */
			if ((++spins & 1023) == 0 && *a.abort_flag) {
				bail = 1;
				break;
			}
		}
	}
	return __syncthreads_or(bail);
}

/* Block b handles the same element range of every rank's data in every
 * phase, which is what lets per-block barriers stand in for a grid-wide
 * one: range [lo, hi) of a slice, split evenly over the blocks. */
__device__ __forceinline__ void block_range(size_t n, size_t *lo, size_t *hi)
{
	size_t per = (n + gridDim.x - 1) / gridDim.x;

	*lo = per * blockIdx.x;
	*hi = *lo + per < n ? *lo + per : n;
	if (*lo > n)
		*lo = n;
}

template <typename T>
__global__ void __launch_bounds__(IPC_THREADS) ipc_kernel(kernels_ipc_args a, T *dst,
							  size_t count, int op)
{
	ptrs b = {};
	int avg = op == CRUN_AVG;
	size_t lo, hi;

#pragma unroll
	for (int r = 0; r < KERNELS_CUDA_MAX_BUFS; r++)
		b.p[r] = a.data[r];
	if (ipc_barrier(a, 0)) /* every rank's input is in its buffer */
		return;
	if (!a.two_shot) {
		block_range(count, &lo, &hi);
		for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
			dst[i] = store<T>(reduce_at<T, true>(b, a.nranks, i, op, avg));
	} else {
		/* Reduce-scatter into our own buffer's slice, then gather the
		 * other slices from their owners' buffers. */
		size_t slice = (count + a.nranks - 1) / a.nranks;
		size_t s0 = slice * a.rank < count ? slice * a.rank : count;
		size_t s1 = s0 + slice < count ? s0 + slice : count;
		T *mine = (T *)a.data[a.rank];

		block_range(s1 - s0, &lo, &hi);
		for (size_t i = s0 + lo + threadIdx.x; i < s0 + hi; i += blockDim.x) {
			T v = store<T>(reduce_at<T, true>(b, a.nranks, i, op, avg));

			mine[i] = v;
			dst[i] = v;
		}
		if (ipc_barrier(a, 1)) /* every slice is reduced */
			return;
		for (int r = 0; r < a.nranks; r++) {
			const T *src = (const T *)a.data[r];
			size_t r0 = slice * r < count ? slice * r : count;
			size_t r1 = r0 + slice < count ? r0 + slice : count;

			if (r == a.rank)
				continue;
			block_range(r1 - r0, &lo, &hi);
			for (size_t i = r0 + lo + threadIdx.x; i < r0 + hi; i += blockDim.x)
				dst[i] = __ldcv(src + i);
		}
	}
	(void)ipc_barrier(a, 2); /* nobody reads our buffer any more */
}

template <typename T>
static void launch_ipc(const kernels_ipc_args &a, void *dst, size_t count, int op,
		       cudaStream_t st)
{
	size_t per_rank = a.two_shot ? (count + a.nranks - 1) / a.nranks : count;
	size_t blocks = (per_rank + IPC_THREADS * 4 - 1) / (IPC_THREADS * 4);

	if (blocks < 1)
		blocks = 1;
	if (blocks > KERNELS_IPC_MAX_BLOCKS)
		blocks = KERNELS_IPC_MAX_BLOCKS;
	ipc_kernel<T><<<(unsigned)blocks, IPC_THREADS, 0, st>>>(a, (T *)dst, count, op);
}

extern "C" int kernels_cu_ipc_all_reduce(const struct kernels_ipc_args *a, void *dst,
					 size_t count, int dtype, int op, void *stream)
{
	if (!a || a->nranks < 1 || a->nranks > KERNELS_CUDA_MAX_BUFS || a->rank < 0 ||
	    a->rank >= a->nranks || op < 0 || op >= CRUN_RED_OP__MAX || !a->abort_flag)
		return CRUN_EINVAL;
	if (!count)
		return 0;
	DTYPE_SWITCH(dtype, launch_ipc, *a, dst, count, op, (cudaStream_t)stream);
	return kernels_cu_err(cudaGetLastError(), "ipc all_reduce launch");
}
