// Owns the reading of a hybrid's per-layer block types from config.json, in every spelling transformers accepts:
// `layer_types` (Qwen3-Next / Qwen3.5, MiniMax, Granite-4.0-H), `layers_block_type` (Nemotron-H, Jamba-style
// lists), `hybrid_override_pattern` strings (Nemotron-H: M mamba, * attention, - MLP, E MoE), MiniMax's
// `attn_type_list` (0 linear, 1 softmax), `attn_layer_indices` (Bamba) and `attn_layer_period` / `attn_layer_offset`
// (Jamba), and Jamba's `expert_layer_period` / `expert_layer_offset` for MoE layers.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ssmserve {

/// Canonical block types: "mamba", "attention", "linear_attention", "mlp", "moe".
/// Spellings accepted in lists: "mamba" / "mamba2" / "m" -> mamba; "attention" / "full_attention" / "attn" /
/// "hybrid" -> attention; "linear_attention" / "linear" -> linear_attention; "mlp" / "dense" -> mlp; "moe" -> moe.
std::vector<std::string> canonical_layer_types(const nlohmann::json& list, int num_layers, const char* field);

/// The per-layer mixer types of a hybrid: the first of `layer_types`, `layers_block_type`,
/// `hybrid_override_pattern`, `attn_type_list`, `attn_layer_indices`, `attn_layer_period` present in `cfg`;
/// `fallback` for every layer when none is. Throws Error naming the field when it is malformed or does not
/// list num_layers entries.
std::vector<std::string> read_layer_types(const nlohmann::json& cfg, int num_layers, const std::string& fallback);

/// Jamba-style MoE placement: layer l has an MoE FFN iff num_experts > 1 and l % expert_layer_period ==
/// expert_layer_offset (defaults 1 and 0 when absent). Returns [num_layers] booleans. Throws Error on a malformed
/// period / offset.
std::vector<bool> read_moe_layers(const nlohmann::json& cfg, int num_layers);

}  // namespace ssmserve
