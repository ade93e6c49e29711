// The hybrid's per-step metadata: LinearAttentionMetadata and paged-attention metadata built from the same
// reordered batch as the Mamba metadata (decodes first, padded decode rows, prefills), with block tables, slot
// mapping and positions; short block tables and null KV block ids are errors.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/attention_metadata.h"

namespace ssmserve {
namespace {

TEST(AttentionMetadata, MixedBatchRowsSlotsAndPositions) {
  constexpr int bs = 4;
  // Input order: a prefill chunk (6 tokens after 3), a decode (position 9), a fresh 2-token prompt.
  const std::vector<ScheduledSeq> seqs = {{5, 3, 6, true}, {7, 9, 1, false}, {2, 0, 2, true}};
  const std::vector<std::vector<int32_t>> tables = {{11, 12, 13}, {20, 21, 22}, {30}};
  MetadataOptions opt;
  const MambaBatchMetadata meta = build_mamba_metadata(seqs, opt);
  LinearAttentionMetadata lin;
  PagedAttentionMetadata pa;
  build_attention_metadata(seqs, tables, bs, meta, lin, pa);
  // Rows: decode (seq 1), then prefills seq 0, seq 2.
  EXPECT_EQ(lin.num_decodes, 1);
  EXPECT_EQ(lin.num_decode_tokens, 1);
  EXPECT_EQ(lin.num_prefills, 2);
  EXPECT_EQ(lin.num_prefill_tokens, 8);
  EXPECT_EQ(lin.query_start_loc, (std::vector<int32_t>{0, 1, 7, 9}));
  EXPECT_EQ(lin.seq_lens, (std::vector<int32_t>{10, 9, 2}));
  EXPECT_EQ(lin.state_indices_tensor, (std::vector<int32_t>{7, 5, 2}));
  EXPECT_EQ(lin.num_computed_tokens, (std::vector<int32_t>{9, 3, 0}));
  EXPECT_EQ(pa.block_size, bs);
  EXPECT_EQ(pa.max_num_blocks_per_seq, 3);
  EXPECT_EQ(pa.block_tables, (std::vector<int32_t>{20, 21, 22, 11, 12, 13, 30, 0, 0}));
  EXPECT_EQ(pa.positions, (std::vector<int32_t>{9, 3, 4, 5, 6, 7, 8, 0, 1}));
  EXPECT_EQ(pa.slot_mapping, (std::vector<int32_t>{22 * 4 + 1, 11 * 4 + 3, 12 * 4, 12 * 4 + 1, 12 * 4 + 2, 12 * 4 + 3, 13 * 4,
                                                   30 * 4, 30 * 4 + 1}));
}

TEST(AttentionMetadata, PaddedDecodeRowsPointAtNothing) {
  const std::vector<ScheduledSeq> seqs = {{3, 5, 1, false}};
  const std::vector<std::vector<int32_t>> tables = {{8, 9}};
  MetadataOptions opt;
  opt.pad_decodes_to = 4;
  const MambaBatchMetadata meta = build_mamba_metadata(seqs, opt);
  LinearAttentionMetadata lin;
  PagedAttentionMetadata pa;
  build_attention_metadata(seqs, tables, 4, meta, lin, pa);
  EXPECT_EQ(lin.num_decodes, 4);
  EXPECT_EQ(lin.state_indices_tensor, (std::vector<int32_t>{3, 0, 0, 0}));
  EXPECT_EQ(pa.seq_lens, (std::vector<int32_t>{6, 0, 0, 0}));
  EXPECT_EQ(pa.slot_mapping, (std::vector<int32_t>{9 * 4 + 1, -1, -1, -1}));
}

TEST(AttentionMetadata, RejectsShortTablesAndNullBlocks) {
  const std::vector<ScheduledSeq> seqs = {{3, 0, 9, true}};
  MetadataOptions opt;
  const MambaBatchMetadata meta = build_mamba_metadata(seqs, opt);
  LinearAttentionMetadata lin;
  PagedAttentionMetadata pa;
  const std::vector<std::vector<int32_t>> short_table = {{1, 2}}, null_block = {{1, 0, 2}};
  EXPECT_THROW(build_attention_metadata(seqs, short_table, 4, meta, lin, pa), Error);
  EXPECT_THROW(build_attention_metadata(seqs, null_block, 4, meta, lin, pa), Error);
  // Without softmax layers only the linear metadata is built.
  build_attention_metadata(seqs, {}, 0, meta, lin, pa);
  EXPECT_EQ(lin.state_indices_tensor, (std::vector<int32_t>{3}));
  EXPECT_TRUE(pa.block_tables.empty());
}

}  // namespace
}  // namespace ssmserve
