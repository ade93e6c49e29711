// Owns the attention projections' per-token kernels on the GPU (see paged_attention.h): RoPE, the KV-cache writes
// (reshape_and_cache) and the fused q / k norm + RoPE + cache write (qk_norm_rope_cache, every step).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_page.cuh"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

/// One warp per (token t, head h) of x = [q heads | k heads | v heads] (qk_norm_rope_cache), kQkHeadsPerBlock heads
/// per block (grid: T x ceil(heads / kQkHeadsPerBlock)), so a decode row spreads over several SMs instead of one
/// block looping over its heads: 1. a q or k head normed (qw non-null) with head_rms_norm's arithmetic; 2. its first
/// 2 * half dims rotated (inv_freq non-null) with rope_kernel's; 3. a k or v head copied into slot slots[t] as
/// cache_kernel does. Every element's arithmetic is the one-block form's (same bits).
constexpr int kQkHeadsPerBlock = 4;
__global__ void __launch_bounds__(32 * kQkHeadsPerBlock) qk_norm_rope_cache_kernel(
    float* __restrict__ x, int64_t xs, int num_heads, const float* __restrict__ qw, const float* __restrict__ kw,
    float eps, const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int half,
    const int32_t* __restrict__ slots, KvCacheView cache) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int D = cache.head_dim, KVH = cache.num_kv_heads, QK = num_heads + KVH;
  const int h = static_cast<int>(blockIdx.y) * kQkHeadsPerBlock + static_cast<int>(threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (h >= QK + KVH) return;
  float* r = x + t * xs + static_cast<int64_t>(h) * D;
  if (h < QK) {
    if (qw) {
      const float* w = h < num_heads ? qw : kw;
      float ss = 0.0f;
      for (int i = lane; i < D; i += 32) ss += r[i] * r[i];
      ss = warp_sum(ss);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
      for (int i = lane; i < D; i += 32) r[i] = r[i] * inv * w[i];
      __syncwarp();
    }
    if (inv_freq) {
      const float pos = static_cast<float>(positions[t]);
      for (int i = lane; i < half; i += 32) {
        const float a = pos * inv_freq[i];
        const float c = cosf(a), s = sinf(a);
        const float x1 = r[i], x2 = r[i + half];
        r[i] = x1 * c - x2 * s;
        r[i + half] = x2 * c + x1 * s;
      }
      __syncwarp();
    }
    if (h < num_heads) return;  // a q head: nothing to cache
  }
  const int32_t s = slots[t];
  if (s < 0) return;
  const int64_t W = static_cast<int64_t>(KVH) * D;
  const int64_t b = s / cache.block_size, off = s % cache.block_size;
  float* kd = reinterpret_cast<float*>(cache.base + b * cache.page_bytes + cache.layer_offset_bytes) + off * W;
  // k head j = h - num_heads to kd[j * D ...]; v head j = h - QK to vd[j * D ...]
  float* d = h < QK ? kd + static_cast<int64_t>(h - num_heads) * D : kd + kv_elems(cache) + static_cast<int64_t>(h - QK) * D;
  for (int i = lane; i < D; i += 32) d[i] = r[i];
}

/// Grid (T): x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin per head, pairs (i, i + half).
__global__ void rope_kernel(float* __restrict__ x, int64_t xs, int num_heads, int head_dim,
                            const int32_t* __restrict__ positions, const float* __restrict__ inv_freq, int half) {
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(positions[t]);
  for (int idx = threadIdx.x; idx < num_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const float a = pos * inv_freq[i];
    const float c = cosf(a), s = sinf(a);
    float* xh = x + t * xs + static_cast<int64_t>(h) * head_dim;
    const float x1 = xh[i], x2 = xh[i + half];
    xh[i] = x1 * c - x2 * s;
    xh[i + half] = x2 * c + x1 * s;
  }
}

/// Grid (T): copies K and V rows into slot_mapping[t]'s page.
__global__ void cache_kernel(const float* __restrict__ k, int64_t ks, const float* __restrict__ v, int64_t vs,
                             const int32_t* __restrict__ slots, KvCacheView cache) {
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x;
  const int32_t s = slots[t];
  if (s < 0) return;
  const int64_t W = static_cast<int64_t>(cache.num_kv_heads) * cache.head_dim;
  const int64_t b = s / cache.block_size, off = s % cache.block_size;
  float* kd = reinterpret_cast<float*>(cache.base + b * cache.page_bytes + cache.layer_offset_bytes) + off * W;
  float* vd = kd + kv_elems(cache);
  for (int64_t c = threadIdx.x; c < W; c += blockDim.x) {
    kd[c] = k[t * ks + c];
    vd[c] = v[t * vs + c];
  }
}

}  // namespace

cudaError_t apply_rope(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, const int32_t* positions,
                       const float* inv_freq, int half, cudaStream_t stream) {
  if (T < 0 || num_heads <= 0 || half <= 0 || 2 * half > head_dim || x_stride < static_cast<int64_t>(num_heads) * head_dim)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  rope_kernel<<<static_cast<unsigned>(T), 256, 0, stream>>>(x, x_stride, num_heads, head_dim, positions, inv_freq, half);
  return launch_status();
}

cudaError_t qk_norm_rope_cache(float* x, int64_t x_stride, int64_t T, int num_heads, const float* q_weight,
                               const float* k_weight, float eps, const int32_t* positions, const float* inv_freq, int half,
                               const int32_t* slot_mapping, const KvCacheView& cache, cudaStream_t stream, bool pdl) {
  const int D = cache.head_dim;
  if (T < 0 || num_heads < 1 || cache.base == nullptr || cache.block_size <= 0 || cache.num_kv_heads <= 0 || D < 2 ||
      D > 1024 || x_stride < static_cast<int64_t>(num_heads + 2 * cache.num_kv_heads) * D || !slot_mapping ||
      (q_weight && (!k_weight || D % 2 != 0 || eps < 0.0f)) || (inv_freq && (!positions || half <= 0 || 2 * half > D)))
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  if (T > 2147483647) return cudaErrorInvalidValue;
  const int heads = num_heads + 2 * cache.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((heads + kQkHeadsPerBlock - 1) / kQkHeadsPerBlock));
  if (grid.y > 65535) return cudaErrorInvalidValue;
  return launch_pdl(pdl, qk_norm_rope_cache_kernel, grid, dim3(32 * kQkHeadsPerBlock), 0, stream, x, x_stride, num_heads,
                    q_weight, k_weight, eps, positions, inv_freq, half, slot_mapping, cache);
}

cudaError_t reshape_and_cache(const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t T,
                              const int32_t* slot_mapping, const KvCacheView& cache, cudaStream_t stream, bool pdl) {
  if (T < 0 || cache.base == nullptr || cache.block_size <= 0 || cache.num_kv_heads <= 0 || cache.head_dim <= 0)
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  return launch_pdl(pdl, cache_kernel, dim3(static_cast<unsigned>(T)), dim3(128), 0, stream, k, k_stride, v, v_stride,
                    slot_mapping, cache);
}

}  // namespace ssmserve::cuda
