// Owns the Granite-4.0-H (GraniteMoeHybridForCausalLM) and Bamba (BambaForCausalLM) mappings (see hybrids.h).
#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"
#include "model/archs/hybrid_fields.h"
#include "model/archs/hybrids.h"
#include "model/decoder/layer_types.h"
#include "model/decoder/params.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {

std::vector<std::string> mamba_hybrid_layer_types(const ModelConfig& cfg, const char* family,
                                                  std::initializer_list<const char*> allowed) {
  std::vector<std::string> types = read_layer_types(cfg.raw, cfg.num_hidden_layers, "mamba");
  for (size_t l = 0; l < types.size(); ++l) {
    std::string& t = types[l];
    if (t == "linear_attention") t = "mamba";  // transformers 5.x spells a Mamba layer "linear_attention"
    const bool ok = t == "mamba" || t == "attention" || std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return t == a; }) != allowed.end();
    SSM_CHECK(ok, "config.json: layer {} is a \"{}\" layer, which {} does not have", l, t, family);
  }
  return types;
}

namespace {

void check_attention_fields(const nlohmann::json& j, const char* family) {
  SSM_CHECK(!param_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported for {}", family);
}

}  // namespace

DecoderSpec granitemoehybrid_spec(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  const std::vector<std::string> types = mamba_hybrid_layer_types(cfg, "Granite-4.0-H");
  check_attention_fields(j, "Granite-4.0-H");
  DecoderSpec s;
  s.label = "Granite-4.0-H";
  s.embedding = "model.embed_tokens.weight";
  s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = tie_word_embeddings_or(cfg, false);
  s.norm_eps = cfg.layer_norm_epsilon;
  s.embedding_multiplier = param_float(j, {"embedding_multiplier"}, 1.0f);
  s.logits_scaling = param_float(j, {"logits_scaling"}, 1.0f);
  SSM_CHECK(s.logits_scaling != 0.0f, "config.json: logits_scaling must not be 0");
  const float residual = param_float(j, {"residual_multiplier"}, 1.0f);
  const int experts = j.contains("num_local_experts") && j["num_local_experts"] == 0 ? 0 : param_int(j, "num_local_experts", 8);
  const int shared = param_int(j, "shared_intermediate_size", 1024);
  const std::string act = param_string(j, "hidden_act", "silu");
  s.module_params["mamba2"] = mamba2_params_from_prefixed(cfg);
  const std::string pos = param_string(j, "position_embedding_type", "");
  SSM_CHECK(pos.empty() || pos == "rope" || pos == "nope", "config.json: position_embedding_type \"{}\" is not supported (rope, nope)",
            text_excerpt(pos));
  s.module_params["attention"] = with_field(j, "position_embedding_type", pos == "rope" ? "rope" : "nope");
  if (experts > 0)
    s.module_params["moe"] = {{"num_local_experts", experts}, {"num_experts_per_tok", param_int(j, "num_experts_per_tok", 2)},
                            {"intermediate_size", param_int(j, "intermediate_size", -1)}, {"hidden_act", act},
                            {"moe_layout", "granite"}, {"shared_intermediate_size", shared}, {"shared_prefix", "shared_mlp."}};
  s.module_params["mlp"] = {{"intermediate_size", shared}, {"hidden_act", act}, {"mlp_layout", "input_linear"}};
  s.chunk_size = Mamba2Config::from_json(s.module_params["mamba2"], cfg).chunk_size;  // validates the Mamba-2 fields
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const bool mamba = types[static_cast<size_t>(l)] == "mamba";
    LayerSpec layer;
    layer.mixer = {mamba ? "mamba2" : "attention", p + "input_layernorm.weight", p + (mamba ? "mamba." : "self_attn."), 1.0f, residual};
    layer.ffn = experts > 0 ? SublayerSpec{"moe", p + "post_attention_layernorm.weight", p, 1.0f, residual}
                            : SublayerSpec{"mlp", p + "post_attention_layernorm.weight", p + "shared_mlp.", 1.0f, residual};
    s.layers.push_back(layer);
  }
  return s;
}

DecoderSpec bamba_spec(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  const std::vector<std::string> types = mamba_hybrid_layer_types(cfg, "Bamba");
  check_attention_fields(j, "Bamba");
  DecoderSpec s;
  s.label = "Bamba";
  s.embedding = "model.embed_tokens.weight";
  s.final_norm = "model.final_layernorm.weight";
  s.tie_word_embeddings = tie_word_embeddings_or(cfg, false);
  s.norm_eps = cfg.layer_norm_epsilon;
  s.module_params["mamba2"] = mamba2_params_from_prefixed(cfg);
  s.module_params["attention"] = with_field(j, "partial_rotary_factor", 0.5);  // transformers' BambaConfig hard-codes it
  s.chunk_size = Mamba2Config::from_json(s.module_params["mamba2"], cfg).chunk_size;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const bool mamba = types[static_cast<size_t>(l)] == "mamba";
    LayerSpec layer;
    layer.mixer = {mamba ? "mamba2" : "attention", p + "input_layernorm.weight", p + (mamba ? "mamba." : "self_attn.")};
    layer.ffn = {"mlp", p + "pre_ff_layernorm.weight", p + "feed_forward."};
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
