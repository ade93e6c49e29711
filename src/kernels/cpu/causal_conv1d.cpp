// Owns the CPU causal conv1d (see causal_conv1d.h).
#include "kernels/cpu/causal_conv1d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/activations.h"

namespace ssmserve::cpu {
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
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t block = state_indices[s];
    if (block == 0) continue;
    const int64_t t0 = query_start_loc[s], L = query_start_loc[s + 1] - t0;
    T* state = p.conv_states.block<T>(block);  // [S, D]
    const bool init = has_initial_states[s] != 0;
    // 1. Outputs. Input position j in [-S, L): j < 0 reads the window (or zeros), j >= 0 reads x.
#pragma omp parallel for schedule(static)
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
      const int64_t c1 = std::min(D, c0 + 64);
      for (int64_t t = 0; t < L; ++t) {
        float* o = out + (t0 + t) * out_stride;
        for (int64_t c = c0; c < c1; ++c) {
          float acc = p.bias ? p.bias[c] : 0.0f;
          for (int k = 0; k < W; ++k) {
            const int64_t j = t - S + k;
            float v;
            if (j >= 0) v = x[(t0 + j) * x_stride + c];
            else v = init ? load_f32(state[(S + j) * D + c]) : 0.0f;
            acc = std::fma(p.weight[c * W + k], v, acc);
          }
          o[c] = p.apply_silu ? silu(acc) : acc;
        }
      }
    }
    // 2. New window: the last S inputs of (old window ++ x), gathered in fp32 (old entries widen exactly and
    //    round back to themselves), then stored.
    for (int i = 0; i < S; ++i) {
      const int64_t j = L - S + i;  // position in x coordinates
      float* dst = window.data() + i * D;
      if (j >= 0) std::copy_n(x + (t0 + j) * x_stride, D, dst);
      else if (init) for (int64_t c = 0; c < D; ++c) dst[c] = load_f32(state[(S + j) * D + c]);
      else std::fill_n(dst, D, 0.0f);
    }
    for (int64_t i = 0; i < S * D; ++i) store_f32(state[i], window[i]);
  }
}

/// One-token decode update with the window stored as T.
template <class T>
void conv_update(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                 std::span<const int32_t> state_indices) {
  const int64_t D = p.dim;
  const int W = p.width, S = W - 1;
  const int64_t batch = static_cast<int64_t>(state_indices.size());
#pragma omp parallel for schedule(static) if (batch * D > 4096)
  for (int64_t b = 0; b < batch; ++b) {
    const int32_t block = state_indices[b];
    if (block == 0) continue;
    T* state = p.conv_states.block<T>(block);  // [S, D]
    const float* xb = x + b * x_stride;
    float* ob = out + b * out_stride;
    for (int64_t c = 0; c < D; ++c) {
      float acc = p.bias ? p.bias[c] : 0.0f;
      for (int k = 0; k < S; ++k) acc = std::fma(p.weight[c * W + k], load_f32(state[k * D + c]), acc);
      acc = std::fma(p.weight[c * W + S], xb[c], acc);
      for (int k = 0; k + 1 < S; ++k) state[k * D + c] = state[(k + 1) * D + c];
      if (S > 0) store_f32(state[(S - 1) * D + c], xb[c]);
      ob[c] = p.apply_silu ? silu(acc) : acc;
    }
  }
}

}  // namespace

void causal_conv1d_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                       std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                       std::span<const uint8_t> has_initial_states) {
  visit_state_dtype(p.conv_states.dtype, [&](auto tag) {
    conv_fwd<decltype(tag)>(x, x_stride, out, out_stride, p, query_start_loc, state_indices, has_initial_states);
  });
}

void causal_conv1d_update(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                          std::span<const int32_t> state_indices) {
  visit_state_dtype(p.conv_states.dtype,
                    [&](auto tag) { conv_update<decltype(tag)>(x, x_stride, out, out_stride, p, state_indices); });
}

}  // namespace ssmserve::cpu
