// Owns the Mamba-1 GPU runner (see cuda_mamba.h). Per step: one metadata upload, the layer stack as kernel
// launches on one stream, one logits download.
#include "runtime/cuda_mamba.h"

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/dataflow_decode.h"
#include "kernels/cuda/persistent_decode.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/archs/mamba.h"
#include "model/checkpoint.h"
#include "model/lm_common.h"
#include "model/weight_source.h"
#include "runtime/cuda_minimax.h"
#include "runtime/device_state.h"
#include "runtime/runner_common.h"
#include "runtime/tp_runner.h"
#include "dist/shard.h"

namespace ssmserve::cuda {
namespace {

/// Rank tp.rank's row-parallel slices of the whole model `w` (vLLM's Mamba-1 sharding, vllm-ssm-design.md §5.1):
/// channels c of in_proj's x / z rows, conv, dt_proj rows, dt_bias, A, D; x_proj and out_proj input columns c
/// (their partial sums all-reduced); the LM head's vocab rows. The embedding stays whole (replicated).
MambaWeights shard_weights(const MambaWeights& w, const MambaConfig& m, int64_t V, const dist::TpRank& tp) {
  const int64_t I = m.d_inner, N = m.d_state, K = m.d_conv;
  const dist::Range c = dist::even_shard(I, tp.rank, tp.world, "Mamba-1 d_inner (intermediate_size)");
  MambaWeights s;
  s.embedding = w.embedding;
  for (const MambaLayerWeights& L : w.layers) {
    MambaLayerWeights S;
    S.norm = L.norm;
    S.in_proj = dist::slice_rows(L.in_proj, {c, {I + c.begin, I + c.end}});
    S.conv_weight = dist::slice_rows(L.conv_weight, K, {c});
    if (!L.conv_bias.empty()) S.conv_bias = dist::slice_rows(L.conv_bias, 1, {c});
    S.x_proj = dist::slice_cols(L.x_proj, c);
    S.dt_proj = dist::slice_rows(L.dt_proj, {c});
    S.dt_bias = dist::slice_rows(L.dt_bias, 1, {c});
    S.A = dist::slice_rows(L.A, N, {c});
    S.D = dist::slice_rows(L.D, 1, {c});
    S.out_proj = dist::slice_cols(L.out_proj, c);
    s.layers.push_back(std::move(S));
  }
  s.norm_f = w.norm_f;
  s.lm_head = dist::slice_rows(w.lm_head, {dist::vocab_shard(V, tp.rank, tp.world)});
  return s;
}

/// The second graph branch of the decode overlap (CudaModelOptions::decode_overlap): its stream, its own GEMM
/// handle (the skinny GEMM's cross-block workspace must not be shared by concurrent launches) and the fork / join
/// events (recorded inside the decode graph captures, where they become graph edges).
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

/// Benchmark-only knobs of the decode overlap (environment, read once; results may be wrong under them):
/// SSMSERVE_OVERLAP_DEBUG bits: 1 = skip the z rows' GEMM, 2 = the z rows on the main stream right after the x
/// rows (no branch), 4 = the branch's GEMM launched with PDL; SSMSERVE_OVERLAP_PF_MB=<n>: prefetch only the
/// first n MB of out_proj; SSMSERVE_OUTPROJ_TUNE="shift,cta": out_proj's skinny split shift / block splits;
/// SSMSERVE_OVERLAP_HALF_TUNE="shift,cta": the in_proj halves' split shift (added) / block splits; both
/// take ",unroll,pipelined" after them for a fixed launch shape (never changes a result).
struct OverlapBench {
  int debug = 0;
  int64_t pf_bytes = 0;
  bool outproj_tune = false, half_tune = false;
  SkinnyTuning outproj, half;
};
const OverlapBench& overlap_bench() {
  static const OverlapBench b = [] {
    OverlapBench o;
    if (const char* e = std::getenv("SSMSERVE_OVERLAP_DEBUG")) o.debug = std::atoi(e);
    if (const char* e = std::getenv("SSMSERVE_OVERLAP_PF_MB")) o.pf_bytes = static_cast<int64_t>(std::atoi(e)) << 20;
    // "shift,cta[,unroll,pipelined]": with the last two, a fixed launch shape instead of the occupancy pick.
    auto tune = [](const char* name, bool& on, SkinnyTuning& t) {
      int shift = 0, cta = 0, unroll = 0, pipe = 0;
      const char* e = std::getenv(name);
      const int n = e ? std::sscanf(e, "%d,%d,%d,%d", &shift, &cta, &unroll, &pipe) : 0;
      if (n < 2) return;
      on = true;
      t.split_shift = shift, t.cta_splits = cta, t.auto_shape = true;  // auto_shape: keep the occupancy pick
      if (n == 4) t.auto_shape = false, t.unroll = unroll, t.pipelined = pipe != 0, t.reg_cap = false;
    };
    tune("SSMSERVE_OUTPROJ_TUNE", o.outproj_tune, o.outproj);
    tune("SSMSERVE_OVERLAP_HALF_TUNE", o.half_tune, o.half);
    return o;
  }();
  return b;
}

/// The default skinny tuning of an N x K weight at M rows with a bench knob's split shift / block splits (and its
/// fixed launch shape, if it gave one).
SkinnyTuning bench_tuning(const SkinnyTuning& o, int64_t M, int64_t N, int64_t K) {
  SkinnyTuning t = skinny_default_tuning(M, N, K);
  t.split_shift = o.split_shift, t.cta_splits = o.cta_splits;
  if (!o.auto_shape) t.auto_shape = false, t.unroll = o.unroll, t.pipelined = o.pipelined, t.reg_cap = false;
  return t;
}

struct LayerDev {
  DeviceBuffer norm, conv_weight, conv_bias, dt_bias, A, D;
  DevWeight in_proj, x_proj, dt_proj, out_proj;
};

class CudaMambaModel final : public CudaCausalLM {
 public:
  /// w: the whole model, or (tp.world > 1) a rank's slices from shard_weights (the embedding whole).
  CudaMambaModel(ModelConfig cfg, const MambaWeights& w, CudaModelOptions opt, const dist::TpRank& tp = {})
      : cfg_(std::move(cfg)), m_(*cfg_.mamba), opt_(opt) {
    const DType wd = opt_.weight_dtype;
    tp_.tp = tp;
    m_.d_inner /= tp.world;  // this rank's channels (MambaWeights::load checked the division)
    // TP ranks capture their decode steps in CUDA graphs too: the NCCL all-reduces are recorded on this stream,
    // every rank sees the same batches (so the same capture decisions), and a captured step runs the same
    // collectives in the same order as an eager one (NCCL allows mixing them).
    if (tp_.on()) tp.comm->set_stream(stream_.get());
    configure_gemm(gemm_, opt_);
    if ((opt_.decode_overlap & 3) && !tp_.on()) {
      branch_ = std::make_unique<OverlapBranch>();
      configure_gemm(branch_->gemm, opt_);
      branch_->gemm.set_pdl((overlap_bench().debug & 4) != 0);  // after an event wait: a plain dependency
    }
    frame_.pdl = opt_.pdl;
    frame_.embedding = upload_weight(w.embedding, wd);
    frame_.tied = !tp_.on() && w.lm_head.data == w.embedding.data;
    if (!frame_.tied) frame_.lm_head = upload_weight(w.lm_head, wd);
    frame_.norm_f = to_device(w.norm_f);
    for (const MambaLayerWeights& L : w.layers) {
      LayerDev d;
      d.norm = to_device(L.norm);
      d.in_proj = upload_weight(L.in_proj, wd);
      d.conv_weight = to_device(L.conv_weight);
      if (!L.conv_bias.empty()) d.conv_bias = to_device(L.conv_bias);
      d.x_proj = upload_weight(L.x_proj, wd);
      d.dt_proj = upload_weight(L.dt_proj, wd);
      d.dt_bias = to_device(L.dt_bias);
      d.A = to_device(L.A);
      d.D = to_device(L.D);
      d.out_proj = upload_weight(L.out_proj, wd);
      layers_.push_back(std::move(d));
    }
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return cfg_.num_hidden_layers; }
  StateShape state_shape() const override {
    return {static_cast<int64_t>(m_.d_conv - 1) * m_.d_inner, static_cast<int64_t>(m_.d_inner) * m_.d_state};
  }
  std::optional<double> device_state_budget(double util, int64_t max_tokens, int64_t max_seqs) const override {
    const double H = cfg_.hidden_size, I = m_.d_inner, XD = m_.dt_rank + 2.0 * m_.d_state, V = cfg_.vocab_size;
    const double ab = dtype_size(opt_.weight_dtype);
    const double per_token = 8 * H + ab * H + 8 * I + 16 * I + 4 * XD + 4 * I + 2 * XD;  // see reserve()
    return state_budget_bytes(util, per_token * static_cast<double>(max_tokens) +
                                        static_cast<double>(max_seqs) * (4 * V + ab * H));
  }

 private:
  /// y [M, w.rows] fp32 = x w^T; y2: optional bf16 copy with y's row stride.
  void gemm(const void* x, int64_t M, int64_t x_stride, const DevWeight& w, float* y, int64_t y_stride,
            void* y2 = nullptr);
  void mixer(int layer, const ForwardBatch& batch, const StepMeta& dm, int64_t T);
  bool tensor_parallel() const override { return tp_.on(); }
  void step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top, std::vector<GreedyPick>* picks,
            const DeviceSampleBatch* sample) override;
  /// Sizes every scratch buffer for T tokens and nlog logits rows.
  void reserve(int64_t T, int64_t nlog);

  ModelConfig cfg_;
  MambaConfig m_;
  CudaModelOptions opt_;
  LmFrame frame_;
  std::vector<LayerDev> layers_;
  Stream stream_;
  GemmHandle gemm_;
  DeviceStateMirror states_;
  StepMetaUploader meta_;
  DecodeGraphs graphs_;
  RunnerTp tp_;
  std::unique_ptr<OverlapBranch> branch_;  // decode_overlap's second branch (null when off)
  // Scratch: hidden [T, H] residual (fp32), out [T, H] mixer output, normed [T, H] (GEMM dtype), xz [T, 2I],
  // xc [T, I], xdbl [T, R + 2N], delta [T, I], y [T, I]; with bf16 weights the next GEMMs' inputs xc16 [T, I],
  // xdbl16 [T, R + 2N], y16 [T, I] (bf16).
  Scratch hidden_, out_, normed_, xz_, xc_, xdbl_, delta_, y_, xc16_, xdbl16_, y16_;
  Scratch scan_ws_;  // the chunked scan's workspace (prefill steps only)
  // The persistent decode kernel: its workspace (zeroed once) and, for the whole-stack form, the device array of
  // layer descriptors (rebuilt when the state buffers move).
  DeviceBuffer persist_ws_, persist_layers_;
  std::vector<Mamba1DecodeLayer> persist_host_;
  /// Decode-only step on the persistent kernel if it takes it (see CudaModelOptions::persistent_decode).
  bool persistent_mixer(int layer, const StepMeta& dm, int64_t T);
  // The dataflow decode kernel: x_proj transposed per layer (made at first use), the layer descriptors on the host
  // and the device (rebuilt when the state buffers move), its workspace (zeroed once).
  std::vector<DeviceBuffer> dataflow_xt_;
  std::vector<Mamba1DataflowLayer> dataflow_host_;
  DeviceBuffer dataflow_layers_, dataflow_ws_;
  /// Decode-only step of up to 16 rows on the dataflow kernel, the whole stack at layer 0 (later layers: nothing
  /// to do), if it takes it (see CudaModelOptions::dataflow_decode).
  bool dataflow_mixer(int layer, const StepMeta& dm, int64_t T);
  Mamba1DecodeLayer persist_layer(int layer) const;
};

void CudaMambaModel::gemm(const void* x, int64_t M, int64_t x_stride, const DevWeight& w, float* y, int64_t y_stride,
                          void* y2) {
  gemm_.run({M, w.rows, w.cols, x, x_stride, w.buf.data(), w.cols, w.dtype, y, y_stride, DType::F32}, stream_.get(),
            y2, y_stride);
}

void CudaMambaModel::step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top,
                          std::vector<GreedyPick>* picks, const DeviceSampleBatch* sample) {
  StepFrameArgs a;
  a.arch = "Mamba", a.num_layers = cfg_.num_hidden_layers, a.hidden_size = cfg_.hidden_size;
  a.vocab_size = cfg_.vocab_size, a.eps = cfg_.layer_norm_epsilon, a.cuda_graphs = opt_.cuda_graphs;
  a.num_steps = num_steps_, a.frame = &frame_, a.meta = &meta_, a.graphs = &graphs_, a.states = &states_, a.tp = &tp_, a.gemm = &gemm_;
  a.hidden = &hidden_, a.out = &out_;
  a.scratch = {&hidden_, &out_, &normed_, &xz_, &xc_, &xdbl_, &delta_, &y_, &xc16_, &xdbl16_, &y16_};
  a.reserve = [&](int64_t T, int64_t nlog) { reserve(T, nlog); };
  a.mixer = [&](int layer, const StepMeta& dm, int64_t T) { mixer(layer, batch, dm, T); };
  run_step(a, batch, cache, stream_.get(), logits, greedy_top, picks, sample);
}

void CudaMambaModel::reserve(int64_t T, int64_t nlog) {
  const int64_t H = cfg_.hidden_size, I = m_.d_inner, XD = m_.dt_rank + 2LL * m_.d_state;
  const size_t ab = dtype_size(opt_.weight_dtype);
  hidden_.f32(T * H), out_.f32(T * H), normed_.get(T * H * ab), xz_.f32(T * 2 * I), xc_.f32(T * I);
  xdbl_.f32(T * XD), delta_.f32(T * I), y_.f32(T * I), xc16_.get(T * I * 2), xdbl16_.get(T * XD * 2), y16_.get(T * I * 2);
  (void)ab;
  frame_.reserve(T, H, cfg_.vocab_size, nlog);
}

void CudaMambaModel::mixer(int layer, const ForwardBatch& batch, const StepMeta& dm, int64_t T) {
  const LayerDev& L = layers_[layer];
  const int64_t H = cfg_.hidden_size, I = m_.d_inner, N = m_.d_state, R = m_.dt_rank, XD = R + 2 * N;
  const MambaBatchMetadata& md = batch.meta;
  const int64_t nd = md.num_decode_rows(), P0 = batch.prefill_token_offset();
  const int np = md.num_prefills;
  const DType wd = opt_.weight_dtype;
  const size_t ab = dtype_size(wd);
  cudaStream_t s = stream_.get();
  float* hidden = hidden_.f32(T * H);
  float* out = out_.f32(T * H);
  void* normed = normed_.get(T * H * ab);
  float* xz = xz_.f32(T * 2 * I);
  float* xc = xc_.f32(T * I);
  float* xdbl = xdbl_.f32(T * XD);
  float* delta = delta_.f32(T * I);
  float* y = y_.f32(T * I);
  const bool b16 = wd == DType::BF16;  // GEMM inputs in bf16 (written by their producers) or the fp32 buffers
  auto* xc16 = static_cast<uint16_t*>(xc16_.get(T * I * 2));
  auto* xdbl16 = static_cast<uint16_t*>(xdbl16_.get(T * XD * 2));
  auto* y16 = static_cast<uint16_t*>(y16_.get(T * I * 2));
  const bool pdl = opt_.pdl;
  // Decode-only steps of up to 8 rows on the persistent kernel (the whole layer, same bits), if it takes them.
  if (np == 0 && b16 && opt_.persistent_decode != 0 && !tp_.on() && persistent_mixer(layer, dm, T)) return;
  // Decode-only steps of up to 16 rows on the dataflow kernel (the whole stack at layer 0), if it takes them.
  if (np == 0 && b16 && opt_.dataflow_decode && !tp_.on() && dataflow_mixer(layer, dm, T)) return;

  // 1. hidden += previous mixer output (none before layer 0); normed = rms_norm(hidden) in the GEMM dtype.
  SSM_CUDA_CHECK(add_rms_norm_rows(layer == 0 ? nullptr : out, H, hidden, H, L.norm.as<float>(), cfg_.layer_norm_epsilon,
                                   nullptr, T, H, true, normed, wd, H, pdl, s));
  ConvParams conv{I, m_.d_conv, L.conv_weight.as<float>(), L.conv_bias.data() ? L.conv_bias.as<float>() : nullptr,
                  states_.conv_state(layer), true};
  ScanParams sp{I, static_cast<int>(N), L.A.as<float>(), L.D.as<float>(), L.dt_bias.as<float>(), true,
                states_.ssm_state(layer)};
  // Decode-only steps on the fused kernels (same bits): in_proj + conv update, x_proj, dt_proj + state update
  // (prefetching out_proj's weights into L2), out_proj.
  if (np == 0 && b16 && opt_.fused_decode && !tp_.on() && gemm_.takes_skinny(wd, T) &&
      skinny_gemm_splits(I, R, skinny_default_tuning(T, I, R).split_shift) == 1) {
    const SkinnyConvEpilogue ce{conv, 0, dm.state_indices_d, xc, I, xc16, I};
    SkinnyExtras ex;
    ex.conv = &ce;
    gemm_.run({T, L.in_proj.rows, L.in_proj.cols, normed, H, L.in_proj.buf.data(), L.in_proj.cols, wd, xz, 2 * I,
               DType::F32}, s, nullptr, 0, &ex);
    gemm(xc16, T, I, L.x_proj, xdbl, XD, xdbl16);
    ScanInputs in{{xc, I}, {nullptr, I}, {xdbl + R, XD}, {xdbl + R + N, XD}, {xz + I, 2 * I}};
    SSM_CUDA_CHECK(dt_proj_scan_update(xdbl16, XD, L.dt_proj.buf.data(), R, in, sp, y16, wd, I, dm.state_indices_d,
                                       static_cast<int>(T), L.out_proj.buf.data(),
                                       std::min<size_t>(L.out_proj.buf.bytes(), 32u << 20), pdl, s));
    gemm(y16, T, I, L.out_proj, out, H);
    return;
  }
  // 2. xz = in_proj(normed): x = xz[:, :I], z = xz[:, I:]. Decode overlap: the z rows on the second branch
  //    (forked before or after the x rows), optionally followed there by out_proj's L2 prefetch; joined at 5
  //    (the prefetch, with bit 16, only after out_proj).
  const int ov = opt_.decode_overlap;
  const bool overlap = branch_ && np == 0 && b16 && T <= 16 && gemm_.takes_skinny(wd, T);
  const bool split_z = overlap && (ov & 1), late_pf = overlap && (ov & 2) && (ov & 16);
  if (overlap) {
    const bool same_bits = !(ov & 4) || opt_.batch_invariant;
    SkinnyTuning half = same_bits ? skinny_part_tuning(T, I, 2 * I, H) : skinny_default_tuning(T, I, H);
    const OverlapBench& ob = overlap_bench();
    if (ob.half_tune && !opt_.batch_invariant) {
      half.split_shift += ob.half.split_shift, half.cta_splits = ob.half.cta_splits;
      if (!ob.half.auto_shape)
        half.auto_shape = false, half.unroll = ob.half.unroll, half.pipelined = ob.half.pipelined, half.reg_cap = false;
    }
    SkinnyExtras ex;
    ex.tuning = &half;
    const auto* w_in = static_cast<const uint16_t*>(L.in_proj.buf.data());
    cudaStream_t side = branch_->side.get();
    auto fork = [&] {
      const GemmArgs z{T, I, H, normed, H, w_in + I * L.in_proj.cols, L.in_proj.cols, wd, xz + I, 2 * I, DType::F32};
      if (split_z && (ob.debug & 2)) gemm_.run(z, s, nullptr, 0, &ex);
      SSM_CUDA_CHECK(cudaEventRecord(branch_->fork, s));
      SSM_CUDA_CHECK(cudaStreamWaitEvent(side, branch_->fork, 0));
      if (split_z && !(ob.debug & 3)) branch_->gemm.run(z, side, nullptr, 0, &ex);
      if (late_pf) SSM_CUDA_CHECK(cudaEventRecord(branch_->join, side));
      if (ov & 2) {
        const size_t bytes = ob.pf_bytes > 0 ? std::min<size_t>(ob.pf_bytes, L.out_proj.buf.bytes()) : L.out_proj.buf.bytes();
        SSM_CUDA_CHECK(l2_prefetch(L.out_proj.buf.data(), bytes, opt_.overlap_prefetch, 66, side));
      }
      SSM_CUDA_CHECK(cudaEventRecord(late_pf ? branch_->join_late : branch_->join, side));
    };
    if (!split_z) {
      gemm(normed, T, H, L.in_proj, xz, 2 * I);
      fork();
    } else {
      if (ov & 8) fork();
      gemm_.run({T, I, H, normed, H, w_in, L.in_proj.cols, wd, xz, 2 * I, DType::F32}, s, nullptr, 0, &ex);
      if (!(ov & 8)) fork();
    }
  } else {
    gemm(normed, T, H, L.in_proj, xz, 2 * I);
  }
  // 3. Causal conv1d + SiLU (xc, and its bf16 copy for x_proj): decode rows [0, nd), then the prefill rows.
  if (nd > 0)
    SSM_CUDA_CHECK(conv1d_update_dual(xz, 2 * I, xc, I, b16 ? xc16 : nullptr, I, conv, dm.state_indices_d,
                                      static_cast<int>(nd), pdl, s));
  if (np > 0) {
    SSM_CUDA_CHECK(causal_conv1d_fwd_dual(xz + P0 * 2 * I, 2 * I, xc + P0 * I, I, b16 ? xc16 + P0 * I : nullptr, I, conv,
                                          dm.query_start_loc_p, dm.state_indices_p, dm.has_initial_states_p, np, T - P0, s));
  }
  // 4. x_proj -> xdbl = [dt_low, B, C] (and its bf16 copy; under tensor parallelism after the all-reduce, since
  //    x_proj is row-parallel); delta = dt_proj(dt_low).
  const bool fused_cast = b16 && !tp_.on();
  gemm(b16 ? static_cast<const void*>(xc16) : xc, T, I, L.x_proj, xdbl, XD, fused_cast ? xdbl16 : nullptr);
  tp_.all_reduce(xdbl, T * XD);
  if (b16 && !fused_cast) SSM_CUDA_CHECK(cast_rows(xdbl, XD, T, XD, xdbl16, DType::BF16, XD, s));
  gemm(b16 ? static_cast<const void*>(xdbl16) : xdbl, T, XD, L.dt_proj, delta, I);
  if (overlap) SSM_CUDA_CHECK(cudaStreamWaitEvent(s, branch_->join, 0));  // z (and an early-joined prefetch) done
  // 5. Selective scan with D skip and SiLU(z) gate (decode rows write out_proj's bf16 input directly).
  ScanInputs in{{xc, I}, {delta, I}, {xdbl + R, XD}, {xdbl + R + N, XD}, {xz + I, 2 * I}};
  // Large decode batches (> 16 rows, outside batch-invariant mode): the thread-per-channel kernel.
  if (nd > 16 && N <= 16 && !opt_.batch_invariant)
    SSM_CUDA_CHECK(selective_state_update_wide(in, sp, b16 ? static_cast<void*>(y16) : y, wd, I, dm.state_indices_d,
                                               static_cast<int>(nd), pdl, s));
  else if (nd > 0)
    SSM_CUDA_CHECK(selective_state_update_out(in, sp, b16 ? static_cast<void*>(y16) : y, wd, I, dm.state_indices_d,
                                              static_cast<int>(nd), pdl, s));
  if (np > 0) {
    ScanInputs inp{{xc + P0 * I, I}, {delta + P0 * I, I}, {xdbl + P0 * XD + R, XD}, {xdbl + P0 * XD + R + N, XD},
                   {xz + P0 * 2 * I + I, 2 * I}};
    ChunkMetadataDev cm{np, md.num_chunks(), dm.cu_chunk_seqlen_p, dm.seq_idx_p, dm.last_chunk_indices_p,
                        dm.state_indices_p, dm.has_initial_states_p, md.chunk_size};
    cm.workspace_bytes = scan_workspace_bytes(I, cm.nchunks);
    cm.workspace = scan_ws_.get(cm.workspace_bytes);
    // Batch-invariant mode: the sequential scan (chunk_size 0), whose per-token math is the decode update's, so a
    // prompt gives the same bits however the scheduler splits it into prefill chunks (the chunk-parallel form
    // rounds differently at every chunk boundary).
    if (opt_.batch_invariant) cm.chunk_size = 0;
    // The chunked scan writes out_proj's bf16 input itself (the sequential fallback, d_state > 16, writes fp32).
    if (b16 && N <= 16 && cm.chunk_size >= 1 && cm.chunk_size <= 256) {
      SSM_CUDA_CHECK(selective_scan_chunked_fwd_out(inp, sp, y16 + P0 * I, DType::BF16, I, cm, dm.query_start_loc_p, s));
    } else {
      SSM_CUDA_CHECK(selective_scan_chunked_fwd(inp, sp, y + P0 * I, I, cm, dm.query_start_loc_p, s));
      if (b16) SSM_CUDA_CHECK(cast_rows(y + P0 * I, I, T - P0, I, y16 + P0 * I, DType::BF16, I, s));
    }
  }
  // 6. out = out_proj(y) (added to hidden by the next layer's norm or the final norm).
  if (overlap && overlap_bench().outproj_tune) {
    const SkinnyTuning t = bench_tuning(overlap_bench().outproj, T, H, I);
    SkinnyExtras ex;
    ex.tuning = &t;
    gemm_.run({T, H, I, y16, I, L.out_proj.buf.data(), L.out_proj.cols, wd, out, H, DType::F32}, s, nullptr, 0, &ex);
  } else {
    gemm(b16 ? static_cast<const void*>(y16) : y, T, I, L.out_proj, out, H);
  }
  if (late_pf) SSM_CUDA_CHECK(cudaStreamWaitEvent(s, branch_->join_late, 0));  // the branch rejoins (captures need it)
  tp_.all_reduce(out, T * H);  // out_proj is row-parallel
}

Mamba1DecodeLayer CudaMambaModel::persist_layer(int layer) const {
  const LayerDev& L = layers_[layer];
  return {L.norm.as<float>(), L.in_proj.buf.data(), L.conv_weight.as<float>(),
          L.conv_bias.data() ? L.conv_bias.as<float>() : nullptr, L.x_proj.buf.data(), L.dt_proj.buf.data(),
          L.dt_bias.as<float>(), L.A.as<float>(), L.D.as<float>(), L.out_proj.buf.data(), states_.conv_state(layer),
          states_.ssm_state(layer)};
}

bool CudaMambaModel::persistent_mixer(int layer, const StepMeta& dm, int64_t T) {
  const Mamba1DecodeShape sh{cfg_.hidden_size, m_.d_inner, m_.d_state, m_.dt_rank, m_.d_conv, cfg_.layer_norm_epsilon};
  const StateView cs = states_.conv_state(layer), ss = states_.ssm_state(layer);
  if (cs.dtype != ss.dtype || !mamba1_persistent_supported(sh, T, ss.dtype)) return false;
  const int64_t H = cfg_.hidden_size, I = m_.d_inner, XD = m_.dt_rank + 2LL * m_.d_state;
  if (persist_ws_.bytes() < mamba1_persistent_workspace(sh)) {
    persist_ws_ = DeviceBuffer(mamba1_persistent_workspace(sh));
    persist_ws_.fill_bytes(0);
  }
  const Mamba1DecodeBuffers buf{hidden_.f32(T * H), out_.f32(T * H), xz_.f32(T * 2 * I), xdbl_.f32(T * XD),
                                xdbl16_.get(T * XD * 2), y16_.get(T * I * 2), dm.state_indices_d, persist_ws_.data(),
                                persist_ws_.bytes()};
  const Mamba1PersistentOptions po{opt_.persistent_prefetch};
  cudaStream_t s = stream_.get();
  if (opt_.persistent_decode == 2) {  // the whole stack at layer 0
    if (layer > 0) return true;
    const int nl = cfg_.num_hidden_layers;
    std::vector<Mamba1DecodeLayer> want;
    for (int l = 0; l < nl; ++l) want.push_back(persist_layer(l));
    auto same_view = [](const StateView& a, const StateView& b) {
      return a.data == b.data && a.dtype == b.dtype && a.block_stride == b.block_stride;
    };
    bool same = persist_host_.size() == want.size();
    for (size_t l = 0; same && l < want.size(); ++l) {
      const Mamba1DecodeLayer &a = persist_host_[l], &b = want[l];
      same = a.norm == b.norm && a.in_proj == b.in_proj && a.conv_weight == b.conv_weight &&
             a.conv_bias == b.conv_bias && a.x_proj == b.x_proj && a.dt_proj == b.dt_proj && a.dt_bias == b.dt_bias &&
             a.A == b.A && a.D == b.D && a.out_proj == b.out_proj && same_view(a.conv_states, b.conv_states) &&
             same_view(a.ssm_states, b.ssm_states);
    }
    if (!same) {
      cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
      SSM_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
      SSM_CHECK(cap == cudaStreamCaptureStatusNone, "persistent decode: state buffers moved during a graph capture");
      SSM_CUDA_CHECK(cudaStreamSynchronize(s));  // a previous launch may still read the old array
      persist_layers_ = DeviceBuffer(want.size() * sizeof(Mamba1DecodeLayer));
      persist_layers_.upload(want.data(), persist_layers_.bytes());
      persist_host_ = std::move(want);
    }
    SSM_CUDA_CHECK(mamba1_persistent_decode(sh, static_cast<const Mamba1DecodeLayer*>(persist_layers_.data()),
                                            persist_host_[0], nl, true, static_cast<int>(T), buf, po, s));
    return true;
  }
  SSM_CUDA_CHECK(mamba1_persistent_decode(sh, nullptr, persist_layer(layer), 1, layer == 0, static_cast<int>(T), buf,
                                          po, s));
  return true;
}

bool CudaMambaModel::dataflow_mixer(int layer, const StepMeta& dm, int64_t T) {
  const Mamba1DecodeShape sh{cfg_.hidden_size, m_.d_inner, m_.d_state, m_.dt_rank, m_.d_conv, cfg_.layer_norm_epsilon};
  const StateView ss = states_.ssm_state(0);
  // Launches of up to `per` rows: the most the kernel takes for this shape (a row's bits do not depend on it).
  int per = kDataflowMaxRows;
  while (per > 0 && !mamba1_dataflow_supported(sh, per, ss.dtype)) --per;
  if (per == 0 || T > 2 * kDataflowMaxRows || cfg_.num_hidden_layers > kDataflowMaxLayers) return false;
  if (layer > 0) return true;  // layer 0 ran the whole stack
  const int nl = cfg_.num_hidden_layers;
  const int64_t H = cfg_.hidden_size, I = m_.d_inner, XD = m_.dt_rank + 2LL * m_.d_state;
  cudaStream_t s = stream_.get();
  std::vector<Mamba1DataflowLayer> want;
  for (int l = 0; l < nl; ++l) want.push_back({persist_layer(l), nullptr});
  auto same_view = [](const StateView& a, const StateView& b) {
    return a.data == b.data && a.dtype == b.dtype && a.block_stride == b.block_stride;
  };
  bool same = dataflow_host_.size() == want.size();
  for (size_t l = 0; same && l < want.size(); ++l)
    same = same_view(dataflow_host_[l].w.conv_states, want[l].w.conv_states) &&
           same_view(dataflow_host_[l].w.ssm_states, want[l].w.ssm_states);
  if (!same) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    SSM_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
    SSM_CHECK(cap == cudaStreamCaptureStatusNone, "dataflow decode: state buffers moved during a graph capture");
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));  // a previous launch may still read the old arrays
    if (dataflow_xt_.empty())
      for (int l = 0; l < nl; ++l) {
        dataflow_xt_.emplace_back(static_cast<size_t>(XD * I * 2));
        SSM_CUDA_CHECK(mamba1_dataflow_transpose_x_proj(layers_[l].x_proj.buf.data(), XD, I, dataflow_xt_.back().data(), s));
      }
    for (int l = 0; l < nl; ++l) want[l].x_proj_t = dataflow_xt_[l].data();
    dataflow_layers_ = DeviceBuffer(want.size() * sizeof(Mamba1DataflowLayer));
    dataflow_layers_.upload(want.data(), dataflow_layers_.bytes());
    dataflow_host_ = std::move(want);
    if (dataflow_ws_.bytes() < mamba1_dataflow_workspace(sh, nl)) {
      dataflow_ws_ = DeviceBuffer(mamba1_dataflow_workspace(sh, nl));
      dataflow_ws_.fill_bytes(0);
    }
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  float* hidden = hidden_.f32(T * H);
  float* out = out_.f32(T * H);
  for (int64_t r0 = 0; r0 < T; r0 += per) {  // groups of up to `per` rows, each its own launch
    const int rows = static_cast<int>(std::min<int64_t>(per, T - r0));
    const Mamba1DataflowBuffers buf{hidden + r0 * H, out + r0 * H, dm.state_indices_d + r0, dataflow_ws_.data(),
                                    dataflow_ws_.bytes()};
    SSM_CUDA_CHECK(mamba1_dataflow_decode(sh, dataflow_host_.data(),
                                          static_cast<const Mamba1DataflowLayer*>(dataflow_layers_.data()), nl, rows,
                                          buf, {}, s));
  }
  return true;
}

}  // namespace

std::unique_ptr<CausalLM> load_mamba_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt, const dist::TpRank& tp) {
  SSM_CHECK(cfg.mamba.has_value(), "{}: not a Mamba config", (cfg.dir / "config.json").string());
  SSM_CHECK(gpu_available(), "--device cuda: no usable CUDA device");
  SSM_CHECK(cfg.mamba->d_state <= 256, "config.json: state_size {} > 256 is not supported", cfg.mamba->d_state);
  SSM_CHECK(cfg.mamba->d_conv >= 1 && cfg.mamba->d_conv <= 8, "config.json: conv_kernel {} outside [1, 8] on cuda",
            cfg.mamba->d_conv);
  SSM_CHECK(opt.weight_dtype == DType::BF16 || opt.weight_dtype == DType::F32, "cuda weight dtype must be BF16 or F32");
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  }
  (void)dist::even_shard(cfg.mamba->d_inner, tp.rank, tp.world, "Mamba-1 d_inner (intermediate_size)");
  const MambaWeights w = MambaWeights::load(cfg, src);
  for (const auto& L : w.layers)
    SSM_CHECK(L.in_proj_bias.empty() && L.out_proj_bias.empty(),
              "{}: use_bias = true (in_proj / out_proj biases) is not supported on cuda yet",
              (cfg.dir / "config.json").string());
  if (tp.world == 1) return std::make_unique<CudaMambaModel>(cfg, w, opt);
  return std::make_unique<CudaMambaModel>(cfg, shard_weights(w, *cfg.mamba, cfg.vocab_size, tp), opt, tp);
}

CudaModelOptions CudaModelOptions::from_env() {
  CudaModelOptions o;
  auto flag = [](const char* name, bool& v) {
    if (const char* e = std::getenv(name); e && *e) {
      const std::string s(e);
      SSM_CHECK(s == "0" || s == "1", "{}={}: expected 0 or 1", name, s);
      v = s == "1";
    }
  };
  flag("SSMSERVE_CUDA_GRAPHS", o.cuda_graphs);
  flag("SSMSERVE_PDL", o.pdl);
  flag("SSMSERVE_BATCH_INVARIANT", o.batch_invariant);
  flag("SSMSERVE_DECODE_FUSED", o.fused_decode);
  flag("SSMSERVE_DECODE_DATAFLOW", o.dataflow_decode);
  auto small_int = [](const char* name, int& v, int hi) {
    if (const char* e = std::getenv(name); e && *e) {
      const std::string s(e);
      SSM_CHECK(s.size() == 1 && s[0] >= '0' && s[0] <= '0' + hi, "{}={}: expected an integer in [0, {}]", name, s, hi);
      v = s[0] - '0';
    }
  };
  small_int("SSMSERVE_DECODE_PERSISTENT", o.persistent_decode, 2);
  small_int("SSMSERVE_PERSISTENT_PREFETCH", o.persistent_prefetch, 5);
  small_int("SSMSERVE_OVERLAP_PREFETCH", o.overlap_prefetch, 2);
  if (const char* e = std::getenv("SSMSERVE_DECODE_OVERLAP"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    SSM_CHECK(end && *end == 0 && v >= 0 && v <= 31, "SSMSERVE_DECODE_OVERLAP={}: expected an integer in [0, 31]", e);
    o.decode_overlap = static_cast<int>(v);
  }
  if (const char* e = std::getenv("SSMSERVE_SKINNY_MAX_M"); e && *e) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    SSM_CHECK(end && *end == 0 && v >= 0 && v <= (1 << 20), "SSMSERVE_SKINNY_MAX_M={}: expected an integer in [0, 2^20]", e);
    o.skinny_max_m = v;
  }
  return o;
}

void configure_gemm(GemmHandle& g, const CudaModelOptions& o) {
  g.set_skinny_max_m(o.skinny_max_m);
  g.set_batch_invariant(o.batch_invariant);
  g.set_pdl(o.pdl);
}

void register_cuda_backend() {
  register_device_model(
      "cuda", "MambaForCausalLM",
      [](const ModelConfig& c, LoadFormat f) { return load_mamba_cuda(c, f, CudaModelOptions::from_env()); },
      [] { return gpu_available(); });
  register_device_model(
      "cuda", "Mamba2ForCausalLM",
      [](const ModelConfig& c, LoadFormat f) { return load_mamba2_cuda(c, f, CudaModelOptions::from_env()); },
      [] { return gpu_available(); });
  register_device_model(
      "cuda", "MiniMaxForCausalLM", [](const ModelConfig& c, LoadFormat f) { return load_minimax_cuda(c, f); },
      [] { return gpu_available(); });
  register_cuda_tensor_parallel();
}

}  // namespace ssmserve::cuda
