// Owns the GPU per-head RMSNorm of queries and keys (see head_rms_norm.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/head_rms_norm.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 8;

/// Grid (ceil(T * num_heads / 8)), 8 warps: warp w takes (token, head) pair blockIdx.x * 8 + w; lane l owns the
/// elements l, l + 32, ... of the head (the sum of squares in that order, then the butterfly: fixed for any T). Heads
/// below w_split take weight w, the rest w2 (head_rms_norm_qk; head_rms_norm: w_split = num_heads).
__global__ void __launch_bounds__(kWarps * 32) head_rms_norm_kernel(float* __restrict__ x, int64_t xs, int64_t pairs,
                                                                    int num_heads, int D, const float* __restrict__ w,
                                                                    int w_split, const float* __restrict__ w2, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t p = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (p >= pairs) return;
  const int h = static_cast<int>(p % num_heads);
  float* r = x + (p / num_heads) * xs + h * static_cast<int64_t>(D);
  if (h >= w_split) w = w2;
  float ss = 0.0f;
  for (int i = lane; i < D; i += 32) ss += r[i] * r[i];
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  for (int i = lane; i < D; i += 32) r[i] = r[i] * inv * w[i];
}

}  // namespace

cudaError_t head_rms_norm_qk(float* x, int64_t x_stride, int64_t T, int q_heads, int k_heads, int head_dim, const float* q_weight,
                             const float* k_weight, float eps, cudaStream_t stream) {
  if (T < 0 || q_heads < 1 || k_heads < 0 || head_dim < 2 || head_dim > 1024 || head_dim % 2 != 0 ||
      x_stride < static_cast<int64_t>(q_heads + k_heads) * head_dim || !q_weight || (k_heads > 0 && !k_weight) || eps < 0.0f)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const int num_heads = q_heads + k_heads;
  const int64_t pairs = T * num_heads;
  head_rms_norm_kernel<<<ceil_div(pairs, kWarps), kWarps * 32, 0, stream>>>(x, x_stride, pairs, num_heads, head_dim, q_weight,
                                                                            q_heads, k_weight, eps);
  return launch_status();
}

cudaError_t head_rms_norm(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, const float* weight, float eps,
                          cudaStream_t stream) {
  return head_rms_norm_qk(x, x_stride, T, num_heads, 0, head_dim, weight, nullptr, eps, stream);
}

}  // namespace ssmserve::cuda
