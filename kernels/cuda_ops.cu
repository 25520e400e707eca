/* cuda_ops.cu: the GPU object's kernels table (struct kernels_cuda_ops) and
 * its entry point crun_cuda_kernels_v1, plus the CUDACHECK-style mapping of
 * CUDA errors to crun codes. The text of the last failure is kept per
 * thread, like errno: the table is shared by every group and thread of the
 * process, and a failure on one thread must not overwrite another's.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "crun/crun.h"
#include "kernels/cuda_int.h"

static thread_local char last_err[256] = "";

extern "C" int kernels_cu_err(int e, const char *what)
{
	cudaError_t ce = (cudaError_t)e;

	if (ce == cudaSuccess)
		return 0;
	snprintf(last_err, sizeof(last_err), "%s: %s (%s)", what, cudaGetErrorString(ce),
		 cudaGetErrorName(ce));
	switch (ce) {
	case cudaErrorMemoryAllocation:
		return CRUN_ENOMEM;
	case cudaErrorInvalidValue:
	case cudaErrorInvalidDevicePointer:
	case cudaErrorInvalidConfiguration:
		return CRUN_EINVAL;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
	case cudaErrorInvalidDevice:
		return CRUN_ENOTSUP;
	default:
		return CRUN_EIO;
	}
}

extern "C" const char *kernels_cu_last_error(void)
{
	return last_err;
}

static int device_count(int *ret_count)
{
	int n = 0;
	int r = kernels_cu_err(cudaGetDeviceCount(&n), "cudaGetDeviceCount");

	if (r == 0)
		*ret_count = n;
	return r;
}

static int set_device(int dev)
{
	return kernels_cu_err(cudaSetDevice(dev), "cudaSetDevice");
}

static int dev_alloc(void **ret_ptr, size_t len)
{
	void *p = NULL;
	int r = kernels_cu_err(cudaMalloc(&p, len ? len : 1), "cudaMalloc");

	if (r == 0)
		*ret_ptr = p;
	return r;
}

static void dev_free(void *p)
{
	if (p)
		(void)cudaFree(p);
}

static int copy_any(void *dst, const void *src, size_t len)
{
	if (!len)
		return 0;
	return kernels_cu_err(cudaMemcpy(dst, src, len, cudaMemcpyDefault), "cudaMemcpy");
}

static int sync_stream(void *stream)
{
	return kernels_cu_err(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
}

static const struct kernels_cuda_ops ops = {
	KERNELS_CUDA_ABI,
	device_count,
	set_device,
	dev_alloc,
	dev_free,
	copy_any,
	sync_stream,
	kernels_cu_gemm_f32,
	kernels_cu_gemm_tc,
	kernels_cu_reduce,
	kernels_cu_reduce_multi,
	kernels_cu_div,
	kernels_cu_ipc_all_reduce,
	kernels_cu_last_error,
};

/* The door kernels_cuda_load() looks up. It answers only when a device is
 * usable, so "no driver" and "no device" reach the caller as CUDA's text. */
extern "C" __attribute__((visibility("default"))) const struct kernels_cuda_ops *
crun_cuda_kernels_v1(int abi, char *err, size_t cap)
{
	int n = 0;
	cudaError_t e;

	if (abi != KERNELS_CUDA_ABI) {
		snprintf(err, cap, "GPU object kernels ABI %d, libcrun wants %d", KERNELS_CUDA_ABI,
			 abi);
		return NULL;
	}
	e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		snprintf(err, cap, "cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
			 cudaGetErrorName(e));
		return NULL;
	}
	if (n < 1) {
		snprintf(err, cap, "no CUDA device");
		return NULL;
	}
	return &ops;
}
