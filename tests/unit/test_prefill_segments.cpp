// "all"-mode state stores in the batch metadata (ScheduledSeq::state_stores -> MambaBatchMetadata::state_store_*_p)
// and the prefill pieces the CPU mixers run (model/mixers/prefill_segments.h): CSR over the prefill rows after the
// decodes are reordered first, pieces split at the store offsets continuing the sequence positions, bad stores named.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/batch_metadata.h"
#include "model/mixers/prefill_segments.h"

namespace ssmserve {
namespace {

ScheduledSeq seq(int32_t block, int32_t computed, int32_t n, bool prefilling, std::span<const StateStore> stores = {}) {
  ScheduledSeq s{block, computed, n, prefilling};
  s.state_stores = stores;
  return s;
}

TEST(PrefillSegments, StoresBecomeCsrAndPieces) {
  const std::vector<StateStore> a = {{3, 9}, {7, 10}}, none;
  // A decode (first after reordering), a prefill with two stores, a prefill without.
  const std::vector<ScheduledSeq> seqs = {seq(1, 5, 10, true, a), seq(2, 4, 1, false), seq(3, 0, 6, true, none)};
  MetadataOptions opt;
  opt.chunk_size = 4;
  const MambaBatchMetadata m = build_mamba_metadata(seqs, opt);
  ASSERT_TRUE(m.has_state_stores());
  EXPECT_EQ(m.state_store_start_p, (std::vector<int32_t>{0, 2, 2}));
  EXPECT_EQ(m.state_store_offset_p, (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(m.state_store_block_p, (std::vector<int32_t>{9, 10}));
  const std::vector<PrefillSegment> p = split_prefill_rows(m);
  ASSERT_EQ(p.size(), 4u);
  // Row 0 (computed 5, 10 tokens): [0,3) then store 9, [3,7) then store 10, [7,10); row 1 whole.
  const auto piece = [](const PrefillSegment& g) { return std::vector<int32_t>{g.row, g.begin, g.end, g.num_computed, g.store_block}; };
  EXPECT_EQ(piece(p[0]), (std::vector<int32_t>{0, 0, 3, 5, 9}));
  EXPECT_EQ(piece(p[1]), (std::vector<int32_t>{0, 3, 7, 8, 10}));
  EXPECT_EQ(piece(p[2]), (std::vector<int32_t>{0, 7, 10, 12, 0}));
  EXPECT_EQ(piece(p[3]), (std::vector<int32_t>{1, 10, 16, 0, 0}));
  MambaBatchMetadata one;
  segment_metadata(p[1], m, one);
  EXPECT_EQ(one.num_prefills, 1);
  EXPECT_EQ(one.query_start_loc_p, (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(one.has_initial_states_p[0], 1);
  EXPECT_EQ(one.state_indices_tensor_p[0], 1);
  EXPECT_EQ(one.cu_chunk_seqlen_p, (std::vector<int32_t>{0, 4}));  // position 8: on the chunk grid
  EXPECT_FALSE(build_mamba_metadata(std::span(seqs).subspan(1), opt).has_state_stores());
}

TEST(PrefillSegments, BadStoresAreNamed) {
  MetadataOptions opt;
  opt.chunk_size = 4;
  for (const std::vector<StateStore>& bad : std::vector<std::vector<StateStore>>{{{0, 9}}, {{6, 9}}, {{3, 9}, {2, 10}}, {{3, 1}}, {{3, 0}}}) {
    const std::vector<ScheduledSeq> seqs = {seq(1, 0, 6, true, bad)};
    EXPECT_THROW(build_mamba_metadata(seqs, opt), Error);
  }
  const std::vector<StateStore> ok = {{1, 9}};
  const std::vector<ScheduledSeq> decode = {seq(1, 4, 1, false, ok)};
  EXPECT_THROW(build_mamba_metadata(decode, opt), Error);
}

}  // namespace
}  // namespace ssmserve
