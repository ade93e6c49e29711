// Owns the sparse mixture-of-experts FFN of every supported family: the router (kernels/cpu/moe.h: softmax or sigmoid
// scoring, top_k, renormalization, grouped choice, routed scaling), E experts (SiLU-gated or relu^2) and an optional
// shared expert (a dense MLP, model/ffns/mlp_ffn.h) added to the routed sum, optionally scaled per token by a sigmoid
// gate: transformers' MiniMaxSparseMoeBlock, GraniteMoeHybridMoE + shared_mlp, NemotronHMoE, JambaSparseMoeBlock,
// Qwen3NextSparseMoeBlock / Qwen3_5MoeSparseMoeBlock.
#pragma once
#include <memory>
#include <string>

#include "kernels/cpu/moe.h"
#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// MoE hyperparameters (the module's params; an architecture maps its own field names onto these):
///   num_local_experts (8), num_experts_per_tok (2), intermediate_size, hidden_act ("silu": gated experts; "relu2"),
///   scoring_func ("softmax" | "sigmoid"), norm_topk_prob (true), routed_scaling_factor (1), n_group / topk_group
///   (1), moe_layout (weight names, see read_moe_weights), shared_intermediate_size (0: no shared expert),
///   shared_hidden_act (hidden_act), shared_prefix (the shared expert's names relative to the module prefix;
///   "shared_expert." for moe_layout "qwen", else "shared_experts."), shared_expert_gate (false; Qwen: out = routed +
///   sigmoid(x . w_g) * shared_expert(x), w_g = `prefix`shared_expert_gate.weight [1, hidden]; needs a shared expert).
struct MoeConfig {
  int num_experts = 8, top_k = 2, intermediate_size = 0;
  bool gated = true;  ///< SiLU-gated experts (w1, w3, w2), else relu^2 (up, down)
  cpu::MoeRouting::Scoring scoring = cpu::MoeRouting::Scoring::Softmax;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  int n_group = 1, topk_group = 1;
  std::string layout = "mixtral";
  int shared_intermediate_size = 0;
  bool shared_gated = true;
  std::string shared_prefix;
  bool shared_expert_gate = false;
  /// Reads and validates them from `j`; throws Error naming the field.
  static MoeConfig from_json(const nlohmann::json& j);
  /// The router of this config (without the correction bias, a tensor).
  cpu::MoeRouting routing() const;
};

/// One MoE layer's parameters at full size: the router [E, hidden], its correction bias [E] (sigmoid routing; may be
/// empty) and every expert's w1 (gate, or up for relu^2) / w3 (up; empty for relu^2) [I, hidden] and w2 [hidden, I];
/// the shared expert's gate [hidden] fp32 (shared_expert_gate), else empty.
struct MoeWeights {
  Weight gate;
  std::vector<float> correction_bias;
  std::vector<cpu::ExpertWeights> experts;
  std::vector<float> shared_gate;
};

/// Reads the router and experts under `prefix` in c.layout (or dummy values seeded per name):
///   "mixtral":  gate.weight, experts.{e}.{w1, w2, w3}.weight
///   "granite":  block_sparse_moe.{router.layer.weight, input_linear.weight [E, 2I, hidden] (gate then up),
///               output_linear.weight [E, hidden, I]} under the layer's prefix (its shared_mlp. sits beside it)
///   "nemotron": gate.weight, gate.e_score_correction_bias, experts.{e}.{up_proj, down_proj}.weight
///   "jamba":    router.weight, experts.{e}.{gate_proj, up_proj, down_proj}.weight
///   "qwen":     gate.weight, experts.{e}.{gate_proj, up_proj, down_proj}.weight, or, when the checkpoint has
///               experts.gate_up_proj instead (transformers 5's fused experts), experts.gate_up_proj [E, 2I, hidden]
///               (gate rows then up rows) and experts.down_proj [E, hidden, I] (no .weight suffix); dummy weights
///               take the per-expert names
/// plus `prefix`shared_expert_gate.weight [1, hidden] with shared_expert_gate. Throws Error naming a missing /
/// misshapen tensor.
MoeWeights read_moe_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const MoeConfig& c);

/// The shared expert's MLP hyperparameters (mlp_ffn.h's fields) of `c`.
nlohmann::json shared_mlp_params(const MoeConfig& c);

/// The registry's factory ("moe"). Tensor-parallel experts (vLLM's FusedMoE default, not expert parallelism): the
/// router replicated, every rank holding rows I / tp of each expert's w1 / w3 and its output rows of w2 over the
/// all-gathered activations (dist/gathered_linear.h); the shared expert split as the dense MLP. Throws Error on a bad
/// field or tensor, or when tp does not divide intermediate_size.
std::unique_ptr<CpuModule> make_moe_ffn(const ModuleArgs& args);

}  // namespace ssmserve
