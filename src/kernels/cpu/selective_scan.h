// Owns the Mamba-1 selective scan on the CPU (Gu & Dao 2023, Algorithm 2 "S6"; vllm-ssm-design.md §5.1 step 5):
//   dt = softplus(delta + delta_bias);  s_t = exp(dt * A) * s_{t-1} + dt * B_t * u_t;
//   y_t = <s_t, C_t> + D * u_t;  y_t *= SiLU(z_t)
// in two forms that must agree: the varlen prefill scan and the one-token decode update
// (vLLM's `selective_scan_fn` / `selective_state_update`). The math is fp32; the state is stored in the cache's
// SSM dtype (fp32 by default; bf16 / fp16 are widened exactly on load and rounded to nearest even on store, once
// per prefill chunk and once per decode token).
#pragma once
#include <cstdint>
#include <span>

#include "cache/state_view.h"
#include "kernels/decode_rows.h"

namespace ssmserve::cpu {

/// A row-major fp32 matrix view [rows, cols] with a row stride (for slices of packed projections).
struct Rows {
  const float* data = nullptr;
  int64_t stride = 0;
  const float* row(int64_t r) const { return data + r * stride; }
};

/// Per-token inputs of the scan, all indexed by packed token row t.
struct ScanInputs {
  Rows u;      ///< [num_tokens, dim] post-conv activations x'
  Rows delta;  ///< [num_tokens, dim] dt before bias and softplus
  Rows B;      ///< [num_tokens, d_state]
  Rows C;      ///< [num_tokens, d_state]
  Rows z;      ///< [num_tokens, dim] gate, or data == nullptr for no gate
};

/// Layer parameters and the state pool.
struct ScanParams {
  int64_t dim = 0;                   ///< channels (d_inner)
  int d_state = 0;                   ///< N
  const float* A = nullptr;          ///< [dim, d_state] = -exp(A_log)
  const float* D = nullptr;          ///< [dim] or nullptr
  const float* delta_bias = nullptr; ///< [dim] or nullptr
  bool delta_softplus = true;
  StateView ssm_states;              ///< [num_blocks, dim, d_state] (block-strided, F32/BF16/F16);
                                     ///< block 0 = null block (skipped)
};

/// Varlen prefill over sequences delimited by query_start_loc [num_seqs+1]. Sequence s starts from
/// ssm_states[state_indices[s]] when has_initial_states[s] (else zeros) and writes its final state back.
/// y: [num_tokens, dim] fp32, row stride y_stride. Rows of sequences whose state index is 0 are not written.
void selective_scan_fwd(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride,
                        std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                        std::span<const uint8_t> has_initial_states);

/// Decode: the tokens of each row of `rows` one after another through the one-token update, token j reading the
/// state in rows.src_block(b, j) and storing the state after it into rows.dst_block(b, j) (a plain decode row:
/// one token, its block updated in place; a speculative verify row: one state per verified token,
/// kernels/decode_rows.h). Token row t of `in` -> y row t: y is [rows.num_tokens(), dim]. Null rows are skipped.
void selective_state_update(const ScanInputs& in, const ScanParams& p, float* y, int64_t y_stride, const DecodeRows& rows);

}  // namespace ssmserve::cpu
