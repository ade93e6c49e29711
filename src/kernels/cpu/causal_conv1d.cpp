// Owns the CPU causal conv1d (see causal_conv1d.h).
#include "kernels/cpu/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

/// Varlen prefill with the window stored as T (float, bf16_t, f16_t).
template <class T>
void conv_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
              std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
              std::span<const uint8_t> has_initial_states) {
  const int64_t D = p.dim;
  const int W = p.width, S = W - 1;
  const int64_t num_seqs = static_cast<int64_t>(state_indices.size());
  std::vector<float> window(static_cast<size_t>(S * D));
  // Taps transposed to [W, D] so the channel loop vectorizes; the arithmetic per channel is unchanged.
  thread_local std::vector<float> tl_taps;
  std::vector<float>& taps = tl_taps;
  taps.resize(static_cast<size_t>(W * D));
  for (int64_t c = 0; c < D; ++c)
    for (int k = 0; k < W; ++k) taps[k * D + c] = p.weight[c * W + k];
  const std::vector<float> zeros(static_cast<size_t>(D), 0.0f);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t block = state_indices[s];
    if (block == 0) continue;
    const int64_t t0 = query_start_loc[s], L = query_start_loc[s + 1] - t0;
    T* state = p.conv_states.block<T>(block);  // [S, D]
    const bool init = has_initial_states[s] != 0;
    // The old window widened to fp32 (exact), or zeros.
    for (int64_t i = 0; i < S * D; ++i) window[i] = init ? load_f32(state[i]) : 0.0f;
    // 1. Outputs. Input position j in [-S, L): j < 0 reads the window, j >= 0 reads x. Per channel:
    //    acc = bias, then acc = fma(w[c][k], in[j], acc) for k = 0..W-1, then SiLU: the same chain as conv_update.
    const float* wt = taps.data();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < L; ++t) {  // whole rows: contiguous, prefetch-friendly
      const float* src[kMaxConvWidth];
      float* o = out + (t0 + t) * out_stride;
      for (int k = 0; k < W; ++k) {
        const int64_t j = t - S + k;
        src[k] = j >= 0 ? x + (t0 + j) * x_stride : window.data() + (S + j) * D;
      }
      if (p.bias) std::copy(p.bias, p.bias + D, o);
      else std::fill(o, o + D, 0.0f);
      for (int k = 0; k < W; ++k) {  // the chain per channel, one tap at a time across the row
        const float* wk = wt + k * D;
        const float* sk = src[k];
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) o[c] = std::fma(wk[c], sk[c], o[c]);
      }
      if (p.apply_silu) {
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) o[c] = silu_ps(o[c]);
      }
    }
    // 2. New window: the last S inputs of (old window ++ x), gathered in fp32 (old entries widen exactly and
    //    round back to themselves), then stored.
    for (int i = 0; i < S; ++i) {
      const int64_t j = L - S + i;  // position in x coordinates
      float* dst = window.data() + i * D;
      if (j >= 0) std::copy_n(x + (t0 + j) * x_stride, D, dst);
      else std::copy_n(window.data() + (S + j) * D, D, dst);  // rows i < S - L only: not yet overwritten
    }
    for (int64_t i = 0; i < S * D; ++i) store_f32(state[i], window[i]);
  }
}

/// One-token decode update of one token, channels [c0, c1), with the window stored as T: reads the window of block
/// `src`, writes the shifted window into block `dst` (src == dst: in place, as a plain decode step).
template <class T>
void conv_update_row(const float* xb, float* ob, const ConvParams& p, int32_t src, int32_t dst, int64_t c0, int64_t c1) {
  const int64_t D = p.dim;
  const int W = p.width, S = W - 1;
  const T* in = p.conv_states.block<T>(src);  // [S, D]
  T* state = p.conv_states.block<T>(dst);     // [S, D]
  for (int64_t c = c0; c < c1; ++c) {
    float acc = p.bias ? p.bias[c] : 0.0f;
    for (int k = 0; k < S; ++k) acc = std::fma(p.weight[c * W + k], load_f32(in[k * D + c]), acc);
    acc = std::fma(p.weight[c * W + S], xb[c], acc);
    for (int k = 0; k + 1 < S; ++k) state[k * D + c] = in[(k + 1) * D + c];
    if (S > 0) store_f32(state[(S - 1) * D + c], xb[c]);
    ob[c] = acc;
  }
  if (p.apply_silu) {
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) ob[c] = silu_ps(ob[c]);
  }
}

/// Row b's tokens one after another (DecodeRows), channels [c0, c1).
template <class T>
void conv_update_tokens(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                        const DecodeRows& rows, int64_t b, int64_t c0, int64_t c1) {
  if (rows.is_null(b)) return;
  for (int j = 0; j < rows.num_tokens(b); ++j) {
    const int64_t t = rows.token_row(b, j);
    conv_update_row<T>(x + t * x_stride, out + t * out_stride, p, rows.src_block(b, j), rows.dst_block(b, j), c0, c1);
  }
}

/// Decode update (DecodeRows) with the window stored as T.
template <class T>
void conv_update(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                 const DecodeRows& rows) {
  const int64_t D = p.dim;
  const int64_t batch = rows.num_rows();
#pragma omp parallel for schedule(static) if (batch * D > 4096)
  for (int64_t b = 0; b < batch; ++b) conv_update_tokens<T>(x, x_stride, out, out_stride, p, rows, b, 0, D);
}

}  // namespace

void causal_conv1d_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                       std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                       std::span<const uint8_t> has_initial_states) {
  SSM_CHECK(p.width >= 1 && p.width <= kMaxConvWidth, "causal_conv1d_fwd: width {} not in [1, {}]", p.width,
            kMaxConvWidth);
  visit_state_dtype(p.conv_states.dtype, [&](auto tag) {
    conv_fwd<decltype(tag)>(x, x_stride, out, out_stride, p, query_start_loc, state_indices, has_initial_states);
  });
}

void causal_conv1d_update(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                          const DecodeRows& rows) {
  visit_state_dtype(p.conv_states.dtype, [&](auto tag) { conv_update<decltype(tag)>(x, x_stride, out, out_stride, p, rows); });
}

void causal_conv1d_update_channels(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                                   const DecodeRows& rows, int64_t c0, int64_t c1) {
  if (c0 >= c1) return;
  visit_state_dtype(p.conv_states.dtype, [&](auto tag) {
    for (int64_t b = 0; b < rows.num_rows(); ++b) conv_update_tokens<decltype(tag)>(x, x_stride, out, out_stride, p, rows, b, c0, c1);
  });
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, causal_conv1d_fwd, (const float* x, int64_t x_stride, float* out, int64_t out_stride,
                 const ConvParams& p, std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                 std::span<const uint8_t> has_initial_states),
                 (x, x_stride, out, out_stride, p, query_start_loc, state_indices, has_initial_states))
SSM_CPU_DISPATCH(void, causal_conv1d_update, (const float* x, int64_t x_stride, float* out, int64_t out_stride,
                 const ConvParams& p, const DecodeRows& rows), (x, x_stride, out, out_stride, p, rows))
SSM_CPU_DISPATCH(void, causal_conv1d_update_channels, (const float* x, int64_t x_stride, float* out, int64_t out_stride,
                 const ConvParams& p, const DecodeRows& rows, int64_t c0, int64_t c1),
                 (x, x_stride, out, out_stride, p, rows, c0, c1))
