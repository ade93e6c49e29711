// Owns what the CPU decoder (DecoderLM) and the GPU runner (CudaDecoderLM) answer alike about a DecoderSpec: its
// config, the state layout of its modules in the pool, its chunk and KV block sizes, which metadata it reads, and the
// checks of a batch's hybrid metadata against the pool. One copy for both backends (a mixin over their CausalLM base).
#pragma once
#include <span>
#include <utility>

#include "model/causal_lm.h"
#include "model/decoder/decoder_spec.h"
#include "model/decoder/state_layout.h"

namespace ssmserve {

/// Throws Error (prefixed with `label`) when a model with lightning layers (has_linear) or softmax layers
/// (layout.has_attention()) gets a batch without their metadata, for another KV block size, with a state index, KV
/// block or slot outside the pool, a row needing more KV blocks than its table holds, or (a TP rank) a pool whose SSM
/// part cannot hold the rank's KV block.
void check_decoder_metadata(const std::string& label, const ForwardBatch& batch, const StateCache& cache,
                            const StateLayout& layout, bool has_linear, int tp_world);

template <class Base>
class DecoderShape : public Base {
 public:
  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return layout_.num_state_layers(); }
  StateShape state_shape() const override { return layout_.shape(); }
  int chunk_size() const override { return spec_.chunk_size; }
  int kv_block_size() const override { return layout_.kv_block_size(); }
  bool has_linear_attention() const override { return has_linear_ || layout_.has_attention(); }
  int prefix_block_alignment() const override { return has_chunked_ ? spec_.chunk_size : 1; }

 protected:
  DecoderShape(ModelConfig cfg, DecoderSpec spec) : cfg_(std::move(cfg)), spec_(std::move(spec)) {}
  /// Places the modules' states: specs [sublayers] in order, kinds [sublayers] their registry kinds.
  void set_layout(std::span<const ModuleStateSpec> specs, std::span<const std::string> kinds, int tp_world) {
    layout_ = StateLayout(specs, tp_world);
    tp_world_ = tp_world;
    for (const std::string& k : kinds) {
      has_linear_ |= k == "lightning";
      has_chunked_ |= k == "lightning" || k == "mamba2" || k == "gated_delta";  // prefill in sequence-aligned chunks
    }
  }
  void check_metadata(const ForwardBatch& batch, const StateCache& cache) const {
    check_decoder_metadata(spec_.label, batch, cache, layout_, has_linear_, tp_world_);
  }

  ModelConfig cfg_;
  DecoderSpec spec_;
  StateLayout layout_;
  bool has_linear_ = false;
  bool has_chunked_ = false;
  int tp_world_ = 1;
};

}  // namespace ssmserve
