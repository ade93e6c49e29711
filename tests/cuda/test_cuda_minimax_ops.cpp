// GPU op harness of the MiniMax hybrid's lightning attention (issue 8): prefill / decode against the CPU kernel (the
// reference) on the shapes (head_dim 64 and 128, block sizes 64 and 256, slopes up to 0.95, lengths 1, 255,
// 256, 257, 700, initial states, null rows, chunked continuation, every walk variant), with fresh random inputs per
// run and poisoned outputs (paged attention: test_cuda_paged_attention.cpp; the MoE block: test_cuda_moe_ops.cpp).
// Skips without a GPU; SSMSERVE_CUDA_TEST_QUICK=1 keeps the small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <cstdlib>
#include <cstring>
#include <span>

#include "core/error.h"
#include "cuda_test_util.h"
#include "sequential_rows.h"
#include "device/cuda_check.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cpu/linear.h"
#include "model/weight.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;


// ---- lightning attention -----------------------------------------------------------------------------------------

/// One lightning layer on host and device: slopes, a state pool of `blocks` blocks.
struct LightningLayer {
  int H, D, bs;
  std::vector<float> slopes;
  DeviceBuffer dslopes;
  StatePool pool;
  LightningLayer(int h, int d, int b, DType t, int blocks, std::mt19937& rng)
      : H(h), D(d), bs(b), pool(t, static_cast<int64_t>(h) * d * d, blocks, rng, 0.5f) {
    const float base[] = {0.95f, 0.3f, 0.05f, 0.001f};
    for (int i = 0; i < H; ++i) slopes.push_back(base[i % 4]);
    dslopes = to_device(slopes);
  }
  cpu::LightningParams host() { return {H, D, bs, slopes.data(), pool.host_view()}; }
  cuda::LightningDevParams dev() { return {H, D, bs, dslopes.as<float>(), pool.dev_view()}; }
};

/// Runs the GPU prefill for one step (plan built and uploaded here); returns nothing, output in dout.
void gpu_prefill(LightningLayer& L, const DeviceBuffer& dqkv, int64_t qs, DeviceBuffer& dout, int64_t os,
                 const std::vector<int32_t>& qsl, const std::vector<int32_t>& nc, const std::vector<int32_t>& idx) {
  auto plan = cuda::LightningPlan::build(qsl, nc, L.bs);
  DeviceBuffer db = to_device(plan.blocks), df = to_device(plan.seq_first_block), dq = to_device(plan.qtiles),
               di = to_device(idx), dn = to_device(nc);
  DeviceBuffer ws(std::max<size_t>(4, cuda::lightning_workspace_floats(plan.num_blocks, L.H, L.D) * 4));
  cuda::LightningPlanDev pd{plan.num_seqs, plan.num_blocks, plan.num_qtiles, db.as<int32_t>(), df.as<int32_t>(),
                            dq.as<int32_t>(), di.as<int32_t>(), dn.as<int32_t>()};
  SSM_CUDA_CHECK(cuda::lightning_prefill(dqkv.as<float>(), qs, dout.as<float>(), os, L.dev(), pd, ws.as<float>(), nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
}

struct LightningCase {
  int D, bs;
  DType state;
};
std::vector<LightningCase> lightning_cases() {
  std::vector<LightningCase> c = {{64, 64, DType::F32}, {128, 256, DType::F32}};
  if (!quick()) {
    c.push_back({64, 256, DType::F32});
    c.push_back({128, 64, DType::F32});
    c.push_back({128, 256, DType::BF16});
  }
  return c;
}

TEST(CudaLightning, PrefillMatchesCpuRaggedWithInitialStates) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& lc : lightning_cases()) {
    SCOPED_TRACE(testing::Message() << "D=" << lc.D << " bs=" << lc.bs << " state " << dtype_name(lc.state));
    const int H = 4;
    // Lengths 1, 255, 256, 257, 700 (quick: 1, 65, 130), some continuing (num_computed > 0, off-grid), a null row.
    std::vector<int32_t> lens = quick() ? std::vector<int32_t>{1, 65, 130, 3} : std::vector<int32_t>{1, 255, 256, 257, 700, 9};
    std::vector<int32_t> nc = quick() ? std::vector<int32_t>{5, 0, 70, 0} : std::vector<int32_t>{5, 0, 100, 513, 37, 0};
    std::vector<int32_t> idx;
    for (size_t s = 0; s < lens.size(); ++s) idx.push_back(s == 3 ? 0 : static_cast<int32_t>(s + 1));
    std::vector<int32_t> qsl{0};
    for (int32_t n : lens) qsl.push_back(qsl.back() + n);
    const int64_t T = qsl.back(), qs = 3LL * H * lc.D + 4, os = static_cast<int64_t>(H) * lc.D + 8;
    LightningLayer L(H, lc.D, lc.bs, lc.state, static_cast<int>(lens.size()) + 1, rng);
    auto qkv = rand_vec(rng, T * qs);
    round_bf16(qkv);
    std::vector<float> ref(T * os, 0.0f);
    cpu::lightning_prefill(qkv.data(), qs, ref.data(), os, L.host(), qsl, nc, idx);
    DeviceBuffer dqkv = to_device(qkv), dout = poisoned(T * os);
    gpu_prefill(L, dqkv, qs, dout, os, qsl, nc, idx);
    auto got = to_host<float>(dout, T * os);
    const double tol = lc.state == DType::F32 ? 1e-4 : 1e-2;
    // Per sequence, so a wrong short row is not hidden by a long one.
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t t0 = qsl[s];
      EXPECT_LT(rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, lens[s], H * lc.D), idx[s] ? tol : 1e-30)
          << "out of sequence " << s << " (len " << lens[s] << ", computed " << nc[s] << ")";
    }
    EXPECT_LT(L.pool.rel_err_blocks(idx), lc.state == DType::F32 ? 1e-4 : 1e-2) << "final states";
    EXPECT_TRUE(L.pool.null_block_intact());
  }
}

TEST(CudaLightning, ChunkedContinuationMatchesOneShotCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& lc : lightning_cases()) {
    if (lc.state != DType::F32) continue;
    SCOPED_TRACE(testing::Message() << "D=" << lc.D << " bs=" << lc.bs);
    const int H = 2, n = quick() ? 200 : 700;
    const int64_t qs = 3LL * H * lc.D, os = static_cast<int64_t>(H) * lc.D;
    LightningLayer L(H, lc.D, lc.bs, DType::F32, 2, rng);
    auto qkv = rand_vec(rng, n * qs);
    round_bf16(qkv);
    std::vector<float> ref(n * os);
    const std::vector<int32_t> idx{1};
    // CPU, one shot from zeros.
    cpu::lightning_prefill(qkv.data(), qs, ref.data(), os, L.host(), std::vector<int32_t>{0, n}, std::vector<int32_t>{0}, idx);
    // GPU: chunks of 1, 63, 100, 257, rest (continuations start off the block grid).
    DeviceBuffer dqkv = to_device(qkv), dout = poisoned(n * os);
    std::vector<int32_t> cuts{0, 1, 64, quick() ? 120 : 164, quick() ? 150 : 421, n};
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int32_t a = cuts[c], len = cuts[c + 1] - a;
      DeviceBuffer chunk_q(len * qs * 4), chunk_o = poisoned(len * os);
      chunk_q.upload(qkv.data() + a * qs, len * qs * 4);
      gpu_prefill(L, chunk_q, qs, chunk_o, os, {0, len}, {a}, idx);
      auto o = to_host<float>(chunk_o, len * os);
      std::vector<float> all = to_host<float>(dout, n * os);
      std::copy(o.begin(), o.end(), all.begin() + a * os);
      dout.upload(all.data(), all.size() * 4);
    }
    auto got = to_host<float>(dout, n * os);
    EXPECT_LT(rel_err(got.data(), os, ref.data(), os, n, os), 1e-4);
    EXPECT_LT(L.pool.rel_err_blocks(idx), 1e-4) << "final state";
  }
}

/// Runs the bf16 fast path for one step: qkv rounded to bf16 on upload, output bf16 widened back to fp32 (or the
/// fp32-output variant when f32_out).
std::vector<float> gpu_prefill_bf16(LightningLayer& L, const std::vector<float>& qkv, int64_t qs, int64_t T, int64_t os,
                                    const std::vector<int32_t>& qsl, const std::vector<int32_t>& nc,
                                    const std::vector<int32_t>& idx, int blocks_per_range, bool f32_out = false) {
  auto plan = cuda::LightningPlan::build(qsl, nc, L.bs, blocks_per_range);
  DeviceBuffer db = to_device(plan.blocks), df = to_device(plan.seq_first_block), dq = to_device(plan.qtiles),
               di = to_device(idx), dn = to_device(nc), dqkv = to_device(to_bf16_bits(qkv));
  DeviceBuffer dr = to_device(plan.ranges), dfr = to_device(plan.seq_first_range), dbr = to_device(plan.block_range);
  DeviceBuffer dout(std::max<int64_t>(4, T * os * (f32_out ? 4 : 2)));
  dout.fill_bytes(0xff);
  DeviceBuffer ws(std::max<size_t>(4, cuda::lightning_workspace_floats(plan.num_blocks, L.H, L.D) * 4));
  cuda::LightningPlanDev pd{plan.num_seqs, plan.num_blocks, plan.num_qtiles, db.as<int32_t>(), df.as<int32_t>(),
                            dq.as<int32_t>(), di.as<int32_t>(), dn.as<int32_t>(), plan.num_ranges, dr.as<int32_t>(),
                            dfr.as<int32_t>(), dbr.as<int32_t>()};
  const auto* q16 = static_cast<const __nv_bfloat16*>(dqkv.data());
  if (f32_out) {
    SSM_CUDA_CHECK(cuda::lightning_prefill_bf16(q16, qs, dout.as<float>(), os, L.dev(), pd, ws.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<float>(dout, T * os);
  }
  SSM_CUDA_CHECK(cuda::lightning_prefill_bf16(q16, qs, static_cast<__nv_bfloat16*>(dout.data()), os, L.dev(), pd,
                                              ws.as<float>(), nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto bits = to_host<uint16_t>(dout, T * os);
  std::vector<float> got(T * os);
  for (int64_t i = 0; i < T * os; ++i) got[i] = bf16_to_f32(bits[i]);
  return got;
}

// The bf16 fast path against the same CPU reference (fp32 recurrence on the bf16-rounded inputs): same shapes, ragged
// batch with initial states, null row (bf16 output), then chunked continuation (fp32 output); bf16 tolerance (one bf16
// operand per product).
void check_bf16_prefill() {
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const double tol = 2e-2, state_tol = 1e-2;
  const auto cases = lightning_cases();
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const auto& lc = cases[ci];
    // Blocks per range (the unit of state passing): multi-block ranges in quick mode too, one-block ranges in full.
    const int bpr = std::vector<int>{3, 2, 1, 3, 2}[ci % 5];
    SCOPED_TRACE(testing::Message() << "D=" << lc.D << " bs=" << lc.bs << " state " << dtype_name(lc.state)
                                    << " blocks_per_range " << bpr);
    const int H = 4;
    std::vector<int32_t> lens = quick() ? std::vector<int32_t>{1, 65, 130, 3} : std::vector<int32_t>{1, 255, 256, 257, 700, 9};
    std::vector<int32_t> nc = quick() ? std::vector<int32_t>{5, 0, 70, 0} : std::vector<int32_t>{5, 0, 100, 513, 37, 0};
    std::vector<int32_t> idx;
    for (size_t s = 0; s < lens.size(); ++s) idx.push_back(s == 3 ? 0 : static_cast<int32_t>(s + 1));
    std::vector<int32_t> qsl{0};
    for (int32_t n : lens) qsl.push_back(qsl.back() + n);
    const int64_t T = qsl.back(), qs = 3LL * H * lc.D + 8, os = static_cast<int64_t>(H) * lc.D + 8;
    LightningLayer L(H, lc.D, lc.bs, lc.state, static_cast<int>(lens.size()) + 1, rng);
    L.slopes[3] = 2.0f;  // a steep head (decays far below fp32's range across a block)
    L.dslopes = to_device(L.slopes);
    auto qkv = rand_vec(rng, T * qs);
    round_bf16(qkv);
    std::vector<float> ref(T * os, 0.0f);
    cpu::lightning_prefill(qkv.data(), qs, ref.data(), os, L.host(), qsl, nc, idx);
    auto got = gpu_prefill_bf16(L, qkv, qs, T, os, qsl, nc, idx, bpr);
    for (size_t s = 0; s < lens.size(); ++s) {
      const int64_t t0 = qsl[s];
      EXPECT_LT(rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, lens[s], H * lc.D), idx[s] ? tol : 1e-30)
          << "out of sequence " << s << " (len " << lens[s] << ", computed " << nc[s] << ")";
    }
    EXPECT_LT(L.pool.rel_err_blocks(idx), state_tol) << "final states";
    EXPECT_TRUE(L.pool.null_block_intact());
    if (lc.state != DType::F32) continue;
    // Chunked continuation (cuts off the block grid) against the one-shot CPU prefill.
    const int n = quick() ? 200 : 700;
    const int64_t qs2 = 3LL * 2 * lc.D, os2 = 2LL * lc.D;
    LightningLayer L2(2, lc.D, lc.bs, DType::F32, 2, rng);
    auto q2 = rand_vec(rng, n * qs2);
    round_bf16(q2);
    std::vector<float> ref2(n * os2), all(n * os2);
    cpu::lightning_prefill(q2.data(), qs2, ref2.data(), os2, L2.host(), std::vector<int32_t>{0, n}, std::vector<int32_t>{0},
                           std::vector<int32_t>{1});
    std::vector<int32_t> cuts{0, 1, 64, quick() ? 120 : 164, quick() ? 150 : 421, n};
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const int32_t a = cuts[c], len = cuts[c + 1] - a;
      std::vector<float> chunk(q2.begin() + a * qs2, q2.begin() + (a + len) * qs2);
      auto o = gpu_prefill_bf16(L2, chunk, qs2, len, os2, {0, len}, {a}, {1}, 2, /*f32_out=*/true);
      std::copy(o.begin(), o.end(), all.begin() + a * os2);
    }
    EXPECT_LT(rel_err(all.data(), os2, ref2.data(), os2, n, os2), tol) << "chunked continuation";
    EXPECT_LT(L2.pool.rel_err_blocks({1}), state_tol) << "chunked continuation: final state";
  }
}

// Default: the range walk (per-range CTAs carrying the state through 64-token chunks) on warpgroups (wgmma) for
// head_dim 128, on mma.sync for 64.
TEST(CudaLightning, Bf16PrefillMatchesCpuWithinBf16Tolerance) {
  REQUIRE_GPU();
  check_bf16_prefill();
}
// The walk's switches (KernelTuning, set from SSMSERVE_LIGHTNING_WALK / _KV_WG by the backend): lightning_walk = 1
// (the mma.sync range walk for both head dims), lightning_kv_wg = false (step 1 on mma.sync). The kernels read
// kernel_tuning(), so the test sets it directly (setting the environment here would change nothing).
TEST(CudaLightning, Bf16PrefillWalkVariantsMatchCpu) {
  REQUIRE_GPU();
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  for (int variant = 0; variant < 2; ++variant) {
    SCOPED_TRACE(variant == 0 ? "lightning_walk 1" : "lightning_kv_wg off");
    cuda::KernelTuning t = saved;
    if (variant == 0) t.lightning_walk = 1;
    else t.lightning_kv_wg = false;
    cuda::set_kernel_tuning(t);
    check_bf16_prefill();
  }
  cuda::set_kernel_tuning(saved);
}
// lightning_walk = 0: per-block states through memory and the per-tile output kernel.
TEST(CudaLightning, Bf16PrefillBlockStatesMatchesCpu) {
  REQUIRE_GPU();
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  cuda::KernelTuning t = saved;
  t.lightning_walk = 0;
  cuda::set_kernel_tuning(t);
  check_bf16_prefill();
  cuda::set_kernel_tuning(saved);
}

TEST(CudaLightning, DecodeMatchesCpuAndSkipsNullRows) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 128}) {
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " " << dtype_name(t));
      const int H = 4;
      const std::vector<int32_t> idx{3, 0, 1, 5, 0, 2};
      const int B = static_cast<int>(idx.size());
      const int64_t qs = 3LL * H * D + 4, os = static_cast<int64_t>(H) * D + 4;
      LightningLayer L(H, D, 256, t, 6, rng);
      auto qkv = rand_vec(rng, B * qs);
      std::vector<float> ref(B * os, 0.0f);
      cpu::lightning_decode(qkv.data(), qs, ref.data(), os, L.host(), idx);
      DeviceBuffer dqkv = to_device(qkv), dout = poisoned(B * os), di = to_device(idx);
      for (int step = 0; step < 3; ++step) {  // repeated steps: the state carries
        if (step > 0) cpu::lightning_decode(qkv.data(), qs, ref.data(), os, L.host(), idx);
        SSM_CUDA_CHECK(cuda::lightning_decode(dqkv.as<float>(), qs, dout.as<float>(), os, L.dev(), di.as<int32_t>(), B, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
      }
      auto got = to_host<float>(dout, B * os);
      const double tol = t == DType::F32 ? 1e-5 : 1e-2;
      EXPECT_LT(rel_err(got.data(), os, ref.data(), os, B, H * D), tol);
      EXPECT_LT(L.pool.rel_err_blocks(idx), tol);
      EXPECT_TRUE(L.pool.null_block_intact());
      for (int r = 0; r < B; ++r) {
        if (idx[r] != 0) continue;
        for (int c = 0; c < H * D; ++c) ASSERT_EQ(got[r * os + c], 0.0f) << "null row " << r;
      }
    }
  }
}

// Batch-invariant mode: lightning_prefill_sequential on random rows (lengths 1..300, initial states, a null row,
// stores at random offsets, plan blocks of 64 so the walk crosses blocks and store cuts) equals, bit for bit, the same
// tokens fed one at a time through lightning_decode (outputs, final states, stored states), and the CPU decode fed
// the same way within the prefill test's tolerances.
TEST(CudaLightning, SequentialPrefillEqualsDecodeBitForBit) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int D : {64, 128}) {
    for (DType t : {DType::F32, DType::BF16}) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " " << dtype_name(t));
      const int H = 4, bs = 64;
      const SeqRows r = SeqRows::random(rng, quick() ? 5 : 8, quick() ? 100 : 300, 2, true);
      LightningLayer L(H, D, bs, t, r.num_blocks(), rng);
      const int64_t bb = static_cast<int64_t>(H) * D * D * dtype_size(t);
      for (int s = 0; s < r.n(); ++s)  // rows without an initial state: zeroed blocks, where the decode walk starts
        if (r.nc[s] == 0 && r.idx[s] != 0) std::fill_n(L.pool.host.begin() + r.idx[s] * bb, bb, uint8_t{0});
      L.pool.dev.upload(L.pool.host.data(), L.pool.host.size());
      DeviceBuffer dec_pool(L.pool.host.size());
      dec_pool.upload(L.pool.host.data(), L.pool.host.size());
      cuda::LightningDevParams dp = L.dev();
      dp.states.data = dec_pool.data();
      const int64_t T = r.T(), qs = 3LL * H * D + 4, os = static_cast<int64_t>(H) * D + 8, W = static_cast<int64_t>(H) * D;
      const auto qkv = rand_vec(rng, T * qs);
      // 1. The sequential prefill over the step's plan (stores cut its blocks).
      const auto plan = cuda::LightningPlan::build(r.qsl, r.nc, bs, 1, r.store_start, r.store_offset, r.store_block);
      DeviceBuffer db = to_device(plan.blocks), df = to_device(plan.seq_first_block), di = to_device(r.idx),
                   dn = to_device(r.nc), dstore = to_device(plan.has_stores() ? plan.block_store : std::vector<int32_t>{0});
      cuda::LightningPlanDev pd{plan.num_seqs, plan.num_blocks, plan.num_qtiles, db.as<int32_t>(), df.as<int32_t>(),
                                nullptr, di.as<int32_t>(), dn.as<int32_t>()};
      if (plan.has_stores()) pd.block_store = dstore.as<int32_t>();
      DeviceBuffer dqkv = to_device(qkv), dout = poisoned(T * os);
      SSM_CUDA_CHECK(cuda::lightning_prefill_sequential(dqkv.as<float>(), qs, dout.as<float>(), os, L.dev(), pd, nullptr));
      SSM_CUDA_CHECK(cudaDeviceSynchronize());
      const auto got = to_host<float>(dout, T * os);
      // 2. The same tokens one at a time: the GPU decode on the copy, the CPU decode on the host pool.
      std::vector<float> want(T * os, 0.0f), ref(T * os, 0.0f);
      std::vector<std::vector<uint8_t>> want_store(r.store_block.size());
      auto block_of = [&](const DeviceBuffer& pool, int32_t b) {
        std::vector<uint8_t> h(bb);
        pool.download(h.data(), h.size(), static_cast<size_t>(b) * bb);
        return h;
      };
      for (int j = 0; j < r.max_len(); ++j) {
        const DecodeStep st(r, j);
        const int B = st.size();
        const auto x = st.gather(qkv, qs);
        DeviceBuffer dx = to_device(x), didx = to_device(st.blocks), o = poisoned(B * os);
        SSM_CUDA_CHECK(cuda::lightning_decode(dx.as<float>(), qs, o.as<float>(), os, dp, didx.as<int32_t>(), B, nullptr));
        SSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto og = to_host<float>(o, B * os);
        std::vector<float> oh(B * os, 0.0f);
        cpu::lightning_decode(x.data(), qs, oh.data(), os, L.host(), st.blocks);
        for (int i = 0; i < B; ++i) {
          std::copy_n(og.begin() + i * os, W, want.begin() + st.tokens[i] * os);
          std::copy_n(oh.begin() + i * os, W, ref.begin() + st.tokens[i] * os);
        }
        for (size_t i = 0; i < r.store_offset.size(); ++i)
          if (r.store_offset[i] == j + 1) want_store[i] = block_of(dec_pool, r.idx[r.store_row[i]]);
      }
      int64_t mismatched = 0;
      for (int64_t i = 0; i < T; ++i)
        mismatched += std::memcmp(got.data() + i * os, want.data() + i * os, W * sizeof(float)) != 0;
      EXPECT_EQ(mismatched, 0) << "tokens whose outputs differ from the decode walk's bits";
      for (int s = 0; s < r.n(); ++s) {
        if (r.idx[s] == 0) continue;
        EXPECT_TRUE(block_of(L.pool.dev, r.idx[s]) == block_of(dec_pool, r.idx[s])) << "final state of row " << s;
      }
      for (size_t i = 0; i < r.store_block.size(); ++i)
        EXPECT_TRUE(block_of(L.pool.dev, r.store_block[i]) == want_store[i])
            << "store " << i << " (row " << r.store_row[i] << ", offset " << r.store_offset[i] << ")";
      const double tol = t == DType::F32 ? 1e-4 : 1e-2;
      for (int s = 0; s < r.n(); ++s) {
        const int64_t t0 = r.qsl[s];
        EXPECT_LT(rel_err(got.data() + t0 * os, os, ref.data() + t0 * os, os, r.len(s), W), r.idx[s] ? tol : 1e-30)
            << "out of row " << s << " (len " << r.len(s) << ")";
      }
      EXPECT_LT(L.pool.rel_err_blocks(r.idx), tol) << "final states vs the CPU";
      EXPECT_TRUE(L.pool.null_block_intact());
      std::printf("[lightning sequential] D=%d %s: %zu stores, bit-identical to decode: %s\n", D,
                  std::string(dtype_name(t)).c_str(), r.store_block.size(), mismatched == 0 ? "yes" : "NO");
    }
  }
}

// Host-side plans (no GPU needed: these run in CI too).
TEST(CudaLightningPlan, BlocksFollowTheSequenceGrid) {
  // Rows: 300 new tokens from scratch, 70 continuing after 100 computed (first block ends at 128), an empty row.
  const auto p = cuda::LightningPlan::build(std::vector<int32_t>{0, 300, 370, 370}, std::vector<int32_t>{0, 100, 5}, 64);
  ASSERT_EQ(p.num_seqs, 3);
  const std::vector<int32_t> blocks = {0, 64, 0, 64, 64, 0, 128, 64, 0, 192, 64, 0, 256, 44, 0,  // 300 = 4 x 64 + 44
                                       300, 28, 1, 328, 42, 1};                                 // 100 + 28 = 128, then 42
  EXPECT_EQ(p.blocks, blocks);
  EXPECT_EQ(p.seq_first_block, (std::vector<int32_t>{0, 5, 7, 7}));
  EXPECT_EQ(p.num_qtiles, 7);  // one 64-query tile per block of <= 64 tokens
  const auto q = cuda::LightningPlan::build(std::vector<int32_t>{0, 300}, std::vector<int32_t>{0}, 256);
  EXPECT_EQ(q.blocks, (std::vector<int32_t>{0, 256, 0, 256, 44, 0}));
  EXPECT_EQ(q.qtiles, (std::vector<int32_t>{0, 0, 0, 64, 0, 128, 0, 192, 1, 0}));
  // Ranges of up to 2 blocks per sequence (the bf16 path's state passing): blocks 0-1, 2-3, 4 | 5-6.
  const auto r = cuda::LightningPlan::build(std::vector<int32_t>{0, 300, 370, 370}, std::vector<int32_t>{0, 100, 5}, 64, 2);
  EXPECT_EQ(r.blocks, blocks);
  EXPECT_EQ(r.num_ranges, 4);
  EXPECT_EQ(r.ranges, (std::vector<int32_t>{0, 2, 128, 2, 2, 128, 4, 1, 44, 5, 2, 70}));
  EXPECT_EQ(r.seq_first_range, (std::vector<int32_t>{0, 3, 4, 4}));
  EXPECT_EQ(r.block_range, (std::vector<int32_t>{0, 0, 0, 64, 1, 0, 1, 64, 2, 0, 3, 0, 3, 28}));
  EXPECT_EQ(p.num_ranges, p.num_blocks);  // default: one block per range
  EXPECT_EQ(cuda::LightningPlan::pick_blocks_per_range(1024, 256, 16), 1);
  EXPECT_EQ(cuda::LightningPlan::pick_blocks_per_range(16384, 256, 16), 8);
  EXPECT_EQ(cuda::LightningPlan::pick_blocks_per_range(4096, 256, 16), 2);
  EXPECT_EQ(cuda::LightningPlan::pick_blocks_per_range(65536, 256, 16), 16);
  EXPECT_EQ(cuda::LightningPlan::pick_blocks_per_range(1 << 22, 64, 64), cuda::LightningPlan::kMaxBlocksPerRange);
  EXPECT_THROW(cuda::LightningPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{0}, 64, 0), Error);
}

TEST(CudaLightning, RejectsBadArguments) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  LightningLayer L(2, 96, 256, DType::F32, 2, rng);  // head_dim 96 unsupported
  cuda::LightningPlanDev pd;
  pd.num_seqs = 1;
  EXPECT_EQ(cuda::lightning_prefill(nullptr, 576, nullptr, 192, L.dev(), pd, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::lightning_decode(nullptr, 576, nullptr, 192, L.dev(), nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::lightning_prefill_sequential(nullptr, 576, nullptr, 192, L.dev(), pd, nullptr), cudaErrorInvalidValue);
  LightningLayer L64(2, 64, 256, DType::F32, 2, rng);
  EXPECT_EQ(cuda::lightning_prefill_sequential(nullptr, 384, nullptr, 128, L64.dev(), pd, nullptr),
            cudaErrorInvalidValue);  // missing plan arrays
  EXPECT_EQ(cuda::lightning_prefill_bf16(nullptr, 576, static_cast<float*>(nullptr), 192, L.dev(), pd, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_THROW(cuda::LightningPlan::build(std::vector<int32_t>{0, 5, 3}, std::vector<int32_t>{0, 0}, 64), Error);
  EXPECT_THROW(cuda::LightningPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{0}, 0), Error);
}

}  // namespace
}  // namespace ssmserve
