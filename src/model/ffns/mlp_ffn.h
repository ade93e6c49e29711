// Owns the dense MLP FFN: SiLU-gated (transformers' LlamaMLP / BambaMLP / JambaMLP: down(silu(gate x) * (up x)); Granite's
// shared MLP with gate and up fused in input_linear; Falcon-H1's gate / down multipliers) or squared-ReLU
// (Nemotron-H's NemotronHMLP: down(relu(up x)^2)). Also the shared expert of the MoE FFN.
#pragma once
#include <memory>
#include <string>

#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// MLP hyperparameters: intermediate_size, hidden_act ("silu" gated / "relu2"), mlp_bias (false), mlp_layout
/// ("gate_up_proj": `prefix`{gate_proj, up_proj, down_proj}; "input_linear": Granite's `prefix`{input_linear [2I,
/// hidden] = gate then up, output_linear}), mlp_gate_multiplier / mlp_down_multiplier (1; Falcon-H1's mlp_multipliers:
/// silu(m_g * gate x) * up x, then m_d * down(...)).
struct MlpConfig {
  bool gated = true;
  int intermediate_size = 0;
  bool bias = false;
  std::string layout = "gate_up_proj";
  float gate_multiplier = 1.0f, down_multiplier = 1.0f;
  /// Reads and validates them from `j`; throws Error naming the field.
  static MlpConfig from_json(const nlohmann::json& j);
};

/// One MLP's parameters at full size: gate / up [I, hidden] (gate empty for relu^2), down [hidden, I], biases or empty.
struct MlpWeights {
  Weight gate_proj, up_proj, down_proj;
  std::vector<float> gate_bias, up_bias, down_bias;
};

/// Reads one MLP's tensors under `prefix` in c.layout (or dummy values seeded per name). Throws Error naming a tensor.
MlpWeights read_mlp_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const MlpConfig& c);

/// The registry's factory ("mlp"): MlpConfig from args.params. Rank tp.rank keeps rows I / tp of gate / up and its
/// output rows of down over the all-gathered activations (dist/gathered_linear.h). Throws Error on an unsupported
/// activation or layout, a bad tensor or a non-dividing tp.
std::unique_ptr<CpuModule> make_mlp_ffn(const ModuleArgs& args);

}  // namespace ssmserve
