// GPU op tests of the gated delta rule's two-pass prefill (kernels/cuda/gated_delta.h, gated_delta_prefill_two_pass):
// its first pass per key head against per value head, bit for bit, and the walks' unaligned q / k copies. The
// two-pass form against the CPU is in test_cuda_gated_delta_ops.cpp (check_prefill). Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "device/cuda_check.h"
#include "gated_delta_test_util.h"

namespace ssmserve {
namespace {
using namespace gdntest;

// The first pass per key head (KernelTuning::gdn_wy_grouped, gated_delta_prefill_wy_group.cu) computes the per-value-
// head pass's values operand for operand: the whole workspace (chunk offsets, every slot's W, U, P and decays), the
// outputs and the final states are the same bits with it on and off, in both precisions, for 1, 2 and 4 value heads
// per key head, Dv below Dk, and the shapes it does not take (Dv 160: both runs the per-value-head pass).
TEST(CudaGatedDelta, TwoPassGroupedWyEqualsPerHead) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Step st = quick() ? Step({1, 65, 130, 3}, {5, 0, 70, 0}, 3)
                          : Step({1, 63, 64, 65, 700, 130, 9, 200}, {0, 5, 64, 0, 37, 128, 0, 3}, 6);
  std::vector<GdnShape> shapes = {{"tiny-qwen3_5", 4, 8, 32, 32}, {"gqa1-d64", 2, 2, 64, 64}, {"qwen3.5-9b", 16, 32, 128, 128}};
  if (!quick()) shapes.push_back({"gqa4-dv96", 2, 8, 128, 96}), shapes.push_back({"gqa2-dk64-dv160", 3, 6, 64, 160});
  for (const auto& sh : shapes) {
    for (const auto prec : {cuda::GatedDeltaPrecision::kTf32, cuda::GatedDeltaPrecision::kFp32}) {
      SCOPED_TRACE(testing::Message() << sh.name << (prec == cuda::GatedDeltaPrecision::kTf32 ? " TF32" : " 3xTF32"));
      const uint32_t layer_seed = rng();
      Tokens tk(sh, st.T(), rng);
      const int64_t os = int64_t{sh.Hv} * sh.Dv;
      std::vector<float> outs[2], wss[2], states[2];
      for (int grouped = 0; grouped < 2; ++grouped) {
        std::mt19937 lr(layer_seed);
        GdnLayer L(sh, DType::F32, st.n() + 1, lr);
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.gdn_wy_grouped = grouped == 1;
        const TuningScope tune(t);
        DeviceBuffer dq = to_device(st.qsl), dn = to_device(st.nc), di = to_device(st.idx);
        DeviceBuffer dout = poisoned(std::max<int64_t>(1, st.T() * os));
        const size_t wsf = std::max<size_t>(4, cuda::gated_delta_prefill_workspace_floats(st.T(), st.n(), L.dev()));
        DeviceBuffer ws = poisoned(wsf);
        SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(tk.dev(), L.dev(), dout.as<float>(), os, dq.as<int32_t>(),
                                                          dn.as<int32_t>(), di.as<int32_t>(), st.n(), st.T(),
                                                          ws.as<float>(), nullptr, prec));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        outs[grouped] = to_host<float>(dout, st.T() * os);
        wss[grouped] = to_host<float>(ws, wsf);
        std::vector<float> pool(L.pool.host.size() / sizeof(float));
        L.pool.dev.download(pool.data(), L.pool.host.size());
        states[grouped] = std::move(pool);
      }
      const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same_bits(wss[0], wss[1])) << "workspace (chunk slots) differs";
      EXPECT_TRUE(same_bits(outs[0], outs[1])) << "outputs differ";
      EXPECT_TRUE(same_bits(states[0], states[1])) << "final states differ";
    }
  }
}

// The shared-memory walk copies q / k rows with 16-byte cp.async only when they are 16-byte aligned; odd row strides
// at a base one float past an aligned one take its 4-byte copies (every walk of KernelTuning::gdn_walk).
TEST(CudaGatedDelta, TwoPassUnalignedQueriesAndKeys) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const GdnShape sh = quick() ? GdnShape{"tiny-qwen3_5", 4, 8, 32, 32} : GdnShape{"qwen3.5-9b", 16, 32, 128, 128};
  const Step st({70, 130, 1, 64}, {5, 0, 64, 0}, -1);
  for (const Algo algo : {Algo::kTwoPass, Algo::kTwoPassW64, Algo::kTwoPassOld}) {
    SCOPED_TRACE(algo_name(algo));
    GdnLayer L(sh, DType::F32, st.n() + 1, rng);
    Tokens tk(sh, st.T(), rng);
    const int64_t qs = tk.qs + 1, ks = tk.ks + 1, os = int64_t{sh.Hv} * sh.Dv, W = os;
    std::vector<float> q(1 + st.T() * qs, 0.0f), k(1 + st.T() * ks, 0.0f);
    for (int64_t t = 0; t < st.T(); ++t) {
      std::copy_n(tk.q.data() + t * tk.qs, tk.qs, q.data() + 1 + t * qs);
      std::copy_n(tk.k.data() + t * tk.ks, tk.ks, k.data() + 1 + t * ks);
    }
    DeviceBuffer dq = to_device(q), dk = to_device(k);
    cuda::GatedDeltaInputs in = tk.dev();
    in.q = dq.as<float>() + 1, in.q_stride = qs, in.k = dk.as<float>() + 1, in.k_stride = ks;
    std::vector<float> ref(st.T() * os, 0.0f);
    cpu::gated_delta_prefill(tk.host(), L.host(), ref.data(), os, st.qsl, st.nc, st.idx);
    DeviceBuffer dqsl = to_device(st.qsl), dn = to_device(st.nc), di = to_device(st.idx);
    DeviceBuffer dout = poisoned(st.T() * os);
    DeviceBuffer ws = poisoned(std::max<size_t>(4, cuda::gated_delta_prefill_workspace_floats(st.T(), st.n(), L.dev())));
    {
      const ScopedGdnWalk walk(algo == Algo::kTwoPass ? 2 : algo == Algo::kTwoPassW64 ? 1 : 0);
      SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(in, L.dev(), dout.as<float>(), os, dqsl.as<int32_t>(),
                                                        dn.as<int32_t>(), di.as<int32_t>(), st.n(), st.T(),
                                                        ws.as<float>(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
    }
    const auto got = to_host<float>(dout, st.T() * os);
    for (int s = 0; s < st.n(); ++s) {
      const int64_t t0 = st.qsl[s], len = st.qsl[s + 1] - t0;
      EXPECT_LT(rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, len, W), 2e-5) << "out of sequence " << s;
    }
    EXPECT_LT(L.pool.rel_err_blocks(st.idx), 2e-5) << "final states";
  }
}

}  // namespace
}  // namespace ssmserve
