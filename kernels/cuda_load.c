/* cuda_load.c: the only place in libcrun that knows the GPU object exists.
 * libcrun never links CUDA (a scheduler on a CPU-only host must load it);
 * the kernels and the NCCL backend live in libcrun-cuda.so.0, which this
 * file dlopens on demand, the way NCCL loads its net plugins. No build-host
 * path is baked in: the object is looked for next to libcrun's own code
 * (found through dladdr), then through the normal search path.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "kernels/kernels.h"

/* dir of the object that holds this function, and ../lib from there (a
 * statically linked program in bin/ next to the lib/ of the same tree). */
static int open_near_self(void **ret_handle, char *err, size_t cap)
{
	static const char *const rel[] = {"", "../lib/"};
	Dl_info info;
	const char *slash;

	if (!dladdr((void *)open_near_self, &info) || !info.dli_fname)
		return CRUN_ENOTSUP;
	slash = strrchr(info.dli_fname, '/');
	if (!slash)
		return CRUN_ENOTSUP; /* found by bare name: the search path covers it */
	for (size_t i = 0; i < ARRAY_SIZE(rel); i++) {
		char path[4096];
		int n = snprintf(path, sizeof(path), "%.*s/%s%s", (int)(slash - info.dli_fname),
				 info.dli_fname, rel[i], KERNELS_CUDA_SONAME);
		void *h;

		if (n < 0 || (size_t)n >= sizeof(path))
			continue;
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
		if (h) {
			*ret_handle = h;
			return 0;
		}
		/* Present but unloadable (libcudart missing): that is the news. */
		if (access(path, F_OK) == 0) {
			snprintf(err, cap, "%s", dlerror());
			return CRUN_EIO;
		}
	}
	return CRUN_ENOTSUP;
}

int kernels_cuda_open(void **ret_handle, char *err, size_t cap)
{
	const char *explicit_path = getenv("CRUN_CUDA_LIB");
	void *h;
	int r;

	if (cap)
		err[0] = '\0';
	if (explicit_path && *explicit_path) {
		h = dlopen(explicit_path, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			snprintf(err, cap, "CRUN_CUDA_LIB: %s", dlerror());
			return CRUN_ENOTSUP;
		}
		*ret_handle = h;
		return 0;
	}
	r = open_near_self(ret_handle, err, cap);
	if (r == 0)
		return 0;
	if (r == CRUN_EIO)
		return CRUN_ENOTSUP; /* err already names the missing dependency */
	h = dlopen(KERNELS_CUDA_SONAME, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, cap, "%s", dlerror());
		return CRUN_ENOTSUP;
	}
	*ret_handle = h;
	return 0;
}

int kernels_cuda_sym(const char *name, void **ret_sym, char *err, size_t cap)
{
	void *h, *sym;

	TRY(kernels_cuda_open(&h, err, cap));
	sym = dlsym(h, name);
	if (!sym) {
		snprintf(err, cap, "%s", dlerror());
		return CRUN_ENOTSUP;
	}
	*ret_sym = sym;
	return 0;
}

int kernels_cuda_load(const struct kernels_cuda_ops **ret_ops, char *err, size_t cap)
{
	const struct kernels_cuda_ops *ops;
	kernels_cuda_entry_fn fn;
	void *sym;

	TRY(kernels_cuda_sym("crun_cuda_kernels_v1", &sym, err, cap));
	fn = (kernels_cuda_entry_fn)sym;
	ops = fn(KERNELS_CUDA_ABI, err, cap);
	if (!ops)
		return CRUN_ENOTSUP; /* err: the CUDA text (no driver, no device) */
	*ret_ops = ops;
	return 0;
}

int kernels_available(void)
{
	const struct kernels_cuda_ops *ops;
	char err[256];

	return kernels_cuda_load(&ops, err, sizeof(err)) == 0;
}
