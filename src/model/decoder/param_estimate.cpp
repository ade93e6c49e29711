// Owns estimate_param_count (see param_estimate.h).
#include "model/decoder/param_estimate.h"

#include "model/ffns/mlp_ffn.h"
#include "model/ffns/moe_ffn.h"
#include "model/mixers/attention_mixer.h"
#include "model/mixers/gated_delta_mixer.h"
#include "model/mixers/lightning_mixer.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {
namespace {

double mlp_params(double H, const MlpConfig& m) { return (m.gated ? 3.0 : 2.0) * H * m.intermediate_size; }

double module_params(const ModelConfig& cfg, const std::string& kind, const nlohmann::json& j) {
  const double H = cfg.hidden_size;
  if (kind == "mamba1") {
    const MambaConfig m = MambaConfig::from_json(j, cfg.hidden_size);
    const double I = m.d_inner, N = m.d_state, R = m.dt_rank;
    return 2 * I * H + I * m.d_conv + (R + 2 * N) * I + I * R + 2 * I + I * N + H * I;
  }
  if (kind == "mamba2") {
    const Mamba2Config m = Mamba2Config::from_json(j, cfg);
    const double I = m.d_inner, C = m.conv_dim(), NH = m.num_heads;
    return (I + C + NH) * H + C * m.d_conv + 3 * NH + I + H * I;
  }
  if (kind == "lightning") {
    const LightningConfig l = LightningConfig::from_json(j, cfg);
    const double HD = static_cast<double>(l.num_heads) * l.head_dim;
    return 5 * HD * H + HD;
  }
  if (kind == "gated_delta") {
    const GatedDeltaConfig g = GatedDeltaConfig::from_json(j, cfg);
    return static_cast<double>(g.proj_rows()) * H + static_cast<double>(g.conv_dim()) * g.conv_kernel + 2.0 * g.num_v_heads +
           g.head_v_dim + H * static_cast<double>(g.value_dim());
  }
  if (kind == "attention") {
    const AttentionConfig a = AttentionConfig::from_json(j, cfg);
    const double D = a.head_dim;
    return ((a.attn_output_gate ? 3.0 : 2.0) * a.num_heads + 2.0 * a.num_kv_heads) * D * H + (a.qk_norm ? 2.0 * D : 0.0);
  }
  if (kind == "mlp") return mlp_params(H, MlpConfig::from_json(j));
  if (kind == "moe") {
    const MoeConfig m = MoeConfig::from_json(j);
    double n = static_cast<double>(m.num_experts) * (H + (m.gated ? 3.0 : 2.0) * H * m.intermediate_size);
    if (m.shared_intermediate_size > 0) n += mlp_params(H, MlpConfig::from_json(shared_mlp_params(m)));
    if (m.shared_expert_gate) n += H;
    return n;
  }
  return 0.0;  // a kind this estimate does not know: not counted
}

}  // namespace

double estimate_param_count(const ModelConfig& cfg, const DecoderSpec& spec) {
  const double H = cfg.hidden_size, V = cfg.vocab_size;
  double n = V * H * (spec.tie_word_embeddings ? 1 : 2) + H;
  std::map<std::string, double> per_kind;  // each kind's hyperparameters are per model, not per layer
  for (const LayerSpec& l : spec.layers)
    for (const SublayerSpec* s : l.sublayers()) {
      if (!s->present()) continue;
      auto it = per_kind.find(s->kind);
      if (it == per_kind.end()) it = per_kind.emplace(s->kind, module_params(cfg, s->kind, spec.params(s->kind, cfg))).first;
      n += it->second + (s->parallel ? 0 : H);
    }
  return n;
}

}  // namespace ssmserve
