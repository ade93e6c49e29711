// Owns the gated-DeltaNet hybrids' architectures as DecoderSpecs (transformers 5.x models/qwen3_5, qwen3_5_moe,
// qwen3_next; vLLM's qwen3_5.py / qwen3_next.py):
//  - Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration (Qwen3.5 / Qwen3.6 as published: the
//    multimodal wrapper; the text decoder's fields in text_config, its tensors under model.language_model.*, lm_head.*;
//    model.visual.* and mtp.* ignored) and their text-only Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (model.*);
//  - Qwen3NextForCausalLM (Qwen3-Next; model.*, fused in_proj_qkvz / in_proj_ba).
// Each layer: a gated DeltaNet ("linear_attention") or a gated full attention (q_proj doubled into query and sigmoid
// output gate, per-head zero-centred RMSNorm on q and k, partial RoPE; Qwen3.5's interleaved mrope sections are plain
// RoPE for text positions), then a SiLU-gated MLP (dense models, Qwen3-Next's mlp_only_layers) or a softmax top-k MoE
// with a sigmoid-gated shared expert. Every decoder RMSNorm is zero-centred (1 + w). Layer types from `layer_types`,
// else every full_attention_interval-th layer (4) is attention. Each throws Error naming the field when the config is
// malformed.
#pragma once
#include "model/decoder/decoder_spec.h"

namespace ssmserve {

/// Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration, Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM.
DecoderSpec qwen3_5_spec(const ModelConfig& cfg);
/// Qwen3NextForCausalLM.
DecoderSpec qwen3_next_spec(const ModelConfig& cfg);

}  // namespace ssmserve
