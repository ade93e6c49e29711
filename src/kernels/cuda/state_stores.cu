// Owns the GPU conv-window stores of prefix caching's "all" mode (see state_stores.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/state_stores.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 128;  // channels per block

/// Grid (stores, ceil(dim / 128)): store blockIdx.x, channel blockIdx.y * 128 + tid.
template <class TS>
__global__ void __launch_bounds__(kThreads) conv_store_kernel(const float* __restrict__ x, int64_t x_stride, int64_t dim,
                                                              int width, StateView conv_states,
                                                              const int32_t* __restrict__ qsl,
                                                              const int32_t* __restrict__ state_indices,
                                                              const uint8_t* __restrict__ has_init, DevStateStores st) {
  const int i = blockIdx.x;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= dim) return;
  const int r = st.row[i];
  const int32_t src_block = state_indices[r], dst_block = st.block[i];
  if (src_block == 0 || dst_block == 0) return;
  const int S = width - 1;
  const int64_t t0 = qsl[r], o = st.offset[i];
  const bool init = has_init[r] != 0;
  const TS* src = static_cast<const TS*>(conv_states.data) + src_block * conv_states.block_stride;
  TS* dst = static_cast<TS*>(conv_states.data) + dst_block * conv_states.block_stride;
  for (int k = 0; k < S; ++k) {
    const int64_t j = o - S + k;  // row-relative input position of window slot k
    float v;
    if (j >= 0) v = x[(t0 + j) * x_stride + c];
    else v = init ? load(src + (S + j) * dim + c) : 0.0f;
    store(dst + k * dim + c, v);
  }
}

}  // namespace

cudaError_t conv_store_windows(const float* x, int64_t x_stride, int64_t dim, int width, const StateView& conv_states,
                               const int32_t* query_start_loc, const int32_t* state_indices,
                               const uint8_t* has_initial_states, const DevStateStores& stores, cudaStream_t stream) {
  if (width < 1 || width > 8 || dim < 1) return cudaErrorInvalidValue;
  if (stores.num <= 0 || width == 1) return cudaSuccess;
  if (!x || x_stride < dim || !conv_states.data || !query_start_loc || !state_indices || !has_initial_states ||
      !stores.offset || !stores.block || !stores.row || stores.num > 2147483647)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(stores.num), static_cast<unsigned>(ceil_div(dim, kThreads)));
  return visit_dtype(conv_states.dtype, [&](auto tag) {
    conv_store_kernel<decltype(tag)><<<grid, kThreads, 0, stream>>>(x, x_stride, dim, width, conv_states,
                                                                   query_start_loc, state_indices, has_initial_states,
                                                                   stores);
    return launch_status();
  });
}

}  // namespace ssmserve::cuda
