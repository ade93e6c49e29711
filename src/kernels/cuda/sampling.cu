// Owns the GPU greedy selection (see sampling.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/top_logprobs.cuh"

#include <cooperative_groups.h>

#include <cfloat>

namespace ssmserve::cuda {
namespace {
using namespace detail;
namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kCluster = 8;  // blocks per row (the portable cluster size)

/// One slice's result, in the block's shared memory (read by the cluster's first block).
struct SlicePart {
  float max;   // the slice's largest logit (-inf when empty or all -inf)
  int id;      // its lowest id
  double sum;  // sum of expf(l - max) over the slice (0 when max is -inf)
  int bad;     // a NaN or +inf in the slice
};

/// Cluster (kCluster blocks) per row: block c reduces slice c = [c S, min(V, (c + 1) S)), S = ceil(V / kCluster);
/// block 0 combines the slices in order (argmax by logit_before, total = sum_c sum_c * exp(max_c - best)) and, for
/// num_top > 0, walks the whole row for the top log-probabilities.
__global__ void __cluster_dims__(kCluster, 1, 1) __launch_bounds__(kThreads)
    greedy_kernel(const float* __restrict__ logits, int64_t ld, int V, int num_top, GreedyRow* __restrict__ out,
                  GreedyFeed feed) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ double sd[kThreads / 32];
  __shared__ int bad_any;
  __shared__ SlicePart part;
  pdl_wait();
  pdl_launch_dependents();
  const int c = static_cast<int>(blockIdx.x);
  const float* l = logits + static_cast<int64_t>(blockIdx.y) * ld;
  const int slice = (V + kCluster - 1) / kCluster, lo = min(V, c * slice), hi = min(V, lo + slice);
  if (threadIdx.x == 0) bad_any = 0;
  __syncthreads();
  // 1. The slice's argmax (lowest id on ties); NaN / +inf flagged.
  float bv = -INFINITY;
  int bi = INT_MAX;
  bool bad = false;
#pragma unroll 4
  for (int i = lo + threadIdx.x; i < hi; i += kThreads) {
    const float x = l[i];
    if (isnan(x) || x == INFINITY) bad = true;
    else if (logit_before(x, i, bv, bi)) bv = x, bi = i;
  }
  if (bad) atomicExch(&bad_any, 1);
  block_best<kThreads>(bv, bi, sv, si);
  // 2. The slice's sum of exp(l - bv): float exp, double accumulation in a fixed order.
  double acc = 0.0;
  if (bv != -INFINITY) {
#pragma unroll 4
    for (int i = lo + threadIdx.x; i < hi; i += kThreads) acc += static_cast<double>(expf(l[i] - bv));
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sd[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += sd[w];
    part = {bv, bi, total, bad_any};
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every slice's part is written
  if (c != 0) {
    cluster.sync();  // block 0 has read the parts: this block's shared memory may go
    return;
  }
  // 3. Block 0: combine the slices in order.
  __shared__ float best_v;
  __shared__ int best_i;
  __shared__ double lse_s;
  __shared__ int row_bad;
  if (threadIdx.x == 0) {
    SlicePart p[kCluster];
    for (int k = 0; k < kCluster; ++k) p[k] = *cluster.map_shared_rank(&part, k);
    float v = -INFINITY;
    int id = INT_MAX, anybad = 0;
    for (int k = 0; k < kCluster; ++k) {
      anybad |= p[k].bad;
      if (logit_before(p[k].max, p[k].id, v, id)) v = p[k].max, id = p[k].id;
    }
    double total = 0.0;
    if (v != -INFINITY)
      for (int k = 0; k < kCluster; ++k)
        if (p[k].max != -INFINITY) total += p[k].sum * exp(static_cast<double>(p[k].max) - static_cast<double>(v));
    best_v = v, best_i = id, row_bad = anybad || v == -INFINITY;
    lse_s = static_cast<double>(v) + log(total);
  }
  cluster.sync();  // the parts are read (the other blocks may exit)
  GreedyRow& r = out[blockIdx.y];
  if (feed.ids && threadIdx.x == 0) feed.ids[feed.rows[blockIdx.y]] = row_bad ? 0 : best_i;
  if (row_bad) {
    if (threadIdx.x == 0) r.token = -1, r.logprob = NAN;
    return;
  }
  if (threadIdx.x == 0) {
    r.token = best_i;
    r.logprob = static_cast<float>(static_cast<double>(best_v) - lse_s);
  }
  // 4. Top num_top over the whole row.
  top_logprobs<kThreads>(l, V, best_v, best_i, lse_s, num_top, sv, si, r);
}

}  // namespace

cudaError_t greedy_sample(const float* logits, int64_t ld, int n, int64_t V, int num_top, GreedyRow* out,
                          cudaStream_t stream, const GreedyFeed* feed) {
  if (n < 0 || V < 1 || V > 2147483647 || ld < V || num_top < 0 || num_top > kMaxDeviceTopLogprobs ||
      n > 2147483647 || (n > 0 && (!logits || !out)) || (feed && (!feed->rows || !feed->ids)))
    return cudaErrorInvalidValue;
  const GreedyFeed fd = feed ? *feed : GreedyFeed{};
  if (n == 0) return cudaSuccess;
  const int k = static_cast<int>(num_top < V ? num_top : V);
  constexpr int kMaxRowsPerLaunch = 65535;  // gridDim.y
  for (int r0 = 0; r0 < n; r0 += kMaxRowsPerLaunch) {
    const int rows = n - r0 < kMaxRowsPerLaunch ? n - r0 : kMaxRowsPerLaunch;
    if (const cudaError_t e = launch_pdl(true, greedy_kernel, dim3(kCluster, static_cast<unsigned>(rows)), dim3(kThreads),
                                         0, stream, logits + static_cast<int64_t>(r0) * ld, ld, static_cast<int>(V), k,
                                         out + r0, GreedyFeed{fd.rows ? fd.rows + r0 : nullptr, fd.ids});
        e != cudaSuccess)
      return e;
  }
  return cudaSuccess;
}

}  // namespace ssmserve::cuda
