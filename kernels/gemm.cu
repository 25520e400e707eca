/* gemm.cu: the GEMMs of the GPU object, row-major like kernels_gemm_f32.
 *
 * SGEMM: a 128x128 block tile over K slices of 8, 256 threads. Eight warps
 * of 32x64 each; a thread owns 8x8 outputs as two 4-row by two 4-column
 * strips (16 rows / 32 columns apart), so every shared-memory read of a warp
 * is a broadcast or touches distinct banks. A is stored transposed (k-major)
 * in shared memory so both operands are read as float4. Global loads are
 * float4 where the operand allows it (16-byte base, ld a multiple of 4) and
 * the next K slice is fetched into registers while the current one is
 * computed from the other of two shared buffers: one __syncthreads per slice.
 *
 * Tensor cores: f16/bf16 inputs, f32 accumulation with mma.sync m16n8k16.
 * A 128x128 block tile over K slices of 32, eight warps of 64x32; operands
 * land in padded shared tiles through cp.async, three slices in flight, and
 * reach the registers with ldmatrix (.trans for B, which is k-major in
 * memory while mma wants it column-major). Both kernels zero-fill outside
 * the matrix, so any m, n, k works; only the loads of edge tiles take the
 * scalar path. tests/gpu/fragments_sim.py models the index arithmetic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "crun/crun.h"
#include "crun/worker.h"
#include "kernels/cuda_int.h"

/* ---- SGEMM ---------------------------------------------------------------------- */

enum { SG_BM = 128, SG_BN = 128, SG_BK = 8, SG_THREADS = 256, SG_APAD = 4 };

struct sg_args {
	int m, n, k;
	const float *a, *b;
	float *c;
	size_t lda, ldb, ldc;
	int accumulate, vec_c;
};

/* This thread's share of one K slice: 4 floats of A (row t/2, columns
 * (t%2)*4..+3) and 4 of B (row t/32, columns (t%32)*4..+3). */
template <bool VEC>
__device__ __forceinline__ void sg_fetch(const sg_args &p, int bm, int bn, int k0, float ra[4],
					 float rb[4])
{
	int t = threadIdx.x;
	int ar = bm + t / 2, ac = k0 + (t % 2) * 4;
	int br = k0 + t / 32, bc = bn + (t % 32) * 4;

	if (VEC && ar < p.m && ac + 3 < p.k) {
		float4 v = __ldg(reinterpret_cast<const float4 *>(p.a + (size_t)ar * p.lda + ac));
		ra[0] = v.x, ra[1] = v.y, ra[2] = v.z, ra[3] = v.w;
	} else {
#pragma unroll
		for (int i = 0; i < 4; i++)
			ra[i] = ar < p.m && ac + i < p.k ? __ldg(p.a + (size_t)ar * p.lda + ac + i)
							 : 0.0f;
	}
	if (VEC && br < p.k && bc + 3 < p.n) {
		float4 v = __ldg(reinterpret_cast<const float4 *>(p.b + (size_t)br * p.ldb + bc));
		rb[0] = v.x, rb[1] = v.y, rb[2] = v.z, rb[3] = v.w;
	} else {
#pragma unroll
		for (int i = 0; i < 4; i++)
			rb[i] = br < p.k && bc + i < p.n ? __ldg(p.b + (size_t)br * p.ldb + bc + i)
							 : 0.0f;
	}
}

/* A goes in transposed: as[k][m]. The pad of 4 puts the two columns a warp
 * writes (0 and 4) 16 banks apart, so the scattered stores do not collide. */
__device__ __forceinline__ void sg_stash(float (*as)[SG_BM + SG_APAD], float (*bs)[SG_BN],
					 const float ra[4], const float rb[4])
{
	int t = threadIdx.x;
	int ar = t / 2, ac = (t % 2) * 4;

#pragma unroll
	for (int i = 0; i < 4; i++)
		as[ac + i][ar] = ra[i];
	*reinterpret_cast<float4 *>(&bs[t / 32][(t % 32) * 4]) =
		make_float4(rb[0], rb[1], rb[2], rb[3]);
}

/* Two blocks an SM cap registers at 128; the scalar-load variant needs a
 * few more for its address arithmetic and would spill, so it gets one. */
template <bool VEC>
__global__ void __launch_bounds__(SG_THREADS, VEC ? 2 : 1) sgemm_kernel(sg_args p)
{
	__shared__ __align__(16) float as[2][SG_BK][SG_BM + SG_APAD];
	__shared__ __align__(16) float bs[2][SG_BK][SG_BN];
	const int bm = blockIdx.y * SG_BM, bn = blockIdx.x * SG_BN;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	/* Warp (warp/2, warp%2) of a 4x2 grid; lane (lane/8, lane%8) in it. */
	const int tm = (warp / 2) * 32 + (lane / 8) * 4; /* rows tm..+3, tm+16..+3 */
	const int tn = (warp % 2) * 64 + (lane % 8) * 4; /* cols tn..+3, tn+32..+3 */
	const int ktiles = (p.k + SG_BK - 1) / SG_BK;
	float acc[8][8] = {};
	float ra[4], rb[4];

	sg_fetch<VEC>(p, bm, bn, 0, ra, rb);
	sg_stash(as[0], bs[0], ra, rb);
	__syncthreads();
	for (int kt = 0; kt < ktiles; kt++) {
		const int cur = kt & 1;

		if (kt + 1 < ktiles) /* in flight while we compute */
			sg_fetch<VEC>(p, bm, bn, (kt + 1) * SG_BK, ra, rb);
#pragma unroll
		for (int kk = 0; kk < SG_BK; kk++) {
			float fa[8], fb[8];
			float4 v;

			v = *reinterpret_cast<const float4 *>(&as[cur][kk][tm]);
			fa[0] = v.x, fa[1] = v.y, fa[2] = v.z, fa[3] = v.w;
			v = *reinterpret_cast<const float4 *>(&as[cur][kk][tm + 16]);
			fa[4] = v.x, fa[5] = v.y, fa[6] = v.z, fa[7] = v.w;
			v = *reinterpret_cast<const float4 *>(&bs[cur][kk][tn]);
			fb[0] = v.x, fb[1] = v.y, fb[2] = v.z, fb[3] = v.w;
			v = *reinterpret_cast<const float4 *>(&bs[cur][kk][tn + 32]);
			fb[4] = v.x, fb[5] = v.y, fb[6] = v.z, fb[7] = v.w;
#pragma unroll
			for (int i = 0; i < 8; i++)
#pragma unroll
				for (int j = 0; j < 8; j++)
					acc[i][j] = fmaf(fa[i], fb[j], acc[i][j]);
		}
		/* The other buffer was last read in iteration kt-1, which every
		 * thread has left (the barrier below it), so it is free. */
		if (kt + 1 < ktiles)
			sg_stash(as[cur ^ 1], bs[cur ^ 1], ra, rb);
		__syncthreads();
	}

#pragma unroll
	for (int i = 0; i < 8; i++) {
		int row = bm + tm + (i < 4 ? i : 12 + i); /* i >= 4: tm + 16 + (i - 4) */

		if (row >= p.m)
			continue;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int col = bn + tn + h * 32;
			float *c = p.c + (size_t)row * p.ldc + col;
			const float *v = &acc[i][h * 4];

			if (p.vec_c && col + 3 < p.n) {
				float4 o = make_float4(v[0], v[1], v[2], v[3]);

				if (p.accumulate) {
					float4 old = *reinterpret_cast<const float4 *>(c);

					o.x += old.x, o.y += old.y, o.z += old.z, o.w += old.w;
				}
				*reinterpret_cast<float4 *>(c) = o;
				continue;
			}
#pragma unroll
			for (int j = 0; j < 4; j++)
				if (col + j < p.n)
					c[j] = p.accumulate ? c[j] + v[j] : v[j];
		}
	}
}

static int aligned16(const void *p)
{
	return ((uintptr_t)p & 15) == 0;
}

/* Shapes are int inside the kernels (grid and index arithmetic); offsets are
 * size_t. m, n, k up to 2^31 - 256 stay far from int overflow in the tile
 * arithmetic. */
static int shape_ok(size_t m, size_t n, size_t k, size_t lda, size_t ldb, size_t ldc)
{
	const size_t lim = (size_t)INT32_MAX - 256;

	return m <= lim && n <= lim && k <= lim && lda >= k && ldb >= n && ldc >= n &&
	       (m + SG_BM - 1) / SG_BM <= 65535;
}

/* Output with k == 0: C = 0 (or unchanged when accumulating). */
__global__ void zero_rows_kernel(float *c, int m, int n, size_t ldc)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (size_t)m * n;
	     i += (size_t)gridDim.x * blockDim.x)
		c[(i / n) * ldc + i % n] = 0.0f;
}

static int zero_output(float *c, size_t m, size_t n, size_t ldc, int accumulate, cudaStream_t st)
{
	unsigned blocks = (unsigned)((m * n + 255) / 256);

	if (accumulate)
		return 0;
	zero_rows_kernel<<<blocks > 1024 ? 1024 : blocks, 256, 0, st>>>(c, (int)m, (int)n, ldc);
	return kernels_cu_err(cudaGetLastError(), "zero");
}

extern "C" int kernels_cu_gemm_f32(size_t m, size_t n, size_t k, const float *a, size_t lda,
				   const float *b, size_t ldb, float *c, size_t ldc,
				   int accumulate, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	sg_args p = {(int)m, (int)n, (int)k, a, b, c, lda, ldb, ldc, accumulate, 0};
	dim3 grid((unsigned)((n + SG_BN - 1) / SG_BN), (unsigned)((m + SG_BM - 1) / SG_BM));

	if (!shape_ok(m, n, k, lda, ldb, ldc) || (m && n && !c) || (m && n && k && (!a || !b)))
		return CRUN_EINVAL;
	if (!m || !n)
		return 0;
	if (!k)
		return zero_output(c, m, n, ldc, accumulate, st);
	p.vec_c = aligned16(c) && ldc % 4 == 0;
	if (aligned16(a) && aligned16(b) && lda % 4 == 0 && ldb % 4 == 0)
		sgemm_kernel<true><<<grid, SG_THREADS, 0, st>>>(p);
	else
		sgemm_kernel<false><<<grid, SG_THREADS, 0, st>>>(p);
	return kernels_cu_err(cudaGetLastError(), "sgemm launch");
}

/* ---- tensor-core GEMM ------------------------------------------------------------- */

enum { TC_BM = 128, TC_BN = 128, TC_BK = 32, TC_THREADS = 256, TC_STAGES = 3 };
/* Row strides of the shared tiles in halves: 16 bytes of pad make the eight
 * 16-byte rows one ldmatrix reads fall into distinct bank groups. */
enum { TC_SA = TC_BK + 8, TC_SB = TC_BN + 8 };
typedef uint16_t tc_tile_a[TC_BM][TC_SA];
typedef uint16_t tc_tile_b[TC_BK][TC_SB];
/* 3 x (10240 + 8704) = 56832 bytes a block; two blocks an SM fit in the
 * 164 KB (sm_80) and 227 KB (sm_90) an SM offers. */
static const size_t TC_SMEM_BYTES = TC_STAGES * (sizeof(tc_tile_a) + sizeof(tc_tile_b));

struct tc_args {
	int m, n, k;
	const uint16_t *a, *b; /* f16 or bf16 bits */
	float *c;
	size_t lda, ldb, ldc;
	int accumulate;
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
	return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, bypassing L1; src_bytes 0 zero-fills. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
		     "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit()
{
	asm volatile("cp.async.commit_group;\n" ::);
}

template <int N> __device__ __forceinline__ void cp_async_wait()
{
	asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* One 8-element (16-byte) chunk of a tile row: cp.async when the whole chunk
 * is inside the matrix and aligned, a zero-fill when none of it is, element
 * by element (zeros past the edge) otherwise. */
template <bool VEC>
__device__ __forceinline__ void tc_chunk(uint16_t *dst, const uint16_t *base, size_t ld, int row,
					 int col, int rows, int cols)
{
	if (row >= rows || col >= cols) {
		if (VEC)
			cp_async16(dst, base, 0);
		else
			*reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
		return;
	}
	const uint16_t *src = base + (size_t)row * ld + col;

	if (VEC && col + 8 <= cols) {
		cp_async16(dst, src, 16);
		return;
	}
#pragma unroll
	for (int i = 0; i < 8; i++)
		dst[i] = col + i < cols ? src[i] : (uint16_t)0;
}

/* A: 128 rows x 32 k (4 chunks a row), B: 32 k x 128 cols (16 chunks a
 * row); 512 chunks each, two per thread. */
template <bool VEC>
__device__ __forceinline__ void tc_issue(const tc_args &p, uint16_t (*sa)[TC_SA],
					 uint16_t (*sb)[TC_SB], int bm, int bn, int k0)
{
#pragma unroll
	for (int i = 0; i < 2; i++) {
		int c = threadIdx.x + i * TC_THREADS;
		int ar = c / 4, ac = (c % 4) * 8;
		int br = c / 16, bc = (c % 16) * 8;

		tc_chunk<VEC>(&sa[ar][ac], p.a, p.lda, bm + ar, k0 + ac, p.m, p.k);
		tc_chunk<VEC>(&sb[br][bc], p.b, p.ldb, k0 + br, bn + bc, p.k, p.n);
	}
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
		     : "r"(smem_addr(p)));
}

template <bool BF16> __device__ __forceinline__ void mma16816(float d[4], const uint32_t a[4],
							   const uint32_t b[2])
{
	if (BF16)
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
			     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
	else
		asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
			     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
			     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <bool BF16, bool VEC>
__global__ void __launch_bounds__(TC_THREADS, 2) gemm_tc_kernel(tc_args p)
{
	/* TC_STAGES slices in flight: dynamic shared memory (over the 48 KB a
	 * static array may take), laid out as sa[TC_STAGES] then sb[TC_STAGES]. */
	extern __shared__ __align__(16) uint16_t tc_smem[];
	tc_tile_a *sa = reinterpret_cast<tc_tile_a *>(tc_smem);
	tc_tile_b *sb = reinterpret_cast<tc_tile_b *>(tc_smem + TC_STAGES * TC_BM * TC_SA);
	const int bm = blockIdx.y * TC_BM, bn = blockIdx.x * TC_BN;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int wm = (warp / 4) * 64, wn = (warp % 4) * 32; /* 2 x 4 warps */
	const int ktiles = (p.k + TC_BK - 1) / TC_BK;
	float acc[4][4][4] = {}; /* [m16 tile][n8 tile][fragment] */

	/* Slice j is in cp.async group j: the prologue commits slices
	 * 0..TC_STAGES-2, iteration kt commits slice kt+TC_STAGES-1 (an empty
	 * group past the end, so the count stays exact). */
	for (int s = 0; s < TC_STAGES - 1; s++) {
		if (s < ktiles)
			tc_issue<VEC>(p, sa[s], sb[s], bm, bn, s * TC_BK);
		cp_async_commit();
	}
	for (int kt = 0; kt < ktiles; kt++) {
		const int cur = kt % TC_STAGES, nxt = kt + TC_STAGES - 1;

		/* kt + TC_STAGES - 1 groups committed so far; all but the
		 * newest TC_STAGES - 2 done means group kt is. */
		cp_async_wait<TC_STAGES - 2>();
		/* Everyone's copies (and plain stores) of slice kt are in, and
		 * everyone has finished slice kt-1, whose buffer is refilled
		 * next: nxt % TC_STAGES == (kt - 1) % TC_STAGES. */
		__syncthreads();
		if (nxt < ktiles)
			tc_issue<VEC>(p, sa[nxt % TC_STAGES], sb[nxt % TC_STAGES], bm, bn,
				      nxt * TC_BK);
		cp_async_commit();
#pragma unroll
		for (int ks = 0; ks < TC_BK; ks += 16) {
			uint32_t af[4][4], bf[4][2];

			/* A 16x16: lanes 0-15 address rows 0-15 at k, 16-31 at k+8,
			 * which yields a0..a3 in mma's order. */
#pragma unroll
			for (int mi = 0; mi < 4; mi++)
				ldmatrix_x4(af[mi],
					    &sa[cur][wm + mi * 16 + lane % 16][ks + (lane / 16) * 8]);
			/* B 16x16 (two n8 tiles): lane l addresses k row l%16 at
			 * column (l/16)*8; .trans hands out (k pair, n) as mma's
			 * column-major b0/b1: regs 0,1 for n0-7 and 2,3 for n8-15. */
#pragma unroll
			for (int nj = 0; nj < 2; nj++) {
				uint32_t r[4];

				ldmatrix_x4_trans(r,
						  &sb[cur][ks + lane % 16][wn + nj * 16 + (lane / 16) * 8]);
				bf[nj * 2][0] = r[0], bf[nj * 2][1] = r[1];
				bf[nj * 2 + 1][0] = r[2], bf[nj * 2 + 1][1] = r[3];
			}
#pragma unroll
			for (int mi = 0; mi < 4; mi++)
#pragma unroll
				for (int ni = 0; ni < 4; ni++)
					mma16816<BF16>(acc[mi][ni], af[mi], bf[ni]);
		}
	}

	/* Accumulator fragment: c0,c1 at (lane/4, (lane%4)*2 + {0,1}), c2,c3
	 * eight rows below. */
#pragma unroll
	for (int mi = 0; mi < 4; mi++)
#pragma unroll
		for (int ni = 0; ni < 4; ni++)
#pragma unroll
			for (int f = 0; f < 4; f++) {
				int row = bm + wm + mi * 16 + lane / 4 + (f / 2) * 8;
				int col = bn + wn + ni * 8 + (lane % 4) * 2 + f % 2;

				if (row < p.m && col < p.n) {
					float *c = p.c + (size_t)row * p.ldc + col;

					*c = p.accumulate ? *c + acc[mi][ni][f] : acc[mi][ni][f];
				}
			}
}

/* More than 48 KB of dynamic shared memory needs the kernel's consent,
 * asked on every launch (a cheap attribute write; no state kept here). */
static int launch_tc(void (*kernel)(tc_args), dim3 grid, const tc_args &p, cudaStream_t st)
{
	int r = kernels_cu_err(cudaFuncSetAttribute(kernel,
						    cudaFuncAttributeMaxDynamicSharedMemorySize,
						    (int)TC_SMEM_BYTES),
			       "cudaFuncSetAttribute (tensor-core gemm)");

	if (r < 0)
		return r;
	kernel<<<grid, TC_THREADS, TC_SMEM_BYTES, st>>>(p);
	return kernels_cu_err(cudaGetLastError(), "tensor-core gemm launch");
}

extern "C" int kernels_cu_gemm_tc(size_t m, size_t n, size_t k, int dtype, const void *a,
				  size_t lda, const void *b, size_t ldb, float *c, size_t ldc,
				  int accumulate, void *stream)
{
	cudaStream_t st = (cudaStream_t)stream;
	tc_args p = {(int)m, (int)n, (int)k, (const uint16_t *)a, (const uint16_t *)b, c,
		     lda, ldb, ldc, accumulate};
	dim3 grid((unsigned)((n + TC_BN - 1) / TC_BN), (unsigned)((m + TC_BM - 1) / TC_BM));
	int vec = aligned16(a) && aligned16(b) && lda % 8 == 0 && ldb % 8 == 0;
	int r;

	if ((dtype != CRUN_F16 && dtype != CRUN_BF16) || !shape_ok(m, n, k, lda, ldb, ldc) ||
	    (m && n && !c) || (m && n && k && (!a || !b)))
		return CRUN_EINVAL;
	if (!m || !n)
		return 0;
	if (!k)
		return zero_output(c, m, n, ldc, accumulate, st);
	if (dtype == CRUN_BF16)
		r = vec ? launch_tc(gemm_tc_kernel<true, true>, grid, p, st)
			: launch_tc(gemm_tc_kernel<true, false>, grid, p, st);
	else
		r = vec ? launch_tc(gemm_tc_kernel<false, true>, grid, p, st)
			: launch_tc(gemm_tc_kernel<false, false>, grid, p, st);
	return r;
}
