// Owns the CPU selective scan (see selective_scan.h).
#include "kernels/cpu/selective_scan.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/activations.h"

namespace ssmserve::cpu {
namespace {

constexpr int kMaxState = 256;

// Advances channel c's state `s` [d_state] by tokens [t0, t1) of `in` and writes y rows.
inline void scan_channel(const ScanInputs& in, const ScanParams& p, int64_t c, float* s, int64_t t0, int64_t t1,
                         float* y, int64_t y_stride, int64_t y_row0) {
  const int N = p.d_state;
  const float* A = p.A + c * N;
  const float bias = p.delta_bias ? p.delta_bias[c] : 0.0f;
  const float Dc = p.D ? p.D[c] : 0.0f;
  float dA[kMaxState];
  for (int64_t t = t0; t < t1; ++t) {
    float dt = in.delta.row(t)[c] + bias;
    if (p.delta_softplus) dt = softplus(dt);
    const float u = in.u.row(t)[c];
    const float* B = in.B.row(t);
    const float* C = in.C.row(t);
#pragma omp simd
    for (int n = 0; n < N; ++n) dA[n] = std::exp(dt * A[n]);
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int n = 0; n < N; ++n) {
      s[n] = dA[n] * s[n] + dt * B[n] * u;
      acc += s[n] * C[n];
    }
    float out = acc + Dc * u;
    if (in.z.data) out *= silu(in.z.row(t)[c]);
    y[(y_row0 + t - t0) * y_stride + c] = out;
  }
}

}  // namespace

void selective_scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                        std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                        std::span<const uint8_t> has_initial_states) {
  const int N = p.d_state;
  const int64_t num_seqs = static_cast<int64_t>(state_indices.size());
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t block = state_indices[s];
    if (block == 0) continue;
    const int64_t t0 = query_start_loc[s], t1 = query_start_loc[s + 1];
    float* states = p.ssm_states + static_cast<int64_t>(block) * p.dim * N;  // [dim, N]
    const bool init = has_initial_states[s] != 0;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < p.dim; ++c) {
      float st[kMaxState];
      if (init) std::copy_n(states + c * N, N, st);
      else std::fill_n(st, N, 0.0f);
      scan_channel(in, p, c, st, t0, t1, y, y_stride, t0);
      std::copy_n(st, N, states + c * N);
    }
  }
}

void selective_state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                            std::span<const int32_t> state_indices) {
  const int N = p.d_state;
  const int64_t batch = static_cast<int64_t>(state_indices.size());
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t c = 0; c < p.dim; ++c) {
      const int32_t block = state_indices[b];
      if (block == 0) continue;
      float* st = p.ssm_states + (static_cast<int64_t>(block) * p.dim + c) * N;
      scan_channel(in, p, c, st, b, b + 1, y, y_stride, b);
    }
  }
}

}  // namespace ssmserve::cpu
