// Owns the sparse MoE FFN on the GPU (the CPU module: model/ffns/moe_ffn.h): the router GEMM in fp32 (so expert
// choices match the CPU's), then kernels/cuda/moe.h (softmax or sigmoid routing, device-side sort by expert, grouped
// GEMMs over the stacked experts, weighted combine; no host synchronization), plus the shared expert (cuda_mlp.cpp),
// added as is or, with shared_expert_gate (Qwen), scaled per token by sigmoid(x . w_g) (activations.h). The experts
// are stacked in the model's weight dtype: bf16 (tensor-core grouped GEMMs, x and the activations rounded to bf16 as
// every bf16 GEMM input) or fp32 (fp32 GEMVs, nothing rounded: an fp32 model's experts compute as the CPU's do, so a
// router near a tie picks the CPU's experts in the layers after). With the runner's second branch (CudaBranch) the
// shared expert runs on it, forked after the router GEMM and joined before its output is added, while the routed
// experts run on the main stream: the same kernels on the same inputs, so the same bits as one stream. The shared
// output is added by the next sublayer's residual norm (CudaModelOptions::moe_shared_add_in_norm: NormAddend; a gated
// add with its gate computed on the branch), by the routed experts' combine kernel (moe_fused_shared_add), or by a
// kernel of its own: the same arithmetic each way.
#include <cstring>
#include <utility>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/rms_norm.h"
#include "model/ffns/moe_ffn.h"
#include "runtime/cuda_branch.h"
#include "runtime/modules/cuda_modules.h"

namespace ssmserve::cuda {
namespace {

/// Stacks E expert matrices [rows, cols] into one bf16 device buffer [E, rows, cols].
DeviceBuffer stack_bf16(const std::vector<const Weight*>& ws) {
  const size_t n = static_cast<size_t>(ws[0]->rows * ws[0]->cols);
  std::vector<uint16_t> h(n * ws.size());
  std::vector<float> f(n);
  for (size_t e = 0; e < ws.size(); ++e) {
    if (ws[e]->dtype == DType::BF16) {
      std::memcpy(h.data() + e * n, ws[e]->data, n * 2);
    } else {
      to_f32(ws[e]->dtype, ws[e]->data, f.data(), n);
      for (size_t i = 0; i < n; ++i) h[e * n + i] = f32_to_bf16(f[i]);
    }
  }
  return to_device(h);
}

/// Stacks E expert matrices [rows, cols] into one fp32 device buffer [E, rows, cols] (bf16 values widened exactly).
DeviceBuffer stack_f32(const std::vector<const Weight*>& ws) {
  const size_t n = static_cast<size_t>(ws[0]->rows * ws[0]->cols);
  std::vector<float> h(n * ws.size());
  for (size_t e = 0; e < ws.size(); ++e) to_f32(ws[e]->dtype, ws[e]->data, h.data() + e * n, n);
  return to_device(h);
}

/// Most tokens of a step whose shared-expert add goes into the combine kernel (the per-pair decode steps' bound).
constexpr int64_t kFusedAddMaxTokens = 16;

class CudaMoe final : public CudaModule {
 public:
  CudaMoe(const CudaRunnerContext& ctx, MoeConfig c, int64_t hidden, const MoeWeights& w, std::unique_ptr<CudaModule> shared)
      : ctx_(ctx), c_(c), H_(hidden), shared_(std::move(shared)) {
    gate_ = upload_weight(w.gate, DType::F32);
    if (!w.correction_bias.empty()) bias_ = to_device(w.correction_bias);
    if (!w.shared_gate.empty()) shared_gate_ = to_device(w.shared_gate);
    std::vector<const Weight*> w1, w2, w3;
    for (const cpu::ExpertWeights& x : w.experts) {
      w1.push_back(&x.w1), w2.push_back(&x.w2);
      if (x.gated()) w3.push_back(&x.w3);
    }
    const auto stack = f32_ ? stack_f32 : stack_bf16;
    w1_ = stack(w1), w2_ = stack(w2);
    if (c_.gated) w3_ = stack(w3);
  }

  ModuleInput input() const override { return ModuleInput::F32; }
  bool wants_input_copy() const override { return shared_ != nullptr; }
  double scratch_bytes_per_token() const override {
    return 4.0 * c_.num_experts + static_cast<double>(moe_workspace_bytes(1024, weights())) / 1024 +
           (shared_ ? 4.0 * (H_ + 1) + dtype_size(ctx_.opt.weight_dtype) * H_ + shared_->scratch_bytes_per_token() : 0.0);
  }
  void reserve(int64_t T, const StepPlans* plans) override {
    slot(ScratchPool::kMoeRouter).f32(T * c_.num_experts);
    slot(ScratchPool::kMoeWorkspace).get(moe_workspace_bytes(T, weights()));
    if (shared_) {
      shared_->reserve(T, plans);
      slot(ScratchPool::kMoeSharedOut).f32(shared_out_floats(T)), slot(ScratchPool::kMoeSharedIn).get(T * H_ * dtype_size(ctx_.opt.weight_dtype));
    }
  }
  void pointers(std::vector<const void*>& out) const override {
    if (shared_) shared_->pointers(out);
  }

  void forward(const CudaStep& st, const ModuleState& state, const void* x, float* out) override {
    const int64_t T = st.T;
    const bool pdl = ctx_.opt.pdl;
    const auto* normed = static_cast<const float*>(x);
    float* router = slot(ScratchPool::kMoeRouter).f32(T * c_.num_experts);
    ctx_.gemm_run(normed, T, H_, gate_, router, c_.num_experts);
    // The shared expert's rows: y = shared_expert(bf16 / fp32 x), on the second branch when the runner has one (the
    // MLP module was built with its context), else on this stream.
    const DType wd = ctx_.opt.weight_dtype;
    float* y = shared_ ? slot(ScratchPool::kMoeSharedOut).f32(shared_out_floats(T)) : nullptr;
    const bool gated = shared_gate_.data() != nullptr;
    // Qwen's gated add left to the next norm (moe_shared_add_in_norm 2, decode-sized steps): the gate's s = sigmoid(x .
    // w_g) computed on the shared expert's branch (sigmoid_gate_rows, off the routed experts' chain), the norm adding
    // fma(s, y, out) (NormAddend::gate): the combine's arithmetic, so its bits; the combine then adds nothing, so the
    // down GEMV and the combine run as one launch (KernelTuning::moe_down_combine).
    const bool gate_in_norm = shared_ && gated && add_to_next_ && T <= kFusedAddMaxTokens && ctx_.opt.moe_shared_add_in_norm >= 2;
    float* gate_s = gate_in_norm ? y + T * H_ : nullptr;  // [T] after the rows
    if (shared_) {
      ProfileSpan span(ctx_.profile, "shared", st.stream);
      CudaStep sst{st.batch, st.meta, st.plans, st.T, st.stream};
      if (ctx_.branch) {
        ctx_.branch->fork(st.stream);
        sst.stream = ctx_.branch->side.get();
      }
      if (gate_in_norm)  // the branch's first kernel when forked: a plain launch after the fork's event wait
        SSM_CUDA_CHECK(sigmoid_gate_rows(normed, H_, shared_gate_.as<float>(), T, H_, gate_s, sst.stream, pdl && !ctx_.branch));
      // Its input in the weight dtype: the norm's copy (the runner wrote it in the norm's launch), else a cast here.
      const void* xc = st.x_copy;
      if (!xc) {
        void* c = slot(ScratchPool::kMoeSharedIn).get(T * H_ * dtype_size(wd));
        SSM_CUDA_CHECK(cast_rows(normed, H_, T, H_, c, wd, H_, sst.stream, pdl && !ctx_.branch));
        xc = c;
      } else {
        sst.forked = ctx_.branch != nullptr;  // its first kernel follows the fork's event wait: a plain launch
      }
      shared_->forward(sst, state, xc, y);
    }
    // Under moe_fused_shared_add (by default the gated adds not left to the next norm, every add at 2) the combine
    // adds y (gated: times sigmoid(x . w_g)), waiting for the branch just before it; else a launch of its own below.
    // Decode-sized steps and steps on the per-token combine (moe_combine_per_token) only: each of the column-slice
    // combine's blocks recomputes the gate's dot over the whole row, which a one-token step does not notice but a
    // prefill chunk would pay ceil(hidden / 256) times over; the per-token combine computes it once per token.
    bool fused = shared_ && !gate_in_norm && (T <= kFusedAddMaxTokens || moe_combine_per_token(T)) &&
                 ctx_.opt.moe_fused_shared_add >= (gated ? 1 : 2);
    // Left to the next norm (moe_shared_add_in_norm, where the runner allows it): plain adds the combine does not take,
    // and gated ones with their gate from the branch (above).
    const bool in_norm = shared_ && add_to_next_ && !fused && (gated ? gate_in_norm : ctx_.opt.moe_shared_add_in_norm >= 1);
    MoeSharedAdd add;
    if (fused) {
      add.y = y, add.y_stride = H_, add.gate = shared_gate_.data() ? shared_gate_.as<float>() : nullptr;
      add.ready = ctx_.branch ? ctx_.branch->done() : nullptr;
    }
    {
      ProfileSpan span(ctx_.profile, "experts", st.stream);
      SSM_CUDA_CHECK(sparse_moe(normed, H_, T, router, weights(), out, H_,
                                slot(ScratchPool::kMoeWorkspace).get(moe_workspace_bytes(T, weights())), st.stream, pdl,
                                fused ? &add : nullptr));
    }
    if (shared_ && !fused) {  // out += y (gated: times sigmoid(x . w_g)), here or by the next norm
      if (ctx_.branch) ctx_.branch->join(st.stream);
      if (in_norm)  // y (and the gate) stay untouched until that norm, the next kernel after the join
        pending_ = {y, H_, gate_s};
      else if (gated)
        SSM_CUDA_CHECK(sigmoid_gated_add(out, H_, y, H_, normed, H_, shared_gate_.as<float>(), T, H_, st.stream, pdl));
      else SSM_CUDA_CHECK(scaled_residual(out, out, 1.0f, y, 1.0f, T * H_, st.stream, pdl));
    }
  }
  void set_add_to_next(bool on) override { add_to_next_ = on; }
  NormAddend take_pending_add() override { return std::exchange(pending_, NormAddend{}); }

 private:
  MoeDevWeights weights() const {
    MoeRouteParams r;
    r.sigmoid = c_.scoring == cpu::MoeRouting::Scoring::Sigmoid;
    r.renormalize = c_.renormalize, r.routed_scaling_factor = c_.routed_scaling_factor;
    r.n_group = r.sigmoid ? c_.n_group : 1, r.topk_group = r.sigmoid ? c_.topk_group : 1;
    r.correction_bias = bias_.data() ? bias_.as<float>() : nullptr;
    return {c_.num_experts, c_.top_k, H_, c_.intermediate_size, w1_.data(), c_.gated ? w3_.data() : nullptr, w2_.data(),
            r, f32_, ctx_.opt.batch_invariant};
  }
  const CudaRunnerContext& ctx_;
  MoeConfig c_;
  int64_t H_;
  bool f32_ = ctx_.opt.weight_dtype != DType::BF16;  ///< fp32 experts (an fp32-weight model), else bf16
  DevWeight gate_;
  DeviceBuffer bias_;  ///< [E] e_score_correction_bias (sigmoid routing), or empty
  DeviceBuffer shared_gate_;  ///< [hidden] fp32 shared_expert_gate.weight (Qwen), or empty
  DeviceBuffer w1_, w2_, w3_;
  /// Floats of the shared expert's output slot for T tokens: its rows [T, H], then (gated) room for their gates [T].
  int64_t shared_out_floats(int64_t T) const { return T * H_ + (shared_gate_.data() ? (T + 3) / 4 * 4 : 0); }
  /// The runner's shared scratch slot `i` (ScratchPool: one workspace for every MoE layer).
  Scratch& slot(int i) const { return (*ctx_.scratch)[i]; }
  std::unique_ptr<CudaModule> shared_;  ///< the shared expert (a GPU dense MLP), or null
  bool add_to_next_ = false;       ///< the shared add may be left to the next norm (set_add_to_next)
  NormAddend pending_;             ///< this step's shared rows left to the next norm (take_pending_add)
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_moe(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const MoeConfig c = MoeConfig::from_json(h.params);
  const std::string where = (h.cfg.dir / "config.json").string();
  SSM_CHECK(h.tp.world == 1, "--device cuda: --tensor-parallel-size {} is not supported for MoE layers yet", h.tp.world);
  SSM_CHECK(c.num_experts <= 512 && c.top_k <= 16, "{}: more than 512 experts or top_k > 16 are not supported on cuda", where);
  SSM_CHECK(h.cfg.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0,
            "{}: hidden_size and intermediate_size must be multiples of 8 on cuda", where);
  SSM_CHECK(c.scoring != cpu::MoeRouting::Scoring::Sigmoid || c.n_group <= 32, "{}: more than 32 expert groups are not supported on cuda",
            where);
  std::unique_ptr<CudaModule> shared;
  if (c.shared_intermediate_size > 0) {  // on the runner's second branch when it has one
    const nlohmann::json sp = shared_mlp_params(c);
    const ModuleArgs sh{h.cfg, sp, h.src, h.prefix + c.shared_prefix, h.layer, h.tp, h.label};
    shared = make_cuda_mlp({sh, a.ctx.branch ? a.ctx.branch->ctx : a.ctx});
  }
  return std::make_unique<CudaMoe>(a.ctx, c, h.cfg.hidden_size, read_moe_weights(h.src, h.prefix, h.cfg.hidden_size, c),
                                   std::move(shared));
}

}  // namespace ssmserve::cuda
