// Owns the Mamba-1 causal LM (HF `MambaForCausalLM`, transformers' modeling_mamba.py; vllm-ssm-design.md §5.1):
// embedding -> N x [RMSNorm -> MambaMixer, residual in fp32] -> RMSNorm -> (tied) LM head.
#pragma once
#include <memory>

#include "dist/communicator.h"
#include "model/causal_lm.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Parameters of one Mamba-1 mixer layer (I = d_inner, H = hidden, N = d_state, K = d_conv, R = dt_rank).
struct MambaLayerWeights {
  std::vector<float> norm;           ///< [H]
  Weight in_proj;                    ///< [2I, H]
  std::vector<float> in_proj_bias;   ///< [2I] or empty
  std::vector<float> conv_weight;    ///< [I, K]
  std::vector<float> conv_bias;      ///< [I] or empty
  Weight x_proj;                     ///< [R + 2N, I] (replicated: every rank holds the whole, d_inner columns)
  Weight dt_proj;                    ///< [I, R]
  std::vector<float> dt_bias;        ///< [I]
  std::vector<float> A;              ///< [I, N] = -exp(A_log)
  std::vector<float> D;              ///< [I]
  Weight out_proj;                   ///< [H, I]; a rank: its output rows output_shard(H) x the whole d_inner
  std::vector<float> out_proj_bias;  ///< [H] or empty; a rank: its output rows
};

/// All parameters of a Mamba-1 model, or of one tensor-parallel rank's shard of it (vllm-ssm-design.md §5.1:
/// channels split I / tp per rank; in_proj's x and z rows, conv, dt_proj rows, dt_bias, A and D column-parallel;
/// embedding and LM head rows split by vocab). Where vLLM makes x_proj and out_proj row-parallel (input columns
/// split, partial sums all-reduced), the CPU shard keeps TP = 1's summation order (dist/gathered_linear.h): x_proj
/// is replicated over the all-gathered conv output and out_proj is split by output rows over the all-gathered
/// scan output. Shapes below are per rank, I = d_inner / tp, vocab = the rank's vocab_shard rows.
struct MambaWeights {
  Weight embedding;                  ///< [vocab, H]
  std::vector<MambaLayerWeights> layers;
  std::vector<float> norm_f;         ///< [H]
  Weight lm_head;                    ///< [vocab, H] (the embedding when tied)

  /// Reads every tensor with its expected shape from the config and keeps rank tp.rank's slice; throws Error naming
  /// a missing / wrong tensor, or when tp.world does not divide d_inner.
  static MambaWeights load(const ModelConfig& cfg, WeightSource& src, const dist::TpRank& tp = {});
};

/// Loads a Mamba-1 model (checkpoint or dummy weights), or rank tp.rank's shard of it: that model's state_shape,
/// forward and logits are the rank's, and its forward is a collective over tp.comm (every rank must run the same
/// batch at once; only ranks passing non-null logits get them written). Throws Error on any checkpoint / config
/// defect or a tensor-parallel size that does not divide d_inner.
std::unique_ptr<CausalLM> load_mamba(const ModelConfig& cfg, LoadFormat format, const dist::TpRank& tp = {});

}  // namespace ssmserve
