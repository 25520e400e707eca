/* gpu_test.h: what the GPU test programs share: the check macro, the skip
 * convention (exit 77 after "skipped: <why>", why being the dlerror or
 * CUDA text; tests/gpu/run.sh counts it as skipped where nvidia-smi lists no
 * GPU, as failed where it lists one, never as passed), a clock, and the results table
 * that run.sh collects into $OUT. Header-only: each program is one file.
 */
#ifndef CRUN_TESTS_GPU_TEST_H
#define CRUN_TESTS_GPU_TEST_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "crun/worker.h"
#include "kernels/kernels.h"

#define GPU_SKIP 77

static int gt_fails, gt_checks;

#define CK(cond, ...)                                                   \
	do {                                                            \
		gt_checks++;                                            \
		if (!(cond)) {                                          \
			gt_fails++;                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                   \
			fputc('\n', stderr);                            \
		}                                                       \
	} while (0)

static inline double gt_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline int gt_skip(const char *why)
{
	printf("skipped: %s\n", why);
	return GPU_SKIP;
}

/* Waits for a forked rank and counts it under skips (exit 77) or fails
 * (anything but exit 0). */
static inline void gt_reap(pid_t pid, int *skips, int *fails)
{
	int st = 0;

	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == GPU_SKIP)
		(*skips)++;
	else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		(*fails)++;
}

/* One row of the results table: printed, and appended to
 * $GPU_RESULTS (a file run.sh names) when that is set. */
static inline void gt_row(const char *fmt, ...)
{
	const char *path = getenv("GPU_RESULTS");
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	printf("%s\n", line);
	if (path && *path) {
		FILE *f = fopen(path, "a");

		if (f) {
			fprintf(f, "%s\n", line);
			fclose(f);
		}
	}
}

/* Deterministic small integers in [-3, 3]: exact in f16, bf16 and f32, and
 * so are their products and any sum below 2^24, whatever the order. */
static inline int gt_val(size_t i, unsigned salt)
{
	unsigned x = (unsigned)i * 2654435761u + salt * 40503u;

	return (int)((x >> 13) % 7) - 3;
}

/* buf[i] = v in dtype (v must be exact there). */
static inline void gt_put(void *buf, size_t i, int dtype, double v)
{
	switch (dtype) {
	case CRUN_F32: ((float *)buf)[i] = (float)v; break;
	case CRUN_F64: ((double *)buf)[i] = v; break;
	case CRUN_F16: ((uint16_t *)buf)[i] = kernels_float_to_f16((float)v); break;
	case CRUN_BF16: ((uint16_t *)buf)[i] = kernels_float_to_bf16((float)v); break;
	case CRUN_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
	case CRUN_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
	case CRUN_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
	case CRUN_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
	}
}

#endif /* CRUN_TESTS_GPU_TEST_H */
