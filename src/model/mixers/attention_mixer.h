// Owns the softmax-attention mixer: causal GQA attention over the paged KV cache that shares the block pool with the
// recurrent states (vllm-ssm-design.md §3.5), with RoPE at each token's sequence position (transformers'
// MiniMaxAttention / LlamaAttention: q, k, v, o projections without bias), and Qwen3-Next / Qwen3.5's options
// (Qwen3NextAttention, Qwen3_5MoeAttention): a sigmoid output gate computed by q_proj beside the queries, and
// per-head RMSNorms of q and k (zero-centred weights: `x_normed * (1 + w)`) before RoPE.
#pragma once
#include <memory>
#include <vector>

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
  /// Qwen3-Next / Qwen3.5: q_proj yields [q_h | gate_h] per head and o = attention * sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  /// Per-head RMSNorm over head_dim of q and k before RoPE, y = x * rsqrt(mean(x^2) + qk_norm_eps) * (offset + w).
  bool qk_norm = false;
  float qk_norm_eps = 1e-6f;
  float qk_norm_weight_offset = 0.0f;  ///< 1 for Qwen's zero-centred norms (`output * (1.0 + weight)`)
  /// Reads and validates them from `j`; throws Error naming the field.
  static AttentionConfig from_json(const nlohmann::json& j, const ModelConfig& cfg);
};

/// One softmax layer's parameters at full size: q [H D, hidden] (the query rows only), k and v [K D, hidden], o
/// [hidden, H D]; with attn_output_gate, gate [H D, hidden] (the gate rows of q_proj, head-major like q), else empty;
/// with qk_norm, q_norm and k_norm [D] fp32 holding the effective weights (qk_norm_weight_offset + w), else empty.
struct AttentionWeights {
  Weight q_proj, k_proj, v_proj, o_proj;
  Weight gate;
  std::vector<float> q_norm, k_norm;
};

/// Reads `prefix`{q_proj, k_proj, v_proj, o_proj} (or dummy values seeded per name); with attn_output_gate, q_proj is
/// [2 H D, hidden] laid out per head as [q_h (D rows) | gate_h (D rows)] (transformers: `q_proj(x).view(..., H, 2D)
/// .chunk(2, -1)`) and is split into q_proj and gate; with qk_norm, also `prefix`{q_norm, k_norm}.weight [D] (dummy:
/// uniform in [-0.5, 0.5], so with offset 1 the weights lie in [0.5, 1.5]). Throws Error naming a tensor.
AttentionWeights read_attention_weights(WeightSource& src, const std::string& prefix, int64_t hidden, const AttentionConfig& c);

/// The registry's factory ("attention"): hyperparameters num_attention_heads, num_key_value_heads (= heads),
/// head_dim (hidden / heads), rope_theta / rope_parameters (10000, type "default"), position_embedding_type ("nope":
/// no RoPE), partial_rotary_factor (1; also read from rope_parameters), attention_in_multiplier and key_multiplier
/// (1; Falcon-H1), attention_bias (false only), attention_multiplier (the softmax scale; default 1 / sqrt(head_dim)),
/// attn_output_gate (false), qk_norm (false), rms_norm_eps (1e-6; the q / k norms' eps), qk_norm_weight_offset (0);
/// rope_parameters' mrope_section / mrope_interleaved are accepted and ignored (see from_json); weights `prefix`{q_proj,
/// k_proj, v_proj, o_proj} (+ q_norm, k_norm). Rank tp.rank keeps its query heads (H / tp) and its KV heads (K / tp, or one replicated head
/// r * K / tp when tp is a multiple of K, as vLLM's QKVParallelLinear); o_proj split by output rows over the
/// all-gathered heads (dist/gathered_linear.h); with attn_output_gate a rank keeps the gate rows of its heads (in the
/// checkpoint: its contiguous range of 2D-row head groups). Throws Error on a bad field or tensor or a non-dividing tp.
std::unique_ptr<CpuModule> make_attention_mixer(const ModuleArgs& args);

}  // namespace ssmserve
