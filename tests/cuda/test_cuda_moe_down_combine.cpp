// sparse_moe's down GEMV and combine in one launch (KernelTuning::moe_down_combine, kernels/cuda/moe_down_combine.cu)
// against the down GEMV and combine kernel it replaces, bit for bit: decode-sized steps on the unsorted per-pair rows
// (T * top_k <= 16), SiLU-gated and relu^2 experts, top_k 1 .. 16, no shared add, the plain add and Qwen's gated add
// (fused at top_k 8; other top_k fall back, also compared; KernelTuning::moe_down_combine 2, since the default 1 leaves
// steps with an add to the combine kernel), every rows-per-warp, with and without PDL and the pre-wait loads; and the
// default's choice. The fused path's use is checked too: its workspace keeps the poisoned y rows the separate down GEMV writes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_parts.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

struct DownCombineCase {
  const char* name;
  int E;
  int64_t Hd, I;
  bool gated;
};

TEST(CudaMoeDownCombine, EqualsDownGemvAndCombineBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Odd sizes (K = 8 * odd: lanes past K on the last chunk; K < 256) and,
  // outside quick mode, the expert shapes of Granite-4.0-H-Tiny, Qwen3.5-35B-A3B and Nemotron-3-Nano (K 1856: 22 KB
  // of act rows at top_k 6).
  std::vector<DownCombineCase> cases = {{"odd gated", 16, 328, 104, true}, {"odd relu^2", 16, 200, 360, false},
                                        {"tiny K", 16, 40, 24, true}, {"47 KB of act rows at top_k 8", 8, 64, 3008, false}};
  if (!quick()) {
    cases.push_back({"granite-4.0-h-tiny", 16, 1536, 512, true});
    cases.push_back({"qwen3.5-35b-a3b", 16, 2048, 512, true});
    cases.push_back({"nemotron-3-nano-30b-a3b", 8, 2688, 1856, false});
  }
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreate(&stream));
  int runs = 0, fused_runs = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t Hd = c.Hd, I = c.I, xs = Hd + 4, os = Hd + 8, ys = Hd + 12;
    const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
    DeviceBuffer d1 = to_device(fast_bf16(c.E * I * Hd, hs, rng())),
                 d3 = c.gated ? to_device(fast_bf16(c.E * I * Hd, hs, rng())) : DeviceBuffer(16),
                 d2 = to_device(fast_bf16(c.E * Hd * I, 4 * is, rng()));
    struct Run {
      int64_t T;
      int k;
    };
    for (const Run rr : {Run{1, 1}, Run{1, 6}, Run{1, 8}, Run{2, 8}, Run{2, 6}, Run{1, 10}, Run{1, 16}, Run{16, 1}}) {
      if (rr.k > c.E) continue;
      const int64_t T = rr.T;
      cuda::MoeDevWeights w{c.E, rr.k, Hd, I, d1.data(), c.gated ? d3.data() : nullptr, d2.data(), cuda::MoeRouteParams{}};
      DeviceBuffer dx = to_device(rand_vec(rng, T * xs, -2.0f, 2.0f)), dl = to_device(rand_vec(rng, T * c.E, -3.0f, 3.0f)),
                   sy = to_device(rand_vec(rng, T * ys, -1.0f, 1.0f)), gate = to_device(rand_vec(rng, Hd, -hs, hs));
      const size_t wsb = cuda::moe_workspace_bytes(T, w);
      for (int add_kind = 0; add_kind < 3; ++add_kind) {  // none, plain, gated
        cuda::MoeSharedAdd add;
        add.y = sy.as<float>(), add.y_stride = ys, add.gate = add_kind == 2 ? gate.as<float>() : nullptr;
        const cuda::MoeSharedAdd* shared = add_kind ? &add : nullptr;
        auto run = [&](bool fused, int rows, bool pdl, bool preload) {
          cuda::KernelTuning t = cuda::kernel_tuning();
          t.moe_down_combine = fused ? 2 : 0, t.moe_pair_rows = rows, t.moe_pair_preload = preload;
          TuningScope scope(t);
          DeviceBuffer ws(wsb), out = poisoned(T * os);
          ws.fill_bytes(0x5a);
          SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), xs, T, dl.as<float>(), w, out.as<float>(), os, ws.data(), stream,
                                          pdl, shared));
          SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
          return std::make_pair(to_host<uint8_t>(ws, wsb), to_host<uint8_t>(out, T * os * 4));
        };
        const bool fits = cuda::detail::moe_down_combine_fits(T, rr.k, Hd, I, shared);
        for (int rows : {0, 1, 2, 4}) {
          const auto sep = run(false, rows, true, true);
          for (int mode = 0; mode < 3; ++mode) {  // no PDL; PDL; PDL with the loads before the wait
            const bool pdl = mode > 0, preload = mode == 2;
            SCOPED_TRACE(testing::Message() << "T=" << T << " top_k=" << rr.k << " add " << add_kind << " rows " << rows
                                            << " pdl " << pdl << " preload " << preload);
            const auto got = run(true, rows, pdl, preload);
            ++runs;
            fused_runs += fits;
            for (int64_t t = 0; t < T; ++t)
              ASSERT_EQ(std::memcmp(&got.second[t * os * 4], &sep.second[t * os * 4], Hd * 4), 0) << "token " << t;
            // The fused launch leaves the y rows (written by the separate down GEMV) as poisoned: it ran.
            EXPECT_EQ(got.first != sep.first, fits) << "the fused path " << (fits ? "did not run" : "ran unexpectedly");
          }
        }
      }
    }
  }
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
  EXPECT_GT(fused_runs, 0);
  std::printf("down + combine: %d runs (%d fused) bit-identical to the down GEMV and combine kernels\n", runs, fused_runs);
}

// KernelTuning::moe_down_combine's default (1) fuses a step without a shared add only; 0 never.
TEST(CudaMoeDownCombine, DefaultFusesStepsWithoutSharedAdd) {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  const int E = 8, k = 6;
  const int64_t Hd = 256, I = 128;
  DeviceBuffer d1 = to_device(fast_bf16(E * I * Hd, 0.06f, rng())), d3 = to_device(fast_bf16(E * I * Hd, 0.06f, rng())),
               d2 = to_device(fast_bf16(E * Hd * I, 0.3f, rng()));
  cuda::MoeDevWeights w{E, k, Hd, I, d1.data(), d3.data(), d2.data(), cuda::MoeRouteParams{}};
  DeviceBuffer dx = to_device(rand_vec(rng, Hd, -2.0f, 2.0f)), dl = to_device(rand_vec(rng, E, -3.0f, 3.0f)),
               sy = to_device(rand_vec(rng, Hd, -1.0f, 1.0f));
  cuda::MoeSharedAdd add;
  add.y = sy.as<float>(), add.y_stride = Hd;
  const size_t wsb = cuda::moe_workspace_bytes(1, w);
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreate(&stream));
  // Whether the y rows the separate down GEMV writes stayed poisoned (the fused launch ran).
  auto fused = [&](int mode, const cuda::MoeSharedAdd* shared) {
    cuda::KernelTuning t = cuda::kernel_tuning();
    t.moe_down_combine = mode;
    TuningScope scope(t);
    DeviceBuffer ws(wsb), out(Hd * 4);
    ws.fill_bytes(0x5a);
    SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), Hd, 1, dl.as<float>(), w, out.as<float>(), Hd, ws.data(), stream, true,
                                    shared));
    SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto h = to_host<uint8_t>(ws, wsb);
    size_t poisoned_bytes = 0;
    for (uint8_t b : h) poisoned_bytes += b == 0x5a;
    return poisoned_bytes;
  };
  EXPECT_EQ(cuda::KernelTuning{}.moe_down_combine, 1);
  EXPECT_GT(fused(1, nullptr), fused(0, nullptr)) << "the default did not fuse a step without a shared add";
  EXPECT_EQ(fused(1, &add), fused(0, &add)) << "the default fused a step with a shared add";
  EXPECT_GT(fused(2, &add), fused(0, &add)) << "mode 2 did not fuse a step with a shared add";
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
}

TEST(CudaMoeDownCombine, FitsAndRejects) {
  cuda::MoeSharedAdd gated;
  float g = 0.0f;
  gated.gate = &g;
  EXPECT_TRUE(cuda::detail::moe_down_combine_fits(1, 6, 1536, 512, nullptr));
  EXPECT_TRUE(cuda::detail::moe_down_combine_fits(2, 8, 2048, 512, &gated));
  EXPECT_FALSE(cuda::detail::moe_down_combine_fits(1, 6, 1536, 512, &gated));  // gated add: top_k 8 only
  EXPECT_FALSE(cuda::detail::moe_down_combine_fits(1, 16, 2048, 2048, nullptr));  // 64 KB of act rows
  // 47 KB of act rows fit beside the static arrays; 48 KB would not launch without an opt-in (the reviewer's probe).
  EXPECT_TRUE(cuda::detail::moe_down_combine_fits(1, 8, 2048, 3008, nullptr));
  EXPECT_FALSE(cuda::detail::moe_down_combine_fits(1, 8, 2048, 3072, nullptr));
  EXPECT_FALSE(cuda::detail::moe_down_combine_fits(0, 6, 1536, 512, nullptr));
  EXPECT_FALSE(cuda::detail::moe_down_combine_fits(1, 17, 1536, 512, nullptr));
  EXPECT_EQ(cuda::detail::moe_down_combine(nullptr, nullptr, nullptr, 1, 17, nullptr, 1536, 512, 1, nullptr, 1536, nullptr,
                                           false, nullptr, false),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
