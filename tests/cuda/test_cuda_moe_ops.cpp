// GPU sparse MoE (kernels/cuda/moe.h) against the CPU reference (kernels/cpu/moe.h): every routing the supported
// families use (softmax renormalized or not, sigmoid with correction bias, grouped choice and routed scaling), ties,
// SiLU-gated and relu^2 experts on the per-pair (decode) and grouped-GEMM paths, fp32 experts at fp32 accuracy, bad
// arguments; Qwen's many small experts (Qwen3.5-35B-A3B: 256 experts top-8; Qwen3-Next-80B-A3B: 512 experts top-10),
// with timings of the Qwen3.5-35B-A3B layer shape (hidden 2048, moe_intermediate 512) printed for
// docs/benchmarks.md; the per-pair GEMVs of KernelTuning::moe_pair_gemv against the old per-element GEMVs, bit for
// bit, at the Nemotron-3-Nano, Qwen3.5-35B-A3B and Granite-4.0-H-Tiny expert shapes. The grouped expert GEMMs' Hopper
// kernel: test_cuda_moe_grouped.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_grouped_gemm.h"
#include "model/weight.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

// ---- MoE ----------------------------------------------------------------------------------------------------------

TEST(CudaMoe, RouteMatchesCpuIncludingTies) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int E : {4, 8, 32, 64, 65, 128, 129, 256, 257, 512}) {  // each experts-per-lane instantiation and its edges
    for (int k : {1, 2, 4, 8, 16}) {
      if (k > E) continue;
      SCOPED_TRACE(testing::Message() << "E=" << E << " k=" << k);
      const int64_t T = 97;
      auto logits = rand_vec(rng, T * E, -3.0f, 3.0f);
      for (int e = 0; e < E; ++e) logits[e] = 0.5f;  // token 0: all tied -> ids 0, 1, ...
      logits[E + E - 1] = logits[E + 0] = 9.0f;        // token 1: a tie at the top
      std::vector<int32_t> ids(T * k);
      std::vector<float> w(T * k);
      cpu::moe_route(logits.data(), T, E, k, ids.data(), w.data());
      DeviceBuffer dl = to_device(logits), di(T * k * 4), dw(T * k * 4);
      SSM_CUDA_CHECK(cuda::moe_route(dl.as<float>(), T, E, k, di.as<int32_t>(), dw.as<float>(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<int32_t>(di, T * k), ids);
      auto gw = to_host<float>(dw, T * k);
      for (int64_t i = 0; i < T * k; ++i) EXPECT_NEAR(gw[i], w[i], 1e-6f) << i;
    }
  }
}

struct MoeShape {
  const char* name;
  int64_t hidden, inter;
  int E, k;
};

TEST(CudaMoe, SparseMoeMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // "odd": k and n tails of the 128 x 128 x 32 grouped tiles (hidden 200, I 72), top-3 of 8 (some experts empty).
  std::vector<MoeShape> shapes = {{"tiny-minimax", 256, 256, 4, 2}, {"odd", 200, 72, 8, 3}};
  if (!quick()) shapes.push_back({"minimax-bench", 2048, 1024, 8, 2});
  for (const auto& sh : shapes) {
    for (int64_t T : {int64_t{1}, int64_t{7}, int64_t{9}, quick() ? int64_t{70} : int64_t{300}}) {  // <= 8: GEMV path
      SCOPED_TRACE(testing::Message() << sh.name << " T=" << T);
      const int64_t Hd = sh.hidden, I = sh.inter, xs = Hd + 4, os = Hd + 8;
      const int E = sh.E;
      Weight gate = Weight::allocate(DType::F32, E, Hd);
      auto g = rand_vec(rng, E * Hd, -0.1f, 0.1f);
      std::memcpy(const_cast<void*>(gate.data), g.data(), g.size() * 4);
      std::vector<cpu::ExpertWeights> experts(E);
      std::vector<uint16_t> w1s, w3s, w2s;
      auto fill = [&](Weight& W, int64_t r, int64_t c, std::vector<uint16_t>& stack) {
        W = Weight::allocate(DType::BF16, r, c);
        auto v = rand_vec(rng, r * c, -0.05f, 0.05f);
        auto b = to_bf16_bits(v);
        std::memcpy(const_cast<void*>(W.data), b.data(), b.size() * 2);
        stack.insert(stack.end(), b.begin(), b.end());
      };
      for (int e = 0; e < E; ++e) {
        fill(experts[e].w1, I, Hd, w1s);
        fill(experts[e].w3, I, Hd, w3s);
        fill(experts[e].w2, Hd, I, w2s);
      }
      std::vector<float> x = rand_vec(rng, T * Hd);
      round_bf16(x);
      std::vector<float> ref(T * Hd), logits(T * E);
      { cpu::MoeRouting r; r.top_k = sh.k; cpu::sparse_moe(x.data(), T, Hd, gate, experts, r, ref.data()); }
      cpu::linear(x.data(), T, gate, nullptr, logits.data());
      std::vector<float> xpad(T * xs, 0.0f);
      for (int64_t t = 0; t < T; ++t) std::copy_n(x.data() + t * Hd, Hd, xpad.data() + t * xs);
      DeviceBuffer dx = to_device(xpad), dl = to_device(logits), d1 = to_device(w1s), d3 = to_device(w3s),
                   d2 = to_device(w2s), dout = poisoned(T * os);
      cuda::MoeDevWeights w{E, sh.k, Hd, I, d1.data(), d3.data(), d2.data(), {}};
      DeviceBuffer ws(cuda::moe_workspace_bytes(T, w));
      SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), xs, T, dl.as<float>(), w, dout.as<float>(), os, ws.data(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      auto got = to_host<float>(dout, T * os);
      std::vector<float> refp(T * os, 0.0f);
      for (int64_t t = 0; t < T; ++t) std::copy_n(ref.data() + t * Hd, Hd, refp.data() + t * os);
      EXPECT_LT(rel_err(got.data(), os, refp.data(), os, T, Hd), 1e-2);
    }
  }
}

TEST(CudaMoe, RejectsBadArguments) {
  REQUIRE_GPU();
  cuda::MoeDevWeights w{4, 5, 256, 256, nullptr, nullptr, nullptr, {}};  // top_k > E, no weights
  EXPECT_EQ(cuda::sparse_moe(nullptr, 256, 1, nullptr, w, nullptr, 256, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::moe_route(nullptr, 1, 4, 5, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

/// The GPU routing of `r` (the device copy of its correction bias).
cuda::MoeRouteParams device_routing(const cpu::MoeRouting& r, const DeviceBuffer& bias) {
  cuda::MoeRouteParams d;
  d.sigmoid = r.scoring == cpu::MoeRouting::Scoring::Sigmoid;
  d.renormalize = r.renormalize, d.routed_scaling_factor = r.routed_scaling_factor;
  d.n_group = r.n_group, d.topk_group = r.topk_group;
  d.correction_bias = r.correction_bias.empty() ? nullptr : bias.as<float>();
  return d;
}

TEST(CudaMoe, EveryRoutingMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    const char* name;
    bool sigmoid, renorm;
    float scale;
    int E, k, groups, topk_group;
    bool bias;
  };
  const Case cases[] = {
      {"softmax no renorm (Jamba)", false, false, 1.0f, 16, 2, 1, 1, false},
      {"sigmoid renorm (Nemotron-H, 1 group)", true, true, 1.0f, 8, 2, 1, 1, true},
      {"sigmoid grouped, scaled (Nemotron 3)", true, true, 2.5f, 128, 6, 8, 4, true},
      {"sigmoid grouped, no renorm", true, false, 1.0f, 64, 4, 4, 2, false},
      {"sigmoid, 256 experts top-8", true, true, 1.5f, 256, 8, 1, 1, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t T = 61;
    cpu::MoeRouting r;
    r.scoring = c.sigmoid ? cpu::MoeRouting::Scoring::Sigmoid : cpu::MoeRouting::Scoring::Softmax;
    r.top_k = c.k, r.renormalize = c.renorm, r.routed_scaling_factor = c.scale, r.n_group = c.groups, r.topk_group = c.topk_group;
    if (c.bias) r.correction_bias = rand_vec(rng, c.E, -0.2f, 0.2f);
    auto logits = rand_vec(rng, T * c.E, -3.0f, 3.0f);
    for (int e = 0; e < c.E; ++e) logits[e] = 0.25f;  // token 0: all tied
    std::vector<int32_t> ids(T * c.k);
    std::vector<float> w(T * c.k);
    cpu::moe_route(logits.data(), T, c.E, r, ids.data(), w.data());
    DeviceBuffer bias = c.bias ? to_device(r.correction_bias) : DeviceBuffer(4);
    DeviceBuffer dl = to_device(logits), di(T * c.k * 4), dw(T * c.k * 4);
    SSM_CUDA_CHECK(cuda::moe_route(dl.as<float>(), T, c.E, c.k, device_routing(r, bias), di.as<int32_t>(), dw.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto gi = to_host<int32_t>(di, T * c.k);
    const auto gw = to_host<float>(dw, T * c.k);
    for (int64_t t = 0; t < T; ++t) {  // the same experts with the same weights (order within a token may differ
      std::vector<std::pair<int32_t, float>> a, b;  // only between equal choice scores)
      for (int k = 0; k < c.k; ++k) a.push_back({ids[t * c.k + k], w[t * c.k + k]}), b.push_back({gi[t * c.k + k], gw[t * c.k + k]});
      std::sort(a.begin(), a.end()), std::sort(b.begin(), b.end());
      for (int k = 0; k < c.k; ++k) {
        EXPECT_EQ(b[k].first, a[k].first) << "token " << t;
        EXPECT_NEAR(b[k].second, a[k].second, 2e-6f * c.scale) << "token " << t;
      }
    }
  }
}

TEST(CudaMoe, Relu2ExpertsWithSigmoidRoutingMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t Hd = 136, I = 72;
  const int E = 8, K = 3;
  cpu::MoeRouting r;
  r.scoring = cpu::MoeRouting::Scoring::Sigmoid;
  r.top_k = K, r.routed_scaling_factor = 2.0f, r.n_group = 2, r.topk_group = 1;
  r.correction_bias = rand_vec(rng, E, -0.1f, 0.1f);
  Weight gate = Weight::allocate(DType::F32, E, Hd);
  auto g = rand_vec(rng, E * Hd, -0.1f, 0.1f);
  std::memcpy(const_cast<void*>(gate.data), g.data(), g.size() * 4);
  std::vector<cpu::ExpertWeights> experts(E);
  std::vector<uint16_t> w1s, w2s;
  auto fill = [&](Weight& W, int64_t rows, int64_t cols, std::vector<uint16_t>& stack) {
    W = Weight::allocate(DType::BF16, rows, cols);
    auto b = to_bf16_bits(rand_vec(rng, rows * cols, -0.1f, 0.1f));
    std::memcpy(const_cast<void*>(W.data), b.data(), b.size() * 2);
    stack.insert(stack.end(), b.begin(), b.end());
  };
  for (int e = 0; e < E; ++e) fill(experts[e].w1, I, Hd, w1s), fill(experts[e].w2, Hd, I, w2s);
  DeviceBuffer d1 = to_device(w1s), d2 = to_device(w2s), bias = to_device(r.correction_bias);
  cuda::MoeDevWeights w{E, K, Hd, I, d1.data(), nullptr, d2.data(), device_routing(r, bias)};
  for (int64_t T : {int64_t{1}, int64_t{5}, int64_t{40}}) {  // 3 and 15 pairs: per-pair kernels; 120: grouped GEMMs
    SCOPED_TRACE(testing::Message() << "T=" << T);
    std::vector<float> x = rand_vec(rng, T * Hd);
    round_bf16(x);
    std::vector<float> ref(T * Hd), logits(T * E);
    cpu::sparse_moe(x.data(), T, Hd, gate, experts, r, ref.data());
    cpu::linear(x.data(), T, gate, nullptr, logits.data());
    DeviceBuffer dx = to_device(x), dl = to_device(logits), dout = poisoned(T * Hd), ws(cuda::moe_workspace_bytes(T, w));
    SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), Hd, T, dl.as<float>(), w, dout.as<float>(), Hd, ws.data(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    auto got = to_host<float>(dout, T * Hd);
    EXPECT_LT(rel_err(got.data(), Hd, ref.data(), Hd, T, Hd), 1e-2);
  }
}

// fp32 experts (MoeDevWeights::f32, the fp32-weight model): fp32 weights and inputs that are not bf16 values, so any
// bf16 rounding on the way (x, the activations, the weights: ~3e-3) would show against the CPU's fp32 arithmetic
// (only the summation order differs: ~1e-6). SiLU-gated and relu^2 experts, softmax and grouped sigmoid routing, on
// the unsorted per-pair rows (T * top_k <= 16), the rows sorted by expert, and more than 65535 pairs (the kernels'
// row loop past the grid's y limit); odd widths (hidden 200, I 72: not multiples of the 128-wide lane stride). Each
// token's result is the same bits alone as in any batch.
TEST(CudaMoe, Fp32ExpertsMatchCpuAtFp32Accuracy) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    const char* name;
    bool gated, sigmoid;
    int E, k;
    int64_t Hd, I;
    std::vector<int64_t> Ts;
  };
  const Case cases[] = {
      // 2, 14 and 16 pairs: unsorted rows; 18 and 122: sorted
      {"gated, softmax top-2 of 8", true, false, 8, 2, 200, 72, {1, 7, 8, 9, 61}},
      {"relu^2, grouped sigmoid top-3 of 8", false, true, 8, 3, 136, 72, {1, 5, 40}},
      {"gated, top-8 of 16, > 65535 pairs", true, false, 16, 8, 64, 32, {8200}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int E = c.E;
    const int64_t Hd = c.Hd, I = c.I, xs = Hd + 4, os = Hd + 8;
    cpu::MoeRouting r;
    r.top_k = c.k;
    if (c.sigmoid) {
      r.scoring = cpu::MoeRouting::Scoring::Sigmoid;
      r.routed_scaling_factor = 2.0f, r.n_group = 2, r.topk_group = 1;
      r.correction_bias = rand_vec(rng, E, -0.1f, 0.1f);
    }
    Weight gate = Weight::allocate(DType::F32, E, Hd);
    auto g = rand_vec(rng, E * Hd, -0.1f, 0.1f);
    std::memcpy(const_cast<void*>(gate.data), g.data(), g.size() * 4);
    std::vector<cpu::ExpertWeights> experts(E);
    std::vector<float> w1s, w3s, w2s;
    auto fill = [&](Weight& W, int64_t rows, int64_t cols, float a, std::vector<float>& stack) {
      W = Weight::allocate(DType::F32, rows, cols);
      auto v = rand_vec(rng, rows * cols, -a, a);
      std::memcpy(const_cast<void*>(W.data), v.data(), v.size() * 4);
      stack.insert(stack.end(), v.begin(), v.end());
    };
    const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
    for (int e = 0; e < E; ++e) {
      fill(experts[e].w1, I, Hd, hs, w1s);
      if (c.gated) fill(experts[e].w3, I, Hd, hs, w3s);
      fill(experts[e].w2, Hd, I, is, w2s);
    }
    DeviceBuffer d1 = to_device(w1s), d3 = c.gated ? to_device(w3s) : DeviceBuffer(4), d2 = to_device(w2s),
                 bias = c.sigmoid ? to_device(r.correction_bias) : DeviceBuffer(4);
    cuda::MoeDevWeights w{E, c.k, Hd, I, d1.data(), c.gated ? d3.data() : nullptr, d2.data(), device_routing(r, bias),
                          true};
    for (int64_t T : c.Ts) {
      SCOPED_TRACE(testing::Message() << "T=" << T);
      std::vector<float> x = rand_vec(rng, T * Hd);
      std::vector<float> ref(T * Hd), logits(T * E);
      cpu::sparse_moe(x.data(), T, Hd, gate, experts, r, ref.data());
      cpu::linear(x.data(), T, gate, nullptr, logits.data());
      std::vector<float> xpad(T * xs, 0.0f);
      for (int64_t t = 0; t < T; ++t) std::copy_n(x.data() + t * Hd, Hd, xpad.data() + t * xs);
      DeviceBuffer dx = to_device(xpad), dl = to_device(logits), dout = poisoned(T * os);
      DeviceBuffer ws(cuda::moe_workspace_bytes(T, w));
      SSM_CUDA_CHECK(
          cuda::sparse_moe(dx.as<float>(), xs, T, dl.as<float>(), w, dout.as<float>(), os, ws.data(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(dout, T * os);
      std::vector<float> refp(T * os, 0.0f);
      for (int64_t t = 0; t < T; ++t) std::copy_n(ref.data() + t * Hd, Hd, refp.data() + t * os);
      EXPECT_LT(rel_err(got.data(), os, refp.data(), os, T, Hd), 2e-5);
      if (T < 2) continue;
      // Batch-invariant: the last token alone (its top_k pairs on the unsorted rows) gives the bits of the batch.
      const int64_t t = T - 1;
      DeviceBuffer ox = to_device(std::vector<float>(xpad.begin() + t * xs, xpad.begin() + (t + 1) * xs)),
                   ol = to_device(std::vector<float>(logits.begin() + t * E, logits.begin() + (t + 1) * E)),
                   oo = poisoned(os), ows(cuda::moe_workspace_bytes(1, w));
      SSM_CUDA_CHECK(
          cuda::sparse_moe(ox.as<float>(), xs, 1, ol.as<float>(), w, oo.as<float>(), os, ows.data(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto alone = to_host<float>(oo, os);
      EXPECT_EQ(std::memcmp(alone.data(), got.data() + t * os, Hd * sizeof(float)), 0) << "token " << t << " alone";
    }
  }
}

/// Random bf16 experts (host Weights for the CPU, stacked bits for the device) and an fp32 router.
struct RandomExperts {
  Weight gate;
  std::vector<cpu::ExpertWeights> experts;
  DeviceBuffer d1, d3, d2;
  RandomExperts(std::mt19937& rng, int E, int64_t Hd, int64_t I) : experts(E) {
    gate = Weight::allocate(DType::F32, E, Hd);
    const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
    auto g = rand_vec(rng, E * Hd, -2 * hs, 2 * hs);
    std::memcpy(const_cast<void*>(gate.data), g.data(), g.size() * 4);
    std::vector<uint16_t> w1s, w3s, w2s;
    auto fill = [&](Weight& W, int64_t r, int64_t c, float a, std::vector<uint16_t>& stack) {
      W = Weight::allocate(DType::BF16, r, c);
      auto b = to_bf16_bits(rand_vec(rng, r * c, -a, a));
      std::memcpy(const_cast<void*>(W.data), b.data(), b.size() * 2);
      stack.insert(stack.end(), b.begin(), b.end());
    };
    for (int e = 0; e < E; ++e) fill(experts[e].w1, I, Hd, hs, w1s), fill(experts[e].w3, I, Hd, hs, w3s), fill(experts[e].w2, Hd, I, is, w2s);
    d1 = to_device(w1s), d3 = to_device(w3s), d2 = to_device(w2s);
  }
};

// ---- Per-pair GEMVs (KernelTuning::moe_pair_gemv) against the old kernels ---------------------------------------

struct PairGemvCase {
  const char* name;
  int E, k;  // experts (fewer than the model's: the kernels only see the chosen ones), the model's top_k
  int64_t Hd, I;
  bool gated;
};

// The new per-pair GEMVs give the old kernels' bits: the whole workspace (ids, weights, pair rows, act, y; both runs
// start from the same byte pattern; unsorted rows only, see below) and the output, memcmp. Expert shapes of configs/nemotron-3-nano-30b-a3b (hidden
// 2688, moe_intermediate 1856, relu^2, top-6), configs/qwen3.5-35b-a3b (2048, 512, SiLU-gated, top-8) and
// configs/granite-4.0-h-tiny (1536, 512, SiLU-gated, top-6), and odd sizes: K = 8 * odd (616, 360, 40: lanes past K
// on the last chunk, K < 256; down K = 2056: lane 0 alone on the last chunk), I not a multiple of the rows per warp
// or of a block's rows (104, 168, 24, 2056: so wide that one wave holds few pair rows and, capped, each block loops
// over several, restaging x in shared memory, also in SSMSERVE_CUDA_TEST_QUICK mode for compute-sanitizer).
// P = 1, 2, 6, 8, 16 pairs (top_k varied to reach them) and the model's top_k at T = 1, 2 on the unsorted rows, and
// T = 9 with MoeDevWeights::per_pair (the rows sorted by expert); every rows-per-warp / warps-per-block shape and the
// rule's, each with the full grid and capped at one wave (blocks looping over pair rows); without PDL, with it, and
// with it and KernelTuning::moe_pair_preload (the down GEMV reads its experts and loads its first weight chunks before
// its wait: a read of ids before the router had finished would see the workspace's 0x5a pattern, an expert far out
// of range).
TEST(CudaMoe, PairGemvMatchesOldKernelsBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<PairGemvCase> cases = {{"odd gated", 8, 3, 616, 104, true},
                                     {"odd relu^2", 8, 2, 360, 168, false},
                                     {"tiny K", 8, 2, 40, 24, true},
                                     {"wide I gated", 8, 2, 72, 2056, true},
                                     {"wide I relu^2", 8, 2, 72, 2056, false}};
  if (!quick()) {
    cases.push_back({"nemotron-3-nano-30b-a3b", 16, 6, 2688, 1856, false});
    cases.push_back({"qwen3.5-35b-a3b", 16, 8, 2048, 512, true});
    cases.push_back({"granite-4.0-h-tiny", 16, 6, 1536, 512, true});
  }
  cudaStream_t stream;
  SSM_CUDA_CHECK(cudaStreamCreate(&stream));
  struct Shape {
    int rows, warps;  // 0: the rule
    bool one_wave;
  };
  std::vector<Shape> shapes = {{0, 0, false}, {0, 0, true}};
  for (int r : {1, 2, 4})
    for (int wp : {4, 8})
      for (bool ow : {false, true}) shapes.push_back({r, wp, ow});
  int runs = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t Hd = c.Hd, I = c.I, xs = Hd + 4, os = Hd + 8;
    const float hs = 1.0f / std::sqrt(static_cast<float>(Hd)), is = 1.0f / std::sqrt(static_cast<float>(I));
    DeviceBuffer d1 = to_device(fast_bf16(c.E * I * Hd, hs, rng())),
                 d3 = c.gated ? to_device(fast_bf16(c.E * I * Hd, hs, rng())) : DeviceBuffer(16),
                 d2 = to_device(fast_bf16(c.E * Hd * I, 4 * is, rng()));
    struct Run {
      int64_t T;
      int k;
      bool per_pair;
    };
    std::vector<Run> run_list = {{1, 1, false}, {1, 2, false}, {1, 6, false}, {1, 8, false},  {2, 8, false},
                                 {16, 1, false}, {1, c.k, false}, {2, c.k, false}, {9, c.k, true}};
    for (const Run& rr : run_list) {
      const int64_t T = rr.T;
      SCOPED_TRACE(testing::Message() << "T=" << T << " top_k=" << rr.k << (rr.per_pair ? " per_pair" : ""));
      cuda::MoeDevWeights w{c.E, rr.k, Hd, I, d1.data(), c.gated ? d3.data() : nullptr, d2.data(),
                           cuda::MoeRouteParams{}};
      w.per_pair = rr.per_pair;
      std::vector<float> xpad = rand_vec(rng, T * xs, -2.0f, 2.0f);  // not bf16 values: the staging rounds them
      DeviceBuffer dx = to_device(xpad), dl = to_device(rand_vec(rng, T * c.E, -3.0f, 3.0f));
      const size_t wsb = cuda::moe_workspace_bytes(T, w);
      auto run = [&](bool gemv, const Shape& sh, bool pdl, bool preload) {
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.moe_pair_gemv = gemv, t.moe_pair_rows = sh.rows, t.moe_pair_warps = sh.warps;
        t.moe_pair_one_wave = sh.one_wave, t.moe_pair_preload = preload;
        t.moe_down_combine = 0;  // the down GEMV's y rows in the workspace (test_cuda_moe_down_combine: the fused form)
        TuningScope scope(t);
        DeviceBuffer ws(wsb), out = poisoned(T * os);
        ws.fill_bytes(0x5a);
        SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), xs, T, dl.as<float>(), w, out.as<float>(), os, ws.data(),
                                        stream, pdl));
        SSM_CUDA_CHECK(cudaStreamSynchronize(stream));
        return std::make_pair(to_host<uint8_t>(ws, wsb), to_host<uint8_t>(out, T * os * 4));
      };
      const auto old = run(false, Shape{0, 0, false}, false, false);
      for (const Shape& sh : shapes) {
        for (int mode = 0; mode < 3; ++mode) {  // no PDL; PDL; PDL with the down GEMV's loads before its wait
          const bool pdl = mode > 0, preload = mode == 2;
          SCOPED_TRACE(testing::Message() << "rows " << sh.rows << " warps " << sh.warps << " one_wave " << sh.one_wave
                                          << " pdl " << pdl << " preload " << preload);
          const auto got = run(true, sh, pdl, preload);
          ++runs;
          ASSERT_EQ(got.first.size(), old.first.size());
          // Above 16 pairs the rows are sorted by expert, and sort_kernel places the pairs of one expert in the
          // order its atomics run: sorted / pair_row and the act / y rows they index may be permuted between runs
          // (each pair's row is still computed alone, so the output below is the same bits).
          if (T * rr.k <= 16) {
            size_t diff = 0;
            while (diff < wsb && got.first[diff] == old.first[diff]) ++diff;
            EXPECT_EQ(diff, wsb) << "workspace differs from byte " << diff << " of " << wsb;
          }
          EXPECT_EQ(std::memcmp(got.second.data(), old.second.data(), got.second.size()), 0) << "output differs";
        }
      }
    }
  }
  SSM_CUDA_CHECK(cudaStreamDestroy(stream));
  std::printf("per-pair GEMVs: %d runs bit-identical to the old kernels\n", runs);
}

// Qwen's many small experts: softmax top-k renormalized (norm_topk_prob) over 256 experts top-8 (Qwen3.5) and 512
// top-10 (Qwen3-Next), on the per-pair path (T * top_k <= 16 unsorted; up to 2 pairs per expert on sorted rows) and
// the grouped GEMMs (T = 300: most experts hold a few rows); with KernelTuning::moe_pair_sorted off, the grouped GEMMs
// from 17 pairs.
TEST(CudaMoe, QwenManySmallExpertsMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    const char* name;
    int E, k;
  };
  for (const Case& c : {Case{"Qwen3.5 256 experts top-8", 256, 8}, Case{"Qwen3-Next 512 experts top-10", 512, 10}}) {
    SCOPED_TRACE(c.name);
    const int64_t Hd = 128, I = 32;  // small widths, the real expert counts
    RandomExperts rx(rng, c.E, Hd, I);
    cpu::MoeRouting r;
    r.top_k = c.k;
    cuda::MoeDevWeights w{c.E, c.k, Hd, I, rx.d1.data(), rx.d3.data(), rx.d2.data(), cuda::MoeRouteParams{}};
    for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{5}, quick() ? int64_t{40} : int64_t{300}}) {
      SCOPED_TRACE(testing::Message() << "T=" << T);
      std::vector<float> x = rand_vec(rng, T * Hd);
      round_bf16(x);
      std::vector<float> ref(T * Hd), logits(T * c.E);
      cpu::sparse_moe(x.data(), T, Hd, rx.gate, rx.experts, r, ref.data());
      cpu::linear(x.data(), T, rx.gate, nullptr, logits.data());
      // The router alone: the same experts with the same weights.
      std::vector<int32_t> ids(T * c.k);
      std::vector<float> wts(T * c.k);
      cpu::moe_route(logits.data(), T, c.E, r, ids.data(), wts.data());
      DeviceBuffer dx = to_device(x), dl = to_device(logits), dout = poisoned(T * Hd), ws(cuda::moe_workspace_bytes(T, w));
      DeviceBuffer di(T * c.k * 4), dw(T * c.k * 4);
      SSM_CUDA_CHECK(cuda::moe_route(dl.as<float>(), T, c.E, c.k, cuda::MoeRouteParams{}, di.as<int32_t>(), dw.as<float>(), nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(to_host<int32_t>(di, T * c.k), ids);
      const auto gw = to_host<float>(dw, T * c.k);
      for (int64_t i = 0; i < T * c.k; ++i) EXPECT_NEAR(gw[i], wts[i], 1e-6f) << i;
      for (bool sorted : {true, false}) {  // T = 5 and 40: the per-pair GEMVs on sorted rows, or the grouped GEMMs
        SCOPED_TRACE(testing::Message() << "moe_pair_sorted " << sorted);
        cuda::KernelTuning t = cuda::kernel_tuning();
        t.moe_pair_sorted = sorted;
        TuningScope scope(t);
        SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), Hd, T, dl.as<float>(), w, dout.as<float>(), Hd, ws.data(), nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto got = to_host<float>(dout, T * Hd);
        EXPECT_LT(rel_err(got.data(), Hd, ref.data(), Hd, T, Hd), 1e-2);
      }
    }
  }
  DeviceBuffer dummy(16);  // 513 experts or top-17: refused before any pointer is read
  cuda::MoeDevWeights big{513, 8, 128, 32, dummy.data(), dummy.data(), dummy.data(), cuda::MoeRouteParams{}};
  EXPECT_EQ(cuda::sparse_moe(nullptr, 128, 1, nullptr, big, nullptr, 128, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::moe_route(nullptr, 1, 512, 17, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

// The Qwen3.5-35B-A3B layer (hidden 2048, 256 experts of I = 512, top-8) against the CPU at a decode and a prefill
// batch, then the GPU time of sparse_moe per batch size (printed: the per-pair path up to 2 pairs per expert, T <= 64,
// sorted by expert from T = 3; the grouped GEMMs above, whose 128-row expert tiles small batches fill mostly with
// padding). Not in quick mode (1.6 GB of experts).
TEST(CudaMoe, Qwen35LayerShapeMatchesCpuAndTimings) {
  REQUIRE_GPU();
  if (quick()) GTEST_SKIP() << "large shape";
  std::mt19937 rng(1234);
  const int E = 256, K = 8;
  const int64_t Hd = 2048, I = 512;
  RandomExperts rx(rng, E, Hd, I);
  cpu::MoeRouting r;
  r.top_k = K;
  cuda::MoeDevWeights w{E, K, Hd, I, rx.d1.data(), rx.d3.data(), rx.d2.data(), cuda::MoeRouteParams{}};
  for (int64_t T : {int64_t{2}, int64_t{64}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T);
    std::vector<float> x = rand_vec(rng, T * Hd);
    round_bf16(x);
    std::vector<float> ref(T * Hd), logits(T * E);
    cpu::sparse_moe(x.data(), T, Hd, rx.gate, rx.experts, r, ref.data());
    cpu::linear(x.data(), T, rx.gate, nullptr, logits.data());
    DeviceBuffer dx = to_device(x), dl = to_device(logits), dout = poisoned(T * Hd), ws(cuda::moe_workspace_bytes(T, w));
    SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), Hd, T, dl.as<float>(), w, dout.as<float>(), Hd, ws.data(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = to_host<float>(dout, T * Hd);
    EXPECT_LT(rel_err(got.data(), Hd, ref.data(), Hd, T, Hd), 1e-2);
  }
  cudaEvent_t a, b;
  SSM_CUDA_CHECK(cudaEventCreate(&a));
  SSM_CUDA_CHECK(cudaEventCreate(&b));
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{16}, int64_t{64}, int64_t{256}, int64_t{2048}, int64_t{8192}}) {
    std::vector<float> x = rand_vec(rng, T * Hd), logits = rand_vec(rng, T * E, -2.0f, 2.0f);
    DeviceBuffer dx = to_device(x), dl = to_device(logits), dout(T * Hd * 4), ws(cuda::moe_workspace_bytes(T, w));
    auto run = [&] { SSM_CUDA_CHECK(cuda::sparse_moe(dx.as<float>(), Hd, T, dl.as<float>(), w, dout.as<float>(), Hd, ws.data(), nullptr)); };
    run();
    const int reps = 20;
    SSM_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) run();
    SSM_CUDA_CHECK(cudaEventRecord(b));
    SSM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    std::printf("qwen3.5-35b-a3b moe layer (E 256, top-8, I 512, hidden 2048): T %5lld  %.3f ms  (%.1f us / token)\n",
                static_cast<long long>(T), ms / reps, 1000.0 * ms / reps / static_cast<double>(T));
  }
  SSM_CUDA_CHECK(cudaEventDestroy(a));
  SSM_CUDA_CHECK(cudaEventDestroy(b));
}

}  // namespace
}  // namespace ssmserve
