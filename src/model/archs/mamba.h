// Owns the Mamba-1 causal LM (HF `MambaForCausalLM`, transformers' modeling_mamba.py; vllm-ssm-design.md §5.1):
// embedding -> N x [RMSNorm -> MambaMixer, residual in fp32] -> RMSNorm -> (tied) LM head.
#pragma once
#include <memory>

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
  Weight x_proj;                     ///< [R + 2N, I]
  Weight dt_proj;                    ///< [I, R]
  std::vector<float> dt_bias;        ///< [I]
  std::vector<float> A;              ///< [I, N] = -exp(A_log)
  std::vector<float> D;              ///< [I]
  Weight out_proj;                   ///< [H, I]
  std::vector<float> out_proj_bias;  ///< [H] or empty
};

/// All parameters of a Mamba-1 model.
struct MambaWeights {
  Weight embedding;                  ///< [vocab, H]
  std::vector<MambaLayerWeights> layers;
  std::vector<float> norm_f;         ///< [H]
  Weight lm_head;                    ///< [vocab, H] (the embedding when tied)

  /// Reads every tensor with its expected shape from the config; throws Error naming a missing / wrong tensor.
  static MambaWeights load(const ModelConfig& cfg, WeightSource& src);
};

/// Loads a Mamba-1 model (checkpoint or dummy weights). Throws Error on any checkpoint / config defect.
std::unique_ptr<CausalLM> load_mamba(const ModelConfig& cfg, LoadFormat format);

}  // namespace ssmserve
