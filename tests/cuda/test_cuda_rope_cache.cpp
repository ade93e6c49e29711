// GPU op harness of the attention projections' per-token kernels (kernels/cuda/rope_cache.cu): RoPE against the CPU,
// and the fused q / k norm + RoPE + cache write bit-identical to the three launches it replaces. Fresh random inputs
// per run. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/head_rms_norm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cpu/rope.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

TEST(CudaRope, MatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 128, 256}) {
    const int H = 6, T = 50;
    const int64_t xs = H * D + 4;
    auto x = rand_vec(rng, T * xs);
    std::vector<int32_t> pos(T);
    std::uniform_int_distribution<int32_t> dp(0, 70000);
    for (auto& v : pos) v = dp(rng);
    auto inv = cpu::rope_inv_freq(1e6, D);
    DeviceBuffer dx = to_device(x), dpos = to_device(pos), dinv = to_device(inv);
    cpu::apply_rope(x.data(), xs, T, H, D, pos, inv);
    SSM_CUDA_CHECK(cuda::apply_rope(dx.as<float>(), xs, T, H, D, dpos.as<int32_t>(), dinv.as<float>(), D / 2, nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    auto got = to_host<float>(dx, T * xs);
    EXPECT_LT(rel_err(got.data(), xs, x.data(), xs, T, H * D), 1e-5) << "D=" << D;
  }
}

// The attention module's fused epilogue (qk_norm_rope_cache over a [q | k | v | gate] row) against the three launches
// it replaces (head_rms_norm_qk, apply_rope over the q and k heads, reshape_and_cache): the rows and the cache
// bit-identical, with and without the norm and RoPE (partial rotary included), a skipped slot (-1) left untouched.
TEST(CudaRope, NormRopeCacheEqualsThreeLaunches) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 256}) {
    for (int mode = 0; mode < 4; ++mode) {  // bit 1: norm, bit 2: RoPE
      const bool norm = mode & 1, rope = mode & 2;
      SCOPED_TRACE(testing::Message() << "D " << D << " norm " << norm << " rope " << rope);
      const int H = 8, K = 2, T = 13, bs = 4, blocks = 6, half = D / 4;  // a quarter-width rotary (Qwen3.5's)
      const int64_t xs = int64_t{2 * H + 2 * K} * D;  // q, k, v, gate
      auto x = rand_vec(rng, T * xs, -3.0f, 3.0f);
      auto wq = rand_vec(rng, D, 0.5f, 1.5f), wk = rand_vec(rng, D, 0.5f, 1.5f);
      std::vector<int32_t> pos(T), slots(T);
      std::uniform_int_distribution<int32_t> dp(0, 70000);
      for (auto& v : pos) v = dp(rng);
      for (int t = 0; t < T; ++t) slots[t] = t == 3 ? -1 : (t * 7) % (bs * blocks);  // distinct slots, one skipped
      const auto inv = cpu::rope_inv_freq(1e6, 2 * half);
      const int64_t page_bytes = int64_t{2} * bs * K * D * 4;
      auto poison = rand_vec(rng, static_cast<size_t>(page_bytes / 4 * blocks));
      DeviceBuffer xa = to_device(x), xb = to_device(x), ca = to_device(poison), cb = to_device(poison);
      DeviceBuffer dq = to_device(wq), dk = to_device(wk), dpos = to_device(pos), dslots = to_device(slots), dinv = to_device(inv);
      const KvCacheView va{static_cast<std::byte*>(ca.data()), page_bytes, 0, bs, K, D};
      const KvCacheView vb{static_cast<std::byte*>(cb.data()), page_bytes, 0, bs, K, D};
      float* a = xa.as<float>();
      if (norm) SSM_CUDA_CHECK(cuda::head_rms_norm_qk(a, xs, T, H, K, D, dq.as<float>(), dk.as<float>(), 1e-6f, nullptr));
      if (rope) SSM_CUDA_CHECK(cuda::apply_rope(a, xs, T, H + K, D, dpos.as<int32_t>(), dinv.as<float>(), half, nullptr));
      SSM_CUDA_CHECK(cuda::reshape_and_cache(a + H * D, xs, a + (H + K) * D, xs, T, dslots.as<int32_t>(), va, nullptr));
      SSM_CUDA_CHECK(cuda::qk_norm_rope_cache(xb.as<float>(), xs, T, H, norm ? dq.as<float>() : nullptr,
                                              norm ? dk.as<float>() : nullptr, 1e-6f, rope ? dpos.as<int32_t>() : nullptr,
                                              rope ? dinv.as<float>() : nullptr, half, dslots.as<int32_t>(), vb, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto ra = to_host<float>(xa, T * xs), rb = to_host<float>(xb, T * xs);
      EXPECT_EQ(std::memcmp(ra.data(), rb.data(), ra.size() * sizeof(float)), 0) << "rows";
      const auto ka = to_host<float>(ca, poison.size()), kb = to_host<float>(cb, poison.size());
      EXPECT_EQ(std::memcmp(ka.data(), kb.data(), ka.size() * sizeof(float)), 0) << "KV cache";
    }
  }
  DeviceBuffer d(4096);
  const KvCacheView kv{static_cast<std::byte*>(d.data()), 2048, 0, 1, 1, 64};
  EXPECT_EQ(cuda::qk_norm_rope_cache(d.as<float>(), 64 * 2, 1, 1, nullptr, nullptr, 0.f, nullptr, nullptr, 0, d.as<int32_t>(), kv,
                                     nullptr), cudaErrorInvalidValue);  // stride < q + k + v
}

}  // namespace
}  // namespace ssmserve
