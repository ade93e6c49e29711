// Owns the dense MLP FFN: SiLU-gated (transformers' LlamaMLP / Qwen3NextMLP: down(silu(gate x) * (up x))) or
// squared-ReLU (Nemotron-H's NemotronHMLP: down(relu(up x)^2)).
#pragma once
#include <memory>

#include "model/decoder/module.h"

namespace ssmserve {

/// The registry's factory ("mlp"): hyperparameters intermediate_size, hidden_act ("silu": gated, weights
/// `prefix`{gate_proj, up_proj, down_proj}; "relu2": `prefix`{up_proj, down_proj}), mlp_bias (false). Rank tp.rank
/// keeps rows I / tp of gate / up and its output rows of down over the all-gathered activations
/// (dist/gathered_linear.h). Throws Error on an unsupported activation, a bad tensor or a non-dividing tp.
std::unique_ptr<CpuModule> make_mlp_ffn(const ModuleArgs& args);

}  // namespace ssmserve
