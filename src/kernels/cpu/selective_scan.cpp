// Owns the CPU selective scan (see selective_scan.h).
#include "kernels/cpu/selective_scan.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/vec_math.h"

#include "kernels/cpu/isa/variant.h"  // last: opens the instruction-set variant (see there)

namespace ssmserve::cpu::SSM_CPU_VARIANT {
namespace {

constexpr int kMaxState = 256;
constexpr int kLanes = 16;  // channels advanced together: one AVX-512 register per state row

/// Channels [c0, c0 + nc) of one sequence, state transposed to [d_state][kLanes] so the inner loops
/// vectorize over channels. Prefill and decode both run through advance() so they agree bit for bit.
struct ChannelBlock {
  int64_t c0 = 0;
  int nc = 0;
  float st[kMaxState][kLanes];
  float At[kMaxState][kLanes];

  /// Loads channels [c0, c0 + nc) of `states` ([dim, d_state] as T), or zeros when !init.
  template <class T>
  ChannelBlock(const ScanParams& p, int64_t c0_, const T* states, bool init) : c0(c0_), nc(static_cast<int>(std::min<int64_t>(kLanes, p.dim - c0_))) {
    for (int n = 0; n < p.d_state; ++n)
      for (int j = 0; j < kLanes; ++j) {
        At[n][j] = j < nc ? p.A[(c0 + j) * p.d_state + n] : 0.0f;
        st[n][j] = (j < nc && init) ? load_f32(states[(c0 + j) * p.d_state + n]) : 0.0f;
      }
  }
  /// Stores the state back as T (rounded to nearest even for bf16 / fp16).
  template <class T>
  void store(const ScanParams& p, T* states) const {
    for (int n = 0; n < p.d_state; ++n)
      for (int j = 0; j < nc; ++j) store_f32(states[(c0 + j) * p.d_state + n], st[n][j]);
  }
  /// Advances by tokens [t0, t1) of `in`, writing y rows y_row0 + (t - t0).
  void advance(const ScanInputs& in, const ScanParams& p, int64_t t0, int64_t t1, float* y, int64_t y_stride, int64_t y_row0) {
    const int N = p.d_state;
    for (int64_t t = t0; t < t1; ++t) {
      float dt[kLanes], u[kLanes], acc[kLanes] = {};
      const float* drow = in.delta.row(t);
      const float* urow = in.u.row(t);
      for (int j = 0; j < kLanes; ++j) {
        float d = 0.0f;
        if (j < nc) {
          d = drow[c0 + j] + (p.delta_bias ? p.delta_bias[c0 + j] : 0.0f);
          if (p.delta_softplus) d = softplus(d);
        }
        dt[j] = d;
        u[j] = j < nc ? urow[c0 + j] : 0.0f;
      }
      const float* B = in.B.row(t);
      const float* C = in.C.row(t);
      for (int n = 0; n < N; ++n) {
        const float b = B[n], c = C[n];
#pragma omp simd
        for (int j = 0; j < kLanes; ++j) {
          const float s = exp_ps(dt[j] * At[n][j]) * st[n][j] + dt[j] * b * u[j];
          st[n][j] = s;
          acc[j] += s * c;
        }
      }
      float* yrow = y + (y_row0 + t - t0) * y_stride;
      const float* zrow = in.z.data ? in.z.row(t) : nullptr;
      for (int j = 0; j < nc; ++j) {
        float out = acc[j] + (p.D ? p.D[c0 + j] : 0.0f) * u[j];
        if (zrow) out *= silu(zrow[c0 + j]);
        yrow[c0 + j] = out;
      }
    }
  }
};

template <class T>
void scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
              std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
              std::span<const uint8_t> has_initial_states) {
  const int64_t num_seqs = static_cast<int64_t>(state_indices.size());
  const int64_t num_blocks = (p.dim + kLanes - 1) / kLanes;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int32_t block = state_indices[s];
    if (block == 0) continue;
    const int64_t t0 = query_start_loc[s], t1 = query_start_loc[s + 1];
    T* states = p.ssm_states.block<T>(block);  // [dim, N]
    const bool init = has_initial_states[s] != 0;
#pragma omp parallel for schedule(static)
    for (int64_t cb = 0; cb < num_blocks; ++cb) {
      ChannelBlock blk(p, cb * kLanes, states, init);
      blk.advance(in, p, t0, t1, y, y_stride, t0);
      blk.store(p, states);
    }
  }
}

template <class T>
void state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride, const DecodeRows& rows) {
  const int64_t batch = rows.num_rows();
  const int64_t num_blocks = (p.dim + kLanes - 1) / kLanes;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t cb = 0; cb < num_blocks; ++cb) {
      if (rows.is_null(b)) continue;
      // Token j: load the state after token j - 1 (its column), advance, store into column j: the loads and stores
      // of that many plain decode steps (a bf16 state rounds after every token in both).
      for (int j = 0; j < rows.num_tokens(b); ++j) {
        const int64_t t = rows.token_row(b, j);
        ChannelBlock blk(p, cb * kLanes, p.ssm_states.block<T>(rows.src_block(b, j)), true);
        blk.advance(in, p, t, t + 1, y, y_stride, t);
        blk.store(p, p.ssm_states.block<T>(rows.dst_block(b, j)));
      }
    }
  }
}

}  // namespace

void selective_scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                        std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                        std::span<const uint8_t> has_initial_states) {
  SSM_CHECK(p.d_state <= kMaxState, "selective_scan_fwd: d_state {} > {}", p.d_state, kMaxState);
  visit_state_dtype(p.ssm_states.dtype, [&](auto tag) {
    scan_fwd<decltype(tag)>(in, p, y, y_stride, query_start_loc, state_indices, has_initial_states);
  });
}

void selective_state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride, const DecodeRows& rows) {
  SSM_CHECK(p.d_state <= kMaxState, "selective_state_update: d_state {} > {}", p.d_state, kMaxState);
  visit_state_dtype(p.ssm_states.dtype, [&](auto tag) { state_update<decltype(tag)>(in, p, y, y_stride, rows); });
}

}  // namespace ssmserve::cpu::SSM_CPU_VARIANT

// The public functions: the active variant's (kernels/cpu/isa/variant.h).
SSM_CPU_DISPATCH(void, selective_scan_fwd, (const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                 std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                 std::span<const uint8_t> has_initial_states),
                 (in, p, y, y_stride, query_start_loc, state_indices, has_initial_states))
SSM_CPU_DISPATCH(void, selective_state_update, (const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                 const DecodeRows& rows), (in, p, y, y_stride, rows))
