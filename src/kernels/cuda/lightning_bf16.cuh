// Owns what the bf16 lightning prefill's two translation units share (lightning_bf16.cu: steps, mma.sync kernels,
// dispatch; lightning_bf16_wg.cu: the head_dim-128 warpgroup kernels): the walk's chunk length, the output pair
// store and the warpgroup launchers. Internal to src/kernels/cuda.
#pragma once
#include "kernels/cuda/lightning_common.cuh"
#include "kernels/cuda/mma_bf16.cuh"

namespace ssmserve::cuda::detail {

constexpr int kChunk = 64;  // tokens per step of the range walk (and of the warpgroup range KV)

/// Two adjacent output elements (8-byte / 4-byte aligned).
__device__ __forceinline__ void store2(float* p, float a, float b) { *reinterpret_cast<float2*>(p) = make_float2(a, b); }
__device__ __forceinline__ void store2(bf16* p, float a, float b) { *reinterpret_cast<uint32_t*>(p) = pack_bf16(a, b); }

/// Step 1 on one warpgroup per (range, head), head_dim 128 only (sm_90a): the range aggregates A_r into agg
/// ([num_ranges, H, 128, 128] fp32), no block states. qkv: [tokens][H][3][128] bf16 rows of stride qs elements.
/// Returns the launch status.
cudaError_t launch_range_kv_wg(const bf16* qkv, int64_t qs, const LightningDevParams& p, const LightningPlanDev& plan,
                               float* agg, cudaStream_t stream);

/// Step 3 as the warpgroup range walk, head_dim 128 only (sm_90a): out [tokens][H][128] (bf16 or fp32, row stride
/// os elements) from qkv and the entering range states S_r in agg. Returns the launch status.
cudaError_t launch_walk_wg(const bf16* qkv, int64_t qs, bf16* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, const float* agg, cudaStream_t stream);
cudaError_t launch_walk_wg(const bf16* qkv, int64_t qs, float* out, int64_t os, const LightningDevParams& p,
                           const LightningPlanDev& plan, const float* agg, cudaStream_t stream);

}  // namespace ssmserve::cuda::detail
