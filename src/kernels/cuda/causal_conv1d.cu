// Owns the GPU causal conv1d (see causal_conv1d.h).
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/common.cuh"

namespace ssmserve::cuda {
namespace {
using namespace detail;

constexpr int kThreads = 128;     // channels per block
constexpr int kTokensPerThread = 32;
constexpr int kMaxWidth = 8;

/// Sequence of packed token t: the s with qsl[s] <= t < qsl[s+1] (binary search; qsl non-decreasing).
__device__ __forceinline__ int seq_of(const int32_t* qsl, int num_seqs, int64_t t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (qsl[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/// Outputs of tokens [blockIdx.x * kTokensPerThread, +kTokensPerThread), channel blockIdx.y * kThreads + tid.
/// Per run of tokens of one sequence, the previous K-1 inputs are kept in a register window (right-aligned in
/// kMaxWidth - 1 slots, the unused left slots holding 0 with weight 0, so the fma chain equals the CPU's: bias,
/// then taps oldest to newest), so each input is read once.
template <class TS>
__global__ void __launch_bounds__(kThreads) conv_fwd_kernel(const float* __restrict__ x, int64_t x_stride,
                                                            float* __restrict__ out, int64_t out_stride,
                                                            __nv_bfloat16* __restrict__ out16, int64_t out16_stride,
                                                            ConvParams p,
                                                            const int32_t* __restrict__ qsl,
                                                            const int32_t* __restrict__ state_indices,
                                                            const uint8_t* __restrict__ has_init, int num_seqs,
                                                            int64_t num_tokens) {
  constexpr int kWin = kMaxWidth - 1;
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  if (c >= p.dim) return;
  const int W = p.width, S = W - 1, off = kWin - S;  // window slot i holds tap i - off (slots < off unused)
  const int64_t D = p.dim;
  const int64_t tb = static_cast<int64_t>(blockIdx.x) * kTokensPerThread;
  const int64_t te = min(tb + kTokensPerThread, num_tokens);
  if (tb >= te) return;
  float wa[kWin];
#pragma unroll
  for (int i = 0; i < kWin; ++i) wa[i] = i >= off ? p.weight[c * W + i - off] : 0.0f;
  const float wlast = p.weight[c * W + S];
  const float bias = p.bias ? p.bias[c] : 0.0f;
  int s = seq_of(qsl, num_seqs, tb);
  for (int64_t t = tb; t < te;) {
    while (s + 1 < num_seqs && qsl[s + 1] <= t) ++s;
    const int64_t t0 = qsl[s], seg_end = min(te, static_cast<int64_t>(qsl[s + 1]));
    const int32_t block = state_indices[s];
    if (block == 0) {
      t = seg_end;
      continue;
    }
    const bool init = has_init[s] != 0;
    const TS* state = static_cast<const TS*>(p.conv_states.data) + block * p.conv_states.block_stride;
    float win[kWin];
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int64_t j = (t - t0) - kWin + i;  // input position of slot i, relative to the sequence start
      float v = 0.0f;
      if (i >= off) v = j >= 0 ? x[(t0 + j) * x_stride + c] : (init ? load(state + (S + j) * D + c) : 0.0f);
      win[i] = v;
    }
#pragma unroll 4
    for (; t < seg_end; ++t) {
      const float xv = x[t * x_stride + c];
      float acc = bias;
#pragma unroll
      for (int i = 0; i < kWin; ++i) acc = fmaf(wa[i], win[i], acc);
      acc = fmaf(wlast, xv, acc);
      const float o = p.apply_silu ? silu(acc) : acc;
      if (out) out[t * out_stride + c] = o;
      if (out16) out16[t * out16_stride + c] = __float2bfloat16_rn(o);
#pragma unroll
      for (int i = 0; i + 1 < kWin; ++i) win[i] = win[i + 1];
      win[kWin - 1] = xv;
    }
  }
}

/// conv_fwd_kernel with four consecutive channels per thread (KernelTuning::prefill_row_kernels): the same per-channel
/// arithmetic (window, fma chain, activation, stores), with the token's four inputs read as one 16-byte load and the
/// outputs stored as 16 (fp32) / 8 (bf16) bytes, so each warp moves 512 bytes per token instead of 128 (the old form
/// reached about half the H200's bandwidth on a 32k-token Gated DeltaNet prefill). Grid (ceil(T / kTokensPerThread),
/// ceil(dim / (4 kThreads))); dim, the row strides and the pointers as conv_fwd_vec_ok checks.
template <class TS>
__global__ void __launch_bounds__(kThreads) conv_fwd_vec_kernel(const float* __restrict__ x, int64_t x_stride,
                                                                float* __restrict__ out, int64_t out_stride,
                                                                __nv_bfloat16* __restrict__ out16, int64_t out16_stride,
                                                                ConvParams p, const int32_t* __restrict__ qsl,
                                                                const int32_t* __restrict__ state_indices,
                                                                const uint8_t* __restrict__ has_init, int num_seqs,
                                                                int64_t num_tokens) {
  constexpr int kWin = kMaxWidth - 1;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x) * 4;
  if (c0 >= p.dim) return;
  const int W = p.width, S = W - 1, off = kWin - S;  // window slot i holds tap i - off (slots < off unused)
  const int64_t D = p.dim;
  const int64_t tb = static_cast<int64_t>(blockIdx.x) * kTokensPerThread;
  const int64_t te = min(tb + kTokensPerThread, num_tokens);
  if (tb >= te) return;
  float wa[4][kWin], wlast[4], bias[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int i = 0; i < kWin; ++i) wa[q][i] = i >= off ? p.weight[(c0 + q) * W + i - off] : 0.0f;
    wlast[q] = p.weight[(c0 + q) * W + S];
    bias[q] = p.bias ? p.bias[c0 + q] : 0.0f;
  }
  int s = seq_of(qsl, num_seqs, tb);
  for (int64_t t = tb; t < te;) {
    while (s + 1 < num_seqs && qsl[s + 1] <= t) ++s;
    const int64_t t0 = qsl[s], seg_end = min(te, static_cast<int64_t>(qsl[s + 1]));
    const int32_t block = state_indices[s];
    if (block == 0) {
      t = seg_end;
      continue;
    }
    const bool init = has_init[s] != 0;
    const TS* state = static_cast<const TS*>(p.conv_states.data) + block * p.conv_states.block_stride;
    float win[4][kWin];
#pragma unroll
    for (int i = 0; i < kWin; ++i) {
      const int64_t j = (t - t0) - kWin + i;  // input position of slot i, relative to the sequence start
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float v = 0.0f;
        if (i >= off) v = j >= 0 ? x[(t0 + j) * x_stride + c0 + q] : (init ? load(state + (S + j) * D + c0 + q) : 0.0f);
        win[q][i] = v;
      }
    }
#pragma unroll 2
    for (; t < seg_end; ++t) {
      const float4 x4 = *reinterpret_cast<const float4*>(x + t * x_stride + c0);
      const float xv[4] = {x4.x, x4.y, x4.z, x4.w};
      float o[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float acc = bias[q];
#pragma unroll
        for (int i = 0; i < kWin; ++i) acc = fmaf(wa[q][i], win[q][i], acc);
        acc = fmaf(wlast[q], xv[q], acc);
        o[q] = p.apply_silu ? silu(acc) : acc;
#pragma unroll
        for (int i = 0; i + 1 < kWin; ++i) win[q][i] = win[q][i + 1];
        win[q][kWin - 1] = xv[q];
      }
      if (out) *reinterpret_cast<float4*>(out + t * out_stride + c0) = make_float4(o[0], o[1], o[2], o[3]);
      if (out16) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(o[0], o[1]), hi = __floats2bfloat162_rn(o[2], o[3]);
        uint2 v;
        v.x = *reinterpret_cast<const uint32_t*>(&lo);
        v.y = *reinterpret_cast<const uint32_t*>(&hi);
        *reinterpret_cast<uint2*>(out16 + t * out16_stride + c0) = v;
      }
    }
  }
}

/// Whether conv_fwd_vec_kernel applies: dim and every row stride multiples of 4, x / out 16-byte and out16 8-byte
/// aligned.
bool conv_fwd_vec_ok(const float* x, int64_t x_stride, const float* out, int64_t out_stride, const void* out16,
                     int64_t out16_stride, int64_t dim) {
  const auto al = [](const void* q, uintptr_t a) { return reinterpret_cast<uintptr_t>(q) % a == 0; };
  return dim % 4 == 0 && x_stride % 4 == 0 && al(x, 16) && (!out || (out_stride % 4 == 0 && al(out, 16))) &&
         (!out16 || (out16_stride % 4 == 0 && al(out16, 8)));
}

/// New window of sequence blockIdx.x, channel blockIdx.y * kThreads + tid: the last S inputs of
/// (old window ++ x). Runs after conv_fwd_kernel (same stream), which reads the old window.
template <class TS>
__global__ void conv_state_writeback_kernel(const float* __restrict__ x, int64_t x_stride, ConvParams p,
                                            const int32_t* __restrict__ qsl,
                                            const int32_t* __restrict__ state_indices,
                                            const uint8_t* __restrict__ has_init) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const int s = blockIdx.x;
  if (c >= p.dim) return;
  const int32_t block = state_indices[s];
  if (block == 0) return;
  const int S = p.width - 1;
  const int64_t D = p.dim, t0 = qsl[s], L = qsl[s + 1] - t0;
  const bool init = has_init[s] != 0;
  TS* state = static_cast<TS*>(p.conv_states.data) + block * p.conv_states.block_stride;
  float win[kMaxWidth];
#pragma unroll
  for (int i = 0; i < kMaxWidth - 1; ++i) {
    if (i >= S) break;
    const int64_t j = L - S + i;  // position in x coordinates
    win[i] = j >= 0 ? x[(t0 + j) * x_stride + c] : (init ? load(state + (S + j) * D + c) : 0.0f);
  }
#pragma unroll
  for (int i = 0; i < kMaxWidth - 1; ++i) {
    if (i >= S) break;
    store(state + i * D + c, win[i]);
  }
}

template <class TS>
__global__ void conv_update_kernel(const float* __restrict__ x, int64_t x_stride, float* __restrict__ out,
                                   int64_t out_stride, ConvParams p, const int32_t* __restrict__ state_indices) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * kThreads + threadIdx.x;
  const int b = blockIdx.x;
  if (c >= p.dim) return;
  const int32_t block = state_indices[b];
  if (block == 0) return;
  const int W = p.width, S = W - 1;
  const int64_t D = p.dim;
  TS* state = static_cast<TS*>(p.conv_states.data) + block * p.conv_states.block_stride;
  const float xv = x[b * x_stride + c];
  float acc = p.bias ? p.bias[c] : 0.0f;
  float win[kMaxWidth];
#pragma unroll
  for (int k = 0; k < kMaxWidth - 1; ++k) {
    if (k >= S) break;
    win[k] = load(state + k * D + c);
    acc = fmaf(p.weight[c * W + k], win[k], acc);
  }
  acc = fmaf(p.weight[c * W + S], xv, acc);
#pragma unroll
  for (int k = 0; k < kMaxWidth - 1; ++k) {
    if (k >= S) break;
    store(state + k * D + c, k + 1 < S ? win[k + 1] : xv);
  }
  out[b * out_stride + c] = p.apply_silu ? silu(acc) : acc;
}

bool bad_params(const ConvParams& p) {
  return p.dim < 1 || p.width < 1 || p.width > kMaxWidth || p.weight == nullptr ||
         (p.width > 1 && p.conv_states.data == nullptr) || p.dim > 65535LL * kThreads;
}

}  // namespace

cudaError_t causal_conv1d_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                              const int32_t* query_start_loc, const int32_t* state_indices,
                              const uint8_t* has_initial_states, int num_seqs, int64_t num_tokens,
                              cudaStream_t stream) {
  return causal_conv1d_fwd_dual(x, x_stride, out, out_stride, nullptr, 0, p, query_start_loc, state_indices,
                                has_initial_states, num_seqs, num_tokens, stream);
}

cudaError_t causal_conv1d_fwd_dual(const float* x, int64_t x_stride, float* out, int64_t out_stride, void* out_bf16,
                                   int64_t out_bf16_stride, const ConvParams& p, const int32_t* query_start_loc,
                                   const int32_t* state_indices, const uint8_t* has_initial_states, int num_seqs,
                                   int64_t num_tokens, cudaStream_t stream) {
  if (bad_params(p) || x_stride < p.dim || (out && out_stride < p.dim) || (!out && !out_bf16) || num_seqs < 0 ||
      num_tokens < 0 || num_seqs > 65535 || (out_bf16 && out_bf16_stride < p.dim))
    return cudaErrorInvalidValue;
  if (num_seqs == 0 || num_tokens == 0) return cudaSuccess;
  const unsigned ctiles = ceil_div(p.dim, kThreads);
  return visit_dtype(p.conv_states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    if (kernel_tuning().prefill_row_kernels &&
        conv_fwd_vec_ok(x, x_stride, out, out_stride, out_bf16, out_bf16_stride, p.dim))
      conv_fwd_vec_kernel<TS><<<dim3(ceil_div(num_tokens, kTokensPerThread), ceil_div(p.dim, 4 * kThreads)), kThreads,
                                0, stream>>>(x, x_stride, out, out_stride, static_cast<__nv_bfloat16*>(out_bf16),
                                             out_bf16_stride, p, query_start_loc, state_indices, has_initial_states,
                                             num_seqs, num_tokens);
    else
      conv_fwd_kernel<TS><<<dim3(ceil_div(num_tokens, kTokensPerThread), ctiles), kThreads, 0, stream>>>(
          x, x_stride, out, out_stride, static_cast<__nv_bfloat16*>(out_bf16), out_bf16_stride, p, query_start_loc,
          state_indices, has_initial_states, num_seqs, num_tokens);
    if (const cudaError_t e = launch_status(); e != cudaSuccess) return e;
    if (p.width > 1)
      conv_state_writeback_kernel<TS><<<dim3(static_cast<unsigned>(num_seqs), ctiles), kThreads, 0, stream>>>(
          x, x_stride, p, query_start_loc, state_indices, has_initial_states);
    return launch_status();
  });
}

cudaError_t causal_conv1d_update(const float* x, int64_t x_stride, float* out, int64_t out_stride,
                                 const ConvParams& p, const int32_t* state_indices, int batch, cudaStream_t stream) {
  if (bad_params(p) || x_stride < p.dim || out_stride < p.dim || batch < 0) return cudaErrorInvalidValue;
  if (batch == 0) return cudaSuccess;
  return visit_dtype(p.conv_states.dtype, [&](auto tag) {
    using TS = decltype(tag);
    conv_update_kernel<TS><<<dim3(static_cast<unsigned>(batch), ceil_div(p.dim, kThreads)), kThreads, 0, stream>>>(
        x, x_stride, out, out_stride, p, state_indices);
    return launch_status();
  });
}

}  // namespace ssmserve::cuda
