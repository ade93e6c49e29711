// Owns one token's MoE routing on one warp (route_token), the router kernel's (moe_route.cu) per-token arithmetic.
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"

namespace ssmserve::cuda::detail {

/// Routes one token on the calling warp (every lane must call it), in cpu::moe_route's arithmetic order: l [E] its
/// router logits, ids / wts [top_k] its picks (descending choice score, ties to the lower id) and weights. PER: experts
/// per lane, E <= 32 * PER (any such PER gives the same bits: a lane's slots past E only ever add +0 or compare as
/// -inf). choice: the warp's 32 * PER floats of shared memory (grouped choice).
template <int PER>
__device__ __forceinline__ void route_token(const float* l, int E, int top_k, const MoeRouteParams& r, int32_t* ids,
                                            float* wts, float* choice) {
  const int lane = threadIdx.x & 31;
  float sc[PER], ch[PER];  // scores (the weights) and choice scores (-inf: not a candidate)
  if (r.sigmoid) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      sc[i] = e < E ? 1.0f / (1.0f + expf(-l[e])) : 0.0f;
      ch[i] = e < E ? sc[i] + (r.correction_bias ? r.correction_bias[e] : 0.0f) : -INFINITY;
    }
    if (r.n_group > 1) {  // keep the topk_group groups whose two best choice scores sum highest (ties: lower group)
      const int per = E / r.n_group;
#pragma unroll
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
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int e = lane + 32 * i;
        if (e < E && !((kept >> (e / per)) & 1u)) ch[i] = -INFINITY;
      }
    }
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      sc[i] = e < E ? l[e] : -INFINITY;
      m = fmaxf(m, sc[i]);
    }
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      sc[i] = lane + 32 * i < E ? expf(sc[i] - m) : 0.0f;
      sum += sc[i];
    }
    sum = warp_sum(sum);
#pragma unroll
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
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int e = lane + 32 * i;
      if (e < E && (ch[i] > best || (ch[i] == best && e < be))) best = ch[i], be = e, bs = sc[i];
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o), os = __shfl_xor_sync(0xffffffffu, bs, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (ob > best || (ob == best && oe < be)) best = ob, be = oe, bs = os;
    }
#pragma unroll
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

}  // namespace ssmserve::cuda::detail
