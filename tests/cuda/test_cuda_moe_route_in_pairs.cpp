// The decode MoE step without its router kernel (KernelTuning::moe_route_in_pairs: every block of the per-pair up and
// down GEMVs routes its pair's token itself, down before its PDL wait) and with the down GEMV's loads before its wait
// (KernelTuning::moe_pair_preload), against the step with the router kernel: the same workspace (ids, weights, pair
// rows, activations, expert rows) and output bytes, for every routing the supported families use (softmax with and
// without renormalization, sigmoid with correction bias, grouped choice, routed scaling; 8 to 512 experts), ties (a
// token whose logits are all equal), SiLU-gated and relu^2 experts, with and without PDL, in a captured CUDA graph
// replayed twice (so a second replay's routing cannot read the first's leftovers). A routing that differed in one id
// or one weight bit, or a read of the logits before the router GEMV had written them, would fail the memcmp.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct RoutingCase {
  const char* name;
  bool sigmoid, renorm;
  float scale;
  int E, k, groups, topk_group;
  bool bias, gated;
};

TEST(CudaMoe, RouteInPairsEqualsRouterKernel) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const RoutingCase cases[] = {
      {"softmax no renorm (Jamba)", false, false, 1.0f, 16, 2, 1, 1, false, true},
      {"softmax renorm, 64 experts top-6 (Granite)", false, true, 1.0f, 64, 6, 1, 1, false, true},
      {"sigmoid renorm (Nemotron-H, 1 group)", true, true, 1.0f, 8, 2, 1, 1, true, false},
      {"sigmoid grouped, scaled (Nemotron 3)", true, true, 2.5f, 128, 6, 8, 4, true, false},
      {"sigmoid grouped, no renorm", true, false, 1.0f, 64, 4, 4, 2, false, true},
      {"softmax renorm, 256 experts top-8 (Qwen3.5)", false, true, 1.0f, 256, 8, 1, 1, false, true},
      {"softmax renorm, 512 experts top-10 (Qwen3-Next)", false, true, 1.0f, 512, 10, 1, 1, false, true},
  };
  const int64_t Hd = 72, I = 40, xs = Hd + 4, os = Hd + 8;  // K < 256 and not a multiple of the lanes' stride
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreate(&stream));
  int runs = 0;
  for (const RoutingCase& c : cases) {
    SCOPED_TRACE(c.name);
    DeviceBuffer d1 = to_device(fast_bf16(c.E * I * Hd, 0.12f, rng())),
                 d3 = c.gated ? to_device(fast_bf16(c.E * I * Hd, 0.12f, rng())) : DeviceBuffer(16),
                 d2 = to_device(fast_bf16(c.E * Hd * I, 0.15f, rng()));
    std::vector<float> bias_h = rand_vec(rng, c.E, -0.2f, 0.2f);
    DeviceBuffer bias = to_device(bias_h);
    cuda::MoeRouteParams rp;
    rp.sigmoid = c.sigmoid, rp.renormalize = c.renorm, rp.routed_scaling_factor = c.scale;
    rp.n_group = c.groups, rp.topk_group = c.topk_group, rp.correction_bias = c.bias ? bias.as<float>() : nullptr;
    const cuda::MoeDevWeights w{c.E, c.k, Hd, I, d1.data(), c.gated ? d3.data() : nullptr, d2.data(), rp};
    for (int64_t T : {int64_t{1}, int64_t{16 / c.k}}) {
      SCOPED_TRACE(testing::Message() << "T=" << T);
      std::vector<float> logits = rand_vec(rng, T * c.E, -3.0f, 3.0f);
      for (int e = 0; e < c.E; ++e) logits[e] = 0.25f;  // token 0: every expert tied
      DeviceBuffer dx = to_device(rand_vec(rng, T * xs, -2.0f, 2.0f)), dl = to_device(logits);
      const size_t wsb = cuda::moe_workspace_bytes(T, w);
      // One MoE step under the tuning; graph: captured once and replayed twice.
      auto run = [&](bool route_in_pairs, bool preload, bool pdl, bool graph) {
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.moe_route_in_pairs = route_in_pairs, t.moe_pair_preload = preload;
        TuningScope scope(t);
        DeviceBuffer ws(wsb), out = poisoned(T * os);
        ws.fill_bytes(0x5a);
        auto step = [&] {
          SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), xs, T, dl.as<float>(), w, out.as<float>(), os, ws.data(),
                                          stream, pdl));
        };
        if (graph) {
          cudaGraph_t g;
          cudaGraphExec_t ge;
          SSM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
          step();
          SSM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
          SSM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
          for (int i = 0; i < 2; ++i) SSM_CUDA_CHECK(cudaGraphLaunch(ge, stream));
          SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
          SSM_CUDA_CHECK(cudaGraphExecDestroy(ge));
          SSM_CUDA_CHECK(cudaGraphDestroy(g));
        } else {
          step();
        }
        SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
        return std::make_pair(to_host<uint8_t>(ws, wsb), to_host<uint8_t>(out, T * os * 4));
      };
      const auto ref = run(false, false, false, false);
      for (int mode = 0; mode < 6; ++mode) {
        const bool preload = mode & 1, pdl = mode >= 2, graph = mode >= 4;
        SCOPED_TRACE(testing::Message() << "preload " << preload << " pdl " << pdl << " graph " << graph);
        const auto got = run(true, preload, pdl, graph);
        ++runs;
        size_t diff = 0;
        while (diff < wsb && got.first[diff] == ref.first[diff]) ++diff;
        EXPECT_EQ(diff, wsb) << "workspace differs from byte " << diff << " of " << wsb;
        EXPECT_EQ(std::memcmp(got.second.data(), ref.second.data(), got.second.size()), 0) << "output differs";
      }
    }
  }
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("routing in the per-pair GEMVs: %d runs bit-identical to the router kernel's\n", runs);
}

}  // namespace
}  // namespace ssmserve
