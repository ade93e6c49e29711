// Owns the Mamba hybrids' shared field mappings (see hybrid_fields.h).
#include "model/archs/hybrid_fields.h"

#include "config/hf_json.h"
#include "core/error.h"
#include "model/decoder/params.h"

namespace ssmserve {
namespace {

bool has(const nlohmann::json& j, const char* f) { return j.contains(f) && !j[f].is_null(); }

}  // namespace

nlohmann::json mamba2_params_from_prefixed(const ModelConfig& cfg, int d_ssm) {
  const nlohmann::json& j = cfg.raw;
  const int heads = param_int(j, "mamba_n_heads", 128);
  const int expand = param_int(j, "mamba_expand", 2);
  const int64_t d_inner = d_ssm > 0 ? d_ssm : int64_t{expand} * cfg.hidden_size;
  int head_dim = 0;
  if (has(j, "mamba_d_head") && j["mamba_d_head"].is_string()) {
    SSM_CHECK(j["mamba_d_head"] == "auto", "config.json: mamba_d_head must be an integer or \"auto\" (got {})", json_excerpt(j["mamba_d_head"]));
  } else if (has(j, "mamba_d_head")) {
    head_dim = param_int(j, "mamba_d_head", -1);
  }
  if (head_dim == 0) {
    SSM_CHECK(d_inner % heads == 0, "config.json: mamba_n_heads {} must divide the Mamba-2 inner size {}", heads, d_inner);
    head_dim = static_cast<int>(d_inner / heads);
  }
  SSM_CHECK(int64_t{head_dim} * heads == d_inner,
            "config.json: mamba_n_heads {} x mamba_d_head {} must equal the Mamba-2 inner size {} ({})", heads, head_dim, d_inner,
            d_ssm > 0 ? "mamba_d_ssm" : "mamba_expand x hidden_size");
  nlohmann::json p = {
      {"num_heads", heads},
      {"head_dim", head_dim},
      {"state_size", param_int(j, "mamba_d_state", 256)},
      {"n_groups", param_int(j, "mamba_n_groups", 1)},
      {"conv_kernel", param_int(j, "mamba_d_conv", 4)},
      {"chunk_size", param_int(j, "mamba_chunk_size", 256)},
      {"use_conv_bias", param_bool(j, "mamba_conv_bias", true)},
      {"use_bias", param_bool(j, "mamba_proj_bias", false)},
  };
  if (has(j, "time_step_limit")) p["time_step_limit"] = j["time_step_limit"];
  return p;
}

nlohmann::json mamba1_params_from_prefixed(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  nlohmann::json p = {
      {"state_size", param_int(j, "mamba_d_state", 16)},
      {"conv_kernel", param_int(j, "mamba_d_conv", 4)},
      {"expand", param_int(j, "mamba_expand", 2)},
      {"use_conv_bias", param_bool(j, "mamba_conv_bias", true)},
      {"use_bias", param_bool(j, "mamba_proj_bias", false)},
      {"inner_layernorms", true},
      {"inner_layernorm_eps", cfg.layer_norm_epsilon},
  };
  if (has(j, "mamba_dt_rank")) p["time_step_rank"] = j["mamba_dt_rank"];
  if (has(j, "hidden_act")) p["hidden_act"] = j["hidden_act"];
  return p;
}

bool tie_word_embeddings_or(const ModelConfig& cfg, bool family_default) {
  return param_bool(cfg.raw, "tie_word_embeddings", family_default);
}

nlohmann::json with_field(nlohmann::json j, const char* field, nlohmann::json value) {
  j[field] = std::move(value);
  return j;
}

}  // namespace ssmserve
