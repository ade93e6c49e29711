// Owns DecodeRows: how the recurrent decode kernels (conv window update, Mamba-1 scan update, SSD update, lightning
// and gated-delta decode) see a step's decode rows, including the verify rows of speculative decoding with one state
// column per draft position (vllm-ssm-design.md §6.1). Shared by the CPU kernels and the device runners.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ssmserve {

/// The decode rows of one step. Row b feeds num_tokens(b) tokens, token j at token row token_row(b, j) of the kernel's
/// inputs, one after another through the one-token update: token j reads the state in column j - 1 (token 0: column
/// 0, the state after the request's last accepted token) and writes the state after it into column j
/// (state_indices[b * cols + j]). A plain decode row (one token, cols = 1) thus updates column 0 in place; a verify
/// row of 1 + k tokens leaves the state after each verified token in its own column, and the engine continues the
/// next step from the column of the last accepted token (it swaps that block into column 0 of its bookkeeping: no
/// state is copied). A row whose column 0 is block 0 (the null block: padding) reads and writes no state.
/// Because every token runs the same one-token update with the same loads and stores as a plain decode step, a
/// verify row's outputs and states equal 1 + k plain decode steps bit for bit.
struct DecodeRows {
  std::span<const int32_t> state_indices;    ///< [num_rows, cols] row-major block ids
  int cols = 1;                              ///< state columns per row (1 + num_speculative_tokens)
  std::span<const int32_t> query_start_loc;  ///< [num_rows + 1] token-row offsets; empty: row b is token row b

  DecodeRows() = default;
  /// Plain decode rows: one token and one state block each (row b = token row b).
  DecodeRows(std::span<const int32_t> blocks) : state_indices(blocks) {}  // NOLINT(google-explicit-constructor)
  DecodeRows(const std::vector<int32_t>& blocks) : state_indices(blocks) {}  // NOLINT(google-explicit-constructor)
  DecodeRows(std::span<const int32_t> blocks, int columns, std::span<const int32_t> qsl)
      : state_indices(blocks), cols(columns), query_start_loc(qsl) {}

  int64_t num_rows() const { return static_cast<int64_t>(state_indices.size()) / cols; }
  /// Tokens of all rows (the decode part of the kernel's token rows).
  int64_t num_tokens() const { return query_start_loc.empty() ? num_rows() : query_start_loc[num_rows()]; }
  int num_tokens(int64_t b) const { return query_start_loc.empty() ? 1 : query_start_loc[b + 1] - query_start_loc[b]; }
  int64_t token_row(int64_t b, int j) const { return (query_start_loc.empty() ? b : query_start_loc[b]) + j; }
  /// Null (padding) row: nothing read or written.
  bool is_null(int64_t b) const { return state_indices[b * cols] == 0; }
  int32_t src_block(int64_t b, int j) const { return state_indices[b * cols + (j > 0 ? j - 1 : 0)]; }
  int32_t dst_block(int64_t b, int j) const { return state_indices[b * cols + j]; }
};

}  // namespace ssmserve
