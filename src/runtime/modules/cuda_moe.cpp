// Owns the sparse MoE FFN on the GPU (the CPU module: model/ffns/moe_ffn.h): the router GEMM in fp32 (so expert
// choices match the CPU's), then kernels/cuda/moe.h (device-side sort by expert, grouped GEMMs over bf16 stacked
// experts, weighted combine; no host synchronization).
#include <cstring>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/moe.h"
#include "model/ffns/moe_ffn.h"
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

class CudaMoe final : public CudaModule {
 public:
  CudaMoe(const CudaRunnerContext& ctx, MoeConfig c, int64_t hidden, const MoeWeights& w) : ctx_(ctx), c_(c), H_(hidden) {
    gate_ = upload_weight(w.gate, DType::F32);
    std::vector<const Weight*> w1, w2, w3;
    for (const cpu::ExpertWeights& x : w.experts) w1.push_back(&x.w1), w2.push_back(&x.w2), w3.push_back(&x.w3);
    w1_ = stack_bf16(w1), w2_ = stack_bf16(w2), w3_ = stack_bf16(w3);
  }

  ModuleInput input() const override { return ModuleInput::F32; }
  double scratch_bytes_per_token() const override {
    return 4.0 * c_.num_experts + static_cast<double>(moe_workspace_bytes(1024, weights())) / 1024;
  }
  void reserve(int64_t T, const StepPlans*) override {
    (*ctx_.scratch)[0].f32(T * c_.num_experts);
    ws_.get(moe_workspace_bytes(T, weights()));
  }
  void pointers(std::vector<const void*>& out) const override { out.push_back(ws_.buf.data()); }

  void forward(const CudaStep& st, const ModuleState&, const void* x, float* out) override {
    const int64_t T = st.T;
    const auto* normed = static_cast<const float*>(x);
    float* router = (*ctx_.scratch)[0].f32(T * c_.num_experts);
    ctx_.gemm_run(normed, T, H_, gate_, router, c_.num_experts);
    SSM_CUDA_CHECK(sparse_moe(normed, H_, T, router, weights(), out, H_, ws_.get(moe_workspace_bytes(T, weights())), st.stream));
  }

 private:
  MoeDevWeights weights() const {
    return {c_.num_experts, c_.top_k, H_, c_.intermediate_size, w1_.data(), w3_.data(), w2_.data()};
  }
  const CudaRunnerContext& ctx_;
  MoeConfig c_;
  int64_t H_;
  DevWeight gate_;
  DeviceBuffer w1_, w2_, w3_;
  Scratch ws_;
};

}  // namespace

std::unique_ptr<CudaModule> make_cuda_moe(const CudaModuleArgs& a) {
  const ModuleArgs& h = a.host;
  const MoeConfig c = MoeConfig::from_json(h.params);
  const std::string where = (h.cfg.dir / "config.json").string();
  SSM_CHECK(h.tp.world == 1, "--device cuda: --tensor-parallel-size {} is not supported for MoE layers yet", h.tp.world);
  SSM_CHECK(c.num_experts <= 256 && c.top_k <= 8, "{}: more than 256 experts or top_k > 8 are not supported on cuda", where);
  SSM_CHECK(h.cfg.hidden_size % 8 == 0 && c.intermediate_size % 8 == 0,
            "{}: hidden_size and intermediate_size must be multiples of 8 on cuda", where);
  return std::make_unique<CudaMoe>(a.ctx, c, h.cfg.hidden_size, read_moe_weights(h.src, h.prefix, h.cfg.hidden_size, c));
}

}  // namespace ssmserve::cuda
