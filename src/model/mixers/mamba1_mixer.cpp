// Owns the Mamba-1 mixer on the CPU: weight reading (with its tensor-parallel slice) and the forward over a packed
// batch (decode rows through the one-token state update, prefill rows through the varlen conv + selective scan).
#include "model/mixers/mamba1_mixer.h"

#include <cmath>

#include "core/error.h"
#include "dist/gathered_linear.h"
#include "dist/shard.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/selective_scan.h"
#include "model/mixers/prefill_segments.h"

namespace ssmserve {

MambaLayerWeights read_mamba1_layer(WeightSource& src, const std::string& p, int64_t H, const MambaConfig& m,
                                    const dist::TpRank& tp, bool pack) {
  const int64_t I = m.d_inner, N = m.d_state, K = m.d_conv, R = m.dt_rank;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(H)), inner_scale = 1.0f / std::sqrt(static_cast<float>(I));
  const dist::Range c = dist::even_shard(I, tp.rank, tp.world, "Mamba-1 d_inner (intermediate_size)");
  const std::vector<dist::Range> xz_rows = {c, {I + c.begin, I + c.end}};  // in_proj: x rows then z rows
  MambaLayerWeights L;
  L.in_proj = dist::slice_rows(src.matrix(p + "in_proj.weight", {2 * I, H}, DummyInit::uniform(in_scale)), xz_rows);
  if (m.use_bias) L.in_proj_bias = dist::slice_rows(src.vector(p + "in_proj.bias", {2 * I}, DummyInit::constant(0.0f)), 1, xz_rows);
  L.conv_weight = dist::slice_rows(src.vector(p + "conv1d.weight", {I, 1, K}, DummyInit::uniform(0.5f)), K, {c});
  if (m.use_conv_bias) L.conv_bias = dist::slice_rows(src.vector(p + "conv1d.bias", {I}, DummyInit::uniform(0.1f)), 1, {c});
  L.x_proj = src.matrix(p + "x_proj.weight", {R + 2 * N, I}, DummyInit::uniform(inner_scale));  // replicated
  L.dt_proj = dist::slice_rows(src.matrix(p + "dt_proj.weight", {I, R}, DummyInit::uniform(1.0f / std::sqrt(static_cast<float>(R)))), {c});
  L.dt_bias = dist::slice_rows(src.vector(p + "dt_proj.bias", {I}, DummyInit::constant(-4.0f)), 1, {c});
  L.A = dist::slice_rows(src.vector(p + "A_log", {I, N}, DummyInit::log_arange()), N, {c});
  for (float& a : L.A) a = -std::exp(a);
  L.D = dist::slice_rows(src.vector(p + "D", {I}, DummyInit::constant(1.0f)), 1, {c});
  // Output-split (dist/gathered_linear.h): this rank's output rows over the whole d_inner, with their bias.
  const dist::Range o = dist::output_shard(H, tp.rank, tp.world);
  L.out_proj = dist::slice_rows(src.matrix(p + "out_proj.weight", {H, I}, DummyInit::uniform(inner_scale)), {o});
  if (m.use_bias) L.out_proj_bias = dist::slice_rows(src.vector(p + "out_proj.bias", {H}, DummyInit::constant(0.0f)), 1, {o});
  if (m.inner_layernorms) {
    L.dt_norm = src.vector(p + "dt_layernorm.weight", {R}, DummyInit::constant(1.0f));
    L.b_norm = src.vector(p + "b_layernorm.weight", {N}, DummyInit::constant(1.0f));
    L.c_norm = src.vector(p + "c_layernorm.weight", {N}, DummyInit::constant(1.0f));
  }
  if (pack)
    for (Weight* proj : {&L.in_proj, &L.x_proj, &L.dt_proj, &L.out_proj}) cpu::pack_for_linear(*proj);
  return L;
}

ModuleStateSpec mamba1_state_spec(const MambaConfig& m, int full_d_inner) {
  ModuleStateSpec s;
  s.conv_elems = static_cast<int64_t>(m.d_conv - 1) * m.d_inner;
  s.ssm_elems = static_cast<int64_t>(m.d_inner) * m.d_state;
  s.full_state_elems = static_cast<int64_t>(full_d_inner) * (m.d_conv - 1 + m.d_state);
  return s;
}

namespace {

/// One Mamba-1 layer (or a rank's shard: I = d_inner / tp channels).
class Mamba1Mixer final : public CpuModule {
 public:
  Mamba1Mixer(MambaConfig m, int64_t hidden, MambaLayerWeights w, const dist::TpRank& tp)
      : m_(m), full_d_inner_(m.d_inner), H_(hidden), w_(std::move(w)), tp_(tp) {
    m_.d_inner /= tp.world;  // read_mamba1_layer checked the division
  }

  ModuleStateSpec state_spec() const override { return mamba1_state_spec(m_, full_d_inner_); }

  void forward(const float* x, int64_t T, float* out, const ModuleStep& step) override {
    const MambaLayerWeights& L = w_;
    const int64_t H = H_, I = m_.d_inner, N = m_.d_state, R = m_.dt_rank, XD = R + 2 * N;
    const MambaBatchMetadata& md = step.batch.meta;
    const int64_t nd = md.num_decode_rows(), P0 = step.batch.prefill_token_offset();
    Scratch& s = step.scratch;
    float* xz = s.f32(0, T * 2 * I);
    float* xc = s.f32(1, T * I);
    float* xdbl = s.f32(2, T * XD);
    float* delta = s.f32(3, T * I);
    float* y = s.f32(4, T * I);
    // 1. Input projection: xz = in_proj(x), x = xz[:, :I], z = xz[:, I:].
    cpu::linear(x, T, L.in_proj, L.in_proj_bias.empty() ? nullptr : L.in_proj_bias.data(), xz);
    // 2. Causal conv1d + SiLU: decode rows [0, nd) update their window, prefill rows scan theirs.
    cpu::ConvParams conv{I, m_.d_conv, L.conv_weight.data(), L.conv_bias.empty() ? nullptr : L.conv_bias.data(), step.state.conv, true};
    if (nd > 0) cpu::causal_conv1d_update(xz, 2 * I, xc, I, conv, md.decode_rows());
    const ModuleStateSpec spec = state_spec();
    const std::vector<PrefillSegment> pieces = md.has_state_stores() ? split_prefill_rows(md) : std::vector<PrefillSegment>{};
    std::vector<float>& shadow = s.vec(kPieceStateScratchSlot);  // 16-bit states' fp32 carry between pieces
    if (md.num_prefills > 0 && pieces.empty())
      cpu::causal_conv1d_fwd(xz + P0 * 2 * I, 2 * I, xc + P0 * I, I, conv, md.query_start_loc_p, md.state_indices_tensor_p,
                             md.has_initial_states_p);
    // "all" mode: store the conv window at each block boundary.
    run_prefill_pieces(pieces, step.state.conv, spec.conv_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      const int64_t r0 = P0 + g.begin;
      cpu::ConvParams pc = conv;
      pc.conv_states = v;
      cpu::causal_conv1d_fwd(xz + r0 * 2 * I, 2 * I, xc + r0 * I, I, pc, seg_md_.query_start_loc_p, seg_md_.state_indices_tensor_p,
                             seg_md_.has_initial_states_p);
    });
    // 3. x_proj -> [dt_low, B, C]; delta = dt_proj(dt_low) (bias and softplus inside the scan).
    const int64_t IF = I * tp_.world;  // the whole d_inner
    float* full = tp_.world > 1 ? s.f32(5, T * IF) : nullptr;
    if (tp_.world > 1) {  // x_proj over the all-gathered conv output: TP = 1's arithmetic (dist/gathered_linear.h)
      dist::all_gather_columns(xc, T, I, I, *tp_.comm, full, IF, s.vec(6));
      cpu::linear(full, T, L.x_proj, nullptr, xdbl);
    } else {
      cpu::linear(xc, T, L.x_proj, nullptr, xdbl);
    }
    if (!L.dt_norm.empty()) {  // Jamba: RMSNorm over dt_low, B and C in place (strided rows of xdbl)
      cpu::rms_norm_strided(xdbl, XD, L.dt_norm.data(), m_.inner_layernorm_eps, T, R);
      cpu::rms_norm_strided(xdbl + R, XD, L.b_norm.data(), m_.inner_layernorm_eps, T, N);
      cpu::rms_norm_strided(xdbl + R + N, XD, L.c_norm.data(), m_.inner_layernorm_eps, T, N);
    }
    cpu::linear(xdbl, T, XD, L.dt_proj, nullptr, delta, I);
    // 4. Selective scan with D skip and SiLU(z) gate.
    cpu::ScanInputs in{{xc, I}, {delta, I}, {xdbl + R, XD}, {xdbl + R + N, XD}, {xz + I, 2 * I}};
    cpu::ScanParams sp{I, static_cast<int>(N), L.A.data(), L.D.data(), L.dt_bias.data(), true, step.state.ssm};
    if (nd > 0) cpu::selective_state_update(in, sp, y, I, md.decode_rows());
    // The same views shifted to token row r0 (the first prefill row: query_start_loc_p starts at 0 there).
    const auto shifted = [&](int64_t r0) {
      return cpu::ScanInputs{{in.u.data + r0 * I, I}, {in.delta.data + r0 * I, I}, {in.B.data + r0 * XD, XD},
                             {in.C.data + r0 * XD, XD}, {in.z.data + r0 * 2 * I, 2 * I}};
    };
    if (md.num_prefills > 0 && pieces.empty())
      cpu::selective_scan_fwd(shifted(P0), sp, y + P0 * I, I, md.query_start_loc_p, md.state_indices_tensor_p, md.has_initial_states_p);
    // "all" mode: store the SSM state at each block boundary.
    run_prefill_pieces(pieces, step.state.ssm, spec.ssm_elems, shadow, [&](const PrefillSegment& g, const StateView& v) {
      segment_metadata(g, md, seg_md_);
      const int64_t r0 = P0 + g.begin;
      cpu::ScanParams ps = sp;
      ps.ssm_states = v;
      cpu::selective_scan_fwd(shifted(r0), ps, y + r0 * I, I, seg_md_.query_start_loc_p, seg_md_.state_indices_tensor_p,
                              seg_md_.has_initial_states_p);
    });
    // 5. Output projection.
    const float* out_bias = L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data();
    if (tp_.world > 1) {  // output-split out_proj over the all-gathered scan output
      dist::all_gather_columns(y, T, I, I, *tp_.comm, full, IF, s.vec(6));
      dist::output_split_linear(full, T, IF, L.out_proj, out_bias, H, *tp_.comm, out, H, s.vec(6));
    } else {
      cpu::linear(y, T, L.out_proj, out_bias, out);
    }
  }

 private:
  MambaConfig m_;  // d_inner is this rank's share
  int full_d_inner_;
  int64_t H_;
  MambaLayerWeights w_;
  dist::TpRank tp_;
  MambaBatchMetadata seg_md_;  // one prefill piece's metadata ("all"-mode state stores)
};

}  // namespace

std::unique_ptr<CpuModule> make_mamba1_mixer(const ModuleArgs& a) {
  const MambaConfig m = MambaConfig::from_json(a.params, a.cfg.hidden_size);
  SSM_CHECK(m.d_state <= 256, "config.json: state_size {} > 256 is not supported", m.d_state);
  SSM_CHECK(m.d_conv >= 1 && m.d_conv <= cpu::kMaxConvWidth, "config.json: conv_kernel {} must be in [1, {}]", m.d_conv,
            cpu::kMaxConvWidth);
  MambaLayerWeights w = read_mamba1_layer(a.src, a.prefix, a.cfg.hidden_size, m, a.tp);
  for (Weight* proj : {&w.in_proj, &w.x_proj, &w.dt_proj, &w.out_proj})
    proj->round_input_bf16 = a.cfg.round_gemm_inputs_bf16;
  return std::make_unique<Mamba1Mixer>(m, a.cfg.hidden_size, std::move(w), a.tp);
}

}  // namespace ssmserve
