// Owns the Falcon-H1 (FalconH1ForCausalLM) mapping (see hybrids.h): every layer runs a Mamba-2 mixer and RoPE
// attention in parallel on the same normed input (a parallel_mixer sublayer), then a SiLU-gated MLP; muP multipliers
// on the embedding, the Mamba-2 projections (ssm_multipliers, ssm_in / ssm_out), the attention (in, key, out), the
// MLP (mlp_multipliers) and the LM head (lm_head_multiplier).
#include <fmt/format.h>

#include "config/hf_json.h"
#include "core/error.h"
#include "model/archs/hybrid_fields.h"
#include "model/archs/hybrids.h"
#include "model/decoder/params.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {
namespace {

std::vector<float> multipliers(const nlohmann::json& j, const char* field, size_t n) {
  std::vector<float> out(n, 1.0f);
  if (!j.contains(field) || j[field].is_null()) return out;
  SSM_CHECK(j[field].is_array() && j[field].size() == n, "config.json: {} must list {} numbers", field, n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(config_float(j[field][i], field));
  return out;
}

}  // namespace

DecoderSpec falcon_h1_spec(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  SSM_CHECK(!param_bool(j, "projectors_bias", false), "config.json: projectors_bias true is not supported for Falcon-H1");
  DecoderSpec s;
  s.label = "Falcon-H1";
  s.embedding = "model.embed_tokens.weight";
  s.final_norm = "model.final_layernorm.weight";
  s.tie_word_embeddings = tie_word_embeddings_or(cfg, false);
  s.norm_eps = cfg.layer_norm_epsilon;
  s.embedding_multiplier = param_float(j, {"embedding_multiplier"}, 1.0f);
  const float lm_head = param_float(j, {"lm_head_multiplier"}, 1.0f);
  SSM_CHECK(lm_head != 0.0f, "config.json: lm_head_multiplier must not be 0");
  s.logits_scaling = 1.0f / lm_head;
  const int d_ssm = j.contains("mamba_d_ssm") && !j["mamba_d_ssm"].is_null() ? param_int(j, "mamba_d_ssm", -1) : 0;
  nlohmann::json m2 = mamba2_params_from_prefixed(cfg, d_ssm);
  m2["rms_norm"] = param_bool(j, "mamba_rms_norm", false);
  m2["norm_before_gate"] = param_bool(j, "mamba_norm_before_gate", true);
  const std::vector<float> ssm = multipliers(j, "ssm_multipliers", 5);
  m2["ssm_multipliers"] = ssm;
  m2["ssm_in_multiplier"] = param_float(j, {"ssm_in_multiplier"}, 1.0f);
  s.module_params["mamba2"] = m2;
  s.chunk_size = Mamba2Config::from_json(m2, cfg).chunk_size;
  nlohmann::json attn = j;
  attn["position_embedding_type"] = "rope";
  attn.erase("attention_multiplier");  // the scale is head_dim^-0.5
  s.module_params["attention"] = attn;
  const std::vector<float> mlp = multipliers(j, "mlp_multipliers", 2);
  s.module_params["mlp"] = {{"intermediate_size", param_int(j, "intermediate_size", -1)},
                            {"hidden_act", param_string(j, "hidden_act", "silu")},
                            {"mlp_bias", param_bool(j, "mlp_bias", false)},
                            {"mlp_gate_multiplier", mlp[0]},
                            {"mlp_down_multiplier", mlp[1]}};
  const float ssm_out = param_float(j, {"ssm_out_multiplier"}, 1.0f), attn_out = param_float(j, {"attention_out_multiplier"}, 1.0f);
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerSpec layer;
    layer.mixer = {"mamba2", p + "input_layernorm.weight", p + "mamba.", 1.0f, ssm_out};
    layer.parallel_mixer = {"attention", "", p + "self_attn.", 1.0f, attn_out, false, true};
    layer.ffn = {"mlp", p + "pre_ff_layernorm.weight", p + "feed_forward."};
    s.layers.push_back(layer);
  }
  return s;
}

}  // namespace ssmserve
