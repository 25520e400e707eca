/* gemm.c: a blocked CPU GEMM for the distributed matmul example. Blocks of
 * A rows x K fit L2 and a panel of B stays in L1/L2 while the i-k-j inner
 * loop streams contiguous rows of B and C, which the vectoriser turns into
 * SIMD multiply-adds (AVX2+FMA clone where the CPU has it).
 */
#pragma GCC optimize("O3")

#include <string.h>

#include "common/common.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && !defined(__clang__)
#define VEC_CLONES __attribute__((target_clones("avx2,fma", "default")))
#else
#define VEC_CLONES
#endif

enum { BLK_M = 64, BLK_K = 256, BLK_N = 512 };

/* C[0:mb, 0:nb] += A[0:mb, 0:kb] * B[0:kb, 0:nb] for one block. */
VEC_CLONES static void gemm_block(size_t mb, size_t nb, size_t kb, const float *restrict a,
				  size_t lda, const float *restrict b, size_t ldb,
				  float *restrict c, size_t ldc)
{
	for (size_t i = 0; i < mb; i++) {
		float *restrict ci = c + i * ldc;

		for (size_t p = 0; p < kb; p++) {
			const float *restrict bp = b + p * ldb;
			float aip = a[i * lda + p];

			for (size_t j = 0; j < nb; j++)
				ci[j] += aip * bp[j];
		}
	}
}

int kernels_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda, const float *b,
		     size_t ldb, float *c, size_t ldc, int accumulate)
{
	if ((m && n && k && (!a || !b)) || (m && n && !c) || lda < k || ldb < n || ldc < n)
		return CRUN_EINVAL;
	if (!accumulate)
		for (size_t i = 0; i < m; i++)
			memset(c + i * ldc, 0, n * sizeof(float));
	for (size_t j0 = 0; j0 < n; j0 += BLK_N)
		for (size_t p0 = 0; p0 < k; p0 += BLK_K)
			for (size_t i0 = 0; i0 < m; i0 += BLK_M)
				gemm_block(MIN((size_t)BLK_M, m - i0), MIN((size_t)BLK_N, n - j0),
					   MIN((size_t)BLK_K, k - p0), a + i0 * lda + p0, lda,
					   b + p0 * ldb + j0, ldb, c + i0 * ldc + j0, ldc);
	return 0;
}
