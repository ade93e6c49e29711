// Owns the Mamba-2 mixer on the GPU (the CPU module: model/mixers/mamba2_mixer.h): in_proj -> [z | xBC | dt], causal
// conv1d + SiLU over xBC, SSD (decode rows: the state update; prefill rows: the chunked scan over the sequence-aligned
// chunk metadata, on bf16 tensor cores with bf16 weights), gated RMSNorm, out_proj (row-parallel under TP: heads
// and B/C groups split, out_proj's partial sums all-reduced).
#include "runtime/modules/cuda_modules.h"

#include "core/error.h"
#include "device/cuda_check.h"
#include "dist/shard.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/mamba2_decode.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/ssd.h"
#include "kernels/cuda/state_stores.h"
#include "model/mixers/mamba2_mixer.h"

namespace ssmserve::cuda {
namespace {

class CudaMamba2 final : public CudaModule {
 public:
  CudaMamba2(const CudaRunnerContext& ctx, Mamba2Config m, Mamba2Config full, int64_t hidden, float eps, const Mamba2LayerWeights& w)
      : ctx_(ctx), m_(m), full_(full), H_(hidden), eps_(eps) {
    const DType wd = ctx_.opt.weight_dtype;
    in_proj_ = upload_weight(w.in_proj, wd);
    conv_weight_ = to_device(w.conv_weight);
    if (!w.conv_bias.empty()) conv_bias_ = to_device(w.conv_bias);
    dt_bias_ = to_device(w.dt_bias), A_ = to_device(w.A), D_ = to_device(w.D), gate_norm_ = to_device(w.gate_norm);
    out_proj_ = upload_weight(w.out_proj, wd);
    // The fused decode step's arrival counters (mamba2_decode.h): zero, and left zero by every launch.
    counters_ = DeviceBuffer(static_cast<size_t>(kMamba2FusedMaxRows) * m_.n_groups * sizeof(int32_t));
    counters_.fill_bytes(0);
  }

  ModuleStateSpec state_spec() const override { return mamba2_state_spec(m_, full_); }
  bool stores_prefill_states() const override { return true; }  // conv_store_windows + the SSD's chunk-end stores

  int64_t proj_width() const { return int64_t{m_.d_inner} + m_.conv_dim() + m_.num_heads; }

  double scratch_bytes_per_token() const override {
    const double I = m_.d_inner, C = m_.conv_dim(), ab = dtype_size(ctx_.opt.weight_dtype);
    return 4 * proj_width() + 4 * C + 4 * I + ab * I + 2 * C;
  }

  void reserve(int64_t T, const StepPlans*) override {
    ScratchPool& p = *ctx_.scratch;
    const int64_t I = m_.d_inner, C = m_.conv_dim();
    p[0].f32(T * proj_width()), p[1].f32(T * C), p[2].f32(T * I), p[3].get(T * I * dtype_size(ctx_.opt.weight_dtype));
    if (ctx_.opt.weight_dtype == DType::BF16) p[4].get(T * C * 2);
  }

  const DevWeight* input_projection() const override { return &in_proj_; }
  void drop_input_projection() override { in_proj_ = {}; }

  void forward(const CudaStep& st, const ModuleState& state, const void* normed, float* out) override {
    const int64_t T = st.T, PW = proj_width();
    float* proj = (*ctx_.scratch)[0].f32(T * PW);
    ctx_.gemm_run(normed, T, H_, in_proj_, proj, PW);  // proj = in_proj(normed) = [z | xBC | dt]
    forward_projected(st, state, proj, PW, out);
  }

  /// proj [T, proj_width()] (row stride PW) = [z (I) | xBC (C) | dt (NH)] per token.
  void forward_projected(const CudaStep& st, const ModuleState& state, float* proj, int64_t PW, float* out) override {
    const MambaBatchMetadata& md = st.batch.meta;
    const StepMeta& sm = st.meta;
    const int64_t T = st.T, Hd = H_, I = m_.d_inner, C = m_.conv_dim(), NH = m_.num_heads;
    const int64_t GN = static_cast<int64_t>(m_.n_groups) * m_.d_state;
    const int64_t nd = md.num_decode_rows(), P0 = st.batch.prefill_token_offset();
    const int np = md.num_prefills;
    const CudaModelOptions& opt = ctx_.opt;
    const DType wd = opt.weight_dtype;
    cudaStream_t s = st.stream;
    ScratchPool& p = *ctx_.scratch;
    float* xbc = p[1].f32(T * C);
    float* y = p[2].f32(T * I);
    void* gated = p[3].get(T * I * dtype_size(wd));
    SSM_CHECK(np == 0 || md.chunk_size == m_.chunk_size, "Mamba-2 forward: metadata chunk_size {} != model chunk_size {}",
              md.chunk_size, m_.chunk_size);
    ConvParams conv{C, m_.d_conv, conv_weight_.as<float>(), conv_bias_.data() ? conv_bias_.as<float>() : nullptr, state.conv, true};
    SsdParams sp;
    sp.num_heads = static_cast<int>(NH), sp.head_dim = m_.head_dim, sp.n_groups = m_.n_groups, sp.d_state = m_.d_state;
    sp.A = A_.as<float>(), sp.D = D_.as<float>(), sp.dt_bias = dt_bias_.as<float>();
    sp.time_step_min = m_.time_step_min_limit, sp.time_step_max = m_.time_step_max_limit;
    sp.ssm_states = state.ssm;
    sp.exact_products = wd != DType::BF16;  // bf16 weights: one TF32 pass is well inside their tolerance
    sp.bf16_products = wd == DType::BF16 && !opt.ssd_tf32;  // the chunked form on bf16 tensor cores
    // Plain decode rows (up to 16, outside batch-invariant mode) in one launch: conv, SSD update and gated norm
    // (KernelTuning::mamba2_decode_fused; the same bits as steps 2-4 below). Prefill rows then take their norm below.
    Mamba2DecodeArgs fused{proj, PW, conv, sp, sm.state_indices_d, y, gate_norm_.as<float>(), eps_, m_.norm_before_gate,
                           gated, I, wd, counters_.as<int32_t>()};
    const bool fuse = nd > 0 && sm.spec_cols == 1 && !opt.batch_invariant && kernel_tuning().mamba2_decode_fused &&
                      mamba2_decode_fused_fits(fused, static_cast<int>(nd));
    if (fuse) SSM_CUDA_CHECK(mamba2_decode_fused(fused, static_cast<int>(nd), s, opt.pdl && !st.forked));
    // 1. (forward: proj = in_proj(normed).) 2. Causal conv1d + SiLU over xBC (decode rows update their window; prefill rows below).
    if (nd > 0 && !fuse)
      SSM_CUDA_CHECK(conv1d_update_dual(proj + I, PW, xbc, C, nullptr, 0, conv, sm.decode_rows(), static_cast<int>(nd),
                                        opt.pdl && !st.forked, s));
    // 3. SSD: x = xBC[:, :I], B, C the next two G*N slices, dt = proj[:, I + C:].
    auto inputs_from = [&](int64_t r0) {
      return SsdInputs{{xbc + r0 * C, C}, {proj + r0 * PW + I + C, PW}, {xbc + r0 * C + I, C}, {xbc + r0 * C + I + GN, C}, {}, {}, {}};
    };
    // Prefill rows: with the bf16 tiles on bf16 copies alone the conv writes only its bf16 output (no fp32 xBC rows,
    // no copies made in the SSD); else fp32 rows.
    SsdInputs prefill_in = inputs_from(P0);
    bool conv_bf16_only = false;
    if (np > 0 && sp.bf16_products && !opt.batch_invariant) {
      const uint16_t* h = static_cast<const uint16_t*>(p[4].get(T * C * 2)) + P0 * C;  // bf16
      prefill_in.x_h = {h, C}, prefill_in.B_h = {h + I, C}, prefill_in.C_h = {h + I + GN, C};
      conv_bf16_only = ssd_uses_bf16_copies(prefill_in, sp, md.chunk_size);
      if (!conv_bf16_only) prefill_in.x_h = prefill_in.B_h = prefill_in.C_h = {};
    }
    // "all"-mode stores: the conv windows at the store offsets first (the prefill conv overwrites the rows' windows).
    if (np > 0 && sm.stores.any())
      SSM_CUDA_CHECK(conv_store_windows(proj + P0 * PW + I, PW, C, m_.d_conv, state.conv, sm.query_start_loc_p,
                                        sm.state_indices_p, sm.has_initial_states_p, sm.stores, s));
    if (np > 0)
      SSM_CUDA_CHECK(causal_conv1d_fwd_dual(proj + P0 * PW + I, PW, conv_bf16_only ? nullptr : xbc + P0 * C, C,
                                            conv_bf16_only ? const_cast<void*>(prefill_in.x_h.data) : nullptr, C, conv,
                                            sm.query_start_loc_p, sm.state_indices_p, sm.has_initial_states_p, np, T - P0, s));
    // Decode rows the fused step did not take: large batches (> 16 plain rows, outside batch-invariant mode) on the
    // state-run kernel; else (and speculative verify rows) the one whose math is the sequential prefill walk's.
    const bool wide = nd > 16 && !opt.batch_invariant && sm.spec_cols == 1;
    if (!fuse && wide)
      SSM_CUDA_CHECK(ssd_state_update_wide(inputs_from(0), sp, y, I, sm.state_indices_d, static_cast<int>(nd), s, opt.pdl));
    else if (!fuse && nd > 0)
      SSM_CUDA_CHECK(ssd_state_update(inputs_from(0), sp, y, I, sm.decode_rows(), static_cast<int>(nd), s, opt.pdl));
    if (np > 0) {
      SsdChunkMetadataDev cm{np, md.num_chunks(), sm.cu_chunk_seqlen_p, sm.seq_idx_p, sm.last_chunk_indices_p,
                             sm.state_indices_p, sm.has_initial_states_p, md.chunk_size};
      cm.workspace_bytes = ssd_workspace_bytes(sp, cm.nchunks, cm.chunk_size, &prefill_in);
      cm.workspace = (*ctx_.scratch)[ScratchPool::kMixerWorkspace].get(cm.workspace_bytes);
      // "all"-mode stores: the SSD writes the state at the end of each store's chunk (block boundaries are chunk
      // boundaries: the engine's block size is a multiple of the chunk).
      SSM_CHECK(sm.stores_on_chunk_ends, "Mamba-2 forward: a state store offset does not end a chunk of {} tokens",
                md.chunk_size);
      cm.chunk_store_blocks = sm.chunk_store_blocks_p, cm.stores = sm.stores;
      if (opt.batch_invariant) cm.chunk_size = 0;  // the sequential walk (the decode kernel's math)
      SSM_CUDA_CHECK(ssd_chunk_scan_fwd(prefill_in, sp, cm, y + P0 * I, I, nullptr, s));
    }
    // 4. Gated RMSNorm with z (in the GEMM dtype), then out_proj (row-parallel: all-reduced under TP).
    const int64_t n0 = fuse ? nd : 0;  // the fused decode rows are normalized already
    const size_t gs = dtype_size(wd);
    SSM_CUDA_CHECK(gated_rms_norm_pdl(y + n0 * I, I, proj + n0 * PW, PW, gate_norm_.as<float>(), eps_, T - n0, I,
                                      I / m_.n_groups, m_.norm_before_gate, static_cast<char*>(gated) + n0 * I * gs, wd,
                                      I, opt.pdl, s));
    ctx_.gemm_run(gated, T, I, out_proj_, out, Hd);
    ctx_.tp->all_reduce(out, T * Hd);
  }

 private:
  const CudaRunnerContext& ctx_;
  Mamba2Config m_, full_;  // this rank's shard, the unsharded mixer
  int64_t H_;
  float eps_;
  DevWeight in_proj_, out_proj_;
  DeviceBuffer conv_weight_, conv_bias_, dt_bias_, A_, D_, gate_norm_;
  DeviceBuffer counters_;  // [kMamba2FusedMaxRows, n_groups] int32: the fused decode step's arrival counters
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_mamba2(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const Mamba2Config m = Mamba2Config::from_json(h.params, h.cfg);
  const dist::TpRank& tp = h.tp;
  SSM_CHECK(m.d_conv >= 1 && m.d_conv <= 8, "config.json: conv_kernel {} outside [1, 8] on cuda", m.d_conv);
  SSM_CHECK(m.d_state <= 256, "config.json: state_size {} > 256 is not supported on cuda", m.d_state);
  SSM_CHECK(m.rms_norm, "{}: a Mamba-2 mixer without its gated RMSNorm (mamba_rms_norm false) is not supported on cuda yet",
            (h.cfg.dir / "config.json").string());
  SSM_CHECK(!m.use_bias, "{}: use_bias = true (in_proj / out_proj biases) is not supported on cuda yet",
            (h.cfg.dir / "config.json").string());
  SSM_CHECK(tp.world == 1 || m.n_groups % tp.world == 0,
            "--tensor-parallel-size {} on cuda: Mamba-2 n_groups {} must be a multiple of it (the replicated group's "
            "norm across ranks runs on the CPU backend only)", tp.world, m.n_groups);
  const int64_t I = m.d_inner, C = m.conv_dim(), NH = m.num_heads, K = m.d_conv, N = m.d_state, GN = int64_t{m.n_groups} * N;
  const dist::Range hr = dist::even_shard(NH, tp.rank, tp.world, "Mamba-2 num_heads");
  Mamba2LayerWeights w = read_mamba2_mixer(h.src, h.prefix, h.cfg.hidden_size, m);
  Mamba2Config shard = m;
  if (tp.world > 1) {  // heads, channels, B/C groups, dt, the gated norm's channels, out_proj's columns (row-parallel)
    const dist::Range c{hr.begin * m.head_dim, hr.end * m.head_dim};
    const dist::Range groups = dist::even_shard(m.n_groups, tp.rank, tp.world, "Mamba-2 n_groups");
    const dist::Range g{groups.begin * N, groups.end * N};
    const std::vector<dist::Range> conv_rows = {c, {I + g.begin, I + g.end}, {I + GN + g.begin, I + GN + g.end}};
    std::vector<dist::Range> proj_rows = {c};
    for (const dist::Range& r : conv_rows) proj_rows.push_back({I + r.begin, I + r.end});
    proj_rows.push_back({I + C + hr.begin, I + C + hr.end});
    w.in_proj = dist::slice_rows(w.in_proj, proj_rows);
    w.conv_weight = dist::slice_rows(w.conv_weight, K, conv_rows);
    if (!w.conv_bias.empty()) w.conv_bias = dist::slice_rows(w.conv_bias, 1, conv_rows);
    w.dt_bias = dist::slice_rows(w.dt_bias, 1, {hr});
    w.A = dist::slice_rows(w.A, 1, {hr});
    w.D = dist::slice_rows(w.D, 1, {hr});
    w.gate_norm = dist::slice_rows(w.gate_norm, 1, {c});
    w.out_proj = dist::slice_cols(w.out_proj, c);
    shard.d_inner = static_cast<int>(c.size()), shard.num_heads = static_cast<int>(hr.size()), shard.n_groups = static_cast<int>(groups.size());
  }
  return std::make_unique<CudaMamba2>(a.ctx, shard, m, h.cfg.hidden_size, h.cfg.layer_norm_epsilon, w);
}

}  // namespace ssmserve::cuda
