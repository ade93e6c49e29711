// Owns the depthwise causal conv1d of the Mamba mixers on the CPU: the varlen prefill form and the one-token
// decode update, both reading and writing the conv window kept in the state cache. Semantics follow the
// `causal_conv1d_fn` / `causal_conv1d_update` pair of vLLM and Dao-AILab/causal-conv1d
// (vllm-ssm-design.md §3.1: the window holds the last K-1 pre-convolution inputs, newest last).
#pragma once
#include <cstdint>
#include <span>

#include "cache/state_view.h"
#include "kernels/decode_rows.h"

namespace ssmserve::cpu {

/// Largest supported kernel size (d_conv; the public checkpoints use 4).
inline constexpr int kMaxConvWidth = 16;

/// Parameters shared by both forms. `conv_states` views the pool: block b's window is [width-1, dim] (channels
/// contiguous, "SD" layout) in the view's dtype (F32, BF16 or F16), blocks `block_stride` elements apart; block 0
/// is the null block: rows whose state index is 0 are skipped entirely. The math is fp32 in both forms with the
/// same std::fma order (bias, then taps oldest to newest), so for an fp32 window prefill and decode agree bit for
/// bit; a bf16/fp16 window is widened exactly on load and rounded to nearest even on store.
struct ConvParams {
  int64_t dim = 0;                 ///< channels
  int width = 0;                   ///< kernel size K (d_conv)
  const float* weight = nullptr;   ///< [dim, width] fp32
  const float* bias = nullptr;     ///< [dim] fp32 or nullptr
  StateView conv_states;           ///< [num_blocks, width-1, dim] (block-strided)
  bool apply_silu = true;
};

/// Varlen prefill. x: [num_tokens, dim] (row stride x_stride) packed sequences delimited by
/// query_start_loc [num_seqs+1]; out: [num_tokens, dim] (row stride out_stride, must not alias x).
/// Sequence s starts from conv_states[state_indices[s]] when has_initial_states[s], else from zeros, and its
/// window is overwritten with the last width-1 inputs (shifted in from the old window when the sequence is
/// shorter than width-1).
void causal_conv1d_fwd(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                       std::span<const int32_t> query_start_loc, std::span<const int32_t> state_indices,
                       std::span<const uint8_t> has_initial_states);

/// Decode. x: [rows.num_tokens(), dim] (row stride x_stride), out: the same shape (row stride out_stride). Each
/// token of a row shifts its input into the window: token j reads the window of rows.src_block(b, j) and writes
/// rows.dst_block(b, j) (a plain decode row: one block, updated in place; a speculative verify row: one window
/// per verified token, see kernels/decode_rows.h). Null rows (block 0) are skipped.
void causal_conv1d_update(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                          const DecodeRows& rows);

/// causal_conv1d_update restricted to channels [c0, c1) (0 <= c0, c1 <= dim), with no OpenMP region of its own:
/// the threads of an enclosing region each update their own channel range (channels are independent; disjoint
/// ranges touch disjoint window entries). Same arithmetic per channel. Keep c0 and c1 multiples of 16 so the
/// SiLU pass splits into the same vector lanes as the whole-row call.
void causal_conv1d_update_channels(const float* x, int64_t x_stride, float* out, int64_t out_stride, const ConvParams& p,
                                   const DecodeRows& rows, int64_t c0, int64_t c1);

}  // namespace ssmserve::cpu
