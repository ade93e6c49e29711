// Owns the Mamba-2 mixer on the CPU: its hyperparameters, weight reading (with its tensor-parallel slice) and the
// forward over a packed batch (decode rows through the one-token SSD state update, prefill rows through the varlen
// conv + chunked SSD scan with the sequence-aligned chunk metadata), and the fused whole-stack decode path.
#include "model/mixers/mamba2_mixer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_rms_norm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/ssd.h"
#include "model/decoder/params.h"
#include "model/mixers/prefill_segments.h"
#include "model/weight.h"

namespace ssmserve {
namespace {

int positive_int(const nlohmann::json& j, const char* field, int fallback = -1) {
  if (!j.contains(field) || j[field].is_null()) {
    SSM_CHECK(fallback > 0, "config.json: Mamba-2 field \"{}\" is missing", field);
    return fallback;
  }
  SSM_CHECK(j[field].is_number_integer() && j[field].get<int64_t>() > 0 && j[field].get<int64_t>() < (1 << 24),
            "config.json: field \"{}\" must be a positive integer (got {})", field, j[field].dump().substr(0, 40));
  return j[field].get<int>();
}

bool boolean(const nlohmann::json& j, const char* field, bool fallback) {
  if (!j.contains(field)) return fallback;
  SSM_CHECK(j[field].is_boolean(), "config.json: field \"{}\" must be true or false", field);
  return j[field].get<bool>();
}

}  // namespace

Mamba2Config Mamba2Config::from_json(const ModelConfig& cfg) { return from_json(cfg.raw, cfg); }

Mamba2Config Mamba2Config::from_json(const nlohmann::json& j, const ModelConfig& cfg) {
  Mamba2Config m;
  const int expand = positive_int(j, "expand", 2);
  m.num_heads = positive_int(j, "num_heads");
  m.head_dim = positive_int(j, "head_dim", 64);
  // Bounds far above real models (codestral-mamba-7b: d_inner 8192, 8 groups of d_state 128) that keep d_inner,
  // conv_dim and the projection widths clear of int overflow and the dummy weights clear of absurd allocations.
  constexpr int64_t kMaxWidth = 1 << 16;
  const int64_t d_inner = int64_t{m.num_heads} * m.head_dim, expanded = int64_t{expand} * cfg.hidden_size;
  SSM_CHECK(d_inner <= kMaxWidth, "config.json: num_heads * head_dim = {} must be <= {}", d_inner, kMaxWidth);
  m.d_inner = static_cast<int>(d_inner);
  SSM_CHECK(expanded == d_inner || !j.contains("expand"), "config.json: num_heads * head_dim = {} must equal expand * hidden_size = {}",
            d_inner, expanded);
  m.d_state = positive_int(j, "state_size", 128);
  m.n_groups = positive_int(j, "n_groups", 1);
  SSM_CHECK(m.num_heads % m.n_groups == 0, "config.json: num_heads {} must be a multiple of n_groups {}", m.num_heads, m.n_groups);
  SSM_CHECK(int64_t{m.n_groups} * m.d_state <= kMaxWidth, "config.json: n_groups * state_size = {} must be <= {}",
            int64_t{m.n_groups} * m.d_state, kMaxWidth);
  m.d_conv = positive_int(j, "conv_kernel", 4);
  SSM_CHECK(m.d_conv <= cpu::kMaxConvWidth, "config.json: conv_kernel {} must be in [1, {}]", m.d_conv, cpu::kMaxConvWidth);
  m.chunk_size = positive_int(j, "chunk_size", 256);
  m.use_bias = boolean(j, "use_bias", false);
  m.use_conv_bias = boolean(j, "use_conv_bias", true);
  m.norm_before_gate = boolean(j, "norm_before_gate", false);
  m.rms_norm = boolean(j, "rms_norm", true);
  if (j.contains("ssm_multipliers") && !j["ssm_multipliers"].is_null()) {
    const auto& v = j["ssm_multipliers"];
    SSM_CHECK(v.is_array() && v.size() == 5, "config.json: ssm_multipliers must list 5 numbers (z, x, B, C, dt)");
    for (size_t i = 0; i < 5; ++i) m.ssm_multipliers[i] = static_cast<float>(config_float(v[i], "ssm_multipliers"));
  }
  if (j.contains("ssm_in_multiplier") && !j["ssm_in_multiplier"].is_null())
    m.ssm_in_multiplier = static_cast<float>(config_float(j["ssm_in_multiplier"], "ssm_in_multiplier"));
  SSM_CHECK(m.ssm_in_multiplier == 1.0f || !m.use_bias, "config.json: ssm_in_multiplier with an in_proj bias is not supported");
  SSM_CHECK(!j.contains("hidden_act") || j["hidden_act"] == "silu", "config.json: hidden_act {} is not supported (Mamba-2 uses silu)",
            j["hidden_act"].dump().substr(0, 40));
  if (j.contains("time_step_limit") && !j["time_step_limit"].is_null()) {
    const auto& lim = j["time_step_limit"];
    SSM_CHECK(lim.is_array() && lim.size() == 2, "config.json: time_step_limit must be [min, max]");
    m.time_step_min_limit = static_cast<float>(config_float(lim[0], "time_step_limit[0]"));
    m.time_step_max_limit = static_cast<float>(config_float(lim[1], "time_step_limit[1]"));
    SSM_CHECK(!std::isnan(m.time_step_min_limit) && !std::isnan(m.time_step_max_limit) && m.time_step_min_limit <= m.time_step_max_limit,
              "config.json: time_step_limit must be [min, max] with min <= max");
  }
  return m;
}

Mamba2LayerWeights read_mamba2_mixer(WeightSource& src, const std::string& p, int64_t Hd, const Mamba2Config& m) {
  const int64_t I = m.d_inner, C = m.conv_dim(), NH = m.num_heads, K = m.d_conv;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), inner_scale = 1.0f / std::sqrt(static_cast<float>(I));
  Mamba2LayerWeights L;
  // muP (Falcon-H1): row r of [z | x | B | C | dt] scaled by its section's multiplier (and the input multiplier).
  const int64_t GN = int64_t{m.n_groups} * m.d_state;
  const auto section = [&](int64_t r) {
    return m.ssm_multipliers[r < I ? 0 : r < 2 * I ? 1 : r < 2 * I + GN ? 2 : r < 2 * I + 2 * GN ? 3 : 4];
  };
  L.in_proj = scale_rows(src.matrix(p + "in_proj.weight", {I + C + NH, Hd}, DummyInit::uniform(in_scale)),
                         [&](int64_t r) { return section(r) * m.ssm_in_multiplier; });
  if (m.use_bias) {
    L.in_proj_bias = src.vector(p + "in_proj.bias", {I + C + NH}, DummyInit::constant(0.0f));
    for (int64_t r = 0; r < I + C + NH; ++r) L.in_proj_bias[r] *= section(r);
  }
  L.conv_weight = src.vector(p + "conv1d.weight", {C, 1, K}, DummyInit::uniform(0.5f));
  if (m.use_conv_bias) L.conv_bias = src.vector(p + "conv1d.bias", {C}, DummyInit::uniform(0.1f));
  L.dt_bias = src.vector(p + "dt_bias", {NH}, DummyInit::constant(-4.0f));
  L.A = src.vector(p + "A_log", {NH}, DummyInit::log_arange());
  for (float& a : L.A) a = -std::exp(a);
  L.D = src.vector(p + "D", {NH}, DummyInit::constant(1.0f));
  if (m.rms_norm) L.gate_norm = src.vector(p + "norm.weight", {I}, DummyInit::constant(1.0f));
  L.out_proj = src.matrix(p + "out_proj.weight", {Hd, I}, DummyInit::uniform(inner_scale));
  if (m.use_bias) L.out_proj_bias = src.vector(p + "out_proj.bias", {Hd}, DummyInit::constant(0.0f));
  return L;
}

Mamba2LayerWeights read_mamba2_layer(WeightSource& src, const ModelConfig& cfg, const Mamba2Config& m, int64_t layer) {
  const std::string p = fmt::format("backbone.layers.{}.", layer);
  const int64_t Hd = cfg.hidden_size;
  std::vector<float> norm = src.vector(p + "norm.weight", {Hd}, DummyInit::constant(1.0f));
  Mamba2LayerWeights L = read_mamba2_mixer(src, p + "mixer.", Hd, m);
  L.norm = std::move(norm);
  return L;
}

ModuleStateSpec mamba2_state_spec(const Mamba2Config& m, const Mamba2Config& full) {
  ModuleStateSpec s;
  s.conv_elems = static_cast<int64_t>(m.d_conv - 1) * m.conv_dim();
  s.ssm_elems = static_cast<int64_t>(m.num_heads) * m.head_dim * m.d_state;
  s.full_state_elems = static_cast<int64_t>(full.d_conv - 1) * full.conv_dim() + static_cast<int64_t>(full.d_inner) * full.d_state;
  return s;
}

namespace {

/// One Mamba-2 layer, or a rank's shard of it (m_: this rank's d_inner, num_heads, n_groups; full_: unsharded).
class Mamba2Mixer final : public CpuModule {
 public:
  Mamba2Mixer(Mamba2Config m, Mamba2Config full, int64_t hidden, Mamba2LayerWeights w, const dist::TpRank& tp)
      : m_(m), full_(full), H_(hidden), w_(std::move(w)), tp_(tp) {}

  ModuleStateSpec state_spec() const override { return mamba2_state_spec(m_, full_); }

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    const MambaBatchMetadata& md = step.batch.meta;
    SSM_CHECK(md.num_prefills == 0 || md.chunk_size == m_.chunk_size, "Mamba-2 forward: metadata chunk_size {} != model chunk_size {}",
              md.chunk_size, m_.chunk_size);
    const int64_t I = m_.d_inner, C = m_.conv_dim(), PW = proj_width();
    const int64_t nd = md.num_decode_rows(), P0 = step.batch.prefill_token_offset();
    Scratch& s = step.scratch;
    float* proj = s.f32(0, T * PW);
    float* xbc = s.f32(1, T * C);
    float* y = s.f32(2, T * I);
    // 1. Input projection: [z | xBC | dt].
    cpu::linear(x, T, w_.in_proj, w_.in_proj_bias.empty() ? nullptr : w_.in_proj_bias.data(), proj);
    // 2. Causal conv1d + SiLU over xBC (decode rows update their window; prefill rows scan theirs).
    const cpu::ConvParams conv = conv_params(step.state);
    const float* xbc_in = proj + I;
    if (nd > 0) cpu::causal_conv1d_update(xbc_in, PW, xbc, C, conv, md.decode_rows());
    const ModuleStateSpec spec = state_spec();
    const std::vector<PrefillSegment> pieces = md.has_state_stores() ? split_prefill_rows(md) : std::vector<PrefillSegment>{};
    std::vector<float>& shadow = s.vec(kPieceStateScratchSlot);  // 16-bit states' fp32 carry between pieces
    if (md.num_prefills > 0 && pieces.empty())
      cpu::causal_conv1d_fwd(xbc_in + P0 * PW, PW, xbc + P0 * C, C, conv, md.query_start_loc_p, md.state_indices_tensor_p,
                             md.has_initial_states_p);
    // "all" mode: store the conv window at each block boundary.
    run_prefill_pieces(pieces, step.state.conv, spec.conv_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      const int64_t r0 = P0 + g.begin;
      cpu::ConvParams pc = conv;
      pc.conv_states = v;
      cpu::causal_conv1d_fwd(xbc_in + r0 * PW, PW, xbc + r0 * C, C, pc, seg_md_.query_start_loc_p, seg_md_.state_indices_tensor_p,
                             seg_md_.has_initial_states_p);
    });
    // 3. SSD over x = xBC[:, :I] as [H, P], B and C (n_groups * d_state each), dt = proj[:, I + C:].
    const cpu::SsdParams sp = ssd_params(step.state);
    if (nd > 0) cpu::ssd_state_update(ssd_inputs(proj, xbc, 0), sp, y, I, md.decode_rows());
    const auto chunk_scan = [&](const MambaBatchMetadata& pm, int64_t r0, const cpu::SsdParams& ps) {
      const cpu::SsdChunkMetadata cm{pm.chunk_size, pm.query_start_loc_p, pm.cu_chunk_seqlen_p, pm.seq_idx_p,
                                     pm.last_chunk_indices_p, pm.state_indices_tensor_p, pm.has_initial_states_p};
      cpu::ssd_chunk_scan_fwd(ssd_inputs(proj, xbc, r0), ps, cm, y + r0 * I, I);
    };
    if (md.num_prefills > 0 && pieces.empty()) chunk_scan(md, P0, sp);
    // "all" mode: the chunk state at each boundary chunk's end is stored.
    run_prefill_pieces(pieces, step.state.ssm, spec.ssm_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      cpu::SsdParams ps = sp;
      ps.ssm_states = v;
      chunk_scan(seg_md_, P0 + g.begin, ps);
    });
    // 4. Gated RMSNorm with z, then the output projection.
    if (tp_.world > 1) {
      gated_norm_and_out_proj_gathered(proj, y, T, out, s);
    } else {
      float* gated = s.f32(3, T * I);
      cpu::gated_rms_norm(y, I, proj, PW, w_.gate_norm.empty() ? nullptr : w_.gate_norm.data(), eps_, T, I, I / m_.n_groups, m_.norm_before_gate, gated);
      cpu::linear(gated, T, w_.out_proj, w_.out_proj_bias.empty() ? nullptr : w_.out_proj_bias.data(), out);
    }
  }

  int64_t proj_width() const { return int64_t{m_.d_inner} + m_.conv_dim() + m_.num_heads; }
  cpu::ConvParams conv_params(const ModuleState& st) const {
    return {m_.conv_dim(), m_.d_conv, w_.conv_weight.data(), w_.conv_bias.empty() ? nullptr : w_.conv_bias.data(), st.conv, true};
  }
  cpu::SsdParams ssd_params(const ModuleState& st) const {
    cpu::SsdParams sp;
    sp.num_heads = m_.num_heads, sp.head_dim = m_.head_dim, sp.d_state = m_.d_state, sp.n_groups = m_.n_groups;
    sp.A = w_.A.data(), sp.D = w_.D.data(), sp.dt_bias = w_.dt_bias.data();
    sp.time_step_min = m_.time_step_min_limit, sp.time_step_max = m_.time_step_max_limit;
    sp.ssm_states = st.ssm;
    return sp;
  }
  // x = xBC[:, :I] as [H, P], B and C = the next two n_groups * d_state slices, dt = proj[:, I + C:].
  cpu::SsdInputs ssd_inputs(const float* proj, const float* xbc, int64_t row0) const {
    const int64_t I = m_.d_inner, C = m_.conv_dim(), PW = proj_width(), GN = int64_t{m_.n_groups} * m_.d_state;
    return cpu::SsdInputs{{xbc + row0 * C, C}, {proj + row0 * PW + I + C, PW}, {xbc + row0 * C + I, C}, {xbc + row0 * C + I + GN, C}};
  }

  const Mamba2Config& config() const { return m_; }
  const Mamba2LayerWeights& weights() const { return w_; }
  bool sharded() const { return tp_.world > 1; }
  void set_eps(float eps) { eps_ = eps; }

 private:
  // out = out_proj(gated RMSNorm(y, z)) with TP = 1's arithmetic (dist/gathered_linear.h): the ranks' y and z
  // shards are all-gathered into the whole [T, d_inner], every rank applies the gated norm to all of it (cheap,
  // elementwise; its weight is replicated), and out_proj is split by output rows over the whole d_inner.
  void gated_norm_and_out_proj_gathered(const float* proj, const float* y, int64_t T, float* out, Scratch& s) const {
    const int64_t I = m_.d_inner, PW = proj_width(), IF = full_.d_inner;
    float* yf = s.f32(4, T * IF);
    float* zf = s.f32(5, T * IF);
    float* gf = s.f32(6, T * IF);
    dist::all_gather_columns(y, T, I, I, *tp_.comm, yf, IF, s.vec(7));
    dist::all_gather_columns(proj, T, I, PW, *tp_.comm, zf, IF, s.vec(7));  // z = proj[:, :I]
    cpu::gated_rms_norm(yf, IF, zf, IF, w_.gate_norm.empty() ? nullptr : w_.gate_norm.data(), eps_, T, IF, IF / full_.n_groups, full_.norm_before_gate, gf);
    dist::output_split_linear(gf, T, IF, w_.out_proj, w_.out_proj_bias.empty() ? nullptr : w_.out_proj_bias.data(), H_, *tp_.comm,
                              out, H_, s.vec(7));
  }

  Mamba2Config m_, full_;
  int64_t H_;
  Mamba2LayerWeights w_;
  dist::TpRank tp_;
  float eps_ = 1e-5f;  // the gated norm's epsilon: the model's layer_norm_epsilon
  MambaBatchMetadata seg_md_;  // one prefill piece's metadata ("all"-mode state stores)
};

/// Decode-only batches of at most this many rows (TP 1) take mamba2_stack_decode.
constexpr int64_t kFusedDecodeMaxRows = 4;

}  // namespace

std::unique_ptr<CpuModule> make_mamba2_mixer(const ModuleArgs& a) {
  const Mamba2Config m = Mamba2Config::from_json(a.params, a.cfg);
  const dist::TpRank& tp = a.tp;
  SSM_CHECK(tp.world == 1 || tp.comm, "Mamba-2: tensor-parallel size {} needs a communicator", tp.world);
  const dist::Range h = dist::even_shard(m.num_heads, tp.rank, tp.world, "Mamba-2 num_heads");
  SSM_CHECK(m.n_groups == 1 || m.n_groups % tp.world == 0,
            "--tensor-parallel-size {}: Mamba-2 n_groups {} must be 1 (replicated on every rank) or a multiple of it", tp.world,
            m.n_groups);
  const int64_t Hd = a.cfg.hidden_size, I = m.d_inner, C = m.conv_dim(), K = m.d_conv;
  const int64_t N = m.d_state, GN = static_cast<int64_t>(m.n_groups) * N;
  // This rank's heads h, channels c (= heads x head_dim) and B/C group rows g (all of them when replicated); the
  // in_proj rows are [z | x | B | C | dt], the conv channels [x | B | C] (everything when tp.world == 1).
  const dist::Range c{h.begin * m.head_dim, h.end * m.head_dim};
  const dist::Range groups = m.n_groups == 1 ? dist::Range{0, 1} : dist::even_shard(m.n_groups, tp.rank, tp.world, "Mamba-2 n_groups");
  const dist::Range g{groups.begin * N, groups.end * N};
  const std::vector<dist::Range> conv_rows = {c, {I + g.begin, I + g.end}, {I + GN + g.begin, I + GN + g.end}};
  std::vector<dist::Range> proj_rows = {c};
  for (const dist::Range& r : conv_rows) proj_rows.push_back({I + r.begin, I + r.end});
  proj_rows.push_back({I + C + h.begin, I + C + h.end});
  // The gated norm runs over the whole d_inner on every rank, out_proj split by output rows (dist/gathered_linear.h).
  const dist::Range o = dist::output_shard(Hd, tp.rank, tp.world);
  Mamba2LayerWeights L = read_mamba2_mixer(a.src, a.prefix, Hd, m);
  L.in_proj = dist::slice_rows(L.in_proj, proj_rows);
  if (!L.in_proj_bias.empty()) L.in_proj_bias = dist::slice_rows(L.in_proj_bias, 1, proj_rows);
  L.conv_weight = dist::slice_rows(L.conv_weight, K, conv_rows);
  if (!L.conv_bias.empty()) L.conv_bias = dist::slice_rows(L.conv_bias, 1, conv_rows);
  L.dt_bias = dist::slice_rows(L.dt_bias, 1, {h});
  L.A = dist::slice_rows(L.A, 1, {h});
  L.D = dist::slice_rows(L.D, 1, {h});
  L.out_proj = dist::slice_rows(L.out_proj, {o});
  if (!L.out_proj_bias.empty()) L.out_proj_bias = dist::slice_rows(L.out_proj_bias, 1, {o});
  cpu::pack_for_linear_only(L.in_proj);  // the forward reads only the panels: no row-major copy kept
  cpu::pack_for_linear_only(L.out_proj);
  L.in_proj.round_input_bf16 = L.out_proj.round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  Mamba2Config shard = m;  // this rank's mixer dimensions
  shard.d_inner = static_cast<int>(c.size());
  shard.num_heads = static_cast<int>(h.size());
  shard.n_groups = static_cast<int>(groups.size());
  auto mixer = std::make_unique<Mamba2Mixer>(shard, m, Hd, std::move(L), tp);
  mixer->set_eps(a.cfg.layer_norm_epsilon);
  return mixer;
}

// Decode-only batches: the same per-row arithmetic as Mamba2Mixer::forward plus the decoder's pre-norm and residual
// (the same kernels on the same rows, so the results are bit-identical to it and batch-invariant), but every layer
// runs inside one OpenMP region with three barriers per layer instead of three parallel regions plus serial steps:
//   1. every thread: pre-norm of all rows into its own copy (cheap, no barrier), its in_proj columns, and the
//      conv update of the channels whose inputs are among those columns (the conv is per channel);
//   -- barrier (the SSD needs every channel's B, C and dt) --
//   2. the SSD update of its (row, head) pairs;
//   -- barrier (the gated norm of a group spans every head) --
//   3. every thread: the gated norm of all rows into its own copy, its out_proj columns and their residual adds;
//   -- barrier (the next pre-norm reads the whole residual stream) --
bool mamba2_stack_decode(std::span<CpuModule* const> layers, std::span<const float* const> norms, float eps,
                         const ForwardBatch& batch, std::span<const ModuleState> states, float* hidden, int64_t T, int64_t Hd,
                         Scratch& scratch) {
  const MambaBatchMetadata& md = batch.meta;
  if (layers.empty() || md.num_prefills > 0 || T > kFusedDecodeMaxRows) return false;
  std::vector<const Mamba2Mixer*> mix(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    mix[l] = dynamic_cast<const Mamba2Mixer*>(layers[l]);
    if (!mix[l] || mix[l]->sharded()) return false;
  }
  const Mamba2Config& m = mix[0]->config();
  const int64_t I = m.d_inner, C = m.conv_dim(), PW = mix[0]->proj_width();
  const int num_layers = static_cast<int>(layers.size());
  const int64_t max_threads = omp_get_max_threads();
  float* proj = scratch.f32(0, T * PW);
  float* xbc = scratch.f32(1, T * C);
  float* y = scratch.f32(2, T * I);
  float* out = scratch.f32(3, T * Hd);
  float* normed_t = scratch.f32(4, max_threads * T * Hd);  // every thread's own pre-norm copy
  float* gated_t = scratch.f32(5, max_threads * T * I);    // every thread's own gated-norm copy
  // Everything that can throw happens here, outside the region.
  std::vector<cpu::ConvParams> conv(num_layers);
  std::vector<cpu::SsdParams> ssd(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    SSM_CHECK(mix[l]->proj_width() == PW, "Mamba-2 stack decode: layers of different widths");
    conv[l] = mix[l]->conv_params(states[l]);
    ssd[l] = mix[l]->ssd_params(states[l]);
    cpu::ssd_check_params(ssd[l]);
    cpu::check_linear_part(mix[l]->weights().in_proj, Hd, PW);
    cpu::check_linear_part(mix[l]->weights().out_proj, I, Hd);
  }
  const cpu::SsdInputs inputs = mix[0]->ssd_inputs(proj, xbc, 0);
  const DecodeRows blocks = md.decode_rows();  // plain decode rows or speculative verify rows
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* normed = normed_t + t * T * Hd;
    float* gated = gated_t + t * T * I;
    for (int l = 0; l < num_layers; ++l) {
      const Mamba2LayerWeights& L = mix[l]->weights();
      cpu::rms_norm(hidden, norms[l], eps, T, Hd, normed);
      cpu::linear_part(normed, T, Hd, L.in_proj, L.in_proj_bias.empty() ? nullptr : L.in_proj_bias.data(), proj, PW, t, nt);
      const cpu::LinearColumns in_cols = cpu::linear_part_columns(L.in_proj, t, nt);  // proj column I + c = conv channel c
      const int64_t c0 = std::clamp<int64_t>(in_cols.begin - I, 0, C), c1 = std::clamp<int64_t>(in_cols.end - I, 0, C);
      cpu::causal_conv1d_update_channels(proj + I, PW, xbc, C, conv[l], blocks, c0, c1);
#pragma omp barrier
      cpu::ssd_state_update_part(inputs, ssd[l], y, I, blocks, t, nt);
#pragma omp barrier
      cpu::gated_rms_norm(y, I, proj, PW, L.gate_norm.empty() ? nullptr : L.gate_norm.data(), eps, T, I, I / m.n_groups, m.norm_before_gate, gated);
      cpu::linear_part(gated, T, I, L.out_proj, L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data(), out, Hd, t, nt);
      const cpu::LinearColumns out_cols = cpu::linear_part_columns(L.out_proj, t, nt);
      for (int64_t r = 0; r < T; ++r)
        for (int64_t i = out_cols.begin; i < out_cols.end; ++i) hidden[r * Hd + i] += out[r * Hd + i];
#pragma omp barrier
    }
  }
  return true;
}

}  // namespace ssmserve
