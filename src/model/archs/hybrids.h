// Owns the Mamba hybrids' architectures as DecoderSpecs (each a mapping of its transformers 5.x config and checkpoint
// names onto the decoder stack; docs/architecture.md "Adding an architecture"):
//  - GraniteMoeHybridForCausalLM (Granite-4.0-H; transformers' modeling_granitemoehybrid.py): Mamba-2 or attention
//    (RoPE only when position_embedding_type is "rope"; softmax scale attention_multiplier) then MoE + shared MLP (or
//    the shared MLP alone without experts); muP: embedding_multiplier, residual_multiplier on both sublayers,
//    logits / logits_scaling.
//  - BambaForCausalLM (modeling_bamba.py): Mamba-2 or attention (RoPE on half of each head) then a SiLU-gated MLP.
//  - NemotronHForCausalLM (Nemotron-H, Nemotron Nano 2 / 3; modeling_nemotron_h.py): each layer one block, a Mamba-2
//    mixer, attention without RoPE, a relu^2 MLP or a sigmoid-routed relu^2 MoE with a shared expert.
//  - JambaForCausalLM (modeling_jamba.py): Mamba-1 with RMSNorms on dt / B / C, or attention without RoPE, then a
//    SiLU-gated MLP or a softmax MoE without renormalization (every expert_layer_period-th layer).
//  - FalconH1ForCausalLM (modeling_falcon_h1.py): Mamba-2 and RoPE attention in parallel on one normed input, then a
//    SiLU-gated MLP; muP multipliers folded into the projections (falcon_h1.cpp).
// Each throws Error naming the field when the config is malformed or names a layer type the family does not have.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "model/decoder/decoder_spec.h"

namespace ssmserve {

/// GraniteMoeHybridForCausalLM: model.{embed_tokens, layers.{l}.{input_layernorm, mamba. | self_attn.,
/// post_attention_layernorm, block_sparse_moe., shared_mlp.}, norm}, lm_head (tied by default in the checkpoints).
DecoderSpec granitemoehybrid_spec(const ModelConfig& cfg);
/// BambaForCausalLM: model.{embed_tokens, layers.{l}.{input_layernorm, mamba. | self_attn., pre_ff_layernorm,
/// feed_forward.}, final_layernorm}, lm_head.
DecoderSpec bamba_spec(const ModelConfig& cfg);
/// NemotronHForCausalLM: backbone.{embeddings, layers.{l}.{norm, mixer.}, norm_f}, lm_head (never tied).
DecoderSpec nemotron_h_spec(const ModelConfig& cfg);
/// JambaForCausalLM: model.{embed_tokens, layers.{l}.{input_layernorm, mamba. | self_attn., pre_ff_layernorm,
/// feed_forward.}, final_layernorm}, lm_head.
DecoderSpec jamba_spec(const ModelConfig& cfg);
/// FalconH1ForCausalLM: model.{embed_tokens, layers.{l}.{input_layernorm, mamba., self_attn., pre_ff_layernorm,
/// feed_forward.}, final_layernorm}, lm_head.
DecoderSpec falcon_h1_spec(const ModelConfig& cfg);

/// The per-layer mixer types of a Mamba hybrid ("mamba" or "attention"): read_layer_types, where transformers 5.x's
/// "linear_attention" spelling of a Mamba layer means "mamba"; `allowed` lists the other kinds the family may have
/// ("mlp", "moe" for Nemotron-H). Throws Error naming the family and the offending entry.
std::vector<std::string> mamba_hybrid_layer_types(const ModelConfig& cfg, const char* family,
                                                  std::initializer_list<const char*> allowed = {});

}  // namespace ssmserve
