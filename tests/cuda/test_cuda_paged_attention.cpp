// GPU op harness of softmax attention over the paged KV cache (issues 8, 28, 31; RoPE and the cache writes:
// test_cuda_rope_cache.cpp): paged attention (the split-KV fp32 pass with its tiled
// and decode kernels, and the tensor-core pass, split over key chunks or not) against the CPU kernels: mixed prefill /
// decode rows, head_dim 64 / 128 / 256 with Qwen3-Next / Qwen3.5 / Falcon-H1 GQA shapes, long cached contexts next to
// short rows, decode rows up to 30k keys, split vs unsplit and alone vs batched bit-identical, the warpgroup tiles
// lockstep and warp-specialized (SSMSERVE_ATTN_TC_WS); a DISABLED_ benchmark of
// a short prefill over a long context. The work-list plans: test_cuda_paged_attention_plan.cpp. Fresh random inputs
// per run. Skips without a GPU; SSMSERVE_CUDA_TEST_QUICK=1 keeps the small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <cstring>
#include <span>

#include "core/error.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cpu/paged_attention.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

// ---- paged softmax attention ---------------------------------------------------------------------------------------

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
  // with one block per tile (no chunk split), 5 the same with every tile's chunks split over blocks, 6 the prefill
  // plan with fixed 512-key splits (batch-invariant mode), 7 the decode plan with them. Returns the outputs of those
  // rows ([sum n, os], from a poisoned buffer). last_only: each row as a one-token row of its last token (same
  // seq_len: the same query over the same keys, as when a prompt is chunked differently).
  // staged: the tensor-core pass's keys converted once into bf16 planes (tc_stage_floats) instead of per tile.
  // wgmma: with staged keys, the warpgroup tile kernel (head_dim 128 / 256).
  auto run = [&](const std::vector<int>& keep, int mode, bool last_only = false, bool staged = false, bool wgmma = false) {
    std::vector<int32_t> rq{0}, rs, rt;
    std::vector<float> qk;
    int64_t Tk = 0;
    for (int r : keep) {
      const int n = last_only ? std::min(rows[r].first, 1) : rows[r].first;
      rq.push_back(rq.back() + n);
      rs.push_back(sls[r]);
      rt.insert(rt.end(), tables.begin() + r * max_blocks, tables.begin() + (r + 1) * max_blocks);
      qk.insert(qk.end(), q.begin() + (qsl[r + 1] - n) * qs, q.begin() + qsl[r + 1] * qs);
      Tk += n;
    }
    auto plan = mode == 2 || mode == 7
                    ? cuda::PagedAttentionPlan::decode(static_cast<int>(keep.size()), max_blocks * bs, group, mode == 7)
                    : cuda::PagedAttentionPlan::build(rq, rs, group, mode >= 3 && mode <= 5 ? cuda::kTcMinTokens : 0, mode == 6);
    if (mode >= 3 && mode <= 5) {
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
                 ws(std::max<size_t>(4, (cuda::paged_attention_workspace_floats(plan, KVH, D) +
                                         cuda::tc_stage_floats(plan, KVH, D, staged)) * 4)),
                 dtc = to_device(plan.tc_tiles.empty() ? std::vector<int32_t>{0} : plan.tc_tiles),
                 dti = to_device(plan.tc_items.empty() ? std::vector<int32_t>{0} : plan.tc_items),
                 dbase = to_device(plan.tc_row_key_base.empty() ? std::vector<int32_t>{0} : plan.tc_row_key_base),
                 dstage = to_device(plan.tc_stage_rows.empty() ? std::vector<int32_t>{0} : plan.tc_stage_rows);
    cuda::PagedAttentionArgs a{sh.heads, scale, max_blocks, dqsl.as<int32_t>(), dsl.as<int32_t>(), dtab.as<int32_t>(),
                               dtasks.as<int32_t>(), ditems.as<int32_t>(), plan.num_tasks, plan.num_items,
                               plan.tokens_per_task, plan.key_split, dtc.as<int32_t>(), plan.num_tc_tiles, plan.tc_tokens,
                               dti.as<int32_t>(), plan.num_tc_items};
    // The plan's count of one-token tasks (which partial kernels run); mode 0 leaves it unknown (-1: both launched,
    // each taking its own tasks).
    if (mode != 0) a.num_single_tasks = plan.num_single_tasks;
    a.fixed_split = plan.fixed_split;
    if (cuda::tc_stage_floats(plan, KVH, D, staged) > 0) {
      a.tc_row_key_base = dbase.as<int32_t>(), a.tc_stage_rows = dstage.as<int32_t>();
      a.num_tc_stage_rows = plan.num_tc_stage_rows, a.tc_stage_max_keys = plan.tc_stage_max_keys;
      a.tc_stage_keys = plan.tc_stage_keys, a.num_tc_slots = plan.num_tc_slots, a.tc_wgmma = wgmma;
    }
    SSM_CUDA_CHECK(cuda::paged_attention(dq2.as<float>(), qs, dout.as<float>(), os, dv, a, ws.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host<float>(dout, Tk * os);
  };
  std::vector<int> all;
  for (int r = 0; r < R; ++r) all.push_back(r);
  std::vector<std::vector<float>> outs(8);
  for (int mode : {0, 1, 2, 3, 4, 5, 6, 7}) {
    // The fixed-size decode plan serves only one-token rows: check it on the decode rows alone.
    std::vector<int> keep;
    for (int r = 0; r < R; ++r)
      if ((mode != 2 && mode != 7) || rows[r].first == 1) keep.push_back(r);
    if (keep.empty()) continue;
    const char* names[] = {"prefill plan", "prefill plan, one split", "decode plan", "tensor-core prefill",
                           "tensor-core prefill, one block per tile", "tensor-core prefill, chunks split over blocks",
                           "prefill plan, fixed splits", "decode plan, fixed splits"};
    SCOPED_TRACE(names[mode]);
    outs[mode] = run(keep, mode);
    const auto& got = outs[mode];
    int64_t t = 0;
    for (int r : keep) {
      const int n = rows[r].first;
      const double tol = mode >= 3 && mode <= 5 && n >= cuda::kTcMinTokens ? 1e-2 : 1e-5;
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
  // Fixed splits (batch-invariant mode): every row has the same bits alone as in the batch, a one-token row the same
  // on the decode plan as on the prefill plan, and a prefill row's last token the same as a one-token row.
  int64_t dec_t = 0;
  for (int r = 0; r < R; ++r) {
    const int n = rows[r].first;
    const auto alone = run({r}, 6);
    EXPECT_TRUE(same_bits(alone.data(), outs[6].data() + qsl[r] * os, n)) << "row " << r << ": fixed splits, alone vs in the batch";
    if (n == 1) {
      EXPECT_TRUE(same_bits(outs[7].data() + dec_t * os, outs[6].data() + qsl[r] * os, 1)) << "row " << r << ": decode vs prefill plan";
      ++dec_t;
    } else if (n > 1 && rows[r].second > 0) {  // the last token alone (another chunking of the prompt): the same bits
      const auto last = run({r}, 6, true);
      EXPECT_TRUE(same_bits(last.data(), outs[6].data() + (qsl[r + 1] - 1) * os, 1))
          << "row " << r << ": fixed splits, last token as a one-token row vs in its tile";
    }
  }
  // The keys staged as bf16 once per call: the same bits as the tiles' own conversions (plan as built, one block per
  // tile, chunks over blocks).
  std::vector<std::vector<float>> staged(6);
  for (int mode : {3, 4, 5}) staged[mode] = run(all, mode, false, true);
  for (int r = 0; r < R; ++r) {
    const int n = rows[r].first;
    if (n < cuda::kTcMinTokens) continue;
    for (int mode : {3, 4, 5})
      EXPECT_TRUE(same_bits(staged[mode].data() + qsl[r] * os, outs[mode].data() + qsl[r] * os, n))
          << "row " << r << " (new " << n << ", seq_len " << rows[r].second << "): staged keys vs per-tile conversion, mode " << mode;
  }
  // The warpgroup tile kernel (head_dim 128 / 256): against the CPU at the tensor-core tolerance, the same bits in one
  // block per tile, with chunks over blocks and alone as in the batch.
  if (cuda::tc_wgmma_head_dim_ok(D)) {
    std::vector<std::vector<float>> wg(6);
    {  // the lockstep warpgroup kernel (KernelTuning::attn_tc_ws 0; the warp-specialized one is the default)
    cuda::KernelTuning lockstep = cuda::kernel_tuning();
    lockstep.attn_tc_ws = 0;
    const TuningScope lockstep_scope(lockstep);
    for (int mode : {3, 4, 5}) wg[mode] = run(all, mode, false, true, true);
    for (int r = 0; r < R; ++r) {
      const int n = rows[r].first;
      if (n < cuda::kTcMinTokens) continue;
      SCOPED_TRACE(::testing::Message() << "warpgroup tiles, row " << r << " (new " << n << ", seq_len " << rows[r].second << ")");
      EXPECT_LT(rel_err(wg[3].data() + qsl[r] * os, os, ref.data() + qsl[r] * os, os, n, sh.heads * D), 1e-2);
      EXPECT_LT(rel_err(wg[3].data() + qsl[r] * os, os, outs[3].data() + qsl[r] * os, os, n, sh.heads * D), 1e-2);
      EXPECT_TRUE(same_bits(wg[4].data() + qsl[r] * os, wg[3].data() + qsl[r] * os, n)) << "one block per tile";
      EXPECT_TRUE(same_bits(wg[5].data() + qsl[r] * os, wg[3].data() + qsl[r] * os, n)) << "chunks over blocks";
      const auto alone = run({r}, 3, false, true, true);
      EXPECT_TRUE(same_bits(alone.data(), wg[3].data() + qsl[r] * os, n)) << "alone vs in the batch";
    }
    }
    // Its warp-specialized form (KernelTuning::attn_tc_ws 1; 2 with ping-pong issues): against the CPU, within bf16
    // rounding of the lockstep kernel (the same operations in the same order: bit-identical expected, a difference
    // printed), the same bits in one block per tile, with chunks over blocks and alone as in the batch.
    for (int form : {1, 2}) {
      cuda::KernelTuning kt = cuda::kernel_tuning();
      kt.attn_tc_ws = form;
      const TuningScope scope(kt);
      std::vector<std::vector<float>> wsp(6);
      for (int mode : {3, 4, 5}) wsp[mode] = run(all, mode, false, true, true);
      for (int r = 0; r < R; ++r) {
        const int n = rows[r].first;
        if (n < cuda::kTcMinTokens) continue;
        SCOPED_TRACE(::testing::Message() << "warp-specialized tiles (form " << form << "), row " << r << " (new " << n
                                          << ", seq_len " << rows[r].second << ")");
        const float* got = wsp[3].data() + qsl[r] * os;
        EXPECT_LT(rel_err(got, os, ref.data() + qsl[r] * os, os, n, sh.heads * D), 1e-2);
        const double vs_wg = rel_err(got, os, wg[3].data() + qsl[r] * os, os, n, sh.heads * D);
        EXPECT_LT(vs_wg, 2e-3) << "vs the lockstep warpgroup kernel";
        if (!same_bits(got, wg[3].data() + qsl[r] * os, n))
          std::printf("note: %s row %d form %d: warp-specialized vs lockstep tiles not bit-identical (rel err %.3g)\n",
                      sh.name, r, form, vs_wg);
        EXPECT_TRUE(same_bits(wsp[4].data() + qsl[r] * os, got, n)) << "one block per tile";
        EXPECT_TRUE(same_bits(wsp[5].data() + qsl[r] * os, got, n)) << "chunks over blocks";
        const auto alone = run({r}, 3, false, true, true);
        EXPECT_TRUE(same_bits(alone.data(), got, n)) << "alone vs in the batch";
      }
    }
  }
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

// The tensor-core pass's pipeline edges (issues 30 / 31): 128-row tiles (8 warps) with a partial last tile and
// Falcon-H1's 126-row tiles, key ranges ending mid-tile (the zero-filled rows of the cp.async staging tile, fewer
// than 16 keys in the last tile), rows of several key chunks (the pipeline runs on across chunk boundaries; chunks
// over blocks bit-identical to one block), block sizes that do not divide the 64-key tile (48, 24) or exceed it (128),
// head_dim 64 / 128 / 256.
TEST(CudaPagedAttention, TensorCorePipelineEdgesMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"qwen3.5-9b-bs48", 16, 4, 256, 48}};
  if (!quick()) {
    shapes.push_back({"falcon-h1-7b-bs24", 12, 2, 128, 24});
    shapes.push_back({"mha-128-bs128", 4, 4, 128, 128});
    shapes.push_back({"gqa16-64", 16, 1, 64, 16});
  }
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{16, 16}, {65, 1065}, {250, 2250}, {1, 700}}
                            : std::vector<std::pair<int, int>>{{16, 16},    {129, 129},  {65, 1065}, {250, 2250},
                                                               {31, 4127},  {1, 700},    {200, 3080}, {1, 0}};
  for (const auto& sh : shapes) check_paged_attention(sh, rows, rng);
}

// The warp-specialized warpgroup tiles (SSMSERVE_ATTN_TC_WS, paged_attention_tc_ws.cu; check_paged_attention runs
// them wherever it runs the lockstep warpgroup tiles): head_dim 128 and 256, GQA groups 1 and 8 (Qwen3.5-35B-A3B's
// 16 / 2 of 256), prompts of 63, 65, 200 tokens (key ranges ending mid-tile: the TMA tiles read the staged rows that
// follow, masked), continuations over 1000+ cached keys (several chunks: chunk ends inside the pipelined loop, chunks
// over blocks), a tile of one full 64-key tile plus one key, decode and padding rows next to them.
TEST(CudaPagedAttention, WarpSpecializedTilesMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"qwen3.5-35b-a3b-gqa8", 16, 2, 256, 16}};
  if (!quick()) {
    shapes.push_back({"mha-256-bs64", 2, 2, 256, 64});
    shapes.push_back({"gqa8-128-bs16", 8, 1, 128, 16});
    shapes.push_back({"mha-128-bs32", 4, 4, 128, 32});
  }
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{63, 63}, {1, 1}, {40, 1063}, {65, 65}}
                            : std::vector<std::pair<int, int>>{{63, 63},    {1, 1},      {65, 65},   {200, 200}, {40, 1063},
                                                               {129, 2129}, {1, 0},      {17, 1041}, {16, 65},   {300, 4400}};
  for (const auto& sh : shapes) check_paged_attention(sh, rows, rng);
}

/// Sets kernel_tuning().attn_decode_kernel for its lifetime.
struct DecodeKernelSwitch {
  cuda::KernelTuning saved = cuda::kernel_tuning();
  explicit DecodeKernelSwitch(bool on) {
    cuda::KernelTuning t = saved;
    t.attn_decode_kernel = on;
    cuda::set_kernel_tuning(t);
  }
  ~DecodeKernelSwitch() { cuda::set_kernel_tuning(saved); }
};

// The decode kernel (issue 31: one-token tasks with K / V streamed from the cache in registers) at long contexts:
// decode rows of 1 .. 30001 keys (splits of 32 .. 512 keys, a last split of 1 key, contexts shorter than one
// iteration of the kernel's key streams) next to short prefill rows (the tiled kernel's tasks in the same launch),
// groups 1 .. 8 (every query-group instance: 1 and 2 on NG 2, 3 and 4 on NG 4, 6 on NG 6, 8 on NG 8), head_dim 64 /
// 128 / 256, block sizes 16, 24, 128; every plan against the CPU, fixed splits alone vs batched and decode vs prefill
// plan bit-identical. Then the same rows with the tiled kernel for every task (SSMSERVE_ATTN_DECODE_KERNEL=0).
TEST(CudaPagedAttention, DecodeKernelLongContextMatchesCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<AttnShape> shapes = {{"qwen3.5-9b-bs16", 16, 4, 256, 16}};
  if (!quick()) {
    shapes.push_back({"falcon-h1-7b-bs24", 12, 2, 128, 24});
    shapes.push_back({"qwen3.6-gqa6-bs128", 24, 4, 256, 128});
    shapes.push_back({"gqa4-128-bs16", 8, 2, 128, 16});
    shapes.push_back({"gqa3-128-bs24", 6, 2, 128, 24});
    shapes.push_back({"gqa8-64-bs16", 8, 1, 64, 16});
    shapes.push_back({"mha-256-bs16", 2, 2, 256, 16});
    shapes.push_back({"gqa2-64-bs128", 4, 2, 64, 128});
  }
  // (A row of 16+ new tokens keeps the tensor-core modes of check_paged_attention busy.)
  const auto rows = quick() ? std::vector<std::pair<int, int>>{{1, 1}, {1, 33}, {1, 4097}, {3, 700}, {1, 0}, {1, 12345}, {16, 16}}
                            : std::vector<std::pair<int, int>>{{1, 1},     {1, 2},    {1, 17},   {1, 33},    {1, 511},
                                                               {1, 512},   {1, 513},  {1, 4097}, {1, 0},     {2, 700},
                                                               {1, 12345}, {5, 5},    {1, 30001}, {20, 2020}};
  for (bool on : {true, false}) {
    SCOPED_TRACE(on ? "decode kernel" : "tiled kernel for every task");
    DecodeKernelSwitch sw(on);
    for (const auto& sh : shapes) {
      check_paged_attention(sh, rows, rng);
      if (!on) break;  // the tiled kernel: one shape (the other tests cover it at group 16)
    }
  }
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
  // The combine's bf16 copy: not with tensor-core tiles (their rows are written by the other pass), nor a short stride.
  const KvCacheView kv128{static_cast<std::byte*>(cache.data()), 2048, 0, 1, 1, 128};
  DeviceBuffer o2(256);
  a.out_bf16 = o2.data(), a.out_bf16_stride = 128, a.num_tc_tiles = 1;
  EXPECT_EQ(cuda::paged_attention(nullptr, 128, nullptr, 128, kv128, a, nullptr, nullptr), cudaErrorInvalidValue);
  a.num_tc_tiles = 0, a.out_bf16_stride = 64;
  EXPECT_EQ(cuda::paged_attention(nullptr, 128, nullptr, 128, kv128, a, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ssmserve
