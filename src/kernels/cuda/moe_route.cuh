// Owns one token's MoE routing on one warp (route_token; route_token_shared with its slots in shared memory), the router kernel's (moe_route.cu) per-token arithmetic.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

namespace ssmserve::cuda::detail {

/// Where a lane's PER slots of one routing array live: registers (RegSlots, the router kernel) or shared memory
/// (SharedSlots: slot i of lane l at [l + 32 i], a block that must not spend the registers). The arithmetic is the
/// same either way.
template <int PER>
struct RegSlots {
  static constexpr int kUnroll = PER;  ///< the slot loops unrolled (register arrays need constant indices)
  float v[PER];
  __device__ __forceinline__ float& operator[](int i) { return v[i]; }
};
struct SharedSlots {
  static constexpr int kUnroll = 1;  ///< the slot loops kept rolled: few registers
  float* base;  ///< [32 * PER] floats of the warp's shared memory
  __device__ __forceinline__ float& operator[](int i) { return base[(threadIdx.x & 31) + 32 * i]; }
};

/// Routes one token on the calling warp (every lane must call it), in cpu::moe_route's arithmetic order: l [E] its
/// router logits, ids / wts [top_k] its picks (descending choice score, ties to the lower id) and weights. PER: experts
/// per lane, E <= 32 * PER (any such PER gives the same bits: a lane's slots past E only ever add +0 or compare as
/// -inf). choice: the warp's 32 * PER floats of shared memory (grouped choice).
template <int PER, class Slots>
__device__ __forceinline__ void route_token_in(const float* l, int E, int top_k, const MoeRouteParams& r, int32_t* ids,
                                               float* wts, float* choice, Slots& sc, Slots& ch) {
  const int lane = threadIdx.x & 31;
  constexpr int kU = Slots::kUnroll;
  if (r.sigmoid) {
#pragma unroll kU
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      sc[i] = e < E ? 1.0f / (1.0f + expf(-l[e])) : 0.0f;
      ch[i] = e < E ? sc[i] + (r.correction_bias ? r.correction_bias[e] : 0.0f) : -INFINITY;
    }
    if (r.n_group > 1) {  // keep the topk_group groups whose two best choice scores sum highest (ties: lower group)
      const int per = E / r.n_group;
#pragma unroll kU
      for (int i = 0; i < PER; ++i)
        if (lane + 32 * i < E) choice[lane + 32 * i] = ch[i];
      __syncwarp();
      float gs = -INFINITY;
      if (lane < r.n_group) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = lane * per; e < (lane + 1) * per; ++e) {
          const float c = choice[e];
          if (c > a) b = a, a = c;
          else if (c > b) b = c;
        }
        gs = a + b;
      }
      bool keep = false;
      for (int k = 0; k < r.topk_group; ++k) {
        float best = gs;
        int bg = lane < r.n_group ? lane : INT32_MAX;
        for (int o = 16; o > 0; o >>= 1) {
          const float ob = __shfl_xor_sync(0xffffffffu, best, o);
          const int og = __shfl_xor_sync(0xffffffffu, bg, o);
          if (ob > best || (ob == best && og < bg)) best = ob, bg = og;
        }
        if (lane == bg) keep = true, gs = -INFINITY;
      }
      const unsigned kept = __ballot_sync(0xffffffffu, keep);
#pragma unroll kU
      for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        if (e < E && !((kept >> (e / per)) & 1u)) ch[i] = -INFINITY;
      }
    }
  } else {
    float m = -INFINITY;
#pragma unroll kU
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      sc[i] = e < E ? l[e] : -INFINITY;
      m = fmaxf(m, sc[i]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
#pragma unroll kU
    for (int i = 0; i < PER; ++i) {
      sc[i] = lane + 32 * i < E ? expf(sc[i] - m) : 0.0f;
      sum += sc[i];
    }
    sum = warp_sum(sum);
#pragma unroll kU
    for (int i = 0; i < PER; ++i) {
      sc[i] = sc[i] / sum;
      ch[i] = lane + 32 * i < E ? sc[i] : -INFINITY;
    }
  }
  float pk = 0.0f;  // lane k < top_k: the k-th pick's score and expert
  int ek = 0;
  float tot = 0.0f;
  for (int k = 0; k < top_k; ++k) {
    // Arg max (choice score descending, ties to the lower id) over the remaining candidates.
    float best = -INFINITY, bs = 0.0f;
    int be = INT32_MAX;
#pragma unroll kU
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      if (e < E && (ch[i] > best || (ch[i] == best && e < be))) best = ch[i], be = e, bs = sc[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o), os = __shfl_xor_sync(0xffffffffu, bs, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ob > best || (ob == best && oe < be)) best = ob, be = oe, bs = os;
    }
#pragma unroll kU
    for (int i = 0; i < PER; ++i)
      if (lane + 32 * i == be) ch[i] = -INFINITY;
    if (lane == k) pk = bs, ek = be;  // the butterfly left every lane the same pick
    tot += bs;
  }
  const float denom = !r.renormalize ? 1.0f : r.sigmoid ? tot + 1e-20f : tot;
  if (lane < top_k) {
    ids[lane] = ek;
    wts[lane] = pk / denom * r.routed_scaling_factor;
  }
}

/// route_token_in with the slots in registers.
template <int PER>
__device__ __forceinline__ void route_token(const float* l, int E, int top_k, const MoeRouteParams& r, int32_t* ids,
                                            float* wts, float* choice) {
  RegSlots<PER> sc, ch;  // scores (the weights) and choice scores (-inf: not a candidate)
  route_token_in<PER>(l, E, top_k, r, ids, wts, choice, sc, ch);
}

/// route_token_in with the slots in shared memory: sc_s, ch_s [32 * PER] floats each (the calling warp's own).
template <int PER>
__device__ __forceinline__ void route_token_shared(const float* l, int E, int top_k, const MoeRouteParams& r,
                                                   int32_t* ids, float* wts, float* choice, float* sc_s, float* ch_s) {
  SharedSlots sc{sc_s}, ch{ch_s};
  route_token_in<PER>(l, E, top_k, r, ids, wts, choice, sc, ch);
}

}  // namespace ssmserve::cuda::detail
