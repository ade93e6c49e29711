// Owns ForwardingLM: the base of the tests' simulated device backends (test_device_prompt_scoring.cpp,
// test_host_tier_swap.cpp), a CausalLM that forwards everything to a CPU model, so a test overrides only the device
// entry points it simulates (forward_sample, the host tier, ...).
#pragma once
#include <memory>
#include <span>
#include <utility>

#include "model/causal_lm.h"

namespace ssmserve::testing {

/// Forwards every CausalLM member to `inner` (the defaults of the device entry points stay CausalLM's).
class ForwardingLM : public CausalLM {
 public:
  explicit ForwardingLM(std::unique_ptr<CausalLM> inner) : m_(std::move(inner)) {}
  const ModelConfig& config() const override { return m_->config(); }
  int num_state_layers() const override { return m_->num_state_layers(); }
  StateShape state_shape() const override { return m_->state_shape(); }
  int chunk_size() const override { return m_->chunk_size(); }
  int prefix_block_alignment() const override { return m_->prefix_block_alignment(); }
  bool stores_prefill_states() const override { return m_->stores_prefill_states(); }
  int kv_block_size() const override { return m_->kv_block_size(); }
  bool has_linear_attention() const override { return m_->has_linear_attention(); }
  bool supports_speculative_decoding() const override { return m_->supports_speculative_decoding(); }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override { m_->forward(batch, cache, logits); }
  void copy_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    m_->copy_state_blocks(copies, cache);
  }

 protected:
  CausalLM& inner() { return *m_; }

 private:
  std::unique_ptr<CausalLM> m_;
};

}  // namespace ssmserve::testing
