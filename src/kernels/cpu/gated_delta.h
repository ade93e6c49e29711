// Owns the gated delta rule on the CPU (Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024; transformers'
// torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule in models/qwen3_5; vLLM's gdn_linear_attn.py).
// Per value head h (key head h / (Hv / Hk)), with S: [Dk, Dv] (row = key dim, column = value dim), q, k: [Dk], v: [Dv],
// log-decay g_t <= 0 and learning rate beta_t in (0, 1):
//   S'  = e^{g_t} S_{t-1}
//   S_t = S' + k_t (beta_t (v_t - S'^T k_t))^T          (the delta rule: only the correction is written)
//   o_t = S_t^T q_t
// q and k arrive L2-normalised, q already scaled by 1 / sqrt(Dk) (the mixer does both, as transformers does before the
// kernel). Prefill is chunked (the WY / UT transform): within a chunk of m tokens, with cumulative log decays
// c_i = g_1 + ... + g_i (chunk-local, 1-based) and the state S carried into the chunk,
//   A_ij = beta_i (k_i . k_j) e^{c_i - c_j}  (j < i),      (I + A) U = diag(beta) V,   (I + A) W = diag(beta e^{c}) K
//   V~   = U - W S
//   o_i  = e^{c_i} S^T q_i + sum_{j <= i} (q_i . k_j) e^{c_i - c_j} v~_j
//   S   <- e^{c_m} S + sum_j e^{c_m - c_j} k_j v~_j^T
// which equals the recurrence exactly in real arithmetic. Only exponentials of non-positive numbers appear (no
// overflow for any decay). Chunks are counted from the *sequence* start (a continued prefill with num_computed tokens
// already folded in first finishes its partial chunk), so a prompt cut into steps on chunk boundaries rounds exactly
// as an uncut one; cuts inside a chunk differ by rounding only. Everything is fp32 with double-precision decay sums.
#pragma once
#include <cstdint>
#include <span>

#include "cache/state_view.h"
#include "kernels/decode_rows.h"

namespace ssmserve::cpu {

/// Shapes of one gated-DeltaNet layer (this rank's heads) and its state views.
struct GatedDeltaParams {
  int num_k_heads = 0;   ///< Hk (query / key heads)
  int num_v_heads = 0;   ///< Hv, a multiple of Hk: value head h reads key head h / (Hv / Hk)
  int head_k_dim = 0;    ///< Dk
  int head_v_dim = 0;    ///< Dv
  int chunk_size = 64;   ///< tokens per prefill chunk (sequence-aligned)
  StateView states;      ///< block b: [Hv, Dk, Dv] in the view's dtype (fp32 by default); block 0 is the null block
};

/// Per-token inputs of the rule, each a row-major matrix with its own row stride (elements).
struct GatedDeltaInputs {
  const float* q = nullptr;     ///< [T, Hk, Dk] L2-normalised, times 1/sqrt(Dk)
  int64_t q_stride = 0;
  const float* k = nullptr;     ///< [T, Hk, Dk] L2-normalised
  int64_t k_stride = 0;
  const float* v = nullptr;     ///< [T, Hv, Dv]
  int64_t v_stride = 0;
  const float* g = nullptr;     ///< [T, Hv] log decay (<= 0): -exp(A_log) * softplus(a + dt_bias)
  int64_t g_stride = 0;
  const float* beta = nullptr;  ///< [T, Hv] sigmoid(b)
  int64_t beta_stride = 0;
};

/// Prefill rows (tokens relative to `in`). Row r owns tokens [query_start_loc[r], query_start_loc[r+1]), has
/// num_computed[r] tokens already folded into its state (0: starts from zeros and the block is not read; chunk
/// boundaries fall where (num_computed + i) % chunk_size == 0) and keeps its state in block state_indices[r] (0: the
/// null block, skipped, outputs zero). out: [T, Hv, Dv] fp32 with row stride out_stride. Writes the final states.
/// Throws Error on inconsistent spans or shapes.
void gated_delta_prefill(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                         std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                         std::span<const int32_t> state_indices);

/// Decode rows: each row's tokens one after another through the recurrence above, token j reading the state of
/// rows.src_block(r, j) and storing the new one into rows.dst_block(r, j) (plain decode rows: one token, in place;
/// speculative verify rows: one state per verified token, kernels/decode_rows.h); token row t of `in` -> out row t.
/// Null rows (padding) read and write no state and output zeros.
void gated_delta_decode(const GatedDeltaInputs& in, const GatedDeltaParams& p, float* out, int64_t out_stride,
                        const DecodeRows& rows);

/// The token-by-token recurrence in double precision on one sequence (tests' reference): state [Hv, Dk, Dv] is
/// read and updated in place; out: [T, Hv, Dv].
void gated_delta_reference(const GatedDeltaInputs& in, const GatedDeltaParams& p, int64_t T, double* state, double* out);

}  // namespace ssmserve::cpu
