/* host_div.cu: the GPU AVG division (kernels/reduce_int.cuh, what
 * div_kernel runs) against the CPU path (kernels_div) on the host, so it
 * runs where there is no GPU: every non-half dtype, divisors (group sizes)
 * 1..300, every value of the 8-bit types and edge values of the others.
 * Exit 0 when all agree, 1 naming the first disagreements.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "crun/worker.h"
#include "kernels/kernels.h"
#include "kernels/reduce_int.cuh"

static int fails, checks;

template <typename T> static void check_one(int dtype, const char *name, T v, int64_t d)
{
	T cpu = v;
	T gpu = kernels_div_elem<T>(v, d);

	checks++;
	if (kernels_div(&cpu, 1, dtype, d) != 0 || memcmp(&cpu, &gpu, sizeof(T)) != 0) {
		if (fails++ < 10)
			printf("host_div: %s %lld / %lld: cpu %lld, gpu %lld\n", name,
			       (long long)v, (long long)d, (long long)cpu, (long long)gpu);
	}
}

template <typename T>
static void check_values(int dtype, const char *name, const T *vals, size_t n)
{
	for (int64_t d = 1; d <= 300; d++)
		for (size_t i = 0; i < n; i++)
			check_one<T>(dtype, name, vals[i], d);
}

int main(void)
{
	int8_t i8[256];
	uint8_t u8[256];
	const int32_t i32[] = {0, 1, -1, 127, 255, 256, -300, INT32_MAX, INT32_MIN};
	const int64_t i64[] = {0, 1, -1, 299, -301, INT64_MAX, INT64_MIN + 1};
	const float f32[] = {0.0f, 1.0f, -7.5f, 1e30f};
	const double f64[] = {0.0, 1.0, -7.5, 1e300};

	for (int v = 0; v < 256; v++) {
		i8[v] = (int8_t)(v - 128);
		u8[v] = (uint8_t)v;
	}
	check_values<int8_t>(CRUN_I8, "i8", i8, 256);
	check_values<uint8_t>(CRUN_U8, "u8", u8, 256);
	check_values<int32_t>(CRUN_I32, "i32", i32, sizeof(i32) / sizeof(i32[0]));
	check_values<int64_t>(CRUN_I64, "i64", i64, sizeof(i64) / sizeof(i64[0]));
	check_values<float>(CRUN_F32, "f32", f32, sizeof(f32) / sizeof(f32[0]));
	check_values<double>(CRUN_F64, "f64", f64, sizeof(f64) / sizeof(f64[0]));
	printf("host_div: %d checks, %d disagreements\n", checks, fails);
	return fails ? 1 : 0;
}
