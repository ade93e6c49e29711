// Owns the GPU decoder runner (see cuda_decoder.h): loading, the state layout, the per-step checks and plans, and
// the sublayer step (norm with the pending residual add, module, residual rule), and a parallel mixer pair's input
// projections stacked into one GEMM, its second mixer on the second branch and its two residual updates in one launch
// (Falcon-H1).
#include "runtime/cuda_decoder.h"
#include "runtime/layer_profile.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "device/cuda_check.h"
#include "device/device.h"
#include "dist/shard.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/rms_norm.h"
#include "model/checkpoint.h"
#include "model/decoder/decoder_shape.h"
#include "model/lm_common.h"
#include "model/parallel_layers.h"
#include "model/weight_source.h"
#include "runtime/cuda_branch.h"
#include "runtime/cuda_module.h"
#include "runtime/device_state.h"
#include "runtime/step_plans.h"

namespace ssmserve::cuda {
namespace {

struct CudaSublayer {
  SublayerSpec spec;
  DeviceBuffer norm;  ///< [hidden] fp32
  std::unique_ptr<CudaModule> module;
  /// The first of a parallel mixer pair whose input projections run as one GEMM (stack_parallel_projections): the
  /// stacked weight [pair rows, hidden] (its output row stride is pair rows); empty otherwise.
  DevWeight pair_proj;
  /// This module's first column in the pair's GEMM output (then the runner calls forward_projected), or -1.
  int64_t proj_col = -1;
  /// The first of a parallel pair whose residual updates run as one launch after the second (both non-plain, neither
  /// from the normed rows: Falcon-H1): its output goes to ScratchPool::kParallelOut instead of the runner's out.
  bool defer_residual = false;
  /// Its scaled residual (not plain, not from the normed rows, not paired) applied by the next sublayer's residual
  /// norm, or by the LM head's after the last, instead of a launch of its own (CudaModelOptions::fuse_scaled_residual).
  bool residual_to_next = false;
  /// Whether the next norm adds this sublayer's output: its plain residual, or its scaled one (residual_to_next).
  bool out_pending() const { return spec.plain_residual() || residual_to_next; }
  /// The module was built on the runner's pair context (a parallel mixer: a candidate for parallel_mixer_branch).
  bool on_pair_ctx = false;
  /// The parallel mixer of a stacked pair that runs on the second branch (CudaModelOptions::parallel_mixer_branch):
  /// the pair's first sublayer enqueues it there after the stacked GEMM; this sublayer joins before its residual rule.
  bool on_branch = false;
  /// The first of a pair whose output goes to ScratchPool::kParallelOut instead of the runner's out: defer_residual,
  /// or its sibling on the branch (which writes out meanwhile).
  bool parallel_out = false;
  /// This step's rows the module left to the next norm (CudaModule::take_pending_add), or none.
  NormAddend pending_add;
};

class CudaDecoderLM final : public DecoderShape<CudaCausalLM> {
 public:
  CudaDecoderLM(ModelConfig cfg, DecoderSpec spec, CudaModelOptions opt, const dist::TpRank& tp)
      : DecoderShape(std::move(cfg), std::move(spec)) {
    tp_.tp = tp;
    // TP ranks capture their decode steps in CUDA graphs too: the collectives are recorded on this stream, every
    // rank sees the same batches (so the same capture decisions), and a captured step runs the same collectives in
    // the same order as an eager one.
    if (tp_.on()) tp.comm->set_stream(stream_.get());
    ctx_.opt = opt;
    ctx_.gemm = &gemm_, ctx_.tp = &tp_, ctx_.scratch = &pool_, ctx_.stream = stream_.get();
    configure_gemm(gemm_, opt);
    set_kernel_tuning(opt.kernels);
    frame_.pdl = opt.pdl;
    graphs_.set_profile_replay(opt.profile_replay);
    if (opt.layer_profile) {
      ctx_.opt.cuda_graphs = false;  // the spans' events need eager launches
      profile_ = std::make_unique<LayerProfile>();
      ctx_.profile = profile_.get();
    }
    SSM_CUDA_CHECK(cudaGetDevice(&device_));
  }

  void copy_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    if (copies.empty()) return;
    SSM_CUDA_CHECK(cudaSetDevice(device_));
    states_.sync_layout(cache);
    states_.copy_blocks(copies, stream_.get());
  }

  bool allocate_host_state_tier(int num_slots, const StateCache& cache) override {
    SSM_CUDA_CHECK(cudaSetDevice(device_));
    states_.sync_layout(cache);
    states_.allocate_host_tier(num_slots);
    return states_.num_host_slots() > 0;
  }
  void swap_out_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    if (copies.empty()) return;
    SSM_CUDA_CHECK(cudaSetDevice(device_));
    states_.sync_layout(cache);
    states_.swap_out(copies, stream_.get());
  }
  void swap_in_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) override {
    if (copies.empty()) return;
    SSM_CUDA_CHECK(cudaSetDevice(device_));
    states_.sync_layout(cache);
    states_.swap_in(copies, stream_.get());
  }

  void load(WeightSource& src);
  /// For each mixer followed by a parallel mixer (Falcon-H1: Mamba-2, then attention, both on the mixer's normed
  /// rows in the GEMM dtype), when both have an input projection (CudaModule::input_projection) of the same width
  /// and dtype: stacks the two weights (the first's rows, then the second's, each from a multiple of 16 rows) into
  /// the first sublayer's pair_proj and frees the modules' copies. One GEMM launch less per such layer; the pair's
  /// output columns are the same dot products (the skinny kernel's K split follows the stacked row count, so the
  /// bits may differ from two GEMMs within bf16 rounding; batch-invariant as before: N and K are fixed).
  void stack_parallel_projections();

  /// "all"-mode prefix caching on the GPU: when every module of the stack writes the state stores (CudaModule).
  bool stores_prefill_states() const override {
    return std::all_of(subs_.begin(), subs_.end(),
                       [](const CudaSublayer& s) { return !s.module || s.module->stores_prefill_states(); });
  }

  std::optional<double> device_state_budget(double util, int64_t max_tokens, int64_t max_seqs) const override {
    const double H = cfg_.hidden_size, V = cfg_.vocab_size, ab = dtype_size(ctx_.opt.weight_dtype);
    // Per pool (the main one, pair_pool_ of the modules on the second branch: both live at once): the largest module's
    // slots per token and its context workspace (the mixer workspace is shared by the layers).
    double modules[2] = {0, 0}, context[2] = {0, 0};
    for (const CudaSublayer& s : subs_) {
      const int k = s.on_branch ? 1 : 0;
      modules[k] = std::max(modules[k], s.module->scratch_bytes_per_token() + 4.0 * static_cast<double>(s.pair_proj.rows) +
                                            (s.parallel_out ? 4.0 * H : 0.0));
      context[k] = std::max(context[k], s.module->context_workspace_bytes());
    }
    const double per_token = 12 * H + ab * H + modules[0] + modules[1];  // hidden, out, normed (fp32 and GEMM dtype), the slots
    return state_budget_bytes(util, per_token * static_cast<double>(max_tokens) + static_cast<double>(max_seqs) * (4 * V + ab * H) +
                                        context[0] + context[1]);
  }

 private:
  void step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top, std::vector<GreedyPick>* picks,
            const DeviceSampleBatch* sample) override;
  void reserve(int64_t T, int64_t nlog);
  void sublayer(size_t i, const ForwardBatch& batch, const StepMeta& dm, int64_t T);

  CudaRunnerContext ctx_;
  /// The second stream (CudaModelOptions::moe_shared_branch or parallel_mixer_branch), or null.
  std::unique_ptr<CudaBranch> branch_;
  /// The context of the parallel mixers that may run on the branch (CudaSublayer::on_pair_ctx): load() builds them on
  /// it as a copy of ctx_ and, once every one of them is stacked with its deferred sibling, points it at the branch
  /// (its stream, GEMM handle and PDL) with pair_pool_ as its scratch. Declared before subs_: the modules refer to it.
  CudaRunnerContext pair_ctx_;
  /// The scratch of the modules on the branch: no slot or workspace shared with the main stream's pool_.
  ScratchPool pair_pool_;
  LmFrame frame_;
  std::vector<CudaSublayer> subs_;
  CudaStackDecodeFn stack_decode_ = nullptr;
  std::vector<CudaModule*> stack_mods_;     // its arguments: every sublayer's module and pre-norm weight
  std::vector<const float*> stack_norms_;
  Stream stream_;
  GemmHandle gemm_;
  DeviceStateMirror states_;
  int device_ = 0;  // this runner's GPU
  StepMetaUploader meta_;
  DecodeGraphs graphs_;
  RunnerTp tp_;
  ScratchPool pool_;
  StepPlans plans_;
  std::vector<ModuleState> views_;  // per sublayer, this step's state views (device mirror)
  bool stack_took_ = false;         // the stack decode path ran this step's layers
  std::unique_ptr<LayerProfile> profile_;  // SSMSERVE_LAYER_PROFILE=1, else null
  // Scratch for T tokens: hidden / out [T, H] fp32 (residual stream, last module output), normed_c [T, H] in the GEMM
  // dtype, normed_f [T, H] fp32 (sublayers reading fp32 or with MiniMax's residual from the normed input).
  Scratch hidden_, out_, normed_c_, normed_f_;
};

void CudaDecoderLM::load(WeightSource& src) {
  const DType wd = ctx_.opt.weight_dtype;
  const dist::TpRank& tp = tp_.tp;
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  Weight emb = src.matrix(spec_.embedding, {V, H}, DummyInit::uniform(0.1f));
  frame_.embedding = upload_weight(emb, wd);  // replicated on every rank (a row lookup: no collective)
  const bool tied = spec_.tie_word_embeddings && !src.has(spec_.lm_head);
  frame_.tied = tied && !tp_.on();
  if (!frame_.tied) {
    const Weight head = tied ? emb : src.matrix(spec_.lm_head, {V, H}, DummyInit::uniform(0.1f));
    frame_.lm_head = upload_weight(dist::slice_rows(head, {dist::vocab_shard(V, tp.rank, tp.world)}), wd);
  }
  // The second branch, for the MoE layers' shared experts (not under the layer profile, whose spans time one stream).
  const bool has_moe = std::any_of(spec_.layers.begin(), spec_.layers.end(), [](const LayerSpec& ls) {
    for (const SublayerSpec* s : ls.sublayers())
      if (s->kind == "moe") return true;
    return false;
  });
  // And for the parallel mixers of stacked pairs (Falcon-H1's attention; parallel_mixer_branch): not under tensor
  // parallelism (the main stream's collectives) nor without the stacked GEMM (the branch forks after it).
  const CudaModelOptions& o = ctx_.opt;
  const bool moe_branch = has_moe && o.moe_shared_branch && !ctx_.profile;
  const bool pair_branch = o.parallel_mixer_branch && o.fuse_parallel_projections && !ctx_.profile && !tp_.on();
  auto pair_candidate = [&](const LayerSpec& ls, const SublayerSpec& s) {
    return pair_branch && &s == &ls.parallel_mixer && s.present() && s.parallel && ls.mixer.present() && !ls.mixer.parallel;
  };
  const bool any_pair = std::any_of(spec_.layers.begin(), spec_.layers.end(),
                                    [&](const LayerSpec& ls) { return pair_candidate(ls, ls.parallel_mixer); });
  if (moe_branch || any_pair) branch_ = std::make_unique<CudaBranch>(ctx_);
  if (moe_branch) ctx_.branch = branch_.get();
  pair_ctx_ = ctx_;  // until every candidate is known to be stacked (below)
  // Sublayers in parallel (each thread on this runner's GPU); host copies live only while a module uploads them.
  int device = 0;
  SSM_CUDA_CHECK(cudaGetDevice(&device));
  const int L = cfg_.num_hidden_layers;
  std::vector<std::array<CudaSublayer, 3>> layers(static_cast<size_t>(L));
  for_each_layer_parallel(L, [&](int64_t l) {
    SSM_CUDA_CHECK(cudaSetDevice(device));
    const LayerSpec& ls = spec_.layers[static_cast<size_t>(l)];
    int k = 0;
    for (const SublayerSpec* s : ls.sublayers()) {
      CudaSublayer& sub = layers[static_cast<size_t>(l)][k++];
      sub.spec = *s;
      if (!s->present()) continue;
      if (!s->parallel) sub.norm = to_device(read_decoder_norm(src, spec_, s->norm, H));
      const ModuleArgs host{cfg_, spec_.params(s->kind, cfg_), src, s->prefix, static_cast<int>(l), tp, spec_.label};
      sub.on_pair_ctx = pair_candidate(ls, *s);
      sub.module = cuda_module_type(s->kind).make({host, sub.on_pair_ctx ? pair_ctx_ : ctx_});
    }
  });
  for (auto& pair : layers)
    for (CudaSublayer& s : pair)
      if (s.module) subs_.push_back(std::move(s));
  // logits / logits_scaling (Granite): folded into the final norm's weight, which feeds only the LM head.
  std::vector<float> norm_f = read_decoder_norm(src, spec_, spec_.final_norm, H);
  if (spec_.logits_scaling != 1.0f)
    for (float& w : norm_f) w /= spec_.logits_scaling;
  frame_.norm_f = to_device(norm_f);
  std::vector<ModuleStateSpec> specs;
  std::vector<std::string> kinds;
  StepPlanShape ps;
  for (const CudaSublayer& s : subs_) {
    specs.push_back(s.module->state_spec()), kinds.push_back(s.spec.kind);
    if (s.spec.kind == "lightning" && !ps.linear) {
      const nlohmann::json& j = spec_.params("lightning", cfg_);
      ps.linear = true;
      ps.linear_block_size = j.value("block_size", 256);
      ps.linear_heads = j.value("num_attention_heads", 1);
    }
    if (s.spec.kind == "attention" && !ps.attention) {
      const nlohmann::json& j = spec_.params("attention", cfg_);
      const int heads = j.value("num_attention_heads", 1);
      ps.attention = true;
      ps.attention_group = heads / std::max(1, j.value("num_key_value_heads", heads));
      // Batch-invariant mode: every query on the fp32 split-KV pass with fixed 512-key splits (the tensor-core pass
      // rounds to bf16, so a prompt token's bits would depend on how many tokens its step gave the row).
      ps.attention_tc = wd == DType::BF16 && !ctx_.opt.batch_invariant;
      ps.attention_fixed_split = ctx_.opt.batch_invariant;
    }
  }
  set_layout(specs, kinds, tp.world);
  ps.kv_block_size = layout_.kv_block_size();
  plans_.shape = ps;
  // The whole-stack decode path: every sublayer the same mixer kind, pre-norm residuals, no FFN.
  const std::string& kind = subs_.empty() ? std::string() : subs_[0].spec.kind;
  bool uniform = !subs_.empty() && static_cast<int>(subs_.size()) == L;
  for (const CudaSublayer& s : subs_) uniform = uniform && s.spec.kind == kind && s.spec.plain_residual();
  if (uniform) stack_decode_ = cuda_module_type(kind).stack_decode;
  for (const CudaSublayer& s : subs_) stack_mods_.push_back(s.module.get()), stack_norms_.push_back(s.norm.as<float>());
  if (ctx_.opt.fuse_parallel_projections) stack_parallel_projections();
  // A parallel pair's two residual updates in one launch (scaled_residual2: the same arithmetic as two).
  for (size_t i = 0; i + 1 < subs_.size(); ++i) {
    const SublayerSpec &a = subs_[i].spec, &b = subs_[i + 1].spec;
    subs_[i].defer_residual = !a.parallel && b.parallel && !a.plain_residual() && !b.plain_residual() && !a.residual_is_normed &&
                              !b.residual_is_normed;
  }
  // The candidates' modules on the branch when every one was stacked with its sibling (else all stay on the main
  // stream: pair_ctx_ remains ctx_'s copy).
  bool all_stacked = any_pair;
  for (size_t i = 0; i < subs_.size(); ++i)
    if (subs_[i].on_pair_ctx) all_stacked = all_stacked && i > 0 && subs_[i].proj_col >= 0 && subs_[i - 1].proj_col >= 0;
  if (all_stacked) {
    pair_ctx_ = branch_->ctx;  // the branch's stream, GEMM handle and PDL rule
    pair_ctx_.scratch = &pair_pool_;
    for (CudaSublayer& s : subs_) s.on_branch = s.on_pair_ctx;
  }
  for (size_t i = 0; i < subs_.size(); ++i)
    subs_[i].parallel_out = subs_[i].defer_residual || (i + 1 < subs_.size() && subs_[i + 1].on_branch);
  // Scaled residuals taken over by the next residual norm (a parallel sublayer after it runs no norm of its own).
  for (size_t i = 0; ctx_.opt.fuse_scaled_residual && i < subs_.size(); ++i) {
    CudaSublayer& a = subs_[i];
    const bool paired = a.defer_residual || (a.spec.parallel && i > 0 && subs_[i - 1].defer_residual);
    const bool next_parallel = i + 1 < subs_.size() && subs_[i + 1].spec.parallel;
    a.residual_to_next = !a.spec.plain_residual() && !a.spec.residual_is_normed && !paired && !next_parallel;
  }
  // Rows a module may leave to the next residual norm: where that norm adds this sublayer's output from `out`.
  for (size_t i = 0; i + 1 < subs_.size(); ++i) {
    CudaSublayer& a = subs_[i];
    const bool to_norm = a.out_pending() && !a.parallel_out && !a.defer_residual && !a.on_branch && !subs_[i + 1].spec.parallel;
    a.module->set_add_to_next(ctx_.opt.moe_shared_add_in_norm > 0 && to_norm);
  }
}

void CudaDecoderLM::stack_parallel_projections() {
  for (size_t i = 0; i + 1 < subs_.size(); ++i) {
    CudaSublayer &a = subs_[i], &b = subs_[i + 1];
    if (a.spec.parallel || !b.spec.parallel) continue;
    if (a.module->input() != ModuleInput::GemmDtype || b.module->input() != ModuleInput::GemmDtype) continue;
    const DevWeight *wa = a.module->input_projection(), *wb = b.module->input_projection();
    if (!wa || !wb || wa->cols != wb->cols || wa->dtype != wb->dtype) continue;
    std::vector<int64_t> cols;
    a.pair_proj = stack_device_rows({wa, wb}, 16, &cols);  // 64-byte aligned fp32 column ranges
    a.proj_col = cols[0], b.proj_col = cols[1];
    a.module->drop_input_projection(), b.module->drop_input_projection();
  }
}

void CudaDecoderLM::reserve(int64_t T, int64_t nlog) {
  const int64_t H = cfg_.hidden_size;
  hidden_.f32(T * H), out_.f32(T * H), normed_c_.get(T * H * dtype_size(ctx_.opt.weight_dtype)), normed_f_.f32(T * H);
  for (CudaSublayer& s : subs_) {
    s.module->reserve(T, &plans_);
    if (s.pair_proj.rows > 0) pool_[ScratchPool::kParallelProj].f32(T * s.pair_proj.rows);
    if (s.parallel_out) pool_[ScratchPool::kParallelOut].f32(T * H);
  }
  frame_.reserve(T, H, cfg_.vocab_size, nlog);
}

void CudaDecoderLM::step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top, std::vector<GreedyPick>* picks,
                         const DeviceSampleBatch* sample) {
  check_metadata(batch, cache);
  cudaStream_t s = stream_.get();
  if (profile_) profile_->begin_step(batch.meta.num_prefills == 0 ? "decode" : "prefill", s);
  if (batch.num_tokens() > 0 && (has_linear_ || layout_.has_attention())) {  // the lightning / attention plans, uploaded once
    // (a step with speculative verify rows takes the general attention plan: rows of several query tokens)
    const bool decode_only = batch.linear_meta.num_prefills == 0 && batch.meta.num_prefills == 0 && batch.meta.spec_cols == 1;
    plans_.build(batch, decode_only);
    plans_.upload(s);
  }
  StepFrameArgs a;
  a.arch = spec_.label.c_str(), a.num_layers = static_cast<int>(subs_.size()), a.hidden_size = cfg_.hidden_size;
  a.num_state_layers = layout_.num_state_layers();
  a.vocab_size = cfg_.vocab_size, a.eps = spec_.norm_eps, a.cuda_graphs = ctx_.opt.cuda_graphs;
  a.num_steps = num_steps_, a.frame = &frame_, a.meta = &meta_, a.graphs = &graphs_, a.states = &states_, a.tp = &tp_, a.gemm = &gemm_;
  a.hidden = &hidden_, a.out = &out_;
  a.scratch = {&hidden_, &out_, &normed_c_, &normed_f_};
  a.pointers = [&](std::vector<const void*>& out) {
    pool_.pointers(out);
    pair_pool_.pointers(out);
    for (const CudaSublayer& sub : subs_) sub.module->pointers(out);
    out.push_back(plans_.device_buffer());
  };
  a.key_extra = layout_.has_attention() ? static_cast<uint64_t>(batch.attn_meta.max_num_blocks_per_seq) : 0;
  a.capture_verify = !layout_.has_attention();  // the attention plan of a verify step follows its rows' lengths
  a.last_out_pending = subs_.empty() || subs_.back().out_pending();
  if (!subs_.empty() && subs_.back().residual_to_next) a.last_out_alpha = subs_.back().spec.alpha, a.last_out_beta = subs_.back().spec.beta;
  a.reserve = [&](int64_t T, int64_t nlog) {
    reserve(T, nlog);
    views_.clear();  // the mirror's layout is synced by now (run_step syncs it before reserving)
    for (size_t i = 0; i < subs_.size(); ++i)
      views_.push_back(layout_.views(i, cache.num_blocks(), [&](int l) { return states_.conv_state(l); },
                                     [&](int l) { return states_.ssm_state(l); }));
  };
  a.mixer = [&](int i, const StepMeta& dm, int64_t T) { sublayer(static_cast<size_t>(i), batch, dm, T); };
  run_step(a, batch, cache, s, logits, greedy_top, picks, sample);
  if (profile_) profile_->end_step(s);
}

void CudaDecoderLM::sublayer(size_t i, const ForwardBatch& batch, const StepMeta& dm, int64_t T) {
  CudaSublayer& S = subs_[i];
  const int64_t H = cfg_.hidden_size;
  const CudaModelOptions& opt = ctx_.opt;
  const DType wd = opt.weight_dtype;
  cudaStream_t s = stream_.get();
  float* hidden = hidden_.f32(T * H);
  float* out = out_.f32(T * H);
  const CudaStep st{batch, dm, &plans_, T, s};
  if (i == 0) {
    if (spec_.embedding_multiplier != 1.0f)
      SSM_CUDA_CHECK(scaled_residual(hidden, hidden, spec_.embedding_multiplier, hidden, 0.0f, T * H, s, opt.pdl));
    stack_took_ = false;
    if (stack_decode_ && batch.meta.num_prefills == 0)
      stack_took_ = stack_decode_(stack_mods_, stack_norms_, spec_.norm_eps, st, views_, hidden, out);
  }
  if (stack_took_) return;  // the whole stack ran at sublayer 0
  if (profile_) profile_->begin("norm", s);
  // 1. The sublayer's norm, adding the previous module's output first when its residual is still pending. A parallel
  //    mixer (Falcon-H1) reads the normed input of the mixer before it instead, once that mixer's output is added.
  //    The previous sublayer's scaled residual, when left to this norm, with its scales (residual_step's arithmetic).
  //    A pair's first module wrote kParallelOut when this (its sibling) ran on the branch (parallel_out): its plain
  //    residual is added here on the main stream, before the join.
  const CudaSublayer* before = i > 0 ? &subs_[i - 1] : nullptr;
  const float* prev = before && before->out_pending() ? (before->parallel_out ? pool_[ScratchPool::kParallelOut].f32(T * H) : out)
                                                      : nullptr;
  const float ra = prev && before->residual_to_next ? before->spec.alpha : 1.0f;
  const float xb = prev && before->residual_to_next ? before->spec.beta : 1.0f;
  const NormAddend prev_add = prev ? before->pending_add : NormAddend{};  // rows the previous module left to this norm
  const bool f32_in = S.module->input() == ModuleInput::F32;
  void* normed_c = normed_c_.get(T * H * dtype_size(wd));
  float* normed_f = normed_f_.f32(T * H);
  bool copy_c = false;  // the module reads normed_c too (CudaStep::x_copy)
  if (S.spec.parallel) {
    SSM_CHECK(!prev_add.rows, "{}: sublayer {} left rows to a parallel sublayer's norm", spec_.label, i - 1);
    if (prev) SSM_CUDA_CHECK(scaled_residual(hidden, hidden, ra, prev, xb, T * H, s, opt.pdl));
  } else {
    // The fp32 form when this module or a parallel one after it reads fp32, or the residual rule needs it.
    const CudaSublayer* next = i + 1 < subs_.size() && subs_[i + 1].spec.parallel ? &subs_[i + 1] : nullptr;
    const bool next_f32 = next && next->module->input() == ModuleInput::F32;
    const bool need_f32 = f32_in || S.spec.residual_is_normed || next_f32;
    // An fp32-input module's copy in the weight dtype only from the norm's own launch (else the module casts).
    copy_c = f32_in && S.module->wants_input_copy() && opt.fuse_casts && opt.moe_input_copy && wd == DType::BF16;
    const bool need_c = !f32_in || (next && !next_f32) || copy_c;
    if (!need_f32) {
      SSM_CUDA_CHECK(add_rms_norm_rows(prev, H, hidden, H, S.norm.as<float>(), spec_.norm_eps, nullptr, T, H, true, normed_c,
                                       wd, H, opt.pdl, s, ra, xb, nullptr, 0, prev_add));
    } else {
      // The bf16 copy in the same launch (fuse_casts) or by a cast after it: the same bits.
      const bool dual = need_c && opt.fuse_casts && wd == DType::BF16;
      SSM_CUDA_CHECK(add_rms_norm_rows(prev, H, hidden, H, S.norm.as<float>(), spec_.norm_eps, nullptr, T, H, true, normed_f,
                                       DType::F32, H, opt.pdl, s, ra, xb, dual ? normed_c : nullptr, H, prev_add));
      if (need_c && !dual) SSM_CUDA_CHECK(cast_rows(normed_f, H, T, H, normed_c, wd, H, s, opt.pdl));
    }
  }
  // 2. The module; 3. its residual rule (the plain one is left to the next norm or the LM head's).
  if (profile_) profile_->end(s), profile_->begin(S.spec.kind, s);
  float* mod_out = S.parallel_out ? pool_[ScratchPool::kParallelOut].f32(T * H) : out;
  if (S.on_branch) {
    // Enqueued on the second branch by the pair's first sublayer (below); joined before this sublayer's residual rule.
    branch_->join(s);
  } else if (S.proj_col >= 0) {  // a parallel pair's stacked input projections: one GEMM at the pair's first sublayer
    const DevWeight& pw = S.spec.parallel ? subs_[i - 1].pair_proj : S.pair_proj;
    float* proj = pool_[ScratchPool::kParallelProj].f32(T * pw.rows);
    if (!S.spec.parallel) ctx_.gemm_run(normed_c, T, H, pw, proj, pw.rows);
    // parallel_mixer_branch: the sibling on the second branch, forked after the GEMM, with its own scratch (pair_pool_)
    // and its output in `out` (this module writes kParallelOut, and nothing on the main stream reads or writes `out`
    // before the join); it reads (and rewrites in place) its columns of the GEMM output, which the main stream reads
    // only in its own columns and does not write again before the join; it reads neither hidden nor the normed rows.
    if (i + 1 < subs_.size() && subs_[i + 1].on_branch) {
      const CudaSublayer& B = subs_[i + 1];
      branch_->fork(s);
      CudaStep bst{batch, dm, &plans_, T, branch_->side.get()};
      bst.forked = true;
      B.module->forward_projected(bst, views_[i + 1], proj + B.proj_col, pw.rows, out);
    }
    S.module->forward_projected(st, views_[i], proj + S.proj_col, pw.rows, mod_out);
  } else {
    CudaStep mst = st;
    if (copy_c) mst.x_copy = normed_c;
    S.module->forward(mst, views_[i], f32_in ? static_cast<const void*>(normed_f) : normed_c, mod_out);
  }
  S.pending_add = S.module->take_pending_add();
  if (profile_) profile_->end(s);
  if (S.defer_residual) return;  // added with the parallel sibling's output below
  if (S.spec.parallel && subs_[i - 1].defer_residual) {
    const SublayerSpec& f = subs_[i - 1].spec;
    SSM_CUDA_CHECK(scaled_residual2(hidden, f.alpha, pool_[ScratchPool::kParallelOut].f32(T * H), f.beta, S.spec.alpha, out,
                                    S.spec.beta, T * H, s, opt.pdl));
  } else if (!S.spec.plain_residual() && !S.residual_to_next) {
    SSM_CUDA_CHECK(scaled_residual(hidden, S.spec.residual_is_normed ? normed_f : hidden, S.spec.alpha, mod_out, S.spec.beta,
                                   T * H, s, opt.pdl));
  }
}

}  // namespace

std::unique_ptr<CausalLM> load_cuda_decoder(const ModelConfig& cfg, const DecoderSpec& spec, LoadFormat format, CudaModelOptions opt,
                                            const dist::TpRank& tp) {
  SSM_CHECK(gpu_available(), "--device cuda: no usable CUDA device");
  SSM_CHECK(opt.weight_dtype == DType::BF16 || opt.weight_dtype == DType::F32, "cuda weight dtype must be BF16 or F32");
  SSM_CHECK(tp.world == 1 || tp.comm, "{}: tensor-parallel size {} needs a communicator", spec.label, tp.world);
  check_spec(cfg, spec, [](const std::string& kind) { (void)cuda_module_type(kind); });
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::open(cfg, format == LoadFormat::Dummy, &ckpt);
  auto model = std::make_unique<CudaDecoderLM>(cfg, spec, opt, tp);
  model->load(src);
  for (const std::string& p : spec.ignored_tensor_prefixes) src.ignore_prefix(p);
  if (tp.rank == 0) src.warn_unused_tensors();
  return model;
}

}  // namespace ssmserve::cuda
