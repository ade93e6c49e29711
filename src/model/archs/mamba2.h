// Owns the Mamba-2 architecture (HF `Mamba2ForCausalLM`, transformers' modeling_mamba2.py; vllm-ssm-design.md
// §5.2) as a DecoderSpec: embedding -> N x [RMSNorm -> Mamba-2 mixer, residual in fp32] -> RMSNorm -> (tied) LM
// head. The mixer itself: model/mixers/mamba2_mixer.h.
#pragma once
#include "model/decoder/decoder_spec.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve {

/// Mamba2ForCausalLM as a decoder: backbone.embeddings, backbone.layers.{l}.norm + .mixer ("mamba2"),
/// backbone.norm_f, lm_head (tied by default); chunk_size from the config. Throws Error naming an invalid Mamba-2
/// field.
DecoderSpec mamba2_spec(const ModelConfig& cfg);

}  // namespace ssmserve
