// Owns the Qwen3.5 / Qwen3.6 and Qwen3-Next mappings (see qwen.h).
#include <fmt/format.h>

#include <algorithm>

#include "config/hf_json.h"
#include "core/error.h"
#include "model/archs/hybrid_fields.h"
#include "model/archs/qwen.h"
#include "model/decoder/layer_types.h"
#include "model/decoder/params.h"

namespace ssmserve {
namespace {

/// Layer l's mixer kind: "gated_delta" or "attention".
std::vector<std::string> qwen_mixer_kinds(const ModelConfig& cfg, const char* family) {
  const nlohmann::json& j = cfg.raw;
  std::vector<std::string> kinds;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    // transformers' Qwen decoder layers know exactly these two types (any other builds a layer without a mixer).
    if (j["layer_types"].is_array())
      for (const auto& t : j["layer_types"])
        SSM_CHECK(!t.is_string() || t == "linear_attention" || t == "full_attention",
                  "config.json: \"layer_types\" entry {} is not a {} layer type (linear_attention or full_attention)",
                  json_excerpt(t), family);
    for (const std::string& t : read_layer_types(j, cfg.num_hidden_layers, "linear_attention"))
      kinds.push_back(t == "attention" ? "attention" : "gated_delta");
    return kinds;
  }
  const int interval = param_int(j, "full_attention_interval", 4);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) kinds.push_back((l + 1) % interval == 0 ? "attention" : "gated_delta");
  return kinds;
}

/// The fields every Qwen family shares: mixers, norms, attention and DeltaNet parameters. `prefix` is the text
/// decoder's ("model." or "model.language_model.").
DecoderSpec qwen_common(const ModelConfig& cfg, const char* label, const std::string& prefix, const char* projection_layout) {
  const nlohmann::json& j = cfg.raw;
  SSM_CHECK(!param_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported for {}", label);
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu", "config.json: hidden_act \"{}\" is not supported for {} (silu)", act, label);
  DecoderSpec s;
  s.label = label;
  s.embedding = prefix + "embed_tokens.weight";
  s.final_norm = prefix + "norm.weight";
  s.tie_word_embeddings = tie_word_embeddings_or(cfg, false);
  s.norm_eps = param_float(j, {"rms_norm_eps"}, 1e-6f);
  s.norm_weight_offset = 1.0f;
  s.ignored_tensor_prefixes = {"mtp.", "model.visual.", "visual."};
  nlohmann::json attn = j;
  // transformers' Qwen3_5TextConfig / Qwen3NextConfig default head_dim to 256 (not hidden_size / heads).
  if (!attn.contains("head_dim") || attn["head_dim"].is_null()) attn["head_dim"] = 256;
  attn["attn_output_gate"] = param_bool(j, "attn_output_gate", true);
  attn["qk_norm"] = true;
  attn["qk_norm_weight_offset"] = 1.0;
  attn["rms_norm_eps"] = s.norm_eps;
  s.module_params["attention"] = attn;
  s.module_params["gated_delta"] = with_field(j, "projection_layout", projection_layout);
  s.chunk_size = 64;  // the DeltaNet prefill's chunk (metadata chunk length)
  return s;
}

nlohmann::json qwen_moe_params(const nlohmann::json& j, bool renormalize) {
  return {{"num_local_experts", param_int(j, "num_experts", -1)},
          {"num_experts_per_tok", param_int(j, "num_experts_per_tok", -1)},
          {"intermediate_size", param_int(j, "moe_intermediate_size", -1)},
          {"hidden_act", "silu"},
          {"norm_topk_prob", renormalize},
          {"moe_layout", "qwen"},
          {"shared_intermediate_size", param_int(j, "shared_expert_intermediate_size", 0)},
          {"shared_prefix", "shared_expert."},
          {"shared_expert_gate", true}};
}

}  // namespace

DecoderSpec qwen3_5_spec(const ModelConfig& cfg) {
  const bool wrapper = cfg.architecture.find("ForConditionalGeneration") != std::string::npos;
  const bool moe = cfg.architecture.find("Moe") != std::string::npos;
  const char* label = moe ? "Qwen3.5-MoE" : "Qwen3.5";
  const std::string prefix = wrapper ? "model.language_model." : "model.";
  DecoderSpec s = qwen_common(cfg, label, prefix, "qwen3_5");
  const nlohmann::json& j = cfg.raw;
  if (moe) s.module_params["moe"] = qwen_moe_params(j, true);  // Qwen3.5's router always renormalizes its top-k
  else s.module_params["mlp"] = {{"intermediate_size", param_int(j, "intermediate_size", -1)}, {"hidden_act", "silu"}};
  const std::vector<std::string> kinds = qwen_mixer_kinds(cfg, label);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", prefix, l);
    const bool delta = kinds[static_cast<size_t>(l)] == "gated_delta";
    LayerSpec layer;
    layer.mixer = {kinds[static_cast<size_t>(l)], p + "input_layernorm.weight", p + (delta ? "linear_attn." : "self_attn.")};
    layer.ffn = {moe ? "moe" : "mlp", p + "post_attention_layernorm.weight", p + "mlp."};
    s.layers.push_back(layer);
  }
  return s;
}

DecoderSpec qwen3_next_spec(const ModelConfig& cfg) {
  const char* label = "Qwen3-Next";
  DecoderSpec s = qwen_common(cfg, label, "model.", "qwen3_next");
  const nlohmann::json& j = cfg.raw;
  const int experts = param_int(j, "num_experts", 0);
  const int sparse_step = param_int(j, "decoder_sparse_step", 1);
  std::vector<int> mlp_only;
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    SSM_CHECK(j["mlp_only_layers"].is_array(), "config.json: mlp_only_layers must be a list of layer indices");
    for (const auto& v : j["mlp_only_layers"]) {
      SSM_CHECK(v.is_number_integer(), "config.json: mlp_only_layers must be a list of layer indices");
      mlp_only.push_back(v.get<int>());
    }
  }
  if (experts > 0) s.module_params["moe"] = qwen_moe_params(j, param_bool(j, "norm_topk_prob", true));
  s.module_params["mlp"] = {{"intermediate_size", param_int(j, "intermediate_size", -1)}, {"hidden_act", "silu"}};
  const std::vector<std::string> kinds = qwen_mixer_kinds(cfg, label);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const bool delta = kinds[static_cast<size_t>(l)] == "gated_delta";
    // transformers' Qwen3NextDecoderLayer: MoE unless the layer is in mlp_only_layers, when experts exist and
    // (l + 1) % decoder_sparse_step == 0.
    const bool sparse = std::find(mlp_only.begin(), mlp_only.end(), l) == mlp_only.end() && experts > 0 && (l + 1) % sparse_step == 0;
    LayerSpec layer;
    layer.mixer = {kinds[static_cast<size_t>(l)], p + "input_layernorm.weight", p + (delta ? "linear_attn." : "self_attn.")};
    layer.ffn = {sparse ? "moe" : "mlp", p + "post_attention_layernorm.weight", p + "mlp."};
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
