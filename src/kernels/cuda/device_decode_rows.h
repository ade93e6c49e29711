// Owns DeviceDecodeRows: the device form of kernels/decode_rows.h (DecodeRows), which the GPU recurrent decode kernels
// take (conv window update, Mamba-1 scan update, SSD update, lightning and gated-delta decode). A plain decode row is
// one token with one state block updated in place; a speculative verify row (vllm-ssm-design.md §6.1) is 1 + k
// tokens, token j reading the state of column j - 1 (token 0: column 0) and writing the state after it into column j.
// Host-visible (plain C++ when not compiled by nvcc) so the runners can build it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SSM_DECODE_ROWS_FN __host__ __device__ __forceinline__
#else
#define SSM_DECODE_ROWS_FN inline
#endif

namespace ssmserve::cuda {

/// The decode rows of one step as device arrays. Row b feeds num_tokens(b) tokens at token rows first_token(b) + j
/// of the kernel's inputs and outputs. state_indices: [rows, cols] int32 (device, row-major; column 0 = the request's
/// state block, columns 1.. the verify columns); query_start_loc: [rows + 1] int32 (device) token offsets, or null:
/// row b is token row b (one token). A row whose column 0 is block 0 (the null block: padding) reads and writes no
/// state. Converts implicitly from a plain `state_indices` pointer (one token and one block per row).
struct DeviceDecodeRows {
  const int32_t* state_indices = nullptr;
  int cols = 1;
  const int32_t* query_start_loc = nullptr;

  DeviceDecodeRows() = default;
  /// Plain decode rows: row b is token b, state block state_indices[b] updated in place.
  DeviceDecodeRows(const int32_t* blocks) : state_indices(blocks) {}  // NOLINT(google-explicit-constructor)
  DeviceDecodeRows(const int32_t* blocks, int columns, const int32_t* qsl)
      : state_indices(blocks), cols(columns), query_start_loc(qsl) {}

  /// True when some row may carry more than one token (the kernels then loop over tokens).
  SSM_DECODE_ROWS_FN bool multi_token() const { return query_start_loc != nullptr; }
  SSM_DECODE_ROWS_FN int64_t first_token(int64_t b) const { return query_start_loc ? query_start_loc[b] : b; }
  SSM_DECODE_ROWS_FN int num_tokens(int64_t b) const {
    return query_start_loc ? query_start_loc[b + 1] - query_start_loc[b] : 1;
  }
  SSM_DECODE_ROWS_FN bool is_null(int64_t b) const { return state_indices[b * cols] == 0; }
  /// The block token j of row b reads (column j - 1; column 0 for j = 0).
  SSM_DECODE_ROWS_FN int32_t src_block(int64_t b, int j) const { return state_indices[b * cols + (j > 0 ? j - 1 : 0)]; }
  /// The block token j of row b writes (column j).
  SSM_DECODE_ROWS_FN int32_t dst_block(int64_t b, int j) const { return state_indices[b * cols + j]; }
};

}  // namespace ssmserve::cuda
