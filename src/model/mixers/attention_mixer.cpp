// Owns the softmax-attention mixer on the CPU: q / k / v (and output gate) projections, the per-head q / k RMSNorms,
// RoPE, the write of the new K / V into their slots, paged attention over each sequence's blocks, the sigmoid output
// gate, o_proj.
#include "model/mixers/attention_mixer.h"

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/rope.h"
#include "model/weight.h"
#include "model/decoder/params.h"

namespace ssmserve {
namespace {

class AttentionMixer final : public CpuModule {
 public:
  int num_heads = 0, num_kv_heads = 0, heads = 0, kv_heads = 0, head_dim = 0;  // all, this rank's
  int64_t hidden = 0;
  float scale = 1.0f;
  bool rope = true;
  std::vector<float> inv_freq;
  Weight q_proj, k_proj, v_proj, o_proj;  ///< [h D, hidden], [k D, hidden] x2, [output rows, H D]
  Weight gate;                            ///< [h D, hidden] (attn_output_gate), or empty
  std::vector<float> q_norm, k_norm;      ///< [D] effective weights (qk_norm), or empty
  float qk_norm_eps = 1e-6f;
  dist::TpRank tp;

  ModuleStateSpec state_spec() const override {
    ModuleStateSpec s;
    s.kv_token_bytes = 2 * static_cast<int64_t>(kv_heads) * head_dim * 4;
    s.full_kv_token_bytes = 2 * static_cast<int64_t>(num_kv_heads) * head_dim * 4;
    return s;
  }

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    const PagedAttentionMetadata& md = step.batch.attn_meta;
    const int D = head_dim;
    const int64_t QW = static_cast<int64_t>(heads) * D, KW = static_cast<int64_t>(kv_heads) * D;
    Scratch& s = step.scratch;
    const bool gated = gate.rows > 0;
    float* q = s.f32(0, T * ((gated ? 2 : 1) * QW + 2 * KW));  // q [T, QW], k, v [T, KW], g [T, QW]
    float* k = q + T * QW;
    float* v = k + T * KW;
    float* g = v + T * KW;
    float* o = s.f32(1, T * QW);
    // 1. Projections, the per-head q / k norms (each head's D values a row), RoPE at each token's sequence position.
    cpu::linear(x, T, q_proj, nullptr, q);
    cpu::linear(x, T, k_proj, nullptr, k);
    cpu::linear(x, T, v_proj, nullptr, v);
    if (gated) cpu::linear(x, T, gate, nullptr, g);
    if (!q_norm.empty()) {
      cpu::rms_norm(q, q_norm.data(), qk_norm_eps, T * heads, D, q);
      cpu::rms_norm(k, k_norm.data(), qk_norm_eps, T * kv_heads, D, k);
    }
    if (rope) {
      cpu::apply_rope(q, QW, T, heads, D, md.positions, inv_freq);
      cpu::apply_rope(k, KW, T, kv_heads, D, md.positions, inv_freq);
    }
    // 2. Write the new K/V into their slots, then attend over the cache (same path for prefill and decode rows).
    KvCacheView kv = step.state.kv;
    kv.num_kv_heads = kv_heads, kv.head_dim = D;
    cpu::reshape_and_cache(k, KW, v, KW, T, md.slot_mapping, kv, step.state.num_blocks);
    cpu::paged_attention(q, QW, o, QW, heads, scale, kv, md.query_start_loc, md.seq_lens, md.block_tables, md.max_num_blocks_per_seq);
    // 3. Output gate: o *= sigmoid(g), elementwise in the same [heads, D] order.
    if (gated)
      for (int64_t i = 0; i < T * QW; ++i) o[i] *= 1.0f / (1.0f + std::exp(-g[i]));
    if (tp.world > 1) {  // o_proj split by output rows over every rank's heads (dist/gathered_linear.h)
      const int64_t QF = static_cast<int64_t>(num_heads) * D;
      float* of = s.f32(2, T * QF);
      dist::all_gather_columns(o, T, QW, QW, *tp.comm, of, QF, s.vec(3));
      dist::output_split_linear(of, T, QF, o_proj, nullptr, hidden, *tp.comm, out, hidden, s.vec(3));
      return;
    }
    cpu::linear(o, T, o_proj, nullptr, out);
  }
};

}  // namespace

AttentionConfig AttentionConfig::from_json(const nlohmann::json& j, const ModelConfig& cfg) {
  AttentionConfig c;
  c.num_heads = param_int(j, "num_attention_heads", -1);
  c.num_kv_heads = param_int(j, "num_key_value_heads", c.num_heads);
  SSM_CHECK(c.num_heads % c.num_kv_heads == 0, "config.json: num_attention_heads {} must be a multiple of num_key_value_heads {}",
            c.num_heads, c.num_kv_heads);
  const bool has_head_dim = j.contains("head_dim") && !j["head_dim"].is_null();
  SSM_CHECK(has_head_dim || cfg.hidden_size % c.num_heads == 0,
            "config.json: hidden_size {} is not a multiple of num_attention_heads {} (and no head_dim is given)", cfg.hidden_size,
            c.num_heads);
  c.head_dim = param_int(j, "head_dim", cfg.hidden_size / c.num_heads);
  SSM_CHECK(c.num_heads <= 4096 && c.head_dim <= 1024 && c.head_dim % 2 == 0,
            "config.json: num_attention_heads must be <= 4096 and head_dim even and <= 1024 (got {} and {})", c.num_heads, c.head_dim);
  c.rope = !(j.contains("position_embedding_type") && j["position_embedding_type"] == "nope");
  if (c.rope) c.rope_theta = param_rope_theta(j, 10000.0);
  float partial = param_float(j, {"partial_rotary_factor"}, 1.0f);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object() && j["rope_parameters"].contains("partial_rotary_factor"))
    partial = param_float(j["rope_parameters"], {"partial_rotary_factor"}, partial);
  SSM_CHECK(partial > 0.0f && partial <= 1.0f, "config.json: partial_rotary_factor must be in (0, 1] (got {})", partial);
  c.rotary_dim = static_cast<int>(c.head_dim * partial);
  // transformers rotates an odd int(head_dim * factor) as the next even count with the odd one's frequencies; no
  // published model has one: refused rather than computed differently.
  SSM_CHECK(!c.rope || c.rotary_dim % 2 == 0,
            "config.json: head_dim {} x partial_rotary_factor {} = {} rotary dims; they must be even (pairs)", c.head_dim,
            partial, c.rotary_dim);
  SSM_CHECK(!c.rope || c.rotary_dim >= 2, "config.json: partial_rotary_factor {} leaves no dims to rotate", partial);
  c.in_multiplier = param_float(j, {"attention_in_multiplier"}, 1.0f);
  c.key_multiplier = param_float(j, {"key_multiplier"}, 1.0f);
  SSM_CHECK(!param_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported");
  c.scale = param_float(j, {"attention_multiplier"}, 1.0f / std::sqrt(static_cast<float>(c.head_dim)));
  c.attn_output_gate = param_bool(j, "attn_output_gate", false);
  c.qk_norm = param_bool(j, "qk_norm", false);
  c.qk_norm_eps = param_float(j, {"rms_norm_eps"}, 1e-6f);
  SSM_CHECK(!c.qk_norm || c.qk_norm_eps >= 0.0f, "config.json: rms_norm_eps must be >= 0 (got {})", c.qk_norm_eps);
  c.qk_norm_weight_offset = param_float(j, {"qk_norm_weight_offset"}, 0.0f);
  // Qwen3.5's multimodal RoPE (rope_parameters.mrope_section, mrope_interleaved) gives each rotary frequency the
  // temporal, height or width position id; a text token's three ids are all its sequence position, so every frequency
  // sees that position and M-RoPE is the plain RoPE over rotary_dim above. The fields are accepted (text only) and
  // ignored; rope_type other than "default" is refused by param_rope_theta.
  return c;
}

AttentionWeights read_attention_weights(WeightSource& src, const std::string& p, int64_t Hd, const AttentionConfig& c) {
  const int64_t D = c.head_dim, HD = int64_t{c.num_heads} * D, KD = int64_t{c.num_kv_heads} * D;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), hd_scale = 1.0f / std::sqrt(static_cast<float>(HD));
  AttentionWeights w;
  const float in = c.in_multiplier, key = c.in_multiplier * c.key_multiplier;
  if (c.attn_output_gate) {  // [2 H D, hidden]: per head h, rows [2hD, 2hD + D) are q_h, [2hD + D, 2(h + 1)D) gate_h
    const Weight qg = src.matrix(p + "q_proj.weight", {2 * HD, Hd}, DummyInit::uniform(in_scale));
    std::vector<dist::Range> qr, gr;
    for (int64_t h = 0; h < c.num_heads; ++h) qr.push_back({2 * h * D, 2 * h * D + D}), gr.push_back({2 * h * D + D, 2 * (h + 1) * D});
    w.q_proj = scale_rows(dist::slice_rows(qg, qr), [&](int64_t) { return in; });
    w.gate = scale_rows(dist::slice_rows(qg, gr), [&](int64_t) { return in; });
  } else {
    w.q_proj = scale_rows(src.matrix(p + "q_proj.weight", {HD, Hd}, DummyInit::uniform(in_scale)), [&](int64_t) { return in; });
  }
  if (c.qk_norm) {  // the effective weights offset + w (Qwen's zero-centred RMSNorm: offset 1)
    w.q_norm = src.vector(p + "q_norm.weight", {D}, DummyInit::uniform(0.5f));
    w.k_norm = src.vector(p + "k_norm.weight", {D}, DummyInit::uniform(0.5f));
    for (std::vector<float>* n : {&w.q_norm, &w.k_norm})
      for (float& x : *n) x += c.qk_norm_weight_offset;
  }
  w.k_proj = scale_rows(src.matrix(p + "k_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), [&](int64_t) { return key; });
  w.v_proj = scale_rows(src.matrix(p + "v_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), [&](int64_t) { return in; });
  w.o_proj = src.matrix(p + "o_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale));
  return w;
}

std::unique_ptr<CpuModule> make_attention_mixer(const ModuleArgs& a) {
  const AttentionConfig c = AttentionConfig::from_json(a.params, a.cfg);
  const dist::TpRank& tp = a.tp;
  auto m = std::make_unique<AttentionMixer>();
  m->hidden = a.cfg.hidden_size;
  m->num_heads = c.num_heads, m->num_kv_heads = c.num_kv_heads, m->head_dim = c.head_dim;
  m->rope = c.rope;
  if (m->rope) m->inv_freq = cpu::rope_inv_freq(c.rope_theta, c.rotary_dim);
  m->scale = c.scale;
  m->qk_norm_eps = c.qk_norm_eps;
  m->tp = tp;
  // This rank's query heads h and KV heads kv (split, or one replicated head when tp is a multiple of K).
  const dist::Range h = dist::even_shard(m->num_heads, tp.rank, tp.world, a.label + " num_attention_heads");
  dist::Range kv{0, m->num_kv_heads};
  if (m->num_kv_heads % tp.world == 0) {
    kv = dist::even_shard(m->num_kv_heads, tp.rank, tp.world, a.label + " num_key_value_heads");
  } else {
    SSM_CHECK(tp.world % m->num_kv_heads == 0, "--tensor-parallel-size {}: {} num_key_value_heads {} must be a multiple of it or divide it",
              tp.world, a.label, m->num_kv_heads);
    kv.begin = static_cast<int64_t>(tp.rank) * m->num_kv_heads / tp.world, kv.end = kv.begin + 1;
  }
  m->heads = static_cast<int>(h.size()), m->kv_heads = static_cast<int>(kv.size());
  const int64_t Hd = a.cfg.hidden_size, D = m->head_dim;
  const dist::Range hd{h.begin * D, h.end * D}, kvd{kv.begin * D, kv.end * D}, o = dist::output_shard(Hd, tp.rank, tp.world);
  AttentionWeights w = read_attention_weights(a.src, a.prefix, Hd, c);
  m->q_proj = dist::slice_rows(w.q_proj, {hd});
  m->k_proj = dist::slice_rows(w.k_proj, {kvd});
  m->v_proj = dist::slice_rows(w.v_proj, {kvd});
  m->o_proj = dist::slice_rows(w.o_proj, {o});
  if (c.attn_output_gate) {
    m->gate = dist::slice_rows(w.gate, {hd});
    cpu::pack_for_linear(m->gate);
    m->gate.round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  }
  m->q_norm = std::move(w.q_norm), m->k_norm = std::move(w.k_norm);
  for (Weight* x : {&m->q_proj, &m->k_proj, &m->v_proj, &m->o_proj}) {
    cpu::pack_for_linear(*x);
    x->round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  }
  return m;
}

}  // namespace ssmserve
