// Owns the MiniMax hybrid forward pass over a packed batch (lightning layers through the decode / blocked-prefill
// kernels on their state blocks, softmax layers through the paged KV cache sharing the same pool, sparse MoE
// MLPs), its configuration and its weight loading.
#include "model/archs/minimax.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "model/lm_common.h"
#include "model/weight_source.h"

namespace ssmserve {
namespace {

int field_int(const nlohmann::json& j, const char* field, int fallback) {
  if (!j.contains(field) || j[field].is_null()) {
    SSM_CHECK(fallback > 0, "config.json: MiniMax field \"{}\" is missing", field);
    return fallback;
  }
  SSM_CHECK(j[field].is_number_integer() && j[field].get<int64_t>() > 0 && j[field].get<int64_t>() < (1 << 24),
            "config.json: field \"{}\" must be a positive integer (got {})", field, json_excerpt(j[field]));
  return j[field].get<int>();
}

float field_float(const nlohmann::json& j, std::initializer_list<const char*> names, float fallback) {
  for (const char* n : names)
    if (j.contains(n) && !j[n].is_null()) {
      const double v = json_float(j[n], n);
      SSM_CHECK(std::isfinite(v), "config.json: field \"{}\" must be a finite number", n);
      return static_cast<float>(v);
    }
  return fallback;
}

}  // namespace

int MiniMaxConfig::num_linear_layers() const {
  int n = 0;
  for (bool b : is_linear) n += b ? 1 : 0;
  return n;
}

std::vector<float> MiniMaxConfig::slopes(int layer) const {
  const int L = static_cast<int>(is_linear.size());
  const double base = 1.0 / std::pow(2.0, 8.0 / num_heads);
  const double factor = 1.0 - layer / (L - 1 + 1e-5) + 1e-5;
  std::vector<float> s(static_cast<size_t>(num_heads));
  for (int h = 0; h < num_heads; ++h) s[h] = static_cast<float>(static_cast<float>(std::pow(base, h + 1)) * factor);
  return s;
}

MiniMaxConfig MiniMaxConfig::from_json(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  MiniMaxConfig m;
  m.num_heads = field_int(j, "num_attention_heads", -1);
  m.num_kv_heads = field_int(j, "num_key_value_heads", m.num_heads);
  SSM_CHECK(m.num_heads % m.num_kv_heads == 0, "config.json: num_attention_heads {} must be a multiple of num_key_value_heads {}",
            m.num_heads, m.num_kv_heads);
  m.head_dim = field_int(j, "head_dim", cfg.hidden_size % m.num_heads == 0 ? cfg.hidden_size / m.num_heads : -1);
  m.intermediate_size = field_int(j, "intermediate_size", -1);
  m.num_experts = field_int(j, "num_local_experts", 8);
  m.top_k = field_int(j, "num_experts_per_tok", 2);
  SSM_CHECK(m.top_k <= m.num_experts, "config.json: num_experts_per_tok {} exceeds num_local_experts {}", m.top_k, m.num_experts);
  m.block_size = field_int(j, "block_size", 256);
  // Bounds far above real models (MiniMax-Text-01: 64 heads of 128, 32 experts, block 256) that keep the state,
  // scratch and page sizes clear of overflow and absurd allocations.
  SSM_CHECK(m.num_heads <= 4096 && m.head_dim <= 1024 && m.head_dim % 2 == 0,
            "config.json: num_attention_heads must be <= 4096 and head_dim even and <= 1024 (got {} and {})", m.num_heads, m.head_dim);
  SSM_CHECK(m.block_size <= 4096, "config.json: block_size must be <= 4096 (got {})", m.block_size);
  SSM_CHECK(m.num_experts <= 4096, "config.json: num_local_experts must be <= 4096 (got {})", m.num_experts);
  const std::string act = j.contains("hidden_act") && j["hidden_act"].is_string() ? j["hidden_act"].get<std::string>() : "silu";
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
  const nlohmann::json* rp = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : nullptr;
  if (rp && rp->contains("rope_type") && !(*rp)["rope_type"].is_null())
    SSM_CHECK((*rp)["rope_type"] == "default", "config.json: rope_type {} is not supported (only \"default\")",
              json_excerpt((*rp)["rope_type"]));
  if (rp && rp->contains("rope_theta")) m.rope_theta = json_float((*rp)["rope_theta"], "rope_parameters.rope_theta");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null()) m.rope_theta = json_float(j["rope_theta"], "rope_theta");
  SSM_CHECK(std::isfinite(m.rope_theta) && m.rope_theta > 0, "config.json: rope_theta must be a positive number");
  m.linear_alpha = field_float(j, {"linear_attn_alpha_factor", "layernorm_linear_attention_alpha"}, 1);
  m.linear_beta = field_float(j, {"linear_attn_beta_factor", "layernorm_linear_attention_beta"}, 1);
  m.full_alpha = field_float(j, {"full_attn_alpha_factor", "layernorm_full_attention_alpha"}, 1);
  m.full_beta = field_float(j, {"full_attn_beta_factor", "layernorm_full_attention_beta"}, 1);
  m.mlp_alpha = field_float(j, {"mlp_alpha_factor", "layernorm_mlp_alpha"}, 1);
  m.mlp_beta = field_float(j, {"mlp_beta_factor", "layernorm_mlp_beta"}, 1);
  m.tie_word_embeddings = j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean() && j["tie_word_embeddings"].get<bool>();
  return m;
}

namespace {

/// One decoder layer's parameters (H = heads, K = KV heads, D = head_dim, Hd = hidden, I = intermediate).
struct MiniMaxLayer {
  bool is_linear = true;
  std::vector<float> input_norm, post_norm;  ///< [Hd]
  // Lightning:
  Weight qkv_proj;            ///< [3 H D, Hd]
  Weight output_gate;         ///< [H D, Hd]
  Weight out_proj;            ///< [Hd, H D]
  std::vector<float> norm;    ///< [H D]
  std::vector<float> slopes;  ///< [H]
  int linear_index = -1;      ///< position among the lightning layers (state page offset)
  // Softmax:
  Weight q_proj, k_proj, v_proj;  ///< [H D, Hd], [K D, Hd], [K D, Hd]
  Weight o_proj;                  ///< [Hd, H D]
  int full_index = -1;            ///< position among the softmax layers (KV page offset)
  // MoE:
  Weight gate;  ///< [E, Hd]
  std::vector<cpu::ExpertWeights> experts;
};

class MiniMaxModel final : public CausalLM {
 public:
  MiniMaxModel(ModelConfig cfg, MiniMaxConfig m, Weight emb, std::vector<MiniMaxLayer> layers, std::vector<float> norm_f,
               Weight head, std::shared_ptr<const Checkpoint> ckpt)
      : cfg_(std::move(cfg)), m_(std::move(m)), embedding_(std::move(emb)), layers_(std::move(layers)), norm_f_(std::move(norm_f)),
        lm_head_(std::move(head)), ckpt_(std::move(ckpt)) {
    const int64_t D = m_.head_dim;
    state_elems_ = static_cast<int64_t>(m_.num_linear_layers()) * m_.num_heads * D * D;
    const int64_t kv_token_bytes = static_cast<int64_t>(m_.num_full_layers()) * 2 * m_.num_kv_heads * D * 4;
    // Page-size unification: a KV block holds as many tokens as make its page (all softmax layers' K and V) as
    // large as a state page (all lightning layers' fp32 states).
    if (kv_token_bytes > 0)
      kv_block_size_ = static_cast<int>(std::max<int64_t>(1, state_elems_ > 0 ? state_elems_ * 4 / kv_token_bytes : 64));
    inv_freq_ = cpu::rope_inv_freq(m_.rope_theta, m_.head_dim);
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return 1; }  // one page spans every layer (docs/architecture.md)
  StateShape state_shape() const override {
    const int64_t kv_page = static_cast<int64_t>(kv_block_size_) * m_.num_full_layers() * 2 * m_.num_kv_heads * m_.head_dim * 4;
    return {0, state_elems_, kv_page};
  }
  int kv_block_size() const override { return kv_block_size_; }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;

 private:
  void lightning_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T);
  void softmax_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T);

  ModelConfig cfg_;
  MiniMaxConfig m_;
  Weight embedding_;
  std::vector<MiniMaxLayer> layers_;
  std::vector<float> norm_f_;
  Weight lm_head_;
  std::shared_ptr<const Checkpoint> ckpt_;
  int64_t state_elems_ = 0;
  int kv_block_size_ = 0;
  std::vector<float> inv_freq_;
  // Scratch for T packed tokens:
  std::vector<float> hidden_, normed_, attn_, proj_, o_, gate_, moe_;
};

void MiniMaxModel::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  check_batch_against_cache(batch, cache, num_state_layers(), "MiniMax");
  const LinearAttentionMetadata& lm = batch.linear_meta;
  const PagedAttentionMetadata& am = batch.attn_meta;
  const int B = batch.meta.num_reqs;
  SSM_CHECK(static_cast<int>(lm.state_indices_tensor.size()) == B && static_cast<int>(lm.query_start_loc.size()) == B + 1,
            "MiniMax forward: the batch has no linear-attention metadata for its {} rows (build_attention_metadata)", B);
  for (int32_t b : lm.state_indices_tensor)
    SSM_CHECK(b >= 0 && b < cache.num_blocks(), "MiniMax forward: state index {} out of range", b);
  if (m_.num_full_layers() > 0) {
    SSM_CHECK(am.block_size == kv_block_size_ && static_cast<int>(am.seq_lens.size()) == B &&
                  static_cast<int>(am.slot_mapping.size()) == batch.num_tokens(),
              "MiniMax forward: paged-attention metadata missing or for block size {} (model: {})", am.block_size, kv_block_size_);
    for (int32_t b : am.block_tables)
      SSM_CHECK(b >= 0 && b < cache.num_blocks(), "MiniMax forward: KV block {} out of range", b);
  }
  const int64_t T = batch.num_tokens(), Hd = cfg_.hidden_size;
  hidden_.resize(T * Hd), normed_.resize(T * Hd), attn_.resize(T * Hd), moe_.resize(T * Hd);
  embed_tokens(batch, embedding_, hidden_.data());
  for (const MiniMaxLayer& L : layers_) {
    // 1. x^ = RMSNorm(x); h = alpha x^ + beta Attn(x^).
    cpu::rms_norm(hidden_.data(), L.input_norm.data(), cfg_.layer_norm_epsilon, T, Hd, normed_.data());
    if (L.is_linear) lightning_layer(L, batch, cache, T);
    else softmax_layer(L, batch, cache, T);
    const float a = L.is_linear ? m_.linear_alpha : m_.full_alpha, b = L.is_linear ? m_.linear_beta : m_.full_beta;
    for (int64_t i = 0; i < T * Hd; ++i) hidden_[i] = normed_[i] * a + attn_[i] * b;
    // 2. h^ = RMSNorm(h); out = alpha h^ + beta MoE(h^).
    cpu::rms_norm(hidden_.data(), L.post_norm.data(), cfg_.layer_norm_epsilon, T, Hd, normed_.data());
    cpu::sparse_moe(normed_.data(), T, Hd, L.gate, L.experts, m_.top_k, moe_.data());
    for (int64_t i = 0; i < T * Hd; ++i) hidden_[i] = normed_[i] * m_.mlp_alpha + moe_[i] * m_.mlp_beta;
  }
  final_norm_and_lm_head(batch, hidden_.data(), Hd, norm_f_.data(), cfg_.layer_norm_epsilon, lm_head_, logits);
}

void MiniMaxModel::lightning_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const LinearAttentionMetadata& md = batch.linear_meta;
  const int64_t HD = static_cast<int64_t>(m_.num_heads) * m_.head_dim, W = 3 * HD;
  proj_.resize(T * W), o_.resize(T * HD), gate_.resize(T * HD);
  // 1. qkv = SiLU(qkv_proj x^): [T, H, 3D].
  cpu::linear(normed_.data(), T, L.qkv_proj, nullptr, proj_.data());
  for (int64_t i = 0; i < T * W; ++i) proj_[i] = cpu::silu(proj_[i]);
  // 2. Lightning attention on this layer's part of each state page.
  const StateView all = cache.ssm_state(0);
  cpu::LightningParams p;
  p.num_heads = m_.num_heads, p.head_dim = m_.head_dim, p.block_size = m_.block_size, p.slopes = L.slopes.data();
  p.states = all;
  p.states.data = static_cast<std::byte*>(all.data) +
                  static_cast<int64_t>(L.linear_index) * m_.num_heads * m_.head_dim * m_.head_dim * dtype_size(all.dtype);
  const int nd = md.num_decodes;
  if (nd > 0) cpu::lightning_decode(proj_.data(), W, o_.data(), HD, p, std::span(md.state_indices_tensor).first(nd));
  if (md.num_prefills > 0)
    cpu::lightning_prefill(proj_.data(), W, o_.data(), HD, p, std::span(md.query_start_loc).subspan(nd),
                           std::span(md.num_computed_tokens).subspan(nd), std::span(md.state_indices_tensor).subspan(nd));
  // 3. RMSNorm over all heads, sigmoid gate from x^, out_proj.
  cpu::rms_norm(o_.data(), L.norm.data(), 1e-6f, T, HD, o_.data());
  cpu::linear(normed_.data(), T, L.output_gate, nullptr, gate_.data());
  for (int64_t i = 0; i < T * HD; ++i) o_[i] *= 1.0f / (1.0f + std::exp(-gate_[i]));
  cpu::linear(o_.data(), T, L.out_proj, nullptr, attn_.data());
}

void MiniMaxModel::softmax_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const PagedAttentionMetadata& md = batch.attn_meta;
  const int D = m_.head_dim;
  const int64_t QW = static_cast<int64_t>(m_.num_heads) * D, KW = static_cast<int64_t>(m_.num_kv_heads) * D;
  proj_.resize(T * (QW + 2 * KW)), o_.resize(T * QW);
  float* q = proj_.data();
  float* k = q + T * QW;
  float* v = k + T * KW;
  // 1. Projections and RoPE at each token's sequence position.
  cpu::linear(normed_.data(), T, L.q_proj, nullptr, q);
  cpu::linear(normed_.data(), T, L.k_proj, nullptr, k);
  cpu::linear(normed_.data(), T, L.v_proj, nullptr, v);
  cpu::apply_rope(q, QW, T, m_.num_heads, D, md.positions, inv_freq_);
  cpu::apply_rope(k, KW, T, m_.num_kv_heads, D, md.positions, inv_freq_);
  // 2. Write the new K/V into their slots, then attend over the cache (same path for prefill and decode rows).
  KvCacheView kv;
  kv.base = static_cast<std::byte*>(cache.ssm_state(0).data);
  kv.page_bytes = cache.page_bytes();
  kv.block_size = kv_block_size_, kv.num_kv_heads = m_.num_kv_heads, kv.head_dim = D;
  kv.layer_offset_bytes = static_cast<int64_t>(L.full_index) * kv.layer_bytes();
  cpu::reshape_and_cache(k, KW, v, KW, T, md.slot_mapping, kv, cache.num_blocks());
  cpu::paged_attention(q, QW, o_.data(), QW, m_.num_heads, 1.0f / std::sqrt(static_cast<float>(D)), kv, md.query_start_loc,
                       md.seq_lens, md.block_tables, md.max_num_blocks_per_seq);
  cpu::linear(o_.data(), T, L.o_proj, nullptr, attn_.data());
}

/// Bytes of all parameters at 2 bytes each (bf16 dummy weights), to refuse configs that cannot fit.
double dummy_bytes(const ModelConfig& cfg, const MiniMaxConfig& m) {
  const double Hd = cfg.hidden_size, V = cfg.vocab_size, HD = static_cast<double>(m.num_heads) * m.head_dim,
               KD = static_cast<double>(m.num_kv_heads) * m.head_dim, I = m.intermediate_size, E = m.num_experts;
  double n = V * Hd * (m.tie_word_embeddings ? 1 : 2);
  for (bool lin : m.is_linear) n += (lin ? 5 * HD * Hd : (2 * HD + 2 * KD) * Hd) + E * (3 * I * Hd + Hd);
  return 2 * n;
}

}  // namespace

std::unique_ptr<CausalLM> load_minimax(const ModelConfig& cfg, LoadFormat format) {
  const MiniMaxConfig m = MiniMaxConfig::from_json(cfg);
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  } else {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    const double ram = pages > 0 && page > 0 ? static_cast<double>(pages) * page : 0.0, need = dummy_bytes(cfg, m);
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    SSM_CHECK(ram == 0 || need <= 0.8 * ram,
              "{}: dummy MiniMax weights need {:.1f} GiB (bf16), more than 80% of the {:.1f} GiB of physical RAM",
              (cfg.dir / "config.json").string(), need / kGiB, ram / kGiB);
  }
  const int64_t Hd = cfg.hidden_size, V = cfg.vocab_size, D = m.head_dim, HD = m.num_heads * D, KD = m.num_kv_heads * D,
                I = m.intermediate_size, E = m.num_experts;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), hd_scale = 1.0f / std::sqrt(static_cast<float>(HD)),
              i_scale = 1.0f / std::sqrt(static_cast<float>(I));
  Weight emb = src.matrix("model.embed_tokens.weight", {V, Hd}, DummyInit::uniform(0.1f));
  std::vector<MiniMaxLayer> layers;
  int nlin = 0, nfull = 0;
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    MiniMaxLayer L;
    L.is_linear = m.is_linear[l];
    L.input_norm = src.vector(p + "input_layernorm.weight", {Hd}, DummyInit::constant(1.0f));
    L.post_norm = src.vector(p + "post_attention_layernorm.weight", {Hd}, DummyInit::constant(1.0f));
    if (L.is_linear) {
      L.linear_index = nlin++;
      L.qkv_proj = src.matrix(p + "self_attn.qkv_proj.weight", {3 * HD, Hd}, DummyInit::uniform(in_scale));
      L.output_gate = src.matrix(p + "self_attn.output_gate.weight", {HD, Hd}, DummyInit::uniform(in_scale));
      L.out_proj = src.matrix(p + "self_attn.out_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale));
      L.norm = src.vector(p + "self_attn.norm.weight", {HD}, DummyInit::constant(1.0f));
      L.slopes = m.slopes(l);
    } else {
      L.full_index = nfull++;
      L.q_proj = src.matrix(p + "self_attn.q_proj.weight", {HD, Hd}, DummyInit::uniform(in_scale));
      L.k_proj = src.matrix(p + "self_attn.k_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale));
      L.v_proj = src.matrix(p + "self_attn.v_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale));
      L.o_proj = src.matrix(p + "self_attn.o_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale));
    }
    L.gate = src.matrix(p + "block_sparse_moe.gate.weight", {E, Hd}, DummyInit::uniform(in_scale));
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      cpu::ExpertWeights w;
      w.w1 = src.matrix(q + "w1.weight", {I, Hd}, DummyInit::uniform(in_scale));
      w.w2 = src.matrix(q + "w2.weight", {Hd, I}, DummyInit::uniform(i_scale));
      w.w3 = src.matrix(q + "w3.weight", {I, Hd}, DummyInit::uniform(in_scale));
      for (Weight* proj : {&w.w1, &w.w2, &w.w3}) cpu::pack_for_linear(*proj);
      L.experts.push_back(std::move(w));
    }
    for (Weight* proj : {&L.qkv_proj, &L.output_gate, &L.out_proj, &L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate})
      if (proj->data) cpu::pack_for_linear(*proj);
    layers.push_back(std::move(L));
  }
  std::vector<float> norm_f = src.vector("model.norm.weight", {Hd}, DummyInit::constant(1.0f));
  Weight head = (m.tie_word_embeddings && !src.has("lm_head.weight")) ? emb : src.matrix("lm_head.weight", {V, Hd}, DummyInit::uniform(0.1f));
  return std::make_unique<MiniMaxModel>(cfg, m, std::move(emb), std::move(layers), std::move(norm_f), std::move(head), std::move(ckpt));
}

}  // namespace ssmserve
