// The one-launch MoE of a one-token decode step (KernelTuning::moe_decode_fused, kernels/cuda/moe_decode_fused.cu)
// against the launches it replaces (the fp32 router GEMV skinny_gemm_f32, then sparse_moe's route, per-pair up GEMV,
// down GEMV + combine), bit for bit: router logits and outputs, SiLU-gated and relu^2 experts, softmax and sigmoid
// routing (correction bias, groups, routed scaling, no renormalization), top_k 1 .. 16, 8 .. 512 experts, no shared
// add, the plain add and Qwen's gated add (the down GEMV and combine then stay launches of their own), with and without
// PDL, repeated launches and CUDA graph replays (the barrier counters return to zero); and what it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct FusedCase {
  const char* name;
  int E, top_k;
  int64_t Hd, I;
  bool gated;
  bool sigmoid = false, renorm = true;
  float scale = 1.0f;
  int n_group = 1, topk_group = 1;
};

TEST(CudaMoeDecodeFused, EqualsRouterGemmAndSparseMoeBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<FusedCase> cases = {
      {"odd gated, softmax", 16, 6, 328, 104, true},
      {"odd relu^2, sigmoid grouped scaled", 64, 6, 200, 360, false, true, true, 2.5f, 8, 4},
      {"tiny K, top-1", 8, 1, 40, 24, true},
      {"sigmoid no renorm, top-16", 32, 16, 136, 64, true, true, false},
      {"softmax no renorm, 512 experts top-10", 512, 10, 96, 32, true, false, false},
      {"wide act rows at top_k 8", 8, 8, 64, 2496, false},
  };
  if (!quick()) {
    cases.push_back({"granite-4.0-h-tiny", 64, 6, 1536, 512, true});
    cases.push_back({"qwen3.5-35b-a3b", 256, 8, 2048, 512, true});
    cases.push_back({"nemotron-3-nano-30b-a3b", 128, 6, 2688, 1856, false, true, true, 2.5f, 1, 1});
  }
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int runs = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t Hd = c.Hd, I = c.I, xs = Hd + 4, os = Hd + 8, ys = Hd + 12;
    const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
    DeviceBuffer d1 = to_device(fast_bf16(c.E * I * Hd, hs, rng())),
                 d3 = c.gated ? to_device(fast_bf16(c.E * I * Hd, hs, rng())) : DeviceBuffer(16),
                 d2 = to_device(fast_bf16(c.E * Hd * I, 4 * is, rng())),
                 wg = to_device(rand_vec(rng, c.E * Hd, -2 * hs, 2 * hs)), bias = to_device(rand_vec(rng, c.E, -0.5f, 0.5f));
    cuda::MoeRouteParams r;
    r.sigmoid = c.sigmoid, r.renormalize = c.renorm, r.routed_scaling_factor = c.scale;
    r.n_group = c.n_group, r.topk_group = c.topk_group, r.correction_bias = c.sigmoid ? bias.as<float>() : nullptr;
    const cuda::MoeDevWeights w{c.E, c.top_k, Hd, I, d1.data(), c.gated ? d3.data() : nullptr, d2.data(), r};
    const size_t wsb = cuda::moe_workspace_bytes(1, w);
    for (int trial = 0; trial < 2; ++trial) {
      DeviceBuffer dx = to_device(rand_vec(rng, xs, -2.0f, 2.0f)), sy = to_device(rand_vec(rng, ys, -1.0f, 1.0f)),
                   gate = to_device(rand_vec(rng, Hd, -hs, hs));
      for (int add_kind = 0; add_kind < 3; ++add_kind) {  // none, plain, gated
        cuda::MoeSharedAdd add;
        add.y = sy.as<float>(), add.y_stride = ys, add.gate = add_kind == 2 ? gate.as<float>() : nullptr;
        const cuda::MoeSharedAdd* shared = add_kind ? &add : nullptr;
        // The separate launches: the router GEMM (skinny_gemm_f32, as GemmHandle runs it), then sparse_moe.
        DeviceBuffer ref_logits = poisoned(c.E), ref_out = poisoned(os), ref_ws(wsb);
        {
          cuda::KernelTuning t = cuda::kernel_tuning();
          t.moe_decode_fused = false;
          TuningScope scope(t);
          const cuda::GemmArgs g{1, c.E, Hd, dx.data(), xs, wg.data(), Hd, DType::F32, ref_logits.data(), c.E, DType::F32};
          SSM_CUDA_CHECK(cuda::skinny_gemm_f32(g, true, stream));
          SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), xs, 1, ref_logits.as<float>(), w, ref_out.as<float>(), os,
                                          ref_ws.data(), stream, true, shared));
          SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
        }
        const auto want_logits = to_host<uint8_t>(ref_logits, c.E * 4), want_out = to_host<uint8_t>(ref_out, os * 4);
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.moe_decode_fused = true;
        t.moe_down_combine = trial == 0 ? 1 : 2;  // with shared rows: the down GEMV + combine, or their one launch
        TuningScope scope(t);
        ASSERT_TRUE(cuda::moe_decode_fused_serves(1, w));
        DeviceBuffer sync(16);
        sync.fill_bytes(0);
        for (int mode = 0; mode < 3; ++mode) {  // no PDL, PDL, a CUDA graph replayed three times
          SCOPED_TRACE(testing::Message() << "add " << add_kind << " mode " << mode << " trial " << trial);
          DeviceBuffer logits = poisoned(c.E), out = poisoned(os), ws(wsb);
          ws.fill_bytes(0x5a);
          const cuda::MoeFusedRouter fr{wg.as<float>(), logits.as<float>(), sync.as<unsigned>()};
          auto launch = [&](cudaStream_t s) {
            return cuda::sparse_moe(dx.as<float>(), xs, 1, nullptr, w, out.as<float>(), os, ws.data(), s, mode > 0, shared, &fr);
          };
          const int reps = mode == 2 ? 3 : 2;
          if (mode < 2) {
            for (int i = 0; i < reps; ++i) SSM_CUDA_CHECK(launch(stream));
          } else {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            SSM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            SSM_CUDA_CHECK(launch(stream));
            SSM_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
            SSM_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
            for (int i = 0; i < reps; ++i) SSM_CUDA_CHECK(cudaGraphLaunch(ge, stream));
            SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
            SSM_CUDA_CHECK(cudaGraphExecDestroy(ge));
            SSM_CUDA_CHECK(cudaGraphDestroy(g));
          }
          SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
          ++runs;
          EXPECT_EQ(to_host<uint8_t>(logits, c.E * 4), want_logits) << "router logits";
          ASSERT_EQ(std::memcmp(to_host<uint8_t>(out, os * 4).data(), want_out.data(), Hd * 4), 0) << "outputs";
          EXPECT_EQ(to_host<unsigned>(sync, 4), std::vector<unsigned>(4, 0u)) << "the barrier counters are left zero";
        }
      }
    }
  }
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("fused MoE decode: %d runs bit-identical to the router GEMM and sparse_moe's launches\n", runs);
}

// What the fused launch serves, and sparse_moe's answer to a MoeFusedRouter it does not.
TEST(CudaMoeDecodeFused, ServesOneTokenBf16StepsWhenOn) {
  REQUIRE_GPU();
  DeviceBuffer d(16);
  cuda::MoeDevWeights w{64, 6, 1536, 512, d.data(), d.data(), d.data(), cuda::MoeRouteParams{}};
  cuda::KernelTuning t = cuda::kernel_tuning();
  t.moe_decode_fused = true;
  {
    TuningScope scope(t);
    EXPECT_TRUE(cuda::moe_decode_fused_serves(1, w));
    EXPECT_FALSE(cuda::moe_decode_fused_serves(2, w)) << "two tokens";
    cuda::MoeDevWeights f = w;
    f.f32 = true;
    EXPECT_FALSE(cuda::moe_decode_fused_serves(1, f)) << "fp32 experts";
    f = w, f.per_pair = true;
    EXPECT_FALSE(cuda::moe_decode_fused_serves(1, f)) << "batch-invariant mode";
    f = w, f.top_k = 16, f.intermediate = 2048;
    EXPECT_FALSE(cuda::moe_decode_fused_serves(1, f)) << "act rows beyond 40 KB";
    f = w, f.hidden = 16384;
    EXPECT_FALSE(cuda::moe_decode_fused_serves(1, f)) << "hidden beyond 8192";
    DeviceBuffer x(1536 * 4), out(1536 * 4), ws(cuda::moe_workspace_bytes(2, w)), wg(64 * 1536 * 4), logits(64 * 4), sync(16);
    const cuda::MoeFusedRouter fr{wg.as<float>(), logits.as<float>(), sync.as<unsigned>()};
    EXPECT_EQ(cuda::sparse_moe(x.as<float>(), 1536, 2, nullptr, w, out.as<float>(), 1536, ws.data(), nullptr, false, nullptr, &fr),
              cudaErrorInvalidValue);
    const cuda::MoeFusedRouter no_sync{wg.as<float>(), logits.as<float>(), nullptr};
    EXPECT_EQ(cuda::sparse_moe(x.as<float>(), 1536, 1, nullptr, w, out.as<float>(), 1536, ws.data(), nullptr, false, nullptr,
                               &no_sync),
              cudaErrorInvalidValue);
  }
  t.moe_decode_fused = false;
  TuningScope scope(t);
  EXPECT_FALSE(cuda::moe_decode_fused_serves(1, w)) << "KernelTuning::moe_decode_fused off";
}

}  // namespace
}  // namespace ssmserve
