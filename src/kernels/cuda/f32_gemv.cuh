// Owns the per-column arithmetic of the fp32 GEMV of few rows (skinny_gemm_f32.cu).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ssmserve::cuda::detail {

/// Weight chunks (float4 per lane) of a column a warp may hold in registers before its PDL wait: k < 4 * 32 * 8 = 1024.
constexpr int kF32GemvPreChunks = 8;

/// Loads lane l's first kF32GemvPreChunks float4 chunks k = 4 l + 128 j (those < K) of the weight row wr into pre, and
/// hints the L2 to fetch the rest of the row (prefetch.global.L2 per 128-byte line: never faults). Weights are
/// constants: a kernel may call this before its PDL wait.
__device__ __forceinline__ void f32_column_preload(const float* __restrict__ wr, int64_t K,
                                                   float4 (&pre)[kF32GemvPreChunks]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kF32GemvPreChunks; ++j) {
    const int64_t k = 4 * lane + 128 * j;
    if (k < K) pre[j] = __ldg(reinterpret_cast<const float4*>(wr + k));
  }
  for (int64_t k = 128 * kF32GemvPreChunks + 32 * lane; k < K; k += 32 * 32)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + k));
}

/// One warp's column of y = x W^T for M rows: lane l sums its float4 chunks k = 4 l + 128 j (j ascending, the 4
/// products in ascending k, one FMA each) of x[m] . wr, then warp_sum; every lane gets the M sums. The order depends on
/// K only (a row's result does not depend on M). K % 4 == 0, 16-byte aligned rows, x row stride xs % 4 == 0.
/// pre: the row's first chunks from f32_column_preload, or nullptr (every chunk loaded here); the same sums either way.
template <int M>
__device__ __forceinline__ void f32_dot_column(const float* __restrict__ x, int64_t xs, const float* __restrict__ wr,
                                               int64_t K, float (&acc)[M],
                                               const float4 (*pre)[kF32GemvPreChunks] = nullptr) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  auto chunk = [&](int64_t k, const float4& wv) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 xv = *reinterpret_cast<const float4*>(x + m * xs + k);
      acc[m] = fmaf(xv.x, wv.x, acc[m]);
      acc[m] = fmaf(xv.y, wv.y, acc[m]);
      acc[m] = fmaf(xv.z, wv.z, acc[m]);
      acc[m] = fmaf(xv.w, wv.w, acc[m]);
    }
  };
  int64_t k = 4 * lane;
  if (pre) {
#pragma unroll
    for (int j = 0; j < kF32GemvPreChunks; ++j, k += 128)
      if (k < K) chunk(k, (*pre)[j]);
  }
#pragma unroll 4
  for (; k < K; k += 128) chunk(k, *reinterpret_cast<const float4*>(wr + k));
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
}

}  // namespace ssmserve::cuda::detail
