// GPU op harness of the MiniMax hybrid (issue 8): lightning attention prefill / decode and paged attention, each
// against its CPU kernel (the reference) on the shapes (head_dim 64 and 128, block sizes 64 and 256, slopes
// up to 0.95, lengths 1, 255, 256, 257, 700, initial states, null rows, chunked continuation; paged attention also at
// head_dim 256, Qwen3-Next / Qwen3.5's GQA shapes, contexts up to 5000 tokens), with fresh random
// inputs per run and poisoned outputs (the MoE block: test_cuda_moe_ops.cpp). Skips without a GPU; SSMSERVE_CUDA_TEST_QUICK=1 keeps the small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <cstdlib>
#include <span>

#include "core/error.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rope.h"
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

TEST(CudaPagedAttentionPlan, SplitsAndDecodeLayout) {
  // group 2: 8 tokens per task. Row 0: 20 new tokens of a 1100-token context; row 1: decode at 513; row 2 padding.
  const auto p = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 20, 21, 22}, std::vector<int32_t>{1100, 513, 0}, 2);
  EXPECT_EQ(p.tokens_per_task, 8);
  EXPECT_EQ(p.key_split, cuda::kKeySplit);
  // Row 0 tasks end at positions 1087, 1095, 1099 -> 3 splits each; row 1 ends at 512 -> 2; padding -> 1.
  EXPECT_EQ(p.tasks, (std::vector<int32_t>{0, 0, 8, 0, 0, 8, 8, 3, 0, 16, 4, 6, 1, 0, 1, 9, 2, 0, 1, 11}));
  EXPECT_EQ(p.num_items, 12);
  // Many tasks: one split per task sized to the longest context.
  std::vector<int32_t> qsl{0}, sl;
  for (int r = 0; r < 300; ++r) qsl.push_back(qsl.back() + 64), sl.push_back(64 + r);
  const auto m = cuda::PagedAttentionPlan::build(qsl, sl, 2);
  EXPECT_EQ(m.num_tasks, 2400);
  EXPECT_EQ(m.num_items, 2400);
  EXPECT_EQ(m.key_split, 384);  // 363 rounded up to 32
  const auto d = cuda::PagedAttentionPlan::decode(3, 1100, 4);
  EXPECT_EQ(d.num_items, 9);
  EXPECT_EQ(d.tasks, (std::vector<int32_t>{0, 0, 1, 0, 1, 0, 1, 3, 2, 0, 1, 6}));
  // Tensor-core tiles: rows of 16+ new tokens in tiles of 64 / group tokens; the rest keep their tasks.
  const auto tc = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 70, 71}, std::vector<int32_t>{100, 9}, 2, 16);
  EXPECT_EQ(tc.tc_tiles, (std::vector<int32_t>{0, 0, 32, 0, 32, 32, 0, 64, 6}));
  EXPECT_EQ(tc.num_tc_tiles, 3);
  EXPECT_EQ(tc.num_tasks, 1);
  EXPECT_THROW(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{3}, 2), Error);
  EXPECT_THROW(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{5}, 17), Error);
}

TEST(CudaLightning, RejectsBadArguments) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  LightningLayer L(2, 96, 256, DType::F32, 2, rng);  // head_dim 96 unsupported
  cuda::LightningPlanDev pd;
  pd.num_seqs = 1;
  EXPECT_EQ(cuda::lightning_prefill(nullptr, 576, nullptr, 192, L.dev(), pd, nullptr, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::lightning_decode(nullptr, 576, nullptr, 192, L.dev(), nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::lightning_prefill_bf16(nullptr, 576, static_cast<float*>(nullptr), 192, L.dev(), pd, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_THROW(cuda::LightningPlan::build(std::vector<int32_t>{0, 5, 3}, std::vector<int32_t>{0, 0}, 64), Error);
  EXPECT_THROW(cuda::LightningPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{0}, 0), Error);
}


// ---- paged softmax attention ---------------------------------------------------------------------------------------

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

struct AttnShape {
  const char* name;
  int heads, kv_heads, D, block_size;
};

/// One attention shape over rows of (new tokens, seq_len; seq_len 0 = padding) in a pool of randomly permuted KV
/// blocks: reshape_and_cache bit-identical to the CPU's, then paged_attention against cpu::paged_attention through
/// the prefill plan, the same with one split per task, the fixed-size decode plan (one-token rows) and the
/// tensor-core pass (rows of 16+ new tokens, bf16 tolerance), each into a poisoned output.
void check_paged_attention(const AttnShape& sh, const std::vector<std::pair<int, int>>& rows, std::mt19937& rng) {
  SCOPED_TRACE(sh.name);
  const int R = static_cast<int>(rows.size()), D = sh.D, KVH = sh.kv_heads, bs = sh.block_size;
  const int64_t W = static_cast<int64_t>(KVH) * D;
  int max_blocks = 0, total_blocks = 1;
  for (auto [n, sl] : rows) max_blocks = std::max(max_blocks, (sl + bs - 1) / bs), total_blocks += (sl + bs - 1) / bs;
  // Block tables: a random permutation of blocks 1..total_blocks-1.
  std::vector<int32_t> perm(total_blocks - 1);
  for (int i = 0; i < total_blocks - 1; ++i) perm[i] = i + 1;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(R) * max_blocks, 0), qsl{0}, sls, slots;
  size_t next = 0;
  for (int r = 0; r < R; ++r) {
    const auto [n, sl] = rows[r];
    for (int b = 0; b < (sl + bs - 1) / bs; ++b) tables[r * max_blocks + b] = perm[next++];
    qsl.push_back(qsl.back() + n);
    sls.push_back(sl);
    for (int i = 0; i < n; ++i) {
      const int pos = sl - n + i;
      slots.push_back(sl == 0 ? -1 : tables[r * max_blocks + pos / bs] * bs + pos % bs);
    }
  }
  const int64_t T = qsl.back(), page_bytes = 2 * bs * W * 4;
  std::vector<std::byte> host(static_cast<size_t>(page_bytes) * total_blocks);
  KvCacheView hv{host.data(), page_bytes, 0, bs, KVH, D};
  // Previously cached tokens: random K / V straight into the pages (NaN elsewhere: never read).
  std::fill(reinterpret_cast<float*>(host.data()), reinterpret_cast<float*>(host.data() + host.size()), NAN);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int r = 0; r < R; ++r) {
    const auto [n, sl] = rows[r];
    for (int pos = 0; pos < sl - n; ++pos) {
      const int32_t b = tables[r * max_blocks + pos / bs];
      for (int64_t c = 0; c < W; ++c) hv.k(b)[(pos % bs) * W + c] = u(rng), hv.v(b)[(pos % bs) * W + c] = u(rng);
    }
  }
  cuda::DeviceBuffer dcache(host.size());
  dcache.upload(host.data(), host.size());
  KvCacheView dv{static_cast<std::byte*>(dcache.data()), page_bytes, 0, bs, KVH, D};
  // This step's q, k, v.
  const int64_t qs = sh.heads * D + 4, ks = W + 4, os = sh.heads * D + 8;
  auto q = rand_vec(rng, T * qs, -2.0f, 2.0f), k = rand_vec(rng, T * ks), v = rand_vec(rng, T * ks);
  cpu::reshape_and_cache(k.data(), ks, v.data(), ks, T, slots, hv, total_blocks);
  DeviceBuffer dq = to_device(q), dk = to_device(k), dvv = to_device(v), dslots = to_device(slots);
  SSM_CUDA_CHECK(cuda::reshape_and_cache(dk.as<float>(), ks, dvv.as<float>(), ks, T, dslots.as<int32_t>(), dv, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  {
    std::vector<std::byte> back(host.size());
    dcache.download(back.data(), back.size());
    EXPECT_EQ(std::memcmp(back.data(), host.data(), host.size()), 0) << "KV cache after reshape_and_cache";
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> ref(T * os, 0.0f);
  cpu::paged_attention(q.data(), qs, ref.data(), os, sh.heads, scale, hv, qsl, sls, tables, max_blocks);
  const int group = sh.heads / KVH;
  // Runs rows `keep` (in that order, as one step) through a plan of `mode`: 0 prefill plan, 1 the same with one split
  // per task, 2 the fixed-size decode plan, 3 tensor-core pass for rows of 16+ new tokens (plan as built), 4 the same
  // with one block per tile (no chunk split), 5 the same with every tile's chunks split over blocks. Returns the
  // outputs of those rows ([sum n, os], from a poisoned buffer).
  auto run = [&](const std::vector<int>& keep, int mode) {
    std::vector<int32_t> rq{0}, rs, rt;
    std::vector<float> qk;
    int64_t Tk = 0;
    for (int r : keep) {
      const int n = rows[r].first;
      rq.push_back(rq.back() + n);
      rs.push_back(sls[r]);
      rt.insert(rt.end(), tables.begin() + r * max_blocks, tables.begin() + (r + 1) * max_blocks);
      qk.insert(qk.end(), q.begin() + qsl[r] * qs, q.begin() + qsl[r + 1] * qs);
      Tk += n;
    }
    auto plan = mode == 2 ? cuda::PagedAttentionPlan::decode(static_cast<int>(keep.size()), max_blocks * bs, group)
                          : cuda::PagedAttentionPlan::build(rq, rs, group, mode >= 3 ? cuda::kTcMinTokens : 0);
    if (mode >= 3) {
      EXPECT_GT(plan.num_tc_tiles, 0);
    }
    if (mode == 1) {  // what a plan of kManyTasks tasks or more does
      plan.key_split = (*std::max_element(rs.begin(), rs.end()) + 31) / 32 * 32;
      plan.items.clear();
      for (int t = 0; t < plan.num_tasks; ++t) plan.tasks[4 * t + 3] = t, plan.items.insert(plan.items.end(), {t, 0});
      plan.num_items = plan.num_tasks;
    }
    if (mode == 4) plan.tc_items.clear(), plan.num_tc_items = plan.num_tc_slots = 0;  // one block per tile
    if (mode == 5) {  // every tile's chunks over blocks, whatever the number of slots
      plan.tc_items.clear();
      plan.num_tc_slots = 0;
      for (int i = 0; i < plan.num_tc_tiles; ++i) {
        const int32_t r = plan.tc_tiles[3 * i], off = plan.tc_tiles[3 * i + 1], nt = plan.tc_tiles[3 * i + 2];
        const int32_t n = rq[r + 1] - rq[r], sl = rs[r];
        const int32_t chunks = sl == 0 ? 1 : (sl - n + off + nt - 1) / cuda::tc_chunk_keys(sl) + 1;
        for (int32_t c = 0; c < chunks; ++c) plan.tc_items.insert(plan.tc_items.end(), {i, c, chunks > 1 ? plan.num_tc_slots + c : -1});
        if (chunks > 1) plan.num_tc_slots += chunks;
      }
      plan.num_tc_items = static_cast<int>(plan.tc_items.size() / 3);
    }
    DeviceBuffer dq2 = to_device(qk), dqsl = to_device(rq), dsl = to_device(rs), dtab = to_device(rt),
                 dtasks = to_device(plan.tasks.empty() ? std::vector<int32_t>{0} : plan.tasks),
                 ditems = to_device(plan.items.empty() ? std::vector<int32_t>{0} : plan.items), dout = poisoned(Tk * os),
                 ws(std::max<size_t>(4, cuda::paged_attention_workspace_floats(plan, KVH, D) * 4)),
                 dtc = to_device(plan.tc_tiles.empty() ? std::vector<int32_t>{0} : plan.tc_tiles),
                 dti = to_device(plan.tc_items.empty() ? std::vector<int32_t>{0} : plan.tc_items);
    cuda::PagedAttentionArgs a{sh.heads, scale, max_blocks, dqsl.as<int32_t>(), dsl.as<int32_t>(), dtab.as<int32_t>(),
                               dtasks.as<int32_t>(), ditems.as<int32_t>(), plan.num_tasks, plan.num_items,
                               plan.tokens_per_task, plan.key_split, dtc.as<int32_t>(), plan.num_tc_tiles, plan.tc_tokens,
                               dti.as<int32_t>(), plan.num_tc_items};
    SSM_CUDA_CHECK(cuda::paged_attention(dq2.as<float>(), qs, dout.as<float>(), os, dv, a, ws.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<float>(dout, Tk * os);
  };
  std::vector<int> all;
  for (int r = 0; r < R; ++r) all.push_back(r);
  std::vector<std::vector<float>> outs(6);
  for (int mode : {0, 1, 2, 3, 4, 5}) {
    // The fixed-size decode plan serves only one-token rows: check it on the decode rows alone.
    std::vector<int> keep;
    for (int r = 0; r < R; ++r)
      if (mode != 2 || rows[r].first == 1) keep.push_back(r);
    if (keep.empty()) continue;
    const char* names[] = {"prefill plan", "prefill plan, one split", "decode plan", "tensor-core prefill",
                           "tensor-core prefill, one block per tile", "tensor-core prefill, chunks split over blocks"};
    SCOPED_TRACE(names[mode]);
    outs[mode] = run(keep, mode);
    const auto& got = outs[mode];
    int64_t t = 0;
    for (int r : keep) {
      const int n = rows[r].first;
      const double tol = mode >= 3 && n >= cuda::kTcMinTokens ? 1e-2 : 1e-5;
      EXPECT_LT(rel_err(got.data() + t * os, os, ref.data() + qsl[r] * os, os, n, sh.heads * D), rows[r].second ? tol : 1e-30)
          << "row " << r << " (new " << n << ", seq_len " << rows[r].second << ")";
      t += n;
    }
  }
  // The tensor-core rows: the same bits whether a tile's key chunks run in one block or over blocks, and alone or in
  // the batch (the chunking depends only on the row's own seq_len).
  const auto same_bits = [&](const float* x, const float* y, int n) {
    for (int i = 0; i < n; ++i)
      if (std::memcmp(x + i * os, y + i * os, sizeof(float) * sh.heads * D) != 0) return false;
    return true;
  };
  for (int r = 0; r < R; ++r) {
    const int n = rows[r].first;
    if (n < cuda::kTcMinTokens) continue;
    const float* in_batch = outs[3].data() + qsl[r] * os;
    EXPECT_TRUE(same_bits(outs[4].data() + qsl[r] * os, in_batch, n)) << "row " << r << ": one block per tile vs the plan's";
    EXPECT_TRUE(same_bits(outs[5].data() + qsl[r] * os, in_batch, n)) << "row " << r << ": chunks over blocks vs the plan's";
    for (int mode : {3, 4}) {
      const auto alone = run({r}, mode);
      EXPECT_TRUE(same_bits(alone.data(), in_batch, n))
          << "row " << r << " (new " << n << ", seq_len " << rows[r].second << ") alone (mode " << mode << ") vs in the batch";
    }
  }
}

TEST(CudaPagedAttention, MatchesCpuOnMixedPrefillDecodeRows) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"tiny-minimax", 4, 2, 64, 16}};
  if (!quick()) {
    shapes.push_back({"minimax-bench", 16, 8, 128, 64});
    shapes.push_back({"gqa8", 8, 1, 128, 16});
  }
  // Rows: (new tokens, seq_len). Prefill from scratch, prefill continuing over cached pages, decode rows with
  // short and long (several splits) contexts, a padded row.
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{37, 37}, {5, 600}, {1, 1}, {1, 0}, {1, 77}}
                            : std::vector<std::pair<int, int>>{{300, 300}, {70, 1100}, {1, 1}, {1, 1500}, {1, 0}, {17, 17}, {1, 513}};
  for (const auto& sh : shapes) check_paged_attention(sh, rows, rng);
}

// head_dim 256 (Qwen3-Next, Qwen3.5 / 3.6: dynamic shared memory on both passes, Q fragments re-read on the tensor
// cores): GQA 1, 4, 6, 8, 16; decode rows with contexts 1 .. 5000 over many KV blocks (up to 10 splits), prefill
// chunks continuing a cached context (split-KV and tensor-core rows), prefills from scratch, padding rows.
TEST(CudaPagedAttention, HeadDim256MatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"qwen3-next-gqa8", 16, 2, 256, 16}};
  if (!quick()) {
    shapes.push_back({"mha-gqa1", 2, 2, 256, 16});
    shapes.push_back({"gqa4", 8, 2, 256, 64});
    shapes.push_back({"qwen3.6-gqa6", 24, 4, 256, 32});
    shapes.push_back({"gqa16", 16, 1, 256, 16});
  }
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{40, 40}, {9, 700}, {1, 1}, {1, 0}, {1, 2100}, {20, 1300}}
                            : std::vector<std::pair<int, int>>{{1, 1},    {1, 2},     {1, 31},    {1, 513},  {1, 0},
                                                               {1, 1024}, {1, 2049},  {1, 5000},  {100, 100}, {64, 3000},
                                                               {17, 4113}, {5, 600},  {15, 2500}, {1, 0},     {3, 3}};
  for (const auto& sh : shapes) check_paged_attention(sh, rows, rng);
}

// Long cached contexts behind short prefills (issues 28 / 30 / 31: the tensor-core pass splits a tile's key chunks
// over blocks): 200-300 new tokens after 5k-20k cached keys next to short rows, MiniMax's 16 / 8 heads of 128,
// Qwen3.5's 16 / 4 of 256, a GQA-8 256 shape and Falcon-H1's 12 / 2 of 128; every pass against the CPU, the
// tensor-core rows bit-identical with the chunks in one block or over blocks, alone or in the batch.
TEST(CudaPagedAttention, LongContextPrefillMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"minimax-bench", 16, 8, 128, 64}};
  if (!quick()) {
    shapes.push_back({"qwen3.5-9b", 16, 4, 256, 64});
    shapes.push_back({"gqa8-256", 16, 2, 256, 16});
    shapes.push_back({"falcon-h1-7b", 12, 2, 128, 32});
  }
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{232, 5232}, {16, 16}, {1, 3000}, {40, 2040}}
                            : std::vector<std::pair<int, int>>{{232, 20232}, {16, 16},  {40, 5040}, {1, 3000},
                                                               {64, 9000},   {300, 300}, {1, 0},     {17, 1041}};
  for (const auto& sh : shapes) check_paged_attention(sh, rows, rng);
}

TEST(CudaPagedAttention, TensorCoreChunkPlan) {
  EXPECT_EQ(cuda::tc_chunk_keys(1), cuda::kTcChunkKeys);
  EXPECT_EQ(cuda::tc_chunk_keys(16384), 1024);
  EXPECT_EQ(cuda::tc_chunk_keys(16385), 1088);
  EXPECT_EQ(cuda::tc_chunk_keys(32768 + 232), 2112);
  EXPECT_EQ(cuda::tc_chunk_keys(131072), 8192);
  // Short contexts: no split (one chunk per tile).
  const auto s = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 232}, std::vector<int32_t>{1000}, 2, 16);
  EXPECT_EQ(s.num_tc_tiles, 8);
  EXPECT_EQ(s.num_tc_items, 0);
  // 232 new tokens after 32k cached ones: 8 tiles of 32 tokens, 16 chunks each (chunks of 2112 keys).
  const auto l = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 232}, std::vector<int32_t>{32768 + 232}, 2, 16);
  EXPECT_EQ(l.num_tc_tiles, 8);
  EXPECT_EQ(l.num_tc_items, 8 * 16);
  EXPECT_EQ(l.num_tc_slots, 8 * 16);
  EXPECT_EQ(std::vector<int32_t>(l.tc_items.begin(), l.tc_items.begin() + 6), (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  // A long prompt from scratch: the first tiles have one chunk (tile, 0, -1); past kTcSplitMaxItems slots a tile
  // walks its chunks in one block (tile, -1, -1).
  const auto big = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 65536}, std::vector<int32_t>{65536}, 2, 16);
  EXPECT_EQ(big.num_tc_tiles, 2048);
  // Tiles 0..127: one chunk of 4096 keys; 128..255: two (256 slots); 256..340: three (255 slots); the rest whole.
  EXPECT_EQ(big.num_tc_slots, 256 + 3 * 85);
  EXPECT_EQ(big.num_tc_items, 2048 - 128 - 85 + 256 + 3 * 85);
  EXPECT_EQ(std::vector<int32_t>(big.tc_items.begin(), big.tc_items.begin() + 3), (std::vector<int32_t>{0, 0, -1}));
  EXPECT_EQ(std::vector<int32_t>(big.tc_items.end() - 3, big.tc_items.end()), (std::vector<int32_t>{2047, -1, -1}));
  EXPECT_GT(cuda::paged_attention_workspace_floats(l, 8, 128), cuda::paged_attention_workspace_floats(l.num_items, 8, 128));
}

// Times of the tensor-core pass for one prefill row of 232 new tokens after 1k .. 128k cached keys (and of 2048 after
// 32k) (MiniMax's 16 / 8 heads of 128, Qwen3.5's 16 / 4 of 256, Falcon-H1's 12 / 2 of 128): one block per tile (no split) vs the chunks
// split over blocks; median of 10 after 3 warm-ups. Run with --gtest_also_run_disabled_tests.
TEST(CudaPagedAttentionBench, DISABLED_LongContextPrefill) {
  REQUIRE_GPU();
  struct Shape { const char* name; int heads, KVH, D; };
  const int bs = 64, Pmax = 2048;
  // (new tokens, cached tokens): the turn of 232 tokens, then a 2048-token chunk of a long prompt (enough
  // tiles to fill the GPU without a split: the pass's own efficiency).
  const std::vector<std::pair<int, int>> cases = {{232, 1024},   {232, 4096},   {232, 8192},  {232, 16384},
                                                  {232, 32768},  {232, 65536},  {232, 131072}, {2048, 32768}};
  const int max_cached = 131072;
  for (const Shape& sh : {Shape{"minimax-bench", 16, 8, 128}, Shape{"qwen3.5-9b", 16, 4, 256}, Shape{"falcon-h1-7b", 12, 2, 128}}) {
    const int D = sh.D, KVH = sh.KVH, group = sh.heads / KVH;
    const int Lmax = max_cached + Pmax, nb = (Lmax + bs - 1) / bs;
    const int64_t W = int64_t{KVH} * D, page_bytes = 2 * bs * W * 4;
    std::vector<float> host(static_cast<size_t>(page_bytes / 4) * (nb + 1));
    uint32_t x = 12345u + D;
    for (auto& v : host) x = x * 1664525u + 1013904223u, v = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    DeviceBuffer cache(host.size() * 4);
    cache.upload(host.data(), host.size() * 4);
    host = {};
    const KvCacheView kv{static_cast<std::byte*>(cache.data()), page_bytes, 0, bs, KVH, D};
    std::vector<int32_t> table(nb);
    for (int b = 0; b < nb; ++b) table[b] = b + 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    std::mt19937 rng(7);
    const int64_t QW = int64_t{sh.heads} * D;
    DeviceBuffer dq = to_device(rand_vec(rng, Pmax * QW)), dout(Pmax * QW * 4), dtab = to_device(table);
    for (const auto& cs : cases) {
      const int P = cs.first, ctx = cs.second, sl = ctx + P;
      const std::vector<int32_t> qsl{0, P}, sls{sl};
      auto time_plan = [&](cuda::PagedAttentionPlan plan, bool split) {
        if (!split) plan.tc_items.clear(), plan.num_tc_items = plan.num_tc_slots = 0;
        DeviceBuffer dqsl = to_device(qsl), dsl = to_device(sls), dz = to_device(std::vector<int32_t>{0}),
                     dtc = to_device(plan.tc_tiles),
                     dti = to_device(plan.tc_items.empty() ? std::vector<int32_t>{0} : plan.tc_items),
                     ws(std::max<size_t>(16, cuda::paged_attention_workspace_floats(plan, KVH, D) * 4));
        const cuda::PagedAttentionArgs a{sh.heads, scale, nb, dqsl.as<int32_t>(), dsl.as<int32_t>(), dtab.as<int32_t>(),
                                         dz.as<int32_t>(), dz.as<int32_t>(), 0, 0, plan.tokens_per_task, plan.key_split,
                                         dtc.as<int32_t>(), plan.num_tc_tiles, plan.tc_tokens, dti.as<int32_t>(), plan.num_tc_items};
        cudaEvent_t e0, e1;
        SSM_CUDA_CHECK(cudaEventCreate(&e0));
        SSM_CUDA_CHECK(cudaEventCreate(&e1));
        std::vector<float> ms;
        for (int i = 0; i < 13; ++i) {
          SSM_CUDA_CHECK(cudaEventRecord(e0));
          SSM_CUDA_CHECK(cuda::paged_attention(dq.as<float>(), QW, dout.as<float>(), QW, kv, a, ws.as<float>(), nullptr));
          SSM_CUDA_CHECK(cudaEventRecord(e1));
          SSM_CUDA_CHECK(cudaEventSynchronize(e1));
          float t = 0;
          SSM_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
          if (i >= 3) ms.push_back(t);
        }
        SSM_CUDA_CHECK(cudaEventDestroy(e0));
        SSM_CUDA_CHECK(cudaEventDestroy(e1));
        std::sort(ms.begin(), ms.end());
        return std::make_pair(0.5 * (ms[4] + ms[5]), to_host<float>(dout, static_cast<size_t>(P) * QW));
      };
      const auto plan = cuda::PagedAttentionPlan::build(qsl, sls, group, cuda::kTcMinTokens);
      const auto [t_one, o_one] = time_plan(plan, false);
      const auto [t_split, o_split] = time_plan(plan, true);
      // Attended (query, key) pairs x 4 flop per head dim (QK^T and PV, multiply-add).
      const double flops = 4.0 * sh.heads * D * (double(P) * ctx + double(P) * (P + 1) / 2);
      std::printf("paged attention tc %-13s %2d/%d heads x %3d: %4d new after %6d cached: one block/tile %8.3f ms "
                  "(%6.1f TFLOP/s, %4d blocks), split %8.3f ms (%6.1f TFLOP/s, %5d blocks)%s\n",
                  sh.name, sh.heads, KVH, D, P, ctx, t_one, flops / t_one * 1e-9, plan.num_tc_tiles * KVH, t_split,
                  flops / t_split * 1e-9, std::max(plan.num_tc_items, plan.num_tc_tiles) * KVH,
                  o_one == o_split ? "" : "  OUTPUT BITS DIFFER");
      EXPECT_TRUE(o_one == o_split) << sh.name << " context " << ctx;
    }
  }
}

TEST(CudaPagedAttention, RejectsUnsupportedHeadDim) {
  EXPECT_TRUE(cuda::paged_attention_head_dim_ok(256));
  EXPECT_FALSE(cuda::paged_attention_head_dim_ok(96));
  EXPECT_FALSE(cuda::paged_attention_head_dim_ok(512));
  REQUIRE_GPU();
  DeviceBuffer cache(4096);
  const KvCacheView kv{static_cast<std::byte*>(cache.data()), 2048, 0, 1, 1, 96};
  cuda::PagedAttentionArgs a;
  a.num_heads = 1, a.num_tasks = 1, a.num_items = 1, a.tokens_per_task = 1;
  EXPECT_EQ(cuda::paged_attention(nullptr, 96, nullptr, 96, kv, a, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
