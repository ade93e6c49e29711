// Owns the device order of a logits row, (value desc, id asc) as engine/sampler.cpp ranks tokens: the block-wide
// best and the top-k log-probabilities walk, shared by greedy_sample (sampling.cu) and sample_rows
// (sample_rows.cu). Each caller keeps its own log-sum-exp reduction.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/sampling.h"

namespace ssmserve::cuda::detail {

/// (value, id) ordered by value descending, then id ascending: a "before" b.
__device__ __forceinline__ bool logit_before(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

/// Block-wide best (value, id) by logit_before over a block of kThreads threads (a multiple of 32, at most 1024);
/// every thread gets it. sv / si: kThreads / 32 entries of shared memory.
template <int kThreads>
__device__ __forceinline__ void block_best(float& v, int& id, float* sv, int* si) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "block_best: kThreads");
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (logit_before(ov, oi, v, id)) v = ov, id = oi;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sv[warp] = v, si[warp] = id;
  __syncthreads();
  v = lane < kThreads / 32 ? sv[lane] : -INFINITY;
  id = lane < kThreads / 32 ? si[lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (logit_before(ov, oi, v, id)) v = ov, id = oi;
  }
}

/// The num_top (<= kMaxDeviceTopLogprobs) best entries of row l [V] fp32 with their log-probabilities v - lse:
/// (bv, bi) (the row's best) first, then repeatedly the best element strictly after the previous pick. Thread 0
/// writes r.top_ids[j] / r.top_logprobs[j]. Every thread of the kThreads-thread block calls it; sv / si as
/// block_best.
template <int kThreads>
__device__ __forceinline__ void top_logprobs(const float* __restrict__ l, int V, float bv, int bi, double lse,
                                             int num_top, float* sv, int* si, GreedyRow& r) {
  float pv = bv;
  int pi = bi;
  for (int j = 0; j < num_top; ++j) {
    float v = -INFINITY;
    int id = INT_MAX;
    if (j == 0) {
      v = bv, id = bi;
    } else {
      for (int i = threadIdx.x; i < V; i += kThreads) {
        const float x = l[i];
        if (logit_before(pv, pi, x, i) && logit_before(x, i, v, id)) v = x, id = i;
      }
      block_best<kThreads>(v, id, sv, si);
    }
    if (threadIdx.x == 0) r.top_ids[j] = id, r.top_logprobs[j] = static_cast<float>(static_cast<double>(v) - lse);
    pv = v, pi = id;
  }
}

}  // namespace ssmserve::cuda::detail
