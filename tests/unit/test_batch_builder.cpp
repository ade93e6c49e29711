// The one batch builder (model/batch_builder.h): the metadata of the layer types a model has and no other, the same
// arrays as the separate builders, and the one decode rule.
#include <gtest/gtest.h>

#include "model/batch_builder.h"

namespace ssmserve {
namespace {

const std::vector<ScheduledSeq> kSeqs = {{1, 4, 1, false}, {2, 0, 5, true}, {3, 7, 1, false}};
const std::vector<std::vector<int32_t>> kTokens = {{9}, {1, 2, 3, 4, 5}, {8}};
const std::vector<std::vector<int32_t>> kTables = {{4, 9}, {5, 6}, {7, 8}};

TEST(BatchBuilder, RecurrentOnlyModelsGetNoAttentionMetadata) {
  BatchBuilderOptions opt;
  opt.meta.chunk_size = 4;
  const ForwardBatch b = build_forward_batch(kSeqs, kTokens, {}, opt);
  EXPECT_EQ(b.meta.num_decodes, 2);
  EXPECT_EQ(b.meta.num_prefills, 1);
  EXPECT_EQ(b.input_ids, (std::vector<int32_t>{9, 8, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(b.linear_meta.query_start_loc.empty());
  EXPECT_TRUE(b.attn_meta.slot_mapping.empty());
}

TEST(BatchBuilder, HybridsGetTheSeparateBuildersArrays) {
  for (int kv : {0, 4}) {
    SCOPED_TRACE(kv);
    BatchBuilderOptions opt;
    opt.meta.chunk_size = 4;
    opt.kv_block_size = kv;
    opt.linear_attention = true;
    const ForwardBatch b = build_forward_batch(kSeqs, kTokens, kTables, opt);
    ForwardBatch want = make_forward_batch(kSeqs, kTokens, opt.meta);
    build_attention_metadata(kSeqs, kv > 0 ? std::span<const std::vector<int32_t>>(kTables) : std::span<const std::vector<int32_t>>{}, kv,
                             want.meta, want.linear_meta, want.attn_meta);
    EXPECT_EQ(b.input_ids, want.input_ids);
    EXPECT_EQ(b.linear_meta.state_indices_tensor, want.linear_meta.state_indices_tensor);
    EXPECT_EQ(b.linear_meta.seq_lens, (std::vector<int32_t>{5, 8, 5}));
    EXPECT_EQ(b.attn_meta.slot_mapping, want.attn_meta.slot_mapping);
    EXPECT_EQ(b.attn_meta.block_tables, want.attn_meta.block_tables);
    EXPECT_EQ(b.attn_meta.slot_mapping.empty(), kv == 0);
  }
}

TEST(BatchBuilder, TheOneDecodeRule) {
  EXPECT_TRUE(is_decode_row(4, 5, 4));    // past the prompt, every token but the last one known is in the state
  EXPECT_FALSE(is_decode_row(4, 5, 5));   // the prompt's last token (a one-token chunk): a prefill row
  EXPECT_FALSE(is_decode_row(0, 1, 1));   // nothing computed yet: a 1-token prompt is a prefill
  EXPECT_FALSE(is_decode_row(3, 5, 3));   // two tokens left: a prefill chunk (or a recompute after preemption)
  EXPECT_FALSE(is_decode_row(5, 5, 4));   // nothing left to feed
}

}  // namespace
}  // namespace ssmserve
