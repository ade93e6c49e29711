// Owns the Gated DeltaNet mixer on the CPU: its hyperparameters, the weight reading (both checkpoint layouts, the
// rank's heads) and the forward over a packed batch (decode rows through the one-token conv update and delta-rule
// step, prefill rows through the varlen conv and the chunked delta rule from their cached state).
#include "model/mixers/gated_delta_mixer.h"

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/gated_rms_norm.h"
#include "kernels/cpu/linear.h"
#include "model/decoder/params.h"
#include "model/mixers/prefill_segments.h"
#include "model/weight.h"

namespace ssmserve {

GatedDeltaConfig GatedDeltaConfig::from_json(const nlohmann::json& j, const ModelConfig& cfg) {
  (void)cfg;
  GatedDeltaConfig c;
  c.num_k_heads = param_int(j, "linear_num_key_heads", -1);
  c.num_v_heads = param_int(j, "linear_num_value_heads", -1);
  c.head_k_dim = param_int(j, "linear_key_head_dim", -1);
  c.head_v_dim = param_int(j, "linear_value_head_dim", -1);
  c.conv_kernel = param_int(j, "linear_conv_kernel_dim", 4);
  c.chunk_size = param_int(j, "chunk_size", 64);
  c.eps = param_float(j, {"rms_norm_eps"}, 1e-6f);
  c.projection_layout = param_string(j, "projection_layout", "qwen3_5");
  SSM_CHECK(c.num_v_heads % c.num_k_heads == 0, "config.json: linear_num_value_heads {} must be a multiple of linear_num_key_heads {}",
            c.num_v_heads, c.num_k_heads);
  SSM_CHECK(c.num_v_heads <= 4096 && c.head_k_dim <= 1024 && c.head_v_dim <= 1024,
            "config.json: linear_num_value_heads must be <= 4096 and linear_key/value_head_dim <= 1024");
  SSM_CHECK(c.conv_kernel <= cpu::kMaxConvWidth, "config.json: linear_conv_kernel_dim {} must be in [1, {}]", c.conv_kernel,
            cpu::kMaxConvWidth);
  SSM_CHECK(c.chunk_size <= 1024, "config.json: chunk_size {} must be <= 1024", c.chunk_size);
  SSM_CHECK(c.projection_layout == "qwen3_5" || c.projection_layout == "qwen3_next",
            "Gated DeltaNet projection_layout must be \"qwen3_5\" or \"qwen3_next\" (got \"{}\")", c.projection_layout);
  const std::string act = param_string(j, "hidden_act", "silu");
  SSM_CHECK(act == "silu" || act == "swish", "config.json: hidden_act \"{}\" is not supported by Gated DeltaNet (silu)", act);
  return c;
}

GatedDeltaWeights read_gated_delta_weights(WeightSource& src, const std::string& p, int64_t Hd, const GatedDeltaConfig& c) {
  const int64_t Kd = c.key_dim(), Vd = c.value_dim(), Hv = c.num_v_heads, Hk = c.num_k_heads;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), v_scale = 1.0f / std::sqrt(static_cast<float>(Vd));
  GatedDeltaWeights w;
  if (c.projection_layout == "qwen3_5") {
    const Weight qkv = src.matrix(p + "in_proj_qkv.weight", {2 * Kd + Vd, Hd}, DummyInit::uniform(in_scale));
    const Weight z = src.matrix(p + "in_proj_z.weight", {Vd, Hd}, DummyInit::uniform(in_scale));
    const Weight b = src.matrix(p + "in_proj_b.weight", {Hv, Hd}, DummyInit::uniform(in_scale));
    const Weight a = src.matrix(p + "in_proj_a.weight", {Hv, Hd}, DummyInit::uniform(in_scale));
    w.in_proj = stack_rows({{&qkv, 0, qkv.rows}, {&z, 0, z.rows}, {&b, 0, b.rows}, {&a, 0, a.rows}});
  } else {
    // Qwen3-Next: key head i's group of qkvz rows is [q_i (Dk) | k_i (Dk) | v (r Dv) | z (r Dv)], of ba rows
    // [b (r) | a (r)], r = Hv / Hk (transformers' fix_query_key_value_ordering).
    const int64_t r = Hv / Hk, Dk = c.head_k_dim, rDv = r * c.head_v_dim, G = 2 * Dk + 2 * rDv;
    const Weight qkvz = src.matrix(p + "in_proj_qkvz.weight", {2 * Kd + 2 * Vd, Hd}, DummyInit::uniform(in_scale));
    const Weight ba = src.matrix(p + "in_proj_ba.weight", {2 * Hv, Hd}, DummyInit::uniform(in_scale));
    std::vector<RowRun> runs;
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&qkvz, i * G, i * G + Dk});                       // q
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&qkvz, i * G + Dk, i * G + 2 * Dk});              // k
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&qkvz, i * G + 2 * Dk, i * G + 2 * Dk + rDv});    // v
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&qkvz, i * G + 2 * Dk + rDv, (i + 1) * G});      // z
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&ba, i * 2 * r, i * 2 * r + r});                  // b
    for (int64_t i = 0; i < Hk; ++i) runs.push_back({&ba, i * 2 * r + r, (i + 1) * 2 * r});            // a
    w.in_proj = stack_rows(runs);
  }
  w.conv_weight = src.vector(p + "conv1d.weight", {c.conv_dim(), 1, c.conv_kernel}, DummyInit::uniform(0.5f));
  w.A_log = src.vector(p + "A_log", {Hv}, DummyInit::log_arange());
  w.dt_bias = src.vector(p + "dt_bias", {Hv}, DummyInit::uniform(1.0f));
  w.norm = src.vector(p + "norm.weight", {c.head_v_dim}, DummyInit::constant(1.0f));
  w.out_proj = src.matrix(p + "out_proj.weight", {Hd, Vd}, DummyInit::uniform(v_scale));
  return w;
}

std::vector<std::pair<int64_t, int64_t>> gated_delta_rank_rows(const GatedDeltaConfig& c, int rank, int world) {
  const dist::Range hk = dist::even_shard(c.num_k_heads, rank, world, "Gated DeltaNet linear_num_key_heads");
  const int64_t r = c.num_v_heads / c.num_k_heads, Dk = c.head_k_dim, Dv = c.head_v_dim, Kd = c.key_dim(), Vd = c.value_dim();
  const int64_t v0 = hk.begin * r, v1 = hk.end * r, Hv = c.num_v_heads;
  return {{hk.begin * Dk, hk.end * Dk},                          // q
          {Kd + hk.begin * Dk, Kd + hk.end * Dk},                // k
          {2 * Kd + v0 * Dv, 2 * Kd + v1 * Dv},                  // v
          {2 * Kd + Vd + v0 * Dv, 2 * Kd + Vd + v1 * Dv},        // z
          {2 * Kd + 2 * Vd + v0, 2 * Kd + 2 * Vd + v1},          // b
          {2 * Kd + 2 * Vd + Hv + v0, 2 * Kd + 2 * Vd + Hv + v1}};  // a
}

ModuleStateSpec gated_delta_state_spec(const GatedDeltaConfig& m, const GatedDeltaConfig& full) {
  ModuleStateSpec s;
  s.conv_elems = static_cast<int64_t>(m.conv_kernel - 1) * m.conv_dim();
  s.ssm_elems = int64_t{m.num_v_heads} * m.head_k_dim * m.head_v_dim;
  s.full_state_elems = static_cast<int64_t>(full.conv_kernel - 1) * full.conv_dim() + int64_t{full.num_v_heads} * full.head_k_dim * full.head_v_dim;
  return s;
}

namespace {

/// One layer, or a rank's shard of it (m_: this rank's heads; full_: unsharded).
class GatedDeltaMixer final : public CpuModule {
 public:
  /// This rank's weights, ready for the forward.
  struct HeldWeights {
    Weight in_proj;                  ///< [rank's proj rows, hidden] (packed)
    Weight out_proj;                 ///< [output rows, full value_dim] (packed)
    std::vector<float> conv_weight;  ///< [rank's conv channels, K]
    std::vector<float> A, dt_bias;   ///< [rank's Hv]
    std::vector<float> norm_full;    ///< [rank's Hv Dv]: the [Dv] norm weight repeated per head
  };
  GatedDeltaMixer(GatedDeltaConfig m, GatedDeltaConfig full, int64_t hidden, HeldWeights w, const dist::TpRank& tp)
      : m_(std::move(m)), full_(std::move(full)), H_(hidden), w_(std::move(w)), tp_(tp) {}

  ModuleStateSpec state_spec() const override { return gated_delta_state_spec(m_, full_); }

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    const MambaBatchMetadata& md = step.batch.meta;
    const int64_t Kd = m_.key_dim(), Vd = m_.value_dim(), C = m_.conv_dim(), PW = m_.proj_rows();
    const int Hk = m_.num_k_heads, Hv = m_.num_v_heads, Dk = m_.head_k_dim;
    const int64_t nd = md.num_decode_rows(), P0 = step.batch.prefill_token_offset();
    Scratch& s = step.scratch;
    float* proj = s.f32(0, T * PW);
    float* qkv = s.f32(1, T * C);
    float* gb = s.f32(2, T * 2 * Hv);  // [T, g (Hv) | beta (Hv)]
    float* o = s.f32(3, T * Vd);
    // 1. Input projection [q | k | v | z | b | a].
    cpu::linear(x, T, w_.in_proj, nullptr, proj);
    // 2. Causal conv1d + SiLU over [q | k | v].
    const cpu::ConvParams conv{C, m_.conv_kernel, w_.conv_weight.data(), nullptr, step.state.conv, true};
    if (nd > 0) cpu::causal_conv1d_update(proj, PW, qkv, C, conv, md.decode_rows());
    const ModuleStateSpec spec = state_spec();
    const std::vector<PrefillSegment> pieces = md.has_state_stores() ? split_prefill_rows(md) : std::vector<PrefillSegment>{};
    std::vector<float>& shadow = s.vec(kPieceStateScratchSlot);  // 16-bit states' fp32 carry between pieces
    if (md.num_prefills > 0 && pieces.empty())
      cpu::causal_conv1d_fwd(proj + P0 * PW, PW, qkv + P0 * C, C, conv, md.query_start_loc_p, md.state_indices_tensor_p,
                             md.has_initial_states_p);
    // "all" mode: store the conv window at each block boundary.
    run_prefill_pieces(pieces, step.state.conv, spec.conv_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      const int64_t r0 = P0 + g.begin;
      cpu::ConvParams pc = conv;
      pc.conv_states = v;
      cpu::causal_conv1d_fwd(proj + r0 * PW, PW, qkv + r0 * C, C, pc, seg_md_.query_start_loc_p, seg_md_.state_indices_tensor_p,
                             seg_md_.has_initial_states_p);
    });
    // 3. q, k L2-normalised per head (q times 1/sqrt(Dk)); g and beta from a and b.
    const float q_scale = 1.0f / std::sqrt(static_cast<float>(Dk));
    for (int64_t t = 0; t < T; ++t) {
      float* row = qkv + t * C;
      for (int h = 0; h < 2 * Hk; ++h) {  // q heads then k heads
        float* v = row + int64_t{h} * Dk;
        float ss = 0.0f;
        for (int d = 0; d < Dk; ++d) ss = std::fma(v[d], v[d], ss);
        const float inv = 1.0f / std::sqrt(ss + 1e-6f);
        for (int d = 0; d < Dk; ++d) v[d] *= inv;
        if (h < Hk)
          for (int d = 0; d < Dk; ++d) v[d] *= q_scale;
      }
      const float* b = proj + t * PW + C + Vd;
      const float* a = b + Hv;
      float* g = gb + t * 2 * Hv;
      for (int h = 0; h < Hv; ++h) {
        g[h] = w_.A[h] * cpu::softplus(a[h] + w_.dt_bias[h]);
        g[Hv + h] = 1.0f / (1.0f + std::exp(-b[h]));
      }
    }
    // 4. The gated delta rule on each request's state.
    cpu::GatedDeltaParams gp;
    gp.num_k_heads = Hk, gp.num_v_heads = Hv, gp.head_k_dim = Dk, gp.head_v_dim = m_.head_v_dim, gp.chunk_size = m_.chunk_size;
    gp.states = step.state.ssm;
    const auto inputs = [&](int64_t row0) {
      const float* r = qkv + row0 * C;
      const float* g = gb + row0 * 2 * Hv;
      return cpu::GatedDeltaInputs{r, C, r + Kd, C, r + 2 * Kd, C, g, 2 * Hv, g + Hv, 2 * Hv};
    };
    if (nd > 0) cpu::gated_delta_decode(inputs(0), gp, o, Vd, md.decode_rows());
    if (md.num_prefills > 0 && pieces.empty())
      cpu::gated_delta_prefill(inputs(P0), gp, o + P0 * Vd, Vd, md.query_start_loc_p, md.num_computed_tokens_p,
                               md.state_indices_tensor_p);
    // "all" mode: the chunk state at each boundary chunk's end is stored.
    run_prefill_pieces(pieces, step.state.ssm, spec.ssm_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      const int64_t r0 = P0 + g.begin;
      cpu::GatedDeltaParams pg = gp;
      pg.states = v;
      cpu::gated_delta_prefill(inputs(r0), pg, o + r0 * Vd, Vd, seg_md_.query_start_loc_p, seg_md_.num_computed_tokens_p,
                               seg_md_.state_indices_tensor_p);
    });
    // 5. RMSNorm per value head gated by silu(z), then out_proj (split by output rows over every rank's heads).
    cpu::gated_rms_norm(o, Vd, proj + C, PW, w_.norm_full.data(), m_.eps, T, Vd, m_.head_v_dim, true, o);
    if (tp_.world > 1) {
      const int64_t VF = full_.value_dim();
      float* of = s.f32(4, T * VF);
      dist::all_gather_columns(o, T, Vd, Vd, *tp_.comm, of, VF, s.vec(5));
      dist::output_split_linear(of, T, VF, w_.out_proj, nullptr, H_, *tp_.comm, out, H_, s.vec(5));
      return;
    }
    cpu::linear(o, T, w_.out_proj, nullptr, out);
  }

 private:
  GatedDeltaConfig m_, full_;
  int64_t H_;
  HeldWeights w_;
  dist::TpRank tp_;
  MambaBatchMetadata seg_md_;  // one prefill piece's metadata ("all"-mode state stores)
};

}  // namespace

std::unique_ptr<CpuModule> make_gated_delta_mixer(const ModuleArgs& a) {
  const GatedDeltaConfig full = GatedDeltaConfig::from_json(a.params, a.cfg);
  const int world = a.tp.world;
  SSM_CHECK(full.num_k_heads % world == 0, "--tensor-parallel-size {}: {} linear_num_key_heads {} must be a multiple of it", world,
            a.label, full.num_k_heads);
  GatedDeltaConfig m = full;
  m.num_k_heads /= world, m.num_v_heads /= world;
  GatedDeltaWeights w = read_gated_delta_weights(a.src, a.prefix, a.cfg.hidden_size, full);
  const auto rows = gated_delta_rank_rows(full, a.tp.rank, world);
  std::vector<dist::Range> proj_rows, conv_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    proj_rows.push_back({rows[i].first, rows[i].second});
    if (i < 3) conv_rows.push_back({rows[i].first, rows[i].second});
  }
  GatedDeltaMixer::HeldWeights h;
  h.in_proj = dist::slice_rows(w.in_proj, proj_rows);
  h.conv_weight = dist::slice_rows(w.conv_weight, full.conv_kernel, conv_rows);
  const dist::Range hv{rows[4].first - (2 * full.key_dim() + 2 * full.value_dim()), rows[4].second - (2 * full.key_dim() + 2 * full.value_dim())};
  h.A = dist::slice_rows(w.A_log, 1, {hv});
  for (float& x : h.A) x = -std::exp(x);
  h.dt_bias = dist::slice_rows(w.dt_bias, 1, {hv});
  for (int i = 0; i < m.num_v_heads; ++i) h.norm_full.insert(h.norm_full.end(), w.norm.begin(), w.norm.end());
  h.out_proj = dist::slice_rows(w.out_proj, {dist::output_shard(a.cfg.hidden_size, a.tp.rank, world)});
  cpu::pack_for_linear(h.in_proj);
  cpu::pack_for_linear(h.out_proj);
  h.in_proj.round_input_bf16 = h.out_proj.round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  return std::make_unique<GatedDeltaMixer>(m, full, a.cfg.hidden_size, std::move(h), a.tp);
}

}  // namespace ssmserve
