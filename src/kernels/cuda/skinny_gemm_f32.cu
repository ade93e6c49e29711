// Owns the fp32 GEMV of few rows (skinny_gemm_f32, gemm.h): y[M, N] fp32 = x[M, K] W[N, K]^T for fp32 operands
// and M <= 8, the shape of a decode step's MoE router (N = experts, K = hidden). cuBLASLt serves it with two kernels
// (a batched dot and a one-block reduction, 5.5-6.5 us per router on the H200, no PDL); this is one.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/f32_gemv.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 8;  // output columns per block, one per warp

/// Grid (ceil(N / 8)), 8 warps: warp w computes column n = blockIdx.x * 8 + w of all M rows (f32_dot_column: the
/// order depends on K only, so a row's result does not depend on M). K % 4 == 0, strides % 4 == 0, 16-byte aligned
/// rows.
/// PRELOAD (KernelTuning::f32_gemv_preload): the column's first weight chunks in registers and the rest hinted into
/// the L2 before the PDL wait (w is a constant: no kernel of the step writes it), while the kernel before it still
/// runs; the same sums. A template argument, so the chunks stay in registers (a run-time choice put them on the stack).
template <int M, bool PRELOAD>
__global__ void __launch_bounds__(32 * kWarps) f32_gemv_kernel(int64_t N, int64_t K, const float* __restrict__ x,
                                                               int64_t xs, const float* __restrict__ w, int64_t ws,
                                                               float* __restrict__ y, int64_t ys) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  float4 pre[kF32GemvPreChunks];
  if (PRELOAD && n < N) f32_column_preload(w + n * ws, K, pre);
  pdl_wait();
  pdl_launch_dependents();
  if (n >= N) return;
  float acc[M];
  if constexpr (PRELOAD)
    f32_dot_column<M>(x, xs, w + n * ws, K, acc, &pre);
  else
    f32_dot_column<M>(x, xs, w + n * ws, K, acc);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float s = acc[m];
    if (lane == 0) y[m * ys + n] = s;
  }
}

template <int M>
cudaError_t launch_m(const GemmArgs& g, bool pdl, cudaStream_t stream) {
  const auto kernel = kernel_tuning().f32_gemv_preload ? f32_gemv_kernel<M, true> : f32_gemv_kernel<M, false>;
  return launch_pdl(pdl, kernel, dim3(ceil_div(g.N, kWarps)), dim3(32 * kWarps), 0, stream, g.N, g.K,
                    static_cast<const float*>(g.x), g.x_stride, static_cast<const float*>(g.w), g.w_stride,
                    static_cast<float*>(g.y), g.y_stride);
}

bool aligned16(const void* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 4 == 0; }

}  // namespace

bool skinny_gemm_f32_serves(const GemmArgs& g) {
  return g.ab_dtype == DType::F32 && g.y_dtype == DType::F32 && g.M >= 1 && g.M <= kSkinnyF32MaxM && g.N >= 1 &&
         g.K >= 4 && g.K % 4 == 0 && g.x_stride >= g.K && g.w_stride >= g.K && g.y_stride >= g.N &&
         aligned16(g.x, g.x_stride) && aligned16(g.w, g.w_stride) && ceil_div(g.N, kWarps) <= 0x7fffffffu;
}

cudaError_t skinny_gemm_f32(const GemmArgs& g, bool pdl, cudaStream_t stream) {
  if (!skinny_gemm_f32_serves(g)) return cudaErrorInvalidValue;
  switch (g.M) {  // the row count is a template argument: the accumulators stay in registers
    case 1: return launch_m<1>(g, pdl, stream);
    case 2: return launch_m<2>(g, pdl, stream);
    case 3: return launch_m<3>(g, pdl, stream);
    case 4: return launch_m<4>(g, pdl, stream);
    case 5: return launch_m<5>(g, pdl, stream);
    case 6: return launch_m<6>(g, pdl, stream);
    case 7: return launch_m<7>(g, pdl, stream);
    default: return launch_m<8>(g, pdl, stream);
  }
}

}  // namespace ssmserve::cuda
