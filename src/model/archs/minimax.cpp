// Owns the MiniMax hybrid forward pass over a packed batch (lightning layers through the decode / blocked-prefill
// kernels on their state blocks, softmax layers through the paged KV cache sharing the same pool, sparse MoE
// MLPs), its configuration and its weight loading.
#include "model/archs/minimax.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "dist/vocab_parallel.h"
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
  std::vector<float> slopes;  ///< [H] (this rank's heads)
  int linear_index = -1;      ///< position among the lightning layers (state page offset)
  // Softmax:
  Weight q_proj, k_proj, v_proj;  ///< [H D, Hd], [K D, Hd], [K D, Hd]
  Weight o_proj;                  ///< [Hd, H D]
  int full_index = -1;            ///< position among the softmax layers (KV page offset)
  // MoE:
  Weight gate;  ///< [E, Hd]
  std::vector<cpu::ExpertWeights> experts;
};

/// The model, or one tensor-parallel rank's shard of it: m_ keeps the unsharded hyperparameters, heads_ /
/// kv_heads_ count this rank's query and KV heads (all of them when tp_.world == 1).
class MiniMaxModel final : public CausalLM {
 public:
  MiniMaxModel(ModelConfig cfg, MiniMaxConfig m, Weight emb, std::vector<MiniMaxLayer> layers, std::vector<float> norm_f,
               Weight head, std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp, int heads, int kv_heads)
      : cfg_(std::move(cfg)), m_(std::move(m)), embedding_(std::move(emb)), layers_(std::move(layers)), norm_f_(std::move(norm_f)),
        lm_head_(std::move(head)), ckpt_(std::move(ckpt)), tp_(tp), heads_(heads), kv_heads_(kv_heads) {
    const int64_t D = m_.head_dim;
    state_elems_ = static_cast<int64_t>(m_.num_linear_layers()) * heads_ * D * D;
    // Page-size unification: a KV block holds as many tokens as make its page (all softmax layers' K and V) as
    // large as a state page (all lightning layers' fp32 states) -- computed for the unsharded model, so every
    // tensor-parallel rank uses the same block size as TP = 1.
    const int64_t full_state_elems = static_cast<int64_t>(m_.num_linear_layers()) * m_.num_heads * D * D;
    const int64_t kv_token_bytes = static_cast<int64_t>(m_.num_full_layers()) * 2 * m_.num_kv_heads * D * 4;
    if (kv_token_bytes > 0)
      kv_block_size_ = static_cast<int>(std::max<int64_t>(1, full_state_elems > 0 ? full_state_elems * 4 / kv_token_bytes : 64));
    inv_freq_ = cpu::rope_inv_freq(m_.rope_theta, m_.head_dim);
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return 1; }  // one page spans every layer (docs/architecture.md)
  /// TP = 1: the lightning states, the page at least one KV block. A shard (tp > 1): one region holding its
  /// heads' states or its KV heads' block, whichever is larger, counted in fp32 elements (TensorParallelLM
  /// places the ranks' regions side by side in the page; forward() checks the region fits the KV block).
  StateShape state_shape() const override {
    if (tp_.world == 1) return {0, state_elems_, kv_page_bytes()};
    return {0, std::max(state_elems_, (kv_page_bytes() + 3) / 4), 0};
  }
  int kv_block_size() const override { return kv_block_size_; }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;

 private:
  void lightning_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T);
  void softmax_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T);
  void sparse_moe_gathered(const MiniMaxLayer& L, int64_t T);
  /// Bytes of this rank's KV heads' K and V for one block across all softmax layers.
  int64_t kv_page_bytes() const {
    return static_cast<int64_t>(kv_block_size_) * m_.num_full_layers() * 2 * kv_heads_ * m_.head_dim * 4;
  }

  ModelConfig cfg_;
  MiniMaxConfig m_;
  Weight embedding_;
  std::vector<MiniMaxLayer> layers_;
  std::vector<float> norm_f_;
  Weight lm_head_;
  std::shared_ptr<const Checkpoint> ckpt_;
  dist::TpRank tp_;  // world 1: no communication
  int heads_ = 0, kv_heads_ = 0;  // this rank's query / KV heads
  int64_t state_elems_ = 0;
  int kv_block_size_ = 0;
  std::vector<float> inv_freq_;
  // Scratch for T packed tokens:
  std::vector<float> hidden_, normed_, attn_, proj_, o_, gate_, moe_;
  // tp > 1 (dist/gathered_linear.h): all-gathered head outputs / gates [T, H D], MoE scratch, collective scratch.
  std::vector<float> of_, gf_, moe_part_, moe_x_, moe_g_, moe_u_, moe_gf_, moe_y_, comm_;
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
    SSM_CHECK(tp_.world == 1 || cache.shape().ssm_elems * static_cast<int64_t>(dtype_size(cache.dtypes().ssm)) >= kv_page_bytes(),
              "MiniMax tensor-parallel forward: a rank's part of the page ({} elements of the SSM state dtype) cannot hold "
              "its {} bytes of KV block (use --mamba-ssm-cache-dtype float32 with --tensor-parallel-size > 1)",
              cache.shape().ssm_elems, kv_page_bytes());
  }
  const int64_t T = batch.num_tokens(), Hd = cfg_.hidden_size;
  hidden_.resize(T * Hd), normed_.resize(T * Hd), attn_.resize(T * Hd), moe_.resize(T * Hd);
  if (tp_.world > 1) dist::embed_tokens_vocab_parallel(batch, embedding_, cfg_.vocab_size, *tp_.comm, hidden_.data());
  else embed_tokens(batch, embedding_, hidden_.data());
  for (const MiniMaxLayer& L : layers_) {
    // 1. x^ = RMSNorm(x); h = alpha x^ + beta Attn(x^).
    cpu::rms_norm(hidden_.data(), L.input_norm.data(), cfg_.layer_norm_epsilon, T, Hd, normed_.data());
    if (L.is_linear) lightning_layer(L, batch, cache, T);
    else softmax_layer(L, batch, cache, T);
    const float a = L.is_linear ? m_.linear_alpha : m_.full_alpha, b = L.is_linear ? m_.linear_beta : m_.full_beta;
    for (int64_t i = 0; i < T * Hd; ++i) hidden_[i] = normed_[i] * a + attn_[i] * b;
    // 2. h^ = RMSNorm(h); out = alpha h^ + beta MoE(h^).
    cpu::rms_norm(hidden_.data(), L.post_norm.data(), cfg_.layer_norm_epsilon, T, Hd, normed_.data());
    if (tp_.world > 1) sparse_moe_gathered(L, T);
    else cpu::sparse_moe(normed_.data(), T, Hd, L.gate, L.experts, m_.top_k, moe_.data());
    for (int64_t i = 0; i < T * Hd; ++i) hidden_[i] = normed_[i] * m_.mlp_alpha + moe_[i] * m_.mlp_beta;
  }
  if (tp_.world > 1)
    dist::final_norm_and_lm_head_vocab_parallel(batch, hidden_.data(), Hd, norm_f_.data(), cfg_.layer_norm_epsilon, lm_head_,
                                                cfg_.vocab_size, *tp_.comm, logits);
  else final_norm_and_lm_head(batch, hidden_.data(), Hd, norm_f_.data(), cfg_.layer_norm_epsilon, lm_head_, logits);
}

void MiniMaxModel::lightning_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const LinearAttentionMetadata& md = batch.linear_meta;
  const int64_t HD = static_cast<int64_t>(heads_) * m_.head_dim, W = 3 * HD;  // this rank's heads
  proj_.resize(T * W), o_.resize(T * HD), gate_.resize(T * HD);
  // 1. qkv = SiLU(qkv_proj x^): [T, H, 3D].
  cpu::linear(normed_.data(), T, L.qkv_proj, nullptr, proj_.data());
  for (int64_t i = 0; i < T * W; ++i) proj_[i] = cpu::silu(proj_[i]);
  // 2. Lightning attention on this layer's part of each state page.
  const StateView all = cache.ssm_state(0);
  cpu::LightningParams p;
  p.num_heads = heads_, p.head_dim = m_.head_dim, p.block_size = m_.block_size, p.slopes = L.slopes.data();
  p.states = all;
  p.states.data = static_cast<std::byte*>(all.data) +
                  static_cast<int64_t>(L.linear_index) * heads_ * m_.head_dim * m_.head_dim * dtype_size(all.dtype);
  const int nd = md.num_decodes;
  if (nd > 0) cpu::lightning_decode(proj_.data(), W, o_.data(), HD, p, std::span(md.state_indices_tensor).first(nd));
  if (md.num_prefills > 0)
    cpu::lightning_prefill(proj_.data(), W, o_.data(), HD, p, std::span(md.query_start_loc).subspan(nd),
                           std::span(md.num_computed_tokens).subspan(nd), std::span(md.state_indices_tensor).subspan(nd));
  // 3. RMSNorm over all heads, sigmoid gate from x^, out_proj.
  cpu::linear(normed_.data(), T, L.output_gate, nullptr, gate_.data());
  if (tp_.world > 1) {
    // TP = 1's arithmetic (dist/gathered_linear.h): gather every head's output and gate, norm over all heads
    // (weight replicated), gate, then out_proj split by output rows.
    const int64_t HF = static_cast<int64_t>(m_.num_heads) * m_.head_dim, Hd = cfg_.hidden_size;
    of_.resize(T * HF), gf_.resize(T * HF);
    dist::all_gather_columns(o_.data(), T, HD, HD, *tp_.comm, of_.data(), HF, comm_);
    dist::all_gather_columns(gate_.data(), T, HD, HD, *tp_.comm, gf_.data(), HF, comm_);
    cpu::rms_norm(of_.data(), L.norm.data(), 1e-6f, T, HF, of_.data());
    for (int64_t i = 0; i < T * HF; ++i) of_[i] *= 1.0f / (1.0f + std::exp(-gf_[i]));
    dist::output_split_linear(of_.data(), T, HF, L.out_proj, nullptr, Hd, *tp_.comm, attn_.data(), Hd, comm_);
    return;
  }
  cpu::rms_norm(o_.data(), L.norm.data(), 1e-6f, T, HD, o_.data());
  for (int64_t i = 0; i < T * HD; ++i) o_[i] *= 1.0f / (1.0f + std::exp(-gate_[i]));
  cpu::linear(o_.data(), T, L.out_proj, nullptr, attn_.data());
}

// moe_ = cpu::sparse_moe(normed_) on a tensor-parallel rank with TP = 1's arithmetic: the replicated router picks
// the same experts on every rank; per expert (ascending), each rank computes its I / tp rows of w1 / w3, the ranks
// all-gather silu(w1 x) * (w3 x) into the whole I, and each computes its output rows of w2 over the whole I and
// adds them, weighted, into its output columns exactly as sparse_moe does; the columns are all-gathered last.
void MiniMaxModel::sparse_moe_gathered(const MiniMaxLayer& L, int64_t T) {
  const int E = static_cast<int>(L.experts.size()), K = m_.top_k;
  const int64_t Hd = cfg_.hidden_size, IF = m_.intermediate_size, W = tp_.world;
  const int64_t per = (Hd + W - 1) / W, oc = dist::output_shard(Hd, tp_.comm->rank(), tp_.world).size();
  std::vector<float> logits(static_cast<size_t>(T * E)), wts(static_cast<size_t>(T * K));
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  cpu::linear(normed_.data(), T, L.gate, nullptr, logits.data());
  cpu::moe_route(logits.data(), T, E, K, ids.data(), wts.data());
  moe_part_.assign(static_cast<size_t>(T * per), 0.0f);
  std::vector<int64_t> tok;
  std::vector<float> tw;
  for (int e = 0; e < E; ++e) {
    tok.clear(), tw.clear();
    for (int64_t t = 0; t < T; ++t)
      for (int k = 0; k < K; ++k)
        if (ids[t * K + k] == e) tok.push_back(t), tw.push_back(wts[t * K + k]);
    if (tok.empty()) continue;  // the same on every rank: no collective
    const cpu::ExpertWeights& w = L.experts[e];
    const int64_t n = static_cast<int64_t>(tok.size()), I = w.w1.rows;
    moe_x_.resize(n * Hd), moe_g_.resize(n * I), moe_u_.resize(n * I), moe_gf_.resize(n * IF), moe_y_.resize(n * std::max<int64_t>(oc, 1));
    for (int64_t i = 0; i < n; ++i) std::copy_n(normed_.data() + tok[i] * Hd, Hd, moe_x_.data() + i * Hd);
    cpu::linear(moe_x_.data(), n, w.w1, nullptr, moe_g_.data());
    cpu::linear(moe_x_.data(), n, w.w3, nullptr, moe_u_.data());
    for (int64_t i = 0; i < n * I; ++i) moe_g_[i] = cpu::silu(moe_g_[i]) * moe_u_[i];
    dist::all_gather_columns(moe_g_.data(), n, I, I, *tp_.comm, moe_gf_.data(), IF, comm_);
    if (oc == 0) continue;
    cpu::linear(moe_gf_.data(), n, IF, w.w2, nullptr, moe_y_.data(), oc);
    for (int64_t i = 0; i < n; ++i) {
      float* o = moe_part_.data() + tok[i] * per;
      const float* yi = moe_y_.data() + i * oc;
      for (int64_t c = 0; c < oc; ++c) o[c] += yi[c] * tw[i];
    }
  }
  dist::all_gather_output_columns(moe_part_.data(), T, Hd, *tp_.comm, moe_.data(), Hd, comm_);
}

void MiniMaxModel::softmax_layer(const MiniMaxLayer& L, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const PagedAttentionMetadata& md = batch.attn_meta;
  const int D = m_.head_dim;
  const int64_t QW = static_cast<int64_t>(heads_) * D, KW = static_cast<int64_t>(kv_heads_) * D;  // this rank's heads
  proj_.resize(T * (QW + 2 * KW)), o_.resize(T * QW);
  float* q = proj_.data();
  float* k = q + T * QW;
  float* v = k + T * KW;
  // 1. Projections and RoPE at each token's sequence position.
  cpu::linear(normed_.data(), T, L.q_proj, nullptr, q);
  cpu::linear(normed_.data(), T, L.k_proj, nullptr, k);
  cpu::linear(normed_.data(), T, L.v_proj, nullptr, v);
  cpu::apply_rope(q, QW, T, heads_, D, md.positions, inv_freq_);
  cpu::apply_rope(k, KW, T, kv_heads_, D, md.positions, inv_freq_);
  // 2. Write the new K/V into their slots, then attend over the cache (same path for prefill and decode rows).
  KvCacheView kv;
  kv.base = static_cast<std::byte*>(cache.ssm_state(0).data);
  kv.page_bytes = cache.page_bytes();
  kv.block_size = kv_block_size_, kv.num_kv_heads = kv_heads_, kv.head_dim = D;
  kv.layer_offset_bytes = static_cast<int64_t>(L.full_index) * kv.layer_bytes();
  cpu::reshape_and_cache(k, KW, v, KW, T, md.slot_mapping, kv, cache.num_blocks());
  cpu::paged_attention(q, QW, o_.data(), QW, heads_, 1.0f / std::sqrt(static_cast<float>(D)), kv, md.query_start_loc,
                       md.seq_lens, md.block_tables, md.max_num_blocks_per_seq);
  if (tp_.world > 1) {  // o_proj split by output rows over every rank's heads (dist/gathered_linear.h)
    const int64_t QF = static_cast<int64_t>(m_.num_heads) * D, Hd = cfg_.hidden_size;
    of_.resize(T * QF);
    dist::all_gather_columns(o_.data(), T, QW, QW, *tp_.comm, of_.data(), QF, comm_);
    dist::output_split_linear(of_.data(), T, QF, L.o_proj, nullptr, Hd, *tp_.comm, attn_.data(), Hd, comm_);
    return;
  }
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

std::unique_ptr<CausalLM> load_minimax(const ModelConfig& cfg, LoadFormat format, const dist::TpRank& tp) {
  const MiniMaxConfig m = MiniMaxConfig::from_json(cfg);
  SSM_CHECK(tp.world == 1 || tp.comm, "load_minimax: tensor-parallel size {} needs a communicator", tp.world);
  // This rank's query heads h, KV heads kv (split, or one replicated head when tp is a multiple of K), expert
  // rows i and vocabulary rows v (everything when tp.world == 1). Checked before any weight is read.
  const dist::Range h = dist::even_shard(m.num_heads, tp.rank, tp.world, "MiniMax num_attention_heads");
  dist::Range kv{0, m.num_kv_heads};
  if (m.num_kv_heads % tp.world == 0) kv = dist::even_shard(m.num_kv_heads, tp.rank, tp.world, "MiniMax num_key_value_heads");
  else {
    SSM_CHECK(m.num_full_layers() == 0 || tp.world % m.num_kv_heads == 0,
              "--tensor-parallel-size {}: MiniMax num_key_value_heads {} must be a multiple of it or divide it", tp.world,
              m.num_kv_heads);
    kv.begin = static_cast<int64_t>(tp.rank) * m.num_kv_heads / tp.world, kv.end = kv.begin + 1;
  }
  const dist::Range i = dist::even_shard(m.intermediate_size, tp.rank, tp.world, "MiniMax intermediate_size (tensor-parallel experts)");
  const dist::Range v = dist::vocab_shard(cfg.vocab_size, tp.rank, tp.world);
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
  const int64_t hD0 = h.begin * D, hD1 = h.end * D;
  const dist::Range hd{hD0, hD1}, kvd{kv.begin * D, kv.end * D};
  const dist::Range o = dist::output_shard(Hd, tp.rank, tp.world);  // output rows of out_proj / o_proj / w2
  Weight emb = dist::slice_rows(src.matrix("model.embed_tokens.weight", {V, Hd}, DummyInit::uniform(0.1f)), {v});
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
      // qkv_proj rows are [H, 3D] (q | k | v per head): a rank's heads are one contiguous row range.
      L.qkv_proj = dist::slice_rows(src.matrix(p + "self_attn.qkv_proj.weight", {3 * HD, Hd}, DummyInit::uniform(in_scale)),
                                    {{3 * hD0, 3 * hD1}});
      L.output_gate = dist::slice_rows(src.matrix(p + "self_attn.output_gate.weight", {HD, Hd}, DummyInit::uniform(in_scale)), {hd});
      // out_proj split by output rows and the norm over all heads (replicated): dist/gathered_linear.h.
      L.out_proj = dist::slice_rows(src.matrix(p + "self_attn.out_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale)), {o});
      L.norm = src.vector(p + "self_attn.norm.weight", {HD}, DummyInit::constant(1.0f));
      L.slopes = dist::slice_rows(m.slopes(l), 1, {h});
      // transformers 5.x may save its decay buffers, rounded to bf16: known and recomputed from the config in fp32
      // (m.slopes), so they do not count as unused tensors.
      for (const char* buf : {"slope_rate", "query_decay", "key_decay", "diagonal_decay"}) (void)src.has(p + "self_attn." + buf);
    } else {
      L.full_index = nfull++;
      L.q_proj = dist::slice_rows(src.matrix(p + "self_attn.q_proj.weight", {HD, Hd}, DummyInit::uniform(in_scale)), {hd});
      L.k_proj = dist::slice_rows(src.matrix(p + "self_attn.k_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), {kvd});
      L.v_proj = dist::slice_rows(src.matrix(p + "self_attn.v_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), {kvd});
      L.o_proj = dist::slice_rows(src.matrix(p + "self_attn.o_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale)), {o});
    }
    L.gate = src.matrix(p + "block_sparse_moe.gate.weight", {E, Hd}, DummyInit::uniform(in_scale));
    for (int64_t e = 0; e < E; ++e) {
      const std::string q = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
      cpu::ExpertWeights w;
      w.w1 = dist::slice_rows(src.matrix(q + "w1.weight", {I, Hd}, DummyInit::uniform(in_scale)), {i});
      w.w2 = dist::slice_rows(src.matrix(q + "w2.weight", {Hd, I}, DummyInit::uniform(i_scale)), {o});  // output rows
      w.w3 = dist::slice_rows(src.matrix(q + "w3.weight", {I, Hd}, DummyInit::uniform(in_scale)), {i});
      for (Weight* proj : {&w.w1, &w.w2, &w.w3}) cpu::pack_for_linear(*proj);
      L.experts.push_back(std::move(w));
    }
    for (Weight* proj : {&L.qkv_proj, &L.output_gate, &L.out_proj, &L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate})
      if (proj->data) cpu::pack_for_linear(*proj);
    layers.push_back(std::move(L));
  }
  std::vector<float> norm_f = src.vector("model.norm.weight", {Hd}, DummyInit::constant(1.0f));
  Weight head = (m.tie_word_embeddings && !src.has("lm_head.weight"))
                    ? emb
                    : dist::slice_rows(src.matrix("lm_head.weight", {V, Hd}, DummyInit::uniform(0.1f)), {v});
  if (tp.rank == 0) src.warn_unused_tensors();
  return std::make_unique<MiniMaxModel>(cfg, m, std::move(emb), std::move(layers), std::move(norm_f), std::move(head), std::move(ckpt),
                                        tp, static_cast<int>(h.size()), static_cast<int>(kv.size()));
}

}  // namespace ssmserve
