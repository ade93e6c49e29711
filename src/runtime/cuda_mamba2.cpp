// Owns the Mamba-2 GPU runner: the forward pass of model/archs/mamba2.cpp (embedding -> N x [RMSNorm ->
// Mamba2Mixer, fp32 residual] -> RMSNorm -> LM head; the mixer: in_proj -> [z | xBC | dt], causal conv1d + SiLU
// over xBC, SSD scan over the chunk metadata, gated RMSNorm, out_proj) with weights on the device, the states in
// the device mirror of the StateCache, one metadata upload and one synchronization per step.
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <exception>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/ssd.h"
#include "model/archs/mamba2.h"
#include "model/checkpoint.h"
#include "model/lm_common.h"
#include "model/parallel_layers.h"
#include "model/weight_source.h"
#include "runtime/cuda_mamba.h"
#include "runtime/device_state.h"
#include "runtime/runner_common.h"
#include "runtime/tp_runner.h"
#include "dist/shard.h"

namespace ssmserve::cuda {
namespace {

/// Host copies of all parameters (the tensor names, shapes and dummy initializers of archs/mamba2.cpp at
/// tensor-parallel size 1; dummy values are seeded per tensor name, so they equal the CPU model's).
struct HostWeights2 {
  Weight embedding, lm_head;
  std::vector<Mamba2LayerWeights> layers;
  std::vector<float> norm_f;
};

/// Rank tp.rank's slices of `w` (as archs/mamba2.cpp's shard loader cuts them: heads, channels, B/C groups, dt,
/// the gated norm's channels, out_proj's columns, the LM head's vocab rows; the embedding stays whole).
HostWeights2 shard_host_weights(const HostWeights2& w, const Mamba2Config& m, int64_t V, const dist::TpRank& tp) {
  const int64_t I = m.d_inner, C = m.conv_dim(), NH = m.num_heads, K = m.d_conv, N = m.d_state, GN = static_cast<int64_t>(m.n_groups) * N;
  const dist::Range h = dist::even_shard(NH, tp.rank, tp.world, "Mamba-2 num_heads");
  const dist::Range c{h.begin * m.head_dim, h.end * m.head_dim};
  const dist::Range groups = dist::even_shard(m.n_groups, tp.rank, tp.world, "Mamba-2 n_groups");
  const dist::Range g{groups.begin * N, groups.end * N};
  const std::vector<dist::Range> conv_rows = {c, {I + g.begin, I + g.end}, {I + GN + g.begin, I + GN + g.end}};
  std::vector<dist::Range> proj_rows = {c};
  for (const dist::Range& r : conv_rows) proj_rows.push_back({I + r.begin, I + r.end});
  proj_rows.push_back({I + C + h.begin, I + C + h.end});
  HostWeights2 s;
  s.embedding = w.embedding;
  for (const Mamba2LayerWeights& L : w.layers) {
    Mamba2LayerWeights S;
    S.norm = L.norm;
    S.in_proj = dist::slice_rows(L.in_proj, proj_rows);
    S.conv_weight = dist::slice_rows(L.conv_weight, K, conv_rows);
    if (!L.conv_bias.empty()) S.conv_bias = dist::slice_rows(L.conv_bias, 1, conv_rows);
    S.dt_bias = dist::slice_rows(L.dt_bias, 1, {h});
    S.A = dist::slice_rows(L.A, 1, {h});
    S.D = dist::slice_rows(L.D, 1, {h});
    S.gate_norm = dist::slice_rows(L.gate_norm, 1, {c});
    S.out_proj = dist::slice_cols(L.out_proj, c);
    s.layers.push_back(std::move(S));
  }
  s.norm_f = w.norm_f;
  s.lm_head = dist::slice_rows(w.lm_head, {dist::vocab_shard(V, tp.rank, tp.world)});
  return s;
}

HostWeights2 load_host_weights(const ModelConfig& cfg, const Mamba2Config& m, WeightSource& src) {
  const int64_t Hd = cfg.hidden_size, V = cfg.vocab_size;
  HostWeights2 w;
  w.embedding = src.matrix("backbone.embeddings.weight", {V, Hd}, DummyInit::uniform(0.1f));
  w.layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
  for_each_layer_parallel(cfg.num_hidden_layers,
                          [&](int64_t l) { w.layers[static_cast<size_t>(l)] = read_mamba2_layer(src, cfg, m, l); });
  w.norm_f = src.vector("backbone.norm_f.weight", {Hd}, DummyInit::constant(1.0f));
  w.lm_head = (cfg.tie_word_embeddings && !src.has("lm_head.weight"))
                  ? w.embedding
                  : src.matrix("lm_head.weight", {V, Hd}, DummyInit::uniform(0.1f));
  return w;
}

struct Layer2Dev {
  DeviceBuffer norm, conv_weight, conv_bias, dt_bias, A, D, gate_norm;
  DevWeight in_proj, out_proj;
};

class CudaMamba2Model final : public CudaCausalLM {
 public:
  /// m: this rank's shard of the mixer (d_inner, num_heads, n_groups per rank; all of them at tp.world == 1).
  CudaMamba2Model(ModelConfig cfg, Mamba2Config m, const HostWeights2& w, CudaModelOptions opt, const dist::TpRank& tp = {})
      : cfg_(std::move(cfg)), m_(m), opt_(opt) {
    const DType wd = opt_.weight_dtype;
    tp_.tp = tp;
    // TP ranks capture their decode steps in CUDA graphs too: the NCCL all-reduces are recorded on this stream,
    // every rank sees the same batches (so the same capture decisions), and a captured step runs the same
    // collectives in the same order as an eager one (NCCL allows mixing them).
    if (tp_.on()) tp.comm->set_stream(stream_.get());
    configure_gemm(gemm_, opt_);
    frame_.pdl = opt_.pdl;
    frame_.embedding = upload_weight(w.embedding, wd);
    frame_.tied = !tp_.on() && w.lm_head.data == w.embedding.data;
    if (!frame_.tied) frame_.lm_head = upload_weight(w.lm_head, wd);
    frame_.norm_f = to_device(w.norm_f);
    for (const Mamba2LayerWeights& L : w.layers) {
      Layer2Dev d;
      d.norm = to_device(L.norm);
      d.in_proj = upload_weight(L.in_proj, wd);
      d.conv_weight = to_device(L.conv_weight);
      if (!L.conv_bias.empty()) d.conv_bias = to_device(L.conv_bias);
      d.dt_bias = to_device(L.dt_bias);
      d.A = to_device(L.A);
      d.D = to_device(L.D);
      d.gate_norm = to_device(L.gate_norm);
      d.out_proj = upload_weight(L.out_proj, wd);
      layers_.push_back(std::move(d));
    }
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return cfg_.num_hidden_layers; }
  StateShape state_shape() const override {
    return {static_cast<int64_t>(m_.d_conv - 1) * m_.conv_dim(),
            static_cast<int64_t>(m_.num_heads) * m_.head_dim * m_.d_state};
  }
  int chunk_size() const override { return m_.chunk_size; }
  std::optional<double> device_state_budget(double util, int64_t max_tokens, int64_t max_seqs) const override {
    const double Hd = cfg_.hidden_size, I = m_.d_inner, C = m_.conv_dim(), PW = I + C + m_.num_heads;
    const double V = cfg_.vocab_size, ab = dtype_size(opt_.weight_dtype);
    const double per_token = 8 * Hd + ab * Hd + 4 * PW + 4 * C + 4 * I + ab * I;  // see reserve()
    return state_budget_bytes(util, per_token * static_cast<double>(max_tokens) +
                                        static_cast<double>(max_seqs) * (4 * V + ab * Hd));
  }

 private:
  bool tensor_parallel() const override { return tp_.on(); }
  void step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top, std::vector<GreedyPick>* picks,
            const DeviceSampleBatch* sample) override {
    StepFrameArgs a;
    a.arch = "Mamba2", a.num_layers = cfg_.num_hidden_layers, a.hidden_size = cfg_.hidden_size;
    a.vocab_size = cfg_.vocab_size, a.eps = cfg_.layer_norm_epsilon, a.cuda_graphs = opt_.cuda_graphs;
    a.num_steps = num_steps_, a.frame = &frame_, a.meta = &meta_, a.graphs = &graphs_, a.states = &states_, a.tp = &tp_, a.gemm = &gemm_;
    a.hidden = &hidden_, a.out = &out_;
    a.scratch = {&hidden_, &out_, &normed_, &proj_, &xbc_, &y_, &gated_};
    a.reserve = [&](int64_t T, int64_t nlog) { reserve(T, nlog); };
    a.mixer = [&](int layer, const StepMeta& sm, int64_t T) { mixer(layer, batch, sm, T); };
    run_step(a, batch, cache, stream_.get(), logits, greedy_top, picks, sample);
  }

  /// Sizes every scratch buffer for T tokens and nlog logits rows.
  void reserve(int64_t T, int64_t nlog) {
    const int64_t Hd = cfg_.hidden_size, I = m_.d_inner, C = m_.conv_dim(), PW = I + C + m_.num_heads;
    const size_t ab = dtype_size(opt_.weight_dtype);
    hidden_.f32(T * Hd), out_.f32(T * Hd), normed_.get(T * Hd * ab), proj_.f32(T * PW), xbc_.f32(T * C);
    y_.f32(T * I), gated_.get(T * I * ab);
    if (opt_.weight_dtype == DType::BF16) xbc_h_.get(T * C * 2);
    frame_.reserve(T, Hd, cfg_.vocab_size, nlog);
  }

  void gemm(const void* x, int64_t M, int64_t x_stride, const DevWeight& w, float* y, int64_t y_stride) {
    gemm_.run({M, w.rows, w.cols, x, x_stride, w.buf.data(), w.cols, w.dtype, y, y_stride, DType::F32}, stream_.get());
  }

  void mixer(int layer, const ForwardBatch& batch, const StepMeta& sm, int64_t T) {
    const Layer2Dev& L = layers_[layer];
    const MambaBatchMetadata& md = batch.meta;
    const int64_t Hd = cfg_.hidden_size, I = m_.d_inner, C = m_.conv_dim(), NH = m_.num_heads;
    const int64_t GN = static_cast<int64_t>(m_.n_groups) * m_.d_state, PW = I + C + NH;
    const int64_t nd = md.num_decode_rows(), P0 = batch.prefill_token_offset();
    const int np = md.num_prefills;
    const DType wd = opt_.weight_dtype;
    const size_t ab = dtype_size(wd);
    cudaStream_t s = stream_.get();
    float* hidden = hidden_.f32(T * Hd);
    float* out = out_.f32(T * Hd);
    void* normed = normed_.get(T * Hd * ab);
    float* proj = proj_.f32(T * PW);
    float* xbc = xbc_.f32(T * C);
    float* y = y_.f32(T * I);
    void* gated = gated_.get(T * I * ab);

    // 1. hidden += previous mixer output; normed = rms_norm(hidden); proj = in_proj(normed) = [z | xBC | dt].
    SSM_CUDA_CHECK(add_rms_norm_rows(layer == 0 ? nullptr : out, Hd, hidden, Hd, L.norm.as<float>(),
                                     cfg_.layer_norm_epsilon, nullptr, T, Hd, true, normed, wd, Hd, opt_.pdl, s));
    // 2. Causal conv1d + SiLU over xBC: decode-only steps in in_proj's epilogue (same bits), else its own kernels.
    ConvParams conv{C, m_.d_conv, L.conv_weight.as<float>(), L.conv_bias.data() ? L.conv_bias.as<float>() : nullptr,
                    states_.conv_state(layer), true};
    const bool fused = np == 0 && opt_.fused_decode && wd == DType::BF16 && gemm_.takes_skinny(wd, T);
    if (fused) {
      const SkinnyConvEpilogue ce{conv, I, sm.state_indices_d, xbc, C, nullptr, 0};
      SkinnyExtras ex;
      ex.conv = &ce;
      gemm_.run({T, L.in_proj.rows, L.in_proj.cols, normed, Hd, L.in_proj.buf.data(), L.in_proj.cols, wd, proj, PW,
                 DType::F32}, s, nullptr, 0, &ex);
    } else {
      gemm(normed, T, Hd, L.in_proj, proj, PW);
    }
    if (nd > 0 && !fused)
      SSM_CUDA_CHECK(conv1d_update_dual(proj + I, PW, xbc, C, nullptr, 0, conv, sm.state_indices_d, static_cast<int>(nd),
                                        opt_.pdl, s));
    // 3. SSD: x = xBC[:, :I], B, C the next two G*N slices, dt = proj[:, I + C:].
    SsdParams sp;
    sp.num_heads = static_cast<int>(NH), sp.head_dim = m_.head_dim, sp.n_groups = m_.n_groups, sp.d_state = m_.d_state;
    sp.A = L.A.as<float>(), sp.D = L.D.as<float>(), sp.dt_bias = L.dt_bias.as<float>();
    sp.time_step_min = m_.time_step_min_limit, sp.time_step_max = m_.time_step_max_limit;
    sp.ssm_states = states_.ssm_state(layer);
    sp.exact_products = wd != DType::BF16;  // bf16 weights: one TF32 pass is well inside their tolerance
    // bf16 weights: the chunked form on bf16 tensor cores (SSMSERVE_SSD_TF32=1 keeps the TF32 tiles).
    static const bool ssd_tf32 = [] {
      const char* v = std::getenv("SSMSERVE_SSD_TF32");
      return v && v[0] == '1';
    }();
    sp.bf16_products = wd == DType::BF16 && !ssd_tf32;
    auto inputs_from = [&](int64_t r0) {
      return SsdInputs{{xbc + r0 * C, C}, {proj + r0 * PW + I + C, PW}, {xbc + r0 * C + I, C},
                       {xbc + r0 * C + I + GN, C}, {}, {}, {}};
    };
    // Prefill rows: with the bf16 tiles on bf16 copies alone the conv writes only its bf16 output (no fp32 xBC rows,
    // no copies made in the SSD); else fp32 rows.
    SsdInputs prefill_in = inputs_from(P0);
    bool conv_bf16_only = false;
    if (np > 0 && sp.bf16_products && !opt_.batch_invariant) {
      const uint16_t* h = static_cast<const uint16_t*>(xbc_h_.get(T * C * 2)) + P0 * C;  // bf16
      prefill_in.x_h = {h, C}, prefill_in.B_h = {h + I, C}, prefill_in.C_h = {h + I + GN, C};
      conv_bf16_only = ssd_uses_bf16_copies(prefill_in, sp, md.chunk_size);
      if (!conv_bf16_only) prefill_in.x_h = prefill_in.B_h = prefill_in.C_h = {};
    }
    if (np > 0)
      SSM_CUDA_CHECK(causal_conv1d_fwd_dual(proj + P0 * PW + I, PW, conv_bf16_only ? nullptr : xbc + P0 * C, C,
                                            conv_bf16_only ? const_cast<void*>(prefill_in.x_h.data) : nullptr, C, conv,
                                            sm.query_start_loc_p, sm.state_indices_p, sm.has_initial_states_p, np,
                                            T - P0, s));
    // Large decode batches (> 16 rows, outside batch-invariant mode): the state-run kernel; else the one whose
    // math is the sequential prefill walk's.
    if (nd > 16 && !opt_.batch_invariant)
      SSM_CUDA_CHECK(ssd_state_update_wide(inputs_from(0), sp, y, I, sm.state_indices_d, static_cast<int>(nd), s));
    else if (nd > 0)
      SSM_CUDA_CHECK(ssd_state_update(inputs_from(0), sp, y, I, sm.state_indices_d, static_cast<int>(nd), s));
    if (np > 0) {
      SsdChunkMetadataDev cm{np, md.num_chunks(), sm.cu_chunk_seqlen_p, sm.seq_idx_p, sm.last_chunk_indices_p,
                                   sm.state_indices_p, sm.has_initial_states_p, md.chunk_size};
      cm.workspace_bytes = ssd_workspace_bytes(sp, cm.nchunks, cm.chunk_size, &prefill_in);
      cm.workspace = ssd_ws_.get(cm.workspace_bytes);
      if (opt_.batch_invariant) cm.chunk_size = 0;  // the sequential walk (the decode kernel's math): see cuda_mamba.cpp
      SSM_CUDA_CHECK(ssd_chunk_scan_fwd(prefill_in, sp, cm, y + P0 * I, I, nullptr, s));
    }
    // 4. Gated RMSNorm with z (in the GEMM dtype), then out_proj (added to hidden by the next norm).
    SSM_CUDA_CHECK(gated_rms_norm_pdl(y, I, proj, PW, L.gate_norm.as<float>(), cfg_.layer_norm_epsilon, T, I,
                                      I / m_.n_groups, m_.norm_before_gate, gated, wd, I, opt_.pdl, s));
    gemm(gated, T, I, L.out_proj, out, Hd);
    tp_.all_reduce(out, T * Hd);  // out_proj is row-parallel
  }

  ModelConfig cfg_;
  Mamba2Config m_;
  CudaModelOptions opt_;
  LmFrame frame_;
  std::vector<Layer2Dev> layers_;
  Stream stream_;
  GemmHandle gemm_;
  DeviceStateMirror states_;
  StepMetaUploader meta_;
  DecodeGraphs graphs_;
  RunnerTp tp_;
  // Scratch for T tokens: hidden / out [T, Hd] fp32, normed [T, Hd] and gated [T, I] in the GEMM dtype,
  // proj [T, I + C + H], xbc [T, C], y [T, I] fp32.
  Scratch hidden_, out_, normed_, proj_, xbc_, y_, gated_;
  Scratch ssd_ws_;  // the chunked SSD's workspace (prefill steps only)
  Scratch xbc_h_;   // [T, C] bf16: the conv's output for the bf16 SSD tiles (prefill steps with bf16 weights)
};

}  // namespace

std::unique_ptr<CausalLM> load_mamba2_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt, const dist::TpRank& tp) {
  SSM_CHECK(gpu_available(), "--device cuda: no usable CUDA device");
  const Mamba2Config m = Mamba2Config::from_json(cfg);
  SSM_CHECK(m.d_conv >= 1 && m.d_conv <= 8, "config.json: conv_kernel {} outside [1, 8] on cuda", m.d_conv);
  SSM_CHECK(m.d_state <= 256, "config.json: state_size {} > 256 is not supported on cuda", m.d_state);
  SSM_CHECK(!m.use_bias, "{}: use_bias = true (in_proj / out_proj biases) is not supported on cuda yet",
            (cfg.dir / "config.json").string());
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  }
  SSM_CHECK(tp.world == 1 || m.n_groups % tp.world == 0,
            "--tensor-parallel-size {} on cuda: Mamba-2 n_groups {} must be a multiple of it (the replicated group's "
            "norm across ranks runs on the CPU backend only)", tp.world, m.n_groups);
  (void)dist::even_shard(m.num_heads, tp.rank, tp.world, "Mamba-2 num_heads");
  const HostWeights2 w = load_host_weights(cfg, m, src);
  if (tp.world == 1) return std::make_unique<CudaMamba2Model>(cfg, m, w, opt);
  Mamba2Config shard = m;  // this rank's mixer dimensions
  shard.d_inner = m.d_inner / tp.world, shard.num_heads = m.num_heads / tp.world, shard.n_groups = m.n_groups / tp.world;
  return std::make_unique<CudaMamba2Model>(cfg, shard, shard_host_weights(w, m, cfg.vocab_size, tp), opt, tp);
}

}  // namespace ssmserve::cuda
