// Owns the per-column arithmetic of the fp32 GEMV of few rows (skinny_gemm_f32.cu).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace ssmserve::cuda::detail {

/// One warp's column of y = x W^T for M rows: lane l sums its float4 chunks k = 4 l + 128 j (j ascending, the 4
/// products in ascending k, one FMA each) of x[m] . wr, then warp_sum; every lane gets the M sums. The order depends on
/// K only (a row's result does not depend on M). K % 4 == 0, 16-byte aligned rows, x row stride xs % 4 == 0.
template <int M>
__device__ __forceinline__ void f32_dot_column(const float* __restrict__ x, int64_t xs, const float* __restrict__ wr,
                                               int64_t K, float (&acc)[M]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int64_t k = 4 * lane; k < K; k += 128) {
    const float4 wv = *reinterpret_cast<const float4*>(wr + k);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 xv = *reinterpret_cast<const float4*>(x + m * xs + k);
      acc[m] = fmaf(xv.x, wv.x, acc[m]);
      acc[m] = fmaf(xv.y, wv.y, acc[m]);
      acc[m] = fmaf(xv.z, wv.z, acc[m]);
      acc[m] = fmaf(xv.w, wv.w, acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
}

}  // namespace ssmserve::cuda::detail
