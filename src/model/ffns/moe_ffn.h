// Owns the sparse mixture-of-experts FFN (Mixtral / MiniMax style, transformers' MiniMaxSparseMoeBlock): softmax
// router over E experts, top_k renormalized, each expert a SiLU-gated MLP w2(silu(w1 x) * (w3 x)).
#pragma once
#include <memory>

#include "kernels/cpu/moe.h"
#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// MoE hyperparameters: num_local_experts (8), num_experts_per_tok (2), intermediate_size; SiLU experts.
struct MoeConfig {
  int num_experts = 8, top_k = 2, intermediate_size = 0;
  /// Reads and validates them from `j`; throws Error naming the field.
  static MoeConfig from_json(const nlohmann::json& j);
};

/// One MoE layer's parameters at full size: the router [E, hidden] and every expert's w1 / w3 [I, hidden] and
/// w2 [hidden, I].
struct MoeWeights {
  Weight gate;
  std::vector<cpu::ExpertWeights> experts;
};

/// Reads `prefix`{gate, experts.{e}.w1, w2, w3} (or dummy values seeded per name). Throws Error naming a tensor.
MoeWeights read_moe_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const MoeConfig& c);

/// The registry's factory ("moe"): hyperparameters num_local_experts (8), num_experts_per_tok (2),
/// intermediate_size; weights `prefix`{gate, experts.{e}.w1, w2, w3}. Tensor-parallel experts (vLLM's FusedMoE
/// default, not expert parallelism): the router replicated, every rank holding rows I / tp of each expert's w1 / w3
/// and its output rows of w2 over the all-gathered activations (dist/gathered_linear.h). Throws Error on a bad field
/// or tensor, or when tp does not divide intermediate_size.
std::unique_ptr<CpuModule> make_moe_ffn(const ModuleArgs& args);

}  // namespace ssmserve
