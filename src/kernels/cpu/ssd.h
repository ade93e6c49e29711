// Owns the Mamba-2 SSD scan on the CPU: the chunked varlen prefill (vLLM's mamba_chunk_scan_combined_varlen) and
// the one-token decode update (selective_state_update on the tied-head-dim path). Math (Mamba-2 paper
// "Transformers are SSMs" §6-7 SSD algorithm; transformers' modeling_mamba2.py torch_forward;
// vllm-ssm-design.md §4 and §5.2), per head h of group g = h / (H / G), per token t:
//   dt = clamp(softplus(dt_raw + dt_bias[h]), time_step_min, time_step_max);  dA = exp(dt * A[h]);
//   S[h] (P x N) = dA * S[h] + dt * x_t[h] (outer) B_t[g];   y_t[h] = S[h] @ C_t[g] + D[h] * x_t[h].
// No gate inside (the gated RMSNorm is the mixer's). fp32 math; the state pool may be F32 / BF16 / F16, widened
// exactly on load and rounded to nearest even on store (once per prefill sequence, once per decode token).
#pragma once
#include <cstdint>
#include <limits>
#include <span>

#include "cache/state_view.h"
#include "kernels/cpu/selective_scan.h"  // Rows

namespace ssmserve::cpu {

/// Per-token inputs, all indexed by packed token row t (row strides allowed, e.g. slices of the xBC projection).
struct SsdInputs {
  Rows x;   ///< [num_tokens, H * P] post-conv x (head h at columns [h*P, (h+1)*P))
  Rows dt;  ///< [num_tokens, H] raw dt (before dt_bias and softplus)
  Rows B;   ///< [num_tokens, G * N] (group g at columns [g*N, (g+1)*N))
  Rows C;   ///< [num_tokens, G * N]
};

/// Layer sizes, parameters and the state pool.
struct SsdParams {
  int num_heads = 0;   ///< H
  int head_dim = 0;    ///< P
  int n_groups = 0;    ///< G (H % G == 0; heads [g*H/G, (g+1)*H/G) share B_g and C_g)
  int d_state = 0;     ///< N
  const float* A = nullptr;        ///< [H] = -exp(A_log) (negative, already exponentiated by the loader)
  const float* D = nullptr;        ///< [H] skip weight, or nullptr (= 0)
  const float* dt_bias = nullptr;  ///< [H], or nullptr (= 0)
  float time_step_min = 0.0f;      ///< `time_step_limit` lower bound applied after softplus
  float time_step_max = std::numeric_limits<float>::infinity();  ///< upper bound
  StateView ssm_states;  ///< [num_blocks, H, P, N] (block-strided, F32/BF16/F16); block 0 = null (skipped)
};

/// Chunk metadata of the prefill tokens (vllm-ssm-design.md §2.2-§2.3; build_mamba_metadata's *_p arrays).
/// A chunk never spans two sequences and is at most `chunk_size` tokens long.
struct SsdChunkMetadata {
  int chunk_size = 0;                             ///< max chunk length (the model's chunk_size)
  std::span<const int32_t> query_start_loc;       ///< [num_seqs + 1] token offsets, starting at 0
  std::span<const int32_t> cu_chunk_seqlen;       ///< [nchunks + 1] chunk starts, then num_tokens
  std::span<const int32_t> seq_idx;               ///< [nchunks] sequence of each chunk (non-decreasing)
  std::span<const int32_t> last_chunk_indices;    ///< [num_seqs] index of each sequence's last chunk
  std::span<const int32_t> state_indices;         ///< [num_seqs] running-state block ids (0 = skip the sequence)
  std::span<const uint8_t> has_initial_states;    ///< [num_seqs] 1: start from the block's state, 0: from zeros
};

/// Varlen chunked prefill (SSD): for each chunk, the within-chunk cumulative decay (segsum) of dt*A, the
/// intra-chunk output (C B^T ⊙ L ⊙ dt) x, the chunk's own end state; then per sequence and head, sequential
/// state passing over its chunks from the initial state (or zeros); then the inter-chunk output
/// exp(cumsum) * C · S_prev and D * x. Each sequence's final state is written back to ssm_states[state_indices[s]].
///   y: [num_tokens, H * P] fp32 with row stride y_stride (may not alias the inputs).
///   chunk_states: [nchunks, H, P, N] fp32 state at the END of every chunk (what prefix caching stores), or
///     nullptr to skip. Rows of sequences with state index 0 are written neither in y nor in chunk_states.
/// Decay factors below e^-60 are flushed to 0 (and their terms skipped): far below fp32 resolution, and it keeps
/// denormals out of the arithmetic. The within-chunk segsum is summed backwards from each token (the stable form
/// of the paper's segsum), not as cumsum differences, which lose ~ulp(|cumsum|) at large chunk_size * |A|.
/// Throws ssmserve::Error on inconsistent metadata (sizes, a chunk longer than chunk_size or spanning two
/// sequences, cu_chunk_seqlen not ending at num_tokens) or bad parameters (H % G != 0, any size < 1, A[h] > 0).
void ssd_chunk_scan_fwd(const SsdInputs& in, const SsdParams& p, const SsdChunkMetadata& meta, float* y,
                        int64_t y_stride, float* chunk_states = nullptr);

/// Decode: the tokens of each row of `rows` one after another through the one-token update, token j reading the
/// state of rows.src_block(b, j) and storing the state after it into rows.dst_block(b, j) (a plain decode row: one
/// token, updated in place; a speculative verify row: one state per verified token, kernels/decode_rows.h). Token row
/// t of `in` -> y row t: y is [rows.num_tokens(), H * P] fp32, row stride y_stride. Null rows are skipped (their y
/// rows are not written, no state is read or written). Throws ssmserve::Error on bad sizes or A[h] > 0.
void ssd_state_update(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride, const DecodeRows& rows);

/// Throws ssmserve::Error when ssd_state_update would on these parameters (bad sizes, A[h] > 0).
void ssd_check_params(const SsdParams& p);

/// ssd_state_update restricted to part `part` of `num_parts` of the (row, head) pairs, flattened as
/// b * num_heads + h and split into contiguous ranges, with no OpenMP region of its own: the threads of an
/// enclosing region each update their own pairs (disjoint heads touch disjoint state and y). Same arithmetic
/// per (row, head). Checks nothing (call ssd_check_params first, outside the region).
void ssd_state_update_part(const SsdInputs& in, const SsdParams& p, float* y, int64_t y_stride,
                           const DecodeRows& rows, int part, int num_parts);

}  // namespace ssmserve::cpu
