// Owns the GPU per-head RMSNorm of queries and keys (see head_rms_norm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_rms_norm.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 8;

/// Grid (ceil(T * num_heads / 8)), 8 warps: warp w takes (token, head) pair blockIdx.x * 8 + w; lane l owns the
/// elements l, l + 32, ... of the head (the sum of squares in that order, then the butterfly: fixed for any T).
__global__ void __launch_bounds__(kWarps * 32) head_rms_norm_kernel(float* __restrict__ x, int64_t xs, int64_t pairs,
                                                                    int num_heads, int D, const float* __restrict__ w,
                                                                    float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (p >= pairs) return;
  float* r = x + (p / num_heads) * xs + (p % num_heads) * static_cast<int64_t>(D);
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) ss += r[i] * r[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  for (int i = lane; i < D; i += 32) r[i] = r[i] * inv * w[i];
}

}  // namespace

cudaError_t head_rms_norm(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, const float* weight, float eps,
                          cudaStream_t stream) {
  if (T < 0 || num_heads < 1 || head_dim < 2 || head_dim > 1024 || head_dim % 2 != 0 ||
      x_stride < static_cast<int64_t>(num_heads) * head_dim || !weight || eps < 0.0f)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const int64_t pairs = T * num_heads;
  head_rms_norm_kernel<<<ceil_div(pairs, kWarps), kWarps * 32, 0, stream>>>(x, x_stride, pairs, num_heads, head_dim, weight, eps);
  return launch_status();
}

}  // namespace ssmserve::cuda
