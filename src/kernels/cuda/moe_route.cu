// Owns the GPU MoE router (moe_route, moe.h): softmax or sigmoid scores, grouped choice (n_group / topk_group), top-k
// with ties to the lower id, renormalization and routed scaling, in cpu::moe_route's arithmetic order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

/// Grid (ceil(T / 8)), 8 warps: one warp per token (cpu::moe_route's arithmetic order). PER: experts per lane, E <=
/// 32 * PER (the launcher picks the fewest: a lane's slots past E only ever added +0 or compared as -inf, so every
/// PER gives the same bits; at PER 16 for E 64-128 the scans cost 7.9-8.1 us per decode step on the H200).
template <int PER>
__global__ void __launch_bounds__(256) route_kernel(const float* __restrict__ logits, int64_t T, int E, int top_k,
                                                   MoeRouteParams r, int32_t* __restrict__ ids, float* __restrict__ wts) {
  __shared__ float choice_s[8][32 * PER];
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (t >= T) return;
  const float* l = logits + t * E;
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
        if (lane + 32 * i < E) choice_s[warp][lane + 32 * i] = ch[i];
      __syncwarp();
      float gs = -INFINITY;
      if (lane < r.n_group) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = lane * per; e < (lane + 1) * per; ++e) {
          const float c = choice_s[warp][e];
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
    ids[t * top_k + lane] = ek;
    wts[t * top_k + lane] = pk / denom * r.routed_scaling_factor;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, int64_t T, int E, int top_k, int32_t* ids, float* weights,
                      cudaStream_t stream) {
  return moe_route(logits, T, E, top_k, MoeRouteParams{}, ids, weights, stream);
}

cudaError_t moe_route(const float* logits, int64_t T, int E, int top_k, const MoeRouteParams& r, int32_t* ids, float* weights,
                      cudaStream_t stream, bool pdl) {
  if (T < 0 || E < 1 || E > kMoeMaxExperts || top_k < 1 || top_k > kMoeMaxTopK || top_k > E || r.n_group < 1 || r.n_group > 32 ||
      E % r.n_group != 0 || r.topk_group < 1 || r.topk_group > r.n_group || (r.n_group > 1 && !r.sigmoid))
    return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  const dim3 grid(ceil_div(T, 8));
  if (E <= 64) return launch_pdl(pdl, route_kernel<2>, grid, dim3(256), 0, stream, logits, T, E, top_k, r, ids, weights);
  if (E <= 128) return launch_pdl(pdl, route_kernel<4>, grid, dim3(256), 0, stream, logits, T, E, top_k, r, ids, weights);
  if (E <= 256) return launch_pdl(pdl, route_kernel<8>, grid, dim3(256), 0, stream, logits, T, E, top_k, r, ids, weights);
  static_assert(kMoeMaxExperts == 32 * 16, "route_kernel<16> covers kMoeMaxExperts");
  return launch_pdl(pdl, route_kernel<16>, grid, dim3(256), 0, stream, logits, T, E, top_k, r, ids, weights);
}

}  // namespace ssmserve::cuda
