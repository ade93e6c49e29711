// Owns the GPU MoE router (moe_route, moe.h): softmax or sigmoid scores, grouped choice (n_group / topk_group), top-k
// with ties to the lower id, renormalization and routed scaling, in cpu::moe_route's arithmetic order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

/// Grid (ceil(T / 8)), 8 warps: one warp per token (route_token). PER: experts per lane, E <= 32 * PER (the
/// launcher picks the fewest: every PER gives the same bits; at PER 16 for E 64-128 the scans cost 7.9-8.1 us per
/// decode step on the H200).
template <int PER>
__global__ void __launch_bounds__(256) route_kernel(const float* __restrict__ logits, int64_t T, int E, int top_k,
                                                   MoeRouteParams r, int32_t* __restrict__ ids, float* __restrict__ wts) {
  __shared__ float choice_s[8][32 * PER];
  __shared__ float bias_s[32 * PER];
  // The correction bias is a constant: staged before the wait, while the router GEMV runs, so the routing after it
  // reads shared memory instead of an HBM line behind the next kernels' weight streams. The same values: the same bits.
  MoeRouteParams rs = r;
  if (r.correction_bias) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) bias_s[e] = r.correction_bias[e];
    rs.correction_bias = bias_s;
  }
  __syncthreads();
  pdl_wait();
  pdl_launch_dependents();
  const int warp = threadIdx.x / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * 8 + warp;
  if (t >= T) return;
  route_token<PER>(logits + t * E, E, top_k, rs, ids + t * top_k, wts + t * top_k, choice_s[warp]);
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
