/* reduce_int.cuh: the per-element arithmetic of the GPU reductions that has
 * no half types in it, __host__ __device__ so that tests/gpu/host_div.cu
 * checks the very code the kernels run against the CPU kernels (reduce.c)
 * on a host without a GPU. CUDA C++ only (reduce.cu and that test).
 */
#ifndef CRUN_KERNELS_REDUCE_INT_CUH
#define CRUN_KERNELS_REDUCE_INT_CUH

#include <stdint.h>

#include <type_traits>

/* v / d for the AVG of a non-half dtype T: what div_kernel stores. Integers
 * divide in int64 as C promotes them on the CPU path: d is the group size,
 * which an 8-bit type cannot hold (i8 over 128 ranks divided by -128, u8
 * over 256 by zero). Floating types divide in their own type. */
template <typename T> __host__ __device__ __forceinline__ T kernels_div_elem(T v, int64_t d)
{
	if constexpr (std::is_integral<T>::value)
		return (T)((int64_t)v / d);
	else
		return (T)(v / (T)d);
}

#endif /* CRUN_KERNELS_REDUCE_INT_CUH */
