// Owns the MiniMax hybrid's configuration and its mapping onto the decoder stack (lightning / softmax-attention
// mixers, MoE FFN, MiniMax's alpha / beta residuals from the normed input).
#include "model/archs/minimax.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"
#include "model/decoder/params.h"

namespace ssmserve {

MiniMaxConfig MiniMaxConfig::from_json(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  MiniMaxConfig m;
  m.num_heads = param_int(j, "num_attention_heads", -1);
  m.num_kv_heads = param_int(j, "num_key_value_heads", m.num_heads);
  SSM_CHECK(m.num_heads % m.num_kv_heads == 0, "config.json: num_attention_heads {} must be a multiple of num_key_value_heads {}",
            m.num_heads, m.num_kv_heads);
  m.head_dim = param_int(j, "head_dim", cfg.hidden_size % m.num_heads == 0 ? cfg.hidden_size / m.num_heads : -1);
  m.intermediate_size = param_int(j, "intermediate_size", -1);
  m.num_experts = param_int(j, "num_local_experts", 8);
  m.top_k = param_int(j, "num_experts_per_tok", 2);
  SSM_CHECK(m.top_k <= m.num_experts, "config.json: num_experts_per_tok {} exceeds num_local_experts {}", m.top_k, m.num_experts);
  m.block_size = param_int(j, "block_size", 256);
  // Bounds far above real models (MiniMax-Text-01: 64 heads of 128, 32 experts, block 256) that keep the state,
  // scratch and page sizes clear of overflow and absurd allocations.
  SSM_CHECK(m.num_heads <= 4096 && m.head_dim <= 1024 && m.head_dim % 2 == 0,
            "config.json: num_attention_heads must be <= 4096 and head_dim even and <= 1024 (got {} and {})", m.num_heads, m.head_dim);
  SSM_CHECK(m.block_size <= 4096, "config.json: block_size must be <= 4096 (got {})", m.block_size);
  SSM_CHECK(m.num_experts <= 4096, "config.json: num_local_experts must be <= 4096 (got {})", m.num_experts);
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu", "config.json: hidden_act \"{}\" is not supported (MiniMax uses silu)", text_excerpt(act));
  SSM_CHECK(!j.contains("sliding_window") || j["sliding_window"].is_null(),
            "config.json: sliding_window is not supported for MiniMax (must be null)");
  // Layer types: transformers' layer_types, or the original attn_type_list (0 = linear, 1 = softmax).
  const int L = cfg.num_hidden_layers;
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& lt = j["layer_types"];
    SSM_CHECK(lt.is_array() && static_cast<int>(lt.size()) == L, "config.json: layer_types must list {} layer types", L);
    for (const auto& t : lt) {
      SSM_CHECK(t == "linear_attention" || t == "full_attention",
                "config.json: layer_types entries must be \"linear_attention\" or \"full_attention\" (got {})", json_excerpt(t));
      m.is_linear.push_back(t == "linear_attention");
    }
  } else if (j.contains("attn_type_list") && !j["attn_type_list"].is_null()) {
    const auto& lt = j["attn_type_list"];
    SSM_CHECK(lt.is_array() && static_cast<int>(lt.size()) == L, "config.json: attn_type_list must list {} entries", L);
    for (const auto& t : lt) {
      SSM_CHECK(t == 0 || t == 1, "config.json: attn_type_list entries must be 0 (linear) or 1 (softmax) (got {})", json_excerpt(t));
      m.is_linear.push_back(t == 0);
    }
  } else {
    for (int i = 0; i < L; ++i) m.is_linear.push_back((i + 1) % 2 == 0);  // transformers' default
  }
  // RoPE (default type only; transformers' MiniMax rotates the whole head_dim).
  m.rope_theta = param_rope_theta(j, 10000.0);
  m.linear_alpha = param_float(j, {"linear_attn_alpha_factor", "layernorm_linear_attention_alpha"}, 1);
  m.linear_beta = param_float(j, {"linear_attn_beta_factor", "layernorm_linear_attention_beta"}, 1);
  m.full_alpha = param_float(j, {"full_attn_alpha_factor", "layernorm_full_attention_alpha"}, 1);
  m.full_beta = param_float(j, {"full_attn_beta_factor", "layernorm_full_attention_beta"}, 1);
  m.mlp_alpha = param_float(j, {"mlp_alpha_factor", "layernorm_mlp_alpha"}, 1);
  m.mlp_beta = param_float(j, {"mlp_beta_factor", "layernorm_mlp_beta"}, 1);
  m.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() && j["tie_word_embeddings"].get<bool>();
  return m;
}

DecoderSpec minimax_spec(const ModelConfig& cfg) {
  const MiniMaxConfig m = MiniMaxConfig::from_json(cfg);  // validates before any weight is read
  DecoderSpec s;
  s.label = "MiniMax";
  s.embedding = "model.embed_tokens.weight";
  s.final_norm = "model.norm.weight";
  s.tie_word_embeddings = m.tie_word_embeddings;
  s.norm_eps = cfg.layer_norm_epsilon;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    const bool lin = m.is_linear[static_cast<size_t>(l)];
    LayerSpec layer;
    layer.mixer = {lin ? "lightning" : "attention", p + "input_layernorm.weight", p + "self_attn.",
                   lin ? m.linear_alpha : m.full_alpha, lin ? m.linear_beta : m.full_beta, true};
    layer.ffn = {"moe", p + "post_attention_layernorm.weight", p + "block_sparse_moe.", m.mlp_alpha, m.mlp_beta, true};
    s.layers.push_back(layer);
  }
  // Parameter bytes at 2 bytes each (bf16 dummy weights), to refuse dummy configs that cannot fit.
  const double Hd = cfg.hidden_size, V = cfg.vocab_size, HD = static_cast<double>(m.num_heads) * m.head_dim,
               KD = static_cast<double>(m.num_kv_heads) * m.head_dim, I = m.intermediate_size, E = m.num_experts;
  double n = V * Hd * (m.tie_word_embeddings ? 1 : 2);
  for (bool lin : m.is_linear) n += (lin ? 5 * HD * Hd : (2 * HD + 2 * KD) * Hd) + E * (3 * I * Hd + Hd);
  s.dummy_bytes = 2 * n;
  return s;
}

}  // namespace ssmserve
