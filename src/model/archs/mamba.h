// Owns the Mamba-1 architecture (HF `MambaForCausalLM`, transformers' modeling_mamba.py; vllm-ssm-design.md §5.1)
// as a DecoderSpec: embedding -> N x [RMSNorm -> Mamba-1 mixer, residual in fp32] -> RMSNorm -> (tied) LM head. The
// mixer itself: model/mixers/mamba1_mixer.h.
#pragma once
#include "model/decoder/decoder_spec.h"
#include "model/mixers/mamba1_mixer.h"

namespace ssmserve {

/// The layout of transformers' Mamba / Mamba-2 checkpoints with mixer `kind` in every layer: backbone.embeddings,
/// backbone.layers.{l}.norm + .mixer., backbone.norm_f, lm_head (tied by default), layer_norm_epsilon.
DecoderSpec mamba_backbone_spec(const ModelConfig& cfg, const char* label, const char* kind);

/// MambaForCausalLM as a decoder: backbone.embeddings, backbone.layers.{l}.norm + .mixer ("mamba1"),
/// backbone.norm_f, lm_head (tied by default). Throws Error when the config has no Mamba-1 section.
DecoderSpec mamba_spec(const ModelConfig& cfg);

}  // namespace ssmserve
