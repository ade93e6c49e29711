// Owns the lightning-attention mixer on the GPU (the CPU module: model/mixers/lightning_mixer.h): SiLU(qkv_proj x) ->
// decode rows: the one-token state update; prefill rows: the blocked prefill over the step's lightning plan (bf16
// tensor cores with bf16 weights; under SSMSERVE_BATCH_INVARIANT the token walk with the decode update's arithmetic) ->
// RMSNorm over all heads (eps 1e-6) -> sigmoid(output_gate x) gate -> out_proj.
#include <algorithm>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/rms_norm.h"
#include "model/mixers/lightning_mixer.h"
#include "runtime/modules/cuda_modules.h"
#include "runtime/step_plans.h"

namespace ssmserve::cuda {
namespace {

class CudaLightning final : public CudaModule {
 public:
  CudaLightning(const CudaRunnerContext& ctx, LightningConfig c, int64_t hidden, const LightningWeights& w, std::vector<float> slopes)
      : ctx_(ctx), c_(c), H_(hidden) {
    const DType wd = ctx_.opt.weight_dtype;
    qkv_proj_ = upload_weight(w.qkv_proj, wd);
    output_gate_ = upload_weight(w.output_gate, wd);
    out_proj_ = upload_weight(w.out_proj, wd);
    norm_ = to_device(w.norm);
    slopes_ = to_device(slopes);
  }

  ModuleStateSpec state_spec() const override {
    ModuleStateSpec s;
    s.ssm_elems = s.full_state_elems = static_cast<int64_t>(c_.num_heads) * c_.head_dim * c_.head_dim;
    return s;
  }
  /// The state passing kernels write the stores: StepPlans cuts the plan's blocks and ranges at them (no conv).
  bool stores_prefill_states() const override { return true; }
  double scratch_bytes_per_token() const override {
    const double HD = static_cast<double>(c_.num_heads) * c_.head_dim;
    return 4 * 3 * HD + 4 * HD + 4 * HD + 2 * 3 * HD;
  }
  void reserve(int64_t T, const StepPlans* plans) override {
    ScratchPool& p = *ctx_.scratch;
    const int64_t HD = int64_t{c_.num_heads} * c_.head_dim;
    p[0].f32(T * 3 * HD), p[1].f32(T * HD), p[2].f32(T * HD);
    p[3].get(T * std::max<int64_t>(HD * dtype_size(ctx_.opt.weight_dtype), bf16() ? 3 * HD * 2 : 0));
    ws().f32(std::max<size_t>(4, lightning_workspace_floats(plans->lplan.num_blocks, c_.num_heads, c_.head_dim)));
  }

  void forward(const CudaStep& st, const ModuleState& state, const void* normed_c, float* out) override {
    const LinearAttentionMetadata& md = st.batch.linear_meta;
    const StepPlans& plans = *st.plans;
    const int64_t T = st.T, Hd = H_, D = c_.head_dim, HD = c_.num_heads * D, W = 3 * HD;
    const DType wd = ctx_.opt.weight_dtype;
    cudaStream_t s = st.stream;
    ScratchPool& p = *ctx_.scratch;
    float* proj = p[0].f32(T * W);
    float* o = p[1].f32(T * HD);
    // 1. qkv = SiLU(qkv_proj x^): [T, H, 3D].
    ctx_.gemm_run(normed_c, T, Hd, qkv_proj_, proj, W);
    SSM_CUDA_CHECK(silu_inplace(proj, W, T, W, s));
    // 2. Lightning attention on this layer's state in each block.
    LightningDevParams lp{c_.num_heads, c_.head_dim, c_.block_size, slopes_.as<float>(), state.ssm};
    // Decode rows (verify rows of speculative decoding: one state column per token, StepMeta::decode_rows), then
    // the prefill rows from token P0 on.
    const int nd = md.num_decodes;
    const int64_t P0 = st.batch.prefill_token_offset();
    const DeviceDecodeRows rows = st.meta.spec_cols > 1 ? st.meta.decode_rows() : DeviceDecodeRows(plans.dev(plans.lin_idx));
    if (nd > 0) SSM_CUDA_CHECK(lightning_decode(proj, W, o, HD, lp, rows, nd, s));
    if (md.num_prefills > 0) {
      const LightningPlanDev pd = plans.lightning_prefill(nd);
      float* ws = this->ws().f32(lightning_workspace_floats(plans.lplan.num_blocks, c_.num_heads, c_.head_dim));
      if (ctx_.opt.batch_invariant) {  // the token walk with the decode kernel's arithmetic (fp32 q | k | v, as decode)
        SSM_CUDA_CHECK(lightning_prefill_sequential(proj, W, o, HD, lp, pd, s));
      } else if (bf16()) {  // the prefill rows' q | k | v as bf16 (rows keep their absolute index), bf16 tensor-core path
        auto* qkv16 = static_cast<__nv_bfloat16*>(p[3].get(T * W * 2));
        SSM_CUDA_CHECK(cast_rows(proj + P0 * W, W, T - P0, W, qkv16 + P0 * W, DType::BF16, W, s));
        SSM_CUDA_CHECK(lightning_prefill_bf16(qkv16, W, o, HD, lp, pd, ws, s));
      } else {
        SSM_CUDA_CHECK(lightning_prefill(proj, W, o, HD, lp, pd, ws, s));
      }
    }
    // 3. RMSNorm over all heads (eps 1e-6), sigmoid gate from x^, out_proj.
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, HD, o, HD, norm_.as<float>(), 1e-6f, T, HD, o, DType::F32, HD, s));
    float* g = p[2].f32(T * HD);
    ctx_.gemm_run(normed_c, T, Hd, output_gate_, g, HD);
    void* gated = p[3].get(T * HD * dtype_size(wd));
    SSM_CUDA_CHECK(sigmoid_gate(o, HD, g, HD, T, HD, gated, wd, HD, s));
    ctx_.gemm_run(gated, T, HD, out_proj_, out, Hd);
  }

 private:
  bool bf16() const { return ctx_.opt.weight_dtype == DType::BF16; }
  const CudaRunnerContext& ctx_;
  LightningConfig c_;
  int64_t H_;
  DevWeight qkv_proj_, output_gate_, out_proj_;
  DeviceBuffer norm_, slopes_;
  /// The blocked prefill's workspace (its size follows the step's plan), shared by every layer.
  Scratch& ws() const { return (*ctx_.scratch)[ScratchPool::kMixerWorkspace]; }
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_lightning(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const LightningConfig c = LightningConfig::from_json(h.params, h.cfg);
  const std::string where = (h.cfg.dir / "config.json").string();
  SSM_CHECK(h.tp.world == 1, "--device cuda: --tensor-parallel-size {} is not supported for lightning attention yet", h.tp.world);
  SSM_CHECK(c.head_dim == 64 || c.head_dim == 128, "{}: head_dim {} is not supported on cuda (64 or 128)", where, c.head_dim);
  SSM_CHECK(c.block_size <= 1024, "{}: block_size {} > 1024 is not supported on cuda", where, c.block_size);
  const LightningWeights w = read_lightning_weights(h.src, h.prefix, h.cfg.hidden_size, c);
  return std::make_unique<CudaLightning>(a.ctx, c, h.cfg.hidden_size, w, lightning_slopes(c.num_heads, h.layer, h.cfg.num_hidden_layers));
}

}  // namespace ssmserve::cuda
