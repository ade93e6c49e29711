// Owns the softmax-attention mixer: causal GQA attention over the paged KV cache that shares the block pool with the
// recurrent states (vllm-ssm-design.md §3.5), with RoPE at each token's sequence position (transformers'
// MiniMaxAttention / LlamaAttention: q, k, v, o projections without bias).
#pragma once
#include <memory>

#include "model/decoder/module.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Softmax-attention hyperparameters (see make_attention_mixer).
struct AttentionConfig {
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  bool rope = true;
  double rope_theta = 10000.0;
  int rotary_dim = 0;  ///< RoPE rotates the first rotary_dim dims of each head (head_dim * partial_rotary_factor)
  float scale = 0.0f;  ///< softmax scale
  /// Falcon-H1's muP, folded into the projections at load: q, k, v of (in_multiplier * x); k times key_multiplier.
  float in_multiplier = 1.0f, key_multiplier = 1.0f;
  /// Reads and validates them from `j`; throws Error naming the field.
  static AttentionConfig from_json(const nlohmann::json& j, const ModelConfig& cfg);
};

/// One softmax layer's projections at full size: q [H D, hidden], k and v [K D, hidden], o [hidden, H D].
struct AttentionWeights {
  Weight q_proj, k_proj, v_proj, o_proj;
};

/// Reads `prefix`{q_proj, k_proj, v_proj, o_proj} (or dummy values seeded per name). Throws Error naming a tensor.
AttentionWeights read_attention_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const AttentionConfig& c);

/// The registry's factory ("attention"): hyperparameters num_attention_heads, num_key_value_heads (= heads),
/// head_dim (hidden / heads), rope_theta / rope_parameters (10000, type "default"), position_embedding_type ("nope":
/// no RoPE), partial_rotary_factor (1; also read from rope_parameters), attention_in_multiplier and key_multiplier
/// (1; Falcon-H1), attention_bias (false only), attention_multiplier (the softmax scale; default 1 / sqrt(head_dim)); weights `prefix`{q_proj, k_proj,
/// v_proj, o_proj}. Rank tp.rank keeps its query heads (H / tp) and its KV heads (K / tp, or one replicated head
/// r * K / tp when tp is a multiple of K, as vLLM's QKVParallelLinear); o_proj split by output rows over the
/// all-gathered heads (dist/gathered_linear.h). Throws Error on a bad field or tensor or a non-dividing tp.
std::unique_ptr<CpuModule> make_attention_mixer(const ModuleArgs& args);

}  // namespace ssmserve
