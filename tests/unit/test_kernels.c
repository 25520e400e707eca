/* test_kernels.c: the CPU kernels against plain scalar references: every
 * dtype x op of kernels_reduce (odd lengths, so the vector loops' tails
 * run), the f16/bf16 conversions (exact values, rounding to even, inf/NaN,
 * subnormals), kernels_div, the blocked GEMM against a naive triple loop,
 * and the CUDA door reporting no device on a machine without one.
 */
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "unit/check_main.h"
#include "common/common.h"
#include "kernels/kernels.h"

/* Scalar reference for element values held as int64 (exact in every type
 * for the small values used). */
static int64_t ref_op(int64_t a, int64_t b, int op)
{
	switch (op) {
	case CRUN_PROD:
		return a * b;
	case CRUN_MIN:
		return a < b ? a : b;
	case CRUN_MAX:
		return a > b ? a : b;
	default:
		return a + b;
	}
}

static void store_val(void *buf, size_t i, int dtype, int64_t v)
{
	switch (dtype) {
	case CRUN_F32:
		((float *)buf)[i] = (float)v;
		break;
	case CRUN_F64:
		((double *)buf)[i] = (double)v;
		break;
	case CRUN_F16:
		((uint16_t *)buf)[i] = kernels_float_to_f16((float)v);
		break;
	case CRUN_BF16:
		((uint16_t *)buf)[i] = kernels_float_to_bf16((float)v);
		break;
	case CRUN_I8:
		((int8_t *)buf)[i] = (int8_t)v;
		break;
	case CRUN_U8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	case CRUN_I32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case CRUN_I64:
		((int64_t *)buf)[i] = v;
		break;
	}
}

static double as_double(const void *buf, size_t i, int dtype)
{
	switch (dtype) {
	case CRUN_F32:
		return ((const float *)buf)[i];
	case CRUN_F64:
		return ((const double *)buf)[i];
	case CRUN_F16:
		return kernels_f16_to_float(((const uint16_t *)buf)[i]);
	default:
		return kernels_bf16_to_float(((const uint16_t *)buf)[i]);
	}
}

/* _i = dtype * CRUN_RED_OP__MAX + op */
START_TEST(reduce_matches_the_scalar_reference_for_every_dtype_and_op)
{
	int dtype = _i / CRUN_RED_OP__MAX, op = _i % CRUN_RED_OP__MAX;
	size_t n = 1037, esz = crun_dtype_size(dtype);
	uint8_t *d = malloc(n * esz), *s = malloc(n * esz), *want = malloc(n * esz);
	int unsigned_t = dtype == CRUN_U8;

	ck_assert_ptr_nonnull(d);
	for (size_t i = 0; i < n; i++) {
		/* Small values; PROD stays within i8 and f16 exactly. */
		int64_t a = (int64_t)(i % 9) - (unsigned_t ? 0 : 4);
		int64_t b = (int64_t)((i * 7) % 11) - (unsigned_t ? 0 : 5);

		store_val(d, i, dtype, a);
		store_val(s, i, dtype, b);
		store_val(want, i, dtype, ref_op(a, b, op));
	}
	ck_assert_int_eq(kernels_reduce(d, s, n, dtype, op), 0);
	if (dtype > CRUN_BF16) {
		ck_assert_mem_eq(d, want, n * esz);
	} else {
		/* Floats compare by value: 0 * -5 is -0 and equals the
		 * reference's +0. */
		for (size_t i = 0; i < n; i++)
			ck_assert_msg(as_double(d, i, dtype) == as_double(want, i, dtype),
				      "elem %zu: %g != %g", i, as_double(d, i, dtype),
				      as_double(want, i, dtype));
	}
	free(d);
	free(s);
	free(want);
}
END_TEST

START_TEST(integer_sum_and_prod_wrap_instead_of_trapping)
{
	int8_t a[3] = {127, -128, 100}, b[3] = {1, -1, 3};
	int32_t x[2] = {INT32_MAX, INT32_MIN}, y[2] = {1, -1};

	ck_assert_int_eq(kernels_reduce(a, b, 3, CRUN_I8, CRUN_SUM), 0);
	ck_assert_int_eq(a[0], -128);
	ck_assert_int_eq(a[1], 127);
	ck_assert_int_eq(kernels_reduce(a + 2, b + 2, 1, CRUN_I8, CRUN_PROD), 0);
	ck_assert_int_eq(a[2], (int8_t)(uint8_t)(103u * 3u));
	ck_assert_int_eq(kernels_reduce(x, y, 2, CRUN_I32, CRUN_SUM), 0);
	ck_assert_int_eq(x[0], INT32_MIN);
	ck_assert_int_eq(x[1], INT32_MAX);
}
END_TEST

START_TEST(reduce_rejects_bad_dtype_and_op)
{
	float a = 1, b = 2;

	ck_assert_int_eq(kernels_reduce(&a, &b, 1, CRUN_DTYPE__MAX, CRUN_SUM), CRUN_EINVAL);
	ck_assert_int_eq(kernels_reduce(&a, &b, 1, CRUN_F32, CRUN_RED_OP__MAX), CRUN_EINVAL);
	ck_assert_int_eq(kernels_reduce(&a, &b, 1, -1, CRUN_SUM), CRUN_EINVAL);
	ck_assert_int_eq(kernels_reduce(&a, &b, 1, CRUN_F32, CRUN_AVG), 0); /* AVG sums */
	ck_assert(a == 3.0f);
	ck_assert_int_eq(kernels_reduce(NULL, NULL, 0, CRUN_F32, CRUN_SUM), 0);
}
END_TEST

START_TEST(f16_conversions_are_exact_and_round_to_even)
{
	ck_assert_uint_eq(kernels_float_to_f16(1.0f), 0x3c00);
	ck_assert_uint_eq(kernels_float_to_f16(-2.0f), 0xc000);
	ck_assert_uint_eq(kernels_float_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(kernels_float_to_f16(65520.0f), 0x7c00); /* rounds up to inf */
	ck_assert_uint_eq(kernels_float_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(kernels_float_to_f16(-INFINITY), 0xfc00);
	ck_assert_uint_eq(kernels_float_to_f16(0x1p-24f), 0x0001);   /* smallest subnormal */
	ck_assert_uint_eq(kernels_float_to_f16(0x1p-25f), 0x0000);   /* tie to even: 0 */
	ck_assert_uint_eq(kernels_float_to_f16(0x1.8p-24f), 0x0002); /* tie to even: 2 */
	/* 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even is 1. */
	ck_assert_uint_eq(kernels_float_to_f16(1.0f + 0x1p-11f), 0x3c00);
	ck_assert_uint_eq(kernels_float_to_f16(1.0f + 0x1.8p-10f), 0x3c02);
	ck_assert(isnan(kernels_f16_to_float(kernels_float_to_f16(NAN))));
	ck_assert(kernels_f16_to_float(0x0001) == 0x1p-24f);
	ck_assert(kernels_f16_to_float(0x3555) == 0x1.554p-2f);
	/* Every finite half survives a round trip through float. */
	for (uint32_t h = 0; h < 0x10000; h++) {
		if ((h & 0x7c00) == 0x7c00)
			continue;
		ck_assert_uint_eq(kernels_float_to_f16(kernels_f16_to_float((uint16_t)h)), h);
	}
}
END_TEST

START_TEST(bf16_conversions_round_to_even_and_keep_nan)
{
	ck_assert_uint_eq(kernels_float_to_bf16(1.0f), 0x3f80);
	ck_assert_uint_eq(kernels_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);   /* tie: even */
	ck_assert_uint_eq(kernels_float_to_bf16(1.0f + 0x1.8p-7f), 0x3f82); /* tie: even */
	ck_assert_uint_eq(kernels_float_to_bf16(1.0f + 0x1.2p-8f), 0x3f81); /* above tie */
	ck_assert(isnan(kernels_bf16_to_float(kernels_float_to_bf16(NAN))));
	ck_assert(kernels_bf16_to_float(0xc040) == -3.0f);
}
END_TEST

START_TEST(half_sums_accumulate_in_f32_and_round_once)
{
	/* 2048 + 3 = 2051 lies halfway between the f16 neighbours 2050 and
	 * 2052 (spacing 2 there): the f32 sum is exact, rounded once to even. */
	uint16_t a = kernels_float_to_f16(2048.0f), b = kernels_float_to_f16(3.0f);

	ck_assert_int_eq(kernels_reduce(&a, &b, 1, CRUN_F16, CRUN_SUM), 0);
	ck_assert(kernels_f16_to_float(a) == 2052.0f); /* 2051 ties to even 2052 */
}
END_TEST

START_TEST(div_truncates_integers_and_divides_floats)
{
	int32_t i[3] = {7, -7, 8};
	float f[2] = {1.0f, 3.0f};
	uint16_t h = kernels_float_to_bf16(3.0f);

	ck_assert_int_eq(kernels_div(i, 3, CRUN_I32, 2), 0);
	ck_assert_int_eq(i[0], 3);
	ck_assert_int_eq(i[1], -3);
	ck_assert_int_eq(i[2], 4);
	ck_assert_int_eq(kernels_div(f, 2, CRUN_F32, 4), 0);
	ck_assert(f[0] == 0.25f && f[1] == 0.75f);
	ck_assert_int_eq(kernels_div(&h, 1, CRUN_BF16, 2), 0);
	ck_assert(kernels_bf16_to_float(h) == 1.5f);
	ck_assert_int_eq(kernels_div(f, 2, CRUN_F32, 0), CRUN_EINVAL);
}
END_TEST

/* _i picks a shape, including ones that straddle every block edge. */
START_TEST(gemm_matches_a_naive_triple_loop)
{
	static const size_t shapes[][3] = {{1, 1, 1},	   {3, 5, 7},	     {64, 512, 256},
					   {65, 513, 257}, {130, 1030, 300}, {17, 3, 600}};
	size_t m = shapes[_i][0], n = shapes[_i][1], k = shapes[_i][2];
	float *a = malloc(m * k * 4), *b = malloc(k * n * 4), *c = malloc(m * n * 4);

	ck_assert_ptr_nonnull(a);
	for (size_t i = 0; i < m * k; i++)
		a[i] = (float)((i * 13) % 7) - 3;
	for (size_t i = 0; i < k * n; i++)
		b[i] = (float)((i * 5) % 9) - 4;
	for (size_t i = 0; i < m * n; i++)
		c[i] = 1.0f;
	ck_assert_int_eq(kernels_gemm_f32(m, n, k, a, k, b, n, c, n, 1), 0);
	for (size_t i = 0; i < m; i++)
		for (size_t j = 0; j < n; j++) {
			double want = 1.0;

			for (size_t p = 0; p < k; p++)
				want += (double)a[i * k + p] * b[p * n + j];
			/* small integers: exact in f32 */
			ck_assert_msg(c[i * n + j] == (float)want, "c[%zu][%zu] = %g, want %g", i,
				      j, (double)c[i * n + j], want);
		}
	ck_assert_int_eq(kernels_gemm_f32(m, n, k, a, k, b, n, c, n, 0), 0);
	{
		double w = 0; /* accumulate = 0 overwrites the 1.0 start */

		for (size_t p = 0; p < k; p++)
			w += (double)a[p] * b[p * n];
		ck_assert(c[0] == (float)w);
	}
	if (k > 1) /* a leading dimension shorter than a row is refused */
		ck_assert_int_eq(kernels_gemm_f32(m, n, k, a, k - 1, b, n, c, n, 0), CRUN_EINVAL);
	free(a);
	free(b);
	free(c);
}
END_TEST

/* _i: destination misalignment 0..15, lengths around the 64-byte loop. */
START_TEST(stream_copy_copies_every_byte_at_any_alignment)
{
	static const size_t lens[] = {0, 1, 255, 256, 257, 1000, 4096 + 63, 100003};
	uint8_t *src = malloc(100003 + 16), *dst = malloc(100003 + 64);

	ck_assert_ptr_nonnull(src);
	ck_assert_ptr_nonnull(dst);
	for (size_t i = 0; i < 100003 + 16; i++)
		src[i] = (uint8_t)(i * 31 + 7);
	for (size_t l = 0; l < ARRAY_SIZE(lens); l++) {
		memset(dst, 0xaa, 100003 + 64);
		kernels_copy_stream(dst + _i, src + 3, lens[l]);
		ck_assert_mem_eq(dst + _i, src + 3, lens[l]);
		ck_assert_uint_eq(dst[_i + lens[l]], 0xaa); /* nothing past the end */
		if (_i)
			ck_assert_uint_eq(dst[_i - 1], 0xaa);
	}
	free(src);
	free(dst);
}
END_TEST

/* The GPU object next to this test's libcrun (build/lib), if it was built. */
static int gpu_object_path(char *buf, size_t cap)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;

	if (n <= 0)
		return -1;
	exe[n] = '\0';
	slash = strrchr(exe, '/');
	if (!slash)
		return -1;
	*slash = '\0';
	snprintf(buf, cap, "%s/../lib/libcrun-cuda.so.0", exe);
	return access(buf, R_OK);
}

/* This machine has CUDA's libraries but no GPU: the door opens the object
 * and then says what is missing, in CUDA's words, as CRUN_ENOTSUP. */
START_TEST(cuda_door_reports_no_device_here)
{
	const struct kernels_cuda_ops *ops = NULL;
	char err[512] = "";
	int r;

	if (kernels_available())
		return; /* on a GPU machine, tests/gpu covers the kernels */
	r = kernels_cuda_load(&ops, err, sizeof(err));
	ck_assert_int_eq(r, CRUN_ENOTSUP);
	ck_assert_ptr_null(ops); /* ret_* untouched on failure */
	ck_assert_msg(err[0] != '\0', "no reason given");
}
END_TEST

START_TEST(cuda_door_names_a_missing_object)
{
	const struct kernels_cuda_ops *ops = NULL;
	char err[512] = "";

	setenv("CRUN_CUDA_LIB", "/nonexistent/libcrun-cuda.so.0", 1);
	ck_assert_int_eq(kernels_cuda_load(&ops, err, sizeof(err)), CRUN_ENOTSUP);
	unsetenv("CRUN_CUDA_LIB");
	ck_assert_msg(strstr(err, "CRUN_CUDA_LIB") && strstr(err, "/nonexistent/libcrun-cuda.so.0"),
		      "reason '%s' does not name the object", err);
}
END_TEST

/* The built object itself (WITH_CUDA=1): found, entry point called, and with
 * no device the CUDA error text comes back. */
START_TEST(cuda_door_passes_on_the_cuda_error)
{
	const struct kernels_cuda_ops *ops = NULL;
	char path[4200], err[512] = "";
	void *sym = NULL;

	if (gpu_object_path(path, sizeof(path)) < 0 || kernels_available())
		return; /* CPU-only build, or a GPU machine */
	setenv("CRUN_CUDA_LIB", path, 1);
	ck_assert_int_eq(kernels_cuda_sym("crun_cuda_pg_backend_v1", &sym, err, sizeof(err)), 0);
	ck_assert_ptr_nonnull(sym);
	ck_assert_int_eq(kernels_cuda_sym("kernels_cu_gemm_f32", &sym, err, sizeof(err)),
			 CRUN_ENOTSUP); /* only the versioned doors are exported */
	ck_assert_int_eq(kernels_cuda_load(&ops, err, sizeof(err)), CRUN_ENOTSUP);
	unsetenv("CRUN_CUDA_LIB");
	ck_assert_msg(strstr(err, "cudaGetDeviceCount") != NULL, "reason '%s'", err);
}
END_TEST

/* {local_rank, local_world_size, visible, want device or CRUN_ENOTSUP}. */
static const int device_cases[][4] = {
    {0, 8, 8, 0}, /* one GPU per rank, all visible */
    {7, 8, 8, 7},
    {3, 4, 8, 3}, /* more GPUs than ranks */
    {0, 8, 1, 0}, /* CUDA_VISIBLE_DEVICES narrowed to one per rank */
    {5, 8, 1, 0},
    {7, 8, 1, 0},
    {5, 8, 4, 1}, /* two ranks per GPU: LOCAL_RANK % visible */
    {3, 8, 2, 1},
    {0, 1, 0, CRUN_ENOTSUP}, /* nothing visible */
    {4, 4, 4, CRUN_ENOTSUP}, /* LOCAL_RANK outside LOCAL_WORLD_SIZE */
    {-1, 4, 4, CRUN_ENOTSUP},
};

START_TEST(device_is_local_rank_modulo_what_a_narrowed_rank_sees)
{
	const int *c = device_cases[_i];
	int dev = -42;
	int r = kernels_pick_device(c[0], c[1], c[2], &dev);

	if (c[3] < 0) {
		ck_assert_int_eq(r, c[3]);
		ck_assert_int_eq(dev, -42); /* ret_* untouched on failure */
	} else {
		ck_assert_msg(r == 0 && dev == c[3], "local_rank %d of %d, %d visible: %d, dev %d",
			      c[0], c[1], c[2], r, dev);
	}
}
END_TEST

static Suite *kernels_suite(void)
{
	Suite *s = suite_create("kernels");
	TCase *tc = tcase_create("cpu");

	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, reduce_matches_the_scalar_reference_for_every_dtype_and_op, 0,
			    CRUN_DTYPE__MAX * CRUN_RED_OP__MAX);
	tcase_add_test(tc, integer_sum_and_prod_wrap_instead_of_trapping);
	tcase_add_test(tc, reduce_rejects_bad_dtype_and_op);
	tcase_add_test(tc, f16_conversions_are_exact_and_round_to_even);
	tcase_add_test(tc, bf16_conversions_round_to_even_and_keep_nan);
	tcase_add_test(tc, half_sums_accumulate_in_f32_and_round_once);
	tcase_add_test(tc, div_truncates_integers_and_divides_floats);
	tcase_add_loop_test(tc, gemm_matches_a_naive_triple_loop, 0, 6);
	tcase_add_loop_test(tc, stream_copy_copies_every_byte_at_any_alignment, 0, 16);
	tcase_add_loop_test(tc, device_is_local_rank_modulo_what_a_narrowed_rank_sees, 0,
			    (int)ARRAY_SIZE(device_cases));
	tcase_add_test(tc, cuda_door_reports_no_device_here);
	tcase_add_test(tc, cuda_door_names_a_missing_object);
	tcase_add_test(tc, cuda_door_passes_on_the_cuda_error);
	suite_add_tcase(s, tc);
	return s;
}

CRUN_CHECK_MAIN(kernels_suite)
