// Owns the softmax-attention mixer on the GPU (the CPU module: model/mixers/attention_mixer.h): the q / k / v (and output
// gate) projections as one GEMM over their stacked weights (one launch instead of 3-4: at batch 1 these skinny GEMMs
// are launch-bound), then one launch for the per-head q / k RMSNorms, RoPE and the K / V writes into the KV blocks of
// the shared pool (qk_norm_rope_cache), split-KV paged attention over the step's work list, the sigmoid output gate
// fused with the cast to the GEMM dtype (activations.h), o_proj.
#include <cmath>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/paged_attention.h"
#include "model/mixers/attention_mixer.h"
#include "runtime/modules/cuda_modules.h"
#include "runtime/step_plans.h"

namespace ssmserve::cuda {
namespace {

class CudaAttention final : public CudaModule {
 public:
  CudaAttention(const CudaRunnerContext& ctx, AttentionConfig c, int64_t hidden, const AttentionWeights& w) : ctx_(ctx), c_(c), H_(hidden) {
    const DType wd = ctx_.opt.weight_dtype;
    // [q | k | v | gate] rows, each converted as its own upload would (the muP-scaled fp32 rows of Falcon-H1 included).
    std::vector<const Weight*> parts = {&w.q_proj, &w.k_proj, &w.v_proj};
    if (c_.attn_output_gate) parts.push_back(&w.gate);
    qkvg_proj_ = upload_stacked(parts, wd);
    SSM_CHECK(qkvg_proj_.rows == proj_width(), "attention: stacked q / k / v / gate rows {} != {}", qkvg_proj_.rows, proj_width());
    o_proj_ = upload_weight(w.o_proj, wd);
    if (c_.qk_norm) q_norm_ = to_device(w.q_norm), k_norm_ = to_device(w.k_norm);
    if (c_.rope) inv_freq_ = to_device(cpu::rope_inv_freq(c_.rope_theta, c_.rotary_dim));
  }

  ModuleStateSpec state_spec() const override {
    ModuleStateSpec s;
    s.kv_token_bytes = s.full_kv_token_bytes = 2 * static_cast<int64_t>(c_.num_kv_heads) * c_.head_dim * 4;
    return s;
  }
  double scratch_bytes_per_token() const override {
    const double QW = static_cast<double>(c_.num_heads) * c_.head_dim;
    return 4.0 * static_cast<double>(proj_width()) + 4 * QW + dtype_size(ctx_.opt.weight_dtype) * QW;
  }
  void reserve(int64_t T, const StepPlans* plans) override {
    ScratchPool& p = *ctx_.scratch;
    const int64_t QW = int64_t{c_.num_heads} * c_.head_dim;
    if (qkvg_proj_.rows > 0) p[0].f32(T * proj_width());  // forward's projection (not after drop_input_projection)
    p[1].f32(T * QW), p[3].get(T * QW * dtype_size(ctx_.opt.weight_dtype));
    ws().f32(std::max<size_t>(4, workspace_floats(plans->aplan)));
  }

  /// The tensor-core pass (bf16 weights, not batch-invariant: StepPlanShape::attention_tc) splits long contexts'
  /// chunks over at most kTcSplitMaxItems partial slots and stages up to kTcStageMaxBytes of keys.
  double context_workspace_bytes() const override {
    if (ctx_.opt.weight_dtype != DType::BF16 || ctx_.opt.batch_invariant) return 0.0;
    const double slots = 4.0 * kTcSplitMaxItems * c_.num_kv_heads * kTcRows * (c_.head_dim + 2);
    return slots + (ctx_.opt.attn_tc_stage ? static_cast<double>(kTcStageMaxBytes) : 0.0);
  }

  const DevWeight* input_projection() const override { return &qkvg_proj_; }
  void drop_input_projection() override { qkvg_proj_ = {}; }

  void forward(const CudaStep& st, const ModuleState& state, const void* normed_c, float* out) override {
    const int64_t T = st.T, PW = proj_width();
    float* proj = (*ctx_.scratch)[0].f32(T * PW);
    ctx_.gemm_run(normed_c, T, H_, qkvg_proj_, proj, PW);  // the projections: one GEMM
    forward_projected(st, state, proj, PW, out);
  }

  /// proj [T, proj_width()] (row stride PW) = [q (QW) | k (KW) | v (KW) | g (QW, attn_output_gate)] per token; q and
  /// k are normed / rotated in place.
  void forward_projected(const CudaStep& st, const ModuleState& state, float* proj, int64_t PW, float* out) override {
    const PagedAttentionMetadata& md = st.batch.attn_meta;
    const StepPlans& plans = *st.plans;
    const PagedAttentionPlan& ap = plans.aplan;
    const int D = c_.head_dim;
    const int64_t T = st.T, Hd = H_, QW = int64_t{c_.num_heads} * D, KW = int64_t{c_.num_kv_heads} * D;
    const DType wd = ctx_.opt.weight_dtype;
    cudaStream_t s = st.stream;
    ScratchPool& p = *ctx_.scratch;
    float* q = proj;  // every part has row stride PW
    float* g = q + QW + 2 * KW;
    float* o = p[1].f32(T * QW);
    // 1. The per-head q / k norms, RoPE, the new K / V into their slots: one launch (q, k, v adjacent in a row);
    //    plain after a fork (the runner's second branch: CudaModelOptions::parallel_mixer_branch).
    KvCacheView kv = state.kv;
    kv.num_kv_heads = c_.num_kv_heads, kv.head_dim = D;
    SSM_CUDA_CHECK(qk_norm_rope_cache(q, PW, T, c_.num_heads, c_.qk_norm ? q_norm_.as<float>() : nullptr,
                                      c_.qk_norm ? k_norm_.as<float>() : nullptr, c_.qk_norm_eps,
                                      c_.rope ? plans.dev(plans.positions) : nullptr, c_.rope ? inv_freq_.as<float>() : nullptr,
                                      c_.rotary_dim / 2, plans.dev(plans.slots), kv, s, ctx_.opt.pdl && !st.forked));
    // 2. Attention over the cache.
    PagedAttentionArgs a{c_.num_heads, c_.scale, md.max_num_blocks_per_seq, plans.dev(plans.attn_qsl), plans.dev(plans.seq_lens),
                         plans.dev(plans.tables), plans.dev(plans.tasks), plans.dev(plans.items), ap.num_tasks, ap.num_items,
                         ap.tokens_per_task, ap.key_split, plans.dev(plans.tc_tiles), ap.num_tc_tiles, ap.tc_tokens,
                         plans.dev(plans.tc_items), ap.num_tc_items, ap.num_single_tasks, ap.fixed_split};
    if (tc_stage_floats(ap, c_.num_kv_heads, D, ctx_.opt.attn_tc_stage) > 0) {
      a.tc_row_key_base = plans.dev(plans.tc_row_key_base), a.tc_stage_rows = plans.dev(plans.tc_stage_rows);
      a.num_tc_stage_rows = ap.num_tc_stage_rows, a.tc_stage_max_keys = ap.tc_stage_max_keys;
      a.tc_stage_keys = ap.tc_stage_keys, a.num_tc_slots = ap.num_tc_slots, a.tc_wgmma = ctx_.opt.attn_tc_wgmma;
    }
    // o_proj's input: the bf16 copy written by the split-KV combine (fuse_casts, steps without tensor-core tiles),
    // else the output gate (o * sigmoid(g)) fused with the cast to the GEMM dtype, or the cast.
    void* oc = p[3].get(T * QW * dtype_size(wd));
    const bool combine_casts = !c_.attn_output_gate && ctx_.opt.fuse_casts && wd == DType::BF16 && ap.num_tc_tiles == 0;
    if (combine_casts) a.out_bf16 = oc, a.out_bf16_stride = QW;
    {
      ProfileSpan span(ctx_.profile, "paged_attention", s);
      SSM_CUDA_CHECK(paged_attention(q, PW, o, QW, kv, a, ws().f32(workspace_floats(ap)), s, ctx_.opt.pdl));
    }
    if (c_.attn_output_gate) SSM_CUDA_CHECK(sigmoid_gate(o, QW, g, PW, T, QW, oc, wd, QW, s, ctx_.opt.pdl));
    else if (!combine_casts) SSM_CUDA_CHECK(cast_rows(o, QW, T, QW, oc, wd, QW, s, ctx_.opt.pdl));
    ctx_.gemm_run(oc, T, QW, o_proj_, out, Hd);
  }

 private:
  /// The attention call's workspace: the split-KV and tensor-core partials, then the staged bf16 keys (if any).
  size_t workspace_floats(const PagedAttentionPlan& ap) const {
    return paged_attention_workspace_floats(ap, c_.num_kv_heads, c_.head_dim) +
           tc_stage_floats(ap, c_.num_kv_heads, c_.head_dim, ctx_.opt.attn_tc_stage);
  }
  /// Columns of the fused projection per token (scratch slot 0): q, k, v (and the gate).
  int64_t proj_width() const {
    return int64_t{c_.head_dim} * (int64_t{c_.num_heads} * (c_.attn_output_gate ? 2 : 1) + 2 * int64_t{c_.num_kv_heads});
  }
  const CudaRunnerContext& ctx_;
  AttentionConfig c_;
  int64_t H_;
  /// [proj_width(), hidden]: q_proj [H D] | k_proj [K D] | v_proj [K D] | gate [H D] (attn_output_gate) rows.
  DevWeight qkvg_proj_;
  DevWeight o_proj_;               ///< [hidden, H D]
  DeviceBuffer q_norm_, k_norm_;   ///< [D] effective weights (qk_norm), or empty
  DeviceBuffer inv_freq_;
  /// The attention splits' workspace (its size follows the step's work list), shared by every layer.
  Scratch& ws() const { return (*ctx_.scratch)[ScratchPool::kMixerWorkspace]; }
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_attention(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const AttentionConfig c = AttentionConfig::from_json(h.params, h.cfg);
  const std::string where = (h.cfg.dir / "config.json").string();
  SSM_CHECK(h.tp.world == 1, "--device cuda: --tensor-parallel-size {} is not supported for softmax attention yet", h.tp.world);
  SSM_CHECK(paged_attention_head_dim_ok(c.head_dim), "{}: head_dim {} is not supported on cuda (64, 128 or 256)", where, c.head_dim);
  SSM_CHECK(c.num_heads / c.num_kv_heads <= 16, "{}: more than 16 query heads per KV head are not supported on cuda", where);
  return std::make_unique<CudaAttention>(a.ctx, c, h.cfg.hidden_size, read_attention_weights(h.src, h.prefix, h.cfg.hidden_size, c));
}

}  // namespace ssmserve::cuda
