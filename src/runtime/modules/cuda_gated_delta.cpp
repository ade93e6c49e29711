// Owns the Gated DeltaNet mixer on the GPU (the CPU module: model/mixers/gated_delta_mixer.h): in_proj -> [q | k | v |
// z | b | a], causal conv1d + SiLU over [q | k | v], the fused preparation (L2-normalised q / k, g, beta), the gated
// delta rule (decode rows: the one-token update; prefill rows: the chunked WY form on tensor cores,
// kernels/cuda/gated_delta.h, or under SSMSERVE_BATCH_INVARIANT the token walk with the decode update's arithmetic),
// the per-head RMSNorm gated by silu(z), out_proj (row-parallel under TP: heads split, out_proj's partial sums
// all-reduced).
#include "runtime/modules/cuda_modules.h"

#include "core/error.h"
#include "device/cuda_check.h"
#include "dist/shard.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/gated_delta_decode_fused.h"
#include "kernels/cuda/state_stores.h"
#include "model/mixers/gated_delta_mixer.h"

namespace ssmserve::cuda {
namespace {

class CudaGatedDelta final : public CudaModule {
 public:
  /// This rank's weights: in_proj rows and conv channels of its heads, out_proj's columns of its value heads.
  struct Host {
    Weight in_proj, out_proj;
    std::vector<float> conv_weight, A_log, dt_bias, norm_full;
  };
  CudaGatedDelta(const CudaRunnerContext& ctx, GatedDeltaConfig m, GatedDeltaConfig full, int64_t hidden, const Host& w)
      : ctx_(ctx), m_(std::move(m)), full_(std::move(full)), H_(hidden) {
    const DType wd = ctx_.opt.weight_dtype;
    in_proj_ = upload_weight(w.in_proj, wd);
    out_proj_ = upload_weight(w.out_proj, wd);
    conv_weight_ = to_device(w.conv_weight), A_log_ = to_device(w.A_log), dt_bias_ = to_device(w.dt_bias);
    norm_ = to_device(w.norm_full);
    // The fused decode step's arrival counters (gated_delta_decode_fused.h): zero, and left zero by every launch.
    counters_ = DeviceBuffer(static_cast<size_t>(kGdnFusedMaxRows) * (m_.num_v_heads + m_.num_k_heads) * sizeof(int32_t));
    counters_.fill_bytes(0);
  }

  ModuleStateSpec state_spec() const override { return gated_delta_state_spec(m_, full_); }
  /// conv_store_windows + the two-pass walk's chunk-end stores.
  bool stores_prefill_states() const override { return true; }

  double scratch_bytes_per_token() const override {
    const double PW = m_.proj_rows(), C = m_.conv_dim(), Vd = m_.value_dim(), ab = dtype_size(ctx_.opt.weight_dtype);
    // + the two-pass prefill's workspace: 64 (Dk + Dv + 66) floats per chunk of 64 tokens and value head.
    const double ws = 4.0 * m_.num_v_heads * (m_.head_k_dim + m_.head_v_dim + 66);
    return 4 * PW + 4 * C + 8.0 * m_.num_v_heads + 4 * Vd + ab * Vd + ws;
  }

  void reserve(int64_t T, const StepPlans*) override {
    ScratchPool& p = *ctx_.scratch;
    p[0].f32(T * m_.proj_rows()), p[1].f32(T * m_.conv_dim()), p[2].f32(T * 2 * m_.num_v_heads), p[3].f32(T * m_.value_dim());
    p[4].get(T * m_.value_dim() * dtype_size(ctx_.opt.weight_dtype));
  }

  void forward(const CudaStep& st, const ModuleState& state, const void* normed, float* out) override {
    const MambaBatchMetadata& md = st.batch.meta;
    const StepMeta& sm = st.meta;
    const int64_t T = st.T, Kd = m_.key_dim(), Vd = m_.value_dim(), C = m_.conv_dim(), PW = m_.proj_rows();
    const int Hk = m_.num_k_heads, Hv = m_.num_v_heads, Dk = m_.head_k_dim;
    const int64_t nd = md.num_decode_rows(), P0 = st.batch.prefill_token_offset();
    const int np = md.num_prefills;
    const CudaModelOptions& opt = ctx_.opt;
    const DType wd = opt.weight_dtype;
    cudaStream_t s = st.stream;
    ScratchPool& p = *ctx_.scratch;
    float* proj = p[0].f32(T * PW);
    float* qkv = p[1].f32(T * C);
    float* gb = p[2].f32(T * 2 * Hv);  // [T, g (Hv) | beta (Hv)]
    float* o = p[3].f32(T * Vd);
    void* gated = p[4].get(T * Vd * dtype_size(wd));
    // 1. proj = in_proj(normed) = [q | k | v | z | b | a].
    ctx_.gemm_run(normed, T, H_, in_proj_, proj, PW);
    // 2. Causal conv1d + SiLU over [q | k | v].
    const ConvParams conv{C, m_.conv_kernel, conv_weight_.as<float>(), nullptr, state.conv, true};
    GatedDeltaParams gp;
    gp.num_k_heads = Hk, gp.num_v_heads = Hv, gp.head_k_dim = Dk, gp.head_v_dim = m_.head_v_dim, gp.chunk_size = m_.chunk_size;
    gp.states = state.ssm;
    // Plain decode rows (up to 16, outside batch-invariant mode) in one launch: steps 2-5 (CudaModelOptions::
    // gdn_decode_fused; the same bits). The prefill rows then take steps 2-5 below, their norm from row P0.
    const GdnDecodeArgs fused{proj, PW, conv, gp, A_log_.as<float>(), dt_bias_.as<float>(), sm.state_indices_d, o,
                              norm_.as<float>(), m_.eps, gated, Vd, wd, counters_.as<int32_t>()};
    const bool fuse = nd > 0 && sm.spec_cols == 1 && !opt.batch_invariant && opt.gdn_decode_fused &&
                      gated_delta_decode_fused_fits(fused, static_cast<int>(nd));
    if (fuse) SSM_CUDA_CHECK(gated_delta_decode_fused(fused, static_cast<int>(nd), s, opt.pdl));
    if (nd > 0 && !fuse)
      SSM_CUDA_CHECK(conv1d_update_dual(proj, PW, qkv, C, nullptr, 0, conv, sm.decode_rows(), static_cast<int>(nd), opt.pdl, s));
    // "all"-mode stores: the conv windows at the store offsets first (the prefill conv overwrites the rows' windows).
    if (np > 0 && sm.stores.any())
      SSM_CUDA_CHECK(conv_store_windows(proj + P0 * PW, PW, C, m_.conv_kernel, state.conv, sm.query_start_loc_p,
                                        sm.state_indices_p, sm.has_initial_states_p, sm.stores, s));
    if (np > 0)
      SSM_CUDA_CHECK(causal_conv1d_fwd(proj + P0 * PW, PW, qkv + P0 * C, C, conv, sm.query_start_loc_p, sm.state_indices_p,
                                       sm.has_initial_states_p, np, T - P0, s));
    // 3. q, k L2-normalised in place (q / sqrt(Dk)); g, beta from a, b.
    const int64_t first = fuse ? nd : 0;  // the first row the separate kernels take (decode rows fused: the prefill's)
    GatedDeltaPrepareArgs pa;
    float* q = qkv + first * C;
    const float* ab = proj + first * PW + C + Vd;  // [b | a] of row `first`
    float* gates = gb + first * 2 * Hv;
    pa.q = q, pa.q_stride = C, pa.k = q + Kd, pa.k_stride = C;
    pa.b = ab, pa.b_stride = PW, pa.a = ab + Hv, pa.a_stride = PW;
    pa.A_log = A_log_.as<float>(), pa.dt_bias = dt_bias_.as<float>();
    pa.q_out = q, pa.q_out_stride = C, pa.k_out = q + Kd, pa.k_out_stride = C;
    pa.g = gates, pa.g_stride = 2 * Hv, pa.beta = gates + Hv, pa.beta_stride = 2 * Hv;
    SSM_CUDA_CHECK(gated_delta_prepare(pa, T - first, Hk, Hv, Dk, s, opt.pdl));
    // 4. The delta rule on each request's state.
    const auto inputs = [&](int64_t r0) {
      const float* r = qkv + r0 * C;
      const float* g = gb + r0 * 2 * Hv;
      return GatedDeltaInputs{r, C, r + Kd, C, r + 2 * Kd, C, g, 2 * Hv, g + Hv, 2 * Hv};
    };
    // Batch-invariant mode: decode in one slicing at every batch size, and the prefill rows walk their tokens through
    // the decode kernel's per-token step (bit-identical to decoding them one at a time, however the prompt is cut).
    if (nd > 0 && !fuse)
      SSM_CUDA_CHECK(
          gated_delta_decode(inputs(0), gp, o, Vd, sm.decode_rows(), static_cast<int>(nd), s, opt.batch_invariant, opt.pdl));
    if (np > 0 && opt.batch_invariant) {
      SSM_CUDA_CHECK(gated_delta_prefill_sequential(inputs(P0), gp, o + P0 * Vd, Vd, sm.query_start_loc_p,
                                                    sm.num_computed_tokens_p, sm.state_indices_p, np, s, sm.stores));
    } else if (np > 0) {
      // bf16 weights: one TF32 pass per chunk product is well inside their tolerance; fp32 weights: 3xTF32.
      const GatedDeltaPrecision prec = wd == DType::BF16 ? GatedDeltaPrecision::kTf32 : GatedDeltaPrecision::kFp32;
      // The two-pass form (chunk-parallel WY pass, then the state walk: the shared-memory walk by default) with its
      // workspace in a shared slot: layers run one after another, and prefill steps are not captured.
      float* ws = p[5].f32(gated_delta_prefill_workspace_floats(T - P0, np, gp));
      // "all"-mode stores: the walk writes the state at the end of each store's chunk (store positions are multiples of
      // the engine's block size, a multiple of the model's chunk length).
      if (sm.stores.any()) check_stores_on_chunk_ends(md);
      SSM_CUDA_CHECK(gated_delta_prefill_two_pass(inputs(P0), gp, o + P0 * Vd, Vd, sm.query_start_loc_p, sm.num_computed_tokens_p,
                                                  sm.state_indices_p, np, T - P0, ws, s, prec, sm.stores));
    }
    // 5. RMSNorm per value head gated by silu(z) (norm before gate), in the GEMM dtype; out_proj (all-reduced under TP).
    SSM_CUDA_CHECK(gated_rms_norm_pdl(o + first * Vd, Vd, proj + first * PW + C, PW, norm_.as<float>(), m_.eps,
                                      T - first, Vd, m_.head_v_dim, true,
                                      static_cast<char*>(gated) + first * Vd * dtype_size(wd), wd, Vd, opt.pdl, s));
    ctx_.gemm_run(gated, T, Vd, out_proj_, out, H_);
    ctx_.tp->all_reduce(out, T * H_);
  }

 private:
  /// Throws Error when a state store's sequence position (num_computed + offset) does not end a chunk of this
  /// mixer's chunk_size (the walk stores only at chunk ends).
  void check_stores_on_chunk_ends(const MambaBatchMetadata& md) const {
    for (int p = 0; p < md.num_prefills; ++p)
      for (int32_t i = md.state_store_start_p[p]; i < md.state_store_start_p[p + 1]; ++i) {
        const int64_t pos = int64_t{md.num_computed_tokens_p[p]} + md.state_store_offset_p[i];
        SSM_CHECK(pos % m_.chunk_size == 0,
                  "Gated DeltaNet forward: a state store at sequence position {} does not end a chunk of {} tokens", pos,
                  m_.chunk_size);
      }
  }

  const CudaRunnerContext& ctx_;
  GatedDeltaConfig m_, full_;  // this rank's heads, the unsharded mixer
  int64_t H_;
  DevWeight in_proj_, out_proj_;
  DeviceBuffer conv_weight_, A_log_, dt_bias_, norm_;
  DeviceBuffer counters_;  // [kGdnFusedMaxRows, Hv + Hk] int32: the fused decode step's arrival counters
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_gated_delta(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const GatedDeltaConfig full = GatedDeltaConfig::from_json(h.params, h.cfg);
  const dist::TpRank& tp = h.tp;
  SSM_CHECK(full.conv_kernel >= 1 && full.conv_kernel <= 8, "config.json: linear_conv_kernel_dim {} outside [1, 8] on cuda",
            full.conv_kernel);
  SSM_CHECK(full.num_k_heads % tp.world == 0, "--tensor-parallel-size {}: {} linear_num_key_heads {} must be a multiple of it",
            tp.world, h.label, full.num_k_heads);
  GatedDeltaConfig m = full;
  m.num_k_heads /= tp.world, m.num_v_heads /= tp.world;
  GatedDeltaParams probe;
  probe.num_k_heads = m.num_k_heads, probe.num_v_heads = m.num_v_heads, probe.head_k_dim = m.head_k_dim, probe.head_v_dim = m.head_v_dim;
  probe.chunk_size = m.chunk_size;
  // The shape checks also look at the state view: a stand-in with the pool's alignment (64-byte state offsets) and
  // a block stride of one layer's state.
  alignas(64) static float probe_state[16];
  probe.states.data = probe_state;
  probe.states.block_stride = (int64_t{m.num_v_heads} * m.head_k_dim * m.head_v_dim + 3) / 4 * 4;
  SSM_CHECK(gated_delta_decode_supported(probe) && gated_delta_prefill_supported(probe),
            "{}: Gated DeltaNet with linear_key_head_dim {}, linear_value_head_dim {}, chunk {} is not supported on cuda "
            "(key dims 32, 64 or 128; value dims a multiple of 16)", h.label, m.head_k_dim, m.head_v_dim, m.chunk_size);
  GatedDeltaWeights w = read_gated_delta_weights(h.src, h.prefix, h.cfg.hidden_size, full);
  const auto rows = gated_delta_rank_rows(full, tp.rank, tp.world);
  std::vector<dist::Range> proj_rows, conv_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    proj_rows.push_back({rows[i].first, rows[i].second});
    if (i < 3) conv_rows.push_back({rows[i].first, rows[i].second});
  }
  const int64_t vb = 2 * full.key_dim() + 2 * full.value_dim();  // first b row: b rows are the value heads
  const dist::Range hv{rows[4].first - vb, rows[4].second - vb};
  CudaGatedDelta::Host host;
  host.in_proj = dist::slice_rows(w.in_proj, proj_rows);
  host.conv_weight = dist::slice_rows(w.conv_weight, full.conv_kernel, conv_rows);
  host.A_log = dist::slice_rows(w.A_log, 1, {hv});
  host.dt_bias = dist::slice_rows(w.dt_bias, 1, {hv});
  for (int i = 0; i < m.num_v_heads; ++i) host.norm_full.insert(host.norm_full.end(), w.norm.begin(), w.norm.end());
  host.out_proj = tp.world > 1 ? dist::slice_cols(w.out_proj, {hv.begin * full.head_v_dim, hv.end * full.head_v_dim}) : w.out_proj;
  return std::make_unique<CudaGatedDelta>(a.ctx, m, full, h.cfg.hidden_size, host);
}

}  // namespace ssmserve::cuda
