// Owns the fused decode router (moe_router_route, moe.h): the router's fp32 GEMV and the routing in one launch, the
// last of its blocks to finish routing every token. Same bits as skinny_gemm_f32 followed by moe_route: the logits
// come from the same per-column arithmetic (f32_gemv.cuh) and the picks from the same per-token code (moe_route.cuh).
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/f32_gemv.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/pdl.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kWarps = 8;  // router columns (experts) per block, one per warp; the last block routes 8 tokens at most

/// Grid (ceil(E / 8)), 8 warps: warp w computes logits[:, n] for expert n = blockIdx.x * 8 + w (f32_dot_column,
/// skinny_gemm_f32's f32_gemv_kernel arithmetic); then the block that arrives last on `counter` routes token w on warp w
/// (route_token<PER>) and sets the counter back to 0.
template <int M, int PER>
__global__ void __launch_bounds__(32 * kWarps) router_route_kernel(const float* __restrict__ x, int64_t xs,
                                                                   const float* __restrict__ w, int64_t K, int E,
                                                                   int top_k, MoeRouteParams r, float* logits,
                                                                   int32_t* __restrict__ ids, float* __restrict__ wts,
                                                                   unsigned* counter) {
  __shared__ float choice_s[kWarps][32 * PER];
  __shared__ bool last;
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (n < E) {  // no early return: every thread reaches the barriers below
    float acc[M];
    f32_dot_column<M>(x, xs, w + n * K, K, acc);
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m) logits[m * E + n] = acc[m];
  }
  // Arrival: the last block sees every block's logits (each block's writes fenced before its arrival).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (warp < M) route_token<PER>(logits + warp * E, E, top_k, r, ids + warp * top_k, wts + warp * top_k, choice_s[warp]);
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch
}

template <int M>
cudaError_t launch_m(const float* x, int64_t xs, const float* w, int64_t K, int E, int top_k, const MoeRouteParams& r,
                     float* logits, int32_t* ids, float* wts, unsigned* counter, cudaStream_t stream, bool pdl) {
  const dim3 grid(ceil_div(E, kWarps)), block(32 * kWarps);
  if (E <= 64)
    return launch_pdl(pdl, router_route_kernel<M, 2>, grid, block, 0, stream, x, xs, w, K, E, top_k, r, logits, ids, wts, counter);
  if (E <= 128)
    return launch_pdl(pdl, router_route_kernel<M, 4>, grid, block, 0, stream, x, xs, w, K, E, top_k, r, logits, ids, wts, counter);
  if (E <= 256)
    return launch_pdl(pdl, router_route_kernel<M, 8>, grid, block, 0, stream, x, xs, w, K, E, top_k, r, logits, ids, wts, counter);
  return launch_pdl(pdl, router_route_kernel<M, 16>, grid, block, 0, stream, x, xs, w, K, E, top_k, r, logits, ids, wts, counter);
}

}  // namespace

bool moe_router_route_serves(const float* x, int64_t x_stride, int64_t T, const float* w_router, int64_t K,
                             const MoeDevWeights& w) {
  const GemmArgs g{T, w.num_experts, K, x, x_stride, w_router, K, DType::F32, nullptr, w.num_experts, DType::F32};
  return T >= 1 && T <= kSkinnyF32MaxM && T <= kWarps && w.num_experts >= 1 && w.num_experts <= kMoeMaxExperts &&
         w.top_k >= 1 && w.top_k <= std::min(w.num_experts, kMoeMaxTopK) && w.routing.n_group >= 1 &&
         w.routing.n_group <= 32 && w.num_experts % w.routing.n_group == 0 && w.routing.topk_group >= 1 &&
         w.routing.topk_group <= w.routing.n_group && (w.routing.n_group == 1 || w.routing.sigmoid) &&
         skinny_gemm_f32_serves(g);  // moe_route's conditions, and skinny_gemm_f32's
}

cudaError_t moe_router_route(const float* x, int64_t x_stride, int64_t T, const float* w_router, int64_t K,
                             const MoeDevWeights& w, float* logits, int32_t* ids, float* weights, unsigned* counter,
                             cudaStream_t stream, bool pdl) {
  if (!moe_router_route_serves(x, x_stride, T, w_router, K, w) || !logits || !ids || !weights || !counter)
    return cudaErrorInvalidValue;
  const int E = w.num_experts, k = w.top_k;
  const MoeRouteParams& r = w.routing;
  switch (T) {  // the row count is a template argument, as in skinny_gemm_f32
    case 1: return launch_m<1>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 2: return launch_m<2>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 3: return launch_m<3>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 4: return launch_m<4>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 5: return launch_m<5>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 6: return launch_m<6>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    case 7: return launch_m<7>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
    default: return launch_m<8>(x, x_stride, w_router, K, E, k, r, logits, ids, weights, counter, stream, pdl);
  }
}

}  // namespace ssmserve::cuda
