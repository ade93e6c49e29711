// Owns the Mamba-2 causal LM (HF `Mamba2ForCausalLM`, transformers' modeling_mamba2.py; vllm-ssm-design.md §5.2):
// embedding -> N x [RMSNorm -> Mamba2Mixer, residual in fp32] -> RMSNorm -> (tied) LM head. The mixer:
// in_proj -> [z, xBC, dt]; causal conv1d + SiLU over xBC; SSD scan per head (B, C shared per group);
// gated RMSNorm (norm(y * silu(z)) per group, or norm-before-gate); out_proj.
#pragma once
#include <memory>
#include <utility>

#include "dist/communicator.h"
#include "model/causal_lm.h"
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
  float time_step_min_limit = 0.0f;          ///< time_step_limit[0]
  float time_step_max_limit = INFINITY;      ///< time_step_limit[1]
  int conv_dim() const { return d_inner + 2 * n_groups * d_state; }

  /// Reads and validates the Mamba-2 fields of config.json; throws Error naming the field.
  static Mamba2Config from_json(const ModelConfig& cfg);
};

/// Parameters of one Mamba-2 mixer layer (I = d_inner, H = heads, C = conv_dim, K = d_conv).
struct Mamba2LayerWeights {
  std::vector<float> norm;          ///< [hidden] pre-norm
  Weight in_proj;                   ///< [I + C + H, hidden]: z, xBC, dt
  std::vector<float> in_proj_bias;  ///< or empty
  std::vector<float> conv_weight;   ///< [C, K]
  std::vector<float> conv_bias;     ///< [C] or empty
  std::vector<float> dt_bias;       ///< [H]
  std::vector<float> A;             ///< [H] = -exp(A_log)
  std::vector<float> D;             ///< [H]
  std::vector<float> gate_norm;     ///< [I] gated RMSNorm weight
  Weight out_proj;                  ///< [hidden, I]
  std::vector<float> out_proj_bias; ///< or empty
};

/// Reads every parameter of Mamba-2 layer `layer` at full size (no tensor-parallel slicing, no packing): the
/// checkpoint's `backbone.layers.{layer}.*` tensors (HF `Mamba2ForCausalLM` names; shapes in Mamba2LayerWeights,
/// with C = conv_dim(), H = num_heads of the whole model), or dummy values seeded per tensor name; A = -exp(A_log).
/// The biases only when m.use_bias / m.use_conv_bias. One copy of the names, shapes and dummy initializers for the
/// CPU model (which then slices its rank's rows) and the GPU runner. Thread-safe for distinct layers.
/// Throws Error naming the tensor when it is missing, misshapen or of an unsupported dtype.
Mamba2LayerWeights read_mamba2_layer(WeightSource& src, const ModelConfig& cfg, const Mamba2Config& m, int64_t layer);

/// Loads a Mamba-2 model (checkpoint or dummy weights), or rank tp.rank's shard of it (vllm-ssm-design.md §3.1,
/// §5.2): heads H / tp per rank (x, z, dt rows of in_proj, conv channels, dt_bias, A, D); B / C groups G / tp per
/// rank when G % tp == 0, the single group replicated on every rank when G == 1; embedding and LM head split by
/// vocab rows. Where vLLM all-reduces out_proj's partial sums (and the G == 1 norm's sums of squares), the CPU
/// shard keeps TP = 1's arithmetic (dist/gathered_linear.h): the ranks all-gather y and z, every rank applies the
/// gated RMSNorm to the whole d_inner (its weight replicated), and out_proj is split by output rows. A shard's forward is a collective over tp.comm (every rank runs
/// the same batch at once; only ranks passing non-null logits get them written).
/// Throws Error on any checkpoint / config defect, or when tp.world does not divide num_heads, or n_groups is
/// neither 1 nor a multiple of tp.world.
std::unique_ptr<CausalLM> load_mamba2(const ModelConfig& cfg, LoadFormat format, const dist::TpRank& tp = {});

}  // namespace ssmserve
