// Owns the pieces the two GPU lightning prefill paths share (lightning.cu: fp32 activations with hi / lo
// bf16 splits; lightning_bf16.cu: bf16 activations): the decay factor, the hi / lo split and the state-passing
// kernel (see lightning.h).
#pragma once
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/lightning.h"

namespace ssmserve::cuda::detail {
using bf16 = __nv_bfloat16;
constexpr int kScanThreads = 256;

/// e^{-s k} in double, rounded to fp32 (cpu::lightning_decay).
__device__ __forceinline__ float decay(float s, double k) { return static_cast<float>(exp(-static_cast<double>(s) * k)); }

/// v = hi + lo with hi = bf16(v), lo = bf16(v - hi): ~16 mantissa bits through two bf16 products.
__device__ __forceinline__ void split4(const float (&v)[4], bf16* hi, bf16* lo) {
  float h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bf16 b = __float2bfloat16_rn(v[i]);
    h[i] = __bfloat162float(b);
    l[i] = v[i] - h[i];
  }
  reinterpret_cast<__nv_bfloat162*>(hi)[0] = __floats2bfloat162_rn(h[0], h[1]);
  reinterpret_cast<__nv_bfloat162*>(hi)[1] = __floats2bfloat162_rn(h[2], h[3]);
  reinterpret_cast<__nv_bfloat162*>(lo)[0] = __floats2bfloat162_rn(l[0], l[1]);
  reinterpret_cast<__nv_bfloat162*>(lo)[1] = __floats2bfloat162_rn(l[2], l[3]);
}
/// "all" mode: elements at..at+3 of pool block `block`'s state = v0..v3 in the state dtype (block 0: no store).
template <class TS>
__device__ __forceinline__ void store_state4(const LightningDevParams& p, int32_t block, int64_t at, float v0, float v1,
                                             float v2, float v3) {
  if (block == 0) return;
  TS* dst = static_cast<TS*>(p.states.data) + block * p.states.block_stride + at;
  store(dst, v0), store(dst + 1, v1), store(dst + 2, v2), store(dst + 3, v3);
}

/// 2. Grid (ceil(D*D / 4 / 256), H, num_seqs). Each thread carries 4 state elements through the sequence's
/// blocks: S_b (state entering block b) -> sin[b] as bf16 hi / lo parts (kSplit; else one bf16 copy [nb, H, D, D]); S <- e^{-s m_b} S + KV_b. Final S -> state
/// pool. The next blocks' KV_b are loaded ahead (they do not depend on S), so the chain is bound by arithmetic.
/// "all" mode: the S after block b also goes to pool block plan.block_store[b] when nonzero (rounded as the final S).
template <class TS, bool kSplit>
__global__ void __launch_bounds__(kScanThreads) state_scan_kernel(LightningDevParams p, LightningPlanDev plan,
                                                              const float* __restrict__ kvb, bf16* __restrict__ sin) {
  constexpr int kAhead = 4;
  const int seq = blockIdx.z, h = blockIdx.y;
  const int64_t DD = static_cast<int64_t>(p.head_dim) * p.head_dim;
  const int64_t e = (static_cast<int64_t>(blockIdx.x) * kScanThreads + threadIdx.x) * 4;
  if (e >= DD) return;
  const int32_t sb = plan.state_indices[seq];
  if (sb == 0) return;
  TS* st = static_cast<TS*>(p.states.data) + sb * p.states.block_stride + h * DD + e;
  float S[4] = {0.f, 0.f, 0.f, 0.f};
  if (plan.num_computed[seq] > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) S[i] = load(st + i);
  }
  const float s = p.slopes[h];
  const int b0 = plan.seq_first_block[seq], b1 = plan.seq_first_block[seq + 1];
  auto at = [&](int b) { return (static_cast<int64_t>(b) * p.num_heads + h) * DD + e; };
  float4 ahead[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) ahead[i] = b0 + i < b1 ? *reinterpret_cast<const float4*>(kvb + at(b0 + i)) : float4{};
  for (int b = b0; b < b1; b += kAhead) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      if (b + i >= b1) break;
      const float4 kv = ahead[i];
      if (b + i + kAhead < b1) ahead[i] = *reinterpret_cast<const float4*>(kvb + at(b + i + kAhead));
      if constexpr (kSplit) {
        bf16* hi = sin + 2 * (static_cast<int64_t>(b + i) * p.num_heads + h) * DD + e;
        split4(S, hi, hi + DD);
      } else {
        bf16* dst = sin + (static_cast<int64_t>(b + i) * p.num_heads + h) * DD + e;
        reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(S[0], S[1]);
        reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(S[2], S[3]);
      }
      const float bd = decay(s, static_cast<double>(plan.blocks[3 * (b + i) + 1]));
      S[0] = bd * S[0] + kv.x;
      S[1] = bd * S[1] + kv.y;
      S[2] = bd * S[2] + kv.z;
      S[3] = bd * S[3] + kv.w;
      if (plan.block_store) store_state4<TS>(p, plan.block_store[b + i], h * DD + e, S[0], S[1], S[2], S[3]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) store(st + i, S[i]);
}

}  // namespace ssmserve::cuda::detail
