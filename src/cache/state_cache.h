// Owns the recurrent state pool: for every recurrent layer, a conv window and an SSM state per block, so one
// block id addresses a request's state in every layer (vllm-ssm-design.md §1.2, §3.1). Block 0 is the null
// block: never handed out, kernels skip it.
#pragma once
#include <cstdint>
#include <vector>

namespace ssmserve {

/// Per-layer state sizes (elements per block) of one layer group.
struct StateShape {
  int64_t conv_elems = 0;  ///< e.g. Mamba-1: (d_conv - 1) * d_inner, layout [d_conv-1, d_inner]
  int64_t ssm_elems = 0;   ///< e.g. Mamba-1: d_inner * d_state, layout [d_inner, d_state]
};

/// fp32 state storage for `num_layers` recurrent layers x `num_blocks` blocks.
/// conv_state(l): [num_blocks, conv_elems], ssm_state(l): [num_blocks, ssm_elems].
class StateCache {
 public:
  StateCache(int num_layers, StateShape shape, int num_blocks);

  int num_blocks() const { return num_blocks_; }
  int num_layers() const { return static_cast<int>(conv_.size()); }
  const StateShape& shape() const { return shape_; }
  float* conv_state(int layer) { return conv_[layer].data(); }
  float* ssm_state(int layer) { return ssm_[layer].data(); }
  /// Zeroes block `block` in every layer (called before a freed block is reused).
  void zero_block(int block);
  /// Bytes of state one block holds across all layers.
  int64_t bytes_per_block() const;

 private:
  StateShape shape_;
  int num_blocks_;
  std::vector<std::vector<float>> conv_, ssm_;
};

}  // namespace ssmserve
