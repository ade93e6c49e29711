// Owns the plain tiled GEMM the cuBLASLt path falls back to when it has no algorithm for the operands (rows not
// 16-byte aligned, e.g. a narrow slice of a projection): y = x W^T with fp32 accumulation. Correct for any
// strides; not tuned (see gemm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kTile = 16;

/// Block (16 x 16 threads) computes y[m0:m0+16, n0:n0+16], stepping K in tiles through shared memory.
template <class TA, class TY>
__global__ void gemm_tiled_kernel(int64_t M, int64_t N, int64_t K, const TA* __restrict__ x, int64_t xs,
                                  const TA* __restrict__ w, int64_t ws, TY* __restrict__ y, int64_t ys) {
  __shared__ float xt[kTile][kTile + 1], wt[kTile][kTile + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m = static_cast<int64_t>(blockIdx.y) * kTile + ty, n = static_cast<int64_t>(blockIdx.x) * kTile + tx;
  const int64_t wn = static_cast<int64_t>(blockIdx.x) * kTile + ty;  // weight row this thread loads
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    xt[ty][tx] = (m < M && k0 + tx < K) ? load(x + m * xs + k0 + tx) : 0.0f;
    wt[ty][tx] = (wn < N && k0 + tx < K) ? load(w + wn * ws + k0 + tx) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kTile; ++k) acc = fmaf(xt[ty][k], wt[tx][k], acc);
    __syncthreads();
  }
  if (m < M && n < N) store(y + m * ys + n, acc);
}

template <class TA>
cudaError_t launch_y(const GemmArgs& g, cudaStream_t stream) {
  const dim3 grid(ceil_div(g.N, kTile), ceil_div(g.M, kTile)), block(kTile, kTile);
  const auto* x = static_cast<const TA*>(g.x);
  const auto* w = static_cast<const TA*>(g.w);
  if (g.y_dtype == DType::BF16)
    gemm_tiled_kernel<<<grid, block, 0, stream>>>(g.M, g.N, g.K, x, g.x_stride, w, g.w_stride,
                                                  static_cast<__nv_bfloat16*>(g.y), g.y_stride);
  else
    gemm_tiled_kernel<<<grid, block, 0, stream>>>(g.M, g.N, g.K, x, g.x_stride, w, g.w_stride,
                                                  static_cast<float*>(g.y), g.y_stride);
  return launch_status();
}

}  // namespace

cudaError_t gemm_fallback(const GemmArgs& g, cudaStream_t stream) {
  if (g.M < 0 || g.N < 1 || g.K < 1 || (g.M + kTile - 1) / kTile > 65535) return cudaErrorInvalidValue;
  if (g.M == 0) return cudaSuccess;
  return g.ab_dtype == DType::BF16 ? launch_y<__nv_bfloat16>(g, stream) : launch_y<float>(g, stream);
}

}  // namespace ssmserve::cuda
