// Owns the lightning-attention mixer (MiniMax's linear attention, transformers' MiniMaxLightningAttention,
// vllm-ssm-design.md §5.3): SiLU(qkv_proj x) -> per-head decayed linear-attention recurrence on a [H, D, D] fp32
// state -> RMSNorm over all heads (eps 1e-6) -> sigmoid(output_gate x) gate -> out_proj.
#pragma once
#include <memory>
#include <vector>

#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Per-head decay slopes of decoder layer `layer` of `num_layers`, as transformers computes them:
/// s_h = (1 / 2^(8/H))^(h+1) * (1 - layer / (L - 1 + 1e-5) + 1e-5). Returns [num_heads].
std::vector<float> lightning_slopes(int num_heads, int layer, int num_layers);

/// Lightning hyperparameters: num_attention_heads, head_dim (hidden / heads), block_size (256).
struct LightningConfig {
  int num_heads = 0, head_dim = 0, block_size = 256;
  /// Reads and validates them from `j`; throws Error naming the field.
  static LightningConfig from_json(const nlohmann::json& j, const ModelConfig& cfg);
};

/// One lightning layer's parameters at full size (HD = heads x head_dim).
struct LightningWeights {
  Weight qkv_proj;          ///< [3 HD, hidden]: per head q | k | v
  Weight output_gate;       ///< [HD, hidden]
  Weight out_proj;          ///< [hidden, HD]
  std::vector<float> norm;  ///< [HD]
};

/// Reads `prefix`{qkv_proj, output_gate, out_proj, norm} (or dummy values seeded per name); the decay buffers
/// transformers 5 may save are marked known (recomputed in fp32 from the config). Throws Error naming a tensor.
LightningWeights read_lightning_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const LightningConfig& c);

/// The registry's factory ("lightning"): hyperparameters num_attention_heads, head_dim (hidden / heads), block_size
/// (256); weights `prefix`{qkv_proj, output_gate, out_proj, norm}; rank tp.rank's heads (H / tp), the norm over all
/// heads after an all-gather and out_proj split by output rows (dist/gathered_linear.h). Throws Error on a bad
/// field or tensor, or when tp does not divide the heads.
std::unique_ptr<CpuModule> make_lightning_mixer(const ModuleArgs& args);

}  // namespace ssmserve
