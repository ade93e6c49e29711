// Owns the vectorized gated RMSNorm kernel shared by rms_norm.cu (gated_rms_norm) and decode_ops.cu
// (gated_rms_norm_pdl): one block per (row, group), the group's y and z read once as float4 runs held in registers
// (a thread owns VPT runs), then normalized and written from those registers. Both entry points pick it under the
// same conditions and run the same code, so their results stay bit-identical. Math: transformers'
// MambaRMSNormGated (see kernels/cpu/gated_rms_norm.h), norm_before_gate false: normalize y * silu(z) over the
// group; true: normalize y, then multiply by silu(z).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda::detail {

inline constexpr int kGatedNormVecMaxThreads = 256;

/// Launch shape of the vectorized kernel: runs (float4) per thread and threads per block; vpt 0 = not applicable.
struct GatedNormVecPlan {
  int vpt = 0;
  int threads = 0;
};

/// The vectorized form applies when the group size and every row stride are multiples of 4, y / z / weight are
/// 16-byte aligned, out is 16- (fp32) or 8-byte (bf16) aligned and the group fits 8 runs x 256 threads (8192).
inline GatedNormVecPlan gated_norm_vec_plan(const float* y, int64_t y_stride, const float* z, int64_t z_stride,
                                            const float* weight, const void* out, int64_t out_stride, DType out_dtype,
                                            int64_t group_size) {
  const auto al = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (group_size % 4 != 0 || y_stride % 4 != 0 || z_stride % 4 != 0 || out_stride % 4 != 0 || !al(y, 16) ||
      !al(z, 16) || !al(weight, 16) || !al(out, out_dtype == DType::F32 ? 16 : 8))
    return {};
  const int64_t n4 = group_size / 4;
  for (int vpt : {1, 2, 4, 8})
    if (n4 <= int64_t{vpt} * kGatedNormVecMaxThreads) {
      const int64_t t = (n4 + vpt - 1) / vpt;
      return {vpt, static_cast<int>((t + 31) / 32 * 32)};
    }
  return {};
}

/// Groups per block for T rows of `groups` groups each (blockDim (plan.threads, G), grid (T, groups / G)): under
/// KernelTuning::prefill_row_kernels, a one-warp plan (groups up to 128 elements: Gated DeltaNet's value heads) and
/// T >= 64, the most of 8, 4, 2 that divides `groups` (one warp per group, its sum by gated_norm_warp_sum); else 1
/// (one block per group: decode steps, wide groups). A function of T and the shape only.
inline int gated_norm_vec_groups_per_block(const GatedNormVecPlan& plan, int64_t T, int64_t groups) {
  if (!kernel_tuning().prefill_row_kernels || plan.threads != 32 || T < 64) return 1;
  for (int g : {8, 4, 2})
    if (groups % g == 0) return g;
  return 1;
}

/// block_sum's arithmetic for a block of one warp (warp_sum; lane 0's value alone in the second warp_sum), without
/// its barriers: a warp that owns a group sums it as the one-warp block of the old launch does, bit for bit.
__device__ __forceinline__ float gated_norm_warp_sum(float v) {
  v = warp_sum(v);
  return warp_sum((threadIdx.x & 31) == 0 ? v : 0.0f);
}

/// One float4 run of the gated norm (g = silu(z) per element; h = y, or y * g unless norm_before_gate) and its sum of
/// squares in gated_norm_vec_kernel's order.
__device__ __forceinline__ float gated_norm_run(float4 yv, float4 zv, bool norm_before_gate, float4& g, float4& h) {
  g = make_float4(silu(zv.x), silu(zv.y), silu(zv.z), silu(zv.w));
  h = norm_before_gate ? yv : make_float4(yv.x * g.x, yv.y * g.y, yv.z * g.z, yv.w * g.w);
  return h.x * h.x + h.y * h.y + h.z * h.z + h.w * h.w;
}
/// A normalized run: h * inv * w, then times g when norm_before_gate (the kernel's output before rounding).
__device__ __forceinline__ float4 gated_norm_out(float4 h, float4 g, float inv, float4 w, bool norm_before_gate) {
  float4 v = make_float4(h.x * inv * w.x, h.y * inv * w.y, h.z * inv * w.z, h.w * inv * w.w);
  if (norm_before_gate) v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
  return v;
}

__device__ __forceinline__ void store4(float* p, float a, float b, float c, float d) {
  *reinterpret_cast<float4*>(p) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, float a, float b, float c, float d) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(a, b), hi = __floats2bfloat162_rn(c, d);
  uint2 v;
  v.x = *reinterpret_cast<const uint32_t*>(&lo);
  v.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(p) = v;
}

/// Grid (T, D / group_size / G), block (GatedNormVecPlan::threads, G) with G = gated_norm_vec_groups_per_block (G > 1
/// only for one-warp plans: warp threadIdx.y owns group blockIdx.y * G + threadIdx.y). out may alias y (every read
/// precedes the block sum; with G > 1 a group is read and written by its warp alone). Waits on the predecessor
/// first (Programmatic Dependent Launch; a no-op when launched without it), so both entry points run the very same
/// instantiation.
template <class TO, int VPT>
__global__ void __launch_bounds__(kGatedNormVecMaxThreads) gated_norm_vec_kernel(
    const float* y, int64_t y_stride, const float* __restrict__ z, int64_t z_stride, const float* __restrict__ weight,
    float eps, int64_t group_size, bool norm_before_gate, TO* out, int64_t out_stride) {
  __shared__ float scratch[32];
  pdl_wait();
  pdl_launch_dependents();
  const int64_t t = blockIdx.x, g0 = (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * group_size;
  const int n4 = static_cast<int>(group_size / 4);
  const float4* y4 = reinterpret_cast<const float4*>(y + t * y_stride + g0);
  const float4* z4 = reinterpret_cast<const float4*>(z + t * z_stride + g0);
  float4 h[VPT], g[VPT];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= n4) continue;
    ss += gated_norm_run(y4[i], z4[i], norm_before_gate, g[j], h[j]);
  }
  ss = blockDim.y == 1 ? block_sum(ss, scratch) : gated_norm_warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group_size) + eps);
  const float4* w4 = reinterpret_cast<const float4*>(weight + g0);
  TO* o = out + t * out_stride + g0;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int i = threadIdx.x + j * blockDim.x;
    if (i >= n4) continue;
    const float4 v = gated_norm_out(h[j], g[j], inv, w4[i], norm_before_gate);
    store4(o + 4 * i, v.x, v.y, v.z, v.w);
  }
}

/// One (row, group) of gated_norm_vec_kernel<TO, vpt> launched with `threads` threads (GatedNormVecPlan), computed by
/// the first `threads` threads of a larger block (blockDim.x >= threads, a multiple of 32; the others add 0 to the
/// block sum, which leaves it unchanged, and store nothing): the kernel's runs, sums and stores in its order, so its
/// bits. y (the group's first element) is read through the L2 (ld.global.cg: rows other blocks of the caller's grid
/// wrote); z, weight, out likewise at the group's first element. Every thread of the block must call it (block_sum).
template <class TO>
__device__ __forceinline__ void gated_norm_group_in_block(const float* y, const float* __restrict__ z,
                                                          const float* __restrict__ weight, float eps,
                                                          int64_t group_size, bool norm_before_gate, TO* out,
                                                          int threads, int vpt, float* scratch) {
  const int n4 = static_cast<int>(group_size / 4), tid = threadIdx.x;
  const float4* y4 = reinterpret_cast<const float4*>(y);
  const float4* z4 = reinterpret_cast<const float4*>(z);
  float ss = 0.0f;
  if (tid < threads)
    for (int j = 0; j < vpt; ++j) {
      const int i = tid + j * threads;
      if (i >= n4) continue;
      float4 g, h;
      ss += gated_norm_run(__ldcg(y4 + i), z4[i], norm_before_gate, g, h);
    }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(group_size) + eps);
  if (tid >= threads) return;
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  for (int j = 0; j < vpt; ++j) {
    const int i = tid + j * threads;
    if (i >= n4) continue;
    float4 g, h;
    gated_norm_run(__ldcg(y4 + i), z4[i], norm_before_gate, g, h);
    const float4 v = gated_norm_out(h, g, inv, w4[i], norm_before_gate);
    store4(out + 4 * i, v.x, v.y, v.z, v.w);
  }
}

/// Calls launch(kernel) with the instantiation for plan.vpt and out_dtype (F32 or BF16); launch receives a
/// pointer to gated_norm_vec_kernel<TO, VPT> and the typed out pointer.
template <class Launch>
cudaError_t dispatch_gated_norm_vec(const GatedNormVecPlan& plan, DType out_dtype, void* out, Launch&& launch) {
  const auto typed = [&](auto tag) -> cudaError_t {
    using TO = decltype(tag);
    TO* o = static_cast<TO*>(out);
    switch (plan.vpt) {
      case 1: return launch(gated_norm_vec_kernel<TO, 1>, o);
      case 2: return launch(gated_norm_vec_kernel<TO, 2>, o);
      case 4: return launch(gated_norm_vec_kernel<TO, 4>, o);
      default: return launch(gated_norm_vec_kernel<TO, 8>, o);
    }
  };
  return out_dtype == DType::BF16 ? typed(__nv_bfloat16{}) : typed(float{});
}

}  // namespace ssmserve::cuda::detail
