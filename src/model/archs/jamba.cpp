// Owns the Jamba (JambaForCausalLM) mapping (see hybrids.h).
#include <fmt/format.h>

#include "core/error.h"
#include "model/archs/hybrid_fields.h"
#include "model/archs/hybrids.h"
#include "model/decoder/layer_types.h"
#include "model/decoder/params.h"

namespace ssmserve {

DecoderSpec jamba_spec(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  const int L = cfg.num_hidden_layers;
  // transformers' JambaConfig defaults: attention every 8th layer from 4, experts every 2nd from 1.
  nlohmann::json lt = j;
  if (!lt.contains("layers_block_type") && !lt.contains("layer_types")) {
    if (!lt.contains("attn_layer_period")) lt["attn_layer_period"] = 8;
    if (!lt.contains("attn_layer_offset")) lt["attn_layer_offset"] = 4;
  }
  if (!lt.contains("expert_layer_period")) lt["expert_layer_period"] = 2;
  if (!lt.contains("expert_layer_offset")) lt["expert_layer_offset"] = 1;
  if (!lt.contains("num_experts")) lt["num_experts"] = 16;
  ModelConfig layout = cfg;
  layout.raw = lt;
  const std::vector<std::string> types = mamba_hybrid_layer_types(layout, "Jamba");
  const std::vector<bool> moe = read_moe_layers(lt, L);
  DecoderSpec s;
  s.label = "Jamba";
  s.embedding = "model.embed_tokens.weight";
  s.final_norm = "model.final_layernorm.weight";
  s.tie_word_embeddings = tie_word_embeddings_or(cfg, false);
  s.norm_eps = cfg.layer_norm_epsilon;
  s.module_params["mamba1"] = mamba1_params_from_prefixed(cfg);
  s.module_params["attention"] = with_field(j, "position_embedding_type", "nope");
  const std::string act = param_string(j, "hidden_act", "silu");
  const int I = param_int(j, "intermediate_size", -1);
  s.module_params["mlp"] = {{"intermediate_size", I}, {"hidden_act", act}};
  s.module_params["moe"] = {{"num_local_experts", param_int(lt, "num_experts", 16)},
                            {"num_experts_per_tok", param_int(j, "num_experts_per_tok", 2)},
                            {"intermediate_size", I},
                            {"hidden_act", act},
                            {"norm_topk_prob", false},
                            {"moe_layout", "jamba"}};
  for (int l = 0; l < L; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const bool mamba = types[static_cast<size_t>(l)] == "mamba";
    LayerSpec layer;
    layer.mixer = {mamba ? "mamba1" : "attention", p + "input_layernorm.weight", p + (mamba ? "mamba." : "self_attn.")};
    layer.ffn = {moe[static_cast<size_t>(l)] ? "moe" : "mlp", p + "pre_ff_layernorm.weight", p + "feed_forward."};
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
