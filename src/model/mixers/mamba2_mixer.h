// Owns the Mamba-2 mixer (transformers' Mamba2Mixer, vllm-ssm-design.md §5.2): in_proj -> [z | xBC | dt]; causal
// conv1d + SiLU over xBC; SSD scan per head (B, C shared per group); gated RMSNorm (norm(y * silu(z)) per group, or
// norm-before-gate); out_proj. Its hyperparameters, its weight reader (shared with the GPU runner) and its factory.
#pragma once
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/model_config.h"
#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Mamba-2 mixer hyperparameters (HF `Mamba2Config` names in comments).
struct Mamba2Config {
  int d_inner = 0;          ///< expand * hidden_size (= num_heads * head_dim)
  int num_heads = 0;        ///< H
  int head_dim = 0;         ///< P
  int d_state = 0;          ///< state_size, N
  int n_groups = 1;         ///< G: heads H/G share B and C
  int d_conv = 4;           ///< conv_kernel
  int chunk_size = 256;
  bool use_bias = false;
  bool use_conv_bias = true;
  bool norm_before_gate = false;
  bool rms_norm = true;     ///< the gated RMSNorm (Falcon-H1's mamba_rms_norm false: y * silu(z), no norm weight)
  /// Falcon-H1's muP: in_proj's output sections z, x, B, C, dt scaled by ssm_multipliers[0..4] and its input by
  /// ssm_in_multiplier (both folded into in_proj's rows at load; in_proj must then have no bias).
  std::array<float, 5> ssm_multipliers = {1, 1, 1, 1, 1};
  float ssm_in_multiplier = 1.0f;
  float time_step_min_limit = 0.0f;          ///< time_step_limit[0]
  float time_step_max_limit = INFINITY;      ///< time_step_limit[1]
  int conv_dim() const { return d_inner + 2 * n_groups * d_state; }

  /// Reads and validates the Mamba-2 fields of config.json; throws Error naming the field.
  static Mamba2Config from_json(const ModelConfig& cfg);
  /// Same, from the fields in `j` (an architecture's mapped Mamba-2 parameters) with cfg's hidden_size.
  static Mamba2Config from_json(const nlohmann::json& j, const ModelConfig& cfg);
};

/// Parameters of one Mamba-2 mixer layer (I = d_inner, H = heads, C = conv_dim, K = d_conv).
struct Mamba2LayerWeights {
  std::vector<float> norm;          ///< [hidden] pre-norm (read_mamba2_layer only)
  Weight in_proj;                   ///< [I + C + H, hidden]: z, xBC, dt
  std::vector<float> in_proj_bias;  ///< or empty
  std::vector<float> conv_weight;   ///< [C, K]
  std::vector<float> conv_bias;     ///< [C] or empty
  std::vector<float> dt_bias;       ///< [H]
  std::vector<float> A;             ///< [H] = -exp(A_log)
  std::vector<float> D;             ///< [H]
  std::vector<float> gate_norm;     ///< [I] gated RMSNorm weight (empty without rms_norm)
  Weight out_proj;                  ///< [hidden, I]
  std::vector<float> out_proj_bias; ///< or empty
};

/// Reads the mixer tensors `prefix`{in_proj, conv1d, dt_bias, A_log, D, norm, out_proj} at full size (no slicing,
/// no packing), or dummy values seeded per tensor name; A = -exp(A_log); the biases only when m.use_bias /
/// m.use_conv_bias. Thread-safe for distinct layers. Throws Error naming a missing / misshapen tensor.
Mamba2LayerWeights read_mamba2_mixer(WeightSource& src, const std::string& prefix, int64_t hidden, const Mamba2Config& m);

/// HF Mamba2ForCausalLM's layer `layer`: read_mamba2_mixer("backbone.layers.{layer}.mixer.") plus its pre-norm
/// `backbone.layers.{layer}.norm.weight` (the GPU runner's reader). Same errors.
Mamba2LayerWeights read_mamba2_layer(WeightSource& src, const ModelConfig& cfg, const Mamba2Config& m, int64_t layer);

/// What one Mamba-2 layer keeps per request (CPU and GPU modules alike): conv [d_conv-1, conv_dim] and SSM
/// [H, P, N] of this rank's shard, and the unsharded layer's elements.
ModuleStateSpec mamba2_state_spec(const Mamba2Config& shard, const Mamba2Config& full);

/// The registry's factory ("mamba2"): rank tp.rank's shard (heads H / tp; B / C groups G / tp, or the single group
/// replicated; out_proj split by output rows over the all-gathered gated norm, dist/gathered_linear.h). Throws
/// Error when tp does not divide num_heads or n_groups is neither 1 nor a multiple of tp.
std::unique_ptr<CpuModule> make_mamba2_mixer(const ModuleArgs& args);

/// The registry's whole-stack decode path for Mamba-2 (StackDecodeFn): decode-only batches of up to 4 rows at TP 1
/// run every layer inside one OpenMP region, bit-identical to the per-layer path.
bool mamba2_stack_decode(std::span<CpuModule* const> layers, std::span<const float* const> norms, float eps,
                         const ForwardBatch& batch, std::span<const ModuleState> states, float* hidden, int64_t T, int64_t H,
                         Scratch& scratch);

}  // namespace ssmserve
