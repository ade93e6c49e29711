// Owns the GPU greedy selection (see sampling.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/top_logprobs.cuh"

#include <cfloat>

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) greedy_kernel(const float* __restrict__ logits, int64_t ld, int V,
                                                          int num_top, GreedyRow* __restrict__ out) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  __shared__ double sd[kThreads / 32];
  __shared__ int bad_any;
  pdl_wait();
  pdl_launch_dependents();
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * ld;
  if (threadIdx.x == 0) bad_any = 0;
  __syncthreads();
  // 1. Argmax (lowest id on ties); NaN / +inf flagged.
  float bv = -INFINITY;
  int bi = INT_MAX;
  bool bad = false;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float x = l[i];
    if (isnan(x) || x == INFINITY) bad = true;
    else if (logit_before(x, i, bv, bi)) bv = x, bi = i;
  }
  if (bad) atomicExch(&bad_any, 1);
  block_best<kThreads>(bv, bi, sv, si);
  GreedyRow& r = out[blockIdx.x];
  if (bad_any || bv == -INFINITY) {
    if (threadIdx.x == 0) r.token = -1, r.logprob = NAN;
    return;
  }
  // 2. log-sum-exp: float exp, double accumulation.
  double acc = 0.0;
  for (int i = threadIdx.x; i < V; i += kThreads) acc += static_cast<double>(expf(l[i] - bv));
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) sd[warp] = acc;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) total += sd[w];
  const double lse = static_cast<double>(bv) + log(total);
  if (threadIdx.x == 0) {
    r.token = bi;
    r.logprob = static_cast<float>(static_cast<double>(bv) - lse);
  }
  // 3. Top num_top.
  top_logprobs<kThreads>(l, V, bv, bi, lse, num_top, sv, si, r);
}

}  // namespace

cudaError_t greedy_sample(const float* logits, int64_t ld, int n, int64_t V, int num_top, GreedyRow* out,
                          cudaStream_t stream) {
  if (n < 0 || V < 1 || V > 2147483647 || ld < V || num_top < 0 || num_top > kMaxDeviceTopLogprobs ||
      n > 2147483647 || (n > 0 && (!logits || !out)))
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int k = static_cast<int>(num_top < V ? num_top : V);
  return launch_pdl(true, greedy_kernel, dim3(static_cast<unsigned>(n)), dim3(kThreads), 0, stream, logits, ld,
                    static_cast<int>(V), k, out);
}

}  // namespace ssmserve::cuda
