// Owns the dense MLP FFN on the GPU (the CPU module: model/ffns/mlp_ffn.h): one GEMM for gate and up (stacked rows),
// the SiLU-gated or relu^2 activation into the down projection's input dtype, the down GEMM. Also the MoE's shared
// expert (cuda_moe.cpp).
#include <cstring>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/skinny_gemm.h"
#include "model/ffns/mlp_ffn.h"
#include "runtime/modules/cuda_modules.h"

namespace ssmserve::cuda {
namespace {

/// Stacks gate over up ([I, hidden] each) into [2I, hidden] in the dtype of the first, alternating groups of `group`
/// rows: group I stacks the whole gate over the whole up; group 8 (I % 8 == 0) puts gate rows 8i .. 8i + 7 at rows
/// 16i .. 16i + 7 and the same up rows after them (the layout of the skinny GEMM's activation epilogue, skinny_gemm.h
/// SkinnyAct::kSiluGatedInterleaved8).
Weight stack_gate_up(const Weight& a, const Weight& b, int64_t group) {
  SSM_CHECK(a.cols == b.cols && a.dtype == b.dtype && a.rows == b.rows && group > 0 && a.rows % group == 0,
            "mlp: gate and up must have the same shape and dtype");
  Weight out = Weight::allocate(a.dtype, a.rows + b.rows, a.cols);
  const size_t bytes = static_cast<size_t>(group * a.cols) * dtype_size(a.dtype);
  const auto* pa = static_cast<const unsigned char*>(a.data);
  const auto* pb = static_cast<const unsigned char*>(b.data);
  for (int64_t i = 0; i < a.rows / group; ++i) {
    std::memcpy(out.owned->data() + 2 * i * bytes, pa + i * bytes, bytes);
    std::memcpy(out.owned->data() + (2 * i + 1) * bytes, pb + i * bytes, bytes);
  }
  return out;
}

class CudaMlp final : public CudaModule {
 public:
  CudaMlp(const CudaRunnerContext& ctx, const MlpConfig& c, int64_t hidden, const MlpWeights& w)
      : ctx_(ctx), gated_(c.gated), H_(hidden), I_(c.intermediate_size) {
    const DType wd = ctx_.opt.weight_dtype;
    // Scaled rows (Falcon-H1's gate multiplier) are F32 while up may be BF16: stacked in F32 when the dtypes differ.
    // Under mlp_act_epilogue the rows are interleaved by 8 (decode steps on the skinny GEMM then apply the
    // activation in its epilogue; the others run mlp_activation on the interleaved columns).
    interleaved_ = gated_ && ctx_.opt.mlp_act_epilogue && I_ % 8 == 0;
    act_epilogue_ = ctx_.opt.mlp_act_epilogue && (!gated_ || interleaved_);
    if (gated_) {
      const bool same = w.gate_proj.dtype == w.up_proj.dtype;
      const Weight& g = same ? w.gate_proj : as_f32(w.gate_proj);
      const Weight& u = same ? w.up_proj : as_f32(w.up_proj);
      gate_up_ = upload_weight(stack_gate_up(g, u, interleaved_ ? 8 : I_), wd);
    } else {
      gate_up_ = upload_weight(w.up_proj, wd);
    }
    down_ = upload_weight(w.down_proj, wd);
  }

  double scratch_bytes_per_token() const override { return 4.0 * 2 * I_ + dtype_size(ctx_.opt.weight_dtype) * I_; }
  void reserve(int64_t T, const StepPlans*) override {
    ScratchPool& p = *ctx_.scratch;
    p[0].f32(T * 2 * I_), p[3].get(T * I_ * dtype_size(ctx_.opt.weight_dtype));
  }

  void forward(const CudaStep& st, const ModuleState&, const void* normed_c, float* out) override {
    const int64_t T = st.T, GW = gated_ ? 2 * I_ : I_;
    const DType wd = ctx_.opt.weight_dtype;
    ScratchPool& p = *ctx_.scratch;
    float* gu = p[0].f32(T * 2 * I_);
    void* act = p[3].get(T * I_ * dtype_size(wd));
    // After the fork's event wait (st.forked) the first GEMM is a plain launch; the handle's PDL setting after it.
    struct PlainFirst {
      GemmHandle* g;
      bool was;
      ~PlainFirst() { g->set_pdl(was); }
    } plain_first{ctx_.gemm, ctx_.gemm->pdl()};
    if (st.forked) ctx_.gemm->set_pdl(false);
    if (act_epilogue_ && ctx_.gemm->takes_skinny(gate_up_.dtype, T)) {
      // The activation in the gate / up GEMM's epilogue: the same sums and expression as the two launches below.
      ProfileSpan span(ctx_.profile, "gemm", st.stream);
      SkinnyExtras ex;
      ex.act = {interleaved_ ? SkinnyAct::kSiluGatedInterleaved8 : SkinnyAct::kRelu2, act, I_, wd};
      ctx_.gemm->run({T, GW, H_, normed_c, H_, gate_up_.buf.data(), H_, gate_up_.dtype, gu, GW, DType::F32}, st.stream,
                     nullptr, 0, &ex);
    } else {
      ctx_.gemm_run(normed_c, T, H_, gate_up_, gu, GW);
      SSM_CUDA_CHECK(mlp_activation(gu, GW, T, I_, gated_, act, wd, I_, st.stream, ctx_.opt.pdl, interleaved_));
    }
    ctx_.gemm->set_pdl(plain_first.was);
    ctx_.gemm_run(act, T, I_, down_, out, H_);
  }

 private:
  static Weight as_f32(const Weight& x) {
    Weight out = Weight::allocate(DType::F32, x.rows, x.cols);
    auto* d = reinterpret_cast<float*>(out.owned->data());
    for (int64_t r = 0; r < x.rows; ++r) x.row_to_f32(r, d + r * x.cols);
    return out;
  }
  const CudaRunnerContext& ctx_;
  bool gated_;
  bool interleaved_ = false;   ///< gate / up rows interleaved by 8 (mlp_act_epilogue)
  bool act_epilogue_ = false;  ///< skinny-kernel steps apply the activation in the gate / up GEMM's epilogue
  int64_t H_, I_;
  DevWeight gate_up_, down_;
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_mlp(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const MlpConfig c = MlpConfig::from_json(h.params);
  SSM_CHECK(h.tp.world == 1, "--device cuda: --tensor-parallel-size {} is not supported for dense MLP layers yet", h.tp.world);
  SSM_CHECK(!c.bias, "{}: mlp_bias true is not supported on cuda yet", (h.cfg.dir / "config.json").string());
  return std::make_unique<CudaMlp>(a.ctx, c, h.cfg.hidden_size, read_mlp_weights(h.src, h.prefix, h.cfg.hidden_size, c));
}

}  // namespace ssmserve::cuda
