// The shared expert's rows added inside sparse_moe's combine kernel (kernels/cuda/moe.h MoeSharedAdd) against the
// separate launch after it (activations.h: scaled_residual for the plain add, sigmoid_gated_add for Qwen's gated
// one), bit for bit: on the per-pair rows of a decode step, the sorted per-pair rows, the grouped GEMMs of a prefill
// chunk and the fp32 experts; with the gate's x given and defaulted; with the wait on a second stream's event.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/moe.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct SharedAddCase {
  int64_t T;   // tokens: 1 (unsorted per-pair), 12 (sorted per-pair), 96 (grouped GEMMs)
  bool gated;  // Qwen's sigmoid(x . w_g) gate, else the plain add
  bool f32;    // fp32 experts
  bool own_x;  // MoeSharedAdd::x given (a copy of x at another stride), else sparse_moe's x
};

TEST(CudaMoeSharedAdd, FusedAddEqualsSeparateLaunchBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int E = 16, k = 2;  // sorted per-pair rows: 16 < T k <= 2 E
  const int64_t Hd = 328, I = 96, xs = Hd + 4, os = Hd + 8, ys = Hd + 12;  // Hd: 2 column slices, the last partial
  const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
  auto weights = [&](bool f32) {
    std::vector<DeviceBuffer> b;
    for (auto [n, a] : {std::pair{E * I * Hd, hs}, std::pair{E * I * Hd, hs}, std::pair{E * Hd * I, is}}) {
      const auto v = rand_vec(rng, n, -a, a);
      b.push_back(f32 ? to_device(v) : to_device(to_bf16_bits(v)));
    }
    return b;
  };
  const std::vector<DeviceBuffer> wb = weights(false), wf = weights(true);
  cudaStream_t main = nullptr, side = nullptr;
  cudaEvent_t ready = nullptr;
  SSM_CUDA_CHECK(cudaStreamCreate(&main));
  SSM_CUDA_CHECK(cudaStreamCreate(&side));
  SSM_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  std::vector<SharedAddCase> cases;
  for (int64_t T : {1, 12, 96})
    for (bool gated : {false, true})
      for (bool f32 : {false, true})
        for (bool own_x : {false, true}) cases.push_back({T, gated, f32, own_x});
  for (const SharedAddCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "T " << c.T << (c.gated ? " gated" : " plain") << (c.f32 ? " fp32" : " bf16")
                                    << (c.own_x ? " own x" : ""));
    const std::vector<DeviceBuffer>& w3 = c.f32 ? wf : wb;
    cuda::MoeDevWeights w{E, k, Hd, I, w3[0].data(), w3[1].data(), w3[2].data(), cuda::MoeRouteParams{}};
    w.f32 = c.f32;
    const int64_t T = c.T;
    const auto xh = rand_vec(rng, T * xs, -2.0f, 2.0f);
    DeviceBuffer x = to_device(xh), logits = to_device(rand_vec(rng, T * E, -3.0f, 3.0f)),
                 y = to_device(rand_vec(rng, T * ys, -1.0f, 1.0f)), gate = to_device(rand_vec(rng, Hd, -hs, hs));
    // own_x: the same rows at stride xs + 4.
    std::vector<float> x2h(T * (xs + 4), 0.0f);
    for (int64_t t = 0; t < T; ++t) std::memcpy(&x2h[t * (xs + 4)], &xh[t * xs], Hd * sizeof(float));
    DeviceBuffer x2 = to_device(x2h), ws(cuda::moe_workspace_bytes(T, w));
    // Separate: the combine, then the add on its own.
    DeviceBuffer sep = poisoned(T * os);
    SSM_CUDA_CHECK(cuda::sparse_moe(x.as<float>(), xs, T, logits.as<float>(), w, sep.as<float>(), os, ws.data(), main, true));
    if (c.gated)
      SSM_CUDA_CHECK(cuda::sigmoid_gated_add(sep.as<float>(), os, y.as<float>(), ys, x.as<float>(), xs, gate.as<float>(),
                                             T, Hd, main, true));
    else
      for (int64_t t = 0; t < T; ++t)
        SSM_CUDA_CHECK(cuda::scaled_residual(sep.as<float>() + t * os, sep.as<float>() + t * os, 1.0f,
                                             y.as<float>() + t * ys, 1.0f, Hd, main, true));
    // Fused: y produced on the side stream (a copy after a wait), the combine waiting for its event.
    DeviceBuffer fused = poisoned(T * os), y_side(T * ys * sizeof(float));
    SSM_CUDA_CHECK(cudaMemcpyAsync(y_side.data(), y.data(), T * ys * sizeof(float), cudaMemcpyDeviceToDevice, side));
    SSM_CUDA_CHECK(cudaEventRecord(ready, side));
    cuda::MoeSharedAdd add;
    add.y = y_side.as<float>(), add.y_stride = ys, add.gate = c.gated ? gate.as<float>() : nullptr, add.ready = ready;
    if (c.own_x) add.x = x2.as<float>(), add.x_stride = xs + 4;
    SSM_CUDA_CHECK(cuda::sparse_moe(x.as<float>(), xs, T, logits.as<float>(), w, fused.as<float>(), os, ws.data(), main,
                                    true, &add));
    SSM_CUDA_CHECK(cudaStreamSynchronize(main));
    const auto a = to_host<float>(sep, T * os), b = to_host<float>(fused, T * os);
    for (int64_t t = 0; t < T; ++t)
      ASSERT_EQ(std::memcmp(&a[t * os], &b[t * os], Hd * sizeof(float)), 0) << "token " << t << " differs";
  }
  // Bad arguments: no rows, or a row stride below hidden.
  cuda::MoeDevWeights w{E, k, Hd, I, wb[0].data(), wb[1].data(), wb[2].data(), cuda::MoeRouteParams{}};
  DeviceBuffer x(xs * 4), lg(E * 4), o(os * 4), ws(cuda::moe_workspace_bytes(1, w));
  cuda::MoeSharedAdd none;
  EXPECT_EQ(cuda::sparse_moe(x.as<float>(), xs, 1, lg.as<float>(), w, o.as<float>(), os, ws.data(), main, false, &none),
            cudaErrorInvalidValue);
  cuda::MoeSharedAdd narrow;
  narrow.y = o.as<float>(), narrow.y_stride = Hd - 1;
  EXPECT_EQ(cuda::sparse_moe(x.as<float>(), xs, 1, lg.as<float>(), w, o.as<float>(), os, ws.data(), main, false, &narrow),
            cudaErrorInvalidValue);
  SSM_CUDA_CHECK(cudaEventDestroy(ready));
  SSM_CUDA_CHECK(cudaStreamDestroy(side));
  SSM_CUDA_CHECK(cudaStreamDestroy(main));
}

}  // namespace
}  // namespace ssmserve
