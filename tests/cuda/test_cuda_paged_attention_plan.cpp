// The GPU paged attention's host-side work lists (kernels/cuda/paged_attention_plan.cpp; no GPU needed): split-KV
// tasks and items, the fixed-size decode layout, the tensor-core tiles, their key chunks over blocks and the rows whose
// keys the tensor-core pass stages as bf16 (tc_stage_floats).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/paged_attention.h"

namespace ssmserve {
namespace {

TEST(CudaPagedAttentionPlan, SplitsAndDecodeLayout) {
  // group 2: 8 tokens per task. Row 0: 20 new tokens of a 1100-token context; row 1: decode at 513; row 2 padding.
  // Fixed 512-key splits (batch-invariant mode).
  const auto p = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 20, 21, 22}, std::vector<int32_t>{1100, 513, 0}, 2, 0, true);
  EXPECT_EQ(p.tokens_per_task, 8);
  EXPECT_EQ(p.key_split, cuda::kKeySplit);
  // Row 0 tasks end at positions 1087, 1095, 1099 -> 3 splits each; row 1 ends at 512 -> 2; padding -> 1.
  EXPECT_EQ(p.tasks, (std::vector<int32_t>{0, 0, 8, 0, 0, 8, 8, 3, 0, 16, 4, 6, 1, 0, 1, 9, 2, 0, 1, 11}));
  EXPECT_EQ(p.num_items, 12);
  EXPECT_EQ(p.num_single_tasks, 2);  // the decode row and the padding row
  // Many tasks: one split per task sized to the longest context.
  std::vector<int32_t> qsl{0}, sl;
  for (int r = 0; r < 300; ++r) qsl.push_back(qsl.back() + 64), sl.push_back(64 + r);
  const auto m = cuda::PagedAttentionPlan::build(qsl, sl, 2);
  EXPECT_EQ(m.num_tasks, 2400);
  EXPECT_EQ(m.num_items, 2400);
  EXPECT_EQ(m.key_split, 384);  // 363 rounded up to 32
  EXPECT_EQ(m.num_single_tasks, 0);
  const auto d = cuda::PagedAttentionPlan::decode(3, 1100, 4, true);
  EXPECT_EQ(d.num_items, 9);
  EXPECT_EQ(d.tasks, (std::vector<int32_t>{0, 0, 1, 0, 1, 0, 1, 3, 2, 0, 1, 6}));
  EXPECT_EQ(d.num_single_tasks, 3);
  // Otherwise a short work list gets splits enough for about kFillItems items (32 .. 512 keys each).
  const auto f = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 20, 21, 22}, std::vector<int32_t>{1100, 513, 0}, 2);
  EXPECT_EQ(f.key_split, 32);  // 5 tasks: 52 splits each would do; 1100 / 52 rounds up to 32 keys
  EXPECT_EQ(f.num_items, 34 + 35 + 35 + 17 + 1);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(1, 2048, 8).key_split, 32);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(1, 2048, 8).num_items, 64);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(1, 32768, 8).key_split, 128);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(1, 131072, 8).key_split, 512);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(16, 4096, 8).key_split, 256);
  EXPECT_EQ(cuda::PagedAttentionPlan::decode(64, 2048, 8).key_split, 512);
  // Tensor-core tiles: rows of 16+ new tokens in tiles of kTcRows / group tokens; the rest keep their tasks.
  static_assert(cuda::kTcRows == 128);
  const auto tc = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 140, 141}, std::vector<int32_t>{200, 9}, 2, 16);
  EXPECT_EQ(tc.tc_tokens, 64);
  EXPECT_EQ(tc.tc_tiles, (std::vector<int32_t>{0, 0, 64, 0, 64, 64, 0, 128, 12}));
  EXPECT_EQ(tc.num_tc_tiles, 3);
  EXPECT_EQ(tc.num_tasks, 1);
  // Falcon-H1's group 6: 21 tokens (126 query rows) per tile; GQA 16: 8.
  EXPECT_EQ(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 50}, std::vector<int32_t>{50}, 6, 16).tc_tiles,
            (std::vector<int32_t>{0, 0, 21, 0, 21, 21, 0, 42, 8}));
  EXPECT_EQ(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 20}, std::vector<int32_t>{20}, 16, 16).tc_tokens, 8);
  EXPECT_THROW(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{3}, 2), Error);
  EXPECT_THROW(cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 5}, std::vector<int32_t>{5}, 17), Error);
}

TEST(CudaPagedAttentionPlan, TensorCoreChunksAndStagedKeys) {
  EXPECT_EQ(cuda::tc_chunk_keys(1), cuda::kTcChunkKeys);
  EXPECT_EQ(cuda::tc_chunk_keys(16384), 1024);
  EXPECT_EQ(cuda::tc_chunk_keys(16385), 1088);
  EXPECT_EQ(cuda::tc_chunk_keys(32768 + 232), 2112);
  EXPECT_EQ(cuda::tc_chunk_keys(131072), 8192);
  // Short contexts: no split (one chunk per tile).
  const auto s = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 232}, std::vector<int32_t>{1000}, 2, 16);
  EXPECT_EQ(s.num_tc_tiles, 4);
  EXPECT_EQ(s.num_tc_items, 0);
  // The staged keys: every key of each tensor-core row, rows in order; rows of few new tokens stage nothing.
  const auto st = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 40, 41, 141}, std::vector<int32_t>{1040, 500, 100}, 2, 16);
  EXPECT_EQ(st.tc_row_key_base, (std::vector<int32_t>{0, -1, 1040}));
  EXPECT_EQ(st.tc_stage_rows, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(st.num_tc_stage_rows, 2);
  EXPECT_EQ(st.tc_stage_keys, 1140);
  EXPECT_EQ(st.tc_stage_max_keys, 1040);
  EXPECT_EQ(cuda::tc_stage_floats(st, 4, 128, true), size_t{1140} * 4 * 128);
  EXPECT_EQ(cuda::tc_stage_floats(st, 4, 128, false), 0u);
  EXPECT_EQ(cuda::tc_stage_floats(st, 4096, 256, true), 0u);  // over kTcStageMaxBytes: the tiles convert
  // 232 new tokens after 32k cached ones: 4 tiles of 64 tokens, 16 chunks each (chunks of 2112 keys).
  const auto l = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 232}, std::vector<int32_t>{32768 + 232}, 2, 16);
  EXPECT_EQ(l.num_tc_tiles, 4);
  EXPECT_EQ(l.num_tc_items, 4 * 16);
  EXPECT_EQ(l.num_tc_slots, 4 * 16);
  EXPECT_EQ(std::vector<int32_t>(l.tc_items.begin(), l.tc_items.begin() + 6), (std::vector<int32_t>{0, 0, 0, 0, 1, 1}));
  // A long prompt from scratch: the first tiles have one chunk (tile, 0, -1); past kTcSplitMaxItems slots a tile
  // walks its chunks in one block (tile, -1, -1).
  static_assert(cuda::kTcSplitMaxItems == 256);
  const auto big = cuda::PagedAttentionPlan::build(std::vector<int32_t>{0, 65536}, std::vector<int32_t>{65536}, 2, 16);
  EXPECT_EQ(big.num_tc_tiles, 1024);
  // Tiles 0..63: one chunk of 4096 keys; 64..127: two (128 slots); 128..169: three (126 slots); the rest whole.
  EXPECT_EQ(big.num_tc_slots, 128 + 3 * 42);
  EXPECT_EQ(big.num_tc_items, 1024 - 64 - 42 + 128 + 3 * 42);
  EXPECT_EQ(std::vector<int32_t>(big.tc_items.begin(), big.tc_items.begin() + 3), (std::vector<int32_t>{0, 0, -1}));
  EXPECT_EQ(std::vector<int32_t>(big.tc_items.begin() + 3 * (64 + 128 + 126), big.tc_items.begin() + 3 * (64 + 128 + 126) + 3),
            (std::vector<int32_t>{170, -1, -1}));
  EXPECT_EQ(std::vector<int32_t>(big.tc_items.end() - 3, big.tc_items.end()), (std::vector<int32_t>{1023, -1, -1}));
  EXPECT_GT(cuda::paged_attention_workspace_floats(l, 8, 128), cuda::paged_attention_workspace_floats(l.num_items, 8, 128));
  // The staging kernel's grid takes up to 65535 rows: past that the tiles convert (the call would be refused).
  cuda::PagedAttentionPlan many;
  many.tc_stage_keys = many.num_tc_stage_rows = 65535;
  EXPECT_EQ(cuda::tc_stage_floats(many, 2, 128, true), size_t{65535} * 2 * 128);
  many.tc_stage_keys = many.num_tc_stage_rows = 65536;
  EXPECT_EQ(cuda::tc_stage_floats(many, 2, 128, true), 0u);
}

}  // namespace
}  // namespace ssmserve
