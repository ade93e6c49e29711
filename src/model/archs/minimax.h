// Owns the MiniMax hybrid causal LM (HF `MiniMaxForCausalLM`, transformers' modeling_minimax.py, which defines
// the semantics; vllm-ssm-design.md §5.3): embedding -> N x decoder layer -> RMSNorm -> (tied) LM head, where
// each decoder layer is (exactly as transformers' MiniMaxDecoderLayer):
//   x^ = RMSNorm(x);  h = alpha_attn * x^ + beta_attn * Attn(x^)
//   h^ = RMSNorm(h);  out = alpha_mlp * h^ + beta_mlp * SparseMoE(h^)
// Attn is lightning attention for `linear_attention` layers (SiLU(qkv_proj), per-head decay recurrence, RMSNorm
// over all heads (eps 1e-6, transformers' default), sigmoid(output_gate(x^)) gate, out_proj) and causal GQA
// softmax attention with RoPE over a paged KV cache for `full_attention` layers.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/decoder/decoder_spec.h"

namespace ssmserve {

/// MiniMax hyperparameters (transformers' MiniMaxConfig names).
struct MiniMaxConfig {
  int num_heads = 0;       ///< num_attention_heads, H
  int num_kv_heads = 0;    ///< num_key_value_heads (softmax layers)
  int head_dim = 0;        ///< D (default hidden_size / H)
  int intermediate_size = 0;
  int num_experts = 0;     ///< num_local_experts, E
  int top_k = 0;           ///< num_experts_per_tok
  int block_size = 256;    ///< lightning intra-block length in tokens
  double rope_theta = 10000.0;
  std::vector<bool> is_linear;  ///< [num_hidden_layers] linear_attention (true) or full_attention (false)
  float linear_alpha = 1, linear_beta = 1, full_alpha = 1, full_beta = 1, mlp_alpha = 1, mlp_beta = 1;
  bool tie_word_embeddings = false;

  /// Reads and validates the MiniMax fields (layer_types, or the original attn_type_list 0/1); throws Error
  /// naming the field.
  static MiniMaxConfig from_json(const ModelConfig& cfg);
};

/// MiniMaxForCausalLM as a decoder: per layer input_layernorm -> "lightning" (linear_attention) or "attention"
/// (full_attention) with h = alpha x^ + beta Attn(x^), then post_attention_layernorm -> "moe" with
/// out = alpha h^ + beta MoE(h^) (residuals from the normed input, as transformers' MiniMaxDecoderLayer); the
/// embedding model.embed_tokens, model.norm, lm_head (untied by default). Throws Error naming an invalid field.
DecoderSpec minimax_spec(const ModelConfig& cfg);

}  // namespace ssmserve
