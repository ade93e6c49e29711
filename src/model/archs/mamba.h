// Owns the Mamba-1 architecture (HF `MambaForCausalLM`, transformers' modeling_mamba.py; vllm-ssm-design.md §5.1)
// as a DecoderSpec: embedding -> N x [RMSNorm -> Mamba-1 mixer, residual in fp32] -> RMSNorm -> (tied) LM head; and
// the whole-model weight reader the GPU runner uses.
#pragma once
#include <vector>

#include "dist/communicator.h"
#include "model/decoder/decoder_spec.h"
#include "model/mixers/mamba1_mixer.h"
#include "model/weight_source.h"

namespace ssmserve {

/// MambaForCausalLM as a decoder: backbone.embeddings, backbone.layers.{l}.norm + .mixer ("mamba1"),
/// backbone.norm_f, lm_head (tied by default). Throws Error when the config has no Mamba-1 section.
DecoderSpec mamba_spec(const ModelConfig& cfg);

/// All parameters of a Mamba-1 model, or of one tensor-parallel rank's shard of it (read_mamba1_layer's slicing;
/// embedding and LM head rows split by vocab). Shapes per rank, I = d_inner / tp, vocab = the rank's vocab_shard.
struct MambaWeights {
  Weight embedding;                  ///< [vocab, H]
  std::vector<MambaLayerWeights> layers;
  std::vector<float> norm_f;         ///< [H]
  Weight lm_head;                    ///< [vocab, H] (the embedding when tied)

  /// Reads every tensor with its expected shape from the config and keeps rank tp.rank's slice; throws Error naming
  /// a missing / wrong tensor, or when tp.world does not divide d_inner.
  static MambaWeights load(const ModelConfig& cfg, WeightSource& src, const dist::TpRank& tp = {});
};

}  // namespace ssmserve
