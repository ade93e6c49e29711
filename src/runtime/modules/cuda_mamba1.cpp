// Owns the Mamba-1 mixer on the GPU (the CPU module: model/mixers/mamba1_mixer.h): in_proj -> conv1d + SiLU ->
// x_proj -> dt_proj -> selective scan (decode rows: the state update; prefill rows: the chunked three-pass scan) ->
// out_proj; under TP channels split, x_proj / out_proj row-parallel with their partial sums all-reduced. Options:
// the decode overlap (in_proj's z rows on a second graph branch, CudaModelOptions::decode_overlap) and the dataflow
// kernel as the whole-stack decode path (dataflow_decode).
#include <algorithm>

#include "core/error.h"
#include "device/cuda_check.h"
#include "dist/shard.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/dataflow_decode.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/state_stores.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/mixers/mamba1_mixer.h"
#include "runtime/modules/cuda_modules.h"

namespace ssmserve::cuda {
namespace {

/// The second graph branch of the decode overlap (CudaModelOptions::decode_overlap): its stream, its own GEMM handle
/// (the skinny GEMM's cross-block workspace must not be shared by concurrent launches) and the fork / join events
/// (recorded inside the decode graph captures, where they become graph edges).
struct OverlapBranch {
  Stream side;
  GemmHandle gemm;
  cudaEvent_t fork = nullptr, join = nullptr, join_late = nullptr;  // join: before the scan; join_late: after out_proj
  OverlapBranch() {
    SSM_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    SSM_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    SSM_CUDA_CHECK(cudaEventCreateWithFlags(&join_late, cudaEventDisableTiming));
  }
  ~OverlapBranch() {
    for (cudaEvent_t e : {fork, join, join_late})
      if (e) cudaEventDestroy(e);
  }
  OverlapBranch(const OverlapBranch&) = delete;
  OverlapBranch& operator=(const OverlapBranch&) = delete;
};

/// The dataflow kernel's state across steps (descriptors and transposed x_proj, rebuilt when the state buffers move).
struct DataflowCache {
  std::vector<DeviceBuffer> x_proj_t;
  std::vector<Mamba1DataflowLayer> host;
  DeviceBuffer layers, ws;
};

class CudaMamba1 final : public CudaModule {
 public:
  CudaMamba1(const CudaRunnerContext& ctx, MambaConfig m, int full_d_inner, int64_t hidden, float eps, const MambaLayerWeights& w)
      : ctx_(ctx), m_(m), full_d_inner_(full_d_inner), H_(hidden), eps_(eps) {
    const DType wd = ctx_.opt.weight_dtype;
    in_proj = upload_weight(w.in_proj, wd);
    conv_weight = to_device(w.conv_weight);
    if (!w.conv_bias.empty()) conv_bias = to_device(w.conv_bias);
    x_proj = upload_weight(w.x_proj, wd);
    dt_proj = upload_weight(w.dt_proj, wd);
    dt_bias = to_device(w.dt_bias), A = to_device(w.A), D = to_device(w.D);
    if (!w.dt_norm.empty()) dt_norm_ = to_device(w.dt_norm), b_norm_ = to_device(w.b_norm), c_norm_ = to_device(w.c_norm);
    out_proj = upload_weight(w.out_proj, wd);
    if ((ctx_.opt.decode_overlap & 3) && ctx_.tp->tp.world == 1) {
      branch_ = std::make_unique<OverlapBranch>();
      configure_gemm(branch_->gemm, ctx_.opt);
      branch_->gemm.set_pdl(false);  // after an event wait: a plain dependency
    }
  }

  ModuleStateSpec state_spec() const override { return mamba1_state_spec(m_, full_d_inner_); }
  bool stores_prefill_states() const override { return true; }  // conv_store_windows + the scans' token-walk stores

  double scratch_bytes_per_token() const override {
    const double I = m_.d_inner, XD = m_.dt_rank + 2.0 * m_.d_state;
    return 8 * I + 16 * I + 4 * XD + 4 * I + 2 * XD;
  }

  void reserve(int64_t T, const StepPlans*) override {
    ScratchPool& p = *ctx_.scratch;
    const int64_t I = m_.d_inner, XD = m_.dt_rank + 2LL * m_.d_state;
    p[0].f32(T * 2 * I), p[1].f32(T * I), p[2].f32(T * XD), p[3].f32(T * I), p[4].f32(T * I);
    p[5].get(T * I * 2), p[6].get(T * XD * 2), p[7].get(T * I * 2);
  }

  void forward(const CudaStep& st, const ModuleState& state, const void* normed, float* out) override;

  /// The dataflow kernel's view of this layer (its pre-norm weight from the runner).
  Mamba1DecodeLayer dataflow_layer(const float* norm, const ModuleState& state) const {
    return {norm, in_proj.buf.data(), conv_weight.as<float>(), conv_bias.data() ? conv_bias.as<float>() : nullptr,
            x_proj.buf.data(), dt_proj.buf.data(), dt_bias.as<float>(), A.as<float>(), D.as<float>(), out_proj.buf.data(),
            state.conv, state.ssm};
  }
  Mamba1DecodeShape decode_shape() const { return {H_, m_.d_inner, m_.d_state, m_.dt_rank, m_.d_conv, eps_}; }
  bool dataflow_enabled() const {
    return ctx_.opt.dataflow_decode && ctx_.opt.weight_dtype == DType::BF16 && ctx_.tp->tp.world == 1 && !dt_norm_.data();
  }

  DataflowCache dataflow;  ///< the whole-stack path's state, kept by the first layer
  // Device weights (the dataflow path reads them too).
  DevWeight in_proj, x_proj, dt_proj, out_proj;
  DeviceBuffer conv_weight, conv_bias, dt_bias, A, D;
  DeviceBuffer dt_norm_, b_norm_, c_norm_;  ///< Jamba's inner RMSNorm weights [R], [N], [N], or empty

 private:
  const CudaRunnerContext& ctx_;
  MambaConfig m_;  // d_inner: this rank's channels
  int full_d_inner_;
  int64_t H_;
  float eps_;
  std::unique_ptr<OverlapBranch> branch_;  // decode_overlap's second branch (null when off)
};

void CudaMamba1::forward(const CudaStep& st, const ModuleState& state, const void* normed, float* out) {
  const int64_t T = st.T, H = H_, I = m_.d_inner, N = m_.d_state, R = m_.dt_rank, XD = R + 2 * N;
  const MambaBatchMetadata& md = st.batch.meta;
  const StepMeta& dm = st.meta;
  const int64_t nd = md.num_decode_rows(), P0 = st.batch.prefill_token_offset();
  const int np = md.num_prefills;
  const CudaModelOptions& opt = ctx_.opt;
  const DType wd = opt.weight_dtype;
  const bool tp_on = ctx_.tp->on();
  cudaStream_t s = st.stream;
  ScratchPool& p = *ctx_.scratch;
  float* xz = p[0].f32(T * 2 * I);
  float* xc = p[1].f32(T * I);
  float* xdbl = p[2].f32(T * XD);
  float* delta = p[3].f32(T * I);
  float* y = p[4].f32(T * I);
  const bool b16 = wd == DType::BF16;  // GEMM inputs in bf16 (written by their producers) or the fp32 buffers
  auto* xc16 = static_cast<uint16_t*>(p[5].get(T * I * 2));
  auto* xdbl16 = static_cast<uint16_t*>(p[6].get(T * XD * 2));
  auto* y16 = static_cast<uint16_t*>(p[7].get(T * I * 2));
  const bool pdl = opt.pdl;
  ConvParams conv{I, m_.d_conv, conv_weight.as<float>(), conv_bias.data() ? conv_bias.as<float>() : nullptr, state.conv, true};
  ScanParams sp{I, static_cast<int>(N), A.as<float>(), D.as<float>(), dt_bias.as<float>(), true, state.ssm};
  // 1. xz = in_proj(normed): x = xz[:, :I], z = xz[:, I:]. Decode overlap: the z rows on the second branch (forked
  //    before or after the x rows), optionally followed there by out_proj's L2 prefetch; joined at 4 (the prefetch,
  //    with bit 16, only after out_proj).
  const int ov = opt.decode_overlap;
  GemmHandle& gemm = *ctx_.gemm;
  const bool overlap = branch_ && np == 0 && b16 && T <= 16 && gemm.takes_skinny(wd, T);
  const bool split_z = overlap && (ov & 1), late_pf = overlap && (ov & 2) && (ov & 16);
  if (overlap) {
    const bool same_bits = !(ov & 4) || opt.batch_invariant;
    SkinnyTuning half = same_bits ? skinny_part_tuning(T, I, 2 * I, H) : skinny_default_tuning(T, I, H);
    SkinnyExtras ex;
    ex.tuning = &half;
    const auto* w_in = static_cast<const uint16_t*>(in_proj.buf.data());
    cudaStream_t side = branch_->side.get();
    auto fork = [&] {
      const GemmArgs z{T, I, H, normed, H, w_in + I * in_proj.cols, in_proj.cols, wd, xz + I, 2 * I, DType::F32};
      SSM_CUDA_CHECK(cudaEventRecord(branch_->fork, s));
      SSM_CUDA_CHECK(cudaStreamWaitEvent(side, branch_->fork, 0));
      if (split_z) branch_->gemm.run(z, side, nullptr, 0, &ex);
      if (late_pf) SSM_CUDA_CHECK(cudaEventRecord(branch_->join, side));
      if (ov & 2) SSM_CUDA_CHECK(l2_prefetch(out_proj.buf.data(), out_proj.buf.bytes(), opt.overlap_prefetch, 66, side));
      SSM_CUDA_CHECK(cudaEventRecord(late_pf ? branch_->join_late : branch_->join, side));
    };
    if (!split_z) {
      ctx_.gemm_run(normed, T, H, in_proj, xz, 2 * I);
      fork();
    } else {
      if (ov & 8) fork();
      gemm.run({T, I, H, normed, H, w_in, in_proj.cols, wd, xz, 2 * I, DType::F32}, s, nullptr, 0, &ex);
      if (!(ov & 8)) fork();
    }
  } else {
    ctx_.gemm_run(normed, T, H, in_proj, xz, 2 * I);
  }
  // 2. Causal conv1d + SiLU (xc, and its bf16 copy for x_proj): decode rows [0, nd), then the prefill rows.
  if (nd > 0)
    SSM_CUDA_CHECK(conv1d_update_dual(xz, 2 * I, xc, I, b16 ? xc16 : nullptr, I, conv, dm.decode_rows(), static_cast<int>(nd), pdl, s));
  // "all"-mode stores: the conv windows at the store offsets first (the prefill conv overwrites the rows' windows).
  if (np > 0 && dm.stores.any())
    SSM_CUDA_CHECK(conv_store_windows(xz + P0 * 2 * I, 2 * I, I, m_.d_conv, conv.conv_states, dm.query_start_loc_p,
                                      dm.state_indices_p, dm.has_initial_states_p, dm.stores, s));
  if (np > 0)
    SSM_CUDA_CHECK(causal_conv1d_fwd_dual(xz + P0 * 2 * I, 2 * I, xc + P0 * I, I, b16 ? xc16 + P0 * I : nullptr, I, conv,
                                          dm.query_start_loc_p, dm.state_indices_p, dm.has_initial_states_p, np, T - P0, s));
  // 3. x_proj -> xdbl = [dt_low, B, C] (and its bf16 copy; under TP after the all-reduce, x_proj being row-parallel);
  //    delta = dt_proj(dt_low).
  const bool inner_norms = dt_norm_.data() != nullptr;
  const bool fused_cast = b16 && !tp_on && !inner_norms;
  ctx_.gemm_run(b16 ? static_cast<const void*>(xc16) : xc, T, I, x_proj, xdbl, XD, fused_cast ? xdbl16 : nullptr);
  ctx_.tp->all_reduce(xdbl, T * XD);
  if (inner_norms) {  // Jamba: RMSNorm over dt_low, B and C in place
    const float eps = m_.inner_layernorm_eps;
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, XD, xdbl, XD, dt_norm_.as<float>(), eps, T, R, xdbl, DType::F32, XD, s, pdl));
    SSM_CUDA_CHECK(
        fused_add_rms_norm(nullptr, XD, xdbl + R, XD, b_norm_.as<float>(), eps, T, N, xdbl + R, DType::F32, XD, s, pdl));
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, XD, xdbl + R + N, XD, c_norm_.as<float>(), eps, T, N, xdbl + R + N,
                                      DType::F32, XD, s, pdl));
  }
  if (b16 && !fused_cast) SSM_CUDA_CHECK(cast_rows(xdbl, XD, T, XD, xdbl16, DType::BF16, XD, s, pdl));
  ctx_.gemm_run(b16 ? static_cast<const void*>(xdbl16) : xdbl, T, XD, dt_proj, delta, I);
  if (overlap) SSM_CUDA_CHECK(cudaStreamWaitEvent(s, branch_->join, 0));  // z (and an early-joined prefetch) done
  // 4. Selective scan with D skip and SiLU(z) gate (decode rows write out_proj's bf16 input directly).
  ScanInputs in{{xc, I}, {delta, I}, {xdbl + R, XD}, {xdbl + R + N, XD}, {xz + I, 2 * I}};
  // Large decode batches (> 16 plain rows, outside batch-invariant mode): the thread-per-channel kernel.
  if (nd > 16 && N <= 16 && !opt.batch_invariant && dm.spec_cols == 1)
    SSM_CUDA_CHECK(selective_state_update_wide(in, sp, b16 ? static_cast<void*>(y16) : y, wd, I, dm.state_indices_d,
                                               static_cast<int>(nd), pdl, s));
  else if (nd > 0)
    SSM_CUDA_CHECK(selective_state_update_out(in, sp, b16 ? static_cast<void*>(y16) : y, wd, I, dm.decode_rows(),
                                              static_cast<int>(nd), pdl, s));
  if (np > 0) {
    ScanInputs inp{{xc + P0 * I, I}, {delta + P0 * I, I}, {xdbl + P0 * XD + R, XD}, {xdbl + P0 * XD + R + N, XD},
                   {xz + P0 * 2 * I + I, 2 * I}};
    ChunkMetadataDev cm{np, md.num_chunks(), dm.cu_chunk_seqlen_p, dm.seq_idx_p, dm.last_chunk_indices_p,
                        dm.state_indices_p, dm.has_initial_states_p, md.chunk_size};
    cm.workspace_bytes = scan_workspace_bytes(I, cm.nchunks);
    cm.workspace = (*ctx_.scratch)[ScratchPool::kMixerWorkspace].get(cm.workspace_bytes);
    cm.stores = dm.stores;  // "all" mode: the scans write the running state at each store offset
    // Batch-invariant mode: the sequential scan (chunk_size 0), whose per-token math is the decode update's, so a
    // prompt gives the same bits however the scheduler splits it into prefill chunks.
    if (opt.batch_invariant) cm.chunk_size = 0;
    // The chunked scan writes out_proj's bf16 input itself (the sequential fallback, d_state > 16, writes fp32).
    if (b16 && N <= 16 && cm.chunk_size >= 1 && cm.chunk_size <= 256) {
      SSM_CUDA_CHECK(selective_scan_chunked_fwd_out(inp, sp, y16 + P0 * I, DType::BF16, I, cm, dm.query_start_loc_p, s));
    } else {
      SSM_CUDA_CHECK(selective_scan_chunked_fwd(inp, sp, y + P0 * I, I, cm, dm.query_start_loc_p, s));
      if (b16) SSM_CUDA_CHECK(cast_rows(y + P0 * I, I, T - P0, I, y16 + P0 * I, DType::BF16, I, s));
    }
  }
  // 5. out = out_proj(y) (row-parallel: all-reduced under TP).
  ctx_.gemm_run(b16 ? static_cast<const void*>(y16) : y, T, I, out_proj, out, H);
  if (late_pf) SSM_CUDA_CHECK(cudaStreamWaitEvent(s, branch_->join_late, 0));  // the branch rejoins (captures need it)
  ctx_.tp->all_reduce(out, T * H);
}

bool same_view(const StateView& a, const StateView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.block_stride == b.block_stride;
}

// Decode-only steps of up to 16 rows on the dataflow kernel: the whole stack in one launch per group of rows.
bool mamba1_dataflow_stack(std::span<CudaModule* const> layers, std::span<const float* const> norms, float /*eps*/,
                           const CudaStep& st, std::span<const ModuleState> states, float* hidden, float* out) {
  std::vector<CudaMamba1*> mix(layers.size());
  for (size_t l = 0; l < layers.size(); ++l)
    if (!(mix[l] = dynamic_cast<CudaMamba1*>(layers[l])) || !mix[l]->dataflow_enabled()) return false;
  const int64_t T = st.T;
  if (st.batch.meta.num_prefills > 0 || st.batch.meta.spec_cols > 1 || mix.empty()) return false;  // (verify rows: per module)
  const Mamba1DecodeShape sh = mix[0]->decode_shape();
  const StateView ss = states[0].ssm;
  // Launches of up to `per` rows: the most the kernel takes for this shape (a row's bits do not depend on it).
  int per = kDataflowMaxRows;
  while (per > 0 && !mamba1_dataflow_supported(sh, per, ss.dtype)) --per;
  const int nl = static_cast<int>(mix.size());
  if (per == 0 || T > 2 * kDataflowMaxRows || nl > kDataflowMaxLayers) return false;
  DataflowCache& c = mix[0]->dataflow;
  cudaStream_t s = st.stream;
  std::vector<Mamba1DataflowLayer> want;
  for (int l = 0; l < nl; ++l) want.push_back({mix[l]->dataflow_layer(norms[l], states[l]), nullptr});
  bool same = c.host.size() == want.size();
  for (size_t l = 0; same && l < want.size(); ++l)
    same = same_view(c.host[l].w.conv_states, want[l].w.conv_states) && same_view(c.host[l].w.ssm_states, want[l].w.ssm_states);
  if (!same) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    SSM_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
    SSM_CHECK(cap == cudaStreamCaptureStatusNone, "dataflow decode: state buffers moved during a graph capture");
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));  // a previous launch may still read the old arrays
    const int64_t I = sh.I, XD = sh.R + 2 * sh.N;
    if (c.x_proj_t.empty())
      for (int l = 0; l < nl; ++l) {
        c.x_proj_t.emplace_back(static_cast<size_t>(XD * I * 2));
        SSM_CUDA_CHECK(mamba1_dataflow_transpose_x_proj(mix[l]->x_proj.buf.data(), XD, I, c.x_proj_t.back().data(), s));
      }
    for (int l = 0; l < nl; ++l) want[l].x_proj_t = c.x_proj_t[l].data();
    c.layers = DeviceBuffer(want.size() * sizeof(Mamba1DataflowLayer));
    c.layers.upload(want.data(), c.layers.bytes());
    c.host = std::move(want);
    if (c.ws.bytes() < mamba1_dataflow_workspace(sh, nl)) {
      c.ws = DeviceBuffer(mamba1_dataflow_workspace(sh, nl));
      c.ws.fill_bytes(0);
    }
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  const int64_t H = sh.H;
  for (int64_t r0 = 0; r0 < T; r0 += per) {  // groups of up to `per` rows, each its own launch
    const int rows = static_cast<int>(std::min<int64_t>(per, T - r0));
    const Mamba1DataflowBuffers buf{hidden + r0 * H, out + r0 * H, st.meta.state_indices_d + r0, c.ws.data(), c.ws.bytes()};
    SSM_CUDA_CHECK(mamba1_dataflow_decode(sh, c.host.data(), static_cast<const Mamba1DataflowLayer*>(c.layers.data()), nl, rows,
                                          buf, {}, s));
  }
  return true;
}

}  // namespace

CudaStackDecodeFn cuda_mamba1_stack_decode() { return &mamba1_dataflow_stack; }

std::unique_ptr<CudaModule> make_cuda_mamba1(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const MambaConfig m = MambaConfig::from_json(h.params, h.cfg.hidden_size);
  const dist::TpRank& tp = h.tp;
  SSM_CHECK(m.d_state <= 256, "config.json: state_size {} > 256 is not supported", m.d_state);
  SSM_CHECK(m.d_conv >= 1 && m.d_conv <= 8, "config.json: conv_kernel {} outside [1, 8] on cuda", m.d_conv);
  SSM_CHECK(!m.use_bias, "{}: use_bias = true (in_proj / out_proj biases) is not supported on cuda yet",
            (h.cfg.dir / "config.json").string());
  const int64_t I = m.d_inner, N = m.d_state, K = m.d_conv;
  const dist::Range c = dist::even_shard(I, tp.rank, tp.world, "Mamba-1 d_inner (intermediate_size)");
  MambaLayerWeights w = read_mamba1_layer(h.src, h.prefix, h.cfg.hidden_size, m, {}, /*pack=*/false);
  MambaConfig shard = m;
  if (tp.world > 1) {  // vLLM's Mamba-1 sharding: channels c; x_proj / out_proj input columns c (row-parallel)
    w.in_proj = dist::slice_rows(w.in_proj, {c, {I + c.begin, I + c.end}});
    w.conv_weight = dist::slice_rows(w.conv_weight, K, {c});
    if (!w.conv_bias.empty()) w.conv_bias = dist::slice_rows(w.conv_bias, 1, {c});
    w.x_proj = dist::slice_cols(w.x_proj, c);
    w.dt_proj = dist::slice_rows(w.dt_proj, {c});
    w.dt_bias = dist::slice_rows(w.dt_bias, 1, {c});
    w.A = dist::slice_rows(w.A, N, {c});
    w.D = dist::slice_rows(w.D, 1, {c});
    w.out_proj = dist::slice_cols(w.out_proj, c);
    shard.d_inner = static_cast<int>(c.size());
  }
  return std::make_unique<CudaMamba1>(a.ctx, shard, m.d_inner, h.cfg.hidden_size, h.cfg.layer_norm_epsilon, w);
}

}  // namespace ssmserve::cuda
