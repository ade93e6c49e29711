// GPU fused decode router (moe_router_route, kernels/cuda/moe.h): the router GEMV and the routing in one launch against
// skinny_gemm_f32 followed by moe_route, bit for bit (logits, ids, weights), for every routing the supported families
// use, 1..8 tokens, E from 16 to 512, tied logits, x written by the kernel just before (PDL), launches repeated (the
// arrival counter left at 0) and captured in a CUDA graph; what it refuses. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/activations.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct RouterCase {
  const char* name;
  int E, k;
  int64_t K;
  bool sigmoid, renorm;
  float scale;
  int groups, topk_group;
  bool bias;
};

TEST(CudaMoeRouter, RouterRouteEqualsGemvThenRouteBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const RouterCase cases[] = {
      {"softmax renorm, 64 experts (Granite-4.0-H-Tiny)", 64, 6, 1536, false, true, 1.0f, 1, 1, false},
      {"softmax no renorm, 16 experts (Jamba)", 16, 2, 1024, false, false, 1.0f, 1, 1, false},
      {"sigmoid grouped, scaled (Nemotron 3)", 128, 6, 2688, true, true, 2.5f, 8, 4, true},
      {"softmax, 256 experts top-8 (Qwen3.5-35B-A3B)", 256, 8, 2048, false, true, 1.0f, 1, 1, false},
      {"softmax, 512 experts top-10 (Qwen3-Next)", 512, 10, 2048, false, true, 1.0f, 1, 1, false},
      {"sigmoid, 100 experts, K 132", 100, 4, 132, true, false, 1.0f, 1, 1, true},
  };
  cudaStream_t s = nullptr;
  SSM_CUDA_CHECK(cudaStreamCreate(&s));
  DeviceBuffer counter(sizeof(unsigned));
  counter.fill_bytes(0);
  for (const RouterCase& c : cases)
    for (int64_t T = 1; T <= 8; ++T) {
      SCOPED_TRACE(testing::Message() << c.name << " T=" << T);
      const int64_t xs = c.K + 4;
      auto x = rand_vec(rng, static_cast<size_t>(T * xs), -1.0f, 1.0f), w = rand_vec(rng, static_cast<size_t>(c.E * c.K), -0.1f, 0.1f);
      if (T > 1)  // token 1: all logits tied (a zero row)
        for (int64_t k = 0; k < c.K; ++k) x[xs + k] = 0.0f;
      // dx is rewritten from src by a kernel just before each fused launch (its PDL wait must order the reads).
      DeviceBuffer dx = to_device(x), src = to_device(x), dw = to_device(w);
      DeviceBuffer bias = c.bias ? to_device(rand_vec(rng, static_cast<size_t>(c.E), -0.2f, 0.2f)) : DeviceBuffer(4);
      cuda::MoeDevWeights mw;
      mw.num_experts = c.E, mw.top_k = c.k;
      mw.routing.sigmoid = c.sigmoid, mw.routing.renormalize = c.renorm, mw.routing.routed_scaling_factor = c.scale;
      mw.routing.n_group = c.groups, mw.routing.topk_group = c.topk_group;
      mw.routing.correction_bias = c.bias ? bias.as<float>() : nullptr;
      ASSERT_TRUE(cuda::moe_router_route_serves(dx.as<float>(), xs, T, dw.as<float>(), c.K, mw));
      // Separate: the fp32 GEMV, then the routing.
      const size_t P = static_cast<size_t>(T * c.k);
      DeviceBuffer l1(T * c.E * 4), i1(P * 4), w1(P * 4);
      SSM_CUDA_CHECK(cuda::skinny_gemm_f32({T, c.E, c.K, dx.data(), xs, dw.data(), c.K, DType::F32, l1.data(), c.E, DType::F32},
                                           true, s));
      SSM_CUDA_CHECK(cuda::moe_route(l1.as<float>(), T, c.E, c.k, mw.routing, i1.as<int32_t>(), w1.as<float>(), s, true));
      // Fused, three times (the counter must be back at 0 after each), the last in a CUDA graph.
      DeviceBuffer l2(T * c.E * 4), i2(P * 4), w2(P * 4);
      for (int rep = 0; rep < 3; ++rep) {
        SSM_CUDA_CHECK(cudaMemsetAsync(l2.data(), 0xff, T * c.E * 4, s));
        SSM_CUDA_CHECK(cudaMemsetAsync(i2.data(), 0xff, P * 4, s));
        SSM_CUDA_CHECK(cudaMemsetAsync(dx.data(), 0xff, T * xs * 4, s));
        SSM_CUDA_CHECK(cuda::scaled_residual(dx.as<float>(), src.as<float>(), 1.0f, src.as<float>(), 0.0f, T * xs, s, false));
        if (rep < 2) {
          SSM_CUDA_CHECK(cuda::moe_router_route(dx.as<float>(), xs, T, dw.as<float>(), c.K, mw, l2.as<float>(), i2.as<int32_t>(),
                                                w2.as<float>(), counter.as<unsigned>(), s, rep == 1));
        } else {
          cudaGraph_t g = nullptr;
          cudaGraphExec_t ge = nullptr;
          SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
          SSM_CUDA_CHECK(cuda::scaled_residual(dx.as<float>(), src.as<float>(), 1.0f, src.as<float>(), 0.0f, T * xs, s, false));
          SSM_CUDA_CHECK(cuda::moe_router_route(dx.as<float>(), xs, T, dw.as<float>(), c.K, mw, l2.as<float>(), i2.as<int32_t>(),
                                                w2.as<float>(), counter.as<unsigned>(), s, true));
          SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
          SSM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
          SSM_CUDA_CHECK(cudaGraphLaunch(ge, s));
          SSM_CUDA_CHECK(cudaGraphLaunch(ge, s));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
        }
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        ASSERT_EQ(to_host<uint8_t>(l1, T * c.E * 4), to_host<uint8_t>(l2, T * c.E * 4)) << "logits, launch " << rep;
        ASSERT_EQ(to_host<int32_t>(i1, P), to_host<int32_t>(i2, P)) << "ids, launch " << rep;
        ASSERT_EQ(to_host<uint8_t>(w1, P * 4), to_host<uint8_t>(w2, P * 4)) << "weights, launch " << rep;
        ASSERT_EQ(to_host<unsigned>(counter, 1)[0], 0u) << "the arrival counter after launch " << rep;
      }
    }
  cudaStreamDestroy(s);
}

TEST(CudaMoeRouter, RefusesWhatItDoesNotServe) {
  REQUIRE_GPU();
  DeviceBuffer x(16 * 132 * 4), w(64 * 132 * 4), l(16 * 64 * 4), ids(16 * 8 * 4), wts(16 * 8 * 4), counter(4);
  cuda::MoeDevWeights mw;
  mw.num_experts = 64, mw.top_k = 6;
  EXPECT_TRUE(cuda::moe_router_route_serves(x.as<float>(), 128, 1, w.as<float>(), 128, mw));
  EXPECT_FALSE(cuda::moe_router_route_serves(x.as<float>(), 128, 9, w.as<float>(), 128, mw));       // > 8 tokens
  EXPECT_FALSE(cuda::moe_router_route_serves(x.as<float>(), 130, 1, w.as<float>(), 130, mw));       // K % 4 != 0
  EXPECT_FALSE(cuda::moe_router_route_serves(x.as<float>() + 1, 128, 1, w.as<float>(), 128, mw));   // unaligned x
  cuda::MoeDevWeights grouped = mw;
  grouped.routing.n_group = 4, grouped.routing.topk_group = 2;  // grouped choice needs sigmoid scores
  EXPECT_FALSE(cuda::moe_router_route_serves(x.as<float>(), 128, 1, w.as<float>(), 128, grouped));
  EXPECT_EQ(cuda::moe_router_route(x.as<float>(), 128, 1, w.as<float>(), 128, mw, l.as<float>(), ids.as<int32_t>(),
                                   wts.as<float>(), nullptr, nullptr, false),
            cudaErrorInvalidValue);  // no counter
}

}  // namespace
}  // namespace ssmserve
