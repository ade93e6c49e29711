// Owns the Gated DeltaNet mixer (Yang, Kautz & Hatamizadeh 2024; transformers' Qwen3_5GatedDeltaNet and
// Qwen3NextGatedDeltaNet; vLLM's gdn_linear_attn.py): in_proj -> [q | k | v] through a causal depthwise conv1d + SiLU,
// q and k L2-normalised per head (q times 1/sqrt(Dk)), g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), the
// gated delta rule (kernels/cpu/gated_delta.h) on a [Hv, Dk, Dv] fp32 state per request, an RMSNorm per value head
// gated by silu(z) (norm before gate), out_proj.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Gated DeltaNet hyperparameters (transformers' field names): linear_num_key_heads (Hk), linear_num_value_heads (Hv, a
/// multiple of Hk), linear_key_head_dim (Dk), linear_value_head_dim (Dv), linear_conv_kernel_dim (4), rms_norm_eps
/// (1e-6), hidden_act ("silu" only), chunk_size (64: the prefill's chunk length), and the module's own
/// `projection_layout`: "qwen3_5" (in_proj_qkv / in_proj_z / in_proj_b / in_proj_a) or "qwen3_next" (in_proj_qkvz /
/// in_proj_ba, rows grouped per key head).
struct GatedDeltaConfig {
  int num_k_heads = 0, num_v_heads = 0, head_k_dim = 0, head_v_dim = 0, conv_kernel = 4, chunk_size = 64;
  float eps = 1e-6f;
  std::string projection_layout = "qwen3_5";
  int64_t key_dim() const { return int64_t{num_k_heads} * head_k_dim; }
  int64_t value_dim() const { return int64_t{num_v_heads} * head_v_dim; }
  /// Conv channels: [q (key_dim) | k (key_dim) | v (value_dim)].
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
  /// Rows of the stacked input projection: [q | k | v | z (value_dim) | b (Hv) | a (Hv)].
  int64_t proj_rows() const { return conv_dim() + value_dim() + 2 * int64_t{num_v_heads}; }
  /// Reads and validates them from `j`; throws Error naming the field.
  static GatedDeltaConfig from_json(const nlohmann::json& j, const ModelConfig& cfg);
};

/// One Gated DeltaNet layer's parameters at full size, in the math's order (whatever the checkpoint layout).
struct GatedDeltaWeights {
  Weight in_proj;                  ///< [proj_rows, hidden]: q | k | v | z | b | a
  std::vector<float> conv_weight;  ///< [conv_dim, K]
  std::vector<float> A_log;        ///< [Hv] (the decay rate is -exp(A_log), formed in fp32 by each backend)
  std::vector<float> dt_bias;      ///< [Hv]
  std::vector<float> norm;         ///< [Dv] the gated RMSNorm's weight (plain w, shared by every value head)
  Weight out_proj;                 ///< [hidden, value_dim]
};

/// Reads `prefix`{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a | in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias,
/// norm, out_proj} (or dummy values seeded per name), putting Qwen3-Next's per-key-head groups
/// [q_i | k_i | v_i (r heads) | z_i (r heads)] and [b_i (r) | a_i (r)] (r = Hv / Hk) into the stacked order.
/// Throws Error naming a missing / misshapen tensor.
GatedDeltaWeights read_gated_delta_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const GatedDeltaConfig& c);

/// The rows of the stacked in_proj (and, for the first conv_dim of them, the conv channels) that rank `rank` of
/// `world` owns, in stacked order: its key heads' q and k, its value heads' v, z, b and a. Throws Error when world does
/// not divide Hk.
std::vector<std::pair<int64_t, int64_t>> gated_delta_rank_rows(const GatedDeltaConfig& c, int rank, int world);

/// What one layer keeps per request: conv [K-1, conv_dim] and the state [Hv, Dk, Dv] of this rank's heads.
ModuleStateSpec gated_delta_state_spec(const GatedDeltaConfig& shard, const GatedDeltaConfig& full);

/// The registry's factory ("gated_delta"): rank tp.rank's heads (Hk / tp key heads with their Hv / tp value heads),
/// out_proj split by output rows over the all-gathered normed heads (dist/gathered_linear.h). Throws Error on a bad
/// field or tensor, or when tp does not divide Hk.
std::unique_ptr<CpuModule> make_gated_delta_mixer(const ModuleArgs& args);

}  // namespace ssmserve
