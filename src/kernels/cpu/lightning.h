// Owns lightning attention on the CPU (MiniMax-01's linear attention with per-head exponential decay; Qin et al.
// 2024, transformers' MiniMaxLightningAttention; vllm-ssm-design.md §4, §5.3). Per head h with slope s = s_h:
//   S_t = e^{-s} S_{t-1} + k_t^T v_t      (S: [D, D], k/v/q: [D] row vectors)
//   o_t = q_t S_t
// Prefill is blocked: within a block of `block_size` tokens (blocks counted from the *sequence* start, so a
// continued prefill lands on the same block grid as an unsplit one), with i, j block-local indices and S the
// state carried into the block,
//   o_i = e^{-s(i+1)} q_i S + sum_{j<=i} e^{-s(i-j)} (q_i . k_j) v_j
//   S  <- e^{-s m} S + sum_j e^{-s(m-1-j)} k_j^T v_j       (m = tokens in the block)
// which is the recurrence exactly (vLLM's kernel uses e^{-s i} for the query decay: §8.B(1); we do not).
// Decay factors are e^{-s k} evaluated directly (in double, rounded to fp32), never as powers of e^{-s}.
#pragma once
#include <cstdint>
#include <span>

#include "cache/state_view.h"
#include "kernels/decode_rows.h"

namespace ssmserve::cpu {

/// Shapes and parameters of one lightning-attention layer.
struct LightningParams {
  int num_heads = 0;             ///< H
  int head_dim = 0;              ///< D
  int block_size = 256;          ///< tokens per intra-block (config `block_size`)
  const float* slopes = nullptr; ///< [H] decay rates s_h >= 0
  StateView states;              ///< block b: [H, D, D] (row = key dim, column = value dim), any state dtype
};

/// Prefill rows. qkv: [T, H, 3D] fp32 (q | k | v per head, after SiLU), row stride qkv_stride; out: [T, H * D]
/// fp32, row stride out_stride. Row r owns tokens [query_start_loc[r], query_start_loc[r+1]) (relative to qkv),
/// has num_computed[r] tokens already folded into its state (0 = start from zeros; the block is not read), and
/// keeps its state in block state_indices[r] (0 = null block: skipped, outputs zero). Writes the final states.
/// Throws Error on inconsistent spans.
void lightning_prefill(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride, const LightningParams& p,
                       std::span<const int32_t> query_start_loc, std::span<const int32_t> num_computed,
                       std::span<const int32_t> state_indices);

/// Decode rows: each row's tokens one after another through S <- e^{-s} S + k^T v; o = q S, token j reading the
/// state of rows.src_block(r, j) and storing the new one into rows.dst_block(r, j) (plain decode rows: one token,
/// in place; speculative verify rows: one state per verified token, kernels/decode_rows.h). Token row t of qkv ->
/// out row t. Null rows (padding) read and write no state and output zeros.
void lightning_decode(const float* qkv, int64_t qkv_stride, float* out, int64_t out_stride, const LightningParams& p,
                      const DecodeRows& rows);

/// e^{-s k} as lightning uses it: computed in double, rounded to fp32.
float lightning_decay(float s, double k);

}  // namespace ssmserve::cpu
