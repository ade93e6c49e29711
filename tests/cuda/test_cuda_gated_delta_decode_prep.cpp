// GPU gated delta decode with its own input preparation (GatedDeltaDecodePrep, kernels/cuda/gated_delta.h): raw q / k
// normalized and g / beta computed inside the decode kernel, against gated_delta_prepare followed by
// gated_delta_decode, bit for bit (outputs and states), for the test shapes (Dk 32 / 64 / 128, GQA 1..4, Dv not a
// multiple of 64, and Dk 256), batches on both column slicings and in batch-invariant mode, fp32 and bf16 states,
// padding rows, three tokens in a row, speculative verify rows. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "gated_delta_test_util.h"
#include "kernels/cuda/gated_delta.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using namespace gdntest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

TEST(CudaGatedDelta, DecodePrepEqualsPrepareThenDecodeBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<GdnShape> shapes = gdn_shapes();
  shapes.push_back({"dk256", 2, 4, 256, 64});  // the 512-thread block (Dk 256, 32-column slices)
  for (const auto& sh : shapes)
    for (DType sd : {DType::F32, DType::BF16})
      for (int B : {1, 7, 64})
        for (bool bi : {false, true}) {
          SCOPED_TRACE(testing::Message() << sh.name << " state " << dtype_name(sd) << " batch " << B << " bi " << bi);
          std::mt19937 r1 = rng, r2 = rng;  // two identical state pools
          GdnLayer L1(sh, sd, B + 1, r1), L2(sh, sd, B + 1, r2);
          rng.discard(7);
          std::vector<int32_t> idx(B);
          std::iota(idx.begin(), idx.end(), 1);
          if (B > 2) idx[2] = 0;  // a padding row
          DeviceBuffer didx = to_device(idx);
          const int64_t qk = int64_t{sh.Hk} * sh.Dk, qs = qk + 4, vs = int64_t{sh.Hv} * sh.Dv + 4, abs = sh.Hv + 3;
          const int64_t os = int64_t{sh.Hv} * sh.Dv + 4;
          auto A_log = rand_vec(rng, sh.Hv, -3.0f, 2.0f), dt_bias = rand_vec(rng, sh.Hv, -1.0f, 1.0f);
          DeviceBuffer dA = to_device(A_log), ddt = to_device(dt_bias);
          for (int step = 0; step < 3; ++step) {
            auto q = rand_vec(rng, B * qs, -2.0f, 2.0f), k = rand_vec(rng, B * qs, -2.0f, 2.0f);
            auto v = rand_vec(rng, B * vs), a = rand_vec(rng, B * abs, -10.0f, 25.0f), b = rand_vec(rng, B * abs, -6.0f, 6.0f);
            DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), da = to_device(a), db = to_device(b);
            // Separate: prepare into new rows, then decode.
            DeviceBuffer qn(B * qs * 4), kn(B * qs * 4), g(B * sh.Hv * 4), beta(B * sh.Hv * 4);
            cuda::GatedDeltaPrepareArgs pa{dq.as<float>(), qs, dk.as<float>(), qs, da.as<float>(), abs, db.as<float>(), abs,
                                           dA.as<float>(), ddt.as<float>(), qn.as<float>(), qs, kn.as<float>(), qs,
                                           g.as<float>(), sh.Hv, beta.as<float>(), sh.Hv};
            SSM_CUDA_CHECK(cuda::gated_delta_prepare(pa, B, sh.Hk, sh.Hv, sh.Dk, nullptr, true));
            DeviceBuffer o1 = poisoned(B * os), o2 = poisoned(B * os);
            const cuda::GatedDeltaInputs in1{qn.as<float>(), qs, kn.as<float>(), qs, dv.as<float>(), vs, g.as<float>(), sh.Hv,
                                             beta.as<float>(), sh.Hv};
            SSM_CUDA_CHECK(cuda::gated_delta_decode(in1, L1.dev(), o1.as<float>(), os, didx.as<int32_t>(), B, nullptr, bi, true));
            // Fused: the raw rows and the preparation's inputs.
            const cuda::GatedDeltaInputs in2{dq.as<float>(), qs, dk.as<float>(), qs, dv.as<float>(), vs, nullptr, 0, nullptr, 0};
            const cuda::GatedDeltaDecodePrep prep{da.as<float>(), abs, db.as<float>(), abs, dA.as<float>(), ddt.as<float>()};
            SSM_CUDA_CHECK(
                cuda::gated_delta_decode(in2, L2.dev(), o2.as<float>(), os, didx.as<int32_t>(), B, nullptr, bi, true, &prep));
            SSM_CUDA_CHECK(cudaDeviceSynchronize());
            ASSERT_EQ(to_host<uint8_t>(o1, B * os * 4), to_host<uint8_t>(o2, B * os * 4)) << "outputs, token " << step;
            ASSERT_EQ(to_host<uint8_t>(L1.pool.dev, L1.pool.dev.bytes()), to_host<uint8_t>(L2.pool.dev, L2.pool.dev.bytes()))
                << "states, token " << step;
          }
        }
  // Speculative verify rows (3, 1 and 2 tokens; token j reads column j - 1's state and writes column j's): the
  // fused preparation per token inside one launch.
  for (const auto& sh : shapes) {
    SCOPED_TRACE(testing::Message() << sh.name << " verify rows");
    const int rows = 3, cols = 3;
    const std::vector<int32_t> qsl = {0, 3, 4, 6};
    const int64_t T = qsl.back();
    std::vector<int32_t> idx(rows * cols);
    std::iota(idx.begin(), idx.end(), 1);
    std::mt19937 r1 = rng, r2 = rng;
    GdnLayer L1(sh, DType::F32, rows * cols + 1, r1), L2(sh, DType::F32, rows * cols + 1, r2);
    rng.discard(7);
    const int64_t qs = int64_t{sh.Hk} * sh.Dk, vs = int64_t{sh.Hv} * sh.Dv, abs = sh.Hv, os = vs;
    auto q = rand_vec(rng, T * qs, -2.0f, 2.0f), k = rand_vec(rng, T * qs, -2.0f, 2.0f), v = rand_vec(rng, T * vs);
    auto a = rand_vec(rng, T * abs, -10.0f, 25.0f), b = rand_vec(rng, T * abs, -6.0f, 6.0f);
    auto A_log = rand_vec(rng, sh.Hv, -3.0f, 2.0f), dt_bias = rand_vec(rng, sh.Hv, -1.0f, 1.0f);
    DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), da = to_device(a), db = to_device(b);
    DeviceBuffer dA = to_device(A_log), ddt = to_device(dt_bias), didx = to_device(idx), dqsl = to_device(qsl);
    DeviceBuffer qn(T * qs * 4), kn(T * qs * 4), g(T * sh.Hv * 4), beta(T * sh.Hv * 4), o1 = poisoned(T * os), o2 = poisoned(T * os);
    cuda::GatedDeltaPrepareArgs pa{dq.as<float>(), qs, dk.as<float>(), qs, da.as<float>(), abs, db.as<float>(), abs, dA.as<float>(),
                                   ddt.as<float>(), qn.as<float>(), qs, kn.as<float>(), qs, g.as<float>(), sh.Hv, beta.as<float>(), sh.Hv};
    SSM_CUDA_CHECK(cuda::gated_delta_prepare(pa, T, sh.Hk, sh.Hv, sh.Dk, nullptr));
    const cuda::DeviceDecodeRows dr{didx.as<int32_t>(), cols, dqsl.as<int32_t>()};
    const cuda::GatedDeltaInputs in1{qn.as<float>(), qs, kn.as<float>(), qs, dv.as<float>(), vs, g.as<float>(), sh.Hv, beta.as<float>(), sh.Hv};
    SSM_CUDA_CHECK(cuda::gated_delta_decode(in1, L1.dev(), o1.as<float>(), os, dr, rows, nullptr));
    const cuda::GatedDeltaInputs in2{dq.as<float>(), qs, dk.as<float>(), qs, dv.as<float>(), vs, nullptr, 0, nullptr, 0};
    const cuda::GatedDeltaDecodePrep prep{da.as<float>(), abs, db.as<float>(), abs, dA.as<float>(), ddt.as<float>()};
    SSM_CUDA_CHECK(cuda::gated_delta_decode(in2, L2.dev(), o2.as<float>(), os, dr, rows, nullptr, false, false, &prep));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(to_host<uint8_t>(o1, T * os * 4), to_host<uint8_t>(o2, T * os * 4)) << "outputs";
    ASSERT_EQ(to_host<uint8_t>(L1.pool.dev, L1.pool.dev.bytes()), to_host<uint8_t>(L2.pool.dev, L2.pool.dev.bytes())) << "states";
  }
  // Without g / beta and without a preparation: refused.
  GdnLayer L(gdn_shapes()[0], DType::F32, 2, rng);
  DeviceBuffer x(4096 * 4), idx = to_device(std::vector<int32_t>{1});
  const cuda::GatedDeltaInputs raw{x.as<float>(), 128, x.as<float>(), 128, x.as<float>(), 256, nullptr, 0, nullptr, 0};
  EXPECT_EQ(cuda::gated_delta_decode(raw, L.dev(), x.as<float>(), 256, idx.as<int32_t>(), 1, nullptr),
            cudaErrorInvalidValue);
  const cuda::GatedDeltaDecodePrep no_a{nullptr, 0, x.as<float>(), 8, x.as<float>(), x.as<float>()};
  EXPECT_EQ(cuda::gated_delta_decode(raw, L.dev(), x.as<float>(), 256, idx.as<int32_t>(), 1, nullptr, false, false, &no_a),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
