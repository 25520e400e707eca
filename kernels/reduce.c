/* reduce.c: CPU reduction kernels, one loop per dtype x op, written so GCC's
 * auto-vectoriser turns them into SIMD (O3 for this file, and an AVX2 clone
 * picked at load time through an ifunc where the CPU has it). f16 and bf16
 * are widened to f32 in blocks, reduced, and rounded back once.
 */
#pragma GCC optimize("O3")

#include <string.h>

#include "common/common.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && !defined(__clang__)
#define VEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define VEC_CLONES
#endif

/* ---- f16 / bf16 conversions ------------------------------------------------ */

static inline uint32_t f2u(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float u2f(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

float kernels_f16_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
	uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;

	if (exp == 0x1f)
		return u2f(sign | 0x7f800000u | (man << 13));
	if (exp == 0)
		return u2f(sign | f2u((float)man * 0x1p-24f)); /* zero or subnormal */
	return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kernels_float_to_f16(float f)
{
	uint32_t u = f2u(f), sign = (u >> 16) & 0x8000u;

	u &= 0x7fffffffu;
	if (u >= 0x7f800000u) /* inf stays inf, NaN stays a quiet NaN */
		return (uint16_t)(sign | 0x7c00u | (u > 0x7f800000u ? 0x200u : 0));
	if (u >= 0x477ff000u) /* 65520 and up round to inf */
		return (uint16_t)(sign | 0x7c00u);
	if (u < 0x38800000u) {
		/* Below f16's smallest normal: adding 0.5 leaves the value in
		 * units of 2^-24 in the low mantissa bits, rounded to even by
		 * the FPU. */
		float r = u2f(u) + 0.5f;

		return (uint16_t)(sign | (f2u(r) - 0x3f000000u));
	}
	/* Rebias the exponent (127 -> 15) and round to nearest even. */
	u += 0xc8000fffu + ((u >> 13) & 1u);
	return (uint16_t)(sign | (u >> 13));
}

float kernels_bf16_to_float(uint16_t h)
{
	return u2f((uint32_t)h << 16);
}

uint16_t kernels_float_to_bf16(float f)
{
	uint32_t u = f2u(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40u);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

VEC_CLONES void kernels_f16_to_f32(float *dst, const uint16_t *src, size_t count)
{
	for (size_t i = 0; i < count; i++)
		dst[i] = kernels_f16_to_float(src[i]);
}

VEC_CLONES void kernels_f32_to_f16(uint16_t *dst, const float *src, size_t count)
{
	for (size_t i = 0; i < count; i++)
		dst[i] = kernels_float_to_f16(src[i]);
}

VEC_CLONES void kernels_bf16_to_f32(float *dst, const uint16_t *src, size_t count)
{
	for (size_t i = 0; i < count; i++)
		dst[i] = kernels_bf16_to_float(src[i]);
}

VEC_CLONES void kernels_f32_to_bf16(uint16_t *dst, const float *src, size_t count)
{
	for (size_t i = 0; i < count; i++)
		dst[i] = kernels_float_to_bf16(src[i]);
}

/* ---- the loops ------------------------------------------------------------- */

/* Integer SUM and PROD go through the unsigned type so overflow wraps
 * instead of being undefined. */
#define LOOP(name, T, EXPR)                                                       \
	VEC_CLONES static void name(T *restrict d, const T *restrict s, size_t n) \
	{                                                                         \
		for (size_t i = 0; i < n; i++) {                                  \
			T a = d[i], b = s[i];                                     \
			d[i] = (EXPR);                                            \
		}                                                                 \
	}

#define INT_LOOPS(sfx, T, U)                  \
	LOOP(sum_##sfx, T, (T)((U)a + (U)b))  \
	LOOP(prod_##sfx, T, (T)((U)a * (U)b)) \
	LOOP(min_##sfx, T, a < b ? a : b)     \
	LOOP(max_##sfx, T, a > b ? a : b)

#define FLT_LOOPS(sfx, T)                 \
	LOOP(sum_##sfx, T, a + b)         \
	LOOP(prod_##sfx, T, a *b)         \
	LOOP(min_##sfx, T, a < b ? a : b) \
	LOOP(max_##sfx, T, a > b ? a : b)

FLT_LOOPS(f32, float)
FLT_LOOPS(f64, double)
INT_LOOPS(i8, int8_t, uint8_t)
INT_LOOPS(u8, uint8_t, uint8_t)
INT_LOOPS(i32, int32_t, uint32_t)
INT_LOOPS(i64, int64_t, uint64_t)

typedef void (*loop_fn)(void *restrict d, const void *restrict s, size_t n);

#define ROW(sfx)                                                                                 \
	{                                                                                        \
		(loop_fn) sum_##sfx, (loop_fn)prod_##sfx, (loop_fn)min_##sfx, (loop_fn)max_##sfx \
	}

/* Indexed [dtype][op], ops in crun_red_op_t order without AVG (= SUM). */
static const loop_fn loops[CRUN_DTYPE__MAX][4] = {
    [CRUN_F32] = ROW(f32), [CRUN_F64] = ROW(f64), [CRUN_I8] = ROW(i8),
    [CRUN_U8] = ROW(u8),   [CRUN_I32] = ROW(i32), [CRUN_I64] = ROW(i64),
};

/* Half types: widen a block of both operands, reduce in f32, round once. */
#define HALF_BLOCK 512

static void reduce_half(uint16_t *d, const uint16_t *s, size_t n, int bf16, int op)
{
	float a[HALF_BLOCK], b[HALF_BLOCK];

	for (size_t off = 0; off < n; off += HALF_BLOCK) {
		size_t m = MIN((size_t)HALF_BLOCK, n - off);

		if (bf16) {
			kernels_bf16_to_f32(a, d + off, m);
			kernels_bf16_to_f32(b, s + off, m);
		} else {
			kernels_f16_to_f32(a, d + off, m);
			kernels_f16_to_f32(b, s + off, m);
		}
		loops[CRUN_F32][op](a, b, m);
		if (bf16)
			kernels_f32_to_bf16(d + off, a, m);
		else
			kernels_f32_to_f16(d + off, a, m);
	}
}

int kernels_reduce(void *dst, const void *src, size_t count, int dtype, int op)
{
	if (dtype < 0 || dtype >= CRUN_DTYPE__MAX || op < 0 || op >= CRUN_RED_OP__MAX)
		return CRUN_EINVAL;
	if (op == CRUN_AVG)
		op = CRUN_SUM;
	if (count == 0)
		return 0;
	if (dtype == CRUN_F16 || dtype == CRUN_BF16)
		reduce_half(dst, src, count, dtype == CRUN_BF16, op);
	else
		loops[dtype][op](dst, src, count);
	return 0;
}

#define DIV_LOOP(T, V)                             \
	do {                                       \
		T *p_ = buf;                       \
		for (size_t i = 0; i < count; i++) \
			p_[i] = (T)(p_[i] / (V));  \
	} while (0)

int kernels_div(void *buf, size_t count, int dtype, int64_t divisor)
{
	uint16_t *h = buf;

	if (divisor == 0)
		return CRUN_EINVAL;
	switch (dtype) {
	case CRUN_F32:
		DIV_LOOP(float, (float)divisor);
		return 0;
	case CRUN_F64:
		DIV_LOOP(double, (double)divisor);
		return 0;
	case CRUN_F16:
		for (size_t i = 0; i < count; i++)
			h[i] = kernels_float_to_f16(kernels_f16_to_float(h[i]) / (float)divisor);
		return 0;
	case CRUN_BF16:
		for (size_t i = 0; i < count; i++)
			h[i] = kernels_float_to_bf16(kernels_bf16_to_float(h[i]) / (float)divisor);
		return 0;
	case CRUN_I8:
		DIV_LOOP(int8_t, divisor);
		return 0;
	case CRUN_U8:
		DIV_LOOP(uint8_t, divisor);
		return 0;
	case CRUN_I32:
		DIV_LOOP(int32_t, divisor);
		return 0;
	case CRUN_I64:
		DIV_LOOP(int64_t, divisor);
		return 0;
	default:
		return CRUN_EINVAL;
	}
}
