// Owns the Nemotron-H (NemotronHForCausalLM) mapping (see hybrids.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/archs/hybrid_fields.h"
#include "model/archs/hybrids.h"
#include "model/decoder/params.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {

namespace {

/// Nemotron-H's per-layer types. transformers 5.x writes layers_block_type; NVIDIA's remote-code NemotronHConfig keeps
/// hybrid_override_pattern and also derives a `layer_types` list for the cache, in which an MLP layer ("-") is
/// tagged "moe": that list is read only when neither of the others is there. When both layers_block_type and the
/// pattern are given they must agree (one of them is wrong otherwise, and picking one would build another model).
std::vector<std::string> nemotron_h_layer_types(const ModelConfig& cfg) {
  const auto has = [&](const char* k) { return cfg.raw.contains(k) && !cfg.raw[k].is_null(); };
  if (!has("layers_block_type") && !has("hybrid_override_pattern"))
    return mamba_hybrid_layer_types(cfg, "Nemotron-H", {"mlp", "moe"});
  ModelConfig view = cfg;
  view.raw.erase("layer_types");
  if (!has("layers_block_type") || !has("hybrid_override_pattern"))
    return mamba_hybrid_layer_types(view, "Nemotron-H", {"mlp", "moe"});
  const std::vector<std::string> listed = mamba_hybrid_layer_types(view, "Nemotron-H", {"mlp", "moe"});
  view.raw.erase("layers_block_type");
  const std::vector<std::string> pattern = mamba_hybrid_layer_types(view, "Nemotron-H", {"mlp", "moe"});
  for (size_t l = 0; l < listed.size(); ++l)
    SSM_CHECK(listed[l] == pattern[l], "config.json: \"layers_block_type\" and \"hybrid_override_pattern\" disagree at "
              "layer {} ({} vs {})", l, listed[l], pattern[l]);
  return listed;
}

}  // namespace

DecoderSpec nemotron_h_spec(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  const std::vector<std::string> types = nemotron_h_layer_types(cfg);
  SSM_CHECK(!j.contains("moe_latent_size") || j["moe_latent_size"].is_null(),
            "config.json: moe_latent_size (latent MoE projections) is not supported yet");
  SSM_CHECK(param_string(j, "mamba_hidden_act", "silu") == "silu", "config.json: mamba_hidden_act must be \"silu\"");
  SSM_CHECK(!param_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported for Nemotron-H");
  DecoderSpec s;
  s.label = "Nemotron-H";
  s.embedding = "backbone.embeddings.weight";
  s.final_norm = "backbone.norm_f.weight";
  s.tie_word_embeddings = false;  // transformers' NemotronHForCausalLM ties nothing: lm_head is always its own tensor
  s.norm_eps = cfg.layer_norm_epsilon;
  // Mamba-2: transformers' NemotronHMamba2Mixer clamps dt to [time_step_min, inf) whatever time_step_limit says.
  const float dt_min = param_float(j, {"time_step_min"}, 0.001f);
  nlohmann::json m2 = {{"num_heads", param_int(j, "mamba_num_heads", 128)}, {"head_dim", param_int(j, "mamba_head_dim", 64)},
                       {"state_size", param_int(j, "ssm_state_size", 128)},  {"n_groups", param_int(j, "n_groups", 8)},
                       {"conv_kernel", param_int(j, "conv_kernel", 4)},      {"chunk_size", param_int(j, "chunk_size", 128)},
                       {"use_conv_bias", param_bool(j, "use_conv_bias", true)}, {"use_bias", param_bool(j, "use_bias", false)},
                       {"time_step_limit", nlohmann::json::array({dt_min, INFINITY})}};
  s.module_params["mamba2"] = m2;
  s.chunk_size = Mamba2Config::from_json(m2, cfg).chunk_size;
  s.module_params["attention"] = with_field(j, "position_embedding_type", "nope");
  const std::string act = param_string(j, "mlp_hidden_act", "relu2");
  s.module_params["mlp"] = {{"intermediate_size", param_int(j, "intermediate_size", -1)}, {"hidden_act", act},
                            {"mlp_bias", param_bool(j, "mlp_bias", false)}};
  if (std::find(types.begin(), types.end(), "moe") != types.end()) {
    SSM_CHECK(!param_bool(j, "mlp_bias", false), "config.json: mlp_bias true is not supported for Nemotron-H MoE layers");
    const int n_shared = j.contains("n_shared_experts") && j["n_shared_experts"] == 0 ? 0 : param_int(j, "n_shared_experts", 1);
    s.module_params["moe"] = {{"num_local_experts", param_int(j, "n_routed_experts", 8)},
                              {"num_experts_per_tok", param_int(j, "num_experts_per_tok", 2)},
                              {"intermediate_size", param_int(j, "moe_intermediate_size", -1)},
                              {"hidden_act", act},
                              {"scoring_func", "sigmoid"},
                              {"norm_topk_prob", param_bool(j, "norm_topk_prob", true)},
                              {"routed_scaling_factor", param_float(j, {"routed_scaling_factor"}, 1.0f)},
                              {"n_group", param_int(j, "n_group", 1)},
                              {"topk_group", param_int(j, "topk_group", 1)},
                              {"moe_layout", "nemotron"},
                              {"shared_intermediate_size", n_shared > 0 ? param_int(j, "moe_shared_expert_intermediate_size", -1) : 0},
                              {"shared_prefix", "shared_experts."}};
  }
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("backbone.layers.{}.", l);
    const std::string& t = types[static_cast<size_t>(l)];
    LayerSpec layer;
    SublayerSpec sub{t == "mamba" ? "mamba2" : t, p + "norm.weight", p + "mixer."};
    if (t == "mlp" || t == "moe") layer.ffn = sub;
    else layer.mixer = sub;
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
